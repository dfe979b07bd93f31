//! Choosing the proxy mode and leaving the others behind: `--mode auto` probes the
//! kernel for nftables, and a mode that starts removes what the agent owns of the other
//! modes (as kube-proxy does when its mode changes), so switching modes on a running
//! node leaves nothing of the old one.
//!
//! The old mode's rules go only once the new mode has programmed the kernel (its first
//! successful sync, [`LeavingOtherModes`]): until then the old rules keep serving new
//! connections, so a mode switch never leaves a node without rules. The one exception is
//! ipvs mode's frame when iptables mode starts: both use the same `PROXYPLAN-*` chains,
//! which ipvs mode's cleanup would delete after iptables mode wrote them, so those go
//! first and iptables mode's first sync rewrites them.

use std::sync::Arc;

use proxyplan_agent::dataplane::{ChangeAlarm, Dataplane, DataplaneError, SyncReport};
use proxyplan_agent::kernel::link::Links;
use proxyplan_agent::kernel::nftables::uapi::{NFPROTO_IPV4, NFPROTO_IPV6};
use proxyplan_agent::kernel::nftables::{NetlinkNft, NftKernel};
use proxyplan_agent::modes::nftables::names::TABLE;
use proxyplan_agent::modes::nftables::probe;
use proxyplan_agent::run::ProxyMode;
use proxyplan_crds::MergedPlan;

/// The mode for `--mode auto`: nftables when the kernel takes everything nftables mode
/// writes (checked without changing anything), iptables otherwise; and why.
pub fn auto_mode() -> (ProxyMode, String) {
    match probe(&mut NetlinkNft::new()) {
        Ok(()) => (
            ProxyMode::Nftables,
            "--mode auto: this kernel supports nftables mode, using it".to_owned(),
        ),
        Err(why) => (
            ProxyMode::Iptables,
            format!("--mode auto: {why}; using iptables mode instead"),
        ),
    }
}

/// Whether the agent's nf_tables tables exist (false when nf_tables cannot be asked).
fn nftables_tables() -> bool {
    let mut kernel = NetlinkNft::new();
    [NFPROTO_IPV4, NFPROTO_IPV6]
        .into_iter()
        .any(|family| kernel.table_exists(family, TABLE).unwrap_or(false))
}

/// Whether the ipvs mode's dummy interface exists.
fn ipvs_interface(name: &str) -> bool {
    Links::open()
        .ok()
        .and_then(|mut links| links.link_index(name).ok().flatten())
        .is_some()
}

/// The other modes whose leftovers `mode` removes: those that must go before its first
/// sync, and those that go once it has programmed the kernel.
pub fn other_modes(mode: ProxyMode, ipvs_interface_name: &str) -> (Vec<ProxyMode>, Vec<ProxyMode>) {
    let (mut before, mut after) = (Vec::new(), Vec::new());
    if mode != ProxyMode::Nftables && nftables_tables() {
        after.push(ProxyMode::Nftables);
    }
    if mode != ProxyMode::Ipvs && ipvs_interface(ipvs_interface_name) {
        // ipvs mode's cleanup also removes the iptables chains both it and iptables mode
        // use: before iptables mode writes them, after nftables mode took over.
        if mode == ProxyMode::Iptables {
            before.push(ProxyMode::Ipvs);
        } else {
            after.push(ProxyMode::Ipvs);
        }
    }
    if mode == ProxyMode::Nftables {
        after.push(ProxyMode::Iptables);
    }
    (before, after)
}

/// Removes what the agent owns of `others`, for `mode`; `dataplane` builds a mode's
/// dataplane. Returns what was done, one line each, for the log.
pub fn remove_modes(
    mode: ProxyMode,
    others: &[ProxyMode],
    dataplane: &dyn Fn(ProxyMode) -> Box<dyn Dataplane + Send>,
) -> Vec<String> {
    let mut done = Vec::new();
    for &other in others {
        match dataplane(other).cleanup() {
            Ok(report) if report.changed > 0 => done.push(format!(
                "switching to {mode} mode: removed what {other} mode left ({} objects)",
                report.changed
            )),
            Ok(_) => {}
            Err(err) => done.push(format!(
                "switching to {mode} mode: could not remove what {other} mode may have left: {err}"
            )),
        }
    }
    done
}

/// What runs once the new mode has programmed the kernel: the removal of the other
/// modes' leftovers, returning one line per thing done.
pub type Deferred = Box<dyn FnOnce() -> Vec<String> + Send>;

/// A mode's dataplane that removes the other modes' leftovers after its first successful
/// sync (never after a dry run), logging what it removed.
pub struct LeavingOtherModes<D> {
    inner: D,
    pending: Option<Deferred>,
    log: fn(&str),
}

impl<D: Dataplane> LeavingOtherModes<D> {
    /// `inner`, running `deferred` (if any) after its first successful sync and passing
    /// each line it returns to `log`.
    pub fn new(inner: D, deferred: Option<Deferred>, log: fn(&str)) -> Self {
        Self {
            inner,
            pending: deferred,
            log,
        }
    }

    fn after(&mut self, result: &Result<SyncReport, DataplaneError>, dry_run: bool) {
        if dry_run || result.is_err() {
            return;
        }
        if let Some(deferred) = self.pending.take() {
            for done in deferred() {
                (self.log)(&done);
            }
        }
    }
}

impl<D: Dataplane> Dataplane for LeavingOtherModes<D> {
    fn sync(&mut self, plan: &MergedPlan, dry_run: bool) -> Result<SyncReport, DataplaneError> {
        let result = self.inner.sync(plan, dry_run);
        self.after(&result, dry_run);
        result
    }

    fn sync_shared(
        &mut self,
        plan: &Arc<MergedPlan>,
        dry_run: bool,
    ) -> Result<SyncReport, DataplaneError> {
        let result = self.inner.sync_shared(plan, dry_run);
        self.after(&result, dry_run);
        result
    }

    fn rules_intact(&mut self) -> Result<bool, DataplaneError> {
        self.inner.rules_intact()
    }

    fn holds_rules(&mut self) -> Result<bool, DataplaneError> {
        self.inner.holds_rules()
    }

    fn change_alarm(&mut self) -> Option<Box<dyn ChangeAlarm>> {
        self.inner.change_alarm()
    }

    fn cleanup(&mut self) -> Result<SyncReport, DataplaneError> {
        self.inner.cleanup()
    }
}

/// Whether `mode` may have left something on this node (for `cleanup --mode auto`,
/// which skips a mode the kernel cannot even run: no nf_tables, no dummy interface).
pub fn may_have_left(mode: ProxyMode, ipvs_interface_name: &str) -> bool {
    match mode {
        ProxyMode::Nftables => nftables_tables(),
        ProxyMode::Ipvs => ipvs_interface(ipvs_interface_name),
        ProxyMode::Iptables => true,
    }
}
