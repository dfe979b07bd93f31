//! A transaction: nf_tables messages between `NFNL_MSG_BATCH_BEGIN` and
//! `NFNL_MSG_BATCH_END`, sent in one `sendmsg` and committed by the kernel all at once or
//! not at all.
//!
//! ```text
//! nlmsghdr NFNL_MSG_BATCH_BEGIN | nfgenmsg AF_UNSPEC, 0, res_id be16 NFNL_SUBSYS_NFTABLES
//!          [NFNL_BATCH_GENID be32: refuse with ERESTART unless the ruleset is at it]
//! nlmsghdr NFT_MSG_NEW* / NFT_MSG_DEL* ...
//! nlmsghdr NFNL_MSG_BATCH_END   | nfgenmsg AF_UNSPEC, 0, res_id be16 NFNL_SUBSYS_NFTABLES
//! ```
//!
//! Set elements go many to a message: [`Transaction::element`] appends to the open
//! element list while it is for the same set and operation and has room (its nest length
//! is a `u16`).

use super::expr::Data;
use super::objects::{encode_element, start_elements};
use super::uapi::{
    NFNL_BATCH_GENID, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFNL_SUBSYS_NFTABLES,
};
use super::wire::put_be32;
use crate::kernel::netlink::frame::{self, NLM_F_REQUEST, NetlinkHeader, align4};

/// Bytes of elements one message carries at most (the nest length is 16 bits).
const ELEMENTS_PER_MESSAGE: usize = 60 * 1024;

/// An element list being filled at the end of the buffer.
#[derive(Debug)]
struct OpenElements {
    add: bool,
    family: u8,
    table: String,
    set: String,
    /// Where its message starts in the buffer.
    start: usize,
    /// Where its elements nest starts, relative to `start`.
    nest: usize,
    /// Elements in it.
    count: u16,
}

/// A transaction being built.
#[derive(Debug)]
pub struct Transaction {
    buf: Vec<u8>,
    /// Where each message after the batch begin starts.
    offsets: Vec<usize>,
    open: Option<OpenElements>,
    elements: usize,
}

/// A batch control message (`NFNL_MSG_BATCH_BEGIN` or `_END`).
fn control(message_type: u16, genid: Option<u32>) -> Vec<u8> {
    let mut buf = frame::start_message(&NetlinkHeader {
        message_type,
        flags: NLM_F_REQUEST,
        seq: 0,
        port_id: 0,
    });
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&u16::from(NFNL_SUBSYS_NFTABLES).to_be_bytes());
    if let Some(genid) = genid {
        put_be32(&mut buf, NFNL_BATCH_GENID, genid);
    }
    frame::finish_message(buf)
}

impl Transaction {
    /// An empty transaction. With `genid`, the kernel refuses it (`ERESTART`) unless
    /// the ruleset is still at that generation (0, sent without one, is never refused).
    #[must_use]
    pub fn new(genid: Option<u32>) -> Self {
        Self {
            buf: control(NFNL_MSG_BATCH_BEGIN, Some(genid.unwrap_or(0))),
            offsets: Vec::new(),
            open: None,
            elements: 0,
        }
    }

    /// Whether it holds no message.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// Messages it holds.
    #[must_use]
    pub fn messages(&self) -> usize {
        self.offsets.len()
    }

    /// Set elements it adds or deletes.
    #[must_use]
    pub fn elements(&self) -> usize {
        self.elements
    }

    /// Bytes so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    fn close_elements(&mut self) {
        if let Some(open) = self.open.take() {
            // The nest's and the message's lengths, in place.
            let nest = open.start + open.nest;
            let nest_len = (self.buf.len() - nest) as u16;
            let message_len = (self.buf.len() - open.start) as u32;
            if let Some(field) = self.buf.get_mut(nest..nest + 2) {
                field.copy_from_slice(&nest_len.to_ne_bytes());
            }
            if let Some(field) = self.buf.get_mut(open.start..open.start + 4) {
                field.copy_from_slice(&message_len.to_ne_bytes());
            }
            self.buf.resize(align4(self.buf.len()), 0);
        }
    }

    /// Appends a complete message (from [`super::objects`]).
    pub fn push(&mut self, message: &[u8]) {
        self.close_elements();
        self.offsets.push(self.buf.len());
        self.buf.extend_from_slice(message);
        self.buf.resize(align4(self.buf.len()), 0);
    }

    /// Adds (`add`) or deletes one element of `set`: its key and, for a map being
    /// added to, its data.
    pub fn element(
        &mut self,
        add: bool,
        family: u8,
        table: &str,
        set: &str,
        key: &[u8],
        data: Option<&Data>,
    ) {
        let fits = self.open.as_ref().is_some_and(|o| {
            o.add == add
                && o.family == family
                && o.set == set
                && o.table == table
                && self.buf.len() - o.start - o.nest < ELEMENTS_PER_MESSAGE
        });
        if !fits {
            self.close_elements();
            let (message, nest) = start_elements(add, family, table, set, None);
            let start = self.buf.len();
            self.offsets.push(start);
            self.buf.extend_from_slice(&message);
            self.open = Some(OpenElements {
                add,
                family,
                table: table.to_owned(),
                set: set.to_owned(),
                start,
                nest,
                count: 0,
            });
        }
        if let Some(open) = self.open.as_mut() {
            open.count = open.count.wrapping_add(1).max(1);
            encode_element(
                &mut self.buf,
                open.count,
                key,
                if add { data } else { None },
            );
        }
        self.elements += 1;
    }

    /// Builds it against another generation (`NFNL_BATCH_GENID`).
    pub fn set_generation(&mut self, genid: u32) {
        // nlmsghdr (16), nfgenmsg (4), nlattr (4), then the value.
        if let Some(field) = self.buf.get_mut(24..28) {
            field.copy_from_slice(&genid.to_be_bytes());
        }
    }

    /// The bytes to send (a copy, the batch end appended) and where each message
    /// starts: the batch begin at 0, then every message, then the batch end.
    #[must_use]
    pub fn bytes(&mut self) -> (Vec<u8>, Vec<usize>) {
        self.bytes_ending(true)
    }

    /// [`Transaction::bytes`], without the batch end when `end` is false: the kernel
    /// then runs every message and validates the result as for a commit, answers, and
    /// aborts (what `nft --check` does).
    #[must_use]
    pub fn bytes_ending(&mut self, end: bool) -> (Vec<u8>, Vec<usize>) {
        self.close_elements();
        let end = if end {
            control(NFNL_MSG_BATCH_END, None)
        } else {
            Vec::new()
        };
        let mut bytes = Vec::with_capacity(self.buf.len() + end.len());
        bytes.extend_from_slice(&self.buf);
        let mut offsets = Vec::with_capacity(self.offsets.len() + 2);
        offsets.push(0);
        offsets.extend_from_slice(&self.offsets);
        offsets.push(bytes.len());
        bytes.extend_from_slice(&end);
        (bytes, offsets)
    }
}
