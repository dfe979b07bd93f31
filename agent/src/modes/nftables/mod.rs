//! nftables mode: one table of the agent's own per family (`table ip proxyplan`,
//! `table ip6 proxyplan`), with sets and verdict maps for O(1) dispatch, programmed
//! over netlink by difference.
//!
//! - [`layout`]: the table's fixed shape (sets, base chains, the shared balancing
//!   chains); [`names`]: object names; [`rules`]: rules as data, lowered to the kernel's
//!   expressions; [`settings`]: the agent flags the mode takes.
//! - [`render`]: one plan entry to the elements, chains and maps it adds.
//! - [`desired`]: owners and counts kept between syncs; [`model`]: what the kernel holds,
//!   read back; [`diff`]: the changes, from scratch or entry by entry, written to a
//!   [`sink`] that sends them as transactions.
//! - [`dataplane`]: the sync; [`probe`](mod@probe): whether the kernel takes what the mode writes
//!   (for `--mode auto`).
//! - [`trace`]: a new connection traced through the live table, for `explain`.

pub mod dataplane;
pub mod desired;
pub mod diff;
pub mod layout;
pub mod model;
pub mod names;
pub mod probe;
pub mod render;
pub mod rules;
pub mod settings;
pub mod sink;
pub mod trace;

pub use dataplane::NftablesDataplane;
pub use probe::probe;
pub use settings::NftablesSettings;
