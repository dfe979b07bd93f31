//! Netlink as our own codecs speak it: the framing every message shares
//! ([`frame`]: headers, attributes, the `netlink.h` constants) and a blocking socket
//! that sends requests in batches and collects acks and dumps ([`socket`]).
//!
//! Links and addresses do not go through here: they use the `rtnetlink` crate
//! ([`super::link`]).

pub mod frame;
pub mod socket;
