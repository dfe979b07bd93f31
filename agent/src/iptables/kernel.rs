//! The iptables mode's kernel edge: running `iptables-save`, `iptables-restore`,
//! `iptables` and `conntrack` through a [`Runner`] (a real one over
//! [`std::process::Command`], a fake in [`fake`]), choosing the back end, and
//! [`IptablesDataplane`], the [`Dataplane`] that ties render, diff and apply together.
//!
//! The kernel is read (`iptables-save -t filter`, `-t nat`, per family, line by line) on
//! the first sync, after the canary says the rules were flushed, after a failed restore
//! and whenever [`IptablesDataplane::invalidate`] asks for it (the periodic full resync).
//! Every other sync works from the [`FamilyCache`] of what the last successful restore
//! left, and sends only the chains whose revision changed: one `iptables-restore
//! --noflush` per family, both tables in it, streamed as it is rendered, nothing at all
//! when nothing changed.

pub mod fake;

use std::io::Write;
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use proxyplan_crds::{IpFamily, MergedPlan};

use super::apply::{KernelFamily, KernelTable, SaveParser};
use super::cache::FamilyCache;
use super::conntrack::{self, EntryChange, Flow, StaleFlows, UdpTracker};
use super::conntrack_netlink::ConntrackNetlink;
use super::render::FamilyInputs;
use super::{Family, RenderSettings, TableName, names};
use crate::dataplane::{Dataplane, DataplaneError, SyncReport};

/// What a command printed and how it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandOutput {
    /// Exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl CommandOutput {
    /// Whether the command exited with 0.
    #[must_use]
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// The error for a failed `tool` (a command line).
    #[must_use]
    pub fn failure(&self, tool: &str) -> DataplaneError {
        DataplaneError::ToolFailed {
            tool: tool.to_owned(),
            code: self.code,
            stderr: self.stderr.trim().to_owned(),
        }
    }
}

/// Writes a tool's input into the pipe it reads from.
pub type InputWriter<'a> = dyn FnMut(&mut dyn Write) -> std::io::Result<()> + 'a;

/// Runs kernel tools. The one place where the iptables mode executes anything.
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

    /// The UDP conntrack entries of `family`. The default lists them with `conntrack -L`.
    ///
    /// # Errors
    /// When they cannot be listed.
    fn conntrack_list_udp(&self, family: Family) -> Result<Vec<Flow>, DataplaneError> {
        conntrack::list_udp(self, family)
    }

    /// Deletes the conntrack entries `flows` names; returns how many the kernel had.
    /// The default runs `conntrack -D`.
    ///
    /// # Errors
    /// When they cannot be deleted (finding none is not an error).
    fn conntrack_delete(&self, flows: &StaleFlows) -> Result<usize, DataplaneError> {
        conntrack::delete(self, flows)
    }
}

/// The Debian package that provides `program`.
#[must_use]
pub fn package_of(program: &str) -> &'static str {
    match program {
        "conntrack" => "conntrack",
        "ip" => "iproute2",
        "ipset" => "ipset",
        _ => "iptables",
    }
}

fn missing(program: &str) -> DataplaneError {
    DataplaneError::MissingTool {
        tool: program.to_owned(),
        hint: format!("Debian package {}", package_of(program)),
    }
}

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
        let fail = |source| DataplaneError::Io {
            context: format!("{what} over ctnetlink"),
            source,
        };
        let mut held = self
            .conntrack
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if held.is_none() {
            let socket = match &self.netns {
                Some(name) => crate::kernel::namespace::in_namespace(
                    &std::path::Path::new("/run/netns").join(name),
                    ConntrackNetlink::open,
                ),
                None => ConntrackNetlink::open(),
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
        let output = CommandOutput {
            code: status.code(),
            stdout: String::from_utf8_lossy(&stdout_text.map_err(io_error)?).into_owned(),
            stderr: String::from_utf8_lossy(&stderr_text.map_err(io_error)?).into_owned(),
        };
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

impl Runner for CommandRunner {
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
}

/// The iptables back end asked for on the command line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// The one the node already uses (see [`detect_backend`]).
    #[default]
    Auto,
    /// `iptables-nft`.
    Nft,
    /// `iptables-legacy`.
    Legacy,
}

impl FromStr for BackendChoice {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(Self::Auto),
            "nft" => Ok(Self::Nft),
            "legacy" => Ok(Self::Legacy),
            other => Err(format!(
                "unknown iptables back end {other:?} (auto, nft or legacy)"
            )),
        }
    }
}

impl std::fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Nft => "nft",
            Self::Legacy => "legacy",
        })
    }
}

/// An iptables back end: which binaries the agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `iptables-nft`, `iptables-nft-save`, `iptables-nft-restore` (and `ip6tables-nft*`).
    Nft,
    /// `iptables-legacy`, `iptables-legacy-save`, `iptables-legacy-restore`.
    Legacy,
}

/// The three iptables tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// `iptables`.
    Iptables,
    /// `iptables-save`.
    Save,
    /// `iptables-restore`.
    Restore,
}

impl Backend {
    /// The binary of `tool` for `family`, e.g. `ip6tables-nft-restore`.
    #[must_use]
    pub fn binary(self, family: Family, tool: Tool) -> String {
        let base = match family {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        };
        let backend = match self {
            Self::Nft => "nft",
            Self::Legacy => "legacy",
        };
        let suffix = match tool {
            Tool::Iptables => "",
            Tool::Save => "-save",
            Tool::Restore => "-restore",
        };
        format!("{base}-{backend}{suffix}")
    }

    /// The back end a choice names; `Auto` asks the kernel.
    pub fn resolve(choice: BackendChoice, runner: &dyn Runner) -> Self {
        match choice {
            BackendChoice::Nft => Self::Nft,
            BackendChoice::Legacy => Self::Legacy,
            BackendChoice::Auto => detect_backend(runner),
        }
    }
}

/// The back end the node already uses, as kubernetes-sigs/iptables-wrappers decides: the
/// one whose `*-save` (both families, all loaded tables) prints more rules; nft on a tie,
/// so an empty node gets nft. A back end whose tools are missing counts zero rules.
pub fn detect_backend(runner: &dyn Runner) -> Backend {
    let rules = |backend: Backend| -> usize {
        [Family::V4, Family::V6]
            .into_iter()
            .filter_map(|family| {
                runner
                    .run(&backend.binary(family, Tool::Save), &[], None)
                    .ok()
            })
            .map(|out| out.stdout.lines().filter(|l| l.starts_with('-')).count())
            .sum()
    };
    if rules(Backend::Legacy) > rules(Backend::Nft) {
        Backend::Legacy
    } else {
        Backend::Nft
    }
}

/// Seconds `iptables-restore` and `iptables` wait for the xtables lock (legacy back end;
/// the nft tools accept and ignore the flag).
const LOCK_WAIT: &str = "5";

/// Bytes of the payload a real (not dry-run) sync keeps in its [`SyncReport`]: a first
/// sync of a large node sends hundreds of megabytes, which are streamed to
/// `iptables-restore` and not held. What is left out is summed up in a last comment
/// line; [`IptablesDataplane::payload_sent`] has the full size.
pub const REPORT_PAYLOAD_LIMIT: usize = 1 << 20;

/// Size of what a sync sent (or, dry, would send) to `iptables-restore`, both families.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PayloadSize {
    /// Bytes.
    pub bytes: usize,
    /// Lines.
    pub lines: usize,
}

/// iptables mode's [`Dataplane`].
#[derive(Debug)]
pub struct IptablesDataplane<R> {
    settings: RenderSettings,
    runner: R,
    backend: Backend,
    /// `[v4, v6]`.
    families: [FamilyState; 2],
    /// The UDP paths of the last plan synced, for stale conntrack entries.
    udp: UdpTracker,
    /// What the last sync sent.
    sent: PayloadSize,
}

/// One family's knowledge of the kernel.
#[derive(Debug, Default)]
struct FamilyState {
    /// The jumps in built-in chains and the foreign references, and, right after the
    /// kernel was read, its chains; `None` until read.
    kernel: Option<KernelFamily>,
    /// Whether the kernel holds exactly the chains `cache` describes (then `kernel`
    /// does not track them).
    in_sync: bool,
    /// What the last successful sync programmed.
    cache: FamilyCache,
    /// Whether the family had rules after the last successful sync.
    programmed: bool,
}

const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

fn index(family: Family) -> usize {
    match family {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

fn ip_family(family: Family) -> IpFamily {
    match family {
        Family::V4 => IpFamily::IPv4,
        Family::V6 => IpFamily::IPv6,
    }
}

/// Reads one table with `iptables-save -t TABLE`, line by line.
fn read_table(
    runner: &dyn Runner,
    backend: Backend,
    family: Family,
    table: TableName,
) -> Result<KernelTable, DataplaneError> {
    let save = backend.binary(family, Tool::Save);
    let args = ["-t", table.as_str()];
    let mut parser = SaveParser::new(table);
    let output = runner.run_lines(&save, &args, &mut |line| parser.line(line))?;
    if !output.success() {
        return Err(output.failure(&format!("{save} {}", args.join(" "))));
    }
    Ok(parser.finish())
}

/// Reads what `family` holds. IPv6 is allowed to be unavailable when nothing is wanted
/// there (a node without IPv6): it then holds nothing.
fn read_family(
    runner: &dyn Runner,
    backend: Backend,
    family: Family,
    wanted: bool,
) -> Result<KernelFamily, DataplaneError> {
    let read = || -> Result<KernelFamily, DataplaneError> {
        Ok(KernelFamily {
            filter: read_table(runner, backend, family, TableName::Filter)?,
            nat: read_table(runner, backend, family, TableName::Nat)?,
        })
    };
    match read() {
        Err(_) if family == Family::V6 && !wanted => Ok(KernelFamily::default()),
        other => other,
    }
}

/// The report's copy of the payload: all of it, or the first `limit` bytes in whole
/// lines and a comment saying what was left out.
struct ReportText {
    text: String,
    limit: usize,
    omitted_bytes: usize,
    omitted_lines: usize,
    cut: bool,
}

impl ReportText {
    fn new(limit: usize) -> Self {
        Self {
            text: String::new(),
            limit,
            omitted_bytes: 0,
            omitted_lines: 0,
            cut: false,
        }
    }

    fn push(&mut self, part: &str) {
        if !self.cut && self.text.len() + part.len() <= self.limit {
            self.text.push_str(part);
            return;
        }
        if !self.cut {
            self.cut = true;
            let keep = self.text.rfind('\n').map_or(0, |i| i + 1);
            self.omitted_bytes += self.text.len() - keep;
            self.text.truncate(keep);
        }
        self.omitted_bytes += part.len();
        self.omitted_lines += part.matches('\n').count();
    }

    fn finish(mut self) -> String {
        if self.cut {
            self.text.push_str(&format!(
                "# ... {} more lines ({} bytes) not kept in this report\n",
                self.omitted_lines, self.omitted_bytes
            ));
        }
        self.text
    }
}

impl Write for ReportText {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.push(&String::from_utf8_lossy(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes the payload to the tool (if any) and the report, counting it.
struct Tee<'a> {
    pipe: Option<&'a mut dyn Write>,
    report: &'a mut ReportText,
    size: &'a mut PayloadSize,
}

impl Write for Tee<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(pipe) = self.pipe.as_mut() {
            pipe.write_all(buf)?;
        }
        self.report.write_all(buf)?;
        self.size.bytes += buf.len();
        self.size.lines += buf.iter().filter(|b| **b == b'\n').count();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self.pipe.as_mut() {
            Some(pipe) => pipe.flush(),
            None => Ok(()),
        }
    }
}

/// Finds line `want` (1-based) of what is written to it.
struct LineFinder {
    want: usize,
    line: usize,
    found: Vec<u8>,
}

impl Write for LineFinder {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for byte in buf {
            if *byte == b'\n' {
                self.line += 1;
                if self.line > self.want {
                    return Err(std::io::Error::other("found"));
                }
            } else if self.line == self.want {
                self.found.push(*byte);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The line number an `iptables-restore` error points at (`line N failed`, `Error
/// occurred at line: N`).
fn failed_line_number(stderr: &str) -> Option<usize> {
    let rest = stderr.split("line").nth(1)?;
    let rest = rest.trim_start_matches([':', ' ']);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

impl<R: Runner> IptablesDataplane<R> {
    /// A dataplane that programs through `runner` with `backend`'s tools.
    #[must_use]
    pub fn new(settings: RenderSettings, runner: R, backend: Backend) -> Self {
        Self {
            settings,
            runner,
            backend,
            families: [FamilyState::default(), FamilyState::default()],
            udp: UdpTracker::default(),
            sent: PayloadSize::default(),
        }
    }

    /// A dataplane whose back end is chosen by `choice` (asking the kernel for `Auto`).
    #[must_use]
    pub fn with_backend_choice(settings: RenderSettings, runner: R, choice: BackendChoice) -> Self {
        let backend = Backend::resolve(choice, &runner);
        Self::new(settings, runner, backend)
    }

    /// The back end in use.
    #[must_use]
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The runner (for tests to inspect a fake).
    #[must_use]
    pub fn runner(&self) -> &R {
        &self.runner
    }

    /// What the last sync or cleanup sent to `iptables-restore` (dry: would have sent),
    /// all of it, even when its report keeps only the beginning.
    #[must_use]
    pub fn payload_sent(&self) -> PayloadSize {
        self.sent
    }

    /// Forgets the model: the next sync reads the kernel again (the periodic full
    /// resync).
    pub fn invalidate(&mut self) {
        for state in &mut self.families {
            state.kernel = None;
        }
    }

    /// Brings one family to `inputs` (no entries: nothing); returns the chains and jumps
    /// changed, the rules the family then has, and the entries that changed.
    fn sync_family<'p>(
        &mut self,
        family: Family,
        inputs: FamilyInputs<'p>,
        dry_run: bool,
        report: &mut ReportText,
    ) -> Result<(usize, usize, Vec<EntryChange<'p>>), DataplaneError> {
        let wanted = !inputs.entries.is_empty();
        let ip = ip_family(family);
        let runner: &dyn Runner = &self.runner;
        let state = &mut self.families[index(family)];
        let (mut kernel, mut in_sync) = match state.kernel.take() {
            Some(kernel) => (kernel, state.in_sync),
            None => (read_family(runner, self.backend, family, wanted)?, false),
        };
        let mut delta = state
            .cache
            .diff(inputs, &self.settings, ip, &mut kernel, in_sync);
        if delta.needs_fresh_positions() {
            let inputs = delta.into_inputs();
            kernel = read_family(runner, self.backend, family, wanted)?;
            in_sync = false;
            delta = state
                .cache
                .diff(inputs, &self.settings, ip, &mut kernel, in_sync);
        }
        let changed = delta.changes();
        let rules = delta.rule_count();
        let entries = delta.entry_changes(&state.cache);
        if changed > 0 {
            report.push(&family_header(self.backend, family));
            if dry_run {
                let mut tee = Tee {
                    pipe: None,
                    report,
                    size: &mut self.sent,
                };
                delta
                    .write_payload(&mut tee)
                    .map_err(|source| DataplaneError::Io {
                        context: "writing the payload".into(),
                        source,
                    })?;
            } else {
                let restore = self.backend.binary(family, Tool::Restore);
                let args = ["--noflush", "-w", LOCK_WAIT];
                let sent = &mut self.sent;
                let output = runner.run_with_input(&restore, &args, &mut |pipe| {
                    let mut tee = Tee {
                        pipe: Some(pipe),
                        report: &mut *report,
                        size: &mut *sent,
                    };
                    delta.write_payload(&mut tee)
                })?;
                // On failure the model stays unset: the next sync reads the kernel again.
                if !output.success() {
                    let mut err = output.failure(&format!("{restore} {}", args.join(" ")));
                    if let DataplaneError::ToolFailed { stderr, .. } = &mut err
                        && let Some(number) = failed_line_number(stderr)
                    {
                        let mut finder = LineFinder {
                            want: number,
                            line: 1,
                            found: Vec::new(),
                        };
                        // Stops with an error once the line is complete.
                        let _ = delta.write_payload(&mut finder);
                        if number > 0 && !finder.found.is_empty() {
                            let line = String::from_utf8_lossy(&finder.found).into_owned();
                            stderr.push_str(&format!(" (the line: {line})"));
                        }
                    }
                    return Err(err);
                }
                tracing::debug!(
                    family = ?family,
                    changed,
                    "iptables-restore applied the changed chains"
                );
            }
        }
        if !dry_run {
            state.cache.commit(delta, &mut kernel);
            in_sync = true;
            state.programmed = rules > 0;
        }
        // Positions read now are stale by the next sync.
        kernel.filter.positions_fresh = false;
        kernel.nat.positions_fresh = false;
        state.kernel = Some(kernel);
        state.in_sync = in_sync;
        Ok((changed, rules, entries))
    }

    fn canary_intact(&self, family: Family, table: TableName) -> Result<bool, DataplaneError> {
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

fn family_header(backend: Backend, family: Family) -> String {
    format!("# {} --noflush\n", backend.binary(family, Tool::Restore))
}

impl<R: Runner> Dataplane for IptablesDataplane<R> {
    fn sync(&mut self, plan: &MergedPlan, dry_run: bool) -> Result<SyncReport, DataplaneError> {
        let mut text = ReportText::new(if dry_run {
            usize::MAX
        } else {
            REPORT_PAYLOAD_LIMIT
        });
        self.sent = PayloadSize::default();
        let mut report = SyncReport::default();
        let mut changes = Vec::new();
        for family in FAMILIES {
            let inputs = FamilyInputs::of(plan, ip_family(family));
            let (changed, rules, entries) = self.sync_family(family, inputs, dry_run, &mut text)?;
            report.changed += changed;
            report.rules += rules;
            changes.extend(entries);
        }
        report.conntrack_deleted =
            self.udp
                .clear(&self.runner, plan, Some(&changes), dry_run, &mut |line| {
                    text.push(line)
                })?;
        report.payload = text.finish();
        Ok(report)
    }

    fn rules_intact(&mut self) -> Result<bool, DataplaneError> {
        for family in FAMILIES {
            if !self.families[index(family)].programmed {
                continue;
            }
            for table in [TableName::Nat, TableName::Filter] {
                if !self.canary_intact(family, table)? {
                    self.families[index(family)].kernel = None;
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    fn cleanup(&mut self) -> Result<SyncReport, DataplaneError> {
        let mut text = ReportText::new(REPORT_PAYLOAD_LIMIT);
        self.sent = PayloadSize::default();
        let mut report = SyncReport::default();
        for family in FAMILIES {
            // Always from a fresh read: leftovers of an earlier run count too.
            self.families[index(family)].kernel = None;
            let nothing = FamilyInputs {
                entries: Vec::new(),
                local_cidr: None,
                node_addresses: Vec::new(),
            };
            let (changed, _, _) = self.sync_family(family, nothing, false, &mut text)?;
            report.changed += changed;
            self.families[index(family)].programmed = false;
        }
        self.udp.reset();
        report.payload = text.finish();
        Ok(report)
    }
}
