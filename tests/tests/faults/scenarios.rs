//! The fault scenarios: each does to the cluster what real clusters do, checks that
//! proxyplan keeps serving, and records what it measured.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::cluster::{WAIT, wait_for};
use crate::harness::{Faults, LIBFAKETIME, MANAGER, NODE, http_post_json, slice_object};
use crate::procs;

/// The second node of the rollout scenario.
const NODE_B: &str = "pp-faults-node-b";

/// How long the API server stays away.
const OUTAGE: Duration = Duration::from_secs(20);
/// How long the partition scenario cuts the agent off: long enough that TCP's
/// retransmission of what the API server sent into it has backed off past 40 s.
const PARTITION: Duration = Duration::from_secs(60);
/// The controllers' lease duration.
const LEASE: Duration = Duration::from_secs(15);

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn signal(process: &procs::Spawned, signal: &str) -> Result<(), String> {
    procs::run("kill", &[signal, &process.child.id().to_string()]).map(|_| ())
}

/// The nat table of `netns` without comments (`iptables-save` stamps its runs) and
/// packet counters (traffic moves them).
fn nat_rules_stable(netns: &str) -> String {
    procs::nat_rules(netns)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| match l.split_once(" [") {
            Some((policy, _)) if l.starts_with(':') => policy,
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `GET path` on `127.0.0.1:port` inside `netns` (bash's `/dev/tcp`): the body.
fn get_in(netns: &str, port: u16, path: &str) -> String {
    let script = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET {path} HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3"
    );
    procs::run(
        "ip",
        &[
            "netns", "exec", netns, "timeout", "5", "bash", "-c", &script,
        ],
    )
    .unwrap_or_default()
}

/// The lines only one side has, marked `-` and `+`.
fn line_diff(before: &str, after: &str) -> String {
    let old: std::collections::BTreeSet<&str> = before.lines().collect();
    let new: std::collections::BTreeSet<&str> = after.lines().collect();
    old.difference(&new)
        .map(|l| format!("- {l}"))
        .chain(new.difference(&old).map(|l| format!("+ {l}")))
        .collect::<Vec<_>>()
        .join("\n")
}

use proxyplan_tests::metrics::sample as metric;

/// The label the API server's storage metrics give Service plans.
const SERVICE_PLANS: &str = "resource=\"serviceproxyplans\"";

impl Faults {
    /// The agent is killed and started again on the same kernel: the rules stay while it
    /// is gone, and its first sync after the restart changes nothing.
    pub async fn agent_restart(&mut self) -> Result<(), String> {
        let netns = self.netns()?;
        let before = nat_rules_stable(&netns);
        if !before.contains("--to-destination 10.250.1.10:8080") {
            return Err(format!("web is not programmed:\n{before}"));
        }
        let agent = self.agent.as_mut().ok_or("no agent")?;
        if let Some(mut process) = agent.process.take() {
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let while_gone = nat_rules_stable(&netns);
        if while_gone != before {
            return Err("the rules changed while the agent was gone".to_owned());
        }
        // Nothing else lists Service plans meanwhile (the controller lists only when it
        // starts): every list from here on is the restarted agent's.
        let cache_before = self.cache_lists().await?;
        let etcd_before = self.etcd_lists().await?;
        let started = Instant::now();
        self.start_agent().await?;
        let port = self.agent.as_ref().map_or(10256, |a| a.healthz_port);
        self.first_sync(&netns).await?;
        let took = started.elapsed();
        let after = nat_rules_stable(&netns);
        if after != before {
            return Err(format!(
                "the restarted agent changed the rules:\n{}",
                line_diff(&before, &after)
            ));
        }
        let livez = get_in(&netns, port, "/livez");
        if !livez.starts_with("HTTP/1.1 200") && !livez.starts_with("HTTP/1.0 200") {
            return Err(format!("/livez after the restart: {livez}"));
        }
        let cache_lists = self.cache_lists().await? - cache_before;
        let etcd_lists = self.etcd_lists().await? - etcd_before;
        if cache_lists < 1.0 || etcd_lists > 0.0 {
            return Err(format!(
                "the restarted agent's list of the Service plans: {cache_lists} from the API \
                 server's watch cache, {etcd_lists} from etcd (want at least one, and none)"
            ));
        }
        self.report.add(
            "agent restart",
            "SIGKILL the agent, 1 s later start it again on the same kernel",
            &format!(
                "rules unchanged while it was gone and after; first sync {} after start; \
                 nat table identical (nothing rewritten); its Service plans listed from the \
                 API server's watch cache ({cache_lists} lists), none from etcd",
                secs(took)
            ),
        );
        Ok(())
    }

    /// A list of more Service plans than the queue between its decoder and its consumer
    /// holds, as the agent lists them ([`proxyplan_crds::watch::cached`]), in a quiet
    /// cluster: none written since etcd was compacted past their last write (as the API
    /// server does every 5 minutes). Every object once, between `Init` and `InitDone`, in
    /// one response the API server serves from its watch cache (none read from etcd);
    /// then the watch goes on from the list's version, with an object created and one
    /// deleted. (Listed in pages, as agents did before, every continuation failed there
    /// with `410 Expired`: the cache's version, which etcd before 3.4.31 never moves
    /// without a write, was older than the compaction, and the agent listed again and
    /// again, never starting.)
    pub async fn cached_list(&mut self) -> Result<(), String> {
        use futures::{StreamExt, TryStreamExt, stream};
        use kube::runtime::watcher::Event;
        use proxyplan_crds::watch::{QUEUE, Selector, cached};
        use proxyplan_crds::{ServiceProxyPlan, ServiceProxyPlanSpec};

        const COUNT: u32 = 1_100;
        const _: () = assert!(COUNT as usize > 4 * QUEUE);
        let label = "proxyplan.dev/list-test";
        let api: Api<ServiceProxyPlan> = Api::namespaced(self.client.clone(), &self.namespace);
        let object = |name: String| {
            let mut plan = ServiceProxyPlan::new(
                &name,
                ServiceProxyPlanSpec {
                    revision: "list-test".to_owned(),
                    service_ports: Vec::new(),
                    summary: None,
                },
            );
            plan.metadata.labels = Some([(label.to_owned(), "yes".to_owned())].into());
            plan
        };
        stream::iter((0..COUNT).map(|i| {
            let (api, plan) = (api.clone(), object(format!("listed-{i:04}")));
            async move {
                api.create(&PostParams::default(), &plan)
                    .await
                    .map_err(|e| format!("creating Service plan {i}: {e}"))
            }
        }))
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
        // Something else written after them, then etcd compacted there.
        let marker: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(self.client.clone(), &self.namespace);
        marker
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "after-the-plans"}}))
                    .map_err(|e| e.to_string())?,
            )
            .await
            .map_err(|e| format!("creating ConfigMap after-the-plans: {e}"))?;
        let compacted = self.compact_etcd().await?;

        let cache_before = self.cache_lists().await?;
        let etcd_before = self.etcd_lists().await?;
        let all: Api<ServiceProxyPlan> = Api::all(self.client.clone());
        let mut events = Box::pin(cached(all, Selector::labels(&format!("{label}=yes"))));
        let mut next = async || {
            tokio::time::timeout(WAIT, events.next())
                .await
                .map_err(|_| format!("no watch event within {}", secs(WAIT)))?
                .ok_or("the watch ended")?
                .map_err(|e| format!("the watch failed: {e}"))
        };
        if !matches!(next().await?, Event::Init) {
            return Err("the list did not begin with Init".to_owned());
        }
        let mut listed = std::collections::BTreeSet::new();
        loop {
            match next().await? {
                Event::InitApply(plan) => {
                    if !listed.insert(plan.name_any()) {
                        return Err(format!("{} listed twice", plan.name_any()));
                    }
                }
                Event::InitDone => break,
                other => return Err(format!("during the list: {other:?}")),
            }
        }
        let expected: std::collections::BTreeSet<String> =
            (0..COUNT).map(|i| format!("listed-{i:04}")).collect();
        if listed != expected {
            return Err(format!(
                "listed {} Service plans, want {COUNT}: missing {:?}",
                listed.len(),
                expected.difference(&listed).take(5).collect::<Vec<_>>()
            ));
        }
        let from_cache = self.cache_lists().await? - cache_before;
        let from_etcd = self.etcd_lists().await? - etcd_before;
        #[allow(clippy::float_cmp, reason = "counters")]
        if from_cache != 1.0 || from_etcd > 0.0 {
            return Err(format!(
                "{COUNT} Service plans listed in {from_cache} lists from the watch cache and \
                 {from_etcd} from etcd (want one from the cache, none from etcd)"
            ));
        }

        // The watch goes on from the list's version.
        api.create(&PostParams::default(), &object("listed-new".to_owned()))
            .await
            .map_err(|e| format!("creating listed-new: {e}"))?;
        match next().await? {
            Event::Apply(plan) if plan.name_any() == "listed-new" => {}
            other => return Err(format!("after a create: {other:?}")),
        }
        api.delete("listed-0000", &DeleteParams::default())
            .await
            .map_err(|e| format!("deleting listed-0000: {e}"))?;
        match next().await? {
            Event::Delete(plan) if plan.name_any() == "listed-0000" => {}
            other => return Err(format!("after a delete: {other:?}")),
        }
        api.delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("{label}=yes")),
        )
        .await
        .map_err(|e| format!("deleting the listed Service plans: {e}"))?;
        marker
            .delete("after-the-plans", &DeleteParams::default())
            .await
            .map_err(|e| format!("deleting ConfigMap after-the-plans: {e}"))?;
        self.report.add(
            "a large list in a quiet cluster",
            &format!(
                "{COUNT} Service plans listed as the agent lists them after etcd was compacted \
                 past their last write (revision {compacted}), then one created, one deleted"
            ),
            "every one once, in one response from the API server's watch cache, none read \
             from etcd; the watch then saw the create and the delete",
        );
        Ok(())
    }

    /// Compacts etcd at its current revision, through its HTTP gateway; returns the
    /// revision.
    async fn compact_etcd(&self) -> Result<u64, String> {
        let etcd = self.plane.etcd_address()?;
        let range = http_post_json(etcd, "/v3/kv/range", &json!({"key": "Lw=="})).await?;
        let revision: u64 = serde_json::from_str::<serde_json::Value>(&range)
            .ok()
            .and_then(|r| r.pointer("/header/revision")?.as_str()?.parse().ok())
            .ok_or_else(|| format!("etcd's revision, from {range}"))?;
        http_post_json(
            etcd,
            "/v3/kv/compaction",
            &json!({"revision": revision.to_string(), "physical": true}),
        )
        .await?;
        Ok(revision)
    }

    /// Lists of Service plans the API server served from its watch cache.
    async fn cache_lists(&self) -> Result<f64, String> {
        self.apiserver_metric("apiserver_cache_list_total", &[SERVICE_PLANS])
            .await
    }

    /// Lists of Service plans the API server read from etcd.
    async fn etcd_lists(&self) -> Result<f64, String> {
        self.apiserver_metric(
            "etcd_requests_total",
            &["operation=\"list\"", SERVICE_PLANS],
        )
        .await
    }

    /// The node plan's Ready condition: status, reason, message.
    async fn node_ready(&self) -> Result<Option<(String, String, String)>, String> {
        let plan = self
            .node_plans()
            .get(NODE)
            .await
            .map_err(|e| e.to_string())?;
        Ok(plan
            .status
            .iter()
            .flat_map(|s| s.conditions.iter())
            .find(|c| c.type_ == "Ready")
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone())))
    }

    /// An agent restarted while its plan is refused (a hand edit the agent's validation
    /// refuses; the controller, which would repair it, is down) keeps the kernel as it was,
    /// stays live, and its health-check node port answers as before the restart (from its
    /// record, since the kernel still holds its rules). The controller's return repairs
    /// the plan and the agent applies it.
    pub async fn agent_restart_with_a_refused_plan(&mut self) -> Result<(), String> {
        let netns = self.netns()?;
        let service: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "local-lb", "namespace": self.namespace},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
        }))
        .map_err(|e| e.to_string())?;
        let created = self
            .services()
            .create(&PostParams::default(), &service)
            .await
            .map_err(|e| format!("creating Service local-lb: {e}"))?;
        let hc_port = created
            .spec
            .and_then(|s| s.health_check_node_port)
            .and_then(|p| u16::try_from(p).ok())
            .ok_or("the API server allocated no healthCheckNodePort")?;
        self.put_slice(
            "local-lb",
            "local-lb-1",
            &[("http", 8080)],
            &["10.250.1.30"],
        )
        .await?;
        let answer = |netns: &str| get_in(netns, hc_port, "/");
        wait_for("local-lb's health-check node port", WAIT, async || {
            let body = answer(&netns);
            if body.contains(" 200 ") && body.contains("\"localEndpoints\": 1") {
                Ok(())
            } else {
                Err(format!("answered {body:?}"))
            }
        })
        .await?;
        let before = nat_rules_stable(&netns);

        // The controller goes; the node plan gets an edit the agent refuses.
        for mut controller in std::mem::take(&mut self.controllers) {
            let _ = controller.process.child.kill();
            let _ = controller.process.child.wait();
        }
        self.node_plans()
            .patch(
                NODE,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"podCIDRs": ["10.250.1.0/99"]}})),
            )
            .await
            .map_err(|e| format!("editing the node plan: {e}"))?;
        let agent = self.agent.as_mut().ok_or("no agent")?;
        if let Some(mut process) = agent.process.take() {
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
        let gone = answer(&netns);
        if !gone.is_empty() {
            return Err(format!("the port answered with the agent gone: {gone:?}"));
        }
        let started = Instant::now();
        self.start_agent().await?;
        // The killed agent refused the edit too, before it went: only the restarted one,
        // which applied nothing yet, says the kernel keeps what it held at its start.
        let refused = wait_for(
            "the restarted agent to refuse its plan",
            WAIT,
            async || match self.node_ready().await? {
                Some((_, reason, message))
                    if reason == "InvalidPlan" && message.contains("when this agent started") =>
                {
                    Ok(message)
                }
                other => Err(format!("Ready {other:?}")),
            },
        )
        .await
        .map_err(|e| format!("{e}\n{}", self.agent_log_tail()));
        let took = started.elapsed();
        let served = answer(&netns);
        let port = self.agent.as_ref().map_or(10256, |a| a.healthz_port);
        let livez = get_in(&netns, port, "/livez");
        let after = nat_rules_stable(&netns);
        // Once more over an empty kernel (a firewall reload, a `cleanup` that kept
        // /run/proxyplan): the record is kept, the rules are not, so the restarted agent
        // must not answer from it; its ports open with its first sync.
        let emptied = self.restart_over_an_empty_kernel(&netns, hc_port).await;
        // The controller comes back (also after a failed check: the scenarios after this
        // one need it) and repairs the plan; the agent applies it.
        let repaired = Instant::now();
        self.start_controller("a", "200ms").await?;
        let refused = refused?;
        emptied?;
        if !(served.contains(" 200 ") && served.contains("\"localEndpoints\": 1")) {
            return Err(format!(
                "the health-check port after the restart: {served:?}\n{}",
                self.agent_log_tail()
            ));
        }
        if !(livez.starts_with("HTTP/1.1 200") || livez.starts_with("HTTP/1.0 200")) {
            return Err(format!("/livez with a refused plan: {livez}"));
        }
        if after != before {
            return Err(format!(
                "the kernel changed under a refused plan:\n{}",
                line_diff(&before, &after)
            ));
        }
        wait_for(
            "the repaired plan to be applied",
            WAIT,
            async || match self.node_ready().await? {
                Some((status, reason, _)) if reason == "Synced" && status == "True" => Ok(()),
                other => Err(format!("Ready {other:?}")),
            },
        )
        .await?;
        let applied = repaired.elapsed();
        let served_again = answer(&netns);
        if !served_again.contains(" 200 ") {
            return Err(format!(
                "the health-check port once repaired: {served_again:?}"
            ));
        }
        self.report.add(
            "agent restart, plan refused",
            "controller down, node plan edited to an invalid podCIDR, SIGKILL the agent and \
             start it again; then start the controller",
            &format!(
                "refused ({}) {} after start; kernel unchanged; /livez 200; health-check \
                 node port answered 200 with localEndpoints 1 from the record throughout; \
                 restarted again over an emptied kernel (state directory kept): port closed; \
                 repaired and applied {} after the controller was started (port 200 again)",
                refused.lines().next().unwrap_or_default(),
                secs(took),
                secs(applied)
            ),
        );
        Ok(())
    }

    /// Kills the agent, removes everything it owns from the kernel (its state directory
    /// stays), starts it again with its plan still refused: the health-check node port
    /// must stay closed, since the kernel no longer serves what the record describes.
    async fn restart_over_an_empty_kernel(
        &mut self,
        netns: &str,
        hc_port: u16,
    ) -> Result<(), String> {
        let agent = self.agent.as_mut().ok_or("no agent")?;
        if let Some(mut process) = agent.process.take() {
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
        let agent_bin = self.bins.agent.to_string_lossy().into_owned();
        procs::run(
            "ip",
            &[
                "netns", "exec", netns, &agent_bin, "cleanup", "--mode", "iptables",
            ],
        )?;
        let log = self.workdir.join("agent.log");
        let lost = "the kernel lost the previous agent's rules";
        let said = |log: &std::path::Path| {
            std::fs::read_to_string(log).map_or(0, |text| text.matches(lost).count())
        };
        let before = said(&log);
        self.start_agent().await?;
        wait_for(
            "the agent restarted over an empty kernel to find its rules gone",
            WAIT,
            async || {
                if said(&log) > before {
                    Ok(())
                } else {
                    Err(format!("its log does not say {lost:?} yet"))
                }
            },
        )
        .await
        .map_err(|e| format!("{e}\n{}", self.agent_log_tail()))?;
        // The port would open together with the refusal (both follow the first read).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let served = get_in(netns, hc_port, "/");
        if served.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the health-check node port answered over an empty kernel, from the \
                 previous agent's record: {served:?}\n{}",
                self.agent_log_tail()
            ))
        }
    }

    /// A Service whose status the API server accepted but strict types cannot read is
    /// planned, and a Service created right after it is planned as promptly.
    pub async fn odd_objects(&mut self) -> Result<(), String> {
        self.create_service("odd", &[("http", 81)], "ClusterIP")
            .await?;
        let patched = self
            .services()
            .patch_status(
                "odd",
                &PatchParams::default(),
                // No lastTransitionTime: the API server stores it as null, which strict
                // types (k8s-openapi's Condition) refuse to decode.
                &Patch::Merge(json!({"status": {"conditions": [{
                    "type": "Odd", "status": "True", "reason": "Test", "message": ""}]}})),
            )
            .await;
        // The API server stores it; our own strict client cannot even read its answer.
        let accepted = match &patched {
            Ok(_) => true,
            Err(kube::Error::SerdeError(err)) => err.to_string().contains("null"),
            Err(_) => false,
        };
        let started = Instant::now();
        self.create_service("after-odd", &[("http", 82)], "ClusterIP")
            .await?;
        self.put_slice(
            "after-odd",
            "after-odd-1",
            &[("http", 8080)],
            &["10.250.1.30"],
        )
        .await?;
        for service in ["odd", "after-odd"] {
            wait_for(
                &format!("the Service plan of {service}"),
                WAIT,
                async || {
                    let plans = self.plans_of(service).await?;
                    if plans.is_empty() {
                        Err("none yet".to_owned())
                    } else {
                        Ok(())
                    }
                },
            )
            .await?;
        }
        let took = started.elapsed();
        if took > Duration::from_secs(5) {
            return Err(format!("after-odd took {} to be planned", secs(took)));
        }
        self.report.add(
            "odd object",
            &format!(
                "Service status condition without lastTransitionTime (API server {}), then \
                 another Service",
                if accepted {
                    "accepted it"
                } else {
                    "refused it"
                }
            ),
            &format!(
                "both planned; the next Service's plan written {} after it was created",
                secs(took)
            ),
        );
        if !accepted {
            return Err(format!(
                "the API server refused the odd status, nothing was tried: {patched:?}"
            ));
        }
        Ok(())
    }

    /// Someone edits a Service plan and a node plan by hand, keeping `spec.revision`:
    /// the controller notices by content and writes them back whole.
    pub async fn hand_edits(&mut self) -> Result<(), String> {
        let plans = self.plans_of("web").await?;
        let web = plans.get("web").ok_or("no Service plan web")?;
        let original = web.spec.clone();
        let mut edited =
            serde_json::to_value(&web.spec.service_ports).map_err(|e| e.to_string())?;
        edited[0]["clusterEndpoints"]
            .as_array_mut()
            .ok_or("no clusterEndpoints")?
            .push(json!({"ip": "10.250.9.9", "port": 8080}));
        edited[0]["zoneEndpoints"] = json!([{"zone": "zone-a", "endpoints": []}]);
        let started = Instant::now();
        self.service_plans()
            .patch(
                "web",
                &PatchParams {
                    field_manager: Some("kubectl-edit".to_owned()),
                    ..PatchParams::default()
                },
                &Patch::Merge(json!({"spec": {"servicePorts": edited}})),
            )
            .await
            .map_err(|e| format!("editing the Service plan: {e}"))?;
        wait_for("the edited Service plan repaired", WAIT, async || {
            let now = self
                .service_plans()
                .get("web")
                .await
                .map_err(|e| e.to_string())?;
            if now.spec == original {
                Ok(())
            } else {
                Err(format!(
                    "still edited: {:?}",
                    now.spec.service_ports.first()
                ))
            }
        })
        .await?;
        let service_took = started.elapsed();

        let plan = self
            .node_plans()
            .get(NODE)
            .await
            .map_err(|e| format!("reading the node plan: {e}"))?;
        let original = plan.spec.clone();
        let key = format!("{}/web:http/TCP/IPv4", self.namespace);
        let started = Instant::now();
        self.node_plans()
            .patch(
                NODE,
                &PatchParams {
                    field_manager: Some("kubectl-edit".to_owned()),
                    ..PatchParams::default()
                },
                &Patch::Merge(json!({"spec": {"overlay": [{"key": key,
                    "localEndpoints": [{"ip": "10.250.9.9", "port": 8080}]}]}})),
            )
            .await
            .map_err(|e| format!("editing the node plan: {e}"))?;
        wait_for("the edited node plan repaired", WAIT, async || {
            let now = self
                .node_plans()
                .get(NODE)
                .await
                .map_err(|e| e.to_string())?;
            if now.spec == original {
                Ok(())
            } else {
                Err(format!("still edited: overlay {:?}", now.spec.overlay))
            }
        })
        .await?;
        let node_took = started.elapsed();

        // After a write whole, a change that leaves a field out must take it away: the
        // Node loses its zone label, so the plan loses `zone`. (A put owned the fields as an
        // `Update`, which the next apply could not remove: the plan kept its old zone under
        // the new revision.)
        let started = Instant::now();
        self.set_zone(None).await?;
        let plan = wait_for("the node plan without its zone", WAIT, async || {
            let now = self
                .node_plans()
                .get(NODE)
                .await
                .map_err(|e| e.to_string())?;
            if now.spec.zone.is_none() {
                Ok(now)
            } else {
                Err(format!(
                    "still zone {:?} at revision {}",
                    now.spec.zone, now.spec.revision
                ))
            }
        })
        .await?;
        let zone_took = started.elapsed();
        let mut content = plan.spec.clone();
        content.revision.clear();
        if proxyplan_crds::revision_of(&content) != plan.spec.revision {
            return Err(format!(
                "the node plan's content is not its revision: {:?}",
                plan.spec
            ));
        }
        for (what, fields) in [
            ("the node plan", plan.metadata.managed_fields.clone()),
            (
                "the Service plan",
                self.plans_of("web")
                    .await?
                    .remove("web")
                    .and_then(|p| p.metadata.managed_fields),
            ),
        ] {
            let foreign: Vec<String> = fields
                .unwrap_or_default()
                .into_iter()
                .filter(|e| {
                    e.subresource.as_deref().unwrap_or_default().is_empty()
                        && (e.manager.as_deref() != Some("proxyplan-controller")
                            || e.operation.as_deref() != Some("Apply"))
                })
                .map(|e| format!("{:?}/{:?}", e.manager, e.operation))
                .collect();
            if !foreign.is_empty() {
                return Err(format!("{what} is still owned by {foreign:?}"));
            }
        }
        self.set_zone(Some("zone-a")).await?;
        wait_for("the node plan with its zone again", WAIT, async || {
            let now = self
                .node_plans()
                .get(NODE)
                .await
                .map_err(|e| e.to_string())?;
            if now.spec.zone.as_deref() == Some("zone-a") {
                Ok(())
            } else {
                Err(format!("zone {:?}", now.spec.zone))
            }
        })
        .await?;
        self.report.add(
            "hand edit",
            "merge-patch a Service plan (an endpoint and a zone list added) and a node plan \
             (an overlay added), spec.revision kept; then take the Node's zone label away",
            &format!(
                "both written back whole (added fields gone): Service plan in {}, node plan in \
                 {}; zone gone from the node plan {} later, content = revision, only the \
                 controller's apply owns either plan",
                secs(service_took),
                secs(node_took),
                secs(zone_took)
            ),
        );
        Ok(())
    }

    /// Sets (or removes) the fake node's zone label.
    async fn set_zone(&self, zone: Option<&str>) -> Result<(), String> {
        Api::<Node>::all(self.client.clone())
            .patch(
                NODE,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {"topology.kubernetes.io/zone": zone}}}),
                ),
            )
            .await
            .map(|_| ())
            .map_err(|e| format!("setting the Node's zone label to {zone:?}: {e}"))
    }

    /// The API server goes away for a while: the dataplane keeps its rules; right after
    /// it returns, an endpoint change reaches the kernel within 5 s.
    pub async fn outage(&mut self) -> Result<(), String> {
        let netns = self.netns()?;
        let before = nat_rules_stable(&netns);
        self.plane.stop_apiserver()?;
        let down = Instant::now();
        tokio::time::sleep(OUTAGE).await;
        let mut problems = Vec::new();
        for controller in &mut self.controllers {
            problems.extend(controller.process.exited());
        }
        if let Some(process) = self.agent.as_mut().and_then(|a| a.process.as_mut()) {
            problems.extend(process.exited());
        }
        let during = nat_rules_stable(&netns);
        if during != before {
            problems.push(format!(
                "the rules changed during the outage:\n{}",
                line_diff(&before, &during)
            ));
        }
        self.plane.start_apiserver()?;
        if !problems.is_empty() {
            return Err(problems.join("\n"));
        }
        let back = Instant::now();
        let outage = back - down;
        let target = self.add_web_endpoint().await?;
        self.time_until_kernel_has(&target, Duration::from_secs(30))
            .await?;
        // From the moment the API server answered /readyz again.
        let recovered = back.elapsed();
        self.report.add(
            "API server outage",
            &format!(
                "stop kube-apiserver for {:.0} s (watches backed off, the Lease expired), \
                 start it, change an endpoint at once",
                outage.as_secs_f64()
            ),
            &format!(
                "rules unchanged during the outage; the change reached the kernel {} after \
                 the API server was back",
                secs(recovered)
            ),
        );
        if recovered > Duration::from_secs(5) {
            return Err(format!(
                "the change took {} after the API server came back (budget 5 s)\n{}",
                secs(recovered),
                self.agent_log_tail()
            ));
        }
        Ok(())
    }

    /// The agent's node is cut off from the API server for a minute (its packets to and
    /// from the API server's port dropped, as a partition drops them) while a change is
    /// made: once the partition ends, the change reaches the kernel within 15 s. Found by
    /// the fleet soak: a watch whose packets were dropped waited for TCP's retransmissions,
    /// which back off to minutes (nodes 100 s behind after a 110 s partition); TCP
    /// keepalive now finds such a connection dead and the agent connects again.
    pub async fn partition(&mut self) -> Result<(), String> {
        let netns = self.netns()?;
        let nft = |rule: &str| procs::run("ip", &["netns", "exec", &netns, "nft", rule]);
        nft("add table inet partition")?;
        nft("add chain inet partition out { type filter hook output priority -300; }")?;
        nft("add rule inet partition out tcp dport 6443 drop")?;
        nft("add rule inet partition out tcp sport 6443 drop")?;
        // The change goes out at once, so the API server's side starts retransmitting it
        // into the partition.
        let target = self.add_web_endpoint().await;
        if target.is_ok() {
            tokio::time::sleep(PARTITION).await;
        }
        // Lifted whatever happened, so that the scenarios after this one have their API.
        nft("delete table inet partition")?;
        let after = self
            .time_until_kernel_has(&target?, Duration::from_secs(120))
            .await?;
        self.report.add(
            "partition",
            &format!(
                "drop the agent's packets to and from the API server for {:.0} s, change an \
                 endpoint as it starts, end it",
                PARTITION.as_secs_f64()
            ),
            &format!(
                "the change reached the kernel {} after the partition ended",
                secs(after)
            ),
        );
        if after > Duration::from_secs(15) {
            return Err(format!(
                "the change took {} after the partition ended (budget 15 s)\n{}",
                secs(after),
                self.agent_log_tail()
            ));
        }
        Ok(())
    }

    /// Restarts the agent (SIGKILL, then started again with or without libfaketime, as
    /// `self.agent_clock` says) and waits for its first sync.
    async fn restart_agent(&mut self) -> Result<(), String> {
        let netns = self.netns()?;
        let agent = self.agent.as_mut().ok_or("no agent")?;
        if let Some(mut process) = agent.process.take() {
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
        self.start_agent().await?;
        self.first_sync(&netns).await
    }

    /// Waits for a (re)started agent's first sync.
    async fn first_sync(&self, netns: &str) -> Result<(), String> {
        let synced = wait_for("the restarted agent's first sync", WAIT, async || {
            let text = get_in(netns, 10249, "/metrics");
            match metric(&text, "kubeproxy_sync_proxy_rules_duration_seconds_count") {
                Some(n) if n >= 1.0 => Ok(()),
                other => Err(format!("sync count {other:?}")),
            }
        })
        .await;
        synced.map_err(|e| format!("{e}\n{}", self.agent_log_tail()))
    }

    /// The agent's wall clock is stepped, as an NTP step or a resumed VM does it: an hour
    /// forward, ten minutes back, then back to true time (libfaketime shifts
    /// `CLOCK_REALTIME` in the agent alone; its monotonic clock runs on, as in a real
    /// step). After each step an endpoint changes: it reaches the kernel within seconds,
    /// `/livez` stays 200, Ready stays True, and the node's rollout mark reaches the
    /// Service plan's write (the status is still written). The agent's own `/livez`
    /// `currentTime` shows each step, so the step is known to have happened.
    pub async fn clock_steps(&mut self) -> Result<(), String> {
        if !std::path::Path::new(LIBFAKETIME).exists() {
            return Err(format!(
                "{LIBFAKETIME} is missing: install Debian's faketime package (tests/setup.sh does)"
            ));
        }
        let clock = self.workdir.join("agent-clock");
        // Written whole, then renamed into place: the agent never reads half a step.
        let set = |offset: &str| {
            let next = clock.with_extension("next");
            std::fs::write(&next, offset)
                .and_then(|()| std::fs::rename(&next, &clock))
                .map_err(|e| format!("{}: {e}", clock.display()))
        };
        set("+0")?;
        self.agent_clock = Some(clock.clone());
        let outcome = self.clock_steps_under_faketime(&set).await;
        // The agent runs on true time again for the scenarios after this one.
        self.agent_clock = None;
        let restarted = self.restart_agent().await;
        let worst = outcome?;
        restarted?;
        self.report.add(
            "clock steps",
            "the agent's wall clock stepped +1 h, -10 min, -50 min (libfaketime); an \
             endpoint changed after each",
            &format!(
                "every change in the kernel within {} of its write; /livez 200, Ready True \
                 and the rollout mark written after every step",
                secs(worst)
            ),
        );
        Ok(())
    }

    async fn clock_steps_under_faketime(
        &mut self,
        set: &impl Fn(&str) -> Result<(), String>,
    ) -> Result<Duration, String> {
        self.restart_agent().await?;
        let netns = self.netns()?;
        let port = self.agent.as_ref().map_or(10256, |a| a.healthz_port);
        let mut worst = Duration::ZERO;
        for (offset, seconds) in [("+1h", 3_600_i64), ("+50m", 3_000), ("+0", 0)] {
            set(offset)?;
            // (libfaketime reads the file at the agent's next read of its wall clock.)
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            let livez = get_in(&netns, port, "/livez");
            if !livez.starts_with("HTTP/1.0 200") && !livez.starts_with("HTTP/1.1 200") {
                return Err(format!(
                    "/livez after stepping the clock to {offset}: {livez}"
                ));
            }
            let shown = livez
                .split("\"currentTime\":\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .ok_or_else(|| format!("no currentTime in /livez: {livez}"))?;
            let skew = shown.as_second() - k8s_openapi::jiff::Timestamp::now().as_second();
            if (skew - seconds).abs() > 30 {
                return Err(format!(
                    "the agent's clock is {skew} s off true time, not {seconds} s: the step \
                     did not take"
                ));
            }
            let target = self.add_web_endpoint().await?;
            let took = self
                .time_until_kernel_has(&target, Duration::from_secs(30))
                .await?;
            worst = worst.max(took);
            let written = self
                .service_plans()
                .get("web")
                .await
                .map_err(|e| format!("ServiceProxyPlan web: {e}"))?
                .resource_version()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or("ServiceProxyPlan web has no resourceVersion")?;
            wait_for(
                "the node's rollout mark to reach web's plan",
                WAIT,
                async || {
                    let plan = self
                        .node_plans()
                        .get(NODE)
                        .await
                        .map_err(|e| e.to_string())?;
                    let mark = plan
                        .status
                        .as_ref()
                        .and_then(|s| s.programmed_resource_version.as_deref())
                        .and_then(|v| v.parse::<u64>().ok());
                    match mark {
                        Some(m) if m >= written => Ok(()),
                        other => Err(format!("mark {other:?}, web written at {written}")),
                    }
                },
            )
            .await
            .map_err(|e| format!("clock at {offset}: {e}\n{}", self.agent_log_tail()))?;
            match self.node_ready().await? {
                Some((status, _, _)) if status == "True" => {}
                other => return Err(format!("clock at {offset}: Ready is {other:?}")),
            }
        }
        if worst > Duration::from_secs(5) {
            return Err(format!(
                "a change took {} to reach the kernel after a clock step (budget 5 s)",
                secs(worst)
            ));
        }
        Ok(worst)
    }

    /// The leader is killed: the other replica takes the Lease and writes within the
    /// lease duration.
    pub async fn leader_killed(&mut self) -> Result<(), String> {
        self.start_controller("b", "200ms").await?;
        let holder = self.lease_holder().await?.ok_or("nobody holds the Lease")?;
        let index = self
            .controllers
            .iter()
            .position(|c| c.identity == holder)
            .ok_or_else(|| format!("the Lease holder {holder} is not one of the suite's"))?;
        let mut leader = self.controllers.remove(index);
        let _ = leader.process.child.kill();
        let _ = leader.process.child.wait();
        let killed = Instant::now();
        let target = self.add_web_endpoint().await?;
        let took = self
            .time_until_kernel_has(&target, LEASE + Duration::from_secs(15))
            .await?;
        let new_holder = self.lease_holder().await?.unwrap_or_default();
        self.report.add(
            "leader killed",
            "two replicas; SIGKILL the Lease holder, change an endpoint at once",
            &format!(
                "{new_holder} took over; the change reached the kernel {} after the kill \
                 (lease duration {} s)",
                secs(took),
                LEASE.as_secs()
            ),
        );
        if new_holder == holder || took > LEASE + Duration::from_secs(5) {
            return Err(format!(
                "holder {new_holder}, change after {}",
                secs(killed.elapsed())
            ));
        }
        Ok(())
    }

    /// The leader is stalled past its Lease (SIGSTOP) with a write pending, another
    /// replica takes over and makes newer changes; resumed (SIGCONT), the old leader
    /// writes nothing: no write counted, the object it would have reverted stays.
    pub async fn leader_stalled(&mut self) -> Result<(), String> {
        // A leader that syncs at most every 3 s, so that it holds a pending change when
        // stopped, and a fast follower.
        while let Some(mut other) = self.controllers.pop() {
            other.process.stop().await;
        }
        self.start_controller("slow", "3s").await?;
        wait_for("the slow replica to lead", WAIT, async || {
            match self.lease_holder().await? {
                Some(h) if h.ends_with("-slow") => Ok(()),
                other => Err(format!("holder {other:?}")),
            }
        })
        .await?;
        self.start_controller("fast", "200ms").await?;
        let first = self.add_web_endpoint().await?;
        self.time_until_kernel_has(&first, Duration::from_secs(20))
            .await?;
        let written_before = self
            .controller_metric(0, "proxyplan_controller_objects_written_total")
            .await?;
        // A change the slow leader holds for up to 3 s; stopped before it writes it.
        let pending = self.add_web_endpoint().await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let slow = self.controllers.first().ok_or("no slow replica")?;
        signal(&slow.process, "-STOP")?;
        let stopped = Instant::now();
        wait_for(
            "the fast replica to take the Lease",
            LEASE * 3,
            async || match self.lease_holder().await? {
                Some(h) if h.ends_with("-fast") => Ok(()),
                other => Err(format!("holder {other:?}")),
            },
        )
        .await?;
        let takeover = stopped.elapsed();
        self.time_until_kernel_has(&pending, Duration::from_secs(20))
            .await?;
        // A newer change the stalled leader knows nothing about.
        let newest = self.add_web_endpoint().await?;
        self.time_until_kernel_has(&newest, Duration::from_secs(20))
            .await?;
        let web = self
            .service_plans()
            .get("web")
            .await
            .map_err(|e| e.to_string())?;
        // The spec only: the new leader's rollout status moves the resourceVersion.
        let version = (web.metadata.generation, web.spec.revision.clone());
        let slow = self.controllers.first().ok_or("no slow replica")?;
        signal(&slow.process, "-CONT")?;
        let resumed = Instant::now();
        let mut flaps = 0;
        let mut writers = String::new();
        while resumed.elapsed() < Duration::from_secs(8) {
            let now = self
                .service_plans()
                .get("web")
                .await
                .map_err(|e| e.to_string())?;
            if (now.metadata.generation, now.spec.revision.clone()) != version {
                flaps += 1;
                writers = format!(
                    "{:?} {:?}",
                    now.metadata.managed_fields.as_ref().map(|m| m
                        .iter()
                        .map(|e| (&e.manager, &e.operation, &e.subresource, &e.time))
                        .collect::<Vec<_>>()),
                    now.status
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let written_after = self
            .controller_metric(0, "proxyplan_controller_objects_written_total")
            .await?;
        let stalled_writes = written_after - written_before;
        let slow = self.controllers.first().ok_or("no slow replica")?;
        let log = std::fs::read_to_string(&slow.process.log).unwrap_or_default();
        let stood_down = log.contains("writes stopped") || log.contains("leading=false");
        self.report.add(
            "leader stalled",
            "two replicas; a change pending on the leader (min sync interval 3 s); SIGSTOP it \
             past its Lease, the other takes over and writes a newer change; SIGCONT",
            &format!(
                "takeover {} after SIGSTOP; after SIGCONT the old leader wrote {stalled_writes} \
                 objects (counted by its metrics) and the Service plan it would have reverted \
                 changed {flaps} times in 8 s; it {}",
                secs(takeover),
                if stood_down {
                    "logged that it stopped writing"
                } else {
                    "logged nothing about leadership"
                }
            ),
        );
        if stalled_writes > 0.0 || flaps > 0 {
            return Err(format!(
                "the stalled leader wrote after losing the Lease ({stalled_writes} writes, \
                 {flaps} changes of the Service plan; last: {writers})"
            ));
        }
        Ok(())
    }

    /// A Service the controller refuses (a loopback load-balancer IP, which the API
    /// server accepts) and one it must cut down (1,100 external IPs) get Warning Events.
    pub async fn warning_events(&mut self) -> Result<(), String> {
        self.create_service("bad-lb", &[("http", 83)], "LoadBalancer")
            .await?;
        self.services()
            .patch_status(
                "bad-lb",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"loadBalancer": {"ingress": [{"ip": "127.0.0.1"}]}}}),
                ),
            )
            .await
            .map_err(|e| format!("patching bad-lb's status: {e}"))?;
        let external: Vec<String> = (0..1100)
            .map(|i| format!("100.64.{}.{}", i / 250, 1 + i % 250))
            .collect();
        let service: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "many-ips", "namespace": self.namespace},
            "spec": {"ports": [{"name": "http", "port": 84, "targetPort": 8080}],
                     "externalIPs": external}
        }))
        .map_err(|e| e.to_string())?;
        self.services()
            .create(&PostParams::default(), &service)
            .await
            .map_err(|e| format!("creating many-ips: {e}"))?;
        let started = Instant::now();
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &self.namespace);
        for (service, reason) in [
            ("bad-lb", "InvalidService"),
            ("many-ips", "ProxyPlanTruncated"),
        ] {
            let note = wait_for(
                &format!("a {reason} Event on {service}"),
                WAIT,
                async || {
                    let list = events
                        .list(&ListParams::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    list.items
                        .iter()
                        .find(|e| {
                            e.reason.as_deref() == Some(reason)
                                && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                                    == Some(service)
                        })
                        .map(|e| e.note.clone().unwrap_or_default())
                        .ok_or_else(|| {
                            format!(
                                "events: {:?}",
                                list.items
                                    .iter()
                                    .map(|e| (
                                        e.reason.clone(),
                                        e.regarding.as_ref().and_then(|r| r.name.clone())
                                    ))
                                    .collect::<Vec<_>>()
                            )
                        })
                },
            )
            .await?;
            println!("faults: {reason} on {service}: {note}");
        }
        let took = started.elapsed();
        // The truncated Service is still planned, with the first 1,024 external IPs.
        let plans = self.plans_of("many-ips").await?;
        let entry = plans
            .values()
            .flat_map(|p| &p.spec.service_ports)
            .next()
            .ok_or("many-ips has no Service plan")?;
        if entry.external_ips.len() != proxyplan_crds::MAX_EXTERNAL_IPS {
            return Err(format!(
                "many-ips: {} external IPs planned",
                entry.external_ips.len()
            ));
        }
        self.report.add(
            "refused and oversized Services",
            "LoadBalancer Service with ingress IP 127.0.0.1 (accepted by the API server); \
             Service with 1,100 external IPs",
            &format!(
                "Warning Events InvalidService and ProxyPlanTruncated within {}; the second is \
                 planned with its first 1,024 external IPs",
                secs(took)
            ),
        );
        Ok(())
    }

    /// One Service with 6,000 endpoints over 60 slices, 6 ports, 100 external IPs and 300
    /// source ranges: its plan is spread over objects that each stay under 1 MiB, and a
    /// neighbour's change is still written promptly.
    pub async fn huge_service(&mut self) -> Result<(), String> {
        // The agent would spend minutes programming 36,000 endpoints in iptables mode on
        // this machine's nft back end: this scenario is about the controller's writes.
        if let Some(process) = self.agent.as_mut().and_then(|a| a.process.as_mut()) {
            process.stop().await;
        }
        let ports: Vec<(String, i32)> = (0..6).map(|i| (format!("p{i}"), 100 + i)).collect();
        let external: Vec<String> = (0..100).map(|i| format!("100.65.0.{}", i + 1)).collect();
        let ranges: Vec<String> = (0..300)
            .map(|i| format!("100.{}.{}.0/24", 66 + i / 250, i % 250))
            .collect();
        let service: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "huge", "namespace": self.namespace},
            "spec": {"type": "LoadBalancer",
                     "ports": ports.iter().map(|(n, p)| json!({"name": n, "port": p, "targetPort": 8080})).collect::<Vec<_>>(),
                     "externalIPs": external, "loadBalancerSourceRanges": ranges}
        }))
        .map_err(|e| e.to_string())?;
        self.services()
            .create(&PostParams::default(), &service)
            .await
            .map_err(|e| format!("creating huge: {e}"))?;
        let started = Instant::now();
        let slice_ports: Vec<(&str, i32)> = ports.iter().map(|(n, _)| (n.as_str(), 8080)).collect();
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &self.namespace);
        for s in 0..60 {
            let addresses: Vec<String> = (0..100)
                .map(|i| format!("10.252.{}.{}", s, i + 1))
                .collect();
            let refs: Vec<&str> = addresses.iter().map(String::as_str).collect();
            let object = slice_object(
                &self.namespace,
                "huge",
                &format!("huge-{s}"),
                &slice_ports,
                &refs,
            )?;
            slices
                .patch(
                    &format!("huge-{s}"),
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(&object),
                )
                .await
                .map_err(|e| format!("applying slice huge-{s}: {e}"))?;
        }
        let (parts, sizes) = wait_for("huge's plan with every endpoint", WAIT * 2, async || {
            let plans = self.plans_of("huge").await?;
            let entries: Vec<_> = plans.values().flat_map(|p| &p.spec.service_ports).collect();
            let full =
                entries.len() == 6 && entries.iter().all(|e| e.cluster_endpoints.len() == 6000);
            if full {
                let sizes: Vec<usize> = plans
                    .values()
                    .map(|p| serde_json::to_vec(p).map_or(usize::MAX, |v| v.len()))
                    .collect();
                Ok((plans.len(), sizes))
            } else {
                Err(format!(
                    "{} parts, entries with {:?} endpoints",
                    plans.len(),
                    entries
                        .iter()
                        .map(|e| e.cluster_endpoints.len())
                        .collect::<Vec<_>>()
                ))
            }
        })
        .await?;
        let took = started.elapsed();
        let largest = sizes.iter().copied().max().unwrap_or(0);
        if largest >= 1 << 20 {
            return Err(format!("a part of huge's plan is {largest} bytes"));
        }
        // The neighbour still updates promptly.
        let before = self
            .service_plans()
            .get("web")
            .await
            .map_err(|e| e.to_string())?
            .spec
            .revision;
        let target = self.add_web_endpoint().await?;
        let changed = Instant::now();
        let address = target.trim_end_matches(":8080").to_owned();
        wait_for("web's plan with the new endpoint", WAIT, async || {
            let web = self
                .service_plans()
                .get("web")
                .await
                .map_err(|e| e.to_string())?;
            let has = web
                .spec
                .service_ports
                .iter()
                .any(|e| e.cluster_endpoints.iter().any(|ep| ep.ip == address));
            if has && web.spec.revision != before {
                Ok(())
            } else {
                Err("not yet".to_owned())
            }
        })
        .await?;
        let neighbour = changed.elapsed();
        self.report.add(
            "huge Service",
            "6,000 endpoints in 60 slices, 6 ports, 100 external IPs, 300 source ranges; then \
             an endpoint change of a neighbour",
            &format!(
                "planned in {} as {parts} objects, largest {:.0} KiB (< 1 MiB); the neighbour's \
                 plan written {} after its change",
                secs(took),
                largest as f64 / 1024.0,
                secs(neighbour)
            ),
        );
        if parts < 2 {
            return Err(format!(
                "huge's plan fits one object ({largest} bytes): nothing was split"
            ));
        }
        Ok(())
    }

    /// Deleting a Service deletes its plan; deleting the Node deletes the node's plan.
    /// A second node with its own agent. A change both agents take is seen by the
    /// controller and costs no Service plan write. Then that agent stopped (SIGSTOP, as a
    /// hung process or a node cut off would be): the next change of `web` shows `1/2`
    /// programmed with that node as the slowest in the columns `kubectl get
    /// serviceproxyplans` prints, and `2/2` once it runs again: two status writes.
    pub async fn rollout_with_a_stopped_agent(&mut self) -> Result<(), String> {
        self.create_node(NODE_B, "10.250.2.0/24", "192.0.2.11")
            .await?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut agent = self.start_extra_agent(NODE_B, "b").await?;
        let pid = agent.process.as_ref().map(|p| p.child.id().to_string());
        let result = self.rollout_checks(pid.as_deref().unwrap_or("0")).await;
        if let Some(process) = agent.process.as_mut() {
            let _ = procs::run("kill", &["-CONT", &process.child.id().to_string()]);
            if result.is_err() {
                println!("faults: agent b's log:\n{}", process.log_tail(20));
            }
            process.stop().await;
        }
        agent.forwarder.stop().await;
        let _ = procs::delete_netns(&agent.netns);
        nodes
            .delete(NODE_B, &DeleteParams::default())
            .await
            .map_err(|e| format!("deleting Node {NODE_B}: {e}"))?;
        result
    }

    async fn rollout_checks(&mut self, pid_b: &str) -> Result<(), String> {
        let metric_sum = async |faults: &Self, series: &str| {
            let mut total = 0.0;
            for i in 0..faults.controllers.len() {
                total += faults.controller_metric(i, series).await.unwrap_or(0.0);
            }
            total
        };
        let timed = "proxyplan_controller_rollout_duration_seconds_count";
        let status_writes = "proxyplan_controller_rollout_status_writes_total";
        let writes = async |faults: &Self| metric_sum(faults, status_writes).await;
        let before = writes(self).await;
        // Both agents report: the controller sees every node take the change, and writes
        // nothing (by default only lagging rollouts are written).
        let counted = metric_sum(self, timed).await;
        self.add_web_endpoint().await?;
        let started = Instant::now();
        wait_for(
            "the controller to see both nodes take the change",
            WAIT,
            async || {
                let now = metric_sum(self, timed).await;
                if now > counted {
                    Ok(())
                } else {
                    Err(format!("{timed} still {now}"))
                }
            },
        )
        .await?;
        let both = started.elapsed();
        let healthy = writes(self).await - before;
        if healthy > 0.0 {
            return Err(format!(
                "{healthy} rollout status writes for a rollout both nodes reported in time"
            ));
        }
        procs::run("kill", &["-STOP", pid_b])?;
        let target = self.add_web_endpoint().await?;
        let started = Instant::now();
        self.time_until_kernel_has(&target, WAIT).await?;
        let first_node = started.elapsed();
        self.wait_rollout("1/2", Some(NODE_B)).await?;
        let named = started.elapsed();
        // What `kubectl get serviceproxyplans` prints: the server's table of the CRD's
        // printer columns.
        let table = self.table_row("web").await?;
        println!(
            "faults: kubectl get serviceproxyplans web:\n  {}\n  {}",
            table
                .iter()
                .map(|(c, _)| c.to_uppercase())
                .collect::<Vec<_>>()
                .join("\t"),
            table
                .iter()
                .map(|(_, v)| v.as_str())
                .collect::<Vec<_>>()
                .join("\t")
        );
        let cell = |column: &str| {
            table
                .iter()
                .find(|(c, _)| c == column)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        if cell("Programmed") != "1/2" || cell("Slowest") != NODE_B {
            return Err(format!(
                "kubectl get serviceproxyplans web shows {table:?}, not 1/2 with {NODE_B} slowest"
            ));
        }
        let mut open = 0.0;
        for i in 0..self.controllers.len() {
            open += self
                .controller_metric(i, "proxyplan_controller_rollouts_incomplete")
                .await
                .unwrap_or(0.0);
        }
        if open < 1.0 {
            return Err(
                "proxyplan_controller_rollouts_incomplete is 0 with an agent stopped".into(),
            );
        }

        procs::run("kill", &["-CONT", pid_b])?;
        let resumed = Instant::now();
        self.wait_rollout("2/2", None).await?;
        let back = resumed.elapsed();
        let written = writes(self).await - before;
        if written != 2.0 {
            return Err(format!(
                "{written} rollout status writes, not 2 (lagging, then complete)"
            ));
        }
        println!(
            "faults: rollout: both nodes reported a change {both:.2?} after it (no status \
             write); agent b stopped: first node {first_node:.2?}, 1/2 with {NODE_B} slowest \
             {named:.2?}; 2/2 {back:.2?} after SIGCONT; {written} status writes"
        );
        self.report.add(
            "one of 2 agents stopped (SIGSTOP), then a change",
            &format!("kubectl get spp: 1/2, Slowest {NODE_B}; 2/2 after SIGCONT"),
            &format!(
                "a change both agents took: known to the controller in {}, no status write; \
                 with b stopped: 1/2 shown {} after the change (--rollout-slow-after 2s); 2/2 \
                 {} after SIGCONT; {written} status writes in all",
                secs(both),
                secs(named),
                secs(back)
            ),
        );
        Ok(())
    }

    /// Waits until `web`'s Service plan shows a rollout of its current revision at
    /// `progress` with `slowest`.
    async fn wait_rollout(&self, progress: &str, slowest: Option<&str>) -> Result<(), String> {
        let plans = self.service_plans();
        wait_for(
            &format!("web's rollout at {progress} (slowest {slowest:?})"),
            WAIT,
            async || {
                let plan = plans
                    .get("web")
                    .await
                    .map_err(|e| format!("reading web's plan: {e}"))?;
                let rollout = plan.status.as_ref().and_then(|s| s.rollout.as_ref());
                match rollout {
                    Some(r)
                        if r.revision == plan.spec.revision
                            && r.progress == progress
                            && r.slowest.as_deref() == slowest =>
                    {
                        Ok(())
                    }
                    other => Err(format!(
                        "revision {} has rollout {other:?}",
                        plan.spec.revision
                    )),
                }
            },
        )
        .await
    }

    /// The columns of Service plan `name` as `kubectl get` prints them (the API server's
    /// Table rendering of the CRD's printer columns), in order.
    async fn table_row(&self, name: &str) -> Result<Vec<(String, String)>, String> {
        let request = http::Request::get(format!(
            "/apis/proxyplan.dev/v1alpha1/namespaces/{}/serviceproxyplans/{name}",
            self.namespace
        ))
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
        let table: serde_json::Value = self
            .client
            .request(request)
            .await
            .map_err(|e| format!("reading {name}'s table: {e}"))?;
        let columns = table["columnDefinitions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let cells = table["rows"][0]["cells"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(columns
            .iter()
            .zip(cells)
            .map(|(column, cell)| {
                let text = match cell {
                    serde_json::Value::String(s) => s,
                    serde_json::Value::Null => String::new(),
                    other => other.to_string(),
                };
                (column["name"].as_str().unwrap_or_default().to_owned(), text)
            })
            .collect())
    }

    pub async fn cleanup(&mut self) -> Result<(), String> {
        self.services()
            .delete("huge", &DeleteParams::default())
            .await
            .map_err(|e| format!("deleting huge: {e}"))?;
        wait_for("huge's plans deleted", WAIT, async || {
            let left = self.plans_of("huge").await?;
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{} left", left.len()))
            }
        })
        .await?;
        Api::<Node>::all(self.client.clone())
            .delete(NODE, &DeleteParams::default())
            .await
            .map_err(|e| format!("deleting the Node: {e}"))?;
        wait_for("the node plan deleted", WAIT, async || {
            match self
                .node_plans()
                .get_opt(NODE)
                .await
                .map_err(|e| e.to_string())?
            {
                None => Ok(()),
                Some(plan) => Err(format!("still there: {}", plan.name_any())),
            }
        })
        .await?;
        Ok(())
    }
}
