//! A lab for traffic tests: throwaway network namespaces wired as a small cluster, with
//! `socat` backends that say who served a connection and which source they saw, and
//! bounded `socat` clients.
//!
//! ```text
//!  ext                        node (the agent's rules)                remote (another node)
//!  10.10.0.100, .101 ──veth── 10.10.0.1     10.10.1.1     ──veth──    10.10.1.2
//!  fd00:10:10::100            fd00:10:10::1 fd00:10:11::1             fd00:10:11::2
//!                               │ 10.244.1.1, fd00:10:244:1::1          │ 10.244.2.1, ...:2::1
//!                               │ on each pod veth                      │ on each pod veth
//!                             a1 10.244.1.10, a2 .11, a3 .12          r1 10.244.2.10, r2 .11
//!                             (fd00:10:244:1::10, ::11, ::12)         (fd00:10:244:2::10, ::11)
//! ```
//!
//! Pods have a /32 (/128) address and a default route through the node's address on their
//! veth, as CNI plugins do; the node routes 10.244.2.0/24 through `remote`. `ext` (an
//! off-cluster client) routes everything through the node, and the node's default route
//! points back at `ext`, which does not forward: traffic nobody captures disappears
//! silently, as it would towards the internet.
//!
//! Every namespace is named `pp-lab-<pid>-<n>-<role>` and deleted on drop (also when a test
//! panics), after the processes the lab started in it are ended.

#![allow(dead_code, reason = "each test uses a different part")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::IpAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use proxyplan_agent::dataplane::Dataplane;
use proxyplan_agent::kernel::ipvs::NetlinkKernel;
use proxyplan_agent::kernel::{Backend, BackendChoice, CommandRunner, Family, Tool};
use proxyplan_agent::modes::iptables::{IptablesDataplane, RenderSettings};
use proxyplan_agent::modes::ipvs::{IpvsDataplane, IpvsSettings};
use proxyplan_agent::run::ProxyMode;

/// The node's address towards `ext`.
pub const NODE_V4: &str = "10.10.0.1";
/// The node's IPv6 address towards `ext`.
pub const NODE_V6: &str = "fd00:10:10::1";
/// The node's address on every local pod's veth (what hairpin traffic is masqueraded to).
pub const NODE_POD_GW_V4: &str = "10.244.1.1";
/// The same for IPv6.
pub const NODE_POD_GW_V6: &str = "fd00:10:244:1::1";
/// The node's address towards `remote` (what traffic masqueraded to remote pods shows).
pub const NODE_TO_REMOTE_V4: &str = "10.10.1.1";
/// The same for IPv6.
pub const NODE_TO_REMOTE_V6: &str = "fd00:10:11::1";
/// The off-cluster client.
pub const EXT_V4: &str = "10.10.0.100";
/// A second address of the off-cluster client.
pub const EXT2_V4: &str = "10.10.0.101";
/// The off-cluster client's IPv6 address.
pub const EXT_V6: &str = "fd00:10:10::100";

/// A pod of the lab: `a1`..`a3` live on the node, `r1`, `r2` on the remote node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    /// `a1`, `r2`, ...
    pub name: String,
    /// Whether it lives on the node running the agent's rules.
    pub local: bool,
    /// Its IPv4 address.
    pub v4: String,
    /// Its IPv6 address.
    pub v6: String,
}

impl Pod {
    /// The roster: `a<n>` → 10.244.1.(9+n), `r<n>` → 10.244.2.(9+n).
    fn named(name: &str) -> Self {
        let (local, subnet) = match name.as_bytes().first() {
            Some(b'a') => (true, 1),
            Some(b'r') => (false, 2),
            _ => panic!("pod names are a<n> (local) or r<n> (remote), not {name}"),
        };
        let n: u8 = name[1..].parse().expect("pod number");
        assert!((1..=9).contains(&n), "pod number 1..=9: {name}");
        Self {
            name: name.to_owned(),
            local,
            v4: format!("10.244.{subnet}.{}", 9 + n),
            v6: format!("fd00:10:244:{subnet}::{}", 9 + n),
        }
    }

    /// Its address of `family`.
    #[must_use]
    pub fn ip(&self, family: Family) -> &str {
        match family {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }
}

/// What a backend server does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// TCP: answers `<pod>/<port> <peer address>` and closes.
    Tcp,
    /// UDP: answers each datagram with `<pod>/<port> <peer address>`.
    Udp,
    /// TCP: echoes every line back, for long-lived sessions.
    Echo,
}

/// What a client got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A backend answered.
    Served {
        /// `<pod>/<port>` of the backend.
        backend: String,
        /// The source address the backend saw.
        source: IpAddr,
    },
    /// Connection refused (TCP RST or ICMP port unreachable).
    Refused,
    /// No answer within the client's time limit.
    TimedOut,
    /// Anything else, with what the client printed.
    Failed(String),
}

impl Outcome {
    /// The backend that answered, if any.
    #[must_use]
    pub fn backend(&self) -> Option<&str> {
        match self {
            Self::Served { backend, .. } => Some(backend),
            _ => None,
        }
    }

    /// The source the backend saw, if any.
    #[must_use]
    pub fn source(&self) -> Option<IpAddr> {
        match self {
            Self::Served { source, .. } => Some(*source),
            _ => None,
        }
    }
}

/// Runs `program` and returns its output, or panics saying what failed.
fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program} {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Why the lab cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next());
    if uid != Some("0") {
        return Some("traffic tests need root (network namespaces)".into());
    }
    for (tool, probe) in [
        ("ip", "-V"),
        ("socat", "-V"),
        ("ss", "-V"),
        ("conntrack", "--version"),
        ("iptables-nft", "--version"),
    ] {
        if Command::new(tool)
            .arg(probe)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_err()
        {
            // Root but a tool missing is a broken test machine, not a reason to skip:
            // `.ci/run` installs every one of them (and the VM step passes them in).
            panic!(
                "{tool} is not installed: the traffic tests need ip, socat, ss, conntrack and \
                 iptables-nft (`bash .ci/run` installs them)"
            );
        }
    }
    None
}

/// The proxy mode the traffic tests exercise: `PROXYPLAN_TEST_MODE=ipvs` (set when they
/// run inside the VM of `shared/vm`, whose kernel has IPVS) or iptables.
#[must_use]
pub fn mode_under_test() -> ProxyMode {
    match std::env::var("PROXYPLAN_TEST_MODE").as_deref() {
        Ok("ipvs") => ProxyMode::Ipvs,
        _ => ProxyMode::Iptables,
    }
}

static LABS: AtomicUsize = AtomicUsize::new(0);

/// The lab: namespaces, links, routes and the backend servers started in it.
pub struct Lab {
    prefix: String,
    /// Namespaces created so far (deleted on drop, last first).
    namespaces: Vec<String>,
    pods: Vec<Pod>,
    servers: Mutex<Vec<Child>>,
}

impl Lab {
    /// A lab with the named pods (`a1`..`a3` local, `r1`, `r2` remote), or `None` and a
    /// `SKIPPED:` line when this machine cannot run it. Panics when setup fails.
    #[must_use]
    pub fn new(pods: &[&str]) -> Option<Self> {
        if let Some(reason) = unavailable() {
            println!("SKIPPED: {reason}");
            return None;
        }
        let mut lab = Self {
            prefix: format!(
                "pp-lab-{}-{}",
                std::process::id(),
                LABS.fetch_add(1, Ordering::Relaxed)
            ),
            namespaces: Vec::new(),
            pods: pods.iter().map(|p| Pod::named(p)).collect(),
            servers: Mutex::new(Vec::new()),
        };
        lab.build();
        Some(lab)
    }

    /// The full name of a namespace by role: `node`, `ext`, `remote` or a pod name.
    #[must_use]
    pub fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    /// A pod by name.
    #[must_use]
    pub fn pod(&self, name: &str) -> &Pod {
        self.pods
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pod {name} in this lab"))
    }

    fn add_ns(&mut self, role: &str) {
        let name = self.ns(role);
        // Concurrent first uses of /run/netns can race; one retry covers it.
        let ok = (0..3).any(|attempt| {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(50));
            }
            Command::new("ip")
                .args(["netns", "add", &name])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        assert!(ok, "ip netns add {name} failed");
        self.namespaces.push(name.clone());
        self.ip(role, "link set lo up");
        // No duplicate address detection: IPv6 addresses are usable at once.
        self.sysctl(
            role,
            &[
                "net.ipv6.conf.all.accept_dad=0",
                "net.ipv6.conf.default.accept_dad=0",
            ],
        );
    }

    /// `ip -n <ns> <args>`.
    fn ip(&self, role: &str, args: &str) {
        let ns = self.ns(role);
        let mut command = vec!["-n", ns.as_str()];
        command.extend(args.split_whitespace());
        run("ip", &command);
    }

    fn sysctl(&self, role: &str, settings: &[&str]) {
        let ns = self.ns(role);
        let mut argv = vec!["netns", "exec", ns.as_str(), "sysctl", "-qw"];
        argv.extend_from_slice(settings);
        run("ip", &argv);
    }

    /// A veth from `a` (named `a_if`) to `b` (named `b_if`), both up.
    fn veth(&self, a: &str, a_if: &str, b: &str, b_if: &str) {
        self.ip(
            a,
            &format!(
                "link add {a_if} type veth peer name {b_if} netns {}",
                self.ns(b)
            ),
        );
        self.ip(a, &format!("link set {a_if} up"));
        self.ip(b, &format!("link set {b_if} up"));
    }

    fn build(&mut self) {
        let forwarding = ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"];
        // The node forwards what nobody captures back towards ext: no ICMP redirects
        // about that, so ext's routes stay as set up here.
        let no_redirects = [
            "net.ipv4.conf.all.send_redirects=0",
            "net.ipv4.conf.default.send_redirects=0",
        ];
        self.add_ns("node");
        self.sysctl("node", &forwarding);
        self.sysctl("node", &no_redirects);
        self.add_ns("ext");
        self.veth("node", "ext0", "ext", "eth0");
        self.ip("node", &format!("addr add {NODE_V4}/24 dev ext0"));
        self.ip("node", &format!("addr add {NODE_V6}/64 dev ext0 nodad"));
        self.ip("ext", &format!("addr add {EXT_V4}/24 dev eth0"));
        self.ip("ext", &format!("addr add {EXT2_V4}/24 dev eth0"));
        self.ip("ext", &format!("addr add {EXT_V6}/64 dev eth0 nodad"));
        self.ip("ext", &format!("route add default via {NODE_V4}"));
        self.ip("ext", &format!("-6 route add default via {NODE_V6}"));
        self.ip("node", &format!("route add default via {EXT_V4}"));
        self.ip("node", &format!("-6 route add default via {EXT_V6}"));

        let remote = self.pods.iter().any(|p| !p.local);
        if remote {
            self.add_ns("remote");
            self.sysctl("remote", &forwarding);
            self.veth("node", "rem0", "remote", "up0");
            self.ip("node", &format!("addr add {NODE_TO_REMOTE_V4}/24 dev rem0"));
            self.ip(
                "node",
                &format!("addr add {NODE_TO_REMOTE_V6}/64 dev rem0 nodad"),
            );
            self.ip("remote", "addr add 10.10.1.2/24 dev up0");
            self.ip("remote", "addr add fd00:10:11::2/64 dev up0 nodad");
            self.ip(
                "remote",
                &format!("route add default via {NODE_TO_REMOTE_V4}"),
            );
            self.ip(
                "remote",
                &format!("-6 route add default via {NODE_TO_REMOTE_V6}"),
            );
            self.ip("node", "route add 10.244.2.0/24 via 10.10.1.2");
            self.ip("node", "-6 route add fd00:10:244:2::/64 via fd00:10:11::2");
        }
        for pod in self.pods.clone() {
            let (host, subnet) = if pod.local {
                ("node", 1)
            } else {
                ("remote", 2)
            };
            let (gw4, gw6) = (
                format!("10.244.{subnet}.1"),
                format!("fd00:10:244:{subnet}::1"),
            );
            let name = &pod.name;
            self.add_ns(name);
            let host_if = format!("p{name}");
            self.veth(host, &host_if, name, "eth0");
            self.ip(host, &format!("addr add {gw4}/32 dev {host_if}"));
            self.ip(host, &format!("addr add {gw6}/128 dev {host_if} nodad"));
            self.ip(host, &format!("route add {}/32 dev {host_if}", pod.v4));
            self.ip(host, &format!("-6 route add {}/128 dev {host_if}", pod.v6));
            self.ip(name, &format!("addr add {}/32 dev eth0", pod.v4));
            self.ip(name, &format!("addr add {}/128 dev eth0 nodad", pod.v6));
            self.ip(name, &format!("route add {gw4} dev eth0"));
            self.ip(name, &format!("route add default via {gw4}"));
            self.ip(name, &format!("-6 route add {gw6} dev eth0"));
            self.ip(name, &format!("-6 route add default via {gw6}"));
        }
    }

    /// The agent's dataplane for the node in the mode under test
    /// ([`mode_under_test`]): iptables (nft back end) or ipvs.
    #[must_use]
    pub fn dataplane(&self) -> Box<dyn Dataplane + Send> {
        match mode_under_test() {
            ProxyMode::Iptables => Box::new(self.dataplane_with(Backend::Nft)),
            ProxyMode::Ipvs => {
                let node = self.ns("node");
                let kernel = NetlinkKernel::in_netns(&node)
                    .unwrap_or_else(|e| panic!("netlink in {node}: {e}"));
                Box::new(IpvsDataplane::new(
                    IpvsSettings::default(),
                    kernel,
                    CommandRunner::in_netns(&node),
                    BackendChoice::Nft,
                ))
            }
        }
    }

    /// The agent's iptables dataplane for the node with `backend`.
    #[must_use]
    pub fn dataplane_with(&self, backend: Backend) -> IptablesDataplane<CommandRunner> {
        IptablesDataplane::new(
            RenderSettings::default(),
            CommandRunner::in_netns(&self.ns("node")),
            backend,
        )
    }

    /// Runs a command in a namespace and returns its output; panics on failure.
    pub fn exec(&self, role: &str, argv: &[&str]) -> String {
        let ns = self.ns(role);
        let mut command = vec!["netns", "exec", ns.as_str()];
        command.extend_from_slice(argv);
        run("ip", &command)
    }

    /// The node's `iptables-save` of `family` with `backend`, without comments and with
    /// counters zeroed.
    #[must_use]
    pub fn node_rules(&self, backend: Backend, family: Family) -> String {
        self.exec("node", &[&backend.binary(family, Tool::Save)])
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| match l.find(" [") {
                Some(i) if l.starts_with(':') => format!("{} [0:0]", &l[..i]),
                _ => l.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Starts a backend in `pod` on `port` of `family` and waits until it listens.
    pub fn serve(&self, pod: &str, family: Family, listener: Listener, port: u16) {
        let ip = self.pod(pod).ip(family).to_owned();
        self.serve_at(pod, &ip, listener, port);
    }

    /// Starts a server in the namespace of `role` on `ip:port` and waits until it
    /// listens; it answers as `<role>/<port>`.
    pub fn serve_at(&self, role: &str, ip: &str, listener: Listener, port: u16) {
        let v6 = ip.contains(':');
        let kind = match (listener, v6) {
            (Listener::Tcp | Listener::Echo, false) => "TCP-LISTEN",
            (Listener::Tcp | Listener::Echo, true) => "TCP6-LISTEN",
            (Listener::Udp, false) => "UDP-RECVFROM",
            (Listener::Udp, true) => "UDP6-RECVFROM",
        };
        let bind = bracketed(ip);
        let mut local = format!("{kind}:{port},fork,bind={bind}");
        if listener != Listener::Udp {
            local.push_str(",reuseaddr");
        }
        // `:` and `,` would end socat's address; the label uses `/`. The UDP answer
        // reads the datagram first: socat fails with EPIPE, and answers nothing, when the
        // command has exited before it could hand the datagram over.
        let answer = format!("echo {role}/{port} $SOCAT_PEERADDR");
        let action = match listener {
            Listener::Tcp => format!("SYSTEM:{answer}"),
            Listener::Udp => format!("SYSTEM:read datagram; {answer}"),
            Listener::Echo => "EXEC:cat".to_owned(),
        };
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns(role), "socat", &local, &action])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn socat server");
        self.servers.lock().expect("servers").push(child);
        let shown = format!("{bind}:{port} ");
        // A dual-stack wildcard listener (`::`) shows as `*:PORT`.
        let wildcard = (ip == "::").then(|| format!("*:{port} "));
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let listening = self.exec(role, &["ss", "-Hlntu"]);
            if listening.contains(&shown)
                || wildcard.as_ref().is_some_and(|w| listening.contains(w))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{role}: no listener on {shown} after 5 s:\n{listening}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A client in a namespace (`ext`, `node` or a pod).
    #[must_use]
    pub fn client(&self, role: &str) -> Client<'_> {
        Client {
            lab: self,
            role: role.to_owned(),
            bind: None,
            source_port: None,
            limit: Duration::from_secs(2),
        }
    }

    /// A long-lived TCP session from `role` to `addr:port` (an [`Listener::Echo`] server).
    #[must_use]
    pub fn session(&self, role: &str, addr: &str, port: u16) -> Session {
        let target = format!("TCP:{}:{port},connect-timeout=3", bracketed(addr));
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns(role), "socat", "STDIO", &target])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn socat session");
        let stdin = child.stdin.take().expect("stdin");
        let lines = read_lines(child.stdout.take().expect("stdout"));
        Session {
            child,
            stdin,
            lines,
        }
    }

    fn end_processes(&mut self) {
        for mut server in self
            .servers
            .get_mut()
            .map(std::mem::take)
            .unwrap_or_default()
        {
            let _ = server.kill();
            let _ = server.wait();
        }
        // Whatever is left in our namespaces (forked socat children) was started by us.
        for ns in &self.namespaces {
            let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else {
                continue;
            };
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill")
                    .args(["-KILL", pid])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.end_processes();
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// `[v6]` or `v4`, as socat wants addresses.
fn bracketed(addr: &str) -> String {
    if addr.contains(':') {
        format!("[{addr}]")
    } else {
        addr.to_owned()
    }
}

/// A thread that forwards each line of `out` (without the newline) until EOF.
fn read_lines(out: impl Read + Send + 'static) -> Receiver<String> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if send.send(line).is_err() {
                break;
            }
        }
    });
    receive
}

/// A bounded client: `socat` in a namespace, killed when its time is up.
pub struct Client<'a> {
    lab: &'a Lab,
    role: String,
    bind: Option<String>,
    source_port: Option<u16>,
    limit: Duration,
}

impl Client<'_> {
    /// Sends from this local address.
    #[must_use]
    pub fn bind(mut self, addr: &str) -> Self {
        self.bind = Some(addr.to_owned());
        self
    }

    /// Sends from this local port (UDP flows that must keep their 5-tuple).
    #[must_use]
    pub fn source_port(mut self, port: u16) -> Self {
        self.source_port = Some(port);
        self
    }

    /// How long to wait for a connection or an answer (2 s unless told).
    #[must_use]
    pub fn limit(mut self, limit: Duration) -> Self {
        self.limit = limit;
        self
    }

    fn options(&self) -> String {
        let mut options = String::new();
        if let Some(bind) = &self.bind {
            options = format!("{options},bind={}", bracketed(bind));
        }
        if let Some(port) = self.source_port {
            options = format!("{options},sourceport={port}");
        }
        options
    }

    /// Connects over TCP and reads the backend's answer.
    #[must_use]
    pub fn tcp(&self, addr: &str, port: u16) -> Outcome {
        let target = format!(
            "TCP:{}:{port},connect-timeout={:.1}{}",
            bracketed(addr),
            self.limit.as_secs_f64(),
            self.options()
        );
        // The connection alone may take `limit`; answering gets as long again.
        self.exchange(&["-u", &target, "STDOUT"], None, self.limit * 2)
    }

    /// Sends one UDP datagram and waits for the answer.
    #[must_use]
    pub fn udp(&self, addr: &str, port: u16) -> Outcome {
        let target = format!("UDP:{}:{port}{}", bracketed(addr), self.options());
        self.exchange(&["-T5", "STDIO", &target], Some("ping\n"), self.limit)
    }

    fn exchange(&self, args: &[&str], input: Option<&str>, limit: Duration) -> Outcome {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.lab.ns(&self.role), "socat"])
            .args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn socat client");
        // Kept open until the answer: UDP socat would stop reading soon after EOF.
        let mut stdin = child.stdin.take();
        if let (Some(pipe), Some(text)) = (stdin.as_mut(), input) {
            let _ = pipe.write_all(text.as_bytes());
        }
        let lines = read_lines(child.stdout.take().expect("stdout"));
        let answer = lines.recv_timeout(limit);
        let _ = child.kill();
        drop(stdin);
        let _ = child.wait();
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        match answer {
            Ok(line) => parse_answer(&line),
            Err(_) if stderr.contains("Connection refused") => Outcome::Refused,
            Err(_) if stderr.contains("timed out") => Outcome::TimedOut,
            Err(RecvTimeoutError::Timeout) => Outcome::TimedOut,
            Err(RecvTimeoutError::Disconnected) => Outcome::Failed(stderr.trim().to_owned()),
        }
    }
}

/// `a1/8080 10.244.1.11` or `a1/8080 [fd00:0010:...]`.
fn parse_answer(line: &str) -> Outcome {
    let mut words = line.split_whitespace();
    let (Some(backend), Some(source)) = (words.next(), words.next()) else {
        return Outcome::Failed(format!("unexpected answer {line:?}"));
    };
    match source.trim_matches(['[', ']']).parse() {
        Ok(source) => Outcome::Served {
            backend: backend.to_owned(),
            source,
        },
        Err(_) => Outcome::Failed(format!("unexpected answer {line:?}")),
    }
}

/// A long-lived TCP connection through a service, to an echo backend.
pub struct Session {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Session {
    /// Sends `text` and returns what came back, or why nothing did within 3 s.
    ///
    /// # Errors
    /// When the session is gone or silent.
    pub fn echo(&mut self, text: &str) -> Result<String, String> {
        writeln!(self.stdin, "{text}").map_err(|e| format!("write: {e}"))?;
        self.stdin.flush().map_err(|e| format!("flush: {e}"))?;
        self.lines
            .recv_timeout(Duration::from_secs(3))
            .map_err(|e| format!("no echo of {text:?}: {e}"))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
