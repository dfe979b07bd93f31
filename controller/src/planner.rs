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
use proxyplan_crds::{
    LocalTrafficDetection, LocalTrafficMode, MANAGED_BY, MANAGED_BY_LABEL, NodeProxyPlan,
    NodeProxyPlanSpec, ProxyPlanShard, ProxyPlanShardSpec, SCOPE_LABEL, ShardRef, ShardScope,
    ZONE_LABEL, revision_of, stable_hash,
};

use crate::config::PlannerConfig;
use crate::model::{NodeModel, ObjectError, ServiceKey, ServiceModel, SliceModel};
use crate::select::{ServiceOutput, plan_service};

/// Identity of one object the planner produces.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectId {
    /// The `NodeProxyPlan` of a node.
    Plan(String),
    /// Cluster shard number `n`.
    ClusterShard(u32),
    /// Shard number `n` of a zone.
    ZoneShard(String, u32),
}

impl ObjectId {
    /// The object's Kubernetes name.
    #[must_use]
    pub fn name(&self) -> String {
        match self {
            Self::Plan(node) => node.clone(),
            Self::ClusterShard(n) => format!("cluster-{n}"),
            Self::ZoneShard(zone, n) => format!("zone-{}-{n}", proxyplan_crds::zone_slug(zone)),
        }
    }

    /// Whether this is a shard (as opposed to a node plan).
    #[must_use]
    pub fn is_shard(&self) -> bool {
        !matches!(self, Self::Plan(_))
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
    /// A shard.
    Shard(ProxyPlanShard),
}

impl DesiredObject {
    /// The object's name.
    #[must_use]
    pub fn name(&self) -> &str {
        match self {
            Self::Plan(p) => p.metadata.name.as_deref().unwrap_or_default(),
            Self::Shard(s) => s.metadata.name.as_deref().unwrap_or_default(),
        }
    }

    /// The content revision.
    #[must_use]
    pub fn revision(&self) -> &str {
        match self {
            Self::Plan(p) => &p.spec.revision,
            Self::Shard(s) => &s.spec.revision,
        }
    }
}

impl serde::Serialize for DesiredObject {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Plan(p) => p.serialize(serializer),
            Self::Shard(s) => s.serialize(serializer),
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
    zone_nodes: BTreeMap<String, usize>,
    outputs: HashMap<ServiceKey, ServiceOutput>,
    cluster_members: Vec<BTreeSet<ServiceKey>>,
    zone_members: HashMap<String, BTreeSet<ServiceKey>>,
    node_members: HashMap<String, BTreeSet<ServiceKey>>,
    dirty: BTreeSet<ObjectId>,
}

impl Planner {
    /// An empty planner. Every cluster shard starts dirty: they exist even when empty.
    #[must_use]
    pub fn new(config: PlannerConfig) -> Self {
        let shards = config.cluster_shards;
        Self {
            cluster_members: vec![BTreeSet::new(); shards as usize],
            dirty: (0..shards).map(ObjectId::ClusterShard).collect(),
            config,
            services: HashMap::new(),
            slices: HashMap::new(),
            slice_owner: HashMap::new(),
            nodes: BTreeMap::new(),
            zone_nodes: BTreeMap::new(),
            outputs: HashMap::new(),
            zone_members: HashMap::new(),
            node_members: HashMap::new(),
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
        let old_zone = self.nodes.get(&name).map(|n| n.zone.clone());
        if let Some(old_zone) = old_zone {
            self.leave_zone(old_zone.as_deref());
        }
        self.join_zone(model.zone.as_deref());
        self.nodes.insert(name.clone(), model);
        self.dirty.insert(ObjectId::Plan(name));
        Ok(())
    }

    /// Removes a Node (its plan is deleted).
    pub fn delete_node(&mut self, name: &str) {
        if let Some(model) = self.nodes.remove(name) {
            self.leave_zone(model.zone.as_deref());
            self.dirty.insert(ObjectId::Plan(name.to_owned()));
        }
    }

    fn join_zone(&mut self, zone: Option<&str>) {
        if let Some(zone) = zone {
            let count = self.zone_nodes.entry(zone.to_owned()).or_default();
            *count += 1;
            if *count == 1 {
                self.mark_zone_shards(zone);
            }
        }
    }

    fn leave_zone(&mut self, zone: Option<&str>) {
        if let Some(zone) = zone
            && let Some(count) = self.zone_nodes.get_mut(zone)
        {
            *count -= 1;
            if *count == 0 {
                self.zone_nodes.remove(zone);
                self.mark_zone_shards(zone);
            }
        }
    }

    fn mark_zone_shards(&mut self, zone: &str) {
        for n in 0..self.config.zone_shards {
            self.dirty.insert(ObjectId::ZoneShard(zone.to_owned(), n));
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

    fn cluster_shard_of(&self, key: &ServiceKey) -> u32 {
        shard_of(key, self.config.cluster_shards)
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
        let cluster = self.cluster_shard_of(key);
        if old.entries != new.entries {
            self.dirty.insert(ObjectId::ClusterShard(cluster));
        }
        let members = &mut self.cluster_members[cluster as usize];
        if new.entries.is_empty() {
            members.remove(key);
        } else {
            members.insert(key.clone());
        }
        let zone_shard = shard_of(key, self.config.zone_shards);
        for zone in changed_keys(&old.zone_overrides, &new.zone_overrides) {
            update_membership(
                &mut self.zone_members,
                &zone,
                key,
                new.zone_overrides.contains_key(&zone),
            );
            self.dirty.insert(ObjectId::ZoneShard(zone, zone_shard));
        }
        for node in changed_keys(&old.node_overrides, &new.node_overrides) {
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
            ObjectId::ClusterShard(n) => *n < self.config.cluster_shards,
            ObjectId::ZoneShard(zone, n) => {
                *n < self.config.zone_shards && self.zone_nodes.contains_key(zone)
            }
        }
    }

    /// Builds every object marked since the last call: the ones to write, and the ones
    /// that must go.
    pub fn take_changes(&mut self) -> Changes {
        let dirty = std::mem::take(&mut self.dirty);
        let mut changes = Changes::default();
        for id in dirty {
            match self.build(&id) {
                Some(object) if self.exists(&id) => changes.apply.push(object),
                _ => changes.delete.push(id),
            }
        }
        changes
    }

    /// Every object that should exist, built from scratch (for a full reconcile).
    #[must_use]
    pub fn all_objects(&self) -> Vec<DesiredObject> {
        self.all_ids()
            .iter()
            .filter_map(|id| self.build(id))
            .collect()
    }

    /// Identities of every object that should exist.
    #[must_use]
    pub fn all_ids(&self) -> Vec<ObjectId> {
        let mut ids = self.shard_ids();
        ids.extend(self.nodes.keys().map(|n| ObjectId::Plan(n.clone())));
        ids
    }

    /// Identities of every shard that should exist.
    #[must_use]
    pub fn shard_ids(&self) -> Vec<ObjectId> {
        let mut ids: Vec<ObjectId> = (0..self.config.cluster_shards)
            .map(ObjectId::ClusterShard)
            .collect();
        for zone in self.zone_nodes.keys() {
            ids.extend((0..self.config.zone_shards).map(|n| ObjectId::ZoneShard(zone.clone(), n)));
        }
        ids
    }

    /// Whether a node is known.
    #[must_use]
    pub fn has_node(&self, name: &str) -> bool {
        self.nodes.contains_key(name)
    }

    /// Marks an object to be rebuilt by the next [`Planner::take_changes`] (after a
    /// failed write, or when someone else changed it).
    pub fn mark_dirty(&mut self, id: ObjectId) {
        self.dirty.insert(id);
    }

    /// The plan of one node and the shards it references, as its agent would see them.
    #[must_use]
    pub fn node_view(&self, node: &str) -> Option<(NodeProxyPlan, Vec<ProxyPlanShard>)> {
        let model = self.nodes.get(node)?;
        let plan = self.build_plan(model);
        let shards = self
            .shard_ids_for(model)
            .iter()
            .filter_map(|id| match self.build(id)? {
                DesiredObject::Shard(s) => Some(s),
                DesiredObject::Plan(_) => None,
            })
            .collect();
        Some((plan, shards))
    }

    /// Builds one object; `None` for the plan of an unknown node.
    #[must_use]
    pub fn build(&self, id: &ObjectId) -> Option<DesiredObject> {
        Some(match id {
            ObjectId::Plan(node) => DesiredObject::Plan(self.build_plan(self.nodes.get(node)?)),
            ObjectId::ClusterShard(n) => DesiredObject::Shard(self.build_cluster_shard(id, *n)),
            ObjectId::ZoneShard(zone, n) => {
                DesiredObject::Shard(self.build_zone_shard(id, zone, *n))
            }
        })
    }

    fn shard_ids_for(&self, node: &NodeModel) -> Vec<ObjectId> {
        let mut ids: Vec<ObjectId> = (0..self.config.cluster_shards)
            .map(ObjectId::ClusterShard)
            .collect();
        if let Some(zone) = &node.zone {
            ids.extend((0..self.config.zone_shards).map(|n| ObjectId::ZoneShard(zone.clone(), n)));
        }
        ids
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
                },
            },
            shards: self
                .shard_ids_for(node)
                .iter()
                .map(|id| ShardRef { name: id.name() })
                .collect(),
            overlay,
        };
        spec.revision = revision_of(&spec);
        let mut plan = NodeProxyPlan::new(&node.name, spec);
        plan.metadata = managed_meta(&node.name, None);
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

    fn build_cluster_shard(&self, id: &ObjectId, n: u32) -> ProxyPlanShard {
        let mut entries: Vec<_> = self.cluster_members[n as usize]
            .iter()
            .filter_map(|svc| self.outputs.get(svc))
            .flat_map(|o| o.entries.iter().cloned())
            .collect();
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        let spec = ProxyPlanShardSpec {
            scope: ShardScope::Cluster,
            zone: None,
            revision: String::new(),
            service_ports: entries,
            overrides: Vec::new(),
        };
        finish_shard(&id.name(), spec, "cluster")
    }

    fn build_zone_shard(&self, id: &ObjectId, zone: &str, n: u32) -> ProxyPlanShard {
        let mut overrides: Vec<_> = self
            .zone_members
            .get(zone)
            .into_iter()
            .flatten()
            .filter(|svc| shard_of(svc, self.config.zone_shards) == n)
            .filter_map(|svc| self.outputs.get(svc)?.zone_overrides.get(zone))
            .flatten()
            .cloned()
            .collect();
        overrides.sort_by(|a, b| a.key.cmp(&b.key));
        let spec = ProxyPlanShardSpec {
            scope: ShardScope::Zone,
            zone: Some(zone.to_owned()),
            revision: String::new(),
            service_ports: Vec::new(),
            overrides,
        };
        let mut shard = finish_shard(&id.name(), spec, "zone");
        if let Some(labels) = shard.metadata.labels.as_mut() {
            labels.insert(ZONE_LABEL.to_owned(), proxyplan_crds::zone_slug(zone));
        }
        shard
    }
}

fn finish_shard(name: &str, mut spec: ProxyPlanShardSpec, scope: &str) -> ProxyPlanShard {
    spec.revision = revision_of(&spec);
    let mut shard = ProxyPlanShard::new(name, spec);
    shard.metadata = managed_meta(name, Some(scope));
    shard
}

fn managed_meta(name: &str, scope: Option<&str>) -> ObjectMeta {
    let mut labels = BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned())]);
    if let Some(scope) = scope {
        labels.insert(SCOPE_LABEL.to_owned(), scope.to_owned());
    }
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(labels),
        ..ObjectMeta::default()
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

/// The shard a Service's entries live in: a stable hash of its namespace and name.
fn shard_of(key: &ServiceKey, shards: u32) -> u32 {
    let hash = stable_hash(format!("{}/{}", key.namespace, key.name).as_bytes());
    u32::try_from(hash % u64::from(shards.max(1))).unwrap_or(0)
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
