//! Planner tables: cluster state in, what each node's agent programs out.
//!
//! Every case feeds Kubernetes objects to the [`Planner`], merges a node's plan with every
//! Service plan (exactly what the agent does) and asserts on the merged entries.
//! The semantics are kube-proxy's (`pkg/proxy/topology.go` `CategorizeEndpoints`,
//! `endpointslicecache.go`, `serviceport.go`); DESIGN §3 lists them.

mod support;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use proxyplan_controller::config::ConfigError;
use proxyplan_controller::model::ObjectError;
use proxyplan_controller::{DesiredObject, ObjectId, Planner, PlannerConfig};
use proxyplan_crds::{
    Endpoint, IpFamily, LoadBalancerIp, LoadBalancerIpMode, LocalTrafficMode, MasqueradePlan,
    Protocol, SessionAffinity, TrafficPlan,
};

use support::*;

const WEB: &str = "default/web:http/TCP/IPv4";

// ---------------------------------------------------------------------------------------
// The cluster every table case runs in

/// Six nodes: two in zone-1 with endpoints, one in zone-1 without (node-f), one in
/// zone-2, one in zone-3 and one without a zone label.
fn nodes() -> Vec<Node> {
    vec![
        mk_node("node-a").zone("zone-1"),
        mk_node("node-b").zone("zone-1"),
        mk_node("node-c").zone("zone-2"),
        mk_node("node-d"),
        mk_node("node-e").zone("zone-3"),
        mk_node("node-f").zone("zone-1"),
    ]
}

/// `default/web`: ClusterIP 10.96.0.10, port `http` 80 targeting the named port `http`.
fn web() -> Service {
    mk_service("web", &["10.96.0.10"], vec![tcp("http", 80)])
}

/// `default/web` as a NodePort Service (node port 30080).
fn web_node_port() -> Service {
    mk_service(
        "web",
        &["10.96.0.10"],
        vec![tcp("http", 80).node_port(30080)],
    )
    .type_("NodePort")
}

/// An IPv4 slice of `web` whose `http` port is 8080.
fn web_slice(
    name: &str,
    endpoints: Vec<k8s_openapi::api::discovery::v1::Endpoint>,
) -> EndpointSlice {
    mk_slice(name, "web", "IPv4", &[("http", "TCP", 8080)], endpoints)
}

/// A planner loaded with [`nodes`], `services` and `slices`.
fn cluster(services: &[Service], slices: &[EndpointSlice]) -> Planner {
    let mut p = planner();
    load(&mut p, &nodes(), services, slices);
    p
}

// ---------------------------------------------------------------------------------------
// Table runner

/// What one node programs for [`WEB`].
#[derive(Debug, PartialEq)]
struct Want {
    cluster: Vec<Endpoint>,
    local: Vec<Endpoint>,
    internal: TrafficPlan,
    external: Option<TrafficPlan>,
}

/// `E1`..`E3`: endpoints 10.0.0.1..3 on port 8080.
const E1: (&str, u16) = ("10.0.0.1", 8080);
const E2: (&str, u16) = ("10.0.0.2", 8080);
const E3: (&str, u16) = ("10.0.0.3", 8080);

/// What `node` must program for [`WEB`].
fn at(
    node: &'static str,
    cluster: &[(&str, u16)],
    local: &[(&str, u16)],
    internal: TrafficPlan,
    external: Option<TrafficPlan>,
) -> (&'static str, Want) {
    (node, want(cluster, local, internal, external))
}

fn want(
    cluster: &[(&str, u16)],
    local: &[(&str, u16)],
    internal: TrafficPlan,
    external: Option<TrafficPlan>,
) -> Want {
    Want {
        cluster: eps(cluster),
        local: eps(local),
        internal,
        external,
    }
}

struct Case {
    name: &'static str,
    service: Service,
    slices: Vec<EndpointSlice>,
    /// Per node, what it must program for [`WEB`].
    want: Vec<(&'static str, Want)>,
}

/// Runs every case and reports every mismatch at once.
fn run(cases: Vec<Case>) {
    let mut failures = Vec::new();
    for case in cases {
        let p = cluster(&[case.service], &case.slices);
        for (node, want) in &case.want {
            let merged = view(&p, node);
            let e = entry(&merged, WEB);
            let got = Want {
                cluster: e.cluster_endpoints.clone(),
                local: e.local_endpoints.clone(),
                internal: e.internal,
                external: e.external,
            };
            if got != *want {
                failures.push(format!(
                    "{} (on {node}):\n    want {want:?}\n    got  {got:?}",
                    case.name
                ));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Endpoint conditions (DESIGN §3: ready, else serving-and-terminating)

#[test]
fn endpoint_conditions() {
    run(vec![
        Case {
            name: "only ready endpoints are used",
            service: web(),
            slices: vec![web_slice(
                "web-1",
                vec![
                    ep("10.0.0.1"),
                    ep("10.0.0.2").not_ready(),
                    ep("10.0.0.3").terminating(),
                ],
            )],
            want: vec![at("node-a", &[E1], &[], CLUSTER_REJECT, None)],
        },
        Case {
            name: "unset conditions mean ready",
            service: web(),
            slices: vec![web_slice("web-1", vec![ep("10.0.0.1").no_conditions()])],
            want: vec![at("node-a", &[E1], &[], CLUSTER_REJECT, None)],
        },
        Case {
            name: "no ready endpoint: serving-and-terminating ones",
            service: web(),
            slices: vec![web_slice(
                "web-1",
                vec![
                    ep("10.0.0.1").terminating(),
                    ep("10.0.0.2").terminating_not_serving(),
                    ep("10.0.0.3").not_ready(),
                    // Serving but neither ready nor terminating: not a fallback either.
                    ep("10.0.0.4").conditions(false, true, false),
                ],
            )],
            want: vec![at("node-a", &[E1], &[], CLUSTER_REJECT, None)],
        },
        Case {
            name: "all endpoints terminating",
            service: web(),
            slices: vec![web_slice(
                "web-1",
                vec![
                    ep("10.0.0.1").terminating().on("node-a"),
                    ep("10.0.0.2").terminating().on("node-c"),
                ],
            )],
            want: vec![
                at("node-a", &[E1, E2], &[], CLUSTER_REJECT, None),
                at("node-d", &[E1, E2], &[], CLUSTER_REJECT, None),
            ],
        },
        Case {
            name: "nothing usable: empty list, REJECT",
            service: web(),
            slices: vec![web_slice(
                "web-1",
                vec![
                    ep("10.0.0.1").not_ready(),
                    ep("10.0.0.2").terminating_not_serving(),
                ],
            )],
            want: vec![at("node-a", &[], &[], CLUSTER_REJECT, None)],
        },
        Case {
            name: "no EndpointSlice at all: REJECT",
            service: web(),
            slices: vec![],
            want: vec![at("node-a", &[], &[], CLUSTER_REJECT, None)],
        },
        Case {
            // kube-proxy decides the fallback separately for the cluster and local lists:
            // node-a has no ready local endpoint, so its local list is its terminating one
            // while the cluster list stays the ready remote one.
            name: "cluster and local lists fall back independently",
            service: web_node_port().etp("Local"),
            slices: vec![web_slice(
                "web-1",
                vec![
                    ep("10.0.0.1").on("node-b"),
                    ep("10.0.0.2").terminating().on("node-a"),
                ],
            )],
            want: vec![
                at("node-a", &[E1], &[E2], CLUSTER_REJECT, Some(LOCAL_DROP)),
                at("node-b", &[E1], &[E1], CLUSTER_REJECT, Some(LOCAL_DROP)),
                at("node-c", &[E1], &[], CLUSTER_REJECT, Some(LOCAL_DROP)),
            ],
        },
    ]);
}

// ---------------------------------------------------------------------------------------
// Traffic policies (DESIGN §3: Local with no local endpoint drops, no endpoint rejects)

#[test]
fn traffic_policies() {
    let three = || {
        vec![web_slice(
            "web-1",
            vec![
                ep("10.0.0.1").on("node-a"),
                ep("10.0.0.2").on("node-b"),
                ep("10.0.0.3").on("node-c"),
            ],
        )]
    };
    let all = [E1, E2, E3];
    run(vec![
        Case {
            name: "ITP Local: this node's endpoints; none here but some elsewhere: DROP",
            service: web().itp("Local"),
            slices: vec![web_slice(
                "web-1",
                vec![ep("10.0.0.1").on("node-a"), ep("10.0.0.3").on("node-c")],
            )],
            want: vec![
                at("node-a", &[], &[E1], LOCAL_DROP, None),
                at("node-b", &[], &[], LOCAL_DROP, None),
                at("node-d", &[], &[], LOCAL_DROP, None),
            ],
        },
        Case {
            name: "ITP Local, no endpoint anywhere: REJECT",
            service: web().itp("Local"),
            slices: vec![],
            want: vec![at("node-a", &[], &[], LOCAL_REJECT, None)],
        },
        Case {
            name: "ITP Local, only starting (not ready) endpoints: REJECT",
            service: web().itp("Local"),
            slices: vec![web_slice(
                "web-1",
                vec![ep("10.0.0.1").not_ready().on("node-a")],
            )],
            want: vec![at("node-a", &[], &[], LOCAL_REJECT, None)],
        },
        Case {
            name: "ITP Local, a serving-terminating endpoint elsewhere still means DROP",
            service: web().itp("Local"),
            slices: vec![web_slice(
                "web-1",
                vec![ep("10.0.0.3").terminating().on("node-c")],
            )],
            want: vec![
                at("node-a", &[], &[], LOCAL_DROP, None),
                at("node-c", &[], &[E3], LOCAL_DROP, None),
            ],
        },
        Case {
            name: "ITP Local: a ready local endpoint beats a terminating local one",
            service: web().itp("Local"),
            slices: vec![web_slice(
                "web-1",
                vec![
                    ep("10.0.0.1").on("node-a"),
                    ep("10.0.0.2").terminating().on("node-a"),
                ],
            )],
            want: vec![at("node-a", &[], &[E1], LOCAL_DROP, None)],
        },
        Case {
            name: "NodePort ETP Local: local list for external, all for cluster IP",
            service: web_node_port().etp("Local"),
            slices: three(),
            want: vec![
                at("node-a", &all, &[E1], CLUSTER_REJECT, Some(LOCAL_DROP)),
                at("node-d", &all, &[], CLUSTER_REJECT, Some(LOCAL_DROP)),
            ],
        },
        Case {
            name: "NodePort ETP Local, no endpoint anywhere: REJECT both ways",
            service: web_node_port().etp("Local"),
            slices: vec![],
            want: vec![at("node-a", &[], &[], CLUSTER_REJECT, Some(LOCAL_REJECT))],
        },
        Case {
            name: "NodePort ETP Cluster",
            service: web_node_port(),
            slices: three(),
            want: vec![at(
                "node-d",
                &all,
                &[],
                CLUSTER_REJECT,
                Some(CLUSTER_REJECT),
            )],
        },
        Case {
            name: "NodePort ITP Local, ETP Cluster",
            service: web_node_port().itp("Local"),
            slices: three(),
            want: vec![
                at("node-a", &all, &[E1], LOCAL_DROP, Some(CLUSTER_REJECT)),
                at("node-d", &all, &[], LOCAL_DROP, Some(CLUSTER_REJECT)),
            ],
        },
        Case {
            name: "ClusterIP with externalIPs, ETP Cluster: external traffic planned",
            service: web().external_ips(&["192.0.2.10"]),
            slices: three(),
            want: vec![at(
                "node-a",
                &all,
                &[],
                CLUSTER_REJECT,
                Some(CLUSTER_REJECT),
            )],
        },
        Case {
            name: "ETP Local on a ClusterIP Service without external addresses: no external",
            service: web().etp("Local"),
            slices: three(),
            want: vec![at("node-a", &all, &[], CLUSTER_REJECT, None)],
        },
        Case {
            name: "LoadBalancer ETP Local with a VIP ingress and node port",
            service: mk_service(
                "web",
                &["10.96.0.10"],
                vec![tcp("http", 80).node_port(30080)],
            )
            .type_("LoadBalancer")
            .etp("Local")
            .health_check_node_port(32000)
            .lb_ingress(&[("203.0.113.1", None)]),
            slices: three(),
            want: vec![
                at("node-b", &all, &[E2], CLUSTER_REJECT, Some(LOCAL_DROP)),
                at("node-f", &all, &[], CLUSTER_REJECT, Some(LOCAL_DROP)),
            ],
        },
    ]);
}

/// kube-proxy (`pkg/api/v1/service/util.go` `ExternalPolicyLocal`) treats a ClusterIP
/// Service with externalIPs as externally accessible, so `externalTrafficPolicy: Local`
/// applies to its external IPs. (Regression: once planned as Cluster.)
#[test]
fn external_ips_of_cluster_ip_service_honour_etp_local() {
    run(vec![Case {
        name: "ClusterIP with externalIPs, ETP Local",
        service: web().external_ips(&["192.0.2.10"]).etp("Local"),
        slices: vec![web_slice(
            "web-1",
            vec![ep("10.0.0.1").on("node-a"), ep("10.0.0.3").on("node-c")],
        )],
        want: vec![
            at("node-a", &[E1, E3], &[E1], CLUSTER_REJECT, Some(LOCAL_DROP)),
            at("node-b", &[E1, E3], &[], CLUSTER_REJECT, Some(LOCAL_DROP)),
        ],
    }]);
    let p = cluster(
        &[web().external_ips(&["192.0.2.10"]).etp("Local")],
        &[web_slice("web-1", vec![ep("10.0.0.1").on("node-a")])],
    );
    let merged = view(&p, "node-b");
    let m = entry(&merged, WEB).masquerade;
    assert!(!m.external, "Local external traffic keeps its source IP");
    assert!(m.local_host_to_external);
}

// ---------------------------------------------------------------------------------------
// Topology (DESIGN §3: hints only when every ready endpoint has them and one matches)

#[test]
fn topology_hints() {
    let z1a = ("10.0.1.1", 8080);
    let z1b = ("10.0.1.2", 8080);
    let z2 = ("10.0.2.1", 8080);
    let hinted = |with_nodes: bool, z2_hints: bool| {
        let mut a = ep("10.0.1.1").on("node-a").for_zones(&["zone-1"]);
        let mut b = ep("10.0.1.2").on("node-b").for_zones(&["zone-1"]);
        let mut c = ep("10.0.2.1").on("node-c");
        if z2_hints {
            c = c.for_zones(&["zone-2"]);
        }
        if with_nodes {
            a = a.for_nodes(&["node-a"]);
            b = b.for_nodes(&["node-b"]);
            if z2_hints {
                c = c.for_nodes(&["node-c"]);
            }
        }
        vec![a, b, c]
    };
    let svc = || web().traffic_distribution("PreferClose");
    run(vec![
        Case {
            name: "zone hints: each zone its endpoints; unhinted zone or no zone: all",
            service: svc(),
            slices: vec![web_slice("web-1", hinted(false, true))],
            want: vec![
                at("node-a", &[z1a, z1b], &[], CLUSTER_REJECT, None),
                at("node-f", &[z1a, z1b], &[], CLUSTER_REJECT, None),
                at("node-c", &[z2], &[], CLUSTER_REJECT, None),
                at("node-d", &[z1a, z1b, z2], &[], CLUSTER_REJECT, None),
                at("node-e", &[z1a, z1b, z2], &[], CLUSTER_REJECT, None),
            ],
        },
        Case {
            name: "zone hints on only some ready endpoints are ignored",
            service: svc(),
            slices: vec![web_slice("web-1", hinted(false, false))],
            want: vec![
                at("node-a", &[z1a, z1b, z2], &[], CLUSTER_REJECT, None),
                at("node-c", &[z1a, z1b, z2], &[], CLUSTER_REJECT, None),
            ],
        },
        Case {
            name: "an unhinted endpoint that is not ready does not disable hints",
            service: svc(),
            slices: vec![web_slice("web-1", {
                let mut list = hinted(false, true);
                list.push(ep("10.0.3.1").not_ready().on("node-e"));
                list
            })],
            want: vec![at("node-a", &[z1a, z1b], &[], CLUSTER_REJECT, None)],
        },
        Case {
            name: "hints spread over two slices still count",
            service: svc(),
            slices: {
                let mut list = hinted(false, true);
                let c = list.pop().into_iter().collect();
                vec![web_slice("web-1", list), web_slice("web-2", c)]
            },
            want: vec![
                at("node-a", &[z1a, z1b], &[], CLUSTER_REJECT, None),
                at("node-c", &[z2], &[], CLUSTER_REJECT, None),
            ],
        },
        Case {
            name: "node hints take precedence over zone hints; unmatched nodes use zone hints",
            service: web().traffic_distribution("PreferSameNode"),
            slices: vec![web_slice("web-1", hinted(true, true))],
            want: vec![
                at("node-a", &[z1a], &[], CLUSTER_REJECT, None),
                at("node-b", &[z1b], &[], CLUSTER_REJECT, None),
                at("node-c", &[z2], &[], CLUSTER_REJECT, None),
                at("node-f", &[z1a, z1b], &[], CLUSTER_REJECT, None),
                at("node-d", &[z1a, z1b, z2], &[], CLUSTER_REJECT, None),
            ],
        },
        Case {
            // node-a's node-hinted list is every endpoint, its zone's list only one: the
            // node hint still wins.
            name: "a node hint matching every endpoint overrides a narrower zone list",
            service: web().traffic_distribution("PreferSameNode"),
            slices: vec![web_slice(
                "web-1",
                vec![
                    ep("10.0.1.1")
                        .on("node-a")
                        .for_zones(&["zone-1"])
                        .for_nodes(&["node-a"]),
                    ep("10.0.2.1")
                        .on("node-c")
                        .for_zones(&["zone-2"])
                        .for_nodes(&["node-a", "node-c"]),
                ],
            )],
            want: vec![
                at("node-a", &[z1a, z2], &[], CLUSTER_REJECT, None),
                at("node-b", &[z1a], &[], CLUSTER_REJECT, None),
                at("node-c", &[z2], &[], CLUSTER_REJECT, None),
            ],
        },
        Case {
            name: "node hints on only some ready endpoints: zone hints decide",
            service: web().traffic_distribution("PreferSameNode"),
            slices: vec![web_slice("web-1", {
                let mut list = hinted(true, true);
                list[2] = ep("10.0.2.1").on("node-c").for_zones(&["zone-2"]);
                list
            })],
            want: vec![
                at("node-a", &[z1a, z1b], &[], CLUSTER_REJECT, None),
                at("node-c", &[z2], &[], CLUSTER_REJECT, None),
            ],
        },
        Case {
            name: "terminating fallback ignores topology",
            service: svc(),
            slices: vec![web_slice(
                "web-1",
                vec![
                    ep("10.0.1.1")
                        .terminating()
                        .on("node-a")
                        .for_zones(&["zone-1"]),
                    ep("10.0.2.1")
                        .terminating()
                        .on("node-c")
                        .for_zones(&["zone-2"]),
                ],
            )],
            want: vec![
                at("node-a", &[z1a, z2], &[], CLUSTER_REJECT, None),
                at("node-c", &[z1a, z2], &[], CLUSTER_REJECT, None),
            ],
        },
        Case {
            name: "ready hinted endpoints elsewhere only: ready ones, not local terminating",
            service: svc(),
            slices: vec![web_slice(
                "web-1",
                vec![
                    ep("10.0.1.1")
                        .terminating()
                        .on("node-a")
                        .for_zones(&["zone-1"]),
                    ep("10.0.2.1").on("node-c").for_zones(&["zone-2"]),
                ],
            )],
            want: vec![
                at("node-a", &[z2], &[], CLUSTER_REJECT, None),
                at("node-c", &[z2], &[], CLUSTER_REJECT, None),
            ],
        },
        Case {
            name: "local lists ignore topology (ITP Local)",
            service: svc().itp("Local"),
            slices: vec![web_slice("web-1", hinted(true, true))],
            want: vec![
                at("node-a", &[], &[z1a], LOCAL_DROP, None),
                at("node-f", &[], &[], LOCAL_DROP, None),
            ],
        },
        Case {
            name: "ETP Local with node hints: both lists in one overlay entry",
            service: web_node_port().etp("Local"),
            slices: vec![web_slice("web-1", hinted(true, true))],
            want: vec![
                at("node-a", &[z1a], &[z1a], CLUSTER_REJECT, Some(LOCAL_DROP)),
                at("node-f", &[z1a, z1b], &[], CLUSTER_REJECT, Some(LOCAL_DROP)),
            ],
        },
        Case {
            name: "ETP Local: zone hints shape the cluster list, not the local one",
            service: web_node_port().etp("Local"),
            slices: vec![web_slice("web-1", hinted(false, true))],
            want: vec![
                at(
                    "node-a",
                    &[z1a, z1b],
                    &[z1a],
                    CLUSTER_REJECT,
                    Some(LOCAL_DROP),
                ),
                at("node-c", &[z2], &[z2], CLUSTER_REJECT, Some(LOCAL_DROP)),
                at("node-f", &[z1a, z1b], &[], CLUSTER_REJECT, Some(LOCAL_DROP)),
            ],
        },
    ]);
}

// ---------------------------------------------------------------------------------------
// Slices: several per Service, duplicates, named target ports, ports and protocols

#[test]
fn several_slices_are_merged_and_deduplicated() {
    let cases: Vec<(&str, Vec<EndpointSlice>, Vec<Endpoint>)> = vec![
        (
            "two slices are merged",
            vec![
                web_slice("web-1", vec![ep("10.0.0.1")]),
                web_slice("web-2", vec![ep("10.0.0.2")]),
            ],
            eps(&[E1, E2]),
        ),
        (
            "an identical endpoint in two slices appears once",
            vec![
                web_slice("web-1", vec![ep("10.0.0.1"), ep("10.0.0.2")]),
                web_slice("web-2", vec![ep("10.0.0.2")]),
            ],
            eps(&[E1, E2]),
        ),
        (
            "a ready duplicate wins over a terminating one (terminating in the first slice)",
            vec![
                web_slice("web-1", vec![ep("10.0.0.1").terminating()]),
                web_slice("web-2", vec![ep("10.0.0.1"), ep("10.0.0.2")]),
            ],
            eps(&[E1, E2]),
        ),
        (
            "a ready duplicate wins over a terminating one (terminating in the last slice)",
            vec![
                web_slice("web-1", vec![ep("10.0.0.1"), ep("10.0.0.2")]),
                web_slice("web-2", vec![ep("10.0.0.1").terminating()]),
            ],
            eps(&[E1, E2]),
        ),
        (
            "a slice of another Service is not merged",
            vec![
                web_slice("web-1", vec![ep("10.0.0.1")]),
                mk_slice(
                    "api-1",
                    "api",
                    "IPv4",
                    &[("http", "TCP", 8080)],
                    vec![ep("10.0.9.9")],
                ),
            ],
            eps(&[E1]),
        ),
        (
            "a slice without the Service's port contributes nothing",
            vec![
                web_slice("web-1", vec![ep("10.0.0.1")]),
                mk_slice(
                    "web-2",
                    "web",
                    "IPv4",
                    &[("metrics", "TCP", 9100)],
                    vec![ep("10.0.0.2")],
                ),
            ],
            eps(&[E1]),
        ),
    ];
    let mut failures = Vec::new();
    for (name, slices, expected) in cases {
        let p = cluster(&[web()], &slices);
        let merged = view(&p, "node-a");
        let got = &entry(&merged, WEB).cluster_endpoints;
        if *got != expected {
            failures.push(format!("{name}:\n    want {expected:?}\n    got  {got:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn named_target_port_resolves_per_slice() {
    // A rolling update renumbered the container port: old pods listen on 8080, new ones
    // on 9090, both under the name `http`.
    let p = cluster(
        &[web()],
        &[
            mk_slice(
                "web-old",
                "web",
                "IPv4",
                &[("http", "TCP", 8080)],
                vec![ep("10.0.0.1")],
            ),
            mk_slice(
                "web-new",
                "web",
                "IPv4",
                &[("http", "TCP", 9090)],
                vec![ep("10.0.0.2"), ep("10.0.0.1")],
            ),
        ],
    );
    let merged = view(&p, "node-a");
    let e = entry(&merged, WEB);
    assert_eq!(e.port, 80);
    assert_eq!(
        e.cluster_endpoints,
        eps(&[E1, ("10.0.0.1", 9090), ("10.0.0.2", 9090)])
    );
}

#[test]
fn multi_port_service() {
    let svc = mk_service(
        "web",
        &["10.96.0.10"],
        vec![tcp("http", 80), tcp("https", 443), tcp("metrics", 9100)],
    );
    let p = cluster(
        &[svc],
        &[mk_slice(
            "web-1",
            "web",
            "IPv4",
            &[
                ("http", "TCP", 8080),
                ("https", "TCP", 8443),
                ("metrics", "TCP", 9100),
            ],
            vec![ep("10.0.0.1"), ep("10.0.0.2")],
        )],
    );
    let merged = view(&p, "node-d");
    assert_eq!(
        keys(&merged),
        [
            "default/web:http/TCP/IPv4",
            "default/web:https/TCP/IPv4",
            "default/web:metrics/TCP/IPv4",
        ]
    );
    for (key, port, target) in [
        ("default/web:http/TCP/IPv4", 80, 8080),
        ("default/web:https/TCP/IPv4", 443, 8443),
        ("default/web:metrics/TCP/IPv4", 9100, 9100),
    ] {
        let e = entry(&merged, key);
        assert_eq!(e.port, port, "{key}");
        assert_eq!(e.cluster_ip, "10.96.0.10", "{key}");
        assert_eq!(
            e.cluster_endpoints,
            eps(&[("10.0.0.1", target), ("10.0.0.2", target)]),
            "{key}"
        );
    }
}

#[test]
fn unnamed_single_port() {
    let svc = mk_service("web", &["10.96.0.10"], vec![tcp("", 80)]);
    let p = cluster(
        &[svc],
        &[mk_slice(
            "web-1",
            "web",
            "IPv4",
            &[("", "TCP", 80)],
            vec![ep("10.0.0.1")],
        )],
    );
    let merged = view(&p, "node-a");
    let e = entry(&merged, "default/web:/TCP/IPv4");
    assert_eq!(e.port_name, "");
    assert_eq!(e.cluster_endpoints, eps(&[("10.0.0.1", 80)]));
}

#[test]
fn udp_and_sctp_ports() {
    let svc = mk_service(
        "dns",
        &["10.96.0.53"],
        vec![udp("dns", 53), tcp("dns-tcp", 53), sctp("sig", 2905)],
    );
    let p = cluster(
        &[svc],
        &[
            mk_slice(
                "dns-1",
                "dns",
                "IPv4",
                &[
                    ("dns", "UDP", 5353),
                    ("dns-tcp", "TCP", 5353),
                    ("sig", "SCTP", 2905),
                ],
                vec![ep("10.0.0.1"), ep("10.0.0.2")],
            ),
            // A port of the right name but the wrong protocol is not the Service's port.
            mk_slice(
                "dns-2",
                "dns",
                "IPv4",
                &[("dns", "TCP", 5353)],
                vec![ep("10.0.0.3")],
            ),
        ],
    );
    let merged = view(&p, "node-a");
    assert_eq!(
        keys(&merged),
        [
            "default/dns:dns-tcp/TCP/IPv4",
            "default/dns:dns/UDP/IPv4",
            "default/dns:sig/SCTP/IPv4",
        ]
    );
    let two = |port| eps(&[("10.0.0.1", port), ("10.0.0.2", port)]);
    let dns = entry(&merged, "default/dns:dns/UDP/IPv4");
    assert_eq!((dns.protocol, dns.port), (Protocol::UDP, 53));
    assert_eq!(dns.cluster_endpoints, two(5353));
    let dns_tcp = entry(&merged, "default/dns:dns-tcp/TCP/IPv4");
    assert_eq!((dns_tcp.protocol, dns_tcp.port), (Protocol::TCP, 53));
    assert_eq!(dns_tcp.cluster_endpoints, two(5353));
    let sig = entry(&merged, "default/dns:sig/SCTP/IPv4");
    assert_eq!((sig.protocol, sig.port), (Protocol::SCTP, 2905));
    assert_eq!(sig.cluster_endpoints, two(2905));
}

#[test]
fn udp_endpoints_appearing_and_leaving_are_visible_to_the_agent() {
    // Stale conntrack clean-up is the agent's (DESIGN §3), from the difference between
    // two plans: the plan must show a UDP port going 0 -> 1 -> 0 endpoints.
    let svc = mk_service("dns", &["10.96.0.53"], vec![udp("dns", 53)]);
    let key = "default/dns:dns/UDP/IPv4";
    let slice = |endpoints| mk_slice("dns-1", "dns", "IPv4", &[("dns", "UDP", 53)], endpoints);
    let mut p = cluster(&[svc], &[]);
    let listed = |p: &Planner| entry(&view(p, "node-a"), key).cluster_endpoints.clone();
    assert_eq!(listed(&p), eps(&[]));
    load(&mut p, &[], &[], &[slice(vec![ep("10.0.0.1")])]);
    assert_eq!(listed(&p), eps(&[("10.0.0.1", 53)]));
    load(&mut p, &[], &[], &[slice(vec![])]);
    assert_eq!(listed(&p), eps(&[]));
}

#[test]
fn udp_entries_carry_the_serving_endpoints_they_do_not_list() {
    // kube-proxy's conntrack clean-up keeps UDP flows to every serving endpoint, whatever
    // the policy, topology or terminating state (`conntrack/cleanup.go`): the agent needs
    // the serving endpoints the entry does not list.
    let slice = |name, service, protocol| {
        mk_slice(
            name,
            service,
            "IPv4",
            &[("dns", protocol, 53)],
            vec![
                ep("10.0.0.1").on("node-a"),
                ep("10.0.0.2").on("node-b").terminating(),
                ep("10.0.0.3").on("node-b").terminating_not_serving(),
                ep("10.0.0.4").on("node-c").not_ready(),
            ],
        )
    };
    let udp_svc = mk_service("dns", &["10.96.0.53"], vec![udp("dns", 53)]);
    let tcp_svc = mk_service("dnt", &["10.96.0.54"], vec![tcp("dns", 53)]);
    let local_svc = mk_service("dnl", &["10.96.0.55"], vec![udp("dns", 53)]).itp("Local");
    let p = cluster(
        &[udp_svc, tcp_svc, local_svc],
        &[
            slice("dns-1", "dns", "UDP"),
            slice("dnt-1", "dnt", "TCP"),
            slice("dnl-1", "dnl", "UDP"),
        ],
    );
    let merged = view(&p, "node-c");
    let dns = entry(&merged, "default/dns:dns/UDP/IPv4");
    assert_eq!(dns.cluster_endpoints, eps(&[("10.0.0.1", 53)]));
    assert_eq!(dns.also_serving, eps(&[("10.0.0.2", 53)]));
    assert!(
        entry(&merged, "default/dnt:dns/TCP/IPv4")
            .also_serving
            .is_empty(),
        "TCP flows are not cleaned up"
    );
    // Internal Local policy only: no cluster list at all, so every serving endpoint.
    let dnl = entry(&merged, "default/dnl:dns/UDP/IPv4");
    assert!(dnl.cluster_endpoints.is_empty());
    assert_eq!(dnl.also_serving, eps(&[("10.0.0.1", 53), ("10.0.0.2", 53)]));
}

#[test]
fn dual_stack_has_one_entry_per_family() {
    let svc = mk_service(
        "web",
        &["10.96.0.10", "fd00:96::10"],
        vec![tcp("http", 80).node_port(30080)],
    )
    .type_("LoadBalancer")
    .external_ips(&["192.0.2.10", "2001:db8::10"])
    .source_ranges(&["198.51.100.0/24", "2001:db8:1::/48"])
    .lb_ingress(&[("203.0.113.1", None), ("2001:db8:ffff::1", Some("Proxy"))]);
    let p = cluster(
        &[svc],
        &[
            web_slice("web-v4", vec![ep("10.0.0.1"), ep("10.0.0.2")]),
            mk_slice(
                "web-v6",
                "web",
                "IPv6",
                &[("http", "TCP", 8080)],
                vec![ep("fd00:1::1"), ep("fd00:1::2").terminating()],
            ),
        ],
    );
    let merged = view(&p, "node-a");
    assert_eq!(
        keys(&merged),
        ["default/web:http/TCP/IPv4", "default/web:http/TCP/IPv6"]
    );

    let v4 = entry(&merged, "default/web:http/TCP/IPv4");
    assert_eq!(v4.family, IpFamily::IPv4);
    assert_eq!(v4.cluster_ip, "10.96.0.10");
    assert_eq!(v4.external_ips, ["192.0.2.10"]);
    assert_eq!(
        v4.load_balancer_ips,
        [LoadBalancerIp {
            ip: "203.0.113.1".to_owned(),
            mode: LoadBalancerIpMode::VIP
        }]
    );
    assert_eq!(v4.load_balancer_source_ranges, ["198.51.100.0/24"]);
    assert_eq!(v4.node_port, Some(30080));
    assert_eq!(v4.cluster_endpoints, eps(&[E1, E2]));

    let v6 = entry(&merged, "default/web:http/TCP/IPv6");
    assert_eq!(v6.family, IpFamily::IPv6);
    assert_eq!(v6.cluster_ip, "fd00:96::10");
    assert_eq!(v6.external_ips, ["2001:db8::10"]);
    assert_eq!(
        v6.load_balancer_ips,
        [LoadBalancerIp {
            ip: "2001:db8:ffff::1".to_owned(),
            mode: LoadBalancerIpMode::Proxy
        }]
    );
    assert_eq!(v6.load_balancer_source_ranges, ["2001:db8:1::/48"]);
    assert_eq!(v6.node_port, Some(30080));
    assert_eq!(v6.cluster_endpoints, eps(&[("fd00:1::1", 8080)]));
}

#[test]
fn dual_stack_families_decide_endpoints_separately() {
    // IPv6 has only a terminating endpoint: it falls back; IPv4 does not.
    let svc = mk_service("web", &["10.96.0.10", "fd00:96::10"], vec![tcp("http", 80)]);
    let p = cluster(
        &[svc],
        &[
            web_slice("web-v4", vec![ep("10.0.0.1"), ep("10.0.0.2").terminating()]),
            mk_slice(
                "web-v6",
                "web",
                "IPv6",
                &[("http", "TCP", 8080)],
                vec![ep("fd00:1::2").terminating()],
            ),
        ],
    );
    let merged = view(&p, "node-a");
    assert_eq!(
        entry(&merged, "default/web:http/TCP/IPv4").cluster_endpoints,
        eps(&[E1])
    );
    assert_eq!(
        entry(&merged, "default/web:http/TCP/IPv6").cluster_endpoints,
        eps(&[("fd00:1::2", 8080)])
    );
}

// ---------------------------------------------------------------------------------------
// Service types, addresses and options

#[test]
fn service_types() {
    let lb = mk_service(
        "lb",
        &["10.96.0.30"],
        vec![tcp("http", 80).node_port(30081)],
    )
    .type_("LoadBalancer")
    .lb_ingress(&[("203.0.113.1", None)]);
    let p = cluster(
        &[
            web(),
            mk_service(
                "np",
                &["10.96.0.20"],
                vec![tcp("http", 80).node_port(30080)],
            )
            .type_("NodePort"),
            lb,
        ],
        &[],
    );
    let merged = view(&p, "node-a");

    let c = entry(&merged, WEB);
    assert_eq!((c.cluster_ip.as_str(), c.port), ("10.96.0.10", 80));
    assert_eq!(c.node_port, None);
    assert_eq!(c.external, None);
    assert!(c.external_ips.is_empty() && c.load_balancer_ips.is_empty());
    assert_eq!(c.health_check_node_port, None);

    let np = entry(&merged, "default/np:http/TCP/IPv4");
    assert_eq!(np.node_port, Some(30080));
    assert_eq!(np.external, Some(CLUSTER_REJECT));
    assert!(np.load_balancer_ips.is_empty());

    let lb = entry(&merged, "default/lb:http/TCP/IPv4");
    assert_eq!(lb.node_port, Some(30081));
    assert_eq!(lb.external, Some(CLUSTER_REJECT));
    assert_eq!(
        lb.load_balancer_ips,
        [LoadBalancerIp {
            ip: "203.0.113.1".to_owned(),
            mode: LoadBalancerIpMode::VIP
        }]
    );
}

#[test]
fn external_ips_are_planned_per_service_port() {
    let svc = mk_service(
        "web",
        &["10.96.0.10"],
        vec![tcp("http", 80), udp("q", 9000)],
    )
    .external_ips(&["192.0.2.10", "192.0.2.11"]);
    let p = cluster(&[svc], &[]);
    let merged = view(&p, "node-a");
    for key in [WEB, "default/web:q/UDP/IPv4"] {
        let e = entry(&merged, key);
        assert_eq!(e.external_ips, ["192.0.2.10", "192.0.2.11"], "{key}");
        assert_eq!(e.external, Some(CLUSTER_REJECT), "{key}");
        assert_eq!(e.node_port, None, "{key}");
    }
}

#[test]
fn load_balancer_ip_modes() {
    let lb = |ingress: &[(&str, Option<&str>)]| {
        mk_service("web", &["10.96.0.10"], vec![tcp("http", 80)])
            .type_("LoadBalancer")
            .with(|s| s.spec_mut().allocate_load_balancer_node_ports = Some(false))
            .lb_ingress(ingress)
    };
    let vip = |ip: &str| LoadBalancerIp {
        ip: ip.to_owned(),
        mode: LoadBalancerIpMode::VIP,
    };
    let proxy = |ip: &str| LoadBalancerIp {
        ip: ip.to_owned(),
        mode: LoadBalancerIpMode::Proxy,
    };
    let cases = [
        (
            "unset ipMode is VIP; Proxy kept as Proxy; hostname-only ingress skipped",
            lb(&[
                ("203.0.113.1", None),
                ("203.0.113.2", Some("Proxy")),
                ("", None),
                ("203.0.113.3", Some("VIP")),
            ]),
            vec![vip("203.0.113.1"), proxy("203.0.113.2"), vip("203.0.113.3")],
            Some(CLUSTER_REJECT),
        ),
        (
            // Nothing for the node to capture: no node port, no VIP (kube-proxy ignores
            // Proxy-mode IPs when deciding whether a Service is externally accessible).
            "only Proxy-mode IPs and no node port: no external traffic",
            lb(&[("203.0.113.2", Some("Proxy"))]),
            vec![proxy("203.0.113.2")],
            None,
        ),
        ("no ingress yet", lb(&[]), vec![], None),
    ];
    for (name, svc, ips, external) in cases {
        let p = cluster(&[svc], &[]);
        let merged = view(&p, "node-a");
        let e = entry(&merged, WEB);
        assert_eq!(e.load_balancer_ips, ips, "{name}");
        assert_eq!(e.external, external, "{name}");
        assert_eq!(e.node_port, None, "{name}");
    }
}

#[test]
fn load_balancer_source_ranges_only_on_load_balancer_services() {
    let ranges = ["198.51.100.7/24", "192.0.2.0/28", "2001:db8::/32"];
    let lb = mk_service(
        "lb",
        &["10.96.0.30"],
        vec![tcp("http", 80).node_port(30081)],
    )
    .type_("LoadBalancer")
    .source_ranges(&ranges)
    .lb_ingress(&[("203.0.113.1", None)]);
    let np = mk_service(
        "np",
        &["10.96.0.20"],
        vec![tcp("http", 80).node_port(30080)],
    )
    .type_("NodePort")
    .source_ranges(&ranges);
    let ip = web().source_ranges(&ranges);
    let p = cluster(&[lb, np, ip], &[]);
    let merged = view(&p, "node-a");
    // Normalised (host bits cleared) and of the entry's family only.
    assert_eq!(
        entry(&merged, "default/lb:http/TCP/IPv4").load_balancer_source_ranges,
        ["198.51.100.0/24", "192.0.2.0/28"]
    );
    assert!(
        entry(&merged, "default/np:http/TCP/IPv4")
            .load_balancer_source_ranges
            .is_empty()
    );
    assert!(entry(&merged, WEB).load_balancer_source_ranges.is_empty());
}

#[test]
fn health_check_node_port() {
    let lb = || {
        mk_service(
            "web",
            &["10.96.0.10"],
            vec![tcp("http", 80).node_port(30080)],
        )
        .type_("LoadBalancer")
        .health_check_node_port(32000)
        .lb_ingress(&[("203.0.113.1", None)])
    };
    let cases = [
        ("LoadBalancer ETP Local", lb().etp("Local"), Some(32000)),
        ("LoadBalancer ETP Cluster", lb().etp("Cluster"), None),
        (
            "NodePort ETP Local",
            web_node_port().etp("Local").health_check_node_port(32000),
            None,
        ),
    ];
    for (name, svc, port) in cases {
        let p = cluster(
            &[svc],
            &[web_slice("web-1", vec![ep("10.0.0.1").on("node-a")])],
        );
        let merged = view(&p, "node-a");
        assert_eq!(entry(&merged, WEB).health_check_node_port, port, "{name}");
    }
    // The agent answers the health check from the local endpoint count: node-a has one,
    // node-b none.
    let p = cluster(
        &[lb().etp("Local")],
        &[web_slice("web-1", vec![ep("10.0.0.1").on("node-a")])],
    );
    assert_eq!(entry(&view(&p, "node-a"), WEB).local_endpoints.len(), 1);
    assert_eq!(entry(&view(&p, "node-b"), WEB).local_endpoints.len(), 0);

    // Only terminating endpoints on node-a: they still take traffic there, but they are
    // marked so that the health check counts none (kube-proxy counts ready endpoints).
    let p = cluster(
        &[lb().etp("Local")],
        &[web_slice(
            "web-1",
            vec![
                ep("10.0.0.1").on("node-a").terminating(),
                ep("10.0.0.2").on("node-b"),
                ep("10.0.0.3").on("node-b").terminating(),
            ],
        )],
    );
    let a = view(&p, "node-a");
    assert_eq!(entry(&a, WEB).local_endpoints, eps(&[("10.0.0.1", 8080)]));
    assert!(entry(&a, WEB).local_terminating);
    let b = view(&p, "node-b");
    assert_eq!(entry(&b, WEB).local_endpoints, eps(&[("10.0.0.2", 8080)]));
    assert!(!entry(&b, WEB).local_terminating);
}

#[test]
fn session_affinity() {
    let cases = [
        ("no affinity", web(), None),
        (
            "ClientIP with the default timeout",
            web().client_ip_affinity(None),
            Some(10_800),
        ),
        (
            "ClientIP with a timeout",
            web().client_ip_affinity(Some(60)),
            Some(60),
        ),
        (
            "ClientIP without sessionAffinityConfig",
            web().with(|s| {
                let spec = s.spec_mut();
                spec.session_affinity = Some("ClientIP".to_owned());
                spec.session_affinity_config = None;
            }),
            Some(10_800),
        ),
    ];
    for (name, svc, timeout) in cases {
        let p = cluster(&[svc], &[]);
        let merged = view(&p, "node-a");
        assert_eq!(
            entry(&merged, WEB).session_affinity,
            timeout.map(|timeout_seconds| SessionAffinity { timeout_seconds }),
            "{name}"
        );
    }
}

#[test]
fn services_the_proxy_must_ignore_produce_nothing() {
    let cases: Vec<(&str, Service)> = vec![
        (
            "ExternalName",
            mk_service("web", &[], vec![tcp("http", 80)]).with(|s| {
                let spec = s.spec_mut();
                spec.type_ = Some("ExternalName".to_owned());
                spec.external_name = Some("example.com".to_owned());
                spec.cluster_ip = None;
                spec.cluster_ips = None;
            }),
        ),
        (
            "headless (clusterIP None)",
            mk_service("web", &["None"], vec![tcp("http", 80)]),
        ),
        (
            "labelled service.kubernetes.io/headless",
            web().label("service.kubernetes.io/headless", ""),
        ),
        (
            "labelled service.kubernetes.io/service-proxy-name",
            web().label("service.kubernetes.io/service-proxy-name", "other-proxy"),
        ),
        (
            "no cluster IP allocated yet",
            web().with(|s| {
                let spec = s.spec_mut();
                spec.cluster_ip = None;
                spec.cluster_ips = None;
            }),
        ),
    ];
    for (name, svc) in cases {
        let mut p = planner();
        load(
            &mut p,
            &nodes(),
            &[],
            &[web_slice("web-1", vec![ep("10.0.0.1")])],
        );
        match p.apply_service(&svc) {
            Err(err) => assert!(!err.is_invalid(), "{name}: reported as invalid: {err}"),
            Ok(()) => panic!("{name}: planned"),
        }
        assert_eq!(keys(&view(&p, "node-a")), Vec::<String>::new(), "{name}");
    }
}

#[test]
fn service_becoming_ignored_is_removed() {
    let mut p = cluster(&[web()], &[web_slice("web-1", vec![ep("10.0.0.1")])]);
    let shard = service_plan_holding(&p, "node-a", WEB);
    drain(&mut p);
    let err = p
        .apply_service(&web().label("service.kubernetes.io/service-proxy-name", "other"))
        .err();
    assert!(matches!(err, Some(ObjectError::Ignored { .. })), "{err:?}");
    assert_eq!(keys(&view(&p, "node-a")), Vec::<String>::new());
    assert_eq!(
        touched(&p.take_changes()),
        set(&[&format!("delete {shard}")])
    );
    // Handed back: planned again.
    load(&mut p, &[], &[web()], &[]);
    assert_eq!(
        entry(&view(&p, "node-a"), WEB).cluster_endpoints,
        eps(&[E1])
    );
}

#[test]
fn service_type_change_drops_node_port() {
    let mut p = cluster(
        &[web_node_port()],
        &[web_slice("web-1", vec![ep("10.0.0.1")])],
    );
    let before = view(&p, "node-a");
    assert_eq!(entry(&before, WEB).node_port, Some(30080));
    // The API server clears nodePort on such an update; a stale one must not matter.
    load(&mut p, &[], &[web_node_port().type_("ClusterIP")], &[]);
    let after = view(&p, "node-a");
    let e = entry(&after, WEB);
    assert_eq!(e.node_port, None);
    assert_eq!(e.external, None);
    assert_eq!(e.cluster_endpoints, eps(&[E1]));
    assert!(!e.masquerade.external);
}

#[test]
fn service_and_slices_in_any_order_and_deletions() {
    let mut p = planner();
    load(
        &mut p,
        &nodes(),
        &[],
        &[web_slice("web-1", vec![ep("10.0.0.1")])],
    );
    assert_eq!(keys(&view(&p, "node-a")), Vec::<String>::new());
    load(&mut p, &[], &[web()], &[]);
    assert_eq!(
        entry(&view(&p, "node-a"), WEB).cluster_endpoints,
        eps(&[E1])
    );
    p.delete_slice(&web_slice("web-1", vec![]));
    let merged = view(&p, "node-a");
    assert_eq!(entry(&merged, WEB).cluster_endpoints, eps(&[]));
    assert_eq!(entry(&merged, WEB).internal, CLUSTER_REJECT);
    p.delete_service(&web());
    assert_eq!(keys(&view(&p, "node-a")), Vec::<String>::new());
}

#[test]
fn slices_moving_between_services_and_relists() {
    let api = mk_service("api", &["10.96.0.11"], vec![tcp("http", 80)]);
    let api_key = "default/api:http/TCP/IPv4";
    let mut p = cluster(
        &[web(), api.clone()],
        &[
            web_slice("web-1", vec![ep("10.0.0.1")]),
            web_slice("web-2", vec![ep("10.0.0.2")]),
        ],
    );
    let listed = |p: &Planner, key: &str| entry(&view(p, "node-a"), key).cluster_endpoints.clone();

    // web-2 is relabelled to api.
    let relabelled = mk_slice(
        "web-2",
        "api",
        "IPv4",
        &[("http", "TCP", 8080)],
        vec![ep("10.0.0.2")],
    );
    load(&mut p, &[], &[], &[relabelled]);
    assert_eq!(listed(&p, WEB), eps(&[E1]));
    assert_eq!(listed(&p, api_key), eps(&[E2]));

    // A slice that loses its Service label is no longer read.
    let orphaned = web_slice("web-1", vec![ep("10.0.0.1")]).with_labels(|labels| {
        labels.remove("kubernetes.io/service-name");
    });
    assert!(matches!(
        p.apply_slice(&orphaned),
        Err(ObjectError::Ignored { .. })
    ));
    assert_eq!(listed(&p, WEB), eps(&[]));

    // Relists drop what is gone.
    let errors = p.reset_slices(&[web_slice("web-3", vec![ep("10.0.0.3")])]);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(listed(&p, WEB), eps(&[E3]));
    assert_eq!(listed(&p, api_key), eps(&[]));
    let errors = p.reset_services(&[api]);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(keys(&view(&p, "node-a")), [api_key]);
    let errors = p.reset_nodes(&[mk_node("node-b").zone("zone-1")]);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(p.node_view("node-a").is_none());
    assert_eq!(p.node_count(), 1);
}

#[test]
fn invalid_service_is_refused_and_the_previous_version_kept() {
    let good = || web_node_port().external_ips(&["192.0.2.10"]);
    let with_port = |f: fn(&mut k8s_openapi::api::core::v1::ServicePort)| {
        good().with(move |s| {
            if let Some(port) = s.spec_mut().ports.as_mut().and_then(|p| p.first_mut()) {
                f(port);
            }
        })
    };
    let cases: Vec<(&str, Service, &str)> = vec![
        (
            "bad cluster IP",
            good().with(|s| {
                let spec = s.spec_mut();
                spec.cluster_ip = Some("10.96.0.300".to_owned());
                spec.cluster_ips = Some(vec!["10.96.0.300".to_owned()]);
            }),
            "spec.clusterIPs[0]",
        ),
        (
            "two cluster IPs of one family",
            good().with(|s| {
                s.spec_mut().cluster_ips =
                    Some(vec!["10.96.0.10".to_owned(), "10.96.0.11".to_owned()]);
            }),
            "spec.clusterIPs[1]",
        ),
        ("port 0", with_port(|p| p.port = 0), "spec.ports[0].port"),
        (
            "unknown protocol",
            with_port(|p| p.protocol = Some("ICMP".to_owned())),
            "spec.ports[0].protocol",
        ),
        (
            "node port out of range",
            with_port(|p| p.node_port = Some(70_000)),
            "spec.ports[0].nodePort",
        ),
        (
            "bad external IP",
            good().external_ips(&["192.0.2.10", "not-an-ip"]),
            "spec.externalIPs[1]",
        ),
        ("unknown type", good().type_("Weird"), "spec.type"),
        (
            "bad source range",
            good().type_("LoadBalancer").source_ranges(&["10.0.0.0/33"]),
            "spec.loadBalancerSourceRanges[0]",
        ),
        (
            "bad load-balancer ipMode",
            good()
                .type_("LoadBalancer")
                .lb_ingress(&[("203.0.113.1", Some("Teleport"))]),
            "status.loadBalancer.ingress[0].ipMode",
        ),
        (
            "affinity timeout 0",
            good().client_ip_affinity(Some(0)),
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
        ),
        (
            "unknown session affinity",
            good().with(|s| s.spec_mut().session_affinity = Some("Cookie".to_owned())),
            "spec.sessionAffinity",
        ),
    ];
    for (name, bad, field) in cases {
        let mut p = cluster(&[good()], &[web_slice("web-1", vec![ep("10.0.0.1")])]);
        let before = view(&p, "node-a");
        drain(&mut p);
        match p.apply_service(&bad) {
            Err(ObjectError::Invalid {
                kind,
                object,
                field: got,
                ..
            }) => {
                assert_eq!(
                    (kind, object.as_str()),
                    ("Service", "default/web"),
                    "{name}"
                );
                assert_eq!(got, field, "{name}");
            }
            other => panic!("{name}: expected Invalid naming {field}, got {other:?}"),
        }
        assert_eq!(
            view(&p, "node-a").service_ports,
            before.service_ports,
            "{name}"
        );
        assert!(
            p.take_changes().is_empty(),
            "{name}: something was rewritten"
        );
    }
}

/// A hand-written state file (DESIGN §5) may set only `spec.clusterIP`; the error names
/// that field, not a `spec.clusterIP[0]` that does not exist. (Regression.)
#[test]
fn invalid_scalar_cluster_ip_names_the_field() {
    let bad = web().with(|s| {
        let spec = s.spec_mut();
        spec.cluster_ip = Some("10.96.0.300".to_owned());
        spec.cluster_ips = None;
    });
    match planner().apply_service(&bad) {
        Err(ObjectError::Invalid { field, .. }) => assert_eq!(field, "spec.clusterIP"),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Masquerade and local-traffic detection

#[test]
fn masquerade_decisions() {
    let config = |cidrs: &[&str], all: bool, mode: LocalTrafficMode| {
        let cidrs: Vec<String> = cidrs.iter().map(|c| (*c).to_owned()).collect();
        match PlannerConfig::new(&cidrs, all, mode) {
            Ok(c) => c,
            Err(err) => panic!("config refused: {err}"),
        }
    };
    let masq = |all, off_cluster, external, local_host| MasqueradePlan {
        all,
        off_cluster_to_cluster_ip: off_cluster,
        external,
        local_host_to_external: local_host,
        hairpin: true,
    };
    let dual = || mk_service("web", &["10.96.0.10", "fd00:96::10"], vec![tcp("http", 80)]);
    let v6 = "default/web:http/TCP/IPv6";
    let none = LocalTrafficMode::ClusterCIDR;
    let cases = [
        (
            "no cluster CIDR: off-cluster traffic not detectable",
            config(&[], false, none),
            web(),
            WEB,
            masq(false, false, false, false),
        ),
        (
            "cluster CIDR: off-cluster traffic to the cluster IP masqueraded",
            config(&["10.244.0.0/16"], false, LocalTrafficMode::ClusterCIDR),
            web(),
            WEB,
            masq(false, true, false, false),
        ),
        (
            "IPv4-only cluster CIDR: no detection for the IPv6 entry",
            config(&["10.244.0.0/16"], false, LocalTrafficMode::ClusterCIDR),
            dual(),
            v6,
            masq(false, false, false, false),
        ),
        (
            "dual-stack cluster CIDRs: detection for the IPv6 entry",
            config(
                &["10.244.0.0/16", "fd00:244::/56"],
                false,
                LocalTrafficMode::ClusterCIDR,
            ),
            dual(),
            v6,
            masq(false, true, false, false),
        ),
        (
            "NodeCIDR detection",
            config(&[], false, LocalTrafficMode::NodeCIDR),
            dual(),
            v6,
            masq(false, true, false, false),
        ),
        (
            "masqueradeAll",
            config(&[], true, none),
            web(),
            WEB,
            masq(true, false, false, false),
        ),
        (
            "external traffic with Cluster policy",
            config(&["10.244.0.0/16"], false, LocalTrafficMode::ClusterCIDR),
            web_node_port(),
            WEB,
            masq(false, true, true, false),
        ),
        (
            "external traffic with Local policy: host-originated only",
            config(&["10.244.0.0/16"], false, LocalTrafficMode::ClusterCIDR),
            web_node_port().etp("Local"),
            WEB,
            masq(false, true, false, true),
        ),
    ];
    let mut failures = Vec::new();
    for (name, config, svc, key, expected) in cases {
        let mut p = Planner::new(config);
        load(&mut p, &nodes(), &[svc], &[]);
        let got = entry(&view(&p, "node-a"), key).masquerade;
        if got != expected {
            failures.push(format!("{name}:\n    want {expected:?}\n    got  {got:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn planner_config_validation() {
    let s = |list: &[&str]| list.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>();
    let mode = LocalTrafficMode::ClusterCIDR;
    match PlannerConfig::new(&s(&["10.244.1.7/16,fd00:244::1/56"]), false, mode) {
        Ok(c) => {
            assert_eq!(c.cluster_cidrs, ["10.244.0.0/16", "fd00:244::/56"]);
            assert!(c.detects_local_traffic(IpFamily::IPv4));
            assert!(c.detects_local_traffic(IpFamily::IPv6));
        }
        Err(err) => panic!("refused: {err}"),
    }
    match PlannerConfig::new(&s(&["10.244.0.0/16"]), false, mode) {
        Ok(c) => {
            assert!(c.detects_local_traffic(IpFamily::IPv4));
            assert!(!c.detects_local_traffic(IpFamily::IPv6));
        }
        Err(err) => panic!("refused: {err}"),
    }
    assert!(matches!(
        PlannerConfig::new(&s(&["10.244.0.0/16", "10.245.0.0/16"]), false, mode),
        Err(ConfigError::TooManyCidrs(_))
    ));
    assert!(matches!(
        PlannerConfig::new(&s(&["10.244.0.0/33"]), false, mode),
        Err(ConfigError::ClusterCidr(_))
    ));
    assert!(matches!(
        PlannerConfig::new(&s(&["banana"]), false, mode),
        Err(ConfigError::ClusterCidr(_))
    ));
}

#[test]
fn local_traffic_detection_in_the_node_plan() {
    let node = || {
        mk_node("node-a")
            .zone("zone-1")
            .pod_cidrs(&["10.244.1.0/24", "fd00:244:1::/64"])
            .address("ExternalIP", "198.51.100.1")
    };
    let cidrs = vec!["10.244.0.0/16".to_owned()];
    let cases = [
        (LocalTrafficMode::ClusterCIDR, vec!["10.244.0.0/16"]),
        (
            LocalTrafficMode::NodeCIDR,
            vec!["10.244.1.0/24", "fd00:244:1::/64"],
        ),
    ];
    for (mode, expected) in cases {
        let config = match PlannerConfig::new(&cidrs, false, mode) {
            Ok(c) => c,
            Err(err) => panic!("refused: {err}"),
        };
        let mut p = Planner::new(config);
        load(&mut p, &[node()], &[], &[]);
        let merged = view(&p, "node-a");
        assert_eq!(merged.local_traffic.mode, mode);
        assert_eq!(merged.local_traffic.cidrs, expected, "{mode:?}");
        let addresses: Vec<String> = merged.addresses.iter().map(ToString::to_string).collect();
        assert_eq!(addresses, [node_ip("node-a"), "198.51.100.1".to_owned()]);
    }

    // kube-proxy's interface modes, for CNIs whose pods are not inside one CIDR.
    for (mode, bridge, prefix, want) in [
        (
            LocalTrafficMode::BridgeInterface,
            Some("cni0"),
            None,
            "cni0",
        ),
        (
            LocalTrafficMode::InterfaceNamePrefix,
            None,
            Some("veth"),
            "veth",
        ),
    ] {
        let config = PlannerConfig::new(&[], false, mode)
            .and_then(|c| c.with_local_interface(bridge.map(Into::into), prefix.map(Into::into)))
            .unwrap_or_else(|err| panic!("refused: {err}"));
        assert!(config.detects_local_traffic(proxyplan_crds::IpFamily::IPv6));
        let mut p = Planner::new(config);
        load(&mut p, &[node()], &[], &[]);
        let merged = view(&p, "node-a");
        assert_eq!(merged.local_traffic.mode, mode);
        assert!(merged.local_traffic.cidrs.is_empty());
        assert_eq!(merged.local_traffic.interface.as_deref(), Some(want));
    }
    let missing = PlannerConfig::new(&[], false, LocalTrafficMode::BridgeInterface)
        .and_then(|c| c.with_local_interface(None, Some("veth".into())));
    assert_eq!(
        missing.map(|_| ()).map_err(|e| e.to_string()),
        Err("--detect-local-mode=BridgeInterface: needs --pod-bridge-interface".to_owned())
    );
    let bad = PlannerConfig::new(&[], false, LocalTrafficMode::InterfaceNamePrefix)
        .and_then(|c| c.with_local_interface(None, Some("veth\n-j ACCEPT".into())));
    assert!(bad.is_err());
}

// ---------------------------------------------------------------------------------------
// Nodes

#[test]
fn node_changing_zone_changes_its_plan_and_the_zone_list_it_merges() {
    let hinted = web_slice(
        "web-1",
        vec![
            ep("10.0.1.1").on("node-a").for_zones(&["zone-1"]),
            ep("10.0.2.1").on("node-c").for_zones(&["zone-2"]),
        ],
    );
    let mut p = cluster(&[web()], &[hinted]);
    let (plan, services) = p.node_view("node-a").unwrap_or_else(|| panic!("no plan"));
    assert_eq!(plan.spec.zone.as_deref(), Some("zone-1"));
    // The Service plan carries a list per hinted zone; the node merges its own.
    let zones: Vec<&str> = services[0].spec.service_ports[0]
        .zone_endpoints
        .iter()
        .map(|z| z.zone.as_str())
        .collect();
    assert_eq!(zones, ["zone-1", "zone-2"]);
    assert_eq!(
        entry(&view(&p, "node-a"), WEB).cluster_endpoints,
        eps(&[("10.0.1.1", 8080)])
    );
    drain(&mut p);

    // node-a moves to zone-2: only its plan changes.
    load(&mut p, &[mk_node("node-a").zone("zone-2")], &[], &[]);
    let changes = p.take_changes();
    assert_eq!(touched(&changes), set(&["plan/node-a"]));
    let (plan, _) = p.node_view("node-a").unwrap_or_else(|| panic!("no plan"));
    assert_eq!(plan.spec.zone.as_deref(), Some("zone-2"));
    assert_eq!(
        entry(&view(&p, "node-a"), WEB).cluster_endpoints,
        eps(&[("10.0.2.1", 8080)])
    );

    // node-e moves to a zone no endpoint is hinted for: every endpoint; only its plan
    // is written (no per-zone object comes or goes).
    load(&mut p, &[mk_node("node-e").zone("zone-9")], &[], &[]);
    let changes = p.take_changes();
    assert_eq!(touched(&changes), set(&["plan/node-e"]));
    let merged = view(&p, "node-e");
    assert_eq!(
        entry(&merged, WEB).cluster_endpoints,
        eps(&[("10.0.1.1", 8080), ("10.0.2.1", 8080)])
    );
}

#[test]
fn a_node_being_removed_is_not_eligible_for_load_balancer_traffic() {
    // kube-proxy's /healthz fails for such a node (`healthcheck/proxy_health.go`), so
    // cloud load balancers drain it before it goes.
    let ineligible = |node: Node| {
        let mut p = planner();
        load(&mut p, &[node], &[], &[]);
        let (plan, _) = p.node_view("node-a").expect("plan");
        plan.spec.ineligible
    };
    assert_eq!(ineligible(mk_node("node-a")), None);
    let deleting = ineligible(mk_node("node-a").deleting()).expect("ineligible");
    assert!(deleting.contains("deletionTimestamp"), "{deleting}");
    let tainted =
        ineligible(mk_node("node-a").taint("ToBeDeletedByClusterAutoscaler")).expect("ineligible");
    assert!(
        tainted.contains("ToBeDeletedByClusterAutoscaler"),
        "{tainted}"
    );
    assert_eq!(ineligible(mk_node("node-a").taint("other")), None);

    // The taint arriving rewrites the node plan.
    let mut p = planner();
    load(&mut p, &[mk_node("node-a")], &[], &[]);
    drain(&mut p);
    load(
        &mut p,
        &[mk_node("node-a").taint("ToBeDeletedByClusterAutoscaler")],
        &[],
        &[],
    );
    assert_eq!(touched(&p.take_changes()), set(&["plan/node-a"]));
}

#[test]
fn plans_carry_the_endpoint_slice_trigger_time() {
    // kube-proxy measures network programming latency from the EndpointSlice's
    // `endpoints.kubernetes.io/last-change-trigger-time`; the plans carry it to the agent.
    const ANNOTATION: &str = "proxyplan.dev/last-change-trigger-time";
    let trigger = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION))
            .cloned()
    };
    let svc = web_node_port().etp("Local");
    let slice = |time: &str, node: &str| {
        web_slice("web-1", vec![ep("10.0.0.1").on(node)]).triggered_at(time)
    };
    let mut p = cluster(
        std::slice::from_ref(&svc),
        &[slice("2026-11-25T10:00:00.123456789Z", "node-a")],
    );
    let (plan, services) = p.node_view("node-a").expect("plan");
    assert_eq!(
        trigger(&services[0].metadata).as_deref(),
        Some("2026-11-25T10:00:00.123456789Z")
    );
    assert_eq!(
        trigger(&plan.metadata).as_deref(),
        Some("2026-11-25T10:00:00.123456789Z"),
        "the node with the local endpoint"
    );
    drain(&mut p);

    // The endpoint moves: both node plans are rewritten, and say when that was triggered.
    load(
        &mut p,
        &[],
        &[],
        &[slice("2026-11-25T10:00:05.5Z", "node-b")],
    );
    let changes = p.take_changes();
    assert_eq!(
        touched(&changes),
        set(&["plan/node-a", "plan/node-b"]),
        "a Local endpoint move rewrites the two nodes only"
    );
    for object in &changes.apply {
        let meta = match object {
            DesiredObject::Plan(p) => &p.metadata,
            DesiredObject::Service(s) => &s.metadata,
        };
        assert_eq!(
            trigger(meta).as_deref(),
            Some("2026-11-25T10:00:05.5Z"),
            "{}",
            object.name()
        );
    }

    // A change of the Service alone keeps the slice's time (the agent measures each time
    // once: kube-proxy does not measure Service changes).
    load(
        &mut p,
        &[],
        &[svc.clone().external_ips(&["203.0.113.7"])],
        &[],
    );
    let changes = p.take_changes();
    assert_eq!(touched(&changes), set(&["service/default/web"]));
    let DesiredObject::Service(written) = &changes.apply[0] else {
        panic!("the Service plan");
    };
    assert_eq!(
        trigger(&written.metadata).as_deref(),
        Some("2026-11-25T10:00:05.5Z")
    );

    // An unreadable time is no time, as in kube-proxy.
    let p = cluster(&[svc], &[slice("not a time", "node-a")]);
    let (plan, services) = p.node_view("node-a").expect("plan");
    assert_eq!(trigger(&services[0].metadata), None);
    assert_eq!(trigger(&plan.metadata), None);
}

#[test]
fn node_plans_carry_the_clusters_service_cidrs() {
    // kube-proxy's nftables mode drops traffic to unallocated Service IPs of the
    // ServiceCIDRs it watches; every node plan carries their union.
    let mut p = planner();
    load(&mut p, &[mk_node("node-a"), mk_node("node-b")], &[], &[]);
    drain(&mut p);
    let cidrs = |p: &Planner| p.node_view("node-a").expect("plan").0.spec.service_cidrs;
    assert!(cidrs(&p).is_empty());
    p.apply_service_cidr(
        "kubernetes",
        &["10.96.0.0/12".into(), "fd00:10:96::/108".into()],
    )
    .expect("valid");
    assert_eq!(
        touched(&p.take_changes()),
        set(&["plan/node-a", "plan/node-b"])
    );
    p.apply_service_cidr("extra", &["10.96.0.0/12".into(), "10.100.0.5/16".into()])
        .expect("valid");
    assert_eq!(
        cidrs(&p),
        ["10.100.0.0/16", "10.96.0.0/12", "fd00:10:96::/108"],
        "the union, normalised"
    );
    drain(&mut p);
    let err = p
        .apply_service_cidr("bad", &["10.0.0.0/33".into()])
        .expect_err("refused");
    assert!(err.to_string().contains("spec.cidrs[0]"), "{err}");
    assert!(p.take_changes().is_empty(), "nothing changed");
    p.delete_service_cidr("extra");
    assert_eq!(cidrs(&p), ["10.96.0.0/12", "fd00:10:96::/108"]);
    assert_eq!(
        touched(&p.take_changes()),
        set(&["plan/node-a", "plan/node-b"])
    );
}

#[test]
fn deleted_node_loses_its_plan() {
    let mut p = cluster(&[web()], &[]);
    drain(&mut p);
    p.delete_node("node-a");
    let changes = p.take_changes();
    assert!(changes.apply.is_empty());
    assert!(deleted(&changes).contains(&ObjectId::Plan("node-a".to_owned())));
    assert_eq!(deleted(&changes).len(), 1);
    assert!(p.node_view("node-a").is_none());

    // The last node of zone-3: nothing else goes (nothing is per zone).
    p.delete_node("node-e");
    let gone = deleted(&p.take_changes());
    assert_eq!(gone, [ObjectId::Plan("node-e".to_owned())].into());
}

#[test]
fn node_plan_identity() {
    let p = cluster(&[], &[]);
    let (plan, _) = p.node_view("node-a").unwrap_or_else(|| panic!("no plan"));
    assert_eq!(plan.metadata.name.as_deref(), Some("node-a"));
    assert_eq!(plan.spec.node_name, "node-a");
    let owner = plan
        .metadata
        .owner_references
        .as_deref()
        .and_then(<[_]>::first)
        .unwrap_or_else(|| panic!("no owner reference"));
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Node", "node-a", "uid-node-a")
    );
    assert!(p.node_view("no-such-node").is_none());
}

// ---------------------------------------------------------------------------------------
// Incremental planning: what an event writes (DESIGN §2 invariants 2 and 3)

#[test]
fn unrelated_events_write_nothing() {
    let slices = [web_slice(
        "web-1",
        vec![ep("10.0.0.1").on("node-a"), ep("10.0.0.3").on("node-c")],
    )];
    let mut p = cluster(&[web_node_port().etp("Local")], &slices);
    let first = p.take_changes();
    assert!(!first.is_empty());
    assert!(p.take_changes().is_empty(), "take_changes drains");

    type Event = Box<dyn Fn(&mut Planner)>;
    let events: Vec<(&str, Event)> = vec![
        (
            "node heartbeat",
            Box::new(|p| {
                load(
                    p,
                    &[mk_node("node-a").zone("zone-1").heartbeat(10)],
                    &[],
                    &[],
                )
            }),
        ),
        (
            "unrelated node label",
            Box::new(|p| {
                load(
                    p,
                    &[mk_node("node-a").zone("zone-1").label("team", "blue")],
                    &[],
                    &[],
                );
            }),
        ),
        (
            "identical Service, new resourceVersion",
            Box::new(|p| {
                let svc = web_node_port()
                    .etp("Local")
                    .with(|s| s.metadata.resource_version = Some("77".to_owned()));
                load(p, &[], &[svc], &[]);
            }),
        ),
        (
            "Service annotation only",
            Box::new(|p| {
                let svc = web_node_port().etp("Local").with(|s| {
                    s.metadata.annotations =
                        Some([("note".to_owned(), "x".to_owned())].into_iter().collect());
                });
                load(p, &[], &[svc], &[]);
            }),
        ),
        (
            "identical EndpointSlice",
            Box::new(|p| {
                let slice = web_slice(
                    "web-1",
                    vec![ep("10.0.0.1").on("node-a"), ep("10.0.0.3").on("node-c")],
                );
                load(p, &[], &[], &[slice]);
            }),
        ),
        (
            "a slice of a Service that does not exist",
            Box::new(|p| {
                let orphan = mk_slice(
                    "ghost-1",
                    "ghost",
                    "IPv4",
                    &[("", "TCP", 80)],
                    vec![ep("10.9.9.9")],
                );
                load(p, &[], &[], &[orphan]);
            }),
        ),
        (
            "not-ready endpoint added (selection unchanged)",
            Box::new(|p| {
                let slice = web_slice(
                    "web-1",
                    vec![
                        ep("10.0.0.1").on("node-a"),
                        ep("10.0.0.3").on("node-c"),
                        ep("10.0.0.4").not_ready().on("node-b"),
                    ],
                );
                load(p, &[], &[], &[slice]);
            }),
        ),
    ];
    for (name, event) in events {
        event(&mut p);
        let changes = p.take_changes();
        assert!(changes.is_empty(), "{name}: wrote {:?}", touched(&changes));
    }
}

#[test]
fn cluster_policy_endpoint_change_writes_one_shard() {
    let mut p = cluster(
        &[
            web_node_port(),
            mk_service("api", &["10.96.0.11"], vec![tcp("http", 80)]),
        ],
        &[web_slice(
            "web-1",
            vec![ep("10.0.0.1").on("node-a"), ep("10.0.0.2").on("node-b")],
        )],
    );
    let shard = service_plan_holding(&p, "node-a", WEB);
    drain(&mut p);
    let cases = [
        (
            "endpoint added",
            vec![
                ep("10.0.0.1").on("node-a"),
                ep("10.0.0.2").on("node-b"),
                ep("10.0.0.3").on("node-c"),
            ],
        ),
        (
            "endpoint becomes terminating",
            vec![
                ep("10.0.0.1").on("node-a"),
                ep("10.0.0.2").terminating().on("node-b"),
                ep("10.0.0.3").on("node-c"),
            ],
        ),
        ("endpoint removed", vec![ep("10.0.0.1").on("node-a")]),
        ("last endpoint removed", vec![]),
    ];
    for (name, endpoints) in cases {
        load(&mut p, &[], &[], &[web_slice("web-1", endpoints)]);
        assert_eq!(touched(&p.take_changes()), set(&[&shard]), "{name}");
    }
}

#[test]
fn local_policy_endpoint_move_writes_only_the_nodes_involved() {
    let mut p = cluster(
        &[web_node_port().etp("Local")],
        &[web_slice(
            "web-1",
            vec![ep("10.0.0.1").on("node-a"), ep("10.0.0.3").on("node-c")],
        )],
    );
    let shard = service_plan_holding(&p, "node-a", WEB);
    drain(&mut p);

    // The pod on node-a is replaced by one on node-b.
    load(
        &mut p,
        &[],
        &[],
        &[web_slice(
            "web-1",
            vec![ep("10.0.0.2").on("node-b"), ep("10.0.0.3").on("node-c")],
        )],
    );
    let changes = p.take_changes();
    assert_eq!(
        touched(&changes),
        set(&["plan/node-a", "plan/node-b", &shard])
    );
    assert_eq!(entry(&view(&p, "node-a"), WEB).local_endpoints, eps(&[]));
    assert_eq!(entry(&view(&p, "node-b"), WEB).local_endpoints, eps(&[E2]));

    // node-b's pod starts terminating while node-c's is ready: the cluster list loses it,
    // node-b's local list keeps it (local fallback to serving-terminating) but is now
    // marked terminating (its health check counts none), so the shared entry and node-b
    // change.
    load(
        &mut p,
        &[],
        &[],
        &[web_slice(
            "web-1",
            vec![
                ep("10.0.0.2").terminating().on("node-b"),
                ep("10.0.0.3").on("node-c"),
            ],
        )],
    );
    assert_eq!(touched(&p.take_changes()), set(&[&shard, "plan/node-b"]));
    let merged = view(&p, "node-b");
    assert_eq!(entry(&merged, WEB).cluster_endpoints, eps(&[E3]));
    assert_eq!(entry(&merged, WEB).local_endpoints, eps(&[E2]));
    assert!(entry(&merged, WEB).local_terminating);
}

/// A zone-hinted endpoint change writes the Service's own plan (whose zone lists carry
/// it) and no node plan.
#[test]
fn zone_hint_change_writes_only_the_service_plan() {
    let hinted = |z2_ip: &str| {
        web_slice(
            "web-1",
            vec![
                ep("10.0.1.1").on("node-a").for_zones(&["zone-1"]),
                ep("10.0.1.2").on("node-b").for_zones(&["zone-1"]),
                ep(z2_ip).on("node-c").for_zones(&["zone-2"]),
            ],
        )
    };
    let mut p = cluster(&[web()], &[hinted("10.0.2.1")]);
    let shard = service_plan_holding(&p, "node-a", WEB);
    drain(&mut p);
    load(&mut p, &[], &[], &[hinted("10.0.2.2")]);
    let written = touched(&p.take_changes());
    assert_eq!(written, set(&[&shard]));
    assert_eq!(
        entry(&view(&p, "node-c"), WEB).cluster_endpoints,
        eps(&[("10.0.2.2", 8080)])
    );
}

#[test]
fn node_hint_change_writes_only_that_node() {
    let hinted = |b_ip: &str| {
        web_slice(
            "web-1",
            vec![
                ep("10.0.1.1").on("node-a").for_nodes(&["node-a"]),
                ep(b_ip).on("node-b").for_nodes(&["node-b"]),
            ],
        )
    };
    let mut p = cluster(
        &[web().traffic_distribution("PreferSameNode")],
        &[hinted("10.0.1.2")],
    );
    let shard = service_plan_holding(&p, "node-a", WEB);
    drain(&mut p);
    load(&mut p, &[], &[], &[hinted("10.0.1.3")]);
    assert_eq!(touched(&p.take_changes()), set(&["plan/node-b", &shard]));

    assert_eq!(
        entry(&view(&p, "node-b"), WEB).cluster_endpoints,
        eps(&[("10.0.1.3", 8080)])
    );
    assert_eq!(
        entry(&view(&p, "node-a"), WEB).cluster_endpoints,
        eps(&[("10.0.1.1", 8080)])
    );
}

#[test]
fn hint_reassignment_writes_only_what_carries_the_hints() {
    // Same endpoints, hints moved: zone hints live in the Service plan's zone lists (one
    // object written), node hints in the node plans concerned.
    let zoned = |second_zone: &str| {
        web_slice(
            "web-1",
            vec![
                ep("10.0.1.1").on("node-a").for_zones(&["zone-1"]),
                ep("10.0.2.1").on("node-c").for_zones(&[second_zone]),
            ],
        )
    };
    let mut p = cluster(&[web()], &[zoned("zone-2")]);
    let own = service_plan_holding(&p, "node-a", WEB);
    drain(&mut p);
    load(&mut p, &[], &[], &[zoned("zone-1")]);
    let written = touched(&p.take_changes());
    assert_eq!(written, set(&[&own]));
    assert_eq!(
        entry(&view(&p, "node-c"), WEB).cluster_endpoints,
        eps(&[("10.0.1.1", 8080), ("10.0.2.1", 8080)])
    );

    let noded = |second_node: &str| {
        web_slice(
            "web-1",
            vec![
                ep("10.0.1.1").on("node-a").for_nodes(&["node-a"]),
                ep("10.0.1.2").on("node-b").for_nodes(&[second_node]),
            ],
        )
    };
    let mut p = cluster(&[web()], &[noded("node-b")]);
    drain(&mut p);
    load(&mut p, &[], &[], &[noded("node-a")]);
    assert_eq!(
        touched(&p.take_changes()),
        set(&["plan/node-a", "plan/node-b"])
    );
    assert_eq!(
        entry(&view(&p, "node-a"), WEB).cluster_endpoints,
        eps(&[("10.0.1.1", 8080), ("10.0.1.2", 8080)])
    );
}

#[test]
fn every_written_object_merges_for_every_node() {
    // A mixed cluster: every node's view must pass the agent's validation.
    let services = [
        web_node_port().etp("Local"),
        mk_service(
            "dns",
            &["10.96.0.53", "fd00:96::53"],
            vec![udp("dns", 53), tcp("dns-tcp", 53)],
        ),
        mk_service("zoned", &["10.96.0.60"], vec![tcp("http", 80)])
            .traffic_distribution("PreferClose"),
    ];
    let slices = [
        web_slice(
            "web-1",
            vec![
                ep("10.0.0.1").on("node-a"),
                ep("10.0.0.2").terminating().on("node-c"),
            ],
        ),
        mk_slice(
            "dns-v4",
            "dns",
            "IPv4",
            &[("dns", "UDP", 53), ("dns-tcp", "TCP", 53)],
            vec![ep("10.0.5.1").on("node-b")],
        ),
        mk_slice(
            "dns-v6",
            "dns",
            "IPv6",
            &[("dns", "UDP", 53), ("dns-tcp", "TCP", 53)],
            vec![ep("fd00:5::1").on("node-b")],
        ),
        mk_slice(
            "zoned-1",
            "zoned",
            "IPv4",
            &[("http", "TCP", 8080)],
            vec![
                ep("10.0.6.1").on("node-a").for_zones(&["zone-1"]),
                ep("10.0.6.2").on("node-c").for_zones(&["zone-2"]),
            ],
        ),
    ];
    let p = cluster(&services, &slices);
    for node in ["node-a", "node-b", "node-c", "node-d", "node-e", "node-f"] {
        let merged = view(&p, node);
        assert_eq!(merged.service_ports.len(), 6, "{node}: {:?}", keys(&merged));
    }
}
