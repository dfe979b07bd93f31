//! [`NftMonitor`]: who changed what in nf_tables. Every commit is announced to the
//! sockets that joined the `NFNLGRP_NFTABLES` group, one message per object changed, each
//! carrying the table it belongs to and the netlink port of the socket that committed it.
//! The tamper check reads those instead of the whole table when the ruleset's generation
//! moved: a commit by someone else to another table (a CNI plugin's iptables-nft rules,
//! another proxy, a firewall) then costs a few messages, not a read-back of 10,000
//! Services (0.7–0.9 s, during which no change could be programmed).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use netlink_sys::protocols::NETLINK_NETFILTER;
use netlink_sys::{Socket, SocketAddr};

use super::objects::{decode_elements, split};
use super::uapi::{
    NFNL_SUBSYS_NFTABLES, NFT_MSG_DELRULE, NFT_MSG_DELSETELEM, NFT_MSG_NEWGEN, NFT_MSG_NEWRULE,
    NFT_MSG_NEWSETELEM, NFTA_RULE_CHAIN, NFTA_SET_ELEM_LIST_SET,
};
use crate::kernel::ChangeAlarm;
use crate::kernel::netlink::frame;

/// `NFNLGRP_NFTABLES`: the multicast group of nf_tables changes.
const NFNLGRP_NFTABLES: u32 = 7;
/// Receive buffer asked of the kernel. It is drained after each of the agent's own
/// commits (whose elements are announced too) and at each check; when it overflows all
/// the same, the kernel says so (`ENOBUFS`) and the check reads the table.
const RECEIVE_BUFFER: usize = 8 * 1024 * 1024;
/// Bytes read per `recv`.
const READ_CHUNK: usize = 256 * 1024;
/// The nf_tables attribute that names an object's table: type 1 in every table-scoped
/// message (`NFTA_TABLE_NAME`, `NFTA_CHAIN_TABLE`, `NFTA_RULE_TABLE`, `NFTA_SET_TABLE`,
/// `NFTA_SET_ELEM_LIST_TABLE`, `NFTA_OBJ_TABLE`, `NFTA_FLOWTABLE_TABLE`).
const TABLE_ATTRIBUTE: u16 = 1;
/// How many chains and sets [`Touched`] names before it stops naming them (a tamperer
/// rewriting the whole table is repaired from a read).
const TOUCHED_LIMIT: usize = 64;
/// How many element keys [`Touched`] keeps before it names their sets instead (each then
/// rewritten whole).
const ELEMENT_LIMIT: usize = 64;

/// What others changed in the table asked about, as their announcements name it: the
/// chains whose rules they added, replaced or deleted, the elements they added or
/// deleted (by key, or their sets when too many). Anything else (the table, a chain or a set itself made or deleted, a
/// stateful object, an announcement not understood, too many names) only a read of the
/// table can tell: `unscoped`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Touched {
    /// Chains, as `(nfproto family, name)`.
    pub chains: BTreeSet<(u8, String)>,
    /// Sets and maps, as `(nfproto family, name)`, whose elements others changed (too
    /// many, or not decoded, to name by key).
    pub sets: BTreeSet<(u8, String)>,
    /// Elements others added or deleted, by set and key: whether the last announcement
    /// of the key added it (true) or deleted it.
    pub elements: BTreeMap<(u8, String), BTreeMap<Vec<u8>, bool>>,
    /// Something no name covers.
    pub unscoped: bool,
}

impl Touched {
    /// Whether others changed nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        !self.unscoped && self.chains.is_empty() && self.sets.is_empty() && self.elements.is_empty()
    }

    fn add(&mut self, other: Self) {
        self.unscoped |= other.unscoped;
        self.chains.extend(other.chains);
        self.sets.extend(other.sets);
        for (set, keys) in other.elements {
            self.elements.entry(set).or_default().extend(keys);
        }
        self.bound();
    }

    /// Past [`ELEMENT_LIMIT`] keys their sets are named instead; past [`TOUCHED_LIMIT`]
    /// names, only a read tells what to repair.
    fn bound(&mut self) {
        let sets = &self.sets;
        self.elements.retain(|set, _| !sets.contains(set));
        if self.elements.values().map(BTreeMap::len).sum::<usize>() > ELEMENT_LIMIT {
            let elements = std::mem::take(&mut self.elements);
            self.sets.extend(elements.into_keys());
        }
        if self.chains.len() + self.sets.len() + self.elements.len() > TOUCHED_LIMIT {
            self.unscoped = true;
        }
        if self.unscoped {
            self.chains.clear();
            self.sets.clear();
            self.elements.clear();
        }
    }
}

/// What the announcements drained so far said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Heard {
    /// What someone other than the agent's socket changed in the table asked about.
    pub others: Touched,
    /// Announcements were lost (the socket's buffer overflowed): nothing can be said.
    pub lost: bool,
    /// The newest generation announced (`NFT_MSG_NEWGEN`, sent last for each commit).
    pub newest: Option<u32>,
}

impl Heard {
    /// Whether the commits up to `generation` have all been announced: the kernel moves
    /// the generation before it sends a commit's announcements.
    #[must_use]
    pub fn covers(&self, generation: u32) -> bool {
        self.newest
            .is_some_and(|newest| newest.wrapping_sub(generation) < u32::MAX / 2)
    }

    /// Whether someone other than the agent's socket changed the table asked about.
    #[must_use]
    pub fn changed_by_others(&self) -> bool {
        !self.others.is_empty()
    }

    fn add(&mut self, other: Self) {
        self.others.add(other.others);
        self.lost |= other.lost;
        if let Some(generation) = other.newest
            && !self.covers(generation)
        {
            self.newest = Some(generation);
        }
    }
}

/// A socket that hears every nf_tables commit in its network namespace.
#[derive(Debug)]
pub struct NftMonitor {
    socket: Socket,
    buf: Vec<u8>,
}

impl NftMonitor {
    /// Opens a socket in the calling thread's namespace and joins the nf_tables group:
    /// it hears every commit from now on.
    ///
    /// # Errors
    /// When the socket cannot be opened, bound or joined.
    pub fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        // SO_RCVBUF is capped by net.core.rmem_max (about 200 KiB); with CAP_NET_ADMIN,
        // SO_RCVBUFFORCE is not. A buffer that still overflows only costs a read-back.
        if nix::sys::socket::setsockopt(
            &socket.as_fd(),
            nix::sys::socket::sockopt::RcvBufForce,
            &RECEIVE_BUFFER,
        )
        .is_err()
        {
            let _ = socket.set_rx_buf_sz(RECEIVE_BUFFER);
        }
        socket.add_membership(NFNLGRP_NFTABLES)?;
        socket.set_non_blocking(true)?;
        Ok(Self {
            socket,
            buf: Vec::with_capacity(READ_CHUNK),
        })
    }

    /// Reads every announcement waiting into `heard`: whether one of them changed
    /// `table` (of any family) from a socket other than `own_port`, the newest
    /// generation announced, and whether some were lost.
    ///
    /// # Errors
    /// When the socket fails other than by having nothing more to read or having lost
    /// messages.
    pub fn drain(&mut self, own_port: u32, table: &str, heard: &mut Heard) -> io::Result<()> {
        loop {
            self.buf.clear();
            match self.socket.recv(&mut self.buf, 0) {
                Ok(0) => return Ok(()),
                Ok(_) => heard.add(read_datagram(&self.buf, own_port, table)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => heard.lost = true,
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits up to `timeout` (`None`: for ever) until an announcement is waiting; false
    /// when the time ran out first.
    ///
    /// # Errors
    /// When the socket cannot be polled.
    pub fn wait_readable(&self, timeout: Option<Duration>) -> io::Result<bool> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let timeout = match timeout {
            None => PollTimeout::NONE,
            Some(t) => PollTimeout::try_from(t).unwrap_or(PollTimeout::MAX),
        };
        let mut fds = [PollFd::new(self.socket.as_fd(), PollFlags::POLLIN)];
        loop {
            match poll(&mut fds, timeout) {
                Ok(n) => return Ok(n > 0),
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// [`ChangeAlarm`] for one nf_tables table: a socket of its own in the `NFNLGRP_NFTABLES`
/// group, which goes off at the first commit by another socket than the agent's that
/// touches the table (a chain flushed by hand, an element deleted, the table deleted), or
/// when announcements were lost. The agent's own commits (their port is read at each
/// wait, as the agent's socket may be reopened) and other tables' never wake it.
#[derive(Debug)]
pub struct TableAlarm {
    monitor: NftMonitor,
    own_port: Arc<AtomicU32>,
    table: String,
}

impl TableAlarm {
    /// An alarm for `table` on `monitor`, the agent's own commits coming from the port
    /// `own_port` holds.
    #[must_use]
    pub fn new(monitor: NftMonitor, own_port: Arc<AtomicU32>, table: &str) -> Self {
        Self {
            monitor,
            own_port,
            table: table.to_owned(),
        }
    }
}

impl ChangeAlarm for TableAlarm {
    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            if !self.monitor.wait_readable(left)? {
                return Ok(false);
            }
            let mut heard = Heard::default();
            self.monitor.drain(
                self.own_port.load(Ordering::Relaxed),
                &self.table,
                &mut heard,
            )?;
            if heard.changed_by_others() || heard.lost {
                return Ok(true);
            }
            if left.is_some_and(|left| left.is_zero()) {
                return Ok(false);
            }
        }
    }
}

/// The netlink port of `socket`: what the kernel writes as the sender of the
/// announcements of that socket's commits.
///
/// # Errors
/// When the socket's address cannot be read.
pub fn port_of(socket: &Socket) -> io::Result<u32> {
    let mut address = SocketAddr::new(0, 0);
    socket.get_address(&mut address)?;
    Ok(address.port_number())
}

/// What the announcements in `datagram` say: what those that came from a socket other
/// than `own_port` changed in `table`, and the newest generation announced.
#[must_use]
pub fn read_datagram(datagram: &[u8], own_port: u32, table: &str) -> Heard {
    let mut heard = Heard::default();
    for message in frame::messages(datagram).map_while(Result::ok) {
        let [subsystem, kind] = message.header.message_type.to_be_bytes();
        if subsystem != NFNL_SUBSYS_NFTABLES {
            continue;
        }
        // nlmsghdr (16 bytes), nfgenmsg (4: family, version, resource id), then the
        // attributes.
        let attribute = |wanted: u16| {
            message.bytes.get(20..).and_then(|attributes| {
                frame::attributes(attributes)
                    .map_while(Result::ok)
                    .find(|a| a.kind == wanted)
            })
        };
        if kind == NFT_MSG_NEWGEN {
            // NFTA_GEN_ID, big-endian.
            if let Some(id) = attribute(TABLE_ATTRIBUTE)
                .and_then(|a| a.value.get(..4).map(|b| [b[0], b[1], b[2], b[3]]))
            {
                heard.add(Heard {
                    newest: Some(u32::from_be_bytes(id)),
                    ..Heard::default()
                });
            }
            continue;
        }
        if message.header.port_id == own_port {
            continue;
        }
        let name = attribute(TABLE_ATTRIBUTE).and_then(|a| a.get_string().ok());
        // An announcement without a table name is taken as one about ours.
        if name.is_some_and(|name| name != table) {
            continue;
        }
        let family = message.bytes.get(16).copied();
        let named = |wanted: u16| {
            let object = attribute(wanted).and_then(|a| a.get_string().ok())?;
            Some((family?, object))
        };
        let mut touched = Touched::default();
        match kind {
            NFT_MSG_NEWRULE | NFT_MSG_DELRULE => match named(NFTA_RULE_CHAIN) {
                Some(chain) => {
                    touched.chains.insert(chain);
                }
                None => touched.unscoped = true,
            },
            NFT_MSG_NEWSETELEM | NFT_MSG_DELSETELEM => match named(NFTA_SET_ELEM_LIST_SET) {
                Some(set) => {
                    // The keys, when every one decodes; the set otherwise.
                    let added = kind == NFT_MSG_NEWSETELEM;
                    let mut keys = BTreeMap::new();
                    let decoded = split(message.bytes).ok().and_then(|(_, _, body)| {
                        decode_elements(body, &mut |element| {
                            keys.insert(element.key.to_vec(), added);
                        })
                        .ok()
                    });
                    if decoded.is_some() && !keys.is_empty() {
                        touched.elements.insert(set, keys);
                    } else {
                        touched.sets.insert(set);
                    }
                }
                None => touched.unscoped = true,
            },
            _ => touched.unscoped = true,
        }
        heard.others.add(touched);
    }
    heard
}

#[cfg(test)]
mod tests {
    use super::{TOUCHED_LIMIT, read_datagram};

    /// One attribute: length, type, the string's bytes with their NUL, padding.
    fn string_attribute(kind: u16, value: &str) -> Vec<u8> {
        let mut bytes = value.as_bytes().to_vec();
        bytes.push(0);
        let len = 4 + bytes.len();
        let mut out = Vec::new();
        out.extend_from_slice(&u16::try_from(len).unwrap_or(0).to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(&bytes);
        out.resize(len.div_ceil(4) * 4, 0);
        out
    }

    /// One announcement of family ip (2): nlmsghdr, nfgenmsg, a table-name attribute
    /// and, when given, the name of the chain or set (attribute 2).
    fn announcement_of(kind: u8, port: u32, table: &str, object: Option<&str>) -> Vec<u8> {
        let mut attributes = string_attribute(1, table);
        if let Some(object) = object {
            attributes.extend(string_attribute(2, object));
        }
        let total = 16 + 4 + attributes.len();
        let mut out = Vec::new();
        out.extend_from_slice(&u32::try_from(total).unwrap_or(0).to_ne_bytes());
        out.extend_from_slice(&u16::from_be_bytes([10, kind]).to_ne_bytes());
        out.extend_from_slice(&0u16.to_ne_bytes());
        out.extend_from_slice(&1u32.to_ne_bytes());
        out.extend_from_slice(&port.to_ne_bytes());
        out.extend_from_slice(&[2, 0, 0, 0]);
        out.extend(attributes);
        out
    }

    fn announcement(kind: u8, port: u32, table: &str) -> Vec<u8> {
        announcement_of(kind, port, table, None)
    }

    fn changed(datagram: &[u8]) -> bool {
        read_datagram(datagram, 77, "proxyplan").changed_by_others()
    }

    #[test]
    fn only_other_sockets_changes_to_the_table_count() {
        // NEWSETELEM (12) in proxyplan by our own socket: ours.
        assert!(!changed(&announcement(12, 77, "proxyplan")));
        // The same from another socket: tampering.
        assert!(changed(&announcement(12, 99, "proxyplan")));
        // Another socket's rule (6) in another table: not ours to care about.
        assert!(!changed(&announcement(6, 99, "nat")));
        // Several in one datagram: any one counts.
        let mut both = announcement(6, 99, "filter");
        both.extend(announcement(8, 99, "proxyplan"));
        assert!(changed(&both));
    }

    /// A rule added or deleted names its chain, an element its set: the repair rewrites
    /// those. A chain, a set or the table itself made or deleted names nothing a rewrite
    /// could cover.
    #[test]
    fn what_others_touched_is_named_by_chain_and_set() {
        let mut datagram = announcement_of(8, 99, "proxyplan", Some("services"));
        datagram.extend(announcement_of(8, 99, "proxyplan", Some("services")));
        datagram.extend(announcement_of(6, 99, "proxyplan", Some("nat-prerouting")));
        datagram.extend(announcement_of(14, 99, "proxyplan", Some("service-ips")));
        // Ours, and another table's: not counted.
        datagram.extend(announcement_of(8, 77, "proxyplan", Some("mine")));
        datagram.extend(announcement_of(8, 99, "filter", Some("input")));
        let touched = read_datagram(&datagram, 77, "proxyplan").others;
        assert!(!touched.unscoped);
        let chains: Vec<(u8, &str)> = touched
            .chains
            .iter()
            .map(|(f, n)| (*f, n.as_str()))
            .collect();
        assert_eq!(chains, [(2, "nat-prerouting"), (2, "services")]);
        let sets: Vec<&str> = touched.sets.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(sets, ["service-ips"]);
        // DELCHAIN (5), DELSET (11), DELTABLE (2), and a rule without its chain.
        for kind in [5, 11, 2] {
            let heard = read_datagram(
                &announcement_of(kind, 99, "proxyplan", Some("services")),
                77,
                "proxyplan",
            );
            assert!(heard.others.unscoped, "message {kind} was scoped");
            assert!(heard.others.chains.is_empty() && heard.others.sets.is_empty());
        }
        assert!(
            read_datagram(&announcement(8, 99, "proxyplan"), 77, "proxyplan")
                .others
                .unscoped
        );
        // Past the limit, names stop and a read decides.
        let mut many = Vec::new();
        for i in 0..=TOUCHED_LIMIT {
            many.extend(announcement_of(
                6,
                99,
                "proxyplan",
                Some(&format!("chain-{i}")),
            ));
        }
        let touched = read_datagram(&many, 77, "proxyplan").others;
        assert!(touched.unscoped && touched.chains.is_empty());
    }

    /// NEWGEN (15) carries the new generation, big-endian, as attribute 1.
    #[test]
    fn the_newest_generation_is_kept() {
        let generation = |id: u32| {
            let mut message = announcement(15, 99, "");
            message.truncate(20);
            message.extend_from_slice(&8u16.to_ne_bytes());
            message.extend_from_slice(&1u16.to_ne_bytes());
            message.extend_from_slice(&id.to_be_bytes());
            let len = u32::try_from(message.len()).unwrap_or(0);
            message[..4].copy_from_slice(&len.to_ne_bytes());
            message
        };
        let mut datagram = generation(41);
        datagram.extend(generation(42));
        let heard = read_datagram(&datagram, 77, "proxyplan");
        assert_eq!(heard.newest, Some(42));
        assert!(!heard.changed_by_others());
        assert!(heard.covers(42) && heard.covers(41) && !heard.covers(43));
        // Across the wrap of the 32-bit counter.
        let wrapped = read_datagram(&generation(2), 77, "proxyplan");
        assert!(wrapped.covers(u32::MAX - 1) && !wrapped.covers(3));
    }
}
