//! What only the iptables mode does, with real packets in network namespaces (kube-proxy's
//! iptables mode does the same, `pkg/proxy/iptables/proxier.go`): health-check node ports
//! accepted on a node whose INPUT policy drops, invalid forwarded packets dropped unless
//! conntrack is liberal, and localhost node ports behind their flag.
//!
//! Without root every test prints a SKIPPED line and passes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
mod traffic_support;

use std::time::Duration;

use proxyplan_agent::dataplane::Dataplane;
use proxyplan_agent::kernel::{Backend, CommandRunner};
use proxyplan_agent::modes::iptables::{IptablesDataplane, RenderSettings};
use proxyplan_agent::ruleset::names;
use proxyplan_crds::{EmptyAction, MergedPlan, ServicePortPlan, TrafficPlan, TrafficPolicy};
use support::{node_port, service};
use traffic_support::{EXT_V4, Lab, Listener, NODE_V4, Outcome};

fn plan(entries: Vec<ServicePortPlan>) -> MergedPlan {
    let mut plan = support::plan(entries);
    plan.addresses = vec![NODE_V4.parse().unwrap()];
    plan
}

fn dataplane(lab: &Lab, settings: RenderSettings) -> IptablesDataplane<CommandRunner> {
    IptablesDataplane::new(
        settings,
        CommandRunner::in_netns(&lab.ns("node")),
        Backend::Nft,
    )
}

fn assert_unreachable(what: &str, outcome: &Outcome) {
    assert!(outcome.backend().is_none(), "{what}: {outcome:?}");
}

/// A node whose INPUT policy is DROP still answers load balancers on the health-check
/// node port: the filter table accepts it, whether or not the Service has local
/// endpoints.
#[test]
fn health_check_node_ports_are_accepted_when_input_drops() {
    let Some(lab) = Lab::new(&["a1"]) else {
        return;
    };
    // A stand-in for the agent's health-check server on the node.
    lab.serve_at("node", NODE_V4, Listener::Tcp, 32000);
    lab.exec("node", &["iptables-nft", "-P", "INPUT", "DROP"]);
    let probe = || {
        lab.client("ext")
            .limit(Duration::from_millis(500))
            .tcp(NODE_V4, 32000)
    };
    assert_unreachable("before the agent", &probe());

    let mut lb = node_port(service("lb", "10.96.0.20", 80, &[]), 30080);
    lb.health_check_node_port = Some(32000);
    lb.external = Some(TrafficPlan {
        policy: TrafficPolicy::Local,
        when_empty: EmptyAction::Drop,
    });
    let mut dp = dataplane(&lab, RenderSettings::default());
    dp.sync(&plan(vec![lb]), false).expect("sync");
    assert_eq!(probe().backend(), Some("node/32000"));
}

/// Forwarded packets conntrack finds invalid (here a SYN+FIN) are dropped by the agent's
/// forwarding chain, unless `nf_conntrack_tcp_be_liberal` is set, and then the rule is
/// not there at all.
#[test]
fn invalid_forwarded_packets_are_dropped_unless_conntrack_is_liberal() {
    let Some(lab) = Lab::new(&["a1"]) else {
        return;
    };
    let web = service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]);
    let mut dp = dataplane(&lab, RenderSettings::default());
    dp.sync(&plan(vec![web.clone()]), false).expect("sync");
    let dropped = |lab: &Lab| -> u64 {
        let listing = lab.exec(
            "node",
            &[
                "iptables-nft",
                "-t",
                "filter",
                "-L",
                names::FORWARD,
                "-v",
                "-x",
                "-n",
            ],
        );
        listing
            .lines()
            .find(|l| l.contains("INVALID") && l.contains("DROP"))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no INVALID drop rule:\n{listing}"))
    };
    let before = dropped(&lab);
    // A pod sends a TCP segment with SYN and FIN set through the node to an off-cluster
    // address: conntrack calls it invalid.
    let script = format!(
        "import socket,struct\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_TCP)\n\
         src,dst=socket.inet_aton('10.244.1.10'),socket.inet_aton('{EXT_V4}')\n\
         hdr=struct.pack('!HHIIBBHHH',40000,9,1,0,5<<4,0x03,1024,0,0)\n\
         ph=src+dst+struct.pack('!BBH',0,6,len(hdr))\n\
         d=ph+hdr\n\
         c=sum(struct.unpack('!%dH'%(len(d)//2),d))\n\
         c=(c>>16)+(c&0xffff); c=~(c+(c>>16))&0xffff\n\
         hdr=hdr[:16]+struct.pack('!H',c)+hdr[18:]\n\
         for _ in range(3): s.sendto(hdr,('{EXT_V4}',0))\n"
    );
    lab.exec("a1", &["python3", "-c", &script]);
    assert!(
        dropped(&lab) >= before + 3,
        "three invalid segments dropped"
    );

    // With liberal TCP tracking (kube-proxy's --conntrack-tcp-be-liberal) the agent
    // installs no such rule.
    dp.cleanup().expect("cleanup");
    lab.exec(
        "node",
        &[
            "sysctl",
            "-qw",
            "net.netfilter.nf_conntrack_tcp_be_liberal=1",
        ],
    );
    let mut dp = dataplane(&lab, RenderSettings::default());
    dp.sync(&plan(vec![web]), false).expect("sync");
    let rules = lab.exec("node", &["iptables-nft-save", "-t", "filter"]);
    assert!(!rules.contains("INVALID"), "{rules}");
    assert!(rules.contains(&format!(":{}", names::FORWARD)), "{rules}");
}

/// Node ports on 127.0.0.1 only with `--iptables-localhost-nodeports` (kube-proxy's flag,
/// IPv4 only): then route_localnet is set and kube-proxy's martian guard comes with it.
#[test]
fn localhost_node_ports_only_with_their_flag() {
    let Some(lab) = Lab::new(&["a1"]) else {
        return;
    };
    lab.serve(
        "a1",
        proxyplan_agent::kernel::Family::V4,
        Listener::Tcp,
        8080,
    );
    let web = node_port(
        service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]),
        30080,
    );
    let localhost = || {
        lab.client("node")
            .limit(Duration::from_millis(500))
            .tcp("127.0.0.1", 30080)
    };
    let mut dp = dataplane(&lab, RenderSettings::default());
    dp.sync(&plan(vec![web.clone()]), false).expect("sync");
    assert_eq!(
        lab.client("node").tcp(NODE_V4, 30080).backend(),
        Some("a1/8080")
    );
    assert_unreachable("localhost without the flag", &localhost());
    dp.cleanup().expect("cleanup");

    let settings = RenderSettings {
        localhost_nodeports: true,
        ..RenderSettings::default()
    };
    let mut dp = dataplane(&lab, settings);
    dp.sync(&plan(vec![web]), false).expect("sync");
    assert_eq!(localhost().backend(), Some("a1/8080"));
    let route_localnet = lab.exec(
        "node",
        &["sysctl", "-n", "net.ipv4.conf.all.route_localnet"],
    );
    assert_eq!(route_localnet.trim(), "1");
    let filter = lab.exec("node", &["iptables-nft-save", "-t", "filter"]);
    assert!(
        filter.contains(
            "! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
        ),
        "{filter}"
    );
}

/// `--nodeport-addresses primary` (kube-proxy's keyword): node ports answer on the node's
/// primary IP (the plan's first address of the family) and not on its other addresses,
/// which answer by default.
#[test]
fn node_ports_on_primary_addresses_only() {
    let Some(lab) = Lab::new(&["a1"]) else {
        return;
    };
    lab.serve(
        "a1",
        proxyplan_agent::kernel::Family::V4,
        Listener::Tcp,
        8080,
    );
    let other = "198.51.100.7";
    lab.exec(
        "node",
        &["ip", "addr", "add", &format!("{other}/32"), "dev", "lo"],
    );
    let web = node_port(
        service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]),
        30080,
    );
    let mut node_plan = plan(vec![web]);
    node_plan.addresses.push(other.parse().unwrap());
    let reach = |ip: &str| {
        lab.client("node")
            .limit(Duration::from_millis(500))
            .tcp(ip, 30080)
    };

    let mut dp = dataplane(&lab, RenderSettings::default());
    dp.sync(&node_plan, false).expect("sync");
    assert_eq!(
        reach(other).backend(),
        Some("a1/8080"),
        "every address by default"
    );
    dp.cleanup().expect("cleanup");

    let settings = RenderSettings {
        nodeport_primary: true,
        localhost_nodeports: true,
        ..RenderSettings::default()
    };
    let mut dp = dataplane(&lab, settings);
    dp.sync(&node_plan, false).expect("sync");
    assert_eq!(reach(NODE_V4).backend(), Some("a1/8080"));
    assert_unreachable("a secondary address with primary", &reach(other));
    assert_unreachable(
        "localhost with primary (kube-proxy turns localhost node ports off)",
        &reach("127.0.0.1"),
    );
    let nat = lab.exec("node", &["iptables-nft-save", "-t", "nat"]);
    assert!(nat.contains(&format!("-d {NODE_V4}/32")), "{nat}");
}
