//! An iptables-mode agent restarting on a node whose kernel already holds its rules, at
//! any scale, measured: run it in the network namespace where `proxyplan-agent apply`
//! programmed the same plan file.
//!
//! ```text
//! cargo run --release -p proxyplan-agent --example synthetic_plan -- 10000 /tmp/plan.yaml
//! ip netns add pp10k
//! ip netns exec pp10k proxyplan-agent apply --mode iptables --iptables-backend nft --plan /tmp/plan.yaml
//! ip netns exec pp10k target/release/examples/iptables_restart /tmp/plan.yaml nft
//! ```
//!
//! Prints: the restart's sync (its time, the time spent reading the kernel, what it
//! changed, how many `iptables-restore` runs it made: 0 when nothing changed), the first
//! periodic check after it (a full read), the next one (on nft, answered by the nf_tables
//! generation alone), the first change after it (one endpoint of the first IPv4 service
//! port moved: its time and payload), and the process's peak memory. With a third argument `tamper`, it
//! then deletes the `PREROUTING` jump, checks, syncs (the repair) and checks again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::Cell;
use std::time::{Duration, Instant};

use proxyplan_agent::dataplane::{Dataplane, DataplaneError};
use proxyplan_agent::kernel::xtables_nft::{DumpSummary, NftChain, NftRule};
use proxyplan_agent::kernel::{Backend, CommandOutput, CommandRunner, Family, InputWriter, Runner};
use proxyplan_agent::modes::iptables::{IptablesDataplane, RenderSettings};

/// A real runner that counts restores and the time spent reading.
#[derive(Default)]
struct Counting {
    inner: CommandRunner,
    restores: Cell<usize>,
    reading: Cell<Duration>,
}

impl Counting {
    fn read<T>(&self, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.reading.set(self.reading.get() + start.elapsed());
        out
    }

    fn take(&self) -> (usize, Duration) {
        (
            self.restores.replace(0),
            self.reading.replace(Duration::ZERO),
        )
    }
}

impl Runner for Counting {
    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<CommandOutput, DataplaneError> {
        self.read(|| self.inner.run(program, args, stdin))
    }

    fn run_with_input(
        &self,
        program: &str,
        args: &[&str],
        input: &mut InputWriter<'_>,
    ) -> Result<CommandOutput, DataplaneError> {
        if program.ends_with("-restore") {
            self.restores.set(self.restores.get() + 1);
        }
        self.inner.run_with_input(program, args, input)
    }

    fn run_lines(
        &self,
        program: &str,
        args: &[&str],
        line: &mut dyn FnMut(&str),
    ) -> Result<CommandOutput, DataplaneError> {
        self.read(|| self.inner.run_lines(program, args, line))
    }

    fn nft_table(
        &self,
        family: Family,
        table: &str,
        chain: &mut dyn FnMut(NftChain<'_>),
        rule: &mut dyn FnMut(NftRule<'_>),
        restart: &mut dyn FnMut(),
    ) -> Result<Option<DumpSummary>, DataplaneError> {
        self.read(|| self.inner.nft_table(family, table, chain, rule, restart))
    }

    fn nft_generation(&self) -> Result<Option<u32>, DataplaneError> {
        self.read(|| self.inner.nft_generation())
    }
}

fn own_hwm_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0)
        / 1024
}

fn check(dp: &mut IptablesDataplane<Counting>, what: &str) {
    let start = Instant::now();
    let intact = dp.rules_intact().expect("periodic check");
    let took = start.elapsed();
    let (restores, reading) = dp.runner().take();
    println!("{what}: {took:.2?} (reading {reading:.2?}), intact: {intact}, restores: {restores}");
}

/// The first change after the restart: one endpoint of the first IPv4 service port with
/// endpoints moves to another address.
fn one_change(dp: &mut IptablesDataplane<Counting>, plan: &mut proxyplan_crds::MergedPlan) {
    let Some(entry) = plan
        .service_ports
        .iter_mut()
        .find(|e| e.family == proxyplan_crds::IpFamily::IPv4 && !e.cluster_endpoints.is_empty())
    else {
        println!("no IPv4 service port with endpoints to change");
        return;
    };
    std::sync::Arc::make_mut(entry).cluster_endpoints[0].ip = "10.250.0.1".into();
    let start = Instant::now();
    let report = dp.sync(plan, false).expect("one change");
    let took = start.elapsed();
    let (restores, _) = dp.runner().take();
    let sent = dp.payload_sent();
    println!(
        "one endpoint change after the restart: {took:.2?}, {} changed, {restores} \
         iptables-restore runs, {} payload lines / {} bytes",
        report.changed, sent.lines, sent.bytes
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(file), Some(backend)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: iptables_restart PLAN_FILE nft|legacy [tamper]");
        std::process::exit(2);
    };
    let backend = match backend.as_str() {
        "nft" => Backend::Nft,
        "legacy" => Backend::Legacy,
        other => panic!("unknown back end {other}"),
    };
    let start = Instant::now();
    let (node, services) =
        proxyplan_agent::run::plan_file::read(std::path::Path::new(file)).expect("plan file");
    let mut plan = proxyplan_crds::merge_owned(node, services).expect("plan merges");
    println!(
        "plan: {} service ports, read in {:.2?}",
        plan.service_ports.len(),
        start.elapsed()
    );
    let mut dp = IptablesDataplane::new(RenderSettings::default(), Counting::default(), backend);
    let start = Instant::now();
    let report = dp.sync(&plan, false).expect("restart sync");
    let took = start.elapsed();
    let (restores, reading) = dp.runner().take();
    let sent = dp.payload_sent();
    println!(
        "restart sync ({backend:?}): {took:.2?} (reading the kernel {reading:.2?}), {} rules, \
         {} changed, {restores} iptables-restore runs, {} payload lines / {} bytes",
        report.rules, report.changed, sent.lines, sent.bytes
    );
    check(&mut dp, "first periodic check");
    check(&mut dp, "next periodic check");
    one_change(&mut dp, &mut plan);
    if args.get(3).map(String::as_str) == Some("tamper") {
        let iptables = backend.binary(Family::V4, proxyplan_agent::kernel::Tool::Iptables);
        let status = std::process::Command::new(&iptables)
            .args(["-t", "nat", "-D", "PREROUTING", "1"])
            .status()
            .expect("iptables");
        assert!(status.success(), "{iptables} -D PREROUTING 1");
        check(&mut dp, "check after deleting the PREROUTING jump");
        let start = Instant::now();
        let report = dp.sync(&plan, false).expect("repair");
        let (restores, _) = dp.runner().take();
        println!(
            "repair sync: {:.2?}, {} changed, {restores} iptables-restore runs",
            start.elapsed(),
            report.changed
        );
        check(&mut dp, "check after the repair");
    }
    println!("peak memory (VmHWM): {} MiB", own_hwm_mib());
}
