//! [`NftNetlink`]: nf_tables over a netfilter netlink socket: the generation, dumps read
//! message by message (a table of 10,000 Services is never held whole), and
//! transactions.
//!
//! A transaction is one `sendmsg`. The kernel handles it before `sendmsg` returns: it
//! runs every message, then commits or, when one failed, aborts the whole batch and
//! answers each failed message with an error; the last message asks for an ack, so its
//! answer (ack or error) closes the transaction's answers. A commit that fails after
//! every message passed (the table validation) is answered on the batch begin's
//! sequence number, before the rest.

use std::io;
use std::os::fd::AsFd;

use netlink_sys::Socket;
use netlink_sys::protocols::NETLINK_NETFILTER;
use nix::libc;

use super::batch::Transaction;
use super::objects::{decode_generation, describe, get_generation_request, split};
use super::uapi::NFT_MSG_NEWGEN;
use crate::kernel::netlink::frame::{NLM_F_ACK, NLMSG_DONE, NLMSG_ERROR};
use crate::kernel::netlink::socket::{RawMessage, errno_error, messages};

/// Receive buffer asked of the kernel.
const RECEIVE_BUFFER: usize = 4 * 1024 * 1024;
/// How long a `recv` waits for the kernel.
const RECEIVE_TIMEOUT_SECONDS: i64 = 30;
/// Bytes read per `recv`.
const READ_CHUNK: usize = 256 * 1024;
/// `NLM_F_DUMP_INTR`: the dump was interrupted by a change; its parts are inconsistent.
const NLM_F_DUMP_INTR: u16 = 0x10;
/// `NLM_F_ACK_TLVS` on an error message: extended ack attributes follow.
const NLM_F_ACK_TLVS: u16 = 0x200;
/// `NLMSGERR_ATTR_MSG`: the kernel's error text.
const NLMSGERR_ATTR_MSG: u16 = 1;
/// `ERESTART`: the ruleset is no longer at the batch's generation.
pub const ERESTART: i32 = 85;

/// One message of a transaction the kernel refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// What the message asked (`add rule to ip proxyplan services`), or "commit" when
    /// the commit itself failed.
    pub what: String,
    /// The errno (positive).
    pub errno: i32,
    /// The kernel's extended-ack text, if it gave one.
    pub detail: Option<String>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, errno_error(self.errno))?;
        if let Some(detail) = &self.detail {
            write!(f, " ({detail})")?;
        }
        Ok(())
    }
}

/// A netfilter netlink socket speaking to nf_tables.
#[derive(Debug)]
pub struct NftNetlink {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
    send_buffer: usize,
}

/// The extended-ack text of an error message, if any.
fn ack_text(msg: &RawMessage<'_>) -> Option<String> {
    if msg.flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    // nlmsghdr, errno, the request's nlmsghdr (capped), then attributes.
    let tlvs = msg.bytes.get(16 + 4 + 16..)?;
    crate::kernel::netlink::frame::attributes(tlvs)
        .map_while(Result::ok)
        .find(|a| a.kind == NLMSGERR_ATTR_MSG)
        .and_then(|a| a.get_string().ok())
        .filter(|s| !s.is_empty())
}

impl NftNetlink {
    /// Opens a socket in the calling thread's network namespace.
    ///
    /// # Errors
    /// When the socket cannot be opened or bound.
    pub fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.set_cap_ack(true)?;
        // Best effort: error texts and a larger buffer help, neither is needed.
        let _ = socket.set_ext_ack(true);
        let _ = socket.set_rx_buf_sz(RECEIVE_BUFFER);
        // A kernel that does not answer is an error, not a hang.
        nix::sys::socket::setsockopt(
            &socket.as_fd(),
            nix::sys::socket::sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(RECEIVE_TIMEOUT_SECONDS, 0),
        )
        .map_err(io::Error::from)?;
        Ok(Self {
            socket,
            seq: 1,
            buf: Vec::with_capacity(READ_CHUNK),
            send_buffer: 0,
        })
    }

    /// The socket's netlink port: the sender the kernel names in the announcements of
    /// its commits.
    ///
    /// # Errors
    /// When the socket's address cannot be read.
    pub fn port(&self) -> io::Result<u32> {
        super::monitor::port_of(&self.socket)
    }

    fn next_seqs(&mut self, n: usize) -> u32 {
        let first = self.seq.wrapping_add(1).max(1);
        self.seq = first.wrapping_add(n as u32);
        first
    }

    fn receive(&mut self, flags: libc::c_int) -> io::Result<usize> {
        self.buf.clear();
        if self.buf.capacity() < READ_CHUNK {
            self.buf.reserve(READ_CHUNK);
        }
        self.socket.recv(&mut self.buf, flags)
    }

    /// The ruleset's generation: it changes with every commit, by anyone.
    ///
    /// # Errors
    /// When the socket fails or nf_tables is not available.
    pub fn generation(&mut self) -> io::Result<u32> {
        let mut request = get_generation_request();
        let seq = self.next_seqs(1);
        request[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.socket.send(&request, 0)?;
        loop {
            self.receive(0)?;
            for msg in messages(&self.buf).filter(|m| m.seq == seq) {
                if let Some(errno) = msg.errno() {
                    return Err(errno_error(errno));
                }
                let (kind, _, body) = split(msg.bytes).map_err(invalid)?;
                if kind == NFT_MSG_NEWGEN {
                    return decode_generation(body).map_err(invalid);
                }
            }
        }
    }

    /// Sends a dump request and calls `each` with every reply message (header
    /// included), as they arrive.
    ///
    /// # Errors
    /// When the socket fails, the kernel refuses the dump (`ENOENT`: no such table or
    /// set), `each` fails, or the dump was interrupted by a change
    /// ([`io::ErrorKind::Interrupted`]: read again).
    pub fn dump(
        &mut self,
        mut request: Vec<u8>,
        each: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let seq = self.next_seqs(1);
        if let Some(field) = request.get_mut(8..12) {
            field.copy_from_slice(&seq.to_ne_bytes());
        }
        self.socket.send(&request, 0)?;
        let mut interrupted = false;
        loop {
            self.receive(0)?;
            let mut done = false;
            let buf = std::mem::take(&mut self.buf);
            let result = (|| {
                for msg in messages(&buf).filter(|m| m.seq == seq) {
                    match msg.message_type {
                        NLMSG_DONE => done = true,
                        NLMSG_ERROR => match msg.errno() {
                            Some(0) | None => done = true,
                            Some(errno) => return Err(errno_error(errno)),
                        },
                        _ => {
                            interrupted |= msg.flags & NLM_F_DUMP_INTR != 0;
                            each(msg.bytes)?;
                        }
                    }
                }
                Ok(())
            })();
            self.buf = buf;
            result?;
            if done {
                break;
            }
        }
        if interrupted {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "the ruleset changed during the dump",
            ));
        }
        Ok(())
    }

    /// Sends one request that the kernel answers with one message (or an error), and
    /// calls `each` with that message.
    ///
    /// # Errors
    /// When the socket fails or the kernel answers with an error.
    pub fn request(
        &mut self,
        mut request: Vec<u8>,
        each: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let seq = self.next_seqs(1);
        if let Some(field) = request.get_mut(8..12) {
            field.copy_from_slice(&seq.to_ne_bytes());
        }
        self.socket.send(&request, 0)?;
        loop {
            self.receive(0)?;
            let mut done = false;
            for msg in messages(&self.buf).filter(|m| m.seq == seq) {
                match msg.errno() {
                    Some(0) => done = true,
                    Some(errno) => return Err(errno_error(errno)),
                    None => each(msg.bytes)?,
                }
            }
            if done {
                return Ok(());
            }
        }
    }

    /// Makes room for a datagram of `len` bytes in the send buffer (the kernel refuses
    /// a larger one with `EMSGSIZE`).
    fn send_room(&mut self, len: usize) -> io::Result<()> {
        let want = len + 64 * 1024;
        if want <= self.send_buffer.max(200 * 1024) {
            return Ok(());
        }
        let fd = self.socket.as_fd();
        let size = want.min(i32::MAX as usize);
        nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::SndBufForce, &size)
            .or_else(|_| {
                nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::SndBuf, &size)
            })
            .map_err(io::Error::from)?;
        self.send_buffer = want;
        Ok(())
    }

    /// Sends `transaction` and returns what the kernel refused: nothing when it
    /// committed. An empty transaction is not sent.
    ///
    /// # Errors
    /// When the socket fails or the kernel does not answer.
    pub fn commit(&mut self, transaction: &mut Transaction) -> io::Result<Vec<Refusal>> {
        self.send_batch(transaction, true)
    }

    /// Sends `transaction` without committing it: the kernel runs and validates it, says
    /// what it refuses, and aborts.
    ///
    /// # Errors
    /// When the socket fails or the kernel does not answer.
    pub fn check(&mut self, transaction: &mut Transaction) -> io::Result<Vec<Refusal>> {
        self.send_batch(transaction, false)
    }

    fn send_batch(
        &mut self,
        transaction: &mut Transaction,
        commit: bool,
    ) -> io::Result<Vec<Refusal>> {
        if transaction.is_empty() {
            return Ok(Vec::new());
        }
        // Without the batch end, the last offset is where it would start.
        let (mut bytes, offsets) = transaction.bytes_ending(commit);
        let first = self.next_seqs(offsets.len());
        for (i, at) in offsets.iter().enumerate() {
            if let Some(field) = bytes.get_mut(at + 8..at + 12) {
                field.copy_from_slice(&first.wrapping_add(i as u32).to_ne_bytes());
            }
        }
        // The last message before the batch end asks for the ack that closes it.
        let last_index = offsets.len() - 2;
        let last = offsets[last_index];
        if let Some(field) = bytes.get_mut(last + 6..last + 8) {
            let flags = u16::from_ne_bytes([field[0], field[1]]) | NLM_F_ACK;
            field.copy_from_slice(&flags.to_ne_bytes());
        }
        self.send_room(bytes.len())?;
        self.socket.send(&bytes, 0)?;
        let last_seq = first.wrapping_add(last_index as u32);
        let mut refusals = Vec::new();
        let mut finished = false;
        // Everything is answered before `send` returned; read it without waiting, and
        // wait only if the answer that closes the transaction is somehow not there.
        let mut flags = libc::MSG_DONTWAIT;
        while !finished {
            match self.receive(flags) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    flags = 0;
                    continue;
                }
                Err(e) => return Err(e),
            }
            for msg in messages(&self.buf) {
                let Some(errno) = msg.errno() else { continue };
                let index = msg.seq.wrapping_sub(first) as usize;
                if index >= offsets.len() {
                    continue;
                }
                if errno != 0 {
                    let what = if index == 0 {
                        "commit".to_owned()
                    } else {
                        let at = offsets[index];
                        let end = offsets.get(index + 1).copied().unwrap_or(bytes.len());
                        describe(bytes.get(at..end).unwrap_or_default())
                    };
                    refusals.push(Refusal {
                        what,
                        errno: errno.abs(),
                        detail: ack_text(&msg),
                    });
                    // Refused before any message ran: nothing else comes.
                    if index == 0 && errno.abs() == ERESTART {
                        finished = true;
                    }
                }
                finished |= msg.seq == last_seq;
            }
        }
        Ok(refusals)
    }
}

fn invalid(error: super::error::NftCodecError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}
