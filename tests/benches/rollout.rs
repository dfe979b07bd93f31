//! What "is my change live everywhere?" costs at 5,000 nodes, by simulation.
//!
//! `cargo bench -p proxyplan-tests --bench rollout` (no root, no cluster; about a minute).
//!
//! Virtual time, the real decision code: every node's status writes go through the
//! agent's own `StatusGate` (the rate limit and per-node spread of its rollout mark), and
//! the controller's `Rollouts` decides every Service plan status write from the marks it
//! is shown. What is simulated is only what happens between them: Service plan changes
//! arriving at a steady rate on random Services, each node programming each change a
//! few milliseconds later (5-30 ms, the agents' measured sync times), the node plan
//! status write reaching the controller 10 ms later, and the controller looking every
//! 50 ms.
//!
//! Three phases: steady churn with every agent running; the same with one agent
//! stopped (its mark frozen, the slowest node of every rollout); and a quiet cluster
//! with one change every 30 s. Environment: `ROLLOUT_NODES` (5000), `ROLLOUT_RATE`
//! (changes/s, 20), `ROLLOUT_SECONDS` (per churn phase, 120), `ROLLOUT_SERVICES` (10000),
//! `ROLLOUT_REPORT` (the agents' `--rollout-report-interval`, s, 10), `ROLLOUT_SLOW_AFTER`
//! (the controller's `--rollout-slow-after`, s, 15).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "the shared bench helpers fail loudly; this bench's own code does not unwrap"
)]

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use proxyplan_agent::run::status::StatusGate;
use proxyplan_controller::run::rollout::{Rollouts, StatusWrites};
use proxyplan_crds::{NodeProxyPlanStatus, stable_hash};
use tokio::time::Instant;

mod common;
use common::{env_or, quantile};

/// A deterministic number in `0..n` from `seed`.
fn pick(seed: u64, n: u64) -> u64 {
    stable_hash(&seed.to_le_bytes()) % n.max(1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// Change `k` is written by the controller.
    Change(u64),
    /// Node `i` finished programming up to mark `m`.
    Programmed(usize, u64),
    /// Node `i`'s held status may be due.
    Release(usize),
    /// Node `i`'s status write reaches the controller with mark `m`.
    Delivered(usize, u64),
    /// The controller looks at its rollouts.
    Look,
}

struct Node {
    name: String,
    gate: StatusGate,
    status: NodeProxyPlanStatus,
    mark: u64,
    stopped: bool,
    release_at: Option<Instant>,
}

#[derive(Default)]
struct Phase {
    node_writes: Vec<f64>,
    /// The changes made in this phase (by number).
    changes: std::ops::Range<u64>,
    seconds: f64,
}

struct Sim {
    base: Instant,
    now: Duration,
    queue: BinaryHeap<Reverse<(Duration, u64, Step)>>,
    seq: u64,
    rv: u64,
    nodes: Vec<Node>,
    rollouts: Rollouts,
    services: u64,
    phase: Phase,
    /// When each change was written.
    written_at: HashMap<u64, Duration>,
    /// Service plan status writes per change.
    status_writes: HashMap<u64, u32>,
    /// From each change's write to the status saying every node holds it.
    complete_after: HashMap<u64, f64>,
    /// From each change's write to the controller knowing every node holds it.
    known_complete: HashMap<u64, f64>,
}

/// The change number of a simulated revision (`rev-<k>`).
fn change_number(revision: &str) -> Option<u64> {
    revision.strip_prefix("rev-")?.parse().ok()
}

impl Sim {
    fn new(
        nodes: usize,
        services: u64,
        report: Duration,
        slow_after: Duration,
        writes: StatusWrites,
    ) -> Self {
        let now = Timestamp::now();
        let condition = |type_: &str, status: &str, reason: &str| Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: "plan revision 0123456789abcdef applied".to_owned(),
            observed_generation: Some(1),
            last_transition_time: Time(now),
        };
        let template = NodeProxyPlanStatus {
            conditions: vec![
                condition("Ready", "True", "Synced"),
                condition("Degraded", "False", "AsExpected"),
            ],
            applied_revision: Some("0123456789abcdef".to_owned()),
            service_ports: Some(10_000),
            endpoints: Some(100_000),
            mode: Some("nftables".to_owned()),
            sync_duration_seconds: Some(0.009),
            agent_version: Some("0.1.0".to_owned()),
            programmed_resource_version: Some("1".to_owned()),
        };
        let base = Instant::now();
        let nodes = (0..nodes)
            .map(|i| {
                let name = format!("node-{i:05}");
                let mut gate = StatusGate::new(Duration::from_secs(60), report)
                    .with_spread(StatusGate::spread_for(&name, report));
                // Every node starts having written its status long ago.
                gate.offer(template.clone(), base);
                Node {
                    name,
                    gate,
                    status: template.clone(),
                    mark: 1,
                    stopped: false,
                    release_at: None,
                }
            })
            .collect();
        let mut sim = Self {
            base,
            now: Duration::ZERO,
            queue: BinaryHeap::new(),
            seq: 0,
            rv: 1,
            nodes,
            rollouts: Rollouts::new(slow_after, writes),
            services,
            phase: Phase::default(),
            written_at: HashMap::new(),
            status_writes: HashMap::new(),
            complete_after: HashMap::new(),
            known_complete: HashMap::new(),
        };
        for node in &sim.nodes {
            sim.rollouts.node_mark(&node.name, Some("1"));
        }
        sim
    }

    fn at(&self, offset: Duration) -> Instant {
        self.base + offset
    }

    fn push(&mut self, at: Duration, step: Step) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, step)));
    }

    /// Runs every step up to `until`.
    fn run_until(&mut self, until: Duration) {
        while let Some(Reverse((at, _, step))) = self.queue.peek().copied() {
            if at > until {
                break;
            }
            self.queue.pop();
            self.now = at;
            self.step(step);
        }
        self.now = until;
    }

    fn step(&mut self, step: Step) {
        let now = self.at(self.now);
        match step {
            Step::Change(k) => {
                self.rv += 1;
                let service = pick(k, self.services);
                self.written_at.insert(k, self.now);
                if self.phase.changes.is_empty() {
                    self.phase.changes = k..k + 1;
                } else {
                    self.phase.changes.end = k + 1;
                }
                self.rollouts.wrote(
                    &format!("ns/svc-{service}"),
                    &format!("rev-{k}"),
                    &self.rv.to_string(),
                    now,
                );
                let rv = self.rv;
                for i in 0..self.nodes.len() {
                    if self.nodes[i].stopped {
                        continue;
                    }
                    let delay = Duration::from_millis(5 + pick(k * 7919 + i as u64, 26));
                    self.push(self.now + delay, Step::Programmed(i, rv));
                }
            }
            Step::Programmed(i, mark) => {
                let node = &mut self.nodes[i];
                node.mark = node.mark.max(mark);
                node.status.programmed_resource_version = Some(node.mark.to_string());
                let offered = node.gate.offer(node.status.clone(), now);
                self.after_offer(i, offered);
            }
            Step::Release(i) => {
                let node = &mut self.nodes[i];
                node.release_at = None;
                let released = node.gate.release(now);
                self.after_offer(i, released);
            }
            Step::Delivered(i, mark) => {
                let name = self.nodes[i].name.clone();
                self.rollouts.node_mark(&name, Some(&mark.to_string()));
            }
            Step::Look => {
                if self.rollouts.due(now).is_some_and(|due| due <= now) {
                    let (updates, completed) = self.rollouts.updates(now);
                    for done in completed {
                        if let Some(k) = change_number(&done.revision) {
                            self.known_complete.insert(k, done.seconds);
                        }
                    }
                    for update in &updates {
                        self.rv += 1;
                        let k = change_number(&update.status.revision).unwrap_or(0);
                        *self.status_writes.entry(k).or_default() += 1;
                        if update.status.slowest.is_none()
                            && let Some(at) = self.written_at.get(&k)
                        {
                            self.complete_after
                                .insert(k, (self.now - *at).as_secs_f64());
                        }
                        self.rollouts.written(update, now);
                    }
                }
                self.push(self.now + Duration::from_millis(50), Step::Look);
            }
        }
    }

    fn after_offer(&mut self, i: usize, written: Option<NodeProxyPlanStatus>) {
        let now = self.now;
        if let Some(status) = written {
            let mark = status
                .programmed_resource_version
                .as_deref()
                .and_then(|m| m.parse().ok())
                .unwrap_or(0);
            self.phase.node_writes.push(now.as_secs_f64());
            self.push(now + Duration::from_millis(10), Step::Delivered(i, mark));
        }
        let node = &mut self.nodes[i];
        if let Some(due) = node.gate.due() {
            let offset = due.saturating_duration_since(self.base);
            if node.release_at.is_none_or(|r| due < r) {
                node.release_at = Some(due);
                self.push(offset, Step::Release(i));
            }
        }
    }

    fn take_phase(&mut self, seconds: f64) -> Phase {
        let mut phase = std::mem::take(&mut self.phase);
        phase.seconds = seconds;
        phase
    }
}

/// Writes per second: mean, and the busiest second.
fn rates(times: &[f64], from: f64, seconds: f64) -> (f64, f64) {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let buckets = seconds.ceil().max(1.0) as usize;
    let mut per_second = vec![0u64; buckets];
    let mut counted = 0u64;
    for t in times.iter().filter(|t| **t >= from && **t < from + seconds) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let b = ((t - from) as usize).min(buckets - 1);
        per_second[b] += 1;
        counted += 1;
    }
    #[allow(clippy::cast_precision_loss)]
    let mean = counted as f64 / seconds;
    #[allow(clippy::cast_precision_loss)]
    let peak = per_second.iter().copied().max().unwrap_or(0) as f64;
    (mean, peak)
}

fn row(phase: &Phase, sim: &Sim, from: f64, nodes: usize) -> String {
    let (mean, peak) = rates(&phase.node_writes, from, phase.seconds);
    #[allow(clippy::cast_precision_loss)]
    let changes = phase.changes.clone().count().max(1) as f64;
    let status: f64 = phase
        .changes
        .clone()
        .map(|k| f64::from(sim.status_writes.get(&k).copied().unwrap_or(0)))
        .sum();
    let fanout = (changes + status) / changes;
    let spread = |map: &HashMap<u64, f64>| {
        let mut values: Vec<f64> = phase
            .changes
            .clone()
            .filter_map(|k| map.get(&k).copied())
            .collect();
        let n = values.len();
        let p50 = quantile(&mut values, 0.5);
        let p99 = quantile(&mut values, 0.99);
        let max = quantile(&mut values, 1.0);
        if n == 0 {
            "0 | –".to_owned()
        } else {
            format!("{n} | {p50:.2} / {p99:.2} / {max:.2}")
        }
    };
    let known = spread(&sim.known_complete);
    let shown = spread(&sim.complete_after);
    #[allow(clippy::cast_precision_loss)]
    let per_node = mean / nodes as f64 * 60.0;
    format!(
        "| {changes} | {mean:.0} / {peak:.0} | {per_node:.1} | {:.2} | {fanout:.2} | {known} | {shown} |",
        status / changes,
    )
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("rollout: benchmark");
        return;
    }
    #[allow(clippy::cast_possible_truncation)]
    let nodes = env_or("ROLLOUT_NODES", 5000_u64) as usize;
    let rate = env_or("ROLLOUT_RATE", 20_u64).max(1);
    let seconds = env_or("ROLLOUT_SECONDS", 120_u64);
    let services = env_or("ROLLOUT_SERVICES", 10_000_u64);
    let report = Duration::from_secs(env_or("ROLLOUT_REPORT", 10_u64));
    let slow_after = Duration::from_secs(env_or("ROLLOUT_SLOW_AFTER", 15_u64));
    let started = std::time::Instant::now();
    let mut rows = Vec::new();
    for (mode, writes) in [
        ("lagging", StatusWrites::Lagging),
        ("all", StatusWrites::All),
    ] {
        let config = Config {
            nodes,
            rate,
            seconds,
            services,
            report,
            slow_after,
            writes,
        };
        for (phase, text) in run_mode(&config) {
            rows.push(format!("| {mode} | {phase} {text}"));
        }
    }
    println!(
        "\nrollout status at {nodes} nodes, {services} Services, --rollout-report-interval {}s, \
         --rollout-slow-after {}s (virtual time; simulated in {:.1}s)\n",
        report.as_secs(),
        slow_after.as_secs(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "| --rollout-status | phase | changes | node status writes/s (mean / busiest second) | writes per node per minute | Service plan status writes per change | Service plan events per change per node (content + status) | known complete | write to the controller knowing every node has it, s (p50 / p99 / max) | shown complete | write to the status showing it complete, s (p50 / p99 / max) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
}

struct Config {
    nodes: usize,
    rate: u64,
    seconds: u64,
    services: u64,
    report: Duration,
    slow_after: Duration,
    writes: StatusWrites,
}

/// The three phases under one `--rollout-status`: (phase, the rest of its row).
fn run_mode(config: &Config) -> Vec<(String, String)> {
    let Config {
        nodes,
        rate,
        seconds,
        services,
        report,
        slow_after,
        writes,
    } = *config;
    let mut sim = Sim::new(nodes, services, report, slow_after, writes);
    sim.push(Duration::ZERO, Step::Look);
    let gap = Duration::from_secs(1) / u32::try_from(rate).unwrap_or(1);
    let mut k = 0;
    let mut schedule = |sim: &mut Sim, from: Duration, every: Duration, until: Duration| {
        let mut at = from;
        while at < until {
            k += 1;
            sim.push(at, Step::Change(k));
            at += every;
        }
    };
    // Warm-up: the first marks after the start, then churn.
    let warm = Duration::from_secs(30);
    schedule(&mut sim, Duration::ZERO, gap, warm);
    sim.run_until(warm);
    sim.take_phase(30.0);

    let phase_len = Duration::from_secs(seconds);
    let t1 = warm + phase_len;
    schedule(&mut sim, warm, gap, t1);
    sim.run_until(t1);
    let churn = sim.take_phase(phase_len.as_secs_f64());
    // Every rollout of the churn completes before the next phase.
    let t1 = t1 + Duration::from_secs(20);
    sim.run_until(t1);
    sim.take_phase(20.0);

    // One agent stopped: every later rollout lacks it.
    sim.nodes[nodes / 2].stopped = true;
    let t2 = t1 + phase_len;
    schedule(&mut sim, t1, gap, t2);
    // The last changes' slow writes come after the phase: let them in.
    sim.run_until(t2 + slow_after + Duration::from_secs(1));
    let stopped = sim.take_phase(phase_len.as_secs_f64());
    sim.nodes[nodes / 2].stopped = false;
    // It comes back: its next mark covers everything.
    let back = sim.now;
    let last = sim.rv;
    sim.push(back, Step::Programmed(nodes / 2, last));
    sim.run_until(back + Duration::from_secs(20));
    sim.take_phase(20.0);

    // A quiet cluster: one change every 30 s.
    let quiet_from = sim.now;
    let quiet_len = Duration::from_secs(300);
    schedule(
        &mut sim,
        quiet_from + Duration::from_secs(1),
        Duration::from_secs(30),
        quiet_from + quiet_len,
    );
    sim.run_until(quiet_from + quiet_len + Duration::from_secs(5));
    let quiet = sim.take_phase(quiet_len.as_secs_f64());
    let stopped_name = format!(
        "churn, {rate} changes/s, one agent stopped (it resumes {}s after)",
        slow_after.as_secs() + 1
    );
    [
        (
            format!("churn, {rate} changes/s, every agent running"),
            churn,
            warm,
        ),
        (stopped_name, stopped, t1),
        ("quiet, one change every 30 s".to_owned(), quiet, quiet_from),
    ]
    .into_iter()
    .map(|(name, phase, from)| {
        let text = row(&phase, &sim, from.as_secs_f64(), nodes);
        (name, text)
    })
    .collect()
}
