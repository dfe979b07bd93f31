//! `RenderCache` always renders exactly what `render` does, across a sequence of plans
//! from a synthetic cluster (endpoint moves of every kind of Service, entries removed and
//! added back, node-local inputs changed), with the revision of every chain.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use proxyplan_agent::iptables::render::{ChainRevisions, RenderCache};
use proxyplan_agent::iptables::{FamilyRules, RenderSettings, TableRules, render};
use proxyplan_controller::synthetic::{ServiceKind, SyntheticCluster, SyntheticSpec};
use proxyplan_controller::{DesiredObject, Planner};
use proxyplan_crds::{MergedPlan, NodeProxyPlan, ProxyPlanShard, merge};

const NODE: &str = "node-00000";

struct Objects {
    plan: Option<NodeProxyPlan>,
    shards: BTreeMap<String, ProxyPlanShard>,
}

impl Objects {
    fn take(&mut self, planner: &mut Planner) {
        let changes = planner.take_changes();
        for object in changes.apply {
            match object {
                DesiredObject::Plan(p) => {
                    if p.metadata.name.as_deref() == Some(NODE) {
                        self.plan = Some(p);
                    }
                }
                DesiredObject::Shard(s) => {
                    self.shards
                        .insert(s.metadata.name.clone().unwrap_or_default(), s);
                }
            }
        }
        for id in changes.delete {
            self.shards.remove(&id.name());
        }
    }

    fn merged(&self) -> MergedPlan {
        let shards: Vec<ProxyPlanShard> = self.shards.values().cloned().collect();
        merge(self.plan.as_ref().unwrap(), &shards).unwrap()
    }
}

fn check(cache: &mut RenderCache, plan: &MergedPlan, settings: &RenderSettings) {
    let want = render(plan, settings);
    let got = cache.update(plan, settings);
    for ((rules, revisions), want) in got.iter().zip([&want.v4, &want.v6]) {
        assert_eq!(*rules, want, "cached rules differ from render()");
        assert_eq!(rules.dump(), want.dump());
        assert_eq!(**revisions, expected_revisions(want));
    }
}

fn expected_revisions(rules: &FamilyRules) -> ChainRevisions {
    let table = |t: &TableRules| {
        t.chains
            .iter()
            .map(|(name, rules)| (name.clone(), TableRules::revision(rules)))
            .collect()
    };
    ChainRevisions {
        filter: table(&rules.filter),
        nat: table(&rules.nat),
    }
}

#[test]
fn cached_rendering_equals_render_through_changes() {
    let spec = SyntheticSpec {
        services: 120,
        endpoints_per_service: 4,
        nodes: 6,
        zones: 2,
        local_fraction: 0.2,
        hinted_fraction: 0.2,
        seed: 7,
    };
    let mut cluster = SyntheticCluster::generate(&spec).unwrap();
    let mut planner = Planner::new(SyntheticCluster::planner_config());
    assert!(cluster.load_into(&mut planner).is_empty());
    let mut objects = Objects {
        plan: None,
        shards: BTreeMap::new(),
    };
    objects.take(&mut planner);
    let settings = RenderSettings::default();
    let mut cache = RenderCache::default();
    let plan = objects.merged();
    check(&mut cache, &plan, &settings);
    // Unchanged.
    check(&mut cache, &plan, &settings);

    for kind in [
        ServiceKind::Cluster,
        ServiceKind::Local,
        ServiceKind::ZoneHinted,
    ] {
        let services: Vec<usize> = cluster.services_of_kind(kind).collect();
        for k in 0..8 {
            let service = services[(k * 37) % services.len()];
            let change = cluster.move_endpoint(service).unwrap();
            planner.apply_slice(&change.slice).unwrap();
            objects.take(&mut planner);
            check(&mut cache, &objects.merged(), &settings);
        }
    }

    // Entries removed, then back; several at once.
    let full = objects.merged();
    let mut fewer = full.clone();
    fewer.service_ports.retain(|e| e.key.len() % 3 != 0);
    check(&mut cache, &fewer, &settings);
    let mut first_only = full.clone();
    first_only.service_ports.truncate(1);
    check(&mut cache, &first_only, &settings);
    check(&mut cache, &full, &settings);

    // Node-local inputs change.
    let other = RenderSettings {
        masquerade_bit: 14,
        nodeport_cidrs: vec!["172.16.0.0/12".to_owned()],
    };
    check(&mut cache, &full, &other);
    let mut moved = full.clone();
    moved.local_traffic.cidrs = vec!["10.1.0.0/16".to_owned()];
    moved.addresses.clear();
    check(&mut cache, &moved, &other);
    check(&mut cache, &full, &settings);

    // Nothing at all, then everything again.
    let mut empty = full.clone();
    empty.service_ports.clear();
    check(&mut cache, &empty, &settings);
    check(&mut cache, &full, &settings);
}
