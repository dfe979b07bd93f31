//! Warning Events on the Services and EndpointSlices the controller refuses or had to
//! cut down, so that `kubectl describe service` shows why, not only the controller's log.
//!
//! The sync loop only records what it saw ([`Notices`]); the leader hands new notices to
//! a task that publishes them, so a slow or absent API server never delays a sync. A
//! notice is published once per object and message: the same refusal seen again (a
//! re-list, a status-only update) is not published again.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tracing::warn;

/// The controller's name in Events (`reportingController`).
pub const REPORTING_CONTROLLER: &str = "proxyplan-controller";
/// Notices queued for publishing at most; more are dropped (they stay in the log).
const QUEUE: usize = 1024;

/// One Warning Event to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// The object it is about.
    pub regarding: ObjectReference,
    /// A short `PascalCase` reason, e.g. `InvalidService`.
    pub reason: String,
    /// What is wrong and what the controller does about it.
    pub note: String,
}

/// Identity of a notice: the object's kind, namespace and name, and the reason (one
/// object can have a refusal and a truncation at once).
type ObjectKey = (String, String, String, String);

/// What the loop has to say about objects, and what it already said.
#[derive(Debug)]
pub struct Notices {
    current: HashMap<ObjectKey, Notice>,
    published: HashMap<ObjectKey, Notice>,
    queue: Option<mpsc::Sender<Notice>>,
}

impl Notices {
    /// Notices handed to `queue` for publishing (none without one).
    #[must_use]
    pub fn new(queue: Option<mpsc::Sender<Notice>>) -> Self {
        Self {
            current: HashMap::new(),
            published: HashMap::new(),
            queue,
        }
    }

    /// Records what there is to say about an object now.
    pub fn set(&mut self, notice: Notice) {
        self.current.insert(key_of(&notice), notice);
    }

    /// Records that an object is fine again (or gone) as far as `reason` goes.
    pub fn clear(&mut self, kind: &str, namespace: &str, name: &str, reason: &str) {
        let key = (
            kind.to_owned(),
            namespace.to_owned(),
            name.to_owned(),
            reason.to_owned(),
        );
        self.current.remove(&key);
        self.published.remove(&key);
    }

    /// Hands every notice not yet published to the publisher (the leader calls this).
    pub fn publish(&mut self) {
        let Some(queue) = &self.queue else {
            return;
        };
        for (key, notice) in &self.current {
            if self.published.get(key) == Some(notice) {
                continue;
            }
            if queue.try_send(notice.clone()).is_err() {
                warn!(
                    reason = %notice.reason,
                    "event queue full; this notice is only in the log"
                );
                continue;
            }
            self.published.insert(key.clone(), notice.clone());
        }
    }

    /// Notices currently held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.current.len()
    }

    /// Whether there is nothing to say.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }
}

fn key_of(notice: &Notice) -> ObjectKey {
    let reference = &notice.regarding;
    (
        reference.kind.clone().unwrap_or_default(),
        reference.namespace.clone().unwrap_or_default(),
        reference.name.clone().unwrap_or_default(),
        notice.reason.clone(),
    )
}

/// A reference to a namespaced core or discovery object.
#[must_use]
pub fn reference(
    kind: &str,
    api_version: &str,
    namespace: &str,
    name: &str,
    uid: Option<String>,
) -> ObjectReference {
    ObjectReference {
        api_version: Some(api_version.to_owned()),
        kind: Some(kind.to_owned()),
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        uid,
        ..ObjectReference::default()
    }
}

/// The queue the loop hands notices to, and the task that publishes them.
pub fn publisher(
    client: kube::Client,
    identity: &str,
) -> (mpsc::Sender<Notice>, impl Future<Output = ()> + use<>) {
    let (tx, mut rx) = mpsc::channel::<Notice>(QUEUE);
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: REPORTING_CONTROLLER.to_owned(),
            instance: Some(identity.to_owned()),
        },
    );
    let task = async move {
        while let Some(notice) = rx.recv().await {
            let event = Event {
                type_: EventType::Warning,
                reason: notice.reason.clone(),
                note: Some(truncate(&notice.note, 1000)),
                action: "Plan".to_owned(),
                secondary: None,
            };
            if let Err(err) = recorder.publish(&event, &notice.regarding).await {
                warn!(%err, reason = %notice.reason, "could not publish a Warning Event");
            }
        }
    };
    (tx, task)
}

/// `text` cut to at most `max` bytes on a character boundary.
fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(name: &str, note: &str) -> Notice {
        Notice {
            regarding: reference("Service", "v1", "default", name, None),
            reason: "InvalidService".to_owned(),
            note: note.to_owned(),
        }
    }

    #[test]
    fn each_notice_is_published_once_until_it_changes() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut notices = Notices::new(Some(tx));
        notices.set(notice("a", "bad port"));
        notices.publish();
        notices.publish();
        notices.set(notice("a", "bad port"));
        notices.publish();
        assert_eq!(rx.try_recv().ok(), Some(notice("a", "bad port")));
        assert!(rx.try_recv().is_err(), "published once");
        notices.set(notice("a", "bad address"));
        notices.publish();
        assert_eq!(rx.try_recv().ok(), Some(notice("a", "bad address")));
        notices.clear("Service", "default", "a", "InvalidService");
        assert!(notices.is_empty());
        notices.set(notice("a", "bad address"));
        notices.publish();
        assert_eq!(
            rx.try_recv().ok(),
            Some(notice("a", "bad address")),
            "fixed, then broken again: said again"
        );
    }

    #[test]
    fn long_notes_are_cut_on_a_character_boundary() {
        let text = "é".repeat(600);
        let cut = truncate(&text, 1000);
        assert!(cut.len() <= 1003);
        assert!(cut.ends_with('…'));
    }
}
