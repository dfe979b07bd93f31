//! Health-check node ports of `externalTrafficPolicy: Local` Services: load balancers ask
//! each node whether it has local endpoints. Answers as kube-proxy does: 200 with the
//! local endpoint count when there are some and the proxy is healthy, 503 otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use proxyplan_crds::MergedPlan;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::http::Health;

/// An address range, as `--nodeport-addresses` takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// The network address with the host bits cleared (`10.1.2.3/8` → `10.0.0.0`).
    #[must_use]
    pub fn addr(&self) -> IpAddr {
        match self.network {
            IpAddr::V4(net) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V4((u32::from(net) & mask).into())
            }
            IpAddr::V6(net) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(net) & mask).into())
            }
        }
    }

    /// The prefix length.
    #[must_use]
    pub fn prefix_len(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is inside.
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{text:?} is not a CIDR like 10.0.0.0/8 or fd00::/64");
        let (ip, prefix) = text.split_once('/').ok_or_else(bad)?;
        let network: IpAddr = ip.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(bad());
        }
        Ok(Self { network, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// What a health-check port reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceHealth {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// Distinct local endpoint addresses over the Service's ports and families.
    pub local_endpoints: usize,
}

/// The health-check ports `plan` asks for, by port.
#[must_use]
pub fn wanted_ports(plan: &MergedPlan) -> BTreeMap<u16, ServiceHealth> {
    let mut local: BTreeMap<u16, ((&str, &str), BTreeSet<&str>)> = BTreeMap::new();
    for entry in &plan.service_ports {
        let Some(port) = entry.health_check_node_port else {
            continue;
        };
        let service = (entry.namespace.as_str(), entry.name.as_str());
        let (owner, addresses) = local
            .entry(port)
            .or_insert_with(|| (service, BTreeSet::new()));
        if *owner != service {
            warn!(
                port,
                service = %format!("{}/{}", service.0, service.1),
                owner = %format!("{}/{}", owner.0, owner.1),
                "health-check node port already used by another Service; ignored"
            );
            continue;
        }
        // kube-proxy counts ready local endpoints only: a node whose local endpoints are
        // all terminating still serves them, but tells load balancers to stop sending.
        if !entry.local_terminating {
            addresses.extend(entry.local_endpoints.iter().map(|e| e.ip.as_str()));
        }
    }
    local
        .into_iter()
        .map(|(port, ((namespace, name), addresses))| {
            (
                port,
                ServiceHealth {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    local_endpoints: addresses.len(),
                },
            )
        })
        .collect()
}

/// kube-proxy's health-check response body, byte for byte: the same tab-indented lines
/// (`pkg/proxy/healthcheck/service_health.go`).
fn body(namespace: &str, name: &str, local_endpoints: usize, healthy: bool) -> String {
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned());
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {local_endpoints},\n\t\"serviceProxyHealthy\": {healthy}\n}}",
        quote(namespace),
        quote(name),
    )
}

#[derive(Clone)]
struct PortState {
    service: watch::Receiver<ServiceHealth>,
    health: Arc<Health>,
}

struct PortServer {
    service: watch::Sender<ServiceHealth>,
    addresses: Vec<IpAddr>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for PortServer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The health-check servers, one per port the applied plan asks for.
pub struct HealthCheckServers {
    nodeport_addresses: Vec<Cidr>,
    primary: bool,
    health: Arc<Health>,
    servers: BTreeMap<u16, PortServer>,
    /// The runtime that serves them ([`super::http::HttpThread`]'s).
    runtime: tokio::runtime::Handle,
}

impl HealthCheckServers {
    /// Servers listening on the node addresses inside `nodeport_addresses` (every
    /// address when empty), answering with `health` as the proxy's health.
    /// With `primary` (`--nodeport-addresses primary`) only on the node's primary IPs.
    /// They are served on `runtime`.
    #[must_use]
    pub fn new(
        nodeport_addresses: Vec<Cidr>,
        primary: bool,
        health: Arc<Health>,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        Self {
            nodeport_addresses,
            primary,
            health,
            servers: BTreeMap::new(),
            runtime,
        }
    }

    /// The ports served.
    #[must_use]
    pub fn ports(&self) -> Vec<u16> {
        self.servers
            .iter()
            .filter(|(_, s)| !s.tasks.is_empty())
            .map(|(port, _)| *port)
            .collect()
    }

    /// Starts, updates and stops servers to match `plan`. A port that cannot be bound is
    /// logged and tried again at the next update.
    pub fn update(&mut self, plan: &MergedPlan) {
        self.serve(wanted_ports(plan), &plan.addresses);
    }

    /// Starts, updates and stops servers to answer `wanted` on the node's
    /// `node_addresses` (those inside `--nodeport-addresses`).
    pub fn serve(&mut self, wanted: BTreeMap<u16, ServiceHealth>, node_addresses: &[IpAddr]) {
        self.servers.retain(|port, _| {
            let keep = wanted.contains_key(port);
            if !keep {
                info!(port, "health-check node port closed");
            }
            keep
        });
        let addresses = self.bind_addresses(node_addresses);
        for (port, service) in wanted {
            if let Some(server) = self.servers.get_mut(&port)
                && server.addresses == addresses
                && !server.tasks.is_empty()
            {
                server.service.send_if_modified(|current| {
                    let changed = *current != service;
                    *current = service;
                    changed
                });
                continue;
            }
            self.servers.remove(&port);
            let server = self.start(port, service, &addresses);
            self.servers.insert(port, server);
        }
    }

    fn bind_addresses(&self, node_addresses: &[IpAddr]) -> Vec<IpAddr> {
        if self.primary {
            return proxyplan_crds::primary_addresses(node_addresses);
        }
        if self.nodeport_addresses.is_empty() {
            return vec![IpAddr::V6(Ipv6Addr::UNSPECIFIED)];
        }
        let mut addresses: Vec<IpAddr> = node_addresses
            .iter()
            .copied()
            .filter(|ip| self.nodeport_addresses.iter().any(|c| c.contains(*ip)))
            .collect();
        addresses.sort_unstable();
        addresses.dedup();
        addresses
    }

    fn start(&self, port: u16, service: ServiceHealth, addresses: &[IpAddr]) -> PortServer {
        let name = format!("{}/{}", service.namespace, service.name);
        let (tx, rx) = watch::channel(service);
        let state = PortState {
            service: rx,
            health: self.health.clone(),
        };
        let router = Router::new().fallback(answer).with_state(state);
        let mut tasks = Vec::new();
        if addresses.is_empty() {
            warn!(port, service = %name, "no node address inside --nodeport-addresses; health-check node port not served");
        }
        for &ip in addresses {
            match listen(ip, port) {
                Ok(listener) => {
                    let router = router.clone();
                    tasks.push(self.runtime.spawn(async move {
                        // Registered with the runtime that serves it.
                        let served = match tokio::net::TcpListener::from_std(listener) {
                            Ok(listener) => axum::serve(listener, router).await,
                            Err(err) => Err(err),
                        };
                        if let Err(err) = served {
                            warn!(port, %err, "health-check server stopped");
                        }
                    }));
                    info!(port, %ip, service = %name, "health-check node port open");
                }
                Err(err) => {
                    warn!(port, %ip, service = %name, %err, "cannot open health-check node port; retrying at the next sync");
                }
            }
        }
        PortServer {
            service: tx,
            addresses: addresses.to_vec(),
            tasks,
        }
    }
}

/// Binds `ip:port`; the IPv6 wildcard falls back to the IPv4 one on nodes without IPv6.
/// Non-blocking, for the runtime that will serve it.
fn listen(ip: IpAddr, port: u16) -> std::io::Result<std::net::TcpListener> {
    let bind = |ip: IpAddr| -> std::io::Result<std::net::TcpListener> {
        let listener = std::net::TcpListener::bind(SocketAddr::new(ip, port))?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    };
    match bind(ip) {
        Err(err) if ip == IpAddr::V6(Ipv6Addr::UNSPECIFIED) => {
            debug!(port, %err, "IPv6 wildcard unavailable; listening on IPv4 only");
            bind(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
        }
        other => other,
    }
}

async fn answer(State(state): State<PortState>) -> Response {
    let service = state.service.borrow().clone();
    let healthy = state.health.is_healthy();
    let status = if service.local_endpoints > 0 && healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = body(
        &service.namespace,
        &service.name,
        service.local_endpoints,
        healthy,
    );
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        "x-load-balancing-endpoint-weight",
        HeaderValue::from(service.local_endpoints),
    );
    response
}

#[cfg(test)]
mod tests {
    use proxyplan_crds::{
        EmptyAction, Endpoint, IpFamily, LocalTrafficDetection, LocalTrafficMode, MasqueradePlan,
        Protocol, ServicePortPlan, TrafficPlan, TrafficPolicy,
    };

    use super::*;

    fn entry(name: &str, port_name: &str, hc: Option<u16>, local: &[&str]) -> ServicePortPlan {
        ServicePortPlan {
            key: format!("default/{name}:{port_name}/TCP/IPv4"),
            namespace: "default".into(),
            name: name.into(),
            port_name: port_name.into(),
            family: IpFamily::IPv4,
            protocol: Protocol::TCP,
            port: 80,
            cluster_ip: "10.96.0.10".into(),
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            node_port: Some(30080),
            load_balancer_source_ranges: Vec::new(),
            health_check_node_port: hc,
            session_affinity: None,
            internal: TrafficPlan {
                policy: TrafficPolicy::Cluster,
                when_empty: EmptyAction::Reject,
            },
            external: Some(TrafficPlan {
                policy: TrafficPolicy::Local,
                when_empty: EmptyAction::Drop,
            }),
            cluster_endpoints: Vec::new(),
            zone_endpoints: Vec::new(),
            local_endpoints: local
                .iter()
                .map(|ip| Endpoint {
                    ip: (*ip).into(),
                    port: 8080,
                })
                .collect(),
            masquerade: MasqueradePlan {
                all: false,
                off_cluster_to_cluster_ip: false,
                external: false,
                local_host_to_external: true,
                hairpin: true,
            },
            local_terminating: false,
            also_serving: Vec::new(),
        }
    }

    fn plan(entries: Vec<ServicePortPlan>) -> MergedPlan {
        MergedPlan {
            node_name: "node-a".to_owned(),
            revision: "r1".to_owned(),
            services_fingerprint: 0,
            refused: Vec::new(),
            unmatched: Vec::new(),
            addresses: Vec::new(),
            local_traffic: LocalTrafficDetection {
                mode: LocalTrafficMode::ClusterCIDR,
                cidrs: Vec::new(),
                interface: None,
            },
            service_ports: entries.into_iter().map(std::sync::Arc::new).collect(),
            service_cidrs: Vec::new(),
        }
    }

    #[test]
    fn ports_count_distinct_local_addresses_per_service() {
        let wanted = wanted_ports(&plan(vec![
            entry("web", "http", Some(31000), &["10.244.1.2", "10.244.1.3"]),
            entry("web", "https", Some(31000), &["10.244.1.2", "10.244.1.3"]),
            entry("api", "http", Some(31001), &[]),
            entry("db", "sql", None, &["10.244.1.9"]),
            entry("thief", "http", Some(31000), &["10.244.1.7"]),
        ]));
        let summary: Vec<_> = wanted
            .iter()
            .map(|(p, s)| (*p, s.name.as_str(), s.local_endpoints))
            .collect();
        assert_eq!(summary, [(31000, "web", 2), (31001, "api", 0)]);
    }

    #[test]
    fn only_ready_local_endpoints_count() {
        // Terminating local endpoints still take traffic (the plan lists them), but the
        // load balancer must stop sending new connections: kube-proxy counts 0.
        let mut draining = entry("web", "http", Some(31000), &["10.244.1.2"]);
        draining.local_terminating = true;
        let wanted = wanted_ports(&plan(vec![draining]));
        assert_eq!(wanted[&31000].local_endpoints, 0);
    }

    #[test]
    fn the_body_is_kube_proxys() {
        assert_eq!(
            body("default", "web", 2, true),
            "{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
        let parsed: serde_json::Value =
            serde_json::from_str(&body("a\"b", "web", 0, false)).expect("JSON");
        assert_eq!(parsed["service"]["namespace"], "a\"b");
        assert_eq!(parsed["serviceProxyHealthy"], false);
    }

    /// The health-check ports live on the HTTP thread: they answer while the thread that
    /// asked for them (the sync loop's, here a plain thread running no runtime at all)
    /// is busy.
    #[test]
    fn health_check_ports_answer_while_the_sync_thread_is_busy() {
        use std::io::{Read, Write};

        let http = super::super::http::HttpThread::start().unwrap();
        let health = Arc::new(Health::new(std::time::Duration::from_secs(60)));
        let cidrs = vec![Cidr::from_str("127.0.0.0/8").unwrap()];
        let mut servers = HealthCheckServers::new(cidrs, false, health, http.handle().clone());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let service = ServiceHealth {
            namespace: "default".into(),
            name: "web".into(),
            local_endpoints: 2,
        };
        servers.serve(
            BTreeMap::from([(port, service)]),
            &["127.0.0.1".parse().unwrap()],
        );
        assert_eq!(servers.ports(), vec![port]);
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        stream.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.0 200 "), "{answer}");
        assert!(answer.contains("\"localEndpoints\": 2"), "{answer}");
        // Stopped with the servers.
        drop(servers);
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    }

    #[test]
    fn cidrs_parse_and_match() {
        let v4: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(v4.contains("10.1.2.3".parse().unwrap()));
        assert!(!v4.contains("11.0.0.1".parse().unwrap()));
        assert!(!v4.contains("::1".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("192.168.1.1".parse().unwrap()));
        let v6: Cidr = "fd00::/64".parse().unwrap();
        assert!(v6.contains("fd00::5".parse().unwrap()));
        assert!(!v6.contains("fd01::5".parse().unwrap()));
        let host: Cidr = "127.0.0.1/32".parse().unwrap();
        assert!(host.contains("127.0.0.1".parse().unwrap()));
        assert_eq!(host.to_string(), "127.0.0.1/32");
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/8", "::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }
}
