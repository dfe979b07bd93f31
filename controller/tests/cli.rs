//! `proxyplan-controller plan`, run as a user runs it.

#![allow(clippy::expect_used, reason = "test helpers fail loudly")]

use std::process::Command;

fn plan(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_proxyplan-controller"))
        .arg("plan")
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("run proxyplan-controller");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn node_view_of_the_example_is_its_plan_then_every_service_plan() {
    let (code, stdout, stderr) = plan(&["--state", "examples/cluster.yaml", "--node", "node-b"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr, "");
    let kinds: Vec<String> = serde_yaml::Deserializer::from_str(&stdout)
        .map(|doc| {
            let value = <serde_yaml::Value as serde::Deserialize>::deserialize(doc).expect("yaml");
            format!(
                "{}/{}{}",
                value["kind"].as_str().unwrap_or("?"),
                value["metadata"]["namespace"]
                    .as_str()
                    .map_or_else(String::new, |ns| format!("{ns}/")),
                value["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "NodeProxyPlan/node-b",
            "ServiceProxyPlan/demo/empty",
            "ServiceProxyPlan/demo/local-lb",
            "ServiceProxyPlan/demo/sticky",
            "ServiceProxyPlan/demo/web",
            "ServiceProxyPlan/demo/web-nodeport",
        ]
    );
    assert!(
        stdout.contains("key: demo/local-lb:http/TCP/IPv4"),
        "node-b's overlay names its Local service"
    );
}

#[test]
fn json_output_is_a_list_of_every_object() {
    let (code, stdout, stderr) = plan(&["--state", "examples/cluster.yaml", "-o", "json"]);
    assert_eq!(code, 0, "{stderr}");
    let list: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(list["kind"], "List");
    // 2 node plans, 5 Service plans: a small cluster has a few small objects.
    assert_eq!(list["items"].as_array().map(Vec::len), Some(7));
}

/// ServiceCIDRs in the state reach every node plan, as the running controller's do (a
/// dump of any cluster since 1.33 holds at least the default one); a malformed one is
/// skipped, naming its field.
#[test]
fn service_cidrs_reach_every_node_plan_and_a_malformed_one_is_named() {
    let dir = std::env::temp_dir().join(format!("pp-cli-cidr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let file = dir.join("cidrs.yaml");
    std::fs::write(
        &file,
        "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec: {cidrs: [10.96.0.0/16]}\n\
         ---\napiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: broken}\nspec: {cidrs: [10.300.0.0/16]}\n",
    )
    .expect("write state");
    let path = file.display().to_string();
    let (code, stdout, stderr) = plan(&[
        "--state",
        "examples/cluster.yaml",
        "--state",
        &path,
        "-o",
        "json",
    ]);
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains("ServiceCIDR broken") && stderr.contains("spec.cidrs[0]"),
        "{stderr}"
    );
    let list: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    let node_plans: Vec<&serde_json::Value> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|o| o["kind"] == "NodeProxyPlan")
        .collect();
    assert_eq!(node_plans.len(), 2);
    for plan in node_plans {
        assert_eq!(
            plan["spec"]["serviceCIDRs"],
            serde_json::json!(["10.96.0.0/16"]),
            "{plan}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unusable_objects_are_reported_with_their_source_and_exit_3() {
    let dir = std::env::temp_dir().join(format!("pp-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let file = dir.join("state.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: x}\nspec: {clusterIP: 10.0.0.300, ports: [{port: 80}]}\n\
         ---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {name: ext, namespace: x}\nspec: {type: ExternalName, externalName: a.b}\n",
    )
    .expect("write state");
    let path = file.display().to_string();
    let (code, _, stderr) = plan(&["--state", &path]);
    assert_eq!(code, 3, "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines,
        [
            format!("note: {path}:3: Service x/ext: ignored: type ExternalName"),
            format!("skipped: {path}:2: ConfigMap c: kind ConfigMap is not read by the planner"),
            format!(
                "skipped: {path}:1: Service x/bad: spec.clusterIP: \"10.0.0.300\" is not an IP address"
            ),
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_node_and_unreadable_file_are_errors() {
    let (code, _, stderr) = plan(&["--state", "examples/cluster.yaml", "--node", "node-z"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("node \"node-z\" is not in the state files (nodes: node-a, node-b)"),
        "{stderr}"
    );
    let (code, _, stderr) = plan(&["--state", "/nonexistent/state.yaml"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("reading /nonexistent/state.yaml"),
        "{stderr}"
    );
}
