//! The ipset constants of the Linux uapi headers (`include/uapi/linux/netfilter/
//! nfnetlink.h`, `netfilter.h`, `netfilter/ipset/ip_set.h`, `ip_set_hash.h`,
//! `ip_set_bitmap.h`), the errnos' names, and the types, revisions and sizes of the sets
//! we create. A long table, kept in one place.

use nix::errno::Errno;

use super::sets::{SetSpec, SetType};

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

/// The name of an errno as [`super::socket::IpsetNetlink::execute`] returns it (negative or positive),
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
