//! `proxyplan-agent`: programs a node's kernel from its `NodeProxyPlan`.

mod cli;
mod switch;
mod uninstall;

use clap::Parser;

fn main() -> std::process::ExitCode {
    cli::Cli::parse().run()
}
