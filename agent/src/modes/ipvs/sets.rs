//! The ipsets of the ipvs mode: one per family and [`Role`], each with its name and type.

use proxyplan_crds::{IpFamily, Protocol};

use crate::kernel::ipset::{PREFIX_V4, PREFIX_V6, SetSpec, SetType};

/// A protocol as ipset and iptables spell it.
pub(super) fn proto(p: Protocol) -> &'static str {
    match p {
        Protocol::TCP => "tcp",
        Protocol::UDP => "udp",
        Protocol::SCTP => "sctp",
    }
}

/// Every protocol a service port can have.
pub(super) const PROTOCOLS: [Protocol; 3] = [Protocol::TCP, Protocol::UDP, Protocol::SCTP];

/// What a set of the ipvs mode is for. Each family has one set per role, named
/// `PROXYPLAN-<ROLE>` (IPv4) or `PROXYPLAN6-<ROLE>` (IPv6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Cluster IPs whose traffic from outside the cluster is masqueraded.
    ClusterIp,
    /// Cluster IPs whose traffic is always masqueraded (`masqueradeAll`).
    ClusterIpAll,
    /// External addresses (external IPs, LB IPs) whose traffic is masqueraded.
    External,
    /// External addresses of Local-policy services: masquerade traffic from the node.
    ExternalLocal,
    /// LB IPs with source ranges.
    LbFw,
    /// Allowed (LB IP, port, source range).
    LbSrcCidr,
    /// Allowed (LB IP, port, LB IP): the node itself when a range covers it.
    LbSrcIp,
    /// Addresses whose traffic is dropped (Local policy, no local endpoint).
    Drop,
    /// (endpoint, port, endpoint): an endpoint reaching itself through its service.
    LoopBack,
    /// Node-port addresses.
    NodeIp,
    /// Health-check node ports (accepted in the filter table).
    HcNodePort,
    /// Node ports whose traffic is masqueraded, per protocol.
    NodePort(Protocol),
    /// Node ports of Local-policy services: masquerade traffic from the node.
    NodePortLocal(Protocol),
    /// Node ports whose traffic is dropped (Local policy, no local endpoint).
    NodePortDrop(Protocol),
    /// Every (VIP, port) a virtual server serves: cluster IPs, external IPs, LB IPs
    /// (kube-proxy's KUBE-CLUSTER-IP, -EXTERNAL-IP, -LOAD-BALANCER together). New
    /// connections to a [`Role::Vip`] address on any other port are rejected.
    VipPort,
    /// Every address on the dummy interface (kube-proxy's KUBE-IPVS-IPS): VIPs that are
    /// not the node's own addresses on another interface.
    Vip,
}

impl Role {
    /// Every role.
    pub const ALL: [Self; 22] = [
        Self::ClusterIp,
        Self::ClusterIpAll,
        Self::External,
        Self::ExternalLocal,
        Self::LbFw,
        Self::LbSrcCidr,
        Self::LbSrcIp,
        Self::Drop,
        Self::LoopBack,
        Self::NodeIp,
        Self::HcNodePort,
        Self::NodePort(Protocol::TCP),
        Self::NodePort(Protocol::UDP),
        Self::NodePort(Protocol::SCTP),
        Self::NodePortLocal(Protocol::TCP),
        Self::NodePortLocal(Protocol::UDP),
        Self::NodePortLocal(Protocol::SCTP),
        Self::NodePortDrop(Protocol::TCP),
        Self::NodePortDrop(Protocol::UDP),
        Self::NodePortDrop(Protocol::SCTP),
        Self::VipPort,
        Self::Vip,
    ];

    fn suffix(self) -> String {
        let port = |what: &str, p: Protocol| format!("{what}-{}", proto(p).to_uppercase());
        match self {
            Self::ClusterIp => "CLUSTER-IP".into(),
            Self::ClusterIpAll => "CLUSTER-IP-ALL".into(),
            Self::External => "EXTERNAL".into(),
            Self::ExternalLocal => "EXTERNAL-LOCAL".into(),
            Self::LbFw => "LB-FW".into(),
            Self::LbSrcCidr => "LB-SRC-CIDR".into(),
            Self::LbSrcIp => "LB-SRC-IP".into(),
            Self::Drop => "DROP".into(),
            Self::LoopBack => "LOOP-BACK".into(),
            Self::NodeIp => "NODE-IP".into(),
            Self::HcNodePort => "HC-NODE-PORT".into(),
            Self::NodePort(p) => port("NP", p),
            Self::NodePortLocal(p) => port("NP-LOCAL", p),
            Self::NodePortDrop(p) => port("NP-DROP", p),
            Self::VipPort => "VIP-PORT".into(),
            Self::Vip => "VIP".into(),
        }
    }

    fn kind(self) -> SetType {
        match self {
            Self::ClusterIp
            | Self::ClusterIpAll
            | Self::External
            | Self::ExternalLocal
            | Self::LbFw
            | Self::Drop
            | Self::VipPort => SetType::HashIpPort,
            Self::LbSrcCidr => SetType::HashIpPortNet,
            Self::LbSrcIp | Self::LoopBack => SetType::HashIpPortIp,
            Self::NodeIp | Self::Vip => SetType::HashIp,
            Self::HcNodePort
            | Self::NodePort(_)
            | Self::NodePortLocal(_)
            | Self::NodePortDrop(_) => SetType::BitmapPort,
        }
    }
}

/// One of the agent's sets: a family and a role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SetId {
    /// The IPv6 set (`PROXYPLAN6-*`)?
    pub ipv6: bool,
    /// What it is for.
    pub role: Role,
}

impl SetId {
    /// Its name.
    #[must_use]
    pub fn name(self) -> String {
        let prefix = if self.ipv6 { PREFIX_V6 } else { PREFIX_V4 };
        format!("{prefix}{}", self.role.suffix())
    }

    /// Its type and family (port bitmaps have none: `ipset save` shows no family).
    #[must_use]
    pub fn spec(self) -> SetSpec {
        let kind = self.role.kind();
        SetSpec {
            kind,
            ipv6: self.ipv6 && kind != SetType::BitmapPort,
        }
    }

    /// Every set of one family.
    pub fn of_family(ipv6: bool) -> impl Iterator<Item = Self> {
        Role::ALL.into_iter().map(move |role| Self { ipv6, role })
    }
}

/// The name of the set of `family` for `role`.
pub(super) fn set_name(family: IpFamily, role: Role) -> String {
    SetId {
        ipv6: family == IpFamily::IPv6,
        role,
    }
    .name()
}
