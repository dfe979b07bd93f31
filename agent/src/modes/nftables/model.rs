//! What the kernel holds of one family's table, read once (on the first sync, after a
//! failure, when the tamper check finds the table changed): its chains with a hash of
//! each rule, its sets with their definitions and, compactly, their elements.
//!
//! Elements of a set are fixed-size records (key, then data) in one sorted buffer,
//! verdicts as an index into the chain names they name: 260,000 elements of a table of
//! 10,000 Services take about 6 MB instead of two allocations each.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use super::names;
use super::sink::nfproto;
use crate::dataplane::DataplaneError;
use crate::kernel::Family;
use crate::kernel::nftables::objects::userdata_comment;
use crate::kernel::nftables::uapi::NFT_DATA_VERDICT;
use crate::kernel::nftables::{Data, ElementData, Expr, Hook, NftKernel, Set, TableItem, Verdict};

/// How many times a read that the ruleset changed under is started again.
const READ_ATTEMPTS: usize = 5;

/// A hash of a rule as the kernel holds it: its canonical expressions and userdata.
#[must_use]
pub fn rule_hash(exprs: &[Expr], userdata: Option<&[u8]>) -> u64 {
    let mut h = DefaultHasher::new();
    for e in exprs {
        e.canonical().hash(&mut h);
    }
    userdata.hash(&mut h);
    h.finish()
}

/// A chain as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldChain {
    /// Its hook, for a base chain.
    pub hook: Option<Hook>,
    /// A hash of each rule, in order.
    pub rules: Vec<u64>,
}

/// The elements of one set, as sorted fixed-size records.
#[derive(Debug, Clone, Default)]
pub struct Records {
    key_len: usize,
    /// Bytes of data: the map's data length, 8 for a verdict (code, chain index), 0 for
    /// a set.
    data_len: usize,
    verdicts: bool,
    bytes: Vec<u8>,
    seen: Vec<u64>,
    /// Chain names verdicts name.
    chains: Vec<String>,
    chain_ids: HashMap<String, u32>,
    /// An element whose key or data did not have the set's length: the set is not as
    /// the agent makes them.
    pub odd: bool,
}

impl Records {
    fn new(set: &Set) -> Self {
        let verdicts = set.data_type == Some(NFT_DATA_VERDICT);
        Self {
            key_len: set.key_len as usize,
            data_len: if verdicts {
                8
            } else {
                set.data_len.unwrap_or(0) as usize
            },
            verdicts,
            ..Self::default()
        }
    }

    fn record_len(&self) -> usize {
        (self.key_len + self.data_len).max(1)
    }

    fn push(&mut self, key: &[u8], data: &ElementData<'_>) {
        if key.len() != self.key_len {
            self.odd = true;
            return;
        }
        let start = self.bytes.len();
        self.bytes.extend_from_slice(key);
        match data {
            ElementData::None if self.data_len == 0 => {}
            ElementData::Value(v) if !self.verdicts && v.len() == self.data_len => {
                self.bytes.extend_from_slice(v);
            }
            ElementData::Verdict(v) if self.verdicts => {
                let id = match v.chain() {
                    Some(chain) => {
                        let next = self.chains.len() as u32;
                        let id = *self.chain_ids.entry(chain.to_owned()).or_insert(next);
                        if id == next {
                            self.chains.push(chain.to_owned());
                        }
                        id
                    }
                    None => u32::MAX,
                };
                self.bytes.extend_from_slice(&v.code().to_ne_bytes());
                self.bytes.extend_from_slice(&id.to_ne_bytes());
            }
            _ => {
                self.bytes.truncate(start);
                self.odd = true;
            }
        }
    }

    fn finish(&mut self) {
        let len = self.record_len();
        let count = self.bytes.len() / len;
        let mut order: Vec<u32> = (0..count as u32).collect();
        let key_len = self.key_len;
        order.sort_unstable_by(|a, b| {
            let ka = self
                .bytes
                .get(*a as usize * len..*a as usize * len + key_len);
            let kb = self
                .bytes
                .get(*b as usize * len..*b as usize * len + key_len);
            ka.cmp(&kb)
        });
        let mut sorted = Vec::with_capacity(self.bytes.len());
        for i in order {
            let at = i as usize * len;
            sorted.extend_from_slice(self.bytes.get(at..at + len).unwrap_or_default());
        }
        self.bytes = sorted;
        self.seen = vec![0; count.div_ceil(64)];
    }

    /// How many elements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.bytes.len() / self.record_len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn key_at(&self, i: usize) -> &[u8] {
        let at = i * self.record_len();
        self.bytes.get(at..at + self.key_len).unwrap_or_default()
    }

    fn find(&self, key: &[u8]) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = usize::midpoint(lo, hi);
            match self.key_at(mid).cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    fn data_equals(&self, i: usize, data: Option<&Data>) -> bool {
        let at = i * self.record_len() + self.key_len;
        let held = self.bytes.get(at..at + self.data_len).unwrap_or_default();
        match data {
            None => self.data_len == 0,
            Some(Data::Value(v)) => !self.verdicts && held == v.as_slice(),
            Some(Data::Verdict(v)) => {
                if !self.verdicts {
                    return false;
                }
                let code = held
                    .get(..4)
                    .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                let id = held
                    .get(4..8)
                    .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                let chain = id
                    .and_then(|id| self.chains.get(id as usize))
                    .map(String::as_str);
                code == Some(v.code()) && chain == v.chain()
            }
        }
    }

    /// The data of the element with `key` (empty for a set's element), if it is held.
    #[must_use]
    pub fn value(&self, key: &[u8]) -> Option<&[u8]> {
        let i = self.find(key)?;
        let at = i * self.record_len() + self.key_len;
        self.bytes.get(at..at + self.data_len)
    }

    /// The verdict of a verdict map's element with `key`, if it is held.
    #[must_use]
    pub fn verdict(&self, key: &[u8]) -> Option<Verdict> {
        if !self.verdicts {
            return None;
        }
        let held = self.value(key)?;
        let code = i32::from_ne_bytes(held.get(..4)?.try_into().ok()?);
        let id = u32::from_ne_bytes(held.get(4..8)?.try_into().ok()?);
        let chain = self.chains.get(id as usize).cloned();
        Verdict::from_code(code, chain).ok()
    }

    /// Looks `key` up, marks it seen, and says whether it is held with `data`.
    pub fn check(&mut self, key: &[u8], data: Option<&Data>) -> Presence {
        let Some(i) = self.find(key) else {
            return Presence::Absent;
        };
        if let Some(word) = self.seen.get_mut(i / 64) {
            *word |= 1 << (i % 64);
        }
        if self.data_equals(i, data) {
            Presence::Same
        } else {
            Presence::Different
        }
    }

    /// Keys of the elements [`Records::check`] never asked for.
    pub fn unseen(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len())
            .filter(|i| {
                self.seen
                    .get(i / 64)
                    .is_none_or(|w| w & (1 << (i % 64)) == 0)
            })
            .map(|i| self.key_at(i))
    }
}

/// Whether the kernel holds an element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Not at all.
    Absent,
    /// With the same data.
    Same,
    /// With other data.
    Different,
}

/// A set as the kernel holds it.
#[derive(Debug, Clone)]
pub struct HeldSet {
    /// Its definition.
    pub set: Set,
    /// Its elements (none read for a dynamic set).
    pub records: Records,
}

/// One family's table as the kernel holds it.
#[derive(Debug, Clone, Default)]
pub struct HeldTable {
    /// Whether the table exists.
    pub exists: bool,
    /// Its chains by name.
    pub chains: HashMap<String, HeldChain>,
    /// Its sets by name.
    pub sets: HashMap<String, HeldSet>,
    /// The table's comment.
    pub comment: Option<String>,
}

impl HeldTable {
    /// Reads the table of `family` and the generation it was read at (read again while
    /// the ruleset changes under the read).
    ///
    /// # Errors
    /// When it cannot be read.
    pub fn read(kernel: &mut dyn NftKernel, family: Family) -> Result<(Self, u32), DataplaneError> {
        let mut last = None;
        for _ in 0..READ_ATTEMPTS {
            let before = kernel.generation()?;
            match Self::read_once(kernel, family) {
                Ok(table) => {
                    let after = kernel.generation()?;
                    if after == before {
                        return Ok((table, after));
                    }
                }
                Err(DataplaneError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            last = Some(());
        }
        let _ = last;
        Err(DataplaneError::io(
            format!("reading nf_tables table {}", names::TABLE),
            std::io::Error::other("the ruleset kept changing during the read"),
        ))
    }

    fn read_once(kernel: &mut dyn NftKernel, family: Family) -> Result<Self, DataplaneError> {
        let mut table = Self::default();
        let exists = kernel.read_table(nfproto(family), names::TABLE, &mut |item| match item {
            TableItem::Chain(chain) => {
                table.chains.insert(
                    chain.name,
                    HeldChain {
                        hook: chain.hook,
                        rules: Vec::new(),
                    },
                );
            }
            TableItem::Set(set) => {
                let records = Records::new(&set);
                table
                    .sets
                    .insert(set.name.clone(), HeldSet { set, records });
            }
            TableItem::Rule(rule) => {
                if let Some(chain) = table.chains.get_mut(&rule.chain) {
                    chain
                        .rules
                        .push(rule_hash(&rule.exprs, rule.userdata.as_deref()));
                }
            }
            TableItem::Element { set, element } => {
                if let Some(held) = table.sets.get_mut(set) {
                    held.records.push(element.key, &element.data);
                }
            }
        })?;
        table.exists = exists;
        for set in table.sets.values_mut() {
            set.records.finish();
        }
        let _ = userdata_comment;
        Ok(table)
    }

    /// Elements held over all sets.
    #[must_use]
    pub fn elements(&self) -> usize {
        self.sets.values().map(|s| s.records.len()).sum()
    }
}

/// A verdict map's data as the records keep it, for tests.
#[must_use]
pub fn verdict_data(v: &Verdict) -> Data {
    Data::Verdict(v.clone())
}
