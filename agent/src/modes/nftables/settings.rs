//! The nftables mode's node-local inputs: agent flags, not plan content.

use super::rules::Net;

/// Node-local inputs of the nftables mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftablesSettings {
    /// The packet mark bit that asks for masquerade (kube-proxy uses bit 14; 13 lets
    /// both run side by side).
    pub masquerade_bit: u8,
    /// Destinations that accept node ports (`--nodeport-addresses`); empty: every local
    /// address but loopback.
    pub nodeport_cidrs: Vec<Net>,
    /// `--nodeport-addresses primary`: only the node's primary IP of each family (the
    /// plan's addresses) accepts node ports.
    pub nodeport_primary: bool,
    /// Drop forwarded packets that conntrack finds invalid (`ct state invalid drop` in
    /// `filter-forward`), as the iptables mode does; the dataplane clears it when
    /// `nf_conntrack_tcp_be_liberal` is set.
    pub drop_invalid: bool,
}

impl Default for NftablesSettings {
    fn default() -> Self {
        Self {
            masquerade_bit: 13,
            nodeport_cidrs: Vec::new(),
            nodeport_primary: false,
            drop_invalid: true,
        }
    }
}

impl NftablesSettings {
    /// The mark.
    #[must_use]
    pub fn mark(&self) -> u32 {
        1u32 << self.masquerade_bit.min(31)
    }
}
