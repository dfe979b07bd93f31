//! `proxyplan-controller`: computes a `NodeProxyPlan` for every node.

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    cli::Cli::parse().run()
}
