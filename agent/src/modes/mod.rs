//! The proxy modes, one folder each: how a merged plan becomes that mode's kernel state
//! (render) and how it gets there (sync). A mode depends on what the modes share
//! ([`crate::ruleset`], [`crate::conntrack`]) and on [`crate::kernel`], never on another
//! mode.

pub mod iptables;
pub mod ipvs;
