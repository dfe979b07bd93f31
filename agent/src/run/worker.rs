//! The dataplane on its own thread: its calls run kernel tools and block, so the async
//! runtime only ever awaits their answers.

use std::sync::Arc;
use std::sync::mpsc;

use proxyplan_crds::MergedPlan;
use tokio::sync::{Notify, oneshot};

use crate::dataplane::{ChangeAlarm, Dataplane, DataplaneError, SyncReport};

/// A boxed dataplane is a dataplane, so the command line can pick the mode at run time.
impl<D: Dataplane + ?Sized> Dataplane for Box<D> {
    fn sync(&mut self, plan: &MergedPlan, dry_run: bool) -> Result<SyncReport, DataplaneError> {
        (**self).sync(plan, dry_run)
    }

    fn sync_shared(
        &mut self,
        plan: &Arc<MergedPlan>,
        dry_run: bool,
    ) -> Result<SyncReport, DataplaneError> {
        (**self).sync_shared(plan, dry_run)
    }

    fn rules_intact(&mut self) -> Result<bool, DataplaneError> {
        (**self).rules_intact()
    }

    fn holds_rules(&mut self) -> Result<bool, DataplaneError> {
        (**self).holds_rules()
    }

    fn change_alarm(&mut self) -> Option<Box<dyn crate::dataplane::ChangeAlarm>> {
        (**self).change_alarm()
    }

    fn cleanup(&mut self) -> Result<SyncReport, DataplaneError> {
        (**self).cleanup()
    }
}

/// The dataplane thread is gone: it panicked, and the kernel state is unknown.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the dataplane thread stopped")]
pub struct DataplaneStopped;

enum Job {
    Sync(
        Arc<MergedPlan>,
        oneshot::Sender<Result<SyncReport, DataplaneError>>,
    ),
    RulesIntact(oneshot::Sender<Result<bool, DataplaneError>>),
    HoldsRules(oneshot::Sender<Result<bool, DataplaneError>>),
}

/// A [`Dataplane`] owned by a dedicated thread, called from async code.
pub struct DataplaneThread {
    jobs: mpsc::Sender<Job>,
    /// Notified when the dataplane's change alarm went off (see [`DataplaneThread::alarmed`]).
    alarm: Option<Arc<Notify>>,
}

impl DataplaneThread {
    /// Moves `dataplane` to a new thread named `dataplane`.
    ///
    /// # Errors
    /// When the thread cannot be created.
    pub fn spawn(dataplane: impl Dataplane + Send + 'static) -> std::io::Result<Self> {
        Self::spawn_with(dataplane, false)
    }

    /// [`DataplaneThread::spawn`]; with `listen`, the dataplane's change alarm (when its
    /// mode has one) waits on a second thread, `change-alarm`, and each time it goes off
    /// [`DataplaneThread::alarmed`] completes.
    ///
    /// # Errors
    /// When a thread cannot be created.
    pub fn spawn_with(
        mut dataplane: impl Dataplane + Send + 'static,
        listen: bool,
    ) -> std::io::Result<Self> {
        let alarm = if listen {
            dataplane.change_alarm().map(spawn_alarm).transpose()?
        } else {
            None
        };
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("dataplane".to_owned())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    match job {
                        Job::Sync(plan, answer) => {
                            let _ = answer.send(dataplane.sync_shared(&plan, false));
                        }
                        Job::RulesIntact(answer) => {
                            let _ = answer.send(dataplane.rules_intact());
                        }
                        Job::HoldsRules(answer) => {
                            let _ = answer.send(dataplane.holds_rules());
                        }
                    }
                }
            })?;
        Ok(Self { jobs, alarm })
    }

    /// Completes when the change alarm went off since the last time this completed
    /// (alarms in between count once); never without an alarm.
    pub async fn alarmed(&self) {
        match &self.alarm {
            Some(alarm) => alarm.notified().await,
            None => std::future::pending().await,
        }
    }

    /// Whether a change alarm is listening.
    #[must_use]
    pub fn listening(&self) -> bool {
        self.alarm.is_some()
    }

    /// [`Dataplane::sync`] of `plan` (never a dry run).
    ///
    /// # Errors
    /// The outer error when the thread is gone.
    pub async fn sync(
        &self,
        plan: Arc<MergedPlan>,
    ) -> Result<Result<SyncReport, DataplaneError>, DataplaneStopped> {
        let (answer, result) = oneshot::channel();
        self.jobs
            .send(Job::Sync(plan, answer))
            .map_err(|_| DataplaneStopped)?;
        result.await.map_err(|_| DataplaneStopped)
    }

    /// [`Dataplane::rules_intact`].
    ///
    /// # Errors
    /// The outer error when the thread is gone.
    pub async fn rules_intact(&self) -> Result<Result<bool, DataplaneError>, DataplaneStopped> {
        let (answer, result) = oneshot::channel();
        self.jobs
            .send(Job::RulesIntact(answer))
            .map_err(|_| DataplaneStopped)?;
        result.await.map_err(|_| DataplaneStopped)
    }

    /// [`Dataplane::holds_rules`].
    ///
    /// # Errors
    /// The outer error when the thread is gone.
    pub async fn holds_rules(&self) -> Result<Result<bool, DataplaneError>, DataplaneStopped> {
        let (answer, result) = oneshot::channel();
        self.jobs
            .send(Job::HoldsRules(answer))
            .map_err(|_| DataplaneStopped)?;
        result.await.map_err(|_| DataplaneStopped)
    }
}

/// Waits on `alarm` on a thread of its own, notifying the returned handle each time it
/// goes off. The thread ends when the alarm fails (the tamper check's interval is left)
/// or the handle is dropped.
fn spawn_alarm(mut alarm: Box<dyn ChangeAlarm>) -> std::io::Result<Arc<Notify>> {
    let notify = Arc::new(Notify::new());
    let weak = Arc::downgrade(&notify);
    std::thread::Builder::new()
        .name("change-alarm".to_owned())
        .spawn(move || {
            loop {
                match alarm.wait(Some(ALARM_LIVENESS)) {
                    Ok(went_off) => match weak.upgrade() {
                        Some(notify) if went_off => notify.notify_one(),
                        Some(_) => {}
                        None => return,
                    },
                    Err(err) => {
                        tracing::warn!(%err, "the change alarm stopped; tampering is found at the tamper check interval only");
                        return;
                    }
                }
            }
        })?;
    Ok(notify)
}

/// How often the alarm thread wakes with nothing heard, to notice that nobody listens.
const ALARM_LIVENESS: std::time::Duration = std::time::Duration::from_secs(5);
