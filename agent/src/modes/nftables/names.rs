//! The names of the nftables mode's tables, chains, sets and maps. Fixed objects follow
//! kube-proxy's nftables mode; per-Service objects carry a hash of the entry's key and,
//! for people reading `nft list table ip proxyplan`, the Service they serve:
//! `service-ULMVA6XW-demo/web/tcp/http`.

use proxyplan_crds::{Protocol, ServicePortPlan, stable_hash};

/// The table, one per family (`table ip proxyplan`, `table ip6 proxyplan`).
pub const TABLE: &str = "proxyplan";
/// The tables of kube-proxy's nftables mode, which the agent never touches.
pub const KUBE_PROXY_TABLE: &str = "kube-proxy";

/// filter, prerouting, priority −110: the load-balancer source ranges, before DNAT.
pub const FILTER_PREROUTING_PRE_DNAT: &str = "filter-prerouting-pre-dnat";
/// filter, output, priority −110: the same for the node's own traffic.
pub const FILTER_OUTPUT_PRE_DNAT: &str = "filter-output-pre-dnat";
/// filter, forward, priority 0.
pub const FILTER_FORWARD: &str = "filter-forward";
/// filter, input, priority 0.
pub const FILTER_INPUT: &str = "filter-input";
/// filter, output, priority 0.
pub const FILTER_OUTPUT: &str = "filter-output";
/// nat, prerouting, priority −100 (dstnat).
pub const NAT_PREROUTING: &str = "nat-prerouting";
/// nat, output, priority −100.
pub const NAT_OUTPUT: &str = "nat-output";
/// nat, postrouting, priority 100 (srcnat).
pub const NAT_POSTROUTING: &str = "nat-postrouting";

/// Drops sources outside `loadBalancerSourceRanges` (through `firewall-ips`).
pub const FIREWALL_CHECK: &str = "firewall-check";
/// Rejects or drops traffic to service addresses without endpoints.
pub const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
/// Rejects or drops traffic to node ports without endpoints.
pub const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
/// Rejects traffic to unknown ports of cluster IPs, drops traffic to unallocated ones.
pub const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
/// `reject`, for verdict maps (which hold verdicts, not statements).
pub const REJECT_CHAIN: &str = "reject-chain";
/// The service dispatch: `service-ips`, then node ports.
pub const SERVICES: &str = "services";
/// Masquerades marked and hairpin traffic.
pub const MASQUERADING: &str = "masquerading";

/// `ip . proto . port : verdict`: what traffic to a service address does.
pub const SERVICE_IPS: &str = "service-ips";
/// `proto . port : verdict`: what traffic to a node port does.
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
/// `ip . proto . port : verdict`: reject or drop for service addresses without endpoints.
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
/// `proto . port : verdict`: the same for node ports.
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
/// `ip . proto . port : verdict`: load-balancer addresses with source ranges.
pub const FIREWALL_IPS: &str = "firewall-ips";
/// Every cluster IP in use.
pub const CLUSTER_IPS: &str = "cluster-ips";
/// `endpoint . endpoint . proto . port`: an endpoint reaching itself through a Service.
pub const HAIRPIN: &str = "hairpin";

/// The protocols of the per-protocol maps.
pub const PROTOCOLS: [u8; 3] = [6, 17, 132];

/// `tcp`, `udp` or `sctp`.
#[must_use]
pub fn proto_word(proto: u8) -> &'static str {
    super::rules::proto_name(proto)
}

/// The protocol number of a plan's protocol.
#[must_use]
pub fn proto_number(p: Protocol) -> u8 {
    p.number()
}

/// How a shared balancing chain marks for masquerade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Masquerade {
    /// Never.
    None,
    /// Traffic from outside the cluster (local-traffic detection).
    NotLocal,
    /// Always.
    All,
}

impl Masquerade {
    /// What the names of its shared chains and their maps end with.
    fn suffix(self) -> &'static str {
        match self {
            Self::None => "",
            Self::NotLocal => "-masq-nonlocal",
            Self::All => "-masq",
        }
    }
}

/// Whether a shared balancing chain picks by service address or by node port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Balance {
    /// `ip daddr . th dport . slot` in `backends-*` maps.
    Address,
    /// `th dport . slot` in `nodeport-backends-*` maps.
    NodePort,
}

/// A chain shared by every ordinary Service port with `endpoints` endpoints that
/// masquerades the same way: `lb-3`, `lb-3-masq`, `lb-3-masq-nonlocal`,
/// `nodeport-lb-3-masq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedChain {
    /// By address or by node port.
    pub balance: Balance,
    /// How it masquerades.
    pub masquerade: Masquerade,
    /// The endpoint count (the modulus).
    pub endpoints: u32,
}

impl SharedChain {
    /// Its name.
    #[must_use]
    pub fn name(&self) -> String {
        let prefix = match self.balance {
            Balance::Address => "lb",
            Balance::NodePort => "nodeport-lb",
        };
        let suffix = self.masquerade.suffix();
        format!("{prefix}-{}{suffix}", self.endpoints)
    }

    /// The map its DNAT rule for protocol `proto` looks up: `ip . port . slot :
    /// endpoint` by address (`backends-tcp-3-masq` for `lb-3-masq`), `port . slot :
    /// endpoint` by node port (`nodeport-backends-tcp-3-masq`).
    ///
    /// Each shared chain has maps of its own. A rule that looks a map up is checked by
    /// nf_tables against every element the map holds when the rule is added, so a chain
    /// made for a new endpoint count over one map shared by all Services walked all of
    /// them (45 ms at 320,000 endpoints, each time a Service's count first reached a new
    /// value). A new chain's maps are empty when its rules are added.
    #[must_use]
    pub fn backends(&self, proto: u8) -> String {
        let prefix = match self.balance {
            Balance::Address => "",
            Balance::NodePort => "nodeport-",
        };
        let suffix = self.masquerade.suffix();
        format!(
            "{prefix}backends-{}-{}{suffix}",
            proto_word(proto),
            self.endpoints
        )
    }

    /// The chain called `name`, if it is a shared one.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        let (balance, rest) = if let Some(rest) = name.strip_prefix("nodeport-lb-") {
            (Balance::NodePort, rest)
        } else {
            (Balance::Address, name.strip_prefix("lb-")?)
        };
        let (count, masquerade) = if let Some(n) = rest.strip_suffix("-masq-nonlocal") {
            (n, Masquerade::NotLocal)
        } else if let Some(n) = rest.strip_suffix("-masq") {
            (n, Masquerade::All)
        } else {
            (rest, Masquerade::None)
        };
        let endpoints: u32 = count.parse().ok().filter(|n| *n > 0)?;
        let chain = Self {
            balance,
            masquerade,
            endpoints,
        };
        (chain.name() == name).then_some(chain)
    }
}

const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// The per-entry part of a name: 8 base32 characters of the key's hash and
/// `namespace/name/proto/port`.
#[must_use]
pub fn entry_id(entry: &ServicePortPlan) -> String {
    let mut hash = stable_hash(entry.key.as_bytes());
    let mut out = String::with_capacity(80);
    for _ in 0..8 {
        out.push(char::from(BASE32[(hash & 31) as usize]));
        hash >>= 5;
    }
    let port = if entry.port_name.is_empty() {
        entry.port.to_string()
    } else {
        entry.port_name.to_string()
    };
    out.push('-');
    out.push_str(&format!(
        "{}/{}/{}/{port}",
        entry.namespace,
        entry.name,
        proto_word(proto_number(entry.protocol))
    ));
    out
}

/// Which endpoint list of an entry a per-entry object is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum List {
    /// `clusterEndpoints`.
    Cluster,
    /// `localEndpoints`.
    Local,
}

impl List {
    fn prefix(self) -> &'static str {
        match self {
            Self::Cluster => "",
            Self::Local => "local-",
        }
    }
}

/// Chain of an entry's cluster IP (a Service with ClientIP affinity or Local policy).
#[must_use]
pub fn service_chain(id: &str) -> String {
    format!("service-{id}")
}

/// Chain of an entry's external addresses and node port.
#[must_use]
pub fn external_chain(id: &str) -> String {
    format!("external-{id}")
}

/// Chain of an entry's load-balancer source ranges.
#[must_use]
pub fn firewall_chain(id: &str) -> String {
    format!("firewall-{id}")
}

/// `slot : endpoint` map of one of an entry's lists.
#[must_use]
pub fn endpoints_map(id: &str, list: List) -> String {
    format!("{}endpoints-{id}", list.prefix())
}

/// The dynamic `client : endpoint` map of one of an entry's lists (ClientIP affinity
/// for `timeout` seconds: a new timeout is a new map).
#[must_use]
pub fn affinity_map(id: &str, list: List, timeout: u32) -> String {
    format!("{}affinity-{timeout}s-{id}", list.prefix())
}

/// The chain choosing an endpoint of one of an entry's lists with ClientIP affinity.
#[must_use]
pub fn affinity_chain(id: &str, list: List) -> String {
    format!("{}sticky-{id}", list.prefix())
}

/// `slot : goto endpoint chain` map of one of an entry's lists (ClientIP affinity).
#[must_use]
pub fn slots_map(id: &str, list: List) -> String {
    format!("{}slots-{id}", list.prefix())
}

/// The chain sending to the endpoint in `slot` of one of an entry's lists (ClientIP
/// affinity: it remembers the choice).
#[must_use]
pub fn endpoint_chain(id: &str, list: List, slot: usize) -> String {
    format!("{}endpoint-{id}/{slot}", list.prefix())
}
