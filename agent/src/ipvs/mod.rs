//! ipvs mode: render a plan into IPVS virtual servers, VIPs, ipsets and a fixed set of
//! iptables rules, and sync them.

pub mod dataplane;
pub mod desired;
pub mod ipset;
pub mod ipset_netlink;
pub mod kernel;
pub mod render;
