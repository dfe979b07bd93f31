//! The changes between the ipsets the ipvs mode wants and those the kernel holds, as
//! [`SetOp`]s in the order they are sent, and their sending.

#[cfg(test)]
use std::collections::BTreeSet;

use super::servers::OPS_PER_ROUND;
use crate::kernel::error::DataplaneError;
#[cfg(test)]
use crate::kernel::ipset::Sets;
use crate::kernel::ipset::{self, SetEntry, SetOp, SetSpec};
use crate::kernel::ipvs::IpvsKernel;

/// Set changes written out in a sync's report (a dry run writes all).
const SET_LINES_SHOWN: usize = 1000;

/// One change to the agent's sets; the set is an index into [`SetChanges::names`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetChange {
    /// Create the set.
    Create(usize, SetSpec),
    /// Add an entry.
    Add(usize, SetEntry),
    /// Delete an entry.
    Del(usize, SetEntry),
    /// Destroy the set.
    Destroy(usize),
}

/// The set changes that bring `kernel` to `desired`: `before` creates sets and changes
/// entries (sent before the iptables rules that use them), `after` destroys sets nothing
/// wants any more (sent after the rules that used them are gone). Each change names its
/// set by index, so a first apply's 150,000 additions hold no name each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetChanges {
    /// The sets changed.
    pub names: Vec<String>,
    /// Creates, adds and dels.
    pub before: Vec<SetChange>,
    /// Destroys.
    pub after: Vec<SetChange>,
    /// Sets whose type differs from the wanted one (they must be removed first).
    pub mismatched: Vec<String>,
}

impl SetChanges {
    fn index(&mut self, name: &str) -> usize {
        match self.names.iter().rposition(|n| n == name) {
            Some(i) => i,
            None => {
                self.names.push(name.to_owned());
                self.names.len() - 1
            }
        }
    }

    /// Creates set `name`.
    pub fn create(&mut self, name: &str, spec: SetSpec) {
        let i = self.index(name);
        self.before.push(SetChange::Create(i, spec));
    }

    /// Adds `entry` to set `name`.
    pub fn add(&mut self, name: &str, entry: &SetEntry) {
        let i = self.index(name);
        self.before.push(SetChange::Add(i, *entry));
    }

    /// Deletes `entry` from set `name`.
    pub fn del(&mut self, name: &str, entry: &SetEntry) {
        let i = self.index(name);
        self.before.push(SetChange::Del(i, *entry));
    }

    /// Destroys set `name` (after the rules that used it are gone).
    pub fn destroy(&mut self, name: &str) {
        let i = self.index(name);
        self.after.push(SetChange::Destroy(i));
    }

    /// Number of sets created or destroyed plus entries added or deleted.
    #[must_use]
    pub fn changed(&self) -> usize {
        self.before.len() + self.after.len()
    }

    /// The name of a change's set.
    #[must_use]
    pub fn name(&self, change: &SetChange) -> &str {
        let (SetChange::Create(i, _)
        | SetChange::Add(i, _)
        | SetChange::Del(i, _)
        | SetChange::Destroy(i)) = *change;
        self.names.get(i).map_or("", String::as_str)
    }

    /// A change as the operation sent to the kernel.
    #[must_use]
    pub fn op(&self, change: &SetChange) -> SetOp<'_> {
        let name = self.name(change);
        match *change {
            SetChange::Create(_, spec) => SetOp::Create { name, spec },
            SetChange::Add(_, entry) => SetOp::Add(name, entry),
            SetChange::Del(_, entry) => SetOp::Del(name, entry),
            SetChange::Destroy(_) => SetOp::Destroy(name),
        }
    }

    /// `changes` as operations, in order.
    pub fn ops<'a>(&'a self, changes: &'a [SetChange]) -> impl Iterator<Item = SetOp<'a>> {
        changes.iter().map(|change| self.op(change))
    }

    /// `changes` as an `ipset restore` script, for dry runs and logs.
    #[must_use]
    pub fn script(&self, changes: &[SetChange]) -> String {
        let mut out = String::new();
        for op in self.ops(changes) {
            out.push_str(&op.to_string());
            out.push('\n');
        }
        out
    }

    /// Compares `desired` with `kernel` set by set: the reference the ipvs dataplane's
    /// count-based [`super::desired::Desired::set_changes`] is tested against.
    #[cfg(test)]
    #[must_use]
    pub fn between(desired: &Sets, kernel: &Sets) -> Self {
        let mut out = Self::default();
        for (name, want) in desired {
            let have = kernel.get(name);
            match have {
                Some(have) if have.spec != want.spec => {
                    out.mismatched.push(name.clone());
                    continue;
                }
                Some(_) => {}
                None => out.create(name, want.spec),
            }
            let empty = BTreeSet::new();
            let held = have.map_or(&empty, |h| &h.entries);
            for entry in want.entries.difference(held) {
                out.add(name, entry);
            }
            for entry in held.difference(&want.entries) {
                out.del(name, entry);
            }
        }
        for name in kernel.keys().filter(|n| !desired.contains_key(*n)) {
            out.destroy(name);
        }
        out
    }

    /// Whether nothing changes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.before.is_empty() && self.after.is_empty()
    }
}

/// Sends set operations over netlink in rounds and writes them to `payload` (in full
/// for a dry run, else only the first [`SET_LINES_SHOWN`]); returns how many there
/// were. Taking them as they come, a first apply's 150,000 additions are never all in
/// memory at once.
pub(super) fn send<'a>(
    kernel: &mut impl IpvsKernel,
    ops: impl Iterator<Item = SetOp<'a>>,
    dry_run: bool,
    payload: &mut String,
) -> Result<usize, DataplaneError> {
    let mut count = 0;
    let mut failures = Vec::new();
    let mut failed = 0;
    let mut round: Vec<SetOp<'a>> = Vec::new();
    let mut ops = ops.peekable();
    while ops.peek().is_some() {
        round.clear();
        round.extend(ops.by_ref().take(OPS_PER_ROUND));
        for op in &round {
            if count == 0 {
                payload.push_str("# ipset (netlink), as `ipset restore -exist` would take it\n");
            }
            count += 1;
            if dry_run || count <= SET_LINES_SHOWN {
                payload.push_str(&op.to_string());
                payload.push('\n');
            }
        }
        if dry_run {
            continue;
        }
        let results = kernel.set_ops(&round)?;
        for (op, errno) in round.iter().zip(results) {
            // Deleting an entry that is already gone is done.
            let done =
                errno == 0 || (matches!(op, SetOp::Del(..)) && errno == -ipset::IPSET_ERR_EXIST);
            if done {
                continue;
            }
            failed += 1;
            if failures.len() < 5 {
                let hint = if matches!(op, SetOp::Create { .. }) && errno == -17 {
                    " (a set of that name exists with another type or family: run \
                 `proxyplan-agent cleanup --mode ipvs` and restart the agent)"
                } else {
                    ""
                };
                failures.push(format!("{op}: {}{hint}", ipset::error_name(errno)));
            }
        }
    }
    if !dry_run && count > SET_LINES_SHOWN {
        payload.push_str(&format!(
            "# ... {} more set changes not shown\n",
            count - SET_LINES_SHOWN
        ));
    }
    match failures.first() {
        None => Ok(count),
        Some(first) => Err(DataplaneError::Io {
            context: format!("the kernel refused {failed} ipset change(s), first: {first}"),
            source: std::io::Error::other(failures.join("; ")),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::kernel::ipset::sets::tests::SAVE;
    use crate::kernel::ipset::{IpSet, SetType, parse_save};
    use crate::kernel::ipvs::IPPROTO_TCP;

    #[test]
    fn changes_entries_in_place_and_destroys_after_the_rules() {
        let kernel = parse_save(SAVE);
        let mut desired = Sets::new();
        let mut cluster = IpSet::new(SetType::HashIpPort, false);
        let tcp = u8::try_from(IPPROTO_TCP).unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        cluster
            .entries
            .insert(SetEntry::IpPort(ip("10.96.0.10"), tcp, 80));
        cluster
            .entries
            .insert(SetEntry::IpPort(ip("10.96.0.12"), tcp, 8080));
        desired.insert("PROXYPLAN-CLUSTER-IP".into(), cluster);
        desired.insert(
            "PROXYPLAN-NP-TCP".into(),
            kernel["PROXYPLAN-NP-TCP"].clone(),
        );
        desired.insert(
            "PROXYPLAN-DROP".into(),
            IpSet::new(SetType::HashIpPort, false),
        );
        desired.insert(
            "PROXYPLAN6-LB-SRC-CIDR".into(),
            IpSet::new(SetType::HashIpPort, true),
        );
        let changes = SetChanges::between(&desired, &kernel);
        assert_eq!(
            changes.script(&changes.before),
            "add PROXYPLAN-CLUSTER-IP 10.96.0.12,tcp:8080\n\
             del PROXYPLAN-CLUSTER-IP 10.96.0.11,udp:53\n\
             create PROXYPLAN-DROP hash:ip,port family inet hashsize 1024 maxelem 1048576\n"
        );
        assert_eq!(changes.script(&changes.after), "destroy PROXYPLAN-OLD\n");
        assert_eq!(changes.mismatched, ["PROXYPLAN6-LB-SRC-CIDR"]);
        assert_eq!(changes.changed(), 4);
        assert!(SetChanges::between(&kernel, &kernel).is_empty());
    }
}
