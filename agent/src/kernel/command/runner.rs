//! [`Runner`]: how the agent runs kernel tools and reaches the conntrack table, so that
//! a fake can stand in for the kernel in tests.

use super::output::{CommandOutput, InputWriter};
use crate::kernel::conntrack::flows::{Flow, StaleFlows};
use crate::kernel::conntrack::tool;
use crate::kernel::error::DataplaneError;
use crate::kernel::family::Family;
use crate::kernel::xtables_nft::{DumpSummary, NftChain, NftRule};

/// Runs kernel tools. The one place where the agent executes anything.
pub trait Runner {
    /// Runs `program` with `args`, feeding it `stdin`, and waits for it.
    ///
    /// # Errors
    /// [`DataplaneError::MissingTool`] when the program does not exist,
    /// [`DataplaneError::Io`] when it could not be run; a non-zero exit is not an error
    /// here.
    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<CommandOutput, DataplaneError>;

    /// [`Runner::run`] with the input written by `input` as the tool reads it, so a
    /// large input is never held whole. The default collects it and calls
    /// [`Runner::run`].
    ///
    /// # Errors
    /// As [`Runner::run`]; [`DataplaneError::Io`] when `input` fails other than because
    /// the tool stopped reading.
    fn run_with_input(
        &self,
        program: &str,
        args: &[&str],
        input: &mut InputWriter<'_>,
    ) -> Result<CommandOutput, DataplaneError> {
        let mut bytes = Vec::new();
        input(&mut bytes).map_err(|source| DataplaneError::Io {
            context: format!("writing the input of {program}"),
            source,
        })?;
        let text = String::from_utf8(bytes).map_err(|err| DataplaneError::Io {
            context: format!("writing the input of {program}"),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, err),
        })?;
        self.run(program, args, Some(&text))
    }

    /// [`Runner::run`] without input, handing each line of standard output to `line` as
    /// it arrives (the output returned has an empty `stdout`), so a large output is never
    /// held whole. The default calls [`Runner::run`] and splits its output.
    ///
    /// # Errors
    /// As [`Runner::run`].
    fn run_lines(
        &self,
        program: &str,
        args: &[&str],
        line: &mut dyn FnMut(&str),
    ) -> Result<CommandOutput, DataplaneError> {
        let mut output = self.run(program, args, None)?;
        for text in output.stdout.lines() {
            line(text);
        }
        output.stdout = String::new();
        Ok(output)
    }

    /// Reads a sysctl (`net/netfilter/nf_conntrack_tcp_be_liberal`) where the tools run;
    /// `None` when it does not exist. The default reads the agent's own namespace.
    ///
    /// # Errors
    /// When it exists but cannot be read.
    fn read_sysctl(&self, name: &str) -> Result<Option<String>, DataplaneError> {
        crate::kernel::sysctl::read(None, name)
    }

    /// Writes a sysctl where the tools run. The default writes the agent's own namespace.
    ///
    /// # Errors
    /// When it cannot be written.
    fn write_sysctl(&self, name: &str, value: &str) -> Result<(), DataplaneError> {
        crate::kernel::sysctl::write(None, name, value)
    }

    /// The UDP conntrack entries of `family`. The default lists them with `conntrack -L`.
    ///
    /// # Errors
    /// When they cannot be listed.
    fn conntrack_list_udp(&self, family: Family) -> Result<Vec<Flow>, DataplaneError> {
        tool::list_udp(&|program, args| self.run(program, args, None), family)
    }

    /// Deletes the conntrack entries `flows` names; returns how many the kernel had.
    /// The default runs `conntrack -D`.
    ///
    /// # Errors
    /// When they cannot be deleted (finding none is not an error).
    fn conntrack_delete(&self, flows: &StaleFlows) -> Result<usize, DataplaneError> {
        tool::delete(&|program, args| self.run(program, args, None), flows)
    }

    /// Reads `family`'s nf_tables `table` as `iptables-nft` left it, over nfnetlink: its
    /// chains, then its rules in order ([`crate::kernel::xtables_nft`]); `restart` is
    /// called before a dump is read again because nf_tables changed meanwhile. `None`:
    /// this runner cannot (a fake without netlink), the caller runs `iptables-nft-save`.
    ///
    /// # Errors
    /// When the dump fails.
    fn nft_table(
        &self,
        family: Family,
        table: &str,
        chain: &mut dyn FnMut(NftChain<'_>),
        rule: &mut dyn FnMut(NftRule<'_>),
        restart: &mut dyn FnMut(),
    ) -> Result<Option<DumpSummary>, DataplaneError> {
        let _ = (family, table, chain, rule, restart);
        Ok(None)
    }

    /// The nf_tables generation, which every commit to nf_tables changes (see
    /// [`crate::kernel::xtables_nft::XtablesNft::generation`]). `None`: this runner
    /// cannot tell.
    ///
    /// # Errors
    /// When the kernel cannot be asked.
    fn nft_generation(&self) -> Result<Option<u32>, DataplaneError> {
        Ok(None)
    }
}
