//! The iptables mode's kernel edge: running `iptables-save`, `iptables-restore`,
//! `iptables` and `conntrack` through a [`Runner`] (a real one over
//! [`std::process::Command`], a fake in [`fake`]), choosing the back end, and
//! [`IptablesDataplane`], the [`Dataplane`] that ties render, diff and apply together.
//!
//! The kernel is read (`iptables-save -t filter`, `-t nat`, per family) on the first sync,
//! after the canary says the rules were flushed, after a failed restore and whenever
//! [`IptablesDataplane::invalidate`] asks for it (the periodic full resync). Every other
//! sync works from the in-memory model updated after each successful restore, and sends
//! only the chains whose revision changed: one `iptables-restore --noflush` per family,
//! both tables in it, nothing at all when nothing changed.

pub mod fake;

use std::io::Write;
use std::process::{Command, Stdio};
use std::str::FromStr;

use proxyplan_crds::MergedPlan;

use super::apply::{FamilyDiff, KernelFamily, KernelTable};
use super::conntrack::{self, StaleFlows, UdpPaths};
use super::render::{ChainRevisions, RenderCache};
use super::{Family, FamilyRules, RenderSettings, TableName, names};
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
/// `ip netns exec NAME`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandRunner {
    prefix: Vec<String>,
}

impl CommandRunner {
    /// Runs commands directly, in the agent's own network namespace.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs every command as `PREFIX... program args...`.
    #[must_use]
    pub fn with_prefix(prefix: Vec<String>) -> Self {
        Self { prefix }
    }

    /// Runs every command inside the named network namespace (`ip netns exec NAME`).
    #[must_use]
    pub fn in_netns(name: &str) -> Self {
        Self::with_prefix(vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            name.into(),
        ])
    }
}

impl Runner for CommandRunner {
    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<CommandOutput, DataplaneError> {
        let mut argv: Vec<&str> = self.prefix.iter().map(String::as_str).collect();
        argv.push(program);
        argv.extend_from_slice(args);
        let (first, rest) = argv.split_first().ok_or_else(|| missing(program))?;
        let mut child = Command::new(first)
            .args(rest)
            .stdin(if stdin.is_some() {
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
                    DataplaneError::Io {
                        context: format!("running {program}"),
                        source,
                    }
                }
            })?;
        let input = child.stdin.take();
        // Feed stdin from another thread so a tool that writes while it reads cannot
        // deadlock against us.
        let output = std::thread::scope(|scope| {
            let writer = scope.spawn(move || match (input, stdin) {
                (Some(mut pipe), Some(text)) => pipe.write_all(text.as_bytes()),
                _ => Ok(()),
            });
            let output = child.wait_with_output();
            let written = writer
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("stdin writer panicked")));
            // A tool that fails early stops reading; its exit status and stderr say why.
            let written = match written {
                Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                other => other,
            };
            output.and_then(|o| written.map(|()| o))
        })
        .map_err(|source| DataplaneError::Io {
            context: format!("running {program}"),
            source,
        })?;
        let output = CommandOutput {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
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

/// iptables mode's [`Dataplane`].
#[derive(Debug)]
pub struct IptablesDataplane<R> {
    settings: RenderSettings,
    runner: R,
    backend: Backend,
    /// What each family holds (`[v4, v6]`); `None` until read.
    kernel: [Option<KernelFamily>; 2],
    /// Whether each family had rules after the last successful sync.
    programmed: [bool; 2],
    /// The UDP paths of the last plan synced, for stale conntrack entries.
    udp: Option<UdpPaths>,
    /// The rules of the last plan rendered, reused entry by entry.
    rendered: RenderCache,
}

const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

fn index(family: Family) -> usize {
    match family {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

impl<R: Runner> IptablesDataplane<R> {
    /// A dataplane that programs through `runner` with `backend`'s tools.
    #[must_use]
    pub fn new(settings: RenderSettings, runner: R, backend: Backend) -> Self {
        Self {
            settings,
            runner,
            backend,
            kernel: [None, None],
            programmed: [false, false],
            udp: None,
            rendered: RenderCache::default(),
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

    /// Forgets the model: the next sync reads the kernel again (the periodic full
    /// resync).
    pub fn invalidate(&mut self) {
        self.kernel = [None, None];
    }

    fn read_table(&self, family: Family, table: TableName) -> Result<KernelTable, DataplaneError> {
        let save = self.backend.binary(family, Tool::Save);
        let args = ["-t", table.as_str()];
        let output = self.runner.run(&save, &args, None)?;
        if !output.success() {
            return Err(output.failure(&format!("{save} {}", args.join(" "))));
        }
        Ok(KernelTable::from_save(&output.stdout, table))
    }

    /// Reads what `family` holds. IPv6 is allowed to be unavailable when nothing is
    /// wanted there (a node without IPv6): it then holds nothing.
    fn read_family(&self, family: Family, wanted: bool) -> Result<KernelFamily, DataplaneError> {
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

    fn restore(&self, family: Family, payload: &str) -> Result<(), DataplaneError> {
        let restore = self.backend.binary(family, Tool::Restore);
        let args = ["--noflush", "-w", LOCK_WAIT];
        let output = self.runner.run(&restore, &args, Some(payload))?;
        if output.success() {
            return Ok(());
        }
        let mut err = output.failure(&format!("{restore} {}", args.join(" ")));
        if let DataplaneError::ToolFailed { stderr, .. } = &mut err
            && let Some(line) = failed_line(stderr, payload)
        {
            stderr.push_str(&format!(" (the line: {line})"));
        }
        Err(err)
    }

    /// Brings one family to `desired`; returns the payload sent (or that would be).
    fn sync_family(
        &mut self,
        family: Family,
        desired: &FamilyRules,
        revisions: Option<&ChainRevisions>,
        dry_run: bool,
    ) -> Result<(String, usize), DataplaneError> {
        let i = index(family);
        let wanted = desired.rule_count() > 0;
        let mut kernel = match self.kernel[i].take() {
            Some(kernel) => kernel,
            None => self.read_family(family, wanted)?,
        };
        let mut diff = FamilyDiff::with_revisions(desired, &kernel, revisions);
        if diff.needs_fresh_positions() {
            kernel = self.read_family(family, wanted)?;
            diff = FamilyDiff::with_revisions(desired, &kernel, revisions);
        }
        let payload = diff.restore_payload();
        if !payload.is_empty() && !dry_run {
            // On failure the model stays unset: the next sync reads the kernel again.
            self.restore(family, &payload)?;
            diff.apply_to(&mut kernel);
        }
        let changed = diff.changed();
        // Positions read now are stale by the next sync.
        kernel.filter.positions_fresh = false;
        kernel.nat.positions_fresh = false;
        self.kernel[i] = Some(kernel);
        Ok((payload, changed))
    }

    /// [`Dataplane::sync`] with the rules from `rendered`.
    fn sync_rendered(
        &mut self,
        rendered: &mut RenderCache,
        plan: &MergedPlan,
        dry_run: bool,
    ) -> Result<SyncReport, DataplaneError> {
        let desired = rendered.update(plan, &self.settings);
        let mut report = SyncReport {
            rules: desired.iter().map(|(r, _)| r.rule_count()).sum(),
            ..SyncReport::default()
        };
        for (family, (rules, revisions)) in FAMILIES.into_iter().zip(desired) {
            let (payload, changed) = self.sync_family(family, rules, Some(revisions), dry_run)?;
            if !payload.is_empty() {
                report
                    .payload
                    .push_str(&family_header(self.backend, family));
                report.payload.push_str(&payload);
            }
            report.changed += changed;
            if !dry_run {
                self.programmed[index(family)] = rules.rule_count() > 0;
            }
        }
        let next = UdpPaths::from_plan(plan);
        report.conntrack_deleted =
            self.clear_conntrack(plan, &next, dry_run, &mut report.payload)?;
        if !dry_run {
            self.udp = Some(next);
        }
        Ok(report)
    }

    /// Deletes the UDP conntrack entries the move to `next` made stale.
    fn clear_conntrack(
        &self,
        plan: &MergedPlan,
        next: &UdpPaths,
        dry_run: bool,
        payload: &mut String,
    ) -> Result<usize, DataplaneError> {
        let flows: Vec<StaleFlows> = match &self.udp {
            Some(previous) => conntrack::stale_flows(previous, next),
            None if dry_run => Vec::new(),
            None => {
                let mut flows = Vec::new();
                for family in FAMILIES.into_iter().filter(|f| next.has_family(*f)) {
                    let listed = conntrack::list_udp(&self.runner, family)?;
                    flows.extend(conntrack::stale_in_table(&listed, next, &plan.addresses));
                }
                flows
            }
        };
        let mut deleted = 0;
        for flow in &flows {
            payload.push_str(&format!(
                "# {} {}\n",
                conntrack::CONNTRACK,
                flow.conntrack_args().join(" ")
            ));
            if !dry_run {
                deleted += conntrack::delete(&self.runner, flow)?;
            }
        }
        Ok(deleted)
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

/// The payload line an `iptables-restore` error points at (`line N failed`, `Error
/// occurred at line: N`).
fn failed_line<'p>(stderr: &str, payload: &'p str) -> Option<&'p str> {
    let rest = stderr.split("line").nth(1)?;
    let rest = rest.trim_start_matches([':', ' ']);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let number: usize = digits.parse().ok()?;
    payload.lines().nth(number.checked_sub(1)?)
}

fn family_header(backend: Backend, family: Family) -> String {
    format!("# {} --noflush\n", backend.binary(family, Tool::Restore))
}

impl<R: Runner> Dataplane for IptablesDataplane<R> {
    fn sync(&mut self, plan: &MergedPlan, dry_run: bool) -> Result<SyncReport, DataplaneError> {
        // Taken out while syncing (the sync borrows `self` mutably); the cache depends
        // only on the plans rendered, so it stays valid whatever the kernel says.
        let mut rendered = std::mem::take(&mut self.rendered);
        let result = self.sync_rendered(&mut rendered, plan, dry_run);
        self.rendered = rendered;
        result
    }

    fn rules_intact(&mut self) -> Result<bool, DataplaneError> {
        for family in FAMILIES {
            if !self.programmed[index(family)] {
                continue;
            }
            for table in [TableName::Nat, TableName::Filter] {
                if !self.canary_intact(family, table)? {
                    self.kernel[index(family)] = None;
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    fn cleanup(&mut self) -> Result<SyncReport, DataplaneError> {
        let nothing = FamilyRules::default();
        let mut report = SyncReport::default();
        for family in FAMILIES {
            // Always from a fresh read: leftovers of an earlier run count too.
            self.kernel[index(family)] = None;
            let (payload, changed) = self.sync_family(family, &nothing, None, false)?;
            if !payload.is_empty() {
                report
                    .payload
                    .push_str(&family_header(self.backend, family));
                report.payload.push_str(&payload);
            }
            report.changed += changed;
            self.programmed[index(family)] = false;
        }
        self.udp = None;
        Ok(report)
    }
}
