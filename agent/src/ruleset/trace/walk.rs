//! The walk: a packet through the hooks the agent writes to, every branch of a random
//! match explored.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use super::ipvs::{IpvsStage, Shown, VirtualKey, set_holds};
use super::path::{MAX_DEPTH, Packet, TraceError, TracePath, TraceResult, Verdict};
use super::rules::{Match, Rule, Table, Target};
use crate::ruleset::rules::{FamilyRules, TableName};

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
    /// ipvs mode: IPVS and the ipsets.
    ipvs: Option<IpvsStage>,
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
            ipvs: None,
        })
    }

    /// The same rules in ipvs mode: IPVS schedules connections to its virtual servers
    /// (in `LOCAL_IN` for packets that arrive, `LOCAL_OUT` for the node's own), and set
    /// matches read `stage`'s ipsets. The local addresses must include the VIPs.
    ///
    /// # Errors
    /// When a rule matches a set `stage` does not hold, or matches it with directions its
    /// type does not have.
    pub fn with_ipvs(mut self, stage: IpvsStage) -> Result<Self, TraceError> {
        stage.check([&self.nat, &self.filter])?;
        self.ipvs = Some(stage);
        Ok(self)
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
            ipvs: None,
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
            if packet.host_originated {
                // IPVS takes the node's own connections right after nat OUTPUT.
                for state in self.schedule(state, packet, &mut paths) {
                    let delivered = self.is_local(state.destination);
                    self.send(state, packet, delivered, &mut paths)?;
                }
                continue;
            }
            let delivered = self.is_local(state.destination);
            let filter_hook = if delivered { "INPUT" } else { "FORWARD" };
            for (state, exit) in self.run_base(&self.filter, filter_hook, state, packet)? {
                if let Some(verdict) = exit.refusal() {
                    paths.push(state.finish(verdict));
                } else if !delivered {
                    self.postrouting(state, packet, false, &mut paths)?;
                } else {
                    // Delivered to this node: IPVS may take it (and send it on);
                    // otherwise no POSTROUTING, so no masquerade.
                    for state in self.schedule(state, packet, &mut paths) {
                        if state.ipvs.is_none() {
                            paths.push(state.finish(Verdict::Accept));
                        } else {
                            let delivered = self.is_local(state.destination);
                            self.send(state, packet, delivered, &mut paths)?;
                        }
                    }
                }
            }
        }
        Ok(TraceResult::from_paths(paths))
    }

    /// ipvs mode: IPVS's choice for a packet at `state`'s destination. One state per real
    /// server of positive weight (destination-translated); `state` itself when no virtual
    /// server has that address and port (or not in ipvs mode); none, with a rejected path
    /// in `paths`, when the virtual server has no real server to take it.
    fn schedule(
        &self,
        mut state: PathState,
        packet: &Packet,
        paths: &mut Vec<TracePath>,
    ) -> Vec<PathState> {
        let key: VirtualKey = (packet.protocol, state.destination, state.port);
        let Some(server) = self.ipvs.as_ref().and_then(|i| i.servers.get(&key)) else {
            return vec![state];
        };
        let persistence = server
            .persistence
            .map(|s| format!(", persistent {s} s"))
            .unwrap_or_default();
        let reachable: Vec<_> = server.real_servers.iter().filter(|(_, w)| *w > 0).collect();
        if reachable.is_empty() {
            state.rules.push(format!(
                "ipvs {}: no real server of positive weight ({} held): ICMP port unreachable",
                Shown(key),
                server.real_servers.len()
            ));
            paths.push(state.finish(Verdict::Reject));
            return Vec::new();
        }
        let total: u32 = reachable.iter().map(|(_, w)| *w).sum();
        reachable
            .into_iter()
            .map(|(to, weight)| {
                let mut state = state.clone();
                state.rules.push(format!(
                    "ipvs {}: {}{persistence} -> {to} weight {weight}/{total}",
                    Shown(key),
                    server.scheduler
                ));
                state.dnat = Some(*to);
                state.ipvs = Some(key);
                state.destination = to.ip();
                state.port = to.port();
                state
            })
            .collect()
    }

    /// filter OUTPUT, then nat POSTROUTING (and filter INPUT when `delivered` here).
    fn send(
        &self,
        state: PathState,
        packet: &Packet,
        delivered: bool,
        paths: &mut Vec<TracePath>,
    ) -> Result<(), TraceError> {
        for (state, exit) in self.run_base(&self.filter, "OUTPUT", state, packet)? {
            if let Some(verdict) = exit.refusal() {
                paths.push(state.finish(verdict));
            } else {
                self.postrouting(state, packet, delivered, paths)?;
            }
        }
        Ok(())
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
    /// The virtual server IPVS scheduled the packet for (ipvs mode).
    ipvs: Option<VirtualKey>,
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
            Match::Set {
                name,
                dirs,
                negated,
            } => {
                let held = self
                    .tracer
                    .ipvs
                    .as_ref()
                    .and_then(|i| i.sets.get(name))
                    .is_some_and(|set| {
                        set_holds(
                            set,
                            dirs,
                            (state.source, state.destination),
                            self.packet.protocol,
                            state.port,
                        )
                    });
                held != *negated
            }
            Match::Ipvs {
                vaddr,
                vproto,
                vport,
            } => state.ipvs.is_some_and(|(protocol, addr, port)| {
                vaddr.is_none_or(|c| c.contains(addr))
                    && vproto.is_none_or(|p| p == protocol)
                    && vport.is_none_or(|p| p == port)
            }),
            // Handled in `evaluate`.
            Match::Random { .. } | Match::RecentSet { .. } => true,
        }
    }
}
