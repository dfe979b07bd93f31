//! [`NftMonitor`]: who changed what in nf_tables. Every commit is announced to the
//! sockets that joined the `NFNLGRP_NFTABLES` group, one message per object changed, each
//! carrying the table it belongs to and the netlink port of the socket that committed it.
//! The tamper check reads those instead of the whole table when the ruleset's generation
//! moved: a commit by someone else to another table (a CNI plugin's iptables-nft rules,
//! another proxy, a firewall) then costs a few messages, not a read-back of 10,000
//! Services (0.7–0.9 s, during which no change could be programmed).

use std::io;

use netlink_sys::protocols::NETLINK_NETFILTER;
use netlink_sys::{Socket, SocketAddr};

use super::uapi::{NFNL_SUBSYS_NFTABLES, NFT_MSG_NEWGEN};
use crate::kernel::netlink::frame;

/// `NFNLGRP_NFTABLES`: the multicast group of nf_tables changes.
const NFNLGRP_NFTABLES: u32 = 7;
/// Receive buffer asked of the kernel: a burst of other people's commits fits; when it
/// does not, the kernel says so (`ENOBUFS`) and the check reads the table.
const RECEIVE_BUFFER: usize = 4 * 1024 * 1024;
/// Bytes read per `recv`.
const READ_CHUNK: usize = 256 * 1024;
/// The nf_tables attribute that names an object's table: type 1 in every table-scoped
/// message (`NFTA_TABLE_NAME`, `NFTA_CHAIN_TABLE`, `NFTA_RULE_TABLE`, `NFTA_SET_TABLE`,
/// `NFTA_SET_ELEM_LIST_TABLE`, `NFTA_OBJ_TABLE`, `NFTA_FLOWTABLE_TABLE`).
const TABLE_ATTRIBUTE: u16 = 1;

/// What a drain of the announcements found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Announced {
    /// Someone other than `own_port` changed the table asked about.
    pub changed_by_others: bool,
    /// Announcements were lost (the socket's buffer overflowed): nothing can be said.
    pub lost: bool,
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
        let _ = socket.set_rx_buf_sz(RECEIVE_BUFFER);
        socket.add_membership(NFNLGRP_NFTABLES)?;
        socket.set_non_blocking(true)?;
        Ok(Self {
            socket,
            buf: Vec::with_capacity(READ_CHUNK),
        })
    }

    /// Reads every announcement waiting and says whether one of them changed `table` (of
    /// any family) from a socket other than `own_port`.
    ///
    /// # Errors
    /// When the socket fails other than by having nothing more to read or having lost
    /// messages (which [`Announced::lost`] reports).
    pub fn drain(&mut self, own_port: u32, table: &str) -> io::Result<Announced> {
        let mut seen = Announced::default();
        loop {
            self.buf.clear();
            match self.socket.recv(&mut self.buf, 0) {
                Ok(0) => return Ok(seen),
                Ok(_) => {
                    seen.changed_by_others |= changed_by_others(&self.buf, own_port, table);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(seen),
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => seen.lost = true,
                Err(e) => return Err(e),
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

/// Whether one of the announcements in `datagram` changed `table` and came from a
/// socket other than `own_port`.
#[must_use]
pub fn changed_by_others(datagram: &[u8], own_port: u32, table: &str) -> bool {
    frame::messages(datagram)
        .map_while(Result::ok)
        .any(|message| {
            let [subsystem, kind] = message.header.message_type.to_be_bytes();
            if subsystem != NFNL_SUBSYS_NFTABLES || kind == NFT_MSG_NEWGEN {
                return false;
            }
            if message.header.port_id == own_port {
                return false;
            }
            // nlmsghdr (16 bytes), nfgenmsg (4), then the attributes.
            message.bytes.get(20..).is_some_and(|attributes| {
                frame::attributes(attributes)
                    .map_while(Result::ok)
                    .find(|a| a.kind == TABLE_ATTRIBUTE)
                    .and_then(|a| a.get_string().ok())
                    .is_none_or(|name| name == table)
            })
        })
}

#[cfg(test)]
mod tests {
    use super::changed_by_others;

    /// One announcement: nlmsghdr, nfgenmsg, a table-name attribute.
    fn announcement(kind: u8, port: u32, table: &str) -> Vec<u8> {
        let mut name = table.as_bytes().to_vec();
        name.push(0);
        let attribute_len = 4 + name.len();
        let padded = attribute_len.div_ceil(4) * 4;
        let total = 16 + 4 + padded;
        let mut out = Vec::new();
        out.extend_from_slice(&u32::try_from(total).unwrap_or(0).to_ne_bytes());
        out.extend_from_slice(&u16::from_be_bytes([10, kind]).to_ne_bytes());
        out.extend_from_slice(&0u16.to_ne_bytes());
        out.extend_from_slice(&1u32.to_ne_bytes());
        out.extend_from_slice(&port.to_ne_bytes());
        out.extend_from_slice(&[2, 0, 0, 0]);
        out.extend_from_slice(&u16::try_from(attribute_len).unwrap_or(0).to_ne_bytes());
        out.extend_from_slice(&1u16.to_ne_bytes());
        out.extend_from_slice(&name);
        out.resize(total, 0);
        out
    }

    #[test]
    fn only_other_sockets_changes_to_the_table_count() {
        // NEWSETELEM (12) in proxyplan by our own socket: ours.
        assert!(!changed_by_others(
            &announcement(12, 77, "proxyplan"),
            77,
            "proxyplan"
        ));
        // The same from another socket: tampering.
        assert!(changed_by_others(
            &announcement(12, 99, "proxyplan"),
            77,
            "proxyplan"
        ));
        // Another socket's rule (6) in another table: not ours to care about.
        assert!(!changed_by_others(
            &announcement(6, 99, "nat"),
            77,
            "proxyplan"
        ));
        // A generation message (15) names no table.
        assert!(!changed_by_others(
            &announcement(15, 99, "proxyplan"),
            77,
            "proxyplan"
        ));
        // Several in one datagram: any one counts.
        let mut both = announcement(6, 99, "filter");
        both.extend(announcement(8, 99, "proxyplan"));
        assert!(changed_by_others(&both, 77, "proxyplan"));
    }
}
