//! Writing plans and shards: server-side apply under one field manager, and only what the
//! server does not already have.

use std::collections::{BTreeSet, HashMap};

use futures::{StreamExt, stream};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use proxyplan_crds::{NodeProxyPlan, ProxyPlanShard};
use serde::Serialize;

use crate::planner::{DesiredObject, ObjectId};

/// Field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "proxyplan-controller";

/// Writes in flight at once.
const CONCURRENCY: usize = 16;

/// Which kind an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `NodeProxyPlan`.
    Plan,
    /// `ProxyPlanShard`.
    Shard,
}

impl Kind {
    /// Lower-case label for metrics.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Plan => "nodeproxyplan",
            Self::Shard => "proxyplanshard",
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
    /// Name of the object.
    pub name: String,
    /// The API error.
    pub source: kube::Error,
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
}

/// Writes plans and shards, remembering which revision the server holds of each.
pub struct PlanWriter {
    plans: Api<NodeProxyPlan>,
    shards: Api<ProxyPlanShard>,
    observed: HashMap<(Kind, String), String>,
    confirmed: HashMap<(Kind, String), String>,
}

impl PlanWriter {
    /// A writer using `client`.
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self {
            plans: Api::all(client.clone()),
            shards: Api::all(client),
            observed: HashMap::new(),
            confirmed: HashMap::new(),
        }
    }

    /// Records what the server holds (from a watch): `None` when the object is gone.
    /// Returns whether that differs from what this writer last confirmed there, i.e.
    /// someone else changed or deleted the object.
    pub fn observe(&mut self, kind: Kind, name: &str, revision: Option<&str>) -> bool {
        let key = (kind, name.to_owned());
        let diverged = self
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
        let wanted: BTreeSet<(Kind, &str)> =
            desired.iter().map(|o| (kind_of(o), o.name())).collect();
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
    /// `delete` (skipping objects the server does not have). Shards are written before
    /// plans, so an agent never sees a plan naming a shard that does not exist yet.
    pub async fn write(
        &mut self,
        mut apply: Vec<DesiredObject>,
        delete: Vec<(Kind, String)>,
    ) -> WriteReport {
        let mut report = WriteReport::default();
        apply.retain(|o| {
            let same = self.observed_revision(kind_of(o), o.name()) == Some(o.revision());
            if same {
                self.confirmed
                    .insert((kind_of(o), o.name().to_owned()), o.revision().to_owned());
            }
            report.unchanged += usize::from(same);
            !same
        });
        let (shards, plans): (Vec<_>, Vec<_>) =
            apply.into_iter().partition(|o| kind_of(o) == Kind::Shard);
        for batch in [shards, plans] {
            let results: Vec<_> = stream::iter(batch.into_iter().map(|o| self.apply_one(o)))
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
            for result in results {
                match result {
                    Ok((kind, name, revision, size)) => {
                        report.largest_object = report.largest_object.max(size);
                        self.observed.insert((kind, name.clone()), revision.clone());
                        self.confirmed.insert((kind, name.clone()), revision);
                        report.applied.push((kind, name));
                    }
                    Err(err) => report.errors.push(err),
                }
            }
        }
        for key in &delete {
            self.confirmed.remove(key);
        }
        let delete: Vec<_> = delete
            .into_iter()
            .filter(|key| self.observed.contains_key(key))
            .collect();
        let results: Vec<_> = stream::iter(
            delete
                .into_iter()
                .map(|(kind, name)| self.delete_one(kind, name)),
        )
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
        for result in results {
            match result {
                Ok((kind, name)) => {
                    self.observed.remove(&(kind, name.clone()));
                    report.deleted.push((kind, name));
                }
                Err(err) => report.errors.push(err),
            }
        }
        report.applied.sort();
        report.deleted.sort();
        report
    }

    async fn apply_one(
        &self,
        object: DesiredObject,
    ) -> Result<(Kind, String, String, usize), WriteError> {
        let kind = kind_of(&object);
        let name = object.name().to_owned();
        let revision = object.revision().to_owned();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let size = match &object {
            DesiredObject::Plan(p) => json_size(p),
            DesiredObject::Shard(s) => json_size(s),
        };
        let result = match &object {
            DesiredObject::Plan(p) => self
                .plans
                .patch(&name, &params, &Patch::Apply(p))
                .await
                .map(|_| ()),
            DesiredObject::Shard(s) => self
                .shards
                .patch(&name, &params, &Patch::Apply(s))
                .await
                .map(|_| ()),
        };
        result
            .map(|()| (kind, name.clone(), revision, size))
            .map_err(|source| WriteError {
                op: "apply",
                kind,
                name,
                source,
            })
    }

    async fn delete_one(&self, kind: Kind, name: String) -> Result<(Kind, String), WriteError> {
        let params = DeleteParams::default();
        let result = match kind {
            Kind::Plan => self.plans.delete(&name, &params).await.map(|_| ()),
            Kind::Shard => self.shards.delete(&name, &params).await.map(|_| ()),
        };
        match result {
            Ok(()) => Ok((kind, name)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok((kind, name)),
            Err(source) => Err(WriteError {
                op: "delete",
                kind,
                name,
                source,
            }),
        }
    }
}

/// The kind of a desired object.
#[must_use]
pub fn kind_of(object: &DesiredObject) -> Kind {
    match object {
        DesiredObject::Plan(_) => Kind::Plan,
        DesiredObject::Shard(_) => Kind::Shard,
    }
}

/// The kind and name of a planner object identity.
#[must_use]
pub fn target_of(id: &ObjectId) -> (Kind, String) {
    (
        if id.is_shard() {
            Kind::Shard
        } else {
            Kind::Plan
        },
        id.name(),
    )
}

/// Serialised JSON size of an object, as etcd will store it (roughly).
#[must_use]
pub fn json_size<T: Serialize>(object: &T) -> usize {
    serde_json::to_vec(object).map_or(0, |v| v.len())
}
