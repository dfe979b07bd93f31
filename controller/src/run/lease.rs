//! Leader election on a `coordination.k8s.io/v1` Lease, and the fence every write checks.
//!
//! One round is one read and at most one write: create the Lease when it is missing,
//! renew it while we hold it, take it over once the holder let it expire. Writes carry
//! the `resourceVersion` read, so two replicas racing for an expired Lease cannot both win.
//!
//! Expiry never compares another machine's timestamps with our clock: as in client-go, a
//! follower notes *when it saw* the Lease change (its own monotonic clock) and takes over
//! only after the lease duration has passed since then without a change. The leader, for
//! its part, writes only until [`RENEW_DEADLINE`] after the start of its last successful
//! renewal ([`Fence`]): a replica that was stopped (SIGSTOP, a long GC pause, a frozen VM)
//! finds its fence expired when it wakes up and writes nothing, even before its election
//! loop has run again. Every Lease request has a timeout well inside the lease duration.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

/// How long a Lease lasts without renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the Lease is renewed or competed for.
pub const LEASE_RETRY: Duration = Duration::from_secs(2);
/// How long after the start of its last successful renewal a leader keeps writing: well
/// before any other replica can take over (which needs [`LEASE_DURATION`] after it saw
/// that renewal).
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Longest wait for one Lease request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(4);
/// How soon a round that failed (the API server away) is tried again: short, so that
/// the Lease is renewed or taken within a second of the API server's return.
pub const ERROR_RETRY: Duration = Duration::from_secs(1);

/// Whether this replica may write now. Shared by the election loop, which extends it on
/// every successful renewal, and the writer, which checks it before every request.
#[derive(Debug, Clone, Default)]
pub struct Fence(Arc<Mutex<Option<Instant>>>);

impl Fence {
    /// A fence that holds nothing.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether writes are allowed now.
    #[must_use]
    pub fn holds(&self) -> bool {
        self.0
            .lock()
            .ok()
            .and_then(|until| *until)
            .is_some_and(|until| Instant::now() < until)
    }

    /// Allows writes until `until`.
    pub fn grant_until(&self, until: Instant) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(until);
        }
    }

    /// Allows no more writes.
    pub fn revoke(&self) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = None;
        }
    }
}

/// Why an election round failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The API server refused.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// The API server did not answer in time.
    #[error("no answer from the API server within {}s", REQUEST_TIMEOUT.as_secs())]
    Timeout,
}

/// The Lease as last seen, and when (on this replica's clock).
#[derive(Debug)]
struct Observed {
    resource_version: Option<String>,
    at: Instant,
    /// The duration the Lease asked for.
    duration: Duration,
}

/// Holds or competes for one Lease.
pub struct LeaseElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    observed: Option<Observed>,
}

/// The outcome of one election round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leadership {
    /// We hold the Lease: it was created or renewed by this round.
    Leader,
    /// Someone else holds a Lease that has not expired by our observation.
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
            observed: None,
        }
    }

    /// One round: acquire, renew or observe. `now` is only written into the Lease (for
    /// people reading it); expiry is decided on this replica's monotonic clock, `local`
    /// (`Instant::now()` in production).
    ///
    /// # Errors
    /// API errors other than a lost race (a conflict or an already-exists, which mean
    /// someone else won this round and are reported as [`Leadership::Follower`]), and
    /// timeouts.
    pub async fn try_acquire_or_renew(
        &mut self,
        now: Timestamp,
        local: Instant,
    ) -> Result<Leadership, LeaseError> {
        let current = timed(self.api.get_opt(&self.name)).await?;
        let result = match current {
            None => timed(
                self.api
                    .create(&PostParams::default(), &self.fresh_lease(now)),
            )
            .await
            .map(|_| Leadership::Leader),
            Some(lease) => {
                let spec = lease.spec.clone().unwrap_or_default();
                let held_by_us = spec.holder_identity.as_deref() == Some(self.identity.as_str());
                let version = lease.metadata.resource_version.clone();
                if !held_by_us && !self.expired(&spec, version, local) {
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
                timed(self.api.replace(&self.name, &PostParams::default(), &next))
                    .await
                    .map(|_| Leadership::Leader)
            }
        };
        match result {
            Err(LeaseError::Api(kube::Error::Api(status))) if status.code == 409 => {
                Ok(Leadership::Follower)
            }
            other => other,
        }
    }

    /// Whether a Lease held by someone else may be taken: nobody holds it, or it has not
    /// changed for a lease duration since this replica first saw it as it is.
    fn expired(&mut self, spec: &LeaseSpec, version: Option<String>, now: Instant) -> bool {
        if spec.holder_identity.as_deref().is_none_or(str::is_empty) {
            return true;
        }
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.duration, Duration::from_secs);
        let seen = match &self.observed {
            Some(o) if o.resource_version == version => o.at,
            _ => {
                self.observed = Some(Observed {
                    resource_version: version,
                    at: now,
                    duration,
                });
                now
            }
        };
        now.duration_since(seen) > duration
    }

    /// When the Lease held by someone else will have expired by our clock if nobody
    /// renews it: a follower tries again right then instead of a retry period later.
    #[must_use]
    pub fn expiry(&self) -> Option<Instant> {
        self.observed
            .as_ref()
            .map(|o| o.at + o.duration + Duration::from_millis(10))
    }

    /// Gives the Lease up (on shutdown) so another replica takes over at once.
    ///
    /// # Errors
    /// API errors and timeouts; a Lease held by someone else is left alone.
    pub async fn release(&self) -> Result<(), LeaseError> {
        let Some(mut lease) = timed(self.api.get_opt(&self.name)).await? else {
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
        timed(self.api.replace(&self.name, &PostParams::default(), &lease))
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

async fn timed<T>(request: impl Future<Output = Result<T, kube::Error>>) -> Result<T, LeaseError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(result) => result.map_err(LeaseError::Api),
        Err(_) => Err(LeaseError::Timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_holds_until_its_deadline_only() {
        let fence = Fence::new();
        assert!(!fence.holds());
        fence.grant_until(Instant::now() + Duration::from_secs(60));
        assert!(fence.holds());
        let shared = fence.clone();
        shared.grant_until(Instant::now());
        assert!(!fence.holds());
        fence.grant_until(Instant::now() + Duration::from_secs(60));
        fence.revoke();
        assert!(!shared.holds());
    }
}
