//! The shared flow table: a two-node fixture cluster and, for each behaviour of DESIGN §3
//! the proxy rules must show, the connections that show it — "from this source to this
//! address and port: these endpoints, masqueraded or not" (kube-proxy's
//! `runPacketFlowTests`). Plain data, so the renderer tests (packet tracer) and the kernel
//! tests (real traffic in network namespaces) run the same table.
//!
//! Addresses:
//!
//! | what                  | IPv4                          | IPv6                      |
//! |-----------------------|-------------------------------|---------------------------|
//! | cluster CIDR          | 10.244.0.0/16                 | fd00:10:244::/48          |
//! | node-a, its pods      | 192.168.10.1, 10.244.1.0/24   | fd00:192:168:10::1, fd00:10:244:1::/64 |
//! | node-b, its pods      | 192.168.10.2, 10.244.2.0/24   | fd00:192:168:10::2, fd00:10:244:2::/64 |
//! | a node not in the fixture (endpoints only) | 10.244.3.0/24 |                     |
//! | off-cluster clients   | 192.168.10.100, 198.51.100.7  | fd00:192:168:10::100      |
//! | cluster IPs           | 10.96.0.0/16                  | fd00:10:96::/112          |
//! | external IPs          | 192.0.2.50                    |                           |
//! | load-balancer IPs     | 203.0.113.0/24                |                           |
//!
//! Services (namespace `demo`, port 80 → 8080 unless noted):
//!
//! | service     | shape                                                               |
//! |-------------|---------------------------------------------------------------------|
//! | `web`       | ClusterIP 10.96.0.10 / fd00:10:96::10, three endpoints (two IPv6)   |
//! | `masq-all`  | ClusterIP 10.96.0.11, masquerade-all                                |
//! | `hairpin`   | ClusterIP 10.96.0.12, one endpoint on node-a                        |
//! | `nodeport`  | NodePort 30080, Cluster policy, 10.96.0.20 / fd00:10:96::20         |
//! | `local-lb`  | LoadBalancer 203.0.113.30 (VIP), node port 30090, health check 32090, externalTrafficPolicy Local, both endpoints on node-a |
//! | `lb-ranges` | LoadBalancer 203.0.113.40, node port 30100, Cluster policy, source range 198.51.100.0/24 |
//! | `ext-ip`    | ClusterIP 10.96.0.50 with external IP 192.0.2.50, Cluster policy    |
//! | `proxy-lb`  | LoadBalancer 203.0.113.60 with ipMode Proxy, node port 30160        |
//! | `itp-local` | ClusterIP 10.96.0.70, internalTrafficPolicy Local, endpoints on node-a and on a third node |
//! | `empty`     | NodePort 30180 without endpoints, 10.96.0.80                        |
//! | `sticky`    | ClusterIP 10.96.0.90, ClientIP affinity (10800 s)                   |
//! | `dns`       | ClusterIP 10.96.0.53, UDP 53 → 53                                   |
//! | `sctp`      | ClusterIP 10.96.0.100, SCTP 9999 → 9999                             |

#![allow(dead_code, reason = "each test file uses a different part")]

use std::net::IpAddr;

use proxyplan_crds::{
    EmptyAction, Endpoint, IpFamily, LoadBalancerIp, LoadBalancerIpMode, LocalTrafficDetection,
    LocalTrafficMode, MasqueradePlan, MergedPlan, Protocol, ServicePortPlan, SessionAffinity,
    TrafficPlan, TrafficPolicy,
};

/// A node of the fixture cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Node {
    /// `node-a`: has the endpoints of every Local-policy Service.
    A,
    /// `node-b`: has none of them.
    B,
}

impl Node {
    /// The node's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::A => "node-a",
            Self::B => "node-b",
        }
    }

    /// The node's addresses (IPv4, IPv6).
    pub fn addresses(self) -> [&'static str; 2] {
        match self {
            Self::A => ["192.168.10.1", "fd00:192:168:10::1"],
            Self::B => ["192.168.10.2", "fd00:192:168:10::2"],
        }
    }

    /// The node's pod CIDRs (IPv4, IPv6).
    pub fn pod_cidrs(self) -> [&'static str; 2] {
        match self {
            Self::A => ["10.244.1.0/24", "fd00:10:244:1::/64"],
            Self::B => ["10.244.2.0/24", "fd00:10:244:2::/64"],
        }
    }

    /// The node's addresses, parsed.
    pub fn local_addresses(self) -> Vec<IpAddr> {
        self.addresses()
            .iter()
            .map(|a| a.parse().expect("fixture address"))
            .collect()
    }
}

/// Where a connection starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A pod (on the flow's node when its source is in that node's pod CIDR).
    Pod,
    /// A client outside the cluster whose packets reach the flow's node.
    OffCluster,
    /// A process on the flow's node itself (source: the node's address).
    Host,
}

/// What must happen to a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Accepted and sent to one of exactly these endpoints (every one reachable),
    /// masqueraded or not.
    Endpoints {
        /// `ip:port` or `[ip6]:port`.
        endpoints: &'static [&'static str],
        /// Whether the endpoint sees the node's address instead of the client's.
        masquerade: bool,
    },
    /// Refused with an ICMP error / TCP reset.
    Reject,
    /// Silently dropped.
    Drop,
    /// Not the proxy's business: no DNAT, no masquerade, not refused.
    NotProxied,
}

/// One connection and its expected fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// What the flow shows.
    pub name: &'static str,
    /// The node whose rules the packet meets.
    pub node: Node,
    /// Where it starts.
    pub from: Origin,
    /// Source address.
    pub source: &'static str,
    /// Destination address.
    pub dest: &'static str,
    /// Destination port.
    pub port: u16,
    /// Transport protocol.
    pub protocol: Protocol,
    /// What must happen.
    pub expect: Expect,
    /// A known renderer bug that makes this flow fail today (runners report it as
    /// ignored until the bug is fixed).
    pub known_bug: Option<&'static str>,
}

const TCP: Protocol = Protocol::TCP;

const fn to(endpoints: &'static [&'static str]) -> Expect {
    Expect::Endpoints {
        endpoints,
        masquerade: false,
    }
}

const fn masq(endpoints: &'static [&'static str]) -> Expect {
    Expect::Endpoints {
        endpoints,
        masquerade: true,
    }
}

const WEB: &[&str] = &["10.244.1.10:8080", "10.244.2.10:8080", "10.244.2.11:8080"];
const WEB6: &[&str] = &["[fd00:10:244:1::10]:8080", "[fd00:10:244:2::10]:8080"];
const NODEPORT: &[&str] = &["10.244.1.20:8080", "10.244.2.20:8080"];
const LOCAL_LB: &[&str] = &["10.244.1.30:8080", "10.244.1.31:8080"];
const LB_RANGES: &[&str] = &["10.244.1.40:8080", "10.244.2.40:8080"];

/// Load-balancing, masquerade of off-cluster and host traffic, masquerade-all, hairpin.
pub const CLUSTER_IP: &[Flow] = &[
    Flow {
        name: "pod to cluster IP: every endpoint, source kept",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "10.96.0.10",
        port: 80,
        protocol: TCP,
        expect: to(WEB),
        known_bug: None,
    },
    Flow {
        name: "pod on node-b to cluster IP: same endpoints",
        node: Node::B,
        from: Origin::Pod,
        source: "10.244.2.5",
        dest: "10.96.0.10",
        port: 80,
        protocol: TCP,
        expect: to(WEB),
        known_bug: None,
    },
    Flow {
        name: "off-cluster client to cluster IP: masqueraded",
        node: Node::A,
        from: Origin::OffCluster,
        source: "192.168.10.100",
        dest: "10.96.0.10",
        port: 80,
        protocol: TCP,
        expect: masq(WEB),
        known_bug: None,
    },
    Flow {
        name: "host to cluster IP: masqueraded (the node address is outside the cluster CIDR)",
        node: Node::A,
        from: Origin::Host,
        source: "192.168.10.1",
        dest: "10.96.0.10",
        port: 80,
        protocol: TCP,
        expect: masq(WEB),
        known_bug: None,
    },
    Flow {
        name: "pod to cluster IP on a port the Service does not have: not proxied",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "10.96.0.10",
        port: 81,
        protocol: TCP,
        expect: Expect::NotProxied,
        known_bug: None,
    },
    Flow {
        name: "masqueradeAll: pod to cluster IP masqueraded",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "10.96.0.11",
        port: 80,
        protocol: TCP,
        expect: masq(&["10.244.1.11:8080"]),
        known_bug: None,
    },
    Flow {
        name: "hairpin: an endpoint reaching itself through its Service is masqueraded",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.12",
        dest: "10.96.0.12",
        port: 80,
        protocol: TCP,
        expect: masq(&["10.244.1.12:8080"]),
        known_bug: None,
    },
    Flow {
        name: "another pod to the hairpin Service: source kept",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "10.96.0.12",
        port: 80,
        protocol: TCP,
        expect: to(&["10.244.1.12:8080"]),
        known_bug: None,
    },
];

/// NodePort with `externalTrafficPolicy: Cluster`.
pub const NODE_PORT: &[Flow] = &[
    Flow {
        name: "off-cluster client to node port (Cluster policy): every endpoint, masqueraded",
        node: Node::A,
        from: Origin::OffCluster,
        source: "192.168.10.100",
        dest: "192.168.10.1",
        port: 30080,
        protocol: TCP,
        expect: masq(NODEPORT),
        known_bug: None,
    },
    Flow {
        name: "off-cluster client to node port of node-b (Cluster policy)",
        node: Node::B,
        from: Origin::OffCluster,
        source: "192.168.10.100",
        dest: "192.168.10.2",
        port: 30080,
        protocol: TCP,
        expect: masq(NODEPORT),
        known_bug: None,
    },
    Flow {
        name: "pod to node port (Cluster policy): masqueraded",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "192.168.10.1",
        port: 30080,
        protocol: TCP,
        expect: masq(NODEPORT),
        known_bug: None,
    },
    Flow {
        name: "host to its own node port (Cluster policy): masqueraded",
        node: Node::A,
        from: Origin::Host,
        source: "192.168.10.1",
        dest: "192.168.10.1",
        port: 30080,
        protocol: TCP,
        expect: masq(NODEPORT),
        known_bug: None,
    },
    Flow {
        name: "host to 127.0.0.1 and a node port: not captured (no route_localnet, as kube-proxy's nftables mode)",
        node: Node::A,
        from: Origin::Host,
        source: "127.0.0.1",
        dest: "127.0.0.1",
        port: 30080,
        protocol: TCP,
        expect: Expect::NotProxied,
        known_bug: None,
    },
    Flow {
        name: "host to [::1] and a node port: not captured (IPv6 loopback cannot reach a pod)",
        node: Node::A,
        from: Origin::Host,
        source: "::1",
        dest: "::1",
        port: 30080,
        protocol: TCP,
        expect: Expect::NotProxied,
        known_bug: None,
    },
    Flow {
        name: "pod to the node port's cluster IP: source kept",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "10.96.0.20",
        port: 80,
        protocol: TCP,
        expect: to(NODEPORT),
        known_bug: None,
    },
];

/// `externalTrafficPolicy: Local`: node port and load-balancer IP, on a node with local
/// endpoints (A) and on one without (B).
pub const EXTERNAL_LOCAL: &[Flow] = &[
    Flow {
        name: "off-cluster client to node port (Local policy): local endpoints, source kept",
        node: Node::A,
        from: Origin::OffCluster,
        source: "192.168.10.100",
        dest: "192.168.10.1",
        port: 30090,
        protocol: TCP,
        expect: to(LOCAL_LB),
        known_bug: None,
    },
    Flow {
        name: "off-cluster client to LB IP (Local policy): local endpoints, source kept",
        node: Node::A,
        from: Origin::OffCluster,
        source: "192.168.10.100",
        dest: "203.0.113.30",
        port: 80,
        protocol: TCP,
        expect: to(LOCAL_LB),
        known_bug: None,
    },
    Flow {
        name: "off-cluster client to node port of a node without local endpoints: dropped",
        node: Node::B,
        from: Origin::OffCluster,
        source: "192.168.10.100",
        dest: "192.168.10.2",
        port: 30090,
        protocol: TCP,
        expect: Expect::Drop,
        known_bug: None,
    },
    Flow {
        name: "off-cluster client to LB IP via a node without local endpoints: dropped",
        node: Node::B,
        from: Origin::OffCluster,
        source: "192.168.10.100",
        dest: "203.0.113.30",
        port: 80,
        protocol: TCP,
        expect: Expect::Drop,
        known_bug: None,
    },
    Flow {
        name: "host to its node port (Local policy, no local endpoint): masqueraded to cluster endpoints",
        node: Node::B,
        from: Origin::Host,
        source: "192.168.10.2",
        dest: "192.168.10.2",
        port: 30090,
        protocol: TCP,
        expect: masq(LOCAL_LB),
        known_bug: None,
    },
    Flow {
        name: "host to LB IP (Local policy, no local endpoint): masqueraded to cluster endpoints",
        node: Node::B,
        from: Origin::Host,
        source: "192.168.10.2",
        dest: "203.0.113.30",
        port: 80,
        protocol: TCP,
        expect: masq(LOCAL_LB),
        known_bug: None,
    },
    Flow {
        name: "host to its node port (Local policy, local endpoints): masqueraded",
        node: Node::A,
        from: Origin::Host,
        source: "192.168.10.1",
        dest: "192.168.10.1",
        port: 30090,
        protocol: TCP,
        expect: masq(LOCAL_LB),
        known_bug: None,
    },
    Flow {
        name: "pod to node port (Local policy): short-circuited to cluster endpoints, source kept",
        node: Node::B,
        from: Origin::Pod,
        source: "10.244.2.5",
        dest: "192.168.10.2",
        port: 30090,
        protocol: TCP,
        expect: to(LOCAL_LB),
        known_bug: None,
    },
    Flow {
        name: "pod to LB IP (Local policy): short-circuited to cluster endpoints, source kept",
        node: Node::B,
        from: Origin::Pod,
        source: "10.244.2.5",
        dest: "203.0.113.30",
        port: 80,
        protocol: TCP,
        expect: to(LOCAL_LB),
        known_bug: None,
    },
    Flow {
        name: "pod to cluster IP of a Local-external Service: every endpoint",
        node: Node::B,
        from: Origin::Pod,
        source: "10.244.2.5",
        dest: "10.96.0.30",
        port: 80,
        protocol: TCP,
        expect: to(LOCAL_LB),
        known_bug: None,
    },
];

/// `loadBalancerSourceRanges`: only for traffic addressed to the load-balancer IP.
pub const LB_SOURCE_RANGES: &[Flow] = &[
    Flow {
        name: "allowed source to LB IP: every endpoint, masqueraded",
        node: Node::A,
        from: Origin::OffCluster,
        source: "198.51.100.7",
        dest: "203.0.113.40",
        port: 80,
        protocol: TCP,
        expect: masq(LB_RANGES),
        known_bug: None,
    },
    Flow {
        name: "other source to LB IP (forwarded, the LB IP is not a node address): dropped",
        node: Node::A,
        from: Origin::OffCluster,
        source: "192.168.10.100",
        dest: "203.0.113.40",
        port: 80,
        protocol: TCP,
        expect: Expect::Drop,
        known_bug: None,
    },
    Flow {
        name: "host outside the source ranges to LB IP: dropped",
        node: Node::A,
        from: Origin::Host,
        source: "192.168.10.1",
        dest: "203.0.113.40",
        port: 80,
        protocol: TCP,
        expect: Expect::Drop,
        known_bug: None,
    },
    Flow {
        name: "other source to node port: source ranges do not apply",
        node: Node::A,
        from: Origin::OffCluster,
        source: "192.168.10.100",
        dest: "192.168.10.1",
        port: 30100,
        protocol: TCP,
        expect: masq(LB_RANGES),
        known_bug: None,
    },
    Flow {
        name: "other source to the cluster IP: source ranges do not apply",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "10.96.0.40",
        port: 80,
        protocol: TCP,
        expect: to(LB_RANGES),
        known_bug: None,
    },
];

/// `externalIPs`, and load-balancer IPs with `ipMode: Proxy`.
pub const EXTERNAL_ADDRESSES: &[Flow] = &[
    Flow {
        name: "off-cluster client to external IP (Cluster policy): masqueraded",
        node: Node::A,
        from: Origin::OffCluster,
        source: "192.168.10.100",
        dest: "192.0.2.50",
        port: 80,
        protocol: TCP,
        expect: masq(&["10.244.2.50:8080"]),
        known_bug: None,
    },
    Flow {
        name: "pod to external IP (Cluster policy): masqueraded",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "192.0.2.50",
        port: 80,
        protocol: TCP,
        expect: masq(&["10.244.2.50:8080"]),
        known_bug: None,
    },
    Flow {
        name: "pod to external IP on another port: not proxied",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "192.0.2.50",
        port: 443,
        protocol: TCP,
        expect: Expect::NotProxied,
        known_bug: None,
    },
    Flow {
        name: "pod to a Proxy-mode LB IP: not captured (goes to the load balancer)",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "203.0.113.60",
        port: 80,
        protocol: TCP,
        expect: Expect::NotProxied,
        known_bug: None,
    },
    Flow {
        name: "proxying load balancer to the node port: masqueraded",
        node: Node::A,
        from: Origin::OffCluster,
        source: "192.168.10.100",
        dest: "192.168.10.1",
        port: 30160,
        protocol: TCP,
        expect: masq(&["10.244.2.60:8080"]),
        known_bug: None,
    },
];

/// `internalTrafficPolicy: Local`.
pub const INTERNAL_LOCAL: &[Flow] = &[
    Flow {
        name: "pod to cluster IP (internal Local): the local endpoint only",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "10.96.0.70",
        port: 80,
        protocol: TCP,
        expect: to(&["10.244.1.70:8080"]),
        known_bug: None,
    },
    Flow {
        name: "off-cluster client to cluster IP (internal Local): local endpoint, masqueraded",
        node: Node::A,
        from: Origin::OffCluster,
        source: "192.168.10.100",
        dest: "10.96.0.70",
        port: 80,
        protocol: TCP,
        expect: masq(&["10.244.1.70:8080"]),
        known_bug: None,
    },
    Flow {
        name: "pod to cluster IP (internal Local) on a node without local endpoints: dropped",
        node: Node::B,
        from: Origin::Pod,
        source: "10.244.2.5",
        dest: "10.96.0.70",
        port: 80,
        protocol: TCP,
        expect: Expect::Drop,
        known_bug: None,
    },
];

/// Services without endpoints.
pub const NO_ENDPOINTS: &[Flow] = &[
    Flow {
        name: "pod to cluster IP without endpoints: rejected",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "10.96.0.80",
        port: 80,
        protocol: TCP,
        expect: Expect::Reject,
        known_bug: None,
    },
    Flow {
        name: "host to cluster IP without endpoints: rejected",
        node: Node::A,
        from: Origin::Host,
        source: "192.168.10.1",
        dest: "10.96.0.80",
        port: 80,
        protocol: TCP,
        expect: Expect::Reject,
        known_bug: None,
    },
    Flow {
        name: "off-cluster client to node port without endpoints: rejected",
        node: Node::A,
        from: Origin::OffCluster,
        source: "192.168.10.100",
        dest: "192.168.10.1",
        port: 30180,
        protocol: TCP,
        expect: Expect::Reject,
        known_bug: None,
    },
];

/// ClientIP affinity (first connection: any endpoint; the `recent` rules are checked by
/// the renderer tests).
pub const AFFINITY: &[Flow] = &[Flow {
    name: "pod to ClientIP-affinity Service, first connection: any endpoint",
    node: Node::A,
    from: Origin::Pod,
    source: "10.244.1.5",
    dest: "10.96.0.90",
    port: 80,
    protocol: TCP,
    expect: to(&["10.244.1.90:8080", "10.244.2.90:8080"]),
    known_bug: None,
}];

/// IPv6 entries (the fixture is dual-stack for `web` and `nodeport`).
pub const IPV6: &[Flow] = &[
    Flow {
        name: "IPv6 pod to IPv6 cluster IP: IPv6 endpoints, source kept",
        node: Node::A,
        from: Origin::Pod,
        source: "fd00:10:244:1::5",
        dest: "fd00:10:96::10",
        port: 80,
        protocol: TCP,
        expect: to(WEB6),
        known_bug: None,
    },
    Flow {
        name: "IPv6 off-cluster client to IPv6 cluster IP: masqueraded",
        node: Node::A,
        from: Origin::OffCluster,
        source: "fd00:192:168:10::100",
        dest: "fd00:10:96::10",
        port: 80,
        protocol: TCP,
        expect: masq(WEB6),
        known_bug: None,
    },
    Flow {
        name: "IPv6 off-cluster client to IPv6 node port: masqueraded",
        node: Node::A,
        from: Origin::OffCluster,
        source: "fd00:192:168:10::100",
        dest: "fd00:192:168:10::1",
        port: 30080,
        protocol: TCP,
        expect: masq(&["[fd00:10:244:2::20]:8080"]),
        known_bug: None,
    },
];

/// UDP and SCTP.
pub const PROTOCOLS: &[Flow] = &[
    Flow {
        name: "pod to UDP service: every endpoint",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "10.96.0.53",
        port: 53,
        protocol: Protocol::UDP,
        expect: to(&["10.244.1.53:53", "10.244.2.53:53"]),
        known_bug: None,
    },
    Flow {
        name: "off-cluster UDP client to cluster IP: masqueraded",
        node: Node::A,
        from: Origin::OffCluster,
        source: "192.168.10.100",
        dest: "10.96.0.53",
        port: 53,
        protocol: Protocol::UDP,
        expect: masq(&["10.244.1.53:53", "10.244.2.53:53"]),
        known_bug: None,
    },
    Flow {
        name: "TCP to a UDP-only service port: not proxied",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "10.96.0.53",
        port: 53,
        protocol: TCP,
        expect: Expect::NotProxied,
        known_bug: None,
    },
    Flow {
        name: "pod to SCTP service",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "10.96.0.100",
        port: 9999,
        protocol: Protocol::SCTP,
        expect: to(&["10.244.2.100:9999"]),
        known_bug: None,
    },
    Flow {
        name: "TCP to an SCTP-only service port: not proxied",
        node: Node::A,
        from: Origin::Pod,
        source: "10.244.1.5",
        dest: "10.96.0.100",
        port: 9999,
        protocol: TCP,
        expect: Expect::NotProxied,
        known_bug: None,
    },
];

/// Every group, named.
pub const ALL: &[(&str, &[Flow])] = &[
    ("cluster IP", CLUSTER_IP),
    ("node port", NODE_PORT),
    ("external Local", EXTERNAL_LOCAL),
    ("LB source ranges", LB_SOURCE_RANGES),
    ("external addresses", EXTERNAL_ADDRESSES),
    ("internal Local", INTERNAL_LOCAL),
    ("no endpoints", NO_ENDPOINTS),
    ("affinity", AFFINITY),
    ("IPv6", IPV6),
    ("protocols", PROTOCOLS),
];

/// Every flow.
pub fn all() -> impl Iterator<Item = &'static Flow> {
    ALL.iter().flat_map(|(_, flows)| flows.iter())
}

// ----- the fixture plan -----

/// Local-traffic detection of the fixture: by cluster CIDR.
pub const CLUSTER_CIDRS: [&str; 2] = ["10.244.0.0/16", "fd00:10:244::/48"];

/// The fixture's merged plan, as `node`'s agent sees it.
pub fn plan(node: Node) -> MergedPlan {
    let on_a = node == Node::A;
    let local_lb_local: &[&str] = if on_a { LOCAL_LB } else { &[] };
    let itp_local: &[&str] = if on_a { &["10.244.1.70:8080"] } else { &[] };
    let ports = vec![
        port("web", "10.96.0.10", 80).endpoints(WEB),
        port("web", "fd00:10:96::10", 80).endpoints(WEB6),
        port("masq-all", "10.96.0.11", 80)
            .endpoints(&["10.244.1.11:8080"])
            .masquerade_all(),
        port("hairpin", "10.96.0.12", 80).endpoints(&["10.244.1.12:8080"]),
        port("nodeport", "10.96.0.20", 80)
            .endpoints(NODEPORT)
            .node_port(30080),
        port("nodeport", "fd00:10:96::20", 80)
            .endpoints(&["[fd00:10:244:2::20]:8080"])
            .node_port(30080),
        port("local-lb", "10.96.0.30", 80)
            .endpoints(LOCAL_LB)
            .node_port(30090)
            .load_balancer("203.0.113.30", LoadBalancerIpMode::VIP)
            .external_local(32090, local_lb_local),
        port("lb-ranges", "10.96.0.40", 80)
            .endpoints(LB_RANGES)
            .node_port(30100)
            .load_balancer("203.0.113.40", LoadBalancerIpMode::VIP)
            .source_ranges(&["198.51.100.0/24"]),
        port("ext-ip", "10.96.0.50", 80)
            .endpoints(&["10.244.2.50:8080"])
            .external_ips(&["192.0.2.50"]),
        port("proxy-lb", "10.96.0.60", 80)
            .endpoints(&["10.244.2.60:8080"])
            .node_port(30160)
            .load_balancer("203.0.113.60", LoadBalancerIpMode::Proxy),
        // internalTrafficPolicy Local and no external address: the planner fills no
        // cluster list; an endpoint elsewhere (10.244.3.70) makes "none here" a DROP.
        port("itp-local", "10.96.0.70", 80).internal_local(itp_local, EmptyAction::Drop),
        port("empty", "10.96.0.80", 80).node_port(30180),
        port("sticky", "10.96.0.90", 80)
            .endpoints(&["10.244.1.90:8080", "10.244.2.90:8080"])
            .affinity(10800),
        port("dns", "10.96.0.53", 53)
            .protocol(Protocol::UDP)
            .endpoints(&["10.244.1.53:53", "10.244.2.53:53"]),
        port("sctp", "10.96.0.100", 9999)
            .protocol(Protocol::SCTP)
            .endpoints(&["10.244.2.100:9999"]),
    ];
    merged(node, ports)
}

/// A merged plan for `node` holding `ports` (sorted by key), detection by cluster CIDR.
pub fn merged(node: Node, mut ports: Vec<ServicePortPlan>) -> MergedPlan {
    ports.sort_by(|a, b| a.key.cmp(&b.key));
    MergedPlan {
        node_name: node.name().to_owned(),
        revision: "fixture".to_owned(),
        services_fingerprint: 0,
        refused: Vec::new(),
        unmatched: Vec::new(),
        addresses: node.local_addresses(),
        local_traffic: LocalTrafficDetection {
            mode: LocalTrafficMode::ClusterCIDR,
            cidrs: CLUSTER_CIDRS.iter().map(|c| (*c).to_owned()).collect(),
            interface: None,
        },
        service_ports: ports.into_iter().map(std::sync::Arc::new).collect(),
        service_cidrs: Vec::new(),
    }
}

// ----- builders -----

/// `10.244.1.5:8080` or `[fd00::5]:8080`.
pub fn ep(text: &str) -> Endpoint {
    let (ip, port) = text.rsplit_once(':').expect("ip:port");
    Endpoint {
        ip: ip.trim_matches(['[', ']']).into(),
        port: port.parse().expect("port"),
    }
}

fn eps(list: &[&str]) -> Vec<Endpoint> {
    list.iter().map(|e| ep(e)).collect()
}

const CLUSTER_REJECT: TrafficPlan = TrafficPlan {
    policy: TrafficPolicy::Cluster,
    when_empty: EmptyAction::Reject,
};

/// A ClusterIP TCP service port `demo/<name>:http` as the planner writes it with
/// cluster-CIDR detection: Cluster policy, masquerade of off-cluster and hairpin traffic,
/// no endpoints yet.
pub fn port(name: &str, cluster_ip: &str, port: u16) -> ServicePortPlan {
    let family = if cluster_ip.contains(':') {
        IpFamily::IPv6
    } else {
        IpFamily::IPv4
    };
    ServicePortPlan {
        key: format!("demo/{name}:http/TCP/{family}"),
        namespace: "demo".into(),
        name: name.into(),
        port_name: "http".into(),
        family,
        protocol: Protocol::TCP,
        port,
        cluster_ip: cluster_ip.into(),
        external_ips: vec![],
        load_balancer_ips: vec![],
        node_port: None,
        load_balancer_source_ranges: vec![],
        health_check_node_port: None,
        session_affinity: None,
        internal: CLUSTER_REJECT,
        external: None,
        cluster_endpoints: vec![],
        zone_endpoints: Vec::new(),
        local_endpoints: vec![],
        masquerade: MasqueradePlan {
            all: false,
            off_cluster_to_cluster_ip: true,
            external: false,
            local_host_to_external: false,
            hairpin: true,
        },
        local_terminating: false,
        also_serving: Vec::new(),
    }
}

/// Chainable changes to a service port, each mirroring what the planner decides.
pub trait PortBuilder: Sized {
    /// `clusterEndpoints`.
    fn endpoints(self, list: &[&str]) -> Self;
    /// Another protocol (the key follows).
    fn protocol(self, protocol: Protocol) -> Self;
    /// `--masquerade-all`.
    fn masquerade_all(self) -> Self;
    /// A node port; external traffic with Cluster policy unless set otherwise.
    fn node_port(self, port: u16) -> Self;
    /// External IPs; external traffic with Cluster policy unless set otherwise.
    fn external_ips(self, ips: &[&str]) -> Self;
    /// A load-balancer ingress IP; a VIP makes the port externally accessible.
    fn load_balancer(self, ip: &str, mode: LoadBalancerIpMode) -> Self;
    /// `loadBalancerSourceRanges`.
    fn source_ranges(self, ranges: &[&str]) -> Self;
    /// `externalTrafficPolicy: Local` with a health-check node port and this node's
    /// endpoints (call after the endpoints and external addresses).
    fn external_local(self, health_check: u16, local: &[&str]) -> Self;
    /// `internalTrafficPolicy: Local` with this node's endpoints.
    fn internal_local(self, local: &[&str], when_empty: EmptyAction) -> Self;
    /// ClientIP affinity.
    fn affinity(self, timeout_seconds: u32) -> Self;
}

impl PortBuilder for ServicePortPlan {
    fn endpoints(mut self, list: &[&str]) -> Self {
        self.cluster_endpoints = eps(list);
        self
    }

    fn protocol(mut self, protocol: Protocol) -> Self {
        self.key = format!(
            "{}/{}:{}/{protocol}/{}",
            self.namespace, self.name, self.port_name, self.family
        );
        self.protocol = protocol;
        self
    }

    fn masquerade_all(mut self) -> Self {
        self.masquerade.all = true;
        self
    }

    fn node_port(mut self, port: u16) -> Self {
        self.node_port = Some(port);
        self.make_external()
    }

    fn external_ips(mut self, ips: &[&str]) -> Self {
        self.external_ips = ips.iter().map(|ip| (*ip).to_owned()).collect();
        self.make_external()
    }

    fn load_balancer(mut self, ip: &str, mode: LoadBalancerIpMode) -> Self {
        self.load_balancer_ips.push(LoadBalancerIp {
            ip: ip.to_owned(),
            mode,
        });
        if mode == LoadBalancerIpMode::VIP {
            self.make_external()
        } else {
            self
        }
    }

    fn source_ranges(mut self, ranges: &[&str]) -> Self {
        self.load_balancer_source_ranges = ranges.iter().map(|r| (*r).to_owned()).collect();
        self
    }

    fn external_local(mut self, health_check: u16, local: &[&str]) -> Self {
        self.health_check_node_port = Some(health_check);
        self.local_endpoints = eps(local);
        self.external = Some(TrafficPlan {
            policy: TrafficPolicy::Local,
            when_empty: if self.cluster_endpoints.is_empty() {
                EmptyAction::Reject
            } else {
                EmptyAction::Drop
            },
        });
        self.masquerade.external = false;
        self.masquerade.local_host_to_external = true;
        self
    }

    fn internal_local(mut self, local: &[&str], when_empty: EmptyAction) -> Self {
        self.local_endpoints = eps(local);
        self.internal = TrafficPlan {
            policy: TrafficPolicy::Local,
            when_empty,
        };
        self
    }

    fn affinity(mut self, timeout_seconds: u32) -> Self {
        self.session_affinity = Some(SessionAffinity { timeout_seconds });
        self
    }
}

trait MakeExternal {
    fn make_external(self) -> Self;
}

impl MakeExternal for ServicePortPlan {
    fn make_external(mut self) -> Self {
        if self.external.is_none() {
            self.external = Some(CLUSTER_REJECT);
            self.masquerade.external = true;
        }
        self
    }
}
