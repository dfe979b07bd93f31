//! The incremental planner: an index of Services, EndpointSlices and Nodes, updated one
//! event at a time, that knows which plan objects each event changed.
//!
//! Pure and synchronous. Every event recomputes only the Service (or Node) it touches,
//! compares the result with what that Service contributed before, and marks only the
//! objects whose content may differ. [`Planner::take_changes`] builds just those.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use proxyplan_crds::{
    LocalTrafficDetection, LocalTrafficMode, MANAGED_BY, MANAGED_BY_LABEL, NodeProxyPlan,
    NodeProxyPlanSpec, SERVICE_LABEL, ServicePlanSummary, ServiceProxyPlan, ServiceProxyPlanSpec,
    TRIGGER_TIME_ANNOTATION, revision_of,
};

use crate::config::PlannerConfig;
use crate::model::{NodeModel, ObjectError, ServiceKey, ServiceModel, SliceModel};
use crate::select::{ServiceOutput, plan_service};
use crate::split::split_entries;

/// Identity of one object the planner produces.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectId {
    /// The `NodeProxyPlan` of a node.
    Plan(String),
    /// Part `n` of a Service's `ServiceProxyPlan`s (part 0 is named after the Service,
    /// part `n` after it with `.n`).
    Service(ServiceKey, u32),
}

impl ObjectId {
    /// The object's Kubernetes name.
    #[must_use]
    pub fn name(&self) -> String {
        match self {
            Self::Plan(node) => node.clone(),
            Self::Service(key, 0) => key.name.clone(),
            Self::Service(key, part) => format!("{}.{part}", key.name),
        }
    }

    /// The object's namespace (`None` for cluster-scoped node plans).
    #[must_use]
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Self::Plan(_) => None,
            Self::Service(key, _) => Some(&key.namespace),
        }
    }

    /// `namespace/name` of a Service plan, the name of a node plan: how the writer and
    /// logs name it.
    #[must_use]
    pub fn qualified_name(&self) -> String {
        match self.namespace() {
            Some(namespace) => format!("{namespace}/{}", self.name()),
            None => self.name(),
        }
    }

    /// The identity a Service plan named `namespace/name` would have.
    #[must_use]
    pub fn service_part(qualified: &str) -> Option<Self> {
        let (namespace, name) = qualified.split_once('/')?;
        let (service, part) = match name.split_once('.') {
            Some((service, part)) => (service, part.parse().ok().filter(|p| *p > 0)?),
            None => (name, 0),
        };
        Some(Self::Service(
            ServiceKey {
                namespace: namespace.to_owned(),
                name: service.to_owned(),
            },
            part,
        ))
    }
}

/// One object as the planner wants it.
#[derive(Debug, Clone)]
#[allow(
    clippy::large_enum_variant,
    reason = "both variants are a few hundred bytes and are moved, not copied, in bulk"
)]
pub enum DesiredObject {
    /// A node plan.
    Plan(NodeProxyPlan),
    /// A Service's plan (or one part of it).
    Service(ServiceProxyPlan),
}

impl DesiredObject {
    /// The object's name.
    #[must_use]
    pub fn name(&self) -> &str {
        match self {
            Self::Plan(p) => p.metadata.name.as_deref().unwrap_or_default(),
            Self::Service(s) => s.metadata.name.as_deref().unwrap_or_default(),
        }
    }

    /// `namespace/name` of a Service plan, the name of a node plan.
    #[must_use]
    pub fn qualified_name(&self) -> String {
        match self {
            Self::Plan(p) => p.metadata.name.clone().unwrap_or_default(),
            Self::Service(s) => proxyplan_crds::object_key(s),
        }
    }

    /// The content revision.
    #[must_use]
    pub fn revision(&self) -> &str {
        match self {
            Self::Plan(p) => &p.spec.revision,
            Self::Service(s) => &s.spec.revision,
        }
    }
}

impl serde::Serialize for DesiredObject {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Plan(p) => p.serialize(serializer),
            Self::Service(s) => s.serialize(serializer),
        }
    }
}

/// What changed since the last [`Planner::take_changes`].
#[derive(Debug, Clone, Default)]
pub struct Changes {
    /// Objects to create or update (the writer still skips those whose revision the
    /// server already has).
    pub apply: Vec<DesiredObject>,
    /// Objects that must no longer exist.
    pub delete: Vec<ObjectId>,
    /// For each Service whose plan was rebuilt: what had to be left out of it (empty
    /// when nothing), for Warning Events.
    pub warnings: Vec<(ServiceKey, Vec<String>)>,
}

impl Changes {
    /// Nothing to do.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.apply.is_empty() && self.delete.is_empty()
    }
}

/// The planner's state.
#[derive(Debug)]
pub struct Planner {
    config: PlannerConfig,
    services: HashMap<ServiceKey, ServiceModel>,
    slices: HashMap<ServiceKey, BTreeMap<String, SliceModel>>,
    slice_owner: HashMap<ServiceKey, ServiceKey>,
    nodes: BTreeMap<String, NodeModel>,
    outputs: HashMap<ServiceKey, ServiceOutput>,
    /// How many `ServiceProxyPlan`s each Service has (usually one).
    parts: HashMap<ServiceKey, u32>,
    node_members: HashMap<String, BTreeSet<ServiceKey>>,
    dirty: BTreeSet<ObjectId>,
    /// The newest EndpointSlice trigger time behind each Service's plan, and behind each
    /// node plan's overlay (annotated on the objects for the agents' latency metric).
    triggers: HashMap<ServiceKey, Timestamp>,
    node_triggers: HashMap<String, Timestamp>,
    /// The ranges of each ServiceCIDR object, normalised.
    service_cidrs: BTreeMap<String, Vec<String>>,
}

impl Planner {
    /// An empty planner.
    #[must_use]
    pub fn new(config: PlannerConfig) -> Self {
        Self {
            config,
            services: HashMap::new(),
            slices: HashMap::new(),
            slice_owner: HashMap::new(),
            nodes: BTreeMap::new(),
            outputs: HashMap::new(),
            parts: HashMap::new(),
            node_members: HashMap::new(),
            dirty: BTreeSet::new(),
            triggers: HashMap::new(),
            node_triggers: HashMap::new(),
            service_cidrs: BTreeMap::new(),
        }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &PlannerConfig {
        &self.config
    }

    /// Number of Services planned.
    #[must_use]
    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// Number of nodes known.
    #[must_use]
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Adds or updates a Service.
    ///
    /// # Errors
    /// When the Service is not planned: [`ObjectError::Ignored`] removes it (it may have
    /// become headless or ExternalName), [`ObjectError::Invalid`] keeps the last good
    /// version so that nothing already working is lost.
    pub fn apply_service(&mut self, svc: &Service) -> Result<(), ObjectError> {
        match ServiceModel::from_service(svc) {
            Ok(model) => {
                if self.services.get(&model.key) != Some(&model) {
                    let key = model.key.clone();
                    self.services.insert(key.clone(), model);
                    self.recompute(&key);
                }
                Ok(())
            }
            Err(err) => {
                if !err.is_invalid() {
                    self.remove_service(&service_key(&svc.metadata));
                }
                Err(err)
            }
        }
    }

    /// Removes a Service.
    pub fn delete_service(&mut self, svc: &Service) {
        self.remove_service(&service_key(&svc.metadata));
    }

    /// Removes the Service `key`.
    pub fn delete_service_named(&mut self, key: &ServiceKey) {
        self.remove_service(key);
    }

    /// Removes every Service not in `keep` (after a watch re-list).
    pub fn retain_services(&mut self, keep: &[ServiceKey]) {
        let keep: BTreeSet<&ServiceKey> = keep.iter().collect();
        let gone: Vec<ServiceKey> = self
            .services
            .keys()
            .filter(|k| !keep.contains(k))
            .cloned()
            .collect();
        for key in gone {
            self.remove_service(&key);
        }
    }

    /// Removes the EndpointSlice whose own namespace and name are `own`.
    pub fn delete_slice_named(&mut self, own: &ServiceKey) {
        self.remove_slice(own);
    }

    /// Removes every EndpointSlice not in `keep` (their own namespaces and names).
    pub fn retain_slices(&mut self, keep: &[ServiceKey]) {
        let keep: BTreeSet<&ServiceKey> = keep.iter().collect();
        let gone: Vec<ServiceKey> = self
            .slice_owner
            .keys()
            .filter(|k| !keep.contains(k))
            .cloned()
            .collect();
        for own in gone {
            self.remove_slice(&own);
        }
    }

    /// Removes every Node not in `keep`.
    pub fn retain_nodes(&mut self, keep: &[String]) {
        let keep: BTreeSet<&String> = keep.iter().collect();
        let gone: Vec<String> = self
            .nodes
            .keys()
            .filter(|k| !keep.contains(k))
            .cloned()
            .collect();
        for name in gone {
            self.delete_node(&name);
        }
    }

    fn remove_service(&mut self, key: &ServiceKey) {
        if self.services.remove(key).is_some() {
            self.recompute(key);
        }
    }

    /// Adds or updates an EndpointSlice.
    ///
    /// # Errors
    /// As [`Planner::apply_service`]: ignored slices are removed, invalid ones keep their
    /// last good version.
    pub fn apply_slice(&mut self, slice: &EndpointSlice) -> Result<(), ObjectError> {
        let own = service_key(&slice.metadata);
        match SliceModel::from_slice(slice) {
            Ok(model) => {
                let service = model.service.clone();
                if let Some(previous) = self.slice_owner.get(&own).cloned()
                    && previous != service
                {
                    self.remove_slice(&own);
                }
                let slot = self.slices.entry(service.clone()).or_default();
                if slot.get(&model.name) != Some(&model) {
                    slot.insert(model.name.clone(), model);
                    self.slice_owner.insert(own, service.clone());
                    self.recompute(&service);
                }
                Ok(())
            }
            Err(err) => {
                if !err.is_invalid() {
                    self.remove_slice(&own);
                }
                Err(err)
            }
        }
    }

    /// Removes an EndpointSlice.
    pub fn delete_slice(&mut self, slice: &EndpointSlice) {
        self.remove_slice(&service_key(&slice.metadata));
    }

    fn remove_slice(&mut self, own: &ServiceKey) {
        let Some(service) = self.slice_owner.remove(own) else {
            return;
        };
        if let Some(slot) = self.slices.get_mut(&service) {
            slot.remove(&own.name);
            if slot.is_empty() {
                self.slices.remove(&service);
            }
        }
        self.recompute(&service);
    }

    /// Adds or updates a Node. Status-only updates (heartbeats) change nothing.
    ///
    /// # Errors
    /// [`ObjectError::Invalid`] keeps the last good version.
    pub fn apply_node(&mut self, node: &Node) -> Result<(), ObjectError> {
        let model = NodeModel::from_node(node)?;
        if self.nodes.get(&model.name) == Some(&model) {
            return Ok(());
        }
        let name = model.name.clone();
        self.nodes.insert(name.clone(), model);
        self.dirty.insert(ObjectId::Plan(name));
        Ok(())
    }

    /// Adds or updates a ServiceCIDR object's ranges. Every node plan carries the union,
    /// so a change rewrites them all (ServiceCIDRs change about never).
    ///
    /// # Errors
    /// [`ObjectError::Invalid`] naming the malformed range; the object's last good ranges
    /// stay.
    pub fn apply_service_cidr(&mut self, name: &str, ranges: &[String]) -> Result<(), ObjectError> {
        let mut normalised = Vec::with_capacity(ranges.len());
        for (i, range) in ranges.iter().enumerate() {
            let (ip, len) =
                crate::model::parse_cidr(range).map_err(|reason| ObjectError::Invalid {
                    kind: "ServiceCIDR",
                    object: name.to_owned(),
                    field: format!("spec.cidrs[{i}]"),
                    reason,
                })?;
            normalised.push(format!("{ip}/{len}"));
        }
        let before = self.service_cidr_union();
        self.service_cidrs.insert(name.to_owned(), normalised);
        self.service_cidrs_changed(&before);
        Ok(())
    }

    /// Removes a ServiceCIDR object.
    pub fn delete_service_cidr(&mut self, name: &str) {
        let before = self.service_cidr_union();
        self.service_cidrs.remove(name);
        self.service_cidrs_changed(&before);
    }

    /// Removes every ServiceCIDR object not in `keep`.
    pub fn retain_service_cidrs(&mut self, keep: &[String]) {
        let before = self.service_cidr_union();
        self.service_cidrs.retain(|name, _| keep.contains(name));
        self.service_cidrs_changed(&before);
    }

    /// Every Service CIDR of the cluster, sorted, once each.
    fn service_cidr_union(&self) -> Vec<String> {
        let set: BTreeSet<&String> = self.service_cidrs.values().flatten().collect();
        set.into_iter().cloned().collect()
    }

    fn service_cidrs_changed(&mut self, before: &[String]) {
        if self.service_cidr_union() != before {
            let nodes: Vec<String> = self.nodes.keys().cloned().collect();
            self.dirty.extend(nodes.into_iter().map(ObjectId::Plan));
        }
    }

    /// Removes a Node (its plan is deleted).
    pub fn delete_node(&mut self, name: &str) {
        if self.nodes.remove(name).is_some() {
            self.node_triggers.remove(name);
            self.dirty.insert(ObjectId::Plan(name.to_owned()));
        }
    }

    /// Replaces every Service (after a watch re-list): those not in `all` are removed.
    /// Returns the errors of the Services that were not planned.
    pub fn reset_services(&mut self, all: &[Service]) -> Vec<ObjectError> {
        let keep: BTreeSet<ServiceKey> = all.iter().map(|s| service_key(&s.metadata)).collect();
        let gone: Vec<ServiceKey> = self
            .services
            .keys()
            .filter(|k| !keep.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            self.remove_service(&key);
        }
        all.iter()
            .filter_map(|s| self.apply_service(s).err())
            .collect()
    }

    /// Replaces every EndpointSlice, as [`Planner::reset_services`].
    pub fn reset_slices(&mut self, all: &[EndpointSlice]) -> Vec<ObjectError> {
        let keep: BTreeSet<ServiceKey> = all.iter().map(|s| service_key(&s.metadata)).collect();
        let gone: Vec<ServiceKey> = self
            .slice_owner
            .keys()
            .filter(|k| !keep.contains(*k))
            .cloned()
            .collect();
        for own in gone {
            self.remove_slice(&own);
        }
        all.iter()
            .filter_map(|s| self.apply_slice(s).err())
            .collect()
    }

    /// Replaces every Node, as [`Planner::reset_services`].
    pub fn reset_nodes(&mut self, all: &[Node]) -> Vec<ObjectError> {
        let keep: BTreeSet<String> = all.iter().filter_map(|n| n.metadata.name.clone()).collect();
        let gone: Vec<String> = self
            .nodes
            .keys()
            .filter(|k| !keep.contains(*k))
            .cloned()
            .collect();
        for name in gone {
            self.delete_node(&name);
        }
        all.iter()
            .filter_map(|n| self.apply_node(n).err())
            .collect()
    }

    /// Recomputes one Service's contribution and marks what it changed.
    fn recompute(&mut self, key: &ServiceKey) {
        let new = match self.services.get(key) {
            Some(svc) => {
                let slices = self.slices.get(key);
                plan_service(
                    svc,
                    slices.into_iter().flat_map(BTreeMap::values),
                    &self.config,
                )
            }
            None => ServiceOutput::default(),
        };
        let old = self.outputs.remove(key).unwrap_or_default();
        if old == new {
            if !new.entries.is_empty() {
                self.outputs.insert(key.clone(), new);
            }
            return;
        }
        let trigger = self
            .slices
            .get(key)
            .into_iter()
            .flat_map(BTreeMap::values)
            .filter_map(|s| s.trigger)
            .max();
        match trigger {
            Some(t) if !new.entries.is_empty() => {
                self.triggers.insert(key.clone(), t);
            }
            _ => {
                self.triggers.remove(key);
            }
        }
        if old.entries != new.entries || old.owner != new.owner {
            self.dirty.insert(ObjectId::Service(key.clone(), 0));
        }
        for node in changed_keys(&old.node_overrides, &new.node_overrides) {
            if let Some(t) = trigger {
                let slot = self.node_triggers.entry(node.clone()).or_insert(t);
                *slot = (*slot).max(t);
            }
            update_membership(
                &mut self.node_members,
                &node,
                key,
                new.node_overrides.contains_key(&node),
            );
            self.dirty.insert(ObjectId::Plan(node));
        }
        if !new.entries.is_empty() {
            self.outputs.insert(key.clone(), new);
        }
    }

    /// Whether an object should exist now.
    fn exists(&self, id: &ObjectId) -> bool {
        match id {
            ObjectId::Plan(node) => self.nodes.contains_key(node),
            ObjectId::Service(key, part) => self.parts.get(key).is_some_and(|n| part < n),
        }
    }

    /// Builds every object marked since the last call: the ones to write, and the ones
    /// that must go.
    pub fn take_changes(&mut self) -> Changes {
        let dirty = std::mem::take(&mut self.dirty);
        let mut changes = Changes::default();
        for id in dirty {
            match id {
                ObjectId::Plan(node) => match self.nodes.get(&node) {
                    Some(model) => changes
                        .apply
                        .push(DesiredObject::Plan(self.build_plan(model))),
                    None => changes.delete.push(ObjectId::Plan(node)),
                },
                ObjectId::Service(key, _) => {
                    let parts = self.build_service(&key);
                    changes
                        .warnings
                        .push((key.clone(), self.warnings(&key).to_vec()));
                    let had = self.parts.get(&key).copied().unwrap_or(0);
                    let now = u32::try_from(parts.len()).unwrap_or(u32::MAX);
                    changes
                        .delete
                        .extend((now..had).map(|part| ObjectId::Service(key.clone(), part)));
                    if now == 0 {
                        self.parts.remove(&key);
                    } else {
                        self.parts.insert(key, now);
                    }
                    changes
                        .apply
                        .extend(parts.into_iter().map(DesiredObject::Service));
                }
            }
        }
        changes
    }

    /// Every object that should exist, built from scratch (for a full reconcile).
    #[must_use]
    pub fn all_objects(&self) -> Vec<DesiredObject> {
        let mut keys: Vec<&ServiceKey> = self.outputs.keys().collect();
        keys.sort();
        let mut all: Vec<DesiredObject> = keys
            .into_iter()
            .flat_map(|key| self.build_service(key))
            .map(DesiredObject::Service)
            .collect();
        all.extend(
            self.nodes
                .values()
                .map(|n| DesiredObject::Plan(self.build_plan(n))),
        );
        all
    }

    /// Identities of every Service plan that should exist (after the changes taken).
    #[must_use]
    pub fn service_ids(&self) -> Vec<ObjectId> {
        let mut ids: Vec<ObjectId> = self
            .parts
            .iter()
            .flat_map(|(key, n)| (0..*n).map(|part| ObjectId::Service(key.clone(), part)))
            .collect();
        ids.sort();
        ids
    }

    /// Whether a node is known.
    #[must_use]
    pub fn has_node(&self, name: &str) -> bool {
        self.nodes.contains_key(name)
    }

    /// Whether an object should exist (after the changes taken).
    #[must_use]
    pub fn wants(&self, id: &ObjectId) -> bool {
        self.exists(id)
    }

    /// Marks an object to be rebuilt by the next [`Planner::take_changes`] (after a
    /// failed write, or when someone else changed it).
    pub fn mark_dirty(&mut self, id: ObjectId) {
        match id {
            ObjectId::Service(key, _) => self.dirty.insert(ObjectId::Service(key, 0)),
            plan => self.dirty.insert(plan),
        };
    }

    /// The plan of one node and every Service plan, as its agent would see them.
    #[must_use]
    pub fn node_view(&self, node: &str) -> Option<(NodeProxyPlan, Vec<ServiceProxyPlan>)> {
        let model = self.nodes.get(node)?;
        let plan = self.build_plan(model);
        let mut keys: Vec<&ServiceKey> = self.outputs.keys().collect();
        keys.sort();
        let services = keys
            .into_iter()
            .flat_map(|key| self.build_service(key))
            .collect();
        Some((plan, services))
    }

    /// Warnings about what the planner had to leave out of a Service's plan (more
    /// endpoints or addresses than an object can hold), for Events on the Service.
    #[must_use]
    pub fn warnings(&self, key: &ServiceKey) -> &[String] {
        self.outputs.get(key).map_or(&[], |o| o.warnings.as_slice())
    }

    fn build_plan(&self, node: &NodeModel) -> NodeProxyPlan {
        let mut overlay: Vec<_> = self
            .node_members
            .get(&node.name)
            .into_iter()
            .flatten()
            .filter_map(|svc| self.outputs.get(svc)?.node_overrides.get(&node.name))
            .flatten()
            .cloned()
            .collect();
        overlay.sort_by(|a, b| a.key.cmp(&b.key));
        let mut spec = NodeProxyPlanSpec {
            node_name: node.name.clone(),
            revision: String::new(),
            zone: node.zone.clone(),
            pod_cidrs: node.pod_cidrs.clone(),
            addresses: node.addresses.iter().map(ToString::to_string).collect(),
            local_traffic: LocalTrafficDetection {
                mode: self.config.detect_local_mode,
                cidrs: match self.config.detect_local_mode {
                    LocalTrafficMode::ClusterCIDR => self.config.cluster_cidrs.clone(),
                    LocalTrafficMode::NodeCIDR => node.pod_cidrs.clone(),
                    LocalTrafficMode::BridgeInterface | LocalTrafficMode::InterfaceNamePrefix => {
                        Vec::new()
                    }
                },
                interface: self.config.local_interface.clone(),
            },
            overlay,
            ineligible: node.ineligible.clone(),
            service_cidrs: self.service_cidr_union(),
        };
        spec.revision = revision_of(&spec);
        let mut plan = NodeProxyPlan::new(&node.name, spec);
        plan.metadata = managed_meta(&node.name, None);
        annotate_trigger(&mut plan.metadata, self.node_triggers.get(&node.name));
        plan.metadata.owner_references = node.uid.as_ref().map(|uid| {
            vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Node".to_owned(),
                name: node.name.clone(),
                uid: uid.clone(),
                ..OwnerReference::default()
            }]
        });
        plan
    }

    /// A Service's plan objects: its entries with their zone lists, spread over as many
    /// objects as their size needs (usually one).
    fn build_service(&self, key: &ServiceKey) -> Vec<ServiceProxyPlan> {
        let Some(output) = self.outputs.get(key) else {
            return Vec::new();
        };
        split_entries(output.entries.clone())
            .into_iter()
            .enumerate()
            .map(|(part, service_ports)| {
                let id = ObjectId::Service(key.clone(), u32::try_from(part).unwrap_or(u32::MAX));
                let mut spec = ServiceProxyPlanSpec {
                    revision: String::new(),
                    service_ports,
                    summary: None,
                };
                // The revision hashes the entries only: the summary is derived from them
                // for people (and an older CRD would prune it).
                spec.revision = revision_of(&spec);
                spec.summary = Some(ServicePlanSummary::of(&spec.service_ports));
                let mut object = ServiceProxyPlan::new(&id.name(), spec);
                object.metadata = managed_meta(&id.name(), Some(&key.name));
                object.metadata.namespace = Some(key.namespace.clone());
                annotate_trigger(&mut object.metadata, self.triggers.get(key));
                object.metadata.owner_references = output.owner.as_ref().map(|uid| {
                    vec![OwnerReference {
                        api_version: "v1".to_owned(),
                        kind: "Service".to_owned(),
                        name: key.name.clone(),
                        uid: uid.clone(),
                        ..OwnerReference::default()
                    }]
                });
                object
            })
            .collect()
    }
}

fn managed_meta(name: &str, service: Option<&str>) -> ObjectMeta {
    let mut labels = BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned())]);
    if let Some(service) = service {
        labels.insert(SERVICE_LABEL.to_owned(), service.to_owned());
    }
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(labels),
        ..ObjectMeta::default()
    }
}

/// Records on an object the EndpointSlice change behind it.
fn annotate_trigger(meta: &mut ObjectMeta, trigger: Option<&Timestamp>) {
    if let Some(t) = trigger {
        meta.annotations = Some(BTreeMap::from([(
            TRIGGER_TIME_ANNOTATION.to_owned(),
            t.to_string(),
        )]));
    }
}

fn service_key(meta: &ObjectMeta) -> ServiceKey {
    ServiceKey {
        namespace: meta
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        name: meta.name.clone().unwrap_or_default(),
    }
}

/// Keys whose values differ between two maps (present in one only, or unequal).
fn changed_keys<V: PartialEq>(old: &BTreeMap<String, V>, new: &BTreeMap<String, V>) -> Vec<String> {
    old.keys()
        .chain(new.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|k| old.get(*k) != new.get(*k))
        .cloned()
        .collect()
}

fn update_membership(
    index: &mut HashMap<String, BTreeSet<ServiceKey>>,
    group: &str,
    key: &ServiceKey,
    member: bool,
) {
    if member {
        index
            .entry(group.to_owned())
            .or_default()
            .insert(key.clone());
    } else if let Some(set) = index.get_mut(group) {
        set.remove(key);
        if set.is_empty() {
            index.remove(group);
        }
    }
}
