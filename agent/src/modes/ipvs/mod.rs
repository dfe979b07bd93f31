//! ipvs mode: render a plan into IPVS virtual servers, VIPs, ipsets and a fixed set of
//! iptables rules, and sync them.

pub mod dataplane;
pub mod desired;
pub mod render;
pub mod set_changes;
