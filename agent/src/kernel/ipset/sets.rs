//! ipsets as data: a set's type, family and entries, as the kernel holds them (read over
//! netlink by [`super::socket::IpsetNetlink`]; shown, and parsed in tests, in `ipset save`
//! / `ipset restore` spelling).
//!
//! Sets are changed in place (`add`/`del` of single entries), never flushed, so a rule
//! matching a set never sees it empty during a sync. Every set the agent owns is named
//! `PROXYPLAN-*` (IPv4, and the family-less port bitmaps) or `PROXYPLAN6-*` (IPv6).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use crate::kernel::ipvs::uapi::{IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP};

/// Name prefix of the agent's IPv4 (and bitmap) sets.
pub const PREFIX_V4: &str = "PROXYPLAN-";
/// Name prefix of the agent's IPv6 sets.
pub const PREFIX_V6: &str = "PROXYPLAN6-";

/// Whether a set called `name` is the agent's.
#[must_use]
pub fn is_owned(name: &str) -> bool {
    name.starts_with(PREFIX_V4) || name.starts_with(PREFIX_V6)
}

/// The set types the ipvs mode uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetType {
    /// `hash:ip`: addresses.
    HashIp,
    /// `hash:ip,port`: `10.96.0.10,tcp:80`.
    HashIpPort,
    /// `hash:ip,port,ip`: `10.244.1.2,tcp:8080,10.244.1.2`.
    HashIpPortIp,
    /// `hash:ip,port,net`: `203.0.113.7,tcp:80,10.0.0.0/8`.
    HashIpPortNet,
    /// `bitmap:port`: port numbers, protocol-less.
    BitmapPort,
}

impl SetType {
    /// The type as ipset spells it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HashIp => "hash:ip",
            Self::HashIpPort => "hash:ip,port",
            Self::HashIpPortIp => "hash:ip,port,ip",
            Self::HashIpPortNet => "hash:ip,port,net",
            Self::BitmapPort => "bitmap:port",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "hash:ip" => Self::HashIp,
            "hash:ip,port" => Self::HashIpPort,
            "hash:ip,port,ip" => Self::HashIpPortIp,
            "hash:ip,port,net" => Self::HashIpPortNet,
            "bitmap:port" => Self::BitmapPort,
            _ => return None,
        })
    }
}

/// A set's definition: its type and, for hash sets, its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SetSpec {
    /// The type.
    pub kind: SetType,
    /// `true` for `family inet6` (hash sets only).
    pub ipv6: bool,
}

impl SetSpec {
    /// The `create` options after the name.
    #[must_use]
    pub fn create_options(&self) -> String {
        match self.kind {
            SetType::BitmapPort => "bitmap:port range 0-65535".to_owned(),
            kind => format!(
                "{} family {} hashsize 1024 maxelem 1048576",
                kind.as_str(),
                if self.ipv6 { "inet6" } else { "inet" }
            ),
        }
    }
}

/// One set entry, typed: no heap, 40 bytes. `protocol` is an `IPPROTO_*` number.
/// [`fmt::Display`] spells it as `ipset save` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetEntry {
    /// `bitmap:port`: `30080`.
    Port(u16),
    /// `hash:ip`: `192.168.1.5`.
    Ip(IpAddr),
    /// `hash:ip,port`: `10.96.0.10,tcp:80`.
    IpPort(IpAddr, u8, u16),
    /// `hash:ip,port,ip`: `10.244.1.2,tcp:8080,10.244.1.2`.
    IpPortIp(IpAddr, u8, u16, IpAddr),
    /// `hash:ip,port,net`: `203.0.113.7,tcp:80,10.0.0.0/8` (hosts without `/32`).
    IpPortNet(IpAddr, u8, u16, IpAddr, u8),
}

fn protocol_text(protocol: u8) -> &'static str {
    match u16::from(protocol) {
        IPPROTO_TCP => "tcp",
        IPPROTO_UDP => "udp",
        IPPROTO_SCTP => "sctp",
        _ => "unknown",
    }
}

fn parse_protocol(text: &str) -> Option<u8> {
    let number = match text {
        "tcp" => IPPROTO_TCP,
        "udp" => IPPROTO_UDP,
        "sctp" => IPPROTO_SCTP,
        _ => return None,
    };
    u8::try_from(number).ok()
}

/// `ipset` spells a host network without its prefix length.
fn host_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

impl fmt::Display for SetEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Port(port) => write!(f, "{port}"),
            Self::Ip(ip) => write!(f, "{ip}"),
            Self::IpPort(ip, p, port) => write!(f, "{ip},{}:{port}", protocol_text(p)),
            Self::IpPortIp(ip, p, port, ip2) => {
                write!(f, "{ip},{}:{port},{ip2}", protocol_text(p))
            }
            Self::IpPortNet(ip, p, port, net, len) if len == host_prefix(net) => {
                write!(f, "{ip},{}:{port},{net}", protocol_text(p))
            }
            Self::IpPortNet(ip, p, port, net, len) => {
                write!(f, "{ip},{}:{port},{net}/{len}", protocol_text(p))
            }
        }
    }
}

impl SetEntry {
    /// Parses an entry of a set of type `kind` as `ipset save` prints it.
    #[must_use]
    pub fn parse(kind: SetType, text: &str) -> Option<Self> {
        if kind == SetType::BitmapPort {
            return text.parse().ok().map(Self::Port);
        }
        if kind == SetType::HashIp {
            return text.parse().ok().map(Self::Ip);
        }
        let mut parts = text.splitn(3, ',');
        let ip: IpAddr = parts.next()?.parse().ok()?;
        let (protocol, port) = parts.next()?.split_once(':')?;
        let protocol = parse_protocol(protocol)?;
        let port: u16 = port.parse().ok()?;
        let third = parts.next();
        match (kind, third) {
            (SetType::HashIpPort, None) => Some(Self::IpPort(ip, protocol, port)),
            (SetType::HashIpPortIp, Some(ip2)) => {
                Some(Self::IpPortIp(ip, protocol, port, ip2.parse().ok()?))
            }
            (SetType::HashIpPortNet, Some(net)) => {
                let (net, len) = match net.split_once('/') {
                    Some((net, len)) => (net.parse::<IpAddr>().ok()?, len.parse().ok()?),
                    None => {
                        let net: IpAddr = net.parse().ok()?;
                        (net, host_prefix(net))
                    }
                };
                (len <= host_prefix(net)).then_some(Self::IpPortNet(ip, protocol, port, net, len))
            }
            _ => None,
        }
    }
}

/// A set with its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpSet {
    /// Type and family.
    pub spec: SetSpec,
    /// The entries.
    pub entries: BTreeSet<SetEntry>,
}

impl IpSet {
    /// An empty set.
    #[must_use]
    pub fn new(kind: SetType, ipv6: bool) -> Self {
        Self {
            spec: SetSpec { kind, ipv6 },
            entries: BTreeSet::new(),
        }
    }
}

/// Every owned set: name → set.
pub type Sets = BTreeMap<String, IpSet>;

/// Reads the agent's sets from `ipset save` output; other sets, and sets of a type the
/// agent never creates, are left out.
#[must_use]
pub fn parse_save(text: &str) -> Sets {
    let mut sets = Sets::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("create"), Some(name), Some(kind)) if is_owned(name) => {
                let rest: Vec<&str> = words.collect();
                let ipv6 = rest
                    .windows(2)
                    .any(|w| w.first() == Some(&"family") && w.get(1) == Some(&"inet6"));
                let Some(kind) = SetType::parse(kind) else {
                    continue;
                };
                sets.insert(name.to_owned(), IpSet::new(kind, ipv6));
            }
            (Some("add"), Some(name), Some(entry)) => {
                if let Some(set) = sets.get_mut(name)
                    && let Some(entry) = SetEntry::parse(set.spec.kind, entry)
                {
                    set.entries.insert(entry);
                }
            }
            _ => {}
        }
    }
    sets
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An `ipset save` of owned sets and one of someone else's.
    pub(crate) const SAVE: &str = "\
create PROXYPLAN-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 1048576 bucketsize 12 initval 0xae5c9c52
add PROXYPLAN-CLUSTER-IP 10.96.0.11,udp:53
add PROXYPLAN-CLUSTER-IP 10.96.0.10,tcp:80
create PROXYPLAN6-LB-SRC-CIDR hash:ip,port,net family inet6 hashsize 1024 maxelem 65536 bucketsize 12 initval 0x0a9f71a9
add PROXYPLAN6-LB-SRC-CIDR fd00::1,tcp:80,fd01::5
create PROXYPLAN-NP-TCP bitmap:port range 0-65535
add PROXYPLAN-NP-TCP 30080
create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
add KUBE-CLUSTER-IP 10.96.0.1,tcp:443
create PROXYPLAN-OLD hash:ip family inet hashsize 1024 maxelem 65536
";

    #[test]
    fn reads_only_owned_sets_as_ipset_save_prints_them() {
        let sets = parse_save(SAVE);
        assert_eq!(
            sets.keys().collect::<Vec<_>>(),
            [
                "PROXYPLAN-CLUSTER-IP",
                "PROXYPLAN-NP-TCP",
                "PROXYPLAN-OLD",
                "PROXYPLAN6-LB-SRC-CIDR"
            ]
        );
        let cluster = &sets["PROXYPLAN-CLUSTER-IP"];
        assert_eq!(
            cluster.spec,
            SetSpec {
                kind: SetType::HashIpPort,
                ipv6: false
            }
        );
        assert_eq!(cluster.entries.len(), 2);
        assert!(sets["PROXYPLAN6-LB-SRC-CIDR"].spec.ipv6);
        assert_eq!(sets["PROXYPLAN-NP-TCP"].spec.kind, SetType::BitmapPort);
    }

    #[test]
    fn entries_read_and_print_as_ipset_save_spells_them() {
        let cases = [
            (SetType::BitmapPort, "30080"),
            (SetType::HashIp, "192.168.1.5"),
            (SetType::HashIp, "fd00::5"),
            (SetType::HashIpPort, "10.96.0.10,tcp:80"),
            (SetType::HashIpPort, "fd00::a,udp:53"),
            (SetType::HashIpPort, "10.96.0.10,sctp:9"),
            (SetType::HashIpPortIp, "10.244.1.2,tcp:8080,10.244.1.2"),
            (SetType::HashIpPortNet, "203.0.113.7,tcp:80,10.0.0.0/8"),
            (SetType::HashIpPortNet, "203.0.113.7,tcp:80,10.1.2.3"),
            (SetType::HashIpPortNet, "fd00::1,tcp:80,fd01::5"),
            (SetType::HashIpPortNet, "fd00::1,tcp:80,fd01::/64"),
        ];
        for (kind, text) in cases {
            let entry = SetEntry::parse(kind, text).unwrap_or_else(|| panic!("{text}"));
            assert_eq!(entry.to_string(), text);
        }
        for (kind, text) in [
            (SetType::HashIpPort, "10.96.0.10,tcp:80,10.0.0.1"),
            (SetType::HashIpPort, "10.96.0.10,icmp:80"),
            (SetType::HashIpPortNet, "203.0.113.7,tcp:80,10.0.0.0/33"),
            (SetType::BitmapPort, "70000"),
            (SetType::HashIpPortIp, "10.244.1.2,tcp:8080"),
        ] {
            assert_eq!(SetEntry::parse(kind, text), None, "{text}");
        }
        assert!(std::mem::size_of::<SetEntry>() <= 40);
    }
}
