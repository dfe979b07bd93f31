//! Running kernel tools (`iptables-save`, `iptables-restore`, `iptables`, `conntrack`):
//! the [`Runner`] seam, its real implementation over processes ([`CommandRunner`], which
//! reaches conntrack over ctnetlink instead of a process) and its fake ([`fake`]).

pub mod fake;
pub mod output;
pub mod process;
pub mod runner;

pub use output::{CommandOutput, InputWriter, package_of};
pub use process::CommandRunner;
pub use runner::Runner;
