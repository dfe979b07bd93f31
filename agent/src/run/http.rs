//! `/healthz` and `/metrics`, with kube-proxy's names and semantics where the meaning
//! is the same.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use k8s_openapi::jiff::Timestamp;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::RunError;

/// Labels with a reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The error's short label.
    pub reason: String,
}

/// Labels with a proxy mode.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    /// `iptables` or `ipvs`.
    pub mode: String,
}

/// Labels with an HTTP response code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    /// `200` or `503`.
    pub code: String,
}

/// Labels with a result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok`, `error`, `not_found`.
    pub result: String,
}

/// Labels with an IP family, as kube-proxy 1.33+ labels its sync metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabels {
    /// `IPv4` or `IPv6`.
    pub ip_family: String,
}

/// Labels of `kubeproxy_sync_proxy_rules_no_local_endpoints_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    /// `internal` or `external`.
    pub traffic_policy: String,
    /// `IPv4` or `IPv6`.
    pub ip_family: String,
}

/// Histograms by IP family, each with kube-proxy's buckets for its name.
pub type FamilyHistograms = Family<FamilyLabels, Histogram, fn() -> Histogram>;
/// Timestamps by IP family.
pub type FamilyTimestamps = Family<FamilyLabels, Gauge<f64, AtomicU64>>;

/// The agent's metrics: kube-proxy's names, labels and buckets where the meaning is the
/// same (the agent syncs both families at once, so a dual-stack node observes each sync
/// once per family, as kube-proxy's two proxiers do), and `proxyplan_agent_*` for the
/// rest.
pub struct Metrics {
    registry: Registry,
    /// `kubeproxy_sync_proxy_rules_duration_seconds{ip_family}`: every dataplane sync.
    pub sync_duration: FamilyHistograms,
    /// `kubeproxy_sync_full_proxy_rules_duration_seconds{ip_family}`: the first sync,
    /// periodic resyncs and retries after a failure (the kernel is re-read).
    pub full_sync_duration: FamilyHistograms,
    /// `kubeproxy_sync_partial_proxy_rules_duration_seconds{ip_family}`: syncs of changes.
    pub partial_sync_duration: FamilyHistograms,
    /// `kubeproxy_network_programming_duration_seconds{ip_family}`: from the EndpointSlice
    /// change (`endpoints.kubernetes.io/last-change-trigger-time`, carried by the plans)
    /// to the kernel updated; kube-proxy's buckets.
    pub network_programming: FamilyHistograms,
    /// `proxyplan_agent_network_programming_duration_seconds`: the same, with buckets
    /// down to a millisecond.
    pub network_programming_fine: Histogram,
    /// `proxyplan_agent_tokio_tasks`: tasks alive in the agent's runtime, read when
    /// scraped (a leak shows here first).
    pub tokio_tasks: Gauge,
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family}`.
    pub last_sync_timestamp: FamilyTimestamps,
    /// `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family}`.
    pub last_queued_timestamp: FamilyTimestamps,
    /// `kubeproxy_sync_proxy_rules_endpoint_changes_pending`: plan changes caused by an
    /// EndpointSlice change that wait for a sync.
    pub endpoint_changes_pending: Gauge,
    /// `kubeproxy_sync_proxy_rules_endpoint_changes_total`.
    pub endpoint_changes_total: Counter,
    /// `kubeproxy_sync_proxy_rules_service_changes_pending`: other plan changes waiting.
    pub service_changes_pending: Gauge,
    /// `kubeproxy_sync_proxy_rules_service_changes_total`.
    pub service_changes_total: Counter,
    /// `kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy,ip_family}`:
    /// service ports with a Local policy, endpoints elsewhere and none on this node.
    pub no_local_endpoints: Family<PolicyLabels, Gauge>,
    /// `proxyplan_agent_rules{mode}`: rules (or kernel objects) the kernel holds.
    pub rules: Family<ModeLabels, Gauge>,
    /// `proxyplan_agent_sync_errors_total{reason}`: failed syncs by error label.
    pub sync_errors: Family<ReasonLabels, Counter>,
    /// `proxyplan_agent_invalid_plans_total{reason}`: plan revisions refused.
    pub invalid_plans: Family<ReasonLabels, Counter>,
    /// `proxyplan_agent_canary_missing_total`: periodic checks that found the rules gone.
    pub canary_missing: Counter,
    /// `proxyplan_agent_conntrack_entries_deleted_total`.
    pub conntrack_deleted: Counter,
    /// `kubeproxy_conntrack_reconciler_sync_duration_seconds{ip_family}`: each run of the
    /// stale-UDP conntrack step (one run covers both families; each in use observes it).
    pub conntrack_reconciler_duration: FamilyHistograms,
    /// `kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family}`.
    pub conntrack_reconciler_deleted: Family<FamilyLabels, Counter>,
    /// `kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family}`:
    /// `iptables-restore` (or `ip6tables-restore`) failed.
    pub restore_failures: Family<FamilyLabels, Counter>,
    /// `proxyplan_agent_status_writes_total{result}`.
    pub status_writes: Family<ResultLabels, Counter>,
    /// `kubeproxy_proxy_healthz_total{code}`: `/healthz` requests.
    pub healthz_requests: Family<CodeLabels, Counter>,
    /// `kubeproxy_proxy_livez_total{code}`: `/livez` requests.
    pub livez_requests: Family<CodeLabels, Counter>,
    /// `proxyplan_agent_service_ports`: service ports programmed.
    pub service_ports: Gauge,
    /// `proxyplan_agent_endpoints`: endpoints programmed.
    pub endpoints: Gauge,
    /// `proxyplan_agent_merge_duration_seconds`: validating and merging the plan with the
    /// Service plans, before the dataplane runs.
    pub merge_duration: Histogram,
}

fn sync_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

fn programming_buckets() -> Histogram {
    Histogram::new(kube_proxy_programming_buckets())
}

impl Metrics {
    /// Registers every metric.
    #[must_use]
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let histograms =
            |f: fn() -> Histogram| -> FamilyHistograms { Family::new_with_constructor(f) };
        let metrics = Self {
            sync_duration: histograms(sync_buckets),
            full_sync_duration: histograms(sync_buckets),
            partial_sync_duration: histograms(sync_buckets),
            network_programming: histograms(programming_buckets),
            network_programming_fine: Histogram::new(fine_programming_buckets()),
            tokio_tasks: Gauge::default(),
            last_sync_timestamp: Family::default(),
            last_queued_timestamp: Family::default(),
            endpoint_changes_pending: Gauge::default(),
            endpoint_changes_total: Counter::default(),
            service_changes_pending: Gauge::default(),
            service_changes_total: Counter::default(),
            no_local_endpoints: Family::default(),
            rules: Family::default(),
            sync_errors: Family::default(),
            invalid_plans: Family::default(),
            canary_missing: Counter::default(),
            conntrack_deleted: Counter::default(),
            conntrack_reconciler_duration: histograms(sync_buckets),
            conntrack_reconciler_deleted: Family::default(),
            restore_failures: Family::default(),
            status_writes: Family::default(),
            healthz_requests: Family::default(),
            livez_requests: Family::default(),
            service_ports: Gauge::default(),
            endpoints: Gauge::default(),
            merge_duration: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            registry: Registry::default(),
        };
        let m = &metrics;
        registry.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            m.sync_duration.clone(),
        );
        registry.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            m.full_sync_duration.clone(),
        );
        registry.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            m.partial_sync_duration.clone(),
        );
        registry.register(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            m.network_programming.clone(),
        );
        registry.register("proxyplan_agent_network_programming_duration_seconds", "From the EndpointSlice change to the kernel updated, with buckets down to a millisecond", m.network_programming_fine.clone());
        registry.register(
            "proxyplan_agent_tokio_tasks",
            "Tasks alive in the agent's async runtime, read when scraped",
            m.tokio_tasks.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            m.last_sync_timestamp.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            m.last_queued_timestamp.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            m.endpoint_changes_pending.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            m.endpoint_changes_total.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            m.service_changes_pending.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            m.service_changes_total.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            m.no_local_endpoints.clone(),
        );
        registry.register(
            "proxyplan_agent_rules",
            "Rules (or kernel objects) the kernel holds for the plan",
            m.rules.clone(),
        );
        registry.register(
            "proxyplan_agent_sync_errors",
            "Failed dataplane syncs, by error",
            m.sync_errors.clone(),
        );
        registry.register(
            "proxyplan_agent_invalid_plans",
            "Plan revisions refused as invalid (the last good plan stays programmed)",
            m.invalid_plans.clone(),
        );
        registry.register(
            "proxyplan_agent_canary_missing",
            "Periodic checks that found the agent's rules removed by someone else",
            m.canary_missing.clone(),
        );
        registry.register(
            "proxyplan_agent_conntrack_entries_deleted",
            "Stale UDP conntrack entries deleted",
            m.conntrack_deleted.clone(),
        );
        registry.register(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            "ReconcileConntrackFlowsLatency latency in seconds",
            m.conntrack_reconciler_duration.clone(),
        );
        registry.register(
            "kubeproxy_conntrack_reconciler_deleted_entries",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            m.conntrack_reconciler_deleted.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures",
            "Cumulative proxy iptables restore failures",
            m.restore_failures.clone(),
        );
        registry.register(
            "proxyplan_agent_status_writes",
            "Status writes to the node's plan, by result",
            m.status_writes.clone(),
        );
        registry.register(
            "kubeproxy_proxy_healthz",
            "Cumulative proxy healthz HTTP status",
            m.healthz_requests.clone(),
        );
        registry.register(
            "kubeproxy_proxy_livez",
            "Cumulative proxy livez HTTP status",
            m.livez_requests.clone(),
        );
        registry.register(
            "proxyplan_agent_service_ports",
            "Service ports programmed",
            m.service_ports.clone(),
        );
        registry.register(
            "proxyplan_agent_endpoints",
            "Endpoints programmed",
            m.endpoints.clone(),
        );
        registry.register(
            "proxyplan_agent_merge_duration_seconds",
            "Time to validate and merge the node plan with the Service plans",
            m.merge_duration.clone(),
        );
        Self {
            registry,
            ..metrics
        }
    }

    /// Counts a status write.
    pub fn status_write(&self, result: &str) {
        self.status_writes
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    /// Records a dataplane sync of `families` that took `elapsed`.
    pub fn observe_sync(&self, families: &[&str], elapsed: Duration, full: bool) {
        let seconds = elapsed.as_secs_f64();
        let kind = if full {
            &self.full_sync_duration
        } else {
            &self.partial_sync_duration
        };
        for family in families {
            let labels = family_labels(family);
            self.sync_duration.get_or_create(&labels).observe(seconds);
            kind.get_or_create(&labels).observe(seconds);
        }
    }

    /// Records a run of the stale-UDP conntrack step: its duration in each of `families`,
    /// and the entries it deleted (`[IPv4, IPv6]`).
    pub fn observe_conntrack(&self, families: &[&str], elapsed: Duration, deleted: [usize; 2]) {
        for family in families {
            self.conntrack_reconciler_duration
                .get_or_create(&family_labels(family))
                .observe(elapsed.as_secs_f64());
        }
        for (family, n) in ["IPv4", "IPv6"].into_iter().zip(deleted) {
            if n > 0 {
                self.conntrack_reconciler_deleted
                    .get_or_create(&family_labels(family))
                    .inc_by(u64::try_from(n).unwrap_or(u64::MAX));
            }
        }
    }

    /// Counts a failed `iptables-restore` of `family` (`IPv4`, `IPv6`).
    pub fn restore_failure(&self, family: &str) {
        self.restore_failures
            .get_or_create(&family_labels(family))
            .inc();
    }

    /// Sets a timestamp gauge of `families` to `at`.
    pub fn stamp(gauges: &FamilyTimestamps, families: &[&str], at: SystemTime) {
        for family in families {
            gauges
                .get_or_create(&family_labels(family))
                .set(unix_seconds(at));
        }
    }

    /// Records one change's network programming latency, in each of `families`.
    pub fn observe_programming(&self, families: &[&str], latency: Duration) {
        let seconds = latency.as_secs_f64();
        self.network_programming_fine.observe(seconds);
        for family in families {
            self.network_programming
                .get_or_create(&family_labels(family))
                .observe(seconds);
        }
    }

    /// The text exposition.
    #[must_use]
    pub fn encode(&self) -> String {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.tokio_tasks
                .set(i64::try_from(runtime.metrics().num_alive_tasks()).unwrap_or(i64::MAX));
        }
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            text.clear();
        }
        text
    }
}

fn family_labels(family: &str) -> FamilyLabels {
    FamilyLabels {
        ip_family: family.to_owned(),
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// kube-proxy's network programming buckets, exactly: a leading 0, then 0.25 and 0.5 s,
/// every second to 59 s, every 5 s to 115 s, every 30 s to 300 s.
fn kube_proxy_programming_buckets() -> Vec<f64> {
    let mut buckets = vec![0.0, 0.25, 0.5];
    buckets.extend((1..60).map(f64::from));
    buckets.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    buckets.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    buckets
}

/// Network programming buckets from a millisecond (this agent's budget for one change is
/// 20 ms) to kube-proxy's largest.
fn fine_programming_buckets() -> Vec<f64> {
    let mut buckets = vec![0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5];
    buckets.extend((1..10).map(f64::from));
    buckets.extend([15.0, 30.0, 60.0, 120.0, 300.0]);
    buckets
}

/// Seconds since the Unix epoch.
#[must_use]
pub fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Whether the proxy keeps up, with kube-proxy's `/healthz` semantics: unhealthy when a
/// change has waited longer than the timeout (2 × sync period) without a successful
/// sync. A plan that is refused or waits for shards is not a pending change: the kernel
/// runs the last good plan and the plan's status says why.
///
/// `/healthz` also fails while the node is not eligible for load-balancer traffic (being
/// deleted, or tainted for removal by the cluster autoscaler; the controller says so in
/// the node plan); `/livez` does not.
#[derive(Debug)]
pub struct Health {
    timeout: Duration,
    state: Mutex<HealthState>,
}

#[derive(Debug, Default)]
struct HealthState {
    last_updated: Option<SystemTime>,
    pending_since: Option<Instant>,
    ineligible: Option<String>,
    families: Vec<&'static str>,
}

impl Health {
    /// Health with this timeout.
    #[must_use]
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            state: Mutex::new(HealthState::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A change waits for a sync.
    pub fn queued(&self) {
        self.state().pending_since.get_or_insert_with(Instant::now);
    }

    /// A sync succeeded: nothing waits.
    pub fn updated(&self) {
        let mut state = self.state();
        state.pending_since = None;
        state.last_updated = Some(SystemTime::now());
    }

    /// Nothing needs programming (the plan is refused, waits for shards or is unchanged).
    pub fn settled(&self) {
        self.state().pending_since = None;
    }

    /// A sync failed: the kernel still needs one.
    pub fn failed(&self) {
        self.queued();
    }

    /// Why the node should get no new load-balancer traffic, if it should not.
    pub fn set_ineligible(&self, reason: Option<String>) {
        self.state().ineligible = reason;
    }

    /// The IP families the node proxies (`IPv4`, `IPv6`), for the per-family status.
    pub fn set_families(&self, families: Vec<&'static str>) {
        self.state().families = families;
    }

    /// Whether syncs keep up (`/livez`, and the health-check node ports' view).
    #[must_use]
    pub fn is_healthy(&self) -> bool {
        self.state()
            .pending_since
            .is_none_or(|since| since.elapsed() <= self.timeout)
    }

    /// Why the node is not eligible for load-balancer traffic, if it is not.
    #[must_use]
    pub fn ineligible(&self) -> Option<String> {
        self.state().ineligible.clone()
    }

    /// When the last sync succeeded.
    #[must_use]
    pub fn last_updated(&self) -> Option<SystemTime> {
        self.state().last_updated
    }

    /// kube-proxy's response: 200 or 503 and its JSON body (`/healthz` when `healthz`,
    /// else `/livez`, which leaves out node eligibility).
    #[must_use]
    pub fn report(&self, healthz: bool) -> (bool, serde_json::Value) {
        let healthy = self.is_healthy();
        let (last_updated, ineligible, families) = {
            let state = self.state();
            (
                state.last_updated,
                state.ineligible.clone(),
                state.families.clone(),
            )
        };
        let eligible = ineligible.is_none();
        let ok = healthy && (!healthz || eligible);
        let now = SystemTime::now();
        // kube-proxy reports "now" as the last update of a healthy proxy.
        let shown = if ok { Some(now) } else { last_updated };
        let families = if families.is_empty() {
            vec!["IPv4"]
        } else {
            families
        };
        let status: serde_json::Map<String, serde_json::Value> = families
            .into_iter()
            .map(|family| {
                (
                    family.to_owned(),
                    serde_json::json!({"lastUpdated": go_time(shown), "healthy": healthy}),
                )
            })
            .collect();
        let mut body = serde_json::Map::new();
        body.insert("lastUpdated".to_owned(), go_time(shown).into());
        body.insert("currentTime".to_owned(), go_time(Some(now)).into());
        if healthz {
            body.insert("nodeEligible".to_owned(), eligible.into());
        }
        body.insert("healthy".to_owned(), healthy.into());
        body.insert("status".to_owned(), status.into());
        (ok, serde_json::Value::Object(body))
    }
}

/// A time as Go's JSON encoding writes it (RFC 3339 with nanoseconds; the zero time when
/// there is none).
fn go_time(t: Option<SystemTime>) -> String {
    t.and_then(|t| Timestamp::try_from(t).ok())
        .map_or_else(|| "0001-01-01T00:00:00Z".to_owned(), |t| t.to_string())
}

/// How often a listener whose port is taken tries again.
pub const REBIND_INTERVAL: Duration = Duration::from_secs(5);

/// A listener of the agent's own endpoints: bound, or waiting for its port.
pub enum Listener {
    /// Listening (non-blocking, registered with a runtime only where it is served).
    Bound(std::net::TcpListener, SocketAddr),
    /// The port is in use by someone else; bound once it is free.
    Waiting(SocketAddr, String),
}

impl Listener {
    /// Binds `address` for `what` (`/healthz`, `/metrics`). A port in use is no error:
    /// the listener waits for it.
    ///
    /// # Errors
    /// Any other bind error.
    pub fn bind(address: SocketAddr, what: &str) -> Result<Self, RunError> {
        let error = |source| RunError::Http {
            what: format!("{what} on {address}"),
            source,
        };
        match std::net::TcpListener::bind(address) {
            Ok(listener) => {
                listener.set_nonblocking(true).map_err(error)?;
                let local = listener.local_addr().map_err(error)?;
                Ok(Self::Bound(listener, local))
            }
            Err(err) if err.kind() == std::io::ErrorKind::AddrInUse => {
                tracing::warn!(
                    %address,
                    what,
                    "port in use (kube-proxy, while both run during a migration?); starting \
                     without it and binding it once it is free"
                );
                Ok(Self::Waiting(address, what.to_owned()))
            }
            Err(err) => Err(error(err)),
        }
    }

    /// The address it listens (or will listen) on.
    #[must_use]
    pub fn address(&self) -> SocketAddr {
        match self {
            Self::Bound(_, address) | Self::Waiting(address, _) => *address,
        }
    }

    /// The bound listener, waiting for the port first if need be.
    async fn ready(self) -> Result<(TcpListener, SocketAddr), RunError> {
        match self {
            // Registered with the runtime polling this: the HTTP thread's.
            Self::Bound(listener, address) => TcpListener::from_std(listener)
                .map(|listener| (listener, address))
                .map_err(|source| RunError::Http {
                    what: format!("listening on {address}"),
                    source,
                }),
            Self::Waiting(address, what) => loop {
                tokio::time::sleep(REBIND_INTERVAL).await;
                match TcpListener::bind(address).await {
                    Ok(listener) => {
                        tracing::info!(%address, what, "port free now; serving");
                        return Ok((listener, address));
                    }
                    Err(err) if err.kind() == std::io::ErrorKind::AddrInUse => {}
                    Err(source) => {
                        return Err(RunError::Http {
                            what: format!("{what} on {address}"),
                            source,
                        });
                    }
                }
            },
        }
    }
}

/// The thread that serves HTTP: `/healthz`, `/metrics` and the health-check node ports,
/// on a single-threaded runtime of its own. The sync loop (merges of thousands of Service
/// plans, the watches) runs on the agent's main thread, so no answer waits for it; and
/// the few bytes HTTP allocates stay in this thread's small malloc arena, not beside the
/// watch buffers.
#[derive(Debug)]
pub struct HttpThread {
    handle: tokio::runtime::Handle,
    /// Dropped: the thread's runtime stops.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl HttpThread {
    /// Starts the thread.
    ///
    /// # Errors
    /// When the runtime or the thread cannot be started.
    pub fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("proxyplan-http".to_owned())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(Self {
            handle,
            _stop: stop,
        })
    }

    /// Where to spawn HTTP tasks.
    #[must_use]
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

/// Serves `/healthz` (and `/livez`) on `healthz`, `/metrics` on `metrics`, or everything
/// on `healthz` when `metrics` is `None`; a listener waiting for its port serves once it
/// has it.
///
/// # Errors
/// When a server stops.
pub async fn serve(
    healthz: Listener,
    metrics: Option<Listener>,
    registry: Arc<Metrics>,
    health: Arc<Health>,
) -> Result<(), RunError> {
    let metrics_routes = Router::new()
        .route("/metrics", get(metrics_handler))
        .with_state(registry.clone());
    let health_routes = Router::new()
        .route("/healthz", get(healthz_handler))
        .route("/livez", get(livez_handler))
        .with_state((health, registry.clone()));
    let error = |what: &str, address| {
        let what = format!("{what} on {address}");
        move |source| RunError::Http { what, source }
    };
    match metrics {
        None => {
            let (listener, address) = healthz.ready().await?;
            axum::serve(listener, health_routes.merge(metrics_routes))
                .await
                .map_err(error("/healthz and /metrics", address))
        }
        Some(metrics) => tokio::try_join!(
            async {
                let (listener, address) = healthz.ready().await?;
                axum::serve(listener, health_routes)
                    .await
                    .map_err(error("/healthz", address))
            },
            async {
                let (listener, address) = metrics.ready().await?;
                axum::serve(listener, metrics_routes)
                    .await
                    .map_err(error("/metrics", address))
            },
        )
        .map(|_| ()),
    }
}

async fn metrics_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.encode(),
    )
}

type HealthRoute = State<(Arc<Health>, Arc<Metrics>)>;

async fn healthz_handler(State((health, metrics)): HealthRoute) -> impl IntoResponse {
    proxy_health(&health, &metrics.healthz_requests, true)
}

async fn livez_handler(State((health, metrics)): HealthRoute) -> impl IntoResponse {
    proxy_health(&health, &metrics.livez_requests, false)
}

/// `/healthz` or `/livez`, counted by response code as kube-proxy counts them.
fn proxy_health(
    health: &Health,
    requests: &Family<CodeLabels, Counter>,
    healthz: bool,
) -> impl IntoResponse + use<> {
    let (ok, body) = health.report(healthz);
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    requests
        .get_or_create(&CodeLabels {
            code: status.as_u16().to_string(),
        })
        .inc();
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body.to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn healthz_fails_once_a_change_waits_longer_than_the_timeout() {
        let health = Health::new(Duration::from_secs(60));
        assert!(health.is_healthy(), "nothing pending");
        health.queued();
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(health.is_healthy(), "pending, within the timeout");
        health.failed();
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!health.is_healthy(), "pending for 61 s");
        health.updated();
        assert!(health.is_healthy());
        assert!(health.last_updated().is_some());
        // An idle agent stays healthy however old its last sync.
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(health.is_healthy());
        // A refused plan settles what was queued.
        health.queued();
        health.settled();
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(health.is_healthy());
    }

    #[tokio::test(start_paused = true)]
    async fn healthz_fails_for_a_node_leaving_the_cluster_and_livez_does_not() {
        let health = Health::new(Duration::from_secs(60));
        health.set_families(vec!["IPv4", "IPv6"]);
        health.updated();
        let (ok, body) = health.report(true);
        assert!(ok);
        assert_eq!(body["nodeEligible"], true);
        assert_eq!(body["healthy"], true);
        assert_eq!(body["status"]["IPv6"]["healthy"], true);
        assert_eq!(
            body["lastUpdated"], body["currentTime"],
            "now, when healthy"
        );

        health.set_ineligible(Some("the Node is being deleted".to_owned()));
        let (ok, body) = health.report(true);
        assert!(!ok, "/healthz fails: load balancers drain the node");
        assert_eq!(body["nodeEligible"], false);
        assert_eq!(body["healthy"], true, "syncs still keep up");
        let (ok, body) = health.report(false);
        assert!(ok, "/livez ignores eligibility: the agent is not restarted");
        assert!(body.get("nodeEligible").is_none());

        // A stuck sync fails both.
        health.set_ineligible(None);
        health.queued();
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(!health.report(true).0);
        let (ok, body) = health.report(false);
        assert!(!ok);
        assert_eq!(body["healthy"], false);
        assert_ne!(body["lastUpdated"], body["currentTime"]);
    }

    #[test]
    fn metrics_carry_kube_proxy_names() {
        let metrics = Metrics::new();
        metrics.observe_sync(&["IPv4", "IPv6"], Duration::from_millis(10), true);
        metrics.observe_programming(&["IPv4"], Duration::from_millis(30));
        metrics
            .sync_errors
            .get_or_create(&ReasonLabels {
                reason: "tool_failed".to_owned(),
            })
            .inc();
        let text = metrics.encode();
        for name in [
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.001\",ip_family=\"IPv6\"} 0",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1",
            // kube-proxy's buckets, with their leading 0.
            "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.0\",ip_family=\"IPv4\"} 0",
            "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\",ip_family=\"IPv4\"} 1",
            "proxyplan_agent_network_programming_duration_seconds_bucket{le=\"0.05\"} 1",
            "proxyplan_agent_sync_errors_total{reason=\"tool_failed\"} 1",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
    }
}
