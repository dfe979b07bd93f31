//! The desired ipvs-mode state as counts of who wants what, kept between syncs and
//! updated entry by entry.
//!
//! Several plan entries may want the same VIP (the ports of one Service) or the same set
//! entry (a hairpin entry of endpoints two Services share), so each address, virtual
//! server and set entry carries the number of entries that want it. A sync compares the
//! new plan with the previous one entry by entry (both are sorted by key), takes back the
//! [`Contribution`] of each entry that changed or went and adds the new one: only what
//! changes count between wanted and not wanted reaches the kernel, and an endpoint
//! change costs the work of one entry, not of the plan.
//!
//! Virtual servers are not stored: their value comes from the entry that wants them,
//! rendered again when it changes. The previous plan is kept (shared with the caller, an
//! [`Arc`]) to render what an entry wanted before.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use proxyplan_crds::{IpFamily, MergedPlan, ServicePortPlan};

use super::render::{Contribution, NodeContext, VirtualServer, VirtualServerKey, contribute};
use super::set_changes::SetChanges;
use super::sets::{Role, SetId};
use crate::kernel::ipset::{IpSet, SetEntry, SetOp, Sets};

/// What an update changes in the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    /// Virtual servers the changed entries want, with what they should be.
    pub servers: BTreeMap<VirtualServerKey, VirtualServer>,
    /// Virtual servers the changed entries wanted and nothing wants now.
    pub gone: BTreeSet<VirtualServerKey>,
    /// Set entries nothing wanted before.
    pub add: Vec<(SetId, SetEntry)>,
    /// Set entries nothing wants now.
    pub del: Vec<(SetId, SetEntry)>,
    /// VIPs the changed entries wanted or want (compare each with the interface).
    pub addresses: BTreeSet<IpAddr>,
    /// Entries that changed, came or went.
    pub entries_changed: usize,
    /// Which entries changed.
    pub changed: ChangedEntries,
}

/// The entries an update found changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangedEntries {
    /// Where the entries that changed or came are in the new plan.
    pub updated: Vec<usize>,
    /// Keys of the entries that went.
    pub removed: Vec<String>,
}

/// What an update touched, before it is turned into a [`Delta`].
#[derive(Debug, Default)]
struct Touched {
    /// Set entries touched, with whether something wanted them before.
    entries: HashMap<(SetId, SetEntry), bool>,
    /// VIPs touched.
    addresses: BTreeSet<IpAddr>,
    /// Virtual servers the changed entries wanted before.
    servers: BTreeSet<VirtualServerKey>,
}

/// What the kernel's sets hold, as far as the agent knows: read from the kernel, or
/// what the previous counts wanted (the kernel held that after the last sync).
#[derive(Debug)]
pub enum HeldSets {
    /// As read from the kernel.
    Read(Sets),
    /// What these counts wanted.
    Counted(Box<Desired>),
}

impl HeldSets {
    fn holds(&self, id: SetId, name: &str, entry: &SetEntry) -> bool {
        match self {
            Self::Read(sets) => sets
                .get(name)
                .is_some_and(|set| set.spec == id.spec() && set.entries.contains(entry)),
            Self::Counted(old) => old.entries.contains(&(id, *entry)),
        }
    }
}

/// How many entries want each set entry. The hairpin loop-back entries (one per endpoint,
/// most of all entries) are kept apart in a compact form that implies their set and
/// their second address: at 10,000 Services that quarters the memory of the counts.
#[derive(Debug, Default)]
struct EntryCounts {
    /// IPv4 `LOOP-BACK` entries `ip,proto:port,ip` by `(ip, port, proto)`.
    loop_back4: HashMap<(Ipv4Addr, u16, u8), u32>,
    /// IPv6 ones.
    loop_back6: HashMap<(Ipv6Addr, u16, u8), u32>,
    /// Every other entry.
    other: HashMap<(SetId, SetEntry), u32>,
}

/// Where an entry is counted.
enum Slot {
    LoopBack4((Ipv4Addr, u16, u8)),
    LoopBack6((Ipv6Addr, u16, u8)),
    Other,
}

fn slot(key: &(SetId, SetEntry)) -> Slot {
    match *key {
        (
            SetId {
                ipv6,
                role: Role::LoopBack,
            },
            SetEntry::IpPortIp(ip, protocol, port, ip2),
        ) if ip == ip2 && ip.is_ipv6() == ipv6 => match ip {
            IpAddr::V4(ip) => Slot::LoopBack4((ip, port, protocol)),
            IpAddr::V6(ip) => Slot::LoopBack6((ip, port, protocol)),
        },
        _ => Slot::Other,
    }
}

fn loop_back_entry(ip: IpAddr, port: u16, protocol: u8) -> (SetId, SetEntry) {
    (
        SetId {
            ipv6: ip.is_ipv6(),
            role: Role::LoopBack,
        },
        SetEntry::IpPortIp(ip, protocol, port, ip),
    )
}

impl EntryCounts {
    fn increment(&mut self, key: (SetId, SetEntry)) {
        match slot(&key) {
            Slot::LoopBack4(compact) => increment(&mut self.loop_back4, compact),
            Slot::LoopBack6(compact) => increment(&mut self.loop_back6, compact),
            Slot::Other => increment(&mut self.other, key),
        }
    }

    fn decrement(&mut self, key: (SetId, SetEntry)) {
        match slot(&key) {
            Slot::LoopBack4(compact) => decrement(&mut self.loop_back4, compact),
            Slot::LoopBack6(compact) => decrement(&mut self.loop_back6, compact),
            Slot::Other => decrement(&mut self.other, key),
        }
    }

    fn contains(&self, key: &(SetId, SetEntry)) -> bool {
        match slot(key) {
            Slot::LoopBack4(compact) => self.loop_back4.contains_key(&compact),
            Slot::LoopBack6(compact) => self.loop_back6.contains_key(&compact),
            Slot::Other => self.other.contains_key(key),
        }
    }

    /// How many entries are wanted, over all sets.
    fn len(&self) -> usize {
        self.other.len() + self.loop_back4.len() + self.loop_back6.len()
    }

    /// Every wanted entry with its set, in no particular order.
    fn keys(&self) -> impl Iterator<Item = (SetId, SetEntry)> + '_ {
        let v4 = self
            .loop_back4
            .keys()
            .map(|&(ip, port, protocol)| loop_back_entry(IpAddr::V4(ip), port, protocol));
        let v6 = self
            .loop_back6
            .keys()
            .map(|&(ip, port, protocol)| loop_back_entry(IpAddr::V6(ip), port, protocol));
        self.other.keys().copied().chain(v4).chain(v6)
    }
}

/// Who wants what: counts by address, virtual server and set entry.
#[derive(Debug, Default)]
pub struct Desired {
    node: NodeContext,
    plan: Option<Arc<MergedPlan>>,
    addresses: HashMap<IpAddr, u32>,
    servers: HashMap<VirtualServerKey, u32>,
    entries: EntryCounts,
    families: [usize; 2],
    real_servers: usize,
}

fn family_index(family: IpFamily) -> usize {
    match family {
        IpFamily::IPv4 => 0,
        IpFamily::IPv6 => 1,
    }
}

fn increment<K: Hash + Eq>(map: &mut HashMap<K, u32>, key: K) {
    *map.entry(key).or_insert(0) += 1;
}

fn decrement<K: Hash + Eq>(map: &mut HashMap<K, u32>, key: K) {
    if let Entry::Occupied(mut slot) = map.entry(key) {
        *slot.get_mut() -= 1;
        if *slot.get() == 0 {
            slot.remove();
        }
    }
}

/// Whether entries are in strictly increasing key order (as `merge` returns them).
fn sorted(plan: &MergedPlan) -> bool {
    plan.service_ports.windows(2).all(|w| match w {
        [a, b] => a.key < b.key,
        _ => true,
    })
}

impl Desired {
    /// Nothing wanted, nothing known: the next sync rebuilds.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether [`Desired::update`] can move from the plan it holds to `plan` on `node`:
    /// it holds a plan, for the same node context, and `plan` is sorted by key (the held
    /// one was checked when it came).
    #[must_use]
    pub fn can_update(&self, plan: &MergedPlan, node: &NodeContext) -> bool {
        self.plan.as_ref().is_some_and(|held| {
            self.node == *node && (std::ptr::eq(held.as_ref(), plan) || sorted(plan))
        })
    }

    /// Forgets everything: the next sync rebuilds.
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// Counts everything `plan` wants from scratch and returns every virtual server. An
    /// unsorted plan is counted but not kept: the next sync starts from scratch again.
    pub fn rebuild(
        &mut self,
        plan: &Arc<MergedPlan>,
        node: NodeContext,
    ) -> BTreeMap<VirtualServerKey, VirtualServer> {
        self.clear();
        self.node = node;
        let mut servers = BTreeMap::new();
        let mut part = Contribution::default();
        for entry in &plan.service_ports {
            self.add(entry, &mut part, &mut servers, None);
        }
        if sorted(plan) {
            self.plan = Some(Arc::clone(plan));
        }
        servers
    }

    /// Moves to `plan`, entry by entry, and returns what that changes. Call only when
    /// [`Desired::can_update`] says so.
    pub fn update(&mut self, plan: &Arc<MergedPlan>) -> Delta {
        let mut delta = Delta::default();
        let Some(old) = self.plan.take() else {
            return delta;
        };
        if Arc::ptr_eq(&old, plan) {
            self.plan = Some(old);
            return delta;
        }
        let mut touched = Touched::default();
        let mut part = Contribution::default();
        let mut a = old.service_ports.iter().peekable();
        let mut b = plan.service_ports.iter().enumerate().peekable();
        loop {
            let order = match (a.peek(), b.peek()) {
                (None, None) => break,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                // The same allocation has the same key: no string comparison.
                (Some(o), Some((_, n))) if Arc::ptr_eq(o, n) => std::cmp::Ordering::Equal,
                (Some(o), Some((_, n))) => o.key.cmp(&n.key),
            };
            match order {
                std::cmp::Ordering::Less => {
                    if let Some(o) = a.next() {
                        self.remove(o, &mut part, &mut touched);
                        delta.changed.removed.push(o.key.clone());
                        delta.entries_changed += 1;
                    }
                }
                std::cmp::Ordering::Greater => {
                    if let Some((i, n)) = b.next() {
                        self.add(n, &mut part, &mut delta.servers, Some(&mut touched));
                        delta.changed.updated.push(i);
                        delta.entries_changed += 1;
                    }
                }
                std::cmp::Ordering::Equal => {
                    // The same allocation (merge_cached shares unchanged entries)
                    // is the same entry; otherwise compare.
                    if let (Some(o), Some((i, n))) = (a.next(), b.next())
                        && !Arc::ptr_eq(o, n)
                        && o != n
                    {
                        self.remove(o, &mut part, &mut touched);
                        self.add(n, &mut part, &mut delta.servers, Some(&mut touched));
                        delta.changed.updated.push(i);
                        delta.entries_changed += 1;
                    }
                }
            }
        }
        delta.gone = touched
            .servers
            .into_iter()
            .filter(|k| !self.servers.contains_key(k) && !delta.servers.contains_key(k))
            .collect();
        delta.addresses = touched.addresses;
        for (key, was) in touched.entries {
            match (was, self.entries.contains(&key)) {
                (false, true) => delta.add.push(key),
                (true, false) => delta.del.push(key),
                _ => {}
            }
        }
        delta.add.sort_unstable();
        delta.del.sort_unstable();
        self.plan = Some(Arc::clone(plan));
        delta
    }

    fn add(
        &mut self,
        entry: &ServicePortPlan,
        part: &mut Contribution,
        servers: &mut BTreeMap<VirtualServerKey, VirtualServer>,
        mut touched: Option<&mut Touched>,
    ) {
        part.clear();
        contribute(entry, &self.node, part);
        self.families[family_index(entry.family)] += 1;
        for ip in part.addresses.drain(..) {
            if let Some(touched) = touched.as_deref_mut() {
                touched.addresses.insert(ip);
            }
            increment(&mut self.addresses, ip);
        }
        for (key, server) in part.servers.drain(..) {
            increment(&mut self.servers, key);
            self.real_servers += server.real_servers.len();
            servers.insert(key, server);
        }
        for key in part.entries.drain(..) {
            if let Some(touched) = touched.as_deref_mut() {
                let held = self.entries.contains(&key);
                touched.entries.entry(key).or_insert(held);
            }
            self.entries.increment(key);
        }
    }

    fn remove(&mut self, entry: &ServicePortPlan, part: &mut Contribution, touched: &mut Touched) {
        part.clear();
        contribute(entry, &self.node, part);
        let family = &mut self.families[family_index(entry.family)];
        *family = family.saturating_sub(1);
        for ip in part.addresses.drain(..) {
            touched.addresses.insert(ip);
            decrement(&mut self.addresses, ip);
        }
        for (key, server) in part.servers.drain(..) {
            decrement(&mut self.servers, key);
            self.real_servers = self.real_servers.saturating_sub(server.real_servers.len());
            touched.servers.insert(key);
        }
        for key in part.entries.drain(..) {
            let held = self.entries.contains(&key);
            touched.entries.entry(key).or_insert(held);
            self.entries.decrement(key);
        }
    }

    /// Whether each family (`[IPv4, IPv6]`) has entries, so its sets and rules exist.
    #[must_use]
    pub fn families(&self) -> [bool; 2] {
        [self.families[0] > 0, self.families[1] > 0]
    }

    /// The sets that must exist.
    pub fn set_ids(&self) -> impl Iterator<Item = SetId> + '_ {
        [false, true]
            .into_iter()
            .zip(self.families())
            .filter(|(_, used)| *used)
            .flat_map(|(ipv6, _)| SetId::of_family(ipv6))
    }

    /// Every wanted set with its entries.
    #[must_use]
    pub fn sets(&self) -> Sets {
        let mut by_id: BTreeMap<SetId, IpSet> = self
            .set_ids()
            .map(|id| {
                let spec = id.spec();
                (id, IpSet::new(spec.kind, spec.ipv6))
            })
            .collect();
        for (id, entry) in self.entries.keys() {
            if let Some(set) = by_id.get_mut(&id) {
                set.entries.insert(entry);
            }
        }
        by_id
            .into_iter()
            .map(|(id, set)| (id.name(), set))
            .collect()
    }

    /// Whether `sets` (as read from the kernel) hold exactly what is wanted: the wanted
    /// sets with their types, each holding only wanted entries, as many as are wanted.
    #[must_use]
    pub fn holds_exactly(&self, sets: &Sets) -> bool {
        let wanted: BTreeMap<String, SetId> = self.set_ids().map(|id| (id.name(), id)).collect();
        if sets.len() != wanted.len() {
            return false;
        }
        let mut held = 0;
        for (name, set) in sets {
            let Some(id) = wanted.get(name) else {
                return false;
            };
            if set.spec != id.spec()
                || !set
                    .entries
                    .iter()
                    .all(|e| self.entries.contains(&(*id, *e)))
            {
                return false;
            }
            held += set.entries.len();
        }
        held == self.entries.len()
    }

    /// The names of the sets that must exist.
    #[must_use]
    pub fn set_names(&self) -> HashMap<SetId, String> {
        self.set_ids().map(|id| (id, id.name())).collect()
    }

    /// The set changes that bring `held` to what is wanted, straight from the counts (no
    /// copy of the wanted sets), except additions ([`Desired::additions`]): creates
    /// first, then deletions, and destroys of sets nothing wants. Sets of the wrong type
    /// are listed as mismatched.
    #[must_use]
    pub fn set_changes(&self, held: &HeldSets) -> SetChanges {
        let mut out = SetChanges::default();
        let wanted: BTreeMap<SetId, String> = self.set_ids().map(|id| (id, id.name())).collect();
        match held {
            HeldSets::Read(kernel) => {
                for (id, name) in &wanted {
                    match kernel.get(name) {
                        Some(set) if set.spec != id.spec() => out.mismatched.push(name.clone()),
                        Some(_) => {}
                        None => out.create(name, id.spec()),
                    }
                }
                for (id, name) in &wanted {
                    let Some(set) = kernel.get(name).filter(|set| set.spec == id.spec()) else {
                        continue;
                    };
                    for entry in &set.entries {
                        if !self.entries.contains(&(*id, *entry)) {
                            out.del(name, entry);
                        }
                    }
                }
                let names: BTreeSet<&String> = wanted.values().collect();
                for name in kernel.keys().filter(|n| !names.contains(n)) {
                    out.destroy(name);
                }
            }
            HeldSets::Counted(old) => {
                let had: BTreeSet<SetId> = old.set_ids().collect();
                for (id, name) in &wanted {
                    if !had.contains(id) {
                        out.create(name, id.spec());
                    }
                }
                for (id, entry) in old.entries.keys() {
                    if let Some(name) = wanted.get(&id)
                        && !self.entries.contains(&(id, entry))
                    {
                        out.del(name, &entry);
                    }
                }
                for id in had.iter().filter(|id| !wanted.contains_key(id)) {
                    out.destroy(&id.name());
                }
            }
        }
        out
    }

    /// The wanted entries `held` lacks, in no particular order, as additions to the sets
    /// named in `names` ([`Desired::set_names`]). Produced while they are sent, so a first
    /// apply's 150,000 additions never sit in a list.
    pub fn additions<'a>(
        &'a self,
        held: &'a HeldSets,
        names: &'a HashMap<SetId, String>,
    ) -> impl Iterator<Item = SetOp<'a>> + 'a {
        self.entries.keys().filter_map(move |(id, entry)| {
            let name = names.get(&id)?;
            (!held.holds(id, name, &entry)).then_some(SetOp::Add(name, entry))
        })
    }

    /// Whether some entry wants `ip` on the dummy interface.
    #[must_use]
    pub fn wants_address(&self, ip: &IpAddr) -> bool {
        self.addresses.contains_key(ip)
    }

    /// Every wanted VIP.
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.addresses.keys().copied()
    }

    /// Wanted virtual servers.
    #[must_use]
    pub fn server_count(&self) -> usize {
        self.servers.len()
    }

    /// Real servers over all wanted virtual servers.
    #[must_use]
    pub fn real_server_count(&self) -> usize {
        self.real_servers
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::kernel::ipset::{SetSpec, SetType};

    fn entry(key: &str, cluster_ip: &str, endpoints: &[(&str, u16)]) -> ServicePortPlan {
        let text = format!(
            r#"{{"key":"{key}","namespace":"demo","name":"{key}","portName":"http","family":"IPv4",
            "protocol":"TCP","port":80,"clusterIP":"{cluster_ip}","internal":{{"policy":"Cluster","whenEmpty":"Reject"}},
            "clusterEndpoints":[{}],"masquerade":{{"all":false,"offClusterToClusterIP":true,"external":false,
            "localHostToExternal":false,"hairpin":true}}}}"#,
            endpoints
                .iter()
                .map(|(ip, port)| format!(r#"{{"ip":"{ip}","port":{port}}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        serde_json::from_str(&text).unwrap()
    }

    fn sorted_script(
        changes: &SetChanges,
        list: &[super::super::set_changes::SetChange],
    ) -> Vec<String> {
        let mut lines: Vec<String> = changes.script(list).lines().map(str::to_owned).collect();
        lines.sort();
        lines
    }

    /// [`Desired::set_changes`] with [`Desired::additions`] folded in.
    fn with_additions(desired: &Desired, held: &HeldSets) -> SetChanges {
        let mut changes = desired.set_changes(held);
        let names = desired.set_names();
        for op in desired.additions(held, &names) {
            if let SetOp::Add(name, entry) = op {
                changes.add(name, &entry);
            }
        }
        changes
    }

    #[test]
    fn set_changes_from_the_counts_match_a_full_comparison() {
        let plan = Arc::new(MergedPlan {
            node_name: "n".into(),
            revision: "r".into(),
            services_fingerprint: 0,
            refused: Vec::new(),
            unmatched: Vec::new(),
            addresses: vec!["10.10.0.1".parse().unwrap()],
            local_traffic: serde_json::from_str(
                r#"{"mode":"ClusterCIDR","cidrs":["10.244.0.0/16"]}"#,
            )
            .unwrap(),
            service_ports: vec![
                Arc::new(entry(
                    "a",
                    "10.96.0.1",
                    &[("10.244.1.1", 80), ("10.244.1.2", 80)],
                )),
                Arc::new(entry("b", "10.96.0.2", &[("10.244.1.1", 80)])),
            ],
            service_cidrs: Vec::new(),
        });
        let mut desired = Desired::new();
        desired.rebuild(&plan, NodeContext::default());
        let mut kernel = desired.sets();
        let loop_back = SetId {
            ipv6: false,
            role: Role::LoopBack,
        }
        .name();
        let cluster_ip = SetId {
            ipv6: false,
            role: Role::ClusterIp,
        }
        .name();
        // One entry missing, one too many, a set of the wrong type, a stale owned set.
        let set = kernel.get_mut(&loop_back).unwrap();
        let first = *set.entries.iter().next().unwrap();
        set.entries.remove(&first);
        kernel
            .get_mut(&cluster_ip)
            .unwrap()
            .entries
            .insert(SetEntry::IpPort("10.96.9.9".parse().unwrap(), 6, 80));
        kernel.insert(
            SetId {
                ipv6: false,
                role: Role::Drop,
            }
            .name(),
            IpSet::new(SetType::HashIp, false),
        );
        kernel.insert(
            "PROXYPLAN-OLD".into(),
            IpSet {
                spec: SetSpec {
                    kind: SetType::HashIp,
                    ipv6: false,
                },
                entries: BTreeSet::new(),
            },
        );
        let fast = with_additions(&desired, &HeldSets::Read(kernel.clone()));
        let full = SetChanges::between(&desired.sets(), &kernel);
        assert_eq!(
            sorted_script(&fast, &fast.before),
            sorted_script(&full, &full.before)
        );
        assert_eq!(
            sorted_script(&fast, &fast.after),
            sorted_script(&full, &full.after)
        );
        assert_eq!(fast.mismatched, full.mismatched);
        assert_eq!(fast.changed(), 3, "{:?}", fast.script(&fast.before));
        assert!(with_additions(&desired, &HeldSets::Read(desired.sets())).is_empty());

        // From the previous counts: b goes, a loses an endpoint, c comes.
        let next = Arc::new(MergedPlan {
            service_ports: vec![
                Arc::new(entry("a", "10.96.0.1", &[("10.244.1.1", 80)])),
                Arc::new(entry("c", "10.96.0.3", &[("10.244.1.3", 80)])),
            ],
            ..(*plan).clone()
        });
        let mut now = Desired::new();
        now.rebuild(&next, NodeContext::default());
        let fast = with_additions(&now, &HeldSets::Counted(Box::new(desired)));
        let full = SetChanges::between(&now.sets(), &{
            let mut old = Desired::new();
            old.rebuild(&plan, NodeContext::default());
            old.sets()
        });
        assert_eq!(
            sorted_script(&fast, &fast.before),
            sorted_script(&full, &full.before)
        );
        assert!(fast.after.is_empty() && full.after.is_empty());
        assert!(fast.changed() >= 3, "{:?}", fast.script(&fast.before));
    }
}
