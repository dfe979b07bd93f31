//! The proxyplan agent: turns a node's merged plan into kernel state.
//!
//! The folders are the architecture, and imports point one way, down this list
//! (`tests/layout.rs` checks it):
//!
//! - [`run`]: the agent's loop (watches, syncs, status, health) over the [`dataplane`]
//!   seam, one trait that each mode implements.
//! - [`modes`]: one folder per proxy mode, its render and its sync; no mode imports
//!   another.
//! - [`ruleset`] and [`conntrack`]: what the modes share: the iptables rules the iptables
//!   and ipvs modes program, and which UDP conntrack entries a sync makes stale.
//! - [`kernel`]: every conversation with the kernel, each with its fake beside it; it
//!   imports nothing else of the agent.
//!
//! Beside them, [`explain`] says what a node does with one flow, by its merged plan
//! (`proxyplan-agent explain`, which adds the kernel's side through the modes).

pub mod conntrack;
pub mod dataplane;
pub mod explain;
pub mod kernel;
pub mod modes;
pub mod ruleset;
pub mod run;
