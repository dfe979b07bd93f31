//! Stale UDP conntrack entries (DESIGN §3, kube-proxy's semantics): which entries a sync
//! makes stale, for any mode. Listing and deleting them is [`crate::kernel::conntrack`]'s.
//!
//! UDP has no connection to close, so a conntrack entry outlives the rules that created
//! it: a client that kept sending to a service address while it had no endpoint holds an
//! entry that was never DNATed, and one whose endpoint went away keeps being sent there.
//! After each sync the agent compares the UDP paths of the previous and the new plan,
//! where the endpoints of a destination are the service port's *serving* endpoints, not
//! the ones this node programs (as kube-proxy's `conntrack/cleanup.go`: a ready →
//! terminating transition, a topology-hint change or a Local-list change does not cut a
//! live UDP flow):
//!
//! - a destination (cluster IP, external IP or load-balancer IP with the service port, or
//!   a node port) that had no serving endpoint and now has some: delete every entry to it;
//! - an endpoint that no longer serves a destination: delete the entries to that
//!   destination whose reply comes from the endpoint.
//!
//! With no previous plan (the agent just started) nothing is known about the past, so the
//! conntrack table is listed once and exactly the entries that contradict the plan are
//! deleted: those to a served destination whose reply source is not one of its endpoints.
//! Entries of unchanged services stay, so a restart does not disturb their flows.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use proxyplan_crds::{LoadBalancerIpMode, MergedPlan, Protocol, ServicePortPlan};

use crate::kernel::command::Runner;
use crate::kernel::conntrack::{Backend, CONNTRACK, Destination, Flow, StaleFlows};
use crate::kernel::error::DataplaneError;
use crate::kernel::family::Family;

/// The UDP destinations a plan serves and the endpoints traffic to each may be DNATed to,
/// and which entries serve each destination: [`UdpPaths::update`] then follows a sync's
/// changed entries without going over the whole plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UdpPaths {
    paths: BTreeMap<Destination, Served>,
    /// The destinations of each UDP entry key.
    keys: HashMap<Box<str>, Vec<Destination>>,
}

/// A destination: how many entry keys serve it, and the endpoints behind it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Served {
    keys: u32,
    backends: BTreeSet<Backend>,
}

/// Entries of one key that changed, came or went in a sync: their new versions (none
/// when the key is gone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryChange<'p> {
    /// The entries' key.
    pub key: std::borrow::Cow<'p, str>,
    /// The entries with that key now.
    pub entries: Vec<&'p ServicePortPlan>,
}

/// The destinations one UDP entry serves and the endpoints whose flows to each stay:
/// every serving endpoint of the service port, whatever this node programs (kube-proxy's
/// `conntrack/cleanup.go`: traffic policy, topology and terminating state do not cut
/// live UDP flows; only an endpoint that stops serving does).
fn entry_paths(entry: &ServicePortPlan, out: &mut BTreeMap<Destination, BTreeSet<Backend>>) {
    if entry.protocol != Protocol::UDP {
        return;
    }
    let serving: BTreeSet<Backend> = entry
        .cluster_endpoints
        .iter()
        .chain(&entry.local_endpoints)
        .chain(&entry.also_serving)
        .filter_map(|e| Some((e.ip.parse().ok()?, e.port)))
        .collect();
    let address = |ip: &str| {
        ip.parse().ok().map(|ip| Destination::Address {
            ip,
            port: entry.port,
        })
    };
    let family = if entry.cluster_ip.contains(':') {
        Family::V6
    } else {
        Family::V4
    };
    let external = entry.external.is_some();
    let vips = entry
        .external_ips
        .iter()
        .map(String::as_str)
        .chain(
            entry
                .load_balancer_ips
                .iter()
                .filter(|lb| lb.mode == LoadBalancerIpMode::VIP)
                .map(|lb| lb.ip.as_str()),
        )
        .filter(|_| external);
    let node_port = entry
        .node_port
        .filter(|_| external)
        .map(|port| Destination::NodePort { family, port });
    let dests = std::iter::once(entry.cluster_ip.as_str())
        .chain(vips)
        .filter_map(address)
        .chain(node_port);
    for dest in dests {
        out.entry(dest).or_default().extend(serving.iter().copied());
    }
}

impl UdpPaths {
    /// The UDP paths of `plan`.
    #[must_use]
    pub fn from_plan(plan: &MergedPlan) -> Self {
        let mut by_key: BTreeMap<&str, BTreeMap<Destination, BTreeSet<Backend>>> = BTreeMap::new();
        for entry in &plan.service_ports {
            if entry.protocol == Protocol::UDP {
                entry_paths(entry, by_key.entry(entry.key.as_str()).or_default());
            }
        }
        let mut out = Self::default();
        for (key, paths) in by_key {
            let mut dests = Vec::with_capacity(paths.len());
            for (dest, backends) in paths {
                let served = out.paths.entry(dest).or_default();
                served.keys += 1;
                served.backends.extend(backends);
                dests.push(dest);
            }
            out.keys.insert(key.into(), dests);
        }
        out
    }

    /// Whether the plan has a UDP destination of `family`.
    #[must_use]
    pub fn has_family(&self, family: Family) -> bool {
        self.paths.keys().any(|d| d.family() == family)
    }

    fn backends(&self, dest: &Destination) -> Option<&BTreeSet<Backend>> {
        self.paths
            .get(dest)
            .map(|s| &s.backends)
            .filter(|b| !b.is_empty())
    }

    /// The entries made stale by `changes` (what [`stale_flows`] finds between these paths
    /// and the plan's), and, with `apply`, the paths brought to the plan. Only the
    /// destinations of changed entries are looked at. `None` when a destination involved
    /// is served by another entry key too (a plan sharing an address and port between
    /// services): then nothing was changed and the caller compares whole plans.
    pub fn update(&mut self, changes: &[EntryChange<'_>], apply: bool) -> Option<Vec<StaleFlows>> {
        // Before and after, for every destination a changed entry served or serves.
        let mut affected: BTreeMap<Destination, (Option<Served>, Served)> = BTreeMap::new();
        for change in changes {
            for dest in self.keys.get(change.key.as_ref()).into_iter().flatten() {
                let before = self.paths.get(dest).cloned();
                let (_, after) = affected
                    .entry(*dest)
                    .or_insert_with(|| (before.clone(), before.unwrap_or_default()));
                if after.keys != 1 {
                    return None;
                }
                *after = Served::default();
            }
        }
        let mut new_keys: Vec<(&str, Vec<Destination>)> = Vec::with_capacity(changes.len());
        for change in changes {
            let mut paths = BTreeMap::new();
            for entry in &change.entries {
                entry_paths(entry, &mut paths);
            }
            let mut dests = Vec::with_capacity(paths.len());
            for (dest, backends) in paths {
                let before = self.paths.get(&dest).cloned();
                let (_, after) = affected
                    .entry(dest)
                    .or_insert_with(|| (before.clone(), before.unwrap_or_default()));
                if after.keys != 0 {
                    return None;
                }
                after.keys = 1;
                after.backends = backends;
                dests.push(dest);
            }
            new_keys.push((change.key.as_ref(), dests));
        }
        let mut out = BTreeSet::new();
        let empty = BTreeSet::new();
        for (dest, (before, after)) in &affected {
            let before = before.as_ref().map_or(&empty, |s| &s.backends);
            if !after.backends.is_empty() && before.is_empty() {
                out.insert(StaleFlows::To(*dest));
            }
            for backend in before {
                if !after.backends.contains(backend) {
                    out.insert(StaleFlows::Via(*dest, *backend));
                }
            }
        }
        if apply {
            for (dest, (_, after)) in affected {
                if after.keys == 0 {
                    self.paths.remove(&dest);
                } else {
                    self.paths.insert(dest, after);
                }
            }
            for (key, dests) in new_keys {
                if dests.is_empty() {
                    self.keys.remove(key);
                } else {
                    self.keys.insert(key.into(), dests);
                }
            }
        }
        Some(out.into_iter().collect())
    }
}

/// With it non-zero, conntrack tracks TCP liberally (out-of-window packets are not
/// invalid).
const BE_LIBERAL: &str = "net/netfilter/nf_conntrack_tcp_be_liberal";

/// Whether `nf_conntrack_tcp_be_liberal` is set where `runner` works. As kube-proxy's
/// iptables mode, the modes then leave out their DROP of invalid packets, and say so.
#[must_use]
pub fn tcp_be_liberal(runner: &impl Runner) -> bool {
    let liberal = runner
        .read_sysctl(BE_LIBERAL)
        .ok()
        .flatten()
        .is_some_and(|v| v.trim() != "0");
    if liberal {
        tracing::info!(
            "nf_conntrack_tcp_be_liberal set, not installing DROP rules for INVALID packets"
        );
    }
    liberal
}

/// The entries made stale by moving from `previous` to `next`, deduplicated.
#[must_use]
pub fn stale_flows(previous: &UdpPaths, next: &UdpPaths) -> Vec<StaleFlows> {
    let mut out = BTreeSet::new();
    for dest in next.paths.keys() {
        if next.backends(dest).is_some() && previous.backends(dest).is_none() {
            out.insert(StaleFlows::To(*dest));
        }
    }
    for (dest, served) in &previous.paths {
        let now = next.paths.get(dest).map(|s| &s.backends);
        for backend in &served.backends {
            if !now.is_some_and(|b| b.contains(backend)) {
                out.insert(StaleFlows::Via(*dest, *backend));
            }
        }
    }
    out.into_iter().collect()
}

/// The conntrack step both modes run after a sync: it keeps the UDP paths the kernel
/// was last brought to and deletes the entries each sync makes stale.
#[derive(Debug, Clone, Default)]
pub struct UdpTracker {
    paths: Option<UdpPaths>,
}

pub use crate::kernel::conntrack::ConntrackRun;

impl UdpTracker {
    /// Forgets the paths: the next sync lists the conntrack table.
    pub fn reset(&mut self) {
        self.paths = None;
    }

    /// Whether [`UdpTracker::clear`] looks at the changed entries it is given: not before
    /// the first sync (it lists the table then), so a mode need not collect them.
    #[must_use]
    pub fn follows_changes(&self) -> bool {
        self.paths.is_some()
    }

    /// Deletes the UDP conntrack entries made stale by the move to `plan`, writing each
    /// `conntrack` command to `payload`; returns how many were deleted, by family, and how
    /// long it took (nothing is deleted in a dry run). `changes` are the
    /// entries that changed since the last sync, or `None` to compare whole plans. On
    /// the first sync the table is listed instead. A dry run only writes the commands.
    ///
    /// # Errors
    /// When `conntrack` cannot list or delete; the paths stay as they were, to try again.
    pub fn clear(
        &mut self,
        runner: &dyn Runner,
        plan: &MergedPlan,
        changes: Option<&[EntryChange<'_>]>,
        dry_run: bool,
        payload: &mut dyn FnMut(&str),
    ) -> Result<ConntrackRun, DataplaneError> {
        let started = std::time::Instant::now();
        let mut run = ConntrackRun::default();
        let mut next = None;
        let incremental = match (&mut self.paths, changes) {
            (Some(previous), Some(changes)) => previous.update(changes, false),
            _ => None,
        };
        let flows: Vec<StaleFlows> = match (incremental, &self.paths) {
            (Some(flows), _) => flows,
            // No changed entries to follow, or a destination shared between entries.
            (None, Some(previous)) => {
                let paths = UdpPaths::from_plan(plan);
                let flows = stale_flows(previous, &paths);
                next = Some(paths);
                flows
            }
            (None, None) if dry_run => Vec::new(),
            (None, None) => {
                let paths = UdpPaths::from_plan(plan);
                let mut flows = Vec::new();
                for family in [Family::V4, Family::V6] {
                    if paths.has_family(family) {
                        let listed = runner.conntrack_list_udp(family)?;
                        flows.extend(stale_in_table(&listed, &paths, &plan.addresses));
                    }
                }
                next = Some(paths);
                flows
            }
        };
        for flow in &flows {
            payload(&format!(
                "# {CONNTRACK} {}\n",
                flow.conntrack_args().join(" ")
            ));
            if !dry_run {
                run.deleted[usize::from(flow.family() == Family::V6)] +=
                    runner.conntrack_delete(flow)?;
            }
        }
        run.elapsed = started.elapsed();
        // Only once deleted: a failure leaves the paths as they were, to try again.
        if !dry_run {
            match (next, &mut self.paths, changes) {
                (Some(paths), _, _) => self.paths = Some(paths),
                (None, Some(paths), Some(changes)) => {
                    paths.update(changes, true);
                }
                _ => {}
            }
        }
        Ok(run)
    }
}

/// The listed entries that contradict `paths`: addressed to a served destination (a node
/// port counts when addressed to one of `node_addresses`) and answered by something that
/// is not one of its endpoints.
#[must_use]
pub fn stale_in_table(
    flows: &[Flow],
    paths: &UdpPaths,
    node_addresses: &[IpAddr],
) -> Vec<StaleFlows> {
    flows
        .iter()
        .filter(|flow| {
            let address = Destination::Address {
                ip: flow.orig_dst,
                port: flow.dport,
            };
            let node_port = Destination::NodePort {
                family: Family::of(flow.orig_dst),
                port: flow.dport,
            };
            let backends = paths.backends(&address).or_else(|| {
                node_addresses
                    .contains(&flow.orig_dst)
                    .then(|| paths.backends(&node_port))
                    .flatten()
            });
            backends.is_some_and(|b| !b.contains(&(flow.reply_src, flow.reply_sport)))
        })
        .map(|flow| StaleFlows::Exact(*flow))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::conntrack::parse_listing;
    use proxyplan_crds::{
        EmptyAction, Endpoint, IpFamily, LocalTrafficDetection, LocalTrafficMode, MasqueradePlan,
        ServicePortPlan, TrafficPlan, TrafficPolicy,
    };

    fn ep(text: &str) -> Endpoint {
        let (ip, port) = text.rsplit_once(':').unwrap();
        Endpoint {
            ip: ip.trim_matches(['[', ']']).into(),
            port: port.parse().unwrap(),
        }
    }

    fn udp(cluster_ip: &str, endpoints: &[&str]) -> ServicePortPlan {
        let cluster = TrafficPlan {
            policy: TrafficPolicy::Cluster,
            when_empty: EmptyAction::Reject,
        };
        ServicePortPlan {
            key: format!("ns/{cluster_ip}:dns/UDP/IPv4"),
            namespace: "ns".into(),
            name: cluster_ip.into(),
            port_name: "dns".into(),
            family: if cluster_ip.contains(':') {
                IpFamily::IPv6
            } else {
                IpFamily::IPv4
            },
            protocol: Protocol::UDP,
            port: 53,
            cluster_ip: cluster_ip.into(),
            external_ips: vec![],
            load_balancer_ips: vec![],
            node_port: None,
            load_balancer_source_ranges: vec![],
            health_check_node_port: None,
            session_affinity: None,
            internal: cluster,
            external: None,
            cluster_endpoints: endpoints.iter().map(|e| ep(e)).collect(),
            zone_endpoints: Vec::new(),
            local_endpoints: vec![],
            masquerade: MasqueradePlan {
                all: false,
                off_cluster_to_cluster_ip: false,
                external: false,
                local_host_to_external: false,
                hairpin: false,
            },
            local_terminating: false,
            also_serving: Vec::new(),
        }
    }

    fn plan(entries: Vec<ServicePortPlan>) -> UdpPaths {
        UdpPaths::from_plan(&MergedPlan {
            node_name: "n".into(),
            revision: "r".into(),
            services_fingerprint: 0,
            refused: Vec::new(),
            unmatched: Vec::new(),
            addresses: vec![],
            local_traffic: LocalTrafficDetection {
                mode: LocalTrafficMode::ClusterCIDR,
                cidrs: vec![],
                interface: None,
            },
            service_cidrs: Vec::new(),
            service_ports: entries.into_iter().map(std::sync::Arc::new).collect(),
        })
    }

    fn args(flows: &[StaleFlows]) -> Vec<String> {
        flows.iter().map(|f| f.conntrack_args().join(" ")).collect()
    }

    #[test]
    fn newly_served_destinations_lose_every_entry() {
        let before = plan(vec![udp("10.96.0.10", &[])]);
        let after = plan(vec![
            udp("10.96.0.10", &["10.244.1.5:5353"]),
            udp("10.96.0.11", &["10.244.1.6:53"]),
        ]);
        assert_eq!(
            args(&stale_flows(&before, &after)),
            [
                "-D -p udp -f ipv4 --orig-dst 10.96.0.10 --dport 53",
                "-D -p udp -f ipv4 --orig-dst 10.96.0.11 --dport 53",
            ]
        );
        assert!(stale_flows(&after, &after).is_empty());
    }

    #[test]
    fn removed_endpoints_lose_their_entries_everywhere() {
        let mut svc = udp("10.96.0.10", &["10.244.1.5:5353", "10.244.1.6:5353"]);
        svc.external = Some(TrafficPlan {
            policy: TrafficPolicy::Cluster,
            when_empty: EmptyAction::Reject,
        });
        svc.node_port = Some(30053);
        svc.external_ips = vec!["192.0.2.1".into()];
        let before = plan(vec![svc.clone()]);
        svc.cluster_endpoints.remove(0);
        let after = plan(vec![svc]);
        assert_eq!(
            args(&stale_flows(&before, &after)),
            [
                "-D -p udp -f ipv4 --orig-dst 10.96.0.10 --dport 53 --reply-src 10.244.1.5 --reply-port-src 5353",
                "-D -p udp -f ipv4 --orig-dst 192.0.2.1 --dport 53 --reply-src 10.244.1.5 --reply-port-src 5353",
                "-D -p udp -f ipv4 --dport 30053 --reply-src 10.244.1.5 --reply-port-src 5353",
            ]
        );
        // A removed service: all of its endpoints are gone.
        assert_eq!(stale_flows(&after, &plan(vec![])).len(), 3);
    }

    #[test]
    fn flows_stay_while_their_endpoint_serves_whatever_this_node_programs() {
        // kube-proxy's `conntrack/cleanup.go`: only an endpoint that stops serving loses
        // its flows; policy, topology and terminating state do not cut them.
        let mut svc = udp("10.96.0.10", &["10.244.1.5:5353", "10.244.1.6:5353"]);
        svc.external = Some(TrafficPlan {
            policy: TrafficPolicy::Local,
            when_empty: EmptyAction::Drop,
        });
        svc.node_port = Some(30053);
        let before = plan(vec![svc.clone()]);
        // 10.244.1.5 starts terminating: no longer listed, still serving.
        svc.cluster_endpoints.remove(0);
        svc.also_serving = vec![ep("10.244.1.5:5353")];
        let terminating = plan(vec![svc.clone()]);
        assert!(stale_flows(&before, &terminating).is_empty());
        // A Local-list change on this node changes nothing either.
        svc.local_endpoints = vec![ep("10.244.1.6:5353")];
        assert!(stale_flows(&terminating, &plan(vec![svc.clone()])).is_empty());
        // It stops serving: its flows go, to every destination of the port.
        svc.also_serving.clear();
        assert_eq!(
            args(&stale_flows(&terminating, &plan(vec![svc]))),
            [
                "-D -p udp -f ipv4 --orig-dst 10.96.0.10 --dport 53 --reply-src 10.244.1.5 --reply-port-src 5353",
                "-D -p udp -f ipv4 --dport 30053 --reply-src 10.244.1.5 --reply-port-src 5353",
            ]
        );
    }

    fn merged(entries: &[ServicePortPlan]) -> MergedPlan {
        MergedPlan {
            node_name: "n".into(),
            revision: "r".into(),
            services_fingerprint: 0,
            refused: Vec::new(),
            unmatched: Vec::new(),
            addresses: vec![],
            local_traffic: LocalTrafficDetection {
                mode: LocalTrafficMode::ClusterCIDR,
                cidrs: vec![],
                interface: None,
            },
            service_ports: entries.iter().cloned().map(std::sync::Arc::new).collect(),
            service_cidrs: Vec::new(),
        }
    }

    /// Moves from `before` to `after` with [`UdpPaths::update`], told about the keys
    /// that differ; checks it against comparing whole plans.
    fn step(paths: &mut UdpPaths, before: &[ServicePortPlan], after: &[ServicePortPlan]) {
        let keys: BTreeSet<&str> = before
            .iter()
            .chain(after)
            .map(|e| e.key.as_str())
            .filter(|k| {
                let of = |list: &[ServicePortPlan]| -> Vec<ServicePortPlan> {
                    list.iter().filter(|e| e.key == *k).cloned().collect()
                };
                of(before) != of(after)
            })
            .collect();
        let changes: Vec<EntryChange<'_>> = keys
            .iter()
            .map(|k| EntryChange {
                key: (*k).into(),
                entries: after.iter().filter(|e| e.key == *k).collect(),
            })
            .collect();
        let full = stale_flows(paths, &UdpPaths::from_plan(&merged(after)));
        let untouched = paths.clone();
        assert_eq!(paths.update(&changes, false).as_ref(), Some(&full));
        assert_eq!(*paths, untouched, "a dry update changes nothing");
        assert_eq!(paths.update(&changes, true), Some(full));
        assert_eq!(*paths, UdpPaths::from_plan(&merged(after)));
    }

    #[test]
    fn updates_follow_changed_entries_like_whole_plans() {
        let mut a = udp("10.96.0.10", &["10.244.1.5:5353", "10.244.1.6:5353"]);
        let b = udp("10.96.0.11", &[]);
        let mut plans = vec![vec![], vec![a.clone()], vec![a.clone(), b.clone()]];
        a.cluster_endpoints.remove(0);
        a.node_port = Some(30053);
        a.external = Some(a.internal);
        plans.push(vec![a.clone(), b.clone()]);
        let mut b2 = b.clone();
        b2.cluster_endpoints.push(ep("10.244.2.1:53"));
        let mut tcp = udp("10.96.0.12", &["10.244.1.7:80"]);
        tcp.protocol = Protocol::TCP;
        plans.push(vec![a.clone(), b2, tcp]);
        plans.push(vec![b.clone()]);
        plans.push(vec![]);
        let mut paths = UdpPaths::default();
        let mut before: Vec<ServicePortPlan> = vec![];
        for after in plans {
            step(&mut paths, &before, &after);
            before = after;
        }

        // Two services on one address and port: whole plans decide.
        let mut twin = a.clone();
        twin.key = "ns/twin:dns/UDP/IPv4".into();
        let shared = vec![a.clone(), twin.clone()];
        let mut paths = UdpPaths::from_plan(&merged(&shared));
        twin.cluster_endpoints.clear();
        let change = EntryChange {
            key: twin.key.as_str().into(),
            entries: vec![&twin],
        };
        assert_eq!(paths.update(&[change], true), None);
        assert_eq!(paths, UdpPaths::from_plan(&merged(&shared)));
    }

    #[test]
    fn tcp_is_ignored_and_ipv6_is_spelled_for_conntrack() {
        let mut tcp = udp("10.96.0.12", &["10.244.1.7:80"]);
        tcp.protocol = Protocol::TCP;
        let v6 = udp("fd00::a", &["[fd00:1::5]:53"]);
        let flows = stale_flows(&plan(vec![]), &plan(vec![tcp, v6]));
        assert_eq!(
            args(&flows),
            ["-D -p udp -f ipv6 --orig-dst fd00::a --dport 53"]
        );
    }

    #[test]
    fn a_listing_yields_the_entries_that_contradict_the_plan() {
        let listing = "\
udp      17 29 src=10.0.0.1 dst=10.96.0.10 sport=5000 dport=53 [UNREPLIED] src=10.96.0.10 dst=10.0.0.1 sport=53 dport=5000 mark=0 use=1
udp      17 29 src=10.0.0.2 dst=10.96.0.10 sport=5000 dport=53 src=10.244.1.5 dst=10.0.0.2 sport=5353 dport=5000 [ASSURED] mark=0 use=1
udp      17 29 src=10.0.0.3 dst=10.96.0.99 sport=5000 dport=53 src=10.96.0.99 dst=10.0.0.3 sport=53 dport=5000 mark=0 use=1
conntrack v1.4.7 (conntrack-tools): 3 flow entries have been shown.
";
        let flows = parse_listing(listing);
        assert_eq!(flows.len(), 3);
        let paths = plan(vec![udp("10.96.0.10", &["10.244.1.5:5353"])]);
        assert_eq!(
            args(&stale_in_table(&flows, &paths, &[])),
            ["-D -p udp -f ipv4 --orig-src 10.0.0.1 --orig-dst 10.96.0.10 --sport 5000 --dport 53"]
        );
    }
}
