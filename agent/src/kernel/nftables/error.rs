//! The nf_tables codec's error.

use crate::kernel::netlink::frame::NetlinkFormatError;

/// Why bytes are not an nf_tables message we can read, or a value cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NftCodecError {
    /// A header, message or attribute that does not fit, or a string that is not UTF-8.
    #[error(transparent)]
    Format(#[from] NetlinkFormatError),
    /// A required attribute is missing.
    #[error("missing attribute {0}")]
    MissingAttribute(&'static str),
    /// A message type other than an nf_tables one expected here.
    #[error("unexpected message type {0:#06x}")]
    UnexpectedMessage(u16),
    /// A name that is empty, too long (255 bytes at most) or holds a NUL.
    #[error("bad name {0:?}")]
    BadName(String),
    /// A verdict code we do not know.
    #[error("unknown verdict code {0}")]
    UnknownVerdict(i32),
    /// A data attribute that is neither a value nor a verdict.
    #[error("data attribute without a value or a verdict")]
    BadData,
}

impl NftCodecError {
    /// A stable short label for metrics.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Format(e) => e.label(),
            Self::MissingAttribute(_) => "missing_attribute",
            Self::UnexpectedMessage(_) => "unexpected_message",
            Self::BadName(_) => "bad_name",
            Self::UnknownVerdict(_) => "unknown_verdict",
            Self::BadData => "bad_data",
        }
    }
}
