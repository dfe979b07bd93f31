//! API tests of `proxyplan-agent run`: the agent against a mock API server that logs and
//! asserts every request (the watches' exact URIs, each status patch's URI and body) and
//! a fake dataplane that records what it is asked to program.
//!
//! The cluster in every scenario: node `node-a` in zone `eu-west-1a`; Service plan
//! `default/web` holds the ClusterIP Service `web`, `default/lb` the LoadBalancer Service
//! `lb` with `externalTrafficPolicy: Local` and a health-check node port; the node's
//! overlay gives `lb` its local endpoints. Another node's plan exists too, and the agent
//! must never ask for it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod run_support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use proxyplan_agent::run::{Agent, ProxyMode, RunError, Settings};
use proxyplan_crds::{NodeProxyPlan, ServiceProxyPlan};
use run_support::{
    Call, FakeDataplane, FakeHandle, MockApi, NODE, PLANS, SERVICES, TIMEOUT, ZONE, free_port,
    http_get, local_override, mk_entry, mk_local_entry, mk_plan, mk_service, with_zone,
};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const LB_KEY: &str = "default/lb:http/TCP/IPv4";

// ---------------------------------------------------------------------------------------
// The cluster

fn web(revision: &str, web_endpoints: &[&str]) -> ServiceProxyPlan {
    mk_service(
        "web",
        revision,
        vec![mk_entry("web", "10.96.0.10", web_endpoints)],
    )
}

fn lb(health_check_node_port: u16) -> ServiceProxyPlan {
    mk_service(
        "lb",
        "lb-1",
        vec![mk_local_entry("lb", "10.96.0.20", health_check_node_port)],
    )
}

/// `node-a`'s plan: `lb`'s local endpoints on this node.
fn plan(revision: &str, local: &[&str]) -> NodeProxyPlan {
    mk_plan(revision, Some(ZONE), vec![local_override(LB_KEY, local)])
}

/// Puts the cluster: the Service plans and node-a's plan, plus another node's plan the
/// agent must not watch.
fn put_cluster(api: &MockApi, health_check_node_port: u16) {
    api.put_service(&web("web-1", &["10.244.1.10", "10.244.2.10"]));
    api.put_service(&lb(health_check_node_port));
    api.put_plan(&plan("p1", &["10.244.1.20"]));
    let mut other = mk_plan("q1", Some("eu-west-1b"), Vec::new());
    other.metadata.name = Some("node-b".to_owned());
    other.spec.node_name = "node-b".to_owned();
    api.put_plan(&other);
}

/// Objects [`put_cluster`] writes: the resourceVersion every first list returns.
const CLUSTER_RV: u64 = 4;

// ---------------------------------------------------------------------------------------
// The agent

fn settings() -> Settings {
    Settings {
        node_name: NODE.to_owned(),
        kubeconfig: None,
        mode: ProxyMode::Iptables,
        nodeport_addresses: vec!["127.0.0.0/8".parse().unwrap()],
        min_sync_interval: Duration::from_millis(20),
        sync_period: Duration::from_secs(60),
        tamper_check_interval: Duration::ZERO,
        status_min_interval: Duration::from_secs(60),
        rollout_report_interval: Duration::from_secs(10),
        healthz_bind_address: ([127, 0, 0, 1], 0).into(),
        metrics_bind_address: ([127, 0, 0, 1], 0).into(),
        state_dir: None,
        nodeport_primary: false,
    }
}

struct Harness {
    api: MockApi,
    dataplane: FakeHandle,
    healthz: SocketAddr,
    metrics: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), RunError>>,
}

async fn start(settings: Settings, setup: impl FnOnce(&MockApi)) -> Harness {
    let (client, api) = MockApi::new();
    setup(&api);
    start_with(settings, client, api).await
}

async fn start_with(settings: Settings, client: kube::Client, api: MockApi) -> Harness {
    start_on_kernel(settings, client, api, true).await
}

/// [`start_with`] on a kernel that holds the agent's rules (`intact`) or lost them.
async fn start_on_kernel(
    settings: Settings,
    client: kube::Client,
    api: MockApi,
    intact: bool,
) -> Harness {
    let (fake, dataplane) = FakeDataplane::new();
    dataplane
        .intact
        .store(intact, std::sync::atomic::Ordering::SeqCst);
    let agent = Agent::bind(settings, client, fake).await.unwrap();
    let healthz = agent.healthz_address();
    let metrics = agent.metrics_address();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(async {
        let _ = stopped.await;
    }));
    Harness {
        api,
        dataplane,
        healthz,
        metrics,
        stop,
        task,
    }
}

impl Harness {
    /// Stops the agent; it must stop cleanly.
    async fn stop(self) -> MockApi {
        let Self {
            api, stop, task, ..
        } = self;
        stop.send(()).unwrap();
        tokio::time::timeout(TIMEOUT, task)
            .await
            .expect("the agent stops")
            .unwrap()
            .unwrap();
        api
    }

    /// The first sync and status patch of [`put_cluster`]'s plan. Returns the patch body.
    async fn first_sync(&mut self) -> Value {
        let (plan, ok) = self.dataplane.next_sync().await;
        assert!(ok);
        assert_eq!(plan.revision, "p1");
        self.api.expect_status_patch(NODE).await
    }

    async fn metrics(&self) -> String {
        let (code, body) = http_get(self.metrics, "/metrics").await.unwrap();
        assert_eq!(code, 200);
        body
    }
}

// ---------------------------------------------------------------------------------------
// Assertions

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

/// Asserts a condition's status and reason, and its observedGeneration.
fn assert_condition(status: &Value, type_: &str, expected: &str, reason: &str, generation: i64) {
    let c = condition(status, type_);
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some(expected), Some(reason)),
        "{type_}: {c}"
    );
    assert_eq!(c["observedGeneration"], json!(generation), "{type_}: {c}");
    assert!(c["lastTransitionTime"].is_string(), "{type_}: {c}");
    assert!(c["message"].is_string(), "{type_}: {c}");
}

fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} not in\n{text}"))
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Polls `GET address/path` until `check` holds.
async fn eventually_http(
    address: SocketAddr,
    path: &str,
    check: impl Fn(u16, &Value) -> bool,
) -> (u16, Value) {
    let mut last = None;
    let result = tokio::time::timeout(TIMEOUT, async {
        loop {
            if let Ok((code, body)) = http_get(address, path).await {
                let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                if check(code, &body) {
                    return (code, body);
                }
                last = Some((code, body));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    result.unwrap_or_else(|_| panic!("GET {address}{path}: condition never held; last {last:?}"))
}

// ---------------------------------------------------------------------------------------
// Scenarios

/// The agent lists and watches its own plan by name and the controller's Service plans
/// by label, and nothing else; programs the merged plan; and writes a status that says
/// so, by server-side apply to /status under its own field manager.
#[tokio::test]
async fn watches_only_its_plan_and_the_service_plans_then_programs_and_reports_ready() {
    let hc_port = free_port();
    let mut agent = start(settings(), |api| put_cluster(api, hc_port)).await;

    let (merged, ok) = agent.dataplane.next_sync().await;
    assert!(ok);
    assert_eq!(merged.node_name, NODE);
    assert_eq!(merged.revision, "p1");
    assert!(merged.refused.is_empty() && merged.unmatched.is_empty());
    let keys: Vec<&str> = merged
        .service_ports
        .iter()
        .map(|e| e.key.as_str())
        .collect();
    assert_eq!(keys, [LB_KEY, "default/web:http/TCP/IPv4"]);
    assert_eq!(
        merged.service_ports[0].local_endpoints.len(),
        1,
        "overlay merged"
    );

    let body = agent.api.expect_status_patch(NODE).await;
    assert_eq!(body["apiVersion"], "proxyplan.dev/v1alpha1");
    assert_eq!(body["kind"], "NodeProxyPlan");
    assert_eq!(body["metadata"], json!({ "name": NODE }));
    assert!(
        body.get("spec").is_none(),
        "the agent never applies the spec"
    );
    let status = &body["status"];
    assert_condition(status, "Ready", "True", "Synced", 1);
    assert_condition(status, "Degraded", "False", "AsExpected", 1);
    assert_eq!(status["appliedRevision"], "p1");
    assert!(status.get("appliedShards").is_none(), "{status}");
    assert_eq!(status["servicePorts"], 2);
    // web: 2 cluster endpoints; lb: 2 cluster endpoints + 1 of them local.
    assert_eq!(status["endpoints"], 4);
    assert_eq!(status["mode"], "iptables");
    assert_eq!(status["agentVersion"], env!("CARGO_PKG_VERSION"));
    assert!(status["syncDurationSeconds"].is_number());

    agent.api.wait_for_watches(2).await;
    let mut reads = agent.api.reads();
    reads.sort();
    let rv = CLUSTER_RV;
    let managed = "app.kubernetes.io%2Fmanaged-by%3Dproxyplan-controller";
    let mut expected = vec![
        // Lists from the watch cache, in one response: no older than anything (1) at first.
        format!(
            "GET {PLANS}?&fieldSelector=metadata.name%3Dnode-a&resourceVersion=1&resourceVersionMatch=NotOlderThan"
        ),
        format!(
            "GET {PLANS}?&watch=true&timeoutSeconds=290&fieldSelector=metadata.name%3Dnode-a&allowWatchBookmarks=true&resourceVersion={rv}"
        ),
        format!(
            "GET {SERVICES}?&labelSelector={managed}&resourceVersion=1&resourceVersionMatch=NotOlderThan"
        ),
        format!(
            "GET {SERVICES}?&watch=true&timeoutSeconds=290&labelSelector={managed}&allowWatchBookmarks=true&resourceVersion={rv}"
        ),
    ];
    expected.sort();
    assert_eq!(reads, expected);

    agent.api.expect_quiet().await;
    agent.stop().await;
}

/// Nothing changed, nothing written: not for a re-sent plan or Service plan, not for the
/// periodic resyncs (whose canary check runs, and whose sync durations differ), even
/// with a status interval short enough to let any real change through.
#[tokio::test]
async fn no_status_patch_when_nothing_changed() {
    let hc_port = free_port();
    let mut agent = start(
        Settings {
            sync_period: Duration::from_millis(150),
            tamper_check_interval: Duration::ZERO,
            status_min_interval: Duration::from_millis(50),
            rollout_report_interval: Duration::from_secs(10),
            ..settings()
        },
        |api| put_cluster(api, hc_port),
    )
    .await;
    agent.dataplane.slow.store(true, Ordering::SeqCst);
    agent.first_sync().await;

    // Same specs again (a relabel, a controller re-apply): no sync, no write.
    agent.api.put_plan(&plan("p1", &["10.244.1.20"]));
    agent
        .api
        .put_service(&web("web-1", &["10.244.1.10", "10.244.2.10"]));

    // Periodic resyncs: canary check, then sync of the same plan; no status write.
    for _ in 0..3 {
        assert!(matches!(
            agent.dataplane.next_call().await,
            Call::RulesIntact(true)
        ));
        let (plan, ok) = agent.dataplane.next_sync().await;
        assert_eq!((plan.revision.as_str(), ok), ("p1", true));
    }
    agent.api.expect_quiet().await;
    let metrics = agent.metrics().await;
    assert!(
        metric_value(
            &metrics,
            "kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family=\"IPv4\"}"
        ) > 0.01
    );

    // Someone flushed the rules: the canary says so, the resync restores them.
    agent.dataplane.intact.store(false, Ordering::SeqCst);
    loop {
        if matches!(agent.dataplane.next_call().await, Call::RulesIntact(false)) {
            break;
        }
    }
    let (plan, ok) = agent.dataplane.next_sync().await;
    assert_eq!((plan.revision.as_str(), ok), ("p1", true));
    let metrics = agent.metrics().await;
    assert!(metric_value(&metrics, "proxyplan_agent_canary_missing_total") >= 1.0);
    agent.api.expect_quiet().await;
    agent.stop().await;
}

/// An endpoint change of a Cluster-policy Service rewrites its Service plan, which every
/// node receives: the kernel is updated at once, but the status write that only changes
/// counts waits for the status interval, and a burst costs one.
#[tokio::test]
async fn service_change_syncs_at_once_and_writes_status_at_most_once_per_interval() {
    let hc_port = free_port();
    let mut agent = start(
        Settings {
            status_min_interval: Duration::from_secs(3),
            rollout_report_interval: Duration::from_secs(10),
            ..settings()
        },
        |api| put_cluster(api, hc_port),
    )
    .await;
    let first = agent.first_sync().await;

    let web_of = |plan: &proxyplan_crds::MergedPlan| {
        plan.service_ports
            .iter()
            .find(|e| e.name == "web")
            .map(|e| e.cluster_endpoints.len())
    };
    agent
        .api
        .put_service(&web("web-2", &["10.244.1.10", "10.244.2.11"]));
    let (plan, ok) = agent.dataplane.next_sync().await;
    assert!(ok);
    assert_eq!(web_of(&plan), Some(2));
    agent.api.put_service(&web("web-3", &["10.244.1.10"]));
    let (plan, _) = agent.dataplane.next_sync().await;
    assert_eq!(web_of(&plan), Some(1));
    agent.api.expect_quiet().await;

    let body = agent.api.expect_status_patch(NODE).await;
    let status = &body["status"];
    assert_eq!(status["endpoints"], 3);
    assert_eq!(status["appliedRevision"], "p1");
    assert_eq!(
        status["conditions"], first["status"]["conditions"],
        "conditions unchanged, transition times kept"
    );
    agent.api.expect_quiet().await;
    agent.stop().await;
}

/// The rollout mark: every Service plan change up to it is in the kernel. The first
/// after a quiet time is reported at once, then at most once per report interval; a
/// Service plan status write (the controller's rollout status) is no change to program
/// and moves nothing.
#[tokio::test]
async fn the_rollout_mark_is_reported_at_once_after_a_quiet_time_then_rate_limited() {
    let hc_port = free_port();
    let mut agent = start(
        Settings {
            status_min_interval: Duration::from_secs(60),
            rollout_report_interval: Duration::from_secs(1),
            ..settings()
        },
        |api| put_cluster(api, hc_port),
    )
    .await;
    let first = agent.first_sync().await;
    let mark = |body: &serde_json::Value| {
        body["status"]["programmedResourceVersion"]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let listed = mark(&first);
    assert!(
        listed > 0,
        "the first status carries the listed mark: {first}"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let version = agent
        .api
        .put_service(&web("web-2", &["10.244.1.10", "10.244.2.11"]));
    agent.dataplane.next_sync().await;
    let body = tokio::time::timeout(
        Duration::from_millis(500),
        agent.api.expect_status_patch(NODE),
    )
    .await
    .expect("the first mark after a quiet time goes at once");
    assert_eq!(mark(&body).to_string(), version);

    // A status write on the Service plan: no sync, no new mark.
    agent.api.put_service_status(
        "default/web",
        serde_json::json!({"rollout": {"revision": "web-2",
            "nodes": 1, "programmed": 1, "progress": "1/1"}}),
    );
    // Two changes at once: the second mark waits out the interval, with the newest.
    agent.api.put_service(&web("web-3", &["10.244.1.10"]));
    agent.dataplane.next_sync().await;
    let newest = agent
        .api
        .put_service(&web("web-4", &["10.244.1.10", "10.244.2.12"]));
    agent.dataplane.next_sync().await;
    let started = tokio::time::Instant::now();
    let body = agent.api.expect_status_patch(NODE).await;
    assert!(
        started.elapsed() > Duration::from_millis(300),
        "held for the interval"
    );
    assert_eq!(mark(&body).to_string(), newest);
    agent.api.expect_quiet().await;
    agent.stop().await;
}

/// A node-specific change (a new plan revision) is written at once, with the new
/// observedGeneration.
#[tokio::test]
async fn plan_revision_change_writes_status_at_once() {
    let hc_port = free_port();
    let mut agent = start(settings(), |api| put_cluster(api, hc_port)).await;
    agent.first_sync().await;

    agent
        .api
        .put_plan(&plan("p2", &["10.244.1.20", "10.244.1.21"]));
    let (merged, ok) = agent.dataplane.next_sync().await;
    assert_eq!((merged.revision.as_str(), ok), ("p2", true));
    let body = tokio::time::timeout(Duration::from_secs(2), agent.api.expect_status_patch(NODE))
        .await
        .expect("written at once, not held for the status interval");
    let status = &body["status"];
    assert_eq!(status["appliedRevision"], "p2");
    assert_condition(status, "Ready", "True", "Synced", 2);
    assert_eq!(status["endpoints"], 5);
    agent.stop().await;
}

/// A plan that fails validation is refused whole: the kernel keeps the last good plan
/// (resynced periodically), the status says Degraded/InvalidPlan naming the field; a
/// fixed plan is programmed again.
#[tokio::test]
async fn invalid_plan_is_refused_whole_and_the_last_good_plan_stays() {
    let hc_port = free_port();
    let mut agent = start(
        Settings {
            sync_period: Duration::from_millis(300),
            tamper_check_interval: Duration::ZERO,
            ..settings()
        },
        |api| put_cluster(api, hc_port),
    )
    .await;
    agent.first_sync().await;

    let mut bad = plan("p2", &["10.244.1.20"]);
    bad.spec.pod_cidrs = vec!["10.244.1.0/99".to_owned()];
    agent.api.put_plan(&bad);
    let body = agent.api.expect_status_patch(NODE).await;
    let status = &body["status"];
    assert_condition(status, "Ready", "False", "InvalidPlan", 2);
    assert_condition(status, "Degraded", "True", "InvalidPlan", 2);
    let message = condition(status, "Degraded")["message"].as_str().unwrap();
    assert!(
        message.contains("NodeProxyPlan/node-a: spec.podCIDRs[0]"),
        "{message}"
    );
    assert_eq!(status["appliedRevision"], "p1", "the last good plan stays");

    // The periodic resync programs the last good plan, never the refused one.
    for _ in 0..2 {
        let (merged, ok) = agent.dataplane.next_sync().await;
        assert_eq!((merged.revision.as_str(), ok), ("p1", true));
    }
    let metrics = agent.metrics().await;
    assert_eq!(
        metric_value(
            &metrics,
            "proxyplan_agent_invalid_plans_total{reason=\"invalid_field\"}"
        ),
        1.0
    );

    agent.api.put_plan(&plan("p3", &["10.244.1.20"]));
    loop {
        let (merged, _) = agent.dataplane.next_sync().await;
        if merged.revision == "p3" {
            break;
        }
    }
    let body = agent.api.expect_status_patch(NODE).await;
    assert_condition(&body["status"], "Ready", "True", "Synced", 3);
    assert_condition(&body["status"], "Degraded", "False", "AsExpected", 3);
    agent.stop().await;
}

/// An overlay for a Service plan the agent has not received is no reason to wait: the
/// rest is programmed, the status says Ready=False WaitingForServicePlans naming the
/// key; once the Service plan arrives, it is programmed and the status says Synced.
#[tokio::test]
async fn an_overlay_without_its_service_plan_is_reported_and_the_rest_programmed() {
    let hc_port = free_port();
    let mut agent = start(settings(), |api| {
        api.put_service(&web("web-1", &["10.244.1.10"]));
        api.put_plan(&plan("p1", &["10.244.1.20"]));
    })
    .await;
    let (merged, ok) = agent.dataplane.next_sync().await;
    assert!(ok);
    assert_eq!(merged.service_ports.len(), 1);
    assert_eq!(merged.unmatched, [LB_KEY]);
    let body = agent.api.expect_status_patch(NODE).await;
    let status = &body["status"];
    assert_condition(status, "Ready", "False", "WaitingForServicePlans", 1);
    assert_condition(status, "Degraded", "False", "AsExpected", 1);
    let message = condition(status, "Ready")["message"].as_str().unwrap();
    assert!(message.contains(LB_KEY), "{message}");
    assert_eq!(status["appliedRevision"], "p1");

    agent.api.put_service(&lb(hc_port));
    let (merged, ok) = agent.dataplane.next_sync().await;
    assert_eq!((merged.service_ports.len(), ok), (2, true));
    let body = agent.api.expect_status_patch(NODE).await;
    assert_condition(&body["status"], "Ready", "True", "Synced", 1);
    agent.stop().await;
}

/// A Service plan the agent cannot read (a field value from a newer controller) is
/// refused on its own: its last good version stays programmed, every other Service goes
/// on, and the status names the object and field (Degraded=True InvalidServicePlan).
#[tokio::test]
async fn an_undecodable_service_plan_is_refused_alone() {
    let hc_port = free_port();
    let mut agent = start(settings(), |api| put_cluster(api, hc_port)).await;
    agent.first_sync().await;

    let mut odd = serde_json::to_value(web("web-2", &["10.244.9.9"])).unwrap();
    odd["spec"]["servicePorts"][0]["protocol"] = json!("QUIC");
    agent.api.put_service_json(odd);
    // Nothing to program (the last good version stays), but the status says why.
    let body = agent.api.expect_status_patch(NODE).await;
    let status = &body["status"];
    assert_condition(status, "Ready", "True", "Synced", 1);
    assert_condition(status, "Degraded", "True", "InvalidServicePlan", 1);
    let message = condition(status, "Degraded")["message"].as_str().unwrap();
    assert!(
        message.contains("ServiceProxyPlan/default/web: spec.servicePorts[0].protocol"),
        "{message}"
    );

    // The other Services still change.
    agent.api.put_service(&mk_service(
        "lb",
        "lb-2",
        vec![mk_local_entry("lb", "10.96.0.21", hc_port)],
    ));
    let (merged, _) = agent.dataplane.next_sync().await;
    assert!(
        merged
            .service_ports
            .iter()
            .any(|e| e.cluster_ip == "10.96.0.21")
    );
    let web_entry = merged
        .service_ports
        .iter()
        .find(|e| e.name == "web")
        .unwrap();
    assert_eq!(
        web_entry.cluster_endpoints.len(),
        2,
        "the last good version"
    );
    agent.stop().await;
}

/// Zone lists: the node merges its zone's list into `clusterEndpoints`, and follows the
/// plan when the node's zone changes, with the same two watches.
#[tokio::test]
async fn zone_lists_follow_the_plans_zone() {
    let hc_port = free_port();
    let zoned = || {
        let entry = mk_entry("zoned", "10.96.0.30", &["10.244.1.30", "10.244.2.30"]);
        let entry = with_zone(entry, ZONE, &["10.244.1.30"]);
        mk_service(
            "zoned",
            "z-1",
            vec![with_zone(entry, "eu-west-1b", &["10.244.2.30"])],
        )
    };
    let mut agent = start(settings(), |api| {
        put_cluster(api, hc_port);
        api.put_service(&zoned());
    })
    .await;
    let zoned_of = |plan: &proxyplan_crds::MergedPlan| {
        let entry = plan
            .service_ports
            .iter()
            .find(|e| e.name == "zoned")
            .unwrap_or_else(|| {
                panic!(
                    "{:?} {:?}",
                    plan.service_ports
                        .iter()
                        .map(|e| &e.key)
                        .collect::<Vec<_>>(),
                    plan.unmatched
                )
            });
        assert!(
            entry.zone_endpoints.is_empty(),
            "zone lists are merged away"
        );
        entry
            .cluster_endpoints
            .iter()
            .map(|e| e.ip.clone())
            .collect::<Vec<_>>()
    };
    let (merged, _) = agent.dataplane.next_sync().await;
    assert!(merged.refused.is_empty(), "{:?}", merged.refused);
    assert_eq!(zoned_of(&merged), ["10.244.1.30"]);
    agent.api.expect_status_patch(NODE).await;

    let moved = mk_plan(
        "p2",
        Some("eu-west-1b"),
        vec![local_override(LB_KEY, &["10.244.1.20"])],
    );
    agent.api.put_plan(&moved);
    let (merged, ok) = agent.dataplane.next_sync().await;
    assert_eq!((merged.revision.as_str(), ok), ("p2", true));
    assert_eq!(zoned_of(&merged), ["10.244.2.30"]);
    let unzoned = mk_plan("p3", Some("eu-west-1c"), Vec::new());
    agent.api.put_plan(&unzoned);
    let (merged, _) = agent.dataplane.next_sync().await;
    assert_eq!(zoned_of(&merged), ["10.244.1.30", "10.244.2.30"]);
    assert_eq!(agent.api.open_watches().len(), 2);
    agent.stop().await;
}

/// Failing syncs: Degraded with the error's reason, errors counted by label, and
/// /healthz answers 503 once a change has waited 2 × sync period; it recovers when a
/// sync succeeds.
#[tokio::test]
async fn failing_syncs_degrade_and_flip_healthz_to_503() {
    let hc_port = free_port();
    let mut agent = start(
        Settings {
            sync_period: Duration::from_millis(200),
            tamper_check_interval: Duration::ZERO,
            ..settings()
        },
        |api| put_cluster(api, hc_port),
    )
    .await;
    agent.dataplane.fail.store(true, Ordering::SeqCst);
    let (_, ok) = agent.dataplane.next_sync().await;
    assert!(!ok);
    let body = agent.api.expect_status_patch(NODE).await;
    let status = &body["status"];
    assert_condition(status, "Ready", "False", "SyncFailed", 1);
    assert_condition(status, "Degraded", "True", "ToolFailed", 1);
    let message = condition(status, "Degraded")["message"].as_str().unwrap();
    assert!(message.contains("iptables-restore"), "{message}");
    assert!(status.get("appliedRevision").is_none());

    let (code, body) = eventually_http(agent.healthz, "/healthz", |code, _| code == 503).await;
    assert_eq!(code, 503);
    assert!(body["currentTime"].is_string(), "{body}");
    let metrics = agent.metrics().await;
    assert!(
        metric_value(
            &metrics,
            "proxyplan_agent_sync_errors_total{reason=\"tool_failed\"}"
        ) >= 1.0
    );
    assert!(
        metric_value(
            &metrics,
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"}"
        ) >= 1.0
    );

    agent.dataplane.fail.store(false, Ordering::SeqCst);
    eventually_http(agent.healthz, "/healthz", |code, _| code == 200).await;
    let body = agent.api.expect_status_patch(NODE).await;
    assert_condition(&body["status"], "Ready", "True", "Synced", 1);
    assert_eq!(body["status"]["appliedRevision"], "p1");
    agent.stop().await;
}

/// An nftables-mode agent with `tamper_check_interval`, synced once with plan p1.
async fn nftables_agent(tamper_check_interval: Duration) -> Harness {
    let mut settings = settings();
    settings.mode = ProxyMode::Nftables;
    settings.tamper_check_interval = tamper_check_interval;
    let mut agent = start(settings, |api| {
        put_cluster(api, 0);
        api.put_plan(&plan("p1", &[]));
    })
    .await;
    agent.first_sync().await;
    agent
}

/// nftables mode asks the kernel every --tamper-check-interval whether someone else
/// changed its table: a change found is repaired at once, long before the periodic resync
/// (60 s here); nothing found, nothing is synced.
#[tokio::test]
async fn a_tampered_table_is_repaired_at_the_next_tamper_check() {
    let mut agent = nftables_agent(Duration::from_millis(100)).await;
    // Intact: checked, not synced.
    for _ in 0..3 {
        match agent.dataplane.next_call().await {
            Call::RulesIntact(true) => {}
            Call::RulesIntact(false) => panic!("the fake kernel is intact"),
            Call::Sync(plan, _) => {
                panic!("synced revision {} with nothing to repair", plan.revision)
            }
        }
    }
    let tampered = std::time::Instant::now();
    agent.dataplane.intact.store(false, Ordering::SeqCst);
    let (plan, ok) = agent.dataplane.next_sync().await;
    agent.dataplane.intact.store(true, Ordering::SeqCst);
    let took = tampered.elapsed();
    assert!(ok);
    assert_eq!(plan.revision, "p1");
    assert!(took < Duration::from_secs(5), "repaired after {took:?}");
    let metrics = agent.metrics().await;
    assert!(
        metric_value(&metrics, "proxyplan_agent_canary_missing_total") >= 1.0,
        "{metrics}"
    );
    agent.stop().await;
}

/// nftables mode does not wait for its next tamper check (an hour here) when nf_tables
/// announces that someone else changed the table: the change alarm runs the check at
/// once, which repairs what it finds, and an alarm with nothing changed syncs nothing.
#[tokio::test]
async fn the_change_alarm_runs_the_tamper_check_at_once() {
    let mut agent = nftables_agent(Duration::from_secs(3600)).await;
    // The first check is due at once; the next one in an hour.
    assert!(matches!(
        agent.dataplane.next_call().await,
        Call::RulesIntact(true)
    ));
    agent.dataplane.alarm.send(()).expect("alarm");
    match agent.dataplane.next_call().await {
        Call::RulesIntact(true) => {}
        other => panic!("an alarm over an intact table: {other:?}"),
    }
    agent.dataplane.intact.store(false, Ordering::SeqCst);
    agent.dataplane.alarm.send(()).expect("alarm");
    assert!(matches!(
        agent.dataplane.next_call().await,
        Call::RulesIntact(false)
    ));
    let (plan, ok) = agent.dataplane.next_sync().await;
    agent.dataplane.intact.store(true, Ordering::SeqCst);
    assert!(ok);
    assert_eq!(plan.revision, "p1");
    agent.stop().await;
}

/// Health-check node ports: 200 with the local endpoint count while the Service has
/// local endpoints, 503 with 0 when it has none, closed when the Service is gone.
#[tokio::test]
async fn health_check_node_port_answers_with_the_local_endpoint_count() {
    let hc_port = free_port();
    let mut agent = start(settings(), |api| {
        put_cluster(api, hc_port);
        api.put_plan(&plan("p1", &["10.244.1.20", "10.244.1.21"]));
    })
    .await;
    agent.first_sync().await;
    let address: SocketAddr = ([127, 0, 0, 1], hc_port).into();
    let (code, body) = eventually_http(address, "/", |code, _| code == 200).await;
    assert_eq!(code, 200);
    assert_eq!(
        body,
        json!({
            "service": { "namespace": "default", "name": "lb" },
            "localEndpoints": 2,
            "serviceProxyHealthy": true,
        })
    );

    // Only terminating pods left here: they still serve, but load balancers are told
    // to stop sending new connections (kube-proxy counts ready endpoints only).
    let mut draining = plan("p2", &["10.244.1.20"]);
    draining.spec.overlay[0].local_terminating = true;
    agent.api.put_plan(&draining);
    let (code, body) = eventually_http(address, "/", |code, _| code == 503).await;
    assert_eq!(code, 503);
    assert_eq!(body["localEndpoints"], 0);
    assert_eq!(agent.dataplane.next_sync().await.0.service_ports.len(), 2);

    agent.api.put_plan(&plan("p2b", &[]));
    let (code, body) = eventually_http(address, "/healthz", |code, body| {
        code == 503 && body["localEndpoints"] == 0
    })
    .await;
    assert_eq!(code, 503);
    assert_eq!(body["localEndpoints"], 0);
    assert_eq!(body["service"]["name"], "lb");

    let without_lb = mk_plan("p3", Some(ZONE), Vec::new());
    agent.api.put_plan(&without_lb);
    agent.api.delete_service("default/lb");
    tokio::time::timeout(TIMEOUT, async {
        while http_get(address, "/").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the health-check port closes");
    agent.stop().await;
}

/// /healthz fails while the node plan says the node is leaving (being deleted, or tainted
/// by the cluster autoscaler) so that load balancers drain it; /livez does not, so the
/// agent is not restarted; both carry kube-proxy's fields.
#[tokio::test]
async fn healthz_follows_node_eligibility_and_livez_does_not() {
    let hc_port = free_port();
    let mut agent = start(settings(), |api| put_cluster(api, hc_port)).await;
    agent.first_sync().await;
    let (code, body) = eventually_http(agent.healthz, "/healthz", |code, _| code == 200).await;
    assert_eq!(code, 200);
    assert_eq!(body["nodeEligible"], true);
    assert_eq!(body["healthy"], true);
    assert_eq!(body["status"]["IPv4"]["healthy"], true);

    let mut leaving = plan("p2", &["10.244.1.20"]);
    leaving.spec.ineligible = Some("the Node is being deleted".to_owned());
    agent.api.put_plan(&leaving);
    let (code, body) = eventually_http(agent.healthz, "/healthz", |code, _| code == 503).await;
    assert_eq!(code, 503);
    assert_eq!(body["nodeEligible"], false);
    assert_eq!(body["healthy"], true);
    let (code, body) = eventually_http(agent.healthz, "/livez", |_, _| true).await;
    assert_eq!(code, 200);
    assert!(body.get("nodeEligible").is_none(), "{body}");
    // The health-check node ports answer as before: kube-proxy leaves eligibility out.
    let address: SocketAddr = ([127, 0, 0, 1], hc_port).into();
    let (code, _) = eventually_http(address, "/", |code, _| code == 200).await;
    assert_eq!(code, 200);

    agent.api.put_plan(&plan("p3", &["10.244.1.20"]));
    eventually_http(agent.healthz, "/healthz", |code, _| code == 200).await;
    agent.stop().await;
}

/// /metrics uses kube-proxy's names and labels; an EndpointSlice change triggered 300 ms
/// before it reaches the agent (its time carried by the Service plan, as the controller annotates it)
/// shows in the network programming latency, and a Service-only change does not.
#[tokio::test]
async fn metrics_use_kube_proxy_names() {
    const V4: &str = "{ip_family=\"IPv4\"}";
    let count = |text: &str| {
        metric_value(
            text,
            &format!("kubeproxy_network_programming_duration_seconds_count{V4}"),
        )
    };
    let hc_port = free_port();
    let mut agent = start(settings(), |api| put_cluster(api, hc_port)).await;
    agent.first_sync().await;
    let mut text = agent.metrics().await;
    let syncs = format!("kubeproxy_sync_proxy_rules_duration_seconds_count{V4}");
    for _ in 0..100 {
        if text.contains(&syncs) && metric_value(&text, &syncs) >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        text = agent.metrics().await;
    }
    assert_eq!(metric_value(&text, &syncs), 1.0);
    assert_eq!(
        metric_value(
            &text,
            &format!("kubeproxy_sync_full_proxy_rules_duration_seconds_count{V4}")
        ),
        1.0,
        "the first sync is a full one"
    );
    assert!(
        metric_value(
            &text,
            &format!("kubeproxy_sync_proxy_rules_last_timestamp_seconds{V4}")
        ) > 1.7e9
    );
    assert_eq!(
        metric_value(&text, "proxyplan_agent_rules{mode=\"iptables\"}"),
        24.0
    );
    // The stale-UDP step of that sync, per family (the fake deleted 2 IPv4 entries).
    assert_eq!(
        metric_value(
            &text,
            &format!("kubeproxy_conntrack_reconciler_deleted_entries_total{V4}")
        ),
        2.0
    );
    assert_eq!(
        metric_value(
            &text,
            &format!("kubeproxy_conntrack_reconciler_sync_duration_seconds_count{V4}")
        ),
        1.0
    );
    assert!(
        !text.contains("kubeproxy_network_programming_duration_seconds_count"),
        "the initial list is not a change"
    );

    // Changes made before the agent started are not measured (as in kube-proxy): this one
    // is triggered after, and reaches the agent 300 ms later.
    let triggered = k8s_openapi::jiff::Timestamp::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut service = web("web-2", &["10.244.1.10"]);
    service.metadata.annotations = Some(
        [(
            proxyplan_crds::TRIGGER_TIME_ANNOTATION.to_owned(),
            triggered.to_string(),
        )]
        .into(),
    );
    agent.api.put_service(&service);
    agent.dataplane.next_sync().await;
    // The loop records the latency right after the dataplane returns: wait for it.
    let mut text = agent.metrics().await;
    for _ in 0..100 {
        if text.contains("kubeproxy_network_programming_duration_seconds_count")
            && count(&text) >= 1.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        text = agent.metrics().await;
    }
    assert_eq!(count(&text), 1.0);
    let latency = metric_value(
        &text,
        &format!("kubeproxy_network_programming_duration_seconds_sum{V4}"),
    );
    assert!((0.3..10.0).contains(&latency), "{latency}");
    assert_eq!(
        metric_value(&text, "kubeproxy_sync_proxy_rules_endpoint_changes_total"),
        1.0
    );
    assert_eq!(
        metric_value(
            &text,
            &format!("kubeproxy_sync_partial_proxy_rules_duration_seconds_count{V4}")
        ),
        1.0
    );

    // The same object rewritten for a Service change keeps its trigger time: not measured
    // again, counted as a Service change (the initial lists counted as some too).
    let services_before = metric_value(&text, "kubeproxy_sync_proxy_rules_service_changes_total");
    service.spec.service_ports[0].port = 8081;
    service.spec.revision = "web-3".to_owned();
    agent.api.put_service(&service);
    agent.dataplane.next_sync().await;
    let mut text = agent.metrics().await;
    for _ in 0..100 {
        if metric_value(&text, "kubeproxy_sync_proxy_rules_service_changes_total") > services_before
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        text = agent.metrics().await;
    }
    assert_eq!(count(&text), 1.0);
    assert_eq!(
        metric_value(&text, "kubeproxy_sync_proxy_rules_service_changes_total"),
        services_before + 1.0
    );
    let (code, _) = http_get(agent.healthz, "/healthz").await.unwrap();
    assert_eq!(code, 200);
    let text = agent.metrics().await;
    assert_eq!(
        metric_value(&text, "kubeproxy_proxy_healthz_total{code=\"200\"}"),
        1.0
    );
    agent.stop().await;
}

/// With the API server gone the agent keeps programming its last plan (periodic
/// resyncs go on) and stays healthy.
#[tokio::test]
async fn keeps_programming_the_last_plan_when_the_api_server_is_gone() {
    let hc_port = free_port();
    let mut agent = start(
        Settings {
            sync_period: Duration::from_millis(200),
            tamper_check_interval: Duration::ZERO,
            ..settings()
        },
        |api| put_cluster(api, hc_port),
    )
    .await;
    agent.first_sync().await;
    agent.api.go_offline();
    for _ in 0..3 {
        let (merged, ok) = agent.dataplane.next_sync().await;
        assert_eq!((merged.revision.as_str(), ok), ("p1", true));
    }
    let (code, _) = http_get(agent.healthz, "/healthz").await.unwrap();
    assert_eq!(code, 200);
    agent.stop().await;
}

/// A restarted agent finds the status it wrote before on the plan and, programming the
/// same plan, writes nothing.
#[tokio::test]
async fn restarted_agent_writes_no_status_when_it_is_the_same() {
    let hc_port = free_port();
    let mut agent = start(settings(), |api| put_cluster(api, hc_port)).await;
    let first = agent.first_sync().await;
    agent.stop().await;

    let (client, api) = MockApi::new();
    put_cluster(&api, hc_port);
    api.put_plan_with_status(&plan("p1", &["10.244.1.20"]), &first["status"]);
    let mut agent = start_with(settings(), client, api).await;
    let (merged, ok) = agent.dataplane.next_sync().await;
    assert_eq!((merged.revision.as_str(), ok), ("p1", true));
    agent.api.expect_quiet().await;
    agent.stop().await;
}

/// An agent restarted with a refused plan keeps the kernel as it was and stays live; its
/// health-check node ports answer what they answered before the restart (the record in
/// its state directory) while the kernel holds its rules, and stay closed on a kernel
/// that lost them (a flushed node: nothing is served there). The first plan it applies
/// takes over.
#[tokio::test]
async fn a_restart_with_a_refused_plan_answers_health_checks_as_before() {
    let hc_port = free_port();
    let state = std::env::temp_dir().join(format!("pp-run-api-state-{hc_port}"));
    let _ = std::fs::remove_dir_all(&state);
    let with_state = || Settings {
        state_dir: Some(state.clone()),
        ..settings()
    };
    let address: SocketAddr = ([127, 0, 0, 1], hc_port).into();
    let mut agent = start(with_state(), |api| {
        put_cluster(api, hc_port);
        api.put_plan(&plan("p1", &["10.244.1.20", "10.244.1.21"]));
    })
    .await;
    agent.first_sync().await;
    let (_, before) = eventually_http(address, "/", |code, _| code == 200).await;
    assert_eq!(before["localEndpoints"], 2);
    agent.stop().await;
    assert!(
        http_get(address, "/").await.is_err(),
        "the port closes with the agent"
    );

    let restart = |intact: bool| {
        let (client, api) = MockApi::new();
        put_cluster(&api, hc_port);
        let mut bad = plan("p2", &["10.244.1.20", "10.244.1.21"]);
        bad.spec.pod_cidrs = vec!["10.244.1.0/99".to_owned()];
        api.put_plan(&bad);
        start_on_kernel(with_state(), client, api, intact)
    };
    let mut agent = restart(true).await;
    let body = agent.api.expect_status_patch(NODE).await;
    assert_condition(&body["status"], "Ready", "False", "InvalidPlan", 2);
    let (code, after) = eventually_http(address, "/", |code, _| code == 200).await;
    assert_eq!(
        (code, &after),
        (200, &before),
        "the same answer as before the restart"
    );
    let (code, _) = http_get(agent.healthz, "/livez").await.unwrap();
    assert_eq!(
        code, 200,
        "a refused plan is no reason to restart the agent"
    );
    agent.dataplane.expect_no_sync().await;

    // A good plan is applied and its answers replace the record's.
    agent.api.put_plan(&plan("p3", &["10.244.1.20"]));
    let (merged, ok) = agent.dataplane.next_sync().await;
    assert_eq!((merged.revision.as_str(), ok), ("p3", true));
    let (_, body) = eventually_http(address, "/", |_, body| body["localEndpoints"] == 1).await;
    assert_eq!(body["localEndpoints"], 1);
    agent.stop().await;

    // Rules gone (flushed, rebooted without clearing /run): the record is not trusted.
    let mut agent = restart(false).await;
    agent.api.expect_status_patch(NODE).await;
    assert!(
        http_get(address, "/").await.is_err(),
        "no health-check answers for rules the kernel lost"
    );
    agent.stop().await;
    std::fs::remove_dir_all(&state).unwrap();
}

/// Beside kube-proxy during a migration its ports are taken: the agent starts anyway,
/// programs and reports, and serves /healthz once the port is free.
#[tokio::test]
async fn ports_in_use_do_not_stop_the_agent_and_are_taken_once_free() {
    let hc_port = free_port();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let mut agent = start(
        Settings {
            healthz_bind_address: address,
            metrics_bind_address: address,
            ..settings()
        },
        |api| put_cluster(api, hc_port),
    )
    .await;
    assert_eq!(agent.healthz, address);
    let body = agent.first_sync().await;
    assert_condition(&body["status"], "Ready", "True", "Synced", 1);
    drop(taken);
    let (code, _) = eventually_http(address, "/livez", |code, _| code == 200).await;
    assert_eq!(code, 200);
    let text = agent.metrics().await;
    assert!(text.contains("kubeproxy_sync_proxy_rules_duration_seconds"));
    agent.stop().await;
}
