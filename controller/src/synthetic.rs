//! A deterministic synthetic cluster for benchmarks and scale tests.
//!
//! [`SyntheticCluster::generate`] turns a [`SyntheticSpec`] (how many Services, endpoints
//! per Service, nodes, zones, which fraction of Services uses `externalTrafficPolicy:
//! Local` or zone hints, and a seed) into the Kubernetes objects the planner watches:
//! `Service`s, `EndpointSlice`s and `Node`s, as the API server would return them. The same
//! spec always gives the same objects (a small SplitMix64 generator, no `rand`).
//!
//! Address plan, chosen so that nothing overlaps and every address is unique:
//! - cluster IPs from [`SERVICE_CIDR`] (10.96.0.0/12), scattered by a bijection of the
//!   Service's index;
//! - pod IPs from [`CLUSTER_CIDR`] (10.0.0.0/10), each node owning one pod CIDR sized for
//!   twice its average share of endpoints (at least a /24); an endpoint's IP lies in the
//!   pod CIDR of its node;
//! - node InternalIPs from 172.16.0.0/12, load-balancer IPs from 198.18.0.0/15, node ports
//!   from 30000-32767 (allocated in order, wrapping after 2,768 allocations).
//!
//! [`SyntheticCluster::move_endpoint`] then produces the most common event of a running
//! cluster: one pod of a Service replaced by a new one on another node, returned as the
//! updated `EndpointSlice`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::ops::Range;

use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, NodeSpec, NodeStatus, Service,
    ServicePort, ServiceSpec, ServiceStatus,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::config::PlannerConfig;
use crate::model::{ObjectError, SERVICE_NAME_LABEL, ZONE_LABEL};
use crate::planner::Planner;

/// The pod network of every synthetic cluster: node pod CIDRs are carved out of it.
pub const CLUSTER_CIDR: &str = "10.0.0.0/10";
/// Where synthetic cluster IPs come from (the kubeadm default service CIDR).
pub const SERVICE_CIDR: &str = "10.96.0.0/12";
/// Endpoints per EndpointSlice, as the EndpointSlice controller's default
/// `--max-endpoints-per-slice`; larger Services get several slices.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

const CLUSTER_BASE: u32 = 0x0A00_0000; // 10.0.0.0
const CLUSTER_BITS: u32 = 22; // a /10
const SERVICE_BASE: u32 = 0x0A60_0000; // 10.96.0.0
const SERVICE_USABLE: u64 = (1 << 20) - 2; // a /12 without its first and last address
const SERVICE_STRIDE: u64 = 0x9_E37B; // coprime with SERVICE_USABLE: a bijection
const NODE_BASE: u32 = 0xAC10_0000; // 172.16.0.0
const NODE_USABLE: usize = (1 << 20) - 2; // a /12
const LB_BASE: u32 = 0xC612_0000; // 198.18.0.0
const LB_USABLE: usize = (1 << 17) - 2; // a /15
const NODE_PORT_FIRST: i32 = 30_000;
const NODE_PORT_COUNT: i32 = 2_768;
const NAMESPACES: usize = 100;
const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
const SLICE_CONTROLLER: &str = "endpointslice-controller.k8s.io";

/// The shape of a synthetic cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticSpec {
    /// Number of Services.
    pub services: usize,
    /// Ready endpoints of every Service (split over slices of at most
    /// [`MAX_ENDPOINTS_PER_SLICE`]).
    pub endpoints_per_service: usize,
    /// Number of nodes.
    pub nodes: usize,
    /// Number of zones; nodes are assigned to zones round-robin.
    pub zones: usize,
    /// Fraction of Services of type LoadBalancer with `externalTrafficPolicy: Local`
    /// (node ports and a health-check node port); the others are ClusterIP Services.
    pub local_fraction: f64,
    /// Fraction of Services (among the non-Local ones) whose slices carry zone hints:
    /// every endpoint has `hints.forZones` = its own zone, and the Service has
    /// `trafficDistribution: PreferClose`.
    pub hinted_fraction: f64,
    /// Seed of every random choice (node of each endpoint, number of ports, names).
    pub seed: u64,
}

impl SyntheticSpec {
    /// DESIGN §7's budget cluster: 10,000 Services × 10 endpoints, 5,000 nodes in 50
    /// zones, 5 % Local, no zone hints.
    #[must_use]
    pub fn design_scale() -> Self {
        Self {
            services: 10_000,
            endpoints_per_service: 10,
            nodes: 5_000,
            zones: 50,
            local_fraction: 0.05,
            hinted_fraction: 0.0,
            seed: 1,
        }
    }
}

/// How a synthetic Service routes traffic; decides what an endpoint change of it should
/// write (DESIGN §2, invariants 2 and 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceKind {
    /// ClusterIP, Cluster traffic policies, no topology: its entries live in one cluster
    /// shard only.
    Cluster,
    /// LoadBalancer with `externalTrafficPolicy: Local`: nodes hosting an endpoint get a
    /// node overlay.
    Local,
    /// ClusterIP whose endpoints carry zone hints: zones with an endpoint get a zone
    /// shard override.
    ZoneHinted,
}

/// Where one endpoint lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointPlacement {
    /// The endpoint's (pod's) IP.
    pub ip: Ipv4Addr,
    /// The node hosting it.
    pub node: String,
    /// That node's zone.
    pub zone: String,
}

/// One endpoint of a Service replaced by a new pod elsewhere.
#[derive(Debug, Clone)]
pub struct EndpointChange {
    /// Index of the Service in [`SyntheticCluster::services`].
    pub service: usize,
    /// The updated slice, to feed to `Planner::apply_slice`.
    pub slice: EndpointSlice,
    /// The endpoint that went away.
    pub removed: EndpointPlacement,
    /// The endpoint that replaced it (always on another node when there are two or more).
    pub added: EndpointPlacement,
}

/// Why a synthetic cluster cannot be generated or changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SyntheticError {
    /// A fraction outside `0..=1`.
    #[error("{field} must be between 0 and 1, got {value}")]
    Fraction {
        /// The spec field.
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// More Services than the service CIDR has addresses.
    #[error("{0} services do not fit in {SERVICE_CIDR}")]
    TooManyServices(usize),
    /// More nodes than the address plan allows.
    #[error("{0} nodes do not fit in the synthetic address plan")]
    TooManyNodes(usize),
    /// Endpoints but no node to put them on.
    #[error("endpoints need at least one node")]
    NoNodes,
    /// Nodes but no zone to put them in.
    #[error("nodes need at least one zone")]
    NoZones,
    /// The pod CIDRs cannot hold the endpoints.
    #[error("{endpoints} endpoints on {nodes} nodes do not fit in {CLUSTER_CIDR}")]
    PodSpace {
        /// Total endpoints.
        endpoints: usize,
        /// Nodes.
        nodes: usize,
    },
    /// Every node's pod CIDR is used up (after many endpoint changes).
    #[error("every node's pod CIDR is full")]
    PodCidrsFull,
    /// No Service with this index.
    #[error("no service number {0}")]
    UnknownService(usize),
    /// The Service has no endpoint to move.
    #[error("service number {0} has no endpoint")]
    NoEndpoint(usize),
}

/// A generated cluster: the objects, plus what is needed to change them consistently.
#[derive(Debug, Clone)]
pub struct SyntheticCluster {
    /// Services, in index order (`ns-NN/svc-NNNNN`).
    pub services: Vec<Service>,
    /// EndpointSlices, grouped by Service in index order.
    pub slices: Vec<EndpointSlice>,
    /// Nodes, in index order (`node-NNNNN`).
    pub nodes: Vec<Node>,
    kinds: Vec<ServiceKind>,
    slice_ranges: Vec<Range<usize>>,
    pods: PodAllocator,
    zones: usize,
    rng: SplitMix64,
}

impl SyntheticCluster {
    /// Generates the cluster `spec` describes.
    ///
    /// # Errors
    /// When a fraction is outside `0..=1`, or the counts do not fit the address plan.
    pub fn generate(spec: &SyntheticSpec) -> Result<Self, SyntheticError> {
        check_spec(spec)?;
        let mut rng = SplitMix64::new(spec.seed);
        let total_endpoints = spec.services.saturating_mul(spec.endpoints_per_service);
        let pods = PodAllocator::new(spec.nodes, total_endpoints)?;
        let nodes = (0..spec.nodes)
            .map(|n| make_node(n, &zone_name(n % spec.zones.max(1)), &pods))
            .collect();
        let kinds = assign_kinds(spec);
        let mut cluster = Self {
            services: Vec::with_capacity(spec.services),
            slices: Vec::with_capacity(spec.services),
            nodes,
            slice_ranges: Vec::with_capacity(spec.services),
            kinds: Vec::new(),
            pods,
            zones: spec.zones,
            rng: SplitMix64::new(rng.next()),
        };
        let ip_offset = rng.next() % SERVICE_USABLE;
        let mut node_ports = 0;
        let mut local_ordinal = 0;
        for (index, kind) in kinds.iter().copied().enumerate() {
            let two_ports = rng.below(3) == 0;
            let cluster_ip = service_ip(index, ip_offset);
            let mut svc = make_service(index, kind, cluster_ip, two_ports);
            if kind == ServiceKind::Local {
                make_local(&mut svc, local_ordinal, &mut node_ports);
                local_ordinal += 1;
            }
            cluster.add_slices(&svc, kind, two_ports, spec.endpoints_per_service)?;
            cluster.services.push(svc);
        }
        cluster.kinds = kinds;
        Ok(cluster)
    }

    /// A planner configuration matching the address plan: the defaults, with
    /// [`CLUSTER_CIDR`] as the cluster CIDR.
    #[must_use]
    pub fn planner_config() -> PlannerConfig {
        PlannerConfig {
            cluster_cidrs: vec![CLUSTER_CIDR.to_owned()],
            ..PlannerConfig::default()
        }
    }

    /// Feeds every Node, Service and EndpointSlice to `planner`, in that order, and returns
    /// the objects it refused (none, for a generated cluster).
    pub fn load_into(&self, planner: &mut Planner) -> Vec<ObjectError> {
        let nodes = self
            .nodes
            .iter()
            .filter_map(|n| planner.apply_node(n).err());
        let mut errors: Vec<ObjectError> = nodes.collect();
        errors.extend(
            self.services
                .iter()
                .filter_map(|s| planner.apply_service(s).err()),
        );
        errors.extend(
            self.slices
                .iter()
                .filter_map(|s| planner.apply_slice(s).err()),
        );
        errors
    }

    /// How Service number `service` routes traffic.
    #[must_use]
    pub fn kind(&self, service: usize) -> Option<ServiceKind> {
        self.kinds.get(service).copied()
    }

    /// Indices of the Services of one kind, in order.
    pub fn services_of_kind(&self, kind: ServiceKind) -> impl Iterator<Item = usize> + '_ {
        self.kinds
            .iter()
            .enumerate()
            .filter(move |(_, k)| **k == kind)
            .map(|(i, _)| i)
    }

    /// The EndpointSlices of Service number `service` (empty for an unknown index).
    #[must_use]
    pub fn slices_of(&self, service: usize) -> &[EndpointSlice] {
        self.slice_ranges
            .get(service)
            .and_then(|r| self.slices.get(r.clone()))
            .unwrap_or_default()
    }

    /// Replaces one endpoint of Service number `service`, picked at random, by a new pod
    /// (a fresh IP) on another node picked at random, and returns the updated slice with
    /// the placements before and after. The cluster keeps the change, so successive
    /// calls build on each other. A zone-hinted endpoint's hint follows its new zone.
    ///
    /// # Errors
    /// When there is no such Service, it has no endpoint, or no pod CIDR has room left.
    pub fn move_endpoint(&mut self, service: usize) -> Result<EndpointChange, SyntheticError> {
        let range = self.range_of(service)?;
        let total: usize = self.slices[range.clone()]
            .iter()
            .map(|s| s.endpoints.len())
            .sum();
        if total == 0 {
            return Err(SyntheticError::NoEndpoint(service));
        }
        let pick = self.rng.below(total);
        let (slice_index, position) = self.locate(range, pick);
        let old = &self.slices[slice_index].endpoints[position];
        let removed = placement_of(old).ok_or(SyntheticError::NoEndpoint(service))?;
        let node_count = self.nodes.len();
        let mut target = self.rng.below(node_count);
        if node_count > 1 && node_name(target) == removed.node {
            target = (target + 1) % node_count;
        }
        let (endpoint, added) = self.new_endpoint(service, target)?;
        let slice = &mut self.slices[slice_index];
        slice.endpoints[position] = endpoint;
        Ok(EndpointChange {
            service,
            slice: slice.clone(),
            removed,
            added,
        })
    }

    /// The slices of Service number `service`.
    fn range_of(&self, service: usize) -> Result<Range<usize>, SyntheticError> {
        self.slice_ranges
            .get(service)
            .cloned()
            .ok_or(SyntheticError::UnknownService(service))
    }

    /// A new pod (a fresh IP) for Service number `service` on node number `target`
    /// (or the next with room), hinted to its zone when the Service is zone-hinted.
    fn new_endpoint(
        &mut self,
        service: usize,
        target: usize,
    ) -> Result<(Endpoint, EndpointPlacement), SyntheticError> {
        let (node, ip) = self
            .pods
            .allocate(target)
            .ok_or(SyntheticError::PodCidrsFull)?;
        let zone = zone_name(node % self.zones.max(1));
        let hinted = self.kinds.get(service) == Some(&ServiceKind::ZoneHinted);
        let endpoint = make_endpoint(ip, node, &zone, hinted);
        let placement = EndpointPlacement {
            ip,
            node: node_name(node),
            zone,
        };
        Ok((endpoint, placement))
    }

    /// Adds one endpoint to Service number `service`: a new pod (a fresh IP) on a node
    /// picked at random, appended to its last slice. Returns that slice. The Service's
    /// endpoint count grows by one, as in a scale-up or a rollout's surge pod.
    ///
    /// # Errors
    /// When there is no such Service or no pod CIDR has room left.
    pub fn add_endpoint(&mut self, service: usize) -> Result<EndpointSlice, SyntheticError> {
        let range = self.range_of(service)?;
        let target = self.rng.below(self.nodes.len());
        let (endpoint, _) = self.new_endpoint(service, target)?;
        let slice = &mut self.slices[range.end - 1];
        slice.endpoints.push(endpoint);
        Ok(slice.clone())
    }

    /// Removes the last endpoint of Service number `service`'s last slice that has one
    /// and returns that slice: its endpoint count shrinks by one, as in a scale-down.
    ///
    /// # Errors
    /// When there is no such Service or it has no endpoint.
    pub fn remove_endpoint(&mut self, service: usize) -> Result<EndpointSlice, SyntheticError> {
        let range = self.range_of(service)?;
        let index = range
            .rev()
            .find(|&i| !self.slices[i].endpoints.is_empty())
            .ok_or(SyntheticError::NoEndpoint(service))?;
        let slice = &mut self.slices[index];
        slice.endpoints.pop();
        Ok(slice.clone())
    }

    /// The slice and position of the `n`-th endpoint over the slices in `range`.
    fn locate(&self, range: Range<usize>, mut n: usize) -> (usize, usize) {
        for index in range.clone() {
            let len = self.slices[index].endpoints.len();
            if n < len {
                return (index, n);
            }
            n -= len;
        }
        (range.start, 0)
    }

    fn add_slices(
        &mut self,
        svc: &Service,
        kind: ServiceKind,
        two_ports: bool,
        endpoints: usize,
    ) -> Result<(), SyntheticError> {
        let start = self.slices.len();
        let chunks = endpoints.div_ceil(MAX_ENDPOINTS_PER_SLICE).max(1);
        let hinted = kind == ServiceKind::ZoneHinted;
        for chunk in 0..chunks {
            let count = endpoints
                .saturating_sub(chunk * MAX_ENDPOINTS_PER_SLICE)
                .min(MAX_ENDPOINTS_PER_SLICE);
            let mut list = Vec::with_capacity(count);
            for _ in 0..count {
                let preferred = self.rng.below(self.nodes.len());
                let (node, ip) = self
                    .pods
                    .allocate(preferred)
                    .ok_or(SyntheticError::PodCidrsFull)?;
                let zone = zone_name(node % self.zones.max(1));
                list.push(make_endpoint(ip, node, &zone, hinted));
            }
            let suffix = self.rng.suffix();
            self.slices.push(make_slice(svc, &suffix, two_ports, list));
        }
        self.slice_ranges.push(start..self.slices.len());
        Ok(())
    }
}

fn check_spec(spec: &SyntheticSpec) -> Result<(), SyntheticError> {
    for (field, value) in [
        ("local_fraction", spec.local_fraction),
        ("hinted_fraction", spec.hinted_fraction),
    ] {
        if !(0.0..=1.0).contains(&value) {
            return Err(SyntheticError::Fraction { field, value });
        }
    }
    if u64::try_from(spec.services).map_or(true, |s| s > SERVICE_USABLE) {
        return Err(SyntheticError::TooManyServices(spec.services));
    }
    if spec.nodes > NODE_USABLE {
        return Err(SyntheticError::TooManyNodes(spec.nodes));
    }
    if spec.nodes == 0 && spec.services > 0 && spec.endpoints_per_service > 0 {
        return Err(SyntheticError::NoNodes);
    }
    if spec.nodes > 0 && spec.zones == 0 {
        return Err(SyntheticError::NoZones);
    }
    Ok(())
}

/// Spreads `round(total × fraction)` picks evenly over `0..total`.
fn evenly(total: usize, fraction: f64) -> impl Fn(usize) -> bool {
    // Exact for any realistic count: f64 holds integers up to 2^53.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let picks = ((total as f64) * fraction).round() as usize;
    let picks = picks.min(total);
    move |i| (i + 1) * picks / total.max(1) > i * picks / total.max(1)
}

fn assign_kinds(spec: &SyntheticSpec) -> Vec<ServiceKind> {
    let local = evenly(spec.services, spec.local_fraction);
    let locals = (0..spec.services).filter(|i| local(*i)).count();
    let others = spec.services - locals;
    // `hinted_fraction` is of all Services; the picks come from the non-Local ones.
    #[allow(clippy::cast_precision_loss)]
    let fraction = if others == 0 {
        0.0
    } else {
        (spec.hinted_fraction * spec.services as f64 / others as f64).min(1.0)
    };
    let hinted = evenly(others, fraction);
    let mut ordinal = 0;
    (0..spec.services)
        .map(|i| {
            if local(i) {
                return ServiceKind::Local;
            }
            ordinal += 1;
            if hinted(ordinal - 1) {
                ServiceKind::ZoneHinted
            } else {
                ServiceKind::Cluster
            }
        })
        .collect()
}

/// Node names are zero-padded so that name order is index order.
fn node_name(n: usize) -> String {
    format!("node-{n:05}")
}

fn zone_name(z: usize) -> String {
    format!("zone-{z:02}")
}

fn ipv4(value: u32) -> Ipv4Addr {
    Ipv4Addr::from(value)
}

/// A bijection of `0..SERVICE_USABLE` shifted past the network address: unique, scattered
/// cluster IPs.
fn service_ip(index: usize, offset: u64) -> Ipv4Addr {
    let index = u64::try_from(index).unwrap_or_default();
    let host = (index * SERVICE_STRIDE + offset) % SERVICE_USABLE + 1;
    ipv4(SERVICE_BASE + u32::try_from(host).unwrap_or_default())
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn make_node(n: usize, zone: &str, pods: &PodAllocator) -> Node {
    let name = node_name(n);
    let ip = ipv4(NODE_BASE + 1 + u32::try_from(n).unwrap_or_default());
    let cidr = pods.cidr(n);
    Node {
        metadata: ObjectMeta {
            labels: Some(labels(&[
                ("kubernetes.io/hostname", &name),
                ("kubernetes.io/os", "linux"),
                (ZONE_LABEL, zone),
            ])),
            uid: Some(format!("00000000-0000-4000-8000-{n:012x}")),
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: Some(cidr.clone()),
            pod_cidrs: Some(vec![cidr]),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![
                NodeAddress {
                    address: ip.to_string(),
                    type_: "InternalIP".to_owned(),
                },
                NodeAddress {
                    address: name,
                    type_: "Hostname".to_owned(),
                },
            ]),
            ..NodeStatus::default()
        }),
    }
}

/// `(name, protocol, port, target port)` of a synthetic Service's ports.
fn port_shapes(two_ports: bool) -> &'static [(&'static str, &'static str, i32, i32)] {
    const PORTS: [(&str, &str, i32, i32); 2] =
        [("http", "TCP", 80, 8080), ("dns", "UDP", 53, 5353)];
    if two_ports { &PORTS } else { &PORTS[..1] }
}

fn make_service(index: usize, kind: ServiceKind, cluster_ip: Ipv4Addr, two_ports: bool) -> Service {
    let name = format!("svc-{index:05}");
    let ip = cluster_ip.to_string();
    Service {
        metadata: ObjectMeta {
            namespace: Some(format!("ns-{:02}", index % NAMESPACES)),
            labels: Some(labels(&[("app", &name)])),
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            cluster_ip: Some(ip.clone()),
            cluster_ips: Some(vec![ip]),
            ip_families: Some(vec!["IPv4".to_owned()]),
            ip_family_policy: Some("SingleStack".to_owned()),
            internal_traffic_policy: Some("Cluster".to_owned()),
            session_affinity: Some("None".to_owned()),
            selector: Some(labels(&[("app", &name)])),
            traffic_distribution: (kind == ServiceKind::ZoneHinted)
                .then(|| "PreferClose".to_owned()),
            ports: Some(
                port_shapes(two_ports)
                    .iter()
                    .map(|(name, protocol, port, target)| ServicePort {
                        name: Some((*name).to_owned()),
                        protocol: Some((*protocol).to_owned()),
                        port: *port,
                        target_port: Some(IntOrString::Int(*target)),
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            ..ServiceSpec::default()
        }),
        status: Some(ServiceStatus::default()),
    }
}

/// Turns a ClusterIP Service into a LoadBalancer with `externalTrafficPolicy: Local`,
/// node ports, a health-check node port and one ingress IP.
/// `node_ports` counts the node ports handed out so far.
fn make_local(svc: &mut Service, ordinal: usize, node_ports: &mut i32) {
    let mut next_port = || {
        let port = NODE_PORT_FIRST + *node_ports % NODE_PORT_COUNT;
        *node_ports += 1;
        port
    };
    if let Some(spec) = svc.spec.as_mut() {
        spec.type_ = Some("LoadBalancer".to_owned());
        spec.external_traffic_policy = Some("Local".to_owned());
        spec.allocate_load_balancer_node_ports = Some(true);
        for port in spec.ports.iter_mut().flatten() {
            port.node_port = Some(next_port());
        }
        spec.health_check_node_port = Some(next_port());
    }
    let host = u32::try_from(ordinal % LB_USABLE + 1).unwrap_or_default();
    svc.status = Some(ServiceStatus {
        load_balancer: Some(LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some(ipv4(LB_BASE + host).to_string()),
                ip_mode: Some("VIP".to_owned()),
                ..LoadBalancerIngress::default()
            }]),
        }),
        ..ServiceStatus::default()
    });
}

fn make_endpoint(ip: Ipv4Addr, node: usize, zone: &str, hinted: bool) -> Endpoint {
    Endpoint {
        addresses: vec![ip.to_string()],
        conditions: Some(EndpointConditions {
            ready: Some(true),
            serving: Some(true),
            terminating: Some(false),
        }),
        node_name: Some(node_name(node)),
        zone: Some(zone.to_owned()),
        hints: hinted.then(|| EndpointHints {
            for_zones: Some(vec![ForZone {
                name: zone.to_owned(),
            }]),
            for_nodes: None,
        }),
        ..Endpoint::default()
    }
}

fn make_slice(
    svc: &Service,
    suffix: &str,
    two_ports: bool,
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    let name = svc.metadata.name.clone().unwrap_or_default();
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(format!("{name}-{suffix}")),
            namespace: svc.metadata.namespace.clone(),
            labels: Some(labels(&[
                (SERVICE_NAME_LABEL, &name),
                (MANAGED_BY_LABEL, SLICE_CONTROLLER),
            ])),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".to_owned(),
        endpoints,
        ports: Some(
            port_shapes(two_ports)
                .iter()
                .map(|(name, protocol, _, target)| EndpointPort {
                    name: Some((*name).to_owned()),
                    protocol: Some((*protocol).to_owned()),
                    port: Some(*target),
                    app_protocol: None,
                })
                .collect(),
        ),
    }
}

fn placement_of(ep: &Endpoint) -> Option<EndpointPlacement> {
    Some(EndpointPlacement {
        ip: ep.addresses.first()?.parse().ok()?,
        node: ep.node_name.clone()?,
        zone: ep.zone.clone()?,
    })
}

/// Hands out pod IPs from each node's pod CIDR, never reusing one.
#[derive(Debug, Clone)]
struct PodAllocator {
    /// Host bits of every node's pod CIDR.
    host_bits: u32,
    /// Addresses handed out per node.
    used: Vec<u32>,
}

impl PodAllocator {
    /// Pod CIDRs with room for twice each node's average share of `endpoints` (plus
    /// slack for endpoint changes), at least a /24, all inside [`CLUSTER_CIDR`].
    fn new(nodes: usize, endpoints: usize) -> Result<Self, SyntheticError> {
        let too_big = SyntheticError::PodSpace { endpoints, nodes };
        let wanted = endpoints
            .div_ceil(nodes.max(1))
            .saturating_mul(2)
            .saturating_add(64);
        let host_bits = wanted.next_power_of_two().trailing_zeros().max(8);
        let node_bits = nodes.max(1).next_power_of_two().trailing_zeros();
        if host_bits + node_bits > CLUSTER_BITS {
            return Err(too_big);
        }
        Ok(Self {
            host_bits,
            used: vec![0; nodes],
        })
    }

    fn base(&self, node: usize) -> u32 {
        CLUSTER_BASE + (u32::try_from(node).unwrap_or_default() << self.host_bits)
    }

    fn cidr(&self, node: usize) -> String {
        format!("{}/{}", ipv4(self.base(node)), 32 - self.host_bits)
    }

    /// A fresh IP on `preferred`, or on the next node with room.
    fn allocate(&mut self, preferred: usize) -> Option<(usize, Ipv4Addr)> {
        let usable = (1u32 << self.host_bits) - 2;
        let count = self.used.len();
        for step in 0..count {
            let node = (preferred + step) % count;
            if self.used[node] < usable {
                self.used[node] += 1;
                return Some((node, ipv4(self.base(node) + self.used[node])));
            }
        }
        None
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and good enough to scatter a
/// benchmark's choices; every seed (0 included) gives a full-period sequence.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0), by Lemire's multiply-shift.
    fn below(&mut self, n: usize) -> usize {
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        let pick = (u128::from(self.next()) * u128::from(n)) >> 64;
        usize::try_from(pick).unwrap_or_default()
    }

    /// Five lowercase letters and digits, like the suffix of a generated name.
    fn suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|_| char::from(ALPHABET[self.below(ALPHABET.len())]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn small() -> SyntheticSpec {
        SyntheticSpec {
            services: 300,
            endpoints_per_service: 7,
            nodes: 20,
            zones: 3,
            local_fraction: 0.1,
            hinted_fraction: 0.1,
            seed: 7,
        }
    }

    #[test]
    fn same_seed_same_cluster() -> Result<(), SyntheticError> {
        let a = SyntheticCluster::generate(&small())?;
        let b = SyntheticCluster::generate(&small())?;
        assert_eq!(a.services, b.services);
        assert_eq!(a.slices, b.slices);
        assert_eq!(a.nodes, b.nodes);
        let c = SyntheticCluster::generate(&SyntheticSpec { seed: 8, ..small() })?;
        assert_ne!(a.slices, c.slices);
        Ok(())
    }

    #[test]
    fn kinds_follow_the_fractions() -> Result<(), SyntheticError> {
        let cluster = SyntheticCluster::generate(&small())?;
        assert_eq!(cluster.services_of_kind(ServiceKind::Local).count(), 30);
        assert_eq!(
            cluster.services_of_kind(ServiceKind::ZoneHinted).count(),
            30
        );
        assert_eq!(cluster.services_of_kind(ServiceKind::Cluster).count(), 240);
        Ok(())
    }

    #[test]
    fn addresses_are_unique_and_endpoints_sit_in_their_node_cidr() -> Result<(), SyntheticError> {
        let cluster = SyntheticCluster::generate(&small())?;
        let cluster_ips: HashSet<_> = cluster
            .services
            .iter()
            .filter_map(|s| s.spec.as_ref()?.cluster_ip.clone())
            .collect();
        assert_eq!(cluster_ips.len(), 300);
        let mut pod_ips = HashSet::new();
        for ep in cluster.slices.iter().flat_map(|s| &s.endpoints) {
            let placement = placement_of(ep).ok_or(SyntheticError::NoEndpoint(0))?;
            assert!(pod_ips.insert(placement.ip));
            let node: usize = placement.node[5..].parse().unwrap_or(usize::MAX);
            let (net, len) = crate::model::parse_cidr(&cluster.pods.cidr(node))
                .map_err(|_| SyntheticError::NoNodes)?;
            let (ep_net, _) = crate::model::parse_cidr(&format!("{}/{len}", placement.ip))
                .map_err(|_| SyntheticError::NoNodes)?;
            assert_eq!(net, ep_net);
            assert_eq!(placement.zone, zone_name(node % 3));
        }
        assert_eq!(pod_ips.len(), 300 * 7);
        Ok(())
    }

    #[test]
    fn the_planner_accepts_every_object() -> Result<(), SyntheticError> {
        let cluster = SyntheticCluster::generate(&small())?;
        let mut planner = Planner::new(SyntheticCluster::planner_config());
        assert_eq!(cluster.load_into(&mut planner), Vec::new());
        assert_eq!(planner.service_count(), 300);
        assert_eq!(planner.node_count(), 20);
        Ok(())
    }

    #[test]
    fn moving_an_endpoint_changes_one_endpoint_of_one_slice() -> Result<(), SyntheticError> {
        let mut cluster = SyntheticCluster::generate(&small())?;
        let hinted = cluster
            .services_of_kind(ServiceKind::ZoneHinted)
            .next()
            .ok_or(SyntheticError::UnknownService(0))?;
        let before = cluster.slices_of(hinted).to_vec();
        let change = cluster.move_endpoint(hinted)?;
        assert_ne!(change.removed.node, change.added.node);
        assert_eq!(cluster.slices_of(hinted)[0], change.slice);
        let differing: Vec<_> = before[0]
            .endpoints
            .iter()
            .zip(&change.slice.endpoints)
            .filter(|(a, b)| a != b)
            .collect();
        assert_eq!(differing.len(), 1);
        let hint = differing[0]
            .1
            .hints
            .as_ref()
            .and_then(|h| h.for_zones.clone());
        assert_eq!(
            hint,
            Some(vec![ForZone {
                name: change.added.zone.clone()
            }])
        );
        assert_eq!(
            cluster.move_endpoint(10_000).err(),
            Some(SyntheticError::UnknownService(10_000))
        );
        Ok(())
    }

    #[test]
    fn adding_and_removing_an_endpoint_changes_the_count_by_one() -> Result<(), SyntheticError> {
        let mut cluster = SyntheticCluster::generate(&small())?;
        let count = |c: &SyntheticCluster| -> usize {
            c.slices_of(5).iter().map(|s| s.endpoints.len()).sum()
        };
        let before = cluster.slices_of(5).to_vec();
        let grown = cluster.add_endpoint(5)?;
        assert_eq!(count(&cluster), 8);
        assert_eq!(grown.endpoints[..7], before[0].endpoints[..]);
        let added = placement_of(&grown.endpoints[7]).ok_or(SyntheticError::NoEndpoint(5))?;
        assert!(
            before[0]
                .endpoints
                .iter()
                .all(|ep| placement_of(ep).map(|p| p.ip) != Some(added.ip))
        );
        let shrunk = cluster.remove_endpoint(5)?;
        assert_eq!(shrunk, before[0]);
        for _ in 0..7 {
            cluster.remove_endpoint(5)?;
        }
        assert_eq!(count(&cluster), 0);
        assert_eq!(
            cluster.remove_endpoint(5).err(),
            Some(SyntheticError::NoEndpoint(5))
        );
        assert_eq!(
            cluster.add_endpoint(10_000).err(),
            Some(SyntheticError::UnknownService(10_000))
        );
        Ok(())
    }

    #[test]
    fn large_services_are_split_into_slices() -> Result<(), SyntheticError> {
        let spec = SyntheticSpec {
            services: 2,
            endpoints_per_service: 250,
            ..small()
        };
        let cluster = SyntheticCluster::generate(&spec)?;
        let sizes: Vec<usize> = cluster
            .slices_of(1)
            .iter()
            .map(|s| s.endpoints.len())
            .collect();
        assert_eq!(sizes, vec![100, 100, 50]);
        Ok(())
    }

    #[test]
    fn bad_specs_are_refused() {
        let bad = SyntheticSpec {
            local_fraction: 1.5,
            ..small()
        };
        assert!(matches!(
            SyntheticCluster::generate(&bad),
            Err(SyntheticError::Fraction { .. })
        ));
        let crowded = SyntheticSpec {
            services: 100_000,
            endpoints_per_service: 100,
            nodes: 2,
            ..small()
        };
        assert!(matches!(
            SyntheticCluster::generate(&crowded),
            Err(SyntheticError::PodSpace { .. })
        ));
    }
}
