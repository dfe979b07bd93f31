//! Conntrack entries as the agent reads and deletes them: one UDP [`Flow`], and the
//! [`StaleFlows`] selectors that name entries to delete (as `conntrack -D` selects them).

use std::net::IpAddr;

use crate::kernel::family::Family;

/// The conntrack-tools binary.
pub const CONNTRACK: &str = "conntrack";

/// Where UDP traffic to a service arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Destination {
    /// A service address (cluster, external or load-balancer IP) and the service port.
    Address {
        /// The address.
        ip: IpAddr,
        /// The service port.
        port: u16,
    },
    /// A node port, on any of the node's addresses.
    NodePort {
        /// Family of the service port.
        family: Family,
        /// The node port.
        port: u16,
    },
}

impl Destination {
    /// The destination's IP family.
    #[must_use]
    pub fn family(&self) -> Family {
        match self {
            Self::Address { ip, .. } => Family::of(*ip),
            Self::NodePort { family, .. } => *family,
        }
    }
}

/// An endpoint address and port.
pub type Backend = (IpAddr, u16);

/// A set of conntrack entries to delete.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum StaleFlows {
    /// Every entry to a destination that had no endpoint.
    To(Destination),
    /// Entries to a destination whose reply comes from an endpoint no longer behind it.
    Via(Destination, Backend),
    /// One entry found in the conntrack table.
    Exact(Flow),
}

impl StaleFlows {
    /// The IP family of the entries.
    #[must_use]
    pub fn family(&self) -> Family {
        match self {
            Self::To(dest) | Self::Via(dest, _) => dest.family(),
            Self::Exact(flow) => Family::of(flow.orig_dst),
        }
    }

    /// Whether the entry `flow` is one of these: what `conntrack` with
    /// [`StaleFlows::conntrack_args`] deletes (the family is the listing's).
    #[must_use]
    pub fn matches(&self, flow: &Flow) -> bool {
        let to = |dest: &Destination| match *dest {
            Destination::Address { ip, port } => flow.orig_dst == ip && flow.dport == port,
            Destination::NodePort { port, .. } => flow.dport == port,
        };
        match self {
            Self::To(dest) => to(dest),
            Self::Via(dest, (ip, port)) => {
                to(dest) && flow.reply_src == *ip && flow.reply_sport == *port
            }
            Self::Exact(exact) => {
                flow.orig_src == exact.orig_src
                    && flow.orig_dst == exact.orig_dst
                    && flow.sport == exact.sport
                    && flow.dport == exact.dport
            }
        }
    }

    /// The `conntrack` arguments that delete these entries.
    #[must_use]
    pub fn conntrack_args(&self) -> Vec<String> {
        let family = match self.family() {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        };
        let mut args: Vec<String> = ["-D", "-p", "udp", "-f", family]
            .map(str::to_owned)
            .to_vec();
        let mut push = |flag: &str, value: String| {
            args.push(flag.to_owned());
            args.push(value);
        };
        match self {
            Self::To(dest) | Self::Via(dest, _) => {
                match dest {
                    Destination::Address { ip, port } => {
                        push("--orig-dst", ip.to_string());
                        push("--dport", port.to_string());
                    }
                    Destination::NodePort { port, .. } => push("--dport", port.to_string()),
                }
                if let Self::Via(_, (ip, port)) = self {
                    push("--reply-src", ip.to_string());
                    push("--reply-port-src", port.to_string());
                }
            }
            Self::Exact(flow) => {
                push("--orig-src", flow.orig_src.to_string());
                push("--orig-dst", flow.orig_dst.to_string());
                push("--sport", flow.sport.to_string());
                push("--dport", flow.dport.to_string());
            }
        }
        args
    }
}

/// One UDP conntrack entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Flow {
    /// Original source.
    pub orig_src: IpAddr,
    /// Original destination.
    pub orig_dst: IpAddr,
    /// Original source port.
    pub sport: u16,
    /// Original destination port.
    pub dport: u16,
    /// Source of the reply (the endpoint, when DNATed).
    pub reply_src: IpAddr,
    /// Source port of the reply.
    pub reply_sport: u16,
}

/// What a sync's deletion of stale UDP conntrack entries did, for kube-proxy's conntrack
/// reconciler metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConntrackRun {
    /// Entries deleted, IPv4 and IPv6.
    pub deleted: [usize; 2],
    /// How long it took.
    pub elapsed: std::time::Duration,
}

impl ConntrackRun {
    /// Entries deleted, both families.
    #[must_use]
    pub fn total(&self) -> usize {
        self.deleted.iter().sum()
    }
}
