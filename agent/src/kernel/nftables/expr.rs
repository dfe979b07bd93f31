//! Rule expressions and the data they carry, as typed values: encoded to the attributes
//! nft sends (in nft's attribute order, so captures of nft's requests re-encode byte for
//! byte) and decoded from requests and from the kernel's dumps.
//!
//! ```text
//! NFTA_RULE_EXPRESSIONS
//!   NFTA_LIST_ELEM                 one per expression
//!     NFTA_EXPR_NAME  "payload"    the expression type
//!     NFTA_EXPR_DATA  (nest)       its attributes, NFTA_PAYLOAD_* ...
//! ```
//!
//! The kernel dumps some attributes nft does not send (`NFTA_LOOKUP_FLAGS` 0, the NAT
//! flags its registers imply, `NFTA_DYNSET_TIMEOUT` 0); [`Expr::canonical`] maps both
//! forms to one value, so a rule read back compares equal to the rule that was sent.

use super::error::NftCodecError;
use super::uapi::*;
use super::wire::{Attrs, list, put_be32, put_be64, put_nest, put_str};
use crate::kernel::netlink::frame::put_attr;

type Result<T> = std::result::Result<T, NftCodecError>;

/// A verdict: in an `immediate` expression (the rule's outcome) or as a verdict map's
/// element data.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
    /// `continue`.
    Continue,
    /// `return`.
    Return,
    /// `jump CHAIN`.
    Jump(String),
    /// `goto CHAIN`.
    Goto(String),
}

impl Verdict {
    /// The verdict's code (`NF_ACCEPT`, `NFT_JUMP`, ...).
    #[must_use]
    pub fn code(&self) -> i32 {
        match self {
            Self::Accept => NF_ACCEPT,
            Self::Drop => NF_DROP,
            Self::Continue => NFT_CONTINUE,
            Self::Return => NFT_RETURN,
            Self::Jump(_) => NFT_JUMP,
            Self::Goto(_) => NFT_GOTO,
        }
    }

    /// The chain a jump or goto names.
    #[must_use]
    pub fn chain(&self) -> Option<&str> {
        match self {
            Self::Jump(c) | Self::Goto(c) => Some(c),
            _ => None,
        }
    }

    /// The verdict from its code and chain.
    ///
    /// # Errors
    /// An unknown code, or a jump/goto without a chain.
    pub fn from_code(code: i32, chain: Option<String>) -> Result<Self> {
        Ok(match (code, chain) {
            (NF_ACCEPT, _) => Self::Accept,
            (NF_DROP, _) => Self::Drop,
            (NFT_CONTINUE, _) => Self::Continue,
            (NFT_RETURN, _) => Self::Return,
            (NFT_JUMP, Some(c)) => Self::Jump(c),
            (NFT_GOTO, Some(c)) => Self::Goto(c),
            (NFT_JUMP | NFT_GOTO, None) => {
                return Err(NftCodecError::MissingAttribute("NFTA_VERDICT_CHAIN"));
            }
            (code, _) => return Err(NftCodecError::UnknownVerdict(code)),
        })
    }

    /// Appends the `NFTA_DATA_VERDICT` nest.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        put_nest(buf, NFTA_DATA_VERDICT, |b| {
            put_be32(b, NFTA_VERDICT_CODE, self.code() as u32);
            if let Some(chain) = self.chain() {
                put_str(b, NFTA_VERDICT_CHAIN, chain);
            }
        });
    }

    /// Reads an `NFTA_DATA_VERDICT` nest's value.
    ///
    /// # Errors
    /// Malformed attributes or an unknown code.
    pub fn decode(nest: &[u8]) -> Result<Self> {
        let attrs = Attrs::parse(nest)?;
        let code = attrs.need_be32(NFTA_VERDICT_CODE, "NFTA_VERDICT_CODE")? as i32;
        Self::from_code(code, attrs.string(NFTA_VERDICT_CHAIN)?)
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Accept => f.write_str("accept"),
            Self::Drop => f.write_str("drop"),
            Self::Continue => f.write_str("continue"),
            Self::Return => f.write_str("return"),
            Self::Jump(c) => write!(f, "jump {c}"),
            Self::Goto(c) => write!(f, "goto {c}"),
        }
    }
}

/// The data of an `immediate` expression, a `cmp`, or a set element: bytes or a verdict.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Data {
    /// `NFTA_DATA_VALUE`.
    Value(Vec<u8>),
    /// `NFTA_DATA_VERDICT`.
    Verdict(Verdict),
}

impl Data {
    /// Appends the data nest's content (`NFTA_DATA_VALUE` or `NFTA_DATA_VERDICT`).
    pub fn encode(&self, buf: &mut Vec<u8>) {
        match self {
            Self::Value(v) => put_attr(buf, NFTA_DATA_VALUE, v),
            Self::Verdict(v) => v.encode(buf),
        }
    }

    /// Reads a data nest's value.
    ///
    /// # Errors
    /// Neither a value nor a verdict, or a malformed verdict.
    pub fn decode(nest: &[u8]) -> Result<Self> {
        let attrs = Attrs::parse(nest)?;
        if let Some(value) = attrs.bytes(NFTA_DATA_VALUE) {
            return Ok(Self::Value(value.to_vec()));
        }
        match attrs.bytes(NFTA_DATA_VERDICT) {
            Some(verdict) => Ok(Self::Verdict(Verdict::decode(verdict)?)),
            None => Err(NftCodecError::BadData),
        }
    }
}

/// One expression of a rule. Registers are `NFT_REG_*` numbers (`NFT_REG_1`,
/// `NFT_REG32_01` = 9, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    /// `payload`: `len` bytes at `offset` from header `base` into `dreg`.
    Payload {
        /// Destination register.
        dreg: u32,
        /// `NFT_PAYLOAD_*_HEADER`.
        base: u32,
        /// Byte offset.
        offset: u32,
        /// Byte length.
        len: u32,
    },
    /// `meta` load: packet metadata `key` (`NFT_META_*`) into `dreg`.
    Meta {
        /// `NFT_META_*`.
        key: u32,
        /// Destination register.
        dreg: u32,
    },
    /// `meta` set: `key` from `sreg`.
    MetaSet {
        /// `NFT_META_*`.
        key: u32,
        /// Source register.
        sreg: u32,
    },
    /// `cmp`: compares `sreg` with `data` (`NFT_CMP_*`); the rule stops when false.
    Cmp {
        /// Source register.
        sreg: u32,
        /// `NFT_CMP_*`.
        op: u32,
        /// The value compared with.
        data: Vec<u8>,
    },
    /// `bitwise` mask-and-xor: `dreg = (sreg & mask) ^ xor` over `len` bytes.
    Bitwise {
        /// Source register.
        sreg: u32,
        /// Destination register.
        dreg: u32,
        /// `NFTA_BITWISE_OP` (`NFT_BITWISE_MASK_XOR`), when sent: nft sends it for
        /// `meta mark set`, not for flag and prefix matches.
        op: Option<u32>,
        /// Byte length.
        len: u32,
        /// The mask.
        mask: Vec<u8>,
        /// The xor.
        xor: Vec<u8>,
    },
    /// `lookup`: whether `sreg..` is in `set` (with `dreg`, a map: its data into `dreg`).
    Lookup {
        /// The set's name.
        set: String,
        /// `NFTA_LOOKUP_SET_ID` (nft sends it for sets of the same batch).
        set_id: Option<u32>,
        /// Key register.
        sreg: u32,
        /// Data register of a map lookup (`NFT_REG_VERDICT` for a verdict map).
        dreg: Option<u32>,
        /// `NFT_LOOKUP_F_INV`: matches when the key is absent.
        flags: u32,
    },
    /// `immediate`: `data` into `dreg` (a verdict into `NFT_REG_VERDICT`).
    Immediate {
        /// Destination register.
        dreg: u32,
        /// The value or verdict.
        data: Data,
    },
    /// `numgen`: a number in `offset..offset+modulus` into `dreg`.
    Numgen {
        /// Destination register.
        dreg: u32,
        /// The modulus.
        modulus: u32,
        /// `NFT_NG_RANDOM` or `NFT_NG_INCREMENTAL`.
        kind: u32,
        /// Added to the number.
        offset: u32,
    },
    /// `nat`: source or destination NAT to the address and port in registers.
    Nat {
        /// `NFT_NAT_SNAT` or `NFT_NAT_DNAT`.
        kind: u32,
        /// `NFPROTO_IPV4` or `NFPROTO_IPV6`.
        family: u32,
        /// Registers of the address range (min, max), if any.
        addr: Option<(u32, u32)>,
        /// Registers of the port range (min, max), if any.
        proto: Option<(u32, u32)>,
        /// `NF_NAT_RANGE_*` flags as sent (0: none).
        flags: u32,
    },
    /// `masq`: masquerade with `NF_NAT_RANGE_*` flags.
    Masq {
        /// Flags (0: none).
        flags: u32,
    },
    /// `ct` load: conntrack `key` (`NFT_CT_*`) into `dreg`.
    Ct {
        /// `NFT_CT_*`.
        key: u32,
        /// Destination register.
        dreg: u32,
        /// `NFTA_CT_DIRECTION`, for the keys that have one.
        direction: Option<u8>,
    },
    /// `dynset`: adds, updates or deletes the key in `sreg_key` (with data from
    /// `sreg_data`) in `set` from the packet path.
    Dynset {
        /// The set's name.
        set: String,
        /// `NFTA_DYNSET_SET_ID`.
        set_id: Option<u32>,
        /// `NFT_DYNSET_OP_*`.
        op: u32,
        /// Key register.
        sreg_key: u32,
        /// Data register, for a map.
        sreg_data: Option<u32>,
        /// Timeout of the element in milliseconds (`None`: the set's).
        timeout_ms: Option<u64>,
    },
    /// `fib`: a route lookup's `result` (`NFT_FIB_RESULT_*`) into `dreg`.
    Fib {
        /// Destination register.
        dreg: u32,
        /// `NFT_FIB_RESULT_*`.
        result: u32,
        /// `NFTA_FIB_F_*`.
        flags: u32,
    },
    /// `reject` with `kind` (`NFT_REJECT_*`) and ICMP `code`.
    Reject {
        /// `NFT_REJECT_*`.
        kind: u32,
        /// The ICMP code (port unreachable for a plain `reject`).
        code: u8,
    },
    /// `counter`.
    Counter {
        /// Bytes counted.
        bytes: u64,
        /// Packets counted.
        packets: u64,
    },
    /// An expression of a type this codec does not model, kept as its name and its
    /// data nest's bytes.
    Other {
        /// `NFTA_EXPR_NAME`.
        name: String,
        /// `NFTA_EXPR_DATA`'s value.
        data: Vec<u8>,
    },
}

impl Expr {
    /// The expression type's name (`NFTA_EXPR_NAME`).
    #[must_use]
    pub fn name(&self) -> &str {
        match self {
            Self::Payload { .. } => "payload",
            Self::Meta { .. } | Self::MetaSet { .. } => "meta",
            Self::Cmp { .. } => "cmp",
            Self::Bitwise { .. } => "bitwise",
            Self::Lookup { .. } => "lookup",
            Self::Immediate { .. } => "immediate",
            Self::Numgen { .. } => "numgen",
            Self::Nat { .. } => "nat",
            Self::Masq { .. } => "masq",
            Self::Ct { .. } => "ct",
            Self::Dynset { .. } => "dynset",
            Self::Fib { .. } => "fib",
            Self::Reject { .. } => "reject",
            Self::Counter { .. } => "counter",
            Self::Other { name, .. } => name,
        }
    }

    /// Appends the expression's `NFTA_LIST_ELEM` nest.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        put_nest(buf, NFTA_LIST_ELEM, |b| {
            put_str(b, NFTA_EXPR_NAME, self.name());
            if let Self::Other { data, .. } = self {
                put_attr(
                    b,
                    NFTA_EXPR_DATA | crate::kernel::netlink::frame::NLA_F_NESTED,
                    data,
                );
                return;
            }
            put_nest(b, NFTA_EXPR_DATA, |b| self.encode_data(b));
        });
    }

    fn encode_data(&self, b: &mut Vec<u8>) {
        match self {
            Self::Payload {
                dreg,
                base,
                offset,
                len,
            } => {
                put_be32(b, NFTA_PAYLOAD_DREG, *dreg);
                put_be32(b, NFTA_PAYLOAD_BASE, *base);
                put_be32(b, NFTA_PAYLOAD_OFFSET, *offset);
                put_be32(b, NFTA_PAYLOAD_LEN, *len);
            }
            Self::Meta { key, dreg } => {
                put_be32(b, NFTA_META_KEY, *key);
                put_be32(b, NFTA_META_DREG, *dreg);
            }
            Self::MetaSet { key, sreg } => {
                put_be32(b, NFTA_META_KEY, *key);
                put_be32(b, NFTA_META_SREG, *sreg);
            }
            Self::Cmp { sreg, op, data } => {
                put_be32(b, NFTA_CMP_SREG, *sreg);
                put_be32(b, NFTA_CMP_OP, *op);
                put_nest(b, NFTA_CMP_DATA, |b| put_attr(b, NFTA_DATA_VALUE, data));
            }
            Self::Bitwise {
                sreg,
                dreg,
                op,
                len,
                mask,
                xor,
            } => {
                put_be32(b, NFTA_BITWISE_SREG, *sreg);
                put_be32(b, NFTA_BITWISE_DREG, *dreg);
                if let Some(op) = op {
                    put_be32(b, NFTA_BITWISE_OP, *op);
                }
                put_be32(b, NFTA_BITWISE_LEN, *len);
                put_nest(b, NFTA_BITWISE_MASK, |b| put_attr(b, NFTA_DATA_VALUE, mask));
                put_nest(b, NFTA_BITWISE_XOR, |b| put_attr(b, NFTA_DATA_VALUE, xor));
            }
            Self::Lookup {
                set,
                set_id,
                sreg,
                dreg,
                flags,
            } => {
                put_be32(b, NFTA_LOOKUP_SREG, *sreg);
                if let Some(dreg) = dreg {
                    put_be32(b, NFTA_LOOKUP_DREG, *dreg);
                }
                put_str(b, NFTA_LOOKUP_SET, set);
                if let Some(id) = set_id {
                    put_be32(b, NFTA_LOOKUP_SET_ID, *id);
                }
                if *flags != 0 {
                    put_be32(b, NFTA_LOOKUP_FLAGS, *flags);
                }
            }
            Self::Immediate { dreg, data } => {
                put_be32(b, NFTA_IMMEDIATE_DREG, *dreg);
                put_nest(b, NFTA_IMMEDIATE_DATA, |b| data.encode(b));
            }
            Self::Numgen {
                dreg,
                modulus,
                kind,
                offset,
            } => {
                put_be32(b, NFTA_NG_DREG, *dreg);
                put_be32(b, NFTA_NG_MODULUS, *modulus);
                put_be32(b, NFTA_NG_TYPE, *kind);
                put_be32(b, NFTA_NG_OFFSET, *offset);
            }
            Self::Nat {
                kind,
                family,
                addr,
                proto,
                flags,
            } => {
                put_be32(b, NFTA_NAT_TYPE, *kind);
                put_be32(b, NFTA_NAT_FAMILY, *family);
                if let Some((min, max)) = addr {
                    put_be32(b, NFTA_NAT_REG_ADDR_MIN, *min);
                    if max != min {
                        put_be32(b, NFTA_NAT_REG_ADDR_MAX, *max);
                    }
                }
                if let Some((min, max)) = proto {
                    put_be32(b, NFTA_NAT_REG_PROTO_MIN, *min);
                    if max != min {
                        put_be32(b, NFTA_NAT_REG_PROTO_MAX, *max);
                    }
                }
                if *flags != 0 {
                    put_be32(b, NFTA_NAT_FLAGS, *flags);
                }
            }
            Self::Masq { flags } => {
                if *flags != 0 {
                    put_be32(b, NFTA_MASQ_FLAGS, *flags);
                }
            }
            Self::Ct {
                key,
                dreg,
                direction,
            } => {
                put_be32(b, NFTA_CT_KEY, *key);
                put_be32(b, NFTA_CT_DREG, *dreg);
                if let Some(dir) = direction {
                    put_attr(b, NFTA_CT_DIRECTION, &[*dir]);
                }
            }
            Self::Dynset {
                set,
                set_id,
                op,
                sreg_key,
                sreg_data,
                timeout_ms,
            } => {
                put_be32(b, NFTA_DYNSET_SREG_KEY, *sreg_key);
                if let Some(sreg) = sreg_data {
                    put_be32(b, NFTA_DYNSET_SREG_DATA, *sreg);
                }
                put_be32(b, NFTA_DYNSET_OP, *op);
                if let Some(ms) = timeout_ms {
                    put_be64(b, NFTA_DYNSET_TIMEOUT, *ms);
                }
                put_str(b, NFTA_DYNSET_SET_NAME, set);
                if let Some(id) = set_id {
                    put_be32(b, NFTA_DYNSET_SET_ID, *id);
                }
            }
            Self::Fib {
                dreg,
                result,
                flags,
            } => {
                put_be32(b, NFTA_FIB_FLAGS, *flags);
                put_be32(b, NFTA_FIB_RESULT, *result);
                put_be32(b, NFTA_FIB_DREG, *dreg);
            }
            Self::Reject { kind, code } => {
                put_be32(b, NFTA_REJECT_TYPE, *kind);
                put_attr(b, NFTA_REJECT_ICMP_CODE, &[*code]);
            }
            Self::Counter { bytes, packets } => {
                put_be64(b, NFTA_COUNTER_BYTES, *bytes);
                put_be64(b, NFTA_COUNTER_PACKETS, *packets);
            }
            Self::Other { .. } => {}
        }
    }

    /// Reads one `NFTA_LIST_ELEM`'s value.
    ///
    /// # Errors
    /// Malformed attributes, or a missing attribute an expression type needs.
    pub fn decode(elem: &[u8]) -> Result<Self> {
        let outer = Attrs::parse(elem)?;
        let name = outer.need_string(NFTA_EXPR_NAME, "NFTA_EXPR_NAME")?;
        let data = outer.bytes(NFTA_EXPR_DATA).unwrap_or_default();
        let a = Attrs::parse(data)?;
        let reg = |kind, what| a.need_be32(kind, what);
        let value = |kind, what| -> Result<Vec<u8>> {
            let nest = Attrs::parse(a.need(kind, what)?)?;
            Ok(nest.need(NFTA_DATA_VALUE, "NFTA_DATA_VALUE")?.to_vec())
        };
        Ok(match name.as_str() {
            "payload" if a.get(NFTA_PAYLOAD_DREG).is_some() => Self::Payload {
                dreg: reg(NFTA_PAYLOAD_DREG, "NFTA_PAYLOAD_DREG")?,
                base: reg(NFTA_PAYLOAD_BASE, "NFTA_PAYLOAD_BASE")?,
                offset: reg(NFTA_PAYLOAD_OFFSET, "NFTA_PAYLOAD_OFFSET")?,
                len: reg(NFTA_PAYLOAD_LEN, "NFTA_PAYLOAD_LEN")?,
            },
            "meta" if a.get(NFTA_META_DREG).is_some() => Self::Meta {
                key: reg(NFTA_META_KEY, "NFTA_META_KEY")?,
                dreg: reg(NFTA_META_DREG, "NFTA_META_DREG")?,
            },
            "meta" if a.get(NFTA_META_SREG).is_some() => Self::MetaSet {
                key: reg(NFTA_META_KEY, "NFTA_META_KEY")?,
                sreg: reg(NFTA_META_SREG, "NFTA_META_SREG")?,
            },
            "cmp" => Self::Cmp {
                sreg: reg(NFTA_CMP_SREG, "NFTA_CMP_SREG")?,
                op: reg(NFTA_CMP_OP, "NFTA_CMP_OP")?,
                data: value(NFTA_CMP_DATA, "NFTA_CMP_DATA")?,
            },
            "bitwise" if a.be32(NFTA_BITWISE_OP)?.unwrap_or(NFT_BITWISE_MASK_XOR) == 0 => {
                Self::Bitwise {
                    sreg: reg(NFTA_BITWISE_SREG, "NFTA_BITWISE_SREG")?,
                    dreg: reg(NFTA_BITWISE_DREG, "NFTA_BITWISE_DREG")?,
                    op: a.be32(NFTA_BITWISE_OP)?,
                    len: reg(NFTA_BITWISE_LEN, "NFTA_BITWISE_LEN")?,
                    mask: value(NFTA_BITWISE_MASK, "NFTA_BITWISE_MASK")?,
                    xor: value(NFTA_BITWISE_XOR, "NFTA_BITWISE_XOR")?,
                }
            }
            "lookup" => Self::Lookup {
                set: a.need_string(NFTA_LOOKUP_SET, "NFTA_LOOKUP_SET")?,
                set_id: a.be32(NFTA_LOOKUP_SET_ID)?,
                sreg: reg(NFTA_LOOKUP_SREG, "NFTA_LOOKUP_SREG")?,
                dreg: a.be32(NFTA_LOOKUP_DREG)?,
                flags: a.be32(NFTA_LOOKUP_FLAGS)?.unwrap_or(0),
            },
            "immediate" => Self::Immediate {
                dreg: reg(NFTA_IMMEDIATE_DREG, "NFTA_IMMEDIATE_DREG")?,
                data: Data::decode(a.need(NFTA_IMMEDIATE_DATA, "NFTA_IMMEDIATE_DATA")?)?,
            },
            "numgen" => Self::Numgen {
                dreg: reg(NFTA_NG_DREG, "NFTA_NG_DREG")?,
                modulus: reg(NFTA_NG_MODULUS, "NFTA_NG_MODULUS")?,
                kind: reg(NFTA_NG_TYPE, "NFTA_NG_TYPE")?,
                offset: a.be32(NFTA_NG_OFFSET)?.unwrap_or(0),
            },
            "nat" => {
                let pair = |min_kind, max_kind| -> Result<Option<(u32, u32)>> {
                    Ok(match a.be32(min_kind)? {
                        Some(min) => Some((min, a.be32(max_kind)?.unwrap_or(min))),
                        None => None,
                    })
                };
                Self::Nat {
                    kind: reg(NFTA_NAT_TYPE, "NFTA_NAT_TYPE")?,
                    family: reg(NFTA_NAT_FAMILY, "NFTA_NAT_FAMILY")?,
                    addr: pair(NFTA_NAT_REG_ADDR_MIN, NFTA_NAT_REG_ADDR_MAX)?,
                    proto: pair(NFTA_NAT_REG_PROTO_MIN, NFTA_NAT_REG_PROTO_MAX)?,
                    flags: a.be32(NFTA_NAT_FLAGS)?.unwrap_or(0),
                }
            }
            "masq" if a.get(NFTA_MASQ_REG_PROTO_MIN).is_none() => Self::Masq {
                flags: a.be32(NFTA_MASQ_FLAGS)?.unwrap_or(0),
            },
            "ct" if a.get(NFTA_CT_DREG).is_some() => Self::Ct {
                key: reg(NFTA_CT_KEY, "NFTA_CT_KEY")?,
                dreg: reg(NFTA_CT_DREG, "NFTA_CT_DREG")?,
                direction: a.get(NFTA_CT_DIRECTION).map(|d| d.get_u8()).transpose()?,
            },
            "dynset" => Self::Dynset {
                set: a.need_string(NFTA_DYNSET_SET_NAME, "NFTA_DYNSET_SET_NAME")?,
                set_id: a.be32(NFTA_DYNSET_SET_ID)?,
                op: reg(NFTA_DYNSET_OP, "NFTA_DYNSET_OP")?,
                sreg_key: reg(NFTA_DYNSET_SREG_KEY, "NFTA_DYNSET_SREG_KEY")?,
                sreg_data: a.be32(NFTA_DYNSET_SREG_DATA)?,
                timeout_ms: a.be64(NFTA_DYNSET_TIMEOUT)?,
            },
            "fib" => Self::Fib {
                dreg: reg(NFTA_FIB_DREG, "NFTA_FIB_DREG")?,
                result: reg(NFTA_FIB_RESULT, "NFTA_FIB_RESULT")?,
                flags: reg(NFTA_FIB_FLAGS, "NFTA_FIB_FLAGS")?,
            },
            "reject" => Self::Reject {
                kind: reg(NFTA_REJECT_TYPE, "NFTA_REJECT_TYPE")?,
                code: a
                    .get(NFTA_REJECT_ICMP_CODE)
                    .map(|c| c.get_u8())
                    .transpose()?
                    .unwrap_or(0),
            },
            "counter" => Self::Counter {
                bytes: a.be64(NFTA_COUNTER_BYTES)?.unwrap_or(0),
                packets: a.be64(NFTA_COUNTER_PACKETS)?.unwrap_or(0),
            },
            _ => Self::Other {
                name,
                data: data.to_vec(),
            },
        })
    }

    /// The expression as a value that compares equal whether it was built here, read
    /// from a request or dumped by the kernel: registers in the kernel's dump numbering
    /// (a 32-bit register at a 16-byte boundary is dumped as the 16-byte one: 12 as
    /// `NFT_REG_2`), set ids dropped (the kernel resolves them to names), the NAT flags
    /// its registers imply added, a dynset timeout of 0 as none, counters zeroed.
    #[must_use]
    pub fn canonical(&self) -> Self {
        let r = canonical_register;
        match self.clone() {
            Self::Payload {
                dreg,
                base,
                offset,
                len,
            } => Self::Payload {
                dreg: r(dreg),
                base,
                offset,
                len,
            },
            Self::Meta { key, dreg } => Self::Meta { key, dreg: r(dreg) },
            Self::MetaSet { key, sreg } => Self::MetaSet { key, sreg: r(sreg) },
            Self::Cmp { sreg, op, data } => Self::Cmp {
                sreg: r(sreg),
                op,
                data,
            },
            Self::Bitwise {
                sreg,
                dreg,
                op,
                len,
                mask,
                xor,
            } => Self::Bitwise {
                sreg: r(sreg),
                dreg: r(dreg),
                op: Some(op.unwrap_or(NFT_BITWISE_MASK_XOR)),
                len,
                mask,
                xor,
            },
            Self::Lookup {
                set,
                sreg,
                dreg,
                flags,
                ..
            } => Self::Lookup {
                set,
                set_id: None,
                sreg: r(sreg),
                dreg: dreg.map(r),
                flags,
            },
            Self::Immediate { dreg, data } => Self::Immediate {
                dreg: r(dreg),
                data,
            },
            Self::Numgen {
                dreg,
                modulus,
                kind,
                offset,
            } => Self::Numgen {
                dreg: r(dreg),
                modulus,
                kind,
                offset,
            },
            Self::Dynset {
                set,
                op,
                sreg_key,
                sreg_data,
                timeout_ms,
                ..
            } => Self::Dynset {
                set,
                set_id: None,
                op,
                sreg_key: r(sreg_key),
                sreg_data: sreg_data.map(r),
                timeout_ms: timeout_ms.filter(|t| *t != 0),
            },
            Self::Nat {
                kind,
                family,
                addr,
                proto,
                mut flags,
            } => {
                if addr.is_some() {
                    flags |= NF_NAT_RANGE_MAP_IPS;
                }
                if proto.is_some() {
                    flags |= NF_NAT_RANGE_PROTO_SPECIFIED;
                }
                Self::Nat {
                    kind,
                    family,
                    addr: addr.map(|(a, b)| (r(a), r(b))),
                    proto: proto.map(|(a, b)| (r(a), r(b))),
                    flags,
                }
            }
            Self::Ct {
                key,
                dreg,
                direction,
            } => Self::Ct {
                key,
                dreg: r(dreg),
                direction,
            },
            Self::Fib {
                dreg,
                result,
                flags,
            } => Self::Fib {
                dreg: r(dreg),
                result,
                flags,
            },
            Self::Counter { .. } => Self::Counter {
                bytes: 0,
                packets: 0,
            },
            other => other,
        }
    }
}

/// A register as the kernel dumps it: the verdict register as it is, a data register
/// as its 32-bit index, written as the 16-byte register (`NFT_REG_1`..`NFT_REG_4`) when
/// it starts one.
#[must_use]
pub fn canonical_register(reg: u32) -> u32 {
    let index = match reg {
        NFT_REG_VERDICT => return NFT_REG_VERDICT,
        1..=4 => (reg - NFT_REG_1) * 4,
        NFT_REG32_00..=NFT_REG32_15 => reg - NFT_REG32_00,
        other => return other,
    };
    if index % 4 == 0 {
        NFT_REG_1 + index / 4
    } else {
        NFT_REG32_00 + index
    }
}

/// Appends an `NFTA_RULE_EXPRESSIONS` nest holding `exprs`.
pub fn encode_expressions(buf: &mut Vec<u8>, exprs: &[Expr]) {
    put_nest(buf, NFTA_RULE_EXPRESSIONS, |b| {
        for expr in exprs {
            expr.encode(b);
        }
    });
}

/// Reads an `NFTA_RULE_EXPRESSIONS` nest's value.
///
/// # Errors
/// When an expression cannot be read.
pub fn decode_expressions(nest: &[u8]) -> Result<Vec<Expr>> {
    list(nest)?.into_iter().map(Expr::decode).collect()
}
