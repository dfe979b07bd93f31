//! API tests: the controller's writes (server-side apply of plans and shards, deletes),
//! its Lease election and its sync loop, against a mock API server that asserts every
//! request's method, exact path and query, and body, and that nothing else is sent.
//!
//! The cluster in every scenario: two zoned nodes (`node-a` in `eu-west-1a` with a uid,
//! `node-b` in `eu-west-1b` without), one ClusterIP Service `web` with Cluster traffic
//! policies and one EndpointSlice, planned with 2 cluster shards and 1 shard per zone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod api_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use api_support::{
    ApiServerVerifier, Received, heartbeat, mk_node, mk_service, mk_slice, plan_apply_uri,
    plan_delete_uri, scenario, shard_apply_uri, shard_delete_uri,
};
use futures::channel::mpsc;
use http::Method;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::watcher::Event;
use proxyplan_controller::run::http::{Health, Metrics};
use proxyplan_controller::run::lease::{Leadership, LeaseElector};
use proxyplan_controller::run::writer::{Kind, PlanWriter, WriteReport, kind_of, target_of};
use proxyplan_controller::run::{Input, Settings, SyncLoop};
use proxyplan_controller::{DesiredObject, ObjectId, Planner, PlannerConfig};
use proxyplan_crds::{MANAGED_BY, MANAGED_BY_LABEL, NodeProxyPlan, SCOPE_LABEL, ZONE_LABEL};
use serde_json::{Value, json};

const ZONE_A: &str = "eu-west-1a";
const ZONE_B: &str = "eu-west-1b";
const SHARD_ZONE_A: &str = "zone-eu-west-1a-0";
const SHARD_ZONE_B: &str = "zone-eu-west-1b-0";
/// Every shard of the cluster, in URI order.
const ALL_SHARDS: [&str; 4] = ["cluster-0", "cluster-1", SHARD_ZONE_A, SHARD_ZONE_B];
/// Every plan of the cluster, in URI order.
const ALL_PLANS: [&str; 2] = ["node-a", "node-b"];

// ---------------------------------------------------------------------------------------
// The cluster

fn config() -> PlannerConfig {
    PlannerConfig {
        cluster_shards: 2,
        zone_shards: 1,
        ..PlannerConfig::default()
    }
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

/// The planner after its first changes were taken, a writer whose view of the server
/// holds exactly those (as its watches would report them), and the verifier.
fn written_cluster() -> (Planner, PlanWriter, ApiServerVerifier) {
    let mut planner = planned_cluster();
    let first = planner.take_changes();
    assert_eq!(first.apply.len(), 6, "4 shards and 2 plans");
    let (client, api) = ApiServerVerifier::new();
    let mut writer = PlanWriter::new(client);
    for object in &first.apply {
        writer.observe(kind_of(object), object.name(), Some(object.revision()));
    }
    (planner, writer, api)
}

fn by_name(objects: &[DesiredObject]) -> BTreeMap<String, DesiredObject> {
    objects
        .iter()
        .map(|o| (o.name().to_owned(), o.clone()))
        .collect()
}

/// The cluster shard that holds `web` (a stable hash decides which).
fn web_shard(objects: &[DesiredObject]) -> String {
    let holders: Vec<&str> = objects
        .iter()
        .filter(|o| matches!(o, DesiredObject::Shard(s) if !s.spec.service_ports.is_empty()))
        .map(DesiredObject::name)
        .collect();
    assert_eq!(holders.len(), 1, "exactly one cluster shard holds web");
    assert!(holders[0].starts_with("cluster-"), "{holders:?}");
    holders[0].to_owned()
}

// ---------------------------------------------------------------------------------------
// Assertions on request bodies

/// A `ProxyPlanShard` apply body: identity, labels, no owner, the desired revision, and
/// nothing but the desired object.
fn assert_shard_body(body: &Value, desired: &DesiredObject) {
    let name = desired.name();
    let scope = if name.starts_with("cluster-") {
        "cluster"
    } else {
        "zone"
    };
    assert_eq!(body["apiVersion"], "proxyplan.dev/v1alpha1", "{name}");
    assert_eq!(body["kind"], "ProxyPlanShard", "{name}");
    assert_eq!(body["metadata"]["name"], name);
    let mut labels = json!({ MANAGED_BY_LABEL: MANAGED_BY, SCOPE_LABEL: scope });
    if let DesiredObject::Shard(shard) = desired
        && let Some(zone) = &shard.spec.zone
    {
        labels[ZONE_LABEL] = json!(zone);
    }
    assert_eq!(body["metadata"]["labels"], labels, "{name}: labels");
    assert!(
        body["metadata"].get("ownerReferences").is_none(),
        "{name}: shards have no owner"
    );
    assert!(
        body["metadata"].get("resourceVersion").is_none(),
        "{name}: an apply never carries a resourceVersion"
    );
    assert_eq!(body["spec"]["revision"], desired.revision(), "{name}");
    assert_eq!(
        body["spec"]["scope"],
        if scope == "zone" { "Zone" } else { "Cluster" }
    );
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

/// Checks a batch of shard applies (sorted by URI) against `desired` and echoes each.
fn answer_shards(batch: Vec<Received>, names: &[&str], desired: &BTreeMap<String, DesiredObject>) {
    let uris: Vec<&str> = batch.iter().map(|r| r.uri.as_str()).collect();
    let expected: Vec<String> = names.iter().map(|n| shard_apply_uri(n)).collect();
    assert_eq!(uris, expected, "shard applies");
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
        assert_shard_body(&request.body, &desired[&name]);
        request.echo();
    }
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
}

// ---------------------------------------------------------------------------------------
// PlanWriter

/// First sync: every shard is applied (and confirmed) before any plan, so an agent never
/// sees a plan naming a shard that does not exist yet; each body is exactly the desired
/// object under one field manager, with `force`.
#[tokio::test]
async fn first_sync_applies_every_shard_then_every_plan() {
    let mut planner = planned_cluster();
    let changes = planner.take_changes();
    assert!(changes.delete.is_empty(), "{:?}", changes.delete);
    let desired = by_name(&changes.apply);
    let web_shard = web_shard(&changes.apply);
    let (client, mut api) = ApiServerVerifier::new();
    let mut writer = PlanWriter::new(client);

    let (report, ()) = scenario(writer.write(changes.apply, Vec::new()), async {
        let shards = api.next_batch(ALL_SHARDS.len()).await;
        // No plan may be sent while a shard is unconfirmed.
        api.expect_quiet().await;
        let holder = shards
            .iter()
            .find(|r| r.uri == shard_apply_uri(&web_shard))
            .unwrap();
        assert_eq!(
            holder.body["spec"]["servicePorts"][0]["clusterIP"], "10.96.0.10",
            "web's entry lives in {web_shard}"
        );
        answer_shards(shards, &ALL_SHARDS, &desired);
        let plans = api.next_batch(ALL_PLANS.len()).await;
        assert_eq!(
            plans[0].body["spec"]["shards"],
            json!([{ "name": "cluster-0" }, { "name": "cluster-1" }, { "name": SHARD_ZONE_A }]),
            "node-a merges the cluster shards and its zone's"
        );
        answer_plans(plans, &ALL_PLANS, &desired);
    })
    .await;

    assert_clean(&report);
    let mut applied = targets(Kind::Plan, &ALL_PLANS);
    applied.extend(targets(Kind::Shard, &ALL_SHARDS));
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

/// An endpoint of a Cluster-policy Service moves: exactly one cluster shard is written,
/// whatever the number of nodes. Then events that change nothing (the same Service
/// again, a node heartbeat, the same slice again) produce no change and no request.
#[tokio::test]
async fn one_endpoint_change_writes_one_cluster_shard_and_no_ops_write_nothing() {
    let (mut planner, mut writer, mut api) = written_cluster();
    let web_shard = web_shard(&planner.all_objects());
    let before = writer
        .observed_revision(Kind::Shard, &web_shard)
        .unwrap()
        .to_owned();

    planner.apply_slice(&web_slice_moved()).unwrap();
    let changes = planner.take_changes();
    assert!(changes.delete.is_empty());
    assert_eq!(
        changes
            .apply
            .iter()
            .map(DesiredObject::name)
            .collect::<Vec<_>>(),
        [web_shard.as_str()]
    );
    let desired = by_name(&changes.apply);
    assert_ne!(desired[&web_shard].revision(), before);

    let (report, ()) = scenario(writer.write(changes.apply, Vec::new()), async {
        let request = api.expect_apply(&shard_apply_uri(&web_shard)).await;
        assert_shard_body(&request.body, &desired[&web_shard]);
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
    assert_eq!(report.applied, targets(Kind::Shard, &[&web_shard]));
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

    let (report, ()) = scenario(writer.write(changes.apply, Vec::new()), api.expect_quiet()).await;
    assert_clean(&report);
    assert!(report.applied.is_empty() && report.deleted.is_empty());
    assert_eq!(report.unchanged, 0);
    drop(writer);
    api.expect_closed().await;
}

/// The last node of a zone goes: its plan and its zone's shards are deleted; a 404 (the
/// garbage collector was faster) counts as done. Deleting them again sends nothing.
#[tokio::test]
async fn deleting_the_last_node_of_a_zone_deletes_its_plan_and_zone_shards() {
    let (mut planner, mut writer, mut api) = written_cluster();

    planner.delete_node("node-b");
    let changes = planner.take_changes();
    assert!(changes.apply.is_empty(), "{:?}", changes.apply);
    assert_eq!(
        changes.delete,
        [
            ObjectId::Plan("node-b".to_owned()),
            ObjectId::ZoneShard(ZONE_B.to_owned(), 0)
        ]
    );
    let delete: Vec<(Kind, String)> = changes.delete.iter().map(target_of).collect();

    let (report, ()) = scenario(writer.write(Vec::new(), delete.clone()), async {
        let batch = api.next_batch(2).await;
        let mut batch = batch.into_iter();
        let plan = batch.next().unwrap();
        assert_eq!(
            (&plan.method, plan.uri.as_str()),
            (&Method::DELETE, plan_delete_uri("node-b").as_str())
        );
        assert_eq!(plan.body, json!({}), "default delete options");
        plan.deleted();
        let shard = batch.next().unwrap();
        assert_eq!(
            (&shard.method, shard.uri.as_str()),
            (&Method::DELETE, shard_delete_uri(SHARD_ZONE_B).as_str())
        );
        assert_eq!(shard.body, json!({}), "default delete options");
        shard.not_found();
    })
    .await;
    assert_clean(&report);
    assert_eq!(
        report.deleted,
        [
            (Kind::Plan, "node-b".to_owned()),
            (Kind::Shard, SHARD_ZONE_B.to_owned())
        ]
    );
    assert!(report.applied.is_empty());
    assert_eq!(writer.observed_revision(Kind::Plan, "node-b"), None);
    assert_eq!(writer.observed_revision(Kind::Shard, SHARD_ZONE_B), None);

    let (report, ()) = scenario(writer.write(Vec::new(), delete), api.expect_quiet()).await;
    assert_clean(&report);
    assert!(
        report.deleted.is_empty(),
        "already gone: {:?}",
        report.deleted
    );
    drop(writer);
    api.expect_closed().await;
}

/// A node goes whose zone keeps other nodes: only its plan is deleted.
#[tokio::test]
async fn deleting_a_node_whose_zone_has_other_nodes_deletes_only_its_plan() {
    let (mut planner, mut writer, mut api) = written_cluster();
    planner
        .apply_node(&mk_node("node-c", ZONE_A, Some("uid-node-c"), 3))
        .unwrap();
    let changes = planner.take_changes();
    assert_eq!(
        changes
            .apply
            .iter()
            .map(DesiredObject::name)
            .collect::<Vec<_>>(),
        ["node-c"]
    );
    for object in &changes.apply {
        writer.observe(kind_of(object), object.name(), Some(object.revision()));
    }

    planner.delete_node("node-c");
    let changes = planner.take_changes();
    assert!(changes.apply.is_empty());
    assert_eq!(changes.delete, [ObjectId::Plan("node-c".to_owned())]);
    let delete = changes.delete.iter().map(target_of).collect();

    let (report, ()) = scenario(writer.write(Vec::new(), delete), async {
        api.expect_delete(&plan_delete_uri("node-c"))
            .await
            .deleted();
    })
    .await;
    assert_clean(&report);
    assert_eq!(report.deleted, targets(Kind::Plan, &["node-c"]));
    drop(writer);
    api.expect_closed().await;
}

/// A delete the API server refuses is reported, and the writer still believes the object
/// exists, so the retry sends it again.
#[tokio::test]
async fn a_failed_delete_is_reported_and_retried() {
    let (mut planner, mut writer, mut api) = written_cluster();
    planner.delete_node("node-a");
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
            (Kind::Shard, SHARD_ZONE_A.to_owned())
        ]
    );

    let (report, ()) = scenario(writer.write(Vec::new(), delete.clone()), async {
        let mut batch = api.next_batch(2).await.into_iter();
        let plan = batch.next().unwrap();
        assert_eq!(plan.uri, plan_delete_uri("node-a"));
        plan.fail(500, "InternalError");
        let shard = batch.next().unwrap();
        assert_eq!(shard.uri, shard_delete_uri(SHARD_ZONE_A));
        shard.deleted();
    })
    .await;
    assert_eq!(report.deleted, targets(Kind::Shard, &[SHARD_ZONE_A]));
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

    let (report, ()) = scenario(writer.write(Vec::new(), delete), async {
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
            writer.observe(kind_of(object), object.name(), Some(object.revision()));
        }
    }

    let (report, ()) = scenario(writer.write(objects.clone(), Vec::new()), async {
        api.expect_apply(&plan_apply_uri("node-b"))
            .await
            .fail(422, "Invalid");
    })
    .await;
    assert!(report.applied.is_empty());
    assert_eq!(report.unchanged, 5);
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

    let (report, ()) = scenario(writer.write(objects, Vec::new()), async {
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

/// A full reconcile where the server holds a shard nobody references any more
/// (`cluster-7`, from a time with more cluster shards): exactly that shard is deleted,
/// everything else is unchanged.
#[tokio::test]
async fn full_reconcile_deletes_only_the_shard_nobody_references() {
    let (planner, mut writer, mut api) = written_cluster();
    writer.observe(Kind::Shard, "cluster-7", Some("0123456789abcdef"));
    let all = planner.all_objects();
    let stale = writer.stale(&all);
    assert_eq!(stale, targets(Kind::Shard, &["cluster-7"]));

    let (report, ()) = scenario(writer.write(all, stale), async {
        api.expect_delete(&shard_delete_uri("cluster-7"))
            .await
            .deleted();
    })
    .await;
    assert_clean(&report);
    assert!(report.applied.is_empty());
    assert_eq!(report.deleted, targets(Kind::Shard, &["cluster-7"]));
    assert_eq!(report.unchanged, 6);
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

    let (report, ()) = scenario(writer.write(all.clone(), Vec::new()), api.expect_quiet()).await;
    assert_clean(&report);
    assert!(report.applied.is_empty() && report.deleted.is_empty());
    assert_eq!(report.unchanged, 6);

    // Someone edited node-a's plan: the watch shows another revision.
    let diverged = writer.observe(Kind::Plan, "node-a", Some("edited-by-someone"));
    assert!(diverged, "the writer had confirmed another revision");
    let (report, ()) = scenario(writer.write(all, Vec::new()), async {
        let request = api.expect_apply(&plan_apply_uri("node-a")).await;
        assert_plan_body(&request.body, &desired["node-a"], Some("uid-node-a"));
        request.echo();
    })
    .await;
    assert_clean(&report);
    assert_eq!(report.applied, targets(Kind::Plan, &["node-a"]));
    assert_eq!(report.unchanged, 5);
    drop(writer);
    api.expect_closed().await;
}

/// `proxyplan.dev/zone` is documented (crds `ZONE_LABEL`) as the label on a zone shard
/// naming its zone.
#[tokio::test]
async fn zone_shards_carry_the_zone_label() {
    let mut planner = planned_cluster();
    let changes = planner.take_changes();
    let desired = by_name(&changes.apply);
    let (client, mut api) = ApiServerVerifier::new();
    let mut writer = PlanWriter::new(client);
    let (_, ()) = scenario(writer.write(changes.apply, Vec::new()), async {
        for request in api.next_batch(ALL_SHARDS.len()).await {
            let name = request.body["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_owned();
            if let DesiredObject::Shard(shard) = &desired[&name]
                && let Some(zone) = &shard.spec.zone
            {
                assert_eq!(
                    request.body["metadata"]["labels"][ZONE_LABEL], *zone,
                    "{name}: zone label"
                );
            }
            request.echo();
        }
        for request in api.next_batch(ALL_PLANS.len()).await {
            request.echo();
        }
    })
    .await;
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
    let elector = elector(client);
    let (result, ()) = scenario(elector.try_acquire_or_renew(t0()), async {
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
    let elector = elector(client);
    let (result, ()) = scenario(elector.try_acquire_or_renew(t0()), async {
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
    let elector = elector(client);
    let (result, ()) = scenario(elector.try_acquire_or_renew(t0()), async {
        api.expect(Method::GET, LEASE_URI)
            .await
            .respond(200, &lease(Some(THEM), -100, 0, 3, "41"));
    })
    .await;
    assert_eq!(result.unwrap(), Leadership::Follower);
    api.expect_nothing_queued();
    // Still valid at the last second of its duration.
    let (result, ()) = scenario(elector.try_acquire_or_renew(at(14)), async {
        api.expect(Method::GET, LEASE_URI)
            .await
            .respond(200, &lease(Some(THEM), -100, 0, 3, "41"));
    })
    .await;
    assert_eq!(result.unwrap(), Leadership::Follower);
    drop(elector);
    api.expect_closed().await;
}

/// (c) A Lease another replica let expire: we replace it (same resourceVersion), with
/// one more transition, and lead.
#[tokio::test]
async fn lease_expired_is_taken_over() {
    let (client, mut api) = ApiServerVerifier::new();
    let elector = elector(client);
    let now = 16;
    let (result, ()) = scenario(elector.try_acquire_or_renew(at(now)), async {
        let read = lease(Some(THEM), -100, 0, 3, "42");
        api.expect(Method::GET, LEASE_URI).await.respond(200, &read);
        let replace = api.next().await;
        assert_lease_replace(&replace, &read, now, now, 4);
        let mut stored = replace.body.clone();
        stored["metadata"]["resourceVersion"] = json!("43");
        replace.respond(200, &stored);
    })
    .await;
    assert_eq!(result.unwrap(), Leadership::Leader);
    drop(elector);
    api.expect_closed().await;
}

/// A Lease nobody holds (released) is taken at once.
#[tokio::test]
async fn lease_released_is_taken_at_once() {
    let (client, mut api) = ApiServerVerifier::new();
    let elector = elector(client);
    let (result, ()) = scenario(elector.try_acquire_or_renew(at(1)), async {
        let mut read = lease(None, -100, 0, 3, "42");
        read["spec"]["leaseDurationSeconds"] = json!(1);
        api.expect(Method::GET, LEASE_URI).await.respond(200, &read);
        let replace = api.next().await;
        assert_lease_replace(&replace, &read, 1, 1, 4);
        replace.echo();
    })
    .await;
    assert_eq!(result.unwrap(), Leadership::Leader);
    drop(elector);
    api.expect_closed().await;
}

/// (d), (e) and renewal: round 1 another replica leads; round 2 its Lease expired but
/// our replace loses the race (409): follower; round 3 the winner let it expire too: we
/// take it; round 4 we renew (acquire time and transitions kept).
#[tokio::test]
async fn lease_lost_race_then_regained_then_renewed() {
    let (client, mut api) = ApiServerVerifier::new();
    let elector = elector(client);

    let (result, ()) = scenario(elector.try_acquire_or_renew(at(0)), async {
        api.expect(Method::GET, LEASE_URI)
            .await
            .respond(200, &lease(Some(THEM), -100, -2, 3, "42"));
    })
    .await;
    assert_eq!(result.unwrap(), Leadership::Follower);

    let (result, ()) = scenario(elector.try_acquire_or_renew(at(20)), async {
        let read = lease(Some(THEM), -100, -2, 3, "42");
        api.expect(Method::GET, LEASE_URI).await.respond(200, &read);
        let replace = api.next().await;
        assert_lease_replace(&replace, &read, 20, 20, 4);
        replace.conflict();
    })
    .await;
    assert_eq!(result.unwrap(), Leadership::Follower, "lost the race");

    let (result, ()) = scenario(elector.try_acquire_or_renew(at(40)), async {
        let read = lease(Some("replica-c"), 20, 22, 4, "44");
        api.expect(Method::GET, LEASE_URI).await.respond(200, &read);
        let replace = api.next().await;
        assert_lease_replace(&replace, &read, 40, 40, 5);
        let mut stored = replace.body.clone();
        stored["metadata"]["resourceVersion"] = json!("45");
        replace.respond(200, &stored);
    })
    .await;
    assert_eq!(result.unwrap(), Leadership::Leader, "regained");

    let (result, ()) = scenario(elector.try_acquire_or_renew(at(42)), async {
        let read = lease(Some(US), 40, 40, 5, "45");
        api.expect(Method::GET, LEASE_URI).await.respond(200, &read);
        let replace = api.next().await;
        assert_lease_replace(&replace, &read, 40, 42, 5);
        replace.echo();
    })
    .await;
    assert_eq!(result.unwrap(), Leadership::Leader, "renewed");
    drop(elector);
    api.expect_closed().await;
}

/// An API error other than a lost race is an error, not a leadership answer.
#[tokio::test]
async fn lease_api_errors_are_errors() {
    let (client, mut api) = ApiServerVerifier::new();
    let elector = elector(client);
    let (result, ()) = scenario(elector.try_acquire_or_renew(t0()), async {
        api.expect(Method::GET, LEASE_URI)
            .await
            .fail(403, "Forbidden");
    })
    .await;
    assert!(
        matches!(result, Err(kube::Error::Api(ref s)) if s.code == 403),
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
    }
}

fn sync_loop(client: kube::Client) -> SyncLoop {
    SyncLoop::new(
        client,
        &settings(),
        Arc::new(Metrics::new()),
        Arc::new(Health::default()),
    )
}

/// The initial list of every watch: the cluster, and no plans or shards yet.
fn initial_lists() -> Vec<Input> {
    vec![
        Input::Service(Event::Init),
        Input::Service(Event::InitApply(web())),
        Input::Service(Event::InitDone),
        Input::Slice(Event::Init),
        Input::Slice(Event::InitApply(web_slice())),
        Input::Slice(Event::InitDone),
        Input::Node(Event::Init),
        Input::Node(Event::InitApply(node_a())),
        Input::Node(Event::InitApply(node_b())),
        Input::Node(Event::InitDone),
        Input::Plan(Event::Init),
        Input::Plan(Event::InitDone),
        Input::Shard(Event::Init),
        Input::Shard(Event::InitDone),
    ]
}

/// What the planner wants for the cluster, by name.
fn desired_cluster() -> BTreeMap<String, DesiredObject> {
    by_name(&planned_cluster().all_objects())
}

/// Serves a full write of the cluster: every shard, then every plan. Returns the plan
/// bodies as the server stored them.
async fn serve_full_write(api: &mut ApiServerVerifier) -> Vec<Value> {
    let desired = desired_cluster();
    let shards = api.next_batch(ALL_SHARDS.len()).await;
    answer_shards(shards, &ALL_SHARDS, &desired);
    let plans = api.next_batch(ALL_PLANS.len()).await;
    let bodies = plans.iter().map(|r| r.body.clone()).collect();
    answer_plans(plans, &ALL_PLANS, &desired);
    bodies
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
    assert!(!sync.synced(), "the shard watch has not listed yet");
    sync.set_leader(true);
    scenario(sync.sync(), api.expect_quiet()).await;
    drop(sync);
    api.expect_closed().await;
}

/// The loop as `run` drives it: synced but follower, it writes nothing; leading, it
/// writes the cluster once; an endpoint change while follower is not written until it
/// leads again, and then only that shard (a full reconcile skips what the server has).
#[tokio::test]
async fn sync_loop_run_writes_only_while_leading() {
    let (client, mut api) = ApiServerVerifier::new();
    let mut sync = sync_loop(client);
    let (inputs_tx, inputs_rx) = mpsc::unbounded::<Input>();
    let (leader_tx, leader_rx) = tokio::sync::watch::channel(false);
    for input in initial_lists() {
        inputs_tx.unbounded_send(input).unwrap();
    }
    let web_shard = web_shard(&planned_cluster().all_objects());

    let script = async {
        api.expect_quiet().await;
        leader_tx.send(true).unwrap();
        serve_full_write(&mut api).await;
        api.expect_quiet().await;

        leader_tx.send(false).unwrap();
        inputs_tx
            .unbounded_send(Input::Slice(Event::Apply(web_slice_moved())))
            .unwrap();
        api.expect_quiet().await;

        leader_tx.send(true).unwrap();
        let mut planner = planned_cluster();
        planner.apply_slice(&web_slice_moved()).unwrap();
        let desired = by_name(&planner.all_objects());
        let request = api.expect_apply(&shard_apply_uri(&web_shard)).await;
        assert_shard_body(&request.body, &desired[&web_shard]);
        request.echo();
        api.expect_quiet().await;
    };
    tokio::time::timeout(Duration::from_secs(30), async {
        tokio::select! {
            () = sync.run(Box::pin(inputs_rx), leader_rx) => panic!("the loop ended"),
            () = script => {}
        }
    })
    .await
    .expect("scenario timed out");
    drop(sync);
    drop(inputs_tx);
    api.expect_closed().await;
}

/// As leader, a plan deleted behind the controller's back (the watch reports it) is
/// written again; a shard someone edited is written back.
#[tokio::test]
async fn sync_loop_repairs_objects_changed_behind_its_back() {
    let (client, mut api) = ApiServerVerifier::new();
    let mut sync = sync_loop(client);
    let (inputs_tx, inputs_rx) = mpsc::unbounded::<Input>();
    let (leader_tx, leader_rx) = tokio::sync::watch::channel(false);
    for input in initial_lists() {
        inputs_tx.unbounded_send(input).unwrap();
    }
    let desired = desired_cluster();

    let script = async {
        leader_tx.send(true).unwrap();
        let plans = serve_full_write(&mut api).await;
        api.expect_quiet().await;

        let plan_a: NodeProxyPlan = serde_json::from_value(plans[0].clone()).unwrap();
        inputs_tx
            .unbounded_send(Input::Plan(Event::Delete(plan_a)))
            .unwrap();
        let request = api.expect_apply(&plan_apply_uri("node-a")).await;
        assert_plan_body(&request.body, &desired["node-a"], Some("uid-node-a"));
        request.echo();
        api.expect_quiet().await;

        let mut edited: proxyplan_crds::ProxyPlanShard =
            serde_json::from_value(serde_json::to_value(&desired["cluster-0"]).unwrap()).unwrap();
        edited.spec.revision = "edited-by-someone".to_owned();
        inputs_tx
            .unbounded_send(Input::Shard(Event::Apply(edited)))
            .unwrap();
        let request = api.expect_apply(&shard_apply_uri("cluster-0")).await;
        assert_shard_body(&request.body, &desired["cluster-0"]);
        request.echo();
        api.expect_quiet().await;
    };
    tokio::time::timeout(Duration::from_secs(30), async {
        tokio::select! {
            () = sync.run(Box::pin(inputs_rx), leader_rx) => panic!("the loop ended"),
            () = script => {}
        }
    })
    .await
    .expect("scenario timed out");
    drop(sync);
    drop(inputs_tx);
    api.expect_closed().await;
}
