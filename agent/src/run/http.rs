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

/// Labels with a result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok`, `error`, `not_found`.
    pub result: String,
}

/// The agent's metrics.
pub struct Metrics {
    registry: Registry,
    /// `kubeproxy_sync_proxy_rules_duration_seconds`: duration of each dataplane sync.
    pub sync_duration: Histogram,
    /// `kubeproxy_network_programming_duration_seconds`: from a plan or shard change
    /// (its `managedFields` time) to the kernel updated.
    pub network_programming: Histogram,
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds`: when the last sync succeeded.
    pub last_sync_timestamp: Gauge<f64, AtomicU64>,
    /// `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds`: when the last change
    /// was queued.
    pub last_queued_timestamp: Gauge<f64, AtomicU64>,
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
    /// `proxyplan_agent_status_writes_total{result}`.
    pub status_writes: Family<ResultLabels, Counter>,
    /// `proxyplan_agent_service_ports`: service ports programmed.
    pub service_ports: Gauge,
    /// `proxyplan_agent_endpoints`: endpoints programmed.
    pub endpoints: Gauge,
    /// `proxyplan_agent_merge_duration_seconds`: validating and merging the plan with the
    /// Service plans, before the dataplane runs.
    pub merge_duration: Histogram,
}

impl Metrics {
    /// Registers every metric.
    #[must_use]
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let metrics = Self {
            // kube-proxy's buckets for both histograms.
            sync_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            network_programming: Histogram::new(network_programming_buckets()),
            last_sync_timestamp: Gauge::default(),
            last_queued_timestamp: Gauge::default(),
            rules: Family::default(),
            sync_errors: Family::default(),
            invalid_plans: Family::default(),
            canary_missing: Counter::default(),
            conntrack_deleted: Counter::default(),
            status_writes: Family::default(),
            service_ports: Gauge::default(),
            endpoints: Gauge::default(),
            merge_duration: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            registry: Registry::default(),
        };
        registry.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            metrics.sync_duration.clone(),
        );
        registry.register(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            metrics.network_programming.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            metrics.last_sync_timestamp.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            metrics.last_queued_timestamp.clone(),
        );
        registry.register(
            "proxyplan_agent_rules",
            "Rules (or kernel objects) the kernel holds for the plan",
            metrics.rules.clone(),
        );
        registry.register(
            "proxyplan_agent_sync_errors",
            "Failed dataplane syncs, by error",
            metrics.sync_errors.clone(),
        );
        registry.register(
            "proxyplan_agent_invalid_plans",
            "Plan revisions refused as invalid (the last good plan stays programmed)",
            metrics.invalid_plans.clone(),
        );
        registry.register(
            "proxyplan_agent_canary_missing",
            "Periodic checks that found the agent's rules removed by someone else",
            metrics.canary_missing.clone(),
        );
        registry.register(
            "proxyplan_agent_conntrack_entries_deleted",
            "Stale UDP conntrack entries deleted",
            metrics.conntrack_deleted.clone(),
        );
        registry.register(
            "proxyplan_agent_status_writes",
            "Status writes to the node's plan, by result",
            metrics.status_writes.clone(),
        );
        registry.register(
            "proxyplan_agent_service_ports",
            "Service ports programmed",
            metrics.service_ports.clone(),
        );
        registry.register(
            "proxyplan_agent_endpoints",
            "Endpoints programmed",
            metrics.endpoints.clone(),
        );
        registry.register(
            "proxyplan_agent_merge_duration_seconds",
            "Time to validate and merge the node plan with the Service plans",
            metrics.merge_duration.clone(),
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

    /// The text exposition.
    #[must_use]
    pub fn encode(&self) -> String {
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            text.clear();
        }
        text
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// kube-proxy's network programming buckets, with finer ones below 250 ms (this agent's
/// budget for one change is 20 ms).
fn network_programming_buckets() -> Vec<f64> {
    let mut buckets = vec![0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5];
    buckets.extend((1..60).map(f64::from));
    buckets.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    buckets.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
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
#[derive(Debug)]
pub struct Health {
    timeout: Duration,
    state: Mutex<HealthState>,
}

#[derive(Debug, Default)]
struct HealthState {
    last_updated: Option<SystemTime>,
    pending_since: Option<Instant>,
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

    /// Whether `/healthz` answers 200.
    #[must_use]
    pub fn is_healthy(&self) -> bool {
        self.state()
            .pending_since
            .is_none_or(|since| since.elapsed() <= self.timeout)
    }

    /// When the last sync succeeded.
    #[must_use]
    pub fn last_updated(&self) -> Option<SystemTime> {
        self.state().last_updated
    }
}

/// How often a listener whose port is taken tries again.
pub const REBIND_INTERVAL: Duration = Duration::from_secs(5);

/// A listener of the agent's own endpoints: bound, or waiting for its port.
pub enum Listener {
    /// Listening.
    Bound(TcpListener, SocketAddr),
    /// The port is in use by someone else; bound once it is free.
    Waiting(SocketAddr, String),
}

impl Listener {
    /// Binds `address` for `what` (`/healthz`, `/metrics`). A port in use is no error:
    /// the listener waits for it.
    ///
    /// # Errors
    /// Any other bind error.
    pub async fn bind(address: SocketAddr, what: &str) -> Result<Self, RunError> {
        let error = |source| RunError::Http {
            what: format!("{what} on {address}"),
            source,
        };
        match TcpListener::bind(address).await {
            Ok(listener) => {
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
            Self::Bound(listener, address) => Ok((listener, address)),
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
        .with_state(registry);
    let health_routes = Router::new()
        .route("/healthz", get(healthz_handler))
        .route("/livez", get(healthz_handler))
        .with_state(health);
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

async fn healthz_handler(State(health): State<Arc<Health>>) -> impl IntoResponse {
    let status = if health.is_healthy() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let time =
        |t: SystemTime| Timestamp::try_from(t).map_or_else(|_| String::new(), |t| t.to_string());
    let body = serde_json::json!({
        "lastUpdated": health.last_updated().map(time).unwrap_or_default(),
        "currentTime": time(SystemTime::now()),
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
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

    #[test]
    fn metrics_carry_kube_proxy_names() {
        let metrics = Metrics::new();
        metrics.sync_duration.observe(0.01);
        metrics
            .sync_errors
            .get_or_create(&ReasonLabels {
                reason: "tool_failed".to_owned(),
            })
            .inc();
        let text = metrics.encode();
        for name in [
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
            "kubeproxy_network_programming_duration_seconds_count",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "proxyplan_agent_sync_errors_total{reason=\"tool_failed\"} 1",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
    }
}
