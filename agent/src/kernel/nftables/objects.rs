//! Tables, chains, rules, sets and set elements as typed values, the messages that
//! create and delete them, and the decoding of the kernel's dumps of them.
//!
//! Every message is an `nlmsghdr`, an `nfgenmsg` and attributes:
//!
//! ```text
//! nlmsghdr  u32 len | u16 type (NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_*) | u16 flags | u32 seq | u32 pid
//! nfgenmsg  u8 family (NFPROTO_IPV4 / NFPROTO_IPV6) | u8 version (0) | be16 res_id (0;
//!           in dumps, the low 16 bits of the generation)
//! nlattr*   NFTA_<OBJECT>_TABLE, NFTA_<OBJECT>_NAME, ...
//! ```

use super::error::NftCodecError;
use super::expr::{Data, Expr, Verdict, decode_expressions, encode_expressions};
use super::uapi::*;
use super::wire::{Attrs, list, put_be32, put_be64, put_nest, put_str};
use crate::kernel::netlink::frame::{
    self, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_HDRLEN, NetlinkHeader, put_attr,
};

type Result<T> = std::result::Result<T, NftCodecError>;

/// `NLM_F_APPEND`: a new rule goes at the end of its chain.
pub const NLM_F_APPEND: u16 = 0x800;
/// `sizeof(struct nfgenmsg)`.
pub const NFGENMSG_LEN: usize = 4;

/// The message type of an nf_tables command.
#[must_use]
pub const fn message_type(msg: u8) -> u16 {
    ((NFNL_SUBSYS_NFTABLES as u16) << 8) | msg as u16
}

/// A message's `nlmsghdr` and `nfgenmsg`, its length left to [`frame::finish_message`].
#[must_use]
pub fn start(msg: u8, flags: u16, family: u8) -> Vec<u8> {
    let mut buf = frame::start_message(&NetlinkHeader {
        message_type: message_type(msg),
        flags: NLM_F_REQUEST | flags,
        seq: 0,
        port_id: 0,
    });
    buf.extend_from_slice(&[family, NFNETLINK_V0, 0, 0]);
    buf
}

/// Checks a table, chain or set name as the kernel would.
///
/// # Errors
/// [`NftCodecError::BadName`] for an empty name, one of 256 bytes or more, or a NUL.
pub fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() >= NFT_NAME_MAXLEN || name.contains('\0') {
        return Err(NftCodecError::BadName(name.to_owned()));
    }
    Ok(())
}

/// nft's userdata holding only a comment (`NFTNL_UDATA_*_COMMENT`, type 0): what nft
/// prints as `comment "..."` on a table, chain or rule.
#[must_use]
pub fn comment_userdata(comment: &str) -> Vec<u8> {
    let text = comment.as_bytes();
    let len = (text.len() + 1).min(255);
    let mut out = Vec::with_capacity(len + 2);
    out.push(NFTNL_UDATA_COMMENT);
    out.push(len as u8);
    out.extend_from_slice(text.get(..len - 1).unwrap_or(text));
    out.push(0);
    out
}

/// The comment in nft's userdata, if it holds one of type `kind`.
#[must_use]
pub fn userdata_comment(udata: &[u8], kind: u8) -> Option<String> {
    let mut at = 0;
    while let (Some(&t), Some(&len)) = (udata.get(at), udata.get(at + 1)) {
        let value = udata.get(at + 2..at + 2 + usize::from(len))?;
        if t == kind {
            let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
            return String::from_utf8(value.get(..end)?.to_vec()).ok();
        }
        at += 2 + usize::from(len);
    }
    None
}

// ---- tables --------------------------------------------------------------------------------

/// A table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// `NFPROTO_IPV4` or `NFPROTO_IPV6`.
    pub family: u8,
    /// Its name.
    pub name: String,
    /// `NFT_TABLE_F_*`.
    pub flags: u32,
    /// nft's userdata (its comment).
    pub userdata: Option<Vec<u8>>,
}

impl Table {
    /// `NFT_MSG_NEWTABLE` (an existing table is left as it is).
    #[must_use]
    pub fn new_message(&self) -> Vec<u8> {
        // As nft sends it: without NLM_F_CREATE (the kernel creates a table either way).
        let mut buf = start(NFT_MSG_NEWTABLE, 0, self.family);
        put_str(&mut buf, NFTA_TABLE_NAME, &self.name);
        put_be32(&mut buf, NFTA_TABLE_FLAGS, self.flags);
        if let Some(udata) = &self.userdata {
            put_attr(&mut buf, NFTA_TABLE_USERDATA, udata);
        }
        frame::finish_message(buf)
    }

    /// Reads a table message's body.
    ///
    /// # Errors
    /// A malformed body.
    pub fn decode(family: u8, body: &[u8]) -> Result<Self> {
        let a = Attrs::parse(body)?;
        Ok(Self {
            family,
            name: a.need_string(NFTA_TABLE_NAME, "NFTA_TABLE_NAME")?,
            flags: a.be32(NFTA_TABLE_FLAGS)?.unwrap_or(0),
            userdata: a.bytes(NFTA_TABLE_USERDATA).map(<[u8]>::to_vec),
        })
    }
}

/// `NFT_MSG_DELTABLE` of the table `name` (with its chains, rules and sets).
#[must_use]
pub fn delete_table(family: u8, name: &str) -> Vec<u8> {
    let mut buf = start(NFT_MSG_DELTABLE, 0, family);
    put_str(&mut buf, NFTA_TABLE_NAME, name);
    frame::finish_message(buf)
}

// ---- chains --------------------------------------------------------------------------------

/// Where a base chain is hooked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Hook {
    /// `filter` or `nat`.
    pub chain_type: String,
    /// `NF_INET_*`.
    pub hooknum: u32,
    /// Its priority (`-100` is `dstnat`, `100` `srcnat`).
    pub priority: i32,
}

/// A chain, with its hook when it is a base chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// `NFPROTO_*`.
    pub family: u8,
    /// The table's name.
    pub table: String,
    /// Its name.
    pub name: String,
    /// The hook of a base chain.
    pub hook: Option<Hook>,
    /// The base chain's policy (`NF_ACCEPT` when absent).
    pub policy: Option<u32>,
    /// nft's userdata (its comment).
    pub userdata: Option<Vec<u8>>,
    /// The kernel's handle (dumps only).
    pub handle: Option<u64>,
}

impl Chain {
    /// `NFT_MSG_NEWCHAIN` (an existing chain is left as it is, or its policy updated).
    #[must_use]
    pub fn new_message(&self) -> Vec<u8> {
        let mut buf = start(NFT_MSG_NEWCHAIN, NLM_F_CREATE, self.family);
        put_str(&mut buf, NFTA_CHAIN_TABLE, &self.table);
        put_str(&mut buf, NFTA_CHAIN_NAME, &self.name);
        if let Some(hook) = &self.hook {
            put_str(&mut buf, NFTA_CHAIN_TYPE, &hook.chain_type);
            put_nest(&mut buf, NFTA_CHAIN_HOOK, |b| {
                put_be32(b, NFTA_HOOK_HOOKNUM, hook.hooknum);
                put_be32(b, NFTA_HOOK_PRIORITY, hook.priority as u32);
            });
        }
        if let Some(policy) = self.policy {
            put_be32(&mut buf, NFTA_CHAIN_POLICY, policy);
        }
        if let Some(udata) = &self.userdata {
            put_attr(&mut buf, NFTA_CHAIN_USERDATA, udata);
        }
        frame::finish_message(buf)
    }

    /// Reads a chain message's body.
    ///
    /// # Errors
    /// A malformed body.
    pub fn decode(family: u8, body: &[u8]) -> Result<Self> {
        let a = Attrs::parse(body)?;
        let hook = match a.bytes(NFTA_CHAIN_HOOK) {
            Some(nest) => {
                let h = Attrs::parse(nest)?;
                Some(Hook {
                    chain_type: a.string(NFTA_CHAIN_TYPE)?.unwrap_or_default(),
                    hooknum: h.need_be32(NFTA_HOOK_HOOKNUM, "NFTA_HOOK_HOOKNUM")?,
                    priority: h.need_be32(NFTA_HOOK_PRIORITY, "NFTA_HOOK_PRIORITY")? as i32,
                })
            }
            None => None,
        };
        Ok(Self {
            family,
            table: a.need_string(NFTA_CHAIN_TABLE, "NFTA_CHAIN_TABLE")?,
            name: a.need_string(NFTA_CHAIN_NAME, "NFTA_CHAIN_NAME")?,
            hook,
            policy: a.be32(NFTA_CHAIN_POLICY)?,
            userdata: a.bytes(NFTA_CHAIN_USERDATA).map(<[u8]>::to_vec),
            handle: a.be64(NFTA_CHAIN_HANDLE)?,
        })
    }
}

/// `NFT_MSG_DELCHAIN` of `chain` (its rules go with it; it must not be referenced).
#[must_use]
pub fn delete_chain(family: u8, table: &str, chain: &str) -> Vec<u8> {
    let mut buf = start(NFT_MSG_DELCHAIN, 0, family);
    put_str(&mut buf, NFTA_CHAIN_TABLE, table);
    put_str(&mut buf, NFTA_CHAIN_NAME, chain);
    frame::finish_message(buf)
}

/// `NFT_MSG_DELRULE` without a handle: every rule of `chain` (`flush chain`).
#[must_use]
pub fn flush_chain(family: u8, table: &str, chain: &str) -> Vec<u8> {
    let mut buf = start(NFT_MSG_DELRULE, 0, family);
    put_str(&mut buf, NFTA_RULE_TABLE, table);
    put_str(&mut buf, NFTA_RULE_CHAIN, chain);
    frame::finish_message(buf)
}

// ---- rules ---------------------------------------------------------------------------------

/// A rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// `NFPROTO_*`.
    pub family: u8,
    /// The table's name.
    pub table: String,
    /// The chain's name.
    pub chain: String,
    /// Its expressions, in order.
    pub exprs: Vec<Expr>,
    /// nft's userdata (its comment).
    pub userdata: Option<Vec<u8>>,
    /// The kernel's handle (dumps only).
    pub handle: Option<u64>,
}

impl Rule {
    /// `NFT_MSG_NEWRULE`, appending the rule to its chain.
    #[must_use]
    pub fn new_message(&self) -> Vec<u8> {
        let mut buf = start(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, self.family);
        put_str(&mut buf, NFTA_RULE_TABLE, &self.table);
        put_str(&mut buf, NFTA_RULE_CHAIN, &self.chain);
        encode_expressions(&mut buf, &self.exprs);
        if let Some(udata) = &self.userdata {
            put_attr(&mut buf, NFTA_RULE_USERDATA, udata);
        }
        frame::finish_message(buf)
    }

    /// Reads a rule message's body.
    ///
    /// # Errors
    /// A malformed body or expression.
    pub fn decode(family: u8, body: &[u8]) -> Result<Self> {
        let a = Attrs::parse(body)?;
        Ok(Self {
            family,
            table: a.need_string(NFTA_RULE_TABLE, "NFTA_RULE_TABLE")?,
            chain: a.need_string(NFTA_RULE_CHAIN, "NFTA_RULE_CHAIN")?,
            exprs: match a.bytes(NFTA_RULE_EXPRESSIONS) {
                Some(nest) => decode_expressions(nest)?,
                None => Vec::new(),
            },
            userdata: a.bytes(NFTA_RULE_USERDATA).map(<[u8]>::to_vec),
            handle: a.be64(NFTA_RULE_HANDLE)?,
        })
    }
}

// ---- sets ----------------------------------------------------------------------------------

/// A set or map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    /// `NFPROTO_*`.
    pub family: u8,
    /// The table's name.
    pub table: String,
    /// Its name.
    pub name: String,
    /// `NFT_SET_*`.
    pub flags: u32,
    /// nft's data type of the key (informational: `TYPE_*` concatenated 6 bits each).
    pub key_type: u32,
    /// Bytes of a key (each field of a concatenation rounded up to 4).
    pub key_len: u32,
    /// A map's data type (`NFT_DATA_VERDICT` for a verdict map).
    pub data_type: Option<u32>,
    /// Bytes of a map's data.
    pub data_len: Option<u32>,
    /// The default timeout of elements, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// `NFTA_SET_DESC_SIZE`: the most elements it may hold (needed for dynamic sets).
    pub size: Option<u32>,
    /// `NFTA_SET_ID` (nft sends it so rules of the same batch can refer to the set).
    pub set_id: Option<u32>,
    /// nft's userdata (byte orders, typeof, comment).
    pub userdata: Option<Vec<u8>>,
}

impl Set {
    /// `NFT_MSG_NEWSET` (an existing set of the same definition is left as it is).
    #[must_use]
    pub fn new_message(&self) -> Vec<u8> {
        let mut buf = start(NFT_MSG_NEWSET, NLM_F_CREATE, self.family);
        put_str(&mut buf, NFTA_SET_TABLE, &self.table);
        put_str(&mut buf, NFTA_SET_NAME, &self.name);
        put_be32(&mut buf, NFTA_SET_FLAGS, self.flags);
        put_be32(&mut buf, NFTA_SET_KEY_TYPE, self.key_type);
        put_be32(&mut buf, NFTA_SET_KEY_LEN, self.key_len);
        if let Some(t) = self.data_type {
            put_be32(&mut buf, NFTA_SET_DATA_TYPE, t);
        }
        if let Some(l) = self.data_len {
            put_be32(&mut buf, NFTA_SET_DATA_LEN, l);
        }
        if let Some(size) = self.size {
            put_nest(&mut buf, NFTA_SET_DESC, |b| {
                put_be32(b, NFTA_SET_DESC_SIZE, size);
            });
        }
        if let Some(id) = self.set_id {
            put_be32(&mut buf, NFTA_SET_ID, id);
        }
        if let Some(ms) = self.timeout_ms {
            put_be64(&mut buf, NFTA_SET_TIMEOUT, ms);
        }
        if let Some(udata) = &self.userdata {
            put_attr(&mut buf, NFTA_SET_USERDATA, udata);
        }
        frame::finish_message(buf)
    }

    /// Reads a set message's body.
    ///
    /// # Errors
    /// A malformed body.
    pub fn decode(family: u8, body: &[u8]) -> Result<Self> {
        let a = Attrs::parse(body)?;
        let size = match a.bytes(NFTA_SET_DESC) {
            Some(nest) => Attrs::parse(nest)?.be32(NFTA_SET_DESC_SIZE)?,
            None => None,
        };
        Ok(Self {
            family,
            table: a.need_string(NFTA_SET_TABLE, "NFTA_SET_TABLE")?,
            name: a.need_string(NFTA_SET_NAME, "NFTA_SET_NAME")?,
            flags: a.be32(NFTA_SET_FLAGS)?.unwrap_or(0),
            key_type: a.be32(NFTA_SET_KEY_TYPE)?.unwrap_or(0),
            key_len: a.need_be32(NFTA_SET_KEY_LEN, "NFTA_SET_KEY_LEN")?,
            data_type: a.be32(NFTA_SET_DATA_TYPE)?,
            data_len: a.be32(NFTA_SET_DATA_LEN)?,
            timeout_ms: a.be64(NFTA_SET_TIMEOUT)?,
            size,
            set_id: a.be32(NFTA_SET_ID)?,
            userdata: a.bytes(NFTA_SET_USERDATA).map(<[u8]>::to_vec),
        })
    }

    /// Whether `self` (wanted) and `held` (read from the kernel) are the same set: the
    /// attributes the kernel keeps and uses compared, not the informational ones.
    #[must_use]
    pub fn same_definition(&self, held: &Self) -> bool {
        let relevant = NFT_SET_MAP | NFT_SET_TIMEOUT | NFT_SET_EVAL | NFT_SET_INTERVAL;
        let verdicts = self.data_type == Some(NFT_DATA_VERDICT);
        self.flags & relevant == held.flags & relevant
            && self.key_len == held.key_len
            && verdicts == (held.data_type == Some(NFT_DATA_VERDICT))
            // The kernel fills in a verdict's length itself.
            && (verdicts || self.data_len.unwrap_or(0) == held.data_len.unwrap_or(0))
            && self.timeout_ms.unwrap_or(0) == held.timeout_ms.unwrap_or(0)
    }
}

/// `NFT_MSG_DELSET` of `set` (no rule may use it any more).
#[must_use]
pub fn delete_set(family: u8, table: &str, set: &str) -> Vec<u8> {
    let mut buf = start(NFT_MSG_DELSET, 0, family);
    put_str(&mut buf, NFTA_SET_TABLE, table);
    put_str(&mut buf, NFTA_SET_NAME, set);
    frame::finish_message(buf)
}

/// `NFT_MSG_DELSETELEM` without elements: every element of `set` (`flush set`).
#[must_use]
pub fn flush_set(family: u8, table: &str, set: &str) -> Vec<u8> {
    let mut buf = start(NFT_MSG_DELSETELEM, 0, family);
    put_str(&mut buf, NFTA_SET_ELEM_LIST_TABLE, table);
    put_str(&mut buf, NFTA_SET_ELEM_LIST_SET, set);
    frame::finish_message(buf)
}

// ---- set elements --------------------------------------------------------------------------

/// A set element's data as a dump carries it: none (a set), a value or a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElementData<'a> {
    /// An element of a plain set.
    None,
    /// A data map's value.
    Value(&'a [u8]),
    /// A verdict map's verdict.
    Verdict(Verdict),
}

/// One element as a dump carries it (borrowing its bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElementRef<'a> {
    /// The key.
    pub key: &'a [u8],
    /// The data.
    pub data: ElementData<'a>,
    /// `NFTA_SET_ELEM_EXPIRATION` of an element with a timeout, in milliseconds.
    pub expires_ms: Option<u64>,
}

/// Appends one element's nest: its key and, for a map, its data. nft numbers the
/// nests of a list 1, 2, 3... (`index`); the kernel reads them whatever their type.
pub fn encode_element(buf: &mut Vec<u8>, index: u16, key: &[u8], data: Option<&Data>) {
    put_nest(buf, index.max(NFTA_LIST_ELEM), |b| {
        put_nest(b, NFTA_SET_ELEM_KEY, |b| put_attr(b, NFTA_DATA_VALUE, key));
        if let Some(data) = data {
            put_nest(b, NFTA_SET_ELEM_DATA, |b| data.encode(b));
        }
    });
}

/// The start of an `NFT_MSG_NEWSETELEM` (`add`) or `NFT_MSG_DELSETELEM` message for
/// `set` (with `NFTA_SET_ELEM_LIST_SET_ID` when `set_id` is given, as nft sends it),
/// up to its open `NFTA_SET_ELEM_LIST_ELEMENTS` nest; returns the message and where the
/// nest starts. Append elements with [`encode_element`], then close with
/// [`finish_elements`].
#[must_use]
pub fn start_elements(
    add: bool,
    family: u8,
    table: &str,
    set: &str,
    set_id: Option<u32>,
) -> (Vec<u8>, usize) {
    let (msg, flags) = if add {
        (NFT_MSG_NEWSETELEM, NLM_F_CREATE)
    } else {
        (NFT_MSG_DELSETELEM, 0)
    };
    let mut buf = start(msg, flags, family);
    put_str(&mut buf, NFTA_SET_ELEM_LIST_TABLE, table);
    put_str(&mut buf, NFTA_SET_ELEM_LIST_SET, set);
    if let Some(id) = set_id {
        put_be32(&mut buf, NFTA_SET_ELEM_LIST_SET_ID, id);
    }
    let nest = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(
        &(NFTA_SET_ELEM_LIST_ELEMENTS | crate::kernel::netlink::frame::NLA_F_NESTED).to_ne_bytes(),
    );
    (buf, nest)
}

/// Closes the elements nest opened at `nest` and the message.
#[must_use]
pub fn finish_elements(mut buf: Vec<u8>, nest: usize) -> Vec<u8> {
    let len = (buf.len() - nest) as u16;
    if let Some(field) = buf.get_mut(nest..nest + 2) {
        field.copy_from_slice(&len.to_ne_bytes());
    }
    frame::finish_message(buf)
}

/// Calls `each` with every element of an element-list body (a `NEWSETELEM` or
/// `DELSETELEM` request, or a `GETSETELEM` dump part); returns the set's name.
///
/// # Errors
/// A malformed body or element.
pub fn decode_elements<'a>(body: &'a [u8], each: &mut dyn FnMut(ElementRef<'a>)) -> Result<String> {
    decode_element_list(body, each).map(|(set, _)| set)
}

/// [`decode_elements`], returning the set's id too (`NFTA_SET_ELEM_LIST_SET_ID`).
///
/// # Errors
/// A malformed body or element.
pub fn decode_element_list<'a>(
    body: &'a [u8],
    each: &mut dyn FnMut(ElementRef<'a>),
) -> Result<(String, Option<u32>)> {
    let a = Attrs::parse(body)?;
    let set = a.need_string(NFTA_SET_ELEM_LIST_SET, "NFTA_SET_ELEM_LIST_SET")?;
    let set_id = a.be32(NFTA_SET_ELEM_LIST_SET_ID)?;
    if let Some(nest) = a.bytes(NFTA_SET_ELEM_LIST_ELEMENTS) {
        for elem in list(nest)? {
            let e = Attrs::parse(elem)?;
            let key_nest = Attrs::parse(e.need(NFTA_SET_ELEM_KEY, "NFTA_SET_ELEM_KEY")?)?;
            let key = key_nest.need(NFTA_DATA_VALUE, "NFTA_DATA_VALUE")?;
            let data = match e.bytes(NFTA_SET_ELEM_DATA) {
                None => ElementData::None,
                Some(nest) => {
                    let d = Attrs::parse(nest)?;
                    if let Some(value) = d.bytes(NFTA_DATA_VALUE) {
                        ElementData::Value(value)
                    } else if let Some(verdict) = d.bytes(NFTA_DATA_VERDICT) {
                        ElementData::Verdict(Verdict::decode(verdict)?)
                    } else {
                        return Err(NftCodecError::BadData);
                    }
                }
            };
            each(ElementRef {
                key,
                data,
                expires_ms: e.be64(NFTA_SET_ELEM_EXPIRATION)?,
            });
        }
    }
    Ok((set, set_id))
}

// ---- dumps and the generation ----------------------------------------------------------

/// A dump request (`NFT_MSG_GET*` with `NLM_F_DUMP`) of the objects of `table`.
#[must_use]
pub fn dump_request(msg: u8, family: u8, table: &str) -> Vec<u8> {
    let mut buf = start(msg, NLM_F_DUMP, family);
    // NFTA_{CHAIN,RULE,SET}_TABLE are all attribute 1.
    put_str(&mut buf, 1, table);
    frame::finish_message(buf)
}

/// A `NFT_MSG_GETSETELEM` dump request of the elements of `set`.
#[must_use]
pub fn dump_elements_request(family: u8, table: &str, set: &str) -> Vec<u8> {
    let mut buf = start(NFT_MSG_GETSETELEM, NLM_F_DUMP, family);
    put_str(&mut buf, NFTA_SET_ELEM_LIST_TABLE, table);
    put_str(&mut buf, NFTA_SET_ELEM_LIST_SET, set);
    frame::finish_message(buf)
}

/// A `NFT_MSG_GETTABLE` request for one table (answered with the table, or `ENOENT`).
#[must_use]
pub fn get_table_request(family: u8, table: &str) -> Vec<u8> {
    let mut buf = start(NFT_MSG_GETTABLE, NLM_F_ACK, family);
    put_str(&mut buf, NFTA_TABLE_NAME, table);
    frame::finish_message(buf)
}

/// A `NFT_MSG_GETGEN` request.
#[must_use]
pub fn get_generation_request() -> Vec<u8> {
    frame::finish_message(start(NFT_MSG_GETGEN, 0, NFPROTO_UNSPEC))
}

/// The generation in a `NFT_MSG_NEWGEN` message's body.
///
/// # Errors
/// A malformed body or no `NFTA_GEN_ID`.
pub fn decode_generation(body: &[u8]) -> Result<u32> {
    Attrs::parse(body)?.need_be32(NFTA_GEN_ID, "NFTA_GEN_ID")
}

/// A message's nf_tables command (`NFT_MSG_*`), its family and its body (the attributes
/// after the `nfgenmsg`).
///
/// # Errors
/// A message too short for its headers, or not of the nf_tables subsystem.
pub fn split(message: &[u8]) -> Result<(u8, u8, &[u8])> {
    let header = frame::message_at(message, 0)?;
    let [subsys, msg] = header.header.message_type.to_be_bytes();
    if subsys != NFNL_SUBSYS_NFTABLES {
        return Err(NftCodecError::UnexpectedMessage(header.header.message_type));
    }
    let family = *header.bytes.get(NLMSG_HDRLEN).ok_or(
        crate::kernel::netlink::frame::NetlinkFormatError::Truncated {
            what: "nfgenmsg",
            needed: NFGENMSG_LEN,
            available: 0,
        },
    )?;
    let body = header
        .bytes
        .get(NLMSG_HDRLEN + NFGENMSG_LEN..)
        .unwrap_or_default();
    Ok((msg, family, body))
}

/// What a request message asks, for errors and logs: `add rule to ip proxyplan
/// services`, `delete 3 element(s) of ip proxyplan service-ips`.
#[must_use]
pub fn describe(message: &[u8]) -> String {
    let Ok((msg, family, body)) = split(message) else {
        return "a malformed message".to_owned();
    };
    let family_name = match family {
        NFPROTO_IPV4 => "ip",
        NFPROTO_IPV6 => "ip6",
        _ => "unspec",
    };
    let attrs = Attrs::parse(body).unwrap_or_default();
    let text = |kind| {
        attrs
            .string(kind)
            .ok()
            .flatten()
            .unwrap_or_else(|| "?".to_owned())
    };
    let table = text(1);
    match msg {
        NFT_MSG_NEWTABLE => format!("add table {family_name} {table}"),
        NFT_MSG_DELTABLE => format!("delete table {family_name} {table}"),
        NFT_MSG_NEWCHAIN => format!("add chain {family_name} {table} {}", text(NFTA_CHAIN_NAME)),
        NFT_MSG_DELCHAIN => format!(
            "delete chain {family_name} {table} {}",
            text(NFTA_CHAIN_NAME)
        ),
        NFT_MSG_NEWRULE => format!(
            "add rule to {family_name} {table} {}",
            text(NFTA_RULE_CHAIN)
        ),
        NFT_MSG_DELRULE => format!(
            "flush chain {family_name} {table} {}",
            text(NFTA_RULE_CHAIN)
        ),
        NFT_MSG_NEWSET => format!("add set {family_name} {table} {}", text(NFTA_SET_NAME)),
        NFT_MSG_DELSET => format!("delete set {family_name} {table} {}", text(NFTA_SET_NAME)),
        NFT_MSG_NEWSETELEM | NFT_MSG_DELSETELEM => {
            let mut count = 0;
            let _ = decode_elements(body, &mut |_| count += 1);
            let verb = if msg == NFT_MSG_NEWSETELEM {
                "add"
            } else {
                "delete"
            };
            format!(
                "{verb} {count} element(s) of {family_name} {table} {}",
                text(NFTA_SET_ELEM_LIST_SET)
            )
        }
        other => format!("nf_tables message {other}"),
    }
}
