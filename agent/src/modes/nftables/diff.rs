//! A family's changes, written to a [`Sink`]: from scratch against what the kernel holds
//! ([`full`]), or entry by entry against what the last sync left ([`update`]).
//!
//! Within a transaction objects come before what refers to them: the table, sets,
//! chains, rules, then element deletions (and the deletion half of replacements), then
//! additions. A chain or set nothing wants any more is flushed in the last transaction
//! and deleted in one of its own after it ([`Stale`]), once no element refers to it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use proxyplan_crds::ServicePortPlan;

use super::desired::{FamilyState, decrement, increment, key_hash};
use super::layout::{self, ChainDef, FamilyContext, SetDef, SetKind};
use super::model::{HeldTable, Presence, rule_hash};
use super::names::{self, SharedChain};
use super::render::{Dest, DestMap, DestValue, Element, EntryObjects, Renderer, hairpin_key};
use super::rules::{addr_bytes, addr_port_bytes};
use super::sink::{Sink, SinkError};
use crate::kernel::Family;
use crate::kernel::nftables::Data;
use crate::kernel::nftables::objects::comment_userdata;

/// Chains and sets to delete once nothing refers to them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stale {
    /// Chains.
    pub chains: BTreeSet<String>,
    /// Sets.
    pub sets: BTreeSet<String>,
}

impl Stale {
    /// Whether there is nothing to delete.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.sets.is_empty()
    }

    /// Writes the deletions: the chains flushed first (their rules refer to the sets),
    /// then the sets (a verdict map's elements refer to chains: a ClientIP-affinity
    /// Service's slots map names its endpoint chains), then the chains. Deleting the
    /// chains first was refused (`EBUSY`) for every such Service, each sync again, and its
    /// chains and maps stayed in the kernel.
    pub fn write(&self, sink: &mut Sink<'_>) {
        for chain in &self.chains {
            sink.flush_chain(chain);
        }
        for set in &self.sets {
            sink.delete_set(set);
        }
        for chain in &self.chains {
            sink.delete_chain(chain);
        }
    }
}

/// The hash of a rule as it will be held, to compare with [`HeldTable`]'s.
fn wanted_rule_hash(family: Family, rule: &super::rules::Rule) -> u64 {
    let userdata = rule.comment.as_deref().map(comment_userdata);
    rule_hash(&rule.expressions(family), userdata.as_deref())
}

/// Whether what the kernel holds can be brought to what is wanted object by object:
/// every wanted set it holds has the wanted definition, every wanted chain it holds is
/// hooked as wanted, and every element had the length of its set.
fn compatible(
    family: Family,
    held: &HeldTable,
    sets: &HashMap<String, SetKind>,
    chains: &[ChainDef],
) -> bool {
    let bad_set = held.sets.iter().find(|(name, set)| {
        set.records.odd
            || sets.get(*name).is_some_and(|kind| {
                !SetDef::new((*name).clone(), *kind)
                    .kernel(family)
                    .same_definition(&set.set)
            })
    });
    if let Some((name, set)) = bad_set {
        tracing::info!(set = %name, held = ?set.set, "a set of the table is not as this agent makes it");
        return false;
    }
    let bad_chain = chains
        .iter()
        .find(|c| held.chains.get(&c.name).is_some_and(|h| h.hook != c.hook));
    if let Some(chain) = bad_chain {
        tracing::info!(chain = %chain.name, "a chain of the table is not hooked as this agent hooks it");
        return false;
    }
    true
}

/// Writes objects and elements against a [`HeldTable`]: what it holds already is left
/// alone and marked seen.
struct Against<'a, 'k> {
    family: Family,
    held: &'a mut HeldTable,
    sink: &'a mut Sink<'k>,
    kept_chains: HashSet<String>,
    kept_sets: HashSet<String>,
}

impl Against<'_, '_> {
    fn set(&mut self, set: &SetDef) {
        if self.kept_sets.contains(&set.name) {
            return;
        }
        if !self.held.sets.contains_key(&set.name) {
            self.sink.add_set(set);
        }
        self.kept_sets.insert(set.name.clone());
    }

    /// Creates `chain`, empty, when the kernel does not hold it (its rules come with
    /// [`Against::rules`], once every chain they may name exists).
    fn declare(&mut self, chain: &ChainDef) {
        if self.kept_chains.contains(&chain.name) || self.held.chains.contains_key(&chain.name) {
            return;
        }
        self.sink.add_chain(&ChainDef {
            rules: Vec::new(),
            ..chain.clone()
        });
        self.held.chains.insert(
            chain.name.clone(),
            super::model::HeldChain {
                hook: chain.hook.clone(),
                rules: Vec::new(),
            },
        );
    }

    /// Brings a declared chain's rules to `chain`'s.
    fn rules(&mut self, chain: &ChainDef) {
        if !self.kept_chains.insert(chain.name.clone()) {
            return;
        }
        let family = self.family;
        let held = self
            .held
            .chains
            .get(&chain.name)
            .map(|h| h.rules.as_slice())
            .unwrap_or_default();
        let same = held.len() == chain.rules.len()
            && held
                .iter()
                .zip(&chain.rules)
                .all(|(h, r)| *h == wanted_rule_hash(family, r));
        if same {
            return;
        }
        if !held.is_empty() {
            self.sink.flush_chain(&chain.name);
        }
        for rule in &chain.rules {
            self.sink.add_rule(&chain.name, rule);
        }
    }

    fn element(&mut self, set: &str, key: &[u8], data: Option<&Data>) {
        let presence = match self.held.sets.get_mut(set) {
            Some(held) => held.records.check(key, data),
            None => Presence::Absent,
        };
        match presence {
            Presence::Same => {}
            Presence::Absent => self.sink.add_element(set, key, data),
            Presence::Different => {
                self.sink.delete_element(set, key);
                self.sink.add_element(set, key, data);
            }
        }
    }

    /// A destination's element in its verdict map.
    fn verdict(&mut self, dest: &Dest, value: &DestValue) {
        self.element(
            dest.map.name(),
            &dest.key(),
            Some(&Data::Verdict(value.verdict.clone())),
        );
    }

    /// The endpoints behind a destination, in its shared chain's maps.
    fn backends(&mut self, dest: &Dest, value: &DestValue) {
        if let Some(shared) = value.shared {
            for (slot, (ip, port)) in (0u32..).zip(&value.backends) {
                let (map, key) = dest.backend_key(shared, slot);
                self.element(&map, &key, Some(&Data::Value(addr_port_bytes(*ip, *port))));
            }
        }
    }

    /// Deletes what is held and not wanted: elements now, chains flushed now and, with
    /// the sets, returned to delete once this is committed.
    fn stale(&mut self) -> Stale {
        let mut stale = Stale::default();
        let mut names: Vec<&String> = self.held.sets.keys().collect();
        names.sort();
        for name in names {
            let Some(held) = self.held.sets.get(name) else {
                continue;
            };
            if !self.kept_sets.contains(name) {
                stale.sets.insert(name.clone());
                continue;
            }
            let keys: Vec<Vec<u8>> = held.records.unseen().map(<[u8]>::to_vec).collect();
            for key in keys {
                self.sink.delete_element(name, &key);
            }
        }
        let mut chains: Vec<&String> = self.held.chains.keys().collect();
        chains.sort();
        for name in chains {
            if !self.kept_chains.contains(name) {
                self.sink.flush_chain(name);
                stale.chains.insert(name.clone());
            }
        }
        stale
    }
}

/// Brings the table of `ctx.family` from what `held` holds to what `entries` want,
/// writing to `sink`; sends the transactions (the last after the stale elements) and
/// returns the state and what to delete in a transaction of its own.
///
/// # Errors
/// When a transaction cannot be sent or is refused.
pub fn full(
    entries: &[&ServicePortPlan],
    ctx: FamilyContext,
    held: &mut HeldTable,
    sink: &mut Sink<'_>,
) -> Result<(FamilyState, Stale), SinkError> {
    let family = ctx.family;
    let mut state = FamilyState::new(ctx.clone());
    if entries.is_empty() {
        if held.exists {
            sink.delete_table();
            sink.commit()?;
        }
        return Ok((state, Stale::default()));
    }
    let renderer = Renderer { ctx: &ctx };
    // Who owns each destination, and which shared chains the owners go to.
    let mut owner_shared: HashMap<Dest, Option<SharedChain>> = HashMap::new();
    let mut own_sets: HashMap<String, SetKind> = layout::fixed_sets()
        .into_iter()
        .map(|s| (s.name, s.kind))
        .collect();
    for entry in entries {
        let hash = key_hash(&entry.key);
        let objects = renderer.entry(entry);
        for (dest, value) in objects.dests {
            state.claim(dest, hash);
            if state.owner(&dest) == Some(hash) {
                owner_shared.insert(dest, value.shared);
            }
        }
        for (set, _) in objects.sets {
            own_sets.insert(set.name, set.kind);
        }
    }
    for shared in owner_shared.values().flatten() {
        state.use_shared(*shared);
    }
    drop(owner_shared);
    let mut shared_keys: Vec<SharedChain> = state.shared.keys().copied().collect();
    shared_keys.sort();
    let shared_sets: Vec<SetDef> = shared_keys
        .iter()
        .flat_map(|c| layout::shared_sets(*c))
        .collect();
    own_sets.extend(shared_sets.iter().map(|s| (s.name.clone(), s.kind)));
    let fixed_chains = layout::fixed_chains(&ctx);
    if held.exists && !compatible(family, held, &own_sets, &fixed_chains) {
        tracing::warn!(
            table = names::TABLE,
            ?family,
            "the table holds sets or chains of another shape than this agent makes \
             (another version?); replacing the whole table in one transaction"
        );
        sink.delete_table();
        *held = HeldTable::default();
    }
    drop(own_sets);
    if !held.exists {
        sink.add_table();
    }
    let mut to = Against {
        family,
        held,
        sink,
        kept_chains: HashSet::new(),
        kept_sets: HashSet::new(),
    };
    for set in layout::fixed_sets().iter().chain(&shared_sets) {
        to.set(set);
    }
    drop(shared_sets);
    // Chains first, rules after: a rule may jump to a chain created after its own.
    let shared: Vec<ChainDef> = shared_keys
        .into_iter()
        .map(|c| layout::shared_chain(c, &ctx))
        .collect();
    for chain in fixed_chains.iter().chain(&shared) {
        to.declare(chain);
    }
    for chain in &fixed_chains {
        to.rules(chain);
    }
    // The destinations go last. A verdict map element is what makes an entry's chains
    // reachable from the base chains, and each commit that adds a jump has nf_tables
    // walk everything reachable from them. Written entry by entry, each of a first
    // sync's transactions walked the whole table built so far: quadratic, 6 s of
    // commits at 50,000 Services. Chains and sets first, the links after, only the last
    // transactions walk a large table.
    let mut links: Vec<(Dest, DestValue)> = Vec::new();
    for entry in entries {
        let hash = key_hash(&entry.key);
        let objects = renderer.entry(entry);
        for (set, _) in &objects.sets {
            to.set(set);
        }
        for chain in &objects.chains {
            to.declare(chain);
        }
        for chain in &objects.chains {
            to.rules(chain);
        }
        for (set, elements) in &objects.sets {
            if !set.dynamic() {
                for (key, data) in elements {
                    to.element(&set.name, key, data.as_ref());
                }
            }
        }
        for hairpin in &objects.hairpin {
            if state.hairpin.increment(*hairpin) {
                let (ip, proto, port) = *hairpin;
                to.element(names::HAIRPIN, &hairpin_key(ip, proto, port), None);
            }
        }
        if let Some(ip) = objects.cluster_ip
            && increment(&mut state.cluster_ips, ip)
        {
            to.element(names::CLUSTER_IPS, &addr_bytes(ip), None);
        }
        links.extend(
            objects
                .dests
                .into_iter()
                .filter(|(dest, _)| state.owner(dest) == Some(hash)),
        );
        state.entries += 1;
        to.sink.boundary()?;
    }
    // The shared chains' maps are filled before their rules are written: a table of an
    // agent that looked all endpoints up in one map per protocol keeps sending traffic
    // through its chains' old rules until the new ones find every endpoint in place.
    for (dest, value) in &links {
        to.backends(dest, value);
        to.sink.boundary()?;
    }
    for chain in &shared {
        to.rules(chain);
    }
    for (dest, value) in &links {
        to.verdict(dest, value);
        to.sink.boundary()?;
    }
    drop(links);
    let stale = to.stale();
    to.sink.commit()?;
    Ok((state, stale))
}

/// Rewrites the chains and sets named (as nf_tables announced that someone else touched
/// them) to what `entries` and `state` want, writing to `sink` without sending and without
/// reading the kernel: each chain flushed and given its rules again, each set flushed
/// and given its elements again. Sent as one transaction, no packet ever meets a
/// half-rewritten chain or set, and nothing the tamper did not touch is rewritten.
/// A chain or set the last sync is deleting is flushed or left; a dynamic set (the
/// affinity maps packets fill) is left, as it holds nothing to restore.
///
/// Elements named by key (`elements`: whether the last announcement of each added it)
/// are put back one by one when their set is one of the shared verdict maps or the
/// cluster IPs (an added one deleted first, a wanted one added): one Service's element
/// deleted by hand is one element sent back, not the whole map. Any other set of
/// `elements` is rewritten whole.
///
/// Returns false, having written nothing, when a name is of nothing this family holds:
/// only a read of the table says what to do then.
pub fn rewrite(
    entries: &[&ServicePortPlan],
    state: &FamilyState,
    stale: &Stale,
    chains: &BTreeSet<String>,
    sets: &BTreeSet<String>,
    elements: &BTreeMap<String, BTreeMap<Vec<u8>, bool>>,
    sink: &mut Sink<'_>,
) -> bool {
    let by_key: BTreeMap<&str, &BTreeMap<Vec<u8>, bool>> = elements
        .iter()
        .filter(|(set, _)| element_by_element(set) && !stale.sets.contains(*set))
        .map(|(set, keys)| (set.as_str(), keys))
        .collect();
    let whole: BTreeSet<String> = sets
        .iter()
        .chain(elements.keys().filter(|set| !element_by_element(set)))
        .cloned()
        .collect();
    let sets = &whole;
    let element_writes = wanted_elements(entries, state, &by_key);
    let ctx = &state.ctx;
    let mut chain_rules: BTreeMap<&str, Option<ChainDef>> = chains
        .iter()
        .filter(|name| !stale.chains.contains(*name))
        .map(|name| (name.as_str(), None))
        .collect();
    let wanted_chain = |chain: ChainDef, into: &mut BTreeMap<&str, Option<ChainDef>>| {
        if let Some(slot) = into.get_mut(chain.name.as_str()) {
            *slot = Some(chain);
        }
    };
    for chain in layout::fixed_chains(ctx) {
        wanted_chain(chain, &mut chain_rules);
    }
    for shared in state.shared.keys() {
        wanted_chain(layout::shared_chain(*shared, ctx), &mut chain_rules);
    }
    // The sets whose elements come from every entry: the fixed ones and the shared
    // chains' maps.
    let fixed: HashSet<String> = layout::fixed_sets()
        .into_iter()
        .chain(state.shared.keys().flat_map(|c| layout::shared_sets(*c)))
        .map(|s| s.name)
        .collect();
    // Each set's elements, once it is known to be wanted (a dynamic set: none to write).
    let mut set_elements: BTreeMap<&str, Option<Vec<Element>>> = sets
        .iter()
        .filter(|name| !stale.sets.contains(*name))
        .map(|name| {
            let known = fixed.contains(name).then(Vec::new);
            (name.as_str(), known)
        })
        .collect();
    let every_entry = set_elements.keys().any(|name| fixed.contains(*name));
    let own: Vec<&str> = chain_rules
        .iter()
        .filter(|(_, def)| def.is_none())
        .map(|(name, _)| *name)
        .chain(
            set_elements
                .keys()
                .copied()
                .filter(|name| !fixed.contains(*name)),
        )
        .collect();
    // Dynamic sets: what packets put there is theirs, nothing to restore.
    let mut dynamic: HashSet<String> = HashSet::new();
    if every_entry || !own.is_empty() {
        let renderer = Renderer { ctx };
        let mut hairpin: HashSet<(IpAddr, u8, u16)> = HashSet::new();
        let mut cluster_ips: HashSet<IpAddr> = HashSet::new();
        for entry in entries {
            // An entry's own objects carry its id in their names.
            if !every_entry {
                let id = names::entry_id(entry);
                if !own.iter().any(|name| name.contains(&id)) {
                    continue;
                }
            }
            let hash = key_hash(&entry.key);
            let objects = renderer.entry(entry);
            for chain in objects.chains {
                wanted_chain(chain, &mut chain_rules);
            }
            for (set, elements) in objects.sets {
                if let Some(slot) = set_elements.get_mut(set.name.as_str()) {
                    if set.dynamic() {
                        dynamic.insert(set.name.clone());
                    }
                    *slot = Some(elements);
                }
            }
            if !every_entry {
                continue;
            }
            let mut add = |set: &str, key: Vec<u8>, data: Option<Data>| {
                if let Some(Some(elements)) = set_elements.get_mut(set) {
                    elements.push((key, data));
                }
            };
            for (dest, value) in objects.dests {
                if state.owner(&dest) != Some(hash) {
                    continue;
                }
                if let Some(shared) = value.shared {
                    for (slot, (ip, port)) in (0u32..).zip(&value.backends) {
                        let (map, key) = dest.backend_key(shared, slot);
                        add(&map, key, Some(Data::Value(addr_port_bytes(*ip, *port))));
                    }
                }
                add(
                    dest.map.name(),
                    dest.key(),
                    Some(Data::Verdict(value.verdict)),
                );
            }
            for (ip, proto, port) in objects.hairpin {
                if hairpin.insert((ip, proto, port)) {
                    add(names::HAIRPIN, hairpin_key(ip, proto, port), None);
                }
            }
            if let Some(ip) = objects.cluster_ip
                && cluster_ips.insert(ip)
            {
                add(names::CLUSTER_IPS, addr_bytes(ip), None);
            }
        }
    }
    if chain_rules.values().any(Option::is_none) || set_elements.values().any(Option::is_none) {
        return false;
    }
    for name in chains.iter().filter(|name| stale.chains.contains(*name)) {
        sink.flush_chain(name);
    }
    for chain in chain_rules.into_values().flatten() {
        sink.flush_chain(&chain.name);
        for rule in &chain.rules {
            sink.add_rule(&chain.name, rule);
        }
    }
    for (set, elements) in set_elements {
        let Some(elements) = elements else { continue };
        if dynamic.contains(set) {
            continue;
        }
        sink.flush_set(set);
        for (key, data) in &elements {
            sink.add_element(set, key, data.as_ref());
        }
    }
    for (set, key, added, wanted) in element_writes {
        if added {
            sink.delete_element(set, key);
        }
        if let Some(data) = wanted {
            sink.add_element(set, key, data.as_ref());
        }
    }
    true
}

/// Whether a set's elements are put back one by one: the shared verdict maps (each
/// element's owner is known from the claims) and the cluster IPs (counted).
fn element_by_element(set: &str) -> bool {
    [
        DestMap::ServiceIps,
        DestMap::NoEndpointServices,
        DestMap::FirewallIps,
        DestMap::ServiceNodePorts,
        DestMap::NoEndpointNodePorts,
    ]
    .iter()
    .any(|map| map.name() == set)
        || set == names::CLUSTER_IPS
}

/// One element to put back: its set and key, whether the last announcement added it
/// (it is deleted first), and what is wanted there (none: nothing; `Some(None)`: a set's
/// element, without data).
type ElementWrite<'k> = (&'k str, &'k [u8], bool, Option<Option<Data>>);

/// What each key of `by_key` should hold. A destination's owner is found
/// in the claims, and only the owners are rendered.
fn wanted_elements<'k>(
    entries: &[&ServicePortPlan],
    state: &FamilyState,
    by_key: &BTreeMap<&'k str, &'k BTreeMap<Vec<u8>, bool>>,
) -> Vec<ElementWrite<'k>> {
    let mut owned: HashMap<Dest, u64> = HashMap::new();
    for (dest, claim) in &state.claims {
        if by_key
            .get(dest.map.name())
            .is_some_and(|keys| keys.contains_key(&dest.key()))
        {
            owned.insert(*dest, claim.owner);
        }
    }
    let mut verdicts: HashMap<Dest, Data> = HashMap::new();
    if !owned.is_empty() {
        let owners: HashSet<u64> = owned.values().copied().collect();
        let renderer = Renderer { ctx: &state.ctx };
        for entry in entries {
            let hash = key_hash(&entry.key);
            if !owners.contains(&hash) {
                continue;
            }
            for (dest, value) in renderer.entry(entry).dests {
                if owned.get(&dest) == Some(&hash) {
                    verdicts.insert(dest, Data::Verdict(value.verdict));
                }
            }
        }
    }
    let by_dest: HashMap<(&str, Vec<u8>), &Data> = verdicts
        .iter()
        .map(|(dest, data)| ((dest.map.name(), dest.key()), data))
        .collect();
    let mut out: Vec<ElementWrite<'k>> = Vec::new();
    for (set, keys) in by_key {
        for (key, added) in *keys {
            let wanted = if *set == names::CLUSTER_IPS {
                ip_of(key)
                    .filter(|ip| state.cluster_ips.contains_key(ip))
                    .map(|_| None)
            } else {
                by_dest
                    .get(&(*set, key.clone()))
                    .map(|data| Some((*data).clone()))
            };
            out.push((*set, key.as_slice(), *added, wanted));
        }
    }
    out
}

/// One entry that changed, came or went.
#[derive(Debug, Clone, Copy)]
pub struct Change<'p> {
    /// Before (none: it came).
    pub old: Option<&'p ServicePortPlan>,
    /// After (none: it went).
    pub new: Option<&'p ServicePortPlan>,
}

/// An element change: what the kernel held before this sync and what it should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ElementChange {
    /// Held before (`None`: absent; `Some(data)`: present with data).
    original: Option<Option<Data>>,
    /// Wanted now.
    wanted: Option<Option<Data>>,
}

/// Element changes, one per key.
#[derive(Debug, Default)]
struct ElementChanges(BTreeMap<(String, Vec<u8>), ElementChange>);

impl ElementChanges {
    fn change(
        &mut self,
        set: &str,
        key: Vec<u8>,
        old: Option<Option<&Data>>,
        new: Option<Option<&Data>>,
    ) {
        let slot = self
            .0
            .entry((set.to_owned(), key))
            .or_insert_with(|| ElementChange {
                original: old.map(|d| d.cloned()),
                wanted: None,
            });
        slot.wanted = new.map(|d| d.cloned());
    }

    fn write(self, sink: &mut Sink<'_>) {
        let changes: Vec<((String, Vec<u8>), ElementChange)> = self
            .0
            .into_iter()
            .filter(|(_, c)| c.original != c.wanted)
            .collect();
        for ((set, key), c) in &changes {
            if c.original.is_some() {
                sink.delete_element(set, key);
            }
        }
        for ((set, key), c) in &changes {
            if let Some(data) = &c.wanted {
                sink.add_element(set, key, data.as_ref());
            }
        }
    }
}

fn diff_dest(
    dest: &Dest,
    old: Option<&DestValue>,
    new: Option<&DestValue>,
    out: &mut ElementChanges,
) {
    let verdict = |v: Option<&DestValue>| v.map(|v| Data::Verdict(v.verdict.clone()));
    let (ov, nv) = (verdict(old), verdict(new));
    out.change(
        dest.map.name(),
        dest.key(),
        ov.as_ref().map(Some),
        nv.as_ref().map(Some),
    );
    // The endpoints behind it, in its shared chain's maps: slot by slot when the chain
    // stays, all of them moved when it changes (the count or the masquerading did).
    fn backends(v: Option<&DestValue>) -> Option<(SharedChain, &[(IpAddr, u16)])> {
        v.and_then(|v| Some((v.shared?, v.backends.as_slice())))
    }
    let data = |(ip, port): &(IpAddr, u16)| Data::Value(addr_port_bytes(*ip, *port));
    match (backends(old), backends(new)) {
        (Some((os, ob)), Some((ns, nb))) if os == ns => {
            for slot in 0..ob.len().max(nb.len()) {
                let (od, nd) = (ob.get(slot).map(data), nb.get(slot).map(data));
                if od != nd {
                    let (map, key) = dest.backend_key(ns, slot as u32);
                    out.change(&map, key, od.as_ref().map(Some), nd.as_ref().map(Some));
                }
            }
        }
        (before, after) => {
            if let Some((shared, list)) = before {
                for (slot, endpoint) in (0u32..).zip(list) {
                    let (map, key) = dest.backend_key(shared, slot);
                    out.change(&map, key, Some(Some(&data(endpoint))), None);
                }
            }
            if let Some((shared, list)) = after {
                for (slot, endpoint) in (0u32..).zip(list) {
                    let (map, key) = dest.backend_key(shared, slot);
                    out.change(&map, key, None, Some(Some(&data(endpoint))));
                }
            }
        }
    }
}

/// Which version of an entry a value is rendered from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum When {
    Before,
    After,
}

/// Moves the table of `state.ctx.family` from what the last sync left to what the new
/// plan wants, given the entries that changed; `unchanged` finds an entry that did not
/// change by its key hash (needed only when the owner of a contested destination
/// changes). Sends one transaction and returns what to delete in one of its own.
///
/// # Errors
/// When the transaction cannot be sent or is refused.
pub fn update(
    state: &mut FamilyState,
    changes: &[Change<'_>],
    unchanged: &dyn Fn(u64) -> Option<EntryObjects>,
    sink: &mut Sink<'_>,
) -> Result<Stale, SinkError> {
    let family = state.ctx.family;
    let ctx = state.ctx.clone();
    let renderer = Renderer { ctx: &ctx };
    let rendered: Vec<(u64, Option<EntryObjects>, Option<EntryObjects>)> = changes
        .iter()
        .map(|c| {
            let key = c.old.or(c.new).map(|e| e.key.as_str()).unwrap_or_default();
            (
                key_hash(key),
                c.old.map(|e| renderer.entry(e)),
                c.new.map(|e| renderer.entry(e)),
            )
        })
        .collect();
    // Destinations touched, with their owner before.
    let mut touched: BTreeMap<Dest, Option<u64>> = BTreeMap::new();
    for (_, old, new) in &rendered {
        for objects in [old, new].into_iter().flatten() {
            for (dest, _) in &objects.dests {
                touched.entry(*dest).or_insert_with(|| state.owner(dest));
            }
        }
    }
    for (hash, old, new) in &rendered {
        if let Some(old) = old {
            for (dest, _) in &old.dests {
                state.release(dest, *hash);
            }
        }
        if let Some(new) = new {
            for (dest, _) in &new.dests {
                state.claim(*dest, *hash);
            }
        }
    }
    let value_of = |owner: u64, dest: &Dest, when: When| -> Option<DestValue> {
        let find = |objects: &EntryObjects| {
            objects
                .dests
                .iter()
                .find(|(d, _)| d == dest)
                .map(|(_, v)| v.clone())
        };
        match rendered.iter().find(|(h, _, _)| *h == owner) {
            Some((_, old, new)) => match when {
                When::Before => old.as_ref().and_then(find),
                When::After => new.as_ref().and_then(find),
            },
            None => unchanged(owner).as_ref().and_then(find),
        }
    };
    let mut elements = ElementChanges::default();
    let mut new_shared = Vec::new();
    let mut stale = Stale::default();
    for (dest, before) in &touched {
        let old = before.and_then(|o| value_of(o, dest, When::Before));
        let new = state
            .owner(dest)
            .and_then(|o| value_of(o, dest, When::After));
        if old == new {
            continue;
        }
        diff_dest(dest, old.as_ref(), new.as_ref(), &mut elements);
        let (os, ns) = (
            old.as_ref().and_then(|v| v.shared),
            new.as_ref().and_then(|v| v.shared),
        );
        if let Some(s) = ns
            && state.use_shared(s)
        {
            new_shared.push(s);
        }
        if let Some(s) = os
            && state.unuse_shared(s)
        {
            stale.chains.insert(s.name());
            stale
                .sets
                .extend(layout::shared_sets(s).into_iter().map(|set| set.name));
        }
    }
    // A shared chain that went and came back in this sync stays, with its maps.
    for s in &new_shared {
        stale.chains.remove(&s.name());
        for set in layout::shared_sets(*s) {
            stale.sets.remove(&set.name);
        }
    }
    let new_shared: Vec<SharedChain> = new_shared
        .into_iter()
        .filter(|s| state.shared.contains_key(s))
        .collect();
    // Chains and sets of the entries themselves.
    let mut new_sets: Vec<SetDef> = Vec::new();
    let mut new_chains: Vec<ChainDef> = Vec::new();
    let mut replaced: Vec<ChainDef> = Vec::new();
    for (_, old, new) in &rendered {
        let empty = EntryObjects::default();
        let (old, new) = (
            old.as_ref().unwrap_or(&empty),
            new.as_ref().unwrap_or(&empty),
        );
        let old_chains: HashMap<&str, &ChainDef> =
            old.chains.iter().map(|c| (c.name.as_str(), c)).collect();
        for chain in &new.chains {
            match old_chains.get(chain.name.as_str()) {
                None => new_chains.push(chain.clone()),
                Some(before) if *before != chain => replaced.push(chain.clone()),
                Some(_) => {}
            }
        }
        for chain in &old.chains {
            if !new.chains.iter().any(|c| c.name == chain.name) {
                stale.chains.insert(chain.name.clone());
            }
        }
        let old_sets: HashMap<&str, &(SetDef, Vec<Element>)> =
            old.sets.iter().map(|s| (s.0.name.as_str(), s)).collect();
        for (set, wanted) in &new.sets {
            let held: &[Element] = match old_sets.get(set.name.as_str()) {
                Some((_, held)) => held,
                None => {
                    new_sets.push(set.clone());
                    &[]
                }
            };
            let held: HashMap<&[u8], Option<&Data>> = held
                .iter()
                .map(|(k, d)| (k.as_slice(), d.as_ref()))
                .collect();
            let mut wanted_keys = HashSet::new();
            for (key, data) in wanted {
                wanted_keys.insert(key.as_slice());
                elements.change(
                    &set.name,
                    key.clone(),
                    held.get(key.as_slice()).copied(),
                    Some(data.as_ref()),
                );
            }
            for (key, data) in &held {
                if !wanted_keys.contains(key) {
                    elements.change(&set.name, key.to_vec(), Some(*data), None);
                }
            }
        }
        for (set, _) in &old.sets {
            // Its elements go with it.
            if !new.sets.iter().any(|(s, _)| s.name == set.name) {
                stale.sets.insert(set.name.clone());
            }
        }
    }
    // Hairpin elements and cluster IPs: counted, changed when a count leaves or
    // reaches 0.
    let mut counted: BTreeMap<Vec<u8>, (&str, bool)> = BTreeMap::new();
    for (_, old, _) in &rendered {
        if let Some(objects) = old {
            for hp in &objects.hairpin {
                let (ip, proto, port) = *hp;
                counted
                    .entry(hairpin_key(ip, proto, port))
                    .or_insert((names::HAIRPIN, true));
                state.hairpin.decrement(*hp);
            }
            if let Some(ip) = objects.cluster_ip {
                counted
                    .entry(addr_bytes(ip))
                    .or_insert((names::CLUSTER_IPS, true));
                decrement(&mut state.cluster_ips, ip);
            }
        }
    }
    for (_, old, new) in &rendered {
        if old.is_some() {
            state.entries = state.entries.saturating_sub(1);
        }
        if let Some(objects) = new {
            state.entries += 1;
            for hp in &objects.hairpin {
                let (ip, proto, port) = *hp;
                counted
                    .entry(hairpin_key(ip, proto, port))
                    .or_insert((names::HAIRPIN, state.hairpin.contains(*hp)));
                state.hairpin.increment(*hp);
            }
            if let Some(ip) = objects.cluster_ip {
                counted
                    .entry(addr_bytes(ip))
                    .or_insert((names::CLUSTER_IPS, state.cluster_ips.contains_key(&ip)));
                increment(&mut state.cluster_ips, ip);
            }
        }
    }
    for (key, (set, before)) in counted {
        let after = if set == names::HAIRPIN {
            let a = layout::addr_len(family) as usize;
            let ip = ip_of(key.get(..a).unwrap_or_default());
            let proto = key.get(2 * a).copied().unwrap_or(0);
            let port = key
                .get(2 * a + 4..2 * a + 6)
                .map(|p| u16::from_be_bytes([p[0], p[1]]))
                .unwrap_or(0);
            ip.is_some_and(|ip| state.hairpin.contains((ip, proto, port)))
        } else {
            ip_of(&key).is_some_and(|ip| state.cluster_ips.contains_key(&ip))
        };
        if before != after {
            elements.change(set, key, before.then_some(None), after.then_some(None));
        }
    }
    // Write: structure, rules, elements, flushes.
    let shared_defs: Vec<ChainDef> = new_shared
        .iter()
        .map(|s| layout::shared_chain(*s, &ctx))
        .collect();
    for set in new_shared
        .iter()
        .flat_map(|s| layout::shared_sets(*s))
        .chain(new_sets)
    {
        sink.add_set(&set);
    }
    for chain in shared_defs.iter().chain(&new_chains) {
        sink.add_chain(&ChainDef {
            rules: Vec::new(),
            ..chain.clone()
        });
    }
    for chain in shared_defs.iter().chain(&new_chains) {
        for rule in &chain.rules {
            sink.add_rule(&chain.name, rule);
        }
    }
    for chain in &replaced {
        sink.flush_chain(&chain.name);
        for rule in &chain.rules {
            sink.add_rule(&chain.name, rule);
        }
    }
    elements.write(sink);
    for chain in &stale.chains {
        sink.flush_chain(chain);
    }
    sink.commit()?;
    Ok(stale)
}

fn ip_of(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}
