//! The ipvs mode's kernel touchpoint: IPVS services and destinations (generic netlink),
//! the dummy interface and its addresses (rtnetlink), ipsets (nfnetlink), and sysctls. One trait, a real
//! implementation over netlink sockets, and a fake in [`fake`].

pub mod fake;

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::protocols::{NETLINK_GENERIC, NETLINK_ROUTE};

use crate::dataplane::DataplaneError;
use crate::kernel::ipset::{IpsetNetlink, SetOp, Sets};
use crate::kernel::ipvs::{
    IPVS_GENL_NAME, IpvsDestination, IpvsService, NetlinkBody, describe_service, socket_text,
};
use crate::kernel::ipvs::{decode, encode};
use crate::kernel::namespace::in_namespace;
use crate::kernel::netlink::socket::{self, NetlinkSocket};

/// One IPVS change, borrowing the service and destination it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpvsOp<'a> {
    /// `IPVS_CMD_NEW_SERVICE`.
    AddService(&'a IpvsService),
    /// `IPVS_CMD_SET_SERVICE`.
    UpdateService(&'a IpvsService),
    /// `IPVS_CMD_DEL_SERVICE`.
    DeleteService(&'a IpvsService),
    /// `IPVS_CMD_NEW_DEST`.
    AddDestination(&'a IpvsService, &'a IpvsDestination),
    /// `IPVS_CMD_SET_DEST`.
    UpdateDestination(&'a IpvsService, &'a IpvsDestination),
    /// `IPVS_CMD_DEL_DEST`.
    DeleteDestination(&'a IpvsService, &'a IpvsDestination),
}

impl IpvsOp<'_> {
    /// The request bytes (sequence number 0; the socket assigns it).
    #[must_use]
    pub fn encode(&self, family_id: u16) -> Vec<u8> {
        match *self {
            Self::AddService(s) => encode::add_service(family_id, 0, s),
            Self::UpdateService(s) => encode::update_service(family_id, 0, s),
            Self::DeleteService(s) => encode::delete_service(family_id, 0, s),
            Self::AddDestination(s, d) => encode::add_destination(family_id, 0, s, d),
            Self::UpdateDestination(s, d) => encode::update_destination(family_id, 0, s, d),
            Self::DeleteDestination(s, d) => encode::delete_destination(family_id, 0, s, d),
        }
    }
}

impl std::fmt::Display for IpvsOp<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (verb, svc, dest) = match *self {
            Self::AddService(s) => ("add service", s, None),
            Self::UpdateService(s) => ("update service", s, None),
            Self::DeleteService(s) => ("delete service", s, None),
            Self::AddDestination(s, d) => ("add real server", s, Some(d)),
            Self::UpdateDestination(s, d) => ("update real server", s, Some(d)),
            Self::DeleteDestination(s, d) => ("delete real server", s, Some(d)),
        };
        write!(f, "{verb} {}", describe_service(svc))?;
        if let Some(d) = dest {
            write!(f, " -> {} weight {}", socket_text(d.addr, d.port), d.weight)?;
        }
        Ok(())
    }
}

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

/// Address changes under way ([`IpvsKernel::begin_address_changes`]).
#[derive(Debug)]
pub enum AddressChanges {
    /// Already done.
    Done(Result<Vec<i32>, DataplaneError>),
    /// Running on a thread that owns the rtnetlink socket until it is done.
    Running(std::thread::JoinHandle<(NetlinkSocket, io::Result<Vec<i32>>)>),
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

/// Everything the ipvs mode asks of the kernel besides iptables and ipset.
pub trait IpvsKernel {
    /// Every IPVS virtual service (the caller keeps only those it owns).
    ///
    /// # Errors
    /// When IPVS cannot be read (module not loaded, no permission).
    fn services(&mut self) -> Result<Vec<IpvsService>, DataplaneError>;

    /// The real servers of `service`, with their connection counters.
    ///
    /// # Errors
    /// When they cannot be read.
    fn destinations(
        &mut self,
        service: &IpvsService,
    ) -> Result<Vec<IpvsDestination>, DataplaneError>;

    /// Runs `ops` in order and returns each one's errno (0 = done). One failed operation
    /// does not stop the rest.
    ///
    /// # Errors
    /// When the kernel could not be asked at all.
    fn execute(&mut self, ops: &[IpvsOp<'_>]) -> Result<Vec<i32>, DataplaneError>;

    /// The index of the interface called `name`, if there is one.
    ///
    /// # Errors
    /// When links cannot be listed.
    fn link_index(&mut self, name: &str) -> Result<Option<u32>, DataplaneError>;

    /// Creates a dummy interface called `name` (left down) and returns its index.
    ///
    /// # Errors
    /// When it cannot be created.
    fn create_dummy(&mut self, name: &str) -> Result<u32, DataplaneError>;

    /// Deletes the interface with index `index`.
    ///
    /// # Errors
    /// When it cannot be deleted.
    fn delete_link(&mut self, index: u32) -> Result<(), DataplaneError>;

    /// Every address of every interface.
    ///
    /// # Errors
    /// When addresses cannot be listed.
    fn addresses(&mut self) -> Result<Vec<InterfaceAddress>, DataplaneError>;

    /// Adds (`add`) or removes host addresses (/32, /128) on interface `index`; returns
    /// each one's errno.
    ///
    /// # Errors
    /// When the kernel could not be asked at all.
    fn change_addresses(
        &mut self,
        index: u32,
        addresses: &[IpAddr],
        add: bool,
    ) -> Result<Vec<i32>, DataplaneError>;

    /// Starts [`IpvsKernel::change_addresses`], on a thread of its own where the kernel
    /// can (a first apply's 10,000 addresses then go alongside the sets and IPVS, which
    /// take other kernel locks). [`IpvsKernel::finish_address_changes`] gives the results;
    /// until then the caller changes no other address. The default does the work at once.
    fn begin_address_changes(
        &mut self,
        index: u32,
        addresses: Vec<IpAddr>,
        add: bool,
    ) -> AddressChanges {
        AddressChanges::Done(self.change_addresses(index, &addresses, add))
    }

    /// Waits for changes [`IpvsKernel::begin_address_changes`] started; returns each
    /// address's errno.
    ///
    /// # Errors
    /// When the kernel could not be asked at all.
    fn finish_address_changes(
        &mut self,
        pending: AddressChanges,
    ) -> Result<Vec<i32>, DataplaneError> {
        match pending {
            AddressChanges::Done(result) => result,
            AddressChanges::Running(_) => Err(io_error(
                "changing interface addresses",
                io::Error::other("started by another kernel handle"),
            )),
        }
    }

    /// Reads a sysctl (`net/ipv4/vs/conntrack`); `None` when it does not exist.
    ///
    /// # Errors
    /// When it exists but cannot be read.
    fn read_sysctl(&mut self, name: &str) -> Result<Option<String>, DataplaneError>;

    /// Writes a sysctl.
    ///
    /// # Errors
    /// When it cannot be written.
    fn write_sysctl(&mut self, name: &str, value: &str) -> Result<(), DataplaneError>;

    /// Changes the agent's ipsets: one errno per op (0 when done; see
    /// [`super::ipset_netlink`] for what the others mean).
    ///
    /// # Errors
    /// When the kernel cannot be asked at all (a refused op is not an error here).
    fn set_ops(&mut self, ops: &[SetOp<'_>]) -> Result<Vec<i32>, DataplaneError>;

    /// The agent's ipsets with their entries.
    ///
    /// # Errors
    /// When the kernel cannot be asked.
    fn sets(&mut self) -> Result<Sets, DataplaneError>;

    /// The names of the agent's ipsets.
    ///
    /// # Errors
    /// When the kernel cannot be asked.
    fn set_names(&mut self) -> Result<Vec<String>, DataplaneError>;
}

fn io_error(context: impl Into<String>, source: io::Error) -> DataplaneError {
    DataplaneError::Io {
        context: context.into(),
        source,
    }
}

/// The real kernel, through netlink sockets and `/proc/sys`: those of the calling
/// thread's network namespace ([`NetlinkKernel::new`], opened on first use), or of a
/// named one ([`NetlinkKernel::in_netns`], for tests and tools that program a namespace
/// other than their own).
#[derive(Debug, Default)]
pub struct NetlinkKernel {
    genl: Option<(NetlinkSocket, u16)>,
    route: Option<NetlinkSocket>,
    ipset: Option<IpsetNetlink>,
    netns: Option<std::path::PathBuf>,
}

impl NetlinkKernel {
    /// A kernel handle for the calling thread's namespace; nothing is opened yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A kernel handle for the named network namespace (`/run/netns/NAME`), its sockets
    /// opened at once.
    ///
    /// # Errors
    /// When the namespace cannot be entered or the sockets cannot be opened there.
    pub fn in_netns(name: &str) -> Result<Self, DataplaneError> {
        let path = std::path::Path::new("/run/netns").join(name);
        let (genl, route, ipset) = in_namespace(&path, || {
            Ok((
                NetlinkSocket::open(NETLINK_GENERIC)?,
                NetlinkSocket::open(NETLINK_ROUTE)?,
                IpsetNetlink::open()?,
            ))
        })
        .map_err(|e| io_error(format!("opening netlink sockets in {}", path.display()), e))?;
        let mut kernel = Self {
            genl: None,
            route: Some(route),
            ipset: Some(ipset),
            netns: Some(path),
        };
        kernel.resolve(genl)?;
        Ok(kernel)
    }

    fn resolve(&mut self, mut socket: NetlinkSocket) -> Result<(), DataplaneError> {
        let reply = socket
            .request(encode::get_family(0, IPVS_GENL_NAME))
            .map_err(|e| {
                let context = if e.raw_os_error() == Some(2) {
                    "IPVS is not available in this kernel: load the ip_vs module \
                     (modprobe ip_vs) or use --mode iptables"
                } else {
                    "resolving the IPVS generic netlink family"
                };
                io_error(context, e)
            })?;
        let id = match decode::family_id_from_reply(&reply) {
            Ok(Ok(id)) => id,
            Ok(Err(errno)) => {
                return Err(io_error(
                    "resolving the IPVS generic netlink family",
                    socket::errno_error(errno),
                ));
            }
            Err(e) => {
                return Err(io_error(
                    "resolving the IPVS generic netlink family",
                    io::Error::new(io::ErrorKind::InvalidData, e),
                ));
            }
        };
        self.genl = Some((socket, id));
        Ok(())
    }

    fn in_own_namespace<T: Send>(
        &self,
        work: impl FnOnce() -> io::Result<T> + Send,
    ) -> io::Result<T> {
        match &self.netns {
            Some(path) => in_namespace(path, work),
            None => work(),
        }
    }

    fn ipvs(&mut self) -> Result<(&mut NetlinkSocket, u16), DataplaneError> {
        if self.genl.is_none() {
            let socket = NetlinkSocket::open(NETLINK_GENERIC)
                .map_err(|e| io_error("opening a generic netlink socket", e))?;
            self.resolve(socket)?;
        }
        match self.genl.as_mut() {
            Some((socket, id)) => Ok((socket, *id)),
            None => Err(io_error("IPVS socket", io::Error::other("not open"))),
        }
    }

    fn ipset(&mut self) -> Result<&mut IpsetNetlink, DataplaneError> {
        if self.ipset.is_none() {
            let socket = IpsetNetlink::open()
                .map_err(|e| io_error("opening a netfilter netlink socket for ipset", e))?;
            self.ipset = Some(socket);
        }
        match self.ipset.as_mut() {
            Some(socket) => Ok(socket),
            None => Err(io_error("ipset socket", io::Error::other("not open"))),
        }
    }

    fn route(&mut self) -> Result<&mut NetlinkSocket, DataplaneError> {
        if self.route.is_none() {
            // In the kernel's namespace: the socket may have gone with a failed thread.
            let socket = self
                .in_own_namespace(|| NetlinkSocket::open(NETLINK_ROUTE))
                .map_err(|e| io_error("opening an rtnetlink socket", e))?;
            self.route = Some(socket);
        }
        match self.route.as_mut() {
            Some(socket) => Ok(socket),
            None => Err(io_error("rtnetlink socket", io::Error::other("not open"))),
        }
    }

    fn decode_ipvs(
        bytes: &[u8],
        family_id: u16,
    ) -> Result<Vec<crate::kernel::ipvs::NetlinkMessage>, DataplaneError> {
        decode::decode(bytes, family_id).map_err(|e| {
            io_error(
                "decoding an IPVS reply",
                io::Error::new(io::ErrorKind::InvalidData, e),
            )
        })
    }
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

impl IpvsKernel for NetlinkKernel {
    fn services(&mut self) -> Result<Vec<IpvsService>, DataplaneError> {
        let (socket, id) = self.ipvs()?;
        let bytes = socket
            .dump(encode::list_services(id, 0))
            .map_err(|e| io_error("listing IPVS services", e))?;
        Ok(Self::decode_ipvs(&bytes, id)?
            .into_iter()
            .filter_map(|m| match m.body {
                NetlinkBody::Ipvs { attributes, .. } => attributes.service,
                _ => None,
            })
            .collect())
    }

    fn destinations(
        &mut self,
        service: &IpvsService,
    ) -> Result<Vec<IpvsDestination>, DataplaneError> {
        let (socket, id) = self.ipvs()?;
        let bytes = socket
            .dump(encode::list_destinations(id, 0, service))
            .map_err(|e| {
                io_error(
                    format!("listing the real servers of {}", describe_service(service)),
                    e,
                )
            })?;
        Ok(Self::decode_ipvs(&bytes, id)?
            .into_iter()
            .filter_map(|m| match m.body {
                NetlinkBody::Ipvs { attributes, .. } => attributes.destination,
                _ => None,
            })
            .collect())
    }

    fn execute(&mut self, ops: &[IpvsOp<'_>]) -> Result<Vec<i32>, DataplaneError> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let (socket, id) = self.ipvs()?;
        socket
            .transact(ops.iter().map(|op| op.encode(id)))
            .map_err(|e| io_error("sending IPVS changes", e))
    }

    fn link_index(&mut self, name: &str) -> Result<Option<u32>, DataplaneError> {
        let socket = self.route()?;
        let mut message = LinkMessage::default();
        message
            .attributes
            .push(LinkAttribute::IfName(name.to_owned()));
        let request = route_message(RouteNetlinkMessage::GetLink(message), NLM_F_REQUEST);
        match socket.request(request) {
            Ok(reply) => Ok(parse_route(&reply).into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(link) => Some(link.header.index),
                _ => None,
            })),
            // ENODEV: no such interface.
            Err(e) if e.raw_os_error() == Some(19) => Ok(None),
            Err(e) => Err(io_error(format!("looking up interface {name}"), e)),
        }
    }

    fn create_dummy(&mut self, name: &str) -> Result<u32, DataplaneError> {
        let socket = self.route()?;
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
        let errno = socket
            .transact([request])
            .map_err(|e| io_error(format!("creating dummy interface {name}"), e))?;
        match errno.first() {
            Some(0) | Some(-17) => {}
            Some(&e) => {
                return Err(io_error(
                    format!("creating dummy interface {name} (is the dummy module available?)"),
                    socket::errno_error(e),
                ));
            }
            None => {}
        }
        self.link_index(name)?.ok_or_else(|| {
            io_error(
                format!("creating dummy interface {name}"),
                io::Error::other("created but not found"),
            )
        })
    }

    fn delete_link(&mut self, index: u32) -> Result<(), DataplaneError> {
        let socket = self.route()?;
        let mut message = LinkMessage::default();
        message.header.index = index;
        let request = route_message(
            RouteNetlinkMessage::DelLink(message),
            NLM_F_REQUEST | NLM_F_ACK,
        );
        let errno = socket
            .transact([request])
            .map_err(|e| io_error(format!("deleting interface {index}"), e))?;
        match errno.first() {
            Some(0) | Some(-19) | None => Ok(()),
            Some(&e) => Err(io_error(
                format!("deleting interface {index}"),
                socket::errno_error(e),
            )),
        }
    }

    fn addresses(&mut self) -> Result<Vec<InterfaceAddress>, DataplaneError> {
        let socket = self.route()?;
        let request = route_message(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_REQUEST | NLM_F_DUMP,
        );
        let bytes = socket
            .dump(request)
            .map_err(|e| io_error("listing interface addresses", e))?;
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

    fn change_addresses(
        &mut self,
        index: u32,
        addresses: &[IpAddr],
        add: bool,
    ) -> Result<Vec<i32>, DataplaneError> {
        if addresses.is_empty() {
            return Ok(Vec::new());
        }
        self.route()?
            .transact(address_requests(index, addresses, add))
            .map_err(|e| io_error("changing interface addresses", e))
    }

    fn begin_address_changes(
        &mut self,
        index: u32,
        addresses: Vec<IpAddr>,
        add: bool,
    ) -> AddressChanges {
        if let Err(e) = self.route() {
            return AddressChanges::Done(Err(e));
        }
        let Some(mut socket) = self.route.take() else {
            return AddressChanges::Done(Err(io_error(
                "rtnetlink socket",
                io::Error::other("not open"),
            )));
        };
        // The socket stays in its namespace whichever thread uses it.
        AddressChanges::Running(std::thread::spawn(move || {
            let result = socket.transact(address_requests(index, &addresses, add));
            (socket, result)
        }))
    }

    fn finish_address_changes(
        &mut self,
        pending: AddressChanges,
    ) -> Result<Vec<i32>, DataplaneError> {
        match pending {
            AddressChanges::Done(result) => result,
            AddressChanges::Running(thread) => {
                let (socket, result) = thread.join().map_err(|_| {
                    io_error(
                        "changing interface addresses",
                        io::Error::other("the address thread panicked"),
                    )
                })?;
                self.route = Some(socket);
                result.map_err(|e| io_error("changing interface addresses", e))
            }
        }
    }

    fn read_sysctl(&mut self, name: &str) -> Result<Option<String>, DataplaneError> {
        let path = format!("/proc/sys/{name}");
        match self.in_own_namespace(|| std::fs::read_to_string(&path)) {
            Ok(text) => Ok(Some(text.trim().to_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error(format!("reading {path}"), e)),
        }
    }

    fn write_sysctl(&mut self, name: &str, value: &str) -> Result<(), DataplaneError> {
        let path = format!("/proc/sys/{name}");
        self.in_own_namespace(|| std::fs::write(&path, value))
            .map_err(|e| io_error(format!("writing {value} to {path}"), e))
    }

    fn set_ops(&mut self, ops: &[SetOp<'_>]) -> Result<Vec<i32>, DataplaneError> {
        self.ipset()?
            .execute(ops)
            .map_err(|e| io_error("changing ipsets over netlink", e))
    }

    fn sets(&mut self) -> Result<Sets, DataplaneError> {
        self.ipset()?
            .list()
            .map_err(|e| io_error("listing ipsets over netlink", e))
    }

    fn set_names(&mut self) -> Result<Vec<String>, DataplaneError> {
        self.ipset()?
            .names()
            .map_err(|e| io_error("listing ipset names over netlink", e))
    }
}
