//! The rules as the tracer reads them: each rule parsed into matches and a target, only
//! the syntax the renderer emits.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use proxyplan_crds::Protocol;

use super::path::TraceError;
use crate::ruleset::rules::{TableName, TableRules};

/// One table, parsed.
#[derive(Debug, Clone)]
pub(super) struct Table {
    pub(super) name: &'static str,
    /// Base jumps by built-in chain, in order.
    pub(super) base: BTreeMap<String, Vec<Rule>>,
    /// The agent's chains.
    pub(super) chains: BTreeMap<String, Vec<Rule>>,
}

impl Table {
    pub(super) fn parse(which: TableName, rules: &TableRules) -> Result<Self, TraceError> {
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
pub(super) struct Rule {
    pub(super) text: String,
    pub(super) matches: Vec<Match>,
    pub(super) target: Option<Target>,
}

#[derive(Debug, Clone)]
pub(super) enum Match {
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
    /// `-m set [!] --match-set NAME DIRS` (ipvs mode): the packet's addresses and ports,
    /// taken in `dirs` order, are an entry of the ipset `name`.
    Set {
        name: String,
        dirs: Vec<Dir>,
        negated: bool,
    },
    /// `-m ipvs --vaddr A --vproto P --vport N` (ipvs mode): IPVS took the connection,
    /// for a virtual server that matches every option given.
    Ipvs {
        vaddr: Option<Cidr>,
        vproto: Option<Protocol>,
        vport: Option<u16>,
    },
}

/// A direction of an ipset match: the packet's source or destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dir {
    Src,
    Dst,
}

#[derive(Debug, Clone)]
pub(super) enum Target {
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
pub(super) enum MarkOp {
    Or(u32),
    Xor(u32),
    /// `--set-xmark value/mask`: zero the mask bits, then XOR the value.
    SetX {
        value: u32,
        mask: u32,
    },
}

impl MarkOp {
    pub(super) fn apply(self, mark: u32) -> u32 {
        match self {
            Self::Or(v) => mark | v,
            Self::Xor(v) => mark ^ v,
            Self::SetX { value, mask } => (mark & !mask) ^ value,
        }
    }
}

/// An address block (a plain address is a full-length block).
#[derive(Debug, Clone, Copy)]
pub(super) struct Cidr {
    network: IpAddr,
    len: u8,
}

impl Cidr {
    /// The block `network/len` (`len` as the caller checked it).
    pub(super) fn new(network: IpAddr, len: u8) -> Self {
        Self { network, len }
    }

    pub(super) fn parse(text: &str) -> Result<Self, String> {
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

    pub(super) fn contains(self, ip: IpAddr) -> bool {
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
pub(super) fn tokenize(text: &str) -> Result<Vec<String>, String> {
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
    Set {
        set: Option<(String, Vec<Dir>, bool)>,
    },
    Ipvs {
        vaddr: Option<Cidr>,
        vproto: Option<Protocol>,
        vport: Option<u16>,
    },
}

/// A protocol by name or, as `iptables-save` prints `--vproto`, by number.
fn protocol_or_number(text: &str) -> Result<Protocol, String> {
    match text {
        "6" => Ok(Protocol::TCP),
        "17" => Ok(Protocol::UDP),
        "132" => Ok(Protocol::SCTP),
        name => protocol(name),
    }
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
            "set" => Self::Set { set: None },
            "ipvs" => Self::Ipvs {
                vaddr: None,
                vproto: None,
                vport: None,
            },
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
            // iptables-save spells out the default mask: the whole source address.
            (Self::Recent { .. }, "--mask") if !negated => {
                let mask = value()?;
                if !["255.255.255.255", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"]
                    .contains(&mask.as_str())
                {
                    return Err(format!("unsupported recent mask {mask:?}"));
                }
            }
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
            (Self::Set { set }, "--match-set") if set.is_none() => {
                let name = value()?;
                let dirs = value()?
                    .split(',')
                    .map(|d| match d {
                        "src" => Ok(Dir::Src),
                        "dst" => Ok(Dir::Dst),
                        other => Err(format!("bad set direction {other:?}")),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                *set = Some((name, dirs, negated));
            }
            (Self::Ipvs { vaddr, .. }, "--vaddr") if !negated => {
                *vaddr = Some(Cidr::parse(&value()?)?);
            }
            (Self::Ipvs { vproto, .. }, "--vproto") if !negated => {
                *vproto = Some(protocol_or_number(&value()?)?);
            }
            (Self::Ipvs { vport, .. }, "--vport") if !negated => {
                let text = value()?;
                *vport = Some(
                    text.parse::<u16>()
                        .map_err(|_| format!("bad port {text:?}"))?,
                );
            }
            (Self::Ipvs { .. }, "--vaddr" | "--vproto" | "--vport") => {
                return Err(not_negatable());
            }
            (
                Self::Comment { .. } | Self::Statistic { .. } | Self::Recent { .. },
                "--comment" | "--mode" | "--probability" | "--name" | "--rcheck" | "--set"
                | "--seconds" | "--reap" | "--rsource" | "--mask",
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
            Self::Set { set } => {
                let (name, dirs, negated) = set.ok_or("-m set without --match-set")?;
                matches.push(Match::Set {
                    name,
                    dirs,
                    negated,
                });
            }
            Self::Ipvs {
                vaddr,
                vproto,
                vport,
            } => {
                if vaddr.is_none() && vproto.is_none() && vport.is_none() {
                    return Err("-m ipvs without --vaddr, --vproto or --vport".to_owned());
                }
                matches.push(Match::Ipvs {
                    vaddr,
                    vproto,
                    vport,
                });
            }
        }
        Ok(())
    }
}

impl Rule {
    pub(super) fn parse(text: &str) -> Result<Self, String> {
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
