//! `RenderCache` always describes exactly what `render` does, across a sequence of plans
//! from a synthetic cluster (endpoint moves of every kind of Service, entries removed and
//! added back, node-local inputs changed): every chain, with its revision and rule count.
//! The dataplane built on it, syncing the same plans into the fake kernel, leaves
//! exactly the rendered rules there after each one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;

use proxyplan_agent::dataplane::Dataplane;
use proxyplan_agent::kernel::command::fake::FakeKernel;
use proxyplan_agent::kernel::{Backend, Family};
use proxyplan_agent::modes::iptables::cache::{CachedChain, RenderCache};
use proxyplan_agent::modes::iptables::{IptablesDataplane, RenderSettings, render};
use proxyplan_agent::ruleset::{FamilyRules, TableName, TableRules, names};
use proxyplan_controller::synthetic::{ServiceKind, SyntheticCluster, SyntheticSpec};
use proxyplan_controller::{DesiredObject, Planner};
use proxyplan_crds::{MergedPlan, NodeProxyPlan, ServiceProxyPlan, merge, object_key};

const NODE: &str = "node-00000";

struct Objects {
    plan: Option<NodeProxyPlan>,
    services: BTreeMap<String, ServiceProxyPlan>,
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
                DesiredObject::Service(s) => {
                    self.services.insert(object_key(&s), s);
                }
            }
        }
        for id in changes.delete {
            self.services.remove(&id.qualified_name());
        }
    }

    fn merged(&self) -> MergedPlan {
        let services: Vec<ServiceProxyPlan> = self.services.values().cloned().collect();
        merge(self.plan.as_ref().unwrap(), &services).unwrap()
    }
}

/// A dataplane over a fake kernel, with the settings it was started with.
struct Node {
    kernel: FakeKernel,
    dp: IptablesDataplane<FakeKernel>,
    settings: RenderSettings,
}

impl Node {
    fn new() -> Self {
        let kernel = FakeKernel::new();
        let settings = RenderSettings::default();
        Self {
            dp: IptablesDataplane::new(settings.clone(), kernel.clone(), Backend::Nft),
            kernel,
            settings,
        }
    }

    /// The agent restarted with other flags, on the same kernel.
    fn restart(&mut self, settings: &RenderSettings) {
        self.settings = settings.clone();
        self.dp = IptablesDataplane::new(settings.clone(), self.kernel.clone(), Backend::Nft);
    }
}

fn check(cache: &mut RenderCache, node: &mut Node, plan: &MergedPlan, settings: &RenderSettings) {
    let want = render(plan, settings);
    cache.update(plan, settings);
    for (family, rules) in [(Family::V4, &want.v4), (Family::V6, &want.v6)] {
        assert_eq!(
            cache.chains(family),
            expected_chains(rules),
            "cached chains differ from render()"
        );
        assert_eq!(cache.rule_count(family), rules.rule_count());
    }

    if node.settings != *settings {
        node.restart(settings);
    }
    let report = node.dp.sync(plan, false).unwrap();
    assert_eq!(report.rules, want.v4.rule_count() + want.v6.rule_count());
    for (family, rules) in [(Family::V4, &want.v4), (Family::V6, &want.v6)] {
        for table in ["filter", "nat"] {
            let mut held = support::chains_of(&node.kernel.save(family, table), table);
            held.retain(|name, rules| !rules.is_empty() || names::is_owned(name));
            assert_eq!(
                held,
                support::chains_of(&rules.dump(), table),
                "{family:?} {table}: the kernel differs from render()"
            );
        }
    }
    assert_eq!(node.dp.sync(plan, false).unwrap().payload, "");
}

fn expected_chains(rules: &FamilyRules) -> Vec<CachedChain> {
    let mut out: Vec<CachedChain> = [
        (TableName::Filter, &rules.filter),
        (TableName::Nat, &rules.nat),
    ]
    .into_iter()
    .flat_map(|(table, t): (TableName, &TableRules)| {
        t.chains.iter().map(move |(name, rules)| CachedChain {
            table,
            name: name.clone(),
            revision: TableRules::revision(rules),
            rules: rules.len() + 1,
        })
    })
    .collect();
    out.sort();
    out
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
        services: BTreeMap::new(),
    };
    objects.take(&mut planner);
    let settings = RenderSettings::default();
    let mut cache = RenderCache::default();
    let mut node = Node::new();
    let plan = objects.merged();
    check(&mut cache, &mut node, &plan, &settings);
    // Unchanged.
    check(&mut cache, &mut node, &plan, &settings);

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
            check(&mut cache, &mut node, &objects.merged(), &settings);
        }
    }

    // Entries removed, then back; several at once.
    let full = objects.merged();
    let mut fewer = full.clone();
    fewer.service_ports.retain(|e| e.key.len() % 3 != 0);
    check(&mut cache, &mut node, &fewer, &settings);
    let mut first_only = full.clone();
    first_only.service_ports.truncate(1);
    check(&mut cache, &mut node, &first_only, &settings);
    check(&mut cache, &mut node, &full, &settings);

    // Entries come, go and change in the same sync, interleaved in key order.
    let every = |plan: &MergedPlan, skip: usize| {
        let mut kept = plan.clone();
        kept.service_ports = plan
            .service_ports
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 3 != skip)
            .map(|(_, e)| e.clone())
            .collect();
        kept
    };
    check(&mut cache, &mut node, &every(&full, 0), &settings);
    let mut shuffled = every(&full, 1);
    for entry in shuffled.service_ports.iter_mut().step_by(4) {
        Arc::make_mut(entry).cluster_endpoints.truncate(1);
    }
    check(&mut cache, &mut node, &shuffled, &settings);
    check(&mut cache, &mut node, &full, &settings);

    // Node-local inputs change.
    let other = RenderSettings {
        masquerade_bit: 14,
        nodeport_cidrs: vec!["172.16.0.0/12".to_owned()],
        ..RenderSettings::default()
    };
    check(&mut cache, &mut node, &full, &other);
    let mut moved = full.clone();
    moved.local_traffic.cidrs = vec!["10.1.0.0/16".to_owned()];
    moved.addresses.clear();
    check(&mut cache, &mut node, &moved, &other);
    check(&mut cache, &mut node, &full, &settings);

    // Nothing at all, then everything again.
    let mut empty = full.clone();
    empty.service_ports.clear();
    check(&mut cache, &mut node, &empty, &settings);
    check(&mut cache, &mut node, &full, &settings);

    // Not what merge() makes: entries out of order, and two entries sharing a key.
    let mut odd = full.clone();
    odd.service_ports.reverse();
    let mut twin = (*odd.service_ports[3]).clone();
    twin.cluster_endpoints.truncate(1);
    twin.port += 1;
    odd.service_ports.insert(7, Arc::new(twin));
    check(&mut cache, &mut node, &odd, &settings);
    Arc::make_mut(&mut odd.service_ports[7])
        .cluster_endpoints
        .clear();
    check(&mut cache, &mut node, &odd, &settings);
    check(&mut cache, &mut node, &full, &settings);
}
