//! API calls of the suite: CRDs, node plans and Service plans, and bounded waits that say what they
//! last saw.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use proxyplan_crds::{MergedPlan, NodeProxyPlan, ServiceProxyPlan};
use proxyplan_tests::e2e::fixtures::FIELD_MANAGER;

/// How long each wait lasts.
pub const WAIT: Duration = Duration::from_secs(60);

/// Polls `probe` every half second until it succeeds or `timeout` passes; the error
/// names what was awaited and what the last probe saw.
pub async fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl AsyncFnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match probe().await {
            Ok(value) => return Ok(value),
            Err(last) if Instant::now() >= deadline => {
                return Err(format!(
                    "timed out after {}s waiting for {what}; last seen:\n{last}",
                    timeout.as_secs()
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Server-side applies every `*.yaml` CRD in `dir`; returns their names.
pub async fn apply_crds(client: &Client, dir: &Path) -> Result<Vec<String>, String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("no CRD files in {}", dir.display()));
    }
    let mut names = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let crd: CustomResourceDefinition =
            serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        let name = crd.name_any();
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .map_err(|e| format!("applying {}: {e}", file.display()))?;
        names.push(name);
    }
    Ok(names)
}

/// Waits until every CRD in `names` is Established.
pub async fn wait_established(client: &Client, names: &[String]) -> Result<(), String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in names {
        wait_for(&format!("CRD {name} Established"), WAIT, async || {
            let crd = api.get(name).await.map_err(|e| e.to_string())?;
            let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
            if conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
            {
                Ok(())
            } else {
                Err(format!(
                    "conditions {:?}",
                    conditions
                        .iter()
                        .map(|c| format!(
                            "{}={} ({})",
                            c.type_,
                            c.status,
                            c.message.clone().unwrap_or_default()
                        ))
                        .collect::<Vec<_>>()
                ))
            }
        })
        .await?;
    }
    Ok(())
}

/// The plan of `node`, if any.
pub async fn plan(client: &Client, node: &str) -> Result<Option<NodeProxyPlan>, String> {
    Api::<NodeProxyPlan>::all(client.clone())
        .get_opt(node)
        .await
        .map_err(|e| format!("getting NodeProxyPlan {node}: {e}"))
}

/// The plan of `node`, or an error saying there is none.
pub async fn existing_plan(client: &Client, node: &str) -> Result<NodeProxyPlan, String> {
    plan(client, node)
        .await?
        .ok_or_else(|| format!("no NodeProxyPlan {node}"))
}

/// Every Service plan.
pub async fn service_plans(client: &Client) -> Result<Vec<ServiceProxyPlan>, String> {
    Api::<ServiceProxyPlan>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| format!("listing ServiceProxyPlans: {e}"))
}

/// The plan of `node` merged with every Service plan, as its agent merges them.
pub async fn merged(client: &Client, node: &str) -> Result<(NodeProxyPlan, MergedPlan), String> {
    let plan = existing_plan(client, node).await?;
    let services = service_plans(client).await?;
    let merged = proxyplan_crds::merge(&plan, &services)
        .map_err(|e| format!("merging {node}'s plan with the Service plans: {e}"))?;
    Ok((plan, merged))
}

/// The plan's wanted revision and its status, on one line per part.
pub fn describe_status(plan: &NodeProxyPlan) -> String {
    let mut out = format!(
        "NodeProxyPlan {}: spec.revision {}",
        plan.name_any(),
        plan.spec.revision
    );
    match &plan.status {
        None => out.push_str("; no status (no agent has written one)"),
        Some(status) => {
            out.push_str(&format!(
                "; status.appliedRevision {}; mode {}; agent {}",
                status.applied_revision.as_deref().unwrap_or("-"),
                status.mode.as_deref().unwrap_or("-"),
                status.agent_version.as_deref().unwrap_or("-"),
            ));
            for c in &status.conditions {
                out.push_str(&format!(
                    "\n  {}={} reason {}: {}",
                    c.type_, c.status, c.reason, c.message
                ));
            }
        }
    }
    out
}

/// Ok when the agent reports Ready=True for the plan's current revision.
pub fn ready(plan: &NodeProxyPlan) -> Result<(), String> {
    let status = plan.status.as_ref();
    let is_ready = status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    });
    let applied = status.and_then(|s| s.applied_revision.as_deref());
    if is_ready && applied == Some(plan.spec.revision.as_str()) {
        Ok(())
    } else {
        Err(describe_status(plan))
    }
}

/// Deletes an object, treating "already gone" as done.
pub async fn delete<K>(api: &Api<K>, name: &str) -> Result<(), String>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(format!("deleting {name}: {err}")),
    }
}
