//! The kubeconfig the agents use from inside their network namespaces.
//!
//! A fresh network namespace has no route anywhere, so each agent talks to a forwarder
//! listening on `127.0.0.1` inside its namespace ([`super::forward`]), which carries the
//! bytes over a Unix socket to the suite, which connects to the real API server. TLS is
//! end to end: the agent's kubeconfig points at the local forwarder and sets
//! `tls-server-name` to the API server's own host name (unless the kubeconfig already
//! names one), so the server certificate is verified exactly as before.

use std::net::SocketAddr;

use kube::config::Kubeconfig;

/// Where the API server is, as the suite (in the host namespace) connects to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiServer {
    /// Host name or IP address (without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

/// Rewrites the current context's cluster of `config` to reach the API server through
/// `local` (the forwarder's address inside an agent's namespace). Returns the rewritten
/// kubeconfig and where the real API server is.
///
/// # Errors
/// When there is no current context or cluster, the server URL cannot be read, or the
/// cluster needs an HTTP proxy (`proxy-url`), which a namespace cannot reach.
pub fn for_agents(
    mut config: Kubeconfig,
    local: SocketAddr,
) -> Result<(Kubeconfig, ApiServer), String> {
    let context_name = config
        .current_context
        .clone()
        .ok_or("the kubeconfig has no current-context")?;
    let cluster_name = config
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .ok_or_else(|| format!("the kubeconfig has no context {context_name:?}"))?;
    let cluster = config
        .clusters
        .iter_mut()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.as_mut())
        .ok_or_else(|| format!("the kubeconfig has no cluster {cluster_name:?}"))?;
    if cluster.proxy_url.is_some() {
        return Err(format!(
            "cluster {cluster_name:?} uses proxy-url; agents in network namespaces cannot reach \
             a proxy"
        ));
    }
    let server = cluster
        .server
        .clone()
        .ok_or_else(|| format!("cluster {cluster_name:?} has no server"))?;
    let uri: http::Uri = server
        .parse()
        .map_err(|e| format!("cluster {cluster_name:?}: server {server:?}: {e}"))?;
    let scheme = uri.scheme_str().unwrap_or("https").to_owned();
    let default_port = match scheme.as_str() {
        "https" => 443,
        "http" => 80,
        other => return Err(format!("server {server:?}: unknown scheme {other:?}")),
    };
    let authority = uri
        .authority()
        .ok_or_else(|| format!("server {server:?} has no host"))?;
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = authority.port_u16().unwrap_or(default_port);
    let path = uri
        .path_and_query()
        .map(|p| p.as_str())
        .filter(|p| *p != "/")
        .unwrap_or("");
    cluster.server = Some(format!("{scheme}://{local}{path}"));
    if scheme == "https" && cluster.tls_server_name.is_none() {
        cluster.tls_server_name = Some(host.clone());
    }
    Ok((config, ApiServer { host, port }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = r"
apiVersion: v1
kind: Config
current-context: e2e
clusters:
- name: other
  cluster:
    server: https://other.example:6443
- name: kind
  cluster:
    server: https://[fd00::1]:36443/prefix
    certificate-authority-data: Q0E=
contexts:
- name: e2e
  context:
    cluster: kind
    user: admin
users:
- name: admin
  user:
    token: secret-token
";

    fn local() -> SocketAddr {
        "127.0.0.1:6443".parse().unwrap()
    }

    #[test]
    fn points_the_current_cluster_at_the_forwarder_and_keeps_tls_and_credentials() {
        let config = Kubeconfig::from_yaml(KUBECONFIG).unwrap();
        let (rewritten, api) = for_agents(config, local()).unwrap();
        assert_eq!(
            api,
            ApiServer {
                host: "fd00::1".to_owned(),
                port: 36443
            }
        );
        let kind = rewritten.clusters[1].cluster.as_ref().unwrap();
        assert_eq!(
            kind.server.as_deref(),
            Some("https://127.0.0.1:6443/prefix")
        );
        assert_eq!(kind.tls_server_name.as_deref(), Some("fd00::1"));
        assert_eq!(kind.certificate_authority_data.as_deref(), Some("Q0E="));
        // Other clusters are left alone.
        let other = rewritten.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(other.server.as_deref(), Some("https://other.example:6443"));
        // The written file reads back with the token intact.
        let text = serde_json::to_string(&rewritten).unwrap();
        let back = Kubeconfig::from_yaml(&text).unwrap();
        let token = back.auth_infos[0].auth_info.as_ref().unwrap().token.clone();
        assert!(token.is_some());
        assert!(text.contains("secret-token"));
        assert_eq!(back.current_context.as_deref(), Some("e2e"));
    }

    #[test]
    fn keeps_an_explicit_tls_server_name_and_defaults_the_port() {
        let text = KUBECONFIG
            .replace("https://[fd00::1]:36443/prefix", "https://api.example")
            .replace(
                "certificate-authority-data: Q0E=",
                "tls-server-name: kubernetes.default",
            );
        let (rewritten, api) = for_agents(Kubeconfig::from_yaml(&text).unwrap(), local()).unwrap();
        assert_eq!(api.port, 443);
        assert_eq!(api.host, "api.example");
        let kind = rewritten.clusters[1].cluster.as_ref().unwrap();
        assert_eq!(kind.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(kind.tls_server_name.as_deref(), Some("kubernetes.default"));
    }

    #[test]
    fn refuses_what_a_namespace_cannot_reach_or_find() {
        let proxied = KUBECONFIG.replace(
            "certificate-authority-data: Q0E=",
            "proxy-url: http://proxy:3128",
        );
        let err = for_agents(Kubeconfig::from_yaml(&proxied).unwrap(), local()).unwrap_err();
        assert!(err.contains("proxy-url"), "{err}");
        let no_context = KUBECONFIG.replace("current-context: e2e", "current-context: gone");
        let err = for_agents(Kubeconfig::from_yaml(&no_context).unwrap(), local()).unwrap_err();
        assert!(err.contains("no context"), "{err}");
    }
}
