//! What a trace is about and what it finds: the packet, the paths it can take with their
//! verdicts, and why rules cannot be traced.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use proxyplan_crds::Protocol;

/// How deep jumps may nest before the tracer assumes a loop.
pub(super) const MAX_DEPTH: usize = 64;

/// Why rules cannot be traced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// A rule uses syntax the tracer does not understand, or jumps to a chain that does
    /// not exist.
    #[error("{table} {chain} rule {index} `{rule}`: {reason}")]
    Rule {
        /// `nat` or `filter`.
        table: &'static str,
        /// The chain holding the rule.
        chain: String,
        /// Position of the rule in its chain (0-based, base jumps counted per chain).
        index: usize,
        /// The rule's text.
        rule: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Jumps nested deeper than any ruleset without a loop needs.
    #[error("{table} {chain}: jumps nested deeper than {MAX_DEPTH}; is there a loop?")]
    TooDeep {
        /// `nat` or `filter`.
        table: &'static str,
        /// The chain where the walk gave up.
        chain: String,
    },
}

/// The first packet of a new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Source address.
    pub source: IpAddr,
    /// Destination address (a cluster IP, node address, external or load-balancer IP).
    pub destination: IpAddr,
    /// Transport protocol.
    pub protocol: Protocol,
    /// Destination port.
    pub port: u16,
    /// Sent by a process on the node itself (enters nat `OUTPUT`); otherwise it arrives
    /// from a pod or from outside (enters nat `PREROUTING`).
    pub host_originated: bool,
    /// `recent` lists that already hold the source address (affinity from an earlier
    /// connection); empty for a client's first connection.
    pub recent: BTreeSet<String>,
}

impl Packet {
    /// A packet arriving at the node (from a pod or from off the node).
    #[must_use]
    pub fn new(source: IpAddr, destination: IpAddr, protocol: Protocol, port: u16) -> Self {
        Self {
            source,
            destination,
            protocol,
            port,
            host_originated: false,
            recent: BTreeSet::new(),
        }
    }

    /// The same packet, sent by the node itself.
    #[must_use]
    pub fn host_originated(mut self) -> Self {
        self.host_originated = true;
        self
    }

    /// The same packet, from a client already in the `recent` list `name`.
    #[must_use]
    pub fn with_recent(mut self, name: &str) -> Self {
        self.recent.insert(name.to_owned());
        self
    }
}

/// What finally happens to a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// It goes on (to an endpoint when DNATed, untouched otherwise).
    Accept,
    /// Rejected (ICMP error or TCP reset to the client).
    Reject,
    /// Silently dropped.
    Drop,
}

impl Verdict {
    /// `accept`, `reject` or `drop`, as `explain` prints it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accept => "accept",
            Self::Reject => "reject",
            Self::Drop => "drop",
        }
    }
}

/// One way through the rules (each random-balancing branch is its own path).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TracePath {
    /// The DNAT destination (`10.0.0.1:80`, `[fd00::1]:80`), if any.
    pub endpoint: Option<String>,
    /// Whether the packet leaves the node masqueraded.
    pub masquerade: bool,
    /// What happens to the packet.
    pub verdict: Verdict,
    /// `recent` lists the source is added to (session affinity).
    pub recent_set: BTreeSet<String>,
    /// Every rule that matched, as `table CHAIN: rule`, in order.
    pub rules: Vec<String>,
}

/// Every way a packet can go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceResult {
    /// Endpoints of the accepted paths.
    pub endpoints: BTreeSet<String>,
    /// Whether any accepted path is masqueraded (see [`TraceResult::is_uniform`]).
    pub masquerade: bool,
    /// `Accept` when any path is accepted; otherwise `Drop` when any path drops,
    /// otherwise `Reject`.
    pub verdict: Verdict,
    /// `recent` lists any path adds the source to.
    pub recent_set: BTreeSet<String>,
    /// The paths, sorted.
    pub paths: Vec<TracePath>,
}

impl TraceResult {
    pub(super) fn from_paths(mut paths: Vec<TracePath>) -> Self {
        paths.sort();
        let accepted = || paths.iter().filter(|p| p.verdict == Verdict::Accept);
        let verdict = if accepted().next().is_some() {
            Verdict::Accept
        } else if paths.iter().any(|p| p.verdict == Verdict::Drop) {
            Verdict::Drop
        } else {
            Verdict::Reject
        };
        Self {
            endpoints: accepted().filter_map(|p| p.endpoint.clone()).collect(),
            masquerade: accepted().any(|p| p.masquerade),
            verdict,
            recent_set: paths.iter().flat_map(|p| p.recent_set.clone()).collect(),
            paths,
        }
    }

    /// Whether every path has the same verdict and the same masquerade decision, so the
    /// summary fields tell the whole story.
    #[must_use]
    pub fn is_uniform(&self) -> bool {
        self.paths
            .windows(2)
            .all(|w| w[0].verdict == w[1].verdict && w[0].masquerade == w[1].masquerade)
    }

    /// Every endpoint an accepted path reaches, with whether that path is masqueraded.
    #[must_use]
    pub fn reached(&self) -> BTreeMap<String, bool> {
        self.endpoints
            .iter()
            .map(|e| (e.clone(), self.masquerade_to(e).unwrap_or(false)))
            .collect()
    }

    /// The masquerade decision of the path to `endpoint`, if one reaches it.
    #[must_use]
    pub fn masquerade_to(&self, endpoint: &str) -> Option<bool> {
        self.paths
            .iter()
            .find(|p| p.verdict == Verdict::Accept && p.endpoint.as_deref() == Some(endpoint))
            .map(|p| p.masquerade)
    }
}

impl fmt::Display for TraceResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:?} endpoints {:?} masquerade {}",
            self.verdict, self.endpoints, self.masquerade
        )?;
        for path in &self.paths {
            writeln!(
                f,
                "  path: {:?} -> {} masquerade {}",
                path.verdict,
                path.endpoint.as_deref().unwrap_or("(no DNAT)"),
                path.masquerade
            )?;
            for rule in &path.rules {
                writeln!(f, "    {rule}")?;
            }
        }
        Ok(())
    }
}
