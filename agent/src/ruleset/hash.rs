//! Hashes that let the agent remember rules without keeping their text.
//!
//! - [`RevisionHasher`]: a chain's revision, fed one rule at a time. It equals
//!   [`proxyplan_crds::revision_of`] over the chain's rules (FNV-1a 64 of their JSON
//!   array), so the `proxyplan-rev:` comments stay what they have always been.
//! - [`hash_entry`] into a [`ContentHasher`]: a 64-bit hash of a service port entry, what
//!   the render cache compares entries by, every entry on every sync (a serde-driven
//!   SipHash took 15 ms for 13,500 entries, this about 2).

use std::hash::Hasher;

use proxyplan_crds::{
    EmptyAction, Endpoint, IpFamily, LoadBalancerIp, LoadBalancerIpMode, MasqueradePlan, Protocol,
    ServicePortPlan, SessionAffinity, TrafficPlan, TrafficPolicy,
};

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64, the hash behind [`proxyplan_crds::revision_of`].
#[derive(Debug, Clone, Copy)]
struct Fnv1a(u64);

impl Fnv1a {
    fn update(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
    }
}

impl std::io::Write for Fnv1a {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A chain's revision, computed one rule at a time (the rules themselves, without the
/// revision rule), and the chain's rule count.
#[derive(Debug, Clone, Copy)]
pub struct RevisionHasher {
    fnv: Fnv1a,
    rules: usize,
}

impl Default for RevisionHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl RevisionHasher {
    /// A chain without rules so far.
    #[must_use]
    pub fn new() -> Self {
        let mut fnv = Fnv1a(FNV_OFFSET);
        fnv.update(b"[");
        Self { fnv, rules: 0 }
    }

    /// Adds the next rule.
    pub fn rule(&mut self, rule: &str) {
        if self.rules > 0 {
            self.fnv.update(b",");
        }
        // Exactly how serde_json writes a string inside an array; writing into the
        // hasher cannot fail.
        if serde_json::to_writer(&mut self.fnv, rule).is_err() {
            self.fnv.update(rule.as_bytes());
        }
        self.rules += 1;
    }

    /// Number of rules added.
    #[must_use]
    pub fn rules(&self) -> usize {
        self.rules
    }

    /// The revision of the rules added.
    #[must_use]
    pub fn finish(mut self) -> u64 {
        self.fnv.update(b"]");
        self.fnv.0
    }

    /// The revision of `rules`.
    #[must_use]
    pub fn of<S: AsRef<str>>(rules: &[S]) -> u64 {
        let mut hasher = Self::new();
        for rule in rules {
            hasher.rule(rule.as_ref());
        }
        hasher.finish()
    }
}

/// A revision as it is written in a chain's revision rule: 16 lowercase hex digits.
#[must_use]
pub fn revision_text(revision: u64) -> String {
    format!("{revision:016x}")
}

/// The revision in a revision rule's text, when it is one [`revision_text`] writes.
#[must_use]
pub fn parse_revision(text: &str) -> Option<u64> {
    let valid = text.len() == 16 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if valid {
        u64::from_str_radix(text, 16).ok()
    } else {
        None
    }
}

/// A fast, deterministic 64-bit hasher for telling versions of plan data apart (not for
/// hash tables facing untrusted keys). It collects what it is fed and hashes it in one
/// go, four 64-bit lanes at a time: each word is mixed in by xor, an odd multiply and a
/// rotation (a bijection of the lane for a given word, and of the word for a given
/// lane), the lanes are combined the same way and the result is finished with the
/// MurmurHash3 avalanche. Values whose serialized forms differ in a single word never
/// collide. [`ContentHasher::clear`] reuses the buffer for the next value.
#[derive(Debug, Clone, Default)]
pub struct ContentHasher {
    bytes: Vec<u8>,
}

const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;
const SEEDS: [u64; 4] = [
    0x243f_6a88_85a3_08d3,
    0x1319_8a2e_0370_7344,
    0xa409_3822_299f_31d0,
    0x082e_fa98_ec4e_6c89,
];

fn absorb(state: u64, word: u64) -> u64 {
    (state ^ word).wrapping_mul(MULTIPLIER).rotate_left(29)
}

fn word_at(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    let n = bytes.len().min(8);
    word[..n].copy_from_slice(&bytes[..n]);
    u64::from_le_bytes(word)
}

/// The hash of `bytes` (see [`ContentHasher`]).
#[must_use]
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut lanes = SEEDS;
    let mut blocks = bytes.chunks_exact(32);
    for block in &mut blocks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            *lane = absorb(*lane, word_at(&block[i * 8..]));
        }
    }
    let mut h = absorb(0, bytes.len() as u64);
    for lane in lanes {
        h = absorb(h, lane);
    }
    // The length is in already: zero padding of the last word is unambiguous.
    for word in blocks.remainder().chunks(8) {
        h = absorb(h, word_at(word));
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

impl ContentHasher {
    /// Forgets what was fed, keeping the buffer.
    pub fn clear(&mut self) {
        self.bytes.clear();
    }
}

impl Hasher for ContentHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    fn write_u8(&mut self, i: u8) {
        self.bytes.push(i);
    }

    fn write_u16(&mut self, i: u16) {
        self.bytes.extend_from_slice(&i.to_le_bytes());
    }

    fn write_u32(&mut self, i: u32) {
        self.bytes.extend_from_slice(&i.to_le_bytes());
    }

    fn write_u64(&mut self, i: u64) {
        self.bytes.extend_from_slice(&i.to_le_bytes());
    }

    fn write_usize(&mut self, i: usize) {
        self.bytes.extend_from_slice(&(i as u64).to_le_bytes());
    }

    fn finish(&self) -> u64 {
        hash_bytes(&self.bytes)
    }
}

fn endpoints_into<H: Hasher>(hasher: &mut H, list: &[Endpoint]) {
    hasher.write_usize(list.len());
    for Endpoint { ip, port } in list {
        text_into(hasher, ip);
        hasher.write_u16(*port);
    }
}

/// Feeds every field of `entry` into `hasher`, lengths and `Option`/enum tags included
/// (so different entries never feed the same bytes). Every struct is destructured
/// without `..` and every enum matched in full: a field or variant added to the plan
/// types does not compile until it is hashed here.
pub fn hash_entry<H: Hasher>(hasher: &mut H, entry: &ServicePortPlan) {
    let ServicePortPlan {
        key,
        namespace,
        name,
        port_name,
        family,
        protocol,
        port,
        cluster_ip,
        external_ips,
        load_balancer_ips,
        node_port,
        load_balancer_source_ranges,
        health_check_node_port,
        session_affinity,
        internal,
        external,
        cluster_endpoints,
        zone_endpoints,
        local_endpoints,
        masquerade,
        local_terminating,
        also_serving,
    } = entry;
    for text in [
        key.as_str(),
        namespace.as_str(),
        name.as_str(),
        port_name.as_str(),
        cluster_ip.as_str(),
    ] {
        text_into(hasher, text);
    }
    hasher.write_u8(match family {
        IpFamily::IPv4 => 4,
        IpFamily::IPv6 => 6,
    });
    hasher.write_u8(match protocol {
        Protocol::TCP => 1,
        Protocol::UDP => 2,
        Protocol::SCTP => 3,
    });
    hasher.write_u16(*port);
    texts_into(hasher, external_ips);
    hasher.write_usize(load_balancer_ips.len());
    for LoadBalancerIp { ip, mode } in load_balancer_ips {
        text_into(hasher, ip);
        hasher.write_u8(match mode {
            LoadBalancerIpMode::VIP => 1,
            LoadBalancerIpMode::Proxy => 2,
        });
    }
    port_into(hasher, *node_port);
    texts_into(hasher, load_balancer_source_ranges);
    port_into(hasher, *health_check_node_port);
    match session_affinity {
        None => hasher.write_u8(0),
        Some(SessionAffinity { timeout_seconds }) => {
            hasher.write_u8(1);
            hasher.write_u32(*timeout_seconds);
        }
    }
    traffic_into(hasher, Some(internal));
    traffic_into(hasher, external.as_ref());
    endpoints_into(hasher, cluster_endpoints);
    endpoints_into(hasher, local_endpoints);
    // Rules do not change with these, but conntrack clean-up and health checks do: an
    // entry whose hash changed is looked at again (its chains are rewritten only when
    // their rules differ).
    hasher.write_u8(u8::from(*local_terminating));
    endpoints_into(hasher, also_serving);
    hasher.write_usize(zone_endpoints.len());
    for zone in zone_endpoints {
        text_into(hasher, &zone.zone);
        endpoints_into(hasher, &zone.endpoints);
    }
    let MasqueradePlan {
        all,
        off_cluster_to_cluster_ip,
        external,
        local_host_to_external,
        hairpin,
    } = masquerade;
    let flags = [
        all,
        off_cluster_to_cluster_ip,
        external,
        local_host_to_external,
        hairpin,
    ];
    hasher.write_u8(
        flags
            .iter()
            .enumerate()
            .fold(0, |bits, (i, on)| bits | (u8::from(**on) << i)),
    );
}

fn text_into<H: Hasher>(hasher: &mut H, text: &str) {
    hasher.write_usize(text.len());
    hasher.write(text.as_bytes());
}

fn texts_into<H: Hasher>(hasher: &mut H, texts: &[String]) {
    hasher.write_usize(texts.len());
    for text in texts {
        text_into(hasher, text);
    }
}

fn port_into<H: Hasher>(hasher: &mut H, port: Option<u16>) {
    match port {
        None => hasher.write_u8(0),
        Some(port) => {
            hasher.write_u8(1);
            hasher.write_u16(port);
        }
    }
}

fn traffic_into<H: Hasher>(hasher: &mut H, traffic: Option<&TrafficPlan>) {
    match traffic {
        None => hasher.write_u8(0),
        Some(TrafficPlan { policy, when_empty }) => {
            hasher.write_u8(match policy {
                TrafficPolicy::Cluster => 1,
                TrafficPolicy::Local => 2,
            });
            hasher.write_u8(match when_empty {
                EmptyAction::Reject => 1,
                EmptyAction::Drop => 2,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_equal_the_crds_definition() {
        let cases: [&[&str]; 4] = [
            &[],
            &["-j ACCEPT"],
            &[
                "-m comment --comment \"a \\\"quoted\\\" comment\" -j X",
                "tab\there",
            ],
            &[
                "",
                "-m statistic --mode random --probability 0.5000000000 -j Y",
            ],
        ];
        for rules in cases {
            let owned: Vec<String> = rules.iter().map(|r| (*r).to_owned()).collect();
            let expected = proxyplan_crds::revision_of(&owned);
            assert_eq!(revision_text(RevisionHasher::of(rules)), expected);
            assert_eq!(parse_revision(&expected), Some(RevisionHasher::of(rules)));
        }
        assert_eq!(parse_revision("0123456789ABCDEF"), None);
        assert_eq!(parse_revision("abc"), None);
    }

    fn entry_hash(entry: &ServicePortPlan) -> u64 {
        let mut hasher = ContentHasher::default();
        hash_entry(&mut hasher, entry);
        hasher.finish()
    }

    #[test]
    fn entry_hashes_tell_entries_apart() {
        let base = ServicePortPlan {
            key: "ns/a:p/TCP/IPv4".into(),
            namespace: "ns".into(),
            name: "a".into(),
            port_name: "p".into(),
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
            cluster_endpoints: vec![Endpoint {
                ip: "10.0.0.1".into(),
                port: 8080,
            }],
            zone_endpoints: Vec::new(),
            local_endpoints: vec![],
            masquerade: MasqueradePlan {
                all: false,
                off_cluster_to_cluster_ip: true,
                external: false,
                local_host_to_external: false,
                hairpin: true,
            },
            local_terminating: false,
            also_serving: Vec::new(),
        };
        type Change = Box<dyn Fn(&mut ServicePortPlan)>;
        let variants: Vec<Change> = vec![
            Box::new(|_| {}),
            Box::new(|e| e.key.push('x')),
            Box::new(|e| e.port_name.clear()),
            Box::new(|e| e.protocol = Protocol::UDP),
            Box::new(|e| e.port = 81),
            Box::new(|e| e.external_ips.push("1.2.3.4".into())),
            Box::new(|e| {
                e.load_balancer_ips.push(LoadBalancerIp {
                    ip: "1.2.3.4".into(),
                    mode: LoadBalancerIpMode::VIP,
                });
            }),
            Box::new(|e| {
                e.load_balancer_ips.push(LoadBalancerIp {
                    ip: "1.2.3.4".into(),
                    mode: LoadBalancerIpMode::Proxy,
                });
            }),
            Box::new(|e| e.node_port = Some(30080)),
            Box::new(|e| e.health_check_node_port = Some(30080)),
            Box::new(|e| e.load_balancer_source_ranges.push("1.2.3.4".into())),
            Box::new(|e| e.session_affinity = Some(SessionAffinity { timeout_seconds: 9 })),
            Box::new(|e| e.internal.when_empty = EmptyAction::Drop),
            Box::new(|e| e.external = Some(e.internal)),
            Box::new(|e| e.cluster_endpoints[0].port = 8081),
            Box::new(|e| e.cluster_endpoints[0].ip = "10.0.0.10".into()),
            Box::new(|e| {
                let moved = e.cluster_endpoints.remove(0);
                e.local_endpoints.push(moved);
            }),
            Box::new(|e| e.masquerade.all = true),
            Box::new(|e| e.masquerade.hairpin = false),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for (i, change) in variants.iter().enumerate() {
            let mut entry = base.clone();
            change(&mut entry);
            assert!(seen.insert(entry_hash(&entry)), "variant {i}");
            assert_eq!(entry_hash(&entry), entry_hash(&entry.clone()));
        }
    }

    #[test]
    fn byte_hashes_differ_in_every_length_and_word() {
        let mut seen = std::collections::BTreeSet::new();
        let base: Vec<u8> = (0..100u8).collect();
        for len in 0..base.len() {
            assert!(seen.insert(hash_bytes(&base[..len])), "length {len}");
        }
        for i in 0..base.len() {
            let mut changed = base.clone();
            changed[i] ^= 1;
            assert!(seen.insert(hash_bytes(&changed)), "byte {i}");
        }
        assert_eq!(hash_bytes(&base), hash_bytes(&base.clone()));
    }
}
