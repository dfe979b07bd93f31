//! The sync loop: watch events in, kernel updates and status out.
//!
//! Each sync is a short pipeline: evaluate the cache (validate and merge) → pick the
//! target (the merged plan, or the last good one when the plan is refused) → hand it to
//! the dataplane thread → record the result → offer the status.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::watcher::Event;
use proxyplan_crds::{
    EmptyAction, IpFamily, MergedPlan, NodeProxyPlanStatus, TrafficPlan, TrafficPolicy,
};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{Instrument, debug, error, info, info_span, warn};

use super::cache::{PlanCache, PlanOutcome};
use super::healthcheck::{HealthCheckServers, wanted_ports};
use super::http::{Health, Metrics, ModeLabels, PolicyLabels, ReasonLabels};
use super::record::HealthCheckRecord;
use super::schedule::{SyncKind, SyncSchedule};
use super::status::{AppliedPlan, Observation, StatusGate, SyncFailure, build_status};
use super::watches::{Input, InputStream};
use super::worker::DataplaneThread;
use super::{ProxyMode, RunError, Settings};
use crate::dataplane::{Dataplane, DataplaneError, SyncReport};

/// The task that owns the cache, the schedule and the dataplane.
pub struct SyncLoop {
    node: String,
    mode: ProxyMode,
    cache: PlanCache,
    dataplane: DataplaneThread,
    schedule: SyncSchedule,
    outcome: PlanOutcome,
    outcome_summary: String,
    applied: Option<AppliedPlan>,
    failure: Option<SyncFailure>,
    last_duration: Option<Duration>,
    /// Trigger times of the EndpointSlice changes waiting for the kernel.
    pending_triggers: Vec<SystemTime>,
    /// The newest trigger time seen per object: each is measured once.
    seen_triggers: HashMap<String, SystemTime>,
    /// Changes made before the agent started are not measured (as in kube-proxy).
    started: SystemTime,
    /// The IP families the node proxies, for the metrics' `ip_family` label.
    families: Vec<&'static str>,
    gate: StatusGate,
    status: watch::Sender<Option<NodeProxyPlanStatus>>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    healthchecks: HealthCheckServers,
    /// Where the health-check record goes, if anywhere.
    state_dir: Option<PathBuf>,
    /// nftables mode: how often the kernel is asked whether anyone else changed the
    /// agent's table (`None`: only at the periodic resync).
    tamper_check: Option<Duration>,
    /// When it is next asked.
    tamper_due: Instant,
    /// The record last written (or read at start).
    recorded: Option<HealthCheckRecord>,
    /// Every Service plan change up to this `resourceVersion` is in the kernel (the
    /// rollout mark reported in the status).
    programmed_through: Option<u64>,
}

impl SyncLoop {
    /// A loop programming `dataplane` (moved to its own thread) and publishing the
    /// statuses to write on `status`.
    ///
    /// # Errors
    /// When the dataplane thread cannot be started.
    pub fn new(
        settings: &Settings,
        dataplane: impl Dataplane + Send + 'static,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        status: watch::Sender<Option<NodeProxyPlanStatus>>,
        http: tokio::runtime::Handle,
    ) -> Result<Self, RunError> {
        // nftables mode: the tamper check, and its change alarm with it.
        let tamper_check = (settings.mode == ProxyMode::Nftables
            && !settings.tamper_check_interval.is_zero())
        .then_some(settings.tamper_check_interval);
        Ok(Self {
            node: settings.node_name.clone(),
            mode: settings.mode,
            cache: PlanCache::default(),
            dataplane: DataplaneThread::spawn_with(dataplane, tamper_check.is_some())
                .map_err(RunError::DataplaneThread)?,
            schedule: SyncSchedule::new(
                settings.min_sync_interval,
                settings.sync_period,
                Instant::now(),
            ),
            outcome: PlanOutcome::NotListed,
            outcome_summary: String::new(),
            applied: None,
            failure: None,
            last_duration: None,
            pending_triggers: Vec::new(),
            seen_triggers: HashMap::new(),
            started: SystemTime::now(),
            families: vec!["IPv4"],
            gate: StatusGate::new(
                settings.status_min_interval,
                settings.rollout_report_interval,
            )
            .with_spread(StatusGate::spread_for(
                &settings.node_name,
                settings.rollout_report_interval,
            )),
            status,
            healthchecks: HealthCheckServers::new(
                settings.nodeport_addresses.clone(),
                settings.nodeport_primary,
                health.clone(),
                http,
            ),
            metrics,
            health,
            state_dir: settings.state_dir.clone(),
            recorded: None,
            tamper_check,
            tamper_due: Instant::now(),
            programmed_through: None,
        })
    }

    /// What the plan and Service plans amounted to at the last sync.
    #[must_use]
    pub fn outcome(&self) -> &PlanOutcome {
        &self.outcome
    }

    /// What the kernel holds.
    #[must_use]
    pub fn applied(&self) -> Option<&AppliedPlan> {
        self.applied.as_ref()
    }

    /// The health-check node ports being served.
    #[must_use]
    pub fn health_check_ports(&self) -> Vec<u16> {
        self.healthchecks.ports()
    }

    /// Runs until `shutdown` completes or `inputs` ends.
    ///
    /// # Errors
    /// When the dataplane thread dies.
    pub async fn run(
        &mut self,
        mut inputs: InputStream,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RunError> {
        let mut shutdown = std::pin::pin!(shutdown);
        self.answer_from_record().await?;
        loop {
            let (due, kind) = self.schedule.next(self.cache.listed(), Instant::now());
            let status_due = self.gate.due();
            // Only once something is programmed: before, there is nothing to tamper with.
            let tamper_due = self
                .tamper_check
                .filter(|_| self.applied.is_some())
                .map(|_| self.tamper_due);
            // nf_tables announced a commit to the table by someone else: check now.
            let alarmed = async {
                if tamper_due.is_some() {
                    self.dataplane.alarmed().await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                input = inputs.next() => match input {
                    Some(input) => self.handle(input),
                    None => return Ok(()),
                },
                () = tokio::time::sleep_until(due) => self.sync(kind).await?,
                () = sleep_until(status_due) => self.release_status(),
                () = sleep_until(tamper_due) => self.tamper_check().await?,
                () = alarmed => {
                    debug!("nf_tables announced a change to the table by someone else");
                    self.tamper_check().await?;
                }
            }
        }
    }

    /// Applies one watch event to the cache.
    pub fn handle(&mut self, input: Input) {
        let (key, change) = match input {
            Input::Plan(event) => {
                let key = format!("NodeProxyPlan/{}", event_object(&event));
                let change = self.cache.plan_event(event);
                if change.new_object {
                    let observed = self.cache.plan().and_then(|p| p.status.clone());
                    self.gate.rebase(observed);
                }
                self.health.set_ineligible(self.ineligible());
                (key, change)
            }
            Input::Service(event) => {
                let key = format!("ServiceProxyPlan/{}", event_object(&event));
                if matches!(event, Event::Delete(_)) {
                    self.seen_triggers.remove(&key);
                }
                (key, self.cache.service_event(event))
            }
            Input::WatchError(kind, err) => {
                warn!(
                    kind,
                    %err,
                    "watch failed; retrying with backoff while the kernel keeps the last plan \
                     (are the proxyplan CRDs installed and may this agent read them?)"
                );
                return;
            }
        };
        if change.relevant {
            self.queue(key, change.trigger);
        }
    }

    /// Why load balancers should leave this node, as its plan says (none until the plans
    /// are listed; a node without a plan is not eligible, as kube-proxy treats an
    /// unknown Node).
    fn ineligible(&self) -> Option<String> {
        match self.cache.plan() {
            Some(plan) => plan.spec.ineligible.clone(),
            None if self.cache.listed() => Some(format!("no NodeProxyPlan {}", self.node)),
            None => None,
        }
    }

    /// Counts a change waiting for a sync: an EndpointSlice change when the object carries
    /// a trigger time newer than any seen for it, else a Service (or node) change.
    fn queue(&mut self, key: String, trigger: Option<SystemTime>) {
        self.schedule.changed();
        self.health.queued();
        Metrics::stamp(
            &self.metrics.last_queued_timestamp,
            &self.families,
            SystemTime::now(),
        );
        let fresh = trigger.filter(|t| {
            *t >= self.started && self.seen_triggers.get(&key).is_none_or(|seen| t > seen)
        });
        match fresh {
            Some(at) => {
                self.seen_triggers.insert(key, at);
                self.pending_triggers.push(at);
                self.metrics.endpoint_changes_total.inc();
                self.metrics.endpoint_changes_pending.inc();
            }
            None => {
                self.metrics.service_changes_total.inc();
                self.metrics.service_changes_pending.inc();
            }
        }
    }

    /// One sync: evaluate, program the kernel when needed, offer the status.
    ///
    /// # Errors
    /// When the dataplane thread dies.
    pub async fn sync(&mut self, kind: SyncKind) -> Result<(), RunError> {
        self.schedule.started(kind, Instant::now());
        // What waited is now being synced (kube-proxy's checkout).
        self.metrics.endpoint_changes_pending.set(0);
        self.metrics.service_changes_pending.set(0);
        let through = self.cache.received();
        let listed = self.cache.listed();
        if listed {
            let started = std::time::Instant::now();
            self.outcome = self.cache.evaluate();
            self.metrics
                .merge_duration
                .observe(started.elapsed().as_secs_f64());
            self.note_outcome();
        }
        let target = match &self.outcome {
            PlanOutcome::Merged(plan) => Some(plan.clone()),
            _ => self.applied.as_ref().map(|a| a.plan.clone()),
        };
        let needed = kind == SyncKind::Periodic
            || self.failure.is_some()
            || target
                .as_ref()
                .is_some_and(|t| self.applied.as_ref().is_none_or(|a| !a.is(t)));
        match target.filter(|_| needed) {
            Some(target) => {
                let span = info_span!("sync", node = %self.node, plan_revision = %target.revision);
                async {
                    if kind == SyncKind::Periodic {
                        self.check_canary().await?;
                    }
                    let full = kind == SyncKind::Periodic
                        || self.applied.is_none()
                        || self.failure.is_some();
                    self.apply(target, full).await
                }
                .instrument(span)
                .await?;
            }
            None => self.health.settled(),
        }
        if listed && self.clean() {
            self.programmed_through = Some(self.programmed_through.unwrap_or(0).max(through));
        }
        if listed {
            self.refresh_status();
        }
        Ok(())
    }

    /// Whether the kernel holds exactly what the watches showed at the last sync: the
    /// merged plan, with no Service plan refused, and no failure since.
    fn clean(&self) -> bool {
        match (&self.outcome, &self.applied) {
            (PlanOutcome::Merged(plan), Some(applied)) => {
                plan.refused.is_empty() && self.failure.is_none() && applied.is(plan)
            }
            _ => false,
        }
    }

    fn note_outcome(&mut self) {
        let kept = self.applied.as_ref().map_or_else(
            || "whatever rules it held when this agent started".to_owned(),
            |a| format!("revision {}", a.plan.revision),
        );
        let summary = match &self.outcome {
            PlanOutcome::NotListed => return,
            PlanOutcome::NoPlan => {
                format!(
                    "no NodeProxyPlan {} yet; the kernel keeps {kept}",
                    self.node
                )
            }
            PlanOutcome::Invalid { revision, error } => {
                format!("plan revision {revision} refused: {error}; the kernel keeps {kept}")
            }
            PlanOutcome::Merged(plan) => format!("plan revision {}", plan.revision),
        };
        if summary == self.outcome_summary {
            return;
        }
        match &self.outcome {
            PlanOutcome::Invalid { error, .. } => {
                warn!(node = %self.node, "{summary}");
                self.metrics
                    .invalid_plans
                    .get_or_create(&ReasonLabels {
                        reason: error.label().to_owned(),
                    })
                    .inc();
                // Never programmed: no latency to measure.
                self.pending_triggers.clear();
            }
            PlanOutcome::Merged(_) => debug!(node = %self.node, "{summary}"),
            _ => info!(node = %self.node, "{summary}"),
        }
        self.outcome_summary = summary;
    }

    /// Until the agent applies a plan of its own, the health-check ports answer what they
    /// answered before the restart, if the kernel still holds the agent's rules (see
    /// [`super::record`]).
    async fn answer_from_record(&mut self) -> Result<(), RunError> {
        let Some(dir) = &self.state_dir else {
            return Ok(());
        };
        let record = match HealthCheckRecord::read(dir) {
            Ok(Some(record)) => record,
            Ok(None) => return Ok(()),
            Err(err) => {
                warn!(%err, "health-check record unreadable; its ports open with the first sync");
                return Ok(());
            }
        };
        // Read from the kernel, not assumed: nothing was programmed or read yet.
        let held = self
            .dataplane
            .holds_rules()
            .await
            .map_err(|_| RunError::DataplaneStopped)?;
        match held {
            Ok(true) => {
                info!(
                    revision = %record.revision,
                    ports = record.ports.len(),
                    "the kernel still holds the previous agent's rules: health-check node ports \
                     answer as they did for its revision until a plan is applied"
                );
                self.healthchecks.serve(record.ports(), &record.addresses);
                self.recorded = Some(record);
            }
            Ok(false) => info!(
                revision = %record.revision,
                "the kernel lost the previous agent's rules: health-check node ports open \
                 with the first sync"
            ),
            Err(err) => {
                warn!(%err, "cannot read the kernel's rules; health-check node ports open with the first sync")
            }
        }
        Ok(())
    }

    /// Writes the health-check record when the answers changed.
    fn record_health_checks(&mut self, plan: &MergedPlan) {
        let Some(dir) = &self.state_dir else {
            return;
        };
        let record = HealthCheckRecord::new(&plan.revision, &plan.addresses, &wanted_ports(plan));
        if self
            .recorded
            .as_ref()
            .is_some_and(|r| r.addresses == record.addresses && r.ports == record.ports)
        {
            return;
        }
        match record.write(dir) {
            Ok(()) => self.recorded = Some(record),
            Err(err) => warn!(%err, "cannot write the health-check record"),
        }
    }

    /// nftables mode, between periodic resyncs: asks the kernel whether anyone else
    /// changed the agent's table (a generation read and nf_tables' announcements; the
    /// table is read back only when someone did) and repairs it at once when so, instead
    /// of at the next periodic resync.
    async fn tamper_check(&mut self) -> Result<(), RunError> {
        if let Some(interval) = self.tamper_check {
            self.tamper_due = Instant::now() + interval;
        }
        match self
            .dataplane
            .rules_intact()
            .await
            .map_err(|_| RunError::DataplaneStopped)?
        {
            Ok(true) => Ok(()),
            Ok(false) => {
                warn!("someone else changed the agent's rules; restoring them now");
                self.metrics.canary_missing.inc();
                self.sync(SyncKind::Periodic).await
            }
            Err(err) => {
                debug!(%err, "tamper check failed; the periodic resync checks again");
                Ok(())
            }
        }
    }

    async fn check_canary(&mut self) -> Result<(), RunError> {
        match self
            .dataplane
            .rules_intact()
            .await
            .map_err(|_| RunError::DataplaneStopped)?
        {
            Ok(true) => {}
            Ok(false) => {
                warn!("the agent's rules were removed by someone else; restoring them");
                self.metrics.canary_missing.inc();
            }
            Err(err) => warn!(%err, "canary check failed; syncing anyway"),
        }
        Ok(())
    }

    async fn apply(&mut self, target: Arc<MergedPlan>, full: bool) -> Result<(), RunError> {
        let started = std::time::Instant::now();
        let result = self
            .dataplane
            .sync(target.clone())
            .await
            .map_err(|_| RunError::DataplaneStopped)?;
        let elapsed = started.elapsed();
        self.last_duration = Some(elapsed);
        self.metrics.observe_sync(&self.families, elapsed, full);
        match result {
            Ok(report) => self.synced(target, &report, elapsed),
            Err(error) => self.sync_failed(&error),
        }
        Ok(())
    }

    fn synced(&mut self, target: Arc<MergedPlan>, report: &SyncReport, elapsed: Duration) {
        let now = SystemTime::now();
        self.families = families_of(&target);
        self.health.set_families(self.families.clone());
        if matches!(&self.outcome, PlanOutcome::Merged(m) if Arc::ptr_eq(m, &target)) {
            for at in std::mem::take(&mut self.pending_triggers) {
                let latency = now.duration_since(at).unwrap_or_default();
                self.metrics.observe_programming(&self.families, latency);
            }
        }
        let applied = AppliedPlan::new(target);
        let metrics = &self.metrics;
        Metrics::stamp(&metrics.last_sync_timestamp, &self.families, now);
        record_no_local_endpoints(metrics, &applied.plan, &self.families);
        metrics
            .rules
            .get_or_create(&ModeLabels {
                mode: self.mode.as_str().to_owned(),
            })
            .set(i64::try_from(report.rules).unwrap_or(i64::MAX));
        metrics
            .conntrack_deleted
            .inc_by(u64::try_from(report.conntrack_deleted).unwrap_or(u64::MAX));
        if let Some(run) = report.conntrack {
            metrics.observe_conntrack(&self.families, run.elapsed, run.deleted);
        }
        metrics.service_ports.set(i64::from(applied.service_ports));
        metrics.endpoints.set(i64::from(applied.endpoints));
        self.healthchecks.update(&applied.plan);
        self.record_health_checks(&applied.plan);
        if report.changed > 0 || self.failure.is_some() {
            info!(
                service_ports = applied.service_ports,
                endpoints = applied.endpoints,
                rules = report.rules,
                changed = report.changed,
                conntrack_deleted = report.conntrack_deleted,
                elapsed_ms = elapsed.as_millis(),
                "kernel updated"
            );
        } else {
            debug!(
                rules = report.rules,
                elapsed_ms = elapsed.as_millis(),
                "kernel already up to date"
            );
        }
        self.applied = Some(applied);
        self.failure = None;
        self.schedule.succeeded();
        self.health.updated();
    }

    fn sync_failed(&mut self, error: &DataplaneError) {
        error!(%error, "sync failed; retrying with backoff while the kernel keeps what it had");
        if let DataplaneError::ToolFailed { tool, .. } = error
            && tool.contains("tables-restore")
        {
            let family = if tool.contains("ip6tables") {
                "IPv6"
            } else {
                "IPv4"
            };
            self.metrics.restore_failure(family);
        }
        self.metrics
            .sync_errors
            .get_or_create(&ReasonLabels {
                reason: error.label().to_owned(),
            })
            .inc();
        self.failure = Some(SyncFailure {
            label: error.label(),
            message: error.to_string(),
        });
        self.schedule.failed(Instant::now());
        self.health.failed();
    }

    fn refresh_status(&mut self) {
        let Some(plan) = self.cache.plan() else {
            return;
        };
        let observation = Observation {
            generation: plan.metadata.generation,
            outcome: &self.outcome,
            applied: self.applied.as_ref(),
            failure: self.failure.as_ref(),
            mode: self.mode.as_str(),
            sync_duration: self.last_duration,
            programmed_through: self.programmed_through,
        };
        let desired = build_status(&observation, self.gate.written(), Timestamp::now());
        if let Some(status) = self.gate.offer(desired, Instant::now()) {
            self.status.send_replace(Some(status));
        }
    }

    fn release_status(&mut self) {
        if let Some(status) = self.gate.release(Instant::now()) {
            self.status.send_replace(Some(status));
        }
    }
}

/// The IP families `plan` proxies (of its entries, else of the node's addresses; IPv4
/// when it has neither).
fn families_of(plan: &MergedPlan) -> Vec<&'static str> {
    let mut v4 = plan
        .service_ports
        .iter()
        .any(|e| e.family == IpFamily::IPv4);
    let mut v6 = plan
        .service_ports
        .iter()
        .any(|e| e.family == IpFamily::IPv6);
    if !v4 && !v6 {
        v4 = plan.addresses.iter().any(std::net::IpAddr::is_ipv4);
        v6 = plan.addresses.iter().any(std::net::IpAddr::is_ipv6);
    }
    match (v4, v6) {
        (_, false) => vec!["IPv4"],
        (false, true) => vec!["IPv6"],
        (true, true) => vec!["IPv4", "IPv6"],
    }
}

/// kube-proxy's `no_local_endpoints_total`: service ports with a Local policy in a
/// direction that have endpoints elsewhere (their empty action is a drop) and none here.
fn record_no_local_endpoints(metrics: &Metrics, plan: &MergedPlan, families: &[&str]) {
    let mut counts: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for &family in families {
        for policy in ["internal", "external"] {
            counts.insert((policy, family), 0);
        }
    }
    for entry in &plan.service_ports {
        let family = match entry.family {
            IpFamily::IPv4 => "IPv4",
            IpFamily::IPv6 => "IPv6",
        };
        let starved = |traffic: &TrafficPlan| {
            traffic.policy == TrafficPolicy::Local
                && traffic.when_empty == EmptyAction::Drop
                && entry.local_endpoints.is_empty()
        };
        if starved(&entry.internal) {
            *counts.entry(("internal", family)).or_default() += 1;
        }
        if entry.external.as_ref().is_some_and(starved) {
            *counts.entry(("external", family)).or_default() += 1;
        }
    }
    for ((policy, family), count) in counts {
        metrics
            .no_local_endpoints
            .get_or_create(&PolicyLabels {
                traffic_policy: policy.to_owned(),
                ip_family: family.to_owned(),
            })
            .set(count);
    }
}

fn event_object<K: kube::Resource>(event: &Event<K>) -> String {
    match event {
        Event::Apply(object) | Event::Delete(object) | Event::InitApply(object) => {
            match object.meta().namespace.as_deref() {
                Some(namespace) => format!("{namespace}/{}", object.name_any()),
                None => object.name_any(),
            }
        }
        Event::Init | Event::InitDone => String::new(),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
