//! An in-memory [`IpvsKernel`] for tests, in the spirit of kube-proxy's
//! `pkg/proxy/ipvs/util/testing`: IPVS services and real servers with connection
//! counters the test sets, interfaces and addresses, and sysctls. Every IPVS operation is
//! recorded.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::node::{IpvsKernel, IpvsOp};
use super::types::{IpvsDestination, IpvsService, IpvsTimeouts};
use crate::kernel::error::DataplaneError;
use crate::kernel::ipset::message::SetOp;
use crate::kernel::ipset::sets::{IpSet, Sets};
use crate::kernel::link::InterfaceAddress;

type ServiceKey = (u16, IpAddr, u16);
/// A service and its real servers by address and port.
pub type HeldService = (IpvsService, BTreeMap<(IpAddr, u16), IpvsDestination>);

fn key(s: &IpvsService) -> ServiceKey {
    (s.protocol, s.addr, s.port)
}

/// The fake kernel.
#[derive(Debug, Clone, Default)]
pub struct FakeIpvsKernel {
    /// Virtual services with their real servers.
    pub services: BTreeMap<ServiceKey, HeldService>,
    /// Interfaces by name → index.
    pub links: BTreeMap<String, u32>,
    /// Addresses.
    pub addresses: Vec<InterfaceAddress>,
    /// Sysctls.
    pub sysctls: BTreeMap<String, String>,
    /// ipsets.
    pub sets: Sets,
    /// Every IPVS operation executed, as text.
    pub log: Vec<String>,
    /// IPVS's connection timeouts (a fresh kernel's 900 / 120 / 300 s from [`Self::new`]).
    pub timeouts: IpvsTimeouts,
}

impl FakeIpvsKernel {
    /// A kernel with the IPVS sysctls at their boot defaults and one node address on
    /// interface 2.
    #[must_use]
    pub fn new(node_address: IpAddr) -> Self {
        let mut sysctls = BTreeMap::new();
        for name in [
            "net/ipv4/vs/conntrack",
            "net/ipv4/vs/expire_nodest_conn",
            "net/ipv4/vs/expire_quiescent_template",
            "net/ipv4/ip_forward",
            "net/ipv4/conf/all/arp_ignore",
            "net/ipv4/conf/all/arp_announce",
        ] {
            sysctls.insert(name.to_owned(), "0".to_owned());
        }
        sysctls.insert("net/ipv4/vs/conn_reuse_mode".to_owned(), "1".to_owned());
        sysctls.insert("kernel/osrelease".to_owned(), "6.1.0-fake".to_owned());
        Self {
            links: BTreeMap::from([("lo".to_owned(), 1), ("eth0".to_owned(), 2)]),
            addresses: vec![InterfaceAddress {
                index: 2,
                ip: node_address,
                prefix_len: 24,
            }],
            sysctls,
            timeouts: IpvsTimeouts {
                tcp: 900,
                tcp_fin: 120,
                udp: 300,
            },
            ..Self::default()
        }
    }

    /// Sets the connection counters of a real server.
    pub fn set_connections(&mut self, service: (u16, IpAddr, u16), rs: (IpAddr, u16), active: u32) {
        if let Some((_, dests)) = self.services.get_mut(&service)
            && let Some(d) = dests.get_mut(&rs)
        {
            d.counters.active_connections = Some(active);
            d.counters.inactive_connections = Some(0);
        }
    }

    /// A real server's weight, if it exists.
    #[must_use]
    pub fn weight(&self, service: (u16, IpAddr, u16), rs: (IpAddr, u16)) -> Option<u32> {
        self.services
            .get(&service)
            .and_then(|(_, d)| d.get(&rs))
            .map(|d| d.weight)
    }

    fn run(&mut self, op: &IpvsOp<'_>) -> i32 {
        self.log.push(op.to_string());
        match *op {
            IpvsOp::AddService(s) => {
                if self.services.contains_key(&key(s)) {
                    return -17;
                }
                self.services.insert(key(s), (s.clone(), BTreeMap::new()));
            }
            IpvsOp::UpdateService(s) => match self.services.get_mut(&key(s)) {
                Some(held) => held.0 = s.clone(),
                None => return -3,
            },
            IpvsOp::DeleteService(s) => {
                if self.services.remove(&key(s)).is_none() {
                    return -3;
                }
            }
            IpvsOp::AddDestination(s, d) => {
                let Some((_, dests)) = self.services.get_mut(&key(s)) else {
                    return -3;
                };
                if dests.contains_key(&(d.addr, d.port)) {
                    return -17;
                }
                let mut d = d.clone();
                d.counters.active_connections = Some(0);
                d.counters.inactive_connections = Some(0);
                dests.insert((d.addr, d.port), d);
            }
            IpvsOp::UpdateDestination(s, d) => {
                let Some(held) = self
                    .services
                    .get_mut(&key(s))
                    .and_then(|(_, dests)| dests.get_mut(&(d.addr, d.port)))
                else {
                    return -2;
                };
                held.weight = d.weight;
            }
            IpvsOp::DeleteDestination(s, d) => {
                let Some((_, dests)) = self.services.get_mut(&key(s)) else {
                    return -3;
                };
                if dests.remove(&(d.addr, d.port)).is_none() {
                    return -2;
                }
            }
        }
        0
    }
}

impl IpvsKernel for FakeIpvsKernel {
    fn services(&mut self) -> Result<Vec<IpvsService>, DataplaneError> {
        Ok(self.services.values().map(|(s, _)| s.clone()).collect())
    }

    fn destinations(
        &mut self,
        service: &IpvsService,
    ) -> Result<Vec<IpvsDestination>, DataplaneError> {
        Ok(self
            .services
            .get(&key(service))
            .map(|(_, d)| d.values().cloned().collect())
            .unwrap_or_default())
    }

    fn execute(&mut self, ops: &[IpvsOp<'_>]) -> Result<Vec<i32>, DataplaneError> {
        Ok(ops.iter().map(|op| self.run(op)).collect())
    }

    /// As the kernel: only the non-zero values change.
    fn set_timeouts(&mut self, timeouts: IpvsTimeouts) -> Result<(), DataplaneError> {
        self.log.push(format!(
            "set timeouts {} {} {}",
            timeouts.tcp, timeouts.tcp_fin, timeouts.udp
        ));
        for (held, wanted) in [
            (&mut self.timeouts.tcp, timeouts.tcp),
            (&mut self.timeouts.tcp_fin, timeouts.tcp_fin),
            (&mut self.timeouts.udp, timeouts.udp),
        ] {
            if wanted > 0 {
                *held = wanted;
            }
        }
        Ok(())
    }

    fn timeouts(&mut self) -> Result<IpvsTimeouts, DataplaneError> {
        Ok(self.timeouts)
    }

    fn link_index(&mut self, name: &str) -> Result<Option<u32>, DataplaneError> {
        Ok(self.links.get(name).copied())
    }

    fn create_dummy(&mut self, name: &str) -> Result<u32, DataplaneError> {
        let index = self.links.values().max().copied().unwrap_or(0) + 1;
        self.links.insert(name.to_owned(), index);
        Ok(index)
    }

    fn delete_link(&mut self, index: u32) -> Result<(), DataplaneError> {
        self.links.retain(|_, i| *i != index);
        self.addresses.retain(|a| a.index != index);
        Ok(())
    }

    fn addresses(&mut self) -> Result<Vec<InterfaceAddress>, DataplaneError> {
        Ok(self.addresses.clone())
    }

    fn change_addresses(
        &mut self,
        index: u32,
        addresses: &[IpAddr],
        add: bool,
    ) -> Result<Vec<i32>, DataplaneError> {
        Ok(addresses
            .iter()
            .map(|ip| {
                let held = self
                    .addresses
                    .iter()
                    .position(|a| a.index == index && a.ip == *ip);
                match (add, held) {
                    (true, Some(_)) => -17,
                    (true, None) => {
                        self.addresses.push(InterfaceAddress {
                            index,
                            ip: *ip,
                            prefix_len: if ip.is_ipv4() { 32 } else { 128 },
                        });
                        0
                    }
                    (false, Some(i)) => {
                        self.addresses.remove(i);
                        0
                    }
                    (false, None) => -99,
                }
            })
            .collect())
    }

    fn read_sysctl(&mut self, name: &str) -> Result<Option<String>, DataplaneError> {
        Ok(self.sysctls.get(name).cloned())
    }

    fn write_sysctl(&mut self, name: &str, value: &str) -> Result<(), DataplaneError> {
        self.sysctls.insert(name.to_owned(), value.to_owned());
        Ok(())
    }

    /// The kernel's answers: an identical set created again, an entry added again and a
    /// missing set destroyed are done (0); another set of the same name is `EEXIST`, a
    /// missing set `ENOENT`, a missing entry deleted `IPSET_ERR_EXIST`.
    fn set_ops(&mut self, ops: &[SetOp<'_>]) -> Result<Vec<i32>, DataplaneError> {
        const ENOENT: i32 = -2;
        const EEXIST: i32 = -17;
        const IPSET_ERR_EXIST: i32 = -4103;
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            let errno = match *op {
                SetOp::Create { name, spec } => match self.sets.get(name) {
                    Some(set) if set.spec != spec => EEXIST,
                    Some(_) => 0,
                    None => {
                        self.sets
                            .insert(name.to_owned(), IpSet::new(spec.kind, spec.ipv6));
                        0
                    }
                },
                SetOp::Destroy(name) => {
                    self.sets.remove(name);
                    0
                }
                SetOp::Add(name, entry) => match self.sets.get_mut(name) {
                    Some(set) => {
                        set.entries.insert(entry);
                        0
                    }
                    None => ENOENT,
                },
                SetOp::Del(name, entry) => match self.sets.get_mut(name) {
                    Some(set) => {
                        if set.entries.remove(&entry) {
                            0
                        } else {
                            IPSET_ERR_EXIST
                        }
                    }
                    None => ENOENT,
                },
            };
            out.push(errno);
        }
        Ok(out)
    }

    fn sets(&mut self) -> Result<Sets, DataplaneError> {
        Ok(self.sets.clone())
    }

    fn set_names(&mut self) -> Result<Vec<String>, DataplaneError> {
        Ok(self.sets.keys().cloned().collect())
    }
}
