//! The table's fixed shape: its sets and maps and what they hold, its base chains and
//! the chains every table has, the shared balancing chains, and the node's inputs they
//! are rendered from ([`FamilyContext`]).
//!
//! ```text
//! nat-prerouting, nat-output ─▶ services: ip daddr . proto . port vmap @service-ips
//!                                         node-port addresses: proto . port vmap @service-nodeports
//!     service-ips ─▶ goto lb-N[-masq…]: dnat to ip daddr . th dport . numgen random mod N map @backends-P-N[-masq…]
//!                 └▶ goto service-…/external-… (ClientIP affinity, Local policy): own chains and maps
//! nat-postrouting ─▶ masquerading: hairpin → mark; marked → masquerade
//! filter-*-pre-dnat (−110) ─▶ firewall-check: @firewall-ips → firewall-… (source ranges)
//! filter-input/forward/output ─▶ service-endpoints-check (@no-endpoint-services), nodeport-
//!                                endpoints-check (@no-endpoint-nodeports), cluster-ips-check
//! ```

use std::net::IpAddr;

use super::names::{self, Balance, Masquerade, SharedChain};
use super::rules::{Action, Match, Net, Rule};
use crate::kernel::Family;
use crate::kernel::nftables::uapi::*;
use crate::kernel::nftables::{Hook, Set, Verdict};

/// How the node tells traffic from inside the cluster, for one family.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LocalTraffic {
    /// Sources inside this prefix.
    Prefix(Net),
    /// Packets that came in on this interface, or on any whose name starts with it.
    Interface {
        /// The name or prefix.
        name: String,
        /// Whether it is a prefix (`iifname "veth*"`).
        prefix: bool,
    },
}

impl LocalTraffic {
    /// The match for traffic from inside the cluster (`negate`: from outside).
    #[must_use]
    pub fn matching(&self, negate: bool) -> Match {
        match self {
            Self::Prefix(net) => Match::Saddr { net: *net, negate },
            Self::Interface { name, prefix } => Match::Iifname {
                name: name.clone(),
                prefix: *prefix,
                negate,
            },
        }
    }
}

/// Everything besides the entries that one family's table is rendered from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FamilyContext {
    /// The family.
    pub family: Family,
    /// The masquerade mark (`1 << --masquerade-bit`).
    pub mark: u32,
    /// Local-traffic detection, if on for this family.
    pub local: Option<LocalTraffic>,
    /// `--nodeport-addresses` of this family; empty: every local address.
    pub nodeport_nets: Vec<Net>,
    /// The cluster's Service CIDRs of this family: traffic to an unallocated cluster IP
    /// in them is dropped.
    pub service_cidrs: Vec<Net>,
    /// The node's addresses of this family.
    pub node_addresses: Vec<IpAddr>,
    /// Drop forwarded packets in conntrack state invalid.
    pub drop_invalid: bool,
}

impl FamilyContext {
    fn loopback(&self) -> Net {
        match self.family {
            Family::V4 => Net {
                addr: IpAddr::from([127, 0, 0, 0]),
                len: 8,
            },
            Family::V6 => Net::host(IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1])),
        }
    }

    /// The matches of the destinations that accept node ports: the node's own
    /// addresses (inside `--nodeport-addresses`), never loopback (as kube-proxy's
    /// nftables mode: a pod cannot answer 127.0.0.1 and the agent never sets
    /// `route_localnet`). One list per rule.
    #[must_use]
    pub fn nodeport_destinations(&self) -> Vec<Vec<Match>> {
        let not_loopback = Match::Daddr {
            net: self.loopback(),
            negate: true,
        };
        if self.nodeport_nets.is_empty() {
            return vec![vec![Match::FibDaddrLocal, not_loopback]];
        }
        self.nodeport_nets
            .iter()
            .map(|net| {
                vec![
                    Match::FibDaddrLocal,
                    Match::Daddr {
                        net: *net,
                        negate: false,
                    },
                    not_loopback.clone(),
                ]
            })
            .collect()
    }
}

/// The shapes of the table's sets and maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetKind {
    /// `type ADDR . inet_proto . inet_service : verdict`.
    VerdictByAddress,
    /// `type inet_proto . inet_service : verdict`.
    VerdictByPort,
    /// `type ADDR`.
    Addresses,
    /// `type ADDR . ADDR . inet_proto . inet_service`.
    Hairpin,
    /// `typeof ip daddr . P dport . numgen random mod 1 : ip daddr . P dport`.
    BackendsByAddress(u8),
    /// `typeof P dport . numgen random mod 1 : ip daddr . P dport`.
    BackendsByPort(u8),
    /// `typeof numgen random mod 1 : ip daddr . P dport`.
    BackendsBySlot(u8),
    /// `typeof numgen random mod 1 : verdict`.
    SlotVerdicts,
    /// `type ADDR : ADDR . inet_service; flags dynamic,timeout; timeout Ns`.
    Affinity {
        /// The timeout in seconds.
        timeout_seconds: u32,
    },
}

/// A set or map of the table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetDef {
    /// Its name.
    pub name: String,
    /// Its shape.
    pub kind: SetKind,
}

/// A chain of the table, with its rules.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChainDef {
    /// Its name.
    pub name: String,
    /// Where a base chain is hooked.
    pub hook: Option<Hook>,
    /// Its rules, in order.
    pub rules: Vec<Rule>,
}

/// Bytes of an address of `family`.
#[must_use]
pub fn addr_len(family: Family) -> u32 {
    match family {
        Family::V4 => 4,
        Family::V6 => 16,
    }
}

fn concat(types: &[u32]) -> u32 {
    types.iter().fold(0, |acc, t| (acc << TYPE_BITS) | t)
}

// ---- nft's typeof userdata (so `nft list` prints the maps as it would its own) ---------

fn tlv(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    out.push(kind);
    out.push(value.len() as u8);
    out.extend_from_slice(value);
}

fn tlv_u32(out: &mut Vec<u8>, kind: u8, v: u32) {
    tlv(out, kind, &v.to_ne_bytes());
}

/// An expression of a typeof: its nft expression type (`EXPR_*`) and data.
fn typeof_expr(expr_type: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    tlv_u32(&mut out, 0, expr_type);
    tlv(&mut out, 1, data);
    out
}

/// `ip daddr`, `ip6 daddr`, `tcp dport`...: nft's payload description and field.
fn typeof_payload(desc: u32, field: u32) -> Vec<u8> {
    let mut data = Vec::new();
    tlv_u32(&mut data, 0, desc);
    tlv_u32(&mut data, 1, field);
    typeof_expr(7, &data)
}

fn typeof_daddr(family: Family) -> Vec<u8> {
    match family {
        Family::V4 => typeof_payload(12, 12),
        Family::V6 => typeof_payload(13, 9),
    }
}

fn typeof_dport(proto: u8) -> Vec<u8> {
    let desc = match proto {
        17 => 6,
        132 => 10,
        _ => 8,
    };
    typeof_payload(desc, 2)
}

fn typeof_numgen() -> Vec<u8> {
    let mut data = Vec::new();
    tlv_u32(&mut data, 0, NFT_NG_RANDOM);
    tlv_u32(&mut data, 1, 1);
    tlv_u32(&mut data, 2, 0);
    typeof_expr(23, &data)
}

fn typeof_concat(items: &[Vec<u8>]) -> Vec<u8> {
    if let [one] = items {
        return one.clone();
    }
    let mut data = Vec::new();
    for (i, item) in items.iter().enumerate() {
        tlv(&mut data, i as u8, item);
    }
    typeof_expr(13, &data)
}

fn typeof_verdict() -> Vec<u8> {
    typeof_expr(1, &[])
}

/// nft's userdata for a set declared with `typeof KEY : DATA`.
fn typeof_userdata(key: &[Vec<u8>], data: &[u8], key_host_order: bool) -> Vec<u8> {
    let mut out = Vec::new();
    tlv_u32(
        &mut out,
        NFTNL_UDATA_SET_KEYBYTEORDER,
        u32::from(key_host_order),
    );
    tlv_u32(&mut out, NFTNL_UDATA_SET_DATABYTEORDER, 0);
    tlv(&mut out, 3, &typeof_concat(key));
    tlv(&mut out, 4, data);
    tlv_u32(&mut out, 6, 0);
    out
}

/// nft's userdata for a set declared with `type`: the key's byte order (2: network),
/// and an empty concatenation marker for a concatenated key or data (nft cannot print
/// concatenated data without it).
fn type_userdata(key_byteorder: u32, concat_key: bool, concat_data: bool) -> Vec<u8> {
    let mut out = Vec::new();
    tlv_u32(&mut out, NFTNL_UDATA_SET_KEYBYTEORDER, key_byteorder);
    tlv_u32(&mut out, NFTNL_UDATA_SET_DATABYTEORDER, 0);
    let marker = typeof_expr(13, &[]);
    if concat_key {
        tlv(&mut out, 3, &marker);
    }
    if concat_data {
        tlv(&mut out, 4, &marker);
    }
    tlv_u32(&mut out, 6, 0);
    out
}

impl SetDef {
    /// A set of `kind` called `name`.
    #[must_use]
    pub fn new(name: impl Into<String>, kind: SetKind) -> Self {
        Self {
            name: name.into(),
            kind,
        }
    }

    /// Whether its elements are the packet path's (affinity): never compared or read.
    #[must_use]
    pub fn dynamic(&self) -> bool {
        matches!(self.kind, SetKind::Affinity { .. })
    }

    /// Whether it is a verdict map.
    #[must_use]
    pub fn verdicts(&self) -> bool {
        matches!(
            self.kind,
            SetKind::VerdictByAddress | SetKind::VerdictByPort | SetKind::SlotVerdicts
        )
    }

    /// The set as the kernel takes it, in `family`'s table.
    #[must_use]
    pub fn kernel(&self, family: Family) -> Set {
        let a = addr_len(family);
        let addr_type = match family {
            Family::V4 => TYPE_IPADDR,
            Family::V6 => TYPE_IP6ADDR,
        };
        let ep_type = concat(&[addr_type, TYPE_INET_SERVICE]);
        let mut set = Set {
            family: match family {
                Family::V4 => NFPROTO_IPV4,
                Family::V6 => NFPROTO_IPV6,
            },
            table: names::TABLE.to_owned(),
            name: self.name.clone(),
            flags: 0,
            key_type: 0,
            key_len: 0,
            data_type: None,
            data_len: None,
            timeout_ms: None,
            size: None,
            set_id: None,
            userdata: None,
        };
        match self.kind {
            SetKind::VerdictByAddress => {
                set.flags = NFT_SET_MAP;
                set.key_type = concat(&[addr_type, TYPE_INET_PROTOCOL, TYPE_INET_SERVICE]);
                set.key_len = a + 8;
                set.data_type = Some(NFT_DATA_VERDICT);
            }
            SetKind::VerdictByPort => {
                set.flags = NFT_SET_MAP;
                set.key_type = concat(&[TYPE_INET_PROTOCOL, TYPE_INET_SERVICE]);
                set.key_len = 8;
                set.data_type = Some(NFT_DATA_VERDICT);
            }
            SetKind::Addresses => {
                set.key_type = addr_type;
                set.key_len = a;
            }
            SetKind::Hairpin => {
                set.key_type =
                    concat(&[addr_type, addr_type, TYPE_INET_PROTOCOL, TYPE_INET_SERVICE]);
                set.key_len = 2 * a + 8;
            }
            SetKind::BackendsByAddress(p)
            | SetKind::BackendsByPort(p)
            | SetKind::BackendsBySlot(p) => {
                set.flags = NFT_SET_MAP;
                set.data_type = Some(ep_type);
                set.data_len = Some(a + 4);
                let data = typeof_concat(&[typeof_daddr(family), typeof_dport(p)]);
                let (key_type, key_len, key, host) = match self.kind {
                    SetKind::BackendsByAddress(_) => (
                        concat(&[addr_type, TYPE_INET_SERVICE, TYPE_INTEGER]),
                        a + 8,
                        vec![typeof_daddr(family), typeof_dport(p), typeof_numgen()],
                        false,
                    ),
                    SetKind::BackendsByPort(_) => (
                        concat(&[TYPE_INET_SERVICE, TYPE_INTEGER]),
                        8,
                        vec![typeof_dport(p), typeof_numgen()],
                        false,
                    ),
                    _ => (TYPE_INTEGER, 4, vec![typeof_numgen()], true),
                };
                set.key_type = key_type;
                set.key_len = key_len;
                set.userdata = Some(typeof_userdata(&key, &data, host));
            }
            SetKind::SlotVerdicts => {
                set.flags = NFT_SET_MAP;
                set.key_type = TYPE_INTEGER;
                set.key_len = 4;
                set.data_type = Some(NFT_DATA_VERDICT);
                set.userdata = Some(typeof_userdata(&[typeof_numgen()], &typeof_verdict(), true));
            }
            SetKind::Affinity { timeout_seconds } => {
                set.flags = NFT_SET_MAP | NFT_SET_TIMEOUT | NFT_SET_EVAL;
                set.key_type = addr_type;
                set.key_len = a;
                set.data_type = Some(ep_type);
                set.data_len = Some(a + 4);
                // The kernel sizes a dynamic set itself (65,535), as for nft's.
                set.timeout_ms = Some(u64::from(timeout_seconds) * 1000);
                set.userdata = Some(type_userdata(2, false, true));
            }
        }
        set
    }
}

/// A base chain.
fn base(name: &str, chain_type: &str, hooknum: u32, priority: i32, rules: Vec<Rule>) -> ChainDef {
    ChainDef {
        name: name.to_owned(),
        hook: Some(Hook {
            chain_type: chain_type.to_owned(),
            hooknum,
            priority,
        }),
        rules,
    }
}

/// A regular chain.
#[must_use]
pub fn chain(name: impl Into<String>, rules: Vec<Rule>) -> ChainDef {
    ChainDef {
        name: name.into(),
        hook: None,
        rules,
    }
}

fn jump_if_new(chain: &str) -> Rule {
    Rule::new(
        vec![Match::CtStateNew],
        vec![Action::Verdict(Verdict::Jump(chain.to_owned()))],
    )
}

fn jump(chain: &str) -> Rule {
    Rule::new(
        vec![],
        vec![Action::Verdict(Verdict::Jump(chain.to_owned()))],
    )
}

/// The sets and maps every table has.
#[must_use]
pub fn fixed_sets() -> Vec<SetDef> {
    vec![
        SetDef::new(names::SERVICE_IPS, SetKind::VerdictByAddress),
        SetDef::new(names::SERVICE_NODEPORTS, SetKind::VerdictByPort),
        SetDef::new(names::NO_ENDPOINT_SERVICES, SetKind::VerdictByAddress),
        SetDef::new(names::NO_ENDPOINT_NODEPORTS, SetKind::VerdictByPort),
        SetDef::new(names::FIREWALL_IPS, SetKind::VerdictByAddress),
        SetDef::new(names::CLUSTER_IPS, SetKind::Addresses),
        SetDef::new(names::HAIRPIN, SetKind::Hairpin),
    ]
}

/// The maps of a shared balancing chain, one per protocol.
#[must_use]
pub fn shared_sets(shared: SharedChain) -> Vec<SetDef> {
    names::PROTOCOLS
        .iter()
        .map(|&p| {
            let kind = match shared.balance {
                Balance::Address => SetKind::BackendsByAddress(p),
                Balance::NodePort => SetKind::BackendsByPort(p),
            };
            SetDef::new(shared.backends(p), kind)
        })
        .collect()
}

/// The chains every table has, with their rules.
#[must_use]
pub fn fixed_chains(ctx: &FamilyContext) -> Vec<ChainDef> {
    use names::*;
    let mark = ctx.mark;
    let nodeport = |action: Action| -> Vec<Rule> {
        ctx.nodeport_destinations()
            .into_iter()
            .map(|m| Rule::new(m, vec![action.clone()]))
            .collect()
    };
    let mut services = vec![Rule::new(
        vec![],
        vec![Action::DispatchByDestination(SERVICE_IPS.to_owned())],
    )];
    services.extend(nodeport(Action::DispatchByPort(
        SERVICE_NODEPORTS.to_owned(),
    )));
    let mut cluster_ips = vec![
        Rule::new(
            vec![Match::DaddrIn(CLUSTER_IPS.to_owned())],
            vec![Action::Reject],
        )
        .comment("Reject traffic to invalid ports of ClusterIPs"),
    ];
    for net in &ctx.service_cidrs {
        cluster_ips.push(
            Rule::new(
                vec![Match::Daddr {
                    net: *net,
                    negate: false,
                }],
                vec![Action::Verdict(Verdict::Drop)],
            )
            .comment("Drop traffic to unallocated ClusterIPs"),
        );
    }
    let mut forward = Vec::new();
    if ctx.drop_invalid {
        forward.push(
            Rule::new(
                vec![Match::CtStateInvalid],
                vec![Action::Verdict(Verdict::Drop)],
            )
            .comment("Drop packets conntrack finds invalid"),
        );
    }
    forward.extend([
        jump_if_new(SERVICE_ENDPOINTS_CHECK),
        jump_if_new(CLUSTER_IPS_CHECK),
    ]);
    vec![
        base(
            FILTER_PREROUTING_PRE_DNAT,
            "filter",
            NF_INET_PRE_ROUTING,
            -110,
            vec![jump_if_new(FIREWALL_CHECK)],
        ),
        base(
            FILTER_OUTPUT_PRE_DNAT,
            "filter",
            NF_INET_LOCAL_OUT,
            -110,
            vec![jump_if_new(FIREWALL_CHECK)],
        ),
        base(FILTER_FORWARD, "filter", NF_INET_FORWARD, 0, forward),
        base(
            FILTER_INPUT,
            "filter",
            NF_INET_LOCAL_IN,
            0,
            vec![
                jump_if_new(NODEPORT_ENDPOINTS_CHECK),
                jump_if_new(SERVICE_ENDPOINTS_CHECK),
            ],
        ),
        base(
            FILTER_OUTPUT,
            "filter",
            NF_INET_LOCAL_OUT,
            0,
            vec![
                jump_if_new(SERVICE_ENDPOINTS_CHECK),
                jump_if_new(CLUSTER_IPS_CHECK),
            ],
        ),
        base(
            NAT_PREROUTING,
            "nat",
            NF_INET_PRE_ROUTING,
            -100,
            vec![jump(SERVICES)],
        ),
        base(
            NAT_OUTPUT,
            "nat",
            NF_INET_LOCAL_OUT,
            -100,
            vec![jump(SERVICES)],
        ),
        base(
            NAT_POSTROUTING,
            "nat",
            NF_INET_POST_ROUTING,
            100,
            vec![jump(MASQUERADING)],
        ),
        chain(
            FIREWALL_CHECK,
            vec![Rule::new(
                vec![],
                vec![Action::DispatchByDestination(FIREWALL_IPS.to_owned())],
            )],
        ),
        chain(
            SERVICE_ENDPOINTS_CHECK,
            vec![Rule::new(
                vec![],
                vec![Action::DispatchByDestination(
                    NO_ENDPOINT_SERVICES.to_owned(),
                )],
            )],
        ),
        chain(
            NODEPORT_ENDPOINTS_CHECK,
            nodeport(Action::DispatchByPort(NO_ENDPOINT_NODEPORTS.to_owned())),
        ),
        chain(CLUSTER_IPS_CHECK, cluster_ips),
        chain(REJECT_CHAIN, vec![Rule::new(vec![], vec![Action::Reject])]),
        chain(SERVICES, services),
        chain(
            MASQUERADING,
            vec![
                Rule::new(
                    vec![Match::CtStatusDnat, Match::Hairpin(HAIRPIN.to_owned())],
                    vec![Action::MarkOr(mark)],
                )
                .comment("hairpin: an endpoint reaching itself through its Service"),
                Rule::new(
                    vec![Match::MarkClear(mark)],
                    vec![Action::Verdict(Verdict::Return)],
                ),
                Rule::new(vec![], vec![Action::MarkXor(mark)]),
                Rule::new(vec![], vec![Action::Masquerade]),
            ],
        ),
    ]
}

/// The rule that marks for masquerade as `masquerade` says, if it marks at all.
#[must_use]
pub fn masquerade_rule(masquerade: Masquerade, ctx: &FamilyContext) -> Option<Rule> {
    match masquerade {
        Masquerade::None => None,
        Masquerade::All => Some(Rule::new(vec![], vec![Action::MarkOr(ctx.mark)])),
        Masquerade::NotLocal => ctx
            .local
            .as_ref()
            .map(|local| Rule::new(vec![local.matching(true)], vec![Action::MarkOr(ctx.mark)])),
    }
}

/// A shared balancing chain: the masquerade mark, then one DNAT rule per protocol.
#[must_use]
pub fn shared_chain(shared: SharedChain, ctx: &FamilyContext) -> ChainDef {
    let mut rules: Vec<Rule> = masquerade_rule(shared.masquerade, ctx)
        .into_iter()
        .collect();
    for p in names::PROTOCOLS {
        let action = match shared.balance {
            Balance::Address => Action::DnatByDestination {
                map: shared.backends(p),
                modulus: shared.endpoints,
            },
            Balance::NodePort => Action::DnatByPort {
                map: shared.backends(p),
                modulus: shared.endpoints,
            },
        };
        rules.push(Rule::new(vec![Match::L4Proto(p)], vec![action]));
    }
    chain(shared.name(), rules)
}
