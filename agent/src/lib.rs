//! The proxyplan agent: turns a node's merged plan into kernel state.
//!
//! [`iptables`] renders the desired rules as data (pure); the appliers at the edge diff
//! that against the kernel and send only the difference.

pub mod conntrack;
pub mod dataplane;
pub mod iptables;
pub mod ipvs;
pub mod kernel;
pub mod ruleset;
pub mod run;
