//! The fault suite's cluster: its own control plane, one fake node with an agent in a
//! network namespace, controller replicas, the objects the scenarios change, and the
//! table of what was measured.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use proxyplan_crds::{NodeProxyPlan, ServiceProxyPlan};
use proxyplan_tests::control_plane::ControlPlane;
use proxyplan_tests::e2e::{forward, kubeconfig};
use serde_json::json;

use crate::cluster::{self, wait_for};
use crate::procs::{self, Bins, Spawned};

/// Where the agent's forwarder listens inside its namespace.
const AGENT_API_ADDRESS: &str = "127.0.0.1:6443";
/// The field manager of the objects the suite writes.
pub const MANAGER: &str = "proxyplan-faults";
/// The fake node.
pub const NODE: &str = "pp-faults-node";
/// The cluster CIDR the controllers are given.
pub const CLUSTER_CIDR: &str = "10.250.0.0/16";

/// One measured row of the final table.
pub struct Row {
    pub fault: String,
    pub done: String,
    pub measured: String,
}

/// What the scenarios measured.
#[derive(Default)]
pub struct Report {
    pub rows: Vec<Row>,
}

impl Report {
    pub fn add(&mut self, fault: &str, done: &str, measured: &str) {
        println!("faults: {fault}: {measured}");
        self.rows.push(Row {
            fault: fault.to_owned(),
            done: done.to_owned(),
            measured: measured.to_owned(),
        });
    }

    /// The rows as a Markdown table.
    pub fn table(&self) -> String {
        let mut out = String::from("| fault | what was done | measured |\n|---|---|---|\n");
        for row in &self.rows {
            out.push_str(&format!(
                "| {} | {} | {} |\n",
                row.fault, row.done, row.measured
            ));
        }
        out
    }
}

/// A controller replica.
pub struct Controller {
    pub identity: String,
    pub process: Spawned,
    pub metrics: SocketAddr,
    pub health: SocketAddr,
}

/// The agent and its namespace.
pub struct Agent {
    pub netns: String,
    pub forwarder: Spawned,
    pub process: Option<Spawned>,
    pub kubeconfig: PathBuf,
    pub healthz_port: u16,
}

/// The suite's state.
pub struct Faults {
    pub plane: ControlPlane,
    pub client: Client,
    pub bins: Bins,
    pub workdir: PathBuf,
    pub namespace: String,
    pub run_id: String,
    pub controllers: Vec<Controller>,
    pub agent: Option<Agent>,
    pub report: Report,
    /// Revision of the `web` slice's endpoint list, to make each change new.
    pub generation: u32,
    /// The agent's wall clock, when it runs under libfaketime: the file that holds its
    /// offset (`+1h`, `-10m`, `+0`), read at every read of the wall clock (libfaketime's
    /// cache would miss a step back until the stepped clock passed its expiry).
    pub agent_clock: Option<PathBuf>,
}

/// Where Debian's `faketime` package puts the library that shifts one process's wall
/// clock (`CLOCK_REALTIME` only: the monotonic clock, as in a real NTP step, is left).
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

impl Faults {
    /// Starts the control plane, installs the CRDs, creates the namespace and the node,
    /// the `web` Service and its slice, one controller and the agent; waits until the
    /// agent's kernel holds `web`.
    pub async fn start() -> Result<Self, String> {
        if !procs::is_root() {
            return Err(
                "the fault suite needs root: its agent runs in a network namespace".to_owned(),
            );
        }
        let bins = Bins::locate()?;
        let run_id = proxyplan_tests::e2e::fixtures::random_run_id();
        let workdir = std::env::temp_dir().join(format!("proxyplan-faults-{run_id}"));
        std::fs::create_dir_all(&workdir).map_err(|e| format!("{}: {e}", workdir.display()))?;
        let plane = ControlPlane::start(&workdir.join("control-plane"), false)?;
        println!(
            "faults: real kube-apiserver v1.36.2 in {} (up in {:.1}s)",
            plane.dir().display(),
            plane.started_in.as_secs_f64()
        );
        let client = proxyplan_crds::runtime::client(Some(&plane.kubeconfig()))
            .await
            .map_err(|e| e.to_string())?;
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let names = cluster::apply_crds(&client, &repo.join("charts/proxyplan/crds")).await?;
        cluster::wait_established(&client, &names).await?;
        let namespace = format!("pp-faults-{run_id}");
        let mut faults = Self {
            plane,
            client,
            bins,
            workdir,
            namespace,
            run_id,
            controllers: Vec::new(),
            agent: None,
            report: Report::default(),
            generation: 0,
            agent_clock: None,
        };
        faults.create_base().await?;
        faults.start_controller("a", "200ms").await?;
        faults.start_agent().await?;
        faults
            .wait_kernel(&["10.250.1.10:8080", "10.250.1.11:8080"], "web's endpoints")
            .await?;
        Ok(faults)
    }

    async fn create_base(&mut self) -> Result<(), String> {
        let namespace: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": self.namespace}
        }))
        .map_err(|e| e.to_string())?;
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .map_err(|e| format!("creating namespace: {e}"))?;
        self.create_node(NODE, "10.250.1.0/24", "192.0.2.10")
            .await?;
        self.create_service("web", &[("http", 80)], "ClusterIP")
            .await?;
        self.put_slice(
            "web",
            "web-1",
            &[("http", 8080)],
            &["10.250.1.10", "10.250.1.11"],
        )
        .await?;
        Ok(())
    }

    /// Creates Node `name` in zone-a with pod CIDR `pod_cidr` and InternalIP `address`
    /// (tainted so that nothing is scheduled on it).
    pub async fn create_node(
        &self,
        name: &str,
        pod_cidr: &str,
        address: &str,
    ) -> Result<(), String> {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": "zone-a"}},
            "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr],
                     "taints": [{"key": "proxyplan.dev/e2e-fake-node", "effect": "NoSchedule"}]}
        }))
        .map_err(|e| e.to_string())?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes
            .create(&PostParams::default(), &node)
            .await
            .map_err(|e| format!("creating Node {name}: {e}"))?;
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"addresses": [
                    {"type": "InternalIP", "address": address}]}})),
            )
            .await
            .map_err(|e| format!("patching Node {name}'s status: {e}"))?;
        Ok(())
    }

    /// Creates Service `name` of `kind` with `ports` (name, port → 8080).
    pub async fn create_service(
        &self,
        name: &str,
        ports: &[(&str, i32)],
        kind: &str,
    ) -> Result<Service, String> {
        let ports: Vec<serde_json::Value> = ports
            .iter()
            .map(|(port_name, port)| {
                json!({"name": port_name, "port": port, "targetPort": 8080, "protocol": "TCP"})
            })
            .collect();
        let service: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"type": kind, "ports": ports}
        }))
        .map_err(|e| e.to_string())?;
        self.services()
            .create(&PostParams::default(), &service)
            .await
            .map_err(|e| format!("creating Service {name}: {e}"))
    }

    /// Server-side applies EndpointSlice `slice` of Service `service` with `ports` and
    /// ready endpoints on the fake node.
    pub async fn put_slice(
        &self,
        service: &str,
        slice: &str,
        ports: &[(&str, i32)],
        addresses: &[&str],
    ) -> Result<(), String> {
        let object = slice_object(&self.namespace, service, slice, ports, addresses)?;
        Api::<EndpointSlice>::namespaced(self.client.clone(), &self.namespace)
            .patch(
                slice,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
            .map(|_| ())
            .map_err(|e| format!("applying EndpointSlice {slice}: {e}"))
    }

    pub fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn service_plans(&self) -> Api<ServiceProxyPlan> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn node_plans(&self) -> Api<NodeProxyPlan> {
        Api::all(self.client.clone())
    }

    /// Starts controller replica `name` (`--min-sync-interval interval`).
    pub async fn start_controller(&mut self, name: &str, interval: &str) -> Result<(), String> {
        let metrics = procs::free_port()?;
        let health = procs::free_port()?;
        let metrics: SocketAddr = ([127, 0, 0, 1], metrics).into();
        let health: SocketAddr = ([127, 0, 0, 1], health).into();
        let identity = format!("faults-{}-{name}", self.run_id);
        let mut command = Command::new(&self.bins.controller);
        command
            .arg("run")
            .arg("--kubeconfig")
            .arg(self.plane.kubeconfig())
            .args(["--min-sync-interval", interval])
            .args(["--metrics-bind-address", &metrics.to_string()])
            .args(["--health-bind-address", &health.to_string()])
            .args(["--leader-election-namespace", &self.namespace])
            .args(["--leader-election-lease", "proxyplan-faults"])
            .args(["--identity", &identity])
            .args(["--cluster-cidr", CLUSTER_CIDR])
            .args(["--rollout-slow-after", "2s"])
            .args(["--log", "info"]);
        let log = self.workdir.join(format!("controller-{name}.log"));
        let process = Spawned::start(&format!("controller {name}"), &mut command, log, false)?;
        self.controllers.push(Controller {
            identity,
            process,
            metrics,
            health,
        });
        let controller = self.controllers.last_mut().ok_or("no controller")?;
        wait_for(
            &format!("controller {name}'s /readyz"),
            cluster::WAIT,
            async || {
                if let Some(why) = controller.process.exited() {
                    return Err(why);
                }
                match procs::http_status(controller.health, "/readyz").await {
                    Some(200) => Ok(()),
                    other => Err(format!("/readyz: {other:?}")),
                }
            },
        )
        .await
    }

    /// The identity holding the controllers' Lease now, if any.
    pub async fn lease_holder(&self) -> Result<Option<String>, String> {
        let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            self.client.clone(),
            &self.namespace,
        )
        .get_opt("proxyplan-faults")
        .await
        .map_err(|e| format!("reading the Lease: {e}"))?;
        Ok(lease
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty()))
    }

    /// Starts the agent of [`NODE`] in a fresh network namespace (or again in its own).
    pub async fn start_agent(&mut self) -> Result<(), String> {
        if self.agent.is_none() {
            let local: SocketAddr = AGENT_API_ADDRESS
                .parse()
                .map_err(|e| format!("{AGENT_API_ADDRESS}: {e}"))?;
            let original = kube::config::Kubeconfig::read_from(self.plane.kubeconfig())
                .map_err(|e| e.to_string())?;
            let (config, api) = kubeconfig::for_agents(original, local)?;
            let path = self.workdir.join("agent-kubeconfig.json");
            std::fs::write(
                &path,
                serde_json::to_string(&config).map_err(|e| e.to_string())?,
            )
            .map_err(|e| format!("{}: {e}", path.display()))?;
            let socket = self.workdir.join("api.sock");
            forward::unix_to_tcp(&socket, api.host.clone(), api.port)
                .map_err(|e| format!("{}: {e}", socket.display()))?;
            let netns = format!("pp-faults-{}", self.run_id);
            procs::run("ip", &["netns", "add", &netns])?;
            procs::run(
                "ip",
                &["netns", "exec", &netns, "ip", "link", "set", "lo", "up"],
            )?;
            let forwarder =
                procs::start_forwarder(&netns, local, &socket, self.workdir.join("forwarder.log"))
                    .await?;
            self.agent = Some(Agent {
                netns,
                forwarder,
                process: None,
                kubeconfig: path,
                healthz_port: 10256,
            });
        }
        let agent = self.agent.as_mut().ok_or("no agent")?;
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &agent.netns]);
        if let Some(clock) = &self.agent_clock {
            command
                .arg("env")
                .arg(format!("LD_PRELOAD={LIBFAKETIME}"))
                .arg(format!("FAKETIME_TIMESTAMP_FILE={}", clock.display()))
                .args(["FAKETIME_NO_CACHE=1", "FAKETIME_DONT_FAKE_MONOTONIC=1"]);
        }
        command
            .arg(&self.bins.agent)
            .args(["run", "--node", NODE])
            .arg("--kubeconfig")
            .arg(&agent.kubeconfig)
            .args(["--mode", "iptables"])
            .args(["--min-sync-interval", "100ms"])
            .args(["--sync-period", "10s"])
            .args(["--status-min-interval", "1s"])
            .args(["--rollout-report-interval", "1s"])
            .args([
                "--healthz-bind-address",
                &format!("127.0.0.1:{}", agent.healthz_port),
            ])
            .args(["--metrics-bind-address", "127.0.0.1:10249"])
            .arg("--state-dir")
            .arg(self.workdir.join("agent-state"))
            .args(["--log", "info"]);
        let process = Spawned::start("agent", &mut command, self.workdir.join("agent.log"), false)?;
        agent.process = Some(process);
        Ok(())
    }

    /// Starts another agent, of node `node`, in a network namespace of its own (the
    /// first agent must be started: its API socket is shared).
    pub async fn start_extra_agent(&self, node: &str, suffix: &str) -> Result<Agent, String> {
        let first = self
            .agent
            .as_ref()
            .ok_or("the first agent is not started")?;
        let local: SocketAddr = AGENT_API_ADDRESS
            .parse()
            .map_err(|e| format!("{AGENT_API_ADDRESS}: {e}"))?;
        let netns = format!("pp-faults-{}-{suffix}", self.run_id);
        procs::run("ip", &["netns", "add", &netns])?;
        procs::run(
            "ip",
            &["netns", "exec", &netns, "ip", "link", "set", "lo", "up"],
        )?;
        let forwarder = procs::start_forwarder(
            &netns,
            local,
            &self.workdir.join("api.sock"),
            self.workdir.join(format!("forwarder-{suffix}.log")),
        )
        .await?;
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &netns])
            .arg(&self.bins.agent)
            .args(["run", "--node", node])
            .arg("--kubeconfig")
            .arg(&first.kubeconfig)
            .args(["--mode", "iptables"])
            .args(["--min-sync-interval", "100ms"])
            .args(["--status-min-interval", "1s"])
            .args(["--rollout-report-interval", "1s"])
            .args(["--healthz-bind-address", "127.0.0.1:10256"])
            .args(["--metrics-bind-address", "127.0.0.1:10249"])
            .arg("--state-dir=")
            .args(["--log", "info"]);
        let process = Spawned::start(
            &format!("agent {suffix}"),
            &mut command,
            self.workdir.join(format!("agent-{suffix}.log")),
            false,
        )?;
        Ok(Agent {
            netns,
            forwarder,
            process: Some(process),
            kubeconfig: first.kubeconfig.clone(),
            healthz_port: 10256,
        })
    }

    /// The agent's namespace.
    pub fn netns(&self) -> Result<String, String> {
        self.agent
            .as_ref()
            .map(|a| a.netns.clone())
            .ok_or_else(|| "no agent".to_owned())
    }

    /// Waits until the agent's nat table DNATs to every `target` (`ip:port`).
    pub async fn wait_kernel(&mut self, targets: &[&str], what: &str) -> Result<Duration, String> {
        let netns = self.netns()?;
        let started = Instant::now();
        let result = wait_for(
            &format!("{what} in the agent's kernel"),
            cluster::WAIT,
            async || {
                let rules = procs::nat_rules(&netns);
                let missing: Vec<&&str> = targets
                    .iter()
                    .filter(|t| !rules.contains(&format!("--to-destination {t}")))
                    .collect();
                if missing.is_empty() {
                    Ok(())
                } else {
                    Err(format!("no DNAT to {missing:?}"))
                }
            },
        )
        .await;
        match result {
            Ok(()) => Ok(started.elapsed()),
            Err(e) => Err(format!("{e}\n{}", self.agent_log_tail())),
        }
    }

    /// Polls the agent's nat table every 10 ms until it DNATs to `target`; returns how
    /// long that took (fails after `timeout`).
    pub async fn time_until_kernel_has(
        &self,
        target: &str,
        timeout: Duration,
    ) -> Result<Duration, String> {
        let netns = self.netns()?;
        let started = Instant::now();
        let needle = format!("--to-destination {target}");
        loop {
            let netns = netns.clone();
            let rules = tokio::task::spawn_blocking(move || procs::nat_rules(&netns))
                .await
                .unwrap_or_default();
            if rules.contains(&needle) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                return Err(format!(
                    "no DNAT to {target} in the agent's kernel after {:.1}s\n{}",
                    timeout.as_secs_f64(),
                    self.agent_log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn agent_log_tail(&self) -> String {
        self.agent
            .as_ref()
            .and_then(|a| a.process.as_ref())
            .map_or_else(String::new, |p| p.log_tail(20))
    }

    /// A new endpoint address for `web` (each call another), with the slice moved to
    /// hold it beside the two first ones.
    pub async fn add_web_endpoint(&mut self) -> Result<String, String> {
        self.generation += 1;
        let address = format!("10.250.1.{}", 20 + self.generation % 200);
        self.put_slice(
            "web",
            "web-1",
            &[("http", 8080)],
            &["10.250.1.10", "10.250.1.11", &address],
        )
        .await?;
        Ok(format!("{address}:8080"))
    }

    /// The Service plans of Service `service`, by name.
    pub async fn plans_of(
        &self,
        service: &str,
    ) -> Result<BTreeMap<String, ServiceProxyPlan>, String> {
        let list = self
            .service_plans()
            .list(
                &kube::api::ListParams::default()
                    .labels(&format!("{}={service}", proxyplan_crds::SERVICE_LABEL)),
            )
            .await
            .map_err(|e| format!("listing Service plans of {service}: {e}"))?;
        Ok(list.items.into_iter().map(|p| (p.name_any(), p)).collect())
    }

    /// The sum of the API server's samples of metric `name` that carry every label of
    /// `labels` (`key="value"`).
    pub async fn apiserver_metric(&self, name: &str, labels: &[&str]) -> Result<f64, String> {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let text = self
            .client
            .request_text(request)
            .await
            .map_err(|e| format!("the API server's /metrics: {e}"))?;
        Ok(summed(&text, &format!("{name}{{"), labels))
    }

    /// A controller's metric value (the first series starting with `series`).
    pub async fn controller_metric(&self, index: usize, series: &str) -> Result<f64, String> {
        let controller = self.controllers.get(index).ok_or("no such controller")?;
        let text = http_get_text(controller.metrics, "/metrics").await?;
        Ok(summed(&text, series, &[]))
    }

    /// Stops every process and removes what the suite made (the control plane goes on
    /// drop). Logs stay when something failed.
    pub async fn stop(&mut self, failed: bool) {
        for controller in &mut self.controllers {
            let _ = Command::new("kill")
                .args(["-CONT", &controller.process.child.id().to_string()])
                .status();
            controller.process.stop().await;
        }
        if let Some(agent) = self.agent.as_mut() {
            if let Some(process) = agent.process.as_mut() {
                process.stop().await;
            }
            agent.forwarder.stop().await;
            let _ = procs::delete_netns(&agent.netns);
        }
        if failed {
            println!("faults: logs kept in {}", self.workdir.display());
        }
    }
}

/// An EndpointSlice object for the suite.
pub fn slice_object(
    namespace: &str,
    service: &str,
    slice: &str,
    ports: &[(&str, i32)],
    addresses: &[&str],
) -> Result<EndpointSlice, String> {
    let ports: Vec<serde_json::Value> = ports
        .iter()
        .map(|(name, port)| json!({"name": name, "port": port, "protocol": "TCP"}))
        .collect();
    let endpoints: Vec<serde_json::Value> = addresses
        .iter()
        .map(|ip| {
            json!({"addresses": [ip], "conditions": {"ready": true, "serving": true,
                   "terminating": false}, "nodeName": NODE, "zone": "zone-a"})
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": slice, "namespace": namespace, "labels": {
            "kubernetes.io/service-name": service,
            "endpointslice.kubernetes.io/managed-by": "proxyplan-faults"}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": endpoints
    }))
    .map_err(|e| e.to_string())
}

/// The sum of the samples in a Prometheus exposition whose line starts with `prefix` and
/// carries every label of `labels` (`key="value"`).
fn summed(text: &str, prefix: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix) && labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `GET path` on `address`: the body, when it answers 200.
pub async fn http_get_text(address: SocketAddr, path: &str) -> Result<String, String> {
    http_text(address, "GET", path, None).await
}

/// `POST path` on `address` with a JSON body: the answer's body, when it answers 200.
pub async fn http_post_json(
    address: SocketAddr,
    path: &str,
    body: &serde_json::Value,
) -> Result<String, String> {
    http_text(address, "POST", path, Some(body.to_string())).await
}

/// One HTTP/1.0 request (so the answer is never chunked): the body, when it answers 200.
async fn http_text(
    address: SocketAddr,
    method: &'static str,
    path: &str,
    body: Option<String>,
) -> Result<String, String> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(2))
            .map_err(|e| format!("{address}: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        let request = match &body {
            None => format!("{method} {path} HTTP/1.0\r\nHost: {address}\r\n\r\n"),
            Some(body) => format!(
                "{method} {path} HTTP/1.0\r\nHost: {address}\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            ),
        };
        stream
            .write_all(request.as_bytes())
            .map_err(|e| e.to_string())?;
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        if head.split_whitespace().nth(1) == Some("200") {
            Ok(body.to_owned())
        } else {
            Err(format!("{method} {address}{path}: {head}"))
        }
    })
    .await
    .map_err(|e| e.to_string())?
}
