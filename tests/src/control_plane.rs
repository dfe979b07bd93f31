//! A real, throwaway control plane (etcd and kube-apiserver v1.36.2 on loopback) for the
//! end-to-end and fault suites, through `../shared/k8s/control-plane.sh`.
//!
//! Every test run has one: the suites start their own and stop it when they end (also
//! when they fail), so API tests never skip. The fault suite also stops and restarts the
//! API server on the same data.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The variable that names `control-plane.sh`, when it is not at
/// `<repository>/../shared/k8s/control-plane.sh`.
pub const SCRIPT_VARIABLE: &str = "PROXYPLAN_CONTROL_PLANE";

/// A control plane this process started; stopped and removed on drop.
#[derive(Debug)]
pub struct ControlPlane {
    script: PathBuf,
    dir: PathBuf,
    dual_stack: bool,
    /// How long `up` took.
    pub started_in: Duration,
}

impl ControlPlane {
    /// Where `control-plane.sh` is: [`SCRIPT_VARIABLE`], else next to the repository.
    ///
    /// # Errors
    /// When the script is not there.
    pub fn script() -> Result<PathBuf, String> {
        if let Some(path) = std::env::var_os(SCRIPT_VARIABLE).filter(|v| !v.is_empty()) {
            let path = PathBuf::from(path);
            return if path.is_file() {
                Ok(path)
            } else {
                Err(format!(
                    "{SCRIPT_VARIABLE}={} is not a file",
                    path.display()
                ))
            };
        }
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let path = repo.join("../shared/k8s/control-plane.sh");
        if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "{} not found: the real control plane comes from ../shared/k8s next to the \
                 repository (or set {SCRIPT_VARIABLE})",
                path.display()
            ))
        }
    }

    /// Starts etcd and kube-apiserver in `dir` (removed first if it exists), dual-stack
    /// when asked. Takes about 7 s.
    ///
    /// # Errors
    /// When the script fails; the error carries its output.
    pub fn start(dir: &Path, dual_stack: bool) -> Result<Self, String> {
        let script = Self::script()?;
        let started = Instant::now();
        let mut plane = Self {
            script,
            dir: dir.to_path_buf(),
            dual_stack,
            started_in: Duration::ZERO,
        };
        // A leftover of a killed run in the same folder would refuse to start.
        let _ = plane.call("down");
        plane.call("up")?;
        plane.started_in = started.elapsed();
        Ok(plane)
    }

    /// The admin kubeconfig (`system:masters`).
    #[must_use]
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// The folder holding its data, certificates and logs.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// etcd's client address on loopback (from the script's `ports` file), for what only
    /// etcd itself can do, such as a compaction.
    ///
    /// # Errors
    /// When the file cannot be read or names no etcd port.
    pub fn etcd_address(&self) -> Result<std::net::SocketAddr, String> {
        let ports = std::fs::read_to_string(self.dir.join("ports"))
            .map_err(|e| format!("{}: {e}", self.dir.join("ports").display()))?;
        ports
            .lines()
            .find_map(|l| l.strip_prefix("etcd="))
            .and_then(|p| p.trim().parse::<u16>().ok())
            .map(|port| std::net::SocketAddr::from(([127, 0, 0, 1], port)))
            .ok_or_else(|| format!("no etcd port in {}", self.dir.join("ports").display()))
    }

    /// The API server's log.
    #[must_use]
    pub fn apiserver_log(&self) -> PathBuf {
        self.dir.join("logs/kube-apiserver.log")
    }

    /// Stops the API server; etcd keeps the data.
    ///
    /// # Errors
    /// When the script fails.
    pub fn stop_apiserver(&self) -> Result<(), String> {
        self.call("stop-apiserver").map(|_| ())
    }

    /// Starts the API server again on the same port with the same data; returns once it
    /// answers `/readyz`.
    ///
    /// # Errors
    /// When the script fails.
    pub fn start_apiserver(&self) -> Result<(), String> {
        self.call("start-apiserver").map(|_| ())
    }

    fn call(&self, verb: &str) -> Result<String, String> {
        let out = Command::new("bash")
            .arg(&self.script)
            .arg(verb)
            .arg(&self.dir)
            .env("CP_DUAL_STACK", if self.dual_stack { "1" } else { "0" })
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{} {verb}: {e}", self.script.display()))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "{} {verb} {}: {}\n{}{}",
                self.script.display(),
                self.dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Err(err) = self.call("down") {
            eprintln!("control plane: stopping: {err}");
        }
    }
}
