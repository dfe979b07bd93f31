//! One plan entry to what it adds to its family's table ([`EntryObjects`]): elements of
//! the shared maps keyed by its destinations (its cluster IP, external and load-balancer
//! IPs, node port), hairpin and cluster-IP set elements, and, for an entry with ClientIP
//! affinity or a Local external policy, chains and maps of its own. Pure: no I/O, no
//! policy; what to masquerade, reject or drop is read from the plan.
//!
//! An ordinary entry (Cluster policies, no affinity) owns no chain: its destinations
//! `goto` a shared `lb-N…` chain, which DNATs by looking its destination up in that
//! chain's `backends-P-N…` map (`ip . port . slot : endpoint`), so an endpoint change
//! is a change of map elements only (and of the destination's element when the count
//! changes: it then goes to another chain, its endpoints to that chain's map).

use std::net::IpAddr;

use proxyplan_crds::{
    EmptyAction, Endpoint, LoadBalancerIpMode, ServicePortPlan, TrafficPlan, TrafficPolicy,
};

use super::layout::{ChainDef, FamilyContext, SetDef, SetKind, chain, masquerade_rule};
use super::names::{self, Balance, List, Masquerade, SharedChain};
use super::rules::{Action, Match, Net, Rule, addr_bytes, addr_port_bytes};
use crate::kernel::nftables::{Data, Verdict};

/// The shared map a destination's element is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DestMap {
    /// `service-ips`.
    ServiceIps,
    /// `no-endpoint-services`.
    NoEndpointServices,
    /// `firewall-ips`.
    FirewallIps,
    /// `service-nodeports`.
    ServiceNodePorts,
    /// `no-endpoint-nodeports`.
    NoEndpointNodePorts,
}

impl DestMap {
    /// The map's name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::ServiceIps => names::SERVICE_IPS,
            Self::NoEndpointServices => names::NO_ENDPOINT_SERVICES,
            Self::FirewallIps => names::FIREWALL_IPS,
            Self::ServiceNodePorts => names::SERVICE_NODEPORTS,
            Self::NoEndpointNodePorts => names::NO_ENDPOINT_NODEPORTS,
        }
    }

    /// Whether it is keyed by port alone.
    #[must_use]
    pub fn by_port(self) -> bool {
        matches!(self, Self::ServiceNodePorts | Self::NoEndpointNodePorts)
    }
}

/// A destination: an element key of one of the shared verdict maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dest {
    /// The map.
    pub map: DestMap,
    /// The address (none for node ports).
    pub addr: Option<IpAddr>,
    /// The protocol number.
    pub proto: u8,
    /// The port.
    pub port: u16,
}

impl Dest {
    /// The element's key: `ip . proto . port` or `proto . port`, each field padded to
    /// 4 bytes as the kernel's registers hold them.
    #[must_use]
    pub fn key(&self) -> Vec<u8> {
        let mut key = self.addr.map(addr_bytes).unwrap_or_default();
        key.extend_from_slice(&[self.proto, 0, 0, 0]);
        key.extend_from_slice(&self.port.to_be_bytes());
        key.extend_from_slice(&[0, 0]);
        key
    }

    /// The map and key of the endpoint in `slot` behind this destination, when the
    /// shared chain `shared` balances it.
    #[must_use]
    pub fn backend_key(&self, shared: SharedChain, slot: u32) -> (String, Vec<u8>) {
        let mut key = self.addr.map(addr_bytes).unwrap_or_default();
        key.extend_from_slice(&self.port.to_be_bytes());
        key.extend_from_slice(&[0, 0]);
        key.extend_from_slice(&slot.to_ne_bytes());
        (shared.backends(self.proto), key)
    }
}

/// What a destination's element says and, when it goes to a shared chain, the
/// endpoints behind it (slot `i` is `backends[i]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DestValue {
    /// The verdict.
    pub verdict: Verdict,
    /// The shared chain the verdict goes to.
    pub shared: Option<SharedChain>,
    /// The endpoints a shared chain balances over.
    pub backends: Vec<(IpAddr, u16)>,
}

/// An element of one of an entry's own maps.
pub type Element = (Vec<u8>, Option<Data>);

/// What one entry adds to its family's table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryObjects {
    /// Its destinations.
    pub dests: Vec<(Dest, DestValue)>,
    /// Its endpoints, as hairpin elements: `(endpoint, protocol, port)`.
    pub hairpin: Vec<(IpAddr, u8, u16)>,
    /// Its cluster IP.
    pub cluster_ip: Option<IpAddr>,
    /// Chains of its own, with their rules.
    pub chains: Vec<ChainDef>,
    /// Sets and maps of its own, with their elements (none for dynamic ones).
    pub sets: Vec<(SetDef, Vec<Element>)>,
}

/// The hairpin set's key of an endpoint.
#[must_use]
pub fn hairpin_key(ip: IpAddr, proto: u8, port: u16) -> Vec<u8> {
    let mut key = addr_bytes(ip);
    key.extend_from_slice(&addr_bytes(ip));
    key.extend_from_slice(&[proto, 0, 0, 0]);
    key.extend_from_slice(&port.to_be_bytes());
    key.extend_from_slice(&[0, 0]);
    key
}

fn parse_endpoints(list: &[Endpoint]) -> Vec<(IpAddr, u16)> {
    list.iter()
        .filter_map(|e| Some((e.ip.parse().ok()?, e.port)))
        .collect()
}

fn when_empty(action: EmptyAction) -> Verdict {
    match action {
        EmptyAction::Reject => Verdict::Goto(names::REJECT_CHAIN.to_owned()),
        EmptyAction::Drop => Verdict::Drop,
    }
}

/// Renders entries of one family.
pub struct Renderer<'c> {
    /// The family's inputs.
    pub ctx: &'c FamilyContext,
}

struct Entry<'e> {
    e: &'e ServicePortPlan,
    id: String,
    proto: u8,
    special: bool,
}

impl Renderer<'_> {
    /// What `entry` adds to the table. Addresses that do not parse (the plan was
    /// validated, so none) are left out.
    #[must_use]
    pub fn entry(&self, entry: &ServicePortPlan) -> EntryObjects {
        let mut out = EntryObjects::default();
        let Ok(cluster_ip) = entry.cluster_ip.parse::<IpAddr>() else {
            return out;
        };
        let e = Entry {
            e: entry,
            id: names::entry_id(entry),
            proto: names::proto_number(entry.protocol),
            special: entry.session_affinity.is_some()
                || entry
                    .external
                    .is_some_and(|x| x.policy == TrafficPolicy::Local),
        };
        out.cluster_ip = Some(cluster_ip);
        if entry.masquerade.hairpin {
            let mut eps = parse_endpoints(&entry.cluster_endpoints);
            eps.extend(parse_endpoints(&entry.local_endpoints));
            eps.sort_unstable();
            eps.dedup();
            out.hairpin = eps
                .into_iter()
                .map(|(ip, port)| (ip, e.proto, port))
                .collect();
        }
        self.internal(&e, cluster_ip, &mut out);
        if let Some(external) = entry.external {
            self.external(&e, &external, &mut out);
        }
        out
    }

    fn dest(e: &Entry<'_>, map: DestMap, addr: Option<IpAddr>) -> Dest {
        Dest {
            map,
            addr,
            proto: e.proto,
            port: if map.by_port() {
                e.e.node_port.unwrap_or(e.e.port)
            } else {
                e.e.port
            },
        }
    }

    fn internal_masquerade(&self, e: &Entry<'_>) -> Masquerade {
        if e.e.masquerade.all {
            Masquerade::All
        } else if e.e.masquerade.off_cluster_to_cluster_ip && self.ctx.local.is_some() {
            Masquerade::NotLocal
        } else {
            Masquerade::None
        }
    }

    fn internal(&self, e: &Entry<'_>, cluster_ip: IpAddr, out: &mut EntryObjects) {
        let endpoints = e.e.endpoints_for(&e.e.internal);
        if endpoints.is_empty() {
            out.dests.push((
                Self::dest(e, DestMap::NoEndpointServices, Some(cluster_ip)),
                DestValue {
                    verdict: when_empty(e.e.internal.when_empty),
                    shared: None,
                    backends: Vec::new(),
                },
            ));
            return;
        }
        let masquerade = self.internal_masquerade(e);
        let dest = Self::dest(e, DestMap::ServiceIps, Some(cluster_ip));
        if e.special {
            let name = names::service_chain(&e.id);
            let list = list_of(&e.e.internal);
            let mut rules: Vec<Rule> = masquerade_rule(masquerade, self.ctx).into_iter().collect();
            self.pick(e, list, vec![], &mut rules, out);
            out.chains.push(chain(name.clone(), rules));
            out.dests.push((dest, goto(name)));
        } else {
            out.dests
                .push((dest, shared(Balance::Address, masquerade, endpoints)));
        }
    }

    /// Whether the Service has a usable endpoint anywhere (so traffic this node cannot
    /// serve is dropped, not rejected, and short-circuited traffic still has a target).
    fn has_any_endpoint(e: &ServicePortPlan) -> bool {
        !e.cluster_endpoints.is_empty()
            || e.internal.when_empty == EmptyAction::Drop
            || e.external
                .is_some_and(|x| x.when_empty == EmptyAction::Drop)
    }

    fn external(&self, e: &Entry<'_>, external: &TrafficPlan, out: &mut EntryObjects) {
        let entry = e.e;
        let endpoints = entry.endpoints_for(external);
        let masquerade = if entry.masquerade.external {
            Masquerade::All
        } else {
            Masquerade::None
        };
        // Where captured external traffic goes, by address and by node port.
        let (by_address, by_port) = if !Self::has_any_endpoint(entry) {
            (None, None)
        } else if e.special {
            let name = names::external_chain(&e.id);
            let rules = self.external_rules(e, external, out);
            out.chains.push(chain(name.clone(), rules));
            (Some(goto(name.clone())), Some(goto(name)))
        } else if endpoints.is_empty() {
            (None, None)
        } else {
            (
                Some(shared(Balance::Address, masquerade, endpoints)),
                Some(shared(Balance::NodePort, masquerade, endpoints)),
            )
        };
        let empty = endpoints.is_empty().then(|| DestValue {
            verdict: when_empty(external.when_empty),
            shared: None,
            backends: Vec::new(),
        });
        let vips: Vec<IpAddr> = entry
            .load_balancer_ips
            .iter()
            .filter(|lb| lb.mode == LoadBalancerIpMode::VIP)
            .filter_map(|lb| lb.ip.parse().ok())
            .collect();
        let external_ips: Vec<IpAddr> = entry
            .external_ips
            .iter()
            .filter_map(|ip| ip.parse().ok())
            .collect();
        for ip in external_ips.iter().chain(&vips) {
            if let Some(value) = &by_address {
                out.dests
                    .push((Self::dest(e, DestMap::ServiceIps, Some(*ip)), value.clone()));
            }
            if let Some(value) = &empty {
                out.dests.push((
                    Self::dest(e, DestMap::NoEndpointServices, Some(*ip)),
                    value.clone(),
                ));
            }
        }
        let ranges: Vec<Net> = entry
            .load_balancer_source_ranges
            .iter()
            .filter_map(|r| Net::parse(r))
            .collect();
        if !ranges.is_empty() && !vips.is_empty() {
            let name = names::firewall_chain(&e.id);
            let covers_node = ranges
                .iter()
                .any(|r| self.ctx.node_addresses.iter().any(|a| r.contains(*a)));
            let mut rules: Vec<Rule> = ranges
                .iter()
                .map(|net| {
                    Rule::new(
                        vec![Match::Saddr {
                            net: *net,
                            negate: false,
                        }],
                        vec![Action::Verdict(Verdict::Return)],
                    )
                })
                .collect();
            if covers_node {
                // Traffic the node sends to its own load-balancer address.
                for ip in &vips {
                    rules.push(Rule::new(
                        vec![Match::Saddr {
                            net: Net::host(*ip),
                            negate: false,
                        }],
                        vec![Action::Verdict(Verdict::Return)],
                    ));
                }
            }
            rules.push(
                Rule::new(vec![], vec![Action::Verdict(Verdict::Drop)])
                    .comment("traffic not accepted by loadBalancerSourceRanges"),
            );
            out.chains.push(chain(name.clone(), rules));
            for ip in &vips {
                out.dests.push((
                    Self::dest(e, DestMap::FirewallIps, Some(*ip)),
                    goto(name.clone()),
                ));
            }
        }
        if entry.node_port.is_some() {
            if let Some(value) = by_port {
                out.dests
                    .push((Self::dest(e, DestMap::ServiceNodePorts, None), value));
            }
            if let Some(value) = empty {
                out.dests
                    .push((Self::dest(e, DestMap::NoEndpointNodePorts, None), value));
            }
        }
    }

    /// The rules of an entry's own external chain: masquerade, then (Local policy)
    /// pods and the node itself short-circuited to the cluster endpoints, then the
    /// policy's endpoints.
    fn external_rules(
        &self,
        e: &Entry<'_>,
        external: &TrafficPlan,
        out: &mut EntryObjects,
    ) -> Vec<Rule> {
        let entry = e.e;
        let mut rules = Vec::new();
        if entry.masquerade.external {
            rules.push(Rule::new(vec![], vec![Action::MarkOr(self.ctx.mark)]));
        }
        if external.policy == TrafficPolicy::Local {
            let cluster = !entry.cluster_endpoints.is_empty();
            if cluster && let Some(local) = &self.ctx.local {
                self.pick(
                    e,
                    List::Cluster,
                    vec![local.matching(false)],
                    &mut rules,
                    out,
                );
                if let Some(last) = rules.last_mut() {
                    last.comment = Some("short-circuit pod traffic".to_owned());
                }
            }
            if entry.masquerade.local_host_to_external {
                rules.push(
                    Rule::new(
                        vec![Match::FibSaddrLocal],
                        vec![Action::MarkOr(self.ctx.mark)],
                    )
                    .comment("masquerade local traffic"),
                );
            }
            if cluster {
                self.pick(
                    e,
                    List::Cluster,
                    vec![Match::FibSaddrLocal],
                    &mut rules,
                    out,
                );
                if let Some(last) = rules.last_mut() {
                    last.comment = Some("short-circuit local traffic".to_owned());
                }
            }
            if !entry.local_endpoints.is_empty() {
                self.pick(e, List::Local, vec![], &mut rules, out);
            }
        } else if !entry.endpoints_for(external).is_empty() {
            self.pick(e, list_of(external), vec![], &mut rules, out);
        }
        rules
    }

    /// Appends the rule that sends traffic matching `when` to one of the endpoints of
    /// `list`, and creates what it needs (once per list): the `slot : endpoint` map,
    /// or, with ClientIP affinity, the sticky chain, its dynamic map and one chain per
    /// endpoint.
    fn pick(
        &self,
        e: &Entry<'_>,
        list: List,
        when: Vec<Match>,
        rules: &mut Vec<Rule>,
        out: &mut EntryObjects,
    ) {
        let endpoints = parse_endpoints(match list {
            List::Cluster => &e.e.cluster_endpoints,
            List::Local => &e.e.local_endpoints,
        });
        let n = endpoints.len() as u32;
        if n == 0 {
            return;
        }
        let Some(affinity) = e.e.session_affinity else {
            let map = names::endpoints_map(&e.id, list);
            let mut matches = when;
            matches.push(Match::L4Proto(e.proto));
            rules.push(Rule::new(
                matches,
                vec![Action::DnatBySlot {
                    map: map.clone(),
                    modulus: n,
                }],
            ));
            if !out.sets.iter().any(|(s, _)| s.name == map) {
                let elements = endpoints
                    .iter()
                    .zip(0u32..)
                    .map(|((ip, port), slot)| {
                        (
                            slot.to_ne_bytes().to_vec(),
                            Some(Data::Value(addr_port_bytes(*ip, *port))),
                        )
                    })
                    .collect();
                out.sets
                    .push((SetDef::new(map, SetKind::BackendsBySlot(e.proto)), elements));
            }
            return;
        };
        let sticky = names::affinity_chain(&e.id, list);
        rules.push(Rule::new(
            when,
            vec![Action::Verdict(Verdict::Goto(sticky.clone()))],
        ));
        if out.chains.iter().any(|c| c.name == sticky) {
            return;
        }
        let aff = names::affinity_map(&e.id, list, affinity.timeout_seconds);
        let slots = names::slots_map(&e.id, list);
        out.chains.push(chain(
            sticky,
            vec![
                Rule::new(
                    vec![Match::SaddrIn(aff.clone()), Match::L4Proto(e.proto)],
                    vec![
                        Action::AffinityRefresh(aff.clone()),
                        Action::DnatByAffinity(aff.clone()),
                    ],
                ),
                Rule::new(
                    vec![],
                    vec![Action::PickBySlot {
                        map: slots.clone(),
                        modulus: n,
                    }],
                ),
            ],
        ));
        let mut slot_elements = Vec::with_capacity(endpoints.len());
        for (slot, (ip, port)) in endpoints.iter().enumerate() {
            let name = names::endpoint_chain(&e.id, list, slot);
            out.chains.push(chain(
                name.clone(),
                vec![
                    Rule::new(
                        vec![],
                        vec![Action::AffinityRecord {
                            map: aff.clone(),
                            addr: *ip,
                            port: *port,
                        }],
                    ),
                    Rule::new(
                        vec![Match::L4Proto(e.proto)],
                        vec![Action::DnatTo {
                            addr: *ip,
                            port: *port,
                        }],
                    ),
                ],
            ));
            slot_elements.push((
                (slot as u32).to_ne_bytes().to_vec(),
                Some(Data::Verdict(Verdict::Goto(name))),
            ));
        }
        out.sets.push((
            SetDef::new(
                aff,
                SetKind::Affinity {
                    timeout_seconds: affinity.timeout_seconds,
                },
            ),
            Vec::new(),
        ));
        out.sets
            .push((SetDef::new(slots, SetKind::SlotVerdicts), slot_elements));
    }
}

fn list_of(traffic: &TrafficPlan) -> List {
    match traffic.policy {
        TrafficPolicy::Cluster => List::Cluster,
        TrafficPolicy::Local => List::Local,
    }
}

fn goto(chain: String) -> DestValue {
    DestValue {
        verdict: Verdict::Goto(chain),
        shared: None,
        backends: Vec::new(),
    }
}

fn shared(balance: Balance, masquerade: Masquerade, endpoints: &[Endpoint]) -> DestValue {
    let backends = parse_endpoints(endpoints);
    let chain = SharedChain {
        balance,
        masquerade,
        endpoints: backends.len() as u32,
    };
    DestValue {
        verdict: Verdict::Goto(chain.name()),
        shared: Some(chain),
        backends,
    }
}

/// The dynamic affinity maps of `entry` (none without ClientIP affinity) and, for each,
/// the data its elements may hold: its list's endpoints. Elements with other data
/// remember an endpoint that is gone.
#[must_use]
pub fn affinity_maps(entry: &ServicePortPlan) -> Vec<(String, Vec<Vec<u8>>)> {
    let Some(affinity) = entry.session_affinity else {
        return Vec::new();
    };
    let id = names::entry_id(entry);
    [
        (List::Cluster, &entry.cluster_endpoints),
        (List::Local, &entry.local_endpoints),
    ]
    .into_iter()
    .map(|(list, endpoints)| {
        let data = parse_endpoints(endpoints)
            .into_iter()
            .map(|(ip, port)| addr_port_bytes(ip, port))
            .collect();
        (
            names::affinity_map(&id, list, affinity.timeout_seconds),
            data,
        )
    })
    .collect()
}
