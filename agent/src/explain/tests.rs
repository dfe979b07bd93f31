//! The plan side of `explain`, one broken (and one working) example per reason.

use std::net::IpAddr;
use std::sync::Arc;

use proxyplan_crds::{
    EmptyAction, Endpoint, IpFamily, LoadBalancerIp, LoadBalancerIpMode, LocalTrafficDetection,
    LocalTrafficMode, MasqueradePlan, MergedPlan, Protocol, ServicePortPlan, SessionAffinity,
    TrafficPlan, TrafficPolicy,
};

use super::{Flow, MatchedAs, Verdict, explain, human};

const NODE_IP: &str = "192.168.0.1";
const POD: &str = "10.244.1.5";
const OUTSIDE: &str = "203.0.113.9";

fn ep(text: &str) -> Endpoint {
    let (ip, port) = text.split_once(':').unwrap();
    Endpoint {
        ip: ip.into(),
        port: port.parse().unwrap(),
    }
}

fn traffic(policy: TrafficPolicy, when_empty: EmptyAction) -> TrafficPlan {
    TrafficPlan { policy, when_empty }
}

fn web(endpoints: &[&str]) -> ServicePortPlan {
    ServicePortPlan {
        key: "default/web:http/TCP/IPv4".into(),
        namespace: "default".into(),
        name: "web".into(),
        port_name: "http".into(),
        family: IpFamily::IPv4,
        protocol: Protocol::TCP,
        port: 80,
        cluster_ip: "10.96.0.10".into(),
        external_ips: vec![],
        load_balancer_ips: vec![],
        node_port: None,
        load_balancer_source_ranges: vec![],
        health_check_node_port: None,
        session_affinity: None,
        internal: traffic(TrafficPolicy::Cluster, EmptyAction::Reject),
        external: None,
        cluster_endpoints: endpoints.iter().map(|e| ep(e)).collect(),
        zone_endpoints: Vec::new(),
        local_endpoints: vec![],
        masquerade: MasqueradePlan {
            all: false,
            off_cluster_to_cluster_ip: true,
            external: false,
            local_host_to_external: false,
            hairpin: true,
        },
        local_terminating: false,
        also_serving: Vec::new(),
    }
}

/// `web` as a LoadBalancer Service: node port 30080, VIP 198.51.100.1, `policy` outside.
fn public(policy: TrafficPolicy, endpoints: &[&str], local: &[&str]) -> ServicePortPlan {
    let mut e = web(endpoints);
    e.node_port = Some(30080);
    e.load_balancer_ips = vec![LoadBalancerIp {
        ip: "198.51.100.1".into(),
        mode: LoadBalancerIpMode::VIP,
    }];
    e.external = Some(traffic(
        policy,
        if policy == TrafficPolicy::Local && !endpoints.is_empty() {
            EmptyAction::Drop
        } else {
            EmptyAction::Reject
        },
    ));
    e.local_endpoints = local.iter().map(|l| ep(l)).collect();
    e.masquerade.external = policy == TrafficPolicy::Cluster;
    e.masquerade.local_host_to_external = policy == TrafficPolicy::Local;
    e
}

fn plan(entries: Vec<ServicePortPlan>) -> MergedPlan {
    MergedPlan {
        node_name: "node-a".into(),
        revision: "r1".into(),
        services_fingerprint: 0,
        addresses: vec![NODE_IP.parse().unwrap()],
        local_traffic: LocalTrafficDetection {
            mode: LocalTrafficMode::ClusterCIDR,
            cidrs: vec!["10.244.0.0/16".into()],
            interface: None,
        },
        service_cidrs: vec!["10.96.0.0/16".into()],
        service_ports: entries.into_iter().map(Arc::new).collect(),
        refused: vec![],
        unmatched: vec![],
    }
}

fn flow(source: &str, destination: &str, port: u16) -> Flow {
    Flow {
        source: source.parse::<IpAddr>().unwrap(),
        destination: destination.parse().unwrap(),
        port,
        protocol: Protocol::TCP,
        from_host: false,
        interface: None,
    }
}

fn endpoints(verdict: &Verdict) -> Vec<(String, bool)> {
    match verdict {
        Verdict::Dnat { endpoints, .. } => endpoints
            .iter()
            .map(|r| (r.endpoint.clone(), r.masquerade))
            .collect(),
        other => panic!("not a DNAT: {other:?}"),
    }
}

#[test]
fn a_pod_to_a_cluster_ip_reaches_every_endpoint_with_its_source_kept() {
    let p = plan(vec![web(&["10.244.2.1:8080", "10.244.3.1:8080"])]);
    let x = explain(&p, &flow(POD, "10.96.0.10", 80), "nftables");
    let service = x.service.clone().unwrap();
    assert_eq!(service.matched_as, MatchedAs::ClusterIp);
    assert_eq!(
        (service.namespace.as_str(), service.name.as_str()),
        ("default", "web")
    );
    assert_eq!(
        endpoints(&x.verdict),
        [
            ("10.244.2.1:8080".to_owned(), false),
            ("10.244.3.1:8080".to_owned(), false)
        ]
    );
    let Verdict::Dnat {
        endpoints: reach, ..
    } = &x.verdict
    else {
        unreachable!()
    };
    assert!(reach.iter().all(|r| (r.probability - 0.5).abs() < 1e-9));
    assert!(x.masquerade_reasons.is_empty());
    let text = human(&x);
    assert!(
        text.contains("verdict: DNAT to one of 2 endpoints"),
        "{text}"
    );
    assert!(text.contains("masquerade: no"), "{text}");
}

#[test]
fn an_off_cluster_source_to_a_cluster_ip_is_masqueraded() {
    let p = plan(vec![web(&["10.244.2.1:8080"])]);
    let x = explain(&p, &flow(OUTSIDE, "10.96.0.10", 80), "iptables");
    assert_eq!(
        endpoints(&x.verdict),
        [("10.244.2.1:8080".to_owned(), true)]
    );
    assert!(x.masquerade_reasons[0].contains("off the cluster"), "{x:?}");
    // The node itself is off the pod network too.
    let mut from_host = flow(NODE_IP, "10.96.0.10", 80);
    from_host.from_host = true;
    let x = explain(&p, &from_host, "nftables");
    assert_eq!(
        endpoints(&x.verdict),
        [("10.244.2.1:8080".to_owned(), true)]
    );
}

#[test]
fn hairpin_masquerades_only_the_path_back_to_the_source() {
    let p = plan(vec![web(&["10.244.1.5:8080", "10.244.3.1:8080"])]);
    let x = explain(&p, &flow(POD, "10.96.0.10", 80), "nftables");
    assert_eq!(
        endpoints(&x.verdict),
        [
            ("10.244.1.5:8080".to_owned(), true),
            ("10.244.3.1:8080".to_owned(), false)
        ]
    );
    assert!(x.masquerade_reasons[0].starts_with("hairpin"), "{x:?}");
}

#[test]
fn no_endpoints_rejects_and_says_so() {
    let p = plan(vec![web(&[])]);
    let x = explain(&p, &flow(POD, "10.96.0.10", 80), "nftables");
    let Verdict::Reject { reason } = &x.verdict else {
        panic!("{x:?}")
    };
    assert!(reason.contains("no usable endpoint"), "{reason}");
    assert!(human(&x).contains("verdict: REJECT"));
}

#[test]
fn local_policy_without_a_local_endpoint_drops_outside_traffic_and_short_circuits_pods() {
    let p = plan(vec![public(
        TrafficPolicy::Local,
        &["10.244.2.1:8080"],
        &[],
    )]);
    let x = explain(&p, &flow(OUTSIDE, NODE_IP, 30080), "nftables");
    assert_eq!(x.service.as_ref().unwrap().matched_as, MatchedAs::NodePort);
    let Verdict::Drop { reason } = &x.verdict else {
        panic!("{x:?}")
    };
    assert_eq!(
        reason,
        "Local policy and no endpoint on this node (1 elsewhere)"
    );

    // A pod going to the same node port is short-circuited to the cluster endpoints.
    let x = explain(&p, &flow(POD, NODE_IP, 30080), "nftables");
    assert_eq!(
        endpoints(&x.verdict),
        [("10.244.2.1:8080".to_owned(), false)]
    );
    let Verdict::Dnat { list, .. } = &x.verdict else {
        unreachable!()
    };
    assert!(list.contains("short-circuited"), "{list}");

    // The node itself: short-circuited and masqueraded.
    let mut from_host = flow(NODE_IP, "198.51.100.1", 80);
    from_host.from_host = true;
    let x = explain(&p, &from_host, "nftables");
    assert_eq!(
        endpoints(&x.verdict),
        [("10.244.2.1:8080".to_owned(), true)]
    );
}

#[test]
fn cluster_policy_external_traffic_is_masqueraded() {
    let p = plan(vec![public(
        TrafficPolicy::Cluster,
        &["10.244.2.1:8080"],
        &[],
    )]);
    let x = explain(&p, &flow(OUTSIDE, "198.51.100.1", 80), "ipvs");
    assert_eq!(
        x.service.as_ref().unwrap().matched_as,
        MatchedAs::LoadBalancerIp
    );
    assert_eq!(
        endpoints(&x.verdict),
        [("10.244.2.1:8080".to_owned(), true)]
    );
    assert!(x.masquerade_reasons[0].contains("Cluster policy"), "{x:?}");
}

#[test]
fn a_source_outside_the_load_balancer_source_ranges_is_dropped() {
    let mut e = public(TrafficPolicy::Cluster, &["10.244.2.1:8080"], &[]);
    e.load_balancer_source_ranges = vec!["192.0.2.0/24".into()];
    let p = plan(vec![e]);
    let x = explain(&p, &flow(OUTSIDE, "198.51.100.1", 80), "nftables");
    let Verdict::Drop { reason } = &x.verdict else {
        panic!("{x:?}")
    };
    assert!(reason.contains("203.0.113.9 is in none of loadBalancerSourceRanges 192.0.2.0/24"));
    let x = explain(&p, &flow("192.0.2.7", "198.51.100.1", 80), "nftables");
    assert_eq!(endpoints(&x.verdict).len(), 1);
    // The node port is not guarded by the ranges.
    let x = explain(&p, &flow(OUTSIDE, NODE_IP, 30080), "nftables");
    assert_eq!(endpoints(&x.verdict).len(), 1);
}

#[test]
fn an_unknown_port_of_a_cluster_ip_is_rejected_but_in_iptables_mode() {
    let p = plan(vec![web(&["10.244.2.1:8080"])]);
    let x = explain(&p, &flow(POD, "10.96.0.10", 81), "nftables");
    let Verdict::Reject { reason } = &x.verdict else {
        panic!("{x:?}")
    };
    assert!(reason.contains("cluster IP of default/web, which has no port 81/TCP (it has 80/TCP)"));
    let x = explain(&p, &flow(POD, "10.96.0.10", 81), "iptables");
    assert!(matches!(x.verdict, Verdict::NotProxied { .. }), "{x:?}");
    let x = explain(&p, &flow(POD, "10.96.0.10", 81), "ipvs");
    assert!(
        matches!(&x.verdict, Verdict::Reject { reason } if reason.contains("dummy")),
        "{x:?}"
    );
}

#[test]
fn an_unallocated_service_cidr_address_is_dropped_in_nftables_mode() {
    let p = plan(vec![web(&["10.244.2.1:8080"])]);
    let x = explain(&p, &flow(POD, "10.96.7.7", 80), "nftables");
    let Verdict::Drop { reason } = &x.verdict else {
        panic!("{x:?}")
    };
    assert_eq!(
        reason,
        "10.96.7.7 is in the Service CIDR 10.96.0.0/16 but no Service has it"
    );
    let x = explain(&p, &flow(POD, "8.8.8.8", 53), "nftables");
    assert!(matches!(x.verdict, Verdict::NotProxied { .. }), "{x:?}");
}

#[test]
fn a_proxy_mode_load_balancer_ip_is_not_captured() {
    let mut e = public(TrafficPolicy::Cluster, &["10.244.2.1:8080"], &[]);
    e.load_balancer_ips[0].mode = LoadBalancerIpMode::Proxy;
    let p = plan(vec![e]);
    let x = explain(&p, &flow(OUTSIDE, "198.51.100.1", 80), "nftables");
    let Verdict::NotProxied { reason } = &x.verdict else {
        panic!("{x:?}")
    };
    assert!(reason.contains("ipMode Proxy"), "{reason}");
}

#[test]
fn affinity_and_terminating_local_endpoints_are_named() {
    let mut e = public(
        TrafficPolicy::Local,
        &["10.244.2.1:8080"],
        &["10.244.1.9:8080"],
    );
    e.session_affinity = Some(SessionAffinity {
        timeout_seconds: 600,
    });
    e.local_terminating = true;
    let p = plan(vec![e]);
    let x = explain(&p, &flow(OUTSIDE, NODE_IP, 30080), "nftables");
    let Verdict::Dnat {
        list,
        affinity_seconds,
        ..
    } = &x.verdict
    else {
        panic!("{x:?}")
    };
    assert_eq!(*affinity_seconds, Some(600));
    assert!(list.contains("terminating"), "{list}");
    assert!(human(&x).contains("last 600 s"));
}
