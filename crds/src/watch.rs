//! A list-then-watch whose list the API server answers from its watch cache, in one
//! response the client decodes as it arrives.
//!
//! kube-runtime's watcher lists one of two ways. A quorum read (`resourceVersion`
//! unset, its default) pages through etcd 500 objects at a time, and the API server
//! decodes every stored object again, unless it serves consistent reads from its cache
//! (etcd 3.4.31+ or 3.5.13+). A read at any version (`resourceVersion=0`) comes from the
//! cache in one response, which kube-runtime holds twice, as bytes and as objects.
//!
//! This one lists with `resourceVersionMatch=NotOlderThan` at the newest version it has
//! delivered (`1` before the first list), and no `limit`. The API server answers that
//! from its watch cache, at a version no older than anything this watch already
//! delivered: an API server whose cache is behind waits for it to catch up (3 s at most;
//! after its `504` the next attempt takes whatever the cache holds, since etcd restored
//! from a backup never reaches the versions seen before). The watch that follows starts
//! at the list's version.
//!
//! Why not pages: the API server answers a page's continuation from its cache only
//! while it still holds a snapshot at the list's version. Measured on kube-apiserver
//! v1.36.2 with 50,000 Service plans, a list right after a write to them read 100 pages
//! from the cache in 4 to 5 s; the same list when none had been written for some minutes
//! (a quiet cluster, an agent restarted or a node added) read the first page from the
//! cache and the 99 continuations from etcd, in 15 s and with etcd decoding every plan
//! again, for every agent starting then; and with etcd before 3.4.31, once etcd was
//! compacted past the plans' last write, every continuation failed with `410 Expired`
//! (the cache's version moves only on a write there), so the list never completed. One
//! response comes from the cache every time.
//!
//! The response is decoded as it arrives, on a thread of its own ([`read_list`]), and its
//! objects are delivered one at a time through a short queue: the client never holds the
//! whole response, only the objects not yet consumed (at most [`QUEUE`]), and the API
//! server encodes while the client decodes.
//!
//! Its events and errors are kube-runtime's own ([`Event`], [`Error`]), so consumers and
//! [`crate::runtime::watch_backoff`] do not change: `410 Gone` from the watch (the
//! version expired) lists again from the start, and so does a response that breaks off
//! (its objects so far are delivered again after a new [`Event::Init`]).

use std::io::{BufReader, Read};
use std::pin::Pin;

use futures::stream::BoxStream;
use futures::{AsyncRead, AsyncReadExt, Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::api::{ListParams, VersionMatch, WatchEvent, WatchParams};
use kube::runtime::watcher::{Error, Event};
use kube::{Api, Client};
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Objects decoded ahead of the consumer, at most.
pub const QUEUE: usize = 256;
/// Bytes read from the response at a time.
const READ_BUFFER: usize = 64 * 1024;
/// The server ends each watch after this long; it starts again where it ended.
const WATCH_TIMEOUT_SECONDS: u32 = 290;
/// The version a first list is no older than: any the cache holds.
const ANY_VERSION: &str = "1";

/// Which objects to watch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    /// A label selector, or everything.
    pub labels: Option<String>,
    /// A field selector, or everything.
    pub fields: Option<String>,
}

impl Selector {
    /// Objects with these labels.
    #[must_use]
    pub fn labels(selector: &str) -> Self {
        Self {
            labels: Some(selector.to_owned()),
            fields: None,
        }
    }

    /// Objects with these fields.
    #[must_use]
    pub fn fields(selector: &str) -> Self {
        Self {
            labels: None,
            fields: Some(selector.to_owned()),
        }
    }
}

/// Lists `api`'s objects that `selector` selects from the API server's watch cache, then
/// watches them, over and over (see the module's documentation). Errors are yielded and
/// the stream goes on: retry pacing is the consumer's
/// ([`crate::runtime::watch_backoff`]).
pub fn cached<K>(api: Api<K>, selector: Selector) -> impl Stream<Item = Result<Event<K>, Error>>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let machine = Machine {
        api,
        selector,
        seen: ANY_VERSION.to_owned(),
        state: State::Start,
    };
    futures::stream::unfold(machine, |mut machine| async move {
        let item = machine.next().await;
        Some((item, machine))
    })
}

enum State<K> {
    /// A list starts.
    Start,
    /// The list is asked for (again, after a failed request).
    List,
    /// The list's objects arrive.
    Listing {
        /// Decoded objects, in order.
        objects: mpsc::Receiver<K>,
        /// The decoding thread; it ends with the list's metadata.
        reader: JoinHandle<Result<ListMeta, kube::Error>>,
    },
    /// A watch starts from the newest version seen.
    Watch,
    /// A watch is open.
    Watching(BoxStream<'static, kube::Result<WatchEvent<K>>>),
}

struct Machine<K> {
    api: Api<K>,
    selector: Selector,
    /// The newest version delivered: where a watch starts, and what a list is no older
    /// than.
    seen: String,
    state: State<K>,
}

impl<K> Machine<K>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    async fn next(&mut self) -> Result<Event<K>, Error> {
        loop {
            match &mut self.state {
                State::Start => {
                    self.state = State::List;
                    return Ok(Event::Init);
                }
                State::List => {
                    let params = list_params(&self.selector, &self.seen);
                    match start_list(&self.api, &params).await {
                        Ok((objects, reader)) => self.state = State::Listing { objects, reader },
                        Err(err) => {
                            if gone(&err) {
                                self.state = State::Start;
                            } else if too_new(&err) {
                                // The cache did not reach the version seen in time: etcd
                                // restored from a backup, whose versions went back. The
                                // next attempt takes whatever the cache holds.
                                ANY_VERSION.clone_into(&mut self.seen);
                            }
                            return Err(Error::InitialListFailed(err));
                        }
                    }
                }
                State::Listing { objects, reader } => {
                    if let Some(object) = objects.recv().await {
                        return Ok(Event::InitApply(object));
                    }
                    let ended = match reader.await {
                        Ok(ended) => ended,
                        Err(err) => Err(kube::Error::ReadEvents(std::io::Error::other(err))),
                    };
                    // Whatever happens next, this list is over; a failed one starts again
                    // from `Init`, since some of its objects may have been delivered.
                    self.state = State::Start;
                    match ended {
                        Ok(meta) => match meta.resource_version.filter(|v| !v.is_empty()) {
                            Some(version) => {
                                self.seen = version;
                                self.state = State::Watch;
                                return Ok(Event::InitDone);
                            }
                            None => return Err(Error::NoResourceVersion),
                        },
                        Err(err) => return Err(Error::InitialListFailed(err)),
                    }
                }
                State::Watch => match self
                    .api
                    .watch(&watch_params(&self.selector), &self.seen)
                    .await
                {
                    Ok(stream) => self.state = State::Watching(stream.boxed()),
                    Err(err) => {
                        if gone(&err) {
                            self.state = State::Start;
                        }
                        return Err(Error::WatchStartFailed(err));
                    }
                },
                State::Watching(stream) => match stream.next().await {
                    Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
                        saw(&mut self.seen, &object);
                        return Ok(Event::Apply(object));
                    }
                    Some(Ok(WatchEvent::Deleted(object))) => {
                        saw(&mut self.seen, &object);
                        return Ok(Event::Delete(object));
                    }
                    Some(Ok(WatchEvent::Bookmark(bookmark))) => {
                        if !bookmark.metadata.resource_version.is_empty() {
                            self.seen = bookmark.metadata.resource_version;
                        }
                    }
                    Some(Ok(WatchEvent::Error(status))) => {
                        if status.code == 410 {
                            self.state = State::Start;
                        }
                        return Err(Error::WatchError(status));
                    }
                    Some(Err(err)) => return Err(Error::WatchFailed(err)),
                    None => self.state = State::Watch,
                },
            }
        }
    }
}

fn saw<K: kube::Resource>(seen: &mut String, object: &K) {
    if let Some(version) = object.meta().resource_version.as_deref()
        && !version.is_empty()
    {
        version.clone_into(seen);
    }
}

/// Everything `selector` selects, no older than `seen`, from the cache, in one response.
fn list_params(selector: &Selector, seen: &str) -> ListParams {
    ListParams {
        label_selector: selector.labels.clone(),
        field_selector: selector.fields.clone(),
        resource_version: Some(seen.to_owned()),
        version_match: Some(VersionMatch::NotOlderThan),
        ..ListParams::default()
    }
}

/// Sends the list request; once the API server answers, its objects arrive through the
/// queue while a thread decodes the response ([`read_list`]), which ends with the
/// list's metadata.
async fn start_list<K>(
    api: &Api<K>,
    params: &ListParams,
) -> Result<(mpsc::Receiver<K>, JoinHandle<Result<ListMeta, kube::Error>>), kube::Error>
where
    K: kube::Resource + Clone + DeserializeOwned + Send + 'static,
{
    let request = kube::core::Request::new(api.resource_url())
        .list(params)
        .map_err(kube::Error::BuildRequest)?;
    let client: Client = api.clone().into_client();
    let body = client.request_stream(request).await?;
    let (send, objects) = mpsc::channel(QUEUE);
    let reader = tokio::task::spawn_blocking(move || read_list(Box::pin(body), &send));
    Ok((objects, reader))
}

/// Decodes a list response from `body` as it arrives, sending each object to `send`
/// as soon as it is decoded; returns the list's metadata. Runs on a thread that may
/// block: it waits for the response's bytes and for room in the queue.
///
/// # Errors
/// When the response breaks off, is not a list of `K`, or the receiver is gone (the
/// list was abandoned).
pub fn read_list<K: DeserializeOwned>(
    body: Pin<Box<dyn AsyncRead + Send>>,
    send: &mpsc::Sender<K>,
) -> Result<ListMeta, kube::Error> {
    let bytes = BufReader::with_capacity(READ_BUFFER, Blocking(body));
    let mut decoder = serde_json::Deserializer::from_reader(bytes);
    let meta =
        de::Deserializer::deserialize_map(&mut decoder, ListVisitor { send }).map_err(|err| {
            match err.io_error_kind() {
                Some(_) => kube::Error::ReadEvents(std::io::Error::other(err)),
                None => kube::Error::SerdeError(err),
            }
        })?;
    decoder.end().map_err(kube::Error::SerdeError)?;
    Ok(meta)
}

/// A response body read by blocking on each read.
struct Blocking(Pin<Box<dyn AsyncRead + Send>>);

impl Read for Blocking {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        futures::executor::block_on(self.0.read(buf))
    }
}

/// A list object: its `metadata` kept, each of its `items` sent on as decoded, anything
/// else skipped.
struct ListVisitor<'a, K> {
    send: &'a mpsc::Sender<K>,
}

impl<'de, K: DeserializeOwned> Visitor<'de> for ListVisitor<'_, K> {
    type Value = ListMeta;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ListMeta, A::Error> {
        let mut meta = ListMeta::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "metadata" => meta = map.next_value()?,
                "items" => map.next_value_seed(Items { send: self.send })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(meta)
    }
}

/// A list's `items`, each sent on as decoded.
struct Items<'a, K> {
    send: &'a mpsc::Sender<K>,
}

impl<'de, K: DeserializeOwned> DeserializeSeed<'de> for Items<'_, K> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de, K: DeserializeOwned> Visitor<'de> for Items<'_, K> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of objects, or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(object) = seq.next_element::<K>()? {
            self.send
                .blocking_send(object)
                .map_err(|_| de::Error::custom("the list was abandoned"))?;
        }
        Ok(())
    }
}

fn watch_params(selector: &Selector) -> WatchParams {
    WatchParams {
        label_selector: selector.labels.clone(),
        field_selector: selector.fields.clone(),
        timeout: Some(WATCH_TIMEOUT_SECONDS),
        bookmarks: true,
        ..WatchParams::default()
    }
}

fn gone(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 410)
}

/// `504` for a version the API server's cache has not reached.
fn too_new(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 504)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A body that hands out `bytes` a few at a time, as a network would.
    struct Trickle {
        bytes: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut [u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = self.step.min(buf.len()).min(self.bytes.len() - self.at);
            let at = self.at;
            buf[..n].copy_from_slice(&self.bytes[at..at + n]);
            self.at += n;
            std::task::Poll::Ready(Ok(n))
        }
    }

    fn body(list: &Value, cut: usize) -> Pin<Box<dyn AsyncRead + Send>> {
        let mut bytes = serde_json::to_vec(list).unwrap_or_default();
        bytes.truncate(bytes.len() - cut);
        Box::pin(Trickle {
            bytes,
            at: 0,
            step: 7,
        })
    }

    fn list(items: usize) -> Value {
        json!({
            "kind": "ServiceProxyPlanList",
            "apiVersion": "proxyplan.dev/v1alpha1",
            "metadata": {"resourceVersion": "42", "continue": ""},
            "items": (0..items).map(|i| json!({"name": format!("p{i}"), "n": i})).collect::<Vec<_>>(),
        })
    }

    /// Reads `list` (less its last `cut` bytes) with a consumer on another thread, as the
    /// watch does; returns the objects received and how the read ended.
    fn read(list: &Value, cut: usize) -> (Vec<Value>, Result<ListMeta, kube::Error>) {
        let (send, mut objects) = mpsc::channel(QUEUE);
        let body = body(list, cut);
        let reader = std::thread::spawn(move || read_list::<Value>(body, &send));
        let mut received = Vec::new();
        while let Some(object) = objects.blocking_recv() {
            received.push(object);
        }
        let ended = reader
            .join()
            .unwrap_or_else(|_| Err(kube::Error::ReadEvents(std::io::Error::other("panicked"))));
        (received, ended)
    }

    #[test]
    fn every_object_arrives_in_order_then_the_version() {
        // More objects than the queue holds: the decoder waits for the consumer.
        let whole = list(3 * QUEUE + 5);
        let (received, ended) = read(&whole, 0);
        assert_eq!(Some(&Value::Array(received)), whole.get("items"));
        let meta = ended.unwrap_or_default();
        assert_eq!(meta.resource_version.as_deref(), Some("42"));
    }

    #[test]
    fn a_response_cut_after_its_objects_is_still_an_error() {
        let (received, ended) = read(&list(10), 1);
        assert_eq!(received.len(), 10);
        assert!(ended.is_err(), "{ended:?}");
    }

    #[test]
    fn an_empty_list_and_null_items_end_with_the_version() {
        for items in [json!([]), Value::Null] {
            let mut whole = list(0);
            whole["items"] = items;
            let (received, ended) = read(&whole, 0);
            assert!(received.is_empty());
            assert_eq!(
                ended.unwrap_or_default().resource_version.as_deref(),
                Some("42")
            );
        }
    }

    #[test]
    fn a_response_that_breaks_off_is_an_error_after_the_objects_read() {
        let whole = list(10);
        // (Keys are written sorted: `items` before `metadata`.) Cut inside the items.
        let half = serde_json::to_vec(&whole).unwrap_or_default().len() / 2;
        let (received, ended) = read(&whole, half);
        assert!(received.len() < 10, "{} objects", received.len());
        assert!(
            matches!(ended, Err(kube::Error::SerdeError(_))),
            "{ended:?}"
        );
    }

    #[test]
    fn a_list_whose_consumer_is_gone_stops_reading() {
        let (send, objects) = mpsc::channel::<Value>(1);
        drop(objects);
        let ended = read_list(body(&list(10), 0), &send);
        let err = ended.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("the list was abandoned"), "{err}");
    }
}
