//! The conntrack table: UDP entries as [`flows`], listed and deleted over ctnetlink
//! ([`netlink`], our own codec) or, by a [`crate::kernel::command::Runner`] that does not
//! know better, with the `conntrack` tool ([`tool`]). Which entries are stale is decided
//! above, in [`crate::conntrack`].

pub mod flows;
pub mod netlink;
pub mod sysctls;
pub mod tool;

pub use flows::{Backend, CONNTRACK, Destination, Flow, StaleFlows};
pub use netlink::ConntrackNetlink;
pub use sysctls::{ConntrackSysctls, SysctlOutcome};
pub use tool::parse_listing;
