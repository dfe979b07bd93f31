//! The seam between the sync loop and the kernel: one trait, a real implementation per
//! proxy mode, and fakes in tests.

use std::sync::Arc;

use proxyplan_crds::MergedPlan;

pub use crate::kernel::ChangeAlarm;
pub use crate::kernel::error::DataplaneError;

/// Bytes of [`SyncReport::payload`] a real (not dry-run) sync keeps: the beginning, and a
/// last line saying what was left out. The run loop never reads it; a first sync of
/// 10,000 Services sends about 10 MB, which is never held (a dry run keeps all of it).
pub const REPORT_TEXT_LIMIT: usize = 64 << 10;

/// What one sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Rules (or IPVS objects) the kernel holds for the plan after the sync.
    pub rules: usize,
    /// Chains (or objects) rewritten, created or deleted by this sync.
    pub changed: usize,
    /// Stale UDP conntrack entries deleted.
    pub conntrack_deleted: usize,
    /// The exact text sent to the kernel tools (empty when nothing changed), for
    /// `--dry-run` and debugging; a real sync keeps its first [`REPORT_TEXT_LIMIT`] bytes.
    pub payload: String,
    /// How long each step of the sync took (ipvs mode: `sets`, `vips`, `ipvs`, ...), for
    /// logs and benchmarks.
    pub phases: Vec<(&'static str, std::time::Duration)>,
    /// The stale-UDP conntrack step, when the mode ran it.
    pub conntrack: Option<crate::kernel::conntrack::ConntrackRun>,
}

impl SyncReport {
    /// Records the stale-UDP conntrack step: its count, and (unless it was a dry run)
    /// the run itself for the conntrack reconciler metrics.
    pub fn conntrack_step(&mut self, run: crate::kernel::conntrack::ConntrackRun, dry_run: bool) {
        self.conntrack_deleted = run.total();
        self.conntrack = (!dry_run).then_some(run);
    }
}

/// A proxy mode's kernel programming.
pub trait Dataplane {
    /// Brings the kernel to `plan`, sending only the difference to what it holds.
    /// With `dry_run`, computes and returns the payload without touching the kernel.
    ///
    /// # Errors
    /// When the kernel could not be brought to the plan; the previous state stays.
    fn sync(&mut self, plan: &MergedPlan, dry_run: bool) -> Result<SyncReport, DataplaneError>;

    /// [`Dataplane::sync`] of a plan the caller shares: a dataplane may keep it to compare
    /// the next plan with, entry by entry.
    ///
    /// # Errors
    /// As [`Dataplane::sync`].
    fn sync_shared(
        &mut self,
        plan: &Arc<MergedPlan>,
        dry_run: bool,
    ) -> Result<SyncReport, DataplaneError> {
        self.sync(plan, dry_run)
    }

    /// Whether the agent's rules are still in place (the canary chain exists). When it
    /// returns false, the next sync re-reads the kernel and restores everything (nftables
    /// mode has restored them already, from the read that found them changed).
    ///
    /// # Errors
    /// When the check itself could not run.
    fn rules_intact(&mut self) -> Result<bool, DataplaneError>;

    /// Whether the kernel holds this mode's rules at all, read from the kernel whatever
    /// this process programmed or read before: a restarted agent answers health checks
    /// from the previous agent's record only when this is true. (Unlike
    /// [`Dataplane::rules_intact`], never true by default before a first sync.)
    ///
    /// # Errors
    /// When the kernel cannot be asked.
    fn holds_rules(&mut self) -> Result<bool, DataplaneError>;

    /// An alarm for a thread of its own to wait on, which goes off when someone else may
    /// have changed this mode's rules, so that [`Dataplane::rules_intact`] is asked at once
    /// instead of at the next tamper check; `None` (the default) when the mode has none.
    fn change_alarm(&mut self) -> Option<Box<dyn ChangeAlarm>> {
        None
    }

    /// Removes everything the agent owns, and nothing else.
    ///
    /// # Errors
    /// When something could not be removed.
    fn cleanup(&mut self) -> Result<SyncReport, DataplaneError>;
}
