//! When to sync: soon after a change but never more often than the minimum interval
//! (so a burst of changes costs one sync), at least every sync period (the periodic
//! resync with its check of the kernel), and after a failure again with backoff.
//!
//! The periodic deadline is kept by periodic syncs only: change-driven syncs never push
//! it back, so steady churn cannot starve the check that finds rules someone else
//! removed.

use std::time::Duration;

use tokio::time::Instant;

/// Why a sync runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    /// Something changed (or the last sync failed).
    Change,
    /// The periodic resync: check the canary, bring the kernel back to the plan.
    Periodic,
}

/// The sync timetable. Pure: every method takes the time it should consider.
#[derive(Debug, Clone)]
pub struct SyncSchedule {
    min_interval: Duration,
    period: Duration,
    dirty: bool,
    last_start: Option<Instant>,
    retry_at: Option<Instant>,
    failures: u32,
    next_periodic: Instant,
}

impl SyncSchedule {
    /// A schedule starting at `now`, with nothing to do yet.
    #[must_use]
    pub fn new(min_interval: Duration, period: Duration, now: Instant) -> Self {
        Self {
            min_interval,
            period,
            dirty: false,
            last_start: None,
            retry_at: None,
            failures: 0,
            next_periodic: now + period,
        }
    }

    /// Records a change that needs a sync.
    pub fn changed(&mut self) {
        self.dirty = true;
    }

    /// Whether a change waits for a sync.
    #[must_use]
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// The next sync: when and why. Changes wait while `ready` is false (the watches
    /// have not listed); the periodic resync does not.
    #[must_use]
    pub fn next(&self, ready: bool, now: Instant) -> (Instant, SyncKind) {
        if self.dirty && ready {
            let mut at = self.last_start.map_or(now, |t| t + self.min_interval);
            if let Some(retry) = self.retry_at {
                at = at.max(retry);
            }
            if at < self.next_periodic {
                return (at, SyncKind::Change);
            }
        }
        (self.next_periodic, SyncKind::Periodic)
    }

    /// Records that a sync of `kind` starts at `now`: pending changes are taken. A
    /// periodic sync moves the deadline on by whole periods (periodic syncs keep to a
    /// fixed grid, so one that started late, behind a change-driven sync, does not
    /// delay the next; ticks missed while a sync ran are skipped) and leaves the minimum
    /// interval alone: a change that arrives right after it goes at once, instead of
    /// waiting out an interval no burst asked for. A change-driven sync starts the
    /// minimum interval and leaves the periodic deadline where it is.
    pub fn started(&mut self, kind: SyncKind, now: Instant) {
        self.dirty = false;
        match kind {
            SyncKind::Change => self.last_start = Some(now),
            SyncKind::Periodic => {
                while self.next_periodic <= now {
                    self.next_periodic += self.period;
                }
            }
        }
    }

    /// Records that the sync succeeded.
    pub fn succeeded(&mut self) {
        self.failures = 0;
        self.retry_at = None;
    }

    /// Records that the sync failed at `now`: it is retried after a backoff that doubles
    /// from the minimum interval (at least 1 s) up to the sync period.
    pub fn failed(&mut self, now: Instant) {
        self.failures = self.failures.saturating_add(1);
        self.dirty = true;
        let base = self.min_interval.max(Duration::from_secs(1));
        let factor = 1u32 << self.failures.saturating_sub(1).min(16);
        let backoff = base.saturating_mul(factor).min(self.period.max(base));
        self.retry_at = Some(now + backoff);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(1);
    const PERIOD: Duration = Duration::from_secs(30);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn idle_schedule_waits_for_the_periodic_resync() {
        let t0 = Instant::now();
        let s = SyncSchedule::new(MIN, PERIOD, t0);
        assert_eq!(s.next(true, t0), (t0 + PERIOD, SyncKind::Periodic));
    }

    #[test]
    fn first_change_syncs_at_once_then_bursts_wait_for_the_minimum_interval() {
        let t0 = Instant::now();
        let mut s = SyncSchedule::new(MIN, PERIOD, t0);
        s.changed();
        assert_eq!(s.next(true, t0), (t0, SyncKind::Change));
        s.started(SyncKind::Change, t0);
        s.succeeded();
        // A burst right after: one sync, one minimum interval after the last.
        let t1 = t0 + Duration::from_millis(100);
        s.changed();
        s.changed();
        s.changed();
        assert_eq!(s.next(true, t1), (t0 + MIN, SyncKind::Change));
        // Long after the last sync, a change goes at once.
        let t2 = t0 + secs(10);
        assert_eq!(s.next(true, t2), (t0 + MIN, SyncKind::Change));
        assert!(t0 + MIN <= t2);
    }

    #[test]
    fn changes_wait_until_the_watches_listed_but_the_resync_does_not() {
        let t0 = Instant::now();
        let mut s = SyncSchedule::new(MIN, PERIOD, t0);
        s.changed();
        assert_eq!(s.next(false, t0), (t0 + PERIOD, SyncKind::Periodic));
        assert!(s.is_dirty());
    }

    #[test]
    fn change_syncs_leave_the_periodic_deadline_alone() {
        let t0 = Instant::now();
        let mut s = SyncSchedule::new(MIN, PERIOD, t0);
        s.changed();
        s.started(SyncKind::Change, t0 + secs(20));
        s.succeeded();
        assert_eq!(
            s.next(true, t0 + secs(21)),
            (t0 + PERIOD, SyncKind::Periodic)
        );
        // A change due after the periodic deadline waits for it: the periodic sync
        // brings the kernel to the plan too.
        s.changed();
        assert_eq!(
            s.next(true, t0 + secs(29)),
            (t0 + secs(21), SyncKind::Change)
        );
        s.started(SyncKind::Change, t0 + secs(29));
        s.changed();
        assert_eq!(
            s.next(true, t0 + secs(29)),
            (t0 + PERIOD, SyncKind::Periodic)
        );
    }

    /// The worst change used to be the one right after a periodic resync: it waited out
    /// the minimum interval (up to 1 s), behind a sync no burst had asked for.
    #[test]
    fn a_change_right_after_a_periodic_sync_goes_at_once() {
        let t0 = Instant::now();
        let mut s = SyncSchedule::new(MIN, PERIOD, t0);
        s.started(SyncKind::Periodic, t0 + PERIOD);
        s.succeeded();
        let t1 = t0 + PERIOD + Duration::from_millis(10);
        s.changed();
        assert_eq!(s.next(true, t1), (t1, SyncKind::Change));
        // A burst still waits for the minimum interval after the change sync.
        s.started(SyncKind::Change, t1);
        s.succeeded();
        s.changed();
        assert_eq!(s.next(true, t1), (t1 + MIN, SyncKind::Change));
    }

    #[test]
    fn a_periodic_sync_puts_the_next_one_a_period_away() {
        let t0 = Instant::now();
        let mut s = SyncSchedule::new(MIN, PERIOD, t0);
        s.started(SyncKind::Periodic, t0 + PERIOD);
        s.succeeded();
        assert_eq!(
            s.next(true, t0 + PERIOD),
            (t0 + PERIOD * 2, SyncKind::Periodic)
        );
    }

    /// The run loop's shape (`SyncLoop::run`) on paused time: a change arrives every
    /// 100 ms, each sync takes 20 ms; over three sync periods the periodic check still
    /// runs once per period.
    #[tokio::test(start_paused = true)]
    async fn steady_churn_does_not_starve_the_periodic_check() {
        let period = Duration::from_secs(2);
        let min = Duration::from_millis(50);
        let t0 = Instant::now();
        let mut s = SyncSchedule::new(min, period, t0);
        let mut changes = tokio::time::interval_at(t0, Duration::from_millis(100));
        // Three periods, and the time for a sync due at the end to finish.
        let end = t0 + period * 3 + Duration::from_millis(100);
        let (mut periodic, mut change_syncs) = (Vec::new(), 0);
        while Instant::now() < end {
            let (due, kind) = s.next(true, Instant::now());
            tokio::select! {
                biased;
                _ = changes.tick() => s.changed(),
                () = tokio::time::sleep_until(due) => {
                    let started = Instant::now();
                    s.started(kind, started);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    s.succeeded();
                    match kind {
                        SyncKind::Periodic => periodic.push(started - t0),
                        SyncKind::Change => change_syncs += 1,
                    }
                }
            }
        }
        assert!(change_syncs >= 50, "{change_syncs} change syncs");
        assert_eq!(periodic.len(), 3, "periodic checks started at {periodic:?}");
        for (n, at) in (1u32..).zip(&periodic) {
            // On its deadline, or right after the change sync running then (20 ms).
            let deadline = period * n;
            assert!(
                *at >= deadline && *at <= deadline + Duration::from_millis(20),
                "periodic check {n} started at {at:?}"
            );
        }
    }

    #[test]
    fn failures_retry_with_doubling_backoff_capped_by_the_period() {
        let t0 = Instant::now();
        let mut s = SyncSchedule::new(MIN, PERIOD, t0);
        let mut now = t0;
        let mut delays = Vec::new();
        let mut kind = SyncKind::Change;
        for _ in 0..7 {
            s.started(kind, now);
            s.failed(now);
            let (at, next) = s.next(true, now);
            delays.push((at - now).as_secs());
            (now, kind) = (at, next);
        }
        // 16 s after t=15 is past the periodic sync at t=30, which retries as well.
        assert_eq!(delays, [1, 2, 4, 8, 15, 30, 30]);
        // The last retry was the periodic sync, which starts no minimum interval.
        assert_eq!(kind, SyncKind::Periodic);
        s.started(kind, now);
        s.succeeded();
        s.changed();
        let (at, next) = s.next(true, now);
        assert!(at <= now && next == SyncKind::Change, "{at:?} {next:?}");
    }
}
