//! Fault suite: what real clusters do to proxyplan, on a real kube-apiserver v1.36.2 of
//! its own (`../shared/k8s/control-plane.sh`, started and stopped by the suite; it can
//! stop and restart the API server on the same data) and the real kernel (each agent in
//! its own network namespace, iptables mode, as root).
//!
//! ```text
//! cargo build --bins
//! sudo cargo test -p proxyplan-tests --test faults
//! ```
//!
//! Each scenario measures what it is about (seconds to recover, writes after losing the
//! Lease, ...) and the suite prints them as one table at the end. Output is libtest's, and
//! the exit code is 1 when a scenario failed. Name filters select nothing or the whole
//! suite (the scenarios share one cluster and build on each other).

#[path = "e2e/cluster.rs"]
#[allow(dead_code, reason = "shared with the e2e suite")]
mod cluster;
#[path = "faults/harness.rs"]
mod harness;
#[path = "e2e/procs.rs"]
#[allow(dead_code, reason = "shared with the e2e suite")]
mod procs;
#[path = "faults/scenarios.rs"]
mod scenarios;

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use futures::FutureExt;
use proxyplan_tests::e2e::report::{Args, Counts, failures_section, result_line, test_line};

use harness::Faults;

/// The scenarios, in the order they run.
const SCENARIOS: [&str; 14] = [
    "agent_restart_keeps_the_rules_and_changes_nothing",
    "a_large_list_in_a_quiet_cluster_comes_from_the_watch_cache_in_one_response",
    "a_restarted_agent_with_a_refused_plan_keeps_the_kernel_and_its_health_checks",
    "odd_objects_never_stall_a_watch",
    "hand_edits_are_repaired_even_when_they_keep_the_revision",
    "changes_flow_within_5s_after_an_api_server_outage",
    "changes_flow_within_15s_after_a_partition_from_the_api_server",
    "clock_steps_on_the_agent_change_nothing",
    "a_killed_leader_is_replaced_within_the_lease_duration",
    "a_stalled_leader_writes_nothing_after_losing_the_lease",
    "refused_objects_get_warning_events",
    "the_rollout_column_names_a_stopped_agent_as_the_slowest_node",
    "a_huge_service_is_split_and_its_neighbours_still_update",
    "cleanup",
];

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
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("faults: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    println!("\nrunning {} tests", SCENARIOS.len());
    let outcomes = runtime.block_on(run());
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
    runtime.shutdown_background();
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn scenario(faults: &mut Faults, name: &str) -> Result<(), String> {
    match name {
        "agent_restart_keeps_the_rules_and_changes_nothing" => faults.agent_restart().await,
        "a_restarted_agent_with_a_refused_plan_keeps_the_kernel_and_its_health_checks" => {
            faults.agent_restart_with_a_refused_plan().await
        }
        "a_large_list_in_a_quiet_cluster_comes_from_the_watch_cache_in_one_response" => {
            faults.cached_list().await
        }
        "odd_objects_never_stall_a_watch" => faults.odd_objects().await,
        "hand_edits_are_repaired_even_when_they_keep_the_revision" => faults.hand_edits().await,
        "changes_flow_within_5s_after_an_api_server_outage" => faults.outage().await,
        "changes_flow_within_15s_after_a_partition_from_the_api_server" => faults.partition().await,
        "clock_steps_on_the_agent_change_nothing" => faults.clock_steps().await,
        "a_killed_leader_is_replaced_within_the_lease_duration" => faults.leader_killed().await,
        "a_stalled_leader_writes_nothing_after_losing_the_lease" => faults.leader_stalled().await,
        "refused_objects_get_warning_events" => faults.warning_events().await,
        "a_huge_service_is_split_and_its_neighbours_still_update" => faults.huge_service().await,
        "the_rollout_column_names_a_stopped_agent_as_the_slowest_node" => {
            faults.rollout_with_a_stopped_agent().await
        }
        "cleanup" => faults.cleanup().await,
        other => Err(format!("unknown scenario {other}")),
    }
}

async fn run() -> Vec<(&'static str, Result<(), String>)> {
    let mut faults = match Faults::start().await {
        Ok(faults) => faults,
        Err(why) => {
            return SCENARIOS
                .iter()
                .map(|name| {
                    println!("{}", test_line(name, false));
                    (*name, Err(format!("setting up: {why}")))
                })
                .collect();
        }
    };
    let mut outcomes = Vec::new();
    for name in SCENARIOS {
        let attempt = std::panic::AssertUnwindSafe(scenario(&mut faults, name));
        let result = attempt
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(panic_message(panic.as_ref())));
        println!("{}", test_line(name, result.is_ok()));
        let _ = std::io::stdout().flush();
        outcomes.push((name, result));
    }
    println!("\n{}", faults.report.table());
    let failed = outcomes.iter().any(|(_, r)| r.is_err());
    faults.stop(failed).await;
    outcomes
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "(no message)".to_owned());
    format!("panicked: {text}")
}
