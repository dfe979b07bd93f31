//! The iptables mode with real TCP and UDP traffic (DESIGN §6 item 3): a node namespace
//! running the agent's rules, pods on it and on another node, an off-cluster client, and
//! `socat` backends that answer with their name and the source address they saw (see
//! `traffic_support`). Each test states a DESIGN §3 behaviour as "from this client to
//! this address: these backends, this source seen".
//!
//! Without root every test prints a SKIPPED line and passes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
mod traffic_support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use proxyplan_agent::dataplane::Dataplane;
use proxyplan_agent::kernel::{Backend, Family};
use proxyplan_agent::ruleset::names;
use proxyplan_agent::run::ProxyMode;
use proxyplan_crds::{
    EmptyAction, LoadBalancerIp, LoadBalancerIpMode, MergedPlan, ServicePortPlan, SessionAffinity,
    TrafficPlan, TrafficPolicy,
};
use support::{ep, node_port, service, udp};
use traffic_support::{
    Client, EXT_V4, EXT_V6, EXT2_V4, Lab, Listener, NODE_POD_GW_V4, NODE_POD_GW_V6,
    NODE_TO_REMOTE_V4, NODE_TO_REMOTE_V6, NODE_V4, NODE_V6, Outcome,
};

// ---------------------------------------------------------------------------------------
// Plans

/// The lab node's merged plan holding `entries`.
fn plan(entries: Vec<ServicePortPlan>) -> MergedPlan {
    let mut plan = support::plan(entries);
    plan.addresses = vec![ip(NODE_V4), ip(NODE_V6)];
    plan
}

const CLUSTER: TrafficPlan = TrafficPlan {
    policy: TrafficPolicy::Cluster,
    when_empty: EmptyAction::Reject,
};

fn endpoints(list: &[&str]) -> Vec<proxyplan_crds::Endpoint> {
    list.iter().map(|e| ep(e)).collect()
}

/// The entry with `externalIPs` (Cluster external policy, masqueraded).
fn external_ips(mut entry: ServicePortPlan, ips: &[&str]) -> ServicePortPlan {
    entry.external_ips = ips.iter().map(|i| (*i).to_owned()).collect();
    entry.external = Some(CLUSTER);
    entry.masquerade.external = true;
    entry
}

/// The entry with a VIP-mode load-balancer IP and source ranges.
fn load_balancer(mut entry: ServicePortPlan, vip: &str, ranges: &[&str]) -> ServicePortPlan {
    entry.load_balancer_ips = vec![LoadBalancerIp {
        ip: vip.to_owned(),
        mode: LoadBalancerIpMode::VIP,
    }];
    entry.load_balancer_source_ranges = ranges.iter().map(|r| (*r).to_owned()).collect();
    entry.external = Some(CLUSTER);
    entry.masquerade.external = true;
    entry
}

/// `externalTrafficPolicy: Local` as the controller decides it, with this node's
/// endpoints: no masquerade, DROP when this node has none but others do.
fn external_local(mut entry: ServicePortPlan, local: &[&str]) -> ServicePortPlan {
    let when_empty = if entry.cluster_endpoints.is_empty() {
        EmptyAction::Reject
    } else {
        EmptyAction::Drop
    };
    entry.external = Some(TrafficPlan {
        policy: TrafficPolicy::Local,
        when_empty,
    });
    entry.local_endpoints = endpoints(local);
    entry.masquerade.external = false;
    entry.masquerade.local_host_to_external = true;
    entry
}

/// `internalTrafficPolicy: Local` with this node's endpoints.
fn internal_local(mut entry: ServicePortPlan, local: &[&str]) -> ServicePortPlan {
    entry.internal = TrafficPlan {
        policy: TrafficPolicy::Local,
        when_empty: EmptyAction::Drop,
    };
    entry.local_endpoints = endpoints(local);
    entry
}

fn affinity(mut entry: ServicePortPlan, timeout_seconds: u32) -> ServicePortPlan {
    entry.session_affinity = Some(SessionAffinity { timeout_seconds });
    entry
}

// ---------------------------------------------------------------------------------------
// Traffic helpers

fn ip(text: &str) -> IpAddr {
    text.parse().expect("ip")
}

/// Backend → sources it saw.
type Seen = BTreeMap<String, BTreeSet<IpAddr>>;

/// Probes until every backend in `want` has answered (at most `tries` probes); every
/// probe must be answered, by one of `want`.
fn until_all(want: &[&str], tries: usize, mut probe: impl FnMut() -> Outcome) -> Seen {
    let mut seen = Seen::new();
    for _ in 0..tries {
        match probe() {
            Outcome::Served { backend, source } => {
                assert!(
                    want.contains(&backend.as_str()),
                    "{backend} answered, only {want:?} may"
                );
                seen.entry(backend).or_default().insert(source);
            }
            other => panic!("expected an answer from one of {want:?}, got {other:?}"),
        }
        if seen.len() == want.len() {
            return seen;
        }
    }
    panic!("{tries} probes reached only {seen:?}, not every one of {want:?}");
}

/// What real packets showed, for [`assert_explained`].
enum Showed<'a> {
    /// Served by these backends (with the sources they saw).
    Served(&'a Seen),
    /// Refused.
    Refused,
    /// Dropped by the proxy's rules.
    Dropped,
    /// Left untranslated: answered by a server at the address itself, or lost on the way
    /// because nothing is there.
    Untouched,
}

/// A client of [`assert_explained`]: its address and whether it is the node itself.
struct From<'a>(&'a str, bool);

/// `proxyplan-agent explain`'s verdict on `plan`, for a connection from `from` to
/// `addr:port`, is what the real packets showed: the same endpoints (each masqueraded
/// exactly when its backend saw another source than the client's; not compared for the
/// node itself, whose own address is what masquerade gives too), a reject, a drop, or
/// nothing done.
fn assert_explained(
    lab: &Lab,
    plan: &MergedPlan,
    from: &From<'_>,
    (addr, port): (&str, u16),
    protocol: proxyplan_crds::Protocol,
    showed: &Showed<'_>,
) {
    use proxyplan_agent::explain::{Flow, Verdict, explain, human};
    let flow = Flow {
        source: ip(from.0),
        destination: ip(addr),
        port,
        protocol,
        from_host: from.1,
        interface: None,
    };
    let mode = traffic_support::mode_under_test().as_str();
    let x = explain(plan, &flow, mode);
    let what = format!(
        "explain in {mode} mode for {} -> {addr}:{port}:\n{}",
        from.0,
        human(&x)
    );
    match (showed, &x.verdict) {
        (Showed::Served(seen), Verdict::Dnat { endpoints, .. }) => {
            let real = reached_by_packets(lab, seen, &flow);
            let explained: BTreeMap<String, bool> = endpoints
                .iter()
                .map(|r| (r.endpoint.clone(), r.masquerade))
                .collect();
            assert_eq!(
                explained.keys().collect::<Vec<_>>(),
                real.keys().collect::<Vec<_>>(),
                "{what}"
            );
            if !from.1 {
                assert_eq!(explained, real, "masquerade per endpoint; {what}");
            }
        }
        (Showed::Refused, Verdict::Reject { .. })
        | (Showed::Dropped, Verdict::Drop { .. })
        | (Showed::Untouched, Verdict::NotProxied { .. }) => {}
        _ => panic!("real packets and explain disagree; {what}"),
    }
    assert_traced(lab, plan, &flow, from, showed);
}

/// The endpoints real packets reached (`ip:port`), each with whether its backend saw
/// another source than the client's (masqueraded).
fn reached_by_packets(
    lab: &Lab,
    seen: &Seen,
    flow: &proxyplan_agent::explain::Flow,
) -> BTreeMap<String, bool> {
    let family = if flow.destination.is_ipv4() {
        Family::V4
    } else {
        Family::V6
    };
    let mut real = BTreeMap::new();
    for (backend, sources) in seen {
        let (pod, target) = backend.split_once('/').expect("pod/port");
        let endpoint = match ip(lab.pod(pod).ip(family)) {
            IpAddr::V4(a) => format!("{a}:{target}"),
            IpAddr::V6(a) => format!("[{a}]:{target}"),
        };
        real.insert(endpoint, sources.iter().any(|s| *s != flow.source));
    }
    real
}

/// The live kernel's trace of the same connection (what `explain` prints as `kernel
/// trace:`), in the mode under test, is what the real packets showed too: nftables mode
/// through the live table, iptables mode through the live rules, ipvs mode through the
/// live rules, ipsets and IPVS.
fn assert_traced(
    lab: &Lab,
    plan: &MergedPlan,
    flow: &proxyplan_agent::explain::Flow,
    from: &From<'_>,
    showed: &Showed<'_>,
) {
    use proxyplan_agent::kernel::iptables::Tool;
    use proxyplan_agent::modes::iptables::trace as ipt;
    let family = if flow.destination.is_ipv4() {
        Family::V4
    } else {
        Family::V6
    };
    let node = lab.ns("node");
    let iptables_packet = || {
        let packet = ipt::Packet::new(flow.source, flow.destination, flow.protocol, flow.port);
        if flow.from_host {
            packet.host_originated()
        } else {
            packet
        }
    };
    let iptables_result = |result: ipt::TraceResult| {
        (
            result.verdict.as_str(),
            result.reached(),
            result.to_string(),
        )
    };
    let (verdict, reached, trace) = match traffic_support::mode_under_test() {
        ProxyMode::Nftables => {
            use proxyplan_agent::kernel::nftables::NetlinkNft;
            use proxyplan_agent::modes::nftables::NftablesSettings;
            use proxyplan_agent::modes::nftables::trace::{Packet, trace_live};
            let mut kernel = NetlinkNft::in_netns(&node).expect("netlink in the node");
            let packet = Packet {
                source: flow.source,
                destination: flow.destination,
                protocol: flow.protocol.number(),
                port: flow.port,
                from_host: flow.from_host,
                interface: None,
            };
            let trace = trace_live(&mut kernel, plan, &NftablesSettings::default(), &packet)
                .unwrap_or_else(|e| panic!("tracing {packet:?} through the live table: {e}"));
            (
                trace.verdict().as_str(),
                trace.endpoints(),
                format!("{trace:?}"),
            )
        }
        ProxyMode::Iptables => {
            let save = lab.exec("node", &[&Backend::Nft.binary(family, Tool::Save)]);
            let rules = ipt::live_rules(&save);
            let result = ipt::trace(&rules, &plan.addresses, &iptables_packet())
                .unwrap_or_else(|e| panic!("tracing {flow:?} through the live rules: {e}"));
            iptables_result(result)
        }
        ProxyMode::Ipvs => {
            use proxyplan_agent::kernel::ipvs::NetlinkKernel;
            let save = lab.exec("node", &[&Backend::Nft.binary(family, Tool::Save)]);
            let mut kernel = NetlinkKernel::in_netns(&node).expect("netlink in the node");
            let result = proxyplan_agent::modes::ipvs::trace::trace_live(
                &mut kernel,
                &save,
                &plan.addresses,
                &iptables_packet(),
            )
            .unwrap_or_else(|e| panic!("tracing {flow:?} through the live kernel: {e}"));
            iptables_result(result)
        }
    };
    let what = format!(
        "the live trace of {} -> {}:{} ({} mode): {trace}",
        flow.source,
        flow.destination,
        flow.port,
        traffic_support::mode_under_test().as_str()
    );
    match showed {
        Showed::Served(seen) => {
            assert_eq!(verdict, "accept", "{what}");
            let real = reached_by_packets(lab, seen, flow);
            assert_eq!(
                reached.keys().collect::<Vec<_>>(),
                real.keys().collect::<Vec<_>>(),
                "{what}"
            );
            if !from.1 {
                assert_eq!(reached, real, "masquerade per endpoint; {what}");
            }
        }
        Showed::Refused => assert_eq!(verdict, "reject", "{what}"),
        Showed::Dropped => assert_eq!(verdict, "drop", "{what}"),
        Showed::Untouched => {
            assert_eq!(verdict, "accept", "{what}");
            assert!(reached.is_empty(), "{what}");
        }
    }
}

/// `until_all` over TCP.
fn tcp_until_all(client: &Client<'_>, addr: &str, port: u16, want: &[&str]) -> Seen {
    until_all(want, 40, || client.tcp(addr, port))
}

/// `n` TCP connections, each answered; backend → count.
fn tcp_counts(client: &Client<'_>, addr: &str, port: u16, n: usize) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        match client.tcp(addr, port) {
            Outcome::Served { backend, .. } => *counts.entry(backend).or_default() += 1,
            other => panic!("{addr}:{port}: {other:?}"),
        }
    }
    counts
}

fn sources(seen: &Seen, backend: &str) -> BTreeSet<IpAddr> {
    seen.get(backend).cloned().unwrap_or_default()
}

fn only(addr: &str) -> BTreeSet<IpAddr> {
    BTreeSet::from([ip(addr)])
}

/// What a probe expected to get nothing gets, and how long it took.
fn timed(probe: impl FnOnce() -> Outcome) -> (Outcome, Duration) {
    let start = Instant::now();
    let outcome = probe();
    (outcome, start.elapsed())
}

/// A probe that must time out: dropped, not refused.
fn assert_dropped(what: &str, probe: impl FnOnce() -> Outcome) {
    let (outcome, took) = timed(probe);
    assert_eq!(outcome, Outcome::TimedOut, "{what}: {took:?}");
}

/// A probe that must be refused, quickly.
fn assert_rejected(what: &str, probe: impl FnOnce() -> Outcome) {
    assert_refused_within(what, Duration::from_secs(1), probe);
}

fn assert_refused_within(what: &str, bound: Duration, probe: impl FnOnce() -> Outcome) {
    let (outcome, took) = timed(probe);
    assert_eq!(outcome, Outcome::Refused, "{what}");
    assert!(took < bound, "{what}: refused after {took:?}");
}

/// Whether the suite runs in ipvs mode (inside the VM), where a few behaviours differ from
/// iptables mode exactly as kube-proxy's ipvs mode differs from its iptables mode.
fn ipvs() -> bool {
    traffic_support::mode_under_test() == ProxyMode::Ipvs
}

/// Whether the suite runs in nftables mode, where a few behaviours differ from iptables
/// mode exactly as kube-proxy's nftables mode differs from its iptables mode.
fn nftables() -> bool {
    traffic_support::mode_under_test() == ProxyMode::Nftables
}

/// The entry as SCTP.
fn sctp(mut entry: ServicePortPlan) -> ServicePortPlan {
    entry.protocol = proxyplan_crds::Protocol::SCTP;
    entry.key = entry.key.replace("/TCP/", "/SCTP/");
    entry
}

const TCP: proxyplan_crds::Protocol = proxyplan_crds::Protocol::TCP;

fn sync(dp: &mut impl Dataplane, plan: &MergedPlan) {
    dp.sync(plan, false).expect("sync");
}

// ---------------------------------------------------------------------------------------
// Tests

/// Many connections to a ClusterIP reach every endpoint, local and remote.
#[test]
fn clusterip_balances_over_every_endpoint() {
    let Some(lab) = Lab::new(&["a1", "a2", "a3", "r1", "r2"]) else {
        return;
    };
    for pod in ["a1", "a2", "r1", "r2"] {
        lab.serve(pod, Family::V4, Listener::Tcp, 8080);
    }
    let eps = [
        "10.244.1.10:8080",
        "10.244.1.11:8080",
        "10.244.2.10:8080",
        "10.244.2.11:8080",
    ];
    let mut dp = lab.dataplane();
    sync(&mut dp, &plan(vec![service("web", "10.96.0.10", 80, &eps)]));
    let counts = tcp_counts(&lab.client("a3"), "10.96.0.10", 80, 48);
    println!("48 connections over 4 endpoints: {counts:?}");
    assert_eq!(
        counts.keys().map(String::as_str).collect::<Vec<_>>(),
        ["a1/8080", "a2/8080", "r1/8080", "r2/8080"]
    );
}

/// ClusterIP traffic from a pod keeps the pod's address; from off the cluster it is
/// masqueraded to the node's address on the way out.
#[test]
fn clusterip_keeps_pod_source_and_masquerades_off_cluster_clients() {
    let Some(lab) = Lab::new(&["a1", "a2", "r1"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    lab.serve("r1", Family::V4, Listener::Tcp, 8080);
    let mut dp = lab.dataplane();
    let web = service(
        "web",
        "10.96.0.10",
        80,
        &["10.244.1.10:8080", "10.244.2.10:8080"],
    );
    let web_plan = plan(vec![web]);
    sync(&mut dp, &web_plan);

    let want = ["a1/8080", "r1/8080"];
    let from_pod = tcp_until_all(&lab.client("a2"), "10.96.0.10", 80, &want);
    assert_eq!(sources(&from_pod, "a1/8080"), only("10.244.1.11"));
    assert_eq!(sources(&from_pod, "r1/8080"), only("10.244.1.11"));

    let from_ext = tcp_until_all(&lab.client("ext"), "10.96.0.10", 80, &want);
    assert_eq!(sources(&from_ext, "a1/8080"), only(NODE_POD_GW_V4));
    assert_eq!(sources(&from_ext, "r1/8080"), only(NODE_TO_REMOTE_V4));

    // The node itself (host-network pods) is off the pod CIDR too.
    let from_node = tcp_until_all(&lab.client("node"), "10.96.0.10", 80, &want);
    assert_eq!(sources(&from_node, "a1/8080"), only(NODE_POD_GW_V4));
    assert_eq!(sources(&from_node, "r1/8080"), only(NODE_TO_REMOTE_V4));

    let to = ("10.96.0.10", 80);
    for (from, seen) in [
        (From("10.244.1.11", false), &from_pod),
        (From(EXT_V4, false), &from_ext),
        (From(NODE_V4, true), &from_node),
    ] {
        assert_explained(&lab, &web_plan, &from, to, TCP, &Showed::Served(seen));
    }
}

/// Local-traffic detection by interface: a connection from pod `local` (arriving on its
/// interface) keeps its source, one from pod `other` is masqueraded to the node's address
/// on the pods' side.
fn interface_detection(
    mode: proxyplan_crds::LocalTrafficMode,
    name: &str,
    local: &str,
    other: &str,
) {
    let Some(lab) = Lab::new(&["a1", "a2", "a3"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    let mut dp = lab.dataplane();
    let web = service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]);
    let mut plan = plan(vec![web]);
    plan.local_traffic = proxyplan_crds::LocalTrafficDetection {
        mode,
        cidrs: Vec::new(),
        interface: Some(name.to_owned()),
    };
    sync(&mut dp, &plan);
    let want = ["a1/8080"];
    let from_local = tcp_until_all(&lab.client(local), "10.96.0.10", 80, &want);
    assert_eq!(
        sources(&from_local, "a1/8080"),
        only(lab.pod(local).ip(Family::V4))
    );
    let from_other = tcp_until_all(&lab.client(other), "10.96.0.10", 80, &want);
    assert_eq!(sources(&from_other, "a1/8080"), only(NODE_POD_GW_V4));
}

/// `--detect-local-mode=InterfaceNamePrefix` (CNIs whose pods are not inside one CIDR):
/// traffic that arrives on a pod interface (here `pa1`..`pa3`, prefix `pa`) is in-cluster
/// and keeps its source; the rest (here from off the cluster) is masqueraded.
#[test]
fn interface_prefix_detection_keeps_pod_sources() {
    interface_detection(
        proxyplan_crds::LocalTrafficMode::InterfaceNamePrefix,
        "pa",
        "a2",
        "ext",
    );
}

/// `--detect-local-mode=BridgeInterface`: traffic that arrives on that one interface
/// (here pod `a2`'s `pa2`; in a cluster, the pods' bridge) is in-cluster and keeps its
/// source; the rest, even from a pod on another interface, is masqueraded.
#[test]
fn bridge_interface_detection_keeps_that_interfaces_sources() {
    interface_detection(
        proxyplan_crds::LocalTrafficMode::BridgeInterface,
        "pa2",
        "a2",
        "a3",
    );
}

/// `masqueradeAll`: even pod traffic to the cluster IP is masqueraded.
#[test]
fn masquerade_all_masquerades_pod_traffic() {
    let Some(lab) = Lab::new(&["a1", "a2"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    let mut dp = lab.dataplane();
    let mut web = service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]);
    web.masquerade.all = true;
    sync(&mut dp, &plan(vec![web]));
    assert_eq!(
        lab.client("a2").tcp("10.96.0.10", 80).source(),
        Some(ip(NODE_POD_GW_V4))
    );
}

/// A multi-port Service: each service port goes to its own target port.
#[test]
fn multi_port_service_routes_each_port() {
    let Some(lab) = Lab::new(&["a1", "a2"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    lab.serve("a1", Family::V4, Listener::Tcp, 9090);
    let mut dp = lab.dataplane();
    let http = service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]);
    let mut metrics = service("web", "10.96.0.10", 81, &["10.244.1.10:9090"]);
    metrics.port_name = "metrics".into();
    metrics.key = metrics.key.replace(":http/", ":metrics/");
    sync(&mut dp, &plan(vec![http, metrics]));
    let pod = lab.client("a2");
    for _ in 0..4 {
        assert_eq!(pod.tcp("10.96.0.10", 80).backend(), Some("a1/8080"));
        assert_eq!(pod.tcp("10.96.0.10", 81).backend(), Some("a1/9090"));
    }
}

/// A node port (Cluster policy) reached from off the cluster: every endpoint, masqueraded.
#[test]
fn nodeport_from_off_cluster_is_masqueraded_and_balanced() {
    let Some(lab) = Lab::new(&["a1", "r1"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    lab.serve("r1", Family::V4, Listener::Tcp, 8080);
    let mut dp = lab.dataplane();
    let api = node_port(
        service(
            "api",
            "10.96.0.11",
            80,
            &["10.244.1.10:8080", "10.244.2.10:8080"],
        ),
        30080,
    );
    sync(&mut dp, &plan(vec![api]));
    let seen = tcp_until_all(&lab.client("ext"), NODE_V4, 30080, &["a1/8080", "r1/8080"]);
    assert_eq!(sources(&seen, "a1/8080"), only(NODE_POD_GW_V4));
    assert_eq!(sources(&seen, "r1/8080"), only(NODE_TO_REMOTE_V4));
}

/// An external IP routed to the node reaches the endpoints, masqueraded (Cluster policy).
#[test]
fn external_ip_reaches_endpoints() {
    let Some(lab) = Lab::new(&["a1", "r1"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    lab.serve("r1", Family::V4, Listener::Tcp, 8080);
    let mut dp = lab.dataplane();
    let web = external_ips(
        service(
            "web",
            "10.96.0.10",
            80,
            &["10.244.1.10:8080", "10.244.2.10:8080"],
        ),
        &["192.0.2.10"],
    );
    sync(&mut dp, &plan(vec![web]));
    let seen = tcp_until_all(
        &lab.client("ext"),
        "192.0.2.10",
        80,
        &["a1/8080", "r1/8080"],
    );
    assert_eq!(sources(&seen, "a1/8080"), only(NODE_POD_GW_V4));
    assert_eq!(sources(&seen, "r1/8080"), only(NODE_TO_REMOTE_V4));
    // Another port of the same address is not the Service's. In ipvs mode the address
    // is the node's own (on the dummy interface), so the node refuses it, as with
    // kube-proxy's ipvs mode; in iptables mode it is routed on and gets nothing.
    let other_port = || {
        lab.client("ext")
            .limit(Duration::from_secs(1))
            .tcp("192.0.2.10", 81)
    };
    if ipvs() {
        assert_rejected("external IP, other port", other_port);
    } else {
        assert_dropped("external IP, other port", other_port);
    }
}

/// A load-balancer IP with source ranges: a listed source reaches a backend, another
/// source gets nothing (dropped); the ranges do not apply to the cluster IP.
#[test]
fn load_balancer_source_ranges_admit_only_listed_sources() {
    let Some(lab) = Lab::new(&["a1", "r1"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    lab.serve("r1", Family::V4, Listener::Tcp, 8080);
    let mut dp = lab.dataplane();
    let lb = load_balancer(
        service(
            "lb",
            "10.96.0.20",
            80,
            &["10.244.1.10:8080", "10.244.2.10:8080"],
        ),
        "192.0.2.20",
        &["10.10.0.100/32"],
    );
    let lb_plan = plan(vec![lb]);
    sync(&mut dp, &lb_plan);
    let allowed = lab.client("ext").bind(EXT_V4);
    let seen = tcp_until_all(&allowed, "192.0.2.20", 80, &["a1/8080", "r1/8080"]);
    assert_eq!(sources(&seen, "a1/8080"), only(NODE_POD_GW_V4));
    assert_dropped("load-balancer IP from a source outside the ranges", || {
        lab.client("ext").bind(EXT2_V4).tcp("192.0.2.20", 80)
    });
    let vip = ("192.0.2.20", 80);
    assert_explained(
        &lab,
        &lb_plan,
        &From(EXT_V4, false),
        vip,
        TCP,
        &Showed::Served(&seen),
    );
    assert_explained(
        &lab,
        &lb_plan,
        &From(EXT2_V4, false),
        vip,
        TCP,
        &Showed::Dropped,
    );
    assert!(
        lab.client("ext")
            .bind(EXT2_V4)
            .tcp("10.96.0.20", 80)
            .backend()
            .is_some(),
        "the cluster IP is not restricted by loadBalancerSourceRanges"
    );
}

/// A load-balancer IP with `ipMode: Proxy` is left to the load balancer (here a server in
/// `ext` holding that address), while a VIP-mode one is short-circuited on the node.
#[test]
fn load_balancer_ip_mode_proxy_is_left_to_the_load_balancer() {
    let Some(lab) = Lab::new(&["a1", "a2"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    lab.exec("ext", &["ip", "addr", "add", "192.0.2.25/32", "dev", "lo"]);
    lab.serve_at("ext", "192.0.2.25", Listener::Tcp, 80);
    let mut dp = lab.dataplane();
    let vip = load_balancer(
        service("vip", "10.96.0.24", 80, &["10.244.1.10:8080"]),
        "192.0.2.24",
        &[],
    );
    let mut proxy = load_balancer(
        service("proxy", "10.96.0.25", 80, &["10.244.1.10:8080"]),
        "192.0.2.25",
        &[],
    );
    proxy.load_balancer_ips[0].mode = LoadBalancerIpMode::Proxy;
    sync(&mut dp, &plan(vec![vip, proxy]));
    let pod = lab.client("a2");
    assert_eq!(pod.tcp("192.0.2.24", 80).backend(), Some("a1/8080"));
    assert_eq!(pod.tcp("192.0.2.25", 80).backend(), Some("ext/80"));
}

/// `externalTrafficPolicy: Local`: the client's address reaches the backend and only
/// this node's endpoints serve; pods using the node port are short-circuited to every
/// endpoint.
#[test]
fn external_traffic_policy_local_preserves_source_and_stays_on_the_node() {
    let Some(lab) = Lab::new(&["a1", "a2", "r1"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    lab.serve("r1", Family::V4, Listener::Tcp, 8080);
    let mut dp = lab.dataplane();
    let local = external_local(
        node_port(
            service(
                "local",
                "10.96.0.21",
                80,
                &["10.244.1.10:8080", "10.244.2.10:8080"],
            ),
            30081,
        ),
        &["10.244.1.10:8080"],
    );
    sync(&mut dp, &plan(vec![local]));
    let ext = lab.client("ext");
    for _ in 0..16 {
        let outcome = ext.tcp(NODE_V4, 30081);
        assert_eq!(
            outcome,
            Outcome::Served {
                backend: "a1/8080".into(),
                source: ip(EXT_V4)
            }
        );
    }
    if ipvs() {
        // ipvs mode (like kube-proxy's) has one real-server list per virtual server: pods
        // and the node itself reach the node port's local endpoints too, the node's
        // traffic masqueraded.
        for _ in 0..8 {
            assert_eq!(
                lab.client("a2").tcp(NODE_V4, 30081).backend(),
                Some("a1/8080")
            );
        }
        let from_node = tcp_until_all(&lab.client("node"), NODE_V4, 30081, &["a1/8080"]);
        assert_eq!(sources(&from_node, "a1/8080"), only(NODE_POD_GW_V4));
        return;
    }
    let want = ["a1/8080", "r1/8080"];
    tcp_until_all(&lab.client("a2"), NODE_V4, 30081, &want);
    // The node itself is short-circuited too, masqueraded (its source would be a local
    // address the endpoint cannot answer to on another node).
    let from_node = tcp_until_all(&lab.client("node"), NODE_V4, 30081, &want);
    assert_eq!(sources(&from_node, "a1/8080"), only(NODE_POD_GW_V4));
    assert_eq!(sources(&from_node, "r1/8080"), only(NODE_TO_REMOTE_V4));
}

/// `externalTrafficPolicy: Local` on a node without a local endpoint: dropped (the
/// client times out), while a Service with no endpoint anywhere is rejected at once.
#[test]
fn external_traffic_policy_local_without_local_endpoint_drops() {
    let Some(lab) = Lab::new(&["r1"]) else {
        return;
    };
    lab.serve("r1", Family::V4, Listener::Tcp, 8080);
    let mut dp = lab.dataplane();
    let elsewhere = external_local(
        node_port(
            service("elsewhere", "10.96.0.22", 80, &["10.244.2.10:8080"]),
            30082,
        ),
        &[],
    );
    let nowhere = external_local(
        node_port(service("nowhere", "10.96.0.23", 80, &[]), 30083),
        &[],
    );
    let local_plan = plan(vec![elsewhere, nowhere]);
    sync(&mut dp, &local_plan);
    assert_dropped("Local node port without a local endpoint", || {
        lab.client("ext").tcp(NODE_V4, 30082)
    });
    assert_rejected("node port of a Service without endpoints", || {
        lab.client("ext").tcp(NODE_V4, 30083)
    });
    let ext = From(EXT_V4, false);
    assert_explained(
        &lab,
        &local_plan,
        &ext,
        (NODE_V4, 30082),
        TCP,
        &Showed::Dropped,
    );
    assert_explained(
        &lab,
        &local_plan,
        &ext,
        (NODE_V4, 30083),
        TCP,
        &Showed::Refused,
    );
    // The cluster IP (Cluster internal policy) still reaches the remote endpoint.
    assert_eq!(
        lab.client("ext").tcp("10.96.0.22", 80).backend(),
        Some("r1/8080")
    );
}

/// `internalTrafficPolicy: Local`: only this node's endpoints serve the cluster IP; with
/// none here, traffic is dropped.
#[test]
fn internal_traffic_policy_local_uses_only_local_endpoints() {
    let Some(lab) = Lab::new(&["a1", "a2", "r1"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    lab.serve("r1", Family::V4, Listener::Tcp, 8080);
    let mut dp = lab.dataplane();
    let here = internal_local(
        service(
            "here",
            "10.96.0.50",
            80,
            &["10.244.1.10:8080", "10.244.2.10:8080"],
        ),
        &["10.244.1.10:8080"],
    );
    let not_here = internal_local(service("not-here", "10.96.0.51", 80, &[]), &[]);
    sync(&mut dp, &plan(vec![here, not_here]));
    let counts = tcp_counts(&lab.client("a2"), "10.96.0.50", 80, 16);
    assert_eq!(counts, BTreeMap::from([("a1/8080".to_owned(), 16)]));
    assert_dropped("internal Local without a local endpoint", || {
        lab.client("a2").tcp("10.96.0.51", 80)
    });
}

/// ClientIP affinity: repeated connections stick to one backend; after the timeout a new
/// choice is made.
#[test]
fn client_ip_affinity_holds_then_expires() {
    let Some(lab) = Lab::new(&["a1", "a2", "r1"]) else {
        return;
    };
    for pod in ["a1", "r1"] {
        for port in [8080, 8081] {
            lab.serve(pod, Family::V4, Listener::Tcp, port);
        }
    }
    let mut dp = lab.dataplane();
    let eps = [
        "10.244.1.10:8080",
        "10.244.1.10:8081",
        "10.244.2.10:8080",
        "10.244.2.10:8081",
    ];
    let sticky = affinity(service("sticky", "10.96.0.60", 80, &eps), 2);
    sync(&mut dp, &plan(vec![sticky]));
    let client = lab.client("a2");
    let counts = tcp_counts(&client, "10.96.0.60", 80, 12);
    assert_eq!(counts.len(), 1, "12 connections within 2 s: {counts:?}");
    let held = counts.keys().next().unwrap().clone();
    if ipvs() {
        ipvs_affinity_expires(&lab, &mut dp);
        return;
    }
    // Each round lets the affinity expire; with 4 endpoints a round picks another one
    // with probability 3/4.
    let mut picked = Vec::new();
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(2600));
        let outcome = client.tcp("10.96.0.60", 80);
        let backend = outcome.backend().expect("answered").to_owned();
        let moved = backend != held;
        picked.push(backend);
        if moved {
            println!("held {held}, after expiry: {picked:?}");
            return;
        }
    }
    panic!("affinity to {held} never expired: {picked:?}");
}

/// ipvs mode: an IPVS persistence template lives until its timeout has passed *and* the
/// connections it placed are gone, and TCP connections linger in TIME_WAIT for minutes
/// (as with kube-proxy's ipvs mode). So expiry is shown over UDP, with the IPVS UDP
/// timeout cut to 1 s: each probe is a new flow from another source port.
fn ipvs_affinity_expires(lab: &Lab, dp: &mut impl Dataplane) {
    for pod in ["a1", "r1"] {
        lab.serve(pod, Family::V4, Listener::Udp, 5353);
    }
    lab.exec("node", &["ipvsadm", "--set", "0", "0", "1"]);
    let eps = ["10.244.1.10:5353", "10.244.2.10:5353"];
    let sticky = affinity(udp(service("sticky-udp", "10.96.0.61", 53, &eps)), 2);
    sync(dp, &plan(vec![sticky]));
    let held_rules = lab.exec("node", &["ipvsadm", "-Ln", "-u", "10.96.0.61:53"]);
    assert!(held_rules.contains("persistent 2"), "{held_rules}");
    let probe = |port: u16| {
        lab.client("a2")
            .source_port(port)
            .udp("10.96.0.61", 53)
            .backend()
            .expect("answered")
            .to_owned()
    };
    let held = probe(41000);
    for port in 41001..41007 {
        assert_eq!(probe(port), held, "affinity within 2 s");
    }
    let mut picked = Vec::new();
    for port in 42000..42008 {
        std::thread::sleep(Duration::from_millis(3500));
        let backend = probe(port);
        let moved = backend != held;
        picked.push(backend);
        if moved {
            println!("held {held}, after expiry: {picked:?}");
            return;
        }
    }
    panic!("affinity to {held} never expired: {picked:?}");
}

/// A Service without endpoints rejects: clients are refused at once, not left to time
/// out, on every address of the Service, TCP and UDP, IPv4 and IPv6, from a pod, from the
/// node and from off the cluster.
#[test]
fn service_without_endpoints_is_rejected() {
    let Some(lab) = Lab::new(&["a1"]) else {
        return;
    };
    let mut dp = lab.dataplane();
    let empty = load_balancer(
        external_ips(
            node_port(service("empty", "10.96.0.12", 80, &[]), 30090),
            &["192.0.2.12"],
        ),
        "192.0.2.13",
        &[],
    );
    let empty_plan = plan(vec![
        empty,
        udp(service("empty-dns", "10.96.0.13", 53, &[])),
        service("empty6", "fd00:10:96::12", 80, &[]),
    ]);
    sync(&mut dp, &empty_plan);
    for (from, to, protocol) in [
        (From("10.244.1.10", false), ("10.96.0.12", 80), TCP),
        (From(NODE_V4, true), ("10.96.0.12", 80), TCP),
        (
            From("10.244.1.10", false),
            ("10.96.0.13", 53),
            proxyplan_crds::Protocol::UDP,
        ),
        (
            From("fd00:10:244:1::10", false),
            ("fd00:10:96::12", 80),
            TCP,
        ),
        (From(EXT_V4, false), ("10.96.0.12", 80), TCP),
        (From(EXT_V4, false), (NODE_V4, 30090), TCP),
        (From(EXT_V4, false), ("192.0.2.12", 80), TCP),
        (From(EXT_V4, false), ("192.0.2.13", 80), TCP),
    ] {
        // Each is refused below, by real packets.
        assert_explained(&lab, &empty_plan, &from, to, protocol, &Showed::Refused);
    }
    assert_rejected("TCP from a pod", || lab.client("a1").tcp("10.96.0.12", 80));
    assert_rejected("TCP from the node", || {
        lab.client("node").tcp("10.96.0.12", 80)
    });
    assert_rejected("UDP from a pod", || lab.client("a1").udp("10.96.0.13", 53));
    // Measured here: the ICMPv6 port unreachable answering the first SYN does not end
    // connect() (with IPv4, or with a TCP reset, it does); the refusal comes with the
    // first retransmission, after 1 s. Still refused, not left to time out.
    assert_refused_within("IPv6 from a pod", Duration::from_millis(1900), || {
        lab.client("a1").tcp("fd00:10:96::12", 80)
    });
    let ext = lab.client("ext");
    assert_rejected("cluster IP from off the cluster", || {
        ext.tcp("10.96.0.12", 80)
    });
    assert_rejected("node port", || ext.tcp(NODE_V4, 30090));
    assert_rejected("external IP", || ext.tcp("192.0.2.12", 80));
    assert_rejected("load-balancer IP", || ext.tcp("192.0.2.13", 80));
}

/// Someone flushes and deletes every nat chain (in nftables mode: flushes the agent's
/// dispatch chain, deletes an element, deletes the table): the canary notices, the next
/// sync puts the rules back and traffic flows again.
#[test]
fn flushed_rules_are_noticed_and_restored() {
    let Some(lab) = Lab::new(&["a1", "a2"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    let mut dp = lab.dataplane();
    let plan = plan(vec![service(
        "web",
        "10.96.0.10",
        80,
        &["10.244.1.10:8080"],
    )]);
    sync(&mut dp, &plan);
    let pod = lab.client("a2").limit(Duration::from_secs(1));
    assert_eq!(pod.tcp("10.96.0.10", 80).backend(), Some("a1/8080"));
    assert!(dp.rules_intact().expect("canary"));

    if nftables() {
        // A commit to another table is not tampering.
        lab.exec("node", &["nft", "add", "table", "inet", "someone-else"]);
        assert!(dp.rules_intact().expect("canary"));
        let tamper: [&[&str]; 3] = [
            &["nft", "flush", "chain", "ip", "proxyplan", "services"],
            &[
                "nft",
                "delete",
                "element",
                "ip",
                "proxyplan",
                "service-ips",
                "{ 10.96.0.10 . tcp . 80 }",
            ],
            &["nft", "delete", "table", "ip", "proxyplan"],
        ];
        for command in tamper {
            lab.exec("node", command);
            assert_eq!(pod.tcp("10.96.0.10", 80).backend(), None, "{command:?}");
            assert!(
                !dp.rules_intact().expect("canary"),
                "{command:?} not noticed"
            );
            sync(&mut dp, &plan);
            assert!(
                dp.rules_intact().expect("canary"),
                "{command:?} not repaired"
            );
            assert_eq!(
                pod.tcp("10.96.0.10", 80).backend(),
                Some("a1/8080"),
                "{command:?}"
            );
        }
        return;
    }
    lab.exec("node", &["iptables-nft", "-t", "nat", "-F"]);
    lab.exec("node", &["iptables-nft", "-t", "nat", "-X"]);
    if ipvs() {
        // IPVS itself still serves pods; what the nat rules add (masquerade) is gone.
        assert_eq!(pod.tcp("10.96.0.10", 80).backend(), Some("a1/8080"));
    } else {
        assert_eq!(pod.tcp("10.96.0.10", 80), Outcome::TimedOut);
    }
    assert!(!dp.rules_intact().expect("canary"));
    sync(&mut dp, &plan);
    assert!(dp.rules_intact().expect("canary"));
    assert_eq!(pod.tcp("10.96.0.10", 80).backend(), Some("a1/8080"));
}

/// A port the Service does not have, on its cluster IP: kube-proxy's iptables mode
/// leaves it alone (routed on, nothing answers here), its ipvs mode refuses it (the
/// VIP is the node's own address) and its nftables mode rejects it ("Reject traffic to
/// invalid ports of ClusterIPs"); TCP to a UDP-only cluster IP is the same.
#[test]
fn unknown_port_of_a_cluster_ip() {
    let Some(lab) = Lab::new(&["a1", "a2"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    let mut dp = lab.dataplane();
    let ports_plan = plan(vec![
        service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]),
        udp(service("dns", "10.96.0.53", 53, &["10.244.1.10:5353"])),
    ]);
    sync(&mut dp, &ports_plan);
    let pod = lab.client("a2").limit(Duration::from_secs(1));
    assert_eq!(pod.tcp("10.96.0.10", 80).backend(), Some("a1/8080"));
    for (addr, port) in [("10.96.0.10", 81), ("10.96.0.53", 53)] {
        let probe = || pod.tcp(addr, port);
        // iptables mode leaves it untranslated; nothing is at a cluster IP, so it is lost.
        let showed = if ipvs() || nftables() {
            assert_rejected(&format!("{addr}:{port}"), probe);
            Showed::Refused
        } else {
            assert_dropped(&format!("{addr}:{port}"), probe);
            Showed::Untouched
        };
        let from = From("10.244.1.11", false);
        assert_explained(&lab, &ports_plan, &from, (addr, port), TCP, &showed);
    }
}

/// An address inside the cluster's ServiceCIDRs that no Service uses (here one that
/// `ext`, off the cluster, happens to answer on): kube-proxy's nftables mode drops
/// traffic to it ("Drop traffic to unallocated ClusterIPs"), in forwarding and from the
/// node itself; its iptables and ipvs modes do not look at the ServiceCIDRs and route it
/// on. Once the address is outside the plan's ServiceCIDRs, nftables mode routes it on
/// too. Both families.
#[test]
fn unallocated_address_in_the_service_cidrs() {
    let Some(lab) = Lab::new(&["a1", "a2"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    let unused = [("10.96.9.9", "32"), ("fd00:10:96::999", "128")];
    for (addr, len) in unused {
        lab.exec(
            "ext",
            &["ip", "addr", "add", &format!("{addr}/{len}"), "dev", "lo"],
        );
        lab.serve_at("ext", addr, Listener::Tcp, 80);
    }
    let mut dp = lab.dataplane();
    // One Service per family: a family without Services has no table.
    let mut plan = plan(vec![
        service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]),
        service("web6", "fd00:10:96::10", 80, &["[fd00:10:244:1::10]:8080"]),
    ]);
    plan.service_cidrs = vec!["10.96.0.0/16".to_owned(), "fd00:10:96::/112".to_owned()];
    sync(&mut dp, &plan);
    let pod = lab.client("a2").limit(Duration::from_secs(1));
    let node = lab.client("node").limit(Duration::from_secs(1));
    assert_eq!(pod.tcp("10.96.0.10", 80).backend(), Some("a1/8080"));
    for (addr, _) in unused {
        for (who, client) in [("pod", &pod), ("node", &node)] {
            let what = format!("{who} to unallocated {addr}:80");
            let showed = if nftables() {
                assert_dropped(&what, || client.tcp(addr, 80));
                Showed::Dropped
            } else {
                assert_eq!(client.tcp(addr, 80).backend(), Some("ext/80"), "{what}");
                Showed::Untouched
            };
            let from = if who == "pod" {
                From(
                    lab.pod("a2").ip(if addr.contains(':') {
                        Family::V6
                    } else {
                        Family::V4
                    }),
                    false,
                )
            } else {
                From(if addr.contains(':') { NODE_V6 } else { NODE_V4 }, true)
            };
            assert_explained(&lab, &plan, &from, (addr, 80), TCP, &showed);
        }
    }
    // Outside the ServiceCIDRs, the same addresses are the network's.
    plan.service_cidrs = vec!["10.96.0.0/24".to_owned(), "fd00:10:96::/120".to_owned()];
    sync(&mut dp, &plan);
    for (addr, _) in unused {
        assert_eq!(pod.tcp(addr, 80).backend(), Some("ext/80"), "{addr}");
    }
    assert_eq!(pod.tcp("10.96.0.10", 80).backend(), Some("a1/8080"));
}

/// A forwarded packet that conntrack finds invalid (a TCP segment with SYN and FIN set)
/// is dropped, as kube-proxy's iptables mode drops it (`--ctstate INVALID -j DROP`),
/// unless `nf_conntrack_tcp_be_liberal` is set, which leaves the rule out; a plain SYN
/// passes either way. ipvs mode, like kube-proxy's, has no such rule. (kube-proxy's
/// nftables mode has none either; ours keeps the iptables mode's, so that switching
/// from iptables to nftables mode changes nothing here.) Both families.
#[test]
fn invalid_packets_are_dropped_in_forwarding_unless_tracking_is_liberal() {
    let Some(lab) = Lab::new(&["a1"]) else {
        return;
    };
    // One Service per family: a family without Services has no rules.
    let web = plan(vec![
        service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]),
        service("web6", "fd00:10:96::10", 80, &["[fd00:10:244:1::10]:8080"]),
    ]);
    let pod = lab.client("a1");
    let probe = |drops: bool| {
        for (family, dst) in [(Family::V4, EXT_V4), (Family::V6, EXT_V6)] {
            let valid = lab.raw_listen("ext", family, 6, 9001);
            pod.tcp_segments(dst, 9001, 0x02);
            assert_eq!(valid.outcome().backend(), Some("ext/9001"), "SYN to {dst}");
            let invalid = lab.raw_listen("ext", family, 6, 9002);
            pod.tcp_segments(dst, 9002, 0x03);
            let outcome = invalid.outcome();
            if drops {
                assert_eq!(outcome, Outcome::TimedOut, "SYN+FIN to {dst}");
            } else {
                assert_eq!(outcome.backend(), Some("ext/9002"), "SYN+FIN to {dst}");
            }
        }
    };
    let mut dp = lab.dataplane();
    sync(&mut dp, &web);
    probe(!ipvs());
    lab.exec(
        "node",
        &[
            "sysctl",
            "-qw",
            "net.netfilter.nf_conntrack_tcp_be_liberal=1",
        ],
    );
    // The agent reads the sysctl when it starts.
    let mut dp = lab.dataplane();
    sync(&mut dp, &web);
    probe(false);
}

/// An SCTP Service: a pod's packets reach the endpoint with their source, an
/// off-cluster client's are masqueraded; IPv4 and IPv6.
#[test]
fn sctp_service_reaches_its_endpoint() {
    let Some(lab) = Lab::new(&["a1", "a2"]) else {
        return;
    };
    let mut dp = lab.dataplane();
    sync(
        &mut dp,
        &plan(vec![
            sctp(service("sctp", "10.96.0.100", 9999, &["10.244.1.10:9999"])),
            sctp(service(
                "sctp6",
                "fd00:10:96::100",
                9999,
                &["[fd00:10:244:1::10]:9999"],
            )),
        ]),
    );
    for (family, vip, pod_source, gw) in [
        (Family::V4, "10.96.0.100", "10.244.1.11", NODE_POD_GW_V4),
        (
            Family::V6,
            "fd00:10:96::100",
            "fd00:10:244:1::11",
            NODE_POD_GW_V6,
        ),
    ] {
        for (client, source) in [("a2", pod_source), ("ext", gw)] {
            let listener = lab.sctp_listen("a1", family, 9999);
            lab.client(client).sctp(vip, 9999);
            assert_eq!(
                listener.outcome(),
                Outcome::Served {
                    backend: "a1/9999".into(),
                    source: ip(source),
                },
                "{client} -> {vip}"
            );
        }
    }
}

/// Hairpin: a pod reaching itself through its Service is answered, and sees the node's
/// address as the source.
#[test]
fn hairpin_reaches_itself_from_the_node_address() {
    let Some(lab) = Lab::new(&["a1", "a2"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    let mut dp = lab.dataplane();
    sync(
        &mut dp,
        &plan(vec![service(
            "self",
            "10.96.0.10",
            80,
            &["10.244.1.10:8080"],
        )]),
    );
    assert_eq!(
        lab.client("a1").tcp("10.96.0.10", 80),
        Outcome::Served {
            backend: "a1/8080".into(),
            source: ip(NODE_POD_GW_V4)
        }
    );
    // Not masqueraded for another pod.
    assert_eq!(
        lab.client("a2").tcp("10.96.0.10", 80).source(),
        Some(ip("10.244.1.11"))
    );
}

/// An IPv6 Service: the cluster IP keeps a pod's address and masquerades an off-cluster
/// client; its node port works on the node's IPv6 address.
#[test]
fn ipv6_service_keeps_pod_source_and_masquerades_off_cluster_clients() {
    let Some(lab) = Lab::new(&["a1", "a2", "r1"]) else {
        return;
    };
    lab.serve("a1", Family::V6, Listener::Tcp, 8080);
    lab.serve("r1", Family::V6, Listener::Tcp, 8080);
    let mut dp = lab.dataplane();
    let web6 = node_port(
        service(
            "web6",
            "fd00:10:96::10",
            80,
            &["[fd00:10:244:1::10]:8080", "[fd00:10:244:2::10]:8080"],
        ),
        30080,
    );
    sync(&mut dp, &plan(vec![web6]));
    let want = ["a1/8080", "r1/8080"];
    let from_pod = tcp_until_all(&lab.client("a2"), "fd00:10:96::10", 80, &want);
    assert_eq!(sources(&from_pod, "a1/8080"), only("fd00:10:244:1::11"));
    assert_eq!(sources(&from_pod, "r1/8080"), only("fd00:10:244:1::11"));
    let from_ext = tcp_until_all(&lab.client("ext"), "fd00:10:96::10", 80, &want);
    assert_eq!(sources(&from_ext, "a1/8080"), only(NODE_POD_GW_V6));
    assert_eq!(sources(&from_ext, "r1/8080"), only(NODE_TO_REMOTE_V6));
    let node_port = tcp_until_all(&lab.client("ext"), NODE_V6, 30080, &want);
    assert_eq!(sources(&node_port, "a1/8080"), only(NODE_POD_GW_V6));
    assert_eq!(sources(&node_port, "r1/8080"), only(NODE_TO_REMOTE_V6));
    assert!(!sources(&from_ext, "a1/8080").contains(&ip(EXT_V6)));
    // Nothing for IPv4 was programmed.
    if nftables() {
        assert!(!lab.node_nft().contains("table ip proxyplan"));
    } else {
        assert!(
            !lab.node_rules(Backend::Nft, Family::V4)
                .contains(names::SERVICES)
        );
    }
}

/// A UDP Service reaches every endpoint; pods keep their address, off-cluster clients are
/// masqueraded.
#[test]
fn udp_service_reaches_every_endpoint() {
    let Some(lab) = Lab::new(&["a1", "a2", "r1"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Udp, 5353);
    lab.serve("r1", Family::V4, Listener::Udp, 5353);
    lab.serve("a1", Family::V6, Listener::Udp, 5353);
    lab.serve("r1", Family::V6, Listener::Udp, 5353);
    let mut dp = lab.dataplane();
    let dns = udp(service(
        "dns",
        "10.96.0.53",
        53,
        &["10.244.1.10:5353", "10.244.2.10:5353"],
    ));
    let dns6 = udp(service(
        "dns6",
        "fd00:10:96::53",
        53,
        &["[fd00:10:244:1::10]:5353", "[fd00:10:244:2::10]:5353"],
    ));
    sync(&mut dp, &plan(vec![dns, dns6]));
    let want = ["a1/5353", "r1/5353"];
    for (vip, pod, gw, remote) in [
        (
            "10.96.0.53",
            "10.244.1.11",
            NODE_POD_GW_V4,
            NODE_TO_REMOTE_V4,
        ),
        (
            "fd00:10:96::53",
            "fd00:10:244:1::11",
            NODE_POD_GW_V6,
            NODE_TO_REMOTE_V6,
        ),
    ] {
        let from_pod = until_all(&want, 40, || lab.client("a2").udp(vip, 53));
        assert_eq!(sources(&from_pod, "a1/5353"), only(pod), "{vip}");
        assert_eq!(sources(&from_pod, "r1/5353"), only(pod), "{vip}");
        let from_ext = until_all(&want, 40, || lab.client("ext").udp(vip, 53));
        assert_eq!(sources(&from_ext, "a1/5353"), only(gw), "{vip}");
        assert_eq!(sources(&from_ext, "r1/5353"), only(remote), "{vip}");
    }
}

/// Endpoints and Services added and removed one sync at a time; each change shows in the
/// traffic at once, and an established connection of an unchanged Service keeps working
/// throughout.
#[test]
fn incremental_updates_keep_an_established_connection() {
    let Some(lab) = Lab::new(&["a1", "a2", "r1"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Echo, 9000);
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    lab.serve("r1", Family::V4, Listener::Tcp, 8080);
    let chat = service("chat", "10.96.0.30", 9000, &["10.244.1.10:9000"]);
    let web = |eps: &[&str]| service("web", "10.96.0.10", 80, eps);
    let api = service("api", "10.96.0.40", 80, &["10.244.1.10:8080"]);
    let mut dp = lab.dataplane();
    sync(
        &mut dp,
        &plan(vec![chat.clone(), web(&["10.244.1.10:8080"])]),
    );
    let mut session = lab.session("a2", "10.96.0.30", 9000);
    assert_eq!(session.echo("hello 0").unwrap(), "hello 0");
    let client = lab.client("a2");

    // An endpoint added.
    let both = ["10.244.1.10:8080", "10.244.2.10:8080"];
    sync(&mut dp, &plan(vec![chat.clone(), web(&both)]));
    tcp_until_all(&client, "10.96.0.10", 80, &["a1/8080", "r1/8080"]);
    assert_eq!(session.echo("hello 1").unwrap(), "hello 1");

    // An endpoint removed.
    sync(
        &mut dp,
        &plan(vec![chat.clone(), web(&["10.244.2.10:8080"])]),
    );
    let counts = tcp_counts(&client, "10.96.0.10", 80, 10);
    assert_eq!(counts, BTreeMap::from([("r1/8080".to_owned(), 10)]));
    assert_eq!(session.echo("hello 2").unwrap(), "hello 2");

    // A Service added.
    let three = vec![chat.clone(), web(&["10.244.2.10:8080"]), api];
    sync(&mut dp, &plan(three));
    assert_eq!(client.tcp("10.96.0.40", 80).backend(), Some("a1/8080"));
    assert_eq!(session.echo("hello 3").unwrap(), "hello 3");

    // A Service removed: its address is no longer captured.
    sync(&mut dp, &plan(vec![chat, web(&["10.244.2.10:8080"])]));
    assert_dropped("removed Service", || {
        lab.client("a2")
            .limit(Duration::from_secs(1))
            .tcp("10.96.0.40", 80)
    });
    assert_eq!(client.tcp("10.96.0.10", 80).backend(), Some("r1/8080"));
    assert_eq!(session.echo("hello 4").unwrap(), "hello 4");
}

/// Restarting the agent (a new dataplane syncing the same plan on the same node) sends
/// nothing to the kernel and fails no connection, new or established.
#[test]
fn agent_restart_interrupts_no_connection() {
    let Some(lab) = Lab::new(&["a1", "a2", "r1"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Echo, 9000);
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    lab.serve("r1", Family::V4, Listener::Tcp, 8080);
    let entries = vec![
        service("chat", "10.96.0.30", 9000, &["10.244.1.10:9000"]),
        node_port(
            service(
                "web",
                "10.96.0.10",
                80,
                &["10.244.1.10:8080", "10.244.2.10:8080"],
            ),
            30080,
        ),
        udp(service("dns", "10.96.0.53", 53, &[])),
    ];
    let plan = plan(entries);
    sync(&mut lab.dataplane(), &plan);
    let mut session = lab.session("a2", "10.96.0.30", 9000);
    assert_eq!(session.echo("before").unwrap(), "before");

    let stop = AtomicBool::new(false);
    let (made, failed) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let (pod, ext) = (lab.client("a2"), lab.client("ext"));
            while !stop.load(Ordering::Relaxed) {
                for outcome in [pod.tcp("10.96.0.10", 80), ext.tcp(NODE_V4, 30080)] {
                    made.fetch_add(1, Ordering::Relaxed);
                    if outcome.backend().is_none() {
                        eprintln!("failed during restarts: {outcome:?}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        for restart in 0..4 {
            std::thread::sleep(Duration::from_millis(300));
            let mut agent = lab.dataplane();
            let report = agent.sync(&plan, false).expect("sync after restart");
            assert_eq!(report.payload, "", "restart {restart} changed the kernel");
            assert_eq!(report.conntrack_deleted, 0);
        }
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
    });
    let (made, failed) = (made.into_inner(), failed.into_inner());
    println!("{made} connections during 4 restarts, {failed} failed");
    assert!(made >= 8, "only {made} connections made");
    assert_eq!(failed, 0);
    assert_eq!(session.echo("after").unwrap(), "after");
}

/// Stale UDP conntrack: a flow keeps its 5-tuple (fixed source port) and still reaches
/// the new endpoint right after its endpoint changed, and a Service that appears is
/// reached by a flow that had been sending to its address before.
#[test]
fn udp_flows_follow_endpoint_changes_at_once() {
    let Some(lab) = Lab::new(&["a1", "a2"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Udp, 5353);
    lab.serve("a2", Family::V4, Listener::Udp, 5353);
    let dns = |eps: &[&str]| udp(service("dns", "10.96.0.53", 53, eps));
    let late = udp(service("late", "10.96.0.54", 53, &["10.244.1.10:5353"]));
    let mut dp = lab.dataplane();
    let flow = lab.client("ext").source_port(40000);
    let early = || lab.client("ext").source_port(40001);

    sync(&mut dp, &plan(vec![dns(&["10.244.1.10:5353"])]));
    assert_eq!(flow.udp("10.96.0.53", 53).backend(), Some("a1/5353"));
    // Before `late` exists its address is routed away: that flow gets a conntrack entry
    // without DNAT.
    assert_dropped("address of a Service not created yet", || {
        early()
            .limit(Duration::from_millis(500))
            .udp("10.96.0.54", 53)
    });

    // The endpoint moves (the old backend still answers, so a stale entry would show).
    let report = dp
        .sync(&plan(vec![dns(&["10.244.1.11:5353"]), late]), false)
        .expect("sync");
    // In ipvs mode IPVS may drop the moved flow's entry itself when it deletes the UDP
    // real server (net.ipv4.vs.conntrack=1), before the agent gets to it.
    let least = if ipvs() { 1 } else { 2 };
    assert!(report.conntrack_deleted >= least, "{report:?}");
    // The same count, by family, for kube-proxy's conntrack reconciler metrics.
    let run = report.conntrack.expect("the conntrack step ran");
    assert_eq!(run.deleted, [report.conntrack_deleted, 0], "{report:?}");
    assert_eq!(flow.udp("10.96.0.53", 53).backend(), Some("a2/5353"));
    assert_eq!(early().udp("10.96.0.54", 53).backend(), Some("a1/5353"));
}

/// kube-proxy's conntrack clean-up keeps UDP flows to endpoints that still serve: a pod
/// that starts terminating (it leaves the list new flows go to, and stays serving) keeps
/// its live flow; once it stops serving, the flow moves to a serving endpoint.
#[test]
fn udp_flows_to_a_terminating_endpoint_last_until_it_stops_serving() {
    let Some(lab) = Lab::new(&["a1", "a2"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Udp, 5353);
    lab.serve("a2", Family::V4, Listener::Udp, 5353);
    let dns = |eps: &[&str], also: &[&str]| {
        let mut entry = udp(service("dns", "10.96.0.53", 53, eps));
        entry.also_serving = also
            .iter()
            .map(|e| {
                let (ip, port) = e.split_once(':').expect("ip:port");
                proxyplan_crds::Endpoint {
                    ip: ip.into(),
                    port: port.parse().expect("port"),
                }
            })
            .collect();
        entry
    };
    let mut dp = lab.dataplane();
    let flow = lab.client("ext").source_port(40010);
    sync(&mut dp, &plan(vec![dns(&["10.244.1.10:5353"], &[])]));
    assert_eq!(flow.udp("10.96.0.53", 53).backend(), Some("a1/5353"));

    // a1 terminates, a2 is ready: new flows go to a2, the live one stays on a1.
    let report = dp
        .sync(
            &plan(vec![dns(&["10.244.1.11:5353"], &["10.244.1.10:5353"])]),
            false,
        )
        .expect("sync");
    assert_eq!(report.conntrack_deleted, 0, "{report:?}");
    // In ipvs mode, as in kube-proxy's, a UDP real server that leaves the list is deleted
    // at once (no graceful termination for UDP), and IPVS expires its connections
    // (net.ipv4.vs.expire_nodest_conn=1): the live flow moves with the first datagram.
    let live = if ipvs() { "a2/5353" } else { "a1/5353" };
    assert_eq!(flow.udp("10.96.0.53", 53).backend(), Some(live));
    assert_eq!(
        lab.client("ext")
            .source_port(40011)
            .udp("10.96.0.53", 53)
            .backend(),
        Some("a2/5353")
    );

    // a1 no longer serves: its flow is cut and the next datagram reaches a2.
    let report = dp
        .sync(&plan(vec![dns(&["10.244.1.11:5353"], &[])]), false)
        .expect("sync");
    if !ipvs() {
        assert!(report.conntrack_deleted >= 1, "{report:?}");
    }
    assert_eq!(flow.udp("10.96.0.53", 53).backend(), Some("a2/5353"));
}

/// Cleanup leaves both families' `iptables-save` as they were before the agent came,
/// other programs' rules included, and the Services stop being captured.
#[test]
fn cleanup_leaves_iptables_as_before() {
    let Some(lab) = Lab::new(&["a1", "a2"]) else {
        return;
    };
    for (iptables, other) in [
        ("iptables-nft", "10.99.0.0/16"),
        ("ip6tables-nft", "fd99::/64"),
    ] {
        for rule in [
            format!("-t nat -A PREROUTING -d {other} -j RETURN"),
            format!("-t nat -A POSTROUTING -s {other} -j MASQUERADE"),
            "-A INPUT -p tcp --dport 22 -j ACCEPT".to_owned(),
            format!("-A FORWARD -s {other} -j DROP"),
        ] {
            let mut argv = vec![iptables];
            argv.extend(rule.split_whitespace());
            lab.exec("node", &argv);
        }
    }
    let before = [Family::V4, Family::V6].map(|f| lab.node_rules(Backend::Nft, f));
    // Other programs' nf_tables tables, kube-proxy's among them.
    for command in [
        "add table ip kube-proxy",
        "add chain ip kube-proxy services",
        "add rule ip kube-proxy services ip daddr 10.96.0.10 counter",
        "add table inet firewall",
        "add chain inet firewall input { type filter hook input priority 0; }",
        "add rule inet firewall input tcp dport 22 accept",
    ] {
        let mut argv = vec!["nft"];
        argv.extend(command.split_whitespace());
        lab.exec("node", &argv);
    }
    let nft_before = lab.node_nft();
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    lab.serve("a1", Family::V6, Listener::Tcp, 8080);
    let mut dp = lab.dataplane();
    sync(
        &mut dp,
        &plan(vec![
            node_port(
                service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]),
                30080,
            ),
            service("web6", "fd00:10:96::10", 80, &["[fd00:10:244:1::10]:8080"]),
            affinity(
                service("sticky", "10.96.0.60", 80, &["10.244.1.10:8080"]),
                60,
            ),
            udp(service("dns", "10.96.0.53", 53, &[])),
        ]),
    );
    let pod = lab.client("a2");
    assert_eq!(pod.tcp("10.96.0.10", 80).backend(), Some("a1/8080"));
    assert_eq!(pod.tcp("fd00:10:96::10", 80).backend(), Some("a1/8080"));
    assert_eq!(pod.tcp("10.96.0.60", 80).backend(), Some("a1/8080"));
    assert_eq!(
        lab.client("ext").tcp(NODE_V4, 30080).backend(),
        Some("a1/8080")
    );

    dp.cleanup().expect("cleanup");
    let after = [Family::V4, Family::V6].map(|f| lab.node_rules(Backend::Nft, f));
    assert_eq!(after[0], before[0], "IPv4 rules after cleanup");
    assert_eq!(after[1], before[1], "IPv6 rules after cleanup");
    if nftables() {
        // (iptables-nft leaves the empty base chains it created: iptables-save shows
        // no difference, `nft list` does.)
        assert_eq!(lab.node_nft(), nft_before, "nf_tables after cleanup");
    }
    assert_dropped("cluster IP after cleanup", || {
        pod.limit(Duration::from_secs(1)).tcp("10.96.0.10", 80)
    });
}

/// The legacy back end carries the same traffic (cluster IP from a pod, node port from
/// off the cluster), where it works in a namespace.
#[test]
fn legacy_backend_carries_traffic() {
    let Some(lab) = Lab::new(&["a1", "a2"]) else {
        return;
    };
    let ns = lab.ns("node");
    let works = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, "iptables-legacy", "-t", "nat", "-S"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !works {
        println!("SKIPPED: iptables-legacy does not work in a network namespace here");
        return;
    }
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    let mut dp = lab.dataplane_with(Backend::Legacy);
    let web = node_port(
        service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]),
        30080,
    );
    sync(&mut dp, &plan(vec![web]));
    assert_eq!(
        lab.client("a2").tcp("10.96.0.10", 80).source(),
        Some(ip("10.244.1.11"))
    );
    assert_eq!(
        lab.client("ext").tcp(NODE_V4, 30080),
        Outcome::Served {
            backend: "a1/8080".into(),
            source: ip(NODE_POD_GW_V4)
        }
    );
    dp.cleanup().expect("cleanup");
    assert!(
        !lab.node_rules(Backend::Legacy, Family::V4)
            .contains("PROXYPLAN")
    );
}
