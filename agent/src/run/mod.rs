//! `proxyplan-agent run`: watch this node's plan and the Service plans, program the
//! kernel through a [`Dataplane`], report on the plan's status.
//!
//! One task owns the [`SyncLoop`]: it receives watch events, decides when to sync
//! (minimum interval, periodic resync, retries), hands the merged plan to the dataplane
//! thread and keeps the health-check node ports in step. Status writes run in a task of
//! their own, so an unreachable API server never delays a sync; `/healthz`, `/metrics`
//! and the health-check node ports are served on a thread of their own
//! ([`http::HttpThread`]), so a long merge never delays an answer.

pub mod cache;
pub mod healthcheck;
pub mod http;
pub mod plan_file;
pub mod record;
pub mod schedule;
pub mod status;
pub mod sync;
pub mod watches;
pub mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::{Api, Client};
use tracing::info;

use crate::dataplane::Dataplane;
pub use healthcheck::Cidr;
use http::{Health, Metrics};
pub use sync::SyncLoop;
use watches::Watches;

/// The proxy mode: how plans become kernel state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum ProxyMode {
    /// One nf_tables table of the agent's own, with sets and verdict maps: O(1) packet
    /// lookup, programmed by difference over netlink.
    Nftables,
    /// IPVS virtual servers, VIPs on a dummy interface, ipsets and a fixed set of
    /// iptables rules: O(1) packet lookup however many services exist.
    Ipvs,
    /// iptables (`iptables-restore`), one chain per service and endpoint.
    Iptables,
}

impl ProxyMode {
    /// The mode's name, as the status and the command line spell it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nftables => "nftables",
            Self::Ipvs => "ipvs",
            Self::Iptables => "iptables",
        }
    }
}

impl std::fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything `run` needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// This node's name: the only `NodeProxyPlan` the agent watches.
    pub node_name: String,
    /// Kubeconfig file, else in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// Proxy mode (reported in the status).
    pub mode: ProxyMode,
    /// Health-check node ports listen on the node's addresses inside these CIDRs; empty
    /// means every address.
    pub nodeport_addresses: Vec<Cidr>,
    /// `--nodeport-addresses primary`: health-check node ports listen on the node's
    /// primary IPs only.
    pub nodeport_primary: bool,
    /// Minimum time between two syncs: changes arriving faster are coalesced.
    pub min_sync_interval: Duration,
    /// Time between periodic resyncs (with a canary check); `/healthz` fails when a
    /// change has waited twice this long.
    pub sync_period: Duration,
    /// nftables mode: how often the kernel is asked whether anyone else changed the
    /// agent's table, which is then repaired at once; zero leaves it to the periodic
    /// resync.
    pub tamper_check_interval: Duration,
    /// Minimum time between status writes that only change `appliedShards`, counts or
    /// the sync duration.
    pub status_min_interval: Duration,
    /// Minimum time between status writes that only move the rollout mark.
    pub rollout_report_interval: Duration,
    /// `/healthz` address.
    pub healthz_bind_address: SocketAddr,
    /// `/metrics` address.
    pub metrics_bind_address: SocketAddr,
    /// Where the agent keeps its [`record::HealthCheckRecord`] (a tmpfs such as
    /// `/run/proxyplan`, cleared by a reboot with the kernel state); `None` keeps none.
    pub state_dir: Option<PathBuf>,
}

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No usable client configuration.
    #[error("kubernetes client configuration: {0}")]
    Config(String),
    /// An HTTP server could not start or stopped.
    #[error("serving {what}: {source}")]
    Http {
        /// `/healthz` or `/metrics`, and the address.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The dataplane thread could not be started.
    #[error("starting the dataplane thread: {0}")]
    DataplaneThread(std::io::Error),
    /// The dataplane thread is gone (it panicked); the kernel state is unknown.
    #[error("the dataplane thread stopped unexpectedly; restart the agent")]
    DataplaneStopped,
}

/// Runs the agent until SIGTERM or Ctrl-C.
///
/// # Errors
/// When no client can be configured, the HTTP servers cannot bind, or the dataplane
/// thread dies.
pub async fn run(
    settings: Settings,
    dataplane: impl Dataplane + Send + 'static,
) -> Result<(), RunError> {
    let client = proxyplan_crds::runtime::client(settings.kubeconfig.as_deref())
        .await
        .map_err(|e| RunError::Config(e.to_string()))?;
    Agent::bind(settings, client, dataplane)
        .await?
        .run(proxyplan_crds::runtime::shutdown_signal())
        .await
}

/// An agent whose HTTP listeners are bound (or waiting for their port), ready to run.
pub struct Agent<D> {
    settings: Settings,
    client: Client,
    dataplane: D,
    healthz: http::Listener,
    metrics: Option<http::Listener>,
}

impl<D: Dataplane + Send + 'static> Agent<D> {
    /// Binds `/healthz` and `/metrics` (one listener when the addresses are equal). A port
    /// already in use (kube-proxy's, while both run during a migration) is not fatal: the
    /// agent starts without it, says so, and binds it as soon as it is free.
    ///
    /// # Errors
    /// When an address cannot be bound for another reason (no such address, no
    /// permission).
    pub async fn bind(settings: Settings, client: Client, dataplane: D) -> Result<Self, RunError> {
        let healthz = http::Listener::bind(settings.healthz_bind_address, "/healthz")?;
        let metrics = if settings.metrics_bind_address == settings.healthz_bind_address {
            None
        } else {
            Some(http::Listener::bind(
                settings.metrics_bind_address,
                "/metrics",
            )?)
        };
        Ok(Self {
            settings,
            client,
            dataplane,
            healthz,
            metrics,
        })
    }

    /// The address `/healthz` listens on (or will, once its port is free).
    #[must_use]
    pub fn healthz_address(&self) -> SocketAddr {
        self.healthz.address()
    }

    /// The address `/metrics` listens on (or will, once its port is free).
    #[must_use]
    pub fn metrics_address(&self) -> SocketAddr {
        self.metrics
            .as_ref()
            .map_or_else(|| self.healthz.address(), http::Listener::address)
    }

    /// Runs until `shutdown` completes. The kernel keeps what was programmed.
    ///
    /// # Errors
    /// When an HTTP server fails or the dataplane thread dies.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
        let Self {
            settings,
            client,
            dataplane,
            healthz,
            metrics: metrics_listener,
        } = self;
        let metrics = Arc::new(Metrics::new());
        let health = Arc::new(Health::new(2 * settings.sync_period));
        let http_thread = http::HttpThread::start().map_err(|source| RunError::Http {
            what: "starting the HTTP thread".to_owned(),
            source,
        })?;
        let http = http_thread.handle().spawn(http::serve(
            healthz,
            metrics_listener,
            metrics.clone(),
            health.clone(),
        ));
        let (status_tx, status_rx) = tokio::sync::watch::channel(None);
        let writer = tokio::spawn(status::write_statuses(
            Api::all(client.clone()),
            settings.node_name.clone(),
            status_rx,
            metrics.clone(),
        ));
        let watches = Watches::new(client, &settings.node_name);
        info!(node = %settings.node_name, mode = %settings.mode, "starting");
        let mut sync = SyncLoop::new(
            &settings,
            dataplane,
            metrics,
            health,
            status_tx,
            http_thread.handle().clone(),
        )?;
        let result = tokio::select! {
            result = sync.run(watches.all(), shutdown) => result,
            result = http => Err(match result {
                Ok(Err(err)) => err,
                _ => RunError::Http {
                    what: "/healthz and /metrics".to_owned(),
                    source: std::io::Error::other("server task ended"),
                },
            }),
        };
        writer.abort();
        let _ = writer.await;
        if result.is_ok() {
            info!("stopped; the kernel keeps the last programmed plan");
        }
        result
    }
}
