//! The suite's state, its setup and clean-up, and the scenarios.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use proxyplan_crds::{IpFamily, MergedPlan, NodeProxyPlan, Protocol};
use proxyplan_tests::e2e::expect::{NodeView, differences, entry_key, expected_entries};
use proxyplan_tests::e2e::fixtures::{self, FakeNode, World};
use proxyplan_tests::e2e::{forward, kubeconfig};

use crate::cluster::{self, WAIT, wait_for};
use crate::procs::{self, Bins, Spawned};

/// Where each agent's forwarder listens inside its namespace.
const AGENT_API_ADDRESS: &str = "127.0.0.1:6443";

/// One fake node's namespace and processes.
pub struct AgentProcs {
    pub node: String,
    pub netns: String,
    pub forwarder: Spawned,
    pub agent: Spawned,
}

/// Everything a run has made, so that clean-up can undo it.
#[derive(Default)]
pub struct Created {
    pub namespace: bool,
    pub nodes: Vec<String>,
    pub services: Vec<String>,
    pub slices: Vec<String>,
    pub netns: Vec<String>,
}

/// The state of a run.
pub struct Suite {
    pub client: Client,
    pub kubeconfig: PathBuf,
    pub bins: Bins,
    pub world: World,
    pub workdir: PathBuf,
    pub created: Created,
    /// The Services as the server holds them (cluster IPs, node ports, LB status).
    pub services: Vec<Service>,
    /// The EndpointSlices as the suite last wrote them.
    pub slices: Vec<EndpointSlice>,
    /// UID of each fake node.
    pub node_uids: BTreeMap<String, String>,
    pub controller: Option<Spawned>,
    pub agents: Vec<AgentProcs>,
    /// Why the agents are not running, if they are not.
    pub agents_down: Option<String>,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

impl Suite {
    /// Reads the kubeconfig, finds the binaries, names this run.
    pub async fn new(kubeconfig: &Path) -> Result<Self, String> {
        let kubeconfig = kubeconfig
            .canonicalize()
            .map_err(|e| format!("{}: {e}", kubeconfig.display()))?;
        let client = proxyplan_crds::runtime::client(Some(&kubeconfig))
            .await
            .map_err(|e| e.to_string())?;
        let bins = Bins::locate()?;
        let world = World::new(&fixtures::random_run_id());
        let workdir = std::env::temp_dir().join(&world.namespace);
        std::fs::create_dir_all(&workdir).map_err(|e| format!("{}: {e}", workdir.display()))?;
        Ok(Self {
            client,
            kubeconfig,
            bins,
            world,
            workdir,
            created: Created::default(),
            services: Vec::new(),
            slices: Vec::new(),
            node_uids: BTreeMap::new(),
            controller: None,
            agents: Vec::new(),
            agents_down: None,
        })
    }

    fn ns(&self) -> &str {
        &self.world.namespace
    }

    fn view<'a>(&self, node: &'a FakeNode) -> NodeView<'a> {
        NodeView {
            name: &node.name,
            zone: Some(&node.zone),
        }
    }

    // ---------------------------------------------------------------- scenarios

    /// Installs the CRDs from the chart and waits until they are Established.
    pub async fn crds(&mut self) -> Result<(), String> {
        let dir = repo_root().join("charts/proxyplan/crds");
        let names = cluster::apply_crds(&self.client, &dir).await?;
        cluster::wait_established(&self.client, &names).await
    }

    /// Namespace, fake nodes, controller, Services and slices, agents.
    pub async fn setup(&mut self) -> Result<(), String> {
        self.refuse_a_live_installation().await?;
        let client = self.client.clone();
        self.created.namespace = true;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &self.world.namespace_object())
            .await
            .map_err(|e| format!("creating namespace {}: {e}", self.ns()))?;
        let nodes: Api<Node> = Api::all(client.clone());
        for node in self.world.nodes.clone() {
            self.created.nodes.push(node.name.clone());
            let created = nodes
                .create(&PostParams::default(), &self.world.node_object(&node))
                .await
                .map_err(|e| format!("creating Node {}: {e}", node.name))?;
            nodes
                .patch_status(
                    &node.name,
                    &PatchParams::default(),
                    &Patch::Merge(World::node_status_patch(&node)),
                )
                .await
                .map_err(|e| format!("patching the status of Node {}: {e}", node.name))?;
            self.node_uids
                .insert(node.name.clone(), created.metadata.uid.unwrap_or_default());
        }
        self.start_controller().await?;
        self.create_services().await?;
        if let Err(why) = self.start_agents().await {
            self.agents_down = Some(why);
        }
        Ok(())
    }

    /// Plans written by agents mean proxyplan already runs in this cluster; the suite's
    /// controller would fight it.
    async fn refuse_a_live_installation(&self) -> Result<(), String> {
        let plans = Api::<NodeProxyPlan>::all(self.client.clone())
            .list(&kube::api::ListParams::default())
            .await
            .map_err(|e| format!("listing NodeProxyPlans: {e}"))?;
        if let Some(live) = plans
            .items
            .iter()
            .find(|p| p.status.as_ref().is_some_and(|s| !s.conditions.is_empty()))
        {
            let name = live.name_any();
            if name.starts_with("proxyplan-e2e-") {
                return Err(format!(
                    "NodeProxyPlan {name} has an agent's status: an earlier run of this suite \
                     was killed before its clean-up; delete its fake Node {name} (and its \
                     namespace) and run again"
                ));
            }
            return Err(format!(
                "NodeProxyPlan {name} has an agent's status: proxyplan seems to be installed in \
                 this cluster, and the suite's own controller would fight it; use a disposable \
                 cluster without proxyplan"
            ));
        }
        Ok(())
    }

    async fn start_controller(&mut self) -> Result<(), String> {
        let metrics = procs::free_port()?;
        let health = procs::free_port()?;
        let health_address: SocketAddr = ([127, 0, 0, 1], health).into();
        let mut command = Command::new(&self.bins.controller);
        command
            .arg("run")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--min-sync-interval", "200ms"])
            .args(["--metrics-bind-address", &format!("127.0.0.1:{metrics}")])
            .args(["--health-bind-address", &health_address.to_string()])
            .args(["--leader-election-namespace", &self.world.namespace])
            .args(["--leader-election-lease", "proxyplan-e2e"])
            .args(["--identity", &format!("e2e-{}", self.world.run_id)])
            .args(["--cluster-cidr", fixtures::CLUSTER_CIDR])
            .args(["--log", "info"]);
        let log = self.workdir.join("controller.log");
        let controller =
            self.controller
                .insert(Spawned::start("controller", &mut command, log, false)?);
        wait_for("the controller's /readyz", WAIT, async || {
            if let Some(why) = controller.exited() {
                return Err(why);
            }
            match procs::http_status(health_address, "/readyz").await {
                Some(200) => Ok(()),
                other => Err(format!("/readyz on {health_address}: {other:?}")),
            }
        })
        .await
        .map_err(|e| match self.controller.as_ref() {
            // An exit already carries the log's tail.
            Some(c) if !e.contains(&c.log.display().to_string()) => {
                format!("{e}\n{}", c.log_tail(30))
            }
            _ => e,
        })
    }

    async fn create_services(&mut self) -> Result<(), String> {
        let services: Api<Service> = Api::namespaced(self.client.clone(), &self.world.namespace);
        for svc in self.world.services() {
            let name = svc.name_any();
            services
                .create(&PostParams::default(), &svc)
                .await
                .map_err(|e| {
                    let hint = if name == fixtures::EXTERNAL_IPS {
                        " (is the DenyServiceExternalIPs admission plugin on?)"
                    } else {
                        ""
                    };
                    format!("creating Service {name}: {e}{hint}")
                })?;
            self.created.services.push(name);
        }
        services
            .patch_status(
                fixtures::LB_LOCAL,
                &PatchParams::default(),
                &Patch::Merge(World::load_balancer_status_patch()),
            )
            .await
            .map_err(|e| format!("patching the status of Service {}: {e}", fixtures::LB_LOCAL))?;
        self.services.clear();
        for name in self.created.services.clone() {
            self.services.push(
                services
                    .get(&name)
                    .await
                    .map_err(|e| format!("reading Service {name}: {e}"))?,
            );
        }
        let ipv6 = self
            .services
            .iter()
            .find(|s| s.name_any() == fixtures::DUAL_STACK)
            .and_then(|s| s.spec.as_ref()?.cluster_ips.clone())
            .is_some_and(|ips| ips.iter().any(|ip| ip.contains(':')));
        if !ipv6 {
            println!(
                "e2e: note: the cluster gave Service {} no IPv6 cluster IP (not dual-stack): no \
                 IPv6 slice is created and no IPv6 entry is checked",
                fixtures::DUAL_STACK
            );
        }
        self.slices = self.world.slices(ipv6);
        let slices: Api<EndpointSlice> =
            Api::namespaced(self.client.clone(), &self.world.namespace);
        for slice in self.slices.clone() {
            let name = slice.name_any();
            slices
                .create(&PostParams::default(), &slice)
                .await
                .map_err(|e| format!("creating EndpointSlice {name}: {e}"))?;
            self.created.slices.push(name);
        }
        Ok(())
    }

    /// One network namespace per fake node, with a forwarder to the API server and an
    /// agent in it.
    async fn start_agents(&mut self) -> Result<(), String> {
        if !procs::is_root() {
            return Err(
                "the agents need root: each runs in its own network namespace (ip netns add / \
                 ip netns exec) so that it programs that namespace's iptables, not the host's; \
                 run the suite as root"
                    .to_owned(),
            );
        }
        procs::run("ip", &["netns", "list"])?;
        let local: SocketAddr = AGENT_API_ADDRESS
            .parse()
            .map_err(|e| format!("{AGENT_API_ADDRESS}: {e}"))?;
        let original = kube::config::Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| format!("{}: {e}", self.kubeconfig.display()))?;
        let (agent_config, api) = kubeconfig::for_agents(original, local)?;
        let agent_kubeconfig = self.workdir.join("agent-kubeconfig.json");
        write_private(
            &agent_kubeconfig,
            &serde_json::to_string(&agent_config).map_err(|e| e.to_string())?,
        )?;
        let socket = self.workdir.join("api.sock");
        forward::unix_to_tcp(&socket, api.host.clone(), api.port)
            .map_err(|e| format!("listening on {}: {e}", socket.display()))?;
        for (node, letter) in self.world.nodes.clone().iter().zip('a'..) {
            let netns = format!("pp-e2e-{}-{letter}", self.world.run_id);
            self.created.netns.push(netns.clone());
            procs::run("ip", &["netns", "add", &netns])?;
            procs::run(
                "ip",
                &["netns", "exec", &netns, "ip", "link", "set", "lo", "up"],
            )?;
            let forwarder = procs::start_forwarder(
                &netns,
                local,
                &socket,
                self.workdir.join(format!("forwarder-{letter}.log")),
            )
            .await?;
            let mut command = Command::new("ip");
            command
                .args(["netns", "exec", &netns])
                .arg(&self.bins.agent)
                .args(["run", "--node", &node.name])
                .arg("--kubeconfig")
                .arg(&agent_kubeconfig)
                .args(["--mode", "iptables"])
                .args(["--min-sync-interval", "200ms"])
                .args(["--sync-period", "10s"])
                .args(["--status-min-interval", "1s"])
                .args(["--healthz-bind-address", "127.0.0.1:10256"])
                .args(["--metrics-bind-address", "127.0.0.1:10249"])
                .arg("--state-dir")
                .arg(self.workdir.join(format!("agent-state-{letter}")))
                .args(["--log", "info"]);
            let agent = Spawned::start(
                &format!("agent of {}", node.name),
                &mut command,
                self.workdir.join(format!("agent-{letter}.log")),
                false,
            );
            let agent = match agent {
                Ok(agent) => agent,
                Err(err) => {
                    let mut forwarder = forwarder;
                    forwarder.stop().await;
                    return Err(err);
                }
            };
            self.agents.push(AgentProcs {
                node: node.name.clone(),
                netns,
                forwarder,
                agent,
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        for procs in &mut self.agents {
            if let Some(why) = procs.agent.exited() {
                return Err(why);
            }
        }
        Ok(())
    }

    /// Every fake node gets a plan with its identity and an owner reference to its Node.
    pub async fn plans_per_node(&mut self) -> Result<(), String> {
        for node in &self.world.nodes {
            let uid = self.node_uids.get(&node.name).cloned().unwrap_or_default();
            wait_for(&format!("NodeProxyPlan {}", node.name), WAIT, async || {
                let plan = cluster::existing_plan(&self.client, &node.name).await?;
                let spec = &plan.spec;
                let mut wrong = Vec::new();
                if spec.node_name != node.name {
                    wrong.push(format!("spec.nodeName {}", spec.node_name));
                }
                if spec.zone.as_deref() != Some(node.zone.as_str()) {
                    wrong.push(format!("spec.zone {:?}, want {}", spec.zone, node.zone));
                }
                if spec.addresses != [node.address.clone()] {
                    wrong.push(format!(
                        "spec.addresses {:?}, want [{}]",
                        spec.addresses, node.address
                    ));
                }
                if spec.pod_cidrs != [node.pod_cidr.clone()] {
                    wrong.push(format!(
                        "spec.podCIDRs {:?}, want [{}]",
                        spec.pod_cidrs, node.pod_cidr
                    ));
                }
                if !spec
                    .local_traffic
                    .cidrs
                    .iter()
                    .any(|c| c == fixtures::CLUSTER_CIDR)
                {
                    wrong.push(format!(
                        "spec.localTraffic.cidrs {:?}",
                        spec.local_traffic.cidrs
                    ));
                }
                let owned = plan
                    .owner_references()
                    .iter()
                    .any(|o| o.kind == "Node" && o.name == node.name && o.uid == uid);
                if !owned {
                    wrong.push(format!(
                        "no owner reference to Node {} (uid {uid}): {:?}",
                        node.name,
                        plan.owner_references()
                    ));
                }
                if wrong.is_empty() {
                    Ok(())
                } else {
                    Err(wrong.join("\n"))
                }
            })
            .await?;
        }
        Ok(())
    }

    /// Waits until `node`'s merged plan holds exactly the expected entries of the test
    /// namespace; returns the plan.
    async fn wait_merged(
        &self,
        node: &FakeNode,
        what: &str,
    ) -> Result<(NodeProxyPlan, MergedPlan), String> {
        let want = expected_entries(&self.services, &self.slices, self.view(node))?;
        wait_for(
            &format!("{what} in {}'s merged plan", node.name),
            WAIT,
            async || {
                let (plan, merged) = cluster::merged(&self.client, &node.name).await?;
                let diff = differences(&want, &merged, self.ns());
                if diff.is_empty() {
                    Ok((plan, merged))
                } else {
                    let shown = diff.len().min(20);
                    Err(format!(
                        "{} difference(s) (first {shown}):\n{}",
                        diff.len(),
                        diff[..shown].join("\n")
                    ))
                }
            },
        )
        .await
    }

    /// Every node's merged plan holds every Service kind with the right endpoints.
    pub async fn merged_plans(&mut self) -> Result<(), String> {
        for node in &self.world.nodes {
            self.wait_merged(node, "every Service of the test namespace")
                .await?;
        }
        Ok(())
    }

    fn agents_running(&mut self) -> Result<(), String> {
        if let Some(why) = &self.agents_down {
            return Err(format!("the agents are not running: {why}"));
        }
        for procs in &mut self.agents {
            if let Some(why) = procs.agent.exited() {
                return Err(why);
            }
        }
        Ok(())
    }

    fn agent_of(&self, node: &str) -> Option<&AgentProcs> {
        self.agents.iter().find(|a| a.node == node)
    }

    /// Waits until the agent of `node` reports Ready=True for the plan's revision and
    /// `check` accepts the plan.
    async fn wait_agent(
        &self,
        node: &str,
        what: &str,
        check: impl Fn(&NodeProxyPlan) -> Result<(), String>,
    ) -> Result<NodeProxyPlan, String> {
        let result = wait_for(&format!("{node}'s agent: {what}"), WAIT, async || {
            let plan = cluster::existing_plan(&self.client, node).await?;
            cluster::ready(&plan)?;
            check(&plan).map_err(|e| format!("{e}\n{}", cluster::describe_status(&plan)))?;
            Ok(plan)
        })
        .await;
        result.map_err(|e| match self.agent_of(node) {
            Some(procs) => format!("{e}\n{}", procs.agent.log_tail(20)),
            None => e,
        })
    }

    /// Waits until `netns`'s nat table DNATs to every endpoint in `endpoints`.
    async fn wait_kernel(&self, node: &str, endpoints: &[String]) -> Result<(), String> {
        let Some(netns) = self.agent_of(node).map(|a| a.netns.clone()) else {
            return Err(format!("no agent for {node}"));
        };
        wait_for(
            &format!("DNAT rules in {node}'s namespace {netns}"),
            WAIT,
            async || {
                let rules = procs::nat_rules(&netns);
                let missing: Vec<&String> = endpoints
                    .iter()
                    .filter(|ep| !rules.contains(&format!("--to-destination {ep}")))
                    .collect();
                if missing.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "no DNAT to {missing:?} in `iptables-save -t nat` ({} lines)",
                        rules.lines().count()
                    ))
                }
            },
        )
        .await
    }

    /// The health-check node port of the LoadBalancer (`externalTrafficPolicy: Local`)
    /// Service.
    fn health_check_node_port(&self) -> Result<u16, String> {
        self.services
            .iter()
            .find(|s| s.name_any() == fixtures::LB_LOCAL)
            .and_then(|s| s.spec.as_ref()?.health_check_node_port)
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| format!("Service {} has no healthCheckNodePort", fixtures::LB_LOCAL))
    }

    /// Waits until the health-check node port in `node`'s namespace answers `want`
    /// (200 with local endpoints, 503 without).
    async fn wait_health_check(&self, node: &str, want: u16) -> Result<(), String> {
        let port = self.health_check_node_port()?;
        let Some(netns) = self.agent_of(node).map(|a| a.netns.clone()) else {
            return Err(format!("no agent for {node}"));
        };
        wait_for(
            &format!("health-check node port {port} in {node}'s namespace to answer {want}"),
            WAIT,
            async || match procs::http_status_in(&netns, port).await {
                Some(status) if status == want => Ok(()),
                other => Err(format!("GET 127.0.0.1:{port}/ in {netns}: {other:?}")),
            },
        )
        .await
    }

    /// The `host:port` targets of the ClusterIP Service's http port, from the slices.
    fn cluster_ip_targets(&self) -> Vec<String> {
        self.slices
            .iter()
            .filter(|s| {
                s.address_type == "IPv4"
                    && s.labels()
                        .get(fixtures::SERVICE_NAME_LABEL)
                        .map(String::as_str)
                        == Some(fixtures::CLUSTER_IP)
            })
            .flat_map(|s| s.endpoints.iter())
            .filter_map(|e| e.addresses.first())
            .map(|ip| format!("{ip}:8080"))
            .collect()
    }

    /// Every agent applies its plan, reports Ready with the wanted revision, and its
    /// namespace's kernel holds the rules.
    pub async fn agents_ready(&mut self) -> Result<(), String> {
        self.agents_running()?;
        let targets = self.cluster_ip_targets();
        for node in &self.world.nodes {
            self.wait_agent(&node.name, "Ready with the plan's revision", |plan| {
                let mode = plan.status.as_ref().and_then(|s| s.mode.as_deref());
                if mode == Some("iptables") {
                    Ok(())
                } else {
                    Err(format!("status.mode {mode:?}, want iptables"))
                }
            })
            .await?;
            self.wait_kernel(&node.name, &targets).await?;
        }
        // The local endpoint of the ETP Local Service is on the first node only.
        for (i, node) in self.world.nodes.iter().enumerate() {
            self.wait_health_check(&node.name, if i == 0 { 200 } else { 503 })
                .await?;
        }
        Ok(())
    }

    async fn revisions(&self) -> Result<BTreeMap<String, String>, String> {
        let mut out = BTreeMap::new();
        for node in &self.world.nodes {
            let plan = cluster::existing_plan(&self.client, &node.name).await?;
            out.insert(node.name.clone(), plan.spec.revision);
        }
        Ok(out)
    }

    async fn patch_slice(&self, slice: &EndpointSlice) -> Result<(), String> {
        let name = slice.name_any();
        Api::<EndpointSlice>::namespaced(self.client.clone(), self.ns())
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "endpoints": slice.endpoints })),
            )
            .await
            .map(|_| ())
            .map_err(|e| format!("patching EndpointSlice {name}: {e}"))
    }

    /// An endpoint added to a Cluster-policy Service reaches every node through its one
    /// Service plan (no node plan changes), and every agent's kernel gets it.
    pub async fn endpoint_change(&mut self) -> Result<(), String> {
        let key = entry_key(
            self.ns(),
            fixtures::CLUSTER_IP,
            "http",
            Protocol::TCP,
            IpFamily::IPv4,
        );
        let plans_before = self.revisions().await?;
        let services = cluster::service_plans(&self.client).await?;
        let holders: Vec<String> = services
            .iter()
            .filter(|s| s.spec.service_ports.iter().any(|e| e.key == key))
            .map(proxyplan_crds::object_key)
            .collect();
        let (object, before) = match holders.as_slice() {
            [one] => (
                one.clone(),
                services
                    .iter()
                    .find(|s| proxyplan_crds::object_key(s) == *one)
                    .map(|s| s.spec.revision.clone())
                    .unwrap_or_default(),
            ),
            other => {
                return Err(format!(
                    "{key} is in {other:?}, want exactly one Service plan"
                ));
            }
        };
        let expected = format!("{}/{}", self.ns(), fixtures::CLUSTER_IP);
        if object != expected {
            return Err(format!(
                "{key} is in Service plan {object}, want {expected}"
            ));
        }
        let changed = self.world.add_endpoint(&mut self.slices)?;
        self.patch_slice(&changed).await?;
        for node in &self.world.nodes {
            self.wait_merged(node, "the added endpoint").await?;
        }
        let after = wait_for(
            &format!("a new revision of Service plan {object}"),
            WAIT,
            async || {
                let now = cluster::service_plans(&self.client)
                    .await?
                    .into_iter()
                    .find(|s| proxyplan_crds::object_key(s) == object)
                    .map(|s| s.spec.revision)
                    .ok_or_else(|| format!("Service plan {object} is gone"))?;
                if now == before {
                    Err(format!("still revision {now}"))
                } else {
                    Ok(now)
                }
            },
        )
        .await?;
        let plans_after = self.revisions().await?;
        let rewritten: Vec<&String> = plans_before
            .iter()
            .filter(|(n, r)| plans_after.get(*n) != Some(r))
            .map(|(n, _)| n)
            .collect();
        if !rewritten.is_empty() {
            return Err(format!(
                "an endpoint change of a Cluster-policy Service rewrote the plans of {rewritten:?} \
                 (only Service plan {object} should change)"
            ));
        }
        self.agents_running().map_err(|e| {
            format!("the controller side passed (Service plan {object} moved to {after}); {e}")
        })?;
        let targets = self.cluster_ip_targets();
        for node in &self.world.nodes {
            self.wait_kernel(&node.name, &targets).await?;
        }
        Ok(())
    }

    /// Moving an `externalTrafficPolicy: Local` endpoint from node a to node b rewrites
    /// exactly those two plans; their agents apply the new revisions.
    pub async fn local_move(&mut self) -> Result<(), String> {
        let [a, b, c] = [0, 1, 2].map(|i| self.world.nodes[i].clone());
        let before = self.revisions().await?;
        let changed = self.world.move_local_endpoint(&mut self.slices, b.index)?;
        self.patch_slice(&changed).await?;
        let mut after = BTreeMap::new();
        for node in [&a, &b] {
            let old = before.get(&node.name).cloned().unwrap_or_default();
            let (plan, _) = self.wait_merged(node, "the moved local endpoint").await?;
            if plan.spec.revision == old {
                return Err(format!(
                    "the plan of {} still has revision {old} although its local endpoints changed",
                    node.name
                ));
            }
            after.insert(node.name.clone(), plan.spec.revision);
        }
        let (plan_c, _) = self.wait_merged(&c, "unchanged entries").await?;
        if before.get(&c.name) != Some(&plan_c.spec.revision) {
            return Err(format!(
                "the plan of {} changed ({:?} -> {}) although none of its endpoint lists did",
                c.name,
                before.get(&c.name),
                plan_c.spec.revision
            ));
        }
        self.agents_running()
            .map_err(|e| format!("the controller side passed; {e}"))?;
        for (node, revision) in &after {
            self.wait_agent(node, &format!("revision {revision} applied"), |plan| {
                if plan.spec.revision == *revision {
                    Ok(())
                } else {
                    Err(format!("the plan moved on to {}", plan.spec.revision))
                }
            })
            .await?;
        }
        self.wait_health_check(&a.name, 503).await?;
        self.wait_health_check(&b.name, 200).await?;
        Ok(())
    }

    /// Deleting a fake Node deletes its plan; the others stay.
    pub async fn node_deletion(&mut self) -> Result<(), String> {
        let gone = self.world.nodes[2].name.clone();
        cluster::delete(&Api::<Node>::all(self.client.clone()), &gone).await?;
        wait_for(
            &format!("NodeProxyPlan {gone} to go away"),
            WAIT,
            async || match cluster::plan(&self.client, &gone).await? {
                None => Ok(()),
                Some(plan) => Err(format!(
                    "still there (deletionTimestamp {:?})",
                    plan.metadata.deletion_timestamp
                )),
            },
        )
        .await?;
        for node in &self.world.nodes[..2] {
            cluster::existing_plan(&self.client, &node.name).await?;
        }
        Ok(())
    }

    // ---------------------------------------------------------------- clean-up

    /// Undoes everything the run made, even after a failure; returns what could not be
    /// undone. Keeps the logs when `keep_logs`.
    pub async fn cleanup(&mut self, keep_logs: bool) -> Vec<String> {
        let mut problems = Vec::new();
        let client = self.client.clone();
        if self.created.namespace {
            let services: Api<Service> = Api::namespaced(client.clone(), self.ns());
            let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), self.ns());
            for name in &self.created.slices {
                problems.extend(cluster::delete(&slices, name).await.err());
            }
            for name in &self.created.services {
                problems.extend(cluster::delete(&services, name).await.err());
            }
        }
        let nodes: Api<Node> = Api::all(client.clone());
        for name in &self.created.nodes {
            problems.extend(cluster::delete(&nodes, name).await.err());
        }
        // While the controller still runs, let it remove the suite's entries and plans.
        if let Some(controller) = self.controller.as_mut()
            && controller.exited().is_none()
        {
            let ns = self.world.namespace.clone();
            let names = self.created.nodes.clone();
            let waited = wait_for(
                "the controller to drop the suite's plans and entries",
                Duration::from_secs(30),
                async || {
                    let mut left: Vec<String> = Vec::new();
                    for plan in cluster::service_plans(&client).await? {
                        if plan.metadata.namespace.as_deref() == Some(ns.as_str()) {
                            left.push(format!(
                                "Service plan {}",
                                proxyplan_crds::object_key(&plan)
                            ));
                        }
                    }
                    for name in &names {
                        if cluster::plan(&client, name).await?.is_some() {
                            left.push(format!("plan {name}"));
                        }
                    }
                    if left.is_empty() {
                        Ok(())
                    } else {
                        Err(left.join(", "))
                    }
                },
            )
            .await;
            problems.extend(waited.err());
        }
        for procs in &mut self.agents {
            procs.agent.stop().await;
            procs.forwarder.stop().await;
        }
        if let Some(controller) = self.controller.as_mut() {
            controller.stop().await;
        }
        for netns in &self.created.netns {
            problems.extend(procs::delete_netns(netns).err());
        }
        if self.created.namespace {
            problems.extend(
                cluster::delete(&Api::<Namespace>::all(client.clone()), self.ns())
                    .await
                    .err(),
            );
        }
        let _ = std::fs::remove_file(self.workdir.join("agent-kubeconfig.json"));
        let _ = std::fs::remove_file(self.workdir.join("api.sock"));
        let empty = std::fs::read_dir(&self.workdir).is_ok_and(|mut d| d.next().is_none());
        if keep_logs && !empty {
            println!("e2e: logs kept in {}", self.workdir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.workdir);
        }
        problems
    }
}

/// Writes a file only its owner can read (it holds credentials).
fn write_private(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("{}: {e}", path.display()))
}
