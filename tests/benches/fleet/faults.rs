//! The fleet bench's soak (issue: an hour of churn and faults): faults injected at random
//! while the churn runs, overlapping, each one followed, on the kernels (read by the
//! checker, not from the agents), until every node it touched has recovered: for every
//! Service it holds the state acknowledged before the fault was lifted, or a newer one,
//! so nothing the fault held back is left; then until every such node agrees with every
//! Service's newest state at once (writes less than a second old aside), which under
//! steady churn also waits for a moment when no node is more than a second behind. Probes
//! from pod namespaces go to Services that never lose their endpoints, and the
//! processes' resources are sampled every minute.
//!
//! What a fault is and how it heals:
//! - `agent-kill`: SIGKILL of an agent, started again after 1–10 s (a DaemonSet's backoff);
//! - `controller-kill`: SIGKILL of the leader of two replicas, started again after 1–5 s;
//! - `controller-stop`: SIGSTOP of the leader for 5–40 s (past its 15 s lease), SIGCONT;
//! - `apiserver-restart`: kube-apiserver stopped for 1–20 s, started again;
//! - `etcd-restart`: SIGKILL of etcd, started again with the same arguments after 1–5 s;
//! - `partition`: the node's connection to the API server dropped for 1–120 s (an
//!   nftables table of the bench's own per partition, in the node's namespace, drops port
//!   6443 both ways);
//! - `tamper-element`: one Service's element deleted from the agent's `service-ips` map;
//! - `tamper-chain`: one of the agent's chains flushed, at random (base chains too);
//! - `tamper-rule`: a foreign rule inserted that lets one Service's packets skip DNAT;
//!   for each tamper, the time from `nft`'s exit until the table holds again what was
//!   taken is read back over netlink every 5 ms (the checker's `nft` reads take about a
//!   second a node, too coarse for a repair the agent makes in milliseconds);
//! - `state-dir`: the agent's state directory removed under it;
//! - `clock-step`: the agent's wall clock stepped 1–60 minutes forward for 5–60 s, then
//!   back to true time (a step back as large). A time namespace cannot step
//!   `CLOCK_REALTIME`, and stepping the machine's would step the API server's, etcd's and
//!   every lease holder's too; so each agent runs under libfaketime (Debian's `faketime`
//!   package), which shifts that one process's wall clock from a file it reads at every
//!   read of that clock, and leaves its monotonic clock alone, as a real step does. The agent's own
//!   `/livez` `currentTime` confirms each step. Without the library the kind is left out,
//!   with a line saying so.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::api::Api;
use proxyplan_tests::control_plane::ControlPlane;

use super::procs::{self, Spawned};
use super::{Fleet, Rng, now};

/// Every fault kind, in the order the tables list them.
pub const KINDS: [&str; 11] = [
    "agent-kill",
    "controller-kill",
    "controller-stop",
    "apiserver-restart",
    "etcd-restart",
    "partition",
    "tamper-element",
    "tamper-chain",
    "tamper-rule",
    "state-dir",
    "clock-step",
];

/// Where Debian's `faketime` package puts the library that shifts one process's wall
/// clock.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Sets the offset in `clock`: written whole, then renamed into place, so that the agent
/// never reads half a step.
pub fn set_clock(clock: &std::path::Path, offset: &str) {
    let next = clock.with_extension("next");
    std::fs::write(&next, offset).unwrap();
    std::fs::rename(&next, clock).unwrap();
}

/// Runs `command` under libfaketime, its wall clock offset by what `clock` holds (`+0`,
/// `+37m`), read at every read of the wall clock (libfaketime's cache would miss a step
/// back until the stepped clock passed the cache's expiry); its monotonic clock, which
/// the agent's timers use, is left alone and costs nothing more.
pub fn with_clock(command: &mut Command, clock: &std::path::Path) {
    command
        .env("LD_PRELOAD", LIBFAKETIME)
        .env("FAKETIME_TIMESTAMP_FILE", clock)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
}

/// Which nodes a fault touched: one, or every one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Node(usize),
    All,
}

/// One fault: what, where, when it was injected and lifted, and how long after it was
/// lifted every node it touched had recovered (`None`: not within 300 s, which would
/// need a human).
#[derive(Debug, Clone)]
pub struct Injected {
    pub kind: &'static str,
    pub scope: Scope,
    pub detail: String,
    pub injected: f64,
    pub lifted: f64,
    /// Until every node it touched held, for every Service, the state acknowledged before
    /// the lift or a newer one: nothing the fault held back is left.
    pub recovered: Option<f64>,
    /// Until every node it touched agreed with every Service's newest state at once
    /// (writes less than a second old aside): under steady churn this also waits for a
    /// moment when no node is more than a second behind anywhere.
    pub settled: Option<f64>,
    /// Another fault touched the same node while this one was followed: its time
    /// includes that one's.
    pub overlapped: bool,
    /// Nodes left out of a fault on every node because another fault had them then (that
    /// fault follows them).
    pub left_to_others: usize,
    /// A tamper: seconds from the `nft` command's exit until the node's table held again
    /// what was taken (read back over netlink every few milliseconds); `None` when not
    /// within 30 s or nothing was taken.
    pub repaired: Option<f64>,
}

/// What a tamper takes from an agent's table, to time its repair: one Service's element
/// of `service-ips`, or the rules of a chain (a flushed chain; `nat-prerouting`, where a
/// foreign rule is inserted).
#[derive(Debug, Clone)]
pub enum Mark {
    Element(std::net::Ipv4Addr),
    Rules(String),
}

impl Mark {
    /// How many of it the table holds now (elements with the Service's key; the chain's
    /// rules), read over netlink in namespace `netns`: a few milliseconds, where an `nft`
    /// listing takes half a second here. Rules come from a dump of the rules alone, read
    /// again when a commit interrupted it: a read of the whole table (elements and all)
    /// was interrupted over and over while the agents caught up after a burst, and a
    /// repaired chain went unseen for 30 s.
    pub fn count(&self, netns: &str) -> Option<usize> {
        use proxyplan_agent::kernel::nftables::objects::{Rule, dump_request, split};
        use proxyplan_agent::kernel::nftables::uapi::{NFPROTO_IPV4, NFT_MSG_GETRULE};
        use proxyplan_agent::kernel::nftables::{NetlinkNft, NftKernel, NftNetlink};
        let mut n = 0;
        match self {
            // The key `ip . inet_proto . inet_service`, each in a 4-byte register.
            Self::Element(vip) => NetlinkNft::in_netns(netns)
                .ok()?
                .read_elements(NFPROTO_IPV4, "proxyplan", "service-ips", &mut |e| {
                    if e.key.len() >= 10
                        && e.key[..4] == vip.octets()
                        && e.key[4] == 6
                        && e.key[8..10] == 80u16.to_be_bytes()
                    {
                        n += 1;
                    }
                })
                .ok()?,
            Self::Rules(chain) => {
                let path = std::path::Path::new("/run/netns").join(netns);
                let mut socket =
                    proxyplan_agent::kernel::namespace::in_namespace(&path, NftNetlink::open)
                        .ok()?;
                for _ in 0..20 {
                    n = 0;
                    let request = dump_request(NFT_MSG_GETRULE, NFPROTO_IPV4, "proxyplan");
                    let read = socket.dump(request, &mut |message| {
                        let Ok((_, family, body)) = split(message) else {
                            return Ok(());
                        };
                        if let Ok(rule) = Rule::decode(family, body)
                            && rule.table == "proxyplan"
                            && rule.chain == *chain
                        {
                            n += 1;
                        }
                        Ok(())
                    });
                    match read {
                        Ok(()) => return Some(n),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => return None,
                    }
                }
                return None;
            }
        }
        Some(n)
    }

    /// Seconds until the table holds `before` of it again (any rules again, for a flushed
    /// chain the churn may also change), polled every 5 ms for up to 30 s.
    pub fn restored(&self, netns: &str, before: usize) -> Option<f64> {
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            let now = self.count(netns);
            let back = match (self, now) {
                (_, None) => false,
                (Self::Rules(chain), Some(n)) if chain != "nat-prerouting" => n > 0,
                (_, Some(n)) => n == before,
            };
            if back {
                return Some(started.elapsed().as_secs_f64());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }
}

/// A process the soak may kill and start again, and how to start it.
pub struct Restartable {
    pub process: Mutex<Option<Spawned>>,
    pub command: Box<dyn Fn() -> (Command, PathBuf) + Send + Sync>,
    pub label: String,
    /// Set while the soak itself has it down: an exit then is no defect.
    pub down: AtomicBool,
}

impl Restartable {
    pub fn start(
        label: String,
        command: Box<dyn Fn() -> (Command, PathBuf) + Send + Sync>,
    ) -> Self {
        let this = Self {
            process: Mutex::new(None),
            command,
            label,
            down: AtomicBool::new(false),
        };
        this.respawn();
        this
    }

    pub fn respawn(&self) {
        let (mut command, log) = (self.command)();
        let spawned = Spawned::start(&self.label, &mut command, log, false).unwrap();
        *self.process.lock().unwrap() = Some(spawned);
    }

    pub fn pid(&self) -> u32 {
        self.process
            .lock()
            .unwrap()
            .as_ref()
            .map_or(0, |p| p.child.id())
    }

    pub fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status();
    }

    /// SIGKILL, reaped.
    pub fn kill(&self) {
        if let Some(p) = self.process.lock().unwrap().as_mut() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }

    /// `Some(why)` when it exited and the soak did not take it down.
    pub fn died(&self) -> Option<String> {
        if self.down.load(Ordering::SeqCst) {
            return None;
        }
        self.process
            .lock()
            .unwrap()
            .as_mut()
            .and_then(Spawned::exited)
    }

    pub async fn stop(&self) {
        let taken = self.process.lock().unwrap().take();
        if let Some(mut p) = taken {
            p.stop().await;
        }
    }
}

/// Everything the faults act on.
pub struct Soak {
    pub agents: Vec<Arc<Restartable>>,
    pub controllers: Vec<Arc<Restartable>>,
    pub netnses: Vec<String>,
    pub state_dirs: Vec<PathBuf>,
    /// Each agent's wall clock offset file (see [`with_clock`]); empty without libfaketime.
    pub clocks: Vec<PathBuf>,
    pub plane: Arc<ControlPlane>,
    pub client: Client,
    pub namespace: String,
    pub fleet: Arc<Mutex<Fleet>>,
    pub checked: Arc<Mutex<super::Checked>>,
    /// Faults in progress or recovering, per node (`usize::MAX`: every node).
    pub disturbed: Arc<Mutex<HashMap<usize, usize>>>,
    pub log: Mutex<Vec<Injected>>,
    /// One fault at a time per node's agent process, per controller pair, per control
    /// plane.
    pub node_locks: Vec<tokio::sync::Mutex<()>>,
    pub controller_lock: tokio::sync::Mutex<()>,
    pub plane_lock: tokio::sync::Mutex<()>,
}

/// The key of [`Soak::disturbed`] for every node.
pub const ALL: usize = usize::MAX;

impl Soak {
    /// Whether a fault touches node `k` now (the checker does not count it as behind).
    pub fn is_disturbed(disturbed: &Mutex<HashMap<usize, usize>>, k: usize) -> bool {
        let d = disturbed.lock().unwrap();
        d.get(&k).is_some_and(|n| *n > 0) || d.get(&ALL).is_some_and(|n| *n > 0)
    }

    /// Whether a fault other than the caller's (of `scope`) touches node `k` now.
    fn others_on(&self, k: usize, scope: Scope) -> bool {
        let d = self.disturbed.lock().unwrap();
        let (node, all) = (
            d.get(&k).copied().unwrap_or(0),
            d.get(&ALL).copied().unwrap_or(0),
        );
        match scope {
            Scope::Node(_) => node > 1 || all > 0,
            Scope::All => node > 0 || all > 1,
        }
    }

    fn disturb(&self, scope: Scope, by: isize) {
        let key = match scope {
            Scope::Node(k) => k,
            Scope::All => ALL,
        };
        let mut d = self.disturbed.lock().unwrap();
        let n = d.entry(key).or_default();
        *n = n.saturating_add_signed(by);
    }

    /// The leader's index among the controllers, from the Lease.
    async fn leader(&self) -> Option<usize> {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let lease = leases.get("proxyplan-controller").await.ok()?;
        let holder = lease.spec?.holder_identity?;
        self.controllers.iter().position(|c| c.label == holder)
    }

    /// `args` run in node `k`'s namespace, off the runtime's threads.
    async fn netns_run(&self, k: usize, args: &[&str]) -> Result<String, String> {
        let mut all = vec![
            "netns".to_owned(),
            "exec".to_owned(),
            self.netnses[k].clone(),
        ];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        tokio::task::spawn_blocking(move || {
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            procs::run("ip", &all)
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// Injects one fault of `kind`, lifts it, and follows the nodes it touched until they
    /// match their semantics again.
    pub async fn inject(self: Arc<Self>, kind: &'static str, seed: u64) {
        let mut rng = Rng(seed | 1);
        let agents = self.agents.len();
        let k = rng.below(agents);
        let mut scope = Scope::Node(k);
        let mut detail = super::node_name(k);
        let guard_node;
        let guard_controller;
        let guard_plane;
        match kind {
            "agent-kill" | "state-dir" | "clock-step" => {
                guard_node = Some(self.node_locks[k].lock().await)
            }
            _ => guard_node = None,
        }
        match kind {
            "controller-kill" | "controller-stop" => {
                guard_controller = Some(self.controller_lock.lock().await);
                scope = Scope::All;
            }
            _ => guard_controller = None,
        }
        match kind {
            "apiserver-restart" | "etcd-restart" => {
                guard_plane = Some(self.plane_lock.lock().await);
                scope = Scope::All;
            }
            _ => guard_plane = None,
        }
        self.disturb(scope, 1);
        let injected = now();
        // The Service a tamper hit: it must read back right, even while a write of it is
        // in flight.
        let mut tampered = None;
        // A tamper's own repair, read back over netlink: seconds from nft's exit.
        let mut repaired = None;
        println!("fleet bench: fault {kind} on {scope:?}");
        match kind {
            "agent-kill" => {
                let agent = &self.agents[k];
                agent.down.store(true, Ordering::SeqCst);
                agent.kill();
                let backoff = 1.0 + rng.below(9_000) as f64 / 1e3;
                detail = format!("{detail}, started again after {backoff:.1} s");
                tokio::time::sleep(Duration::from_secs_f64(backoff)).await;
                agent.respawn();
                agent.down.store(false, Ordering::SeqCst);
            }
            "controller-kill" | "controller-stop" => {
                let Some(leader) = self.leader().await else {
                    // No leader in the Lease (one is being chosen): nothing done.
                    self.disturb(scope, -1);
                    return;
                };
                let c = &self.controllers[leader];
                if kind == "controller-kill" {
                    c.down.store(true, Ordering::SeqCst);
                    c.kill();
                    let backoff = 1.0 + rng.below(4_000) as f64 / 1e3;
                    detail = format!("{} killed, started again after {backoff:.1} s", c.label);
                    tokio::time::sleep(Duration::from_secs_f64(backoff)).await;
                    c.respawn();
                    c.down.store(false, Ordering::SeqCst);
                } else {
                    let pause = 5.0 + rng.below(35_000) as f64 / 1e3;
                    detail = format!("{} stopped for {pause:.1} s", c.label);
                    c.signal("STOP");
                    tokio::time::sleep(Duration::from_secs_f64(pause)).await;
                    c.signal("CONT");
                }
            }
            "apiserver-restart" => {
                let pause = 1.0 + rng.below(19_000) as f64 / 1e3;
                detail = format!("down for {pause:.1} s");
                let plane = self.plane.clone();
                tokio::task::spawn_blocking(move || plane.stop_apiserver())
                    .await
                    .unwrap()
                    .unwrap();
                tokio::time::sleep(Duration::from_secs_f64(pause)).await;
                let plane = self.plane.clone();
                tokio::task::spawn_blocking(move || plane.start_apiserver())
                    .await
                    .unwrap()
                    .unwrap();
            }
            "etcd-restart" => {
                let pause = 1.0 + rng.below(4_000) as f64 / 1e3;
                detail = format!("killed, started again after {pause:.1} s");
                let dir = self.plane.dir().to_path_buf();
                restart_etcd(&dir, Duration::from_secs_f64(pause)).await;
            }
            "partition" => {
                let cut = 1.0 + rng.below(119_000) as f64 / 1e3;
                // A table per partition: two on one node overlap, each lifts its own.
                let cut_table = format!("fleetcut{}", rng.below(1 << 30));
                detail = format!("{detail} cut off for {cut:.1} s");
                self.netns_run(k, &["nft", &format!("add table inet {cut_table}")])
                    .await
                    .unwrap();
                self.netns_run(
                    k,
                    &[
                        "nft",
                        &format!("add chain inet {cut_table} out {{ type filter hook output priority -300; }}"),
                    ],
                )
                .await
                .unwrap();
                self.netns_run(
                    k,
                    &[
                        "nft",
                        &format!("add rule inet {cut_table} out tcp dport 6443 drop"),
                    ],
                )
                .await
                .unwrap();
                self.netns_run(
                    k,
                    &[
                        "nft",
                        &format!("add rule inet {cut_table} out tcp sport 6443 drop"),
                    ],
                )
                .await
                .unwrap();
                tokio::time::sleep(Duration::from_secs_f64(cut)).await;
                self.netns_run(k, &["nft", &format!("delete table inet {cut_table}")])
                    .await
                    .unwrap();
            }
            "tamper-element" | "tamper-chain" | "tamper-rule" => {
                let (name, vip) = {
                    let fleet = self.fleet.lock().unwrap();
                    // A Service whose ClusterIP is known (a burst's are not yet).
                    let known: Vec<usize> = (0..fleet.services.len())
                        .filter(|s| !fleet.services[*s].vip.is_unspecified())
                        .collect();
                    let s = known[rng.below(known.len())];
                    if kind != "tamper-chain" {
                        tampered = Some(s);
                    }
                    (fleet.services[s].name.clone(), fleet.services[s].vip)
                };
                let chain = if kind == "tamper-chain" {
                    self.some_chain(k, rng.below(1 << 20)).await
                } else {
                    None
                };
                let mark = match kind {
                    "tamper-element" => Some(Mark::Element(vip)),
                    "tamper-rule" => Some(Mark::Rules("nat-prerouting".to_owned())),
                    _ => chain.clone().map(Mark::Rules),
                };
                let netns = self.netnses[k].clone();
                let before = match mark {
                    Some(mark) => {
                        let netns = netns.clone();
                        tokio::task::spawn_blocking(move || mark.count(&netns).map(|n| (mark, n)))
                            .await
                            .ok()
                            .flatten()
                    }
                    None => None,
                };
                let done = match kind {
                    "tamper-element" => self.netns_run(
                        k,
                        &[
                            "nft",
                            &format!("delete element ip proxyplan service-ips {{ {vip} . tcp . 80 }}"),
                        ],
                    )
                    .await,
                    "tamper-rule" => self.netns_run(
                        k,
                        &[
                            "nft",
                            &format!(
                                "insert rule ip proxyplan nat-prerouting ip daddr {vip} tcp dport 80 accept"
                            ),
                        ],
                    )
                    .await,
                    _ => match &chain {
                        Some(chain) => {
                            self.netns_run(
                                k,
                                &["nft", &format!("flush chain ip proxyplan {chain}")],
                            )
                            .await
                        }
                        None => Err("no chain to flush".to_owned()),
                    },
                };
                if done.is_ok()
                    && let Some((mark, before)) = before
                    // Nothing there to take away: nothing to repair.
                    && before > 0
                {
                    repaired = tokio::task::spawn_blocking(move || mark.restored(&netns, before))
                        .await
                        .ok()
                        .flatten();
                }
                detail = match done {
                    Ok(_) => format!(
                        "{detail}: {}; {}",
                        chain.unwrap_or(name),
                        repaired.map_or("not repaired within 30 s".to_owned(), |r| format!(
                            "repaired {:.0} ms after nft returned (read back over netlink)",
                            r * 1e3
                        ))
                    ),
                    // The Service had no element or chain there (no endpoints): nothing
                    // was changed, which the recovery time shows as 0.
                    Err(e) => format!("{detail}: {name} not tampered ({e})"),
                };
            }
            "state-dir" => {
                let _ = std::fs::remove_dir_all(&self.state_dirs[k]);
            }
            "clock-step" => {
                let minutes = 1 + rng.below(60);
                let hold = 5.0 + rng.below(55_000) as f64 / 1e3;
                let clock = &self.clocks[k];
                set_clock(clock, &format!("+{minutes}m"));
                // (The agent reads its wall clock at its next status or metric.)
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                let shown = self.wall_clock_offset(k).await;
                tokio::time::sleep(Duration::from_secs_f64(hold)).await;
                set_clock(clock, "+0");
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                let back = self.wall_clock_offset(k).await;
                detail = format!(
                    "{detail}: clock +{minutes} min for {hold:.0} s, then back (the agent's \
                     /livez said {shown}, then {back})"
                );
            }
            other => panic!("unknown fault {other}"),
        }
        let lifted = now();
        drop((guard_node, guard_controller, guard_plane));
        let (recovered, settled, overlapped, left_to_others) =
            self.until_settled(scope, lifted, tampered).await;
        self.disturb(scope, -1);
        println!(
            "fleet bench: fault {kind} on {scope:?} ({detail}) lifted after {:.1} s, nodes \
             recovered {}, at every Service's newest state {}",
            lifted - injected,
            recovered.map_or("NEVER (300 s)".to_owned(), |r| format!("{r:.2} s later")),
            settled.map_or("not within 300 s".to_owned(), |r| format!("{r:.2} s later"))
        );
        self.log.lock().unwrap().push(Injected {
            kind,
            scope,
            detail,
            injected,
            lifted,
            recovered,
            settled,
            overlapped,
            left_to_others,
            repaired,
        });
    }

    /// How far node `k`'s agent's wall clock is from true time, by its own `/livez`
    /// `currentTime` (`+2220 s`), or why that could not be read.
    async fn wall_clock_offset(&self, k: usize) -> String {
        let body = match self
            .netns_run(
                k,
                &["curl", "-s", "-m", "5", "http://127.0.0.1:10256/livez"],
            )
            .await
        {
            Ok(body) => body,
            Err(e) => return format!("no /livez ({e})"),
        };
        let shown = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| {
                v["currentTime"]
                    .as_str()?
                    .parse::<k8s_openapi::jiff::Timestamp>()
                    .ok()
            });
        match shown {
            Some(t) => format!(
                "{:+} s",
                t.as_second() - k8s_openapi::jiff::Timestamp::now().as_second()
            ),
            None => format!("no currentTime in /livez ({body})"),
        }
    }

    /// One of the chains in node `k`'s table, at random (base chains included: a flush
    /// by hand hits whatever it hits).
    async fn some_chain(&self, k: usize, pick: usize) -> Option<String> {
        let text = self
            .netns_run(k, &["nft", "-j", "list", "chains", "ip"])
            .await
            .ok()?;
        let json: serde_json::Value = serde_json::from_str(&text).ok()?;
        let chains: Vec<String> = json["nftables"]
            .as_array()?
            .iter()
            .filter(|o| o["chain"]["table"] == "proxyplan")
            .filter_map(|o| Some(o["chain"]["name"].as_str()?.to_owned()))
            .collect();
        chains.get(pick % chains.len().max(1)).cloned()
    }

    /// Seconds from `lifted` until every node in `scope` read back matching its semantics
    /// (differences only on Services still in flight), or `None` after 300 s; whether
    /// another fault touched a node meanwhile; and how many nodes of a fault on every
    /// node were left to another fault that had them.
    async fn until_settled(
        &self,
        scope: Scope,
        lifted: f64,
        must_agree: Option<usize>,
    ) -> (Option<f64>, Option<f64>, bool, usize) {
        let nodes: Vec<usize> = match scope {
            Scope::Node(k) => vec![k],
            Scope::All => (0..self.agents.len()).collect(),
        };
        // First every node recovered, then every node settled: each phase's time is the
        // last node's, from the lift.
        let mut times: [Option<f64>; 2] = [Some(0.0), Some(0.0)];
        let (mut overlapped, mut left) = (false, 0);
        let mut told = false;
        for phase in 0..2 {
            for &k in &nodes {
                loop {
                    let on_node = self.disturbed.lock().unwrap().get(&k).copied().unwrap_or(0);
                    if scope == Scope::All && on_node > 0 {
                        // Another fault has this node: that one follows it.
                        left += usize::from(phase == 0);
                        break;
                    }
                    overlapped |= self.others_on(k, scope);
                    let read = now();
                    let found = super::check_node(
                        k,
                        &self.netnses[k],
                        &self.fleet,
                        &self.checked,
                        false,
                        must_agree,
                        Some(lifted),
                    )
                    .await;
                    if [found.caught_up, found.settled][phase] {
                        times[phase] = times[phase].map(|t| t.max(read - lifted).max(0.0));
                        break;
                    }
                    if phase == 1 && now() - lifted > 60.0 && !told {
                        // Why it does not settle: the oldest open differences on this
                        // node that are not in flight.
                        told = true;
                        let checked = self.checked.lock().unwrap();
                        let mut open: Vec<(f64, &String)> = checked
                            .open
                            .iter()
                            .filter(|((node, _), _)| *node == k)
                            .filter_map(|(key, since)| Some((*since, checked.open_why.get(key)?)))
                            .filter(|(_, why)| !why.contains("(in flight true"))
                            .collect();
                        open.sort_by(|a, b| a.0.total_cmp(&b.0));
                        for (since, why) in open.iter().take(3) {
                            println!(
                                "fleet bench: not settled 60 s after lifting, open since \
                                 {:.1} s: {why}",
                                now() - since
                            );
                        }
                    }
                    if now() - lifted > 300.0 {
                        times[phase] = None;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        (times[0], times[1], overlapped, left)
    }
}

/// SIGKILL of etcd, and the same command started again after `pause`.
async fn restart_etcd(dir: &std::path::Path, pause: Duration) {
    let pid_file = dir.join("etcd.pid");
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // NUL-terminated arguments, empty ones included (`--listen-metrics-urls ""`).
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let argv: Vec<String> = cmdline
        .strip_suffix(&[0])
        .unwrap_or(&cmdline)
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    for _ in 0..100 {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(pause).await;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("logs/etcd.log"))
        .unwrap();
    let child = {
        use std::os::unix::process::CommandExt;
        Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap()
    };
    std::fs::write(&pid_file, child.id().to_string()).unwrap();
    // Reaped when it exits (killed by the next restart, or by the control plane's `down`,
    // which finds it by its pid file).
    let mut child = child;
    std::thread::spawn(move || child.wait());
}

/// A backend every probe node serves for the stable Services: a listener on
/// `0.0.0.0:port` inside `netns` (its addresses are on the namespace's `lo`).
pub fn serve(netns: &str, port: u16) {
    let path = format!("/run/netns/{netns}");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("netns");
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let listener = TcpListener::bind(("0.0.0.0", port)).expect("backend listener");
        let _ = ready_tx.send(());
        for stream in listener.incoming() {
            drop(stream);
        }
    });
    let _ = ready_rx.recv_timeout(Duration::from_secs(5));
}

/// Probe results: attempts, and every failure (when, from which node, to which Service,
/// why).
#[derive(Default)]
pub struct Probes {
    pub attempts: u64,
    pub failures: Vec<(f64, usize, String, String)>,
}

/// Opens a connection from pod namespace `pod_netns` (on node `k`) to each `(name, vip)`
/// every 200 ms until `stop`, with a 1 s timeout.
pub fn probe(
    pod_netns: &str,
    k: usize,
    targets: Vec<(String, Ipv4Addr)>,
    probes: Arc<Mutex<Probes>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let path = format!("/run/netns/{pod_netns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("netns");
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        while !stop.load(Ordering::Relaxed) {
            for (name, vip) in &targets {
                let at = now();
                let result = TcpStream::connect_timeout(
                    &SocketAddrV4::new(*vip, 80).into(),
                    Duration::from_secs(1),
                );
                let mut p = probes.lock().unwrap();
                p.attempts += 1;
                if let Err(e) = result {
                    p.failures.push((at, k, name.clone(), e.to_string()));
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })
}

/// One minute's resource sample of a process: resident memory (KiB), open files, of them
/// sockets, and threads.
#[derive(Debug, Clone, Copy, Default)]
pub struct Resources {
    pub rss_kib: u64,
    pub fds: usize,
    pub sockets: usize,
    pub threads: u64,
}

pub fn resources(pid: u32) -> Resources {
    let (mut fds, mut sockets) = (0, 0);
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for entry in dir.flatten() {
            fds += 1;
            if std::fs::read_link(entry.path())
                .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
            {
                sockets += 1;
            }
        }
    }
    Resources {
        rss_kib: super::status_kib(pid, "VmRSS"),
        fds,
        sockets,
        threads: super::status_kib(pid, "Threads"),
    }
}
