//! The iptables applier against the fake kernel: what each sync reads and sends.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;

use proxyplan_agent::dataplane::{Dataplane, DataplaneError};
use proxyplan_agent::kernel::command::fake::{Call, FakeKernel};
use proxyplan_agent::kernel::conntrack::Flow;
use proxyplan_agent::kernel::{Backend, CommandOutput, Family, Runner, Tool, detect_backend};
use proxyplan_agent::modes::iptables::{IptablesDataplane, RenderSettings, render};
use proxyplan_agent::ruleset::names;
use support::{chains_of, ep, node_port, plan, service, small_cluster, udp};

fn dataplane(kernel: &FakeKernel) -> IptablesDataplane<FakeKernel> {
    IptablesDataplane::new(RenderSettings::default(), kernel.clone(), Backend::Nft)
}

fn restores(calls: &[Call]) -> Vec<&Call> {
    calls.iter().filter(|c| c.is_restore()).collect()
}

/// Chains declared (`:NAME`) in a payload.
fn declared(payload: &str) -> BTreeSet<String> {
    payload
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

type Chains = std::collections::BTreeMap<String, Vec<Vec<String>>>;

fn without_empty_builtins(mut chains: Chains) -> Chains {
    chains.retain(|name, rules| !rules.is_empty() || names::is_owned(name));
    chains
}

fn lines_starting<'p>(payload: &'p str, prefix: &str) -> Vec<&'p str> {
    payload.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn first_sync_on_an_empty_kernel_sends_everything() {
    let kernel = FakeKernel::new();
    let mut dp = dataplane(&kernel);
    let plan = plan(small_cluster());
    let report = dp.sync(&plan, false).unwrap();

    let calls = kernel.take_calls();
    let programs: Vec<&str> = calls.iter().map(|c| c.program.as_str()).collect();
    assert_eq!(
        programs,
        [
            "iptables-nft-save",
            "iptables-nft-save",
            "iptables-nft-restore",
            "ip6tables-nft-save",
            "ip6tables-nft-save",
        ]
    );
    assert_eq!(calls[2].args, ["--noflush", "-w", "5"]);
    let desired = render(&plan, &RenderSettings::default());
    assert_eq!(report.rules, desired.v4.rule_count());
    let wanted: usize = [&desired.v4.filter, &desired.v4.nat]
        .iter()
        .map(|t| t.chains.len() + t.base_jumps.len())
        .sum();
    assert_eq!(report.changed, wanted);
    assert!(
        report
            .payload
            .starts_with("# iptables-nft-restore --noflush\n*filter\n")
    );

    // The kernel now holds exactly the rendered rules, revision rules first.
    for (table, rules) in [("filter", &desired.v4.filter), ("nat", &desired.v4.nat)] {
        let held = without_empty_builtins(chains_of(&kernel.save(Family::V4, table), table));
        let expected = chains_of(&desired.v4.dump(), table);
        assert_eq!(held, expected, "{table}");
        for chain in rules.chains.keys() {
            assert!(held[chain][0][3].starts_with("proxyplan-rev:"), "{chain}");
        }
    }
}

#[test]
fn the_same_plan_again_reads_and_sends_nothing() {
    let kernel = FakeKernel::new();
    let mut dp = dataplane(&kernel);
    let plan = plan(small_cluster());
    dp.sync(&plan, false).unwrap();
    kernel.take_calls();
    let report = dp.sync(&plan, false).unwrap();
    assert_eq!(kernel.calls(), []);
    assert_eq!(report.payload, "");
    assert_eq!(report.changed, 0);
}

#[test]
fn a_restarted_agent_reads_the_kernel_once_and_sends_nothing() {
    let kernel = FakeKernel::new();
    let plan = plan(small_cluster());
    dataplane(&kernel).sync(&plan, false).unwrap();
    kernel.take_calls();
    let mut restarted = dataplane(&kernel);
    let report = restarted.sync(&plan, false).unwrap();
    let calls = kernel.take_calls();
    assert!(calls.iter().all(Call::is_save), "{calls:?}");
    assert_eq!(report.payload, "");
    restarted.sync(&plan, false).unwrap();
    assert_eq!(kernel.calls(), []);
}

#[test]
fn one_endpoint_change_sends_only_the_affected_chains() {
    let kernel = FakeKernel::new();
    let mut dp = dataplane(&kernel);
    let mut entries = small_cluster();
    dp.sync(&plan(entries.clone()), false).unwrap();
    kernel.take_calls();

    let key = entries[0].key.clone();
    let removed = entries[0].cluster_endpoints.remove(1);
    entries[0].cluster_endpoints.push(ep("10.244.3.10:8080"));
    let report = dp.sync(&plan(entries.clone()), false).unwrap();

    let calls = kernel.take_calls();
    let sent = restores(&calls);
    assert_eq!(sent.len(), 1, "{calls:?}");
    assert!(calls.iter().all(|c| !c.is_save()));
    let payload = sent[0].stdin.clone().unwrap();
    let expected: BTreeSet<String> = [
        names::service(&key),
        names::endpoint(&key, &removed),
        names::endpoint(&key, &ep("10.244.3.10:8080")),
    ]
    .into();
    assert_eq!(declared(&payload), expected, "{payload}");
    assert_eq!(
        lines_starting(&payload, "-X"),
        [format!("-X {}", names::endpoint(&key, &removed))]
    );
    assert!(
        payload.starts_with("*nat\n"),
        "filter is unchanged: {payload}"
    );
    assert_eq!(report.changed, 3);
    // The kernel matches a fresh render.
    let desired = render(&plan(entries), &RenderSettings::default());
    assert_eq!(
        without_empty_builtins(chains_of(&kernel.save(Family::V4, "nat"), "nat")),
        chains_of(&desired.v4.dump(), "nat")
    );
}

#[test]
fn a_removed_service_loses_its_chains() {
    let kernel = FakeKernel::new();
    let mut dp = dataplane(&kernel);
    let mut entries = small_cluster();
    dp.sync(&plan(entries.clone()), false).unwrap();
    let api = entries.remove(1);
    let report = dp.sync(&plan(entries), false).unwrap();
    let gone = [
        names::service(&api.key),
        names::external(&api.key),
        names::endpoint(&api.key, &api.cluster_endpoints[0]),
        names::endpoint(&api.key, &api.cluster_endpoints[1]),
    ];
    let removed: Vec<&str> = lines_starting(&report.payload, "-X ");
    assert_eq!(removed.len(), 4, "{}", report.payload);
    let held = chains_of(&kernel.save(Family::V4, "nat"), "nat");
    for chain in &gone {
        assert!(removed.contains(&format!("-X {chain}").as_str()));
        assert!(!held.contains_key(chain), "{chain}");
    }
    // PROXYPLAN-SERVICES and PROXYPLAN-NODEPORTS lost their rules for it.
    let rewritten = declared(&report.payload);
    assert!(rewritten.contains(names::SERVICES) && rewritten.contains(names::NODEPORTS));
}

#[test]
fn base_jumps_are_inserted_only_when_missing_and_keep_render_order() {
    let kernel = FakeKernel::new();
    kernel
        .iptables(Family::V4, "-t nat -A PREROUTING -j ACCEPT")
        .unwrap();
    kernel.iptables(Family::V4, "-A FORWARD -j ACCEPT").unwrap();
    let mut dp = dataplane(&kernel);
    let plan = plan(small_cluster());
    let first = dp.sync(&plan, false).unwrap();
    assert_eq!(lines_starting(&first.payload, "-I ").len(), 12);
    assert_eq!(lines_starting(&first.payload, "-D ").len(), 0);

    // Someone deletes our PREROUTING jump and the second of our four FORWARD jumps.
    kernel
        .iptables(Family::V4, "-t nat -D PREROUTING 1")
        .unwrap();
    kernel.iptables(Family::V4, "-D FORWARD 2").unwrap();
    dp.invalidate();
    let report = dp.sync(&plan, false).unwrap();
    assert_eq!(
        declared(&report.payload),
        BTreeSet::new(),
        "no chain rewritten"
    );
    assert_eq!(
        lines_starting(&report.payload, "-D "),
        ["-D FORWARD 3", "-D FORWARD 2", "-D FORWARD 1"],
        "our remaining FORWARD jumps, by number, descending"
    );
    assert_eq!(
        lines_starting(&report.payload, "-I ").len(),
        5,
        "{}",
        report.payload
    );

    let desired = render(&plan, &RenderSettings::default());
    for (table, rules) in [("filter", &desired.v4.filter), ("nat", &desired.v4.nat)] {
        let held = chains_of(&kernel.save(Family::V4, table), table);
        for chain in ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"] {
            let want: Vec<Vec<String>> = rules
                .base_jumps
                .iter()
                .filter(|j| j.chain == chain)
                .map(|j| proxyplan_agent::kernel::iptables::split_words(&j.rule))
                .collect();
            let Some(have) = held.get(chain) else {
                continue;
            };
            assert_eq!(
                have[..want.len()],
                want[..],
                "{table} {chain}: ours first, in order"
            );
        }
    }
    let forward = &chains_of(&kernel.save(Family::V4, "filter"), "filter")["FORWARD"];
    assert_eq!(
        forward.last().unwrap(),
        &["-j", "ACCEPT"],
        "foreign rule kept"
    );
    assert_eq!(dp.sync(&plan, false).unwrap().payload, "");
}

#[test]
fn foreign_chains_and_rules_are_untouched_and_cleanup_restores_the_kernel() {
    let kernel = FakeKernel::new();
    for command in [
        "-t nat -N KUBE-SERVICES",
        "-t nat -A KUBE-SERVICES -j RETURN",
        "-t nat -I PREROUTING 1 -j KUBE-SERVICES",
        "-A INPUT -p tcp --dport 22 -j ACCEPT",
    ] {
        kernel.iptables(Family::V4, command).unwrap();
    }
    let before = (
        kernel.save(Family::V4, "filter"),
        kernel.save(Family::V4, "nat"),
    );
    let mut dp = dataplane(&kernel);
    dp.sync(&plan(small_cluster()), false).unwrap();
    let nat = chains_of(&kernel.save(Family::V4, "nat"), "nat");
    assert_eq!(nat["KUBE-SERVICES"], [["-j", "RETURN"]]);

    let report = dp.cleanup().unwrap();
    let payload = &report.payload;
    assert!(
        !payload
            .lines()
            .any(|l| l.starts_with(':') && !l[1..].starts_with("P")),
        "only owned chains declared: {payload}"
    );
    assert!(!payload.contains("KUBE-"), "{payload}");
    assert_eq!(
        lines_starting(payload, "-D INPUT"),
        ["-D INPUT 3", "-D INPUT 2", "-D INPUT 1"],
        "ours were inserted above the foreign rule: {payload}"
    );
    assert_eq!(
        (
            kernel.save(Family::V4, "filter"),
            kernel.save(Family::V4, "nat")
        ),
        before
    );
    kernel.take_calls();
    let again = dp.cleanup().unwrap();
    assert_eq!(again.payload, "");
    assert!(restores(&kernel.calls()).is_empty());
}

#[test]
fn a_flushed_canary_invalidates_the_model_and_the_next_sync_repairs() {
    let kernel = FakeKernel::new();
    let mut dp = dataplane(&kernel);
    let plan = plan(small_cluster());
    dp.sync(&plan, false).unwrap();
    let good = kernel.save(Family::V4, "nat");
    assert!(dp.rules_intact().unwrap());

    kernel
        .iptables(Family::V4, &format!("-t nat -F {}", names::CANARY))
        .unwrap();
    assert!(!dp.rules_intact().unwrap());
    let report = dp.sync(&plan, false).unwrap();
    assert_eq!(
        declared(&report.payload),
        BTreeSet::from([names::CANARY.to_owned()])
    );
    assert!(dp.rules_intact().unwrap());

    // Everything in nat flushed and deleted, built-in chains included.
    kernel.iptables(Family::V4, "-t nat -F").unwrap();
    kernel.iptables(Family::V4, "-t nat -X").unwrap();
    assert!(!dp.rules_intact().unwrap());
    let report = dp.sync(&plan, false).unwrap();
    assert!(!report.payload.contains("*filter"), "{}", report.payload);
    assert_eq!(kernel.save(Family::V4, "nat"), good);
}

#[test]
fn a_failed_restore_rereads_the_kernel_next_time() {
    let kernel = FakeKernel::new();
    let mut dp = dataplane(&kernel);
    let plan = plan(small_cluster());
    kernel.fail_restores(1);
    let err = dp.sync(&plan, false).unwrap_err();
    assert_eq!(err.label(), "tool_failed");
    assert!(err.to_string().contains("(the line: *filter)"), "{err}");
    kernel.take_calls();
    dp.sync(&plan, false).unwrap();
    let calls = kernel.take_calls();
    assert_eq!(calls.iter().filter(|c| c.is_save()).count(), 4);
    assert_eq!(restores(&calls).len(), 1);
}

#[test]
fn a_family_without_services_loses_its_jumps_by_number() {
    let kernel = FakeKernel::new();
    kernel
        .iptables(Family::V6, "-t nat -A PREROUTING -j ACCEPT")
        .unwrap();
    let mut dp = dataplane(&kernel);
    let v6 = service("web6", "fd00:96::10", 80, &["[fd00:10:244:1::10]:8080"]);
    let mut entries = small_cluster();
    entries.push(v6);
    dp.sync(&plan(entries.clone()), false).unwrap();
    let v6_nat = chains_of(&kernel.save(Family::V6, "nat"), "nat");
    assert!(v6_nat.contains_key(names::SERVICES));
    kernel.take_calls();

    entries.pop();
    let report = dp.sync(&plan(entries), false).unwrap();
    // Deleting by number needs positions read now: the v6 tables are read again.
    let calls = kernel.take_calls();
    assert_eq!(
        calls
            .iter()
            .filter(|c| c.program == "ip6tables-nft-save")
            .count(),
        2
    );
    assert!(
        report
            .payload
            .contains("# ip6tables-nft-restore --noflush\n")
    );
    assert!(lines_starting(&report.payload, "-D PREROUTING 1").len() == 1);
    let v6_nat = chains_of(&kernel.save(Family::V6, "nat"), "nat");
    assert_eq!(
        v6_nat.keys().collect::<Vec<_>>(),
        ["INPUT", "OUTPUT", "POSTROUTING", "PREROUTING"]
    );
    assert_eq!(v6_nat["PREROUTING"], [["-j", "ACCEPT"]]);
}

#[test]
fn dry_run_returns_the_payload_and_changes_nothing() {
    let kernel = FakeKernel::new();
    let mut dp = dataplane(&kernel);
    let plan = plan(small_cluster());
    let empty = kernel.save(Family::V4, "nat");
    let dry = dp.sync(&plan, true).unwrap();
    assert!(restores(&kernel.calls()).is_empty());
    assert_eq!(kernel.save(Family::V4, "nat"), empty);
    let real = dp.sync(&plan, false).unwrap();
    assert_eq!(dry.payload, real.payload);
}

#[test]
fn missing_tools_are_named_with_their_package() {
    let kernel = FakeKernel::new();
    kernel.remove_program("iptables-nft-restore");
    let mut dp = dataplane(&kernel);
    let err = dp.sync(&plan(small_cluster()), false).unwrap_err();
    assert!(
        matches!(&err, DataplaneError::MissingTool { tool, .. } if tool == "iptables-nft-restore")
    );
    assert!(err.to_string().contains("Debian package iptables"), "{err}");

    let kernel = FakeKernel::new();
    kernel.remove_program("conntrack");
    let mut dp = dataplane(&kernel);
    dp.sync(&plan(small_cluster()), false).unwrap();
    let dns = udp(service("dns", "10.96.0.53", 53, &["10.244.1.53:5353"]));
    let err = dp.sync(&plan(vec![dns]), false).unwrap_err();
    assert!(
        err.to_string().contains("Debian package conntrack"),
        "{err}"
    );
}

fn flow(src: &str, dst: &str, dport: u16, reply: &str) -> Flow {
    let (reply_src, reply_sport) = reply.rsplit_once(':').unwrap();
    Flow {
        orig_src: src.parse().unwrap(),
        orig_dst: dst.parse().unwrap(),
        sport: 40000,
        dport,
        reply_src: reply_src.parse().unwrap(),
        reply_sport: reply_sport.parse().unwrap(),
    }
}

#[test]
fn stale_udp_conntrack_entries_are_deleted() {
    let kernel = FakeKernel::new();
    let mut dp = dataplane(&kernel);
    let dns = |eps: &[&str]| udp(node_port(service("dns", "10.96.0.53", 53, eps), 30053));
    let not_natted = flow("10.244.1.7", "10.96.0.53", 53, "10.96.0.53:53");
    let via_a = flow("10.244.1.8", "10.96.0.53", 53, "10.244.1.53:5353");
    let nodeport_via_a = flow("192.0.2.1", "192.168.0.10", 30053, "10.244.1.53:5353");
    let via_b = flow("10.244.1.9", "10.96.0.53", 53, "10.244.2.53:5353");

    // First sync: the table is listed; only the entry that was not DNATed goes.
    kernel.add_flow(not_natted);
    kernel.add_flow(via_a);
    let report = dp
        .sync(&plan(vec![dns(&["10.244.1.53:5353"])]), false)
        .unwrap();
    assert_eq!(report.conntrack_deleted, 1);
    assert_eq!(kernel.flows(), [via_a]);

    // No endpoints, then one again: every entry to the service goes.
    dp.sync(&plan(vec![dns(&[])]), false).unwrap();
    kernel.add_flow(not_natted);
    kernel.take_calls();
    let report = dp
        .sync(&plan(vec![dns(&["10.244.1.53:5353"])]), false)
        .unwrap();
    let conntrack: Vec<String> = kernel
        .calls()
        .iter()
        .filter(|c| c.program == "conntrack")
        .map(|c| c.args.join(" "))
        .collect();
    assert_eq!(
        conntrack,
        [
            "-D -p udp -f ipv4 --orig-dst 10.96.0.53 --dport 53",
            "-D -p udp -f ipv4 --dport 30053",
        ]
    );
    assert_eq!(report.conntrack_deleted, 1);
    assert!(
        report
            .payload
            .contains("# conntrack -D -p udp -f ipv4 --dport 30053\n")
    );

    // An endpoint removed: entries answered by it go, others stay.
    kernel.add_flow(via_a);
    kernel.add_flow(nodeport_via_a);
    kernel.add_flow(via_b);
    dp.sync(
        &plan(vec![dns(&["10.244.1.53:5353", "10.244.2.53:5353"])]),
        false,
    )
    .unwrap();
    let report = dp
        .sync(&plan(vec![dns(&["10.244.2.53:5353"])]), false)
        .unwrap();
    assert_eq!(report.conntrack_deleted, 2);
    assert_eq!(kernel.flows(), [via_b]);
}

/// A runner that answers `*-save` with a fixed number of rules per back end.
struct Canned {
    legacy: usize,
    nft: usize,
}

impl Runner for Canned {
    fn run(
        &self,
        program: &str,
        _: &[&str],
        _: Option<&str>,
    ) -> Result<CommandOutput, DataplaneError> {
        let rules = if program.contains("legacy") {
            self.legacy
        } else {
            self.nft
        };
        Ok(CommandOutput {
            code: Some(0),
            stdout: "*filter\n:INPUT ACCEPT [0:0]\n".to_owned()
                + &"-A INPUT -j ACCEPT\n".repeat(rules)
                + "COMMIT\n",
            stderr: String::new(),
        })
    }
}

#[test]
fn auto_backend_follows_the_rules_the_node_already_has() {
    assert_eq!(detect_backend(&Canned { legacy: 0, nft: 0 }), Backend::Nft);
    assert_eq!(
        detect_backend(&Canned { legacy: 3, nft: 2 }),
        Backend::Legacy
    );
    assert_eq!(detect_backend(&Canned { legacy: 2, nft: 2 }), Backend::Nft);
    let missing = FakeKernel::new();
    missing.remove_program("iptables-legacy-save");
    missing.remove_program("ip6tables-legacy-save");
    assert_eq!(detect_backend(&missing), Backend::Nft);
    assert_eq!(
        Backend::Legacy.binary(Family::V6, Tool::Restore),
        "ip6tables-legacy-restore"
    );
    assert_eq!(
        "legacy".parse(),
        Ok(proxyplan_agent::kernel::BackendChoice::Legacy)
    );
}
