//! Fitting a Service's entries into objects the API server accepts: every object stays
//! under [`MAX_OBJECT_BYTES`] serialized, so a Service with thousands of endpoints,
//! ports and families is spread over several objects instead of failing its write (and
//! an entry too large even alone keeps the first endpoints that fit, with a warning).

use proxyplan_crds::{Endpoint, MAX_ENDPOINTS, MAX_OBJECT_BYTES, ServicePortPlan};

/// Serialized size of an entry, as it will count in its object.
fn size_of(entry: &ServicePortPlan) -> usize {
    serde_json::to_vec(entry).map_or(usize::MAX, |v| v.len())
}

/// Shrinks an entry's endpoint lists until it fits one object alone (and each list holds
/// at most [`MAX_ENDPOINTS`]), keeping the first endpoints (they are sorted by address).
/// Returns a warning when anything was left out.
pub fn fit_entry(entry: &mut ServicePortPlan) -> Option<String> {
    let before = endpoint_count(entry);
    let mut changed = truncate_lists(entry, MAX_ENDPOINTS);
    // A margin for the object's metadata and the entry's place in the list.
    let budget = MAX_OBJECT_BYTES - 4096;
    let mut size = size_of(entry);
    while size > budget {
        let longest = longest_list(entry);
        if longest == 0 {
            break;
        }
        // Shrink every list in proportion; at least by one.
        let keep = ((longest as u128 * budget as u128 * 95) / (size as u128 * 100)) as usize;
        truncate_lists(entry, keep.min(longest - 1));
        changed = true;
        size = size_of(entry);
    }
    changed.then(|| {
        format!(
            "{}: {before} endpoints over its lists do not fit in one plan object; {} are \
             programmed (the first by address)",
            entry.key,
            endpoint_count(entry)
        )
    })
}

fn lists(entry: &mut ServicePortPlan) -> impl Iterator<Item = &mut Vec<Endpoint>> {
    std::iter::once(&mut entry.cluster_endpoints)
        .chain(std::iter::once(&mut entry.local_endpoints))
        .chain(std::iter::once(&mut entry.also_serving))
        .chain(entry.zone_endpoints.iter_mut().map(|z| &mut z.endpoints))
}

fn endpoint_count(entry: &ServicePortPlan) -> usize {
    entry.cluster_endpoints.len()
        + entry.local_endpoints.len()
        + entry.also_serving.len()
        + entry
            .zone_endpoints
            .iter()
            .map(|z| z.endpoints.len())
            .sum::<usize>()
}

fn longest_list(entry: &mut ServicePortPlan) -> usize {
    lists(entry).map(|l| l.len()).max().unwrap_or(0)
}

fn truncate_lists(entry: &mut ServicePortPlan, keep: usize) -> bool {
    let mut changed = false;
    for list in lists(entry) {
        if list.len() > keep {
            list.truncate(keep);
            changed = true;
        }
    }
    changed
}

/// Spreads entries (sorted by key, each fitting alone) over as few objects as their size
/// needs, keeping their order: usually one.
#[must_use]
pub fn split_entries(entries: Vec<ServicePortPlan>) -> Vec<Vec<ServicePortPlan>> {
    let budget = MAX_OBJECT_BYTES - 2048;
    let mut parts: Vec<Vec<ServicePortPlan>> = Vec::new();
    let mut current: Vec<ServicePortPlan> = Vec::new();
    let mut used = 0;
    for entry in entries {
        let size = size_of(&entry).saturating_add(1);
        if !current.is_empty() && used + size > budget {
            parts.push(std::mem::take(&mut current));
            used = 0;
        }
        used += size;
        current.push(entry);
    }
    if !current.is_empty() {
        parts.push(current);
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxyplan_crds::{
        EmptyAction, IpFamily, MasqueradePlan, Protocol, TrafficPlan, TrafficPolicy, ZoneEndpoints,
    };

    fn entry(port: &str, endpoints: usize) -> ServicePortPlan {
        let list: Vec<Endpoint> = (0..endpoints)
            .map(|i| Endpoint {
                ip: format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255).into(),
                port: 8080,
            })
            .collect();
        ServicePortPlan {
            key: format!("default/big:{port}/TCP/IPv4"),
            namespace: "default".into(),
            name: "big".into(),
            port_name: port.into(),
            family: IpFamily::IPv4,
            protocol: Protocol::TCP,
            port: 80,
            cluster_ip: "10.96.0.1".into(),
            external_ips: vec![],
            load_balancer_ips: vec![],
            node_port: None,
            load_balancer_source_ranges: vec![],
            health_check_node_port: None,
            session_affinity: None,
            internal: TrafficPlan {
                policy: TrafficPolicy::Cluster,
                when_empty: EmptyAction::Reject,
            },
            external: None,
            zone_endpoints: vec![ZoneEndpoints {
                zone: "a".into(),
                endpoints: list.iter().take(endpoints / 2).cloned().collect(),
            }],
            cluster_endpoints: list,
            local_endpoints: vec![],
            masquerade: MasqueradePlan {
                all: false,
                off_cluster_to_cluster_ip: false,
                external: false,
                local_host_to_external: false,
                hairpin: true,
            },
            local_terminating: false,
            also_serving: Vec::new(),
        }
    }

    #[test]
    fn a_small_entry_is_left_alone() {
        let mut e = entry("http", 10);
        let before = e.clone();
        assert_eq!(fit_entry(&mut e), None);
        assert_eq!(e, before);
    }

    #[test]
    fn an_entry_too_large_for_one_object_keeps_the_first_endpoints() {
        let mut e = entry("http", 40_000);
        let warning = fit_entry(&mut e).expect("a warning");
        assert!(warning.contains("60000 endpoints"), "{warning}");
        assert!(size_of(&e) < MAX_OBJECT_BYTES, "{}", size_of(&e));
        assert!(
            e.cluster_endpoints.len() > 10_000,
            "{}",
            e.cluster_endpoints.len()
        );
        assert_eq!(e.cluster_endpoints[0].ip, "10.0.0.0");
    }

    #[test]
    fn large_services_spread_over_parts_that_each_fit() {
        let entries: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .map(|p| entry(p, 6_000))
            .collect();
        let total: usize = entries.iter().map(size_of).sum();
        assert!(total > MAX_OBJECT_BYTES, "{total}");
        let parts = split_entries(entries.clone());
        assert!(parts.len() > 1);
        for part in &parts {
            let size: usize = part.iter().map(size_of).sum();
            assert!(size < MAX_OBJECT_BYTES, "{size}");
        }
        assert_eq!(parts.concat(), entries);
        assert_eq!(split_entries(vec![entry("x", 3)]).len(), 1);
        assert!(split_entries(Vec::new()).is_empty());
    }
}
