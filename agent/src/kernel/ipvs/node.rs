//! [`IpvsKernel`]: everything the ipvs mode asks of the kernel besides iptables, one
//! trait over several conversations (IPVS over generic netlink, links and addresses,
//! sysctls, ipsets). [`NetlinkKernel`] is the real one, [`super::fake::FakeIpvsKernel`]
//! the fake.

use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use netlink_sys::protocols::NETLINK_GENERIC;

use super::decode;
use super::encode;
use super::message::{NetlinkBody, NetlinkMessage};
use super::types::{IpvsDestination, IpvsService, IpvsTimeouts, describe_service, socket_text};
use super::uapi::IPVS_GENL_NAME;
use crate::kernel::error::DataplaneError;
use crate::kernel::ipset::message::SetOp;
use crate::kernel::ipset::sets::Sets;
use crate::kernel::ipset::socket::IpsetNetlink;
use crate::kernel::link::{AddressChanges, InterfaceAddress, Links};
use crate::kernel::namespace::in_namespace;
use crate::kernel::netlink::socket::{self, NetlinkSocket};
use crate::kernel::sysctl;

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

/// Everything the ipvs mode asks of the kernel besides iptables: IPVS, links and
/// addresses, sysctls and ipsets.
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

    /// Sets IPVS's connection timeouts (`IPVS_CMD_SET_CONFIG`, `ipvsadm --set`); a 0
    /// leaves that timeout as the kernel has it.
    ///
    /// # Errors
    /// When the kernel refuses or cannot be asked.
    fn set_timeouts(&mut self, timeouts: IpvsTimeouts) -> Result<(), DataplaneError>;

    /// IPVS's connection timeouts (`IPVS_CMD_GET_CONFIG`, `ipvsadm -L --timeout`).
    ///
    /// # Errors
    /// When the kernel refuses or cannot be asked.
    fn timeouts(&mut self) -> Result<IpvsTimeouts, DataplaneError>;

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
            AddressChanges::Running(_) => Err(DataplaneError::io(
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
    /// [`crate::kernel::ipset`] for what the others mean).
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

/// The real kernel, through netlink sockets and `/proc/sys`: those of the calling
/// thread's network namespace ([`NetlinkKernel::new`], opened on first use), or of a
/// named one ([`NetlinkKernel::in_netns`], for tests and tools that program a namespace
/// other than their own).
#[derive(Debug, Default)]
pub struct NetlinkKernel {
    genl: Option<(NetlinkSocket, u16)>,
    links: Option<Links>,
    ipset: Option<IpsetNetlink>,
    netns: Option<PathBuf>,
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
        let path = Path::new("/run/netns").join(name);
        let (genl, links, ipset) = in_namespace(&path, || {
            Ok((
                NetlinkSocket::open(NETLINK_GENERIC)?,
                Links::open()?,
                IpsetNetlink::open()?,
            ))
        })
        .map_err(|e| {
            DataplaneError::io(format!("opening netlink sockets in {}", path.display()), e)
        })?;
        let mut kernel = Self {
            genl: None,
            links: Some(links),
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
                DataplaneError::io(context, e)
            })?;
        let id = match decode::family_id_from_reply(&reply) {
            Ok(Ok(id)) => id,
            Ok(Err(errno)) => {
                return Err(DataplaneError::io(
                    "resolving the IPVS generic netlink family",
                    socket::errno_error(errno),
                ));
            }
            Err(e) => {
                return Err(DataplaneError::io(
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
                .map_err(|e| DataplaneError::io("opening a generic netlink socket", e))?;
            self.resolve(socket)?;
        }
        match self.genl.as_mut() {
            Some((socket, id)) => Ok((socket, *id)),
            None => Err(DataplaneError::io(
                "IPVS socket",
                io::Error::other("not open"),
            )),
        }
    }

    fn ipset(&mut self) -> Result<&mut IpsetNetlink, DataplaneError> {
        let socket = match self.ipset.take() {
            Some(socket) => socket,
            None => IpsetNetlink::open().map_err(|e| {
                DataplaneError::io("opening a netfilter netlink socket for ipset", e)
            })?,
        };
        Ok(self.ipset.insert(socket))
    }

    /// The links, opened if need be, taken out of the kernel handle.
    fn take_links(&mut self) -> Result<Links, DataplaneError> {
        match self.links.take() {
            Some(links) => Ok(links),
            // In the kernel's namespace: the links may have gone with a failed thread.
            None => self
                .in_own_namespace(Links::open)
                .map_err(|e| DataplaneError::io("opening an rtnetlink socket", e)),
        }
    }

    fn links(&mut self) -> Result<&mut Links, DataplaneError> {
        let links = self.take_links()?;
        Ok(self.links.insert(links))
    }

    fn decode_ipvs(bytes: &[u8], family_id: u16) -> Result<Vec<NetlinkMessage>, DataplaneError> {
        decode::decode(bytes, family_id).map_err(|e| {
            DataplaneError::io(
                "decoding an IPVS reply",
                io::Error::new(io::ErrorKind::InvalidData, e),
            )
        })
    }
}

impl IpvsKernel for NetlinkKernel {
    fn services(&mut self) -> Result<Vec<IpvsService>, DataplaneError> {
        let (socket, id) = self.ipvs()?;
        let bytes = socket
            .dump(encode::list_services(id, 0))
            .map_err(|e| DataplaneError::io("listing IPVS services", e))?;
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
                DataplaneError::io(
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
            .map_err(|e| DataplaneError::io("sending IPVS changes", e))
    }

    fn set_timeouts(&mut self, timeouts: IpvsTimeouts) -> Result<(), DataplaneError> {
        let (socket, id) = self.ipvs()?;
        let errnos = socket
            .transact(std::iter::once(encode::set_config(id, 0, timeouts)))
            .map_err(|e| DataplaneError::io("setting IPVS timeouts", e))?;
        match errnos.first() {
            Some(0) => Ok(()),
            Some(&errno) => Err(DataplaneError::io(
                "setting IPVS timeouts",
                socket::errno_error(errno),
            )),
            None => Err(DataplaneError::io(
                "setting IPVS timeouts",
                io::Error::other("no answer"),
            )),
        }
    }

    fn timeouts(&mut self) -> Result<IpvsTimeouts, DataplaneError> {
        let (socket, id) = self.ipvs()?;
        let bytes = socket
            .request(encode::get_config(id, 0))
            .map_err(|e| DataplaneError::io("reading IPVS timeouts", e))?;
        Self::decode_ipvs(&bytes, id)?
            .into_iter()
            .find_map(|m| m.body.ipvs_attributes().and_then(|a| a.timeouts))
            .ok_or_else(|| {
                DataplaneError::io(
                    "reading IPVS timeouts",
                    io::Error::new(io::ErrorKind::InvalidData, "reply without timeouts"),
                )
            })
    }

    fn link_index(&mut self, name: &str) -> Result<Option<u32>, DataplaneError> {
        self.links()?.link_index(name)
    }

    fn create_dummy(&mut self, name: &str) -> Result<u32, DataplaneError> {
        self.links()?.create_dummy(name)
    }

    fn delete_link(&mut self, index: u32) -> Result<(), DataplaneError> {
        self.links()?.delete_link(index)
    }

    fn addresses(&mut self) -> Result<Vec<InterfaceAddress>, DataplaneError> {
        self.links()?.addresses()
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
        self.links()?.change_addresses(index, addresses, add)
    }

    fn begin_address_changes(
        &mut self,
        index: u32,
        addresses: Vec<IpAddr>,
        add: bool,
    ) -> AddressChanges {
        match self.take_links() {
            // The links stay in their namespace whichever thread uses them.
            Ok(links) => links.spawn_address_changes(index, addresses, add),
            Err(e) => AddressChanges::Done(Err(e)),
        }
    }

    fn finish_address_changes(
        &mut self,
        pending: AddressChanges,
    ) -> Result<Vec<i32>, DataplaneError> {
        let (links, result) = pending.wait();
        if links.is_some() {
            self.links = links;
        }
        result
    }

    fn read_sysctl(&mut self, name: &str) -> Result<Option<String>, DataplaneError> {
        sysctl::read(self.netns.as_deref(), name)
    }

    fn write_sysctl(&mut self, name: &str, value: &str) -> Result<(), DataplaneError> {
        sysctl::write(self.netns.as_deref(), name, value)
    }

    fn set_ops(&mut self, ops: &[SetOp<'_>]) -> Result<Vec<i32>, DataplaneError> {
        self.ipset()?
            .execute(ops)
            .map_err(|e| DataplaneError::io("changing ipsets over netlink", e))
    }

    fn sets(&mut self) -> Result<Sets, DataplaneError> {
        self.ipset()?
            .list()
            .map_err(|e| DataplaneError::io("listing ipsets over netlink", e))
    }

    fn set_names(&mut self) -> Result<Vec<String>, DataplaneError> {
        self.ipset()?
            .names()
            .map_err(|e| DataplaneError::io("listing ipset names over netlink", e))
    }
}
