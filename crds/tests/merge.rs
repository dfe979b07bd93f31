//! `merge`: layering, the refusals that name the object and field, and the cache.

#![allow(clippy::expect_used)]

use proxyplan_crds::{
    EmptyAction, Endpoint, EndpointOverride, IpFamily, LocalTrafficDetection, LocalTrafficMode,
    MasqueradePlan, MergeCache, MergedPlan, NodeProxyPlan, NodeProxyPlanSpec, PlanError, PlanRef,
    Protocol, ServicePlanSummary, ServicePortPlan, ServiceProxyPlan, ServiceProxyPlanSpec,
    TrafficPlan, TrafficPolicy, ZoneEndpoints, merge, merge_cached, merge_owned, merge_refs,
    merge_update, object_key,
};
use std::sync::Arc;

fn ep(ip: &str, port: u16) -> Endpoint {
    Endpoint {
        ip: ip.into(),
        port,
    }
}

/// The entry of port `port` of Service `default/<service>`.
fn entry(service: &str, port: &str, cluster_ip: &str, eps: Vec<Endpoint>) -> ServicePortPlan {
    ServicePortPlan {
        key: format!("default/{service}:{port}/TCP/IPv4"),
        namespace: "default".into(),
        name: service.into(),
        port_name: port.into(),
        family: IpFamily::IPv4,
        protocol: Protocol::TCP,
        port: 80,
        cluster_ip: cluster_ip.into(),
        external_ips: vec![],
        load_balancer_ips: vec![],
        node_port: None,
        load_balancer_source_ranges: vec![],
        health_check_node_port: None,
        session_affinity: None,
        internal: TrafficPlan {
            policy: TrafficPolicy::Cluster,
            when_empty: EmptyAction::Reject,
        },
        external: None,
        cluster_endpoints: eps,
        zone_endpoints: vec![],
        local_endpoints: vec![],
        masquerade: MasqueradePlan {
            all: false,
            off_cluster_to_cluster_ip: false,
            external: false,
            local_host_to_external: false,
            hairpin: true,
        },
        local_terminating: false,
        also_serving: Vec::new(),
    }
}

fn plan(zone: Option<&str>, overlay: Vec<EndpointOverride>) -> NodeProxyPlan {
    NodeProxyPlan::new(
        "n1",
        NodeProxyPlanSpec {
            node_name: "n1".into(),
            revision: "r".into(),
            zone: zone.map(Into::into),
            pod_cidrs: vec!["10.244.1.0/24".into()],
            addresses: vec![],
            local_traffic: LocalTrafficDetection {
                mode: LocalTrafficMode::ClusterCIDR,
                cidrs: vec![],
                interface: None,
            },
            overlay,
            ineligible: None,
            service_cidrs: Vec::new(),
        },
    )
}

/// Service plan `default/<name>` (a part `web.1` belongs to Service `web`).
fn service(name: &str, entries: Vec<ServicePortPlan>) -> ServiceProxyPlan {
    let mut object = ServiceProxyPlan::new(
        name,
        ServiceProxyPlanSpec {
            revision: format!("{name}-rev"),
            service_ports: entries,
            summary: None,
        },
    );
    object.metadata.namespace = Some("default".into());
    object
}

const KEY: &str = "default/web:http/TCP/IPv4";

/// `merge`, checked against `merge_owned` (which must agree on every result and error).
fn merged(plan: &NodeProxyPlan, services: &[ServiceProxyPlan]) -> Result<MergedPlan, PlanError> {
    let copied = merge(plan, services);
    let owned = merge_owned(plan.clone(), services.to_vec());
    assert_eq!(copied, owned, "merge and merge_owned disagree");
    copied
}

fn refusals(m: &MergedPlan) -> Vec<String> {
    m.refused.iter().map(ToString::to_string).collect()
}

#[test]
fn node_overlay_wins_over_the_zone_list_over_the_entry() {
    let mut web = entry(
        "web",
        "http",
        "10.96.0.1",
        vec![ep("10.0.0.1", 80), ep("10.0.0.2", 80)],
    );
    web.zone_endpoints = vec![
        ZoneEndpoints {
            zone: "z1".into(),
            endpoints: vec![ep("10.0.0.2", 80)],
        },
        ZoneEndpoints {
            zone: "z2".into(),
            endpoints: vec![ep("10.0.0.1", 80)],
        },
    ];
    let objects = [service("web", vec![web])];
    let overlay = vec![EndpointOverride {
        key: KEY.into(),
        cluster_endpoints: None,
        local_endpoints: Some(vec![ep("10.0.0.9", 80)]),
        local_terminating: false,
    }];
    let m = merged(&plan(Some("z1"), overlay.clone()), &objects).expect("valid");
    let e = &m.service_ports[0];
    assert_eq!(e.cluster_endpoints, vec![ep("10.0.0.2", 80)]);
    assert_eq!(e.local_endpoints, vec![ep("10.0.0.9", 80)]);
    assert!(e.zone_endpoints.is_empty(), "zone lists are merged away");
    // A zone without a list, or no zone: the entry's own list.
    for zone in [Some("z9"), None] {
        let m = merged(&plan(zone, vec![]), &objects).expect("valid");
        assert_eq!(m.service_ports[0].cluster_endpoints.len(), 2, "{zone:?}");
    }
    // A node-hint override wins over the zone list.
    let hinted = vec![EndpointOverride {
        key: KEY.into(),
        cluster_endpoints: Some(vec![ep("10.0.0.1", 80)]),
        local_endpoints: None,
        local_terminating: false,
    }];
    let m = merged(&plan(Some("z1"), hinted), &objects).expect("valid");
    assert_eq!(
        m.service_ports[0].cluster_endpoints,
        vec![ep("10.0.0.1", 80)]
    );
}

#[test]
fn a_udp_entry_keeps_the_endpoints_its_zone_or_node_leaves_out_as_serving() {
    // Conntrack clean-up ignores topology (kube-proxy's `conntrack/cleanup.go`): the
    // endpoints a zone or node list leaves out still serve, and their UDP flows stay.
    let mut dns = entry(
        "dns",
        "dns",
        "10.96.0.53",
        vec![ep("10.0.0.1", 53), ep("10.0.0.2", 53), ep("10.0.0.3", 53)],
    );
    dns.key = "default/dns:dns/UDP/IPv4".into();
    dns.protocol = Protocol::UDP;
    dns.also_serving = vec![ep("10.0.0.4", 53)];
    dns.zone_endpoints = vec![ZoneEndpoints {
        zone: "z1".into(),
        endpoints: vec![ep("10.0.0.1", 53), ep("10.0.0.2", 53)],
    }];
    let tcp = {
        let mut e = dns.clone();
        e.key = "default/dns:dns/TCP/IPv4".into();
        e.protocol = Protocol::TCP;
        e.also_serving = vec![];
        e
    };
    let objects = [service("dns", vec![tcp, dns])];
    let m = merged(&plan(Some("z1"), vec![]), &objects).expect("valid");
    let udp = &m.service_ports[1];
    assert_eq!(
        udp.cluster_endpoints,
        vec![ep("10.0.0.1", 53), ep("10.0.0.2", 53)]
    );
    assert_eq!(
        udp.also_serving,
        vec![ep("10.0.0.4", 53), ep("10.0.0.3", 53)]
    );
    assert!(
        m.service_ports[0].also_serving.is_empty(),
        "TCP: not needed"
    );

    let hinted = vec![EndpointOverride {
        key: "default/dns:dns/UDP/IPv4".into(),
        cluster_endpoints: Some(vec![ep("10.0.0.2", 53)]),
        local_endpoints: None,
        local_terminating: false,
    }];
    let m = merged(&plan(Some("z1"), hinted), &objects).expect("valid");
    let udp = &m.service_ports[1];
    assert_eq!(udp.cluster_endpoints, vec![ep("10.0.0.2", 53)]);
    let mut serving = udp.also_serving.clone();
    serving.sort();
    assert_eq!(
        serving,
        vec![ep("10.0.0.1", 53), ep("10.0.0.3", 53), ep("10.0.0.4", 53)]
    );
}

#[test]
fn a_node_plan_with_a_bad_interface_or_service_cidr_is_refused() {
    let mut p = plan(None, vec![]);
    p.spec.local_traffic.mode = LocalTrafficMode::InterfaceNamePrefix;
    let err = merged(&p, &[]).expect_err("no interface");
    assert!(
        err.to_string()
            .contains("spec.localTraffic.interface: missing"),
        "{err}"
    );
    p.spec.local_traffic.interface = Some("veth+ -j ACCEPT".into());
    let err = merged(&p, &[]).expect_err("bad interface");
    assert!(
        err.to_string().contains("spec.localTraffic.interface"),
        "{err}"
    );
    p.spec.local_traffic.interface = Some("veth".into());
    p.spec.service_cidrs = vec!["10.96.0.0/12".into(), "10.96.0.0/99".into()];
    let err = merged(&p, &[]).expect_err("bad CIDR");
    assert!(err.to_string().contains("spec.serviceCIDRs[1]"), "{err}");
    p.spec.service_cidrs.pop();
    let m = merged(&p, &[]).expect("valid");
    assert_eq!(m.service_cidrs, ["10.96.0.0/12"]);
    assert_eq!(m.local_traffic.interface.as_deref(), Some("veth"));
}

#[test]
fn a_bad_node_plan_is_refused_whole() {
    let mut p = plan(None, vec![]);
    p.spec.pod_cidrs = vec!["10.0.0.0/40".into()];
    let err = merged(&p, &[]).expect_err("bad CIDR");
    assert_eq!(
        err.to_string(),
        "NodeProxyPlan/n1: spec.podCIDRs[0]: \"10.0.0.0/40\" is not a CIDR"
    );
    assert_eq!(err.label(), "invalid_field");
    let bad_key = vec![EndpointOverride {
        key: "default/web:http/TCP/IPv4\n-A INPUT -j ACCEPT".into(),
        cluster_endpoints: None,
        local_endpoints: Some(vec![]),
        local_terminating: false,
    }];
    let err = merged(&plan(None, bad_key), &[]).expect_err("bad key");
    assert!(
        err.to_string()
            .starts_with("NodeProxyPlan/n1: spec.overlay[0].key: \"default/web:http/TCP/IPv4\\n"),
        "{err}"
    );
}

#[test]
fn a_bad_service_plan_is_refused_alone_naming_the_object_and_field() {
    let good = service("good", vec![entry("good", "http", "10.96.0.2", vec![])]);
    let cases: Vec<(&str, ServicePortPlan, &str)> = vec![
        (
            "family",
            entry(
                "web",
                "http",
                "10.96.0.1",
                vec![ep("10.0.0.1", 80), ep("fd00::1", 80)],
            ),
            "spec.servicePorts[0].clusterEndpoints[1].ip: fd00::1 is not an IPv4 address",
        ),
        (
            "duplicate endpoint",
            entry(
                "web",
                "http",
                "10.96.0.1",
                vec![ep("10.0.0.1", 80), ep("10.0.0.1", 80)],
            ),
            "spec.servicePorts[0].clusterEndpoints[1]: duplicate endpoint 10.0.0.1:80",
        ),
        (
            "node port",
            ServicePortPlan {
                node_port: Some(0),
                ..entry("web", "http", "10.96.0.1", vec![])
            },
            "spec.servicePorts[0].nodePort: port must be between 1 and 65535",
        ),
        (
            "loopback endpoint",
            entry("web", "http", "10.96.0.1", vec![ep("127.0.0.1", 80)]),
            "spec.servicePorts[0].clusterEndpoints[0].ip: 127.0.0.1 is a loopback address",
        ),
        (
            "link-local VIP",
            ServicePortPlan {
                external_ips: vec!["169.254.169.254".into()],
                ..entry("web", "http", "10.96.0.1", vec![])
            },
            "spec.servicePorts[0].externalIPs[0]: 169.254.169.254 is a link-local or broadcast address",
        ),
        (
            "unspecified cluster IP",
            entry("web", "http", "0.0.0.0", vec![]),
            "spec.servicePorts[0].clusterIP: 0.0.0.0 is the unspecified address",
        ),
        (
            "quote in a port name",
            ServicePortPlan {
                key: "default/web:ht\"tp/TCP/IPv4".into(),
                port_name: "ht\"tp".into(),
                ..entry("web", "http", "10.96.0.1", vec![])
            },
            "spec.servicePorts[0].key: \"default/web:ht\\\"tp/TCP/IPv4\" is not a service port key",
        ),
        (
            "key that does not match the fields",
            ServicePortPlan {
                key: "default/web:https/TCP/IPv4".into(),
                ..entry("web", "http", "10.96.0.1", vec![])
            },
            "spec.servicePorts[0].key: \"default/web:https/TCP/IPv4\" does not match",
        ),
        (
            "another Service's entry",
            entry("other", "http", "10.96.0.1", vec![]),
            "spec.servicePorts[0].key: default/other:http/TCP/IPv4 belongs to Service default/other",
        ),
    ];
    for (name, bad, expected) in cases {
        let objects = [service("web", vec![bad]), good.clone()];
        let m = merged(&plan(None, vec![]), &objects).expect("the node plan is fine");
        let refused = refusals(&m);
        assert_eq!(refused.len(), 1, "{name}: {refused:?}");
        assert!(
            refused[0].starts_with(&format!("ServiceProxyPlan/default/web: {expected}")),
            "{name}: {}",
            refused[0]
        );
        let keys: Vec<&str> = m.service_ports.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            ["default/good:http/TCP/IPv4"],
            "{name}: the rest merges"
        );
    }
}

#[test]
fn an_overlay_without_its_entry_is_left_out_and_named() {
    let overlay = vec![EndpointOverride {
        key: KEY.into(),
        cluster_endpoints: None,
        local_endpoints: Some(vec![ep("10.0.0.9", 80)]),
        local_terminating: false,
    }];
    let m = merged(&plan(None, overlay), &[]).expect("valid");
    assert!(m.service_ports.is_empty());
    assert_eq!(m.unmatched, [KEY]);
}

#[test]
fn a_key_in_two_parts_of_one_service_keeps_the_first() {
    let a = service("web", vec![entry("web", "http", "10.96.0.1", vec![])]);
    let b = service(
        "web.1",
        vec![
            entry("web", "a", "10.96.0.1", vec![]),
            entry("web", "http", "10.96.0.3", vec![]),
        ],
    );
    let m = merged(&plan(None, vec![]), &[a, b]).expect("valid");
    assert_eq!(m.service_ports.len(), 2);
    assert_eq!(
        m.service_ports
            .iter()
            .find(|e| e.key == KEY)
            .map(|e| e.cluster_ip.as_str()),
        Some("10.96.0.1")
    );
    assert_eq!(
        refusals(&m),
        [format!(
            "ServiceProxyPlan/default/web.1: spec.servicePorts[1].key: duplicate key {KEY}: left out"
        )]
    );
}

fn find<'a>(merged: &'a MergedPlan, key: &str) -> &'a Arc<ServicePortPlan> {
    merged
        .service_ports
        .iter()
        .find(|e| e.key == key)
        .expect("entry")
}

fn versioned(mut object: ServiceProxyPlan, version: &str) -> ServiceProxyPlan {
    object.metadata.resource_version = Some(version.into());
    object
}

/// A caller that keeps only the identity of the objects the cache holds merges as if
/// it kept them; an identity whose version the cache does not hold is refused, named.
#[test]
fn held_identities_merge_like_the_objects() {
    let one = versioned(
        service(
            "web",
            vec![entry("web", "http", "10.96.0.1", vec![ep("10.0.0.1", 80)])],
        ),
        "1",
    );
    let p = plan(None, Vec::new());
    let mut cache = MergeCache::keeping_unnamed();
    assert!(cache.hold(&one, None));
    let held = PlanRef::Held {
        key: "default/web",
        version: "1",
        revision: &one.spec.revision,
    };
    let merged = merge_refs(&p, &[held], &mut cache).expect("merges");
    assert_eq!(
        merged,
        merge(&p, std::slice::from_ref(&one)).expect("merges")
    );

    let unknown = PlanRef::Held {
        key: "default/web",
        version: "7",
        revision: &one.spec.revision,
    };
    let merged = merge_refs(&p, &[unknown], &mut cache).expect("merges");
    assert!(merged.service_ports.is_empty());
    assert_eq!(merged.refused.len(), 1);
    let text = merged.refused[0].to_string();
    assert!(
        text.starts_with("ServiceProxyPlan/default/web: metadata.resourceVersion"),
        "{text}"
    );
}

#[test]
fn merge_cached_shares_unchanged_entries_and_checks_changed_objects_again() {
    let other = "default/other:http/TCP/IPv4";
    let one = versioned(
        service(
            "web",
            vec![entry("web", "http", "10.96.0.1", vec![ep("10.0.0.1", 80)])],
        ),
        "1",
    );
    let two = versioned(
        service(
            "other",
            vec![entry(
                "other",
                "http",
                "10.96.0.2",
                vec![ep("10.0.0.2", 80)],
            )],
        ),
        "1",
    );
    let overlay = vec![EndpointOverride {
        key: other.into(),
        cluster_endpoints: None,
        local_endpoints: Some(vec![ep("10.0.0.2", 80)]),
        local_terminating: false,
    }];
    let p = plan(None, overlay);
    let mut cache = MergeCache::new();
    let first = merge_cached(&p, &[one.clone(), two.clone()], &mut cache).expect("merges");
    assert_eq!(
        first,
        merge(&p, &[one.clone(), two.clone()]).expect("merges")
    );
    assert_eq!(cache.len(), 2);

    // web changes: its entry is new, and the overlaid entry of other is a copy made by
    // this merge (the cached one keeps the object's content).
    let mut changed = one.clone();
    changed.spec.service_ports[0]
        .cluster_endpoints
        .push(ep("10.0.0.3", 80));
    changed.spec.revision = "web-rev-2".into();
    let changed = versioned(changed, "2");
    let second = merge_cached(&p, &[changed.clone(), two.clone()], &mut cache).expect("merges");
    assert_eq!(second, merge(&p, &[changed, two.clone()]).expect("merges"));
    assert!(!Arc::ptr_eq(find(&first, KEY), find(&second, KEY)));
    assert_ne!(first.services_fingerprint, second.services_fingerprint);
    assert_eq!(find(&second, other).local_endpoints, [ep("10.0.0.2", 80)]);

    // Nothing changes: the unchanged object's entries are the same allocations.
    let plain = plan(None, vec![]);
    let third = merge_cached(&plain, &[one.clone(), two.clone()], &mut cache).expect("merges");
    let fourth = merge_cached(&plain, &[two.clone(), one.clone()], &mut cache).expect("merges");
    assert!(Arc::ptr_eq(find(&third, KEY), find(&fourth, KEY)));
    assert!(Arc::ptr_eq(find(&third, other), find(&fourth, other)));
    assert_eq!(third.services_fingerprint, fourth.services_fingerprint);
    assert!(
        find(&third, other).local_endpoints.is_empty(),
        "the overlay stays out of the cache"
    );

    // A bad new version of a cached object is refused, and its last good version stays.
    let mut bad = one.clone();
    bad.spec.service_ports[0].cluster_ip = "10.96.0".into();
    let bad = versioned(bad, "3");
    let kept = merge_cached(&plain, &[bad.clone(), two.clone()], &mut cache).expect("merges");
    assert!(
        Arc::ptr_eq(find(&kept, KEY), find(&third, KEY)),
        "last good"
    );
    let refused = refusals(&kept);
    assert_eq!(refused.len(), 1);
    assert!(
        refused[0].contains("ServiceProxyPlan/default/web: spec.servicePorts[0].clusterIP"),
        "{refused:?}"
    );
    // Still refused (without checking again) while that version stays.
    let again = merge_cached(&plain, &[bad, two.clone()], &mut cache).expect("merges");
    assert_eq!(refusals(&again), refused);
    assert_eq!(again.services_fingerprint, third.services_fingerprint);

    // Objects no longer given leave the cache.
    merge_cached(&plain, &[two], &mut cache).expect("merges");
    assert_eq!(cache.len(), 1);
}

#[test]
fn the_last_object_of_a_name_is_merged() {
    let first = service("web", vec![entry("web", "http", "10.96.0.1", vec![])]);
    let last = service("web", vec![entry("web", "http", "10.96.0.2", vec![])]);
    let m = merged(&plan(None, vec![]), &[first, last]).expect("valid");
    assert_eq!(m.service_ports.len(), 1);
    assert_eq!(m.service_ports[0].cluster_ip, "10.96.0.2");
}

/// A small deterministic generator (no dependency needed for a reproducible sequence).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        usize::try_from(self.0 >> 33).unwrap_or(0) % n.max(1)
    }
}

#[test]
fn merge_cached_over_many_changes_equals_a_fresh_merge() {
    let mut rng = Lcg(7);
    let svc = |n: usize| format!("svc-{n:03}");
    let mut objects: Vec<ServiceProxyPlan> = (0..40)
        .map(|n| {
            let entries = (0..1 + n % 3)
                .map(|p| {
                    entry(
                        &svc(n),
                        &format!("p{p}"),
                        "10.96.0.1",
                        vec![ep("10.0.0.1", 80)],
                    )
                })
                .collect();
            versioned(service(&svc(n), entries), "1")
        })
        .collect();
    let mut version = 1;
    let mut cache = MergeCache::new();
    // A second cache kept up to date object by object, as the agent's.
    let mut updated = MergeCache::new();
    let mut updates = 0;
    let mut duplicates = 0;
    // A part that duplicates a key is taken out again at the next step.
    let mut duplicate_part: Option<String> = None;
    let mut edits: u16 = 1000;
    let mut overlay_key = String::new();
    let mut zone = "z1";
    for step in 0..300 {
        let before: std::collections::BTreeMap<String, String> = objects
            .iter()
            .map(|o| {
                (
                    object_key(o),
                    o.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect();
        if let Some(part) = duplicate_part.take() {
            objects.retain(|o| o.metadata.name.as_deref() != Some(part.as_str()));
        }
        // Change one or two objects: add, drop or edit entries and zone lists, reorder
        // them, add or remove objects, and now and then a second part duplicating a key.
        for _ in 0..=rng.below(2) {
            version += 1;
            let at = rng.below(objects.len());
            let name = objects[at].metadata.name.clone().unwrap_or_default();
            let base = name.split('.').next().unwrap_or_default().to_owned();
            let taken: Vec<String> = objects
                .iter()
                .filter_map(|o| o.metadata.name.clone())
                .collect();
            let len = objects[at].spec.service_ports.len();
            let count = objects.len();
            match rng.below(12) {
                0 | 1 => {
                    let port = format!("q{}", rng.below(50));
                    let list = &mut objects[at].spec.service_ports;
                    if !list.iter().any(|e| e.port_name == port) {
                        list.push(entry(&base, &port, "10.96.0.1", vec![]));
                    }
                }
                2 if len > 0 => {
                    let i = rng.below(len);
                    objects[at].spec.service_ports.remove(i);
                }
                3..=5 if len > 0 => {
                    let i = rng.below(len);
                    edits += 1;
                    objects[at].spec.service_ports[i]
                        .cluster_endpoints
                        .push(ep("10.0.0.9", edits));
                }
                6 if len > 0 => {
                    let i = rng.below(len);
                    edits += 1;
                    let zone = ["z1", "z2"][rng.below(2)];
                    objects[at].spec.service_ports[i].zone_endpoints = vec![ZoneEndpoints {
                        zone: zone.into(),
                        endpoints: vec![ep("10.0.0.7", edits)],
                    }];
                }
                7 if !name.contains('.') && len > 0 && !taken.contains(&format!("{base}.1")) => {
                    let copy = objects[at].spec.service_ports[rng.below(len)].clone();
                    let mut part = service(&format!("{base}.1"), vec![copy]);
                    part.metadata.resource_version = Some(version.to_string());
                    objects.push(part);
                    duplicate_part = Some(format!("{base}.1"));
                    duplicates += 1;
                }
                8 if count > 10 => {
                    objects.remove(at);
                    continue;
                }
                9 => {
                    let n = 100 + rng.below(100);
                    if !taken.contains(&svc(n)) {
                        let entries = vec![entry(&svc(n), "p0", "10.96.0.1", vec![])];
                        let mut fresh = service(&svc(n), entries);
                        fresh.metadata.resource_version = Some(version.to_string());
                        objects.push(fresh);
                    }
                    continue;
                }
                _ => objects[at].spec.service_ports.reverse(),
            }
            objects[at].metadata.resource_version = Some(version.to_string());
        }
        if step % 10 == 0 {
            let all: Vec<&ServicePortPlan> =
                objects.iter().flat_map(|s| &s.spec.service_ports).collect();
            overlay_key = all
                .get(rng.below(all.len()))
                .map_or_else(String::new, |e| e.key.clone());
        }
        if step % 60 == 59 {
            zone = if zone == "z1" { "z2" } else { "z1" };
        }
        if step % 40 == 39 {
            objects.reverse();
        }
        let overlay = (!overlay_key.is_empty())
            .then(|| EndpointOverride {
                key: overlay_key.clone(),
                cluster_endpoints: None,
                local_endpoints: Some(vec![ep("10.0.0.5", 80)]),
                local_terminating: false,
            })
            .into_iter()
            .collect();
        let mut p = plan(Some(zone), overlay);
        p.metadata.resource_version = Some(format!("p{}", step / 10));
        let fresh = merge(&p, &objects).expect("the node plan is fine");
        let cached = merge_cached(&p, &objects, &mut cache).expect("the node plan is fine");
        assert_eq!(fresh, cached, "step {step}");
        let after: std::collections::BTreeMap<String, String> = objects
            .iter()
            .map(|o| {
                (
                    object_key(o),
                    o.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect();
        let changed: Vec<String> = before
            .keys()
            .chain(after.keys())
            .filter(|k| before.get(*k) != after.get(*k))
            .cloned()
            .collect();
        let lookup = |key: &str| {
            objects
                .iter()
                .find(|o| object_key(o) == key)
                .map(PlanRef::Object)
        };
        let incremental = match merge_update(&p, lookup, &changed, &mut updated) {
            Some(result) => {
                updates += 1;
                result
            }
            None => merge_cached(&p, &objects, &mut updated),
        }
        .expect("the node plan is fine");
        assert_eq!(fresh, incremental, "step {step}: updated by {changed:?}");
    }
    assert!(duplicates > 3, "{duplicates} duplicate parts made");
    println!("{updates} of 300 merges were updates, {duplicates} duplicate parts");
    assert!(updates > 150, "{updates} merges were updates");
}

#[test]
fn an_unchanged_override_of_an_unchanged_entry_is_the_same_allocation() {
    let web = versioned(
        service(
            "web",
            vec![entry("web", "http", "10.96.0.1", vec![ep("10.0.0.1", 80)])],
        ),
        "1",
    );
    let with_overlay = |version: &str, port: u16| {
        let mut p = plan(
            None,
            vec![EndpointOverride {
                key: KEY.into(),
                cluster_endpoints: Some(vec![ep("10.0.0.2", port)]),
                local_endpoints: None,
                local_terminating: false,
            }],
        );
        p.metadata.resource_version = Some(version.into());
        p
    };
    let mut cache = MergeCache::new();
    let objects = [web];
    let first = merge_cached(&with_overlay("7", 80), &objects, &mut cache).expect("merges");
    let second = merge_cached(&with_overlay("7", 80), &objects, &mut cache).expect("merges");
    assert!(Arc::ptr_eq(find(&first, KEY), find(&second, KEY)));
    assert_eq!(find(&second, KEY).cluster_endpoints, [ep("10.0.0.2", 80)]);
    // A new version of the node plan is applied again.
    let third = merge_cached(&with_overlay("8", 81), &objects, &mut cache).expect("merges");
    assert_eq!(find(&third, KEY).cluster_endpoints, [ep("10.0.0.2", 81)]);
}

/// The columns `kubectl get serviceproxyplans` shows: every port once (node port after a
/// colon), the cluster IPs, the distinct endpoint addresses, the policies, and what
/// happens without endpoints.
#[test]
fn summary_is_what_a_person_looks_for_first() {
    let mut http = entry(
        "web",
        "http",
        "10.96.0.10",
        vec![ep("10.244.1.5", 8080), ep("10.244.2.5", 8080)],
    );
    http.node_port = Some(30080);
    http.external = Some(TrafficPlan {
        policy: TrafficPolicy::Local,
        when_empty: EmptyAction::Drop,
    });
    let mut metrics = entry("web", "metrics", "10.96.0.10", vec![ep("10.244.1.5", 9090)]);
    metrics.port = 9090;
    metrics.protocol = Protocol::UDP;
    let mut v6 = entry("web", "http", "fd00::10", vec![ep("fd00:244::5", 8080)]);
    v6.family = IpFamily::IPv6;
    v6.node_port = Some(30080);
    let summary = ServicePlanSummary::of(&[http, metrics, v6]);
    assert_eq!(
        summary,
        ServicePlanSummary {
            ports: "80:30080/TCP,9090/UDP".into(),
            cluster_ips: "10.96.0.10,fd00::10".into(),
            endpoints: 3,
            policy: "Cluster/Local".into(),
        }
    );
    // A Service of 200 node ports fits the schema's 1,024 bytes, saying what it left out.
    let many: Vec<ServicePortPlan> = (0..200u16)
        .map(|i| {
            let mut e = entry("many", &format!("p{i}"), "10.96.0.20", vec![]);
            e.port = 10_000 + i;
            e.node_port = Some(30_000 + i);
            e
        })
        .collect();
    let ports = ServicePlanSummary::of(&many).ports;
    assert!(ports.len() <= 1024, "{} bytes", ports.len());
    assert!(
        ports.starts_with("10000:30000/TCP,10001:30001/TCP,"),
        "{ports}"
    );
    assert!(ports.ends_with(" more") && ports.contains(",+"), "{ports}");
    let empty = ServicePlanSummary::of(&[entry("empty", "http", "10.96.0.14", vec![])]);
    assert_eq!(
        (empty.endpoints, empty.policy.as_str()),
        (0, "Cluster, no endpoints: Reject")
    );
}
