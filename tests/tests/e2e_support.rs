//! The end-to-end suite's cluster-free parts against the real thing, with no cluster:
//! its fixtures fed to the controller's planner must give exactly the merged plans the
//! suite expects, and its changes must touch exactly the objects its scenarios say they
//! do. As root, the forwarder that carries an agent's API traffic out of its network
//! namespace is also tried for real (otherwise that test prints a SKIPPED line).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use proxyplan_controller::{Planner, PlannerConfig};
use proxyplan_crds::LocalTrafficMode;
use proxyplan_tests::e2e::expect::{NodeView, differences, expected_entries};
use proxyplan_tests::e2e::fixtures::{self, World};
use proxyplan_tests::e2e::forward;

/// The Services as an API server returns them: cluster IPs and node ports allocated, the
/// load balancer's status patched.
fn allocated(world: &World, dual_stack: bool) -> Vec<Service> {
    let mut services = world.services();
    for (i, svc) in services.iter_mut().enumerate() {
        let name = svc.metadata.name.clone().unwrap();
        let spec = svc.spec.as_mut().unwrap();
        let v4 = format!("10.96.7.{}", i + 1);
        spec.cluster_ip = Some(v4.clone());
        spec.cluster_ips = Some(if dual_stack && name == fixtures::DUAL_STACK {
            vec![v4, format!("fd00:96::{}", i + 1)]
        } else {
            vec![v4]
        });
        spec.ip_families = None;
        if matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer")) {
            for (j, p) in spec.ports.iter_mut().flatten().enumerate() {
                p.node_port = Some(30_100 + i32::try_from(i * 10 + j).unwrap());
            }
        }
        if name == fixtures::LB_LOCAL {
            spec.health_check_node_port = Some(32_000);
            let patch = World::load_balancer_status_patch();
            svc.status = Some(serde_json::from_value(patch["status"].clone()).unwrap());
        }
    }
    services
}

/// The controller's planner with the suite's settings (`--cluster-cidr`), fed the fake
/// nodes plus one node that is not the suite's.
fn planner(world: &World, services: &[Service], slices: &[EndpointSlice]) -> Planner {
    let config = PlannerConfig::new(
        &[fixtures::CLUSTER_CIDR.to_owned()],
        false,
        LocalTrafficMode::ClusterCIDR,
    )
    .unwrap();
    let mut planner = Planner::new(config);
    let mut nodes: Vec<_> = world.nodes.iter().map(|n| world.node_object(n)).collect();
    let mut stranger = world.node_object(&world.nodes[0]);
    stranger.metadata.name = Some("somebody-elses-node".to_owned());
    nodes.push(stranger);
    assert!(planner.reset_nodes(&nodes).is_empty());
    assert!(planner.reset_services(services).is_empty());
    assert!(planner.reset_slices(slices).is_empty());
    planner
}

/// Every fake node's merged plan matches the suite's expectation; returns each node's
/// plan revision and every Service plan's revision.
fn check_all(
    world: &World,
    services: &[Service],
    slices: &[EndpointSlice],
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let planner = planner(world, services, slices);
    let mut plans = BTreeMap::new();
    let mut shards = BTreeMap::new();
    for node in &world.nodes {
        let (plan, node_shards) = planner.node_view(&node.name).unwrap();
        let merged = proxyplan_crds::merge(&plan, &node_shards).unwrap();
        let want = expected_entries(
            services,
            slices,
            NodeView {
                name: &node.name,
                zone: Some(&node.zone),
            },
        )
        .unwrap();
        let diff = differences(&want, &merged, &world.namespace);
        assert!(diff.is_empty(), "node {}:\n{}", node.name, diff.join("\n"));
        assert_eq!(merged.node_name, node.name);
        assert!(
            merged
                .addresses
                .iter()
                .any(|a| a.to_string() == node.address),
            "{:?}",
            merged.addresses
        );
        plans.insert(node.name.clone(), plan.spec.revision.clone());
        for shard in node_shards {
            shards.insert(proxyplan_crds::object_key(&shard), shard.spec.revision);
        }
    }
    (plans, shards)
}

fn changed(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    before
        .iter()
        .filter(|(name, rev)| after.get(*name) != Some(rev))
        .map(|(name, _)| name.clone())
        .collect()
}

#[test]
fn fixtures_give_the_merged_plans_the_suite_expects() {
    for dual_stack in [false, true] {
        let world = World::new("5eed00");
        let services = allocated(&world, dual_stack);
        let slices = world.slices(dual_stack);
        check_all(&world, &services, &slices);
    }
}

#[test]
fn an_endpoint_change_rewrites_one_service_plan_and_no_node_plan() {
    let world = World::new("5eed01");
    let services = allocated(&world, false);
    let mut slices = world.slices(false);
    let (plans, shards) = check_all(&world, &services, &slices);
    world.add_endpoint(&mut slices).unwrap();
    let (plans_after, shards_after) = check_all(&world, &services, &slices);
    assert_eq!(changed(&plans, &plans_after), Vec::<String>::new());
    let moved = changed(&shards, &shards_after);
    assert_eq!(
        moved,
        [format!("{}/{}", world.namespace, fixtures::CLUSTER_IP)],
        "{moved:?}"
    );
}

#[test]
fn a_local_endpoint_move_rewrites_only_those_nodes_plans() {
    let world = World::new("5eed02");
    let services = allocated(&world, false);
    let mut slices = world.slices(false);
    let (plans, _) = check_all(&world, &services, &slices);
    world.move_local_endpoint(&mut slices, 1).unwrap();
    let (plans_after, _) = check_all(&world, &services, &slices);
    assert_eq!(
        changed(&plans, &plans_after),
        [world.nodes[0].name.clone(), world.nodes[1].name.clone()]
    );
}

#[test]
fn a_wrong_expectation_is_reported() {
    let world = World::new("5eed03");
    let services = allocated(&world, false);
    let slices = world.slices(false);
    let planner = planner(&world, &services, &slices);
    let (plan, shards) = planner.node_view(&world.nodes[0].name).unwrap();
    let merged = proxyplan_crds::merge(&plan, &shards).unwrap();
    // Node c's expectation differs from node a's plan: the local endpoint and the zone.
    let other = &world.nodes[2];
    let want = expected_entries(
        &services,
        &slices,
        NodeView {
            name: &other.name,
            zone: Some(&other.zone),
        },
    )
    .unwrap();
    let diff = differences(&want, &merged, &world.namespace);
    assert!(
        diff.iter()
            .any(|d| d.contains("/lb-local:http/TCP/IPv4: localEndpoints")),
        "{diff:?}"
    );
    assert!(
        diff.iter()
            .any(|d| d.contains("/topology:http/TCP/IPv4: clusterEndpoints")),
        "{diff:?}"
    );
    // An entry missing from the plan is reported too.
    let mut fewer = merged.clone();
    fewer.service_ports.retain(|e| e.name != fixtures::UDP);
    let own = expected_entries(
        &services,
        &slices,
        NodeView {
            name: &world.nodes[0].name,
            zone: Some(&world.nodes[0].zone),
        },
    )
    .unwrap();
    assert_eq!(
        differences(&own, &fewer, &world.namespace),
        [format!("{}/udp:/UDP/IPv4: missing", world.namespace)]
    );
    // One Service plan per Service, each named after its Service.
    assert_eq!(shards.len(), services.len());
    assert!(merged.unmatched.is_empty() && merged.refused.is_empty());
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            == Some("0")
    })
}

/// As root: a client inside a fresh network namespace reaches a server in the host
/// namespace through `proxyplan-e2e-forward` and the suite's Unix socket, as an agent
/// reaches the API server.
#[test]
fn forwarder_carries_traffic_out_of_a_network_namespace() {
    if !is_root() {
        println!("SKIPPED: not root (needs ip netns)");
        return;
    }
    let netns = format!("pp-e2e-fwd-{}", std::process::id());
    let ok = Command::new("ip")
        .args(["netns", "add", &netns])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!("SKIPPED: ip netns add failed");
        return;
    }
    let dir = std::env::temp_dir().join(&netns);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("api.sock");
    let result = std::panic::catch_unwind(|| {
        let in_ns = |args: &[&str]| {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &netns]).args(args);
            cmd
        };
        assert!(
            in_ns(&["ip", "link", "set", "lo", "up"])
                .status()
                .unwrap()
                .success()
        );

        // The "API server": answers one line per connection.
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = server.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for conn in server.incoming() {
                let mut conn = conn.unwrap();
                let mut line = String::new();
                BufReader::new(conn.try_clone().unwrap())
                    .read_line(&mut line)
                    .unwrap();
                write!(conn, "server saw {line}").unwrap();
            }
        });
        forward::unix_to_tcp(&socket, "127.0.0.1".to_owned(), port).unwrap();

        let mut forwarder = in_ns(&[
            env!("CARGO_BIN_EXE_proxyplan-e2e-forward"),
            "127.0.0.1:6443",
            socket.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
        let mut ready = String::new();
        BufReader::new(forwarder.stdout.take().unwrap())
            .read_line(&mut ready)
            .unwrap();
        assert!(ready.starts_with(forward::READY_LINE), "{ready:?}");

        // A client in the namespace: the server's port is not reachable directly there,
        // the forwarder is.
        let client = |target: &str| {
            in_ns(&[
                "python3",
                "-c",
                &format!(
                    "import socket,sys\n\
                     s=socket.create_connection(('127.0.0.1',{target}),timeout=5)\n\
                     s.sendall(b'hello from the namespace\\n')\n\
                     sys.stdout.write(s.makefile().readline())"
                ),
            ])
            .output()
            .unwrap()
        };
        let direct = client(&port.to_string());
        assert!(!direct.status.success(), "the namespace should be isolated");
        let out = client("6443");
        let _ = forwarder.kill();
        let _ = forwarder.wait();
        let mut text = String::new();
        out.stdout.as_slice().read_to_string(&mut text).unwrap();
        assert_eq!(
            text,
            "server saw hello from the namespace\n",
            "stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    let _ = Command::new("ip").args(["netns", "del", &netns]).status();
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
