//! The proxyplan API: `NodeProxyPlan` (one per node) and `ServiceProxyPlan` (the final
//! service port entries of one Service, shared by every node).
//!
//! The controller writes specs; the agent merges, for its node, the node overlay over its
//! zone's endpoint lists over each Service's entries, by service port key, and never
//! evaluates policy.
//!
//! Scale invariants (DESIGN §2) shape these types:
//! - one `ServiceProxyPlan` per Service (in the Service's namespace, named after it), so an
//!   endpoint change rewrites one object about the size of the EndpointSlice that changed,
//!   and a small cluster has a few small objects;
//! - a node plan names no Service: an endpoint change of an ordinary Service rewrites no
//!   node plan;
//! - overlays carry only the endpoint lists that differ on a node, never a full entry;
//! - nothing here lists nodes, so no object grows with the node count.

pub mod lenient;
mod revision;
pub mod runtime;
mod validate;
pub mod watch;

pub use compact_str::{CompactString, ToCompactString};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use revision::{revision_of, stable_hash};
pub use validate::{
    MergeCache, MergedPlan, PlanError, PlanRef, merge, merge_cached, merge_owned, merge_refs,
    merge_update, object_key, primary_addresses,
};

/// API group of every proxyplan kind.
pub const GROUP: &str = "proxyplan.dev";
/// API version of every proxyplan kind.
pub const VERSION: &str = "v1alpha1";
/// Label on every object the controller writes.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "proxyplan-controller";
/// Label on a `ServiceProxyPlan` naming its Service (a large Service's entries may be
/// spread over several objects, `<service>` and `<service>.<n>`).
pub const SERVICE_LABEL: &str = "proxyplan.dev/service";

/// Most endpoints one list may hold (`clusterEndpoints`, `localEndpoints`, a zone's list);
/// the controller keeps the first ones by address and raises a Warning Event on the
/// Service beyond that.
pub const MAX_ENDPOINTS: usize = 32_768;
/// Most `externalIPs` of one entry.
pub const MAX_EXTERNAL_IPS: usize = 1_024;
/// Most load-balancer IPs of one entry.
pub const MAX_LOAD_BALANCER_IPS: usize = 256;
/// Most `loadBalancerSourceRanges` of one entry.
pub const MAX_SOURCE_RANGES: usize = 1_024;
/// Most zone lists of one entry.
pub const MAX_ZONES: usize = 256;
/// Annotation on a plan object the controller wrote because EndpointSlices changed: the
/// newest `endpoints.kubernetes.io/last-change-trigger-time` of the Service's slices
/// (RFC 3339 with nanoseconds), the start of kube-proxy's
/// `network_programming_duration_seconds`.
pub const TRIGGER_TIME_ANNOTATION: &str = "proxyplan.dev/last-change-trigger-time";
/// Largest serialized `ServiceProxyPlan` the controller writes: a Service whose entries
/// do not fit in one is spread over several (etcd refuses objects over 1.5 MiB; this
/// keeps every object well under 1 MiB with its metadata).
pub const MAX_OBJECT_BYTES: usize = 768 * 1024;

/// Desired proxy state of one node: its identity and masquerade inputs, and the entries
/// whose endpoint lists differ on this node. The Services themselves are in the
/// `ServiceProxyPlan`s every node merges.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "proxyplan.dev",
    version = "v1alpha1",
    kind = "NodeProxyPlan",
    shortname = "npp",
    status = "NodeProxyPlanStatus",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeName"}"#,
    printcolumn = r#"{"name":"Wanted","type":"string","jsonPath":".spec.revision"}"#,
    printcolumn = r#"{"name":"Applied","type":"string","jsonPath":".status.appliedRevision"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Services","type":"integer","jsonPath":".status.servicePorts"}"#,
    printcolumn = r#"{"name":"Endpoints","type":"integer","jsonPath":".status.endpoints"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeProxyPlanSpec {
    /// Name of the node this plan is for (equal to the object's name).
    #[schemars(length(min = 1, max = 253))]
    pub node_name: String,
    /// Content hash of everything else in this spec; changes when, and only when, the
    /// node-specific part of the plan changes. Service revisions live in the
    /// `ServiceProxyPlan`s.
    #[schemars(length(min = 1, max = 64))]
    pub revision: String,
    /// The node's `topology.kubernetes.io/zone` label, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub zone: Option<String>,
    /// The node's pod CIDRs (`spec.podCIDRs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 2),
        inner(regex(pattern = r"^[0-9a-fA-F:.]+/[0-9]{1,3}$"))
    )]
    #[serde(rename = "podCIDRs")]
    pub pod_cidrs: Vec<String>,
    /// The node's addresses (`status.addresses` of type InternalIP and ExternalIP).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(regex(pattern = r"^[0-9a-fA-F:.]+$")))]
    pub addresses: Vec<String>,
    /// Which traffic counts as coming from inside the cluster, for masquerade decisions.
    pub local_traffic: LocalTrafficDetection,
    /// Endpoint lists that differ on this node (Local traffic policies, PreferSameNode
    /// hints). Sorted by key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overlay: Vec<EndpointOverride>,
    /// The cluster's Service IP ranges (its `ServiceCIDR` objects): traffic to an address
    /// in them that no Service holds is dropped, and to a Service's cluster IP on a port
    /// it does not serve rejected, as kube-proxy's nftables mode does.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        rename = "serviceCIDRs"
    )]
    #[schemars(
        length(max = 16),
        inner(regex(pattern = r"^[0-9a-fA-F:.]+/[0-9]{1,3}$"))
    )]
    pub service_cidrs: Vec<String>,
    /// Why load balancers should stop sending this node new traffic, when they should:
    /// the Node is being deleted, or carries the `ToBeDeletedByClusterAutoscaler` taint.
    /// The agent's `/healthz` then fails (kube-proxy's `nodeEligible: false`); `/livez`
    /// does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub ineligible: Option<String>,
}

/// How the agent tells in-cluster traffic from off-cluster traffic.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalTrafficDetection {
    /// Where the CIDRs came from.
    pub mode: LocalTrafficMode,
    /// Sources inside these CIDRs are in-cluster; empty means detection is off (and
    /// traffic to cluster IPs is not masqueraded unless `masqueradeAll`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 8),
        inner(regex(pattern = r"^[0-9a-fA-F:.]+/[0-9]{1,3}$"))
    )]
    pub cidrs: Vec<String>,
    /// `BridgeInterface`: traffic arriving on this interface is in-cluster;
    /// `InterfaceNamePrefix`: traffic arriving on any interface whose name starts with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15), regex(pattern = r"^[A-Za-z0-9_.-]+$"))]
    pub interface: Option<String>,
}

/// How in-cluster traffic is told apart (kube-proxy's `--detect-local-mode`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum LocalTrafficMode {
    /// Sources in the cluster CIDRs given to the controller.
    ClusterCIDR,
    /// Sources in this node's pod CIDRs.
    NodeCIDR,
    /// Packets arriving on the pods' bridge (`interface`).
    BridgeInterface,
    /// Packets arriving on an interface whose name starts with `interface` (pod veths).
    InterfaceNamePrefix,
}

/// Status written by the node's agent.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeProxyPlanStatus {
    /// `Ready` and `Degraded`, by Kubernetes conventions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The plan revision last applied to the kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_revision: Option<String>,
    /// Service ports programmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_ports: Option<u32>,
    /// Endpoints programmed (over all service ports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<u32>,
    /// Proxy mode of the agent (`iptables` or `ipvs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Duration of the last sync, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_duration_seconds: Option<f64>,
    /// Version of the agent that wrote this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// Every Service plan change up to this `resourceVersion` is in the kernel: the
    /// newest Service plan event the agent had received when its last clean sync began.
    /// Resource versions of one resource compare as integers (Kubernetes 1.35, KEP-5504),
    /// so the controller counts the nodes whose mark has reached a Service plan's write.
    /// Written at most once per the agent's `--rollout-report-interval` when only this
    /// moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 20), regex(pattern = r"^[0-9]+$"))]
    pub programmed_resource_version: Option<String>,
}

/// The final service port entries of one Service, shared by every node: what each node
/// captures and where it sends it. Named after the Service, in its namespace (a Service
/// too large for one object continues in `<name>.1`, `<name>.2`, ...).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "proxyplan.dev",
    version = "v1alpha1",
    kind = "ServiceProxyPlan",
    namespaced,
    shortname = "spp",
    status = "ServiceProxyPlanStatus",
    printcolumn = r#"{"name":"Ports","type":"string","jsonPath":".spec.summary.ports"}"#,
    printcolumn = r#"{"name":"Cluster-IPs","type":"string","jsonPath":".spec.summary.clusterIPs"}"#,
    printcolumn = r#"{"name":"Endpoints","type":"integer","jsonPath":".spec.summary.endpoints"}"#,
    printcolumn = r#"{"name":"Policy","type":"string","jsonPath":".spec.summary.policy"}"#,
    printcolumn = r#"{"name":"Programmed","type":"string","jsonPath":".status.rollout.progress"}"#,
    printcolumn = r#"{"name":"Slowest","type":"string","jsonPath":".status.rollout.slowest"}"#,
    printcolumn = r#"{"name":"Revision","type":"string","jsonPath":".spec.revision","priority":1}"#,
    printcolumn = r#"{"name":"Rollout-Of","type":"string","jsonPath":".status.rollout.revision","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceProxyPlanSpec {
    /// Content hash of everything else in this spec.
    #[schemars(length(min = 1, max = 64))]
    pub revision: String,
    /// Full service port entries, sorted by key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4096))]
    pub service_ports: Vec<ServicePortPlan>,
    /// What `kubectl get serviceproxyplans` shows of these entries. Derived from them by
    /// the controller; the agent never reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<ServicePlanSummary>,
}

impl NodeProxyPlan {
    /// The revision this plan's content really has: its `spec.revision` when the content
    /// hashes to it, else a mark that it was edited (so it is repaired).
    #[must_use]
    pub fn content_revision(&self) -> String {
        verified_revision(&self.spec, &self.spec.revision, |s| s.revision.clear())
    }
}

impl ServiceProxyPlan {
    /// The revision this plan's content really has (see
    /// [`NodeProxyPlan::content_revision`]). Equal revisions mean equal entries.
    #[must_use]
    pub fn content_revision(&self) -> String {
        verified_revision(&self.spec, &self.spec.revision, |s| {
            // The summary is derived for people and left out of the hash: an API server
            // whose CRD predates it prunes it, and that is no edit to repair.
            s.revision.clear();
            s.summary = None;
        })
    }
}

fn verified_revision<S: Serialize + Clone>(
    spec: &S,
    claimed: &str,
    clear: impl Fn(&mut S),
) -> String {
    let mut content = spec.clone();
    clear(&mut content);
    if revision_of(&content) == claimed {
        claimed.to_owned()
    } else {
        format!("edited:{claimed}")
    }
}

/// Written by the controller: how far the plan's current revision has reached.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceProxyPlanStatus {
    /// How many nodes have programmed which revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
}

/// How many nodes hold a Service plan's revision: the nodes whose agent reported
/// (`NodeProxyPlan` `status.programmedResourceVersion`) a mark at or past the write that
/// made it. The controller writes it when every node holds it, or when some do not after
/// its `--rollout-slow-after`; not on every node's report.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The `spec.revision` this is about (older than the spec's while a newer one
    /// rolls out and is not written yet).
    #[schemars(length(max = 64))]
    pub revision: String,
    /// The `resourceVersion` of the write that made this revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 20), regex(pattern = r"^[0-9]+$"))]
    pub resource_version: Option<String>,
    /// Nodes whose agent reports what it programmed.
    pub nodes: u32,
    /// Of those, the nodes that hold this revision.
    pub programmed: u32,
    /// `programmed/nodes`, for `kubectl get`.
    #[schemars(length(max = 24))]
    pub progress: String,
    /// The node furthest behind, while some node does not hold this revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub slowest: Option<String>,
    /// When the revision was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// When the last node reported it, once every node has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// Longest [`ServicePlanSummary::ports`] (its schema allows 1,024 bytes).
const SUMMARY_PORTS_LIMIT: usize = 1000;

/// `items` comma-separated, cut to at most `limit` bytes with a count of what was left
/// out (`80/TCP,81/TCP,...,+40 more`).
fn capped(items: &[String], limit: usize) -> String {
    let mut out = String::new();
    for (i, item) in items.iter().enumerate() {
        let more = format!(",+{} more", items.len() - i);
        let separator = usize::from(!out.is_empty());
        if out.len() + separator + item.len() + more.len() > limit && i + 1 < items.len() {
            out.push_str(if out.is_empty() { &more[1..] } else { &more });
            return out;
        }
        if separator == 1 {
            out.push(',');
        }
        out.push_str(item);
    }
    out
}

/// A person's view of a Service plan's entries: its ports, addresses, how many endpoints
/// serve it and under which policies (the columns of `kubectl get serviceproxyplans`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServicePlanSummary {
    /// Each service port once, as `port/PROTOCOL`, with `:nodePort` when it has one.
    #[schemars(length(max = 1024))]
    pub ports: String,
    /// The cluster IPs (one per family).
    #[serde(rename = "clusterIPs")]
    #[schemars(length(max = 128))]
    pub cluster_ips: String,
    /// Distinct endpoint addresses in the cluster lists: what serves the Service.
    pub endpoints: u32,
    /// `Cluster` or `Local` for internal traffic, and for external traffic after a `/`
    /// when the Service has any; `, no endpoints: Reject` (or `Drop`) when it has none.
    #[schemars(length(max = 128))]
    pub policy: String,
}

impl ServicePlanSummary {
    /// The summary of `entries`.
    #[must_use]
    pub fn of(entries: &[ServicePortPlan]) -> Self {
        let mut ports: Vec<String> = Vec::new();
        let mut ips: Vec<&str> = Vec::new();
        let mut endpoints = std::collections::BTreeSet::new();
        for entry in entries {
            let port = match entry.node_port {
                Some(node_port) => format!("{}:{node_port}/{:?}", entry.port, entry.protocol),
                None => format!("{}/{:?}", entry.port, entry.protocol),
            };
            if !ports.contains(&port) {
                ports.push(port);
            }
            if !ips.contains(&entry.cluster_ip.as_str()) {
                ips.push(&entry.cluster_ip);
            }
            endpoints.extend(entry.cluster_endpoints.iter().map(|e| e.ip.as_str()));
        }
        let policy = entries.first().map_or_else(String::new, |entry| {
            let name = |p: TrafficPolicy| match p {
                TrafficPolicy::Cluster => "Cluster",
                TrafficPolicy::Local => "Local",
            };
            let mut text = name(entry.internal.policy).to_owned();
            if let Some(external) = &entry.external {
                text.push('/');
                text.push_str(name(external.policy));
            }
            if endpoints.is_empty() {
                text.push_str(match entry.internal.when_empty {
                    EmptyAction::Reject => ", no endpoints: Reject",
                    EmptyAction::Drop => ", no endpoints: Drop",
                });
            }
            text
        });
        Self {
            ports: capped(&ports, SUMMARY_PORTS_LIMIT),
            cluster_ips: ips.join(","),
            endpoints: u32::try_from(endpoints.len()).unwrap_or(u32::MAX),
            policy,
        }
    }
}

/// One service port of one IP family, fully decided: what to capture, where to send it,
/// what to do when there is nowhere to send it, and when to masquerade.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServicePortPlan {
    /// Unique key: `namespace/name:portName/PROTOCOL/family`, e.g. `default/web:http/TCP/IPv4`.
    #[schemars(length(min = 1, max = 600))]
    pub key: String,
    /// Namespace of the Service.
    // Short strings here are held inline (`CompactString`): an agent holds one entry per
    // service port of the cluster.
    #[schemars(with = "String")]
    pub namespace: CompactString,
    /// Name of the Service.
    #[schemars(with = "String")]
    pub name: CompactString,
    /// Name of the port in the Service (may be empty for single-port Services).
    #[serde(default, skip_serializing_if = "CompactString::is_empty")]
    #[schemars(with = "String")]
    pub port_name: CompactString,
    /// IP family of every address in this entry.
    pub family: IpFamily,
    /// Transport protocol.
    pub protocol: Protocol,
    /// The Service's port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// The cluster IP of this family.
    #[schemars(with = "String", regex(pattern = r"^[0-9a-fA-F:.]+$"))]
    #[serde(rename = "clusterIP")]
    pub cluster_ip: CompactString,
    /// `spec.externalIPs` of this family.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024), inner(regex(pattern = r"^[0-9a-fA-F:.]+$")))]
    #[serde(rename = "externalIPs")]
    pub external_ips: Vec<String>,
    /// Load-balancer ingress IPs of this family.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    #[serde(rename = "loadBalancerIPs")]
    pub load_balancer_ips: Vec<LoadBalancerIp>,
    /// Node port, when the Service has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub node_port: Option<u16>,
    /// Only these sources may reach the load-balancer IPs (empty: any source).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 1024),
        inner(regex(pattern = r"^[0-9a-fA-F:.]+/[0-9]{1,3}$"))
    )]
    pub load_balancer_source_ranges: Vec<String>,
    /// Port of the health-check server for `externalTrafficPolicy: Local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub health_check_node_port: Option<u16>,
    /// ClientIP session affinity, when enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<SessionAffinity>,
    /// Traffic to the cluster IP.
    pub internal: TrafficPlan,
    /// Traffic to node ports, external IPs and load-balancer IPs, when there are any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<TrafficPlan>,
    /// Endpoints for `Cluster` policy and for short-circuited traffic: ready endpoints
    /// (or serving-and-terminating ones when none are ready), for a node without a zone
    /// list below.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32768))]
    pub cluster_endpoints: Vec<Endpoint>,
    /// `clusterEndpoints` for the nodes of a zone, where topology hints make them differ
    /// (`trafficDistribution: PreferClose` and the like). Sorted by zone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub zone_endpoints: Vec<ZoneEndpoints>,
    /// Endpoints for `Local` policy: this node's endpoints. Always empty in a
    /// `ServiceProxyPlan`; a node overlay fills it on nodes that have local endpoints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32768))]
    pub local_endpoints: Vec<Endpoint>,
    /// Set by a node overlay: `localEndpoints` are serving-and-terminating endpoints (no
    /// local endpoint is ready). They still take traffic, but the health check node port
    /// counts only ready ones, so load balancers stop sending new connections here.
    #[serde(default, skip_serializing_if = "is_false")]
    pub local_terminating: bool,
    /// UDP entries only: the serving endpoints not in `clusterEndpoints` (terminating
    /// ones, or all when `clusterEndpoints` is not used). Conntrack entries to any
    /// serving endpoint are kept, as kube-proxy keeps them: a ready → terminating
    /// transition, a topology or a Local-list change does not cut live UDP flows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32768))]
    pub also_serving: Vec<Endpoint>,
    /// When to masquerade.
    pub masquerade: MasqueradePlan,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_false(value: &bool) -> bool {
    !*value
}

/// The cluster endpoints of one entry for the nodes of one zone.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ZoneEndpoints {
    /// The zone (`topology.kubernetes.io/zone` of the nodes it is for).
    #[schemars(length(min = 1, max = 253))]
    pub zone: String,
    /// Replacement `clusterEndpoints` in that zone.
    #[schemars(length(max = 32768))]
    pub endpoints: Vec<Endpoint>,
}

/// IP family of a service port entry.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum IpFamily {
    /// IPv4.
    IPv4,
    /// IPv6.
    IPv6,
}

/// Transport protocol of a service port.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum Protocol {
    /// TCP.
    TCP,
    /// UDP.
    UDP,
    /// SCTP.
    SCTP,
}

impl Protocol {
    /// The IP protocol number (`IPPROTO_*`): 6, 17 or 132.
    #[must_use]
    pub const fn number(self) -> u8 {
        match self {
            Self::TCP => 6,
            Self::UDP => 17,
            Self::SCTP => 132,
        }
    }
}

/// A load-balancer ingress IP.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIp {
    /// The address.
    #[schemars(regex(pattern = r"^[0-9a-fA-F:.]+$"))]
    pub ip: String,
    /// `VIP` (the node accepts and short-circuits traffic to it) or `Proxy` (the load
    /// balancer delivers to node ports; the node must not capture this address).
    pub mode: LoadBalancerIpMode,
}

/// `status.loadBalancer.ingress[].ipMode`.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum LoadBalancerIpMode {
    /// Traffic arrives addressed to the IP.
    VIP,
    /// Traffic arrives from a proxying load balancer.
    Proxy,
}

/// ClientIP session affinity.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionAffinity {
    /// Stickiness timeout in seconds.
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: u32,
}

/// How traffic in one direction (internal or external) is handled.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficPlan {
    /// Which endpoint list serves this traffic.
    pub policy: TrafficPolicy,
    /// What to do when that list is empty.
    pub when_empty: EmptyAction,
}

/// Which endpoint list serves a direction of traffic.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TrafficPolicy {
    /// `clusterEndpoints`.
    Cluster,
    /// `localEndpoints`.
    Local,
}

/// Action for traffic that has no endpoint to go to.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum EmptyAction {
    /// ICMP reject: the Service has no usable endpoint anywhere.
    Reject,
    /// Silent drop: the Service has endpoints, none on this node (Local policy).
    Drop,
}

/// A backend.
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// The endpoint's address.
    // Held inline (an address fits in 24 bytes): an agent holds one per endpoint of
    // every Service, and a heap string each cost 3 MB at 10,000 Services.
    #[schemars(with = "String", regex(pattern = r"^[0-9a-fA-F:.]+$"))]
    pub ip: CompactString,
    /// The endpoint's port for this service port (named target ports resolved).
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
}

/// Masquerade decisions for one entry.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MasqueradePlan {
    /// Masquerade every packet to this entry's VIPs (`--masquerade-all`).
    pub all: bool,
    /// Masquerade traffic to the cluster IP whose source is outside the node's
    /// local-traffic CIDRs.
    #[serde(rename = "offClusterToClusterIP")]
    pub off_cluster_to_cluster_ip: bool,
    /// Masquerade external traffic (Cluster external policy: it may leave the node).
    pub external: bool,
    /// Masquerade host-originated traffic to the external addresses of a Local-policy
    /// entry (its source would otherwise be a local address).
    pub local_host_to_external: bool,
    /// Masquerade an endpoint reaching itself through the Service (hairpin).
    pub hairpin: bool,
}

/// Endpoint lists of one entry that differ on one node. `None` keeps the list of the
/// layer below.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointOverride {
    /// Key of the [`ServicePortPlan`] this overrides.
    #[schemars(length(min = 1, max = 600))]
    pub key: String,
    /// Replacement `clusterEndpoints` (`PreferSameNode` hints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_endpoints: Option<Vec<Endpoint>>,
    /// Replacement `localEndpoints` (this node's endpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_endpoints: Option<Vec<Endpoint>>,
    /// The replacement `localEndpoints` are serving-and-terminating ones: none is ready.
    #[serde(default, skip_serializing_if = "is_false")]
    pub local_terminating: bool,
}

impl ServicePortPlan {
    /// The endpoints that serve a direction of traffic.
    #[must_use]
    pub fn endpoints_for(&self, traffic: &TrafficPlan) -> &[Endpoint] {
        match traffic.policy {
            TrafficPolicy::Cluster => &self.cluster_endpoints,
            TrafficPolicy::Local => &self.local_endpoints,
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::TCP => "TCP",
            Self::UDP => "UDP",
            Self::SCTP => "SCTP",
        })
    }
}

impl std::fmt::Display for IpFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::IPv4 => "IPv4",
            Self::IPv6 => "IPv6",
        })
    }
}

/// The generated CRD manifests: `(file name, YAML)` for the chart's `crds/` folder.
///
/// Integer and number properties carry no `format`: the API server recognises none of
/// schemars' (`uint16`, `uint32`, `double`, ...), strips them before validating, and some
/// versions warn about each on every apply; `minimum` and `maximum` say the range.
///
/// # Errors
/// When a CRD cannot be serialised (a bug in the types).
pub fn crd_files() -> Result<Vec<(&'static str, String)>, serde_yaml::Error> {
    use kube::CustomResourceExt;
    let yaml = |crd| -> Result<String, serde_yaml::Error> {
        let mut value =
            serde_json::to_value(crd).map_err(<serde_yaml::Error as serde::ser::Error>::custom)?;
        strip_numeric_formats(&mut value);
        serde_yaml::to_string(&value)
    };
    Ok(vec![
        (
            "nodeproxyplans.proxyplan.dev.yaml",
            yaml(NodeProxyPlan::crd())?,
        ),
        (
            "serviceproxyplans.proxyplan.dev.yaml",
            yaml(ServiceProxyPlan::crd())?,
        ),
    ])
}

/// Removes `format` from every schema whose `type` is `integer` or `number`.
fn strip_numeric_formats(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            let numeric = map
                .get("type")
                .and_then(serde_json::Value::as_str)
                .is_some_and(|t| t == "integer" || t == "number");
            if numeric {
                map.remove("format");
            }
            for child in map.values_mut() {
                strip_numeric_formats(child);
            }
        }
        serde_json::Value::Array(list) => list.iter_mut().for_each(strip_numeric_formats),
        _ => {}
    }
}
