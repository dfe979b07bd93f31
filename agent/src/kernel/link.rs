//! Links and addresses over rtnetlink (the `rtnetlink` crate): the dummy interface that
//! holds the ipvs mode's VIPs, the addresses on it, and every address of the node.
//!
//! Lookups, the dummy interface and the address dump go through [`rtnetlink::Handle`].
//! Adding or removing many addresses at once (a first apply adds 10,000 VIPs) goes
//! through a second connection of the same crate ([`rtnetlink::proto`]) in batches:
//! many requests in one datagram, only the last one acked, as the `Handle` (one request,
//! one datagram, one ack at a time) cannot. The kernel answers every failure of a batch
//! on its own, so each address still gets its errno.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::channel::mpsc::UnboundedReceiver;
use futures::{StreamExt, TryStreamExt};
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage};
use rtnetlink::proto::sys::protocols::NETLINK_ROUTE;
use rtnetlink::proto::sys::{AsyncSocket, SocketAddr};
use rtnetlink::proto::{ConnectionHandle, ReplyExpectation};
use rtnetlink::{AddressMessageBuilder, Handle, LinkDummy};
use tokio::runtime::Runtime;

use crate::kernel::error::DataplaneError;
use crate::kernel::netlink::socket::errno_error;

/// Address requests per batch. Only failures and the batch's last request are answered,
/// each answer holding up to a kilobyte of the receive buffer until it is read: a batch
/// of failures fits.
const ADDRESSES_PER_BATCH: usize = 256;
/// Receive buffer asked of the kernel for the batch connection.
const RECEIVE_BUFFER: usize = 4 * 1024 * 1024;
/// `ENOBUFS`: answers were lost to a full receive buffer.
const ENOBUFS: i32 = 105;

/// An address on an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InterfaceAddress {
    /// The interface index.
    pub index: u32,
    /// The address.
    pub ip: IpAddr,
    /// Its prefix length.
    pub prefix_len: u8,
}

/// Address changes under way (see [`Links::spawn_address_changes`]).
#[derive(Debug)]
pub enum AddressChanges {
    /// Already done: one errno per address, or why the kernel could not be asked.
    Done(Result<Vec<i32>, DataplaneError>),
    /// Running on a thread that owns the [`Links`] until it is done.
    Running(std::thread::JoinHandle<(Links, io::Result<Vec<i32>>)>),
}

impl AddressChanges {
    /// Waits for the changes: the [`Links`] the thread had (none when they were done at
    /// once or the thread panicked) and one errno per address.
    pub fn wait(self) -> (Option<Links>, Result<Vec<i32>, DataplaneError>) {
        match self {
            Self::Done(result) => (None, result),
            Self::Running(thread) => match thread.join() {
                Ok((links, result)) => (Some(links), result.map_err(changing)),
                Err(_) => (
                    None,
                    Err(changing(io::Error::other("the address thread panicked"))),
                ),
            },
        }
    }
}

fn changing(source: io::Error) -> DataplaneError {
    DataplaneError::io("changing interface addresses", source)
}

/// rtnetlink connections in one network namespace: the one they were opened in,
/// whichever thread uses them. They run on a runtime of their own, a current-thread one
/// driven only while a call waits for the kernel, so these calls block and must not be
/// made from async code.
#[derive(Debug)]
pub struct Links {
    runtime: Runtime,
    handle: Handle,
    batches: ConnectionHandle<RouteNetlinkMessage>,
    /// Answers to requests nobody waits for: the failures of a batch.
    unsolicited: UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>,
}

/// The (negative) errno of a refused request, or the error when the kernel was not asked.
fn errno_of(error: rtnetlink::Error) -> io::Result<i32> {
    match error {
        rtnetlink::Error::NetlinkError(message) => Ok(message.code.map_or(0, |c| c.get())),
        other => Err(io::Error::other(other)),
    }
}

/// `result` as an errno: 0 when done.
fn errno(result: Result<(), rtnetlink::Error>) -> io::Result<i32> {
    result.map_or_else(errno_of, |()| Ok(0))
}

impl Links {
    /// Opens the connections in the calling thread's network namespace.
    ///
    /// # Errors
    /// When their runtime cannot be built or a socket cannot be opened or bound.
    pub fn open() -> io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        // The sockets register with the runtime that drives them.
        let entered = runtime.enter();
        let (connection, handle, _) = rtnetlink::new_connection()?;
        runtime.spawn(connection);
        let (mut connection, batches, unsolicited) =
            rtnetlink::proto::new_connection::<RouteNetlinkMessage>(NETLINK_ROUTE)?;
        let socket = connection.socket_mut().socket_mut();
        // Failures carry only the request's header, not the whole request back.
        socket.set_cap_ack(true)?;
        // Best effort: the default is enough for most batches.
        let _ = socket.set_rx_buf_sz(RECEIVE_BUFFER);
        // The last ack of a batch tells its sequence numbers.
        connection.set_forward_ack(true);
        runtime.spawn(connection);
        drop(entered);
        Ok(Self {
            runtime,
            handle,
            batches,
            unsolicited,
        })
    }

    /// The index of the interface called `name`, if there is one.
    ///
    /// # Errors
    /// When links cannot be listed.
    pub fn link_index(&mut self, name: &str) -> Result<Option<u32>, DataplaneError> {
        let request = self.handle.link().get().match_name(name).execute();
        let found = self.runtime.block_on(async move {
            let mut links = std::pin::pin!(request);
            let link = links.try_next().await?;
            Ok(link.map(|l| l.header.index))
        });
        match found {
            Ok(index) => Ok(index),
            Err(e) => match errno_of(e) {
                // ENODEV: no such interface.
                Ok(-19) => Ok(None),
                Ok(errno) => Err(DataplaneError::io(
                    format!("looking up interface {name}"),
                    errno_error(errno),
                )),
                Err(e) => Err(DataplaneError::io(
                    format!("looking up interface {name}"),
                    e,
                )),
            },
        }
    }

    /// Creates a dummy interface called `name` (left down) and returns its index.
    ///
    /// # Errors
    /// When it cannot be created.
    pub fn create_dummy(&mut self, name: &str) -> Result<u32, DataplaneError> {
        let request = self
            .handle
            .link()
            .add(LinkDummy::new(name).build())
            .execute();
        let errno = errno(self.runtime.block_on(request))
            .map_err(|e| DataplaneError::io(format!("creating dummy interface {name}"), e))?;
        // EEXIST: it is there already.
        if errno != 0 && errno != -17 {
            return Err(DataplaneError::io(
                format!("creating dummy interface {name} (is the dummy module available?)"),
                errno_error(errno),
            ));
        }
        self.link_index(name)?.ok_or_else(|| {
            DataplaneError::io(
                format!("creating dummy interface {name}"),
                io::Error::other("created but not found"),
            )
        })
    }

    /// Deletes the interface with index `index` (done when it is already gone).
    ///
    /// # Errors
    /// When it cannot be deleted.
    pub fn delete_link(&mut self, index: u32) -> Result<(), DataplaneError> {
        let request = self.handle.link().del(index).execute();
        let errno = errno(self.runtime.block_on(request))
            .map_err(|e| DataplaneError::io(format!("deleting interface {index}"), e))?;
        match errno {
            // ENODEV: already gone.
            0 | -19 => Ok(()),
            errno => Err(DataplaneError::io(
                format!("deleting interface {index}"),
                errno_error(errno),
            )),
        }
    }

    /// Every address of every interface.
    ///
    /// # Errors
    /// When addresses cannot be listed.
    pub fn addresses(&mut self) -> Result<Vec<InterfaceAddress>, DataplaneError> {
        let request = self.handle.address().get().execute();
        let messages: Vec<AddressMessage> = self
            .runtime
            .block_on(request.try_collect())
            .map_err(|e| DataplaneError::io("listing interface addresses", io::Error::other(e)))?;
        Ok(messages
            .iter()
            .filter_map(|a| {
                let ip = a.attributes.iter().find_map(|attr| match attr {
                    AddressAttribute::Local(ip) => Some(*ip),
                    _ => None,
                });
                let ip = ip.or_else(|| {
                    a.attributes.iter().find_map(|attr| match attr {
                        AddressAttribute::Address(ip) => Some(*ip),
                        _ => None,
                    })
                })?;
                Some(InterfaceAddress {
                    index: a.header.index,
                    ip,
                    prefix_len: a.header.prefix_len,
                })
            })
            .collect())
    }

    /// Adds (`add`) or removes host addresses (/32, /128) on interface `index`; returns
    /// each one's errno.
    ///
    /// # Errors
    /// When the kernel could not be asked at all.
    pub fn change_addresses(
        &mut self,
        index: u32,
        addresses: &[IpAddr],
        add: bool,
    ) -> Result<Vec<i32>, DataplaneError> {
        self.send_address_changes(index, addresses, add)
            .map_err(changing)
    }

    /// The requests of [`Links::change_addresses`], in batches.
    fn send_address_changes(
        &mut self,
        index: u32,
        addresses: &[IpAddr],
        add: bool,
    ) -> io::Result<Vec<i32>> {
        let mut results = Vec::with_capacity(addresses.len());
        for chunk in addresses.chunks(ADDRESSES_PER_BATCH) {
            let requests = chunk.iter().map(|ip| host_address_request(index, *ip, add));
            let batch = self.runtime.block_on(send_batch(
                &self.batches,
                &mut self.unsolicited,
                requests.collect(),
            ))?;
            results.extend(batch);
        }
        Ok(results)
    }

    /// [`Links::change_addresses`] on a thread of its own, which owns these links until
    /// [`AddressChanges::wait`] gives them back.
    #[must_use]
    pub fn spawn_address_changes(
        mut self,
        index: u32,
        addresses: Vec<IpAddr>,
        add: bool,
    ) -> AddressChanges {
        AddressChanges::Running(std::thread::spawn(move || {
            let result = self.send_address_changes(index, &addresses, add);
            (self, result)
        }))
    }
}

/// The request that adds or removes host address `ip` on interface `index`.
fn host_address_request(index: u32, ip: IpAddr, add: bool) -> NetlinkMessage<RouteNetlinkMessage> {
    let message = match ip {
        IpAddr::V4(ip) => AddressMessageBuilder::<Ipv4Addr>::new()
            .index(index)
            .address(ip, 32)
            .build(),
        IpAddr::V6(ip) => {
            let mut message = AddressMessageBuilder::<Ipv6Addr>::new()
                .index(index)
                .address(ip, 128)
                .build();
            // No duplicate address detection: the VIP is usable at once.
            message.header.flags = AddressHeaderFlags::Nodad;
            message
        }
    };
    let (payload, flags) = if add {
        (
            RouteNetlinkMessage::NewAddress(message),
            NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL,
        )
    } else {
        (RouteNetlinkMessage::DelAddress(message), NLM_F_REQUEST)
    };
    let mut request = NetlinkMessage::from(payload);
    request.header.flags = flags;
    request
}

/// The code of an answer: 0 for an ack, a negative errno for a failure.
fn answer_code(message: &NetlinkMessage<RouteNetlinkMessage>) -> Option<i32> {
    match &message.payload {
        NetlinkPayload::Error(error) => Some(error.code.map_or(0, |c| c.get())),
        _ => None,
    }
}

/// Sends `requests` in one datagram, only the last asking for an ack, and returns each
/// one's errno (0: done). The kernel handles them in order and answers every failure
/// (those come in as unsolicited messages, by sequence number) before the last ack.
async fn send_batch(
    connection: &ConnectionHandle<RouteNetlinkMessage>,
    unsolicited: &mut UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>,
    requests: Vec<NetlinkMessage<RouteNetlinkMessage>>,
) -> io::Result<Vec<i32>> {
    let count = requests.len();
    if count == 0 {
        return Ok(Vec::new());
    }
    let batch = requests.into_iter().enumerate().map(|(i, mut request)| {
        if i + 1 == count {
            request.header.flags |= NLM_F_ACK;
            (request, ReplyExpectation::Expected)
        } else {
            (request, ReplyExpectation::NotExpected)
        }
    });
    let mut answers = connection
        .request_batch_with_expectation(batch, SocketAddr::new(0, 0))
        .map_err(io::Error::other)?;
    let mut results = vec![0; count];
    let mut last = None;
    let mut failures = Vec::new();
    loop {
        tokio::select! {
            biased;
            answer = answers.next() => match answer {
                Some(message) => {
                    last = Some(message.header.sequence_number);
                    if let (Some(code), Some(slot)) = (answer_code(&message), results.last_mut()) {
                        *slot = code;
                    }
                }
                None => break,
            },
            Some((message, _)) = unsolicited.next() => {
                if matches!(message.payload, NetlinkPayload::Overrun(_)) {
                    return Err(io::Error::from_raw_os_error(ENOBUFS));
                }
                if let Some(code) = answer_code(&message) {
                    failures.push((message.header.sequence_number, code));
                }
            }
        }
    }
    let last = last.ok_or_else(|| io::Error::other("the rtnetlink connection closed"))?;
    // Failures read with the last ack, still queued.
    while let Ok((message, _)) = unsolicited.try_recv() {
        if let Some(code) = answer_code(&message) {
            failures.push((message.header.sequence_number, code));
        }
    }
    let first = last.wrapping_sub(count as u32 - 1);
    for (seq, code) in failures {
        let index = seq.wrapping_sub(first) as usize;
        if let Some(slot) = results.get_mut(index).filter(|_| index < count - 1) {
            *slot = code;
        }
    }
    Ok(results)
}
