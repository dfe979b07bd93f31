//! What both modes do with the agent's tables through a [`Runner`]: read a family from
//! `iptables-save`, line by line, and check the canary chain.

use super::names;
use super::rules::TableName;
use super::save::{KernelFamily, KernelTable, SaveParser};
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
    /// Reads one table with `iptables-save -t TABLE`, line by line.
    ///
    /// # Errors
    /// When `iptables-save` cannot be run or fails.
    pub fn read_table(
        &self,
        family: Family,
        table: TableName,
    ) -> Result<KernelTable, DataplaneError> {
        let save = self.backend.binary(family, Tool::Save);
        let args = ["-t", table.as_str()];
        let mut parser = SaveParser::new(table);
        let output = self
            .runner
            .run_lines(&save, &args, &mut |line| parser.line(line))?;
        if !output.success() {
            return Err(output.failure(&format!("{save} {}", args.join(" "))));
        }
        Ok(parser.finish())
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

    /// Whether the canary chain of `table` still holds its rule: when someone flushed
    /// the agent's rules, it is gone too.
    ///
    /// # Errors
    /// When `iptables` cannot be run or fails other than for a missing chain.
    pub fn canary_intact(&self, family: Family, table: TableName) -> Result<bool, DataplaneError> {
        let iptables = self.backend.binary(family, Tool::Iptables);
        let args = ["-w", LOCK_WAIT, "-t", table.as_str(), "-S", names::CANARY];
        let output = self.runner.run(&iptables, &args, None)?;
        match output.code {
            Some(0) => {
                let rule = format!("-A {} ", names::CANARY);
                Ok(output.stdout.lines().any(|l| l.starts_with(&rule)))
            }
            // No such chain.
            Some(1) => Ok(false),
            _ => Err(output.failure(&format!("{iptables} {}", args.join(" ")))),
        }
    }
}
