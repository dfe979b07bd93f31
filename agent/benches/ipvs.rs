//! ipvs-mode agent benchmark (DESIGN §7), meant to run inside the VM of `shared/vm` (this
//! host's kernel has no IPVS):
//!
//! ```text
//! CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/../shared/vm/run-in-vm.sh --share $PWD \
//!     --mem 6144 --timeout 3000 --runner" cargo bench -p proxyplan-agent --bench ipvs
//! ```
//!
//! A node's merged plan from a synthetic cluster (10,000 Services × 10 endpoints, 5 %
//! Local, 5 % zone-hinted) is programmed into a throwaway network namespace. Printed:
//! the first full apply (time, and the netlink operations it took: IPVS messages and
//! address changes), an unchanged resync, the periodic check (the kernel re-read in full
//! and compared; and with one real server deleted behind the agent's back, the check and
//! the sync that repairs it), a full resync after a restart (kernel re-read),
//! one endpoint change at a time (planner → merged plan → `sync` returns; median / p99),
//! the peak memory of the real `proxyplan-agent apply --mode ipvs` on the same plan, and
//! for comparison the same first apply in iptables mode (legacy back end: the nft one
//! takes tens of minutes at this size) in the same kernel.
//!
//! Environment: `AGENT_BENCH_SIZES` (default `10000`), `AGENT_BENCH_CHANGES` (20),
//! `AGENT_BENCH_IPTABLES` (`1`: also the iptables-mode comparison). Without `--bench` the
//! defaults shrink to a smoke test. Needs root and IPVS for the kernel part; without them
//! it prints a SKIPPED line for that part and measures the agent's own work per change
//! natively against the in-memory kernel (merge, sync, both together).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxyplan_agent::dataplane::Dataplane;
use proxyplan_agent::kernel::ipvs::NetlinkKernel;
use proxyplan_agent::kernel::{BackendChoice, CommandRunner};
use proxyplan_agent::modes::ipvs::{IpvsDataplane, IpvsSettings};
use proxyplan_controller::synthetic::{ServiceKind, SyntheticCluster, SyntheticSpec};
use proxyplan_controller::{DesiredObject, Planner};
use proxyplan_crds::{
    MergeCache, MergedPlan, NodeProxyPlan, ServiceProxyPlan, merge_cached, merge_update, object_key,
};

const NODE: &str = "node-00000";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(default)
}

fn full() -> bool {
    std::env::args().any(|a| a == "--bench")
}

struct Netns(String);

impl Netns {
    fn new(tag: &str, addresses: &[std::net::IpAddr]) -> Self {
        let name = format!("pp-ipvs-bench-{}-{tag}", std::process::id());
        let ip = |args: &[&str]| {
            let ok = Command::new("ip")
                .args(["netns", "exec", &name, "ip"])
                .args(args)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "ip {args:?}");
        };
        assert!(
            Command::new("ip")
                .args(["netns", "add", &name])
                .status()
                .is_ok_and(|s| s.success())
        );
        ip(&["link", "set", "lo", "up"]);
        ip(&["link", "add", "eth0", "type", "dummy"]);
        ip(&["link", "set", "eth0", "up"]);
        for a in addresses {
            if a.is_ipv4() {
                ip(&["addr", "add", &format!("{a}/24"), "dev", "eth0"]);
            } else {
                ip(&["addr", "add", &format!("{a}/64"), "dev", "eth0", "nodad"]);
            }
        }
        Self(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The node's plan and every Service plan, as the agent's watches hold them: in one
/// vector (merged without copies), each with a `resourceVersion` that moves when it
/// changes, and the agent's merge cache.
struct Objects {
    plan: Option<NodeProxyPlan>,
    services: Vec<ServiceProxyPlan>,
    index: std::collections::HashMap<String, usize>,
    /// Objects changed since the last merge, as the agent's cache tracks them.
    changed: Vec<String>,
    versions: u64,
    cache: MergeCache,
}

impl Objects {
    fn take(&mut self, planner: &mut Planner) {
        let changes = planner.take_changes();
        for object in changes.apply {
            match object {
                DesiredObject::Plan(mut p) if p.metadata.name.as_deref() == Some(NODE) => {
                    // As the API server gives it: with a resourceVersion.
                    self.versions += 1;
                    p.metadata.resource_version = Some(self.versions.to_string());
                    self.plan = Some(p);
                }
                DesiredObject::Plan(_) => {}
                DesiredObject::Service(mut s) => {
                    self.versions += 1;
                    s.metadata.resource_version = Some(self.versions.to_string());
                    let key = object_key(&s);
                    self.changed.push(key.clone());
                    match self.index.get(&key) {
                        Some(&i) => self.services[i] = s,
                        None => {
                            self.index.insert(key, self.services.len());
                            self.services.push(s);
                        }
                    }
                }
            }
        }
        for id in changes.delete {
            self.changed.push(id.qualified_name());
            if let Some(i) = self.index.remove(&id.qualified_name()) {
                self.services.swap_remove(i);
                self.cache.forget(&id.qualified_name());
                if let Some(moved) = self.services.get(i) {
                    self.index.insert(object_key(moved), i);
                }
            }
        }
    }

    /// The merged plan, as the agent's `run` merges it: the last merge updated with the
    /// changed objects (everything the first time).
    fn merged(&mut self) -> MergedPlan {
        let plan = self.plan.as_ref().expect("node plan");
        let changed = std::mem::take(&mut self.changed);
        let (services, index) = (&self.services, &self.index);
        let lookup = |key: &str| index.get(key).and_then(|&i| services.get(i));
        match merge_update(plan, lookup, &changed, &mut self.cache) {
            Some(result) => result.expect("merges"),
            None => merge_cached(plan, &self.services, &mut self.cache).expect("merges"),
        }
    }

    fn write_file(&self) -> PathBuf {
        let mut text = format!(
            "---\n{}",
            serde_yaml::to_string(self.plan.as_ref().unwrap()).unwrap()
        );
        for service in &self.services {
            text.push_str("---\n");
            text.push_str(&serde_yaml::to_string(service).unwrap());
        }
        let path = std::env::temp_dir().join(format!("ipvs-bench-{}.yaml", std::process::id()));
        std::fs::write(&path, text).expect("plan file");
        path
    }
}

/// A report's phases: `render 0.3 s, sets 2.1 s, ...`.
fn phases(report: &proxyplan_agent::dataplane::SyncReport) -> String {
    report
        .phases
        .iter()
        .map(|(name, took)| format!("{name} {}", ms(*took)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One table row: `| label | median / p99 |`.
fn quantiles_row(label: &str, values: &[Duration]) {
    println!(
        "| {label} | {} / {} |",
        ms(quantile(values, 0.5)),
        ms(quantile(values, 0.99))
    );
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn quantile(values: &[Duration], q: f64) -> Duration {
    let mut v = values.to_vec();
    v.sort_unstable();
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len().max(1)) - 1;
    v.get(i).copied().unwrap_or_default()
}

/// Runs the real binary on `file` in a fresh namespace; returns (wall time, peak RSS KiB,
/// its summary line).
fn run_binary(
    mode: &str,
    file: &PathBuf,
    addresses: &[std::net::IpAddr],
) -> (Duration, u64, String) {
    let ns = Netns::new(mode, addresses);
    let agent = env!("CARGO_BIN_EXE_proxyplan-agent");
    let start = Instant::now();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.0, agent, "apply", "--mode", mode])
        .args(["--iptables-backend", "legacy", "--plan"])
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent");
    // `ip netns exec` execs the agent: same pid.
    let pid = child.id();
    let mut hwm = 0;
    while child.try_wait().expect("wait").is_none() {
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status"))
            && let Some(kib) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        {
            hwm = hwm.max(kib);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let output = child.wait_with_output().expect("output");
    let summary = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout).trim(),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    (start.elapsed(), hwm, summary)
}

fn main() {
    let ipvs_available = std::path::Path::new("/proc/net/ip_vs").exists()
        || Command::new("modprobe")
            .arg("ip_vs")
            .status()
            .is_ok_and(|s| s.success());
    if !ipvs_available
        || !std::fs::read_to_string("/proc/self/status")
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
    {
        println!(
            "SKIPPED (kernel part): the ipvs bench needs root and a kernel with IPVS (run it in \
             ../shared/vm); measuring the agent's own work against the in-memory kernel only"
        );
        let sizes: Vec<usize> = std::env::var("AGENT_BENCH_SIZES")
            .unwrap_or_else(|_| if full() { "10000".into() } else { "100".into() })
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
        for services in sizes {
            userspace(
                services,
                env_or("AGENT_BENCH_CHANGES", if full() { 50 } else { 3 }),
            );
        }
        return;
    }
    let sizes: Vec<usize> = std::env::var("AGENT_BENCH_SIZES")
        .unwrap_or_else(|_| if full() { "10000".into() } else { "100".into() })
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let changes = env_or("AGENT_BENCH_CHANGES", if full() { 20 } else { 3 });
    for services in sizes {
        bench(services, changes);
    }
}

/// The agent's own work per endpoint change, natively, with the in-memory IPVS/ipset
/// kernel and iptables fakes: the planner's change, the merge (unchanged Service plans reused),
/// and the dataplane's sync down to the (fake) netlink calls.
fn userspace(services: usize, changes: usize) {
    use proxyplan_agent::kernel::command::fake::FakeKernel;
    use proxyplan_agent::kernel::ipvs::FakeIpvsKernel;
    let (mut cluster, mut planner, mut objects) = synthetic(services);
    let start = Instant::now();
    let merged = Arc::new(objects.merged());
    let first_merge = start.elapsed();
    let node_ip = merged.addresses.first().copied().expect("a node address");
    let mut dp = IpvsDataplane::new(
        IpvsSettings::default(),
        FakeIpvsKernel::new(node_ip),
        FakeKernel::new(),
        BackendChoice::Legacy,
    );
    let start = Instant::now();
    dp.sync_shared(&merged, false).expect("first apply");
    let first = start.elapsed();
    let start = Instant::now();
    let unchanged = dp.sync_shared(&merged, false).expect("resync");
    let resync = start.elapsed();
    assert_eq!(unchanged.changed, 0);
    drop(merged);
    let candidates: Vec<usize> = cluster.services_of_kind(ServiceKind::Cluster).collect();
    let (mut merges, mut syncs, mut totals) = (Vec::new(), Vec::new(), Vec::new());
    for k in 0..changes {
        move_endpoint(k, &candidates, &mut cluster, &mut planner, &mut objects);
        let start = Instant::now();
        let merged = Arc::new(objects.merged());
        let merged_at = start.elapsed();
        let report = dp.sync_shared(&merged, false).expect("change");
        let total = start.elapsed();
        assert!(report.changed > 0);
        merges.push(merged_at);
        syncs.push(total - merged_at);
        totals.push(total);
    }
    println!();
    println!(
        "ipvs mode, agent's own work only (in-memory kernel), {services} Services x 10 endpoints:"
    );
    println!("| what | value |");
    println!("|---|---|");
    println!(
        "| first merge (every Service plan validated) | {} |",
        ms(first_merge)
    );
    println!(
        "| first full apply (render + diff + fake netlink) | {} |",
        ms(first)
    );
    println!("| unchanged resync | {} |", ms(resync));
    quantiles_row(
        &format!("one endpoint change: merge (median / p99 of {changes})"),
        &merges,
    );
    quantiles_row("one endpoint change: sync (median / p99)", &syncs);
    quantiles_row(
        "one endpoint change: plan received to kernel calls made (median / p99)",
        &totals,
    );
}

/// The `k`-th endpoint change: an endpoint of one of `candidates` moves; the planner and
/// the node's objects follow.
fn move_endpoint(
    k: usize,
    candidates: &[usize],
    cluster: &mut SyntheticCluster,
    planner: &mut Planner,
    objects: &mut Objects,
) {
    let service = candidates[(k * 7_919 + 13) % candidates.len()];
    let change = cluster.move_endpoint(service).expect("endpoint change");
    planner.apply_slice(&change.slice).expect("slice");
    objects.take(planner);
}

/// The synthetic cluster of DESIGN §7's shape, its planner, and the node's objects.
fn synthetic(services: usize) -> (SyntheticCluster, Planner, Objects) {
    let spec = SyntheticSpec {
        services,
        endpoints_per_service: 10,
        nodes: if full() { 100 } else { 10 },
        zones: if full() { 10 } else { 2 },
        local_fraction: 0.05,
        hinted_fraction: 0.05,
        seed: 1,
    };
    let cluster = SyntheticCluster::generate(&spec).expect("synthetic cluster");
    let mut planner = Planner::new(SyntheticCluster::planner_config());
    assert!(cluster.load_into(&mut planner).is_empty());
    let mut objects = Objects {
        plan: None,
        services: Vec::new(),
        index: std::collections::HashMap::new(),
        changed: Vec::new(),
        versions: 0,
        cache: MergeCache::new(),
    };
    objects.take(&mut planner);
    (cluster, planner, objects)
}

fn bench(services: usize, changes: usize) {
    let (mut cluster, mut planner, mut objects) = synthetic(services);
    let merged = Arc::new(objects.merged());
    let addresses = merged.addresses.clone();
    let ns = Netns::new("lib", &addresses);
    let mut dp = IpvsDataplane::new(
        IpvsSettings::default(),
        NetlinkKernel::in_netns(&ns.0).expect("netlink"),
        CommandRunner::in_netns(&ns.0),
        BackendChoice::Legacy,
    );
    let dry = dp.sync_shared(&merged, true).expect("dry run");
    let ipvs_ops = dry
        .payload
        .lines()
        .filter(|l| l.starts_with("# ipvs "))
        .count();
    let address_ops = dry
        .payload
        .lines()
        .filter(|l| l.starts_with("# ip address "))
        .count();
    let set_lines = dry
        .payload
        .lines()
        .filter(|l| l.starts_with("add ") || l.starts_with("create "))
        .count();
    drop(dry);
    let start = Instant::now();
    let first = dp.sync_shared(&merged, false).expect("first apply");
    let first_apply = start.elapsed();
    let start = Instant::now();
    let unchanged = dp.sync_shared(&merged, false).expect("resync");
    let resync = start.elapsed();
    assert_eq!(unchanged.changed, 0, "{}", unchanged.payload);
    // The periodic check: a full re-read of what the mode owns, compared.
    let start = Instant::now();
    assert!(
        dp.rules_intact().expect("periodic check"),
        "nothing was touched"
    );
    let periodic = start.elapsed();
    let start = Instant::now();
    let after_check = dp.sync_shared(&merged, false).expect("periodic sync");
    let periodic_sync = start.elapsed();
    assert_eq!(after_check.changed, 0, "{}", after_check.payload);
    // One real server deleted behind the agent's back: noticed, and repaired by the
    // sync after the check (a full diff against the kernel read).
    let tampered = merged
        .service_ports
        .iter()
        .find(|e| e.family == proxyplan_crds::IpFamily::IPv4 && !e.cluster_endpoints.is_empty())
        .expect("an IPv4 service port with endpoints");
    let endpoint = &tampered.cluster_endpoints[0];
    let ok = Command::new("ip")
        .args(["netns", "exec", &ns.0, "ipvsadm", "-d", "-t"])
        .arg(format!("{}:{}", tampered.cluster_ip, tampered.port))
        .arg("-r")
        .arg(format!("{}:{}", endpoint.ip, endpoint.port))
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "ipvsadm -d");
    let start = Instant::now();
    assert!(
        !dp.rules_intact().expect("periodic check"),
        "the deletion is noticed"
    );
    let repaired = dp.sync_shared(&merged, false).expect("repair");
    let repair = start.elapsed();
    assert!(repaired.changed >= 1, "{}", repaired.payload);
    let mut restarted = IpvsDataplane::new(
        IpvsSettings::default(),
        NetlinkKernel::in_netns(&ns.0).expect("netlink"),
        CommandRunner::in_netns(&ns.0),
        BackendChoice::Legacy,
    );
    let start = Instant::now();
    let after_restart = restarted.sync_shared(&merged, false).expect("restart");
    let restart = start.elapsed();
    assert_eq!(after_restart.changed, 0, "{}", after_restart.payload);
    drop(restarted);
    drop(merged);
    let candidates: Vec<usize> = cluster.services_of_kind(ServiceKind::Cluster).collect();
    let mut times = Vec::new();
    let mut merges = Vec::new();
    let mut changed = Vec::new();
    let mut slowest: Option<(Duration, String)> = None;
    for k in 0..changes {
        move_endpoint(k, &candidates, &mut cluster, &mut planner, &mut objects);
        let start = Instant::now();
        let merged = Arc::new(objects.merged());
        merges.push(start.elapsed());
        let start = Instant::now();
        let report = dp.sync_shared(&merged, false).expect("change");
        let took = start.elapsed();
        times.push(took);
        changed.push(report.changed);
        if slowest.as_ref().is_none_or(|(t, _)| took > *t) {
            slowest = Some((took, phases(&report)));
        }
    }
    let start = Instant::now();
    dp.cleanup().expect("cleanup");
    let cleanup = start.elapsed();
    drop(ns);

    let file = objects.write_file();
    let (ipvs_wall, ipvs_hwm, ipvs_summary) = run_binary("ipvs", &file, &addresses);
    let iptables =
        (env_or("AGENT_BENCH_IPTABLES", 1) == 1).then(|| run_binary("iptables", &file, &addresses));
    let _ = std::fs::remove_file(&file);

    println!();
    println!("ipvs mode, {services} Services x 10 endpoints (node {NODE}):");
    println!("| what | value |");
    println!("|---|---|");
    println!(
        "| virtual servers + real servers + iptables rules | {} |",
        first.rules
    );
    println!(
        "| first full apply (library) | {} ({}) |",
        ms(first_apply),
        phases(&first)
    );
    println!(
        "| netlink operations of the first apply | {} IPVS messages + {address_ops} address changes (+ {set_lines} ipset lines) |",
        ipvs_ops
    );
    println!("| unchanged resync | {} |", ms(resync));
    println!(
        "| periodic check: full kernel re-read (IPVS with real servers, addresses, sets, tables) + compare, nothing changed | {} (+ {} for the sync after it) |",
        ms(periodic),
        ms(periodic_sync)
    );
    println!(
        "| periodic check + the sync that repairs one deleted real server | {} |",
        ms(repair)
    );
    println!(
        "| restart: kernel re-read + diff, nothing sent | {} |",
        ms(restart)
    );
    quantiles_row(
        &format!("one endpoint change (median / p99 of {changes})"),
        &times,
    );
    if let Some((took, phases)) = &slowest {
        println!("| the slowest of them | {} ({phases}) |", ms(*took));
    }
    quantiles_row(
        "before that: merge of the plan (one Service plan changed, the others reused; median / p99)",
        &merges,
    );
    println!(
        "| objects changed per endpoint change | {:?} |",
        changed
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>()
    );
    println!("| cleanup | {} |", ms(cleanup));
    println!(
        "| `proxyplan-agent apply --mode ipvs` (binary: parse + merge + apply) | {}, peak RSS {:.1} MiB |",
        ms(ipvs_wall),
        ipvs_hwm as f64 / 1024.0
    );
    println!("|   its summary | {ipvs_summary} |");
    if let Some((wall, hwm, summary)) = iptables {
        println!(
            "| same plan, `--mode iptables --iptables-backend legacy` (binary) | {}, peak RSS {:.1} MiB |",
            ms(wall),
            hwm as f64 / 1024.0
        );
        println!("|   its summary | {summary} |");
    }
}
