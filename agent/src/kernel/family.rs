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
    /// Both, IPv4 first.
    pub const ALL: [Self; 2] = [Self::V4, Self::V6];

    /// Its position in [`Family::ALL`], for per-family arrays.
    #[must_use]
    pub fn index(self) -> usize {
        match self {
            Self::V4 => 0,
            Self::V6 => 1,
        }
    }

    /// The family of `ip`.
    #[must_use]
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Self::V4 } else { Self::V6 }
    }
}
