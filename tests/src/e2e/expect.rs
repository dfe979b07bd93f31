//! What a node's merged plan must hold for the suite's Services, computed independently
//! of the controller from the Services (as the API server returned them, with their
//! allocated cluster IPs and node ports) and the EndpointSlices.
//!
//! This models only what the fixtures use: ready endpoints, zone hints, ClusterIP,
//! NodePort and LoadBalancer Services, external IPs, `externalTrafficPolicy`, ClientIP
//! affinity. Anything else (`internalTrafficPolicy: Local`, node hints, endpoints that
//! are not ready) is refused with an error rather than guessed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use proxyplan_crds::{Endpoint, IpFamily, MergedPlan, Protocol, ServicePortPlan, TrafficPolicy};

use super::fixtures::SERVICE_NAME_LABEL;

/// kube-proxy's default ClientIP affinity timeout.
const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;

/// The node whose plan is computed.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    /// Node name.
    pub name: &'a str,
    /// Its zone.
    pub zone: Option<&'a str>,
}

/// The parts of a merged service port entry the suite checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// Cluster IP of the entry's family.
    pub cluster_ip: String,
    /// Service port.
    pub port: u16,
    /// Node port.
    pub node_port: Option<u16>,
    /// External IPs of the family.
    pub external_ips: Vec<String>,
    /// Load-balancer ingress IPs of the family.
    pub load_balancer_ips: Vec<String>,
    /// Health-check node port.
    pub health_check_node_port: Option<u16>,
    /// ClientIP affinity timeout.
    pub affinity_timeout: Option<u32>,
    /// Policy of external traffic, when the entry is externally accessible.
    pub external_policy: Option<TrafficPolicy>,
    /// `clusterEndpoints` after every override for this node.
    pub cluster_endpoints: BTreeSet<Endpoint>,
    /// `localEndpoints` on this node.
    pub local_endpoints: BTreeSet<Endpoint>,
}

impl Expected {
    /// The checked parts of a merged entry.
    #[must_use]
    pub fn of(entry: &ServicePortPlan) -> Self {
        Self {
            cluster_ip: entry.cluster_ip.to_string(),
            port: entry.port,
            node_port: entry.node_port,
            external_ips: entry.external_ips.clone(),
            load_balancer_ips: entry
                .load_balancer_ips
                .iter()
                .map(|lb| lb.ip.clone())
                .collect(),
            health_check_node_port: entry.health_check_node_port,
            affinity_timeout: entry.session_affinity.map(|a| a.timeout_seconds),
            external_policy: entry.external.map(|t| t.policy),
            cluster_endpoints: entry.cluster_endpoints.iter().cloned().collect(),
            local_endpoints: entry.local_endpoints.iter().cloned().collect(),
        }
    }
}

/// The entry key: `namespace/name:port/PROTOCOL/family`.
#[must_use]
pub fn entry_key(
    namespace: &str,
    name: &str,
    port_name: &str,
    protocol: Protocol,
    family: IpFamily,
) -> String {
    format!("{namespace}/{name}:{port_name}/{protocol}/{family}")
}

fn protocol_of(text: Option<&str>) -> Result<Protocol, String> {
    match text.unwrap_or("TCP") {
        "TCP" => Ok(Protocol::TCP),
        "UDP" => Ok(Protocol::UDP),
        "SCTP" => Ok(Protocol::SCTP),
        other => Err(format!("unknown protocol {other:?}")),
    }
}

fn family_of(ip: IpAddr) -> IpFamily {
    if ip.is_ipv4() {
        IpFamily::IPv4
    } else {
        IpFamily::IPv6
    }
}

fn port_number(value: i32, what: &str) -> Result<u16, String> {
    u16::try_from(value)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("{what}: {value} is not a port"))
}

/// An endpoint of one service port, with what selection needs.
struct Candidate<'a> {
    endpoint: Endpoint,
    node: Option<&'a str>,
    zone_hints: BTreeSet<&'a str>,
}

/// The endpoints of a Service port of one family, from its slices.
fn candidates<'a>(
    namespace: &str,
    service: &str,
    family: IpFamily,
    port_name: &str,
    protocol: Protocol,
    slices: &'a [EndpointSlice],
) -> Result<Vec<Candidate<'a>>, String> {
    let mut out: Vec<Candidate<'a>> = Vec::new();
    let family_text = family.to_string();
    for slice in slices {
        let owner = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL));
        if slice.metadata.namespace.as_deref() != Some(namespace)
            || owner.map(String::as_str) != Some(service)
            || slice.address_type != family_text
        {
            continue;
        }
        let slice_name = slice.metadata.name.as_deref().unwrap_or("?");
        let mut number = None;
        for p in slice.ports.iter().flatten() {
            if p.name.as_deref().unwrap_or("") == port_name
                && protocol_of(p.protocol.as_deref())? == protocol
                && let Some(n) = p.port
            {
                number = Some(port_number(n, &format!("EndpointSlice {slice_name} port"))?);
            }
        }
        let Some(number) = number else { continue };
        for ep in &slice.endpoints {
            let Some(address) = ep.addresses.first() else {
                continue;
            };
            let conditions = ep.conditions.as_ref();
            if conditions.and_then(|c| c.ready) == Some(false)
                || conditions.and_then(|c| c.terminating) == Some(true)
            {
                return Err(format!(
                    "EndpointSlice {slice_name}: endpoint {address} is not ready or terminating, \
                     which this model does not cover"
                ));
            }
            let hints = ep.hints.as_ref();
            if hints.and_then(|h| h.for_nodes.as_ref()).is_some() {
                return Err(format!(
                    "EndpointSlice {slice_name}: node hints are not modelled"
                ));
            }
            let endpoint = Endpoint {
                ip: address
                    .parse::<IpAddr>()
                    .map_err(|_| format!("EndpointSlice {slice_name}: bad address {address:?}"))?
                    .to_string()
                    .into(),
                port: number,
            };
            if out.iter().any(|c| c.endpoint == endpoint) {
                continue;
            }
            out.push(Candidate {
                endpoint,
                node: ep.node_name.as_deref(),
                zone_hints: hints
                    .and_then(|h| h.for_zones.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|z| z.name.as_str())
                    .collect(),
            });
        }
    }
    Ok(out)
}

/// Every entry the Services must contribute to `node`'s merged plan, by key.
///
/// # Errors
/// When a Service has no cluster IP yet, or uses something this model does not cover.
pub fn expected_entries(
    services: &[Service],
    slices: &[EndpointSlice],
    node: NodeView<'_>,
) -> Result<BTreeMap<String, Expected>, String> {
    let mut out = BTreeMap::new();
    for svc in services {
        let namespace = svc.metadata.namespace.as_deref().unwrap_or_default();
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        let what = format!("Service {namespace}/{name}");
        let spec = svc
            .spec
            .as_ref()
            .ok_or_else(|| format!("{what}: no spec"))?;
        if spec.internal_traffic_policy.as_deref() == Some("Local") {
            return Err(format!(
                "{what}: internalTrafficPolicy Local is not modelled"
            ));
        }
        let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
        let externally_typed = matches!(type_, "NodePort" | "LoadBalancer");
        let texts: Vec<&String> = match &spec.cluster_ips {
            Some(list) if !list.is_empty() => list.iter().collect(),
            _ => spec.cluster_ip.iter().collect(),
        };
        if texts.is_empty() || texts.iter().all(|t| t.is_empty()) {
            return Err(format!("{what}: no cluster IP allocated yet"));
        }
        let cluster_ips = texts
            .iter()
            .map(|t| {
                t.parse::<IpAddr>()
                    .map_err(|_| format!("{what}: cluster IP {t:?}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let external_ips = spec
            .external_ips
            .iter()
            .flatten()
            .map(|t| {
                t.parse::<IpAddr>()
                    .map_err(|_| format!("{what}: external IP {t:?}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut lb_ips: Vec<(IpAddr, bool)> = Vec::new();
        if type_ == "LoadBalancer" {
            let ingress = svc
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref());
            for ing in ingress.into_iter().flatten() {
                if let Some(ip) = ing.ip.as_deref().filter(|ip| !ip.is_empty()) {
                    let ip = ip
                        .parse()
                        .map_err(|_| format!("{what}: ingress IP {ip:?}"))?;
                    lb_ips.push((ip, ing.ip_mode.as_deref() != Some("Proxy")));
                }
            }
        }
        let etp_local = spec.external_traffic_policy.as_deref() == Some("Local")
            && (externally_typed || !external_ips.is_empty());
        let affinity_timeout = match spec.session_affinity.as_deref() {
            Some("ClientIP") => Some(
                match spec
                    .session_affinity_config
                    .as_ref()
                    .and_then(|c| c.client_ip.as_ref())
                    .and_then(|c| c.timeout_seconds)
                {
                    Some(t) => u32::try_from(t).map_err(|_| format!("{what}: timeout {t}"))?,
                    None => DEFAULT_AFFINITY_TIMEOUT,
                },
            ),
            _ => None,
        };
        let health_check_node_port = match spec.health_check_node_port {
            Some(p) if p != 0 && type_ == "LoadBalancer" && etp_local => {
                Some(port_number(p, &format!("{what}: healthCheckNodePort"))?)
            }
            _ => None,
        };
        for &cluster_ip in &cluster_ips {
            let family = family_of(cluster_ip);
            let same = |ip: &IpAddr| family_of(*ip) == family;
            let external: Vec<String> = external_ips
                .iter()
                .filter(|ip| same(ip))
                .map(ToString::to_string)
                .collect();
            let lbs: Vec<&(IpAddr, bool)> = lb_ips.iter().filter(|(ip, _)| same(ip)).collect();
            for p in spec.ports.iter().flatten() {
                let port_name = p.name.as_deref().unwrap_or("");
                let protocol = protocol_of(p.protocol.as_deref())?;
                let node_port = match p.node_port {
                    Some(n) if n != 0 && externally_typed => {
                        Some(port_number(n, &format!("{what}: nodePort"))?)
                    }
                    _ => None,
                };
                let accessible =
                    node_port.is_some() || !external.is_empty() || lbs.iter().any(|(_, vip)| *vip);
                let all = candidates(namespace, name, family, port_name, protocol, slices)?;
                let hinted_zones: BTreeSet<&str> =
                    if !all.is_empty() && all.iter().all(|c| !c.zone_hints.is_empty()) {
                        all.iter()
                            .flat_map(|c| c.zone_hints.iter().copied())
                            .collect()
                    } else {
                        BTreeSet::new()
                    };
                let cluster_endpoints = all
                    .iter()
                    .filter(|c| match node.zone {
                        Some(zone) if hinted_zones.contains(zone) => c.zone_hints.contains(zone),
                        _ => true,
                    })
                    .map(|c| c.endpoint.clone())
                    .collect();
                let local_endpoints = if etp_local && accessible {
                    all.iter()
                        .filter(|c| c.node == Some(node.name))
                        .map(|c| c.endpoint.clone())
                        .collect()
                } else {
                    BTreeSet::new()
                };
                out.insert(
                    entry_key(namespace, name, port_name, protocol, family),
                    Expected {
                        cluster_ip: cluster_ip.to_string(),
                        port: port_number(p.port, &format!("{what}: port"))?,
                        node_port,
                        external_ips: external.clone(),
                        load_balancer_ips: lbs.iter().map(|(ip, _)| ip.to_string()).collect(),
                        health_check_node_port,
                        affinity_timeout,
                        external_policy: accessible.then_some(if etp_local {
                            TrafficPolicy::Local
                        } else {
                            TrafficPolicy::Cluster
                        }),
                        cluster_endpoints,
                        local_endpoints,
                    },
                );
            }
        }
    }
    Ok(out)
}

/// How `merged`'s entries of `namespace` differ from `expected`, one line per
/// difference; empty when they match.
#[must_use]
pub fn differences(
    expected: &BTreeMap<String, Expected>,
    merged: &MergedPlan,
    namespace: &str,
) -> Vec<String> {
    let have: BTreeMap<&str, Expected> = merged
        .service_ports
        .iter()
        .filter(|e| e.namespace == namespace)
        .map(|e| (e.key.as_str(), Expected::of(e)))
        .collect();
    let mut out = Vec::new();
    for (key, want) in expected {
        let Some(got) = have.get(key.as_str()) else {
            out.push(format!("{key}: missing"));
            continue;
        };
        let mut field = |name: &str, want: String, got: String| {
            if want != got {
                out.push(format!("{key}: {name}: want {want}, have {got}"));
            }
        };
        field("clusterIP", want.cluster_ip.clone(), got.cluster_ip.clone());
        field("port", want.port.to_string(), got.port.to_string());
        field(
            "nodePort",
            format!("{:?}", want.node_port),
            format!("{:?}", got.node_port),
        );
        field(
            "externalIPs",
            format!("{:?}", want.external_ips),
            format!("{:?}", got.external_ips),
        );
        field(
            "loadBalancerIPs",
            format!("{:?}", want.load_balancer_ips),
            format!("{:?}", got.load_balancer_ips),
        );
        field(
            "healthCheckNodePort",
            format!("{:?}", want.health_check_node_port),
            format!("{:?}", got.health_check_node_port),
        );
        field(
            "sessionAffinity.timeoutSeconds",
            format!("{:?}", want.affinity_timeout),
            format!("{:?}", got.affinity_timeout),
        );
        field(
            "external.policy",
            format!("{:?}", want.external_policy),
            format!("{:?}", got.external_policy),
        );
        field(
            "clusterEndpoints",
            endpoints(&want.cluster_endpoints),
            endpoints(&got.cluster_endpoints),
        );
        field(
            "localEndpoints",
            endpoints(&want.local_endpoints),
            endpoints(&got.local_endpoints),
        );
    }
    for key in have.keys() {
        if !expected.contains_key(*key) {
            out.push(format!("{key}: unexpected entry"));
        }
    }
    out
}

fn endpoints(set: &BTreeSet<Endpoint>) -> String {
    let list: Vec<String> = set.iter().map(|e| format!("{}:{}", e.ip, e.port)).collect();
    format!("[{}]", list.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::e2e::fixtures::{self, World};

    /// The Services as an API server returns them: cluster IPs and node ports allocated,
    /// the load balancer's status patched.
    fn allocated(world: &World, dual_stack: bool) -> Vec<Service> {
        let mut services = world.services();
        for (i, svc) in services.iter_mut().enumerate() {
            let name = svc.metadata.name.clone().unwrap_or_default();
            let spec = svc.spec.as_mut().unwrap();
            let v4 = format!("10.96.0.{}", i + 10);
            spec.cluster_ip = Some(v4.clone());
            spec.cluster_ips = Some(if dual_stack && name == fixtures::DUAL_STACK {
                vec![v4, format!("fd00:96::{}", i + 10)]
            } else {
                vec![v4]
            });
            let typed = matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer"));
            for (j, p) in spec.ports.iter_mut().flatten().enumerate() {
                if typed {
                    p.node_port = Some(30_000 + i32::try_from(i * 10 + j).unwrap());
                }
            }
            if name == fixtures::LB_LOCAL {
                spec.health_check_node_port = Some(31_999);
                let patch = World::load_balancer_status_patch();
                svc.status = Some(serde_json::from_value(patch["status"].clone()).unwrap());
            }
        }
        services
    }

    fn view(world: &World, i: usize) -> NodeView<'_> {
        NodeView {
            name: &world.nodes[i].name,
            zone: Some(&world.nodes[i].zone),
        }
    }

    #[test]
    fn keys_cover_every_port_and_family() {
        let world = World::new("abcdef");
        let services = allocated(&world, true);
        let slices = world.slices(true);
        let want = expected_entries(&services, &slices, view(&world, 0)).unwrap();
        let ns = &world.namespace;
        let keys: Vec<&str> = want.keys().map(String::as_str).collect();
        let expected_keys = [
            format!("{ns}/affinity:http/TCP/IPv4"),
            format!("{ns}/clusterip:http/TCP/IPv4"),
            format!("{ns}/clusterip:https/TCP/IPv4"),
            format!("{ns}/dual-stack:http/TCP/IPv4"),
            format!("{ns}/dual-stack:http/TCP/IPv6"),
            format!("{ns}/external-ips:http/TCP/IPv4"),
            format!("{ns}/lb-local:http/TCP/IPv4"),
            format!("{ns}/no-endpoints:http/TCP/IPv4"),
            format!("{ns}/nodeport:http/TCP/IPv4"),
            format!("{ns}/topology:http/TCP/IPv4"),
            format!("{ns}/udp:/UDP/IPv4"),
        ];
        assert_eq!(keys, expected_keys);
        let single = expected_entries(&allocated(&world, false), &slices, view(&world, 0)).unwrap();
        assert!(!single.keys().any(|k| k.ends_with("/IPv6")));
        assert_eq!(single.len(), expected_keys.len() - 1);
    }

    #[test]
    fn each_kind_gets_its_fields() {
        let world = World::new("abcdef");
        let services = allocated(&world, true);
        let slices = world.slices(true);
        let ns = &world.namespace;
        let a = expected_entries(&services, &slices, view(&world, 0)).unwrap();
        let b = expected_entries(&services, &slices, view(&world, 1)).unwrap();
        let c = expected_entries(&services, &slices, view(&world, 2)).unwrap();
        let ep = |ip: &str, port| Endpoint {
            ip: ip.into(),
            port,
        };

        let lb = &a[&format!("{ns}/lb-local:http/TCP/IPv4")];
        assert_eq!(lb.external_policy, Some(TrafficPolicy::Local));
        assert_eq!(lb.load_balancer_ips, [fixtures::LOAD_BALANCER_IP]);
        assert_eq!(lb.health_check_node_port, Some(31_999));
        assert!(lb.node_port.is_some());
        assert_eq!(
            lb.local_endpoints,
            BTreeSet::from([ep("10.250.1.30", 8080)])
        );
        assert!(
            b[&format!("{ns}/lb-local:http/TCP/IPv4")]
                .local_endpoints
                .is_empty()
        );

        let none = &a[&format!("{ns}/no-endpoints:http/TCP/IPv4")];
        assert!(none.cluster_endpoints.is_empty());
        assert_eq!(none.external_policy, None);

        let ext = &a[&format!("{ns}/external-ips:http/TCP/IPv4")];
        assert_eq!(ext.external_ips, [fixtures::EXTERNAL_IP]);
        assert_eq!(ext.external_policy, Some(TrafficPolicy::Cluster));

        let aff = &a[&format!("{ns}/affinity:http/TCP/IPv4")];
        assert_eq!(aff.affinity_timeout, Some(600));

        let udp = &a[&format!("{ns}/udp:/UDP/IPv4")];
        assert_eq!(udp.port, 53);
        assert_eq!(
            udp.cluster_endpoints,
            BTreeSet::from([ep("10.250.2.60", 5353), ep("10.250.3.60", 5353)])
        );

        let v6 = &a[&format!("{ns}/dual-stack:http/TCP/IPv6")];
        assert!(v6.cluster_ip.contains(':'));
        assert!(v6.cluster_endpoints.iter().all(|e| e.ip.contains(':')));

        // Zone hints: the first zone's nodes see only its endpoint, the second zone's only
        // its own.
        let key = format!("{ns}/topology:http/TCP/IPv4");
        assert_eq!(
            a[&key].cluster_endpoints,
            BTreeSet::from([ep("10.250.1.80", 8080)])
        );
        assert_eq!(a[&key].cluster_endpoints, b[&key].cluster_endpoints);
        assert_eq!(
            c[&key].cluster_endpoints,
            BTreeSet::from([ep("10.250.3.80", 8080)])
        );
        // A node of no hinted zone sees all.
        let other = NodeView {
            name: "elsewhere",
            zone: Some("nowhere"),
        };
        let d = expected_entries(&services, &slices, other).unwrap();
        assert_eq!(d[&key].cluster_endpoints.len(), 2);
    }

    #[test]
    fn unallocated_or_unmodelled_services_are_refused() {
        let world = World::new("abcdef");
        let slices = world.slices(false);
        let err = expected_entries(&world.services(), &slices, view(&world, 0)).unwrap_err();
        assert!(err.contains("no cluster IP"), "{err}");

        let mut services = allocated(&world, false);
        services[0].spec.as_mut().unwrap().internal_traffic_policy = Some("Local".to_owned());
        assert!(expected_entries(&services, &slices, view(&world, 0)).is_err());

        let services = allocated(&world, false);
        let mut slices = world.slices(false);
        slices[0].endpoints[0].conditions.as_mut().unwrap().ready = Some(false);
        assert!(expected_entries(&services, &slices, view(&world, 0)).is_err());
    }
}
