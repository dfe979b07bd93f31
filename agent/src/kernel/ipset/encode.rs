//! ipset requests (and, for fakes and the round-trip tests, listings) to bytes.

use std::net::IpAddr;

use super::message::{EntryAttributes, IpsetCodecError, ListMessage, SetHeaderData, SetOp};
use super::sets::SetEntry;
use super::uapi::*;
use crate::kernel::netlink::frame::{
    self, NLA_F_NESTED, NLA_F_NET_BYTEORDER, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REQUEST, NetlinkHeader, put_attr, put_nest, put_net16, put_net32, put_string, put_u8,
};

type Result<T> = std::result::Result<T, IpsetCodecError>;

/// `sizeof(struct nfgenmsg)`.
pub const NFGEN_HDRLEN: usize = 4;

/// The `nlmsg_type` of ipset command `command`.
#[must_use]
pub const fn message_type(command: u8) -> u16 {
    ((NFNL_SUBSYS_IPSET as u16) << 8) | command as u16
}

/// Whether addresses carry `NLA_F_NET_BYTEORDER`: requests must, listings do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AddressFlag {
    NetOrder,
    Plain,
}

fn put_address(buf: &mut Vec<u8>, kind: u16, addr: IpAddr, flag: AddressFlag) {
    let flag = match flag {
        AddressFlag::NetOrder => NLA_F_NET_BYTEORDER,
        AddressFlag::Plain => 0,
    };
    put_nest(buf, kind | NLA_F_NESTED, |b| match addr {
        IpAddr::V4(a) => put_attr(b, IPSET_ATTR_IPADDR_IPV4 | flag, &a.octets()),
        IpAddr::V6(a) => put_attr(b, IPSET_ATTR_IPADDR_IPV6 | flag, &a.octets()),
    });
}

/// An entry's attributes in the order the kernel lists them (its requests accept any).
fn put_entry(buf: &mut Vec<u8>, entry: &EntryAttributes, flag: AddressFlag) {
    put_nest(buf, IPSET_ATTR_DATA | NLA_F_NESTED, |b| {
        if let Some(ip) = entry.ip {
            put_address(b, IPSET_ATTR_IP, ip, flag);
        }
        if let Some(ip2) = entry.ip2 {
            put_address(b, IPSET_ATTR_IP2, ip2, flag);
        }
        if let Some(port) = entry.port {
            put_net16(b, IPSET_ATTR_PORT, port);
        }
        if let Some(cidr) = entry.cidr2 {
            put_u8(b, IPSET_ATTR_CIDR2, cidr);
        }
        if let Some(protocol) = entry.protocol {
            put_u8(b, IPSET_ATTR_PROTO, protocol);
        }
    });
}

fn put_header_data(buf: &mut Vec<u8>, data: &SetHeaderData) {
    put_nest(buf, IPSET_ATTR_DATA | NLA_F_NESTED, |b| {
        if let Some(v) = data.port_from {
            put_net16(b, IPSET_ATTR_PORT, v);
        }
        if let Some(v) = data.port_to {
            put_net16(b, IPSET_ATTR_PORT_TO, v);
        }
        if let Some(v) = data.hash_size {
            put_net32(b, IPSET_ATTR_HASHSIZE, v);
        }
        if let Some(v) = data.max_elements {
            put_net32(b, IPSET_ATTR_MAXELEM, v);
        }
        if let Some(v) = data.bucket_size {
            put_u8(b, IPSET_ATTR_BUCKETSIZE, v);
        }
        if let Some(v) = data.initval {
            put_net32(b, IPSET_ATTR_INITVAL, v);
        }
        if let Some(v) = data.references {
            put_net32(b, IPSET_ATTR_REFERENCES, v);
        }
        if let Some(v) = data.memory_size {
            put_net32(b, IPSET_ATTR_MEMSIZE, v);
        }
        if let Some(v) = data.elements {
            put_net32(b, IPSET_ATTR_ELEMENTS, v);
        }
    });
}

/// `nlmsghdr` and `nfgenmsg` of a message of `command`, its length filled in by
/// [`frame::finish_message`], followed by `IPSET_ATTR_PROTOCOL`.
fn start(command: u8, flags: u16, seq: u32, port_id: u32, protocol: u8) -> Vec<u8> {
    let mut buf = frame::start_message(&NetlinkHeader {
        message_type: message_type(command),
        flags,
        seq,
        port_id,
    });
    buf.extend_from_slice(&[NFPROTO_IPV4, NFNETLINK_V0, 0, 0]);
    put_u8(&mut buf, IPSET_ATTR_PROTOCOL, protocol);
    buf
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() >= IPSET_MAXNAMELEN || name.contains('\0') {
        return Err(IpsetCodecError::BadName(name.to_owned()));
    }
    Ok(())
}

fn check_entry(entry: SetEntry) -> Result<()> {
    match entry {
        SetEntry::IpPortIp(ip, _, _, ip2) if ip.is_ipv4() != ip2.is_ipv4() => {
            Err(IpsetCodecError::MixedFamilies(entry))
        }
        SetEntry::IpPortNet(ip, _, _, net, _) if ip.is_ipv4() != net.is_ipv4() => {
            Err(IpsetCodecError::MixedFamilies(entry))
        }
        SetEntry::IpPortNet(_, _, _, net, prefix)
            if prefix > if net.is_ipv4() { 32 } else { 128 } =>
        {
            Err(IpsetCodecError::BadPrefix(entry))
        }
        _ => Ok(()),
    }
}

/// The `nlmsg_flags` of `op`: an ack for every request, `NLM_F_CREATE` for Create and
/// `NLM_F_EXCL` only for Del (see the module docs).
#[must_use]
pub fn request_flags(op: &SetOp<'_>) -> u16 {
    match op {
        SetOp::Create { .. } => NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE,
        SetOp::Del(..) => NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL,
        SetOp::Destroy(_) | SetOp::Add(..) => NLM_F_REQUEST | NLM_F_ACK,
    }
}

/// Encodes `op` as one complete request.
///
/// # Errors
/// A bad set name, or an entry mixing families or with a prefix longer than its address.
pub fn encode_op(op: &SetOp<'_>, seq: u32) -> Result<Vec<u8>> {
    let flags = request_flags(op);
    let buf = match *op {
        SetOp::Create { name, spec } => {
            check_name(name)?;
            let mut buf = start(IPSET_CMD_CREATE, flags, seq, 0, IPSET_PROTOCOL);
            put_string(&mut buf, IPSET_ATTR_SETNAME, name);
            put_string(&mut buf, IPSET_ATTR_TYPENAME, spec.kind.as_str());
            put_u8(&mut buf, IPSET_ATTR_REVISION, type_revision(spec.kind));
            put_u8(&mut buf, IPSET_ATTR_FAMILY, spec_family(spec));
            put_header_data(&mut buf, &SetHeaderData::create_options(spec));
            buf
        }
        SetOp::Destroy(name) => {
            check_name(name)?;
            let mut buf = start(IPSET_CMD_DESTROY, flags, seq, 0, IPSET_PROTOCOL);
            put_string(&mut buf, IPSET_ATTR_SETNAME, name);
            buf
        }
        SetOp::Add(name, entry) | SetOp::Del(name, entry) => {
            check_name(name)?;
            check_entry(entry)?;
            let command = if matches!(op, SetOp::Add(..)) {
                IPSET_CMD_ADD
            } else {
                IPSET_CMD_DEL
            };
            let mut buf = start(command, flags, seq, 0, IPSET_PROTOCOL);
            put_string(&mut buf, IPSET_ATTR_SETNAME, name);
            put_entry(&mut buf, &EntryAttributes::of(entry), AddressFlag::NetOrder);
            buf
        }
    };
    Ok(frame::finish_message(buf))
}

/// `IPSET_CMD_LIST` dump of every set's name (`IPSET_FLAG_LIST_SETNAME`).
#[must_use]
pub fn list_names_request(seq: u32) -> Vec<u8> {
    let mut buf = start(
        IPSET_CMD_LIST,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        0,
        IPSET_PROTOCOL,
    );
    put_net32(&mut buf, IPSET_ATTR_FLAGS, IPSET_FLAG_LIST_SETNAME);
    frame::finish_message(buf)
}

/// `IPSET_CMD_LIST` dump of the set `name`: its header and every entry.
///
/// # Errors
/// A bad set name.
pub fn list_set_request(name: &str, seq: u32) -> Result<Vec<u8>> {
    check_name(name)?;
    let mut buf = start(
        IPSET_CMD_LIST,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        0,
        IPSET_PROTOCOL,
    );
    put_string(&mut buf, IPSET_ATTR_SETNAME, name);
    Ok(frame::finish_message(buf))
}

/// Encodes a listing message as the kernel does (attribute order, unflagged addresses):
/// what a fake kernel answers, and the other half of the round-trip tests.
#[must_use]
pub fn encode_list_message(msg: &ListMessage) -> Vec<u8> {
    let mut buf = start(
        IPSET_CMD_LIST,
        msg.flags,
        msg.seq,
        msg.port_id,
        msg.protocol,
    );
    put_string(&mut buf, IPSET_ATTR_SETNAME, &msg.name);
    if let Some(header) = &msg.header {
        put_string(&mut buf, IPSET_ATTR_TYPENAME, &header.type_name);
        put_u8(&mut buf, IPSET_ATTR_FAMILY, header.family);
        put_u8(&mut buf, IPSET_ATTR_REVISION, header.revision);
        if let Some(index) = header.index {
            put_net16(&mut buf, IPSET_ATTR_INDEX, index);
        }
        put_header_data(&mut buf, &header.data);
    }
    if let Some(entries) = &msg.entries {
        put_nest(&mut buf, IPSET_ATTR_ADT | NLA_F_NESTED, |b| {
            for entry in entries {
                put_entry(b, entry, AddressFlag::Plain);
            }
        });
    }
    frame::finish_message(buf)
}
