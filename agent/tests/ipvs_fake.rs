//! ipvs mode against fakes: the renderer's decisions (which VIPs, virtual servers and set
//! entries a plan becomes) and the dataplane's diff, graceful termination, dry run and
//! clean-up, with an in-memory IPVS and ipset ([`FakeIpvsKernel`]) and the iptables
//! fake. The same behaviours run against the real kernel in the VM
//! (`ipvs_kernel.rs`, and `traffic.rs` in ipvs mode).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::IpAddr;
use std::time::Duration;

use proxyplan_agent::dataplane::Dataplane;
use proxyplan_agent::kernel::BackendChoice;
use proxyplan_agent::kernel::command::fake::FakeKernel;
use proxyplan_agent::kernel::ipset::SetEntry;
use proxyplan_agent::kernel::ipvs::FakeIpvsKernel;
use proxyplan_agent::kernel::ipvs::{IPPROTO_TCP, IPPROTO_UDP};
use proxyplan_agent::modes::ipvs::render::{IpvsState, VirtualServer, VirtualServerKey, render};
use proxyplan_agent::modes::ipvs::{IpvsDataplane, IpvsSettings};
use proxyplan_agent::ruleset::Ruleset;
use proxyplan_crds::{
    EmptyAction, LoadBalancerIp, LoadBalancerIpMode, MergedPlan, SessionAffinity, TrafficPlan,
    TrafficPolicy,
};
use support::{node_port, service, udp};

const NODE: &str = "10.10.0.1";

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn plan(entries: Vec<proxyplan_crds::ServicePortPlan>) -> MergedPlan {
    let mut plan = support::plan(entries);
    plan.addresses = vec![ip(NODE)];
    plan
}

fn key(protocol: u16, addr: &str, port: u16) -> VirtualServerKey {
    VirtualServerKey {
        protocol,
        addr: ip(addr),
        port,
    }
}

/// The iptables fake: ipsets live in [`FakeIpvsKernel`] (netlink, like the real one).
type Tools = FakeKernel;

/// The entries of a set the fake kernel holds, as `ipset save` spells them.
fn set(kernel: &FakeIpvsKernel, name: &str) -> Vec<String> {
    kernel.sets.get(name).map_or_else(Vec::new, |s| {
        s.entries.iter().map(ToString::to_string).collect()
    })
}

fn dataplane(settings: IpvsSettings) -> IpvsDataplane<FakeIpvsKernel, Tools> {
    IpvsDataplane::new(
        settings,
        FakeIpvsKernel::new(ip(NODE)),
        FakeKernel::new(),
        BackendChoice::Nft,
    )
}

#[test]
fn a_plan_becomes_vips_virtual_servers_and_set_entries() {
    let web = node_port(
        service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]),
        30080,
    );
    let mut lb = service("lb", "10.96.0.20", 443, &["10.244.2.10:8443"]);
    lb.load_balancer_ips = vec![
        LoadBalancerIp {
            ip: "203.0.113.7".into(),
            mode: LoadBalancerIpMode::VIP,
        },
        LoadBalancerIp {
            ip: "203.0.113.8".into(),
            mode: LoadBalancerIpMode::Proxy,
        },
    ];
    lb.load_balancer_source_ranges = vec!["192.0.2.0/24".into(), "10.10.0.0/16".into()];
    lb.external = Some(TrafficPlan {
        policy: TrafficPolicy::Cluster,
        when_empty: EmptyAction::Reject,
    });
    lb.masquerade.external = true;
    lb.session_affinity = Some(SessionAffinity {
        timeout_seconds: 600,
    });
    let mut local = node_port(
        service("local", "10.96.0.30", 80, &["10.244.2.11:8080"]),
        30081,
    );
    local.external = Some(TrafficPlan {
        policy: TrafficPolicy::Local,
        when_empty: EmptyAction::Drop,
    });
    local.masquerade.external = false;
    local.masquerade.local_host_to_external = true;
    let state = render(
        &plan(vec![web, lb, local]),
        &IpvsSettings::default(),
        &[ip(NODE)],
    );
    // VIPs: cluster IPs and the VIP-mode LB IP; never the Proxy-mode one.
    let vips: Vec<String> = state.addresses.iter().map(ToString::to_string).collect();
    assert_eq!(
        vips,
        ["10.96.0.10", "10.96.0.20", "10.96.0.30", "203.0.113.7"]
    );
    let servers: Vec<String> = state.services.keys().map(ToString::to_string).collect();
    assert_eq!(
        servers,
        [
            "TCP 10.10.0.1:30080",
            "TCP 10.10.0.1:30081",
            "TCP 10.96.0.10:80",
            "TCP 10.96.0.20:443",
            "TCP 10.96.0.30:80",
            "TCP 203.0.113.7:443"
        ]
    );
    // The Local node port has no local endpoint: no real server, and a DROP entry.
    assert!(
        state.services[&key(IPPROTO_TCP, NODE, 30081)]
            .real_servers
            .is_empty()
    );
    assert_eq!(state.sets["PROXYPLAN-NP-DROP-TCP"].entries.len(), 1);
    assert!(
        state.sets["PROXYPLAN-NP-LOCAL-TCP"]
            .entries
            .contains(&SetEntry::Port(30081))
    );
    assert!(
        state.sets["PROXYPLAN-NP-TCP"]
            .entries
            .contains(&SetEntry::Port(30080))
    );
    // The cluster IP of the Local service still balances over every endpoint.
    assert_eq!(
        state.services[&key(IPPROTO_TCP, "10.96.0.30", 80)].real_servers,
        [(ip("10.244.2.11"), 8080)]
    );
    // Affinity on both of the LB service's virtual servers.
    assert_eq!(
        state.services[&key(IPPROTO_TCP, "203.0.113.7", 443)].persistence,
        Some(600)
    );
    assert_eq!(
        state.services[&key(IPPROTO_TCP, "10.96.0.20", 443)].persistence,
        Some(600)
    );
    // Source ranges: the VIP is firewalled, each range allowed, and the node (inside
    // 10.10.0.0/16) may reach its own VIP.
    let e = |name: &str| -> Vec<String> {
        state.sets[name]
            .entries
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    assert_eq!(e("PROXYPLAN-LB-FW"), ["203.0.113.7,tcp:443"]);
    assert_eq!(
        e("PROXYPLAN-LB-SRC-CIDR"),
        [
            "203.0.113.7,tcp:443,10.10.0.0/16",
            "203.0.113.7,tcp:443,192.0.2.0/24"
        ]
    );
    assert_eq!(
        e("PROXYPLAN-LB-SRC-IP"),
        ["203.0.113.7,tcp:443,203.0.113.7"]
    );
    assert_eq!(e("PROXYPLAN-EXTERNAL"), ["203.0.113.7,tcp:443"]);
    assert_eq!(e("PROXYPLAN-NODE-IP"), [NODE]);
    // No IPv6 entries: no IPv6 sets or rules.
    assert!(state.sets.keys().all(|n| !n.starts_with("PROXYPLAN6-")));
    assert_eq!(state.rules.v6.rule_count(), 0);
}

#[test]
fn syncs_send_only_differences_and_drain_removed_tcp_real_servers() {
    let settings = IpvsSettings {
        termination_grace: Duration::from_secs(3600),
        ..IpvsSettings::default()
    };
    let mut dp = dataplane(settings);
    let web = |eps: &[&str]| service("web", "10.96.0.10", 80, eps);
    let dns = |eps: &[&str]| udp(service("dns", "10.96.0.53", 53, eps));
    let both = plan(vec![
        web(&["10.244.1.10:8080", "10.244.1.11:8080"]),
        dns(&["10.244.1.10:5353", "10.244.1.11:5353"]),
    ]);
    let first = dp.sync(&both, false).unwrap();
    assert!(first.changed > 0);
    assert_eq!(dp.kernel().links.get("proxyplan-ipvs0"), Some(&3));
    assert_eq!(
        dp.kernel().sysctls["net/ipv4/vs/conntrack"],
        "1",
        "sysctls set"
    );
    assert!(dp.sysctls().iter().all(|c| c.ok));
    let again = dp.sync(&both, false).unwrap();
    assert_eq!(again.changed, 0, "{}", again.payload);

    // One endpoint of each leaves, and an established connection is on the TCP one.
    let web_key = (IPPROTO_TCP, ip("10.96.0.10"), 80);
    let gone = (ip("10.244.1.11"), 8080);
    let mut kernel_log = dp.kernel().log.len();
    let fewer = plan(vec![web(&["10.244.1.10:8080"]), dns(&["10.244.1.10:5353"])]);
    let report = dp.sync(&fewer, false).unwrap();
    let log = &dp.kernel().log[kernel_log..];
    assert!(
        log.iter().any(
            |l| l.contains("update real server TCP 10.96.0.10:80 -> 10.244.1.11:8080 weight 0")
        ),
        "{log:?}"
    );
    assert!(
        log.iter()
            .any(|l| l.contains("delete real server UDP 10.96.0.53:53 -> 10.244.1.11:5353")),
        "UDP goes at once: {log:?}"
    );
    // No connection on it: the drained real server is deleted in the same sync.
    assert!(
        log.iter()
            .any(|l| l.contains("delete real server TCP 10.96.0.10:80 -> 10.244.1.11:8080")),
        "{log:?}"
    );
    assert_eq!(dp.kernel().weight(web_key, gone), None);
    assert_eq!(dp.draining(), 0);
    assert!(report.changed >= 3);
    kernel_log = dp.kernel().log.len();
    assert_eq!(dp.sync(&fewer, false).unwrap().changed, 0);
    assert_eq!(dp.kernel().log.len(), kernel_log);
}

#[test]
fn a_real_server_with_connections_waits_for_them_or_the_grace_period() {
    let mut kernel = FakeIpvsKernel::new(ip(NODE));
    let web = |eps: &[&str]| service("web", "10.96.0.10", 80, eps);
    let both = plan(vec![web(&["10.244.1.10:8080", "10.244.1.11:8080"])]);
    let one = plan(vec![web(&["10.244.1.10:8080"])]);
    let web_key = (IPPROTO_TCP, ip("10.96.0.10"), 80);
    let gone = (ip("10.244.1.11"), 8080);
    // First program both, then carry the kernel over to a dataplane with a short grace.
    {
        let mut dp = IpvsDataplane::new(
            IpvsSettings::default(),
            kernel.clone(),
            FakeKernel::new(),
            BackendChoice::Nft,
        );
        dp.sync(&both, false).unwrap();
        kernel = dp.kernel().clone();
    }
    kernel.set_connections(web_key, gone, 3);
    let settings = IpvsSettings {
        termination_grace: Duration::from_millis(300),
        ..IpvsSettings::default()
    };
    let mut dp = IpvsDataplane::new(settings, kernel, FakeKernel::new(), BackendChoice::Nft);
    dp.sync(&one, false).unwrap();
    assert_eq!(dp.kernel().weight(web_key, gone), Some(0), "drained, kept");
    assert_eq!(dp.draining(), 1);
    dp.sync(&one, false).unwrap();
    assert_eq!(
        dp.kernel().weight(web_key, gone),
        Some(0),
        "connections left"
    );
    // It comes back before it is gone: weight 1 again, no longer draining.
    dp.sync(&both, false).unwrap();
    assert_eq!(dp.kernel().weight(web_key, gone), Some(1));
    assert_eq!(dp.draining(), 0);
    // Removed again; the grace period ends with the connections still there.
    dp.sync(&one, false).unwrap();
    std::thread::sleep(Duration::from_millis(350));
    dp.sync(&one, false).unwrap();
    assert_eq!(dp.kernel().weight(web_key, gone), None);
}

#[test]
fn a_dry_run_touches_nothing_and_cleanup_leaves_foreign_services() {
    use proxyplan_agent::kernel::ipvs::IpvsService;
    use proxyplan_agent::kernel::ipvs::{IpvsKernel, IpvsOp};
    let mut kernel = FakeIpvsKernel::new(ip(NODE));
    let foreign = IpvsService::new(IPPROTO_UDP, ip("198.51.100.7"), 53, "rr");
    assert_eq!(
        kernel.execute(&[IpvsOp::AddService(&foreign)]).unwrap(),
        [0]
    );
    let mut dp = IpvsDataplane::new(
        IpvsSettings::default(),
        kernel,
        FakeKernel::new(),
        BackendChoice::Nft,
    );
    let web = plan(vec![node_port(
        service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]),
        30080,
    )]);
    let dry = dp.sync(&web, true).unwrap();
    assert!(
        dry.payload.contains("# ipvs add service TCP 10.96.0.10:80"),
        "{}",
        dry.payload
    );
    assert!(
        dry.payload
            .contains("# ip address add 10.96.0.10/32 dev proxyplan-ipvs0")
    );
    assert_eq!(dp.kernel().services.len(), 1, "only the foreign one");
    assert!(!dp.kernel().links.contains_key("proxyplan-ipvs0"));
    assert!(dp.kernel().log.len() == 1);

    dp.sync(&web, false).unwrap();
    assert_eq!(dp.kernel().services.len(), 3);
    assert_eq!(
        set(dp.kernel(), "PROXYPLAN-CLUSTER-IP"),
        ["10.96.0.10,tcp:80"]
    );
    dp.cleanup().unwrap();
    assert!(dp.kernel().sets.is_empty());
    let left: Vec<_> = dp.kernel().services.keys().collect();
    assert_eq!(left, [&(IPPROTO_UDP, ip("198.51.100.7"), 53)]);
    assert!(!dp.kernel().links.contains_key("proxyplan-ipvs0"));
    assert!(dp.kernel().addresses.iter().all(|a| a.ip == ip(NODE)));
}

/// What the fake kernel and sets hold, in the shape `render` returns: VIPs, virtual
/// servers with their real servers, and every owned set with its entries.
fn held(dp: &IpvsDataplane<FakeIpvsKernel, Tools>) -> IpvsState {
    let kernel = dp.kernel();
    let link = kernel.links.get("proxyplan-ipvs0").copied();
    let mut state = IpvsState {
        addresses: kernel
            .addresses
            .iter()
            .filter(|a| Some(a.index) == link)
            .map(|a| a.ip)
            .collect(),
        sets: kernel.sets.clone(),
        ..IpvsState::default()
    };
    for (service, destinations) in kernel.services.values() {
        let mut real_servers: Vec<(IpAddr, u16)> = destinations.keys().copied().collect();
        real_servers.sort_unstable();
        state.services.insert(
            key(service.protocol, &service.addr.to_string(), service.port),
            VirtualServer {
                persistence: service.is_persistent().then_some(service.timeout),
                real_servers,
            },
        );
    }
    state
}

/// `render`'s answer without the iptables rules, to compare with [`held`].
fn wanted(plan: &MergedPlan) -> IpvsState {
    let mut state = render(plan, &IpvsSettings::default(), &[ip(NODE)]);
    state.rules = Ruleset::default();
    state
}

#[test]
fn syncs_that_send_only_changed_entries_end_where_a_full_render_says() {
    let settings = IpvsSettings {
        termination_grace: Duration::ZERO,
        ..IpvsSettings::default()
    };
    let mut dp = dataplane(settings);
    let web = |eps: &[&str]| service("web", "10.96.0.10", 80, eps);
    // Two services on the same backends share their hairpin entries.
    let api = |eps: &[&str]| node_port(service("api", "10.96.0.20", 80, eps), 30080);
    let dns = |eps: &[&str]| udp(service("dns", "10.96.0.53", 53, eps));
    let mut local = node_port(
        service("local", "10.96.0.30", 80, &["10.244.2.10:8080"]),
        30081,
    );
    local.external = Some(TrafficPlan {
        policy: TrafficPolicy::Local,
        when_empty: EmptyAction::Drop,
    });
    let v6 = service("six", "fd00:96::10", 80, &["[fd00:244::5]:8080"]);
    let steps: Vec<(&str, Vec<proxyplan_crds::ServicePortPlan>)> = vec![
        (
            "start",
            vec![
                web(&["10.244.1.10:8080", "10.244.1.11:8080"]),
                dns(&["10.244.1.10:5353"]),
            ],
        ),
        (
            "an endpoint goes",
            vec![web(&["10.244.1.10:8080"]), dns(&["10.244.1.10:5353"])],
        ),
        (
            "a service with shared backends comes",
            vec![
                web(&["10.244.1.10:8080"]),
                api(&["10.244.1.10:8080", "10.244.1.12:8080"]),
                dns(&["10.244.1.10:5353"]),
            ],
        ),
        (
            "the shared backend leaves one service only",
            vec![
                web(&["10.244.1.12:8080"]),
                api(&["10.244.1.10:8080", "10.244.1.12:8080"]),
                dns(&["10.244.1.10:5353"]),
            ],
        ),
        (
            "a Local service without local endpoints, and IPv6 appears",
            vec![
                web(&["10.244.1.12:8080"]),
                api(&["10.244.1.10:8080"]),
                local.clone(),
                v6.clone(),
            ],
        ),
        (
            "IPv6 and the UDP service go",
            vec![web(&["10.244.1.12:8080"]), local],
        ),
        ("everything goes", vec![]),
        ("something comes back", vec![v6, web(&["10.244.1.10:8080"])]),
    ];
    for (step, entries) in steps {
        let plan = plan(entries);
        dp.sync(&plan, false).unwrap();
        assert_eq!(held(&dp), wanted(&plan), "after step {step:?}");
        assert_eq!(dp.sync(&plan, false).unwrap().changed, 0, "{step}: again");
        // A restarted agent reads the kernel (IPv6 port bitmaps included) and finds
        // nothing to do.
        dp.invalidate();
        let reread = dp.sync(&plan, false).unwrap();
        assert_eq!(
            reread.changed, 0,
            "{step}: after a re-read: {}",
            reread.payload
        );
    }
}

/// Every VIP goes into the VIP set and each of its service ports into the VIP-PORT set
/// (what the VIP filter lets through); an external IP that is one of the node's own
/// addresses is not a VIP of the dummy interface and stays out of the VIP set.
#[test]
fn vips_and_their_ports_feed_the_vip_filter() {
    let mut web = node_port(
        service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]),
        30080,
    );
    web.external_ips = vec!["192.0.2.10".into(), NODE.into()];
    web.external = Some(TrafficPlan {
        policy: TrafficPolicy::Cluster,
        when_empty: EmptyAction::Reject,
    });
    let mut dp = dataplane(IpvsSettings::default());
    dp.sync(&plan(vec![web]), false).expect("sync");
    let kernel = dp.kernel();
    assert_eq!(
        set(kernel, "PROXYPLAN-VIP"),
        ["10.96.0.10", "192.0.2.10"],
        "the node's own address is not filtered"
    );
    assert_eq!(
        set(kernel, "PROXYPLAN-VIP-PORT"),
        ["10.10.0.1,tcp:80", "10.96.0.10,tcp:80", "192.0.2.10,tcp:80"]
    );
}

/// The periodic check compares a fresh read of IPVS, the addresses and the sets with
/// what the agent wrote: each deletion behind its back is noticed, and the sync after
/// it puts the object back.
#[test]
fn the_periodic_check_notices_and_the_next_sync_repairs() {
    let web = service(
        "web",
        "10.96.0.10",
        80,
        &["10.244.1.10:8080", "10.244.1.11:8080"],
    );
    let plan = plan(vec![web]);
    let mut dp = dataplane(IpvsSettings::default());
    dp.sync(&plan, false).expect("sync");
    assert!(dp.rules_intact().expect("check"));
    let vs = (IPPROTO_TCP, ip("10.96.0.10"), 80);
    let rs = (ip("10.244.1.10"), 8080);
    type Tamper = fn(&mut FakeIpvsKernel);
    let tampers: [(&str, Tamper); 4] = [
        ("a real server", |k| {
            let (_, dests) = k
                .services
                .get_mut(&(IPPROTO_TCP, ip("10.96.0.10"), 80))
                .unwrap();
            dests.remove(&(ip("10.244.1.10"), 8080));
        }),
        ("a virtual server", |k| {
            k.services.remove(&(IPPROTO_TCP, ip("10.96.0.10"), 80));
        }),
        ("a set entry", |k| {
            let set = k.sets.get_mut("PROXYPLAN-VIP-PORT").unwrap();
            set.entries.clear();
        }),
        ("a VIP address", |k| {
            k.addresses.retain(|a| a.ip != ip("10.96.0.10"))
        }),
    ];
    for (what, tamper) in tampers {
        tamper(dp.kernel_mut());
        assert!(!dp.rules_intact().expect("check"), "{what}");
        let report = dp.sync(&plan, false).expect("sync");
        assert!(report.changed > 0, "{what}: {}", report.payload);
        let kernel = dp.kernel();
        assert_eq!(kernel.weight(vs, rs), Some(1), "{what}");
        assert_eq!(
            set(kernel, "PROXYPLAN-VIP-PORT"),
            ["10.96.0.10,tcp:80"],
            "{what}"
        );
        assert!(
            kernel.addresses.iter().any(|a| a.ip == ip("10.96.0.10")),
            "{what}"
        );
        assert!(dp.rules_intact().expect("check"), "{what}: repaired");
    }
}

/// `--ipvs-scheduler mh` puts the mh-port flag on every virtual server, persistent ones
/// too; the timeouts go to the kernel once, zeros left alone.
#[test]
fn mh_flag_and_timeouts() {
    use proxyplan_agent::kernel::ipvs::{
        IP_VS_SVC_F_PERSISTENT, IP_VS_SVC_F_SCHED_MH_PORT, IpvsTimeouts,
    };
    let web = node_port(
        service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]),
        30080,
    );
    let mut sticky = service("sticky", "10.96.0.11", 80, &["10.244.1.10:8080"]);
    sticky.session_affinity = Some(SessionAffinity {
        timeout_seconds: 600,
    });
    let settings = IpvsSettings {
        scheduler: "mh".into(),
        timeouts: IpvsTimeouts {
            tcp: 0,
            tcp_fin: 30,
            udp: 60,
        },
        ..IpvsSettings::default()
    };
    let mut dp = dataplane(settings);
    let plan = plan(vec![web, sticky]);
    dp.sync(&plan, false).expect("sync");
    dp.sync(&plan, false).expect("sync again");
    let kernel = dp.kernel();
    assert_eq!(kernel.services.len(), 3);
    for (service, _) in kernel.services.values() {
        assert_eq!(service.scheduler, "mh");
        assert_ne!(service.flags & IP_VS_SVC_F_SCHED_MH_PORT, 0, "{service:?}");
    }
    let sticky = &kernel.services[&(IPPROTO_TCP, ip("10.96.0.11"), 80)].0;
    assert_ne!(sticky.flags & IP_VS_SVC_F_PERSISTENT, 0);
    assert_eq!(
        kernel.timeouts,
        IpvsTimeouts {
            tcp: 900,
            tcp_fin: 30,
            udp: 60
        }
    );
    let set_calls = kernel
        .log
        .iter()
        .filter(|l| l.starts_with("set timeouts"))
        .count();
    assert_eq!(set_calls, 1, "{:?}", kernel.log);

    // With rr, no scheduler flags at all.
    let mut rr = dataplane(IpvsSettings::default());
    rr.sync(&plan, false).expect("sync");
    assert!(
        rr.kernel()
            .services
            .values()
            .all(|(s, _)| s.flags & IP_VS_SVC_F_SCHED_MH_PORT == 0)
    );
    assert!(
        !rr.kernel()
            .log
            .iter()
            .any(|l| l.starts_with("set timeouts"))
    );
}

/// `explain`'s live trace in ipvs mode, over what a sync left in the fakes (the rules
/// as `iptables-save` prints them, the sets and the virtual servers): every verdict is
/// the plan's, and a real server draining at weight 0 or removed by hand is not reached.
#[test]
fn the_live_trace_follows_rules_sets_and_ipvs_as_the_plan_says() {
    use proxyplan_agent::explain::{Flow, Verdict as Planned, explain};
    use proxyplan_agent::kernel::Family;
    use proxyplan_agent::modes::iptables::trace::{Packet, Verdict};
    use proxyplan_agent::modes::ipvs::trace::trace_live;
    use std::collections::BTreeMap;

    let web = node_port(
        service(
            "web",
            "10.96.0.10",
            80,
            &["10.244.1.10:8080", "10.244.1.11:8080"],
        ),
        30080,
    );
    let mut empty = service("empty", "10.96.0.40", 80, &[]);
    empty.internal.when_empty = EmptyAction::Reject;
    let mut lb = service("lb", "10.96.0.20", 443, &["10.244.2.10:8443"]);
    lb.load_balancer_ips = vec![LoadBalancerIp {
        ip: "203.0.113.7".into(),
        mode: LoadBalancerIpMode::VIP,
    }];
    lb.load_balancer_source_ranges = vec!["192.0.2.0/24".into()];
    lb.external = Some(TrafficPlan {
        policy: TrafficPolicy::Cluster,
        when_empty: EmptyAction::Reject,
    });
    lb.masquerade.external = true;
    let mut local = node_port(
        service("local", "10.96.0.30", 80, &["10.244.2.11:8080"]),
        30081,
    );
    local.external = Some(TrafficPlan {
        policy: TrafficPolicy::Local,
        when_empty: EmptyAction::Drop,
    });
    local.masquerade.external = false;
    let full = plan(vec![web, empty.clone(), lb.clone(), local.clone()]);
    let mut dp = dataplane(IpvsSettings {
        termination_grace: Duration::from_secs(3600),
        ..IpvsSettings::default()
    });
    dp.sync(&full, false).unwrap();

    // (source, destination, port) -> the trace's verdict and endpoints with masquerade.
    let trace = |dp: &mut IpvsDataplane<FakeIpvsKernel, Tools>, from: &str, to: &str, port| {
        let save = format!(
            "{}{}",
            dp.runner().save(Family::V4, "nat"),
            dp.runner().save(Family::V4, "filter")
        );
        let packet = Packet::new(ip(from), ip(to), proxyplan_crds::Protocol::TCP, port);
        let result = trace_live(dp.kernel_mut(), &save, &[], &packet).unwrap();
        let reached = result.reached();
        (result, reached)
    };
    // (source, destination, port, verdict, endpoints reached with their masquerade)
    type Case<'a> = (&'a str, &'a str, u16, Verdict, &'a [(&'a str, bool)]);
    let cases: [Case<'_>; 9] = [
        // A pod to a cluster IP: both endpoints, not masqueraded.
        (
            "10.244.3.5",
            "10.96.0.10",
            80,
            Verdict::Accept,
            &[("10.244.1.10:8080", false), ("10.244.1.11:8080", false)],
        ),
        // From outside the cluster: masqueraded.
        (
            "192.168.7.7",
            "10.96.0.10",
            80,
            Verdict::Accept,
            &[("10.244.1.10:8080", true), ("10.244.1.11:8080", true)],
        ),
        // Hairpin: masqueraded only on the way back to itself.
        (
            "10.244.1.10",
            "10.96.0.10",
            80,
            Verdict::Accept,
            &[("10.244.1.10:8080", true), ("10.244.1.11:8080", false)],
        ),
        // A node port from outside: masqueraded (Cluster policy).
        (
            "192.168.7.7",
            NODE,
            30080,
            Verdict::Accept,
            &[("10.244.1.10:8080", true), ("10.244.1.11:8080", true)],
        ),
        // No endpoints: IPVS has no real server and answers port unreachable.
        ("10.244.3.5", "10.96.0.40", 80, Verdict::Reject, &[]),
        // A port no Service has on a VIP: the VIP filter rejects it.
        ("10.244.3.5", "10.96.0.10", 81, Verdict::Reject, &[]),
        // Local policy without a local endpoint: dropped.
        ("192.168.7.7", NODE, 30081, Verdict::Drop, &[]),
        // Source ranges: outside them dropped, inside them served.
        ("198.51.100.9", "203.0.113.7", 443, Verdict::Drop, &[]),
        (
            "192.0.2.9",
            "203.0.113.7",
            443,
            Verdict::Accept,
            &[("10.244.2.10:8443", true)],
        ),
    ];
    for (from, to, port, verdict, endpoints) in cases {
        let (result, reached) = trace(&mut dp, from, to, port);
        let want: BTreeMap<String, bool> = endpoints
            .iter()
            .map(|(e, m)| ((*e).to_owned(), *m))
            .collect();
        assert_eq!(
            (result.verdict, &reached),
            (verdict, &want),
            "{from} -> {to}:{port}:\n{result}"
        );
        // The plan says the same.
        let flow = Flow {
            source: ip(from),
            destination: ip(to),
            port,
            protocol: proxyplan_crds::Protocol::TCP,
            from_host: false,
            interface: None,
        };
        let planned = explain(&full, &flow, "ipvs");
        let same = match (&planned.verdict, verdict) {
            (Planned::Dnat { endpoints, .. }, Verdict::Accept) => {
                endpoints
                    .iter()
                    .map(|r| (r.endpoint.clone(), r.masquerade))
                    .collect::<BTreeMap<_, _>>()
                    == want
            }
            (Planned::Reject { .. }, Verdict::Reject) | (Planned::Drop { .. }, Verdict::Drop) => {
                true
            }
            _ => false,
        };
        assert!(
            same,
            "{from} -> {to}:{port}: plan {planned:?}, trace\n{result}"
        );
    }
    // The trace names IPVS's choice.
    let (result, _) = trace(&mut dp, "10.244.3.5", "10.96.0.10", 80);
    assert!(
        result.paths[0]
            .rules
            .iter()
            .any(|r| r == "ipvs TCP 10.96.0.10:80: rr -> 10.244.1.10:8080 weight 1/2"),
        "{result}"
    );

    // An endpoint leaves while a connection is on it: its TCP real server drains at
    // weight 0 and takes nothing new.
    dp.kernel_mut().set_connections(
        (IPPROTO_TCP, ip("10.96.0.10"), 80),
        (ip("10.244.1.11"), 8080),
        1,
    );
    let fewer_web = node_port(
        service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]),
        30080,
    );
    let fewer = plan(vec![fewer_web, empty, lb, local]);
    dp.sync(&fewer, false).unwrap();
    let held = &dp.kernel().services[&(IPPROTO_TCP, ip("10.96.0.10"), 80)].1;
    assert_eq!(held.len(), 2, "the removed real server drains");
    let (_, reached) = trace(&mut dp, "10.244.3.5", "10.96.0.10", 80);
    assert_eq!(
        reached.keys().collect::<Vec<_>>(),
        ["10.244.1.10:8080"],
        "weight 0 takes no new connection"
    );

    // Someone removes the last real server by hand: the live trace says reject, which
    // the plan does not.
    dp.kernel_mut()
        .services
        .get_mut(&(IPPROTO_TCP, ip("10.96.0.10"), 80))
        .unwrap()
        .1
        .clear();
    let (result, _) = trace(&mut dp, "10.244.3.5", "10.96.0.10", 80);
    assert_eq!(result.verdict, Verdict::Reject, "{result}");
    assert!(
        result.paths[0]
            .rules
            .iter()
            .any(|r| r.contains("no real server")),
        "{result}"
    );
}
