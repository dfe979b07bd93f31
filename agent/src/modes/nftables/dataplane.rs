//! nftables mode's [`Dataplane`]: the plan rendered per family, compared with what the
//! kernel holds, and only the difference sent, one nf_tables transaction per sync.
//!
//! The kernel is read (one table per family, [`HeldTable`]) on the first sync, after a
//! failure, and by the tamper check ([`Dataplane::rules_intact`]) when someone else
//! changed the table, which sends the repair from that same read. Every other sync
//! compares the new plan with the last one entry by entry ([`diff::update`]): one
//! endpoint change is a handful of map elements in one small transaction. The tamper check costs one request while nobody else commits to
//! nf_tables (the ruleset's generation is where the agent's last commit left it); when
//! the generation moved, nf_tables' announcements say whether the table was touched, and
//! only then is it read, compared and repaired. Its change alarm
//! ([`Dataplane::change_alarm`]) wakes the check as soon as such a commit is announced.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proxyplan_crds::{IpFamily, MergedPlan, ServicePortPlan};

use super::desired::{FamilyState, key_hash};
use super::diff::{self, Change, Stale};
use super::layout::{FamilyContext, LocalTraffic};
use super::model::HeldTable;
use super::names;
use super::render::{Renderer, affinity_maps};
use super::rules::Net;
use super::settings::NftablesSettings;
use super::sink::{Sink, SinkError, nfproto};
use crate::conntrack::{EntryChange, UdpTracker};
use crate::dataplane::{ChangeAlarm, Dataplane, DataplaneError, REPORT_TEXT_LIMIT, SyncReport};
use crate::kernel::Family;
use crate::kernel::command::Runner;
use crate::kernel::nftables::{ElementData, NftKernel, Touched};
use crate::ruleset::local::LocalMatch;

/// nftables mode's [`Dataplane`] over an [`NftKernel`] (nf_tables) and a [`Runner`]
/// (conntrack).
#[derive(Debug)]
pub struct NftablesDataplane<K, R> {
    settings: NftablesSettings,
    kernel: K,
    runner: R,
    /// What each family's table holds after the last successful sync (`None`: unknown,
    /// read it).
    families: [Option<FamilyState>; 2],
    /// The plan of the last successful sync.
    plan: Option<Arc<MergedPlan>>,
    /// The generation the agent's last commit left the ruleset at.
    generation: Option<u32>,
    /// Chains and sets waiting to be deleted (a kernel before 6.2 may still count a
    /// reference for a moment after the elements naming them were deleted).
    stale: [Stale; 2],
    udp: UdpTracker,
    /// Messages and transactions the last sync sent.
    sent: (usize, usize),
}

/// The context of `family` for `plan`.
#[must_use]
pub fn family_context(
    plan: &MergedPlan,
    settings: &NftablesSettings,
    family: Family,
) -> FamilyContext {
    let v6 = family == Family::V6;
    let of_family = |net: &Net| net.addr.is_ipv6() == v6;
    FamilyContext {
        family,
        mark: settings.mark(),
        local: LocalMatch::of(&plan.local_traffic, ip_family(family)).and_then(|m| match m {
            LocalMatch::Source(cidr) => Net::parse(&cidr).map(LocalTraffic::Prefix),
            LocalMatch::Interface(name) => Some(match name.strip_suffix('+') {
                Some(prefix) => LocalTraffic::Interface {
                    name: prefix.to_owned(),
                    prefix: true,
                },
                None => LocalTraffic::Interface {
                    name,
                    prefix: false,
                },
            }),
        }),
        nodeport_nets: if settings.nodeport_primary {
            proxyplan_crds::primary_addresses(&plan.addresses)
                .into_iter()
                .map(Net::host)
                .filter(of_family)
                .collect()
        } else {
            settings
                .nodeport_cidrs
                .iter()
                .copied()
                .filter(of_family)
                .collect()
        },
        service_cidrs: plan
            .service_cidrs
            .iter()
            .filter_map(|c| Net::parse(c))
            .filter(of_family)
            .collect(),
        node_addresses: plan
            .addresses
            .iter()
            .copied()
            .filter(|a| a.is_ipv6() == v6)
            .collect(),
        drop_invalid: settings.drop_invalid,
    }
}

/// The entries of `plan` of `family`, in plan order.
fn entries_of(plan: &MergedPlan, family: Family) -> Vec<&ServicePortPlan> {
    let want = ip_family(family);
    plan.service_ports
        .iter()
        .filter(|e| e.family == want)
        .map(AsRef::as_ref)
        .collect()
}

/// Whether entries are in strictly increasing key order (as `merge` returns them).
fn sorted(plan: &MergedPlan) -> bool {
    plan.service_ports.windows(2).all(|w| match w {
        [a, b] => a.key < b.key,
        _ => true,
    })
}

/// The entries that changed from `old` to `new` (both sorted by key), of any family.
fn changes<'p>(old: &'p MergedPlan, new: &'p MergedPlan) -> Vec<Change<'p>> {
    let mut out = Vec::new();
    let mut a = old.service_ports.iter().peekable();
    let mut b = new.service_ports.iter().peekable();
    loop {
        let order = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some(o), Some(n)) if Arc::ptr_eq(o, n) => std::cmp::Ordering::Equal,
            (Some(o), Some(n)) => o.key.cmp(&n.key),
        };
        match order {
            std::cmp::Ordering::Less => {
                if let Some(o) = a.next() {
                    out.push(Change {
                        old: Some(o),
                        new: None,
                    });
                }
            }
            std::cmp::Ordering::Greater => {
                if let Some(n) = b.next() {
                    out.push(Change {
                        old: None,
                        new: Some(n),
                    });
                }
            }
            std::cmp::Ordering::Equal => {
                if let (Some(o), Some(n)) = (a.next(), b.next())
                    && !Arc::ptr_eq(o, n)
                    && o != n
                {
                    if o.family == n.family {
                        out.push(Change {
                            old: Some(o),
                            new: Some(n),
                        });
                    } else {
                        out.push(Change {
                            old: Some(o),
                            new: None,
                        });
                        out.push(Change {
                            old: None,
                            new: Some(n),
                        });
                    }
                }
            }
        }
    }
    out
}

impl<K: NftKernel, R: Runner> NftablesDataplane<K, R> {
    /// A dataplane over `kernel` and `runner`.
    #[must_use]
    pub fn new(mut settings: NftablesSettings, kernel: K, runner: R) -> Self {
        if settings.drop_invalid && crate::conntrack::tcp_be_liberal(&runner) {
            settings.drop_invalid = false;
        }
        Self {
            settings,
            kernel,
            runner,
            families: [None, None],
            plan: None,
            generation: None,
            stale: [Stale::default(), Stale::default()],
            udp: UdpTracker::default(),
            sent: (0, 0),
        }
    }

    /// The kernel handle (for tests to inspect a fake).
    #[must_use]
    pub fn kernel(&mut self) -> &mut K {
        &mut self.kernel
    }

    /// Netlink messages and transactions the last sync or cleanup sent.
    #[must_use]
    pub fn sent(&self) -> (usize, usize) {
        self.sent
    }

    /// Forgets the model: the next sync reads the kernel again.
    pub fn invalidate(&mut self) {
        self.families = [None, None];
        self.plan = None;
        self.generation = None;
    }

    /// One family: incrementally when the model allows, from a read otherwise.
    fn sync_family(
        &mut self,
        plan: &Arc<MergedPlan>,
        family: Family,
        all_changes: Option<&[Change<'_>]>,
        dry_run: bool,
        report: &mut SyncReport,
    ) -> Result<(), SinkError> {
        let i = family.index();
        let ctx = family_context(plan, &self.settings, family);
        let want = ip_family(family);
        let kernel: Option<&mut dyn NftKernel> = if dry_run {
            None
        } else {
            Some(&mut self.kernel)
        };
        let limit = if dry_run {
            usize::MAX
        } else {
            REPORT_TEXT_LIMIT
        };
        let incremental = match (&self.families[i], all_changes) {
            (Some(state), Some(_)) => {
                state.ctx == ctx
                    && state.entries > 0
                    && plan.service_ports.iter().any(|e| e.family == want)
            }
            _ => false,
        };
        let mut stale = std::mem::take(&mut self.stale[i]);
        let result = if incremental {
            let changes: Vec<Change<'_>> = all_changes
                .unwrap_or_default()
                .iter()
                .filter(|c| c.old.or(c.new).is_some_and(|e| e.family == want))
                .copied()
                .collect();
            if changes.is_empty() && stale.is_empty() {
                return Ok(());
            }
            // Taken, not copied: at 250,000 endpoints the state is megabytes (a hash
            // table of 250,000 hairpin counts), and a copy per change cost milliseconds.
            // A sync that fails leaves none; `sync_shared` forgets every family then
            // anyway, so the next sync reads the tables. A dry run changes nothing, so it
            // works on a copy.
            let taken = if dry_run {
                self.families[i].clone()
            } else {
                self.families[i].take()
            };
            let Some(mut state) = taken else {
                return Ok(());
            };
            let renderer_ctx = ctx.clone();
            // Rarely asked (a contested destination's next owner): a scan, not a list of
            // every entry built for each change.
            let unchanged = |hash: u64| {
                plan.service_ports
                    .iter()
                    .find(|e| e.family == want && key_hash(&e.key) == hash)
                    .map(|e| Renderer { ctx: &renderer_ctx }.entry(e))
            };
            let mut sink = Sink::new(kernel, family, limit).map_err(SinkError::Kernel)?;
            let mut gone = Stale::default();
            if !changes.is_empty() {
                gone = diff::update(&mut state, &changes, &unchanged, &mut sink)?;
            }
            let dirty = affinity_cleanups(&changes);
            let done = finish(sink, stale_union(&mut stale, gone), report)?;
            self.record(family, done, state, &dirty, report)
        } else {
            let mut held = match &self.families[i] {
                // The table is known to be absent.
                Some(state) if state.entries == 0 && self.generation.is_some() => {
                    HeldTable::default()
                }
                _ => {
                    let (held, generation) =
                        HeldTable::read(&mut self.kernel, family).map_err(SinkError::Kernel)?;
                    if !dry_run {
                        self.generation = Some(generation);
                    }
                    held
                }
            };
            let kernel: Option<&mut dyn NftKernel> = if dry_run {
                None
            } else {
                Some(&mut self.kernel)
            };
            let affinity_held: Vec<String> = held
                .sets
                .keys()
                .filter(|n| n.contains("affinity-"))
                .cloned()
                .collect();
            let entries = entries_of(plan, family);
            let mut sink = Sink::new(kernel, family, limit).map_err(SinkError::Kernel)?;
            let (state, gone) = diff::full(&entries, ctx, &mut held, &mut sink)?;
            drop(held);
            let dirty: Vec<(String, Vec<Vec<u8>>)> = entries
                .iter()
                .flat_map(|e| affinity_maps(e))
                .filter(|(name, _)| affinity_held.contains(name))
                .collect();
            stale = Stale::default();
            let done = finish(sink, gone, report)?;
            self.record(family, done, state, &dirty, report)
        };
        if result.is_err() {
            self.stale[i] = stale;
        }
        result
    }

    /// Keeps what a family's sync left, and cleans the affinity maps it names.
    fn record(
        &mut self,
        family: Family,
        done: Finished,
        state: FamilyState,
        affinity: &[(String, Vec<Vec<u8>>)],
        report: &mut SyncReport,
    ) -> Result<(), SinkError> {
        let i = family.index();
        self.sent.0 += done.messages;
        self.sent.1 += done.transactions;
        if done.dry {
            return Ok(());
        }
        self.generation = done.generation;
        self.stale[i] = done.kept;
        self.families[i] = Some(state);
        if !affinity.is_empty() {
            self.clean_affinity(family, affinity, report)?;
        }
        Ok(())
    }

    /// Deletes the elements of dynamic affinity maps that remember an endpoint no
    /// longer in their list.
    fn clean_affinity(
        &mut self,
        family: Family,
        maps: &[(String, Vec<Vec<u8>>)],
        report: &mut SyncReport,
    ) -> Result<(), SinkError> {
        let mut doomed: Vec<(String, Vec<u8>)> = Vec::new();
        for (map, valid) in maps {
            let read =
                self.kernel
                    .read_elements(nfproto(family), names::TABLE, map, &mut |element| {
                        let keep = match element.data {
                            ElementData::Value(v) => valid.iter().any(|d| d.as_slice() == v),
                            _ => true,
                        };
                        if !keep {
                            doomed.push((map.clone(), element.key.to_vec()));
                        }
                    });
            if let Err(e) = read {
                // A map that is not there yet holds nothing to clean.
                tracing::debug!(%e, map, "affinity map not read");
            }
        }
        if doomed.is_empty() {
            return Ok(());
        }
        let mut sink = Sink::new(Some(&mut self.kernel), family, REPORT_TEXT_LIMIT)
            .map_err(SinkError::Kernel)?;
        for (map, key) in &doomed {
            sink.delete_element(map, key);
        }
        match sink.commit() {
            // An element may expire between the read and the delete.
            Ok(()) | Err(SinkError::Refused(_)) => {}
            Err(e) => return Err(e),
        }
        report.changed += sink.changed;
        report.payload.push_str(&sink.text());
        self.generation = sink.generation();
        Ok(())
    }

    fn sync_state(
        &mut self,
        plan: &Arc<MergedPlan>,
        dry_run: bool,
    ) -> Result<SyncReport, DataplaneError> {
        let mut report = SyncReport::default();
        self.sent = (0, 0);
        let previous = self.plan.clone();
        // Computed once per sync (each is a walk of every entry: 67,000 at 50,000
        // Services), for both families and the UDP step.
        let in_order = sorted(plan);
        let all_changes: Option<Vec<Change<'_>>> = match &previous {
            Some(old) if in_order => Some(changes(old, plan)),
            _ => None,
        };
        let start = std::time::Instant::now();
        for family in Family::ALL {
            if let Err(e) =
                self.sync_family(plan, family, all_changes.as_deref(), dry_run, &mut report)
            {
                return Err(match e {
                    SinkError::Kernel(e) => e,
                    refused @ SinkError::Refused(_) => {
                        self.invalidate();
                        refused.into_dataplane()
                    }
                });
            }
        }
        report.phases.push(("nftables", start.elapsed()));
        report.rules = self
            .families
            .iter()
            .flatten()
            .map(FamilyState::objects)
            .sum();
        let start = std::time::Instant::now();
        let changed: Option<Vec<EntryChange<'_>>> = all_changes.map(|all| {
            all.into_iter()
                .map(|c| {
                    let key = c.old.or(c.new).map(|e| e.key.as_str()).unwrap_or_default();
                    EntryChange {
                        key: std::borrow::Cow::Borrowed(key),
                        entries: c.new.into_iter().collect(),
                    }
                })
                .collect()
        });
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
        if !dry_run {
            self.plan = in_order.then(|| Arc::clone(plan));
        }
        Ok(report)
    }

    /// Rewrites the chains, sets and elements others touched, as nf_tables'
    /// announcements named them, from the last plan: one transaction per family, no
    /// read. Elements are put back one by one; if the kernel refuses that (the key was
    /// not as announced, as the agent's own sync touched it since), their sets are
    /// rewritten whole. False when it could not (no model, a name it does not know,
    /// another family's table, refused): a read of the table decides then.
    fn rewrite_touched(&mut self, touched: &Touched) -> bool {
        let Some(plan) = self.plan.clone() else {
            return false;
        };
        let ours = |f: &u8| Family::ALL.iter().any(|family| nfproto(*family) == *f);
        if touched
            .chains
            .iter()
            .chain(&touched.sets)
            .chain(touched.elements.keys())
            .any(|(f, _)| !ours(f))
        {
            return false;
        }
        for family in Family::ALL {
            let proto = nfproto(family);
            let of_family = |objects: &BTreeSet<(u8, String)>| -> BTreeSet<String> {
                objects
                    .iter()
                    .filter(|(f, _)| *f == proto)
                    .map(|(_, name)| name.clone())
                    .collect()
            };
            let chains = of_family(&touched.chains);
            let mut sets = of_family(&touched.sets);
            let mut elements: BTreeMap<String, BTreeMap<Vec<u8>, bool>> = touched
                .elements
                .iter()
                .filter(|((f, _), _)| *f == proto)
                .map(|((_, set), keys)| (set.clone(), keys.clone()))
                .collect();
            if chains.is_empty() && sets.is_empty() && elements.is_empty() {
                continue;
            }
            let i = family.index();
            let entries = entries_of(&plan, family);
            loop {
                let Some(state) = self.families[i].as_ref() else {
                    return false;
                };
                let Ok(mut sink) = Sink::new(Some(&mut self.kernel), family, REPORT_TEXT_LIMIT)
                else {
                    return false;
                };
                let stale = &self.stale[i];
                if !diff::rewrite(&entries, state, stale, &chains, &sets, &elements, &mut sink) {
                    tracing::debug!(
                        ?chains,
                        ?sets,
                        "not all of what others touched is known here; reading the table"
                    );
                    return false;
                }
                match sink.commit() {
                    Ok(()) => {
                        tracing::info!(
                            ?family,
                            ?chains,
                            ?sets,
                            elements = elements.values().map(BTreeMap::len).sum::<usize>(),
                            "rewrote what someone else changed in the agent's table"
                        );
                        self.generation = sink.generation();
                        break;
                    }
                    Err(SinkError::Refused(why)) if !elements.is_empty() => {
                        tracing::debug!(%why, "putting elements back one by one was refused; rewriting their sets");
                        sets.extend(std::mem::take(&mut elements).into_keys());
                    }
                    Err(err) => {
                        tracing::debug!(
                            ?err,
                            "rewriting what others touched failed; reading the table"
                        );
                        return false;
                    }
                }
            }
        }
        true
    }

    /// Reads one family's table and sends what brings it back to the last plan: whether
    /// it was as the last sync left it (nothing sent). Pending deferred deletions go with
    /// it, and count as a change.
    fn repair_family(&mut self, family: Family) -> Result<bool, DataplaneError> {
        let Some(plan) = self.plan.clone() else {
            return Ok(true);
        };
        // Without a model of the family the sync reads the table.
        self.families[family.index()] = None;
        let sent = std::mem::take(&mut self.sent);
        let mut report = SyncReport::default();
        let result = self.sync_family(&plan, family, None, false, &mut report);
        // What the last sync sent stays what `sent` tells.
        let intact = std::mem::replace(&mut self.sent, sent).0 == 0;
        match result {
            Ok(()) => Ok(intact),
            Err(SinkError::Kernel(e)) => Err(e),
            Err(refused @ SinkError::Refused(_)) => {
                self.invalidate();
                Err(refused.into_dataplane())
            }
        }
    }
}

/// What a family's sink did.
struct Finished {
    dry: bool,
    generation: Option<u32>,
    kept: Stale,
    messages: usize,
    transactions: usize,
}

/// After a family's main transaction: the deferred deletions in a transaction of their
/// own (kept for the next sync when refused), and the report.
fn finish(
    mut sink: Sink<'_>,
    stale: Stale,
    report: &mut SyncReport,
) -> Result<Finished, SinkError> {
    let dry = sink.generation().is_none();
    let mut kept = Stale::default();
    if !stale.is_empty() {
        stale.write(&mut sink);
        match sink.commit() {
            Ok(()) => {}
            Err(SinkError::Refused(why)) => {
                tracing::debug!(%why, "deleting unused chains and sets later");
                kept = stale;
            }
            Err(e) => return Err(e),
        }
    }
    report.changed += sink.changed;
    report.payload.push_str(&sink.text());
    Ok(Finished {
        dry,
        generation: sink.generation(),
        kept,
        messages: sink.messages,
        transactions: sink.transactions,
    })
}

fn stale_union(a: &mut Stale, b: Stale) -> Stale {
    let mut out = std::mem::take(a);
    out.chains.extend(b.chains);
    out.sets.extend(b.sets);
    out
}

/// The affinity maps of changed entries whose lists lost an endpoint.
fn affinity_cleanups(changes: &[Change<'_>]) -> Vec<(String, Vec<Vec<u8>>)> {
    let mut out = Vec::new();
    for change in changes {
        let (Some(old), Some(new)) = (change.old, change.new) else {
            continue;
        };
        let before = affinity_maps(old);
        for (map, valid) in affinity_maps(new) {
            let lost = before
                .iter()
                .find(|(m, _)| *m == map)
                .is_some_and(|(_, was)| was.iter().any(|d| !valid.contains(d)));
            if lost {
                out.push((map, valid));
            }
        }
    }
    out
}

impl<K: NftKernel, R: Runner> Dataplane for NftablesDataplane<K, R> {
    fn sync(&mut self, plan: &MergedPlan, dry_run: bool) -> Result<SyncReport, DataplaneError> {
        self.sync_shared(&Arc::new(plan.clone()), dry_run)
    }

    fn sync_shared(
        &mut self,
        plan: &Arc<MergedPlan>,
        dry_run: bool,
    ) -> Result<SyncReport, DataplaneError> {
        match self.sync_state(plan, dry_run) {
            Ok(report) => Ok(report),
            Err(first)
                if !dry_run && self.plan.is_none() && self.families.iter().all(Option::is_none) =>
            {
                // The model was wrong (someone changed the table): read it and try once
                // more at once.
                tracing::warn!(error = %first, "nf_tables refused the changes; reading the table again");
                self.sync_state(plan, dry_run)
                    .inspect_err(|_| self.invalidate())
            }
            Err(e) => {
                self.invalidate();
                Err(e)
            }
        }
    }

    fn rules_intact(&mut self) -> Result<bool, DataplaneError> {
        // Nothing programmed or read yet: the next sync reads the kernel anyway.
        if self.plan.is_none() {
            return Ok(true);
        }
        let known = self.generation;
        let now = self.kernel.generation()?;
        // nf_tables' announcements say whether anyone else changed this table (also
        // just before one of the agent's own commits, which the generation alone hides);
        // the table is read back only when they say so, or cannot tell while the
        // generation moved (0.7 to 0.9 s at 10,000 Services, with changes waiting).
        match self.kernel.changed_by_others(names::TABLE, now)? {
            Some(touched) if touched.is_empty() => {
                self.generation = Some(now);
                return Ok(true);
            }
            None if known == Some(now) => return Ok(true),
            // The announcements named what was touched: rewritten from the last plan in
            // one transaction, without reading the table (a flushed chain that every
            // Service shares is back in milliseconds, not after a read of the table).
            Some(touched) if !touched.unscoped && self.rewrite_touched(&touched) => {
                return Ok(false);
            }
            Some(_) | None => {}
        }
        // Repaired from the read at once: a second read by the next sync would keep every
        // Service behind a flushed chain broken twice as long (0.75 s per read at 10,000
        // Services).
        let mut intact = true;
        for family in Family::ALL {
            intact &= self.repair_family(family)?;
        }
        if intact {
            // Someone else committed, not to this table.
            self.generation = Some(self.kernel.generation()?);
        }
        Ok(intact)
    }

    fn holds_rules(&mut self) -> Result<bool, DataplaneError> {
        for family in Family::ALL {
            if self.kernel.table_exists(nfproto(family), names::TABLE)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn change_alarm(&mut self) -> Option<Box<dyn ChangeAlarm>> {
        self.kernel.change_alarm(names::TABLE)
    }

    fn cleanup(&mut self) -> Result<SyncReport, DataplaneError> {
        let mut report = SyncReport::default();
        self.sent = (0, 0);
        for family in Family::ALL {
            if !self.kernel.table_exists(nfproto(family), names::TABLE)? {
                continue;
            }
            let mut sink = Sink::new(Some(&mut self.kernel), family, REPORT_TEXT_LIMIT)?;
            sink.delete_table();
            sink.commit().map_err(SinkError::into_dataplane)?;
            report.changed += sink.changed;
            report.payload.push_str(&sink.text());
            self.sent.0 += sink.messages;
            self.sent.1 += sink.transactions;
        }
        self.invalidate();
        self.stale = [Stale::default(), Stale::default()];
        self.udp.reset();
        Ok(report)
    }
}

/// The plan's name for `family`.
fn ip_family(family: Family) -> IpFamily {
    match family {
        Family::V4 => IpFamily::IPv4,
        Family::V6 => IpFamily::IPv6,
    }
}
