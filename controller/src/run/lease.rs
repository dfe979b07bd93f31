//! Leader election on a `coordination.k8s.io/v1` Lease.
//!
//! One round is one read and at most one write: create the Lease when it is missing,
//! renew it while we hold it, take it over once the holder let it expire. Writes carry
//! the `resourceVersion` read, so two replicas racing for an expired Lease cannot both win.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};

/// Holds or competes for one Lease.
#[derive(Clone)]
pub struct LeaseElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

/// The outcome of one election round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leadership {
    /// We hold the Lease until at least the returned instant plus the lease duration.
    Leader,
    /// Someone else holds an unexpired Lease.
    Follower,
}

impl LeaseElector {
    /// An elector for Lease `namespace/name` as `identity`.
    #[must_use]
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
        }
    }

    /// One round: acquire, renew or observe.
    ///
    /// # Errors
    /// API errors other than a lost race (a conflict or an already-exists, which mean
    /// someone else won this round and are reported as [`Leadership::Follower`]).
    pub async fn try_acquire_or_renew(&self, now: Timestamp) -> Result<Leadership, kube::Error> {
        let result = match self.api.get_opt(&self.name).await? {
            None => self
                .api
                .create(&PostParams::default(), &self.fresh_lease(now))
                .await
                .map(|_| Leadership::Leader),
            Some(lease) => {
                let spec = lease.spec.clone().unwrap_or_default();
                let held_by_us = spec.holder_identity.as_deref() == Some(self.identity.as_str());
                if !held_by_us && !expired(&spec, now) {
                    return Ok(Leadership::Follower);
                }
                let mut next = lease;
                let mut spec = spec;
                if !held_by_us {
                    spec.holder_identity = Some(self.identity.clone());
                    spec.acquire_time = Some(MicroTime(now));
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.lease_duration_seconds = Some(self.duration_seconds());
                spec.renew_time = Some(MicroTime(now));
                next.spec = Some(spec);
                self.api
                    .replace(&self.name, &PostParams::default(), &next)
                    .await
                    .map(|_| Leadership::Leader)
            }
        };
        match result {
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Leadership::Follower),
            other => other,
        }
    }

    /// Gives the Lease up (on shutdown) so another replica takes over at once.
    ///
    /// # Errors
    /// API errors; a Lease held by someone else is left alone.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX)
    }

    fn fresh_lease(&self, now: Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(self.duration_seconds()),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        }
    }
}

/// Whether a Lease nobody renewed in time (or nobody holds) may be taken.
fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    if spec.holder_identity.as_deref().is_none_or(str::is_empty) {
        return true;
    }
    let Some(MicroTime(renewed)) = spec.renew_time else {
        return true;
    };
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(0)));
    renewed
        .checked_add(duration)
        .is_ok_and(|deadline| deadline < now)
}
