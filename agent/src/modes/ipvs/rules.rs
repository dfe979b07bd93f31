//! The fixed iptables rules of the ipvs mode: a handful of rules, in the agent's own
//! chains, that match its ipsets for masquerade, node ports, the load-balancer firewall
//! and source ranges, and the filter that keeps the node's own listeners off the VIPs
//! (kube-proxy's KUBE-IPVS-FILTER), whatever the plan holds. The one exception is the
//! output filter (kube-proxy's KUBE-IPVS-OUT-FILTER): one rule per load-balancer IP and
//! port whose source ranges leave the node out, usually none.

use std::net::IpAddr;

use proxyplan_crds::{IpFamily, LoadBalancerIpMode, MergedPlan, ServicePortPlan};

use super::sets::{PROTOCOLS, Role, proto, set_name};
use super::settings::IpvsSettings;
use crate::ruleset::rules::{BaseJump, FamilyRules, Ruleset, TableRules};
use crate::ruleset::{LocalMatch, names};
use crate::run::Cidr;

/// The filter chain at the head of `INPUT` that rejects new connections to a VIP on a
/// port no service uses (kube-proxy's KUBE-IPVS-FILTER).
pub const VIP_FILTER: &str = "PROXYPLAN-IPVS-FILTER";
/// The filter chain in `OUTPUT` that drops the node's own connections to load-balancer
/// IPs whose source ranges leave the node out (kube-proxy's KUBE-IPVS-OUT-FILTER).
pub const VIP_OUT_FILTER: &str = "PROXYPLAN-IPVS-OUT-FILTER";

/// An entry's `loadBalancerSourceRanges` (those that parse), and whether one of them
/// covers one of `node_addresses`; `None` without ranges.
#[must_use]
pub fn source_ranges(e: &ServicePortPlan, node_addresses: &[IpAddr]) -> Option<(Vec<Cidr>, bool)> {
    let ranges: Vec<Cidr> = e
        .load_balancer_source_ranges
        .iter()
        .filter_map(|r| r.parse::<Cidr>().ok())
        .collect();
    if ranges.is_empty() {
        return None;
    }
    let covers_node = ranges
        .iter()
        .any(|r| node_addresses.iter().any(|a| r.contains(*a)));
    Some((ranges, covers_node))
}

/// The load-balancer IPs the node holds as VIPs (not `ipMode: Proxy`).
pub fn lb_vips(e: &ServicePortPlan) -> impl Iterator<Item = IpAddr> + '_ {
    e.load_balancer_ips
        .iter()
        .filter(|lb| lb.mode == LoadBalancerIpMode::VIP)
        .filter_map(|lb| lb.ip.parse::<IpAddr>().ok())
}

/// kube-proxy's KUBE-IPVS-OUT-FILTER rules of `family`: the node reaching a load-balancer
/// IP it holds uses that IP as its source, and IPVS takes the connection in `OUTPUT`
/// before any `INPUT` firewall sees it; so when the source ranges leave the node out, the
/// connection is dropped here, matched by its virtual server.
fn out_filter(plan: &MergedPlan, family: IpFamily) -> Vec<String> {
    let mut rules = Vec::new();
    let host = if family == IpFamily::IPv6 { 128 } else { 32 };
    for e in plan
        .service_ports
        .iter()
        .filter(|e| e.family == family && !e.load_balancer_source_ranges.is_empty())
    {
        let Some((_, false)) = source_ranges(e, &plan.addresses) else {
            continue;
        };
        for ip in lb_vips(e) {
            rules.push(format!(
                "-s {ip}/{host} -m ipvs --vaddr {ip}/{host} --vproto {} --vport {} -j DROP",
                proto(e.protocol),
                e.port
            ));
        }
    }
    rules
}

/// The fixed iptables rules of the families in use.
#[must_use]
pub fn rules(plan: &MergedPlan, settings: &IpvsSettings, families: [bool; 2]) -> Ruleset {
    let mut rules = Ruleset::default();
    for (family, used) in [IpFamily::IPv4, IpFamily::IPv6].into_iter().zip(families) {
        if !used {
            continue;
        }
        let local = LocalMatch::of(&plan.local_traffic, family);
        let mut family_rules = frame(family, settings, local.as_ref());
        family_rules
            .filter
            .chains
            .insert(VIP_OUT_FILTER.to_owned(), out_filter(plan, family));
        match family {
            IpFamily::IPv4 => rules.v4 = family_rules,
            IpFamily::IPv6 => rules.v6 = family_rules,
        }
    }
    rules
}

fn set_match(family: IpFamily, role: Role, dirs: &str) -> String {
    format!("-m set --match-set {} {dirs}", set_name(family, role))
}

/// The fixed iptables rules of one family.
fn frame(family: IpFamily, settings: &IpvsSettings, local: Option<&LocalMatch>) -> FamilyRules {
    let mark = format!("{:#x}", 1u32 << settings.masquerade_bit.min(31));
    let masq = names::MARK_MASQ;
    let comment = |text: &str| format!("-m comment --comment \"{text}\"");
    let mut nat = TableRules::default();
    let mut filter = TableRules::default();
    let push = |table: &mut TableRules, chain: &str, rule: String| {
        table.chains.entry(chain.to_owned()).or_default().push(rule);
    };
    nat.chains.insert(names::CANARY.to_owned(), Vec::new());
    nat.chains.insert(names::NODEPORTS.to_owned(), Vec::new());
    push(&mut nat, masq, format!("-j MARK --or-mark {mark}"));
    push(
        &mut nat,
        names::POSTROUTING,
        format!(
            "{} {} -j MASQUERADE",
            comment("proxyplan hairpin traffic"),
            set_match(family, Role::LoopBack, "dst,dst,src")
        ),
    );
    push(
        &mut nat,
        names::POSTROUTING,
        format!("-m mark ! --mark {mark}/{mark} -j RETURN"),
    );
    push(
        &mut nat,
        names::POSTROUTING,
        format!("-j MARK --xor-mark {mark}"),
    );
    push(
        &mut nat,
        names::POSTROUTING,
        format!(
            "{} -j MASQUERADE --random-fully",
            comment("proxyplan service traffic requiring SNAT")
        ),
    );
    let services = names::SERVICES;
    push(
        &mut nat,
        services,
        format!(
            "{} {} -j {masq}",
            comment("proxyplan cluster IPs, masquerade all"),
            set_match(family, Role::ClusterIpAll, "dst,dst")
        ),
    );
    if let Some(local) = local {
        push(
            &mut nat,
            services,
            format!(
                "{} {} {} -j {masq}",
                comment("proxyplan cluster IPs from outside the cluster"),
                local.not_local(),
                set_match(family, Role::ClusterIp, "dst,dst")
            ),
        );
    }
    push(
        &mut nat,
        services,
        format!(
            "{} {} -j {masq}",
            comment("proxyplan external addresses"),
            set_match(family, Role::External, "dst,dst")
        ),
    );
    push(
        &mut nat,
        services,
        format!(
            "{} -m addrtype --src-type LOCAL {} -j {masq}",
            comment("proxyplan node traffic to Local-policy external addresses"),
            set_match(family, Role::ExternalLocal, "dst,dst")
        ),
    );
    push(
        &mut nat,
        services,
        format!(
            "{} {} -j {}",
            comment("proxyplan service nodeports"),
            set_match(family, Role::NodeIp, "dst"),
            names::NODEPORTS
        ),
    );
    for p in PROTOCOLS {
        let pr = proto(p);
        push(
            &mut nat,
            names::NODEPORTS,
            format!(
                "-p {pr} -m set --match-set {} dst -j {masq}",
                set_name(family, Role::NodePort(p))
            ),
        );
        push(
            &mut nat,
            names::NODEPORTS,
            format!(
                "-p {pr} -m addrtype --src-type LOCAL -m set --match-set {} dst -j {masq}",
                set_name(family, Role::NodePortLocal(p))
            ),
        );
    }
    filter.chains.insert(names::CANARY.to_owned(), Vec::new());
    // kube-proxy's KUBE-IPVS-FILTER: every VIP is a local address of the node, so without
    // this any host listener on 0.0.0.0 (kubelet, sshd) answers on every VIP.
    for (role, dirs) in [(Role::VipPort, "dst,dst"), (Role::HcNodePort, "dst")] {
        push(
            &mut filter,
            VIP_FILTER,
            format!("{} -j RETURN", set_match(family, role, dirs)),
        );
    }
    push(
        &mut filter,
        VIP_FILTER,
        format!(
            "{} -m conntrack --ctstate NEW {} -j REJECT",
            comment("proxyplan no service on this VIP and port"),
            set_match(family, Role::Vip, "dst")
        ),
    );
    push(
        &mut filter,
        names::FIREWALL,
        format!(
            "{} {} -m set ! --match-set {} dst,dst,src -m set ! --match-set {} dst,dst,src -j DROP",
            comment("proxyplan load balancer source ranges"),
            set_match(family, Role::LbFw, "dst,dst"),
            set_name(family, Role::LbSrcCidr),
            set_name(family, Role::LbSrcIp)
        ),
    );
    push(
        &mut filter,
        names::EXTERNAL_SERVICES,
        format!(
            "{} {} -j DROP",
            comment("proxyplan Local policy without local endpoints"),
            set_match(family, Role::Drop, "dst,dst")
        ),
    );
    for p in PROTOCOLS {
        push(
            &mut filter,
            names::EXTERNAL_SERVICES,
            format!(
                "-p {} {} -m set --match-set {} dst -j DROP",
                proto(p),
                set_match(family, Role::NodeIp, "dst"),
                set_name(family, Role::NodePortDrop(p))
            ),
        );
    }
    push(
        &mut filter,
        names::EXTERNAL_SERVICES,
        format!(
            "{} -p tcp {} -j ACCEPT",
            comment("proxyplan health check node ports"),
            set_match(family, Role::HcNodePort, "dst")
        ),
    );
    push(
        &mut filter,
        names::FORWARD,
        format!(
            "{} -m mark --mark {mark}/{mark} -j ACCEPT",
            comment("proxyplan forwarding rules")
        ),
    );
    push(
        &mut filter,
        names::FORWARD,
        format!(
            "{} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            comment("proxyplan forwarding conntrack rule")
        ),
    );
    let portals = format!("{} -j {services}", comment("proxyplan service portals"));
    nat.base_jumps = vec![
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
                "{} -j {}",
                comment("proxyplan postrouting rules"),
                names::POSTROUTING
            ),
        },
    ];
    let new = "-m conntrack --ctstate NEW";
    let vip_filter = |chain| BaseJump {
        chain,
        rule: format!(
            "{} -j {}",
            comment("proxyplan ipvs access filter"),
            if chain == "INPUT" {
                VIP_FILTER
            } else {
                VIP_OUT_FILTER
            }
        ),
    };
    filter.base_jumps = vec![
        vip_filter("INPUT"),
        BaseJump {
            chain: "INPUT",
            rule: format!(
                "{new} {} -j {}",
                comment("proxyplan external services"),
                names::EXTERNAL_SERVICES
            ),
        },
        BaseJump {
            chain: "INPUT",
            rule: format!(
                "{new} {} -j {}",
                comment("proxyplan load balancer firewall"),
                names::FIREWALL
            ),
        },
        BaseJump {
            chain: "FORWARD",
            rule: format!(
                "{} -j {}",
                comment("proxyplan forwarding rules"),
                names::FORWARD
            ),
        },
        vip_filter("OUTPUT"),
    ];
    FamilyRules { filter, nat }
}
