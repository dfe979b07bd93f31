//! A packet tracer over rendered rules: for the first packet of a new connection, which
//! endpoints it can reach, whether it leaves masqueraded, and whether the filter table
//! lets it through. The renderer's tests state intent with it ("from this source to this
//! address and port: these endpoints, masqueraded or not"), as kube-proxy's
//! `tracePacket` does for its own rules.
//!
//! The walk follows the kernel's order for the hooks the agent writes to:
//!
//! ```text
//! nat PREROUTING (or OUTPUT for host-originated packets)   DNAT, masquerade mark
//! filter FORWARD, INPUT or OUTPUT, with the post-DNAT destination   REJECT / DROP / ACCEPT
//! nat POSTROUTING (not for packets delivered to this node)  mark -> MASQUERADE
//! filter INPUT, for host-originated packets to a local address
//! ```
//!
//! Only the syntax the renderer emits is understood; anything else is an error when the
//! tracer is built, so a renderer change cannot slip past the tests unexamined. Built-in
//! chains hold only the agent's base jumps and otherwise accept. `-m statistic --mode
//! random` is a branch: both outcomes are explored, so a trace lists every endpoint a
//! packet can reach. `-m recent --rcheck` matches only the lists named in
//! [`Packet::recent`] (none for a first packet).
//!
//! In ipvs mode the walk also has IPVS and the ipsets ([`ipvs`]): rules match sets,
//! and IPVS, not a DNAT rule, picks the endpoint (see [`Tracer::with_ipvs`]).
//!
//! [`path`] has the packet and what a trace finds, [`rules`] reads the rules, [`walk`]
//! follows the packet through them.

pub mod ipvs;
pub mod live;
pub mod path;
pub mod rules;
pub mod walk;

#[cfg(test)]
mod tests;

pub use ipvs::{IpvsStage, VirtualKey, VirtualServer};
pub use live::live_rules;
pub use path::{Packet, TraceError, TracePath, TraceResult, Verdict};
pub use walk::{Tracer, trace};
