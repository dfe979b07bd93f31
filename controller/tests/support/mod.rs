//! Builders and assertions for planner tests: Kubernetes objects in a few lines each,
//! and "what would node N's agent program" out.
//!
//! Objects look like what the API server returns (explicit endpoint conditions, both
//! `clusterIP` and `clusterIPs`), so that a case states only what it is about.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, NodeCondition,
    NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec, ServiceStatus, SessionAffinityConfig,
    Taint,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint as SliceEndpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice,
    ForNode, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proxyplan_controller::{Changes, DesiredObject, ObjectId, Planner, PlannerConfig};
use proxyplan_crds::{
    EmptyAction, Endpoint, MergedPlan, ServicePortPlan, TrafficPlan, TrafficPolicy, merge,
};

/// Namespace of every object unless a case says otherwise.
pub const NS: &str = "default";

// ---------------------------------------------------------------------------------------
// Services

/// A ClusterIP Service named `name` in [`NS`] with the given cluster IPs (first one is
/// also `spec.clusterIP`, as the API server keeps them) and ports.
pub fn mk_service(name: &str, cluster_ips: &[&str], ports: Vec<ServicePort>) -> Service {
    let families = cluster_ips
        .iter()
        .map(|ip| if ip.contains(':') { "IPv6" } else { "IPv4" }.to_owned())
        .collect();
    Service {
        metadata: meta(name, Some(NS)),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            cluster_ip: cluster_ips.first().map(|s| (*s).to_owned()),
            cluster_ips: Some(cluster_ips.iter().map(|s| (*s).to_owned()).collect()),
            ip_families: Some(families),
            ports: Some(ports),
            selector: Some(BTreeMap::from([("app".to_owned(), name.to_owned())])),
            session_affinity: Some("None".to_owned()),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// A service port with the given protocol; `targetPort` is the port's name (named target
/// ports are what make per-slice resolution matter).
pub fn svc_port(name: &str, protocol: &str, port: i32) -> ServicePort {
    ServicePort {
        name: (!name.is_empty()).then(|| name.to_owned()),
        protocol: Some(protocol.to_owned()),
        port,
        target_port: Some(if name.is_empty() {
            IntOrString::Int(port)
        } else {
            IntOrString::String(name.to_owned())
        }),
        ..ServicePort::default()
    }
}

/// A TCP service port.
pub fn tcp(name: &str, port: i32) -> ServicePort {
    svc_port(name, "TCP", port)
}

/// A UDP service port.
pub fn udp(name: &str, port: i32) -> ServicePort {
    svc_port(name, "UDP", port)
}

/// An SCTP service port.
pub fn sctp(name: &str, port: i32) -> ServicePort {
    svc_port(name, "SCTP", port)
}

/// Builder methods on a service port.
pub trait PortExt {
    /// Sets `nodePort`.
    #[must_use]
    fn node_port(self, port: i32) -> Self;
}

impl PortExt for ServicePort {
    fn node_port(mut self, port: i32) -> Self {
        self.node_port = Some(port);
        self
    }
}

/// Builder methods on a Service.
pub trait ServiceExt: Sized {
    /// The spec, created if missing.
    fn spec_mut(&mut self) -> &mut ServiceSpec;
    /// Any other change.
    #[must_use]
    fn with(self, f: impl FnOnce(&mut Self)) -> Self;

    /// Sets `spec.type`.
    #[must_use]
    fn type_(mut self, type_: &str) -> Self {
        self.spec_mut().type_ = Some(type_.to_owned());
        self
    }
    /// Sets `spec.externalIPs`.
    #[must_use]
    fn external_ips(mut self, ips: &[&str]) -> Self {
        self.spec_mut().external_ips = Some(strings(ips));
        self
    }
    /// Sets `spec.externalTrafficPolicy`.
    #[must_use]
    fn etp(mut self, policy: &str) -> Self {
        self.spec_mut().external_traffic_policy = Some(policy.to_owned());
        self
    }
    /// Sets `spec.internalTrafficPolicy`.
    #[must_use]
    fn itp(mut self, policy: &str) -> Self {
        self.spec_mut().internal_traffic_policy = Some(policy.to_owned());
        self
    }
    /// Sets `spec.healthCheckNodePort`.
    #[must_use]
    fn health_check_node_port(mut self, port: i32) -> Self {
        self.spec_mut().health_check_node_port = Some(port);
        self
    }
    /// Sets `spec.loadBalancerSourceRanges`.
    #[must_use]
    fn source_ranges(mut self, ranges: &[&str]) -> Self {
        self.spec_mut().load_balancer_source_ranges = Some(strings(ranges));
        self
    }
    /// ClientIP session affinity, with an explicit timeout or the API default (none set).
    #[must_use]
    fn client_ip_affinity(mut self, timeout_seconds: Option<i32>) -> Self {
        let spec = self.spec_mut();
        spec.session_affinity = Some("ClientIP".to_owned());
        spec.session_affinity_config = Some(SessionAffinityConfig {
            client_ip: Some(ClientIPConfig { timeout_seconds }),
        });
        self
    }
    /// Sets `spec.trafficDistribution`.
    #[must_use]
    fn traffic_distribution(mut self, value: &str) -> Self {
        self.spec_mut().traffic_distribution = Some(value.to_owned());
        self
    }
    /// Sets `status.loadBalancer.ingress`: `(ip, ipMode)`; an empty ip makes a
    /// hostname-only ingress.
    #[must_use]
    fn lb_ingress(self, ingress: &[(&str, Option<&str>)]) -> Self {
        self.with_status(|status| {
            status.load_balancer = Some(LoadBalancerStatus {
                ingress: Some(
                    ingress
                        .iter()
                        .map(|(ip, mode)| LoadBalancerIngress {
                            ip: (!ip.is_empty()).then(|| (*ip).to_owned()),
                            hostname: ip.is_empty().then(|| "lb.example.com".to_owned()),
                            ip_mode: mode.map(str::to_owned),
                            ..LoadBalancerIngress::default()
                        })
                        .collect(),
                ),
            });
        })
    }
    /// Changes the status.
    #[must_use]
    fn with_status(self, f: impl FnOnce(&mut ServiceStatus)) -> Self;
    /// Adds a label.
    #[must_use]
    fn label(self, key: &str, value: &str) -> Self;
}

impl ServiceExt for Service {
    fn spec_mut(&mut self) -> &mut ServiceSpec {
        self.spec.get_or_insert_with(ServiceSpec::default)
    }
    fn with(mut self, f: impl FnOnce(&mut Self)) -> Self {
        f(&mut self);
        self
    }
    fn with_status(mut self, f: impl FnOnce(&mut ServiceStatus)) -> Self {
        f(self.status.get_or_insert_with(ServiceStatus::default));
        self
    }
    fn label(mut self, key: &str, value: &str) -> Self {
        add_label(&mut self.metadata, key, value);
        self
    }
}

// ---------------------------------------------------------------------------------------
// EndpointSlices

/// An EndpointSlice named `name` of Service `service` in [`NS`]. `family` is the
/// `addressType`; `ports` are `(name, protocol, port)`.
pub fn mk_slice(
    name: &str,
    service: &str,
    family: &str,
    ports: &[(&str, &str, i32)],
    endpoints: Vec<SliceEndpoint>,
) -> EndpointSlice {
    let mut metadata = meta(name, Some(NS));
    add_label(&mut metadata, "kubernetes.io/service-name", service);
    add_label(
        &mut metadata,
        "endpointslice.kubernetes.io/managed-by",
        "endpointslice-controller.k8s.io",
    );
    EndpointSlice {
        metadata,
        address_type: family.to_owned(),
        endpoints,
        ports: Some(
            ports
                .iter()
                .map(|(name, protocol, port)| EndpointPort {
                    name: Some((*name).to_owned()),
                    protocol: Some((*protocol).to_owned()),
                    port: Some(*port),
                    app_protocol: None,
                })
                .collect(),
        ),
    }
}

/// Builder methods on an EndpointSlice.
pub trait SliceExt: Sized {
    /// Changes the labels.
    #[must_use]
    fn with_labels(self, f: impl FnOnce(&mut BTreeMap<String, String>)) -> Self;
    /// Sets `endpoints.kubernetes.io/last-change-trigger-time`.
    #[must_use]
    fn triggered_at(self, time: &str) -> Self;
}

impl SliceExt for EndpointSlice {
    fn triggered_at(mut self, time: &str) -> Self {
        self.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                "endpoints.kubernetes.io/last-change-trigger-time".to_owned(),
                time.to_owned(),
            );
        self
    }
    fn with_labels(mut self, f: impl FnOnce(&mut BTreeMap<String, String>)) -> Self {
        f(self.metadata.labels.get_or_insert_with(BTreeMap::new));
        self
    }
}

/// A ready, serving, non-terminating endpoint with one address and no node.
pub fn ep(ip: &str) -> SliceEndpoint {
    SliceEndpoint {
        addresses: vec![ip.to_owned()],
        conditions: Some(EndpointConditions {
            ready: Some(true),
            serving: Some(true),
            terminating: Some(false),
        }),
        ..SliceEndpoint::default()
    }
}

/// Builder methods on a slice endpoint.
pub trait EndpointExt: Sized {
    /// Sets `nodeName`.
    #[must_use]
    fn on(self, node: &str) -> Self;
    /// Sets the three conditions.
    #[must_use]
    fn conditions(self, ready: bool, serving: bool, terminating: bool) -> Self;
    /// Not ready, not serving, not terminating (a pod that is starting).
    #[must_use]
    fn not_ready(self) -> Self {
        self.conditions(false, false, false)
    }
    /// Terminating but still serving (graceful shutdown).
    #[must_use]
    fn terminating(self) -> Self {
        self.conditions(false, true, true)
    }
    /// Terminating and no longer serving.
    #[must_use]
    fn terminating_not_serving(self) -> Self {
        self.conditions(false, false, true)
    }
    /// No conditions at all (each unset condition has its API default).
    #[must_use]
    fn no_conditions(self) -> Self;
    /// Sets `hints.forZones`.
    #[must_use]
    fn for_zones(self, zones: &[&str]) -> Self;
    /// Sets `hints.forNodes`.
    #[must_use]
    fn for_nodes(self, nodes: &[&str]) -> Self;
}

impl EndpointExt for SliceEndpoint {
    fn on(mut self, node: &str) -> Self {
        self.node_name = Some(node.to_owned());
        self
    }
    fn conditions(mut self, ready: bool, serving: bool, terminating: bool) -> Self {
        self.conditions = Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        });
        self
    }
    fn no_conditions(mut self) -> Self {
        self.conditions = None;
        self
    }
    fn for_zones(mut self, zones: &[&str]) -> Self {
        self.hints
            .get_or_insert_with(EndpointHints::default)
            .for_zones = Some(
            zones
                .iter()
                .map(|z| ForZone {
                    name: (*z).to_owned(),
                })
                .collect(),
        );
        self
    }
    fn for_nodes(mut self, nodes: &[&str]) -> Self {
        self.hints
            .get_or_insert_with(EndpointHints::default)
            .for_nodes = Some(
            nodes
                .iter()
                .map(|n| ForNode {
                    name: (*n).to_owned(),
                })
                .collect(),
        );
        self
    }
}

// ---------------------------------------------------------------------------------------
// Nodes

/// A Ready Node with an InternalIP and a heartbeat at t=0.
pub fn mk_node(name: &str) -> Node {
    let mut metadata = meta(name, None);
    metadata.uid = Some(format!("uid-{name}"));
    add_label(&mut metadata, "kubernetes.io/hostname", name);
    Node {
        metadata,
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            addresses: Some(vec![
                NodeAddress {
                    type_: "Hostname".to_owned(),
                    address: name.to_owned(),
                },
                NodeAddress {
                    type_: "InternalIP".to_owned(),
                    address: node_ip(name),
                },
            ]),
            conditions: Some(vec![ready_condition(0)]),
            ..NodeStatus::default()
        }),
    }
}

/// The InternalIP [`mk_node`] gives a node.
pub fn node_ip(name: &str) -> String {
    format!(
        "192.168.0.{}",
        name.bytes().map(u32::from).sum::<u32>() % 250 + 1
    )
}

fn ready_condition(heartbeat_seconds: i64) -> NodeCondition {
    let time = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + heartbeat_seconds)
        .map(Time)
        .ok();
    NodeCondition {
        type_: "Ready".to_owned(),
        status: "True".to_owned(),
        reason: Some("KubeletReady".to_owned()),
        message: Some("kubelet is posting ready status".to_owned()),
        last_heartbeat_time: time.clone(),
        last_transition_time: time,
    }
}

/// Builder methods on a Node.
pub trait NodeExt: Sized {
    /// Sets the `topology.kubernetes.io/zone` label.
    #[must_use]
    fn zone(self, zone: &str) -> Self {
        self.label("topology.kubernetes.io/zone", zone)
    }
    /// Adds a label.
    #[must_use]
    fn label(self, key: &str, value: &str) -> Self;
    /// Removes a label.
    #[must_use]
    fn unlabel(self, key: &str) -> Self;
    /// Sets `spec.podCIDRs` (and `spec.podCIDR`, as the API server does).
    #[must_use]
    fn pod_cidrs(self, cidrs: &[&str]) -> Self;
    /// Adds a `status.addresses` entry.
    #[must_use]
    fn address(self, type_: &str, ip: &str) -> Self;
    /// A kubelet status update: new heartbeat, new resourceVersion, nothing else.
    #[must_use]
    fn heartbeat(self, seconds: i64) -> Self;
    /// Adds a `NoSchedule` taint with key `key`.
    #[must_use]
    fn taint(self, key: &str) -> Self;
    /// Sets `metadata.deletionTimestamp` (the Node is being deleted).
    #[must_use]
    fn deleting(self) -> Self;
}

impl NodeExt for Node {
    fn label(mut self, key: &str, value: &str) -> Self {
        add_label(&mut self.metadata, key, value);
        self
    }
    fn unlabel(mut self, key: &str) -> Self {
        if let Some(labels) = self.metadata.labels.as_mut() {
            labels.remove(key);
        }
        self
    }
    fn pod_cidrs(mut self, cidrs: &[&str]) -> Self {
        let spec = self.spec.get_or_insert_with(NodeSpec::default);
        spec.pod_cidr = cidrs.first().map(|c| (*c).to_owned());
        spec.pod_cidrs = Some(strings(cidrs));
        self
    }
    fn address(mut self, type_: &str, ip: &str) -> Self {
        self.status
            .get_or_insert_with(NodeStatus::default)
            .addresses
            .get_or_insert_with(Vec::new)
            .push(NodeAddress {
                type_: type_.to_owned(),
                address: ip.to_owned(),
            });
        self
    }
    fn taint(mut self, key: &str) -> Self {
        self.spec
            .get_or_insert_with(NodeSpec::default)
            .taints
            .get_or_insert_with(Vec::new)
            .push(Taint {
                key: key.to_owned(),
                effect: "NoSchedule".to_owned(),
                ..Taint::default()
            });
        self
    }
    fn deleting(mut self) -> Self {
        self.metadata.deletion_timestamp = k8s_openapi::jiff::Timestamp::from_second(1_700_000_100)
            .map(Time)
            .ok();
        self
    }
    fn heartbeat(mut self, seconds: i64) -> Self {
        self.metadata.resource_version = Some(format!("{}", 1000 + seconds));
        self.status
            .get_or_insert_with(NodeStatus::default)
            .conditions = Some(vec![ready_condition(seconds)]);
        self
    }
}

// ---------------------------------------------------------------------------------------
// Planner driving

/// A planner with the default configuration.
pub fn planner() -> Planner {
    Planner::new(PlannerConfig::default())
}

/// Applies every object, failing the test on any refusal.
pub fn load(planner: &mut Planner, nodes: &[Node], services: &[Service], slices: &[EndpointSlice]) {
    for node in nodes {
        if let Err(err) = planner.apply_node(node) {
            panic!("node refused: {err}");
        }
    }
    for svc in services {
        if let Err(err) = planner.apply_service(svc) {
            panic!("service refused: {err}");
        }
    }
    for slice in slices {
        if let Err(err) = planner.apply_slice(slice) {
            panic!("slice refused: {err}");
        }
    }
}

/// What node `node`'s agent programs: its plan merged with every Service plan.
pub fn view(planner: &Planner, node: &str) -> MergedPlan {
    let Some((plan, shards)) = planner.node_view(node) else {
        panic!("no plan for node {node}");
    };
    match merge(&plan, &shards) {
        Ok(merged) => merged,
        Err(err) => panic!("plan of {node} does not merge: {err}"),
    }
}

/// The entry `key` of a merged plan.
pub fn entry<'a>(merged: &'a MergedPlan, key: &str) -> &'a ServicePortPlan {
    match merged.service_ports.iter().find(|e| e.key == key) {
        Some(e) => e,
        None => panic!(
            "node {}: no entry {key}; entries: {:?}",
            merged.node_name,
            keys(merged)
        ),
    }
}

/// The keys of a merged plan, sorted.
pub fn keys(merged: &MergedPlan) -> Vec<String> {
    merged.service_ports.iter().map(|e| e.key.clone()).collect()
}

/// Endpoints from `(ip, port)` pairs.
pub fn eps(list: &[(&str, u16)]) -> Vec<Endpoint> {
    list.iter()
        .map(|(ip, port)| Endpoint {
            ip: (*ip).into(),
            port: *port,
        })
        .collect()
}

/// Cluster policy, REJECT when empty.
pub const CLUSTER_REJECT: TrafficPlan = TrafficPlan {
    policy: TrafficPolicy::Cluster,
    when_empty: EmptyAction::Reject,
};
/// Local policy, DROP when empty (the Service has endpoints elsewhere).
pub const LOCAL_DROP: TrafficPlan = TrafficPlan {
    policy: TrafficPolicy::Local,
    when_empty: EmptyAction::Drop,
};
/// Local policy, REJECT when empty (the Service has no endpoint anywhere).
pub const LOCAL_REJECT: TrafficPlan = TrafficPlan {
    policy: TrafficPolicy::Local,
    when_empty: EmptyAction::Reject,
};

/// The objects a batch of changes touches, as `plan/<node>`, `service/<ns>/<name>`
/// (written) and `delete plan/<node>`, `delete service/<ns>/<name>`.
pub fn touched(changes: &Changes) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = changes
        .apply
        .iter()
        .map(|o| match o {
            DesiredObject::Plan(_) => format!("plan/{}", o.name()),
            DesiredObject::Service(_) => format!("service/{}", o.qualified_name()),
        })
        .collect();
    out.extend(changes.delete.iter().map(|id| match id {
        ObjectId::Plan(_) => format!("delete plan/{}", id.name()),
        ObjectId::Service(..) => format!("delete service/{}", id.qualified_name()),
    }));
    out
}

/// Drains pending changes (after setting a cluster up).
pub fn drain(planner: &mut Planner) {
    let _ = planner.take_changes();
}

/// The Service plan holding `key`, as `service/<ns>/<name>`.
pub fn service_plan_holding(planner: &Planner, node: &str, key: &str) -> String {
    let Some((_, services)) = planner.node_view(node) else {
        panic!("no plan for node {node}");
    };
    for service in services {
        if service.spec.service_ports.iter().any(|e| e.key == key) {
            return format!("service/{}", proxyplan_crds::object_key(&service));
        }
    }
    panic!("no Service plan holds {key}");
}

/// The ids a batch of changes deletes.
pub fn deleted(changes: &Changes) -> BTreeSet<ObjectId> {
    changes.delete.iter().cloned().collect()
}

// ---------------------------------------------------------------------------------------

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        resource_version: Some("1".to_owned()),
        ..ObjectMeta::default()
    }
}

fn add_label(meta: &mut ObjectMeta, key: &str, value: &str) {
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(key.to_owned(), value.to_owned());
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// A set of strings, for comparing with [`touched`].
pub fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}
