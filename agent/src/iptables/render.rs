//! Merged plan in, desired iptables rules out. Pure: no I/O, no policy.
//!
//! The chain layout follows kube-proxy's iptables mode, so its behaviour carries over:
//!
//! ```text
//! nat PREROUTING/OUTPUT -> PROXYPLAN-SERVICES -> PP-SVC-* (Cluster) | PP-SVL-* (Local)
//!                                            -> PP-EXT-* (external IPs, LB IPs) | PP-FW-* (source ranges)
//!                                            -> PROXYPLAN-NODEPORTS -> PP-EXT-*
//! PP-SVC-*/PP-SVL-* -> PP-SEP-* (one per endpoint, random balancing, `recent` affinity) -> DNAT
//! nat POSTROUTING -> PROXYPLAN-POSTROUTING: masquerade packets carrying the mark
//! filter: REJECT/DROP when there is no endpoint, DROP outside source ranges
//! ```
//!
//! Whether traffic is masqueraded, rejected or dropped is read from the plan
//! (`masquerade`, `whenEmpty`); the renderer only spells it in iptables.

use std::net::IpAddr;

use proxyplan_crds::{
    EmptyAction, Endpoint, IpFamily, LoadBalancerIpMode, MergedPlan, Protocol, ServicePortPlan,
    TrafficPlan, TrafficPolicy,
};

use super::names;
use super::{BaseJump, FamilyRules, Ruleset, TableRules};

/// Node-local inputs of the renderer (agent flags, not plan content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderSettings {
    /// The packet mark bit that asks for masquerade (kube-proxy uses bit 14; the default
    /// here is bit 13 so both can run side by side).
    pub masquerade_bit: u8,
    /// Destinations that accept node ports (CIDRs); empty means every local address.
    pub nodeport_cidrs: Vec<String>,
}

impl Default for RenderSettings {
    fn default() -> Self {
        Self {
            masquerade_bit: 13,
            nodeport_cidrs: Vec::new(),
        }
    }
}

impl RenderSettings {
    fn mark(&self) -> String {
        format!("{:#x}", 1u32 << self.masquerade_bit.min(31))
    }
}

/// Renders the rules of both families.
#[must_use]
pub fn render(plan: &MergedPlan, settings: &RenderSettings) -> Ruleset {
    Ruleset {
        v4: render_family(plan, settings, IpFamily::IPv4),
        v6: render_family(plan, settings, IpFamily::IPv6),
    }
}

/// What one family's rules are rendered from: its entries and the node inputs of that
/// family.
struct FamilyInputs<'p> {
    entries: Vec<&'p ServicePortPlan>,
    local_cidr: Option<String>,
    node_addresses: Vec<IpAddr>,
}

impl<'p> FamilyInputs<'p> {
    fn of(plan: &'p MergedPlan, family: IpFamily) -> Self {
        let v6 = family == IpFamily::IPv6;
        Self {
            entries: plan
                .service_ports
                .iter()
                .filter(|e| e.family == family)
                .collect(),
            local_cidr: plan
                .local_traffic
                .cidrs
                .iter()
                .find(|c| c.contains(':') == v6)
                .cloned(),
            node_addresses: plan
                .addresses
                .iter()
                .copied()
                .filter(|a| a.is_ipv6() == v6)
                .collect(),
        }
    }
}

/// Rules of one family. A family without service ports gets no rules at all, so an
/// IPv4-only node never needs ip6tables.
fn render_family(plan: &MergedPlan, settings: &RenderSettings, family: IpFamily) -> FamilyRules {
    let FamilyInputs {
        entries,
        local_cidr,
        node_addresses,
    } = FamilyInputs::of(plan, family);
    if entries.is_empty() {
        return FamilyRules::default();
    }
    let mut out = Builder::new(settings, family);
    out.fixed_chains();
    for entry in entries {
        EntryRules {
            entry,
            local_cidr: local_cidr.as_deref(),
            node_addresses: &node_addresses,
        }
        .write(&mut out);
    }
    out.nodeport_entry();
    out.finish()
}

/// Accumulates the two tables of one family.
struct Builder<'a> {
    settings: &'a RenderSettings,
    family: IpFamily,
    nat: TableRules,
    filter: TableRules,
}

impl<'a> Builder<'a> {
    fn new(settings: &'a RenderSettings, family: IpFamily) -> Self {
        Self {
            settings,
            family,
            nat: TableRules::default(),
            filter: TableRules::default(),
        }
    }

    fn nat(&mut self, chain: &str, rule: String) {
        self.nat
            .chains
            .entry(chain.to_owned())
            .or_default()
            .push(rule);
    }

    fn filter(&mut self, chain: &str, rule: String) {
        self.filter
            .chains
            .entry(chain.to_owned())
            .or_default()
            .push(rule);
    }

    /// Declares a chain (so it exists even if empty).
    fn nat_chain(&mut self, chain: &str) {
        self.nat.chains.entry(chain.to_owned()).or_default();
    }

    fn fixed_chains(&mut self) {
        let mark = self.settings.mark();
        for chain in [names::SERVICES, names::NODEPORTS, names::CANARY] {
            self.nat_chain(chain);
        }
        self.nat(names::MARK_MASQ, format!("-j MARK --or-mark {mark}"));
        self.nat(
            names::POSTROUTING,
            format!("-m mark ! --mark {mark}/{mark} -j RETURN"),
        );
        self.nat(names::POSTROUTING, format!("-j MARK --xor-mark {mark}"));
        self.nat(
            names::POSTROUTING,
            "-m comment --comment \"proxyplan service traffic requiring SNAT\" -j MASQUERADE --random-fully"
                .to_owned(),
        );
        for chain in [
            names::SERVICES,
            names::EXTERNAL_SERVICES,
            names::FIREWALL,
            names::CANARY,
        ] {
            self.filter.chains.entry(chain.to_owned()).or_default();
        }
        self.filter(
            names::FORWARD,
            format!("-m comment --comment \"proxyplan forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"),
        );
        self.filter(
            names::FORWARD,
            "-m comment --comment \"proxyplan forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
                .to_owned(),
        );
        let portals = format!(
            "-m comment --comment \"proxyplan service portals\" -j {}",
            names::SERVICES
        );
        self.nat.base_jumps = vec![
            BaseJump {
                chain: "PREROUTING",
                rule: portals.clone(),
            },
            BaseJump {
                chain: "OUTPUT",
                rule: portals,
            },
            BaseJump {
                chain: "POSTROUTING",
                rule: format!(
                    "-m comment --comment \"proxyplan postrouting rules\" -j {}",
                    names::POSTROUTING
                ),
            },
        ];
        let new = "-m conntrack --ctstate NEW";
        let jump = |comment: &str, chain: &str| {
            format!("{new} -m comment --comment \"{comment}\" -j {chain}")
        };
        self.filter.base_jumps = vec![
            BaseJump {
                chain: "INPUT",
                rule: jump("proxyplan external services", names::EXTERNAL_SERVICES),
            },
            BaseJump {
                chain: "INPUT",
                rule: jump("proxyplan load balancer firewall", names::FIREWALL),
            },
            BaseJump {
                chain: "FORWARD",
                rule: jump("proxyplan load balancer firewall", names::FIREWALL),
            },
            BaseJump {
                chain: "FORWARD",
                rule: jump("proxyplan service portals", names::SERVICES),
            },
            BaseJump {
                chain: "FORWARD",
                rule: jump("proxyplan external services", names::EXTERNAL_SERVICES),
            },
            BaseJump {
                chain: "FORWARD",
                rule: format!(
                    "-m comment --comment \"proxyplan forwarding rules\" -j {}",
                    names::FORWARD
                ),
            },
            BaseJump {
                chain: "OUTPUT",
                rule: jump("proxyplan service portals", names::SERVICES),
            },
            BaseJump {
                chain: "OUTPUT",
                rule: jump("proxyplan load balancer firewall", names::FIREWALL),
            },
        ];
    }

    /// The last rule of PROXYPLAN-SERVICES: node ports, on the node-port addresses.
    fn nodeport_entry(&mut self) {
        let comment = "-m comment --comment \"proxyplan service nodeports\"";
        let cidrs: Vec<String> = self
            .settings
            .nodeport_cidrs
            .iter()
            .filter(|c| c.contains(':') == (self.family == IpFamily::IPv6))
            .cloned()
            .collect();
        if cidrs.is_empty() {
            // Every local address except loopback: a pod is unreachable from ::1, and
            // DNAT from 127.0.0.0/8 would need route_localnet=1 (CVE-2020-8558), which
            // the agent never sets (kube-proxy's nftables mode makes the same choice).
            let loopback = match self.family {
                IpFamily::IPv4 => "127.0.0.0/8",
                IpFamily::IPv6 => "::1/128",
            };
            self.nat(
                names::SERVICES,
                format!(
                    "{comment} -m addrtype --dst-type LOCAL ! -d {loopback} -j {}",
                    names::NODEPORTS
                ),
            );
        }
        for cidr in cidrs {
            self.nat(
                names::SERVICES,
                format!("{comment} -d {cidr} -j {}", names::NODEPORTS),
            );
        }
    }

    fn table_mut(&mut self, name: super::TableName) -> &mut TableRules {
        match name {
            super::TableName::Filter => &mut self.filter,
            super::TableName::Nat => &mut self.nat,
        }
    }

    fn finish(self) -> FamilyRules {
        FamilyRules {
            filter: self.filter,
            nat: self.nat,
        }
    }
}

/// The rules of one service port entry.
struct EntryRules<'e> {
    entry: &'e ServicePortPlan,
    local_cidr: Option<&'e str>,
    node_addresses: &'e [IpAddr],
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

    fn write(&self, out: &mut Builder<'_>) {
        self.internal(out);
        if let Some(external) = self.entry.external {
            self.external(out, &external);
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
        let vip = format!("-d {} {}", host(&e.cluster_ip), self.port_match(e.port));
        if e.masquerade.all {
            out.nat(
                &chain,
                format!(
                    "{} {vip} -j {}",
                    self.comment("cluster IP"),
                    names::MARK_MASQ
                ),
            );
        } else if e.masquerade.off_cluster_to_cluster_ip
            && let Some(cidr) = self.local_cidr
        {
            out.nat(
                &chain,
                format!(
                    "{} ! -s {cidr} {vip} -j {}",
                    self.comment("cluster IP"),
                    names::MARK_MASQ
                ),
            );
        }
        self.balance(out, &chain, endpoints);
        out.nat(names::SERVICES, format!("{capture} -j {chain}"));
    }

    fn external(&self, out: &mut Builder<'_>, external: &TrafficPlan) {
        let e = self.entry;
        let has_any = self.has_any_endpoint();
        let endpoints = e.endpoints_for(external);
        let ext = names::external(self.key());
        let reject = when_empty(external.when_empty);
        if has_any {
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
        if has_any && !ranges.is_empty() && !vips.is_empty() {
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
            if let Some(cidr) = self.local_cidr {
                out.nat(
                    ext,
                    format!(
                        "{} -s {cidr} -j {svc}",
                        self.comment("pod traffic for external destinations")
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

/// [`render`] kept up to date across syncs: each service port entry's rules are cached
/// with the entry they came from, so a plan that differs from the previous one in a few
/// entries costs those entries plus one pass over the shared chains
/// (`PROXYPLAN-SERVICES`, `PROXYPLAN-NODEPORTS`, the filter chains), not the whole
/// ruleset. Its output is always exactly what [`render`] returns for the same plan; chain
/// revisions are kept alongside, recomputed only for chains that changed.
#[derive(Debug, Default)]
pub struct RenderCache {
    families: [FamilyCache; 2],
}

/// One family's cached rendering.
#[derive(Debug, Default)]
struct FamilyCache {
    /// What the cached rules were rendered with; a change drops the cache.
    context: Option<(RenderSettings, Option<String>, Vec<IpAddr>)>,
    /// The fixed chains and base jumps, before any entry.
    base: FamilyRules,
    /// Per entry key: the entry and its rules.
    entries: std::collections::HashMap<String, CachedEntry>,
    /// The assembled rules.
    rules: FamilyRules,
    /// Revision of every chain of `rules`.
    revisions: ChainRevisions,
}

/// One entry's rules: the chains it owns (held in the assembled rules) and what it
/// appends to the shared chains.
#[derive(Debug)]
struct CachedEntry {
    entry: ServicePortPlan,
    own: Vec<(super::TableName, String)>,
    shared: Vec<(super::TableName, String, Vec<String>)>,
}

/// The revision of each chain, per table, as [`TableRules::revision`] computes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainRevisions {
    /// `filter`.
    pub filter: std::collections::HashMap<String, String>,
    /// `nat`.
    pub nat: std::collections::HashMap<String, String>,
}

impl ChainRevisions {
    /// The revisions of one table's chains.
    #[must_use]
    pub fn table(&self, name: super::TableName) -> &std::collections::HashMap<String, String> {
        match name {
            super::TableName::Filter => &self.filter,
            super::TableName::Nat => &self.nat,
        }
    }

    fn table_mut(
        &mut self,
        name: super::TableName,
    ) -> &mut std::collections::HashMap<String, String> {
        match name {
            super::TableName::Filter => &mut self.filter,
            super::TableName::Nat => &mut self.nat,
        }
    }

    fn of(rules: &FamilyRules) -> Self {
        let table = |t: &TableRules| {
            t.chains
                .iter()
                .map(|(name, rules)| (name.clone(), TableRules::revision(rules)))
                .collect()
        };
        Self {
            filter: table(&rules.filter),
            nat: table(&rules.nat),
        }
    }
}

fn table_mut(rules: &mut FamilyRules, name: super::TableName) -> &mut TableRules {
    match name {
        super::TableName::Filter => &mut rules.filter,
        super::TableName::Nat => &mut rules.nat,
    }
}

const TABLES: [super::TableName; 2] = [super::TableName::Filter, super::TableName::Nat];

impl RenderCache {
    /// Brings the cached rules to `plan` and returns them with their chain revisions,
    /// per family (`[v4, v6]`). The rules equal `render(plan, settings)`.
    pub fn update(
        &mut self,
        plan: &MergedPlan,
        settings: &RenderSettings,
    ) -> [(&FamilyRules, &ChainRevisions); 2] {
        for (cache, family) in self
            .families
            .iter_mut()
            .zip([IpFamily::IPv4, IpFamily::IPv6])
        {
            cache.update(plan, settings, family);
        }
        let [v4, v6] = &self.families;
        [(&v4.rules, &v4.revisions), (&v6.rules, &v6.revisions)]
    }

    /// Forgets everything (the next update renders from scratch).
    pub fn clear(&mut self) {
        *self = Self::default();
    }
}

impl FamilyCache {
    fn update(&mut self, plan: &MergedPlan, settings: &RenderSettings, family: IpFamily) {
        let FamilyInputs {
            entries,
            local_cidr,
            node_addresses,
        } = FamilyInputs::of(plan, family);
        if entries.is_empty() {
            *self = Self::default();
            return;
        }
        // Entries sharing a key would share chains: render those plans whole.
        if entries.windows(2).any(|w| w[0].key == w[1].key) {
            *self = Self::default();
            self.rules = render_family(plan, settings, family);
            self.revisions = ChainRevisions::of(&self.rules);
            return;
        }
        let context = (settings.clone(), local_cidr, node_addresses);
        if self.context.as_ref() != Some(&context) {
            *self = Self::default();
            let mut base = Builder::new(settings, family);
            base.fixed_chains();
            self.base = base.finish();
            self.rules = self.base.clone();
            self.context = Some(context);
        }
        let Some((_, local_cidr, node_addresses)) = &self.context else {
            return;
        };
        // Whether the shared chains must be assembled again: an entry's part of them
        // changed, or entries came or went (which moves the others' parts).
        let mut shared_changed = self.entries.is_empty();
        let mut previous_shared = std::collections::HashMap::new();
        // Entries gone or different: drop their chains.
        let wanted: std::collections::HashMap<&str, &ServicePortPlan> =
            entries.iter().map(|e| (e.key.as_str(), *e)).collect();
        let stale: Vec<String> = self
            .entries
            .iter()
            .filter(|(key, cached)| wanted.get(key.as_str()) != Some(&&cached.entry))
            .map(|(key, _)| key.clone())
            .collect();
        for key in stale {
            if let Some(cached) = self.entries.remove(&key) {
                for (table, chain) in &cached.own {
                    table_mut(&mut self.rules, *table).chains.remove(chain);
                    self.revisions.table_mut(*table).remove(chain);
                }
                previous_shared.insert(key, cached.shared);
            }
        }
        // Entries new or different: render them on their own.
        for entry in &entries {
            if self.entries.contains_key(&entry.key) {
                continue;
            }
            let mut out = Builder::new(settings, family);
            EntryRules {
                entry,
                local_cidr: local_cidr.as_deref(),
                node_addresses,
            }
            .write(&mut out);
            let rendered = out.finish();
            let mut cached = CachedEntry {
                entry: (*entry).clone(),
                own: Vec::new(),
                shared: Vec::new(),
            };
            for (table, mut rules) in [
                (super::TableName::Filter, rendered.filter),
                (super::TableName::Nat, rendered.nat),
            ] {
                let base = self.base.table(table);
                while let Some((chain, chain_rules)) = rules.chains.pop_first() {
                    if base.chains.contains_key(&chain) {
                        cached.shared.push((table, chain, chain_rules));
                    } else {
                        self.revisions
                            .table_mut(table)
                            .insert(chain.clone(), TableRules::revision(&chain_rules));
                        table_mut(&mut self.rules, table)
                            .chains
                            .insert(chain.clone(), chain_rules);
                        cached.own.push((table, chain));
                    }
                }
            }
            match previous_shared.remove(&entry.key) {
                Some(previous) if previous == cached.shared => {}
                _ => shared_changed = true,
            }
            self.entries.insert(entry.key.clone(), cached);
        }
        // Entries gone for good.
        shared_changed |= !previous_shared.is_empty();
        if !shared_changed {
            return;
        }
        // The shared chains: the fixed rules, then each entry's, in plan order.
        let mut shared = Builder::new(settings, family);
        shared.filter = TableRules {
            base_jumps: self.base.filter.base_jumps.clone(),
            chains: self.base.filter.chains.clone(),
        };
        shared.nat = TableRules {
            base_jumps: self.base.nat.base_jumps.clone(),
            chains: self.base.nat.chains.clone(),
        };
        for entry in &entries {
            let Some(cached) = self.entries.get(&entry.key) else {
                continue;
            };
            for (table, chain, rules) in &cached.shared {
                if let Some(target) = shared.table_mut(*table).chains.get_mut(chain) {
                    target.extend(rules.iter().cloned());
                }
            }
        }
        shared.nodeport_entry();
        let shared = shared.finish();
        for table in TABLES {
            let source = shared.table(table);
            let target = table_mut(&mut self.rules, table);
            target.base_jumps.clone_from(&source.base_jumps);
            for (chain, rules) in &source.chains {
                let revisions = self.revisions.table_mut(table);
                let current = target.chains.get(chain);
                if current != Some(rules) || !revisions.contains_key(chain) {
                    revisions.insert(chain.clone(), TableRules::revision(rules));
                    target.chains.insert(chain.clone(), rules.clone());
                }
            }
        }
    }
}
