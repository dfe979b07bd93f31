//! nf_tables over netlink, our own codec: tables, chains, rules with their expressions,
//! sets and maps and their elements, sent as one transaction per change and read back
//! with dumps, without an `nft` process (one costs more than a whole endpoint change at
//! 10,000 Services: `nft` reads every chain and set of every table before each
//! transaction).
//!
//! The codec is pure: [`expr`] (expressions and their data), [`objects`] (the messages
//! that create and delete objects, and the decoding of the kernel's dumps), [`batch`]
//! (a transaction); byte vectors in `agent/tests/nftables_codec.rs` check them against
//! what `nft` 1.0.6 sends, read and written again byte for byte. [`socket`] is the
//! netlink socket and [`kernel`] the trait the nftables mode talks to (its tests use the
//! real kernel, in throwaway network namespaces).
//! Constants are named after `include/uapi/linux/netfilter/nf_tables.h` ([`uapi`]).
//!
//! Wire format: see [`objects`] for messages, [`expr`] for expressions and [`batch`] for
//! transactions. Every integer attribute of nf_tables is big-endian.

pub mod batch;
pub mod error;
pub mod expr;
pub mod kernel;
pub mod monitor;
pub mod objects;
pub mod socket;
pub mod uapi;
pub mod wire;

pub use batch::Transaction;
pub use error::NftCodecError;
pub use expr::{Data, Expr, Verdict};
pub use kernel::{NetlinkNft, NftKernel, TableItem};
pub use monitor::{Heard, NftMonitor, TableAlarm, Touched};
pub use objects::{Chain, ElementData, ElementRef, Hook, Rule, Set, Table};
pub use socket::{NftNetlink, Refusal};
