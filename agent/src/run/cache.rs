//! What the watches have shown: this node's plan and the shards it may name. A plain
//! struct updated event by event, nothing async; [`PlanCache::evaluate`] turns it into
//! the plan to program.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::runtime::watcher::Event;
use proxyplan_crds::{
    MergeCache, MergedPlan, NodeProxyPlan, PlanError, ProxyPlanShard, merge_cached, zone_slug,
};

/// Which watch a shard came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardSource {
    /// `proxyplan.dev/scope=cluster`.
    Cluster,
    /// `proxyplan.dev/zone=<this node's zone>`.
    Zone,
}

/// What the current plan and shards amount to.
#[derive(Debug)]
pub enum PlanOutcome {
    /// The watches have not listed yet.
    NotListed,
    /// There is no plan for this node.
    NoPlan,
    /// The plan names shards the agent has not seen: wait for them.
    Waiting {
        /// The plan's revision.
        revision: String,
        /// The missing shards, in the plan's order.
        missing: Vec<String>,
    },
    /// The plan or a shard it names is invalid: the plan is refused whole.
    Invalid {
        /// The plan's revision.
        revision: String,
        /// The first problem, naming object and field.
        error: PlanError,
    },
    /// The plan to program.
    Merged(Arc<MergedPlan>),
}

/// What one event changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Change {
    /// The plan to program may differ: a sync is needed.
    pub relevant: bool,
    /// The plan object is new (first seen, or deleted and created again): its status is
    /// not what the agent last wrote.
    pub new_object: bool,
    /// When the change was made, from the object's `managedFields` (only for changes
    /// seen as they happen, not for re-lists).
    pub changed_at: Option<SystemTime>,
}

/// Shards by name, kept in one vector so a merge borrows them without copying.
#[derive(Debug, Default)]
struct ShardStore {
    shards: Vec<ProxyPlanShard>,
    sources: Vec<ShardSource>,
    index: HashMap<String, usize>,
}

impl ShardStore {
    fn get(&self, name: &str) -> Option<&ProxyPlanShard> {
        self.index.get(name).map(|&i| &self.shards[i])
    }

    fn upsert(&mut self, source: ShardSource, shard: ProxyPlanShard) {
        let name = shard.name_any();
        if let Some(&i) = self.index.get(&name) {
            self.shards[i] = shard;
            self.sources[i] = source;
        } else {
            self.index.insert(name, self.shards.len());
            self.shards.push(shard);
            self.sources.push(source);
        }
    }

    fn remove(&mut self, name: &str) {
        let Some(i) = self.index.remove(name) else {
            return;
        };
        self.shards.swap_remove(i);
        self.sources.swap_remove(i);
        if let Some(moved) = self.shards.get(i) {
            self.index.insert(moved.name_any(), i);
        }
    }

    fn names_from(&self, source: ShardSource) -> Vec<String> {
        self.shards
            .iter()
            .zip(&self.sources)
            .filter(|(_, s)| **s == source)
            .map(|(shard, _)| shard.name_any())
            .collect()
    }
}

/// The plan and shards as the watches have shown them.
#[derive(Debug, Default)]
pub struct PlanCache {
    plan: Option<NodeProxyPlan>,
    plan_listed: bool,
    plan_relist: Option<Vec<NodeProxyPlan>>,
    shards: ShardStore,
    cluster_listed: bool,
    cluster_relist: Option<Vec<ProxyPlanShard>>,
    zone_watch: Option<String>,
    zone_listed: bool,
    zone_relist: Option<Vec<ProxyPlanShard>>,
    /// Cluster shards already validated, so a merge after one shard changed checks and
    /// copies only that shard. It holds their entries: the stored objects drop theirs.
    merges: Merges,
}

/// The merge cache, keeping a shard's entries until the shard leaves the store: once it
/// holds them, the stored object's own copy is dropped (half the agent's plan memory).
#[derive(Debug)]
struct Merges(MergeCache);

impl Default for Merges {
    fn default() -> Self {
        Self(MergeCache::keeping_unnamed())
    }
}

impl Merges {
    /// Whether `shard`'s entries are held here instead of in the object.
    fn holds(&self, shard: &ProxyPlanShard) -> bool {
        shard
            .metadata
            .resource_version
            .as_deref()
            .is_some_and(|version| self.0.holds(&shard.name_any(), version))
    }
}

impl PlanCache {
    /// The plan object, if any.
    #[must_use]
    pub fn plan(&self) -> Option<&NodeProxyPlan> {
        self.plan.as_ref()
    }

    /// The slug of the zone whose shards the plan needs, if it has a zone.
    #[must_use]
    pub fn wanted_zone(&self) -> Option<String> {
        self.plan
            .as_ref()
            .and_then(|p| p.spec.zone.as_deref())
            .map(zone_slug)
    }

    /// Whether every needed watch has listed once (the zone watch for the wanted zone).
    #[must_use]
    pub fn listed(&self) -> bool {
        self.plan_listed
            && self.cluster_listed
            && (self.wanted_zone().is_none()
                || (self.zone_listed && self.zone_watch == self.wanted_zone()))
    }

    /// Records that the zone watch now follows `slug`: the previous zone's shards are
    /// forgotten. Returns whether that matters to the plan.
    pub fn watch_zone(&mut self, slug: Option<String>) -> bool {
        if slug == self.zone_watch {
            return false;
        }
        self.zone_watch = slug;
        self.zone_listed = false;
        self.zone_relist = None;
        let mut relevant = false;
        for name in self.shards.names_from(ShardSource::Zone) {
            relevant |= self.is_named(&name);
            self.shards.remove(&name);
            self.merges.0.forget(&name);
        }
        relevant
    }

    /// Applies one event of the plan watch.
    pub fn plan_event(&mut self, event: Event<NodeProxyPlan>) -> Change {
        match event {
            Event::Init => {
                self.plan_relist = Some(Vec::new());
                Change::default()
            }
            Event::InitApply(plan) => {
                self.plan_relist.get_or_insert_with(Vec::new).push(plan);
                Change::default()
            }
            Event::InitDone => {
                let listed = self.plan_relist.take().unwrap_or_default();
                self.plan_listed = true;
                let mut change = self.replace_plan(listed.into_iter().last());
                change.relevant = true;
                change
            }
            Event::Apply(plan) => {
                let changed_at = Some(change_time(&plan.metadata));
                let mut change = self.replace_plan(Some(plan));
                if change.relevant {
                    change.changed_at = changed_at;
                }
                change
            }
            Event::Delete(_) => self.replace_plan(None),
        }
    }

    fn replace_plan(&mut self, plan: Option<NodeProxyPlan>) -> Change {
        let old = self.plan.take();
        let relevant = match (&old, &plan) {
            (Some(old), Some(new)) => {
                old.spec != new.spec || old.metadata.generation != new.metadata.generation
            }
            (None, None) => false,
            _ => true,
        };
        let new_object = plan
            .as_ref()
            .is_some_and(|new| old.as_ref().is_none_or(|old| old.uid() != new.uid()));
        self.plan = plan;
        Change {
            relevant,
            new_object,
            changed_at: None,
        }
    }

    /// Applies one event of a shard watch. Events of a zone watch that is no longer
    /// followed are ignored.
    pub fn shard_event(
        &mut self,
        source: ShardSource,
        zone: Option<&str>,
        event: Event<ProxyPlanShard>,
    ) -> Change {
        if source == ShardSource::Zone && zone != self.zone_watch.as_deref() {
            return Change::default();
        }
        let relist = match source {
            ShardSource::Cluster => &mut self.cluster_relist,
            ShardSource::Zone => &mut self.zone_relist,
        };
        match event {
            Event::Init => {
                *relist = Some(Vec::new());
                Change::default()
            }
            Event::InitApply(shard) => {
                relist.get_or_insert_with(Vec::new).push(shard);
                Change::default()
            }
            Event::InitDone => {
                let listed = relist.take().unwrap_or_default();
                match source {
                    ShardSource::Cluster => self.cluster_listed = true,
                    ShardSource::Zone => self.zone_listed = true,
                }
                self.replace_shards(source, listed)
            }
            Event::Apply(shard) => {
                let name = shard.name_any();
                let changed_at = change_time(&shard.metadata);
                let relevant = self.is_named(&name)
                    && match self.shards.get(&name) {
                        None => true,
                        // Entries dropped: the same resourceVersion is the same content.
                        Some(held)
                            if held.spec.service_ports.is_empty() && self.merges.holds(held) =>
                        {
                            held.metadata.resource_version != shard.metadata.resource_version
                        }
                        Some(held) => held.spec != shard.spec,
                    };
                self.shards.upsert(source, shard);
                Change {
                    relevant,
                    new_object: false,
                    changed_at: relevant.then_some(changed_at),
                }
            }
            Event::Delete(shard) => {
                let name = shard.name_any();
                let relevant = self.is_named(&name) && self.shards.get(&name).is_some();
                self.shards.remove(&name);
                self.merges.0.forget(&name);
                Change {
                    relevant,
                    ..Change::default()
                }
            }
        }
    }

    fn replace_shards(&mut self, source: ShardSource, listed: Vec<ProxyPlanShard>) -> Change {
        let fresh: HashMap<String, ProxyPlanShard> =
            listed.into_iter().map(|s| (s.name_any(), s)).collect();
        for name in self.shards.names_from(source) {
            if !fresh.contains_key(&name) {
                self.shards.remove(&name);
                self.merges.0.forget(&name);
            }
        }
        for shard in fresh.into_values() {
            self.shards.upsert(source, shard);
        }
        // A completed list always counts: it may be what a sync waits for, and a sync
        // whose merged plan is unchanged costs a merge, not a kernel update.
        Change {
            relevant: true,
            ..Change::default()
        }
    }

    fn is_named(&self, shard: &str) -> bool {
        self.plan
            .as_ref()
            .is_some_and(|p| p.spec.shards.iter().any(|r| r.name == shard))
    }

    /// Validates and merges the plan with the shards it names.
    #[must_use]
    pub fn evaluate(&mut self) -> PlanOutcome {
        if !self.listed() {
            return PlanOutcome::NotListed;
        }
        let Some(plan) = &self.plan else {
            return PlanOutcome::NoPlan;
        };
        let missing: Vec<String> = plan
            .spec
            .shards
            .iter()
            .filter(|r| self.shards.get(&r.name).is_none())
            .map(|r| r.name.clone())
            .collect();
        if !missing.is_empty() {
            return PlanOutcome::Waiting {
                revision: plan.spec.revision.clone(),
                missing,
            };
        }
        match merge_cached(plan, &self.shards.shards, &mut self.merges.0) {
            Ok(merged) => {
                // The cache holds these shards' validated entries now.
                for shard in &mut self.shards.shards {
                    if !shard.spec.service_ports.is_empty() && self.merges.holds(shard) {
                        shard.spec.service_ports = Vec::new();
                    }
                }
                PlanOutcome::Merged(Arc::new(merged))
            }
            Err(error) => PlanOutcome::Invalid {
                revision: plan.spec.revision.clone(),
                error,
            },
        }
    }
}

/// When an object's spec was last written: the latest `managedFields` time outside the
/// status subresource, else now (the time the event arrived).
#[must_use]
pub fn change_time(meta: &ObjectMeta) -> SystemTime {
    meta.managed_fields
        .iter()
        .flatten()
        .filter(|f| f.subresource.as_deref().is_none_or(str::is_empty))
        .filter_map(|f| f.time.as_ref())
        .map(|t| SystemTime::from(t.0))
        .max()
        .unwrap_or_else(SystemTime::now)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};
    use proxyplan_crds::{
        LocalTrafficDetection, LocalTrafficMode, NodeProxyPlanSpec, ProxyPlanShardSpec, ShardRef,
        ShardScope,
    };

    use super::*;

    fn plan(revision: &str, zone: Option<&str>, shards: &[&str]) -> NodeProxyPlan {
        let mut plan = NodeProxyPlan::new(
            "node-a",
            NodeProxyPlanSpec {
                node_name: "node-a".to_owned(),
                revision: revision.to_owned(),
                zone: zone.map(str::to_owned),
                pod_cidrs: Vec::new(),
                addresses: Vec::new(),
                local_traffic: LocalTrafficDetection {
                    mode: LocalTrafficMode::ClusterCIDR,
                    cidrs: Vec::new(),
                },
                shards: shards
                    .iter()
                    .map(|s| ShardRef {
                        name: (*s).to_owned(),
                    })
                    .collect(),
                overlay: Vec::new(),
            },
        );
        plan.metadata.uid = Some("uid-1".to_owned());
        plan
    }

    fn shard(name: &str, revision: &str, zone: Option<&str>) -> ProxyPlanShard {
        ProxyPlanShard::new(
            name,
            ProxyPlanShardSpec {
                scope: if zone.is_some() {
                    ShardScope::Zone
                } else {
                    ShardScope::Cluster
                },
                zone: zone.map(str::to_owned),
                revision: revision.to_owned(),
                service_ports: Vec::new(),
                overrides: Vec::new(),
            },
        )
    }

    fn listed(cache: &mut PlanCache, plan: NodeProxyPlan, cluster: Vec<ProxyPlanShard>) {
        cache.plan_event(Event::Init);
        cache.plan_event(Event::InitApply(plan));
        cache.plan_event(Event::InitDone);
        cache.shard_event(ShardSource::Cluster, None, Event::Init);
        for s in cluster {
            cache.shard_event(ShardSource::Cluster, None, Event::InitApply(s));
        }
        cache.shard_event(ShardSource::Cluster, None, Event::InitDone);
    }

    fn revisions(outcome: &PlanOutcome) -> BTreeMap<String, String> {
        match outcome {
            PlanOutcome::Merged(m) => m.shard_revisions.clone(),
            other => panic!("not merged: {other:?}"),
        }
    }

    /// A cluster shard at `version` with one entry per key.
    fn versioned(name: &str, version: &str, keys: &[&str]) -> ProxyPlanShard {
        let mut s = shard(name, version, None);
        s.metadata.resource_version = Some(version.to_owned());
        s.spec.service_ports = keys
            .iter()
            .enumerate()
            .map(|(i, key)| {
                serde_json::from_str(&format!(
                    r#"{{"key":"{key}","namespace":"demo","name":"{key}","portName":"http",
                    "family":"IPv4","protocol":"TCP","port":80,"clusterIP":"10.96.0.{}",
                    "internal":{{"policy":"Cluster","whenEmpty":"Reject"}},
                    "masquerade":{{"all":false,"offClusterToClusterIP":false,"external":false,
                    "localHostToExternal":false,"hairpin":true}}}}"#,
                    i + 1
                ))
                .unwrap()
            })
            .collect();
        s
    }

    fn keys(outcome: &PlanOutcome) -> Vec<String> {
        match outcome {
            PlanOutcome::Merged(m) => m.service_ports.iter().map(|e| e.key.clone()).collect(),
            other => panic!("not merged: {other:?}"),
        }
    }

    /// Once merged, a cluster shard's entries live only in the merge cache; the merges
    /// after that are the same, also when the plan stops naming the shard and names it
    /// again, and a new version of the shard brings its new entries.
    #[test]
    fn merged_shards_keep_their_entries_in_the_merge_cache_only() {
        let mut cache = PlanCache::default();
        let a = versioned("cluster-a", "1", &["a/x", "a/y"]);
        let b = versioned("cluster-b", "1", &["b/z"]);
        listed(
            &mut cache,
            plan("r1", None, &["cluster-a", "cluster-b"]),
            vec![a.clone(), b],
        );
        assert_eq!(keys(&cache.evaluate()), ["a/x", "a/y", "b/z"]);
        let held = |cache: &PlanCache, name: &str| {
            cache.shards.get(name).unwrap().spec.service_ports.len()
        };
        assert_eq!(
            held(&cache, "cluster-a"),
            0,
            "entries dropped from the object"
        );
        assert_eq!(keys(&cache.evaluate()), ["a/x", "a/y", "b/z"]);

        // The same version again changes nothing.
        let same = cache.shard_event(ShardSource::Cluster, None, Event::Apply(a));
        assert!(!same.relevant);
        assert!(matches!(cache.evaluate(), PlanOutcome::Merged(_)));
        assert_eq!(held(&cache, "cluster-a"), 0);

        // Unnamed, then named again: the cache kept the entries.
        cache.plan_event(Event::Apply(plan("r2", None, &["cluster-b"])));
        assert_eq!(keys(&cache.evaluate()), ["b/z"]);
        cache.plan_event(Event::Apply(plan("r3", None, &["cluster-a", "cluster-b"])));
        assert_eq!(keys(&cache.evaluate()), ["a/x", "a/y", "b/z"]);

        // A new version brings its entries; a deleted shard is forgotten.
        let a2 = versioned("cluster-a", "2", &["a/w"]);
        assert!(
            cache
                .shard_event(ShardSource::Cluster, None, Event::Apply(a2))
                .relevant
        );
        assert_eq!(keys(&cache.evaluate()), ["a/w", "b/z"]);
        let gone = versioned("cluster-b", "1", &[]);
        cache.shard_event(ShardSource::Cluster, None, Event::Delete(gone));
        assert!(!cache.merges.0.holds("cluster-b", "1"));
        assert!(matches!(cache.evaluate(), PlanOutcome::Waiting { .. }));

        // A re-list of the same versions merges as before.
        let a2 = versioned("cluster-a", "2", &["a/w"]);
        let b = versioned("cluster-b", "1", &["b/z"]);
        cache.shard_event(ShardSource::Cluster, None, Event::Init);
        cache.shard_event(ShardSource::Cluster, None, Event::InitApply(a2));
        cache.shard_event(ShardSource::Cluster, None, Event::InitApply(b));
        cache.shard_event(ShardSource::Cluster, None, Event::InitDone);
        assert_eq!(keys(&cache.evaluate()), ["a/w", "b/z"]);
        assert_eq!(held(&cache, "cluster-b"), 0);
    }

    #[test]
    fn nothing_is_evaluated_before_every_watch_listed() {
        let mut cache = PlanCache::default();
        assert!(matches!(cache.evaluate(), PlanOutcome::NotListed));
        cache.plan_event(Event::Init);
        cache.plan_event(Event::InitDone);
        assert!(matches!(cache.evaluate(), PlanOutcome::NotListed));
        cache.shard_event(ShardSource::Cluster, None, Event::Init);
        cache.shard_event(ShardSource::Cluster, None, Event::InitDone);
        assert!(matches!(cache.evaluate(), PlanOutcome::NoPlan));
    }

    #[test]
    fn a_zoned_plan_waits_for_its_zone_list_then_for_missing_shards() {
        let mut cache = PlanCache::default();
        listed(
            &mut cache,
            plan(
                "p1",
                Some("Zone A"),
                &["cluster-0", "cluster-1", "zone-a-0"],
            ),
            vec![shard("cluster-0", "c0", None)],
        );
        assert_eq!(cache.wanted_zone(), Some(zone_slug("Zone A")));
        assert!(matches!(cache.evaluate(), PlanOutcome::NotListed));
        assert!(!cache.watch_zone(cache.wanted_zone()));
        let slug = cache.wanted_zone();
        let zone = Some("Zone A");
        cache.shard_event(ShardSource::Zone, slug.as_deref(), Event::Init);
        cache.shard_event(
            ShardSource::Zone,
            slug.as_deref(),
            Event::InitApply(shard("zone-a-0", "z0", zone)),
        );
        cache.shard_event(ShardSource::Zone, slug.as_deref(), Event::InitDone);
        match cache.evaluate() {
            PlanOutcome::Waiting { revision, missing } => {
                assert_eq!(
                    (revision.as_str(), missing),
                    ("p1", vec!["cluster-1".to_owned()])
                );
            }
            other => panic!("{other:?}"),
        }
        let change = cache.shard_event(
            ShardSource::Cluster,
            None,
            Event::Apply(shard("cluster-1", "c1", None)),
        );
        assert!(change.relevant);
        assert!(change.changed_at.is_some());
        let merged = revisions(&cache.evaluate());
        assert_eq!(merged.len(), 3);
    }

    #[test]
    fn only_changes_to_named_shards_and_plan_specs_are_relevant() {
        let mut cache = PlanCache::default();
        listed(
            &mut cache,
            plan("p1", None, &["cluster-0"]),
            vec![shard("cluster-0", "c0", None)],
        );
        let same = cache.shard_event(
            ShardSource::Cluster,
            None,
            Event::Apply(shard("cluster-0", "c0", None)),
        );
        assert!(!same.relevant, "same spec");
        let other = cache.shard_event(
            ShardSource::Cluster,
            None,
            Event::Apply(shard("cluster-9", "c9", None)),
        );
        assert!(!other.relevant, "not named by the plan");
        let mut with_status = plan("p1", None, &["cluster-0"]);
        with_status.status = Some(proxyplan_crds::NodeProxyPlanStatus::default());
        let change = cache.plan_event(Event::Apply(with_status));
        assert!(!change.relevant && !change.new_object, "status-only update");
        let mut recreated = plan("p1", None, &["cluster-0"]);
        recreated.metadata.uid = Some("uid-2".to_owned());
        assert!(cache.plan_event(Event::Apply(recreated)).new_object);
        let gone = cache.shard_event(
            ShardSource::Cluster,
            None,
            Event::Delete(shard("cluster-0", "c0", None)),
        );
        assert!(gone.relevant);
        assert!(matches!(cache.evaluate(), PlanOutcome::Waiting { .. }));
    }

    #[test]
    fn moving_zone_forgets_the_old_zones_shards_and_ignores_its_stragglers() {
        let mut cache = PlanCache::default();
        listed(&mut cache, plan("p1", Some("a"), &["zone-a-0"]), Vec::new());
        cache.watch_zone(Some("a".to_owned()));
        cache.shard_event(ShardSource::Zone, Some("a"), Event::Init);
        cache.shard_event(
            ShardSource::Zone,
            Some("a"),
            Event::InitApply(shard("zone-a-0", "z", Some("a"))),
        );
        cache.shard_event(ShardSource::Zone, Some("a"), Event::InitDone);
        assert!(matches!(cache.evaluate(), PlanOutcome::Merged(_)));

        cache.plan_event(Event::Apply(plan("p2", Some("b"), &["zone-b-0"])));
        assert!(!cache.listed(), "the b zone has not listed");
        cache.watch_zone(Some("b".to_owned()));
        let straggler = cache.shard_event(
            ShardSource::Zone,
            Some("a"),
            Event::Apply(shard("zone-b-0", "z", Some("b"))),
        );
        assert!(!straggler.relevant);
        cache.shard_event(ShardSource::Zone, Some("b"), Event::Init);
        cache.shard_event(ShardSource::Zone, Some("b"), Event::InitDone);
        match cache.evaluate() {
            PlanOutcome::Waiting { missing, .. } => assert_eq!(missing, ["zone-b-0"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_invalid_plan_is_refused_with_the_field_named() {
        let mut cache = PlanCache::default();
        let mut bad = plan("p1", None, &[]);
        bad.spec.pod_cidrs = vec!["10.0.0.0/40".to_owned()];
        listed(&mut cache, bad, Vec::new());
        match cache.evaluate() {
            PlanOutcome::Invalid { error, .. } => {
                assert!(error.to_string().contains("spec.podCIDRs[0]"), "{error}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn change_time_is_the_latest_spec_write() {
        let entry = |seconds: i64, subresource: Option<&str>| ManagedFieldsEntry {
            time: Some(Time(
                k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + seconds).unwrap(),
            )),
            subresource: subresource.map(str::to_owned),
            ..ManagedFieldsEntry::default()
        };
        let meta = ObjectMeta {
            managed_fields: Some(vec![
                entry(10, None),
                entry(20, Some("")),
                entry(99, Some("status")),
            ]),
            ..ObjectMeta::default()
        };
        let at = change_time(&meta);
        assert_eq!(
            at,
            SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_020)
        );
    }
}
