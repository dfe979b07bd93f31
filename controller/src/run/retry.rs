//! When the controller writes again after failed writes: after a backoff (from
//! [`RETRY_INITIAL`] to [`RETRY_MAX`]), except that writes which failed because the API
//! server, or etcd behind it, could take no write at all are retried as soon as the API
//! server answers again (the next watch event), not after the backoff the outage built
//! up. Without that, a controller that failed writes through an API server restart and
//! an etcd restart in a row waited up to 30 s after both were back.

use std::time::Duration;

use tokio::time::Instant;

use proxyplan_crds::runtime::Backoff;

use super::writer::WriteError;

/// First wait before retrying failed writes.
pub const RETRY_INITIAL: Duration = Duration::from_millis(500);
/// Longest wait before retrying failed writes.
pub const RETRY_MAX: Duration = Duration::from_secs(30);

/// Whether a write failed because the API server, or etcd behind it, could take no
/// write at all (no connection, no answer, 429 or 5xx), rather than refusing this object.
#[must_use]
pub fn unavailable(err: &kube::Error) -> bool {
    match err {
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => true,
        kube::Error::Api(status) => matches!(status.code, 429 | 500 | 502 | 503 | 504),
        _ => false,
    }
}

/// The retry clock.
#[derive(Debug)]
pub struct WriteRetry {
    backoff: Backoff,
    at: Option<Instant>,
    when_answered: bool,
}

impl Default for WriteRetry {
    fn default() -> Self {
        Self {
            backoff: Backoff::new(RETRY_INITIAL, RETRY_MAX),
            at: None,
            when_answered: false,
        }
    }
}

impl WriteRetry {
    /// When to write again, if a retry is due.
    #[must_use]
    pub fn at(&self) -> Option<Instant> {
        self.at
    }

    /// Ask again at `at` (nothing failed: the Lease is not held for sure).
    pub fn poll_at(&mut self, at: Instant) {
        self.at = Some(at);
    }

    /// A sync starts: no retry is due.
    pub fn clear(&mut self) {
        self.at = None;
    }

    /// Every write of a sync went through.
    pub fn succeeded(&mut self) {
        self.backoff.reset();
        self.when_answered = false;
    }

    /// Some writes failed with `errors` at `now`: retry after the next backoff step, or
    /// as soon as the API server answers when every failure was its being unavailable.
    /// Returns the backoff.
    pub fn failed(&mut self, errors: &[WriteError], now: Instant) -> Duration {
        let delay = self.backoff.next_delay();
        self.when_answered = !errors.is_empty() && errors.iter().all(|e| unavailable(&e.source));
        self.at = Some(now + delay);
        delay
    }

    /// A watch event arrived at `now`: the API server answers.
    pub fn answered(&mut self, now: Instant) {
        if std::mem::take(&mut self.when_answered) {
            self.at = self.at.map(|at| at.min(now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::writer::Kind;

    fn error(source: kube::Error) -> WriteError {
        WriteError {
            op: "apply",
            kind: Kind::Plan,
            name: "node-a".into(),
            source,
        }
    }

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            ..kube::core::Status::default()
        }))
    }

    #[test]
    fn an_outage_is_retried_when_the_api_server_answers_a_refusal_after_the_backoff() {
        let now = Instant::now();
        let mut retry = WriteRetry::default();
        // Through an outage the backoff grows.
        for _ in 0..8 {
            retry.failed(&[error(kube::Error::Service("connect".into()))], now);
        }
        let later = retry.at().unwrap();
        assert!(later >= now + Duration::from_secs(10), "{:?}", later - now);
        // The API server answers: the retry is due at once, and only once.
        let back = now + Duration::from_secs(1);
        retry.answered(back);
        assert_eq!(retry.at(), Some(back));
        retry.failed(&[error(status(503))], back);
        let at = retry.at().unwrap();
        retry.answered(back + Duration::from_millis(1));
        assert_eq!(retry.at(), Some(back + Duration::from_millis(1)), "503 too");
        retry.answered(back + Duration::from_millis(2));
        assert_eq!(retry.at(), Some(back + Duration::from_millis(1)));
        assert!(at > back);

        // A refusal of the object itself waits out its backoff whatever events come.
        let mut retry = WriteRetry::default();
        retry.failed(&[error(status(422))], now);
        let at = retry.at().unwrap();
        retry.answered(now);
        assert_eq!(retry.at(), Some(at));
        // So does a mix.
        retry.failed(&[error(status(500)), error(status(409))], now);
        let at = retry.at().unwrap();
        retry.answered(now);
        assert_eq!(retry.at(), Some(at));
        // Success resets the backoff.
        retry.succeeded();
        retry.clear();
        assert_eq!(retry.at(), None);
        retry.failed(&[error(status(422))], now);
        assert!(retry.at().unwrap() <= now + RETRY_INITIAL * 2);
    }
}
