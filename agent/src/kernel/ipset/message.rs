//! ipset requests and listings as typed values, and the codec's error.

use std::net::IpAddr;

use super::sets::{SetEntry, SetSpec, SetType};
use super::uapi::{HASH_SIZE, MAX_ELEMENTS};
use crate::kernel::netlink::frame::NetlinkFormatError;

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
