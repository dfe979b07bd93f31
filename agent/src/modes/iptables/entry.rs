//! The rules of one service port entry: its service, endpoint, external and firewall
//! chains, and what it adds to the fixed chains.

use std::net::IpAddr;

use proxyplan_crds::{
    EmptyAction, Endpoint, LoadBalancerIpMode, Protocol, ServicePortPlan, TrafficPlan,
    TrafficPolicy,
};

use super::builder::Builder;
use crate::ruleset::{LocalMatch, names};

/// The rules of one service port entry.
pub(super) struct EntryRules<'e> {
    pub(super) entry: &'e ServicePortPlan,
    pub(super) local: Option<&'e LocalMatch>,
    pub(super) node_addresses: &'e [IpAddr],
}

fn proto(p: Protocol) -> &'static str {
    match p {
        Protocol::TCP => "tcp",
        Protocol::UDP => "udp",
        Protocol::SCTP => "sctp",
    }
}

fn host(ip: &str) -> String {
    if ip.contains(':') {
        format!("{ip}/128")
    } else {
        format!("{ip}/32")
    }
}

fn dnat_target(ep: &Endpoint) -> String {
    if ep.ip.contains(':') {
        format!("[{}]:{}", ep.ip, ep.port)
    } else {
        format!("{}:{}", ep.ip, ep.port)
    }
}

fn when_empty(action: EmptyAction) -> &'static str {
    match action {
        EmptyAction::Reject => "REJECT",
        EmptyAction::Drop => "DROP",
    }
}

impl EntryRules<'_> {
    fn key(&self) -> &str {
        &self.entry.key
    }

    /// `-p tcp -m tcp --dport N`.
    fn port_match(&self, port: u16) -> String {
        let p = proto(self.entry.protocol);
        format!("-p {p} -m {p} --dport {port}")
    }

    fn comment(&self, what: &str) -> String {
        format!("-m comment --comment \"{} {what}\"", self.key())
    }

    fn chain_for(&self, traffic: &TrafficPlan) -> String {
        match traffic.policy {
            TrafficPolicy::Cluster => names::service(self.key()),
            TrafficPolicy::Local => names::service_local(self.key()),
        }
    }

    /// Whether the Service has a usable endpoint anywhere (so traffic this node cannot
    /// serve is dropped, not rejected, and short-circuited traffic still has a target).
    fn has_any_endpoint(&self) -> bool {
        let e = self.entry;
        !e.cluster_endpoints.is_empty()
            || e.internal.when_empty == EmptyAction::Drop
            || e.external
                .is_some_and(|x| x.when_empty == EmptyAction::Drop)
    }

    pub(super) fn write(&self, out: &mut Builder<'_>) {
        self.internal(out);
        if let Some(external) = self.entry.external {
            self.external(out, &external);
        }
        if let Some(port) = self.entry.health_check_node_port {
            // As kube-proxy: accepted whether or not there are local endpoints, for
            // nodes whose INPUT policy drops what no rule accepts.
            out.filter(
                names::HEALTH_CHECKS,
                format!(
                    "{} -m tcp -p tcp --dport {port} -j ACCEPT",
                    self.comment("health check node port")
                ),
            );
        }
    }

    fn internal(&self, out: &mut Builder<'_>) {
        let e = self.entry;
        let capture = format!(
            "{} -d {} {}",
            self.comment("cluster IP"),
            host(&e.cluster_ip),
            self.port_match(e.port)
        );
        let endpoints = e.endpoints_for(&e.internal);
        if endpoints.is_empty() {
            out.filter(
                names::SERVICES,
                format!("{capture} -j {}", when_empty(e.internal.when_empty)),
            );
            return;
        }
        let chain = self.chain_for(&e.internal);
        if out.own {
            self.internal_chain(out, &chain, endpoints);
        }
        out.nat(names::SERVICES, format!("{capture} -j {chain}"));
    }

    /// PP-SVC/PP-SVL for the cluster IP: masquerade marking, then balancing.
    fn internal_chain(&self, out: &mut Builder<'_>, chain: &str, endpoints: &[Endpoint]) {
        let e = self.entry;
        let vip = format!("-d {} {}", host(&e.cluster_ip), self.port_match(e.port));
        if e.masquerade.all {
            out.nat(
                chain,
                format!(
                    "{} {vip} -j {}",
                    self.comment("cluster IP"),
                    names::MARK_MASQ
                ),
            );
        } else if e.masquerade.off_cluster_to_cluster_ip
            && let Some(local) = self.local
        {
            out.nat(
                chain,
                format!(
                    "{} {} {vip} -j {}",
                    self.comment("cluster IP"),
                    local.not_local(),
                    names::MARK_MASQ
                ),
            );
        }
        self.balance(out, chain, endpoints);
    }

    fn external(&self, out: &mut Builder<'_>, external: &TrafficPlan) {
        let e = self.entry;
        let has_any = self.has_any_endpoint();
        let endpoints = e.endpoints_for(external);
        let ext = names::external(self.key());
        let reject = when_empty(external.when_empty);
        if has_any && out.own {
            self.external_chain(out, external, &ext);
        }
        let port = self.port_match(e.port);
        for ip in &e.external_ips {
            let matcher = format!("{} -d {} {port}", self.comment("external IP"), host(ip));
            if has_any {
                out.nat(names::SERVICES, format!("{matcher} -j {ext}"));
            }
            if endpoints.is_empty() {
                out.filter(names::EXTERNAL_SERVICES, format!("{matcher} -j {reject}"));
            }
        }
        let vips: Vec<&str> = e
            .load_balancer_ips
            .iter()
            .filter(|lb| lb.mode == LoadBalancerIpMode::VIP)
            .map(|lb| lb.ip.as_str())
            .collect();
        let ranges = &e.load_balancer_source_ranges;
        let fw = names::firewall(self.key());
        if has_any && out.own && !ranges.is_empty() && !vips.is_empty() {
            self.firewall_chain(out, &fw, &ext, &vips);
        }
        for ip in &vips {
            let matcher = format!("{} -d {} {port}", self.comment("loadbalancer IP"), host(ip));
            if has_any {
                let target = if ranges.is_empty() { &ext } else { &fw };
                out.nat(names::SERVICES, format!("{matcher} -j {target}"));
            }
            if endpoints.is_empty() {
                out.filter(names::EXTERNAL_SERVICES, format!("{matcher} -j {reject}"));
            }
            if !ranges.is_empty() {
                out.filter(
                    names::FIREWALL,
                    format!(
                        "{} -d {} {port} -j DROP",
                        self.comment("traffic not accepted by source ranges"),
                        host(ip)
                    ),
                );
            }
        }
        if let Some(node_port) = e.node_port {
            let matcher = format!(
                "{} {}",
                self.comment("node port"),
                self.port_match(node_port)
            );
            if has_any {
                out.nat(names::NODEPORTS, format!("{matcher} -j {ext}"));
            }
            if endpoints.is_empty() {
                out.filter(
                    names::EXTERNAL_SERVICES,
                    format!("{matcher} -m addrtype --dst-type LOCAL -j {reject}"),
                );
            }
        }
    }

    /// PP-EXT: masquerade and hand external traffic to its policy chain. With Local
    /// policy, traffic from pods and from the node itself is short-circuited to the
    /// Cluster chain (as if it had gone out to the load balancer and back).
    fn external_chain(&self, out: &mut Builder<'_>, external: &TrafficPlan, ext: &str) {
        let e = self.entry;
        let svc = names::service(self.key());
        out.nat_chain(ext);
        if e.masquerade.external {
            out.nat(
                ext,
                format!(
                    "{} -j {}",
                    self.comment("external destinations, masquerade"),
                    names::MARK_MASQ
                ),
            );
        }
        if external.policy == TrafficPolicy::Local && !e.cluster_endpoints.is_empty() {
            if let Some(local) = self.local {
                out.nat(
                    ext,
                    format!(
                        "{} {} -j {svc}",
                        self.comment("pod traffic for external destinations"),
                        local.local()
                    ),
                );
            }
            if e.masquerade.local_host_to_external {
                out.nat(
                    ext,
                    format!(
                        "{} -m addrtype --src-type LOCAL -j {}",
                        self.comment("masquerade LOCAL traffic for external destinations"),
                        names::MARK_MASQ
                    ),
                );
            }
            out.nat(
                ext,
                format!(
                    "{} -m addrtype --src-type LOCAL -j {svc}",
                    self.comment("route LOCAL traffic for external destinations")
                ),
            );
            self.balance(out, &svc, &e.cluster_endpoints);
        }
        let endpoints = e.endpoints_for(external);
        if !endpoints.is_empty() {
            let chain = self.chain_for(external);
            self.balance(out, &chain, endpoints);
            out.nat(ext, format!("-j {chain}"));
        }
    }

    /// PP-FW: only sources in `loadBalancerSourceRanges` go on to PP-EXT; the rest fall
    /// through undestinated and the filter table drops them. When a range covers this
    /// node, traffic the node sends to its own LB VIP (source = the VIP) is allowed too.
    fn firewall_chain(&self, out: &mut Builder<'_>, fw: &str, ext: &str, vips: &[&str]) {
        out.nat_chain(fw);
        let comment = self.comment("loadbalancer IP");
        let mut allow_from_node = false;
        for range in &self.entry.load_balancer_source_ranges {
            out.nat(fw, format!("{comment} -s {range} -j {ext}"));
            allow_from_node |= self.node_addresses.iter().any(|a| cidr_contains(range, *a));
        }
        if allow_from_node {
            for ip in vips {
                out.nat(fw, format!("{comment} -s {} -j {ext}", host(ip)));
            }
        }
    }

    /// Balancing rules into `chain` (appended after anything already there) and one
    /// endpoint chain per endpoint. Idempotent: a chain already balanced is left alone,
    /// which happens when Local and short-circuit paths share PP-SVC.
    fn balance(&self, out: &mut Builder<'_>, chain: &str, endpoints: &[Endpoint]) {
        let Some(first) = endpoints.first() else {
            return;
        };
        let marker = format!("-j {}", names::endpoint(self.key(), first));
        if out
            .nat
            .chains
            .get(chain)
            .is_some_and(|rules| rules.iter().any(|r| r.ends_with(&marker)))
        {
            return;
        }
        out.nat_chain(chain);
        let e = self.entry;
        let seps: Vec<String> = endpoints
            .iter()
            .map(|ep| names::endpoint(self.key(), ep))
            .collect();
        if let Some(affinity) = e.session_affinity {
            for (ep, sep) in endpoints.iter().zip(&seps) {
                out.nat(
                    chain,
                    format!(
                        "{} -m recent --name {sep} --rcheck --seconds {} --reap -j {sep}",
                        self.comment(&format!("-> {}", dnat_target(ep))),
                        affinity.timeout_seconds
                    ),
                );
            }
        }
        let n = endpoints.len();
        for (i, (ep, sep)) in endpoints.iter().zip(&seps).enumerate() {
            let comment = self.comment(&format!("-> {}", dnat_target(ep)));
            let remaining = n - i;
            if remaining > 1 {
                #[allow(
                    clippy::cast_precision_loss,
                    reason = "endpoint counts are far below 2^52"
                )]
                let probability = 1.0 / remaining as f64;
                out.nat(chain, format!("{comment} -m statistic --mode random --probability {probability:.10} -j {sep}"));
            } else {
                out.nat(chain, format!("{comment} -j {sep}"));
            }
        }
        for (ep, sep) in endpoints.iter().zip(&seps) {
            self.endpoint_chain(out, sep, ep);
        }
    }

    fn endpoint_chain(&self, out: &mut Builder<'_>, sep: &str, ep: &Endpoint) {
        if out.nat.chains.contains_key(sep) {
            return;
        }
        let e = self.entry;
        let comment = format!("-m comment --comment \"{}\"", self.key());
        if e.masquerade.hairpin {
            out.nat(
                sep,
                format!("{comment} -s {} -j {}", host(&ep.ip), names::MARK_MASQ),
            );
        }
        let p = proto(e.protocol);
        let recent = if e.session_affinity.is_some() {
            format!(" -m recent --name {sep} --set")
        } else {
            String::new()
        };
        out.nat(
            sep,
            format!(
                "{comment} -p {p}{recent} -j DNAT --to-destination {}",
                dnat_target(ep)
            ),
        );
    }
}

/// Whether `cidr` (already validated by the plan) contains `ip`.
fn cidr_contains(cidr: &str, ip: IpAddr) -> bool {
    let Some((net, len)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(net), Ok(len)) = (net.parse::<IpAddr>(), len.parse::<u32>()) else {
        return false;
    };
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX.checked_shl(32 - len.min(32)).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX.checked_shl(128 - len.min(128)).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}
