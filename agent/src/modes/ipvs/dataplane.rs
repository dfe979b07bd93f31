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
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use proxyplan_crds::MergedPlan;
use tracing::{info, warn};

use super::desired::{ChangedEntries, Desired, HeldSets};

use super::render::{self, IpvsSettings, RealServer, SetId, VirtualServer, VirtualServerKey};
use super::set_changes::{SetChange, SetChanges};
use crate::conntrack::{EntryChange, UdpTracker};
use crate::dataplane::{Dataplane, DataplaneError, SyncReport};
use crate::kernel::command::Runner;
use crate::kernel::family::Family;
use crate::kernel::ipset::{self, SetOp, Sets};
use crate::kernel::iptables::{Backend, BackendChoice, LOCK_WAIT, Tool};
use crate::kernel::ipvs::{
    IP_VS_SVC_F_PERSISTENT, IPPROTO_UDP, IpvsDestination, IpvsKernel, IpvsOp, IpvsService,
    socket_text,
};
use crate::ruleset::diff::FamilyDiff;
use crate::ruleset::rules::{FamilyRules, Ruleset, TableName};
use crate::ruleset::save::KernelFamily;
use crate::ruleset::tables::{canary_intact, read_family};

/// Operations sent to the kernel per netlink round (bounds memory at first apply).
const OPS_PER_ROUND: usize = 4096;
/// New VIPs from which they are added alongside the sets and IPVS changes.
const ADDRESSES_ALONGSIDE: usize = 256;
/// Set changes written out in a sync's report (a dry run writes all).
const SET_LINES_SHOWN: usize = 1000;

/// A real server as the kernel holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HeldRealServer {
    weight: u32,
}

/// A virtual server as the kernel holds it (its key is the model's): what the agent sets
/// on it, and its real servers. Small, as 10,000 of them are held.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HeldService {
    /// The scheduler (shared with the agent's setting when they match).
    scheduler: Arc<str>,
    /// The persistence timeout of a persistent service.
    persistence: Option<u32>,
    real_servers: BTreeMap<RealServer, HeldRealServer>,
}

impl HeldService {
    /// The service as IPVS requests name it.
    fn service(&self, key: &VirtualServerKey) -> IpvsService {
        ipvs_service(key, self.persistence, &self.scheduler)
    }
}

/// What the kernel holds of the agent's objects.
#[derive(Debug, Clone, Default)]
struct Model {
    /// The dummy interface's index (`None` in a dry run on a node without it).
    link: Option<u32>,
    /// Addresses on the dummy interface.
    vips: BTreeSet<IpAddr>,
    /// Addresses on every other interface.
    local: BTreeSet<IpAddr>,
    /// The agent's virtual servers.
    services: BTreeMap<VirtualServerKey, HeldService>,
    /// The agent's ipsets, right after they were read; `None` once a sync succeeded, when
    /// the kernel holds what [`Desired`] counts.
    sets: Option<Sets>,
}

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

/// The sysctls the ipvs mode needs: name, value, why.
const SYSCTLS: [(&str, &str, &str); 4] = [
    (
        "net/ipv4/vs/conntrack",
        "1",
        "IPVS traffic must pass netfilter for masquerade",
    ),
    (
        "net/ipv4/vs/expire_nodest_conn",
        "1",
        "connections to deleted real servers end at once",
    ),
    (
        "net/ipv4/vs/expire_quiescent_template",
        "1",
        "affinity never sticks to a drained real server",
    ),
    (
        "net/ipv4/ip_forward",
        "1",
        "the node forwards service traffic",
    ),
];

/// Strict ARP sysctls (`--ipvs-strict-arp`).
const STRICT_ARP: [(&str, &str, &str); 2] = [
    (
        "net/ipv4/conf/all/arp_ignore",
        "1",
        "answer ARP only for addresses of the receiving interface",
    ),
    (
        "net/ipv4/conf/all/arp_announce",
        "2",
        "never announce VIPs of the dummy interface",
    ),
];

/// One sysctl check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlCheck {
    /// `net/ipv4/vs/conntrack`.
    pub name: String,
    /// The value the agent needs.
    pub wanted: String,
    /// The value found before the agent set it (`None` when missing).
    pub found: Option<String>,
    /// Whether it holds the wanted value now.
    pub ok: bool,
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
    draining: HashMap<(VirtualServerKey, RealServer), Instant>,
    udp: UdpTracker,
    sysctls: Vec<SysctlCheck>,
}

const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

fn index(family: Family) -> usize {
    match family {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno.abs()).to_string()
}

/// The IPVS service for a key, with a persistence timeout or none.
fn ipvs_service(key: &VirtualServerKey, persistence: Option<u32>, scheduler: &str) -> IpvsService {
    let mut service = IpvsService::new(key.protocol, key.addr, key.port, scheduler);
    if let Some(timeout) = persistence {
        service.flags = IP_VS_SVC_F_PERSISTENT;
        service.timeout = timeout;
    }
    service
}

/// IPVS changes collected and sent in rounds.
struct OpRounds {
    kinds: Vec<(OpKind, usize, Option<usize>)>,
    services: Vec<IpvsService>,
    destinations: Vec<IpvsDestination>,
    dry_run: bool,
    sent: usize,
    failures: Vec<String>,
    payload: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    AddService,
    UpdateService,
    DeleteService,
    AddDestination,
    UpdateDestination,
    DeleteDestination,
}

impl OpRounds {
    fn new(dry_run: bool) -> Self {
        Self {
            kinds: Vec::new(),
            services: Vec::new(),
            destinations: Vec::new(),
            dry_run,
            sent: 0,
            failures: Vec::new(),
            payload: String::new(),
        }
    }

    /// Keeps `service` for the real-server operations that follow; no operation itself.
    fn with_service(&mut self, service: IpvsService) -> usize {
        self.services.push(service);
        self.services.len() - 1
    }

    /// An operation on `service` itself.
    fn service(&mut self, kind: OpKind, service: IpvsService) -> usize {
        let i = self.with_service(service);
        self.kinds.push((kind, i, None));
        i
    }

    fn destination(&mut self, kind: OpKind, service: usize, destination: IpvsDestination) {
        self.destinations.push(destination);
        self.kinds
            .push((kind, service, Some(self.destinations.len() - 1)));
    }

    fn full(&self) -> bool {
        self.kinds.len() >= OPS_PER_ROUND
    }

    fn send(&mut self, kernel: &mut impl IpvsKernel) -> Result<(), DataplaneError> {
        if self.kinds.is_empty() {
            self.services.clear();
            self.destinations.clear();
            return Ok(());
        }
        let ops: Vec<IpvsOp<'_>> = self
            .kinds
            .iter()
            .filter_map(|&(kind, s, d)| {
                let service = self.services.get(s)?;
                let dest = d.and_then(|d| self.destinations.get(d));
                Some(match (kind, dest) {
                    (OpKind::AddService, _) => IpvsOp::AddService(service),
                    (OpKind::UpdateService, _) => IpvsOp::UpdateService(service),
                    (OpKind::DeleteService, _) => IpvsOp::DeleteService(service),
                    (OpKind::AddDestination, Some(d)) => IpvsOp::AddDestination(service, d),
                    (OpKind::UpdateDestination, Some(d)) => IpvsOp::UpdateDestination(service, d),
                    (OpKind::DeleteDestination, Some(d)) => IpvsOp::DeleteDestination(service, d),
                    _ => return None,
                })
            })
            .collect();
        self.sent += ops.len();
        if self.dry_run {
            for op in &ops {
                self.payload.push_str(&format!("# ipvs {op}\n"));
            }
        } else {
            let results = kernel.execute(&ops)?;
            for (op, errno) in ops.iter().zip(results) {
                // Deleting what is already gone is done.
                let gone = matches!(op, IpvsOp::DeleteService(_) | IpvsOp::DeleteDestination(..))
                    && matches!(errno, -2 | -3);
                if errno != 0 && !gone && self.failures.len() < 5 {
                    self.failures.push(format!("{op}: {}", errno_text(errno)));
                }
            }
        }
        self.kinds.clear();
        self.services.clear();
        self.destinations.clear();
        Ok(())
    }
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
            draining: HashMap::new(),
            udp: UdpTracker::default(),
            sysctls: Vec::new(),
        }
    }

    /// The kernel handle (for tests to inspect a fake).
    #[must_use]
    pub fn kernel(&self) -> &K {
        &self.kernel
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

    /// Forgets the model: the next sync reads the kernel again.
    pub fn invalidate(&mut self) {
        self.model = None;
        self.desired.clear();
        self.frame = [None, None];
    }

    fn owned(&self, service: &IpvsService, model: &Model) -> bool {
        service.fwmark.is_none()
            && !self.settings.excluded(service.addr)
            && (model.vips.contains(&service.addr) || model.local.contains(&service.addr))
    }

    fn read_model(&mut self, create_link: bool) -> Result<Model, DataplaneError> {
        let name = self.settings.interface.clone();
        let mut link = self.kernel.link_index(&name)?;
        if link.is_none() && create_link {
            let created = self.kernel.create_dummy(&name)?;
            info!(interface = %name, index = created, "created the dummy interface for service VIPs");
            link = Some(created);
        }
        let mut model = Model {
            link,
            ..Model::default()
        };
        for address in self.kernel.addresses()? {
            if Some(address.index) == link {
                model.vips.insert(address.ip);
            } else {
                model.local.insert(address.ip);
            }
        }
        for service in self.kernel.services()? {
            if !self.owned(&service, &model) {
                continue;
            }
            let real_servers = self
                .kernel
                .destinations(&service)?
                .into_iter()
                .map(|d| ((d.addr, d.port), HeldRealServer { weight: d.weight }))
                .collect();
            let key = VirtualServerKey {
                protocol: service.protocol,
                addr: service.addr,
                port: service.port,
            };
            model.services.insert(
                key,
                HeldService {
                    scheduler: if *service.scheduler == *self.scheduler {
                        Arc::clone(&self.scheduler)
                    } else {
                        Arc::from(service.scheduler.as_str())
                    },
                    persistence: service.is_persistent().then_some(service.timeout),
                    real_servers,
                },
            );
        }
        model.sets = Some(self.kernel.sets()?);
        Ok(model)
    }

    /// Sends set operations over netlink in rounds and writes them to `payload` (in full
    /// for a dry run, else only the first [`SET_LINES_SHOWN`]); returns how many there
    /// were. Taking them as they come, a first apply's 150,000 additions are never all in
    /// memory at once.
    fn send_sets<'a>(
        &mut self,
        ops: impl Iterator<Item = SetOp<'a>>,
        dry_run: bool,
        payload: &mut String,
    ) -> Result<usize, DataplaneError> {
        let mut count = 0;
        let mut failures = Vec::new();
        let mut failed = 0;
        let mut round: Vec<SetOp<'a>> = Vec::new();
        let mut ops = ops.peekable();
        while ops.peek().is_some() {
            round.clear();
            round.extend(ops.by_ref().take(OPS_PER_ROUND));
            for op in &round {
                if count == 0 {
                    payload
                        .push_str("# ipset (netlink), as `ipset restore -exist` would take it\n");
                }
                count += 1;
                if dry_run || count <= SET_LINES_SHOWN {
                    payload.push_str(&op.to_string());
                    payload.push('\n');
                }
            }
            if dry_run {
                continue;
            }
            let results = self.kernel.set_ops(&round)?;
            for (op, errno) in round.iter().zip(results) {
                // Deleting an entry that is already gone is done.
                let done = errno == 0
                    || (matches!(op, SetOp::Del(..)) && errno == -ipset::IPSET_ERR_EXIST);
                if done {
                    continue;
                }
                failed += 1;
                if failures.len() < 5 {
                    let hint = if matches!(op, SetOp::Create { .. }) && errno == -17 {
                        " (a set of that name exists with another type or family: run \
                     `proxyplan-agent cleanup --mode ipvs` and restart the agent)"
                    } else {
                        ""
                    };
                    failures.push(format!("{op}: {}{hint}", ipset::error_name(errno)));
                }
            }
        }
        if !dry_run && count > SET_LINES_SHOWN {
            payload.push_str(&format!(
                "# ... {} more set changes not shown\n",
                count - SET_LINES_SHOWN
            ));
        }
        match failures.first() {
            None => Ok(count),
            Some(first) => Err(DataplaneError::Io {
                context: format!("the kernel refused {failed} ipset change(s), first: {first}"),
                source: std::io::Error::other(failures.join("; ")),
            }),
        }
    }

    /// Checks (and sets) the sysctls the mode needs; failures are warnings.
    fn check_sysctls(&mut self, payload: &mut String, dry_run: bool) {
        let wanted = SYSCTLS
            .iter()
            .chain(STRICT_ARP.iter().filter(|_| self.settings.strict_arp));
        let mut checks = Vec::new();
        for (name, value, why) in wanted {
            let found = match self.kernel.read_sysctl(name) {
                Ok(found) => found,
                Err(err) => {
                    warn!(sysctl = name, %err, "cannot read sysctl");
                    None
                }
            };
            let mut ok = found.as_deref() == Some(value);
            if !ok && found.is_some() {
                payload.push_str(&format!(
                    "# sysctl {name}={value} (was {}): {why}\n",
                    found.as_deref().unwrap_or("?")
                ));
                if !dry_run {
                    match self.kernel.write_sysctl(name, value) {
                        Ok(()) => ok = true,
                        Err(err) => warn!(sysctl = name, %err, "cannot set sysctl: {why}"),
                    }
                }
            } else if found.is_none() {
                warn!(
                    sysctl = name,
                    "sysctl missing (is the ip_vs module loaded?): {why}"
                );
            }
            checks.push(SysctlCheck {
                name: (*name).to_owned(),
                wanted: (*value).to_owned(),
                found,
                ok,
            });
        }
        if !dry_run {
            self.sysctls = checks;
        }
    }

    fn sync_state(
        &mut self,
        plan: &Arc<MergedPlan>,
        dry_run: bool,
    ) -> Result<SyncReport, DataplaneError> {
        let mut report = SyncReport::default();
        if self.sysctls.is_empty() {
            self.check_sysctls(&mut report.payload, dry_run);
        }
        let had_model = self.model.is_some();
        let mut model = match self.model.take() {
            Some(model) => model,
            None => self.read_model(!dry_run)?,
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
        let rules = render::rules(plan, &self.settings, desired.families());
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
        report.conntrack_deleted = self.udp.clear(
            &self.runner,
            plan,
            changed.as_deref(),
            dry_run,
            &mut |line| payload.push_str(line),
        )?;
        report.phases.push(("conntrack", start.elapsed()));
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
            match self.send_sets(ops, dry_run, &mut report.payload) {
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
            let sent = self.ipvs_changes(servers, &gone, model, &mut rounds);
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
        for family in FAMILIES {
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
                self.programmed[index(family)] = rules.rule_count() > 0;
            }
        }
        lap(report, "iptables");
        // 5. VIPs nothing wants any more.
        self.change_addresses(model, &del_vips, false, dry_run, report)?;
        // 6. Sets nothing uses any more.
        report.changed += self.send_sets(sets.ops(&sets.after), dry_run, &mut report.payload)?;
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

    /// Collects the IPVS changes into `rounds` (sending full rounds as it goes) and
    /// updates `model` to what the kernel holds once they are done: `servers` as wanted,
    /// `gone` deleted, and real servers left draining checked.
    fn ipvs_changes(
        &mut self,
        servers: BTreeMap<VirtualServerKey, VirtualServer>,
        gone: &BTreeSet<VirtualServerKey>,
        model: &mut Model,
        rounds: &mut OpRounds,
    ) -> Result<(), DataplaneError> {
        let now = Instant::now();
        for key in gone {
            if let Some(held) = model.services.get(key) {
                rounds.service(OpKind::DeleteService, held.service(key));
            }
            if !rounds.dry_run {
                model.services.remove(key);
            }
            self.draining.retain(|(k, _), _| k != key);
            if rounds.full() {
                rounds.send(&mut self.kernel)?;
            }
        }
        // Consumed, so each wanted server's list is freed once it is reconciled.
        for (key, vs) in servers {
            if self.settings.excluded(key.addr) {
                continue;
            }
            self.reconcile(&key, &vs, model, rounds, now);
            if rounds.full() {
                rounds.send(&mut self.kernel)?;
            }
        }
        // Draining real servers: delete those whose connections ended or whose grace
        // period is over. Also those left at weight 0 by an earlier run.
        rounds.send(&mut self.kernel)?;
        let draining: BTreeSet<VirtualServerKey> = self.draining.keys().map(|(k, _)| *k).collect();
        let draining: Vec<VirtualServerKey> = draining.into_iter().collect();
        self.finish_draining(&draining, model, rounds, now)
    }

    /// Brings one virtual server to `vs`.
    fn reconcile(
        &mut self,
        key: &VirtualServerKey,
        vs: &VirtualServer,
        model: &mut Model,
        rounds: &mut OpRounds,
        now: Instant,
    ) {
        let wanted = ipvs_service(key, vs.persistence, &self.scheduler);
        let Some(held) = model.services.get(key) else {
            let s = rounds.service(OpKind::AddService, wanted);
            for (addr, port) in &vs.real_servers {
                rounds.destination(
                    OpKind::AddDestination,
                    s,
                    IpvsDestination::masq(*addr, *port, 1),
                );
            }
            if !rounds.dry_run {
                model.services.insert(
                    *key,
                    HeldService {
                        scheduler: Arc::clone(&self.scheduler),
                        persistence: vs.persistence,
                        real_servers: vs
                            .real_servers
                            .iter()
                            .map(|rs| (*rs, HeldRealServer { weight: 1 }))
                            .collect(),
                    },
                );
            }
            return;
        };
        let update = held.scheduler != self.scheduler || held.persistence != vs.persistence;
        let mut changes: Vec<(OpKind, RealServer, u32)> = Vec::new();
        for rs in &vs.real_servers {
            match held.real_servers.get(rs) {
                None => changes.push((OpKind::AddDestination, *rs, 1)),
                Some(h) if h.weight != 1 => {
                    changes.push((OpKind::UpdateDestination, *rs, 1));
                    self.draining.remove(&(*key, *rs));
                }
                Some(_) => {}
            }
        }
        for (rs, h) in &held.real_servers {
            if vs.real_servers.binary_search(rs).is_ok() {
                continue;
            }
            if key.protocol == IPPROTO_UDP {
                changes.push((OpKind::DeleteDestination, *rs, h.weight));
                continue;
            }
            if h.weight != 0 {
                changes.push((OpKind::UpdateDestination, *rs, 0));
            }
            if !rounds.dry_run {
                self.draining
                    .entry((*key, *rs))
                    .or_insert(now + self.settings.termination_grace);
            }
        }
        if !update && changes.is_empty() {
            return;
        }
        let s = if update {
            rounds.service(OpKind::UpdateService, wanted)
        } else {
            rounds.with_service(held.service(key))
        };
        for (kind, (addr, port), weight) in &changes {
            rounds.destination(*kind, s, IpvsDestination::masq(*addr, *port, *weight));
        }
        if !rounds.dry_run
            && let Some(held) = model.services.get_mut(key)
        {
            if update {
                held.scheduler = Arc::clone(&self.scheduler);
                held.persistence = vs.persistence;
            }
            for (kind, rs, weight) in changes {
                match kind {
                    OpKind::DeleteDestination => {
                        held.real_servers.remove(&rs);
                    }
                    _ => {
                        held.real_servers.insert(rs, HeldRealServer { weight });
                    }
                }
            }
        }
    }

    fn finish_draining(
        &mut self,
        keys: &[VirtualServerKey],
        model: &mut Model,
        rounds: &mut OpRounds,
        now: Instant,
    ) -> Result<(), DataplaneError> {
        for key in keys {
            let Some(held) = model.services.get(key) else {
                continue;
            };
            let service = held.service(key);
            let counters = if rounds.dry_run {
                Vec::new()
            } else {
                self.kernel.destinations(&service)?
            };
            let mut done = Vec::new();
            for d in &counters {
                let rs = (d.addr, d.port);
                let Some(deadline) = self.draining.get(&(*key, rs)) else {
                    continue;
                };
                let connections = d.counters.active_connections.unwrap_or(0)
                    + d.counters.inactive_connections.unwrap_or(0);
                if d.weight == 0 && (connections == 0 || now >= *deadline) {
                    if connections > 0 {
                        warn!(service = %key, real_server = %socket_text(rs.0, rs.1), connections,
                            "grace period over: deleting a real server that still has connections");
                    }
                    done.push(rs);
                }
            }
            if done.is_empty() {
                continue;
            }
            let s = rounds.with_service(service);
            for rs in done {
                rounds.destination(
                    OpKind::DeleteDestination,
                    s,
                    IpvsDestination::masq(rs.0, rs.1, 0),
                );
                self.draining.remove(&(*key, rs));
                if let Some(held) = model.services.get_mut(key) {
                    held.real_servers.remove(&rs);
                }
            }
        }
        rounds.send(&mut self.kernel)
    }

    /// Brings one family's fixed rules to `desired`; returns the payload and the number of
    /// chains changed.
    fn sync_frame(
        &mut self,
        family: Family,
        desired: &FamilyRules,
        dry_run: bool,
    ) -> Result<(String, usize), DataplaneError> {
        let i = index(family);
        let wanted = desired.rule_count() > 0;
        let mut kernel = match self.frame[i].take() {
            Some(kernel) => kernel,
            None => read_family(&self.runner, self.backend, family, wanted)?,
        };
        let mut diff = FamilyDiff::new(desired, &kernel);
        if diff.needs_fresh_positions() {
            kernel = read_family(&self.runner, self.backend, family, wanted)?;
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

    /// Whether IPVS, the interface and the sets still hold what the model says (counted,
    /// not compared entry by entry).
    fn ipvs_intact(&mut self) -> Result<bool, DataplaneError> {
        let Some(model) = self.model.take() else {
            return Ok(true);
        };
        let link = self.kernel.link_index(&self.settings.interface)?;
        let services = self.kernel.services()?;
        let owned = services.iter().filter(|s| self.owned(s, &model)).count();
        let addresses = self.kernel.addresses()?;
        let local: BTreeSet<IpAddr> = addresses
            .iter()
            .filter(|a| Some(a.index) != link)
            .map(|a| a.ip)
            .collect();
        let vips = addresses.iter().filter(|a| Some(a.index) == link).count();
        let sets = self.kernel.set_names()?.len();
        let intact = link == model.link
            && owned == model.services.len()
            && vips == model.vips.len()
            && local == model.local
            && sets == self.desired.set_ids().count();
        if intact {
            self.model = Some(model);
        }
        Ok(intact)
    }
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

    fn rules_intact(&mut self) -> Result<bool, DataplaneError> {
        for family in FAMILIES {
            if !self.programmed[index(family)] {
                continue;
            }
            for table in [TableName::Nat, TableName::Filter] {
                if !canary_intact(&self.runner, self.backend, family, table)? {
                    self.frame[index(family)] = None;
                    return Ok(false);
                }
            }
        }
        self.ipvs_intact()
    }

    fn cleanup(&mut self) -> Result<SyncReport, DataplaneError> {
        let mut report = SyncReport::default();
        self.invalidate();
        let mut model = self.read_model(false)?;
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
        for family in FAMILIES {
            self.frame[index(family)] = None;
            let (payload, changed) = self.sync_frame(family, &nothing, false)?;
            report.payload.push_str(&payload);
            report.changed += changed;
            self.programmed[index(family)] = false;
        }
        if let Some(link) = model.link {
            self.kernel.delete_link(link)?;
            report.changed += 1 + model.vips.len();
        }
        let mut destroy = SetChanges::default();
        for name in model.sets.take().unwrap_or_default().keys() {
            destroy.destroy(name);
        }
        self.send_sets(destroy.ops(&destroy.after), false, &mut report.payload)?;
        report.changed += destroy.changed();
        self.invalidate();
        self.udp.reset();
        self.draining.clear();
        Ok(report)
    }
}
