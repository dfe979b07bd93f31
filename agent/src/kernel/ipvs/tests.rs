//! Annotated byte vectors (x86-64 / little-endian byte order): each decodes to the
//! expected value and re-encodes byte for byte.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::decode::*;
use super::encode::*;
use super::message::*;
use super::types::*;
use super::uapi::*;
use crate::kernel::netlink::frame::{
    NLM_F_ACK, NLM_F_MULTI, NLM_F_REQUEST, NLMSG_ERROR, NetlinkHeader,
};

type Result<T> = std::result::Result<T, IpvsCodecError>;

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
        timeouts: None,
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
        timeouts: None,
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
        timeouts: None,
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

/// `ipvsadm --set 3600 30 120`: kube-proxy's `--ipvs-tcp-timeout 1h
/// --ipvs-tcpfin-timeout 30s --ipvs-udp-timeout 2m`.
#[rustfmt::skip]
const SET_CONFIG: &[u8] = &[
    0x2c, 0x00, 0x00, 0x00, // nlmsg_len 44
    0x23, 0x00,             // nlmsg_type IPVS
    0x05, 0x00,             // NLM_F_REQUEST | NLM_F_ACK
    0x07, 0x00, 0x00, 0x00, // seq 7
    0x00, 0x00, 0x00, 0x00, // pid 0
    0x0c, 0x01, 0x00, 0x00, // cmd IPVS_CMD_SET_CONFIG, version 1
    0x08, 0x00, 0x04, 0x00, // len 8, IPVS_CMD_ATTR_TIMEOUT_TCP
    0x10, 0x0e, 0x00, 0x00, //   3600
    0x08, 0x00, 0x05, 0x00, // len 8, IPVS_CMD_ATTR_TIMEOUT_TCP_FIN
    0x1e, 0x00, 0x00, 0x00, //   30
    0x08, 0x00, 0x06, 0x00, // len 8, IPVS_CMD_ATTR_TIMEOUT_UDP
    0x78, 0x00, 0x00, 0x00, //   120
];

#[test]
fn set_config_sends_all_three_timeouts() -> Result<()> {
    let timeouts = IpvsTimeouts {
        tcp: 3600,
        tcp_fin: 30,
        udp: 120,
    };
    assert_eq!(set_config(FAM, 7, timeouts), SET_CONFIG);
    let msg = single(SET_CONFIG)?;
    assert_eq!(msg.header, request(FAM, NLM_F_REQUEST | NLM_F_ACK, 7));
    let attrs = IpvsAttributes {
        timeouts: Some(timeouts),
        ..IpvsAttributes::default()
    };
    assert_eq!(msg.body, ipvs(IpvsCommand::SetConfig, attrs, false));
    Ok(())
}

#[test]
fn set_config_keeps_zeros_which_the_kernel_ignores() -> Result<()> {
    // Only the TCP timeout given: the other two go as 0, which the kernel leaves alone.
    let only_tcp = IpvsTimeouts {
        tcp: 3600,
        ..IpvsTimeouts::default()
    };
    let bytes = set_config(FAM, 7, only_tcp);
    assert_eq!(bytes.len(), SET_CONFIG.len());
    assert_eq!(&bytes[..28], &SET_CONFIG[..28], "header and TCP attribute");
    #[rustfmt::skip]
    let tail: &[u8] = &[
        0x08, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, // TCP_FIN 0
        0x08, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00, 0x00, // UDP 0
    ];
    assert_eq!(&bytes[28..], tail);
    assert_eq!(
        single(&bytes)?
            .body
            .ipvs_attributes()
            .and_then(|a| a.timeouts),
        Some(only_tcp)
    );
    assert!(IpvsTimeouts::default().is_unset());
    assert!(!only_tcp.is_unset());
    Ok(())
}

#[rustfmt::skip]
const GET_CONFIG: &[u8] = &[
    0x14, 0x00, 0x00, 0x00, // nlmsg_len 20
    0x23, 0x00,             // nlmsg_type IPVS
    0x01, 0x00,             // NLM_F_REQUEST: one reply, no dump, no ack
    0x08, 0x00, 0x00, 0x00, // seq 8
    0x00, 0x00, 0x00, 0x00, // pid 0
    0x0d, 0x01, 0x00, 0x00, // cmd IPVS_CMD_GET_CONFIG, version 1
];

/// The kernel's answer (`ip_vs_genl_get_cmd`): command `IPVS_CMD_SET_CONFIG`, the
/// defaults of a fresh namespace, 900 / 120 / 300 s.
#[rustfmt::skip]
const GET_CONFIG_REPLY: &[u8] = &[
    0x2c, 0x00, 0x00, 0x00, // nlmsg_len 44
    0x23, 0x00,             // nlmsg_type IPVS
    0x00, 0x00,             // flags 0
    0x08, 0x00, 0x00, 0x00, // seq 8
    0x34, 0x12, 0x00, 0x00, // pid 0x1234
    0x0c, 0x01, 0x00, 0x00, // cmd IPVS_CMD_SET_CONFIG, version 1
    0x08, 0x00, 0x04, 0x00, // len 8, IPVS_CMD_ATTR_TIMEOUT_TCP
    0x84, 0x03, 0x00, 0x00, //   900
    0x08, 0x00, 0x05, 0x00, // len 8, IPVS_CMD_ATTR_TIMEOUT_TCP_FIN
    0x78, 0x00, 0x00, 0x00, //   120
    0x08, 0x00, 0x06, 0x00, // len 8, IPVS_CMD_ATTR_TIMEOUT_UDP
    0x2c, 0x01, 0x00, 0x00, //   300
];

#[test]
fn get_config_request_and_reply() -> Result<()> {
    assert_eq!(get_config(FAM, 8), GET_CONFIG);
    let msg = single(GET_CONFIG)?;
    assert_eq!(msg.header, request(FAM, NLM_F_REQUEST, 8));
    assert_eq!(
        msg.body,
        ipvs(IpvsCommand::GetConfig, IpvsAttributes::default(), false)
    );
    let reply = single(GET_CONFIG_REPLY)?;
    assert_eq!(reply.header.port_id, 0x1234);
    let expected = IpvsAttributes {
        timeouts: Some(IpvsTimeouts {
            tcp: 900,
            tcp_fin: 120,
            udp: 300,
        }),
        ..IpvsAttributes::default()
    };
    assert_eq!(reply.body, ipvs(IpvsCommand::SetConfig, expected, false));
    Ok(())
}

#[test]
fn short_timeout_attribute_is_an_error() {
    let mut bytes = GET_CONFIG_REPLY.to_vec();
    // TIMEOUT_TCP claims 6 bytes: 2 bytes of value where a u32 belongs.
    bytes[20] = 0x06;
    assert!(decode(&bytes, FAM).is_err());
}
