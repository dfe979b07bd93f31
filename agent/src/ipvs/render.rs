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
use std::time::Duration;

use proxyplan_crds::{
    EmptyAction, Endpoint, IpFamily, LoadBalancerIpMode, MergedPlan, Protocol, ServicePortPlan,
};

use super::ipset::{IpSet, PREFIX_V4, PREFIX_V6, SetEntry, SetType, Sets};
use super::{IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP};
use crate::iptables::{BaseJump, FamilyRules, Ruleset, TableRules, names};
use crate::run::Cidr;

/// Node-local inputs of the ipvs mode (agent flags, not plan content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsSettings {
    /// IPVS scheduler of every virtual server (`rr`, `wrr`, `lc`, `sh`, `mh`, ...).
    pub scheduler: String,
    /// The packet mark bit that asks for masquerade.
    pub masquerade_bit: u8,
    /// The dummy interface that holds the VIPs.
    pub interface: String,
    /// Virtual servers in these ranges are never touched.
    pub exclude_cidrs: Vec<Cidr>,
    /// Node-port addresses: local addresses in these ranges (all when empty).
    pub nodeport_cidrs: Vec<Cidr>,
    /// Set `arp_ignore=1` and `arp_announce=2` so the node never answers ARP for VIPs on
    /// other interfaces (needed with some load balancers, e.g. MetalLB in L2 mode).
    pub strict_arp: bool,
    /// How long a removed TCP/SCTP real server may drain (weight 0) before it is
    /// deleted even with connections left.
    pub termination_grace: Duration,
}

impl Default for IpvsSettings {
    fn default() -> Self {
        Self {
            scheduler: "rr".to_owned(),
            masquerade_bit: 13,
            interface: "proxyplan-ipvs0".to_owned(),
            exclude_cidrs: Vec::new(),
            nodeport_cidrs: Vec::new(),
            strict_arp: false,
            termination_grace: Duration::from_secs(120),
        }
    }
}

impl IpvsSettings {
    /// Whether the virtual server address `ip` is excluded (`--ipvs-exclude-cidrs`).
    #[must_use]
    pub fn excluded(&self, ip: IpAddr) -> bool {
        self.exclude_cidrs.iter().any(|c| c.contains(ip))
    }

    /// The node-port addresses among the node's local `addresses`: not loopback, not
    /// IPv6 link-local, inside `--nodeport-addresses` when given.
    #[must_use]
    pub fn nodeport_addresses(&self, addresses: impl IntoIterator<Item = IpAddr>) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = addresses
            .into_iter()
            .filter(|ip| !ip.is_loopback() && !is_link_local_v6(*ip))
            .filter(|ip| {
                self.nodeport_cidrs.is_empty()
                    || self.nodeport_cidrs.iter().any(|c| c.contains(*ip))
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

fn is_link_local_v6(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

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
            super::protocol_name(self.protocol),
            super::socket_text(self.addr, self.port)
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
    /// The plan entry it serves, for logs.
    pub key: String,
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
    match p {
        Protocol::TCP => IPPROTO_TCP,
        Protocol::UDP => IPPROTO_UDP,
        Protocol::SCTP => IPPROTO_SCTP,
    }
}

fn proto(p: Protocol) -> &'static str {
    match p {
        Protocol::TCP => "tcp",
        Protocol::UDP => "udp",
        Protocol::SCTP => "sctp",
    }
}

const PROTOCOLS: [Protocol; 3] = [Protocol::TCP, Protocol::UDP, Protocol::SCTP];

/// The sets of one family, by role. Names: `PROXYPLAN-<ROLE>` / `PROXYPLAN6-<ROLE>`.
mod role {
    /// Cluster IPs whose traffic from outside the cluster is masqueraded.
    pub const CLUSTER_IP: &str = "CLUSTER-IP";
    /// Cluster IPs whose traffic is always masqueraded (`masqueradeAll`).
    pub const CLUSTER_IP_ALL: &str = "CLUSTER-IP-ALL";
    /// External addresses (external IPs, LB IPs) whose traffic is masqueraded.
    pub const EXTERNAL: &str = "EXTERNAL";
    /// External addresses of Local-policy services: masquerade traffic from the node.
    pub const EXTERNAL_LOCAL: &str = "EXTERNAL-LOCAL";
    /// LB IPs with source ranges.
    pub const LB_FW: &str = "LB-FW";
    /// Allowed (LB IP, port, source range).
    pub const LB_SRC_CIDR: &str = "LB-SRC-CIDR";
    /// Allowed (LB IP, port, LB IP): the node itself when a range covers it.
    pub const LB_SRC_IP: &str = "LB-SRC-IP";
    /// Addresses whose traffic is dropped (Local policy, no local endpoint).
    pub const DROP: &str = "DROP";
    /// (endpoint, port, endpoint): an endpoint reaching itself through its service.
    pub const LOOP_BACK: &str = "LOOP-BACK";
    /// Node-port addresses.
    pub const NODE_IP: &str = "NODE-IP";
    /// Health-check node ports (accepted in the filter table).
    pub const HC_NODE_PORT: &str = "HC-NODE-PORT";
}

fn set_name(family: IpFamily, role: &str) -> String {
    match family {
        IpFamily::IPv4 => format!("{PREFIX_V4}{role}"),
        IpFamily::IPv6 => format!("{PREFIX_V6}{role}"),
    }
}

fn port_set(family: IpFamily, what: &str, p: Protocol) -> String {
    set_name(family, &format!("{what}-{}", proto(p).to_uppercase()))
}

/// Renders the whole desired state. `nodeport_addresses` are the node's addresses that
/// accept node ports (see [`IpvsSettings::nodeport_addresses`]).
#[must_use]
pub fn render(
    plan: &MergedPlan,
    settings: &IpvsSettings,
    nodeport_addresses: &[IpAddr],
) -> IpvsState {
    let mut state = IpvsState::default();
    for family in [IpFamily::IPv4, IpFamily::IPv6] {
        let entries: Vec<&ServicePortPlan> = plan
            .service_ports
            .iter()
            .filter(|e| e.family == family)
            .collect();
        if entries.is_empty() {
            continue;
        }
        let v6 = family == IpFamily::IPv6;
        let node_ips: Vec<IpAddr> = nodeport_addresses
            .iter()
            .copied()
            .filter(|a| a.is_ipv6() == v6)
            .collect();
        let local_cidr = plan
            .local_traffic
            .cidrs
            .iter()
            .find(|c| c.contains(':') == v6)
            .cloned();
        let mut family_state = FamilyState::new(family, &node_ips);
        for entry in entries {
            family_state.entry(entry, &plan.addresses);
        }
        let rules = frame(family, settings, local_cidr.as_deref());
        match family {
            IpFamily::IPv4 => state.rules.v4 = rules,
            IpFamily::IPv6 => state.rules.v6 = rules,
        }
        family_state.finish(&mut state);
    }
    state
}

/// Accumulates one family's addresses, virtual servers and sets.
struct FamilyState<'a> {
    family: IpFamily,
    node_ips: &'a [IpAddr],
    addresses: BTreeSet<IpAddr>,
    services: BTreeMap<VirtualServerKey, VirtualServer>,
    sets: Sets,
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

/// The `IPPROTO_*` number of a plan protocol, as set entries hold it.
fn proto_number(p: Protocol) -> u8 {
    match p {
        Protocol::TCP => 6,
        Protocol::UDP => 17,
        Protocol::SCTP => 132,
    }
}

impl<'a> FamilyState<'a> {
    fn new(family: IpFamily, node_ips: &'a [IpAddr]) -> Self {
        let mut sets = Sets::new();
        let ipv6 = family == IpFamily::IPv6;
        let hash = |kind| IpSet::new(kind, ipv6);
        for r in [
            role::CLUSTER_IP,
            role::CLUSTER_IP_ALL,
            role::EXTERNAL,
            role::EXTERNAL_LOCAL,
            role::LB_FW,
            role::DROP,
        ] {
            sets.insert(set_name(family, r), hash(SetType::HashIpPort));
        }
        sets.insert(
            set_name(family, role::LB_SRC_CIDR),
            hash(SetType::HashIpPortNet),
        );
        sets.insert(
            set_name(family, role::LB_SRC_IP),
            hash(SetType::HashIpPortIp),
        );
        sets.insert(
            set_name(family, role::LOOP_BACK),
            hash(SetType::HashIpPortIp),
        );
        let mut node_ip_set = hash(SetType::HashIp);
        node_ip_set
            .entries
            .extend(node_ips.iter().map(|ip| SetEntry::Ip(*ip)));
        sets.insert(set_name(family, role::NODE_IP), node_ip_set);
        sets.insert(
            set_name(family, role::HC_NODE_PORT),
            hash(SetType::BitmapPort),
        );
        for p in PROTOCOLS {
            for what in ["NP", "NP-LOCAL", "NP-DROP"] {
                sets.insert(port_set(family, what, p), hash(SetType::BitmapPort));
            }
        }
        Self {
            family,
            node_ips,
            addresses: BTreeSet::new(),
            services: BTreeMap::new(),
            sets,
        }
    }

    fn add(&mut self, role: &str, entry: SetEntry) {
        if let Some(set) = self.sets.get_mut(&set_name(self.family, role)) {
            set.entries.insert(entry);
        }
    }

    fn add_port(&mut self, what: &str, p: Protocol, port: u16) {
        if let Some(set) = self.sets.get_mut(&port_set(self.family, what, p)) {
            set.entries.insert(SetEntry::Port(port));
        }
    }

    fn server(&mut self, entry: &ServicePortPlan, addr: IpAddr, port: u16, rs: &[RealServer]) {
        self.services.insert(
            VirtualServerKey {
                protocol: ipproto(entry.protocol),
                addr,
                port,
            },
            VirtualServer {
                persistence: entry.session_affinity.map(|a| a.timeout_seconds),
                real_servers: rs.to_vec(),
                key: entry.key.clone(),
            },
        );
    }

    fn entry(&mut self, e: &ServicePortPlan, node_addresses: &[IpAddr]) {
        let p = proto_number(e.protocol);
        let ip_port = |ip: IpAddr| SetEntry::IpPort(ip, p, e.port);
        // Internal traffic: the cluster IP.
        if let Ok(cluster_ip) = e.cluster_ip.parse::<IpAddr>() {
            let internal = real_servers(e.endpoints_for(&e.internal));
            self.addresses.insert(cluster_ip);
            if e.masquerade.all {
                self.add(role::CLUSTER_IP_ALL, ip_port(cluster_ip));
            } else if e.masquerade.off_cluster_to_cluster_ip {
                self.add(role::CLUSTER_IP, ip_port(cluster_ip));
            }
            if internal.is_empty() && e.internal.when_empty == EmptyAction::Drop {
                self.add(role::DROP, ip_port(cluster_ip));
            }
            self.server(e, cluster_ip, e.port, &internal);
        }
        if e.masquerade.hairpin {
            for ep in e.cluster_endpoints.iter().chain(&e.local_endpoints) {
                if let Ok(ip) = ep.ip.parse::<IpAddr>() {
                    self.add(role::LOOP_BACK, SetEntry::IpPortIp(ip, p, ep.port, ip));
                }
            }
        }
        if let Some(health) = e.health_check_node_port
            && let Some(set) = self
                .sets
                .get_mut(&set_name(self.family, role::HC_NODE_PORT))
        {
            set.entries.insert(SetEntry::Port(health));
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
            self.addresses.insert(addr);
            self.external_address(e, addr, drop);
            self.server(e, addr, e.port, &rs);
        }
        self.source_ranges(e, node_addresses);
        if let Some(node_port) = e.node_port {
            if e.masquerade.external {
                self.add_port("NP", e.protocol, node_port);
            }
            if e.masquerade.local_host_to_external {
                self.add_port("NP-LOCAL", e.protocol, node_port);
            }
            if drop {
                self.add_port("NP-DROP", e.protocol, node_port);
            }
            for addr in self.node_ips {
                self.services.insert(
                    VirtualServerKey {
                        protocol: ipproto(e.protocol),
                        addr: *addr,
                        port: node_port,
                    },
                    VirtualServer {
                        persistence: e.session_affinity.map(|a| a.timeout_seconds),
                        real_servers: rs.clone(),
                        key: e.key.clone(),
                    },
                );
            }
        }
    }

    fn external_address(&mut self, e: &ServicePortPlan, vip: IpAddr, drop: bool) {
        let entry = SetEntry::IpPort(vip, proto_number(e.protocol), e.port);
        if e.masquerade.external {
            self.add(role::EXTERNAL, entry);
        }
        if e.masquerade.local_host_to_external {
            self.add(role::EXTERNAL_LOCAL, entry);
        }
        if drop {
            self.add(role::DROP, entry);
        }
    }

    /// `loadBalancerSourceRanges`: LB IPs in LB-FW, the allowed (IP, port, range) in
    /// LB-SRC-CIDR, and the IP itself in LB-SRC-IP when a range covers the node (the node
    /// reaching its own VIP uses the VIP as source).
    fn source_ranges(&mut self, e: &ServicePortPlan, node_addresses: &[IpAddr]) {
        let ranges: Vec<Cidr> = e
            .load_balancer_source_ranges
            .iter()
            .filter_map(|r| r.parse::<Cidr>().ok())
            .collect();
        if ranges.is_empty() {
            return;
        }
        let v6 = self.family == IpFamily::IPv6;
        let p = proto_number(e.protocol);
        let covers_node = ranges
            .iter()
            .any(|r| node_addresses.iter().any(|a| r.contains(*a)));
        let lb_ips: Vec<IpAddr> = e
            .load_balancer_ips
            .iter()
            .filter(|lb| lb.mode == LoadBalancerIpMode::VIP)
            .filter_map(|lb| lb.ip.parse().ok())
            .collect();
        for ip in lb_ips {
            self.add(role::LB_FW, SetEntry::IpPort(ip, p, e.port));
            for range in ranges.iter().filter(|r| r.addr().is_ipv6() == v6) {
                self.add(
                    role::LB_SRC_CIDR,
                    SetEntry::IpPortNet(ip, p, e.port, range.addr(), range.prefix_len()),
                );
            }
            if covers_node {
                self.add(role::LB_SRC_IP, SetEntry::IpPortIp(ip, p, e.port, ip));
            }
        }
    }

    fn finish(self, state: &mut IpvsState) {
        state.addresses.extend(self.addresses);
        state.services.extend(self.services);
        state.sets.extend(self.sets);
    }
}

fn set_match(family: IpFamily, role: &str, dirs: &str) -> String {
    format!("-m set --match-set {} {dirs}", set_name(family, role))
}

/// The fixed iptables rules of one family.
fn frame(family: IpFamily, settings: &IpvsSettings, local_cidr: Option<&str>) -> FamilyRules {
    let mark = format!("{:#x}", 1u32 << settings.masquerade_bit.min(31));
    let masq = names::MARK_MASQ;
    let comment = |text: &str| format!("-m comment --comment \"{text}\"");
    let mut nat = TableRules::default();
    let mut filter = TableRules::default();
    let push = |table: &mut TableRules, chain: &str, rule: String| {
        table.chains.entry(chain.to_owned()).or_default().push(rule);
    };
    nat.chains.insert(names::CANARY.to_owned(), Vec::new());
    nat.chains.insert(names::NODEPORTS.to_owned(), Vec::new());
    push(&mut nat, masq, format!("-j MARK --or-mark {mark}"));
    push(
        &mut nat,
        names::POSTROUTING,
        format!(
            "{} {} -j MASQUERADE",
            comment("proxyplan hairpin traffic"),
            set_match(family, role::LOOP_BACK, "dst,dst,src")
        ),
    );
    push(
        &mut nat,
        names::POSTROUTING,
        format!("-m mark ! --mark {mark}/{mark} -j RETURN"),
    );
    push(
        &mut nat,
        names::POSTROUTING,
        format!("-j MARK --xor-mark {mark}"),
    );
    push(
        &mut nat,
        names::POSTROUTING,
        format!(
            "{} -j MASQUERADE --random-fully",
            comment("proxyplan service traffic requiring SNAT")
        ),
    );
    let services = names::SERVICES;
    push(
        &mut nat,
        services,
        format!(
            "{} {} -j {masq}",
            comment("proxyplan cluster IPs, masquerade all"),
            set_match(family, role::CLUSTER_IP_ALL, "dst,dst")
        ),
    );
    if let Some(cidr) = local_cidr {
        push(
            &mut nat,
            services,
            format!(
                "{} ! -s {cidr} {} -j {masq}",
                comment("proxyplan cluster IPs from outside the cluster"),
                set_match(family, role::CLUSTER_IP, "dst,dst")
            ),
        );
    }
    push(
        &mut nat,
        services,
        format!(
            "{} {} -j {masq}",
            comment("proxyplan external addresses"),
            set_match(family, role::EXTERNAL, "dst,dst")
        ),
    );
    push(
        &mut nat,
        services,
        format!(
            "{} -m addrtype --src-type LOCAL {} -j {masq}",
            comment("proxyplan node traffic to Local-policy external addresses"),
            set_match(family, role::EXTERNAL_LOCAL, "dst,dst")
        ),
    );
    push(
        &mut nat,
        services,
        format!(
            "{} {} -j {}",
            comment("proxyplan service nodeports"),
            set_match(family, role::NODE_IP, "dst"),
            names::NODEPORTS
        ),
    );
    for p in PROTOCOLS {
        let pr = proto(p);
        push(
            &mut nat,
            names::NODEPORTS,
            format!(
                "-p {pr} -m set --match-set {} dst -j {masq}",
                port_set(family, "NP", p)
            ),
        );
        push(
            &mut nat,
            names::NODEPORTS,
            format!(
                "-p {pr} -m addrtype --src-type LOCAL -m set --match-set {} dst -j {masq}",
                port_set(family, "NP-LOCAL", p)
            ),
        );
    }
    filter.chains.insert(names::CANARY.to_owned(), Vec::new());
    push(
        &mut filter,
        names::FIREWALL,
        format!(
            "{} {} -m set ! --match-set {} dst,dst,src -m set ! --match-set {} dst,dst,src -j DROP",
            comment("proxyplan load balancer source ranges"),
            set_match(family, role::LB_FW, "dst,dst"),
            set_name(family, role::LB_SRC_CIDR),
            set_name(family, role::LB_SRC_IP)
        ),
    );
    push(
        &mut filter,
        names::EXTERNAL_SERVICES,
        format!(
            "{} {} -j DROP",
            comment("proxyplan Local policy without local endpoints"),
            set_match(family, role::DROP, "dst,dst")
        ),
    );
    for p in PROTOCOLS {
        push(
            &mut filter,
            names::EXTERNAL_SERVICES,
            format!(
                "-p {} {} -m set --match-set {} dst -j DROP",
                proto(p),
                set_match(family, role::NODE_IP, "dst"),
                port_set(family, "NP-DROP", p)
            ),
        );
    }
    push(
        &mut filter,
        names::EXTERNAL_SERVICES,
        format!(
            "{} -p tcp {} -j ACCEPT",
            comment("proxyplan health check node ports"),
            set_match(family, role::HC_NODE_PORT, "dst")
        ),
    );
    push(
        &mut filter,
        names::FORWARD,
        format!(
            "{} -m mark --mark {mark}/{mark} -j ACCEPT",
            comment("proxyplan forwarding rules")
        ),
    );
    push(
        &mut filter,
        names::FORWARD,
        format!(
            "{} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            comment("proxyplan forwarding conntrack rule")
        ),
    );
    let portals = format!("{} -j {services}", comment("proxyplan service portals"));
    nat.base_jumps = vec![
        BaseJump {
            chain: "PREROUTING",
            rule: portals.clone(),
        },
        BaseJump {
            chain: "OUTPUT",
            rule: portals,
        },
        BaseJump {
            chain: "POSTROUTING",
            rule: format!(
                "{} -j {}",
                comment("proxyplan postrouting rules"),
                names::POSTROUTING
            ),
        },
    ];
    let new = "-m conntrack --ctstate NEW";
    filter.base_jumps = vec![
        BaseJump {
            chain: "INPUT",
            rule: format!(
                "{new} {} -j {}",
                comment("proxyplan external services"),
                names::EXTERNAL_SERVICES
            ),
        },
        BaseJump {
            chain: "INPUT",
            rule: format!(
                "{new} {} -j {}",
                comment("proxyplan load balancer firewall"),
                names::FIREWALL
            ),
        },
        BaseJump {
            chain: "FORWARD",
            rule: format!(
                "{} -j {}",
                comment("proxyplan forwarding rules"),
                names::FORWARD
            ),
        },
    ];
    FamilyRules { filter, nat }
}
