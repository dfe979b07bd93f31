//! A new connection traced through the live nftables table, for `proxyplan-agent
//! explain`.
//!
//! One model of the table, not a second parser: the rules are the mode's own
//! [`Rule`](super::rules::Rule)s for the plan, and each chain the packet enters must
//! hold exactly them in the kernel, compared by the same hash the sync and the tamper
//! check compare (a chain someone changed is reported, not traced through). The maps
//! and sets the rules look packets up in are read from the kernel ([`HeldTable`], the
//! tamper check's read), so a missing, extra or changed element shows in the trace as
//! it does to packets.
//!
//! The hooks a new connection passes, in priority order: prerouting (filter −110, nat
//! −100) for a packet that arrives, output (filter −110, nat −100, filter 0) for one the
//! node sends; then input (filter 0) when the translated destination is the node's own,
//! else forward (filter 0); then postrouting (nat 100). A `numgen` choice forks the trace,
//! one path per slot.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;

use proxyplan_crds::{IpFamily, MergedPlan};

use super::dataplane::family_context;
use super::layout::{self, ChainDef, FamilyContext};
use super::model::{HeldTable, rule_hash};
use super::names;
use super::render::{Dest, DestMap, Renderer};
use super::rules::{Action, Match, RuleText, addr_bytes, proto_name};
use super::settings::NftablesSettings;
use crate::kernel::Family;
use crate::kernel::nftables::objects::comment_userdata;
use crate::kernel::nftables::{NftKernel, Verdict};
/// How a path ends: the verdict the iptables and ipvs modes' traces give too.
pub use crate::ruleset::trace::Verdict as Final;

/// Chains entered at most on one path (the table has no loops; this bounds a tampered
/// one).
const MAX_DEPTH: usize = 16;

/// A new connection's first packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Its source address.
    pub source: IpAddr,
    /// Its destination address.
    pub destination: IpAddr,
    /// Its protocol number (6, 17, 132).
    pub protocol: u8,
    /// Its destination port.
    pub port: u16,
    /// Sent by a process of the node (hostNetwork), not arriving on an interface.
    pub from_host: bool,
    /// The interface it arrives on, when known.
    pub interface: Option<String>,
}

/// One way through the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracePath {
    /// How it ends.
    pub verdict: Final,
    /// Where DNAT sent it, if anywhere.
    pub endpoint: Option<(IpAddr, u16)>,
    /// Whether it is masqueraded.
    pub masquerade: bool,
    /// The chains' rules it matched and the elements it was looked up by, in order.
    pub steps: Vec<String>,
}

/// Every way a new connection can go through the live table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The paths, one per balancing choice.
    pub paths: Vec<TracePath>,
}

impl Trace {
    /// `accept` when any path is accepted, else `reject` when any is rejected, else
    /// `drop`.
    #[must_use]
    pub fn verdict(&self) -> Final {
        self.paths
            .iter()
            .map(|p| p.verdict)
            .min()
            .unwrap_or(Final::Accept)
    }

    /// The endpoints accepted paths go to, as `ip:port` (`[ip]:port` for IPv6).
    #[must_use]
    pub fn endpoints(&self) -> BTreeMap<String, bool> {
        let mut out = BTreeMap::new();
        for path in &self.paths {
            if path.verdict != Final::Accept {
                continue;
            }
            if let Some((ip, port)) = path.endpoint {
                let text = match ip {
                    IpAddr::V4(a) => format!("{a}:{port}"),
                    IpAddr::V6(a) => format!("[{a}]:{port}"),
                };
                *out.entry(text).or_insert(false) |= path.masquerade;
            }
        }
        out
    }
}

/// Why the live table could not be traced.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The table could not be read.
    #[error("reading the table: {0}")]
    Read(String),
    /// The node holds no table of the agent's for this family.
    #[error("the kernel holds no table {family} {}", names::TABLE)]
    NoTable {
        /// `ip` or `ip6`.
        family: &'static str,
    },
    /// A chain the packet enters is missing, or holds other rules than the agent's.
    #[error(
        "the live chain {0} is not what the agent programs for this plan (changed by \
         someone else, or not synced yet): not traced through"
    )]
    ChainDiffers(String),
    /// The rules jump deeper than any table of the agent's.
    #[error("the rules jump more than {MAX_DEPTH} chains deep")]
    TooDeep,
}

/// Traces `packet` through the live table of its family: the mode's rules for `plan`
/// under `settings`, checked against the kernel's chains, and the kernel's elements.
///
/// # Errors
/// When the table cannot be read, does not exist, or a chain on the way differs.
pub fn trace_live(
    kernel: &mut dyn NftKernel,
    plan: &MergedPlan,
    settings: &NftablesSettings,
    packet: &Packet,
) -> Result<Trace, TraceError> {
    let family = if packet.destination.is_ipv4() {
        Family::V4
    } else {
        Family::V6
    };
    let (held, _) = HeldTable::read(kernel, family).map_err(|e| TraceError::Read(e.to_string()))?;
    if !held.exists {
        return Err(TraceError::NoTable {
            family: match family {
                Family::V4 => "ip",
                Family::V6 => "ip6",
            },
        });
    }
    let ctx = family_context(plan, settings, family);
    let chains = wanted_chains(plan, &ctx);
    let tracer = Tracer {
        ctx: &ctx,
        chains: &chains,
        held: &held,
        packet,
    };
    tracer.run()
}

/// Every chain the agent programs for `plan` in `ctx`'s family, by name.
fn wanted_chains(plan: &MergedPlan, ctx: &FamilyContext) -> HashMap<String, ChainDef> {
    let renderer = Renderer { ctx };
    let mut chains: HashMap<String, ChainDef> = layout::fixed_chains(ctx)
        .into_iter()
        .map(|c| (c.name.clone(), c))
        .collect();
    let v6 = ctx.family == Family::V6;
    for entry in plan
        .service_ports
        .iter()
        .filter(|e| (e.family == IpFamily::IPv6) == v6)
    {
        let objects = renderer.entry(entry);
        for (_, value) in &objects.dests {
            if let Some(shared) = value.shared {
                let chain = layout::shared_chain(shared, ctx);
                chains.entry(chain.name.clone()).or_insert(chain);
            }
        }
        for chain in objects.chains {
            chains.insert(chain.name.clone(), chain);
        }
    }
    chains
}

/// Where a path is.
#[derive(Debug, Clone)]
struct State {
    daddr: IpAddr,
    dport: u16,
    mark: u32,
    dnat: Option<(IpAddr, u16)>,
    masquerade: bool,
    steps: Vec<String>,
}

/// How a chain (or a rule's actions) ended on one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// Went on: to the next rule (from a rule's actions), or back to the caller (from a
    /// chain).
    Next,
    /// This chain ends here (`return`, or the end of a chain it went to with `goto`).
    Return,
    /// Accepted: the rest of this hook's chain is skipped.
    Accept,
    /// Refused.
    Reject,
    /// Dropped.
    Drop,
}

struct Tracer<'a> {
    ctx: &'a FamilyContext,
    chains: &'a HashMap<String, ChainDef>,
    held: &'a HeldTable,
    packet: &'a Packet,
}

impl Tracer<'_> {
    fn run(&self) -> Result<Trace, TraceError> {
        use names::*;
        let start = State {
            daddr: self.packet.destination,
            dport: self.packet.port,
            mark: 0,
            dnat: None,
            masquerade: false,
            steps: Vec::new(),
        };
        let before_routing: &[&str] = if self.packet.from_host {
            &[FILTER_OUTPUT_PRE_DNAT, NAT_OUTPUT, FILTER_OUTPUT]
        } else {
            &[FILTER_PREROUTING_PRE_DNAT, NAT_PREROUTING]
        };
        let mut done = Vec::new();
        for (state, ended) in self.hooks(before_routing, vec![start])? {
            if let Some(verdict) = ended {
                done.push(path(state, verdict));
                continue;
            }
            // Routing: the node's own address is delivered (input), anything else is
            // forwarded; the node's own packets go out (postrouting), and to input when
            // they are for the node itself.
            let after: &[&str] = if self.packet.from_host {
                if self.local(state.daddr) {
                    &[NAT_POSTROUTING, FILTER_INPUT]
                } else {
                    &[NAT_POSTROUTING]
                }
            } else if self.local(state.daddr) {
                &[FILTER_INPUT]
            } else {
                &[FILTER_FORWARD, NAT_POSTROUTING]
            };
            for (state, ended) in self.hooks(after, vec![state])? {
                done.push(path(state, ended.unwrap_or(Final::Accept)));
            }
        }
        Ok(Trace { paths: done })
    }

    /// Runs the base chains `names` in order over every path in `states`: each path with
    /// how it ended (`None`: it went through).
    fn hooks(
        &self,
        names: &[&str],
        states: Vec<State>,
    ) -> Result<Vec<(State, Option<Final>)>, TraceError> {
        let mut live: Vec<State> = states;
        let mut ended = Vec::new();
        for name in names {
            let mut next = Vec::new();
            for state in live {
                for (state, flow) in self.chain(name, state, 0)? {
                    match flow {
                        Flow::Next | Flow::Return | Flow::Accept => next.push(state),
                        Flow::Reject => ended.push((state, Some(Final::Reject))),
                        Flow::Drop => ended.push((state, Some(Final::Drop))),
                    }
                }
            }
            live = next;
        }
        ended.extend(live.into_iter().map(|s| (s, None)));
        Ok(ended)
    }

    /// Runs chain `name` over one path: the paths it forks into and how each ended.
    fn chain(
        &self,
        name: &str,
        state: State,
        depth: usize,
    ) -> Result<Vec<(State, Flow)>, TraceError> {
        if depth > MAX_DEPTH {
            return Err(TraceError::TooDeep);
        }
        let chain = self.verified(name)?;
        let mut live = vec![state];
        let mut out = Vec::new();
        for rule in &chain.rules {
            let mut next = Vec::new();
            for mut state in live {
                if !rule.matches.iter().all(|m| self.matches(m, &state)) {
                    next.push(state);
                    continue;
                }
                state
                    .steps
                    .push(format!("{name}: {}", RuleText(rule, self.ctx.family)));
                for (state, flow) in self.actions(&rule.actions, state, depth)? {
                    match flow {
                        Flow::Next => next.push(state),
                        Flow::Return => out.push((state, Flow::Next)),
                        ended => out.push((state, ended)),
                    }
                }
            }
            live = next;
        }
        out.extend(live.into_iter().map(|s| (s, Flow::Next)));
        Ok(out)
    }

    /// The agent's chain `name`, once the kernel's is found to hold exactly its rules.
    fn verified(&self, name: &str) -> Result<&ChainDef, TraceError> {
        let wanted = self
            .chains
            .get(name)
            .ok_or_else(|| TraceError::ChainDiffers(name.to_owned()))?;
        let held = self
            .held
            .chains
            .get(name)
            .ok_or_else(|| TraceError::ChainDiffers(name.to_owned()))?;
        let same = held.rules.len() == wanted.rules.len()
            && held.rules.iter().zip(&wanted.rules).all(|(h, r)| {
                let userdata = r.comment.as_deref().map(comment_userdata);
                *h == rule_hash(&r.expressions(self.ctx.family), userdata.as_deref())
            });
        if same {
            Ok(wanted)
        } else {
            Err(TraceError::ChainDiffers(name.to_owned()))
        }
    }

    fn local(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.ctx.node_addresses.contains(&ip)
    }

    fn in_set(&self, set: &str, key: &[u8]) -> bool {
        self.held
            .sets
            .get(set)
            .is_some_and(|s| s.records.value(key).is_some())
    }

    fn matches(&self, m: &Match, state: &State) -> bool {
        let p = self.packet;
        match m {
            Match::CtStateNew => true,
            Match::CtStateInvalid => false,
            Match::CtStatusDnat => state.dnat.is_some(),
            Match::Saddr { net, negate } => net.contains(p.source) != *negate,
            Match::Daddr { net, negate } => net.contains(state.daddr) != *negate,
            Match::Iifname {
                name,
                prefix,
                negate,
            } => match (&p.interface, p.from_host) {
                (Some(iif), false) => {
                    let hit = if *prefix {
                        iif.starts_with(name.as_str())
                    } else {
                        iif == name
                    };
                    hit != *negate
                }
                // No input interface: the expression fails, and with it the rule.
                _ => false,
            },
            Match::FibSaddrLocal => self.local(p.source),
            Match::FibDaddrLocal => self.local(state.daddr),
            Match::L4Proto(proto) => p.protocol == *proto,
            Match::DaddrIn(set) => self.in_set(set, &addr_bytes(state.daddr)),
            Match::SaddrIn(set) => self.in_set(set, &addr_bytes(p.source)),
            Match::MarkClear(bit) => state.mark & bit == 0,
            Match::Hairpin(set) => {
                let mut key = addr_bytes(p.source);
                key.extend_from_slice(&addr_bytes(state.daddr));
                key.extend_from_slice(&[p.protocol, 0, 0, 0]);
                key.extend_from_slice(&state.dport.to_be_bytes());
                key.extend_from_slice(&[0, 0]);
                self.in_set(set, &key)
            }
        }
    }

    /// Runs `actions` (the rest of a rule's) over one path.
    fn actions(
        &self,
        actions: &[Action],
        mut state: State,
        depth: usize,
    ) -> Result<Vec<(State, Flow)>, TraceError> {
        let Some((action, rest)) = actions.split_first() else {
            return Ok(vec![(state, Flow::Next)]);
        };
        let p = self.packet;
        match action {
            Action::MarkOr(bit) => state.mark |= bit,
            Action::MarkXor(bit) => state.mark ^= bit,
            // NAT statements end the chain with an accept: nothing after them runs.
            Action::Masquerade => {
                state.masquerade = true;
                return Ok(vec![(state, Flow::Accept)]);
            }
            Action::Reject => return Ok(vec![(state, Flow::Reject)]),
            Action::AffinityRefresh(_) | Action::AffinityRecord { .. } => {}
            // A new client has no element in the affinity map: the lookup fails and
            // the rest of the rule does not run.
            Action::DnatByAffinity(_) => return Ok(vec![(state, Flow::Next)]),
            Action::DnatTo { addr, port } => {
                dnat(&mut state, *addr, *port);
                return Ok(vec![(state, Flow::Accept)]);
            }
            Action::Verdict(verdict) => return self.verdict(verdict, state, depth),
            Action::DispatchByDestination(map) | Action::DispatchByPort(map) => {
                let by_port = matches!(action, Action::DispatchByPort(_));
                let dest = Dest {
                    map: DestMap::ServiceIps,
                    addr: (!by_port).then_some(state.daddr),
                    proto: p.protocol,
                    port: state.dport,
                };
                let key = dest.key();
                let found = self
                    .held
                    .sets
                    .get(map)
                    .and_then(|s| s.records.verdict(&key));
                if let Some(step) = state.steps.last_mut() {
                    let address = dest.addr.map(|a| format!("{a} . ")).unwrap_or_default();
                    let _ = write!(
                        step,
                        "; {map}[{address}{} . {}] = {}",
                        proto_name(p.protocol),
                        state.dport,
                        found
                            .as_ref()
                            .map_or_else(|| "no element".to_owned(), verdict_text)
                    );
                }
                // Not in the map: the rule stops here, the next one runs.
                let Some(verdict) = found else {
                    return Ok(vec![(state, Flow::Next)]);
                };
                return self.verdict(&verdict, state, depth);
            }
            Action::DnatByDestination { map, modulus }
            | Action::DnatByPort { map, modulus }
            | Action::DnatBySlot { map, modulus } => {
                let mut out = Vec::new();
                for slot in 0..*modulus {
                    let mut key = Vec::new();
                    if matches!(action, Action::DnatByDestination { .. }) {
                        key.extend_from_slice(&addr_bytes(state.daddr));
                    }
                    if !matches!(action, Action::DnatBySlot { .. }) {
                        key.extend_from_slice(&state.dport.to_be_bytes());
                        key.extend_from_slice(&[0, 0]);
                    }
                    key.extend_from_slice(&slot.to_ne_bytes());
                    let Some(value) = self.held.sets.get(map).and_then(|s| s.records.value(&key))
                    else {
                        // No element for this slot: that share of new connections is
                        // not translated by this rule.
                        out.push(passed_on(
                            &state,
                            format!("{map}: no element for slot {slot} of {modulus}"),
                        ));
                        continue;
                    };
                    let Some((addr, port)) = endpoint_of(value, self.ctx.family) else {
                        out.push(passed_on(
                            &state,
                            format!("{map}: slot {slot} holds no endpoint it can read"),
                        ));
                        continue;
                    };
                    let mut next = state.clone();
                    dnat(&mut next, addr, port);
                    out.push((next, Flow::Accept));
                }
                return Ok(out);
            }
            Action::PickBySlot { map, modulus } => {
                let mut out = Vec::new();
                for slot in 0..*modulus {
                    let key = slot.to_ne_bytes();
                    let Some(verdict) = self
                        .held
                        .sets
                        .get(map)
                        .and_then(|s| s.records.verdict(&key))
                    else {
                        out.push(passed_on(
                            &state,
                            format!("{map}: no element for slot {slot} of {modulus}"),
                        ));
                        continue;
                    };
                    out.extend(self.verdict(&verdict, state.clone(), depth)?);
                }
                return Ok(out);
            }
        }
        self.actions(rest, state, depth)
    }

    fn verdict(
        &self,
        verdict: &Verdict,
        state: State,
        depth: usize,
    ) -> Result<Vec<(State, Flow)>, TraceError> {
        Ok(match verdict {
            Verdict::Accept => vec![(state, Flow::Accept)],
            Verdict::Drop => vec![(state, Flow::Drop)],
            Verdict::Continue => vec![(state, Flow::Next)],
            // The chain ends here: back to the one that jumped to it.
            Verdict::Return => vec![(state, Flow::Return)],
            // Back here when the target ends.
            Verdict::Jump(chain) => self.chain(chain, state, depth + 1)?,
            // The target replaces this chain: when it ends, this one has ended too.
            Verdict::Goto(chain) => self
                .chain(chain, state, depth + 1)?
                .into_iter()
                .map(|(s, f)| (s, if f == Flow::Next { Flow::Return } else { f }))
                .collect(),
        })
    }
}

/// A copy of `state` that the rule's lookup failed for (`why`): the next rule runs.
fn passed_on(state: &State, why: String) -> (State, Flow) {
    let mut next = state.clone();
    next.steps.push(why);
    (next, Flow::Next)
}

/// DNAT: the packet's destination from here on.
fn dnat(state: &mut State, addr: IpAddr, port: u16) {
    state.daddr = addr;
    state.dport = port;
    state.dnat = Some((addr, port));
}

fn path(state: State, verdict: Final) -> TracePath {
    TracePath {
        verdict,
        endpoint: state.dnat,
        masquerade: state.masquerade,
        steps: state.steps,
    }
}

/// An endpoint from a backends map's data: the address, then the port padded to 4.
fn endpoint_of(value: &[u8], family: Family) -> Option<(IpAddr, u16)> {
    let len = match family {
        Family::V4 => 4,
        Family::V6 => 16,
    };
    let addr = value.get(..len)?;
    let port = value.get(len..len + 2)?;
    let ip = match family {
        Family::V4 => IpAddr::from(<[u8; 4]>::try_from(addr).ok()?),
        Family::V6 => IpAddr::from(<[u8; 16]>::try_from(addr).ok()?),
    };
    Some((ip, u16::from_be_bytes([port[0], port[1]])))
}

fn verdict_text(v: &Verdict) -> String {
    match v {
        Verdict::Accept => "accept".to_owned(),
        Verdict::Drop => "drop".to_owned(),
        Verdict::Continue => "continue".to_owned(),
        Verdict::Return => "return".to_owned(),
        Verdict::Jump(c) => format!("jump {c}"),
        Verdict::Goto(c) => format!("goto {c}"),
    }
}
