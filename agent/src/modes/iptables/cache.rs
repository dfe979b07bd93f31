//! What the iptables mode remembers between syncs, without keeping rule text: per service
//! port entry, a hash of the entry and the name, revision and rule count of each chain it
//! owns (24 bytes a chain); per fixed chain (`PROXYPLAN-SERVICES`, ...), its revision and
//! rule count.
//!
//! A sync is two passes over the plan, both entry by entry:
//!
//! 1. `FamilyCache::diff` hashes every entry and renders only those that differ from
//!    the cache (all of them on the first sync), compares their chains with what the
//!    kernel holds, and notes which chains to write or remove: a `Delta`, no text.
//!    Right after the kernel was read (first sync, periodic resync, canary, failed
//!    restore) the comparison is against the chains read; otherwise the kernel holds
//!    exactly what the cache describes, so it is against the cache.
//! 2. `Delta::write_payload` renders the entries with chains to write again and streams
//!    the `iptables-restore --noflush` text, so the payload is never held either.
//!
//! `FamilyCache::commit` then makes the delta the new cache. The fixed chains collect a
//! rule or two from every entry: they are re-hashed (and rewritten) only when an entry's
//! part of them changed or entries came or went.
//!
//! The records kept per group are in `groups.rs`, the delta and its payload in
//! `delta.rs`.

use std::borrow::Cow;
use std::iter::Peekable;

use proxyplan_crds::{IpFamily, MergedPlan, ServicePortPlan};

use super::delta::Delta;
use super::groups::{
    Changed, Context, FixedChain, GroupState, TABLES, TailRule, content_of, fixed_chains,
    ip_family, kernel_has, slot, summarize,
};
use super::render::{FamilyInputs, base_rules, render_entries, tail_rules};
use super::settings::RenderSettings;
use crate::conntrack::EntryChange;
use crate::kernel::family::Family;
use crate::ruleset::diff::{apply_jumps, jump_changes};
use crate::ruleset::hash::{ContentHasher, revision_text};
use crate::ruleset::names::ChainName;
use crate::ruleset::rules::{BaseJump, FamilyRules, TableName};
use crate::ruleset::save::{ChainsDigest, KernelChains, KernelFamily};

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
        let settings = &*settings.resolved(&inputs.node_addresses);
        let context = (!inputs.entries.is_empty()).then(|| {
            (
                settings.clone(),
                inputs.local.clone(),
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
        // A first sync changes every group: sized once, not grown by doubling.
        let changed = if self.groups.is_empty() {
            Vec::with_capacity(groups.len())
        } else {
            Vec::new()
        };
        let mut delta = Delta {
            inputs,
            family,
            context,
            base,
            tail,
            order,
            groups,
            changed,
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

    /// Every chain the last successful sync left: (table, name as the kernel's reader
    /// names it, revision, rules with the revision rule).
    fn owned_chains(&self) -> impl Iterator<Item = (TableName, ChainName, u64, u32)> + '_ {
        self.groups
            .iter()
            .flat_map(|(_, g)| {
                g.chains
                    .iter()
                    .map(|c| (c.table, ChainName::Hashed(c.name()), c.revision, c.rules))
                    .chain(
                        g.others
                            .iter()
                            .map(|c| (c.table, ChainName::new(&c.name), c.revision, c.rules)),
                    )
            })
            .chain(
                self.fixed
                    .iter()
                    .map(|f| (f.table, ChainName::new(&f.name), f.revision, f.rules)),
            )
    }

    /// Whether `kernel`, read as a summary ([`crate::ruleset::tables::Tables::read_family_summary`]),
    /// holds exactly what the last successful sync left: the same owned chains (by
    /// digest) and the same jumps from built-in chains. False also when the summary
    /// cannot tell (an empty owned chain): a full read and [`FamilyCache::difference`]
    /// then say what differs.
    pub(crate) fn matches_summary(&self, kernel: &KernelFamily) -> bool {
        if self.context.is_none() {
            return true;
        }
        let mut expected = [ChainsDigest::default(); 2];
        for (table, name, revision, rules) in self.owned_chains() {
            expected[slot(table)].add(&name, Some(revision), rules as usize);
        }
        TABLES.iter().all(|&table| {
            let held = kernel.table(table);
            let (deletes, inserts) = jump_changes(&self.base.table(table).base_jumps, &held.jumps);
            held.summary
                .is_some_and(|s| s.complete && s.digest == expected[slot(table)])
                && deletes.is_empty()
                && inserts.is_empty()
        })
    }

    /// The first way `kernel` (just read) differs from what the last successful sync
    /// left, as this cache describes it; `None` when it holds exactly that. What it
    /// notices: an owned chain missing, flushed, with a rule added or removed, or
    /// rewritten (its revision rule); an owned chain the cache does not have (unless
    /// flushed and still referenced by someone else's chain); a jump from a built-in
    /// chain missing, moved out of order, altered or added.
    pub(crate) fn difference(&self, kernel: &mut KernelFamily) -> Option<String> {
        // Nothing synced yet: nothing to compare with.
        self.context.as_ref()?;
        kernel.filter.chains.clear_seen();
        kernel.nat.chains.clear_seen();
        for (table, name, revision, rules) in self.owned_chains() {
            if !kernel_has(kernel, table, &name, revision, rules) {
                let found = kernel.table(table).chains.get_name(&name);
                return Some(match found {
                    None => format!("{} chain {name} is missing", table.as_str()),
                    Some(c) if c.revision != Some(revision) => format!(
                        "{} chain {name} lost its revision rule (flushed or rewritten)",
                        table.as_str()
                    ),
                    Some(c) => format!(
                        "{} chain {name} has {} rules instead of {rules}",
                        table.as_str(),
                        c.rules
                    ),
                });
            }
        }
        for table in TABLES {
            let held = kernel.table(table);
            let stray = held.chains.unseen().find(|(name, chain)| {
                !(chain.rules == 0 && name.with_text(|t| held.foreign_refs.contains(t)))
            });
            if let Some((name, _)) = stray {
                return Some(format!(
                    "{} chain {name} is not one the agent wrote",
                    table.as_str()
                ));
            }
            let (deletes, inserts) = jump_changes(&self.base.table(table).base_jumps, &held.jumps);
            if let Some(jump) = inserts.first() {
                return Some(format!(
                    "{} chain {} lacks the jump {:?} (or holds the agent's jumps out of order)",
                    table.as_str(),
                    jump.chain,
                    jump.rule
                ));
            }
            if let Some((chain, position)) = deletes.first() {
                return Some(format!(
                    "{} chain {chain} has a jump to the agent's chains it should not (rule {position})",
                    table.as_str()
                ));
            }
        }
        None
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
            // Entries came or went: merge the kept and the changed groups, both in key
            // order, in one pass and without a list of the new ones beside them.
            let inserted = delta.changed.iter().filter(|c| c.cached.is_none()).count();
            let old = std::mem::take(&mut self.groups);
            let mut merged = Vec::with_capacity(old.len() - delta.gone.len() + inserted);
            let mut old = old.into_iter().enumerate().peekable();
            let mut gone = delta.gone.iter().copied().peekable();
            for mut changed in delta.changed {
                changed.state.clear_writes();
                let (a, _) = delta.groups[changed.group];
                let key = delta.order[a].key.as_str();
                match changed.cached {
                    Some(at) => {
                        keep_until(&mut old, &mut gone, &mut merged, |i, _| i >= at);
                        // The cached group itself, replaced.
                        if let Some((_, (key, _))) = old.next() {
                            merged.push((key, changed.state));
                        }
                    }
                    None => {
                        keep_until(&mut old, &mut gone, &mut merged, |_, k| k >= key);
                        merged.push((key.into(), changed.state));
                    }
                }
            }
            keep_until(&mut old, &mut gone, &mut merged, |_, _| false);
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

    /// The entries that changed, came or went in `delta` (computed from this cache).
    pub(crate) fn entry_changes<'p>(&self, delta: &Delta<'p>) -> Vec<EntryChange<'p>> {
        let mut out: Vec<EntryChange<'p>> = delta
            .changed
            .iter()
            .filter(|c| c.content_changed)
            .map(|c| {
                let (a, b) = delta.groups[c.group];
                let entries: Vec<&'p ServicePortPlan> = delta.order[a..b].to_vec();
                let first: &'p ServicePortPlan = delta.order[a];
                EntryChange {
                    key: Cow::Borrowed(first.key.as_str()),
                    entries,
                }
            })
            .collect();
        out.extend(delta.gone.iter().filter_map(|i| {
            self.groups.get(*i).map(|(key, _)| EntryChange {
                key: Cow::Owned(key.to_string()),
                entries: Vec::new(),
            })
        }));
        out
    }
}

/// Moves the cached groups (with their indices) before the first one `stop` picks to
/// `merged`, leaving out those `gone` lists (ascending).
fn keep_until(
    old: &mut Peekable<impl Iterator<Item = (usize, (Box<str>, GroupState))>>,
    gone: &mut Peekable<impl Iterator<Item = usize>>,
    merged: &mut Vec<(Box<str>, GroupState)>,
    stop: impl Fn(usize, &str) -> bool,
) {
    while let Some((i, group)) = old.next_if(|(i, (key, _))| !stop(*i, key)) {
        if gone.next_if_eq(&i).is_none() {
            merged.push(group);
        }
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
