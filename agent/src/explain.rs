//! `proxyplan-agent explain`: what this node does with the first packet of one flow, and
//! why, read from the node's merged plan; and whether the kernel agrees.
//!
//! The plan side follows kube-proxy's semantics, entry by entry, the way every mode
//! renders them:
//!
//! - **which Service port** the destination matches: a cluster IP, an external IP, a
//!   load-balancer IP (ipMode `VIP`; `Proxy` ones are never captured), or a node port on
//!   one of the node's addresses;
//! - **which endpoints** it can reach, each with its probability, from which list
//!   (cluster, this node's zone, local), whether Local policy short-circuits pod and host
//!   traffic to the cluster endpoints (not in ipvs mode, as in kube-proxy's), and session
//!   affinity;
//! - **masquerade**, and why (masquerade-all, an off-cluster source to a cluster IP,
//!   Cluster policy on external traffic, host traffic to a Local Service's external
//!   address, hairpin);
//! - or **drop / reject**, and why: no endpoint anywhere, Local policy with no endpoint
//!   on this node, a source outside `loadBalancerSourceRanges`, an unknown port of a
//!   cluster IP, an unallocated address of the Service CIDRs.
//!
//! The kernel side ([`KernelView`]) is filled by the caller: the mode found on the node,
//! whether a sync of this plan would change anything (a dry run against the live
//! kernel: the tamper check's own comparison), and the live kernel's trace of the same
//! packet: nftables mode's live table, iptables mode's live rules, ipvs mode's live
//! rules with its live ipsets and IPVS.

use std::fmt::Write as _;
use std::net::IpAddr;

use proxyplan_crds::{
    Endpoint, LoadBalancerIpMode, LocalTrafficMode, MergedPlan, Protocol, ServicePortPlan,
    TrafficPlan, TrafficPolicy,
};
use serde::Serialize;

use crate::modes::nftables::rules::Net;

/// The first packet of a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Flow {
    /// Source address.
    pub source: IpAddr,
    /// Destination address.
    pub destination: IpAddr,
    /// Destination port.
    pub port: u16,
    /// Transport protocol.
    pub protocol: Protocol,
    /// Sent by a process on the node itself (host network).
    pub from_host: bool,
    /// The interface it arrives on, for interface-based local-traffic detection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
}

/// How the destination matched a Service port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum MatchedAs {
    /// The Service's cluster IP.
    ClusterIp,
    /// One of `spec.externalIPs`.
    ExternalIp,
    /// A load-balancer ingress IP (ipMode `VIP`).
    LoadBalancerIp,
    /// The node port, on one of the node's addresses.
    NodePort,
}

impl MatchedAs {
    fn describe(&self) -> &'static str {
        match self {
            Self::ClusterIp => "its cluster IP",
            Self::ExternalIp => "one of its external IPs",
            Self::LoadBalancerIp => "its load-balancer IP (ipMode VIP)",
            Self::NodePort => "its node port on one of this node's addresses",
        }
    }
}

/// The Service port a flow matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMatch {
    /// The entry's key (`namespace/name:port/PROTO/family`).
    pub key: String,
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// The port's name.
    pub port_name: String,
    /// How the destination matched.
    pub matched_as: MatchedAs,
    /// Internal (cluster IP) or external traffic policy that applies.
    pub policy: String,
}

/// One endpoint the packet can reach.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reach {
    /// `ip:port` (`[ip]:port` for IPv6).
    pub endpoint: String,
    /// Chance of a new connection without affinity going here.
    pub probability: f64,
    /// Whether the packet leaves masqueraded on this path.
    pub masquerade: bool,
}

/// What happens to the packet, by the plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "action")]
pub enum Verdict {
    /// Translated to one of these endpoints.
    Dnat {
        /// Which endpoint list serves it, and why.
        list: String,
        /// The endpoints, with probabilities.
        endpoints: Vec<Reach>,
        /// ClientIP affinity: a client that reached an endpoint within this many seconds
        /// goes to it again.
        #[serde(skip_serializing_if = "Option::is_none")]
        affinity_seconds: Option<u32>,
    },
    /// Rejected (ICMP unreachable or TCP reset).
    Reject {
        /// Why.
        reason: String,
    },
    /// Dropped silently.
    Drop {
        /// Why.
        reason: String,
    },
    /// Not touched by the proxy: routed as it is.
    NotProxied {
        /// Why.
        reason: String,
    },
}

/// The kernel's side, as the caller read it.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelView {
    /// The mode whose rules the node holds (`nftables`, `iptables`, `ipvs`), if any.
    pub mode: Option<String>,
    /// Whether the kernel holds exactly what this plan programs (a dry-run sync would
    /// change nothing).
    pub agrees: bool,
    /// What a sync of this plan would change, as the mode's own commands (the first
    /// [`MAX_DIFFERENCES`] lines).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub differences: Vec<String>,
    /// How many changes a sync would make in all.
    pub changes: usize,
    /// The live kernel's verdict for this packet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traced: Option<Traced>,
    /// Why the kernel could not be read, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why the live kernel could not be traced, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_error: Option<String>,
}

/// Differences listed at most.
pub const MAX_DIFFERENCES: usize = 40;

/// The live kernel's verdict for the packet (iptables mode's tracer over
/// `iptables-save`; ipvs mode's over the same with the live ipsets and IPVS, see
/// [`crate::modes::ipvs::trace`]; nftables mode's over the live table, see
/// [`crate::modes::nftables::trace`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Traced {
    /// `accept`, `reject` or `drop`.
    pub verdict: String,
    /// Endpoints the live rules translate to.
    pub endpoints: Vec<String>,
    /// Whether any accepted path is masqueraded.
    pub masquerade: bool,
    /// Whether this matches the plan's verdict.
    pub agrees_with_plan: bool,
    /// The rules one path matched, in order (the first path).
    pub rules: Vec<String>,
}

/// Everything `explain` says about one flow.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// The flow.
    pub flow: Flow,
    /// The node.
    pub node: String,
    /// The node plan's revision the answer comes from.
    pub plan_revision: String,
    /// The Service port matched, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceMatch>,
    /// What the plan does with the packet.
    pub verdict: Verdict,
    /// Why the packet is (or is not) masqueraded.
    pub masquerade_reasons: Vec<String>,
    /// Notes (assumptions, what could not be decided).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The kernel's side.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelView>,
}

/// Whether `ip` is inside `cidr`; false for malformed input.
fn cidr_contains(cidr: &str, ip: IpAddr) -> bool {
    Net::parse(cidr).is_some_and(|net| net.contains(ip))
}

fn same_ip(text: &str, ip: IpAddr) -> bool {
    text.parse::<IpAddr>().is_ok_and(|a| a == ip)
}

/// `ip:port`, IPv6 in brackets.
#[must_use]
pub fn endpoint_text(endpoint: &Endpoint) -> String {
    match endpoint.ip.parse::<IpAddr>() {
        Ok(IpAddr::V6(a)) => format!("[{a}]:{}", endpoint.port),
        _ => format!("{}:{}", endpoint.ip, endpoint.port),
    }
}

/// Whether the flow counts as in-cluster (pod) traffic by the node's local-traffic
/// detection, and a note when that cannot be told.
fn in_cluster(plan: &MergedPlan, flow: &Flow, notes: &mut Vec<String>) -> bool {
    if flow.from_host {
        return false;
    }
    let detection = &plan.local_traffic;
    match detection.mode {
        LocalTrafficMode::ClusterCIDR | LocalTrafficMode::NodeCIDR => detection
            .cidrs
            .iter()
            .any(|c| cidr_contains(c, flow.source)),
        LocalTrafficMode::BridgeInterface | LocalTrafficMode::InterfaceNamePrefix => {
            let wanted = detection.interface.as_deref().unwrap_or_default();
            match &flow.interface {
                Some(name) if detection.mode == LocalTrafficMode::BridgeInterface => name == wanted,
                Some(name) => name.starts_with(wanted),
                None => {
                    notes.push(format!(
                        "local traffic is told by interface ({wanted}); no --interface was \
                         given, so the packet is taken as arriving from off the cluster"
                    ));
                    false
                }
            }
        }
    }
}

/// Explains `flow` by `plan`. `mode` (`nftables`, `iptables`, `ipvs`) decides what the
/// modes do differently: unknown ports of a cluster IP and unallocated Service CIDR
/// addresses (nftables rejects or drops them, the others let them pass), node ports on
/// loopback (iptables only).
#[must_use]
pub fn explain(plan: &MergedPlan, flow: &Flow, mode: &str) -> Explanation {
    let mut notes = Vec::new();
    let mut masquerade_reasons = Vec::new();
    let family_entries: Vec<&ServicePortPlan> = plan
        .service_ports
        .iter()
        .map(AsRef::as_ref)
        .filter(|e| {
            e.cluster_ip
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.is_ipv4() == flow.destination.is_ipv4())
        })
        .collect();
    let node_address = plan.addresses.contains(&flow.destination)
        || (flow.destination.is_loopback() && mode == "iptables");
    if flow.destination.is_loopback() && mode != "iptables" {
        notes.push(format!(
            "node ports do not answer on loopback in {mode} mode (only iptables mode \
             allows them, with route_localnet)"
        ));
    }
    let mut proxy_mode_lb = None;
    let mut matched = None;
    for e in family_entries
        .iter()
        .filter(|e| e.protocol == flow.protocol)
    {
        let at_port = e.port == flow.port;
        let how = if at_port && same_ip(&e.cluster_ip, flow.destination) {
            Some(MatchedAs::ClusterIp)
        } else if at_port
            && e.external_ips
                .iter()
                .any(|ip| same_ip(ip, flow.destination))
        {
            Some(MatchedAs::ExternalIp)
        } else if at_port
            && e.load_balancer_ips
                .iter()
                .any(|lb| lb.mode == LoadBalancerIpMode::VIP && same_ip(&lb.ip, flow.destination))
        {
            Some(MatchedAs::LoadBalancerIp)
        } else if e.node_port == Some(flow.port) && node_address {
            Some(MatchedAs::NodePort)
        } else {
            if at_port
                && e.load_balancer_ips.iter().any(|lb| {
                    lb.mode == LoadBalancerIpMode::Proxy && same_ip(&lb.ip, flow.destination)
                })
            {
                proxy_mode_lb = Some(format!("{}/{}", e.namespace, e.name));
            }
            None
        };
        if let Some(how) = how {
            matched = Some((*e, how));
            break;
        }
    }
    let Some((entry, how)) = matched else {
        let verdict = unmatched(plan, &family_entries, flow, mode, proxy_mode_lb);
        return Explanation {
            flow: flow.clone(),
            node: plan.node_name.clone(),
            plan_revision: plan.revision.clone(),
            service: None,
            verdict,
            masquerade_reasons,
            notes,
            kernel: None,
        };
    };
    let internal = how == MatchedAs::ClusterIp;
    let traffic: TrafficPlan = if internal {
        entry.internal
    } else {
        entry.external.unwrap_or(entry.internal)
    };
    let service = ServiceMatch {
        key: entry.key.clone(),
        namespace: entry.namespace.to_string(),
        name: entry.name.to_string(),
        port_name: entry.port_name.to_string(),
        matched_as: how.clone(),
        policy: format!(
            "{} traffic policy {}",
            if internal { "internal" } else { "external" },
            policy_name(traffic.policy)
        ),
    };
    let pod = in_cluster(plan, flow, &mut notes);

    // Source ranges guard load-balancer IPs only.
    if how == MatchedAs::LoadBalancerIp && !entry.load_balancer_source_ranges.is_empty() {
        let ranges = &entry.load_balancer_source_ranges;
        let allowed = ranges.iter().any(|r| cidr_contains(r, flow.source));
        let from_node_to_itself = flow.source == flow.destination
            && ranges
                .iter()
                .any(|r| plan.addresses.iter().any(|a| cidr_contains(r, *a)));
        if !allowed && !from_node_to_itself {
            return Explanation {
                flow: flow.clone(),
                node: plan.node_name.clone(),
                plan_revision: plan.revision.clone(),
                service: Some(service),
                verdict: Verdict::Drop {
                    reason: format!(
                        "the source {} is in none of loadBalancerSourceRanges {}",
                        flow.source,
                        ranges.join(", ")
                    ),
                },
                masquerade_reasons,
                notes,
                kernel: None,
            };
        }
    }

    // ipvs mode has no short circuit (as kube-proxy's): the virtual servers of external
    // addresses hold the Local policy's endpoints whoever sends.
    let ipvs = mode == "ipvs";
    let short_circuit = !ipvs
        && !internal
        && traffic.policy == TrafficPolicy::Local
        && !entry.cluster_endpoints.is_empty()
        && (pod || flow.from_host);
    let (endpoints, list): (&[Endpoint], String) = if short_circuit {
        (
            &entry.cluster_endpoints,
            format!(
                "cluster endpoints: external traffic policy Local, but traffic from {} to an \
                 external address is short-circuited to every ready endpoint, as if it had \
                 gone out and come back",
                if flow.from_host {
                    "the node itself"
                } else {
                    "a pod"
                }
            ),
        )
    } else {
        match traffic.policy {
            TrafficPolicy::Cluster => (
                &entry.cluster_endpoints,
                if entry.zone_endpoints.is_empty() {
                    "cluster endpoints (every ready endpoint, or serving terminating ones \
                     when none is ready)"
                        .to_owned()
                } else {
                    "cluster endpoints as topology hints give them to this node's zone".to_owned()
                },
            ),
            TrafficPolicy::Local => (
                &entry.local_endpoints,
                if entry.local_terminating {
                    "this node's endpoints (Local policy); none is ready, so serving \
                     terminating ones take the traffic"
                        .to_owned()
                } else {
                    "this node's endpoints (Local policy)".to_owned()
                },
            ),
        }
    };

    // Masquerade reasons that hold on every path.
    let m = &entry.masquerade;
    if m.all {
        masquerade_reasons.push("masquerade-all is set".to_owned());
    }
    if internal && m.off_cluster_to_cluster_ip && !pod {
        masquerade_reasons.push(if flow.from_host {
            "the node itself is off the pod network (outside local-traffic detection) and goes \
             to a cluster IP"
                .to_owned()
        } else {
            format!(
                "the source {} is off the cluster (outside local-traffic detection) and goes \
                 to a cluster IP",
                flow.source
            )
        });
    }
    if !internal && m.external && !short_circuit {
        masquerade_reasons.push(
            "external traffic with Cluster policy may leave the node: masqueraded so that \
             replies come back through it"
                .to_owned(),
        );
    }
    if (short_circuit || ipvs) && !internal && flow.from_host && m.local_host_to_external {
        masquerade_reasons.push(
            "the node itself sends to an external address of a Local-policy Service".to_owned(),
        );
    }
    let always = !masquerade_reasons.is_empty();

    let verdict = if endpoints.is_empty() {
        let reason = match traffic.policy {
            TrafficPolicy::Local if !entry.cluster_endpoints.is_empty() => format!(
                "Local policy and no endpoint on this node ({} elsewhere)",
                entry.cluster_endpoints.len()
            ),
            _ => "the Service has no usable endpoint (none ready, none serving)".to_owned(),
        };
        match traffic.when_empty {
            proxyplan_crds::EmptyAction::Drop if ipvs && flow.from_host => Verdict::Reject {
                reason: format!(
                    "{reason}; in ipvs mode the node's own connection meets the virtual \
                     server before any filter, and IPVS, with no real server, answers port \
                     unreachable"
                ),
            },
            proxyplan_crds::EmptyAction::Reject => Verdict::Reject { reason },
            proxyplan_crds::EmptyAction::Drop => Verdict::Drop { reason },
        }
    } else {
        #[allow(clippy::cast_precision_loss)] // endpoint counts are far below 2^52
        let probability = 1.0 / endpoints.len() as f64;
        let hairpin_possible = endpoints.iter().any(|e| same_ip(&e.ip, flow.source));
        if hairpin_possible && m.hairpin {
            masquerade_reasons.push(format!(
                "hairpin: the source {} is one of the endpoints; reaching itself it is \
                 masqueraded so the reply comes back through the node",
                flow.source
            ));
        }
        Verdict::Dnat {
            list,
            endpoints: endpoints
                .iter()
                .map(|e| Reach {
                    endpoint: endpoint_text(e),
                    probability,
                    masquerade: always || (m.hairpin && same_ip(&e.ip, flow.source)),
                })
                .collect(),
            affinity_seconds: entry.session_affinity.map(|a| a.timeout_seconds),
        }
    };
    Explanation {
        flow: flow.clone(),
        node: plan.node_name.clone(),
        plan_revision: plan.revision.clone(),
        service: Some(service),
        verdict,
        masquerade_reasons,
        notes,
        kernel: None,
    }
}

fn policy_name(policy: TrafficPolicy) -> &'static str {
    match policy {
        TrafficPolicy::Cluster => "Cluster",
        TrafficPolicy::Local => "Local",
    }
}

/// The verdict for a destination no Service port matched.
fn unmatched(
    plan: &MergedPlan,
    entries: &[&ServicePortPlan],
    flow: &Flow,
    mode: &str,
    proxy_mode_lb: Option<String>,
) -> Verdict {
    if let Some(service) = proxy_mode_lb {
        return Verdict::NotProxied {
            reason: format!(
                "{} is a load-balancer IP of {service} with ipMode Proxy: the load balancer \
                 delivers to node ports, so the node does not capture this address",
                flow.destination
            ),
        };
    }
    let owner = entries
        .iter()
        .find(|e| same_ip(&e.cluster_ip, flow.destination))
        .map(|e| format!("{}/{}", e.namespace, e.name));
    if let Some(owner) = owner {
        let ports: Vec<String> = entries
            .iter()
            .filter(|e| same_ip(&e.cluster_ip, flow.destination))
            .map(|e| format!("{}/{}", e.port, e.protocol))
            .collect();
        let what = format!(
            "{} is the cluster IP of {owner}, which has no port {}/{} (it has {})",
            flow.destination,
            flow.port,
            flow.protocol,
            ports.join(", ")
        );
        return match mode {
            "nftables" => Verdict::Reject { reason: what },
            "ipvs" => Verdict::Reject {
                reason: format!(
                    "{what}; in ipvs mode the cluster IP is an address of this node (on its \
                     dummy interface) and nothing listens on that port"
                ),
            },
            _ => Verdict::NotProxied {
                reason: format!("{what}; {mode} mode lets it pass untranslated"),
            },
        };
    }
    if let Some(cidr) = plan
        .service_cidrs
        .iter()
        .find(|c| cidr_contains(c, flow.destination))
    {
        let what = format!(
            "{} is in the Service CIDR {cidr} but no Service has it",
            flow.destination
        );
        return if mode == "nftables" {
            Verdict::Drop { reason: what }
        } else {
            Verdict::NotProxied {
                reason: format!("{what}; {mode} mode lets it pass untranslated"),
            }
        };
    }
    Verdict::NotProxied {
        reason: format!(
            "no Service has {} {}/{} (not a cluster, external or load-balancer IP, nor a \
             node port on this node's addresses {})",
            flow.destination,
            flow.port,
            flow.protocol,
            plan.addresses
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The explanation for people.
#[must_use]
pub fn human(x: &Explanation) -> String {
    let mut out = String::new();
    let f = &x.flow;
    let _ = writeln!(
        out,
        "flow: {} -> {}:{}/{}{}{} on node {} (plan revision {})",
        f.source,
        f.destination,
        f.port,
        f.protocol,
        if f.from_host {
            ", from the node itself"
        } else {
            ""
        },
        f.interface
            .as_deref()
            .map(|i| format!(", in on {i}"))
            .unwrap_or_default(),
        x.node,
        x.plan_revision
    );
    if let Some(s) = &x.service {
        let port = if s.port_name.is_empty() {
            String::new()
        } else {
            format!(" port {}", s.port_name)
        };
        let _ = writeln!(
            out,
            "service: {}/{}{port}, matched by {} ({})",
            s.namespace,
            s.name,
            s.matched_as.describe(),
            s.policy
        );
    }
    match &x.verdict {
        Verdict::Dnat {
            list,
            endpoints,
            affinity_seconds,
        } => {
            let _ = writeln!(out, "verdict: DNAT to one of {} endpoints", endpoints.len());
            let _ = writeln!(out, "  from: {list}");
            for e in endpoints {
                let _ = writeln!(
                    out,
                    "  {:<24} {:>5.1} %{}",
                    e.endpoint,
                    e.probability * 100.0,
                    if e.masquerade { "  masqueraded" } else { "" }
                );
            }
            if let Some(seconds) = affinity_seconds {
                let _ = writeln!(
                    out,
                    "  session affinity ClientIP: a client that reached an endpoint in the last \
                     {seconds} s goes to the same one"
                );
            }
        }
        Verdict::Reject { reason } => {
            let _ = writeln!(out, "verdict: REJECT: {reason}");
        }
        Verdict::Drop { reason } => {
            let _ = writeln!(out, "verdict: DROP: {reason}");
        }
        Verdict::NotProxied { reason } => {
            let _ = writeln!(out, "verdict: not proxied: {reason}");
        }
    }
    if matches!(x.verdict, Verdict::Dnat { .. }) {
        if x.masquerade_reasons.is_empty() {
            let _ = writeln!(out, "masquerade: no (the source address is kept)");
        } else {
            for reason in &x.masquerade_reasons {
                let _ = writeln!(out, "masquerade: {reason}");
            }
        }
    }
    for note in &x.notes {
        let _ = writeln!(out, "note: {note}");
    }
    if let Some(k) = &x.kernel {
        match (&k.mode, &k.error) {
            (_, Some(error)) => {
                let _ = writeln!(out, "kernel: could not be read: {error}");
            }
            (None, None) => {
                let _ = writeln!(
                    out,
                    "kernel: holds no proxyplan rules in any mode: nothing is proxied here"
                );
            }
            (Some(mode), None) if k.agrees => {
                let _ = writeln!(
                    out,
                    "kernel ({mode} mode): agrees: it holds exactly what this plan programs"
                );
            }
            (Some(mode), None) => {
                let _ = writeln!(
                    out,
                    "kernel ({mode} mode): DIFFERS from the plan: a sync would make {} \
                     change(s):",
                    k.changes
                );
                for line in &k.differences {
                    let _ = writeln!(out, "  {line}");
                }
            }
        }
        if let Some(error) = &k.trace_error {
            let _ = writeln!(out, "kernel trace: could not trace the live rules: {error}");
        }
        if let Some(t) = &k.traced {
            let _ = writeln!(
                out,
                "kernel trace: {} to [{}], masquerade {}{}",
                t.verdict,
                t.endpoints.join(", "),
                t.masquerade,
                if t.agrees_with_plan {
                    " (as planned)"
                } else {
                    " (NOT as planned)"
                }
            );
            for rule in &t.rules {
                let _ = writeln!(out, "  {rule}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
