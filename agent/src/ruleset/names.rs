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
/// filter: accepts health-check node ports (for nodes whose INPUT policy is DROP).
pub const HEALTH_CHECKS: &str = "PROXYPLAN-HEALTH-CHECKS";
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

/// Prefixes of the chain names that end in a hash, in a fixed order: a [`HashedName`]
/// stores the index.
const HASHED_PREFIXES: [&str; 5] = ["PP-SVC-", "PP-SVL-", "PP-EXT-", "PP-FW-", "PP-SEP-"];
const SVC: u8 = 0;
const SVL: u8 = 1;
const EXT: u8 = 2;
const FW: u8 = 3;
const SEP: u8 = 4;

/// Base32 characters of a hashed name.
const HASH_CHARS: usize = 13;

fn hashed(prefix: u8, text: &str) -> String {
    HashedName {
        prefix,
        hash: stable_hash(text.as_bytes()),
    }
    .to_string()
}

/// A chain name of the form `PREFIX` + 13 base32 characters of a 64-bit hash, held as
/// the prefix's index and the hash: 16 bytes instead of a heap string, for the models
/// that track hundreds of thousands of chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HashedName {
    prefix: u8,
    hash: u64,
}

/// The text of a [`HashedName`], on the stack.
#[derive(Debug, Clone, Copy)]
pub struct NameText {
    bytes: [u8; 20],
    len: usize,
}

impl NameText {
    /// The name.
    #[must_use]
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever written into `bytes`.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

impl HashedName {
    /// The name from its parts (see [`HashedName::parts`]).
    #[must_use]
    pub(crate) fn from_parts(prefix: u8, hash: u64) -> Self {
        Self { prefix, hash }
    }

    /// The prefix's index and the hash.
    #[must_use]
    pub(crate) fn parts(self) -> (u8, u64) {
        (self.prefix, self.hash)
    }

    /// The name when it has the form this module writes (and reads back the same).
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        let (prefix, rest) = HASHED_PREFIXES
            .iter()
            .zip(0u8..)
            .find_map(|(p, i)| name.strip_prefix(p).map(|rest| (i, rest)))?;
        if rest.len() != HASH_CHARS {
            return None;
        }
        let mut hash = 0u64;
        for (i, byte) in rest.bytes().enumerate() {
            let value = match byte {
                b'A'..=b'Z' => byte - b'A',
                b'2'..=b'7' => byte - b'2' + 26,
                _ => return None,
            };
            // The last character holds the top 4 bits only.
            if i == HASH_CHARS - 1 && value >= 16 {
                return None;
            }
            hash |= u64::from(value) << (5 * i);
        }
        Some(Self { prefix, hash })
    }

    /// The name's text.
    #[must_use]
    pub fn text(&self) -> NameText {
        let mut out = NameText {
            bytes: [0; 20],
            len: 0,
        };
        let prefix = HASHED_PREFIXES
            .get(usize::from(self.prefix))
            .copied()
            .unwrap_or("PP-");
        out.bytes[..prefix.len()].copy_from_slice(prefix.as_bytes());
        out.len = prefix.len();
        let mut hash = self.hash;
        for _ in 0..HASH_CHARS {
            out.bytes[out.len] = ALPHABET[(hash & 31) as usize];
            out.len += 1;
            hash >>= 5;
        }
        out
    }
}

/// Rank of each prefix of [`HASHED_PREFIXES`] in text order (`PP-EXT-` < `PP-FW-` <
/// `PP-SEP-` < `PP-SVC-` < `PP-SVL-`; none is a prefix of another).
const PREFIX_TEXT_RANK: [u8; 5] = [3, 4, 0, 1, 2];

impl HashedName {
    /// A key that orders hashed names as their text does: the prefix's rank, then the
    /// base32 characters in their ASCII order (digits before letters).
    pub(crate) fn text_key(self) -> (u8, u128) {
        let rank = PREFIX_TEXT_RANK
            .get(usize::from(self.prefix))
            .copied()
            .unwrap_or(u8::MAX);
        let mut key = 0u128;
        let mut hash = self.hash;
        for _ in 0..HASH_CHARS {
            let value = (hash & 31) as u8;
            let ascii_rank = if value >= 26 { value - 26 } else { value + 6 };
            key = (key << 5) | u128::from(ascii_rank);
            hash >>= 5;
        }
        (rank, key)
    }
}

impl std::fmt::Display for HashedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text().as_str())
    }
}

/// Any chain name the agent owns: hashed names compactly, the others as text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChainName {
    /// `PP-SVC-…`, `PP-SEP-…` and the other per-service chains.
    Hashed(HashedName),
    /// Any other name (`PROXYPLAN-SERVICES`, names from other versions).
    Other(Box<str>),
}

impl ChainName {
    /// `name`, compactly when it is a hashed name.
    #[must_use]
    pub fn new(name: &str) -> Self {
        HashedName::parse(name).map_or_else(|| Self::Other(name.into()), Self::Hashed)
    }

    /// Compares the names' texts (byte order), without writing hashed names out.
    #[must_use]
    pub fn cmp_text(&self, other: &Self) -> std::cmp::Ordering {
        match (self, other) {
            (Self::Hashed(a), Self::Hashed(b)) => a.text_key().cmp(&b.text_key()),
            _ => self.with_text(|a| other.with_text(|b| a.cmp(b))),
        }
    }

    /// Calls `f` with the name's text.
    pub fn with_text<T>(&self, f: impl FnOnce(&str) -> T) -> T {
        match self {
            Self::Hashed(h) => f(h.text().as_str()),
            Self::Other(name) => f(name),
        }
    }
}

impl std::fmt::Display for ChainName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.with_text(|text| f.write_str(text))
    }
}

/// Cluster-policy chain of a service port: balances over `clusterEndpoints`.
#[must_use]
pub fn service(key: &str) -> String {
    hashed(SVC, key)
}

/// Local-policy chain of a service port: balances over `localEndpoints`.
#[must_use]
pub fn service_local(key: &str) -> String {
    hashed(SVL, key)
}

/// External-traffic chain of a service port: node ports, external and LB IPs.
#[must_use]
pub fn external(key: &str) -> String {
    hashed(EXT, key)
}

/// Load-balancer source-range chain of a service port.
#[must_use]
pub fn firewall(key: &str) -> String {
    hashed(FW, key)
}

/// Endpoint chain: DNAT to one endpoint of one service port.
#[must_use]
pub fn endpoint(key: &str, endpoint: &Endpoint) -> String {
    hashed(SEP, &format!("{key}#{}#{}", endpoint.ip, endpoint.port))
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

    #[test]
    fn hashed_names_read_back_as_written() {
        let ep = Endpoint {
            ip: "fd00::1".into(),
            port: 53,
        };
        for i in 0..200 {
            let key = format!("ns/svc-{i}:p/UDP/IPv6");
            for name in [
                service(&key),
                service_local(&key),
                external(&key),
                firewall(&key),
                endpoint(&key, &ep),
            ] {
                let parsed = HashedName::parse(&name).expect(&name);
                assert_eq!(parsed.to_string(), name);
                assert_eq!(ChainName::new(&name), ChainName::Hashed(parsed));
            }
        }
        let mut names: Vec<ChainName> = (0..300)
            .flat_map(|i| {
                let key = format!("ns/svc-{i}:p/TCP/IPv4");
                [
                    service(&key),
                    service_local(&key),
                    external(&key),
                    firewall(&key),
                    endpoint(&key, &ep),
                ]
            })
            .chain([SERVICES.to_owned(), "PP-A".to_owned(), "PP-Z".to_owned()])
            .map(|n| ChainName::new(&n))
            .collect();
        names.sort_by(ChainName::cmp_text);
        let texts: Vec<String> = names.iter().map(ToString::to_string).collect();
        let mut sorted = texts.clone();
        sorted.sort();
        assert_eq!(texts, sorted, "cmp_text orders like the text");
        for other in [
            SERVICES,
            "PP-SVC-",
            "PP-SVC-AAAAAAAAAAAA",
            "PP-SVC-AAAAAAAAAAAAAA",
            "PP-SVC-AAAAAAAAAAAAZ",
            "PP-SVC-aAAAAAAAAAAAA",
            "PP-XYZ-AAAAAAAAAAAAA",
        ] {
            assert_eq!(HashedName::parse(other), None, "{other}");
            assert_eq!(ChainName::new(other).to_string(), other);
        }
    }
}
