//! The dataplane on its own thread: its calls run kernel tools and block, so the async
//! runtime only ever awaits their answers.

use std::sync::Arc;
use std::sync::mpsc;

use proxyplan_crds::MergedPlan;
use tokio::sync::oneshot;

use crate::dataplane::{Dataplane, DataplaneError, SyncReport};

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
}

impl DataplaneThread {
    /// Moves `dataplane` to a new thread named `dataplane`.
    ///
    /// # Errors
    /// When the thread cannot be created.
    pub fn spawn(mut dataplane: impl Dataplane + Send + 'static) -> std::io::Result<Self> {
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
        Ok(Self { jobs })
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
