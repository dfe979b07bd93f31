//! API tests: the controller's writes (server-side apply of node plans and Service plans,
//! replaces of objects edited by hand, deletes), its Lease election and write fence, and
//! its sync loop, against a mock API server that asserts every request's method, exact
//! path and query, and body, and that nothing else is sent.
//!
//! The cluster in every scenario: two zoned nodes (`node-a` in `eu-west-1a` with a uid,
//! `node-b` in `eu-west-1b` without), one ClusterIP Service `web` with Cluster traffic
//! policies and one EndpointSlice: three objects, Service plan `default/web` and the two
//! node plans.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod api_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use api_support::{
    ApiServerVerifier, Received, heartbeat, mk_node, mk_service, mk_slice, plan_apply_uri,
    plan_delete_uri, scenario, service_plan_apply_uri, service_plan_delete_uri,
    service_plan_replace_uri,
};
use futures::channel::mpsc;
use http::Method;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::watcher::Event;
use proxyplan_controller::model::ServiceKey;
use proxyplan_controller::run::http::{Health, Metrics};
use proxyplan_controller::run::lease::{Fence, Leadership, LeaseElector, LeaseError};
use proxyplan_controller::run::writer::{Kind, PlanWriter, WriteReport, kind_of, target_of};
use proxyplan_controller::run::{Input, Settings, SyncLoop};
use proxyplan_controller::{DesiredObject, ObjectId, Planner, PlannerConfig};
use proxyplan_crds::lenient::Lenient;
use proxyplan_crds::{
    MANAGED_BY, MANAGED_BY_LABEL, NodeProxyPlan, SERVICE_LABEL, ServiceProxyPlan,
};
use serde_json::{Value, json};

const ZONE_A: &str = "eu-west-1a";
const ZONE_B: &str = "eu-west-1b";
/// The Service plan of `web`, as the writer names it.
const WEB_PLAN: &str = "default/web";
/// Every node plan of the cluster, in URI order.
const ALL_PLANS: [&str; 2] = ["node-a", "node-b"];

// ---------------------------------------------------------------------------------------
// The cluster

fn config() -> PlannerConfig {
    PlannerConfig::default()
}

fn node_a() -> Node {
    mk_node("node-a", ZONE_A, Some("uid-node-a"), 1)
}

fn node_b() -> Node {
    mk_node("node-b", ZONE_B, None, 2)
}

fn web() -> Service {
    mk_service("web", "10.96.0.10")
}

fn web_key() -> ServiceKey {
    ServiceKey {
        namespace: "default".to_owned(),
        name: "web".to_owned(),
    }
}

fn web_slice() -> EndpointSlice {
    mk_slice(
        "web-abcde",
        "web",
        &[("10.244.1.10", "node-a"), ("10.244.2.10", "node-b")],
    )
}

/// `web`'s slice after the pod on node-b was replaced.
fn web_slice_moved() -> EndpointSlice {
    mk_slice(
        "web-abcde",
        "web",
        &[("10.244.1.10", "node-a"), ("10.244.2.11", "node-b")],
    )
}

/// The planner fed the whole cluster (its first changes not taken yet).
fn planned_cluster() -> Planner {
    let mut planner = Planner::new(config());
    planner.apply_node(&node_a()).unwrap();
    planner.apply_node(&node_b()).unwrap();
    planner.apply_service(&web()).unwrap();
    planner.apply_slice(&web_slice()).unwrap();
    planner
}

/// A fence that holds for the whole test.
fn leading() -> Fence {
    let fence = Fence::new();
    fence.grant_until(Instant::now() + Duration::from_secs(3600));
    fence
}

/// The planner after its first changes were taken, a writer whose view of the server
/// holds exactly those (as its watches would report them), and the verifier.
fn written_cluster() -> (Planner, PlanWriter, ApiServerVerifier) {
    let mut planner = planned_cluster();
    let first = planner.take_changes();
    assert_eq!(first.apply.len(), 3, "1 Service plan and 2 node plans");
    let (client, api) = ApiServerVerifier::new();
    let mut writer = PlanWriter::new(client);
    for object in &first.apply {
        writer.observe(
            kind_of(object),
            &object.qualified_name(),
            Some(object.revision()),
        );
    }
    (planner, writer, api)
}

fn by_name(objects: &[DesiredObject]) -> BTreeMap<String, DesiredObject> {
    objects
        .iter()
        .map(|o| (o.qualified_name(), o.clone()))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Assertions on request bodies

/// A `ServiceProxyPlan` apply body: identity in the Service's namespace, labels, the
/// owner reference to the Service, the desired revision, and nothing but the desired
/// object.
fn assert_service_plan_body(body: &Value, desired: &DesiredObject) {
    let name = desired.name();
    assert_eq!(body["apiVersion"], "proxyplan.dev/v1alpha1", "{name}");
    assert_eq!(body["kind"], "ServiceProxyPlan", "{name}");
    assert_eq!(body["metadata"]["name"], name);
    assert_eq!(body["metadata"]["namespace"], "default");
    assert_eq!(
        body["metadata"]["labels"],
        json!({ MANAGED_BY_LABEL: MANAGED_BY, SERVICE_LABEL: name }),
        "{name}: labels"
    );
    assert_eq!(
        body["metadata"]["ownerReferences"],
        json!([{ "apiVersion": "v1", "kind": "Service", "name": name, "uid": format!("uid-{name}") }]),
        "{name}: owned by its Service, so it goes with it"
    );
    assert!(
        body["metadata"].get("resourceVersion").is_none(),
        "{name}: an apply never carries a resourceVersion"
    );
    assert_eq!(body["spec"]["revision"], desired.revision(), "{name}");
    assert!(body.get("status").is_none(), "{name}: no status");
    assert_eq!(
        body,
        &serde_json::to_value(desired).unwrap(),
        "{name}: body"
    );
}

/// A `NodeProxyPlan` apply body: identity, label, the owner reference to its Node (when
/// the Node's uid is known), the desired revision, and nothing but the desired object.
fn assert_plan_body(body: &Value, desired: &DesiredObject, owner_uid: Option<&str>) {
    let name = desired.name();
    assert_eq!(body["apiVersion"], "proxyplan.dev/v1alpha1", "{name}");
    assert_eq!(body["kind"], "NodeProxyPlan", "{name}");
    assert_eq!(body["metadata"]["name"], name);
    assert_eq!(
        body["metadata"]["labels"],
        json!({ MANAGED_BY_LABEL: MANAGED_BY }),
        "{name}: labels"
    );
    match owner_uid {
        Some(uid) => assert_eq!(
            body["metadata"]["ownerReferences"],
            json!([{ "apiVersion": "v1", "kind": "Node", "name": name, "uid": uid }]),
            "{name}: owner reference"
        ),
        None => assert!(
            body["metadata"].get("ownerReferences").is_none(),
            "{name}: no uid, no owner reference"
        ),
    }
    assert!(body["metadata"].get("resourceVersion").is_none(), "{name}");
    assert_eq!(body["spec"]["nodeName"], name);
    assert_eq!(body["spec"]["revision"], desired.revision(), "{name}");
    assert!(
        body["spec"].get("shards").is_none(),
        "{name}: a node plan names no Service"
    );
    assert!(
        body.get("status").is_none(),
        "{name}: the controller never applies status"
    );
    assert_eq!(
        body,
        &serde_json::to_value(desired).unwrap(),
        "{name}: body"
    );
}

fn owner_uid(plan: &str) -> Option<&'static str> {
    (plan == "node-a").then_some("uid-node-a")
}

/// Checks a batch of plan applies (sorted by URI) against `desired` and echoes each.
fn answer_plans(batch: Vec<Received>, names: &[&str], desired: &BTreeMap<String, DesiredObject>) {
    let uris: Vec<&str> = batch.iter().map(|r| r.uri.as_str()).collect();
    let expected: Vec<String> = names.iter().map(|n| plan_apply_uri(n)).collect();
    assert_eq!(uris, expected, "plan applies");
    for request in batch {
        assert_eq!(request.method, Method::PATCH);
        assert_eq!(
            request.content_type.as_deref(),
            Some(api_support::APPLY_CONTENT_TYPE)
        );
        let name = request.body["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_plan_body(&request.body, &desired[&name], owner_uid(&name));
        request.echo();
    }
}

fn targets(kind: Kind, names: &[&str]) -> Vec<(Kind, String)> {
    names.iter().map(|n| (kind, (*n).to_owned())).collect()
}

fn assert_clean(report: &WriteReport) {
    assert!(report.errors.is_empty(), "errors: {:?}", report.errors);
    assert!(
        report.abandoned.is_empty(),
        "abandoned: {:?}",
        report.abandoned
    );
}

// ---------------------------------------------------------------------------------------
// PlanWriter

/// First sync: the Service plan is applied (and confirmed) before any node plan, so an
/// agent seldom sees an overlay before the entry it overrides; each body is exactly the
/// desired object under one field manager, with `force`.
#[tokio::test]
async fn first_sync_applies_every_service_plan_then_every_node_plan() {
    let mut planner = planned_cluster();
    let changes = planner.take_changes();
    assert!(changes.delete.is_empty(), "{:?}", changes.delete);
    let desired = by_name(&changes.apply);
    let (client, mut api) = ApiServerVerifier::new();
    let mut writer = PlanWriter::new(client);

    let (report, ()) = scenario(writer.write(changes.apply, Vec::new(), &leading()), async {
        let request = api.expect_apply(&service_plan_apply_uri("web")).await;
        // No node plan may be sent while a Service plan is unconfirmed.
        api.expect_quiet().await;
        assert_eq!(
            request.body["spec"]["servicePorts"][0]["clusterIP"],
            "10.96.0.10"
        );
        assert_service_plan_body(&request.body, &desired[WEB_PLAN]);
        request.echo();
        let plans = api.next_batch(ALL_PLANS.len()).await;
        answer_plans(plans, &ALL_PLANS, &desired);
    })
    .await;

    assert_clean(&report);
    let mut applied = targets(Kind::Plan, &ALL_PLANS);
    applied.extend(targets(Kind::Service, &[WEB_PLAN]));
    assert_eq!(report.applied, applied);
    assert!(report.deleted.is_empty());
    assert_eq!(report.unchanged, 0);
    let largest = desired
        .values()
        .map(proxyplan_controller::run::writer::json_size)
        .max()
        .unwrap();
    assert_eq!(report.largest_object, largest);
    for (name, object) in &desired {
        assert_eq!(
            writer.observed_revision(kind_of(object), name),
            Some(object.revision()),
            "{name}: the writer remembers what the server holds"
        );
    }
    drop(writer);
    api.expect_closed().await;
}

/// An endpoint of a Cluster-policy Service moves: exactly its Service plan is written,
/// whatever the number of nodes. Then events that change nothing (the same Service
/// again, a node heartbeat, the same slice again) produce no change and no request.
#[tokio::test]
async fn one_endpoint_change_writes_its_service_plan_and_no_ops_write_nothing() {
    let (mut planner, mut writer, mut api) = written_cluster();
    let before = writer
        .observed_revision(Kind::Service, WEB_PLAN)
        .unwrap()
        .to_owned();

    planner.apply_slice(&web_slice_moved()).unwrap();
    let changes = planner.take_changes();
    assert!(changes.delete.is_empty());
    assert_eq!(
        changes
            .apply
            .iter()
            .map(DesiredObject::qualified_name)
            .collect::<Vec<_>>(),
        [WEB_PLAN]
    );
    let desired = by_name(&changes.apply);
    assert_ne!(desired[WEB_PLAN].revision(), before);

    let (report, ()) = scenario(writer.write(changes.apply, Vec::new(), &leading()), async {
        let request = api.expect_apply(&service_plan_apply_uri("web")).await;
        assert_service_plan_body(&request.body, &desired[WEB_PLAN]);
        let endpoints = &request.body["spec"]["servicePorts"][0]["clusterEndpoints"];
        assert!(
            endpoints.to_string().contains("10.244.2.11")
                && !endpoints.to_string().contains("10.244.2.10"),
            "the moved endpoint: {endpoints}"
        );
        request.echo();
    })
    .await;
    assert_clean(&report);
    assert_eq!(report.applied, targets(Kind::Service, &[WEB_PLAN]));
    assert_eq!(report.unchanged, 0);
    api.expect_nothing_queued();

    // No-op events.
    let mut same_web = web();
    same_web.metadata.resource_version = Some("2".to_owned());
    planner.apply_service(&same_web).unwrap();
    planner.apply_node(&heartbeat(node_a(), 10)).unwrap();
    planner.apply_node(&heartbeat(node_b(), 10)).unwrap();
    planner.apply_slice(&web_slice_moved()).unwrap();
    let changes = planner.take_changes();
    assert!(changes.is_empty(), "{changes:?}");

    let (report, ()) = scenario(
        writer.write(changes.apply, Vec::new(), &leading()),
        api.expect_quiet(),
    )
    .await;
    assert_clean(&report);
    assert!(report.applied.is_empty() && report.deleted.is_empty());
    assert_eq!(report.unchanged, 0);
    drop(writer);
    api.expect_closed().await;
}

/// A node goes: only its plan is deleted (nothing is per zone); a 404 (the garbage
/// collector was faster) counts as done. Deleting it again sends nothing.
#[tokio::test]
async fn deleting_a_node_deletes_only_its_plan() {
    let (mut planner, mut writer, mut api) = written_cluster();

    planner.delete_node("node-b");
    let changes = planner.take_changes();
    assert!(changes.apply.is_empty(), "{:?}", changes.apply);
    assert_eq!(changes.delete, [ObjectId::Plan("node-b".to_owned())]);
    let delete: Vec<(Kind, String)> = changes.delete.iter().map(target_of).collect();

    let (report, ()) = scenario(
        writer.write(Vec::new(), delete.clone(), &leading()),
        async {
            let plan = api.expect_delete(&plan_delete_uri("node-b")).await;
            plan.not_found();
        },
    )
    .await;
    assert_clean(&report);
    assert_eq!(report.deleted, targets(Kind::Plan, &["node-b"]));
    assert!(report.applied.is_empty());
    assert_eq!(writer.observed_revision(Kind::Plan, "node-b"), None);

    let (report, ()) = scenario(
        writer.write(Vec::new(), delete, &leading()),
        api.expect_quiet(),
    )
    .await;
    assert_clean(&report);
    assert!(
        report.deleted.is_empty(),
        "already gone: {:?}",
        report.deleted
    );
    drop(writer);
    api.expect_closed().await;
}

/// A delete the API server refuses is reported, and the writer still believes the object
/// exists, so the retry sends it again.
#[tokio::test]
async fn a_failed_delete_is_reported_and_retried() {
    let (mut planner, mut writer, mut api) = written_cluster();
    planner.delete_node("node-a");
    planner.delete_service_named(&web_key());
    let delete: Vec<(Kind, String)> = planner
        .take_changes()
        .delete
        .iter()
        .map(target_of)
        .collect();
    assert_eq!(
        delete,
        [
            (Kind::Plan, "node-a".to_owned()),
            (Kind::Service, WEB_PLAN.to_owned())
        ]
    );

    let (report, ()) = scenario(
        writer.write(Vec::new(), delete.clone(), &leading()),
        async {
            let mut batch = api.next_batch(2).await.into_iter();
            let service = batch.next().unwrap();
            assert_eq!(service.uri, service_plan_delete_uri("web"));
            service.deleted();
            let plan = batch.next().unwrap();
            assert_eq!(plan.uri, plan_delete_uri("node-a"));
            plan.fail(500, "InternalError");
        },
    )
    .await;
    assert_eq!(report.deleted, targets(Kind::Service, &[WEB_PLAN]));
    assert_eq!(report.errors.len(), 1);
    assert_eq!(
        (
            report.errors[0].op,
            report.errors[0].kind,
            report.errors[0].name.as_str()
        ),
        ("delete", Kind::Plan, "node-a")
    );
    assert!(writer.observed_revision(Kind::Plan, "node-a").is_some());

    let (report, ()) = scenario(writer.write(Vec::new(), delete, &leading()), async {
        api.expect_delete(&plan_delete_uri("node-a"))
            .await
            .deleted();
    })
    .await;
    assert_clean(&report);
    assert_eq!(report.deleted, targets(Kind::Plan, &["node-a"]));
    drop(writer);
    api.expect_closed().await;
}

/// An apply the API server refuses is reported and not remembered as written, so the
/// retry sends it again.
#[tokio::test]
async fn a_failed_apply_is_reported_and_retried() {
    let mut planner = planned_cluster();
    let objects = planner.take_changes().apply;
    let desired = by_name(&objects);
    let (client, mut api) = ApiServerVerifier::new();
    let mut writer = PlanWriter::new(client);
    for object in &objects {
        if object.name() != "node-b" {
            writer.observe(
                kind_of(object),
                &object.qualified_name(),
                Some(object.revision()),
            );
        }
    }

    let (report, ()) = scenario(
        writer.write(objects.clone(), Vec::new(), &leading()),
        async {
            api.expect_apply(&plan_apply_uri("node-b"))
                .await
                .fail(422, "Invalid");
        },
    )
    .await;
    assert!(report.applied.is_empty());
    assert_eq!(report.unchanged, 2);
    assert_eq!(report.errors.len(), 1);
    assert_eq!(
        (
            report.errors[0].op,
            report.errors[0].kind,
            report.errors[0].name.as_str()
        ),
        ("apply", Kind::Plan, "node-b")
    );
    assert_eq!(writer.observed_revision(Kind::Plan, "node-b"), None);

    let (report, ()) = scenario(writer.write(objects, Vec::new(), &leading()), async {
        let request = api.expect_apply(&plan_apply_uri("node-b")).await;
        assert_plan_body(&request.body, &desired["node-b"], None);
        request.echo();
    })
    .await;
    assert_clean(&report);
    assert_eq!(report.applied, targets(Kind::Plan, &["node-b"]));
    drop(writer);
    api.expect_closed().await;
}

/// A full reconcile where the server holds a Service plan nobody wants any more (its
/// Service went while the controller was down): exactly that object is deleted,
/// everything else is unchanged.
#[tokio::test]
async fn full_reconcile_deletes_only_the_object_nobody_wants() {
    let (planner, mut writer, mut api) = written_cluster();
    writer.observe(Kind::Service, "default/gone", Some("0123456789abcdef"));
    let all = planner.all_objects();
    let stale = writer.stale(&all);
    assert_eq!(stale, targets(Kind::Service, &["default/gone"]));

    let (report, ()) = scenario(writer.write(all, stale, &leading()), async {
        api.expect_delete(&service_plan_delete_uri("gone"))
            .await
            .deleted();
    })
    .await;
    assert_clean(&report);
    assert!(report.applied.is_empty());
    assert_eq!(report.deleted, targets(Kind::Service, &["default/gone"]));
    assert_eq!(report.unchanged, 3);
    assert!(writer.stale(&planner.all_objects()).is_empty());
    drop(writer);
    api.expect_closed().await;
}

/// Objects whose revision the server already holds are skipped and counted; only the one
/// someone else changed is written back.
#[tokio::test]
async fn objects_the_server_already_has_are_skipped() {
    let (planner, mut writer, mut api) = written_cluster();
    let all = planner.all_objects();
    let desired = by_name(&all);

    let (report, ()) = scenario(
        writer.write(all.clone(), Vec::new(), &leading()),
        api.expect_quiet(),
    )
    .await;
    assert_clean(&report);
    assert!(report.applied.is_empty() && report.deleted.is_empty());
    assert_eq!(report.unchanged, 3);

    // Someone edited node-a's plan: the watch shows another revision.
    let diverged = writer.observe(Kind::Plan, "node-a", Some("edited-by-someone"));
    assert!(diverged, "the writer had confirmed another revision");
    let (report, ()) = scenario(writer.write(all, Vec::new(), &leading()), async {
        let request = api.expect_apply(&plan_apply_uri("node-a")).await;
        assert_plan_body(&request.body, &desired["node-a"], Some("uid-node-a"));
        request.echo();
    })
    .await;
    assert_clean(&report);
    assert_eq!(report.applied, targets(Kind::Plan, &["node-a"]));
    assert_eq!(report.unchanged, 2);
    drop(writer);
    api.expect_closed().await;
}

/// The apply's answer is checked: when it carries fields the desired object does not have
/// (someone's hand edit, kept by server-side apply because another manager owns them),
/// the object is put whole under the answer's resourceVersion with only this manager's
/// apply entry and status writers kept in `managedFields`, so that a later apply that
/// leaves a field out removes it. A put that loses a race (409) starts again from the
/// apply. Gone, the object is simply applied again.
#[tokio::test]
async fn an_answer_with_someone_elses_fields_is_put_whole() {
    let (planner, mut writer, mut api) = written_cluster();
    let all = planner.all_objects();
    let desired = by_name(&all);
    writer.observe(Kind::Service, WEB_PLAN, Some("edited:whatever"));

    let own_apply = json!({"manager": "proxyplan-controller", "operation": "Apply",
        "apiVersion": "proxyplan.dev/v1alpha1", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:revision": {}}}});
    let status = json!({"manager": "proxyplan-agent", "operation": "Update",
        "subresource": "status", "apiVersion": "proxyplan.dev/v1alpha1",
        "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}});
    let edit = json!({"manager": "kubectl-edit", "operation": "Update",
        "apiVersion": "proxyplan.dev/v1alpha1", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:summary": {}}}});
    let (report, ()) = scenario(writer.write(all.clone(), Vec::new(), &leading()), async {
        for (round, resource_version) in [(0, "77"), (1, "79")] {
            let apply = api.expect_apply(&service_plan_apply_uri("web")).await;
            assert_service_plan_body(&apply.body, &desired[WEB_PLAN]);
            let mut answer = apply.body.clone();
            answer["metadata"]["resourceVersion"] = json!(resource_version);
            answer["metadata"]["uid"] = json!("uid-web");
            answer["spec"]["servicePorts"][0]["zoneEndpoints"] =
                json!([{"zone": "zone-a", "endpoints": []}]);
            answer["metadata"]["managedFields"] = json!([own_apply, edit, status]);
            apply.respond(200, &answer);
            let put = api
                .expect(Method::PUT, &service_plan_replace_uri("web"))
                .await;
            let mut want = serde_json::to_value(&desired[WEB_PLAN]).unwrap();
            want["metadata"]["resourceVersion"] = json!(resource_version);
            want["metadata"]["uid"] = json!("uid-web");
            want["metadata"]["managedFields"] = json!([own_apply, status]);
            assert_eq!(
                put.body, want,
                "the whole desired object, owned by our apply"
            );
            if round == 0 {
                put.fail(409, "the object has been modified");
            } else {
                put.echo();
            }
        }
    })
    .await;
    assert_clean(&report);
    assert_eq!(report.applied, targets(Kind::Service, &[WEB_PLAN]));

    // Only the ownership is foreign (content as desired, as after an old put): put whole.
    writer.observe(Kind::Service, WEB_PLAN, Some("edited:again"));
    let (report, ()) = scenario(writer.write(all.clone(), Vec::new(), &leading()), async {
        let apply = api.expect_apply(&service_plan_apply_uri("web")).await;
        let mut answer = apply.body.clone();
        answer["metadata"]["resourceVersion"] = json!("80");
        let before_first_apply = json!({"manager": "before-first-apply", "operation": "Update",
            "apiVersion": "proxyplan.dev/v1alpha1", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {}}});
        answer["metadata"]["managedFields"] = json!([before_first_apply, own_apply]);
        apply.respond(200, &answer);
        let put = api
            .expect(Method::PUT, &service_plan_replace_uri("web"))
            .await;
        assert_eq!(put.body["metadata"]["managedFields"], json!([own_apply]));
        put.echo();
    })
    .await;
    assert_clean(&report);

    // Deleted by hand: the apply creates it, exactly as desired; nothing more is sent.
    writer.observe(Kind::Service, WEB_PLAN, None);
    let (report, ()) = scenario(writer.write(all, Vec::new(), &leading()), async {
        let request = api.expect_apply(&service_plan_apply_uri("web")).await;
        assert_service_plan_body(&request.body, &desired[WEB_PLAN]);
        request.echo();
    })
    .await;
    assert_clean(&report);
    drop(writer);
    api.expect_closed().await;
}

/// Without a valid fence (the Lease was not renewed in time) the writer sends nothing:
/// every write is abandoned, none is an error, and nothing is remembered as written.
#[tokio::test]
async fn nothing_is_written_without_the_fence() {
    let mut planner = planned_cluster();
    let objects = planner.take_changes().apply;
    let (client, mut api) = ApiServerVerifier::new();
    let mut writer = PlanWriter::new(client);
    let expired = Fence::new();
    expired.grant_until(Instant::now());
    let (report, ()) = scenario(
        writer.write(objects, vec![(Kind::Plan, "node-z".to_owned())], &expired),
        api.expect_quiet(),
    )
    .await;
    assert!(report.applied.is_empty() && report.errors.is_empty());
    assert_eq!(report.abandoned.len(), 3);
    assert_eq!(writer.observed_revision(Kind::Plan, "node-a"), None);
    drop(writer);
    api.expect_closed().await;
}

// ---------------------------------------------------------------------------------------
// LeaseElector

const LEASE_NS: &str = "proxyplan-system";
const LEASE_NAME: &str = "proxyplan-controller";
const LEASE_URI: &str =
    "/apis/coordination.k8s.io/v1/namespaces/proxyplan-system/leases/proxyplan-controller";
const LEASES_URI: &str = "/apis/coordination.k8s.io/v1/namespaces/proxyplan-system/leases?";
const LEASE_REPLACE_URI: &str =
    "/apis/coordination.k8s.io/v1/namespaces/proxyplan-system/leases/proxyplan-controller?";
const US: &str = "replica-a";
const THEM: &str = "replica-b";

fn t0() -> Timestamp {
    Timestamp::from_second(1_750_000_000).unwrap()
}

fn at(seconds: i64) -> Timestamp {
    t0().checked_add(SignedDuration::from_secs(seconds))
        .unwrap()
}

fn micro(t: Timestamp) -> Value {
    serde_json::to_value(MicroTime(t)).unwrap()
}

fn elector(client: kube::Client) -> LeaseElector {
    LeaseElector::new(client, LEASE_NS, LEASE_NAME, US, Duration::from_secs(15))
}

/// This replica's monotonic clock, `seconds` after the test's start.
fn local(start: Instant, seconds: u64) -> Instant {
    start + Duration::from_secs(seconds)
}

/// A Lease as the API server returns it.
fn lease(holder: Option<&str>, acquired: i64, renewed: i64, transitions: i32, rv: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": LEASE_NAME,
            "namespace": LEASE_NS,
            "uid": "lease-uid",
            "resourceVersion": rv,
        },
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 15,
            "acquireTime": micro(at(acquired)),
            "renewTime": micro(at(renewed)),
            "leaseTransitions": transitions,
        },
    })
}

/// A replace of the Lease: the object read, with only the spec's election fields
/// changed.
fn assert_lease_replace(
    request: &Received,
    read: &Value,
    acquired: i64,
    renewed: i64,
    transitions: i32,
) {
    assert_eq!(
        (&request.method, request.uri.as_str()),
        (&Method::PUT, LEASE_REPLACE_URI)
    );
    let body = &request.body;
    assert_eq!(body["apiVersion"], "coordination.k8s.io/v1");
    assert_eq!(body["kind"], "Lease");
    assert_eq!(
        body["metadata"], read["metadata"],
        "metadata (with resourceVersion) preserved, so a racing writer gets a 409"
    );
    assert_eq!(
        body["spec"],
        json!({
            "holderIdentity": US,
            "leaseDurationSeconds": 15,
            "acquireTime": micro(at(acquired)),
            "renewTime": micro(at(renewed)),
            "leaseTransitions": transitions,
        })
    );
}

/// (a) No Lease: it is created with us as holder, and we lead.
#[tokio::test]
async fn lease_missing_is_created_and_we_lead() {
    let (client, mut api) = ApiServerVerifier::new();
    let mut elector = elector(client);
    let start = Instant::now();
    let (result, ()) = scenario(elector.try_acquire_or_renew(t0(), local(start, 0)), async {
        api.expect(Method::GET, LEASE_URI).await.not_found();
        let create = api.expect(Method::POST, LEASES_URI).await;
        assert_eq!(create.content_type.as_deref(), Some("application/json"));
        let body = &create.body;
        assert_eq!(body["apiVersion"], "coordination.k8s.io/v1");
        assert_eq!(body["kind"], "Lease");
        assert_eq!(body["metadata"]["name"], LEASE_NAME);
        assert!(body["metadata"].get("resourceVersion").is_none());
        assert_eq!(
            body["spec"],
            json!({
                "holderIdentity": US,
                "leaseDurationSeconds": 15,
                "acquireTime": micro(t0()),
                "renewTime": micro(t0()),
                "leaseTransitions": 0,
            })
        );
        let mut created = body.clone();
        created["metadata"]["namespace"] = json!(LEASE_NS);
        created["metadata"]["resourceVersion"] = json!("1");
        create.respond(201, &created);
    })
    .await;
    assert_eq!(result.unwrap(), Leadership::Leader);
    drop(elector);
    api.expect_closed().await;
}

/// A create that loses the race (AlreadyExists): someone else leads.
#[tokio::test]
async fn lease_create_race_lost_makes_us_follower() {
    let (client, mut api) = ApiServerVerifier::new();
    let mut elector = elector(client);
    let start = Instant::now();
    let (result, ()) = scenario(elector.try_acquire_or_renew(t0(), local(start, 0)), async {
        api.expect(Method::GET, LEASE_URI).await.not_found();
        api.expect(Method::POST, LEASES_URI)
            .await
            .fail(409, "AlreadyExists");
    })
    .await;
    assert_eq!(result.unwrap(), Leadership::Follower);
    drop(elector);
    api.expect_closed().await;
}

/// (b) A Lease another replica renewed just now: we follow and write nothing.
#[tokio::test]
async fn lease_held_by_another_is_left_alone() {
    let (client, mut api) = ApiServerVerifier::new();
    let mut elector = elector(client);
    let start = Instant::now();
    let (result, ()) = scenario(elector.try_acquire_or_renew(t0(), local(start, 0)), async {
        api.expect(Method::GET, LEASE_URI)
            .await
            .respond(200, &lease(Some(THEM), -100, 0, 3, "41"));
    })
    .await;
    assert_eq!(result.unwrap(), Leadership::Follower);
    api.expect_nothing_queued();
    // Still valid at the last second of its duration.
    let (result, ()) = scenario(
        elector.try_acquire_or_renew(at(14), local(start, 14)),
        async {
            api.expect(Method::GET, LEASE_URI)
                .await
                .respond(200, &lease(Some(THEM), -100, 0, 3, "41"));
        },
    )
    .await;
    assert_eq!(result.unwrap(), Leadership::Follower);
    drop(elector);
    api.expect_closed().await;
}

/// (c) A Lease another replica let expire: after it has not changed for a lease
/// duration by our clock, we replace it (same resourceVersion), with one more transition,
/// and lead.
#[tokio::test]
async fn lease_expired_is_taken_over() {
    let (client, mut api) = ApiServerVerifier::new();
    let mut elector = elector(client);
    let start = Instant::now();
    let read = lease(Some(THEM), -100, 0, 3, "42");
    let (result, ()) = scenario(
        elector.try_acquire_or_renew(at(1), local(start, 0)),
        async {
            api.expect(Method::GET, LEASE_URI).await.respond(200, &read);
        },
    )
    .await;
    assert_eq!(result.unwrap(), Leadership::Follower, "first seen now");
    let now = 16;
    let (result, ()) = scenario(
        elector.try_acquire_or_renew(at(now), local(start, 16)),
        async {
            api.expect(Method::GET, LEASE_URI).await.respond(200, &read);
            let replace = api.next().await;
            assert_lease_replace(&replace, &read, now, now, 4);
            let mut stored = replace.body.clone();
            stored["metadata"]["resourceVersion"] = json!("43");
            replace.respond(200, &stored);
        },
    )
    .await;
    assert_eq!(result.unwrap(), Leadership::Leader);
    drop(elector);
    api.expect_closed().await;
}

/// Expiry does not trust the other replica's clock: a Lease whose renewTime is long past
/// (the holder's clock is behind) is not taken while it keeps changing, and one whose
/// renewTime is in the future (the holder's clock is ahead) is taken once it has not
/// changed for a lease duration.
#[tokio::test]
async fn lease_expiry_is_measured_on_our_clock_not_theirs() {
    let (client, mut api) = ApiServerVerifier::new();
    let mut elector = elector(client);
    let start = Instant::now();
    // Renewed an hour "ago" by its own clock, but renewed (new resourceVersions).
    for (seconds, rv) in [(0, "50"), (10, "51"), (20, "52"), (30, "53")] {
        let (result, ()) = scenario(
            elector.try_acquire_or_renew(at(3600), local(start, seconds)),
            async {
                api.expect(Method::GET, LEASE_URI)
                    .await
                    .respond(200, &lease(Some(THEM), -7200, 0, 3, rv));
            },
        )
        .await;
        assert_eq!(result.unwrap(), Leadership::Follower, "at {seconds}s");
    }
    // Renewed "in an hour" by its own clock, but silent since we saw it at 30 s.
    let ahead = lease(Some(THEM), 0, 7200, 3, "54");
    let (result, ()) = scenario(
        elector.try_acquire_or_renew(at(40), local(start, 40)),
        async {
            api.expect(Method::GET, LEASE_URI)
                .await
                .respond(200, &ahead);
        },
    )
    .await;
    assert_eq!(result.unwrap(), Leadership::Follower);
    let (result, ()) = scenario(
        elector.try_acquire_or_renew(at(56), local(start, 56)),
        async {
            api.expect(Method::GET, LEASE_URI)
                .await
                .respond(200, &ahead);
            let replace = api.next().await;
            assert_eq!(replace.method, Method::PUT);
            assert_eq!(replace.body["spec"]["holderIdentity"], US);
            replace.echo();
        },
    )
    .await;
    assert_eq!(result.unwrap(), Leadership::Leader);
    drop(elector);
    api.expect_closed().await;
}

/// A Lease nobody holds (released) is taken at once.
#[tokio::test]
async fn lease_released_is_taken_at_once() {
    let (client, mut api) = ApiServerVerifier::new();
    let mut elector = elector(client);
    let start = Instant::now();
    let (result, ()) = scenario(
        elector.try_acquire_or_renew(at(1), local(start, 1)),
        async {
            let mut read = lease(None, -100, 0, 3, "42");
            read["spec"]["leaseDurationSeconds"] = json!(1);
            api.expect(Method::GET, LEASE_URI).await.respond(200, &read);
            let replace = api.next().await;
            assert_lease_replace(&replace, &read, 1, 1, 4);
            replace.echo();
        },
    )
    .await;
    assert_eq!(result.unwrap(), Leadership::Leader);
    drop(elector);
    api.expect_closed().await;
}

/// (d), (e) and renewal: round 1 another replica leads; round 2 its Lease has not
/// changed for a lease duration but our replace loses the race (409): follower; round 3
/// the winner holds it; round 4 the winner let it expire too: we take it; round 5 we
/// renew (acquire time and transitions kept).
#[tokio::test]
async fn lease_lost_race_then_regained_then_renewed() {
    let (client, mut api) = ApiServerVerifier::new();
    let mut elector = elector(client);
    let start = Instant::now();

    let (result, ()) = scenario(
        elector.try_acquire_or_renew(at(0), local(start, 0)),
        async {
            api.expect(Method::GET, LEASE_URI)
                .await
                .respond(200, &lease(Some(THEM), -100, -2, 3, "42"));
        },
    )
    .await;
    assert_eq!(result.unwrap(), Leadership::Follower);

    let (result, ()) = scenario(
        elector.try_acquire_or_renew(at(20), local(start, 20)),
        async {
            let read = lease(Some(THEM), -100, -2, 3, "42");
            api.expect(Method::GET, LEASE_URI).await.respond(200, &read);
            let replace = api.next().await;
            assert_lease_replace(&replace, &read, 20, 20, 4);
            replace.conflict();
        },
    )
    .await;
    assert_eq!(result.unwrap(), Leadership::Follower, "lost the race");

    let winner = lease(Some("replica-c"), 20, 22, 4, "44");
    let (result, ()) = scenario(
        elector.try_acquire_or_renew(at(24), local(start, 24)),
        async {
            api.expect(Method::GET, LEASE_URI)
                .await
                .respond(200, &winner);
        },
    )
    .await;
    assert_eq!(result.unwrap(), Leadership::Follower, "the winner leads");

    let (result, ()) = scenario(
        elector.try_acquire_or_renew(at(40), local(start, 40)),
        async {
            api.expect(Method::GET, LEASE_URI)
                .await
                .respond(200, &winner);
            let replace = api.next().await;
            assert_lease_replace(&replace, &winner, 40, 40, 5);
            let mut stored = replace.body.clone();
            stored["metadata"]["resourceVersion"] = json!("45");
            replace.respond(200, &stored);
        },
    )
    .await;
    assert_eq!(result.unwrap(), Leadership::Leader, "regained");

    let (result, ()) = scenario(
        elector.try_acquire_or_renew(at(42), local(start, 42)),
        async {
            let read = lease(Some(US), 40, 40, 5, "45");
            api.expect(Method::GET, LEASE_URI).await.respond(200, &read);
            let replace = api.next().await;
            assert_lease_replace(&replace, &read, 40, 42, 5);
            replace.echo();
        },
    )
    .await;
    assert_eq!(result.unwrap(), Leadership::Leader, "renewed");
    drop(elector);
    api.expect_closed().await;
}

/// An API error other than a lost race is an error, not a leadership answer.
#[tokio::test]
async fn lease_api_errors_are_errors() {
    let (client, mut api) = ApiServerVerifier::new();
    let mut elector = elector(client);
    let start = Instant::now();
    let (result, ()) = scenario(elector.try_acquire_or_renew(t0(), local(start, 0)), async {
        api.expect(Method::GET, LEASE_URI)
            .await
            .fail(403, "Forbidden");
    })
    .await;
    assert!(
        matches!(result, Err(LeaseError::Api(kube::Error::Api(ref s))) if s.code == 403),
        "{result:?}"
    );
    drop(elector);
    api.expect_closed().await;
}

/// `release` clears the holder (and shortens the duration) only when we hold the Lease.
#[tokio::test]
async fn lease_release_clears_only_our_own_hold() {
    let (client, mut api) = ApiServerVerifier::new();
    let elector = elector(client);

    let (result, ()) = scenario(elector.release(), async {
        let read = lease(Some(US), 0, 10, 2, "50");
        api.expect(Method::GET, LEASE_URI).await.respond(200, &read);
        let replace = api.expect(Method::PUT, LEASE_REPLACE_URI).await;
        assert_eq!(replace.body["metadata"], read["metadata"]);
        assert_eq!(
            replace.body["spec"]["holderIdentity"],
            Value::Null,
            "holder cleared"
        );
        assert_eq!(replace.body["spec"]["leaseDurationSeconds"], 1);
        assert_eq!(replace.body["spec"]["leaseTransitions"], 2);
        replace.echo();
    })
    .await;
    result.unwrap();

    let (result, ()) = scenario(elector.release(), async {
        api.expect(Method::GET, LEASE_URI)
            .await
            .respond(200, &lease(Some(THEM), 0, 10, 3, "51"));
    })
    .await;
    result.unwrap();
    api.expect_nothing_queued();

    let (result, ()) = scenario(elector.release(), async {
        api.expect(Method::GET, LEASE_URI).await.not_found();
    })
    .await;
    result.unwrap();
    drop(elector);
    api.expect_closed().await;
}

// ---------------------------------------------------------------------------------------
// SyncLoop

fn settings() -> Settings {
    Settings {
        kubeconfig: None,
        config: config(),
        min_sync_interval: Duration::ZERO,
        metrics_bind_address: ([127, 0, 0, 1], 0).into(),
        health_bind_address: ([127, 0, 0, 1], 0).into(),
        lease_namespace: LEASE_NS.to_owned(),
        lease_name: LEASE_NAME.to_owned(),
        identity: US.to_owned(),
        rollout_slow_after: Duration::from_secs(15),
        rollout_status: proxyplan_controller::run::rollout::StatusWrites::Lagging,
    }
}

fn sync_loop(client: kube::Client) -> SyncLoop {
    SyncLoop::new(
        client,
        &settings(),
        Arc::new(Metrics::new()),
        Arc::new(Health::default()),
        leading(),
        None,
    )
}

/// An object as a watch delivers it.
fn ok<K: kube::Resource>(object: K) -> Lenient<K> {
    let meta = object.meta().clone();
    Lenient::decoded(meta, object)
}

/// The initial list of every watch: the cluster, and no plans, Service plans or
/// ServiceCIDRs yet.
fn initial_lists() -> Vec<Input> {
    vec![
        Input::Service(Event::Init),
        Input::Service(Event::InitApply(ok(web()))),
        Input::Service(Event::InitDone),
        Input::Slice(Event::Init),
        Input::Slice(Event::InitApply(ok(web_slice()))),
        Input::Slice(Event::InitDone),
        Input::Node(Event::Init),
        Input::Node(Event::InitApply(ok(node_a()))),
        Input::Node(Event::InitApply(ok(node_b()))),
        Input::Node(Event::InitDone),
        Input::Plan(Event::Init),
        Input::Plan(Event::InitDone),
        Input::ServicePlan(Event::Init),
        Input::ServicePlan(Event::InitDone),
        Input::ServiceCidr(Event::Init),
        Input::ServiceCidr(Event::InitDone),
    ]
}

/// What the planner wants for the cluster, by name.
fn desired_cluster() -> BTreeMap<String, DesiredObject> {
    by_name(&planned_cluster().all_objects())
}

/// Serves a full write of the cluster: the Service plan, then every node plan. Returns
/// the node plan bodies as the server stored them.
async fn serve_full_write(api: &mut ApiServerVerifier) -> Vec<Value> {
    let desired = desired_cluster();
    let request = api.expect_apply(&service_plan_apply_uri("web")).await;
    assert_service_plan_body(&request.body, &desired[WEB_PLAN]);
    request.echo();
    let plans = api.next_batch(ALL_PLANS.len()).await;
    let bodies = plans.iter().map(|r| r.body.clone()).collect();
    answer_plans(plans, &ALL_PLANS, &desired);
    bodies
}

/// A loop to run on channels, its watches' initial lists queued, and its mock API
/// server; the leader channel says "not leading" until a test says otherwise.
struct Looped {
    api: ApiServerVerifier,
    sync: SyncLoop,
    inputs_tx: mpsc::UnboundedSender<Input>,
    inputs_rx: mpsc::UnboundedReceiver<Input>,
    leader_tx: tokio::sync::watch::Sender<bool>,
    leader_rx: tokio::sync::watch::Receiver<bool>,
}

fn looped() -> Looped {
    let (client, api) = ApiServerVerifier::new();
    let (inputs_tx, inputs_rx) = mpsc::unbounded::<Input>();
    let (leader_tx, leader_rx) = tokio::sync::watch::channel(false);
    for input in initial_lists() {
        inputs_tx.unbounded_send(input).unwrap();
    }
    Looped {
        api,
        sync: sync_loop(client),
        inputs_tx,
        inputs_rx,
        leader_tx,
        leader_rx,
    }
}

/// Runs `sync`'s loop on `inputs` and `leader` until `script` is done (30 s at most),
/// then stops it.
async fn run_until_done(
    mut sync: SyncLoop,
    inputs: mpsc::UnboundedReceiver<Input>,
    leader: tokio::sync::watch::Receiver<bool>,
    script: impl Future<Output = ()>,
) {
    tokio::time::timeout(Duration::from_secs(30), async {
        tokio::select! {
            () = sync.run(Box::pin(inputs), leader) => panic!("the loop ended"),
            () = script => {}
        }
    })
    .await
    .expect("scenario timed out");
}

/// A replica that does not hold the Lease writes nothing, even when asked to sync; once
/// it leads, a sync writes the whole cluster.
#[tokio::test]
async fn sync_loop_writes_only_as_leader() {
    let (client, mut api) = ApiServerVerifier::new();
    let mut sync = sync_loop(client);
    for input in initial_lists() {
        sync.handle(input);
    }
    assert!(sync.synced());

    sync.set_leader(false);
    scenario(sync.sync(), api.expect_quiet()).await;

    sync.set_leader(true);
    scenario(sync.sync(), async {
        serve_full_write(&mut api).await;
    })
    .await;
    scenario(sync.sync(), api.expect_quiet()).await;
    drop(sync);
    api.expect_closed().await;
}

/// A leader whose Lease was not renewed in time writes nothing and computes nothing (no
/// full reconcile over and over while the API server is away); once the fence holds
/// again, everything waiting is written.
#[tokio::test]
async fn sync_loop_waits_for_the_fence_without_losing_changes() {
    let (client, mut api) = ApiServerVerifier::new();
    let fence = Fence::new();
    fence.grant_until(Instant::now());
    let mut sync = SyncLoop::new(
        client,
        &settings(),
        Arc::new(Metrics::new()),
        Arc::new(Health::default()),
        fence.clone(),
        None,
    );
    for input in initial_lists() {
        sync.handle(input);
    }
    sync.set_leader(true);
    for _ in 0..3 {
        scenario(sync.sync(), api.expect_quiet()).await;
    }
    fence.grant_until(Instant::now() + Duration::from_secs(60));
    scenario(sync.sync(), async {
        serve_full_write(&mut api).await;
    })
    .await;
    drop(sync);
    api.expect_closed().await;
}

/// Nothing is written before every watch has listed once, even by the leader.
#[tokio::test]
async fn sync_loop_writes_nothing_before_every_watch_listed() {
    let (client, mut api) = ApiServerVerifier::new();
    let mut sync = sync_loop(client);
    let lists = initial_lists();
    let last = lists.len() - 1;
    for input in lists.into_iter().take(last) {
        sync.handle(input);
    }
    assert!(!sync.synced(), "the ServiceCIDR watch has not listed yet");
    sync.set_leader(true);
    scenario(sync.sync(), api.expect_quiet()).await;
    drop(sync);
    api.expect_closed().await;
}

/// An API server without ServiceCIDRs (before 1.33) answers their list with 404: that
/// watch counts as listed, empty, and nothing waits for it.
#[tokio::test]
async fn an_api_server_without_service_cidrs_does_not_hold_up_writes() {
    let (client, _api) = ApiServerVerifier::new();
    let mut sync = sync_loop(client);
    let lists = initial_lists();
    let last = lists.len() - 2;
    for input in lists.into_iter().take(last) {
        sync.handle(input);
    }
    assert!(!sync.synced());
    sync.handle(Input::WatchError(
        "ServiceCIDR",
        "failed to perform initial object list: ApiError: the server could not find the \
         requested resource: NotFound (ErrorResponse { status: \"Failure\", code: 404 })"
            .to_owned(),
    ));
    assert!(sync.synced());
}

/// The loop as `run` drives it: synced but follower, it writes nothing; leading, it
/// writes the cluster once; an endpoint change while follower is not written until it
/// leads again, and then only that Service plan (a full reconcile skips what the server
/// has).
#[tokio::test]
async fn sync_loop_run_writes_only_while_leading() {
    let Looped {
        mut api,
        sync,
        inputs_tx,
        inputs_rx,
        leader_tx,
        leader_rx,
    } = looped();
    let script = async {
        api.expect_quiet().await;
        leader_tx.send(true).unwrap();
        serve_full_write(&mut api).await;
        api.expect_quiet().await;

        leader_tx.send(false).unwrap();
        inputs_tx
            .unbounded_send(Input::Slice(Event::Apply(ok(web_slice_moved()))))
            .unwrap();
        api.expect_quiet().await;

        leader_tx.send(true).unwrap();
        let mut planner = planned_cluster();
        planner.apply_slice(&web_slice_moved()).unwrap();
        let desired = by_name(&planner.all_objects());
        let request = api.expect_apply(&service_plan_apply_uri("web")).await;
        assert_service_plan_body(&request.body, &desired[WEB_PLAN]);
        request.echo();
        api.expect_quiet().await;
    };
    run_until_done(sync, inputs_rx, leader_rx, script).await;
    drop(inputs_tx);
    api.expect_closed().await;
}

/// A change is written while an earlier change's write is still in flight, not after it
/// (the API server's latency under load would otherwise queue every change behind the
/// one before); a second change of the object being written waits for that write and
/// then writes the newest content.
#[tokio::test]
async fn sync_loop_writes_a_change_beside_a_write_in_flight() {
    let Looped {
        mut api,
        sync,
        inputs_tx,
        inputs_rx,
        leader_tx,
        leader_rx,
    } = looped();
    let api_service = mk_service("api", "10.96.0.20");
    let api_slice = mk_slice("api-abcde", "api", &[("10.244.1.20", "node-a")]);
    let script = async {
        leader_tx.send(true).unwrap();
        serve_full_write(&mut api).await;
        api.expect_quiet().await;

        // web's pod replaced: its write is held unanswered.
        inputs_tx
            .unbounded_send(Input::Slice(Event::Apply(ok(web_slice_moved()))))
            .unwrap();
        let mut planner = planned_cluster();
        planner.apply_slice(&web_slice_moved()).unwrap();
        let moved = by_name(&planner.all_objects());
        let held = api.expect_apply(&service_plan_apply_uri("web")).await;
        assert_service_plan_body(&held.body, &moved[WEB_PLAN]);

        // A new Service meanwhile: written at once, beside the held write.
        inputs_tx
            .unbounded_send(Input::Service(Event::Apply(ok(api_service.clone()))))
            .unwrap();
        inputs_tx
            .unbounded_send(Input::Slice(Event::Apply(ok(api_slice.clone()))))
            .unwrap();
        planner.apply_service(&api_service).unwrap();
        planner.apply_slice(&api_slice).unwrap();
        let with_api = by_name(&planner.all_objects());
        let request = api.expect_apply(&service_plan_apply_uri("api")).await;
        assert_service_plan_body(&request.body, &with_api["default/api"]);
        request.echo();
        api.expect_quiet().await;

        // web changed again while its first write is held: no second write of it yet.
        inputs_tx
            .unbounded_send(Input::Slice(Event::Apply(ok(web_slice()))))
            .unwrap();
        api.expect_quiet().await;

        // Once the held write is answered, web is written again with its newest content.
        held.echo();
        planner.apply_slice(&web_slice()).unwrap();
        let last = by_name(&planner.all_objects());
        let request = api.expect_apply(&service_plan_apply_uri("web")).await;
        assert_service_plan_body(&request.body, &last[WEB_PLAN]);
        request.echo();
        api.expect_quiet().await;
    };
    run_until_done(sync, inputs_rx, leader_rx, script).await;
    drop(inputs_tx);
    api.expect_closed().await;
}

/// As leader, a plan deleted behind the controller's back (the watch reports it) is
/// written again; a Service plan someone edited (even keeping `spec.revision`, so that
/// only its content gives it away) is read and replaced whole.
#[tokio::test]
async fn sync_loop_repairs_objects_changed_behind_its_back() {
    let Looped {
        mut api,
        sync,
        inputs_tx,
        inputs_rx,
        leader_tx,
        leader_rx,
    } = looped();
    let desired = desired_cluster();

    let script = async {
        leader_tx.send(true).unwrap();
        let plans = serve_full_write(&mut api).await;
        api.expect_quiet().await;

        let plan_a: NodeProxyPlan = serde_json::from_value(plans[0].clone()).unwrap();
        inputs_tx
            .unbounded_send(Input::Plan(Event::Delete(ok(plan_a))))
            .unwrap();
        let request = api.expect_apply(&plan_apply_uri("node-a")).await;
        assert_plan_body(&request.body, &desired["node-a"], Some("uid-node-a"));
        request.echo();
        api.expect_quiet().await;

        // An endpoint added by hand, revision kept.
        let mut edited: ServiceProxyPlan =
            serde_json::from_value(serde_json::to_value(&desired[WEB_PLAN]).unwrap()).unwrap();
        edited.spec.service_ports[0]
            .cluster_endpoints
            .push(proxyplan_crds::Endpoint {
                ip: "10.244.9.9".into(),
                port: 8080,
            });
        edited.metadata.resource_version = Some("90".to_owned());
        inputs_tx
            .unbounded_send(Input::ServicePlan(Event::Apply(ok(edited.clone()))))
            .unwrap();
        // The apply keeps the endpoint (another manager owns it); the answer shows it.
        let apply = api.expect_apply(&service_plan_apply_uri("web")).await;
        assert_service_plan_body(&apply.body, &desired[WEB_PLAN]);
        apply.respond(200, &serde_json::to_value(&edited).unwrap());
        let put = api
            .expect(Method::PUT, &service_plan_replace_uri("web"))
            .await;
        let mut want = serde_json::to_value(&desired[WEB_PLAN]).unwrap();
        want["metadata"]["resourceVersion"] = json!("90");
        want["metadata"]["managedFields"] = json!([]);
        assert_eq!(put.body, want);
        put.echo();
        api.expect_quiet().await;
    };
    run_until_done(sync, inputs_rx, leader_rx, script).await;
    drop(inputs_tx);
    api.expect_closed().await;
}

/// A Service whose status the API server accepted but our types cannot read (a
/// condition with an empty `lastTransitionTime`) is planned: only the fields the planner
/// reads are decoded.
#[tokio::test]
async fn an_odd_service_status_does_not_stop_its_planning() {
    let (client, mut api) = ApiServerVerifier::new();
    let mut sync = sync_loop(client);
    let mut raw = serde_json::to_value(web()).unwrap();
    raw["status"] = json!({
        "conditions": [{"type": "X", "status": "True", "reason": "R", "message": "",
                        "lastTransitionTime": ""}]
    });
    let odd: Lenient<Service> = serde_json::from_value(raw).unwrap();
    assert!(odd.object.is_ok(), "{:?}", odd.object);
    let mut lists = initial_lists();
    lists[1] = Input::Service(Event::InitApply(odd));
    for input in lists {
        sync.handle(input);
    }
    sync.set_leader(true);
    scenario(sync.sync(), async {
        serve_full_write(&mut api).await;
    })
    .await;
    drop(sync);
    api.expect_closed().await;
}
