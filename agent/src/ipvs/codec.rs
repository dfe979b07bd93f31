//! Byte-level encoding and decoding of IPVS generic-netlink messages.
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
//! walk over messages and attributes, their length checks) is [`crate::kernel::netlink::frame`]'s.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::*;
pub use crate::kernel::netlink::frame::NetlinkHeader;
use crate::kernel::netlink::frame::{
    self, Attribute, NLA_F_NESTED, NLA_HDRLEN, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE,
    NLMSG_ERROR, NLMSG_HDRLEN, NetlinkFormatError, align4, put_attr, put_be16, put_nest,
    put_string, put_u8, put_u16, put_u32, put_u64,
};

const GENL_HDRLEN: usize = 4;

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

type Result<T> = std::result::Result<T, IpvsCodecError>;

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
        /// genl `version` ([`IPVS_GENL_VERSION`]).
        version: u8,
        /// The nested service and destination.
        attributes: IpvsAttributes,
        /// Whether nests carry `NLA_F_NESTED`: our requests set it (the kernel accepts
        /// both); the kernel's own replies do not (`nla_nest_start_noflag`).
        nested_flag: bool,
    },
    /// A message of the generic-netlink controller ([`GENL_ID_CTRL`]).
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

// ---- encoding --------------------------------------------------------------------------

fn put_addr(buf: &mut Vec<u8>, kind: u16, addr: IpAddr) {
    // `union nf_inet_addr`: always 16 bytes, an IPv4 address in the first four.
    let mut raw = [0u8; 16];
    match addr {
        IpAddr::V4(a) => raw[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => raw = a.octets(),
    }
    put_attr(buf, kind, &raw);
}

/// A nest's type, flagged `NLA_F_NESTED` when `flag` (see [`NetlinkBody::Ipvs`]).
const fn nest_kind(kind: u16, flag: bool) -> u16 {
    if flag { kind | NLA_F_NESTED } else { kind }
}

fn put_stats(buf: &mut Vec<u8>, kind: u16, flag: bool, stats: &IpvsStats, wide: bool) {
    put_nest(buf, nest_kind(kind, flag), |b| {
        let narrow = |b: &mut Vec<u8>, k: u16, v: u64| {
            if wide {
                put_u64(b, k, v)
            } else {
                put_u32(b, k, v as u32)
            }
        };
        narrow(b, IPVS_STATS_ATTR_CONNS, stats.connections);
        narrow(b, IPVS_STATS_ATTR_INPKTS, stats.packets_in);
        narrow(b, IPVS_STATS_ATTR_OUTPKTS, stats.packets_out);
        put_u64(b, IPVS_STATS_ATTR_INBYTES, stats.bytes_in);
        put_u64(b, IPVS_STATS_ATTR_OUTBYTES, stats.bytes_out);
        narrow(b, IPVS_STATS_ATTR_CPS, stats.connections_per_second);
        narrow(b, IPVS_STATS_ATTR_INPPS, stats.packets_in_per_second);
        narrow(b, IPVS_STATS_ATTR_OUTPPS, stats.packets_out_per_second);
        narrow(b, IPVS_STATS_ATTR_INBPS, stats.bytes_in_per_second);
        narrow(b, IPVS_STATS_ATTR_OUTBPS, stats.bytes_out_per_second);
    });
}

/// Service attributes in the kernel's own order (`ip_vs_genl_fill_service`).
fn put_service(buf: &mut Vec<u8>, svc: &IpvsService, flag: bool) {
    put_nest(buf, nest_kind(IPVS_CMD_ATTR_SERVICE, flag), |b| {
        put_u16(b, IPVS_SVC_ATTR_AF, svc.family);
        if let Some(mark) = svc.fwmark {
            put_u32(b, IPVS_SVC_ATTR_FWMARK, mark);
        } else {
            put_u16(b, IPVS_SVC_ATTR_PROTOCOL, svc.protocol);
            put_addr(b, IPVS_SVC_ATTR_ADDR, svc.addr);
            put_be16(b, IPVS_SVC_ATTR_PORT, svc.port);
        }
        put_string(b, IPVS_SVC_ATTR_SCHED_NAME, &svc.scheduler);
        if let Some(pe) = &svc.persistence_engine {
            put_string(b, IPVS_SVC_ATTR_PE_NAME, pe);
        }
        let mut flags = [0u8; 8];
        flags[..4].copy_from_slice(&svc.flags.to_ne_bytes());
        flags[4..].copy_from_slice(&svc.flags_mask.to_ne_bytes());
        put_attr(b, IPVS_SVC_ATTR_FLAGS, &flags);
        put_u32(b, IPVS_SVC_ATTR_TIMEOUT, svc.timeout);
        put_u32(b, IPVS_SVC_ATTR_NETMASK, svc.netmask);
        if let Some(s) = &svc.stats {
            put_stats(b, IPVS_SVC_ATTR_STATS, flag, s, false);
        }
        if let Some(s) = &svc.stats64 {
            put_stats(b, IPVS_SVC_ATTR_STATS64, flag, s, true);
        }
    });
}

/// Destination attributes in the kernel's own order (`ip_vs_genl_fill_dest`).
fn put_destination(buf: &mut Vec<u8>, dest: &IpvsDestination, flag: bool) {
    put_nest(buf, nest_kind(IPVS_CMD_ATTR_DEST, flag), |b| {
        put_addr(b, IPVS_DEST_ATTR_ADDR, dest.addr);
        put_be16(b, IPVS_DEST_ATTR_PORT, dest.port);
        put_u32(b, IPVS_DEST_ATTR_FWD_METHOD, dest.fwd_method);
        put_u32(b, IPVS_DEST_ATTR_WEIGHT, dest.weight);
        if let Some(t) = dest.tunnel.tun_type {
            put_u8(b, IPVS_DEST_ATTR_TUN_TYPE, t);
        }
        if let Some(p) = dest.tunnel.port {
            put_be16(b, IPVS_DEST_ATTR_TUN_PORT, p);
        }
        if let Some(f) = dest.tunnel.flags {
            put_u16(b, IPVS_DEST_ATTR_TUN_FLAGS, f);
        }
        put_u32(b, IPVS_DEST_ATTR_U_THRESH, dest.upper_threshold);
        put_u32(b, IPVS_DEST_ATTR_L_THRESH, dest.lower_threshold);
        let c = &dest.counters;
        if let Some(v) = c.active_connections {
            put_u32(b, IPVS_DEST_ATTR_ACTIVE_CONNS, v);
        }
        if let Some(v) = c.inactive_connections {
            put_u32(b, IPVS_DEST_ATTR_INACT_CONNS, v);
        }
        if let Some(v) = c.persistent_connections {
            put_u32(b, IPVS_DEST_ATTR_PERSIST_CONNS, v);
        }
        if let Some(f) = dest.family {
            put_u16(b, IPVS_DEST_ATTR_ADDR_FAMILY, f);
        }
        if let Some(s) = &c.stats {
            put_stats(b, IPVS_DEST_ATTR_STATS, flag, s, false);
        }
        if let Some(s) = &c.stats64 {
            put_stats(b, IPVS_DEST_ATTR_STATS64, flag, s, true);
        }
    });
}

fn encode_body(body: &NetlinkBody, buf: &mut Vec<u8>) {
    match body {
        NetlinkBody::Ipvs {
            command,
            version,
            attributes,
            nested_flag,
        } => {
            buf.extend_from_slice(&[*command as u8, *version, 0, 0]);
            if let Some(svc) = &attributes.service {
                put_service(buf, svc, *nested_flag);
            }
            if let Some(dest) = &attributes.destination {
                put_destination(buf, dest, *nested_flag);
            }
        }
        NetlinkBody::Control(ctrl) => {
            buf.extend_from_slice(&[ctrl.command, ctrl.version, 0, 0]);
            if let Some(name) = &ctrl.family_name {
                put_string(buf, CTRL_ATTR_FAMILY_NAME, name);
            }
            if let Some(id) = ctrl.family_id {
                put_u16(buf, CTRL_ATTR_FAMILY_ID, id);
            }
        }
        NetlinkBody::Error { errno, request } => {
            buf.extend_from_slice(&errno.to_ne_bytes());
            buf.extend_from_slice(request);
        }
        NetlinkBody::Done { code } => buf.extend_from_slice(&code.to_ne_bytes()),
        NetlinkBody::Other(raw) => buf.extend_from_slice(raw),
    }
}

/// Encodes one complete netlink message (header length computed).
pub fn encode_message(msg: &NetlinkMessage) -> Vec<u8> {
    let mut buf = frame::start_message(&msg.header);
    encode_body(&msg.body, &mut buf);
    frame::finish_message(buf)
}

/// Encodes several messages back to back, each starting 4-aligned (as in a dump).
pub fn encode_messages(msgs: &[NetlinkMessage]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in msgs {
        out.extend_from_slice(&encode_message(m));
        out.resize(align4(out.len()), 0);
    }
    out
}

/// The `nlmsg_flags` a request for `cmd` carries: `NLM_F_DUMP` for the two list
/// commands, `NLM_F_ACK` for everything else so failures and successes are both reported.
pub fn request_flags(cmd: IpvsCommand) -> u16 {
    match cmd {
        IpvsCommand::GetService | IpvsCommand::GetDest => NLM_F_REQUEST | NLM_F_DUMP,
        _ => NLM_F_REQUEST | NLM_F_ACK,
    }
}

/// A complete IPVS request: `nlmsghdr(family_id, request_flags(cmd), seq, pid 0)`,
/// `genlmsghdr(cmd, version 1)` and the nested service / destination with `NLA_F_NESTED`.
pub fn encode(cmd: IpvsCommand, family_id: u16, seq: u32, payload: &IpvsAttributes) -> Vec<u8> {
    encode_message(&NetlinkMessage {
        header: NetlinkHeader {
            message_type: family_id,
            flags: request_flags(cmd),
            seq,
            port_id: 0,
        },
        body: NetlinkBody::Ipvs {
            command: cmd,
            version: IPVS_GENL_VERSION,
            attributes: payload.clone(),
            nested_flag: true,
        },
    })
}

fn with_service(svc: &IpvsService) -> IpvsAttributes {
    IpvsAttributes {
        service: Some(svc.clone()),
        destination: None,
    }
}

fn with_destination(svc: &IpvsService, dest: &IpvsDestination) -> IpvsAttributes {
    IpvsAttributes {
        service: Some(svc.clone()),
        destination: Some(dest.clone()),
    }
}

/// `CTRL_CMD_GETFAMILY` for `name` (normally [`IPVS_GENL_NAME`]).
pub fn get_family(seq: u32, name: &str) -> Vec<u8> {
    encode_message(&NetlinkMessage {
        header: NetlinkHeader {
            message_type: GENL_ID_CTRL,
            flags: NLM_F_REQUEST,
            seq,
            port_id: 0,
        },
        body: NetlinkBody::Control(ControlMessage {
            command: CTRL_CMD_GETFAMILY,
            version: 1,
            family_name: Some(name.to_owned()),
            family_id: None,
        }),
    })
}

/// `IPVS_CMD_NEW_SERVICE`.
pub fn add_service(family_id: u16, seq: u32, svc: &IpvsService) -> Vec<u8> {
    encode(IpvsCommand::NewService, family_id, seq, &with_service(svc))
}

/// `IPVS_CMD_SET_SERVICE`.
pub fn update_service(family_id: u16, seq: u32, svc: &IpvsService) -> Vec<u8> {
    encode(IpvsCommand::SetService, family_id, seq, &with_service(svc))
}

/// `IPVS_CMD_DEL_SERVICE` (the full service is sent, as ipvsadm does; the kernel keys on
/// family + protocol/address/port or family + fwmark).
pub fn delete_service(family_id: u16, seq: u32, svc: &IpvsService) -> Vec<u8> {
    encode(IpvsCommand::DelService, family_id, seq, &with_service(svc))
}

/// `IPVS_CMD_GET_SERVICE` with `NLM_F_DUMP`: every service.
pub fn list_services(family_id: u16, seq: u32) -> Vec<u8> {
    encode(
        IpvsCommand::GetService,
        family_id,
        seq,
        &IpvsAttributes::default(),
    )
}

/// `IPVS_CMD_NEW_DEST`.
pub fn add_destination(
    family_id: u16,
    seq: u32,
    svc: &IpvsService,
    dest: &IpvsDestination,
) -> Vec<u8> {
    let attrs = with_destination(svc, dest);
    encode(IpvsCommand::NewDest, family_id, seq, &attrs)
}

/// `IPVS_CMD_SET_DEST`.
pub fn update_destination(
    family_id: u16,
    seq: u32,
    svc: &IpvsService,
    dest: &IpvsDestination,
) -> Vec<u8> {
    let attrs = with_destination(svc, dest);
    encode(IpvsCommand::SetDest, family_id, seq, &attrs)
}

/// `IPVS_CMD_DEL_DEST`.
pub fn delete_destination(
    family_id: u16,
    seq: u32,
    svc: &IpvsService,
    dest: &IpvsDestination,
) -> Vec<u8> {
    let attrs = with_destination(svc, dest);
    encode(IpvsCommand::DelDest, family_id, seq, &attrs)
}

/// `IPVS_CMD_GET_DEST` with `NLM_F_DUMP`: the real servers of `svc`.
pub fn list_destinations(family_id: u16, seq: u32, svc: &IpvsService) -> Vec<u8> {
    encode(IpvsCommand::GetDest, family_id, seq, &with_service(svc))
}

// ---- decoding --------------------------------------------------------------------------

/// Every attribute of `buf`, or the first framing error among them.
fn parse_attrs(buf: &[u8]) -> Result<Vec<Attribute<'_>>> {
    Ok(frame::attributes(buf).collect::<std::result::Result<_, _>>()?)
}

/// A `*_STATS` counter (u32, or u64 for the byte counters) or a `*_STATS64` one (u64).
fn get_counter(nla: &Attribute<'_>) -> Result<u64> {
    Ok(match nla.value.len() {
        4 => nla.get_u32().map(u64::from)?,
        _ => nla.get_u64()?,
    })
}

fn get_addr(kind: u16, raw: &[u8], family: Option<u16>) -> Result<IpAddr> {
    let bad = || {
        IpvsCodecError::from(NetlinkFormatError::BadAttributeLength {
            kind,
            length: raw.len() + NLA_HDRLEN,
        })
    };
    match (family, raw.len()) {
        (Some(AF_INET) | None, 4) | (Some(AF_INET), 16) => {
            let b: [u8; 4] = raw
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(bad)?;
            Ok(IpAddr::V4(Ipv4Addr::from(b)))
        }
        (Some(AF_INET6) | None, 16) => {
            let b: [u8; 16] = raw.try_into().map_err(|_| bad())?;
            Ok(IpAddr::V6(Ipv6Addr::from(b)))
        }
        (Some(AF_INET | AF_INET6) | None, _) => Err(bad()),
        (Some(other), _) => Err(IpvsCodecError::UnknownFamily(other)),
    }
}

fn unspecified(family: u16) -> Result<IpAddr> {
    match family {
        AF_INET => Ok(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        AF_INET6 => Ok(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
        other => Err(IpvsCodecError::UnknownFamily(other)),
    }
}

fn decode_stats(value: &[u8]) -> Result<IpvsStats> {
    let mut s = IpvsStats::default();
    for nla in parse_attrs(value)? {
        let slot = match nla.kind {
            IPVS_STATS_ATTR_CONNS => &mut s.connections,
            IPVS_STATS_ATTR_INPKTS => &mut s.packets_in,
            IPVS_STATS_ATTR_OUTPKTS => &mut s.packets_out,
            IPVS_STATS_ATTR_INBYTES => &mut s.bytes_in,
            IPVS_STATS_ATTR_OUTBYTES => &mut s.bytes_out,
            IPVS_STATS_ATTR_CPS => &mut s.connections_per_second,
            IPVS_STATS_ATTR_INPPS => &mut s.packets_in_per_second,
            IPVS_STATS_ATTR_OUTPPS => &mut s.packets_out_per_second,
            IPVS_STATS_ATTR_INBPS => &mut s.bytes_in_per_second,
            IPVS_STATS_ATTR_OUTBPS => &mut s.bytes_out_per_second,
            _ => continue, // IPVS_STATS_ATTR_PAD and anything newer
        };
        *slot = get_counter(&nla)?;
    }
    Ok(s)
}

fn decode_service(value: &[u8]) -> Result<IpvsService> {
    let mut family = None;
    let mut protocol = None;
    let mut addr_raw = None;
    let mut port = None;
    let mut fwmark = None;
    let mut scheduler = None;
    let mut persistence_engine = None;
    let mut flags = None;
    let mut timeout = None;
    let mut netmask = None;
    let mut stats = None;
    let mut stats64 = None;
    for nla in parse_attrs(value)? {
        match nla.kind {
            IPVS_SVC_ATTR_AF => family = Some(nla.get_u16()?),
            IPVS_SVC_ATTR_PROTOCOL => protocol = Some(nla.get_u16()?),
            IPVS_SVC_ATTR_ADDR => addr_raw = Some(nla.value),
            IPVS_SVC_ATTR_PORT => port = Some(nla.get_be16()?),
            IPVS_SVC_ATTR_FWMARK => fwmark = Some(nla.get_u32()?),
            IPVS_SVC_ATTR_SCHED_NAME => scheduler = Some(nla.get_string()?),
            IPVS_SVC_ATTR_PE_NAME => persistence_engine = Some(nla.get_string()?),
            IPVS_SVC_ATTR_FLAGS => {
                let raw: [u8; 8] = nla.fixed()?;
                let (f, m) = raw.split_at(4);
                let word = |b: &[u8]| b.try_into().map(u32::from_ne_bytes).unwrap_or_default();
                flags = Some((word(f), word(m)));
            }
            IPVS_SVC_ATTR_TIMEOUT => timeout = Some(nla.get_u32()?),
            IPVS_SVC_ATTR_NETMASK => netmask = Some(nla.get_u32()?),
            IPVS_SVC_ATTR_STATS => stats = Some(decode_stats(nla.value)?),
            IPVS_SVC_ATTR_STATS64 => stats64 = Some(decode_stats(nla.value)?),
            _ => {}
        }
    }
    let family = family.ok_or(IpvsCodecError::MissingAttribute("IPVS_SVC_ATTR_AF"))?;
    let (protocol, addr, port) = if fwmark.is_some() {
        (0, unspecified(family)?, 0)
    } else {
        let missing = IpvsCodecError::MissingAttribute;
        let raw = addr_raw.ok_or(missing("IPVS_SVC_ATTR_ADDR"))?;
        (
            protocol.ok_or(missing("IPVS_SVC_ATTR_PROTOCOL"))?,
            get_addr(IPVS_SVC_ATTR_ADDR, raw, Some(family))?,
            port.ok_or(missing("IPVS_SVC_ATTR_PORT"))?,
        )
    };
    let (flags, flags_mask) =
        flags.ok_or(IpvsCodecError::MissingAttribute("IPVS_SVC_ATTR_FLAGS"))?;
    Ok(IpvsService {
        family,
        protocol,
        addr,
        port,
        fwmark,
        scheduler: scheduler.ok_or(IpvsCodecError::MissingAttribute("IPVS_SVC_ATTR_SCHED_NAME"))?,
        persistence_engine,
        flags,
        flags_mask,
        timeout: timeout.ok_or(IpvsCodecError::MissingAttribute("IPVS_SVC_ATTR_TIMEOUT"))?,
        netmask: netmask.ok_or(IpvsCodecError::MissingAttribute("IPVS_SVC_ATTR_NETMASK"))?,
        stats,
        stats64,
    })
}

/// `service_family` is used for the address when the kernel omits
/// `IPVS_DEST_ATTR_ADDR_FAMILY` (kernels before 4.x); a 16-byte address with neither
/// reads as IPv6.
fn decode_destination(value: &[u8], service_family: Option<u16>) -> Result<IpvsDestination> {
    let missing = IpvsCodecError::MissingAttribute;
    let mut addr_raw = None;
    let mut port = None;
    let mut fwd_method = None;
    let mut weight = None;
    let mut upper = None;
    let mut lower = None;
    let mut family = None;
    let mut tunnel = IpvsTunnel::default();
    let mut counters = IpvsDestinationCounters::default();
    for nla in parse_attrs(value)? {
        match nla.kind {
            IPVS_DEST_ATTR_ADDR => addr_raw = Some(nla.value),
            IPVS_DEST_ATTR_PORT => port = Some(nla.get_be16()?),
            IPVS_DEST_ATTR_FWD_METHOD => fwd_method = Some(nla.get_u32()?),
            IPVS_DEST_ATTR_WEIGHT => weight = Some(nla.get_u32()?),
            IPVS_DEST_ATTR_U_THRESH => upper = Some(nla.get_u32()?),
            IPVS_DEST_ATTR_L_THRESH => lower = Some(nla.get_u32()?),
            IPVS_DEST_ATTR_ACTIVE_CONNS => counters.active_connections = Some(nla.get_u32()?),
            IPVS_DEST_ATTR_INACT_CONNS => counters.inactive_connections = Some(nla.get_u32()?),
            IPVS_DEST_ATTR_PERSIST_CONNS => counters.persistent_connections = Some(nla.get_u32()?),
            IPVS_DEST_ATTR_STATS => counters.stats = Some(decode_stats(nla.value)?),
            IPVS_DEST_ATTR_ADDR_FAMILY => family = Some(nla.get_u16()?),
            IPVS_DEST_ATTR_STATS64 => counters.stats64 = Some(decode_stats(nla.value)?),
            IPVS_DEST_ATTR_TUN_TYPE => tunnel.tun_type = Some(nla.get_u8()?),
            IPVS_DEST_ATTR_TUN_PORT => tunnel.port = Some(nla.get_be16()?),
            IPVS_DEST_ATTR_TUN_FLAGS => tunnel.flags = Some(nla.get_u16()?),
            _ => {}
        }
    }
    let raw = addr_raw.ok_or(missing("IPVS_DEST_ATTR_ADDR"))?;
    Ok(IpvsDestination {
        addr: get_addr(IPVS_DEST_ATTR_ADDR, raw, family.or(service_family))?,
        port: port.ok_or(missing("IPVS_DEST_ATTR_PORT"))?,
        fwd_method: fwd_method.ok_or(missing("IPVS_DEST_ATTR_FWD_METHOD"))?,
        weight: weight.ok_or(missing("IPVS_DEST_ATTR_WEIGHT"))?,
        upper_threshold: upper.ok_or(missing("IPVS_DEST_ATTR_U_THRESH"))?,
        lower_threshold: lower.ok_or(missing("IPVS_DEST_ATTR_L_THRESH"))?,
        family,
        tunnel,
        counters,
    })
}

fn decode_ipvs(payload: &[u8]) -> Result<NetlinkBody> {
    let (cmd, version, attrs) = split_genl(payload)?;
    let command = IpvsCommand::from_u8(cmd).ok_or(IpvsCodecError::UnknownCommand(cmd))?;
    let mut nested_flag = false;
    let mut service = None;
    let mut dest_raw = None;
    for nla in parse_attrs(attrs)? {
        match nla.kind {
            IPVS_CMD_ATTR_SERVICE => {
                nested_flag |= nla.nested;
                service = Some(decode_service(nla.value)?);
            }
            IPVS_CMD_ATTR_DEST => {
                nested_flag |= nla.nested;
                dest_raw = Some(nla.value);
            }
            _ => {}
        }
    }
    let service_family = service.as_ref().map(|s: &IpvsService| s.family);
    let destination = match dest_raw {
        Some(raw) => Some(decode_destination(raw, service_family)?),
        None => None,
    };
    Ok(NetlinkBody::Ipvs {
        command,
        version,
        attributes: IpvsAttributes {
            service,
            destination,
        },
        nested_flag,
    })
}

fn split_genl(payload: &[u8]) -> Result<(u8, u8, &[u8])> {
    match payload {
        [cmd, version, _, _, attrs @ ..] => Ok((*cmd, *version, attrs)),
        _ => Err(NetlinkFormatError::Truncated {
            what: "genlmsghdr",
            needed: GENL_HDRLEN,
            available: payload.len(),
        }
        .into()),
    }
}

fn decode_control(payload: &[u8]) -> Result<NetlinkBody> {
    let (command, version, attrs) = split_genl(payload)?;
    let mut ctrl = ControlMessage {
        command,
        version,
        family_name: None,
        family_id: None,
    };
    for nla in parse_attrs(attrs)? {
        match nla.kind {
            CTRL_ATTR_FAMILY_ID => ctrl.family_id = Some(nla.get_u16()?),
            CTRL_ATTR_FAMILY_NAME => ctrl.family_name = Some(nla.get_string()?),
            _ => {}
        }
    }
    Ok(NetlinkBody::Control(ctrl))
}

fn decode_body(message_type: u16, payload: &[u8], ipvs_family_id: u16) -> Result<NetlinkBody> {
    let word = |what| {
        frame::read_u32(payload, 0)
            .map(|w| w as i32)
            .ok_or(NetlinkFormatError::Truncated {
                what,
                needed: 4,
                available: payload.len(),
            })
    };
    match message_type {
        NLMSG_ERROR => Ok(NetlinkBody::Error {
            errno: word("nlmsgerr")?,
            request: payload.get(4..).unwrap_or_default().to_vec(),
        }),
        NLMSG_DONE => Ok(NetlinkBody::Done {
            code: if payload.is_empty() { 0 } else { word("done")? },
        }),
        GENL_ID_CTRL => decode_control(payload),
        t if t == ipvs_family_id => decode_ipvs(payload),
        _ => Ok(NetlinkBody::Other(payload.to_vec())),
    }
}

/// Decodes every message in `buf` (one `recv` may carry several, as in a dump).
/// `ipvs_family_id` is the id resolved with [`get_family`]; messages of other types
/// come back as [`NetlinkBody::Other`]. Fewer bytes left than an `nlmsghdr` are a
/// truncated header here, not (as [`frame::messages`] says) a bad length.
pub fn decode(buf: &[u8], ipvs_family_id: u16) -> Result<Vec<NetlinkMessage>> {
    frame::messages(buf)
        .map(|message| {
            let message = message.map_err(short_header_is_truncated)?;
            let body = decode_body(
                message.header.message_type,
                message.payload(),
                ipvs_family_id,
            )?;
            Ok(NetlinkMessage {
                header: message.header,
                body,
            })
        })
        .collect()
}

fn short_header_is_truncated(error: NetlinkFormatError) -> NetlinkFormatError {
    match error {
        NetlinkFormatError::BadLength { available, .. } if available < NLMSG_HDRLEN => {
            NetlinkFormatError::Truncated {
                what: "nlmsghdr",
                needed: NLMSG_HDRLEN,
                available,
            }
        }
        other => other,
    }
}

/// The family id from a `CTRL_CMD_GETFAMILY` reply, or the kernel's errno.
pub fn family_id_from_reply(buf: &[u8]) -> Result<std::result::Result<u16, i32>> {
    for msg in decode(buf, 0)? {
        match msg.body {
            NetlinkBody::Control(ControlMessage {
                family_id: Some(id),
                ..
            }) => return Ok(Ok(id)),
            NetlinkBody::Error { errno, .. } if errno != 0 => return Ok(Err(errno)),
            _ => {}
        }
    }
    Err(IpvsCodecError::MissingAttribute("CTRL_ATTR_FAMILY_ID"))
}

/// Annotated byte vectors (x86-64 / little-endian byte order): each decodes to the
/// expected value and re-encodes byte for byte.
#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::*;
    use crate::kernel::netlink::frame::NLM_F_MULTI;

    /// The IPVS family id used in the vectors (assigned at module load; 0x23 here).
    const FAM: u16 = 0x23;

    /// Decodes `bytes`, re-encodes the messages and checks the result is identical.
    fn round_trip(bytes: &[u8]) -> Result<Vec<NetlinkMessage>> {
        let msgs = decode(bytes, FAM)?;
        assert_eq!(encode_messages(&msgs), bytes, "re-encoding differs");
        Ok(msgs)
    }

    fn single(bytes: &[u8]) -> Result<NetlinkMessage> {
        let mut msgs = round_trip(bytes)?;
        assert_eq!(msgs.len(), 1);
        msgs.pop()
            .ok_or(IpvsCodecError::MissingAttribute("message"))
    }

    fn request(message_type: u16, flags: u16, seq: u32) -> NetlinkHeader {
        NetlinkHeader {
            message_type,
            flags,
            seq,
            port_id: 0,
        }
    }

    fn ipvs(command: IpvsCommand, attributes: IpvsAttributes, nested_flag: bool) -> NetlinkBody {
        NetlinkBody::Ipvs {
            command,
            version: 1,
            attributes,
            nested_flag,
        }
    }

    /// TCP 10.96.0.10:80 rr, persistent for 10800 s, netmask /32.
    fn dns_service() -> IpvsService {
        let mut svc = IpvsService::new(
            IPPROTO_TCP,
            "10.96.0.10"
                .parse()
                .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            80,
            "rr",
        );
        svc.flags = IP_VS_SVC_F_PERSISTENT;
        svc.timeout = 10800;
        svc
    }

    fn pod_destination() -> IpvsDestination {
        IpvsDestination::masq(IpAddr::V4(Ipv4Addr::new(10, 244, 1, 10)), 8080, 1)
    }

    #[rustfmt::skip]
    const GETFAMILY_IPVS: &[u8] = &[
        // nlmsghdr
        0x20, 0x00, 0x00, 0x00, // nlmsg_len 32
        0x10, 0x00,             // nlmsg_type GENL_ID_CTRL
        0x01, 0x00,             // nlmsg_flags NLM_F_REQUEST
        0x01, 0x00, 0x00, 0x00, // nlmsg_seq 1
        0x00, 0x00, 0x00, 0x00, // nlmsg_pid 0
        // genlmsghdr
        0x03, 0x01, 0x00, 0x00, // cmd CTRL_CMD_GETFAMILY, version 1, reserved
        // nlattr
        0x09, 0x00,             // len 9 (4 + "IPVS\0")
        0x02, 0x00,             // type CTRL_ATTR_FAMILY_NAME
        b'I', b'P', b'V', b'S', 0x00, // "IPVS\0"
        0x00, 0x00, 0x00,       // padding to 4
    ];

    #[test]
    fn getfamily_ipvs_request() -> Result<()> {
        assert_eq!(get_family(1, IPVS_GENL_NAME), GETFAMILY_IPVS);
        let msg = single(GETFAMILY_IPVS)?;
        assert_eq!(msg.header, request(GENL_ID_CTRL, NLM_F_REQUEST, 1));
        assert_eq!(
            msg.body,
            NetlinkBody::Control(ControlMessage {
                command: CTRL_CMD_GETFAMILY,
                version: 1,
                family_name: Some("IPVS".into()),
                family_id: None,
            })
        );
        Ok(())
    }

    #[rustfmt::skip]
    const GETFAMILY_REPLY: &[u8] = &[
        0x28, 0x00, 0x00, 0x00, // nlmsg_len 40
        0x10, 0x00,             // nlmsg_type GENL_ID_CTRL
        0x00, 0x00,             // nlmsg_flags 0
        0x01, 0x00, 0x00, 0x00, // nlmsg_seq 1
        0x34, 0x12, 0x00, 0x00, // nlmsg_pid 0x1234
        0x01, 0x02, 0x00, 0x00, // cmd CTRL_CMD_NEWFAMILY, version 2
        0x09, 0x00, 0x02, 0x00, // len 9, CTRL_ATTR_FAMILY_NAME
        b'I', b'P', b'V', b'S', 0x00, 0x00, 0x00, 0x00, // "IPVS\0" + pad
        0x06, 0x00, 0x01, 0x00, // len 6, CTRL_ATTR_FAMILY_ID
        0x23, 0x00, 0x00, 0x00, // 0x23 + pad
        // (a real reply continues with VERSION, HDRSIZE, MAXATTR, OPS, MCAST_GROUPS)
    ];

    #[test]
    fn getfamily_reply_gives_family_id() -> Result<()> {
        round_trip(GETFAMILY_REPLY)?;
        assert_eq!(family_id_from_reply(GETFAMILY_REPLY)?, Ok(0x23));
        Ok(())
    }

    /// `IPVS_CMD_ATTR_SERVICE` for [`dns_service`] with `NLA_F_NESTED`.
    #[rustfmt::skip]
    const SVC_DNS_NEST: &[u8] = &[
        0x54, 0x00, 0x01, 0x80, // len 84, IPVS_CMD_ATTR_SERVICE | NLA_F_NESTED
        0x06, 0x00, 0x01, 0x00, // len 6, IPVS_SVC_ATTR_AF
        0x02, 0x00, 0x00, 0x00, //   AF_INET + pad
        0x06, 0x00, 0x02, 0x00, // len 6, IPVS_SVC_ATTR_PROTOCOL
        0x06, 0x00, 0x00, 0x00, //   IPPROTO_TCP + pad
        0x14, 0x00, 0x03, 0x00, // len 20, IPVS_SVC_ATTR_ADDR (nf_inet_addr)
        0x0a, 0x60, 0x00, 0x0a, //   10.96.0.10
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x06, 0x00, 0x04, 0x00, // len 6, IPVS_SVC_ATTR_PORT
        0x00, 0x50, 0x00, 0x00, //   80 (big-endian) + pad
        0x07, 0x00, 0x06, 0x00, // len 7, IPVS_SVC_ATTR_SCHED_NAME
        b'r', b'r', 0x00, 0x00, //   "rr\0" + pad
        0x0c, 0x00, 0x07, 0x00, // len 12, IPVS_SVC_ATTR_FLAGS
        0x01, 0x00, 0x00, 0x00, //   flags IP_VS_SVC_F_PERSISTENT
        0xff, 0xff, 0xff, 0xff, //   mask !0
        0x08, 0x00, 0x08, 0x00, // len 8, IPVS_SVC_ATTR_TIMEOUT
        0x30, 0x2a, 0x00, 0x00, //   10800
        0x08, 0x00, 0x09, 0x00, // len 8, IPVS_SVC_ATTR_NETMASK
        0xff, 0xff, 0xff, 0xff, //   0xffffffff
    ];

    #[rustfmt::skip]
    const NEW_SERVICE_HDR: &[u8] = &[
        0x68, 0x00, 0x00, 0x00, // nlmsg_len 104
        0x23, 0x00,             // nlmsg_type IPVS family 0x23
        0x05, 0x00,             // nlmsg_flags NLM_F_REQUEST | NLM_F_ACK
        0x02, 0x00, 0x00, 0x00, // nlmsg_seq 2
        0x00, 0x00, 0x00, 0x00, // nlmsg_pid 0
        0x01, 0x01, 0x00, 0x00, // cmd IPVS_CMD_NEW_SERVICE, version 1
    ];

    #[test]
    fn new_service_tcp_persistent() -> Result<()> {
        let bytes = [NEW_SERVICE_HDR, SVC_DNS_NEST].concat();
        assert_eq!(add_service(FAM, 2, &dns_service()), bytes);
        let msg = single(&bytes)?;
        assert_eq!(msg.header, request(FAM, NLM_F_REQUEST | NLM_F_ACK, 2));
        let attrs = IpvsAttributes {
            service: Some(dns_service()),
            destination: None,
        };
        assert_eq!(msg.body, ipvs(IpvsCommand::NewService, attrs, true));
        Ok(())
    }

    /// `IPVS_CMD_ATTR_DEST` for [`pod_destination`].
    #[rustfmt::skip]
    const DEST_POD_NEST: &[u8] = &[
        0x48, 0x00, 0x02, 0x80, // len 72, IPVS_CMD_ATTR_DEST | NLA_F_NESTED
        0x14, 0x00, 0x01, 0x00, // len 20, IPVS_DEST_ATTR_ADDR
        0x0a, 0xf4, 0x01, 0x0a, //   10.244.1.10
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x06, 0x00, 0x02, 0x00, // len 6, IPVS_DEST_ATTR_PORT
        0x1f, 0x90, 0x00, 0x00, //   8080 (big-endian) + pad
        0x08, 0x00, 0x03, 0x00, // len 8, IPVS_DEST_ATTR_FWD_METHOD
        0x00, 0x00, 0x00, 0x00, //   IP_VS_CONN_F_MASQ
        0x08, 0x00, 0x04, 0x00, // len 8, IPVS_DEST_ATTR_WEIGHT
        0x01, 0x00, 0x00, 0x00, //   1
        0x08, 0x00, 0x05, 0x00, // len 8, IPVS_DEST_ATTR_U_THRESH
        0x00, 0x00, 0x00, 0x00, //   0
        0x08, 0x00, 0x06, 0x00, // len 8, IPVS_DEST_ATTR_L_THRESH
        0x00, 0x00, 0x00, 0x00, //   0
        0x06, 0x00, 0x0b, 0x00, // len 6, IPVS_DEST_ATTR_ADDR_FAMILY
        0x02, 0x00, 0x00, 0x00, //   AF_INET + pad
    ];

    #[test]
    fn new_dest_masq_weight_one() -> Result<()> {
        #[rustfmt::skip]
        let hdr: &[u8] = &[
            0xb0, 0x00, 0x00, 0x00, // nlmsg_len 176
            0x23, 0x00,             // nlmsg_type IPVS
            0x05, 0x00,             // NLM_F_REQUEST | NLM_F_ACK
            0x03, 0x00, 0x00, 0x00, // seq 3
            0x00, 0x00, 0x00, 0x00, // pid 0
            0x05, 0x01, 0x00, 0x00, // cmd IPVS_CMD_NEW_DEST, version 1
        ];
        let bytes = [hdr, SVC_DNS_NEST, DEST_POD_NEST].concat();
        assert_eq!(
            add_destination(FAM, 3, &dns_service(), &pod_destination()),
            bytes
        );
        let msg = single(&bytes)?;
        let attrs = IpvsAttributes {
            service: Some(dns_service()),
            destination: Some(pod_destination()),
        };
        assert_eq!(msg.body, ipvs(IpvsCommand::NewDest, attrs, true));
        Ok(())
    }

    #[test]
    fn del_dest() -> Result<()> {
        #[rustfmt::skip]
        let hdr: &[u8] = &[
            0xb0, 0x00, 0x00, 0x00, // nlmsg_len 176
            0x23, 0x00,             // nlmsg_type IPVS
            0x05, 0x00,             // NLM_F_REQUEST | NLM_F_ACK
            0x04, 0x00, 0x00, 0x00, // seq 4
            0x00, 0x00, 0x00, 0x00, // pid 0
            0x07, 0x01, 0x00, 0x00, // cmd IPVS_CMD_DEL_DEST, version 1
        ];
        let bytes = [hdr, SVC_DNS_NEST, DEST_POD_NEST].concat();
        let built = delete_destination(FAM, 4, &dns_service(), &pod_destination());
        assert_eq!(built, bytes);
        let msg = single(&bytes)?;
        assert!(matches!(
            msg.body,
            NetlinkBody::Ipvs {
                command: IpvsCommand::DelDest,
                ..
            }
        ));
        Ok(())
    }

    #[test]
    fn new_service_ipv6() -> Result<()> {
        #[rustfmt::skip]
        let bytes: &[u8] = &[
            0x68, 0x00, 0x00, 0x00, // nlmsg_len 104
            0x23, 0x00,             // nlmsg_type IPVS
            0x05, 0x00,             // NLM_F_REQUEST | NLM_F_ACK
            0x05, 0x00, 0x00, 0x00, // seq 5
            0x00, 0x00, 0x00, 0x00, // pid 0
            0x01, 0x01, 0x00, 0x00, // cmd IPVS_CMD_NEW_SERVICE, version 1
            0x54, 0x00, 0x01, 0x80, // len 84, IPVS_CMD_ATTR_SERVICE | NLA_F_NESTED
            0x06, 0x00, 0x01, 0x00, // len 6, IPVS_SVC_ATTR_AF
            0x0a, 0x00, 0x00, 0x00, //   AF_INET6 + pad
            0x06, 0x00, 0x02, 0x00, // len 6, IPVS_SVC_ATTR_PROTOCOL
            0x11, 0x00, 0x00, 0x00, //   IPPROTO_UDP + pad
            0x14, 0x00, 0x03, 0x00, // len 20, IPVS_SVC_ATTR_ADDR
            0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //   fd00::a
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a,
            0x06, 0x00, 0x04, 0x00, // len 6, IPVS_SVC_ATTR_PORT
            0x00, 0x35, 0x00, 0x00, //   53 (big-endian) + pad
            0x07, 0x00, 0x06, 0x00, // len 7, IPVS_SVC_ATTR_SCHED_NAME
            b'r', b'r', 0x00, 0x00, //   "rr\0" + pad
            0x0c, 0x00, 0x07, 0x00, // len 12, IPVS_SVC_ATTR_FLAGS
            0x00, 0x00, 0x00, 0x00, //   flags 0
            0xff, 0xff, 0xff, 0xff, //   mask !0
            0x08, 0x00, 0x08, 0x00, // len 8, IPVS_SVC_ATTR_TIMEOUT
            0x00, 0x00, 0x00, 0x00, //   0
            0x08, 0x00, 0x09, 0x00, // len 8, IPVS_SVC_ATTR_NETMASK
            0x80, 0x00, 0x00, 0x00, //   128 (prefix length for IPv6)
        ];
        let svc = IpvsService::new(
            IPPROTO_UDP,
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0xa)),
            53,
            "rr",
        );
        assert_eq!(add_service(FAM, 5, &svc), bytes);
        let msg = single(bytes)?;
        let attrs = IpvsAttributes {
            service: Some(svc),
            destination: None,
        };
        assert_eq!(msg.body, ipvs(IpvsCommand::NewService, attrs, true));
        Ok(())
    }

    #[test]
    fn list_requests_use_dump() -> Result<()> {
        #[rustfmt::skip]
        let bytes: &[u8] = &[
            0x14, 0x00, 0x00, 0x00, // nlmsg_len 20
            0x23, 0x00,             // nlmsg_type IPVS
            0x01, 0x03,             // NLM_F_REQUEST | NLM_F_DUMP
            0x06, 0x00, 0x00, 0x00, // seq 6
            0x00, 0x00, 0x00, 0x00, // pid 0
            0x04, 0x01, 0x00, 0x00, // cmd IPVS_CMD_GET_SERVICE, version 1
        ];
        assert_eq!(list_services(FAM, 6), bytes);
        single(bytes)?;
        let dests = list_destinations(FAM, 7, &dns_service());
        assert_eq!(dests.get(6..8), Some(&[0x01, 0x03][..]));
        assert_eq!(dests.get(16), Some(&(IpvsCommand::GetDest as u8)));
        assert_eq!(dests.get(20..), Some(SVC_DNS_NEST));
        Ok(())
    }

    /// A `GET_SERVICE` dump reply: two services and `NLMSG_DONE`, as the kernel sends
    /// them (no `NLA_F_NESTED`, `NLM_F_MULTI`). The first carries `IPVS_SVC_ATTR_STATS`;
    /// the real kernel also adds `IPVS_SVC_ATTR_STATS64`, left out here for length.
    #[rustfmt::skip]
    const SERVICE_DUMP: &[u8] = &[
        // ---- message 1
        0xc4, 0x00, 0x00, 0x00, // nlmsg_len 196
        0x23, 0x00,             // nlmsg_type IPVS
        0x02, 0x00,             // NLM_F_MULTI
        0x07, 0x00, 0x00, 0x00, // seq 7
        0x34, 0x12, 0x00, 0x00, // pid 0x1234
        0x01, 0x01, 0x00, 0x00, // cmd IPVS_CMD_NEW_SERVICE, version 1
        0xb0, 0x00, 0x01, 0x00, // len 176, IPVS_CMD_ATTR_SERVICE (no NLA_F_NESTED)
        0x06, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, // AF: AF_INET
        0x06, 0x00, 0x02, 0x00, 0x06, 0x00, 0x00, 0x00, // PROTOCOL: TCP
        0x14, 0x00, 0x03, 0x00, // len 20, ADDR
        0x0a, 0x60, 0x00, 0x0a, //   10.96.0.10
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x06, 0x00, 0x04, 0x00, 0x00, 0x35, 0x00, 0x00, // PORT: 53
        0x07, 0x00, 0x06, 0x00, b'r', b'r', 0x00, 0x00, // SCHED_NAME: "rr"
        0x0c, 0x00, 0x07, 0x00, // len 12, FLAGS
        0x03, 0x00, 0x00, 0x00, //   PERSISTENT | HASHED
        0xff, 0xff, 0xff, 0xff, //   mask !0
        0x08, 0x00, 0x08, 0x00, 0x30, 0x2a, 0x00, 0x00, // TIMEOUT: 10800
        0x08, 0x00, 0x09, 0x00, 0xff, 0xff, 0xff, 0xff, // NETMASK: 0xffffffff
        0x5c, 0x00, 0x0a, 0x00, // len 92, IPVS_SVC_ATTR_STATS (nested, no flag)
        0x08, 0x00, 0x01, 0x00, 0x05, 0x00, 0x00, 0x00, //   CONNS: 5 (u32)
        0x08, 0x00, 0x02, 0x00, 0x64, 0x00, 0x00, 0x00, //   INPKTS: 100
        0x08, 0x00, 0x03, 0x00, 0x5a, 0x00, 0x00, 0x00, //   OUTPKTS: 90
        0x0c, 0x00, 0x04, 0x00, //   len 12, INBYTES (u64)
        0x10, 0x27, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //     10000
        0x0c, 0x00, 0x05, 0x00, //   len 12, OUTBYTES (u64)
        0x40, 0x1f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //     8000
        0x08, 0x00, 0x06, 0x00, 0x01, 0x00, 0x00, 0x00, //   CPS: 1
        0x08, 0x00, 0x07, 0x00, 0x02, 0x00, 0x00, 0x00, //   INPPS: 2
        0x08, 0x00, 0x08, 0x00, 0x03, 0x00, 0x00, 0x00, //   OUTPPS: 3
        0x08, 0x00, 0x09, 0x00, 0x04, 0x00, 0x00, 0x00, //   INBPS: 4
        0x08, 0x00, 0x0a, 0x00, 0x05, 0x00, 0x00, 0x00, //   OUTBPS: 5
        // ---- message 2
        0x68, 0x00, 0x00, 0x00, // nlmsg_len 104
        0x23, 0x00,             // nlmsg_type IPVS
        0x02, 0x00,             // NLM_F_MULTI
        0x07, 0x00, 0x00, 0x00, // seq 7
        0x34, 0x12, 0x00, 0x00, // pid 0x1234
        0x01, 0x01, 0x00, 0x00, // cmd IPVS_CMD_NEW_SERVICE, version 1
        0x54, 0x00, 0x01, 0x00, // len 84, IPVS_CMD_ATTR_SERVICE
        0x06, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, // AF: AF_INET
        0x06, 0x00, 0x02, 0x00, 0x06, 0x00, 0x00, 0x00, // PROTOCOL: TCP
        0x14, 0x00, 0x03, 0x00, // len 20, ADDR
        0x0a, 0x60, 0x00, 0x01, //   10.96.0.1
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x06, 0x00, 0x04, 0x00, 0x01, 0xbb, 0x00, 0x00, // PORT: 443
        0x07, 0x00, 0x06, 0x00, b'r', b'r', 0x00, 0x00, // SCHED_NAME: "rr"
        0x0c, 0x00, 0x07, 0x00, // len 12, FLAGS
        0x02, 0x00, 0x00, 0x00, //   HASHED
        0xff, 0xff, 0xff, 0xff, //   mask !0
        0x08, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, // TIMEOUT: 0
        0x08, 0x00, 0x09, 0x00, 0xff, 0xff, 0xff, 0xff, // NETMASK: 0xffffffff
        // ---- message 3
        0x14, 0x00, 0x00, 0x00, // nlmsg_len 20
        0x03, 0x00,             // NLMSG_DONE
        0x02, 0x00,             // NLM_F_MULTI
        0x07, 0x00, 0x00, 0x00, // seq 7
        0x34, 0x12, 0x00, 0x00, // pid 0x1234
        0x00, 0x00, 0x00, 0x00, // status 0
    ];

    #[test]
    fn service_dump_two_services() -> Result<()> {
        let msgs = round_trip(SERVICE_DUMP)?;
        assert_eq!(msgs.len(), 3);
        let reply = NetlinkHeader {
            message_type: FAM,
            flags: NLM_F_MULTI,
            seq: 7,
            port_id: 0x1234,
        };
        let services: Vec<&IpvsService> = msgs
            .iter()
            .filter_map(|m| m.body.ipvs_attributes()?.service.as_ref())
            .collect();
        assert!(msgs.iter().take(2).all(|m| m.header == reply));

        let mut first = IpvsService::new(
            IPPROTO_TCP,
            IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)),
            53,
            "rr",
        );
        first.flags = IP_VS_SVC_F_PERSISTENT | IP_VS_SVC_F_HASHED;
        first.timeout = 10800;
        first.stats = Some(IpvsStats {
            connections: 5,
            packets_in: 100,
            packets_out: 90,
            bytes_in: 10000,
            bytes_out: 8000,
            connections_per_second: 1,
            packets_in_per_second: 2,
            packets_out_per_second: 3,
            bytes_in_per_second: 4,
            bytes_out_per_second: 5,
        });
        let mut second = IpvsService::new(
            IPPROTO_TCP,
            IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)),
            443,
            "rr",
        );
        second.flags = IP_VS_SVC_F_HASHED;
        assert_eq!(services, [&first, &second]);
        assert!(first.is_persistent() && !second.is_persistent());
        assert!(matches!(
            msgs.get(1).map(|m| &m.body),
            Some(NetlinkBody::Ipvs {
                nested_flag: false,
                ..
            })
        ));
        assert_eq!(
            msgs.get(2).map(|m| &m.body),
            Some(&NetlinkBody::Done { code: 0 })
        );
        Ok(())
    }

    /// A `GET_DEST` dump entry (kernel 5.2+ layout): tunnel fields and counters.
    #[rustfmt::skip]
    const DEST_DUMP_ENTRY: &[u8] = &[
        0x8c, 0x00, 0x00, 0x00, // nlmsg_len 140
        0x23, 0x00,             // nlmsg_type IPVS
        0x02, 0x00,             // NLM_F_MULTI
        0x08, 0x00, 0x00, 0x00, // seq 8
        0x34, 0x12, 0x00, 0x00, // pid 0x1234
        0x05, 0x01, 0x00, 0x00, // cmd IPVS_CMD_NEW_DEST, version 1
        0x78, 0x00, 0x02, 0x00, // len 120, IPVS_CMD_ATTR_DEST
        0x14, 0x00, 0x01, 0x00, // len 20, ADDR
        0x0a, 0xf4, 0x01, 0x0a, //   10.244.1.10
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x06, 0x00, 0x02, 0x00, 0x1f, 0x90, 0x00, 0x00, // PORT: 8080
        0x08, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, // FWD_METHOD: MASQ
        0x08, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, // WEIGHT: 0 (draining)
        0x05, 0x00, 0x0d, 0x00, 0x00, 0x00, 0x00, 0x00, // TUN_TYPE: 0 (u8) + pad
        0x06, 0x00, 0x0e, 0x00, 0x00, 0x00, 0x00, 0x00, // TUN_PORT: 0
        0x06, 0x00, 0x0f, 0x00, 0x00, 0x00, 0x00, 0x00, // TUN_FLAGS: 0
        0x08, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, // U_THRESH: 0
        0x08, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00, 0x00, // L_THRESH: 0
        0x08, 0x00, 0x07, 0x00, 0x03, 0x00, 0x00, 0x00, // ACTIVE_CONNS: 3
        0x08, 0x00, 0x08, 0x00, 0x07, 0x00, 0x00, 0x00, // INACT_CONNS: 7
        0x08, 0x00, 0x09, 0x00, 0x00, 0x00, 0x00, 0x00, // PERSIST_CONNS: 0
        0x06, 0x00, 0x0b, 0x00, 0x02, 0x00, 0x00, 0x00, // ADDR_FAMILY: AF_INET
    ];

    #[test]
    fn dest_dump_counters() -> Result<()> {
        let msg = single(DEST_DUMP_ENTRY)?;
        let dest = msg
            .body
            .ipvs_attributes()
            .and_then(|a| a.destination.clone())
            .ok_or(IpvsCodecError::MissingAttribute("dest"))?;
        assert_eq!(dest.addr, IpAddr::V4(Ipv4Addr::new(10, 244, 1, 10)));
        assert_eq!(
            (dest.port, dest.weight, dest.fwd_method),
            (8080, 0, IP_VS_CONN_F_MASQ)
        );
        assert_eq!(dest.counters.active_connections, Some(3));
        assert_eq!(dest.counters.inactive_connections, Some(7));
        assert_eq!(dest.tunnel.tun_type, Some(0));
        Ok(())
    }

    #[rustfmt::skip]
    const ERROR_EEXIST: &[u8] = &[
        0x24, 0x00, 0x00, 0x00, // nlmsg_len 36
        0x02, 0x00,             // NLMSG_ERROR
        0x00, 0x01,             // NLM_F_CAPPED (request payload not echoed)
        0x02, 0x00, 0x00, 0x00, // seq 2
        0x34, 0x12, 0x00, 0x00, // pid 0x1234
        0xef, 0xff, 0xff, 0xff, // error -17 (EEXIST)
        // echoed request nlmsghdr
        0x68, 0x00, 0x00, 0x00, // len 104
        0x23, 0x00,             // type IPVS
        0x05, 0x00,             // NLM_F_REQUEST | NLM_F_ACK
        0x02, 0x00, 0x00, 0x00, // seq 2
        0x00, 0x00, 0x00, 0x00, // pid 0
    ];

    #[test]
    fn error_reply_eexist() -> Result<()> {
        let msg = single(ERROR_EEXIST)?;
        assert_eq!(msg.header.message_type, NLMSG_ERROR);
        assert_eq!(msg.header.seq, 2);
        let NetlinkBody::Error { errno, request } = &msg.body else {
            panic!("not an error: {:?}", msg.body);
        };
        assert_eq!(*errno, -17);
        assert_eq!(request.get(..4), NEW_SERVICE_HDR.get(..4));
        Ok(())
    }

    #[test]
    fn unknown_attributes_are_skipped() -> Result<()> {
        // The service nest with an extra attribute 0x63 (len 8) appended.
        let mut nest = SVC_DNS_NEST.to_vec();
        nest.extend_from_slice(&[0x08, 0x00, 0x63, 0x00, 0xde, 0xad, 0xbe, 0xef]);
        nest[0] += 8;
        let mut bytes = [NEW_SERVICE_HDR, &nest].concat();
        bytes[0] += 8;
        let msgs = decode(&bytes, FAM)?;
        let svc = msgs
            .first()
            .and_then(|m| m.body.ipvs_attributes()?.service.clone());
        assert_eq!(svc, Some(dns_service()));
        Ok(())
    }

    #[test]
    fn truncated_and_bad_lengths_are_errors() {
        let full = [NEW_SERVICE_HDR, SVC_DNS_NEST].concat();
        let short = full.get(..10).unwrap_or_default();
        assert_eq!(decode(short, FAM).map_err(|e| e.label()), Err("truncated"));
        // nlmsg_len says 104 but only 60 bytes are there.
        let cut = full.get(..60).unwrap_or_default();
        assert_eq!(decode(cut, FAM).map_err(|e| e.label()), Err("bad_length"));
        // An attribute claiming 2 bytes (less than its own header).
        let mut bad = full.clone();
        bad[24] = 0x02;
        assert_eq!(
            decode(&bad, FAM).map_err(|e| e.label()),
            Err("bad_attribute_length")
        );
        // PORT with a 4-byte value.
        let mut port = full;
        port[60] = 0x08;
        assert!(decode(&port, FAM).is_err());
    }

    #[test]
    fn unknown_command_is_an_error() {
        let mut bytes = [NEW_SERVICE_HDR, SVC_DNS_NEST].concat();
        bytes[16] = 0x63;
        assert_eq!(
            decode(&bytes, FAM),
            Err(IpvsCodecError::UnknownCommand(0x63))
        );
    }
}
