//! The sysctls the ipvs mode needs, checked (and set) by its first sync.

use tracing::warn;

use crate::kernel::ipvs::IpvsKernel;

/// The sysctls the ipvs mode needs: name, value, why.
const SYSCTLS: [(&str, &str, &str); 4] = [
    (
        "net/ipv4/vs/conntrack",
        "1",
        "IPVS traffic must pass netfilter for masquerade",
    ),
    (
        "net/ipv4/vs/expire_nodest_conn",
        "1",
        "connections to deleted real servers end at once",
    ),
    (
        "net/ipv4/vs/expire_quiescent_template",
        "1",
        "affinity never sticks to a drained real server",
    ),
    (
        "net/ipv4/ip_forward",
        "1",
        "the node forwards service traffic",
    ),
];

/// Strict ARP sysctls (`--ipvs-strict-arp`).
const STRICT_ARP: [(&str, &str, &str); 2] = [
    (
        "net/ipv4/conf/all/arp_ignore",
        "1",
        "answer ARP only for addresses of the receiving interface",
    ),
    (
        "net/ipv4/conf/all/arp_announce",
        "2",
        "never announce VIPs of the dummy interface",
    ),
];

/// `net/ipv4/vs/conn_reuse_mode`, set to 0 on kernels where the default (1) stalls
/// reused source ports.
const CONN_REUSE_MODE: (&str, &str, &str) = (
    "net/ipv4/vs/conn_reuse_mode",
    "0",
    "kernels before 5.9 delay a new connection for a second when it reuses the source \
     port of an old one (kubernetes issue 81775)",
);

/// What to do with `net/ipv4/vs/conn_reuse_mode` on a kernel (kube-proxy's rule, its
/// `IPVSConnReuseModeMinSupportedKernelVersion` and `IPVSConnReuseModeFixedKernelVersion`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnReuseMode {
    /// Before 4.1 the sysctl does not exist: say so, change nothing.
    Unsupported,
    /// 4.1 ≤ kernel < 5.9: set it to 0.
    SetZero,
    /// 5.9 and later fixed the stall: leave it as it is.
    LeaveAlone,
}

impl ConnReuseMode {
    /// The decision for a kernel release as `uname -r` (`kernel/osrelease`) prints it,
    /// e.g. `6.1.0-28-amd64`; `None` when it does not start with `MAJOR.MINOR`.
    #[must_use]
    pub fn for_release(release: &str) -> Option<Self> {
        let mut parts = release.trim().split(['.', '-']);
        let number = |part: Option<&str>| -> Option<u32> {
            let digits: String = part?.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        };
        let version = (number(parts.next())?, number(parts.next())?);
        Some(if version < (4, 1) {
            Self::Unsupported
        } else if version < (5, 9) {
            Self::SetZero
        } else {
            Self::LeaveAlone
        })
    }
}

/// Whether `conn_reuse_mode` must be set on this kernel (read from `kernel/osrelease`).
fn wants_conn_reuse_zero(kernel: &mut impl IpvsKernel) -> bool {
    let release = match kernel.read_sysctl("kernel/osrelease") {
        Ok(Some(release)) => release,
        Ok(None) => String::new(),
        Err(err) => {
            warn!(%err, "cannot read the kernel release; net/ipv4/vs/conn_reuse_mode left alone");
            return false;
        }
    };
    match ConnReuseMode::for_release(&release) {
        Some(ConnReuseMode::SetZero) => true,
        Some(ConnReuseMode::LeaveAlone) => false,
        Some(ConnReuseMode::Unsupported) => {
            warn!(
                release,
                "kernel older than 4.1: net/ipv4/vs/conn_reuse_mode cannot be set; new \
                 connections that reuse a source port may stall"
            );
            false
        }
        None => {
            warn!(
                release,
                "unknown kernel release; net/ipv4/vs/conn_reuse_mode left alone"
            );
            false
        }
    }
}

/// One sysctl check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlCheck {
    /// `net/ipv4/vs/conntrack`.
    pub name: String,
    /// The value the agent needs.
    pub wanted: String,
    /// The value found before the agent set it (`None` when missing).
    pub found: Option<String>,
    /// Whether it holds the wanted value now.
    pub ok: bool,
}

/// Checks the sysctls the mode needs (with `strict_arp`, those of `--ipvs-strict-arp`
/// too) and sets those that differ unless `dry_run`, writing each change to `payload`;
/// failures are warnings.
pub fn check(
    kernel: &mut impl IpvsKernel,
    strict_arp: bool,
    payload: &mut String,
    dry_run: bool,
) -> Vec<SysctlCheck> {
    let conn_reuse = wants_conn_reuse_zero(kernel).then_some(&CONN_REUSE_MODE);
    let wanted = SYSCTLS
        .iter()
        .chain(conn_reuse)
        .chain(STRICT_ARP.iter().filter(|_| strict_arp));
    let mut checks = Vec::new();
    for (name, value, why) in wanted {
        let found = match kernel.read_sysctl(name) {
            Ok(found) => found,
            Err(err) => {
                warn!(sysctl = name, %err, "cannot read sysctl");
                None
            }
        };
        let mut ok = found.as_deref() == Some(value);
        if !ok && found.is_some() {
            payload.push_str(&format!(
                "# sysctl {name}={value} (was {}): {why}\n",
                found.as_deref().unwrap_or("?")
            ));
            if !dry_run {
                match kernel.write_sysctl(name, value) {
                    Ok(()) => ok = true,
                    Err(err) => warn!(sysctl = name, %err, "cannot set sysctl: {why}"),
                }
            }
        } else if found.is_none() {
            warn!(
                sysctl = name,
                "sysctl missing (is the ip_vs module loaded?): {why}"
            );
        }
        checks.push(SysctlCheck {
            name: (*name).to_owned(),
            wanted: (*value).to_owned(),
            found,
            ok,
        });
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_reuse_mode_follows_the_kernel_version() {
        for (release, decision) in [
            ("3.10.0-1160.el7.x86_64", ConnReuseMode::Unsupported),
            ("4.0.9", ConnReuseMode::Unsupported),
            ("4.1.0", ConnReuseMode::SetZero),
            ("4.19.0-26-amd64", ConnReuseMode::SetZero),
            ("5.4.0-150-generic", ConnReuseMode::SetZero),
            ("5.8.18", ConnReuseMode::SetZero),
            ("5.9.0", ConnReuseMode::LeaveAlone),
            ("5.10.0-30-amd64", ConnReuseMode::LeaveAlone),
            ("6.1.0-28-amd64", ConnReuseMode::LeaveAlone),
            ("6.18.0+", ConnReuseMode::LeaveAlone),
            ("10.0", ConnReuseMode::LeaveAlone),
        ] {
            assert_eq!(
                ConnReuseMode::for_release(release),
                Some(decision),
                "{release}"
            );
        }
        for bad in ["", "linux", "6", "x.y"] {
            assert_eq!(ConnReuseMode::for_release(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn conn_reuse_mode_is_set_only_on_kernels_before_5_9() {
        use crate::kernel::ipvs::FakeIpvsKernel;
        let node = std::net::IpAddr::from([10, 0, 0, 1]);
        for (release, set) in [("5.4.0-150-generic", true), ("6.1.0-28-amd64", false)] {
            let mut kernel = FakeIpvsKernel::new(node);
            kernel
                .sysctls
                .insert("kernel/osrelease".to_owned(), release.to_owned());
            let mut payload = String::new();
            let checks = check(&mut kernel, false, &mut payload, false);
            let name = "net/ipv4/vs/conn_reuse_mode";
            assert_eq!(
                checks.iter().any(|c| c.name == name && c.ok),
                set,
                "{release}: {checks:?}"
            );
            let value = kernel.sysctls.get(name).map(String::as_str);
            assert_eq!(value, Some(if set { "0" } else { "1" }), "{release}");
            assert_eq!(payload.contains(name), set, "{release}: {payload}");
        }
    }
}
