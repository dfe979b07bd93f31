//! IPVS requests (and, for the codec's round-trip tests, any message) to bytes.

use std::net::IpAddr;

use super::message::{ControlMessage, NetlinkBody, NetlinkMessage};
use super::types::{IpvsAttributes, IpvsDestination, IpvsService, IpvsStats, IpvsTimeouts};
use super::uapi::*;
use crate::kernel::netlink::frame::{
    self, NLA_F_NESTED, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, align4, put_attr,
    put_be16, put_nest, put_string, put_u8, put_u16, put_u32, put_u64,
};

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
            if let Some(t) = &attributes.timeouts {
                put_u32(buf, IPVS_CMD_ATTR_TIMEOUT_TCP, t.tcp);
                put_u32(buf, IPVS_CMD_ATTR_TIMEOUT_TCP_FIN, t.tcp_fin);
                put_u32(buf, IPVS_CMD_ATTR_TIMEOUT_UDP, t.udp);
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
/// commands, none but `NLM_F_REQUEST` for `GET_CONFIG` (answered by one reply message),
/// `NLM_F_ACK` for everything else so failures and successes are both reported.
pub fn request_flags(cmd: IpvsCommand) -> u16 {
    match cmd {
        IpvsCommand::GetService | IpvsCommand::GetDest => NLM_F_REQUEST | NLM_F_DUMP,
        IpvsCommand::GetConfig => NLM_F_REQUEST,
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
        ..IpvsAttributes::default()
    }
}

fn with_destination(svc: &IpvsService, dest: &IpvsDestination) -> IpvsAttributes {
    IpvsAttributes {
        service: Some(svc.clone()),
        destination: Some(dest.clone()),
        timeouts: None,
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

/// `IPVS_CMD_SET_CONFIG`: the three connection timeouts (a 0 leaves that one alone).
pub fn set_config(family_id: u16, seq: u32, timeouts: IpvsTimeouts) -> Vec<u8> {
    let attrs = IpvsAttributes {
        timeouts: Some(timeouts),
        ..IpvsAttributes::default()
    };
    encode(IpvsCommand::SetConfig, family_id, seq, &attrs)
}

/// `IPVS_CMD_GET_CONFIG`: the kernel answers with one `IPVS_CMD_SET_CONFIG` message
/// carrying the three timeouts.
pub fn get_config(family_id: u16, seq: u32) -> Vec<u8> {
    encode(
        IpvsCommand::GetConfig,
        family_id,
        seq,
        &IpvsAttributes::default(),
    )
}
