//! Small pieces both binaries need at their edge: a client from `--kubeconfig` or the
//! cluster, SIGTERM handling, kube-proxy-style duration flags, and retry backoff for
//! writes and watches.

use std::hash::{BuildHasher, RandomState};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::watcher;

/// No usable Kubernetes client configuration.
#[derive(Debug, thiserror::Error)]
#[error("kubernetes client configuration: {0}")]
pub struct ClientConfigError(String);

/// A client from `kubeconfig`, or else from `$KUBECONFIG` / the in-cluster service account.
///
/// # Errors
/// When the file cannot be read or no configuration can be inferred.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, ClientConfigError> {
    let config = match kubeconfig {
        Some(path) => {
            let bad = |e: &dyn std::fmt::Display| {
                ClientConfigError(format!("--kubeconfig {}: {e}", path.display()))
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(&e))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| bad(&e))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| ClientConfigError(format!("not in a cluster and no --kubeconfig: {e}")))?,
    };
    with_keepalive(config)
}

/// How long a connection to the API server may be silent before TCP asks the other end
/// whether it is still there; then every [`KEEPALIVE_INTERVAL`], [`KEEPALIVE_PROBES`]
/// times, before the connection is given up. A watch on a connection whose packets stopped
/// (a partition, a load balancer that forgot it) is so found dead about 20 s into the
/// silence and starts again on a new connection, whose attempts give up after
/// [`CONNECT_TIMEOUT`] and start over, so the first attempt after the partition ends gets
/// through. Without it, the watch waits for TCP's own retransmissions, which back off to
/// minutes: the fleet soak measured nodes 100 s behind after a 110 s partition had ended.
/// (client-go pings HTTP/2 connections for the same.)
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// See [`KEEPALIVE_IDLE`].
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(3);
/// See [`KEEPALIVE_IDLE`].
pub const KEEPALIVE_PROBES: u32 = 3;
/// At most this long for a TCP (and TLS) connection to the API server (kube's default is
/// 30 s); see [`KEEPALIVE_IDLE`].
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// At most this long for what was sent on a connection to the API server to go
/// unacknowledged before TCP gives the connection up (`TCP_USER_TIMEOUT`). Keepalive
/// covers a connection that only receives (a watch); this covers a request written into
/// a partition on a pooled connection, which keepalive does not probe: the fault suite
/// saw a watch's retry wait 67 s there.
pub const USER_TIMEOUT: Duration = Duration::from_secs(20);

/// kube's own client stack (TLS, timeouts, retries of 429/503/504, authentication,
/// extra headers), over connections with TCP keepalive ([`KEEPALIVE_IDLE`]). Through a
/// proxy, kube's stack as it is.
fn with_keepalive(config: kube::Config) -> Result<kube::Client, ClientConfigError> {
    use kube::client::ConfigExt;
    use tower::ServiceBuilder;
    let fail = |e: kube::Error| ClientConfigError(e.to_string());
    if config.proxy_url.is_some() {
        return kube::Client::try_from(config).map_err(fail);
    }
    let mut tcp = hyper_util::client::legacy::connect::HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_keepalive(Some(KEEPALIVE_IDLE));
    tcp.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    tcp.set_keepalive_retries(Some(KEEPALIVE_PROBES));
    tcp.set_tcp_user_timeout(Some(USER_TIMEOUT));
    let tls = config
        .rustls_https_connector_with_connector(tcp)
        .map_err(fail)?;
    let mut timeouts = hyper_timeout::TimeoutConnector::new(tls);
    timeouts.set_connect_timeout(Some(
        config
            .connect_timeout
            .map_or(CONNECT_TIMEOUT, |t| t.min(CONNECT_TIMEOUT)),
    ));
    timeouts.set_read_timeout(config.read_timeout);
    timeouts.set_write_timeout(config.write_timeout);
    timeouts.set_reset_reader_on_write(config.reset_reader_on_write);
    let http: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Builder::new(hyper_util::rt::TokioExecutor::new())
            .build(timeouts);
    let retry = config
        .default_retry
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer().map_err(fail)?)
        .layer(config.extra_headers_layer().map_err(fail)?)
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(term) => term,
            Err(err) => {
                tracing::warn!(%err, "cannot listen for SIGTERM; only Ctrl-C stops the process");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

/// Parses a duration as kube-proxy's flags spell it: `500ms`, `1s`, `30s`, `1m30s`,
/// `2h`; a bare number is seconds.
///
/// # Errors
/// When the text is not such a duration.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration like 500ms, 30s or 1m30s");
    if text.is_empty() {
        return Err(bad());
    }
    if let Ok(seconds) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"));
    }
    let mut total = 0.0_f64;
    let mut rest = text;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(bad)?;
        let (number, after) = rest.split_at(split);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let value: f64 = number.parse().map_err(|_| bad())?;
        total += value
            * match unit {
                "ms" => 0.001,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return Err(bad()),
            };
        rest = next;
    }
    Duration::try_from_secs_f64(total).map_err(|e| format!("{text:?}: {e}"))
}

/// Exponential backoff with jitter and a cap: each failure waits longer (doubling from
/// `initial` up to `max`), each wait is between half and all of its step so that many
/// clients retrying together spread out, and a success starts over.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    /// A backoff from `initial` up to `max`.
    #[must_use]
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            step: initial,
        }
    }

    /// How long to wait after one more failure.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = self.step.saturating_mul(2).min(self.max);
        jitter(step)
    }

    /// Starts over after a success.
    pub fn reset(&mut self) {
        self.step = self.initial;
    }
}

/// `410 Gone`: the version a watch or a list continuation named is no longer held.
fn gone(err: &watcher::Error) -> bool {
    match err {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == 410,
        _ => false,
    }
}

/// Between half and all of `step`, at random.
fn jitter(step: Duration) -> Duration {
    let random = RandomState::new().hash_one(std::time::SystemTime::now());
    // 0..=1023 thousandths of a half step.
    let fraction = u32::try_from(random % 1024).unwrap_or(0);
    step / 2 + (step / 2) * fraction / 1024
}

/// First wait of a failed watch.
pub const WATCH_BACKOFF_INITIAL: Duration = Duration::from_millis(200);
/// Longest wait of a failed watch: short, so that changes flow again within seconds of
/// an API server coming back, whatever backoff the outage built up. With the jitter, a
/// node retries a failed watch every 0.5 to 1 s during an outage: a connection refused
/// costs the API server nothing, and an answered retry is the watch it must serve anyway.
pub const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Retries a watch with [`Backoff`] between failures (from [`WATCH_BACKOFF_INITIAL`]
/// to [`WATCH_BACKOFF_MAX`]), except that `410 Gone` (the resource version expired, for
/// instance after an API server restart, or a list continuation's snapshot) re-lists at once: waiting would only delay the
/// list that must come anyway.
pub fn watch_backoff<T: Send>(
    stream: impl Stream<Item = Result<T, watcher::Error>> + Send,
) -> impl Stream<Item = Result<T, watcher::Error>> + Send {
    let backoff = Arc::new(Mutex::new(Backoff::new(
        WATCH_BACKOFF_INITIAL,
        WATCH_BACKOFF_MAX,
    )));
    stream.then(move |item| {
        let backoff = Arc::clone(&backoff);
        async move {
            let delay = match &item {
                Ok(_) => {
                    if let Ok(mut b) = backoff.lock() {
                        b.reset();
                    }
                    None
                }
                Err(err) if gone(err) => None,
                Err(_) => backoff.lock().ok().map(|mut b| b.next_delay()),
            };
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            item
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_kube_proxy_spells_them() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0.25"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        for bad in ["", "s", "1x", "1s2", "-1s", "ms"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_its_cap_and_starts_over() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
        let steps = [100, 200, 400, 700, 700];
        for step in steps {
            let delay = b.next_delay();
            let step = Duration::from_millis(step);
            assert!(
                delay >= step / 2 && delay <= step,
                "{delay:?} for step {step:?}"
            );
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
