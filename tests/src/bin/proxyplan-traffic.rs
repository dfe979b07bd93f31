//! `proxyplan-traffic`: the client pod of the cluster tests (`tests/cluster/`). It keeps
//! traffic flowing to Services while the proxy is installed, upgraded, switched, migrated
//! and removed, and counts what failed:
//!
//! - `--tcp NAME=HOST:PORT`: a new TCP connection every `--interval`, one HTTP request
//!   (`GET /hostname`, agnhost netexec's) and its answer, then close;
//! - `--udp NAME=HOST:PORT`: a new UDP socket (so a new flow) every `--interval`, the
//!   datagram `hostname` and its answer (netexec's UDP server) from the Service's own
//!   address; sent once more on the same flow after a second without an answer, as a
//!   resolver does (counted as `retried`), a failure when that goes unanswered too;
//! - `--hold NAME=HOST:PORT:N`: N long-lived TCP connections (HTTP keep-alive), each
//!   asking `GET /hostname` every `--hold-interval`; any error on one (a reset, a timeout,
//!   an unexpected answer) counts as a broken long-lived connection, and it is reopened.
//!
//! The counters are served as JSON on `--report ADDRESS` (`GET /`), with the last
//! failures, each with its time and reason. Nothing here knows Kubernetes.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long one attempt may take before it counts as failed.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Failures kept for the report.
const KEPT_FAILURES: usize = 200;
/// What an attempt answers when it succeeded only after sending again on the same flow
/// (a UDP request or its answer lost once): counted apart, and not a failure.
const RETRIED: &str = "answered the second time";

#[derive(Default)]
struct Counter {
    attempts: AtomicU64,
    failures: AtomicU64,
    /// Answered only when sent again on the same flow.
    retried: AtomicU64,
}

#[derive(Default)]
struct Held {
    /// Connections opened, first ones and reopened ones.
    opened: AtomicU64,
    /// Requests answered on long-lived connections.
    requests: AtomicU64,
    /// Long-lived connections that broke (reset, timeout, bad answer).
    broken: AtomicU64,
    /// Connections that could not even be opened.
    open_failures: AtomicU64,
}

#[derive(Default)]
struct Report {
    tcp: BTreeMap<String, Arc<Counter>>,
    udp: BTreeMap<String, Arc<Counter>>,
    hold: BTreeMap<String, Arc<Held>>,
    failures: Mutex<VecDeque<String>>,
    started: Option<Instant>,
}

impl Report {
    fn fail(&self, what: &str, why: &str) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let line = format!("{now:.3} {what}: {why}");
        println!("{line}");
        if let Ok(mut failures) = self.failures.lock() {
            if failures.len() == KEPT_FAILURES {
                failures.pop_front();
            }
            failures.push_back(line);
        }
    }

    fn json(&self) -> String {
        let count = |c: &Counter| {
            serde_json::json!({
                "attempts": c.attempts.load(Ordering::Relaxed),
                "failures": c.failures.load(Ordering::Relaxed),
                "retried": c.retried.load(Ordering::Relaxed),
            })
        };
        let failures: Vec<String> = self
            .failures
            .lock()
            .map(|f| f.iter().cloned().collect())
            .unwrap_or_default();
        serde_json::json!({
            "seconds": self.started.map_or(0.0, |s| s.elapsed().as_secs_f64()),
            "tcp": self.tcp.iter().map(|(k, c)| (k.clone(), count(c))).collect::<BTreeMap<_, _>>(),
            "udp": self.udp.iter().map(|(k, c)| (k.clone(), count(c))).collect::<BTreeMap<_, _>>(),
            "hold": self.hold.iter().map(|(k, h)| (k.clone(), serde_json::json!({
                "opened": h.opened.load(Ordering::Relaxed),
                "requests": h.requests.load(Ordering::Relaxed),
                "broken": h.broken.load(Ordering::Relaxed),
                "open_failures": h.open_failures.load(Ordering::Relaxed),
            }))).collect::<BTreeMap<_, _>>(),
            "failures": failures,
        })
        .to_string()
    }
}

/// One kind of paced attempt: its name, its targets, their counters, one attempt.
type Kind<'a> = (
    &'a str,
    &'a [(String, String)],
    &'a BTreeMap<String, Arc<Counter>>,
    fn(SocketAddr) -> Result<(), String>,
);

struct Args {
    tcp: Vec<(String, String)>,
    udp: Vec<(String, String)>,
    hold: Vec<(String, String, usize)>,
    interval: Duration,
    hold_interval: Duration,
    report: SocketAddr,
}

fn millis(text: &str) -> Result<Duration, String> {
    let number = text
        .strip_suffix("ms")
        .ok_or(format!("{text:?}: give milliseconds, like 50ms"))?;
    number
        .parse()
        .map(Duration::from_millis)
        .map_err(|e| format!("{text:?}: {e}"))
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        tcp: Vec::new(),
        udp: Vec::new(),
        hold: Vec::new(),
        interval: Duration::from_millis(50),
        hold_interval: Duration::from_millis(200),
        report: SocketAddr::from(([0, 0, 0, 0], 8099)),
    };
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        if flag == "--help" || flag == "-h" {
            return Err(String::new());
        }
        let value = words.next().ok_or(format!("{flag} needs a value"))?;
        let named = || {
            value
                .split_once('=')
                .map(|(n, t)| (n.to_owned(), t.to_owned()))
                .ok_or(format!("{flag} {value}: expected NAME=HOST:PORT"))
        };
        match flag.as_str() {
            "--tcp" => args.tcp.push(named()?),
            "--udp" => args.udp.push(named()?),
            "--hold" => {
                let (name, target) = named()?;
                let (address, n) = target
                    .rsplit_once(':')
                    .ok_or(format!("--hold {value}: expected NAME=HOST:PORT:N"))?;
                let n = n.parse().map_err(|e| format!("--hold {value}: {e}"))?;
                args.hold.push((name, address.to_owned(), n));
            }
            "--interval" => args.interval = millis(&value)?,
            "--hold-interval" => args.hold_interval = millis(&value)?,
            "--report" => args.report = value.parse().map_err(|e| format!("--report: {e}"))?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(args)
}

fn resolve(target: &str) -> Result<SocketAddr, String> {
    target
        .to_socket_addrs()
        .map_err(|e| format!("{target}: {e}"))?
        .next()
        .ok_or(format!("{target}: no address"))
}

/// Reads one HTTP answer with a Content-Length body; the body.
fn read_answer(reader: &mut BufReader<TcpStream>) -> Result<String, String> {
    let mut status = String::new();
    reader.read_line(&mut status).map_err(|e| e.to_string())?;
    if status.is_empty() {
        return Err("connection closed".to_owned());
    }
    if !status.starts_with("HTTP/1.1 200") && !status.starts_with("HTTP/1.0 200") {
        return Err(format!("answer {:?}", status.trim_end()));
    }
    let mut length = None;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).map_err(|e| e.to_string())?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse::<usize>().ok();
        }
    }
    let length = length.ok_or("no Content-Length")?;
    let mut body = vec![0; length];
    reader.read_exact(&mut body).map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

fn connect(address: SocketAddr) -> Result<BufReader<TcpStream>, String> {
    let stream = TcpStream::connect_timeout(&address, ATTEMPT_TIMEOUT)
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(ATTEMPT_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(ATTEMPT_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    Ok(BufReader::new(stream))
}

fn ask(reader: &mut BufReader<TcpStream>, keep_alive: bool) -> Result<String, String> {
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let request =
        format!("GET /hostname HTTP/1.1\r\nHost: traffic\r\nConnection: {connection}\r\n\r\n");
    reader
        .get_mut()
        .write_all(request.as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    read_answer(reader)
}

fn tcp_attempt(address: SocketAddr) -> Result<(), String> {
    let mut reader = connect(address)?;
    ask(&mut reader, false).map(|_| ())
}

/// How long a UDP request waits for its answer before it is sent once more on the same
/// flow (what a resolver does); no answer to either is a failure.
const UDP_RETRY_AFTER: Duration = Duration::from_secs(1);

fn udp_attempt(address: SocketAddr) -> Result<(), String> {
    let local: SocketAddr = if address.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local).map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(UDP_RETRY_AFTER))
        .map_err(|e| e.to_string())?;
    // Connected: the kernel takes only answers from the Service's own address and port,
    // so an answer the proxy failed to translate back does not count.
    socket
        .connect(address)
        .map_err(|e| format!("connect: {e}"))?;
    let mut buffer = [0; 512];
    let mut last = String::new();
    for attempt in 0..2 {
        socket.send(b"hostname").map_err(|e| format!("send: {e}"))?;
        match socket.recv(&mut buffer) {
            Ok(n) if n > 0 && attempt == 0 => return Ok(()),
            Ok(n) if n > 0 => return Err(RETRIED.to_owned()),
            Ok(_) => last = "empty answer".to_owned(),
            Err(e) => last = format!("no answer: {e}"),
        }
    }
    Err(format!("{last} (sent twice on the same flow)"))
}

/// Runs `attempt` against `target` every `interval`, forever.
fn paced(
    report: Arc<Report>,
    what: String,
    target: String,
    counter: Arc<Counter>,
    interval: Duration,
    attempt: fn(SocketAddr) -> Result<(), String>,
) {
    let mut next = Instant::now();
    loop {
        counter.attempts.fetch_add(1, Ordering::Relaxed);
        match resolve(&target).and_then(attempt) {
            Ok(()) => {}
            Err(why) if why == RETRIED => {
                counter.retried.fetch_add(1, Ordering::Relaxed);
                report.fail(&what, &why);
            }
            Err(why) => {
                counter.failures.fetch_add(1, Ordering::Relaxed);
                report.fail(&what, &why);
            }
        }
        next += interval;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
}

/// One long-lived connection to `target`, reopened when it breaks.
fn hold(report: Arc<Report>, what: String, target: String, held: Arc<Held>, interval: Duration) {
    loop {
        let mut reader = match resolve(&target).and_then(connect) {
            Ok(reader) => reader,
            Err(why) => {
                held.open_failures.fetch_add(1, Ordering::Relaxed);
                report.fail(&what, &format!("opening: {why}"));
                std::thread::sleep(interval);
                continue;
            }
        };
        held.opened.fetch_add(1, Ordering::Relaxed);
        loop {
            match ask(&mut reader, true) {
                Ok(_) => {
                    held.requests.fetch_add(1, Ordering::Relaxed);
                }
                Err(why) => {
                    held.broken.fetch_add(1, Ordering::Relaxed);
                    report.fail(&what, &format!("long-lived connection broke: {why}"));
                    break;
                }
            }
            std::thread::sleep(interval);
        }
    }
}

fn serve(report: &Report, address: SocketAddr) -> std::io::Result<()> {
    let listener = TcpListener::bind(address)?;
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let _ = stream.set_read_timeout(Some(ATTEMPT_TIMEOUT));
        let mut request = [0; 1024];
        let _ = stream.read(&mut request);
        let body = report.json();
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(why) => {
            if !why.is_empty() {
                eprintln!("proxyplan-traffic: {why}");
            }
            eprintln!(
                "usage: proxyplan-traffic [--tcp NAME=HOST:PORT]... [--udp NAME=HOST:PORT]... \
                 [--hold NAME=HOST:PORT:N]... [--interval 50ms] [--hold-interval 200ms] \
                 [--report 0.0.0.0:8099]"
            );
            return std::process::ExitCode::from(2);
        }
    };
    let mut report = Report {
        started: Some(Instant::now()),
        ..Report::default()
    };
    for (name, _) in &args.tcp {
        report.tcp.insert(name.clone(), Arc::default());
    }
    for (name, _) in &args.udp {
        report.udp.insert(name.clone(), Arc::default());
    }
    for (name, _, _) in &args.hold {
        report.hold.insert(name.clone(), Arc::default());
    }
    let report = Arc::new(report);
    let kinds: [Kind<'_>; 2] = [
        ("tcp", &args.tcp, &report.tcp, tcp_attempt),
        ("udp", &args.udp, &report.udp, udp_attempt),
    ];
    for (kind, targets, counters, attempt) in kinds {
        for (name, target) in targets {
            let Some(counter) = counters.get(name).cloned() else {
                continue;
            };
            let (report, what, target) = (report.clone(), format!("{kind} {name}"), target.clone());
            let interval = args.interval;
            std::thread::spawn(move || paced(report, what, target, counter, interval, attempt));
        }
    }
    for (name, target, n) in &args.hold {
        let Some(held) = report.hold.get(name).cloned() else {
            continue;
        };
        for i in 0..*n {
            let (report, what, target, held) = (
                report.clone(),
                format!("hold {name}#{i}"),
                target.clone(),
                held.clone(),
            );
            let interval = args.hold_interval;
            std::thread::spawn(move || hold(report, what, target, held, interval));
        }
    }
    println!(
        "proxyplan-traffic: running; counters on http://{}/",
        args.report
    );
    match serve(&report, args.report) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!(
                "proxyplan-traffic: serving the report on {}: {err}",
                args.report
            );
            std::process::ExitCode::FAILURE
        }
    }
}
