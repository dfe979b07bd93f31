//! The IPVS generic-netlink constants and commands, named after their definitions in the
//! Linux uapi headers (`include/uapi/linux/ip_vs.h`, `genetlink.h`, `socket.h`, `in.h`).
//! A long table, kept in one place.

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
/// `IPVS_CMD_ATTR_DAEMON`: nested sync-daemon attributes (never sent by the agent).
pub const IPVS_CMD_ATTR_DAEMON: u16 = 3;
/// `IPVS_CMD_ATTR_TIMEOUT_TCP` (u32 seconds): established TCP connections.
pub const IPVS_CMD_ATTR_TIMEOUT_TCP: u16 = 4;
/// `IPVS_CMD_ATTR_TIMEOUT_TCP_FIN` (u32 seconds): TCP connections after a FIN.
pub const IPVS_CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
/// `IPVS_CMD_ATTR_TIMEOUT_UDP` (u32 seconds): UDP "connections".
pub const IPVS_CMD_ATTR_TIMEOUT_UDP: u16 = 6;

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
/// `IP_VS_SVC_F_SCHED_MH_PORT` (= [`IP_VS_SVC_F_SCHED2`]): the `mh` scheduler hashes the
/// source port too (`ipvsadm --sched-flags mh-port`).
pub const IP_VS_SVC_F_SCHED_MH_PORT: u32 = IP_VS_SVC_F_SCHED2;
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
    /// `IPVS_CMD_SET_CONFIG`: set timeouts (also the command of the `GET_CONFIG` reply).
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
