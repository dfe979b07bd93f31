//! iptables mode: per-service and per-endpoint chains with statistic-mode balancing and
//! `recent` affinity.
//!
//! - [`mod@render`]: a merged plan to rules ([`settings`]: the agent flags it takes); the
//!   fixed chains are built in `builder.rs`, one entry's chains in `entry.rs`.
//! - [`cache`]: what a sync leaves in the kernel, remembered without rule text (its
//!   records in `groups.rs`), and the [`cache::RenderCache`] built on it.
//! - [`dataplane`]: the sync, one `iptables-restore --noflush` per family carrying only
//!   the changed chains (`delta.rs` computes and streams them).
//! - [`trace`]: a packet tracer over iptables rules, for the renderer's tests and
//!   `explain` (it lives in [`crate::ruleset`], shared with ipvs mode).

mod builder;
pub mod cache;
pub mod dataplane;
mod delta;
mod entry;
mod groups;
pub mod render;
pub mod settings;
pub use crate::ruleset::trace;

pub use dataplane::IptablesDataplane;
pub use render::render;
pub use settings::RenderSettings;
