//! `orion-proto`: the messages clients, the metadata server and data stores exchange
//! over the fabric (two-sided SENDs; one-sided reads and writes carry no message).
//!
//! Every message starts with a header that names its kind and a request id the reply
//! echoes, so a reply identifies the request it answers (Octopus's self-identified
//! RPCs). [`decode_request`] and [`decode_reply`] take untrusted bytes and return an
//! error, never panic. The crate knows message shapes only: no file system, no network.

pub mod channel;
mod codec;
mod msg;

pub use channel::{Channel, Event};
pub use codec::{ProtoError, Reader, Writer};
pub use msg::*;

/// Magic of every message ("OR") and the protocol version both ends must speak.
pub const MAGIC: u16 = 0x524F;
/// Version 2: messages by service, with disjoint kind numbers.
pub const VERSION: u8 = 2;
/// Bytes of the header: magic, version, kind, pad, request id.
pub const HEADER: usize = 16;
