//! Endpoint selection: one Service and its slices in, every layer of its plan out.
//!
//! This is kube-proxy's `CategorizeEndpoints` turned inside out. Instead of asking "what
//! does node N use?", it computes the answer for a node with no zone, no node hint and no
//! local endpoint (the Service plan's entry), then only the differences: per hinted zone
//! (the entry's zone lists) and per node with local endpoints or a node hint (node
//! overlay).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use proxyplan_crds::{
    EmptyAction, Endpoint, EndpointOverride, IpFamily, LoadBalancerIp, MAX_EXTERNAL_IPS,
    MAX_LOAD_BALANCER_IPS, MAX_SOURCE_RANGES, MAX_ZONES, MasqueradePlan, Protocol, ServicePortPlan,
    SessionAffinity, ToCompactString, TrafficPlan, TrafficPolicy, ZoneEndpoints,
};

use crate::config::PlannerConfig;
use crate::model::{EndpointModel, PortModel, ServiceModel, SliceModel, family_of};
use crate::split::fit_entry;

/// Everything one Service contributes to the plans.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceOutput {
    /// Full entries for the Service's plan, with their zone lists, sorted by key.
    pub entries: Vec<ServicePortPlan>,
    /// Node overlay overrides, by node name.
    pub node_overrides: BTreeMap<String, Vec<EndpointOverride>>,
    /// The Service's UID, for the owner reference of its plan.
    pub owner: Option<String>,
    /// What had to be left out, for Warning Events on the Service.
    pub warnings: Vec<String>,
}

/// An endpoint of one service port after merging slices: the resolved port number and
/// the endpoint's conditions and hints.
struct Candidate<'a> {
    endpoint: Endpoint,
    model: &'a EndpointModel,
}

/// Computes a Service's contribution. `slices` must be sorted by slice name (so that
/// duplicate resolution is deterministic).
#[must_use]
pub fn plan_service<'a>(
    svc: &ServiceModel,
    slices: impl Iterator<Item = &'a SliceModel> + Clone,
    config: &PlannerConfig,
) -> ServiceOutput {
    let mut out = ServiceOutput {
        owner: svc.uid.clone(),
        ..ServiceOutput::default()
    };
    for &cluster_ip in &svc.cluster_ips {
        let family = family_of(cluster_ip);
        for port in &svc.ports {
            let candidates = merge_endpoints(slices.clone(), family, port);
            plan_port(svc, port, cluster_ip, &candidates, config, &mut out);
        }
    }
    out.entries.sort_by(|a, b| a.key.cmp(&b.key));
    for entry in &mut out.entries {
        cap(
            &mut entry.external_ips,
            MAX_EXTERNAL_IPS,
            "externalIPs",
            &entry.key,
            &mut out.warnings,
        );
        cap(
            &mut entry.load_balancer_ips,
            MAX_LOAD_BALANCER_IPS,
            "load-balancer IPs",
            &entry.key,
            &mut out.warnings,
        );
        cap(
            &mut entry.load_balancer_source_ranges,
            MAX_SOURCE_RANGES,
            "loadBalancerSourceRanges",
            &entry.key,
            &mut out.warnings,
        );
        cap(
            &mut entry.zone_endpoints,
            MAX_ZONES,
            "zone lists",
            &entry.key,
            &mut out.warnings,
        );
        out.warnings.extend(fit_entry(entry));
    }
    for list in out.node_overrides.values_mut() {
        list.sort_by(|a, b| a.key.cmp(&b.key));
    }
    out
}

/// Keeps the first `max` items of `list`, with a warning when that drops any.
fn cap<T>(list: &mut Vec<T>, max: usize, what: &str, key: &str, warnings: &mut Vec<String>) {
    if list.len() > max {
        warnings.push(format!(
            "{key}: {} {what}, more than the {max} a plan holds: the first {max} are programmed",
            list.len()
        ));
        list.truncate(max);
    }
}

/// The entry key: `namespace/name:port/PROTOCOL/family`.
#[must_use]
pub fn entry_key(
    svc: &ServiceModel,
    port_name: &str,
    protocol: Protocol,
    family: IpFamily,
) -> String {
    format!(
        "{}/{}:{port_name}/{protocol}/{family}",
        svc.key.namespace, svc.key.name
    )
}

/// Merges the endpoints of every slice of `family` that carries `port`, resolving the
/// port number per slice and deduplicating by address and port. Of duplicates, a
/// non-terminating endpoint wins (an IP reused by a new pod before the old one is gone).
fn merge_endpoints<'a>(
    slices: impl Iterator<Item = &'a SliceModel>,
    family: IpFamily,
    port: &PortModel,
) -> Vec<Candidate<'a>> {
    let mut by_addr: HashMap<(IpAddr, u16), &'a EndpointModel> = HashMap::new();
    for slice in slices.filter(|s| s.family == family) {
        let Some(&(_, _, number)) = slice
            .ports
            .iter()
            .find(|(name, protocol, _)| *name == port.name && *protocol == port.protocol)
        else {
            continue;
        };
        for ep in &slice.endpoints {
            let slot = by_addr.entry((ep.ip, number));
            match slot {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(ep);
                }
                std::collections::hash_map::Entry::Occupied(mut o) if !ep.terminating => {
                    o.insert(ep);
                }
                std::collections::hash_map::Entry::Occupied(_) => {}
            }
        }
    }
    let mut merged: Vec<((IpAddr, u16), &EndpointModel)> = by_addr.into_iter().collect();
    merged.sort_by_key(|(addr, _)| *addr);
    merged
        .into_iter()
        .map(|((ip, port), model)| Candidate {
            endpoint: Endpoint {
                ip: ip.to_compact_string(),
                port,
            },
            model,
        })
        .collect()
}

fn usable(candidates: &[Candidate<'_>], keep: impl Fn(&EndpointModel) -> bool) -> Vec<Endpoint> {
    candidates
        .iter()
        .filter(|c| keep(c.model))
        .map(|c| c.endpoint.clone())
        .collect()
}

/// Ready endpoints passing `topology`, else every serving-and-terminating endpoint
/// (kube-proxy's fallback ignores topology: no endpoint is ready anywhere by then).
fn cluster_list(
    candidates: &[Candidate<'_>],
    topology: impl Fn(&EndpointModel) -> bool,
) -> Vec<Endpoint> {
    let ready = usable(candidates, |m| m.ready && topology(m));
    if ready.is_empty() {
        usable(candidates, |m| m.serving && m.terminating)
    } else {
        ready
    }
}

fn plan_port(
    svc: &ServiceModel,
    port: &PortModel,
    cluster_ip: IpAddr,
    candidates: &[Candidate<'_>],
    config: &PlannerConfig,
    out: &mut ServiceOutput,
) {
    let family = family_of(cluster_ip);
    let key = entry_key(svc, &port.name, port.protocol, family);
    let same_family = |ip: &IpAddr| family_of(*ip) == family;
    let external_ips: Vec<String> = svc
        .external_ips
        .iter()
        .filter(|ip| same_family(ip))
        .map(ToString::to_string)
        .collect();
    let load_balancer_ips: Vec<LoadBalancerIp> = svc
        .load_balancer_ips
        .iter()
        .filter(|(ip, _)| same_family(ip))
        .map(|(ip, mode)| LoadBalancerIp {
            ip: ip.to_string(),
            mode: *mode,
        })
        .collect();
    let has_vip_lb = load_balancer_ips
        .iter()
        .any(|lb| lb.mode == proxyplan_crds::LoadBalancerIpMode::VIP);
    let externally_accessible = port.node_port.is_some() || !external_ips.is_empty() || has_vip_lb;
    let uses_cluster = !svc.internal_local || externally_accessible;
    let uses_local = svc.internal_local || (svc.external_local && externally_accessible);
    let has_any = candidates
        .iter()
        .any(|c| c.model.ready || (c.model.serving && c.model.terminating));

    let cluster_endpoints = if uses_cluster {
        cluster_list(candidates, |_| true)
    } else {
        Vec::new()
    };
    let when_empty = |local: bool| {
        if local && has_any {
            EmptyAction::Drop
        } else {
            EmptyAction::Reject
        }
    };
    let traffic = |local: bool| TrafficPlan {
        policy: if local {
            TrafficPolicy::Local
        } else {
            TrafficPolicy::Cluster
        },
        when_empty: when_empty(local),
    };
    let external_local = svc.external_local && externally_accessible;
    let detect_local = config.detects_local_traffic(family);
    out.entries.push(ServicePortPlan {
        key: key.clone(),
        namespace: svc.key.namespace.as_str().into(),
        name: svc.key.name.as_str().into(),
        port_name: port.name.as_str().into(),
        family,
        protocol: port.protocol,
        port: port.port,
        cluster_ip: cluster_ip.to_compact_string(),
        external_ips,
        load_balancer_ips,
        node_port: port.node_port,
        load_balancer_source_ranges: svc
            .source_ranges
            .iter()
            .filter(|(ip, _)| same_family(ip))
            .map(|(ip, len)| format!("{ip}/{len}"))
            .collect(),
        health_check_node_port: svc.health_check_node_port,
        session_affinity: svc
            .affinity_timeout
            .map(|timeout_seconds| SessionAffinity { timeout_seconds }),
        internal: traffic(svc.internal_local),
        external: externally_accessible.then(|| traffic(external_local)),
        also_serving: if port.protocol == Protocol::UDP {
            also_serving(candidates, &cluster_endpoints)
        } else {
            Vec::new()
        },
        cluster_endpoints: cluster_endpoints.clone(),
        zone_endpoints: Vec::new(),
        local_endpoints: Vec::new(),
        local_terminating: false,
        masquerade: MasqueradePlan {
            all: config.masquerade_all,
            off_cluster_to_cluster_ip: detect_local,
            external: externally_accessible && !external_local,
            local_host_to_external: external_local,
            hairpin: true,
        },
    });

    if uses_cluster {
        let zones = topology_overrides(&key, candidates, &cluster_endpoints, out);
        if let Some(entry) = out.entries.last_mut() {
            entry.zone_endpoints = zones;
        }
    }
    if uses_local {
        local_overrides(&key, candidates, out);
    }
}

/// The serving endpoints not in `listed`: those whose UDP flows conntrack cleanup keeps
/// although they take no new traffic here.
fn also_serving(candidates: &[Candidate<'_>], listed: &[Endpoint]) -> Vec<Endpoint> {
    let listed: std::collections::HashSet<&Endpoint> = listed.iter().collect();
    candidates
        .iter()
        .filter(|c| c.model.serving && !listed.contains(&c.endpoint))
        .map(|c| c.endpoint.clone())
        .collect()
}

/// Zone lists (returned, sorted by zone) and node overrides of `clusterEndpoints` from
/// topology hints. Hints count only when every ready endpoint carries them (checked
/// separately for node and zone hints).
fn topology_overrides(
    key: &str,
    candidates: &[Candidate<'_>],
    base: &[Endpoint],
    out: &mut ServiceOutput,
) -> Vec<ZoneEndpoints> {
    let mut zone_lists = Vec::new();
    let ready: Vec<&Candidate<'_>> = candidates.iter().filter(|c| c.model.ready).collect();
    if ready.is_empty() {
        return zone_lists;
    }
    if ready.iter().all(|c| !c.model.zone_hints.is_empty()) {
        let zones: std::collections::BTreeSet<&String> = ready
            .iter()
            .flat_map(|c| c.model.zone_hints.iter())
            .collect();
        for zone in zones {
            let list = usable(candidates, |m| m.ready && m.zone_hints.contains(zone));
            if list != base {
                zone_lists.push(ZoneEndpoints {
                    zone: zone.clone(),
                    endpoints: list,
                });
            }
        }
    }
    if ready.iter().all(|c| !c.model.node_hints.is_empty()) {
        let nodes: std::collections::BTreeSet<&String> = ready
            .iter()
            .flat_map(|c| c.model.node_hints.iter())
            .collect();
        for node in nodes {
            // Always emitted, even when equal to the base list: the node's zone may
            // override the base, and a node-hint match takes precedence over its zone.
            let list = usable(candidates, |m| m.ready && m.node_hints.contains(node));
            push_override(
                out.node_overrides.entry(node.clone()).or_default(),
                key,
                Some(list),
                None,
            );
        }
    }
    zone_lists
}

/// Node overrides of `localEndpoints`: each node's ready endpoints, else its
/// serving-and-terminating ones.
fn local_overrides(key: &str, candidates: &[Candidate<'_>], out: &mut ServiceOutput) {
    let mut by_node: BTreeMap<&str, Vec<&Candidate<'_>>> = BTreeMap::new();
    for c in candidates {
        if let Some(node) = c.model.node.as_deref() {
            by_node.entry(node).or_default().push(c);
        }
    }
    for (node, local) in by_node {
        let pick = |keep: &dyn Fn(&EndpointModel) -> bool| -> Vec<Endpoint> {
            local
                .iter()
                .filter(|c| keep(c.model))
                .map(|c| c.endpoint.clone())
                .collect()
        };
        let mut list = pick(&|m| m.ready);
        let terminating = list.is_empty();
        if terminating {
            list = pick(&|m| m.serving && m.terminating);
        }
        if list.is_empty() {
            continue;
        }
        let overrides = out.node_overrides.entry(node.to_owned()).or_default();
        push_override(overrides, key, None, Some(list));
        if let Some(o) = overrides.iter_mut().find(|o| o.key == key) {
            o.local_terminating = terminating;
        }
    }
}

fn push_override(
    list: &mut Vec<EndpointOverride>,
    key: &str,
    cluster: Option<Vec<Endpoint>>,
    local: Option<Vec<Endpoint>>,
) {
    if let Some(existing) = list.iter_mut().find(|o| o.key == key) {
        if cluster.is_some() {
            existing.cluster_endpoints = cluster;
        }
        if local.is_some() {
            existing.local_endpoints = local;
        }
        return;
    }
    list.push(EndpointOverride {
        key: key.to_owned(),
        cluster_endpoints: cluster,
        local_endpoints: local,
        local_terminating: false,
    });
}
