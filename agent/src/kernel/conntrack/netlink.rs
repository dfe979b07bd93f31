//! UDP conntrack entries over ctnetlink, our own codec: list them and delete stale ones
//! without starting a `conntrack` process (one costs more than a whole endpoint change).
//! Both modes use it through [`crate::kernel::command::CommandRunner`].
//!
//! Wire format (native byte order unless marked big-endian):
//!
//! ```text
//! nlmsghdr  u32 len | u16 type (NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_*) | u16 flags | u32 seq | u32 pid
//! nfgenmsg  u8 family (AF_INET / AF_INET6) | u8 version (NFNETLINK_V0) | be16 res_id (0)
//! CTA_TUPLE_ORIG (nested), CTA_TUPLE_REPLY (nested), each:
//!   CTA_TUPLE_IP (nested): CTA_IP_V4_SRC / CTA_IP_V4_DST (4 bytes, big-endian)
//!                          or CTA_IP_V6_SRC / CTA_IP_V6_DST (16 bytes)
//!   CTA_TUPLE_PROTO (nested): CTA_PROTO_NUM (u8), CTA_PROTO_SRC_PORT / CTA_PROTO_DST_PORT (be16)
//! ```
//!
//! A listing is one `IPCTNL_MSG_CT_GET` dump of the family (UDP entries kept); a deletion
//! is one `IPCTNL_MSG_CT_DELETE` per entry, naming its original tuple, acked, `ENOENT`
//! when the entry is already gone.

use std::io;
use std::net::IpAddr;

use netlink_sys::protocols::NETLINK_NETFILTER;

use super::flows::{Flow, StaleFlows};
use crate::kernel::family::Family;
use crate::kernel::netlink::frame::{
    self, NLA_F_NESTED, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkFormatError, NetlinkHeader,
    attributes,
};
use crate::kernel::netlink::socket::NetlinkSocket;

/// `NFNL_SUBSYS_CTNETLINK`: the high byte of every conntrack message type.
pub const NFNL_SUBSYS_CTNETLINK: u8 = 1;
/// `IPCTNL_MSG_CT_GET`: get one entry, or with `NLM_F_DUMP` list them.
pub const IPCTNL_MSG_CT_GET: u8 = 1;
/// `IPCTNL_MSG_CT_DELETE`: delete the entry with the given tuple.
pub const IPCTNL_MSG_CT_DELETE: u8 = 2;
/// `AF_INET`.
pub const AF_INET: u8 = 2;
/// `AF_INET6`.
pub const AF_INET6: u8 = 10;
/// `IPPROTO_UDP`.
pub const IPPROTO_UDP: u8 = 17;
/// `ENOENT`: no such entry (already gone).
const ENOENT: i32 = 2;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
/// `sizeof(struct nfgenmsg)`.
const NFGENMSG_LEN: usize = 4;

/// One direction of a connection: addresses, protocol and ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// `IPPROTO_*`.
    pub protocol: u8,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
}

fn family_byte(family: Family) -> u8 {
    match family {
        Family::V4 => AF_INET,
        Family::V6 => AF_INET6,
    }
}

fn start(command: u8, flags: u16, family: u8) -> Vec<u8> {
    let mut buf = frame::start_message(&NetlinkHeader {
        message_type: (u16::from(NFNL_SUBSYS_CTNETLINK) << 8) | u16::from(command),
        flags,
        seq: 0,
        port_id: 0,
    });
    buf.extend_from_slice(&[family, 0, 0, 0]);
    buf
}

/// The dump request for every entry of `family`.
#[must_use]
pub fn list_request(family: Family) -> Vec<u8> {
    frame::finish_message(start(
        IPCTNL_MSG_CT_GET,
        NLM_F_REQUEST | NLM_F_DUMP,
        family_byte(family),
    ))
}

fn put_tuple(buf: &mut Vec<u8>, kind: u16, tuple: &Tuple) {
    frame::put_nest(buf, kind | NLA_F_NESTED, |buf| {
        frame::put_nest(buf, CTA_TUPLE_IP | NLA_F_NESTED, |buf| {
            match (tuple.src, tuple.dst) {
                (IpAddr::V4(src), IpAddr::V4(dst)) => {
                    frame::put_attr(buf, CTA_IP_V4_SRC, &src.octets());
                    frame::put_attr(buf, CTA_IP_V4_DST, &dst.octets());
                }
                (src, dst) => {
                    frame::put_attr(buf, CTA_IP_V6_SRC, &v6_octets(src));
                    frame::put_attr(buf, CTA_IP_V6_DST, &v6_octets(dst));
                }
            }
        });
        frame::put_nest(buf, CTA_TUPLE_PROTO | NLA_F_NESTED, |buf| {
            frame::put_u8(buf, CTA_PROTO_NUM, tuple.protocol);
            frame::put_attr(buf, CTA_PROTO_SRC_PORT, &tuple.sport.to_be_bytes());
            frame::put_attr(buf, CTA_PROTO_DST_PORT, &tuple.dport.to_be_bytes());
        });
    });
}

fn v6_octets(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The request that deletes the entry whose original direction is `orig`, acked.
#[must_use]
pub fn delete_request(orig: &Tuple) -> Vec<u8> {
    let family = if orig.src.is_ipv4() {
        AF_INET
    } else {
        AF_INET6
    };
    let mut buf = start(IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, family);
    put_tuple(&mut buf, CTA_TUPLE_ORIG, orig);
    frame::finish_message(buf)
}

fn decode_tuple(value: &[u8]) -> Result<Option<Tuple>, NetlinkFormatError> {
    let (mut src, mut dst, mut protocol, mut sport, mut dport) = (None, None, None, None, None);
    for nla in attributes(value) {
        let nla = nla?;
        match nla.kind {
            CTA_TUPLE_IP => {
                for ip in attributes(nla.value) {
                    let ip = ip?;
                    match ip.kind {
                        CTA_IP_V4_SRC => src = Some(IpAddr::from(ip.fixed::<4>()?)),
                        CTA_IP_V4_DST => dst = Some(IpAddr::from(ip.fixed::<4>()?)),
                        CTA_IP_V6_SRC => src = Some(IpAddr::from(ip.fixed::<16>()?)),
                        CTA_IP_V6_DST => dst = Some(IpAddr::from(ip.fixed::<16>()?)),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for p in attributes(nla.value) {
                    let p = p?;
                    match p.kind {
                        CTA_PROTO_NUM => protocol = Some(p.get_u8()?),
                        CTA_PROTO_SRC_PORT => sport = Some(p.get_be16()?),
                        CTA_PROTO_DST_PORT => dport = Some(p.get_be16()?),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(match (src, dst, protocol) {
        (Some(src), Some(dst), Some(protocol)) => Some(Tuple {
            src,
            dst,
            protocol,
            sport: sport.unwrap_or(0),
            dport: dport.unwrap_or(0),
        }),
        _ => None,
    })
}

/// The original and reply tuples of one entry of a listing (`None` for parts missing).
///
/// # Errors
/// A malformed message.
pub fn decode_entry(message: &[u8]) -> Result<(Option<Tuple>, Option<Tuple>), NetlinkFormatError> {
    let body =
        message
            .get(frame::NLMSG_HDRLEN + NFGENMSG_LEN..)
            .ok_or(NetlinkFormatError::Truncated {
                what: "nlmsghdr + nfgenmsg",
                needed: frame::NLMSG_HDRLEN + NFGENMSG_LEN,
                available: message.len(),
            })?;
    let (mut orig, mut reply) = (None, None);
    for nla in attributes(body) {
        let nla = nla?;
        match nla.kind {
            CTA_TUPLE_ORIG => orig = decode_tuple(nla.value)?,
            CTA_TUPLE_REPLY => reply = decode_tuple(nla.value)?,
            _ => {}
        }
    }
    Ok((orig, reply))
}

/// The UDP entries of a listing as flows.
///
/// # Errors
/// A malformed message.
pub fn decode_udp_flows(listing: &[u8]) -> Result<Vec<Flow>, NetlinkFormatError> {
    let mut flows = Vec::new();
    for message in frame::messages(listing) {
        let message = message?;
        let (Some(orig), Some(reply)) = decode_entry(message.bytes)? else {
            continue;
        };
        if orig.protocol != IPPROTO_UDP {
            continue;
        }
        flows.push(Flow {
            orig_src: orig.src,
            orig_dst: orig.dst,
            sport: orig.sport,
            dport: orig.dport,
            reply_src: reply.src,
            reply_sport: reply.sport,
        });
    }
    Ok(flows)
}

/// The original tuple of a flow.
#[must_use]
pub fn orig_tuple(flow: &Flow) -> Tuple {
    Tuple {
        src: flow.orig_src,
        dst: flow.orig_dst,
        protocol: IPPROTO_UDP,
        sport: flow.sport,
        dport: flow.dport,
    }
}

/// A ctnetlink socket.
#[derive(Debug)]
pub struct ConntrackNetlink {
    socket: NetlinkSocket,
}

fn invalid_data(error: NetlinkFormatError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

impl ConntrackNetlink {
    /// Opens a socket in the calling thread's network namespace.
    ///
    /// # Errors
    /// When the socket cannot be opened or bound.
    pub fn open() -> io::Result<Self> {
        Ok(Self {
            socket: NetlinkSocket::open(NETLINK_NETFILTER)?,
        })
    }

    /// Every UDP entry of `family`.
    ///
    /// # Errors
    /// When the socket fails, the kernel refuses the dump, or a reply is malformed.
    pub fn list_udp(&mut self, family: Family) -> io::Result<Vec<Flow>> {
        let listing = self.socket.dump(list_request(family))?;
        decode_udp_flows(&listing).map_err(invalid_data)
    }

    /// Deletes the entries `flows` names and returns how many the kernel had: an exact
    /// flow directly, the others after a listing of the family to find them.
    ///
    /// # Errors
    /// When the socket fails or the kernel refuses a deletion other than for an entry
    /// already gone.
    pub fn delete(&mut self, flows: &StaleFlows) -> io::Result<usize> {
        let targets: Vec<Tuple> = match flows {
            StaleFlows::Exact(flow) => vec![orig_tuple(flow)],
            _ => self
                .list_udp(flows.family())?
                .iter()
                .filter(|flow| flows.matches(flow))
                .map(orig_tuple)
                .collect(),
        };
        if targets.is_empty() {
            return Ok(0);
        }
        let results = self.socket.transact(targets.iter().map(delete_request))?;
        let mut deleted = 0;
        for errno in results {
            match errno.abs() {
                0 => deleted += 1,
                ENOENT => {}
                other => return Err(io::Error::from_raw_os_error(other)),
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn v4(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[rustfmt::skip]
    #[test]
    fn list_request_bytes() {
        let expected: Vec<u8> = [
            &20u32.to_ne_bytes()[..],          // nlmsg_len
            &0x0101u16.to_ne_bytes(),          // NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_GET
            &0x0301u16.to_ne_bytes(),          // NLM_F_REQUEST | NLM_F_DUMP
            &0u32.to_ne_bytes(),               // seq (set when sent)
            &0u32.to_ne_bytes(),               // pid
            &[0x02, 0x00, 0x00, 0x00],         // nfgenmsg: AF_INET, NFNETLINK_V0, res_id 0
        ].concat();
        assert_eq!(list_request(Family::V4), expected);
        assert_eq!(list_request(Family::V6)[16], AF_INET6);
    }

    #[rustfmt::skip]
    #[test]
    fn delete_request_bytes() {
        let tuple = Tuple {
            src: v4("10.244.1.5"),
            dst: v4("10.96.0.10"),
            protocol: IPPROTO_UDP,
            sport: 40000,
            dport: 53,
        };
        let expected: Vec<u8> = [
            &72u32.to_ne_bytes()[..],          // nlmsg_len: 16 + 4 + 52
            &0x0102u16.to_ne_bytes(),          // NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_DELETE
            &0x0005u16.to_ne_bytes(),          // NLM_F_REQUEST | NLM_F_ACK
            &0u32.to_ne_bytes(),               // seq
            &0u32.to_ne_bytes(),               // pid
            &[0x02, 0x00, 0x00, 0x00],         // nfgenmsg: AF_INET
            &52u16.to_ne_bytes(),              // CTA_TUPLE_ORIG: 4 + 20 + 28
            &0x8001u16.to_ne_bytes(),          //   type 1 | NLA_F_NESTED
            &20u16.to_ne_bytes(),              //   CTA_TUPLE_IP: 4 + 8 + 8
            &0x8001u16.to_ne_bytes(),          //     type 1 | NLA_F_NESTED
            &8u16.to_ne_bytes(),               //     CTA_IP_V4_SRC
            &1u16.to_ne_bytes(),
            &[10, 244, 1, 5],                  //       10.244.1.5
            &8u16.to_ne_bytes(),               //     CTA_IP_V4_DST
            &2u16.to_ne_bytes(),
            &[10, 96, 0, 10],                  //       10.96.0.10
            &28u16.to_ne_bytes(),              //   CTA_TUPLE_PROTO: 4 + 8 + 8 + 8
            &0x8002u16.to_ne_bytes(),          //     type 2 | NLA_F_NESTED
            &5u16.to_ne_bytes(),               //     CTA_PROTO_NUM
            &1u16.to_ne_bytes(),
            &[17, 0, 0, 0],                    //       UDP, 3 bytes padding
            &6u16.to_ne_bytes(),               //     CTA_PROTO_SRC_PORT
            &2u16.to_ne_bytes(),
            &[0x9c, 0x40, 0, 0],               //       40000 big-endian, padding
            &6u16.to_ne_bytes(),               //     CTA_PROTO_DST_PORT
            &3u16.to_ne_bytes(),
            &[0x00, 0x35, 0, 0],               //       53 big-endian, padding
        ].concat();
        let request = delete_request(&tuple);
        assert_eq!(request, expected);
        // Read back: the same tuple.
        let (orig, reply) = decode_entry(&request).unwrap();
        assert_eq!(orig, Some(tuple));
        assert_eq!(reply, None);
    }

    #[test]
    fn ipv6_tuples_round_trip() {
        let tuple = Tuple {
            src: "fd00::5".parse().unwrap(),
            dst: "fd00:96::a".parse().unwrap(),
            protocol: IPPROTO_UDP,
            sport: 1,
            dport: 65535,
        };
        let request = delete_request(&tuple);
        assert_eq!(request[16], AF_INET6);
        assert_eq!(decode_entry(&request).unwrap().0, Some(tuple));
    }

    /// A listing as the kernel sends it: an entry with both tuples and attributes we do
    /// not read (status, timeout), a TCP entry that is skipped, and `NLMSG_DONE`.
    #[test]
    fn listings_decode_to_udp_flows() {
        let entry = |protocol: u8, sport: u16| {
            let orig = Tuple {
                src: v4("10.244.1.5"),
                dst: v4("10.96.0.10"),
                protocol,
                sport,
                dport: 53,
            };
            let reply = Tuple {
                src: v4("10.244.2.7"),
                dst: v4("10.244.1.5"),
                protocol,
                sport: 5353,
                dport: sport,
            };
            let mut buf = start(IPCTNL_MSG_CT_GET, 0x2, AF_INET);
            put_tuple(&mut buf, CTA_TUPLE_ORIG, &orig);
            put_tuple(&mut buf, CTA_TUPLE_REPLY, &reply);
            frame::put_attr(&mut buf, 3, &0x188u32.to_be_bytes()); // CTA_STATUS
            frame::put_attr(&mut buf, 7, &30u32.to_be_bytes()); // CTA_TIMEOUT
            frame::finish_message(buf)
        };
        let mut listing = entry(IPPROTO_UDP, 40000);
        listing.extend(entry(6, 40001));
        let flows = decode_udp_flows(&listing).unwrap();
        assert_eq!(
            flows,
            [Flow {
                orig_src: v4("10.244.1.5"),
                orig_dst: v4("10.96.0.10"),
                sport: 40000,
                dport: 53,
                reply_src: v4("10.244.2.7"),
                reply_sport: 5353,
            }]
        );
        // A truncated listing is an error, not a shorter list.
        let cut = &listing[..listing.len() - 6];
        assert!(decode_udp_flows(cut).is_err());
    }
}
