//! ipvs mode's kernel state beyond its rules, for the tracer: the virtual servers IPVS
//! holds and the ipsets the rules match. IPVS takes a connection in `LOCAL_IN` (after
//! filter `INPUT`) for packets that arrive, and in `LOCAL_OUT` (after nat `OUTPUT`,
//! before filter `OUTPUT`) for the node's own; it sends a scheduled packet on through
//! filter `OUTPUT` and nat `POSTROUTING`, and answers a new connection to a virtual server
//! without a real server of positive weight with ICMP port unreachable.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use proxyplan_crds::Protocol;

use super::path::TraceError;
use super::rules::{Cidr, Dir, Match, Table};
use crate::kernel::ipset::{IpSet, SetEntry, SetType, Sets};

/// A virtual server's key: protocol, address and port.
pub type VirtualKey = (Protocol, IpAddr, u16);

/// A virtual server as IPVS holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualServer {
    /// The scheduler (`rr`, `wrr`, `mh`, ...).
    pub scheduler: String,
    /// The persistence timeout in seconds (session affinity), if persistent.
    pub persistence: Option<u32>,
    /// Real servers with their weights; weight 0 takes no new connection.
    pub real_servers: Vec<(SocketAddr, u32)>,
}

/// What IPVS and the ipsets hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsStage {
    /// Virtual servers (not firewall-mark ones).
    pub servers: BTreeMap<VirtualKey, VirtualServer>,
    /// ipsets by name.
    pub sets: Sets,
}

/// A virtual server as `ipvsadm` shows it: `TCP 10.96.0.10:80`.
pub(super) struct Shown(pub(super) VirtualKey);

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (protocol, addr, port) = self.0;
        write!(f, "{protocol:?} {}", SocketAddr::new(addr, port))
    }
}

impl IpvsStage {
    /// Checks that every set match of `tables` names a set held, with as many directions
    /// as its type has dimensions, and no source port.
    pub(super) fn check(&self, tables: [&Table; 2]) -> Result<(), TraceError> {
        for table in tables {
            for (chain, list) in table.base.iter().chain(&table.chains) {
                for (index, rule) in list.iter().enumerate() {
                    for m in &rule.matches {
                        let Match::Set { name, dirs, .. } = m else {
                            continue;
                        };
                        let fail = |reason: String| TraceError::Rule {
                            table: table.name,
                            chain: chain.clone(),
                            index,
                            rule: rule.text.clone(),
                            reason,
                        };
                        let set = self
                            .sets
                            .get(name)
                            .ok_or_else(|| fail(format!("no ipset {name} is held")))?;
                        let (dimensions, port_at) = match set.spec.kind {
                            SetType::HashIp => (1, None),
                            SetType::BitmapPort => (1, Some(0)),
                            SetType::HashIpPort => (2, Some(1)),
                            SetType::HashIpPortIp | SetType::HashIpPortNet => (3, Some(1)),
                        };
                        if dirs.len() != dimensions {
                            return Err(fail(format!(
                                "{} directions for a {} set",
                                dirs.len(),
                                set.spec.kind.as_str()
                            )));
                        }
                        if port_at.is_some_and(|i| dirs.get(i) == Some(&Dir::Src)) {
                            return Err(fail("source ports are not traced".to_owned()));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Whether the packet (`source`, `destination`, `protocol`, destination `port`), taken in
/// `dirs` order, is an entry of `set`. Source ports are refused by [`IpvsStage::check`].
pub(super) fn set_holds(
    set: &IpSet,
    dirs: &[Dir],
    (source, destination): (IpAddr, IpAddr),
    protocol: Protocol,
    port: u16,
) -> bool {
    let ip = |d: &Dir| match d {
        Dir::Src => source,
        Dir::Dst => destination,
    };
    let proto = protocol.number();
    match (set.spec.kind, dirs) {
        (SetType::HashIp, [a]) => set.entries.contains(&SetEntry::Ip(ip(a))),
        (SetType::BitmapPort, [_]) => set.entries.contains(&SetEntry::Port(port)),
        (SetType::HashIpPort, [a, _]) => {
            set.entries.contains(&SetEntry::IpPort(ip(a), proto, port))
        }
        (SetType::HashIpPortIp, [a, _, c]) => {
            set.entries
                .contains(&SetEntry::IpPortIp(ip(a), proto, port, ip(c)))
        }
        (SetType::HashIpPortNet, [a, _, c]) => set.entries.iter().any(|e| {
            matches!(*e, SetEntry::IpPortNet(i, p, n, net, len)
                if i == ip(a) && p == proto && n == port
                    && Cidr::new(net, len).contains(ip(c)))
        }),
        _ => false,
    }
}
