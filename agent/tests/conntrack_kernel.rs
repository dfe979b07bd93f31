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
