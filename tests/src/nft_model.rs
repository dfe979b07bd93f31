//! An independent reader of the agent's nftables table, for the fleet benchmark's
//! per-node checker.
//!
//! [`parse`] takes what `nft -j list table ip proxyplan` prints and says, for every
//! Service destination and every node port the table knows, what a new connection gets:
//! the DNAT targets it can reach, a reject, or a drop. It shares no code with the agent:
//! it runs the listed rules, hook by hook and base chain by base chain in priority
//! order, on a model packet, the way the kernel would:
//!
//! - **to a Service destination** (every `address . protocol . port` key of the table's
//!   verdict maps): a new connection from a pod, routed through the node (prerouting,
//!   forward, postrouting);
//! - **to a node port** (every `protocol . port` key): a new connection from an
//!   off-cluster address that is not the node's, to one of the node's addresses
//!   (prerouting, then input, or forward once translated).
//!
//! A destination all of whose new connections pass untranslated is left out: one the
//! table does not proxy. (With the agent's layout, that leaves out every key but those of
//! `service-ips`, `no-endpoint-services`, `service-nodeports` and
//! `no-endpoint-nodeports`; a key of `firewall-ips` alone would show as the firewall's
//! drop, but the agent writes none.)
//!
//! Every `numgen` a rule evaluates is tried at each of its values, so a verdict is the
//! union over all the slots a random pick can reach; slots the modulus cannot reach are
//! never read. A destination whose slots meet different fates (some translated, some
//! dropped) is an error, as is anything on the packet's path this reader does not model:
//! the error names the chain and the rule.
//!
//! What the model packets are, where the rules cannot say it themselves:
//! - The pod source is an address inside the cluster CIDR: the one source prefix the
//!   chains behind the nat base chains test (`ip saddr 10.244.0.0/16`, `ip saddr !=
//!   10.244.0.0/16`). It is no address a set names (it is not the endpoint it reaches,
//!   and it has no affinity entry yet), and not one of the node's addresses.
//! - The off-cluster source is outside that prefix, not one of the node's addresses,
//!   and no address a set names.
//! - A Service address, and every DNAT target, is not one of the node's addresses
//!   (`fib daddr type local` fails for them; a translated packet is forwarded).
//! - The node address of a node port is not loopback and is no Service address.
//!
//! A prefix test the packet cannot settle that way (a source range that covers part of
//! the cluster CIDR, `--nodeport-addresses` prefixes) is an error, not a guess.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddrV4};

use serde_json::Value;

/// The table the agent programs.
const TABLE: &str = "proxyplan";

/// Jumps and gotos one packet may take through a base chain before the reader calls it a
/// loop.
const MAX_JUMPS: usize = 1_000;

/// Random picks one rule may combine before the reader gives up.
const MAX_PICKS: usize = 65_536;

/// The transport protocol of a Service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Proto {
    /// Its IP protocol number.
    #[must_use]
    pub fn number(self) -> u8 {
        match self {
            Self::Tcp => 6,
            Self::Udp => 17,
            Self::Sctp => 132,
        }
    }

    fn from_number(number: u64) -> Option<Self> {
        match number {
            6 => Some(Self::Tcp),
            17 => Some(Self::Udp),
            132 => Some(Self::Sctp),
            _ => None,
        }
    }
}

/// What a NEW connection gets: the DNAT targets it can reach (all slots of the random
/// choice), or reject, or drop.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// Translated to one of these addresses, picked at random.
    Endpoints(BTreeSet<SocketAddrV4>),
    /// Refused with an ICMP error.
    Reject,
    /// Dropped.
    Drop,
}

/// What the table does with new connections, as [`parse`] reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableView {
    /// Traffic addressed to a Service IP (cluster IP / external IP / LB IP) from a pod
    /// source (source address inside the cluster CIDR the rules test, so
    /// masquerade/short-circuit source conditions are as for a pod).
    pub services: BTreeMap<(Ipv4Addr, Proto, u16), Verdict>,
    /// Traffic to a node port on a local address from an off-cluster, non-local source.
    pub node_ports: BTreeMap<(Proto, u16), Verdict>,
}

/// Why a listing could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NftModelError {
    /// Not the JSON `nft -j list` prints.
    #[error("not the JSON of `nft -j list table`: {0}")]
    Json(String),
    /// The listing holds no `table ip proxyplan`.
    #[error("the listing holds no table ip {TABLE}")]
    NoTable,
    /// A set, map or chain of the table that does not read as one.
    #[error("{object}: {reason}")]
    Object {
        /// What it is (`map backends-tcp-2`).
        object: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A rule on a model packet's path that the reader does not understand, that names
    /// a chain or set the table does not have, or that sends the packet round a loop.
    #[error("chain {chain:?}, rule {position} (handle {handle}): {reason}; in {statement}")]
    Rule {
        /// The chain.
        chain: String,
        /// The rule's place in the chain, from 1.
        position: usize,
        /// The rule's handle, as the listing gives it.
        handle: String,
        /// The statement the reader stopped at, as JSON.
        statement: String,
        /// Why.
        reason: String,
    },
    /// New connections to one destination meet different fates, depending on the random
    /// pick.
    #[error("{destination}: {reason}")]
    Ambiguous {
        /// The destination (`10.96.0.10 tcp 80`, `node port tcp 30080`).
        destination: String,
        /// The fates met.
        reason: String,
    },
}

impl NftModelError {
    /// A stable short label of the kind of error, for counting.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Json(_) => "json",
            Self::NoTable => "no_table",
            Self::Object { .. } => "object",
            Self::Rule { .. } => "rule",
            Self::Ambiguous { .. } => "ambiguous",
        }
    }
}

/// Reads the output of `nft -j list table ip proxyplan` (or of `nft -j list ruleset`;
/// other tables are ignored) into what new connections get.
///
/// # Errors
///
/// When the text is not such a listing, or a rule on a model packet's path holds
/// anything this reader does not model (see the module documentation).
pub fn parse(nft_json: &str) -> Result<TableView, NftModelError> {
    Table::from_json(nft_json)?.view()
}

// ---- the table as listed --------------------------------------------------------------

/// What a value of a set key, of map data or of an expression is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Addr,
    Proto,
    Port,
    Int,
    Mark,
    FibType,
    CtState,
    CtStatus,
}

impl Kind {
    fn of_type(name: &str) -> Option<Self> {
        Some(match name {
            "ipv4_addr" => Self::Addr,
            "inet_proto" => Self::Proto,
            "inet_service" => Self::Port,
            "integer" => Self::Int,
            "mark" => Self::Mark,
            "ct_state" => Self::CtState,
            "ct_status" => Self::CtStatus,
            _ => return None,
        })
    }
}

/// A verdict as nft lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NftVerdict {
    Accept,
    Drop,
    Continue,
    Return,
    Jump(String),
    Goto(String),
}

/// One component of a key: the inclusive range of values it covers.
type Span = (u64, u64);

/// What a map element maps its key to.
#[derive(Debug, Clone)]
enum ElemData {
    Verdict(NftVerdict),
    Values(Vec<u64>),
}

#[derive(Debug, Clone)]
struct Elem {
    key: Vec<Span>,
    data: Option<ElemData>,
}

#[derive(Debug, Clone)]
enum DataKinds {
    Verdict,
    Values(Vec<Kind>),
}

#[derive(Debug, Clone)]
struct SetDef {
    /// The key's kinds; `Err` when the reader does not know a type of the key or data
    /// (the set is unusable, which is an error only if a packet looks into it).
    kinds: Result<Vec<Kind>, String>,
    data: Option<DataKinds>,
    elems: Vec<Elem>,
    /// Where each key is, when every key is one value per part (no prefix, no range).
    exact: Option<HashMap<Vec<u64>, usize>>,
}

#[derive(Debug, Clone)]
struct BaseHook {
    hook: String,
    chain_type: String,
    priority: i64,
    policy_drop: bool,
}

#[derive(Debug, Clone)]
struct RuleDef {
    handle: String,
    exprs: Vec<Value>,
}

#[derive(Debug, Clone, Default)]
struct ChainDef {
    declared: bool,
    base: Option<BaseHook>,
    rules: Vec<RuleDef>,
}

struct Table {
    sets: HashMap<String, SetDef>,
    chains: HashMap<String, ChainDef>,
    /// The cluster CIDR a pod source is in, as an address range; `Err` says why there
    /// is none.
    pod_range: Result<Span, String>,
}

/// The only key of a one-key JSON object, and its value.
fn only_key(value: &Value) -> Option<(&str, &Value)> {
    let object = value.as_object()?;
    if object.len() != 1 {
        return None;
    }
    object.iter().next().map(|(k, v)| (k.as_str(), v))
}

fn text(value: &Value) -> String {
    let mut text = value.to_string();
    if text.len() > 300 {
        let mut end = 300;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

fn object_error(object: String, reason: impl Into<String>) -> NftModelError {
    NftModelError::Object {
        object,
        reason: reason.into(),
    }
}

impl Table {
    fn from_json(nft_json: &str) -> Result<Self, NftModelError> {
        let root: Value =
            serde_json::from_str(nft_json).map_err(|e| NftModelError::Json(e.to_string()))?;
        let items = root
            .get("nftables")
            .and_then(Value::as_array)
            .ok_or_else(|| NftModelError::Json("no \"nftables\" array".to_owned()))?;
        let mut found = false;
        let mut sets = HashMap::new();
        let mut chains: HashMap<String, ChainDef> = HashMap::new();
        for item in items {
            let Some((what, body)) = only_key(item) else {
                continue;
            };
            let table_field = if what == "table" { "name" } else { "table" };
            if body.get("family").and_then(Value::as_str) != Some("ip")
                || body.get(table_field).and_then(Value::as_str) != Some(TABLE)
            {
                continue;
            }
            match what {
                "table" => found = true,
                "set" | "map" => {
                    let name = name_of(body, what)?;
                    let set = SetDef::from_json(body)
                        .map_err(|reason| object_error(format!("{what} {name}"), reason))?;
                    sets.insert(name, set);
                }
                "chain" => {
                    let name = name_of(body, what)?;
                    let base = base_hook(body)
                        .map_err(|reason| object_error(format!("chain {name}"), reason))?;
                    let chain = chains.entry(name).or_default();
                    chain.declared = true;
                    chain.base = base;
                }
                "rule" => {
                    let chain = body
                        .get("chain")
                        .and_then(Value::as_str)
                        .ok_or_else(|| object_error("a rule".to_owned(), "no chain"))?;
                    let handle = body
                        .get("handle")
                        .map_or_else(|| "?".to_owned(), ToString::to_string);
                    let exprs = match body.get("expr") {
                        None => Vec::new(),
                        Some(Value::Array(list)) => list.clone(),
                        Some(_) => {
                            return Err(object_error(
                                format!("rule {handle} of chain {chain}"),
                                "\"expr\" is not a list",
                            ));
                        }
                    };
                    chains
                        .entry(chain.to_owned())
                        .or_default()
                        .rules
                        .push(RuleDef { handle, exprs });
                }
                _ => {}
            }
        }
        if !found {
            return Err(NftModelError::NoTable);
        }
        if let Some((name, _)) = chains.iter().find(|(_, c)| !c.declared) {
            return Err(object_error(
                format!("chain {name}"),
                "has rules but is not listed",
            ));
        }
        let mut table = Self {
            sets,
            chains,
            pod_range: Err(String::new()),
        };
        table.pod_range = table.find_pod_range();
        Ok(table)
    }

    /// The one source prefix the chains behind the nat base chains test.
    fn find_pod_range(&self) -> Result<Span, String> {
        let mut todo: Vec<&str> = self
            .chains
            .iter()
            .filter(|(_, c)| c.base.as_ref().is_some_and(|b| b.chain_type == "nat"))
            .map(|(n, _)| n.as_str())
            .collect();
        let mut seen: HashSet<&str> = todo.iter().copied().collect();
        let mut prefixes = BTreeSet::new();
        while let Some(name) = todo.pop() {
            let Some(chain) = self.chains.get(name) else {
                continue;
            };
            for rule in &chain.rules {
                for expr in &rule.exprs {
                    if let Some(span) = saddr_prefix(expr) {
                        prefixes.insert(span);
                    }
                    let mut targets = Vec::new();
                    self.targets(expr, &mut targets);
                    for target in targets {
                        if seen.insert(target) {
                            todo.push(target);
                        }
                    }
                }
            }
        }
        let mut prefixes = prefixes.into_iter();
        match (prefixes.next(), prefixes.next()) {
            (Some(span), None) => Ok(span),
            (None, _) => Err(
                "the nat chains test no source prefix, so the table names no \
                 cluster CIDR to place a pod source in"
                    .to_owned(),
            ),
            (Some(a), Some(b)) => Err(format!(
                "the nat chains test several source prefixes ({} and {}), so which one is the \
                 cluster CIDR is not clear",
                show_span(a),
                show_span(b)
            )),
        }
    }

    /// The chains a statement can send a packet to: its `jump` and `goto` targets and
    /// those of the verdict maps it looks into.
    fn targets<'a>(&'a self, value: &'a Value, out: &mut Vec<&'a str>) {
        match value {
            Value::Array(list) => list.iter().for_each(|v| self.targets(v, out)),
            Value::Object(object) => {
                for (key, inner) in object {
                    match key.as_str() {
                        "jump" | "goto" => {
                            if let Some(t) = inner.get("target").and_then(Value::as_str) {
                                out.push(t);
                            }
                        }
                        "vmap" => {
                            if let Some(name) = inner
                                .get("data")
                                .and_then(Value::as_str)
                                .and_then(|d| d.strip_prefix('@'))
                                && let Some(set) = self.sets.get(name)
                            {
                                for elem in &set.elems {
                                    if let Some(ElemData::Verdict(
                                        NftVerdict::Jump(t) | NftVerdict::Goto(t),
                                    )) = &elem.data
                                    {
                                        out.push(t);
                                    }
                                }
                            }
                            self.targets(inner, out);
                        }
                        _ => self.targets(inner, out),
                    }
                }
            }
            _ => {}
        }
    }
}

fn name_of(body: &Value, what: &str) -> Result<String, NftModelError> {
    body.get("name")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| object_error(format!("a {what}"), "no name"))
}

fn base_hook(body: &Value) -> Result<Option<BaseHook>, String> {
    let Some(hook) = body.get("hook").and_then(Value::as_str) else {
        return Ok(None);
    };
    let chain_type = body
        .get("type")
        .and_then(Value::as_str)
        .ok_or("a base chain without a type")?;
    let priority = body
        .get("prio")
        .and_then(Value::as_i64)
        .ok_or("a base chain without a numeric priority")?;
    let policy_drop = match body.get("policy").and_then(Value::as_str) {
        None | Some("accept") => false,
        Some("drop") => true,
        Some(other) => return Err(format!("policy {other:?}")),
    };
    Ok(Some(BaseHook {
        hook: hook.to_owned(),
        chain_type: chain_type.to_owned(),
        priority,
        policy_drop,
    }))
}

/// `ip saddr [!=] PREFIX`: the prefix.
fn saddr_prefix(stmt: &Value) -> Option<Span> {
    let body = stmt.get("match")?;
    let payload = body.get("left")?.get("payload")?;
    if payload.get("protocol")?.as_str()? != "ip" || payload.get("field")?.as_str()? != "saddr" {
        return None;
    }
    let right = body.get("right")?;
    right.get("prefix")?;
    component(Kind::Addr, right).ok()
}

fn show_span((lo, hi): Span) -> String {
    let (Ok(lo32), Ok(hi32)) = (u32::try_from(lo), u32::try_from(hi)) else {
        return format!("{lo}-{hi}");
    };
    let size = u64::from(hi32 - lo32) + 1;
    if size.is_power_of_two() && lo % size == 0 {
        format!("{}/{}", Ipv4Addr::from(lo32), 32 - size.trailing_zeros())
    } else {
        format!("{}-{}", Ipv4Addr::from(lo32), Ipv4Addr::from(hi32))
    }
}

impl SetDef {
    fn from_json(body: &Value) -> Result<Self, String> {
        let kinds = kinds_of(body.get("type").ok_or("no type")?);
        let data = match body.get("map") {
            None => None,
            Some(Value::String(s)) if s == "verdict" => Some(Ok(DataKinds::Verdict)),
            Some(other) => Some(kinds_of(other).map(DataKinds::Values)),
        };
        let (kinds, data) = match (kinds, data.transpose()) {
            (Ok(k), Ok(d)) => (k, d),
            (Err(e), _) | (_, Err(e)) => {
                return Ok(Self {
                    kinds: Err(e),
                    data: None,
                    elems: Vec::new(),
                    exact: None,
                });
            }
        };
        let mut elems = Vec::new();
        for raw in body
            .get("elem")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice)
        {
            elems.push(elem(raw, &kinds, data.as_ref())?);
        }
        let mut exact = Some(HashMap::with_capacity(elems.len()));
        for (i, e) in elems.iter().enumerate() {
            let key: Option<Vec<u64>> = e
                .key
                .iter()
                .map(|&(lo, hi)| (lo == hi).then_some(lo))
                .collect();
            match (key, exact.as_mut()) {
                (Some(key), Some(index)) => {
                    index.entry(key).or_insert(i);
                }
                _ => exact = None,
            }
        }
        Ok(Self {
            kinds: Ok(kinds),
            data,
            elems,
            exact,
        })
    }

    fn verdict_map(&self) -> bool {
        matches!(self.data, Some(DataKinds::Verdict))
    }
}

/// The kinds of a `type` or `map` field: `"ipv4_addr"`, `["ipv4_addr", "inet_proto"]` or
/// `"ipv4_addr . inet_service"`.
fn kinds_of(value: &Value) -> Result<Vec<Kind>, String> {
    let names: Vec<&str> = match value {
        Value::String(s) => s.split(" . ").collect(),
        Value::Array(list) => list.iter().filter_map(Value::as_str).collect(),
        _ => return Err(format!("type {}", text(value))),
    };
    names
        .iter()
        .map(|n| Kind::of_type(n).ok_or_else(|| format!("type {n:?} is not modelled")))
        .collect()
}

/// A set element as listed: its key, or `[key, data]` in a map.
fn elem(raw: &Value, kinds: &[Kind], data: Option<&DataKinds>) -> Result<Elem, String> {
    let (key, value) = match (data, raw) {
        (None, key) => (key, None),
        (Some(_), Value::Array(pair)) if pair.len() == 2 => (&pair[0], Some(&pair[1])),
        (Some(_), other) => return Err(format!("map element {}", text(other))),
    };
    let key = key_spans(key, kinds)?;
    let data = match (data, value) {
        (Some(DataKinds::Verdict), Some(v)) => Some(ElemData::Verdict(verdict(v)?)),
        (Some(DataKinds::Values(data_kinds)), Some(v)) => {
            let spans = key_spans(v, data_kinds)?;
            let values = spans
                .iter()
                .map(|&(lo, hi)| (lo == hi).then_some(lo))
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| format!("map data {} is a range", text(v)))?;
            Some(ElemData::Values(values))
        }
        _ => None,
    };
    Ok(Elem { key, data })
}

/// A key as listed, `{"elem": {"val": ...}}` (with a timeout) or not, one span per kind.
fn key_spans(raw: &Value, kinds: &[Kind]) -> Result<Vec<Span>, String> {
    let raw = raw.get("elem").and_then(|e| e.get("val")).unwrap_or(raw);
    if let [kind] = kinds {
        return Ok(vec![component(*kind, raw)?]);
    }
    let parts = raw
        .get("concat")
        .and_then(Value::as_array)
        .filter(|p| p.len() == kinds.len())
        .ok_or_else(|| format!("{} is not a key of {} parts", text(raw), kinds.len()))?;
    parts
        .iter()
        .zip(kinds)
        .map(|(p, k)| component(*k, p))
        .collect()
}

/// One component of a key or literal: a value, a prefix or a range.
fn component(kind: Kind, raw: &Value) -> Result<Span, String> {
    if let Some(prefix) = raw.get("prefix") {
        let addr = prefix.get("addr").and_then(Value::as_str);
        let len = prefix.get("len").and_then(Value::as_u64);
        let (Some(addr), Some(len), Kind::Addr) = (addr, len, kind) else {
            return Err(format!("prefix {}", text(raw)));
        };
        let addr: Ipv4Addr = addr.parse().map_err(|_| format!("address {addr:?}"))?;
        if len > 32 {
            return Err(format!("prefix length {len}"));
        }
        let mask = u32::MAX.checked_shl(32 - len as u32).unwrap_or(0);
        let lo = u32::from(addr) & mask;
        return Ok((u64::from(lo), u64::from(lo | !mask)));
    }
    if let Some(range) = raw.get("range").and_then(Value::as_array) {
        if let [lo, hi] = range.as_slice() {
            return Ok((scalar(kind, lo)?, scalar(kind, hi)?));
        }
        return Err(format!("range {}", text(raw)));
    }
    let value = scalar(kind, raw)?;
    Ok((value, value))
}

fn scalar(kind: Kind, raw: &Value) -> Result<u64, String> {
    let named = |table: &[(&str, u64)], name: &str| {
        table
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
            .ok_or_else(|| format!("{name:?} is not a {kind:?} this reader knows"))
    };
    match (kind, raw) {
        (_, Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| format!("{n} is not an unsigned number")),
        (Kind::Addr, Value::String(s)) => s
            .parse::<Ipv4Addr>()
            .map(|a| u64::from(u32::from(a)))
            .map_err(|_| format!("{s:?} is not an IPv4 address")),
        (Kind::Proto, Value::String(s)) => named(
            &[
                ("tcp", 6),
                ("udp", 17),
                ("sctp", 132),
                ("icmp", 1),
                ("udplite", 136),
            ],
            s,
        ),
        (Kind::FibType, Value::String(s)) => named(
            &[
                ("unspec", 0),
                ("unicast", 1),
                ("local", 2),
                ("broadcast", 3),
                ("anycast", 4),
                ("multicast", 5),
                ("blackhole", 6),
                ("unreachable", 7),
                ("prohibit", 8),
            ],
            s,
        ),
        (Kind::CtState, Value::String(s)) => named(CT_STATES, s),
        (Kind::CtStatus, Value::String(s)) => named(CT_STATUSES, s),
        (Kind::CtState | Kind::CtStatus, Value::Array(list)) => list
            .iter()
            .map(|v| scalar(kind, v))
            .try_fold(0, |acc, bit| bit.map(|b| acc | b)),
        (_, Value::String(s)) => s
            .parse()
            .map_err(|_| format!("{s:?} is not a {kind:?} this reader knows")),
        _ => Err(format!("{} is not a {kind:?}", text(raw))),
    }
}

const CT_STATES: &[(&str, u64)] = &[
    ("invalid", 1),
    ("established", 2),
    ("related", 4),
    ("new", 8),
    ("untracked", 64),
];

const CT_STATUSES: &[(&str, u64)] = &[
    ("expected", 1),
    ("seen-reply", 2),
    ("assured", 4),
    ("confirmed", 8),
    ("snat", 16),
    ("dnat", 32),
    ("dying", 512),
];

const CT_STATE_NEW: u64 = 8;
const CT_STATUS_DNAT: u64 = 32;
const FIB_UNICAST: u64 = 1;
const FIB_LOCAL: u64 = 2;
const LOOPBACK: Span = (0x7f00_0000, 0x7fff_ffff);

fn verdict(raw: &Value) -> Result<NftVerdict, String> {
    let (what, body) = only_key(raw).ok_or_else(|| format!("verdict {}", text(raw)))?;
    let target = || {
        body.get("target")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("{what} without a target"))
    };
    Ok(match what {
        "accept" => NftVerdict::Accept,
        "drop" => NftVerdict::Drop,
        "continue" => NftVerdict::Continue,
        "return" => NftVerdict::Return,
        "jump" => NftVerdict::Jump(target()?),
        "goto" => NftVerdict::Goto(target()?),
        _ => return Err(format!("verdict {}", text(raw))),
    })
}

// ---- the model packets and how they fare ---------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Pod,
    OffCluster,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dest {
    Addr(Ipv4Addr),
    NodeAddress,
}

#[derive(Debug, Clone)]
struct Packet {
    source: Source,
    dest: Dest,
    proto: u8,
    dport: u16,
    mark: u32,
    dnat: Option<SocketAddrV4>,
    snat: bool,
}

/// A value of the packet or of the table: a number, or one of the packet's addresses
/// the rules can only place by prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sym {
    Int(u64),
    Pod,
    OffCluster,
    NodeAddress,
}

#[derive(Debug, Clone, Copy)]
struct Typed {
    sym: Sym,
    kind: Kind,
}

fn int(value: u64, kind: Kind) -> Typed {
    Typed {
        sym: Sym::Int(value),
        kind,
    }
}

/// How a base chain ended for a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Accept,
    Drop,
    Reject,
}

/// What became of a packet after a hook, or after its whole path.
#[derive(Debug, Clone)]
enum Fate {
    Pass(Packet),
    Drop,
    Reject,
}

/// What one statement did.
enum Stmt {
    /// On to the next statement.
    Next,
    /// The rule does not match (a failed match, a lookup that found nothing).
    Break,
    Verdict(NftVerdict),
    End(End),
}

/// What one rule did.
enum Step {
    Next,
    Verdict(NftVerdict),
    End(End),
}

/// The random picks of one evaluation of a rule: those fixed, and those made.
struct Picks {
    fixed: Vec<u64>,
    made: Vec<(u64, u64, u64)>,
}

impl Picks {
    fn next(&mut self, modulus: u64, offset: u64) -> u64 {
        let value = self.fixed.get(self.made.len()).copied().unwrap_or(offset);
        self.made.push((value, modulus, offset));
        value
    }
}

/// Where a chain walk stands.
#[derive(Clone)]
struct Cursor<'t> {
    chain: &'t str,
    position: usize,
    stack: Vec<(&'t str, usize)>,
    base: &'t BaseHook,
    jumps: usize,
}

impl Cursor<'_> {
    /// Back to the rule after the last jump; the end of the base chain when there was
    /// none.
    fn ret(&mut self) -> Option<End> {
        match self.stack.pop() {
            Some((chain, position)) => {
                self.chain = chain;
                self.position = position;
                None
            }
            None if self.base.policy_drop => Some(End::Drop),
            None => Some(End::Accept),
        }
    }
}

impl Packet {
    fn new(source: Source, dest: Dest, proto: Proto, dport: u16) -> Self {
        Self {
            source,
            dest,
            proto: proto.number(),
            dport,
            mark: 0,
            dnat: None,
            snat: false,
        }
    }
}

fn proto_name(proto: Proto) -> &'static str {
    match proto {
        Proto::Tcp => "tcp",
        Proto::Udp => "udp",
        Proto::Sctp => "sctp",
    }
}

/// `update @map { ... }` or `add @set { ... }`, as nft prints a set statement it has no
/// JSON for.
fn set_update_text(text: &str) -> bool {
    (text.starts_with("update @") || text.starts_with("add @"))
        && text.ends_with('}')
        && text.contains(" { ")
}

impl Table {
    fn view(&self) -> Result<TableView, NftModelError> {
        let mut view = TableView::default();
        let mut names: Vec<&String> = self.sets.keys().collect();
        names.sort();
        for name in names {
            let set = &self.sets[name];
            let Ok(kinds) = &set.kinds else { continue };
            if !set.verdict_map() {
                continue;
            }
            for elem in &set.elems {
                let key = |i: usize| {
                    let (lo, hi) = elem.key[i];
                    if lo == hi {
                        Ok(lo)
                    } else {
                        Err(object_error(
                            format!("map {name}"),
                            "an interval key is not modelled",
                        ))
                    }
                };
                let proto = |value: u64| {
                    Proto::from_number(value).ok_or_else(|| {
                        object_error(format!("map {name}"), format!("protocol {value}"))
                    })
                };
                let port = |value: u64| {
                    u16::try_from(value)
                        .map_err(|_| object_error(format!("map {name}"), format!("port {value}")))
                };
                match kinds.as_slice() {
                    [Kind::Addr, Kind::Proto, Kind::Port] => {
                        let addr = u32::try_from(key(0)?).map(Ipv4Addr::from).map_err(|_| {
                            object_error(format!("map {name}"), "an address past 32 bits")
                        })?;
                        let (proto, port) = (proto(key(1)?)?, port(key(2)?)?);
                        if view.services.contains_key(&(addr, proto, port)) {
                            continue;
                        }
                        let packet = Packet::new(Source::Pod, Dest::Addr(addr), proto, port);
                        let what = format!("{addr} {} {port}", proto_name(proto));
                        if let Some(v) = self.verdict_for(packet, &what)? {
                            view.services.insert((addr, proto, port), v);
                        }
                    }
                    [Kind::Proto, Kind::Port] => {
                        let (proto, port) = (proto(key(0)?)?, port(key(1)?)?);
                        if view.node_ports.contains_key(&(proto, port)) {
                            continue;
                        }
                        let packet =
                            Packet::new(Source::OffCluster, Dest::NodeAddress, proto, port);
                        let what = format!("node port {} {port}", proto_name(proto));
                        if let Some(v) = self.verdict_for(packet, &what)? {
                            view.node_ports.insert((proto, port), v);
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(view)
    }

    /// What every new connection like `packet` gets, if they all get the same kind of
    /// thing; `None` when they all pass untranslated (the table does not proxy them).
    fn verdict_for(&self, packet: Packet, what: &str) -> Result<Option<Verdict>, NftModelError> {
        let fates = self.path(packet)?;
        let mut targets = BTreeSet::new();
        let (mut dropped, mut rejected, mut untranslated) = (false, false, false);
        for fate in &fates {
            match fate {
                Fate::Drop => dropped = true,
                Fate::Reject => rejected = true,
                Fate::Pass(p) => match p.dnat {
                    Some(target) => {
                        targets.insert(target);
                    }
                    None => untranslated = true,
                },
            }
        }
        match (!targets.is_empty(), dropped, rejected, untranslated) {
            (true, false, false, false) => Ok(Some(Verdict::Endpoints(targets))),
            (false, true, false, false) => Ok(Some(Verdict::Drop)),
            (false, false, true, false) => Ok(Some(Verdict::Reject)),
            (false, false, false, _) => Ok(None),
            _ => {
                let mut seen: Vec<String> =
                    targets.iter().map(|t| format!("DNAT to {t}")).collect();
                seen.extend(dropped.then(|| "drop".to_owned()));
                seen.extend(rejected.then(|| "reject".to_owned()));
                seen.extend(untranslated.then(|| "passed untranslated".to_owned()));
                Err(NftModelError::Ambiguous {
                    destination: what.to_owned(),
                    reason: format!(
                        "new connections meet different fates by random pick: {}",
                        seen.join(", ")
                    ),
                })
            }
        }
    }

    /// The fates of `packet` along its path through the node.
    fn path(&self, packet: Packet) -> Result<Vec<Fate>, NftModelError> {
        let mut out = Vec::new();
        for fate in self.hook("prerouting", packet)? {
            let Fate::Pass(p) = fate else {
                out.push(fate);
                continue;
            };
            if p.dest == Dest::NodeAddress {
                out.extend(self.hook("input", p)?);
                continue;
            }
            for fate in self.hook("forward", p)? {
                match fate {
                    Fate::Pass(p) => out.extend(self.hook("postrouting", p)?),
                    other => out.push(other),
                }
            }
        }
        Ok(out)
    }

    /// Runs the table's base chains of `hook`, lowest priority first.
    fn hook(&self, hook: &str, packet: Packet) -> Result<Vec<Fate>, NftModelError> {
        let mut bases: Vec<(&str, &BaseHook)> = self
            .chains
            .iter()
            .filter_map(|(n, c)| c.base.as_ref().map(|b| (n.as_str(), b)))
            .filter(|(_, b)| b.hook == hook && matches!(b.chain_type.as_str(), "filter" | "nat"))
            .collect();
        bases.sort_by_key(|(n, b)| (b.priority, *n));
        let mut live = vec![packet];
        let mut out = Vec::new();
        for (name, base) in bases {
            let mut next = Vec::new();
            for p in live {
                // NAT is set up once per hook: later nat chains do not see the packet.
                let natted = if hook == "prerouting" {
                    p.dnat.is_some()
                } else {
                    p.snat
                };
                if base.chain_type == "nat" && natted {
                    next.push(p);
                    continue;
                }
                let cursor = Cursor {
                    chain: name,
                    position: 0,
                    stack: Vec::new(),
                    base,
                    jumps: 0,
                };
                let mut ends = Vec::new();
                self.walk(cursor, p, &mut ends)?;
                for (p, end) in ends {
                    match end {
                        End::Accept => next.push(p),
                        End::Drop => out.push(Fate::Drop),
                        End::Reject => out.push(Fate::Reject),
                    }
                }
            }
            live = next;
        }
        out.extend(live.into_iter().map(Fate::Pass));
        Ok(out)
    }

    /// Walks from `cursor` to the end of its base chain, forking at every random pick.
    fn walk<'t>(
        &'t self,
        mut cursor: Cursor<'t>,
        mut packet: Packet,
        out: &mut Vec<(Packet, End)>,
    ) -> Result<(), NftModelError> {
        loop {
            let Some(rule) = self.chains[cursor.chain].rules.get(cursor.position) else {
                // The end of a chain: back to where it was jumped to from.
                if let Some(end) = cursor.ret() {
                    out.push((packet, end));
                    return Ok(());
                }
                continue;
            };
            let mut branches = self.rule_branches(&cursor, rule, &packet)?;
            let Some((last, step)) = branches.pop() else {
                return Ok(());
            };
            for (p, step) in branches {
                let mut fork = cursor.clone();
                match self.advance(&mut fork, rule, step)? {
                    Some(end) => out.push((p, end)),
                    None => self.walk(fork, p, out)?,
                }
            }
            packet = last;
            if let Some(end) = self.advance(&mut cursor, rule, step)? {
                out.push((packet, end));
                return Ok(());
            }
        }
    }

    /// Moves `cursor` past `rule` as `step` says; the end of the base chain, if that is
    /// where it leads.
    fn advance<'t>(
        &'t self,
        cursor: &mut Cursor<'t>,
        rule: &RuleDef,
        step: Step,
    ) -> Result<Option<End>, NftModelError> {
        let target = |name: &str| {
            self.chains
                .get_key_value(name)
                .map(|(k, _)| k.as_str())
                .ok_or_else(|| NftModelError::Rule {
                    chain: cursor.chain.to_owned(),
                    position: cursor.position + 1,
                    handle: rule.handle.clone(),
                    statement: text(&Value::Array(rule.exprs.clone())),
                    reason: format!("leads to chain {name:?}, which the table does not have"),
                })
        };
        if matches!(
            step,
            Step::Verdict(NftVerdict::Jump(_) | NftVerdict::Goto(_))
        ) {
            cursor.jumps += 1;
            if cursor.jumps > MAX_JUMPS {
                return Err(NftModelError::Rule {
                    chain: cursor.chain.to_owned(),
                    position: cursor.position + 1,
                    handle: rule.handle.clone(),
                    statement: text(&Value::Array(rule.exprs.clone())),
                    reason: format!("the packet has jumped {MAX_JUMPS} times: a loop"),
                });
            }
        }
        match step {
            Step::Next | Step::Verdict(NftVerdict::Continue) => cursor.position += 1,
            Step::Verdict(NftVerdict::Accept) => return Ok(Some(End::Accept)),
            Step::Verdict(NftVerdict::Drop) => return Ok(Some(End::Drop)),
            Step::End(end) => return Ok(Some(end)),
            Step::Verdict(NftVerdict::Return) => return Ok(cursor.ret()),
            Step::Verdict(NftVerdict::Jump(name)) => {
                let chain = target(&name)?;
                cursor.stack.push((cursor.chain, cursor.position + 1));
                cursor.chain = chain;
                cursor.position = 0;
            }
            Step::Verdict(NftVerdict::Goto(name)) => {
                cursor.chain = target(&name)?;
                cursor.position = 0;
            }
        }
        Ok(None)
    }

    /// What `rule` does to `packet`, once for every combination of the values its random
    /// picks can take.
    fn rule_branches(
        &self,
        cursor: &Cursor<'_>,
        rule: &RuleDef,
        packet: &Packet,
    ) -> Result<Vec<(Packet, Step)>, NftModelError> {
        let mut out = Vec::new();
        let mut todo = vec![Vec::new()];
        while let Some(fixed) = todo.pop() {
            let mut picks = Picks {
                fixed,
                made: Vec::new(),
            };
            let mut p = packet.clone();
            let step = self.rule(cursor, rule, &mut p, &mut picks)?;
            // Every pick made past the fixed ones took its first value: queue the others.
            for k in picks.fixed.len()..picks.made.len() {
                let (_, modulus, offset) = picks.made[k];
                let prefix: Vec<u64> = picks.made[..k].iter().map(|m| m.0).collect();
                for value in offset + 1..offset + modulus {
                    let mut fixed = prefix.clone();
                    fixed.push(value);
                    todo.push(fixed);
                }
            }
            out.push((p, step));
            if out.len() + todo.len() > MAX_PICKS {
                return Err(self.rule_error(
                    cursor,
                    rule,
                    &Value::Array(rule.exprs.clone()),
                    format!("more than {MAX_PICKS} combinations of random picks"),
                ));
            }
        }
        Ok(out)
    }

    fn rule_error(
        &self,
        cursor: &Cursor<'_>,
        rule: &RuleDef,
        statement: &Value,
        reason: String,
    ) -> NftModelError {
        NftModelError::Rule {
            chain: cursor.chain.to_owned(),
            position: cursor.position + 1,
            handle: rule.handle.clone(),
            statement: text(statement),
            reason,
        }
    }

    /// Runs one rule's statements, in order, on `packet`.
    fn rule(
        &self,
        cursor: &Cursor<'_>,
        rule: &RuleDef,
        packet: &mut Packet,
        picks: &mut Picks,
    ) -> Result<Step, NftModelError> {
        for stmt in &rule.exprs {
            let done = self
                .statement(stmt, packet, picks, cursor.base)
                .map_err(|reason| self.rule_error(cursor, rule, stmt, reason))?;
            match done {
                Stmt::Next => {}
                Stmt::Break => return Ok(Step::Next),
                Stmt::Verdict(v) => return Ok(Step::Verdict(v)),
                Stmt::End(end) => return Ok(Step::End(end)),
            }
        }
        Ok(Step::Next)
    }

    fn statement(
        &self,
        stmt: &Value,
        packet: &mut Packet,
        picks: &mut Picks,
        base: &BaseHook,
    ) -> Result<Stmt, String> {
        if let Value::String(s) = stmt {
            // nft 1.0.6 prints `update @map { ip saddr : ... }` (the affinity record) as
            // text: it has no JSON form for the map statement.
            return if set_update_text(s) {
                Ok(Stmt::Next)
            } else {
                Err("a statement nft printed as text only".to_owned())
            };
        }
        let (what, body) = only_key(stmt).ok_or("not a one-key object")?;
        match what {
            "match" => self.match_statement(body, packet, picks),
            "vmap" => {
                let key = body.get("key").ok_or("vmap without a key")?;
                let data = body.get("data").ok_or("vmap without data")?;
                let Some(values) = self.expr(key, packet, picks)? else {
                    return Ok(Stmt::Break);
                };
                Ok(match self.lookup(&values, data, true)? {
                    Some(ElemData::Verdict(v)) => Stmt::Verdict(v),
                    _ => Stmt::Break,
                })
            }
            "accept" | "drop" | "continue" | "return" | "jump" | "goto" => {
                Ok(Stmt::Verdict(verdict(stmt)?))
            }
            "reject" => Ok(Stmt::End(End::Reject)),
            "dnat" => self.dnat(body, packet, picks, base),
            "masquerade" | "snat" => {
                if base.chain_type != "nat" {
                    return Err(format!("{what} outside a nat chain"));
                }
                // The source translation changes nothing this reader reports.
                packet.snat = true;
                Ok(Stmt::End(End::Accept))
            }
            "mangle" => {
                let key = body.get("key").ok_or("mangle without a key")?;
                let meta_key = key.get("meta").and_then(|m| m.get("key"));
                if meta_key.and_then(Value::as_str) != Some("mark") {
                    return Err("only `meta mark set` is modelled".to_owned());
                }
                let value = body.get("value").ok_or("mangle without a value")?;
                let Some(values) = self.expr_or_literal(value, Kind::Mark, packet, picks)? else {
                    return Ok(Stmt::Break);
                };
                match values.as_slice() {
                    [
                        Typed {
                            sym: Sym::Int(mark),
                            ..
                        },
                    ] => {
                        packet.mark = u32::try_from(*mark).map_err(|_| "a mark past 32 bits")?;
                        Ok(Stmt::Next)
                    }
                    _ => Err("a mark that is not a number".to_owned()),
                }
            }
            "counter" | "log" => Ok(Stmt::Next),
            "map" | "set"
                if matches!(
                    body.get("op").and_then(Value::as_str),
                    Some("add" | "update")
                ) =>
            {
                Ok(Stmt::Next)
            }
            _ => Err(format!("statement {what:?} is not modelled")),
        }
    }

    fn match_statement(
        &self,
        body: &Value,
        packet: &Packet,
        picks: &mut Picks,
    ) -> Result<Stmt, String> {
        let left = body.get("left").ok_or("match without a left side")?;
        let right = body.get("right").ok_or("match without a right side")?;
        let op = body.get("op").and_then(Value::as_str).unwrap_or("==");
        let Some(values) = self.expr(left, packet, picks)? else {
            return Ok(Stmt::Break);
        };
        let flags = matches!(
            values.as_slice(),
            [Typed {
                kind: Kind::CtState | Kind::CtStatus,
                ..
            }]
        );
        let hit = match (op, values.as_slice()) {
            (
                "in",
                [
                    Typed {
                        sym: Sym::Int(v),
                        kind,
                    },
                ],
            ) if flags => {
                let (bits, _) = component(*kind, right)?;
                v & bits != 0
            }
            ("==" | "in", _) => self.matches(&values, right)?,
            ("!=", _) => !self.matches(&values, right)?,
            _ => return Err(format!("operator {op:?} is not modelled")),
        };
        Ok(if hit { Stmt::Next } else { Stmt::Break })
    }

    fn dnat(
        &self,
        body: &Value,
        packet: &mut Packet,
        picks: &mut Picks,
        base: &BaseHook,
    ) -> Result<Stmt, String> {
        if base.chain_type != "nat" || base.hook != "prerouting" {
            return Err("dnat outside a nat prerouting chain".to_owned());
        }
        let object = body.as_object().ok_or("dnat without arguments")?;
        if let Some(key) = object.keys().find(|k| {
            !matches!(
                k.as_str(),
                "family" | "addr" | "port" | "flags" | "type_flags"
            )
        }) {
            return Err(format!("dnat argument {key:?} is not modelled"));
        }
        if object
            .get("family")
            .is_some_and(|f| f.as_str() != Some("ip"))
        {
            return Err("dnat of another family".to_owned());
        }
        let addr = object.get("addr").ok_or("dnat without an address")?;
        let Some(values) = self.expr_or_literal(addr, Kind::Addr, packet, picks)? else {
            return Ok(Stmt::Break);
        };
        let port = match object.get("port") {
            None => None,
            Some(port) => {
                let Some(values) = self.expr_or_literal(port, Kind::Port, packet, picks)? else {
                    return Ok(Stmt::Break);
                };
                match values.as_slice() {
                    [
                        Typed {
                            sym: Sym::Int(p), ..
                        },
                    ] => Some(*p),
                    _ => return Err("a port that is not a number".to_owned()),
                }
            }
        };
        let (addr, port) = match (values.as_slice(), port) {
            (
                [
                    Typed {
                        sym: Sym::Int(a), ..
                    },
                ],
                port,
            ) => (*a, port.unwrap_or(u64::from(packet.dport))),
            (
                [
                    Typed {
                        sym: Sym::Int(a), ..
                    },
                    Typed {
                        sym: Sym::Int(p), ..
                    },
                ],
                None,
            ) => (*a, *p),
            _ => return Err("a DNAT target that is not an address and a port".to_owned()),
        };
        let addr = Ipv4Addr::from(u32::try_from(addr).map_err(|_| "an address past 32 bits")?);
        let port = u16::try_from(port).map_err(|_| "a port past 16 bits")?;
        let target = SocketAddrV4::new(addr, port);
        packet.dest = Dest::Addr(addr);
        packet.dport = port;
        packet.dnat = Some(target);
        Ok(Stmt::End(End::Accept))
    }

    /// A literal (`"10.244.1.10"`, `8080`) or an expression.
    fn expr_or_literal(
        &self,
        value: &Value,
        kind: Kind,
        packet: &Packet,
        picks: &mut Picks,
    ) -> Result<Option<Vec<Typed>>, String> {
        if value.is_string() || value.is_number() {
            return Ok(Some(vec![int(scalar(kind, value)?, kind)]));
        }
        self.expr(value, packet, picks)
    }

    /// The value of an expression for `packet`; `None` when evaluating it ends the rule
    /// (a protocol header the packet does not have, a map without the key).
    fn expr(
        &self,
        e: &Value,
        packet: &Packet,
        picks: &mut Picks,
    ) -> Result<Option<Vec<Typed>>, String> {
        let (what, body) = only_key(e).ok_or_else(|| format!("expression {}", text(e)))?;
        let field = |name: &str| body.get(name).and_then(Value::as_str).unwrap_or("");
        let one = |sym: Sym, kind: Kind| Ok(Some(vec![Typed { sym, kind }]));
        match what {
            "payload" => match (field("protocol"), field("field")) {
                ("ip", "saddr") => one(
                    match packet.source {
                        Source::Pod => Sym::Pod,
                        Source::OffCluster => Sym::OffCluster,
                    },
                    Kind::Addr,
                ),
                ("ip", "daddr") => one(
                    match packet.dest {
                        Dest::Addr(a) => Sym::Int(u64::from(u32::from(a))),
                        Dest::NodeAddress => Sym::NodeAddress,
                    },
                    Kind::Addr,
                ),
                ("th", "dport") => one(Sym::Int(u64::from(packet.dport)), Kind::Port),
                (proto @ ("tcp" | "udp" | "sctp"), "dport") => {
                    // `tcp dport` carries its protocol match: a UDP packet ends the rule.
                    let number = scalar(Kind::Proto, &Value::String(proto.to_owned()))?;
                    if number == u64::from(packet.proto) {
                        one(Sym::Int(u64::from(packet.dport)), Kind::Port)
                    } else {
                        Ok(None)
                    }
                }
                _ => Err(format!("payload {} is not modelled", text(body))),
            },
            "meta" => match field("key") {
                "l4proto" => one(Sym::Int(u64::from(packet.proto)), Kind::Proto),
                "mark" => one(Sym::Int(u64::from(packet.mark)), Kind::Mark),
                other => Err(format!("meta {other:?} is not modelled")),
            },
            "ct" if body.get("dir").is_none() => match field("key") {
                "state" => one(Sym::Int(CT_STATE_NEW), Kind::CtState),
                "status" => one(
                    Sym::Int(if packet.dnat.is_some() {
                        CT_STATUS_DNAT
                    } else {
                        0
                    }),
                    Kind::CtStatus,
                ),
                other => Err(format!("ct {other:?} is not modelled")),
            },
            "fib" => {
                let flags: Vec<&str> = match body.get("flags") {
                    Some(Value::String(s)) => vec![s.as_str()],
                    Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
                    _ => Vec::new(),
                };
                if field("result") != "type" {
                    return Err("only `fib ... type` is modelled".to_owned());
                }
                let local = match flags.as_slice() {
                    ["daddr"] => packet.dest == Dest::NodeAddress,
                    // Neither model source is one of the node's addresses.
                    ["saddr"] => false,
                    _ => return Err(format!("fib flags {flags:?} are not modelled")),
                };
                one(
                    Sym::Int(if local { FIB_LOCAL } else { FIB_UNICAST }),
                    Kind::FibType,
                )
            }
            "numgen" => {
                let modulus = body.get("mod").and_then(Value::as_u64).unwrap_or(0);
                let offset = body.get("offset").and_then(Value::as_u64).unwrap_or(0);
                if modulus == 0 || !matches!(field("mode"), "random" | "inc") {
                    return Err(format!("numgen {} is not modelled", text(body)));
                }
                one(Sym::Int(picks.next(modulus, offset)), Kind::Int)
            }
            "concat" => {
                let mut out = Vec::new();
                for part in body.as_array().ok_or("concat of no list")? {
                    let Some(values) = self.expr(part, packet, picks)? else {
                        return Ok(None);
                    };
                    out.extend(values);
                }
                Ok(Some(out))
            }
            "map" => {
                let key = body.get("key").ok_or("map without a key")?;
                let data = body.get("data").ok_or("map without data")?;
                let Some(values) = self.expr(key, packet, picks)? else {
                    return Ok(None);
                };
                let name = data.as_str().and_then(|d| d.strip_prefix('@'));
                let kinds = match name
                    .and_then(|n| self.sets.get(n))
                    .and_then(|s| s.data.as_ref())
                {
                    Some(DataKinds::Values(kinds)) => kinds.clone(),
                    _ => return Err(format!("{} is not a map of values", text(data))),
                };
                Ok(match self.lookup(&values, data, false)? {
                    Some(ElemData::Values(found)) => Some(
                        found
                            .iter()
                            .zip(kinds)
                            .map(|(v, kind)| int(*v, kind))
                            .collect(),
                    ),
                    _ => None,
                })
            }
            "&" | "|" | "^" => {
                let [a, b] = body.as_array().map(Vec::as_slice).unwrap_or_default() else {
                    return Err(format!("{what} of other than two operands"));
                };
                let Some(a) = self.expr_or_literal(a, Kind::Int, packet, picks)? else {
                    return Ok(None);
                };
                let Some(b) = self.expr_or_literal(b, Kind::Int, packet, picks)? else {
                    return Ok(None);
                };
                match (a.as_slice(), b.as_slice()) {
                    (
                        [
                            Typed {
                                sym: Sym::Int(a),
                                kind,
                            },
                        ],
                        [
                            Typed {
                                sym: Sym::Int(b), ..
                            },
                        ],
                    ) => one(
                        Sym::Int(match what {
                            "&" => a & b,
                            "|" => a | b,
                            _ => a ^ b,
                        }),
                        *kind,
                    ),
                    _ => Err(format!("{what} of other than numbers")),
                }
            }
            _ => Err(format!("expression {what:?} is not modelled")),
        }
    }

    /// Whether `values` are in what `right` names: a set (`@name`), an anonymous set, or
    /// one literal key.
    fn matches(&self, values: &[Typed], right: &Value) -> Result<bool, String> {
        let kinds: Vec<Kind> = values.iter().map(|t| t.kind).collect();
        if let Some(name) = right.as_str().and_then(|r| r.strip_prefix('@')) {
            let set = self.set(name, values.len())?;
            return Ok(self.find(set, values)?.is_some());
        }
        if let Some(list) = right.get("set").and_then(Value::as_array) {
            for raw in list {
                if self.member(values, &key_spans(raw, &kinds)?)? {
                    return Ok(true);
                }
            }
            return Ok(false);
        }
        self.member(values, &key_spans(right, &kinds)?)
    }

    /// The data of the first element of a map (`@name`, or an anonymous one) whose key
    /// holds `values`.
    fn lookup(
        &self,
        values: &[Typed],
        data: &Value,
        verdicts: bool,
    ) -> Result<Option<ElemData>, String> {
        if let Some(name) = data.as_str().and_then(|d| d.strip_prefix('@')) {
            let set = self.set(name, values.len())?;
            if set.verdict_map() != verdicts {
                return Err(format!(
                    "{name} is not a {} map",
                    if verdicts { "verdict" } else { "value" }
                ));
            }
            return Ok(self.find(set, values)?.and_then(|e| e.data.clone()));
        }
        let list = data
            .get("set")
            .and_then(Value::as_array)
            .filter(|_| verdicts)
            .ok_or_else(|| format!("map data {}", text(data)))?;
        let kinds: Vec<Kind> = values.iter().map(|t| t.kind).collect();
        for raw in list {
            let elem = elem(raw, &kinds, Some(&DataKinds::Verdict))?;
            if self.member(values, &elem.key)? {
                return Ok(elem.data);
            }
        }
        Ok(None)
    }

    fn set(&self, name: &str, arity: usize) -> Result<&SetDef, String> {
        let set = self
            .sets
            .get(name)
            .ok_or_else(|| format!("set {name:?} is not in the table"))?;
        let kinds = set
            .kinds
            .as_ref()
            .map_err(|e| format!("set {name:?}: {e}"))?;
        if kinds.len() != arity {
            return Err(format!(
                "set {name:?} has keys of {} parts, looked up with {arity}",
                kinds.len()
            ));
        }
        Ok(set)
    }

    /// The first element of `set` whose key holds `values`.
    fn find<'s>(&self, set: &'s SetDef, values: &[Typed]) -> Result<Option<&'s Elem>, String> {
        let ints: Option<Vec<u64>> = values
            .iter()
            .map(|t| match t.sym {
                Sym::Int(v) => Some(v),
                _ => None,
            })
            .collect();
        if let (Some(index), Some(ints)) = (&set.exact, ints) {
            return Ok(index.get(&ints).and_then(|&i| set.elems.get(i)));
        }
        for elem in &set.elems {
            if self.member(values, &elem.key)? {
                return Ok(Some(elem));
            }
        }
        Ok(None)
    }

    /// Whether every value lies in its span of `key`.
    fn member(&self, values: &[Typed], key: &[Span]) -> Result<bool, String> {
        if values.len() != key.len() {
            return Err(format!(
                "a key of {} parts against one of {}",
                values.len(),
                key.len()
            ));
        }
        for (value, span) in values.iter().zip(key) {
            if !self.within(value.sym, *span)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether `sym` lies in `span`, as far as the model packet says.
    fn within(&self, sym: Sym, (lo, hi): Span) -> Result<bool, String> {
        let inside = |outer: Span| outer.0 <= lo && hi <= outer.1;
        let covers = |inner: Span| lo <= inner.0 && inner.1 <= hi;
        let apart = |other: Span| hi < other.0 || other.1 < lo;
        let unsure = |who: &str| {
            Err(format!(
                "whether {who} is inside {} depends on which address it is",
                show_span((lo, hi))
            ))
        };
        match sym {
            Sym::Int(v) => Ok(lo <= v && v <= hi),
            // One address a set or rule names is never the model packet's.
            Sym::Pod | Sym::OffCluster | Sym::NodeAddress if lo == hi => Ok(false),
            Sym::Pod => {
                let pods = self.pod_range.clone()?;
                if covers(pods) {
                    Ok(true)
                } else if apart(pods) {
                    Ok(false)
                } else {
                    unsure("a pod source")
                }
            }
            Sym::OffCluster => match &self.pod_range {
                Ok(pods) if inside(*pods) => Ok(false),
                _ => unsure("an off-cluster source"),
            },
            Sym::NodeAddress => {
                if inside(LOOPBACK) {
                    Ok(false)
                } else {
                    unsure("the node address")
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::process::{Command, Output};

    use super::*;

    /// `nft -j list table ip proxyplan` of node-a's table for `examples/cluster.yaml`
    /// (`--cluster-cidr 10.244.0.0/16`), nft 1.0.6: one object a line.
    const FIXTURE: &str = include_str!("nft_model/fixture.json");

    fn service(ip: &str, proto: Proto, port: u16) -> (Ipv4Addr, Proto, u16) {
        (ip.parse().unwrap(), proto, port)
    }

    fn to(endpoints: &[&str]) -> Verdict {
        Verdict::Endpoints(endpoints.iter().map(|e| e.parse().unwrap()).collect())
    }

    fn fixture() -> Value {
        serde_json::from_str(FIXTURE).unwrap()
    }

    fn items(listing: &mut Value) -> &mut Vec<Value> {
        listing["nftables"].as_array_mut().unwrap()
    }

    /// The element list of map `name`.
    fn elements<'a>(listing: &'a mut Value, name: &str) -> &'a mut Vec<Value> {
        let map = items(listing)
            .iter_mut()
            .find(|i| i["map"]["name"] == name)
            .unwrap();
        let body = map["map"].as_object_mut().unwrap();
        body.entry("elem")
            .or_insert_with(|| Value::Array(Vec::new()))
            .as_array_mut()
            .unwrap()
    }

    /// The statements of rule `index` of `chain`.
    fn statements<'a>(listing: &'a mut Value, chain: &str, index: usize) -> &'a mut Vec<Value> {
        items(listing)
            .iter_mut()
            .filter(|i| i["rule"]["chain"] == chain)
            .nth(index)
            .unwrap()["rule"]["expr"]
            .as_array_mut()
            .unwrap()
    }

    /// node-a of `examples/cluster.yaml`: the plan's endpoints, written out by hand.
    fn example_view() -> TableView {
        let both = to(&["10.244.1.10:8080", "10.244.2.10:8080"]);
        TableView {
            services: BTreeMap::from([
                // web, web-nodeport: the shared lb-2-masq-nonlocal chain.
                (service("10.96.0.10", Proto::Tcp, 80), both.clone()),
                (service("10.96.0.11", Proto::Tcp, 80), both.clone()),
                // local-lb: its cluster IP, and its LB IP short-circuited for pods to
                // the cluster endpoints (the node has none of its own).
                (
                    service("10.96.0.12", Proto::Tcp, 80),
                    to(&["10.244.2.10:8080"]),
                ),
                (
                    service("203.0.113.10", Proto::Tcp, 80),
                    to(&["10.244.2.10:8080"]),
                ),
                // sticky: ClientIP affinity, a new client.
                (service("10.96.0.13", Proto::Tcp, 80), both.clone()),
                // empty: no endpoints.
                (service("10.96.0.14", Proto::Tcp, 80), Verdict::Reject),
            ]),
            node_ports: BTreeMap::from([
                ((Proto::Tcp, 30080), both),
                // local-lb, externalTrafficPolicy Local with no endpoint on node-a.
                ((Proto::Tcp, 30081), Verdict::Drop),
            ]),
        }
    }

    #[test]
    fn example_table_reads_as_its_plan() {
        assert_eq!(parse(FIXTURE).unwrap(), example_view());
    }

    #[test]
    fn a_udp_port_takes_the_udp_rule_and_unreachable_slots_are_never_read() {
        let mut listing = fixture();
        elements(&mut listing, "service-ips").push(serde_json::json!(
            [{"concat": ["10.96.0.10", "udp", 53]}, {"goto": {"target": "lb-2-masq-nonlocal"}}]
        ));
        let udp = elements(&mut listing, "backends-udp-2-masq-nonlocal");
        for (slot, ep) in [(0, "10.244.1.53"), (1, "10.244.2.53")] {
            udp.push(serde_json::json!(
                [{"concat": ["10.96.0.10", 53, slot]}, {"concat": [ep, 5353]}]
            ));
        }
        // Slot 2 of a Service balanced `mod 2`: left over, never picked.
        elements(&mut listing, "backends-tcp-2-masq-nonlocal").push(serde_json::json!(
            [{"concat": ["10.96.0.10", 80, 2]}, {"concat": ["10.9.9.9", 1]}]
        ));
        let view = parse(&listing.to_string()).unwrap();
        let mut expected = example_view();
        expected.services.insert(
            service("10.96.0.10", Proto::Udp, 53),
            to(&["10.244.1.53:5353", "10.244.2.53:5353"]),
        );
        assert_eq!(view, expected);
    }

    #[test]
    fn a_statement_the_reader_does_not_know_on_the_path_is_an_error_naming_its_rule() {
        let mut listing = fixture();
        statements(&mut listing, "lb-2-masq-nonlocal", 1)
            .insert(0, serde_json::json!({"notrack": null}));
        let err = parse(&listing.to_string()).unwrap_err();
        let NftModelError::Rule {
            chain, position, ..
        } = &err
        else {
            panic!("{err}");
        };
        assert_eq!(
            (chain.as_str(), *position),
            ("lb-2-masq-nonlocal", 2),
            "{err}"
        );
        assert!(err.to_string().contains("notrack"), "{err}");
        assert_eq!(err.label(), "rule");
    }

    #[test]
    fn a_statement_off_every_path_is_no_error() {
        let mut listing = fixture();
        // filter-output sees only the node's own traffic, which no view is about.
        statements(&mut listing, "filter-output", 0)
            .insert(0, serde_json::json!({"notrack": null}));
        assert_eq!(parse(&listing.to_string()).unwrap(), example_view());
    }

    #[test]
    fn slots_that_meet_different_fates_are_an_error() {
        let mut listing = fixture();
        // Slot 1 of web gone: a pick of 1 falls through, untranslated, to the reject of
        // cluster-ips-check.
        elements(&mut listing, "backends-tcp-2-masq-nonlocal")
            .retain(|e| e[0]["concat"] != serde_json::json!(["10.96.0.10", 80, 1]));
        let err = parse(&listing.to_string()).unwrap_err();
        assert!(
            matches!(&err, NftModelError::Ambiguous { destination, reason }
                if destination == "10.96.0.10 tcp 80" && reason.contains("reject")),
            "{err}"
        );
    }

    #[test]
    fn a_listing_without_the_table_is_an_error() {
        assert_eq!(
            parse(r#"{"nftables": [{"metainfo": {"json_schema_version": 1}}]}"#),
            Err(NftModelError::NoTable)
        );
        assert_eq!(parse("table ip proxyplan {").unwrap_err().label(), "json");
    }

    #[test]
    fn a_client_with_affinity_entries_of_others_is_still_new() {
        let mut listing = fixture();
        // What a live table lists after traffic: another client's entry, with expiry.
        elements(&mut listing, "affinity-60s-EUNXQUJZ-demo/sticky/tcp/80").push(serde_json::json!(
            [{"elem": {"val": "10.244.1.99", "timeout": 60, "expires": 42}},
             {"concat": ["10.244.2.10", 8080]}]
        ));
        assert_eq!(parse(&listing.to_string()).unwrap(), example_view());
    }

    #[test]
    fn a_loop_is_an_error_naming_its_rule() {
        let mut listing = fixture();
        statements(&mut listing, "lb-2-masq-nonlocal", 1)
            .insert(0, serde_json::json!({"jump": {"target": "services"}}));
        let err = parse(&listing.to_string()).unwrap_err();
        assert!(
            matches!(&err, NftModelError::Rule { reason, .. } if reason.contains("loop")),
            "{err}"
        );
    }

    #[test]
    fn ten_thousand_services_read_in_one_pass() {
        let mut listing = fixture();
        let (mut ips, mut backends) = (Vec::new(), Vec::new());
        for i in 0..10_000u32 {
            let vip = Ipv4Addr::from(0x0a60_1000 + i).to_string();
            ips.push(serde_json::json!(
                [{"concat": [vip, "tcp", 80]}, {"goto": {"target": "lb-2-masq-nonlocal"}}]
            ));
            for slot in 0..2u32 {
                let ep = Ipv4Addr::from(0x0af4_0000 + 2 * i + slot).to_string();
                backends.push(serde_json::json!(
                    [{"concat": [vip, 80, slot]}, {"concat": [ep, 8080]}]
                ));
            }
        }
        elements(&mut listing, "service-ips").extend(ips);
        elements(&mut listing, "backends-tcp-2-masq-nonlocal").extend(backends);
        let started = std::time::Instant::now();
        let view = parse(&listing.to_string()).unwrap();
        println!("10,000 Services read in {:?}", started.elapsed());
        assert_eq!(view.services.len(), 10_006);
        assert_eq!(
            view.services[&service("10.96.16.1", Proto::Tcp, 80)],
            to(&["10.244.0.2:8080", "10.244.0.3:8080"])
        );
    }

    // ---- the agent's table in a network namespace ------------------------------------

    /// A cluster with one Service of every shape the nftables mode renders; node-a
    /// (zone-a, pod CIDR 10.244.1.0/24) is the node under test.
    const RICH_STATE: &str = r"
apiVersion: v1
kind: Node
metadata: {name: node-a, uid: 3f1c2d4e-0000-4000-8000-00000000000a, labels: {topology.kubernetes.io/zone: zone-a}}
spec: {podCIDRs: [10.244.1.0/24]}
status: {addresses: [{type: InternalIP, address: 10.10.0.1}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-b, uid: 3f1c2d4e-0000-4000-8000-00000000000b, labels: {topology.kubernetes.io/zone: zone-b}}
spec: {podCIDRs: [10.244.2.0/24]}
status: {addresses: [{type: InternalIP, address: 10.10.0.2}]}
---
# ClusterIP with an external IP, three ready endpoints and one not ready.
apiVersion: v1
kind: Service
metadata: {name: multi, namespace: t}
spec: {clusterIP: 10.96.1.1, externalIPs: [192.0.2.50], ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: multi-1, namespace: t, labels: {kubernetes.io/service-name: multi}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.11], nodeName: node-a, conditions: {ready: true}}
- {addresses: [10.244.1.12], nodeName: node-a, conditions: {ready: true}}
- {addresses: [10.244.2.11], nodeName: node-b, conditions: {ready: true}}
- {addresses: [10.244.2.99], nodeName: node-b, conditions: {ready: false}}
---
# UDP and TCP on one port number.
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: t}
spec:
  clusterIP: 10.96.1.2
  ports:
  - {name: dns, port: 53, targetPort: 5353, protocol: UDP}
  - {name: dns-tcp, port: 53, targetPort: 5353, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, namespace: t, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{name: dns, port: 5353, protocol: UDP}, {name: dns-tcp, port: 5353, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.21], nodeName: node-a}
- {addresses: [10.244.2.21], nodeName: node-b}
---
# No endpoints: rejected.
apiVersion: v1
kind: Service
metadata: {name: nothing, namespace: t}
spec: {clusterIP: 10.96.1.3, ports: [{name: http, port: 80, protocol: TCP}]}
---
# NodePort, externalTrafficPolicy Local, two of three endpoints on node-a.
apiVersion: v1
kind: Service
metadata: {name: np-local, namespace: t}
spec: {type: NodePort, clusterIP: 10.96.1.4, externalTrafficPolicy: Local, ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30100, protocol: TCP}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: np-local-1, namespace: t, labels: {kubernetes.io/service-name: np-local}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.41], nodeName: node-a}
- {addresses: [10.244.1.42], nodeName: node-a}
- {addresses: [10.244.2.41], nodeName: node-b}
---
# NodePort, externalTrafficPolicy Local, no endpoint on node-a.
apiVersion: v1
kind: Service
metadata: {name: np-local-none, namespace: t}
spec: {type: NodePort, clusterIP: 10.96.1.5, externalTrafficPolicy: Local, ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30101, protocol: TCP}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: np-local-none-1, namespace: t, labels: {kubernetes.io/service-name: np-local-none}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.2.51], nodeName: node-b}
---
# NodePort, externalTrafficPolicy Cluster, TCP and UDP on one node port.
apiVersion: v1
kind: Service
metadata: {name: np-cluster, namespace: t}
spec:
  type: NodePort
  clusterIP: 10.96.1.6
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 30102, protocol: TCP}
  - {name: udp, port: 81, targetPort: 9090, nodePort: 30102, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: np-cluster-1, namespace: t, labels: {kubernetes.io/service-name: np-cluster}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}, {name: udp, port: 9090, protocol: UDP}]
endpoints:
- {addresses: [10.244.1.61], nodeName: node-a}
- {addresses: [10.244.2.61], nodeName: node-b}
- {addresses: [10.244.2.62], nodeName: node-b}
---
# ClientIP affinity, with a node port.
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: t}
spec:
  type: NodePort
  clusterIP: 10.96.1.7
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 300}}
  ports: [{port: 80, targetPort: 8080, nodePort: 30103, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sticky-1, namespace: t, labels: {kubernetes.io/service-name: sticky}}
addressType: IPv4
ports: [{name: '', port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.71], nodeName: node-a}
- {addresses: [10.244.2.71], nodeName: node-b}
- {addresses: [10.244.2.72], nodeName: node-b}
---
# Topology: node-a's zone gets the two endpoints hinted for zone-a.
apiVersion: v1
kind: Service
metadata: {name: topo, namespace: t}
spec: {clusterIP: 10.96.1.8, trafficDistribution: PreferClose, ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: topo-1, namespace: t, labels: {kubernetes.io/service-name: topo}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.81], nodeName: node-a, zone: zone-a, hints: {forZones: [{name: zone-a}]}}
- {addresses: [10.244.2.81], nodeName: node-b, zone: zone-a, hints: {forZones: [{name: zone-a}]}}
- {addresses: [10.244.2.82], nodeName: node-b, zone: zone-b, hints: {forZones: [{name: zone-b}]}}
---
# internalTrafficPolicy Local, one endpoint on node-a.
apiVersion: v1
kind: Service
metadata: {name: itp-local, namespace: t}
spec: {clusterIP: 10.96.1.9, internalTrafficPolicy: Local, ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: itp-local-1, namespace: t, labels: {kubernetes.io/service-name: itp-local}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.91], nodeName: node-a}
- {addresses: [10.244.2.91], nodeName: node-b}
---
# internalTrafficPolicy Local, none on node-a: dropped.
apiVersion: v1
kind: Service
metadata: {name: itp-local-none, namespace: t}
spec: {clusterIP: 10.96.1.10, internalTrafficPolicy: Local, ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: itp-local-none-1, namespace: t, labels: {kubernetes.io/service-name: itp-local-none}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.2.101], nodeName: node-b}
---
# LoadBalancer with loadBalancerSourceRanges that leave out the pods.
apiVersion: v1
kind: Service
metadata: {name: lb-fw, namespace: t}
spec: {type: LoadBalancer, clusterIP: 10.96.1.11, loadBalancerSourceRanges: [198.51.100.0/24], ports: [{name: http, port: 443, targetPort: 8443, nodePort: 30104, protocol: TCP}]}
status: {loadBalancer: {ingress: [{ip: 203.0.113.20}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-fw-1, namespace: t, labels: {kubernetes.io/service-name: lb-fw}}
addressType: IPv4
ports: [{name: http, port: 8443, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.111], nodeName: node-a}
---
apiVersion: v1
kind: Service
metadata: {name: sctp, namespace: t}
spec: {clusterIP: 10.96.1.12, ports: [{name: s, port: 3868, targetPort: 3868, protocol: SCTP}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sctp-1, namespace: t, labels: {kubernetes.io/service-name: sctp}}
addressType: IPv4
ports: [{name: s, port: 3868, protocol: SCTP}]
endpoints:
- {addresses: [10.244.2.121], nodeName: node-b}
---
# LoadBalancer, externalTrafficPolicy Local, with ClientIP affinity.
apiVersion: v1
kind: Service
metadata: {name: sticky-local, namespace: t}
spec: {type: LoadBalancer, clusterIP: 10.96.1.13, externalTrafficPolicy: Local, healthCheckNodePort: 32001, sessionAffinity: ClientIP, ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30105, protocol: TCP}]}
status: {loadBalancer: {ingress: [{ip: 203.0.113.30}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sticky-local-1, namespace: t, labels: {kubernetes.io/service-name: sticky-local}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.131], nodeName: node-a}
- {addresses: [10.244.2.131], nodeName: node-b}
";

    /// What node-a's plan for [`RICH_STATE`] gives, written out by hand.
    fn rich_view() -> TableView {
        let multi = to(&["10.244.1.11:8080", "10.244.1.12:8080", "10.244.2.11:8080"]);
        let dns = to(&["10.244.1.21:5353", "10.244.2.21:5353"]);
        let np_cluster_tcp = to(&["10.244.1.61:8080", "10.244.2.61:8080", "10.244.2.62:8080"]);
        let np_cluster_udp = to(&["10.244.1.61:9090", "10.244.2.61:9090", "10.244.2.62:9090"]);
        let sticky = to(&["10.244.1.71:8080", "10.244.2.71:8080", "10.244.2.72:8080"]);
        let sticky_local = to(&["10.244.1.131:8080", "10.244.2.131:8080"]);
        let lb_fw = to(&["10.244.1.111:8443"]);
        TableView {
            services: BTreeMap::from([
                (service("10.96.1.1", Proto::Tcp, 80), multi.clone()),
                (service("192.0.2.50", Proto::Tcp, 80), multi),
                (service("10.96.1.2", Proto::Tcp, 53), dns.clone()),
                (service("10.96.1.2", Proto::Udp, 53), dns),
                (service("10.96.1.3", Proto::Tcp, 80), Verdict::Reject),
                // A pod reaching a Local-policy Service by its cluster IP: every endpoint.
                (
                    service("10.96.1.4", Proto::Tcp, 80),
                    to(&["10.244.1.41:8080", "10.244.1.42:8080", "10.244.2.41:8080"]),
                ),
                (
                    service("10.96.1.5", Proto::Tcp, 80),
                    to(&["10.244.2.51:8080"]),
                ),
                (service("10.96.1.6", Proto::Tcp, 80), np_cluster_tcp.clone()),
                (service("10.96.1.6", Proto::Udp, 81), np_cluster_udp.clone()),
                (service("10.96.1.7", Proto::Tcp, 80), sticky.clone()),
                (
                    service("10.96.1.8", Proto::Tcp, 80),
                    to(&["10.244.1.81:8080", "10.244.2.81:8080"]),
                ),
                (
                    service("10.96.1.9", Proto::Tcp, 80),
                    to(&["10.244.1.91:8080"]),
                ),
                (service("10.96.1.10", Proto::Tcp, 80), Verdict::Drop),
                (service("10.96.1.11", Proto::Tcp, 443), lb_fw.clone()),
                // Pods are outside loadBalancerSourceRanges: the firewall drops them.
                (service("203.0.113.20", Proto::Tcp, 443), Verdict::Drop),
                (
                    service("10.96.1.12", Proto::Sctp, 3868),
                    to(&["10.244.2.121:3868"]),
                ),
                (service("10.96.1.13", Proto::Tcp, 80), sticky_local.clone()),
                // Pods are short-circuited to every endpoint of a Local-policy LB IP.
                (service("203.0.113.30", Proto::Tcp, 80), sticky_local),
            ]),
            node_ports: BTreeMap::from([
                (
                    (Proto::Tcp, 30100),
                    to(&["10.244.1.41:8080", "10.244.1.42:8080"]),
                ),
                ((Proto::Tcp, 30101), Verdict::Drop),
                ((Proto::Tcp, 30102), np_cluster_tcp),
                ((Proto::Udp, 30102), np_cluster_udp),
                ((Proto::Tcp, 30103), sticky),
                ((Proto::Tcp, 30104), lb_fw),
                ((Proto::Tcp, 30105), to(&["10.244.1.131:8080"])),
            ]),
        }
    }

    fn run(program: &Path, args: &[&str]) -> Output {
        let out = Command::new(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
        assert!(
            out.status.success(),
            "{} {args:?}: {}\n{}",
            program.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn is_root() -> bool {
        Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
    }

    /// A network namespace, deleted on drop.
    struct Netns(String);

    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }

    /// A directory, removed on drop.
    struct Scratch(PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// As root: the agent programs node-a's plan for [`RICH_STATE`] into a fresh network
    /// namespace, and the table reads as the plan says.
    #[test]
    fn agent_table_in_a_netns_reads_as_its_plan() {
        if !is_root() {
            println!("SKIPPED: needs root");
            return;
        }
        // The binaries `cargo build --bins` made (README's test command builds them before
        // `cargo test`), else release ones.
        let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
        let find = |name: &str| {
            ["debug", "release"]
                .iter()
                .map(|profile| target.join(profile).join(name))
                .find(|path| path.is_file())
                .unwrap_or_else(|| {
                    panic!("{name} is not built: run `cargo build --bins` before this test")
                })
        };
        let agent = find("proxyplan-agent");
        let controller = find("proxyplan-controller");
        if Command::new("nft").arg("--version").output().is_err() {
            println!("SKIPPED: no nft command");
            return;
        }
        let name = format!("pp-nftmodel-{}", std::process::id());
        let scratch = Scratch(std::env::temp_dir().join(&name));
        std::fs::create_dir_all(&scratch.0).unwrap();
        let state = scratch.0.join("state.yaml");
        std::fs::write(&state, RICH_STATE).unwrap();
        let plan_text = run(
            &controller,
            &[
                "plan",
                "--state",
                state.to_str().unwrap(),
                "--cluster-cidr",
                "10.244.0.0/16",
                "--node",
                "node-a",
            ],
        )
        .stdout;
        let plan = scratch.0.join("plan.yaml");
        std::fs::write(&plan, plan_text).unwrap();

        let added = Command::new("ip").args(["netns", "add", &name]).output();
        if !added.as_ref().is_ok_and(|o| o.status.success()) {
            println!("SKIPPED: ip netns add {name} failed: {added:?}");
            return;
        }
        let netns = Netns(name);
        let ip = Path::new("ip");
        let agent = agent.to_str().unwrap();
        run(
            ip,
            &[
                "netns",
                "exec",
                &netns.0,
                agent,
                "apply",
                "--plan",
                plan.to_str().unwrap(),
                "--mode",
                "nftables",
            ],
        );
        let listing = run(
            ip,
            &[
                "netns", "exec", &netns.0, "nft", "-j", "list", "table", "ip", TABLE,
            ],
        )
        .stdout;
        let view = parse(&String::from_utf8(listing).unwrap()).unwrap();
        assert_eq!(view, rich_view());
    }
}
