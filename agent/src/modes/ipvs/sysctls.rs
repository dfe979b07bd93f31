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
    let wanted = SYSCTLS
        .iter()
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
