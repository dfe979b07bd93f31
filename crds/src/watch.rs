//! A list-then-watch whose lists the API server answers from its watch cache, a page at
//! a time.
//!
//! kube-runtime's watcher lists one of two ways. A quorum read (`resourceVersion`
//! unset, its default) pages through etcd 500 objects at a time, and the API server
//! decodes every stored object again, unless it serves consistent reads from its cache
//! (etcd 3.4.31+ or 3.5.13+). A read at any version (`resourceVersion=0`) comes from the
//! cache, but the API server then ignores `limit` and answers the whole collection in
//! one response, which the client holds twice, as bytes and as objects.
//!
//! This one lists with `resourceVersionMatch=NotOlderThan` at the newest version it has
//! delivered (`1` before the first list). The API server answers that from its watch
//! cache, in pages, and serves their continuations from the cache's snapshot too, at a
//! version no older than anything this watch already delivered: an API server whose
//! cache is behind waits for it to catch up (3 s at most; after its `504` the next
//! attempt takes whatever the cache holds, since etcd restored from a backup never
//! reaches the versions seen before). The watch that follows starts at the list's
//! version.
//!
//! Its events and errors are kube-runtime's own ([`Event`], [`Error`]), so consumers and
//! [`crate::runtime::watch_backoff`] do not change: `410 Gone` from the watch (the
//! version expired) or from a continuation lists again from the start.

use std::collections::VecDeque;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::Api;
use kube::api::{ListParams, VersionMatch, WatchEvent, WatchParams};
use kube::runtime::watcher::{Error, Event};
use serde::de::DeserializeOwned;

/// Objects per list page.
pub const PAGE_SIZE: u32 = 500;
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
    /// A list is under way.
    Listing {
        /// Objects of the page last read, not yet delivered.
        page: VecDeque<K>,
        /// The next page's continuation (`None`: the first page, or the last is read).
        next: Option<String>,
        /// The list's version, once its last page is read.
        version: Option<String>,
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
                    self.state = State::Listing {
                        page: VecDeque::new(),
                        next: None,
                        version: None,
                    };
                    return Ok(Event::Init);
                }
                State::Listing {
                    page,
                    next,
                    version,
                } => {
                    if let Some(object) = page.pop_front() {
                        return Ok(Event::InitApply(object));
                    }
                    if let Some(version) = version.take() {
                        self.seen = version;
                        self.state = State::Watch;
                        return Ok(Event::InitDone);
                    }
                    let params = list_params(&self.selector, &self.seen, next.clone());
                    match self.api.list(&params).await {
                        Ok(list) => {
                            let listed = list.metadata.resource_version.filter(|v| !v.is_empty());
                            let more = list.metadata.continue_.filter(|c| !c.is_empty());
                            if more.is_none() && listed.is_none() {
                                self.state = State::Start;
                                return Err(Error::NoResourceVersion);
                            }
                            page.extend(list.items);
                            *version = if more.is_none() { listed } else { None };
                            *next = more;
                        }
                        Err(err) => {
                            if gone(&err) {
                                // The continuation's snapshot is no longer held.
                                self.state = State::Start;
                            } else if next.is_none() && too_new(&err) {
                                // The cache did not reach the version seen in time: etcd
                                // restored from a backup, whose versions went back. The
                                // next attempt takes whatever the cache holds.
                                ANY_VERSION.clone_into(&mut self.seen);
                            }
                            return Err(Error::InitialListFailed(err));
                        }
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

/// The first page no older than `seen`, from the cache; a continuation carries its own
/// version (the API server refuses both).
fn list_params(selector: &Selector, seen: &str, next: Option<String>) -> ListParams {
    let first = next.is_none();
    ListParams {
        label_selector: selector.labels.clone(),
        field_selector: selector.fields.clone(),
        limit: Some(PAGE_SIZE),
        resource_version: first.then(|| seen.to_owned()),
        version_match: first.then_some(VersionMatch::NotOlderThan),
        continue_token: next,
        ..ListParams::default()
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
