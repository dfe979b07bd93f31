//! IPVS over generic netlink: the message types and the byte-level codec.
//!
//! IPVS has no rtnetlink interface; it is the generic-netlink family `"IPVS"` whose id is
//! assigned at module load and resolved with `CTRL_CMD_GETFAMILY`. The codec is pure:
//! [`mod@encode`] turns requests into bytes and [`mod@decode`] kernel replies into typed values
//! ([`message`], [`types`], the constants of [`uapi`]), on the netlink framing of
//! [`crate::kernel::netlink`]; the socket lives at the edge. [`node`] has [`IpvsKernel`],
//! everything the ipvs mode asks of the kernel, with its real implementation over netlink
//! and, in [`fake`], its fake.

pub mod decode;
pub mod encode;
pub mod fake;
pub mod message;
pub mod node;
pub mod types;
pub mod uapi;

#[cfg(all(test, target_endian = "little"))]
mod tests;

pub use decode::{decode, family_id_from_reply};
pub use encode::{encode, encode_message, encode_messages};
pub use fake::FakeIpvsKernel;
pub use message::{ControlMessage, IpvsCodecError, NetlinkBody, NetlinkMessage};
pub use node::{IpvsKernel, IpvsOp, NetlinkKernel};
pub use types::{
    IpvsAttributes, IpvsDestination, IpvsDestinationCounters, IpvsService, IpvsStats, IpvsTimeouts,
    IpvsTunnel, describe_service, protocol_name, socket_text,
};
pub use uapi::*;
