//! The ctnetlink codec against this host's kernel: entries made with the `conntrack`
//! tool in a throwaway network namespace are listed and deleted over netlink, and the
//! tool sees the result.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::IpAddr;

use proxyplan_agent::kernel::conntrack::{Destination, Flow, StaleFlows};
use proxyplan_agent::kernel::{CommandRunner, Family, Runner};
use support::Netns;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// Inserts a UDP entry `client:sport -> vip:53`, answered by `backend:bport`.
fn insert(ns: &Netns, client: &str, sport: u16, vip: &str, backend: &str, bport: u16) {
    support::insert_udp_flow(
        ns,
        client,
        &sport.to_string(),
        vip,
        "53",
        backend,
        &bport.to_string(),
    );
}

fn flow(client: &str, sport: u16, vip: &str, backend: &str, bport: u16) -> Flow {
    Flow {
        orig_src: ip(client),
        orig_dst: ip(vip),
        sport,
        dport: 53,
        reply_src: ip(backend),
        reply_sport: bport,
    }
}

#[test]
fn udp_entries_are_listed_and_deleted_over_netlink() {
    let ns = match Netns::create() {
        Ok(ns) => ns,
        Err(reason) => {
            println!("SKIPPED: {reason}");
            return;
        }
    };
    if !ns.try_run(&["conntrack", "-L"]) {
        panic!("conntrack is not installed or conntrack does not work in a namespace here");
    }
    insert(&ns, "10.244.1.5", 40000, "10.96.0.10", "10.244.2.7", 5353);
    insert(&ns, "10.244.1.5", 40001, "10.96.0.10", "10.244.3.8", 5353);
    insert(&ns, "10.244.1.6", 40002, "10.96.0.11", "10.244.2.7", 5353);
    insert(&ns, "10.244.1.7", 40003, "10.96.0.12", "10.244.2.9", 5353);
    ns.run(&[
        "conntrack",
        "-I",
        "-p",
        "tcp",
        "-s",
        "10.244.1.5",
        "-d",
        "10.96.0.10",
        "--sport",
        "41000",
        "--dport",
        "80",
        "-r",
        "10.244.2.7",
        "-q",
        "10.244.1.5",
        "--reply-port-src",
        "8080",
        "--reply-port-dst",
        "41000",
        "--state",
        "ESTABLISHED",
        "-t",
        "120",
    ]);
    let runner = CommandRunner::in_netns(&ns.name);

    let mut listed = runner.conntrack_list_udp(Family::V4).expect("list");
    listed.sort_by_key(|f| f.sport);
    assert_eq!(
        listed,
        [
            flow("10.244.1.5", 40000, "10.96.0.10", "10.244.2.7", 5353),
            flow("10.244.1.5", 40001, "10.96.0.10", "10.244.3.8", 5353),
            flow("10.244.1.6", 40002, "10.96.0.11", "10.244.2.7", 5353),
            flow("10.244.1.7", 40003, "10.96.0.12", "10.244.2.9", 5353),
        ],
        "the TCP entry is left out"
    );
    assert!(
        runner
            .conntrack_list_udp(Family::V6)
            .expect("list")
            .is_empty()
    );

    // Via: only the entry of 10.96.0.10:53 answered by 10.244.2.7:5353.
    let to = Destination::Address {
        ip: ip("10.96.0.10"),
        port: 53,
    };
    let via = StaleFlows::Via(to, (ip("10.244.2.7"), 5353));
    assert_eq!(runner.conntrack_delete(&via).expect("delete"), 1);
    assert_eq!(runner.conntrack_delete(&via).expect("delete again"), 0);
    // Exact.
    let exact = StaleFlows::Exact(flow("10.244.1.7", 40003, "10.96.0.12", "10.244.2.9", 5353));
    assert_eq!(runner.conntrack_delete(&exact).expect("delete"), 1);
    assert_eq!(runner.conntrack_delete(&exact).expect("already gone"), 0);
    // To: everything to 10.96.0.10:53 (one left).
    assert_eq!(
        runner
            .conntrack_delete(&StaleFlows::To(to))
            .expect("delete"),
        1
    );

    // IPv6.
    insert(&ns, "fd00::5", 40005, "fd00:96::a", "fd00::7", 5353);
    let v6 = flow("fd00::5", 40005, "fd00:96::a", "fd00::7", 5353);
    assert_eq!(runner.conntrack_list_udp(Family::V6).expect("list"), [v6]);
    assert_eq!(
        runner
            .conntrack_delete(&StaleFlows::Exact(v6))
            .expect("delete"),
        1
    );
    assert!(
        runner
            .conntrack_list_udp(Family::V6)
            .expect("list")
            .is_empty()
    );

    let left = ns.run(&["conntrack", "-L"]);
    let lines: Vec<&str> = left.lines().collect();
    assert_eq!(lines.len(), 2, "{left}");
    assert!(left.contains("sport=40002"), "{left}");
    assert!(left.contains("tcp"), "{left}");
}

/// kube-proxy's conntrack sysctls, set through a runner in a namespace: the timeouts are
/// per namespace and take; the table size is the init namespace's, so a child namespace
/// refuses it and says so instead of stopping anything.
#[test]
fn conntrack_sysctls_are_set_where_the_kernel_allows() {
    use proxyplan_agent::kernel::conntrack::ConntrackSysctls;
    let ns = match Netns::create() {
        Ok(ns) => ns,
        Err(reason) => {
            println!("SKIPPED: {reason}");
            return;
        }
    };
    // Conntrack sysctls appear once the module is in use in the namespace.
    ns.run(&["conntrack", "-L"]);
    let runner = CommandRunner::in_netns(&ns.name);
    let read = |name: &str| ns.run(&["sysctl", "-n", name]).trim().to_owned();
    ns.run(&[
        "sysctl",
        "-qw",
        "net.netfilter.nf_conntrack_tcp_timeout_established=432000",
    ]);
    let max_before = read("net.netfilter.nf_conntrack_max");
    let wanted = ConntrackSysctls {
        max_per_core: 1_000_000,
        min: 0,
        tcp_be_liberal: true,
        ..ConntrackSysctls::default()
    };
    let outcomes = wanted.apply(&runner, 2);
    assert_eq!(
        read("net.netfilter.nf_conntrack_tcp_timeout_established"),
        "86400"
    );
    assert_eq!(
        read("net.netfilter.nf_conntrack_tcp_timeout_close_wait"),
        "3600"
    );
    assert_eq!(read("net.netfilter.nf_conntrack_tcp_be_liberal"), "1");
    let max = outcomes
        .iter()
        .find(|o| o.name == "net/netfilter/nf_conntrack_max")
        .expect("the table size was tried");
    assert_eq!(max.wanted, "1048576", "capped as kube-proxy 1.36 caps it");
    if max.error.is_some() {
        assert_eq!(read("net.netfilter.nf_conntrack_max"), max_before);
    }
    // Everything that could be set is now right: a second run writes nothing else.
    let again = wanted.apply(&runner, 2);
    assert!(
        again
            .iter()
            .all(|o| o.name.contains("nf_conntrack_max") || o.name.contains("hashsize")),
        "{again:?}"
    );
}

/// `proxyplan-agent setup` (the chart's privileged init container) sets the sysctls and
/// fails, naming them, when one cannot be set (here the table size, which only the
/// node's own namespace may change).
#[test]
fn setup_sets_the_sysctls_or_says_which_it_could_not() {
    let ns = match Netns::create() {
        Ok(ns) => ns,
        Err(reason) => {
            println!("SKIPPED: {reason}");
            return;
        }
    };
    ns.run(&["conntrack", "-L"]);
    let setup = |args: &[&str]| {
        std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns.name,
                env!("CARGO_BIN_EXE_proxyplan-agent"),
                "setup",
            ])
            .args(args)
            .output()
            .expect("run setup")
    };
    let out = setup(&[
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-close-wait=2h",
        "--conntrack-udp-timeout=45s",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = |name: &str| ns.run(&["sysctl", "-n", name]).trim().to_owned();
    assert_eq!(
        read("net.netfilter.nf_conntrack_tcp_timeout_close_wait"),
        "7200"
    );
    assert_eq!(read("net.netfilter.nf_conntrack_udp_timeout"), "45");

    let out = setup(&["--conntrack-max-per-core=1000000", "--conntrack-min=0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if read("net.netfilter.nf_conntrack_max") != "1048576" {
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains("nf_conntrack_max"), "{stderr}");
    }
}
