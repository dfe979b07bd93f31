//! What the end-to-end and fleet benches share: raw watches counted by the byte, process
//! figures from `/proc`, an agent's metrics read from inside its network namespace,
//! quantiles, and the CRDs applied from the chart.

#![allow(dead_code, reason = "each bench uses part of it")]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::BodyExt;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub fn now() -> f64 {
    unix(SystemTime::now())
}

/// One event a raw watch received: when, and its size.
#[derive(Debug, Clone)]
pub struct Received {
    pub at: f64,
    pub bytes: usize,
}

pub type Log = Arc<Mutex<Vec<Received>>>;

/// What is called with each event line a raw watch receives, and when it arrived.
pub type OnLine = Arc<dyn Fn(f64, &[u8]) + Send + Sync>;

/// Where a raw watch puts what it receives: every event, only the byte count, or each
/// event line to a function.
#[derive(Clone)]
pub enum Sink {
    Events(Log),
    Bytes(Arc<std::sync::atomic::AtomicU64>),
    Lines(OnLine),
}

/// Watches `path` (with `query`) from now on, raw, recording every event line's size.
pub async fn raw_watch(client: Client, path: String, query: String, sink: Sink) {
    let list = format!("{path}?{query}&limit=1");
    let rv = match client
        .request_text(http::Request::get(&list).body(Vec::new()).unwrap())
        .await
    {
        Ok(text) => serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["metadata"]["resourceVersion"].as_str().map(str::to_owned))
            .unwrap_or_default(),
        Err(_) => String::new(),
    };
    let uri = format!("{path}?{query}&watch=true&resourceVersion={rv}&timeoutSeconds=3600");
    let request = http::Request::get(&uri)
        .body(kube::client::Body::empty())
        .unwrap();
    let Ok(response) = client.send(request).await else {
        return;
    };
    let mut body = response.into_body();
    let mut pending: Vec<u8> = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        let Ok(data) = frame.into_data() else {
            continue;
        };
        match &sink {
            Sink::Bytes(total) => {
                total.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            Sink::Events(_) | Sink::Lines(_) => {
                pending.extend_from_slice(&data);
                while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    let at = now();
                    match &sink {
                        Sink::Events(log) => log.lock().unwrap().push(Received {
                            at,
                            bytes: line.len(),
                        }),
                        Sink::Lines(on_line) => on_line(at, &line),
                        Sink::Bytes(_) => {}
                    }
                }
            }
        }
    }
}

/// Asks an agent (or kube-proxy) for its metrics from inside its namespace (a thread that
/// entered it).
pub struct AgentMetrics {
    requests: std::sync::mpsc::Sender<std::sync::mpsc::Sender<String>>,
}

impl AgentMetrics {
    pub fn new(netns: &str, address: SocketAddr) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<std::sync::mpsc::Sender<String>>();
        let path = format!("/run/netns/{netns}");
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).expect("netns");
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            for reply in rx {
                let text = fetch(address);
                let _ = reply.send(text);
            }
        });
        Self { requests: tx }
    }

    pub fn get(&self) -> String {
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = self.requests.send(tx);
        rx.recv().unwrap_or_default()
    }

    pub fn value(&self, series: &str) -> f64 {
        metric(&self.get(), series)
    }
}

/// `GET /metrics` from `address` (empty when it does not answer within a few seconds).
pub fn fetch(address: SocketAddr) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1))
    else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}

/// A sample of a `/metrics` text; NaN when it is not there.
pub fn metric(text: &str, series: &str) -> f64 {
    proxyplan_tests::metrics::sample(text, series).unwrap_or(f64::NAN)
}

/// A `kB` field of `/proc/<pid>/status`, e.g. `VmHWM` (peak resident memory).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// User + system CPU time of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of /proc/PID/stat (12 and 13 after the name).
    (ticks(11) + ticks(12)) / 100.0
}

pub fn quantile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    if values.is_empty() {
        return f64::NAN;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// `median / p90 / p99 / max` in milliseconds.
pub fn ms(values: &mut [f64]) -> String {
    format!(
        "{:.1} / {:.1} / {:.1} / {:.1} ms",
        quantile(values, 0.5),
        quantile(values, 0.9),
        quantile(values, 0.99),
        quantile(values, 1.0)
    )
}

/// Prints rows as a two-column Markdown table.
pub fn print_table(rows: &[(String, String)]) {
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    println!(
        "\n| {:width$} | result |\n|{}|---|",
        "",
        "-".repeat(width + 2)
    );
    for (label, value) in rows {
        println!("| {label:width$} | {value} |");
    }
}

/// Applies the chart's two CRDs and waits until they serve.
pub async fn apply_crds(client: &Client) {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap();
    for file in ["nodeproxyplans", "serviceproxyplans"] {
        let path = repo.join(format!("charts/proxyplan/crds/{file}.proxyplan.dev.yaml"));
        apply_crd_with_client(client, &path).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
}

async fn apply_crd_with_client(client: &Client, path: &std::path::Path) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let text = std::fs::read_to_string(path).unwrap();
    let crd: CustomResourceDefinition = serde_yaml::from_str(&text).unwrap();
    let name = kube::ResourceExt::name_any(&crd);
    Api::<CustomResourceDefinition>::all(client.clone())
        .patch(
            &name,
            &PatchParams::apply("bench").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap();
}

/// How many objects a list with `query` returns: a one-item page and the rest's count when the
/// API server gives one (lists without a selector), else counted page by page.
pub async fn count(client: &Client, path: &str, query: &str) -> usize {
    let mut total = 0;
    let mut token = String::new();
    let mut limit = 1;
    loop {
        let uri = format!("{path}?{query}&limit={limit}&continue={token}");
        let Ok(text) = client
            .request_text(http::Request::get(&uri).body(Vec::new()).unwrap())
            .await
        else {
            return total;
        };
        let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        total += value["items"].as_array().map_or(0, Vec::len);
        if let Some(rest) = value["metadata"]["remainingItemCount"].as_u64() {
            return total + usize::try_from(rest).unwrap_or(0);
        }
        match value["metadata"]["continue"].as_str() {
            Some(next) if !next.is_empty() => token = next.to_owned(),
            _ => return total,
        }
        limit = 2000;
    }
}

/// The bytes of a full list with `query`, and of its largest item.
pub async fn list_bytes(client: &Client, path: &str, query: &str) -> (usize, usize) {
    let uri = format!("{path}?{query}");
    let text = client
        .request_text(http::Request::get(&uri).body(Vec::new()).unwrap())
        .await
        .unwrap_or_default();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let largest = value["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| serde_json::to_vec(item).map_or(0, |v| v.len()))
        .max()
        .unwrap_or(0);
    (text.len(), largest)
}

/// etcd's WAL fsyncs so far, from its metrics: (all, slower than 32 ms, slower than 64 ms).
/// A change's latency includes the fsync of every write on its way (the slice, the plan).
pub fn etcd_fsyncs(control_plane_dir: &std::path::Path) -> (f64, f64, f64) {
    etcd_histogram(control_plane_dir, "etcd_disk_wal_fsync_duration_seconds")
}

/// etcd's backend commits so far (its database file written and synced, every 100 ms
/// under writes; a write that arrives meanwhile waits): (all, slower than 32 ms, slower
/// than 64 ms).
pub fn etcd_backend_commits(control_plane_dir: &std::path::Path) -> (f64, f64, f64) {
    etcd_histogram(
        control_plane_dir,
        "etcd_disk_backend_commit_duration_seconds",
    )
}

/// What an etcd histogram from [`etcd_fsyncs`] or [`etcd_backend_commits`] counted
/// between two readings: "all / over 32 ms / over 64 ms".
pub fn counts_between(before: (f64, f64, f64), after: (f64, f64, f64)) -> String {
    format!(
        "{:.0} / {:.0} / {:.0}",
        after.0 - before.0,
        after.1 - before.1,
        after.2 - before.2
    )
}

fn etcd_histogram(control_plane_dir: &std::path::Path, name: &str) -> (f64, f64, f64) {
    let port: u16 = std::fs::read_to_string(control_plane_dir.join("ports"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("etcd=")?.trim().parse().ok())
        .unwrap_or(0);
    let text = fetch(SocketAddr::from(([127, 0, 0, 1], port)));
    if text.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let bucket = |le: &str| metric(&text, &format!("{name}_bucket{{le=\"{le}\"}}"));
    let all = metric(&text, &format!("{name}_count"));
    (all, all - bucket("0.032"), all - bucket("0.064"))
}

/// `proxyplan-controller run` against `kubeconfig`, leader-elected in `namespace`, with its
/// HTTP ports on free loopback ports, logging with filter `log`.
pub fn controller_command(
    binary: &std::path::Path,
    kubeconfig: &std::path::Path,
    namespace: &str,
    identity: &str,
    cluster_cidr: &str,
    log: &str,
) -> std::process::Command {
    let mut command = std::process::Command::new(binary);
    command
        .arg("run")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "--leader-election-namespace",
            namespace,
            "--identity",
            identity,
        ])
        .args([
            "--metrics-bind-address",
            "127.0.0.1:0",
            "--health-bind-address",
            "127.0.0.1:0",
        ])
        .args(["--cluster-cidr", cluster_cidr, "--log", log]);
    command
}

/// `proxyplan-agent run` for node `node` inside network namespace `netns` (`ip netns
/// exec`), with kube-proxy's health and metrics ports on the namespace's loopback, and
/// `flags` (`--mode`, ...).
pub fn agent_command(
    binary: &std::path::Path,
    netns: &str,
    node: &str,
    flags: &[&str],
    kubeconfig: &std::path::Path,
    state_dir: &std::path::Path,
    log: &str,
) -> std::process::Command {
    let mut command = std::process::Command::new("ip");
    command
        .args(["netns", "exec", netns])
        .arg(binary)
        .args(["run", "--node", node])
        .args(flags)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "--healthz-bind-address",
            "127.0.0.1:10256",
            "--metrics-bind-address",
            "127.0.0.1:10249",
        ])
        .arg("--state-dir")
        .arg(state_dir)
        .args(["--log", log]);
    command
}

/// A control plane of its own in `workdir/cp`, a client of it with the CRDs applied and
/// namespace `namespace` created, and the API server's process id.
pub async fn start_plane(
    workdir: &std::path::Path,
    namespace: &str,
) -> (proxyplan_tests::control_plane::ControlPlane, Client, u32) {
    use k8s_openapi::api::core::v1::Namespace;
    let plane = proxyplan_tests::control_plane::ControlPlane::start(&workdir.join("cp"), false)
        .expect("control plane");
    let apiserver_pid = std::fs::read_to_string(workdir.join("cp/kube-apiserver.pid"))
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or(0);
    let client = proxyplan_crds::runtime::client(Some(&plane.kubeconfig()))
        .await
        .unwrap();
    apply_crds(&client).await;
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&kube::api::PostParams::default(), &ns)
        .await
        .unwrap();
    (plane, client, apiserver_pid)
}
