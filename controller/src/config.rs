//! Policy inputs shared by `run` and `plan`.

use proxyplan_crds::{IpFamily, LocalTrafficMode};

use crate::model::parse_cidr;

/// Cluster-wide policy the planner applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannerConfig {
    /// Cluster CIDRs (normalised), for `ClusterCIDR` local-traffic detection.
    pub cluster_cidrs: Vec<String>,
    /// Masquerade all traffic to service VIPs.
    pub masquerade_all: bool,
    /// How nodes tell in-cluster from off-cluster traffic.
    pub detect_local_mode: LocalTrafficMode,
}

/// A configuration value that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// `--cluster-cidr` is malformed.
    #[error("--cluster-cidr: {0}")]
    ClusterCidr(String),
    /// Two cluster CIDRs of one family.
    #[error("--cluster-cidr: at most one CIDR per IP family, got {0:?}")]
    TooManyCidrs(Vec<String>),
}

impl Default for PlannerConfig {
    fn default() -> Self {
        Self {
            cluster_cidrs: Vec::new(),
            masquerade_all: false,
            detect_local_mode: LocalTrafficMode::ClusterCIDR,
        }
    }
}

impl PlannerConfig {
    /// Builds a validated configuration.
    ///
    /// # Errors
    /// When a CIDR is malformed or two share a family.
    pub fn new(
        cluster_cidrs: &[String],
        masquerade_all: bool,
        detect_local_mode: LocalTrafficMode,
    ) -> Result<Self, ConfigError> {
        let mut cidrs = Vec::new();
        let mut families = Vec::new();
        for text in cluster_cidrs.iter().flat_map(|t| t.split(',')) {
            let (ip, len) = parse_cidr(text).map_err(ConfigError::ClusterCidr)?;
            if families.contains(&ip.is_ipv4()) {
                return Err(ConfigError::TooManyCidrs(cluster_cidrs.to_vec()));
            }
            families.push(ip.is_ipv4());
            cidrs.push(format!("{ip}/{len}"));
        }
        Ok(Self {
            cluster_cidrs: cidrs,
            masquerade_all,
            detect_local_mode,
        })
    }

    /// Whether nodes can tell in-cluster traffic of `family` from off-cluster traffic.
    /// In `NodeCIDR` mode it depends on the node having a pod CIDR of that family, which
    /// the agent checks against `spec.localTraffic.cidrs`.
    #[must_use]
    pub fn detects_local_traffic(&self, family: IpFamily) -> bool {
        match self.detect_local_mode {
            LocalTrafficMode::NodeCIDR => true,
            LocalTrafficMode::ClusterCIDR => self
                .cluster_cidrs
                .iter()
                .any(|c| c.contains(':') == (family == IpFamily::IPv6)),
        }
    }
}
