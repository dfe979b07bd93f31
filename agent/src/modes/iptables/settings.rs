//! The iptables mode's node-local inputs: agent flags, not plan content.

/// Node-local inputs of the renderer (agent flags, not plan content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderSettings {
    /// The packet mark bit that asks for masquerade (kube-proxy uses bit 14; the default
    /// here is bit 13 so both can run side by side).
    pub masquerade_bit: u8,
    /// Destinations that accept node ports (CIDRs); empty means every local address.
    pub nodeport_cidrs: Vec<String>,
    /// `--nodeport-addresses primary`: node ports only on the node's primary IPs, resolved
    /// from each plan's node addresses (then `nodeport_cidrs` is empty).
    pub nodeport_primary: bool,
    /// Drop forwarded packets conntrack finds invalid (kube-proxy's iptables mode, unless
    /// `nf_conntrack_tcp_be_liberal` is set: the dataplane clears this when it is).
    pub drop_invalid: bool,
    /// Accept IPv4 node ports on `127.0.0.0/8` (kube-proxy's
    /// `--iptables-localhost-nodeports`): sets `route_localnet=1` and adds the martian
    /// guard kube-proxy adds. Only when the node-port addresses include loopback (or are
    /// every address).
    pub localhost_nodeports: bool,
}

impl Default for RenderSettings {
    fn default() -> Self {
        Self {
            masquerade_bit: 13,
            nodeport_cidrs: Vec::new(),
            nodeport_primary: false,
            drop_invalid: true,
            localhost_nodeports: false,
        }
    }
}

impl RenderSettings {
    /// Whether IPv4 node ports are served on loopback: asked for, and loopback is a
    /// node-port address (kube-proxy's rule: `--nodeport-addresses` without a loopback
    /// CIDR turns it off).
    #[must_use]
    pub fn localhost_nodeports_on(&self) -> bool {
        let v4: Vec<&String> = self
            .nodeport_cidrs
            .iter()
            .filter(|c| !c.contains(':'))
            .collect();
        self.localhost_nodeports
            && !self.nodeport_primary
            && (v4.is_empty() || v4.iter().any(|c| contains_localhost(c)))
    }

    /// These settings with `--nodeport-addresses primary` resolved for a node with
    /// `addresses` (the plan's): a host CIDR per primary IP.
    #[must_use]
    pub fn resolved(&self, addresses: &[std::net::IpAddr]) -> std::borrow::Cow<'_, Self> {
        if !self.nodeport_primary {
            return std::borrow::Cow::Borrowed(self);
        }
        let nodeport_cidrs = proxyplan_crds::primary_addresses(addresses)
            .into_iter()
            .map(|ip| format!("{ip}/{}", if ip.is_ipv6() { 128 } else { 32 }))
            .collect();
        std::borrow::Cow::Owned(Self {
            nodeport_cidrs,
            ..self.clone()
        })
    }

    /// The mark bit as `iptables` takes it.
    pub(super) fn mark(&self) -> String {
        format!("{:#x}", 1u32 << self.masquerade_bit.min(31))
    }
}

/// Whether an IPv4 CIDR (`127.0.0.0/8`) contains 127.0.0.1.
fn contains_localhost(cidr: &str) -> bool {
    let Some((ip, len)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(ip), Ok(len)) = (ip.parse::<std::net::Ipv4Addr>(), len.parse::<u32>()) else {
        return false;
    };
    let mask = u32::MAX.checked_shl(32 - len.min(32)).unwrap_or(0);
    u32::from(ip) & mask == u32::from(std::net::Ipv4Addr::LOCALHOST) & mask
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_node_ports_need_loopback_among_the_node_port_addresses() {
        let settings = |cidrs: &[&str]| RenderSettings {
            localhost_nodeports: true,
            nodeport_cidrs: cidrs.iter().map(|c| (*c).to_owned()).collect(),
            ..RenderSettings::default()
        };
        assert!(settings(&[]).localhost_nodeports_on());
        assert!(settings(&["127.0.0.0/8", "10.0.0.0/8"]).localhost_nodeports_on());
        assert!(settings(&["0.0.0.0/0"]).localhost_nodeports_on());
        assert!(!settings(&["10.0.0.0/8"]).localhost_nodeports_on());
        assert!(
            settings(&["fd00::/64"]).localhost_nodeports_on(),
            "no IPv4 CIDR: all"
        );
        assert!(!RenderSettings::default().localhost_nodeports_on());
    }
}
