//! What one sync changes in one family of the iptables mode ([`Delta`]): computed by
//! [`super::cache::FamilyCache::diff`], written as `iptables-restore --noflush` input by
//! [`Delta::write_payload`] (rendering again the groups whose chains it writes, so the
//! payload is never held), made the cache by [`super::cache::FamilyCache::commit`].

use std::io::{self, Write};

use proxyplan_crds::{IpFamily, ServicePortPlan};

use super::groups::{
    Changed, Context, FixedChain, GroupState, JumpChanges, TABLES, TailRule, slot,
};
use super::render::{FamilyInputs, render_entries};
use super::settings::RenderSettings;
use crate::ruleset::hash::revision_text;
use crate::ruleset::names::{ChainName, HashedName};
use crate::ruleset::rules::{FamilyRules, REVISION_PREFIX, TableName};

/// What one sync changes in one family: computed by [`FamilyCache::diff`], written by
/// [`Delta::write_payload`], made the cache by [`FamilyCache::commit`].
#[derive(Debug)]
pub(crate) struct Delta<'p> {
    pub(super) inputs: FamilyInputs<'p>,
    pub(super) family: IpFamily,
    pub(super) context: Option<Context>,
    pub(super) base: FamilyRules,
    pub(super) tail: Vec<TailRule>,
    /// The entries sorted by key (stable), and the groups of equal keys in it.
    pub(super) order: Vec<&'p ServicePortPlan>,
    pub(super) groups: Vec<(usize, usize)>,
    /// Groups rendered or to write, in key order: their new state, with the chains to
    /// write marked.
    pub(super) changed: Vec<Changed>,
    /// Cached groups no longer in the plan (indices into the cache, ascending).
    pub(super) gone: Vec<usize>,
    pub(super) fixed: Vec<FixedChain>,
    /// Chains to flush, per table, and whether to delete them too (not when a chain the
    /// agent does not own jumps to them).
    pub(super) remove: [Vec<(ChainName, bool)>; 2],
    /// Per table: jumps to delete by number and to insert (see [`jump_changes`]).
    pub(super) jumps: [JumpChanges; 2],
    pub(super) positions_fresh: [bool; 2],
    pub(super) own_rules: usize,
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

    /// Chains written or removed plus jumps inserted or deleted.
    pub(crate) fn changes(&self) -> usize {
        TABLES.iter().map(|t| self.table_changes(*t)).sum()
    }

    /// Tables the payload has a section for: `iptables-nft-restore` commits each one
    /// as its own nf_tables transaction.
    pub(crate) fn tables_written(&self) -> u32 {
        TABLES
            .iter()
            .map(|t| u32::from(self.table_changes(*t) > 0))
            .sum()
    }

    /// Chains written or removed.
    pub(super) fn chain_changes(&self) -> usize {
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
