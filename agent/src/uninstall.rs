//! Telling an uninstall from a restart. A stopped agent normally leaves the kernel as it
//! is, so a rolling update or a restart never interrupts traffic; but when the DaemonSet it
//! runs in is gone (`helm uninstall`, `kubectl delete daemonset`), nothing will program the
//! node again, and it removes everything it owns.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::Api;

/// How long the agent waits for the API server's answer before leaving the kernel as it is.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// `--owner-daemonset NAMESPACE/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerDaemonSet {
    namespace: String,
    name: String,
}

impl OwnerDaemonSet {
    /// Parses `NAMESPACE/NAME`.
    ///
    /// # Errors
    /// When either part is missing.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.split_once('/') {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
            {
                Ok(Self {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(format!("{text:?} is not NAMESPACE/NAME")),
        }
    }

    /// Whether the DaemonSet is gone or being deleted. Any failure to ask is an error, and
    /// the caller keeps the rules.
    ///
    /// # Errors
    /// When the API server cannot be reached or answers with anything but the object or
    /// 404.
    pub async fn is_gone(&self, kubeconfig: Option<&Path>) -> Result<bool, String> {
        let client = proxyplan_crds::runtime::client(kubeconfig)
            .await
            .map_err(|e| e.to_string())?;
        let api: Api<DaemonSet> = Api::namespaced(client, &self.namespace);
        match tokio::time::timeout(ASK_TIMEOUT, api.get_opt(&self.name)).await {
            Err(_) => Err(format!("no answer within {ASK_TIMEOUT:?}")),
            Ok(Err(err)) => Err(err.to_string()),
            Ok(Ok(None)) => Ok(true),
            Ok(Ok(Some(daemonset))) => Ok(daemonset.metadata.deletion_timestamp.is_some()),
        }
    }
}

impl std::fmt::Display for OwnerDaemonSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Removes the state directory and what the agent wrote in it. When the directory is a
/// mount point (a hostPath mounted there) only its contents go; the chart mounts
/// `/run/proxyplan` and gives each node's agent `/run/proxyplan/NODE`, which goes whole.
pub fn remove_state(dir: &Path) {
    if dir.as_os_str().is_empty() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        if let Err(err) = removed {
            tracing::warn!(path = %path.display(), %err, "cannot remove");
        }
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => tracing::info!(path = %dir.display(), "removed the state directory"),
        Err(err) => tracing::info!(
            path = %dir.display(),
            %err,
            "emptied the state directory (it is a mount point, left in place)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::OwnerDaemonSet;

    #[test]
    fn parses_namespace_and_name_only() {
        let owner =
            OwnerDaemonSet::parse("kube-system/proxyplan-agent").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(owner.to_string(), "kube-system/proxyplan-agent");
        for bad in ["proxyplan-agent", "/x", "x/", "a/b/c", ""] {
            let err = OwnerDaemonSet::parse(bad).err();
            assert!(err.is_some_and(|e| e.contains("NAMESPACE/NAME")), "{bad:?}");
        }
    }
}
