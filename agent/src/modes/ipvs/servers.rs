//! IPVS virtual and real servers: the operations that bring them to what the plan wants,
//! sent in rounds, and graceful termination (a removed TCP or SCTP real server drains at
//! weight 0 until its connections end or its grace period is over).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use tracing::warn;

use super::model::{HeldRealServer, HeldService, Model, ipvs_service, sched_flags};
use super::render::{RealServer, VirtualServer, VirtualServerKey};
use super::settings::IpvsSettings;
use crate::kernel::error::DataplaneError;
use crate::kernel::ipvs::{
    IPPROTO_UDP, IpvsDestination, IpvsKernel, IpvsOp, IpvsService, socket_text,
};

/// Operations sent to the kernel per netlink round (bounds memory at first apply).
pub(super) const OPS_PER_ROUND: usize = 4096;

/// An errno's text.
pub(super) fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno.abs()).to_string()
}

/// IPVS changes collected and sent in rounds.
pub(super) struct OpRounds {
    kinds: Vec<(OpKind, usize, Option<usize>)>,
    services: Vec<IpvsService>,
    destinations: Vec<IpvsDestination>,
    pub(super) dry_run: bool,
    pub(super) sent: usize,
    pub(super) failures: Vec<String>,
    pub(super) payload: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OpKind {
    AddService,
    UpdateService,
    DeleteService,
    AddDestination,
    UpdateDestination,
    DeleteDestination,
}

impl OpRounds {
    pub(super) fn new(dry_run: bool) -> Self {
        Self {
            kinds: Vec::new(),
            services: Vec::new(),
            destinations: Vec::new(),
            dry_run,
            sent: 0,
            failures: Vec::new(),
            payload: String::new(),
        }
    }

    /// Keeps `service` for the real-server operations that follow; no operation itself.
    pub(super) fn with_service(&mut self, service: IpvsService) -> usize {
        self.services.push(service);
        self.services.len() - 1
    }

    /// An operation on `service` itself.
    pub(super) fn service(&mut self, kind: OpKind, service: IpvsService) -> usize {
        let i = self.with_service(service);
        self.kinds.push((kind, i, None));
        i
    }

    pub(super) fn destination(
        &mut self,
        kind: OpKind,
        service: usize,
        destination: IpvsDestination,
    ) {
        self.destinations.push(destination);
        self.kinds
            .push((kind, service, Some(self.destinations.len() - 1)));
    }

    pub(super) fn full(&self) -> bool {
        self.kinds.len() >= OPS_PER_ROUND
    }

    pub(super) fn send(&mut self, kernel: &mut impl IpvsKernel) -> Result<(), DataplaneError> {
        if self.kinds.is_empty() {
            self.services.clear();
            self.destinations.clear();
            return Ok(());
        }
        let ops: Vec<IpvsOp<'_>> = self
            .kinds
            .iter()
            .filter_map(|&(kind, s, d)| {
                let service = self.services.get(s)?;
                let dest = d.and_then(|d| self.destinations.get(d));
                Some(match (kind, dest) {
                    (OpKind::AddService, _) => IpvsOp::AddService(service),
                    (OpKind::UpdateService, _) => IpvsOp::UpdateService(service),
                    (OpKind::DeleteService, _) => IpvsOp::DeleteService(service),
                    (OpKind::AddDestination, Some(d)) => IpvsOp::AddDestination(service, d),
                    (OpKind::UpdateDestination, Some(d)) => IpvsOp::UpdateDestination(service, d),
                    (OpKind::DeleteDestination, Some(d)) => IpvsOp::DeleteDestination(service, d),
                    _ => return None,
                })
            })
            .collect();
        self.sent += ops.len();
        if self.dry_run {
            for op in &ops {
                self.payload.push_str(&format!("# ipvs {op}\n"));
            }
        } else {
            let results = kernel.execute(&ops)?;
            for (op, errno) in ops.iter().zip(results) {
                // Deleting what is already gone is done.
                let gone = matches!(op, IpvsOp::DeleteService(_) | IpvsOp::DeleteDestination(..))
                    && matches!(errno, -2 | -3);
                if errno != 0 && !gone && self.failures.len() < 5 {
                    self.failures.push(format!("{op}: {}", errno_text(errno)));
                }
            }
        }
        self.kinds.clear();
        self.services.clear();
        self.destinations.clear();
        Ok(())
    }
}

/// Real servers at weight 0, with the time they must be gone by.
pub(super) type Draining = HashMap<(VirtualServerKey, RealServer), Instant>;

/// What the IPVS part of a sync works with besides the kernel and the model.
pub(super) struct ServerSync<'a> {
    /// The mode's settings (scheduler, excluded ranges, grace period).
    pub(super) settings: &'a IpvsSettings,
    /// `settings.scheduler`, shared by every held service that uses it.
    pub(super) scheduler: &'a Arc<str>,
    /// Removed TCP/SCTP real servers at weight 0.
    pub(super) draining: &'a mut Draining,
}

impl ServerSync<'_> {
    /// Collects the IPVS changes into `rounds` (sending full rounds as it goes) and
    /// updates `model` to what the kernel holds once they are done: `servers` as wanted,
    /// `gone` deleted, and real servers left draining checked.
    pub(super) fn ipvs_changes(
        &mut self,
        kernel: &mut impl IpvsKernel,
        servers: BTreeMap<VirtualServerKey, VirtualServer>,
        gone: &BTreeSet<VirtualServerKey>,
        model: &mut Model,
        rounds: &mut OpRounds,
    ) -> Result<(), DataplaneError> {
        let now = Instant::now();
        for key in gone {
            if let Some(held) = model.services.get(key) {
                rounds.service(OpKind::DeleteService, held.service(key));
            }
            if !rounds.dry_run {
                model.services.remove(key);
            }
            self.draining.retain(|(k, _), _| k != key);
            if rounds.full() {
                rounds.send(kernel)?;
            }
        }
        // Consumed, so each wanted server's list is freed once it is reconciled.
        for (key, vs) in servers {
            if self.settings.excluded(key.addr) {
                continue;
            }
            self.reconcile(&key, &vs, model, rounds, now);
            if rounds.full() {
                rounds.send(kernel)?;
            }
        }
        // Draining real servers: delete those whose connections ended or whose grace
        // period is over. Also those left at weight 0 by an earlier run.
        rounds.send(kernel)?;
        let draining: BTreeSet<VirtualServerKey> = self.draining.keys().map(|(k, _)| *k).collect();
        let draining: Vec<VirtualServerKey> = draining.into_iter().collect();
        self.finish_draining(kernel, &draining, model, rounds, now)
    }

    /// Brings one virtual server to `vs`.
    fn reconcile(
        &mut self,
        key: &VirtualServerKey,
        vs: &VirtualServer,
        model: &mut Model,
        rounds: &mut OpRounds,
        now: Instant,
    ) {
        let wanted = ipvs_service(key, vs.persistence, self.scheduler);
        let Some(held) = model.services.get(key) else {
            let s = rounds.service(OpKind::AddService, wanted);
            for (addr, port) in &vs.real_servers {
                rounds.destination(
                    OpKind::AddDestination,
                    s,
                    IpvsDestination::masq(*addr, *port, 1),
                );
            }
            if !rounds.dry_run {
                model.services.insert(
                    *key,
                    HeldService {
                        scheduler: Arc::clone(self.scheduler),
                        persistence: vs.persistence,
                        sched_flags: sched_flags(self.scheduler),
                        real_servers: vs
                            .real_servers
                            .iter()
                            .map(|rs| (*rs, HeldRealServer { weight: 1 }))
                            .collect(),
                    },
                );
            }
            return;
        };
        let update = held.scheduler != *self.scheduler
            || held.persistence != vs.persistence
            || held.sched_flags != sched_flags(self.scheduler);
        let mut changes: Vec<(OpKind, RealServer, u32)> = Vec::new();
        for rs in &vs.real_servers {
            match held.real_servers.get(rs) {
                None => changes.push((OpKind::AddDestination, *rs, 1)),
                Some(h) if h.weight != 1 => {
                    changes.push((OpKind::UpdateDestination, *rs, 1));
                    self.draining.remove(&(*key, *rs));
                }
                Some(_) => {}
            }
        }
        for (rs, h) in &held.real_servers {
            if vs.real_servers.binary_search(rs).is_ok() {
                continue;
            }
            if key.protocol == IPPROTO_UDP {
                changes.push((OpKind::DeleteDestination, *rs, h.weight));
                continue;
            }
            if h.weight != 0 {
                changes.push((OpKind::UpdateDestination, *rs, 0));
            }
            if !rounds.dry_run {
                self.draining
                    .entry((*key, *rs))
                    .or_insert(now + self.settings.termination_grace);
            }
        }
        if !update && changes.is_empty() {
            return;
        }
        let s = if update {
            rounds.service(OpKind::UpdateService, wanted)
        } else {
            rounds.with_service(held.service(key))
        };
        for (kind, (addr, port), weight) in &changes {
            rounds.destination(*kind, s, IpvsDestination::masq(*addr, *port, *weight));
        }
        if !rounds.dry_run
            && let Some(held) = model.services.get_mut(key)
        {
            if update {
                held.scheduler = Arc::clone(self.scheduler);
                held.persistence = vs.persistence;
                held.sched_flags = sched_flags(self.scheduler);
            }
            for (kind, rs, weight) in changes {
                match kind {
                    OpKind::DeleteDestination => {
                        held.real_servers.remove(&rs);
                    }
                    _ => {
                        held.real_servers.insert(rs, HeldRealServer { weight });
                    }
                }
            }
        }
    }

    fn finish_draining(
        &mut self,
        kernel: &mut impl IpvsKernel,
        keys: &[VirtualServerKey],
        model: &mut Model,
        rounds: &mut OpRounds,
        now: Instant,
    ) -> Result<(), DataplaneError> {
        for key in keys {
            let Some(held) = model.services.get(key) else {
                continue;
            };
            let service = held.service(key);
            let counters = if rounds.dry_run {
                Vec::new()
            } else {
                kernel.destinations(&service)?
            };
            let mut done = Vec::new();
            for d in &counters {
                let rs = (d.addr, d.port);
                let Some(deadline) = self.draining.get(&(*key, rs)) else {
                    continue;
                };
                let connections = d.counters.active_connections.unwrap_or(0)
                    + d.counters.inactive_connections.unwrap_or(0);
                if d.weight == 0 && (connections == 0 || now >= *deadline) {
                    if connections > 0 {
                        warn!(service = %key, real_server = %socket_text(rs.0, rs.1), connections,
                            "grace period over: deleting a real server that still has connections");
                    }
                    done.push(rs);
                }
            }
            if done.is_empty() {
                continue;
            }
            let s = rounds.with_service(service);
            for rs in done {
                rounds.destination(
                    OpKind::DeleteDestination,
                    s,
                    IpvsDestination::masq(rs.0, rs.1, 0),
                );
                self.draining.remove(&(*key, rs));
                if let Some(held) = model.services.get_mut(key) {
                    held.real_servers.remove(&rs);
                }
            }
        }
        rounds.send(kernel)
    }
}
