//! What the kernel holds of the ipvs mode's objects: the dummy interface and its VIPs,
//! the node's other addresses, the agent's virtual servers and, right after a read, its
//! ipsets. Read on the first sync and after a failure; each sync keeps it up to date.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use tracing::info;

use super::render::{RealServer, VirtualServerKey};
use super::settings::IpvsSettings;
use crate::kernel::error::DataplaneError;
use crate::kernel::ipset::Sets;
use crate::kernel::ipvs::{
    IP_VS_SVC_F_PERSISTENT, IP_VS_SVC_F_SCHED_MH_PORT, IP_VS_SVC_F_SCHED1, IP_VS_SVC_F_SCHED2,
    IP_VS_SVC_F_SCHED3, IpvsKernel, IpvsService,
};

/// The scheduler flags (`IP_VS_SVC_F_SCHED1..3`) of a virtual server's flags.
const SCHED_FLAGS: u32 = IP_VS_SVC_F_SCHED1 | IP_VS_SVC_F_SCHED2 | IP_VS_SVC_F_SCHED3;

/// The scheduler flags a virtual server with `scheduler` gets: `mh` hashes the source
/// port too (`IP_VS_SVC_F_SCHED_MH_PORT`, as kube-proxy sets it), every other none.
pub(super) fn sched_flags(scheduler: &str) -> u32 {
    if scheduler == "mh" {
        IP_VS_SVC_F_SCHED_MH_PORT
    } else {
        0
    }
}

/// A real server as the kernel holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HeldRealServer {
    pub(super) weight: u32,
}

/// A virtual server as the kernel holds it (its key is the model's): what the agent sets
/// on it, and its real servers. Small, as 10,000 of them are held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HeldService {
    /// The scheduler (shared with the agent's setting when they match).
    pub(super) scheduler: Arc<str>,
    /// The persistence timeout of a persistent service.
    pub(super) persistence: Option<u32>,
    /// Its scheduler flags (`IP_VS_SVC_F_SCHED1..3`).
    pub(super) sched_flags: u32,
    pub(super) real_servers: BTreeMap<RealServer, HeldRealServer>,
}

impl HeldService {
    /// The service as IPVS requests name it.
    pub(super) fn service(&self, key: &VirtualServerKey) -> IpvsService {
        ipvs_service(key, self.persistence, &self.scheduler)
    }
}

/// What the kernel holds of the agent's objects.
#[derive(Debug, Clone, Default)]
pub(super) struct Model {
    /// The dummy interface's index (`None` in a dry run on a node without it).
    pub(super) link: Option<u32>,
    /// Addresses on the dummy interface.
    pub(super) vips: BTreeSet<IpAddr>,
    /// Addresses on every other interface.
    pub(super) local: BTreeSet<IpAddr>,
    /// The agent's virtual servers.
    pub(super) services: BTreeMap<VirtualServerKey, HeldService>,
    /// The agent's ipsets, right after they were read; `None` once a sync succeeded, when
    /// the kernel holds what [`Desired`] counts.
    pub(super) sets: Option<Sets>,
}

/// The IPVS service for a key, with a persistence timeout or none, and the scheduler's
/// flags ([`sched_flags`]).
pub(super) fn ipvs_service(
    key: &VirtualServerKey,
    persistence: Option<u32>,
    scheduler: &str,
) -> IpvsService {
    let mut service = IpvsService::new(key.protocol, key.addr, key.port, scheduler);
    service.flags = sched_flags(scheduler);
    if let Some(timeout) = persistence {
        service.flags |= IP_VS_SVC_F_PERSISTENT;
        service.timeout = timeout;
    }
    service
}

impl Model {
    /// Whether `service` is one the agent placed: not a firewall-mark service, not in an
    /// excluded range, and on one of the node's addresses.
    pub(super) fn owns(&self, settings: &IpvsSettings, service: &IpvsService) -> bool {
        service.fwmark.is_none()
            && !settings.excluded(service.addr)
            && (self.vips.contains(&service.addr) || self.local.contains(&service.addr))
    }

    /// Reads what the kernel holds, creating the dummy interface when it is missing and
    /// `create_link` says so. Services share `scheduler` when they use it. Virtual
    /// servers on `vips_held` count as the agent's even when their address is no longer
    /// on the dummy interface (someone deleted it; the next sync puts it back).
    pub(super) fn read(
        kernel: &mut impl IpvsKernel,
        settings: &IpvsSettings,
        scheduler: &Arc<str>,
        create_link: bool,
        vips_held: &BTreeSet<IpAddr>,
    ) -> Result<Self, DataplaneError> {
        let name = settings.interface.clone();
        let mut link = kernel.link_index(&name)?;
        if link.is_none() && create_link {
            let created = kernel.create_dummy(&name)?;
            info!(interface = %name, index = created, "created the dummy interface for service VIPs");
            link = Some(created);
        }
        let mut model = Self {
            link,
            ..Self::default()
        };
        for address in kernel.addresses()? {
            if Some(address.index) == link {
                model.vips.insert(address.ip);
            } else {
                model.local.insert(address.ip);
            }
        }
        for service in kernel.services()? {
            let held = service.fwmark.is_none()
                && !settings.excluded(service.addr)
                && vips_held.contains(&service.addr);
            if !held && !model.owns(settings, &service) {
                continue;
            }
            let real_servers = kernel
                .destinations(&service)?
                .into_iter()
                .map(|d| ((d.addr, d.port), HeldRealServer { weight: d.weight }))
                .collect();
            let key = VirtualServerKey {
                protocol: service.protocol,
                addr: service.addr,
                port: service.port,
            };
            model.services.insert(
                key,
                HeldService {
                    scheduler: if *service.scheduler == **scheduler {
                        Arc::clone(scheduler)
                    } else {
                        Arc::from(service.scheduler.as_str())
                    },
                    persistence: service.is_persistent().then_some(service.timeout),
                    sched_flags: service.flags & SCHED_FLAGS,
                    real_servers,
                },
            );
        }
        model.sets = Some(kernel.sets()?);
        Ok(model)
    }
}
