//! A text-based diff of desired rules against what the kernel holds ([`super::save`]),
//! with the `iptables-restore --noflush` text that applies the difference (used for small
//! fixed rule sets; the iptables mode's own rules go through its render cache, which does
//! the same without keeping rule text).
//!
//! A chain is rewritten when its revision or its rule count differs, and not mentioned at
//! all otherwise. Built-in chains are never flushed; the agent only inserts and deletes
//! its own jumps in them.

use std::collections::{BTreeMap, BTreeSet};

use super::hash::{RevisionHasher, revision_text};
use super::rules::{BaseJump, FamilyRules, REVISION_PREFIX, TableName, TableRules};
use super::save::{KernelFamily, KernelJump, KernelTable, OwnedChain};
use crate::kernel::iptables::split_words;

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
    use crate::ruleset::save::tests::SAVE;

    fn words(line: &str) -> Vec<String> {
        split_words(line)
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
