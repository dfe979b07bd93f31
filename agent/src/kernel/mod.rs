//! Every conversation with the kernel, and nothing else: the netlink framing and socket,
//! the IPVS, ipset and conntrack codecs, the reader of `iptables-nft`'s nf_tables rules, links and addresses, sysctls, and the runner of
//! `iptables-save` / `iptables-restore` and the other tools, each with its fake beside it.
//!
//! Nothing here knows a plan, a proxy mode or a rule: the modes and what they share sit
//! above and import from here, never the other way round (`tests/layout.rs` checks it).

pub mod command;
pub mod conntrack;
pub mod error;
pub mod family;
pub mod ipset;
pub mod iptables;
pub mod ipvs;
pub mod link;
pub mod namespace;
pub mod netlink;
pub mod nftables;
pub mod sysctl;
pub mod xtables_nft;

/// Goes off when someone other than the agent may have changed the kernel state a mode
/// programs, so the mode's tamper check runs at once instead of at its next interval.
pub trait ChangeAlarm: Send {
    /// Blocks up to `timeout` (`None`: for ever) until such a change may have happened:
    /// true when it may have, false when the time ran out first.
    ///
    /// # Errors
    /// When the kernel cannot be listened to any more.
    fn wait(&mut self, timeout: Option<std::time::Duration>) -> std::io::Result<bool>;
}

pub use command::{CommandOutput, CommandRunner, InputWriter, Runner};
pub use error::DataplaneError;
pub use family::Family;
pub use iptables::{Backend, BackendChoice, Tool, detect_backend};
