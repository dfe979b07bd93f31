//! The agent's watches (DESIGN §2 invariant 5): its own `NodeProxyPlan`, selected by
//! name, and the Service plans the controller wrote, selected by label. Nothing else.
//!
//! Objects are decoded one at a time ([`Lenient`]): an object this agent cannot read
//! (written by a newer controller, or by hand) is refused on its own and named in the
//! plan's status, and the watch goes on. Failed watches retry with a short, capped
//! backoff, and re-list at once after `410 Gone`, so changes flow again within seconds of
//! an API server coming back.
//!
//! Both are listed from the API server's watch cache, in one response decoded as it
//! arrives ([`proxyplan_crds::watch::cached`]). A quorum read, where the API server cannot
//! serve consistent reads from its cache (etcd before 3.4.31 or 3.5.13, as in the test
//! control plane), pages through etcd and decodes every stored Service plan again, for
//! every agent of a fleet that starts at once; pages from the cache fall back to etcd, or
//! fail, in a cluster where no plan changed for minutes.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use kube::runtime::watcher::Event;
use kube::{Api, Client};
use proxyplan_crds::lenient::Lenient;
use proxyplan_crds::runtime::watch_backoff;
use proxyplan_crds::watch::{Selector, cached};
use proxyplan_crds::{MANAGED_BY, MANAGED_BY_LABEL, NodeProxyPlan, ServiceProxyPlan};

/// One watch event.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "events are consumed one at a time"
)]
pub enum Input {
    /// This node's plan.
    Plan(Event<Lenient<NodeProxyPlan>>),
    /// A Service plan.
    Service(Event<Lenient<ServiceProxyPlan>>),
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

/// The label selector of the Service plan watch.
#[must_use]
pub fn service_plan_selector() -> String {
    format!("{MANAGED_BY_LABEL}={MANAGED_BY}")
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

    /// The plan watch and the Service plan watch, merged.
    #[must_use]
    pub fn all(&self) -> InputStream {
        let plan = watch_stream(
            Api::<Lenient<NodeProxyPlan>>::all(self.client.clone()),
            Selector::fields(&plan_field_selector(&self.node)),
            "NodeProxyPlan",
            Input::Plan,
        );
        let services = watch_stream(
            Api::<Lenient<ServiceProxyPlan>>::all(self.client.clone()),
            Selector::labels(&service_plan_selector()),
            "ServiceProxyPlan",
            Input::Service,
        );
        Box::pin(futures::stream::select(plan, services))
    }
}

fn watch_stream<K>(
    api: Api<K>,
    selector: Selector,
    kind: &'static str,
    wrap: fn(Event<K>) -> Input,
) -> InputStream
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    Box::pin(watch_backoff(cached(api, selector)).map(move |r| match r {
        Ok(event) => wrap(event),
        Err(err) => Input::WatchError(kind, err.to_string()),
    }))
}
