//! `/metrics`, `/healthz` and `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels naming a kind of object.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// Lower-case kind.
    pub kind: String,
}

/// Labels of a write.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// Lower-case kind.
    pub kind: String,
    /// `apply` or `delete`.
    pub op: String,
}

/// The controller's metrics.
pub struct Metrics {
    registry: Registry,
    /// Watch events received, by kind.
    pub events: Family<KindLabels, Counter>,
    /// Objects refused as invalid, by kind.
    pub invalid_objects: Family<KindLabels, Counter>,
    /// Objects written, by kind and operation.
    pub writes: Family<WriteLabels, Counter>,
    /// Failed writes, by kind and operation.
    pub write_errors: Family<WriteLabels, Counter>,
    /// Time to compute the changed objects of one sync.
    pub compute_seconds: Histogram,
    /// Time to write one sync's objects (every request answered).
    pub write_seconds: Histogram,
    /// Size of the largest object written, in bytes.
    pub largest_object_bytes: Gauge,
    /// 1 while this replica holds the Lease.
    pub is_leader: Gauge,
    /// Tasks alive in the async runtime, read when scraped (a leak shows here first).
    pub tokio_tasks: Gauge,
    /// From a Service plan write to every reporting node's mark past it.
    pub rollout_seconds: Histogram,
    /// Service plans whose current revision some reporting node lacks.
    pub rollouts_incomplete: Gauge,
    /// Nodes whose agent reports a rollout mark.
    pub nodes_reporting: Gauge,
    /// Rollout statuses written to Service plans.
    pub rollout_status_writes: Counter,
}

impl Metrics {
    /// Registers every metric under `proxyplan_controller_`.
    #[must_use]
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("proxyplan_controller");
        let metrics = Self {
            events: Family::default(),
            invalid_objects: Family::default(),
            writes: Family::default(),
            write_errors: Family::default(),
            compute_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            write_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            largest_object_bytes: Gauge::default(),
            is_leader: Gauge::default(),
            tokio_tasks: Gauge::default(),
            rollout_seconds: Histogram::new(exponential_buckets(0.005, 2.0, 16)),
            rollouts_incomplete: Gauge::default(),
            nodes_reporting: Gauge::default(),
            rollout_status_writes: Counter::default(),
            registry: Registry::default(),
        };
        registry.register("events", "Watch events received", metrics.events.clone());
        registry.register(
            "invalid_objects",
            "Objects refused as invalid",
            metrics.invalid_objects.clone(),
        );
        registry.register(
            "objects_written",
            "Node plans and Service plans written",
            metrics.writes.clone(),
        );
        registry.register(
            "write_errors",
            "Failed writes of node plans and Service plans",
            metrics.write_errors.clone(),
        );
        registry.register(
            "compute_duration_seconds",
            "Time to compute the changed plans of one sync",
            metrics.compute_seconds.clone(),
        );
        registry.register(
            "write_duration_seconds",
            "Time to write the objects of one sync",
            metrics.write_seconds.clone(),
        );
        registry.register(
            "largest_object_bytes",
            "Serialised size of the largest plan written",
            metrics.largest_object_bytes.clone(),
        );
        registry.register(
            "is_leader",
            "1 while this replica holds the leader Lease",
            metrics.is_leader.clone(),
        );
        registry.register(
            "tokio_tasks",
            "Tasks alive in the controller's async runtime, read when scraped",
            metrics.tokio_tasks.clone(),
        );
        registry.register(
            "rollout_duration_seconds",
            "From a Service plan write to every reporting node's agent reporting it \
             programmed (its report interval included)",
            metrics.rollout_seconds.clone(),
        );
        registry.register(
            "rollouts_incomplete",
            "Service plans whose current revision some reporting node has not programmed",
            metrics.rollouts_incomplete.clone(),
        );
        registry.register(
            "nodes_reporting",
            "Nodes whose agent reports what it programmed",
            metrics.nodes_reporting.clone(),
        );
        registry.register(
            "rollout_status_writes",
            "Rollout statuses written to Service plans",
            metrics.rollout_status_writes.clone(),
        );
        Self {
            registry,
            ..metrics
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

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Liveness and readiness.
#[derive(Default)]
pub struct Health {
    ready: AtomicBool,
    last_tick: AtomicU64,
}

/// The loop must tick at least this often to be alive.
pub const LIVENESS_WINDOW: Duration = Duration::from_secs(60);

impl Health {
    /// Marks the initial lists done.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Records that the main loop is turning.
    pub fn tick(&self) {
        self.last_tick.store(unix_now(), Ordering::Relaxed);
    }

    fn alive(&self) -> bool {
        unix_now().saturating_sub(self.last_tick.load(Ordering::Relaxed))
            <= LIVENESS_WINDOW.as_secs()
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Serves `/metrics` on one address and `/healthz` + `/readyz` on another (they may be
/// equal, then all three share one listener).
///
/// # Errors
/// When an address cannot be bound.
pub async fn serve(
    metrics_addr: SocketAddr,
    health_addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> std::io::Result<()> {
    let metrics_routes = Router::new()
        .route("/metrics", get(metrics_handler))
        .with_state(metrics);
    let health_routes = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(health);
    if metrics_addr == health_addr {
        let listener = tokio::net::TcpListener::bind(metrics_addr).await?;
        return axum::serve(listener, metrics_routes.merge(health_routes)).await;
    }
    let metrics_listener = tokio::net::TcpListener::bind(metrics_addr).await?;
    let health_listener = tokio::net::TcpListener::bind(health_addr).await?;
    tokio::try_join!(
        async { axum::serve(metrics_listener, metrics_routes).await },
        async { axum::serve(health_listener, health_routes).await },
    )
    .map(|_| ())
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

async fn healthz(State(health): State<Arc<Health>>) -> impl IntoResponse {
    if health.alive() {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "main loop stalled\n")
    }
}

async fn readyz(State(health): State<Arc<Health>>) -> impl IntoResponse {
    if health.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "initial lists not complete\n",
        )
    }
}
