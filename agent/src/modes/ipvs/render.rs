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

use crate::kernel::ipset::{IpSet, PREFIX_V4, PREFIX_V6, SetEntry, SetSpec, SetType, Sets};
use crate::kernel::ipvs::{IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, protocol_name, socket_text};
use crate::ruleset::names;
use crate::ruleset::rules::{BaseJump, FamilyRules, Ruleset, TableRules};
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
    match p {
        Protocol::TCP => IPPROTO_TCP,
        Protocol::UDP => IPPROTO_UDP,
        Protocol::SCTP => IPPROTO_SCTP,
    }
}

/// The `IPPROTO_*` number of a plan protocol, as set entries hold it.
fn proto_number(p: Protocol) -> u8 {
    match p {
        Protocol::TCP => 6,
        Protocol::UDP => 17,
        Protocol::SCTP => 132,
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

/// What a set of the ipvs mode is for. Each family has one set per role, named
/// `PROXYPLAN-<ROLE>` (IPv4) or `PROXYPLAN6-<ROLE>` (IPv6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Cluster IPs whose traffic from outside the cluster is masqueraded.
    ClusterIp,
    /// Cluster IPs whose traffic is always masqueraded (`masqueradeAll`).
    ClusterIpAll,
    /// External addresses (external IPs, LB IPs) whose traffic is masqueraded.
    External,
    /// External addresses of Local-policy services: masquerade traffic from the node.
    ExternalLocal,
    /// LB IPs with source ranges.
    LbFw,
    /// Allowed (LB IP, port, source range).
    LbSrcCidr,
    /// Allowed (LB IP, port, LB IP): the node itself when a range covers it.
    LbSrcIp,
    /// Addresses whose traffic is dropped (Local policy, no local endpoint).
    Drop,
    /// (endpoint, port, endpoint): an endpoint reaching itself through its service.
    LoopBack,
    /// Node-port addresses.
    NodeIp,
    /// Health-check node ports (accepted in the filter table).
    HcNodePort,
    /// Node ports whose traffic is masqueraded, per protocol.
    NodePort(Protocol),
    /// Node ports of Local-policy services: masquerade traffic from the node.
    NodePortLocal(Protocol),
    /// Node ports whose traffic is dropped (Local policy, no local endpoint).
    NodePortDrop(Protocol),
}

impl Role {
    /// Every role.
    pub const ALL: [Self; 20] = [
        Self::ClusterIp,
        Self::ClusterIpAll,
        Self::External,
        Self::ExternalLocal,
        Self::LbFw,
        Self::LbSrcCidr,
        Self::LbSrcIp,
        Self::Drop,
        Self::LoopBack,
        Self::NodeIp,
        Self::HcNodePort,
        Self::NodePort(Protocol::TCP),
        Self::NodePort(Protocol::UDP),
        Self::NodePort(Protocol::SCTP),
        Self::NodePortLocal(Protocol::TCP),
        Self::NodePortLocal(Protocol::UDP),
        Self::NodePortLocal(Protocol::SCTP),
        Self::NodePortDrop(Protocol::TCP),
        Self::NodePortDrop(Protocol::UDP),
        Self::NodePortDrop(Protocol::SCTP),
    ];

    fn suffix(self) -> String {
        let port = |what: &str, p: Protocol| format!("{what}-{}", proto(p).to_uppercase());
        match self {
            Self::ClusterIp => "CLUSTER-IP".into(),
            Self::ClusterIpAll => "CLUSTER-IP-ALL".into(),
            Self::External => "EXTERNAL".into(),
            Self::ExternalLocal => "EXTERNAL-LOCAL".into(),
            Self::LbFw => "LB-FW".into(),
            Self::LbSrcCidr => "LB-SRC-CIDR".into(),
            Self::LbSrcIp => "LB-SRC-IP".into(),
            Self::Drop => "DROP".into(),
            Self::LoopBack => "LOOP-BACK".into(),
            Self::NodeIp => "NODE-IP".into(),
            Self::HcNodePort => "HC-NODE-PORT".into(),
            Self::NodePort(p) => port("NP", p),
            Self::NodePortLocal(p) => port("NP-LOCAL", p),
            Self::NodePortDrop(p) => port("NP-DROP", p),
        }
    }

    fn kind(self) -> SetType {
        match self {
            Self::ClusterIp
            | Self::ClusterIpAll
            | Self::External
            | Self::ExternalLocal
            | Self::LbFw
            | Self::Drop => SetType::HashIpPort,
            Self::LbSrcCidr => SetType::HashIpPortNet,
            Self::LbSrcIp | Self::LoopBack => SetType::HashIpPortIp,
            Self::NodeIp => SetType::HashIp,
            Self::HcNodePort
            | Self::NodePort(_)
            | Self::NodePortLocal(_)
            | Self::NodePortDrop(_) => SetType::BitmapPort,
        }
    }
}

/// One of the agent's sets: a family and a role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SetId {
    /// The IPv6 set (`PROXYPLAN6-*`)?
    pub ipv6: bool,
    /// What it is for.
    pub role: Role,
}

impl SetId {
    /// Its name.
    #[must_use]
    pub fn name(self) -> String {
        let prefix = if self.ipv6 { PREFIX_V6 } else { PREFIX_V4 };
        format!("{prefix}{}", self.role.suffix())
    }

    /// Its type and family (port bitmaps have none: `ipset save` shows no family).
    #[must_use]
    pub fn spec(self) -> SetSpec {
        let kind = self.role.kind();
        SetSpec {
            kind,
            ipv6: self.ipv6 && kind != SetType::BitmapPort,
        }
    }

    /// Every set of one family.
    pub fn of_family(ipv6: bool) -> impl Iterator<Item = Self> {
        Role::ALL.into_iter().map(move |role| Self { ipv6, role })
    }
}

fn set_name(family: IpFamily, role: Role) -> String {
    SetId {
        ipv6: family == IpFamily::IPv6,
        role,
    }
    .name()
}

/// What the node itself adds to every entry: its node-port addresses and all its
/// addresses (for load-balancer source ranges that cover the node).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeContext {
    /// Addresses that accept node ports ([`IpvsSettings::nodeport_addresses`]).
    pub nodeport_addresses: Vec<IpAddr>,
    /// The node's addresses from the plan.
    pub node_addresses: Vec<IpAddr>,
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
    // Internal traffic: the cluster IP.
    if let Ok(cluster_ip) = e.cluster_ip.parse::<IpAddr>() {
        let internal = real_servers(e.endpoints_for(&e.internal));
        out.addresses.push(cluster_ip);
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
    let ranges: Vec<Cidr> = e
        .load_balancer_source_ranges
        .iter()
        .filter_map(|r| r.parse::<Cidr>().ok())
        .collect();
    if ranges.is_empty() {
        return;
    }
    let v6 = e.family == IpFamily::IPv6;
    let p = proto_number(e.protocol);
    let covers_node = ranges
        .iter()
        .any(|r| node_addresses.iter().any(|a| r.contains(*a)));
    let lb_ips = e
        .load_balancer_ips
        .iter()
        .filter(|lb| lb.mode == LoadBalancerIpMode::VIP)
        .filter_map(|lb| lb.ip.parse::<IpAddr>().ok());
    for ip in lb_ips {
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
    NodeContext {
        nodeport_addresses: settings.nodeport_addresses(local_addresses),
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

/// The fixed iptables rules of the families in use.
#[must_use]
pub fn rules(plan: &MergedPlan, settings: &IpvsSettings, families: [bool; 2]) -> Ruleset {
    let mut rules = Ruleset::default();
    for (family, used) in [IpFamily::IPv4, IpFamily::IPv6].into_iter().zip(families) {
        if !used {
            continue;
        }
        let v6 = family == IpFamily::IPv6;
        let local_cidr = plan
            .local_traffic
            .cidrs
            .iter()
            .find(|c| c.contains(':') == v6);
        let family_rules = frame(family, settings, local_cidr.map(String::as_str));
        match family {
            IpFamily::IPv4 => rules.v4 = family_rules,
            IpFamily::IPv6 => rules.v6 = family_rules,
        }
    }
    rules
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

fn set_match(family: IpFamily, role: Role, dirs: &str) -> String {
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
            set_match(family, Role::LoopBack, "dst,dst,src")
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
            set_match(family, Role::ClusterIpAll, "dst,dst")
        ),
    );
    if let Some(cidr) = local_cidr {
        push(
            &mut nat,
            services,
            format!(
                "{} ! -s {cidr} {} -j {masq}",
                comment("proxyplan cluster IPs from outside the cluster"),
                set_match(family, Role::ClusterIp, "dst,dst")
            ),
        );
    }
    push(
        &mut nat,
        services,
        format!(
            "{} {} -j {masq}",
            comment("proxyplan external addresses"),
            set_match(family, Role::External, "dst,dst")
        ),
    );
    push(
        &mut nat,
        services,
        format!(
            "{} -m addrtype --src-type LOCAL {} -j {masq}",
            comment("proxyplan node traffic to Local-policy external addresses"),
            set_match(family, Role::ExternalLocal, "dst,dst")
        ),
    );
    push(
        &mut nat,
        services,
        format!(
            "{} {} -j {}",
            comment("proxyplan service nodeports"),
            set_match(family, Role::NodeIp, "dst"),
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
                set_name(family, Role::NodePort(p))
            ),
        );
        push(
            &mut nat,
            names::NODEPORTS,
            format!(
                "-p {pr} -m addrtype --src-type LOCAL -m set --match-set {} dst -j {masq}",
                set_name(family, Role::NodePortLocal(p))
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
            set_match(family, Role::LbFw, "dst,dst"),
            set_name(family, Role::LbSrcCidr),
            set_name(family, Role::LbSrcIp)
        ),
    );
    push(
        &mut filter,
        names::EXTERNAL_SERVICES,
        format!(
            "{} {} -j DROP",
            comment("proxyplan Local policy without local endpoints"),
            set_match(family, Role::Drop, "dst,dst")
        ),
    );
    for p in PROTOCOLS {
        push(
            &mut filter,
            names::EXTERNAL_SERVICES,
            format!(
                "-p {} {} -m set --match-set {} dst -j DROP",
                proto(p),
                set_match(family, Role::NodeIp, "dst"),
                set_name(family, Role::NodePortDrop(p))
            ),
        );
    }
    push(
        &mut filter,
        names::EXTERNAL_SERVICES,
        format!(
            "{} -p tcp {} -j ACCEPT",
            comment("proxyplan health check node ports"),
            set_match(family, Role::HcNodePort, "dst")
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
