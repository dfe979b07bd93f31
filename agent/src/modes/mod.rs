//! The proxy modes, one folder each: how a merged plan becomes that mode's kernel state
//! (render) and how it gets there (sync). A mode depends on what the modes share
//! ([`crate::ruleset`], [`crate::conntrack`]) and on [`crate::kernel`], never on another
//! mode.
//!
//! A new mode gets a folder of its own here. What it can take from below: which UDP
//! conntrack entries a sync makes stale ([`crate::conntrack::UdpTracker`]) and their
//! deletion over ctnetlink ([`crate::kernel::command::CommandRunner`]), sysctls
//! ([`crate::kernel::sysctl`]), links and addresses ([`crate::kernel::link`]), the
//! netlink framing and socket for a codec of its own ([`crate::kernel::netlink`]), and
//! the [`crate::dataplane::Dataplane`] trait it implements for `run/`.

pub mod iptables;
pub mod ipvs;
pub mod nftables;
