//! nftables-mode agent benchmark (DESIGN §7) on this machine's kernel: a node's merged
//! plan from a synthetic cluster, programmed into a throwaway network namespace with
//! [`NftablesDataplane`] over netlink. Prints one table.
//!
//! `cargo bench -p proxyplan-agent --bench nftables` runs 10,000 and 1,000 Services × 10
//! endpoints (5 % Local, 5 % zone-hinted; the generator also makes NodePort,
//! LoadBalancer, ClientIP-affinity and UDP Services). Per size: the first full sync
//! (empty namespace), an unchanged resync, a restart (a new dataplane reads the table
//! back and must send nothing: the messages sent are counted), one endpoint change at a
//! time (a Cluster-policy Service's pod moved: planner → the agent's incremental merge →
//! `sync` returns with the kernel updated; median / p90 / p99, the transaction's kernel
//! time and size), the same for a change of a Service's endpoint count (one pod added,
//! then taken away again), the tamper check (nothing committed since; after someone else
//! committed to another table), cleanup, and the memory of the real
//! `proxyplan-agent apply --mode nftables` on the same plan file.
//!
//! Environment: `AGENT_BENCH_SIZES` (default `10000,1000`), `AGENT_BENCH_CHANGES` (50,
//! at least 30 for the quantiles), `AGENT_BENCH_ENDPOINTS` (10), `AGENT_BENCH_NODES`
//! (100), `AGENT_BENCH_ZONES` (10), `AGENT_BENCH_LOCAL` (0.05), `AGENT_BENCH_HINTED`
//! (0.05), `AGENT_BENCH_SEED` (1), `AGENT_BENCH_BINARY` (`1`: also the real binary),
//! `AGENT_BENCH_KEEP_PLAN` (a path: the plan file the binary applied is kept there, with
//! the Service count appended).
//! Without `--bench` (as `cargo test --benches` runs it) the defaults shrink to a smoke
//! test. Needs root (network namespaces): otherwise it prints SKIPPED and exits 0. Each
//! size runs in a child process of this binary so that its peak memory is its own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxyplan_agent::dataplane::{ChangeAlarm, Dataplane, DataplaneError};
use proxyplan_agent::kernel::CommandRunner;
use proxyplan_agent::kernel::nftables::{
    ElementRef, NetlinkNft, NftKernel, Refusal, TableItem, Touched, Transaction,
};
use proxyplan_agent::modes::nftables::{NftablesDataplane, NftablesSettings};
use proxyplan_controller::Planner;
use proxyplan_controller::synthetic::{ServiceKind, SyntheticCluster};
use serde::{Deserialize, Serialize};

use common::{
    NODE, Netns, Objects, env_or, full, per_size, print_grid, proc_status_kib, sizes, spec,
};

/// An [`NftKernel`] that times what it asks the kernel.
struct Timed {
    inner: NetlinkNft,
    commits: Duration,
    /// Bytes of the transactions sent (checked or committed).
    bytes: usize,
}

impl NftKernel for Timed {
    fn generation(&mut self) -> Result<u32, DataplaneError> {
        self.inner.generation()
    }

    fn read_table(
        &mut self,
        family: u8,
        name: &str,
        visit: &mut dyn FnMut(TableItem<'_>),
    ) -> Result<bool, DataplaneError> {
        self.inner.read_table(family, name, visit)
    }

    fn table_exists(&mut self, family: u8, name: &str) -> Result<bool, DataplaneError> {
        self.inner.table_exists(family, name)
    }

    fn read_elements(
        &mut self,
        family: u8,
        table: &str,
        set: &str,
        visit: &mut dyn FnMut(ElementRef<'_>),
    ) -> Result<(), DataplaneError> {
        self.inner.read_elements(family, table, set, visit)
    }

    fn check(&mut self, transaction: &mut Transaction) -> Result<Vec<Refusal>, DataplaneError> {
        self.bytes += transaction.len();
        self.inner.check(transaction)
    }

    fn commit(&mut self, transaction: &mut Transaction) -> Result<Vec<Refusal>, DataplaneError> {
        self.bytes += transaction.len();
        let start = Instant::now();
        let result = self.inner.commit(transaction);
        self.commits += start.elapsed();
        result
    }

    fn changed_by_others(
        &mut self,
        name: &str,
        generation: u32,
    ) -> Result<Option<Touched>, DataplaneError> {
        self.inner.changed_by_others(name, generation)
    }

    fn change_alarm(&mut self, name: &str) -> Option<Box<dyn ChangeAlarm>> {
        self.inner.change_alarm(name)
    }
}

type Nft = NftablesDataplane<Timed, CommandRunner>;

fn dataplane(ns: &str) -> Nft {
    NftablesDataplane::new(
        NftablesSettings::default(),
        Timed {
            inner: NetlinkNft::in_netns(ns).expect("netlink in the namespace"),
            commits: Duration::ZERO,
            bytes: 0,
        },
        CommandRunner::in_netns(ns),
    )
}

/// What one size measured.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SizeResult {
    services: usize,
    service_ports: usize,
    endpoints: usize,
    first_merge: Duration,
    first_sync: Duration,
    first_kernel: Duration,
    first_messages: usize,
    first_transactions: usize,
    table_objects: usize,
    resync: Duration,
    resync_messages: usize,
    restart: Duration,
    restart_messages: usize,
    restart_bytes: usize,
    /// One endpoint moved to another pod: the count stays.
    moved: Changes,
    /// One endpoint added or removed: the count changes.
    resized: Changes,
    intact_quiet: Duration,
    intact_after_foreign: Duration,
    intact_after_foreign_listening: Duration,
    /// A chain flushed by hand, from the `nft` command's exit: the change alarm went
    /// off; the tamper check found and rewrote it.
    flushed_alarm: Duration,
    flushed_repaired: Duration,
    /// One Service's element deleted from the map every ClusterIP is looked up in.
    element_deleted_repaired: Duration,
    /// That map flushed (every entry rendered).
    map_flushed_repaired: Duration,
    /// A chain made in the agent's table by someone else: read, and repaired.
    chain_made_repaired: Duration,
    cleanup: Duration,
    bench_hwm_kib: u64,
    binary: BinaryResult,
}

/// One kind of change, measured change by change.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Changes {
    merge: Vec<Duration>,
    sync: Vec<Duration>,
    kernel: Vec<Duration>,
    messages: Vec<usize>,
    objects: Vec<usize>,
}

/// One change's measurements.
struct Change {
    merge: Duration,
    sync: Duration,
    kernel: Duration,
    messages: usize,
    objects: usize,
}

impl Changes {
    fn push(&mut self, change: Change) {
        self.merge.push(change.merge);
        self.sync.push(change.sync);
        self.kernel.push(change.kernel);
        self.messages.push(change.messages);
        self.objects.push(change.objects);
    }

    /// Plan received to kernel updated: the merge and the sync.
    fn totals(&self) -> Vec<Duration> {
        self.merge
            .iter()
            .zip(&self.sync)
            .map(|(m, s)| *m + *s)
            .collect()
    }
}

/// The plan as the planner now has it, from plan received (the merge) to the kernel
/// committed (the sync).
fn timed_change(dp: &mut Nft, objects: &mut Objects) -> Change {
    let start = Instant::now();
    let merged = Arc::new(objects.merged());
    let merge = start.elapsed();
    let report = dp.sync_shared(&merged, false).expect("change");
    let sync = start.elapsed() - merge;
    Change {
        merge,
        sync,
        kernel: std::mem::take(&mut dp.kernel().commits),
        messages: dp.sent().0,
        objects: report.changed,
    }
}

/// The real binary's `apply` of the plan file.
#[derive(Debug, Default, Serialize, Deserialize)]
struct BinaryResult {
    error: Option<String>,
    wall: Option<Duration>,
    own_hwm_kib: u64,
    plan_file_bytes: usize,
}

/// `proxyplan-agent apply --mode nftables --plan FILE` in a fresh namespace; its
/// `VmHWM` polled.
fn run_binary(objects: &Objects) -> BinaryResult {
    let file = std::env::temp_dir().join(format!("nft-bench-{}.yaml", std::process::id()));
    let plan_file_bytes = objects.write_file(&file);
    let ns = Netns::new("bin");
    let agent = PathBuf::from(env!("CARGO_BIN_EXE_proxyplan-agent"));
    let start = Instant::now();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.0])
        .arg(&agent)
        .args(["apply", "--mode", "nftables", "--plan"])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent binary");
    // `ip netns exec` execs the agent: its pid is the child's.
    let pid = child.id().to_string();
    let mut hwm = 0;
    while child.try_wait().expect("wait").is_none() {
        if let Some(kib) = proc_status_kib(&pid, "VmHWM") {
            hwm = hwm.max(kib);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let output = child.wait_with_output().expect("agent output");
    if let Ok(keep) = std::env::var("AGENT_BENCH_KEEP_PLAN") {
        std::fs::copy(&file, format!("{keep}.{}", objects.services.len()))
            .expect("keep the plan file");
    }
    let _ = std::fs::remove_file(&file);
    BinaryResult {
        error: (!output.status.success())
            .then(|| String::from_utf8_lossy(&output.stderr).into_owned()),
        wall: Some(start.elapsed()),
        own_hwm_kib: hwm,
        plan_file_bytes,
    }
}

fn run_size(services: usize) -> SizeResult {
    let spec = spec(services);
    let mut cluster = SyntheticCluster::generate(&spec).expect("synthetic cluster");
    let mut planner = Planner::new(SyntheticCluster::planner_config());
    let errors = cluster.load_into(&mut planner);
    assert!(errors.is_empty(), "planner refused objects: {errors:?}");
    let mut objects = Objects::default();
    objects.take(&mut planner);
    let start = Instant::now();
    let merged = Arc::new(objects.merged());
    let mut result = SizeResult {
        services,
        service_ports: merged.service_ports.len(),
        endpoints: merged
            .service_ports
            .iter()
            .map(|e| e.cluster_endpoints.len())
            .sum(),
        first_merge: start.elapsed(),
        ..SizeResult::default()
    };
    let ns = Netns::new("dp");
    let mut dp = dataplane(&ns.0);
    eprintln!("nftables bench: {services} Services, first sync ...");
    let start = Instant::now();
    let report = dp.sync_shared(&merged, false).expect("first sync");
    result.first_sync = start.elapsed();
    result.first_kernel = std::mem::take(&mut dp.kernel().commits);
    (result.first_messages, result.first_transactions) = dp.sent();
    result.table_objects = report.changed;
    drop(report);

    let start = Instant::now();
    dp.sync_shared(&merged, false).expect("unchanged resync");
    result.resync = start.elapsed();
    result.resync_messages = dp.sent().0;

    // A restart: a new dataplane, the table read back, nothing to send.
    let mut restarted = dataplane(&ns.0);
    let start = Instant::now();
    restarted.sync_shared(&merged, false).expect("restart");
    result.restart = start.elapsed();
    result.restart_messages = restarted.sent().0;
    result.restart_bytes = restarted.kernel().bytes;
    assert_eq!(
        result.restart_bytes, 0,
        "a restart with nothing changed sent bytes"
    );
    assert_eq!(
        restarted.sent(),
        (0, 0),
        "a restart with nothing changed sent something"
    );
    drop(restarted);
    drop(merged);

    let changes = env_or("AGENT_BENCH_CHANGES", if full() { 50 } else { 5 });
    eprintln!("nftables bench: {services} Services, {changes} endpoint changes ...");
    let candidates: Vec<usize> = cluster.services_of_kind(ServiceKind::Cluster).collect();
    for k in 0..changes {
        let service = candidates[(k * 7_919 + 13) % candidates.len()];
        let change = cluster.move_endpoint(service).expect("endpoint change");
        planner.apply_slice(&change.slice).expect("slice accepted");
        objects.take(&mut planner);
        result.moved.push(timed_change(&mut dp, &mut objects));
    }
    // A Service's endpoint count changes: one pod added to a Service, then, the next
    // change, taken away again (a scale-up, a rollout's surge pod, a scale-down).
    eprintln!("nftables bench: {services} Services, {changes} endpoint count changes ...");
    for k in 0..changes {
        let service = candidates[(k / 2 * 104_729 + 29) % candidates.len()];
        let slice = if k % 2 == 0 {
            cluster.add_endpoint(service)
        } else {
            cluster.remove_endpoint(service)
        }
        .expect("endpoint count change");
        planner.apply_slice(&slice).expect("slice accepted");
        objects.take(&mut planner);
        result.resized.push(timed_change(&mut dp, &mut objects));
    }

    let start = Instant::now();
    assert!(dp.rules_intact().expect("tamper check"));
    result.intact_quiet = start.elapsed();
    // Someone else commits to another table; the first check reads the table (the agent
    // starts listening to nf_tables' announcements then), the next ones do not.
    let nft = |what: &[&str]| {
        let status = Command::new("ip")
            .args(["netns", "exec", &ns.0, "nft"])
            .args(what)
            .status();
        assert!(status.is_ok_and(|s| s.success()), "nft {what:?}");
    };
    let mut someone_else = |what: &[&str]| {
        nft(what);
        let start = Instant::now();
        assert!(dp.rules_intact().expect("tamper check"));
        start.elapsed()
    };
    result.intact_after_foreign = someone_else(&["add", "table", "inet", "someone-else"]);
    result.intact_after_foreign_listening =
        someone_else(&["add", "chain", "inet", "someone-else", "c"]);
    // Someone flushes the chain every Service's traffic goes through, deletes one
    // Service's element of the map every ClusterIP is looked up in, flushes that map,
    // then makes a chain in the agent's table: what the agent's change alarm and tamper
    // check do about each, from the `nft` command's exit. The first three are named by
    // nf_tables' announcements and rewritten without a read; the last names nothing, and
    // is read and repaired from the read.
    let mut alarm = dp.change_alarm().expect("nf_tables announces its commits");
    let merged = Arc::new(objects.merged());
    let mut tamper = |what: &[&str]| {
        nft(what);
        let start = Instant::now();
        assert!(alarm.wait(Some(Duration::from_secs(10))).expect("alarm"));
        let alarmed = start.elapsed();
        dp.kernel().commits = Duration::ZERO;
        assert!(
            !dp.rules_intact().expect("tamper check"),
            "{what:?} went unseen"
        );
        let repaired = start.elapsed();
        eprintln!(
            "nftables bench: {what:?} repaired in {repaired:?}, {:?} of it nf_tables commits",
            dp.kernel().commits
        );
        // The check's repair was whole: a sync finds nothing left to send.
        dp.sync_shared(&merged, false)
            .expect("sync after the repair");
        assert_eq!(
            dp.sent(),
            (0, 0),
            "{what:?}: the repair left work for the sync"
        );
        assert!(dp.rules_intact().expect("tamper check"));
        (alarmed, repaired)
    };
    (result.flushed_alarm, result.flushed_repaired) =
        tamper(&["flush", "chain", "ip", "proxyplan", "services"]);
    // One Service's element deleted from that map.
    let element = merged
        .service_ports
        .iter()
        .find(|e| e.protocol == proxyplan_crds::Protocol::TCP && !e.cluster_ip.contains(':'))
        .map(|e| format!("{{ {} . tcp . {} }}", e.cluster_ip, e.port))
        .expect("a TCP ClusterIP");
    (_, result.element_deleted_repaired) = tamper(&[
        "delete",
        "element",
        "ip",
        "proxyplan",
        "service-ips",
        &element,
    ]);
    (_, result.map_flushed_repaired) = tamper(&["flush", "map", "ip", "proxyplan", "service-ips"]);
    (_, result.chain_made_repaired) = tamper(&["add", "chain", "ip", "proxyplan", "someone-elses"]);
    let start = Instant::now();
    dp.cleanup().expect("cleanup");
    result.cleanup = start.elapsed();
    result.bench_hwm_kib = proc_status_kib("self", "VmHWM").unwrap_or(0);
    drop(dp);
    if env_or("AGENT_BENCH_BINARY", 1) == 1 {
        eprintln!("nftables bench: {services} Services, the real binary ...");
        result.binary = run_binary(&objects);
    }
    result
}

fn quantile<T: Copy + Ord + Default>(values: &[T], q: f64) -> T {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied().unwrap_or_default()
}

fn time(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.2} s", d.as_secs_f64())
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}

fn quantiles(values: &[Duration]) -> String {
    format!(
        "{} / {} / {}",
        time(quantile(values, 0.5)),
        time(quantile(values, 0.9)),
        time(quantile(values, 0.99))
    )
}

fn counts(changes: &Changes) -> String {
    format!(
        "{} / {}",
        quantile(&changes.messages, 0.5),
        quantile(&changes.objects, 0.5)
    )
}

fn mib(kib: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let value = kib as f64 / 1024.0;
    format!("{value:.1} MiB")
}

fn print_table(results: &[SizeResult]) {
    let s = spec(0);
    println!(
        "\nproxyplan agent, nftables mode, real kernel (netns), node {NODE}: Services x {} \
         endpoints, {:.0} % Local, {:.0} % zone-hinted, {} nodes in {} zones, seed {}; \
         changes: one Cluster-policy endpoint moved, added or removed at a time",
        s.endpoints_per_service,
        s.local_fraction * 100.0,
        s.hinted_fraction * 100.0,
        s.nodes,
        s.zones,
        s.seed
    );
    type Cell = fn(&SizeResult) -> String;
    let rows: Vec<(&str, Cell, &str)> = vec![
        (
            "service ports / endpoints in the merged plan",
            |r| format!("{} / {}", r.service_ports, r.endpoints),
            "",
        ),
        (
            "first merge (every Service plan validated)",
            |r| time(r.first_merge),
            "",
        ),
        (
            "first full sync (empty netns)",
            |r| time(r.first_sync),
            "< 2 s (kube-proxy: 14 s @10k, 0.35 s @1k)",
        ),
        ("  of which nf_tables commits", |r| time(r.first_kernel), ""),
        (
            "  objects written / messages / transactions",
            |r| {
                format!(
                    "{} / {} / {}",
                    r.table_objects, r.first_messages, r.first_transactions
                )
            },
            "",
        ),
        (
            "unchanged resync (from the model): time / messages",
            |r| format!("{} / {}", time(r.resync), r.resync_messages),
            "",
        ),
        (
            "restart (table read back): time / messages / bytes sent",
            |r| {
                format!(
                    "{} / {} / {}",
                    time(r.restart),
                    r.restart_messages,
                    r.restart_bytes
                )
            },
            "0 messages, 0 bytes",
        ),
        (
            "one endpoint change, plan received -> kernel updated",
            |r| quantiles(&r.moved.totals()),
            "< 20 ms (kube-proxy: 5.4 s @10k, 200 ms @1k)",
        ),
        (
            "  merge (median / p90 / p99)",
            |r| quantiles(&r.moved.merge),
            "",
        ),
        (
            "  sync (median / p90 / p99)",
            |r| quantiles(&r.moved.sync),
            "",
        ),
        (
            "  of which nf_tables commit",
            |r| quantiles(&r.moved.kernel),
            "",
        ),
        (
            "  messages / objects changed (median)",
            |r| counts(&r.moved),
            "",
        ),
        (
            "one endpoint added or removed (count changes): plan received -> kernel updated",
            |r| quantiles(&r.resized.totals()),
            "< 20 ms",
        ),
        (
            "  of which nf_tables commit",
            |r| quantiles(&r.resized.kernel),
            "",
        ),
        (
            "  messages / objects changed (median)",
            |r| counts(&r.resized),
            "",
        ),
        (
            "tamper check: quiet / another table's commit, first (starts listening: reads) / then",
            |r| {
                format!(
                    "{} / {} / {}",
                    time(r.intact_quiet),
                    time(r.intact_after_foreign),
                    time(r.intact_after_foreign_listening)
                )
            },
            "",
        ),
        (
            "by hand: chain `services` flushed, alarm / repaired; one element of `service-ips` \
             deleted; `service-ips` flushed; a chain made (read) (from nft's exit)",
            |r| {
                format!(
                    "{} / {}; {}; {}; {}",
                    time(r.flushed_alarm),
                    time(r.flushed_repaired),
                    time(r.element_deleted_repaired),
                    time(r.map_flushed_repaired),
                    time(r.chain_made_repaired)
                )
            },
            "",
        ),
        ("cleanup", |r| time(r.cleanup), ""),
        (
            "bench process peak (VmHWM, incl. planner)",
            |r| mib(r.bench_hwm_kib),
            "",
        ),
        (
            "agent binary `apply --mode nftables`: wall",
            |r| match &r.binary.error {
                Some(e) => format!("failed: {}", e.chars().take(60).collect::<String>()),
                None => r.binary.wall.map(time).unwrap_or_default(),
            },
            "",
        ),
        (
            "  agent process peak memory (VmHWM)",
            |r| mib(r.binary.own_hwm_kib),
            "< 40 MiB (kube-proxy: 561 MB @10k, 117 MB @1k)",
        ),
        (
            "  plan file (YAML)",
            |r| format!("{:.1} MiB", r.binary.plan_file_bytes as f64 / 1048576.0),
            "",
        ),
    ];
    let header: Vec<String> = results
        .iter()
        .map(|r| format!("{} svc", r.services))
        .collect();
    let rows: Vec<(&str, Vec<String>, &str)> = rows
        .iter()
        .map(|(label, f, budget)| (*label, results.iter().map(f).collect(), *budget))
        .collect();
    print_grid(&header, &rows);
}

fn main() {
    if let Some(results) = per_size("nftables", sizes(), run_size) {
        print_table(&results);
    }
}
