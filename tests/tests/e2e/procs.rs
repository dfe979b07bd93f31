//! Local processes of the suite: the controller, and per fake node a network namespace
//! holding a forwarder and an agent.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the two binaries are.
#[derive(Debug, Clone)]
pub struct Bins {
    pub controller: PathBuf,
    pub agent: PathBuf,
}

impl Bins {
    /// `E2E_CONTROLLER_BIN` / `E2E_AGENT_BIN`, else the workspace's `target/debug`.
    pub fn locate() -> Result<Self, String> {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        // The test binary runs from <target>/<profile>/deps: prefer that profile's
        // binaries, then <workspace>/target/debug.
        let profile_dir = std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.parent()?.to_path_buf()));
        let find = |variable: &str, name: &str| -> Result<PathBuf, String> {
            if let Some(path) = std::env::var_os(variable).filter(|v| !v.is_empty()) {
                let path = PathBuf::from(path);
                return if path.is_file() {
                    Ok(path)
                } else {
                    Err(format!("{variable}={} is not a file", path.display()))
                };
            }
            let candidates: Vec<PathBuf> = profile_dir
                .iter()
                .map(|dir| dir.join(name))
                .chain(std::iter::once(workspace.join("target/debug").join(name)))
                .collect();
            candidates
                .iter()
                .find(|p| p.is_file())
                .cloned()
                .ok_or_else(|| {
                    format!(
                        "{name} not found (looked for {}); run `cargo build --bins` first, or set \
                         {variable}",
                        candidates
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
        };
        Ok(Self {
            controller: find("E2E_CONTROLLER_BIN", "proxyplan-controller")?,
            agent: find("E2E_AGENT_BIN", "proxyplan-agent")?,
        })
    }
}

/// A free TCP port on 127.0.0.1 (free when asked; the process binds it right after).
pub fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port: {e}"))
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            == Some("0")
    })
}

/// Runs a command to completion; its stderr in the error.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {}: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A process we started, logging to a file.
pub struct Spawned {
    pub label: String,
    pub child: Child,
    pub log: PathBuf,
}

impl Spawned {
    /// Starts `command` with stdout and stderr appended to `log` (unless stdout is
    /// already redirected by the caller).
    pub fn start(
        label: &str,
        command: &mut Command,
        log: PathBuf,
        keep_stdout: bool,
    ) -> Result<Self, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let err_file = file
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        command.stdin(Stdio::null()).stderr(err_file);
        if !keep_stdout {
            command.stdout(file);
        }
        let child = command
            .spawn()
            .map_err(|e| format!("starting {label} ({command:?}): {e}"))?;
        Ok(Self {
            label: label.to_owned(),
            child,
            log,
        })
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        let start = all.len().saturating_sub(lines);
        format!(
            "last {} lines of {} ({}):\n{}",
            all.len() - start,
            self.label,
            self.log.display(),
            all[start..].join("\n")
        )
    }

    /// `Some(why)` when the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!(
                "{} exited ({status})\n{}",
                self.label,
                self.log_tail(30)
            )),
            Ok(None) => None,
            Err(err) => Some(format!("{}: {err}", self.label)),
        }
    }

    /// SIGTERM, then SIGKILL after 5 s.
    pub async fn stop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `proxyplan-e2e-forward` in network namespace `netns`, listening on `listen`
/// and forwarding to `socket`; returns once it listens.
pub async fn start_forwarder(
    netns: &str,
    listen: SocketAddr,
    socket: &Path,
    log: PathBuf,
) -> Result<Spawned, String> {
    let mut command = Command::new("ip");
    command
        .args([
            "netns",
            "exec",
            netns,
            env!("CARGO_BIN_EXE_proxyplan-e2e-forward"),
        ])
        .arg(listen.to_string())
        .arg(socket)
        .stdout(Stdio::piped());
    let mut spawned = Spawned::start(&format!("forwarder in {netns}"), &mut command, log, true)?;
    let stdout = spawned
        .child
        .stdout
        .take()
        .ok_or("forwarder without stdout")?;
    let line = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            line
        }),
    )
    .await;
    match line {
        Ok(Ok(line)) if line.starts_with(proxyplan_tests::e2e::forward::READY_LINE) => Ok(spawned),
        other => {
            let why = spawned
                .exited()
                .unwrap_or_else(|| format!("no ready line within 10 s ({other:?})"));
            spawned.stop().await;
            Err(format!("forwarder in {netns}: {why}"))
        }
    }
}

/// The HTTP status of `GET path` on `address`, if it answers.
pub async fn http_status(address: SocketAddr, path: &str) -> Option<u16> {
    let request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n");
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        stream.write_all(request.as_bytes()).ok()?;
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer.split_whitespace().nth(1)?.parse().ok()
    })
    .await
    .ok()
    .flatten()
}

/// The nat table of network namespace `netns`, as every iptables back end present
/// sees it.
pub fn nat_rules(netns: &str) -> String {
    ["iptables-nft-save", "iptables-legacy-save", "iptables-save"]
        .iter()
        .filter_map(|tool| run("ip", &["netns", "exec", netns, tool, "-t", "nat"]).ok())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Kills whatever still runs in `netns` (only processes this suite started there), then
/// deletes it.
pub fn delete_netns(netns: &str) -> Result<(), String> {
    if let Ok(pids) = run("ip", &["netns", "pids", netns]) {
        for pid in pids.split_whitespace() {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
    }
    run("ip", &["netns", "del", netns]).map(|_| ())
}

/// The HTTP status of `GET /` on `127.0.0.1:port` inside network namespace `netns`
/// (bash's `/dev/tcp`, so nothing else needs installing), if it answers.
pub async fn http_status_in(netns: &str, port: u16) -> Option<u16> {
    let script = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3 && \
         head -n 1 <&3"
    );
    let netns = netns.to_owned();
    tokio::task::spawn_blocking(move || {
        let line = run(
            "ip",
            &[
                "netns", "exec", &netns, "timeout", "5", "bash", "-c", &script,
            ],
        )
        .ok()?;
        line.split_whitespace().nth(1)?.parse().ok()
    })
    .await
    .ok()
    .flatten()
}
