//! Rules as data: what a rule matches and what it does, in the few shapes the nftables
//! mode writes. [`Rule::expressions`] lowers a rule to the kernel's expressions (the ones
//! `nft` 1.0.6 generates for the same rule), [`RuleText`] spells it as `nft` does, and
//! the tracer (`trace.rs`) runs it on a packet.

use std::fmt::{self, Display, Write as _};
use std::net::IpAddr;

use crate::kernel::Family;
use crate::kernel::nftables::uapi::*;
use crate::kernel::nftables::{Data, Expr, Verdict};

/// An address prefix: `10.244.0.0/16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Net {
    /// The network address.
    pub addr: IpAddr,
    /// The prefix length.
    pub len: u8,
}

impl Net {
    /// `text` (`10.244.0.0/16`, or an address alone) if it is one.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        let (addr, len) = match text.split_once('/') {
            Some((a, l)) => (a.parse().ok()?, l.parse().ok()?),
            None => {
                let addr: IpAddr = text.parse().ok()?;
                (addr, if addr.is_ipv4() { 32 } else { 128 })
            }
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (len <= max).then_some(Self { addr, len })
    }

    /// The whole address as a prefix.
    #[must_use]
    pub fn host(addr: IpAddr) -> Self {
        Self {
            addr,
            len: if addr.is_ipv4() { 32 } else { 128 },
        }
    }

    /// The address bytes, host bits cleared.
    fn masked_bytes(&self) -> Vec<u8> {
        let mut bytes = addr_bytes(self.addr);
        for (i, byte) in bytes.iter_mut().enumerate() {
            let bits = usize::from(self.len).saturating_sub(i * 8).min(8);
            *byte &= (0xff_u16 << (8 - bits)) as u8;
        }
        bytes
    }

    /// Whether `ip` is inside.
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.addr.is_ipv4()
            && Self {
                addr: ip,
                len: self.len,
            }
            .masked_bytes()
                == self.masked_bytes()
    }
}

impl Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.len == full {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.len)
        }
    }
}

/// An address's bytes in network order.
#[must_use]
pub fn addr_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// An address and a port as a concatenation's register bytes: the address, then the
/// port in network order padded to 4 bytes.
#[must_use]
pub fn addr_port_bytes(ip: IpAddr, port: u16) -> Vec<u8> {
    let mut out = addr_bytes(ip);
    out.extend_from_slice(&port.to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out
}

/// A transport protocol number.
#[must_use]
pub fn proto_name(proto: u8) -> &'static str {
    match proto {
        6 => "tcp",
        17 => "udp",
        132 => "sctp",
        _ => "unknown",
    }
}

/// What a rule matches (every match must hold).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    /// `ct state new`.
    CtStateNew,
    /// `ct state invalid`.
    CtStateInvalid,
    /// `ct status dnat`.
    CtStatusDnat,
    /// `ip saddr [!=] NET`.
    Saddr {
        /// The prefix.
        net: Net,
        /// `!=`.
        negate: bool,
    },
    /// `ip daddr [!=] NET`.
    Daddr {
        /// The prefix.
        net: Net,
        /// `!=`.
        negate: bool,
    },
    /// `iifname [!=] "NAME"` or, with `prefix`, `iifname [!=] "NAME*"`.
    Iifname {
        /// The name or prefix.
        name: String,
        /// Whether `name` is a prefix.
        prefix: bool,
        /// `!=`.
        negate: bool,
    },
    /// `fib saddr type local`: the source is one of the node's addresses.
    FibSaddrLocal,
    /// `fib daddr type local`: the destination is one of the node's addresses.
    FibDaddrLocal,
    /// `meta l4proto P`.
    L4Proto(u8),
    /// `ip daddr @SET`.
    DaddrIn(String),
    /// `ip saddr @SET`.
    SaddrIn(String),
    /// `meta mark & BIT == 0`.
    MarkClear(u32),
    /// `ip saddr . ip daddr . meta l4proto . th dport @SET`: the packet, after DNAT, goes
    /// back to where it came from.
    Hairpin(String),
}

/// What a rule does, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// `meta mark set meta mark | BIT`.
    MarkOr(u32),
    /// `meta mark set meta mark ^ BIT`.
    MarkXor(u32),
    /// `masquerade fully-random`.
    Masquerade,
    /// `reject` (ICMP port unreachable).
    Reject,
    /// `accept`, `drop`, `return`, `jump C`, `goto C`.
    Verdict(Verdict),
    /// `ip daddr . meta l4proto . th dport vmap @MAP`.
    DispatchByDestination(String),
    /// `meta l4proto . th dport vmap @MAP`.
    DispatchByPort(String),
    /// `dnat to ip daddr . th dport . numgen random mod N map @MAP`.
    DnatByDestination {
        /// The map.
        map: String,
        /// N.
        modulus: u32,
    },
    /// `dnat to th dport . numgen random mod N map @MAP`.
    DnatByPort {
        /// The map.
        map: String,
        /// N.
        modulus: u32,
    },
    /// `dnat to numgen random mod N map @MAP`.
    DnatBySlot {
        /// The map.
        map: String,
        /// N.
        modulus: u32,
    },
    /// `numgen random mod N vmap @MAP`.
    PickBySlot {
        /// The verdict map.
        map: String,
        /// N.
        modulus: u32,
    },
    /// `update @MAP { ip saddr : 0.0.0.0 . 0 }`: restarts the timeout of the client's
    /// element (an existing element keeps its data).
    AffinityRefresh(String),
    /// `dnat to ip saddr map @MAP`: to the endpoint the client had.
    DnatByAffinity(String),
    /// `update @MAP { ip saddr : EP . PORT }`: remembers the client's endpoint.
    AffinityRecord {
        /// The dynamic map.
        map: String,
        /// The endpoint's address.
        addr: IpAddr,
        /// Its port.
        port: u16,
    },
    /// `dnat to EP:PORT`.
    DnatTo {
        /// The endpoint's address.
        addr: IpAddr,
        /// Its port.
        port: u16,
    },
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// What it matches.
    pub matches: Vec<Match>,
    /// What it does.
    pub actions: Vec<Action>,
    /// Its comment (nft's rule userdata), if any.
    pub comment: Option<String>,
}

impl Rule {
    /// A rule with these matches and actions and no comment.
    #[must_use]
    pub fn new(matches: Vec<Match>, actions: Vec<Action>) -> Self {
        Self {
            matches,
            actions,
            comment: None,
        }
    }

    /// The same rule with a comment.
    #[must_use]
    pub fn comment(mut self, comment: impl Into<String>) -> Self {
        self.comment = Some(comment.into());
        self
    }

    /// The chains this rule's verdicts name.
    pub fn chains(&self) -> impl Iterator<Item = &str> {
        self.actions.iter().filter_map(|a| match a {
            Action::Verdict(v) => v.chain(),
            _ => None,
        })
    }

    /// The sets and maps this rule uses.
    pub fn sets(&self) -> impl Iterator<Item = &str> {
        let from_matches = self.matches.iter().filter_map(|m| match m {
            Match::DaddrIn(s) | Match::SaddrIn(s) | Match::Hairpin(s) => Some(s.as_str()),
            _ => None,
        });
        let from_actions = self.actions.iter().filter_map(|a| match a {
            Action::DispatchByDestination(m)
            | Action::DispatchByPort(m)
            | Action::AffinityRefresh(m)
            | Action::DnatByAffinity(m)
            | Action::DnatByDestination { map: m, .. }
            | Action::DnatByPort { map: m, .. }
            | Action::DnatBySlot { map: m, .. }
            | Action::PickBySlot { map: m, .. }
            | Action::AffinityRecord { map: m, .. } => Some(m.as_str()),
            _ => None,
        });
        from_matches.chain(from_actions)
    }

    /// The kernel's expressions for this rule in a table of `family`.
    #[must_use]
    pub fn expressions(&self, family: Family) -> Vec<Expr> {
        let mut out = Vec::new();
        let f = Fam(family);
        for m in &self.matches {
            f.lower_match(m, &mut out);
        }
        for a in &self.actions {
            f.lower_action(a, &mut out);
        }
        out
    }
}

/// The register of 32-bit register `index`, numbered as nft numbers them (and the
/// kernel dumps them): the 16-byte register (`NFT_REG_1`..`NFT_REG_4`) at a 16-byte
/// boundary, the 32-bit one (`NFT_REG32_01`, ...) otherwise.
fn reg(index: u32) -> u32 {
    if index.is_multiple_of(4) {
        NFT_REG_1 + index / 4
    } else {
        NFT_REG32_00 + index
    }
}

/// 32-bit registers a value of `len` bytes takes.
fn words(len: u32) -> u32 {
    len.div_ceil(4)
}

/// A family's offsets and numbers.
#[derive(Clone, Copy)]
struct Fam(Family);

impl Fam {
    fn addr_len(self) -> u32 {
        match self.0 {
            Family::V4 => 4,
            Family::V6 => 16,
        }
    }

    fn saddr_offset(self) -> u32 {
        match self.0 {
            Family::V4 => 12,
            Family::V6 => 8,
        }
    }

    fn daddr_offset(self) -> u32 {
        match self.0 {
            Family::V4 => 16,
            Family::V6 => 24,
        }
    }

    fn nfproto(self) -> u32 {
        u32::from(match self.0 {
            Family::V4 => NFPROTO_IPV4,
            Family::V6 => NFPROTO_IPV6,
        })
    }

    fn addr(self, offset: u32, len: u32, dreg: u32) -> Expr {
        Expr::Payload {
            dreg,
            base: NFT_PAYLOAD_NETWORK_HEADER,
            offset,
            len,
        }
    }

    fn dport(dreg: u32) -> Expr {
        Expr::Payload {
            dreg,
            base: NFT_PAYLOAD_TRANSPORT_HEADER,
            offset: 2,
            len: 2,
        }
    }

    fn numgen(dreg: u32, modulus: u32) -> Expr {
        Expr::Numgen {
            dreg,
            modulus,
            kind: NFT_NG_RANDOM,
            offset: 0,
        }
    }

    fn prefix(self, offset: u32, net: &Net, negate: bool, out: &mut Vec<Expr>) {
        let full = self.addr_len() * 8;
        let bits = u32::from(net.len).min(full);
        let op = if negate { NFT_CMP_NEQ } else { NFT_CMP_EQ };
        if bits == 0 {
            // Every address: `!= 0.0.0.0/0` matches nothing.
            out.push(self.addr(offset, 1, NFT_REG_1));
            out.push(Expr::Bitwise {
                sreg: NFT_REG_1,
                dreg: NFT_REG_1,
                op: None,
                len: 1,
                mask: vec![0],
                xor: vec![0],
            });
            out.push(Expr::Cmp {
                sreg: NFT_REG_1,
                op: if negate { NFT_CMP_NEQ } else { NFT_CMP_EQ },
                data: vec![0],
            });
            return;
        }
        // As nft: a byte-aligned prefix compares its bytes; another masks the whole
        // address first.
        let value = net.masked_bytes();
        if bits % 8 == 0 {
            let bytes = bits / 8;
            out.push(self.addr(offset, bytes, NFT_REG_1));
            out.push(Expr::Cmp {
                sreg: NFT_REG_1,
                op,
                data: value.get(..bytes as usize).unwrap_or_default().to_vec(),
            });
            return;
        }
        let len = self.addr_len();
        let mask = Net {
            addr: match self.0 {
                Family::V4 => IpAddr::from([0xff; 4]),
                Family::V6 => IpAddr::from([0xff; 16]),
            },
            len: net.len,
        }
        .masked_bytes();
        out.push(self.addr(offset, len, NFT_REG_1));
        out.push(Expr::Bitwise {
            sreg: NFT_REG_1,
            dreg: NFT_REG_1,
            op: None,
            len,
            mask,
            xor: vec![0; len as usize],
        });
        out.push(Expr::Cmp {
            sreg: NFT_REG_1,
            op,
            data: value,
        });
    }

    fn lower_match(self, m: &Match, out: &mut Vec<Expr>) {
        let r1 = NFT_REG_1;
        match m {
            Match::CtStateNew | Match::CtStateInvalid | Match::CtStatusDnat => {
                let (key, bit) = match m {
                    Match::CtStateNew => (NFT_CT_STATE, NF_CT_STATE_NEW_BIT),
                    Match::CtStateInvalid => (NFT_CT_STATE, NF_CT_STATE_INVALID_BIT),
                    _ => (NFT_CT_STATUS, IPS_DST_NAT),
                };
                out.push(Expr::Ct {
                    key,
                    dreg: r1,
                    direction: None,
                });
                out.push(Expr::Bitwise {
                    sreg: r1,
                    dreg: r1,
                    op: None,
                    len: 4,
                    mask: bit.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                });
                out.push(Expr::Cmp {
                    sreg: r1,
                    op: NFT_CMP_NEQ,
                    data: vec![0; 4],
                });
            }
            Match::Saddr { net, negate } => self.prefix(self.saddr_offset(), net, *negate, out),
            Match::Daddr { net, negate } => self.prefix(self.daddr_offset(), net, *negate, out),
            Match::Iifname {
                name,
                prefix,
                negate,
            } => {
                out.push(Expr::Meta {
                    key: NFT_META_IIFNAME,
                    dreg: r1,
                });
                let mut data = name.as_bytes().to_vec();
                if !prefix {
                    data.resize(16, 0);
                }
                out.push(Expr::Cmp {
                    sreg: r1,
                    op: if *negate { NFT_CMP_NEQ } else { NFT_CMP_EQ },
                    data,
                });
            }
            Match::FibSaddrLocal | Match::FibDaddrLocal => {
                let flags = if *m == Match::FibSaddrLocal {
                    NFTA_FIB_F_SADDR
                } else {
                    NFTA_FIB_F_DADDR
                };
                out.push(Expr::Fib {
                    dreg: r1,
                    result: NFT_FIB_RESULT_ADDRTYPE,
                    flags,
                });
                out.push(Expr::Cmp {
                    sreg: r1,
                    op: NFT_CMP_EQ,
                    data: RTN_LOCAL.to_ne_bytes().to_vec(),
                });
            }
            Match::L4Proto(p) => {
                out.push(Expr::Meta {
                    key: NFT_META_L4PROTO,
                    dreg: r1,
                });
                out.push(Expr::Cmp {
                    sreg: r1,
                    op: NFT_CMP_EQ,
                    data: vec![*p],
                });
            }
            Match::DaddrIn(set) | Match::SaddrIn(set) => {
                let offset = if matches!(m, Match::DaddrIn(_)) {
                    self.daddr_offset()
                } else {
                    self.saddr_offset()
                };
                out.push(self.addr(offset, self.addr_len(), r1));
                out.push(lookup(set, r1, None));
            }
            Match::MarkClear(bit) => {
                out.push(Expr::Meta {
                    key: NFT_META_MARK,
                    dreg: r1,
                });
                out.push(Expr::Bitwise {
                    sreg: r1,
                    dreg: r1,
                    op: Some(NFT_BITWISE_MASK_XOR),
                    len: 4,
                    mask: bit.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                });
                out.push(Expr::Cmp {
                    sreg: r1,
                    op: NFT_CMP_EQ,
                    data: vec![0; 4],
                });
            }
            Match::Hairpin(set) => {
                let a = words(self.addr_len());
                out.push(self.addr(self.saddr_offset(), self.addr_len(), reg(0)));
                out.push(self.addr(self.daddr_offset(), self.addr_len(), reg(a)));
                out.push(Expr::Meta {
                    key: NFT_META_L4PROTO,
                    dreg: reg(2 * a),
                });
                out.push(Self::dport(reg(2 * a + 1)));
                out.push(lookup(set, r1, None));
            }
        }
    }

    fn nat_from(self, addr_reg: u32, proto_reg: u32, flags: u32) -> Expr {
        Expr::Nat {
            kind: NFT_NAT_DNAT,
            family: self.nfproto(),
            addr: Some((addr_reg, addr_reg)),
            proto: Some((proto_reg, proto_reg)),
            flags,
        }
    }

    fn lower_action(self, a: &Action, out: &mut Vec<Expr>) {
        let r1 = NFT_REG_1;
        let aw = words(self.addr_len());
        match a {
            Action::MarkOr(bit) | Action::MarkXor(bit) => {
                let mask = if matches!(a, Action::MarkOr(_)) {
                    !bit
                } else {
                    u32::MAX
                };
                out.push(Expr::Meta {
                    key: NFT_META_MARK,
                    dreg: r1,
                });
                out.push(Expr::Bitwise {
                    sreg: r1,
                    dreg: r1,
                    op: Some(NFT_BITWISE_MASK_XOR),
                    len: 4,
                    mask: mask.to_ne_bytes().to_vec(),
                    xor: bit.to_ne_bytes().to_vec(),
                });
                out.push(Expr::MetaSet {
                    key: NFT_META_MARK,
                    sreg: r1,
                });
            }
            Action::Masquerade => out.push(Expr::Masq {
                flags: NF_NAT_RANGE_PROTO_RANDOM_FULLY,
            }),
            Action::Reject => out.push(Expr::Reject {
                kind: NFT_REJECT_ICMP_UNREACH,
                code: match self.0 {
                    Family::V4 => ICMP_PORT_UNREACH,
                    Family::V6 => ICMPV6_PORT_UNREACH,
                },
            }),
            Action::Verdict(v) => out.push(Expr::Immediate {
                dreg: NFT_REG_VERDICT,
                data: Data::Verdict(v.clone()),
            }),
            Action::DispatchByDestination(map) => {
                out.push(self.addr(self.daddr_offset(), self.addr_len(), reg(0)));
                out.push(Expr::Meta {
                    key: NFT_META_L4PROTO,
                    dreg: reg(aw),
                });
                out.push(Self::dport(reg(aw + 1)));
                out.push(lookup(map, r1, Some(NFT_REG_VERDICT)));
            }
            Action::DispatchByPort(map) => {
                out.push(Expr::Meta {
                    key: NFT_META_L4PROTO,
                    dreg: reg(0),
                });
                out.push(Self::dport(reg(1)));
                out.push(lookup(map, r1, Some(NFT_REG_VERDICT)));
            }
            Action::DnatByDestination { map, modulus } => {
                out.push(self.addr(self.daddr_offset(), self.addr_len(), reg(0)));
                out.push(Self::dport(reg(aw)));
                out.push(Self::numgen(reg(aw + 1), *modulus));
                out.push(lookup(map, r1, Some(r1)));
                out.push(self.nat_from(r1, reg(aw), 0));
            }
            Action::DnatByPort { map, modulus } => {
                out.push(Self::dport(reg(0)));
                out.push(Self::numgen(reg(1), *modulus));
                out.push(lookup(map, r1, Some(r1)));
                out.push(self.nat_from(r1, reg(aw), 0));
            }
            Action::DnatBySlot { map, modulus } => {
                out.push(Self::numgen(reg(0), *modulus));
                out.push(lookup(map, r1, Some(r1)));
                out.push(self.nat_from(r1, reg(aw), 0));
            }
            Action::PickBySlot { map, modulus } => {
                out.push(Self::numgen(reg(0), *modulus));
                out.push(lookup(map, r1, Some(NFT_REG_VERDICT)));
            }
            Action::AffinityRefresh(map) | Action::AffinityRecord { map, .. } => {
                // The data as nft writes it: the address and the port, one immediate
                // each in consecutive registers (nft prints nothing else).
                let (addr, port) = match a {
                    Action::AffinityRecord { addr, port, .. } => {
                        (addr_bytes(*addr), port.to_be_bytes().to_vec())
                    }
                    _ => (vec![0; self.addr_len() as usize], vec![0; 2]),
                };
                // The data from the second 16-byte register on, as nft puts it.
                out.push(self.addr(self.saddr_offset(), self.addr_len(), reg(0)));
                out.push(Expr::Immediate {
                    dreg: reg(4),
                    data: Data::Value(addr),
                });
                out.push(Expr::Immediate {
                    dreg: reg(4 + aw),
                    data: Data::Value(port),
                });
                out.push(Expr::Dynset {
                    set: map.clone(),
                    set_id: None,
                    op: NFT_DYNSET_OP_UPDATE,
                    sreg_key: r1,
                    sreg_data: Some(reg(4)),
                    timeout_ms: None,
                });
            }
            Action::DnatByAffinity(map) => {
                out.push(self.addr(self.saddr_offset(), self.addr_len(), reg(0)));
                out.push(lookup(map, r1, Some(r1)));
                out.push(self.nat_from(r1, reg(aw), 0));
            }
            Action::DnatTo { addr, port } => {
                out.push(Expr::Immediate {
                    dreg: r1,
                    data: Data::Value(addr_bytes(*addr)),
                });
                out.push(Expr::Immediate {
                    dreg: reg(4),
                    data: Data::Value(port.to_be_bytes().to_vec()),
                });
                out.push(self.nat_from(r1, reg(4), NF_NAT_RANGE_PROTO_SPECIFIED));
            }
        }
    }
}

fn lookup(set: &str, sreg: u32, dreg: Option<u32>) -> Expr {
    Expr::Lookup {
        set: set.to_owned(),
        set_id: None,
        sreg,
        dreg,
        flags: 0,
    }
}

/// A rule spelled as `nft list` shows it, in a table of `family`.
pub struct RuleText<'a>(pub &'a Rule, pub Family);

impl Display for RuleText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ip = match self.1 {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        };
        let mut words: Vec<String> = Vec::new();
        for m in &self.0.matches {
            words.push(match m {
                Match::CtStateNew => "ct state new".to_owned(),
                Match::CtStateInvalid => "ct state invalid".to_owned(),
                Match::CtStatusDnat => "ct status dnat".to_owned(),
                Match::Saddr { net, negate } => {
                    format!("{ip} saddr {}{net}", if *negate { "!= " } else { "" })
                }
                Match::Daddr { net, negate } => {
                    format!("{ip} daddr {}{net}", if *negate { "!= " } else { "" })
                }
                Match::Iifname {
                    name,
                    prefix,
                    negate,
                } => format!(
                    "iifname {}\"{name}{}\"",
                    if *negate { "!= " } else { "" },
                    if *prefix { "*" } else { "" }
                ),
                Match::FibSaddrLocal => "fib saddr type local".to_owned(),
                Match::FibDaddrLocal => "fib daddr type local".to_owned(),
                Match::L4Proto(p) => format!("meta l4proto {}", proto_name(*p)),
                Match::DaddrIn(s) => format!("{ip} daddr @{s}"),
                Match::SaddrIn(s) => format!("{ip} saddr @{s}"),
                Match::MarkClear(bit) => format!("meta mark & {bit:#010x} == 0x00000000"),
                Match::Hairpin(s) => {
                    format!("{ip} saddr . {ip} daddr . meta l4proto . th dport @{s}")
                }
            });
        }
        for a in &self.0.actions {
            words.push(match a {
                Action::MarkOr(bit) => format!("meta mark set meta mark | {bit:#010x}"),
                Action::MarkXor(bit) => format!("meta mark set meta mark ^ {bit:#010x}"),
                Action::Masquerade => "masquerade fully-random".to_owned(),
                Action::Reject => "reject".to_owned(),
                Action::Verdict(v) => v.to_string(),
                Action::DispatchByDestination(m) => {
                    format!("{ip} daddr . meta l4proto . th dport vmap @{m}")
                }
                Action::DispatchByPort(m) => format!("meta l4proto . th dport vmap @{m}"),
                Action::DnatByDestination { map, modulus } => format!(
                    "dnat {ip} to {ip} daddr . th dport . numgen random mod {modulus} map @{map}"
                ),
                Action::DnatByPort { map, modulus } => {
                    format!("dnat {ip} to th dport . numgen random mod {modulus} map @{map}")
                }
                Action::DnatBySlot { map, modulus } => {
                    format!("dnat {ip} to numgen random mod {modulus} map @{map}")
                }
                Action::PickBySlot { map, modulus } => {
                    format!("numgen random mod {modulus} vmap @{map}")
                }
                Action::AffinityRefresh(m) => {
                    let zero = match self.1 {
                        Family::V4 => "0.0.0.0",
                        Family::V6 => "::",
                    };
                    format!("update @{m} {{ {ip} saddr : {zero} . 0 }}")
                }
                Action::DnatByAffinity(m) => format!("dnat {ip} to {ip} saddr map @{m}"),
                Action::AffinityRecord { map, addr, port } => {
                    format!("update @{map} {{ {ip} saddr : {addr} . {port} }}")
                }
                Action::DnatTo { addr, port } => match addr {
                    IpAddr::V4(_) => format!("dnat {ip} to {addr}:{port}"),
                    IpAddr::V6(_) => format!("dnat {ip} to [{addr}]:{port}"),
                },
            });
        }
        let mut text = words.join(" ");
        if let Some(comment) = &self.0.comment {
            let _ = write!(text, " comment \"{comment}\"");
        }
        f.write_str(&text)
    }
}
