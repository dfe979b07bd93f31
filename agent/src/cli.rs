//! Command-line interface: `run` on a node; `apply`, `cleanup` and `check` without a
//! cluster.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use proxyplan_agent::dataplane::Dataplane;
use proxyplan_agent::kernel::conntrack::ConntrackSysctls;
use proxyplan_agent::kernel::ipvs::{IpvsTimeouts, NetlinkKernel};
use proxyplan_agent::kernel::nftables::NetlinkNft;
use proxyplan_agent::kernel::{BackendChoice, CommandRunner, Runner};
use proxyplan_agent::modes::iptables::{IptablesDataplane, RenderSettings};
use proxyplan_agent::modes::ipvs::{IpvsDataplane, IpvsSettings};
use proxyplan_agent::modes::nftables::rules::Net;
use proxyplan_agent::modes::nftables::{NftablesDataplane, NftablesSettings};
use proxyplan_agent::run::{self, Cidr, ProxyMode, plan_file};

use crate::{switch, uninstall};
use proxyplan_crds::TrafficPolicy;
use proxyplan_crds::runtime::parse_duration;

/// Programs this node's kernel from its NodeProxyPlan.
#[derive(Debug, Parser)]
#[command(name = "proxyplan-agent", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Watch this node's NodeProxyPlan and every ServiceProxyPlan, and keep the kernel
    /// programmed (the DaemonSet mode).
    ///
    /// The agent watches only its own plan (by name) and the Service plans the
    /// controller wrote (by label). A node plan that fails validation is refused whole:
    /// the last good plan stays programmed and the plan's status says Degraded=True,
    /// reason InvalidPlan, naming the field. A Service plan that fails is refused alone
    /// (its last good version stays; Degraded=True, reason InvalidServicePlan). When the
    /// API server is unreachable the agent keeps programming the last plan it has.
    ///
    /// Status writes: the agent writes the plan's status (server-side apply to /status,
    /// field manager proxyplan-agent) only when it changed. A change of a condition or of
    /// the applied plan revision is written at once; a change of only the counts (every
    /// endpoint change moves them on every node) is written at most once per
    /// --status-min-interval, so such a change costs O(1) API writes per interval, not
    /// one per node. The sync duration alone is never a reason to write.
    Run(Box<RunArgs>),
    /// Apply a plan file once to the current network namespace, then exit.
    ///
    /// The file holds a node's plan and every Service's plan, as `proxyplan-controller
    /// plan --node NAME` prints them. Invalid input is refused, with the field named,
    /// before anything is touched.
    Apply(ApplyArgs),
    /// Remove everything the agent owns from the kernel (and nothing else), then exit.
    Cleanup(CleanupArgs),
    /// Validate a plan file and print the merged service ports it programs.
    Check(CheckArgs),
    /// Explain what this node does with the first packet of one flow, and why; and
    /// whether the kernel holds exactly this node's plan.
    ///
    /// Run it on the node (kubectl exec into the agent's pod). It answers from the node's
    /// merged plan (read from the API server, or --plan FILE): which Service port the
    /// destination matches (cluster IP, external IP, load-balancer IP, node port), which
    /// endpoints a new connection can reach and with what probability, session affinity,
    /// whether it is masqueraded and why; or why it is dropped or rejected (no endpoints,
    /// Local policy with no endpoint here, loadBalancerSourceRanges, an unknown port, an
    /// unallocated Service CIDR address). Then it reads the kernel: which mode's rules the
    /// node holds, and whether a sync of this plan would change anything there (the
    /// differences are listed); in iptables mode it also traces the packet through the
    /// live rules. The running agent's flags are read from --state-dir, so the kernel is
    /// compared with what that agent programs.
    Explain(Box<ExplainArgs>),
    /// Set the node's conntrack sysctls (table size and timeouts, kube-proxy's flags and
    /// defaults), then exit: for a privileged init container, since the agent itself runs
    /// unprivileged and /proc/sys is read-only there (it checks them again at start).
    Setup(SetupArgs),
}

/// How the kernel is programmed.
#[derive(Debug, Clone, Args)]
struct DataplaneArgs {
    /// Proxy mode: nftables (one nf_tables table of the agent's own, with sets and verdict
    /// maps, programmed over netlink), iptables (a chain per service and endpoint), ipvs
    /// (IPVS virtual servers, VIPs on a dummy interface, ipsets and a fixed set of iptables
    /// rules), or auto: nftables when the kernel takes everything the mode needs (checked
    /// at start, without changing anything), iptables otherwise. At start the agent
    /// removes what it owns of the other modes (their tables, chains, sets, IPVS services
    /// and dummy interface). For cleanup, auto removes what every mode owns.
    #[arg(long, value_enum, default_value_t = ModeArg::Auto)]
    mode: ModeArg,
    /// Which iptables back end to use: the one the node already uses (auto), iptables-nft
    /// or iptables-legacy.
    #[arg(long, value_enum, default_value = "auto")]
    iptables_backend: IptablesBackend,
    #[command(flatten)]
    ipvs: IpvsArgs,
}

/// The ipvs mode's node-local settings.
#[derive(Debug, Clone, Args)]
struct IpvsArgs {
    /// ipvs mode: the IPVS scheduler of every virtual server (rr, wrr, lc, wlc, lblc,
    /// lblcr, dh, sh, sed, nq, mh, fo, ovf, twos; any scheduler module the kernel has).
    #[arg(long, value_name = "NAME", default_value = "rr")]
    ipvs_scheduler: String,
    /// ipvs mode: IPVS virtual servers with addresses in these CIDRs are never touched
    /// (not even removed); repeat or comma-separate.
    #[arg(long, value_name = "CIDR", value_delimiter = ',', num_args = 1..)]
    ipvs_exclude_cidrs: Vec<Cidr>,
    /// ipvs mode: set arp_ignore=1 and arp_announce=2 so the node never answers ARP for
    /// the VIPs it holds (needed beside L2 load balancers such as MetalLB).
    #[arg(long)]
    ipvs_strict_arp: bool,
    /// ipvs mode: the dummy interface that holds the service VIPs (created if missing,
    /// deleted by cleanup).
    #[arg(long, value_name = "NAME", default_value = "proxyplan-ipvs0",
          value_parser = parse_interface)]
    ipvs_interface: String,
    /// ipvs mode: how long a removed TCP or SCTP real server drains at weight 0 before it
    /// is deleted even with connections left (UDP real servers go at once).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "120s")]
    ipvs_termination_grace: Duration,
    /// ipvs mode: IPVS's idle timeout of established TCP connections (ipvsadm --set),
    /// whole seconds; 0 leaves the kernel's value (900 s on a fresh node).
    #[arg(long, value_name = "DURATION", value_parser = parse_ipvs_timeout, default_value = "0s")]
    ipvs_tcp_timeout: u32,
    /// ipvs mode: IPVS's timeout of TCP connections after a FIN, whole seconds; 0 leaves
    /// the kernel's value (120 s on a fresh node).
    #[arg(long, value_name = "DURATION", value_parser = parse_ipvs_timeout, default_value = "0s")]
    ipvs_tcpfin_timeout: u32,
    /// ipvs mode: IPVS's timeout of UDP flows, whole seconds; 0 leaves the kernel's value
    /// (300 s on a fresh node).
    #[arg(long, value_name = "DURATION", value_parser = parse_ipvs_timeout, default_value = "0s")]
    ipvs_udp_timeout: u32,
}

/// An IPVS timeout: a duration of whole seconds (IPVS counts in seconds), as seconds.
fn parse_ipvs_timeout(text: &str) -> Result<u32, String> {
    let duration = parse_duration(text)?;
    if duration.subsec_nanos() != 0 {
        return Err(format!("{text:?}: IPVS timeouts are whole seconds"));
    }
    u32::try_from(duration.as_secs()).map_err(|_| format!("{text:?} is too long"))
}

fn parse_interface(name: &str) -> Result<String, String> {
    if name.is_empty() || name.len() > 15 || name.contains(['/', ' ']) {
        return Err(format!(
            "{name:?} is not an interface name (1 to 15 characters, no '/' or spaces)"
        ));
    }
    Ok(name.to_owned())
}

/// How the rules are rendered.
#[derive(Debug, Args)]
struct RenderArgs {
    /// The packet mark bit that asks for masquerade (kube-proxy uses 14; 13 lets both run
    /// side by side).
    #[arg(long, default_value_t = 13, value_parser = clap::value_parser!(u8).range(0..=31))]
    masquerade_bit: u8,
    /// Node ports (and health-check node ports) accept traffic only to node addresses in
    /// these CIDRs; repeat or comma-separate. Or `primary` (kube-proxy's keyword): only
    /// the node's primary IP of each family (its first InternalIP, else ExternalIP).
    /// Default: every address.
    #[arg(long, value_name = "CIDR|primary", value_delimiter = ',', num_args = 1.., value_parser = parse_nodeport_address)]
    nodeport_addresses: Vec<NodePortAddress>,
    /// iptables mode, IPv4: also accept node ports on 127.0.0.0/8 (kube-proxy's
    /// --iptables-localhost-nodeports, on by default there). Sets route_localnet=1 and
    /// adds kube-proxy's guard against martian packets to 127.0.0.0/8; has no effect when
    /// --nodeport-addresses leaves out loopback.
    #[arg(long)]
    iptables_localhost_nodeports: bool,
}

/// The conntrack sysctls, with kube-proxy's flags and defaults.
#[derive(Debug, Args)]
struct ConntrackArgs {
    /// Conntrack table entries per CPU (the table gets at least --conntrack-min, at most
    /// 1,048,576 entries, and is never shrunk); 0 leaves the size alone.
    #[arg(long, default_value_t = 32_768)]
    conntrack_max_per_core: u64,
    /// The smallest conntrack table, whatever the CPU count.
    #[arg(long, default_value_t = 131_072)]
    conntrack_min: u64,
    /// Idle timeout of established TCP connections (nf_conntrack_tcp_timeout_established);
    /// 0 leaves it alone.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "24h")]
    conntrack_tcp_timeout_established: Duration,
    /// How long a TCP connection stays in CLOSE_WAIT (nf_conntrack_tcp_timeout_close_wait);
    /// 0 leaves it alone.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1h")]
    conntrack_tcp_timeout_close_wait: Duration,
    /// Track TCP liberally (nf_conntrack_tcp_be_liberal=1): out-of-window packets are not
    /// marked invalid, and the iptables and nftables modes then add no DROP rule for invalid
    /// forwarded packets.
    #[arg(long)]
    conntrack_tcp_be_liberal: bool,
    /// Idle timeout of UDP flows (nf_conntrack_udp_timeout); 0 leaves it alone.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "0s")]
    conntrack_udp_timeout: Duration,
    /// Idle timeout of UDP streams (nf_conntrack_udp_timeout_stream); 0 leaves it alone.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "0s")]
    conntrack_udp_timeout_stream: Duration,
}

impl ConntrackArgs {
    fn sysctls(&self) -> ConntrackSysctls {
        let Self {
            conntrack_max_per_core,
            conntrack_min,
            conntrack_tcp_timeout_established,
            conntrack_tcp_timeout_close_wait,
            conntrack_tcp_be_liberal,
            conntrack_udp_timeout,
            conntrack_udp_timeout_stream,
        } = self;
        ConntrackSysctls {
            max_per_core: *conntrack_max_per_core,
            min: *conntrack_min,
            tcp_established_timeout: *conntrack_tcp_timeout_established,
            tcp_close_wait_timeout: *conntrack_tcp_timeout_close_wait,
            tcp_be_liberal: *conntrack_tcp_be_liberal,
            udp_timeout: *conntrack_udp_timeout,
            udp_stream_timeout: *conntrack_udp_timeout_stream,
        }
    }

    /// Sets the sysctls in the agent's network namespace and says what happened; what
    /// cannot be set (read-only /proc/sys in an unprivileged container) is a warning.
    /// Returns how many could not be set.
    fn apply(&self) -> usize {
        let outcomes = self.sysctls().apply(&CommandRunner::new(), online_cpus());
        let mut failed = 0;
        for o in &outcomes {
            let found = o.found.as_deref().unwrap_or("unset");
            match &o.error {
                None => {
                    tracing::info!(sysctl = %o.name, value = %o.wanted, was = found, "set sysctl")
                }
                Some(err) => {
                    failed += 1;
                    tracing::warn!(
                        sysctl = %o.name, wanted = %o.wanted, value = found, %err,
                        "cannot set sysctl (run `proxyplan-agent setup` in a privileged init \
                         container; the chart does)"
                    );
                }
            }
        }
        failed
    }
}

/// The node's online CPUs (kube-proxy sizes the conntrack table by them, not by this
/// process's CPU quota).
fn online_cpus() -> u64 {
    let from_sysfs = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .map(|text| {
            text.trim()
                .split(',')
                .filter_map(|range| match range.split_once('-') {
                    Some((a, b)) => Some(b.parse::<u64>().ok()? - a.parse::<u64>().ok()? + 1),
                    None => range.parse::<u64>().ok().map(|_| 1),
                })
                .sum::<u64>()
        })
        .filter(|n| *n > 0);
    from_sysfs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
}

#[derive(Debug, Args)]
struct SetupArgs {
    #[command(flatten)]
    conntrack: ConntrackArgs,
    /// Also set route_localnet=1, which iptables mode's localhost node ports need.
    #[arg(long)]
    iptables_localhost_nodeports: bool,
}

/// `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    Auto,
    Nftables,
    Iptables,
    Ipvs,
}

/// `--iptables-backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum IptablesBackend {
    Auto,
    Nft,
    Legacy,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// This node's name: the NodeProxyPlan the agent watches.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    node: String,
    /// Kubeconfig file; without it, the in-cluster service account (or $KUBECONFIG).
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Minimum time between two change-driven syncs: changes arriving faster are
    /// coalesced into one. Default: 1s in iptables mode (each sync re-reads and replaces
    /// the tables), 0 in nftables and ipvs modes (a change is programmed as soon as it
    /// arrives; changes that arrive during a sync go together in the next). The periodic
    /// resync never makes a change wait for this interval.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    min_sync_interval: Option<Duration>,
    /// Time between periodic resyncs; each checks the canary chain and restores rules
    /// removed by someone else. /healthz fails when a change waits twice this long.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    sync_period: Duration,
    /// nftables mode: how often the agent asks the kernel whether anyone else changed its
    /// table (one netlink request and nf_tables' own change announcements; the table is
    /// read back only when someone did). Between checks, an announced commit to the table
    /// by another process (a chain flushed by hand) runs the check at once. A change is
    /// repaired from the same read; 0 turns both off and leaves it to the periodic resync.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1s")]
    tamper_check_interval: Duration,
    /// Minimum time between status writes that only change the service port and endpoint
    /// counts (conditions and the applied plan revision are written at once). Keeps
    /// endpoint churn from costing one API write per node.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "60s")]
    status_min_interval: Duration,
    /// Minimum time between status writes that only move the rollout mark
    /// (`programmedResourceVersion`: every Service plan change up to it is in the kernel,
    /// which the controller counts into each Service plan's `Programmed` column). The
    /// first one after a quiet time is written at once; under steady churn each node
    /// writes once per interval: 500 writes/s at 5,000 nodes with 10s, as many as the
    /// kubelets' Lease renewals.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    rollout_report_interval: Duration,
    /// Address of /healthz (kube-proxy's port).
    #[arg(long, value_name = "ADDRESS", default_value = "0.0.0.0:10256")]
    healthz_bind_address: SocketAddr,
    /// Address of /metrics (kube-proxy's port).
    #[arg(long, value_name = "ADDRESS", default_value = "127.0.0.1:10249")]
    metrics_bind_address: SocketAddr,
    /// Directory for what must outlive an agent restart but not a reboot (a tmpfs): the
    /// health-check node ports' last answers, served again by a restarted agent while the
    /// kernel holds its rules and it has no plan of its own applied yet (a refused plan,
    /// an unreachable API server). Empty (`--state-dir=`) keeps nothing.
    #[arg(long, value_name = "DIR", default_value = "/run/proxyplan", value_parser = path_or_empty)]
    state_dir: PathBuf,
    /// The DaemonSet this agent runs in. When the agent is stopped (SIGTERM) and that
    /// DaemonSet is gone or being deleted — an uninstall — it removes everything it owns
    /// from the kernel, of every mode, and the record in --state-dir; otherwise (a rolling
    /// update, a restart, an unreachable API server) the kernel keeps the last programmed
    /// plan. Unset: the kernel always keeps it.
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = uninstall::OwnerDaemonSet::parse)]
    owner_daemonset: Option<uninstall::OwnerDaemonSet>,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log: String,
    #[command(flatten)]
    dataplane: DataplaneArgs,
    #[command(flatten)]
    render: RenderArgs,
    #[command(flatten)]
    conntrack: ConntrackArgs,
}

#[derive(Debug, Args)]
struct ApplyArgs {
    /// A node's plan and every Service plan, as `proxyplan-controller plan --node` prints
    /// them.
    #[arg(long, value_name = "FILE")]
    plan: PathBuf,
    /// Print what would be sent to the kernel tools instead of sending it.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    dataplane: DataplaneArgs,
    #[command(flatten)]
    render: RenderArgs,
    #[command(flatten)]
    conntrack: ConntrackArgs,
}

/// `explain --protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ProtocolArg {
    Tcp,
    Udp,
    Sctp,
}

/// `explain -o`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OutputArg {
    Human,
    Json,
}

#[derive(Debug, Args)]
struct ExplainArgs {
    /// Source address of the flow: a pod's IP, an outside client's, or with --from-host
    /// one of the node's.
    #[arg(long, value_name = "IP")]
    from: std::net::IpAddr,
    /// Destination, ADDRESS:PORT ([ADDRESS]:PORT for IPv6): a cluster IP, an external
    /// or load-balancer IP with the Service's port, or a node address with a node port.
    #[arg(long, value_name = "ADDRESS:PORT")]
    to: SocketAddr,
    /// Transport protocol.
    #[arg(long, value_enum, default_value = "tcp")]
    protocol: ProtocolArg,
    /// The packet is sent by a process on the node itself (host network).
    #[arg(long)]
    from_host: bool,
    /// The interface the packet arrives on (for local-traffic detection by interface).
    #[arg(long, value_name = "NAME")]
    interface: Option<String>,
    /// Read the plan from this file (as `proxyplan-controller plan --node` prints it)
    /// instead of the API server.
    #[arg(long, value_name = "FILE")]
    plan: Option<PathBuf>,
    /// The node whose plan to read (default: $NODE_NAME, else the running agent's).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    node: Option<String>,
    /// Kubeconfig file; without it, the in-cluster service account (or $KUBECONFIG).
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The running agent's state directory: its flags are read from there
    /// (agent-args.json), so the kernel is compared with what it programs.
    #[arg(long, value_name = "DIR", default_value = "/run/proxyplan")]
    state_dir: PathBuf,
    /// Explain from the plan only; do not read the kernel.
    #[arg(long)]
    no_kernel: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "human")]
    output: OutputArg,
}

#[derive(Debug, Args)]
struct CleanupArgs {
    #[command(flatten)]
    dataplane: DataplaneArgs,
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// A node's plan and every Service plan, as `proxyplan-controller plan --node` prints
    /// them.
    #[arg(long, value_name = "FILE")]
    plan: PathBuf,
    /// Also print the iptables rules the plan renders to, as iptables-restore input.
    #[arg(long)]
    rules: bool,
}

impl Cli {
    /// Runs the chosen command.
    pub fn run(self) -> ExitCode {
        let result = match self.command {
            Command::Run(args) => run_agent(*args),
            Command::Apply(args) => apply(args),
            Command::Cleanup(args) => cleanup(args),
            Command::Check(args) => check(args),
            Command::Explain(args) => explain(*args),
            Command::Setup(args) => setup(&args),
        };
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("proxyplan-agent: error: {err:#}");
                ExitCode::FAILURE
            }
        }
    }
}

/// One `--nodeport-addresses` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodePortAddress {
    /// `primary`.
    Primary,
    /// A CIDR.
    Cidr(Cidr),
}

fn parse_nodeport_address(text: &str) -> Result<NodePortAddress, String> {
    if text == "primary" {
        return Ok(NodePortAddress::Primary);
    }
    text.parse()
        .map(NodePortAddress::Cidr)
        .map_err(|why| format!("{why}, or primary"))
}

impl RenderArgs {
    /// The CIDRs of `--nodeport-addresses`, and whether it is `primary`.
    fn nodeport(&self) -> anyhow::Result<(Vec<Cidr>, bool)> {
        let primary = self.nodeport_addresses.contains(&NodePortAddress::Primary);
        let cidrs: Vec<Cidr> = self
            .nodeport_addresses
            .iter()
            .filter_map(|a| match a {
                NodePortAddress::Cidr(c) => Some(*c),
                NodePortAddress::Primary => None,
            })
            .collect();
        anyhow::ensure!(
            !primary || cidrs.is_empty(),
            "--nodeport-addresses: use either primary or CIDRs, not both"
        );
        Ok((cidrs, primary))
    }

    fn settings(self) -> anyhow::Result<RenderSettings> {
        let (cidrs, primary) = self.nodeport()?;
        Ok(RenderSettings {
            masquerade_bit: self.masquerade_bit,
            nodeport_cidrs: cidrs.iter().map(ToString::to_string).collect(),
            nodeport_primary: primary,
            drop_invalid: true,
            localhost_nodeports: self.iptables_localhost_nodeports,
        })
    }
}

impl DataplaneArgs {
    /// The mode to run: `--mode`, with auto resolved; and why, for auto.
    fn resolve(&self) -> (ProxyMode, Option<String>) {
        match self.mode {
            ModeArg::Nftables => (ProxyMode::Nftables, None),
            ModeArg::Iptables => (ProxyMode::Iptables, None),
            ModeArg::Ipvs => (ProxyMode::Ipvs, None),
            ModeArg::Auto => {
                let (mode, why) = switch::auto_mode();
                (mode, Some(why))
            }
        }
    }

    /// The dataplane of `mode`, rendering with `render`.
    fn dataplane(&self, mode: ProxyMode, render: &RenderSettings) -> Box<dyn Dataplane + Send> {
        let Self {
            mode: _,
            iptables_backend,
            ipvs,
        } = self;
        let choice = match iptables_backend {
            IptablesBackend::Auto => BackendChoice::Auto,
            IptablesBackend::Nft => BackendChoice::Nft,
            IptablesBackend::Legacy => BackendChoice::Legacy,
        };
        match mode {
            ProxyMode::Nftables => Box::new(NftablesDataplane::new(
                nftables_settings(render),
                NetlinkNft::new(),
                CommandRunner::new(),
            )),
            ProxyMode::Iptables => Box::new(IptablesDataplane::with_backend_choice(
                render.clone(),
                CommandRunner::new(),
                choice,
            )),
            ProxyMode::Ipvs => {
                let IpvsArgs {
                    ipvs_scheduler,
                    ipvs_exclude_cidrs,
                    ipvs_strict_arp,
                    ipvs_interface,
                    ipvs_termination_grace,
                    ipvs_tcp_timeout,
                    ipvs_tcpfin_timeout,
                    ipvs_udp_timeout,
                } = ipvs;
                let nodeport_cidrs = render
                    .nodeport_cidrs
                    .iter()
                    .filter_map(|c| c.parse().ok())
                    .collect();
                let settings = IpvsSettings {
                    scheduler: ipvs_scheduler.clone(),
                    masquerade_bit: render.masquerade_bit,
                    interface: ipvs_interface.clone(),
                    exclude_cidrs: ipvs_exclude_cidrs.clone(),
                    nodeport_cidrs,
                    nodeport_primary: render.nodeport_primary,
                    strict_arp: *ipvs_strict_arp,
                    termination_grace: *ipvs_termination_grace,
                    timeouts: IpvsTimeouts {
                        tcp: *ipvs_tcp_timeout,
                        tcp_fin: *ipvs_tcpfin_timeout,
                        udp: *ipvs_udp_timeout,
                    },
                };
                Box::new(IpvsDataplane::new(
                    settings,
                    NetlinkKernel::new(),
                    CommandRunner::new(),
                    choice,
                ))
            }
        }
    }

    /// `--mode`, unless it is auto.
    fn resolve_explicit(&self) -> Option<ProxyMode> {
        match self.mode {
            ModeArg::Auto => None,
            _ => Some(self.resolve().0),
        }
    }

    /// `mode`'s dataplane, which removes what the agent owns of the other modes: what
    /// must go first now (one line per thing done, for the log), the rest after its
    /// first successful sync.
    fn dataplane_leaving_others(
        self,
        mode: ProxyMode,
        render: RenderSettings,
        log: fn(&str),
    ) -> (Box<dyn Dataplane + Send>, Vec<String>) {
        let (before, after) = switch::other_modes(mode, &self.ipvs.ipvs_interface);
        let done = switch::remove_modes(mode, &before, &|other| self.dataplane(other, &render));
        let inner = self.dataplane(mode, &render);
        let deferred: Option<switch::Deferred> = (!after.is_empty()).then(|| {
            Box::new(move || {
                switch::remove_modes(mode, &after, &|other| self.dataplane(other, &render))
            }) as switch::Deferred
        });
        (
            Box::new(switch::LeavingOtherModes::new(inner, deferred, log)),
            done,
        )
    }
}

fn run_agent(args: RunArgs) -> anyhow::Result<()> {
    let RunArgs {
        node,
        kubeconfig,
        min_sync_interval,
        sync_period,
        tamper_check_interval,
        status_min_interval,
        rollout_report_interval,
        healthz_bind_address,
        metrics_bind_address,
        state_dir,
        owner_daemonset,
        log,
        dataplane: dataplane_args,
        render,
        conntrack,
    } = args;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&log).context("--log")?)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    anyhow::ensure!(!node.is_empty(), "--node (or NODE_NAME) must not be empty");
    anyhow::ensure!(!sync_period.is_zero(), "--sync-period must be positive");
    // Before the dataplane starts: iptables mode reads nf_conntrack_tcp_be_liberal.
    conntrack.apply();
    record_args(&state_dir);
    let (nodeport_addresses, nodeport_primary) = render.nodeport()?;
    let render = render.settings()?;
    let (mode, why) = dataplane_args.resolve();
    if let Some(why) = why {
        tracing::info!("{why}");
    }
    let min_sync_interval = min_sync_interval.unwrap_or(match mode {
        ProxyMode::Iptables => Duration::from_secs(1),
        ProxyMode::Nftables | ProxyMode::Ipvs => Duration::ZERO,
    });
    // An uninstall removes what every mode left, whatever --mode says.
    let every_mode = DataplaneArgs {
        mode: ModeArg::Auto,
        ..dataplane_args.clone()
    };
    let (dataplane, done) =
        dataplane_args.dataplane_leaving_others(mode, render, |line| tracing::info!("{line}"));
    for done in done {
        tracing::info!("{done}");
    }
    let settings = run::Settings {
        node_name: node,
        kubeconfig: kubeconfig.clone(),
        mode,
        nodeport_addresses,
        nodeport_primary,
        min_sync_interval,
        sync_period,
        tamper_check_interval,
        status_min_interval,
        rollout_report_interval,
        healthz_bind_address,
        metrics_bind_address,
        state_dir: (!state_dir.as_os_str().is_empty()).then_some(state_dir.clone()),
    };
    // The sync loop, the watches and the status writes run on this thread; HTTP
    // (`/healthz`, `/metrics`, health-check node ports) on one of its own, the kernel
    // work on another. A fixed, small number of threads keeps memory the same on a node
    // of 4 or 128 cores: each thread that allocates gets its own malloc arena, and the
    // watch buffers (15 MiB of start-up list at 10,000 Services) now share this one's.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run::run(settings, dataplane))?;
    if let Some(owner) = owner_daemonset {
        let gone = runtime.block_on(owner.is_gone(kubeconfig.as_deref()));
        match gone {
            Ok(false) => tracing::info!(
                daemonset = %owner,
                "the DaemonSet is still there (a restart or an update): the kernel keeps the \
                 last programmed plan"
            ),
            Ok(true) => {
                tracing::info!(
                    daemonset = %owner,
                    "the DaemonSet is gone (uninstall): removing everything the agent owns"
                );
                let removed = remove_everything(&every_mode);
                uninstall::remove_state(&state_dir);
                for done in removed? {
                    tracing::info!("{done}");
                }
            }
            Err(err) => tracing::warn!(
                daemonset = %owner,
                %err,
                "cannot tell whether the DaemonSet is gone: the kernel keeps the last \
                 programmed plan"
            ),
        }
    }
    Ok(())
}

/// Removes what the agent owns in every mode (or only `--mode`'s when it is not auto);
/// one line per mode that had something. A mode that fails does not stop the others.
///
/// # Errors
/// When some mode's removal failed (the others were still done).
fn remove_everything(dataplane_args: &DataplaneArgs) -> anyhow::Result<Vec<String>> {
    let render = RenderSettings::default();
    let modes = match dataplane_args.resolve_explicit() {
        Some(mode) => vec![mode],
        None => vec![ProxyMode::Nftables, ProxyMode::Iptables, ProxyMode::Ipvs],
    };
    let every = modes.len() > 1;
    let mut done = Vec::new();
    let mut failed = Vec::new();
    for mode in modes {
        if every && !switch::may_have_left(mode, &dataplane_args.ipvs.ipvs_interface) {
            continue;
        }
        match dataplane_args.dataplane(mode, &render).cleanup() {
            Ok(report) => done.push(format!(
                "removed what the agent owned ({mode} mode): {} chains or objects",
                report.changed
            )),
            Err(err) => failed.push(format!("{mode} mode: {err}")),
        }
    }
    if failed.is_empty() {
        Ok(done)
    } else {
        for line in &done {
            eprintln!("{line}");
        }
        anyhow::bail!("could not remove everything: {}", failed.join("; "))
    }
}

fn apply(args: ApplyArgs) -> anyhow::Result<()> {
    let ApplyArgs {
        plan,
        dry_run,
        dataplane: dataplane_args,
        render,
        conntrack,
    } = args;
    // The merge takes the parsed plan and Service plans (moving their entries) and drops the
    // rest: only the merged plan is left when the dataplane starts.
    let merged = read_plan_file(&plan)
        .with_context(|| format!("{}: plan refused, nothing was changed", plan.display()))?;
    // Shared, not copied: ipvs mode keeps the plan it synced to compare the next with.
    let merged = std::sync::Arc::new(merged);
    let render = render.settings()?;
    let (mode, why) = dataplane_args.resolve();
    if let Some(why) = why {
        eprintln!("{why}");
    }
    let mut dataplane = if dry_run {
        dataplane_args.dataplane(mode, &render)
    } else {
        conntrack.apply();
        let (dataplane, done) =
            dataplane_args.dataplane_leaving_others(mode, render, |line| eprintln!("{line}"));
        for done in done {
            eprintln!("{done}");
        }
        dataplane
    };
    let started = std::time::Instant::now();
    let report = dataplane.sync_shared(&merged, dry_run)?;
    let elapsed = started.elapsed();
    let endpoints = run::status::endpoint_count(&merged);
    let summary = format!(
        "node {} plan revision {} ({mode} mode): {} service ports, {} endpoints; {} rules, {} \
         changed, {} conntrack entries deleted, {} ms",
        merged.node_name,
        merged.revision,
        merged.service_ports.len(),
        endpoints,
        report.rules,
        report.changed,
        report.conntrack_deleted,
        elapsed.as_millis()
    );
    if dry_run {
        print!("{}", report.payload);
        eprintln!("dry run, nothing was changed: {summary}");
    } else {
        println!("applied {summary}");
    }
    Ok(())
}

fn setup(args: &SetupArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let mut failed = args.conntrack.apply();
    if args.iptables_localhost_nodeports {
        let name = "net/ipv4/conf/all/route_localnet";
        match CommandRunner::new().write_sysctl(name, "1") {
            Ok(()) => tracing::info!(sysctl = name, value = "1", "set sysctl"),
            Err(err) => {
                failed += 1;
                tracing::warn!(sysctl = name, %err, "cannot set sysctl");
            }
        }
    }
    anyhow::ensure!(
        failed == 0,
        "{failed} sysctl(s) could not be set (see above)"
    );
    Ok(())
}

fn cleanup(args: CleanupArgs) -> anyhow::Result<()> {
    let CleanupArgs {
        dataplane: dataplane_args,
    } = args;
    for done in remove_everything(&dataplane_args)? {
        println!("{done}");
    }
    Ok(())
}

/// The file in the state directory that holds the running agent's arguments, for
/// `explain` to render exactly as it does.
const AGENT_ARGS_FILE: &str = "agent-args.json";

/// Records this agent's arguments in the state directory (best effort).
/// A path, where empty is a value of its own (clap's path parser refuses it).
fn path_or_empty(value: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(value))
}

fn record_args(state_dir: &std::path::Path) {
    if state_dir.as_os_str().is_empty() {
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let written = std::fs::create_dir_all(state_dir).and_then(|()| {
        std::fs::write(
            state_dir.join(AGENT_ARGS_FILE),
            serde_json::to_vec(&args).unwrap_or_default(),
        )
    });
    if let Err(err) = written {
        tracing::warn!(dir = %state_dir.display(), %err, "could not record the agent's arguments for explain");
    }
}

/// The running agent's `run` arguments, from its state directory; `None` when there is no
/// record (then `explain` renders with the defaults).
fn recorded_run_args(state_dir: &std::path::Path) -> anyhow::Result<Option<RunArgs>> {
    let path = state_dir.join(AGENT_ARGS_FILE);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err).with_context(|| path.display().to_string()),
    };
    let args: Vec<String> = serde_json::from_slice(&text)
        .with_context(|| format!("{}: not a JSON list", path.display()))?;
    let cli = Cli::try_parse_from(std::iter::once("proxyplan-agent".to_owned()).chain(args))
        .with_context(|| format!("{}: the recorded arguments do not parse", path.display()))?;
    match cli.command {
        Command::Run(run) => Ok(Some(*run)),
        _ => anyhow::bail!("{}: not the arguments of `run`", path.display()),
    }
}

/// The merged plan of `node`, from the API server.
fn plan_from_api(
    node: &str,
    kubeconfig: Option<&std::path::Path>,
) -> anyhow::Result<proxyplan_crds::MergedPlan> {
    use kube::api::{Api, ListParams};
    use proxyplan_crds::{NodeProxyPlan, ServiceProxyPlan};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let client = proxyplan_crds::runtime::client(kubeconfig).await?;
        let plan = Api::<NodeProxyPlan>::all(client.clone())
            .get_opt(node)
            .await
            .with_context(|| format!("reading NodeProxyPlan {node}"))?
            .with_context(|| format!("no NodeProxyPlan {node}: is the controller running, and is the node name right?"))?;
        let services = Api::<ServiceProxyPlan>::all(client)
            .list(&ListParams::default().labels(&run::watches::service_plan_selector()))
            .await
            .context("listing ServiceProxyPlans")?
            .items;
        let merged = proxyplan_crds::merge_owned(plan, services)
            .with_context(|| format!("NodeProxyPlan {node} is refused"))?;
        for refused in &merged.refused {
            eprintln!("note: {refused}");
        }
        Ok(merged)
    })
}

fn explain(args: ExplainArgs) -> anyhow::Result<()> {
    use proxyplan_agent::explain::{self as x, Flow, KernelView};
    let ExplainArgs {
        from,
        to,
        protocol,
        from_host,
        interface,
        plan,
        node,
        kubeconfig,
        state_dir,
        no_kernel,
        output,
    } = args;
    let recorded = recorded_run_args(&state_dir)?;
    let merged = match &plan {
        Some(file) => read_plan_file(file)?,
        None => {
            let node = node
                .or_else(|| recorded.as_ref().map(|r| r.node.clone()))
                .context("no node: give --node (or NODE_NAME), or --plan FILE")?;
            let kubeconfig =
                kubeconfig.or_else(|| recorded.as_ref().and_then(|r| r.kubeconfig.clone()));
            plan_from_api(&node, kubeconfig.as_deref())?
        }
    };
    let merged = std::sync::Arc::new(merged);
    let flow = Flow {
        source: from,
        destination: to.ip(),
        port: to.port(),
        protocol: match protocol {
            ProtocolArg::Tcp => proxyplan_crds::Protocol::TCP,
            ProtocolArg::Udp => proxyplan_crds::Protocol::UDP,
            ProtocolArg::Sctp => proxyplan_crds::Protocol::SCTP,
        },
        from_host,
        interface,
    };
    let (dataplane_args, render) = match recorded {
        Some(run) => (run.dataplane, run.render),
        None => {
            let Command::Run(run) =
                Cli::try_parse_from(["proxyplan-agent", "run", "--node", "-"])?.command
            else {
                anyhow::bail!("the default arguments do not parse");
            };
            (run.dataplane, run.render)
        }
    };
    let render = render.settings()?;
    let kernel = (!no_kernel).then(|| held_mode(&dataplane_args, &render));
    let mode = match &kernel {
        Some(Ok(Some(mode))) => *mode,
        _ => dataplane_args
            .resolve_explicit()
            .unwrap_or(ProxyMode::Nftables),
    };
    let mut explanation = x::explain(&merged, &flow, mode.as_str());
    explanation.kernel = kernel.map(|held| match held {
        Err(err) => KernelView {
            error: Some(format!("{err:#}")),
            ..KernelView::default()
        },
        Ok(None) => KernelView::default(),
        Ok(Some(mode)) => kernel_view(&dataplane_args, &render, mode, &merged, &explanation),
    });
    match output {
        OutputArg::Human => print!("{}", x::human(&explanation)),
        OutputArg::Json => println!("{}", serde_json::to_string_pretty(&explanation)?),
    }
    Ok(())
}

/// The mode whose rules the node holds (`--mode` when it names one), or none.
fn held_mode(args: &DataplaneArgs, render: &RenderSettings) -> anyhow::Result<Option<ProxyMode>> {
    let candidates = match args.resolve_explicit() {
        Some(mode) => vec![mode],
        // ipvs before iptables: ipvs mode holds iptables rules of its own too.
        None => vec![ProxyMode::Nftables, ProxyMode::Ipvs, ProxyMode::Iptables],
    };
    let mut last_error = None;
    for mode in candidates {
        // ipvs and iptables modes share their iptables jumps: ipvs mode also has its
        // dummy interface.
        if mode == ProxyMode::Ipvs && !switch::may_have_left(mode, &args.ipvs.ipvs_interface) {
            continue;
        }
        match args.dataplane(mode, render).holds_rules() {
            Ok(true) => return Ok(Some(mode)),
            Ok(false) => {}
            Err(err) => {
                last_error = Some(anyhow::Error::from(err).context(format!(
                    "asking the kernel for {} mode's rules",
                    mode.as_str()
                )))
            }
        }
    }
    match (args.resolve_explicit(), last_error) {
        (Some(_), Some(err)) => Err(err),
        _ => Ok(None),
    }
}

/// The kernel's side: a dry-run sync of the plan against the live kernel, and in iptables
/// mode the live rules' trace of the packet.
fn kernel_view(
    args: &DataplaneArgs,
    render: &RenderSettings,
    mode: ProxyMode,
    merged: &std::sync::Arc<proxyplan_crds::MergedPlan>,
    explanation: &proxyplan_agent::explain::Explanation,
) -> proxyplan_agent::explain::KernelView {
    use proxyplan_agent::explain::{KernelView, MAX_DIFFERENCES};
    let mut view = KernelView {
        mode: Some(mode.as_str().to_owned()),
        ..KernelView::default()
    };
    match args.dataplane(mode, render).sync_shared(merged, true) {
        Ok(report) => {
            view.changes = report.changed;
            view.agrees = report.changed == 0;
            view.differences = report
                .payload
                .lines()
                .filter(|l| !l.trim().is_empty())
                .take(MAX_DIFFERENCES)
                .map(str::to_owned)
                .collect();
        }
        Err(err) => view.error = Some(format!("a dry-run sync failed: {err}")),
    }
    let traced = match mode {
        ProxyMode::Iptables => Some(trace_live(args, merged, explanation)),
        ProxyMode::Nftables => Some(trace_live_nftables(render, merged, explanation)),
        ProxyMode::Ipvs => Some(trace_live_ipvs(args, merged, explanation)),
    };
    match traced {
        Some(Ok(traced)) => view.traced = Some(traced),
        Some(Err(err)) => view.trace_error = Some(err),
        None => {}
    }
    view
}

/// nftables mode: the packet traced through the live table (the mode's own rules,
/// checked chain by chain against the kernel's, and the kernel's map elements).
fn trace_live_nftables(
    render: &RenderSettings,
    merged: &proxyplan_crds::MergedPlan,
    explanation: &proxyplan_agent::explain::Explanation,
) -> Result<proxyplan_agent::explain::Traced, String> {
    use proxyplan_agent::modes::nftables::trace::{Packet, trace_live};
    let settings = nftables_settings(render);
    let flow = &explanation.flow;
    let packet = Packet {
        source: flow.source,
        destination: flow.destination,
        protocol: flow.protocol.number(),
        port: flow.port,
        from_host: flow.from_host,
        interface: flow.interface.clone(),
    };
    let mut kernel = NetlinkNft::new();
    let trace = trace_live(&mut kernel, merged, &settings, &packet).map_err(|e| e.to_string())?;
    let endpoints = trace.endpoints();
    let verdict = trace.verdict().as_str();
    Ok(proxyplan_agent::explain::Traced {
        verdict: verdict.to_owned(),
        agrees_with_plan: agrees(explanation, verdict, &endpoints),
        masquerade: endpoints.values().any(|m| *m),
        endpoints: endpoints.into_keys().collect(),
        rules: trace
            .paths
            .first()
            .map(|p| p.steps.clone())
            .unwrap_or_default(),
    })
}

/// nftables mode's settings from the flags it shares with the other modes.
fn nftables_settings(render: &RenderSettings) -> NftablesSettings {
    NftablesSettings {
        masquerade_bit: render.masquerade_bit,
        nodeport_cidrs: render
            .nodeport_cidrs
            .iter()
            .filter_map(|c| Net::parse(c))
            .collect(),
        nodeport_primary: render.nodeport_primary,
        drop_invalid: render.drop_invalid,
    }
}

/// Whether a live trace (`verdict`, and the endpoints it reaches with whether each is
/// masqueraded) says what the plan says.
fn agrees(
    explanation: &proxyplan_agent::explain::Explanation,
    verdict: &str,
    endpoints: &std::collections::BTreeMap<String, bool>,
) -> bool {
    use proxyplan_agent::explain::Verdict;
    match &explanation.verdict {
        Verdict::Dnat {
            endpoints: reach, ..
        } => {
            verdict == "accept"
                && endpoints.keys().collect::<Vec<_>>()
                    == reach
                        .iter()
                        .map(|r| &r.endpoint)
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect::<Vec<_>>()
                && reach
                    .iter()
                    .all(|r| endpoints.get(&r.endpoint) == Some(&r.masquerade))
        }
        Verdict::Reject { .. } => verdict == "reject",
        Verdict::Drop { .. } => verdict == "drop",
        Verdict::NotProxied { .. } => verdict == "accept" && endpoints.is_empty(),
    }
}

/// The live rules of the explained packet's family, as `iptables-save` (or
/// `ip6tables-save`) of the agent's backend prints them.
fn iptables_save(
    args: &DataplaneArgs,
    explanation: &proxyplan_agent::explain::Explanation,
) -> Result<String, String> {
    use proxyplan_agent::kernel::iptables::{Backend, Tool};
    let runner = CommandRunner::new();
    let choice = match args.iptables_backend {
        IptablesBackend::Auto => BackendChoice::Auto,
        IptablesBackend::Nft => BackendChoice::Nft,
        IptablesBackend::Legacy => BackendChoice::Legacy,
    };
    let family = if explanation.flow.destination.is_ipv4() {
        proxyplan_agent::kernel::Family::V4
    } else {
        proxyplan_agent::kernel::Family::V6
    };
    let save = Backend::resolve(choice, &runner).binary(family, Tool::Save);
    let out = runner
        .run(&save, &[], None)
        .map_err(|e| format!("{save}: {e}"))?;
    Ok(out.stdout)
}

/// The explained flow as the iptables tracer's packet.
fn iptables_packet(
    explanation: &proxyplan_agent::explain::Explanation,
) -> proxyplan_agent::modes::iptables::trace::Packet {
    let flow = &explanation.flow;
    let packet = proxyplan_agent::modes::iptables::trace::Packet::new(
        flow.source,
        flow.destination,
        flow.protocol,
        flow.port,
    );
    if flow.from_host {
        packet.host_originated()
    } else {
        packet
    }
}

/// What `explain` prints of an iptables or ipvs mode trace.
fn traced(
    result: &proxyplan_agent::modes::iptables::trace::TraceResult,
    explanation: &proxyplan_agent::explain::Explanation,
) -> proxyplan_agent::explain::Traced {
    let verdict = result.verdict.as_str();
    proxyplan_agent::explain::Traced {
        verdict: verdict.to_owned(),
        agrees_with_plan: agrees(explanation, verdict, &result.reached()),
        endpoints: result.endpoints.iter().cloned().collect(),
        masquerade: result.masquerade,
        rules: result
            .paths
            .first()
            .map(|p| p.rules.clone())
            .unwrap_or_default(),
    }
}

/// iptables mode: the packet traced through the live rules.
fn trace_live(
    args: &DataplaneArgs,
    merged: &proxyplan_crds::MergedPlan,
    explanation: &proxyplan_agent::explain::Explanation,
) -> Result<proxyplan_agent::explain::Traced, String> {
    use proxyplan_agent::modes::iptables::trace;
    let rules = trace::live_rules(&iptables_save(args, explanation)?);
    let result = trace::trace(&rules, &merged.addresses, &iptables_packet(explanation))
        .map_err(|e| format!("tracing the live rules: {e}"))?;
    Ok(traced(&result, explanation))
}

/// ipvs mode: the packet traced through the live rules, ipsets and IPVS.
fn trace_live_ipvs(
    args: &DataplaneArgs,
    merged: &proxyplan_crds::MergedPlan,
    explanation: &proxyplan_agent::explain::Explanation,
) -> Result<proxyplan_agent::explain::Traced, String> {
    let save = iptables_save(args, explanation)?;
    let mut kernel = NetlinkKernel::new();
    let result = proxyplan_agent::modes::ipvs::trace::trace_live(
        &mut kernel,
        &save,
        &merged.addresses,
        &iptables_packet(explanation),
    )
    .map_err(|e| e.to_string())?;
    Ok(traced(&result, explanation))
}

fn check(args: CheckArgs) -> anyhow::Result<()> {
    let CheckArgs { plan, rules } = args;
    let merged = read_plan_file(&plan)?;
    print_merged(&merged);
    if rules {
        let rendered =
            proxyplan_agent::modes::iptables::render(&merged, &RenderSettings::default());
        for (tool, family) in [("iptables", &rendered.v4), ("ip6tables", &rendered.v6)] {
            if family.rule_count() > 0 {
                println!("# {tool}-restore input ({} rules)", family.rule_count());
                print!("{}", family.dump());
            }
        }
    }
    Ok(())
}

/// Reads and merges a plan file. Unlike `run`, which refuses a bad Service plan alone
/// and goes on, a file is refused whole when any object in it is invalid: nothing is
/// half-applied from a file. Overlay entries without their Service plan are reported.
fn read_plan_file(path: &std::path::Path) -> anyhow::Result<proxyplan_crds::MergedPlan> {
    let (node_plan, services) = plan_file::read(path)?;
    let merged = proxyplan_crds::merge_owned(node_plan, services)?;
    if let Some(first) = merged.refused.first() {
        let more = merged.refused.len() - 1;
        anyhow::bail!(
            "{first}{}",
            if more > 0 {
                format!(" (and {more} more refused Service plan(s))")
            } else {
                String::new()
            }
        );
    }
    for key in &merged.unmatched {
        eprintln!(
            "note: the node plan's overlay names {key}, which no Service plan in the file has"
        );
    }
    Ok(merged)
}

fn print_merged(merged: &proxyplan_crds::MergedPlan) {
    println!(
        "node {} revision {}: {} service ports",
        merged.node_name,
        merged.revision,
        merged.service_ports.len()
    );
    for entry in &merged.service_ports {
        let internal = entry.endpoints_for(&entry.internal);
        let external = entry.external.as_ref().map(|t| (t, entry.endpoints_for(t)));
        print!(
            "  {:<36} {}:{} -> {} endpoints",
            entry.key,
            entry.cluster_ip,
            entry.port,
            internal.len()
        );
        if let Some((traffic, eps)) = external {
            let policy = if traffic.policy == TrafficPolicy::Local {
                "Local"
            } else {
                "Cluster"
            };
            print!("; external ({policy}) -> {} endpoints", eps.len());
            if eps.is_empty() {
                print!(" ({:?})", traffic.when_empty);
            }
        }
        if internal.is_empty() {
            print!(" (internal: {:?})", entry.internal.when_empty);
        }
        println!();
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Cli, Command, parse_ipvs_timeout};

    fn nodeport(args: &[&str]) -> Result<(usize, bool), String> {
        let mut argv = vec!["proxyplan-agent", "apply", "--plan", "p.yaml"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        let Command::Apply(apply) = cli.command else {
            return Err("not apply".to_owned());
        };
        apply
            .render
            .nodeport()
            .map(|(cidrs, primary)| (cidrs.len(), primary))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn nodeport_addresses_take_cidrs_or_primary_not_both() {
        assert_eq!(nodeport(&[]), Ok((0, false)));
        assert_eq!(
            nodeport(&["--nodeport-addresses", "primary"]),
            Ok((0, true))
        );
        assert_eq!(
            nodeport(&["--nodeport-addresses", "10.0.0.0/8,fd00::/64"]),
            Ok((2, false))
        );
        let both = nodeport(&["--nodeport-addresses", "primary,10.0.0.0/8"]).unwrap_err();
        assert!(both.contains("either primary or CIDRs"), "{both}");
        let bad = nodeport(&["--nodeport-addresses", "10.0.0.0"]).unwrap_err();
        assert!(
            bad.contains("--nodeport-addresses") && bad.contains("or primary"),
            "{bad}"
        );
    }

    #[test]
    fn an_empty_state_dir_keeps_nothing_and_parses() {
        let dir = |args: &[&str]| {
            let mut argv = vec!["proxyplan-agent", "run", "--node", "n"];
            argv.extend_from_slice(args);
            match Cli::try_parse_from(argv).map(|c| c.command) {
                Ok(Command::Run(run)) => Ok(run.state_dir),
                Ok(_) => Err("not run".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        };
        assert_eq!(dir(&[]), Ok("/run/proxyplan".into()));
        assert_eq!(dir(&["--state-dir="]), Ok("".into()));
        assert_eq!(dir(&["--state-dir", ""]), Ok("".into()));
    }

    #[test]
    fn ipvs_timeouts_are_whole_seconds() {
        assert_eq!(parse_ipvs_timeout("0s"), Ok(0));
        assert_eq!(parse_ipvs_timeout("0"), Ok(0));
        assert_eq!(parse_ipvs_timeout("1h"), Ok(3600));
        assert_eq!(parse_ipvs_timeout("15m30s"), Ok(930));
        assert!(parse_ipvs_timeout("1.5s").is_err());
        assert!(parse_ipvs_timeout("500ms").is_err());
        assert!(parse_ipvs_timeout("forever").is_err());
    }
}
