//! Netlink framing shared by our codecs (IPVS over generic netlink, ipset and conntrack
//! over nfnetlink): the `nlmsghdr` that starts every message, the walk over the messages
//! of a buffer, and the `nlattr`s that follow the family's own header. Names follow
//! `include/uapi/linux/netlink.h`.
//!
//! ```text
//! nlmsghdr  u32 len | u16 type | u16 flags | u32 seq | u32 pid             (16 bytes)
//!           the family's header: genlmsghdr or nfgenmsg (4 bytes, read by each codec)
//! nlattr*   u16 len | u16 type (| NLA_F_NESTED | NLA_F_NET_BYTEORDER) | value | pad to 4
//! ```
//!
//! Native byte order unless noted. Lengths exclude the padding; the next message or
//! attribute starts at the 4-aligned offset (`NLMSG_ALIGN`, `NLA_ALIGN`). Every read
//! checks its lengths and answers [`NetlinkFormatError`], which each codec's error wraps;
//! which attributes a message needs and what their values mean is the codecs' business.

// ---- netlink.h -------------------------------------------------------------------------

/// `NLMSG_NOOP`: nothing.
pub const NLMSG_NOOP: u16 = 1;
/// `NLMSG_ERROR`: error (or ack when the errno is 0).
pub const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`: end of a multipart (dump) reply.
pub const NLMSG_DONE: u16 = 3;
/// `NLMSG_OVERRUN`: data lost.
pub const NLMSG_OVERRUN: u16 = 4;
/// `NLM_F_REQUEST`: it is a request message.
pub const NLM_F_REQUEST: u16 = 0x1;
/// `NLM_F_MULTI`: multipart message, terminated by `NLMSG_DONE`.
pub const NLM_F_MULTI: u16 = 0x2;
/// `NLM_F_ACK`: reply with an ack (an `NLMSG_ERROR` carrying 0) on success.
pub const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`): return every entry.
pub const NLM_F_DUMP: u16 = 0x300;
/// A dump's objects changed while it ran: what it returned may be inconsistent.
pub const NLM_F_DUMP_INTR: u16 = 0x10;
/// `NLA_F_NESTED`: the attribute's payload is itself a list of attributes.
pub const NLA_F_NESTED: u16 = 0x8000;
/// `NLA_F_NET_BYTEORDER`: the payload is in network byte order.
pub const NLA_F_NET_BYTEORDER: u16 = 0x4000;
/// `NLA_TYPE_MASK`: the attribute type without the two flag bits.
pub const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);
/// `NLM_F_EXCL`: fail if the object exists; for ipset, leave `IPSET_FLAG_EXIST` unset.
pub const NLM_F_EXCL: u16 = 0x200;
/// `NLM_F_CREATE`: create the object if it does not exist.
pub const NLM_F_CREATE: u16 = 0x400;

/// `NLMSG_HDRLEN`: the aligned size of `struct nlmsghdr`.
pub const NLMSG_HDRLEN: usize = 16;
/// `NLA_HDRLEN`: the aligned size of `struct nlattr`.
pub const NLA_HDRLEN: usize = 4;

/// `NLMSG_ALIGN` / `NLA_ALIGN`: `n` rounded up to a multiple of 4.
#[must_use]
pub const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Why bytes are not well-formed netlink: a header, message or attribute that does not
/// fit. Each codec's error (IPVS, ipset) wraps it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetlinkFormatError {
    /// Fewer bytes than a fixed-size header needs.
    #[error("truncated {what}: need {needed} bytes, have {available}")]
    Truncated {
        /// The header being read.
        what: &'static str,
        /// Bytes the header needs.
        needed: usize,
        /// Bytes left.
        available: usize,
    },
    /// A message length that is too small or runs past the buffer.
    #[error("bad netlink message length {length} at offset {offset} (buffer {available})")]
    BadLength {
        /// Offset of the message.
        offset: usize,
        /// The `nlmsg_len` read (0 when fewer than 4 bytes are left).
        length: usize,
        /// Bytes from the offset to the end of the buffer.
        available: usize,
    },
    /// An attribute length that is too small, runs past its container, or does not fit
    /// the attribute's type.
    #[error("bad length {length} for attribute {kind}")]
    BadAttributeLength {
        /// The attribute type.
        kind: u16,
        /// The length read.
        length: usize,
    },
    /// A string attribute that is not UTF-8.
    #[error("attribute {0} is not a UTF-8 string")]
    BadString(u16),
}

impl NetlinkFormatError {
    /// A stable short label for metrics.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Truncated { .. } => "truncated",
            Self::BadLength { .. } => "bad_length",
            Self::BadAttributeLength { .. } => "bad_attribute_length",
            Self::BadString(_) => "bad_string",
        }
    }
}

type Result<T> = std::result::Result<T, NetlinkFormatError>;

/// The `nlmsghdr` fields other than the length, which [`finish_message`] computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetlinkHeader {
    /// `nlmsg_type`: a genl family id, an nfnetlink subsystem and command
    /// (`NFNL_SUBSYS_IPSET << 8 | IPSET_CMD_*`), or `NLMSG_ERROR` / `NLMSG_DONE`.
    pub message_type: u16,
    /// `nlmsg_flags` (`NLM_F_*`).
    pub flags: u16,
    /// `nlmsg_seq`.
    pub seq: u32,
    /// `nlmsg_pid`: 0 from userspace to the kernel; the socket's port id in replies.
    pub port_id: u32,
}

// ---- encoding --------------------------------------------------------------------------

/// A new message holding `header`'s `nlmsghdr`, its length 0 until [`finish_message`].
#[must_use]
pub fn start_message(header: &NetlinkHeader) -> Vec<u8> {
    let mut buf = Vec::with_capacity(128);
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(&header.message_type.to_ne_bytes());
    buf.extend_from_slice(&header.flags.to_ne_bytes());
    buf.extend_from_slice(&header.seq.to_ne_bytes());
    buf.extend_from_slice(&header.port_id.to_ne_bytes());
    buf
}

/// Sets `nlmsg_len` of a message from [`start_message`] to its length.
#[must_use]
pub fn finish_message(mut buf: Vec<u8>) -> Vec<u8> {
    let len = buf.len() as u32;
    if let Some(field) = buf.get_mut(..4) {
        field.copy_from_slice(&len.to_ne_bytes());
    }
    buf
}

/// Appends one attribute: its `nlattr`, `value` and the padding. `kind` is written as
/// given, flags included.
pub fn put_attr(buf: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = NLA_HDRLEN + value.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(value);
    buf.resize(buf.len() + align4(len) - len, 0);
}

/// A `u8` attribute.
pub fn put_u8(buf: &mut Vec<u8>, kind: u16, v: u8) {
    put_attr(buf, kind, &[v]);
}

/// A `u16` attribute, native order.
pub fn put_u16(buf: &mut Vec<u8>, kind: u16, v: u16) {
    put_attr(buf, kind, &v.to_ne_bytes());
}

/// A `__be16` attribute without `NLA_F_NET_BYTEORDER` (as IPVS sends ports).
pub fn put_be16(buf: &mut Vec<u8>, kind: u16, v: u16) {
    put_attr(buf, kind, &v.to_be_bytes());
}

/// A `u32` attribute, native order.
pub fn put_u32(buf: &mut Vec<u8>, kind: u16, v: u32) {
    put_attr(buf, kind, &v.to_ne_bytes());
}

/// A `u64` attribute, native order.
pub fn put_u64(buf: &mut Vec<u8>, kind: u16, v: u64) {
    put_attr(buf, kind, &v.to_ne_bytes());
}

/// A `__be16` attribute flagged `NLA_F_NET_BYTEORDER` (as nfnetlink wants them).
pub fn put_net16(buf: &mut Vec<u8>, kind: u16, v: u16) {
    put_be16(buf, kind | NLA_F_NET_BYTEORDER, v);
}

/// A `__be32` attribute flagged `NLA_F_NET_BYTEORDER`.
pub fn put_net32(buf: &mut Vec<u8>, kind: u16, v: u32) {
    put_attr(buf, kind | NLA_F_NET_BYTEORDER, &v.to_be_bytes());
}

/// A NUL-terminated string attribute.
pub fn put_string(buf: &mut Vec<u8>, kind: u16, s: &str) {
    let mut v = Vec::with_capacity(s.len() + 1);
    v.extend_from_slice(s.as_bytes());
    v.push(0);
    put_attr(buf, kind, &v);
}

/// A nest: an `nlattr` whose value is the attributes `fill` appends; its length is set
/// once they are written. `kind` is written as given: add `NLA_F_NESTED` where the
/// family wants it.
pub fn put_nest(buf: &mut Vec<u8>, kind: u16, fill: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&kind.to_ne_bytes());
    fill(buf);
    let len = (buf.len() - start) as u16;
    if let Some(field) = buf.get_mut(start..start + 2) {
        field.copy_from_slice(&len.to_ne_bytes());
    }
}

// ---- decoding --------------------------------------------------------------------------

/// A native-order `u16` at `at`, if the buffer holds it.
#[must_use]
pub fn read_u16(buf: &[u8], at: usize) -> Option<u16> {
    let b: [u8; 2] = buf.get(at..at + 2)?.try_into().ok()?;
    Some(u16::from_ne_bytes(b))
}

/// A native-order `u32` at `at`, if the buffer holds it.
#[must_use]
pub fn read_u32(buf: &[u8], at: usize) -> Option<u32> {
    let b: [u8; 4] = buf.get(at..at + 4)?.try_into().ok()?;
    Some(u32::from_ne_bytes(b))
}

/// One message of a buffer, as [`messages`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    /// Offset of its `nlmsghdr` in the buffer.
    pub offset: usize,
    /// The `nlmsghdr` fields.
    pub header: NetlinkHeader,
    /// The whole message, from its `nlmsghdr` to `nlmsg_len` (no padding).
    pub bytes: &'a [u8],
}

impl<'a> Message<'a> {
    /// What follows the `nlmsghdr`: the family's header and attributes, an `nlmsgerr`,
    /// or `NLMSG_DONE`'s status.
    #[must_use]
    pub fn payload(&self) -> &'a [u8] {
        self.bytes.get(NLMSG_HDRLEN..).unwrap_or_default()
    }
}

/// The message whose `nlmsghdr` starts at `offset` of `buf`.
///
/// # Errors
/// [`NetlinkFormatError::BadLength`] when `nlmsg_len` cannot be read, is shorter than an
/// `nlmsghdr`, or runs past the buffer.
pub fn message_at(buf: &[u8], offset: usize) -> Result<Message<'_>> {
    let rest = buf.get(offset..).unwrap_or_default();
    let len = read_u32(rest, 0).unwrap_or_default() as usize;
    let Some(bytes) = rest.get(..len).filter(|_| len >= NLMSG_HDRLEN) else {
        return Err(NetlinkFormatError::BadLength {
            offset,
            length: len,
            available: rest.len(),
        });
    };
    Ok(Message {
        offset,
        header: NetlinkHeader {
            message_type: read_u16(bytes, 4).unwrap_or_default(),
            flags: read_u16(bytes, 6).unwrap_or_default(),
            seq: read_u32(bytes, 8).unwrap_or_default(),
            port_id: read_u32(bytes, 12).unwrap_or_default(),
        },
        bytes,
    })
}

/// The messages of `buf` (one `recv`, or a dump's replies back to back), each starting
/// 4-aligned after the one before. A bad length ([`message_at`]) is the last item.
pub fn messages(buf: &[u8]) -> impl Iterator<Item = Result<Message<'_>>> {
    let mut offset = 0;
    std::iter::from_fn(move || {
        if offset >= buf.len() {
            return None;
        }
        let message = message_at(buf, offset);
        offset = match &message {
            Ok(m) => offset + align4(m.bytes.len()),
            Err(_) => buf.len(),
        };
        Some(message)
    })
}

/// One attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attribute<'a> {
    /// The type, without `NLA_F_NESTED` and `NLA_F_NET_BYTEORDER`.
    pub kind: u16,
    /// Whether it was flagged `NLA_F_NESTED`.
    pub nested: bool,
    /// The value, without the padding.
    pub value: &'a [u8],
}

/// Walks the attributes of `buf` (a message's after its headers, or a nest's value).
/// A truncated or bad length is the last item.
pub fn attributes(buf: &[u8]) -> impl Iterator<Item = Result<Attribute<'_>>> {
    let mut off = 0;
    std::iter::from_fn(move || {
        let rest = buf.get(off..).filter(|r| !r.is_empty())?;
        let (Some(len), Some(kind)) = (read_u16(rest, 0), read_u16(rest, 2)) else {
            off = buf.len();
            return Some(Err(NetlinkFormatError::Truncated {
                what: "nlattr",
                needed: NLA_HDRLEN,
                available: rest.len(),
            }));
        };
        let len = usize::from(len);
        let Some(value) = rest.get(NLA_HDRLEN..len).filter(|_| len >= NLA_HDRLEN) else {
            off = buf.len();
            return Some(Err(NetlinkFormatError::BadAttributeLength {
                kind: kind & NLA_TYPE_MASK,
                length: len,
            }));
        };
        off += align4(len);
        Some(Ok(Attribute {
            kind: kind & NLA_TYPE_MASK,
            nested: kind & NLA_F_NESTED != 0,
            value,
        }))
    })
}

impl Attribute<'_> {
    /// The value as exactly `N` bytes.
    ///
    /// # Errors
    /// [`NetlinkFormatError::BadAttributeLength`] for a value of another length.
    pub fn fixed<const N: usize>(&self) -> Result<[u8; N]> {
        self.value
            .try_into()
            .map_err(|_| NetlinkFormatError::BadAttributeLength {
                kind: self.kind,
                length: self.value.len() + NLA_HDRLEN,
            })
    }

    /// A `u8` value.
    ///
    /// # Errors
    /// A value of another length.
    pub fn get_u8(&self) -> Result<u8> {
        Ok(self.fixed::<1>()?[0])
    }

    /// A native-order `u16` value.
    ///
    /// # Errors
    /// A value of another length.
    pub fn get_u16(&self) -> Result<u16> {
        self.fixed().map(u16::from_ne_bytes)
    }

    /// A `__be16` value (flagged `NLA_F_NET_BYTEORDER` or not).
    ///
    /// # Errors
    /// A value of another length.
    pub fn get_be16(&self) -> Result<u16> {
        self.fixed().map(u16::from_be_bytes)
    }

    /// A native-order `u32` value.
    ///
    /// # Errors
    /// A value of another length.
    pub fn get_u32(&self) -> Result<u32> {
        self.fixed().map(u32::from_ne_bytes)
    }

    /// A `__be32` value (flagged `NLA_F_NET_BYTEORDER` or not).
    ///
    /// # Errors
    /// A value of another length.
    pub fn get_be32(&self) -> Result<u32> {
        self.fixed().map(u32::from_be_bytes)
    }

    /// A native-order `u64` value.
    ///
    /// # Errors
    /// A value of another length.
    pub fn get_u64(&self) -> Result<u64> {
        self.fixed().map(u64::from_ne_bytes)
    }

    /// A string value, up to its first NUL (or the end when it has none).
    ///
    /// # Errors
    /// [`NetlinkFormatError::BadString`] when it is not UTF-8.
    pub fn get_string(&self) -> Result<String> {
        let raw = self.value;
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        let bytes = raw.get(..end).unwrap_or_default();
        String::from_utf8(bytes.to_vec()).map_err(|_| NetlinkFormatError::BadString(self.kind))
    }
}

/// Annotated byte vectors (x86-64 / little-endian byte order) for the framing alone; the
/// codecs' own tests cover it again inside real messages.
#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::*;

    const HEADER: NetlinkHeader = NetlinkHeader {
        message_type: 0x23,
        flags: 0x05,
        seq: 7,
        port_id: 0,
    };

    /// One message of every attribute writer, a nest and a nested nest.
    #[rustfmt::skip]
    const EVERY_WRITER: &[u8] = &[
        0x58, 0x00, 0x00, 0x00, // nlmsg_len 88
        0x23, 0x00,             // nlmsg_type 0x23
        0x05, 0x00,             // nlmsg_flags NLM_F_REQUEST | NLM_F_ACK
        0x07, 0x00, 0x00, 0x00, // nlmsg_seq 7
        0x00, 0x00, 0x00, 0x00, // nlmsg_pid 0
        0x05, 0x00, 0x01, 0x00, 0x2a, 0x00, 0x00, 0x00, // len 5, type 1: u8 42 + pad
        0x06, 0x00, 0x02, 0x00, 0x34, 0x12, 0x00, 0x00, // len 6, type 2: u16 0x1234 + pad
        0x06, 0x00, 0x03, 0x00, 0x00, 0x50, 0x00, 0x00, // len 6, type 3: be16 80 + pad
        0x08, 0x00, 0x04, 0x00, 0x78, 0x56, 0x34, 0x12, // len 8, type 4: u32 0x12345678
        0x0c, 0x00, 0x05, 0x00, // len 12, type 5: u64 1 << 32
        0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
        0x07, 0x00, 0x06, 0x00, b'r', b'r', 0x00, 0x00, // len 7, type 6: "rr\0" + pad
        0x14, 0x00, 0x07, 0x80, // len 20, type 7 | NLA_F_NESTED
        0x06, 0x00, 0x01, 0x40, 0x1f, 0x90, 0x00, 0x00, //   len 6, 1 | NLA_F_NET_BYTEORDER: 8080
        0x08, 0x00, 0x02, 0x00, //   len 8, type 2 (a nest without NLA_F_NESTED)
        0x04, 0x00, 0x03, 0x40, //     len 4, 3 | NLA_F_NET_BYTEORDER: empty value
    ];

    fn every_writer() -> Vec<u8> {
        let mut buf = start_message(&HEADER);
        put_u8(&mut buf, 1, 42);
        put_u16(&mut buf, 2, 0x1234);
        put_be16(&mut buf, 3, 80);
        put_u32(&mut buf, 4, 0x1234_5678);
        put_u64(&mut buf, 5, 1 << 32);
        put_string(&mut buf, 6, "rr");
        put_nest(&mut buf, 7 | NLA_F_NESTED, |b| {
            put_net16(b, 1, 8080);
            put_nest(b, 2, |b| put_attr(b, 3 | NLA_F_NET_BYTEORDER, &[]));
        });
        finish_message(buf)
    }

    #[test]
    fn writers_and_readers_agree() -> Result<()> {
        assert_eq!(every_writer(), EVERY_WRITER);
        let walked: Vec<Message<'_>> = messages(EVERY_WRITER).collect::<Result<_>>()?;
        let [message] = walked.as_slice() else {
            panic!("1 message expected: {walked:?}");
        };
        assert_eq!((message.offset, message.header), (0, HEADER));
        let attrs: Vec<Attribute<'_>> = attributes(message.payload()).collect::<Result<_>>()?;
        let [a, b, c, d, e, f, nest] = attrs.as_slice() else {
            panic!("7 attributes expected: {attrs:?}");
        };
        assert_eq!(a.get_u8()?, 42);
        assert_eq!(b.get_u16()?, 0x1234);
        assert_eq!(c.get_be16()?, 80);
        assert_eq!(d.get_u32()?, 0x1234_5678);
        assert_eq!(e.get_u64()?, 1 << 32);
        assert_eq!(f.get_string()?, "rr");
        assert_eq!((nest.kind, nest.nested), (7, true));
        let inner: Vec<Attribute<'_>> = attributes(nest.value).collect::<Result<_>>()?;
        let [port, empty_nest] = inner.as_slice() else {
            panic!("2 attributes expected: {inner:?}");
        };
        assert_eq!((port.kind, port.nested, port.get_be16()?), (1, false, 8080));
        assert_eq!((empty_nest.kind, empty_nest.nested), (2, false));
        let innermost: Vec<Attribute<'_>> = attributes(empty_nest.value).collect::<Result<_>>()?;
        assert_eq!(
            innermost.first().map(|a| (a.kind, a.value)),
            Some((3, &[][..]))
        );
        Ok(())
    }

    #[test]
    fn messages_start_four_aligned() -> Result<()> {
        // A 17-byte message (one byte of payload), 3 bytes of padding, a 16-byte message.
        let mut first = start_message(&HEADER);
        first.push(0xaa);
        let mut buf = finish_message(first);
        buf.resize(align4(buf.len()), 0);
        buf.extend_from_slice(&finish_message(start_message(&NetlinkHeader {
            seq: 8,
            ..HEADER
        })));
        let walked: Vec<Message<'_>> = messages(&buf).collect::<Result<_>>()?;
        let summary: Vec<_> = walked
            .iter()
            .map(|m| (m.offset, m.header.seq, m.payload()))
            .collect();
        assert_eq!(summary, [(0, 7, &[0xaa][..]), (20, 8, &[][..])]);
        Ok(())
    }

    #[test]
    fn bad_message_lengths_end_the_walk() {
        let message = finish_message(start_message(&HEADER));
        let bad =
            |bytes: &[u8]| -> Vec<_> { messages(bytes).map(|m| m.map(|m| m.offset)).collect() };
        let error = |offset, length, available| {
            Err(NetlinkFormatError::BadLength {
                offset,
                length,
                available,
            })
        };
        // nlmsg_len 16 with 10 bytes: past the buffer.
        assert_eq!(bad(&message[..10]), [error(0, 16, 10)]);
        // Fewer than 4 bytes: no length to read.
        assert_eq!(bad(&message[..2]), [error(0, 0, 2)]);
        // A good message, then nlmsg_len 8: shorter than its own header.
        let mut short = [message.as_slice(), message.as_slice()].concat();
        short[16] = 8;
        assert_eq!(bad(&short), [Ok(0), error(16, 8, 16)]);
        assert!(bad(&[]).is_empty());
    }

    #[test]
    fn bad_attributes_are_errors() {
        let first_error = |bytes: &[u8]| attributes(bytes).find_map(Result::err);
        // Two bytes: no room for an nlattr.
        assert_eq!(
            first_error(&[0x08, 0x00]),
            Some(NetlinkFormatError::Truncated {
                what: "nlattr",
                needed: NLA_HDRLEN,
                available: 2
            })
        );
        // len 2: shorter than its own header; len 12 past an 8-byte buffer.
        for (len, bytes) in [
            (2, [0x02, 0x00, 0x05, 0x80]),
            (12, [0x0c, 0x00, 0x05, 0x80]),
        ] {
            let mut buf = bytes.to_vec();
            buf.extend_from_slice(&[0; 4]);
            assert_eq!(
                first_error(&buf),
                Some(NetlinkFormatError::BadAttributeLength {
                    kind: 5,
                    length: len
                })
            );
        }
        // The walk stops at the error.
        assert_eq!(attributes(&[0x02, 0x00, 0x05, 0x00, 0x04, 0x00]).count(), 1);
        // A u16 with a 4-byte value; a string that is not UTF-8.
        let attr = Attribute {
            kind: 9,
            nested: false,
            value: &[0xff, 0xfe, 0x00, 0x00],
        };
        assert_eq!(
            attr.get_u16().map_err(|e| e.label()),
            Err("bad_attribute_length")
        );
        assert_eq!(
            attr.get_u16(),
            Err(NetlinkFormatError::BadAttributeLength { kind: 9, length: 8 })
        );
        assert_eq!(attr.get_string(), Err(NetlinkFormatError::BadString(9)));
    }
}
