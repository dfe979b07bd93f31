//! ipvs mode against a kernel with IPVS (DESIGN §6 item 4): graceful termination, the
//! virtual servers the agent must leave alone, and a clean-up that leaves nothing.
//!
//! This host's kernel has no IPVS, so these tests are `#[ignore]`d here and run inside
//! the VM of `shared/vm` (`tests/run-all.sh` does it, with `--include-ignored`), together
//! with the whole traffic suite in ipvs mode (`PROXYPLAN_TEST_MODE=ipvs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
mod traffic_support;

use std::time::Duration;

use proxyplan_agent::dataplane::Dataplane;
use proxyplan_agent::kernel::ipvs::NetlinkKernel;
use proxyplan_agent::kernel::{BackendChoice, CommandRunner, Family};
use proxyplan_agent::modes::ipvs::{IpvsDataplane, IpvsSettings};
use proxyplan_crds::MergedPlan;
use support::{service, udp};
use traffic_support::{Lab, Listener, NODE_V4, NODE_V6};

/// One test at a time: IPVS dumps walk one table shared by every namespace, so a test
/// adding hundreds of services makes another's `ipvsadm -Ln` list some twice.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn plan(entries: Vec<proxyplan_crds::ServicePortPlan>) -> MergedPlan {
    let mut plan = support::plan(entries);
    plan.addresses = vec![NODE_V4.parse().unwrap(), NODE_V6.parse().unwrap()];
    plan
}

fn dataplane(lab: &Lab, settings: IpvsSettings) -> IpvsDataplane<NetlinkKernel, CommandRunner> {
    let node = lab.ns("node");
    IpvsDataplane::new(
        settings,
        NetlinkKernel::in_netns(&node).expect("netlink in the node namespace"),
        CommandRunner::in_netns(&node),
        BackendChoice::Nft,
    )
}

/// `ipvsadm -Ln` in the node, numeric, without the header.
fn ipvs_table(lab: &Lab) -> String {
    lab.exec("node", &["ipvsadm", "-Ln"])
        .lines()
        .skip(3)
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The weight of a real server of `vip` (`10.96.0.10:80`), if it is there.
fn weight(lab: &Lab, vip: &str, real: &str) -> Option<u32> {
    let out = lab.exec("node", &["ipvsadm", "-Ln", "-t", vip]);
    out.lines()
        .map(str::split_whitespace)
        .find_map(|mut words| {
            (words.next() == Some("->") && words.next() == Some(real))
                .then(|| words.nth(1).and_then(|w| w.parse().ok()))
                .flatten()
        })
}

/// A removed TCP real server first drains at weight 0: its established connection keeps
/// working and new connections go elsewhere; once the connection is gone, the next sync
/// deletes it. A removed UDP real server goes at once.
#[test]
#[ignore = "needs IPVS: runs inside the VM (tests/run-all.sh)"]
fn removed_real_servers_drain_gracefully() {
    let _serial = serial();
    let Some(lab) = Lab::new(&["a1", "a2", "r1"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Echo, 9000);
    lab.serve("r1", Family::V4, Listener::Echo, 9000);
    lab.serve("a1", Family::V4, Listener::Udp, 5353);
    lab.serve("r1", Family::V4, Listener::Udp, 5353);
    let both = ["10.244.1.10:9000", "10.244.2.10:9000"];
    let chat = |eps: &[&str]| service("chat", "10.96.0.30", 9000, eps);
    let dns = |eps: &[&str]| udp(service("dns", "10.96.0.53", 53, eps));
    let mut dp = dataplane(&lab, IpvsSettings::default());
    dp.sync(
        &plan(vec![
            chat(&both),
            dns(&["10.244.1.10:5353", "10.244.2.10:5353"]),
        ]),
        false,
    )
    .expect("sync");

    // Open connections until one lands on a1 (rr: at most two).
    let mut session = None;
    for _ in 0..4 {
        let mut s = lab.session("a2", "10.96.0.30", 9000);
        assert_eq!(s.echo("who").unwrap(), "who");
        let on_a1 = lab
            .exec("node", &["ipvsadm", "-Lnc"])
            .lines()
            .any(|l| l.contains("10.244.1.10:9000") && l.contains("ESTABLISHED"));
        if on_a1 {
            session = Some(s);
            break;
        }
    }
    let mut session = session.expect("a connection to a1");

    // a1 leaves the plan: weight 0, the connection lives on.
    dp.sync(
        &plan(vec![
            chat(&["10.244.2.10:9000"]),
            dns(&["10.244.2.10:5353"]),
        ]),
        false,
    )
    .expect("sync");
    assert_eq!(weight(&lab, "10.96.0.30:9000", "10.244.1.10:9000"), Some(0));
    assert_eq!(dp.draining(), 1);
    assert_eq!(session.echo("still here").unwrap(), "still here");
    let udp_table = lab.exec("node", &["ipvsadm", "-Ln", "-u", "10.96.0.53:53"]);
    assert!(
        !udp_table.contains("10.244.1.10"),
        "UDP goes at once:\n{udp_table}"
    );

    // A sync while the connection lives keeps the drained server.
    dp.sync(
        &plan(vec![
            chat(&["10.244.2.10:9000"]),
            dns(&["10.244.2.10:5353"]),
        ]),
        false,
    )
    .expect("sync");
    assert_eq!(weight(&lab, "10.96.0.30:9000", "10.244.1.10:9000"), Some(0));

    // The connection ends; IPVS counts it inactive until its FIN/TIME_WAIT states
    // expire, so a short grace period stands in for the wait.
    drop(session);
    let settings = IpvsSettings {
        termination_grace: Duration::from_millis(200),
        ..IpvsSettings::default()
    };
    let mut dp = dataplane(&lab, settings);
    let final_plan = plan(vec![
        chat(&["10.244.2.10:9000"]),
        dns(&["10.244.2.10:5353"]),
    ]);
    dp.sync(&final_plan, false).expect("sync");
    std::thread::sleep(Duration::from_millis(300));
    dp.sync(&final_plan, false).expect("sync");
    assert_eq!(weight(&lab, "10.96.0.30:9000", "10.244.1.10:9000"), None);
    assert_eq!(dp.draining(), 0);
}

/// Virtual servers the agent does not own (another address, or inside
/// `--ipvs-exclude-cidrs`) survive syncs and the clean-up; the clean-up removes every
/// service, address, set and chain of the agent, and the interface.
#[test]
#[ignore = "needs IPVS: runs inside the VM (tests/run-all.sh)"]
fn cleanup_removes_everything_the_agent_owns_and_nothing_else() {
    let _serial = serial();
    let Some(lab) = Lab::new(&["a1"]) else {
        return;
    };
    // Someone else's virtual servers: on an address the agent never holds, and on the
    // node's own address in an excluded range.
    lab.exec(
        "node",
        &["ipvsadm", "-A", "-t", "198.51.100.7:443", "-s", "rr"],
    );
    lab.exec(
        "node",
        &[
            "ipvsadm",
            "-A",
            "-t",
            &format!("{NODE_V4}:8443"),
            "-s",
            "rr",
        ],
    );
    let foreign = ipvs_table(&lab);
    let settings = IpvsSettings {
        exclude_cidrs: vec!["10.10.0.0/24".parse().unwrap()],
        ..IpvsSettings::default()
    };
    let mut dp = dataplane(&lab, settings);
    let web = support::node_port(
        service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]),
        30080,
    );
    dp.sync(&plan(vec![web]), false).expect("sync");
    let programmed = ipvs_table(&lab);
    assert!(programmed.contains("TCP  10.96.0.10:80 rr"), "{programmed}");
    assert!(programmed.contains("198.51.100.7:443"), "{programmed}");
    assert!(
        programmed.contains(&format!("{NODE_V4}:8443")),
        "{programmed}"
    );
    // The node port on the node's address is in the excluded range too: not touched.
    assert!(
        !programmed.contains(&format!("{NODE_V4}:30080")),
        "{programmed}"
    );
    let addresses = lab.exec(
        "node",
        &["ip", "-o", "addr", "show", "dev", "proxyplan-ipvs0"],
    );
    assert!(addresses.contains("10.96.0.10/32"), "{addresses}");
    assert!(
        lab.exec("node", &["ipset", "list", "-n"])
            .contains("PROXYPLAN-CLUSTER-IP")
    );

    dp.cleanup().expect("cleanup");
    assert_eq!(ipvs_table(&lab), foreign);
    assert!(
        !lab.exec("node", &["ip", "-o", "link"])
            .contains("proxyplan-ipvs0")
    );
    let sets = lab.exec("node", &["ipset", "list", "-n"]);
    assert!(!sets.contains("PROXYPLAN"), "{sets}");
    let rules = lab.exec("node", &["iptables-nft-save"]);
    assert!(!rules.contains("PROXYPLAN"), "{rules}");
}

/// A restarted agent (a new dataplane) reads what the kernel holds and sends nothing
/// when the plan has not changed.
#[test]
#[ignore = "needs IPVS: runs inside the VM (tests/run-all.sh)"]
fn restart_reads_the_kernel_and_changes_nothing() {
    let _serial = serial();
    let Some(lab) = Lab::new(&["a1"]) else {
        return;
    };
    let web = support::node_port(
        service(
            "web",
            "10.96.0.10",
            80,
            &["10.244.1.10:8080", "10.244.2.10:8080"],
        ),
        30080,
    );
    let plan = plan(vec![web]);
    let first = dataplane(&lab, IpvsSettings::default())
        .sync(&plan, false)
        .expect("first sync");
    assert!(first.changed > 0);
    let again = dataplane(&lab, IpvsSettings::default())
        .sync(&plan, false)
        .expect("sync after restart");
    assert_eq!(again.changed, 0, "{}", again.payload);
    assert_eq!(again.rules, first.rules);
}

/// A first apply with many new VIPs adds them on a thread of their own, alongside the
/// sets and IPVS changes: every address, virtual server and set entry is there after
/// it, a restart finds nothing to change, and removing most Services removes their
/// addresses.
#[test]
#[ignore = "needs IPVS: runs inside the VM (tests/run-all.sh)"]
fn many_new_vips_are_added_alongside_the_rest() {
    let _serial = serial();
    let Some(lab) = Lab::new(&["a1"]) else {
        return;
    };
    let entries = |count: usize| -> Vec<proxyplan_crds::ServicePortPlan> {
        (0..count)
            .map(|i| {
                service(
                    &format!("svc-{i:03}"),
                    &format!("10.96.{}.{}", 1 + i / 200, 1 + i % 200),
                    80,
                    &["10.244.1.10:8080"],
                )
            })
            .collect()
    };
    let settings = IpvsSettings::default();
    let interface = settings.interface.clone();
    let vips = |lab: &Lab| -> usize {
        lab.exec(
            "node",
            &["ip", "-o", "-4", "addr", "show", "dev", &interface],
        )
        .lines()
        .filter(|l| l.contains(" 10.96."))
        .count()
    };
    let mut dp = dataplane(&lab, settings.clone());
    let first = dp.sync(&plan(entries(400)), false).expect("first sync");
    assert!(
        first
            .phases
            .iter()
            .any(|(name, _)| *name == "vips alongside"),
        "{:?}",
        first.phases
    );
    assert_eq!(vips(&lab), 400);
    let servers = ipvs_table(&lab)
        .lines()
        .filter(|l| l.starts_with("TCP  10.96."))
        .count();
    assert_eq!(servers, 400);
    let again = dataplane(&lab, settings)
        .sync(&plan(entries(400)), false)
        .expect("sync after restart");
    assert_eq!(again.changed, 0, "{}", again.payload);
    dp.invalidate();
    dp.sync(&plan(entries(100)), false).expect("shrink");
    assert_eq!(vips(&lab), 100);
}
