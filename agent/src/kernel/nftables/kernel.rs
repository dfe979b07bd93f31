//! [`NftKernel`]: what the nftables mode asks of nf_tables, one trait with the real
//! [`NetlinkNft`] here (the benches wrap it to time each call).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::batch::Transaction;
use super::error::NftCodecError;
use super::monitor::{Heard, NftMonitor, TableAlarm, Touched};
use super::objects::{
    Chain, ElementRef, Rule, Set, decode_elements, dump_elements_request, dump_request,
    get_table_request, split,
};
use super::socket::{NftNetlink, Refusal};
use super::uapi::{NFT_MSG_GETCHAIN, NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_SET_EVAL};
use crate::kernel::ChangeAlarm;
use crate::kernel::error::DataplaneError;
use crate::kernel::namespace::in_namespace;

/// One object of a table, as [`NftKernel::read_table`] hands them over: the chains,
/// then the sets, then the rules, then the elements of each set that is not dynamic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableItem<'a> {
    /// A chain.
    Chain(Chain),
    /// A set or map.
    Set(Set),
    /// A rule.
    Rule(Rule),
    /// An element of `set`.
    Element {
        /// The set's name.
        set: &'a str,
        /// The element.
        element: ElementRef<'a>,
    },
}

/// What the nftables mode asks of nf_tables.
pub trait NftKernel {
    /// The ruleset's generation, which every commit (anyone's) moves on.
    ///
    /// # Errors
    /// When nf_tables cannot be asked (no nf_tables in this kernel, no permission).
    fn generation(&mut self) -> Result<u32, DataplaneError>;

    /// Reads the table `name` of `family` (`NFPROTO_*`) object by object into `visit`;
    /// false when there is no such table. Elements of dynamic sets (filled from the
    /// packet path) are not read.
    ///
    /// # Errors
    /// When it cannot be read; [`io::ErrorKind::Interrupted`] inside
    /// [`DataplaneError::Io`] when it changed while being read.
    fn read_table(
        &mut self,
        family: u8,
        name: &str,
        visit: &mut dyn FnMut(TableItem<'_>),
    ) -> Result<bool, DataplaneError>;

    /// Whether the table `name` of `family` exists.
    ///
    /// # Errors
    /// When nf_tables cannot be asked.
    fn table_exists(&mut self, family: u8, name: &str) -> Result<bool, DataplaneError>;

    /// Reads the elements of `set` in `table` (also a dynamic set's) into `visit`.
    ///
    /// # Errors
    /// When they cannot be read (`ENOENT`: no such set).
    fn read_elements(
        &mut self,
        family: u8,
        table: &str,
        set: &str,
        visit: &mut dyn FnMut(ElementRef<'_>),
    ) -> Result<(), DataplaneError>;

    /// Sends a transaction without committing it (the kernel validates it and aborts);
    /// returns what the kernel refused.
    ///
    /// # Errors
    /// When the kernel could not be asked or did not answer.
    fn check(&mut self, transaction: &mut Transaction) -> Result<Vec<Refusal>, DataplaneError>;

    /// Sends a transaction; returns what the kernel refused (nothing: it committed, and
    /// the generation moved on by one).
    ///
    /// # Errors
    /// When the kernel could not be asked or did not answer.
    fn commit(&mut self, transaction: &mut Transaction) -> Result<Vec<Refusal>, DataplaneError>;

    /// What anyone but this handle changed in the table `name` (of any family) in the
    /// commits up to `generation` since the last call that answered (empty: nothing);
    /// `None` when that cannot be told (the first call, which starts listening; announcements lost or not
    /// all arrived yet; this handle's socket replaced; a kernel that does not announce):
    /// then only a read of the table says.
    ///
    /// # Errors
    /// When nf_tables cannot be asked.
    fn changed_by_others(
        &mut self,
        name: &str,
        generation: u32,
    ) -> Result<Option<Touched>, DataplaneError> {
        let _ = (name, generation);
        Ok(None)
    }

    /// An alarm that goes off when someone other than this handle commits a change to
    /// the table `name` (of any family), for a thread of its own to wait on; `None` when
    /// this kernel handle cannot make one (the checks then run only at their interval).
    fn change_alarm(&mut self, name: &str) -> Option<Box<dyn ChangeAlarm>> {
        let _ = name;
        None
    }
}

/// nf_tables over netlink, in the calling thread's namespace or a named one.
#[derive(Debug, Default)]
pub struct NetlinkNft {
    socket: Option<NftNetlink>,
    netns: Option<PathBuf>,
    /// Hears every commit once the first [`NftKernel::changed_by_others`] opened it.
    monitor: Option<Listening>,
    /// What the monitor heard since the last answer.
    heard: Heard,
    /// The port of the socket while one is open (0 before), for the change alarm.
    port: Arc<AtomicU32>,
}

/// The monitor, with what its answers are about.
#[derive(Debug)]
struct Listening {
    monitor: NftMonitor,
    /// The port of this handle's socket when it opened: commits from it are ours.
    port: u32,
    /// The table whose changes by others it notes.
    table: String,
}

fn io_error(what: &str) -> impl FnOnce(io::Error) -> DataplaneError + '_ {
    move |e| DataplaneError::io(what.to_owned(), e)
}

fn invalid(e: NftCodecError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl NetlinkNft {
    /// A handle for the calling thread's namespace; the socket opens on first use.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A handle for the named network namespace (`/run/netns/NAME`), its socket opened
    /// at once.
    ///
    /// # Errors
    /// When the namespace cannot be entered or the socket cannot be opened there.
    pub fn in_netns(name: &str) -> Result<Self, DataplaneError> {
        let path = Path::new("/run/netns").join(name);
        let socket = in_namespace(&path, NftNetlink::open).map_err(|e| {
            DataplaneError::io(
                format!("opening an nf_tables socket in {}", path.display()),
                e,
            )
        })?;
        let port = Arc::new(AtomicU32::new(socket.port().unwrap_or(0)));
        Ok(Self {
            socket: Some(socket),
            netns: Some(path),
            monitor: None,
            heard: Heard::default(),
            port,
        })
    }

    fn socket(&mut self) -> Result<&mut NftNetlink, DataplaneError> {
        if self.socket.is_none() {
            let opened = match &self.netns {
                Some(path) => in_namespace(path, NftNetlink::open),
                None => NftNetlink::open(),
            };
            let socket = opened.map_err(io_error("opening an nf_tables socket"))?;
            self.port
                .store(socket.port().unwrap_or(0), Ordering::Relaxed);
            self.socket = Some(socket);
        }
        self.socket
            .as_mut()
            .ok_or_else(|| DataplaneError::io("nf_tables socket", io::Error::other("not open")))
    }

    fn read(
        socket: &mut NftNetlink,
        family: u8,
        name: &str,
        visit: &mut dyn FnMut(TableItem<'_>),
    ) -> io::Result<bool> {
        match socket.request(get_table_request(family, name), &mut |_| Ok(())) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        }
        // Chain dumps are not filtered by table in every kernel: filter here.
        socket.dump(dump_request(NFT_MSG_GETCHAIN, family, name), &mut |msg| {
            let (_, fam, body) = split(msg).map_err(invalid)?;
            let chain = Chain::decode(fam, body).map_err(invalid)?;
            if chain.table == name {
                visit(TableItem::Chain(chain));
            }
            Ok(())
        })?;
        let mut sets = Vec::new();
        socket.dump(dump_request(NFT_MSG_GETSET, family, name), &mut |msg| {
            let (_, fam, body) = split(msg).map_err(invalid)?;
            let set = Set::decode(fam, body).map_err(invalid)?;
            if set.table == name {
                if set.flags & NFT_SET_EVAL == 0 {
                    sets.push(set.name.clone());
                }
                visit(TableItem::Set(set));
            }
            Ok(())
        })?;
        socket.dump(dump_request(NFT_MSG_GETRULE, family, name), &mut |msg| {
            let (_, fam, body) = split(msg).map_err(invalid)?;
            let rule = Rule::decode(fam, body).map_err(invalid)?;
            if rule.table == name {
                visit(TableItem::Rule(rule));
            }
            Ok(())
        })?;
        for set in &sets {
            socket.dump(dump_elements_request(family, name, set), &mut |msg| {
                let (_, _, body) = split(msg).map_err(invalid)?;
                decode_elements(body, &mut |element| {
                    visit(TableItem::Element { set, element });
                })
                .map_err(invalid)?;
                Ok(())
            })?;
        }
        Ok(true)
    }
}

impl NftKernel for NetlinkNft {
    fn generation(&mut self) -> Result<u32, DataplaneError> {
        self.socket()?
            .generation()
            .map_err(io_error("reading the nf_tables generation"))
    }

    fn read_table(
        &mut self,
        family: u8,
        name: &str,
        visit: &mut dyn FnMut(TableItem<'_>),
    ) -> Result<bool, DataplaneError> {
        let socket = self.socket()?;
        let result = Self::read(socket, family, name, visit);
        if result.is_err() {
            // A socket left mid-dump is not reused.
            self.socket = None;
        }
        result.map_err(|e| DataplaneError::io(format!("reading nf_tables table {name}"), e))
    }

    fn table_exists(&mut self, family: u8, name: &str) -> Result<bool, DataplaneError> {
        let socket = self.socket()?;
        match socket.request(get_table_request(family, name), &mut |_| Ok(())) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(DataplaneError::io(
                format!("looking for nf_tables table {name}"),
                e,
            )),
        }
    }

    fn read_elements(
        &mut self,
        family: u8,
        table: &str,
        set: &str,
        visit: &mut dyn FnMut(ElementRef<'_>),
    ) -> Result<(), DataplaneError> {
        let socket = self.socket()?;
        let result = socket.dump(dump_elements_request(family, table, set), &mut |msg| {
            let (_, _, body) = split(msg).map_err(invalid)?;
            decode_elements(body, &mut |element| visit(element)).map_err(invalid)?;
            Ok(())
        });
        if result.is_err() {
            self.socket = None;
        }
        result.map_err(|e| DataplaneError::io(format!("reading the elements of {set}"), e))
    }

    fn check(&mut self, transaction: &mut Transaction) -> Result<Vec<Refusal>, DataplaneError> {
        let socket = self.socket()?;
        let result = socket.check(transaction);
        if result.is_err() {
            self.socket = None;
        }
        result.map_err(io_error("checking an nf_tables transaction"))
    }

    fn commit(&mut self, transaction: &mut Transaction) -> Result<Vec<Refusal>, DataplaneError> {
        let socket = self.socket()?;
        let result = socket.commit(transaction);
        if result.is_err() {
            self.socket = None;
        }
        // The commit's own announcements (one per element) go now, not at the next
        // check, so the monitor's buffer holds only what others do meanwhile.
        let _ = self.drain_announcements();
        result.map_err(io_error("sending an nf_tables transaction"))
    }

    fn changed_by_others(
        &mut self,
        name: &str,
        generation: u32,
    ) -> Result<Option<Touched>, DataplaneError> {
        let own = self
            .socket()?
            .port()
            .map_err(io_error("reading the nf_tables socket's port"))?;
        let listening = self
            .monitor
            .as_ref()
            .is_some_and(|l| l.port == own && l.table == name);
        if !listening {
            // Listening starts now (or again, for a new socket): what happened before is
            // unknown.
            let opened = self.open_monitor();
            self.heard = Heard::default();
            self.monitor = match opened {
                Ok(monitor) => Some(Listening {
                    monitor,
                    port: own,
                    table: name.to_owned(),
                }),
                Err(err) => {
                    tracing::debug!(%err, "cannot listen for nf_tables announcements");
                    None
                }
            };
            return Ok(None);
        }
        if self.drain_announcements().is_err() {
            return Ok(None);
        }
        if self.heard.lost {
            self.heard = Heard::default();
            return Ok(None);
        }
        if !self.heard.covers(generation) {
            return Ok(None);
        }
        Ok(Some(std::mem::take(&mut self.heard.others)))
    }

    fn change_alarm(&mut self, name: &str) -> Option<Box<dyn ChangeAlarm>> {
        match self.open_monitor() {
            Ok(monitor) => Some(Box::new(TableAlarm::new(
                monitor,
                Arc::clone(&self.port),
                name,
            ))),
            Err(err) => {
                tracing::warn!(%err, "cannot listen for nf_tables announcements; tampering is found at the check interval only");
                None
            }
        }
    }
}

impl NetlinkNft {
    /// A socket hearing every nf_tables commit in this handle's namespace.
    fn open_monitor(&self) -> io::Result<NftMonitor> {
        match &self.netns {
            Some(path) => in_namespace(path, NftMonitor::open),
            None => NftMonitor::open(),
        }
    }

    /// Reads what the monitor heard into [`NetlinkNft::heard`]; a failing monitor is
    /// closed (the next check starts listening again).
    fn drain_announcements(&mut self) -> io::Result<()> {
        let Some(listening) = self.monitor.as_mut() else {
            return Ok(());
        };
        let result = listening
            .monitor
            .drain(listening.port, &listening.table, &mut self.heard);
        if result.is_err() {
            self.monitor = None;
            self.heard = Heard::default();
        }
        result
    }
}
