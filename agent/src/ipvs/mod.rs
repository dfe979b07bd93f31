//! IPVS over generic netlink: the message types and the byte-level codec.
//!
//! IPVS has no rtnetlink interface; it is the generic-netlink family `"IPVS"` whose id is
//! assigned at module load and resolved with `CTRL_CMD_GETFAMILY`. This module is pure:
//! [`codec`] turns requests into bytes and kernel replies into typed values, on the
//! netlink framing of [`crate::kernel::netlink`]; the socket lives at the edge.
//!
//! Every constant below is named after its definition in the Linux uapi headers
//! (`include/uapi/linux/ip_vs.h`, `netlink.h`, `genetlink.h`).

pub mod codec;
pub mod dataplane;
pub mod desired;
pub mod ipset;
pub mod ipset_netlink;
pub mod kernel;
pub mod render;

use std::net::IpAddr;

pub use codec::{
    ControlMessage, IpvsCodecError, NetlinkBody, NetlinkHeader, NetlinkMessage, decode, encode,
    encode_message,
};

// ---- genetlink.h -----------------------------------------------------------------------

/// `GENL_ID_CTRL`: the fixed id of the generic-netlink controller family.
pub const GENL_ID_CTRL: u16 = 0x10;
/// `CTRL_CMD_NEWFAMILY`: the controller's reply to `CTRL_CMD_GETFAMILY`.
pub const CTRL_CMD_NEWFAMILY: u8 = 1;
/// `CTRL_CMD_GETFAMILY`: look a family up by name.
pub const CTRL_CMD_GETFAMILY: u8 = 3;
/// `CTRL_ATTR_FAMILY_ID` (u16).
pub const CTRL_ATTR_FAMILY_ID: u16 = 1;
/// `CTRL_ATTR_FAMILY_NAME` (NUL-terminated string).
pub const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// The generic-netlink family name IPVS registers (`IPVS_GENL_NAME`).
pub const IPVS_GENL_NAME: &str = "IPVS";
/// `IPVS_GENL_VERSION`.
pub const IPVS_GENL_VERSION: u8 = 1;

// ---- ip_vs.h: attribute sets -----------------------------------------------------------

/// `IPVS_CMD_ATTR_SERVICE`: nested service attributes.
pub const IPVS_CMD_ATTR_SERVICE: u16 = 1;
/// `IPVS_CMD_ATTR_DEST`: nested destination attributes.
pub const IPVS_CMD_ATTR_DEST: u16 = 2;

/// `IPVS_SVC_ATTR_AF` (u16): address family.
pub const IPVS_SVC_ATTR_AF: u16 = 1;
/// `IPVS_SVC_ATTR_PROTOCOL` (u16): IP protocol.
pub const IPVS_SVC_ATTR_PROTOCOL: u16 = 2;
/// `IPVS_SVC_ATTR_ADDR` (`union nf_inet_addr`, 16 bytes, network order).
pub const IPVS_SVC_ATTR_ADDR: u16 = 3;
/// `IPVS_SVC_ATTR_PORT` (`__be16`).
pub const IPVS_SVC_ATTR_PORT: u16 = 4;
/// `IPVS_SVC_ATTR_FWMARK` (u32): firewall mark, instead of protocol/address/port.
pub const IPVS_SVC_ATTR_FWMARK: u16 = 5;
/// `IPVS_SVC_ATTR_SCHED_NAME` (NUL-terminated string).
pub const IPVS_SVC_ATTR_SCHED_NAME: u16 = 6;
/// `IPVS_SVC_ATTR_FLAGS` (`struct ip_vs_flags { u32 flags; u32 mask; }`).
pub const IPVS_SVC_ATTR_FLAGS: u16 = 7;
/// `IPVS_SVC_ATTR_TIMEOUT` (u32): persistence timeout in seconds.
pub const IPVS_SVC_ATTR_TIMEOUT: u16 = 8;
/// `IPVS_SVC_ATTR_NETMASK` (u32): persistence granularity.
pub const IPVS_SVC_ATTR_NETMASK: u16 = 9;
/// `IPVS_SVC_ATTR_STATS` (nested `IPVS_STATS_ATTR_*`, 32-bit counters).
pub const IPVS_SVC_ATTR_STATS: u16 = 10;
/// `IPVS_SVC_ATTR_PE_NAME` (NUL-terminated string): persistence engine.
pub const IPVS_SVC_ATTR_PE_NAME: u16 = 11;
/// `IPVS_SVC_ATTR_STATS64` (nested `IPVS_STATS_ATTR_*`, all u64).
pub const IPVS_SVC_ATTR_STATS64: u16 = 12;

/// `IPVS_DEST_ATTR_ADDR` (`union nf_inet_addr`, 16 bytes, network order).
pub const IPVS_DEST_ATTR_ADDR: u16 = 1;
/// `IPVS_DEST_ATTR_PORT` (`__be16`).
pub const IPVS_DEST_ATTR_PORT: u16 = 2;
/// `IPVS_DEST_ATTR_FWD_METHOD` (u32): `IP_VS_CONN_F_*` forwarding method.
pub const IPVS_DEST_ATTR_FWD_METHOD: u16 = 3;
/// `IPVS_DEST_ATTR_WEIGHT` (u32).
pub const IPVS_DEST_ATTR_WEIGHT: u16 = 4;
/// `IPVS_DEST_ATTR_U_THRESH` (u32): upper connection threshold.
pub const IPVS_DEST_ATTR_U_THRESH: u16 = 5;
/// `IPVS_DEST_ATTR_L_THRESH` (u32): lower connection threshold.
pub const IPVS_DEST_ATTR_L_THRESH: u16 = 6;
/// `IPVS_DEST_ATTR_ACTIVE_CONNS` (u32, read-only).
pub const IPVS_DEST_ATTR_ACTIVE_CONNS: u16 = 7;
/// `IPVS_DEST_ATTR_INACT_CONNS` (u32, read-only).
pub const IPVS_DEST_ATTR_INACT_CONNS: u16 = 8;
/// `IPVS_DEST_ATTR_PERSIST_CONNS` (u32, read-only).
pub const IPVS_DEST_ATTR_PERSIST_CONNS: u16 = 9;
/// `IPVS_DEST_ATTR_STATS` (nested, read-only).
pub const IPVS_DEST_ATTR_STATS: u16 = 10;
/// `IPVS_DEST_ATTR_ADDR_FAMILY` (u16).
pub const IPVS_DEST_ATTR_ADDR_FAMILY: u16 = 11;
/// `IPVS_DEST_ATTR_STATS64` (nested, read-only).
pub const IPVS_DEST_ATTR_STATS64: u16 = 12;
/// `IPVS_DEST_ATTR_TUN_TYPE` (u8).
pub const IPVS_DEST_ATTR_TUN_TYPE: u16 = 13;
/// `IPVS_DEST_ATTR_TUN_PORT` (`__be16`).
pub const IPVS_DEST_ATTR_TUN_PORT: u16 = 14;
/// `IPVS_DEST_ATTR_TUN_FLAGS` (u16).
pub const IPVS_DEST_ATTR_TUN_FLAGS: u16 = 15;

/// `IPVS_STATS_ATTR_CONNS`.
pub const IPVS_STATS_ATTR_CONNS: u16 = 1;
/// `IPVS_STATS_ATTR_INPKTS`.
pub const IPVS_STATS_ATTR_INPKTS: u16 = 2;
/// `IPVS_STATS_ATTR_OUTPKTS`.
pub const IPVS_STATS_ATTR_OUTPKTS: u16 = 3;
/// `IPVS_STATS_ATTR_INBYTES` (u64 in both nests).
pub const IPVS_STATS_ATTR_INBYTES: u16 = 4;
/// `IPVS_STATS_ATTR_OUTBYTES` (u64 in both nests).
pub const IPVS_STATS_ATTR_OUTBYTES: u16 = 5;
/// `IPVS_STATS_ATTR_CPS`.
pub const IPVS_STATS_ATTR_CPS: u16 = 6;
/// `IPVS_STATS_ATTR_INPPS`.
pub const IPVS_STATS_ATTR_INPPS: u16 = 7;
/// `IPVS_STATS_ATTR_OUTPPS`.
pub const IPVS_STATS_ATTR_OUTPPS: u16 = 8;
/// `IPVS_STATS_ATTR_INBPS`.
pub const IPVS_STATS_ATTR_INBPS: u16 = 9;
/// `IPVS_STATS_ATTR_OUTBPS`.
pub const IPVS_STATS_ATTR_OUTBPS: u16 = 10;

// ---- ip_vs.h: flags and values ---------------------------------------------------------

/// `IP_VS_SVC_F_PERSISTENT`: persistent port (ClientIP affinity).
pub const IP_VS_SVC_F_PERSISTENT: u32 = 0x0001;
/// `IP_VS_SVC_F_HASHED`: hashed entry (set by the kernel).
pub const IP_VS_SVC_F_HASHED: u32 = 0x0002;
/// `IP_VS_SVC_F_ONEPACKET`: one-packet scheduling.
pub const IP_VS_SVC_F_ONEPACKET: u32 = 0x0004;
/// `IP_VS_SVC_F_SCHED1`: scheduler flag 1.
pub const IP_VS_SVC_F_SCHED1: u32 = 0x0008;
/// `IP_VS_SVC_F_SCHED2`: scheduler flag 2.
pub const IP_VS_SVC_F_SCHED2: u32 = 0x0010;
/// `IP_VS_SVC_F_SCHED3`: scheduler flag 3.
pub const IP_VS_SVC_F_SCHED3: u32 = 0x0020;

/// `IP_VS_CONN_F_MASQ`: NAT forwarding.
pub const IP_VS_CONN_F_MASQ: u32 = 0x0000;
/// `IP_VS_CONN_F_LOCALNODE`: local node.
pub const IP_VS_CONN_F_LOCALNODE: u32 = 0x0001;
/// `IP_VS_CONN_F_TUNNEL`: IP-IP tunnelling.
pub const IP_VS_CONN_F_TUNNEL: u32 = 0x0002;
/// `IP_VS_CONN_F_DROUTE`: direct routing.
pub const IP_VS_CONN_F_DROUTE: u32 = 0x0003;
/// `IP_VS_CONN_F_FWD_MASK`: the forwarding-method bits of the connection flags.
pub const IP_VS_CONN_F_FWD_MASK: u32 = 0x0007;

/// `AF_INET` (linux/socket.h).
pub const AF_INET: u16 = 2;
/// `AF_INET6` (linux/socket.h).
pub const AF_INET6: u16 = 10;
/// `IPPROTO_TCP` (linux/in.h).
pub const IPPROTO_TCP: u16 = 6;
/// `IPPROTO_UDP` (linux/in.h).
pub const IPPROTO_UDP: u16 = 17;
/// `IPPROTO_SCTP` (linux/in.h).
pub const IPPROTO_SCTP: u16 = 132;

/// The IPVS generic-netlink commands (`enum { IPVS_CMD_* }` in ip_vs.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum IpvsCommand {
    /// `IPVS_CMD_NEW_SERVICE`: add a virtual service (also the command of service dumps).
    NewService = 1,
    /// `IPVS_CMD_SET_SERVICE`: modify a virtual service.
    SetService = 2,
    /// `IPVS_CMD_DEL_SERVICE`: delete a virtual service.
    DelService = 3,
    /// `IPVS_CMD_GET_SERVICE`: get (or, with `NLM_F_DUMP`, list) virtual services.
    GetService = 4,
    /// `IPVS_CMD_NEW_DEST`: add a real server (also the command of destination dumps).
    NewDest = 5,
    /// `IPVS_CMD_SET_DEST`: modify a real server.
    SetDest = 6,
    /// `IPVS_CMD_DEL_DEST`: delete a real server.
    DelDest = 7,
    /// `IPVS_CMD_GET_DEST`: list a service's real servers (with `NLM_F_DUMP`).
    GetDest = 8,
    /// `IPVS_CMD_NEW_DAEMON`: start a sync daemon.
    NewDaemon = 9,
    /// `IPVS_CMD_DEL_DAEMON`: stop a sync daemon.
    DelDaemon = 10,
    /// `IPVS_CMD_GET_DAEMON`: list sync daemons.
    GetDaemon = 11,
    /// `IPVS_CMD_SET_CONFIG`: set timeouts.
    SetConfig = 12,
    /// `IPVS_CMD_GET_CONFIG`: get timeouts.
    GetConfig = 13,
    /// `IPVS_CMD_SET_INFO`: unused by the kernel.
    SetInfo = 14,
    /// `IPVS_CMD_GET_INFO`: version and connection table size.
    GetInfo = 15,
    /// `IPVS_CMD_ZERO`: zero counters.
    Zero = 16,
    /// `IPVS_CMD_FLUSH`: delete every service. The agent never sends it (it owns only its
    /// own services) but the codec knows it.
    Flush = 17,
}

impl IpvsCommand {
    /// The command for a raw genl `cmd` byte.
    pub fn from_u8(cmd: u8) -> Option<Self> {
        use IpvsCommand::*;
        Some(match cmd {
            1 => NewService,
            2 => SetService,
            3 => DelService,
            4 => GetService,
            5 => NewDest,
            6 => SetDest,
            7 => DelDest,
            8 => GetDest,
            9 => NewDaemon,
            10 => DelDaemon,
            11 => GetDaemon,
            12 => SetConfig,
            13 => GetConfig,
            14 => SetInfo,
            15 => GetInfo,
            16 => Zero,
            17 => Flush,
            _ => return None,
        })
    }
}

/// An IPVS virtual service, as sent in `IPVS_CMD_ATTR_SERVICE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsService {
    /// `IPVS_SVC_ATTR_AF`: [`AF_INET`] or [`AF_INET6`].
    pub family: u16,
    /// `IPVS_SVC_ATTR_PROTOCOL`: [`IPPROTO_TCP`], [`IPPROTO_UDP`] or [`IPPROTO_SCTP`];
    /// 0 for a firewall-mark service.
    pub protocol: u16,
    /// `IPVS_SVC_ATTR_ADDR`: the virtual IP (unspecified for a firewall-mark service).
    pub addr: IpAddr,
    /// `IPVS_SVC_ATTR_PORT`, host order here, network order on the wire.
    pub port: u16,
    /// `IPVS_SVC_ATTR_FWMARK`: when set, the service is keyed by mark, not by
    /// protocol/address/port, and those three are not sent.
    pub fwmark: Option<u32>,
    /// `IPVS_SVC_ATTR_SCHED_NAME`, e.g. `rr`.
    pub scheduler: String,
    /// `IPVS_SVC_ATTR_PE_NAME`: persistence engine (e.g. `sip`), rarely set.
    pub persistence_engine: Option<String>,
    /// `IPVS_SVC_ATTR_FLAGS` flags (`IP_VS_SVC_F_*`).
    pub flags: u32,
    /// `IPVS_SVC_ATTR_FLAGS` mask: which flag bits to change; `!0` sets them all.
    pub flags_mask: u32,
    /// `IPVS_SVC_ATTR_TIMEOUT`: persistence timeout in seconds.
    pub timeout: u32,
    /// `IPVS_SVC_ATTR_NETMASK`: `0xffff_ffff` for IPv4, the prefix length (128) for IPv6.
    pub netmask: u32,
    /// `IPVS_SVC_ATTR_STATS`: read-only counters in kernel replies; ignored by requests.
    pub stats: Option<IpvsStats>,
    /// `IPVS_SVC_ATTR_STATS64`: read-only 64-bit counters in kernel replies.
    pub stats64: Option<IpvsStats>,
}

/// An IPVS real server, as sent in `IPVS_CMD_ATTR_DEST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsDestination {
    /// `IPVS_DEST_ATTR_ADDR`.
    pub addr: IpAddr,
    /// `IPVS_DEST_ATTR_PORT`, host order here, network order on the wire.
    pub port: u16,
    /// `IPVS_DEST_ATTR_FWD_METHOD`: `IP_VS_CONN_F_*`, [`IP_VS_CONN_F_MASQ`] for kube-proxy.
    pub fwd_method: u32,
    /// `IPVS_DEST_ATTR_WEIGHT`: 0 drains the server (graceful termination).
    pub weight: u32,
    /// `IPVS_DEST_ATTR_U_THRESH`: upper connection threshold, 0 = none.
    pub upper_threshold: u32,
    /// `IPVS_DEST_ATTR_L_THRESH`: lower connection threshold, 0 = none.
    pub lower_threshold: u32,
    /// `IPVS_DEST_ATTR_ADDR_FAMILY`; absent only from kernels older than 4.x.
    pub family: Option<u16>,
    /// `IPVS_DEST_ATTR_TUN_TYPE`, `IPVS_DEST_ATTR_TUN_PORT`, `IPVS_DEST_ATTR_TUN_FLAGS`.
    pub tunnel: IpvsTunnel,
    /// Read-only counters, present in kernel replies only.
    pub counters: IpvsDestinationCounters,
}

/// Tunnel settings of a destination (kernels 5.2+ report them for every destination).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IpvsTunnel {
    /// `IPVS_DEST_ATTR_TUN_TYPE` (u8).
    pub tun_type: Option<u8>,
    /// `IPVS_DEST_ATTR_TUN_PORT`, host order here.
    pub port: Option<u16>,
    /// `IPVS_DEST_ATTR_TUN_FLAGS` (u16).
    pub flags: Option<u16>,
}

/// Read-only per-destination counters from a `IPVS_CMD_GET_DEST` dump.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsDestinationCounters {
    /// `IPVS_DEST_ATTR_ACTIVE_CONNS`.
    pub active_connections: Option<u32>,
    /// `IPVS_DEST_ATTR_INACT_CONNS`.
    pub inactive_connections: Option<u32>,
    /// `IPVS_DEST_ATTR_PERSIST_CONNS`.
    pub persistent_connections: Option<u32>,
    /// `IPVS_DEST_ATTR_STATS`.
    pub stats: Option<IpvsStats>,
    /// `IPVS_DEST_ATTR_STATS64`.
    pub stats64: Option<IpvsStats>,
}

/// The `IPVS_STATS_ATTR_*` counters. In the `*_STATS` nest all are u32 except the byte
/// counters (u64); in `*_STATS64` all are u64. Missing counters read as 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IpvsStats {
    /// `IPVS_STATS_ATTR_CONNS`: connections scheduled.
    pub connections: u64,
    /// `IPVS_STATS_ATTR_INPKTS`.
    pub packets_in: u64,
    /// `IPVS_STATS_ATTR_OUTPKTS`.
    pub packets_out: u64,
    /// `IPVS_STATS_ATTR_INBYTES`.
    pub bytes_in: u64,
    /// `IPVS_STATS_ATTR_OUTBYTES`.
    pub bytes_out: u64,
    /// `IPVS_STATS_ATTR_CPS`.
    pub connections_per_second: u64,
    /// `IPVS_STATS_ATTR_INPPS`.
    pub packets_in_per_second: u64,
    /// `IPVS_STATS_ATTR_OUTPPS`.
    pub packets_out_per_second: u64,
    /// `IPVS_STATS_ATTR_INBPS`.
    pub bytes_in_per_second: u64,
    /// `IPVS_STATS_ATTR_OUTBPS`.
    pub bytes_out_per_second: u64,
}

/// The attributes of one IPVS genl message: a service, a destination, or both (every
/// destination request names its service too).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsAttributes {
    /// `IPVS_CMD_ATTR_SERVICE`.
    pub service: Option<IpvsService>,
    /// `IPVS_CMD_ATTR_DEST`.
    pub destination: Option<IpvsDestination>,
}

impl IpvsService {
    /// A TCP/UDP/SCTP virtual service with no persistence, `!0` flag mask and the
    /// family's full netmask.
    pub fn new(protocol: u16, addr: IpAddr, port: u16, scheduler: &str) -> Self {
        let (family, netmask) = match addr {
            IpAddr::V4(_) => (AF_INET, 0xffff_ffff),
            IpAddr::V6(_) => (AF_INET6, 128),
        };
        Self {
            family,
            protocol,
            addr,
            port,
            fwmark: None,
            scheduler: scheduler.to_owned(),
            persistence_engine: None,
            flags: 0,
            flags_mask: u32::MAX,
            timeout: 0,
            netmask,
            stats: None,
            stats64: None,
        }
    }

    /// Whether `IP_VS_SVC_F_PERSISTENT` is set.
    pub fn is_persistent(&self) -> bool {
        self.flags & IP_VS_SVC_F_PERSISTENT != 0
    }
}

impl IpvsDestination {
    /// A masquerading real server with the given weight and no thresholds.
    pub fn masq(addr: IpAddr, port: u16, weight: u32) -> Self {
        let family = match addr {
            IpAddr::V4(_) => AF_INET,
            IpAddr::V6(_) => AF_INET6,
        };
        Self {
            addr,
            port,
            fwd_method: IP_VS_CONN_F_MASQ,
            weight,
            upper_threshold: 0,
            lower_threshold: 0,
            family: Some(family),
            tunnel: IpvsTunnel::default(),
            counters: IpvsDestinationCounters::default(),
        }
    }
}

/// `addr:port`, with brackets for IPv6.
#[must_use]
pub fn socket_text(addr: IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(addr, port).to_string()
}

/// The protocol's name (`TCP`, `UDP`, `SCTP`, or the number).
#[must_use]
pub fn protocol_name(protocol: u16) -> String {
    match protocol {
        IPPROTO_TCP => "TCP".into(),
        IPPROTO_UDP => "UDP".into(),
        IPPROTO_SCTP => "SCTP".into(),
        other => other.to_string(),
    }
}

/// A service as `TCP 10.96.0.10:80` (or `FWM 7`), for logs and errors.
#[must_use]
pub fn describe_service(service: &IpvsService) -> String {
    match service.fwmark {
        Some(mark) => format!("FWM {mark}"),
        None => format!(
            "{} {}",
            protocol_name(service.protocol),
            socket_text(service.addr, service.port)
        ),
    }
}
