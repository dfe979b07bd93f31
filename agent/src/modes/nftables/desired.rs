//! What one family's table should hold, as counts and owners kept between syncs: which
//! entry owns each destination (several may claim one: two Services with the same
//! external IP and port; the claimant with the smallest key hash wins, whatever the
//! order they came in, so a restart finds the same owner), how many entries want each
//! hairpin element, cluster IP and shared chain. Element values are not stored: they
//! are rendered again from the entry that owns them.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::IpAddr;

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
    pub hairpin: HashMap<(IpAddr, u8, u16), u32>,
    /// Entries per cluster IP.
    pub cluster_ips: HashMap<IpAddr, u32>,
    /// Owned destinations per shared chain.
    pub shared: HashMap<SharedChain, u32>,
    /// Entries of this family.
    pub entries: usize,
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
            hairpin: HashMap::new(),
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
