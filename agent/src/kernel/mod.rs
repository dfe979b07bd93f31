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

pub use command::{CommandOutput, CommandRunner, InputWriter, Runner};
pub use error::DataplaneError;
pub use family::Family;
pub use iptables::{Backend, BackendChoice, Tool, detect_backend};
