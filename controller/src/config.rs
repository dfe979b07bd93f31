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
    /// The pods' bridge (`BridgeInterface`) or their interfaces' name prefix
    /// (`InterfaceNamePrefix`).
    pub local_interface: Option<String>,
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
    /// An interface-based detection mode without its interface.
    #[error("--detect-local-mode={0}: needs {1}")]
    MissingInterface(&'static str, &'static str),
    /// A malformed interface name or prefix.
    #[error("{0}: {1:?} is not an interface name (1 to 15 of A-Z a-z 0-9 _ . -)")]
    BadInterface(&'static str, String),
}

impl Default for PlannerConfig {
    fn default() -> Self {
        Self {
            cluster_cidrs: Vec::new(),
            masquerade_all: false,
            detect_local_mode: LocalTrafficMode::ClusterCIDR,
            local_interface: None,
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
            local_interface: None,
        })
    }

    /// Sets the interface of the interface-based detection modes: the pods' bridge
    /// (`--pod-bridge-interface`) or their interfaces' name prefix
    /// (`--pod-interface-name-prefix`), as the mode needs.
    ///
    /// # Errors
    /// When the mode needs the interface and it is missing, or it is malformed.
    pub fn with_local_interface(
        mut self,
        bridge: Option<String>,
        prefix: Option<String>,
    ) -> Result<Self, ConfigError> {
        let (flag, value) = match self.detect_local_mode {
            LocalTrafficMode::BridgeInterface => ("--pod-bridge-interface", bridge),
            LocalTrafficMode::InterfaceNamePrefix => ("--pod-interface-name-prefix", prefix),
            LocalTrafficMode::ClusterCIDR | LocalTrafficMode::NodeCIDR => return Ok(self),
        };
        let mode = if self.detect_local_mode == LocalTrafficMode::BridgeInterface {
            "BridgeInterface"
        } else {
            "InterfaceNamePrefix"
        };
        let name = value.ok_or(ConfigError::MissingInterface(mode, flag))?;
        let valid = !name.is_empty()
            && name.len() <= 15
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !valid {
            return Err(ConfigError::BadInterface(flag, name));
        }
        self.local_interface = Some(name);
        Ok(self)
    }

    /// Whether nodes can tell in-cluster traffic of `family` from off-cluster traffic.
    /// In `NodeCIDR` mode it depends on the node having a pod CIDR of that family, which
    /// the agent checks against `spec.localTraffic.cidrs`.
    #[must_use]
    pub fn detects_local_traffic(&self, family: IpFamily) -> bool {
        match self.detect_local_mode {
            LocalTrafficMode::NodeCIDR
            | LocalTrafficMode::BridgeInterface
            | LocalTrafficMode::InterfaceNamePrefix => true,
            LocalTrafficMode::ClusterCIDR => self
                .cluster_cidrs
                .iter()
                .any(|c| c.contains(':') == (family == IpFamily::IPv6)),
        }
    }
}
