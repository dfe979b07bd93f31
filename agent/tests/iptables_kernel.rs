//! The iptables applier against the real kernel, as root, each test in its own network
//! namespace (`ip netns exec`), for the nft back end and, where it works in a
//! namespace, the legacy one. Without root or `ip netns` every test prints a SKIPPED
//! line and passes. Real traffic is tested elsewhere; these check what the kernel holds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use proxyplan_agent::dataplane::{Dataplane, DataplaneError, SyncReport};
use proxyplan_agent::kernel::xtables_nft::{DumpSummary, NftChain, NftRule};
use proxyplan_agent::kernel::{
    Backend, BackendChoice, CommandOutput, CommandRunner, Family, Runner, Tool,
};
use proxyplan_agent::modes::iptables::dataplane::PayloadSize;
use proxyplan_agent::modes::iptables::{IptablesDataplane, RenderSettings, render};
use proxyplan_agent::ruleset::names;
use proxyplan_crds::MergedPlan;
use support::{Netns, chains_of, ep, many_services, plan, service, small_cluster, udp};

/// A real runner that remembers which programs it ran and how long each took.
struct Recording {
    inner: CommandRunner,
    calls: Mutex<Vec<String>>,
    took: Mutex<Vec<(String, Duration)>>,
}

impl Runner for Recording {
    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<CommandOutput, DataplaneError> {
        self.calls.lock().unwrap().push(program.to_owned());
        let start = Instant::now();
        let out = self.inner.run(program, args, stdin);
        self.took
            .lock()
            .unwrap()
            .push((program.to_owned(), start.elapsed()));
        out
    }

    fn nft_table(
        &self,
        family: Family,
        table: &str,
        chain: &mut dyn FnMut(NftChain<'_>),
        rule: &mut dyn FnMut(NftRule<'_>),
        restart: &mut dyn FnMut(),
    ) -> Result<Option<DumpSummary>, DataplaneError> {
        self.calls.lock().unwrap().push(NFT_DUMP.to_owned());
        let start = Instant::now();
        let out = self.inner.nft_table(family, table, chain, rule, restart);
        self.took
            .lock()
            .unwrap()
            .push((format!("{NFT_DUMP} {table}"), start.elapsed()));
        out
    }

    fn nft_generation(&self) -> Result<Option<u32>, DataplaneError> {
        self.inner.nft_generation()
    }
}

/// What [`Recording`] calls a dump of an nf_tables table over nfnetlink.
const NFT_DUMP: &str = "nfnetlink dump";

/// Whether `program` only reads the agent's rules (the nft back end reads over
/// nfnetlink, and lists the built-in chains with `iptables-nft -S`).
fn reads(program: &str) -> bool {
    !program.ends_with("-restore")
}

impl Recording {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }

    /// Time spent in the tools since the last call, as `program: duration` lines.
    fn take_times(&self) -> String {
        std::mem::take(&mut *self.took.lock().unwrap())
            .iter()
            .map(|(p, d)| format!("{p} {d:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn dataplane(ns: &Netns, backend: Backend) -> IptablesDataplane<Recording> {
    let runner = Recording {
        inner: CommandRunner::in_netns(&ns.name),
        calls: Mutex::new(Vec::new()),
        took: Mutex::new(Vec::new()),
    };
    IptablesDataplane::new(RenderSettings::default(), runner, backend)
}

fn iptables(ns: &Netns, backend: Backend, family: Family, command: &str) {
    let binary = backend.binary(family, Tool::Iptables);
    let mut args = vec![binary.as_str()];
    args.extend(command.split_whitespace());
    ns.run(&args);
}

fn save(ns: &Netns, backend: Backend, family: Family) -> String {
    ns.run(&[&backend.binary(family, Tool::Save)])
}

/// iptables-save output without comment lines and with counters zeroed.
fn normalized(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| match l.find(" [") {
            Some(i) if l.starts_with(':') => format!("{} [0:0]", &l[..i]),
            _ => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The namespace, or a SKIPPED line and `None` when the back end does not work there.
fn namespace(backend: Backend) -> Option<Netns> {
    support::namespace_for(backend)
}

/// Rules someone else put on the node.
fn add_foreign_rules(ns: &Netns, backend: Backend) {
    for family in [Family::V4, Family::V6] {
        for command in [
            "-t nat -N KUBE-SERVICES",
            "-t nat -A KUBE-SERVICES -j RETURN",
            "-t nat -A PREROUTING -j KUBE-SERVICES",
            "-N KUBE-FIREWALL",
            "-A INPUT -p tcp --dport 22 -j ACCEPT",
        ] {
            iptables(ns, backend, family, command);
        }
    }
}

fn timed(dp: &mut impl Dataplane, plan: &MergedPlan) -> (SyncReport, Duration) {
    let start = Instant::now();
    let report = dp.sync(plan, false).unwrap();
    (report, start.elapsed())
}

/// First sync installs every chain and jump; the same plan again runs nothing; a
/// restarted agent reads once and sends nothing; foreign rules stay.
fn first_sync_then_nothing(backend: Backend) {
    let Some(ns) = namespace(backend) else { return };
    add_foreign_rules(&ns, backend);
    let mut dp = dataplane(&ns, backend);
    let plan = plan(small_cluster());
    let (report, took) = timed(&mut dp, &plan);
    println!(
        "{backend:?} first sync: {} rules, {} bytes sent, {took:?}",
        report.rules,
        report.payload.len()
    );
    let desired = render(&plan, &RenderSettings::default());
    let text = save(&ns, backend, Family::V4);
    for (table, rules) in [("filter", &desired.v4.filter), ("nat", &desired.v4.nat)] {
        let held = chains_of(&text, table);
        for (chain, body) in &rules.chains {
            let have = held
                .get(chain)
                .unwrap_or_else(|| panic!("{table} {chain} missing"));
            assert_eq!(have.len(), body.len() + 1, "{table} {chain}");
            assert_eq!(
                have[0][3],
                format!(
                    "proxyplan-rev:{}",
                    proxyplan_agent::ruleset::TableRules::revision(body)
                )
            );
        }
        for jump in &rules.base_jumps {
            let words = proxyplan_agent::kernel::iptables::split_words(&jump.rule);
            assert!(
                held[jump.chain].contains(&words),
                "{table} {}: {}",
                jump.chain,
                jump.rule
            );
        }
    }
    let nat = chains_of(&text, "nat");
    assert_eq!(nat["KUBE-SERVICES"], [["-j", "RETURN"]]);
    assert!(nat["PREROUTING"].contains(&vec!["-j".to_owned(), "KUBE-SERVICES".to_owned()]));
    assert!(
        chains_of(&text, "filter")["INPUT"]
            .iter()
            .any(|r| r.ends_with(&["ACCEPT".to_owned()]))
    );
    assert!(dp.rules_intact().unwrap());

    dp.runner().take();
    let (again, took) = timed(&mut dp, &plan);
    assert_eq!(again.payload, "");
    assert_eq!(dp.runner().take(), Vec::<String>::new());
    println!("{backend:?} unchanged resync: {took:?}, nothing run");

    let mut restarted = dataplane(&ns, backend);
    let (report, took) = timed(&mut restarted, &plan);
    assert_eq!(report.payload, "");
    let ran = restarted.runner().take();
    assert!(ran.iter().all(|p| reads(p)), "{ran:?}");
    let dumps = ran.iter().filter(|p| *p == NFT_DUMP).count();
    assert_eq!(dumps > 0, backend == Backend::Nft, "{ran:?}");
    println!("{backend:?} restarted agent: read with {ran:?}, nothing sent, {took:?}");

    // Its periodic check of the untouched kernel reads each table of the family with
    // rules (IPv4: filter, nat) once, as a digest of the owned chains that matches: no
    // second, full read.
    let table_reads = |ran: &[String]| {
        ran.iter()
            .filter(|p| *p == NFT_DUMP || p.ends_with("-save"))
            .count()
    };
    assert!(restarted.rules_intact().unwrap());
    let checked = restarted.runner().take();
    assert_eq!(table_reads(&checked), 2, "{checked:?}");
    // A rule added to one owned chain: the digest differs, and a full read follows to
    // find the chain.
    iptables(
        &ns,
        backend,
        Family::V4,
        &format!("-t nat -A {} -j RETURN", names::SERVICES),
    );
    assert!(!restarted.rules_intact().unwrap());
    let checked = restarted.runner().take();
    assert_eq!(table_reads(&checked), 4, "{checked:?}");
}

/// An endpoint change rewrites exactly the service chain and the endpoint chains that
/// came and went.
fn endpoint_change_rewrites_only_those_chains(backend: Backend) {
    let Some(ns) = namespace(backend) else { return };
    add_foreign_rules(&ns, backend);
    let mut dp = dataplane(&ns, backend);
    let mut entries = small_cluster();
    dp.sync(&plan(entries.clone()), false).unwrap();
    let before = save(&ns, backend, Family::V4);

    let key = entries[0].key.clone();
    let removed = entries[0].cluster_endpoints.remove(0);
    let added = ep("10.244.3.10:8080");
    entries[0].cluster_endpoints.push(added.clone());
    let (report, took) = timed(&mut dp, &plan(entries));
    println!(
        "{backend:?} one endpoint change: {} bytes sent, {} chains, {took:?}",
        report.payload.len(),
        report.changed
    );
    let after = save(&ns, backend, Family::V4);
    assert_eq!(chains_of(&before, "filter"), chains_of(&after, "filter"));
    let (old, new) = (chains_of(&before, "nat"), chains_of(&after, "nat"));
    let names: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    let differing: BTreeSet<String> = names
        .into_iter()
        .filter(|n| old.get(*n) != new.get(*n))
        .cloned()
        .collect();
    assert_eq!(
        differing,
        BTreeSet::from([
            names::service(&key),
            names::endpoint(&key, &removed),
            names::endpoint(&key, &added),
        ])
    );
}

/// Flushing our chains by hand is noticed and repaired; so is a deleted canary.
fn canary_notices_flushed_rules(backend: Backend) {
    let Some(ns) = namespace(backend) else { return };
    let mut dp = dataplane(&ns, backend);
    let plan = plan(small_cluster());
    dp.sync(&plan, false).unwrap();
    let good = normalized(&save(&ns, backend, Family::V4));

    let held = chains_of(&save(&ns, backend, Family::V4), "nat");
    for chain in held.keys().filter(|c| names::is_owned(c)) {
        iptables(&ns, backend, Family::V4, &format!("-t nat -F {chain}"));
    }
    assert!(!dp.rules_intact().unwrap());
    let report = dp.sync(&plan, false).unwrap();
    assert!(!report.payload.contains("*filter"), "{}", report.payload);
    assert_eq!(normalized(&save(&ns, backend, Family::V4)), good);
    assert!(dp.rules_intact().unwrap());

    iptables(&ns, backend, Family::V4, &format!("-F {}", names::CANARY));
    iptables(&ns, backend, Family::V4, &format!("-X {}", names::CANARY));
    assert!(!dp.rules_intact().unwrap());
    let report = dp.sync(&plan, false).unwrap();
    assert_eq!(report.changed, 1, "{}", report.payload);
    assert_eq!(normalized(&save(&ns, backend, Family::V4)), good);
}

/// Deletes `rule` (as rendered: quoted words) from `table`'s `chain` by its spec.
fn delete_rule(ns: &Netns, backend: Backend, table: &str, chain: &str, rule: &str) {
    let binary = backend.binary(Family::V4, Tool::Iptables);
    let words = proxyplan_agent::kernel::iptables::split_words(rule);
    let mut args = vec![binary.as_str(), "-t", table, "-D", chain];
    args.extend(words.iter().map(String::as_str));
    ns.run(&args);
}

/// Each jump from a built-in chain, deleted by hand (someone else's rules stay), is
/// noticed by the periodic check and put back where it was by the next sync, which
/// writes nothing but that chain's jumps.
fn deleted_jumps_are_noticed_and_restored(backend: Backend) {
    let Some(ns) = namespace(backend) else { return };
    add_foreign_rules(&ns, backend);
    let mut dp = dataplane(&ns, backend);
    let plan = plan(small_cluster());
    dp.sync(&plan, false).unwrap();
    let good = normalized(&save(&ns, backend, Family::V4));
    let desired = render(&plan, &RenderSettings::default());
    let mut deleted = 0;
    for (table, rules) in [("nat", &desired.v4.nat), ("filter", &desired.v4.filter)] {
        for jump in &rules.base_jumps {
            delete_rule(&ns, backend, table, jump.chain, &jump.rule);
            assert_ne!(normalized(&save(&ns, backend, Family::V4)), good);
            assert!(
                !dp.rules_intact().unwrap(),
                "{table} {} jump {} deleted, not noticed",
                jump.chain,
                jump.rule
            );
            dp.runner().take();
            let report = dp.sync(&plan, false).unwrap();
            // Only that built-in chain's jumps are written (the ones after the gap again,
            // to keep their order), nothing else.
            let edits: Vec<&str> = report
                .payload
                .lines()
                .filter(|l| l.starts_with('-'))
                .collect();
            assert!(!edits.is_empty(), "{}", report.payload);
            assert!(
                edits
                    .iter()
                    .all(|l| l.split_whitespace().nth(1) == Some(jump.chain)),
                "{}",
                report.payload
            );
            assert!(
                report.payload.contains(&format!("*{table}\n")),
                "{}",
                report.payload
            );
            let restores = dp.runner().take();
            assert_eq!(
                restores.iter().filter(|p| !reads(p)).count(),
                1,
                "{restores:?}"
            );
            assert_eq!(normalized(&save(&ns, backend, Family::V4)), good);
            assert!(dp.rules_intact().unwrap());
            deleted += 1;
        }
    }
    assert!(deleted >= 4, "{deleted} jumps tried");
}

/// One owned chain flushed (a service chain, a fixed `PROXYPLAN-` chain in each table),
/// or given a rule by someone else, is noticed and only that chain is rewritten.
fn one_altered_chain_is_noticed_and_rewritten(backend: Backend) {
    let Some(ns) = namespace(backend) else { return };
    add_foreign_rules(&ns, backend);
    let mut dp = dataplane(&ns, backend);
    let entries = small_cluster();
    let plan = plan(entries.clone());
    dp.sync(&plan, false).unwrap();
    let good = normalized(&save(&ns, backend, Family::V4));
    let service = names::service(&entries[0].key);
    let endpoint = names::endpoint(&entries[0].key, &entries[0].cluster_endpoints[0]);
    let tampering = [
        format!("-t nat -F {service}"),
        format!("-t nat -F {endpoint}"),
        format!("-t nat -F {}", names::SERVICES),
        format!("-t nat -F {}", names::POSTROUTING),
        format!("-t filter -F {}", names::FORWARD),
        format!("-t nat -A {service} -j RETURN"),
        format!("-t nat -I {} 1 -j RETURN", names::SERVICES),
    ];
    for command in tampering {
        iptables(&ns, backend, Family::V4, &command);
        assert!(!dp.rules_intact().unwrap(), "{command}: not noticed");
        let report = dp.sync(&plan, false).unwrap();
        assert_eq!(report.changed, 1, "{command}: {}", report.payload);
        assert_eq!(
            normalized(&save(&ns, backend, Family::V4)),
            good,
            "{command}"
        );
        assert!(dp.rules_intact().unwrap(), "{command}");
    }
}

/// A restarted agent at 1,000 Services reads its rules back and runs no
/// `iptables-restore` at all (0 bytes, 0 lines); its first change after the restart
/// sends only the chains it changes, as the agent that wrote them would.
fn restart_sends_nothing_then_one_change_is_small(backend: Backend) {
    let Some(ns) = namespace(backend) else { return };
    let mut entries = many_services(1000, 10);
    let mut first = dataplane(&ns, backend);
    first.sync(&plan(entries.clone()), false).unwrap();
    let written = first.payload_sent();
    assert!(written.lines > 10_000, "{written:?}");
    drop(first);

    let mut restarted = dataplane(&ns, backend);
    let (report, took) = timed(&mut restarted, &plan(entries.clone()));
    let ran = restarted.runner().take();
    assert!(ran.iter().all(|p| reads(p)), "{ran:?}");
    assert_eq!(report.changed, 0, "{}", report.payload);
    assert_eq!(report.payload, "");
    assert_eq!(restarted.payload_sent(), PayloadSize::default());
    assert!(restarted.rules_intact().unwrap());
    println!(
        "{backend:?} restart at 1000 services: {took:?} ({}), 0 bytes sent",
        restarted.runner().take_times()
    );

    entries[500].cluster_endpoints[3] = ep("10.244.99.99:8080");
    let (report, took) = timed(&mut restarted, &plan(entries));
    let sent = restarted.payload_sent();
    let ran = restarted.runner().take();
    assert_eq!(report.changed, 3, "{}", report.payload);
    assert_eq!(ran.iter().filter(|p| !reads(p)).count(), 1, "{ran:?}");
    // The service chain (11 rules with its revision), two endpoint chains (one gone),
    // table headers and COMMIT: a few dozen lines of the 10,000s first written.
    assert!(sent.lines < 40, "{sent:?}:\n{}", report.payload);
    println!("{backend:?} first change after the restart: {sent:?}, {took:?}");
}

/// Cleanup leaves the kernel as it was before the first sync, both families.
fn cleanup_restores_the_kernel(backend: Backend) {
    let Some(ns) = namespace(backend) else { return };
    add_foreign_rules(&ns, backend);
    let before = [Family::V4, Family::V6].map(|f| normalized(&save(&ns, backend, f)));
    let mut dp = dataplane(&ns, backend);
    let mut entries = small_cluster();
    entries.push(service(
        "web6",
        "fd00:96::10",
        80,
        &["[fd00:10:244:1::10]:8080"],
    ));
    dp.sync(&plan(entries), false).unwrap();
    assert!(save(&ns, backend, Family::V6).contains(names::SERVICES));
    let report = dp.cleanup().unwrap();
    assert!(report.changed > 0);
    let after = [Family::V4, Family::V6].map(|f| normalized(&save(&ns, backend, f)));
    assert_eq!(after, before);
    assert_eq!(dp.cleanup().unwrap().payload, "");
    // A fresh agent finds nothing to clean either.
    assert_eq!(dataplane(&ns, backend).cleanup().unwrap().payload, "");
}

/// A family whose last service goes loses its jumps (by number) and chains; foreign
/// rules in the same built-in chains stay.
fn family_without_services_is_emptied(backend: Backend) {
    let Some(ns) = namespace(backend) else { return };
    add_foreign_rules(&ns, backend);
    let before = normalized(&save(&ns, backend, Family::V6));
    let mut dp = dataplane(&ns, backend);
    let mut entries = small_cluster();
    entries.push(service(
        "web6",
        "fd00:96::10",
        80,
        &["[fd00:10:244:1::10]:8080"],
    ));
    dp.sync(&plan(entries.clone()), false).unwrap();
    entries.pop();
    let report = dp.sync(&plan(entries), false).unwrap();
    assert!(
        report.payload.contains("-D PREROUTING 1\n"),
        "{}",
        report.payload
    );
    assert_eq!(normalized(&save(&ns, backend, Family::V6)), before);
}

/// A restore that fails (someone else started jumping to a chain the agent deletes)
/// leaves the model unset; the next sync reads the kernel, sees the reference, and only
/// flushes that chain.
fn failed_restore_heals_after_reread(backend: Backend) {
    let Some(ns) = namespace(backend) else { return };
    let mut dp = dataplane(&ns, backend);
    let mut entries = small_cluster();
    dp.sync(&plan(entries.clone()), false).unwrap();
    let key = entries[0].key.clone();
    let removed = entries[0].cluster_endpoints.remove(0);
    let sep = names::endpoint(&key, &removed);
    iptables(&ns, backend, Family::V4, "-t nat -N FOREIGN");
    iptables(
        &ns,
        backend,
        Family::V4,
        &format!("-t nat -A FOREIGN -j {sep}"),
    );

    let err = dp.sync(&plan(entries.clone()), false).unwrap_err();
    assert_eq!(err.label(), "tool_failed", "{err}");
    println!("{backend:?} restore failure reads: {err}");
    dp.runner().take();
    let report = dp.sync(&plan(entries.clone()), false).unwrap();
    assert!(
        dp.runner()
            .take()
            .iter()
            .any(|p| p.ends_with("-save") || p == NFT_DUMP)
    );
    assert!(
        !report.payload.contains(&format!("-X {sep}")),
        "{}",
        report.payload
    );
    let nat = chains_of(&save(&ns, backend, Family::V4), "nat");
    assert_eq!(nat[&sep], Vec::<Vec<String>>::new(), "flushed, kept");
    assert_eq!(dp.sync(&plan(entries), false).unwrap().payload, "");
}

macro_rules! for_both_backends {
    ($($check:ident => $nft:ident, $legacy:ident;)*) => {
        $(
            #[test]
            fn $nft() {
                $check(Backend::Nft);
            }

            #[test]
            fn $legacy() {
                $check(Backend::Legacy);
            }
        )*
    };
}

/// Whether the kernel holds the agent's rules is read from the kernel: an empty one (a
/// restarted agent over a flushed or new network namespace) holds none, even before the
/// agent programmed or read anything; after a sync it does; after cleanup, none again.
fn holds_rules_reads_the_kernel(backend: Backend) {
    let Some(ns) = namespace(backend) else { return };
    add_foreign_rules(&ns, backend);
    assert!(
        !dataplane(&ns, backend).holds_rules().unwrap(),
        "an agent that has done nothing yet must not claim rules on an empty kernel"
    );
    let mut dp = dataplane(&ns, backend);
    dp.sync(&plan(small_cluster()), false).unwrap();
    assert!(dataplane(&ns, backend).holds_rules().unwrap());
    dp.cleanup().unwrap();
    assert!(!dataplane(&ns, backend).holds_rules().unwrap());
    // A flushed nat table (a firewall reload) keeps the empty chains but no rule.
    dp.sync(&plan(small_cluster()), false).unwrap();
    for family in [Family::V4, Family::V6] {
        iptables(&ns, backend, family, "-t nat -F");
    }
    assert!(
        !dataplane(&ns, backend).holds_rules().unwrap(),
        "flushed rules are no rules"
    );
}

for_both_backends! {
    first_sync_then_nothing => nft_first_sync_then_nothing, legacy_first_sync_then_nothing;
    endpoint_change_rewrites_only_those_chains => nft_endpoint_change_rewrites_only_those_chains, legacy_endpoint_change_rewrites_only_those_chains;
    canary_notices_flushed_rules => nft_canary_notices_flushed_rules, legacy_canary_notices_flushed_rules;
    cleanup_restores_the_kernel => nft_cleanup_restores_the_kernel, legacy_cleanup_restores_the_kernel;
    family_without_services_is_emptied => nft_family_without_services_is_emptied, legacy_family_without_services_is_emptied;
    failed_restore_heals_after_reread => nft_failed_restore_heals_after_reread, legacy_failed_restore_heals_after_reread;
    deleted_jumps_are_noticed_and_restored => nft_deleted_jumps_are_noticed_and_restored, legacy_deleted_jumps_are_noticed_and_restored;
    one_altered_chain_is_noticed_and_rewritten => nft_one_altered_chain_is_noticed_and_rewritten, legacy_one_altered_chain_is_noticed_and_rewritten;
    restart_sends_nothing_then_one_change_is_small => nft_restart_sends_nothing_then_one_change_is_small, legacy_restart_sends_nothing_then_one_change_is_small;
    holds_rules_reads_the_kernel => nft_holds_rules_reads_the_kernel, legacy_holds_rules_reads_the_kernel;
    protocol_swap_on_the_same_port => nft_protocol_swap_on_the_same_port, legacy_protocol_swap_on_the_same_port;
}

fn conntrack_count(ns: &Netns) -> usize {
    ns.run(&["conntrack", "-L", "-p", "udp"]).lines().count()
}

#[test]
fn stale_udp_conntrack_entries_are_deleted() {
    let Some(ns) = namespace(Backend::Nft) else {
        return;
    };
    let dns = |eps: &[&str]| plan(vec![udp(service("dns", "10.96.0.53", 53, eps))]);
    // Agent start: an entry that was never DNATed is stale, one DNATed to the endpoint is not.
    support::insert_udp_flow(
        &ns,
        "10.0.0.1",
        "5000",
        "10.96.0.53",
        "53",
        "10.96.0.53",
        "53",
    );
    support::insert_udp_flow(
        &ns,
        "10.0.0.2",
        "5000",
        "10.96.0.53",
        "53",
        "10.244.1.53",
        "5353",
    );
    let mut dp = dataplane(&ns, Backend::Nft);
    let report = dp.sync(&dns(&["10.244.1.53:5353"]), false).unwrap();
    assert_eq!(report.conntrack_deleted, 1);
    assert_eq!(conntrack_count(&ns), 1);

    // The endpoint goes: its entry goes.
    let report = dp.sync(&dns(&[]), false).unwrap();
    assert_eq!(report.conntrack_deleted, 1);
    assert_eq!(conntrack_count(&ns), 0);

    // A client kept sending while there was no endpoint; an endpoint appears.
    support::insert_udp_flow(
        &ns,
        "10.0.0.3",
        "5000",
        "10.96.0.53",
        "53",
        "10.96.0.53",
        "53",
    );
    support::insert_udp_flow(
        &ns,
        "10.0.0.3",
        "5001",
        "10.96.0.99",
        "53",
        "10.96.0.99",
        "53",
    );
    let report = dp.sync(&dns(&["10.244.2.53:5353"]), false).unwrap();
    assert_eq!(report.conntrack_deleted, 1);
    assert_eq!(conntrack_count(&ns), 1, "the other address's entry stays");
}

#[test]
fn auto_detection_picks_the_back_end_with_rules() {
    let Some(ns) = namespace(Backend::Nft) else {
        return;
    };
    let runner = CommandRunner::in_netns(&ns.name);
    assert_eq!(Backend::resolve(BackendChoice::Auto, &runner), Backend::Nft);
    if !ns.try_run(&["iptables-legacy", "-A", "INPUT", "-j", "ACCEPT"]) {
        println!("SKIPPED (legacy part): iptables-legacy does not work in a namespace here");
        return;
    }
    assert_eq!(
        Backend::resolve(BackendChoice::Auto, &runner),
        Backend::Legacy
    );
    iptables(&ns, Backend::Nft, Family::V4, "-A INPUT -j ACCEPT");
    iptables(&ns, Backend::Nft, Family::V4, "-A INPUT -j ACCEPT");
    assert_eq!(Backend::resolve(BackendChoice::Auto, &runner), Backend::Nft);
}

#[test]
fn missing_binaries_inside_the_namespace_are_named() {
    let Some(ns) = namespace(Backend::Nft) else {
        return;
    };
    let runner = CommandRunner::in_netns(&ns.name);
    let err = runner
        .run("iptables-nosuch-restore", &[], None)
        .unwrap_err();
    assert!(
        matches!(&err, DataplaneError::MissingTool { tool, .. } if tool == "iptables-nosuch-restore"),
        "{err}"
    );
}

/// Sizes and timings at 1,000 services × 10 endpoints, printed (not asserted: budgets
/// belong to benchmarks).
#[test]
fn sync_sizes_and_timings_at_1000_services() {
    let Some(ns) = namespace(Backend::Nft) else {
        return;
    };
    let mut dp = dataplane(&ns, Backend::Nft);
    let mut entries = many_services(1000, 10);
    let (first, first_took) = timed(&mut dp, &plan(entries.clone()));
    let first_sent = dp.payload_sent();
    let first_tools = dp.runner().take_times();
    let (same, same_took) = timed(&mut dp, &plan(entries.clone()));
    assert_eq!(same.payload, "");
    entries[500].cluster_endpoints[3] = ep("10.244.99.99:8080");
    let (change, change_took) = timed(&mut dp, &plan(entries.clone()));
    let change_tools = dp.runner().take_times();
    assert_eq!(change.changed, 3);
    let mut restarted = dataplane(&ns, Backend::Nft);
    let (_, restart_took) = timed(&mut restarted, &plan(entries));
    let restart_tools = restarted.runner().take_times();
    println!(
        "1000 services x 10 endpoints, nft, in a netns:\n  first sync: {} rules, {} bytes / {} lines sent, {first_took:?} ({first_tools})\n  unchanged: {same_took:?}\n  one endpoint change: {} bytes / {} lines sent, {change_took:?} ({change_tools})\n  restarted agent (reads the kernel, sends nothing): {restart_took:?} ({restart_tools})",
        first.rules,
        first_sent.bytes,
        first_sent.lines,
        change.payload.len(),
        change.payload.lines().count(),
    );
}

/// A Service whose only port changes protocol on the same port number (the upstream
/// conformance spec "should serve endpoints on same port and different protocols": TCP
/// only, then UDP only, first without endpoints, then with): no TCP rule for the cluster
/// IP may stay.
fn protocol_swap_on_the_same_port(backend: Backend) {
    let Some(ns) = namespace(backend) else { return };
    let mut dp = dataplane(&ns, backend);
    let other = service("other", "10.96.0.99", 80, &["10.244.1.99:8080"]);
    let tcp = service("multi", "10.96.0.50", 80, &["10.244.1.50:80"]);
    dp.sync(&plan(vec![other.clone(), tcp]), false).unwrap();
    let mut udp_empty = udp(service("multi", "10.96.0.50", 80, &[]));
    udp_empty.key = "demo/multi:udp/UDP/IPv4".into();
    udp_empty.port_name = "udp".into();
    dp.sync(&plan(vec![other.clone(), udp_empty.clone()]), false)
        .unwrap();
    let mut udp_served = udp_empty.clone();
    udp_served.cluster_endpoints = vec![ep("10.244.1.50:80")];
    dp.sync(&plan(vec![other, udp_served]), false).unwrap();
    let nat = ns.run(&[&backend.binary(Family::V4, Tool::Save), "-t", "nat"]);
    let tcp_rules: Vec<&str> = nat
        .lines()
        .filter(|l| l.contains("10.96.0.50") && l.contains("-p tcp"))
        .collect();
    assert!(
        tcp_rules.is_empty(),
        "TCP rules left for a UDP-only Service: {tcp_rules:#?}\n{nat}"
    );
}
