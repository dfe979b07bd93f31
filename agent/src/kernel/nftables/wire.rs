//! The attribute helpers nf_tables needs on top of [`crate::kernel::netlink::frame`]:
//! big-endian integers (nf_tables sends every `u16`/`u32`/`u64` value in network order,
//! without `NLA_F_NET_BYTEORDER`), nests flagged `NLA_F_NESTED` (as nft sends them), and
//! a reader that finds a message's or nest's attributes by type.

use super::error::NftCodecError;
use crate::kernel::netlink::frame::{self, Attribute, NLA_F_NESTED};

type Result<T> = std::result::Result<T, NftCodecError>;

/// A `__be32` attribute.
pub fn put_be32(buf: &mut Vec<u8>, kind: u16, v: u32) {
    frame::put_attr(buf, kind, &v.to_be_bytes());
}

/// A `__be64` attribute.
pub fn put_be64(buf: &mut Vec<u8>, kind: u16, v: u64) {
    frame::put_attr(buf, kind, &v.to_be_bytes());
}

/// A NUL-terminated string attribute.
pub fn put_str(buf: &mut Vec<u8>, kind: u16, s: &str) {
    frame::put_string(buf, kind, s);
}

/// A nest flagged `NLA_F_NESTED`.
pub fn put_nest(buf: &mut Vec<u8>, kind: u16, fill: impl FnOnce(&mut Vec<u8>)) {
    frame::put_nest(buf, kind | NLA_F_NESTED, fill);
}

/// The attributes of a message body or a nest, by type (a type seen twice keeps the
/// first; `NFTA_LIST_ELEM` lists are walked with [`list`]).
#[derive(Debug, Default)]
pub struct Attrs<'a> {
    found: Vec<Attribute<'a>>,
}

impl<'a> Attrs<'a> {
    /// Reads every attribute of `buf`.
    ///
    /// # Errors
    /// When an attribute's length is bad.
    pub fn parse(buf: &'a [u8]) -> Result<Self> {
        let mut found = Vec::with_capacity(8);
        for attr in frame::attributes(buf) {
            found.push(attr?);
        }
        Ok(Self { found })
    }

    /// The attribute of type `kind`, if present.
    #[must_use]
    pub fn get(&self, kind: u16) -> Option<&Attribute<'a>> {
        self.found.iter().find(|a| a.kind == kind)
    }

    /// The value of the attribute of type `kind`, if present.
    #[must_use]
    pub fn bytes(&self, kind: u16) -> Option<&'a [u8]> {
        self.get(kind).map(|a| a.value)
    }

    /// A required attribute's value.
    ///
    /// # Errors
    /// [`NftCodecError::MissingAttribute`] when it is absent.
    pub fn need(&self, kind: u16, what: &'static str) -> Result<&'a [u8]> {
        self.bytes(kind)
            .ok_or(NftCodecError::MissingAttribute(what))
    }

    /// An optional `__be32`.
    ///
    /// # Errors
    /// A value that is not 4 bytes.
    pub fn be32(&self, kind: u16) -> Result<Option<u32>> {
        self.get(kind)
            .map(|a| a.get_be32().map_err(NftCodecError::from))
            .transpose()
    }

    /// A required `__be32`.
    ///
    /// # Errors
    /// When absent or not 4 bytes.
    pub fn need_be32(&self, kind: u16, what: &'static str) -> Result<u32> {
        self.be32(kind)?
            .ok_or(NftCodecError::MissingAttribute(what))
    }

    /// An optional `__be64`.
    ///
    /// # Errors
    /// A value that is not 8 bytes.
    pub fn be64(&self, kind: u16) -> Result<Option<u64>> {
        self.get(kind)
            .map(|a| {
                a.fixed::<8>()
                    .map(u64::from_be_bytes)
                    .map_err(NftCodecError::from)
            })
            .transpose()
    }

    /// An optional string.
    ///
    /// # Errors
    /// A value that is not UTF-8.
    pub fn string(&self, kind: u16) -> Result<Option<String>> {
        self.get(kind)
            .map(|a| a.get_string().map_err(NftCodecError::from))
            .transpose()
    }

    /// A required string.
    ///
    /// # Errors
    /// When absent or not UTF-8.
    pub fn need_string(&self, kind: u16, what: &'static str) -> Result<String> {
        self.string(kind)?
            .ok_or(NftCodecError::MissingAttribute(what))
    }
}

/// The values of the attributes of a list nest: `NFTA_LIST_ELEM` each in the kernel's
/// dumps, numbered 1, 2, 3... in nft's element lists.
///
/// # Errors
/// When an attribute's length is bad.
pub fn list(buf: &[u8]) -> Result<Vec<&[u8]>> {
    frame::attributes(buf)
        .map(|attr| attr.map(|a| a.value).map_err(NftCodecError::from))
        .collect()
}
