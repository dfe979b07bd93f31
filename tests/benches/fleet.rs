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
//! endpoint (its zone's hints decide) showing it. The per-node checker (proxyplan only) reads every agent's table with
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

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::too_many_lines,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

mod common;

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
use procs::{Bins, Spawned};

const NS: &str = "fleet";
const API_IN_NETNS: &str = "127.0.0.1:6443";
const CLUSTER_CIDR: &str = "10.128.0.0/9";
const TARGET_PORT: u16 = 8080;
/// Pod addresses: 10.128.0.1 on, never reused, so a new address in a kernel is a change.
const FIRST_POD: u32 = u32::from_be_bytes([10, 128, 0, 1]);
/// A change on a Service written this long before a read may still be in flight.
const IN_FLIGHT: f64 = 1.0;

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
    /// When the state above was last sent (just before its PATCH).
    written: f64,
    /// A burst owns it: the steady writer leaves it alone.
    busy: bool,
}

struct Fleet {
    services: Vec<Svc>,
    zones: usize,
    agents: usize,
    nodes: usize,
    replicas: usize,
    next_ip: u32,
    rng: Rng,
}

impl Fleet {
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
        } else if svc.kind == Kind::Hinted && ready.iter().any(|e| self.zone_of(e.node) == zone) {
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
                if svc.kind == Kind::Hinted {
                    item["hints"] = json!({"forZones": [{"name": zone}]});
                }
                item
            })
            .collect();
        serde_json::Value::Array(items)
    }
}

fn socket(ip: u32) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::from(ip), TARGET_PORT)
}

fn node_name(n: usize) -> String {
    format!("fleet-node-{n:04}")
}

/// One measured change: when its PATCH was sent, and for each node that must show a new
/// address, that address.
struct Change {
    service: usize,
    sent: f64,
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
    errors: Vec<String>,
}

/// Reads agent `k`'s table and compares it with the fleet's semantics for that node.
/// Returns whether every Service agreed.
async fn check_node(
    k: usize,
    netns: &str,
    fleet: &Mutex<Fleet>,
    checked: &Mutex<Checked>,
    last_pass: bool,
) -> bool {
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
                    return false;
                }
            }
        }
        Ok(out) => {
            checked.errors.push(format!(
                "node {k}: nft: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            return false;
        }
        Err(e) => {
            checked.errors.push(format!("node {k}: nft: {e}"));
            return false;
        }
    };
    let fleet = fleet.lock().unwrap();
    let mut all_agree = true;
    for (s, svc) in fleet.services.iter().enumerate() {
        let mut differs = Vec::new();
        let want = fleet.cluster_expected(svc, k);
        let got = view.services.get(&(svc.vip, Proto::Tcp, 80));
        if got != Some(&want) {
            differs.push(format!("cluster IP: kernel {got:?}, semantics {want:?}"));
        }
        if svc.kind == Kind::Local {
            let want = fleet.local_expected(svc, k);
            let got = view.node_ports.get(&(Proto::Tcp, svc.node_port));
            if got != Some(&want) {
                differs.push(format!("node port: kernel {got:?}, semantics {want:?}"));
            }
        }
        checked.compared += 1;
        if differs.is_empty() {
            if let Some(since) = checked.open.remove(&(k, s)) {
                checked.episodes.push(read_at - since);
            }
            continue;
        }
        all_agree = false;
        // The kernel is behind since this state was written (it agreed before, or this
        // episode started earlier).
        checked.open.entry((k, s)).or_insert(svc.written);
        if last_pass {
            checked.wrong_at_end.push(format!(
                "{} on {}: {}",
                svc.name,
                node_name(k),
                differs.join("; ")
            ));
        } else if started - svc.written >= IN_FLIGHT {
            checked.mismatches.push(format!(
                "{} on {} ({:.1} s after its write): {}",
                svc.name,
                node_name(k),
                started - svc.written,
                differs.join("; ")
            ));
        }
    }
    all_agree
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("fleet bench: run with cargo bench (it needs root and 15 minutes)");
        return;
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
        let endpoints = (0..replicas).map(|_| fleet.new_endpoint()).collect();
        fleet.services.push(Svc {
            name: format!("svc-{i:05}"),
            kind,
            vip: Ipv4Addr::UNSPECIFIED,
            node_port: 0,
            endpoints,
            written: now(),
            busy: false,
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
    println!(
        "fleet bench: {nodes} Nodes, {services} Services and slices written in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The controller (proxyplan only).
    let plans_path = "/apis/proxyplan.dev/v1alpha1/serviceproxyplans";
    let managed = "labelSelector=app.kubernetes.io%2Fmanaged-by%3Dproxyplan-controller";
    let mut controller = None;
    let mut controller_wrote_all = Duration::ZERO;
    let mut startup_list = (0, 0);
    if !kube_proxy {
        let started = Instant::now();
        let mut command = controller_command(
            &bins.controller,
            &plane.kubeconfig(),
            NS,
            "fleet",
            CLUSTER_CIDR,
            &controller_log,
        );
        let mut spawned = Spawned::start(
            "controller",
            &mut command,
            workdir.join("controller.log"),
            false,
        )
        .unwrap();
        let node_plans = "/apis/proxyplan.dev/v1alpha1/nodeproxyplans";
        loop {
            if count(&client, plans_path, "").await >= services
                && count(&client, node_plans, "").await >= nodes
            {
                break;
            }
            assert!(spawned.exited().is_none(), "{}", spawned.log_tail(20));
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
        controller = Some(spawned);
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
    let mut proxies = Vec::new();
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
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &netns]);
        if kube_proxy {
            command
                .arg(&kube_proxy_bin)
                .arg("--config")
                .arg(&kube_proxy_config)
                .args(["--hostname-override", &node_name(k), "--v", "0"]);
        } else {
            command
                .arg(&bins.agent)
                .args(["run", "--node", &node_name(k), "--mode", "nftables"])
                .arg("--kubeconfig")
                .arg(&node_kubeconfig)
                .args([
                    "--healthz-bind-address",
                    "127.0.0.1:10256",
                    "--metrics-bind-address",
                    "127.0.0.1:10249",
                ])
                .arg("--state-dir")
                .arg(workdir.join(format!("state-{k}")))
                .args(["--log", &agent_log]);
        }
        let start = Instant::now();
        proxies.push(
            Spawned::start(
                &format!("{proxy} {k}"),
                &mut command,
                workdir.join(format!("proxy-{k}.log")),
                false,
            )
            .unwrap(),
        );
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
        for p in &mut proxies {
            if let Some(why) = p.exited() {
                panic!("{} exited: {why}\n{}", p.label, p.log_tail(20));
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
        tokio::spawn(raw_watch(
            client.clone(),
            plans_path.into(),
            managed.into(),
            Sink::Lines(on_line),
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // Churn, the checker, and the measurements around them.
    let fleet = Arc::new(Mutex::new(fleet));
    let changes: Arc<Mutex<Vec<Change>>> = Arc::default();
    let writes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let checked: Arc<Mutex<Checked>> = Arc::default();
    let proxy_pids: Vec<u32> = proxies.iter().map(|p| p.child.id()).collect();
    let controller_pid = controller.as_ref().map_or(0, |c| c.child.id());
    let cpu = |pids: &[u32]| pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>();
    let own_pid = std::process::id();
    let own_before = cpu_seconds(own_pid);
    let cpu_before = (
        cpu_seconds(apiserver_pid),
        cpu_seconds(controller_pid),
        cpu(&proxy_pids),
    );
    let watched_before = watched.load(Ordering::Relaxed);

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
                    changes.lock().unwrap().push(Change {
                        service: s,
                        sent: now(),
                        expected,
                    });
                }
                // A keep-alive connection the server closed fails a request now and then
                // (IncompleteMessage): sent again, as a controller would.
                let patch = Patch::Merge(json!({"endpoints": endpoints}));
                for attempt in 1.. {
                    match slice_api
                        .patch(
                            &format!("svc-{s:05}-fleet"),
                            &PatchParams::default(),
                            &patch,
                        )
                        .await
                    {
                        Ok(_) => break,
                        Err(e) if attempt < 5 => {
                            println!("fleet bench: slice write failed, sent again: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(e) => panic!("writing svc-{s:05}-fleet: {e}"),
                    }
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
                let (s, fresh, endpoints) = {
                    let mut fleet = fleet.lock().unwrap();
                    let n = fleet.services.len();
                    let mut s = fleet.rng.below(n);
                    while fleet.services[s].busy {
                        s = fleet.rng.below(n);
                    }
                    let sent = now();
                    let fresh = fleet.roll(s);
                    fleet.services[s].written = sent;
                    fleet.services[s].busy = true;
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
    let bursts = {
        let (fleet, stop, write) = (fleet.clone(), stop.clone(), write.clone());
        tokio::spawn(async move {
            let mut count = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(burst_every)).await;
                if stop.load(Ordering::Relaxed) {
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
                    while chosen.len() < wanted {
                        let s = fleet.rng.below(n);
                        // Not one the steady writer is writing.
                        if fleet.services[s].busy {
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
            }
        })
    };
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
                        if check_node(k, netns, &fleet, &checked, false).await {
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
    // Resource samples every 10 s.
    let mut apiserver_rss_peak = 0;
    while churn_started.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_secs(10)).await;
        apiserver_rss_peak = apiserver_rss_peak.max(status_kib(apiserver_pid, "VmRSS"));
        for p in &mut proxies {
            if let Some(why) = p.exited() {
                panic!("{} exited: {why}\n{}", p.label, p.log_tail(20));
            }
        }
        let done = changes.lock().unwrap().len();
        println!(
            "fleet bench: {:.0} s of churn, {} writes, {done} changes with new endpoints",
            churn_started.elapsed().as_secs_f64(),
            writes.load(Ordering::Relaxed)
        );
    }
    stop.store(true, Ordering::Relaxed);
    let _ = steady.await;
    let churned = churn_started.elapsed().as_secs_f64();
    let writes_done = writes.load(Ordering::Relaxed);
    bursts.abort();
    let burst_count = (churned as u64) / burst_every.max(1);
    // The last changes land.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let cpu_after = (
        cpu_seconds(apiserver_pid),
        cpu_seconds(controller_pid),
        cpu(&proxy_pids),
    );
    let own_cpu = (cpu_seconds(own_pid) - own_before) / churned;
    let watched_bytes = watched.load(Ordering::Relaxed) - watched_before;
    let rounds = match checker {
        Some(task) => task.await.unwrap_or(0),
        None => 0,
    };
    // A last pass of the checker over every node, once everything is quiet.
    if !kube_proxy {
        for (k, netns) in netnses.iter().enumerate() {
            check_node(k, netns, &fleet, &checked, true).await;
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
            "new endpoints never seen in a kernel that should have them".into(),
            format!("{never}"),
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
            "watchers: reopened after the API server closed them (slow readers)".into(),
            format!("{}", reopened.load(Ordering::Relaxed)),
        ),
        (
            "API server: CPU (cores, mean over churn); peak RSS".into(),
            format!(
                "{:.2}; {:.0} MiB",
                (cpu_after.0 - cpu_before.0) / churned,
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
                "{:.3}; {:.0} MiB",
                (cpu_after.2 - cpu_before.2) / churned / agents as f64,
                proxy_peak as f64 / 1024.0
            ),
        ),
    ];
    if let Some(c) = &controller {
        rows.push((
            "controller: CPU (cores, mean); peak RSS; every plan written from its start".into(),
            format!(
                "{:.2}; {:.0} MiB; {:.1} s",
                (cpu_after.1 - cpu_before.1) / churned,
                status_kib(c.child.id(), "VmHWM") as f64 / 1024.0,
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
    print_table(&rows);

    for p in &mut proxies {
        p.stop().await;
    }
    if let Some(mut c) = controller {
        c.stop().await;
    }
    for f in &mut forwarders {
        f.stop().await;
    }
    for netns in &netnses {
        let _ = procs::delete_netns(netns);
    }
    drop(plane);
    if std::env::var_os("FLEET_KEEP_LOGS").is_some() {
        println!("fleet bench: logs kept in {}", workdir.display());
    } else {
        let _ = std::fs::remove_dir_all(&workdir);
    }
}
