//! The ipvs mode's node-local inputs: agent flags, not plan content.

use std::net::IpAddr;
use std::time::Duration;

use crate::kernel::ipvs::IpvsTimeouts;
use crate::run::Cidr;

/// Node-local inputs of the ipvs mode (agent flags, not plan content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsSettings {
    /// IPVS scheduler of every virtual server (`rr`, `wrr`, `lc`, `sh`, `mh`, ...).
    pub scheduler: String,
    /// The packet mark bit that asks for masquerade.
    pub masquerade_bit: u8,
    /// The dummy interface that holds the VIPs.
    pub interface: String,
    /// Virtual servers in these ranges are never touched.
    pub exclude_cidrs: Vec<Cidr>,
    /// Node-port addresses: local addresses in these ranges (all when empty).
    pub nodeport_cidrs: Vec<Cidr>,
    /// `--nodeport-addresses primary`: node ports only on the node's primary IPs (see
    /// [`proxyplan_crds::primary_addresses`]), resolved from each plan.
    pub nodeport_primary: bool,
    /// Set `arp_ignore=1` and `arp_announce=2` so the node never answers ARP for VIPs on
    /// other interfaces (needed with some load balancers, e.g. MetalLB in L2 mode).
    pub strict_arp: bool,
    /// How long a removed TCP/SCTP real server may drain (weight 0) before it is
    /// deleted even with connections left.
    pub termination_grace: Duration,
    /// IPVS's connection timeouts in seconds (`--ipvs-tcp-timeout`,
    /// `--ipvs-tcpfin-timeout`, `--ipvs-udp-timeout`), set by the first sync; a 0 leaves
    /// that one as the kernel has it, and all 0 (the default) sets nothing.
    pub timeouts: IpvsTimeouts,
}

impl Default for IpvsSettings {
    fn default() -> Self {
        Self {
            scheduler: "rr".to_owned(),
            masquerade_bit: 13,
            interface: "proxyplan-ipvs0".to_owned(),
            exclude_cidrs: Vec::new(),
            nodeport_cidrs: Vec::new(),
            nodeport_primary: false,
            strict_arp: false,
            termination_grace: Duration::from_secs(120),
            timeouts: IpvsTimeouts::default(),
        }
    }
}

impl IpvsSettings {
    /// Whether the virtual server address `ip` is excluded (`--ipvs-exclude-cidrs`).
    #[must_use]
    pub fn excluded(&self, ip: IpAddr) -> bool {
        self.exclude_cidrs.iter().any(|c| c.contains(ip))
    }

    /// The node-port addresses among the node's local `addresses`: not loopback, not
    /// IPv6 link-local, inside `--nodeport-addresses` when given.
    #[must_use]
    pub fn nodeport_addresses(&self, addresses: impl IntoIterator<Item = IpAddr>) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = addresses
            .into_iter()
            .filter(|ip| !ip.is_loopback() && !is_link_local_v6(*ip))
            .filter(|ip| {
                self.nodeport_cidrs.is_empty()
                    || self.nodeport_cidrs.iter().any(|c| c.contains(*ip))
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

fn is_link_local_v6(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}
