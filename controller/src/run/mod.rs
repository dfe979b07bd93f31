//! `proxyplan-controller run`: watches feed the planner; the leader writes what changed.
//!
//! One task owns the [`Planner`] and the [`PlanWriter`]; watches, the leader elector, the
//! Event publisher and the HTTP servers talk to it through channels. Nothing is written
//! before every watch has listed once, a replica that does not hold the Lease keeps its
//! index warm but writes nothing, and every write checks the [`Fence`] first.

pub mod events;
pub mod http;
pub mod lease;
pub mod retry;
pub mod rollout;
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
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use proxyplan_crds::lenient::{Lenient, Projection};
use proxyplan_crds::runtime::watch_backoff;
use proxyplan_crds::{MANAGED_BY, MANAGED_BY_LABEL, NodeProxyPlan, ServiceProxyPlan};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::config::PlannerConfig;
use crate::model::{HEADLESS_LABEL, ObjectError, SERVICE_PROXY_NAME_LABEL, ServiceKey};
use crate::planner::{ObjectId, Planner};
use events::{Notice, Notices};
use http::{Health, KindLabels, Metrics, WriteLabels};
pub use lease::{Fence, LEASE_DURATION, LEASE_RETRY, RENEW_DEADLINE};
use lease::{Leadership, LeaseElector};
use retry::WriteRetry;
use rollout::Rollouts;
use writer::{Kind, PlanWriter, target_of};

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
    /// How long after its write a rollout some node still lacks is written as slow.
    pub rollout_slow_after: Duration,
    /// Which rollouts are written to the Service plans' status.
    pub rollout_status: rollout::StatusWrites,
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
    let fence = Fence::new();
    let (leader_tx, leader_rx) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    let election = tokio::spawn(keep_election(elector, leader_tx, fence.clone(), stop_rx));
    let (notices, publisher) = events::publisher(client.clone(), &settings.identity);
    let publisher = tokio::spawn(publisher);
    info!(identity = %settings.identity, lease = %settings.lease_name, "starting");
    let mut sync = SyncLoop::new(
        client.clone(),
        &settings,
        metrics,
        health,
        fence,
        Some(notices),
    );
    tokio::select! {
        () = sync.run(inputs(&client), leader_rx) => {}
        () = proxyplan_crds::runtime::shutdown_signal() => info!("shutting down"),
        result = http => {
            if let Ok(Err(err)) = result {
                return Err(RunError::Http(err));
            }
        }
    }
    publisher.abort();
    let _ = stop_tx.send(true);
    match election.await {
        Ok(elector) => {
            if let Err(err) = elector.release().await {
                warn!(%err, "could not release the leader Lease; another replica takes over when it expires");
            }
        }
        Err(err) => warn!(%err, "the election task failed"),
    }
    Ok(())
}

/// Runs election rounds until stopped, publishing whether we lead and extending the
/// write fence after every successful renewal. Returns the elector (to release the
/// Lease).
pub async fn keep_election(
    mut elector: LeaseElector,
    leader: watch::Sender<bool>,
    fence: Fence,
    mut stop: watch::Receiver<bool>,
) -> LeaseElector {
    loop {
        let started = std::time::Instant::now();
        let now = k8s_openapi::jiff::Timestamp::now();
        let (leading, next) = match elector.try_acquire_or_renew(now, started).await {
            Ok(Leadership::Leader) => {
                fence.grant_until(started + RENEW_DEADLINE);
                (true, LEASE_RETRY)
            }
            Ok(Leadership::Follower) => {
                fence.revoke();
                // Try again when the holder's Lease expires if it is not renewed, so a
                // dead leader is replaced a lease duration after its last renewal.
                let until_expiry = elector
                    .expiry()
                    .map_or(LEASE_RETRY, |at| at.saturating_duration_since(started));
                (false, LEASE_RETRY.min(until_expiry))
            }
            Err(err) => {
                warn!(%err, "leader election round failed");
                // Still leading until the fence runs out; the writer checks it anyway.
                (fence.holds(), lease::ERROR_RETRY)
            }
        };
        leader.send_if_modified(|current| {
            let changed = *current != leading;
            *current = leading;
            changed
        });
        tokio::select! {
            () = tokio::time::sleep(next) => {}
            _ = stop.changed() => return elector,
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
    Service(Event<Lenient<Service>>),
    /// EndpointSlices.
    Slice(Event<Lenient<EndpointSlice>>),
    /// Nodes.
    Node(Event<Lenient<Node>>),
    /// Our node plans.
    Plan(Event<Lenient<NodeProxyPlan>>),
    /// Our Service plans.
    ServicePlan(Event<Lenient<ServiceProxyPlan>>),
    /// The cluster's Service IP ranges.
    ServiceCidr(Event<Lenient<ServiceCIDR>>),
    /// A watch failed (it retries with backoff).
    WatchError(&'static str, String),
}

type InputStream = Pin<Box<dyn Stream<Item = Input> + Send>>;

fn watch_stream<K>(
    api: Api<Lenient<K>>,
    config: watcher::Config,
    kind: &'static str,
    wrap: fn(Event<Lenient<K>>) -> Input,
) -> InputStream
where
    K: kube::Resource<DynamicType = ()>
        + Projection
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    Box::pin(
        watch_backoff(watcher::watcher(api, config)).map(move |r| match r {
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
        watch_stream::<Service>(
            Api::all(client.clone()),
            watcher::Config::default().labels(&proxied),
            "Service",
            Input::Service,
        ),
        watch_stream::<EndpointSlice>(
            Api::all(client.clone()),
            watcher::Config::default().labels(&proxied),
            "EndpointSlice",
            Input::Slice,
        ),
        watch_stream::<Node>(
            Api::all(client.clone()),
            watcher::Config::default(),
            "Node",
            Input::Node,
        ),
        watch_stream::<NodeProxyPlan>(
            Api::all(client.clone()),
            watcher::Config::default().labels(&ours),
            "NodeProxyPlan",
            Input::Plan,
        ),
        watch_stream::<ServiceProxyPlan>(
            Api::all(client.clone()),
            watcher::Config::default().labels(&ours),
            "ServiceProxyPlan",
            Input::ServicePlan,
        ),
        watch_stream::<ServiceCIDR>(
            Api::all(client.clone()),
            watcher::Config::default(),
            "ServiceCIDR",
            Input::ServiceCidr,
        ),
    ]))
}

/// Buffers of a watch re-list in progress.
#[derive(Default)]
struct Relists {
    services: Option<Vec<Lenient<Service>>>,
    slices: Option<Vec<Lenient<EndpointSlice>>>,
    nodes: Option<Vec<Lenient<Node>>>,
    plans: Option<Vec<Lenient<NodeProxyPlan>>>,
    service_plans: Option<Vec<Lenient<ServiceProxyPlan>>>,
    service_cidrs: Option<Vec<Lenient<ServiceCIDR>>>,
    listed: BTreeSet<&'static str>,
}

/// Every kind listed before the first write. `ServiceCIDR` counts as listed, empty, on
/// an API server that does not serve it (before Kubernetes 1.33).
const ALL_KINDS: [&str; 6] = [
    "Service",
    "EndpointSlice",
    "Node",
    "NodeProxyPlan",
    "ServiceProxyPlan",
    "ServiceCIDR",
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

fn observed_plan(plan: &Lenient<NodeProxyPlan>) -> String {
    match &plan.object {
        Ok(p) => writer::content_revision_of_plan(p),
        Err(err) => format!("undecodable: {err}"),
    }
}

/// The rollout mark a node plan's agent reports.
fn programmed_mark(plan: &Lenient<NodeProxyPlan>) -> Option<&str> {
    plan.object
        .as_ref()
        .ok()?
        .status
        .as_ref()?
        .programmed_resource_version
        .as_deref()
}

fn observed_service_plan(plan: &Lenient<ServiceProxyPlan>) -> String {
    match &plan.object {
        Ok(p) => writer::content_revision_of_service_plan(p),
        Err(err) => format!("undecodable: {err}"),
    }
}

fn qualified<K: kube::Resource>(object: &K) -> String {
    match object.meta().namespace.as_deref() {
        Some(namespace) => format!("{namespace}/{}", object.name_any()),
        None => object.name_any(),
    }
}

/// How often a leader whose Lease was not renewed in time looks again before writing.
const FENCE_POLL: Duration = Duration::from_millis(250);

/// The task that owns the planner and the writer.
pub struct SyncLoop {
    planner: Planner,
    writer: PlanWriter,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    fence: Fence,
    notices: Notices,
    min_interval: Duration,
    relists: Relists,
    leader: bool,
    full_reconcile: bool,
    repairs: BTreeSet<(Kind, String)>,
    pending: bool,
    last_sync: Option<Instant>,
    /// When to write again after failed writes.
    retry: WriteRetry,
    rollouts: Rollouts,
    /// Batches of writes in flight.
    batches: JoinSet<Done>,
    /// The batch of rollout status writes in flight (one at most).
    status_writes: JoinSet<RolloutWrites>,
}

/// Rollout status writes, answered.
type RolloutWrites = Vec<(rollout::Update, Result<(), writer::WriteFailure>)>;

/// A batch of writes, done.
struct Done {
    report: writer::WriteReport,
    was_full: bool,
    /// When its sync started.
    started: std::time::Instant,
    /// How long its writes took.
    writing: Duration,
}

impl SyncLoop {
    /// A loop writing through `client` while `fence` holds, handing Warning Events to
    /// `notices`.
    #[must_use]
    pub fn new(
        client: Client,
        settings: &Settings,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        fence: Fence,
        notices: Option<mpsc::Sender<Notice>>,
    ) -> Self {
        Self {
            planner: Planner::new(settings.config.clone()),
            writer: PlanWriter::new(client),
            metrics,
            health,
            fence,
            notices: Notices::new(notices),
            min_interval: settings.min_sync_interval,
            relists: Relists::default(),
            leader: false,
            full_reconcile: true,
            repairs: BTreeSet::new(),
            pending: false,
            last_sync: None,
            retry: WriteRetry::default(),
            rollouts: Rollouts::new(settings.rollout_slow_after, settings.rollout_status),
            batches: JoinSet::new(),
            status_writes: JoinSet::new(),
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
            let rollout_due = (self.leader && self.synced())
                .then(|| self.rollouts.due(Instant::now()))
                .flatten();
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
                () = sleep_until(due), if due.is_some() => self.start_sync(),
                Some(done) = self.batches.join_next(), if !self.batches.is_empty() => self.joined(done),
                () = sleep_until(rollout_due), if rollout_due.is_some() && self.status_writes.is_empty() => {
                    self.start_rollout_writes();
                }
                Some(done) = self.status_writes.join_next(), if !self.status_writes.is_empty() => match done {
                    Ok(results) => self.finish_rollout_writes(results),
                    Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
                    Err(err) => debug!(%err, "rollout status writes were cancelled"),
                },
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
        if let Some(retry) = self.retry.at() {
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
            self.notices.publish();
        }
    }

    /// Feeds one watch event to the planner (or to the writer's view of our objects).
    pub fn handle(&mut self, input: Input) {
        let kind = match &input {
            Input::Service(_) => "service",
            Input::Slice(_) => "endpointslice",
            Input::Node(_) => "node",
            Input::Plan(_) => "nodeproxyplan",
            Input::ServicePlan(_) => "serviceproxyplan",
            Input::ServiceCidr(_) => "servicecidr",
            Input::WatchError("ServiceCIDR", err) if err.contains("code: 404") => {
                if !self.relists.listed.contains("ServiceCIDR") {
                    info!(
                        "this API server serves no ServiceCIDRs (Kubernetes < 1.33): plans carry \
                         no Service CIDRs, so traffic to unallocated Service IPs is not dropped"
                    );
                    self.listed("ServiceCIDR");
                }
                return;
            }
            Input::WatchError(kind, err) => {
                let hint = if kind.starts_with("NodeProxyPlan")
                    || kind.starts_with("ServiceProxyPlan")
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
        self.retry.answered(Instant::now());
        // Our own objects' events change nothing to plan (a divergence is a repair):
        // only the cluster's objects make a sync pending.
        self.pending |= matches!(
            input,
            Input::Service(_) | Input::Slice(_) | Input::Node(_) | Input::ServiceCidr(_)
        );
        match input {
            Input::Service(event) => match relist(&mut self.relists.services, event) {
                Relist::Event(Event::Apply(svc)) => self.apply_service(&svc),
                Relist::Event(Event::Delete(svc)) => {
                    self.notices.clear(
                        "Service",
                        &namespace_of(&svc),
                        &svc.name_any(),
                        "InvalidService",
                    );
                    self.planner.delete_service_named(&service_key(&svc));
                }
                Relist::Done(all) => {
                    let keep: Vec<ServiceKey> = all.iter().map(service_key).collect();
                    self.planner.retain_services(&keep);
                    for svc in &all {
                        self.apply_service(svc);
                    }
                    self.listed("Service");
                }
                _ => {}
            },
            Input::Slice(event) => match relist(&mut self.relists.slices, event) {
                Relist::Event(Event::Apply(slice)) => self.apply_slice(&slice),
                Relist::Event(Event::Delete(slice)) => {
                    self.notices.clear(
                        "EndpointSlice",
                        &namespace_of(&slice),
                        &slice.name_any(),
                        "InvalidEndpointSlice",
                    );
                    self.planner.delete_slice_named(&service_key(&slice));
                }
                Relist::Done(all) => {
                    let keep: Vec<ServiceKey> = all.iter().map(service_key).collect();
                    self.planner.retain_slices(&keep);
                    for slice in &all {
                        self.apply_slice(slice);
                    }
                    self.listed("EndpointSlice");
                }
                _ => {}
            },
            Input::Node(event) => match relist(&mut self.relists.nodes, event) {
                Relist::Event(Event::Apply(node)) => self.apply_node(&node),
                Relist::Event(Event::Delete(node)) => self.planner.delete_node(&node.name_any()),
                Relist::Done(all) => {
                    let keep: Vec<String> = all.iter().map(ResourceExt::name_any).collect();
                    self.planner.retain_nodes(&keep);
                    for node in &all {
                        self.apply_node(node);
                    }
                    self.listed("Node");
                }
                _ => {}
            },
            Input::ServiceCidr(event) => match relist(&mut self.relists.service_cidrs, event) {
                Relist::Event(Event::Apply(cidr)) => self.apply_service_cidr(&cidr),
                Relist::Event(Event::Delete(cidr)) => {
                    self.planner.delete_service_cidr(&cidr.name_any());
                }
                Relist::Done(all) => {
                    let keep: Vec<String> = all.iter().map(ResourceExt::name_any).collect();
                    self.planner.retain_service_cidrs(&keep);
                    for cidr in &all {
                        self.apply_service_cidr(cidr);
                    }
                    self.listed("ServiceCIDR");
                }
                _ => {}
            },
            Input::Plan(event) => match relist(&mut self.relists.plans, event) {
                Relist::Event(Event::Apply(plan)) => {
                    self.observed(Kind::Plan, &plan.name_any(), Some(&observed_plan(&plan)));
                    self.rollouts
                        .node_mark(&plan.name_any(), programmed_mark(&plan));
                }
                Relist::Event(Event::Delete(plan)) => {
                    self.observed(Kind::Plan, &plan.name_any(), None);
                    self.rollouts.node_mark(&plan.name_any(), None);
                }
                Relist::Done(all) => {
                    self.writer.forget(Kind::Plan);
                    self.rollouts.forget_marks();
                    for plan in &all {
                        let revision = observed_plan(plan);
                        self.writer
                            .observe(Kind::Plan, &plan.name_any(), Some(&revision));
                        self.rollouts
                            .node_mark(&plan.name_any(), programmed_mark(plan));
                    }
                    self.full_reconcile = true;
                    self.listed("NodeProxyPlan");
                }
                _ => {}
            },
            Input::ServicePlan(event) => match relist(&mut self.relists.service_plans, event) {
                Relist::Event(Event::Apply(plan)) => {
                    let revision = observed_service_plan(&plan);
                    self.observed(Kind::Service, &qualified(&plan), Some(&revision));
                    self.observed_rollout(&plan, &revision);
                }
                Relist::Event(Event::Delete(plan)) => {
                    self.observed(Kind::Service, &qualified(&plan), None);
                    self.rollouts.forget(&qualified(&plan));
                }
                Relist::Done(all) => {
                    self.writer.forget(Kind::Service);
                    let listed: std::collections::HashSet<String> =
                        all.iter().map(qualified).collect();
                    self.rollouts.retain(&listed);
                    for plan in &all {
                        let revision = observed_service_plan(plan);
                        self.writer
                            .observe(Kind::Service, &qualified(plan), Some(&revision));
                        self.observed_rollout(plan, &revision);
                    }
                    self.full_reconcile = true;
                    self.listed("ServiceProxyPlan");
                }
                _ => {}
            },
            Input::WatchError(..) => {}
        }
    }

    fn observed_rollout(&mut self, plan: &Lenient<ServiceProxyPlan>, revision: &str) {
        if self
            .writer
            .writing(Kind::Service, &qualified(plan), revision)
        {
            // This controller's own write, seen before its answer: the answer starts
            // the rollout (with the write's time), and a spec write leaves the status
            // as it was.
            return;
        }
        let status = plan
            .object
            .as_ref()
            .ok()
            .and_then(|p| p.status.as_ref())
            .and_then(|s| s.rollout.as_ref());
        self.rollouts.observed(
            &qualified(plan),
            revision,
            kube::Resource::meta(plan).resource_version.as_deref(),
            status,
        );
    }

    /// Starts writing the rollout statuses that are due (as leader), without waiting:
    /// a slow API server delays the statuses, never the next change's plans.
    fn start_rollout_writes(&mut self) {
        let now = Instant::now();
        let (updates, completed) = self.rollouts.updates(now);
        for done in completed {
            self.metrics.rollout_seconds.observe(done.seconds);
        }
        let client = self.writer.client();
        let fence = self.fence.clone();
        self.status_writes.spawn(async move {
            let (client, fence) = (&client, &fence);
            futures::stream::iter(updates.into_iter().map(|update| async move {
                let result =
                    writer::write_rollout(client.clone(), &update.plan, &update.status, fence)
                        .await;
                (update, result)
            }))
            .buffer_unordered(16)
            .collect()
            .await
        });
    }

    /// Records what a batch of rollout status writes did.
    fn finish_rollout_writes(&mut self, results: RolloutWrites) {
        let now = Instant::now();
        for (update, result) in results {
            match result {
                Ok(()) => {
                    self.metrics.rollout_status_writes.inc();
                    self.rollouts.written(&update, now);
                }
                Err(writer::WriteFailure::Api(kube::Error::Api(status))) if status.code == 404 => {
                    // Deleted meanwhile, or a CRD without the status subresource (older
                    // than this controller): not tried again for this revision.
                    warn!(
                        plan = %update.plan,
                        "rollout status not written ({}); are the CRDs up to date? \
                         (kubectl apply -f charts/proxyplan/crds)",
                        status.message
                    );
                    self.rollouts.gave_up(&update);
                }
                Err(err) => {
                    debug!(plan = %update.plan, %err, "rollout status not written; retrying later");
                    self.rollouts.failed(&update, now);
                }
            }
        }
        self.metrics
            .rollouts_incomplete
            .set(i64::try_from(self.rollouts.incomplete()).unwrap_or(i64::MAX));
        self.metrics
            .nodes_reporting
            .set(i64::try_from(self.rollouts.nodes()).unwrap_or(i64::MAX));
    }

    fn apply_service(&mut self, svc: &Lenient<Service>) {
        let result = match &svc.object {
            Ok(object) => self.planner.apply_service(object),
            Err(err) => Err(ObjectError::Invalid {
                kind: "Service",
                object: qualified(svc),
                field: err.path.clone(),
                reason: err.message.clone(),
            }),
        };
        self.report(result.err(), "Service", "v1", svc);
    }

    fn apply_slice(&mut self, slice: &Lenient<EndpointSlice>) {
        let result = match &slice.object {
            Ok(object) => self.planner.apply_slice(object),
            Err(err) => Err(ObjectError::Invalid {
                kind: "EndpointSlice",
                object: qualified(slice),
                field: err.path.clone(),
                reason: err.message.clone(),
            }),
        };
        self.report(result.err(), "EndpointSlice", "discovery.k8s.io/v1", slice);
    }

    fn apply_node(&mut self, node: &Lenient<Node>) {
        let result = match &node.object {
            Ok(object) => self.planner.apply_node(object),
            Err(err) => Err(ObjectError::Invalid {
                kind: "Node",
                object: node.name_any(),
                field: err.path.clone(),
                reason: err.message.clone(),
            }),
        };
        if let Some(error) = result.err() {
            self.count_refusal(&error);
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

    fn apply_service_cidr(&mut self, cidr: &Lenient<ServiceCIDR>) {
        let name = cidr.name_any();
        match &cidr.object {
            Ok(object) => {
                let ranges = object
                    .spec
                    .as_ref()
                    .and_then(|s| s.cidrs.clone())
                    .unwrap_or_default();
                if let Err(err) = self.planner.apply_service_cidr(&name, &ranges) {
                    warn!(servicecidr = %name, %err, "ServiceCIDR ignored");
                }
            }
            Err(err) => warn!(servicecidr = %name, %err, "ServiceCIDR ignored"),
        }
    }

    fn listed(&mut self, kind: &'static str) {
        if self.relists.listed.insert(kind) {
            info!(kind, "initial list complete");
        }
        if self.synced() {
            self.health.set_ready(true);
        }
    }

    /// Logs and counts a refused object, and records a Warning Event on it.
    fn report<K: kube::Resource>(
        &mut self,
        error: Option<ObjectError>,
        kind: &str,
        api_version: &str,
        object: &K,
    ) {
        let namespace = namespace_of(object);
        let name = object.name_any();
        let reason = format!("Invalid{kind}");
        let Some(error) = error else {
            self.notices.clear(kind, &namespace, &name, &reason);
            return;
        };
        self.count_refusal(&error);
        if error.is_invalid() {
            self.notices.set(Notice {
                regarding: events::reference(
                    kind,
                    api_version,
                    &namespace,
                    &name,
                    object.meta().uid.clone(),
                ),
                reason,
                note: format!(
                    "proxyplan refused this {kind}: {error}; its last good version stays \
                     planned"
                ),
            });
            if self.leader {
                self.notices.publish();
            }
        }
    }

    fn count_refusal(&self, error: &ObjectError) {
        if error.is_invalid() {
            warn!(%error, "object refused; its last good version stays planned");
            let kind = match error {
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
    /// Plans what changed, starts writing it, and waits until every write in flight
    /// (this sync's and earlier ones') is done.
    pub async fn sync(&mut self) {
        self.start_sync();
        self.settle().await;
    }

    /// Waits for every batch of writes in flight and records what each did.
    pub async fn settle(&mut self) {
        while let Some(done) = self.batches.join_next().await {
            self.joined(done);
        }
    }

    /// Records a batch of writes that ended. A panic in it goes on here, as it did when
    /// the loop made the writes itself (its objects would otherwise stay in flight).
    fn joined(&mut self, done: Result<Done, tokio::task::JoinError>) {
        match done {
            Ok(done) => self.finish(done),
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(err) => debug!(%err, "a batch of writes was cancelled"),
        }
    }

    /// Plans what changed and starts writing it, without waiting: the run loop goes on
    /// taking events and starts the next sync while this one's writes are in flight
    /// (an object still being written waits for that write). So a change is never
    /// queued behind another change's writes.
    pub fn start_sync(&mut self) {
        if !self.leader || !self.synced() {
            // Only the leader writes, and only once every watch has listed: a partial
            // index would delete plans of nodes not listed yet. Nothing is taken from
            // the planner, so no change is lost.
            return;
        }
        if !self.fence.holds() {
            // The Lease was not renewed in time (an API server away, this process
            // stopped): every write would be abandoned. Ask again shortly instead of
            // computing them over and over (a full reconcile each time, a core's worth
            // of CPU while the API server comes back). Nothing is taken from the planner.
            self.retry.poll_at(Instant::now() + FENCE_POLL);
            return;
        }
        let started = std::time::Instant::now();
        self.pending = false;
        self.retry.clear();
        let repairs = std::mem::take(&mut self.repairs);
        for (kind, name) in &repairs {
            if let Some(id) = self.id_of(*kind, name) {
                self.planner.mark_dirty(id);
            }
        }
        let changes = self.planner.take_changes();
        if changes.is_empty() && repairs.is_empty() && !self.full_reconcile {
            // Nothing to write (a heartbeat, a label): not a sync the minimum interval
            // must space the next one from.
            debug!("sync: nothing changed");
            return;
        }
        // The minimum interval spaces writes: a burst of changes costs one write each
        // interval, a change after a quiet time is written at once.
        self.last_sync = Some(Instant::now());
        for (key, warnings) in &changes.warnings {
            self.warn_truncated(key, warnings);
        }
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
        for (kind, name) in &repairs {
            if self.id_of(*kind, name).is_none() {
                delete.push((*kind, name.clone()));
            }
        }
        self.metrics
            .compute_seconds
            .observe(started.elapsed().as_secs_f64());
        let was_full = std::mem::take(&mut self.full_reconcile);
        let batch = self.writer.start(apply, delete);
        let fence = self.fence.clone();
        self.batches.spawn(async move {
            let writing = std::time::Instant::now();
            let report = batch.run(fence).await;
            Done {
                report,
                was_full,
                started,
                writing: writing.elapsed(),
            }
        });
    }

    /// Records what a batch of writes did: the revisions written, metrics, rollouts to
    /// follow, and what to write again (failed writes, and objects deferred behind a
    /// batch still in flight).
    fn finish(&mut self, done: Done) {
        let Done {
            report,
            was_full,
            started,
            writing,
        } = done;
        let free = self.writer.finish(&report);
        self.metrics.write_seconds.observe(writing.as_secs_f64());
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
        let now = Instant::now();
        for (plan, revision, version) in &report.service_versions {
            self.rollouts.wrote(plan, revision, version, now);
        }
        // Deferred behind a batch that was in flight: written again now that none is
        // (the planner gives their newest content).
        self.repairs.extend(free);
        for err in &report.errors {
            self.metrics
                .write_errors
                .get_or_create(&WriteLabels {
                    kind: err.kind.label().to_owned(),
                    op: err.op.to_owned(),
                })
                .inc();
            self.repairs.insert((err.kind, err.name.clone()));
        }
        if !report.abandoned.is_empty() {
            // Leadership may be lost: the next leader (maybe this replica again) makes a
            // full reconcile, which writes these too.
            warn!(
                abandoned = report.abandoned.len(),
                "leadership may be lost (the Lease was not renewed in time): writes stopped"
            );
            self.full_reconcile = true;
        }
        if report.errors.is_empty() {
            self.retry.succeeded();
        } else {
            let delay = self.retry.failed(&report.errors, Instant::now());
            for err in &report.errors {
                error!(
                    %err,
                    "write failed; retrying in {:.1}s, or when the API server answers again",
                    delay.as_secs_f64()
                );
            }
            self.full_reconcile |= was_full;
        }
        let wrote = report.applied.len() + report.deleted.len() + report.errors.len();
        if wrote > 0 || was_full {
            info!(
                applied = report.applied.len(),
                deleted = report.deleted.len(),
                unchanged = report.unchanged,
                deferred = report.deferred.len(),
                errors = report.errors.len(),
                abandoned = report.abandoned.len(),
                full = was_full,
                elapsed_ms = started.elapsed().as_millis(),
                "sync done"
            );
        } else {
            // Most events (Node heartbeats, unrelated labels) change no plan at all.
            debug!(unchanged = report.unchanged, "sync: nothing to write");
        }
    }

    /// Records (or clears) a Warning Event on a Service whose plan had to be cut down.
    fn warn_truncated(&mut self, key: &ServiceKey, warnings: &[String]) {
        if warnings.is_empty() {
            self.notices
                .clear("Service", &key.namespace, &key.name, "ProxyPlanTruncated");
            return;
        }
        for warning in warnings {
            warn!(service = %key, %warning, "Service plan cut down to fit");
        }
        self.notices.set(Notice {
            regarding: events::reference("Service", "v1", &key.namespace, &key.name, None),
            reason: "ProxyPlanTruncated".to_owned(),
            note: warnings.join("; "),
        });
        self.notices.publish();
    }

    /// The planner identity of an object name, if it should exist.
    fn id_of(&self, kind: Kind, name: &str) -> Option<ObjectId> {
        match kind {
            Kind::Plan => self
                .planner
                .has_node(name)
                .then(|| ObjectId::Plan(name.to_owned())),
            Kind::Service => ObjectId::service_part(name).filter(|id| self.planner.wants(id)),
        }
    }
}

fn namespace_of<K: kube::Resource>(object: &K) -> String {
    object.meta().namespace.clone().unwrap_or_default()
}

/// The key the planner files a Service or EndpointSlice under.
fn service_key<K: kube::Resource>(object: &K) -> ServiceKey {
    ServiceKey {
        namespace: object
            .meta()
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        name: object.name_any(),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
