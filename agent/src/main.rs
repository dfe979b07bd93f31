//! `proxyplan-agent`: programs a node's kernel from its `NodeProxyPlan`.
//!
//! This first cut reads and validates a plan file (the plan plus the shards it names, as
//! `proxyplan-controller plan --node` prints them) and shows the merged result; kernel
//! programming arrives with the iptables and ipvs modes.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use proxyplan_crds::{NodeProxyPlan, ProxyPlanShard, TrafficPolicy};

/// Programs this node's kernel from its NodeProxyPlan.
#[derive(Debug, Parser)]
#[command(name = "proxyplan-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a plan file and print the merged service ports it programs.
    Check {
        /// A node's plan and its shards, as `proxyplan-controller plan --node` prints them.
        #[arg(long, value_name = "FILE")]
        plan: PathBuf,
        /// Also print the iptables rules the plan renders to, as iptables-restore input.
        #[arg(long)]
        rules: bool,
    },
}

fn main() -> ExitCode {
    let Cli { command } = Cli::parse();
    let result = match command {
        Command::Check { plan, rules } => check(&plan, rules),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("proxyplan-agent: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn check(path: &PathBuf, rules: bool) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut plans = Vec::new();
    let mut shards = Vec::new();
    for (i, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let value = <serde_yaml::Value as serde::Deserialize>::deserialize(document)
            .with_context(|| format!("{}: document {}", path.display(), i + 1))?;
        match value.get("kind").and_then(serde_yaml::Value::as_str) {
            Some("NodeProxyPlan") => plans.push(serde_yaml::from_value::<NodeProxyPlan>(value)?),
            Some("ProxyPlanShard") => shards.push(serde_yaml::from_value::<ProxyPlanShard>(value)?),
            None if value.is_null() => {}
            other => anyhow::bail!(
                "{}: document {}: unexpected kind {other:?}",
                path.display(),
                i + 1
            ),
        }
    }
    let [plan] = plans.as_slice() else {
        anyhow::bail!(
            "{}: expected exactly one NodeProxyPlan, found {}",
            path.display(),
            plans.len()
        );
    };
    let merged = proxyplan_crds::merge(plan, &shards)?;
    println!(
        "node {} revision {}: {} service ports",
        merged.node_name,
        merged.revision,
        merged.service_ports.len()
    );
    for entry in &merged.service_ports {
        let internal = entry.endpoints_for(&entry.internal);
        let external = entry.external.as_ref().map(|t| (t, entry.endpoints_for(t)));
        print!(
            "  {:<36} {}:{} -> {} endpoints",
            entry.key,
            entry.cluster_ip,
            entry.port,
            internal.len()
        );
        if let Some((traffic, eps)) = external {
            let policy = if traffic.policy == TrafficPolicy::Local {
                "Local"
            } else {
                "Cluster"
            };
            print!("; external ({policy}) -> {} endpoints", eps.len());
            if eps.is_empty() {
                print!(" ({:?})", traffic.when_empty);
            }
        }
        if internal.is_empty() {
            print!(" (internal: {:?})", entry.internal.when_empty);
        }
        println!();
    }
    if rules {
        let rendered = proxyplan_agent::iptables::render(
            &merged,
            &proxyplan_agent::iptables::RenderSettings::default(),
        );
        for (tool, family) in [("iptables", &rendered.v4), ("ip6tables", &rendered.v6)] {
            if family.rule_count() > 0 {
                println!("# {tool}-restore input ({} rules)", family.rule_count());
                print!("{}", family.dump());
            }
        }
    }
    Ok(())
}
