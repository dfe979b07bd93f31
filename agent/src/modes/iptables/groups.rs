//! What the iptables mode's render cache remembers per group of plan entries (one key)
//! and per fixed chain, without rule text: each chain's name, revision and rule count.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::IpAddr;

use proxyplan_crds::{IpFamily, ServicePortPlan};

use crate::kernel::family::Family;

use super::render::{FamilyInputs, render_entries};
use super::settings::RenderSettings;
use crate::ruleset::LocalMatch;
use crate::ruleset::hash::{ContentHasher, RevisionHasher, hash_entry};
use crate::ruleset::names::{ChainName, HashedName};
use crate::ruleset::rules::{BaseJump, FamilyRules, TableName};
use crate::ruleset::save::KernelFamily;

/// Node-local inputs of the rendering; a change re-renders everything.
pub(super) type Context = (RenderSettings, Option<LocalMatch>, Vec<IpAddr>);

/// A rule appended to a fixed chain after every entry's.
pub(super) type TailRule = (TableName, &'static str, String);

/// Jumps in built-in chains to delete (chain, position) and to insert.
pub(super) type JumpChanges = (Vec<(String, usize)>, Vec<BaseJump>);

pub(super) const TABLES: [TableName; 2] = [TableName::Filter, TableName::Nat];

pub(super) fn slot(table: TableName) -> usize {
    match table {
        TableName::Filter => 0,
        TableName::Nat => 1,
    }
}

/// A chain an entry owns whose name is a [`HashedName`] (all of them, as rendered today):
/// 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct OwnChain {
    pub(super) hash: u64,
    pub(super) revision: u64,
    /// Rules, revision rule included.
    pub(super) rules: u32,
    pub(super) prefix: u8,
    pub(super) table: TableName,
    /// In a [`Delta`]: the chain is (re)written.
    pub(super) write: bool,
}

impl OwnChain {
    pub(super) fn name(&self) -> HashedName {
        HashedName::from_parts(self.prefix, self.hash)
    }

    pub(super) fn key(&self) -> (TableName, u8, u64) {
        (self.table, self.prefix, self.hash)
    }
}

/// A chain an entry owns under any other name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct OtherChain {
    pub(super) table: TableName,
    pub(super) name: Box<str>,
    pub(super) revision: u64,
    pub(super) rules: u32,
    pub(super) write: bool,
}

/// What the cache holds for the entries sharing one key (one entry in any valid plan).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GroupState {
    /// Hash of the entries.
    pub(super) content: u64,
    /// Hash of what they add to the fixed chains.
    pub(super) shared: u64,
    /// Their chains, sorted by [`OwnChain::key`].
    pub(super) chains: Box<[OwnChain]>,
    pub(super) others: Box<[OtherChain]>,
}

impl GroupState {
    /// Revision and rule count of one of the chains.
    pub(super) fn find(&self, table: TableName, name: &ChainName) -> Option<(u64, u32)> {
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
    pub(super) fn names(&self) -> impl Iterator<Item = (TableName, ChainName)> + '_ {
        self.chains
            .iter()
            .map(|c| (c.table, ChainName::Hashed(c.name())))
            .chain(
                self.others
                    .iter()
                    .map(|c| (c.table, ChainName::Other(c.name.clone()))),
            )
    }

    pub(super) fn rules(&self) -> usize {
        self.chains.iter().map(|c| c.rules as usize).sum::<usize>()
            + self.others.iter().map(|c| c.rules as usize).sum::<usize>()
    }

    pub(super) fn writes_in(&self, table: TableName) -> bool {
        self.chains.iter().any(|c| c.write && c.table == table)
            || self.others.iter().any(|c| c.write && c.table == table)
    }

    /// The revision of a chain to write.
    pub(super) fn written(&self, table: TableName, name: &ChainName) -> Option<u64> {
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

    pub(super) fn clear_writes(&mut self) {
        self.chains.iter_mut().for_each(|c| c.write = false);
        self.others.iter_mut().for_each(|c| c.write = false);
    }
}

/// A fixed chain: the render's own rules, every entry's, then the tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FixedChain {
    pub(super) table: TableName,
    pub(super) name: String,
    pub(super) revision: u64,
    /// Rules, revision rule included.
    pub(super) rules: u32,
    /// How many of them entries added.
    pub(super) contributed: u32,
    /// In a [`Delta`]: the chain is (re)written.
    pub(super) write: bool,
}

/// Hash of a group's entries (`hasher` is scratch space).
pub(super) fn content_of(hasher: &mut ContentHasher, entries: &[&ServicePortPlan]) -> u64 {
    hasher.clear();
    hasher.write_usize(entries.len());
    for entry in entries {
        hash_entry(hasher, entry);
    }
    hasher.finish()
}

/// A group's state from its rendering (`content` is its hash).
pub(super) fn summarize(rendered: &FamilyRules, base: &FamilyRules, content: u64) -> GroupState {
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
pub(super) fn fixed_chains(
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
pub(super) fn kernel_has(
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
pub(super) struct Changed {
    /// Index into [`Delta::groups`].
    pub(super) group: usize,
    /// Index of the cached group with the same key.
    pub(super) cached: Option<usize>,
    /// Whether the entries differ from the cached ones (not only the kernel).
    pub(super) content_changed: bool,
    pub(super) state: GroupState,
}

/// The plan's name for `family`.
pub(super) fn ip_family(family: Family) -> IpFamily {
    match family {
        Family::V4 => IpFamily::IPv4,
        Family::V6 => IpFamily::IPv6,
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
