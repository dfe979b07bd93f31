//! Builders for merged plans and a throwaway network namespace, shared by the iptables
//! applier tests.

#![allow(dead_code, reason = "each test file uses a different part")]

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use proxyplan_agent::kernel::{Backend, Family, Tool};
use proxyplan_crds::{
    EmptyAction, Endpoint, IpFamily, LocalTrafficDetection, LocalTrafficMode, MasqueradePlan,
    MergedPlan, Protocol, ServicePortPlan, TrafficPlan, TrafficPolicy,
};

/// `10.244.1.5:8080` or `[fd00::5]:8080`.
pub fn ep(text: &str) -> Endpoint {
    let (ip, port) = text.rsplit_once(':').expect("ip:port");
    Endpoint {
        ip: ip.trim_matches(['[', ']']).into(),
        port: port.parse().expect("port"),
    }
}

const CLUSTER: TrafficPlan = TrafficPlan {
    policy: TrafficPolicy::Cluster,
    when_empty: EmptyAction::Reject,
};

/// A ClusterIP service port `demo/<name>:http` with Cluster policy, masquerading
/// off-cluster and hairpin traffic.
pub fn service(name: &str, cluster_ip: &str, port: u16, endpoints: &[&str]) -> ServicePortPlan {
    let family = if cluster_ip.contains(':') {
        IpFamily::IPv6
    } else {
        IpFamily::IPv4
    };
    ServicePortPlan {
        key: format!("demo/{name}:http/TCP/{family}"),
        namespace: "demo".into(),
        name: name.into(),
        port_name: "http".into(),
        family,
        protocol: Protocol::TCP,
        port,
        cluster_ip: cluster_ip.into(),
        external_ips: vec![],
        load_balancer_ips: vec![],
        node_port: None,
        load_balancer_source_ranges: vec![],
        health_check_node_port: None,
        session_affinity: None,
        internal: CLUSTER,
        external: None,
        cluster_endpoints: endpoints.iter().map(|e| ep(e)).collect(),
        zone_endpoints: Vec::new(),
        local_endpoints: vec![],
        masquerade: MasqueradePlan {
            all: false,
            off_cluster_to_cluster_ip: true,
            external: false,
            local_host_to_external: false,
            hairpin: true,
        },
        local_terminating: false,
        also_serving: Vec::new(),
    }
}

/// The same as UDP.
pub fn udp(mut entry: ServicePortPlan) -> ServicePortPlan {
    entry.protocol = Protocol::UDP;
    entry.key = entry.key.replace("/TCP/", "/UDP/");
    entry
}

/// The same with a node port (Cluster external policy, masqueraded).
pub fn node_port(mut entry: ServicePortPlan, port: u16) -> ServicePortPlan {
    entry.node_port = Some(port);
    entry.external = Some(CLUSTER);
    entry.masquerade.external = true;
    entry
}

/// A merged plan for `node-a` holding `entries`.
pub fn plan(mut entries: Vec<ServicePortPlan>) -> MergedPlan {
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    MergedPlan {
        node_name: "node-a".into(),
        revision: "test".into(),
        services_fingerprint: 0,
        refused: Vec::new(),
        unmatched: Vec::new(),
        addresses: vec!["192.168.0.10".parse().expect("ip")],
        local_traffic: LocalTrafficDetection {
            mode: LocalTrafficMode::ClusterCIDR,
            cidrs: vec!["10.244.0.0/16".into(), "fd00:10:244::/56".into()],
            interface: None,
        },
        service_ports: entries.into_iter().map(std::sync::Arc::new).collect(),
        service_cidrs: Vec::new(),
    }
}

/// A small cluster: `web` (2 endpoints), `api` with a node port (2 endpoints), `empty`.
pub fn small_cluster() -> Vec<ServicePortPlan> {
    vec![
        service(
            "web",
            "10.96.0.10",
            80,
            &["10.244.1.10:8080", "10.244.2.10:8080"],
        ),
        node_port(
            service(
                "api",
                "10.96.0.11",
                80,
                &["10.244.1.11:8080", "10.244.2.11:8080"],
            ),
            30080,
        ),
        service("empty", "10.96.0.12", 80, &[]),
    ]
}

/// `count` services with `endpoints` endpoints each.
pub fn many_services(count: usize, endpoints: usize) -> Vec<ServicePortPlan> {
    (0..count)
        .map(|i| {
            let eps: Vec<String> = (0..endpoints)
                .map(|e| format!("10.244.{}.{}:8080", e + 1, i % 250 + 1))
                .collect();
            let eps: Vec<&str> = eps.iter().map(String::as_str).collect();
            service(
                &format!("svc-{i}"),
                &format!("10.96.{}.{}", i / 250, i % 250 + 1),
                80,
                &eps,
            )
        })
        .collect()
}

/// Chain name → its `-A` lines (words after `-A CHAIN`, unquoted), from iptables-save
/// output of one table; a declared chain without rules maps to an empty list.
pub fn chains_of(save: &str, table: &str) -> BTreeMap<String, Vec<Vec<String>>> {
    use proxyplan_agent::kernel::iptables::split_words;
    let mut out: BTreeMap<String, Vec<Vec<String>>> = BTreeMap::new();
    let mut inside = false;
    for line in save.lines() {
        if line.starts_with('*') {
            inside = line == format!("*{table}");
        } else if !inside || line == "COMMIT" {
            continue;
        } else if let Some(decl) = line.strip_prefix(':') {
            let name = decl.split_whitespace().next().unwrap_or_default();
            out.entry(name.to_owned()).or_default();
        } else {
            let words = split_words(line);
            if words.len() >= 2 && words[0] == "-A" {
                out.entry(words[1].clone())
                    .or_default()
                    .push(words[2..].to_vec());
            }
        }
    }
    out
}

/// Whether we can make network namespaces (root and `ip netns`), or why not.
pub fn netns_unavailable() -> Option<String> {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        });
    if uid.as_deref() != Some("0") {
        return Some("not root".into());
    }
    match Command::new("ip").args(["netns", "list"]).output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "ip netns unavailable: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(err) => Some(format!("ip unavailable: {err}")),
    }
}

/// A network namespace deleted on drop.
pub struct Netns {
    /// Its name.
    pub name: String,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

impl Netns {
    /// Creates `pp-test-<pid>-<n>`.
    pub fn create() -> Result<Self, String> {
        if let Some(reason) = netns_unavailable() {
            return Err(reason);
        }
        let name = format!(
            "pp-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "ip netns add {name}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Self { name })
    }

    /// Runs a command in the namespace; returns stdout, panics on failure.
    pub fn run(&self, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .expect("ip netns exec");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a command in the namespace; returns whether it succeeded.
    pub fn try_run(&self, args: &[&str]) -> bool {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// A namespace where `backend`'s `iptables` works, or a SKIPPED line and `None`.
pub fn namespace_for(backend: Backend) -> Option<Netns> {
    let ns = match Netns::create() {
        Ok(ns) => ns,
        Err(reason) => {
            println!("SKIPPED: {reason}");
            return None;
        }
    };
    let probe = backend.binary(Family::V4, Tool::Iptables);
    if !ns.try_run(&[&probe, "-t", "nat", "-S"]) {
        println!("SKIPPED: {probe} does not work in a network namespace here");
        return None;
    }
    Some(ns)
}

/// Inserts a UDP conntrack entry `src:sport -> vip:dport` whose reply comes from
/// `reply:reply_port`, with the `conntrack` tool.
pub fn insert_udp_flow(
    ns: &Netns,
    src: &str,
    sport: &str,
    vip: &str,
    dport: &str,
    reply: &str,
    reply_port: &str,
) {
    ns.run(&[
        "conntrack",
        "-I",
        "-p",
        "udp",
        "-s",
        src,
        "-d",
        vip,
        "--sport",
        sport,
        "--dport",
        dport,
        "--reply-src",
        reply,
        "--reply-dst",
        src,
        "--reply-port-src",
        reply_port,
        "--reply-port-dst",
        sport,
        "-t",
        "100",
    ]);
}
