//! iptables mode: per-service and per-endpoint chains rendered from a merged plan
//! ([`render`]), remembered between syncs without their text ([`cache`]) and synced
//! through `iptables-restore` ([`dataplane`]); [`trace`] follows a packet through them.

pub mod cache;
pub mod dataplane;
pub mod render;
pub mod trace;

pub use dataplane::IptablesDataplane;
pub use render::{RenderSettings, render};
