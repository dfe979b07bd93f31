//! The agent's watches (DESIGN §2 invariant 5): its own `NodeProxyPlan`, selected by
//! name, the cluster shards and its zone's shards, selected by label. Nothing else.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use proxyplan_crds::{NodeProxyPlan, ProxyPlanShard, SCOPE_LABEL, ZONE_LABEL};

/// One watch event.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "events are consumed one at a time"
)]
pub enum Input {
    /// This node's plan.
    Plan(Event<NodeProxyPlan>),
    /// A cluster shard.
    ClusterShard(Event<ProxyPlanShard>),
    /// A shard of the zone with this slug.
    ZoneShard(String, Event<ProxyPlanShard>),
    /// A watch failed (it retries with backoff).
    WatchError(&'static str, String),
}

/// A merged stream of watch events.
pub type InputStream = Pin<Box<dyn Stream<Item = Input> + Send>>;

/// The field selector of the plan watch.
#[must_use]
pub fn plan_field_selector(node: &str) -> String {
    format!("metadata.name={node}")
}

/// The label selector of the cluster shard watch.
#[must_use]
pub fn cluster_shard_selector() -> String {
    format!("{SCOPE_LABEL}=cluster")
}

/// The label selector of the watch on the shards of the zone with this slug (see
/// [`proxyplan_crds::zone_slug`]).
#[must_use]
pub fn zone_shard_selector(slug: &str) -> String {
    format!("{ZONE_LABEL}={slug}")
}

/// Builds the agent's watch streams.
pub struct Watches {
    client: Client,
    node: String,
}

impl Watches {
    /// Watches for `node`, through `client`.
    #[must_use]
    pub fn new(client: Client, node: &str) -> Self {
        Self {
            client,
            node: node.to_owned(),
        }
    }

    /// The plan watch and the cluster shard watch, merged.
    #[must_use]
    pub fn own(&self) -> InputStream {
        let plan = watch_stream(
            Api::<NodeProxyPlan>::all(self.client.clone()),
            watcher::Config::default().fields(&plan_field_selector(&self.node)),
            "NodeProxyPlan",
            Input::Plan,
        );
        let cluster = watch_stream(
            Api::<ProxyPlanShard>::all(self.client.clone()),
            watcher::Config::default().labels(&cluster_shard_selector()),
            "ProxyPlanShard (cluster)",
            Input::ClusterShard,
        );
        Box::pin(futures::stream::select(plan, cluster))
    }

    /// The watch on the shards of the zone with this slug.
    #[must_use]
    pub fn zone_shards(&self, slug: &str) -> InputStream {
        let owned = slug.to_owned();
        Box::pin(
            watcher::watcher(
                Api::<ProxyPlanShard>::all(self.client.clone()),
                watcher::Config::default().labels(&zone_shard_selector(slug)),
            )
            .default_backoff()
            .map(move |r| match r {
                Ok(event) => Input::ZoneShard(owned.clone(), event),
                Err(err) => Input::WatchError("ProxyPlanShard (zone)", err.to_string()),
            }),
        )
    }
}

fn watch_stream<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: &'static str,
    wrap: fn(Event<K>) -> Input,
) -> InputStream
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    Box::pin(
        watcher::watcher(api, config)
            .default_backoff()
            .map(move |r| match r {
                Ok(event) => wrap(event),
                Err(err) => Input::WatchError(kind, err.to_string()),
            }),
    )
}
