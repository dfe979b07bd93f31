//! ipvs mode's [`Dataplane`]: render, diff against a model of what the kernel holds,
//! apply only the difference, in an order that never leaves a wanted VIP unserved.
//!
//! The kernel is read (dummy interface and addresses, the agent's IPVS services and their
//! real servers, the agent's ipsets, its iptables chains) on the first sync, after a
//! failure, and when [`Dataplane::rules_intact`] finds something changed behind the
//! agent's back. Every other sync works from the model and from [`Desired`]'s counts,
//! and looks only at the plan entries that changed since the last sync, so one endpoint
//! change costs a couple of netlink messages.
//!
//! Order of a sync: ipset creates/adds/dels → VIP addresses added → IPVS services and
//! real servers → the fixed iptables rules → VIP addresses removed → ipsets destroyed →
//! stale UDP conntrack entries deleted.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use proxyplan_crds::MergedPlan;
use tracing::{info, warn};

use super::desired::{ChangedEntries, Desired, HeldSets};
use super::model::Model;
use super::render::{self, VirtualServer, VirtualServerKey};
use super::rules;
use super::servers::{Draining, OpKind, OpRounds, ServerSync, errno_text};
use super::set_changes::{self, SetChange, SetChanges};
use super::sets::SetId;
use super::settings::IpvsSettings;
use super::sysctls::{self, SysctlCheck};
use crate::conntrack::{EntryChange, UdpTracker};
use crate::dataplane::{Dataplane, DataplaneError, SyncReport};
use crate::kernel::command::Runner;
use crate::kernel::family::Family;
use crate::kernel::iptables::{Backend, BackendChoice, LOCK_WAIT, Tool};
use crate::kernel::ipvs::IpvsKernel;
use crate::ruleset::diff::FamilyDiff;
use crate::ruleset::rules::{FamilyRules, Ruleset, TableName};
use crate::ruleset::save::KernelFamily;
use crate::ruleset::tables::Tables;

/// New VIPs from which they are added alongside the sets and IPVS changes.
const ADDRESSES_ALONGSIDE: usize = 256;

/// What one sync sends: set changes, VIPs, and virtual servers to bring to a value or
/// delete.
struct Changes {
    /// Creates, deletions and destroys, and the additions of a partial sync.
    sets: SetChanges,
    /// For a full sync, what the sets held: the additions are counted against it.
    held: Option<HeldSets>,
    add_vips: Vec<IpAddr>,
    del_vips: Vec<IpAddr>,
    servers: BTreeMap<VirtualServerKey, VirtualServer>,
    gone: BTreeSet<VirtualServerKey>,
    /// A from-scratch count, to keep once the kernel holds it.
    desired: Option<Desired>,
    /// The entries that changed (`None` when compared from scratch).
    entries: Option<ChangedEntries>,
}

/// ipvs mode's [`Dataplane`] over an [`IpvsKernel`] (netlink: IPVS, addresses, ipsets)
/// and a [`Runner`] (iptables, conntrack).
#[derive(Debug)]
pub struct IpvsDataplane<K, R> {
    settings: IpvsSettings,
    /// `settings.scheduler`, shared by every held service that uses it.
    scheduler: Arc<str>,
    kernel: K,
    runner: R,
    backend: Backend,
    model: Option<Model>,
    desired: Desired,
    frame: [Option<KernelFamily>; 2],
    programmed: [bool; 2],
    /// Removed TCP/SCTP real servers at weight 0, with the time they must be gone by.
    draining: Draining,
    udp: UdpTracker,
    sysctls: Vec<SysctlCheck>,
}

impl<K: IpvsKernel, R: Runner> IpvsDataplane<K, R> {
    /// A dataplane over `kernel` and `runner`, with `choice`'s iptables back end.
    #[must_use]
    pub fn new(settings: IpvsSettings, kernel: K, runner: R, choice: BackendChoice) -> Self {
        let backend = Backend::resolve(choice, &runner);
        Self {
            scheduler: Arc::from(settings.scheduler.as_str()),
            settings,
            kernel,
            runner,
            backend,
            model: None,
            desired: Desired::new(),
            frame: [None, None],
            programmed: [false, false],
            draining: Draining::new(),
            udp: UdpTracker::default(),
            sysctls: Vec::new(),
        }
    }

    /// The kernel handle (for tests to inspect a fake).
    #[must_use]
    pub fn kernel(&self) -> &K {
        &self.kernel
    }

    /// The kernel handle, to change (for tests to tamper with a fake).
    #[must_use]
    pub fn kernel_mut(&mut self) -> &mut K {
        &mut self.kernel
    }

    /// The runner (for tests to inspect a fake).
    #[must_use]
    pub fn runner(&self) -> &R {
        &self.runner
    }

    /// The sysctls checked by the first sync.
    #[must_use]
    pub fn sysctls(&self) -> &[SysctlCheck] {
        &self.sysctls
    }

    /// Real servers waiting for their connections to end.
    #[must_use]
    pub fn draining(&self) -> usize {
        self.draining.len()
    }

    /// The agent's tables, through the runner.
    fn tables(&self) -> Tables<'_> {
        Tables {
            runner: &self.runner,
            backend: self.backend,
        }
    }

    /// Sets IPVS's connection timeouts when a flag asks for one (as kube-proxy, once; a
    /// failure is a warning, not a failed sync).
    fn set_timeouts(&mut self, payload: &mut String, dry_run: bool) {
        let timeouts = self.settings.timeouts;
        if timeouts.is_unset() {
            return;
        }
        payload.push_str(&format!(
            "# ipvsadm --set {} {} {}\n",
            timeouts.tcp, timeouts.tcp_fin, timeouts.udp
        ));
        if dry_run {
            return;
        }
        match self.kernel.set_timeouts(timeouts) {
            Ok(()) => info!(
                tcp = timeouts.tcp,
                tcp_fin = timeouts.tcp_fin,
                udp = timeouts.udp,
                "IPVS connection timeouts set (0: left as the kernel has it)"
            ),
            Err(err) => warn!(%err, "cannot set the IPVS connection timeouts; going on without"),
        }
    }

    /// Forgets the model: the next sync reads the kernel again.
    pub fn invalidate(&mut self) {
        self.model = None;
        self.desired.clear();
        self.frame = [None, None];
    }

    fn sync_state(
        &mut self,
        plan: &Arc<MergedPlan>,
        dry_run: bool,
    ) -> Result<SyncReport, DataplaneError> {
        let mut report = SyncReport::default();
        if self.sysctls.is_empty() {
            let checks = sysctls::check(
                &mut self.kernel,
                self.settings.strict_arp,
                &mut report.payload,
                dry_run,
            );
            if !dry_run {
                self.sysctls = checks;
            }
            self.set_timeouts(&mut report.payload, dry_run);
        }
        let had_model = self.model.is_some();
        let mut model = match self.model.take() {
            Some(model) => model,
            None => Model::read(
                &mut self.kernel,
                &self.settings,
                &self.scheduler,
                !dry_run,
                &BTreeSet::new(),
            )?,
        };
        let node = render::node_context(plan, &self.settings, model.local.iter().copied());
        // From scratch right after the kernel was read, in a dry run, and when the node's
        // addresses changed; otherwise only the entries that changed.
        let full = dry_run || model.sets.is_some() || !self.desired.can_update(plan, &node);
        let start = Instant::now();
        let changes = if full {
            self.full_changes(plan, node, &mut model, dry_run)?
        } else {
            self.partial_changes(plan, &model)
        };
        report.phases.push(("render", start.elapsed()));
        // On failure the model stays unset: the next sync reads the kernel again.
        let desired = changes.desired.as_ref().unwrap_or(&self.desired);
        // The counts know which families have entries: no second pass over the plan.
        let rules = rules::rules(plan, &self.settings, desired.families());
        report.rules = desired.server_count()
            + desired.real_server_count()
            + rules.v4.rule_count()
            + rules.v6.rule_count();
        let entries = self.apply_changes(changes, &rules, &mut model, dry_run, &mut report)?;
        if !dry_run {
            // The kernel now holds the wanted sets: the counts in `desired` say which.
            model.sets = None;
        }
        // A dry run changes nothing; a model it read (maybe without the interface, which
        // a dry run never creates) is not kept.
        if !dry_run || had_model {
            self.model = Some(model);
        }
        let changed: Option<Vec<EntryChange<'_>>> = entries.as_ref().map(|changed| {
            let updated = changed
                .updated
                .iter()
                .filter_map(|i| plan.service_ports.get(*i))
                .map(|e| EntryChange {
                    key: Cow::Borrowed(e.key.as_str()),
                    entries: vec![e],
                });
            let removed = changed.removed.iter().map(|key| EntryChange {
                key: Cow::Borrowed(key.as_str()),
                entries: Vec::new(),
            });
            updated.chain(removed).collect()
        });
        let start = Instant::now();
        let payload = &mut report.payload;
        let run = self.udp.clear(
            &self.runner,
            plan,
            changed.as_deref(),
            dry_run,
            &mut |line| payload.push_str(line),
        )?;
        report.phases.push(("conntrack", start.elapsed()));
        report.conntrack_step(run, dry_run);
        Ok(report)
    }

    /// Everything `plan` wants compared with everything the kernel holds.
    fn full_changes(
        &mut self,
        plan: &Arc<MergedPlan>,
        node: render::NodeContext,
        model: &mut Model,
        dry_run: bool,
    ) -> Result<Changes, DataplaneError> {
        let held = match model.sets.take() {
            // A dry run leaves the model as it found it.
            Some(sets) if dry_run => {
                model.sets = Some(sets.clone());
                HeldSets::Read(sets)
            }
            Some(sets) => HeldSets::Read(sets),
            // The kernel holds what was wanted last.
            None if dry_run => HeldSets::Read(self.desired.sets()),
            None => HeldSets::Counted(Box::new(std::mem::take(&mut self.desired))),
        };
        let mut desired = Desired::new();
        let servers = desired.rebuild(plan, node);
        let sets = desired.set_changes(&held);
        if let Some(name) = sets.mismatched.first() {
            return Err(DataplaneError::ToolFailed {
                tool: "ipset".to_owned(),
                code: None,
                stderr: format!(
                    "set {name} exists with another type than the agent needs; run \
                     `proxyplan-agent cleanup --mode ipvs` and restart the agent"
                ),
            });
        }
        let mut add_vips: Vec<IpAddr> = desired
            .addresses()
            .filter(|a| !model.vips.contains(a) && !model.local.contains(a))
            .collect();
        add_vips.sort_unstable();
        let del_vips = model
            .vips
            .iter()
            .filter(|a| !desired.wants_address(a))
            .copied()
            .collect();
        let stale = model
            .services
            .keys()
            .filter(|k| !servers.contains_key(k))
            .copied()
            .collect();
        Ok(Changes {
            sets,
            held: Some(held),
            add_vips,
            del_vips,
            servers,
            gone: stale,
            desired: Some(desired),
            entries: None,
        })
    }

    /// What the entries that changed since the last sync change.
    fn partial_changes(&mut self, plan: &Arc<MergedPlan>, model: &Model) -> Changes {
        let families_before = self.desired.families();
        let delta = self.desired.update(plan);
        let families_now = self.desired.families();
        let mut sets = SetChanges::default();
        for (ipv6, (was, now)) in [false, true]
            .into_iter()
            .zip(families_before.into_iter().zip(families_now))
        {
            for id in SetId::of_family(ipv6) {
                match (was, now) {
                    (false, true) => sets.create(&id.name(), id.spec()),
                    (true, false) => sets.destroy(&id.name()),
                    _ => {}
                }
            }
        }
        for (id, entry) in &delta.add {
            sets.add(&id.name(), entry);
        }
        for (id, entry) in &delta.del {
            sets.del(&id.name(), entry);
        }
        let mut add_vips = Vec::new();
        let mut del_vips = Vec::new();
        for ip in &delta.addresses {
            let wanted = self.desired.wants_address(ip);
            let held = model.vips.contains(ip);
            if wanted && !held && !model.local.contains(ip) {
                add_vips.push(*ip);
            } else if !wanted && held {
                del_vips.push(*ip);
            }
        }
        Changes {
            sets,
            add_vips,
            del_vips,
            servers: delta.servers,
            gone: delta.gone,
            held: None,
            desired: None,
            entries: Some(delta.changed),
        }
    }

    fn apply_changes(
        &mut self,
        changes: Changes,
        rules: &Ruleset,
        model: &mut Model,
        dry_run: bool,
        report: &mut SyncReport,
    ) -> Result<Option<ChangedEntries>, DataplaneError> {
        let Changes {
            sets,
            held,
            add_vips,
            del_vips,
            servers,
            gone,
            desired,
            entries,
        } = changes;
        let mut clock = Instant::now();
        let mut lap = |report: &mut SyncReport, phase: &'static str| {
            let now = Instant::now();
            report.phases.push((phase, now - clock));
            clock = now;
        };
        // Many new VIPs (a first apply) go on a thread of their own alongside steps 1
        // and 3: addresses, sets and IPVS take different kernel locks. The kernel walks
        // an interface's address list on every add, so 10,000 addresses take as long as
        // the rest together.
        let alongside = match model.link {
            Some(link) if !dry_run && add_vips.len() >= ADDRESSES_ALONGSIDE => {
                self.address_payload(&add_vips, true, report);
                Some(
                    self.kernel
                        .begin_address_changes(link, add_vips.clone(), true),
                )
            }
            _ => None,
        };
        let work: Result<(), DataplaneError> = 'work: {
            // 1. ipsets: create and fill before any rule uses them.
            let names = desired.as_ref().map(Desired::set_names).unwrap_or_default();
            let creates = sets
                .before
                .iter()
                .take_while(|c| matches!(c, SetChange::Create(..)))
                .count();
            let (creates, rest) = sets.before.split_at(creates);
            let additions = desired
                .as_ref()
                .zip(held.as_ref())
                .into_iter()
                .flat_map(|(desired, held)| desired.additions(held, &names));
            let ops = sets.ops(creates).chain(additions).chain(sets.ops(rest));
            match set_changes::send(&mut self.kernel, ops, dry_run, &mut report.payload) {
                Ok(sent) => report.changed += sent,
                Err(e) => break 'work Err(e),
            }
            drop(held);
            lap(report, "sets");
            // 2. VIP addresses.
            if alongside.is_none() {
                if let Err(e) = self.change_addresses(model, &add_vips, true, dry_run, report) {
                    break 'work Err(e);
                }
                lap(report, "vips");
            }
            // 3. IPVS.
            let mut rounds = OpRounds::new(dry_run);
            let sent = ServerSync {
                settings: &self.settings,
                scheduler: &self.scheduler,
                draining: &mut self.draining,
            }
            .ipvs_changes(&mut self.kernel, servers, &gone, model, &mut rounds);
            lap(report, "ipvs");
            report.changed += rounds.sent;
            report.payload.push_str(&rounds.payload);
            if let Err(e) = sent {
                break 'work Err(e);
            }
            if let Some(first) = rounds.failures.first() {
                self.model = None;
                break 'work Err(DataplaneError::Io {
                    context: format!(
                        "IPVS refused {} change(s), first: {first}",
                        rounds.failures.len()
                    ),
                    source: std::io::Error::other(rounds.failures.join("; ")),
                });
            }
            Ok(())
        };
        // Waited for even when the rest failed: the thread holds the rtnetlink socket.
        if let Some(pending) = alongside {
            let results = self.kernel.finish_address_changes(pending);
            lap(report, "vips alongside");
            self.record_addresses(model, &add_vips, true, results)?;
        }
        work?;
        // 4. The fixed iptables rules.
        for family in Family::ALL {
            let rules = match family {
                Family::V4 => &rules.v4,
                Family::V6 => &rules.v6,
            };
            let (payload, changed) = self.sync_frame(family, rules, dry_run)?;
            if !payload.is_empty() {
                report.payload.push_str(&format!(
                    "# {} --noflush\n",
                    self.backend.binary(family, Tool::Restore)
                ));
                report.payload.push_str(&payload);
            }
            report.changed += changed;
            if !dry_run {
                self.programmed[family.index()] = rules.rule_count() > 0;
            }
        }
        lap(report, "iptables");
        // 5. VIPs nothing wants any more.
        self.change_addresses(model, &del_vips, false, dry_run, report)?;
        // 6. Sets nothing uses any more.
        report.changed += set_changes::send(
            &mut self.kernel,
            sets.ops(&sets.after),
            dry_run,
            &mut report.payload,
        )?;
        lap(report, "removals");
        if !dry_run && let Some(desired) = desired {
            self.desired = desired;
        }
        Ok(entries)
    }

    /// Writes address changes to the report.
    fn address_payload(&self, addresses: &[IpAddr], add: bool, report: &mut SyncReport) {
        let verb = if add { "add" } else { "del" };
        for ip in addresses {
            let len = if ip.is_ipv4() { 32 } else { 128 };
            report.payload.push_str(&format!(
                "# ip address {verb} {ip}/{len} dev {}\n",
                self.settings.interface
            ));
        }
        report.changed += addresses.len();
    }

    fn change_addresses(
        &mut self,
        model: &mut Model,
        addresses: &[IpAddr],
        add: bool,
        dry_run: bool,
        report: &mut SyncReport,
    ) -> Result<(), DataplaneError> {
        if addresses.is_empty() {
            return Ok(());
        }
        self.address_payload(addresses, add, report);
        if dry_run {
            return Ok(());
        }
        let results = match model.link {
            Some(link) => self.kernel.change_addresses(link, addresses, add),
            None => Err(DataplaneError::Io {
                context: format!("interface {} is missing", self.settings.interface),
                source: std::io::Error::other("no dummy interface"),
            }),
        };
        self.record_addresses(model, addresses, add, results)
    }

    /// Notes in `model` which address changes the kernel made; an error names those it
    /// refused.
    fn record_addresses(
        &mut self,
        model: &mut Model,
        addresses: &[IpAddr],
        add: bool,
        results: Result<Vec<i32>, DataplaneError>,
    ) -> Result<(), DataplaneError> {
        let results = results.inspect_err(|_| self.model = None)?;
        let verb = if add { "add" } else { "del" };
        let mut failed = Vec::new();
        for (ip, errno) in addresses.iter().zip(results) {
            // EEXIST on add, EADDRNOTAVAIL on delete: already as wanted.
            let done = errno == 0 || (add && errno == -17) || (!add && errno == -99);
            if done {
                if add {
                    model.vips.insert(*ip);
                } else {
                    model.vips.remove(ip);
                }
            } else {
                failed.push(format!("{ip}: {}", errno_text(errno)));
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            self.model = None;
            Err(DataplaneError::Io {
                context: format!(
                    "{verb} {} address(es) on {}",
                    failed.len(),
                    self.settings.interface
                ),
                source: std::io::Error::other(failed.join("; ")),
            })
        }
    }

    /// Brings one family's fixed rules to `desired`; returns the payload and the number of
    /// chains changed.
    fn sync_frame(
        &mut self,
        family: Family,
        desired: &FamilyRules,
        dry_run: bool,
    ) -> Result<(String, usize), DataplaneError> {
        let i = family.index();
        let wanted = desired.rule_count() > 0;
        let mut kernel = match self.frame[i].take() {
            Some(kernel) => kernel,
            None => self.tables().read_family(family, wanted)?,
        };
        let mut diff = FamilyDiff::new(desired, &kernel);
        if diff.needs_fresh_positions() {
            kernel = self.tables().read_family(family, wanted)?;
            diff = FamilyDiff::new(desired, &kernel);
        }
        let payload = diff.restore_payload();
        if !payload.is_empty() && !dry_run {
            let restore = self.backend.binary(family, Tool::Restore);
            let args = ["--noflush", "-w", LOCK_WAIT];
            let output = self.runner.run(&restore, &args, Some(&payload))?;
            if !output.success() {
                return Err(output.failure(&format!("{restore} {}", args.join(" "))));
            }
            diff.apply_to(&mut kernel);
        }
        let changed = diff.changed();
        kernel.filter.positions_fresh = false;
        kernel.nat.positions_fresh = false;
        self.frame[i] = Some(kernel);
        Ok((payload, changed))
    }

    /// Whether IPVS, the interface and the sets still hold what the model says: the
    /// kernel is read again in full (every virtual server with its real servers, every
    /// address, every set entry) and compared. When something differs, what was read
    /// becomes the model, so the next sync compares the plan with it and restores what
    /// went missing.
    fn ipvs_intact(&mut self) -> Result<bool, DataplaneError> {
        let Some(model) = self.model.take() else {
            return Ok(true);
        };
        let fresh = Model::read(
            &mut self.kernel,
            &self.settings,
            &self.scheduler,
            false,
            &model.vips,
        )?;
        let sets_intact = match &fresh.sets {
            Some(sets) => match &model.sets {
                // Read, and no sync since: compare with that read.
                Some(held) => held == sets,
                None => self.desired.holds_exactly(sets),
            },
            None => false,
        };
        let intact = sets_intact
            && fresh.link == model.link
            && fresh.vips == model.vips
            && fresh.local == model.local
            && fresh.services == model.services;
        if intact {
            self.model = Some(model);
        } else if fresh.link.is_some() {
            // The next sync is a full one against what the kernel holds (its sets are
            // in `fresh`).
            self.model = Some(fresh);
        }
        // Without the interface the model stays unset: the next sync reads the kernel
        // again and creates it.
        Ok(intact)
    }

    /// Whether `family`'s tables still hold the agent's chains and jumps as last written;
    /// when not, what was read is kept for the next sync to compare with.
    fn tables_intact(&mut self, family: Family) -> Result<bool, DataplaneError> {
        let i = family.index();
        let fresh = self.tables().read_family(family, true)?;
        let intact = self.frame[i]
            .as_ref()
            .is_some_and(|held| same_rules(held, &fresh));
        if !intact {
            self.frame[i] = Some(fresh);
        }
        Ok(intact)
    }
}

/// Whether two reads of a family's tables hold the same chains (revision and rule
/// count) and the same jumps from built-in chains (wherever they stand).
fn same_rules(a: &KernelFamily, b: &KernelFamily) -> bool {
    [TableName::Filter, TableName::Nat].into_iter().all(|name| {
        let (a, b) = (a.table(name), b.table(name));
        let words = |t: &crate::ruleset::save::KernelTable| -> Vec<(String, Vec<Vec<String>>)> {
            t.jumps
                .iter()
                .map(|(chain, jumps)| {
                    (
                        chain.clone(),
                        jumps.iter().map(|j| j.words.clone()).collect(),
                    )
                })
                .collect()
        };
        a.chains == b.chains && words(a) == words(b)
    })
}

impl<K: IpvsKernel, R: Runner> Dataplane for IpvsDataplane<K, R> {
    fn sync(&mut self, plan: &MergedPlan, dry_run: bool) -> Result<SyncReport, DataplaneError> {
        self.sync_shared(&Arc::new(plan.clone()), dry_run)
    }

    fn sync_shared(
        &mut self,
        plan: &Arc<MergedPlan>,
        dry_run: bool,
    ) -> Result<SyncReport, DataplaneError> {
        let result = self.sync_state(plan, dry_run);
        if result.is_err() {
            self.invalidate();
        }
        result
    }

    /// The periodic check: re-reads everything the mode owns (each programmed family's
    /// tables, the IPVS table with every real server, the dummy interface's addresses,
    /// the sets with their entries) and compares it with what the agent wrote. Whatever
    /// differs is what the next sync compares the plan with, so one sync restores it.
    fn rules_intact(&mut self) -> Result<bool, DataplaneError> {
        let mut intact = true;
        for family in Family::ALL {
            if self.programmed[family.index()] {
                intact &= self.tables_intact(family)?;
            }
        }
        Ok(self.ipvs_intact()? && intact)
    }

    /// A jump from `nat` `PREROUTING` to the agent's chains, in either family.
    fn holds_rules(&mut self) -> Result<bool, DataplaneError> {
        self.tables().hold_jumps()
    }

    fn cleanup(&mut self) -> Result<SyncReport, DataplaneError> {
        let mut report = SyncReport::default();
        self.invalidate();
        let mut model = Model::read(
            &mut self.kernel,
            &self.settings,
            &self.scheduler,
            false,
            &BTreeSet::new(),
        )?;
        let mut rounds = OpRounds::new(false);
        for (key, held) in &model.services {
            rounds.service(OpKind::DeleteService, held.service(key));
            if rounds.full() {
                rounds.send(&mut self.kernel)?;
            }
        }
        rounds.send(&mut self.kernel)?;
        report.changed += rounds.sent;
        report.payload.push_str(&rounds.payload);
        model.services.clear();
        if let Some(first) = rounds.failures.first() {
            return Err(DataplaneError::Io {
                context: format!("removing IPVS services, first failure: {first}"),
                source: std::io::Error::other(rounds.failures.join("; ")),
            });
        }
        let nothing = FamilyRules::default();
        for family in Family::ALL {
            self.frame[family.index()] = None;
            let (payload, changed) = self.sync_frame(family, &nothing, false)?;
            report.payload.push_str(&payload);
            report.changed += changed;
            self.programmed[family.index()] = false;
        }
        if let Some(link) = model.link {
            self.kernel.delete_link(link)?;
            report.changed += 1 + model.vips.len();
        }
        let mut destroy = SetChanges::default();
        for name in model.sets.take().unwrap_or_default().keys() {
            destroy.destroy(name);
        }
        set_changes::send(
            &mut self.kernel,
            destroy.ops(&destroy.after),
            false,
            &mut report.payload,
        )?;
        report.changed += destroy.changed();
        self.invalidate();
        self.udp.reset();
        self.draining.clear();
        Ok(report)
    }
}
