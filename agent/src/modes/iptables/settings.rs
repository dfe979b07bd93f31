//! The iptables mode's node-local inputs: agent flags, not plan content.

/// Node-local inputs of the renderer (agent flags, not plan content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderSettings {
    /// The packet mark bit that asks for masquerade (kube-proxy uses bit 14; the default
    /// here is bit 13 so both can run side by side).
    pub masquerade_bit: u8,
    /// Destinations that accept node ports (CIDRs); empty means every local address.
    pub nodeport_cidrs: Vec<String>,
}

impl Default for RenderSettings {
    fn default() -> Self {
        Self {
            masquerade_bit: 13,
            nodeport_cidrs: Vec::new(),
        }
    }
}

impl RenderSettings {
    /// The mark bit as `iptables` takes it.
    pub(super) fn mark(&self) -> String {
        format!("{:#x}", 1u32 << self.masquerade_bit.min(31))
    }
}
