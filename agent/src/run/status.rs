//! The plan's status, by Kubernetes conventions: `Ready` and `Degraded` conditions, the
//! applied revisions and counts. Written by server-side apply to `/status` under field
//! manager [`FIELD_MANAGER`], and only when it changed.
//!
//! DESIGN §2 invariant 2 (an endpoint change of a Cluster-policy Service costs O(1) API
//! writes whatever the node count) forbids a status write on every node for every
//! Service change. So [`StatusGate`] writes at once when a condition or the applied plan
//! revision changes, but holds changes of the counts to one write per minimum interval;
//! the sync duration alone, like `lastTransitionTime`, is never a change.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use proxyplan_crds::runtime::Backoff;
use proxyplan_crds::{MergedPlan, NodeProxyPlan, NodeProxyPlanStatus};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::cache::PlanOutcome;
use super::http::Metrics;

/// Field manager of every status write.
pub const FIELD_MANAGER: &str = "proxyplan-agent";
/// The agent's version, as reported in the status.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");
/// Condition type: the kernel holds the current plan.
pub const READY: &str = "Ready";
/// Condition type: something needs attention.
pub const DEGRADED: &str = "Degraded";
/// First wait before retrying a failed status write.
pub const STATUS_RETRY_INITIAL: Duration = Duration::from_secs(1);
/// Longest wait before retrying a failed status write: 5,000 agents retrying against an
/// API server that struggles must not keep it down.
pub const STATUS_RETRY_MAX: Duration = Duration::from_secs(60);

/// `Ready` reason: the last sync applied the current plan revision and every Service
/// plan received.
pub const REASON_SYNCED: &str = "Synced";
/// `Ready` reason: the last sync failed.
pub const REASON_SYNC_FAILED: &str = "SyncFailed";
/// `Ready` reason: the plan's overlay names service ports whose Service plan the agent
/// has not received (yet).
pub const REASON_WAITING_FOR_SERVICE_PLANS: &str = "WaitingForServicePlans";
/// `Ready` and `Degraded` reason: the node plan is invalid.
pub const REASON_INVALID_PLAN: &str = "InvalidPlan";
/// `Degraded` reason: one or more Service plans were refused (the rest is programmed).
pub const REASON_INVALID_SERVICE_PLAN: &str = "InvalidServicePlan";
/// How many refused objects or missing keys a condition message names at most.
const NAMED_AT_MOST: usize = 5;
/// `Ready` reason: the current plan has not been synced yet.
pub const REASON_SYNC_PENDING: &str = "SyncPending";
/// `Degraded` reason when nothing is wrong.
pub const REASON_AS_EXPECTED: &str = "AsExpected";

/// The plan the kernel holds after the last successful sync.
#[derive(Debug, Clone)]
pub struct AppliedPlan {
    /// The merged plan.
    pub plan: Arc<MergedPlan>,
    /// Service ports programmed.
    pub service_ports: u32,
    /// Endpoints programmed (distinct per service port, summed).
    pub endpoints: u32,
}

impl AppliedPlan {
    /// Counts what `plan` programs.
    #[must_use]
    pub fn new(plan: Arc<MergedPlan>) -> Self {
        let service_ports = u32::try_from(plan.service_ports.len()).unwrap_or(u32::MAX);
        let endpoints = endpoint_count(&plan);
        Self {
            plan,
            service_ports,
            endpoints,
        }
    }

    /// Whether this is `plan`: same plan revision and the same Service plan versions.
    #[must_use]
    pub fn is(&self, plan: &MergedPlan) -> bool {
        self.plan.revision == plan.revision
            && self.plan.services_fingerprint == plan.services_fingerprint
    }
}

/// Endpoints `plan` programs: the distinct endpoints of each service port (cluster and
/// local lists together), summed over the service ports.
#[must_use]
pub fn endpoint_count(plan: &MergedPlan) -> u32 {
    let mut all = Vec::new();
    let endpoints = plan
        .service_ports
        .iter()
        .map(|e| {
            all.clear();
            all.extend(e.cluster_endpoints.iter().chain(&e.local_endpoints));
            all.sort_unstable();
            all.dedup();
            all.len()
        })
        .sum::<usize>();
    u32::try_from(endpoints).unwrap_or(u32::MAX)
}

/// Why the last sync failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncFailure {
    /// The error's short label (`tool_failed`, ...), as in metrics.
    pub label: &'static str,
    /// The error.
    pub message: String,
}

impl SyncFailure {
    /// The label in CamelCase, as a condition reason (`tool_failed` → `ToolFailed`).
    #[must_use]
    pub fn reason(&self) -> String {
        self.label
            .split('_')
            .map(|word| {
                let mut chars = word.chars();
                chars.next().map_or_else(String::new, |first| {
                    first.to_ascii_uppercase().to_string() + chars.as_str()
                })
            })
            .collect()
    }
}

/// Everything the status reports.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// The plan's `metadata.generation`.
    pub generation: Option<i64>,
    /// What the current plan and shards amount to.
    pub outcome: &'a PlanOutcome,
    /// What the kernel holds.
    pub applied: Option<&'a AppliedPlan>,
    /// Why the last sync failed, if it did.
    pub failure: Option<&'a SyncFailure>,
    /// Proxy mode.
    pub mode: &'a str,
    /// Duration of the last sync.
    pub sync_duration: Option<Duration>,
    /// Every Service plan change up to this `resourceVersion` is in the kernel.
    pub programmed_through: Option<u64>,
}

/// The status for `observation`. Conditions keep their `lastTransitionTime` from
/// `previous` while their status stays the same.
#[must_use]
pub fn build_status(
    observation: &Observation<'_>,
    previous: Option<&NodeProxyPlanStatus>,
    now: Timestamp,
) -> NodeProxyPlanStatus {
    let (ready, ready_reason, ready_message) = ready_condition(observation);
    let (degraded, degraded_reason, degraded_message) = degraded_condition(observation);
    let condition = |type_: &str, status: bool, reason: String, message: String| {
        let status = if status { "True" } else { "False" }.to_owned();
        let since = previous
            .and_then(|p| p.conditions.iter().find(|c| c.type_ == type_))
            .filter(|c| c.status == status)
            .map_or(Time(now), |c| c.last_transition_time.clone());
        Condition {
            type_: type_.to_owned(),
            status,
            reason,
            message,
            observed_generation: observation.generation,
            last_transition_time: since,
        }
    };
    let applied = observation.applied;
    NodeProxyPlanStatus {
        conditions: vec![
            condition(READY, ready, ready_reason, ready_message),
            condition(DEGRADED, degraded, degraded_reason, degraded_message),
        ],
        applied_revision: applied.map(|a| a.plan.revision.clone()),
        service_ports: applied.map(|a| a.service_ports),
        endpoints: applied.map(|a| a.endpoints),
        mode: Some(observation.mode.to_owned()),
        sync_duration_seconds: observation
            .sync_duration
            .map(|d| (d.as_secs_f64() * 1000.0).round() / 1000.0),
        agent_version: Some(AGENT_VERSION.to_owned()),
        // 0 until a sync left the kernel clean: the controller counts this node as
        // holding nothing yet, not as one that does not report.
        programmed_resource_version: Some(observation.programmed_through.unwrap_or(0).to_string()),
    }
}

fn ready_condition(observation: &Observation<'_>) -> (bool, String, String) {
    // Nothing applied by this process does not mean an empty kernel: after a restart
    // it still holds what the previous agent programmed (and a failed read-back says
    // nothing about it either).
    let keeping = observation.applied.map_or_else(
        || "; the kernel keeps whatever rules it held when this agent started".to_owned(),
        |a| format!("; revision {} stays programmed", a.plan.revision),
    );
    match observation.outcome {
        PlanOutcome::Invalid { revision, error } => (
            false,
            REASON_INVALID_PLAN.to_owned(),
            format!("plan revision {revision} refused: {error}{keeping}"),
        ),
        PlanOutcome::Merged(plan) => match (observation.failure, observation.applied) {
            (Some(failure), _) => (
                false,
                REASON_SYNC_FAILED.to_owned(),
                format!(
                    "applying plan revision {}: {}{keeping}",
                    plan.revision, failure.message
                ),
            ),
            (None, Some(applied)) if applied.is(plan) && !plan.unmatched.is_empty() => (
                false,
                REASON_WAITING_FOR_SERVICE_PLANS.to_owned(),
                format!(
                    "plan revision {} applied, but its overlay names service ports of no \
                     Service plan received: {}",
                    plan.revision,
                    named(plan.unmatched.iter())
                ),
            ),
            (None, Some(applied)) if applied.is(plan) => (
                true,
                REASON_SYNCED.to_owned(),
                format!("plan revision {} applied", plan.revision),
            ),
            (None, _) => (
                false,
                REASON_SYNC_PENDING.to_owned(),
                format!("plan revision {} not applied yet{keeping}", plan.revision),
            ),
        },
        PlanOutcome::NoPlan | PlanOutcome::NotListed => (
            false,
            REASON_SYNC_PENDING.to_owned(),
            format!("no plan to apply{keeping}"),
        ),
    }
}

fn degraded_condition(observation: &Observation<'_>) -> (bool, String, String) {
    if let PlanOutcome::Invalid { error, .. } = observation.outcome {
        return (true, REASON_INVALID_PLAN.to_owned(), error.to_string());
    }
    if let Some(failure) = observation.failure {
        return (true, failure.reason(), failure.message.clone());
    }
    match observation.outcome {
        PlanOutcome::Merged(plan) if !plan.refused.is_empty() => (
            true,
            REASON_INVALID_SERVICE_PLAN.to_owned(),
            format!(
                "{} Service plan(s) refused, their last good version (if any) stays \
                 programmed: {}",
                plan.refused.len(),
                named(plan.refused.iter().map(ToString::to_string))
            ),
        ),
        _ => (false, REASON_AS_EXPECTED.to_owned(), String::new()),
    }
}

/// The first few of `items`, and how many more there are.
fn named(items: impl ExactSizeIterator<Item = impl std::fmt::Display>) -> String {
    let total = items.len();
    let mut text: Vec<String> = items.take(NAMED_AT_MOST).map(|i| i.to_string()).collect();
    if total > NAMED_AT_MOST {
        text.push(format!("and {} more", total - NAMED_AT_MOST));
    }
    text.join("; ")
}

/// How much a status differs from the one written before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusChange {
    /// Nothing to write (the sync duration and transition times alone do not count).
    Unchanged,
    /// Only the counts changed: written at most once per interval.
    Minor,
    /// The rollout mark moved (the counts may have too): written at most once per the
    /// shorter rollout report interval.
    Progress,
    /// A condition, the applied revision, the mode or the agent version changed (or
    /// nothing was written yet): written at once.
    Major,
}

/// Compares a desired status with the one written before.
#[must_use]
pub fn classify(
    written: Option<&NodeProxyPlanStatus>,
    desired: &NodeProxyPlanStatus,
) -> StatusChange {
    let Some(written) = written else {
        return StatusChange::Major;
    };
    let same_conditions = written.conditions.len() == desired.conditions.len()
        && written
            .conditions
            .iter()
            .zip(&desired.conditions)
            .all(|(a, b)| {
                (
                    &a.type_,
                    &a.status,
                    &a.reason,
                    &a.message,
                    a.observed_generation,
                ) == (
                    &b.type_,
                    &b.status,
                    &b.reason,
                    &b.message,
                    b.observed_generation,
                )
            });
    if !same_conditions
        || written.applied_revision != desired.applied_revision
        || written.mode != desired.mode
        || written.agent_version != desired.agent_version
    {
        StatusChange::Major
    } else if written.programmed_resource_version != desired.programmed_resource_version {
        StatusChange::Progress
    } else if written.service_ports != desired.service_ports
        || written.endpoints != desired.endpoints
    {
        StatusChange::Minor
    } else {
        StatusChange::Unchanged
    }
}

/// Decides which statuses are written, and when.
#[derive(Debug, Clone)]
pub struct StatusGate {
    min_interval: Duration,
    progress_interval: Duration,
    /// How long rollout progress waits on top of the interval (and after a quiet time):
    /// a different fraction of the report interval on each node.
    spread: Duration,
    /// When the held status was first held.
    held_since: Option<Instant>,
    written: Option<NodeProxyPlanStatus>,
    last_write: Option<Instant>,
    held: Option<NodeProxyPlanStatus>,
}

impl StatusGate {
    /// A gate holding minor changes for `min_interval` after each write, and rollout
    /// progress for `progress_interval` (the first progress after a quiet time goes at
    /// once).
    #[must_use]
    pub fn new(min_interval: Duration, progress_interval: Duration) -> Self {
        Self {
            min_interval,
            progress_interval,
            spread: Duration::ZERO,
            held_since: None,
            written: None,
            last_write: None,
            held: None,
        }
    }

    /// Rollout progress after a quiet time waits `spread` (see [`StatusGate::spread_for`]).
    #[must_use]
    pub fn with_spread(mut self, spread: Duration) -> Self {
        self.spread = spread;
        self
    }

    /// The spread of node `node`: a fraction of a quarter of `progress_interval` that
    /// depends only on the node's name (2.5 s at most with the default 10 s: 5,000 nodes
    /// report one change on a quiet cluster at about 2,000 writes/s, not 5,000 at once).
    #[must_use]
    pub fn spread_for(node: &str, progress_interval: Duration) -> Duration {
        let fraction = (proxyplan_crds::stable_hash(node.as_bytes()) % 1000) as f64 / 1000.0;
        progress_interval.mul_f64(fraction / 4.0)
    }

    /// The status last written (or found on the object).
    #[must_use]
    pub fn written(&self) -> Option<&NodeProxyPlanStatus> {
        self.written.as_ref()
    }

    /// Starts over from what a new plan object holds (it was created, or re-created).
    pub fn rebase(&mut self, observed: Option<NodeProxyPlanStatus>) {
        self.written = observed;
        self.last_write = None;
        self.held = None;
        self.held_since = None;
    }

    /// Offers the desired status at `now`. Returns it when it must be written now; a
    /// minor change within the interval is held until [`StatusGate::due`].
    pub fn offer(
        &mut self,
        desired: NodeProxyPlanStatus,
        now: Instant,
    ) -> Option<NodeProxyPlanStatus> {
        match classify(self.written.as_ref(), &desired) {
            StatusChange::Unchanged => {
                self.held = None;
                self.held_since = None;
                None
            }
            StatusChange::Major => Some(self.record(desired, now)),
            change @ (StatusChange::Minor | StatusChange::Progress) => {
                let since = *self.held_since.get_or_insert(now);
                if now >= self.due_at(change, since) {
                    Some(self.record(desired, now))
                } else {
                    self.held = Some(desired);
                    None
                }
            }
        }
    }

    fn interval(&self, change: StatusChange) -> Duration {
        if change == StatusChange::Progress {
            self.progress_interval.min(self.min_interval)
        } else {
            self.min_interval
        }
    }

    /// When the held status may be written, if one is held.
    #[must_use]
    pub fn due(&self) -> Option<Instant> {
        self.held.as_ref().map(|held| {
            let change = classify(self.written.as_ref(), held);
            self.due_at(change, self.held_since.unwrap_or_else(Instant::now))
        })
    }

    /// When a change of class `change`, first offered at `since`, may be written.
    ///
    /// Progress waits its node's spread on top of both: after a quiet time, so that one
    /// change is not reported by every node in the same instant; and under churn, so
    /// that nodes which wrote together (they started together, or came back together
    /// after an outage) drift apart instead of writing in lockstep every interval.
    fn due_at(&self, change: StatusChange, since: Instant) -> Instant {
        let Some(last) = self.last_write else {
            return since;
        };
        let after_last = last + self.interval(change);
        if change == StatusChange::Progress {
            after_last.max(since) + self.spread
        } else {
            after_last
        }
    }

    /// The held status, once it is due at `now`.
    pub fn release(&mut self, now: Instant) -> Option<NodeProxyPlanStatus> {
        let due = self.due()?;
        if now < due {
            return None;
        }
        let held = self.held.take()?;
        Some(self.record(held, now))
    }

    fn record(&mut self, status: NodeProxyPlanStatus, now: Instant) -> NodeProxyPlanStatus {
        self.held = None;
        self.held_since = None;
        self.written = Some(status.clone());
        self.last_write = Some(now);
        status
    }
}

/// Writes each status published on `desired` to plan `node`, the latest first; a failed
/// write is retried with jittered exponential backoff (from [`STATUS_RETRY_INITIAL`] to
/// [`STATUS_RETRY_MAX`]) unless a newer status replaces it. Runs until the sender is
/// dropped.
pub async fn write_statuses(
    api: Api<NodeProxyPlan>,
    node: String,
    mut desired: watch::Receiver<Option<NodeProxyPlanStatus>>,
    metrics: Arc<Metrics>,
) {
    let mut retry_at: Option<Instant> = None;
    let mut backoff = Backoff::new(STATUS_RETRY_INITIAL, STATUS_RETRY_MAX);
    loop {
        match retry_at {
            Some(at) => tokio::select! {
                changed = desired.changed() => if changed.is_err() { return },
                () = tokio::time::sleep_until(at) => {}
            },
            None => {
                if desired.changed().await.is_err() {
                    return;
                }
            }
        }
        let Some(status) = desired.borrow_and_update().clone() else {
            retry_at = None;
            continue;
        };
        retry_at = match patch_status(&api, &node, &status).await {
            Ok(()) => {
                debug!(node, "status written");
                metrics.status_write("ok");
                backoff.reset();
                None
            }
            Err(kube::Error::Api(response)) if response.code == 404 => {
                debug!(node, "plan gone; status not written");
                metrics.status_write("not_found");
                None
            }
            Err(err) => {
                let delay = backoff.next_delay();
                warn!(
                    node,
                    %err,
                    "status write failed; retrying in {:.1}s",
                    delay.as_secs_f64()
                );
                metrics.status_write("error");
                Some(Instant::now() + delay)
            }
        };
    }
}

/// Server-side applies `status` to plan `node`'s `/status` subresource.
///
/// # Errors
/// The API error.
pub async fn patch_status(
    api: &Api<NodeProxyPlan>,
    node: &str,
    status: &NodeProxyPlanStatus,
) -> Result<(), kube::Error> {
    let patch = json!({
        "apiVersion": format!("{}/{}", proxyplan_crds::GROUP, proxyplan_crds::VERSION),
        "kind": "NodeProxyPlan",
        "metadata": { "name": node },
        "status": status,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(node, &params, &Patch::Apply(&patch))
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use proxyplan_crds::{LocalTrafficDetection, LocalTrafficMode, PlanError};

    use super::*;

    fn merged(revision: &str, fingerprint: u64) -> Arc<MergedPlan> {
        Arc::new(MergedPlan {
            node_name: "node-a".to_owned(),
            revision: revision.to_owned(),
            services_fingerprint: fingerprint,
            addresses: Vec::new(),
            local_traffic: LocalTrafficDetection {
                mode: LocalTrafficMode::ClusterCIDR,
                cidrs: Vec::new(),
                interface: None,
            },
            service_ports: Vec::new(),
            refused: Vec::new(),
            unmatched: Vec::new(),
            service_cidrs: Vec::new(),
        })
    }

    fn t(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    fn observe<'a>(
        outcome: &'a PlanOutcome,
        applied: Option<&'a AppliedPlan>,
        failure: Option<&'a SyncFailure>,
    ) -> Observation<'a> {
        Observation {
            generation: Some(3),
            outcome,
            applied,
            failure,
            mode: "iptables",
            sync_duration: Some(Duration::from_millis(12)),
            programmed_through: None,
        }
    }

    fn condition<'a>(status: &'a NodeProxyPlanStatus, type_: &str) -> &'a Condition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn endpoints_are_counted_once_per_service_port() {
        let entry =
            |key: &str, cluster: &[&str], local: &[&str]| {
                let list = |ips: &[&str]| {
                    ips.iter()
                        .map(|ip| format!("{{ip: {ip}, port: 80}}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                Arc::new(serde_yaml::from_str::<proxyplan_crds::ServicePortPlan>(&format!(
                "{{key: {key}, namespace: d, name: w, family: IPv4, protocol: TCP, port: 80, \
                 clusterIP: 10.96.0.1, internal: {{policy: Cluster, whenEmpty: Reject}}, \
                 clusterEndpoints: [{}], localEndpoints: [{}], masquerade: {{all: false, \
                 offClusterToClusterIP: false, external: false, localHostToExternal: false, \
                 hairpin: false}}}}",
                list(cluster),
                list(local)
            ))
            .unwrap())
            };
        let mut plan = (*merged("r1", 0)).clone();
        assert_eq!(endpoint_count(&plan), 0);
        plan.service_ports = vec![
            entry("a", &["10.0.0.1", "10.0.0.2"], &["10.0.0.2"]),
            entry("b", &["10.0.0.1"], &["10.0.0.3"]),
            entry("c", &[], &[]),
        ];
        assert_eq!(endpoint_count(&plan), 4);
        assert_eq!(AppliedPlan::new(Arc::new(plan)).endpoints, 4);
    }

    #[test]
    fn synced_plan_is_ready_and_not_degraded() {
        let plan = merged("r1", 1);
        let applied = AppliedPlan::new(plan.clone());
        let outcome = PlanOutcome::Merged(plan);
        let status = build_status(&observe(&outcome, Some(&applied), None), None, t(0));
        let ready = condition(&status, READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Synced")
        );
        assert_eq!(ready.observed_generation, Some(3));
        assert_eq!(ready.last_transition_time, Time(t(0)));
        let degraded = condition(&status, DEGRADED);
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("False", "AsExpected")
        );
        assert_eq!(status.applied_revision.as_deref(), Some("r1"));
        assert_eq!(status.mode.as_deref(), Some("iptables"));
        assert_eq!(status.sync_duration_seconds, Some(0.012));
        assert_eq!(status.agent_version.as_deref(), Some(AGENT_VERSION));
    }

    #[test]
    fn transition_time_moves_only_when_a_condition_status_changes() {
        let plan = merged("r1", 0);
        let applied = AppliedPlan::new(plan.clone());
        let outcome = PlanOutcome::Merged(plan.clone());
        let first = build_status(&observe(&outcome, Some(&applied), None), None, t(0));
        // Same statuses later: times kept.
        let again = build_status(
            &observe(&outcome, Some(&applied), None),
            Some(&first),
            t(50),
        );
        assert_eq!(again, first);
        // A failure flips both conditions: both times move.
        let failure = SyncFailure {
            label: "tool_failed",
            message: "iptables-restore failed (exit Some(1)): line 3".to_owned(),
        };
        let failed = build_status(
            &observe(&outcome, Some(&applied), Some(&failure)),
            Some(&again),
            t(60),
        );
        let ready = condition(&failed, READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "SyncFailed")
        );
        assert_eq!(ready.last_transition_time, Time(t(60)));
        let degraded = condition(&failed, DEGRADED);
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "ToolFailed")
        );
        assert_eq!(degraded.last_transition_time, Time(t(60)));
        assert_eq!(classify(Some(&again), &failed), StatusChange::Major);
    }

    #[test]
    fn invalid_plan_is_degraded_and_names_the_field() {
        let applied = AppliedPlan::new(merged("r1", 0));
        let outcome = PlanOutcome::Invalid {
            revision: "r2".to_owned(),
            error: PlanError::InvalidField {
                object: "NodeProxyPlan/node-a".to_owned(),
                field: "spec.podCIDRs[0]".to_owned(),
                reason: "\"10.0.0.0/99\" is not a CIDR".to_owned(),
            },
        };
        let status = build_status(&observe(&outcome, Some(&applied), None), None, t(0));
        let ready = condition(&status, READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidPlan")
        );
        assert!(
            ready.message.contains("revision r1 stays programmed"),
            "{}",
            ready.message
        );
        let degraded = condition(&status, DEGRADED);
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "InvalidPlan")
        );
        assert!(
            degraded.message.contains("spec.podCIDRs[0]"),
            "{}",
            degraded.message
        );
        assert_eq!(status.applied_revision.as_deref(), Some("r1"));
    }

    #[test]
    fn an_overlay_without_its_service_plan_waits_and_names_it() {
        let mut plan = (*merged("r1", 1)).clone();
        plan.unmatched = vec!["demo/web:http/TCP/IPv4".to_owned()];
        let plan = Arc::new(plan);
        let applied = AppliedPlan::new(plan.clone());
        let outcome = PlanOutcome::Merged(plan);
        let status = build_status(&observe(&outcome, Some(&applied), None), None, t(0));
        let ready = condition(&status, READY);
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason, "WaitingForServicePlans");
        assert!(
            ready.message.contains("demo/web:http/TCP/IPv4"),
            "{}",
            ready.message
        );
        assert_eq!(condition(&status, DEGRADED).status, "False");
        assert_eq!(status.applied_revision.as_deref(), Some("r1"));
    }

    #[test]
    fn refused_service_plans_are_degraded_and_named_but_the_rest_is_ready() {
        let mut plan = (*merged("r1", 1)).clone();
        plan.refused = (0..7)
            .map(|i| PlanError::InvalidField {
                object: format!("ServiceProxyPlan/demo/s{i}"),
                field: "spec.servicePorts[0].clusterIP".to_owned(),
                reason: "127.0.0.1 is a loopback address".to_owned(),
            })
            .collect();
        let plan = Arc::new(plan);
        let applied = AppliedPlan::new(plan.clone());
        let outcome = PlanOutcome::Merged(plan);
        let status = build_status(&observe(&outcome, Some(&applied), None), None, t(0));
        assert_eq!(condition(&status, READY).status, "True");
        let degraded = condition(&status, DEGRADED);
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "InvalidServicePlan")
        );
        assert!(
            degraded.message.starts_with("7 Service plan(s) refused"),
            "{}",
            degraded.message
        );
        assert!(
            degraded
                .message
                .contains("ServiceProxyPlan/demo/s0: spec.servicePorts[0].clusterIP")
        );
        assert!(
            degraded.message.ends_with("and 2 more"),
            "{}",
            degraded.message
        );
    }

    #[test]
    fn classify_ignores_duration_and_transition_times() {
        let plan = merged("r1", 1);
        let applied = AppliedPlan::new(plan.clone());
        let outcome = PlanOutcome::Merged(plan);
        let a = build_status(&observe(&outcome, Some(&applied), None), None, t(0));
        let mut b = a.clone();
        b.sync_duration_seconds = Some(9.0);
        b.conditions[0].last_transition_time = Time(t(99));
        assert_eq!(classify(Some(&a), &b), StatusChange::Unchanged);
        let mut c = a.clone();
        c.service_ports = Some(2);
        assert_eq!(classify(Some(&a), &c), StatusChange::Minor);
        let mut d = a.clone();
        d.endpoints = Some(7);
        assert_eq!(classify(Some(&a), &d), StatusChange::Minor);
        let mut e = a.clone();
        e.applied_revision = Some("r2".to_owned());
        assert_eq!(classify(Some(&a), &e), StatusChange::Major);
        let mut f = a.clone();
        f.conditions[0].observed_generation = Some(4);
        assert_eq!(classify(Some(&a), &f), StatusChange::Major);
        assert_eq!(classify(None, &a), StatusChange::Major);
    }

    /// A synced status of plan `revision` with `endpoints` endpoints programmed.
    fn status_with(revision: &str, endpoints: u32) -> NodeProxyPlanStatus {
        let plan = merged(revision, u64::from(endpoints));
        let mut applied = AppliedPlan::new(plan.clone());
        applied.endpoints = endpoints;
        let outcome = PlanOutcome::Merged(plan);
        build_status(&observe(&outcome, Some(&applied), None), None, t(0))
    }

    #[tokio::test(start_paused = true)]
    async fn gate_writes_major_changes_at_once_and_holds_minor_ones() {
        let interval = Duration::from_secs(60);
        let mut gate = StatusGate::new(interval, interval);
        let t0 = Instant::now();
        let first = status_with("r1", 1);
        assert_eq!(gate.offer(first.clone(), t0), Some(first.clone()));
        assert_eq!(gate.offer(first.clone(), t0), None, "unchanged");
        assert_eq!(gate.due(), None);

        // Counts move on every endpoint change: held, the latest wins.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(gate.offer(status_with("r1", 2), Instant::now()), None);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(gate.offer(status_with("r1", 3), Instant::now()), None);
        assert_eq!(gate.due(), Some(t0 + interval));
        assert_eq!(gate.release(Instant::now()), None, "not due yet");
        tokio::time::advance(Duration::from_secs(50)).await;
        assert_eq!(gate.release(Instant::now()), Some(status_with("r1", 3)));
        assert_eq!(gate.due(), None);

        // A plan revision goes at once, even within the interval.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            gate.offer(status_with("r2", 3), Instant::now()),
            Some(status_with("r2", 3))
        );
        // A minor change long after the last write goes at once.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(
            gate.offer(status_with("r2", 4), Instant::now()),
            Some(status_with("r2", 4))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn gate_reports_rollout_progress_at_once_then_once_per_report_interval() {
        let mut gate = StatusGate::new(Duration::from_secs(60), Duration::from_secs(10));
        let at = |through: u64, endpoints: u32| {
            let mut status = status_with("r1", endpoints);
            status.programmed_resource_version = Some(through.to_string());
            status
        };
        let t0 = Instant::now();
        assert!(gate.offer(at(100, 1), t0).is_some());
        // The first mark after a quiet time goes at once...
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(gate.offer(at(105, 1), Instant::now()), Some(at(105, 1)));
        // ...then one per interval under churn, the newest mark and counts together.
        let t1 = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(gate.offer(at(110, 2), Instant::now()), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(gate.offer(at(120, 3), Instant::now()), None);
        assert_eq!(gate.due(), Some(t1 + Duration::from_secs(10)));
        tokio::time::advance(Duration::from_secs(8)).await;
        assert_eq!(gate.release(Instant::now()), Some(at(120, 3)));
        // A count change alone still waits for the long interval.
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(gate.offer(at(120, 4), Instant::now()), None);
        assert_eq!(gate.due(), Some(t1 + Duration::from_secs(70)));
        assert_eq!(
            classify(Some(&at(120, 3)), &at(121, 3)),
            StatusChange::Progress
        );
    }

    #[tokio::test(start_paused = true)]
    async fn progress_after_a_quiet_time_waits_the_nodes_spread() {
        let spread = StatusGate::spread_for("node-a", Duration::from_secs(10));
        assert!(spread <= Duration::from_millis(2500));
        assert_ne!(
            spread,
            StatusGate::spread_for("node-b", Duration::from_secs(10))
        );
        let mut gate =
            StatusGate::new(Duration::from_secs(60), Duration::from_secs(10)).with_spread(spread);
        let at = |through: u64| {
            let mut status = status_with("r1", 1);
            status.programmed_resource_version = Some(through.to_string());
            status
        };
        assert!(
            gate.offer(at(1), Instant::now()).is_some(),
            "the first write is at once"
        );
        tokio::time::advance(Duration::from_secs(60)).await;
        let t0 = Instant::now();
        assert_eq!(gate.offer(at(2), t0), None);
        assert_eq!(gate.due(), Some(t0 + spread));
        // A newer mark meanwhile does not push it back.
        tokio::time::advance(spread / 2).await;
        assert_eq!(gate.offer(at(3), Instant::now()), None);
        assert_eq!(gate.due(), Some(t0 + spread));
        tokio::time::advance(spread).await;
        assert_eq!(gate.release(Instant::now()), Some(at(3)));
        // Under churn it waits the interval and the spread: nodes that wrote together
        // drift apart.
        let written = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(gate.offer(at(4), Instant::now()), None);
        assert_eq!(gate.due(), Some(written + Duration::from_secs(10) + spread));
    }

    #[tokio::test(start_paused = true)]
    async fn gate_drops_a_held_change_that_was_undone_and_rebases_on_a_new_object() {
        let mut gate = StatusGate::new(Duration::from_secs(60), Duration::from_secs(60));
        let first = status_with("r1", 1);
        assert!(gate.offer(first.clone(), Instant::now()).is_some());
        assert_eq!(gate.offer(status_with("r1", 2), Instant::now()), None);
        assert_eq!(gate.offer(first.clone(), Instant::now()), None);
        assert_eq!(gate.due(), None);

        // The object was re-created with an empty status: written again at once.
        gate.rebase(None);
        assert_eq!(
            gate.offer(first.clone(), Instant::now()),
            Some(first.clone())
        );
        // An agent restart finds its own status on the object: nothing to write.
        gate.rebase(Some(first.clone()));
        assert_eq!(gate.offer(first, Instant::now()), None);
    }

    /// A restarted agent whose first sync failed (its read-back, or its restore) has
    /// applied nothing itself, but the kernel still holds the previous agent's rules:
    /// the condition must not call it empty.
    #[test]
    fn a_failure_before_the_first_sync_never_claims_an_empty_kernel() {
        let outcome = PlanOutcome::Merged(merged("r2", 1));
        let failure = SyncFailure {
            label: "io",
            message: "reading nf_tables table ip nat over nfnetlink: Operation not permitted"
                .to_owned(),
        };
        let status = build_status(&observe(&outcome, None, Some(&failure)), None, t(0));
        let ready = condition(&status, READY);
        assert_eq!(ready.reason, "SyncFailed");
        assert!(
            ready.message.contains("over nfnetlink"),
            "{}",
            ready.message
        );
        assert!(
            !ready.message.contains("nothing is programmed"),
            "{}",
            ready.message
        );
        assert!(
            ready
                .message
                .ends_with("the kernel keeps whatever rules it held when this agent started"),
            "{}",
            ready.message
        );
    }

    #[test]
    fn failure_reasons_are_camel_case_labels() {
        let reason = |label| {
            SyncFailure {
                label,
                message: String::new(),
            }
            .reason()
        };
        assert_eq!(reason("tool_failed"), "ToolFailed");
        assert_eq!(reason("missing_tool"), "MissingTool");
        assert_eq!(reason("io"), "Io");
    }
}
