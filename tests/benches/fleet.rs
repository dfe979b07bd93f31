//! Fleet benchmark (issue: the fleet): one real kube-apiserver v1.36.2, the real
//! controller, K real agents — each in a network namespace of its own, with its own
//! nf_tables — and raw watchers of the Service plans standing in for the rest of a
//! 5,000-node cluster. Nodes sit in 50 zones; 5 % of the Services are NodePorts with
//! `externalTrafficPolicy: Local`, some use topology hints. Then churn: rolling
//! Deployments (an endpoint goes terminating while a new one appears, then goes), at a
//! steady rate with bursts (a 500-pod rollout), and now and then a Service drained to
//! terminating endpoints only, then to none, then back. Prints one table.
//!
//! ```text
//! cargo build --release --bins
//! sudo cargo bench -p proxyplan-tests --bench fleet                       # proxyplan
//! sudo FLEET_PROXY=kube-proxy cargo bench -p proxyplan-tests --bench fleet  # kube-proxy v1.36.2
//! ```
//!
//! Latency is measured on the kernels, not from the agents' reports: a listener to
//! nf_tables' announcements in every node's namespace timestamps each new endpoint
//! address the moment a commit adds it. A change's fleet latency runs from just before
//! its EndpointSlice PATCH is sent to the last node whose semantics include the new
//! endpoint (its zone's hints decide) showing it. A write the API server refused (a
//! soak's outages) is timed from the attempt it took; the wait is reported apart. The per-node checker (proxyplan only) reads every agent's table with
//! `nft -j` over and over, models it independently of the agent
//! (`proxyplan_tests::nft_model`), and compares each Service with what kube-proxy's
//! semantics give on that node: ready endpoints, else serving terminating ones; zone hints
//! when every endpoint has them and one matches the node's zone; for the Local NodePorts
//! the node's own endpoints, else drop. A difference on a Service written less than a
//! second before the read is a change in flight; the checker reads that node again until
//! it agrees (how long it disagreed is bounded by how often it reads a node), and once
//! the churn is over reads every node a last time: any difference then is a wrong kernel.
//!
//! Environment: `FLEET_PROXY` (`proxyplan` or `kube-proxy`), `FLEET_AGENTS` (K, 100),
//! `FLEET_NODES` (Node objects, 5,000), `FLEET_WATCHERS` (raw watchers of the Service
//! plans, or of the EndpointSlices for kube-proxy; default nodes − K), `FLEET_SERVICES` (1,000), `FLEET_ENDPOINTS` (10 per Service),
//! `FLEET_ZONES` (50), `FLEET_LOCAL` (0.05), `FLEET_HINTED` (0.1), `FLEET_SECONDS` (600
//! of churn), `FLEET_RATE` (20 EndpointSlice changes/s), `FLEET_BURST_EVERY` (120 s),
//! `FLEET_BURST_PODS` (500), `FLEET_CHECK_GAP_MS` (250: the checker's pause between two
//! reads), `FLEET_SEED` (1), `FLEET_AGENT_LOG` and `FLEET_CONTROLLER_LOG` (their
//! `--log`, `warn`), `FLEET_KEEP_LOGS` (set: keep the processes' logs). Without `--bench` it does nothing.
//!
//! **The soak** (issue: an hour of churn and faults): `FLEET_FAULTS=30` injects a fault
//! about every 30 s (exponential gaps, so they overlap), of the kinds in `fleet/faults.rs`
//! (agent and controller-leader SIGKILL, leader SIGSTOP, API server and etcd restarts,
//! partitions of a node from the API server, tampering with a node's table, its state
//! directory removed), with two controller replicas. Each fault is followed until every
//! node it touched reads back matching its semantics. The churn adds: a Local NodePort
//! flipped to Cluster policy and back every 20 s, zone hints taken away and back, a
//! hundred Nodes deleted and added again every minute, and every
//! `FLEET_SERVICE_BURST_EVERY` seconds (300) `FLEET_SERVICE_BURST` Services (1,000)
//! created at once, the first with `FLEET_BIG` endpoints (6,000), all deleted two minutes
//! later. Pods on `FLEET_PROBES` nodes (4) connect to two Services whose endpoints never
//! go, every 200 ms; the processes' memory, files, sockets and threads are sampled every
//! minute. At the end, with or without faults, the cluster is dumped and planned again
//! offline (`proxyplan-controller plan`), every plan in the API server is compared with
//! that, and every agent's applied revision is read:
//!
//! ```text
//! sudo FLEET_FAULTS=30 FLEET_SECONDS=3600 FLEET_AGENTS=20 FLEET_NODES=1000 \
//!   cargo bench -p proxyplan-tests --bench fleet
//! ```

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::too_many_lines,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

mod common;
#[path = "fleet/faults.rs"]
mod faults;

#[path = "../tests/e2e/procs.rs"]
#[allow(dead_code, reason = "shared with the e2e suite")]
mod procs;

use std::collections::{BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use proxyplan_tests::e2e::{forward, kubeconfig};
use proxyplan_tests::nft_model::{self, Proto, Verdict};
use serde_json::json;

use common::{
    AgentMetrics, Sink, controller_command, count, cpu_seconds, env_or, list_bytes, metric, ms,
    now, print_table, quantile, raw_watch, start_plane, status_kib,
};
use procs::Bins;

const NS: &str = "fleet";
const API_IN_NETNS: &str = "127.0.0.1:6443";
const CLUSTER_CIDR: &str = "10.128.0.0/9";
const TARGET_PORT: u16 = 8080;
/// Pod addresses: 10.128.0.1 on, never reused, so a new address in a kernel is a change.
const FIRST_POD: u32 = u32::from_be_bytes([10, 128, 0, 1]);
/// A change on a Service written this long before a read may still be in flight.
const IN_FLIGHT: f64 = 1.0;
/// The soak's probe targets' endpoints: on every probe node's `lo`, served there.
const STABLE: [Ipv4Addr; 3] = [
    Ipv4Addr::new(10, 255, 0, 1),
    Ipv4Addr::new(10, 255, 0, 2),
    Ipv4Addr::new(10, 255, 0, 3),
];

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() % 1_000_000) as f64 / 1e6 < p
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    /// NodePort, `externalTrafficPolicy: Local`.
    Local,
    /// `trafficDistribution: PreferClose`, every endpoint hinted for its own zone.
    Hinted,
}

#[derive(Debug, Clone)]
struct Endpoint {
    ip: u32,
    node: usize,
    ready: bool,
    terminating: bool,
}

#[derive(Debug, Clone)]
struct Svc {
    name: String,
    kind: Kind,
    vip: Ipv4Addr,
    node_port: u16,
    endpoints: Vec<Endpoint>,
    /// When the state above was last sent (just before its PATCH), then when the API
    /// server acknowledged it.
    written: f64,
    /// A burst owns it: the steady writer leaves it alone.
    busy: bool,
    /// Its last write is not acknowledged yet (the API server may be down): in flight.
    pending: bool,
    /// A probe target of the soak: never churned, its endpoints always there.
    stable: bool,
    /// `externalTrafficPolicy: Local` (a `Local` Service; a soak flips it to Cluster and
    /// back).
    external_local: bool,
    /// Its endpoints carry zone hints (a `Hinted` Service; a soak takes them away and
    /// back).
    hints: bool,
    /// The Service exists (a soak's bursts create and delete theirs).
    exists: bool,
}

struct Fleet {
    services: Vec<Svc>,
    zones: usize,
    agents: usize,
    nodes: usize,
    replicas: usize,
    next_ip: u32,
    rng: Rng,
    /// A soak: topology and policy change too.
    soak: bool,
    /// Per Service, its last `HISTORY` acknowledged states and when each was
    /// acknowledged: a fault is over once every node it touched holds, for every Service,
    /// the state acknowledged before the fault was lifted or a newer one.
    history: Vec<std::collections::VecDeque<(f64, Svc)>>,
}

/// How many acknowledged states of each Service [`Fleet::history`] keeps.
const HISTORY: usize = 64;

impl Fleet {
    /// Service `s`'s state, as it is now, acknowledged by the API server at `at`.
    fn acked(&mut self, s: usize, at: f64) {
        self.services[s].written = at;
        if self.history.len() <= s {
            self.history.resize_with(s + 1, Default::default);
        }
        let history = &mut self.history[s];
        if history.len() == HISTORY {
            history.pop_front();
        }
        history.push_back((at, self.services[s].clone()));
    }

    fn zone_of(&self, node: usize) -> usize {
        node % self.zones
    }

    /// A node for a new pod: half of them land on the agents' nodes, so Local policy and
    /// zones have something to show there.
    fn new_endpoint(&mut self) -> Endpoint {
        let node = if self.rng.chance(0.5) {
            self.rng.below(self.agents)
        } else {
            self.rng.below(self.nodes)
        };
        let ip = self.next_ip;
        self.next_ip += 1;
        Endpoint {
            ip,
            node,
            ready: true,
            terminating: false,
        }
    }

    /// kube-proxy's cluster endpoints for `node`: ready ones (narrowed to the node's zone
    /// when hints apply), else serving terminating ones; none is a reject.
    fn cluster_expected(&self, svc: &Svc, node: usize) -> Verdict {
        let ready: Vec<&Endpoint> = svc.endpoints.iter().filter(|e| e.ready).collect();
        let zone = self.zone_of(node);
        let chosen: Vec<&Endpoint> = if ready.is_empty() {
            svc.endpoints.iter().filter(|e| e.terminating).collect()
        } else if svc.kind == Kind::Hinted
            && svc.hints
            && ready.iter().any(|e| self.zone_of(e.node) == zone)
        {
            ready
                .into_iter()
                .filter(|e| self.zone_of(e.node) == zone)
                .collect()
        } else {
            ready
        };
        if chosen.is_empty() {
            Verdict::Reject
        } else {
            Verdict::Endpoints(chosen.iter().map(|e| socket(e.ip)).collect())
        }
    }

    /// kube-proxy's external endpoints of a Local NodePort on `node`: its ready endpoints
    /// there, else its serving terminating ones there; none is a drop (a reject when the
    /// Service has no endpoints at all).
    fn local_expected(&self, svc: &Svc, node: usize) -> Verdict {
        let here: Vec<&Endpoint> = svc.endpoints.iter().filter(|e| e.node == node).collect();
        let ready: Vec<&&Endpoint> = here.iter().filter(|e| e.ready).collect();
        let chosen: Vec<&&Endpoint> = if ready.is_empty() {
            here.iter().filter(|e| e.terminating).collect()
        } else {
            ready
        };
        if !chosen.is_empty() {
            Verdict::Endpoints(chosen.iter().map(|e| socket(e.ip)).collect())
        } else if matches!(self.cluster_expected(svc, node), Verdict::Reject) {
            Verdict::Reject
        } else {
            Verdict::Drop
        }
    }

    /// One rolling step of Service `s`: a terminating endpoint goes; else a ready one
    /// starts terminating and a new one appears. Now and then (plain Services) every
    /// endpoint starts terminating instead, then all go, then the Deployment comes back.
    /// Returns the addresses that appeared.
    fn roll(&mut self, s: usize) -> Vec<u32> {
        // A soak's topology change: the hints go (or come back).
        if self.soak && self.services[s].kind == Kind::Hinted && self.rng.chance(0.05) {
            self.services[s].hints = !self.services[s].hints;
            return Vec::new();
        }
        let drain = self.services[s].kind == Kind::Plain && self.rng.chance(0.02);
        let svc = &self.services[s];
        if svc.endpoints.is_empty() {
            let fresh: Vec<Endpoint> = (0..self.replicas).map(|_| self.new_endpoint()).collect();
            let ips = fresh.iter().map(|e| e.ip).collect();
            self.services[s].endpoints = fresh;
            return ips;
        }
        if svc.endpoints.iter().any(|e| e.terminating) {
            if svc.endpoints.iter().all(|e| e.terminating) {
                self.services[s].endpoints.clear();
            } else {
                let i = svc.endpoints.iter().position(|e| e.terminating).unwrap();
                self.services[s].endpoints.remove(i);
            }
            return Vec::new();
        }
        if drain {
            for e in &mut self.services[s].endpoints {
                e.ready = false;
                e.terminating = true;
            }
            return Vec::new();
        }
        let i = self.rng.below(svc.endpoints.len());
        let fresh = self.new_endpoint();
        let ip = fresh.ip;
        let svc = &mut self.services[s];
        svc.endpoints[i].ready = false;
        svc.endpoints[i].terminating = true;
        svc.endpoints.push(fresh);
        vec![ip]
    }

    /// A whole Deployment replaced at once (a burst's first write): every ready endpoint
    /// terminating, as many new ones ready.
    fn replace_all(&mut self, s: usize) -> Vec<u32> {
        let count = self.services[s]
            .endpoints
            .iter()
            .filter(|e| e.ready)
            .count();
        let fresh: Vec<Endpoint> = (0..count.max(1)).map(|_| self.new_endpoint()).collect();
        let ips = fresh.iter().map(|e| e.ip).collect();
        let svc = &mut self.services[s];
        svc.endpoints.retain(|e| e.ready);
        for e in &mut svc.endpoints {
            e.ready = false;
            e.terminating = true;
        }
        svc.endpoints.extend(fresh);
        ips
    }

    fn slice_endpoints(&self, s: usize) -> serde_json::Value {
        let svc = &self.services[s];
        let items: Vec<serde_json::Value> = svc
            .endpoints
            .iter()
            .map(|e| {
                let zone = format!("zone-{}", self.zone_of(e.node));
                let mut item = json!({
                    "addresses": [Ipv4Addr::from(e.ip).to_string()],
                    "conditions": {"ready": e.ready, "serving": true, "terminating": e.terminating},
                    "nodeName": node_name(e.node), "zone": zone,
                    "targetRef": {"kind": "Pod", "namespace": NS,
                                  "name": format!("pod-{}", e.ip - FIRST_POD)}
                });
                if svc.kind == Kind::Hinted && svc.hints {
                    item["hints"] = json!({"forZones": [{"name": zone}]});
                }
                item
            })
            .collect();
        serde_json::Value::Array(items)
    }
}

/// The soak's verdict: per fault kind, how many, how long until every node it touched
/// matched its semantics again, and the probe failures while one was in progress on the
/// probe's node (or everywhere); then every probe failure, and the resource samples of
/// the first and last ten minutes.
fn report_soak(
    log: &[faults::Injected],
    probes: &faults::Probes,
    samples: &[String],
    behind_disturbed: usize,
) {
    let mut rows = vec![(
        "fault: injected (alone / overlapping another on its nodes); after it was lifted, \
         every node it touched recovered (nothing from before the lift left): alone p99 / \
         max, overlapping max; every such node at every Service's newest state at once: \
         alone p99 / max, overlapping max; never recovered within 300 s (needed a human); \
         probe failures during it"
            .to_owned(),
        String::new(),
    )];
    for kind in faults::KINDS {
        let of_kind: Vec<&faults::Injected> = log.iter().filter(|f| f.kind == kind).collect();
        let mut times: Vec<f64> = of_kind
            .iter()
            .filter(|f| !f.overlapped)
            .filter_map(|f| f.recovered)
            .collect();
        let mut overlapping: Vec<f64> = of_kind
            .iter()
            .filter(|f| f.overlapped)
            .filter_map(|f| f.recovered)
            .collect();
        let mut settled: Vec<f64> = of_kind
            .iter()
            .filter(|f| !f.overlapped)
            .map(|f| f.settled.unwrap_or(f64::INFINITY))
            .collect();
        let mut settled_overlapping: Vec<f64> = of_kind
            .iter()
            .filter(|f| f.overlapped)
            .map(|f| f.settled.unwrap_or(f64::INFINITY))
            .collect();
        let alone = of_kind.iter().filter(|f| !f.overlapped).count();
        let never = of_kind.iter().filter(|f| f.recovered.is_none()).count();
        let failures = probes
            .failures
            .iter()
            .filter(|(at, k, _, _)| {
                of_kind.iter().any(|f| {
                    let end = f.lifted + f.recovered.unwrap_or(300.0);
                    *at >= f.injected - 1.0
                        && *at <= end + 1.0
                        && (f.scope == faults::Scope::All || f.scope == faults::Scope::Node(*k))
                })
            })
            .count();
        rows.push((
            format!("  {kind}"),
            format!(
                "{} ({alone} / {}); {:.2} / {:.2} s, {:.2} s; {:.1} / {:.1} s, {:.1} s; {never}; \
                 {failures}",
                of_kind.len(),
                of_kind.len() - alone,
                quantile(&mut times.clone(), 0.99),
                quantile(&mut times, 1.0),
                quantile(&mut overlapping, 1.0),
                quantile(&mut settled.clone(), 0.99),
                quantile(&mut settled, 1.0),
                quantile(&mut settled_overlapping, 1.0)
            ),
        ));
    }
    let mut repairs: Vec<f64> = log.iter().filter_map(|f| f.repaired).collect();
    let unrepaired = log
        .iter()
        .filter(|f| f.kind.starts_with("tamper-") && f.repaired.is_none())
        .count();
    rows.push((
        "tampers: the agent's repair, from nft's exit until the table holds it again (read \
         back over netlink; median / p99 / max of n; not within 30 s or nothing taken)"
            .into(),
        format!(
            "{:.0} / {:.0} / {:.0} ms of {}; {unrepaired}",
            quantile(&mut repairs.clone(), 0.5) * 1e3,
            quantile(&mut repairs.clone(), 0.99) * 1e3,
            quantile(&mut repairs, 1.0) * 1e3,
            log.iter().filter(|f| f.repaired.is_some()).count()
        ),
    ));
    rows.push((
        "probes: connections opened; failed".into(),
        format!("{}; {}", probes.attempts, probes.failures.len()),
    ));
    rows.push((
        "checker: differences past 1 s on a node a fault touched (counted by recovery)".into(),
        format!("{behind_disturbed}"),
    ));
    print_table(&rows);
    for (at, k, name, why) in probes.failures.iter().take(30) {
        let during: Vec<String> = log
            .iter()
            .filter(|f| {
                *at >= f.injected - 1.0
                    && *at <= f.lifted + f.recovered.unwrap_or(300.0) + 1.0
                    && (f.scope == faults::Scope::All || f.scope == faults::Scope::Node(*k))
            })
            .map(|f| format!("{} ({})", f.kind, f.detail))
            .collect();
        println!(
            "fleet bench: PROBE FAILED from {} to {name} at {at:.1}: {why}; during: {}",
            node_name(*k),
            if during.is_empty() {
                "no fault".to_owned()
            } else {
                during.join(", ")
            }
        );
    }
    for f in log.iter().filter(|f| f.recovered.is_none()) {
        println!(
            "fleet bench: NEVER RECOVERED {} {:?}: {}",
            f.kind, f.scope, f.detail
        );
    }
    for f in log {
        println!(
            "fleet bench: fault {} {:?} at {:.1}: {}; lifted after {:.1} s; recovered {}; \
             newest state everywhere {}{}{}",
            f.kind,
            f.scope,
            f.injected,
            f.detail,
            f.lifted - f.injected,
            f.recovered
                .map_or("never".to_owned(), |r| format!("{r:.2} s later")),
            f.settled
                .map_or("not within 300 s".to_owned(), |r| format!("{r:.2} s later")),
            if f.overlapped { "; overlapped" } else { "" },
            if f.left_to_others > 0 {
                format!("; {} nodes left to other faults", f.left_to_others)
            } else {
                String::new()
            }
        );
    }
    let (first, last) = samples.split_at(samples.len().min(10));
    for (i, line) in first.iter().enumerate() {
        println!("fleet bench: resources, minute {}: {line}", i + 1);
    }
    let skip = last.len().saturating_sub(10);
    for (i, line) in last.iter().enumerate().skip(skip) {
        println!(
            "fleet bench: resources, minute {}: {line}",
            first.len() + i + 1
        );
    }
}

/// The end state, exactly: the cluster's Services, EndpointSlices, Nodes and ServiceCIDRs dumped and
/// planned again offline (`proxyplan-controller plan`), every plan in the API server
/// compared with that field by field, and every agent's node plan status read (the plan
/// revision it applied, and Ready). Returns table rows and the differences found.
async fn final_equality(
    client: &kube::Client,
    controller: &std::path::Path,
    workdir: &std::path::Path,
    agents: usize,
) -> (Vec<(String, String)>, Vec<String>) {
    let list = |path: &'static str| {
        let client = client.clone();
        async move {
            let text = client
                .request_text(http::Request::get(path).body(Vec::new()).unwrap())
                .await
                .unwrap();
            let list: serde_json::Value = serde_json::from_str(&text).unwrap();
            let api_version = list["apiVersion"].clone();
            let kind = list["kind"]
                .as_str()
                .unwrap_or_default()
                .trim_end_matches("List")
                .to_owned();
            list["items"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|mut item| {
                    item["apiVersion"] = api_version.clone();
                    item["kind"] = json!(kind);
                    item
                })
                .collect::<Vec<serde_json::Value>>()
        }
    };
    let mut state = list("/api/v1/services").await;
    state.extend(list("/apis/discovery.k8s.io/v1/endpointslices").await);
    state.extend(list("/api/v1/nodes").await);
    state.extend(list("/apis/networking.k8s.io/v1/servicecidrs").await);
    let dump = workdir.join("cluster-state.json");
    std::fs::write(
        &dump,
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "List", "items": state})).unwrap(),
    )
    .unwrap();
    let out = Command::new(controller)
        .args([
            "plan",
            "-o",
            "json",
            "--cluster-cidr",
            CLUSTER_CIDR,
            "--state",
        ])
        .arg(&dump)
        .output()
        .unwrap();
    let mut differences = Vec::new();
    if !out.status.success() {
        differences.push(format!(
            "proxyplan-controller plan: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let planned: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let key = |o: &serde_json::Value| {
        (
            o["kind"].as_str().unwrap_or_default().to_owned(),
            o["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    };
    let planned: std::collections::BTreeMap<_, _> = planned["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|o| (key(&o), o["spec"].clone()))
        .collect();
    let mut live = list("/apis/proxyplan.dev/v1alpha1/serviceproxyplans").await;
    let node_plans = list("/apis/proxyplan.dev/v1alpha1/nodeproxyplans").await;
    live.extend(node_plans.iter().cloned());
    let live: std::collections::BTreeMap<_, _> =
        live.iter().map(|o| (key(o), o["spec"].clone())).collect();
    let mut equal = 0;
    for (k, spec) in &planned {
        match live.get(k) {
            Some(l) if l == spec => equal += 1,
            Some(_) => differences.push(format!("{k:?}: its spec differs from the offline plan")),
            None => differences.push(format!("{k:?}: planned offline, not in the API server")),
        }
    }
    for k in live.keys().filter(|k| !planned.contains_key(*k)) {
        differences.push(format!("{k:?}: in the API server, not planned offline"));
    }
    let mut applied = 0;
    for n in 0..agents {
        let name = node_name(n);
        let Some(plan) = node_plans
            .iter()
            .find(|p| p["metadata"]["name"].as_str() == Some(name.as_str()))
        else {
            differences.push(format!("{name}: no node plan"));
            continue;
        };
        let ready = plan["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        if plan["status"]["appliedRevision"] == plan["spec"]["revision"] && ready {
            applied += 1;
        } else {
            differences.push(format!(
                "{name}: applied revision {}, plan revision {}, Ready {ready}",
                plan["status"]["appliedRevision"], plan["spec"]["revision"]
            ));
        }
    }
    let rows = vec![
        (
            "end state: plans in the API server equal to `proxyplan-controller plan` over a dump of the cluster".into(),
            format!("{equal} of {} ({} objects dumped)", planned.len(), state_len(&dump)),
        ),
        (
            "end state: agents Ready with their node plan's revision applied".into(),
            format!("{applied} of {agents}"),
        ),
    ];
    (rows, differences)
}

fn state_len(dump: &std::path::Path) -> usize {
    std::fs::read(dump)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["items"].as_array().map(Vec::len))
        .unwrap_or(0)
}

/// Retries `f` while the API server is away (every 0.5 s, up to 10 minutes); a conflict
/// (already there, already gone) is done.
async fn persist<T, F: std::future::Future<Output = Result<T, kube::Error>>>(
    what: &str,
    mut f: impl FnMut() -> F,
) {
    for _ in 0..1_200 {
        match f().await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    panic!("{what}: the API server did not take it within 10 minutes");
}

/// A burst Service `i` created with `count` endpoints in slices of 1,000, and marked
/// existing once all are acknowledged.
async fn create_service(
    fleet: &Mutex<Fleet>,
    service_api: &Api<Service>,
    slice_api: &Api<EndpointSlice>,
    i: usize,
    count: usize,
) {
    let (name, chunks) = {
        let mut fleet = fleet.lock().unwrap();
        let endpoints: Vec<Endpoint> = (0..count).map(|_| fleet.new_endpoint()).collect();
        fleet.services[i].endpoints = endpoints;
        fleet.services[i].pending = true;
        let all = fleet.slice_endpoints(i);
        let chunks: Vec<serde_json::Value> = all
            .as_array()
            .unwrap()
            .chunks(1_000)
            .map(|c| serde_json::Value::Array(c.to_vec()))
            .collect();
        (fleet.services[i].name.clone(), chunks)
    };
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": TARGET_PORT}]}
    }))
    .unwrap();
    let post = PostParams::default();
    persist(&name, || service_api.create(&post, &svc)).await;
    let vip: Ipv4Addr = loop {
        match service_api.get(&name).await {
            Ok(s) => {
                break s
                    .spec
                    .and_then(|s| s.cluster_ip)
                    .and_then(|ip| ip.parse().ok())
                    .unwrap();
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    for (j, endpoints) in chunks.into_iter().enumerate() {
        let slice_name = if j == 0 {
            format!("{name}-fleet")
        } else {
            format!("{name}-fleet-{j}")
        };
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": slice_name, "namespace": NS,
                         "labels": {"kubernetes.io/service-name": name,
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": TARGET_PORT, "protocol": "TCP"}],
            "endpoints": endpoints
        }))
        .unwrap();
        persist(&slice_name, || slice_api.create(&post, &slice)).await;
    }
    let mut fleet = fleet.lock().unwrap();
    let svc = &mut fleet.services[i];
    svc.vip = vip;
    svc.exists = true;
    svc.pending = false;
    fleet.acked(i, now());
}

/// A burst Service `i` deleted with its slices.
async fn delete_service(
    fleet: &Mutex<Fleet>,
    service_api: &Api<Service>,
    slice_api: &Api<EndpointSlice>,
    i: usize,
) {
    let (name, slices) = {
        let mut fleet = fleet.lock().unwrap();
        let svc = &mut fleet.services[i];
        svc.exists = false;
        svc.pending = true;
        (svc.name.clone(), svc.endpoints.len().div_ceil(1_000))
    };
    let params = kube::api::DeleteParams::default();
    persist(&name, || service_api.delete(&name, &params)).await;
    for j in 0..slices {
        let slice_name = if j == 0 {
            format!("{name}-fleet")
        } else {
            format!("{name}-fleet-{j}")
        };
        persist(&slice_name, || slice_api.delete(&slice_name, &params)).await;
    }
    let mut fleet = fleet.lock().unwrap();
    let svc = &mut fleet.services[i];
    svc.endpoints.clear();
    svc.pending = false;
    fleet.acked(i, now());
}

/// The process id a pid file names (0 when unreadable).
fn pid_file(path: &std::path::Path) -> u32 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or(0)
}

/// One line of the soak's resource samples: the agents' resident memory (median / max),
/// most open files, sockets, threads and runtime tasks of any agent; each controller's; the
/// API server's memory and its open watches.
/// The API server's `/metrics` text (empty when it does not answer within 10 s).
async fn api_metrics(client: &kube::Client) -> String {
    let request = client.request_text(http::Request::get("/metrics").body(Vec::new()).unwrap());
    tokio::time::timeout(Duration::from_secs(10), request)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default()
}

/// Writes to the node plans' and the Service plans' status so far, as the API server
/// counts them (`apiserver_request_total`).
async fn status_writes(client: &kube::Client) -> (f64, f64) {
    let text = api_metrics(client).await;
    let sum = |resource: &str| -> f64 {
        text.lines()
            .filter(|l| {
                l.starts_with("apiserver_request_total{")
                    && l.contains(&format!("resource=\"{resource}\""))
                    && l.contains("subresource=\"status\"")
                    && !l.contains("verb=\"GET\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    (sum("nodeproxyplans"), sum("serviceproxyplans"))
}

async fn sample_resources(
    agents: &[Arc<faults::Restartable>],
    agent_metrics: &[Arc<AgentMetrics>],
    controllers: &[Arc<faults::Restartable>],
    apiserver: u32,
    client: &kube::Client,
) -> String {
    let mut rss: Vec<f64> = Vec::new();
    let (mut fds, mut sockets, mut threads) = (0, 0, 0);
    for a in agents {
        let r = faults::resources(a.pid());
        rss.push(r.rss_kib as f64 / 1024.0);
        fds = fds.max(r.fds);
        sockets = sockets.max(r.sockets);
        threads = threads.max(r.threads);
    }
    let scrape: Vec<Arc<AgentMetrics>> = agent_metrics.to_vec();
    let tasks = tokio::task::spawn_blocking(move || {
        scrape
            .iter()
            .map(|m| m.value("proxyplan_agent_tokio_tasks"))
            .filter(|v| v.is_finite())
            .fold(f64::NAN, f64::max)
    })
    .await
    .unwrap_or(f64::NAN);
    let mut lines = Vec::new();
    for c in controllers {
        let r = faults::resources(c.pid());
        let pid = c.pid();
        let tasks = tokio::task::spawn_blocking(move || controller_tasks(pid))
            .await
            .unwrap_or(f64::NAN);
        lines.push(format!(
            "{} {:.0} MiB, {} files ({} sockets), {} threads, {tasks} tasks",
            c.label,
            r.rss_kib as f64 / 1024.0,
            r.fds,
            r.sockets,
            r.threads
        ));
    }
    let text = api_metrics(client).await;
    let watches: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_longrunning_requests{") && l.contains("verb=\"WATCH\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let watches = if text.is_empty() {
        "unknown (its /metrics did not answer within 10 s)".to_owned()
    } else {
        watches.to_string()
    };
    format!(
        "agents {:.0} / {:.0} MiB, at most {fds} files ({sockets} sockets), {threads} threads \
         and {tasks} tasks; {}; API server {:.0} MiB, {watches} watches",
        quantile(&mut rss.clone(), 0.5),
        quantile(&mut rss, 1.0),
        lines.join("; "),
        status_kib(apiserver, "VmRSS") as f64 / 1024.0
    )
}

/// A controller's `proxyplan_controller_tokio_tasks`, from whichever of its listening ports
/// serves metrics (the bench starts it on port 0).
fn controller_tasks(pid: u32) -> f64 {
    let Ok(out) = Command::new("ss").args(["-Hltnp"]).output() else {
        return f64::NAN;
    };
    let owner = format!("pid={pid},");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&owner))
        .filter_map(|l| l.split_whitespace().nth(3)?.parse::<SocketAddr>().ok())
        .map(|address| metric(&common::fetch(address), "proxyplan_controller_tokio_tasks"))
        .find(|v| v.is_finite())
        .unwrap_or(f64::NAN)
}

fn socket(ip: u32) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::from(ip), TARGET_PORT)
}

fn node_name(n: usize) -> String {
    format!("fleet-node-{n:04}")
}

/// One measured change: when the PATCH the API server took was sent, and for each node
/// that must show a new address, that address.
struct Change {
    service: usize,
    /// When the attempt the API server took left (the first attempt until one succeeds).
    sent: f64,
    /// How long before that the first attempt left: a soak's writes wait for the API
    /// server or etcd to come back, which is the outage's time, not the proxy's.
    waited: f64,
    /// (agent, address) pairs whose first appearance in that agent's kernel ends it.
    expected: Vec<(usize, u32)>,
}

/// First time each (agent, address) appeared in an `add` the agent's kernel announced.
type Seen = Arc<Mutex<HashMap<(usize, u32), f64>>>;

/// Listens to nf_tables' announcements in `netns` (its own netlink socket in the
/// `NFNLGRP_NFTABLES` group, as `nft monitor` does, without the agent's code), and records
/// the first time each pod address appears in a rule or set element a commit adds. A thread
/// of its own per namespace: `nft monitor` itself re-reads the table for the elements it
/// prints, which at 100 namespaces took more CPU than the agents.
fn monitor(netns: &str, agent: usize, seen: Seen) {
    use nix::sys::socket::{
        AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, setsockopt,
        socket, sockopt,
    };
    const NFNLGRP_NFTABLES: u32 = 7;
    const NFNL_SUBSYS_NFTABLES: u16 = 10;
    const NFT_MSG_NEWRULE: u16 = 6;
    const NFT_MSG_NEWSETELEM: u16 = 12;
    let path = format!("/run/netns/{netns}");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("netns");
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::empty(),
            SockProtocol::NetlinkNetFilter,
        )
        .expect("netlink socket");
        let _ = setsockopt(&fd, sockopt::RcvBufForce, &(16 << 20));
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &NetlinkAddr::new(0, 1 << (NFNLGRP_NFTABLES - 1)),
        )
        .expect("bind to NFNLGRP_NFTABLES");
        let _ = ready_tx.send(());
        let mut buffer = vec![0_u8; 1 << 20];
        loop {
            let Ok(n) = recv(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                &mut buffer,
                nix::sys::socket::MsgFlags::empty(),
            ) else {
                // ENOBUFS: announcements lost; a never-seen address will show it.
                continue;
            };
            let at = now();
            let mut found = Vec::new();
            let mut offset = 0;
            while offset + 16 <= n {
                let len =
                    u32::from_ne_bytes(buffer[offset..offset + 4].try_into().unwrap()) as usize;
                let kind = u16::from_ne_bytes(buffer[offset + 4..offset + 6].try_into().unwrap());
                if len < 16 || offset + len > n {
                    break;
                }
                let (subsys, message) = (kind >> 8, kind & 0xff);
                if subsys == NFNL_SUBSYS_NFTABLES
                    && (message == NFT_MSG_NEWRULE || message == NFT_MSG_NEWSETELEM)
                {
                    // A pod address is four bytes 10.128-255.x.y somewhere in the
                    // attributes (a DNAT's immediate, a map element's data, a chain name
                    // in text is not needed: the rule holds the address too).
                    for window in buffer[offset + 20..offset + len].windows(4) {
                        if window[0] == 10 && window[1] >= 128 {
                            found.push(u32::from_be_bytes(window.try_into().unwrap()));
                        }
                    }
                }
                offset += (len + 3) & !3;
            }
            if !found.is_empty() {
                let mut seen = seen.lock().unwrap();
                for ip in found {
                    seen.entry((agent, ip)).or_insert(at);
                }
            }
        }
    });
    let _ = ready_rx.recv_timeout(Duration::from_secs(5));
}

/// What the checker found.
#[derive(Default)]
struct Checked {
    /// Nodes a soak fault touches now (see `faults::Soak::disturbed`).
    disturbed: Arc<Mutex<HashMap<usize, usize>>>,
    /// Differences past `IN_FLIGHT` on a node a fault touched: counted by the fault's
    /// recovery time instead.
    behind_disturbed: usize,
    reads: usize,
    read_ms: Vec<f64>,
    /// Services compared, over all reads.
    compared: usize,
    /// Differences on Services written at least `IN_FLIGHT` before the read: a node
    /// behind by more than that.
    mismatches: Vec<String>,
    /// Differences in the last pass, once the churn has stopped and everything landed:
    /// a node whose kernel is wrong, not late.
    wrong_at_end: Vec<String>,
    /// Per (agent, Service) disagreement that ended: from the write to the read that agreed.
    episodes: Vec<f64>,
    open: HashMap<(usize, usize), f64>,
    /// The last difference seen per open (agent, Service), for a fault that does not
    /// settle (printed once it has waited a minute).
    open_why: HashMap<(usize, usize), String>,
    errors: Vec<String>,
}

/// What one read of a node found.
#[derive(Debug, Clone, Copy)]
struct NodeRead {
    /// Every Service agreed with its newest state.
    agreed: bool,
    /// Every Service not in flight agreed (in flight: a write not yet acknowledged, or
    /// acknowledged less than `IN_FLIGHT` before the read).
    settled: bool,
    /// For every Service the kernel held the state acknowledged last before `since` (a
    /// fault's lift) or a newer one: the node has nothing left from before that moment,
    /// whatever the churn wrote after it.
    caught_up: bool,
}

/// How the kernel's view of Service `svc` differs from its semantics on node `k` (empty:
/// it agrees).
fn differences(
    fleet: &Fleet,
    svc: &Svc,
    k: usize,
    view: &nft_model::TableView,
    live_vips: &std::collections::HashSet<Ipv4Addr>,
) -> Vec<String> {
    let mut differs = Vec::new();
    if svc.exists {
        let want = fleet.cluster_expected(svc, k);
        let got = view.services.get(&(svc.vip, Proto::Tcp, 80));
        if got != Some(&want) {
            differs.push(format!("cluster IP: kernel {got:?}, semantics {want:?}"));
        }
    } else if svc.vip != Ipv4Addr::UNSPECIFIED && !live_vips.contains(&svc.vip) {
        // Deleted (its address not given to another Service since): nothing there.
        if let Some(got) = view.services.get(&(svc.vip, Proto::Tcp, 80)) {
            differs.push(format!("deleted, the kernel still has {got:?}"));
        }
    }
    if svc.exists && svc.kind == Kind::Local {
        let want = if svc.external_local {
            fleet.local_expected(svc, k)
        } else {
            fleet.cluster_expected(svc, k)
        };
        let got = view.node_ports.get(&(Proto::Tcp, svc.node_port));
        if got != Some(&want) {
            differs.push(format!("node port: kernel {got:?}, semantics {want:?}"));
        }
    }
    differs
}

/// Reads agent `k`'s table and compares it with the fleet's semantics for that node
/// (see [`NodeRead`]; `since`: a fault's lift, for `caught_up`).
async fn check_node(
    k: usize,
    netns: &str,
    fleet: &Mutex<Fleet>,
    checked: &Mutex<Checked>,
    last_pass: bool,
    must_agree: Option<usize>,
    since: Option<f64>,
) -> NodeRead {
    let failed = NodeRead {
        agreed: false,
        settled: false,
        caught_up: false,
    };
    let started = now();
    let output = tokio::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            netns,
            "nft",
            "-j",
            "list",
            "table",
            "ip",
            "proxyplan",
        ])
        .output()
        .await;
    let read_at = now();
    let mut checked = checked.lock().unwrap();
    checked.reads += 1;
    checked.read_ms.push((read_at - started) * 1e3);
    let view = match output {
        Ok(out) if out.status.success() => {
            match nft_model::parse(&String::from_utf8_lossy(&out.stdout)) {
                Ok(view) => view,
                Err(e) => {
                    checked.errors.push(format!("node {k}: {e}"));
                    return failed;
                }
            }
        }
        Ok(out) => {
            checked.errors.push(format!(
                "node {k}: nft: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            return failed;
        }
        Err(e) => {
            checked.errors.push(format!("node {k}: nft: {e}"));
            return failed;
        }
    };
    let fleet = fleet.lock().unwrap();
    let disturbed = faults::Soak::is_disturbed(&checked.disturbed, k);
    let (mut all_agree, mut settled, mut caught_up) = (true, true, true);
    let live_vips: std::collections::HashSet<Ipv4Addr> = fleet
        .services
        .iter()
        .filter(|s| s.exists)
        .map(|s| s.vip)
        .collect();
    for (s, svc) in fleet.services.iter().enumerate() {
        let differs = differences(&fleet, svc, k, &view, &live_vips);
        checked.compared += 1;
        if differs.is_empty() {
            if let Some(since) = checked.open.remove(&(k, s)) {
                checked.episodes.push(read_at - since);
            }
            checked.open_why.remove(&(k, s));
            continue;
        }
        all_agree = false;
        // (A tampered Service must agree even while a write of it is in flight.)
        let in_flight = (svc.pending || started - svc.written < IN_FLIGHT) && must_agree != Some(s);
        settled &= in_flight;
        if let Some(since) = since
            && caught_up
        {
            // The state acknowledged last before `since`, and every later one.
            let states: Vec<&Svc> = fleet
                .history
                .get(s)
                .map(|h| {
                    let first = h.iter().rposition(|(at, _)| *at <= since).unwrap_or(0);
                    h.iter().skip(first).map(|(_, state)| state).collect()
                })
                .unwrap_or_default();
            caught_up = states
                .iter()
                .any(|state| differences(&fleet, state, k, &view, &live_vips).is_empty());
        }
        // The kernel is behind since this state was written (it agreed before, or this
        // episode started earlier).
        checked.open.entry((k, s)).or_insert(svc.written);
        checked.open_why.insert(
            (k, s),
            format!(
                "{} on {} (in flight {in_flight}, written {:.1} s before, pending {}): {}",
                svc.name,
                node_name(k),
                started - svc.written,
                svc.pending,
                differs.join("; ")
            ),
        );
        if last_pass {
            checked.wrong_at_end.push(format!(
                "{} on {}: {}",
                svc.name,
                node_name(k),
                differs.join("; ")
            ));
        } else if !in_flight && disturbed {
            checked.behind_disturbed += 1;
        } else if !in_flight {
            checked.mismatches.push(format!(
                "{} on {} at {started:.1} ({:.1} s after its write): {}",
                svc.name,
                node_name(k),
                started - svc.written,
                differs.join("; ")
            ));
        }
    }
    NodeRead {
        agreed: all_agree,
        settled,
        caught_up,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("fleet bench: run with cargo bench (it needs root and 15 minutes)");
        return;
    }
    // The checker, the faults and the probes run these; without them the run would go on
    // and measure nothing (a fresh machine: `bash tests/setup.sh` installs them).
    for tool in ["nft", "ip"] {
        let found = std::process::Command::new(tool)
            .arg("--version")
            .output()
            .is_ok();
        assert!(
            found,
            "fleet bench: `{tool}` is not installed (bash tests/setup.sh installs what the \
             benches need)"
        );
    }
    let proxy: String = env_or("FLEET_PROXY", "proxyplan".to_owned());
    let kube_proxy = match proxy.as_str() {
        "proxyplan" => false,
        "kube-proxy" => true,
        other => panic!("FLEET_PROXY={other}: proxyplan or kube-proxy"),
    };
    let agents: usize = env_or("FLEET_AGENTS", 100);
    let nodes: usize = env_or("FLEET_NODES", 5_000).max(agents);
    let watchers: usize = env_or("FLEET_WATCHERS", nodes - agents);
    let services: usize = env_or("FLEET_SERVICES", 1_000);
    let replicas: usize = env_or("FLEET_ENDPOINTS", 10);
    let zones: usize = env_or("FLEET_ZONES", 50);
    let local_fraction: f64 = env_or("FLEET_LOCAL", 0.05);
    let hinted_fraction: f64 = env_or("FLEET_HINTED", 0.1);
    let seconds: u64 = env_or("FLEET_SECONDS", 600);
    let rate: f64 = env_or("FLEET_RATE", 20.0);
    let burst_every: u64 = env_or("FLEET_BURST_EVERY", 120);
    let burst_pods: usize = env_or("FLEET_BURST_PODS", 500);
    let check_gap = Duration::from_millis(env_or("FLEET_CHECK_GAP_MS", 250));
    let seed: u64 = env_or("FLEET_SEED", 1);
    let agent_log: String = env_or("FLEET_AGENT_LOG", "warn".to_owned());
    let controller_log: String = env_or("FLEET_CONTROLLER_LOG", "warn".to_owned());
    let fault_every: f64 = env_or("FLEET_FAULTS", 0.0);
    let soak = fault_every > 0.0;
    assert!(
        !(soak && kube_proxy),
        "FLEET_FAULTS: the soak runs proxyplan"
    );
    let probe_nodes: usize = env_or("FLEET_PROBES", if soak { 4 } else { 0 }).min(agents);
    let stable_services = if soak { STABLE.len() } else { 0 };
    let bins = Bins::locate().expect("binaries: cargo build --release --bins");
    // Thousands of watches: one socket each.
    let _ =
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 65_536, 65_536);
    println!(
        "fleet bench: {proxy}, {agents} nodes running it + {watchers} Service-plan watchers, \
         {nodes} Node objects in {zones} zones, {services} Services x {replicas} endpoints"
    );

    let workdir = std::env::temp_dir().join(format!("proxyplan-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&workdir).unwrap();
    let (plane, client, apiserver_pid) = start_plane(&workdir, NS).await;
    let plane = Arc::new(plane);
    // Nodes.
    let started = Instant::now();
    let node_api: Api<Node> = Api::all(client.clone());
    stream::iter(0..nodes)
        .map(|n| {
            let node_api = node_api.clone();
            async move {
                let node: Node = serde_json::from_value(json!({
                    "metadata": {"name": node_name(n),
                                 "labels": {"topology.kubernetes.io/zone": format!("zone-{}", n % zones)}},
                    "spec": {"podCIDRs": [format!("10.{}.{}.0/24", 128 + n / 256, n % 256)]}
                }))
                .unwrap();
                node_api.create(&PostParams::default(), &node).await.unwrap();
                // An address, as a kubelet reports it: kube-proxy waits 30 s for one.
                if n < agents {
                    node_api
                        .patch_status(
                            &node_name(n),
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": {"addresses": [
                                {"type": "InternalIP", "address": format!("192.168.{}.{}", n / 250, n % 250 + 1)}
                            ]}})),
                        )
                        .await
                        .unwrap();
                }
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;

    // Services and their slices.
    let mut fleet = Fleet {
        services: Vec::with_capacity(services),
        zones,
        agents,
        nodes,
        replicas,
        next_ip: FIRST_POD,
        rng: Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
        soak,
        history: Vec::new(),
    };
    let service_api: Api<Service> = Api::namespaced(client.clone(), NS);
    let slice_api: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let mut specs = Vec::new();
    for i in 0..services {
        let kind = if (i as f64) < local_fraction * services as f64 {
            Kind::Local
        } else if (i as f64) < (local_fraction + hinted_fraction) * services as f64 {
            Kind::Hinted
        } else {
            Kind::Plain
        };
        let stable = i >= services - stable_services;
        let endpoints = if stable {
            // Real backends: every probe node serves these addresses (faults::serve).
            STABLE
                .iter()
                .enumerate()
                .map(|(e, ip)| Endpoint {
                    ip: u32::from(*ip),
                    node: e % agents,
                    ready: true,
                    terminating: false,
                })
                .collect()
        } else {
            (0..replicas).map(|_| fleet.new_endpoint()).collect()
        };
        fleet.services.push(Svc {
            name: format!("svc-{i:05}"),
            kind,
            vip: Ipv4Addr::UNSPECIFIED,
            node_port: 0,
            endpoints,
            written: now(),
            busy: false,
            pending: false,
            stable,
            external_local: kind == Kind::Local,
            hints: kind == Kind::Hinted,
            exists: true,
        });
        let mut spec = json!({"ports": [{"name": "http", "port": 80, "targetPort": TARGET_PORT}]});
        match kind {
            Kind::Local => {
                spec["type"] = json!("NodePort");
                spec["externalTrafficPolicy"] = json!("Local");
            }
            Kind::Hinted => spec["trafficDistribution"] = json!("PreferClose"),
            Kind::Plain => {}
        }
        specs.push((i, spec, fleet.slice_endpoints(i)));
    }
    let created: Vec<(usize, Ipv4Addr, u16)> = stream::iter(specs)
        .map(|(i, spec, endpoints)| {
            let (service_api, slice_api) = (service_api.clone(), slice_api.clone());
            async move {
                let svc: Service = serde_json::from_value(json!({
                    "metadata": {"name": format!("svc-{i:05}"), "namespace": NS},
                    "spec": spec
                }))
                .unwrap();
                let svc = service_api.create(&PostParams::default(), &svc).await.unwrap();
                let spec = svc.spec.unwrap_or_default();
                let vip: Ipv4Addr = spec.cluster_ip.unwrap_or_default().parse().unwrap();
                let node_port = spec
                    .ports
                    .unwrap_or_default()
                    .first()
                    .and_then(|p| p.node_port)
                    .unwrap_or(0) as u16;
                let slice: EndpointSlice = serde_json::from_value(json!({
                    "metadata": {"name": format!("svc-{i:05}-fleet"), "namespace": NS,
                                 "labels": {"kubernetes.io/service-name": format!("svc-{i:05}"),
                                            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
                    "addressType": "IPv4",
                    "ports": [{"name": "http", "port": TARGET_PORT, "protocol": "TCP"}],
                    "endpoints": endpoints
                }))
                .unwrap();
                slice_api.create(&PostParams::default(), &slice).await.unwrap();
                (i, vip, node_port)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    for (i, vip, node_port) in created {
        fleet.services[i].vip = vip;
        fleet.services[i].node_port = node_port;
    }
    // A soak's bursts of Services: created all at once, deleted all at once later; the
    // first of them has `big` endpoints (in slices of 1,000).
    let burst_services: usize = env_or("FLEET_SERVICE_BURST", if soak { 1_000 } else { 0 });
    let big: usize = env_or("FLEET_BIG", if soak { 6_000 } else { 0 });
    for b in 0..burst_services {
        fleet.services.push(Svc {
            name: format!("svc-{:05}", services + b),
            kind: Kind::Plain,
            vip: Ipv4Addr::UNSPECIFIED,
            node_port: 0,
            endpoints: Vec::new(),
            written: now(),
            // Owned by the burst: the other writers leave it alone.
            busy: true,
            pending: false,
            stable: false,
            external_local: false,
            hints: false,
            exists: false,
        });
    }
    println!(
        "fleet bench: {nodes} Nodes, {services} Services and slices written in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The controller (proxyplan only).
    let plans_path = "/apis/proxyplan.dev/v1alpha1/serviceproxyplans";
    let managed = "labelSelector=app.kubernetes.io%2Fmanaged-by%3Dproxyplan-controller";
    let mut controllers: Vec<Arc<faults::Restartable>> = Vec::new();
    let mut controller_wrote_all = Duration::ZERO;
    let mut startup_list = (0, 0);
    if !kube_proxy {
        let started = Instant::now();
        // Two replicas in the soak, so that one takes over when the leader goes.
        let identities: &[&str] = if soak {
            &["fleet-a", "fleet-b"]
        } else {
            &["fleet"]
        };
        for identity in identities {
            let (binary, kubeconfig, log, controller_log) = (
                bins.controller.clone(),
                plane.kubeconfig(),
                workdir.join(format!("controller-{identity}.log")),
                controller_log.clone(),
            );
            let identity = (*identity).to_owned();
            controllers.push(Arc::new(faults::Restartable::start(
                identity.clone(),
                Box::new(move || {
                    (
                        controller_command(
                            &binary,
                            &kubeconfig,
                            NS,
                            &identity,
                            CLUSTER_CIDR,
                            &controller_log,
                        ),
                        log.clone(),
                    )
                }),
            )));
        }
        let node_plans = "/apis/proxyplan.dev/v1alpha1/nodeproxyplans";
        loop {
            if count(&client, plans_path, "").await >= services
                && count(&client, node_plans, "").await >= nodes
            {
                break;
            }
            for c in &controllers {
                if let Some(why) = c.died() {
                    panic!("{why}");
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(1800),
                "the controller never wrote every plan"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        controller_wrote_all = started.elapsed();
        startup_list = list_bytes(&client, plans_path, managed).await;
        println!(
            "fleet bench: the controller wrote every plan in {:.1} s",
            controller_wrote_all.as_secs_f64()
        );
    }

    // The watchers standing in for the other nodes.
    let watched = Arc::new(AtomicU64::new(0));
    let reopened = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    for w in 0..watchers {
        let (path, query) = if kube_proxy {
            (
                "/apis/discovery.k8s.io/v1/endpointslices",
                "labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name",
            )
        } else {
            (plans_path, managed)
        };
        let (client, sink, reopened) = (
            client.clone(),
            Sink::Bytes(watched.clone()),
            reopened.clone(),
        );
        // A watch the API server closes (a slow reader's is) is opened again, as an
        // agent's would be; how often is reported.
        tokio::spawn(async move {
            loop {
                raw_watch(client.clone(), path.into(), query.into(), sink.clone()).await;
                reopened.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        if w % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!(
        "fleet bench: {watchers} watchers open in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The fleet: a namespace, a forwarder to the API server and a proxy per node.
    let kube_proxy_bin = workdir.join("kube-proxy");
    if kube_proxy {
        let archive = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/k8s/kube-proxy-v1.36.2.xz");
        let out = Command::new("xz")
            .arg("-dc")
            .arg(&archive)
            .output()
            .expect("xz");
        assert!(out.status.success(), "xz -dc {}", archive.display());
        std::fs::write(&kube_proxy_bin, out.stdout).unwrap();
        procs::run("chmod", &["+x", kube_proxy_bin.to_str().unwrap()]).unwrap();
    }
    let local: SocketAddr = API_IN_NETNS.parse().unwrap();
    let original = kube::config::Kubeconfig::read_from(plane.kubeconfig()).unwrap();
    let (config, api) = kubeconfig::for_agents(original, local).unwrap();
    let node_kubeconfig = workdir.join("node-kubeconfig.json");
    std::fs::write(&node_kubeconfig, serde_json::to_string(&config).unwrap()).unwrap();
    let kube_proxy_config = workdir.join("kube-proxy.yaml");
    std::fs::write(
        &kube_proxy_config,
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
             mode: nftables\nclusterCIDR: {CLUSTER_CIDR}\nclientConnection:\n  kubeconfig: {}\n\
             conntrack:\n  maxPerCore: 0\nmetricsBindAddress: 127.0.0.1:10249\n\
             healthzBindAddress: 127.0.0.1:10256\n",
            node_kubeconfig.display()
        ),
    )
    .unwrap();
    let seen: Seen = Arc::default();
    let mut netnses = Vec::new();
    let mut forwarders = Vec::new();
    let mut proxies: Vec<Arc<faults::Restartable>> = Vec::new();
    let mut state_dirs = Vec::new();
    let mut clocks = Vec::new();
    let mut metrics = Vec::new();
    let first_sync = Arc::new(Mutex::new(vec![f64::NAN; agents]));
    let started = Instant::now();
    for k in 0..agents {
        let netns = format!("ppf-{}-{k}", std::process::id());
        procs::run("ip", &["netns", "add", &netns]).unwrap();
        procs::run(
            "ip",
            &["netns", "exec", &netns, "ip", "link", "set", "lo", "up"],
        )
        .unwrap();
        let socket = workdir.join(format!("api-{k}.sock"));
        forward::unix_to_tcp(&socket, api.host.clone(), api.port).unwrap();
        forwarders.push(
            procs::start_forwarder(&netns, local, &socket, workdir.join(format!("fwd-{k}.log")))
                .await
                .unwrap(),
        );
        monitor(&netns, k, seen.clone());
        let (netns_, agent_bin, kube_proxy_bin, kube_proxy_config, node_kubeconfig, log) = (
            netns.clone(),
            bins.agent.clone(),
            kube_proxy_bin.clone(),
            kube_proxy_config.clone(),
            node_kubeconfig.clone(),
            workdir.join(format!("proxy-{k}.log")),
        );
        let (state_dir, agent_log) = (workdir.join(format!("state-{k}")), agent_log.clone());
        state_dirs.push(state_dir.clone());
        // A soak's agents run under libfaketime, at true time until a `clock-step`.
        let clock = (soak && !kube_proxy && std::path::Path::new(faults::LIBFAKETIME).exists())
            .then(|| workdir.join(format!("clock-{k}")));
        if let Some(clock) = &clock {
            faults::set_clock(clock, "+0");
            clocks.push(clock.clone());
        }
        let command = move || {
            let command = if kube_proxy {
                let mut command = Command::new("ip");
                command
                    .args(["netns", "exec", &netns_])
                    .arg(&kube_proxy_bin)
                    .arg("--config")
                    .arg(&kube_proxy_config)
                    .args(["--hostname-override", &node_name(k), "--v", "0"]);
                command
            } else {
                let mut command = common::agent_command(
                    &agent_bin,
                    &netns_,
                    &node_name(k),
                    &["--mode", "nftables"],
                    &node_kubeconfig,
                    &state_dir,
                    &agent_log,
                );
                if let Some(clock) = &clock {
                    faults::with_clock(&mut command, clock);
                }
                command
            };
            (command, log.clone())
        };
        let start = Instant::now();
        proxies.push(Arc::new(faults::Restartable::start(
            format!("{proxy} {k}"),
            Box::new(command),
        )));
        let node_metrics = Arc::new(AgentMetrics::new(
            &netns,
            "127.0.0.1:10249".parse().unwrap(),
        ));
        let (poller, first_sync) = (node_metrics.clone(), first_sync.clone());
        tokio::task::spawn_blocking(move || {
            while start.elapsed() < Duration::from_secs(1800) {
                let text = poller.get();
                if metric(&text, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") > 0.0 {
                    first_sync.lock().unwrap()[k] = start.elapsed().as_secs_f64();
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        metrics.push(node_metrics);
        netnses.push(netns);
    }
    // Every node's first sync, from its own start (the pollers began with each start).
    loop {
        for p in &proxies {
            if let Some(why) = p.died() {
                panic!("{why}");
            }
        }
        if first_sync.lock().unwrap().iter().all(|t| !t.is_nan()) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "not every node synced"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first_sync: Vec<f64> = first_sync.lock().unwrap().clone();
    let fleet_synced = started.elapsed();
    println!(
        "fleet bench: every node's first sync done {:.1} s after the first started (they start one after another)",
        fleet_synced.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;

    // When each Service's plan reaches a watcher like the agents' (proxyplan): splits a
    // change's latency into the controller's part and the nodes' part.
    let plan_arrivals: Arc<Mutex<HashMap<usize, Vec<f64>>>> = Arc::default();
    if !kube_proxy {
        let arrivals = plan_arrivals.clone();
        let on_line: common::OnLine = Arc::new(move |at, line| {
            let Ok(event) = serde_json::from_slice::<serde_json::Value>(line) else {
                return;
            };
            let name = event["object"]["metadata"]["name"]
                .as_str()
                .unwrap_or_default();
            if let Some(s) = name
                .rsplit("svc-")
                .next()
                .and_then(|n| n.get(..5))
                .and_then(|n| n.parse::<usize>().ok())
            {
                arrivals.lock().unwrap().entry(s).or_default().push(at);
            }
        });
        let client = client.clone();
        tokio::spawn(async move {
            loop {
                raw_watch(
                    client.clone(),
                    plans_path.into(),
                    managed.into(),
                    Sink::Lines(on_line.clone()),
                )
                .await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // Churn, the checker, and the measurements around them.
    for i in 0..fleet.services.len() {
        let written = fleet.services[i].written;
        fleet.acked(i, written);
    }
    let fleet = Arc::new(Mutex::new(fleet));
    let changes: Arc<Mutex<Vec<Change>>> = Arc::default();
    let writes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let checked: Arc<Mutex<Checked>> = Arc::default();

    // The soak's probes: on each probe node a pod (a namespace of its own behind a veth
    // pair, in the cluster CIDR) opens connections to the stable Services, whose endpoint
    // addresses sit on the node's `lo` with a listener behind them.
    let probes: Arc<Mutex<faults::Probes>> = Arc::default();
    let probes_stop = Arc::new(AtomicBool::new(false));
    let mut probe_threads = Vec::new();
    let mut pod_netnses = Vec::new();
    let stable_targets: Vec<(String, Ipv4Addr)> = fleet
        .lock()
        .unwrap()
        .services
        .iter()
        .filter(|s| s.stable)
        .map(|s| (s.name.clone(), s.vip))
        .collect();
    for (k, node) in netnses.iter().enumerate().take(probe_nodes) {
        let pod = format!("ppp-{}-{k}", std::process::id());
        let in_node = |args: &[&str]| {
            let mut all = vec!["netns", "exec", node.as_str()];
            all.extend_from_slice(args);
            procs::run("ip", &all).unwrap();
        };
        for ip in STABLE {
            in_node(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "lo"]);
        }
        in_node(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        procs::run("ip", &["netns", "add", &pod]).unwrap();
        let (host_side, pod_side) = (format!("pvh{k}"), format!("pvp{k}"));
        procs::run(
            "ip",
            &[
                "link", "add", &host_side, "netns", node, "type", "veth", "peer", "name",
                &pod_side, "netns", &pod,
            ],
        )
        .unwrap();
        in_node(&[
            "ip",
            "addr",
            "add",
            &format!("10.254.{k}.1/24"),
            "dev",
            &host_side,
        ]);
        in_node(&["ip", "link", "set", &host_side, "up"]);
        for args in [
            vec!["ip", "link", "set", "lo", "up"],
            vec![
                "ip",
                "addr",
                "add",
                &format!("10.254.{k}.2/24"),
                "dev",
                &pod_side,
            ],
            vec!["ip", "link", "set", &pod_side, "up"],
            vec![
                "ip",
                "route",
                "add",
                "default",
                "via",
                &format!("10.254.{k}.1"),
            ],
        ] {
            let mut all = vec!["netns", "exec", pod.as_str()];
            all.extend_from_slice(&args);
            procs::run("ip", &all).unwrap();
        }
        faults::serve(node, TARGET_PORT);
        probe_threads.push(faults::probe(
            &pod,
            k,
            stable_targets.clone(),
            probes.clone(),
            probes_stop.clone(),
        ));
        pod_netnses.push(pod);
    }
    // CPU over the churn, of the processes running at its start (a soak restarts some:
    // its resource samples say more).
    let proxy_pids: Vec<u32> = proxies.iter().map(|p| p.pid()).collect();
    let controller_pids: Vec<u32> = controllers.iter().map(|c| c.pid()).collect();
    let cpu = |pids: &[u32]| pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>();
    let own_pid = std::process::id();
    let own_before = cpu_seconds(own_pid);
    let cpu_before = (
        cpu_seconds(apiserver_pid),
        cpu(&controller_pids),
        cpu(&proxy_pids),
    );
    let watched_before = watched.load(Ordering::Relaxed);
    let status_writes_before = status_writes(&client).await;

    // One slice write: the state first (so the checker never expects less than was sent),
    // then the PATCH.
    let write = {
        let (fleet, changes, writes, slice_api) = (
            fleet.clone(),
            changes.clone(),
            writes.clone(),
            slice_api.clone(),
        );
        move |s: usize, fresh: Vec<u32>, endpoints: serde_json::Value| {
            let (fleet, changes, writes, slice_api) = (
                fleet.clone(),
                changes.clone(),
                writes.clone(),
                slice_api.clone(),
            );
            async move {
                let mut change = None;
                if !fresh.is_empty() {
                    let fleet = fleet.lock().unwrap();
                    let svc = &fleet.services[s];
                    let mut expected = Vec::new();
                    for k in 0..fleet.agents {
                        if let Verdict::Endpoints(set) = fleet.cluster_expected(svc, k) {
                            for ip in &fresh {
                                if set.contains(&socket(*ip)) {
                                    expected.push((k, *ip));
                                }
                            }
                        }
                    }
                    // From the moment the PATCH leaves (a burst's writes queue before).
                    let mut changes = changes.lock().unwrap();
                    change = Some(changes.len());
                    changes.push(Change {
                        service: s,
                        sent: now(),
                        waited: 0.0,
                        expected,
                    });
                }
                // A keep-alive connection the server closed fails a request now and then
                // (IncompleteMessage): sent again, as a controller would; in a soak, for
                // as long as the API server is away.
                let patch = Patch::Merge(json!({"endpoints": endpoints}));
                let attempts = if soak { 1_200 } else { 5 };
                for attempt in 1.. {
                    let left = now();
                    match slice_api
                        .patch(
                            &format!("svc-{s:05}-fleet"),
                            &PatchParams::default(),
                            &patch,
                        )
                        .await
                    {
                        Ok(_) => {
                            if let Some(c) = change.filter(|_| attempt > 1) {
                                let change = &mut changes.lock().unwrap()[c];
                                change.waited = left - change.sent;
                                change.sent = left;
                            }
                            break;
                        }
                        Err(e) if attempt < attempts => {
                            if !soak {
                                println!("fleet bench: slice write failed, sent again: {e}");
                            }
                            tokio::time::sleep(Duration::from_millis(if soak { 500 } else { 50 }))
                                .await;
                        }
                        Err(e) => panic!("writing svc-{s:05}-fleet: {e}"),
                    }
                }
                {
                    let mut fleet = fleet.lock().unwrap();
                    fleet.services[s].pending = false;
                    fleet.acked(s, now());
                }
                writes.fetch_add(1, Ordering::Relaxed);
            }
        }
    };

    let churn_started = Instant::now();
    let steady = {
        let (fleet, stop, write) = (fleet.clone(), stop.clone(), write.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut in_flight = tokio::task::JoinSet::new();
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                while in_flight.try_join_next().is_some() {}
                // While the API server is away writes wait, as many writers' would; past
                // five seconds' worth the writers wait too.
                if in_flight.len() as f64 >= rate * 5.0 {
                    continue;
                }
                let (s, fresh, endpoints) = {
                    let mut fleet = fleet.lock().unwrap();
                    let n = fleet.services.len();
                    let mut free = None;
                    for _ in 0..1_000 {
                        let s = fleet.rng.below(n);
                        if !fleet.services[s].busy && !fleet.services[s].stable {
                            free = Some(s);
                            break;
                        }
                    }
                    let Some(s) = free else {
                        continue;
                    };
                    let sent = now();
                    let fresh = fleet.roll(s);
                    fleet.services[s].written = sent;
                    fleet.services[s].busy = true;
                    fleet.services[s].pending = true;
                    (s, fresh, fleet.slice_endpoints(s))
                };
                // Writes go out at the rate whatever each one takes, as many writers'
                // would; one Service has one write in flight at most.
                let (fleet, write) = (fleet.clone(), write.clone());
                in_flight.spawn(async move {
                    write(s, fresh, endpoints).await;
                    fleet.lock().unwrap().services[s].busy = false;
                });
                while in_flight.try_join_next().is_some() {}
            }
            while in_flight.join_next().await.is_some() {}
        })
    };
    // Set while a burst writes: the churn's end waits for it, since a burst stopped
    // half-way leaves the bench's model of the slices ahead of the API server's.
    let bursting = Arc::new(AtomicBool::new(false));
    let bursts = {
        let (fleet, stop, write) = (fleet.clone(), stop.clone(), write.clone());
        let bursting = bursting.clone();
        tokio::spawn(async move {
            let mut count = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(burst_every)).await;
                // Marked before the stop is read: the end either sees it or stops it.
                bursting.store(true, Ordering::SeqCst);
                if stop.load(Ordering::SeqCst) {
                    bursting.store(false, Ordering::SeqCst);
                    return count;
                }
                count += 1;
                // A rollout of `burst_pods` pods: that many Services' Deployments replaced
                // at once, then their old pods gone two seconds later.
                let chosen: Vec<usize> = {
                    let mut fleet = fleet.lock().unwrap();
                    let n = fleet.services.len();
                    let wanted = (burst_pods / fleet.replicas.max(1)).clamp(1, n / 2);
                    let mut chosen = BTreeSet::new();
                    // (Fewer when most Services have a write waiting for the API server.)
                    for _ in 0..wanted * 100 {
                        if chosen.len() == wanted {
                            break;
                        }
                        let s = fleet.rng.below(n);
                        // Not one the steady writer is writing.
                        if fleet.services[s].busy || fleet.services[s].stable {
                            continue;
                        }
                        if fleet.services[s].kind != Kind::Local || chosen.len() % 10 == 0 {
                            chosen.insert(s);
                        }
                    }
                    for s in &chosen {
                        fleet.services[*s].busy = true;
                    }
                    chosen.into_iter().collect()
                };
                for phase in 0..2 {
                    let writes: Vec<_> = {
                        let mut fleet = fleet.lock().unwrap();
                        chosen
                            .iter()
                            .map(|s| {
                                let sent = now();
                                let fresh = if phase == 0 {
                                    fleet.replace_all(*s)
                                } else {
                                    fleet.services[*s].endpoints.retain(|e| e.ready);
                                    Vec::new()
                                };
                                fleet.services[*s].written = sent;
                                fleet.services[*s].pending = true;
                                (*s, fresh, fleet.slice_endpoints(*s))
                            })
                            .collect()
                    };
                    stream::iter(writes)
                        .map(|(s, fresh, endpoints)| write(s, fresh, endpoints))
                        .buffer_unordered(16)
                        .collect::<Vec<()>>()
                        .await;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                let mut fleet = fleet.lock().unwrap();
                for s in &chosen {
                    fleet.services[*s].busy = false;
                }
                bursting.store(false, Ordering::SeqCst);
            }
        })
    };
    // A soak's other churn: every 20 s a Local NodePort flips to Cluster policy (or back);
    // every 60 s a hundred Nodes without an agent are deleted, and added again 10 s later.
    let soak_churn = soak.then(|| {
        let (fleet, stop, service_api, node_api) = (
            fleet.clone(),
            stop.clone(),
            service_api.clone(),
            node_api.clone(),
        );
        tokio::spawn(async move {
            let mut round = 0_u64;
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_secs(20)).await;
                round += 1;
                let flip = {
                    let mut fleet = fleet.lock().unwrap();
                    let candidates: Vec<usize> = (0..fleet.services.len())
                        .filter(|s| {
                            let svc = &fleet.services[*s];
                            svc.kind == Kind::Local && !svc.busy
                        })
                        .collect();
                    if candidates.is_empty() {
                        None
                    } else {
                        let s = candidates[fleet.rng.below(candidates.len())];
                        let svc = &mut fleet.services[s];
                        svc.external_local = !svc.external_local;
                        svc.busy = true;
                        svc.pending = true;
                        Some((s, svc.name.clone(), svc.external_local))
                    }
                };
                if let Some((s, name, local)) = flip {
                    let patch = Patch::Merge(json!({"spec": {
                        "externalTrafficPolicy": if local { "Local" } else { "Cluster" }
                    }}));
                    while service_api
                        .patch(&name, &PatchParams::default(), &patch)
                        .await
                        .is_err()
                    {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    let mut fleet = fleet.lock().unwrap();
                    let svc = &mut fleet.services[s];
                    svc.busy = false;
                    svc.pending = false;
                    fleet.acked(s, now());
                }
                if round.is_multiple_of(3) {
                    let (agents, nodes, zones) = {
                        let fleet = fleet.lock().unwrap();
                        (fleet.agents, fleet.nodes, fleet.zones)
                    };
                    let first = agents + (round as usize / 3 * 100) % (nodes - agents).max(1);
                    let gone: Vec<usize> = (first..nodes).take(100).collect();
                    for n in &gone {
                        let _ = node_api
                            .delete(&node_name(*n), &kube::api::DeleteParams::default())
                            .await;
                    }
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    for n in gone {
                        let node: Node = serde_json::from_value(json!({
                            "metadata": {"name": node_name(n),
                                         "labels": {"topology.kubernetes.io/zone": format!("zone-{}", n % zones)}},
                            "spec": {"podCIDRs": [format!("10.{}.{}.0/24", 128 + n / 256, n % 256)]}
                        }))
                        .unwrap();
                        for _ in 0..120 {
                            match node_api.create(&PostParams::default(), &node).await {
                                Ok(_) => break,
                                Err(kube::Error::Api(e)) if e.code == 409 => break,
                                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                            }
                        }
                    }
                }
            }
        })
    });
    // The soak's Service bursts, every `FLEET_SERVICE_BURST_EVERY` seconds (300): the
    // Services and their slices created 16 at a time, then deleted two minutes later.
    let service_bursts = (burst_services > 0).then(|| {
        let (fleet, stop, service_api, slice_api) = (
            fleet.clone(),
            stop.clone(),
            service_api.clone(),
            slice_api.clone(),
        );
        let every: u64 = env_or("FLEET_SERVICE_BURST_EVERY", 300);
        tokio::spawn(async move {
            let indices: Vec<usize> = (services..services + burst_services).collect();
            loop {
                for _ in 0..every.saturating_sub(120) {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                }
                println!("fleet bench: {burst_services} Services created");
                stream::iter(indices.clone())
                    .map(|i| {
                        let count = if i == services && big > 0 {
                            big
                        } else {
                            replicas
                        };
                        create_service(&fleet, &service_api, &slice_api, i, count)
                    })
                    .buffer_unordered(16)
                    .collect::<Vec<()>>()
                    .await;
                for _ in 0..120 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                println!("fleet bench: {burst_services} Services deleted");
                stream::iter(indices.clone())
                    .map(|i| delete_service(&fleet, &service_api, &slice_api, i))
                    .buffer_unordered(16)
                    .collect::<Vec<()>>()
                    .await;
                if stop.load(Ordering::Relaxed) {
                    return;
                }
            }
        })
    });
    let checker = (!kube_proxy).then(|| {
        let (fleet, stop, checked, netnses) = (
            fleet.clone(),
            stop.clone(),
            checked.clone(),
            netnses.clone(),
        );
        tokio::spawn(async move {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                for (k, netns) in netnses.iter().enumerate() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    // A node that disagrees is read again until it agrees (a change in
                    // flight lands within the second; anything longer is reported).
                    for _ in 0..20 {
                        if check_node(k, netns, &fleet, &checked, false, None, None)
                            .await
                            .agreed
                        {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    tokio::time::sleep(check_gap).await;
                }
                rounds += 1;
            }
            rounds
        })
    });
    // The soak's faults: one about every `fault_every` seconds (exponential gaps), each in
    // a task of its own, so that they overlap.
    let soak_state = soak.then(|| {
        Arc::new(faults::Soak {
            agents: proxies.clone(),
            controllers: controllers.clone(),
            netnses: netnses.clone(),
            state_dirs: state_dirs.clone(),
            clocks: clocks.clone(),
            plane: plane.clone(),
            client: client.clone(),
            namespace: NS.to_owned(),
            fleet: fleet.clone(),
            checked: checked.clone(),
            disturbed: checked.lock().unwrap().disturbed.clone(),
            log: Mutex::default(),
            node_locks: (0..agents).map(|_| tokio::sync::Mutex::new(())).collect(),
            controller_lock: tokio::sync::Mutex::new(()),
            plane_lock: tokio::sync::Mutex::new(()),
        })
    });
    // `FLEET_FAULT_KINDS`: only these (comma-separated), for a look at one kind.
    let only: String = env_or("FLEET_FAULT_KINDS", String::new());
    let kinds: Vec<&'static str> = faults::KINDS
        .into_iter()
        .filter(|k| only.is_empty() || only.split(',').any(|o| o.trim() == *k))
        .filter(|k| *k != "clock-step" || !clocks.is_empty())
        .collect();
    if soak && clocks.is_empty() {
        println!(
            "fleet bench: SKIPPED clock-step faults: {} is missing (apt-get install faketime, or bash tests/setup.sh)",
            faults::LIBFAKETIME
        );
    }
    assert!(
        !kinds.is_empty(),
        "FLEET_FAULT_KINDS={only}: none of {:?}",
        faults::KINDS
    );
    let fault_task = soak_state.clone().map(|soak| {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut rng = Rng(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
            let mut running = tokio::task::JoinSet::new();
            loop {
                let u = (rng.below(1_000_000) as f64 + 1.0) / 1e6;
                let gap = (-u.ln() * fault_every).clamp(1.0, 4.0 * fault_every);
                tokio::time::sleep(Duration::from_secs_f64(gap)).await;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let kind = kinds[rng.below(kinds.len())];
                running.spawn(soak.clone().inject(kind, rng.next()));
                while let Some(done) = running.try_join_next() {
                    done.expect("a fault's task");
                }
            }
            // Every fault lifted and followed to its end.
            while let Some(done) = running.join_next().await {
                done.expect("a fault's task");
            }
        })
    });
    if soak {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let p = probes.lock().unwrap();
        assert!(
            p.attempts > 0 && p.failures.is_empty(),
            "the probes fail before any fault: {:?}",
            p.failures.first()
        );
    }

    // Progress every 10 s; in a soak, the processes' resources every minute.
    let mut apiserver_rss_peak = 0;
    let mut samples: Vec<String> = Vec::new();
    while churn_started.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let apiserver_now = pid_file(&plane.dir().join("kube-apiserver.pid"));
        apiserver_rss_peak = apiserver_rss_peak.max(status_kib(apiserver_now, "VmRSS"));
        for p in proxies.iter().chain(&controllers) {
            if let Some(why) = p.died() {
                panic!("{why}");
            }
        }
        let done = changes.lock().unwrap().len();
        println!(
            "fleet bench: {:.0} s of churn, {} writes, {done} changes with new endpoints",
            churn_started.elapsed().as_secs_f64(),
            writes.load(Ordering::Relaxed)
        );
        if soak && samples.len() < (churn_started.elapsed().as_secs() / 60) as usize {
            let line =
                sample_resources(&proxies, &metrics, &controllers, apiserver_now, &client).await;
            println!("fleet bench: minute {}: {line}", samples.len() + 1);
            samples.push(line);
        }
    }
    stop.store(true, Ordering::SeqCst);
    let _ = steady.await;
    if let Some(task) = soak_churn {
        let _ = task.await;
    }
    if let Some(task) = service_bursts {
        let _ = task.await;
    }
    if let Some(task) = fault_task {
        println!("fleet bench: churn over; waiting for the faults in progress to heal");
        task.await.unwrap();
    }
    probes_stop.store(true, Ordering::Relaxed);
    for t in probe_threads {
        let _ = t.join();
    }
    let churned = churn_started.elapsed().as_secs_f64();
    let writes_done = writes.load(Ordering::Relaxed);
    // A burst under way finishes its writes (a few seconds); one waiting for its time is
    // stopped.
    while bursting.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bursts.abort();
    let burst_count = (churned as u64) / burst_every.max(1);
    // The last changes land.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let cpu_after = (
        cpu_seconds(apiserver_pid),
        cpu(&controller_pids),
        cpu(&proxy_pids),
    );
    let own_cpu = (cpu_seconds(own_pid) - own_before) / churned;
    let watched_bytes = watched.load(Ordering::Relaxed) - watched_before;
    let status_writes_after = status_writes(&client).await;
    let rounds = match checker {
        Some(task) => task.await.unwrap_or(0),
        None => 0,
    };
    // A last pass of the checker over every node, once everything is quiet.
    if !kube_proxy {
        for (k, netns) in netnses.iter().enumerate() {
            check_node(k, netns, &fleet, &checked, true, None, None).await;
        }
    }

    // Latency from the kernels.
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let changes = std::mem::take(&mut *changes.lock().unwrap());
    let mut last_node = Vec::new();
    let mut controller_part = Vec::new();
    let mut nodes_part = Vec::new();
    let mut per_agent: Vec<Vec<f64>> = vec![Vec::new(); agents];
    let mut all_pairs = Vec::new();
    let mut never = 0;
    // Never seen although the node's semantics still include it at the end: lost (a
    // soak's partitions make endpoints come and go unseen by a node that was cut off,
    // which is right).
    let mut never_lost = 0;
    // Writes the API server did not take at the first attempt, and how long they waited.
    let mut waited: Vec<f64> = changes
        .iter()
        .filter(|c| c.waited > 0.0)
        .map(|c| c.waited * 1e3)
        .collect();
    for change in changes.iter() {
        let mut worst: f64 = 0.0;
        for (k, ip) in &change.expected {
            match seen.get(&(*k, *ip)) {
                Some(at) => {
                    let ms = (at - change.sent) * 1e3;
                    worst = worst.max(ms);
                    per_agent[*k].push(ms);
                    all_pairs.push(ms);
                }
                None => {
                    never += 1;
                    let fleet = fleet.lock().unwrap();
                    let svc = &fleet.services[change.service];
                    let wanted = |v: Verdict| matches!(v, Verdict::Endpoints(set) if set.contains(&socket(*ip)));
                    never_lost += usize::from(
                        svc.exists
                            && (wanted(fleet.cluster_expected(svc, *k))
                                || (svc.kind == Kind::Local
                                    && wanted(fleet.local_expected(svc, *k)))),
                    );
                    if never <= 10 {
                        println!(
                            "fleet bench: NEVER SEEN {} on {} ({:?} Service {}, written {:.1} s \
                             before the end; an endpoint at the end: {})",
                            Ipv4Addr::from(*ip),
                            node_name(*k),
                            svc.kind,
                            svc.name,
                            now() - change.sent,
                            svc.endpoints.iter().any(|e| e.ip == *ip)
                        );
                    }
                }
            }
        }
        if !change.expected.is_empty() {
            last_node.push(worst);
            if let Some(at) = plan_arrivals
                .lock()
                .unwrap()
                .get(&change.service)
                .and_then(|times| times.iter().find(|t| **t >= change.sent))
            {
                controller_part.push((at - change.sent) * 1e3);
                nodes_part.push(worst - (at - change.sent) * 1e3);
            }
        }
    }
    let mut agent_p99: Vec<f64> = per_agent.iter_mut().map(|v| quantile(v, 0.99)).collect();
    let mut agent_median: Vec<f64> = per_agent.iter_mut().map(|v| quantile(v, 0.5)).collect();
    let proxy_peak = proxy_pids
        .iter()
        .map(|p| status_kib(*p, "VmHWM"))
        .max()
        .unwrap_or(0);
    let mut syncs_first = first_sync.clone();
    // Mean cores over the churn; a soak restarts the processes, so its CPU is not summed.
    let cores = |seconds: f64| {
        if soak {
            "- (restarted)".to_owned()
        } else {
            format!("{:.3}", seconds / churned)
        }
    };
    let timed = last_node.len();
    let mut rows: Vec<(String, String)> = vec![
        (
            "proxy; nodes running it; watchers; Node objects; zones".into(),
            format!("{proxy} (nftables); {agents}; {watchers}; {nodes}; {zones}"),
        ),
        (
            "Services x endpoints; Local NodePorts; hinted".into(),
            format!(
                "{services} x {replicas}; {:.0} %; {:.0} %",
                local_fraction * 100.0,
                hinted_fraction * 100.0
            ),
        ),
        (
            "churn: seconds; slice writes (rate); bursts of pods".into(),
            format!(
                "{churned:.0} s; {writes_done} ({:.1}/s); {burst_count} x {burst_pods}",
                writes_done as f64 / churned
            ),
        ),
        (
            format!(
                "last-node latency, slice PATCH sent -> kernel (median / p90 / p99 / max of {timed})"
            ),
            ms(&mut last_node),
        ),
        (
            format!(
                "  writes the API server took only after retries: {} (their wait, excluded above)",
                waited.len()
            ),
            if waited.is_empty() {
                "-".to_owned()
            } else {
                ms(&mut waited)
            },
        ),
        (
            "  of which the controller: slice write -> its plan at a watcher".into(),
            if kube_proxy {
                "-".to_owned()
            } else {
                ms(&mut controller_part)
            },
        ),
        (
            "  of which the nodes: plan at a watcher -> last node's kernel".into(),
            if kube_proxy {
                "-".to_owned()
            } else {
                ms(&mut nodes_part)
            },
        ),
        (
            "every node's latency (median / p90 / p99 / max, all nodes x changes)".into(),
            ms(&mut all_pairs),
        ),
        (
            "per node: median latency, best / median / worst node".into(),
            format!(
                "{:.1} / {:.1} / {:.1} ms",
                quantile(&mut agent_median, 0.0),
                quantile(&mut agent_median, 0.5),
                quantile(&mut agent_median, 1.0)
            ),
        ),
        (
            "per node: p99 latency, best / median / worst node".into(),
            format!(
                "{:.1} / {:.1} / {:.1} ms",
                quantile(&mut agent_p99, 0.0),
                quantile(&mut agent_p99, 0.5),
                quantile(&mut agent_p99, 1.0)
            ),
        ),
        (
            "new endpoints never seen in a kernel that should have them; of them still in \
             that node's semantics at the end"
                .into(),
            format!("{never}; {never_lost}"),
        ),
        (
            "first sync per node from its start (median / max); whole fleet".into(),
            format!(
                "{:.1} / {:.1} s; {:.1} s",
                quantile(&mut syncs_first, 0.5),
                quantile(&mut syncs_first, 1.0),
                fleet_synced.as_secs_f64()
            ),
        ),
        (
            "API server: bytes to one watcher per slice write; all watchers + nodes per second"
                .into(),
            format!(
                "{:.0} B; {:.1} MB/s",
                watched_bytes as f64 / writes_done.max(1) as f64 / watchers.max(1) as f64,
                watched_bytes as f64 / watchers.max(1) as f64 * (watchers + agents) as f64
                    / churned
                    / 1e6
            ),
        ),
        (
            "rollout status: node plan status writes per node per minute; Service plan status \
             writes per slice write (the API server's request counts)"
                .into(),
            if soak {
                // The API server's counters start again with it.
                "- (restarted)".to_owned()
            } else {
                format!(
                    "{:.1}; {:.3}",
                    (status_writes_after.0 - status_writes_before.0)
                        / agents.max(1) as f64
                        / (churned / 60.0),
                    (status_writes_after.1 - status_writes_before.1) / writes_done.max(1) as f64
                )
            },
        ),
        (
            "watchers: reopened after the API server closed them (slow readers)".into(),
            format!("{}", reopened.load(Ordering::Relaxed)),
        ),
        (
            "API server: CPU (cores, mean over churn); peak RSS".into(),
            format!(
                "{}; {:.0} MiB",
                cores(cpu_after.0 - cpu_before.0),
                apiserver_rss_peak.max(status_kib(apiserver_pid, "VmRSS")) as f64 / 1024.0
            ),
        ),
        (
            "this bench: writers, watchers, monitors, checker (cores, mean)".into(),
            format!("{own_cpu:.2}"),
        ),
        (
            "nodes: CPU per node (cores, mean); peak RSS of the largest".into(),
            format!(
                "{}; {:.0} MiB",
                cores((cpu_after.2 - cpu_before.2) / agents as f64),
                proxy_peak as f64 / 1024.0
            ),
        ),
    ];
    if !controllers.is_empty() {
        let peak = controllers
            .iter()
            .map(|c| status_kib(c.pid(), "VmHWM"))
            .max()
            .unwrap_or(0);
        rows.push((
            "controller: CPU (cores, mean); peak RSS; every plan written from its start".into(),
            format!(
                "{}; {:.0} MiB; {:.1} s",
                cores(cpu_after.1 - cpu_before.1),
                peak as f64 / 1024.0,
                controller_wrote_all.as_secs_f64()
            ),
        ));
        rows.push((
            "one agent's start-up list of Service plans".into(),
            format!("{:.1} MiB", startup_list.0 as f64 / 1_048_576.0),
        ));
        let mut checked = checked.lock().unwrap();
        let mut episodes = checked.episodes.clone();
        let reads = checked.reads;
        let read_median = quantile(&mut checked.read_ms, 0.5);
        rows.push((
            "checker: rounds over every node; kernel reads (median read)".into(),
            format!("{rounds}; {reads} ({read_median:.0} ms)"),
        ));
        rows.push((
            "checker: Service x node comparisons; a node behind by over 1 s".into(),
            format!("{}; {}", checked.compared, checked.mismatches.len()),
        ));
        rows.push((
            "checker: disagreements ended; longest, write -> agreeing read (bounded by the reads)"
                .into(),
            format!("{}; {:.2} s", episodes.len(), quantile(&mut episodes, 1.0)),
        ));
        rows.push((
            "checker: last pass, churn over: Services x nodes whose kernel differs from semantics"
                .into(),
            format!(
                "{} of {}",
                checked.wrong_at_end.len(),
                fleet.lock().unwrap().services.len() * agents
            ),
        ));
        for m in checked.wrong_at_end.iter().take(20) {
            println!("fleet bench: WRONG AT THE END {m}");
        }
        for m in checked.mismatches.iter().take(20) {
            println!("fleet bench: BEHIND {m}");
        }
        for e in checked.errors.iter().take(20) {
            println!("fleet bench: CHECKER ERROR {e}");
        }
    }
    if !kube_proxy {
        let (equality, differences) =
            final_equality(&client, &bins.controller, &workdir, agents).await;
        rows.extend(equality);
        for d in differences.iter().take(20) {
            println!("fleet bench: END STATE DIFFERS {d}");
        }
    }
    print_table(&rows);
    if let Some(soak) = soak_state {
        let log = soak.log.lock().unwrap().clone();
        let probes = probes.lock().unwrap();
        report_soak(
            &log,
            &probes,
            &samples,
            checked.lock().unwrap().behind_disturbed,
        );
    }

    for p in proxies.iter().chain(&controllers) {
        p.stop().await;
    }
    for f in &mut forwarders {
        f.stop().await;
    }
    for netns in netnses.iter().chain(&pod_netnses) {
        let _ = procs::delete_netns(netns);
    }
    drop(plane);
    if std::env::var_os("FLEET_KEEP_LOGS").is_some() {
        println!("fleet bench: logs kept in {}", workdir.display());
    } else {
        let _ = std::fs::remove_dir_all(&workdir);
    }
}
