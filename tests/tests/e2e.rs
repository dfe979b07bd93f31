//! End-to-end suite against a real cluster (DESIGN §6 item 6).
//!
//! ```text
//! cargo build --bins
//! sudo cargo test -p proxyplan-tests --test e2e                  # its own control plane
//! sudo E2E_KUBECONFIG=/path/to/kubeconfig cargo test -p proxyplan-tests --test e2e
//! ```
//!
//! The suite runs the real binaries as local processes against a real API server:
//!
//! - without `E2E_KUBECONFIG`, its own: etcd and kube-apiserver v1.36.2 on loopback,
//!   dual-stack, started by `../shared/k8s/control-plane.sh` (about 7 s) and stopped at
//!   the end. When it cannot start, every scenario fails with the reason; nothing is
//!   skipped.
//! - `E2E_KUBECONFIG`: kubeconfig of a **disposable** cluster without proxyplan
//!   installed (kind, for instance; on a cloud cluster the cloud's node controller may
//!   delete the fake nodes). Its current context is used, with the permissions of a
//!   cluster admin.
//! - `E2E_CONTROLLER_BIN`, `E2E_AGENT_BIN`: the binaries; default
//!   `target/<profile>/proxyplan-{controller,agent}` of this workspace (build them with
//!   `cargo build --bins`; `cargo test` does not).
//!
//! What it does to the cluster: server-side applies the CRDs of
//! `charts/proxyplan/crds/` (field manager `proxyplan-e2e`; they stay installed), creates
//! a namespace `proxyplan-e2e-<run id>` (which also holds the controller's Lease), three
//! fake Node objects `proxyplan-e2e-<run id>-{a,b,c}` (two zones, InternalIPs in
//! 192.0.2.0/24, pod CIDRs in 10.250.0.0/16, tainted `proxyplan.dev/e2e-fake-node:
//! NoSchedule`; nothing runs on them), and selector-less Services of every kind with
//! hand-written EndpointSlices. The controller plans every node and Service of the
//! cluster, so plans and Service plans for the cluster's own nodes are left behind. Clean-up
//! (also after a failure, a panic or Ctrl-C) deletes the Services, slices and fake Nodes,
//! lets the controller drop their plans and entries, stops every process, deletes the
//! network namespaces and the namespace. Logs are kept in `$TMPDIR/proxyplan-e2e-<run
//! id>/` when something failed.
//!
//! How the agents run: each agent programs the kernel, so each runs in its own throwaway
//! network namespace (`ip netns add pp-e2e-<run id>-<letter>`, then `ip netns exec`),
//! which needs root; without root the scenarios that need agents fail with that reason
//! (the controller-side checks still run). A fresh namespace has no route to the API
//! server, so the agent's kubeconfig points at `127.0.0.1:6443` inside its namespace,
//! where `proxyplan-e2e-forward` (a bin target of this crate) accepts and relays each
//! connection over a Unix socket (file-system sockets cross network namespaces) to this
//! process, which connects to the real API server. TLS stays end to end: the kubeconfig
//! sets `tls-server-name` to the server's own name. Credentials that need the network
//! themselves (exec plugins calling a cloud) do not work from a namespace.
//!
//! Output is libtest's (`test <name> ... ok|FAILED`, a failures section, `test result:`)
//! and the exit code is 1 when a scenario failed. Name filters select nothing or the
//! whole suite (the scenarios build on each other).

#[path = "e2e/cluster.rs"]
mod cluster;
#[path = "e2e/procs.rs"]
mod procs;
#[path = "e2e/suite.rs"]
mod suite;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use futures::FutureExt;
use proxyplan_tests::control_plane::ControlPlane;
use proxyplan_tests::e2e::report::{
    Args, Counts, KUBECONFIG_VARIABLE, failures_section, result_line, test_line,
};
use suite::Suite;

/// The scenarios, in the order they run; each builds on the ones before.
const SCENARIOS: [&str; 7] = [
    "crds_install_and_become_established",
    "controller_writes_a_plan_per_node",
    "merged_plans_hold_every_service_kind",
    "agents_apply_their_plans_and_report_ready",
    "endpoint_change_propagates_to_its_service_plan_and_agents",
    "local_endpoint_move_rewrites_only_those_nodes_plans",
    "deleted_node_loses_its_plan",
];

/// Scenarios after which a failure stops the rest (they need what it made).
const BLOCKING: [&str; 2] = [SCENARIOS[0], SCENARIOS[1]];

fn main() -> ExitCode {
    let started = Instant::now();
    let args = Args::parse(std::env::args().skip(1));
    if args.list {
        for name in SCENARIOS {
            println!("{name}: test");
        }
        println!("\n{} tests, 0 benchmarks", SCENARIOS.len());
        return ExitCode::SUCCESS;
    }
    if !SCENARIOS.iter().any(|s| args.selects(s)) {
        println!("\nrunning 0 tests\n");
        let counts = Counts {
            filtered_out: SCENARIOS.len(),
            ..Counts::default()
        };
        println!("{}\n", result_line(counts, started.elapsed()));
        return ExitCode::SUCCESS;
    }
    // A cluster named by E2E_KUBECONFIG, else a real control plane of our own.
    let (kubeconfig, _plane) = match std::env::var_os(KUBECONFIG_VARIABLE).filter(|v| !v.is_empty())
    {
        Some(path) => (PathBuf::from(path), None),
        None => match start_control_plane() {
            Ok(plane) => (plane.kubeconfig(), Some(plane)),
            Err(why) => {
                println!("\nrunning {} tests", SCENARIOS.len());
                let failures: Vec<(&str, String)> =
                    SCENARIOS.iter().map(|name| (*name, why.clone())).collect();
                for name in SCENARIOS {
                    println!("{}", test_line(name, false));
                }
                print!("{}", failures_section(&failures));
                let counts = Counts {
                    failed: SCENARIOS.len(),
                    ..Counts::default()
                };
                println!("\n{}\n", result_line(counts, started.elapsed()));
                return ExitCode::FAILURE;
            }
        },
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("e2e: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let outcomes = runtime.block_on(run(kubeconfig));
    let failures: Vec<(&str, String)> = outcomes
        .iter()
        .filter_map(|(name, result)| result.clone().err().map(|e| (*name, e)))
        .collect();
    print!("{}", failures_section(&failures));
    let counts = Counts {
        passed: outcomes.len() - failures.len(),
        failed: failures.len(),
        ..Counts::default()
    };
    println!("\n{}\n", result_line(counts, started.elapsed()));
    // The forwarder threads stay blocked in accept(); do not wait for them.
    runtime.shutdown_background();
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Starts the suite's own dual-stack control plane (etcd and kube-apiserver v1.36.2 on
/// loopback) in a fresh temporary folder.
fn start_control_plane() -> Result<ControlPlane, String> {
    let dir = std::env::temp_dir().join(format!("proxyplan-e2e-cp-{}", std::process::id()));
    let plane = ControlPlane::start(&dir, true)
        .map_err(|e| format!("starting the real control plane for the suite: {e}"))?;
    println!(
        "e2e: {KUBECONFIG_VARIABLE} is not set: started a real kube-apiserver v1.36.2 \
         (dual-stack) in {} in {:.1}s",
        plane.dir().display(),
        plane.started_in.as_secs_f64()
    );
    Ok(plane)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "(no message)".to_owned());
    format!("panicked: {text}")
}

async fn scenario(suite: &mut Suite, name: &str) -> Result<(), String> {
    match name {
        "crds_install_and_become_established" => suite.crds().await,
        "controller_writes_a_plan_per_node" => {
            suite
                .setup()
                .await
                .map_err(|e| format!("setting up: {e}"))?;
            if let Some(why) = &suite.agents_down {
                println!("e2e: note: agents not started: {why}");
            }
            suite.plans_per_node().await
        }
        "merged_plans_hold_every_service_kind" => suite.merged_plans().await,
        "agents_apply_their_plans_and_report_ready" => suite.agents_ready().await,
        "endpoint_change_propagates_to_its_service_plan_and_agents" => {
            suite.endpoint_change().await
        }
        "local_endpoint_move_rewrites_only_those_nodes_plans" => suite.local_move().await,
        "deleted_node_loses_its_plan" => suite.node_deletion().await,
        other => Err(format!("unknown scenario {other}")),
    }
}

async fn run(kubeconfig: PathBuf) -> Vec<(&'static str, Result<(), String>)> {
    println!("\nrunning {} tests", SCENARIOS.len());
    let mut suite = match Suite::new(&kubeconfig).await {
        Ok(suite) => suite,
        Err(err) => {
            let why = format!("{KUBECONFIG_VARIABLE}={}: {err}", kubeconfig.display());
            return SCENARIOS
                .iter()
                .map(|name| {
                    println!("{}", test_line(name, false));
                    (*name, Err(why.clone()))
                })
                .collect();
        }
    };
    println!(
        "e2e: run {} against {}: namespace {}, nodes {}",
        suite.world.run_id,
        kubeconfig.display(),
        suite.world.namespace,
        suite
            .world
            .nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut outcomes = Vec::new();
    let mut blocker: Option<String> = None;
    for name in SCENARIOS {
        let result = match &blocker {
            Some(why) => Err(format!("not run: {why}")),
            None => {
                let attempt = std::panic::AssertUnwindSafe(scenario(&mut suite, name));
                tokio::select! {
                    outcome = attempt.catch_unwind() => {
                        outcome.unwrap_or_else(|panic| Err(panic_message(panic.as_ref())))
                    }
                    _ = tokio::signal::ctrl_c() => {
                        blocker = Some("interrupted".to_owned());
                        Err("interrupted (Ctrl-C)".to_owned())
                    }
                }
            }
        };
        if result.is_err() && blocker.is_none() && BLOCKING.contains(&name) {
            blocker = Some(format!("{name} failed"));
        }
        println!("{}", test_line(name, result.is_ok()));
        let _ = std::io::stdout().flush();
        outcomes.push((name, result));
    }
    let failed = outcomes.iter().any(|(_, r)| r.is_err());
    for problem in suite.cleanup(failed).await {
        println!("e2e: clean-up: {problem}");
    }
    outcomes
}
