//! What one family's table should hold, as counts and owners kept between syncs: which
//! entry owns each destination (several may claim one: two Services with the same
//! external IP and port; the claimant with the smallest key hash wins, whatever the
//! order they came in, so a restart finds the same owner), how many entries want each
//! hairpin element, cluster IP and shared chain. Element values are not stored: they
//! are rendered again from the entry that owns them.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proxyplan_crds::stable_hash;

use super::layout::FamilyContext;
use super::names::SharedChain;
use super::render::Dest;

/// Who claims a destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The owner: the claimant whose key hash is smallest.
    pub owner: u64,
    /// The other claimants.
    pub others: Vec<u64>,
}

/// The hash of an entry's key, which decides who owns a contested destination.
#[must_use]
pub fn key_hash(key: &str) -> u64 {
    stable_hash(key.as_bytes())
}

/// What one family's table holds (after a successful sync), as owners and counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyState {
    /// The inputs it was rendered with.
    pub ctx: FamilyContext,
    /// Owners of destinations.
    pub claims: HashMap<Dest, Claim>,
    /// Entries per hairpin element `(endpoint, protocol, port)`.
    pub hairpin: HairpinCounts,
    /// Entries per cluster IP.
    pub cluster_ips: HashMap<IpAddr, u32>,
    /// Owned destinations per shared chain.
    pub shared: HashMap<SharedChain, u32>,
    /// Entries of this family.
    pub entries: usize,
}

/// Entries per hairpin element `(endpoint, protocol, port)`. A table has one element
/// per endpoint: an IPv4 one is kept in 12 bytes instead of 24 (1.5 MB less at 100,000
/// endpoints).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HairpinCounts {
    v4: HashMap<(u32, u32), u32>,
    v6: HashMap<(Ipv6Addr, u8, u16), u32>,
}

/// An IPv4 element, packed: the address, then protocol and port.
fn pack4(ip: Ipv4Addr, proto: u8, port: u16) -> (u32, u32) {
    (u32::from(ip), u32::from(proto) << 16 | u32::from(port))
}

impl HairpinCounts {
    /// One more entry wants `element`; true when it is the first.
    pub fn increment(&mut self, (ip, proto, port): (IpAddr, u8, u16)) -> bool {
        match ip {
            IpAddr::V4(ip) => increment(&mut self.v4, pack4(ip, proto, port)),
            IpAddr::V6(ip) => increment(&mut self.v6, (ip, proto, port)),
        }
    }

    /// One fewer; true when it was the last.
    pub fn decrement(&mut self, (ip, proto, port): (IpAddr, u8, u16)) -> bool {
        match ip {
            IpAddr::V4(ip) => decrement(&mut self.v4, pack4(ip, proto, port)),
            IpAddr::V6(ip) => decrement(&mut self.v6, (ip, proto, port)),
        }
    }

    /// Whether some entry wants `element`.
    #[must_use]
    pub fn contains(&self, (ip, proto, port): (IpAddr, u8, u16)) -> bool {
        match ip {
            IpAddr::V4(ip) => self.v4.contains_key(&pack4(ip, proto, port)),
            IpAddr::V6(ip) => self.v6.contains_key(&(ip, proto, port)),
        }
    }

    /// How many elements are wanted.
    #[must_use]
    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    /// Whether none is.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Adds one to a count; true when it was 0.
pub fn increment<K: std::hash::Hash + Eq>(map: &mut HashMap<K, u32>, key: K) -> bool {
    let count = map.entry(key).or_insert(0);
    *count += 1;
    *count == 1
}

/// Takes one from a count; true when it reaches 0.
pub fn decrement<K: std::hash::Hash + Eq>(map: &mut HashMap<K, u32>, key: K) -> bool {
    if let Entry::Occupied(mut slot) = map.entry(key) {
        *slot.get_mut() -= 1;
        if *slot.get() == 0 {
            slot.remove();
            return true;
        }
    }
    false
}

impl FamilyState {
    /// Nothing held.
    #[must_use]
    pub fn new(ctx: FamilyContext) -> Self {
        Self {
            ctx,
            claims: HashMap::new(),
            hairpin: HairpinCounts::default(),
            cluster_ips: HashMap::new(),
            shared: HashMap::new(),
            entries: 0,
        }
    }

    /// The owner of `dest`.
    #[must_use]
    pub fn owner(&self, dest: &Dest) -> Option<u64> {
        self.claims.get(dest).map(|c| c.owner)
    }

    /// `hash` claims `dest`.
    pub fn claim(&mut self, dest: Dest, hash: u64) {
        match self.claims.entry(dest) {
            Entry::Vacant(slot) => {
                slot.insert(Claim {
                    owner: hash,
                    others: Vec::new(),
                });
            }
            Entry::Occupied(mut slot) => {
                let claim = slot.get_mut();
                if hash < claim.owner {
                    claim.others.push(claim.owner);
                    claim.owner = hash;
                } else {
                    claim.others.push(hash);
                }
            }
        }
    }

    /// `hash` no longer claims `dest`.
    pub fn release(&mut self, dest: &Dest, hash: u64) {
        let Some(claim) = self.claims.get_mut(dest) else {
            return;
        };
        if claim.owner == hash {
            match claim
                .others
                .iter()
                .copied()
                .enumerate()
                .min_by_key(|(_, h)| *h)
            {
                Some((i, next)) => {
                    claim.others.swap_remove(i);
                    claim.owner = next;
                }
                None => {
                    self.claims.remove(dest);
                }
            }
        } else if let Some(i) = claim.others.iter().position(|h| *h == hash) {
            claim.others.swap_remove(i);
        }
    }

    /// One more owned destination goes to `shared` (true: the first).
    pub fn use_shared(&mut self, shared: SharedChain) -> bool {
        increment(&mut self.shared, shared)
    }

    /// One fewer (true: the last).
    pub fn unuse_shared(&mut self, shared: SharedChain) -> bool {
        decrement(&mut self.shared, shared)
    }

    /// Objects of the table that the plan wants: owned destinations, hairpin elements,
    /// cluster IPs and shared chains (for the rules gauge).
    #[must_use]
    pub fn objects(&self) -> usize {
        self.claims.len() + self.hairpin.len() + self.cluster_ips.len() + self.shared.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Elements are counted per entry and told apart by address, protocol and port, in
    /// both families.
    #[test]
    fn hairpin_elements_are_counted_per_address_protocol_and_port() {
        let mut counts = HairpinCounts::default();
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert!(counts.increment((v4, 6, 80)));
        assert!(!counts.increment((v4, 6, 80)), "a second entry");
        assert!(counts.increment((v4, 17, 80)), "another protocol");
        assert!(counts.increment((v4, 6, 81)), "another port");
        assert!(counts.increment((v6, 6, 80)));
        assert_eq!(counts.len(), 4);
        assert!(!counts.decrement((v4, 6, 80)));
        assert!(counts.contains((v4, 6, 80)));
        assert!(counts.decrement((v4, 6, 80)), "the last entry");
        assert!(!counts.contains((v4, 6, 80)));
        assert!(counts.contains((v4, 17, 80)) && counts.contains((v6, 6, 80)));
        assert!(!counts.contains(("10.0.0.2".parse().unwrap(), 6, 80)));
    }
}
