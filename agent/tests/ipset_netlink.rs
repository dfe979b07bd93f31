//! ipsets over netlink against this machine's kernel, each test in a throwaway network
//! namespace (ipsets are per namespace): what [`IpsetNetlink`] creates, adds and deletes
//! is what the `ipset` tool then saves, and what [`IpsetNetlink::list`] reads is what
//! [`ipset::parse_save`] reads from that save.
//!
//! Needs root, `ip netns` and the `ipset` tool; otherwise every test prints a SKIPPED
//! line and passes. `large_sets_are_listed_completely` prints timings next to the
//! `ipset restore` / `ipset save` ones (meaningful in a `--release` run).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use proxyplan_agent::kernel::ipset::{self, IpSet, SetEntry, SetSpec, SetType, Sets};
use proxyplan_agent::kernel::ipset::{
    IPSET_ERR_BUSY, IPSET_ERR_EXIST, IPSET_ERR_HASH_FULL, IPSET_ERR_INVALID_CIDR,
    IPSET_ERR_PROTOCOL, IpsetNetlink, SetOp, error_name,
};
use support::Netns;

const TCP: u8 = 6;
const UDP: u8 = 17;
const SCTP: u8 = 132;
const ENOENT: i32 = 2;
const EEXIST: i32 = 17;
const EINVAL: i32 = 22;

/// A fresh namespace, or a SKIPPED line and `None` without root, `ip netns` or `ipset`.
fn lab() -> Option<Netns> {
    if let Some(reason) = support::netns_unavailable() {
        println!("SKIPPED: {reason}");
        return None;
    }
    let tool = Command::new("ipset").arg("version").output();
    if !tool.is_ok_and(|out| out.status.success()) {
        println!("SKIPPED: the ipset tool is not installed");
        return None;
    }
    Some(Netns::create().expect("network namespace"))
}

/// A socket opened by a thread that entered `ns`: it stays in that namespace.
fn socket_in(ns: &Netns) -> IpsetNetlink {
    let path = std::path::Path::new("/run/netns").join(&ns.name);
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path)?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(std::io::Error::from)?;
        IpsetNetlink::open()
    })
    .join()
    .expect("namespace thread")
    .expect("netlink socket in the namespace")
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn spec(kind: SetType, ipv6: bool) -> SetSpec {
    SetSpec { kind, ipv6 }
}

/// The `add` lines of an `ipset save`, as text.
fn saved_adds(save: &str) -> BTreeSet<String> {
    save.lines()
        .filter(|l| l.starts_with("add "))
        .map(str::to_owned)
        .collect()
}

/// `create NAME TYPE` and the family word of every `create` line of an `ipset save`.
fn saved_creates(save: &str) -> BTreeSet<String> {
    save.lines()
        .filter(|l| l.starts_with("create "))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let family = words
                .windows(2)
                .find(|w| w[0] == "family")
                .map_or("", |w| w[1]);
            format!("{} {} {family}", words[1], words[2])
        })
        .collect()
}

fn assert_all_done(results: &[i32]) {
    let failed: Vec<(usize, String)> = results
        .iter()
        .enumerate()
        .filter(|(_, errno)| **errno != 0)
        .map(|(i, errno)| (i, error_name(*errno)))
        .collect();
    assert!(failed.is_empty(), "failed ops: {failed:?}");
}

/// Every set type of the ipvs mode, both families for hash sets, with entries of every
/// kind and protocol.
fn every_kind() -> Sets {
    let mut sets = Sets::new();
    let mut add = |name: &str, spec: SetSpec, entries: Vec<SetEntry>| {
        let mut set = IpSet::new(spec.kind, spec.ipv6);
        set.entries.extend(entries);
        sets.insert(name.to_owned(), set);
    };
    add(
        "PROXYPLAN-NODE-IP",
        spec(SetType::HashIp, false),
        vec![
            SetEntry::Ip(ip("192.168.1.5")),
            SetEntry::Ip(ip("10.0.0.1")),
        ],
    );
    add(
        "PROXYPLAN6-NODE-IP",
        spec(SetType::HashIp, true),
        vec![SetEntry::Ip(ip("fd00::5"))],
    );
    add(
        "PROXYPLAN-CLUSTER-IP",
        spec(SetType::HashIpPort, false),
        vec![
            SetEntry::IpPort(ip("10.96.0.10"), TCP, 80),
            SetEntry::IpPort(ip("10.96.0.10"), UDP, 53),
            SetEntry::IpPort(ip("10.96.0.11"), SCTP, 9),
        ],
    );
    add(
        "PROXYPLAN6-CLUSTER-IP",
        spec(SetType::HashIpPort, true),
        vec![
            SetEntry::IpPort(ip("fd00::a"), UDP, 53),
            SetEntry::IpPort(ip("fd00::a"), TCP, 65535),
        ],
    );
    add(
        "PROXYPLAN-HAIRPIN",
        spec(SetType::HashIpPortIp, false),
        vec![
            SetEntry::IpPortIp(ip("10.244.1.2"), TCP, 8080, ip("10.244.1.2")),
            SetEntry::IpPortIp(ip("10.244.1.3"), SCTP, 1, ip("10.244.1.3")),
        ],
    );
    add(
        "PROXYPLAN6-HAIRPIN",
        spec(SetType::HashIpPortIp, true),
        vec![SetEntry::IpPortIp(ip("fd00::5"), UDP, 53, ip("fd00::5"))],
    );
    add(
        "PROXYPLAN-LB-SRC",
        spec(SetType::HashIpPortNet, false),
        vec![
            SetEntry::IpPortNet(ip("203.0.113.7"), TCP, 80, ip("10.0.0.0"), 8),
            SetEntry::IpPortNet(ip("203.0.113.7"), TCP, 80, ip("10.1.2.3"), 32),
            SetEntry::IpPortNet(ip("203.0.113.8"), UDP, 443, ip("192.0.2.0"), 24),
        ],
    );
    add(
        "PROXYPLAN6-LB-SRC",
        spec(SetType::HashIpPortNet, true),
        vec![
            SetEntry::IpPortNet(ip("fd00::1"), TCP, 80, ip("fd01::"), 64),
            SetEntry::IpPortNet(ip("fd00::1"), TCP, 80, ip("fd01::5"), 128),
        ],
    );
    add(
        "PROXYPLAN-NODE-PORT-TCP",
        spec(SetType::BitmapPort, false),
        vec![
            SetEntry::Port(30080),
            SetEntry::Port(0),
            SetEntry::Port(65535),
        ],
    );
    sets
}

/// One entry per set that is added and then deleted again.
fn extra_entry(kind: SetType, ipv6: bool) -> SetEntry {
    let a = if ipv6 { ip("fd00::99") } else { ip("10.9.9.9") };
    match kind {
        SetType::BitmapPort => SetEntry::Port(31000),
        SetType::HashIp => SetEntry::Ip(a),
        SetType::HashIpPort => SetEntry::IpPort(a, TCP, 9999),
        SetType::HashIpPortIp => SetEntry::IpPortIp(a, UDP, 9999, a),
        SetType::HashIpPortNet => SetEntry::IpPortNet(a, TCP, 9999, a, if ipv6 { 128 } else { 32 }),
    }
}

#[test]
fn every_set_type_and_entry_kind_matches_ipset_save() {
    let Some(ns) = lab() else { return };
    let mut kernel = socket_in(&ns);
    let want = every_kind();

    let mut ops = Vec::new();
    for (name, set) in &want {
        ops.push(SetOp::Create {
            name,
            spec: set.spec,
        });
        ops.push(SetOp::Add(name, extra_entry(set.spec.kind, set.spec.ipv6)));
        ops.extend(set.entries.iter().map(|e| SetOp::Add(name, *e)));
    }
    for (name, set) in &want {
        ops.push(SetOp::Del(name, extra_entry(set.spec.kind, set.spec.ipv6)));
    }
    assert_all_done(&kernel.execute(&ops).unwrap());

    let listed = kernel.list().unwrap();
    assert_eq!(listed, want, "list()");

    let save = ns.run(&["ipset", "save"]);
    assert_eq!(ipset::parse_save(&save), listed, "parse_save(ipset save)");
    let adds: BTreeSet<String> = want
        .iter()
        .flat_map(|(name, set)| set.entries.iter().map(move |e| format!("add {name} {e}")))
        .collect();
    assert_eq!(saved_adds(&save), adds, "ipset save:\n{save}");
    let creates: BTreeSet<String> = want
        .iter()
        .map(|(name, set)| {
            let family = match (set.spec.kind, set.spec.ipv6) {
                (SetType::BitmapPort, _) => "",
                (_, false) => "inet",
                (_, true) => "inet6",
            };
            format!("{name} {} {family}", set.spec.kind.as_str())
        })
        .collect();
    assert_eq!(saved_creates(&save), creates, "ipset save:\n{save}");
    // The create options are SetSpec::create_options'.
    for (name, set) in &want {
        let line = save
            .lines()
            .find(|l| l.starts_with(&format!("create {name} ")))
            .unwrap();
        let options = set.spec.create_options();
        let wanted: Vec<&str> = options.split_whitespace().collect();
        let saved: Vec<&str> = line.split_whitespace().skip(2).take(wanted.len()).collect();
        assert_eq!(saved, wanted, "{line}");
    }

    // Destroy removes them all.
    let destroys: Vec<SetOp<'_>> = want.keys().map(|n| SetOp::Destroy(n)).collect();
    assert_all_done(&kernel.execute(&destroys).unwrap());
    assert_eq!(kernel.list().unwrap(), Sets::new());
    assert_eq!(ns.run(&["ipset", "save"]), "");
}

#[test]
fn exist_semantics_and_errnos() {
    let Some(ns) = lab() else { return };
    let mut kernel = socket_in(&ns);
    let v4 = spec(SetType::HashIpPort, false);
    let set = "PROXYPLAN-CLUSTER-IP";
    let entry = SetEntry::IpPort(ip("10.96.0.10"), TCP, 80);
    let other = SetEntry::IpPort(ip("10.96.0.11"), TCP, 80);

    // Create twice and add twice: done, as with `ipset -exist`.
    let twice = [
        SetOp::Create {
            name: set,
            spec: v4,
        },
        SetOp::Create {
            name: set,
            spec: v4,
        },
        SetOp::Add(set, entry),
        SetOp::Add(set, entry),
    ];
    assert_eq!(kernel.execute(&twice).unwrap(), [0, 0, 0, 0]);

    // Del of a missing entry: -IPSET_ERR_EXIST; the batch goes on after a failure.
    let dels = [
        SetOp::Del(set, other),
        SetOp::Del(set, entry),
        SetOp::Del(set, entry),
        SetOp::Add(set, other),
    ];
    assert_eq!(
        kernel.execute(&dels).unwrap(),
        [-IPSET_ERR_EXIST, 0, -IPSET_ERR_EXIST, 0]
    );

    // A set that does not exist: -ENOENT for Add and Del; Destroy is done (-exist).
    let missing = [
        SetOp::Add("PROXYPLAN-NONE", entry),
        SetOp::Del("PROXYPLAN-NONE", entry),
        SetOp::Destroy("PROXYPLAN-NONE"),
    ];
    assert_eq!(kernel.execute(&missing).unwrap(), [-ENOENT, -ENOENT, 0]);

    // The name taken by a set of another type: -EEXIST. By one of the other family: 0,
    // and the set keeps its family (the kernel compares types and options, not
    // families; `ipset -exist create` does the same): only list() tells.
    let clash = [
        SetOp::Create {
            name: set,
            spec: spec(SetType::HashIp, false),
        },
        SetOp::Create {
            name: set,
            spec: spec(SetType::HashIpPort, true),
        },
    ];
    assert_eq!(kernel.execute(&clash).unwrap(), [-EEXIST, 0]);
    assert_eq!(kernel.list().unwrap()[set].spec, v4);

    // A set the ipset tool made with the same options (another revision) is the same
    // set; one with another maxelem is not.
    ns.run(&[
        "ipset",
        "create",
        "PROXYPLAN-TOOL",
        "hash:ip,port",
        "family",
        "inet",
        "hashsize",
        "1024",
        "maxelem",
        "1048576",
    ]);
    ns.run(&["ipset", "create", "PROXYPLAN-TOOL-SMALL", "hash:ip,port"]);
    let tool = [
        SetOp::Create {
            name: "PROXYPLAN-TOOL",
            spec: v4,
        },
        SetOp::Create {
            name: "PROXYPLAN-TOOL-SMALL",
            spec: v4,
        },
    ];
    assert_eq!(kernel.execute(&tool).unwrap(), [0, -EEXIST]);

    // Entries of the other family (the set's family has no address attribute in them:
    // a protocol error), a /0 network, and ops that cannot be encoded (not
    // sent: -EINVAL, the others still are).
    let v6_set = "PROXYPLAN6-CLUSTER-IP";
    let net_set = "PROXYPLAN-LB-SRC";
    let long = "PROXYPLAN-".repeat(4);
    let odd = [
        SetOp::Create {
            name: v6_set,
            spec: spec(SetType::HashIpPort, true),
        },
        SetOp::Create {
            name: net_set,
            spec: spec(SetType::HashIpPortNet, false),
        },
        SetOp::Add(set, SetEntry::IpPort(ip("fd00::a"), TCP, 80)),
        SetOp::Add(v6_set, entry),
        SetOp::Add(
            net_set,
            SetEntry::IpPortNet(ip("203.0.113.7"), TCP, 80, ip("0.0.0.0"), 0),
        ),
        SetOp::Add(&long, entry),
        SetOp::Add(
            net_set,
            SetEntry::IpPortNet(ip("203.0.113.7"), TCP, 80, ip("fd00::"), 8),
        ),
        SetOp::Add(set, entry),
    ];
    assert_eq!(
        kernel.execute(&odd).unwrap(),
        [
            0,
            0,
            -IPSET_ERR_PROTOCOL,
            -IPSET_ERR_PROTOCOL,
            -IPSET_ERR_INVALID_CIDR,
            -EINVAL,
            -EINVAL,
            0
        ]
    );

    // bitmap:port: add twice, delete a missing port.
    let ports = "PROXYPLAN-NODE-PORT-TCP";
    let bitmap = [
        SetOp::Create {
            name: ports,
            spec: spec(SetType::BitmapPort, false),
        },
        SetOp::Create {
            name: ports,
            spec: spec(SetType::BitmapPort, false),
        },
        SetOp::Add(ports, SetEntry::Port(30080)),
        SetOp::Add(ports, SetEntry::Port(30080)),
        SetOp::Del(ports, SetEntry::Port(30081)),
    ];
    assert_eq!(
        kernel.execute(&bitmap).unwrap(),
        [0, 0, 0, 0, -IPSET_ERR_EXIST]
    );

    // A full set (the tool's, with maxelem 1): -IPSET_ERR_HASH_FULL.
    let full = "PROXYPLAN-FULL";
    ns.run(&["ipset", "create", full, "hash:ip", "maxelem", "1"]);
    let fill = [
        SetOp::Add(full, SetEntry::Ip(ip("10.0.0.1"))),
        SetOp::Add(full, SetEntry::Ip(ip("10.0.0.2"))),
    ];
    assert_eq!(kernel.execute(&fill).unwrap(), [0, -IPSET_ERR_HASH_FULL]);

    let listed = kernel.list().unwrap();
    assert_eq!(listed, ipset::parse_save(&ns.run(&["ipset", "save"])));
    assert_eq!(
        listed[set].entries,
        BTreeSet::from([entry, other]),
        "{listed:?}"
    );

    // A set an iptables rule references cannot be destroyed: -IPSET_ERR_BUSY.
    let rule = [
        "INPUT",
        "-m",
        "set",
        "--match-set",
        set,
        "dst,dst",
        "-j",
        "ACCEPT",
    ];
    let append: Vec<&str> = ["iptables", "-w", "-A"].into_iter().chain(rule).collect();
    if ns.try_run(&append) {
        assert_eq!(
            kernel.execute(&[SetOp::Destroy(set)]).unwrap(),
            [-IPSET_ERR_BUSY]
        );
        let delete: Vec<&str> = ["iptables", "-w", "-D"].into_iter().chain(rule).collect();
        ns.run(&delete);
    } else {
        println!("SKIPPED (IPSET_ERR_BUSY part): iptables -m set does not work here");
    }
    assert_eq!(kernel.execute(&[SetOp::Destroy(set)]).unwrap(), [0]);
    assert!(!kernel.list().unwrap().contains_key(set));
}

#[test]
fn sets_of_others_are_ignored() {
    let Some(ns) = lab() else { return };
    let mut kernel = socket_in(&ns);
    // Another proxy's set, with entries.
    ns.run(&["ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port"]);
    ns.run(&["ipset", "add", "KUBE-CLUSTER-IP", "10.96.0.1,tcp:443"]);
    // An owned name of a type the agent never creates: skipped, as parse_save does.
    ns.run(&["ipset", "create", "PROXYPLAN-NETS", "hash:net"]);
    ns.run(&["ipset", "add", "PROXYPLAN-NETS", "10.0.0.0/8"]);
    // An owned set the ipset tool made (newest revision): read like ours.
    ns.run(&["ipset", "create", "PROXYPLAN-TOOL", "hash:ip,port,ip"]);
    ns.run(&[
        "ipset",
        "add",
        "PROXYPLAN-TOOL",
        "10.244.1.2,udp:53,10.244.1.2",
    ]);

    let ours = "PROXYPLAN-CLUSTER-IP";
    let entry = SetEntry::IpPort(ip("10.96.0.10"), TCP, 80);
    let ops = [
        SetOp::Create {
            name: ours,
            spec: spec(SetType::HashIpPort, false),
        },
        SetOp::Add(ours, entry),
    ];
    assert_all_done(&kernel.execute(&ops).unwrap());

    let listed = kernel.list().unwrap();
    assert_eq!(
        listed.keys().collect::<Vec<_>>(),
        ["PROXYPLAN-CLUSTER-IP", "PROXYPLAN-TOOL"]
    );
    assert_eq!(
        listed["PROXYPLAN-TOOL"].entries,
        BTreeSet::from([SetEntry::IpPortIp(
            ip("10.244.1.2"),
            UDP,
            53,
            ip("10.244.1.2")
        )])
    );
    assert_eq!(listed, ipset::parse_save(&ns.run(&["ipset", "save"])));
    // Untouched.
    let foreign = ns.run(&["ipset", "save", "KUBE-CLUSTER-IP"]);
    assert!(
        foreign.contains("add KUBE-CLUSTER-IP 10.96.0.1,tcp:443"),
        "{foreign}"
    );
}

const LARGE: u32 = 150_000;

/// `LARGE` hairpin entries: `10.x.y.z,tcp:8080,10.x.y.z`.
fn hairpins() -> Vec<SetEntry> {
    (0..LARGE)
        .map(|i| {
            let a = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
            SetEntry::IpPortIp(a, TCP, 8080, a)
        })
        .collect()
}

fn ipset_restore(ns: &Netns, script: &str) -> Duration {
    let start = Instant::now();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.name, "ipset", "restore"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
    start.elapsed()
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

#[test]
fn large_sets_are_listed_completely() {
    let Some(ns) = lab() else { return };
    let mut kernel = socket_in(&ns);
    let name = "PROXYPLAN-HAIRPIN";
    let entries = hairpins();
    let mut ops = vec![SetOp::Create {
        name,
        spec: spec(SetType::HashIpPortIp, false),
    }];
    ops.extend(entries.iter().map(|e| SetOp::Add(name, *e)));

    let start = Instant::now();
    let results = kernel.execute(&ops).unwrap();
    let add_netlink = start.elapsed();
    assert_all_done(&results);

    let start = Instant::now();
    let listed = kernel.list().unwrap();
    let list_netlink = start.elapsed();
    let want: BTreeSet<SetEntry> = entries.iter().copied().collect();
    assert_eq!(listed[name].entries.len(), want.len());
    assert!(listed[name].entries == want, "the listing differs");

    let start = Instant::now();
    let save = ns.run(&["ipset", "save"]);
    let parsed = ipset::parse_save(&save);
    let list_tool = start.elapsed();
    assert!(
        parsed == listed,
        "parse_save(ipset save) differs from list()"
    );

    // The same lines through `ipset restore`, into a second set.
    let other = "PROXYPLAN-HAIRPIN-RESTORED";
    let mut script = format!(
        "create {other} {}\n",
        spec(SetType::HashIpPortIp, false).create_options()
    );
    for entry in &entries {
        script.push_str(&format!("add {other} {entry}\n"));
    }
    let add_tool = ipset_restore(&ns, &script);
    let both = kernel.list().unwrap();
    assert!(both[other].entries == want);

    // One endpoint change against the large set: an add and a del, by netlink and by
    // one `ipset restore` process.
    let spare = SetEntry::IpPortIp(ip("10.250.0.1"), TCP, 8080, ip("10.250.0.1"));
    let mut change_netlink = Vec::new();
    let mut change_tool = Vec::new();
    for (round, &gone) in entries.iter().take(50).enumerate() {
        let start = Instant::now();
        let pair = [SetOp::Add(name, spare), SetOp::Del(name, gone)];
        assert_all_done(&kernel.execute(&pair).unwrap());
        change_netlink.push(start.elapsed());
        let back = [SetOp::Del(name, spare), SetOp::Add(name, gone)];
        assert_all_done(&kernel.execute(&back).unwrap());
        if round < 10 {
            change_tool.push(ipset_restore(
                &ns,
                &format!("add {name} {spare}\ndel {name} {gone}\n"),
            ));
            ipset_restore(&ns, &format!("del {name} {spare}\nadd {name} {gone}\n"));
        }
    }
    change_netlink.sort();
    change_tool.sort();

    // Deleting everything, then deleting again: 150,000 failures, each reported.
    let dels: Vec<SetOp<'_>> = entries.iter().map(|e| SetOp::Del(name, *e)).collect();
    let start = Instant::now();
    assert_all_done(&kernel.execute(&dels).unwrap());
    let del_netlink = start.elapsed();
    let again = kernel.execute(&dels).unwrap();
    assert!(again.iter().all(|e| *e == -IPSET_ERR_EXIST));
    assert!(kernel.list().unwrap()[name].entries.is_empty());

    println!("{LARGE} entries of hash:ip,port,ip:");
    println!(
        "  add:  execute() {}, ipset restore {}",
        ms(add_netlink),
        ms(add_tool)
    );
    println!(
        "  list: list() {}, ipset save + parse_save {}",
        ms(list_netlink),
        ms(list_tool)
    );
    println!("  del:  execute() {}", ms(del_netlink));
    println!(
        "  one change (add + del), median of {} / {}: execute() {}, ipset restore {}",
        change_netlink.len(),
        change_tool.len(),
        ms(change_netlink[change_netlink.len() / 2]),
        ms(change_tool[change_tool.len() / 2])
    );
}
