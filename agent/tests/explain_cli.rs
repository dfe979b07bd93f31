//! `proxyplan-agent explain` with the real binary in a throwaway network namespace, in
//! iptables and nftables modes, and in ipvs mode when run in the VM
//! (`PROXYPLAN_TEST_MODE=ipvs`, as `tests/run-all.sh` does): the plan of
//! `examples/cluster.yaml`'s node-a programmed by `apply`, then the README's broken
//! examples explained (no endpoints, Local policy without a local endpoint, an unknown
//! port), the kernel found to agree, and after tampering (a Service's map element or set
//! entry deleted, its chain flushed) found to differ, naming what a sync would put back.
//! (That each verdict is what real packets show is checked by the traffic suite,
//! `traffic.rs`, in every mode.)
//!
//! Without root the test prints a SKIPPED line and passes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../benches/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;

use common::Netns;
use proxyplan_controller::state_file::ClusterState;
use proxyplan_controller::{Planner, PlannerConfig};
use proxyplan_crds::LocalTrafficMode;
use serde_json::{Value, json};

const AGENT: &str = env!("CARGO_BIN_EXE_proxyplan-agent");

/// `examples/cluster.yaml` planned for node-a, as `proxyplan-controller plan --node
/// node-a` writes it.
fn plan_file(path: &Path) {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster.yaml");
    let state = ClusterState::read_files(&[example]).expect("examples/cluster.yaml");
    let config = PlannerConfig::new(
        &["10.244.0.0/16".to_owned()],
        false,
        LocalTrafficMode::ClusterCIDR,
    )
    .expect("config");
    let mut planner = Planner::new(config);
    assert!(planner.reset_nodes(&state.nodes).is_empty());
    assert!(planner.reset_services(&state.services).is_empty());
    assert!(planner.reset_slices(&state.slices).is_empty());
    let (plan, services) = planner.node_view("node-a").expect("node-a");
    // YAML documents (each one JSON), as the plan file takes them.
    let mut text = serde_json::to_string(&plan).unwrap();
    for service in &services {
        text.push_str("\n---\n");
        text.push_str(&serde_json::to_string(service).unwrap());
    }
    std::fs::write(path, text).unwrap();
}

/// Runs `program args` in `ns`; its stdout, after asserting success.
fn run(ns: &str, program: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, program])
        .args(args)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `explain -o json` of a flow from `from` to `to`.
fn explain(ns: &str, plan: &Path, state: &Path, from: &str, to: &str) -> Value {
    let plan = plan.to_string_lossy();
    let state = state.to_string_lossy();
    let text = run(
        ns,
        AGENT,
        &[
            "explain",
            "--plan",
            &plan,
            "--state-dir",
            &state,
            "--from",
            from,
            "--to",
            to,
            "-o",
            "json",
        ],
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn explain_names_the_fate_and_whether_the_kernel_agrees_in_each_mode() {
    if !common::is_root() {
        println!("SKIPPED: explain_cli needs root (network namespaces)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("proxyplan-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plan = dir.join("node-a.json");
    plan_file(&plan);
    // No running agent: explain renders with the defaults.
    let state = dir.join("no-agent");
    let modes: &[&str] = if std::env::var("PROXYPLAN_TEST_MODE").as_deref() == Ok("ipvs") {
        &["ipvs"]
    } else {
        &["iptables", "nftables"]
    };
    for &mode in modes {
        let ns = Netns::new(&format!("explain-{mode}"));
        let ns = ns.0.as_str();
        // The node's address, on which ipvs mode finds its node-port addresses.
        run(ns, "ip", &["link", "set", "lo", "up"]);
        run(ns, "ip", &["addr", "add", "10.10.0.1/32", "dev", "lo"]);
        let applied = run(
            ns,
            AGENT,
            &["apply", "--mode", mode, "--plan", &plan.to_string_lossy()],
        );
        assert!(applied.contains(&format!("({mode} mode)")), "{applied}");

        // A pod to web's cluster IP: both endpoints, half each, source kept.
        let x = explain(ns, &plan, &state, "10.244.1.5", "10.96.0.10:80");
        assert_eq!(x["service"]["name"], "web", "{x:#}");
        assert_eq!(x["service"]["matchedAs"], "clusterIp");
        assert_eq!(x["verdict"]["action"], "dnat");
        let reach: Vec<(&str, f64, bool)> = x["verdict"]["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["endpoint"].as_str().unwrap(),
                    e["probability"].as_f64().unwrap(),
                    e["masquerade"].as_bool().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            reach,
            [
                ("10.244.1.10:8080", 0.5, false),
                ("10.244.2.10:8080", 0.5, false)
            ]
        );
        assert_eq!(x["kernel"]["mode"], mode);
        assert_eq!(x["kernel"]["agrees"], true, "{x:#}");
        // The packet traced through the live rules (iptables) or table (nftables).
        assert_eq!(x["kernel"]["traced"]["agreesWithPlan"], true, "{x:#}");
        assert_eq!(
            x["kernel"]["traced"]["endpoints"],
            json!(["10.244.1.10:8080", "10.244.2.10:8080"])
        );

        // Broken: no endpoints; Local policy with its only endpoint on node-b; a port the
        // Service does not have.
        let x = explain(ns, &plan, &state, "10.244.1.5", "10.96.0.14:80");
        assert_eq!(x["verdict"]["action"], "reject", "{x:#}");
        assert!(
            x["verdict"]["reason"]
                .as_str()
                .unwrap()
                .contains("no usable endpoint")
        );
        let x = explain(ns, &plan, &state, "203.0.113.9", "10.10.0.1:30081");
        assert_eq!(x["verdict"]["action"], "drop", "{x:#}");
        assert_eq!(
            x["verdict"]["reason"],
            "Local policy and no endpoint on this node (1 elsewhere)"
        );
        let x = explain(ns, &plan, &state, "10.244.1.5", "10.96.0.10:81");
        let unknown = if mode == "iptables" {
            "notProxied"
        } else {
            "reject"
        };
        assert_eq!(x["verdict"]["action"], unknown, "{x:#}");
        assert_eq!(x["kernel"]["traced"]["agreesWithPlan"], true, "{x:#}");
        for flow in [
            ("203.0.113.9", "10.10.0.1:30081"),
            ("10.244.1.5", "10.96.0.14:80"),
            ("10.244.1.5", "10.10.0.1:30081"),
        ] {
            let x = explain(ns, &plan, &state, flow.0, flow.1);
            assert_eq!(x["kernel"]["traced"]["agreesWithPlan"], true, "{x:#}");
        }

        // Tampered: web's dispatch taken away by hand.
        if mode == "ipvs" {
            run(
                ns,
                "ipset",
                &["del", "PROXYPLAN-VIP-PORT", "10.96.0.10,tcp:80"],
            );
        } else if mode == "nftables" {
            run(
                ns,
                "nft",
                &[
                    "delete",
                    "element",
                    "ip",
                    "proxyplan",
                    "service-ips",
                    "{ 10.96.0.10 . tcp . 80 }",
                ],
            );
        } else {
            let rules = run(ns, "iptables-nft-save", &["-t", "nat"]);
            let chain = rules
                .lines()
                .find(|l| {
                    l.contains("demo/web:http/TCP/IPv4 cluster IP") && l.contains("-j PP-SVC-")
                })
                .and_then(|l| l.rsplit(' ').next())
                .expect("web's service chain")
                .to_owned();
            run(ns, "iptables-nft", &["-t", "nat", "-F", &chain]);
        }
        let x = explain(ns, &plan, &state, "10.244.1.5", "10.96.0.10:80");
        assert_eq!(x["verdict"]["action"], "dnat", "the plan still says so");
        assert_eq!(x["kernel"]["agrees"], false, "{x:#}");
        assert!(x["kernel"]["changes"].as_u64().unwrap() >= 1, "{x:#}");
        let differences = x["kernel"]["differences"].to_string();
        let named = match mode {
            "nftables" => "10.96.0.10 . tcp . 80",
            "ipvs" => "PROXYPLAN-VIP-PORT 10.96.0.10,tcp:80",
            _ => "demo/web:http/TCP/IPv4",
        };
        assert!(differences.contains(named), "{x:#}");
        assert_eq!(x["kernel"]["traced"]["agreesWithPlan"], false, "{x:#}");
        assert_eq!(x["kernel"]["traced"]["endpoints"], json!([]), "{x:#}");
        if mode != "iptables" {
            // Without its element (entry), web's cluster IP is a known address on an
            // unknown port: the live table (the VIP filter) rejects it.
            assert_eq!(x["kernel"]["traced"]["verdict"], "reject", "{x:#}");
        }
        if mode == "nftables" {
            // A chain someone changed is named, not traced through.
            run(
                ns,
                "nft",
                &["flush", "chain", "ip", "proxyplan", "services"],
            );
            let x = explain(ns, &plan, &state, "10.244.1.5", "10.96.0.10:80");
            assert_eq!(x["kernel"]["traced"], Value::Null, "{x:#}");
            assert!(
                x["kernel"]["traceError"]
                    .as_str()
                    .is_some_and(|e| e.contains("live chain services")),
                "{x:#}"
            );
        }
        let text = run(
            ns,
            AGENT,
            &[
                "explain",
                "--plan",
                &plan.to_string_lossy(),
                "--state-dir",
                &state.to_string_lossy(),
                "--from",
                "10.244.1.5",
                "--to",
                "10.96.0.10:80",
            ],
        );
        assert!(
            text.contains(&format!("kernel ({mode} mode): DIFFERS from the plan")),
            "{text}"
        );
        run(ns, AGENT, &["cleanup", "--mode", mode]);
        let x = explain(ns, &plan, &state, "10.244.1.5", "10.96.0.10:80");
        assert_eq!(
            x["kernel"]["mode"],
            Value::Null,
            "nothing held after cleanup: {x:#}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
