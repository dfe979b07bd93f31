//! iptables mode's [`Dataplane`]: [`IptablesDataplane`] ties render, diff and apply
//! together, running `iptables-save`, `iptables-restore` and `iptables` through a
//! [`Runner`] (a real one, or the fake of [`crate::kernel::command::fake`]).
//!
//! The kernel is read ([`Tables::read_family`]: over nfnetlink on the nft back end,
//! `iptables-legacy-save` on the legacy one) on the first sync, after the periodic check
//! found it differs from what the agent left, after a failed restore and whenever
//! [`IptablesDataplane::invalidate`] asks for it. Every other sync works from the
//! `FamilyCache` of what the last successful restore left, and sends only the chains
//! whose revision changed: one `iptables-restore --noflush` per family, both tables in
//! it, streamed as it is rendered, nothing at all when nothing changed.
//!
//! The periodic check ([`Dataplane::rules_intact`]) reads the kernel and compares it with
//! that cache: a chain missing, flushed or with a rule added, a stray owned chain, a
//! jump from a built-in chain missing or altered. It reads a digest of the owned chains
//! first ([`Tables::read_family_summary`]), not the chains themselves, and reads them
//! whole only when the digest differs, to say how and to repair from there. On the nft back end it first asks for
//! the nf_tables generation, which every commit by anyone changes: when only the
//! agent's own restores committed since the kernel last matched the cache, nothing was
//! touched and nothing is read.

use std::io::Write;

use proxyplan_crds::MergedPlan;

use super::cache::FamilyCache;
use super::groups::ip_family;
use super::render::FamilyInputs;
use super::settings::RenderSettings;
use crate::conntrack::{EntryChange, UdpTracker};
use crate::dataplane::{Dataplane, DataplaneError, REPORT_TEXT_LIMIT, SyncReport};
use crate::kernel::command::Runner;
use crate::kernel::family::Family;
use crate::kernel::iptables::{Backend, BackendChoice, LOCK_WAIT, Tool};
use crate::ruleset::save::{KernelChains, KernelFamily};
use crate::ruleset::tables::Tables;

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
    /// The nf_tables generation at which the kernel was last known to hold exactly what
    /// the caches describe (nft back end only): nobody else committed since.
    verified: Option<u32>,
    /// Whether `route_localnet=1` is known to be set (localhost node ports).
    route_localnet: bool,
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
    pub fn new(mut settings: RenderSettings, runner: R, backend: Backend) -> Self {
        // As kube-proxy: with liberal TCP tracking, out-of-window packets are not
        // invalid, and dropping the rest is left to the node's own firewall.
        if settings.drop_invalid && crate::conntrack::tcp_be_liberal(&runner) {
            settings.drop_invalid = false;
        }
        Self {
            settings,
            runner,
            backend,
            families: [FamilyState::default(), FamilyState::default()],
            udp: UdpTracker::default(),
            sent: PayloadSize::default(),
            verified: None,
            route_localnet: false,
        }
    }

    /// Sets `route_localnet=1` once, when localhost node ports are served (kube-proxy
    /// does the same; the martian guard in the filter table comes with it).
    fn allow_localhost_node_ports(&mut self) -> Result<(), DataplaneError> {
        if self.route_localnet || !self.settings.localhost_nodeports_on() {
            return Ok(());
        }
        tracing::info!(
            "setting route_localnet=1 to allow node ports on localhost; to change this \
             leave out --iptables-localhost-nodeports or set --nodeport-addresses without \
             a loopback CIDR"
        );
        // The chart's privileged init container sets it; set here where /proc/sys is
        // writable (a plain process on the node).
        if self.runner.read_sysctl(ROUTE_LOCALNET)?.as_deref() != Some("1") {
            self.runner.write_sysctl(ROUTE_LOCALNET, "1")?;
        }
        self.route_localnet = true;
        Ok(())
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

    /// The agent's tables, through the runner.
    fn tables(&self) -> Tables<'_> {
        Tables {
            runner: &self.runner,
            backend: self.backend,
        }
    }

    /// Forgets the model: the next sync reads the kernel again.
    pub fn invalidate(&mut self) {
        for state in &mut self.families {
            state.kernel = None;
        }
        self.verified = None;
    }

    /// The nf_tables generation, when the back end has one and it can be read (a
    /// failure only costs a full read at the next check).
    fn generation(&self) -> Option<u32> {
        match self.tables().generation() {
            Ok(generation) => generation,
            Err(err) => {
                tracing::debug!(%err, "nf_tables generation unknown; the next check reads the rules");
                None
            }
        }
    }

    /// Reads every family with rules and compares it with the cache: the first
    /// difference found, if any. A family that differs keeps what was read, so the next
    /// sync repairs it from there.
    fn check_kernel(&mut self) -> Result<Option<String>, DataplaneError> {
        let start = self.generation();
        let mut found = None;
        for family in Family::ALL {
            let state = &self.families[family.index()];
            if !state.programmed {
                continue;
            }
            let tables = Tables {
                runner: &self.runner,
                backend: self.backend,
            };
            // A digest of the owned chains first, not all of them (at 10,000 Services a
            // legacy check held 4 MiB of chains for a moment, and kept some of it); the
            // full read only when that differs, to say how and to repair from.
            let summary = tables.read_family_summary(family)?;
            if state.cache.matches_summary(&summary) {
                let state = &mut self.families[family.index()];
                state.kernel = Some(summary);
                state.in_sync = true;
                continue;
            }
            let mut kernel = tables.read_family(family, true)?;
            let state = &mut self.families[family.index()];
            if let Some(difference) = state.cache.difference(&mut kernel) {
                state.kernel = Some(kernel);
                state.in_sync = false;
                found.get_or_insert(format!("{family:?}: {difference}"));
            } else {
                // Same chains as the cache, which stands for them from now on; the
                // jumps' positions are fresh.
                kernel.filter.chains = KernelChains::default();
                kernel.nat.chains = KernelChains::default();
                state.kernel = Some(kernel);
                state.in_sync = true;
            }
        }
        self.verified = match (&found, start) {
            (None, Some(start)) if self.generation() == Some(start) => Some(start),
            _ => None,
        };
        Ok(found)
    }

    /// Brings one family to `inputs` (no entries: nothing); returns the chains and jumps
    /// changed, the rules the family then has, and the entries that changed.
    fn sync_family<'p>(
        &mut self,
        family: Family,
        inputs: FamilyInputs<'p>,
        dry_run: bool,
        follow_changes: bool,
        report: &mut ReportText,
    ) -> Result<FamilySync<'p>, DataplaneError> {
        let wanted = !inputs.entries.is_empty();
        let ip = ip_family(family);
        let runner: &dyn Runner = &self.runner;
        let tables = Tables {
            runner,
            backend: self.backend,
        };
        let state = &mut self.families[family.index()];
        let (mut kernel, mut in_sync) = match state.kernel.take() {
            Some(kernel) => (kernel, state.in_sync),
            None => (tables.read_family(family, wanted)?, false),
        };
        let mut delta = state
            .cache
            .diff(inputs, &self.settings, ip, &mut kernel, in_sync);
        if delta.needs_fresh_positions() {
            let inputs = delta.into_inputs();
            kernel = tables.read_family(family, wanted)?;
            in_sync = false;
            delta = state
                .cache
                .diff(inputs, &self.settings, ip, &mut kernel, in_sync);
        }
        let changed = delta.changes();
        let rules = delta.rule_count();
        // Before the first sync's conntrack step nothing follows the changes (at 10,000
        // Services that is a list of every entry, for nothing).
        let entries = if follow_changes {
            state.cache.entry_changes(&delta)
        } else {
            Vec::new()
        };
        let commits = if changed > 0 && !dry_run {
            delta.tables_written()
        } else {
            0
        };
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
        Ok(FamilySync {
            changed,
            rules,
            entries,
            commits,
        })
    }
}

/// What [`IptablesDataplane::sync_family`] did.
struct FamilySync<'p> {
    /// Chains and jumps changed.
    changed: usize,
    /// Rules the family then has.
    rules: usize,
    /// The entries that changed.
    entries: Vec<EntryChange<'p>>,
    /// nf_tables transactions its restore committed (one a table section).
    commits: u32,
}

fn family_header(backend: Backend, family: Family) -> String {
    format!("# {} --noflush\n", backend.binary(family, Tool::Restore))
}

/// Lets 127.0.0.0/8 be routed (DNAT of localhost node ports).
const ROUTE_LOCALNET: &str = "net/ipv4/conf/all/route_localnet";

impl<R: Runner> Dataplane for IptablesDataplane<R> {
    fn sync(&mut self, plan: &MergedPlan, dry_run: bool) -> Result<SyncReport, DataplaneError> {
        if !dry_run {
            self.allow_localhost_node_ports()?;
        }
        let mut text = ReportText::new(if dry_run {
            usize::MAX
        } else {
            REPORT_TEXT_LIMIT
        });
        self.sent = PayloadSize::default();
        let mut report = SyncReport::default();
        let mut changes = Vec::new();
        // Known good at `start`, and only our restores commit meanwhile: still known good.
        let start = self
            .verified
            .and_then(|_| self.generation())
            .filter(|g| Some(*g) == self.verified);
        let mut commits = 0u32;
        let result = (|| {
            for family in Family::ALL {
                let inputs = FamilyInputs::of(plan, ip_family(family));
                let follow = self.udp.follows_changes();
                let done = self.sync_family(family, inputs, dry_run, follow, &mut text)?;
                report.changed += done.changed;
                report.rules += done.rules;
                commits += done.commits;
                changes.extend(done.entries);
            }
            Ok::<_, DataplaneError>(())
        })();
        self.verified = match start {
            Some(start) if result.is_ok() => {
                let end = start.wrapping_add(commits);
                (commits == 0 || self.generation() == Some(end)).then_some(end)
            }
            _ => None,
        };
        result?;
        let run = self
            .udp
            .clear(&self.runner, plan, Some(&changes), dry_run, &mut |line| {
                text.push(line)
            })?;
        report.conntrack_step(run, dry_run);
        report.payload = text.finish();
        Ok(report)
    }

    /// The periodic check: whether the kernel still holds exactly what the last sync
    /// left (see the module documentation). When it does not, the family that differs
    /// keeps what was just read, so the next sync repairs it; the difference is logged.
    fn rules_intact(&mut self) -> Result<bool, DataplaneError> {
        if !self.families.iter().any(|f| f.programmed) {
            return Ok(true);
        }
        if self.verified.is_some() && self.generation() == self.verified {
            return Ok(true);
        }
        match self.check_kernel() {
            Ok(None) => Ok(true),
            Ok(Some(difference)) => {
                tracing::warn!(%difference, "the kernel no longer holds the agent's rules as written");
                Ok(false)
            }
            Err(err) => {
                // Unknown: read again at the next sync.
                self.invalidate();
                Err(err)
            }
        }
    }

    /// A jump from `nat` `PREROUTING` to the agent's chains, in either family.
    fn holds_rules(&mut self) -> Result<bool, DataplaneError> {
        self.tables().hold_jumps()
    }

    fn cleanup(&mut self) -> Result<SyncReport, DataplaneError> {
        let mut text = ReportText::new(REPORT_TEXT_LIMIT);
        self.sent = PayloadSize::default();
        let mut report = SyncReport::default();
        for family in Family::ALL {
            // Always from a fresh read: leftovers of an earlier run count too.
            self.families[family.index()].kernel = None;
            let nothing = FamilyInputs {
                entries: Vec::new(),
                local: None,
                node_addresses: Vec::new(),
            };
            let done = self.sync_family(family, nothing, false, false, &mut text)?;
            report.changed += done.changed;
            self.families[family.index()].programmed = false;
        }
        self.udp.reset();
        self.verified = None;
        report.payload = text.finish();
        Ok(report)
    }
}
