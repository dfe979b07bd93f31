//! How a rule tells in-cluster traffic (kube-proxy's `LocalTrafficDetector`): by source
//! CIDR, or by the interface it arrived on, as the plan's `localTraffic` says.

use proxyplan_crds::{IpFamily, LocalTrafficDetection, LocalTrafficMode};

/// An iptables match for traffic from inside the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LocalMatch {
    /// Sources in a CIDR (`ClusterCIDR`, `NodeCIDR`).
    Source(String),
    /// Packets arriving on an interface (`BridgeInterface`), or on any interface whose
    /// name starts with a prefix (`InterfaceNamePrefix`, written `prefix+`).
    Interface(String),
}

impl LocalMatch {
    /// The match of `family` the plan asks for; `None` when detection is off (no CIDR of
    /// that family, or no interface).
    #[must_use]
    pub fn of(detection: &LocalTrafficDetection, family: IpFamily) -> Option<Self> {
        match detection.mode {
            LocalTrafficMode::ClusterCIDR | LocalTrafficMode::NodeCIDR => detection
                .cidrs
                .iter()
                .find(|c| c.contains(':') == (family == IpFamily::IPv6))
                .map(|c| Self::Source(c.clone())),
            LocalTrafficMode::BridgeInterface => detection.interface.clone().map(Self::Interface),
            LocalTrafficMode::InterfaceNamePrefix => detection
                .interface
                .as_ref()
                .map(|prefix| Self::Interface(format!("{prefix}+"))),
        }
    }

    /// `-s CIDR` or `-i NAME`: traffic from inside the cluster.
    #[must_use]
    pub fn local(&self) -> String {
        match self {
            Self::Source(cidr) => format!("-s {cidr}"),
            Self::Interface(name) => format!("-i {name}"),
        }
    }

    /// `! -s CIDR` or `! -i NAME`: traffic from outside.
    #[must_use]
    pub fn not_local(&self) -> String {
        format!("! {}", self.local())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detection(
        mode: LocalTrafficMode,
        cidrs: &[&str],
        interface: Option<&str>,
    ) -> LocalTrafficDetection {
        LocalTrafficDetection {
            mode,
            cidrs: cidrs.iter().map(|c| (*c).to_owned()).collect(),
            interface: interface.map(str::to_owned),
        }
    }

    #[test]
    fn each_mode_gives_kube_proxys_match() {
        let cidr = detection(
            LocalTrafficMode::ClusterCIDR,
            &["10.244.0.0/16", "fd00::/56"],
            None,
        );
        assert_eq!(
            LocalMatch::of(&cidr, IpFamily::IPv6)
                .map(|m| m.not_local())
                .as_deref(),
            Some("! -s fd00::/56")
        );
        let bridge = detection(LocalTrafficMode::BridgeInterface, &[], Some("cni0"));
        assert_eq!(
            LocalMatch::of(&bridge, IpFamily::IPv4)
                .map(|m| m.local())
                .as_deref(),
            Some("-i cni0")
        );
        let prefix = detection(LocalTrafficMode::InterfaceNamePrefix, &[], Some("veth"));
        assert_eq!(
            LocalMatch::of(&prefix, IpFamily::IPv6)
                .map(|m| m.not_local())
                .as_deref(),
            Some("! -i veth+")
        );
        let off = detection(LocalTrafficMode::NodeCIDR, &["10.244.1.0/24"], None);
        assert_eq!(LocalMatch::of(&off, IpFamily::IPv6), None);
    }
}
