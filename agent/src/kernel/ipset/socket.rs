//! [`IpsetNetlink`]: the ipset codec over a netfilter netlink socket.

use std::io;

use netlink_sys::protocols::NETLINK_NETFILTER;
use nix::errno::Errno;

use super::decode::{decode_list_message, each_message, merge_listing};
use super::encode::{encode_op, list_names_request, list_set_request};
use super::message::{IpsetCodecError, SetOp};
use super::sets::{Sets, is_owned};
use crate::kernel::netlink::socket::NetlinkSocket;

/// Operations per batch. Only failures and the batch's last request are answered, but
/// each answer holds about a kilobyte of the receive buffer until it is read, and that
/// buffer is 416 KiB where `net.core.rmem_max` is the default: a batch of 256 failures
/// fits (a lost answer would fail the whole call with `ENOBUFS`).
const OPS_PER_BATCH: usize = 256;

/// A netfilter netlink socket speaking to the kernel's ipset subsystem.
#[derive(Debug)]
pub struct IpsetNetlink {
    socket: NetlinkSocket,
}

fn invalid_data(error: IpsetCodecError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

impl IpsetNetlink {
    /// Opens a socket in the calling thread's network namespace.
    ///
    /// # Errors
    /// When the socket cannot be opened or bound.
    pub fn open() -> io::Result<Self> {
        Ok(Self {
            socket: NetlinkSocket::open(NETLINK_NETFILTER)?,
        })
    }

    /// Sends every op, in order and in batches, and returns one errno per op: 0 when
    /// done, a negative errno otherwise (the module docs list them). An op that cannot
    /// be encoded is not sent and gets `-EINVAL`. The kernel goes on after a failed op.
    ///
    /// # Errors
    /// When the socket fails; a refused op is not an error here.
    pub fn execute(&mut self, ops: &[SetOp<'_>]) -> io::Result<Vec<i32>> {
        let mut results = Vec::with_capacity(ops.len());
        for chunk in ops.chunks(OPS_PER_BATCH) {
            let mut requests = Vec::with_capacity(chunk.len());
            let mut sent = Vec::with_capacity(chunk.len());
            for op in chunk {
                let request = encode_op(op, 0);
                sent.push(request.is_ok());
                requests.extend(request.ok());
            }
            let mut answers = if requests.is_empty() {
                Vec::new()
            } else {
                self.socket.transact(requests)?
            }
            .into_iter();
            for sent in sent {
                let errno = if sent {
                    answers
                        .next()
                        .ok_or_else(|| io::Error::other("the kernel answered fewer requests"))?
                } else {
                    -(Errno::EINVAL as i32)
                };
                results.push(errno);
            }
        }
        Ok(results)
    }

    /// The names of every set that [`is_owned`] (one dump of names, no entries).
    ///
    /// # Errors
    /// When the socket fails, the kernel refuses the dump, or a reply is malformed.
    pub fn names(&mut self) -> io::Result<Vec<String>> {
        let names = self.socket.dump(list_names_request(0))?;
        let mut owned = Vec::new();
        for msg in each_message(&names).map_err(invalid_data)? {
            let msg = decode_list_message(msg).map_err(invalid_data)?;
            if is_owned(&msg.name) {
                owned.push(msg.name);
            }
        }
        Ok(owned)
    }

    /// Every set whose name [`is_owned`], with its spec and entries: one dump of the
    /// names, then one dump per owned set (sets of others are never read, however
    /// large). A set destroyed in between is left out; one of a type we do not create
    /// too, as [`super::sets::parse_save`] does. Entries are kept whatever their
    /// protocol (`parse_save` drops those it cannot spell: none of ours).
    ///
    /// # Errors
    /// When the socket fails, the kernel refuses a dump, or a reply is malformed.
    pub fn list(&mut self) -> io::Result<Sets> {
        let mut sets = Sets::new();
        for name in self.names()? {
            let request = list_set_request(&name, 0)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            let listing = match self.socket.dump(request) {
                Ok(listing) => listing,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            for msg in each_message(&listing).map_err(invalid_data)? {
                merge_listing(&mut sets, &decode_list_message(msg).map_err(invalid_data)?);
            }
        }
        Ok(sets)
    }
}
