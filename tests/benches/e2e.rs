//! End-to-end benchmark (issue: the controller hop): a real kube-apiserver v1.36.2 of its
//! own, N Services × 10 endpoints written to it, the real controller, one agent in a
//! network namespace; then endpoint changes one at a time. Prints one table.
//!
//! ```text
//! cargo build --release --bins
//! sudo cargo bench -p proxyplan-tests --bench e2e                      # 1,000 Services
//! sudo BENCH_SERVICES=10000 cargo bench -p proxyplan-tests --bench e2e
//! ```
//!
//! Environment: `BENCH_SERVICES` (default 1,000), `BENCH_ENDPOINTS` (10 per Service),
//! `BENCH_CHANGES` (30), `BENCH_GAP_MS`
//! (800: the pause between changes, after each is measured), `BENCH_AGENT_LOG` (`warn`:
//! the agent's log filter), `BENCH_CONTROLLER_LOG` (`warn`: the controller's),
//! `BENCH_KEEP_LOGS` (set: keep the work directory with the processes' logs), `BENCH_NODES`
//! (Node objects, the agent's included; default 1), `BENCH_MODE` (the agent's `--mode`,
//! default `iptables`), `BENCH_IPTABLES_BACKEND` (`auto`), `BENCH_WATCHERS` (extra raw
//! watchers of the Service plans, as other nodes' agents would open, to measure the API
//! server's CPU per change; default 0), `BENCH_CLUSTER_IPS` (`allocated` by the API
//! server, the default, or `explicit`: Service i gets ClusterIP 10.97.0.0 + i, for runs
//! past what the default 10.96.0.0/16 holds; give the API server the range with
//! `CP_APISERVER_FLAGS=--service-cluster-ip-range=10.96.0.0/12`; anything else stops the
//! bench with an error naming the variable).
//! Without `--bench` (as `cargo test --benches` runs it) it does nothing.
//!
//! At 50,000 Services writing them takes this API server most of the run on 2 cores
//! (each Service's create costs more the more there are: 5,000 in 20 s, the last 5,000 in
//! over 4 minutes); the bench prints its progress every 5,000.
//!
//! Per change it measures, on one clock: the EndpointSlice PATCH returned (t0); the
//! Service plan event reaching a watcher with the agent's selector (the controller's
//! part: its watch delivery, compute and write, and the delivery back); the agent's
//! sync that programmed it finished (`kubeproxy_sync_proxy_rules_last_timestamp_seconds`).
//! The bytes one agent receives per change are every watch event byte on the agent's
//! two watches between t0 and that sync; kube-proxy receives the EndpointSlice event,
//! measured on a third watch.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

#[path = "../tests/e2e/procs.rs"]
#[allow(dead_code, reason = "shared with the e2e suite")]
mod procs;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use proxyplan_tests::e2e::{forward, kubeconfig};
use serde_json::json;

use common::{
    AgentMetrics, Log, Sink, controller_command, count, counts_between, cpu_seconds, env_or,
    etcd_backend_commits, etcd_fsyncs, list_bytes, metric, ms, print_table, quantile, raw_watch,
    start_plane, status_kib, unix,
};
use procs::{Bins, Spawned};

const NS: &str = "bench";
const NODE: &str = "bench-node-0";
const AGENT_API: &str = "127.0.0.1:6443";
/// With `BENCH_CLUSTER_IPS=explicit`, Service i gets this address plus i as its ClusterIP:
/// the API server then needs a range that holds them (10.96.0.0/12).
const EXPLICIT_IP_BASE: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 97, 0, 0);

fn slice_of(service: usize, generation: usize, per_service: usize) -> serde_json::Value {
    let endpoints: Vec<serde_json::Value> = (0..per_service)
        .map(|e| {
            let n = service * per_service + e;
            // The first endpoint's address moves with each change; it never comes back to
            // the first one (generation 0), or a change after 199 others would rewrite a
            // slice to what it was, and nothing would be programmed.
            let last = if e == 0 {
                if generation == 0 {
                    1
                } else {
                    (generation - 1) % 199 + 2
                }
            } else {
                n % 250 + 1
            };
            json!({"addresses": [format!("10.{}.{}.{}", 100 + n / 62_500, n / 250 % 250, last)],
                   "conditions": {"ready": true, "serving": true, "terminating": false},
                   "nodeName": NODE, "zone": "zone-a",
                   "targetRef": {"kind": "Pod", "namespace": NS,
                                 "name": format!("svc-{service:05}-pod-{e}")}})
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{service:05}-abcde"), "namespace": NS,
                     "labels": {"kubernetes.io/service-name": format!("svc-{service:05}"),
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("e2e bench: run with cargo bench (it needs root and a few minutes)");
        return;
    }
    let services: usize = env_or("BENCH_SERVICES", 1_000);
    let changes: usize = env_or("BENCH_CHANGES", 30);
    let per_service: usize = env_or("BENCH_ENDPOINTS", 10);
    // The pause after each change's bytes are counted (the gap between changes is about
    // this plus 300 ms plus the change's latency).
    let gap_ms: u64 = env_or("BENCH_GAP_MS", 800);
    let agent_log = std::env::var("BENCH_AGENT_LOG").unwrap_or_else(|_| "warn".to_owned());
    let controller_log =
        std::env::var("BENCH_CONTROLLER_LOG").unwrap_or_else(|_| "warn".to_owned());
    let nodes: usize = env_or("BENCH_NODES", 1);
    let mode: String = env_or("BENCH_MODE", "iptables".to_owned());
    let backend: String = env_or("BENCH_IPTABLES_BACKEND", "auto".to_owned());
    let watchers: usize = env_or("BENCH_WATCHERS", 0);
    let explicit_ips = match std::env::var("BENCH_CLUSTER_IPS").as_deref() {
        Err(_) | Ok("" | "allocated") => false,
        Ok("explicit") => true,
        Ok(other) => panic!("BENCH_CLUSTER_IPS={other}: expected `explicit` or `allocated`"),
    };
    let bins = Bins::locate().expect("binaries: cargo build --release --bins");
    println!(
        "e2e bench: {services} Services x {per_service} endpoints, {nodes} node(s), agent --mode {mode}, \
         binaries {}",
        bins.controller.display()
    );
    let workdir = std::env::temp_dir().join(format!("proxyplan-bench-{}", std::process::id()));
    std::fs::create_dir_all(&workdir).unwrap();
    let (plane, client, apiserver_pid) = start_plane(&workdir, NS).await;
    let node_api: Api<Node> = Api::all(client.clone());
    for n in 0..nodes {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": format!("bench-node-{n}"), "labels": {"topology.kubernetes.io/zone": "zone-a"}},
            "spec": {"podCIDRs": [format!("10.{}.{}.0/24", 200 + n / 250, n % 250)]}
        }))
        .unwrap();
        node_api
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }

    // The Services and their slices.
    let started = Instant::now();
    let service_api: Api<Service> = Api::namespaced(client.clone(), NS);
    let slice_api: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    stream::iter(0..services)
        .map(|i| {
            let (service_api, slice_api) = (service_api.clone(), slice_api.clone());
            async move {
                let mut spec = json!({"ports": [{"name": "http", "port": 80, "targetPort": 8080}]});
                if explicit_ips {
                    let ip = std::net::Ipv4Addr::from(
                        u32::from(EXPLICIT_IP_BASE) + u32::try_from(i).unwrap(),
                    );
                    spec["clusterIP"] = json!(ip.to_string());
                }
                let svc: Service = serde_json::from_value(json!({
                    "metadata": {"name": format!("svc-{i:05}"), "namespace": NS},
                    "spec": spec
                }))
                .unwrap();
                service_api
                    .create(&PostParams::default(), &svc)
                    .await
                    .unwrap();
                let slice: EndpointSlice =
                    serde_json::from_value(slice_of(i, 0, per_service)).unwrap();
                slice_api
                    .create(&PostParams::default(), &slice)
                    .await
                    .unwrap();
                // At 50,000 Services this takes minutes: say how far it got.
                if (i + 1) % 5_000 == 0 {
                    println!(
                        "e2e bench: {} Services written, {:.1} s",
                        i + 1,
                        started.elapsed().as_secs_f64()
                    );
                }
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    println!(
        "e2e bench: {services} Services and slices written in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The controller.
    let started = Instant::now();
    let mut command = controller_command(
        &bins.controller,
        &plane.kubeconfig(),
        NS,
        "bench",
        "10.100.0.0/14",
        &controller_log,
    );
    let mut controller = Spawned::start(
        "controller",
        &mut command,
        workdir.join("controller.log"),
        false,
    )
    .unwrap();
    let plans_path = "/apis/proxyplan.dev/v1alpha1/serviceproxyplans";
    let managed = "labelSelector=app.kubernetes.io%2Fmanaged-by%3Dproxyplan-controller";
    loop {
        // Every Service plan here is the controller's: count them without a selector, cheaply.
        if count(&client, plans_path, "").await >= services {
            break;
        }
        assert!(controller.exited().is_none(), "{}", controller.log_tail(20));
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "the controller never wrote every Service plan"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let controller_wrote_all = started.elapsed();
    // What an agent lists at start: every Service plan.
    let (total_bytes, largest) = list_bytes(&client, plans_path, managed).await;

    // The watches, from now on: the agent's two (the bytes it receives), kube-proxy's
    // EndpointSlice one, and the extra watchers of other nodes.
    let plans_log: Log = Arc::default();
    let node_log: Log = Arc::default();
    let slices_log: Log = Arc::default();
    tokio::spawn(raw_watch(
        client.clone(),
        plans_path.into(),
        managed.into(),
        Sink::Events(plans_log.clone()),
    ));
    tokio::spawn(raw_watch(
        client.clone(),
        "/apis/proxyplan.dev/v1alpha1/nodeproxyplans".into(),
        format!("fieldSelector=metadata.name%3D{NODE}"),
        Sink::Events(node_log.clone()),
    ));
    tokio::spawn(raw_watch(
        client.clone(),
        "/apis/discovery.k8s.io/v1/endpointslices".into(),
        "labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name".into(),
        Sink::Events(slices_log.clone()),
    ));
    for _ in 0..watchers {
        tokio::spawn(raw_watch(
            client.clone(),
            plans_path.into(),
            managed.into(),
            Sink::Events(Arc::default()),
        ));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!(
        "e2e bench: the controller wrote every Service plan in {:.1} s",
        controller_wrote_all.as_secs_f64()
    );

    // The agent, in its namespace.
    let netns = format!("pp-bench-{}", std::process::id());
    procs::run("ip", &["netns", "add", &netns]).unwrap();
    procs::run(
        "ip",
        &["netns", "exec", &netns, "ip", "link", "set", "lo", "up"],
    )
    .unwrap();
    let local: SocketAddr = AGENT_API.parse().unwrap();
    let original = kube::config::Kubeconfig::read_from(plane.kubeconfig()).unwrap();
    let (config, api) = kubeconfig::for_agents(original, local).unwrap();
    let agent_kubeconfig = workdir.join("agent-kubeconfig.json");
    std::fs::write(&agent_kubeconfig, serde_json::to_string(&config).unwrap()).unwrap();
    let socket = workdir.join("api.sock");
    forward::unix_to_tcp(&socket, api.host.clone(), api.port).unwrap();
    let mut forwarder =
        procs::start_forwarder(&netns, local, &socket, workdir.join("forwarder.log"))
            .await
            .unwrap();
    let metrics_address: SocketAddr = "127.0.0.1:10249".parse().unwrap();
    let started = Instant::now();
    let mut command = common::agent_command(
        &bins.agent,
        &netns,
        NODE,
        &["--mode", &mode, "--iptables-backend", &backend],
        &agent_kubeconfig,
        &workdir.join("agent-state"),
        &agent_log,
    );
    let mut agent =
        Spawned::start("agent", &mut command, workdir.join("agent.log"), false).unwrap();
    let metrics = AgentMetrics::new(&netns, metrics_address);
    loop {
        let text = metrics.get();
        #[allow(clippy::cast_precision_loss)]
        let ports = metric(&text, "proxyplan_agent_service_ports");
        if ports >= services as f64
            && metric(&text, "kubeproxy_sync_proxy_rules_duration_seconds_count") >= 1.0
        {
            break;
        }
        assert!(agent.exited().is_none(), "{}", agent.log_tail(20));
        assert!(
            started.elapsed() < Duration::from_secs(3600),
            "the agent never synced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let agent_first_sync = started.elapsed();
    println!(
        "e2e bench: the agent's first sync done {:.1} s after its start",
        agent_first_sync.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Endpoint changes, one at a time.
    let mut total = Vec::new();
    let mut controller_part = Vec::new();
    let mut agent_part = Vec::new();
    // When each change's PATCH returned (UTC), to find the slowest in the processes' logs.
    let mut returned_at = Vec::new();
    let mut bytes = Vec::new();
    let mut slice_bytes = Vec::new();
    let merge_before = metrics.value("proxyplan_agent_merge_duration_seconds_sum");
    let sync_before = metrics.value("kubeproxy_sync_proxy_rules_duration_seconds_sum");
    let cpu_before = cpu_seconds(apiserver_pid);
    let fsyncs_before = etcd_fsyncs(&workdir.join("cp"));
    let commits_before = etcd_backend_commits(&workdir.join("cp"));
    for k in 0..changes {
        let service = (k * 7_919 + 13) % services;
        let slice = slice_of(service, k + 1, per_service);
        let last_sync = metrics.value("kubeproxy_sync_proxy_rules_last_timestamp_seconds");
        let (plans_mark, node_mark, slices_mark) = (
            plans_log.lock().unwrap().len(),
            node_log.lock().unwrap().len(),
            slices_log.lock().unwrap().len(),
        );
        slice_api
            .patch(
                &format!("svc-{service:05}-abcde"),
                &PatchParams::default(),
                &Patch::Merge(json!({"endpoints": slice["endpoints"]})),
            )
            .await
            .unwrap();
        let t0 = unix(SystemTime::now());
        returned_at.push(t0);
        let waited = Instant::now();
        let synced = loop {
            let at = metrics.value("kubeproxy_sync_proxy_rules_last_timestamp_seconds");
            let plan_seen = plans_log.lock().unwrap().len() > plans_mark;
            if at > last_sync && plan_seen && at >= t0 {
                break at;
            }
            assert!(
                waited.elapsed() < Duration::from_secs(120),
                "change {k} never programmed\n{}\nkube-apiserver's log, last lines:\n{}",
                agent.log_tail(20),
                std::fs::read_to_string(plane.apiserver_log())
                    .map(|log| log.lines().rev().take(30).collect::<Vec<_>>().join("\n"))
                    .unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        let plan_at = plans_log.lock().unwrap()[plans_mark].at;
        total.push((synced - t0) * 1e3);
        controller_part.push((plan_at - t0) * 1e3);
        agent_part.push((synced - plan_at) * 1e3);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let received: usize = plans_log.lock().unwrap()[plans_mark..]
            .iter()
            .map(|r| r.bytes)
            .sum::<usize>()
            + node_log.lock().unwrap()[node_mark..]
                .iter()
                .map(|r| r.bytes)
                .sum::<usize>();
        bytes.push(received as f64);
        slice_bytes.push(
            slices_log.lock().unwrap()[slices_mark..]
                .iter()
                .map(|r| r.bytes)
                .sum::<usize>() as f64,
        );
        tokio::time::sleep(Duration::from_millis(gap_ms)).await;
    }
    let cpu_after = cpu_seconds(apiserver_pid);
    let fsyncs_after = etcd_fsyncs(&workdir.join("cp"));
    let commits_after = etcd_backend_commits(&workdir.join("cp"));
    #[allow(clippy::cast_precision_loss)]
    let per_change = |after: f64, before: f64| (after - before) / changes as f64 * 1e3;
    let merge_ms = per_change(
        metrics.value("proxyplan_agent_merge_duration_seconds_sum"),
        merge_before,
    );
    let sync_ms = per_change(
        metrics.value("kubeproxy_sync_proxy_rules_duration_seconds_sum"),
        sync_before,
    );
    let apiserver_cpu_ms = per_change(cpu_after, cpu_before);
    let controller_peak = status_kib(controller.child.id(), "VmHWM");
    let agent_peak = status_kib(agent.child.id(), "VmHWM");
    let agent_anon = status_kib(agent.child.id(), "RssAnon");
    let agent_file = status_kib(agent.child.id(), "RssFile");

    let mut sorted = total.clone();
    sorted.sort_by(f64::total_cmp);
    let agent_sorted = {
        let mut v = agent_part.clone();
        v.sort_by(f64::total_cmp);
        v
    };
    let list = |v: &[f64]| {
        v.iter()
            .map(|ms| format!("{ms:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("e2e bench: every change, sorted (ms): {}", list(&sorted));
    println!(
        "e2e bench: the agent's part, sorted (ms): {}",
        list(&agent_sorted)
    );
    let mut slowest: Vec<usize> = (0..total.len()).collect();
    slowest.sort_by(|a, b| total[*b].total_cmp(&total[*a]));
    for k in slowest.into_iter().take(5) {
        println!(
            "e2e bench: slow change {k}: PATCH returned at {:.3} (unix), {:.1} ms: controller {:.1}, agent {:.1}",
            returned_at[k], total[k], controller_part[k], agent_part[k]
        );
    }
    let rows: Vec<(String, String)> = vec![
        (
            "Services x endpoints; nodes; agent mode".into(),
            format!("{services} x {per_service}; {nodes}; {mode} ({backend})"),
        ),
        (
            "controller: every Service plan written, from its start".into(),
            format!("{:.1} s", controller_wrote_all.as_secs_f64()),
        ),
        (
            "agent: first sync done, from its start".into(),
            format!("{:.1} s", agent_first_sync.as_secs_f64()),
        ),
        (
            format!(
                "change latency, PATCH returned -> kernel updated (median / p90 / p99 / max of {changes})"
            ),
            ms(&mut total),
        ),
        (
            "  of which controller: delivery, compute, write, delivery back".into(),
            ms(&mut controller_part),
        ),
        (
            "  of which agent: delivery, merge, dataplane".into(),
            ms(&mut agent_part),
        ),
        (
            "  agent merge / dataplane sync (mean per change)".into(),
            format!("{merge_ms:.2} / {sync_ms:.2} ms"),
        ),
        (
            "etcd WAL fsyncs during the changes: all / over 32 ms / over 64 ms".into(),
            counts_between(fsyncs_before, fsyncs_after),
        ),
        (
            "etcd backend commits during the changes: all / over 32 ms / over 64 ms".into(),
            counts_between(commits_before, commits_after),
        ),
        (
            "bytes one agent receives per change (median / max)".into(),
            format!(
                "{:.0} / {:.0}",
                quantile(&mut bytes, 0.5),
                quantile(&mut bytes, 1.0)
            ),
        ),
        (
            "  the EndpointSlice event kube-proxy receives (median)".into(),
            format!("{:.0}", quantile(&mut slice_bytes, 0.5)),
        ),
        (
            "objects: Service plans; largest event; agent start-up list".into(),
            format!(
                "{services}; {:.1} KiB; {:.1} MiB",
                largest as f64 / 1024.0,
                total_bytes as f64 / 1048576.0
            ),
        ),
        (
            format!(
                "API server CPU per change ({} Service plan watchers)",
                watchers + 1
            ),
            format!("{apiserver_cpu_ms:.1} ms"),
        ),
        (
            "peak memory: controller / agent (VmHWM)".into(),
            format!(
                "{:.0} / {:.0} MiB",
                controller_peak as f64 / 1024.0,
                agent_peak as f64 / 1024.0
            ),
        ),
        (
            "agent memory at the end: heap and stacks (RssAnon) / its binary (RssFile)".into(),
            format!(
                "{:.1} / {:.1} MiB",
                agent_anon as f64 / 1024.0,
                agent_file as f64 / 1024.0
            ),
        ),
    ];
    print_table(&rows);
    agent.stop().await;
    controller.stop().await;
    forwarder.stop().await;
    let _ = procs::delete_netns(&netns);
    drop(plane);
    if std::env::var_os("BENCH_KEEP_LOGS").is_some() {
        println!("e2e bench: logs kept in {}", workdir.display());
    } else {
        let _ = std::fs::remove_dir_all(&workdir);
    }
}
