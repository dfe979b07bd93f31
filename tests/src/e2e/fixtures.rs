//! The objects the end-to-end suite creates: a namespace, fake Nodes, and selector-less
//! Services of every kind with hand-written EndpointSlices, plus the changes the
//! scenarios make to them.
//!
//! Every Service is selector-less, so no controller of the cluster touches its slices;
//! the LoadBalancer Service names a `loadBalancerClass` no cloud controller implements,
//! so the ingress IP the suite patches into its status stays as written.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};

use k8s_openapi::api::core::v1::{
    ClientIPConfig, Namespace, Node, NodeAddress, NodeSpec, NodeStatus, Service, ServicePort,
    ServiceSpec, SessionAffinityConfig, Taint,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Field manager of the suite's server-side applies.
pub const FIELD_MANAGER: &str = "proxyplan-e2e";
/// Label on everything the suite creates; the value is the run id.
pub const RUN_LABEL: &str = "proxyplan.dev/e2e-run";
/// The zone label the controller reads.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Label tying an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Label naming who manages an EndpointSlice (keeps the cluster's controllers off ours).
pub const SLICE_MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// Value of [`SLICE_MANAGED_BY_LABEL`] on the suite's slices.
pub const SLICE_MANAGER: &str = "proxyplan-e2e.proxyplan.dev";
/// `NoSchedule` taint on the fake nodes, so ordinary workloads are not bound to them.
pub const FAKE_NODE_TAINT: &str = "proxyplan.dev/e2e-fake-node";
/// `spec.loadBalancerClass` of the LoadBalancer Service: no load-balancer controller owns it.
pub const LOAD_BALANCER_CLASS: &str = "proxyplan.dev/e2e";
/// The ingress IP patched into the LoadBalancer Service's status.
pub const LOAD_BALANCER_IP: &str = "192.0.2.100";
/// `spec.externalIPs` of the external-IP Service.
pub const EXTERNAL_IP: &str = "192.0.2.50";
/// The pod CIDR covering every fake node's pod CIDR (the controller's `--cluster-cidr`).
pub const CLUSTER_CIDR: &str = "10.250.0.0/16";
/// ClientIP affinity timeout of the affinity Service.
pub const AFFINITY_TIMEOUT: i32 = 600;

/// A ClusterIP Service with two named ports and endpoints on every node.
pub const CLUSTER_IP: &str = "clusterip";
/// A NodePort Service.
pub const NODE_PORT: &str = "nodeport";
/// A LoadBalancer Service with `externalTrafficPolicy: Local` and one endpoint.
pub const LB_LOCAL: &str = "lb-local";
/// A ClusterIP Service with `spec.externalIPs`.
pub const EXTERNAL_IPS: &str = "external-ips";
/// A ClusterIP Service with ClientIP session affinity.
pub const AFFINITY: &str = "affinity";
/// A ClusterIP Service without any EndpointSlice.
pub const NO_ENDPOINTS: &str = "no-endpoints";
/// A ClusterIP Service with one unnamed UDP port.
pub const UDP: &str = "udp";
/// A `PreferDualStack` Service (dual-stack when the cluster is).
pub const DUAL_STACK: &str = "dual-stack";
/// A ClusterIP Service whose endpoints carry zone hints.
pub const TOPOLOGY: &str = "topology";

/// One fake node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeNode {
    /// Position in [`World::nodes`]; picks the node's addresses.
    pub index: u8,
    /// Node name.
    pub name: String,
    /// Its `topology.kubernetes.io/zone`.
    pub zone: String,
    /// Its InternalIP.
    pub address: String,
    /// Its pod CIDR.
    pub pod_cidr: String,
}

/// Everything one run creates, named after its run id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct World {
    /// Random id of this run.
    pub run_id: String,
    /// The test namespace, `proxyplan-e2e-<run id>`.
    pub namespace: String,
    /// Three fake nodes: the first two in one zone, the third in another.
    pub nodes: Vec<FakeNode>,
}

/// A random id for a run: six lowercase hex digits.
#[must_use]
pub fn random_run_id() -> String {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    if let Ok(since) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(since.as_nanos());
    }
    format!("{:06x}", hasher.finish() & 0xff_ffff)
}

fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    )
}

fn port(name: &str, protocol: &str, port: i32, target: i32) -> ServicePort {
    ServicePort {
        name: (!name.is_empty()).then(|| name.to_owned()),
        protocol: Some(protocol.to_owned()),
        port,
        target_port: Some(IntOrString::Int(target)),
        ..ServicePort::default()
    }
}

fn http() -> Vec<ServicePort> {
    vec![port("http", "TCP", 80, 8080)]
}

/// Where an endpoint lives: a node and a host number inside the node's pod CIDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pod {
    /// Index of the node.
    pub node: u8,
    /// Host number.
    pub host: u8,
}

impl World {
    /// The world of run `run_id`.
    #[must_use]
    pub fn new(run_id: &str) -> Self {
        let prefix = format!("proxyplan-e2e-{run_id}");
        let nodes = ["a", "b", "c"]
            .iter()
            .zip(0_u8..)
            .map(|(letter, index)| FakeNode {
                index,
                name: format!("{prefix}-{letter}"),
                zone: format!("{prefix}-zone-{}", if index < 2 { 1 } else { 2 }),
                address: format!("192.0.2.{}", 10 + index),
                pod_cidr: format!("10.250.{}.0/24", index + 1),
            })
            .collect();
        Self {
            run_id: run_id.to_owned(),
            namespace: prefix,
            nodes,
        }
    }

    fn meta(&self, name: &str, namespace: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: namespace.map(str::to_owned),
            labels: labels(&[(RUN_LABEL, &self.run_id)]),
            ..ObjectMeta::default()
        }
    }

    /// The test namespace.
    #[must_use]
    pub fn namespace_object(&self) -> Namespace {
        Namespace {
            metadata: self.meta(&self.namespace, None),
            ..Namespace::default()
        }
    }

    /// A fake Node: zone label, pod CIDR, `NoSchedule` taint and an InternalIP (the
    /// status part is also patched through the status subresource, see
    /// [`World::node_status_patch`]).
    #[must_use]
    pub fn node_object(&self, node: &FakeNode) -> Node {
        let mut metadata = self.meta(&node.name, None);
        if let Some(l) = metadata.labels.as_mut() {
            l.insert(ZONE_LABEL.to_owned(), node.zone.clone());
        }
        Node {
            metadata,
            spec: Some(NodeSpec {
                pod_cidr: Some(node.pod_cidr.clone()),
                pod_cidrs: Some(vec![node.pod_cidr.clone()]),
                taints: Some(vec![Taint {
                    key: FAKE_NODE_TAINT.to_owned(),
                    value: Some("true".to_owned()),
                    effect: "NoSchedule".to_owned(),
                    ..Taint::default()
                }]),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress {
                    address: node.address.clone(),
                    type_: "InternalIP".to_owned(),
                }]),
                ..NodeStatus::default()
            }),
        }
    }

    /// A merge patch of the node's status with its address.
    #[must_use]
    pub fn node_status_patch(node: &FakeNode) -> serde_json::Value {
        serde_json::json!({
            "status": { "addresses": [{ "type": "InternalIP", "address": node.address }] }
        })
    }

    /// A merge patch of the LoadBalancer Service's status with its ingress IP.
    #[must_use]
    pub fn load_balancer_status_patch() -> serde_json::Value {
        serde_json::json!({
            "status": { "loadBalancer": { "ingress": [{ "ip": LOAD_BALANCER_IP }] } }
        })
    }

    /// The IPv4 address of a pod.
    #[must_use]
    pub fn pod_ipv4(pod: Pod) -> String {
        format!("10.250.{}.{}", pod.node + 1, pod.host)
    }

    /// The IPv6 address of a pod (dual-stack Service only).
    #[must_use]
    pub fn pod_ipv6(pod: Pod) -> String {
        format!("fd00:e2e:0:{}::{}", pod.node + 1, pod.host)
    }

    fn node(&self, index: u8) -> Option<&FakeNode> {
        self.nodes.get(usize::from(index))
    }

    /// Every Service, as the suite creates it (the API server allocates cluster IPs and
    /// node ports).
    #[must_use]
    pub fn services(&self) -> Vec<Service> {
        let ns = Some(self.namespace.as_str());
        let svc = |name: &str, spec: ServiceSpec| Service {
            metadata: self.meta(name, ns),
            spec: Some(spec),
            status: None,
        };
        vec![
            svc(
                CLUSTER_IP,
                ServiceSpec {
                    ports: Some(vec![
                        port("http", "TCP", 80, 8080),
                        port("https", "TCP", 443, 8443),
                    ]),
                    ..ServiceSpec::default()
                },
            ),
            svc(
                NODE_PORT,
                ServiceSpec {
                    type_: Some("NodePort".to_owned()),
                    ports: Some(http()),
                    ..ServiceSpec::default()
                },
            ),
            svc(
                LB_LOCAL,
                ServiceSpec {
                    type_: Some("LoadBalancer".to_owned()),
                    load_balancer_class: Some(LOAD_BALANCER_CLASS.to_owned()),
                    external_traffic_policy: Some("Local".to_owned()),
                    ports: Some(http()),
                    ..ServiceSpec::default()
                },
            ),
            svc(
                EXTERNAL_IPS,
                ServiceSpec {
                    external_ips: Some(vec![EXTERNAL_IP.to_owned()]),
                    ports: Some(http()),
                    ..ServiceSpec::default()
                },
            ),
            svc(
                AFFINITY,
                ServiceSpec {
                    session_affinity: Some("ClientIP".to_owned()),
                    session_affinity_config: Some(SessionAffinityConfig {
                        client_ip: Some(ClientIPConfig {
                            timeout_seconds: Some(AFFINITY_TIMEOUT),
                        }),
                    }),
                    ports: Some(http()),
                    ..ServiceSpec::default()
                },
            ),
            svc(
                NO_ENDPOINTS,
                ServiceSpec {
                    ports: Some(http()),
                    ..ServiceSpec::default()
                },
            ),
            svc(
                UDP,
                ServiceSpec {
                    ports: Some(vec![port("", "UDP", 53, 5353)]),
                    ..ServiceSpec::default()
                },
            ),
            svc(
                DUAL_STACK,
                ServiceSpec {
                    ip_family_policy: Some("PreferDualStack".to_owned()),
                    ports: Some(http()),
                    ..ServiceSpec::default()
                },
            ),
            svc(
                TOPOLOGY,
                ServiceSpec {
                    ports: Some(http()),
                    ..ServiceSpec::default()
                },
            ),
        ]
    }

    /// An endpoint of `pod` for the given family, ready, on the pod's node and zone, with
    /// zone hints when given.
    #[must_use]
    pub fn endpoint(&self, pod: Pod, ipv6: bool, hints: &[&str]) -> Endpoint {
        let node = self.node(pod.node);
        Endpoint {
            addresses: vec![if ipv6 {
                Self::pod_ipv6(pod)
            } else {
                Self::pod_ipv4(pod)
            }],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            node_name: node.map(|n| n.name.clone()),
            zone: node.map(|n| n.zone.clone()),
            hints: (!hints.is_empty()).then(|| EndpointHints {
                for_zones: Some(
                    hints
                        .iter()
                        .map(|z| ForZone {
                            name: (*z).to_owned(),
                        })
                        .collect(),
                ),
                ..EndpointHints::default()
            }),
            ..Endpoint::default()
        }
    }

    fn slice(
        &self,
        service: &str,
        ipv6: bool,
        ports: &[(&str, &str, i32)],
        endpoints: Vec<Endpoint>,
    ) -> EndpointSlice {
        let family = if ipv6 { "IPv6" } else { "IPv4" };
        let mut metadata = self.meta(
            &format!("{service}-{}", family.to_lowercase()),
            Some(&self.namespace),
        );
        if let Some(l) = metadata.labels.as_mut() {
            l.insert(SERVICE_NAME_LABEL.to_owned(), service.to_owned());
            l.insert(SLICE_MANAGED_BY_LABEL.to_owned(), SLICE_MANAGER.to_owned());
        }
        EndpointSlice {
            metadata,
            address_type: family.to_owned(),
            endpoints,
            ports: Some(
                ports
                    .iter()
                    .map(|(name, protocol, number)| EndpointPort {
                        name: (!name.is_empty()).then(|| (*name).to_owned()),
                        protocol: Some((*protocol).to_owned()),
                        port: Some(*number),
                        ..EndpointPort::default()
                    })
                    .collect(),
            ),
        }
    }

    /// The initial EndpointSlices; `ipv6` adds the IPv6 slice of the dual-stack Service
    /// (only when the cluster gave it an IPv6 cluster IP).
    #[must_use]
    pub fn slices(&self, ipv6: bool) -> Vec<EndpointSlice> {
        let pod = |node, host| Pod { node, host };
        let http = [("http", "TCP", 8080)];
        let zone = |i: u8| self.node(i).map_or("", |n| n.zone.as_str());
        let mut slices = vec![
            self.slice(
                CLUSTER_IP,
                false,
                &[("http", "TCP", 8080), ("https", "TCP", 8443)],
                (0..3)
                    .map(|n| self.endpoint(pod(n, 10), false, &[]))
                    .collect(),
            ),
            self.slice(
                NODE_PORT,
                false,
                &http,
                vec![
                    self.endpoint(pod(0, 20), false, &[]),
                    self.endpoint(pod(2, 20), false, &[]),
                ],
            ),
            self.slice(
                LB_LOCAL,
                false,
                &http,
                vec![self.endpoint(pod(0, 30), false, &[])],
            ),
            self.slice(
                EXTERNAL_IPS,
                false,
                &http,
                vec![
                    self.endpoint(pod(0, 40), false, &[]),
                    self.endpoint(pod(1, 40), false, &[]),
                ],
            ),
            self.slice(
                AFFINITY,
                false,
                &http,
                vec![
                    self.endpoint(pod(0, 50), false, &[]),
                    self.endpoint(pod(1, 50), false, &[]),
                ],
            ),
            self.slice(
                UDP,
                false,
                &[("", "UDP", 5353)],
                vec![
                    self.endpoint(pod(1, 60), false, &[]),
                    self.endpoint(pod(2, 60), false, &[]),
                ],
            ),
            self.slice(
                DUAL_STACK,
                false,
                &http,
                vec![
                    self.endpoint(pod(0, 70), false, &[]),
                    self.endpoint(pod(1, 70), false, &[]),
                ],
            ),
            self.slice(
                TOPOLOGY,
                false,
                &http,
                vec![
                    self.endpoint(pod(0, 80), false, &[zone(0)]),
                    self.endpoint(pod(2, 80), false, &[zone(2)]),
                ],
            ),
        ];
        if ipv6 {
            slices.push(self.slice(
                DUAL_STACK,
                true,
                &http,
                vec![
                    self.endpoint(pod(0, 70), true, &[]),
                    self.endpoint(pod(2, 70), true, &[]),
                ],
            ));
        }
        slices
    }

    /// The endpoint the endpoint-change scenario adds to the ClusterIP Service.
    #[must_use]
    pub fn added_endpoint() -> Pod {
        Pod { node: 0, host: 99 }
    }

    /// Adds [`World::added_endpoint`] to the ClusterIP Service's IPv4 slice; returns the
    /// changed slice.
    ///
    /// # Errors
    /// When `slices` has no such slice.
    pub fn add_endpoint(&self, slices: &mut [EndpointSlice]) -> Result<EndpointSlice, String> {
        let slice = find_slice(slices, CLUSTER_IP, "IPv4")?;
        slice
            .endpoints
            .push(self.endpoint(Self::added_endpoint(), false, &[]));
        Ok(slice.clone())
    }

    /// Moves the LoadBalancer (`externalTrafficPolicy: Local`) Service's endpoint, same
    /// address, from whatever node it is on to node `to`; returns the changed slice.
    ///
    /// # Errors
    /// When `slices` has no such slice or `to` is not a node.
    pub fn move_local_endpoint(
        &self,
        slices: &mut [EndpointSlice],
        to: u8,
    ) -> Result<EndpointSlice, String> {
        let node = self
            .node(to)
            .ok_or_else(|| format!("no fake node {to}"))?
            .clone();
        let slice = find_slice(slices, LB_LOCAL, "IPv4")?;
        for endpoint in &mut slice.endpoints {
            endpoint.node_name = Some(node.name.clone());
            endpoint.zone = Some(node.zone.clone());
        }
        Ok(slice.clone())
    }
}

/// The slice of `service` with this address type.
fn find_slice<'a>(
    slices: &'a mut [EndpointSlice],
    service: &str,
    address_type: &str,
) -> Result<&'a mut EndpointSlice, String> {
    slices
        .iter_mut()
        .find(|s| {
            s.address_type == address_type
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .is_some_and(|n| n == service)
        })
        .ok_or_else(|| format!("no {address_type} EndpointSlice of Service {service}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_per_run_and_valid() {
        let world = World::new("0a1b2c");
        assert_eq!(world.namespace, "proxyplan-e2e-0a1b2c");
        let names: Vec<_> = world.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "proxyplan-e2e-0a1b2c-a",
                "proxyplan-e2e-0a1b2c-b",
                "proxyplan-e2e-0a1b2c-c"
            ]
        );
        assert_eq!(world.nodes[0].zone, world.nodes[1].zone);
        assert_ne!(world.nodes[0].zone, world.nodes[2].zone);
        // Label values: at most 63 characters.
        assert!(world.nodes.iter().all(|n| n.zone.len() <= 63));
        let id = random_run_id();
        assert_eq!(id.len(), 6);
        assert!(
            id.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
    }

    #[test]
    fn every_slice_names_a_service_and_every_pod_is_in_its_node_cidr() {
        let world = World::new("abcdef");
        let services: Vec<String> = world
            .services()
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        for slice in world.slices(true) {
            let labels = slice.metadata.labels.clone().unwrap_or_default();
            let owner = &labels[SERVICE_NAME_LABEL];
            assert!(services.contains(owner), "{owner}");
            assert_eq!(labels[SLICE_MANAGED_BY_LABEL], SLICE_MANAGER);
            for ep in &slice.endpoints {
                let node = world
                    .nodes
                    .iter()
                    .find(|n| Some(&n.name) == ep.node_name.as_ref())
                    .expect("endpoint on a fake node");
                if slice.address_type == "IPv4" {
                    let prefix = node.pod_cidr.trim_end_matches("0/24");
                    assert!(ep.addresses[0].starts_with(prefix), "{ep:?}");
                }
                assert_eq!(ep.zone.as_ref(), Some(&node.zone));
            }
        }
        assert!(!world.slices(false).iter().any(|s| s.address_type == "IPv6"));
    }

    #[test]
    fn changes_touch_one_slice() {
        let world = World::new("abcdef");
        let mut slices = world.slices(false);
        let before = slices.clone();
        let changed = world.add_endpoint(&mut slices).unwrap();
        assert_eq!(changed.metadata.name.as_deref(), Some("clusterip-ipv4"));
        assert_eq!(changed.endpoints.len(), 4);
        let differing = before.iter().zip(&slices).filter(|(a, b)| a != b).count();
        assert_eq!(differing, 1);

        let changed = world.move_local_endpoint(&mut slices, 1).unwrap();
        assert_eq!(changed.metadata.name.as_deref(), Some("lb-local-ipv4"));
        assert_eq!(
            changed.endpoints[0].node_name.as_deref(),
            Some(world.nodes[1].name.as_str())
        );
        assert_eq!(changed.endpoints[0].addresses, ["10.250.1.30"]);
        assert!(world.move_local_endpoint(&mut slices, 7).is_err());
    }
}
