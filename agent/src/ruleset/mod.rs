//! The iptables ruleset both the iptables and the ipvs mode program: rules as data
//! ([`rules`]), chain names ([`names`]), hashes ([`hash`]), what the kernel holds
//! ([`save`]), the diff against it and its `iptables-restore` text ([`diff`]), and the
//! reads and checks both modes make through a runner ([`tables`]), and a packet tracer
//! over the rules, with ipvs mode's ipsets and IPVS where they take part ([`trace`]).
//!
//! Every chain the agent owns begins with a no-op rule carrying a hash of the chain's
//! content (`-m comment --comment "proxyplan-rev:<hash>"`). The modes read those from
//! `iptables-save` to tell, without parsing rule syntax (which differs between the nft and
//! legacy back ends), which chains already hold what the plan wants.

pub mod diff;
pub mod hash;
pub mod local;
pub mod names;
pub mod rules;
pub mod save;
pub mod tables;
pub mod trace;

pub use local::LocalMatch;
pub use rules::{BaseJump, FamilyRules, REVISION_PREFIX, Ruleset, TableName, TableRules};
