//! Writing plans: server-side apply under one field manager, only what the server does
//! not already have, and only while this replica holds the Lease.
//!
//! Every write is checked against the object the server answers with. Server-side apply
//! removes a field the applied object leaves out only when no other manager owns it: a
//! field someone added by hand, or one any `PUT` wrote (a `PUT` is an `Update`, owned
//! apart from the `Apply`, even under the same manager name), would outlive every later
//! apply that drops it, and the plan would keep a stale overlay under a new revision. So
//! when the answer's content is not exactly the desired object, or a manager other than
//! this one's apply owns any of it, the object is put whole with only this manager's
//! apply entry (and status writers) kept in `managedFields`; the next apply owns it all.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use futures::{StreamExt, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use proxyplan_crds::{NodeProxyPlan, RolloutStatus, ServiceProxyPlan};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;

use super::lease::Fence;
use crate::planner::{DesiredObject, ObjectId};

/// Field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "proxyplan-controller";

/// Writes in flight at once.
const CONCURRENCY: usize = 16;

/// Attempts at a whole write that lose a race (409: the object changed between the apply
/// and the put, for example an agent's status write) before the write is reported failed.
const WHOLE_ATTEMPTS: usize = 3;

/// Which kind an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `NodeProxyPlan`.
    Plan,
    /// `ServiceProxyPlan`.
    Service,
}

impl Kind {
    /// Lower-case label for metrics.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Plan => "nodeproxyplan",
            Self::Service => "serviceproxyplan",
        }
    }
}

/// A failed write.
#[derive(Debug, thiserror::Error)]
#[error("{op} {kind:?}/{name}: {source}")]
pub struct WriteError {
    /// `apply` or `delete`.
    pub op: &'static str,
    /// Kind of the object.
    pub kind: Kind,
    /// Name of the object (`namespace/name` for a Service plan).
    pub name: String,
    /// The API error.
    pub source: kube::Error,
}

/// Why a write did not happen or failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteFailure {
    /// The API server refused or did not answer.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// This replica may no longer hold the Lease: nothing more is written.
    #[error("not written: leadership may be lost (the Lease was not renewed in time)")]
    NotLeader,
}

/// What one [`PlanWriter::write`] did.
#[derive(Debug, Default)]
pub struct WriteReport {
    /// Objects created or updated, by kind.
    pub applied: Vec<(Kind, String)>,
    /// Objects deleted.
    pub deleted: Vec<(Kind, String)>,
    /// Objects skipped because the server already had their revision.
    pub unchanged: usize,
    /// Size in bytes of the largest object written.
    pub largest_object: usize,
    /// Failed writes (retried by the caller).
    pub errors: Vec<WriteError>,
    /// Writes not made because the Lease may be lost (made again once leading).
    pub abandoned: Vec<(Kind, String)>,
    /// Service plans written: `namespace/name`, revision, and the `resourceVersion` the
    /// server answered with (the write every node's rollout mark must reach).
    pub service_versions: Vec<(String, String, String)>,
    /// Objects written, with the revision the server now holds.
    pub written: Vec<(Kind, String, String)>,
    /// Objects not written because a batch still in flight writes them: the caller
    /// writes them again once that batch is done.
    pub deferred: Vec<(Kind, String)>,
}

impl WriteReport {
    /// Every object this batch wrote or tried to write (not the deferred ones).
    fn attempted(&self) -> impl Iterator<Item = (Kind, String)> + '_ {
        self.applied
            .iter()
            .chain(&self.deleted)
            .chain(&self.abandoned)
            .cloned()
            .chain(self.errors.iter().map(|e| (e.kind, e.name.clone())))
    }
}

/// Writes plans, remembering which revision the server holds of each.
pub struct PlanWriter {
    client: kube::Client,
    plans: Api<NodeProxyPlan>,
    observed: HashMap<(Kind, String), String>,
    confirmed: HashMap<(Kind, String), String>,
    /// Objects a batch is writing: the revision it writes (empty: a deletion).
    in_flight: HashMap<(Kind, String), String>,
    /// Writes in flight at once, over every batch.
    permits: Arc<Semaphore>,
    /// Objects a batch did not write because another batch had them in flight.
    deferred: BTreeSet<(Kind, String)>,
}

impl PlanWriter {
    /// A writer using `client`.
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self {
            plans: Api::all(client.clone()),
            client,
            observed: HashMap::new(),
            confirmed: HashMap::new(),
            in_flight: HashMap::new(),
            permits: Arc::new(Semaphore::new(CONCURRENCY)),
            deferred: BTreeSet::new(),
        }
    }

    /// Records what the server holds (from a watch): `None` when the object is gone.
    /// Returns whether that differs from what this writer last confirmed there, i.e.
    /// someone else changed or deleted the object.
    pub fn observe(&mut self, kind: Kind, name: &str, revision: Option<&str>) -> bool {
        let key = (kind, name.to_owned());
        // A batch's own write may be seen before its answer is.
        let own = self
            .in_flight
            .get(&key)
            .is_some_and(|w| Some(w.as_str()) == revision);
        let diverged = !own
            && self
                .confirmed
                .get(&key)
                .is_some_and(|c| Some(c.as_str()) != revision);
        match revision {
            Some(rev) => self.observed.insert(key, rev.to_owned()),
            None => self.observed.remove(&key),
        };
        diverged
    }

    /// Forgets everything observed of `kind` (before a watch re-list).
    pub fn forget(&mut self, kind: Kind) {
        self.observed.retain(|(k, _), _| *k != kind);
    }

    /// The revision the server holds of an object.
    #[must_use]
    pub fn observed_revision(&self, kind: Kind, name: &str) -> Option<&str> {
        self.observed
            .get(&(kind, name.to_owned()))
            .map(String::as_str)
    }

    /// Objects on the server that are not in `desired`: the ones a full reconcile deletes.
    #[must_use]
    pub fn stale(&self, desired: &[DesiredObject]) -> Vec<(Kind, String)> {
        let names: Vec<(Kind, String)> = desired
            .iter()
            .map(|o| (kind_of(o), o.qualified_name()))
            .collect();
        let wanted: BTreeSet<(Kind, &str)> = names.iter().map(|(k, n)| (*k, n.as_str())).collect();
        let mut stale: Vec<(Kind, String)> = self
            .observed
            .keys()
            .filter(|(kind, name)| !wanted.contains(&(*kind, name.as_str())))
            .cloned()
            .collect();
        stale.sort();
        stale
    }

    /// Applies `apply` (skipping objects whose revision the server has) and deletes
    /// `delete` (skipping objects the server does not have), each only while `fence`
    /// says this replica still holds the Lease, and waits for every write: [`Self::start`],
    /// [`WriteBatch::run`] and [`Self::finish`] in one. Objects with a write of an earlier
    /// batch still in flight are not written; the report lists them as deferred.
    pub async fn write(
        &mut self,
        apply: Vec<DesiredObject>,
        delete: Vec<(Kind, String)>,
        fence: &Fence,
    ) -> WriteReport {
        let batch = self.start(apply, delete);
        let report = batch.run(fence.clone()).await;
        // Nothing else is in flight here, so nothing deferred waits for a later write.
        let _free = self.finish(&report);
        report
    }

    /// Takes the writes of one sync: skips objects whose revision the server has and
    /// deletions of objects it does not have, and defers objects that a batch still in
    /// flight writes (a second write of one object could land before the first and be
    /// undone by it). The batch owns everything it needs: the caller runs it (and
    /// others) while it goes on, and hands its report to [`Self::finish`].
    pub fn start(
        &mut self,
        mut apply: Vec<DesiredObject>,
        delete: Vec<(Kind, String)>,
    ) -> WriteBatch {
        let mut unchanged = 0;
        let mut deferred = Vec::new();
        apply.retain(|o| {
            let key = (kind_of(o), o.qualified_name());
            if self.in_flight.contains_key(&key) {
                deferred.push(key);
                return false;
            }
            let same = self.observed.get(&key).map(String::as_str) == Some(o.revision());
            if same {
                self.confirmed.insert(key, o.revision().to_owned());
            }
            unchanged += usize::from(same);
            !same
        });
        let mut deletes = Vec::new();
        for key in delete {
            if self.in_flight.contains_key(&key) {
                deferred.push(key);
                continue;
            }
            self.confirmed.remove(&key);
            if self.observed.contains_key(&key) {
                deletes.push(key);
            }
        }
        for o in &apply {
            self.in_flight
                .insert((kind_of(o), o.qualified_name()), o.revision().to_owned());
        }
        for key in &deletes {
            self.in_flight.insert(key.clone(), String::new());
        }
        self.deferred.extend(deferred.iter().cloned());
        let (services, plans): (Vec<_>, Vec<_>) =
            apply.into_iter().partition(|o| kind_of(o) == Kind::Service);
        WriteBatch {
            client: self.client.clone(),
            plans_api: self.plans.clone(),
            permits: self.permits.clone(),
            services,
            plans,
            delete: deletes,
            unchanged,
            deferred,
        }
    }

    /// Records what a batch from [`Self::start`] did: the revisions the server now holds.
    /// Returns the deferred objects no batch has in flight any more: the caller writes
    /// them again, with their newest content.
    pub fn finish(&mut self, report: &WriteReport) -> Vec<(Kind, String)> {
        for (kind, name, revision) in &report.written {
            self.observed
                .insert((*kind, name.clone()), revision.clone());
            self.confirmed
                .insert((*kind, name.clone()), revision.clone());
        }
        for key in &report.deleted {
            self.observed.remove(key);
        }
        for key in report.attempted() {
            self.in_flight.remove(&key);
        }
        let free: Vec<(Kind, String)> = self
            .deferred
            .iter()
            .filter(|key| !self.in_flight.contains_key(*key))
            .cloned()
            .collect();
        for key in &free {
            self.deferred.remove(key);
        }
        free
    }

    /// Whether a batch is writing this revision of the object.
    #[must_use]
    pub fn writing(&self, kind: Kind, name: &str, revision: &str) -> bool {
        self.in_flight
            .get(&(kind, name.to_owned()))
            .is_some_and(|w| w == revision)
    }

    /// The client this writer writes with (for [`write_rollout`]).
    #[must_use]
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }
}

/// The Service plans of `namespace`.
fn service_plans(client: kube::Client, namespace: &str) -> Api<ServiceProxyPlan> {
    Api::namespaced(client, namespace)
}

/// Writes one Service plan's rollout status (`status` subresource, server-side apply of
/// that field alone), while `fence` holds.
///
/// # Errors
/// When the API server refuses or does not answer, or the Lease may be lost.
pub async fn write_rollout(
    client: kube::Client,
    plan: &str,
    rollout: &RolloutStatus,
    fence: &Fence,
) -> Result<(), WriteFailure> {
    if !fence.holds() {
        return Err(WriteFailure::NotLeader);
    }
    let (namespace, name) = plan.split_once('/').unwrap_or(("", plan));
    let patch = serde_json::json!({
        "apiVersion": format!("{}/{}", proxyplan_crds::GROUP, proxyplan_crds::VERSION),
        "kind": "ServiceProxyPlan",
        "status": {"rollout": rollout},
    });
    service_plans(client, namespace)
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(patch),
        )
        .await?;
    Ok(())
}

/// The writes of one sync, taken by [`PlanWriter::start`]. It owns what it needs, so the
/// controller goes on planning while it runs: a change that arrives meanwhile is written
/// by the next batch, beside this one, not after it.
pub struct WriteBatch {
    client: kube::Client,
    plans_api: Api<NodeProxyPlan>,
    permits: Arc<Semaphore>,
    services: Vec<DesiredObject>,
    plans: Vec<DesiredObject>,
    delete: Vec<(Kind, String)>,
    unchanged: usize,
    deferred: Vec<(Kind, String)>,
}

impl WriteBatch {
    /// Writes: Service plans first, then node plans (so an agent seldom sees an overlay
    /// before the entry it overrides), then deletions; each only while `fence` holds, at
    /// most [`CONCURRENCY`] requests in flight over every batch.
    pub async fn run(mut self, fence: Fence) -> WriteReport {
        let mut report = WriteReport {
            unchanged: self.unchanged,
            deferred: std::mem::take(&mut self.deferred),
            ..WriteReport::default()
        };
        let services = std::mem::take(&mut self.services);
        let plans = std::mem::take(&mut self.plans);
        let delete = std::mem::take(&mut self.delete);
        let fence = &fence;
        for batch in [services, plans] {
            let results: Vec<_> = stream::iter(batch.into_iter().map(|o| self.apply_one(o, fence)))
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
            for result in results {
                match result {
                    Ok((kind, name, revision, size, version)) => {
                        report.largest_object = report.largest_object.max(size);
                        if let (Kind::Service, Some(version)) = (kind, version) {
                            report
                                .service_versions
                                .push((name.clone(), revision.clone(), version));
                        }
                        report.written.push((kind, name.clone(), revision));
                        report.applied.push((kind, name));
                    }
                    Err(((kind, name), WriteFailure::Api(source))) => {
                        report.errors.push(WriteError {
                            op: "apply",
                            kind,
                            name,
                            source,
                        });
                    }
                    Err(((kind, name), WriteFailure::NotLeader)) => {
                        report.abandoned.push((kind, name));
                    }
                }
            }
        }
        let results: Vec<_> = stream::iter(
            delete
                .into_iter()
                .map(|(kind, name)| self.delete_one(kind, name, fence)),
        )
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
        for result in results {
            match result {
                Ok((kind, name)) => report.deleted.push((kind, name)),
                Err(((kind, name), WriteFailure::NotLeader)) => {
                    report.abandoned.push((kind, name));
                }
                Err(((kind, name), WriteFailure::Api(source))) => {
                    report.errors.push(WriteError {
                        op: "delete",
                        kind,
                        name,
                        source,
                    });
                }
            }
        }
        report.applied.sort();
        report.deleted.sort();
        report
    }

    async fn apply_one(
        &self,
        object: DesiredObject,
        fence: &Fence,
    ) -> Result<(Kind, String, String, usize, Option<String>), ((Kind, String), WriteFailure)> {
        let kind = kind_of(&object);
        let name = object.qualified_name();
        let revision = object.revision().to_owned();
        // The semaphore is never closed.
        let _permit = self.permits.acquire().await.ok();
        let (size, result) = match &object {
            DesiredObject::Plan(p) => (
                json_size(p),
                write_exact(
                    &self.plans_api,
                    p,
                    &revision,
                    content_revision_of_plan,
                    fence,
                )
                .await,
            ),
            DesiredObject::Service(s) => (
                json_size(s),
                write_exact(
                    &service_plans(
                        self.client.clone(),
                        s.metadata.namespace.as_deref().unwrap_or_default(),
                    ),
                    s,
                    &revision,
                    content_revision_of_service_plan,
                    fence,
                )
                .await,
            ),
        };
        match result {
            Ok(version) => Ok((kind, name, revision, size, version)),
            Err(err) => Err(((kind, name), err)),
        }
    }

    async fn delete_one(
        &self,
        kind: Kind,
        name: String,
        fence: &Fence,
    ) -> Result<(Kind, String), ((Kind, String), WriteFailure)> {
        let _permit = self.permits.acquire().await.ok();
        if !fence.holds() {
            return Err(((kind, name), WriteFailure::NotLeader));
        }
        let params = DeleteParams::default();
        let result = match kind {
            Kind::Plan => self.plans_api.delete(&name, &params).await.map(|_| ()),
            Kind::Service => {
                let (namespace, short) = name.split_once('/').unwrap_or(("", name.as_str()));
                service_plans(self.client.clone(), namespace)
                    .delete(short, &params)
                    .await
                    .map(|_| ())
            }
        };
        match result {
            Ok(()) => Ok((kind, name)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok((kind, name)),
            Err(err) => Err(((kind, name), WriteFailure::Api(err))),
        }
    }
}

/// Writes `desired` so that the server holds exactly it, owned by this manager's apply
/// alone: a server-side apply, and when the answer's content (`content`, which must give
/// `revision`) differs or another manager owns part of it, a put of the whole object that
/// keeps only this manager's apply entry and status writers' entries in `managedFields`.
/// Returns the `resourceVersion` the server answered with.
async fn write_exact<K>(
    api: &Api<K>,
    desired: &K,
    revision: &str,
    content: fn(&K) -> String,
    fence: &Fence,
) -> Result<Option<String>, WriteFailure>
where
    K: kube::Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let name = desired.meta().name.clone().unwrap_or_default();
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let put = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        if !fence.holds() {
            return Err(WriteFailure::NotLeader);
        }
        let answer = api.patch(&name, &apply, &Patch::Apply(desired)).await?;
        let entries = answer.meta().managed_fields.clone().unwrap_or_default();
        let kept: Vec<ManagedFieldsEntry> =
            entries.iter().filter(|e| kept_entry(e)).cloned().collect();
        if content(&answer) == revision && kept.len() == entries.len() {
            return Ok(answer.meta().resource_version.clone());
        }
        if !fence.holds() {
            return Err(WriteFailure::NotLeader);
        }
        let mut whole = desired.clone();
        whole.meta_mut().resource_version = answer.meta().resource_version.clone();
        whole.meta_mut().uid = answer.meta().uid.clone();
        whole.meta_mut().managed_fields = Some(kept);
        match api.replace(&name, &put, &whole).await {
            Ok(answer) => return Ok(answer.meta().resource_version.clone()),
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < WHOLE_ATTEMPTS => {}
            Err(err) => return Err(err.into()),
        }
    }
}

/// A `managedFields` entry a whole write keeps: this manager's apply, and any manager's
/// writes through a subresource (the agents' status).
fn kept_entry(entry: &ManagedFieldsEntry) -> bool {
    let own_apply = entry.manager.as_deref() == Some(FIELD_MANAGER)
        && entry.operation.as_deref() == Some("Apply");
    let subresource = entry.subresource.as_deref().is_some_and(|s| !s.is_empty());
    own_apply || subresource
}

/// The revision a node plan's content really has: its `spec.revision` when the content
/// hashes to it, else a mark that it was edited (so it is repaired).
#[must_use]
pub fn content_revision_of_plan(plan: &NodeProxyPlan) -> String {
    plan.content_revision()
}

/// The revision a Service plan's content really has (see [`content_revision_of_plan`]).
#[must_use]
pub fn content_revision_of_service_plan(plan: &ServiceProxyPlan) -> String {
    plan.content_revision()
}

/// The kind of a desired object.
#[must_use]
pub fn kind_of(object: &DesiredObject) -> Kind {
    match object {
        DesiredObject::Plan(_) => Kind::Plan,
        DesiredObject::Service(_) => Kind::Service,
    }
}

/// The kind and name (`namespace/name` for a Service plan) of a planner object identity.
#[must_use]
pub fn target_of(id: &ObjectId) -> (Kind, String) {
    match id {
        ObjectId::Plan(_) => (Kind::Plan, id.name()),
        ObjectId::Service(..) => (Kind::Service, id.qualified_name()),
    }
}

/// Serialised JSON size of an object, as etcd will store it (roughly).
#[must_use]
pub fn json_size<T: Serialize>(object: &T) -> usize {
    serde_json::to_vec(object).map_or(0, |v| v.len())
}
