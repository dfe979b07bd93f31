//! A mock API server for the controller's API tests (kube-rs controller-rs `fixtures.rs`
//! style), and builders for the few cluster objects those tests need.
//!
//! The code under test talks to a `kube::Client` backed by `tower_test::mock`; the test
//! drives the other end through [`ApiServerVerifier`], asserting each request's method,
//! exact path and query, and body, and answering it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{self, SendResponse};

/// How long the verifier waits for a request that must come.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the verifier listens to conclude that no request comes.
pub const QUIET_PERIOD: Duration = Duration::from_millis(300);

/// Query of every server-side apply the controller makes, exactly as kube 5 encodes it.
pub const APPLY_QUERY: &str = "?&force=true&fieldManager=proxyplan-controller";
/// Content type of a server-side apply patch.
pub const APPLY_CONTENT_TYPE: &str = "application/apply-patch+yaml";

/// Collection path of `NodeProxyPlan`s (cluster-scoped).
pub const PLANS: &str = "/apis/proxyplan.dev/v1alpha1/nodeproxyplans";
/// Collection path of `ServiceProxyPlan`s in namespace [`NS`].
pub const SERVICE_PLANS: &str = "/apis/proxyplan.dev/v1alpha1/namespaces/default/serviceproxyplans";

/// The server-side apply URI of plan `name`.
pub fn plan_apply_uri(name: &str) -> String {
    format!("{PLANS}/{name}{APPLY_QUERY}")
}

/// The server-side apply URI of Service plan `default/name`.
pub fn service_plan_apply_uri(name: &str) -> String {
    format!("{SERVICE_PLANS}/{name}{APPLY_QUERY}")
}

/// The GET URI of Service plan `default/name`.
pub fn service_plan_uri(name: &str) -> String {
    format!("{SERVICE_PLANS}/{name}")
}

/// The replace (PUT) URI of Service plan `default/name`, under the controller's field
/// manager.
pub fn service_plan_replace_uri(name: &str) -> String {
    format!("{SERVICE_PLANS}/{name}?&fieldManager=proxyplan-controller")
}

/// The DELETE URI of plan `name` (kube 5 leaves an empty query).
pub fn plan_delete_uri(name: &str) -> String {
    format!("{PLANS}/{name}?")
}

/// The DELETE URI of Service plan `default/name` (kube 5 leaves an empty query).
pub fn service_plan_delete_uri(name: &str) -> String {
    format!("{SERVICE_PLANS}/{name}?")
}

// ---------------------------------------------------------------------------------------
// The mock API server

/// The test's end of the mock API server.
pub struct ApiServerVerifier {
    handle: mock::Handle<Request<Body>, Response<Body>>,
}

/// One request the code under test sent, waiting for its response.
pub struct Received {
    /// HTTP method.
    pub method: Method,
    /// Path and query, exactly as sent.
    pub uri: String,
    /// `Content-Type`, if any.
    pub content_type: Option<String>,
    /// The body as JSON (`null` when empty).
    pub body: Value,
    respond: SendResponse<Response<Body>>,
}

impl std::fmt::Debug for Received {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.method, self.uri, self.body)
    }
}

impl Received {
    /// Answers with `status` and a JSON body.
    pub fn respond(self, status: u16, body: &Value) {
        let response = Response::builder()
            .status(StatusCode::from_u16(status).expect("valid status code"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(
                serde_json::to_vec(body).expect("serializable JSON"),
            ))
            .expect("valid response");
        self.respond.send_response(response);
    }

    /// Answers 200 with the request body echoed back, as an apply that created or
    /// updated exactly what was sent.
    pub fn echo(self) {
        let body = self.body.clone();
        self.respond(200, &body);
    }

    /// Answers with a `Status` failure of the given code and reason.
    pub fn fail(self, code: u16, reason: &str) {
        let status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": format!("mock API server: {reason}"),
            "reason": reason,
            "code": code,
        });
        self.respond(code, &status);
    }

    /// Answers 404 NotFound.
    pub fn not_found(self) {
        self.fail(404, "NotFound");
    }

    /// Answers 409 Conflict.
    pub fn conflict(self) {
        self.fail(409, "Conflict");
    }

    /// Answers 200 with a `Status` success, as the API server does for a delete.
    pub fn deleted(self) {
        let status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
        });
        self.respond(200, &status);
    }
}

impl ApiServerVerifier {
    /// A client whose requests this verifier receives.
    pub fn new() -> (kube::Client, Self) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        (kube::Client::new(service, "default"), Self { handle })
    }

    /// The next request; fails the test when none comes within [`REQUEST_TIMEOUT`].
    pub async fn next(&mut self) -> Received {
        let (request, respond) =
            match tokio::time::timeout(REQUEST_TIMEOUT, self.handle.next_request()).await {
                Ok(Some(pair)) => pair,
                Ok(None) => panic!("expected a request, but the client is gone"),
                Err(_) => panic!("expected a request, none came within {REQUEST_TIMEOUT:?}"),
            };
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.expect("request body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("request body is JSON")
        };
        Received {
            method: parts.method,
            uri: parts
                .uri
                .path_and_query()
                .map_or_else(String::new, |pq| pq.as_str().to_owned()),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            body,
            respond,
        }
    }

    /// The next request, which must be `method uri`.
    pub async fn expect(&mut self, method: Method, uri: &str) -> Received {
        let request = self.next().await;
        assert_eq!(
            (&request.method, request.uri.as_str()),
            (&method, uri),
            "unexpected request {request:?}"
        );
        request
    }

    /// The next request, which must be a server-side apply to `uri`.
    pub async fn expect_apply(&mut self, uri: &str) -> Received {
        let request = self.expect(Method::PATCH, uri).await;
        assert_eq!(
            request.content_type.as_deref(),
            Some(APPLY_CONTENT_TYPE),
            "{uri}: not a server-side apply"
        );
        request
    }

    /// The next request, which must be a DELETE of `uri` with default delete options.
    pub async fn expect_delete(&mut self, uri: &str) -> Received {
        let request = self.expect(Method::DELETE, uri).await;
        assert_eq!(request.body, json!({}), "{uri}: delete options");
        request
    }

    /// The next `n` requests, sorted by URI: for writes the code under test sends
    /// concurrently, in no defined order.
    pub async fn next_batch(&mut self, n: usize) -> Vec<Received> {
        let mut batch = Vec::with_capacity(n);
        for _ in 0..n {
            batch.push(self.next().await);
        }
        batch.sort_by(|a, b| a.uri.cmp(&b.uri));
        batch
    }

    /// Fails the test if a request arrives within [`QUIET_PERIOD`].
    pub async fn expect_quiet(&mut self) {
        if let Ok(Some((request, _))) =
            tokio::time::timeout(QUIET_PERIOD, self.handle.next_request()).await
        {
            panic!(
                "expected no request, got {} {}",
                request.method(),
                request.uri()
            );
        }
    }

    /// Checks, without waiting, that no request is queued.
    pub fn expect_nothing_queued(&mut self) {
        use futures::FutureExt;
        if let Some(Some((request, _))) = self.handle.next_request().now_or_never() {
            panic!(
                "unexpected extra request {} {}",
                request.method(),
                request.uri()
            );
        }
    }

    /// Once every client is dropped: checks that no request is left and the channel
    /// closes.
    pub async fn expect_closed(mut self) {
        match tokio::time::timeout(REQUEST_TIMEOUT, self.handle.next_request()).await {
            Ok(None) => {}
            Ok(Some((request, _))) => panic!(
                "unexpected extra request {} {}",
                request.method(),
                request.uri()
            ),
            Err(_) => panic!("a client is still alive after the scenario"),
        }
    }
}

/// Runs the code under test and the verifier's script together, failing the test when
/// either hangs.
pub async fn scenario<A, B>(
    code: impl Future<Output = A>,
    verifier: impl Future<Output = B>,
) -> (A, B) {
    tokio::time::timeout(Duration::from_secs(20), async {
        tokio::join!(code, verifier)
    })
    .await
    .expect("scenario timed out")
}

// ---------------------------------------------------------------------------------------
// Cluster objects

/// Namespace of the Services.
pub const NS: &str = "default";

/// A ready Node named `name` in `zone`, with an InternalIP, a pod CIDR and, when given,
/// a `metadata.uid`.
pub fn mk_node(name: &str, zone: &str, uid: Option<&str>, index: u8) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            uid: uid.map(str::to_owned),
            resource_version: Some("1".to_owned()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_owned(), name.to_owned()),
                ("topology.kubernetes.io/zone".to_owned(), zone.to_owned()),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: Some(format!("10.244.{index}.0/24")),
            pod_cidrs: Some(vec![format!("10.244.{index}.0/24")]),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".to_owned(),
                address: format!("192.168.0.{index}"),
            }]),
            conditions: Some(vec![ready_condition(0)]),
            ..NodeStatus::default()
        }),
    }
}

/// A Ready condition last heard `seconds` after an arbitrary epoch.
pub fn ready_condition(seconds: i64) -> NodeCondition {
    NodeCondition {
        type_: "Ready".to_owned(),
        status: "True".to_owned(),
        last_heartbeat_time: Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + seconds)
                .expect("valid timestamp"),
        )),
        ..NodeCondition::default()
    }
}

/// The same node after a kubelet heartbeat: only status and resourceVersion differ.
pub fn heartbeat(mut node: Node, seconds: i64) -> Node {
    node.metadata.resource_version = Some(format!("{}", 100 + seconds));
    if let Some(status) = node.status.as_mut() {
        status.conditions = Some(vec![ready_condition(seconds)]);
    }
    node
}

/// A ClusterIP Service with Cluster traffic policies and one TCP port `http` (80 → 8080).
pub fn mk_service(name: &str, cluster_ip: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(NS.to_owned()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("1".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            cluster_ip: Some(cluster_ip.to_owned()),
            cluster_ips: Some(vec![cluster_ip.to_owned()]),
            ip_families: Some(vec!["IPv4".to_owned()]),
            internal_traffic_policy: Some("Cluster".to_owned()),
            ports: Some(vec![ServicePort {
                name: Some("http".to_owned()),
                protocol: Some("TCP".to_owned()),
                port: 80,
                target_port: Some(IntOrString::Int(8080)),
                ..ServicePort::default()
            }]),
            selector: Some(BTreeMap::from([("app".to_owned(), name.to_owned())])),
            session_affinity: Some("None".to_owned()),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// An IPv4 EndpointSlice of Service `service` with port `http` (8080) and ready
/// endpoints `(ip, node)`.
pub fn mk_slice(name: &str, service: &str, endpoints: &[(&str, &str)]) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(NS.to_owned()),
            resource_version: Some("1".to_owned()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/service-name".to_owned(), service.to_owned()),
                (
                    "endpointslice.kubernetes.io/managed-by".to_owned(),
                    "endpointslice-controller.k8s.io".to_owned(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".to_owned(),
        endpoints: endpoints
            .iter()
            .map(|(ip, node)| Endpoint {
                addresses: vec![(*ip).to_owned()],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                node_name: Some((*node).to_owned()),
                ..Endpoint::default()
            })
            .collect(),
        ports: Some(vec![EndpointPort {
            name: Some("http".to_owned()),
            protocol: Some("TCP".to_owned()),
            port: Some(8080),
            app_protocol: None,
        }]),
    }
}
