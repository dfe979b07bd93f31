//! ipsets over netlink: the kernel's `ip_set` subsystem of nfnetlink, spoken directly, so
//! a change costs a `send` and a `recv` instead of an `ipset restore` process.
//!
//! The codec is pure (typed requests to bytes, the kernel's listings to typed values,
//! with annotated byte-level round-trip tests); [`IpsetNetlink`] is the socket at the
//! edge. Constants are named after their definitions in the Linux uapi headers
//! (`include/uapi/linux/netfilter/nfnetlink.h`, `netfilter.h`, `netlink.h` and
//! `netfilter/ipset/ip_set.h`, `ip_set_hash.h`, `ip_set_bitmap.h`).
//!
//! Layout of every message (native byte order unless noted):
//!
//! ```text
//! nlmsghdr  u32 len | u16 type (NFNL_SUBSYS_IPSET << 8 | IPSET_CMD_*) | u16 flags | u32 seq | u32 pid
//! nfgenmsg  u8 family (AF_INET, ignored) | u8 version (NFNETLINK_V0) | be16 res_id (0)
//! nlattr*   IPSET_ATTR_PROTOCOL (in every message), IPSET_ATTR_SETNAME, ...
//!           IPSET_ATTR_DATA | NLA_F_NESTED: create options, a set's header, or one entry
//!           IPSET_ATTR_ADT  | NLA_F_NESTED: in listings, one IPSET_ATTR_DATA per entry
//! ```
//!
//! Inside `IPSET_ATTR_DATA`, integers wider than a byte are big-endian and flagged
//! `NLA_F_NET_BYTEORDER` (the kernel refuses them unflagged); an address is a nest
//! (`IPSET_ATTR_IP`, `IPSET_ATTR_IP2`) holding one `IPSET_ATTR_IPADDR_IPV4` or
//! `IPSET_ATTR_IPADDR_IPV6`, flagged in requests and unflagged in the kernel's listings.
//!
//! # What the kernel answers
//!
//! Requests carry `NLM_F_EXCL` only for [`SetOp::Del`]. Without it the kernel acts as
//! `ipset -exist` does (it sets `IPSET_FLAG_EXIST` itself), so:
//!
//! | errno | meaning |
//! |---|---|
//! | 0 | done; also Create of an existing set of the same type and options, Add of an entry the set already holds, and Destroy of a set that does not exist |
//! | `-IPSET_ERR_EXIST` (-4103) | Del of an entry the set does not hold (nothing changed) |
//! | `-ENOENT` (-2) | Add or Del on a set that does not exist |
//! | `-EEXIST` (-17) | Create of a name taken by a set of another type or options (`maxelem`) |
//! | `-IPSET_ERR_BUSY` (-4100) | Destroy of a set an iptables rule still references |
//! | `-IPSET_ERR_PROTOCOL` (-4097) | an entry of the other family than the set's (or a malformed message) |
//! | `-IPSET_ERR_INVALID_CIDR` (-4104) | `hash:ip,port,net` with prefix length 0 |
//! | `-IPSET_ERR_HASH_FULL` (-4352) | the set holds `maxelem` entries |
//! | `-IPSET_ERR_FIND_TYPE` (-4098) | the kernel lacks the set type or revision ([`type_revision`]; from the kernel sources, not seen on a test kernel) |
//! | `-EINVAL` (-22) | the operation could not be encoded and was not sent ([`IpsetCodecError`]) |
//!
//! [`error_name`] turns these into their header names for logs.
//!
//! Create of a name taken by a set of the same type and options but the *other family*
//! returns 0 and leaves that set as it is: the kernel compares types, not families
//! (`ipset -exist create` behaves the same). Compare [`IpsetNetlink::list`]'s specs first,
//! as [`super::ipset::SetChanges`] does with its `mismatched` sets.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_sys::protocols::NETLINK_NETFILTER;
use nix::errno::Errno;

use super::ipset::{IpSet, SetEntry, SetSpec, SetType, Sets, is_owned};
// The tests pad listings with `align4`.
#[cfg(test)]
use crate::kernel::netlink::frame::align4;
use crate::kernel::netlink::frame::{
    self, Attribute, NLA_F_NESTED, NLA_F_NET_BYTEORDER, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP,
    NLM_F_EXCL, NLM_F_REQUEST, NLMSG_HDRLEN, NetlinkFormatError, NetlinkHeader, attributes,
    put_attr, put_nest, put_net16, put_net32, put_string, put_u8,
};
use crate::kernel::netlink::socket::NetlinkSocket;

// ---- nfnetlink.h, netfilter.h ----------------------------------------------------------

/// `NFNL_SUBSYS_IPSET`: the high byte of every ipset message type.
pub const NFNL_SUBSYS_IPSET: u8 = 6;
/// `NFNETLINK_V0`: the `nfgenmsg` version.
pub const NFNETLINK_V0: u8 = 0;
/// `NFPROTO_UNSPEC`: the family of `bitmap:port` sets.
pub const NFPROTO_UNSPEC: u8 = 0;
/// `NFPROTO_IPV4` (`family inet`); also the `nfgenmsg` family ipset sends.
pub const NFPROTO_IPV4: u8 = 2;
/// `NFPROTO_IPV6` (`family inet6`).
pub const NFPROTO_IPV6: u8 = 10;

// ---- ip_set.h: protocol and commands ---------------------------------------------------

/// `IPSET_PROTOCOL`: the protocol version sent in every message (kernels since 3.x
/// accept 6 and 7).
pub const IPSET_PROTOCOL: u8 = 7;
/// `IPSET_MAXNAMELEN`: set and type names, NUL included.
pub const IPSET_MAXNAMELEN: usize = 32;
/// `IPSET_CMD_CREATE`: create a new (empty) set.
pub const IPSET_CMD_CREATE: u8 = 2;
/// `IPSET_CMD_DESTROY`: destroy a set.
pub const IPSET_CMD_DESTROY: u8 = 3;
/// `IPSET_CMD_LIST`: list sets (a dump; also the type of every listing message).
pub const IPSET_CMD_LIST: u8 = 7;
/// `IPSET_CMD_ADD`: add an element to a set.
pub const IPSET_CMD_ADD: u8 = 9;
/// `IPSET_CMD_DEL`: delete an element from a set.
pub const IPSET_CMD_DEL: u8 = 10;

// ---- ip_set.h: command-level attributes ------------------------------------------------

/// `IPSET_ATTR_PROTOCOL` (u8): protocol version, required in every message.
pub const IPSET_ATTR_PROTOCOL: u16 = 1;
/// `IPSET_ATTR_SETNAME` (NUL-terminated string).
pub const IPSET_ATTR_SETNAME: u16 = 2;
/// `IPSET_ATTR_TYPENAME` (NUL-terminated string): `"hash:ip,port"`.
pub const IPSET_ATTR_TYPENAME: u16 = 3;
/// `IPSET_ATTR_REVISION` (u8): the set type's revision.
pub const IPSET_ATTR_REVISION: u16 = 4;
/// `IPSET_ATTR_FAMILY` (u8): `NFPROTO_*`.
pub const IPSET_ATTR_FAMILY: u16 = 5;
/// `IPSET_ATTR_FLAGS` (be32): command flags, `IPSET_FLAG_*`.
pub const IPSET_ATTR_FLAGS: u16 = 6;
/// `IPSET_ATTR_DATA` (nested): create options, a set's header or one entry.
pub const IPSET_ATTR_DATA: u16 = 7;
/// `IPSET_ATTR_ADT` (nested): a listing's entries, each an `IPSET_ATTR_DATA`.
pub const IPSET_ATTR_ADT: u16 = 8;
/// `IPSET_ATTR_INDEX` (be16): the kernel's index of a set, in listings.
pub const IPSET_ATTR_INDEX: u16 = 11;

// ---- ip_set.h: data attributes ---------------------------------------------------------

/// `IPSET_ATTR_IP` (nested address): an entry's first address.
pub const IPSET_ATTR_IP: u16 = 1;
/// `IPSET_ATTR_PORT` (be16): an entry's port; `IPSET_ATTR_PORT_FROM` at create.
pub const IPSET_ATTR_PORT: u16 = 4;
/// `IPSET_ATTR_PORT_TO` (be16): the last port of a `bitmap:port` range.
pub const IPSET_ATTR_PORT_TO: u16 = 5;
/// `IPSET_ATTR_PROTO` (u8): an entry's `IPPROTO_*`.
pub const IPSET_ATTR_PROTO: u16 = 7;
/// `IPSET_ATTR_INITVAL` (be32): a hash set's hash seed, in listings.
pub const IPSET_ATTR_INITVAL: u16 = 17;
/// `IPSET_ATTR_HASHSIZE` (be32): a hash set's initial bucket count.
pub const IPSET_ATTR_HASHSIZE: u16 = 18;
/// `IPSET_ATTR_MAXELEM` (be32): a hash set's entry limit.
pub const IPSET_ATTR_MAXELEM: u16 = 19;
/// `IPSET_ATTR_BUCKETSIZE` (u8): entries per bucket, in listings.
pub const IPSET_ATTR_BUCKETSIZE: u16 = 21;
/// `IPSET_ATTR_ELEMENTS` (be32): the number of entries, in listings.
pub const IPSET_ATTR_ELEMENTS: u16 = 24;
/// `IPSET_ATTR_REFERENCES` (be32): rules referencing the set, in listings.
pub const IPSET_ATTR_REFERENCES: u16 = 25;
/// `IPSET_ATTR_MEMSIZE` (be32): the set's memory, in listings.
pub const IPSET_ATTR_MEMSIZE: u16 = 26;
/// `IPSET_ATTR_IP2` (nested address): an entry's second address or network.
pub const IPSET_ATTR_IP2: u16 = 20;
/// `IPSET_ATTR_CIDR2` (u8): the prefix length of `IPSET_ATTR_IP2`.
pub const IPSET_ATTR_CIDR2: u16 = 21;
/// `IPSET_ATTR_IPADDR_IPV4` (4 bytes, network order), inside an address nest.
pub const IPSET_ATTR_IPADDR_IPV4: u16 = 1;
/// `IPSET_ATTR_IPADDR_IPV6` (16 bytes), inside an address nest.
pub const IPSET_ATTR_IPADDR_IPV6: u16 = 2;

/// `IPSET_FLAG_LIST_SETNAME`: a listing of names only.
pub const IPSET_FLAG_LIST_SETNAME: u32 = 1 << 1;

// ---- ip_set.h, ip_set_hash.h, ip_set_bitmap.h: errnos (the kernel negates them) --------

/// `IPSET_ERR_PROTOCOL`: a malformed or incomplete message.
pub const IPSET_ERR_PROTOCOL: i32 = 4097;
/// `IPSET_ERR_FIND_TYPE`: no such set type or revision in this kernel.
pub const IPSET_ERR_FIND_TYPE: i32 = 4098;
/// `IPSET_ERR_MAX_SETS`: the set limit is reached.
pub const IPSET_ERR_MAX_SETS: i32 = 4099;
/// `IPSET_ERR_BUSY`: the set is referenced (by an iptables rule) and cannot be destroyed.
pub const IPSET_ERR_BUSY: i32 = 4100;
/// `IPSET_ERR_EXIST_SETNAME2`: the second set of a swap or rename does not exist.
pub const IPSET_ERR_EXIST_SETNAME2: i32 = 4101;
/// `IPSET_ERR_TYPE_MISMATCH`: the sets of a swap have different types.
pub const IPSET_ERR_TYPE_MISMATCH: i32 = 4102;
/// `IPSET_ERR_EXIST`: the entry is already added (with `NLM_F_EXCL`) or not there (Del).
pub const IPSET_ERR_EXIST: i32 = 4103;
/// `IPSET_ERR_INVALID_CIDR`: a prefix length out of range.
pub const IPSET_ERR_INVALID_CIDR: i32 = 4104;
/// `IPSET_ERR_INVALID_NETMASK`: a netmask out of range.
pub const IPSET_ERR_INVALID_NETMASK: i32 = 4105;
/// `IPSET_ERR_INVALID_FAMILY`: a family the set type does not support.
pub const IPSET_ERR_INVALID_FAMILY: i32 = 4106;
/// `IPSET_ERR_TIMEOUT`: timeout given for a set without timeout support.
pub const IPSET_ERR_TIMEOUT: i32 = 4107;
/// `IPSET_ERR_REFERENCED`: the set is referenced by another set.
pub const IPSET_ERR_REFERENCED: i32 = 4108;
/// `IPSET_ERR_IPADDR_IPV4`: an IPv4 address was expected.
pub const IPSET_ERR_IPADDR_IPV4: i32 = 4109;
/// `IPSET_ERR_IPADDR_IPV6`: an IPv6 address was expected.
pub const IPSET_ERR_IPADDR_IPV6: i32 = 4110;
/// `IPSET_ERR_HASH_FULL` (`IPSET_ERR_TYPE_SPECIFIC`): the hash set is full.
pub const IPSET_ERR_HASH_FULL: i32 = 4352;
/// `IPSET_ERR_HASH_ELEM`: a null-valued entry.
pub const IPSET_ERR_HASH_ELEM: i32 = 4353;
/// `IPSET_ERR_INVALID_PROTO`: protocol 0.
pub const IPSET_ERR_INVALID_PROTO: i32 = 4354;
/// `IPSET_ERR_MISSING_PROTO`: the protocol is missing.
pub const IPSET_ERR_MISSING_PROTO: i32 = 4355;
/// `IPSET_ERR_BITMAP_RANGE` (`IPSET_ERR_TYPE_SPECIFIC` of bitmaps): out of the set's range.
pub const IPSET_ERR_BITMAP_RANGE: i32 = 4352;

/// The name of an errno as [`IpsetNetlink::execute`] returns it (negative or positive),
/// for logs: `"IPSET_ERR_EXIST"`, `"ENOENT"`. Type-specific codes (4352 and up) are
/// named for hash sets, the types that can return them from an Add.
#[must_use]
pub fn error_name(errno: i32) -> String {
    let name = match errno.abs() {
        0 => "OK",
        IPSET_ERR_PROTOCOL => "IPSET_ERR_PROTOCOL",
        IPSET_ERR_FIND_TYPE => "IPSET_ERR_FIND_TYPE",
        IPSET_ERR_MAX_SETS => "IPSET_ERR_MAX_SETS",
        IPSET_ERR_BUSY => "IPSET_ERR_BUSY",
        IPSET_ERR_EXIST_SETNAME2 => "IPSET_ERR_EXIST_SETNAME2",
        IPSET_ERR_TYPE_MISMATCH => "IPSET_ERR_TYPE_MISMATCH",
        IPSET_ERR_EXIST => "IPSET_ERR_EXIST",
        IPSET_ERR_INVALID_CIDR => "IPSET_ERR_INVALID_CIDR",
        IPSET_ERR_INVALID_NETMASK => "IPSET_ERR_INVALID_NETMASK",
        IPSET_ERR_INVALID_FAMILY => "IPSET_ERR_INVALID_FAMILY",
        IPSET_ERR_TIMEOUT => "IPSET_ERR_TIMEOUT",
        IPSET_ERR_REFERENCED => "IPSET_ERR_REFERENCED",
        IPSET_ERR_IPADDR_IPV4 => "IPSET_ERR_IPADDR_IPV4",
        IPSET_ERR_IPADDR_IPV6 => "IPSET_ERR_IPADDR_IPV6",
        IPSET_ERR_HASH_FULL => "IPSET_ERR_HASH_FULL",
        IPSET_ERR_HASH_ELEM => "IPSET_ERR_HASH_ELEM",
        IPSET_ERR_INVALID_PROTO => "IPSET_ERR_INVALID_PROTO",
        IPSET_ERR_MISSING_PROTO => "IPSET_ERR_MISSING_PROTO",
        other => {
            return match Errno::from_raw(other) {
                Errno::UnknownErrno => format!("errno {other}"),
                known => format!("{known:?}"),
            };
        }
    };
    name.to_owned()
}

// ---- the sets we create ----------------------------------------------------------------

/// `hashsize` of the hash sets we create (as [`SetSpec::create_options`] says).
pub const HASH_SIZE: u32 = 1024;
/// `maxelem` of the hash sets we create (as [`SetSpec::create_options`] says).
pub const MAX_ELEMENTS: u32 = 1_048_576;

/// The revision of `kind` we create: the one that added `bucketsize` and `initval`
/// (Linux 5.11). It is the newest revision Debian 12's 6.1 kernel has for `hash:ip` (5)
/// and `hash:ip,port` (6) (`bitmask`, 6.2, added 6 and 7), and current kernels still
/// accept it; `bitmap:port` has had revision 3 (`skbinfo`) since 3.x. An older kernel
/// answers `-IPSET_ERR_FIND_TYPE`.
#[must_use]
pub fn type_revision(kind: SetType) -> u8 {
    match kind {
        SetType::HashIp => 5,
        SetType::HashIpPort => 6,
        SetType::HashIpPortIp => 6,
        SetType::HashIpPortNet => 8,
        SetType::BitmapPort => 3,
    }
}

/// The set type named `name` as the kernel spells it, if it is one of ours.
#[must_use]
pub fn set_type(name: &str) -> Option<SetType> {
    [
        SetType::HashIp,
        SetType::HashIpPort,
        SetType::HashIpPortIp,
        SetType::HashIpPortNet,
        SetType::BitmapPort,
    ]
    .into_iter()
    .find(|kind| kind.as_str() == name)
}

/// The `IPSET_ATTR_FAMILY` of a set of `spec`.
#[must_use]
pub fn spec_family(spec: SetSpec) -> u8 {
    match (spec.kind, spec.ipv6) {
        (SetType::BitmapPort, _) => NFPROTO_UNSPEC,
        (_, false) => NFPROTO_IPV4,
        (_, true) => NFPROTO_IPV6,
    }
}

// ---- typed messages --------------------------------------------------------------------

/// One change to the kernel's sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetOp<'a> {
    /// `IPSET_CMD_CREATE` of a set with [`SetSpec::create_options`]; 0 when an identical
    /// set exists.
    Create {
        /// The set's name (at most 31 bytes).
        name: &'a str,
        /// Type and family.
        spec: SetSpec,
    },
    /// `IPSET_CMD_DESTROY`; 0 when there is no such set.
    Destroy(&'a str),
    /// `IPSET_CMD_ADD` of one entry; 0 when the set holds it already.
    Add(&'a str, SetEntry),
    /// `IPSET_CMD_DEL` of one entry; `-IPSET_ERR_EXIST` when the set does not hold it.
    Del(&'a str, SetEntry),
}

impl std::fmt::Display for SetOp<'_> {
    /// The operation as an `ipset restore` line, for dry runs and logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Create { name, spec } => write!(f, "create {name} {}", spec.create_options()),
            Self::Destroy(name) => write!(f, "destroy {name}"),
            Self::Add(name, entry) => write!(f, "add {name} {entry}"),
            Self::Del(name, entry) => write!(f, "del {name} {entry}"),
        }
    }
}

/// A [`SetOp`] read back from a request's bytes (owning its name), for fakes and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetRequest {
    /// See [`SetOp::Create`].
    Create {
        /// The set's name.
        name: String,
        /// Type and family.
        spec: SetSpec,
    },
    /// See [`SetOp::Destroy`].
    Destroy(String),
    /// See [`SetOp::Add`].
    Add(String, SetEntry),
    /// See [`SetOp::Del`].
    Del(String, SetEntry),
}

impl SetRequest {
    /// The operation, borrowing the name.
    #[must_use]
    pub fn as_op(&self) -> SetOp<'_> {
        match self {
            Self::Create { name, spec } => SetOp::Create { name, spec: *spec },
            Self::Destroy(name) => SetOp::Destroy(name),
            Self::Add(name, entry) => SetOp::Add(name, *entry),
            Self::Del(name, entry) => SetOp::Del(name, *entry),
        }
    }
}

/// The `IPSET_ATTR_DATA` of one entry, attribute by attribute, in the kernel's order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EntryAttributes {
    /// `IPSET_ATTR_IP`.
    pub ip: Option<IpAddr>,
    /// `IPSET_ATTR_IP2`.
    pub ip2: Option<IpAddr>,
    /// `IPSET_ATTR_PORT`.
    pub port: Option<u16>,
    /// `IPSET_ATTR_CIDR2`.
    pub cidr2: Option<u8>,
    /// `IPSET_ATTR_PROTO`.
    pub protocol: Option<u8>,
}

impl EntryAttributes {
    /// The attributes that carry `entry`.
    #[must_use]
    pub fn of(entry: SetEntry) -> Self {
        let none = Self::default();
        match entry {
            SetEntry::Port(port) => Self {
                port: Some(port),
                ..none
            },
            SetEntry::Ip(ip) => Self {
                ip: Some(ip),
                ..none
            },
            SetEntry::IpPort(ip, protocol, port) => Self {
                ip: Some(ip),
                port: Some(port),
                protocol: Some(protocol),
                ..none
            },
            SetEntry::IpPortIp(ip, protocol, port, ip2) => Self {
                ip: Some(ip),
                ip2: Some(ip2),
                port: Some(port),
                protocol: Some(protocol),
                ..none
            },
            SetEntry::IpPortNet(ip, protocol, port, net, prefix) => Self {
                ip: Some(ip),
                ip2: Some(net),
                port: Some(port),
                cidr2: Some(prefix),
                protocol: Some(protocol),
            },
        }
    }

    /// The entry of a set of type `kind` these attributes carry; `None` when one is
    /// missing. A `hash:ip,port,net` entry without `IPSET_ATTR_CIDR2` is a host.
    #[must_use]
    pub fn entry(&self, kind: SetType) -> Option<SetEntry> {
        let ip_port = || Some((self.ip?, self.protocol?, self.port?));
        Some(match kind {
            SetType::BitmapPort => SetEntry::Port(self.port?),
            SetType::HashIp => SetEntry::Ip(self.ip?),
            SetType::HashIpPort => {
                let (ip, protocol, port) = ip_port()?;
                SetEntry::IpPort(ip, protocol, port)
            }
            SetType::HashIpPortIp => {
                let (ip, protocol, port) = ip_port()?;
                SetEntry::IpPortIp(ip, protocol, port, self.ip2?)
            }
            SetType::HashIpPortNet => {
                let (ip, protocol, port) = ip_port()?;
                let net = self.ip2?;
                let prefix = self.cidr2.unwrap_or(if net.is_ipv4() { 32 } else { 128 });
                SetEntry::IpPortNet(ip, protocol, port, net, prefix)
            }
        })
    }

    /// The entry these attributes carry, judged by which are present (the shape of
    /// [`EntryAttributes::of`]): how a request is read without knowing the set's type.
    #[must_use]
    pub fn infer(&self) -> Option<SetEntry> {
        let kind = match (self.ip, self.ip2, self.port, self.cidr2, self.protocol) {
            (None, None, Some(_), None, None) => SetType::BitmapPort,
            (Some(_), None, None, None, None) => SetType::HashIp,
            (Some(_), None, Some(_), None, Some(_)) => SetType::HashIpPort,
            (Some(_), Some(_), Some(_), None, Some(_)) => SetType::HashIpPortIp,
            (Some(_), Some(_), Some(_), Some(_), Some(_)) => SetType::HashIpPortNet,
            _ => return None,
        };
        self.entry(kind)
    }
}

/// The `IPSET_ATTR_DATA` of a set's header in a listing, or of a create request: each
/// attribute present in the kernel's order (`bitmap:port`: the range; hash sets: size,
/// limit, bucket size, seed; both: references, memory, entries).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetHeaderData {
    /// `IPSET_ATTR_PORT_FROM`.
    pub port_from: Option<u16>,
    /// `IPSET_ATTR_PORT_TO`.
    pub port_to: Option<u16>,
    /// `IPSET_ATTR_HASHSIZE`.
    pub hash_size: Option<u32>,
    /// `IPSET_ATTR_MAXELEM`.
    pub max_elements: Option<u32>,
    /// `IPSET_ATTR_BUCKETSIZE`.
    pub bucket_size: Option<u8>,
    /// `IPSET_ATTR_INITVAL`.
    pub initval: Option<u32>,
    /// `IPSET_ATTR_REFERENCES`.
    pub references: Option<u32>,
    /// `IPSET_ATTR_MEMSIZE`.
    pub memory_size: Option<u32>,
    /// `IPSET_ATTR_ELEMENTS`.
    pub elements: Option<u32>,
}

impl SetHeaderData {
    /// The create options of a set of `spec` ([`SetSpec::create_options`]).
    #[must_use]
    pub fn create_options(spec: SetSpec) -> Self {
        match spec.kind {
            SetType::BitmapPort => Self {
                port_from: Some(0),
                port_to: Some(u16::MAX),
                ..Self::default()
            },
            _ => Self {
                hash_size: Some(HASH_SIZE),
                max_elements: Some(MAX_ELEMENTS),
                ..Self::default()
            },
        }
    }
}

/// What the first listing message of a set says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetHeader {
    /// `IPSET_ATTR_TYPENAME`.
    pub type_name: String,
    /// `IPSET_ATTR_FAMILY` (`NFPROTO_*`).
    pub family: u8,
    /// `IPSET_ATTR_REVISION`.
    pub revision: u8,
    /// `IPSET_ATTR_INDEX` (sent for protocol 7 requests).
    pub index: Option<u16>,
    /// `IPSET_ATTR_DATA`.
    pub data: SetHeaderData,
}

/// One `IPSET_CMD_LIST` reply message. A set's listing is one or more of them: the first
/// carries the header, every one some entries; a names-only listing carries neither.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListMessage {
    /// `nlmsg_flags` (`NLM_F_MULTI`).
    pub flags: u16,
    /// `nlmsg_seq`: the request's.
    pub seq: u32,
    /// `nlmsg_pid`: the socket's port id.
    pub port_id: u32,
    /// `IPSET_ATTR_PROTOCOL`: the request's.
    pub protocol: u8,
    /// `IPSET_ATTR_SETNAME`.
    pub name: String,
    /// The header, in the set's first message.
    pub header: Option<SetHeader>,
    /// `IPSET_ATTR_ADT`: the entries (`Some` and empty for an empty set).
    pub entries: Option<Vec<EntryAttributes>>,
}

// ---- errors ----------------------------------------------------------------------------

/// Why an operation cannot be encoded or bytes are not a valid ipset message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpsetCodecError {
    /// A header, message or attribute that does not fit, or a string that is not UTF-8.
    #[error(transparent)]
    Format(#[from] NetlinkFormatError),
    /// A required attribute is missing.
    #[error("missing attribute {0}")]
    MissingAttribute(&'static str),
    /// A message type other than the ipset command expected.
    #[error("unexpected message type {0:#06x}")]
    UnexpectedMessage(u16),
    /// A set name that is empty, longer than 31 bytes or holds a NUL.
    #[error("bad set name {0:?}")]
    BadName(String),
    /// An entry whose addresses are of different families.
    #[error("entry {0} mixes IPv4 and IPv6")]
    MixedFamilies(SetEntry),
    /// A `hash:ip,port,net` entry whose prefix is longer than its address.
    #[error("entry {0} has a prefix longer than its address")]
    BadPrefix(SetEntry),
    /// A request whose attributes carry no entry of ours, or a type we do not create.
    #[error("request {0} carries nothing we send")]
    UnknownRequest(&'static str),
}

impl IpsetCodecError {
    /// A stable short label for metrics.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Format(e) => e.label(),
            Self::MissingAttribute(_) => "missing_attribute",
            Self::UnexpectedMessage(_) => "unexpected_message",
            Self::BadName(_) => "bad_name",
            Self::MixedFamilies(_) => "mixed_families",
            Self::BadPrefix(_) => "bad_prefix",
            Self::UnknownRequest(_) => "unknown_request",
        }
    }
}

type Result<T> = std::result::Result<T, IpsetCodecError>;

// ---- encoding --------------------------------------------------------------------------

/// `sizeof(struct nfgenmsg)`.
const NFGEN_HDRLEN: usize = 4;

/// The `nlmsg_type` of ipset command `command`.
#[must_use]
pub const fn message_type(command: u8) -> u16 {
    ((NFNL_SUBSYS_IPSET as u16) << 8) | command as u16
}

/// Whether addresses carry `NLA_F_NET_BYTEORDER`: requests must, listings do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AddressFlag {
    NetOrder,
    Plain,
}

fn put_address(buf: &mut Vec<u8>, kind: u16, addr: IpAddr, flag: AddressFlag) {
    let flag = match flag {
        AddressFlag::NetOrder => NLA_F_NET_BYTEORDER,
        AddressFlag::Plain => 0,
    };
    put_nest(buf, kind | NLA_F_NESTED, |b| match addr {
        IpAddr::V4(a) => put_attr(b, IPSET_ATTR_IPADDR_IPV4 | flag, &a.octets()),
        IpAddr::V6(a) => put_attr(b, IPSET_ATTR_IPADDR_IPV6 | flag, &a.octets()),
    });
}

/// An entry's attributes in the order the kernel lists them (its requests accept any).
fn put_entry(buf: &mut Vec<u8>, entry: &EntryAttributes, flag: AddressFlag) {
    put_nest(buf, IPSET_ATTR_DATA | NLA_F_NESTED, |b| {
        if let Some(ip) = entry.ip {
            put_address(b, IPSET_ATTR_IP, ip, flag);
        }
        if let Some(ip2) = entry.ip2 {
            put_address(b, IPSET_ATTR_IP2, ip2, flag);
        }
        if let Some(port) = entry.port {
            put_net16(b, IPSET_ATTR_PORT, port);
        }
        if let Some(cidr) = entry.cidr2 {
            put_u8(b, IPSET_ATTR_CIDR2, cidr);
        }
        if let Some(protocol) = entry.protocol {
            put_u8(b, IPSET_ATTR_PROTO, protocol);
        }
    });
}

fn put_header_data(buf: &mut Vec<u8>, data: &SetHeaderData) {
    put_nest(buf, IPSET_ATTR_DATA | NLA_F_NESTED, |b| {
        if let Some(v) = data.port_from {
            put_net16(b, IPSET_ATTR_PORT, v);
        }
        if let Some(v) = data.port_to {
            put_net16(b, IPSET_ATTR_PORT_TO, v);
        }
        if let Some(v) = data.hash_size {
            put_net32(b, IPSET_ATTR_HASHSIZE, v);
        }
        if let Some(v) = data.max_elements {
            put_net32(b, IPSET_ATTR_MAXELEM, v);
        }
        if let Some(v) = data.bucket_size {
            put_u8(b, IPSET_ATTR_BUCKETSIZE, v);
        }
        if let Some(v) = data.initval {
            put_net32(b, IPSET_ATTR_INITVAL, v);
        }
        if let Some(v) = data.references {
            put_net32(b, IPSET_ATTR_REFERENCES, v);
        }
        if let Some(v) = data.memory_size {
            put_net32(b, IPSET_ATTR_MEMSIZE, v);
        }
        if let Some(v) = data.elements {
            put_net32(b, IPSET_ATTR_ELEMENTS, v);
        }
    });
}

/// `nlmsghdr` and `nfgenmsg` of a message of `command`, its length filled in by
/// [`frame::finish_message`], followed by `IPSET_ATTR_PROTOCOL`.
fn start(command: u8, flags: u16, seq: u32, port_id: u32, protocol: u8) -> Vec<u8> {
    let mut buf = frame::start_message(&NetlinkHeader {
        message_type: message_type(command),
        flags,
        seq,
        port_id,
    });
    buf.extend_from_slice(&[NFPROTO_IPV4, NFNETLINK_V0, 0, 0]);
    put_u8(&mut buf, IPSET_ATTR_PROTOCOL, protocol);
    buf
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() >= IPSET_MAXNAMELEN || name.contains('\0') {
        return Err(IpsetCodecError::BadName(name.to_owned()));
    }
    Ok(())
}

fn check_entry(entry: SetEntry) -> Result<()> {
    match entry {
        SetEntry::IpPortIp(ip, _, _, ip2) if ip.is_ipv4() != ip2.is_ipv4() => {
            Err(IpsetCodecError::MixedFamilies(entry))
        }
        SetEntry::IpPortNet(ip, _, _, net, _) if ip.is_ipv4() != net.is_ipv4() => {
            Err(IpsetCodecError::MixedFamilies(entry))
        }
        SetEntry::IpPortNet(_, _, _, net, prefix)
            if prefix > if net.is_ipv4() { 32 } else { 128 } =>
        {
            Err(IpsetCodecError::BadPrefix(entry))
        }
        _ => Ok(()),
    }
}

/// The `nlmsg_flags` of `op`: an ack for every request, `NLM_F_CREATE` for Create and
/// `NLM_F_EXCL` only for Del (see the module docs).
#[must_use]
pub fn request_flags(op: &SetOp<'_>) -> u16 {
    match op {
        SetOp::Create { .. } => NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE,
        SetOp::Del(..) => NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL,
        SetOp::Destroy(_) | SetOp::Add(..) => NLM_F_REQUEST | NLM_F_ACK,
    }
}

/// Encodes `op` as one complete request.
///
/// # Errors
/// A bad set name, or an entry mixing families or with a prefix longer than its address.
pub fn encode_op(op: &SetOp<'_>, seq: u32) -> Result<Vec<u8>> {
    let flags = request_flags(op);
    let buf = match *op {
        SetOp::Create { name, spec } => {
            check_name(name)?;
            let mut buf = start(IPSET_CMD_CREATE, flags, seq, 0, IPSET_PROTOCOL);
            put_string(&mut buf, IPSET_ATTR_SETNAME, name);
            put_string(&mut buf, IPSET_ATTR_TYPENAME, spec.kind.as_str());
            put_u8(&mut buf, IPSET_ATTR_REVISION, type_revision(spec.kind));
            put_u8(&mut buf, IPSET_ATTR_FAMILY, spec_family(spec));
            put_header_data(&mut buf, &SetHeaderData::create_options(spec));
            buf
        }
        SetOp::Destroy(name) => {
            check_name(name)?;
            let mut buf = start(IPSET_CMD_DESTROY, flags, seq, 0, IPSET_PROTOCOL);
            put_string(&mut buf, IPSET_ATTR_SETNAME, name);
            buf
        }
        SetOp::Add(name, entry) | SetOp::Del(name, entry) => {
            check_name(name)?;
            check_entry(entry)?;
            let command = if matches!(op, SetOp::Add(..)) {
                IPSET_CMD_ADD
            } else {
                IPSET_CMD_DEL
            };
            let mut buf = start(command, flags, seq, 0, IPSET_PROTOCOL);
            put_string(&mut buf, IPSET_ATTR_SETNAME, name);
            put_entry(&mut buf, &EntryAttributes::of(entry), AddressFlag::NetOrder);
            buf
        }
    };
    Ok(frame::finish_message(buf))
}

/// `IPSET_CMD_LIST` dump of every set's name (`IPSET_FLAG_LIST_SETNAME`).
#[must_use]
pub fn list_names_request(seq: u32) -> Vec<u8> {
    let mut buf = start(
        IPSET_CMD_LIST,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        0,
        IPSET_PROTOCOL,
    );
    put_net32(&mut buf, IPSET_ATTR_FLAGS, IPSET_FLAG_LIST_SETNAME);
    frame::finish_message(buf)
}

/// `IPSET_CMD_LIST` dump of the set `name`: its header and every entry.
///
/// # Errors
/// A bad set name.
pub fn list_set_request(name: &str, seq: u32) -> Result<Vec<u8>> {
    check_name(name)?;
    let mut buf = start(
        IPSET_CMD_LIST,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        0,
        IPSET_PROTOCOL,
    );
    put_string(&mut buf, IPSET_ATTR_SETNAME, name);
    Ok(frame::finish_message(buf))
}

/// Encodes a listing message as the kernel does (attribute order, unflagged addresses):
/// what a fake kernel answers, and the other half of the round-trip tests.
#[must_use]
pub fn encode_list_message(msg: &ListMessage) -> Vec<u8> {
    let mut buf = start(
        IPSET_CMD_LIST,
        msg.flags,
        msg.seq,
        msg.port_id,
        msg.protocol,
    );
    put_string(&mut buf, IPSET_ATTR_SETNAME, &msg.name);
    if let Some(header) = &msg.header {
        put_string(&mut buf, IPSET_ATTR_TYPENAME, &header.type_name);
        put_u8(&mut buf, IPSET_ATTR_FAMILY, header.family);
        put_u8(&mut buf, IPSET_ATTR_REVISION, header.revision);
        if let Some(index) = header.index {
            put_net16(&mut buf, IPSET_ATTR_INDEX, index);
        }
        put_header_data(&mut buf, &header.data);
    }
    if let Some(entries) = &msg.entries {
        put_nest(&mut buf, IPSET_ATTR_ADT | NLA_F_NESTED, |b| {
            for entry in entries {
                put_entry(b, entry, AddressFlag::Plain);
            }
        });
    }
    frame::finish_message(buf)
}

// ---- decoding --------------------------------------------------------------------------

/// An address nest's `IPSET_ATTR_IPADDR_IPV4` or `IPSET_ATTR_IPADDR_IPV6`. Integers
/// are read big-endian throughout: the kernel flags them all `NLA_F_NET_BYTEORDER`.
fn get_address(nla: &Attribute<'_>) -> Result<IpAddr> {
    for inner in attributes(nla.value) {
        let inner = inner?;
        match inner.kind {
            IPSET_ATTR_IPADDR_IPV4 => return Ok(IpAddr::V4(Ipv4Addr::from(inner.fixed()?))),
            IPSET_ATTR_IPADDR_IPV6 => return Ok(IpAddr::V6(Ipv6Addr::from(inner.fixed()?))),
            _ => {}
        }
    }
    Err(IpsetCodecError::MissingAttribute(
        "IPSET_ATTR_IPADDR_IPV4/IPV6",
    ))
}

/// An entry's `IPSET_ATTR_DATA`; attributes other than ours (timeouts, counters,
/// comments, flags) are skipped.
fn decode_entry(value: &[u8]) -> Result<EntryAttributes> {
    let mut entry = EntryAttributes::default();
    for nla in attributes(value) {
        let nla = nla?;
        match nla.kind {
            IPSET_ATTR_IP => entry.ip = Some(get_address(&nla)?),
            IPSET_ATTR_IP2 => entry.ip2 = Some(get_address(&nla)?),
            IPSET_ATTR_PORT => entry.port = Some(nla.get_be16()?),
            IPSET_ATTR_CIDR2 => entry.cidr2 = Some(nla.get_u8()?),
            IPSET_ATTR_PROTO => entry.protocol = Some(nla.get_u8()?),
            _ => {}
        }
    }
    Ok(entry)
}

fn decode_header_data(value: &[u8]) -> Result<SetHeaderData> {
    let mut data = SetHeaderData::default();
    for nla in attributes(value) {
        let nla = nla?;
        match nla.kind {
            IPSET_ATTR_PORT => data.port_from = Some(nla.get_be16()?),
            IPSET_ATTR_PORT_TO => data.port_to = Some(nla.get_be16()?),
            IPSET_ATTR_HASHSIZE => data.hash_size = Some(nla.get_be32()?),
            IPSET_ATTR_MAXELEM => data.max_elements = Some(nla.get_be32()?),
            IPSET_ATTR_BUCKETSIZE => data.bucket_size = Some(nla.get_u8()?),
            IPSET_ATTR_INITVAL => data.initval = Some(nla.get_be32()?),
            IPSET_ATTR_REFERENCES => data.references = Some(nla.get_be32()?),
            IPSET_ATTR_MEMSIZE => data.memory_size = Some(nla.get_be32()?),
            IPSET_ATTR_ELEMENTS => data.elements = Some(nla.get_be32()?),
            _ => {}
        }
    }
    Ok(data)
}

/// The header fields and attribute bytes of one message.
struct Raw<'a> {
    header: NetlinkHeader,
    attributes: &'a [u8],
}

fn split_message(bytes: &[u8]) -> Result<Raw<'_>> {
    const HEADERS: usize = NLMSG_HDRLEN + NFGEN_HDRLEN;
    if bytes.len() < HEADERS {
        return Err(NetlinkFormatError::Truncated {
            what: "nlmsghdr + nfgenmsg",
            needed: HEADERS,
            available: bytes.len(),
        }
        .into());
    }
    let message = frame::message_at(bytes, 0)?;
    let Some(attributes) = message.bytes.get(HEADERS..) else {
        return Err(NetlinkFormatError::BadLength {
            offset: 0,
            length: message.bytes.len(),
            available: bytes.len(),
        }
        .into());
    };
    Ok(Raw {
        header: message.header,
        attributes,
    })
}

/// Decodes one `IPSET_CMD_LIST` reply message (`bytes` starts at its `nlmsghdr`).
///
/// # Errors
/// Malformed bytes, another message type, or a message without a set name.
pub fn decode_list_message(bytes: &[u8]) -> Result<ListMessage> {
    let raw = split_message(bytes)?;
    if raw.header.message_type != message_type(IPSET_CMD_LIST) {
        return Err(IpsetCodecError::UnexpectedMessage(raw.header.message_type));
    }
    let mut protocol = None;
    let mut name = None;
    let mut type_name = None;
    let mut family = None;
    let mut revision = None;
    let mut index = None;
    let mut data = None;
    let mut entries = None;
    for nla in attributes(raw.attributes) {
        let nla = nla?;
        match nla.kind {
            IPSET_ATTR_PROTOCOL => protocol = Some(nla.get_u8()?),
            IPSET_ATTR_SETNAME => name = Some(nla.get_string()?),
            IPSET_ATTR_TYPENAME => type_name = Some(nla.get_string()?),
            IPSET_ATTR_FAMILY => family = Some(nla.get_u8()?),
            IPSET_ATTR_REVISION => revision = Some(nla.get_u8()?),
            IPSET_ATTR_INDEX => index = Some(nla.get_be16()?),
            IPSET_ATTR_DATA => data = Some(decode_header_data(nla.value)?),
            IPSET_ATTR_ADT => {
                let mut list = Vec::new();
                for inner in attributes(nla.value) {
                    let inner = inner?;
                    if inner.kind == IPSET_ATTR_DATA {
                        list.push(decode_entry(inner.value)?);
                    }
                }
                entries = Some(list);
            }
            _ => {}
        }
    }
    let missing = IpsetCodecError::MissingAttribute;
    let header = match type_name {
        Some(type_name) => Some(SetHeader {
            type_name,
            family: family.ok_or(missing("IPSET_ATTR_FAMILY"))?,
            revision: revision.ok_or(missing("IPSET_ATTR_REVISION"))?,
            index,
            data: data.unwrap_or_default(),
        }),
        None => None,
    };
    Ok(ListMessage {
        flags: raw.header.flags,
        seq: raw.header.seq,
        port_id: raw.header.port_id,
        protocol: protocol.ok_or(missing("IPSET_ATTR_PROTOCOL"))?,
        name: name.ok_or(missing("IPSET_ATTR_SETNAME"))?,
        header,
        entries,
    })
}

/// Decodes every listing message of a dump's bytes (as [`NetlinkSocket::dump`] returns
/// them: back to back, 4-aligned, without `NLMSG_DONE`).
///
/// # Errors
/// As [`decode_list_message`].
pub fn decode_list(buf: &[u8]) -> Result<Vec<ListMessage>> {
    each_message(buf)?
        .into_iter()
        .map(decode_list_message)
        .collect()
}

/// The messages of `buf`, each from its `nlmsghdr` to its length; a bad length is an
/// error (unlike [`super::netlink::messages`], which stops there).
fn each_message(buf: &[u8]) -> Result<Vec<&[u8]>> {
    frame::messages(buf)
        .map(|message| Ok(message?.bytes))
        .collect()
}

/// Reads a request we encode back into the operation (for fakes and tests).
///
/// # Errors
/// Malformed bytes, a command we do not send, or a missing attribute.
pub fn decode_request(bytes: &[u8]) -> Result<SetRequest> {
    let raw = split_message(bytes)?;
    let mut name = None;
    let mut type_name = None;
    let mut family = None;
    let mut data = None;
    for nla in attributes(raw.attributes) {
        let nla = nla?;
        match nla.kind {
            IPSET_ATTR_SETNAME => name = Some(nla.get_string()?),
            IPSET_ATTR_TYPENAME => type_name = Some(nla.get_string()?),
            IPSET_ATTR_FAMILY => family = Some(nla.get_u8()?),
            IPSET_ATTR_DATA => data = Some(nla.value),
            _ => {}
        }
    }
    let missing = IpsetCodecError::MissingAttribute;
    let name = name.ok_or(missing("IPSET_ATTR_SETNAME"))?;
    let entry = || -> Result<SetEntry> {
        let data = data.ok_or(missing("IPSET_ATTR_DATA"))?;
        decode_entry(data)?
            .infer()
            .ok_or(IpsetCodecError::UnknownRequest("entry"))
    };
    if raw.header.message_type >> 8 != u16::from(NFNL_SUBSYS_IPSET) {
        return Err(IpsetCodecError::UnexpectedMessage(raw.header.message_type));
    }
    let command = (raw.header.message_type & 0xff) as u8;
    Ok(match command {
        IPSET_CMD_CREATE => {
            let type_name = type_name.ok_or(missing("IPSET_ATTR_TYPENAME"))?;
            let kind = set_type(&type_name).ok_or(IpsetCodecError::UnknownRequest("type"))?;
            let family = family.ok_or(missing("IPSET_ATTR_FAMILY"))?;
            SetRequest::Create {
                name,
                spec: SetSpec {
                    kind,
                    ipv6: family == NFPROTO_IPV6,
                },
            }
        }
        IPSET_CMD_DESTROY => SetRequest::Destroy(name),
        IPSET_CMD_ADD => SetRequest::Add(name, entry()?),
        IPSET_CMD_DEL => SetRequest::Del(name, entry()?),
        _ => return Err(IpsetCodecError::UnexpectedMessage(raw.header.message_type)),
    })
}

/// Adds one listing message to `sets`: the first message of an owned set of a type of
/// ours starts it, every message adds its entries. Sets we do not own are skipped; owned
/// sets of other types too, as [`super::ipset::parse_save`] skips them.
pub fn merge_listing(sets: &mut Sets, msg: &ListMessage) {
    if !is_owned(&msg.name) {
        return;
    }
    if let Some(header) = &msg.header {
        match set_type(&header.type_name) {
            Some(kind) => {
                let ipv6 = header.family == NFPROTO_IPV6;
                sets.insert(msg.name.clone(), IpSet::new(kind, ipv6));
            }
            None => {
                sets.remove(&msg.name);
                return;
            }
        }
    }
    let Some(set) = sets.get_mut(&msg.name) else {
        return;
    };
    let kind = set.spec.kind;
    for attributes in msg.entries.iter().flatten() {
        if let Some(entry) = attributes.entry(kind) {
            set.entries.insert(entry);
        }
    }
}

// ---- the socket ------------------------------------------------------------------------

/// Operations per batch. Only failures and the batch's last request are answered, but
/// each answer holds about a kilobyte of the receive buffer until it is read, and that
/// buffer is 416 KiB where `net.core.rmem_max` is the default: a batch of 256 failures
/// fits (a lost answer would fail the whole call with `ENOBUFS`).
const OPS_PER_BATCH: usize = 256;

/// A netfilter netlink socket speaking to the kernel's ipset subsystem.
#[derive(Debug)]
pub struct IpsetNetlink {
    socket: NetlinkSocket,
}

fn invalid_data(error: IpsetCodecError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

impl IpsetNetlink {
    /// Opens a socket in the calling thread's network namespace.
    ///
    /// # Errors
    /// When the socket cannot be opened or bound.
    pub fn open() -> io::Result<Self> {
        Ok(Self {
            socket: NetlinkSocket::open(NETLINK_NETFILTER)?,
        })
    }

    /// Sends every op, in order and in batches, and returns one errno per op: 0 when
    /// done, a negative errno otherwise (the module docs list them). An op that cannot
    /// be encoded is not sent and gets `-EINVAL`. The kernel goes on after a failed op.
    ///
    /// # Errors
    /// When the socket fails; a refused op is not an error here.
    pub fn execute(&mut self, ops: &[SetOp<'_>]) -> io::Result<Vec<i32>> {
        let mut results = Vec::with_capacity(ops.len());
        for chunk in ops.chunks(OPS_PER_BATCH) {
            let mut requests = Vec::with_capacity(chunk.len());
            let mut sent = Vec::with_capacity(chunk.len());
            for op in chunk {
                let request = encode_op(op, 0);
                sent.push(request.is_ok());
                requests.extend(request.ok());
            }
            let mut answers = if requests.is_empty() {
                Vec::new()
            } else {
                self.socket.transact(requests)?
            }
            .into_iter();
            for sent in sent {
                let errno = if sent {
                    answers
                        .next()
                        .ok_or_else(|| io::Error::other("the kernel answered fewer requests"))?
                } else {
                    -(Errno::EINVAL as i32)
                };
                results.push(errno);
            }
        }
        Ok(results)
    }

    /// The names of every set that [`is_owned`] (one dump of names, no entries).
    ///
    /// # Errors
    /// When the socket fails, the kernel refuses the dump, or a reply is malformed.
    pub fn names(&mut self) -> io::Result<Vec<String>> {
        let names = self.socket.dump(list_names_request(0))?;
        let mut owned = Vec::new();
        for msg in each_message(&names).map_err(invalid_data)? {
            let msg = decode_list_message(msg).map_err(invalid_data)?;
            if is_owned(&msg.name) {
                owned.push(msg.name);
            }
        }
        Ok(owned)
    }

    /// Every set whose name [`is_owned`], with its spec and entries: one dump of the
    /// names, then one dump per owned set (sets of others are never read, however
    /// large). A set destroyed in between is left out; one of a type we do not create
    /// too, as [`super::ipset::parse_save`] does. Entries are kept whatever their
    /// protocol (`parse_save` drops those it cannot spell: none of ours).
    ///
    /// # Errors
    /// When the socket fails, the kernel refuses a dump, or a reply is malformed.
    pub fn list(&mut self) -> io::Result<Sets> {
        let mut sets = Sets::new();
        for name in self.names()? {
            let request = list_set_request(&name, 0)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            let listing = match self.socket.dump(request) {
                Ok(listing) => listing,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            for msg in each_message(&listing).map_err(invalid_data)? {
                merge_listing(&mut sets, &decode_list_message(msg).map_err(invalid_data)?);
            }
        }
        Ok(sets)
    }
}

/// Annotated byte vectors (x86-64 / little-endian byte order). Requests are encoded from
/// typed operations, checked byte for byte and read back; the listings are the real
/// kernel's (Linux 6.18, captured with `strace -e read=3 ipset save`), decoded and
/// re-encoded byte for byte.
#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::*;

    use std::collections::BTreeSet;

    use crate::kernel::netlink::frame::NLM_F_MULTI;

    const TCP: u8 = 6;
    const UDP: u8 = 17;

    #[allow(clippy::unwrap_used, reason = "literal test addresses")]
    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// Encodes `op`, checks the bytes, decodes them back to `op`.
    fn request_round_trip(op: SetOp<'_>, seq: u32, bytes: &[u8]) -> Result<()> {
        assert_eq!(encode_op(&op, seq)?, bytes, "encoding of {op:?}");
        assert_eq!(decode_request(bytes)?.as_op(), op);
        Ok(())
    }

    /// Decodes `bytes` as listing messages and checks they re-encode identically.
    fn listing_round_trip(bytes: &[u8]) -> Result<Vec<ListMessage>> {
        let msgs = decode_list(bytes)?;
        let mut again = Vec::new();
        for msg in &msgs {
            again.extend_from_slice(&encode_list_message(msg));
            again.resize(align4(again.len()), 0);
        }
        assert_eq!(again, bytes, "re-encoding differs");
        Ok(msgs)
    }

    #[test]
    fn create_hash_ip_port_inet() -> Result<()> {
        #[rustfmt::skip]
        let bytes: &[u8] = &[
            0x64, 0x00, 0x00, 0x00, // nlmsg_len 100
            0x02, 0x06,             // IPSET_CMD_CREATE | NFNL_SUBSYS_IPSET << 8
            0x05, 0x04,             // NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE (no NLM_F_EXCL)
            0x01, 0x00, 0x00, 0x00, // seq 1
            0x00, 0x00, 0x00, 0x00, // pid 0
            0x02, 0x00, 0x00, 0x00, // nfgenmsg: AF_INET, NFNETLINK_V0, res_id 0
            0x05, 0x00, 0x01, 0x00, // len 5, IPSET_ATTR_PROTOCOL
            0x07, 0x00, 0x00, 0x00, //   7 + pad
            0x10, 0x00, 0x02, 0x00, // len 16, IPSET_ATTR_SETNAME
            b'P', b'R', b'O', b'X', b'Y', b'P', b'L', b'A', b'N', b'-', b'X', 0x00,
            0x11, 0x00, 0x03, 0x00, // len 17, IPSET_ATTR_TYPENAME
            b'h', b'a', b's', b'h', b':', b'i', b'p', b',', b'p', b'o', b'r', b't',
            0x00, 0x00, 0x00, 0x00, //   NUL + pad
            0x05, 0x00, 0x04, 0x00, // len 5, IPSET_ATTR_REVISION
            0x06, 0x00, 0x00, 0x00, //   6 + pad
            0x05, 0x00, 0x05, 0x00, // len 5, IPSET_ATTR_FAMILY
            0x02, 0x00, 0x00, 0x00, //   NFPROTO_IPV4 + pad
            0x14, 0x00, 0x07, 0x80, // len 20, IPSET_ATTR_DATA | NLA_F_NESTED
            0x08, 0x00, 0x12, 0x40, //   len 8, IPSET_ATTR_HASHSIZE | NLA_F_NET_BYTEORDER
            0x00, 0x00, 0x04, 0x00, //     1024 (big-endian)
            0x08, 0x00, 0x13, 0x40, //   len 8, IPSET_ATTR_MAXELEM | NLA_F_NET_BYTEORDER
            0x00, 0x10, 0x00, 0x00, //     1048576 (big-endian)
        ];
        let spec = SetSpec {
            kind: SetType::HashIpPort,
            ipv6: false,
        };
        request_round_trip(
            SetOp::Create {
                name: "PROXYPLAN-X",
                spec,
            },
            1,
            bytes,
        )
    }

    #[test]
    fn create_hash_sets_inet6_differ_in_type_revision_and_family() -> Result<()> {
        for (kind, type_name, revision) in [
            (SetType::HashIp, "hash:ip", 5),
            (SetType::HashIpPort, "hash:ip,port", 6),
            (SetType::HashIpPortIp, "hash:ip,port,ip", 6),
            (SetType::HashIpPortNet, "hash:ip,port,net", 8),
        ] {
            let spec = SetSpec { kind, ipv6: true };
            let op = SetOp::Create {
                name: "PROXYPLAN6-X",
                spec,
            };
            let bytes = encode_op(&op, 2)?;
            let mut expected = vec![
                0x05, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00, // PROTOCOL 7
                0x11, 0x00, 0x02, 0x00, // len 17, SETNAME
            ];
            expected.extend_from_slice(b"PROXYPLAN6-X\0\0\0\0");
            expected.extend_from_slice(&((5 + type_name.len()) as u16).to_ne_bytes());
            expected.extend_from_slice(&[0x03, 0x00]); // TYPENAME
            expected.extend_from_slice(type_name.as_bytes());
            expected.resize(align4(expected.len() + 1), 0);
            expected.extend_from_slice(&[0x05, 0x00, 0x04, 0x00, revision, 0, 0, 0]);
            expected.extend_from_slice(&[0x05, 0x00, 0x05, 0x00, 0x0a, 0, 0, 0]); // NFPROTO_IPV6
            expected.extend_from_slice(&[
                0x14, 0x00, 0x07, 0x80, // DATA
                0x08, 0x00, 0x12, 0x40, 0x00, 0x00, 0x04, 0x00, // HASHSIZE 1024
                0x08, 0x00, 0x13, 0x40, 0x00, 0x10, 0x00, 0x00, // MAXELEM 1048576
            ]);
            assert_eq!(bytes.get(20..), Some(&expected[..]), "{type_name}");
            assert_eq!(decode_request(&bytes)?.as_op(), op);
        }
        Ok(())
    }

    #[test]
    fn create_bitmap_port() -> Result<()> {
        #[rustfmt::skip]
        let bytes: &[u8] = &[
            0x60, 0x00, 0x00, 0x00, // nlmsg_len 96
            0x02, 0x06,             // IPSET_CMD_CREATE
            0x05, 0x04,             // NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE
            0x03, 0x00, 0x00, 0x00, // seq 3
            0x00, 0x00, 0x00, 0x00, // pid 0
            0x02, 0x00, 0x00, 0x00, // nfgenmsg
            0x05, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00, // PROTOCOL 7
            0x10, 0x00, 0x02, 0x00, // len 16, SETNAME
            b'P', b'R', b'O', b'X', b'Y', b'P', b'L', b'A', b'N', b'-', b'P', 0x00,
            0x10, 0x00, 0x03, 0x00, // len 16, TYPENAME
            b'b', b'i', b't', b'm', b'a', b'p', b':', b'p', b'o', b'r', b't', 0x00,
            0x05, 0x00, 0x04, 0x00, 0x03, 0x00, 0x00, 0x00, // REVISION 3
            0x05, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, // FAMILY NFPROTO_UNSPEC
            0x14, 0x00, 0x07, 0x80, // len 20, DATA | NLA_F_NESTED
            0x06, 0x00, 0x04, 0x40, //   len 6, IPSET_ATTR_PORT_FROM | NLA_F_NET_BYTEORDER
            0x00, 0x00, 0x00, 0x00, //     0 + pad
            0x06, 0x00, 0x05, 0x40, //   len 6, IPSET_ATTR_PORT_TO | NLA_F_NET_BYTEORDER
            0xff, 0xff, 0x00, 0x00, //     65535 + pad
        ];
        let spec = SetSpec {
            kind: SetType::BitmapPort,
            ipv6: false,
        };
        request_round_trip(
            SetOp::Create {
                name: "PROXYPLAN-P",
                spec,
            },
            3,
            bytes,
        )
    }

    #[test]
    fn destroy() -> Result<()> {
        #[rustfmt::skip]
        let bytes: &[u8] = &[
            0x2c, 0x00, 0x00, 0x00, // nlmsg_len 44
            0x03, 0x06,             // IPSET_CMD_DESTROY
            0x05, 0x00,             // NLM_F_REQUEST | NLM_F_ACK
            0x04, 0x00, 0x00, 0x00, // seq 4
            0x00, 0x00, 0x00, 0x00, // pid 0
            0x02, 0x00, 0x00, 0x00, // nfgenmsg
            0x05, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00, // PROTOCOL 7
            0x10, 0x00, 0x02, 0x00, // len 16, SETNAME
            b'P', b'R', b'O', b'X', b'Y', b'P', b'L', b'A', b'N', b'-', b'P', 0x00,
        ];
        request_round_trip(SetOp::Destroy("PROXYPLAN-P"), 4, bytes)
    }

    #[test]
    fn add_hash_ip_port_net_inet() -> Result<()> {
        #[rustfmt::skip]
        let bytes: &[u8] = &[
            0x60, 0x00, 0x00, 0x00, // nlmsg_len 96
            0x09, 0x06,             // IPSET_CMD_ADD
            0x05, 0x00,             // NLM_F_REQUEST | NLM_F_ACK (no NLM_F_EXCL: -exist)
            0x05, 0x00, 0x00, 0x00, // seq 5
            0x00, 0x00, 0x00, 0x00, // pid 0
            0x02, 0x00, 0x00, 0x00, // nfgenmsg
            0x05, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00, // PROTOCOL 7
            0x10, 0x00, 0x02, 0x00, // len 16, SETNAME
            b'P', b'R', b'O', b'X', b'Y', b'P', b'L', b'A', b'N', b'-', b'A', 0x00,
            0x34, 0x00, 0x07, 0x80, // len 52, IPSET_ATTR_DATA | NLA_F_NESTED
            0x0c, 0x00, 0x01, 0x80, //   len 12, IPSET_ATTR_IP | NLA_F_NESTED
            0x08, 0x00, 0x01, 0x40, //     len 8, IPSET_ATTR_IPADDR_IPV4 | NLA_F_NET_BYTEORDER
            0xcb, 0x00, 0x71, 0x07, //       203.0.113.7
            0x0c, 0x00, 0x14, 0x80, //   len 12, IPSET_ATTR_IP2 | NLA_F_NESTED
            0x08, 0x00, 0x01, 0x40, //     len 8, IPSET_ATTR_IPADDR_IPV4 | NLA_F_NET_BYTEORDER
            0x0a, 0x00, 0x00, 0x00, //       10.0.0.0
            0x06, 0x00, 0x04, 0x40, //   len 6, IPSET_ATTR_PORT | NLA_F_NET_BYTEORDER
            0x00, 0x50, 0x00, 0x00, //     80 (big-endian) + pad
            0x05, 0x00, 0x15, 0x00, //   len 5, IPSET_ATTR_CIDR2
            0x08, 0x00, 0x00, 0x00, //     8 + pad
            0x05, 0x00, 0x07, 0x00, //   len 5, IPSET_ATTR_PROTO
            0x06, 0x00, 0x00, 0x00, //     IPPROTO_TCP + pad
        ];
        let entry = SetEntry::IpPortNet(ip("203.0.113.7"), TCP, 80, ip("10.0.0.0"), 8);
        request_round_trip(SetOp::Add("PROXYPLAN-A", entry), 5, bytes)
    }

    #[test]
    fn add_hash_ip_port_ip_inet6() -> Result<()> {
        #[rustfmt::skip]
        let bytes: &[u8] = &[
            0x74, 0x00, 0x00, 0x00, // nlmsg_len 116
            0x09, 0x06,             // IPSET_CMD_ADD
            0x05, 0x00,             // NLM_F_REQUEST | NLM_F_ACK
            0x06, 0x00, 0x00, 0x00, // seq 6
            0x00, 0x00, 0x00, 0x00, // pid 0
            0x02, 0x00, 0x00, 0x00, // nfgenmsg
            0x05, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00, // PROTOCOL 7
            0x11, 0x00, 0x02, 0x00, // len 17, SETNAME
            b'P', b'R', b'O', b'X', b'Y', b'P', b'L', b'A', b'N', b'6', b'-', b'B',
            0x00, 0x00, 0x00, 0x00, //   NUL + pad
            0x44, 0x00, 0x07, 0x80, // len 68, DATA | NLA_F_NESTED
            0x18, 0x00, 0x01, 0x80, //   len 24, IPSET_ATTR_IP | NLA_F_NESTED
            0x14, 0x00, 0x02, 0x40, //     len 20, IPSET_ATTR_IPADDR_IPV6 | NLA_F_NET_BYTEORDER
            0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //       fd00::1
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
            0x18, 0x00, 0x14, 0x80, //   len 24, IPSET_ATTR_IP2 | NLA_F_NESTED
            0x14, 0x00, 0x02, 0x40, //     len 20, IPSET_ATTR_IPADDR_IPV6 | NLA_F_NET_BYTEORDER
            0xfd, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //       fd01::5
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05,
            0x06, 0x00, 0x04, 0x40, //   len 6, PORT | NLA_F_NET_BYTEORDER
            0x00, 0x35, 0x00, 0x00, //     53 + pad
            0x05, 0x00, 0x07, 0x00, //   len 5, PROTO
            0x11, 0x00, 0x00, 0x00, //     IPPROTO_UDP + pad
        ];
        let entry = SetEntry::IpPortIp(ip("fd00::1"), UDP, 53, ip("fd01::5"));
        request_round_trip(SetOp::Add("PROXYPLAN6-B", entry), 6, bytes)
    }

    #[test]
    fn add_hash_ip_and_hash_ip_port() -> Result<()> {
        #[rustfmt::skip]
        let hash_ip: &[u8] = &[
            0x3c, 0x00, 0x00, 0x00, // nlmsg_len 60
            0x09, 0x06,             // IPSET_CMD_ADD
            0x05, 0x00,             // NLM_F_REQUEST | NLM_F_ACK
            0x07, 0x00, 0x00, 0x00, // seq 7
            0x00, 0x00, 0x00, 0x00, // pid 0
            0x02, 0x00, 0x00, 0x00, // nfgenmsg
            0x05, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00, // PROTOCOL 7
            0x10, 0x00, 0x02, 0x00, // len 16, SETNAME
            b'P', b'R', b'O', b'X', b'Y', b'P', b'L', b'A', b'N', b'-', b'N', 0x00,
            0x10, 0x00, 0x07, 0x80, // len 16, DATA | NLA_F_NESTED
            0x0c, 0x00, 0x01, 0x80, //   len 12, IPSET_ATTR_IP | NLA_F_NESTED
            0x08, 0x00, 0x01, 0x40, //     len 8, IPADDR_IPV4 | NLA_F_NET_BYTEORDER
            0xc0, 0xa8, 0x01, 0x05, //       192.168.1.5
        ];
        request_round_trip(
            SetOp::Add("PROXYPLAN-N", SetEntry::Ip(ip("192.168.1.5"))),
            7,
            hash_ip,
        )?;

        #[rustfmt::skip]
        let hash_ip_port_data: &[u8] = &[
            0x20, 0x00, 0x07, 0x80, // len 32, DATA | NLA_F_NESTED
            0x0c, 0x00, 0x01, 0x80, //   IPSET_ATTR_IP
            0x08, 0x00, 0x01, 0x40, 0x0a, 0x60, 0x00, 0x0a, //     10.96.0.10
            0x06, 0x00, 0x04, 0x40, 0x00, 0x50, 0x00, 0x00, //   PORT 80
            0x05, 0x00, 0x07, 0x00, 0x06, 0x00, 0x00, 0x00, //   PROTO tcp
        ];
        let op = SetOp::Add("PROXYPLAN-N", SetEntry::IpPort(ip("10.96.0.10"), TCP, 80));
        let bytes = encode_op(&op, 8)?;
        assert_eq!(bytes.get(44..), Some(hash_ip_port_data));
        assert_eq!(decode_request(&bytes)?.as_op(), op);
        Ok(())
    }

    #[test]
    fn del_bitmap_port_is_exclusive() -> Result<()> {
        #[rustfmt::skip]
        let bytes: &[u8] = &[
            0x38, 0x00, 0x00, 0x00, // nlmsg_len 56
            0x0a, 0x06,             // IPSET_CMD_DEL
            0x05, 0x02,             // NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL
            0x09, 0x00, 0x00, 0x00, // seq 9
            0x00, 0x00, 0x00, 0x00, // pid 0
            0x02, 0x00, 0x00, 0x00, // nfgenmsg
            0x05, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00, // PROTOCOL 7
            0x10, 0x00, 0x02, 0x00, // len 16, SETNAME
            b'P', b'R', b'O', b'X', b'Y', b'P', b'L', b'A', b'N', b'-', b'P', 0x00,
            0x0c, 0x00, 0x07, 0x80, // len 12, DATA | NLA_F_NESTED
            0x06, 0x00, 0x04, 0x40, //   len 6, PORT | NLA_F_NET_BYTEORDER
            0x75, 0x80, 0x00, 0x00, //     30080 + pad
        ];
        request_round_trip(SetOp::Del("PROXYPLAN-P", SetEntry::Port(30080)), 9, bytes)
    }

    #[test]
    fn list_requests_are_dumps() -> Result<()> {
        #[rustfmt::skip]
        let names: &[u8] = &[
            0x24, 0x00, 0x00, 0x00, // nlmsg_len 36
            0x07, 0x06,             // IPSET_CMD_LIST
            0x01, 0x03,             // NLM_F_REQUEST | NLM_F_DUMP
            0x0a, 0x00, 0x00, 0x00, // seq 10
            0x00, 0x00, 0x00, 0x00, // pid 0
            0x02, 0x00, 0x00, 0x00, // nfgenmsg
            0x05, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00, // PROTOCOL 7
            0x08, 0x00, 0x06, 0x40, // len 8, IPSET_ATTR_FLAGS | NLA_F_NET_BYTEORDER
            0x00, 0x00, 0x00, 0x02, //   IPSET_FLAG_LIST_SETNAME (big-endian)
        ];
        assert_eq!(list_names_request(10), names);
        #[rustfmt::skip]
        let one: &[u8] = &[
            0x2c, 0x00, 0x00, 0x00, // nlmsg_len 44
            0x07, 0x06,             // IPSET_CMD_LIST
            0x01, 0x03,             // NLM_F_REQUEST | NLM_F_DUMP
            0x0b, 0x00, 0x00, 0x00, // seq 11
            0x00, 0x00, 0x00, 0x00, // pid 0
            0x02, 0x00, 0x00, 0x00, // nfgenmsg
            0x05, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00, // PROTOCOL 7
            0x10, 0x00, 0x02, 0x00, // len 16, SETNAME
            b'P', b'R', b'O', b'X', b'Y', b'P', b'L', b'A', b'N', b'-', b'P', 0x00,
        ];
        assert_eq!(list_set_request("PROXYPLAN-P", 11)?, one);
        Ok(())
    }

    /// The kernel's listing of `hash:ip,port` `PROXYPLAN-CLUSTER-IP` (revision 7, made
    /// by `ipset`) holding `10.96.0.10,tcp:80`, then `bitmap:port` `PROXYPLAN-NP`
    /// holding 30080: two messages of one dump.
    #[rustfmt::skip]
    const LISTING: &[u8] = &[
        // ---- message 1
        0xc4, 0x00, 0x00, 0x00, // nlmsg_len 196
        0x07, 0x06,             // IPSET_CMD_LIST
        0x02, 0x00,             // NLM_F_MULTI
        0x8a, 0x5c, 0x05, 0x6b, // seq
        0x2d, 0x3e, 0x00, 0x00, // pid
        0x02, 0x00, 0x00, 0x00, // nfgenmsg: AF_INET, NFNETLINK_V0, res_id 0
        0x05, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00, // PROTOCOL 7
        0x19, 0x00, 0x02, 0x00, // len 25, SETNAME
        b'P', b'R', b'O', b'X', b'Y', b'P', b'L', b'A', b'N', b'-',
        b'C', b'L', b'U', b'S', b'T', b'E', b'R', b'-', b'I', b'P', 0x00, 0x00, 0x00, 0x00,
        0x11, 0x00, 0x03, 0x00, // len 17, TYPENAME
        b'h', b'a', b's', b'h', b':', b'i', b'p', b',', b'p', b'o', b'r', b't',
        0x00, 0x00, 0x00, 0x00,
        0x05, 0x00, 0x05, 0x00, 0x02, 0x00, 0x00, 0x00, // FAMILY NFPROTO_IPV4
        0x05, 0x00, 0x04, 0x00, 0x07, 0x00, 0x00, 0x00, // REVISION 7
        0x06, 0x00, 0x0b, 0x40, // len 6, IPSET_ATTR_INDEX | NLA_F_NET_BYTEORDER
        0x00, 0x00, 0x00, 0x00, //   0 + pad
        0x3c, 0x00, 0x07, 0x80, // len 60, DATA | NLA_F_NESTED: the header
        0x08, 0x00, 0x12, 0x40, 0x00, 0x00, 0x04, 0x00, //   HASHSIZE 1024
        0x08, 0x00, 0x13, 0x40, 0x00, 0x10, 0x00, 0x00, //   MAXELEM 1048576
        0x05, 0x00, 0x15, 0x00, 0x0c, 0x00, 0x00, 0x00, //   BUCKETSIZE 12 (u8)
        0x08, 0x00, 0x11, 0x40, 0x19, 0x76, 0x0f, 0x00, //   INITVAL 0x19760f00
        0x08, 0x00, 0x19, 0x40, 0x00, 0x00, 0x00, 0x00, //   REFERENCES 0
        0x08, 0x00, 0x1a, 0x40, 0x00, 0x00, 0x01, 0x08, //   MEMSIZE 264
        0x08, 0x00, 0x18, 0x40, 0x00, 0x00, 0x00, 0x01, //   ELEMENTS 1
        0x24, 0x00, 0x08, 0x80, // len 36, IPSET_ATTR_ADT | NLA_F_NESTED
        0x20, 0x00, 0x07, 0x80, //   len 32, DATA | NLA_F_NESTED: one entry
        0x0c, 0x00, 0x01, 0x80, //     len 12, IPSET_ATTR_IP | NLA_F_NESTED
        0x08, 0x00, 0x01, 0x00, //       len 8, IPADDR_IPV4 (unflagged in listings)
        0x0a, 0x60, 0x00, 0x0a, //         10.96.0.10
        0x06, 0x00, 0x04, 0x40, 0x00, 0x50, 0x00, 0x00, //     PORT 80
        0x05, 0x00, 0x07, 0x00, 0x06, 0x00, 0x00, 0x00, //     PROTO tcp
        // ---- message 2
        0x94, 0x00, 0x00, 0x00, // nlmsg_len 148
        0x07, 0x06,             // IPSET_CMD_LIST
        0x02, 0x00,             // NLM_F_MULTI
        0x8a, 0x5c, 0x05, 0x6b, // seq
        0x2d, 0x3e, 0x00, 0x00, // pid
        0x02, 0x00, 0x00, 0x00, // nfgenmsg
        0x05, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00, // PROTOCOL 7
        0x11, 0x00, 0x02, 0x00, // len 17, SETNAME
        b'P', b'R', b'O', b'X', b'Y', b'P', b'L', b'A', b'N', b'-', b'N', b'P',
        0x00, 0x00, 0x00, 0x00,
        0x10, 0x00, 0x03, 0x00, // len 16, TYPENAME
        b'b', b'i', b't', b'm', b'a', b'p', b':', b'p', b'o', b'r', b't', 0x00,
        0x05, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, // FAMILY NFPROTO_UNSPEC
        0x05, 0x00, 0x04, 0x00, 0x03, 0x00, 0x00, 0x00, // REVISION 3
        0x06, 0x00, 0x0b, 0x40, 0x00, 0x01, 0x00, 0x00, // INDEX 1
        0x2c, 0x00, 0x07, 0x80, // len 44, DATA: the header
        0x06, 0x00, 0x04, 0x40, 0x00, 0x00, 0x00, 0x00, //   PORT_FROM 0
        0x06, 0x00, 0x05, 0x40, 0xff, 0xff, 0x00, 0x00, //   PORT_TO 65535
        0x08, 0x00, 0x19, 0x40, 0x00, 0x00, 0x00, 0x00, //   REFERENCES 0
        0x08, 0x00, 0x1a, 0x40, 0x00, 0x00, 0x20, 0x48, //   MEMSIZE 8264
        0x08, 0x00, 0x18, 0x40, 0x00, 0x00, 0x00, 0x01, //   ELEMENTS 1
        0x10, 0x00, 0x08, 0x80, // len 16, ADT
        0x0c, 0x00, 0x07, 0x80, //   len 12, DATA: one entry
        0x06, 0x00, 0x04, 0x40, 0x75, 0x80, 0x00, 0x00, //     PORT 30080
    ];

    #[test]
    fn listing_of_hash_ip_port_and_bitmap_port() -> Result<()> {
        let msgs = listing_round_trip(LISTING)?;
        assert_eq!(msgs.len(), 2);
        let first = &msgs[0];
        assert_eq!((first.flags, first.protocol), (NLM_F_MULTI, 7));
        assert_eq!(first.name, "PROXYPLAN-CLUSTER-IP");
        assert_eq!(
            first.header,
            Some(SetHeader {
                type_name: "hash:ip,port".into(),
                family: NFPROTO_IPV4,
                revision: 7,
                index: Some(0),
                data: SetHeaderData {
                    hash_size: Some(1024),
                    max_elements: Some(1_048_576),
                    bucket_size: Some(12),
                    initval: Some(0x1976_0f00),
                    references: Some(0),
                    memory_size: Some(264),
                    elements: Some(1),
                    ..SetHeaderData::default()
                },
            })
        );
        let header = msgs[1].header.as_ref().map(|h| h.data);
        assert_eq!(header.and_then(|d| d.port_to), Some(65535));

        let mut sets = Sets::new();
        for msg in &msgs {
            merge_listing(&mut sets, msg);
        }
        let mut cluster = IpSet::new(SetType::HashIpPort, false);
        cluster
            .entries
            .insert(SetEntry::IpPort(ip("10.96.0.10"), TCP, 80));
        let mut node_ports = IpSet::new(SetType::BitmapPort, false);
        node_ports.entries.insert(SetEntry::Port(30080));
        let expected = Sets::from([
            ("PROXYPLAN-CLUSTER-IP".to_owned(), cluster),
            ("PROXYPLAN-NP".to_owned(), node_ports),
        ]);
        assert_eq!(sets, expected);
        Ok(())
    }

    /// The kernel's listings of a `hash:ip,port,net` (IPv4) and a `hash:ip,port,ip`
    /// (IPv6) entry, as `IPSET_ATTR_ADT` nests.
    #[rustfmt::skip]
    const NET_ENTRY_ADT: &[u8] = &[
        0x38, 0x00, 0x08, 0x80, // len 56, ADT
        0x34, 0x00, 0x07, 0x80, //   len 52, DATA
        0x0c, 0x00, 0x01, 0x80, 0x08, 0x00, 0x01, 0x00, 0xcb, 0x00, 0x71, 0x07, // IP 203.0.113.7
        0x0c, 0x00, 0x14, 0x80, 0x08, 0x00, 0x01, 0x00, 0x0a, 0x00, 0x00, 0x00, // IP2 10.0.0.0
        0x06, 0x00, 0x04, 0x40, 0x00, 0x50, 0x00, 0x00, //     PORT 80
        0x05, 0x00, 0x15, 0x00, 0x08, 0x00, 0x00, 0x00, //     CIDR2 8
        0x05, 0x00, 0x07, 0x00, 0x06, 0x00, 0x00, 0x00, //     PROTO tcp
    ];
    #[rustfmt::skip]
    const HAIRPIN6_ENTRY_ADT: &[u8] = &[
        0x48, 0x00, 0x08, 0x80, // len 72, ADT
        0x44, 0x00, 0x07, 0x80, //   len 68, DATA
        0x18, 0x00, 0x01, 0x80, //     len 24, IP
        0x14, 0x00, 0x02, 0x00, //       len 20, IPADDR_IPV6 (unflagged)
        0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05,
        0x18, 0x00, 0x14, 0x80, //     len 24, IP2
        0x14, 0x00, 0x02, 0x00, //       len 20, IPADDR_IPV6
        0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05,
        0x06, 0x00, 0x04, 0x40, 0x00, 0x35, 0x00, 0x00, //     PORT 53
        0x05, 0x00, 0x07, 0x00, 0x11, 0x00, 0x00, 0x00, //     PROTO udp
    ];

    /// A continuation message as the kernel sends one for a set too large for one
    /// message: only PROTOCOL, SETNAME and ADT.
    fn continuation(name: &str, adt: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0, 0, 0, 0, 0x07, 0x06, 0x02, 0x00, 9, 0, 0, 0, 7, 0, 0, 0];
        bytes.extend_from_slice(&[0x02, 0x00, 0x00, 0x00]);
        bytes.extend_from_slice(&[0x05, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00]);
        let mut attr = Vec::new();
        put_string(&mut attr, IPSET_ATTR_SETNAME, name);
        bytes.extend_from_slice(&attr);
        bytes.extend_from_slice(adt);
        let len = bytes.len() as u32;
        bytes[..4].copy_from_slice(&len.to_ne_bytes());
        bytes
    }

    #[test]
    fn entries_of_every_kind_and_family_decode_and_merge() -> Result<()> {
        let net = continuation("PROXYPLAN-LB-SRC", NET_ENTRY_ADT);
        let hairpin = continuation("PROXYPLAN6-HAIRPIN", HAIRPIN6_ENTRY_ADT);
        for bytes in [&net, &hairpin] {
            listing_round_trip(bytes)?;
        }
        let net_entry = decode_list_message(&net)?.entries.unwrap_or_default();
        assert_eq!(
            net_entry
                .first()
                .and_then(|e| e.entry(SetType::HashIpPortNet)),
            Some(SetEntry::IpPortNet(
                ip("203.0.113.7"),
                TCP,
                80,
                ip("10.0.0.0"),
                8
            ))
        );
        let hairpin_entry = decode_list_message(&hairpin)?.entries.unwrap_or_default();
        let expected = SetEntry::IpPortIp(ip("fd00::5"), UDP, 53, ip("fd00::5"));
        assert_eq!(
            hairpin_entry
                .first()
                .and_then(|e| e.entry(SetType::HashIpPortIp)),
            Some(expected)
        );
        // A continuation adds to the set its first message started; one for a set never
        // started (not ours, or of a type we do not know) adds nothing.
        let mut sets = Sets::from([(
            "PROXYPLAN6-HAIRPIN".to_owned(),
            IpSet::new(SetType::HashIpPortIp, true),
        )]);
        for bytes in [&net, &hairpin] {
            merge_listing(&mut sets, &decode_list_message(bytes)?);
        }
        assert_eq!(sets.len(), 1);
        assert_eq!(
            sets["PROXYPLAN6-HAIRPIN"].entries,
            BTreeSet::from([expected])
        );
        Ok(())
    }

    /// An empty `hash:ip` `family inet6` set: an empty ADT nest.
    #[rustfmt::skip]
    const EMPTY_INET6: &[u8] = &[
        0x94, 0x00, 0x00, 0x00, // nlmsg_len 148
        0x07, 0x06,             // IPSET_CMD_LIST
        0x02, 0x00,             // NLM_F_MULTI
        0x63, 0x5c, 0x05, 0x6b, // seq
        0x41, 0x44, 0x00, 0x00, // pid
        0x02, 0x00, 0x00, 0x00, // nfgenmsg
        0x05, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00, // PROTOCOL 7
        0x14, 0x00, 0x02, 0x00, // len 20, SETNAME
        b'P', b'R', b'O', b'X', b'Y', b'P', b'L', b'A', b'N', b'-', b'E', b'M', b'P', b'T', b'Y', 0x00,
        0x0c, 0x00, 0x03, 0x00, // len 12, TYPENAME
        b'h', b'a', b's', b'h', b':', b'i', b'p', 0x00,
        0x05, 0x00, 0x05, 0x00, 0x0a, 0x00, 0x00, 0x00, // FAMILY NFPROTO_IPV6
        0x05, 0x00, 0x04, 0x00, 0x06, 0x00, 0x00, 0x00, // REVISION 6
        0x06, 0x00, 0x0b, 0x40, 0x00, 0x02, 0x00, 0x00, // INDEX 2
        0x3c, 0x00, 0x07, 0x80, // len 60, DATA
        0x08, 0x00, 0x12, 0x40, 0x00, 0x00, 0x04, 0x00, //   HASHSIZE 1024
        0x08, 0x00, 0x13, 0x40, 0x00, 0x01, 0x00, 0x00, //   MAXELEM 65536
        0x05, 0x00, 0x15, 0x00, 0x0c, 0x00, 0x00, 0x00, //   BUCKETSIZE 12
        0x08, 0x00, 0x11, 0x40, 0x89, 0xe2, 0x96, 0xc3, //   INITVAL
        0x08, 0x00, 0x19, 0x40, 0x00, 0x00, 0x00, 0x00, //   REFERENCES 0
        0x08, 0x00, 0x1a, 0x40, 0x00, 0x00, 0x00, 0xe0, //   MEMSIZE 224
        0x08, 0x00, 0x18, 0x40, 0x00, 0x00, 0x00, 0x00, //   ELEMENTS 0
        0x04, 0x00, 0x08, 0x80, // len 4, ADT: no entries
    ];

    /// A names-only listing message (`IPSET_FLAG_LIST_SETNAME`).
    #[rustfmt::skip]
    const NAME_ONLY: &[u8] = &[
        0x30, 0x00, 0x00, 0x00, // nlmsg_len 48
        0x07, 0x06,             // IPSET_CMD_LIST
        0x02, 0x00,             // NLM_F_MULTI
        0x63, 0x5c, 0x05, 0x6b, // seq
        0x3b, 0x44, 0x00, 0x00, // pid
        0x02, 0x00, 0x00, 0x00, // nfgenmsg
        0x05, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00, // PROTOCOL 7
        0x11, 0x00, 0x02, 0x00, // len 17, SETNAME
        b'P', b'R', b'O', b'X', b'Y', b'P', b'L', b'A', b'N', b'-', b'N', b'P', 0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn empty_sets_and_names_only() -> Result<()> {
        let empty = listing_round_trip(EMPTY_INET6)?;
        assert_eq!(empty[0].entries, Some(Vec::new()));
        let mut sets = Sets::new();
        merge_listing(&mut sets, &empty[0]);
        assert_eq!(sets["PROXYPLAN-EMPTY"], IpSet::new(SetType::HashIp, true));

        let names = listing_round_trip(NAME_ONLY)?;
        assert_eq!(names[0].name, "PROXYPLAN-NP");
        assert_eq!((&names[0].header, &names[0].entries), (&None, &None));
        Ok(())
    }

    #[test]
    fn foreign_and_unknown_sets_are_skipped() -> Result<()> {
        let mut msgs = decode_list(LISTING)?;
        msgs[0].name = "KUBE-CLUSTER-IP".into();
        if let Some(header) = msgs[1].header.as_mut() {
            header.type_name = "hash:net".into();
        }
        let mut sets = Sets::new();
        for msg in &msgs {
            merge_listing(&mut sets, msg);
        }
        assert!(sets.is_empty());
        Ok(())
    }

    #[test]
    fn bad_operations_are_refused_before_sending() {
        let long = "PROXYPLAN-".repeat(4);
        let entry = SetEntry::Port(1);
        let label = |op: SetOp<'_>| encode_op(&op, 0).map_err(|e| e.label());
        assert_eq!(label(SetOp::Add(&long, entry)), Err("bad_name"));
        assert_eq!(label(SetOp::Destroy("")), Err("bad_name"));
        assert_eq!(label(SetOp::Destroy("A\0B")), Err("bad_name"));
        assert!(label(SetOp::Destroy(&long[..31])).is_ok());
        let mixed = SetEntry::IpPortIp(ip("10.0.0.1"), TCP, 80, ip("fd00::1"));
        assert_eq!(
            label(SetOp::Add("PROXYPLAN-X", mixed)),
            Err("mixed_families")
        );
        let wide = SetEntry::IpPortNet(ip("10.0.0.1"), TCP, 80, ip("10.0.0.0"), 33);
        assert_eq!(label(SetOp::Del("PROXYPLAN-X", wide)), Err("bad_prefix"));
    }

    #[test]
    fn truncated_and_bad_lengths_are_errors() {
        let label = |bytes: &[u8]| decode_list(bytes).map_err(|e| e.label());
        assert_eq!(
            label(LISTING.get(..10).unwrap_or_default()),
            Err("bad_length")
        );
        assert_eq!(
            decode_list_message(LISTING.get(..10).unwrap_or_default()).map_err(|e| e.label()),
            Err("truncated")
        );
        // nlmsg_len 196 but 100 bytes.
        assert_eq!(
            label(LISTING.get(..100).unwrap_or_default()),
            Err("bad_length")
        );
        // SETNAME claiming 2 bytes, less than its own header.
        let mut bad = NAME_ONLY.to_vec();
        bad[28] = 0x02;
        assert_eq!(label(&bad), Err("bad_attribute_length"));
        // PROTO (u8) with 4 bytes of value.
        let mut adt = NET_ENTRY_ADT.to_vec();
        adt[48] = 0x08;
        assert_eq!(
            label(&continuation("PROXYPLAN-X", &adt)),
            Err("bad_attribute_length")
        );
        // A request is not a listing.
        let request = encode_op(&SetOp::Destroy("PROXYPLAN-X"), 1).unwrap_or_default();
        assert_eq!(label(&request), Err("unexpected_message"));
        // A listing without its set name.
        let mut nameless = NAME_ONLY.get(..28).unwrap_or_default().to_vec();
        nameless[0] = 28;
        assert_eq!(label(&nameless), Err("missing_attribute"));
    }

    #[test]
    fn errnos_have_their_header_names() {
        assert_eq!(error_name(-4103), "IPSET_ERR_EXIST");
        assert_eq!(error_name(-4100), "IPSET_ERR_BUSY");
        assert_eq!(error_name(-2), "ENOENT");
        assert_eq!(error_name(0), "OK");
    }
}
