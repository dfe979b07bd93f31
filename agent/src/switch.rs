//! Choosing the proxy mode and leaving the others behind: `--mode auto` probes the
//! kernel for nftables, and a mode that starts removes what the agent owns of the other
//! modes (as kube-proxy does when its mode changes), so switching modes on a running
//! node leaves nothing of the old one.

use proxyplan_agent::dataplane::Dataplane;
use proxyplan_agent::kernel::link::Links;
use proxyplan_agent::kernel::nftables::uapi::{NFPROTO_IPV4, NFPROTO_IPV6};
use proxyplan_agent::kernel::nftables::{NetlinkNft, NftKernel};
use proxyplan_agent::modes::nftables::names::TABLE;
use proxyplan_agent::modes::nftables::probe;
use proxyplan_agent::run::ProxyMode;

/// The mode for `--mode auto`: nftables when the kernel takes everything nftables mode
/// writes (checked without changing anything), iptables otherwise; and why.
pub fn auto_mode() -> (ProxyMode, String) {
    match probe(&mut NetlinkNft::new()) {
        Ok(()) => (
            ProxyMode::Nftables,
            "--mode auto: this kernel supports nftables mode, using it".to_owned(),
        ),
        Err(why) => (
            ProxyMode::Iptables,
            format!("--mode auto: {why}; using iptables mode instead"),
        ),
    }
}

/// Whether the agent's nf_tables tables exist (false when nf_tables cannot be asked).
fn nftables_tables() -> bool {
    let mut kernel = NetlinkNft::new();
    [NFPROTO_IPV4, NFPROTO_IPV6]
        .into_iter()
        .any(|family| kernel.table_exists(family, TABLE).unwrap_or(false))
}

/// Whether the ipvs mode's dummy interface exists.
fn ipvs_interface(name: &str) -> bool {
    Links::open()
        .ok()
        .and_then(|mut links| links.link_index(name).ok().flatten())
        .is_some()
}

/// Removes what the agent owns of the modes other than `mode`; `dataplane` builds a
/// mode's dataplane. Returns what was done, one line each, for the log.
pub fn remove_other_modes(
    mode: ProxyMode,
    ipvs_interface_name: &str,
    dataplane: &dyn Fn(ProxyMode) -> Box<dyn Dataplane + Send>,
) -> Vec<String> {
    let mut others = Vec::new();
    if mode != ProxyMode::Nftables && nftables_tables() {
        others.push(ProxyMode::Nftables);
    }
    if mode != ProxyMode::Ipvs && ipvs_interface(ipvs_interface_name) {
        // Also removes the iptables chains both it and iptables mode use; iptables
        // mode writes them again at its first sync.
        others.push(ProxyMode::Ipvs);
    }
    if mode == ProxyMode::Nftables {
        others.push(ProxyMode::Iptables);
    }
    let mut done = Vec::new();
    for other in others {
        match dataplane(other).cleanup() {
            Ok(report) if report.changed > 0 => done.push(format!(
                "switching to {mode} mode: removed what {other} mode left ({} objects)",
                report.changed
            )),
            Ok(_) => {}
            Err(err) => done.push(format!(
                "switching to {mode} mode: could not remove what {other} mode may have left: {err}"
            )),
        }
    }
    done
}

/// Whether `mode` may have left something on this node (for `cleanup --mode auto`,
/// which skips a mode the kernel cannot even run: no nf_tables, no dummy interface).
pub fn may_have_left(mode: ProxyMode, ipvs_interface_name: &str) -> bool {
    match mode {
        ProxyMode::Nftables => nftables_tables(),
        ProxyMode::Ipvs => ipvs_interface(ipvs_interface_name),
        ProxyMode::Iptables => true,
    }
}
