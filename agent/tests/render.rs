//! Renderer tables: plans in, rules out. Golden files pin the exact rules; the packet
//! tracer checks what the rules *do* on the shared flow table (`flows/mod.rs`), the same
//! table the kernel tests send real traffic through.
//!
//! `UPDATE_GOLDEN=1 cargo test -p proxyplan-agent --test render` rewrites the golden files.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod flows;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;

use flows::{Expect, Flow, Node, Origin, PortBuilder, merged, port};
use proxyplan_agent::modes::iptables::trace::{Packet, TraceResult, Tracer, Verdict};
use proxyplan_agent::modes::iptables::{RenderSettings, render};
use proxyplan_agent::ruleset::FamilyRules;
use proxyplan_crds::{EmptyAction, LoadBalancerIpMode, MergedPlan, Protocol};

// ----- golden files -----

fn golden_path(name: &str, family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.{family}.txt"))
}

/// Compares both families' `iptables-restore` dumps with `tests/golden/<name>.v4.txt`
/// and `.v6.txt` (absent when the family has no rules); writes them with
/// `UPDATE_GOLDEN=1`.
fn golden(name: &str, plan: &MergedPlan) {
    let rules = render(plan, &RenderSettings::default());
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    for (family, dump) in [("v4", rules.v4.dump()), ("v6", rules.v6.dump())] {
        let path = golden_path(name, family);
        if update {
            if dump.is_empty() {
                if path.exists() {
                    std::fs::remove_file(&path).unwrap();
                }
            } else {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &dump).unwrap();
            }
            continue;
        }
        if dump.is_empty() {
            assert!(
                !path.exists(),
                "{name}: no {family} rules, but {} exists (UPDATE_GOLDEN=1 removes it)",
                path.display()
            );
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run with UPDATE_GOLDEN=1 to create it",
                path.display()
            )
        });
        if want != dump {
            let first = want
                .lines()
                .zip(dump.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| want.lines().count().min(dump.lines().count()));
            panic!(
                "{name} {family}: rules differ from {} at line {}:\n  golden:   {}\n  rendered: {}\n\
                 full rendering:\n{dump}\n(UPDATE_GOLDEN=1 rewrites the file; review the diff)",
                path.display(),
                first + 1,
                want.lines().nth(first).unwrap_or("<end>"),
                dump.lines().nth(first).unwrap_or("<end>"),
            );
        }
    }
}

#[test]
fn golden_cluster_ip() {
    let web = port("web", "10.96.0.10", 80).endpoints(&["10.244.1.10:8080", "10.244.2.10:8080"]);
    golden("cluster_ip", &merged(Node::A, vec![web]));
}

#[test]
fn golden_masquerade_all() {
    let web = port("web", "10.96.0.10", 80)
        .endpoints(&["10.244.1.10:8080"])
        .masquerade_all();
    golden("masquerade_all", &merged(Node::A, vec![web]));
}

#[test]
fn golden_node_port() {
    let svc = port("nodeport", "10.96.0.20", 80)
        .endpoints(&["10.244.1.20:8080", "10.244.2.20:8080"])
        .node_port(30080);
    golden("node_port", &merged(Node::A, vec![svc]));
}

fn local_lb(local: &[&str]) -> proxyplan_crds::ServicePortPlan {
    port("local-lb", "10.96.0.30", 80)
        .endpoints(&["10.244.1.30:8080", "10.244.2.30:8080"])
        .node_port(30090)
        .load_balancer("203.0.113.30", LoadBalancerIpMode::VIP)
        .external_local(32090, local)
}

#[test]
fn golden_lb_local_with_health_check() {
    golden(
        "lb_local",
        &merged(Node::A, vec![local_lb(&["10.244.1.30:8080"])]),
    );
}

#[test]
fn golden_lb_local_without_local_endpoints() {
    golden(
        "lb_local_no_local_endpoints",
        &merged(Node::B, vec![local_lb(&[])]),
    );
}

#[test]
fn golden_lb_source_ranges() {
    let svc = port("lb-ranges", "10.96.0.40", 80)
        .endpoints(&["10.244.1.40:8080"])
        .node_port(30100)
        .load_balancer("203.0.113.40", LoadBalancerIpMode::VIP)
        .load_balancer("203.0.113.41", LoadBalancerIpMode::Proxy)
        .source_ranges(&["198.51.100.0/24", "192.168.10.0/24"]);
    golden("lb_source_ranges", &merged(Node::A, vec![svc]));
}

#[test]
fn golden_external_ips() {
    let svc = port("ext-ip", "10.96.0.50", 80)
        .endpoints(&["10.244.2.50:8080"])
        .external_ips(&["192.0.2.50", "192.0.2.51"]);
    golden("external_ips", &merged(Node::A, vec![svc]));
}

#[test]
fn golden_internal_local() {
    let svc = port("itp-local", "10.96.0.70", 80)
        .internal_local(&["10.244.1.70:8080"], EmptyAction::Drop);
    let none = port("itp-none", "10.96.0.71", 80).internal_local(&[], EmptyAction::Drop);
    golden("internal_local", &merged(Node::A, vec![svc, none]));
}

#[test]
fn golden_affinity() {
    let svc = port("sticky", "10.96.0.90", 80)
        .endpoints(&["10.244.1.90:8080", "10.244.2.90:8080", "10.244.2.91:8080"])
        .affinity(10800);
    golden("affinity", &merged(Node::A, vec![svc]));
}

#[test]
fn golden_no_endpoints() {
    let cluster_ip = port("empty", "10.96.0.80", 80);
    let everything = port("empty-lb", "10.96.0.81", 80)
        .node_port(30181)
        .external_ips(&["192.0.2.81"])
        .load_balancer("203.0.113.81", LoadBalancerIpMode::VIP);
    golden(
        "no_endpoints",
        &merged(Node::A, vec![cluster_ip, everything]),
    );
}

#[test]
fn golden_dual_stack() {
    let v4 = port("web", "10.96.0.10", 80)
        .endpoints(&["10.244.1.10:8080"])
        .node_port(30080);
    let v6 = port("web", "fd00:10:96::10", 80)
        .endpoints(&["[fd00:10:244:1::10]:8080", "[fd00:10:244:2::10]:8080"])
        .node_port(30080);
    golden("dual_stack", &merged(Node::A, vec![v4, v6]));
}

#[test]
fn golden_udp() {
    let svc = port("dns", "10.96.0.53", 53)
        .protocol(Protocol::UDP)
        .endpoints(&["10.244.1.53:53", "10.244.2.53:53"]);
    golden("udp", &merged(Node::A, vec![svc]));
}

#[test]
fn golden_sctp() {
    let svc = port("sctp", "10.96.0.100", 9999)
        .protocol(Protocol::SCTP)
        .endpoints(&["10.244.2.100:9999"])
        .node_port(30999);
    golden("sctp", &merged(Node::A, vec![svc]));
}

// ----- packet flows -----

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn rules_for(plan: &MergedPlan, dest: IpAddr) -> FamilyRules {
    let rules = render(plan, &RenderSettings::default());
    if dest.is_ipv6() { rules.v6 } else { rules.v4 }
}

fn packet(flow: &Flow) -> Packet {
    let packet = Packet::new(ip(flow.source), ip(flow.dest), flow.protocol, flow.port);
    match flow.from {
        Origin::Host => packet.host_originated(),
        Origin::Pod | Origin::OffCluster => packet,
    }
}

/// Traces `flow` on its node's fixture plan.
fn trace_flow(flow: &Flow) -> TraceResult {
    let plan = flows::plan(flow.node);
    let rules = rules_for(&plan, ip(flow.dest));
    Tracer::new(&rules, &flow.node.local_addresses())
        .unwrap()
        .trace(&packet(flow))
        .unwrap()
}

/// Whether `result` is what `expect` says; every path must agree.
fn matches(expect: &Expect, result: &TraceResult) -> bool {
    if !result.is_uniform() {
        return false;
    }
    match *expect {
        Expect::Endpoints {
            endpoints,
            masquerade,
        } => {
            let want: BTreeSet<String> = endpoints.iter().map(|e| (*e).to_owned()).collect();
            result.verdict == Verdict::Accept
                && result.endpoints == want
                && result.masquerade == masquerade
                && result.paths.iter().all(|p| p.endpoint.is_some())
        }
        Expect::Reject => result.verdict == Verdict::Reject,
        Expect::Drop => result.verdict == Verdict::Drop,
        Expect::NotProxied => {
            result.verdict == Verdict::Accept && result.endpoints.is_empty() && !result.masquerade
        }
    }
}

/// Runs `flows` and fails with every mismatch, like kube-proxy's `runPacketFlowTests`.
/// `known_bugs` selects the flows marked with a known renderer bug instead of the others.
fn run_flows<'a>(flows: impl IntoIterator<Item = &'a Flow>, known_bugs: bool) {
    let mut failures = String::new();
    let mut ran = 0;
    for flow in flows {
        if flow.known_bug.is_some() != known_bugs {
            continue;
        }
        ran += 1;
        let result = trace_flow(flow);
        if !matches(&flow.expect, &result) {
            writeln!(
                failures,
                "\n{} ({}, {:?} {} -> {}:{} {}):\n  expected {:?}\n  got {result}",
                flow.name,
                flow.node.name(),
                flow.from,
                flow.source,
                flow.dest,
                flow.port,
                flow.protocol,
                flow.expect,
            )
            .unwrap();
            if let Some(bug) = flow.known_bug {
                writeln!(failures, "  known bug: {bug}").unwrap();
            }
        }
    }
    assert!(ran > 0, "no flows selected");
    assert!(failures.is_empty(), "flows failed:{failures}");
}

#[test]
fn flows_cluster_ip() {
    run_flows(flows::CLUSTER_IP, false);
}

#[test]
fn flows_node_port() {
    run_flows(flows::NODE_PORT, false);
}

#[test]
fn flows_external_local() {
    run_flows(flows::EXTERNAL_LOCAL, false);
}

#[test]
fn flows_lb_source_ranges() {
    run_flows(flows::LB_SOURCE_RANGES, false);
}

#[test]
fn flows_external_addresses() {
    run_flows(flows::EXTERNAL_ADDRESSES, false);
}

#[test]
fn flows_internal_local() {
    run_flows(flows::INTERNAL_LOCAL, false);
}

#[test]
fn flows_no_endpoints() {
    run_flows(flows::NO_ENDPOINTS, false);
}

#[test]
fn flows_affinity() {
    run_flows(flows::AFFINITY, false);
}

#[test]
fn flows_ipv6() {
    run_flows(flows::IPV6, false);
}

#[test]
fn flows_protocols() {
    run_flows(flows::PROTOCOLS, false);
}

/// The flows marked `known_bug`, expected to pass once the renderer is fixed.
#[test]
fn flow_names_are_unique_and_sources_fit_their_origin() {
    let mut names = BTreeSet::new();
    for flow in flows::all() {
        assert!(names.insert(flow.name), "duplicate flow name {}", flow.name);
        let source = ip(flow.source);
        let on_node = flow.node.local_addresses().contains(&source);
        let in_cluster = flows::CLUSTER_CIDRS
            .iter()
            .any(|c| cidr_contains(c, source));
        let fits = match flow.from {
            Origin::Host => on_node || source.is_loopback(),
            Origin::Pod => in_cluster,
            Origin::OffCluster => !on_node && !in_cluster,
        };
        assert!(
            fits,
            "{}: source {source} is not {:?}",
            flow.name, flow.from
        );
    }
}

fn cidr_contains(cidr: &str, ip: IpAddr) -> bool {
    let (net, len) = cidr.split_once('/').unwrap();
    let len: u32 = len.parse().unwrap();
    match (net.parse::<IpAddr>().unwrap(), ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

// ----- behaviours beyond one flow -----

#[test]
fn every_rule_of_the_fixture_is_understood_by_the_tracer() {
    for node in [Node::A, Node::B] {
        let rules = render(&flows::plan(node), &RenderSettings::default());
        for family in [&rules.v4, &rules.v6] {
            assert!(family.rule_count() > 0);
            Tracer::new(family, &node.local_addresses()).unwrap();
        }
    }
}

#[test]
fn affinity_sends_a_returning_client_to_the_same_endpoint() {
    let flow = &flows::AFFINITY[0];
    let first = trace_flow(flow);
    assert_eq!(first.paths.len(), 2, "{first}");
    let plan = flows::plan(flow.node);
    let tracer = Tracer::new(&rules_for(&plan, ip(flow.dest)), &[]).unwrap();
    for path in &first.paths {
        // The first connection records the client in the chosen endpoint's list...
        assert_eq!(path.recent_set.len(), 1, "{first}");
        let list = path.recent_set.first().unwrap();
        // ...and the next one from the same client goes there, and only there.
        let again = tracer.trace(&packet(flow).with_recent(list)).unwrap();
        assert_eq!(
            again.endpoints,
            BTreeSet::from([path.endpoint.clone().unwrap()]),
            "{again}"
        );
        assert!(again.paths.iter().all(|p| {
            p.rules
                .iter()
                .any(|r| r.contains("--rcheck --seconds 10800"))
        }));
    }
}

#[test]
fn hairpin_masquerades_only_the_way_back_to_the_client() {
    let flow = Flow {
        name: "endpoint of web to web",
        source: "10.244.1.10",
        ..flows::CLUSTER_IP[0]
    };
    let result = trace_flow(&flow);
    assert_eq!(result.endpoints.len(), 3, "{result}");
    assert_eq!(
        result.masquerade_to("10.244.1.10:8080"),
        Some(true),
        "{result}"
    );
    assert_eq!(
        result.masquerade_to("10.244.2.10:8080"),
        Some(false),
        "{result}"
    );
    assert_eq!(
        result.masquerade_to("10.244.2.11:8080"),
        Some(false),
        "{result}"
    );
}

#[test]
fn balancing_gives_every_endpoint_an_equal_share() {
    // The probabilities 1/n, 1/(n-1), ..., 1 of the statistic rules.
    let plan = flows::plan(Node::A);
    let rules = rules_for(&plan, ip("10.96.0.10"));
    let probabilities: Vec<f64> = rules
        .nat
        .chains
        .values()
        .flatten()
        .filter(|r| r.contains("demo/web:http/TCP/IPv4 ->"))
        .map(|r| {
            r.split_once("--probability ").map_or(1.0, |(_, p)| {
                p.split_whitespace().next().unwrap().parse().unwrap()
            })
        })
        .collect();
    assert_eq!(probabilities.len(), 3);
    let mut left = 1.0;
    for p in probabilities {
        let share = left * p;
        assert!((share - 1.0 / 3.0).abs() < 1e-9, "{share}");
        left -= share;
    }
}

/// Without local-traffic detection (no cluster CIDR given to the controller), the planner
/// masquerades no ClusterIP traffic and the rules cannot short-circuit pod traffic.
#[test]
fn without_local_detection_cluster_ip_traffic_keeps_its_source() {
    let mut plan = flows::plan(Node::B);
    plan.local_traffic.cidrs.clear();
    for entry in &mut plan.service_ports {
        std::sync::Arc::make_mut(entry)
            .masquerade
            .off_cluster_to_cluster_ip = false;
    }
    let rules = render(&plan, &RenderSettings::default());
    let tracer = Tracer::new(&rules.v4, &Node::B.local_addresses()).unwrap();
    let tcp = |s: &str, d: &str, p: u16| Packet::new(ip(s), ip(d), Protocol::TCP, p);
    let off_cluster = tracer
        .trace(&tcp("192.168.10.100", "10.96.0.10", 80))
        .unwrap();
    assert_eq!(off_cluster.endpoints.len(), 3, "{off_cluster}");
    assert!(!off_cluster.masquerade, "{off_cluster}");
    // A pod on a node without local endpoints of a Local-policy LB: no short-circuit.
    let pod = tracer
        .trace(&tcp("10.244.2.5", "203.0.113.30", 80))
        .unwrap();
    assert_eq!(pod.verdict, Verdict::Drop, "{pod}");
    // The host is still recognised by address type.
    let host = tracer
        .trace(&tcp("192.168.10.2", "203.0.113.30", 80).host_originated())
        .unwrap();
    assert!(host.masquerade && host.endpoints.len() == 2, "{host}");
}

/// When the LB IP is a node address (cloud providers often route it so), traffic from
/// outside the ranges meets filter INPUT, which does drop it.
#[test]
fn source_ranges_drop_on_input_when_the_lb_ip_is_local() {
    let plan = flows::plan(Node::A);
    let rules = render(&plan, &RenderSettings::default());
    let mut local = Node::A.local_addresses();
    local.push(ip("203.0.113.40"));
    let tracer = Tracer::new(&rules.v4, &local).unwrap();
    let tcp = |s: &str| Packet::new(ip(s), ip("203.0.113.40"), Protocol::TCP, 80);
    let denied = tracer.trace(&tcp("192.168.10.100")).unwrap();
    assert_eq!(denied.verdict, Verdict::Drop, "{denied}");
    let allowed = tracer.trace(&tcp("198.51.100.7")).unwrap();
    assert_eq!(allowed.endpoints.len(), 2, "{allowed}");
}

/// A source range covering the node lets the node reach its LB VIP, also with the VIP as
/// source (the VIP routed locally).
#[test]
fn source_range_covering_the_node_admits_the_node() {
    let svc = port("lb-ranges", "10.96.0.40", 80)
        .endpoints(&["10.244.1.40:8080"])
        .load_balancer("203.0.113.40", LoadBalancerIpMode::VIP)
        .source_ranges(&["192.168.10.0/24"]);
    let rules = render(&merged(Node::A, vec![svc]), &RenderSettings::default());
    let mut local = Node::A.local_addresses();
    local.push(ip("203.0.113.40"));
    let tracer = Tracer::new(&rules.v4, &local).unwrap();
    for source in ["192.168.10.1", "203.0.113.40"] {
        let packet = Packet::new(ip(source), ip("203.0.113.40"), Protocol::TCP, 80);
        let result = tracer.trace(&packet.host_originated()).unwrap();
        assert_eq!(
            result.endpoints,
            BTreeSet::from(["10.244.1.40:8080".to_owned()]),
            "{source}: {result}"
        );
        assert!(result.masquerade, "{result}");
    }
}

/// Every address in a family's rules is of that family, and an IPv4-only plan needs no
/// ip6tables at all.
#[test]
fn each_family_holds_only_its_own_addresses() {
    let rules = render(&flows::plan(Node::A), &RenderSettings::default());
    for (v6, dump) in [(false, rules.v4.dump()), (true, rules.v6.dump())] {
        assert!(!dump.is_empty());
        let mut addresses = 0;
        for line in dump.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            for pair in words.windows(2) {
                if !["-s", "-d", "--to-destination"].contains(&pair[0]) {
                    continue;
                }
                let text = pair[1];
                let address = if pair[0] == "--to-destination" {
                    text.parse::<std::net::SocketAddr>().unwrap().ip()
                } else {
                    text.split('/').next().unwrap().parse::<IpAddr>().unwrap()
                };
                assert_eq!(address.is_ipv6(), v6, "{line}");
                addresses += 1;
            }
        }
        assert!(addresses > 0);
    }
    let v4_only = merged(
        Node::A,
        vec![port("web", "10.96.0.10", 80).endpoints(&["10.244.1.10:8080"])],
    );
    let rules = render(&v4_only, &RenderSettings::default());
    assert_eq!(rules.v6, FamilyRules::default());
}

/// An IPv6 packet meets only IPv6 entries: the IPv4-only Services of the fixture do not
/// exist for it.
#[test]
fn ipv6_rules_know_only_ipv6_services() {
    let rules = render(&flows::plan(Node::A), &RenderSettings::default());
    let tracer = Tracer::new(&rules.v6, &Node::A.local_addresses()).unwrap();
    // node port 30090 is IPv4-only (local-lb); 30080 exists in both families.
    let to_node = |p| {
        Packet::new(
            ip("fd00:192:168:10::100"),
            ip("fd00:192:168:10::1"),
            Protocol::TCP,
            p,
        )
    };
    let only_v4 = tracer.trace(&to_node(30090)).unwrap();
    assert!(
        only_v4.endpoints.is_empty() && only_v4.verdict == Verdict::Accept,
        "{only_v4}"
    );
    let both = tracer.trace(&to_node(30080)).unwrap();
    assert_eq!(
        both.endpoints,
        BTreeSet::from(["[fd00:10:244:2::20]:8080".to_owned()])
    );
}
