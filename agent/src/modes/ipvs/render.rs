//! Merged plan in, desired ipvs-mode kernel state out. Pure: no I/O, no policy.
//!
//! ```text
//! dummy interface      every VIP the node accepts: cluster IPs, external IPs, LB IPs (not ipMode Proxy)
//! IPVS                 one virtual server per VIP/port/protocol and per node-port address;
//!                      real servers = the plan's endpoints for that direction of traffic
//! ipsets               which VIPs and ports masquerade, drop, or pass source ranges
//! iptables (fixed)     a handful of rules that match those sets, in the agent's own chains
//! ```
//!
//! A virtual server without real servers makes IPVS answer ICMP port unreachable, which is
//! the plan's `Reject`; `Drop` puts the address in a DROP set instead.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use proxyplan_crds::{
    EmptyAction, Endpoint, IpFamily, LoadBalancerIpMode, MergedPlan, Protocol, ServicePortPlan,
};

use super::rules::{self, rules};
use super::sets::{Role, SetId};
use super::settings::IpvsSettings;
use crate::kernel::ipset::{IpSet, SetEntry, Sets};
use crate::kernel::ipvs::{protocol_name, socket_text};
use crate::ruleset::rules::Ruleset;

/// A virtual server's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VirtualServerKey {
    /// `IPPROTO_*`.
    pub protocol: u16,
    /// The VIP or node address.
    pub addr: IpAddr,
    /// The port.
    pub port: u16,
}

impl std::fmt::Display for VirtualServerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}",
            protocol_name(self.protocol),
            socket_text(self.addr, self.port)
        )
    }
}

/// A real server: address and port.
pub type RealServer = (IpAddr, u16);

/// What one virtual server should be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VirtualServer {
    /// ClientIP affinity: the persistence timeout in seconds.
    pub persistence: Option<u32>,
    /// Its real servers, sorted, each with weight 1.
    pub real_servers: Vec<RealServer>,
}

/// The whole desired ipvs-mode state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsState {
    /// Addresses for the dummy interface.
    pub addresses: BTreeSet<IpAddr>,
    /// Virtual servers.
    pub services: BTreeMap<VirtualServerKey, VirtualServer>,
    /// ipsets.
    pub sets: Sets,
    /// The fixed iptables rules.
    pub rules: Ruleset,
}

impl IpvsState {
    /// Real servers over all virtual servers.
    #[must_use]
    pub fn real_server_count(&self) -> usize {
        self.services.values().map(|v| v.real_servers.len()).sum()
    }
}

/// The IPVS protocol number of a plan protocol.
#[must_use]
pub fn ipproto(p: Protocol) -> u16 {
    u16::from(p.number())
}

/// The `IPPROTO_*` number of a plan protocol, as set entries hold it.
fn proto_number(p: Protocol) -> u8 {
    p.number()
}

/// What the node itself adds to every entry: its node-port addresses, its local
/// addresses (a VIP that is one of them is not put on the dummy interface, so new
/// connections to it are not filtered) and the plan's node addresses (for load-balancer
/// source ranges that cover the node).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeContext {
    /// Addresses that accept node ports ([`IpvsSettings::nodeport_addresses`]).
    pub nodeport_addresses: Vec<IpAddr>,
    /// The node's addresses on interfaces other than the dummy one, sorted.
    pub local_addresses: Vec<IpAddr>,
    /// The node's addresses from the plan.
    pub node_addresses: Vec<IpAddr>,
}

impl NodeContext {
    /// Whether `ip` is one of the node's own addresses (not a VIP of the dummy interface).
    #[must_use]
    pub fn is_local(&self, ip: IpAddr) -> bool {
        self.local_addresses.binary_search(&ip).is_ok()
    }
}

/// What one plan entry puts into the kernel. Several entries may want the same address
/// (the ports of one Service) or set entry (a hairpin entry of endpoints shared by two
/// Services); the aggregate counts them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Contribution {
    /// VIPs for the dummy interface.
    pub addresses: Vec<IpAddr>,
    /// Virtual servers.
    pub servers: Vec<(VirtualServerKey, VirtualServer)>,
    /// Set entries.
    pub entries: Vec<(SetId, SetEntry)>,
}

impl Contribution {
    /// Empties it, keeping its allocations.
    pub fn clear(&mut self) {
        self.addresses.clear();
        self.servers.clear();
        self.entries.clear();
    }
}

fn real_servers(endpoints: &[Endpoint]) -> Vec<RealServer> {
    let mut out: Vec<RealServer> = endpoints
        .iter()
        .filter_map(|e| Some((e.ip.parse().ok()?, e.port)))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Adds what entry `e` puts into the kernel to `out`. Pure.
pub fn contribute(e: &ServicePortPlan, node: &NodeContext, out: &mut Contribution) {
    let ipv6 = e.family == IpFamily::IPv6;
    let p = proto_number(e.protocol);
    let entries = &mut out.entries;
    let mut add = |role: Role, entry: SetEntry| entries.push((SetId { ipv6, role }, entry));
    let node_ips = node
        .nodeport_addresses
        .iter()
        .copied()
        .filter(|a| a.is_ipv6() == ipv6);
    for ip in node_ips.clone() {
        add(Role::NodeIp, SetEntry::Ip(ip));
    }
    let ip_port = |ip: IpAddr| SetEntry::IpPort(ip, p, e.port);
    let server = |real_servers: Vec<RealServer>| VirtualServer {
        persistence: e.session_affinity.map(|a| a.timeout_seconds),
        real_servers,
    };
    let vs_key = |addr: IpAddr, port: u16| VirtualServerKey {
        protocol: ipproto(e.protocol),
        addr,
        port,
    };
    // A VIP and its port: every new connection to the VIP on another port is rejected.
    let filtered_vip = |addr: IpAddr, add: &mut dyn FnMut(Role, SetEntry)| {
        add(Role::VipPort, ip_port(addr));
        if !node.is_local(addr) {
            add(Role::Vip, SetEntry::Ip(addr));
        }
    };
    // Internal traffic: the cluster IP.
    if let Ok(cluster_ip) = e.cluster_ip.parse::<IpAddr>() {
        let internal = real_servers(e.endpoints_for(&e.internal));
        out.addresses.push(cluster_ip);
        filtered_vip(cluster_ip, &mut add);
        if e.masquerade.all {
            add(Role::ClusterIpAll, ip_port(cluster_ip));
        } else if e.masquerade.off_cluster_to_cluster_ip {
            add(Role::ClusterIp, ip_port(cluster_ip));
        }
        if internal.is_empty() && e.internal.when_empty == EmptyAction::Drop {
            add(Role::Drop, ip_port(cluster_ip));
        }
        out.servers
            .push((vs_key(cluster_ip, e.port), server(internal)));
    }
    if e.masquerade.hairpin {
        for ep in e.cluster_endpoints.iter().chain(&e.local_endpoints) {
            if let Ok(ip) = ep.ip.parse::<IpAddr>() {
                add(Role::LoopBack, SetEntry::IpPortIp(ip, p, ep.port, ip));
            }
        }
    }
    if let Some(health) = e.health_check_node_port {
        add(Role::HcNodePort, SetEntry::Port(health));
    }
    let Some(external) = e.external else {
        return;
    };
    let rs = real_servers(e.endpoints_for(&external));
    let drop = rs.is_empty() && external.when_empty == EmptyAction::Drop;
    let vips = e.external_ips.iter().map(String::as_str).chain(
        e.load_balancer_ips
            .iter()
            .filter(|lb| lb.mode == LoadBalancerIpMode::VIP)
            .map(|lb| lb.ip.as_str()),
    );
    for vip in vips {
        let Ok(addr) = vip.parse::<IpAddr>() else {
            continue;
        };
        out.addresses.push(addr);
        filtered_vip(addr, &mut add);
        if e.masquerade.external {
            add(Role::External, ip_port(addr));
        }
        if e.masquerade.local_host_to_external {
            add(Role::ExternalLocal, ip_port(addr));
        }
        if drop {
            add(Role::Drop, ip_port(addr));
        }
        out.servers.push((vs_key(addr, e.port), server(rs.clone())));
    }
    source_ranges(e, &node.node_addresses, &mut add);
    if let Some(node_port) = e.node_port {
        if e.masquerade.external {
            add(Role::NodePort(e.protocol), SetEntry::Port(node_port));
        }
        if e.masquerade.local_host_to_external {
            add(Role::NodePortLocal(e.protocol), SetEntry::Port(node_port));
        }
        if drop {
            add(Role::NodePortDrop(e.protocol), SetEntry::Port(node_port));
        }
        for addr in node_ips {
            out.servers
                .push((vs_key(addr, node_port), server(rs.clone())));
        }
    }
}

/// `loadBalancerSourceRanges`: LB IPs in LB-FW, the allowed (IP, port, range) in
/// LB-SRC-CIDR, and the IP itself in LB-SRC-IP when a range covers the node (the node
/// reaching its own VIP uses the VIP as source).
fn source_ranges(
    e: &ServicePortPlan,
    node_addresses: &[IpAddr],
    add: &mut impl FnMut(Role, SetEntry),
) {
    let Some((ranges, covers_node)) = rules::source_ranges(e, node_addresses) else {
        return;
    };
    let v6 = e.family == IpFamily::IPv6;
    let p = proto_number(e.protocol);
    for ip in rules::lb_vips(e) {
        add(Role::LbFw, SetEntry::IpPort(ip, p, e.port));
        for range in ranges.iter().filter(|r| r.addr().is_ipv6() == v6) {
            add(
                Role::LbSrcCidr,
                SetEntry::IpPortNet(ip, p, e.port, range.addr(), range.prefix_len()),
            );
        }
        if covers_node {
            add(Role::LbSrcIp, SetEntry::IpPortIp(ip, p, e.port, ip));
        }
    }
}

/// The node's context for `plan`: the node-port addresses among the node's local
/// `addresses`, and the plan's node addresses.
#[must_use]
pub fn node_context(
    plan: &MergedPlan,
    settings: &IpvsSettings,
    local_addresses: impl IntoIterator<Item = IpAddr>,
) -> NodeContext {
    let mut local: Vec<IpAddr> = local_addresses.into_iter().collect();
    local.sort_unstable();
    local.dedup();
    let mut nodeport_addresses = settings.nodeport_addresses(local.iter().copied());
    if settings.nodeport_primary {
        let primary = proxyplan_crds::primary_addresses(&plan.addresses);
        nodeport_addresses.retain(|ip| primary.contains(ip));
    }
    NodeContext {
        nodeport_addresses,
        local_addresses: local,
        node_addresses: plan.addresses.clone(),
    }
}

/// Whether `plan` has entries of each family (`[IPv4, IPv6]`): a family's sets and
/// rules exist only then.
#[must_use]
pub fn families(plan: &MergedPlan) -> [bool; 2] {
    let has = |f| plan.service_ports.iter().any(|e| e.family == f);
    [has(IpFamily::IPv4), has(IpFamily::IPv6)]
}

/// Renders the whole desired state at once. `nodeport_addresses` are the node's
/// addresses that accept node ports (see [`IpvsSettings::nodeport_addresses`]).
#[must_use]
pub fn render(
    plan: &MergedPlan,
    settings: &IpvsSettings,
    nodeport_addresses: &[IpAddr],
) -> IpvsState {
    let node = NodeContext {
        nodeport_addresses: nodeport_addresses.to_vec(),
        local_addresses: Vec::new(),
        node_addresses: plan.addresses.clone(),
    };
    let used = families(plan);
    let mut state = IpvsState {
        rules: rules(plan, settings, used),
        ..IpvsState::default()
    };
    for (ipv6, _) in [false, true].into_iter().zip(used).filter(|(_, u)| *u) {
        for id in SetId::of_family(ipv6) {
            let spec = id.spec();
            state
                .sets
                .insert(id.name(), IpSet::new(spec.kind, spec.ipv6));
        }
    }
    let mut names: BTreeMap<SetId, String> = BTreeMap::new();
    let mut part = Contribution::default();
    for entry in &plan.service_ports {
        part.clear();
        contribute(entry, &node, &mut part);
        state.addresses.extend(part.addresses.drain(..));
        state.services.extend(part.servers.drain(..));
        for (id, entry) in part.entries.drain(..) {
            let name = names.entry(id).or_insert_with(|| id.name());
            if let Some(set) = state.sets.get_mut(name.as_str()) {
                set.entries.insert(entry);
            }
        }
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primary_node_port_addresses_are_the_plans_first_of_each_family() {
        let ips = |s: &[&str]| -> Vec<IpAddr> { s.iter().map(|a| a.parse().unwrap()).collect() };
        let plan = MergedPlan {
            node_name: "node-a".to_owned(),
            revision: "r1".to_owned(),
            services_fingerprint: 0,
            refused: Vec::new(),
            unmatched: Vec::new(),
            addresses: ips(&["10.0.0.5", "203.0.113.9", "fd00::5"]),
            local_traffic: proxyplan_crds::LocalTrafficDetection {
                mode: proxyplan_crds::LocalTrafficMode::ClusterCIDR,
                cidrs: Vec::new(),
                interface: None,
            },
            service_ports: Vec::new(),
            service_cidrs: Vec::new(),
        };
        let local = ips(&[
            "127.0.0.1",
            "10.0.0.5",
            "203.0.113.9",
            "fd00::5",
            "192.168.9.9",
        ]);
        let every = node_context(&plan, &IpvsSettings::default(), local.clone());
        assert_eq!(
            every.nodeport_addresses,
            ips(&["10.0.0.5", "192.168.9.9", "203.0.113.9", "fd00::5"])
        );
        let settings = IpvsSettings {
            nodeport_primary: true,
            ..IpvsSettings::default()
        };
        let primary = node_context(&plan, &settings, local);
        assert_eq!(primary.nodeport_addresses, ips(&["10.0.0.5", "fd00::5"]));
    }
}
