//! The iptables applier's kernel model: what the kernel holds of the agent's chains (read
//! from `iptables-save`, line by line), and a text-based diff of desired rules against it
//! with the `iptables-restore --noflush` text that applies the difference (used for small
//! fixed rule sets; the iptables mode's own rules go through [`super::cache`], which
//! does the same without keeping rule text).
//!
//! Chains are compared by the revision rule each of them starts with, never by their rule
//! syntax (which the nft and legacy back ends print differently): a chain is rewritten
//! when its revision or its rule count differs, and not mentioned at all otherwise.
//! Built-in chains are never flushed; the agent only inserts and deletes its own jumps in
//! them.

use std::collections::{BTreeMap, BTreeSet};

use super::hash::{RevisionHasher, parse_revision, revision_text};
use super::names::{ChainName, HashedName};
use super::{BaseJump, FamilyRules, REVISION_PREFIX, TableName, TableRules, names};
use crate::kernel::iptables::split_words;

/// One owned chain as the kernel holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnedChain {
    /// The revision in the chain's first rule, when that rule is a revision rule.
    pub revision: Option<u64>,
    /// Number of rules in the chain, revision rule included.
    pub rules: usize,
}

/// A hashed-name chain of [`KernelChains`]: 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HashedEntry {
    hash: u64,
    revision: u64,
    rules: u32,
    prefix: u8,
    has_revision: bool,
    seen: bool,
}

impl HashedEntry {
    fn key(&self) -> (u8, u64) {
        (self.prefix, self.hash)
    }

    fn chain(&self) -> OwnedChain {
        OwnedChain {
            revision: self.has_revision.then_some(self.revision),
            rules: self.rules as usize,
        }
    }

    fn set(&mut self, chain: OwnedChain) {
        self.revision = chain.revision.unwrap_or(0);
        self.has_revision = chain.revision.is_some();
        self.rules = u32::try_from(chain.rules).unwrap_or(u32::MAX);
    }
}

/// The agent's chains in one table, by name: hashed names (nearly all of them) in a
/// sorted vector of 24-byte entries, the others in a map. Each chain also carries a
/// "seen" mark for the diff that walks the desired chains.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelChains {
    hashed: Vec<HashedEntry>,
    other: BTreeMap<Box<str>, (OwnedChain, bool)>,
    /// Whether `hashed` is sorted (it is, except while a save is being read).
    unsorted: bool,
}

impl KernelChains {
    fn sort(&mut self) {
        if self.unsorted {
            self.hashed.sort_unstable_by_key(HashedEntry::key);
            self.hashed.dedup_by_key(|e| e.key());
            self.unsorted = false;
        }
    }

    fn position(&self, name: HashedName) -> Result<usize, usize> {
        let key = name.parts();
        self.hashed.binary_search_by_key(&key, HashedEntry::key)
    }

    /// The chain called `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<OwnedChain> {
        self.get_name(&ChainName::new(name))
    }

    /// The chain called `name`.
    #[must_use]
    pub fn get_name(&self, name: &ChainName) -> Option<OwnedChain> {
        match name {
            ChainName::Hashed(h) => self.position(*h).ok().map(|i| self.hashed[i].chain()),
            ChainName::Other(text) => self.other.get(text).map(|(c, _)| *c),
        }
    }

    /// Whether there is a chain called `name`.
    #[must_use]
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Adds or replaces a chain.
    pub fn insert(&mut self, name: &str, chain: OwnedChain) {
        self.insert_name(ChainName::new(name), chain);
    }

    /// Adds or replaces a chain.
    pub fn insert_name(&mut self, name: ChainName, chain: OwnedChain) {
        match name {
            ChainName::Hashed(h) => {
                self.sort();
                let mut entry = HashedEntry {
                    hash: h.parts().1,
                    revision: 0,
                    rules: 0,
                    prefix: h.parts().0,
                    has_revision: false,
                    seen: false,
                };
                entry.set(chain);
                match self.position(h) {
                    Ok(i) => self.hashed[i] = entry,
                    Err(i) => self.hashed.insert(i, entry),
                }
            }
            ChainName::Other(text) => {
                self.other.insert(text, (chain, false));
            }
        }
    }

    /// Removes a chain.
    pub fn remove(&mut self, name: &str) -> Option<OwnedChain> {
        match ChainName::new(name) {
            ChainName::Hashed(h) => {
                let i = self.position(h).ok()?;
                Some(self.hashed.remove(i).chain())
            }
            ChainName::Other(text) => self.other.remove(&text).map(|(c, _)| c),
        }
    }

    /// Number of chains.
    #[must_use]
    pub fn len(&self) -> usize {
        self.hashed.len() + self.other.len()
    }

    /// Whether there is no chain.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.hashed.is_empty() && self.other.is_empty()
    }

    /// Every chain (hashed names first, in no meaningful order).
    pub fn iter(&self) -> impl Iterator<Item = (ChainName, OwnedChain)> + '_ {
        self.hashed
            .iter()
            .map(|e| {
                (
                    ChainName::Hashed(HashedName::from_parts(e.prefix, e.hash)),
                    e.chain(),
                )
            })
            .chain(
                self.other
                    .iter()
                    .map(|(name, (c, _))| (ChainName::Other(name.clone()), *c)),
            )
    }

    /// Every chain's name, sorted.
    #[must_use]
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.iter().map(|(n, _)| n.to_string()).collect();
        names.sort_unstable();
        names
    }

    /// Forgets every "seen" mark.
    pub(crate) fn clear_seen(&mut self) {
        self.hashed.iter_mut().for_each(|e| e.seen = false);
        self.other.values_mut().for_each(|(_, seen)| *seen = false);
    }

    /// The chain called `name`, marking it seen.
    pub(crate) fn see(&mut self, name: &ChainName) -> Option<OwnedChain> {
        match name {
            ChainName::Hashed(h) => {
                let i = self.position(*h).ok()?;
                let entry = &mut self.hashed[i];
                entry.seen = true;
                Some(entry.chain())
            }
            ChainName::Other(text) => self.other.get_mut(text).map(|(c, seen)| {
                *seen = true;
                *c
            }),
        }
    }

    /// The chains not marked seen.
    pub(crate) fn unseen(&self) -> impl Iterator<Item = (ChainName, OwnedChain)> + '_ {
        self.hashed
            .iter()
            .filter(|e| !e.seen)
            .map(|e| {
                (
                    ChainName::Hashed(HashedName::from_parts(e.prefix, e.hash)),
                    e.chain(),
                )
            })
            .chain(
                self.other
                    .iter()
                    .filter(|(_, (_, seen))| !seen)
                    .map(|(name, (c, _))| (ChainName::Other(name.clone()), *c)),
            )
    }
}

/// A rule in a built-in chain that jumps to one of the agent's chains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelJump {
    /// 1-based rule number in its chain, as read (see [`KernelTable::positions_fresh`]).
    pub position: usize,
    /// The rule's words after `-A CHAIN`, unquoted.
    pub words: Vec<String>,
}

/// What one table of one family holds, as far as the agent is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelTable {
    /// The agent's chains ([`names::is_owned`]).
    pub chains: KernelChains,
    /// The agent's jumps in each built-in chain, in rule order.
    pub jumps: BTreeMap<String, Vec<KernelJump>>,
    /// Owned chains that a chain the agent does not own jumps to (other than a built-in
    /// chain): they can be flushed but not deleted.
    pub foreign_refs: BTreeSet<String>,
    /// Whether the jump positions were read from the kernel during the current sync, so a
    /// rule can be deleted by number. Cleared after each restore: other programs insert
    /// rules into built-in chains at any time.
    pub positions_fresh: bool,
}

/// What both tables of one family hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelFamily {
    /// `filter`.
    pub filter: KernelTable,
    /// `nat`.
    pub nat: KernelTable,
}

impl KernelFamily {
    /// The table by name.
    #[must_use]
    pub fn table(&self, name: TableName) -> &KernelTable {
        match name {
            TableName::Filter => &self.filter,
            TableName::Nat => &self.nat,
        }
    }

    /// The table by name.
    pub fn table_mut(&mut self, name: TableName) -> &mut KernelTable {
        match name {
            TableName::Filter => &mut self.filter,
            TableName::Nat => &mut self.nat,
        }
    }

    /// Whether the agent has anything in this family.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        [&self.filter, &self.nat]
            .iter()
            .all(|t| t.chains.is_empty() && t.jumps.values().all(Vec::is_empty))
    }
}

/// The revision in a rule's words, when the rule is exactly a revision rule
/// (`-m comment --comment proxyplan-rev:<hash>`, quoted or not).
fn revision_in(words: &[String]) -> Option<u64> {
    match words {
        [m, comment, flag, text] if m == "-m" && comment == "comment" && flag == "--comment" => {
            text.strip_prefix(REVISION_PREFIX).and_then(parse_revision)
        }
        _ => None,
    }
}

/// The chain a rule jumps or goes to, if any.
fn jump_target(words: &[String]) -> Option<&str> {
    words
        .windows(2)
        .rev()
        .find(|w| w[0] == "-j" || w[0] == "-g")
        .map(|w| w[1].as_str())
}

impl KernelTable {
    /// Reads the `*table` section of `iptables-save` output. A missing section is an empty
    /// table; lines that cannot be understood are skipped (the rule counts then differ
    /// and the chains concerned are rewritten).
    #[must_use]
    pub fn from_save(text: &str, table: TableName) -> Self {
        let mut parser = SaveParser::new(table);
        for line in text.lines() {
            parser.line(line);
        }
        parser.finish()
    }
}

/// Reads `iptables-save` output one line at a time into a [`KernelTable`], so the text
/// (hundreds of megabytes for a large node) never has to be held.
#[derive(Debug)]
pub struct SaveParser {
    header: String,
    inside: bool,
    done: bool,
    out: KernelTable,
    builtin: BTreeSet<String>,
    positions: BTreeMap<String, usize>,
    /// The owned chain of the previous rule line and where it is, for the next line
    /// (rules come grouped by chain).
    current: Option<(String, ChainName)>,
}

impl SaveParser {
    /// A parser for the `*table` section.
    #[must_use]
    pub fn new(table: TableName) -> Self {
        Self {
            header: format!("*{}", table.as_str()),
            inside: false,
            done: false,
            out: KernelTable {
                positions_fresh: true,
                ..KernelTable::default()
            },
            builtin: BTreeSet::new(),
            positions: BTreeMap::new(),
            current: None,
        }
    }

    /// Reads the next line.
    pub fn line(&mut self, line: &str) {
        let line = line.trim();
        if self.done {
            return;
        }
        if !self.inside {
            self.inside = line == self.header;
            return;
        }
        if line == "COMMIT" {
            self.done = true;
            return;
        }
        if let Some(declaration) = line.strip_prefix(':') {
            let mut parts = declaration.split_whitespace();
            let (Some(chain), policy) = (parts.next(), parts.next()) else {
                return;
            };
            if names::is_owned(chain) {
                let name = ChainName::new(chain);
                let empty = OwnedChain {
                    revision: None,
                    rules: 0,
                };
                match name {
                    // Declarations come before rules: sorted once, at the first rule.
                    ChainName::Hashed(h) => {
                        let (prefix, hash) = h.parts();
                        self.out.chains.hashed.push(HashedEntry {
                            hash,
                            revision: 0,
                            rules: 0,
                            prefix,
                            has_revision: false,
                            seen: false,
                        });
                        self.out.chains.unsorted = true;
                    }
                    other => self.out.chains.insert_name(other, empty),
                }
                self.current = None;
            } else if policy.is_some_and(|p| p != "-") {
                self.builtin.insert(chain.to_owned());
            }
            return;
        }
        let Some(rest) = line.strip_prefix("-A ") else {
            return;
        };
        let rest = rest.trim_start();
        let (chain, rule) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        if names::is_owned(chain) && self.owned_rule(chain, rule) {
            return;
        }
        let words = split_words(line);
        let [_, chain, rule @ ..] = words.as_slice() else {
            return;
        };
        let position = self.positions.entry(chain.clone()).or_default();
        *position += 1;
        let Some(target) = jump_target(rule).filter(|t| names::is_owned(t)) else {
            return;
        };
        if self.builtin.contains(chain) {
            self.out
                .jumps
                .entry(chain.clone())
                .or_default()
                .push(KernelJump {
                    position: *position,
                    words: rule.to_vec(),
                });
        } else {
            self.out.foreign_refs.insert(target.to_owned());
        }
    }

    /// Counts a rule of an owned chain; false when the chain was not declared.
    fn owned_rule(&mut self, chain: &str, rule: &str) -> bool {
        let name = match &self.current {
            Some((text, name)) if text == chain => name.clone(),
            _ => {
                let name = ChainName::new(chain);
                self.current = Some((chain.to_owned(), name.clone()));
                name
            }
        };
        let first = |rule: &str| revision_in(&split_words(rule));
        let chains = &mut self.out.chains;
        match &name {
            ChainName::Hashed(h) => {
                chains.sort();
                let Ok(i) = chains.position(*h) else {
                    return false;
                };
                let entry = &mut chains.hashed[i];
                if entry.rules == 0 {
                    let revision = first(rule);
                    entry.revision = revision.unwrap_or(0);
                    entry.has_revision = revision.is_some();
                }
                entry.rules = entry.rules.saturating_add(1);
                true
            }
            ChainName::Other(text) => {
                let Some((owned, _)) = chains.other.get_mut(text) else {
                    return false;
                };
                if owned.rules == 0 {
                    owned.revision = first(rule);
                }
                owned.rules += 1;
                true
            }
        }
    }

    /// The table read.
    #[must_use]
    pub fn finish(mut self) -> KernelTable {
        self.out.chains.sort();
        self.out
    }
}

/// A chain to create or rewrite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainWrite<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its rules, without the revision rule.
    pub rules: &'a [String],
    /// Its revision.
    pub revision: u64,
}

/// The changes to one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDiff<'a> {
    /// The table.
    pub table: TableName,
    /// Chains to create or rewrite.
    pub write: Vec<ChainWrite<'a>>,
    /// Owned chains no longer wanted: flushed, then deleted unless `foreign_refs` holds
    /// them.
    pub remove: Vec<String>,
    /// Rules to delete by number: (built-in chain, position), positions descending within
    /// a chain.
    pub delete_jumps: Vec<(String, usize)>,
    /// Jumps to insert at position 1, in this order (so the last one ends up first).
    pub insert_jumps: Vec<&'a BaseJump>,
    foreign_refs: BTreeSet<String>,
    positions_fresh: bool,
}

impl<'a> TableDiff<'a> {
    /// The changes that bring `kernel` to `desired`.
    #[must_use]
    pub fn new(table: TableName, desired: &'a TableRules, kernel: &KernelTable) -> Self {
        let mut write = Vec::new();
        for (name, rules) in &desired.chains {
            let revision = RevisionHasher::of(rules);
            let unchanged = kernel
                .chains
                .get(name)
                .is_some_and(|c| c.revision == Some(revision) && c.rules == rules.len() + 1);
            if !unchanged {
                write.push(ChainWrite {
                    name,
                    rules,
                    revision,
                });
            }
        }
        let mut remove: Vec<String> = kernel
            .chains
            .iter()
            .map(|(name, chain)| (name.to_string(), chain))
            .filter(|(name, chain)| {
                let wanted = desired.chains.contains_key(name);
                // Already flushed, and someone else's chain still jumps to it.
                let parked = chain.rules == 0 && kernel.foreign_refs.contains(name);
                !wanted && !parked
            })
            .map(|(name, _)| name)
            .collect();
        remove.sort_unstable();
        let (delete_jumps, insert_jumps) = jump_changes(&desired.base_jumps, &kernel.jumps);
        Self {
            table,
            write,
            remove,
            delete_jumps,
            insert_jumps,
            foreign_refs: kernel.foreign_refs.clone(),
            positions_fresh: kernel.positions_fresh,
        }
    }

    /// Whether nothing changes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.write.is_empty()
            && self.remove.is_empty()
            && self.delete_jumps.is_empty()
            && self.insert_jumps.is_empty()
    }

    /// Chains written or removed plus jumps inserted or deleted.
    #[must_use]
    pub fn changed(&self) -> usize {
        self.write.len() + self.remove.len() + self.delete_jumps.len() + self.insert_jumps.len()
    }

    /// Whether rules are deleted by number from positions not read during this sync.
    #[must_use]
    pub fn needs_fresh_positions(&self) -> bool {
        !self.delete_jumps.is_empty() && !self.positions_fresh
    }

    /// Appends this table's `iptables-restore` section (nothing when empty).
    pub fn write_restore(&self, out: &mut String) {
        if self.is_empty() {
            return;
        }
        let mut line = |parts: &[&str]| {
            for part in parts {
                out.push_str(part);
            }
            out.push('\n');
        };
        line(&["*", self.table.as_str()]);
        for chain in self
            .write
            .iter()
            .map(|w| w.name)
            .chain(self.remove.iter().map(String::as_str))
        {
            line(&[":", chain, " - [0:0]"]);
        }
        for (chain, position) in &self.delete_jumps {
            line(&["-D ", chain, " ", &position.to_string()]);
        }
        for jump in &self.insert_jumps {
            line(&["-I ", jump.chain, " 1 ", &jump.rule]);
        }
        for chain in &self.write {
            // `TableRules::revision_rule`, from the hash already computed.
            line(&[
                "-A ",
                chain.name,
                " -m comment --comment \"",
                REVISION_PREFIX,
                &revision_text(chain.revision),
                "\"",
            ]);
            for rule in chain.rules {
                line(&["-A ", chain.name, " ", rule]);
            }
        }
        for chain in self
            .remove
            .iter()
            .filter(|c| !self.foreign_refs.contains(*c))
        {
            line(&["-X ", chain]);
        }
        line(&["COMMIT"]);
    }

    /// Updates `kernel` to what it holds after this diff was applied.
    pub fn apply_to(&self, kernel: &mut KernelTable) {
        for chain in &self.write {
            kernel.chains.insert(
                chain.name,
                OwnedChain {
                    revision: Some(chain.revision),
                    rules: chain.rules.len() + 1,
                },
            );
        }
        for chain in &self.remove {
            if kernel.foreign_refs.contains(chain) {
                kernel.chains.insert(
                    chain,
                    OwnedChain {
                        revision: None,
                        rules: 0,
                    },
                );
            } else {
                kernel.chains.remove(chain);
            }
        }
        apply_jumps(kernel, &self.delete_jumps, &self.insert_jumps);
    }
}

/// Updates `kernel`'s jumps to what it holds after `deletes` and `inserts` (see
/// [`jump_changes`]) were applied.
pub(crate) fn apply_jumps(
    kernel: &mut KernelTable,
    deletes: &[(String, usize)],
    inserts: &[&BaseJump],
) {
    let touched: BTreeSet<&str> = deletes
        .iter()
        .map(|(c, _)| c.as_str())
        .chain(inserts.iter().map(|j| j.chain))
        .collect();
    for chain in touched {
        // Inserted in reverse, so the jumps now lead the chain in render order.
        let jumps: Vec<KernelJump> = inserts
            .iter()
            .rev()
            .filter(|j| j.chain == chain)
            .enumerate()
            .map(|(i, j)| KernelJump {
                position: i + 1,
                words: split_words(&j.rule),
            })
            .collect();
        if jumps.is_empty() {
            kernel.jumps.remove(chain);
        } else {
            kernel.jumps.insert(chain.to_owned(), jumps);
        }
    }
    kernel.positions_fresh = false;
}

/// Deletions and insertions that make each built-in chain hold exactly the desired jumps.
/// A chain whose jumps already match (in order; wherever they stand) is left alone; one
/// without any gets them inserted at the top in render order; otherwise the agent's jumps
/// are deleted and all re-inserted, in the same transaction.
pub(crate) fn jump_changes<'a>(
    desired: &'a [BaseJump],
    kernel: &BTreeMap<String, Vec<KernelJump>>,
) -> (Vec<(String, usize)>, Vec<&'a BaseJump>) {
    let mut chains: Vec<&str> = desired.iter().map(|j| j.chain).collect();
    chains.extend(kernel.keys().map(String::as_str));
    chains.sort_unstable();
    chains.dedup();
    let mut deletes = Vec::new();
    let mut inserts = Vec::new();
    for chain in chains {
        let want: Vec<&BaseJump> = desired.iter().filter(|j| j.chain == chain).collect();
        let have = kernel.get(chain).map_or(&[][..], Vec::as_slice);
        let same = want.len() == have.len()
            && want
                .iter()
                .zip(have)
                .all(|(w, h)| split_words(&w.rule) == h.words);
        if same {
            continue;
        }
        let mut positions: Vec<usize> = have.iter().map(|h| h.position).collect();
        positions.sort_unstable_by(|a, b| b.cmp(a));
        deletes.extend(positions.into_iter().map(|p| (chain.to_owned(), p)));
        inserts.extend(want.into_iter().rev());
    }
    (deletes, inserts)
}

/// The changes to both tables of one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyDiff<'a> {
    /// `filter`.
    pub filter: TableDiff<'a>,
    /// `nat`.
    pub nat: TableDiff<'a>,
}

impl<'a> FamilyDiff<'a> {
    /// The changes that bring `kernel` to `desired`.
    #[must_use]
    pub fn new(desired: &'a FamilyRules, kernel: &KernelFamily) -> Self {
        Self {
            filter: TableDiff::new(TableName::Filter, &desired.filter, &kernel.filter),
            nat: TableDiff::new(TableName::Nat, &desired.nat, &kernel.nat),
        }
    }

    /// Whether nothing changes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.filter.is_empty() && self.nat.is_empty()
    }

    /// Chains and jumps changed.
    #[must_use]
    pub fn changed(&self) -> usize {
        self.filter.changed() + self.nat.changed()
    }

    /// Whether the model must be re-read before this diff can be applied.
    #[must_use]
    pub fn needs_fresh_positions(&self) -> bool {
        self.filter.needs_fresh_positions() || self.nat.needs_fresh_positions()
    }

    /// The `iptables-restore --noflush` input: one section per changed table.
    #[must_use]
    pub fn restore_payload(&self) -> String {
        let mut out = String::new();
        self.filter.write_restore(&mut out);
        self.nat.write_restore(&mut out);
        out
    }

    /// Updates `kernel` to what it holds after the payload was restored.
    pub fn apply_to(&self, kernel: &mut KernelFamily) {
        for diff in [&self.filter, &self.nat] {
            diff.apply_to(kernel.table_mut(diff.table));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        split_words(line)
    }

    #[test]
    fn words_unquote_like_iptables_save() {
        assert_eq!(
            words(r#"-A X -m comment --comment "a b \"c\"" -j Y"#),
            [
                "-A",
                "X",
                "-m",
                "comment",
                "--comment",
                "a b \"c\"",
                "-j",
                "Y"
            ]
        );
        assert_eq!(
            words("-m comment --comment proxyplan-rev:abc"),
            words(r#"-m comment --comment "proxyplan-rev:abc""#)
        );
        assert_eq!(words(r#"--comment """#), ["--comment", ""]);
    }

    const SAVE: &str = r#"# Generated by iptables-save v1.8.9 on Sun Nov 22 05:13:23 2026
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:PP-SVC-A - [0:0]
:PROXYPLAN-SERVICES - [0:0]
:PROXYPLAN-EMPTY - [0:0]
-A PREROUTING -j ACCEPT
-A PREROUTING -m comment --comment "proxyplan service portals" -j PROXYPLAN-SERVICES
-A OUTPUT -m comment --comment "proxyplan service portals" -j PROXYPLAN-SERVICES
-A KUBE-SERVICES -j PP-SVC-A
-A PP-SVC-A -m comment --comment proxyplan-rev:0123456789abcdef
-A PP-SVC-A -j DNAT --to-destination 10.0.0.1:80
-A PROXYPLAN-SERVICES -m comment --comment "proxyplan-rev:fedcba9876543210"
COMMIT
# Completed
*filter
:INPUT ACCEPT [0:0]
:PP-NOT-NAT - [0:0]
COMMIT
"#;

    #[test]
    fn save_output_becomes_a_model() {
        let nat = KernelTable::from_save(SAVE, TableName::Nat);
        assert_eq!(
            nat.chains.names(),
            ["PP-SVC-A", "PROXYPLAN-EMPTY", "PROXYPLAN-SERVICES"]
        );
        assert_eq!(
            nat.chains.get("PP-SVC-A"),
            Some(OwnedChain {
                revision: Some(0x0123_4567_89ab_cdef),
                rules: 2
            })
        );
        assert_eq!(
            nat.chains
                .get("PROXYPLAN-SERVICES")
                .and_then(|c| c.revision),
            Some(0xfedc_ba98_7654_3210)
        );
        assert_eq!(
            nat.chains.get("PROXYPLAN-EMPTY"),
            Some(OwnedChain {
                revision: None,
                rules: 0
            })
        );
        assert_eq!(nat.jumps["PREROUTING"].len(), 1);
        assert_eq!(nat.jumps["PREROUTING"][0].position, 2);
        assert_eq!(nat.jumps["OUTPUT"][0].position, 1);
        assert!(nat.foreign_refs.contains("PP-SVC-A"));
        assert!(nat.positions_fresh);
        let filter = KernelTable::from_save(SAVE, TableName::Filter);
        assert_eq!(filter.chains.len(), 1);
        assert!(KernelTable::from_save("", TableName::Nat).chains.is_empty());
    }

    #[test]
    fn hashed_chain_names_are_held_compactly_and_read_back() {
        let svc = names::service("demo/web:http/TCP/IPv4");
        let sep = names::endpoint(
            "demo/web:http/TCP/IPv4",
            &proxyplan_crds::Endpoint {
                ip: "10.0.0.1".into(),
                port: 80,
            },
        );
        let rev = RevisionHasher::of(&["-j ACCEPT"]);
        let text = format!(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:{sep} - [0:0]\n:{svc} - [0:0]\n:PP-SVC-SHORT - [0:0]\n\
             -A PREROUTING -j {svc}\n\
             -A {svc} -m comment --comment \"proxyplan-rev:{}\"\n-A {svc} -j {sep}\n\
             -A {sep} -j DNAT --to-destination 10.0.0.1:80\n-A PP-SVC-SHORT -j {sep}\nCOMMIT\n",
            revision_text(rev)
        );
        let nat = KernelTable::from_save(&text, TableName::Nat);
        let mut expected = vec![sep.clone(), svc.clone(), "PP-SVC-SHORT".to_owned()];
        expected.sort();
        assert_eq!(nat.chains.names(), expected);
        assert_eq!(
            nat.chains.get(&svc),
            Some(OwnedChain {
                revision: Some(rev),
                rules: 2
            })
        );
        assert_eq!(
            nat.chains.get(&sep),
            Some(OwnedChain {
                revision: None,
                rules: 1
            })
        );
        assert_eq!(nat.chains.get("PP-SVC-SHORT").map(|c| c.rules), Some(1));
        assert_eq!(nat.jumps["PREROUTING"][0].position, 1);
        let mut chains = nat.chains.clone();
        assert_eq!(chains.remove(&sep).map(|c| c.rules), Some(1));
        assert!(!chains.contains(&sep) && chains.len() == 2);
    }

    fn table(chains: &[(&str, &[&str])], jumps: &[(&'static str, &str)]) -> TableRules {
        TableRules {
            base_jumps: jumps
                .iter()
                .map(|(chain, rule)| BaseJump {
                    chain,
                    rule: (*rule).to_owned(),
                })
                .collect(),
            chains: chains
                .iter()
                .map(|(name, rules)| {
                    (
                        (*name).to_owned(),
                        rules.iter().map(|r| (*r).to_owned()).collect(),
                    )
                })
                .collect(),
        }
    }

    fn applied(diff: &TableDiff<'_>, kernel: &KernelTable) -> KernelTable {
        let mut after = kernel.clone();
        diff.apply_to(&mut after);
        after
    }

    #[test]
    fn empty_kernel_gets_everything_in_order() {
        let desired = table(
            &[("PROXYPLAN-SERVICES", &["-j PP-SVC-A"]), ("PP-SVC-A", &[])],
            &[
                (
                    "PREROUTING",
                    "-m comment --comment \"first\" -j PROXYPLAN-SERVICES",
                ),
                (
                    "PREROUTING",
                    "-m comment --comment \"second\" -j PROXYPLAN-SERVICES",
                ),
            ],
        );
        let kernel = KernelTable::default();
        let diff = TableDiff::new(TableName::Nat, &desired, &kernel);
        let mut text = String::new();
        diff.write_restore(&mut text);
        let svc = TableRules::revision_rule(&["-j PP-SVC-A".to_owned()]);
        let empty = TableRules::revision_rule(&[]);
        assert_eq!(
            text,
            format!(
                "*nat\n:PP-SVC-A - [0:0]\n:PROXYPLAN-SERVICES - [0:0]\n\
                 -I PREROUTING 1 -m comment --comment \"second\" -j PROXYPLAN-SERVICES\n\
                 -I PREROUTING 1 -m comment --comment \"first\" -j PROXYPLAN-SERVICES\n\
                 -A PP-SVC-A {empty}\n\
                 -A PROXYPLAN-SERVICES {svc}\n-A PROXYPLAN-SERVICES -j PP-SVC-A\nCOMMIT\n"
            )
        );
        assert!(!diff.needs_fresh_positions());
        let after = applied(&diff, &kernel);
        assert_eq!(
            after.jumps["PREROUTING"][0].words,
            words("-m comment --comment first -j PROXYPLAN-SERVICES")
        );
        assert!(TableDiff::new(TableName::Nat, &desired, &after).is_empty());
    }

    #[test]
    fn only_changed_chains_are_written_and_stale_ones_removed() {
        let before = table(
            &[
                ("PP-SVC-A", &["-j PP-SEP-1", "-j PP-SEP-2"]),
                ("PP-SEP-1", &["-j DNAT"]),
                ("PP-SEP-2", &["-j DNAT"]),
            ],
            &[],
        );
        let kernel = applied(
            &TableDiff::new(TableName::Nat, &before, &KernelTable::default()),
            &KernelTable::default(),
        );
        let after = table(
            &[("PP-SVC-A", &["-j PP-SEP-1"]), ("PP-SEP-1", &["-j DNAT"])],
            &[],
        );
        let diff = TableDiff::new(TableName::Nat, &after, &kernel);
        assert_eq!(
            diff.write.iter().map(|w| w.name).collect::<Vec<_>>(),
            ["PP-SVC-A"]
        );
        assert_eq!(diff.remove, ["PP-SEP-2"]);
        let mut text = String::new();
        diff.write_restore(&mut text);
        assert!(
            text.starts_with("*nat\n:PP-SVC-A - [0:0]\n:PP-SEP-2 - [0:0]\n"),
            "{text}"
        );
        assert!(text.ends_with("-X PP-SEP-2\nCOMMIT\n"), "{text}");
        assert!(
            !text.contains(":PP-SEP-1") && !text.contains("-A PP-SEP-1"),
            "{text}"
        );
        assert_eq!(diff.changed(), 2);
    }

    #[test]
    fn a_chain_with_extra_rules_or_no_revision_is_rewritten() {
        let desired = table(&[("PP-SVC-A", &["-j ACCEPT"])], &[]);
        let rev = RevisionHasher::of(&["-j ACCEPT"]);
        let mut kernel = KernelTable::default();
        kernel.chains.insert(
            "PP-SVC-A",
            OwnedChain {
                revision: Some(rev),
                rules: 3,
            },
        );
        assert_eq!(
            TableDiff::new(TableName::Nat, &desired, &kernel)
                .write
                .len(),
            1
        );
        kernel.chains.insert(
            "PP-SVC-A",
            OwnedChain {
                revision: None,
                rules: 2,
            },
        );
        assert_eq!(
            TableDiff::new(TableName::Nat, &desired, &kernel)
                .write
                .len(),
            1
        );
        kernel.chains.insert(
            "PP-SVC-A",
            OwnedChain {
                revision: Some(rev),
                rules: 2,
            },
        );
        assert!(TableDiff::new(TableName::Nat, &desired, &kernel).is_empty());
    }

    #[test]
    fn jumps_present_in_order_are_left_where_they_are() {
        let nat = KernelTable::from_save(SAVE, TableName::Nat);
        let desired = table(
            &[],
            &[
                (
                    "PREROUTING",
                    "-m comment --comment \"proxyplan service portals\" -j PROXYPLAN-SERVICES",
                ),
                (
                    "OUTPUT",
                    "-m comment --comment \"proxyplan service portals\" -j PROXYPLAN-SERVICES",
                ),
            ],
        );
        let diff = TableDiff::new(TableName::Nat, &desired, &nat);
        assert!(diff.delete_jumps.is_empty() && diff.insert_jumps.is_empty());
    }

    #[test]
    fn unwanted_and_misordered_jumps_are_deleted_by_number_descending() {
        let nat = KernelTable::from_save(SAVE, TableName::Nat);
        // PREROUTING wants a second jump, OUTPUT none.
        let desired = table(
            &[],
            &[
                ("PREROUTING", "-j PROXYPLAN-NODEPORTS"),
                (
                    "PREROUTING",
                    "-m comment --comment \"proxyplan service portals\" -j PROXYPLAN-SERVICES",
                ),
            ],
        );
        let diff = TableDiff::new(TableName::Nat, &desired, &nat);
        assert_eq!(
            diff.delete_jumps,
            [("OUTPUT".to_owned(), 1), ("PREROUTING".to_owned(), 2)]
        );
        assert!(!diff.needs_fresh_positions());
        let mut text = String::new();
        diff.write_restore(&mut text);
        assert!(text.contains(
            "-D OUTPUT 1\n-D PREROUTING 2\n\
             -I PREROUTING 1 -m comment --comment \"proxyplan service portals\" -j PROXYPLAN-SERVICES\n\
             -I PREROUTING 1 -j PROXYPLAN-NODEPORTS\n"
        ), "{text}");
        let after = applied(&diff, &nat);
        assert!(!after.positions_fresh);
        assert!(!after.jumps.contains_key("OUTPUT"));
        let nothing = TableRules::default();
        let again = TableDiff::new(TableName::Nat, &nothing, &after);
        assert!(again.needs_fresh_positions());
    }

    #[test]
    fn chains_referenced_by_others_are_flushed_not_deleted() {
        let nat = KernelTable::from_save(SAVE, TableName::Nat);
        let nothing = TableRules::default();
        let diff = TableDiff::new(TableName::Nat, &nothing, &nat);
        let mut text = String::new();
        diff.write_restore(&mut text);
        assert!(text.contains(":PP-SVC-A - [0:0]\n"), "{text}");
        assert!(!text.contains("-X PP-SVC-A"), "{text}");
        assert!(text.contains("-X PROXYPLAN-SERVICES\n"), "{text}");
        let after = applied(&diff, &nat);
        assert_eq!(after.chains.len(), 1);
        assert!(TableDiff::new(TableName::Nat, &nothing, &after).is_empty());
    }
}
