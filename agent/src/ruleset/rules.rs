//! iptables rules as data: per family, per table, the agent's chains (each headed by a
//! revision rule when written) and its jumps from built-in chains.

use std::collections::BTreeMap;

use crate::kernel::family::Family;

/// The tables the agent writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TableName {
    /// `filter`: REJECT/DROP for service ports without endpoints, source-range firewall,
    /// forwarding of marked traffic.
    Filter,
    /// `nat`: DNAT to endpoints, masquerade marking.
    Nat,
}

impl TableName {
    /// The table's name in iptables.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Filter => "filter",
            Self::Nat => "nat",
        }
    }
}

/// A rule in a built-in chain (`PREROUTING`, `INPUT`, ...) that jumps into ours. Those
/// chains are shared with everyone else on the node: the agent inserts its jumps when
/// missing and never rewrites the chain.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct BaseJump {
    /// The built-in chain.
    pub chain: &'static str,
    /// Rule body (everything after `-A CHAIN `), ending in `-j OURCHAIN`.
    pub rule: String,
}

/// One table's desired content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableRules {
    /// Jumps from built-in chains.
    pub base_jumps: Vec<BaseJump>,
    /// Our chains, by name: rule bodies (everything after `-A CHAIN `), in order, without
    /// the revision rule (see [`TableRules::revision`]).
    pub chains: BTreeMap<String, Vec<String>>,
}

impl TableRules {
    /// The content hash of one chain's rules, as stored in its revision rule.
    #[must_use]
    pub fn revision(rules: &[String]) -> String {
        proxyplan_crds::revision_of(&rules)
    }

    /// The revision rule that heads a chain.
    #[must_use]
    pub fn revision_rule(rules: &[String]) -> String {
        format!(
            "-m comment --comment \"{REVISION_PREFIX}{}\"",
            Self::revision(rules)
        )
    }

    /// Number of rules, revision rules and base jumps included.
    #[must_use]
    pub fn rule_count(&self) -> usize {
        self.base_jumps.len() + self.chains.values().map(|r| r.len() + 1).sum::<usize>()
    }
}

/// Prefix of the comment in each chain's revision rule.
pub const REVISION_PREFIX: &str = "proxyplan-rev:";

/// One family's desired rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FamilyRules {
    /// `filter` table.
    pub filter: TableRules,
    /// `nat` table.
    pub nat: TableRules,
}

impl FamilyRules {
    /// The table by name.
    #[must_use]
    pub fn table(&self, name: TableName) -> &TableRules {
        match name {
            TableName::Filter => &self.filter,
            TableName::Nat => &self.nat,
        }
    }

    /// The whole family as `iptables-restore` input (every chain declared and filled,
    /// revision rules included, base jumps as `-A`): the golden-file form, and what a
    /// first sync on an empty node sends.
    #[must_use]
    pub fn dump(&self) -> String {
        let mut text = String::new();
        for name in [TableName::Filter, TableName::Nat] {
            let table = self.table(name);
            if table.chains.is_empty() && table.base_jumps.is_empty() {
                continue;
            }
            text.push_str(&format!("*{}\n", name.as_str()));
            for chain in table.chains.keys() {
                text.push_str(&format!(":{chain} - [0:0]\n"));
            }
            for jump in &table.base_jumps {
                text.push_str(&format!("-A {} {}\n", jump.chain, jump.rule));
            }
            for (chain, rules) in &table.chains {
                text.push_str(&format!(
                    "-A {chain} {}\n",
                    TableRules::revision_rule(rules)
                ));
                for rule in rules {
                    text.push_str(&format!("-A {chain} {rule}\n"));
                }
            }
            text.push_str("COMMIT\n");
        }
        text
    }

    /// Number of rules in both tables.
    #[must_use]
    pub fn rule_count(&self) -> usize {
        self.filter.rule_count() + self.nat.rule_count()
    }
}

/// The whole desired iptables state: IPv4 and IPv6.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// `iptables`.
    pub v4: FamilyRules,
    /// `ip6tables`.
    pub v6: FamilyRules,
}

impl Ruleset {
    /// One family's rules.
    #[must_use]
    pub fn family(&self, family: Family) -> &FamilyRules {
        match family {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }
}
