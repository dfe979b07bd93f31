//! The tracer on hand-written rules.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use proxyplan_crds::Protocol;

use super::rules::{Cidr, Rule, Target, tokenize};
use super::*;
use crate::ruleset::rules::{BaseJump, FamilyRules, TableRules};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// A nat table with a service chain balancing over two endpoints and a masquerade
/// chain, hand-written in the renderer's syntax.
fn rules() -> FamilyRules {
    let mut nat = TableRules {
        base_jumps: vec![
            BaseJump {
                chain: "PREROUTING",
                rule: "-m comment --comment \"portals\" -j SVCS".into(),
            },
            BaseJump {
                chain: "OUTPUT",
                rule: "-j SVCS".into(),
            },
            BaseJump {
                chain: "POSTROUTING",
                rule: "-j POST".into(),
            },
        ],
        chains: BTreeMap::new(),
    };
    let chain = |rules: &[&str]| rules.iter().map(|r| (*r).to_owned()).collect::<Vec<_>>();
    nat.chains.insert(
        "SVCS".into(),
        chain(&[
            "-m comment --comment \"a b\" -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j SVC",
            "-d 10.96.0.2 -p udp -m udp --dport 53 -j SVC",
        ]),
    );
    nat.chains.insert(
        "SVC".into(),
        chain(&[
            "! -s 10.244.0.0/16 -j MASQ",
            "-m recent --name SEP1 --rcheck --seconds 60 --reap -j SEP1",
            "-m statistic --mode random --probability 0.5000000000 -j SEP1",
            "-j SEP2",
        ]),
    );
    nat.chains
        .insert("MASQ".into(), chain(&["-j MARK --or-mark 0x2000"]));
    nat.chains.insert(
        "SEP1".into(),
        chain(&[
            "-s 10.244.1.1/32 -j MASQ",
            "-p tcp -m recent --name SEP1 --set -j DNAT --to-destination 10.244.1.1:8080",
            "-p udp -j DNAT --to-destination 10.244.1.1:5353",
        ]),
    );
    nat.chains.insert(
        "SEP2".into(),
        chain(&["-j DNAT --to-destination 10.244.2.1:8080"]),
    );
    nat.chains.insert(
        "POST".into(),
        chain(&[
            "-m mark ! --mark 0x2000/0x2000 -j RETURN",
            "-j MARK --xor-mark 0x2000",
            "-j MASQUERADE --random-fully",
        ]),
    );
    let mut filter = TableRules {
        base_jumps: vec![BaseJump {
            chain: "FORWARD",
            rule: "-m conntrack --ctstate NEW -j FW".into(),
        }],
        chains: BTreeMap::new(),
    };
    filter.chains.insert(
        "FW".into(),
        chain(&["-d 10.96.0.9/32 -p tcp -m tcp --dport 80 -j REJECT"]),
    );
    FamilyRules { filter, nat }
}

fn tcp(source: &str, dest: &str, port: u16) -> Packet {
    Packet::new(ip(source), ip(dest), Protocol::TCP, port)
}

#[test]
fn random_balancing_explores_every_branch() {
    let result = trace(&rules(), &[], &tcp("10.244.3.3", "10.96.0.1", 80)).unwrap();
    assert_eq!(result.verdict, Verdict::Accept);
    assert_eq!(
        result.endpoints,
        BTreeSet::from(["10.244.1.1:8080".to_owned(), "10.244.2.1:8080".to_owned()])
    );
    assert!(!result.masquerade, "{result}");
    assert!(result.is_uniform());
    assert_eq!(result.recent_set, BTreeSet::from(["SEP1".to_owned()]));
}

#[test]
fn mark_becomes_masquerade_in_postrouting() {
    let result = trace(&rules(), &[], &tcp("192.168.1.1", "10.96.0.1", 80)).unwrap();
    assert!(result.masquerade && result.is_uniform(), "{result}");
    let host = tcp("192.168.1.1", "10.96.0.1", 80).host_originated();
    assert!(trace(&rules(), &[], &host).unwrap().masquerade);
}

#[test]
fn hairpin_masquerades_only_the_path_back_to_the_source() {
    let result = trace(&rules(), &[], &tcp("10.244.1.1", "10.96.0.1", 80)).unwrap();
    assert!(!result.is_uniform());
    assert_eq!(result.masquerade_to("10.244.1.1:8080"), Some(true));
    assert_eq!(result.masquerade_to("10.244.2.1:8080"), Some(false));
}

#[test]
fn recent_check_matches_a_returning_client() {
    let packet = tcp("10.244.3.3", "10.96.0.1", 80).with_recent("SEP1");
    let result = trace(&rules(), &[], &packet).unwrap();
    assert_eq!(
        result.endpoints,
        BTreeSet::from(["10.244.1.1:8080".to_owned()])
    );
}

#[test]
fn protocol_and_port_must_match() {
    let result = trace(&rules(), &[], &tcp("10.244.3.3", "10.96.0.1", 81)).unwrap();
    assert_eq!(result.verdict, Verdict::Accept);
    assert!(result.endpoints.is_empty() && !result.masquerade);
    let udp = Packet::new(ip("10.244.3.3"), ip("10.96.0.2"), Protocol::UDP, 53);
    let result = trace(&rules(), &[], &udp).unwrap();
    assert_eq!(
        result.endpoints,
        BTreeSet::from(["10.244.1.1:5353".to_owned(), "10.244.2.1:8080".to_owned()])
    );
}

#[test]
fn filter_runs_on_forwarded_packets_only_for_their_hook() {
    let result = trace(&rules(), &[], &tcp("10.244.3.3", "10.96.0.9", 80)).unwrap();
    assert_eq!(result.verdict, Verdict::Reject);
    // The same destination as a local address: INPUT, where FW is not jumped to.
    let result = trace(
        &rules(),
        &[ip("10.96.0.9")],
        &tcp("10.244.3.3", "10.96.0.9", 80),
    )
    .unwrap();
    assert_eq!(result.verdict, Verdict::Accept);
}

#[test]
fn cidrs_and_tokens() {
    let cidr = Cidr::parse("fd00:10:244::/48").unwrap();
    assert!(cidr.contains(ip("fd00:10:244:1::5")));
    assert!(!cidr.contains(ip("fd00:10:245::5")));
    assert!(!cidr.contains(ip("10.0.0.1")));
    assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("1.2.3.4")));
    assert!(Cidr::parse("10.0.0.0/33").is_err());
    assert_eq!(
        tokenize(r#"-m comment --comment "a \"b\" c" -j X"#).unwrap(),
        ["-m", "comment", "--comment", "a \"b\" c", "-j", "X"]
    );
    assert!(tokenize("\"open").is_err());
}

#[test]
fn dnat_to_ipv6() {
    let rule = Rule::parse("-p tcp -j DNAT --to-destination [fd00::1]:8080").unwrap();
    let Some(Target::Dnat(to)) = rule.target else {
        panic!("{rule:?}")
    };
    assert_eq!(to.to_string(), "[fd00::1]:8080");
}

#[test]
fn unknown_syntax_is_an_error() {
    for bad in [
        "-i eth0 -j ACCEPT",
        "-m multiport --dports 80,443 -j ACCEPT",
        "-p tcp -m tcp --sport 80 -j ACCEPT",
        "-m tcp --dport 80 -j ACCEPT",
        "-p icmp -j ACCEPT",
        "-m addrtype --dst-type BROADCAST -j ACCEPT",
        "-m statistic --mode nth --every 2 -j ACCEPT",
        "-m recent --name X --update -j ACCEPT",
        "-j DNAT --to-destination 10.0.0.1",
        "-j MARK --and-mark 0x1",
        "-j MASQUERADE --to-ports 1000",
        "-j ACCEPT --extra",
        "-d 10.0.0.0/40 -j ACCEPT",
        "--comment x -j ACCEPT",
        "! ! -s 10.0.0.1 -j ACCEPT",
        "-s 10.0.0.1 !",
    ] {
        assert!(Rule::parse(bad).is_err(), "{bad}");
    }
    let mut broken = rules();
    broken
        .nat
        .chains
        .insert("SEP2".into(), vec!["-j SNAT --to-source 1.2.3.4".into()]);
    let err = Tracer::new(&broken, &[]).unwrap_err();
    assert!(
        matches!(&err, TraceError::Rule { chain, .. } if chain == "SEP2"),
        "{err}"
    );
}

#[test]
fn loops_are_an_error() {
    let mut looping = rules();
    looping
        .nat
        .chains
        .insert("SEP2".into(), vec!["-j SVC".into()]);
    let err = trace(&looping, &[], &tcp("10.244.3.3", "10.96.0.1", 80)).unwrap_err();
    assert!(matches!(err, TraceError::TooDeep { .. }), "{err}");
}

/// ipvs mode's matches as `iptables-save` prints them: a negated set match, the `ipvs`
/// match with a numeric protocol; a set the stage does not hold is an error naming the
/// rule.
#[test]
fn ipvs_matches_read_sets_and_the_scheduled_virtual_server() {
    use crate::kernel::ipset::{IpSet, SetEntry, SetType, Sets};
    use std::net::SocketAddr;
    let mut filter = TableRules {
        base_jumps: vec![
            BaseJump {
                chain: "INPUT",
                rule: "-j FW".into(),
            },
            BaseJump {
                chain: "OUTPUT",
                rule: "-j OUT".into(),
            },
        ],
        chains: BTreeMap::new(),
    };
    filter.chains.insert(
        "FW".into(),
        vec![
            "-m set --match-set LB dst,dst -m set ! --match-set ALLOWED dst,dst,src -j DROP".into(),
        ],
    );
    filter.chains.insert(
        "OUT".into(),
        vec![
            "-s 203.0.113.7/32 -m ipvs --vaddr 203.0.113.7/32 --vproto 6 --vport 443 -j DROP"
                .into(),
        ],
    );
    let rules = FamilyRules {
        filter,
        nat: TableRules::default(),
    };
    let lb = ip("203.0.113.7");
    let mut sets = Sets::new();
    let mut set = IpSet::new(SetType::HashIpPort, false);
    set.entries.insert(SetEntry::IpPort(lb, 6, 443));
    sets.insert("LB".into(), set);
    let mut allowed = IpSet::new(SetType::HashIpPortNet, false);
    allowed
        .entries
        .insert(SetEntry::IpPortNet(lb, 6, 443, ip("192.0.2.0"), 24));
    sets.insert("ALLOWED".into(), allowed.clone());
    let server = VirtualServer {
        scheduler: "rr".into(),
        persistence: None,
        real_servers: vec![(SocketAddr::new(ip("10.244.2.10"), 8443), 1)],
    };
    let stage = IpvsStage {
        servers: BTreeMap::from([((Protocol::TCP, lb, 443), server)]),
        sets,
    };
    let tracer = Tracer::new(&rules, &[lb])
        .unwrap()
        .with_ipvs(stage.clone())
        .unwrap();
    let to_lb = |from: &str| Packet::new(ip(from), lb, Protocol::TCP, 443);
    let inside = tracer.trace(&to_lb("192.0.2.9")).unwrap();
    assert_eq!(inside.verdict, Verdict::Accept, "{inside}");
    assert_eq!(
        inside.endpoints,
        BTreeSet::from(["10.244.2.10:8443".to_owned()])
    );
    let outside = tracer.trace(&to_lb("198.51.100.9")).unwrap();
    assert_eq!(outside.verdict, Verdict::Drop, "{outside}");
    // The node itself, from the LB IP: IPVS takes it, then the output filter's ipvs
    // match drops it.
    let own = tracer
        .trace(&to_lb("203.0.113.7").host_originated())
        .unwrap();
    assert_eq!(own.verdict, Verdict::Drop, "{own}");

    let mut missing = stage;
    missing.sets.remove("ALLOWED");
    let err = Tracer::new(&rules, &[lb])
        .unwrap()
        .with_ipvs(missing)
        .unwrap_err();
    assert!(
        err.to_string().contains("no ipset ALLOWED is held"),
        "{err}"
    );
}
