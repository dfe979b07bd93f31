//! IPv4 or IPv6, as the kernel tools and tables split them.

/// An IP family's tool: `iptables` or `ip6tables`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4, `iptables`.
    V4,
    /// IPv6, `ip6tables`.
    V6,
}
