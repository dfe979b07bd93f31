//! The conntrack table's size and timeouts, set as kube-proxy sets them at start
//! (`cmd/kube-proxy/app/server_linux.go` and `pkg/proxy/conntrack/sysctls.go`): each value
//! is written only when it differs, a zero leaves the kernel's value alone, and the table
//! size is only ever raised.

use std::time::Duration;

use crate::kernel::command::Runner;
use crate::kernel::error::DataplaneError;

/// kube-proxy caps the table at this size (1.36: bigger tables cost memory and hash
/// time for no gain).
pub const MAX_CAP: u64 = 1_048_576;

/// `nf_conntrack_max` and its hash table.
const MAX: &str = "net/netfilter/nf_conntrack_max";
/// The hash table size: a module parameter, not a sysctl.
const HASHSIZE: &str = "/sys/module/nf_conntrack/parameters/hashsize";

/// What to set, as kube-proxy's `--conntrack-*` flags say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConntrackSysctls {
    /// Table entries per CPU (`--conntrack-max-per-core`); 0 leaves the size alone.
    pub max_per_core: u64,
    /// The smallest table (`--conntrack-min`), whatever the CPU count.
    pub min: u64,
    /// `nf_conntrack_tcp_timeout_established`; zero leaves it alone.
    pub tcp_established_timeout: Duration,
    /// `nf_conntrack_tcp_timeout_close_wait`; zero leaves it alone.
    pub tcp_close_wait_timeout: Duration,
    /// Set `nf_conntrack_tcp_be_liberal=1` (never set back to 0).
    pub tcp_be_liberal: bool,
    /// `nf_conntrack_udp_timeout`; zero leaves it alone.
    pub udp_timeout: Duration,
    /// `nf_conntrack_udp_timeout_stream`; zero leaves it alone.
    pub udp_stream_timeout: Duration,
}

impl Default for ConntrackSysctls {
    /// kube-proxy's defaults.
    fn default() -> Self {
        Self {
            max_per_core: 32_768,
            min: 131_072,
            tcp_established_timeout: Duration::from_secs(24 * 3600),
            tcp_close_wait_timeout: Duration::from_secs(3600),
            tcp_be_liberal: false,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::ZERO,
        }
    }
}

/// One sysctl the agent set, found already right, or could not set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlOutcome {
    /// The sysctl (`net/netfilter/nf_conntrack_max`) or module parameter path.
    pub name: String,
    /// The value wanted.
    pub wanted: String,
    /// The value found before.
    pub found: Option<String>,
    /// Why it could not be set, when it could not.
    pub error: Option<String>,
}

impl SysctlOutcome {
    /// Whether the agent changed it.
    #[must_use]
    pub fn changed(&self) -> bool {
        self.error.is_none() && self.found.as_deref() != Some(self.wanted.as_str())
    }
}

impl ConntrackSysctls {
    /// The table size for `cpus` CPUs (`None`: leave it alone), as kube-proxy 1.36
    /// computes it.
    #[must_use]
    pub fn table_size(&self, cpus: u64) -> Option<u64> {
        if self.max_per_core == 0 {
            return None;
        }
        let scaled = self.max_per_core.saturating_mul(cpus);
        Some(if scaled > MAX_CAP {
            MAX_CAP
        } else {
            scaled.max(self.min)
        })
    }

    /// The per-namespace sysctls to set, with their values (the table size apart).
    #[must_use]
    pub fn timeouts(&self) -> Vec<(&'static str, String)> {
        let seconds = |d: Duration| (!d.is_zero()).then(|| d.as_secs().to_string());
        let mut out = Vec::new();
        for (name, value) in [
            (
                "net/netfilter/nf_conntrack_tcp_timeout_established",
                seconds(self.tcp_established_timeout),
            ),
            (
                "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
                seconds(self.tcp_close_wait_timeout),
            ),
            (
                "net/netfilter/nf_conntrack_tcp_be_liberal",
                self.tcp_be_liberal.then(|| "1".to_owned()),
            ),
            (
                "net/netfilter/nf_conntrack_udp_timeout",
                seconds(self.udp_timeout),
            ),
            (
                "net/netfilter/nf_conntrack_udp_timeout_stream",
                seconds(self.udp_stream_timeout),
            ),
        ] {
            if let Some(value) = value {
                out.push((name, value));
            }
        }
        out
    }

    /// Sets everything through `runner` (its network namespace), for `cpus` CPUs: each
    /// sysctl written only when it differs, the table size only raised (with its hash
    /// table at a quarter of it, as kube-proxy does). Nothing here stops the agent: what
    /// could not be set is reported.
    pub fn apply(&self, runner: &dyn Runner, cpus: u64) -> Vec<SysctlOutcome> {
        let mut out = Vec::new();
        if let Some(size) = self.table_size(cpus) {
            let found = runner.read_sysctl(MAX).ok().flatten();
            let current = found.as_deref().and_then(|v| v.parse::<u64>().ok());
            if current.is_none_or(|c| c < size) {
                let set = outcome(MAX, size.to_string(), found, |v| {
                    runner.write_sysctl(MAX, v)
                });
                let raised = set.error.is_none();
                out.push(set);
                if raised {
                    raise_hashsize(size / 4, &mut out);
                }
            }
        }
        for (name, value) in self.timeouts() {
            let found = runner.read_sysctl(name).ok().flatten();
            if found.as_deref() == Some(value.as_str()) {
                continue;
            }
            out.push(outcome(name, value, found, |v| {
                runner.write_sysctl(name, v)
            }));
        }
        out
    }
}

fn outcome(
    name: &str,
    wanted: String,
    found: Option<String>,
    write: impl FnOnce(&str) -> Result<(), DataplaneError>,
) -> SysctlOutcome {
    let error = write(&wanted).err().map(|e| e.to_string());
    SysctlOutcome {
        name: name.to_owned(),
        wanted,
        found,
        error,
    }
}

/// Raises the conntrack hash table to `buckets` (a module parameter, the same for every
/// namespace), if it is smaller.
fn raise_hashsize(buckets: u64, out: &mut Vec<SysctlOutcome>) {
    let Ok(text) = std::fs::read_to_string(HASHSIZE) else {
        return; // conntrack built in without the parameter, or no /sys
    };
    let found = text.trim().to_owned();
    if found.parse::<u64>().is_ok_and(|b| b >= buckets) {
        return;
    }
    out.push(outcome(HASHSIZE, buckets.to_string(), Some(found), |v| {
        std::fs::write(HASHSIZE, v)
            .map_err(|e| DataplaneError::io(format!("writing {v} to {HASHSIZE}"), e))
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::command::fake::FakeKernel;

    #[test]
    fn the_table_size_follows_kube_proxy() {
        let ct = ConntrackSysctls::default();
        assert_eq!(ct.table_size(2), Some(131_072), "the minimum");
        assert_eq!(ct.table_size(8), Some(262_144), "32768 per core");
        assert_eq!(ct.table_size(64), Some(MAX_CAP), "capped");
        let off = ConntrackSysctls {
            max_per_core: 0,
            ..ct
        };
        assert_eq!(off.table_size(8), None, "0 leaves it alone");
    }

    #[test]
    fn only_what_differs_is_written_and_zero_leaves_a_value_alone() {
        let kernel = FakeKernel::new();
        kernel.set_sysctl(MAX, "262144");
        kernel.set_sysctl(
            "net/netfilter/nf_conntrack_tcp_timeout_established",
            "432000",
        );
        kernel.set_sysctl("net/netfilter/nf_conntrack_tcp_timeout_close_wait", "3600");
        kernel.set_sysctl("net/netfilter/nf_conntrack_udp_timeout", "30");
        let ct = ConntrackSysctls {
            tcp_be_liberal: true,
            ..ConntrackSysctls::default()
        };
        let outcomes = ct.apply(&kernel, 2);
        let names: Vec<&str> = outcomes.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "net/netfilter/nf_conntrack_tcp_timeout_established",
                "net/netfilter/nf_conntrack_tcp_be_liberal",
            ],
            "the table is already larger, close-wait is right, UDP is left alone"
        );
        assert!(outcomes.iter().all(SysctlOutcome::changed));
        assert_eq!(
            kernel
                .sysctl("net/netfilter/nf_conntrack_tcp_timeout_established")
                .as_deref(),
            Some("86400")
        );
        assert_eq!(
            kernel.sysctl(MAX).as_deref(),
            Some("262144"),
            "never lowered"
        );
        assert_eq!(
            kernel
                .sysctl("net/netfilter/nf_conntrack_udp_timeout")
                .as_deref(),
            Some("30")
        );
        assert!(
            ct.apply(&kernel, 2).is_empty(),
            "a second run writes nothing"
        );
    }
}
