//! ipsets over netlink: the kernel's `ip_set` subsystem of nfnetlink, spoken directly, so
//! a change costs a `send` and a `recv` instead of an `ipset restore` process.
//!
//! The codec is pure ([`encode`]: typed requests to bytes, [`decode`]: the kernel's
//! listings to typed values, with annotated byte-level round-trip tests in `tests.rs`);
//! [`IpsetNetlink`] is the socket at the edge. [`sets`] are the values, [`message`] the
//! messages, [`uapi`] the constants. Constants are named after their definitions in the Linux uapi headers
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
//! as the ipvs mode's set changes do with their `mismatched` sets.

pub mod decode;
pub mod encode;
pub mod message;
pub mod sets;
pub mod socket;
pub mod uapi;

#[cfg(all(test, target_endian = "little"))]
mod tests;

pub use decode::{decode_list, decode_list_message, decode_request, merge_listing};
pub use encode::{encode_list_message, encode_op, list_names_request, list_set_request};
pub use message::{
    EntryAttributes, IpsetCodecError, ListMessage, SetHeader, SetHeaderData, SetOp, SetRequest,
};
pub use sets::{
    IpSet, PREFIX_V4, PREFIX_V6, SetEntry, SetSpec, SetType, Sets, is_owned, parse_save,
};
pub use socket::IpsetNetlink;
pub use uapi::*;
