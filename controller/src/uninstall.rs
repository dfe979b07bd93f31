//! `proxyplan-controller uninstall-agents`: the chart's pre-delete hook. It deletes the
//! agents' DaemonSet with foreground propagation and waits until every agent pod is gone.
//! Each agent, stopped while its DaemonSet is being deleted, removes its rules
//! (`proxyplan-agent run --owner-daemonset`), and it can still ask the API server because
//! the rest of the release (its ServiceAccount, its RBAC) is deleted only after this hook.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PropagationPolicy};

/// Why the agents could not be removed.
#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    /// The API server refused or failed a request.
    #[error("{what}: {source}")]
    Api {
        /// The request.
        what: String,
        /// The error.
        source: kube::Error,
    },
}

/// Deletes the DaemonSet `name` in `namespace` (foreground: it stays, marked as being
/// deleted, until its pods are gone) and waits up to `timeout` for its pods to go. Returns
/// how many pods there were. A DaemonSet that does not exist is not an error.
///
/// # Errors
/// When a request fails. Pods still there after `timeout` (on nodes that are down) are
/// logged, not an error: the uninstall goes on without them.
pub async fn uninstall_agents(
    client: kube::Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<usize, UninstallError> {
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let api = |what: String| move |source| UninstallError::Api { what, source };
    let Some(daemonset) = daemonsets
        .get_opt(name)
        .await
        .map_err(api(format!("reading DaemonSet {namespace}/{name}")))?
    else {
        tracing::info!(%namespace, %name, "no agent DaemonSet: nothing to remove");
        return Ok(0);
    };
    let selector = daemonset
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
        .map(|labels| {
            labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    let list = ListParams::default().labels(&selector);
    let at_first = pods
        .list_metadata(&list)
        .await
        .map_err(api(format!("listing pods {selector}")))?
        .items
        .len();
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        ..DeleteParams::default()
    };
    daemonsets
        .delete(name, &params)
        .await
        .map_err(api(format!("deleting DaemonSet {namespace}/{name}")))?;
    tracing::info!(
        %namespace, %name, pods = at_first,
        "deleting the agents' DaemonSet; each agent removes its rules as it stops"
    );
    let started = Instant::now();
    loop {
        let left = pods
            .list_metadata(&list)
            .await
            .map_err(api(format!("listing pods {selector}")))?
            .items;
        if left.is_empty() {
            tracing::info!(
                seconds = started.elapsed().as_secs_f64(),
                "every agent pod is gone"
            );
            return Ok(at_first);
        }
        if started.elapsed() >= timeout {
            let names = left
                .iter()
                .take(5)
                .filter_map(|p| p.metadata.name.clone())
                .collect::<Vec<_>>()
                .join(", ");
            // Not an error: a pod on a node that is down never stops, and the uninstall
            // must go on. Those nodes keep the rules until `proxyplan-agent cleanup`.
            tracing::warn!(
                left = left.len(),
                %names,
                "agent pods still there after {timeout:?} (nodes down?): their nodes keep \
                 proxyplan's rules; run `proxyplan-agent cleanup` there"
            );
            return Ok(at_first);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
