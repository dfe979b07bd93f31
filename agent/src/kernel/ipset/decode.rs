//! ipset listings (and, for fakes and tests, our own requests) from bytes to typed
//! values, and listings merged into [`Sets`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::encode::{NFGEN_HDRLEN, message_type};
use super::message::{
    EntryAttributes, IpsetCodecError, ListMessage, SetHeader, SetHeaderData, SetRequest,
};
use super::sets::{IpSet, SetEntry, SetSpec, Sets, is_owned};
use super::uapi::*;
use crate::kernel::netlink::frame::{
    self, Attribute, NLMSG_HDRLEN, NetlinkFormatError, NetlinkHeader, attributes,
};

type Result<T> = std::result::Result<T, IpsetCodecError>;

/// An address nest's `IPSET_ATTR_IPADDR_IPV4` or `IPSET_ATTR_IPADDR_IPV6`. Integers
/// are read big-endian throughout: the kernel flags them all `NLA_F_NET_BYTEORDER`.
fn get_address(nla: &Attribute<'_>) -> Result<IpAddr> {
    for inner in attributes(nla.value) {
        let inner = inner?;
        match inner.kind {
            IPSET_ATTR_IPADDR_IPV4 => return Ok(IpAddr::V4(Ipv4Addr::from(inner.fixed()?))),
            IPSET_ATTR_IPADDR_IPV6 => return Ok(IpAddr::V6(Ipv6Addr::from(inner.fixed()?))),
            _ => {}
        }
    }
    Err(IpsetCodecError::MissingAttribute(
        "IPSET_ATTR_IPADDR_IPV4/IPV6",
    ))
}

/// An entry's `IPSET_ATTR_DATA`; attributes other than ours (timeouts, counters,
/// comments, flags) are skipped.
fn decode_entry(value: &[u8]) -> Result<EntryAttributes> {
    let mut entry = EntryAttributes::default();
    for nla in attributes(value) {
        let nla = nla?;
        match nla.kind {
            IPSET_ATTR_IP => entry.ip = Some(get_address(&nla)?),
            IPSET_ATTR_IP2 => entry.ip2 = Some(get_address(&nla)?),
            IPSET_ATTR_PORT => entry.port = Some(nla.get_be16()?),
            IPSET_ATTR_CIDR2 => entry.cidr2 = Some(nla.get_u8()?),
            IPSET_ATTR_PROTO => entry.protocol = Some(nla.get_u8()?),
            _ => {}
        }
    }
    Ok(entry)
}

fn decode_header_data(value: &[u8]) -> Result<SetHeaderData> {
    let mut data = SetHeaderData::default();
    for nla in attributes(value) {
        let nla = nla?;
        match nla.kind {
            IPSET_ATTR_PORT => data.port_from = Some(nla.get_be16()?),
            IPSET_ATTR_PORT_TO => data.port_to = Some(nla.get_be16()?),
            IPSET_ATTR_HASHSIZE => data.hash_size = Some(nla.get_be32()?),
            IPSET_ATTR_MAXELEM => data.max_elements = Some(nla.get_be32()?),
            IPSET_ATTR_BUCKETSIZE => data.bucket_size = Some(nla.get_u8()?),
            IPSET_ATTR_INITVAL => data.initval = Some(nla.get_be32()?),
            IPSET_ATTR_REFERENCES => data.references = Some(nla.get_be32()?),
            IPSET_ATTR_MEMSIZE => data.memory_size = Some(nla.get_be32()?),
            IPSET_ATTR_ELEMENTS => data.elements = Some(nla.get_be32()?),
            _ => {}
        }
    }
    Ok(data)
}

/// The header fields and attribute bytes of one message.
struct Raw<'a> {
    header: NetlinkHeader,
    attributes: &'a [u8],
}

fn split_message(bytes: &[u8]) -> Result<Raw<'_>> {
    const HEADERS: usize = NLMSG_HDRLEN + NFGEN_HDRLEN;
    if bytes.len() < HEADERS {
        return Err(NetlinkFormatError::Truncated {
            what: "nlmsghdr + nfgenmsg",
            needed: HEADERS,
            available: bytes.len(),
        }
        .into());
    }
    let message = frame::message_at(bytes, 0)?;
    let Some(attributes) = message.bytes.get(HEADERS..) else {
        return Err(NetlinkFormatError::BadLength {
            offset: 0,
            length: message.bytes.len(),
            available: bytes.len(),
        }
        .into());
    };
    Ok(Raw {
        header: message.header,
        attributes,
    })
}

/// Decodes one `IPSET_CMD_LIST` reply message (`bytes` starts at its `nlmsghdr`).
///
/// # Errors
/// Malformed bytes, another message type, or a message without a set name.
pub fn decode_list_message(bytes: &[u8]) -> Result<ListMessage> {
    let raw = split_message(bytes)?;
    if raw.header.message_type != message_type(IPSET_CMD_LIST) {
        return Err(IpsetCodecError::UnexpectedMessage(raw.header.message_type));
    }
    let mut protocol = None;
    let mut name = None;
    let mut type_name = None;
    let mut family = None;
    let mut revision = None;
    let mut index = None;
    let mut data = None;
    let mut entries = None;
    for nla in attributes(raw.attributes) {
        let nla = nla?;
        match nla.kind {
            IPSET_ATTR_PROTOCOL => protocol = Some(nla.get_u8()?),
            IPSET_ATTR_SETNAME => name = Some(nla.get_string()?),
            IPSET_ATTR_TYPENAME => type_name = Some(nla.get_string()?),
            IPSET_ATTR_FAMILY => family = Some(nla.get_u8()?),
            IPSET_ATTR_REVISION => revision = Some(nla.get_u8()?),
            IPSET_ATTR_INDEX => index = Some(nla.get_be16()?),
            IPSET_ATTR_DATA => data = Some(decode_header_data(nla.value)?),
            IPSET_ATTR_ADT => {
                let mut list = Vec::new();
                for inner in attributes(nla.value) {
                    let inner = inner?;
                    if inner.kind == IPSET_ATTR_DATA {
                        list.push(decode_entry(inner.value)?);
                    }
                }
                entries = Some(list);
            }
            _ => {}
        }
    }
    let missing = IpsetCodecError::MissingAttribute;
    let header = match type_name {
        Some(type_name) => Some(SetHeader {
            type_name,
            family: family.ok_or(missing("IPSET_ATTR_FAMILY"))?,
            revision: revision.ok_or(missing("IPSET_ATTR_REVISION"))?,
            index,
            data: data.unwrap_or_default(),
        }),
        None => None,
    };
    Ok(ListMessage {
        flags: raw.header.flags,
        seq: raw.header.seq,
        port_id: raw.header.port_id,
        protocol: protocol.ok_or(missing("IPSET_ATTR_PROTOCOL"))?,
        name: name.ok_or(missing("IPSET_ATTR_SETNAME"))?,
        header,
        entries,
    })
}

/// Decodes every listing message of a dump's bytes (as [`crate::kernel::netlink::socket::NetlinkSocket::dump`] returns
/// them: back to back, 4-aligned, without `NLMSG_DONE`).
///
/// # Errors
/// As [`decode_list_message`].
pub fn decode_list(buf: &[u8]) -> Result<Vec<ListMessage>> {
    each_message(buf)?
        .into_iter()
        .map(decode_list_message)
        .collect()
}

/// The messages of `buf`, each from its `nlmsghdr` to its length; a bad length is an
/// error (unlike [`super::netlink::messages`], which stops there).
pub(crate) fn each_message(buf: &[u8]) -> Result<Vec<&[u8]>> {
    frame::messages(buf)
        .map(|message| Ok(message?.bytes))
        .collect()
}

/// Reads a request we encode back into the operation (for fakes and tests).
///
/// # Errors
/// Malformed bytes, a command we do not send, or a missing attribute.
pub fn decode_request(bytes: &[u8]) -> Result<SetRequest> {
    let raw = split_message(bytes)?;
    let mut name = None;
    let mut type_name = None;
    let mut family = None;
    let mut data = None;
    for nla in attributes(raw.attributes) {
        let nla = nla?;
        match nla.kind {
            IPSET_ATTR_SETNAME => name = Some(nla.get_string()?),
            IPSET_ATTR_TYPENAME => type_name = Some(nla.get_string()?),
            IPSET_ATTR_FAMILY => family = Some(nla.get_u8()?),
            IPSET_ATTR_DATA => data = Some(nla.value),
            _ => {}
        }
    }
    let missing = IpsetCodecError::MissingAttribute;
    let name = name.ok_or(missing("IPSET_ATTR_SETNAME"))?;
    let entry = || -> Result<SetEntry> {
        let data = data.ok_or(missing("IPSET_ATTR_DATA"))?;
        decode_entry(data)?
            .infer()
            .ok_or(IpsetCodecError::UnknownRequest("entry"))
    };
    if raw.header.message_type >> 8 != u16::from(NFNL_SUBSYS_IPSET) {
        return Err(IpsetCodecError::UnexpectedMessage(raw.header.message_type));
    }
    let command = (raw.header.message_type & 0xff) as u8;
    Ok(match command {
        IPSET_CMD_CREATE => {
            let type_name = type_name.ok_or(missing("IPSET_ATTR_TYPENAME"))?;
            let kind = set_type(&type_name).ok_or(IpsetCodecError::UnknownRequest("type"))?;
            let family = family.ok_or(missing("IPSET_ATTR_FAMILY"))?;
            SetRequest::Create {
                name,
                spec: SetSpec {
                    kind,
                    ipv6: family == NFPROTO_IPV6,
                },
            }
        }
        IPSET_CMD_DESTROY => SetRequest::Destroy(name),
        IPSET_CMD_ADD => SetRequest::Add(name, entry()?),
        IPSET_CMD_DEL => SetRequest::Del(name, entry()?),
        _ => return Err(IpsetCodecError::UnexpectedMessage(raw.header.message_type)),
    })
}

/// Adds one listing message to `sets`: the first message of an owned set of a type of
/// ours starts it, every message adds its entries. Sets we do not own are skipped; owned
/// sets of other types too, as [`super::sets::parse_save`] skips them.
pub fn merge_listing(sets: &mut Sets, msg: &ListMessage) {
    if !is_owned(&msg.name) {
        return;
    }
    if let Some(header) = &msg.header {
        match set_type(&header.type_name) {
            Some(kind) => {
                let ipv6 = header.family == NFPROTO_IPV6;
                sets.insert(msg.name.clone(), IpSet::new(kind, ipv6));
            }
            None => {
                sets.remove(&msg.name);
                return;
            }
        }
    }
    let Some(set) = sets.get_mut(&msg.name) else {
        return;
    };
    let kind = set.spec.kind;
    for attributes in msg.entries.iter().flatten() {
        if let Some(entry) = attributes.entry(kind) {
            set.entries.insert(entry);
        }
    }
}
