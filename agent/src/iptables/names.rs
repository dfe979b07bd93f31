//! Chain names. Fixed chains are spelled out; per-service and per-endpoint chains carry a
//! hash of what they serve. Every name starts with `PROXYPLAN-` or `PP-`, so nothing
//! collides with kube-proxy's `KUBE-` chains and both can run during a migration; all fit
//! iptables' 28-character limit.

use proxyplan_crds::{Endpoint, stable_hash};

/// nat: entry point from PREROUTING and OUTPUT; filter: REJECT/DROP of cluster IPs
/// without endpoints.
pub const SERVICES: &str = "PROXYPLAN-SERVICES";
/// nat: node ports.
pub const NODEPORTS: &str = "PROXYPLAN-NODEPORTS";
/// nat: masquerade of marked packets.
pub const POSTROUTING: &str = "PROXYPLAN-POSTROUTING";
/// nat: marks a packet for masquerade.
pub const MARK_MASQ: &str = "PROXYPLAN-MARK-MASQ";
/// filter: REJECT/DROP of external addresses and node ports without endpoints.
pub const EXTERNAL_SERVICES: &str = "PROXYPLAN-EXT-SERVICES";
/// filter: drops load-balancer traffic from sources outside loadBalancerSourceRanges.
pub const FIREWALL: &str = "PROXYPLAN-FIREWALL";
/// filter: accepts forwarded service traffic.
pub const FORWARD: &str = "PROXYPLAN-FORWARD";
/// An empty chain in each table whose disappearance means someone flushed our rules.
pub const CANARY: &str = "PROXYPLAN-CANARY";

/// Every chain name the agent owns starts with one of these.
pub const OWNED_PREFIXES: [&str; 2] = ["PROXYPLAN-", "PP-"];

/// Whether `chain` is one of the agent's.
#[must_use]
pub fn is_owned(chain: &str) -> bool {
    OWNED_PREFIXES.iter().any(|p| chain.starts_with(p))
}

const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

fn hashed(prefix: &str, text: &str) -> String {
    let mut hash = stable_hash(text.as_bytes());
    let mut name = String::with_capacity(prefix.len() + 13);
    name.push_str(prefix);
    for _ in 0..13 {
        name.push(char::from(ALPHABET[(hash & 31) as usize]));
        hash >>= 5;
    }
    name
}

/// Cluster-policy chain of a service port: balances over `clusterEndpoints`.
#[must_use]
pub fn service(key: &str) -> String {
    hashed("PP-SVC-", key)
}

/// Local-policy chain of a service port: balances over `localEndpoints`.
#[must_use]
pub fn service_local(key: &str) -> String {
    hashed("PP-SVL-", key)
}

/// External-traffic chain of a service port: node ports, external and LB IPs.
#[must_use]
pub fn external(key: &str) -> String {
    hashed("PP-EXT-", key)
}

/// Load-balancer source-range chain of a service port.
#[must_use]
pub fn firewall(key: &str) -> String {
    hashed("PP-FW-", key)
}

/// Endpoint chain: DNAT to one endpoint of one service port.
#[must_use]
pub fn endpoint(key: &str, endpoint: &Endpoint) -> String {
    hashed(
        "PP-SEP-",
        &format!("{key}#{}#{}", endpoint.ip, endpoint.port),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_short_and_ours() {
        let key = "default/web:http/TCP/IPv4";
        assert_eq!(service(key), service(key));
        assert_ne!(service(key), service("default/web:http/UDP/IPv4"));
        let ep = Endpoint {
            ip: "10.0.0.1".into(),
            port: 80,
        };
        for name in [
            service(key),
            service_local(key),
            external(key),
            firewall(key),
            endpoint(key, &ep),
        ] {
            assert!(name.len() <= 28, "{name}");
            assert!(is_owned(&name), "{name}");
        }
        for name in [
            SERVICES,
            NODEPORTS,
            POSTROUTING,
            MARK_MASQ,
            EXTERNAL_SERVICES,
            FIREWALL,
            FORWARD,
            CANARY,
        ] {
            assert!(name.len() <= 28 && is_owned(name), "{name}");
        }
        assert!(!is_owned("KUBE-SERVICES"));
    }
}
