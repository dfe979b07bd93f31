//! Validated, normalised views of the Kubernetes objects the planner reads.
//!
//! Conversion is where bad input is caught: every error names the object and the field,
//! and objects the proxy must ignore (ExternalName, headless, another proxy's) are told
//! apart from broken ones.

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use proxyplan_crds::{IpFamily, LoadBalancerIpMode, Protocol};

/// Label that hands a Service to another proxy.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// Label marking headless Services and their slices.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// Label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Label holding a node's zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// When the change an EndpointSlice carries was triggered (set by the EndpointSlice
/// controller).
pub const SLICE_TRIGGER_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";
/// The taint the cluster autoscaler puts on a node it is about to remove.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
/// Session affinity timeout when the Service does not set one.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;

/// Namespace and name of a Service.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why an object is not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// A field the proxy needs is malformed; the object is refused.
    #[error("{kind} {object}: {field}: {reason}")]
    Invalid {
        /// `Service`, `EndpointSlice` or `Node`.
        kind: &'static str,
        /// `namespace/name` (or `name` for nodes).
        object: String,
        /// JSON path of the field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The object is fine but the proxy has nothing to do for it.
    #[error("{kind} {object}: ignored: {reason}")]
    Ignored {
        /// `Service`, `EndpointSlice` or `Node`.
        kind: &'static str,
        /// `namespace/name` (or `name` for nodes).
        object: String,
        /// Why.
        reason: String,
    },
}

impl ObjectError {
    /// A short stable label for metrics.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Invalid { .. } => "invalid",
            Self::Ignored { .. } => "ignored",
        }
    }

    /// Whether the object is broken, as opposed to deliberately not proxied.
    #[must_use]
    pub fn is_invalid(&self) -> bool {
        matches!(self, Self::Invalid { .. })
    }
}

/// A Service the proxy must implement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceModel {
    /// Namespace and name.
    pub key: ServiceKey,
    /// UID, for the owner reference of the Service's plan (absent in hand-written state
    /// files).
    pub uid: Option<String>,
    /// Ports, in spec order.
    pub ports: Vec<PortModel>,
    /// Cluster IPs, at most one per family.
    pub cluster_ips: Vec<IpAddr>,
    /// `spec.externalIPs`.
    pub external_ips: Vec<IpAddr>,
    /// Load-balancer ingress IPs (type LoadBalancer only).
    pub load_balancer_ips: Vec<(IpAddr, LoadBalancerIpMode)>,
    /// Normalised `spec.loadBalancerSourceRanges` (type LoadBalancer only).
    pub source_ranges: Vec<(IpAddr, u8)>,
    /// Health-check node port (LoadBalancer with Local external policy).
    pub health_check_node_port: Option<u16>,
    /// ClientIP affinity timeout.
    pub affinity_timeout: Option<u32>,
    /// `internalTrafficPolicy: Local`.
    pub internal_local: bool,
    /// `externalTrafficPolicy: Local` on a NodePort or LoadBalancer Service.
    pub external_local: bool,
}

/// One port of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortModel {
    /// Port name (empty for an unnamed single port).
    pub name: String,
    /// Protocol.
    pub protocol: Protocol,
    /// Service port.
    pub port: u16,
    /// Node port, for NodePort and LoadBalancer Services that have one.
    pub node_port: Option<u16>,
}

/// An EndpointSlice the proxy reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceModel {
    /// The slice's own name.
    pub name: String,
    /// The Service it belongs to.
    pub service: ServiceKey,
    /// Address family of every endpoint.
    pub family: IpFamily,
    /// `(port name, protocol, port number)`.
    pub ports: Vec<(String, Protocol, u16)>,
    /// Endpoints with a usable address.
    pub endpoints: Vec<EndpointModel>,
    /// `endpoints.kubernetes.io/last-change-trigger-time`, when set and readable.
    pub trigger: Option<Timestamp>,
}

/// One endpoint of a slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointModel {
    /// First address.
    pub ip: IpAddr,
    /// Node hosting it.
    pub node: Option<String>,
    /// `conditions.ready` (unset means ready).
    pub ready: bool,
    /// `conditions.serving` (unset means serving).
    pub serving: bool,
    /// `conditions.terminating` (unset means not terminating).
    pub terminating: bool,
    /// `hints.forZones`.
    pub zone_hints: BTreeSet<String>,
    /// `hints.forNodes`.
    pub node_hints: BTreeSet<String>,
}

/// A Node, as far as the proxy cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeModel {
    /// Name.
    pub name: String,
    /// UID, for the owner reference (absent in hand-written state files).
    pub uid: Option<String>,
    /// `topology.kubernetes.io/zone`.
    pub zone: Option<String>,
    /// Pod CIDRs.
    pub pod_cidrs: Vec<String>,
    /// InternalIP and ExternalIP addresses.
    pub addresses: Vec<IpAddr>,
    /// Why load balancers should leave the node (being deleted, or tainted for removal
    /// by the cluster autoscaler).
    pub ineligible: Option<String>,
}

/// The family of an address.
#[must_use]
pub fn family_of(ip: IpAddr) -> IpFamily {
    if ip.is_ipv4() {
        IpFamily::IPv4
    } else {
        IpFamily::IPv6
    }
}

struct Fields<'a> {
    kind: &'static str,
    object: &'a str,
}

impl Fields<'_> {
    fn invalid(&self, field: impl Into<String>, reason: impl Into<String>) -> ObjectError {
        ObjectError::Invalid {
            kind: self.kind,
            object: self.object.to_owned(),
            field: field.into(),
            reason: reason.into(),
        }
    }

    fn ignored(&self, reason: impl Into<String>) -> ObjectError {
        ObjectError::Ignored {
            kind: self.kind,
            object: self.object.to_owned(),
            reason: reason.into(),
        }
    }

    fn ip(&self, field: impl Into<String>, text: &str) -> Result<IpAddr, ObjectError> {
        text.trim()
            .parse()
            .map_err(|_| self.invalid(field, format!("{text:?} is not an IP address")))
    }

    /// A name as Kubernetes spells namespaces, Service and port names: 1 to 63 lowercase
    /// letters, digits and `-`, starting and ending with a letter or digit.
    fn dns_label(&self, field: impl Into<String>, text: &str) -> Result<(), ObjectError> {
        let bytes = text.as_bytes();
        let ok = !bytes.is_empty()
            && bytes.len() <= 63
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
            && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
            && bytes.last().is_some_and(u8::is_ascii_alphanumeric);
        if ok {
            Ok(())
        } else {
            Err(self.invalid(
                field,
                format!("{text:?} is not a DNS label (1-63 of a-z, 0-9 and -)"),
            ))
        }
    }

    /// An address traffic may be captured at or sent to: not unspecified, loopback,
    /// link-local or multicast (the agent refuses those too).
    fn usable_ip(&self, field: impl Into<String>, text: &str) -> Result<IpAddr, ObjectError> {
        let field = field.into();
        let ip = self.ip(field.clone(), text)?;
        let special = match ip {
            IpAddr::V4(v4) => {
                v4.is_unspecified()
                    || v4.is_loopback()
                    || v4.is_link_local()
                    || v4.is_multicast()
                    || v4.is_broadcast()
            }
            IpAddr::V6(v6) => {
                v6.is_unspecified()
                    || v6.is_loopback()
                    || v6.is_unicast_link_local()
                    || v6.is_multicast()
            }
        };
        if special {
            return Err(self.invalid(
                field,
                format!("{ip} is an unspecified, loopback, link-local or multicast address"),
            ));
        }
        Ok(ip)
    }

    fn port(&self, field: impl Into<String>, value: i32) -> Result<u16, ObjectError> {
        match u16::try_from(value) {
            Ok(port) if port > 0 => Ok(port),
            _ => Err(self.invalid(field, format!("{value} is not a port (1-65535)"))),
        }
    }

    fn protocol(
        &self,
        field: impl Into<String>,
        value: Option<&str>,
    ) -> Result<Protocol, ObjectError> {
        match value.unwrap_or("TCP") {
            "TCP" => Ok(Protocol::TCP),
            "UDP" => Ok(Protocol::UDP),
            "SCTP" => Ok(Protocol::SCTP),
            other => Err(self.invalid(field, format!("unknown protocol {other:?}"))),
        }
    }
}

fn namespaced(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ServiceKey {
    ServiceKey {
        namespace: meta
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        name: meta.name.clone().unwrap_or_default(),
    }
}

fn has_label(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    label: &str,
) -> bool {
    meta.labels.as_ref().is_some_and(|l| l.contains_key(label))
}

/// Parses a CIDR, returning the network address (host bits cleared) and prefix length.
///
/// # Errors
/// A message when `text` is not a CIDR.
pub fn parse_cidr(text: &str) -> Result<(IpAddr, u8), String> {
    let bad = || format!("{text:?} is not a CIDR");
    let (ip, len) = text.trim().split_once('/').ok_or_else(bad)?;
    let ip: IpAddr = ip.parse().map_err(|_| bad())?;
    let len: u8 = len.parse().map_err(|_| bad())?;
    match ip {
        IpAddr::V4(v4) if len <= 32 => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            Ok((IpAddr::V4((u32::from(v4) & mask).into()), len))
        }
        IpAddr::V6(v6) if len <= 128 => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            Ok((IpAddr::V6((u128::from(v6) & mask).into()), len))
        }
        _ => Err(bad()),
    }
}

impl ServiceModel {
    /// Validates a Service.
    ///
    /// # Errors
    /// [`ObjectError::Ignored`] for Services the proxy does not implement (ExternalName,
    /// headless, handed to another proxy, no cluster IP yet), [`ObjectError::Invalid`]
    /// naming the first malformed field.
    pub fn from_service(svc: &Service) -> Result<Self, ObjectError> {
        let key = namespaced(&svc.metadata);
        let object = key.to_string();
        let f = Fields {
            kind: "Service",
            object: &object,
        };
        f.dns_label("metadata.name", &key.name)?;
        f.dns_label("metadata.namespace", &key.namespace)?;
        if has_label(&svc.metadata, SERVICE_PROXY_NAME_LABEL) {
            return Err(f.ignored(format!(
                "labelled {SERVICE_PROXY_NAME_LABEL} (another proxy's)"
            )));
        }
        if has_label(&svc.metadata, HEADLESS_LABEL) {
            return Err(f.ignored(format!("labelled {HEADLESS_LABEL}")));
        }
        let spec = svc
            .spec
            .as_ref()
            .ok_or_else(|| f.invalid("spec", "missing"))?;
        let svc_type = spec.type_.as_deref().unwrap_or("ClusterIP");
        if svc_type == "ExternalName" {
            return Err(f.ignored("type ExternalName"));
        }
        if !matches!(svc_type, "ClusterIP" | "NodePort" | "LoadBalancer") {
            return Err(f.invalid("spec.type", format!("unknown type {svc_type:?}")));
        }
        let cluster_ips = cluster_ips(&f, spec)?;
        let externally_typed = matches!(svc_type, "NodePort" | "LoadBalancer");
        let ports = spec
            .ports
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, p)| {
                let name = p.name.clone().unwrap_or_default();
                if !name.is_empty() {
                    f.dns_label(format!("spec.ports[{i}].name"), &name)?;
                }
                Ok(PortModel {
                    name,
                    protocol: f
                        .protocol(format!("spec.ports[{i}].protocol"), p.protocol.as_deref())?,
                    port: f.port(format!("spec.ports[{i}].port"), p.port)?,
                    node_port: match p.node_port {
                        Some(n) if n != 0 && externally_typed => {
                            Some(f.port(format!("spec.ports[{i}].nodePort"), n)?)
                        }
                        _ => None,
                    },
                })
            })
            .collect::<Result<Vec<_>, ObjectError>>()?;
        if ports.is_empty() {
            return Err(f.ignored("no ports"));
        }
        let external_ips = spec
            .external_ips
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, ip)| f.usable_ip(format!("spec.externalIPs[{i}]"), ip))
            .collect::<Result<Vec<_>, _>>()?;
        let is_lb = svc_type == "LoadBalancer";
        let mut load_balancer_ips = Vec::new();
        let mut source_ranges = Vec::new();
        if is_lb {
            load_balancer_ips = load_balancer_ips_of(&f, svc)?;
            for (i, range) in spec
                .load_balancer_source_ranges
                .iter()
                .flatten()
                .enumerate()
            {
                let parsed = parse_cidr(range)
                    .map_err(|r| f.invalid(format!("spec.loadBalancerSourceRanges[{i}]"), r))?;
                source_ranges.push(parsed);
            }
        }
        // kube-proxy's ExternallyAccessible: NodePort, LoadBalancer, or ClusterIP with
        // external IPs; only those honour externalTrafficPolicy.
        let externally_accessible = externally_typed || !external_ips.is_empty();
        let external_local =
            externally_accessible && spec.external_traffic_policy.as_deref() == Some("Local");
        let health_check_node_port = match spec.health_check_node_port {
            Some(p) if p != 0 && is_lb && external_local => {
                Some(f.port("spec.healthCheckNodePort", p)?)
            }
            _ => None,
        };
        Ok(Self {
            key,
            uid: svc.metadata.uid.clone(),
            ports,
            cluster_ips,
            external_ips,
            load_balancer_ips,
            source_ranges,
            health_check_node_port,
            affinity_timeout: affinity_timeout(&f, spec)?,
            internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
            external_local,
        })
    }
}

fn cluster_ips(
    f: &Fields<'_>,
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
) -> Result<Vec<IpAddr>, ObjectError> {
    let (field, texts): (&str, Vec<&String>) = match &spec.cluster_ips {
        Some(list) if !list.is_empty() => ("spec.clusterIPs", list.iter().collect()),
        _ => ("spec.clusterIP", spec.cluster_ip.iter().collect()),
    };
    if texts.iter().any(|t| t.as_str() == "None") {
        return Err(f.ignored("headless (clusterIP None)"));
    }
    if texts.iter().all(|t| t.is_empty()) {
        return Err(f.ignored("no cluster IP allocated"));
    }
    let mut ips: Vec<IpAddr> = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        let path = if field == "spec.clusterIPs" {
            format!("{field}[{i}]")
        } else {
            field.to_owned()
        };
        let ip = f.usable_ip(path.clone(), text)?;
        if ips.iter().any(|other| other.is_ipv4() == ip.is_ipv4()) {
            return Err(f.invalid(path, "two cluster IPs of one family"));
        }
        ips.push(ip);
    }
    Ok(ips)
}

fn load_balancer_ips_of(
    f: &Fields<'_>,
    svc: &Service,
) -> Result<Vec<(IpAddr, LoadBalancerIpMode)>, ObjectError> {
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    let mut out = Vec::new();
    for (i, ing) in ingress.into_iter().flatten().enumerate() {
        let Some(ip) = ing.ip.as_deref().filter(|ip| !ip.is_empty()) else {
            continue; // hostname-only ingress: nothing for the node to capture
        };
        let ip = f.usable_ip(format!("status.loadBalancer.ingress[{i}].ip"), ip)?;
        let mode = match ing.ip_mode.as_deref() {
            None | Some("VIP") => LoadBalancerIpMode::VIP,
            Some("Proxy") => LoadBalancerIpMode::Proxy,
            Some(other) => {
                return Err(f.invalid(
                    format!("status.loadBalancer.ingress[{i}].ipMode"),
                    format!("unknown ipMode {other:?}"),
                ));
            }
        };
        out.push((ip, mode));
    }
    Ok(out)
}

fn affinity_timeout(
    f: &Fields<'_>,
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
) -> Result<Option<u32>, ObjectError> {
    match spec.session_affinity.as_deref() {
        None | Some("None") => Ok(None),
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            match timeout {
                None => Ok(Some(DEFAULT_AFFINITY_TIMEOUT)),
                Some(t) => match u32::try_from(t) {
                    Ok(t) if (1..=86_400).contains(&t) => Ok(Some(t)),
                    _ => Err(f.invalid(
                        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                        format!("{t} is not between 1 and 86400"),
                    )),
                },
            }
        }
        Some(other) => Err(f.invalid(
            "spec.sessionAffinity",
            format!("unknown session affinity {other:?}"),
        )),
    }
}

impl SliceModel {
    /// Validates an EndpointSlice.
    ///
    /// # Errors
    /// [`ObjectError::Ignored`] for slices the proxy does not read (FQDN, no Service
    /// label, headless), [`ObjectError::Invalid`] naming the first malformed field.
    pub fn from_slice(slice: &EndpointSlice) -> Result<Self, ObjectError> {
        let own = namespaced(&slice.metadata);
        let object = own.to_string();
        let f = Fields {
            kind: "EndpointSlice",
            object: &object,
        };
        if own.name.is_empty() {
            return Err(f.invalid("metadata.name", "missing"));
        }
        if has_label(&slice.metadata, HEADLESS_LABEL) {
            return Err(f.ignored(format!("labelled {HEADLESS_LABEL}")));
        }
        let Some(service) = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            .filter(|s| !s.is_empty())
        else {
            return Err(f.ignored(format!("no {SERVICE_NAME_LABEL} label")));
        };
        let family = match slice.address_type.as_str() {
            "IPv4" => IpFamily::IPv4,
            "IPv6" => IpFamily::IPv6,
            "FQDN" => return Err(f.ignored("addressType FQDN")),
            other => return Err(f.invalid("addressType", format!("unknown type {other:?}"))),
        };
        let mut ports = Vec::new();
        for (i, p) in slice.ports.iter().flatten().enumerate() {
            let Some(number) = p.port.filter(|n| *n != 0) else {
                continue; // kube-proxy ignores ports without a number
            };
            ports.push((
                p.name.clone().unwrap_or_default(),
                f.protocol(format!("ports[{i}].protocol"), p.protocol.as_deref())?,
                f.port(format!("ports[{i}].port"), number)?,
            ));
        }
        let mut endpoints = Vec::with_capacity(slice.endpoints.len());
        for (i, ep) in slice.endpoints.iter().enumerate() {
            let Some(first) = ep.addresses.first() else {
                continue;
            };
            let ip = f.usable_ip(format!("endpoints[{i}].addresses[0]"), first)?;
            if family_of(ip) != family {
                return Err(f.invalid(
                    format!("endpoints[{i}].addresses[0]"),
                    format!("{ip} is not an {family} address"),
                ));
            }
            let cond = ep.conditions.as_ref();
            let hints = ep.hints.as_ref();
            endpoints.push(EndpointModel {
                ip,
                node: ep.node_name.clone().filter(|n| !n.is_empty()),
                ready: cond.and_then(|c| c.ready).unwrap_or(true),
                serving: cond.and_then(|c| c.serving).unwrap_or(true),
                terminating: cond.and_then(|c| c.terminating).unwrap_or(false),
                zone_hints: hints
                    .and_then(|h| h.for_zones.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|z| z.name.clone())
                    .collect(),
                node_hints: hints
                    .and_then(|h| h.for_nodes.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|n| n.name.clone())
                    .collect(),
            });
        }
        // kube-proxy reads an unparsable time as none.
        let trigger = slice
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SLICE_TRIGGER_ANNOTATION))
            .and_then(|t| t.parse::<Timestamp>().ok());
        Ok(Self {
            trigger,
            service: ServiceKey {
                namespace: own.namespace,
                name: service.clone(),
            },
            name: own.name,
            family,
            ports,
            endpoints,
        })
    }
}

impl NodeModel {
    /// Reads a Node.
    ///
    /// # Errors
    /// [`ObjectError::Invalid`] when the name is missing or a pod CIDR is malformed.
    pub fn from_node(node: &Node) -> Result<Self, ObjectError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let f = Fields {
            kind: "Node",
            object: &name,
        };
        if name.is_empty() {
            return Err(f.invalid("metadata.name", "missing"));
        }
        let spec = node.spec.as_ref();
        let mut pod_cidrs: Vec<String> = spec
            .and_then(|s| s.pod_cidrs.clone())
            .filter(|c| !c.is_empty())
            .or_else(|| spec.and_then(|s| s.pod_cidr.clone()).map(|c| vec![c]))
            .unwrap_or_default();
        for (i, cidr) in pod_cidrs.iter_mut().enumerate() {
            let (ip, len) =
                parse_cidr(cidr).map_err(|r| f.invalid(format!("spec.podCIDRs[{i}]"), r))?;
            *cidr = format!("{ip}/{len}");
        }
        // InternalIPs first, each type in the Node's order: an agent with
        // `--nodeport-addresses primary` takes the first address of each family.
        let mut typed: Vec<_> = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
            .filter_map(|a| Some((a.type_ == "ExternalIP", a.address.parse().ok()?)))
            .collect();
        typed.sort_by_key(|(external, _)| *external);
        let addresses = typed.into_iter().map(|(_, ip)| ip).collect();
        let ineligible = if node.metadata.deletion_timestamp.is_some() {
            Some("the Node is being deleted (metadata.deletionTimestamp is set)".to_owned())
        } else if spec
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT))
        {
            Some(format!(
                "the Node has the {TO_BE_DELETED_TAINT} taint (the cluster autoscaler is removing it)"
            ))
        } else {
            None
        };
        Ok(Self {
            ineligible,
            uid: node.metadata.uid.clone(),
            zone: node
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(ZONE_LABEL))
                .filter(|z| !z.is_empty())
                .cloned(),
            name,
            pod_cidrs,
            addresses,
        })
    }
}
