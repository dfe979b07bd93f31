//! Planner benchmark (DESIGN §7): full computation of every node plan and Service plan,
//! object sizes,
//! and the cost and write count of single EndpointSlice changes, on a synthetic cluster
//! at two node counts. Prints one table.
//!
//! `cargo bench -p proxyplan-controller --bench planner` runs the §7 scale: 10,000
//! Services × 10 endpoints, 5,000 nodes in 50 zones, 5 % Local (plus 5 % zone-hinted),
//! compared with the same Services on 50 nodes. Environment variables override it:
//! `PLANNER_BENCH_SERVICES`, `PLANNER_BENCH_ENDPOINTS`, `PLANNER_BENCH_NODES`,
//! `PLANNER_BENCH_SMALL_NODES`, `PLANNER_BENCH_ZONES`, `PLANNER_BENCH_LOCAL`,
//! `PLANNER_BENCH_HINTED`, `PLANNER_BENCH_CHANGES` and `PLANNER_BENCH_SEED`. Without
//! `--bench` (as `cargo test --benches` runs it) the defaults shrink to a smoke test.
//!
//! Each node count runs in a child process of this binary so that its peak memory
//! (`VmHWM`) is its own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use proxyplan_controller::synthetic::{ServiceKind, SyntheticCluster, SyntheticSpec};
use proxyplan_controller::{DesiredObject, Planner};
use proxyplan_crds::{NodeProxyPlan, ServiceProxyPlan, merge};
use serde::{Deserialize, Serialize};

const CHILD_VAR: &str = "PLANNER_BENCH_CHILD_NODES";
const RESULT_PREFIX: &str = "PLANNER_BENCH_RESULT ";
const KINDS: [(ServiceKind, &str); 3] = [
    (ServiceKind::Cluster, "Cluster-policy"),
    (ServiceKind::Local, "Local-policy"),
    (ServiceKind::ZoneHinted, "zone-hinted"),
];

/// What one node count measured.
#[derive(Debug, Serialize, Deserialize)]
struct ScaleResult {
    nodes: usize,
    generate: Duration,
    input_rss_kib: u64,
    apply_all: Duration,
    take_all: Duration,
    peak_kib: u64,
    plans: usize,
    services: usize,
    largest: (String, usize),
    largest_service: (String, usize),
    largest_plan: (String, usize),
    merges: Vec<Duration>,
    changes: Vec<ChangeResult>,
}

/// Single endpoint changes of one kind of Service.
#[derive(Debug, Serialize, Deserialize)]
struct ChangeResult {
    kind: String,
    times: Vec<Duration>,
    changed: Vec<usize>,
    written: Vec<usize>,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a valid value")),
        Err(_) => default,
    }
}

/// The benchmark's shape: §7 under `cargo bench`, a smoke test otherwise.
fn bench_spec() -> (SyntheticSpec, usize, usize) {
    let full = std::env::args().any(|a| a == "--bench");
    let (services, nodes, small_nodes, changes) = if full {
        (10_000, 5_000, 50, 200)
    } else {
        (200, 100, 10, 20)
    };
    let spec = SyntheticSpec {
        services: env_or("PLANNER_BENCH_SERVICES", services),
        endpoints_per_service: env_or("PLANNER_BENCH_ENDPOINTS", 10),
        nodes: env_or("PLANNER_BENCH_NODES", nodes),
        zones: env_or("PLANNER_BENCH_ZONES", 50),
        local_fraction: env_or("PLANNER_BENCH_LOCAL", 0.05),
        hinted_fraction: env_or("PLANNER_BENCH_HINTED", 0.05),
        seed: env_or("PLANNER_BENCH_SEED", 1),
    };
    (
        spec,
        env_or("PLANNER_BENCH_SMALL_NODES", small_nodes),
        env_or("PLANNER_BENCH_CHANGES", changes),
    )
}

/// A field of `/proc/self/status`, in KiB.
fn proc_status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn object_size(object: &DesiredObject) -> usize {
    match object {
        DesiredObject::Plan(p) => serde_json::to_vec(p).unwrap().len(),
        DesiredObject::Service(s) => serde_json::to_vec(s).unwrap().len(),
    }
}

fn bigger(current: &mut (String, usize), name: &str, size: usize) {
    if size > current.1 {
        *current = (name.to_owned(), size);
    }
}

/// Runs one node count in this process.
fn run_scale(spec: &SyntheticSpec, changes: usize) -> ScaleResult {
    let start = Instant::now();
    let mut cluster = SyntheticCluster::generate(spec).expect("synthetic cluster");
    let generate = start.elapsed();
    let input_rss_kib = proc_status_kib("VmRSS");

    let mut planner = Planner::new(SyntheticCluster::planner_config());
    let start = Instant::now();
    let errors = cluster.load_into(&mut planner);
    let apply_all = start.elapsed();
    let start = Instant::now();
    let all = planner.take_changes();
    let take_all = start.elapsed();
    let peak_kib = proc_status_kib("VmHWM");
    assert!(errors.is_empty(), "planner refused objects: {errors:?}");
    assert!(all.delete.is_empty(), "deletes on a fresh planner");

    let mut revisions: HashMap<String, String> = HashMap::new();
    let (mut largest, mut largest_service, mut largest_plan) = Default::default();
    let (mut plans, mut services) = (0, 0);
    for object in &all.apply {
        let size = object_size(object);
        let name = object.qualified_name();
        bigger(&mut largest, &name, size);
        match object {
            DesiredObject::Plan(_) => {
                plans += 1;
                bigger(&mut largest_plan, &name, size);
            }
            DesiredObject::Service(_) => {
                services += 1;
                bigger(&mut largest_service, &name, size);
            }
        }
        revisions.insert(name, object.revision().to_owned());
    }
    let merges = measure_merges(&all.apply);
    drop(all);

    let changes = KINDS
        .iter()
        .map(|(kind, label)| {
            measure_changes(
                &mut cluster,
                &mut planner,
                &mut revisions,
                *kind,
                label,
                changes,
            )
        })
        .collect();
    ScaleResult {
        nodes: spec.nodes,
        generate,
        input_rss_kib,
        apply_all,
        take_all,
        peak_kib,
        plans,
        services,
        largest,
        largest_service,
        largest_plan,
        merges,
        changes,
    }
}

/// Agent side: `proxyplan_crds::merge` of up to 20 node plans (spread over all) with
/// every Service plan.
fn measure_merges(objects: &[DesiredObject]) -> Vec<Duration> {
    let mut plans: Vec<&NodeProxyPlan> = Vec::new();
    let mut shards: Vec<ServiceProxyPlan> = Vec::new();
    for object in objects {
        match object {
            DesiredObject::Plan(p) => plans.push(p),
            DesiredObject::Service(s) => shards.push(s.clone()),
        }
    }
    let step = plans.len().div_ceil(20).max(1);
    plans
        .iter()
        .step_by(step)
        .map(|plan| {
            let start = Instant::now();
            let merged = merge(plan, &shards).expect("plan merges");
            let elapsed = start.elapsed();
            assert!(!merged.service_ports.is_empty());
            elapsed
        })
        .collect()
}

/// Moves one endpoint of `count` Services of `kind` (spread over all of them), one at a
/// time: the time of `apply_slice` + `take_changes`, and how many objects got a new
/// revision (or were deleted) compared with the last revision seen of each.
fn measure_changes(
    cluster: &mut SyntheticCluster,
    planner: &mut Planner,
    revisions: &mut HashMap<String, String>,
    kind: ServiceKind,
    label: &str,
    count: usize,
) -> ChangeResult {
    let candidates: Vec<usize> = cluster.services_of_kind(kind).collect();
    let mut result = ChangeResult {
        kind: label.to_owned(),
        times: Vec::new(),
        changed: Vec::new(),
        written: Vec::new(),
    };
    if candidates.is_empty() {
        return result;
    }
    for k in 0..count {
        let service = candidates[(k * 7_919) % candidates.len()];
        let change = cluster.move_endpoint(service).expect("endpoint change");
        let start = Instant::now();
        planner.apply_slice(&change.slice).expect("slice accepted");
        let changes = planner.take_changes();
        result.times.push(start.elapsed());
        let mut changed = changes.delete.len();
        for object in &changes.apply {
            let previous = revisions.insert(object.qualified_name(), object.revision().to_owned());
            if previous.as_deref() != Some(object.revision()) {
                changed += 1;
            }
        }
        result.changed.push(changed);
        result
            .written
            .push(changes.apply.len() + changes.delete.len());
    }
    result
}

/// The `q` quantile (nearest rank) of `values`.
fn quantile<T: Copy + Ord>(values: &[T], q: f64) -> Option<T> {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied()
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn mib(kib: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let value = kib as f64 / 1024.0;
    format!("{value:.0} MiB")
}

fn size(object: &(String, usize)) -> String {
    #[allow(clippy::cast_precision_loss)]
    let kib = object.1 as f64 / 1024.0;
    format!("{kib:.1} KiB ({})", object.0)
}

fn times_cell(c: &ChangeResult) -> String {
    match (quantile(&c.times, 0.5), quantile(&c.times, 0.99)) {
        (Some(median), Some(p99)) => format!("{} / {}", ms(median), ms(p99)),
        _ => "no such Service".to_owned(),
    }
}

fn counts_cell(values: &[usize]) -> String {
    match (
        quantile(values, 0.5),
        quantile(values, 0.99),
        values.iter().max(),
    ) {
        (Some(median), Some(p99), Some(max)) => format!("{median} / {p99} / {max}"),
        _ => "-".to_owned(),
    }
}

fn print_table(spec: &SyntheticSpec, changes: usize, results: &[ScaleResult]) {
    println!(
        "\nproxyplan planner: {} Services x {} endpoints, {:.0} % Local, {:.0} % zone-hinted, {} zones, seed {}; {changes} changes of each kind",
        spec.services,
        spec.endpoints_per_service,
        spec.local_fraction * 100.0,
        spec.hinted_fraction * 100.0,
        spec.zones,
        spec.seed,
    );
    let mut rows: Vec<(String, Vec<String>, &str)> = vec![
        (
            "full computation: apply all + take_changes".into(),
            results
                .iter()
                .map(|r| secs(r.apply_all + r.take_all))
                .collect(),
            "< 2 s",
        ),
        (
            "  of which apply all / take_changes".into(),
            results
                .iter()
                .map(|r| format!("{} / {}", secs(r.apply_all), secs(r.take_all)))
                .collect(),
            "",
        ),
        (
            "peak memory (VmHWM, whole process)".into(),
            results.iter().map(|r| mib(r.peak_kib)).collect(),
            "< 1 GiB",
        ),
        (
            "  of which synthetic input objects (RSS)".into(),
            results.iter().map(|r| mib(r.input_rss_kib)).collect(),
            "",
        ),
        (
            "objects: node plans + Service plans".into(),
            results
                .iter()
                .map(|r| format!("{} + {}", r.plans, r.services))
                .collect(),
            "",
        ),
        (
            "largest object (serde_json bytes)".into(),
            results.iter().map(|r| size(&r.largest)).collect(),
            "< 1 MiB",
        ),
        (
            "  largest Service plan".into(),
            results.iter().map(|r| size(&r.largest_service)).collect(),
            "no growth",
        ),
        (
            "  largest node plan".into(),
            results.iter().map(|r| size(&r.largest_plan)).collect(),
            "no growth",
        ),
    ];
    rows.push((
        "agent: merge one node plan + every Service plan (median)".into(),
        results
            .iter()
            .map(|r| quantile(&r.merges, 0.5).map_or_else(|| "-".to_owned(), ms))
            .collect(),
        "(part of < 20 ms)",
    ));
    for (i, (_, label)) in KINDS.iter().enumerate() {
        rows.push((
            format!("{label} change: median / p99"),
            results.iter().map(|r| times_cell(&r.changes[i])).collect(),
            "< 5 ms",
        ));
        rows.push((
            "  objects changed: median / p99 / max".into(),
            results
                .iter()
                .map(|r| counts_cell(&r.changes[i].changed))
                .collect(),
            match KINDS[i].0 {
                ServiceKind::Cluster => "1, any node count",
                ServiceKind::Local => "<= 2 plans + 1 Service plan",
                ServiceKind::ZoneHinted => "1 Service plan",
            },
        ));
        rows.push((
            "  objects written: median / p99 / max".into(),
            results
                .iter()
                .map(|r| counts_cell(&r.changes[i].written))
                .collect(),
            "",
        ));
    }
    let header: Vec<String> = results
        .iter()
        .map(|r| format!("{} nodes", r.nodes))
        .collect();
    let first = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..results.len())
        .map(|i| {
            rows.iter()
                .map(|r| r.1[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let last = rows.iter().map(|r| r.2.len()).max().unwrap_or(0).max(6);
    let line = |label: &str, cells: &[String], budget: &str| {
        let mut out = format!("| {label:<first$} |");
        for (cell, width) in cells.iter().zip(&widths) {
            out.push_str(&format!(" {cell:>width$} |"));
        }
        out.push_str(&format!(" {budget:<last$} |"));
        println!("{out}");
    };
    line("measurement", &header, "budget");
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    println!(
        "|{}|{}|{}|",
        "-".repeat(first + 2),
        rule.iter()
            .map(|r| format!("-{r}-"))
            .collect::<Vec<_>>()
            .join("|"),
        "-".repeat(last + 2)
    );
    for (label, cells, budget) in &rows {
        line(label, cells, budget);
    }
    let cluster_counts: Vec<Vec<usize>> = results
        .iter()
        .map(|r| {
            let mut c = r.changes[0].changed.clone();
            c.sort_unstable();
            c.dedup();
            c
        })
        .collect();
    let equal = cluster_counts.windows(2).all(|w| w[0] == w[1]);
    println!(
        "Cluster-policy change: distinct changed-object counts per node count {cluster_counts:?} -> {}",
        if equal { "equal" } else { "DIFFERENT" }
    );
}

fn main() {
    let (spec, small_nodes, changes) = bench_spec();
    if let Ok(nodes) = std::env::var(CHILD_VAR) {
        let spec = SyntheticSpec {
            nodes: nodes.parse().expect("node count"),
            ..spec
        };
        let result = run_scale(&spec, changes);
        println!("{RESULT_PREFIX}{}", serde_json::to_string(&result).unwrap());
        return;
    }
    let exe = std::env::current_exe().expect("own path");
    let results: Vec<ScaleResult> = [spec.nodes, small_nodes]
        .iter()
        .map(|nodes| {
            eprintln!("planner bench: running {nodes} nodes ...");
            let output = Command::new(&exe)
                .args(std::env::args().skip(1))
                .env(CHILD_VAR, nodes.to_string())
                .output()
                .expect("child benchmark");
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "benchmark at {nodes} nodes failed: {}\n{stdout}",
                String::from_utf8_lossy(&output.stderr)
            );
            let line = stdout
                .lines()
                .find_map(|l| l.strip_prefix(RESULT_PREFIX))
                .expect("child result line");
            serde_json::from_str(line).expect("child result")
        })
        .collect();
    print_table(&spec, changes, &results);
}
