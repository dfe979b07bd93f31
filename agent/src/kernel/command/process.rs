//! [`CommandRunner`]: tools run as processes (optionally inside a network namespace),
//! conntrack entries over one ctnetlink socket, what `iptables-nft` keeps in nf_tables
//! over one nfnetlink socket.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use super::output::{CommandOutput, InputWriter, missing};
use super::runner::Runner;
use crate::kernel::conntrack::flows::{Flow, StaleFlows};
use crate::kernel::conntrack::netlink::ConntrackNetlink;
use crate::kernel::error::DataplaneError;
use crate::kernel::family::Family;
use crate::kernel::namespace::in_namespace;
use crate::kernel::xtables_nft::{DumpSummary, NftChain, NftRule, XtablesNft};

/// Runs commands with [`std::process::Command`], optionally behind a prefix such as
/// `ip netns exec NAME`; conntrack entries go over one ctnetlink socket it keeps (shared
/// by its clones).
#[derive(Debug, Clone, Default)]
pub struct CommandRunner {
    prefix: Vec<String>,
    /// The network namespace `prefix` enters, for what goes over netlink instead.
    netns: Option<String>,
    /// The ctnetlink socket, opened on first use, dropped after a failure.
    conntrack: Arc<Mutex<Option<ConntrackNetlink>>>,
    /// The nfnetlink socket that reads nf_tables, likewise.
    nftables: Arc<Mutex<Option<XtablesNft>>>,
}

impl PartialEq for CommandRunner {
    fn eq(&self, other: &Self) -> bool {
        self.prefix == other.prefix && self.netns == other.netns
    }
}

impl Eq for CommandRunner {}

impl CommandRunner {
    /// Runs commands directly, in the agent's own network namespace.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs every command as `PREFIX... program args...`.
    #[must_use]
    pub fn with_prefix(prefix: Vec<String>) -> Self {
        Self {
            prefix,
            ..Self::default()
        }
    }

    /// Runs every command inside the named network namespace (`ip netns exec NAME`).
    #[must_use]
    pub fn in_netns(name: &str) -> Self {
        Self {
            netns: Some(name.to_owned()),
            ..Self::with_prefix(vec![
                "ip".into(),
                "netns".into(),
                "exec".into(),
                name.into(),
            ])
        }
    }

    /// Runs `work` with the ctnetlink socket, opened in the runner's namespace if need be.
    fn conntrack_netlink<T>(
        &self,
        what: &str,
        work: impl FnOnce(&mut ConntrackNetlink) -> std::io::Result<T>,
    ) -> Result<T, DataplaneError> {
        self.with_socket(
            &self.conntrack,
            ConntrackNetlink::open,
            &format!("{what} over ctnetlink"),
            work,
        )
    }

    /// Runs `work` with the socket `held` (opened by `open` in the runner's namespace if
    /// there is none); a socket that failed is dropped, not reused.
    fn with_socket<S: Send, T>(
        &self,
        held: &Mutex<Option<S>>,
        open: fn() -> std::io::Result<S>,
        what: &str,
        work: impl FnOnce(&mut S) -> std::io::Result<T>,
    ) -> Result<T, DataplaneError> {
        let fail = |source| DataplaneError::Io {
            context: what.to_owned(),
            source,
        };
        let mut held = held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if held.is_none() {
            let socket = match &self.netns {
                Some(name) => in_namespace(&std::path::Path::new("/run/netns").join(name), open),
                None => open(),
            };
            *held = Some(socket.map_err(fail)?);
        }
        let Some(socket) = held.as_mut() else {
            return Err(fail(std::io::Error::other("not open")));
        };
        let result = work(socket);
        if result.is_err() {
            // A socket left mid-dump is not reused.
            *held = None;
        }
        result.map_err(fail)
    }
}

impl CommandRunner {
    /// Runs `program`: its input from `input` (none: `/dev/null`), its output to `line`
    /// line by line (none: collected).
    fn execute(
        &self,
        program: &str,
        args: &[&str],
        input: Option<&mut InputWriter<'_>>,
        line: Option<&mut dyn FnMut(&str)>,
    ) -> Result<CommandOutput, DataplaneError> {
        let mut argv: Vec<&str> = self.prefix.iter().map(String::as_str).collect();
        argv.push(program);
        argv.extend_from_slice(args);
        let (first, rest) = argv.split_first().ok_or_else(|| missing(program))?;
        let io_error = |source| DataplaneError::Io {
            context: format!("running {program}"),
            source,
        };
        let mut child = Command::new(first)
            .args(rest)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| {
                if source.kind() == std::io::ErrorKind::NotFound {
                    missing(first)
                } else {
                    io_error(source)
                }
            })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        // Output is drained by other threads while this one writes the input, so a tool
        // that writes while it reads cannot deadlock against us.
        let (written, read, stdout_text, stderr_text) = std::thread::scope(|scope| {
            let errors = scope.spawn(move || {
                let mut text = Vec::new();
                if let Some(mut pipe) = stderr {
                    std::io::Read::read_to_end(&mut pipe, &mut text)?;
                }
                Ok::<_, std::io::Error>(text)
            });
            let (written, read, out) = match line {
                // Only ever asked for without input.
                Some(line) => {
                    let read = match stdout {
                        Some(pipe) => read_lines(pipe, line),
                        None => Ok(()),
                    };
                    (Ok(()), read, Ok(Vec::new()))
                }
                None => {
                    let collector = scope.spawn(move || {
                        let mut text = Vec::new();
                        if let Some(mut pipe) = stdout {
                            std::io::Read::read_to_end(&mut pipe, &mut text)?;
                        }
                        Ok::<_, std::io::Error>(text)
                    });
                    let written = match (stdin, input) {
                        (Some(pipe), Some(input)) => {
                            let mut pipe = std::io::BufWriter::with_capacity(1 << 16, pipe);
                            // Dropping the writer closes the pipe: the tool sees the end.
                            input(&mut pipe).and_then(|()| pipe.flush())
                        }
                        _ => Ok(()),
                    };
                    let out = collector
                        .join()
                        .unwrap_or_else(|_| Err(std::io::Error::other("stdout reader panicked")));
                    (written, Ok(()), out)
                }
            };
            let err = errors
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("stderr reader panicked")));
            (written, read, out, err)
        });
        let status = child.wait().map_err(io_error)?;
        // A tool that fails early stops reading; its exit status and stderr say why.
        match written {
            Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => {}
            other => other.map_err(io_error)?,
        }
        read.map_err(io_error)?;
        let mut output = CommandOutput {
            code: status.code(),
            stdout: String::from_utf8_lossy(&stdout_text.map_err(io_error)?).into_owned(),
            stderr: String::from_utf8_lossy(&stderr_text.map_err(io_error)?).into_owned(),
        };
        if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&status) {
            // A crash (SIGSEGV) says nothing on stderr: say it.
            output.stderr.push_str(&format!(
                "{}killed by signal {signal}{}",
                if output.stderr.trim().is_empty() {
                    ""
                } else {
                    "; "
                },
                if signal == 11 {
                    " (SIGSEGV: the tool crashed)"
                } else {
                    ""
                }
            ));
        }
        // `ip netns exec` reports a missing program itself.
        if !self.prefix.is_empty()
            && !output.success()
            && output
                .stderr
                .contains(&format!("exec of \"{program}\" failed: No such file"))
        {
            return Err(missing(program));
        }
        Ok(output)
    }
}

/// Hands each line of `pipe` (without its newline) to `line`.
fn read_lines(pipe: impl std::io::Read, line: &mut dyn FnMut(&str)) -> std::io::Result<()> {
    let mut reader = std::io::BufReader::with_capacity(1 << 16, pipe);
    let mut buffer = Vec::new();
    loop {
        buffer.clear();
        if std::io::BufRead::read_until(&mut reader, b'\n', &mut buffer)? == 0 {
            return Ok(());
        }
        let text = buffer.strip_suffix(b"\n").unwrap_or(&buffer);
        line(&String::from_utf8_lossy(text));
    }
}

impl CommandRunner {
    /// The namespace's path, for what is read or written under `/proc/sys`.
    fn netns_path(&self) -> Option<std::path::PathBuf> {
        self.netns
            .as_ref()
            .map(|name| std::path::Path::new("/run/netns").join(name))
    }
}

impl Runner for CommandRunner {
    fn read_sysctl(&self, name: &str) -> Result<Option<String>, DataplaneError> {
        crate::kernel::sysctl::read(self.netns_path().as_deref(), name)
    }

    fn write_sysctl(&self, name: &str, value: &str) -> Result<(), DataplaneError> {
        crate::kernel::sysctl::write(self.netns_path().as_deref(), name, value)
    }

    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<CommandOutput, DataplaneError> {
        match stdin {
            Some(text) => self.execute(
                program,
                args,
                Some(&mut |pipe: &mut dyn Write| pipe.write_all(text.as_bytes())),
                None,
            ),
            None => self.execute(program, args, None, None),
        }
    }

    fn run_with_input(
        &self,
        program: &str,
        args: &[&str],
        input: &mut InputWriter<'_>,
    ) -> Result<CommandOutput, DataplaneError> {
        self.execute(program, args, Some(input), None)
    }

    fn run_lines(
        &self,
        program: &str,
        args: &[&str],
        line: &mut dyn FnMut(&str),
    ) -> Result<CommandOutput, DataplaneError> {
        self.execute(program, args, None, Some(line))
    }

    /// Over ctnetlink: no `conntrack` process.
    fn conntrack_list_udp(&self, family: Family) -> Result<Vec<Flow>, DataplaneError> {
        self.conntrack_netlink("listing UDP conntrack entries", |ct| ct.list_udp(family))
    }

    /// Over ctnetlink: no `conntrack` process.
    fn conntrack_delete(&self, flows: &StaleFlows) -> Result<usize, DataplaneError> {
        self.conntrack_netlink("deleting UDP conntrack entries", |ct| ct.delete(flows))
    }

    /// Over nfnetlink: no `iptables-nft-save` process.
    fn nft_table(
        &self,
        family: Family,
        table: &str,
        chain: &mut dyn FnMut(NftChain<'_>),
        rule: &mut dyn FnMut(NftRule<'_>),
        restart: &mut dyn FnMut(),
    ) -> Result<Option<DumpSummary>, DataplaneError> {
        let nft_family = match family {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        };
        let what = format!("reading nf_tables table {nft_family} {table} over nfnetlink");
        self.with_socket(&self.nftables, XtablesNft::open, &what, |nft| {
            nft.dump_table(family, table, chain, rule, restart)
        })
        .map(Some)
    }

    fn nft_generation(&self) -> Result<Option<u32>, DataplaneError> {
        self.with_socket(
            &self.nftables,
            XtablesNft::open,
            "reading the nf_tables generation over nfnetlink",
            XtablesNft::generation,
        )
        .map(Some)
    }
}
