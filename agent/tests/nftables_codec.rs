//! The nf_tables codec against `nft` 1.0.6: annotated byte vectors of what `nft -f`
//! sends for the objects, rules and elements the nftables mode writes (captured with
//! `strace -e trace=sendmsg -e write=3 nft -f FILE`, sequence number 1). Each vector is
//! read by the codec and written again byte for byte, and the nftables mode's own
//! rendering of the same object (its rules lowered to expressions, its set definitions
//! with nft's typeof userdata) writes exactly nft's bytes: `nft list` shows the agent's
//! table as nft would its own.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(target_endian = "little")]

use std::net::IpAddr;

use proxyplan_agent::kernel::Family;
use proxyplan_agent::kernel::nftables::objects::{
    ElementData, comment_userdata, decode_element_list, encode_element, finish_elements, split,
    start_elements,
};
use proxyplan_agent::kernel::nftables::uapi::*;
use proxyplan_agent::kernel::nftables::{Chain, Data, Expr, Hook, Rule, Set, Table, Verdict};
use proxyplan_agent::modes::nftables::layout::{SetDef, SetKind};
use proxyplan_agent::modes::nftables::rules::{Action, Match, Net, Rule as IrRule};
use proxyplan_agent::modes::nftables::sink::kernel_rule;

include!("nftables_vectors/vectors.rs");

/// `message` with sequence number 1, as the vectors were captured.
fn seq1(mut message: Vec<u8>) -> Vec<u8> {
    message[8..12].copy_from_slice(&1u32.to_ne_bytes());
    message
}

/// Reads a captured message with the codec and writes it again.
fn reencode(bytes: &[u8]) -> Vec<u8> {
    let (msg, family, body) = split(bytes).unwrap();
    let again = match msg {
        NFT_MSG_NEWTABLE => Table::decode(family, body).unwrap().new_message(),
        NFT_MSG_NEWCHAIN => Chain::decode(family, body).unwrap().new_message(),
        NFT_MSG_NEWSET => Set::decode(family, body).unwrap().new_message(),
        NFT_MSG_NEWRULE => Rule::decode(family, body).unwrap().new_message(),
        NFT_MSG_NEWSETELEM | NFT_MSG_DELSETELEM => {
            let mut elements = Vec::new();
            let (set, set_id) = decode_element_list(body, &mut |e| {
                let data = match e.data {
                    ElementData::None => None,
                    ElementData::Value(v) => Some(Data::Value(v.to_vec())),
                    ElementData::Verdict(v) => Some(Data::Verdict(v)),
                };
                elements.push((e.key.to_vec(), data));
            })
            .unwrap();
            let (mut buf, nest) =
                start_elements(msg == NFT_MSG_NEWSETELEM, family, "proxyplan", &set, set_id);
            for (i, (key, data)) in (1..).zip(&elements) {
                encode_element(&mut buf, i, key, data.as_ref());
            }
            finish_elements(buf, nest)
        }
        other => panic!("no vector of message {other}"),
    };
    seq1(again)
}

const ALL: [&[u8]; 24] = [
    TABLE_WITH_COMMENT,
    BASE_CHAIN,
    BACKENDS_MAP,
    AFFINITY_MAP,
    RULE_DISPATCH,
    RULE_NODEPORT_DISPATCH,
    RULE_MARK_NOT_LOCAL,
    RULE_DNAT_BY_DESTINATION,
    RULE_HAIRPIN,
    RULE_MARK_CLEAR_RETURN,
    RULE_MARK_XOR,
    RULE_MASQUERADE,
    RULE_JUMP_IF_NEW,
    RULE_REJECT_CLUSTER_IPS,
    RULE_STICKY,
    RULE_AFFINITY_RECORD,
    RULE_DNAT_TO,
    RULE_PICK_BY_SLOT,
    RULE_LOCAL_DNAT_BY_SLOT,
    RULE_IIFNAME_PREFIX,
    ELEMENT_VERDICT,
    ELEMENTS_BACKENDS,
    DELETE_ELEMENT,
    RULE_PREFIX_20,
];

#[test]
fn every_vector_is_read_and_written_again_byte_for_byte() {
    for (i, vector) in ALL.iter().enumerate() {
        assert_eq!(reencode(vector), *vector, "vector {i}");
    }
}

#[test]
fn table_chain_and_sets_are_written_as_nft_writes_them() {
    let table = Table {
        family: NFPROTO_IPV4,
        name: "proxyplan".into(),
        flags: 0,
        userdata: Some(comment_userdata("rules for proxyplan")),
    };
    assert_eq!(seq1(table.new_message()), TABLE_WITH_COMMENT);
    let chain = Chain {
        family: NFPROTO_IPV4,
        table: "proxyplan".into(),
        name: "nat-prerouting".into(),
        hook: Some(Hook {
            chain_type: "nat".into(),
            hooknum: NF_INET_PRE_ROUTING,
            priority: -100,
        }),
        policy: None,
        userdata: None,
        handle: None,
    };
    assert_eq!(seq1(chain.new_message()), BASE_CHAIN);
    for (def, vector) in [
        (
            SetDef::new("backends-udp", SetKind::BackendsByAddress(17)),
            BACKENDS_MAP,
        ),
        (
            SetDef::new(
                "affinity-2",
                SetKind::Affinity {
                    timeout_seconds: 10,
                },
            ),
            AFFINITY_MAP,
        ),
    ] {
        let mut set = def.kernel(Family::V4);
        set.set_id = Some(1);
        assert_eq!(seq1(set.new_message()), vector, "{}", def.name);
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

#[test]
fn the_modes_rules_are_lowered_to_nfts_expressions() {
    let mark = 0x2000;
    let rule = |matches: Vec<Match>, actions: Vec<Action>| IrRule::new(matches, actions);
    let cases: Vec<(&str, IrRule, &[u8])> = vec![
        (
            "services",
            rule(
                vec![],
                vec![Action::DispatchByDestination("service-ips".into())],
            ),
            RULE_DISPATCH,
        ),
        (
            "services",
            rule(
                vec![
                    Match::FibDaddrLocal,
                    Match::Daddr {
                        net: Net::parse("127.0.0.0/8").unwrap(),
                        negate: true,
                    },
                ],
                vec![Action::DispatchByPort("service-nodeports".into())],
            ),
            RULE_NODEPORT_DISPATCH,
        ),
        (
            "lb-2",
            rule(
                vec![Match::Saddr {
                    net: Net::parse("10.244.0.0/16").unwrap(),
                    negate: true,
                }],
                vec![Action::MarkOr(mark)],
            ),
            RULE_MARK_NOT_LOCAL,
        ),
        (
            "lb-2",
            rule(
                vec![Match::L4Proto(6)],
                vec![Action::DnatByDestination {
                    map: "backends-tcp".into(),
                    modulus: 2,
                }],
            ),
            RULE_DNAT_BY_DESTINATION,
        ),
        (
            "masquerading",
            rule(
                vec![Match::CtStatusDnat, Match::Hairpin("hairpin".into())],
                vec![Action::MarkOr(mark)],
            )
            .comment("hairpin"),
            RULE_HAIRPIN,
        ),
        (
            "masquerading",
            rule(
                vec![Match::MarkClear(mark)],
                vec![Action::Verdict(Verdict::Return)],
            ),
            RULE_MARK_CLEAR_RETURN,
        ),
        (
            "masquerading",
            rule(vec![], vec![Action::MarkXor(mark)]),
            RULE_MARK_XOR,
        ),
        (
            "masquerading",
            rule(vec![], vec![Action::Masquerade]),
            RULE_MASQUERADE,
        ),
        (
            "services",
            rule(
                vec![Match::CtStateNew],
                vec![Action::Verdict(Verdict::Jump("masquerading".into()))],
            ),
            RULE_JUMP_IF_NEW,
        ),
        (
            "services",
            rule(
                vec![Match::DaddrIn("cluster-ips".into())],
                vec![Action::Reject],
            ),
            RULE_REJECT_CLUSTER_IPS,
        ),
        (
            "ep",
            rule(
                vec![Match::SaddrIn("affinity".into()), Match::L4Proto(6)],
                vec![
                    Action::AffinityRefresh("affinity".into()),
                    Action::DnatByAffinity("affinity".into()),
                ],
            ),
            RULE_STICKY,
        ),
        (
            "ep",
            rule(
                vec![],
                vec![Action::AffinityRecord {
                    map: "affinity".into(),
                    addr: ip("10.244.1.10"),
                    port: 8080,
                }],
            ),
            RULE_AFFINITY_RECORD,
        ),
        (
            "ep",
            rule(
                vec![Match::L4Proto(6)],
                vec![Action::DnatTo {
                    addr: ip("10.244.1.10"),
                    port: 8080,
                }],
            ),
            RULE_DNAT_TO,
        ),
        (
            "ep",
            rule(
                vec![],
                vec![Action::PickBySlot {
                    map: "slots".into(),
                    modulus: 2,
                }],
            ),
            RULE_PICK_BY_SLOT,
        ),
        (
            "ep",
            rule(
                vec![Match::FibSaddrLocal, Match::L4Proto(6)],
                vec![Action::DnatBySlot {
                    map: "endpoints".into(),
                    modulus: 2,
                }],
            ),
            RULE_LOCAL_DNAT_BY_SLOT,
        ),
        (
            "ep",
            rule(
                vec![Match::Iifname {
                    name: "veth".into(),
                    prefix: true,
                    negate: true,
                }],
                vec![Action::Verdict(Verdict::Accept)],
            ),
            RULE_IIFNAME_PREFIX,
        ),
        (
            "ep",
            rule(
                vec![Match::Saddr {
                    net: Net::parse("10.244.16.0/20").unwrap(),
                    negate: false,
                }],
                vec![Action::Verdict(Verdict::Accept)],
            ),
            RULE_PREFIX_20,
        ),
    ];
    let mut failures = Vec::new();
    for (chain, rule, vector) in cases {
        let ours = seq1(kernel_rule(Family::V4, chain, &rule).new_message());
        // nft names the sets it looks up by id as well (its cache's); the agent by
        // name only. Everything else is byte for byte.
        let (_, _, body) = split(vector).unwrap();
        let mut theirs = Rule::decode(NFPROTO_IPV4, body).unwrap();
        for expr in &mut theirs.exprs {
            if let Expr::Lookup { set_id, .. } | Expr::Dynset { set_id, .. } = expr {
                *set_id = None;
            }
        }
        if ours != seq1(theirs.new_message()) {
            failures.push(format!(
                "{chain}: {rule:?}\n  ours: {:?}\n  nft:  {:?}",
                kernel_rule(Family::V4, chain, &rule).exprs,
                theirs.exprs
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn elements_are_written_as_nft_writes_them() {
    let verdict = {
        let (mut buf, nest) =
            start_elements(true, NFPROTO_IPV4, "proxyplan", "service-ips", Some(1));
        let mut key = vec![10, 96, 0, 10, 6, 0, 0, 0];
        key.extend_from_slice(&80u16.to_be_bytes());
        key.extend_from_slice(&[0, 0]);
        encode_element(
            &mut buf,
            1,
            &key,
            Some(&Data::Verdict(Verdict::Goto("lb-2".into()))),
        );
        finish_elements(buf, nest)
    };
    assert_eq!(seq1(verdict), ELEMENT_VERDICT);
    let backend_key = |slot: u32| {
        let mut key = vec![10, 96, 0, 10, 0, 80, 0, 0];
        key.extend_from_slice(&slot.to_ne_bytes());
        key
    };
    let endpoint = |last: u8| Data::Value(vec![10, 244, last, 10, 0x1f, 0x90, 0, 0]);
    let backends = {
        let (mut buf, nest) =
            start_elements(true, NFPROTO_IPV4, "proxyplan", "backends-tcp", Some(5));
        encode_element(&mut buf, 1, &backend_key(0), Some(&endpoint(1)));
        encode_element(&mut buf, 2, &backend_key(1), Some(&endpoint(2)));
        finish_elements(buf, nest)
    };
    assert_eq!(seq1(backends), ELEMENTS_BACKENDS);
    let delete = {
        let (mut buf, nest) =
            start_elements(false, NFPROTO_IPV4, "proxyplan", "backends-tcp", None);
        encode_element(&mut buf, 1, &backend_key(1), None);
        finish_elements(buf, nest)
    };
    assert_eq!(seq1(delete), DELETE_ELEMENT);
}

#[test]
fn the_dump_of_a_kernel_reads_back_as_what_was_sent() {
    // The kernel dumps a 32-bit register at a 16-byte boundary as the 16-byte one, and
    // the NAT flags its registers imply: canonical forms compare equal.
    let sent = Expr::Nat {
        kind: NFT_NAT_DNAT,
        family: u32::from(NFPROTO_IPV6),
        addr: Some((NFT_REG_1, NFT_REG_1)),
        proto: Some((NFT_REG32_00 + 4, NFT_REG32_00 + 4)),
        flags: 0,
    };
    let dumped = Expr::Nat {
        kind: NFT_NAT_DNAT,
        family: u32::from(NFPROTO_IPV6),
        addr: Some((NFT_REG_1, NFT_REG_1)),
        proto: Some((2, 2)),
        flags: NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED,
    };
    assert_ne!(sent, dumped);
    assert_eq!(sent.canonical(), dumped.canonical());
}
