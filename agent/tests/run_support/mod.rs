//! A mock API server for the agent's API tests, a fake dataplane, and builders for node
//! plans and Service plans.
//!
//! The agent under test talks to a `kube::Client` backed by `tower_test::mock`. Unlike the
//! controller's strictly scripted verifier, the agent keeps long-running watches open, so
//! a background task plays the API server for lists and watches: it answers them from an
//! in-memory store, streams changes to the open watches, and logs every request for exact
//! assertions. Every other request (the status patches) is handed to the test, which
//! asserts method, exact URI and body, and answers it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc as stream_channel;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::client::Body;
use proxyplan_agent::dataplane::{ChangeAlarm, Dataplane, DataplaneError, SyncReport};
use proxyplan_crds::{
    EmptyAction, Endpoint, EndpointOverride, IpFamily, LocalTrafficDetection, LocalTrafficMode,
    MANAGED_BY, MANAGED_BY_LABEL, MasqueradePlan, MergedPlan, NodeProxyPlan, NodeProxyPlanSpec,
    Protocol, SERVICE_LABEL, ServicePortPlan, ServiceProxyPlan, ServiceProxyPlanSpec, TrafficPlan,
    TrafficPolicy, ZoneEndpoints,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tower_test::mock;

/// How long a test waits for something that must happen.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// How long a test listens to conclude that nothing happens.
pub const QUIET_PERIOD: Duration = Duration::from_millis(400);

/// Collection path of `NodeProxyPlan`s.
pub const PLANS: &str = "/apis/proxyplan.dev/v1alpha1/nodeproxyplans";
/// Collection path of `ServiceProxyPlan`s in every namespace.
pub const SERVICES: &str = "/apis/proxyplan.dev/v1alpha1/serviceproxyplans";
/// Content type of a server-side apply patch.
pub const APPLY_CONTENT_TYPE: &str = "application/apply-patch+yaml";

/// The exact URI of the status patch of plan `node`, as kube 5 encodes it.
pub fn status_uri(node: &str) -> String {
    format!("{PLANS}/{node}/status?&force=true&fieldManager=proxyplan-agent")
}

type MockBody = UnsyncBoxBody<Bytes, Infallible>;

fn full(bytes: Vec<u8>) -> MockBody {
    Full::new(Bytes::from(bytes)).boxed_unsync()
}

fn json_response(status: u16, body: &Value) -> Response<MockBody> {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(full(serde_json::to_vec(body).unwrap()))
        .unwrap()
}

fn failure(code: u16, reason: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("mock API server: {reason}"), "reason": reason, "code": code,
    })
}

// ---------------------------------------------------------------------------------------
// The mock API server

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plan,
    Service,
}

impl Kind {
    fn of_path(path: &str) -> Option<Self> {
        match path {
            PLANS => Some(Self::Plan),
            SERVICES => Some(Self::Service),
            _ => None,
        }
    }

    fn list_kind(self) -> &'static str {
        match self {
            Self::Plan => "NodeProxyPlanList",
            Self::Service => "ServiceProxyPlanList",
        }
    }
}

/// A list or watch selector: `metadata.name=X` or `label=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Selector {
    All,
    Name(String),
    Label(String, String),
}

impl Selector {
    fn from_query(query: &BTreeMap<String, String>) -> Self {
        if let Some(field) = query.get("fieldSelector") {
            let (key, value) = field.split_once('=').unwrap();
            assert_eq!(key, "metadata.name", "unsupported field selector {field}");
            return Self::Name(value.to_owned());
        }
        if let Some(label) = query.get("labelSelector") {
            let (key, value) = label.split_once('=').unwrap();
            return Self::Label(key.to_owned(), value.to_owned());
        }
        Self::All
    }

    fn matches(&self, object: &Value) -> bool {
        match self {
            Self::All => true,
            Self::Name(name) => object["metadata"]["name"] == json!(name),
            Self::Label(key, value) => object["metadata"]["labels"][key] == json!(value),
        }
    }
}

struct OpenWatch {
    kind: Kind,
    selector: Selector,
    events: stream_channel::UnboundedSender<Result<Frame<Bytes>, Infallible>>,
}

struct Change {
    rv: u64,
    kind: Kind,
    type_: &'static str,
    object: Value,
}

#[derive(Default)]
struct Store {
    rv: u64,
    plans: BTreeMap<String, Value>,
    services: BTreeMap<String, Value>,
    history: Vec<Change>,
    watches: Vec<OpenWatch>,
    offline: bool,
    log: Vec<String>,
}

impl Store {
    fn objects(&mut self, kind: Kind) -> &mut BTreeMap<String, Value> {
        match kind {
            Kind::Plan => &mut self.plans,
            Kind::Service => &mut self.services,
        }
    }

    fn emit(&mut self, kind: Kind, type_: &'static str, object: Value) {
        let line = json!({ "type": type_, "object": object });
        let mut bytes = serde_json::to_vec(&line).unwrap();
        bytes.push(b'\n');
        self.watches.retain(|w| {
            if w.kind != kind || !w.selector.matches(&object) {
                return !w.events.is_closed();
            }
            w.events
                .unbounded_send(Ok(Frame::data(Bytes::from(bytes.clone()))))
                .is_ok()
        });
        self.history.push(Change {
            rv: self.rv,
            kind,
            type_,
            object,
        });
    }

    /// Stores `object` (creating or updating it) and tells the watches.
    fn put(&mut self, kind: Kind, mut object: Value) -> Value {
        self.rv += 1;
        let name = key_of(&object);
        let old = self.objects(kind).get(&name).cloned();
        let generation = match &old {
            Some(old) if old["spec"] == object["spec"] => old["metadata"]["generation"].clone(),
            Some(old) => json!(old["metadata"]["generation"].as_i64().unwrap_or(0) + 1),
            None => json!(1),
        };
        let meta = &mut object["metadata"];
        meta["resourceVersion"] = json!(self.rv.to_string());
        meta["generation"] = generation;
        if meta.get("uid").is_none() {
            meta["uid"] = old.as_ref().map_or_else(
                || json!(format!("uid-{name}-{}", self.rv)),
                |o| o["metadata"]["uid"].clone(),
            );
        }
        if object.get("status").is_none()
            && let Some(status) = old.as_ref().and_then(|o| o.get("status"))
        {
            object["status"] = status.clone();
        }
        self.objects(kind).insert(name, object.clone());
        let type_ = if old.is_some() { "MODIFIED" } else { "ADDED" };
        self.emit(kind, type_, object.clone());
        object
    }

    fn delete(&mut self, kind: Kind, name: &str) {
        self.rv += 1;
        if let Some(mut object) = self.objects(kind).remove(name) {
            object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
            self.emit(kind, "DELETED", object);
        }
    }

    fn list(&self, kind: Kind, selector: &Selector) -> Value {
        let objects = match kind {
            Kind::Plan => &self.plans,
            Kind::Service => &self.services,
        };
        let items: Vec<&Value> = objects.values().filter(|o| selector.matches(o)).collect();
        json!({
            "apiVersion": "proxyplan.dev/v1alpha1",
            "kind": kind.list_kind(),
            "metadata": { "resourceVersion": self.rv.to_string() },
            "items": items,
        })
    }

    fn open_watch(&mut self, kind: Kind, selector: Selector, since: u64) -> MockBody {
        let (tx, rx) = stream_channel::unbounded();
        for change in self
            .history
            .iter()
            .filter(|c| c.rv > since && c.kind == kind)
        {
            if selector.matches(&change.object) {
                let line = json!({ "type": change.type_, "object": change.object });
                let mut bytes = serde_json::to_vec(&line).unwrap();
                bytes.push(b'\n');
                tx.unbounded_send(Ok(Frame::data(Bytes::from(bytes))))
                    .unwrap();
            }
        }
        self.watches.push(OpenWatch {
            kind,
            selector,
            events: tx,
        });
        StreamBody::new(rx).boxed_unsync()
    }
}

/// A request the agent sent that the test answers (anything but lists and watches).
pub struct Received {
    /// HTTP method.
    pub method: Method,
    /// Path and query, exactly as sent.
    pub uri: String,
    /// `Content-Type`, if any.
    pub content_type: Option<String>,
    /// The body as JSON.
    pub body: Value,
    respond: mock::SendResponse<Response<MockBody>>,
}

impl std::fmt::Debug for Received {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.method, self.uri, self.body)
    }
}

/// The test's end of the mock API server.
pub struct MockApi {
    store: Arc<Mutex<Store>>,
    requests: mpsc::UnboundedReceiver<Received>,
    server: tokio::task::JoinHandle<()>,
}

impl MockApi {
    /// A client whose requests this mock receives.
    pub fn new() -> (kube::Client, Self) {
        let (service, handle) = mock::pair::<Request<Body>, Response<MockBody>>();
        let store = Arc::new(Mutex::new(Store::default()));
        let (requests_tx, requests) = mpsc::unbounded_channel();
        let server = tokio::spawn(serve(handle, store.clone(), requests_tx));
        (
            kube::Client::new(service, "default"),
            Self {
                store,
                requests,
                server,
            },
        )
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap()
    }

    /// Creates or updates a plan (the server keeps its status; `generation` moves with
    /// the spec).
    pub fn put_plan(&self, plan: &NodeProxyPlan) -> NodeProxyPlan {
        let mut object = serde_json::to_value(plan).unwrap();
        object.as_object_mut().unwrap().remove("status");
        serde_json::from_value(self.store().put(Kind::Plan, object)).unwrap()
    }

    /// Creates a plan that already carries `status` (written by an earlier agent).
    pub fn put_plan_with_status(&self, plan: &NodeProxyPlan, status: &Value) {
        let mut object = serde_json::to_value(plan).unwrap();
        object["status"] = status.clone();
        self.store().put(Kind::Plan, object);
    }

    /// Creates or updates a Service plan; returns its new `resourceVersion`.
    pub fn put_service(&self, service: &ServiceProxyPlan) -> String {
        let stored = self
            .store()
            .put(Kind::Service, serde_json::to_value(service).unwrap());
        stored["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Writes a Service plan's status only (as the controller's rollout status does):
    /// a new `resourceVersion`, the same generation.
    pub fn put_service_status(&self, key: &str, status: Value) -> String {
        let mut object = self.store().services[key].clone();
        object["status"] = status;
        let stored = self.store().put(Kind::Service, object);
        stored["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Stores a Service plan as raw JSON (for objects the agent cannot decode).
    pub fn put_service_json(&self, object: Value) {
        self.store().put(Kind::Service, object);
    }

    /// Deletes Service plan `namespace/name`.
    pub fn delete_service(&self, key: &str) {
        self.store().delete(Kind::Service, key);
    }

    /// The stored plan, as JSON.
    pub fn plan_json(&self, name: &str) -> Value {
        self.store().plans[name].clone()
    }

    /// Every list and watch request so far, as `METHOD path?query`, in order.
    pub fn reads(&self) -> Vec<String> {
        self.store().log.clone()
    }

    /// Waits until `n` watches are open.
    pub async fn wait_for_watches(&self, n: usize) {
        let open = || {
            let mut store = self.store();
            store.watches.retain(|w| !w.events.is_closed());
            store.watches.len()
        };
        tokio::time::timeout(TIMEOUT, async {
            while open() < n {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("expected {n} open watches, have {}", open()));
    }

    /// The watch URIs open now, without the query's resourceVersion.
    pub fn open_watches(&self) -> Vec<String> {
        let mut store = self.store();
        store.watches.retain(|w| !w.events.is_closed());
        let mut open: Vec<String> = store
            .watches
            .iter()
            .map(|w| format!("{:?} {:?}", w.kind, w.selector))
            .collect();
        open.sort();
        open
    }

    /// The API server goes away: open watches end and every request fails.
    pub fn go_offline(&self) {
        let mut store = self.store();
        store.offline = true;
        store.watches.clear();
    }

    /// The next request the test must answer; fails when none comes in time.
    pub async fn next(&mut self) -> Received {
        match tokio::time::timeout(TIMEOUT, self.requests.recv()).await {
            Ok(Some(request)) => request,
            Ok(None) => panic!("the mock API server stopped"),
            Err(_) => panic!("expected a request, none came within {TIMEOUT:?}"),
        }
    }

    /// The next request, which must be the status patch of plan `node`; answered as the
    /// API server would (status stored, watchers told). Returns the patch body.
    pub async fn expect_status_patch(&mut self, node: &str) -> Value {
        let request = self.next().await;
        assert_eq!(
            (&request.method, request.uri.as_str()),
            (&Method::PATCH, status_uri(node).as_str()),
            "unexpected request {request:?}"
        );
        assert_eq!(
            request.content_type.as_deref(),
            Some(APPLY_CONTENT_TYPE),
            "not a server-side apply"
        );
        let body = request.body.clone();
        self.accept_status(request);
        body
    }

    /// Answers a status patch by storing the status, like the API server.
    pub fn accept_status(&self, request: Received) {
        let name = request.body["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_owned();
        let stored = {
            let mut store = self.store();
            let mut object = store.plans[&name].clone();
            object["status"] = request.body["status"].clone();
            store.rv += 1;
            object["metadata"]["resourceVersion"] = json!(store.rv.to_string());
            store.plans.insert(name, object.clone());
            store.emit(Kind::Plan, "MODIFIED", object.clone());
            object
        };
        request.respond.send_response(json_response(200, &stored));
    }

    /// Fails if a request the test must answer arrives within [`QUIET_PERIOD`].
    pub async fn expect_quiet(&mut self) {
        if let Ok(Some(request)) = tokio::time::timeout(QUIET_PERIOD, self.requests.recv()).await {
            panic!("expected no request, got {request:?}");
        }
    }
}

impl Drop for MockApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn serve(
    mut handle: mock::Handle<Request<Body>, Response<MockBody>>,
    store: Arc<Mutex<Store>>,
    requests: mpsc::UnboundedSender<Received>,
) {
    while let Some((request, respond)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let uri = parts
            .uri
            .path_and_query()
            .map_or_else(String::new, |pq| pq.as_str().to_owned());
        let path = parts.uri.path().to_owned();
        let query: BTreeMap<String, String> = parts
            .uri
            .query()
            .map(|q| {
                url_pairs(q)
                    .into_iter()
                    .collect::<BTreeMap<String, String>>()
            })
            .unwrap_or_default();
        if store.lock().unwrap().offline {
            respond.send_response(json_response(503, &failure(503, "ServiceUnavailable")));
            continue;
        }
        if parts.method == Method::GET
            && let Some(kind) = Kind::of_path(&path)
        {
            let mut store = store.lock().unwrap();
            store.log.push(format!("GET {uri}"));
            let selector = Selector::from_query(&query);
            if query.get("watch").map(String::as_str) == Some("true") {
                let since = query
                    .get("resourceVersion")
                    .and_then(|rv| rv.parse().ok())
                    .unwrap_or(0);
                let body = store.open_watch(kind, selector, since);
                respond.send_response(
                    Response::builder()
                        .status(200)
                        .header(http::header::CONTENT_TYPE, "application/json")
                        .body(body)
                        .unwrap(),
                );
            } else {
                let list = store.list(kind, &selector);
                respond.send_response(json_response(200, &list));
            }
            continue;
        }
        let bytes = body.collect_bytes().await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        let received = Received {
            method: parts.method,
            uri,
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            body,
            respond,
        };
        if requests.send(received).is_err() {
            return;
        }
    }
}

/// How the store files an object: `namespace/name`, or `name` when cluster-scoped.
fn key_of(object: &Value) -> String {
    let name = object["metadata"]["name"].as_str().unwrap();
    match object["metadata"]["namespace"].as_str() {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    }
}

/// Decodes `a=b&c=d` (percent-decoding `%XX` and `+`).
fn url_pairs(query: &str) -> Vec<(String, String)> {
    let decode = |s: &str| {
        let mut out = Vec::new();
        let bytes = s.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'%' if i + 2 < bytes.len() => {
                    let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                    out.push(u8::from_str_radix(hex, 16).unwrap());
                    i += 3;
                }
                b'+' => {
                    out.push(b' ');
                    i += 1;
                }
                b => {
                    out.push(b);
                    i += 1;
                }
            }
        }
        String::from_utf8(out).unwrap()
    };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// The fake dataplane

/// One call the agent made to the fake dataplane.
#[derive(Debug, Clone)]
pub enum Call {
    /// `sync` of this plan; whether it succeeded.
    Sync(Box<MergedPlan>, bool),
    /// `rules_intact`; what it answered.
    RulesIntact(bool),
}

/// A dataplane that records what it is asked and fails on demand.
pub struct FakeDataplane {
    calls: mpsc::UnboundedSender<Call>,
    fail: Arc<AtomicBool>,
    intact: Arc<AtomicBool>,
    slow: Arc<AtomicBool>,
    count: usize,
    alarm: Option<FakeAlarm>,
}

/// A change alarm the test sets off through [`FakeHandle::alarm`].
pub struct FakeAlarm(std::sync::mpsc::Receiver<()>);

impl ChangeAlarm for FakeAlarm {
    fn wait(&mut self, timeout: Option<Duration>) -> std::io::Result<bool> {
        use std::sync::mpsc::RecvTimeoutError;
        let received = match timeout {
            Some(timeout) => self.0.recv_timeout(timeout),
            None => self.0.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match received {
            Ok(()) => Ok(true),
            Err(RecvTimeoutError::Timeout) => Ok(false),
            Err(RecvTimeoutError::Disconnected) => Err(std::io::Error::other("the test is gone")),
        }
    }
}

/// The test's end of the fake dataplane.
pub struct FakeHandle {
    calls: mpsc::UnboundedReceiver<Call>,
    /// Make syncs fail (`iptables-restore` exits 1).
    pub fail: Arc<AtomicBool>,
    /// What `rules_intact` answers.
    pub intact: Arc<AtomicBool>,
    /// Make syncs take 3, 6 or 9 ms in turn, so consecutive sync durations differ.
    pub slow: Arc<AtomicBool>,
    /// Syncs seen so far.
    pub syncs: Arc<AtomicUsize>,
    /// Sets off the fake's change alarm.
    pub alarm: std::sync::mpsc::Sender<()>,
}

impl FakeDataplane {
    /// A fake and its handle.
    pub fn new() -> (Self, FakeHandle) {
        let (tx, rx) = mpsc::unbounded_channel();
        let fail = Arc::new(AtomicBool::new(false));
        let intact = Arc::new(AtomicBool::new(true));
        let slow = Arc::new(AtomicBool::new(false));
        let (alarm, alarmed) = std::sync::mpsc::channel();
        (
            Self {
                calls: tx,
                fail: fail.clone(),
                intact: intact.clone(),
                slow: slow.clone(),
                count: 0,
                alarm: Some(FakeAlarm(alarmed)),
            },
            FakeHandle {
                calls: rx,
                fail,
                intact,
                slow,
                syncs: Arc::new(AtomicUsize::new(0)),
                alarm,
            },
        )
    }
}

impl Dataplane for FakeDataplane {
    fn sync(&mut self, plan: &MergedPlan, dry_run: bool) -> Result<SyncReport, DataplaneError> {
        assert!(!dry_run, "the run loop never asks for a dry run");
        self.count += 1;
        if self.slow.load(Ordering::SeqCst) {
            let millis = 3 * (self.count % 3 + 1);
            std::thread::sleep(Duration::from_millis(millis as u64));
        }
        let ok = !self.fail.load(Ordering::SeqCst);
        let _ = self.calls.send(Call::Sync(Box::new(plan.clone()), ok));
        if !ok {
            return Err(DataplaneError::ToolFailed {
                tool: "iptables-restore --noflush".to_owned(),
                code: Some(1),
                stderr: "iptables-restore: line 3 failed".to_owned(),
            });
        }
        Ok(SyncReport {
            rules: 10 * plan.service_ports.len() + 4,
            changed: 1,
            conntrack_deleted: 2,
            payload: String::new(),
            phases: Vec::new(),
            conntrack: Some(proxyplan_agent::conntrack::ConntrackRun {
                deleted: [2, 0],
                elapsed: Duration::from_millis(3),
            }),
        })
    }

    fn rules_intact(&mut self) -> Result<bool, DataplaneError> {
        let intact = self.intact.load(Ordering::SeqCst);
        let _ = self.calls.send(Call::RulesIntact(intact));
        Ok(intact)
    }

    /// The fake kernel holds the rules exactly when `intact` says so.
    fn holds_rules(&mut self) -> Result<bool, DataplaneError> {
        Ok(self.intact.load(Ordering::SeqCst))
    }

    fn cleanup(&mut self) -> Result<SyncReport, DataplaneError> {
        Ok(SyncReport::default())
    }

    fn change_alarm(&mut self) -> Option<Box<dyn ChangeAlarm>> {
        self.alarm
            .take()
            .map(|alarm| Box::new(alarm) as Box<dyn ChangeAlarm>)
    }
}

impl FakeHandle {
    /// The next call.
    pub async fn next_call(&mut self) -> Call {
        match tokio::time::timeout(TIMEOUT, self.calls.recv()).await {
            Ok(Some(call)) => call,
            Ok(None) => panic!("the dataplane is gone"),
            Err(_) => panic!("expected a dataplane call, none came within {TIMEOUT:?}"),
        }
    }

    /// The next sync (skipping canary checks): the plan and whether it succeeded.
    pub async fn next_sync(&mut self) -> (MergedPlan, bool) {
        loop {
            if let Call::Sync(plan, ok) = self.next_call().await {
                self.syncs.fetch_add(1, Ordering::SeqCst);
                return (*plan, ok);
            }
        }
    }

    /// Fails if the dataplane is asked to sync within [`QUIET_PERIOD`].
    pub async fn expect_no_sync(&mut self) {
        let deadline = tokio::time::Instant::now() + QUIET_PERIOD;
        while let Ok(Some(call)) = tokio::time::timeout_at(deadline, self.calls.recv()).await {
            if let Call::Sync(plan, _) = call {
                panic!("expected no sync, got one of revision {}", plan.revision);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Node plans and Service plans

/// The node under test.
pub const NODE: &str = "node-a";
/// Its zone.
pub const ZONE: &str = "eu-west-1a";

fn endpoints(list: &[&str]) -> Vec<Endpoint> {
    list.iter()
        .map(|ip| Endpoint {
            ip: (*ip).into(),
            port: 8080,
        })
        .collect()
}

/// A ClusterIP service port `default/name:http/TCP/IPv4` with Cluster policy.
pub fn mk_entry(name: &str, cluster_ip: &str, cluster_endpoints: &[&str]) -> ServicePortPlan {
    ServicePortPlan {
        key: format!("default/{name}:http/TCP/IPv4"),
        namespace: "default".into(),
        name: name.into(),
        port_name: "http".into(),
        family: IpFamily::IPv4,
        protocol: Protocol::TCP,
        port: 80,
        cluster_ip: cluster_ip.into(),
        external_ips: Vec::new(),
        load_balancer_ips: Vec::new(),
        node_port: None,
        load_balancer_source_ranges: Vec::new(),
        health_check_node_port: None,
        session_affinity: None,
        internal: TrafficPlan {
            policy: TrafficPolicy::Cluster,
            when_empty: EmptyAction::Reject,
        },
        external: None,
        cluster_endpoints: endpoints(cluster_endpoints),
        zone_endpoints: Vec::new(),
        local_endpoints: Vec::new(),
        masquerade: MasqueradePlan {
            all: false,
            off_cluster_to_cluster_ip: true,
            external: true,
            local_host_to_external: false,
            hairpin: true,
        },
        local_terminating: false,
        also_serving: Vec::new(),
    }
}

/// A LoadBalancer service port with `externalTrafficPolicy: Local`, node port 30080 and
/// health-check node port `health_check_node_port` (local endpoints come from overlays).
pub fn mk_local_entry(
    name: &str,
    cluster_ip: &str,
    health_check_node_port: u16,
) -> ServicePortPlan {
    ServicePortPlan {
        node_port: Some(30080),
        health_check_node_port: Some(health_check_node_port),
        external: Some(TrafficPlan {
            policy: TrafficPolicy::Local,
            when_empty: EmptyAction::Drop,
        }),
        masquerade: MasqueradePlan {
            all: false,
            off_cluster_to_cluster_ip: true,
            external: false,
            local_host_to_external: true,
            hairpin: true,
        },
        ..mk_entry(name, cluster_ip, &["10.244.1.20", "10.244.2.20"])
    }
}

/// An override of `key`'s local endpoints.
pub fn local_override(key: &str, local: &[&str]) -> EndpointOverride {
    EndpointOverride {
        key: key.to_owned(),
        cluster_endpoints: None,
        local_endpoints: Some(endpoints(local)),
        local_terminating: false,
    }
}

/// The plan of Service `default/<name>` holding `entries`, labelled as the controller
/// labels it.
pub fn mk_service(name: &str, revision: &str, entries: Vec<ServicePortPlan>) -> ServiceProxyPlan {
    let mut object = ServiceProxyPlan::new(
        name,
        ServiceProxyPlanSpec {
            revision: revision.to_owned(),
            service_ports: entries,
            summary: None,
        },
    );
    object.metadata.namespace = Some("default".to_owned());
    object.metadata.labels = Some(BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
        (SERVICE_LABEL.to_owned(), name.to_owned()),
    ]));
    object
}

/// `entry` with a zone list for `zone`.
pub fn with_zone(mut entry: ServicePortPlan, zone: &str, list: &[&str]) -> ServicePortPlan {
    entry.zone_endpoints.push(ZoneEndpoints {
        zone: zone.to_owned(),
        endpoints: endpoints(list),
    });
    entry
}

/// The plan of [`NODE`] in `zone`, with `overlay`.
pub fn mk_plan(
    revision: &str,
    zone: Option<&str>,
    overlay: Vec<EndpointOverride>,
) -> NodeProxyPlan {
    NodeProxyPlan {
        metadata: ObjectMeta {
            name: Some(NODE.to_owned()),
            ..ObjectMeta::default()
        },
        spec: NodeProxyPlanSpec {
            node_name: NODE.to_owned(),
            revision: revision.to_owned(),
            zone: zone.map(str::to_owned),
            pod_cidrs: vec!["10.244.1.0/24".to_owned()],
            addresses: vec!["127.0.0.1".to_owned()],
            local_traffic: LocalTrafficDetection {
                mode: LocalTrafficMode::ClusterCIDR,
                cidrs: vec!["10.244.0.0/16".to_owned()],
                interface: None,
            },
            overlay,
            ineligible: None,
            service_cidrs: Vec::new(),
        },
        status: None,
    }
}

// ---------------------------------------------------------------------------------------
// HTTP

/// A free TCP port on 127.0.0.1 (bound and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` on `address`: the status code and the body.
pub async fn http_get(address: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map_or_else(String::new, |(_, body)| body.to_owned());
    Ok((status, body))
}
