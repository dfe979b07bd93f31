//! iptables-mode agent benchmark (DESIGN §7) on the real kernel: a node's merged plan from
//! a synthetic cluster, programmed into a throwaway network namespace with
//! [`IptablesDataplane`] over `ip netns exec`. Prints one table.
//!
//! `cargo bench -p proxyplan-agent --bench iptables` runs 10,000 Services × 10 endpoints
//! (5 % Local, 5 % zone-hinted) and 1,000 Services, each on the nft back end and the
//! legacy one. Per column: the first full apply (time, rules, `iptables-save` lines,
//! payload), an unchanged resync (from the model), a full resync (kernel re-read), a
//! restarted agent (a new dataplane: the kernel read back, 0 bytes sent, asserted) and
//! the periodic checks after it, then on that agent one
//! endpoint change at a time (a Cluster-policy Service's pod moved: planner → new merged
//! plan → `sync` returns; median / p99, with the time spent in `iptables-restore` and the
//! same sync as a dry run: render, diff and payload without the kernel), cleanup, and the
//! memory of the real `proxyplan-agent apply` binary on the same plan file (and of the
//! same `apply --dry-run`).
//!
//! Environment: `AGENT_BENCH_SIZES` (comma-separated Service counts, default
//! `10000,1000`), `AGENT_BENCH_BACKENDS` (default `nft,legacy`; `none`: only the binary),
//! `AGENT_BENCH_ENDPOINTS` (10), `AGENT_BENCH_NODES` (100), `AGENT_BENCH_ZONES` (10),
//! `AGENT_BENCH_LOCAL` (0.05), `AGENT_BENCH_HINTED` (0.05), `AGENT_BENCH_CHANGES` (50),
//! `AGENT_BENCH_SEED` (1), `AGENT_BENCH_BINARY` (`1`: also measure the real binary; `0`:
//! skip), `AGENT_BENCH_BINARY_BACKEND` (the binary's `--iptables-backend`, default `nft`),
//! `KEEP_PLAN` (set: keep the binary's plan file in the temporary directory). Without
//! `--bench` (as `cargo test --benches` runs it) the defaults shrink to a smoke test.
//!
//! Needs root (network namespaces): otherwise it prints SKIPPED and exits 0. Each size
//! runs in a child process of this binary so that its peak memory is its own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use proxyplan_agent::dataplane::{Dataplane, DataplaneError};
use proxyplan_agent::kernel::xtables_nft::{DumpSummary, NftChain, NftRule};
use proxyplan_agent::kernel::{Backend, CommandOutput, CommandRunner, Family, InputWriter, Runner};
use proxyplan_agent::modes::iptables::{IptablesDataplane, RenderSettings};
use proxyplan_controller::synthetic::{ServiceKind, SyntheticCluster};
use proxyplan_controller::{DesiredObject, Planner};
use proxyplan_crds::{MergedPlan, NodeProxyPlan, ServiceProxyPlan, merge, object_key};
use serde::{Deserialize, Serialize};

use common::{NODE, Netns, env_or, full, per_size, print_grid, proc_status_kib, sizes, spec};

/// The column of a size run without back ends.
const BINARY_ONLY: &str = "binary only";

/// The back ends to run; `none` (or nothing) runs none, only the binary.
fn backends() -> Vec<String> {
    std::env::var("AGENT_BENCH_BACKENDS")
        .unwrap_or_else(|_| "nft,legacy".to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && s != "none")
        .collect()
}

/// What one back end measured at one size.
#[derive(Debug, Default, Serialize, Deserialize)]
struct BackendResult {
    backend: String,
    error: Option<String>,
    first_apply: Option<Duration>,
    rules: usize,
    save_lines: usize,
    first_payload: (usize, usize),
    resync: Option<Duration>,
    full_resync: Option<Duration>,
    restart: Option<Duration>,
    restart_reading: Option<Duration>,
    restart_sent: (usize, usize),
    check_full: Option<Duration>,
    check_again: Option<Duration>,
    change_times: Vec<Duration>,
    change_dry: Vec<Duration>,
    change_tools: Vec<Duration>,
    change_payload_lines: Vec<usize>,
    change_payload_bytes: Vec<usize>,
    change_chains: Vec<usize>,
    cleanup: Option<Duration>,
}

/// The real binary's `apply` of the plan file.
#[derive(Debug, Default, Serialize, Deserialize)]
struct BinaryResult {
    error: Option<String>,
    wall: Option<Duration>,
    /// `/usr/bin/time -v` "Maximum resident set size" (the agent and the tools it ran).
    max_rss_kib: u64,
    /// The agent process's own `VmHWM`, polled.
    own_hwm_kib: u64,
    plan_file_bytes: usize,
    /// The same `apply` with `--dry-run`: the agent process's `VmHWM`.
    dry_run_hwm_kib: u64,
    dry_run_error: Option<String>,
}

/// What one size measured.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SizeResult {
    services: usize,
    service_ports: usize,
    endpoints: usize,
    plan_ready: Duration,
    backends: Vec<BackendResult>,
    binary: BinaryResult,
    bench_hwm_kib: u64,
}

/// A [`CommandRunner`] that adds up the time spent in the tools it runs.
struct Timed {
    inner: CommandRunner,
    spent: std::cell::Cell<Duration>,
}

impl Timed {
    fn time<T>(&self, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.spent.set(self.spent.get() + start.elapsed());
        out
    }

    fn take(&self) -> Duration {
        self.spent.replace(Duration::ZERO)
    }
}

impl Runner for Timed {
    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<CommandOutput, DataplaneError> {
        self.time(|| self.inner.run(program, args, stdin))
    }

    fn run_with_input(
        &self,
        program: &str,
        args: &[&str],
        input: &mut InputWriter<'_>,
    ) -> Result<CommandOutput, DataplaneError> {
        self.time(|| self.inner.run_with_input(program, args, input))
    }

    fn run_lines(
        &self,
        program: &str,
        args: &[&str],
        line: &mut dyn FnMut(&str),
    ) -> Result<CommandOutput, DataplaneError> {
        self.time(|| self.inner.run_lines(program, args, line))
    }

    fn nft_table(
        &self,
        family: Family,
        table: &str,
        chain: &mut dyn FnMut(NftChain<'_>),
        rule: &mut dyn FnMut(NftRule<'_>),
        restart: &mut dyn FnMut(),
    ) -> Result<Option<DumpSummary>, DataplaneError> {
        self.time(|| self.inner.nft_table(family, table, chain, rule, restart))
    }

    fn nft_generation(&self) -> Result<Option<u32>, DataplaneError> {
        self.time(|| self.inner.nft_generation())
    }
}

/// The node's plan and every Service plan, kept up to date from the planner's changes.
struct Objects {
    plan: Option<NodeProxyPlan>,
    services: BTreeMap<String, ServiceProxyPlan>,
}

impl Objects {
    fn take(&mut self, planner: &mut Planner) {
        let changes = planner.take_changes();
        for object in changes.apply {
            match object {
                DesiredObject::Plan(p) => {
                    if p.metadata.name.as_deref() == Some(NODE) {
                        self.plan = Some(p);
                    }
                }
                DesiredObject::Service(s) => {
                    self.services.insert(object_key(&s), s);
                }
            }
        }
        for id in changes.delete {
            self.services.remove(&id.qualified_name());
        }
    }

    fn all_services(&self) -> Vec<ServiceProxyPlan> {
        self.services.values().cloned().collect()
    }

    fn merged(&self) -> MergedPlan {
        merge(self.plan.as_ref().expect("node plan"), &self.all_services()).expect("plan merges")
    }

    fn write_file(&self, path: &Path) -> usize {
        let mut text = format!(
            "---\n{}",
            serde_yaml::to_string(self.plan.as_ref().unwrap()).unwrap()
        );
        for service in self.services.values() {
            text.push_str("---\n");
            text.push_str(&serde_yaml::to_string(service).unwrap());
        }
        std::fs::write(path, &text).expect("plan file");
        text.len()
    }
}

fn netns_output(ns: &str, program: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, program])
        .args(args)
        .output()
        .expect("ip netns exec");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs one back end at one size in a fresh namespace.
fn run_backend(
    name: &str,
    cluster: &mut SyntheticCluster,
    planner: &mut Planner,
    objects: &mut Objects,
    changes: usize,
) -> BackendResult {
    let mut result = BackendResult {
        backend: name.to_owned(),
        ..BackendResult::default()
    };
    let backend = match name {
        "nft" => Backend::Nft,
        "legacy" => Backend::Legacy,
        other => {
            result.error = Some(format!("unknown back end {other}"));
            return result;
        }
    };
    let ns = Netns::new(name);
    let mut dp = IptablesDataplane::new(
        RenderSettings::default(),
        Timed {
            inner: CommandRunner::in_netns(&ns.0),
            spent: std::cell::Cell::new(Duration::ZERO),
        },
        backend,
    );
    let merged = objects.merged();
    let start = Instant::now();
    let report = match dp.sync(&merged, false) {
        Ok(r) => r,
        Err(err) => {
            result.error = Some(err.to_string());
            return result;
        }
    };
    result.first_apply = Some(start.elapsed());
    eprintln!(
        "  {name}: first apply {:.2} s",
        start.elapsed().as_secs_f64()
    );
    result.rules = report.rules;
    // The report keeps only the beginning of a large payload.
    let sent = dp.payload_sent();
    result.first_payload = (sent.bytes, sent.lines);
    drop(report);
    let save = backend_save(backend);
    result.save_lines = ["-t", "filter", "-t", "nat"]
        .chunks(2)
        .map(|args| netns_output(&ns.0, &save, args).lines().count())
        .sum();

    let start = Instant::now();
    let report = dp.sync(&merged, false).expect("unchanged resync");
    result.resync = Some(start.elapsed());
    assert!(report.payload.is_empty(), "unchanged resync sent something");
    dp.invalidate();
    let start = Instant::now();
    let report = dp.sync(&merged, false).expect("full resync");
    result.full_resync = Some(start.elapsed());
    assert!(report.payload.is_empty(), "full resync sent something");
    // A restarted agent: a new dataplane with an empty model reads the kernel back and
    // must send nothing; the changes below then run on it (the first one is the first
    // change after a restart).
    let mut dp = IptablesDataplane::new(
        RenderSettings::default(),
        Timed {
            inner: CommandRunner::in_netns(&ns.0),
            spent: std::cell::Cell::new(Duration::ZERO),
        },
        backend,
    );
    let start = Instant::now();
    dp.sync(&merged, false).expect("restarted agent's sync");
    result.restart = Some(start.elapsed());
    result.restart_reading = Some(dp.runner().take());
    let sent = dp.payload_sent();
    result.restart_sent = (sent.bytes, sent.lines);
    assert_eq!(
        result.restart_sent,
        (0, 0),
        "the restarted agent sent {sent:?}"
    );
    let start = Instant::now();
    assert!(dp.rules_intact().expect("periodic check"), "rules differ");
    result.check_full = Some(start.elapsed());
    let start = Instant::now();
    assert!(dp.rules_intact().expect("periodic check"), "rules differ");
    result.check_again = Some(start.elapsed());
    dp.runner().take();
    drop(merged);

    let candidates: Vec<usize> = cluster.services_of_kind(ServiceKind::Cluster).collect();
    for k in 0..changes {
        let service = candidates[(k * 7_919 + 13) % candidates.len()];
        let change = cluster.move_endpoint(service).expect("endpoint change");
        planner.apply_slice(&change.slice).expect("slice accepted");
        objects.take(planner);
        let merged = objects.merged();
        // Plan received: the dry run is render + diff + payload, without the kernel.
        let start = Instant::now();
        let dry = dp.sync(&merged, true).expect("dry run");
        result.change_dry.push(start.elapsed());
        drop(dry);
        dp.runner().take();
        let start = Instant::now();
        let report = dp.sync(&merged, false).expect("endpoint change sync");
        result.change_times.push(start.elapsed());
        result.change_tools.push(dp.runner().take());
        result
            .change_payload_lines
            .push(report.payload.lines().count());
        result.change_payload_bytes.push(report.payload.len());
        result.change_chains.push(report.changed);
    }
    let start = Instant::now();
    dp.cleanup().expect("cleanup");
    result.cleanup = Some(start.elapsed());
    result
}

fn backend_save(backend: Backend) -> String {
    match backend {
        Backend::Nft => "iptables-nft-save".into(),
        Backend::Legacy => "iptables-legacy-save".into(),
    }
}

fn binary_backend() -> String {
    std::env::var("AGENT_BENCH_BINARY_BACKEND").unwrap_or_else(|_| "nft".to_owned())
}

/// One run of the agent binary.
struct AgentRun {
    wall: Duration,
    max_rss_kib: u64,
    own_hwm_kib: u64,
    error: Option<String>,
}

/// `proxyplan-agent apply --plan FILE [extra]` under `/usr/bin/time -v` in a fresh namespace.
fn run_agent(file: &Path, extra: &[&str]) -> AgentRun {
    let ns = Netns::new("bin");
    let agent = PathBuf::from(env!("CARGO_BIN_EXE_proxyplan-agent"));
    let start = Instant::now();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.0, "/usr/bin/time", "-v"])
        .arg(&agent)
        .args([
            "apply",
            "--mode",
            "iptables",
            "--iptables-backend",
            &binary_backend(),
            "--plan",
        ])
        .arg(file)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent binary");
    // `ip netns exec` execs time, which forks the agent: poll its VmHWM.
    let time_pid = child.id().to_string();
    let mut hwm = 0;
    let mut agent_pid: Option<String> = None;
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if agent_pid.is_none() {
            agent_pid =
                std::fs::read_to_string(format!("/proc/{time_pid}/task/{time_pid}/children"))
                    .ok()
                    .and_then(|c| c.split_whitespace().next().map(str::to_owned));
        }
        if let Some(pid) = &agent_pid
            && let Some(kib) = proc_status_kib(pid, "VmHWM")
        {
            hwm = hwm.max(kib);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let output = child.wait_with_output().expect("agent output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    AgentRun {
        wall: start.elapsed(),
        max_rss_kib: stderr
            .lines()
            .find_map(|l| l.trim().strip_prefix("Maximum resident set size (kbytes):"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0),
        own_hwm_kib: hwm,
        error: (!output.status.success())
            .then(|| stderr.lines().take(3).collect::<Vec<_>>().join(" ")),
    }
}

/// The real binary's `apply` of the plan file, then the same with `--dry-run`.
fn run_binary(objects: &Objects, dir: &Path) -> BinaryResult {
    let file = dir.join(format!("plan-{}.yaml", std::process::id()));
    let plan_file_bytes = objects.write_file(&file);
    let applied = run_agent(&file, &[]);
    let dry = run_agent(&file, &["--dry-run"]);
    if std::env::var("KEEP_PLAN").is_err() {
        let _ = std::fs::remove_file(&file);
    }
    BinaryResult {
        error: applied.error,
        wall: Some(applied.wall),
        max_rss_kib: applied.max_rss_kib,
        own_hwm_kib: applied.own_hwm_kib,
        plan_file_bytes,
        dry_run_hwm_kib: dry.own_hwm_kib,
        dry_run_error: dry.error,
    }
}

fn run_size(services: usize) -> SizeResult {
    let start = Instant::now();
    let spec = spec(services);
    let mut cluster = SyntheticCluster::generate(&spec).expect("synthetic cluster");
    let mut planner = Planner::new(SyntheticCluster::planner_config());
    let errors = cluster.load_into(&mut planner);
    assert!(errors.is_empty(), "planner refused objects: {errors:?}");
    let mut objects = Objects {
        plan: None,
        services: BTreeMap::new(),
    };
    objects.take(&mut planner);
    let merged = objects.merged();
    let mut result = SizeResult {
        services,
        service_ports: merged.service_ports.len(),
        endpoints: merged
            .service_ports
            .iter()
            .map(|e| e.cluster_endpoints.len())
            .sum(),
        plan_ready: start.elapsed(),
        ..SizeResult::default()
    };
    drop(merged);
    let changes = env_or("AGENT_BENCH_CHANGES", if full() { 50 } else { 5 });
    for backend in backends() {
        eprintln!("agent bench: {services} Services, {backend} ...");
        let r = run_backend(&backend, &mut cluster, &mut planner, &mut objects, changes);
        eprintln!("  {backend}: {}", serde_json::to_string(&r).unwrap());
        result.backends.push(r);
    }
    result.bench_hwm_kib = proc_status_kib("self", "VmHWM").unwrap_or(0);
    if env_or("AGENT_BENCH_BINARY", 1) == 1 {
        eprintln!("agent bench: {services} Services, real binary ...");
        let dir = std::env::temp_dir();
        result.binary = run_binary(&objects, &dir);
        eprintln!(
            "  binary: {}",
            serde_json::to_string(&result.binary).unwrap()
        );
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
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn time(d: Option<Duration>) -> String {
    match d {
        Some(d) if d >= Duration::from_secs(10) => format!("{:.1} s", d.as_secs_f64()),
        Some(d) => ms(d),
        None => "-".into(),
    }
}

fn mib(kib: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let value = kib as f64 / 1024.0;
    format!("{value:.1} MiB")
}

fn bytes(n: usize) -> String {
    #[allow(clippy::cast_precision_loss)]
    let kib = n as f64 / 1024.0;
    if kib >= 1024.0 {
        format!("{:.1} MiB", kib / 1024.0)
    } else {
        format!("{kib:.1} KiB")
    }
}

fn med_p99(values: &[Duration]) -> String {
    match (quantile(values, 0.5), quantile(values, 0.99)) {
        (Some(m), Some(p)) => format!("{} / {}", ms(m), ms(p)),
        _ => "-".into(),
    }
}

fn print_table(results: &[SizeResult]) {
    let s = spec(0);
    println!(
        "\nproxyplan agent, iptables mode, real kernel (netns), node {NODE}: Services x {} endpoints, {:.0} % Local, {:.0} % zone-hinted, {} nodes in {} zones, seed {}; changes: one Cluster-policy endpoint moved at a time",
        s.endpoints_per_service,
        s.local_fraction * 100.0,
        s.hinted_fraction * 100.0,
        s.nodes,
        s.zones,
        s.seed
    );
    // A size run without back ends (`AGENT_BENCH_BACKENDS=none`) gets one column for the
    // binary.
    let binary_only = BackendResult {
        backend: BINARY_ONLY.to_owned(),
        ..BackendResult::default()
    };
    let columns: Vec<(&SizeResult, &BackendResult)> = results
        .iter()
        .flat_map(|r| {
            if r.backends.is_empty() {
                vec![(r, &binary_only)]
            } else {
                r.backends.iter().map(|b| (r, b)).collect()
            }
        })
        .collect();
    type Cell = fn(&SizeResult, &BackendResult) -> String;
    let ok = |b: &BackendResult, f: &dyn Fn() -> String| match &b.error {
        Some(e) => format!("failed: {}", e.chars().take(40).collect::<String>()),
        None => f(),
    };
    let rows: Vec<(&str, Cell, &str)> = vec![
        (
            "service ports / endpoints in the merged plan",
            |r, _| format!("{} / {}", r.service_ports, r.endpoints),
            "",
        ),
        (
            "first full apply (sync, empty netns)",
            |_, b| time(b.first_apply),
            "< kube-proxy (41 min nft @10k, 7 s @1k)",
        ),
        ("  rules rendered", |_, b| b.rules.to_string(), ""),
        (
            "  iptables-save lines (filter + nat)",
            |_, b| b.save_lines.to_string(),
            "",
        ),
        (
            "  payload: bytes / lines",
            |_, b| format!("{} / {}", bytes(b.first_payload.0), b.first_payload.1),
            "",
        ),
        (
            "unchanged resync (from the model)",
            |_, b| time(b.resync),
            "",
        ),
        (
            "full resync (kernel re-read, nothing sent)",
            |_, b| time(b.full_resync),
            "",
        ),
        (
            "restarted agent's sync (new model, kernel read back)",
            |_, b| time(b.restart),
            "",
        ),
        (
            "  of which reading the kernel",
            |_, b| time(b.restart_reading),
            "",
        ),
        (
            "  payload sent: bytes / lines (must be 0)",
            |_, b| format!("{} / {}", b.restart_sent.0, b.restart_sent.1),
            "0",
        ),
        (
            "periodic check after it (full read + compare)",
            |_, b| time(b.check_full),
            "",
        ),
        (
            "  next check, nothing else committed",
            |_, b| time(b.check_again),
            "nft: generation only",
        ),
        (
            "first change after the restart: lines / bytes",
            |_, b| {
                format!(
                    "{} / {}",
                    b.change_payload_lines.first().copied().unwrap_or(0),
                    bytes(b.change_payload_bytes.first().copied().unwrap_or(0))
                )
            },
            "",
        ),
        (
            "one endpoint change: sync median / p99",
            |_, b| med_p99(&b.change_times),
            "< 20 ms (kube-proxy 2.2 s @10k)",
        ),
        (
            "  of which in iptables-restore",
            |_, b| med_p99(&b.change_tools),
            "",
        ),
        (
            "  render + diff + payload alone (dry run)",
            |_, b| med_p99(&b.change_dry),
            "",
        ),
        (
            "  payload: lines / bytes (median)",
            |_, b| {
                format!(
                    "{} / {}",
                    quantile(&b.change_payload_lines, 0.5).unwrap_or(0),
                    bytes(quantile(&b.change_payload_bytes, 0.5).unwrap_or(0))
                )
            },
            "",
        ),
        (
            "  chains written (median / max)",
            |_, b| {
                format!(
                    "{} / {}",
                    quantile(&b.change_chains, 0.5).unwrap_or(0),
                    b.change_chains.iter().max().copied().unwrap_or(0)
                )
            },
            "",
        ),
        ("cleanup", |_, b| time(b.cleanup), ""),
        (
            "bench process peak (VmHWM, incl. planner)",
            |r, _| mib(r.bench_hwm_kib),
            "",
        ),
        ("agent binary `apply`: wall", |r, _| time(r.binary.wall), ""),
        (
            "  max RSS (time -v, incl. its tools)",
            |r, _| match &r.binary.error {
                Some(e) => format!("failed: {}", e.chars().take(40).collect::<String>()),
                None => mib(r.binary.max_rss_kib),
            },
            "< 40 MiB",
        ),
        (
            "  agent process alone (VmHWM, polled)",
            |r, _| mib(r.binary.own_hwm_kib),
            "< 40 MiB",
        ),
        (
            "  the same with --dry-run (VmHWM, polled)",
            |r, _| match &r.binary.dry_run_error {
                Some(e) => format!("failed: {}", e.chars().take(40).collect::<String>()),
                None => mib(r.binary.dry_run_hwm_kib),
            },
            "",
        ),
        (
            "  plan file (YAML)",
            |r, _| bytes(r.binary.plan_file_bytes),
            "",
        ),
    ];
    let header: Vec<String> = columns
        .iter()
        .map(|(r, b)| format!("{} svc, {}", r.services, b.backend))
        .collect();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|(label, f, _)| {
            columns
                .iter()
                .map(|(r, b)| {
                    if label.contains("binary")
                        || label.starts_with("  max RSS")
                        || label.starts_with("  agent process")
                        || label.starts_with("  the same with --dry-run")
                        || label.starts_with("  plan file")
                        || label.starts_with("bench")
                        || label.starts_with("service")
                    {
                        f(r, b)
                    } else if b.backend == BINARY_ONLY {
                        "-".to_owned()
                    } else {
                        ok(b, &|| f(r, b))
                    }
                })
                .collect()
        })
        .collect();
    let rows: Vec<(&str, Vec<String>, &str)> = rows
        .iter()
        .zip(cells)
        .map(|((label, _, budget), row)| (*label, row, *budget))
        .collect();
    print_grid(&header, &rows);
}

fn main() {
    if let Some(results) = per_size("iptables", sizes(), run_size) {
        print_table(&results);
    }
}
