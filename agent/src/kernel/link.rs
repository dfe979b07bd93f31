//! Links and addresses over rtnetlink: the dummy interface that holds the ipvs mode's
//! VIPs, the addresses on it, and every address of the node.

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::protocols::NETLINK_ROUTE;

use crate::kernel::error::DataplaneError;
use crate::kernel::netlink::socket::{self, NetlinkSocket};

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

/// An rtnetlink socket of one network namespace (the one it was opened in, whichever
/// thread uses it).
#[derive(Debug)]
pub struct Links {
    socket: NetlinkSocket,
}

impl Links {
    /// Opens an rtnetlink socket in the calling thread's network namespace.
    ///
    /// # Errors
    /// When the socket cannot be opened or bound.
    pub fn open() -> io::Result<Self> {
        Ok(Self {
            socket: NetlinkSocket::open(NETLINK_ROUTE)?,
        })
    }

    /// The index of the interface called `name`, if there is one.
    ///
    /// # Errors
    /// When links cannot be listed.
    pub fn link_index(&mut self, name: &str) -> Result<Option<u32>, DataplaneError> {
        let mut message = LinkMessage::default();
        message
            .attributes
            .push(LinkAttribute::IfName(name.to_owned()));
        let request = route_message(RouteNetlinkMessage::GetLink(message), NLM_F_REQUEST);
        match self.socket.request(request) {
            Ok(reply) => Ok(parse_route(&reply).into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(link) => Some(link.header.index),
                _ => None,
            })),
            // ENODEV: no such interface.
            Err(e) if e.raw_os_error() == Some(19) => Ok(None),
            Err(e) => Err(DataplaneError::io(
                format!("looking up interface {name}"),
                e,
            )),
        }
    }

    /// Creates a dummy interface called `name` (left down) and returns its index.
    ///
    /// # Errors
    /// When it cannot be created.
    pub fn create_dummy(&mut self, name: &str) -> Result<u32, DataplaneError> {
        let mut message = LinkMessage::default();
        message
            .attributes
            .push(LinkAttribute::IfName(name.to_owned()));
        message
            .attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::Dummy,
            )]));
        let request = route_message(
            RouteNetlinkMessage::NewLink(message),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        );
        let errno = self
            .socket
            .transact([request])
            .map_err(|e| DataplaneError::io(format!("creating dummy interface {name}"), e))?;
        match errno.first() {
            Some(0) | Some(-17) => {}
            Some(&e) => {
                return Err(DataplaneError::io(
                    format!("creating dummy interface {name} (is the dummy module available?)"),
                    socket::errno_error(e),
                ));
            }
            None => {}
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
        let mut message = LinkMessage::default();
        message.header.index = index;
        let request = route_message(
            RouteNetlinkMessage::DelLink(message),
            NLM_F_REQUEST | NLM_F_ACK,
        );
        let errno = self
            .socket
            .transact([request])
            .map_err(|e| DataplaneError::io(format!("deleting interface {index}"), e))?;
        match errno.first() {
            Some(0) | Some(-19) | None => Ok(()),
            Some(&e) => Err(DataplaneError::io(
                format!("deleting interface {index}"),
                socket::errno_error(e),
            )),
        }
    }

    /// Every address of every interface.
    ///
    /// # Errors
    /// When addresses cannot be listed.
    pub fn addresses(&mut self) -> Result<Vec<InterfaceAddress>, DataplaneError> {
        let request = route_message(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_REQUEST | NLM_F_DUMP,
        );
        let bytes = self
            .socket
            .dump(request)
            .map_err(|e| DataplaneError::io("listing interface addresses", e))?;
        Ok(parse_route(&bytes)
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) => {
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
                }
                _ => None,
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
        if addresses.is_empty() {
            return Ok(Vec::new());
        }
        self.socket
            .transact(address_requests(index, addresses, add))
            .map_err(changing)
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
            let result = self
                .socket
                .transact(address_requests(index, &addresses, add));
            (self, result)
        }))
    }
}

/// The rtnetlink requests that add or remove host addresses on interface `index`.
fn address_requests(
    index: u32,
    addresses: &[IpAddr],
    add: bool,
) -> impl Iterator<Item = Vec<u8>> + '_ {
    addresses.iter().map(move |ip| {
        let message = host_address(index, *ip);
        if add {
            route_message(
                RouteNetlinkMessage::NewAddress(message),
                NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
            )
        } else {
            route_message(
                RouteNetlinkMessage::DelAddress(message),
                NLM_F_REQUEST | NLM_F_ACK,
            )
        }
    })
}

fn route_message(message: RouteNetlinkMessage, flags: u16) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    buf
}

fn parse_route(bytes: &[u8]) -> Vec<RouteNetlinkMessage> {
    socket::messages(bytes)
        .filter_map(|m| NetlinkMessage::<RouteNetlinkMessage>::deserialize(m.bytes).ok())
        .filter_map(|m| match m.payload {
            NetlinkPayload::InnerMessage(inner) => Some(inner),
            _ => None,
        })
        .collect()
}

fn host_address(index: u32, ip: IpAddr) -> AddressMessage {
    let mut message = AddressMessage::default();
    message.header.index = index;
    match ip {
        IpAddr::V4(_) => {
            message.header.family = AddressFamily::Inet;
            message.header.prefix_len = 32;
        }
        IpAddr::V6(_) => {
            message.header.family = AddressFamily::Inet6;
            message.header.prefix_len = 128;
            // No duplicate address detection: the VIP is usable at once.
            message.header.flags = AddressHeaderFlags::Nodad;
        }
    }
    message.attributes.push(AddressAttribute::Local(ip));
    message.attributes.push(AddressAttribute::Address(ip));
    message
}
