//! Annotated byte vectors (x86-64 / little-endian byte order). Requests are encoded from
//! typed operations, checked byte for byte and read back; the listings are the real
//! kernel's (Linux 6.18, captured with `strace -e read=3 ipset save`), decoded and
//! re-encoded byte for byte.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::*;
use crate::kernel::netlink::frame::{NLM_F_MULTI, align4, put_string};

type Result<T> = std::result::Result<T, IpsetCodecError>;

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
