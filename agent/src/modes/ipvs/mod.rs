//! ipvs mode: a plan becomes VIPs on a dummy interface, one IPVS virtual server per
//! VIP, port and protocol, ipsets, and a fixed set of iptables rules that match them.
//!
//! - [`render`]: plan entries to addresses, virtual servers and set entries, entry by
//!   entry; [`sets`] are the mode's ipsets, [`rules`] its fixed iptables rules,
//!   [`settings`] the agent flags it takes.
//! - [`desired`]: what the plan wants, as counts kept between syncs and updated entry by
//!   entry.
//! - [`dataplane`]: the sync, against a model of what the kernel holds (`model.rs`): set
//!   changes ([`set_changes`]), VIPs, IPVS servers (`servers.rs`), the fixed rules,
//!   removals, stale conntrack entries; and the [`sysctls`] the mode needs.
//! - [`trace`]: a packet through the live rules, ipsets and IPVS (`explain`).

pub mod dataplane;
pub mod desired;
mod model;
pub mod render;
pub mod rules;
mod servers;
pub mod set_changes;
pub mod sets;
pub mod settings;
pub mod sysctls;
pub mod trace;

pub use dataplane::IpvsDataplane;
pub use settings::IpvsSettings;
