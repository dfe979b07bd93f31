//! [`Builder`]: one family's two tables as they are rendered, with the fixed chains every
//! family with service ports has (the service dispatch, node ports, masquerade, the
//! firewall and forwarding rules, the canary) and the jumps into them.

use proxyplan_crds::IpFamily;

use super::settings::RenderSettings;
use crate::ruleset::names;
use crate::ruleset::rules::{BaseJump, FamilyRules, TableRules};

/// Accumulates the two tables of one family.
pub(super) struct Builder<'a> {
    pub(super) settings: &'a RenderSettings,
    pub(super) family: IpFamily,
    pub(super) nat: TableRules,
    pub(super) filter: TableRules,
    /// Whether the chains entries own are rendered (otherwise only what entries add to
    /// the fixed chains).
    pub(super) own: bool,
}

impl<'a> Builder<'a> {
    pub(super) fn new(settings: &'a RenderSettings, family: IpFamily, own: bool) -> Self {
        Self {
            settings,
            family,
            nat: TableRules::default(),
            filter: TableRules::default(),
            own,
        }
    }

    pub(super) fn nat(&mut self, chain: &str, rule: String) {
        self.nat
            .chains
            .entry(chain.to_owned())
            .or_default()
            .push(rule);
    }

    pub(super) fn filter(&mut self, chain: &str, rule: String) {
        self.filter
            .chains
            .entry(chain.to_owned())
            .or_default()
            .push(rule);
    }

    /// Declares a chain (so it exists even if empty).
    pub(super) fn nat_chain(&mut self, chain: &str) {
        self.nat.chains.entry(chain.to_owned()).or_default();
    }

    pub(super) fn fixed_chains(&mut self) {
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
            names::HEALTH_CHECKS,
            names::CANARY,
        ] {
            self.filter.chains.entry(chain.to_owned()).or_default();
        }
        if self.family == IpFamily::IPv4 && self.settings.localhost_nodeports_on() {
            // kube-proxy's (and kubelet's) guard against martian packets to 127.0.0.0/8,
            // which route_localnet=1 would otherwise let in.
            self.filter(
                names::FIREWALL,
                "! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
                    .to_owned(),
            );
        }
        if self.settings.drop_invalid {
            self.filter(
                names::FORWARD,
                "-m conntrack --ctstate INVALID -j DROP".to_owned(),
            );
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
                rule: format!(
                    "-m comment --comment \"proxyplan health check service ports\" -j {}",
                    names::HEALTH_CHECKS
                ),
            },
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
    pub(super) fn nodeport_entry(&mut self) {
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
            // DNAT from 127.0.0.0/8 needs route_localnet=1 (CVE-2020-8558), which the
            // agent sets only with --iptables-localhost-nodeports.
            let loopback = match self.family {
                IpFamily::IPv4 if self.settings.localhost_nodeports_on() => "",
                IpFamily::IPv4 => " ! -d 127.0.0.0/8",
                IpFamily::IPv6 => " ! -d ::1/128",
            };
            self.nat(
                names::SERVICES,
                format!(
                    "{comment} -m addrtype --dst-type LOCAL{loopback} -j {}",
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

    pub(super) fn finish(self) -> FamilyRules {
        FamilyRules {
            filter: self.filter,
            nat: self.nat,
        }
    }
}
