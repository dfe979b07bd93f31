//! Switching modes on a node, with the real binary in a throwaway network namespace: the
//! mode that starts removes what the agent owns of the others (iptables mode's
//! `PROXYPLAN-*` chains, nftables mode's `proxyplan` tables), and `cleanup` without
//! `--mode` removes every mode's.
//!
//! Without root the test prints a SKIPPED line and passes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../benches/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;

use common::{Netns, Objects};
use proxyplan_controller::Planner;
use proxyplan_controller::synthetic::SyntheticCluster;

const AGENT: &str = env!("CARGO_BIN_EXE_proxyplan-agent");

/// Runs the agent in `ns`; returns its stderr (the log) and stdout.
fn agent(ns: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, AGENT])
        .args(args)
        .output()
        .expect("run the agent");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(out.status.success(), "proxyplan-agent {args:?}: {text}");
    text
}

/// `program args` in `ns`, its stdout.
fn output(ns: &str, program: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, program])
        .args(args)
        .output()
        .expect("run a tool");
    assert!(out.status.success(), "{program} {args:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What the node holds of each mode: (iptables-nft `PROXYPLAN-*` chains, nftables
/// `proxyplan` tables).
fn held(ns: &str) -> (usize, usize) {
    let chains = ["iptables-nft-save", "ip6tables-nft-save"]
        .iter()
        .map(|tool| {
            output(ns, tool, &[])
                .lines()
                .filter(|l| l.starts_with(":PROXYPLAN-"))
                .count()
        })
        .sum();
    let tables = output(ns, "nft", &["list", "tables"])
        .lines()
        .filter(|l| l.ends_with(" proxyplan"))
        .count();
    (chains, tables)
}

/// A small synthetic cluster's plan file for the node (`common::NODE`).
fn plan_file(path: &Path) {
    let cluster = SyntheticCluster::generate(&common::spec(20)).expect("synthetic cluster");
    let mut planner = Planner::new(SyntheticCluster::planner_config());
    assert!(cluster.load_into(&mut planner).is_empty());
    let mut objects = Objects::default();
    objects.take(&mut planner);
    objects.write_file(path);
}

#[test]
fn a_starting_mode_removes_the_other_modes_leftovers() {
    if !common::is_root() {
        println!("SKIPPED: switching modes needs root (network namespaces)");
        return;
    }
    let ns = Netns::new("switch");
    let file = std::env::temp_dir().join(format!("mode-switch-{}.yaml", std::process::id()));
    plan_file(&file);
    let plan = file.to_str().unwrap();
    let nft = ["--iptables-backend", "nft"];

    agent(
        &ns.0,
        &[&["apply", "--mode", "iptables", "--plan", plan], &nft[..]].concat(),
    );
    let (chains, tables) = held(&ns.0);
    assert!(chains > 0, "iptables mode wrote no chains");
    assert_eq!(tables, 0);

    let log = agent(
        &ns.0,
        &[&["apply", "--mode", "nftables", "--plan", plan], &nft[..]].concat(),
    );
    assert!(
        log.contains("switching to nftables mode: removed what iptables mode left"),
        "{log}"
    );
    let (chains_left, tables) = held(&ns.0);
    assert_eq!(
        chains_left, 0,
        "iptables mode's chains left in nftables mode"
    );
    assert!(tables > 0, "nftables mode wrote no table");

    let log = agent(
        &ns.0,
        &[&["apply", "--mode", "iptables", "--plan", plan], &nft[..]].concat(),
    );
    assert!(
        log.contains("switching to iptables mode: removed what nftables mode left"),
        "{log}"
    );
    assert_eq!(held(&ns.0), (chains, 0), "back in iptables mode");

    agent(&ns.0, &[&["cleanup"], &nft[..]].concat());
    assert_eq!(held(&ns.0), (0, 0), "cleanup without --mode");
    let _ = std::fs::remove_file(&file);
}
