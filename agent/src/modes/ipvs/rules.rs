//! The fixed iptables rules of the ipvs mode: a handful of rules, in the agent's own
//! chains, that match its ipsets for masquerade, node ports, the load-balancer firewall
//! and source ranges, whatever the plan holds.

use proxyplan_crds::{IpFamily, MergedPlan};

use super::sets::{PROTOCOLS, Role, proto, set_name};
use super::settings::IpvsSettings;
use crate::ruleset::rules::{BaseJump, FamilyRules, Ruleset, TableRules};
use crate::ruleset::{LocalMatch, names};

/// The fixed iptables rules of the families in use.
#[must_use]
pub fn rules(plan: &MergedPlan, settings: &IpvsSettings, families: [bool; 2]) -> Ruleset {
    let mut rules = Ruleset::default();
    for (family, used) in [IpFamily::IPv4, IpFamily::IPv6].into_iter().zip(families) {
        if !used {
            continue;
        }
        let local = LocalMatch::of(&plan.local_traffic, family);
        let family_rules = frame(family, settings, local.as_ref());
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
    filter.base_jumps = vec![
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
    ];
    FamilyRules { filter, nat }
}
