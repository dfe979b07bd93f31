//! `proxyplan-controller run`: watches feed the planner; the leader writes what changed.
//!
//! One task owns the [`Planner`] and the [`PlanWriter`]; watches, the leader elector and
//! the HTTP servers talk to it through channels. Nothing is written before every watch
//! has listed once, and a replica that does not hold the Lease keeps its index warm but
//! writes nothing.

pub mod http;
pub mod lease;
pub mod writer;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use proxyplan_crds::{MANAGED_BY, MANAGED_BY_LABEL, NodeProxyPlan, ProxyPlanShard};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::config::PlannerConfig;
use crate::model::{HEADLESS_LABEL, ObjectError, SERVICE_PROXY_NAME_LABEL};
use crate::planner::{ObjectId, Planner};
use http::{Health, KindLabels, Metrics, WriteLabels};
use lease::{Leadership, LeaseElector};
use writer::{Kind, PlanWriter, target_of};

/// How long a Lease lasts without renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the Lease is renewed or competed for.
pub const LEASE_RETRY: Duration = Duration::from_secs(2);
/// A leader that could not renew for this long steps down.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Delay before retrying failed writes.
const RETRY_DELAY: Duration = Duration::from_secs(5);

/// Everything `run` needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Kubeconfig file, else in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// Planner policy.
    pub config: PlannerConfig,
    /// Minimum time between two syncs.
    pub min_sync_interval: Duration,
    /// `/metrics` address.
    pub metrics_bind_address: SocketAddr,
    /// `/healthz`, `/readyz` address.
    pub health_bind_address: SocketAddr,
    /// Lease namespace.
    pub lease_namespace: String,
    /// Lease name.
    pub lease_name: String,
    /// This replica's identity.
    pub identity: String,
}

/// Why the controller stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No usable client configuration.
    #[error("kubernetes client configuration: {0}")]
    Config(String),
    /// The HTTP servers could not start.
    #[error("serving metrics/health: {0}")]
    Http(#[from] std::io::Error),
}

/// Runs the controller until SIGTERM or Ctrl-C.
///
/// # Errors
/// When no client can be configured or the HTTP servers cannot bind.
pub async fn run(settings: Settings) -> Result<(), RunError> {
    let client = proxyplan_crds::runtime::client(settings.kubeconfig.as_deref())
        .await
        .map_err(|e| RunError::Config(e.to_string()))?;
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let http = tokio::spawn(http::serve(
        settings.metrics_bind_address,
        settings.health_bind_address,
        metrics.clone(),
        health.clone(),
    ));
    let elector = LeaseElector::new(
        client.clone(),
        &settings.lease_namespace,
        &settings.lease_name,
        &settings.identity,
        LEASE_DURATION,
    );
    let (leader_tx, leader_rx) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    let election = tokio::spawn(keep_election(elector.clone(), leader_tx, stop_rx));
    info!(identity = %settings.identity, lease = %settings.lease_name, "starting");
    let mut sync = SyncLoop::new(client.clone(), &settings, metrics, health);
    tokio::select! {
        () = sync.run(inputs(&client), leader_rx) => {}
        () = proxyplan_crds::runtime::shutdown_signal() => info!("shutting down"),
        result = http => {
            if let Ok(Err(err)) = result {
                return Err(RunError::Http(err));
            }
        }
    }
    let _ = stop_tx.send(true);
    let _ = election.await;
    if let Err(err) = elector.release().await {
        warn!(%err, "could not release the leader Lease; another replica takes over when it expires");
    }
    Ok(())
}

/// Runs election rounds until stopped, publishing whether we lead.
pub async fn keep_election(
    elector: LeaseElector,
    leader: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut last_renewal: Option<Instant> = None;
    loop {
        let now = k8s_openapi::jiff::Timestamp::now();
        let leading = match elector.try_acquire_or_renew(now).await {
            Ok(Leadership::Leader) => {
                last_renewal = Some(Instant::now());
                true
            }
            Ok(Leadership::Follower) => {
                last_renewal = None;
                false
            }
            Err(err) => {
                warn!(%err, "leader election round failed");
                last_renewal.is_some_and(|t| t.elapsed() < RENEW_DEADLINE)
            }
        };
        leader.send_if_modified(|current| {
            let changed = *current != leading;
            *current = leading;
            changed
        });
        tokio::select! {
            () = tokio::time::sleep(LEASE_RETRY) => {}
            _ = stop.changed() => return,
        }
    }
}

/// One watch event, from any watched kind.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "events are consumed one at a time"
)]
pub enum Input {
    /// Services.
    Service(Event<Service>),
    /// EndpointSlices.
    Slice(Event<EndpointSlice>),
    /// Nodes.
    Node(Event<Node>),
    /// Our plans.
    Plan(Event<NodeProxyPlan>),
    /// Our shards.
    Shard(Event<ProxyPlanShard>),
    /// A watch failed (it retries with backoff).
    WatchError(&'static str, String),
}

type InputStream = Pin<Box<dyn Stream<Item = Input> + Send>>;

fn watch_stream<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: &'static str,
    wrap: fn(Event<K>) -> Input,
) -> InputStream
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    Box::pin(
        watcher::watcher(api, config)
            .default_backoff()
            .map(move |r| match r {
                Ok(event) => wrap(event),
                Err(err) => Input::WatchError(kind, err.to_string()),
            }),
    )
}

/// Every watch the controller needs, merged into one stream.
#[must_use]
pub fn inputs(client: &Client) -> InputStream {
    let proxied = format!("!{SERVICE_PROXY_NAME_LABEL},!{HEADLESS_LABEL}");
    let ours = format!("{MANAGED_BY_LABEL}={MANAGED_BY}");
    Box::pin(futures::stream::select_all([
        watch_stream(
            Api::all(client.clone()),
            watcher::Config::default().labels(&proxied),
            "Service",
            Input::Service,
        ),
        watch_stream(
            Api::all(client.clone()),
            watcher::Config::default().labels(&proxied),
            "EndpointSlice",
            Input::Slice,
        ),
        watch_stream(
            Api::all(client.clone()),
            watcher::Config::default(),
            "Node",
            Input::Node,
        ),
        watch_stream(
            Api::all(client.clone()),
            watcher::Config::default().labels(&ours),
            "NodeProxyPlan",
            Input::Plan,
        ),
        watch_stream(
            Api::all(client.clone()),
            watcher::Config::default().labels(&ours),
            "ProxyPlanShard",
            Input::Shard,
        ),
    ]))
}

/// Buffers of a watch re-list in progress.
#[derive(Default)]
struct Relists {
    services: Option<Vec<Service>>,
    slices: Option<Vec<EndpointSlice>>,
    nodes: Option<Vec<Node>>,
    plans: Option<Vec<NodeProxyPlan>>,
    shards: Option<Vec<ProxyPlanShard>>,
    listed: BTreeSet<&'static str>,
}

const ALL_KINDS: [&str; 5] = [
    "Service",
    "EndpointSlice",
    "Node",
    "NodeProxyPlan",
    "ProxyPlanShard",
];

/// What a relist step produced.
enum Relist<K> {
    /// Handle this event as usual.
    Event(Event<K>),
    /// The re-list finished: replace everything with these.
    Done(Vec<K>),
    /// Buffered.
    Pending,
}

fn relist<K>(buffer: &mut Option<Vec<K>>, event: Event<K>) -> Relist<K> {
    match event {
        Event::Init => {
            *buffer = Some(Vec::new());
            Relist::Pending
        }
        Event::InitApply(obj) => {
            buffer.get_or_insert_with(Vec::new).push(obj);
            Relist::Pending
        }
        Event::InitDone => Relist::Done(buffer.take().unwrap_or_default()),
        other => Relist::Event(other),
    }
}

/// The task that owns the planner and the writer.
pub struct SyncLoop {
    planner: Planner,
    writer: PlanWriter,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    min_interval: Duration,
    relists: Relists,
    leader: bool,
    full_reconcile: bool,
    repairs: BTreeSet<(Kind, String)>,
    pending: bool,
    last_sync: Option<Instant>,
    retry_at: Option<Instant>,
}

impl SyncLoop {
    /// A loop writing through `client`.
    #[must_use]
    pub fn new(
        client: Client,
        settings: &Settings,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> Self {
        Self {
            planner: Planner::new(settings.config.clone()),
            writer: PlanWriter::new(client),
            metrics,
            health,
            min_interval: settings.min_sync_interval,
            relists: Relists::default(),
            leader: false,
            full_reconcile: true,
            repairs: BTreeSet::new(),
            pending: false,
            last_sync: None,
            retry_at: None,
        }
    }

    /// Whether every watch has listed once.
    #[must_use]
    pub fn synced(&self) -> bool {
        self.relists.listed.len() == ALL_KINDS.len()
    }

    /// Runs until `inputs` ends.
    pub async fn run(&mut self, mut inputs: InputStream, mut leader: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(Duration::from_secs(10));
        loop {
            self.health.tick();
            let due = self.next_sync_at();
            tokio::select! {
                biased;
                changed = leader.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let leading = *leader.borrow_and_update();
                    self.set_leader(leading);
                }
                input = inputs.next() => match input {
                    Some(input) => self.handle(input),
                    None => return,
                },
                () = sleep_until(due), if due.is_some() => self.sync().await,
                _ = ticker.tick() => {}
            }
        }
    }

    /// When the next sync may run, if one is needed.
    fn next_sync_at(&self) -> Option<Instant> {
        if !self.synced() || !self.leader {
            return None;
        }
        let earliest = self
            .last_sync
            .map_or_else(Instant::now, |t| t + self.min_interval);
        if let Some(retry) = self.retry_at {
            return Some(retry.max(earliest));
        }
        (self.pending || self.full_reconcile || !self.repairs.is_empty()).then_some(earliest)
    }

    /// Records a leadership change. Gaining the Lease forces a full reconcile.
    pub fn set_leader(&mut self, leading: bool) {
        if leading != self.leader {
            info!(leading, "leadership changed");
        }
        self.leader = leading;
        self.metrics.is_leader.set(i64::from(leading));
        if leading {
            self.full_reconcile = true;
        }
    }

    /// Feeds one watch event to the planner (or to the writer's view of our objects).
    pub fn handle(&mut self, input: Input) {
        let kind = match &input {
            Input::Service(_) => "service",
            Input::Slice(_) => "endpointslice",
            Input::Node(_) => "node",
            Input::Plan(_) => "nodeproxyplan",
            Input::Shard(_) => "proxyplanshard",
            Input::WatchError(kind, err) => {
                let hint = if kind.starts_with("NodeProxyPlan")
                    || kind.starts_with("ProxyPlanShard")
                {
                    " (are the proxyplan CRDs installed? kubectl apply -f charts/proxyplan/crds)"
                } else {
                    ""
                };
                warn!(kind, %err, "watch failed; retrying with backoff{hint}");
                return;
            }
        };
        self.metrics
            .events
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
        self.pending = true;
        match input {
            Input::Service(event) => match relist(&mut self.relists.services, event) {
                Relist::Event(Event::Apply(svc)) => {
                    let result = self.planner.apply_service(&svc);
                    self.report(result.err());
                }
                Relist::Event(Event::Delete(svc)) => self.planner.delete_service(&svc),
                Relist::Done(all) => {
                    let errors = self.planner.reset_services(&all);
                    self.listed("Service", errors);
                }
                _ => {}
            },
            Input::Slice(event) => match relist(&mut self.relists.slices, event) {
                Relist::Event(Event::Apply(slice)) => {
                    let result = self.planner.apply_slice(&slice);
                    self.report(result.err());
                }
                Relist::Event(Event::Delete(slice)) => self.planner.delete_slice(&slice),
                Relist::Done(all) => {
                    let errors = self.planner.reset_slices(&all);
                    self.listed("EndpointSlice", errors);
                }
                _ => {}
            },
            Input::Node(event) => match relist(&mut self.relists.nodes, event) {
                Relist::Event(Event::Apply(node)) => {
                    let result = self.planner.apply_node(&node);
                    self.report(result.err());
                }
                Relist::Event(Event::Delete(node)) => self.planner.delete_node(&node.name_any()),
                Relist::Done(all) => {
                    let errors = self.planner.reset_nodes(&all);
                    self.listed("Node", errors);
                }
                _ => {}
            },
            Input::Plan(event) => match relist(&mut self.relists.plans, event) {
                Relist::Event(Event::Apply(plan)) => {
                    self.observed(Kind::Plan, &plan.name_any(), Some(&plan.spec.revision));
                }
                Relist::Event(Event::Delete(plan)) => {
                    self.observed(Kind::Plan, &plan.name_any(), None)
                }
                Relist::Done(all) => {
                    self.writer.forget(Kind::Plan);
                    for plan in &all {
                        self.writer.observe(
                            Kind::Plan,
                            &plan.name_any(),
                            Some(&plan.spec.revision),
                        );
                    }
                    self.full_reconcile = true;
                    self.listed("NodeProxyPlan", Vec::new());
                }
                _ => {}
            },
            Input::Shard(event) => match relist(&mut self.relists.shards, event) {
                Relist::Event(Event::Apply(shard)) => {
                    self.observed(Kind::Shard, &shard.name_any(), Some(&shard.spec.revision));
                }
                Relist::Event(Event::Delete(shard)) => {
                    self.observed(Kind::Shard, &shard.name_any(), None)
                }
                Relist::Done(all) => {
                    self.writer.forget(Kind::Shard);
                    for shard in &all {
                        self.writer.observe(
                            Kind::Shard,
                            &shard.name_any(),
                            Some(&shard.spec.revision),
                        );
                    }
                    self.full_reconcile = true;
                    self.listed("ProxyPlanShard", Vec::new());
                }
                _ => {}
            },
            Input::WatchError(..) => {}
        }
    }

    fn observed(&mut self, kind: Kind, name: &str, revision: Option<&str>) {
        if self.writer.observe(kind, name, revision) {
            debug!(
                kind = kind.label(),
                name, "object differs from what was written; repairing"
            );
            self.repairs.insert((kind, name.to_owned()));
        }
    }

    fn listed(&mut self, kind: &'static str, errors: Vec<ObjectError>) {
        for err in errors {
            self.report(Some(err));
        }
        if self.relists.listed.insert(kind) {
            info!(kind, "initial list complete");
        }
        if self.synced() {
            self.health.set_ready(true);
        }
    }

    fn report(&self, error: Option<ObjectError>) {
        let Some(error) = error else { return };
        if error.is_invalid() {
            warn!(%error, "object refused; its last good version stays planned");
            let kind = match &error {
                ObjectError::Invalid { kind, .. } | ObjectError::Ignored { kind, .. } => {
                    kind.to_lowercase()
                }
            };
            self.metrics
                .invalid_objects
                .get_or_create(&KindLabels { kind })
                .inc();
        } else {
            debug!(%error, "object not proxied");
        }
    }

    /// Computes what changed and, as leader, writes it.
    pub async fn sync(&mut self) {
        if !self.leader || !self.synced() {
            // Only the leader writes, and only once every watch has listed: a partial
            // index would delete plans of nodes not listed yet. Nothing is taken from
            // the planner, so no change is lost.
            return;
        }
        let started = std::time::Instant::now();
        self.pending = false;
        self.retry_at = None;
        self.last_sync = Some(Instant::now());
        let repairs = std::mem::take(&mut self.repairs);
        for (kind, name) in &repairs {
            if let Some(id) = self.id_of(*kind, name) {
                self.planner.mark_dirty(id);
            }
        }
        let changes = self.planner.take_changes();
        let (apply, mut delete) = if self.full_reconcile {
            let all = self.planner.all_objects();
            let stale = self.writer.stale(&all);
            (all, stale)
        } else {
            (
                changes.apply,
                changes.delete.iter().map(target_of).collect(),
            )
        };
        for (kind, name) in repairs {
            if self.id_of(kind, &name).is_none() {
                delete.push((kind, name));
            }
        }
        self.metrics
            .compute_seconds
            .observe(started.elapsed().as_secs_f64());
        let was_full = std::mem::take(&mut self.full_reconcile);
        let report = self.writer.write(apply, delete).await;
        for (op, list) in [("apply", &report.applied), ("delete", &report.deleted)] {
            for (kind, _) in list {
                self.metrics
                    .writes
                    .get_or_create(&WriteLabels {
                        kind: kind.label().to_owned(),
                        op: op.to_owned(),
                    })
                    .inc();
            }
        }
        if report.largest_object > 0 {
            self.metrics
                .largest_object_bytes
                .set(i64::try_from(report.largest_object).unwrap_or(i64::MAX));
        }
        for err in &report.errors {
            error!(%err, "write failed; retrying in {}s", RETRY_DELAY.as_secs());
            self.metrics
                .write_errors
                .get_or_create(&WriteLabels {
                    kind: err.kind.label().to_owned(),
                    op: err.op.to_owned(),
                })
                .inc();
            self.repairs.insert((err.kind, err.name.clone()));
        }
        if !report.errors.is_empty() {
            self.full_reconcile = was_full;
            self.retry_at = Some(Instant::now() + RETRY_DELAY);
        }
        let wrote = report.applied.len() + report.deleted.len() + report.errors.len();
        if wrote > 0 || was_full {
            info!(
                applied = report.applied.len(),
                deleted = report.deleted.len(),
                unchanged = report.unchanged,
                errors = report.errors.len(),
                full = was_full,
                elapsed_ms = started.elapsed().as_millis(),
                "sync done"
            );
        } else {
            // Most events (Node heartbeats, unrelated labels) change no plan at all.
            debug!(unchanged = report.unchanged, "sync: nothing to write");
        }
    }

    /// The planner identity of an object name, if it should exist.
    fn id_of(&self, kind: Kind, name: &str) -> Option<ObjectId> {
        match kind {
            Kind::Plan => self
                .planner
                .has_node(name)
                .then(|| ObjectId::Plan(name.to_owned())),
            Kind::Shard => self
                .planner
                .shard_ids()
                .into_iter()
                .find(|id| id.name() == name),
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
