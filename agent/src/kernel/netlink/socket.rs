//! One blocking netlink socket type, used for generic netlink (IPVS) and nfnetlink
//! (ipset, conntrack).
//!
//! Requests are sent in batches: many messages back to back in one `send`, each asking
//! for an ack, so 100,000 IPVS operations cost a few hundred system calls, not 200,000.
//! The kernel handles every message of a batch even when an earlier one fails, and acks
//! each; the answer is one result per request, in order.

use std::io;

use netlink_sys::Socket;

use super::frame::{
    self, NLM_F_ACK, NLM_F_DUMP_INTR, NLM_F_MULTI, NLMSG_DONE, NLMSG_ERROR, align4,
};

/// Bytes of requests per `send`; the kernel refuses a datagram larger than its send
/// buffer (about 200 KiB by default).
const BATCH_BYTES: usize = 64 * 1024;
/// Receive buffer asked of the kernel: a batch's acks and a dump's parts fit easily.
const RECEIVE_BUFFER: usize = 4 * 1024 * 1024;
/// Bytes read per `recv`.
const READ_CHUNK: usize = 256 * 1024;

/// One netlink message as read from the socket: its header fields and payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawMessage<'a> {
    /// `nlmsg_type`.
    pub message_type: u16,
    /// `nlmsg_flags`.
    pub flags: u16,
    /// `nlmsg_seq`.
    pub seq: u32,
    /// The whole message, header included.
    pub bytes: &'a [u8],
}

impl RawMessage<'_> {
    /// For `NLMSG_ERROR`, the errno it carries (0 for an ack).
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        if self.message_type != NLMSG_ERROR {
            return None;
        }
        let word = self.bytes.get(16..20)?;
        Some(i32::from_ne_bytes(word.try_into().ok()?))
    }
}

/// Splits a datagram into its netlink messages ([`frame::messages`]). A malformed length
/// ends the walk.
pub fn messages(buf: &[u8]) -> impl Iterator<Item = RawMessage<'_>> {
    frame::messages(buf)
        .map_while(Result::ok)
        .map(|message| RawMessage {
            message_type: message.header.message_type,
            flags: message.header.flags,
            seq: message.header.seq,
            bytes: message.bytes,
        })
}

/// A netlink socket talking to the kernel, one request or batch at a time.
#[derive(Debug)]
pub struct NetlinkSocket {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

/// An errno as an [`io::Error`].
#[must_use]
pub fn errno_error(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno.abs())
}

impl NetlinkSocket {
    /// Opens a socket of `protocol` (`NETLINK_GENERIC`, `NETLINK_ROUTE`) in the calling
    /// thread's network namespace.
    ///
    /// # Errors
    /// When the socket cannot be opened or bound.
    pub fn open(protocol: isize) -> io::Result<Self> {
        let mut socket = Socket::new(protocol)?;
        socket.bind_auto()?;
        // Acks carry only the request's header, not the whole request back.
        socket.set_cap_ack(true)?;
        // Best effort: the default is enough for small batches.
        let _ = socket.set_rx_buf_sz(RECEIVE_BUFFER);
        Ok(Self {
            socket,
            seq: 1,
            buf: Vec::with_capacity(READ_CHUNK),
        })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    fn receive(&mut self) -> io::Result<()> {
        self.buf.clear();
        if self.buf.capacity() < READ_CHUNK {
            self.buf.reserve(READ_CHUNK);
        }
        self.socket.recv(&mut self.buf, 0)?;
        Ok(())
    }

    /// Sends `requests` (complete messages; their sequence numbers and ack flags are
    /// overwritten) in batches and returns each one's errno: 0 for success.
    ///
    /// Only the last message of a batch asks for an ack: the kernel handles a batch in
    /// order and answers every failure, so that ack means the batch is done. Acking every
    /// message would overflow the receive buffer (each ack costs about a kilobyte of it).
    ///
    /// # Errors
    /// When the socket fails; a refused request is not an error here.
    pub fn transact<I>(&mut self, requests: I) -> io::Result<Vec<i32>>
    where
        I: IntoIterator<Item = Vec<u8>>,
    {
        let mut results = Vec::new();
        let mut batch = Vec::with_capacity(BATCH_BYTES + 1024);
        // Offset of each message of the batch, to set the ack flag on the last one.
        let mut offsets = Vec::new();
        let mut first_seq = 0;
        for mut request in requests {
            if request.len() < 16 {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "short request"));
            }
            let seq = self.next_seq();
            if offsets.is_empty() {
                first_seq = seq;
            }
            request[8..12].copy_from_slice(&seq.to_ne_bytes());
            let flags = u16::from_ne_bytes([request[6], request[7]]) & !NLM_F_ACK;
            request[6..8].copy_from_slice(&flags.to_ne_bytes());
            offsets.push(batch.len());
            batch.extend_from_slice(&request);
            batch.resize(align4(batch.len()), 0);
            if batch.len() >= BATCH_BYTES {
                self.flush(&mut batch, &offsets, first_seq, &mut results)?;
                batch.clear();
                offsets.clear();
            }
        }
        if !offsets.is_empty() {
            self.flush(&mut batch, &offsets, first_seq, &mut results)?;
        }
        Ok(results)
    }

    /// Sends one batch and collects one errno per message, in order.
    fn flush(
        &mut self,
        batch: &mut [u8],
        offsets: &[usize],
        first_seq: u32,
        results: &mut Vec<i32>,
    ) -> io::Result<()> {
        let Some(&last) = offsets.last() else {
            return Ok(());
        };
        if let Some(flags) = batch.get_mut(last + 6..last + 8) {
            let value = u16::from_ne_bytes([flags[0], flags[1]]) | NLM_F_ACK;
            flags.copy_from_slice(&value.to_ne_bytes());
        }
        self.socket.send(batch, 0)?;
        let start = results.len();
        results.resize(start + offsets.len(), 0);
        let last_seq = first_seq.wrapping_add(offsets.len() as u32 - 1);
        loop {
            self.receive()?;
            let mut done = false;
            for msg in messages(&self.buf) {
                let Some(errno) = msg.errno() else { continue };
                let index = msg.seq.wrapping_sub(first_seq) as usize;
                if let Some(slot) = results
                    .get_mut(start + index)
                    .filter(|_| index < offsets.len())
                {
                    *slot = errno;
                }
                done |= msg.seq == last_seq;
            }
            if done {
                return Ok(());
            }
        }
    }

    /// Sends one dump request (its sequence number is overwritten) and returns every
    /// reply message's bytes, back to back, without the closing `NLMSG_DONE`.
    ///
    /// # Errors
    /// When the socket fails or the kernel refuses the dump.
    pub fn dump(&mut self, request: Vec<u8>) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.dump_each(request, &mut |message| {
            out.extend_from_slice(message.bytes);
            out.resize(align4(out.len()), 0);
        })?;
        Ok(out)
    }

    /// Sends one dump request (its sequence number is overwritten) and hands each reply
    /// message to `visit` as it is read, so a dump of any size is never held whole.
    /// Returns whether the kernel flagged the dump as interrupted (`NLM_F_DUMP_INTR`:
    /// the objects changed while it ran, so it may be inconsistent).
    ///
    /// # Errors
    /// When the socket fails or the kernel refuses the dump.
    pub fn dump_each(
        &mut self,
        mut request: Vec<u8>,
        visit: &mut dyn FnMut(RawMessage<'_>),
    ) -> io::Result<bool> {
        if request.len() < 16 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "short request"));
        }
        let seq = self.next_seq();
        request[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.socket.send(&request, 0)?;
        let mut interrupted = false;
        loop {
            self.receive()?;
            let mut done = false;
            for msg in messages(&self.buf).filter(|m| m.seq == seq) {
                interrupted |= msg.flags & NLM_F_DUMP_INTR != 0;
                match msg.message_type {
                    NLMSG_DONE => done = true,
                    NLMSG_ERROR => match msg.errno() {
                        Some(0) | None => done = true,
                        Some(errno) => return Err(errno_error(errno)),
                    },
                    _ => {
                        visit(msg);
                        if msg.flags & NLM_F_MULTI == 0 {
                            done = true;
                        }
                    }
                }
            }
            if done {
                return Ok(interrupted);
            }
        }
    }

    /// Sends one request that expects a single reply message (not a dump) and returns
    /// its bytes.
    ///
    /// # Errors
    /// When the socket fails or the kernel answers with an error.
    pub fn request(&mut self, mut request: Vec<u8>) -> io::Result<Vec<u8>> {
        if request.len() < 16 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "short request"));
        }
        let seq = self.next_seq();
        request[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.socket.send(&request, 0)?;
        loop {
            self.receive()?;
            for msg in messages(&self.buf).filter(|m| m.seq == seq) {
                match msg.errno() {
                    Some(errno) if errno != 0 => return Err(errno_error(errno)),
                    Some(_) => {}
                    None => return Ok(msg.bytes.to_vec()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_datagrams_and_reads_errnos() {
        // An ack (errno 0) for seq 7, then an error (-17, EEXIST) for seq 8, each with the
        // capped request header echoed.
        let mut buf = Vec::new();
        for (seq, errno) in [(7u32, 0i32), (8, -17)] {
            buf.extend_from_slice(&36u32.to_ne_bytes());
            buf.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
            buf.extend_from_slice(&0x100u16.to_ne_bytes());
            buf.extend_from_slice(&seq.to_ne_bytes());
            buf.extend_from_slice(&99u32.to_ne_bytes());
            buf.extend_from_slice(&errno.to_ne_bytes());
            buf.extend_from_slice(&[0; 16]);
        }
        let msgs: Vec<_> = messages(&buf).collect();
        assert_eq!(msgs.len(), 2);
        assert_eq!((msgs[0].seq, msgs[0].errno()), (7, Some(0)));
        assert_eq!((msgs[1].seq, msgs[1].errno()), (8, Some(-17)));
        assert_eq!(errno_error(-17).raw_os_error(), Some(17));
    }

    #[test]
    fn a_bad_length_ends_the_walk() {
        let mut buf = vec![0u8; 20];
        buf[..4].copy_from_slice(&200u32.to_ne_bytes());
        assert_eq!(messages(&buf).count(), 0);
        assert_eq!(messages(&[]).count(), 0);
    }
}
