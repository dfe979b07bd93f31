//! What the kernel holds of the agent's chains, read from `iptables-save` line by line:
//! per table, the owned chains (their revision and rule count, not their text), the
//! agent's jumps in built-in chains, and owned chains others refer to. [`super::diff`]
//! compares desired rules with it. A summary read ([`SaveParser::summary`]) keeps only
//! a digest of the owned chains, for a periodic check that finds nothing most of the time.
//!
//! Chains are compared by the revision rule each of them starts with, never by their rule
//! syntax (which the nft and legacy back ends print differently).

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use super::hash::parse_revision;
use super::names;
use super::names::{ChainName, HashedName};
use super::rules::{REVISION_PREFIX, TableName};
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

/// An order-free digest of a set of owned chains (name, revision, rule count): what a
/// periodic check compares instead of holding every chain the kernel has (150,000 at
/// 10,000 Services). Equal digests of equal counts mean equal sets, but for a 64-bit
/// hash collision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChainsDigest {
    chains: usize,
    sum: u64,
}

impl ChainsDigest {
    /// Adds a chain.
    pub fn add(&mut self, name: &ChainName, revision: Option<u64>, rules: usize) {
        let mut hasher = DefaultHasher::new();
        (name, revision, rules).hash(&mut hasher);
        self.chains += 1;
        self.sum = self.sum.wrapping_add(hasher.finish());
    }

    /// Chains added.
    #[must_use]
    pub fn len(&self) -> usize {
        self.chains
    }

    /// Whether no chain was added.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.chains == 0
    }
}

/// A table's owned chains as a summary read keeps them: their digest only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChainsSummary {
    /// The chains with their revisions and rule counts.
    pub digest: ChainsDigest,
    /// Whether every owned chain declared has rules (and every chain with rules was
    /// declared). An empty owned chain (flushed, perhaps parked behind someone else's
    /// reference) is only judged by a full read.
    pub complete: bool,
}

/// A summary read in progress: the declared names, the chains closed so far and the
/// one whose rules are being counted (rules come grouped by chain).
#[derive(Debug, Default)]
struct Summarizing {
    declared: ChainsDigest,
    ruled: ChainsDigest,
    chains: ChainsDigest,
    open: Option<(ChainName, Option<u64>, usize)>,
}

impl Summarizing {
    fn close(&mut self) {
        if let Some((name, revision, rules)) = self.open.take() {
            self.ruled.add(&name, None, 0);
            self.chains.add(&name, revision, rules);
        }
    }

    fn finish(mut self) -> ChainsSummary {
        self.close();
        ChainsSummary {
            digest: self.chains,
            complete: self.declared == self.ruled,
        }
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
    /// From a summary read ([`SaveParser::summary`]): the owned chains' digest, and
    /// `chains` left empty.
    pub summary: Option<ChainsSummary>,
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
            revision_of_comment(text)
        }
        _ => None,
    }
}

/// The revision a revision rule's comment (`proxyplan-rev:<hash>`) carries.
#[must_use]
pub fn revision_of_comment(comment: &str) -> Option<u64> {
    comment
        .strip_prefix(REVISION_PREFIX)
        .and_then(parse_revision)
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
    /// A summary read: owned chains go into digests, not into `out.chains`.
    summary: Option<Summarizing>,
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
            summary: None,
        }
    }

    /// A parser for the `*table` section that keeps only a digest of the owned chains
    /// ([`KernelTable::summary`]), with the jumps and foreign references as usual.
    #[must_use]
    pub fn summary(table: TableName) -> Self {
        Self {
            summary: Some(Summarizing::default()),
            ..Self::new(table)
        }
    }

    /// A new parser of the same table and kind (a dump that starts over).
    #[must_use]
    pub fn restarted(&self, table: TableName) -> Self {
        if self.summary.is_some() {
            Self::summary(table)
        } else {
            Self::new(table)
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
            self.declare(chain, policy.is_some_and(|p| p != "-"));
            return;
        }
        let Some(rest) = line.strip_prefix("-A ") else {
            return;
        };
        let rest = rest.trim_start();
        let (chain, rule) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        if names::is_owned(chain) && self.owned_rule(chain, || revision_in(&split_words(rule))) {
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

    /// A chain declared (`:CHAIN POLICY` in a save; listed in a dump): an owned one is
    /// added empty, a built-in one noted.
    fn declare(&mut self, chain: &str, builtin: bool) {
        if let Some(summary) = &mut self.summary
            && names::is_owned(chain)
        {
            summary.declared.add(&ChainName::new(chain), None, 0);
            self.current = None;
        } else if names::is_owned(chain) {
            match ChainName::new(chain) {
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
                other => self.out.chains.insert_name(
                    other,
                    OwnedChain {
                        revision: None,
                        rules: 0,
                    },
                ),
            }
            self.current = None;
        } else if builtin {
            self.builtin.insert(chain.to_owned());
        }
    }

    /// A chain of an nf_tables dump ([`crate::kernel::xtables_nft`]): all chains come
    /// before the first rule.
    pub fn dump_chain(&mut self, chain: &str, base: bool) {
        self.inside = true;
        self.declare(chain, base);
    }

    /// A rule of an nf_tables dump, in its chain's order: `revision` when it is exactly
    /// a revision rule, `target` the chain it jumps or goes to. A built-in chain's
    /// jumps to owned chains need their words, which a dump does not give: such chains
    /// are listed by [`SaveParser::finish_dump`] for the caller to read with
    /// `iptables -S CHAIN`.
    pub fn dump_rule(&mut self, chain: &str, revision: Option<u64>, target: Option<&str>) {
        if names::is_owned(chain) && self.owned_rule(chain, || revision) {
            return;
        }
        let Some(target) = target.filter(|t| names::is_owned(t)) else {
            return;
        };
        if self.builtin.contains(chain) {
            self.out.jumps.entry(chain.to_owned()).or_default();
        } else {
            self.out.foreign_refs.insert(target.to_owned());
        }
    }

    /// The table of a dump, and the built-in chains with jumps to owned chains (their
    /// jumps still to read, see [`SaveParser::dump_rule`]).
    #[must_use]
    pub fn finish_dump(mut self) -> (KernelTable, Vec<String>) {
        let chains: Vec<String> = std::mem::take(&mut self.out.jumps).into_keys().collect();
        (self.finish(), chains)
    }

    /// Counts a rule of an owned chain (`revision`: of the rule, asked for the chain's
    /// first); false when the chain was not declared.
    fn owned_rule(&mut self, chain: &str, revision: impl FnOnce() -> Option<u64>) -> bool {
        if let Some(summary) = &mut self.summary {
            match &mut summary.open {
                Some((_, _, rules)) if self.current.as_ref().is_some_and(|(t, _)| t == chain) => {
                    *rules += 1;
                }
                _ => {
                    summary.close();
                    let name = ChainName::new(chain);
                    summary.open = Some((name.clone(), revision(), 1));
                    self.current = Some((chain.to_owned(), name));
                }
            }
            // An undeclared chain shows as a difference between the declared and the
            // ruled names.
            return true;
        }
        let name = match &self.current {
            Some((text, name)) if text == chain => name.clone(),
            _ => {
                let name = ChainName::new(chain);
                self.current = Some((chain.to_owned(), name.clone()));
                name
            }
        };
        let chains = &mut self.out.chains;
        match &name {
            ChainName::Hashed(h) => {
                chains.sort();
                let Ok(i) = chains.position(*h) else {
                    return false;
                };
                let entry = &mut chains.hashed[i];
                if entry.rules == 0 {
                    let revision = revision();
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
                    owned.revision = revision();
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
        self.out.summary = self.summary.map(Summarizing::finish);
        self.out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ruleset::hash::{RevisionHasher, revision_text};

    /// `iptables-save` output with owned chains, foreign ones and jumps.
    pub(crate) const SAVE: &str = r#"# Generated by iptables-save v1.8.9 on Sun Nov 22 05:13:23 2026
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

    /// The digest a full read's chains give.
    fn digest_of(table: &KernelTable) -> ChainsDigest {
        let mut digest = ChainsDigest::default();
        for (name, chain) in table.chains.iter() {
            digest.add(&name, chain.revision, chain.rules);
        }
        digest
    }

    fn summary_of(text: &str, table: TableName) -> ChainsSummary {
        let mut parser = SaveParser::summary(table);
        text.lines().for_each(|l| parser.line(l));
        let read = parser.finish();
        assert!(read.chains.is_empty());
        read.summary.unwrap()
    }

    #[test]
    fn a_summary_read_keeps_the_jumps_and_a_digest_of_the_chains() {
        let without_empty = SAVE.replace(":PROXYPLAN-EMPTY - [0:0]\n", "");
        let full = KernelTable::from_save(&without_empty, TableName::Nat);
        let mut parser = SaveParser::summary(TableName::Nat);
        without_empty.lines().for_each(|l| parser.line(l));
        let summary = parser.finish();
        assert_eq!(summary.jumps, full.jumps);
        assert_eq!(summary.foreign_refs, full.foreign_refs);
        let digest = summary.summary.unwrap();
        assert!(digest.complete);
        assert_eq!(digest.digest, digest_of(&full));
        assert_eq!(digest.digest.len(), 2);

        // One rule more, a revision changed: another digest.
        let more = without_empty.replace(
            "-A PP-SVC-A -j DNAT",
            "-A PP-SVC-A -j RETURN\n-A PP-SVC-A -j DNAT",
        );
        assert_ne!(summary_of(&more, TableName::Nat).digest, digest.digest);
        let other = without_empty.replace("0123456789abcdef", "0123456789abcdee");
        assert_ne!(summary_of(&other, TableName::Nat).digest, digest.digest);
    }

    #[test]
    fn a_summary_cannot_judge_empty_or_undeclared_chains() {
        // PROXYPLAN-EMPTY is declared without rules.
        assert!(!summary_of(SAVE, TableName::Nat).complete);
        let undeclared = SAVE
            .replace(":PROXYPLAN-EMPTY - [0:0]\n", "")
            .replace(":PP-SVC-A - [0:0]\n", "");
        assert!(!summary_of(&undeclared, TableName::Nat).complete);
        // A chain's rules in two runs (never printed so) count it twice.
        let interleaved = SAVE.replace(":PROXYPLAN-EMPTY - [0:0]\n", "").replace(
            "COMMIT\n# Completed",
            "-A PP-SVC-A -j RETURN\nCOMMIT\n# Completed",
        );
        assert!(!summary_of(&interleaved, TableName::Nat).complete);
    }

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
}
