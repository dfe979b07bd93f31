//! A packet tracer over rendered rules: for the first packet of a new connection, which
//! endpoints it can reach, whether it leaves masqueraded, and whether the filter table
//! lets it through. The renderer's tests state intent with it ("from this source to this
//! address and port: these endpoints, masqueraded or not"), as kube-proxy's
//! `tracePacket` does for its own rules.
//!
//! The walk follows the kernel's order for the hooks the agent writes to:
//!
//! ```text
//! nat PREROUTING (or OUTPUT for host-originated packets)   DNAT, masquerade mark
//! filter FORWARD, INPUT or OUTPUT, with the post-DNAT destination   REJECT / DROP / ACCEPT
//! nat POSTROUTING (not for packets delivered to this node)  mark -> MASQUERADE
//! filter INPUT, for host-originated packets to a local address
//! ```
//!
//! Only the syntax the renderer emits is understood; anything else is an error when the
//! tracer is built, so a renderer change cannot slip past the tests unexamined. Built-in
//! chains hold only the agent's base jumps and otherwise accept. `-m statistic --mode
//! random` is a branch: both outcomes are explored, so a trace lists every endpoint a
//! packet can reach. `-m recent --rcheck` matches only the lists named in
//! [`Packet::recent`] (none for a first packet).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use proxyplan_crds::Protocol;

use crate::ruleset::rules::{FamilyRules, TableName, TableRules};

/// How deep jumps may nest before the tracer assumes a loop.
const MAX_DEPTH: usize = 64;

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
    fn from_paths(mut paths: Vec<TracePath>) -> Self {
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

/// Traces `packet` through `rules` on a node owning `local_addresses`.
///
/// # Errors
/// When a rule uses syntax the tracer does not understand, or the walk loops.
pub fn trace(
    rules: &FamilyRules,
    local_addresses: &[IpAddr],
    packet: &Packet,
) -> Result<TraceResult, TraceError> {
    Tracer::new(rules, local_addresses)?.trace(packet)
}

/// Parsed rules of one family, ready to trace many packets.
#[derive(Debug, Clone)]
pub struct Tracer {
    nat: Table,
    filter: Table,
    local: Vec<IpAddr>,
}

impl Tracer {
    /// Parses every rule (reachable or not) and checks every jump target.
    /// `local_addresses` are the node's own addresses, for `-m addrtype --src-type/--dst-type
    /// LOCAL` and for telling forwarded from delivered packets; loopback addresses are
    /// always local.
    ///
    /// # Errors
    /// The first rule the tracer does not understand.
    pub fn new(rules: &FamilyRules, local_addresses: &[IpAddr]) -> Result<Self, TraceError> {
        Ok(Self {
            nat: Table::parse(TableName::Nat, &rules.nat)?,
            filter: Table::parse(TableName::Filter, &rules.filter)?,
            local: local_addresses.to_vec(),
        })
    }

    fn is_local(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.local.contains(&ip)
    }

    /// Every way `packet` can go.
    ///
    /// # Errors
    /// When jumps nest too deep (a loop).
    pub fn trace(&self, packet: &Packet) -> Result<TraceResult, TraceError> {
        let start = PathState {
            source: packet.source,
            destination: packet.destination,
            port: packet.port,
            mark: 0,
            dnat: None,
            masquerade: false,
            recent_set: BTreeSet::new(),
            rules: Vec::new(),
        };
        let nat_hook = if packet.host_originated {
            "OUTPUT"
        } else {
            "PREROUTING"
        };
        let mut paths = Vec::new();
        for (mut state, exit) in self.run_base(&self.nat, nat_hook, start, packet)? {
            if let Some(verdict) = exit.refusal() {
                paths.push(state.finish(verdict));
                continue;
            }
            if let Some(to) = state.dnat {
                state.destination = to.ip();
                state.port = to.port();
            }
            let delivered = self.is_local(state.destination);
            let filter_hook = match (packet.host_originated, delivered) {
                (true, _) => "OUTPUT",
                (false, true) => "INPUT",
                (false, false) => "FORWARD",
            };
            for (state, exit) in self.run_base(&self.filter, filter_hook, state, packet)? {
                if let Some(verdict) = exit.refusal() {
                    paths.push(state.finish(verdict));
                } else if !packet.host_originated && delivered {
                    // Delivered to this node: no POSTROUTING, so no masquerade.
                    paths.push(state.finish(Verdict::Accept));
                } else {
                    self.postrouting(state, packet, delivered, &mut paths)?;
                }
            }
        }
        Ok(TraceResult::from_paths(paths))
    }

    /// nat POSTROUTING, then (host-originated packets to a local address) filter INPUT.
    fn postrouting(
        &self,
        state: PathState,
        packet: &Packet,
        delivered: bool,
        paths: &mut Vec<TracePath>,
    ) -> Result<(), TraceError> {
        for (state, exit) in self.run_base(&self.nat, "POSTROUTING", state, packet)? {
            if let Some(verdict) = exit.refusal() {
                paths.push(state.finish(verdict));
            } else if delivered {
                for (state, exit) in self.run_base(&self.filter, "INPUT", state, packet)? {
                    let verdict = exit.refusal().unwrap_or(Verdict::Accept);
                    paths.push(state.finish(verdict));
                }
            } else {
                paths.push(state.finish(Verdict::Accept));
            }
        }
        Ok(())
    }

    /// A built-in chain: the agent's base jumps there, then the chain's policy (ACCEPT).
    fn run_base(
        &self,
        table: &Table,
        hook: &str,
        state: PathState,
        packet: &Packet,
    ) -> Result<Vec<(PathState, Exit)>, TraceError> {
        let rules = table.base.get(hook).map_or(&[][..], Vec::as_slice);
        let walk = Walk {
            tracer: self,
            table,
            packet,
        };
        walk.chain(hook, rules, state, 0)
    }
}

/// How a walk leaves a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    /// Fell off the end or hit RETURN: back to the caller.
    Continue,
    /// A terminating target: ACCEPT (also DNAT, MASQUERADE), DROP or REJECT.
    Stop(Verdict),
}

impl Exit {
    fn refusal(self) -> Option<Verdict> {
        match self {
            Self::Stop(v @ (Verdict::Drop | Verdict::Reject)) => Some(v),
            _ => None,
        }
    }
}

/// A packet on one path.
#[derive(Debug, Clone)]
struct PathState {
    source: IpAddr,
    destination: IpAddr,
    port: u16,
    mark: u32,
    dnat: Option<SocketAddr>,
    masquerade: bool,
    recent_set: BTreeSet<String>,
    rules: Vec<String>,
}

impl PathState {
    fn finish(self, verdict: Verdict) -> TracePath {
        TracePath {
            endpoint: self.dnat.map(|a| a.to_string()),
            masquerade: self.masquerade && verdict == Verdict::Accept,
            verdict,
            recent_set: self.recent_set,
            rules: self.rules,
        }
    }
}

/// One traversal of one table.
struct Walk<'a> {
    tracer: &'a Tracer,
    table: &'a Table,
    packet: &'a Packet,
}

impl Walk<'_> {
    /// Runs `rules` (the chain `name`) on `state`; one result per path out.
    fn chain(
        &self,
        name: &str,
        rules: &[Rule],
        state: PathState,
        depth: usize,
    ) -> Result<Vec<(PathState, Exit)>, TraceError> {
        if depth > MAX_DEPTH {
            return Err(TraceError::TooDeep {
                table: self.table.name,
                chain: name.to_owned(),
            });
        }
        let mut out = Vec::new();
        let mut work = vec![(0usize, state)];
        while let Some((index, state)) = work.pop() {
            let Some(rule) = rules.get(index) else {
                out.push((state, Exit::Continue));
                continue;
            };
            // Pushed in reverse so the taken branch of a random rule is explored first.
            let mut next = Vec::new();
            for (mut state, matched) in self.evaluate(rule, state) {
                if !matched {
                    next.push((index + 1, state));
                    continue;
                }
                state
                    .rules
                    .push(format!("{} {name}: {}", self.table.name, rule.text));
                match &rule.target {
                    None => next.push((index + 1, state)),
                    Some(Target::Chain(chain)) => {
                        let sub = self.table.chains.get(chain).map_or(&[][..], Vec::as_slice);
                        for (state, exit) in self.chain(chain, sub, state, depth + 1)? {
                            match exit {
                                Exit::Continue => next.push((index + 1, state)),
                                Exit::Stop(_) => out.push((state, exit)),
                            }
                        }
                    }
                    Some(Target::Return) => out.push((state, Exit::Continue)),
                    Some(Target::Accept) => out.push((state, Exit::Stop(Verdict::Accept))),
                    Some(Target::Drop) => out.push((state, Exit::Stop(Verdict::Drop))),
                    Some(Target::Reject) => out.push((state, Exit::Stop(Verdict::Reject))),
                    Some(Target::Mark(op)) => {
                        state.mark = op.apply(state.mark);
                        next.push((index + 1, state));
                    }
                    Some(Target::Dnat(to)) => {
                        state.dnat = Some(*to);
                        out.push((state, Exit::Stop(Verdict::Accept)));
                    }
                    Some(Target::Masquerade) => {
                        state.masquerade = true;
                        out.push((state, Exit::Stop(Verdict::Accept)));
                    }
                }
            }
            work.extend(next.into_iter().rev());
        }
        Ok(out)
    }

    /// Evaluates the matches in order; a random match forks the path (taken first).
    fn evaluate(&self, rule: &Rule, state: PathState) -> Vec<(PathState, bool)> {
        let mut candidates = vec![(state, true)];
        for m in &rule.matches {
            let mut next = Vec::with_capacity(candidates.len() + 1);
            for (mut state, matching) in candidates {
                if !matching {
                    next.push((state, false));
                    continue;
                }
                match m {
                    Match::Random { probability } => {
                        if *probability > 0.0 {
                            next.push((state.clone(), true));
                        }
                        if *probability < 1.0 {
                            next.push((state, false));
                        }
                    }
                    Match::RecentSet { name } => {
                        state.recent_set.insert(name.clone());
                        next.push((state, true));
                    }
                    other => {
                        let result = self.test(other, &state);
                        next.push((state, result));
                    }
                }
            }
            candidates = next;
        }
        candidates
    }

    /// A match without side effects or branches.
    fn test(&self, m: &Match, state: &PathState) -> bool {
        let local = |ip| self.tracer.is_local(ip);
        match m {
            Match::Source { cidr, negated } => cidr.contains(state.source) != *negated,
            Match::Destination { cidr, negated } => cidr.contains(state.destination) != *negated,
            Match::Protocol(p) => self.packet.protocol == *p,
            Match::DestinationPort { port, negated } => (state.port == *port) != *negated,
            Match::SourceLocal { negated } => local(state.source) != *negated,
            Match::DestinationLocal { negated } => local(state.destination) != *negated,
            Match::Mark {
                value,
                mask,
                negated,
            } => (state.mark & mask == *value) != *negated,
            Match::CtState { states, negated } => states.contains("NEW") != *negated,
            Match::RecentCheck { name } => self.packet.recent.contains(name),
            // Handled in `evaluate`.
            Match::Random { .. } | Match::RecentSet { .. } => true,
        }
    }
}

/// One table, parsed.
#[derive(Debug, Clone)]
struct Table {
    name: &'static str,
    /// Base jumps by built-in chain, in order.
    base: BTreeMap<String, Vec<Rule>>,
    /// The agent's chains.
    chains: BTreeMap<String, Vec<Rule>>,
}

impl Table {
    fn parse(which: TableName, rules: &TableRules) -> Result<Self, TraceError> {
        let name = which.as_str();
        let fail = |chain: &str, index: usize, rule: &str, reason: String| TraceError::Rule {
            table: name,
            chain: chain.to_owned(),
            index,
            rule: rule.to_owned(),
            reason,
        };
        let mut base: BTreeMap<String, Vec<Rule>> = BTreeMap::new();
        for jump in &rules.base_jumps {
            let list = base.entry(jump.chain.to_owned()).or_default();
            let rule =
                Rule::parse(&jump.rule).map_err(|r| fail(jump.chain, list.len(), &jump.rule, r))?;
            list.push(rule);
        }
        let mut chains = BTreeMap::new();
        for (chain, texts) in &rules.chains {
            let parsed = texts
                .iter()
                .enumerate()
                .map(|(i, text)| Rule::parse(text).map_err(|r| fail(chain, i, text, r)))
                .collect::<Result<Vec<_>, _>>()?;
            chains.insert(chain.clone(), parsed);
        }
        let table = Self { name, base, chains };
        for (chain, list) in table.base.iter().chain(&table.chains) {
            for (i, rule) in list.iter().enumerate() {
                if let Some(Target::Chain(target)) = &rule.target
                    && !table.chains.contains_key(target)
                {
                    return Err(fail(
                        chain,
                        i,
                        &rule.text,
                        format!("unknown target or chain {target}"),
                    ));
                }
            }
        }
        Ok(table)
    }
}

/// A parsed rule.
#[derive(Debug, Clone)]
struct Rule {
    text: String,
    matches: Vec<Match>,
    target: Option<Target>,
}

#[derive(Debug, Clone)]
enum Match {
    Source {
        cidr: Cidr,
        negated: bool,
    },
    Destination {
        cidr: Cidr,
        negated: bool,
    },
    Protocol(Protocol),
    DestinationPort {
        port: u16,
        negated: bool,
    },
    SourceLocal {
        negated: bool,
    },
    DestinationLocal {
        negated: bool,
    },
    Random {
        probability: f64,
    },
    RecentCheck {
        name: String,
    },
    RecentSet {
        name: String,
    },
    Mark {
        value: u32,
        mask: u32,
        negated: bool,
    },
    CtState {
        states: BTreeSet<String>,
        negated: bool,
    },
}

#[derive(Debug, Clone)]
enum Target {
    Chain(String),
    Return,
    Accept,
    Drop,
    Reject,
    Masquerade,
    Mark(MarkOp),
    Dnat(SocketAddr),
}

#[derive(Debug, Clone, Copy)]
enum MarkOp {
    Or(u32),
    Xor(u32),
    /// `--set-xmark value/mask`: zero the mask bits, then XOR the value.
    SetX {
        value: u32,
        mask: u32,
    },
}

impl MarkOp {
    fn apply(self, mark: u32) -> u32 {
        match self {
            Self::Or(v) => mark | v,
            Self::Xor(v) => mark ^ v,
            Self::SetX { value, mask } => (mark & !mask) ^ value,
        }
    }
}

/// An address block (a plain address is a full-length block).
#[derive(Debug, Clone, Copy)]
struct Cidr {
    network: IpAddr,
    len: u8,
}

impl Cidr {
    fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("bad address or CIDR {text:?}");
        let (ip, len) = match text.split_once('/') {
            Some((ip, len)) => (ip, Some(len)),
            None => (text, None),
        };
        let network = IpAddr::from_str(ip).map_err(|_| bad())?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let len = match len {
            Some(len) => len.parse::<u8>().map_err(|_| bad())?,
            None => max,
        };
        if len > max {
            return Err(bad());
        }
        Ok(Self { network, len })
    }

    fn contains(self, ip: IpAddr) -> bool {
        match (self.network, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.len))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// Splits a rule into words; double quotes group words, backslash escapes inside them.
fn tokenize(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut chars = text.chars();
    let mut word = String::new();
    let mut in_word = false;
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(escaped) => word.push(escaped),
                            None => return Err("dangling backslash".to_owned()),
                        },
                        Some(other) => word.push(other),
                        None => return Err("unterminated quote".to_owned()),
                    }
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

fn protocol(name: &str) -> Result<Protocol, String> {
    match name {
        "tcp" => Ok(Protocol::TCP),
        "udp" => Ok(Protocol::UDP),
        "sctp" => Ok(Protocol::SCTP),
        other => Err(format!("unsupported protocol {other:?}")),
    }
}

fn number(text: &str) -> Result<u32, String> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|_| format!("bad number {text:?}"))
}

/// `value[/mask]`, the mask defaulting to all ones.
fn value_mask(text: &str) -> Result<(u32, u32), String> {
    match text.split_once('/') {
        Some((value, mask)) => Ok((number(value)?, number(mask)?)),
        None => Ok((number(text)?, u32::MAX)),
    }
}

/// A match module being read (`-m NAME` and its options).
enum Module {
    Port {
        protocol: Protocol,
        dport: Option<(u16, bool)>,
    },
    AddrType {
        matches: Vec<Match>,
    },
    Comment {
        seen: bool,
    },
    Statistic {
        random: bool,
        probability: Option<f64>,
    },
    Recent {
        name: Option<String>,
        check: bool,
        set: bool,
    },
    Mark {
        mark: Option<(u32, u32, bool)>,
    },
    Conntrack {
        states: Option<(BTreeSet<String>, bool)>,
    },
}

impl Module {
    fn start(name: &str) -> Result<Self, String> {
        Ok(match name {
            "tcp" | "udp" | "sctp" => Self::Port {
                protocol: protocol(name)?,
                dport: None,
            },
            "addrtype" => Self::AddrType {
                matches: Vec::new(),
            },
            "comment" => Self::Comment { seen: false },
            "statistic" => Self::Statistic {
                random: false,
                probability: None,
            },
            "recent" => Self::Recent {
                name: None,
                check: false,
                set: false,
            },
            "mark" => Self::Mark { mark: None },
            "conntrack" => Self::Conntrack { states: None },
            other => return Err(format!("unsupported match module {other:?}")),
        })
    }

    /// One option of this module; `value` pulls its argument.
    fn option(
        &mut self,
        option: &str,
        negated: bool,
        value: &mut dyn FnMut() -> Result<String, String>,
    ) -> Result<(), String> {
        let not_negatable = || format!("{option} cannot be negated here");
        match (self, option) {
            (Self::Port { dport, .. }, "--dport" | "--destination-port") => {
                let text = value()?;
                let port = text
                    .parse::<u16>()
                    .map_err(|_| format!("bad port {text:?}"))?;
                *dport = Some((port, negated));
            }
            (Self::AddrType { matches }, "--src-type" | "--dst-type") => {
                let kind = value()?;
                if kind != "LOCAL" {
                    return Err(format!("unsupported address type {kind:?}"));
                }
                matches.push(if option == "--src-type" {
                    Match::SourceLocal { negated }
                } else {
                    Match::DestinationLocal { negated }
                });
            }
            (Self::Comment { seen }, "--comment") if !negated => {
                value()?;
                *seen = true;
            }
            (Self::Statistic { random, .. }, "--mode") if !negated => {
                let mode = value()?;
                if mode != "random" {
                    return Err(format!("unsupported statistic mode {mode:?}"));
                }
                *random = true;
            }
            (Self::Statistic { probability, .. }, "--probability") if !negated => {
                let text = value()?;
                let p = text
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| format!("bad probability {text:?}"))?;
                *probability = Some(p);
            }
            (Self::Recent { name, .. }, "--name") if !negated => *name = Some(value()?),
            (Self::Recent { check, .. }, "--rcheck") if !negated => *check = true,
            (Self::Recent { set, .. }, "--set") if !negated => *set = true,
            (Self::Recent { .. }, "--seconds") if !negated => {
                number(&value()?)?;
            }
            (Self::Recent { .. }, "--reap" | "--rsource") if !negated => {}
            (Self::Mark { mark }, "--mark") => {
                let (v, m) = value_mask(&value()?)?;
                *mark = Some((v, m, negated));
            }
            (Self::Conntrack { states }, "--ctstate") => {
                let list = value()?;
                let mut set = BTreeSet::new();
                for state in list.split(',') {
                    if !["NEW", "ESTABLISHED", "RELATED", "INVALID", "UNTRACKED"].contains(&state) {
                        return Err(format!("unsupported conntrack state {state:?}"));
                    }
                    set.insert(state.to_owned());
                }
                *states = Some((set, negated));
            }
            (
                Self::Comment { .. } | Self::Statistic { .. } | Self::Recent { .. },
                "--comment" | "--mode" | "--probability" | "--name" | "--rcheck" | "--set"
                | "--seconds" | "--reap" | "--rsource",
            ) => return Err(not_negatable()),
            (_, other) => return Err(format!("unsupported option {other}")),
        }
        Ok(())
    }

    /// The module's matches, once its options are all read.
    fn finish(self, matches: &mut Vec<Match>) -> Result<(), String> {
        match self {
            Self::Port { protocol, dport } => {
                if !matches
                    .iter()
                    .any(|m| matches!(m, Match::Protocol(p) if *p == protocol))
                {
                    return Err(format!("-m {protocol} without -p {protocol}"));
                }
                if let Some((port, negated)) = dport {
                    matches.push(Match::DestinationPort { port, negated });
                }
            }
            Self::AddrType { matches: found } => {
                if found.is_empty() {
                    return Err("-m addrtype without --src-type or --dst-type".to_owned());
                }
                matches.extend(found);
            }
            Self::Comment { seen } => {
                if !seen {
                    return Err("-m comment without --comment".to_owned());
                }
            }
            Self::Statistic {
                random,
                probability,
            } => match (random, probability) {
                (true, Some(probability)) => matches.push(Match::Random { probability }),
                _ => return Err("-m statistic needs --mode random --probability P".to_owned()),
            },
            Self::Recent { name, check, set } => {
                let name = name.ok_or("-m recent without --name")?;
                matches.push(match (check, set) {
                    (true, false) => Match::RecentCheck { name },
                    (false, true) => Match::RecentSet { name },
                    _ => return Err("-m recent needs exactly one of --rcheck, --set".to_owned()),
                });
            }
            Self::Mark { mark } => {
                let (value, mask, negated) = mark.ok_or("-m mark without --mark")?;
                matches.push(Match::Mark {
                    value,
                    mask,
                    negated,
                });
            }
            Self::Conntrack { states } => {
                let (states, negated) = states.ok_or("-m conntrack without --ctstate")?;
                matches.push(Match::CtState { states, negated });
            }
        }
        Ok(())
    }
}

impl Rule {
    fn parse(text: &str) -> Result<Self, String> {
        let words = tokenize(text)?;
        let mut words = words.into_iter();
        let mut matches = Vec::new();
        let mut module: Option<Module> = None;
        let mut negated = false;
        let mut target = None;
        while let Some(word) = words.next() {
            let mut value = || words.next().ok_or_else(|| format!("{word} needs a value"));
            match word.as_str() {
                "!" if !negated => {
                    negated = true;
                    continue;
                }
                "-s" | "--source" => matches.push(Match::Source {
                    cidr: Cidr::parse(&value()?)?,
                    negated,
                }),
                "-d" | "--destination" => matches.push(Match::Destination {
                    cidr: Cidr::parse(&value()?)?,
                    negated,
                }),
                "-p" | "--protocol" if !negated => {
                    matches.push(Match::Protocol(protocol(&value()?)?))
                }
                "-m" | "--match" if !negated => {
                    let name = value()?;
                    if let Some(done) = module.take() {
                        done.finish(&mut matches)?;
                    }
                    module = Some(Module::start(&name)?);
                }
                "-j" | "--jump" if !negated => {
                    let name = value()?;
                    if let Some(done) = module.take() {
                        done.finish(&mut matches)?;
                    }
                    let rest: Vec<String> = words.by_ref().collect();
                    target = Some(Target::parse(&name, &rest)?);
                }
                option if option.starts_with("--") => match module.as_mut() {
                    Some(m) => m.option(option, negated, &mut value)?,
                    None => return Err(format!("option {option} outside a match module")),
                },
                other => {
                    let what = if negated { "negated " } else { "" };
                    return Err(format!("unsupported {what}word {other:?}"));
                }
            }
            negated = false;
        }
        if negated {
            return Err("dangling !".to_owned());
        }
        if let Some(done) = module.take() {
            done.finish(&mut matches)?;
        }
        Ok(Self {
            text: text.to_owned(),
            matches,
            target,
        })
    }
}

impl Target {
    fn parse(name: &str, options: &[String]) -> Result<Self, String> {
        let options: Vec<&str> = options.iter().map(String::as_str).collect();
        let none = |target: Self| {
            if options.is_empty() {
                Ok(target)
            } else {
                Err(format!("unsupported options for {name}: {options:?}"))
            }
        };
        match (name, options.as_slice()) {
            ("RETURN", _) => none(Self::Return),
            ("ACCEPT", _) => none(Self::Accept),
            ("DROP", _) => none(Self::Drop),
            ("REJECT", []) => Ok(Self::Reject),
            ("REJECT", ["--reject-with", _]) => Ok(Self::Reject),
            ("MASQUERADE", [] | ["--random-fully"] | ["--random"]) => Ok(Self::Masquerade),
            ("MARK", ["--or-mark", v]) => Ok(Self::Mark(MarkOp::Or(number(v)?))),
            ("MARK", ["--xor-mark", v]) => Ok(Self::Mark(MarkOp::Xor(number(v)?))),
            ("MARK", ["--set-xmark", v]) => {
                let (value, mask) = value_mask(v)?;
                Ok(Self::Mark(MarkOp::SetX { value, mask }))
            }
            ("DNAT", ["--to-destination", to]) => SocketAddr::from_str(to)
                .map(Self::Dnat)
                .map_err(|_| format!("bad DNAT destination {to:?} (want ip:port or [ip6]:port)")),
            ("REJECT" | "MASQUERADE" | "MARK" | "DNAT", _) => {
                Err(format!("unsupported options for {name}: {options:?}"))
            }
            (chain, _) if chain.starts_with('-') || chain.is_empty() => {
                Err(format!("bad target {chain:?}"))
            }
            (chain, _) => none(Self::Chain(chain.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ruleset::rules::BaseJump;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// A nat table with a service chain balancing over two endpoints and a masquerade
    /// chain, hand-written in the renderer's syntax.
    fn rules() -> FamilyRules {
        let mut nat = TableRules {
            base_jumps: vec![
                BaseJump {
                    chain: "PREROUTING",
                    rule: "-m comment --comment \"portals\" -j SVCS".into(),
                },
                BaseJump {
                    chain: "OUTPUT",
                    rule: "-j SVCS".into(),
                },
                BaseJump {
                    chain: "POSTROUTING",
                    rule: "-j POST".into(),
                },
            ],
            chains: BTreeMap::new(),
        };
        let chain = |rules: &[&str]| rules.iter().map(|r| (*r).to_owned()).collect::<Vec<_>>();
        nat.chains.insert(
            "SVCS".into(),
            chain(&[
                "-m comment --comment \"a b\" -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j SVC",
                "-d 10.96.0.2 -p udp -m udp --dport 53 -j SVC",
            ]),
        );
        nat.chains.insert(
            "SVC".into(),
            chain(&[
                "! -s 10.244.0.0/16 -j MASQ",
                "-m recent --name SEP1 --rcheck --seconds 60 --reap -j SEP1",
                "-m statistic --mode random --probability 0.5000000000 -j SEP1",
                "-j SEP2",
            ]),
        );
        nat.chains
            .insert("MASQ".into(), chain(&["-j MARK --or-mark 0x2000"]));
        nat.chains.insert(
            "SEP1".into(),
            chain(&[
                "-s 10.244.1.1/32 -j MASQ",
                "-p tcp -m recent --name SEP1 --set -j DNAT --to-destination 10.244.1.1:8080",
                "-p udp -j DNAT --to-destination 10.244.1.1:5353",
            ]),
        );
        nat.chains.insert(
            "SEP2".into(),
            chain(&["-j DNAT --to-destination 10.244.2.1:8080"]),
        );
        nat.chains.insert(
            "POST".into(),
            chain(&[
                "-m mark ! --mark 0x2000/0x2000 -j RETURN",
                "-j MARK --xor-mark 0x2000",
                "-j MASQUERADE --random-fully",
            ]),
        );
        let mut filter = TableRules {
            base_jumps: vec![BaseJump {
                chain: "FORWARD",
                rule: "-m conntrack --ctstate NEW -j FW".into(),
            }],
            chains: BTreeMap::new(),
        };
        filter.chains.insert(
            "FW".into(),
            chain(&["-d 10.96.0.9/32 -p tcp -m tcp --dport 80 -j REJECT"]),
        );
        FamilyRules { filter, nat }
    }

    fn tcp(source: &str, dest: &str, port: u16) -> Packet {
        Packet::new(ip(source), ip(dest), Protocol::TCP, port)
    }

    #[test]
    fn random_balancing_explores_every_branch() {
        let result = trace(&rules(), &[], &tcp("10.244.3.3", "10.96.0.1", 80)).unwrap();
        assert_eq!(result.verdict, Verdict::Accept);
        assert_eq!(
            result.endpoints,
            BTreeSet::from(["10.244.1.1:8080".to_owned(), "10.244.2.1:8080".to_owned()])
        );
        assert!(!result.masquerade, "{result}");
        assert!(result.is_uniform());
        assert_eq!(result.recent_set, BTreeSet::from(["SEP1".to_owned()]));
    }

    #[test]
    fn mark_becomes_masquerade_in_postrouting() {
        let result = trace(&rules(), &[], &tcp("192.168.1.1", "10.96.0.1", 80)).unwrap();
        assert!(result.masquerade && result.is_uniform(), "{result}");
        let host = tcp("192.168.1.1", "10.96.0.1", 80).host_originated();
        assert!(trace(&rules(), &[], &host).unwrap().masquerade);
    }

    #[test]
    fn hairpin_masquerades_only_the_path_back_to_the_source() {
        let result = trace(&rules(), &[], &tcp("10.244.1.1", "10.96.0.1", 80)).unwrap();
        assert!(!result.is_uniform());
        assert_eq!(result.masquerade_to("10.244.1.1:8080"), Some(true));
        assert_eq!(result.masquerade_to("10.244.2.1:8080"), Some(false));
    }

    #[test]
    fn recent_check_matches_a_returning_client() {
        let packet = tcp("10.244.3.3", "10.96.0.1", 80).with_recent("SEP1");
        let result = trace(&rules(), &[], &packet).unwrap();
        assert_eq!(
            result.endpoints,
            BTreeSet::from(["10.244.1.1:8080".to_owned()])
        );
    }

    #[test]
    fn protocol_and_port_must_match() {
        let result = trace(&rules(), &[], &tcp("10.244.3.3", "10.96.0.1", 81)).unwrap();
        assert_eq!(result.verdict, Verdict::Accept);
        assert!(result.endpoints.is_empty() && !result.masquerade);
        let udp = Packet::new(ip("10.244.3.3"), ip("10.96.0.2"), Protocol::UDP, 53);
        let result = trace(&rules(), &[], &udp).unwrap();
        assert_eq!(
            result.endpoints,
            BTreeSet::from(["10.244.1.1:5353".to_owned(), "10.244.2.1:8080".to_owned()])
        );
    }

    #[test]
    fn filter_runs_on_forwarded_packets_only_for_their_hook() {
        let result = trace(&rules(), &[], &tcp("10.244.3.3", "10.96.0.9", 80)).unwrap();
        assert_eq!(result.verdict, Verdict::Reject);
        // The same destination as a local address: INPUT, where FW is not jumped to.
        let result = trace(
            &rules(),
            &[ip("10.96.0.9")],
            &tcp("10.244.3.3", "10.96.0.9", 80),
        )
        .unwrap();
        assert_eq!(result.verdict, Verdict::Accept);
    }

    #[test]
    fn cidrs_and_tokens() {
        let cidr = Cidr::parse("fd00:10:244::/48").unwrap();
        assert!(cidr.contains(ip("fd00:10:244:1::5")));
        assert!(!cidr.contains(ip("fd00:10:245::5")));
        assert!(!cidr.contains(ip("10.0.0.1")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("1.2.3.4")));
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert_eq!(
            tokenize(r#"-m comment --comment "a \"b\" c" -j X"#).unwrap(),
            ["-m", "comment", "--comment", "a \"b\" c", "-j", "X"]
        );
        assert!(tokenize("\"open").is_err());
    }

    #[test]
    fn dnat_to_ipv6() {
        let rule = Rule::parse("-p tcp -j DNAT --to-destination [fd00::1]:8080").unwrap();
        let Some(Target::Dnat(to)) = rule.target else {
            panic!("{rule:?}")
        };
        assert_eq!(to.to_string(), "[fd00::1]:8080");
    }

    #[test]
    fn unknown_syntax_is_an_error() {
        for bad in [
            "-i eth0 -j ACCEPT",
            "-m multiport --dports 80,443 -j ACCEPT",
            "-p tcp -m tcp --sport 80 -j ACCEPT",
            "-m tcp --dport 80 -j ACCEPT",
            "-p icmp -j ACCEPT",
            "-m addrtype --dst-type BROADCAST -j ACCEPT",
            "-m statistic --mode nth --every 2 -j ACCEPT",
            "-m recent --name X --update -j ACCEPT",
            "-j DNAT --to-destination 10.0.0.1",
            "-j MARK --and-mark 0x1",
            "-j MASQUERADE --to-ports 1000",
            "-j ACCEPT --extra",
            "-d 10.0.0.0/40 -j ACCEPT",
            "--comment x -j ACCEPT",
            "! ! -s 10.0.0.1 -j ACCEPT",
            "-s 10.0.0.1 !",
        ] {
            assert!(Rule::parse(bad).is_err(), "{bad}");
        }
        let mut broken = rules();
        broken
            .nat
            .chains
            .insert("SEP2".into(), vec!["-j SNAT --to-source 1.2.3.4".into()]);
        let err = Tracer::new(&broken, &[]).unwrap_err();
        assert!(
            matches!(&err, TraceError::Rule { chain, .. } if chain == "SEP2"),
            "{err}"
        );
    }

    #[test]
    fn loops_are_an_error() {
        let mut looping = rules();
        looping
            .nat
            .chains
            .insert("SEP2".into(), vec!["-j SVC".into()]);
        let err = trace(&looping, &[], &tcp("10.244.3.3", "10.96.0.1", 80)).unwrap_err();
        assert!(matches!(err, TraceError::TooDeep { .. }), "{err}");
    }
}
