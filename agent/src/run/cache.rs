//! What the watches have shown: this node's plan and every Service's plan. A plain
//! struct updated event by event, nothing async; [`PlanCache::evaluate`] turns it into
//! the plan to program.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::runtime::watcher::Event;
use proxyplan_crds::lenient::{DecodeError, Lenient};
use proxyplan_crds::{
    CompactString, MergeCache, MergedPlan, NodeProxyPlan, PlanError, PlanRef, SERVICE_LABEL,
    ServiceProxyPlan, TRIGGER_TIME_ANNOTATION, merge_refs, merge_update, object_key,
};

/// What the current plan and Service plans amount to.
#[derive(Debug)]
pub enum PlanOutcome {
    /// The watches have not listed yet.
    NotListed,
    /// There is no plan for this node.
    NoPlan,
    /// The node plan is invalid: it is refused whole.
    Invalid {
        /// The plan's revision (empty when the plan could not be decoded at all).
        revision: String,
        /// The first problem, naming object and field.
        error: PlanError,
    },
    /// The plan to program. Service plans that were refused, and overlay entries whose
    /// Service plan has not arrived, are listed in it.
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
    /// The EndpointSlice change behind this one, when the controller recorded it on the
    /// object (only for changes seen as they happen, not for re-lists).
    pub trigger: Option<SystemTime>,
}

/// One stored Service plan: the object while the merge cache does not hold its entries
/// (not merged yet, or refused), and only its identity once it does. An object costs
/// 408 bytes before its strings; thousands of them were the agent's largest structure.
#[derive(Debug)]
enum Stored {
    Object(Box<ServiceProxyPlan>),
    Held {
        key: CompactString,
        version: CompactString,
        revision: CompactString,
        /// `metadata.generation`: the same under a status-only write (the controller's
        /// rollout status), which is no change to program.
        generation: Option<i64>,
    },
}

impl Stored {
    /// `object`, as its identity when `merges` holds its entries.
    fn of(object: ServiceProxyPlan, merges: &Merges) -> Self {
        Self::held(&object, merges).unwrap_or_else(|| Self::Object(Box::new(object)))
    }

    /// `object`'s identity, if `merges` holds its entries.
    fn held(object: &ServiceProxyPlan, merges: &Merges) -> Option<Self> {
        let version = object.metadata.resource_version.as_deref()?;
        merges.holds(object).then(|| Self::Held {
            key: object_key(object).into(),
            version: version.into(),
            revision: object.spec.revision.as_str().into(),
            generation: object.metadata.generation,
        })
    }

    fn key(&self) -> String {
        match self {
            Self::Object(object) => object_key(object),
            Self::Held { key, .. } => key.to_string(),
        }
    }

    fn plan_ref(&self) -> PlanRef<'_> {
        match self {
            Self::Object(object) => PlanRef::Object(object),
            Self::Held {
                key,
                version,
                revision,
                ..
            } => PlanRef::Held {
                key,
                version,
                revision,
            },
        }
    }

    /// Becomes its identity once `merges` holds its entries.
    fn settle(&mut self, merges: &Merges) {
        if let Self::Object(object) = self
            && let Some(held) = Self::held(object, merges)
        {
            *self = held;
        }
    }
}

/// Service plans by `namespace/name`, kept in one vector so a merge borrows them without
/// copying.
#[derive(Debug, Default)]
struct ServiceStore {
    objects: Vec<Stored>,
    index: HashMap<CompactString, usize>,
}

impl ServiceStore {
    fn get(&self, key: &str) -> Option<&Stored> {
        self.index.get(key).and_then(|&i| self.objects.get(i))
    }

    fn upsert(&mut self, key: String, object: Stored) {
        if let Some(&i) = self.index.get(key.as_str())
            && let Some(slot) = self.objects.get_mut(i)
        {
            *slot = object;
        } else {
            self.index.insert(key.into(), self.objects.len());
            self.objects.push(object);
        }
    }

    fn remove(&mut self, key: &str) -> bool {
        let Some(i) = self.index.remove(key) else {
            return false;
        };
        self.objects.swap_remove(i);
        if let Some(moved) = self.objects.get(i) {
            self.index.insert(moved.key().into(), i);
        }
        true
    }

    fn keys(&self) -> Vec<String> {
        self.index.keys().map(CompactString::to_string).collect()
    }
}

/// The plan and Service plans as the watches have shown them.
#[derive(Debug, Default)]
pub struct PlanCache {
    plan: Option<NodeProxyPlan>,
    /// Why the plan object could not be decoded, if it could not.
    plan_undecodable: Option<(String, DecodeError)>,
    plan_listed: bool,
    plan_relist: Option<Vec<Lenient<NodeProxyPlan>>>,
    services: ServiceStore,
    /// Service plans whose newest version could not be decoded, by `namespace/name`.
    undecodable: BTreeMap<String, DecodeError>,
    services_listed: bool,
    /// The keys a Service plan list in progress has shown so far (the objects go
    /// straight into the store: a list of thousands is never held beside it).
    services_relist: Option<HashSet<String>>,
    /// Service plans stored, changed or removed since the last merge: the next merge
    /// updates only these (unless `merge_all`).
    changed: std::collections::BTreeSet<String>,
    /// The next merge must look at every object (after a re-list).
    merge_all: bool,
    /// Service plans already validated, so a merge after one changed checks and copies
    /// only that one. It holds their entries: the stored objects drop theirs.
    merges: Merges,
    /// The newest `resourceVersion` of a Service plan event that changed what to program
    /// (or of a listed object), 0 before any.
    received: u64,
    /// The newest `resourceVersion` a list in progress has shown: it counts once the
    /// list is done (lists come in name order, not version order, so a part of one
    /// says nothing about the objects still to come).
    listing: u64,
}

/// The merge cache, keeping an object's entries until the object leaves the store: once
/// it holds them, the stored object's own copy is dropped (half the agent's plan memory).
#[derive(Debug)]
struct Merges(MergeCache);

impl Default for Merges {
    fn default() -> Self {
        Self(MergeCache::keeping_unnamed())
    }
}

impl Merges {
    /// Whether `object`'s entries are held here instead of in the object.
    fn holds(&self, object: &ServiceProxyPlan) -> bool {
        object
            .metadata
            .resource_version
            .as_deref()
            .is_some_and(|version| self.0.holds(&object_key(object), version))
    }
}

impl PlanCache {
    /// The plan object, if any.
    #[must_use]
    pub fn plan(&self) -> Option<&NodeProxyPlan> {
        self.plan.as_ref()
    }

    /// Whether both watches have listed once.
    #[must_use]
    pub fn listed(&self) -> bool {
        self.plan_listed && self.services_listed
    }

    /// The newest `resourceVersion` of a Service plan event that changed what to program
    /// (or of a listed object): once a sync that began after it succeeds, every Service
    /// plan change up to it is programmed. Events that change nothing to program (the
    /// controller's rollout status, a label) do not move it: a node whose kernel did not
    /// change has nothing new to report.
    #[must_use]
    pub fn received(&self) -> u64 {
        self.received
    }

    fn receive(&mut self, version: Option<&str>) {
        // Resource versions of one resource compare as integers (KEP-5504); one that
        // does not parse is no progress.
        if let Some(version) = version.and_then(|v| v.parse::<u64>().ok()) {
            self.received = self.received.max(version);
        }
    }

    /// How many Service plans the agent holds.
    #[must_use]
    pub fn service_plans(&self) -> usize {
        self.services.objects.len()
    }

    /// Applies one event of the plan watch.
    pub fn plan_event(&mut self, event: Event<Lenient<NodeProxyPlan>>) -> Change {
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
                let trigger = plan
                    .object
                    .as_ref()
                    .ok()
                    .and_then(|p| trigger_time(&p.metadata));
                let mut change = self.replace_plan(Some(plan));
                if change.relevant {
                    change.trigger = trigger;
                }
                change
            }
            Event::Delete(_) => self.replace_plan(None),
        }
    }

    fn replace_plan(&mut self, plan: Option<Lenient<NodeProxyPlan>>) -> Change {
        let (plan, undecodable) = match plan {
            None => (None, None),
            Some(lenient) => {
                let name = lenient.name_any();
                let uid = lenient.uid();
                match lenient.object {
                    Ok(plan) => (Some(plan), None),
                    Err(err) => {
                        // Keep the identity so that a recreated object is still told
                        // apart; the spec is unusable.
                        let mut stub = NodeProxyPlan::new(&name, blank_spec(&name));
                        stub.metadata.uid = uid;
                        (Some(stub), Some((name, err)))
                    }
                }
            }
        };
        let old = self.plan.take();
        let relevant = undecodable != self.plan_undecodable
            || match (&old, &plan) {
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
        self.plan_undecodable = undecodable;
        Change {
            relevant,
            new_object,
            trigger: None,
        }
    }

    /// Applies one event of the Service plan watch.
    pub fn service_event(&mut self, event: Event<Lenient<ServiceProxyPlan>>) -> Change {
        match event {
            Event::Init => {
                self.services_relist = Some(HashSet::new());
                self.listing = 0;
                Change::default()
            }
            Event::InitApply(mut object) => {
                if let Some(version) = version_of(&object).and_then(|v| v.parse::<u64>().ok()) {
                    self.listing = self.listing.max(version);
                }
                // Stored and validated into the merge cache as it arrives, so that a
                // list of thousands of Service plans is never held twice (objects and
                // entries). Objects deleted while the watch was away leave at InitDone.
                let zone = self.plan.as_ref().and_then(|p| p.spec.zone.clone());
                if let Ok(plan) = &mut object.object
                    && self.merges.0.hold(plan, zone.as_deref())
                {
                    plan.spec.service_ports = Vec::new();
                }
                self.services_relist
                    .get_or_insert_with(HashSet::new)
                    .insert(qualified(&object));
                self.upsert(object, false);
                Change::default()
            }
            Event::InitDone => {
                let listed = self.services_relist.take().unwrap_or_default();
                self.services_listed = true;
                self.received = self.received.max(std::mem::take(&mut self.listing));
                self.replace_services(&listed)
            }
            Event::Apply(object) => {
                let trigger = object
                    .object
                    .as_ref()
                    .ok()
                    .and_then(|o| trigger_time(&o.metadata));
                let version = version_of(&object);
                let relevant = self.upsert(object, true);
                if relevant {
                    self.receive(version.as_deref());
                }
                Change {
                    relevant,
                    new_object: false,
                    trigger: relevant.then_some(trigger).flatten(),
                }
            }
            Event::Delete(object) => {
                let key = qualified(&object);
                let had = self.services.remove(&key);
                let was_undecodable = self.undecodable.remove(&key).is_some();
                if had || was_undecodable {
                    self.receive(version_of(&object).as_deref());
                }
                self.merges.0.forget(&key);
                self.changed.insert(key);
                Change {
                    relevant: had || was_undecodable,
                    ..Change::default()
                }
            }
        }
    }

    /// Stores one Service plan; returns whether the plan to program may differ. `live`:
    /// the event comes from the watch, not a (re-)list, so a recreated object was seen
    /// deleted first and an unchanged generation is an unchanged spec.
    fn upsert(&mut self, lenient: Lenient<ServiceProxyPlan>, live: bool) -> bool {
        let key = qualified(&lenient);
        match lenient.object {
            Ok(mut object) => {
                slim(&mut object.metadata);
                // The controller's rollout status: not read here.
                object.status = None;
                let was_undecodable = self.undecodable.remove(&key).is_some();
                if !was_undecodable
                    && live
                    && let Some(Stored::Held { generation, .. }) = self.services.get(&key)
                    && generation.is_some()
                    && *generation == object.metadata.generation
                {
                    // A status write (the spec, under the status subresource, keeps its
                    // generation): the held entries stay, under their own version.
                    return false;
                }
                let relevant = was_undecodable
                    || match self.services.get(&key) {
                        None => true,
                        // Entries held by the merge cache: the same resourceVersion is the
                        // same content.
                        Some(Stored::Held { version, .. }) => {
                            Some(version.as_str()) != object.metadata.resource_version.as_deref()
                        }
                        Some(Stored::Object(held)) => held.spec != object.spec,
                    };
                if relevant {
                    self.changed.insert(key.clone());
                }
                let stored = Stored::of(object, &self.merges);
                self.services.upsert(key, stored);
                relevant
            }
            Err(err) => {
                // The last good version (if any) stays stored and merged.
                self.undecodable.insert(key, err).is_none()
            }
        }
    }

    /// Completes a list: what it did not show is gone.
    fn replace_services(&mut self, listed: &HashSet<String>) -> Change {
        for key in self.services.keys() {
            if !listed.contains(&key) {
                self.services.remove(&key);
                self.merges.0.forget(&key);
                self.changed.insert(key);
            }
        }
        self.undecodable.retain(|key, _| listed.contains(key));
        self.services.objects.shrink_to_fit();
        self.merge_all = true;
        // A completed list always counts: it may be what a sync waits for, and a sync
        // whose merged plan is unchanged costs a merge, not a kernel update.
        Change {
            relevant: true,
            ..Change::default()
        }
    }

    /// Validates and merges the plan with every Service plan.
    #[must_use]
    pub fn evaluate(&mut self) -> PlanOutcome {
        if !self.listed() {
            return PlanOutcome::NotListed;
        }
        let Some(plan) = &self.plan else {
            return PlanOutcome::NoPlan;
        };
        if let Some((name, err)) = &self.plan_undecodable {
            return PlanOutcome::Invalid {
                revision: String::new(),
                error: PlanError::InvalidField {
                    object: format!("NodeProxyPlan/{name}"),
                    field: err.path.clone(),
                    reason: err.message.clone(),
                },
            };
        }
        let changed: Vec<String> = std::mem::take(&mut self.changed).into_iter().collect();
        let store = &self.services;
        let updated = if self.merge_all {
            None
        } else {
            merge_update(
                plan,
                |key| store.get(key).map(Stored::plan_ref),
                &changed,
                &mut self.merges.0,
            )
        };
        let all = updated.is_none();
        let result = match updated {
            Some(result) => result,
            None => {
                let refs: Vec<PlanRef<'_>> = store.objects.iter().map(Stored::plan_ref).collect();
                merge_refs(plan, &refs, &mut self.merges.0)
            }
        };
        match result {
            Ok(mut merged) => {
                // The cache holds these objects' validated entries now: only their
                // identity stays stored.
                let merges = &self.merges;
                if all {
                    for stored in &mut self.services.objects {
                        stored.settle(merges);
                    }
                } else {
                    for key in &changed {
                        if let Some(&i) = self.services.index.get(key.as_str())
                            && let Some(stored) = self.services.objects.get_mut(i)
                        {
                            stored.settle(merges);
                        }
                    }
                }
                self.merge_all = false;
                for (key, err) in &self.undecodable {
                    merged.refused.push(PlanError::InvalidField {
                        object: format!("ServiceProxyPlan/{key}"),
                        field: err.path.clone(),
                        reason: err.message.clone(),
                    });
                }
                PlanOutcome::Merged(Arc::new(merged))
            }
            Err(error) => {
                // The changes were not taken in: look at everything next time.
                self.merge_all = true;
                PlanOutcome::Invalid {
                    revision: plan.spec.revision.clone(),
                    error,
                }
            }
        }
    }
}

/// Drops what the agent does not read of a stored Service plan's metadata (its trigger
/// time is read before): annotations, owner references, the uid, and labels that only
/// repeat the name. Each map is a B-tree node of half a KiB: 10 MB at 10,000 Service
/// plans.
fn slim(meta: &mut ObjectMeta) {
    meta.annotations = None;
    meta.owner_references = None;
    meta.uid = None;
    let service = meta
        .labels
        .as_mut()
        .and_then(|labels| labels.remove(SERVICE_LABEL));
    let base = meta
        .name
        .as_deref()
        .map(|name| name.split_once('.').map_or(name, |(base, _)| base));
    meta.labels = service
        .filter(|service| Some(service.as_str()) != base)
        .map(|service| BTreeMap::from([(SERVICE_LABEL.to_owned(), service)]));
}

/// The `resourceVersion` of a watched object.
fn version_of<K: kube::Resource>(object: &K) -> Option<String> {
    object.meta().resource_version.clone()
}

/// `namespace/name` of a watched object.
fn qualified<K: kube::Resource>(object: &K) -> String {
    format!(
        "{}/{}",
        object.meta().namespace.as_deref().unwrap_or_default(),
        object.name_any()
    )
}

fn blank_spec(name: &str) -> proxyplan_crds::NodeProxyPlanSpec {
    proxyplan_crds::NodeProxyPlanSpec {
        node_name: name.to_owned(),
        revision: String::new(),
        zone: None,
        pod_cidrs: Vec::new(),
        addresses: Vec::new(),
        local_traffic: proxyplan_crds::LocalTrafficDetection {
            mode: proxyplan_crds::LocalTrafficMode::ClusterCIDR,
            cidrs: Vec::new(),
            interface: None,
        },
        overlay: Vec::new(),
        ineligible: None,
        service_cidrs: Vec::new(),
    }
}

/// When the EndpointSlice change behind a plan object was triggered, as the controller
/// annotated it ([`TRIGGER_TIME_ANNOTATION`]); none when unset or unreadable.
#[must_use]
pub fn trigger_time(meta: &ObjectMeta) -> Option<SystemTime> {
    let text = meta.annotations.as_ref()?.get(TRIGGER_TIME_ANNOTATION)?;
    let at: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    Some(SystemTime::from(at))
}

#[cfg(test)]
mod tests {
    use proxyplan_crds::ServiceProxyPlanSpec;

    use super::*;

    fn lenient<K>(object: K) -> Lenient<K>
    where
        K: kube::Resource,
    {
        let meta = object.meta().clone();
        Lenient::decoded(meta, object)
    }

    fn plan(revision: &str) -> Lenient<NodeProxyPlan> {
        let mut spec = blank_spec("node-a");
        spec.revision = revision.to_owned();
        let mut plan = NodeProxyPlan::new("node-a", spec);
        plan.metadata.uid = Some("uid-1".to_owned());
        lenient(plan)
    }

    /// A Service plan `demo/<name>` at `version` with one entry per port name.
    fn service(name: &str, version: &str, ports: &[&str]) -> Lenient<ServiceProxyPlan> {
        let mut object = ServiceProxyPlan::new(
            name,
            ServiceProxyPlanSpec {
                revision: version.to_owned(),
                service_ports: ports
                    .iter()
                    .enumerate()
                    .map(|(i, port)| {
                        serde_json::from_str(&format!(
                            r#"{{"key":"demo/{name}:{port}/TCP/IPv4","namespace":"demo",
                            "name":"{name}","portName":"{port}",
                            "family":"IPv4","protocol":"TCP","port":80,"clusterIP":"10.96.0.{}",
                            "internal":{{"policy":"Cluster","whenEmpty":"Reject"}},
                            "masquerade":{{"all":false,"offClusterToClusterIP":false,
                            "external":false,"localHostToExternal":false,"hairpin":true}}}}"#,
                            i + 1
                        ))
                        .unwrap()
                    })
                    .collect(),
                summary: None,
            },
        );
        object.metadata.namespace = Some("demo".to_owned());
        object.metadata.resource_version = Some(version.to_owned());
        lenient(object)
    }

    fn listed(
        cache: &mut PlanCache,
        plan: Lenient<NodeProxyPlan>,
        services: Vec<Lenient<ServiceProxyPlan>>,
    ) {
        cache.plan_event(Event::Init);
        cache.plan_event(Event::InitApply(plan));
        cache.plan_event(Event::InitDone);
        cache.service_event(Event::Init);
        for s in services {
            cache.service_event(Event::InitApply(s));
        }
        cache.service_event(Event::InitDone);
    }

    /// A listed Service plan goes into the merge cache as it arrives: the list is never
    /// held twice, and the merge after it has every entry.
    #[test]
    fn listed_service_plans_are_held_by_the_merge_cache_as_they_arrive() {
        let mut cache = PlanCache::default();
        cache.plan_event(Event::Init);
        cache.plan_event(Event::InitApply(plan("r1")));
        cache.plan_event(Event::InitDone);
        cache.service_event(Event::Init);
        cache.service_event(Event::InitApply(service("a", "1", &["x", "y"])));
        assert!(
            matches!(cache.services.get("demo/a"), Some(Stored::Held { .. })),
            "only its identity is stored: the merge cache holds its entries"
        );
        assert!(cache.merges.0.holds("demo/a", "1"));
        cache.service_event(Event::InitDone);
        assert_eq!(
            keys(&cache.evaluate()),
            ["demo/a:x/TCP/IPv4", "demo/a:y/TCP/IPv4"]
        );
    }

    /// The controller's rollout status moves a Service plan's resourceVersion but not its
    /// generation: nothing to merge or program, and no step of the rollout mark (a spec
    /// change and a delete are).
    #[test]
    fn a_status_write_is_received_but_not_relevant() {
        let object = |version: &str, generation: i64, revision: &str| {
            let mut object = service("a", version, &["x"]).object.unwrap();
            object.metadata.generation = Some(generation);
            object.spec.revision = revision.to_owned();
            lenient(object)
        };
        let with_generation = |version: &str, generation: i64| object(version, generation, version);
        let mut cache = PlanCache::default();
        listed(&mut cache, plan("r1"), vec![with_generation("10", 1)]);
        assert_eq!(cache.received(), 10);
        assert!(matches!(cache.evaluate(), PlanOutcome::Merged(_)));
        let status_only = object("12", 1, "10");
        let change = cache.service_event(Event::Apply(status_only));
        assert!(!change.relevant, "a status write is no change to program");
        assert_eq!(cache.received(), 10, "nor a step of the rollout mark");
        assert!(
            cache.merges.0.holds("demo/a", "10"),
            "the held entries stay, under their own version"
        );
        // A spec change (a new generation) is.
        let change = cache.service_event(Event::Apply(with_generation("14", 2)));
        assert!(change.relevant);
        assert_eq!(cache.received(), 14);
        // A list in progress moves it only once it is done.
        cache.service_event(Event::Init);
        cache.service_event(Event::InitApply(with_generation("30", 3)));
        assert_eq!(
            cache.received(),
            14,
            "a part of a list says nothing of the rest"
        );
        cache.service_event(Event::InitDone);
        assert_eq!(cache.received(), 30);
        // A delete moves the mark too.
        cache.service_event(Event::Delete(with_generation("37", 3)));
        assert_eq!(cache.received(), 37);
    }

    fn keys(outcome: &PlanOutcome) -> Vec<String> {
        match outcome {
            PlanOutcome::Merged(m) => m.service_ports.iter().map(|e| e.key.clone()).collect(),
            other => panic!("not merged: {other:?}"),
        }
    }

    /// Once merged, a Service plan's entries live only in the merge cache; the merges
    /// after that are the same, and a new version of the object brings its new entries.
    #[test]
    fn merged_service_plans_keep_their_entries_in_the_merge_cache_only() {
        let mut cache = PlanCache::default();
        let a = service("a", "1", &["x", "y"]);
        let b = service("b", "1", &["z"]);
        listed(&mut cache, plan("r1"), vec![a.clone(), b]);
        assert_eq!(
            keys(&cache.evaluate()),
            [
                "demo/a:x/TCP/IPv4",
                "demo/a:y/TCP/IPv4",
                "demo/b:z/TCP/IPv4"
            ]
        );
        let held = |cache: &PlanCache, key: &str| {
            matches!(cache.services.get(key), Some(Stored::Held { .. }))
        };
        assert!(held(&cache, "demo/a"), "only the identity stays stored");
        assert_eq!(keys(&cache.evaluate()).len(), 3);

        // The same version again changes nothing.
        let same = cache.service_event(Event::Apply(a));
        assert!(!same.relevant);
        assert_eq!(keys(&cache.evaluate()).len(), 3);

        // A new version brings its entries; a deleted object is forgotten.
        let a2 = service("a", "2", &["w"]);
        assert!(cache.service_event(Event::Apply(a2)).relevant);
        assert!(
            !held(&cache, "demo/a"),
            "a new version is stored whole until merged"
        );
        assert_eq!(
            keys(&cache.evaluate()),
            ["demo/a:w/TCP/IPv4", "demo/b:z/TCP/IPv4"]
        );
        let gone = cache.service_event(Event::Delete(service("b", "1", &[])));
        assert!(gone.relevant);
        assert!(!cache.merges.0.holds("demo/b", "1"));
        assert_eq!(keys(&cache.evaluate()), ["demo/a:w/TCP/IPv4"]);

        // A re-list of the same versions merges as before.
        cache.service_event(Event::Init);
        cache.service_event(Event::InitApply(service("a", "2", &["w"])));
        cache.service_event(Event::InitApply(service("b", "1", &["z"])));
        cache.service_event(Event::InitDone);
        assert_eq!(keys(&cache.evaluate()).len(), 2);
        assert!(held(&cache, "demo/b"));
    }

    /// A re-list stores what it shows as it arrives and drops, when complete, what it
    /// did not show.
    #[test]
    fn a_relist_drops_what_it_did_not_show() {
        let mut cache = PlanCache::default();
        let (a, b) = (service("a", "1", &["x"]), service("b", "1", &["y"]));
        listed(&mut cache, plan("r1"), vec![a, b]);
        assert_eq!(keys(&cache.evaluate()).len(), 2);
        cache.service_event(Event::Init);
        cache.service_event(Event::InitApply(service("a", "2", &["w"])));
        assert_eq!(
            cache.service_plans(),
            2,
            "b stays until the list is complete"
        );
        assert!(cache.service_event(Event::InitDone).relevant);
        assert_eq!(cache.service_plans(), 1);
        assert!(!cache.merges.0.holds("demo/b", "1"));
        assert_eq!(keys(&cache.evaluate()), ["demo/a:w/TCP/IPv4"]);
    }

    /// Stored metadata keeps only what the merge reads: a Service label that differs
    /// from the name stays (it names the Service the entries must belong to).
    #[test]
    fn stored_metadata_keeps_only_what_the_merge_reads() {
        let mut meta = ObjectMeta {
            name: Some("web.1".to_owned()),
            labels: Some(BTreeMap::from([
                (SERVICE_LABEL.to_owned(), "web".to_owned()),
                ("app.kubernetes.io/managed-by".to_owned(), "x".to_owned()),
            ])),
            annotations: Some(BTreeMap::from([("a".to_owned(), "b".to_owned())])),
            ..ObjectMeta::default()
        };
        slim(&mut meta);
        assert_eq!((meta.labels, meta.annotations), (None, None));
        let mut other = ObjectMeta {
            name: Some("web".to_owned()),
            labels: Some(BTreeMap::from([(
                SERVICE_LABEL.to_owned(),
                "api".to_owned(),
            )])),
            ..ObjectMeta::default()
        };
        slim(&mut other);
        assert_eq!(
            other.labels,
            Some(BTreeMap::from([(
                SERVICE_LABEL.to_owned(),
                "api".to_owned()
            )]))
        );
    }

    #[test]
    fn nothing_is_evaluated_before_every_watch_listed() {
        let mut cache = PlanCache::default();
        assert!(matches!(cache.evaluate(), PlanOutcome::NotListed));
        cache.plan_event(Event::Init);
        cache.plan_event(Event::InitDone);
        assert!(matches!(cache.evaluate(), PlanOutcome::NotListed));
        cache.service_event(Event::Init);
        cache.service_event(Event::InitDone);
        assert!(matches!(cache.evaluate(), PlanOutcome::NoPlan));
    }

    #[test]
    fn only_spec_changes_are_relevant() {
        let mut cache = PlanCache::default();
        listed(&mut cache, plan("p1"), vec![service("a", "1", &["x"])]);
        let mut with_status = plan("p1");
        if let Ok(p) = &mut with_status.object {
            p.status = Some(proxyplan_crds::NodeProxyPlanStatus::default());
        }
        let change = cache.plan_event(Event::Apply(with_status));
        assert!(!change.relevant && !change.new_object, "status-only update");
        let mut recreated = plan("p1");
        if let Ok(p) = &mut recreated.object {
            p.metadata.uid = Some("uid-2".to_owned());
        }
        kube::Resource::meta_mut(&mut recreated).uid = Some("uid-2".to_owned());
        assert!(cache.plan_event(Event::Apply(recreated)).new_object);
    }

    #[test]
    fn an_undecodable_service_plan_is_refused_alone_and_its_last_good_version_kept() {
        let mut cache = PlanCache::default();
        listed(
            &mut cache,
            plan("p1"),
            vec![service("a", "1", &["x"]), service("b", "1", &["y"])],
        );
        assert_eq!(keys(&cache.evaluate()).len(), 2);
        let odd: Lenient<ServiceProxyPlan> = serde_json::from_value(serde_json::json!({
            "apiVersion": "proxyplan.dev/v1alpha1",
            "kind": "ServiceProxyPlan",
            "metadata": {"name": "a", "namespace": "demo", "resourceVersion": "2"},
            "spec": {"revision": "2", "servicePorts": [{"key": "demo/a:x/QUIC/IPv4"}]}
        }))
        .unwrap();
        assert!(cache.service_event(Event::Apply(odd)).relevant);
        match cache.evaluate() {
            PlanOutcome::Merged(m) => {
                assert_eq!(m.service_ports.len(), 2, "the last good version stays");
                assert_eq!(m.refused.len(), 1);
                let text = m.refused[0].to_string();
                assert!(
                    text.starts_with("ServiceProxyPlan/demo/a: spec.servicePorts[0]"),
                    "{text}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(
            cache
                .service_event(Event::Apply(service("a", "3", &["x"])))
                .relevant
        );
        match cache.evaluate() {
            PlanOutcome::Merged(m) => assert!(m.refused.is_empty()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_undecodable_plan_is_refused_with_the_field_named() {
        let mut cache = PlanCache::default();
        let odd: Lenient<NodeProxyPlan> = serde_json::from_value(serde_json::json!({
            "apiVersion": "proxyplan.dev/v1alpha1",
            "kind": "NodeProxyPlan",
            "metadata": {"name": "node-a", "uid": "u"},
            "spec": {"nodeName": "node-a", "revision": "r",
                     "localTraffic": {"mode": "SomethingNew"}}
        }))
        .unwrap();
        listed(&mut cache, odd, Vec::new());
        match cache.evaluate() {
            PlanOutcome::Invalid { error, .. } => {
                assert!(
                    error.to_string().contains("spec.localTraffic.mode"),
                    "{error}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_invalid_plan_is_refused_with_the_field_named() {
        let mut cache = PlanCache::default();
        let mut bad = plan("p1");
        if let Ok(p) = &mut bad.object {
            p.spec.pod_cidrs = vec!["10.0.0.0/40".to_owned()];
        }
        listed(&mut cache, bad, Vec::new());
        match cache.evaluate() {
            PlanOutcome::Invalid { error, .. } => {
                assert!(error.to_string().contains("spec.podCIDRs[0]"), "{error}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_trigger_time_is_the_controllers_annotation() {
        let meta = |value: &str| ObjectMeta {
            annotations: Some([(TRIGGER_TIME_ANNOTATION.to_owned(), value.to_owned())].into()),
            ..ObjectMeta::default()
        };
        assert_eq!(
            trigger_time(&meta("2023-11-14T22:13:20.25Z")),
            Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_250))
        );
        assert_eq!(trigger_time(&meta("yesterday")), None);
        assert_eq!(trigger_time(&ObjectMeta::default()), None);
    }
}
