//! `merge`: layering and the errors that name the object and field.

#![allow(clippy::expect_used)]

use proxyplan_crds::{
    EmptyAction, Endpoint, EndpointOverride, IpFamily, LocalTrafficDetection, LocalTrafficMode,
    MasqueradePlan, MergeCache, MergedPlan, NodeProxyPlan, NodeProxyPlanSpec, PlanError, Protocol,
    ProxyPlanShard, ProxyPlanShardSpec, ServicePortPlan, ShardRef, ShardScope, TrafficPlan,
    TrafficPolicy, merge, merge_cached, merge_owned,
};
use std::sync::Arc;

fn ep(ip: &str, port: u16) -> Endpoint {
    Endpoint {
        ip: ip.into(),
        port,
    }
}

fn entry(key: &str, cluster_ip: &str, eps: Vec<Endpoint>) -> ServicePortPlan {
    ServicePortPlan {
        key: key.into(),
        namespace: "default".into(),
        name: "web".into(),
        port_name: "http".into(),
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
        local_endpoints: vec![],
        masquerade: MasqueradePlan {
            all: false,
            off_cluster_to_cluster_ip: false,
            external: false,
            local_host_to_external: false,
            hairpin: true,
        },
    }
}

fn plan(shards: &[&str], overlay: Vec<EndpointOverride>) -> NodeProxyPlan {
    NodeProxyPlan::new(
        "n1",
        NodeProxyPlanSpec {
            node_name: "n1".into(),
            revision: "r".into(),
            zone: Some("z1".into()),
            pod_cidrs: vec!["10.244.1.0/24".into()],
            addresses: vec![],
            local_traffic: LocalTrafficDetection {
                mode: LocalTrafficMode::ClusterCIDR,
                cidrs: vec![],
            },
            shards: shards
                .iter()
                .map(|s| ShardRef { name: (*s).into() })
                .collect(),
            overlay,
        },
    )
}

fn cluster_shard(name: &str, entries: Vec<ServicePortPlan>) -> ProxyPlanShard {
    ProxyPlanShard::new(
        name,
        ProxyPlanShardSpec {
            scope: ShardScope::Cluster,
            zone: None,
            revision: format!("{name}-rev"),
            service_ports: entries,
            overrides: vec![],
        },
    )
}

fn zone_shard(name: &str, zone: &str, overrides: Vec<EndpointOverride>) -> ProxyPlanShard {
    ProxyPlanShard::new(
        name,
        ProxyPlanShardSpec {
            scope: ShardScope::Zone,
            zone: Some(zone.into()),
            revision: format!("{name}-rev"),
            service_ports: vec![],
            overrides,
        },
    )
}

const KEY: &str = "default/web:http/TCP/IPv4";

/// `merge`, checked against `merge_owned` (which must agree on every result and error).
fn merged(plan: &NodeProxyPlan, shards: &[ProxyPlanShard]) -> Result<MergedPlan, PlanError> {
    let copied = merge(plan, shards);
    let owned = merge_owned(plan.clone(), shards.to_vec());
    assert_eq!(copied, owned, "merge and merge_owned disagree");
    copied
}

#[test]
fn node_overlay_wins_over_zone_over_cluster() {
    let cluster = cluster_shard(
        "cluster-0",
        vec![entry(
            KEY,
            "10.96.0.1",
            vec![ep("10.0.0.1", 80), ep("10.0.0.2", 80)],
        )],
    );
    let zone = zone_shard(
        "zone-z1-0",
        "z1",
        vec![EndpointOverride {
            key: KEY.into(),
            cluster_endpoints: Some(vec![ep("10.0.0.2", 80)]),
            local_endpoints: None,
        }],
    );
    let p = plan(
        &["cluster-0", "zone-z1-0"],
        vec![EndpointOverride {
            key: KEY.into(),
            cluster_endpoints: None,
            local_endpoints: Some(vec![ep("10.0.0.9", 80)]),
        }],
    );
    let m = merged(&p, &[cluster.clone(), zone.clone()]).expect("valid");
    assert_eq!(
        m.service_ports[0].cluster_endpoints,
        vec![ep("10.0.0.2", 80)]
    );
    assert_eq!(m.service_ports[0].local_endpoints, vec![ep("10.0.0.9", 80)]);
    assert_eq!(
        m.shard_revisions.get("zone-z1-0").map(String::as_str),
        Some("zone-z1-0-rev")
    );
    // Shards the plan does not name are ignored.
    let other = cluster_shard("cluster-9", vec![entry("x/y:/TCP/IPv4", "bad", vec![])]);
    assert!(merged(&p, &[cluster, zone, other]).is_ok());
}

#[test]
fn errors_name_the_object_and_the_field() {
    let bad_ip = cluster_shard(
        "cluster-0",
        vec![entry(
            KEY,
            "10.96.0.1",
            vec![ep("10.0.0.1", 80), ep("fd00::1", 80)],
        )],
    );
    let err = merged(&plan(&["cluster-0"], vec![]), &[bad_ip]).expect_err("family mismatch");
    assert_eq!(
        err.to_string(),
        "ProxyPlanShard/cluster-0: spec.servicePorts[0].clusterEndpoints[1].ip: fd00::1 is not an IPv4 address"
    );
    assert_eq!(err.label(), "invalid_field");

    let err = merged(
        &plan(&["cluster-0", "cluster-1"], vec![]),
        &[cluster_shard("cluster-0", vec![])],
    )
    .expect_err("missing");
    assert_eq!(
        err,
        PlanError::MissingShard {
            plan: "n1".into(),
            index: 1,
            shard: "cluster-1".into()
        }
    );

    let dangling = vec![EndpointOverride {
        key: "nope".into(),
        cluster_endpoints: None,
        local_endpoints: Some(vec![]),
    }];
    let err = merged(
        &plan(&["cluster-0"], dangling),
        &[cluster_shard("cluster-0", vec![])],
    )
    .expect_err("dangling");
    assert_eq!(
        err.to_string(),
        "NodeProxyPlan/n1: spec.overlay[0].key: no service port nope"
    );

    let wrong_zone = zone_shard("zone-z2-0", "z2", vec![]);
    let err = merged(&plan(&["zone-z2-0"], vec![]), &[wrong_zone]).expect_err("zone");
    assert!(
        err.to_string()
            .starts_with("ProxyPlanShard/zone-z2-0: spec.zone: zone Some(\"z2\")"),
        "{err}"
    );

    let dup = cluster_shard(
        "cluster-0",
        vec![entry(
            KEY,
            "10.96.0.1",
            vec![ep("10.0.0.1", 80), ep("10.0.0.1", 80)],
        )],
    );
    let err = merged(&plan(&["cluster-0"], vec![]), &[dup]).expect_err("duplicate");
    assert_eq!(
        err.to_string(),
        "ProxyPlanShard/cluster-0: spec.servicePorts[0].clusterEndpoints[1]: duplicate endpoint 10.0.0.1:80"
    );

    let mut zero = entry(KEY, "10.96.0.1", vec![]);
    zero.node_port = Some(0);
    let err = merged(
        &plan(&["cluster-0"], vec![]),
        &[cluster_shard("cluster-0", vec![zero])],
    )
    .expect_err("port");
    assert_eq!(
        err.to_string(),
        "ProxyPlanShard/cluster-0: spec.servicePorts[0].nodePort: port must be between 1 and 65535"
    );
}

fn find<'a>(merged: &'a proxyplan_crds::MergedPlan, key: &str) -> &'a Arc<ServicePortPlan> {
    merged
        .service_ports
        .iter()
        .find(|e| e.key == key)
        .expect("entry")
}

fn versioned(mut shard: ProxyPlanShard, version: &str) -> ProxyPlanShard {
    shard.metadata.resource_version = Some(version.into());
    shard
}

#[test]
fn a_key_in_two_cluster_shards_names_the_later_one() {
    let a = cluster_shard("cluster-0", vec![entry(KEY, "10.96.0.1", vec![])]);
    let b = cluster_shard(
        "cluster-1",
        vec![
            entry("default/a:http/TCP/IPv4", "10.96.0.2", vec![]),
            entry(KEY, "10.96.0.3", vec![]),
        ],
    );
    let err = merged(&plan(&["cluster-0", "cluster-1"], vec![]), &[a, b]).expect_err("dup");
    assert_eq!(
        err.to_string(),
        format!("ProxyPlanShard/cluster-1: spec.servicePorts[1].key: duplicate key {KEY}")
    );
}

#[test]
fn merge_cached_shares_unchanged_entries_and_checks_changed_shards_again() {
    let other = "default/other:http/TCP/IPv4";
    let one = versioned(
        cluster_shard(
            "cluster-0",
            vec![entry(KEY, "10.96.0.1", vec![ep("10.0.0.1", 80)])],
        ),
        "1",
    );
    let two = versioned(
        cluster_shard(
            "cluster-1",
            vec![entry(other, "10.96.0.2", vec![ep("10.0.0.2", 80)])],
        ),
        "1",
    );
    let overlay = vec![EndpointOverride {
        key: other.into(),
        cluster_endpoints: None,
        local_endpoints: Some(vec![ep("10.0.0.2", 80)]),
    }];
    let p = plan(&["cluster-0", "cluster-1"], overlay);
    let mut cache = MergeCache::new();
    let first = merge_cached(&p, &[one.clone(), two.clone()], &mut cache).expect("merges");
    assert_eq!(
        first,
        merge(&p, &[one.clone(), two.clone()]).expect("merges")
    );
    assert_eq!(cache.len(), 2);

    // cluster-0 changes: its entry is new, and the overlaid entry of cluster-1 is a copy
    // made by this merge (the cached one keeps the shard's content).
    let mut changed = one.clone();
    changed.spec.service_ports[0]
        .cluster_endpoints
        .push(ep("10.0.0.3", 80));
    let changed = versioned(changed, "2");
    let second = merge_cached(&p, &[changed.clone(), two.clone()], &mut cache).expect("merges");
    assert_eq!(second, merge(&p, &[changed, two.clone()]).expect("merges"));
    assert!(!Arc::ptr_eq(find(&first, KEY), find(&second, KEY)));
    assert_eq!(find(&second, other).local_endpoints, [ep("10.0.0.2", 80)]);

    // Nothing changes: the unchanged shard's entries are the same allocations.
    let plain = plan(&["cluster-0", "cluster-1"], vec![]);
    let third = merge_cached(&plain, &[one.clone(), two.clone()], &mut cache).expect("merges");
    let fourth = merge_cached(&plain, &[one.clone(), two.clone()], &mut cache).expect("merges");
    assert!(Arc::ptr_eq(find(&third, KEY), find(&fourth, KEY)));
    assert!(Arc::ptr_eq(find(&third, other), find(&fourth, other)));
    assert!(
        find(&third, other).local_endpoints.is_empty(),
        "the overlay stays out of the cache"
    );

    // A bad entry in a changed shard is refused even though the shard was cached.
    let mut bad = one.clone();
    bad.spec.service_ports[0].cluster_ip = "10.96.0".into();
    let bad = versioned(bad, "3");
    let err = merge_cached(&plain, &[bad, two.clone()], &mut cache).expect_err("bad");
    assert!(
        err.to_string().contains("spec.servicePorts[0].clusterIP"),
        "{err}"
    );

    // Shards no longer named leave the cache.
    merge_cached(&plan(&["cluster-1"], vec![]), &[two], &mut cache).expect("merges");
    assert_eq!(cache.len(), 1);
}

#[test]
fn a_shard_named_twice() {
    let cluster = cluster_shard("cluster-0", vec![entry(KEY, "10.96.0.1", vec![])]);
    let err = merged(&plan(&["cluster-0", "cluster-0"], vec![]), &[cluster]).expect_err("twice");
    assert_eq!(
        err.to_string(),
        format!("ProxyPlanShard/cluster-0: spec.servicePorts[0].key: duplicate key {KEY}")
    );
    let zone = zone_shard("zone-z1-0", "z1", vec![]);
    let p = plan(&["cluster-0", "zone-z1-0", "zone-z1-0"], vec![]);
    let cluster = cluster_shard("cluster-0", vec![entry(KEY, "10.96.0.1", vec![])]);
    assert_eq!(
        merged(&p, &[cluster, zone])
            .expect("valid")
            .service_ports
            .len(),
        1
    );
}

#[test]
fn the_last_shard_of_a_name_is_merged() {
    let first = cluster_shard("cluster-0", vec![entry(KEY, "10.96.0.1", vec![])]);
    let last = cluster_shard("cluster-0", vec![entry(KEY, "10.96.0.2", vec![])]);
    let m = merged(&plan(&["cluster-0"], vec![]), &[first, last]).expect("valid");
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
    let key = |n: usize| format!("default/svc-{n:03}:http/TCP/IPv4");
    let mut shards: Vec<ProxyPlanShard> = (0..4)
        .map(|s| {
            let entries = (0..30)
                .map(|k| {
                    let n = s * 100 + k * 3;
                    entry(&key(n), "10.96.0.1", vec![ep("10.0.0.1", 80)])
                })
                .collect();
            versioned(cluster_shard(&format!("cluster-{s}"), entries), "1")
        })
        .collect();
    let mut version = 1;
    let mut cache = MergeCache::new();
    let mut names = vec!["cluster-0", "cluster-1", "cluster-2", "cluster-3"];
    let mut errors = 0;
    let mut zone = zone_shard("zone-a", "z1", vec![]);
    // Each edit adds an endpoint with a port of its own.
    let mut edits: u16 = 1000;
    let mut overlay_key = key(0);
    // A duplicate key added on purpose, taken out again at the next step.
    let mut duplicate: Option<(usize, String)> = None;
    for step in 0..300 {
        if let Some((s, k)) = duplicate.take() {
            let list = &mut shards[s].spec.service_ports;
            if let Some(at) = list.iter().rposition(|e| e.key == k) {
                list.remove(at);
            }
            version += 1;
            shards[s].metadata.resource_version = Some(version.to_string());
        }
        // Change one or two shards: add, drop or edit entries, reorder them, and now and
        // then add a key another shard holds.
        for _ in 0..=rng.below(2) {
            let s = rng.below(shards.len());
            let taken: Vec<String> = shards
                .iter()
                .flat_map(|sh| sh.spec.service_ports.iter().map(|e| e.key.clone()))
                .collect();
            let list = &mut shards[s].spec.service_ports;
            match rng.below(10) {
                0 | 1 => {
                    let n = (0..400)
                        .map(|_| key(rng.below(400)))
                        .find(|k| !taken.contains(k));
                    if let Some(k) = n {
                        list.push(entry(&k, "10.96.0.1", vec![]));
                    }
                }
                2 | 3 if !list.is_empty() => {
                    let at = rng.below(list.len());
                    list.remove(at);
                }
                4..=6 if !list.is_empty() => {
                    let at = rng.below(list.len());
                    edits += 1;
                    list[at].cluster_endpoints.push(ep("10.0.0.9", edits));
                }
                7 if duplicate.is_none() && !taken.is_empty() => {
                    let k = taken[rng.below(taken.len())].clone();
                    list.push(entry(&k, "10.96.0.2", vec![]));
                    duplicate = Some((s, k));
                }
                _ => list.reverse(),
            }
            version += 1;
            shards[s].metadata.resource_version = Some(version.to_string());
        }
        if step % 50 == 49 {
            names.rotate_left(1);
        }
        // The plan's overlay and a zone shard's overrides change every few steps (a new
        // resourceVersion each time) and otherwise stay as they were.
        let some_key = |rng: &mut Lcg| {
            let all: Vec<&ServicePortPlan> =
                shards.iter().flat_map(|s| &s.spec.service_ports).collect();
            all.get(rng.below(all.len()))
                .map_or_else(|| key(0), |e| e.key.clone())
        };
        if step % 5 == 0 {
            overlay_key = some_key(&mut rng);
        }
        let present = |k: &str| {
            shards
                .iter()
                .any(|s| s.spec.service_ports.iter().any(|e| e.key == k))
        };
        let stale = zone.spec.overrides.iter().any(|o| !present(&o.key));
        if step % 7 == 0 || stale {
            // Every other time the same keys with other endpoints.
            let port = 81 + u16::try_from(step).unwrap_or(0);
            let keys: Vec<String> = if step % 14 == 0 || stale || zone.spec.overrides.is_empty() {
                (0..3).map(|_| some_key(&mut rng)).collect()
            } else {
                zone.spec.overrides.iter().map(|o| o.key.clone()).collect()
            };
            zone.spec.overrides = keys
                .into_iter()
                .map(|key| EndpointOverride {
                    key,
                    cluster_endpoints: Some(vec![ep("10.0.1.1", port)]),
                    local_endpoints: None,
                })
                .collect();
            zone.metadata.resource_version = Some(format!("z{step}"));
        }
        let overlay = vec![EndpointOverride {
            key: overlay_key.clone(),
            cluster_endpoints: None,
            local_endpoints: Some(vec![ep("10.0.0.5", 80)]),
        }];
        let mut named = names.clone();
        named.push("zone-a");
        let mut p = plan(&named, overlay);
        p.metadata.resource_version = Some(format!("p{}", step / 5));
        let mut all = shards.clone();
        all.push(zone.clone());
        let fresh = merge(&p, &all);
        let cached = merge_cached(&p, &all, &mut cache);
        match (&fresh, &cached) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "step {step}"),
            (Err(a), Err(b)) => {
                errors += 1;
                assert_eq!(a.to_string(), b.to_string(), "step {step}");
            }
            _ => panic!("step {step}: {fresh:?} vs {cached:?}"),
        }
    }
    // Both outcomes were exercised, mostly successful merges.
    assert!(errors > 0 && errors < 120, "{errors} errors");
}

#[test]
fn an_unchanged_override_of_an_unchanged_entry_is_the_same_allocation() {
    let cluster = versioned(
        cluster_shard(
            "cluster-0",
            vec![entry(KEY, "10.96.0.1", vec![ep("10.0.0.1", 80)])],
        ),
        "1",
    );
    let zone = |version: &str, port: u16| {
        versioned(
            zone_shard(
                "zone-a",
                "z1",
                vec![EndpointOverride {
                    key: KEY.into(),
                    cluster_endpoints: Some(vec![ep("10.0.0.2", port)]),
                    local_endpoints: None,
                }],
            ),
            version,
        )
    };
    let mut p = plan(&["cluster-0", "zone-a"], vec![]);
    p.metadata.resource_version = Some("7".into());
    let mut cache = MergeCache::new();
    let shards = [cluster.clone(), zone("1", 80)];
    let first = merge_cached(&p, &shards, &mut cache).expect("merges");
    let second = merge_cached(&p, &shards, &mut cache).expect("merges");
    assert!(Arc::ptr_eq(find(&first, KEY), find(&second, KEY)));
    assert_eq!(find(&second, KEY).cluster_endpoints, [ep("10.0.0.2", 80)]);
    // A new version of the zone shard is applied again.
    let third = merge_cached(&p, &[cluster, zone("2", 81)], &mut cache).expect("merges");
    assert_eq!(find(&third, KEY).cluster_endpoints, [ep("10.0.0.2", 81)]);
}
