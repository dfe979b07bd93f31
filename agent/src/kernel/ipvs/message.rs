//! The IPVS generic-netlink messages as typed values, what [`mod@super::encode`] turns into
//! bytes and [`mod@super::decode`] reads back.
//!
//! Layout of every message (native byte order unless noted):
//!
//! ```text
//! nlmsghdr   u32 len | u16 type | u16 flags | u32 seq | u32 pid       (16 bytes)
//! genlmsghdr u8 cmd | u8 version | u16 reserved                        (4 bytes)
//! nlattr*    u16 len | u16 type (| NLA_F_NESTED) | value | pad to 4
//! ```
//!
//! Attribute lengths exclude the padding; the next attribute starts at the 4-aligned
//! offset. Unknown attributes are skipped, never an error. The framing (headers, the
//! walk over messages and attributes, their length checks) is
//! [`crate::kernel::netlink::frame`]'s.

use super::types::IpvsAttributes;
use super::uapi::IpvsCommand;
use crate::kernel::netlink::frame::{NetlinkFormatError, NetlinkHeader};

/// `sizeof(struct genlmsghdr)`.
pub const GENL_HDRLEN: usize = 4;

/// Why a buffer is not a valid netlink message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpvsCodecError {
    /// A header, message or attribute that does not fit, or a string that is not UTF-8.
    #[error(transparent)]
    Format(#[from] NetlinkFormatError),
    /// A required attribute is missing.
    #[error("missing attribute {0}")]
    MissingAttribute(&'static str),
    /// A genl command the IPVS family does not define.
    #[error("unknown IPVS command {0}")]
    UnknownCommand(u8),
    /// An address family other than `AF_INET` / `AF_INET6`.
    #[error("unknown address family {0}")]
    UnknownFamily(u16),
}

impl IpvsCodecError {
    /// A stable short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Format(e) => e.label(),
            Self::MissingAttribute(_) => "missing_attribute",
            Self::UnknownCommand(_) => "unknown_command",
            Self::UnknownFamily(_) => "unknown_family",
        }
    }
}

/// A `CTRL_CMD_GETFAMILY` request or its `CTRL_CMD_NEWFAMILY` reply (only the name and id
/// are kept; operations and multicast groups are skipped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlMessage {
    /// genl `cmd`.
    pub command: u8,
    /// genl `version`.
    pub version: u8,
    /// `CTRL_ATTR_FAMILY_NAME`.
    pub family_name: Option<String>,
    /// `CTRL_ATTR_FAMILY_ID`.
    pub family_id: Option<u16>,
}

/// What follows the `nlmsghdr`.
// Messages are short-lived (one per reply); boxing the IPVS variant buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetlinkBody {
    /// A message of the IPVS family.
    Ipvs {
        /// genl `cmd`.
        command: IpvsCommand,
        /// genl `version` ([`super::uapi::IPVS_GENL_VERSION`]).
        version: u8,
        /// The nested service and destination.
        attributes: IpvsAttributes,
        /// Whether nests carry `NLA_F_NESTED`: our requests set it (the kernel accepts
        /// both); the kernel's own replies do not (`nla_nest_start_noflag`).
        nested_flag: bool,
    },
    /// A message of the generic-netlink controller ([`super::uapi::GENL_ID_CTRL`]).
    Control(ControlMessage),
    /// `NLMSG_ERROR`: `errno` is 0 for an ack, a negative errno otherwise.
    Error {
        /// The (negative) errno.
        errno: i32,
        /// The echoed request header (and payload unless capped), kept as bytes.
        request: Vec<u8>,
    },
    /// `NLMSG_DONE`, ending a dump.
    Done {
        /// The status word (0, or a negative errno when the dump failed).
        code: i32,
    },
    /// Any other message type, kept as bytes.
    Other(Vec<u8>),
}

impl NetlinkBody {
    /// The service and destination if this is an IPVS message.
    pub fn ipvs_attributes(&self) -> Option<&IpvsAttributes> {
        match self {
            Self::Ipvs { attributes, .. } => Some(attributes),
            _ => None,
        }
    }
}

/// One netlink message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetlinkMessage {
    /// The header (length excluded).
    pub header: NetlinkHeader,
    /// The body.
    pub body: NetlinkBody,
}
