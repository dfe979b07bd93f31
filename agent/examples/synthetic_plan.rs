//! Writes the plan file of one node of a synthetic cluster (the benches' cluster: Services ×
//! 10 endpoints, 5 % Local, 5 % zone-hinted, 100 nodes in 10 zones, seed 1), for
//! `proxyplan-agent apply --plan FILE` at scale by hand.
//!
//! `cargo run --release -p proxyplan-agent --example synthetic_plan -- SERVICES FILE`
//! (node `node-00000`). Optional third argument: the seed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proxyplan_controller::synthetic::{SyntheticCluster, SyntheticSpec};
use proxyplan_controller::{DesiredObject, Planner};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(services), Some(file)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: synthetic_plan SERVICES FILE [SEED]");
        std::process::exit(2);
    };
    let spec = SyntheticSpec {
        services: services.parse().expect("SERVICES: a number"),
        endpoints_per_service: 10,
        nodes: 100,
        zones: 10,
        local_fraction: 0.05,
        hinted_fraction: 0.05,
        seed: args
            .get(3)
            .map_or(1, |s| s.parse().expect("SEED: a number")),
    };
    let cluster = SyntheticCluster::generate(&spec).expect("synthetic cluster");
    let mut planner = Planner::new(SyntheticCluster::planner_config());
    let errors = cluster.load_into(&mut planner);
    assert!(errors.is_empty(), "planner refused objects: {errors:?}");
    let mut node = String::new();
    let mut services = String::new();
    for object in planner.take_changes().apply {
        match object {
            DesiredObject::Plan(p) if p.metadata.name.as_deref() == Some("node-00000") => {
                node = format!("---\n{}", serde_yaml::to_string(&p).unwrap());
            }
            DesiredObject::Plan(_) => {}
            DesiredObject::Service(s) => {
                services.push_str("---\n");
                services.push_str(&serde_yaml::to_string(&s).unwrap());
            }
        }
    }
    assert!(!node.is_empty(), "no plan for node-00000");
    std::fs::write(file, node + &services).expect("write the plan file");
}
