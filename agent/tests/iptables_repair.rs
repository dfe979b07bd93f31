//! The running agent (`proxyplan-agent run`'s loop, a mock API server) in iptables mode
//! on the real kernel, in a network namespace: while a Service plan changes every 100 ms
//! (each change a sync of its own), someone deletes a jump from a built-in chain or
//! flushes one of the agent's chains. The periodic check, which churn must not push back,
//! notices it and the kernel holds the rules again within one sync period. Both back
//! ends. Without root or `ip netns` each test prints a SKIPPED line and passes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod run_support;
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use proxyplan_agent::kernel::iptables::split_words;
use proxyplan_agent::kernel::{Backend, CommandRunner, Family, Tool};
use proxyplan_agent::modes::iptables::{IptablesDataplane, RenderSettings};
use proxyplan_agent::ruleset::names;
use proxyplan_agent::run::{Agent, ProxyMode, Settings};
use run_support::{MockApi, NODE, ZONE, mk_entry, mk_plan, mk_service};
use support::{Netns, chains_of, ep};
use tokio::sync::oneshot;

/// The agent's `--sync-period` here.
const PERIOD: Duration = Duration::from_secs(3);
/// Time allowed on top of one period for the check and the repair sync themselves, on a
/// busy 2-core machine.
const SLACK: Duration = Duration::from_secs(2);
/// An endpoint change every this often.
const CHURN: Duration = Duration::from_millis(100);

const WEB: &str = "default/web:http/TCP/IPv4";
const QUIET: &str = "default/quiet:http/TCP/IPv4";

fn settings() -> Settings {
    Settings {
        node_name: NODE.to_owned(),
        kubeconfig: None,
        mode: ProxyMode::Iptables,
        nodeport_addresses: Vec::new(),
        min_sync_interval: Duration::from_millis(20),
        sync_period: PERIOD,
        tamper_check_interval: Duration::ZERO,
        status_min_interval: Duration::from_secs(60),
        rollout_report_interval: Duration::from_secs(10),
        healthz_bind_address: ([127, 0, 0, 1], 0).into(),
        metrics_bind_address: ([127, 0, 0, 1], 0).into(),
        state_dir: None,
        nodeport_primary: false,
    }
}

/// `web`'s plan at step `n` of the churn: its second endpoint moves every step.
fn web(n: u32) -> proxyplan_crds::ServiceProxyPlan {
    let moving = format!("10.244.3.{}", n % 250 + 1);
    mk_service(
        "web",
        &format!("web-{n}"),
        vec![mk_entry("web", "10.96.0.10", &["10.244.1.10", &moving])],
    )
}

/// The namespace, or a SKIPPED line and `None`.
fn namespace(backend: Backend) -> Option<Arc<Netns>> {
    support::namespace_for(backend).map(Arc::new)
}

/// The v4 ruleset as `iptables-save` prints it (off the async threads).
async fn saved(ns: &Arc<Netns>, backend: Backend) -> String {
    let ns = ns.clone();
    tokio::task::spawn_blocking(move || ns.run(&[&backend.binary(Family::V4, Tool::Save)]))
        .await
        .unwrap()
}

async fn iptables(ns: &Arc<Netns>, backend: Backend, args: Vec<String>) {
    let ns = ns.clone();
    tokio::task::spawn_blocking(move || {
        let binary = backend.binary(Family::V4, Tool::Iptables);
        let mut all = vec![binary.as_str()];
        all.extend(args.iter().map(String::as_str));
        ns.run(&all);
    })
    .await
    .unwrap();
}

/// The test's side: answers the agent's status patches and, with churn on, writes a
/// new `web` plan every [`CHURN`].
struct Driver {
    api: MockApi,
    churn: bool,
    step: u32,
    last_change: Instant,
}

impl Driver {
    /// Runs for a moment: a status patch answered, a change written when due.
    async fn tick(&mut self) {
        if let Ok(request) = tokio::time::timeout(Duration::from_millis(20), self.api.next()).await
        {
            self.api.accept_status(request);
        }
        if self.churn && self.last_change.elapsed() >= CHURN {
            self.step += 1;
            self.api.put_service(&web(self.step));
            self.last_change = Instant::now();
        }
    }

    /// Ticks until `done` holds for the kernel's rules; how long that took. Fails after
    /// `limit`.
    async fn until(
        &mut self,
        ns: &Arc<Netns>,
        backend: Backend,
        limit: Duration,
        what: &str,
        done: impl Fn(&str) -> bool,
    ) -> Duration {
        let start = Instant::now();
        loop {
            for _ in 0..5 {
                self.tick().await;
            }
            if done(&saved(ns, backend).await) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < limit,
                "{backend:?}: {what} not within {limit:?}"
            );
        }
    }
}

/// The line of `table`'s `chain` in `save` that jumps to `target`.
fn jump_line(save: &str, table: &str, chain: &str, target: &str) -> String {
    let text = table_text(save, table);
    text.lines()
        .find(|l| l.starts_with(&format!("-A {chain} ")) && l.ends_with(&format!("-j {target}")))
        .unwrap_or_else(|| panic!("no jump {chain} -> {target} in {table}:\n{text}"))
        .to_owned()
}

/// One table's part of `iptables-save` output.
fn table_text<'a>(save: &'a str, table: &str) -> &'a str {
    let start = save
        .find(&format!("*{table}\n"))
        .unwrap_or_else(|| panic!("no table {table}"));
    let rest = &save[start..];
    &rest[..rest.find("COMMIT").unwrap_or(rest.len())]
}

fn tampering_is_repaired_within_one_sync_period_under_churn(backend: Backend) {
    let Some(ns) = namespace(backend) else { return };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(ns, backend));
}

async fn run(ns: Arc<Netns>, backend: Backend) {
    let (client, api) = MockApi::new();
    api.put_service(&web(0));
    api.put_service(&mk_service(
        "quiet",
        "quiet-1",
        vec![mk_entry(
            "quiet",
            "10.96.0.20",
            &["10.244.1.20", "10.244.2.20"],
        )],
    ));
    api.put_plan(&mk_plan("p1", Some(ZONE), Vec::new()));
    let dataplane = IptablesDataplane::new(
        RenderSettings::default(),
        CommandRunner::in_netns(&ns.name),
        backend,
    );
    let agent = Agent::bind(settings(), client, dataplane).await.unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(async {
        let _ = stopped.await;
    }));
    let mut driver = Driver {
        api,
        churn: false,
        step: 0,
        last_change: Instant::now(),
    };
    let quiet = names::service(QUIET);
    driver
        .until(&ns, backend, Duration::from_secs(30), "first sync", |s| {
            chains_of(s, "nat").contains_key(&quiet)
        })
        .await;
    let good = saved(&ns, backend).await;
    let quiet_rules = chains_of(&good, "nat")[&quiet].clone();
    let services_rules = chains_of(&good, "nat")[names::SERVICES].clone();
    let prerouting = jump_line(&good, "nat", "PREROUTING", names::SERVICES);
    let forward = jump_line(&good, "filter", "FORWARD", names::FORWARD);

    driver.churn = true;
    // Churn first runs for a period on its own: change syncs must not move the check.
    let start = Instant::now();
    while start.elapsed() < PERIOD {
        driver.tick().await;
    }
    let flush =
        |table: &str, chain: &str| vec!["-t".into(), table.into(), "-F".into(), chain.into()];
    let delete = |table: &str, line: &str| {
        let mut words = split_words(line);
        words[0] = "-D".into();
        let mut args = vec!["-t".to_owned(), table.to_owned()];
        args.extend(words);
        args
    };
    type Check = Box<dyn Fn(&str) -> bool>;
    let cases: Vec<(&str, Vec<String>, Check)> = vec![
        (
            "nat PREROUTING jump deleted",
            delete("nat", &prerouting),
            Box::new({
                let line = prerouting.clone();
                move |s| table_text(s, "nat").lines().any(|l| l == line)
            }),
        ),
        (
            "filter FORWARD jump deleted",
            delete("filter", &forward),
            Box::new({
                let line = forward.clone();
                move |s| table_text(s, "filter").lines().any(|l| l == line)
            }),
        ),
        (
            "PP- service chain flushed",
            flush("nat", &quiet),
            Box::new({
                let (quiet, rules) = (quiet.clone(), quiet_rules.clone());
                move |s| chains_of(s, "nat").get(&quiet) == Some(&rules)
            }),
        ),
        (
            "PROXYPLAN-SERVICES flushed",
            flush("nat", names::SERVICES),
            Box::new({
                let rules = services_rules.clone();
                move |s| chains_of(s, "nat").get(names::SERVICES) == Some(&rules)
            }),
        ),
    ];
    let changes_before = driver.step;
    for (what, command, restored) in cases {
        iptables(&ns, backend, command).await;
        let took = driver
            .until(&ns, backend, PERIOD + SLACK, what, restored)
            .await;
        println!(
            "{backend:?}: {what}: restored after {took:?} (sync period {PERIOD:?}, a change every {CHURN:?})"
        );
    }
    let changes = driver.step - changes_before;
    assert!(changes >= 20, "only {changes} changes during the test");

    // The churn reached the kernel all along: its last change lands.
    driver.churn = false;
    let last = names::endpoint(
        WEB,
        &ep(&format!("10.244.3.{}:8080", driver.step % 250 + 1)),
    );
    driver
        .until(&ns, backend, Duration::from_secs(10), "last change", |s| {
            chains_of(s, "nat").contains_key(&last)
        })
        .await;
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the agent stops")
        .unwrap()
        .unwrap();
}

#[test]
fn nft_tampering_is_repaired_within_one_sync_period_under_churn() {
    tampering_is_repaired_within_one_sync_period_under_churn(Backend::Nft);
}

#[test]
fn legacy_tampering_is_repaired_within_one_sync_period_under_churn() {
    tampering_is_repaired_within_one_sync_period_under_churn(Backend::Legacy);
}
