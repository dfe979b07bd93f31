//! Scale invariants of DESIGN §2, on a synthetic cluster small enough for debug builds
//! (2,000 Services × 10 endpoints, 10 zones) at two node counts (200 and 2,000): object
//! sizes, writes per endpoint change, one plan per node, and plans that merge. No timing:
//! speed is the benchmark's business (`benches/planner.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proxyplan_controller::synthetic::{
    EndpointChange, ServiceKind, SyntheticCluster, SyntheticSpec,
};
use proxyplan_controller::{Changes, DesiredObject, Planner};
use proxyplan_crds::{NodeProxyPlan, ServiceProxyPlan, merge, object_key};

const FEW_NODES: usize = 200;
const MANY_NODES: usize = 2_000;
const NODE_COUNTS: [usize; 2] = [FEW_NODES, MANY_NODES];
/// Endpoint changes tried per kind of Service and node count.
const CHANGES: usize = 25;
const ONE_MIB: usize = 1 << 20;

fn spec(nodes: usize) -> SyntheticSpec {
    SyntheticSpec {
        services: 2_000,
        endpoints_per_service: 10,
        nodes,
        zones: 10,
        local_fraction: 0.05,
        hinted_fraction: 0.05,
        seed: 42,
    }
}

/// A planner that has planned a synthetic cluster, with every object it built.
struct Fixture {
    cluster: SyntheticCluster,
    planner: Planner,
    plans: BTreeMap<String, NodeProxyPlan>,
    services: BTreeMap<String, ServiceProxyPlan>,
}

impl Fixture {
    fn new(nodes: usize) -> Self {
        let cluster = SyntheticCluster::generate(&spec(nodes)).unwrap();
        let mut planner = Planner::new(SyntheticCluster::planner_config());
        let errors = cluster.load_into(&mut planner);
        assert!(errors.is_empty(), "refused: {errors:?}");
        let changes = planner.take_changes();
        assert!(changes.delete.is_empty(), "deletes: {:?}", changes.delete);
        let mut fixture = Self {
            cluster,
            planner,
            plans: BTreeMap::new(),
            services: BTreeMap::new(),
        };
        let changed = fixture.absorb(changes);
        assert_eq!(changed.len(), fixture.plans.len() + fixture.services.len());
        fixture
    }

    /// Moves one endpoint of `service` through the planner; returns the change and the
    /// names of the objects whose revision changed (or that were deleted).
    fn move_endpoint(&mut self, service: usize) -> (EndpointChange, Changed) {
        let change = self.cluster.move_endpoint(service).unwrap();
        self.planner.apply_slice(&change.slice).unwrap();
        let changes = self.planner.take_changes();
        (change, self.absorb(changes))
    }

    /// Records `changes`, returning what differs from the objects held before.
    fn absorb(&mut self, changes: Changes) -> Changed {
        let mut changed = Changed::default();
        for id in changes.delete {
            changed.deleted.insert(id.qualified_name());
        }
        for object in changes.apply {
            let name = object.qualified_name();
            match object {
                DesiredObject::Plan(plan) => {
                    let old = self.plans.insert(name.clone(), plan.clone());
                    if old.map(|o| o.spec.revision) != Some(plan.spec.revision) {
                        changed.plans.insert(name);
                    }
                }
                DesiredObject::Service(service) => {
                    let old = self.services.insert(name.clone(), service.clone());
                    if old.map(|o| o.spec.revision) != Some(service.spec.revision.clone()) {
                        changed.services.insert(name, service);
                    }
                }
            }
        }
        changed
    }

    fn services_of_kind(&self, kind: ServiceKind, count: usize) -> Vec<usize> {
        let all: Vec<usize> = self.cluster.services_of_kind(kind).collect();
        assert!(all.len() >= count, "too few {kind:?} Services");
        // Spread over the whole list.
        (0..count).map(|k| all[k * all.len() / count]).collect()
    }

    /// `namespace/name:` — the prefix of every entry key of Service `index`.
    fn key_prefix(&self, index: usize) -> String {
        let meta = &self.cluster.services[index].metadata;
        format!(
            "{}/{}:",
            meta.namespace.as_deref().unwrap(),
            meta.name.as_deref().unwrap()
        )
    }

    /// `namespace/name` of Service `index`: the name of its Service plan.
    fn service_plan_name(&self, index: usize) -> String {
        let meta = &self.cluster.services[index].metadata;
        format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap(),
            meta.name.as_deref().unwrap()
        )
    }

    fn service_list(&self) -> Vec<ServiceProxyPlan> {
        self.services.values().cloned().collect()
    }
}

#[derive(Debug, Default)]
struct Changed {
    plans: BTreeSet<String>,
    services: BTreeMap<String, ServiceProxyPlan>,
    deleted: BTreeSet<String>,
}

impl Changed {
    fn len(&self) -> usize {
        self.plans.len() + self.services.len() + self.deleted.len()
    }
}

fn json_size<T: serde::Serialize>(value: &T) -> usize {
    serde_json::to_vec(value).unwrap().len()
}

fn largest<'a, T: serde::Serialize + 'a>(
    objects: impl Iterator<Item = (&'a String, &'a T)>,
) -> (String, usize) {
    objects
        .map(|(name, object)| (name.clone(), json_size(object)))
        .max_by_key(|(_, size)| *size)
        .unwrap()
}

#[test]
fn no_object_exceeds_1_mib_and_none_grows_with_the_node_count() {
    let [few, many] = NODE_COUNTS.map(Fixture::new);
    let mut largest_services = Vec::new();
    let mut largest_plans = Vec::new();
    for fixture in [&few, &many] {
        let service = largest(fixture.services.iter());
        let plan = largest(fixture.plans.iter());
        for (name, size) in [&service, &plan] {
            assert!(*size < ONE_MIB, "{name} is {size} bytes");
        }
        // One Service plan per Service, whatever the nodes and zones.
        assert_eq!(fixture.services.len(), fixture.cluster.services.len());
        largest_services.push(service);
        largest_plans.push(plan);
    }
    // Same Services at both node counts; only the endpoint IPs differ (pod CIDRs are
    // sized by endpoints per node), which may change a Service plan by a few bytes.
    let (few_service, many_service) = (&largest_services[0], &largest_services[1]);
    assert!(
        many_service.1 <= few_service.1 + few_service.1 / 50,
        "largest Service plan grew from {few_service:?} at {FEW_NODES} nodes to {many_service:?} at {MANY_NODES}"
    );
    // A node plan holds only its own node's overlay: more nodes, fewer endpoints each.
    let (few_plan, many_plan) = (&largest_plans[0], &largest_plans[1]);
    assert!(
        many_plan.1 <= few_plan.1,
        "largest node plan grew from {few_plan:?} at {FEW_NODES} nodes to {many_plan:?} at {MANY_NODES}"
    );
    // Every Service plan carries the same service ports at both node counts.
    let keys = |f: &Fixture| -> BTreeMap<String, Vec<String>> {
        f.services
            .iter()
            .map(|(n, s)| {
                let keys = s.spec.service_ports.iter().map(|e| e.key.clone()).collect();
                (n.clone(), keys)
            })
            .collect()
    };
    assert_eq!(keys(&few), keys(&many));
}

/// DESIGN §2 invariant 2: an endpoint change of an ordinary Service writes one object,
/// its own Service plan, whatever the node count; and that object is no more than twice
/// the size of the EndpointSlice that changed (what kube-proxy receives for the same
/// change), so the bytes every agent receives match kube-proxy's.
#[test]
fn cluster_policy_endpoint_change_writes_its_own_service_plan_at_any_node_count() {
    let mut counts = Vec::new();
    for nodes in NODE_COUNTS {
        let mut fixture = Fixture::new(nodes);
        let mut per_change = Vec::new();
        for service in fixture.services_of_kind(ServiceKind::Cluster, CHANGES) {
            let prefix = fixture.key_prefix(service);
            let own = fixture.service_plan_name(service);
            let (change, changed) = fixture.move_endpoint(service);
            assert!(
                changed.plans.is_empty() && changed.deleted.is_empty(),
                "{changed:?}"
            );
            let [(name, plan)] = changed.services.iter().collect::<Vec<_>>()[..] else {
                panic!("{nodes} nodes, {prefix}: changed {changed:?}");
            };
            assert_eq!(name, &own);
            let added = change.added.ip.to_string();
            let entry = plan
                .spec
                .service_ports
                .iter()
                .find(|e| e.key.starts_with(&prefix))
                .unwrap();
            assert!(entry.cluster_endpoints.iter().any(|e| e.ip == added));
            let (object, slice) = (json_size(plan), json_size(&change.slice));
            assert!(
                object <= 2 * slice,
                "{own}: the Service plan is {object} bytes, the slice {slice} bytes"
            );
            per_change.push(changed.len());
        }
        counts.push(per_change);
    }
    assert_eq!(counts[0], vec![1; CHANGES]);
    assert_eq!(counts[0], counts[1]);
}

#[test]
fn local_policy_endpoint_change_writes_only_the_nodes_involved() {
    for nodes in NODE_COUNTS {
        let mut fixture = Fixture::new(nodes);
        for service in fixture.services_of_kind(ServiceKind::Local, CHANGES) {
            let prefix = fixture.key_prefix(service);
            let (change, changed) = fixture.move_endpoint(service);
            let involved: BTreeSet<String> =
                [change.removed.node.clone(), change.added.node.clone()].into();
            assert_eq!(changed.plans, involved, "{nodes} nodes, {prefix}");
            assert!(changed.deleted.is_empty());
            let own = fixture.service_plan_name(service);
            assert!(
                changed.services.keys().all(|name| *name == own),
                "{:?}",
                changed.services.keys()
            );
            // The new node serves the new endpoint locally; the old one no longer has
            // the old endpoint.
            let local_ips = |node: &str| -> BTreeSet<String> {
                fixture.plans[node]
                    .spec
                    .overlay
                    .iter()
                    .filter(|o| o.key.starts_with(&prefix))
                    .flat_map(|o| o.local_endpoints.iter().flatten())
                    .map(|e| e.ip.to_string())
                    .collect()
            };
            assert!(local_ips(&change.added.node).contains(&change.added.ip.to_string()));
            assert!(!local_ips(&change.removed.node).contains(&change.removed.ip.to_string()));
        }
    }
}

/// DESIGN §2 invariant 3 for zone hints: a zone-hinted endpoint change writes no node
/// plan, only the Service's own plan (O(1) shared objects), whose zone lists carry the
/// zones involved.
#[test]
fn zone_hinted_endpoint_change_writes_only_its_own_service_plan() {
    for nodes in NODE_COUNTS {
        let mut fixture = Fixture::new(nodes);
        for service in fixture.services_of_kind(ServiceKind::ZoneHinted, CHANGES) {
            let own = fixture.service_plan_name(service);
            let (change, changed) = fixture.move_endpoint(service);
            assert!(
                changed.plans.is_empty() && changed.deleted.is_empty(),
                "{changed:?}"
            );
            let names: Vec<&String> = changed.services.keys().collect();
            assert_eq!(names, [&own], "{nodes} nodes");
            let zones: BTreeSet<String> = changed.services[&own]
                .spec
                .service_ports
                .iter()
                .flat_map(|e| e.zone_endpoints.iter().map(|z| z.zone.clone()))
                .collect();
            assert!(zones.contains(&change.added.zone), "{zones:?}");
        }
    }
}

#[test]
fn exactly_one_node_proxy_plan_per_node() {
    for nodes in NODE_COUNTS {
        let fixture = Fixture::new(nodes);
        let node_names: BTreeSet<String> = fixture
            .cluster
            .nodes
            .iter()
            .map(|n| n.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(node_names.len(), nodes);
        let plan_names: BTreeSet<String> = fixture.plans.keys().cloned().collect();
        assert_eq!(plan_names, node_names);
        let uids: HashMap<&str, &str> = fixture
            .cluster
            .nodes
            .iter()
            .map(|n| {
                (
                    n.metadata.name.as_deref().unwrap(),
                    n.metadata.uid.as_deref().unwrap(),
                )
            })
            .collect();
        for (name, plan) in &fixture.plans {
            assert_eq!(plan.metadata.name.as_ref(), Some(name));
            assert_eq!(&plan.spec.node_name, name);
            let owners = plan
                .metadata
                .owner_references
                .as_deref()
                .unwrap_or_default();
            assert!(
                matches!(owners, [o] if o.kind == "Node" && o.name == *name && o.uid == uids[name.as_str()]),
                "{name}: owners {owners:?}"
            );
        }
        // The planner's own idea of what exists agrees.
        let plans_in_all = fixture
            .planner
            .all_objects()
            .iter()
            .filter(|o| matches!(o, DesiredObject::Plan(_)))
            .count();
        assert_eq!(plans_in_all, nodes);
    }
}

/// Full merges cost ~40 ms per plan in a debug build (every entry is validated again for
/// each plan), so at 2,000 nodes every plan gets the cheap structural checks and one in
/// `MERGE_STRIDE` the full merge.
const MERGE_STRIDE: usize = 8;

#[test]
fn every_node_plan_merges_with_the_service_plans() {
    for nodes in NODE_COUNTS {
        let fixture = Fixture::new(nodes);
        let services = fixture.service_list();
        for object in &services {
            assert_eq!(
                fixture.services.get(&object_key(object)).map(|s| &s.spec),
                Some(&object.spec)
            );
        }
        let entries: usize = services.iter().map(|s| s.spec.service_ports.len()).sum();
        let keys: BTreeSet<&str> = services
            .iter()
            .flat_map(|s| &s.spec.service_ports)
            .map(|e| e.key.as_str())
            .collect();
        // Structural checks, every plan: it has a zone, and its overlay overrides
        // existing entries.
        for (name, plan) in &fixture.plans {
            let zone = plan.spec.zone.as_ref();
            assert!(zone.is_some(), "{name}: no zone");
            for o in &plan.spec.overlay {
                assert!(keys.contains(o.key.as_str()), "{name}: overlay {}", o.key);
            }
        }
        // Full merges, checked against the endpoints the synthetic slices place on
        // each node and zone.
        let expected = ExpectedEndpoints::of(&fixture);
        let stride = if nodes > FEW_NODES { MERGE_STRIDE } else { 1 };
        let plans: Vec<&NodeProxyPlan> = fixture.plans.values().step_by(stride).collect();
        std::thread::scope(|scope| {
            for half in plans.chunks(plans.len().div_ceil(2)) {
                let (services, expected) = (&services, &expected);
                scope.spawn(move || {
                    for plan in half {
                        let name = &plan.spec.node_name;
                        let merged = merge(plan, services)
                            .unwrap_or_else(|e| panic!("{nodes} nodes, {name}: {e}"));
                        assert_eq!(merged.service_ports.len(), entries, "{name}");
                        assert!(merged.refused.is_empty(), "{name}: {:?}", merged.refused);
                        assert!(
                            merged.unmatched.is_empty(),
                            "{name}: {:?}",
                            merged.unmatched
                        );
                        let zone = plan.spec.zone.as_deref().unwrap();
                        for entry in &merged.service_ports {
                            expected.check(name, zone, entry);
                        }
                    }
                });
            }
        });
    }
}

/// What the merged plan of a node must hold for Local and zone-hinted Services, worked
/// out from the synthetic slices independently of the planner.
struct ExpectedEndpoints {
    /// Entry key prefix (`namespace/name:`) → kind.
    kinds: HashMap<String, ServiceKind>,
    /// (prefix, node) → IPs of the Service's endpoints on that node.
    by_node: HashMap<(String, String), BTreeSet<String>>,
    /// (prefix, zone) → IPs of the Service's endpoints in that zone.
    by_zone: HashMap<(String, String), BTreeSet<String>>,
    /// prefix → IPs of all the Service's endpoints.
    all: HashMap<String, BTreeSet<String>>,
}

impl ExpectedEndpoints {
    fn of(fixture: &Fixture) -> Self {
        let mut expected = Self {
            kinds: HashMap::new(),
            by_node: HashMap::new(),
            by_zone: HashMap::new(),
            all: HashMap::new(),
        };
        for index in 0..fixture.cluster.services.len() {
            let prefix = fixture.key_prefix(index);
            let kind = fixture.cluster.kind(index).unwrap();
            expected.kinds.insert(prefix.clone(), kind);
            for ep in fixture
                .cluster
                .slices_of(index)
                .iter()
                .flat_map(|s| &s.endpoints)
            {
                let ip = ep.addresses[0].clone();
                let node = ep.node_name.clone().unwrap();
                let zone = ep.zone.clone().unwrap();
                expected
                    .all
                    .entry(prefix.clone())
                    .or_default()
                    .insert(ip.clone());
                let by_node = expected.by_node.entry((prefix.clone(), node));
                by_node.or_default().insert(ip.clone());
                let by_zone = expected.by_zone.entry((prefix.clone(), zone));
                by_zone.or_default().insert(ip);
            }
        }
        expected
    }

    fn check(&self, node: &str, zone: &str, entry: &proxyplan_crds::ServicePortPlan) {
        let ips = |list: &[proxyplan_crds::Endpoint]| -> BTreeSet<String> {
            list.iter().map(|e| e.ip.to_string()).collect()
        };
        let (prefix, _) = entry.key.split_once(':').unwrap();
        let prefix = format!("{prefix}:");
        let empty = BTreeSet::new();
        let all = self.all.get(&prefix).unwrap_or(&empty);
        match self.kinds[&prefix] {
            ServiceKind::Cluster => {
                assert_eq!(&ips(&entry.cluster_endpoints), all, "{node}: {}", entry.key);
            }
            ServiceKind::Local => {
                let local = self.by_node.get(&(prefix.clone(), node.to_owned()));
                assert_eq!(
                    &ips(&entry.local_endpoints),
                    local.unwrap_or(&empty),
                    "{node}: {}",
                    entry.key
                );
                assert_eq!(&ips(&entry.cluster_endpoints), all, "{node}: {}", entry.key);
            }
            ServiceKind::ZoneHinted => {
                // kube-proxy: the zone's endpoints when it has any, else all of them.
                let in_zone = self.by_zone.get(&(prefix.clone(), zone.to_owned()));
                assert_eq!(
                    &ips(&entry.cluster_endpoints),
                    in_zone.unwrap_or(all),
                    "{node}: {}",
                    entry.key
                );
            }
        }
    }
}
