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

use proxyplan_crds::{IpFamily, MergedPlan, ServicePortPlan};

use super::builder::Builder;
use super::entry::EntryRules;
use super::settings::RenderSettings;
use crate::ruleset::rules::{FamilyRules, Ruleset, TableName};
use crate::ruleset::{LocalMatch, names};

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
#[derive(Debug)]
pub(crate) struct FamilyInputs<'p> {
    /// The family's entries, in plan order.
    pub(crate) entries: Vec<&'p ServicePortPlan>,
    /// How this family's rules tell in-cluster traffic.
    pub(crate) local: Option<LocalMatch>,
    /// The node's addresses of this family.
    pub(crate) node_addresses: Vec<IpAddr>,
}

impl<'p> FamilyInputs<'p> {
    pub(crate) fn of(plan: &'p MergedPlan, family: IpFamily) -> Self {
        let v6 = family == IpFamily::IPv6;
        Self {
            entries: plan
                .service_ports
                .iter()
                .filter(|e| e.family == family)
                .map(AsRef::as_ref)
                .collect(),
            local: LocalMatch::of(&plan.local_traffic, family),
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
        local,
        node_addresses,
    } = FamilyInputs::of(plan, family);
    if entries.is_empty() {
        return FamilyRules::default();
    }
    let settings = settings.resolved(&plan.addresses);
    let mut out = Builder::new(&settings, family, true);
    out.fixed_chains();
    for entry in entries {
        EntryRules {
            entry,
            local: local.as_ref(),
            node_addresses: &node_addresses,
        }
        .write(&mut out);
    }
    out.nodeport_entry();
    out.finish()
}

/// The fixed chains and base jumps of a family that has service ports, before any entry.
pub(crate) fn base_rules(settings: &RenderSettings, family: IpFamily) -> FamilyRules {
    let mut out = Builder::new(settings, family, true);
    out.fixed_chains();
    out.finish()
}

/// What [`render`] appends to the fixed chains after every entry's rules, by table and
/// chain.
pub(crate) fn tail_rules(
    settings: &RenderSettings,
    family: IpFamily,
) -> Vec<(TableName, &'static str, String)> {
    let mut out = Builder::new(settings, family, true);
    out.nodeport_entry();
    out.nat
        .chains
        .remove(names::SERVICES)
        .unwrap_or_default()
        .into_iter()
        .map(|rule| (TableName::Nat, names::SERVICES, rule))
        .collect()
}

/// The rules `entries` (of one family, in plan order) add to what [`render`] returns: the
/// chains they own and their rules in the fixed chains. With `own` false, only the
/// latter (much cheaper: no endpoint chains).
pub(crate) fn render_entries(
    entries: &[&ServicePortPlan],
    inputs: &FamilyInputs<'_>,
    settings: &RenderSettings,
    family: IpFamily,
    own: bool,
) -> FamilyRules {
    let mut out = Builder::new(settings, family, own);
    for entry in entries {
        EntryRules {
            entry,
            local: inputs.local.as_ref(),
            node_addresses: &inputs.node_addresses,
        }
        .write(&mut out);
    }
    out.finish()
}
