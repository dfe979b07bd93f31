//! Is a change live everywhere? How many nodes hold each Service plan's revision.
//!
//! Each agent reports one number in its node plan's status, rate-limited: the newest
//! Service plan `resourceVersion` up to which every change is in its kernel
//! (`programmedResourceVersion`). Resource versions of one resource compare as integers
//! (Kubernetes 1.35, KEP-5504), so a node holds a Service plan's revision when its mark
//! has reached the `resourceVersion` of the write that made the revision. The controller
//! already watches the node plans; it counts, per Service plan, the nodes whose mark is
//! at or past that write, and names the node furthest behind.
//!
//! Every node's report costs no Service plan write. A Service plan's status is written
//! when some node still lacks its revision [`Rollouts::new`]'s `slow_after` after the
//! write (then at most every [`REWRITE_EVERY`] while the picture changes), and once more
//! when such a lagging rollout completes. A rollout every node reports in time is not
//! written at all by default ([`StatusWrites::Lagging`]): each status write reaches every
//! node's watch of the Service plans, one more event per change per node, and a healthy
//! fleet should pay nothing for being watched. [`StatusWrites::All`] writes every
//! completion too. The agents' reports cost one write per node per report interval under
//! churn, one per node per change on a quiet cluster, none when nothing changes.
//!
//! The node count of a complete rollout is the count when it completed: a node joining
//! later (its agent lists everything, so its first mark covers every plan) rewrites no
//! plan.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use proxyplan_crds::RolloutStatus;
use tokio::time::Instant;

/// Which rollouts are written to the Service plans' status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum StatusWrites {
    /// Only rollouts some node still lacks after the slow-after time, and their
    /// completion: nothing for a rollout every node reports in time, so a healthy fleet
    /// receives no Service plan event beyond the changes themselves.
    #[default]
    Lagging,
    /// Also every completed rollout (`N/N` on every row): one more Service plan event per
    /// change on every node, which doubles the bytes each node receives per change.
    All,
    /// None: the metrics only.
    Off,
}

/// Shortest time between two writes of one plan's status while its rollout is
/// incomplete.
pub const REWRITE_EVERY: Duration = Duration::from_secs(10);
/// Shortest time between two looks after marks moved (5,000 nodes report up to 500
/// marks a second).
const LOOK_EVERY: Duration = Duration::from_millis(200);

/// One Service plan's revision and how far it has come.
#[derive(Debug, Clone)]
struct Tracked {
    /// The content revision.
    revision: String,
    /// `resourceVersion` of the write that made it.
    since: u64,
    /// When this controller learnt of the write (`None`: it found the plan at start).
    written_at: Option<Instant>,
    /// The same, as wall-clock time for the status.
    written_time: Option<Time>,
    /// The rollout status the server holds.
    status: Option<RolloutStatus>,
    /// When this controller last wrote it.
    last_write: Option<Instant>,
    /// Every reporting node held it when last looked at.
    complete: bool,
    /// A write of its status failed: not tried again before this.
    not_before: Option<Instant>,
    /// Looked at when it could have been written and nothing was to be written: no
    /// time makes it due again, only a node's mark moving (which makes every open plan
    /// looked at).
    settled: bool,
    /// Its completion was counted in the metrics.
    timed: bool,
}

/// A status to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// `namespace/name` of the Service plan.
    pub plan: String,
    /// Its rollout status.
    pub status: RolloutStatus,
}

/// A rollout that completed, for the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Completed {
    /// `namespace/name` of the Service plan.
    pub plan: String,
    /// The revision.
    pub revision: String,
    /// From the write to the controller seeing the last node's mark past it.
    pub seconds: f64,
}

/// The nodes' marks and every Service plan's rollout.
#[derive(Debug)]
pub struct Rollouts {
    slow_after: Duration,
    writes: StatusWrites,
    marks: HashMap<String, u64>,
    /// `marks` sorted by mark then node name, rebuilt when a mark moved.
    sorted: Option<Vec<(u64, String)>>,
    plans: HashMap<String, Tracked>,
    /// The plans whose rollout is not complete: the only ones a look computes.
    open: HashSet<String>,
    /// Something changed since the last [`Rollouts::updates`].
    dirty: bool,
    last_look: Option<Instant>,
}

impl Rollouts {
    /// Rollouts whose progress is written once some node still lacks them `slow_after`
    /// after their write (and, with [`StatusWrites::All`], every completion).
    #[must_use]
    pub fn new(slow_after: Duration, writes: StatusWrites) -> Self {
        Self {
            slow_after,
            writes,
            marks: HashMap::new(),
            sorted: None,
            plans: HashMap::new(),
            open: HashSet::new(),
            dirty: false,
            last_look: None,
        }
    }

    /// A node's mark, from its plan's status (`None`: the node plan is gone, or its agent
    /// reports none).
    pub fn node_mark(&mut self, node: &str, mark: Option<&str>) {
        let mark = mark.and_then(|m| m.parse::<u64>().ok());
        let old = match mark {
            Some(mark) => self.marks.insert(node.to_owned(), mark),
            None => self.marks.remove(node),
        };
        if old != mark {
            self.sorted = None;
            self.dirty = true;
        }
    }

    /// Forgets every node's mark (before the node plans are listed again).
    pub fn forget_marks(&mut self) {
        self.marks.clear();
        self.sorted = None;
        self.dirty = true;
    }

    /// This controller wrote `revision` of `plan`, and the server answered with
    /// `resource_version`.
    pub fn wrote(&mut self, plan: &str, revision: &str, resource_version: &str, now: Instant) {
        let Ok(since) = resource_version.parse::<u64>() else {
            return;
        };
        if self.plans.get(plan).is_some_and(|t| t.revision == revision) {
            // The same content written again (a repair of someone else's fields, an
            // apply that changed nothing): its rollout is still the one of the write
            // that made it, which the agents' marks reach (a write that leaves the spec
            // alone moves no mark).
            return;
        }
        let status = self.plans.get(plan).and_then(|t| t.status.clone());
        self.plans.insert(
            plan.to_owned(),
            Tracked {
                revision: revision.to_owned(),
                since,
                written_at: Some(now),
                written_time: Some(Time(Timestamp::now())),
                status,
                last_write: None,
                complete: false,
                not_before: None,
                settled: false,
                timed: false,
            },
        );
        self.open.insert(plan.to_owned());
        self.dirty = true;
    }

    /// The watch shows `plan` with content `revision` at `resource_version`, and the
    /// rollout status it holds.
    pub fn observed(
        &mut self,
        plan: &str,
        revision: &str,
        resource_version: Option<&str>,
        status: Option<&RolloutStatus>,
    ) {
        if let Some(tracked) = self.plans.get_mut(plan) {
            if tracked.revision == revision {
                tracked.status = status.cloned();
                return;
            }
            let older = resource_version
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|v| v < tracked.since);
            if older {
                // An event from before this controller's own newer write.
                return;
            }
        }
        // Found at start, or changed by someone else: the write that made this content
        // is the one the status names when it is about this revision, else (no older
        // than it) the object's current version.
        let about_this = status.filter(|s| s.revision == revision);
        let since = about_this
            .and_then(|s| s.resource_version.as_deref())
            .or(resource_version)
            .and_then(|v| v.parse::<u64>().ok());
        let Some(since) = since else {
            return;
        };
        let complete = about_this.is_some_and(|s| s.slowest.is_none() && s.programmed == s.nodes);
        self.plans.insert(
            plan.to_owned(),
            Tracked {
                revision: revision.to_owned(),
                since,
                written_at: None,
                written_time: about_this.and_then(|s| s.written_time.clone()),
                status: status.cloned(),
                last_write: None,
                complete,
                not_before: None,
                settled: false,
                timed: complete,
            },
        );
        if complete {
            self.open.remove(plan);
        } else {
            self.open.insert(plan.to_owned());
        }
        self.dirty = true;
    }

    /// Keeps only the plans in `listed` (after the Service plans were listed again).
    pub fn retain(&mut self, listed: &HashSet<String>) {
        self.plans.retain(|name, _| listed.contains(name));
        self.open.retain(|name| listed.contains(name));
        self.dirty = true;
    }

    /// `plan` is gone.
    pub fn forget(&mut self, plan: &str) {
        self.plans.remove(plan);
        self.open.remove(plan);
    }

    /// Plans whose current revision not every reporting node holds (as last looked at).
    #[must_use]
    pub fn incomplete(&self) -> usize {
        self.open.len()
    }

    /// Nodes reporting a mark.
    #[must_use]
    pub fn nodes(&self) -> usize {
        self.marks.len()
    }

    /// When [`Rollouts::updates`] may have something new to say: now after a change, else
    /// when the oldest incomplete rollout turns slow or may be rewritten.
    #[must_use]
    pub fn due(&self, now: Instant) -> Option<Instant> {
        if self.dirty {
            return Some(self.last_look.map_or(now, |l| now.max(l + LOOK_EVERY)));
        }
        if self.marks.is_empty() {
            return None;
        }
        self.open
            .iter()
            .filter_map(|name| self.plans.get(name))
            .filter(|t| !t.settled)
            .map(|t| {
                let slow = t.written_at.map_or(now, |w| w + self.slow_after);
                let at = t.last_write.map_or(slow, |w| slow.max(w + REWRITE_EVERY));
                t.not_before.map_or(at, |n| at.max(n))
            })
            .min()
            .map(|at| at.max(now))
    }

    /// The statuses to write now, and the rollouts that completed since last asked.
    pub fn updates(&mut self, now: Instant) -> (Vec<Update>, Vec<Completed>) {
        self.dirty = false;
        self.last_look = Some(now);
        let mut updates = Vec::new();
        let mut completed = Vec::new();
        if self.marks.is_empty() {
            return (updates, completed);
        }
        let sorted = self.sorted.get_or_insert_with(|| {
            let mut sorted: Vec<(u64, String)> =
                self.marks.iter().map(|(n, m)| (*m, n.clone())).collect();
            sorted.sort();
            sorted
        });
        let nodes = u32::try_from(sorted.len()).unwrap_or(u32::MAX);
        let complete_time = Time(Timestamp::now());
        let mut closed = Vec::new();
        for plan in &self.open {
            let Some(tracked) = self.plans.get_mut(plan) else {
                closed.push(plan.clone());
                continue;
            };
            if tracked.complete || tracked.not_before.is_some_and(|n| now < n) {
                continue;
            }
            tracked.settled = false;
            let behind = sorted.partition_point(|(mark, _)| *mark < tracked.since);
            let programmed = nodes - u32::try_from(behind).unwrap_or(nodes);
            let mut status = RolloutStatus {
                revision: tracked.revision.clone(),
                resource_version: Some(tracked.since.to_string()),
                nodes,
                programmed,
                progress: format!("{programmed}/{nodes}"),
                slowest: sorted
                    .first()
                    .filter(|_| behind > 0)
                    .map(|(_, n)| n.clone()),
                written_time: tracked.written_time.clone(),
                complete_time: None,
            };
            let held = tracked.status.as_ref();
            let same = held.is_some_and(|h| {
                (&h.revision, h.nodes, h.programmed, &h.slowest)
                    == (
                        &status.revision,
                        status.nodes,
                        status.programmed,
                        &status.slowest,
                    )
            });
            if behind == 0 {
                tracked.complete = true;
                closed.push(plan.clone());
                if let Some(at) = tracked.written_at.filter(|_| !tracked.timed) {
                    tracked.timed = true;
                    completed.push(Completed {
                        plan: plan.clone(),
                        revision: tracked.revision.clone(),
                        seconds: now.saturating_duration_since(at).as_secs_f64(),
                    });
                }
                // A status about this revision was written because it lagged: say it
                // completed. Else only when every completion is written.
                let lagged = held.is_some_and(|h| h.revision == status.revision);
                let wanted = match self.writes {
                    StatusWrites::All => true,
                    StatusWrites::Lagging => lagged,
                    StatusWrites::Off => false,
                };
                if wanted && !same {
                    status.complete_time = Some(complete_time.clone());
                    updates.push(Update {
                        plan: plan.clone(),
                        status,
                    });
                }
                continue;
            }
            let slow = tracked
                .written_at
                .is_none_or(|w| now >= w + self.slow_after);
            let may_rewrite = tracked.last_write.is_none_or(|w| now >= w + REWRITE_EVERY);
            if slow && may_rewrite {
                if same || self.writes == StatusWrites::Off {
                    // Nothing to say until a mark moves.
                    tracked.settled = true;
                } else {
                    updates.push(Update {
                        plan: plan.clone(),
                        status,
                    });
                }
            }
        }
        for plan in closed {
            self.open.remove(&plan);
        }
        updates.sort_by(|a, b| a.plan.cmp(&b.plan));
        (updates, completed)
    }

    /// The server took `update`.
    pub fn written(&mut self, update: &Update, now: Instant) {
        if let Some(tracked) = self.plans.get_mut(&update.plan)
            && tracked.revision == update.status.revision
        {
            tracked.status = Some(update.status.clone());
            tracked.last_write = Some(now);
        }
    }

    /// Writing `update` was refused for good (404: the plan is gone, or the CRD has no
    /// status subresource): its rollout is not written again.
    pub fn gave_up(&mut self, update: &Update) {
        // (A newer revision written while this write was in flight is followed still.)
        if let Some(tracked) = self.plans.get_mut(&update.plan)
            && tracked.revision == update.status.revision
        {
            tracked.complete = true;
            self.open.remove(&update.plan);
        }
    }

    /// Writing `update` failed: it is computed again [`REWRITE_EVERY`] later.
    pub fn failed(&mut self, update: &Update, now: Instant) {
        if let Some(tracked) = self.plans.get_mut(&update.plan)
            && tracked.revision == update.status.revision
        {
            tracked.complete = false;
            tracked.not_before = Some(now + REWRITE_EVERY);
            self.open.insert(update.plan.clone());
        }
    }
}

#[cfg(test)]
mod tests;
