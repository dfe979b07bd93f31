//! IPv4 or IPv6, as the kernel tools and tables split them.

use std::net::IpAddr;

/// An IP family's tool: `iptables` or `ip6tables`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4, `iptables`.
    V4,
    /// IPv6, `ip6tables`.
    V6,
}

impl Family {
    /// The family of `ip`.
    #[must_use]
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Self::V4 } else { Self::V6 }
    }
}
