//! The nftables mode against the real kernel, as root, each test in its own network
//! namespace: what the table holds (`nft list`), a restart that sends nothing, tamper
//! repair, cleanup that leaves other tables alone. Without root or `ip netns` every test
//! prints a SKIPPED line and passes. Real traffic is tested in `traffic.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use proxyplan_agent::dataplane::{ChangeAlarm, Dataplane, DataplaneError};
use proxyplan_agent::kernel::CommandRunner;
use proxyplan_agent::kernel::nftables::{
    ElementRef, NetlinkNft, NftKernel, Refusal, TableItem, Touched, Transaction,
};
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

/// [`NetlinkNft`] counting the table reads (the tamper check's read-backs) and the
/// elements of the transactions committed, failing the next commit when asked, and
/// running a probe of the kernel after each commit (what it returns is kept).
struct Counting {
    inner: NetlinkNft,
    reads: usize,
    elements: usize,
    fail_next_commit: bool,
    after_commit: Option<Box<dyn FnMut() -> Option<String>>>,
    probed: Vec<String>,
}

impl NftKernel for Counting {
    fn generation(&mut self) -> Result<u32, DataplaneError> {
        self.inner.generation()
    }

    fn read_table(
        &mut self,
        family: u8,
        name: &str,
        visit: &mut dyn FnMut(TableItem<'_>),
    ) -> Result<bool, DataplaneError> {
        self.reads += 1;
        self.inner.read_table(family, name, visit)
    }

    fn table_exists(&mut self, family: u8, name: &str) -> Result<bool, DataplaneError> {
        self.inner.table_exists(family, name)
    }

    fn read_elements(
        &mut self,
        family: u8,
        table: &str,
        set: &str,
        visit: &mut dyn FnMut(ElementRef<'_>),
    ) -> Result<(), DataplaneError> {
        self.inner.read_elements(family, table, set, visit)
    }

    fn check(&mut self, transaction: &mut Transaction) -> Result<Vec<Refusal>, DataplaneError> {
        self.inner.check(transaction)
    }

    fn commit(&mut self, transaction: &mut Transaction) -> Result<Vec<Refusal>, DataplaneError> {
        if std::mem::take(&mut self.fail_next_commit) {
            return Err(DataplaneError::Io {
                context: "nf_tables commit (injected)".to_owned(),
                source: std::io::Error::from(std::io::ErrorKind::BrokenPipe),
            });
        }
        self.elements += transaction.elements();
        let refusals = self.inner.commit(transaction)?;
        if let Some(found) = self.after_commit.as_mut().and_then(|probe| probe()) {
            self.probed.push(found);
        }
        Ok(refusals)
    }

    fn changed_by_others(
        &mut self,
        name: &str,
        generation: u32,
    ) -> Result<Option<Touched>, DataplaneError> {
        self.inner.changed_by_others(name, generation)
    }

    fn change_alarm(&mut self, name: &str) -> Option<Box<dyn ChangeAlarm>> {
        self.inner.change_alarm(name)
    }
}

/// A dataplane in `ns` over a [`Counting`] kernel handle.
fn counting_dataplane(ns: &Netns) -> NftablesDataplane<Counting, CommandRunner> {
    NftablesDataplane::new(
        NftablesSettings::default(),
        Counting {
            inner: NetlinkNft::in_netns(&ns.name).expect("netlink"),
            reads: 0,
            elements: 0,
            fail_next_commit: false,
            after_commit: None,
            probed: Vec::new(),
        },
        CommandRunner::in_netns(&ns.name),
    )
}

/// A change is applied from the state the last sync left, which the sync takes rather
/// than copies (megabytes at 250,000 endpoints). A sync whose commit fails leaves no
/// state: the next one reads the tables and puts them right, and the one after is
/// incremental again.
#[test]
fn a_failed_change_is_followed_by_a_read_then_incremental_changes() {
    let Some(ns) = netns() else { return };
    let mut dp = counting_dataplane(&ns);
    let before = special_cluster();
    dp.sync(&before, false).expect("sync");
    let list = || ns.run(&["nft", "list", "table", "ip", "proxyplan"]);
    let reads = dp.kernel().reads;

    let mut after = special_cluster();
    let sticky = after
        .service_ports
        .iter_mut()
        .find(|e| e.name == "sticky")
        .expect("the sticky Service");
    std::sync::Arc::make_mut(sticky).cluster_endpoints = vec![ep("10.244.3.10:8080")];
    dp.kernel().fail_next_commit = true;
    assert!(dp.sync(&after, false).is_err(), "the injected failure");
    assert!(!list().contains("10.244.3.10"), "nothing was committed");

    dp.sync(&after, false).expect("sync after the failure");
    assert_eq!(
        dp.kernel().reads,
        2 * reads,
        "the tables are read again, as by the first sync"
    );
    assert!(list().contains("10.244.3.10"), "{}", list());

    dp.sync(&before, false).expect("back");
    assert_eq!(dp.kernel().reads, 2 * reads, "then changes are incremental");
    assert!(!list().contains("10.244.3.10"), "{}", list());
    let fresh = {
        let mut fresh = dataplane(&ns);
        fresh.sync(&before, false).expect("a fresh agent's sync");
        fresh.sent()
    };
    assert_eq!(fresh.0, 0, "a fresh agent finds nothing to change");
}

/// Other people's commits to other tables (a CNI plugin's iptables-nft rules, another
/// proxy, a firewall) move the ruleset's generation; once the agent listens to nf_tables'
/// announcements they cost the tamper check no read-back of the table (0.7 to 0.9 s at
/// 10,000 Services, with changes waiting behind it). A change to the agent's own table by
/// someone else is still noticed, and repaired (without a read either: see
/// `what_others_touched_is_rewritten_without_reading_the_table`).
#[test]
fn others_commits_elsewhere_cost_no_read_back() {
    let Some(ns) = netns() else { return };
    let mut dp = counting_dataplane(&ns);
    dp.sync(&special_cluster(), false).expect("sync");
    ns.run(&["nft", "add", "table", "inet", "someone-else"]);
    // The first time, nothing was listening yet: the table is read.
    assert!(dp.rules_intact().expect("check"));
    let reads = dp.kernel().reads;
    assert!(
        reads > 0,
        "the first check after a foreign commit reads the table"
    );
    for chain in ["a", "b", "c"] {
        ns.run(&["nft", "add", "chain", "inet", "someone-else", chain]);
        assert!(dp.rules_intact().expect("check"));
    }
    assert_eq!(
        dp.kernel().reads,
        reads,
        "commits to another table made the check read"
    );
    ns.run(&["nft", "flush", "chain", "ip", "proxyplan", "services"]);
    assert!(
        !dp.rules_intact().expect("check"),
        "a flushed chain went unnoticed"
    );
    dp.sync(&special_cluster(), false).expect("repair");
    assert!(dp.rules_intact().expect("check"));
}

/// The change alarm (what wakes the agent's tamper check between its intervals) goes off
/// as soon as someone else commits to the agent's table — a chain flushed, the table
/// deleted — and never for the agent's own commits or another table's: the check runs
/// when there is something to repair, not a second later.
#[test]
fn the_change_alarm_goes_off_only_when_someone_else_changes_the_table() {
    use std::time::{Duration, Instant};
    let Some(ns) = netns() else { return };
    let mut dp = dataplane(&ns);
    let mut alarm = dp.change_alarm().expect("nf_tables announces its commits");
    let quiet = Some(Duration::from_millis(300));
    dp.sync(&special_cluster(), false).expect("sync");
    assert!(
        !alarm.wait(quiet).expect("wait"),
        "the agent's own first sync set it off"
    );
    let mut fewer = special_cluster();
    fewer.service_ports.retain(|e| !e.key.contains("sticky"));
    dp.sync(&fewer, false).expect("change");
    assert!(
        !alarm.wait(quiet).expect("wait"),
        "the agent's own change set it off"
    );
    let synced = sorted_lines(&ns.run(&["nft", "list", "table", "ip", "proxyplan"]));
    ns.run(&["nft", "add", "table", "inet", "someone-else"]);
    ns.run(&["nft", "add", "chain", "inet", "someone-else", "a"]);
    assert!(
        !alarm.wait(quiet).expect("wait"),
        "a commit to another table set it off"
    );
    for tamper in [
        &["nft", "flush", "chain", "ip", "proxyplan", "services"][..],
        &["nft", "delete", "table", "ip", "proxyplan"][..],
    ] {
        let done = Instant::now();
        ns.run(tamper);
        assert!(
            alarm.wait(Some(Duration::from_secs(10))).expect("wait"),
            "{tamper:?} did not set it off"
        );
        println!(
            "{tamper:?}: went off {:?} after the command started",
            done.elapsed()
        );
        // The check that finds the change also sends the repair, from the same read.
        assert!(!dp.rules_intact().expect("check"), "{tamper:?} went unseen");
        assert_eq!(
            sorted_lines(&ns.run(&["nft", "list", "table", "ip", "proxyplan"])),
            synced,
            "{tamper:?} was not repaired by the check"
        );
        assert!(
            !alarm.wait(quiet).expect("wait"),
            "the agent's own repair set it off"
        );
        assert!(dp.rules_intact().expect("check"));
    }
}

/// What someone else touched in the agent's table, as nf_tables' announcements name it
/// (a chain flushed or given a rule, a map flushed, an element deleted, added or
/// replaced, in either family), is rewritten from the last plan without reading the
/// table: a flushed chain
/// that every Service shares is back in one small transaction, not after a read of the
/// whole table (0.75 s at 10,000 Services, while its Services have no rules). A change
/// the announcements cannot scope (a chain made in the table) is still read, and
/// repaired from the read.
#[test]
fn what_others_touched_is_rewritten_without_reading_the_table() {
    let Some(ns) = netns() else { return };
    let mut dp = counting_dataplane(&ns);
    dp.sync(&special_cluster(), false).expect("sync");
    // Listening starts with the first check.
    assert!(dp.rules_intact().expect("check"));
    let list = |family: &str| ns.run(&["nft", "list", "table", family, "proxyplan"]);
    let (synced4, synced6) = (list("ip"), list("ip6"));
    let named = |prefix: &str| {
        synced4
            .lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .map(ToOwned::to_owned)
            .unwrap_or_else(|| panic!("no {prefix:?} in\n{synced4}"))
    };
    let shared = named("chain lb-");
    let shared = format!("lb-{shared}");
    let endpoints = named("map endpoints-");
    let endpoints = format!("endpoints-{endpoints}");
    // The shared chains' own maps: web's and api's endpoints.
    let backends = named("map backends-tcp-");
    let backends = format!("backends-tcp-{backends}");
    let reads = dp.kernel().reads;
    let tampers: Vec<Vec<String>> = [
        "flush chain ip proxyplan services",
        &format!("flush chain ip proxyplan {shared}"),
        "insert rule ip proxyplan nat-prerouting counter drop",
        "flush map ip proxyplan service-ips",
        "delete element ip proxyplan service-ips { 10.96.0.60 . tcp . 80 }",
        "add element ip proxyplan service-ips { 10.96.0.99 . tcp . 80 : drop }",
        "delete element ip proxyplan service-ips { 10.96.0.60 . tcp . 80 }; \
         add element ip proxyplan service-ips { 10.96.0.60 . tcp . 80 : drop }",
        "delete element ip proxyplan cluster-ips { 10.96.0.60 }",
        &format!("flush map ip proxyplan {endpoints}"),
        &format!("flush map ip proxyplan {backends}"),
        &format!("delete element ip proxyplan {backends} {{ 10.96.0.10 . 80 . 1 }}"),
        "flush chain ip6 proxyplan services",
        "flush chain ip proxyplan services; flush set ip proxyplan cluster-ips; \
         flush chain ip6 proxyplan nat-output",
    ]
    .iter()
    .map(|t| t.split(' ').map(ToOwned::to_owned).collect())
    .collect();
    for tamper in &tampers {
        dp.kernel().elements = 0;
        let mut command = vec!["nft"];
        command.extend(tamper.iter().map(String::as_str));
        ns.run(&command);
        assert_ne!(
            (sorted_lines(&list("ip")), sorted_lines(&list("ip6"))),
            (sorted_lines(&synced4), sorted_lines(&synced6)),
            "{tamper:?} changed nothing"
        );
        assert!(!dp.rules_intact().expect("check"), "{tamper:?} went unseen");
        assert_eq!(
            sorted_lines(&list("ip")),
            sorted_lines(&synced4),
            "{tamper:?}: ip table not rewritten"
        );
        assert_eq!(
            sorted_lines(&list("ip6")),
            sorted_lines(&synced6),
            "{tamper:?}: ip6 table not rewritten"
        );
        assert_eq!(
            dp.kernel().reads,
            reads,
            "{tamper:?}: the repair read the table"
        );
        assert!(
            dp.rules_intact().expect("check"),
            "{tamper:?}: the rewrite did not hold"
        );
        // One Service's element is one element sent back (a replaced one: deleted, then
        // added), not its whole map. A shared chain's endpoints map is rewritten whole:
        // its own elements only (web's and api's 4), not every Service's endpoints.
        let elements = dp.kernel().elements;
        println!("{tamper:?}: {elements} element(s) sent");
        if tamper.contains(&backends) {
            assert_eq!(elements, 4, "{tamper:?}: {elements} elements sent");
            continue;
        }
        match tamper.iter().filter(|w| *w == "element").count() {
            1 => assert!(elements <= 1, "{tamper:?}: {elements} elements sent"),
            2 => assert_eq!(elements, 2, "{tamper:?}: {elements} elements sent"),
            _ => {}
        }
    }
    // A chain made in the agent's table: nothing names what to rewrite; read, repaired.
    ns.run(&["nft", "add", "chain", "ip", "proxyplan", "someone-elses"]);
    assert!(!dp.rules_intact().expect("check"));
    assert!(dp.kernel().reads > reads, "an unscoped change was not read");
    assert_eq!(sorted_lines(&list("ip")), sorted_lines(&synced4));
    assert!(dp.rules_intact().expect("check"));
}

/// `nft list` output, line by line in order (elements of a map are printed in the order
/// the kernel keeps them, which a repair may change).
fn sorted_lines(listing: &str) -> Vec<String> {
    let mut lines: Vec<String> = listing
        .lines()
        .flat_map(|l| l.split(", "))
        .map(|l| l.trim().trim_end_matches(',').to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    lines.sort();
    lines
}

/// A removed ClientIP-affinity Service leaves nothing behind after one sync. Its chains
/// and maps are deleted in a transaction of their own after the main one; chains were
/// deleted before maps there, which the kernel refused (`EBUSY`: the Service's slots map
/// names its endpoint chains) at every sync, so they stayed for ever, and the refusal
/// also left the tamper check without a generation to compare, answering "intact"
/// without asking.
#[test]
fn a_removed_affinity_service_leaves_nothing_behind() {
    let Some(ns) = netns() else { return };
    let mut dp = dataplane(&ns);
    dp.sync(&special_cluster(), false).expect("sync");
    assert!(
        ns.run(&["nft", "list", "table", "ip", "proxyplan"])
            .contains("sticky")
    );
    let mut fewer = special_cluster();
    fewer.service_ports.retain(|e| !e.key.contains("sticky"));
    dp.sync(&fewer, false).expect("the Service removed");
    let listed = ns.run(&["nft", "list", "table", "ip", "proxyplan"]);
    assert!(!listed.contains("sticky"), "left behind:\n{listed}");
    ns.run(&["nft", "flush", "chain", "ip", "proxyplan", "services"]);
    assert!(
        !dp.rules_intact().expect("check"),
        "the tamper check did not look after the removal"
    );
    assert!(dp.rules_intact().expect("check"));
}

/// A Service whose endpoint count changes goes to the shared chain of its new count,
/// and its endpoints to that chain's own maps (a rule added over a map is checked by
/// nf_tables against every element the map holds: over one map shared by all Services,
/// a chain made for a new count walked them all). What the changes leave is what one
/// sync of the final plan makes in an empty namespace; nothing of the old count stays,
/// and a restart sends nothing.
#[test]
fn a_new_endpoint_count_moves_the_endpoints_to_its_chains_own_maps() {
    let Some(ns) = netns() else { return };
    let Some(fresh) = netns() else { return };
    let list = |ns: &Netns| ns.run(&["nft", "list", "table", "ip", "proxyplan"]);
    let with_web = |endpoints: &[&str]| {
        let mut plan = special_cluster();
        for entry in &mut plan.service_ports {
            if entry.name == "web" {
                *entry = service("web", "10.96.0.10", 80, endpoints).into();
            }
        }
        plan
    };
    let mut dp = dataplane(&ns);
    dp.sync(&special_cluster(), false).expect("sync");
    let three = with_web(&["10.244.1.10:8080", "10.244.2.10:8080", "10.244.3.10:8080"]);
    dp.sync(&three, false).expect("web to three endpoints");
    let listed = list(&ns);
    for wanted in [
        "10.96.0.10 . tcp . 80 : goto lb-3-masq-nonlocal",
        "map backends-tcp-3-masq-nonlocal",
        "10.96.0.10 . 80 . 2 : 10.244.3.10 . 8080",
        "numgen random mod 3 map @backends-tcp-3-masq-nonlocal",
    ] {
        assert!(listed.contains(wanted), "no {wanted:?} in\n{listed}");
    }
    // api still has two endpoints: lb-2's maps stay, without web's.
    assert!(!listed.contains("10.96.0.10 . 80 . 0 : 10.244.1.10 . 8080, 10.96.0.10 . 80 . 1"));
    dataplane(&fresh).sync(&three, false).expect("fresh sync");
    assert_eq!(sorted_lines(&listed), sorted_lines(&list(&fresh)));

    // Back to one endpoint: lb-3 and its maps go, lb-1's come.
    let one = with_web(&["10.244.1.10:8080"]);
    dp.sync(&one, false).expect("web to one endpoint");
    let listed = list(&ns);
    assert!(
        !listed.contains("-3-"),
        "the count of 3 left behind:\n{listed}"
    );
    let mut again = dataplane(&ns);
    assert_eq!(again.sync(&one, false).expect("restart").payload, "");
    assert_eq!(again.sent(), (0, 0));
    let Some(fresh) = netns() else { return };
    dataplane(&fresh).sync(&one, false).expect("fresh sync");
    assert_eq!(sorted_lines(&listed), sorted_lines(&list(&fresh)));
}

/// A table written by an agent that looked every Service's endpoints up in one map per
/// protocol (`backends-tcp`, before each shared chain had maps of its own) is brought
/// to this agent's layout: the same table as one sync makes in an empty namespace, the
/// old maps deleted. With 6,000 Services the sync takes several transactions; after
/// each, the map their shared chain looks up holds the endpoints of the first Service
/// and of the last (the new maps are filled before the chains' rules are rewritten to
/// look them up), so traffic keeps its endpoints throughout.
#[test]
fn a_table_with_one_map_per_protocol_is_brought_to_maps_per_chain() {
    let Some(ns) = netns() else { return };
    let Some(old) = netns() else { return };
    let list = |ns: &Netns| ns.run(&["nft", "list", "table", "ip", "proxyplan"]);
    let mut plan = special_cluster();
    plan.service_ports
        .extend(support::many_services(6_000, 2).into_iter().map(Into::into));
    dataplane(&ns).sync(&plan, false).expect("sync");
    let new = list(&ns);
    // The previous layout: the shared chains' maps renamed to one per protocol.
    let mut previous = new.clone();
    for (from, to) in [
        ("nodeport-backends-tcp-2-masq", "nodeport-backends-tcp"),
        ("nodeport-backends-udp-2-masq", "nodeport-backends-udp"),
        ("nodeport-backends-sctp-2-masq", "nodeport-backends-sctp"),
        ("backends-tcp-2-masq-nonlocal", "backends-tcp"),
        ("backends-udp-2-masq-nonlocal", "backends-udp"),
        ("backends-sctp-2-masq-nonlocal", "backends-sctp"),
    ] {
        previous = previous.replace(from, to);
    }
    assert!(previous.contains("map @backends-tcp\n"), "{previous}");
    let file = std::env::temp_dir().join(format!("proxyplan-previous-{}.nft", std::process::id()));
    std::fs::write(&file, &previous).expect("write the previous table");
    old.run(&["nft", "-f", file.to_str().expect("utf-8 path")]);
    let _ = std::fs::remove_file(&file);
    assert!(list(&old).contains("map backends-tcp {"));

    let mut dp = counting_dataplane(&old);
    let name = old.name.clone();
    let mut commits = 0;
    dp.kernel().after_commit = Some(Box::new(move || {
        commits += 1;
        let nft = |args: &[&str]| {
            std::process::Command::new("ip")
                .args(["netns", "exec", &name, "nft"])
                .args(args)
                .output()
                .expect("nft")
        };
        let chain = nft(&["list", "chain", "ip", "proxyplan", "lb-2-masq-nonlocal"]);
        let chain = String::from_utf8_lossy(&chain.stdout).into_owned();
        let Some(map) = chain
            .lines()
            .find(|l| l.contains("tcp dport"))
            .and_then(|l| l.split("map @").nth(1))
            .map(str::trim)
        else {
            return Some(format!("after commit {commits}: no tcp rule in\n{chain}"));
        };
        // web's endpoints are written first, the last Service's last.
        ["{ 10.96.0.10 . 80 . 0 }", "{ 10.96.23.250 . 80 . 1 }"]
            .into_iter()
            .find(|key| !nft(&["get", "element", "ip", "proxyplan", map, key]).status.success())
            .map(|key| {
                format!("after commit {commits}: lb-2-masq-nonlocal looks {key} up in {map}, which lacks it")
            })
    }));
    dp.sync(&plan, false)
        .expect("sync over the previous layout");
    let transactions = dp.sent().1;
    assert!(
        transactions > 2,
        "one transaction proves no order: {transactions}"
    );
    assert_eq!(dp.kernel().probed, Vec::<String>::new());
    assert_eq!(sorted_lines(&list(&old)), sorted_lines(&new));
    let mut again = dataplane(&old);
    assert_eq!(again.sync(&plan, false).expect("restart").payload, "");
}

/// `--mode auto` asks the kernel to check one of each object and expression the
/// nftables mode writes: this kernel takes them all, and nothing is left behind. (When a
/// shared chain's rules first looked up maps of their own, the probe did not declare
/// them: the kernel refused, and every `--mode auto` agent fell back to iptables mode.)
#[test]
fn the_auto_mode_probe_passes_on_this_kernel_and_leaves_nothing() {
    let Some(ns) = netns() else { return };
    let mut kernel = NetlinkNft::in_netns(&ns.name).expect("netlink");
    assert_eq!(proxyplan_agent::modes::nftables::probe(&mut kernel), Ok(()));
    assert_eq!(ns.run(&["nft", "list", "ruleset"]).trim(), "");
}
