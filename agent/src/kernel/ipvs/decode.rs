//! Kernel replies (and, for the codec's tests, any IPVS message) from bytes to typed
//! values. Every read checks its lengths.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::message::{ControlMessage, GENL_HDRLEN, IpvsCodecError, NetlinkBody, NetlinkMessage};
use super::types::{
    IpvsAttributes, IpvsDestination, IpvsDestinationCounters, IpvsService, IpvsStats, IpvsTimeouts,
    IpvsTunnel,
};
use super::uapi::*;
use crate::kernel::netlink::frame::{
    self, Attribute, NLA_HDRLEN, NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN, NetlinkFormatError,
};

type Result<T> = std::result::Result<T, IpvsCodecError>;

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
    let mut timeouts: Option<IpvsTimeouts> = None;
    for nla in parse_attrs(attrs)? {
        match nla.kind {
            IPVS_CMD_ATTR_TIMEOUT_TCP => timeouts.get_or_insert_default().tcp = nla.get_u32()?,
            IPVS_CMD_ATTR_TIMEOUT_TCP_FIN => {
                timeouts.get_or_insert_default().tcp_fin = nla.get_u32()?;
            }
            IPVS_CMD_ATTR_TIMEOUT_UDP => timeouts.get_or_insert_default().udp = nla.get_u32()?,
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
            timeouts,
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
/// `ipvs_family_id` is the id resolved with [`super::encode::get_family`]; messages of other types
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
