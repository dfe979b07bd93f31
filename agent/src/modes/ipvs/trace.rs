//! ipvs mode's live trace (`proxyplan-agent explain`): a packet through the rules the
//! kernel holds (read from `iptables-save`, the same reading as iptables mode's), with
//! the ipsets and the virtual servers the kernel holds, not the plan's. So a deleted set
//! entry, a real server gone or at weight 0, or a flushed chain shows in the verdict.

use std::net::{IpAddr, SocketAddr};

use proxyplan_crds::Protocol;

use crate::kernel::error::DataplaneError;
use crate::kernel::ipvs::{IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, IpvsKernel};
use crate::ruleset::trace::{
    IpvsStage, Packet, TraceError, TraceResult, Tracer, VirtualKey, VirtualServer, live_rules,
};

/// Why a live trace failed.
#[derive(Debug, thiserror::Error)]
pub enum LiveTraceError {
    /// IPVS, the ipsets or the addresses could not be read.
    #[error("reading the kernel: {0}")]
    Kernel(#[from] DataplaneError),
    /// The live rules cannot be traced.
    #[error("tracing the live rules: {0}")]
    Trace(#[from] TraceError),
}

fn protocol(number: u16) -> Option<Protocol> {
    match number {
        IPPROTO_TCP => Some(Protocol::TCP),
        IPPROTO_UDP => Some(Protocol::UDP),
        IPPROTO_SCTP => Some(Protocol::SCTP),
        _ => None,
    }
}

/// What IPVS and the agent's ipsets hold, and every address of the node (its own and
/// the VIPs on the dummy interface). IPVS is asked for the real servers of the virtual
/// servers `wanted` keeps only (a node holds 10,000 of them, one dump each, and a packet
/// meets one).
///
/// # Errors
/// When the kernel cannot be read.
pub fn live_stage(
    kernel: &mut impl IpvsKernel,
    wanted: impl Fn(&VirtualKey) -> bool,
) -> Result<(IpvsStage, Vec<IpAddr>), DataplaneError> {
    let mut stage = IpvsStage {
        sets: kernel.sets()?,
        ..IpvsStage::default()
    };
    for service in kernel.services()? {
        let Some(proto) = protocol(service.protocol).filter(|_| service.fwmark.is_none()) else {
            continue;
        };
        let key = (proto, service.addr, service.port);
        if !wanted(&key) {
            continue;
        }
        let real_servers = kernel
            .destinations(&service)?
            .into_iter()
            .map(|d| (SocketAddr::new(d.addr, d.port), d.weight))
            .collect();
        stage.servers.insert(
            key,
            VirtualServer {
                persistence: service.is_persistent().then_some(service.timeout),
                scheduler: service.scheduler,
                real_servers,
            },
        );
    }
    let local = kernel.addresses()?.into_iter().map(|a| a.ip).collect();
    Ok((stage, local))
}

/// Traces `packet` through the live kernel: the rules of `iptables_save` (the output of
/// `iptables-save` or `ip6tables-save` for the packet's family), and IPVS and the
/// ipsets as `kernel` holds them. The node's addresses are those the kernel holds and
/// `node_addresses` (the plan's), as in iptables mode's trace. IPVS is read for the
/// packet's destination only: in ipvs mode no rule translates it before IPVS does.
///
/// # Errors
/// When the kernel cannot be read or the rules cannot be traced.
pub fn trace_live(
    kernel: &mut impl IpvsKernel,
    iptables_save: &str,
    node_addresses: &[IpAddr],
    packet: &Packet,
) -> Result<TraceResult, LiveTraceError> {
    let (stage, mut local) = live_stage(kernel, |&(protocol, addr, port)| {
        (protocol, addr, port) == (packet.protocol, packet.destination, packet.port)
    })?;
    local.extend_from_slice(node_addresses);
    let tracer = Tracer::new(&live_rules(iptables_save), &local)?.with_ipvs(stage)?;
    Ok(tracer.trace(packet)?)
}
