//! What the iptables mode remembers between syncs, without keeping rule text: per service
//! port entry, a hash of the entry and the name, revision and rule count of each chain it
//! owns (24 bytes a chain); per fixed chain (`PROXYPLAN-SERVICES`, ...), its revision and
//! rule count.
//!
//! A sync is two passes over the plan, both entry by entry:
//!
//! 1. [`FamilyCache::diff`] hashes every entry and renders only those that differ from
//!    the cache (all of them on the first sync), compares their chains with what the
//!    kernel holds, and notes which chains to write or remove: a [`Delta`], no text.
//!    Right after the kernel was read (first sync, periodic resync, canary, failed
//!    restore) the comparison is against the chains read; otherwise the kernel holds
//!    exactly what the cache describes, so it is against the cache.
//! 2. [`Delta::write_payload`] renders the entries with chains to write again and streams
//!    the `iptables-restore --noflush` text, so the payload is never held either.
//!
//! [`FamilyCache::commit`] then makes the delta the new cache. The fixed chains collect a
//! rule or two from every entry: they are re-hashed (and rewritten) only when an entry's
//! part of them changed or entries came or went.

use std::borrow::Cow;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::{self, Write};
use std::net::IpAddr;

use proxyplan_crds::{IpFamily, MergedPlan, ServicePortPlan};

use super::render::{FamilyInputs, RenderSettings, base_rules, render_entries, tail_rules};
use crate::conntrack::EntryChange;
use crate::kernel::family::Family;
use crate::ruleset::diff::{apply_jumps, jump_changes};
use crate::ruleset::hash::{ContentHasher, RevisionHasher, hash_entry, revision_text};
use crate::ruleset::names::{ChainName, HashedName};
use crate::ruleset::rules::{BaseJump, FamilyRules, REVISION_PREFIX, TableName};
use crate::ruleset::save::{KernelChains, KernelFamily};

/// Node-local inputs of the rendering; a change re-renders everything.
type Context = (RenderSettings, Option<String>, Vec<IpAddr>);

/// A rule appended to a fixed chain after every entry's.
type TailRule = (TableName, &'static str, String);

/// Jumps in built-in chains to delete (chain, position) and to insert.
type JumpChanges = (Vec<(String, usize)>, Vec<BaseJump>);

const TABLES: [TableName; 2] = [TableName::Filter, TableName::Nat];

fn slot(table: TableName) -> usize {
    match table {
        TableName::Filter => 0,
        TableName::Nat => 1,
    }
}

fn ip_family(family: Family) -> IpFamily {
    match family {
        Family::V4 => IpFamily::IPv4,
        Family::V6 => IpFamily::IPv6,
    }
}

/// A chain an entry owns whose name is a [`HashedName`] (all of them, as rendered today):
/// 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OwnChain {
    hash: u64,
    revision: u64,
    /// Rules, revision rule included.
    rules: u32,
    prefix: u8,
    table: TableName,
    /// In a [`Delta`]: the chain is (re)written.
    write: bool,
}

impl OwnChain {
    fn name(&self) -> HashedName {
        HashedName::from_parts(self.prefix, self.hash)
    }

    fn key(&self) -> (TableName, u8, u64) {
        (self.table, self.prefix, self.hash)
    }
}

/// A chain an entry owns under any other name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OtherChain {
    table: TableName,
    name: Box<str>,
    revision: u64,
    rules: u32,
    write: bool,
}

/// What the cache holds for the entries sharing one key (one entry in any valid plan).
#[derive(Debug, Clone, PartialEq, Eq)]
struct GroupState {
    /// Hash of the entries.
    content: u64,
    /// Hash of what they add to the fixed chains.
    shared: u64,
    /// Their chains, sorted by [`OwnChain::key`].
    chains: Box<[OwnChain]>,
    others: Box<[OtherChain]>,
}

impl GroupState {
    /// Revision and rule count of one of the chains.
    fn find(&self, table: TableName, name: &ChainName) -> Option<(u64, u32)> {
        match name {
            ChainName::Hashed(h) => {
                let (prefix, hash) = h.parts();
                let i = self
                    .chains
                    .binary_search_by_key(&(table, prefix, hash), OwnChain::key)
                    .ok()?;
                let c = &self.chains[i];
                Some((c.revision, c.rules))
            }
            ChainName::Other(text) => self
                .others
                .iter()
                .find(|c| c.table == table && c.name == *text)
                .map(|c| (c.revision, c.rules)),
        }
    }

    /// Every chain's table and name.
    fn names(&self) -> impl Iterator<Item = (TableName, ChainName)> + '_ {
        self.chains
            .iter()
            .map(|c| (c.table, ChainName::Hashed(c.name())))
            .chain(
                self.others
                    .iter()
                    .map(|c| (c.table, ChainName::Other(c.name.clone()))),
            )
    }

    fn rules(&self) -> usize {
        self.chains.iter().map(|c| c.rules as usize).sum::<usize>()
            + self.others.iter().map(|c| c.rules as usize).sum::<usize>()
    }

    fn writes_in(&self, table: TableName) -> bool {
        self.chains.iter().any(|c| c.write && c.table == table)
            || self.others.iter().any(|c| c.write && c.table == table)
    }

    /// The revision of a chain to write.
    fn written(&self, table: TableName, name: &ChainName) -> Option<u64> {
        match name {
            ChainName::Hashed(h) => {
                let (prefix, hash) = h.parts();
                let i = self
                    .chains
                    .binary_search_by_key(&(table, prefix, hash), OwnChain::key)
                    .ok()?;
                let c = &self.chains[i];
                c.write.then_some(c.revision)
            }
            ChainName::Other(text) => self
                .others
                .iter()
                .find(|c| c.table == table && c.name == *text && c.write)
                .map(|c| c.revision),
        }
    }

    fn clear_writes(&mut self) {
        self.chains.iter_mut().for_each(|c| c.write = false);
        self.others.iter_mut().for_each(|c| c.write = false);
    }
}

/// A fixed chain: the render's own rules, every entry's, then the tail.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FixedChain {
    table: TableName,
    name: String,
    revision: u64,
    /// Rules, revision rule included.
    rules: u32,
    /// How many of them entries added.
    contributed: u32,
    /// In a [`Delta`]: the chain is (re)written.
    write: bool,
}

/// One family's cache: what the last successful sync left in the kernel.
#[derive(Debug, Default)]
pub(crate) struct FamilyCache {
    /// `None`: the family has no rules.
    context: Option<Context>,
    /// The fixed chains' own rules and the base jumps.
    base: FamilyRules,
    tail: Vec<TailRule>,
    /// By key, sorted: walked in step with the plan's entries (sorted by key too), so a
    /// sync looks nothing up.
    groups: Vec<(Box<str>, GroupState)>,
    fixed: Vec<FixedChain>,
    /// Rules in the groups' chains.
    own_rules: usize,
}

/// Hash of a group's entries (`hasher` is scratch space).
fn content_of(hasher: &mut ContentHasher, entries: &[&ServicePortPlan]) -> u64 {
    hasher.clear();
    hasher.write_usize(entries.len());
    for entry in entries {
        hash_entry(hasher, entry);
    }
    hasher.finish()
}

/// A group's state from its rendering (`content` is its hash).
fn summarize(rendered: &FamilyRules, base: &FamilyRules, content: u64) -> GroupState {
    let mut chains = Vec::new();
    let mut others = Vec::new();
    let mut shared = DefaultHasher::new();
    for table in TABLES {
        let fixed = &base.table(table).chains;
        for (name, rules) in &rendered.table(table).chains {
            if fixed.contains_key(name) {
                (slot(table), name, rules).hash(&mut shared);
                continue;
            }
            let revision = RevisionHasher::of(rules);
            let count = u32::try_from(rules.len() + 1).unwrap_or(u32::MAX);
            match ChainName::new(name) {
                ChainName::Hashed(h) => {
                    let (prefix, hash) = h.parts();
                    chains.push(OwnChain {
                        hash,
                        revision,
                        rules: count,
                        prefix,
                        table,
                        write: false,
                    });
                }
                ChainName::Other(name) => others.push(OtherChain {
                    table,
                    name,
                    revision,
                    rules: count,
                    write: false,
                }),
            }
        }
    }
    chains.sort_unstable_by_key(OwnChain::key);
    GroupState {
        content,
        shared: shared.finish(),
        chains: chains.into_boxed_slice(),
        others: others.into_boxed_slice(),
    }
}

/// The fixed chains of `base` with every entry's rules and the tail, hashed entry by
/// entry (only what entries add to them is rendered).
fn fixed_chains(
    base: &FamilyRules,
    tail: &[TailRule],
    inputs: &FamilyInputs<'_>,
    settings: &RenderSettings,
    family: IpFamily,
) -> Vec<FixedChain> {
    let mut hashers: Vec<(TableName, &str, RevisionHasher, u32)> = Vec::new();
    for table in TABLES {
        for (name, rules) in &base.table(table).chains {
            let mut hasher = RevisionHasher::new();
            rules.iter().for_each(|r| hasher.rule(r));
            hashers.push((table, name, hasher, 0));
        }
    }
    for entry in &inputs.entries {
        let rendered = render_entries(&[*entry], inputs, settings, family, false);
        for table in TABLES {
            for (name, rules) in &rendered.table(table).chains {
                if let Some((_, _, hasher, contributed)) = hashers
                    .iter_mut()
                    .find(|(t, n, _, _)| *t == table && n == name)
                {
                    rules.iter().for_each(|r| hasher.rule(r));
                    *contributed += u32::try_from(rules.len()).unwrap_or(u32::MAX);
                }
            }
        }
    }
    for (table, chain, rule) in tail {
        if let Some((_, _, hasher, _)) = hashers
            .iter_mut()
            .find(|(t, n, _, _)| t == table && n == chain)
        {
            hasher.rule(rule);
        }
    }
    hashers
        .into_iter()
        .map(|(table, name, hasher, contributed)| FixedChain {
            table,
            name: name.to_owned(),
            rules: u32::try_from(hasher.rules() + 1).unwrap_or(u32::MAX),
            revision: hasher.finish(),
            contributed,
            write: false,
        })
        .collect()
}

/// Whether the kernel holds `name` with this revision and rule count (and marks it seen).
fn kernel_has(
    kernel: &mut KernelFamily,
    table: TableName,
    name: &ChainName,
    revision: u64,
    rules: u32,
) -> bool {
    kernel
        .table_mut(table)
        .chains
        .see(name)
        .is_some_and(|c| c.revision == Some(revision) && c.rules == rules as usize)
}

/// A group of the plan whose state differs from the cache's (or must be written).
#[derive(Debug)]
struct Changed {
    /// Index into [`Delta::groups`].
    group: usize,
    /// Index of the cached group with the same key.
    cached: Option<usize>,
    /// Whether the entries differ from the cached ones (not only the kernel).
    content_changed: bool,
    state: GroupState,
}

/// What one sync changes in one family: computed by [`FamilyCache::diff`], written by
/// [`Delta::write_payload`], made the cache by [`FamilyCache::commit`].
#[derive(Debug)]
pub(crate) struct Delta<'p> {
    inputs: FamilyInputs<'p>,
    family: IpFamily,
    context: Option<Context>,
    base: FamilyRules,
    tail: Vec<TailRule>,
    /// The entries sorted by key (stable), and the groups of equal keys in it.
    order: Vec<&'p ServicePortPlan>,
    groups: Vec<(usize, usize)>,
    /// Groups rendered or to write, in key order: their new state, with the chains to
    /// write marked.
    changed: Vec<Changed>,
    /// Cached groups no longer in the plan (indices into the cache, ascending).
    gone: Vec<usize>,
    fixed: Vec<FixedChain>,
    /// Chains to flush, per table, and whether to delete them too (not when a chain the
    /// agent does not own jumps to them).
    remove: [Vec<(ChainName, bool)>; 2],
    /// Per table: jumps to delete by number and to insert (see [`jump_changes`]).
    jumps: [JumpChanges; 2],
    positions_fresh: [bool; 2],
    own_rules: usize,
}

impl FamilyCache {
    /// The changes that bring the kernel to the entries of `inputs` (none: nothing at
    /// all). With `in_sync`, the kernel holds exactly what this cache describes (its
    /// chains are not consulted); otherwise `kernel` was just read.
    pub(crate) fn diff<'p>(
        &self,
        inputs: FamilyInputs<'p>,
        settings: &RenderSettings,
        family: IpFamily,
        kernel: &mut KernelFamily,
        in_sync: bool,
    ) -> Delta<'p> {
        if !in_sync {
            kernel.filter.chains.clear_seen();
            kernel.nat.chains.clear_seen();
        }
        let context = (!inputs.entries.is_empty()).then(|| {
            (
                settings.clone(),
                inputs.local_cidr.clone(),
                inputs.node_addresses.clone(),
            )
        });
        let context_changed = context != self.context;
        let (base, tail) = match &context {
            None => (FamilyRules::default(), Vec::new()),
            Some(_) if context_changed => {
                (base_rules(settings, family), tail_rules(settings, family))
            }
            Some(_) => (self.base.clone(), self.tail.clone()),
        };
        // A merged plan is sorted by key, one entry a key; anything else is grouped here
        // and re-hashes the fixed chains every time.
        let sorted = inputs.entries.windows(2).all(|w| w[0].key < w[1].key);
        let mut order = inputs.entries.clone();
        if !sorted {
            order.sort_by(|a, b| a.key.cmp(&b.key));
        }
        let mut groups = Vec::new();
        let mut start = 0;
        for i in 1..=order.len() {
            if i == order.len() || order[i].key != order[start].key {
                groups.push((start, i));
                start = i;
            }
        }
        let mut delta = Delta {
            inputs,
            family,
            context,
            base,
            tail,
            order,
            groups,
            changed: Vec::new(),
            gone: Vec::new(),
            fixed: Vec::new(),
            remove: [Vec::new(), Vec::new()],
            jumps: [(Vec::new(), Vec::new()), (Vec::new(), Vec::new())],
            positions_fresh: [false, false],
            own_rules: 0,
        };
        let mut shared_dirty = context_changed || !sorted;
        let mut hasher = ContentHasher::default();
        // The cache and the groups are both in key order: `next` is the first cached
        // group not matched yet.
        let mut next = 0;
        for (index, &(a, b)) in delta.groups.iter().enumerate() {
            let entries = &delta.order[a..b];
            let content = content_of(&mut hasher, entries);
            // The content hash covers the key: equal hashes, same key (no need to look).
            let same_content = self
                .groups
                .get(next)
                .is_some_and(|(_, o)| o.content == content);
            let cached = if same_content {
                next += 1;
                Some(next - 1)
            } else {
                let key = entries[0].key.as_str();
                while self.groups.get(next).is_some_and(|(k, _)| &**k < key) {
                    delta.gone.push(next);
                    next += 1;
                }
                let same = self.groups.get(next).is_some_and(|(k, _)| &**k == key);
                next += usize::from(same);
                same.then(|| next - 1)
            };
            let old = cached.map(|i| &self.groups[i].1);
            let unchanged = !context_changed && old.is_some_and(|o| o.content == content);
            if unchanged {
                if !in_sync
                    && let Some(old) = old
                    && let Some(state) = Self::stale_in_kernel(old, kernel)
                {
                    delta.changed.push(Changed {
                        group: index,
                        cached,
                        content_changed: false,
                        state,
                    });
                }
                continue;
            }
            let rendered = render_entries(entries, &delta.inputs, settings, family, true);
            let mut state = summarize(&rendered, &delta.base, content);
            drop(rendered);
            let held = |table, name: &ChainName, revision, rules, kernel: &mut KernelFamily| {
                if in_sync {
                    old.and_then(|o| o.find(table, name)) == Some((revision, rules))
                } else {
                    kernel_has(kernel, table, name, revision, rules)
                }
            };
            for c in state.chains.iter_mut() {
                let name = ChainName::Hashed(c.name());
                c.write = !held(c.table, &name, c.revision, c.rules, kernel);
            }
            for c in state.others.iter_mut() {
                let name = ChainName::Other(c.name.clone());
                c.write = !held(c.table, &name, c.revision, c.rules, kernel);
            }
            if in_sync && let Some(old) = old {
                for (table, name) in old.names() {
                    if state.find(table, &name).is_none() {
                        delta.remove[slot(table)].push((name, true));
                    }
                }
            }
            shared_dirty |= old.is_none_or(|o| o.shared != state.shared);
            delta.changed.push(Changed {
                group: index,
                cached,
                content_changed: old.is_none_or(|o| o.content != content),
                state,
            });
        }
        delta.gone.extend(next..self.groups.len());
        if !delta.gone.is_empty() {
            shared_dirty = true;
            if in_sync {
                for &i in &delta.gone {
                    for (table, name) in self.groups[i].1.names() {
                        delta.remove[slot(table)].push((name, true));
                    }
                }
            }
        }
        delta.fixed = if shared_dirty {
            fixed_chains(&delta.base, &delta.tail, &delta.inputs, settings, family)
        } else {
            self.fixed.clone()
        };
        for f in &mut delta.fixed {
            let held = if in_sync {
                self.fixed.iter().any(|o| {
                    o.table == f.table
                        && o.name == f.name
                        && o.revision == f.revision
                        && o.rules == f.rules
                })
            } else {
                kernel_has(
                    kernel,
                    f.table,
                    &ChainName::new(&f.name),
                    f.revision,
                    f.rules,
                )
            };
            f.write = !held;
        }
        if in_sync {
            for o in &self.fixed {
                if !delta
                    .fixed
                    .iter()
                    .any(|f| f.table == o.table && f.name == o.name)
                {
                    delta.remove[slot(o.table)].push((ChainName::new(&o.name), true));
                }
            }
        } else {
            for table in TABLES {
                let held = kernel.table(table);
                for (name, chain) in held.chains.unseen() {
                    // Already flushed, and someone else's chain still jumps to it.
                    let parked =
                        chain.rules == 0 && name.with_text(|t| held.foreign_refs.contains(t));
                    if !parked {
                        delta.remove[slot(table)].push((name, true));
                    }
                }
            }
        }
        for table in TABLES {
            let held = kernel.table(table);
            let list = &mut delta.remove[slot(table)];
            list.sort_unstable_by(|a, b| a.0.cmp_text(&b.0));
            list.dedup_by(|a, b| a.0 == b.0);
            for (name, delete) in list.iter_mut() {
                *delete = !name.with_text(|t| held.foreign_refs.contains(t));
            }
            let (deletes, inserts) = jump_changes(&delta.base.table(table).base_jumps, &held.jumps);
            let inserts = inserts.into_iter().cloned().collect();
            delta.jumps[slot(table)] = (deletes, inserts);
            delta.positions_fresh[slot(table)] = held.positions_fresh;
        }
        let mut own = self.own_rules;
        for changed in &delta.changed {
            if let Some(i) = changed.cached {
                own = own.saturating_sub(self.groups[i].1.rules());
            }
            own += changed.state.rules();
        }
        for &i in &delta.gone {
            own = own.saturating_sub(self.groups[i].1.rules());
        }
        delta.own_rules = own;
        delta
    }

    /// An unchanged group whose chains the kernel does not hold as cached: a copy with
    /// those marked for writing.
    fn stale_in_kernel(old: &GroupState, kernel: &mut KernelFamily) -> Option<GroupState> {
        let mut state: Option<GroupState> = None;
        for (i, c) in old.chains.iter().enumerate() {
            let name = ChainName::Hashed(c.name());
            if !kernel_has(kernel, c.table, &name, c.revision, c.rules) {
                state.get_or_insert_with(|| old.clone()).chains[i].write = true;
            }
        }
        for (i, c) in old.others.iter().enumerate() {
            let name = ChainName::Other(c.name.clone());
            if !kernel_has(kernel, c.table, &name, c.revision, c.rules) {
                state.get_or_insert_with(|| old.clone()).others[i].write = true;
            }
        }
        state
    }

    /// Makes `delta` the cache, and `kernel` what the kernel holds once its payload was
    /// restored: the kernel's chains are no longer tracked (they are the cache's).
    pub(crate) fn commit(&mut self, delta: Delta<'_>, kernel: &mut KernelFamily) {
        for table in TABLES {
            let (deletes, inserts) = &delta.jumps[slot(table)];
            let inserts: Vec<&BaseJump> = inserts.iter().collect();
            let held = kernel.table_mut(table);
            apply_jumps(held, deletes, &inserts);
            held.chains = KernelChains::default();
        }
        if delta.context.is_none() {
            *self = Self::default();
            return;
        }
        let inserts = delta.changed.iter().any(|c| c.cached.is_none());
        if !inserts && delta.gone.is_empty() {
            for mut changed in delta.changed {
                changed.state.clear_writes();
                if let Some(i) = changed.cached {
                    self.groups[i].1 = changed.state;
                }
            }
        } else {
            // Entries came or went: merge the kept and the new groups, both in key order.
            let mut replaced: Vec<Option<GroupState>> = vec![None; self.groups.len()];
            let mut added: Vec<(Box<str>, GroupState)> = Vec::new();
            for mut changed in delta.changed {
                changed.state.clear_writes();
                match changed.cached {
                    Some(i) => replaced[i] = Some(changed.state),
                    None => {
                        let (a, _) = delta.groups[changed.group];
                        added.push((delta.order[a].key.as_str().into(), changed.state));
                    }
                }
            }
            let mut gone = delta.gone.iter().peekable();
            let kept = std::mem::take(&mut self.groups)
                .into_iter()
                .zip(replaced)
                .enumerate()
                .filter(|(i, _)| {
                    let leaving = gone.peek() == Some(&i);
                    if leaving {
                        gone.next();
                    }
                    !leaving
                })
                .map(|(_, ((key, state), new))| (key, new.unwrap_or(state)));
            let mut merged = Vec::with_capacity(kept.size_hint().0 + added.len());
            let mut added = added.into_iter().peekable();
            for group in kept {
                while added.peek().is_some_and(|(k, _)| *k < group.0) {
                    merged.extend(added.next());
                }
                merged.push(group);
            }
            merged.extend(added);
            self.groups = merged;
        }
        self.fixed = delta.fixed;
        self.fixed.iter_mut().for_each(|f| f.write = false);
        self.base = delta.base;
        self.tail = delta.tail;
        self.context = delta.context;
        self.own_rules = delta.own_rules;
    }

    /// Rules of the family, as [`FamilyRules::rule_count`] counts them.
    pub(crate) fn rule_count(&self) -> usize {
        self.own_rules
            + self.fixed.iter().map(|f| f.rules as usize).sum::<usize>()
            + self.base.filter.base_jumps.len()
            + self.base.nat.base_jumps.len()
    }

    /// Every chain the cache describes: (table, name, revision, rules with the revision
    /// rule).
    pub(crate) fn chains(&self) -> Vec<(TableName, String, u64, usize)> {
        let mut out: Vec<(TableName, String, u64, usize)> = self
            .fixed
            .iter()
            .map(|f| (f.table, f.name.clone(), f.revision, f.rules as usize))
            .collect();
        for (_, state) in &self.groups {
            for c in state.chains.iter() {
                out.push((c.table, c.name().to_string(), c.revision, c.rules as usize));
            }
            for c in state.others.iter() {
                out.push((c.table, c.name.to_string(), c.revision, c.rules as usize));
            }
        }
        out.sort();
        out
    }
}

fn line(out: &mut dyn Write, parts: &[&str]) -> io::Result<()> {
    for part in parts {
        out.write_all(part.as_bytes())?;
    }
    out.write_all(b"\n")
}

fn revision_line(out: &mut dyn Write, chain: &str, revision: u64) -> io::Result<()> {
    line(
        out,
        &[
            "-A ",
            chain,
            " -m comment --comment \"",
            REVISION_PREFIX,
            &revision_text(revision),
            "\"",
        ],
    )
}

impl<'p> Delta<'p> {
    /// The inputs the delta was computed from.
    pub(crate) fn into_inputs(self) -> FamilyInputs<'p> {
        self.inputs
    }

    fn settings(&self) -> RenderSettings {
        self.context
            .as_ref()
            .map(|(settings, _, _)| settings.clone())
            .unwrap_or_default()
    }

    fn table_changes(&self, table: TableName) -> usize {
        let i = slot(table);
        self.fixed
            .iter()
            .filter(|f| f.write && f.table == table)
            .count()
            + self
                .changed
                .iter()
                .map(|Changed { state: s, .. }| {
                    s.chains
                        .iter()
                        .filter(|c| c.write && c.table == table)
                        .count()
                        + s.others
                            .iter()
                            .filter(|c| c.write && c.table == table)
                            .count()
                })
                .sum::<usize>()
            + self.remove[i].len()
            + self.jumps[i].0.len()
            + self.jumps[i].1.len()
    }

    /// The entries that changed, came or went since `cache` (which the delta was
    /// computed from).
    pub(crate) fn entry_changes(&self, cache: &FamilyCache) -> Vec<EntryChange<'p>> {
        let mut out: Vec<EntryChange<'p>> = self
            .changed
            .iter()
            .filter(|c| c.content_changed)
            .map(|c| {
                let (a, b) = self.groups[c.group];
                let entries: Vec<&'p ServicePortPlan> = self.order[a..b].to_vec();
                let first: &'p ServicePortPlan = self.order[a];
                EntryChange {
                    key: Cow::Borrowed(first.key.as_str()),
                    entries,
                }
            })
            .collect();
        out.extend(self.gone.iter().filter_map(|i| {
            cache.groups.get(*i).map(|(key, _)| EntryChange {
                key: Cow::Owned(key.to_string()),
                entries: Vec::new(),
            })
        }));
        out
    }

    /// Chains written or removed plus jumps inserted or deleted.
    pub(crate) fn changes(&self) -> usize {
        TABLES.iter().map(|t| self.table_changes(*t)).sum()
    }

    /// Chains written or removed.
    fn chain_changes(&self) -> usize {
        self.changes()
            - self
                .jumps
                .iter()
                .map(|(d, i)| d.len() + i.len())
                .sum::<usize>()
    }

    /// Whether rules are deleted by number from positions not read during this sync.
    pub(crate) fn needs_fresh_positions(&self) -> bool {
        (0..2).any(|i| !self.jumps[i].0.is_empty() && !self.positions_fresh[i])
    }

    /// Rules of the family once the delta is applied.
    pub(crate) fn rule_count(&self) -> usize {
        self.own_rules
            + self.fixed.iter().map(|f| f.rules as usize).sum::<usize>()
            + self.base.filter.base_jumps.len()
            + self.base.nat.base_jumps.len()
    }

    /// Writes the `iptables-restore --noflush` input: one section per changed table,
    /// every chain written or removed declared first (in name order), then the jumps,
    /// the rules (the fixed chains' last), and the deletions.
    ///
    /// # Errors
    /// When `out` fails.
    pub(crate) fn write_payload(&self, out: &mut dyn Write) -> io::Result<()> {
        let settings = self.settings();
        for table in TABLES {
            if self.table_changes(table) == 0 {
                continue;
            }
            let i = slot(table);
            line(out, &["*", table.as_str()])?;
            self.write_declarations(out, table)?;
            let (deletes, inserts) = &self.jumps[i];
            for (chain, position) in deletes {
                line(out, &["-D ", chain, " ", &position.to_string()])?;
            }
            for jump in inserts {
                line(out, &["-I ", jump.chain, " 1 ", &jump.rule])?;
            }
            // The fixed chains jump to the others: filled last, as iptables-nft prefers
            // (about 8 % faster for a first sync than the other way round).
            for Changed { group, state, .. } in &self.changed {
                if state.writes_in(table) {
                    self.write_group(out, table, *group, state, &settings)?;
                }
            }
            for f in self.fixed.iter().filter(|f| f.write && f.table == table) {
                self.write_fixed(out, f, &settings)?;
            }
            for (name, delete) in &self.remove[i] {
                if *delete {
                    name.with_text(|text| line(out, &["-X ", text]))?;
                }
            }
            line(out, &["COMMIT"])?;
        }
        Ok(())
    }

    /// Declares every chain written or removed in `table`, in name order: iptables-nft
    /// keeps its chains sorted and inserts new ones from the end, so declaring 150,000
    /// chains in any other order takes three times as long. The hashed-name chains
    /// (nearly all) are sorted as 8-byte references; the removed ones are sorted already.
    fn write_declarations(&self, out: &mut dyn Write, table: TableName) -> io::Result<()> {
        let hashed_at = |(group, chain): (u32, u32)| -> HashedName {
            self.changed[group as usize].state.chains[chain as usize].name()
        };
        let mut hashed: Vec<(u32, u32)> = Vec::new();
        for (group, Changed { state, .. }) in self.changed.iter().enumerate() {
            for (chain, c) in state.chains.iter().enumerate() {
                if c.write
                    && c.table == table
                    && let (Ok(group), Ok(chain)) = (u32::try_from(group), u32::try_from(chain))
                {
                    hashed.push((group, chain));
                }
            }
        }
        hashed.sort_unstable_by_key(|at| hashed_at(*at).text_key());
        let mut others: Vec<ChainName> = self
            .fixed
            .iter()
            .filter(|f| f.write && f.table == table)
            .map(|f| ChainName::new(&f.name))
            .collect();
        for Changed { state, .. } in &self.changed {
            others.extend(
                state
                    .others
                    .iter()
                    .filter(|c| c.write && c.table == table)
                    .map(|c| ChainName::Other(c.name.clone())),
            );
        }
        others.sort_unstable_by(ChainName::cmp_text);
        let removed = &self.remove[slot(table)];
        let (mut h, mut o, mut r) = (0, 0, 0);
        loop {
            let next_hashed = hashed.get(h).map(|at| ChainName::Hashed(hashed_at(*at)));
            let mut best: Option<(&ChainName, usize)> = next_hashed.as_ref().map(|n| (n, 0));
            for (candidate, source) in [(others.get(o), 1), (removed.get(r).map(|(n, _)| n), 2)] {
                if let Some(name) = candidate
                    && best.is_none_or(|(b, _)| name.cmp_text(b).is_lt())
                {
                    best = Some((name, source));
                }
            }
            let Some((name, source)) = best else {
                return Ok(());
            };
            name.with_text(|text| line(out, &[":", text, " - [0:0]"]))?;
            match source {
                0 => h += 1,
                1 => o += 1,
                _ => r += 1,
            }
        }
    }

    fn write_fixed(
        &self,
        out: &mut dyn Write,
        chain: &FixedChain,
        settings: &RenderSettings,
    ) -> io::Result<()> {
        let name = chain.name.as_str();
        revision_line(out, name, chain.revision)?;
        if let Some(rules) = self.base.table(chain.table).chains.get(name) {
            for rule in rules {
                line(out, &["-A ", name, " ", rule])?;
            }
        }
        if chain.contributed > 0 {
            for entry in &self.inputs.entries {
                let rendered =
                    render_entries(&[*entry], &self.inputs, settings, self.family, false);
                if let Some(rules) = rendered.table(chain.table).chains.get(name) {
                    for rule in rules {
                        line(out, &["-A ", name, " ", rule])?;
                    }
                }
            }
        }
        for (table, tail_chain, rule) in &self.tail {
            if *table == chain.table && *tail_chain == name {
                line(out, &["-A ", name, " ", rule])?;
            }
        }
        Ok(())
    }

    fn write_group(
        &self,
        out: &mut dyn Write,
        table: TableName,
        index: usize,
        state: &GroupState,
        settings: &RenderSettings,
    ) -> io::Result<()> {
        let (a, b) = self.groups[index];
        let rendered = render_entries(&self.order[a..b], &self.inputs, settings, self.family, true);
        let fixed = &self.base.table(table).chains;
        for (name, rules) in &rendered.table(table).chains {
            if fixed.contains_key(name) {
                continue;
            }
            let Some(revision) = state.written(table, &ChainName::new(name)) else {
                continue;
            };
            revision_line(out, name, revision)?;
            for rule in rules {
                line(out, &["-A ", name, " ", rule])?;
            }
        }
        Ok(())
    }
}

/// [`render`](super::render()) kept up to date across plans without its text: the
/// chains, revisions and rule counts a sync leaves in the kernel, per family. Each
/// [`RenderCache::update`] re-renders only the entries that changed (plus one pass over
/// what entries add to the fixed chains, when that changed).
#[derive(Debug, Default)]
pub struct RenderCache {
    families: [FamilyCache; 2],
}

/// One chain a [`RenderCache`] describes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct CachedChain {
    /// Its table.
    pub table: TableName,
    /// Its name.
    pub name: String,
    /// Its revision, as [`crate::ruleset::TableRules::revision`] writes it.
    pub revision: String,
    /// Its rules, revision rule included.
    pub rules: usize,
}

impl RenderCache {
    /// Brings the cache to `plan` as a successful sync does; returns how many chains each
    /// family (`[v4, v6]`) writes or removes.
    pub fn update(&mut self, plan: &MergedPlan, settings: &RenderSettings) -> [usize; 2] {
        let mut changed = [0; 2];
        for (i, family) in [Family::V4, Family::V6].into_iter().enumerate() {
            let ip = ip_family(family);
            let cache = &mut self.families[i];
            let mut kernel = KernelFamily::default();
            let delta = cache.diff(FamilyInputs::of(plan, ip), settings, ip, &mut kernel, true);
            changed[i] = delta.chain_changes();
            cache.commit(delta, &mut kernel);
        }
        changed
    }

    /// Every chain of one family, sorted.
    #[must_use]
    pub fn chains(&self, family: Family) -> Vec<CachedChain> {
        let cache = &self.families[usize::from(family == Family::V6)];
        cache
            .chains()
            .into_iter()
            .map(|(table, name, revision, rules)| CachedChain {
                table,
                name,
                revision: revision_text(revision),
                rules,
            })
            .collect()
    }

    /// Rules of one family, as [`FamilyRules::rule_count`] counts them.
    #[must_use]
    pub fn rule_count(&self, family: Family) -> usize {
        self.families[usize::from(family == Family::V6)].rule_count()
    }

    /// Forgets everything (the next update renders from scratch).
    pub fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_records_stay_small() {
        assert_eq!(std::mem::size_of::<OwnChain>(), 24);
    }
}
