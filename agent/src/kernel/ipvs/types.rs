//! The values IPVS messages carry: a virtual service, a real server, their counters.

use std::net::IpAddr;

use super::uapi::{
    AF_INET, AF_INET6, IP_VS_CONN_F_MASQ, IP_VS_SVC_F_PERSISTENT, IPPROTO_SCTP, IPPROTO_TCP,
    IPPROTO_UDP,
};

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
/// destination request names its service too); or, for `IPVS_CMD_SET_CONFIG` and the
/// reply to `IPVS_CMD_GET_CONFIG`, the connection timeouts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsAttributes {
    /// `IPVS_CMD_ATTR_SERVICE`.
    pub service: Option<IpvsService>,
    /// `IPVS_CMD_ATTR_DEST`.
    pub destination: Option<IpvsDestination>,
    /// `IPVS_CMD_ATTR_TIMEOUT_TCP`, `_TCP_FIN`, `_UDP`.
    pub timeouts: Option<IpvsTimeouts>,
}

/// IPVS's connection timeouts in seconds (`ipvsadm --set TCP TCPFIN UDP`). In a
/// `IPVS_CMD_SET_CONFIG` request a 0 leaves that timeout as the kernel has it
/// (`ip_vs_set_timeout` applies only non-zero values); the three are always sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IpvsTimeouts {
    /// `IPVS_CMD_ATTR_TIMEOUT_TCP`: established TCP connections (kernel default 900).
    pub tcp: u32,
    /// `IPVS_CMD_ATTR_TIMEOUT_TCP_FIN`: TCP after a FIN (kernel default 120).
    pub tcp_fin: u32,
    /// `IPVS_CMD_ATTR_TIMEOUT_UDP`: UDP (kernel default 300).
    pub udp: u32,
}

impl IpvsTimeouts {
    /// Whether every value is 0: nothing to change.
    #[must_use]
    pub fn is_unset(&self) -> bool {
        self.tcp == 0 && self.tcp_fin == 0 && self.udp == 0
    }
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
