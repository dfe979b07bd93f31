//! What the agent benchmarks share: environment knobs, the child process per size (so
//! that each size's peak memory is its own), a throwaway network namespace, the node's
//! objects as the agent's watches hold them, and the table printer. Each bench uses
//! only part of it.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use proxyplan_controller::synthetic::SyntheticSpec;
use proxyplan_controller::{DesiredObject, Planner};
use proxyplan_crds::{
    MergeCache, MergedPlan, NodeProxyPlan, ServiceProxyPlan, merge_cached, merge_update, object_key,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The node whose plan the benches program.
pub const NODE: &str = "node-00000";

const CHILD_VAR: &str = "AGENT_BENCH_CHILD_SERVICES";
const RESULT_PREFIX: &str = "AGENT_BENCH_RESULT ";

/// `name` from the environment, parsed; `default` when unset.
///
/// # Panics
/// When it is set to something that does not parse.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a valid value")),
        Err(_) => default,
    }
}

/// Whether this is a real run (`cargo bench`), not `cargo test --benches`' smoke test.
pub fn full() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// The synthetic cluster of `services` Services (`AGENT_BENCH_ENDPOINTS`, `_NODES`,
/// `_ZONES`, `_LOCAL`, `_HINTED`, `_SEED`).
pub fn spec(services: usize) -> SyntheticSpec {
    SyntheticSpec {
        services,
        endpoints_per_service: env_or("AGENT_BENCH_ENDPOINTS", 10),
        nodes: env_or("AGENT_BENCH_NODES", if full() { 100 } else { 10 }),
        zones: env_or("AGENT_BENCH_ZONES", if full() { 10 } else { 2 }),
        local_fraction: env_or("AGENT_BENCH_LOCAL", 0.05),
        hinted_fraction: env_or("AGENT_BENCH_HINTED", 0.05),
        seed: env_or("AGENT_BENCH_SEED", 1),
    }
}

/// The Service counts to run (`AGENT_BENCH_SIZES`, default 10,000 and 1,000; 100 in
/// the smoke test).
///
/// # Panics
/// When it is not a list of numbers.
pub fn sizes() -> Vec<usize> {
    let default = if full() { "10000,1000" } else { "100" };
    std::env::var("AGENT_BENCH_SIZES")
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|s| s.trim().parse().expect("AGENT_BENCH_SIZES: numbers"))
        .collect()
}

/// A field of `/proc/PID/status`, in KiB.
pub fn proc_status_kib(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Runs `run_size` for each of `sizes` in a child process of this binary and returns
/// the results in order; in the child, runs its one size, prints the result and returns
/// `None`. Without root, says the `bench` is SKIPPED and returns `None`.
///
/// # Panics
/// When a child fails.
pub fn per_size<R: Serialize + DeserializeOwned>(
    bench: &str,
    sizes: Vec<usize>,
    run_size: fn(usize) -> R,
) -> Option<Vec<R>> {
    if !is_root() {
        println!("SKIPPED: the {bench} bench needs root (it creates network namespaces)");
        return None;
    }
    if let Ok(services) = std::env::var(CHILD_VAR) {
        let result = run_size(services.parse().expect("Service count"));
        println!("{RESULT_PREFIX}{}", serde_json::to_string(&result).unwrap());
        std::io::stdout().flush().unwrap();
        return None;
    }
    let exe = std::env::current_exe().expect("own path");
    let results = sizes
        .into_iter()
        .map(|services| {
            let output = Command::new(&exe)
                .args(std::env::args().skip(1))
                .env(CHILD_VAR, services.to_string())
                .stderr(Stdio::inherit())
                .output()
                .expect("child benchmark");
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "benchmark at {services} Services failed\n{stdout}"
            );
            let line = stdout
                .lines()
                .find_map(|l| l.strip_prefix(RESULT_PREFIX))
                .expect("child result line");
            serde_json::from_str(line).expect("child result")
        })
        .collect();
    Some(results)
}

/// A network namespace (loopback up), deleted on drop.
pub struct Netns(pub String);

impl Netns {
    /// A new namespace named after this process and `tag`.
    ///
    /// # Panics
    /// When it cannot be made.
    pub fn new(tag: &str) -> Self {
        let name = format!("ppbench-{}-{tag}", std::process::id());
        let status = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("ip netns add");
        assert!(status.success(), "ip netns add {name} failed");
        let _ = Command::new("ip")
            .args(["netns", "exec", &name, "ip", "link", "set", "lo", "up"])
            .status();
        Self(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

/// The node's plan and every Service plan, as the agent's watches hold them: in one
/// vector (merged without copies), each with a `resourceVersion` that moves when it
/// changes, and the agent's merge cache, so a merge after a change is the agent's
/// incremental one.
#[derive(Default)]
pub struct Objects {
    /// The node's plan.
    pub plan: Option<NodeProxyPlan>,
    /// Every Service plan.
    pub services: Vec<ServiceProxyPlan>,
    index: HashMap<String, usize>,
    /// Objects changed since the last merge, as the agent's cache tracks them.
    changed: Vec<String>,
    versions: u64,
    cache: MergeCache,
}

impl Objects {
    /// Takes the planner's changes.
    pub fn take(&mut self, planner: &mut Planner) {
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
    ///
    /// # Panics
    /// Without a node plan, or when the merge fails.
    pub fn merged(&mut self) -> MergedPlan {
        let plan = self.plan.as_ref().expect("node plan");
        let changed = std::mem::take(&mut self.changed);
        let (services, index) = (&self.services, &self.index);
        let lookup = |key: &str| {
            index
                .get(key)
                .and_then(|&i| services.get(i))
                .map(proxyplan_crds::PlanRef::Object)
        };
        match merge_update(plan, lookup, &changed, &mut self.cache) {
            Some(result) => result.expect("merges"),
            None => merge_cached(plan, &self.services, &mut self.cache).expect("merges"),
        }
    }

    /// Writes them as a plan file (multi-document YAML); returns its size.
    ///
    /// # Panics
    /// When it cannot be written.
    pub fn write_file(&self, path: &Path) -> usize {
        let mut text = format!(
            "---\n{}",
            serde_yaml::to_string(self.plan.as_ref().unwrap()).unwrap()
        );
        for service in &self.services {
            text.push_str("---\n");
            text.push_str(&serde_yaml::to_string(service).unwrap());
        }
        std::fs::write(path, &text).expect("plan file");
        text.len()
    }
}

/// Prints a Markdown table: a `measurement` column, one column per `header`, and a
/// `budget` column; each row is its label, its cells and its budget.
pub fn print_grid(header: &[String], rows: &[(&str, Vec<String>, &str)]) {
    let first = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r.1.get(i).map_or(0, String::len))
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
    line("measurement", header, "budget");
    println!(
        "|{}|{}|{}|",
        "-".repeat(first + 2),
        widths
            .iter()
            .map(|w| "-".repeat(w + 2))
            .collect::<Vec<_>>()
            .join("|"),
        "-".repeat(last + 2)
    );
    for (label, cells, budget) in rows {
        line(label, cells, budget);
    }
}
