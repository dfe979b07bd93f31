//! Command-line interface: `run` against a cluster, `plan` from files.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use proxyplan_controller::model::ObjectError;
use proxyplan_controller::state_file::ClusterState;
use proxyplan_controller::{DesiredObject, Planner, PlannerConfig, run};
use proxyplan_crds::LocalTrafficMode;

/// Exit code of `plan` when some objects were skipped.
const EXIT_SKIPPED: u8 = 3;

/// Computes, for every node, the NodeProxyPlan its proxyplan agent programs.
#[derive(Debug, Parser)]
#[command(name = "proxyplan-controller", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Watch a cluster and keep every node's plan up to date (leader-elected).
    Run(RunArgs),
    /// Compute plans from files of Kubernetes objects, with no cluster, and print them.
    ///
    /// Exit codes: 0 every object was used; 1 error; 3 some objects were skipped (each is
    /// reported on stderr with the reason).
    Plan(PlanArgs),
    /// Remove the agents before the rest of the release: delete their DaemonSet with
    /// foreground propagation and wait until every agent pod is gone (the chart's
    /// pre-delete hook). Each agent, started with --owner-daemonset, removes everything
    /// it owns from its node's kernel as it stops, while it may still read the DaemonSet.
    UninstallAgents(UninstallArgs),
}

#[derive(Debug, Args)]
struct UninstallArgs {
    /// Kubeconfig file; without it, the in-cluster service account (or $KUBECONFIG).
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The agents' DaemonSet, as NAMESPACE/NAME.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    daemonset: String,
    /// How long to wait for the agent pods to go.
    #[arg(long, value_parser = proxyplan_crds::runtime::parse_duration, default_value = "120s")]
    timeout: Duration,
}

/// Policy flags shared by `run` and `plan`.
#[derive(Debug, Args)]
struct PolicyArgs {
    /// Cluster pod CIDR, for local-traffic detection; repeat (or comma-separate) for
    /// dual-stack, at most one per family.
    #[arg(long = "cluster-cidr", value_name = "CIDR")]
    cluster_cidrs: Vec<String>,
    /// Masquerade all traffic sent to service VIPs.
    #[arg(long)]
    masquerade_all: bool,
    /// How traffic from inside the cluster is recognised (kube-proxy's
    /// --detect-local-mode): by source in the cluster CIDRs, in each node's pod CIDRs, by
    /// arrival on the pods' bridge (--pod-bridge-interface), or on interfaces whose name
    /// starts with a prefix (--pod-interface-name-prefix; for CNIs whose pods are not
    /// inside one CIDR).
    #[arg(long, value_enum, default_value = "ClusterCIDR")]
    detect_local_mode: DetectLocalMode,
    /// The pods' bridge, for --detect-local-mode=BridgeInterface.
    #[arg(long, value_name = "NAME")]
    pod_bridge_interface: Option<String>,
    /// The prefix of the pods' interface names, for
    /// --detect-local-mode=InterfaceNamePrefix.
    #[arg(long, value_name = "PREFIX")]
    pod_interface_name_prefix: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DetectLocalMode {
    #[value(name = "ClusterCIDR")]
    ClusterCidr,
    #[value(name = "NodeCIDR")]
    NodeCidr,
    #[value(name = "BridgeInterface")]
    BridgeInterface,
    #[value(name = "InterfaceNamePrefix")]
    InterfaceNamePrefix,
}

impl PolicyArgs {
    fn config(&self) -> anyhow::Result<PlannerConfig> {
        let Self {
            cluster_cidrs,
            masquerade_all,
            detect_local_mode,
            pod_bridge_interface,
            pod_interface_name_prefix,
        } = self;
        let mode = match detect_local_mode {
            DetectLocalMode::ClusterCidr => LocalTrafficMode::ClusterCIDR,
            DetectLocalMode::NodeCidr => LocalTrafficMode::NodeCIDR,
            DetectLocalMode::BridgeInterface => LocalTrafficMode::BridgeInterface,
            DetectLocalMode::InterfaceNamePrefix => LocalTrafficMode::InterfaceNamePrefix,
        };
        Ok(
            PlannerConfig::new(cluster_cidrs, *masquerade_all, mode)?.with_local_interface(
                pod_bridge_interface.clone(),
                pod_interface_name_prefix.clone(),
            )?,
        )
    }
}

#[derive(Debug, Args)]
struct PlanArgs {
    /// Files of Services, EndpointSlices, Nodes and ServiceCIDRs (YAML documents, JSON, or `List`s, as
    /// `kubectl get -o yaml|json` prints them); `-` reads standard input.
    #[arg(long = "state", value_name = "FILE", required = true, num_args = 1..)]
    state: Vec<PathBuf>,
    /// Print only what this node's agent receives: its plan and every Service's plan.
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "yaml")]
    output: OutputFormat,
    #[command(flatten)]
    policy: PolicyArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OutputFormat {
    Yaml,
    Json,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Kubeconfig file; without it, the in-cluster service account (or $KUBECONFIG).
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Minimum time between two syncs (compute and write the plans that changed). 0: a
    /// change is planned and written as soon as it arrives, even while earlier writes are
    /// in flight (a plan being written waits for that write, then its newest content is
    /// written); a larger value coalesces bursts further, at the cost of that much
    /// latency for every change in the burst.
    #[arg(long, value_parser = proxyplan_crds::runtime::parse_duration, default_value = "0s")]
    min_sync_interval: Duration,
    /// Address of /metrics.
    #[arg(long, default_value = "0.0.0.0:9090")]
    metrics_bind_address: SocketAddr,
    /// Address of /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:9091")]
    health_bind_address: SocketAddr,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    leader_election_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "proxyplan-controller")]
    leader_election_lease: String,
    /// This replica's identity in the Lease.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// How long after a Service plan write the controller waits for every node's agent
    /// to report it programmed before it writes the rollout as lagging (`Programmed`
    /// N-1/N and the `Slowest` node in `kubectl get serviceproxyplans`). Longer than the
    /// agents' `--rollout-report-interval`, whose reports it waits for under churn.
    #[arg(long, value_parser = proxyplan_crds::runtime::parse_duration, default_value = "15s")]
    rollout_slow_after: Duration,
    /// Which rollouts go into the Service plans' status. `lagging`: those some node still
    /// lacks after --rollout-slow-after, and their completion; a healthy fleet gets no
    /// extra writes. `all`: every completion too (`N/N` on every row), one more Service
    /// plan event per change on every node (twice the bytes per change). `off`: none.
    /// The metrics count every rollout whichever is chosen.
    #[arg(long, value_enum, default_value = "lagging")]
    rollout_status: run::rollout::StatusWrites,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log: String,
    #[command(flatten)]
    policy: PolicyArgs,
}

impl Cli {
    /// Runs the chosen command.
    pub fn run(self) -> ExitCode {
        let result = match self.command {
            Command::Plan(args) => plan(&args),
            Command::Run(args) => run_controller(args),
            Command::UninstallAgents(args) => uninstall_agents(args),
        };
        match result {
            Ok(code) => code,
            // `plan ... | head` closing the pipe early is not an error.
            Err(err)
                if err
                    .downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
            {
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("proxyplan-controller: error: {err:#}");
                ExitCode::FAILURE
            }
        }
    }
}

fn plan(args: &PlanArgs) -> anyhow::Result<ExitCode> {
    let PlanArgs {
        state,
        node,
        output,
        policy,
    } = args;
    let config = policy.config()?;
    let state = ClusterState::read_files(state)?;
    let mut planner = Planner::new(config);
    let mut skipped = state
        .skipped
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>();
    let cidr_errors: Vec<ObjectError> = state
        .service_cidrs
        .iter()
        .filter_map(|cidr| {
            let ranges = cidr
                .spec
                .as_ref()
                .and_then(|s| s.cidrs.clone())
                .unwrap_or_default();
            planner
                .apply_service_cidr(cidr.metadata.name.as_deref().unwrap_or_default(), &ranges)
                .err()
        })
        .collect();
    let errors = cidr_errors
        .into_iter()
        .chain(planner.reset_nodes(&state.nodes))
        .chain(planner.reset_services(&state.services))
        .chain(planner.reset_slices(&state.slices));
    for err in errors {
        let (ObjectError::Invalid { kind, object, .. } | ObjectError::Ignored { kind, object, .. }) =
            &err;
        let line = match state.source_of(kind, object) {
            Some(source) => format!("{source}: {err}"),
            None => err.to_string(),
        };
        if err.is_invalid() {
            skipped.push(line);
        } else {
            eprintln!("note: {line}");
        }
    }
    for line in &skipped {
        eprintln!("skipped: {line}");
    }
    let objects: Vec<DesiredObject> = match node {
        Some(name) => {
            let (plan, services) = planner.node_view(name).with_context(|| {
                let known: Vec<_> = state
                    .nodes
                    .iter()
                    .filter_map(|n| n.metadata.name.clone())
                    .collect();
                format!(
                    "node {name:?} is not in the state files (nodes: {})",
                    known.join(", ")
                )
            })?;
            std::iter::once(DesiredObject::Plan(plan))
                .chain(services.into_iter().map(DesiredObject::Service))
                .collect()
        }
        None => planner.take_changes().apply,
    };
    print_objects(&objects, *output)?;
    Ok(if skipped.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_SKIPPED)
    })
}

fn print_objects(objects: &[DesiredObject], output: OutputFormat) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match output {
        OutputFormat::Yaml => {
            for object in objects {
                write!(out, "---\n{}", serde_yaml::to_string(object)?)?;
            }
        }
        OutputFormat::Json => {
            #[derive(serde::Serialize)]
            #[serde(rename_all = "camelCase")]
            struct List<'a> {
                api_version: &'static str,
                kind: &'static str,
                items: &'a [DesiredObject],
            }
            let list = List {
                api_version: "v1",
                kind: "List",
                items: objects,
            };
            writeln!(out, "{}", serde_json::to_string_pretty(&list)?)?;
        }
    }
    Ok(())
}

fn run_controller(args: RunArgs) -> anyhow::Result<ExitCode> {
    let RunArgs {
        kubeconfig,
        min_sync_interval,
        metrics_bind_address,
        health_bind_address,
        leader_election_namespace,
        leader_election_lease,
        identity,
        rollout_slow_after,
        rollout_status,
        log,
        policy,
    } = args;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&log).context("--log")?)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = policy.config()?;
    let identity = identity
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("proxyplan-controller-{}", std::process::id()));
    let settings = run::Settings {
        kubeconfig,
        config,
        min_sync_interval,
        metrics_bind_address,
        health_bind_address,
        lease_namespace: leader_election_namespace,
        lease_name: leader_election_lease,
        identity,
        rollout_slow_after,
        rollout_status,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(run::run(settings))?;
    Ok(ExitCode::SUCCESS)
}

fn uninstall_agents(args: UninstallArgs) -> anyhow::Result<ExitCode> {
    let UninstallArgs {
        kubeconfig,
        daemonset,
        timeout,
    } = args;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::stderr)
        .init();
    let (namespace, name) = daemonset
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
        .with_context(|| format!("--daemonset {daemonset:?} is not NAMESPACE/NAME"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let client = proxyplan_crds::runtime::client(kubeconfig.as_deref()).await?;
        proxyplan_controller::uninstall::uninstall_agents(client, namespace, name, timeout)
            .await
            .map_err(anyhow::Error::from)
    })?;
    Ok(ExitCode::SUCCESS)
}
