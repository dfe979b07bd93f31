//! What both modes do with the agent's tables through a [`Runner`]: read a family, and
//! check the canary chain.
//!
//! How a table is read depends on the back end. Legacy: `iptables-legacy-save -t TABLE`,
//! line by line. nft: a dump over nfnetlink ([`crate::kernel::xtables_nft`]) gives the
//! owned chains, their rule counts and revisions and the foreign references, and only
//! the built-in chains that jump to owned chains are listed with `iptables-nft -S
//! CHAIN` for their jumps' words. `iptables-nft-save` is not used: it holds the whole
//! ruleset and, at 10,000 Services, crashes in libnftnl (see the README). A runner
//! without netlink (a fake) falls back to `iptables-nft-save`.

use std::cell::RefCell;

use super::rules::TableName;
use super::save::{KernelFamily, KernelJump, KernelTable, SaveParser, revision_of_comment};
use crate::kernel::command::Runner;
use crate::kernel::error::DataplaneError;
use crate::kernel::family::Family;
use crate::kernel::iptables::{Backend, LOCK_WAIT, Tool};

/// The agent's tables in the kernel, through a runner and one back end's tools.
#[derive(Clone, Copy)]
pub struct Tables<'a> {
    /// Runs the tools.
    pub runner: &'a dyn Runner,
    /// Whose tools: `iptables-nft*` or `iptables-legacy*`.
    pub backend: Backend,
}

impl Tables<'_> {
    /// Reads one table: over nfnetlink on the nft back end, with `iptables-save -t TABLE`
    /// line by line on the legacy one (or when the runner has no netlink).
    ///
    /// # Errors
    /// When the table cannot be read; the error names the tool or the netlink request.
    pub fn read_table(
        &self,
        family: Family,
        table: TableName,
    ) -> Result<KernelTable, DataplaneError> {
        self.read_table_as(family, table, SaveParser::new(table))
    }

    /// Reads one table into `parser` (a full read or a summary).
    fn read_table_as(
        &self,
        family: Family,
        table: TableName,
        parser: SaveParser,
    ) -> Result<KernelTable, DataplaneError> {
        if self.backend == Backend::Nft
            && let Some(read) = self.read_table_netlink(family, table, &parser)?
        {
            return Ok(read);
        }
        self.read_table_save(family, table, parser)
    }

    /// Reads one table with `iptables-save -t TABLE`, line by line.
    ///
    /// # Errors
    /// When `iptables-save` cannot be run or fails.
    fn read_table_save(
        &self,
        family: Family,
        table: TableName,
        mut parser: SaveParser,
    ) -> Result<KernelTable, DataplaneError> {
        let save = self.backend.binary(family, Tool::Save);
        let args = ["-t", table.as_str()];
        let output = self
            .runner
            .run_lines(&save, &args, &mut |line| parser.line(line))?;
        if !output.success() {
            return Err(output.failure(&format!("{save} {}", args.join(" "))));
        }
        Ok(parser.finish())
    }

    /// Reads one nft table over nfnetlink, then the jumps of the built-in chains that
    /// have some with `iptables-nft -S CHAIN`; `None` when the runner cannot.
    fn read_table_netlink(
        &self,
        family: Family,
        table: TableName,
        kind: &SaveParser,
    ) -> Result<Option<KernelTable>, DataplaneError> {
        let started = std::time::Instant::now();
        let parser = RefCell::new(kind.restarted(table));
        let read = self.runner.nft_table(
            family,
            table.as_str(),
            &mut |chain| parser.borrow_mut().dump_chain(chain.name, chain.base),
            &mut |rule| {
                let revision = rule
                    .comment
                    .filter(|_| rule.comment_only)
                    .and_then(revision_of_comment);
                parser
                    .borrow_mut()
                    .dump_rule(rule.chain, revision, rule.target);
            },
            &mut || {
                let fresh = parser.borrow().restarted(table);
                *parser.borrow_mut() = fresh;
            },
        )?;
        let Some(summary) = read else {
            return Ok(None);
        };
        let (mut kernel, builtin) = parser.into_inner().finish_dump();
        tracing::debug!(
            ?family,
            table = table.as_str(),
            owned_chains = kernel
                .summary
                .map_or(kernel.chains.len(), |s| s.digest.len()),
            bytes = summary.bytes,
            consistent = summary.consistent,
            elapsed_ms = started.elapsed().as_millis(),
            "read over nfnetlink"
        );
        for chain in builtin {
            let jumps = self.read_jumps(family, table, &chain)?;
            if !jumps.is_empty() {
                kernel.jumps.insert(chain, jumps);
            }
        }
        Ok(Some(kernel))
    }

    /// The jumps to owned chains in built-in `chain`, with their words and positions,
    /// from `iptables -S CHAIN` (which prints rules as `iptables-save` does).
    fn read_jumps(
        &self,
        family: Family,
        table: TableName,
        chain: &str,
    ) -> Result<Vec<KernelJump>, DataplaneError> {
        let iptables = self.backend.binary(family, Tool::Iptables);
        let args = ["-w", LOCK_WAIT, "-t", table.as_str(), "-S", chain];
        let mut parser = SaveParser::new(table);
        parser.line(&format!("*{}", table.as_str()));
        parser.line(&format!(":{chain} ACCEPT [0:0]"));
        let output = self.runner.run_lines(&iptables, &args, &mut |line| {
            if line.starts_with("-A ") {
                parser.line(line);
            }
        })?;
        match output.code {
            Some(0) => Ok(parser.finish().jumps.remove(chain).unwrap_or_default()),
            // The chain went away since the dump.
            Some(1) => Ok(Vec::new()),
            _ => Err(output.failure(&format!("{iptables} {}", args.join(" ")))),
        }
    }

    /// The nf_tables generation on the nft back end (every commit to nf_tables changes
    /// it, by anyone); `None` on the legacy one or when the runner cannot tell.
    ///
    /// # Errors
    /// When the kernel cannot be asked.
    pub fn generation(&self) -> Result<Option<u32>, DataplaneError> {
        match self.backend {
            Backend::Nft => self.runner.nft_generation(),
            Backend::Legacy => Ok(None),
        }
    }

    /// Reads what `family` holds. IPv6 is allowed to be unavailable when nothing is
    /// wanted there (a node without IPv6): it then holds nothing.
    ///
    /// # Errors
    /// As [`Tables::read_table`].
    pub fn read_family(
        &self,
        family: Family,
        wanted: bool,
    ) -> Result<KernelFamily, DataplaneError> {
        let read = || -> Result<KernelFamily, DataplaneError> {
            Ok(KernelFamily {
                filter: self.read_table(family, TableName::Filter)?,
                nat: self.read_table(family, TableName::Nat)?,
            })
        };
        match read() {
            Err(_) if family == Family::V6 && !wanted => Ok(KernelFamily::default()),
            other => other,
        }
    }

    /// Reads what `family` holds as [`SaveParser::summary`] does: the jumps and foreign
    /// references, and of the owned chains only a digest (what a periodic check needs).
    ///
    /// # Errors
    /// As [`Tables::read_table`].
    pub fn read_family_summary(&self, family: Family) -> Result<KernelFamily, DataplaneError> {
        Ok(KernelFamily {
            filter: self.read_table_as(
                family,
                TableName::Filter,
                SaveParser::summary(TableName::Filter),
            )?,
            nat: self.read_table_as(family, TableName::Nat, SaveParser::summary(TableName::Nat))?,
        })
    }

    /// Whether the agent's rules are there, read from the kernel: a jump from `nat`
    /// `PREROUTING` to one of its chains in either family (iptables and ipvs modes both
    /// put one there). A flushed table has none, even where the empty chains stay.
    ///
    /// # Errors
    /// When `iptables` cannot be run or fails other than for a missing table.
    pub fn hold_jumps(&self) -> Result<bool, DataplaneError> {
        for family in Family::ALL {
            let iptables = self.backend.binary(family, Tool::Iptables);
            let args = ["-w", LOCK_WAIT, "-t", "nat", "-S", "PREROUTING"];
            let output = self.runner.run(&iptables, &args, None)?;
            match output.code {
                Some(0) => {
                    if output
                        .stdout
                        .lines()
                        .any(|line| line.contains(" -j PROXYPLAN-"))
                    {
                        return Ok(true);
                    }
                }
                // No nat table in this family (a node without IPv6 NAT).
                Some(1 | 3) => {}
                _ => return Err(output.failure(&format!("{iptables} {}", args.join(" ")))),
            }
        }
        Ok(false)
    }
}
