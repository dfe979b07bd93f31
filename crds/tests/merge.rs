//! `merge`: layering and the errors that name the object and field.

use proxyplan_crds::{
    EmptyAction, Endpoint, EndpointOverride, IpFamily, LocalTrafficDetection, LocalTrafficMode,
    MasqueradePlan, NodeProxyPlan, NodeProxyPlanSpec, PlanError, Protocol, ProxyPlanShard,
    ProxyPlanShardSpec, ServicePortPlan, ShardRef, ShardScope, TrafficPlan, TrafficPolicy, merge,
};

fn ep(ip: &str, port: u16) -> Endpoint {
    Endpoint {
        ip: ip.into(),
        port,
    }
}

fn entry(key: &str, cluster_ip: &str, eps: Vec<Endpoint>) -> ServicePortPlan {
    ServicePortPlan {
        key: key.into(),
        namespace: "default".into(),
        name: "web".into(),
        port_name: "http".into(),
        family: IpFamily::IPv4,
        protocol: Protocol::TCP,
        port: 80,
        cluster_ip: cluster_ip.into(),
        external_ips: vec![],
        load_balancer_ips: vec![],
        node_port: None,
        load_balancer_source_ranges: vec![],
        health_check_node_port: None,
        session_affinity: None,
        internal: TrafficPlan {
            policy: TrafficPolicy::Cluster,
            when_empty: EmptyAction::Reject,
        },
        external: None,
        cluster_endpoints: eps,
        local_endpoints: vec![],
        masquerade: MasqueradePlan {
            all: false,
            off_cluster_to_cluster_ip: false,
            external: false,
            local_host_to_external: false,
            hairpin: true,
        },
    }
}

fn plan(shards: &[&str], overlay: Vec<EndpointOverride>) -> NodeProxyPlan {
    NodeProxyPlan::new(
        "n1",
        NodeProxyPlanSpec {
            node_name: "n1".into(),
            revision: "r".into(),
            zone: Some("z1".into()),
            pod_cidrs: vec!["10.244.1.0/24".into()],
            addresses: vec![],
            local_traffic: LocalTrafficDetection {
                mode: LocalTrafficMode::ClusterCIDR,
                cidrs: vec![],
            },
            shards: shards
                .iter()
                .map(|s| ShardRef { name: (*s).into() })
                .collect(),
            overlay,
        },
    )
}

fn cluster_shard(name: &str, entries: Vec<ServicePortPlan>) -> ProxyPlanShard {
    ProxyPlanShard::new(
        name,
        ProxyPlanShardSpec {
            scope: ShardScope::Cluster,
            zone: None,
            revision: format!("{name}-rev"),
            service_ports: entries,
            overrides: vec![],
        },
    )
}

fn zone_shard(name: &str, zone: &str, overrides: Vec<EndpointOverride>) -> ProxyPlanShard {
    ProxyPlanShard::new(
        name,
        ProxyPlanShardSpec {
            scope: ShardScope::Zone,
            zone: Some(zone.into()),
            revision: format!("{name}-rev"),
            service_ports: vec![],
            overrides,
        },
    )
}

const KEY: &str = "default/web:http/TCP/IPv4";

#[test]
fn node_overlay_wins_over_zone_over_cluster() {
    let cluster = cluster_shard(
        "cluster-0",
        vec![entry(
            KEY,
            "10.96.0.1",
            vec![ep("10.0.0.1", 80), ep("10.0.0.2", 80)],
        )],
    );
    let zone = zone_shard(
        "zone-z1-0",
        "z1",
        vec![EndpointOverride {
            key: KEY.into(),
            cluster_endpoints: Some(vec![ep("10.0.0.2", 80)]),
            local_endpoints: None,
        }],
    );
    let p = plan(
        &["cluster-0", "zone-z1-0"],
        vec![EndpointOverride {
            key: KEY.into(),
            cluster_endpoints: None,
            local_endpoints: Some(vec![ep("10.0.0.9", 80)]),
        }],
    );
    let merged = merge(&p, &[cluster.clone(), zone.clone()]).expect("valid");
    assert_eq!(
        merged.service_ports[0].cluster_endpoints,
        vec![ep("10.0.0.2", 80)]
    );
    assert_eq!(
        merged.service_ports[0].local_endpoints,
        vec![ep("10.0.0.9", 80)]
    );
    assert_eq!(
        merged.shard_revisions.get("zone-z1-0").map(String::as_str),
        Some("zone-z1-0-rev")
    );
    // Shards the plan does not name are ignored.
    let other = cluster_shard("cluster-9", vec![entry("x/y:/TCP/IPv4", "bad", vec![])]);
    assert!(merge(&p, &[cluster, zone, other]).is_ok());
}

#[test]
fn errors_name_the_object_and_the_field() {
    let bad_ip = cluster_shard(
        "cluster-0",
        vec![entry(
            KEY,
            "10.96.0.1",
            vec![ep("10.0.0.1", 80), ep("fd00::1", 80)],
        )],
    );
    let err = merge(&plan(&["cluster-0"], vec![]), &[bad_ip]).expect_err("family mismatch");
    assert_eq!(
        err.to_string(),
        "ProxyPlanShard/cluster-0: spec.servicePorts[0].clusterEndpoints[1].ip: fd00::1 is not an IPv4 address"
    );
    assert_eq!(err.label(), "invalid_field");

    let err = merge(
        &plan(&["cluster-0", "cluster-1"], vec![]),
        &[cluster_shard("cluster-0", vec![])],
    )
    .expect_err("missing");
    assert_eq!(
        err,
        PlanError::MissingShard {
            plan: "n1".into(),
            index: 1,
            shard: "cluster-1".into()
        }
    );

    let dangling = vec![EndpointOverride {
        key: "nope".into(),
        cluster_endpoints: None,
        local_endpoints: Some(vec![]),
    }];
    let err = merge(
        &plan(&["cluster-0"], dangling),
        &[cluster_shard("cluster-0", vec![])],
    )
    .expect_err("dangling");
    assert_eq!(
        err.to_string(),
        "NodeProxyPlan/n1: spec.overlay[0].key: no service port nope"
    );

    let wrong_zone = zone_shard("zone-z2-0", "z2", vec![]);
    let err = merge(&plan(&["zone-z2-0"], vec![]), &[wrong_zone]).expect_err("zone");
    assert!(
        err.to_string()
            .starts_with("ProxyPlanShard/zone-z2-0: spec.zone: zone Some(\"z2\")"),
        "{err}"
    );

    let dup = cluster_shard(
        "cluster-0",
        vec![entry(
            KEY,
            "10.96.0.1",
            vec![ep("10.0.0.1", 80), ep("10.0.0.1", 80)],
        )],
    );
    let err = merge(&plan(&["cluster-0"], vec![]), &[dup]).expect_err("duplicate");
    assert_eq!(
        err.to_string(),
        "ProxyPlanShard/cluster-0: spec.servicePorts[0].clusterEndpoints[1]: duplicate endpoint 10.0.0.1:80"
    );

    let mut zero = entry(KEY, "10.96.0.1", vec![]);
    zero.node_port = Some(0);
    let err = merge(
        &plan(&["cluster-0"], vec![]),
        &[cluster_shard("cluster-0", vec![zero])],
    )
    .expect_err("port");
    assert_eq!(
        err.to_string(),
        "ProxyPlanShard/cluster-0: spec.servicePorts[0].nodePort: port must be between 1 and 65535"
    );
}
