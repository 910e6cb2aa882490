//! `orion-proto`: the messages clients, the metadata server and data stores exchange
//! over the fabric (two-sided SENDs; one-sided reads and writes carry no message).
//!
//! Messages come in one family per service: what a client asks the MDS
//! ([`MdsRequest`]), what a data store tells it ([`StoreToMds`]; the MDS's listener
//! decodes both as [`MdsInbound`]), what a client asks a data store ([`StoreRequest`]),
//! and the [`Reply`] every service answers with. Every message starts with a header
//! that names its kind and a request id the reply echoes, so a reply identifies the
//! request it answers (Octopus's self-identified RPCs). [`Message::decode`] and
//! [`decode_reply`] take untrusted bytes and return an error, never panic. The crate
//! knows message shapes only: no file system, no network.

pub mod channel;
mod codec;
mod msg;
pub mod open_table;

pub use channel::{Channel, Event};
pub use codec::{ProtoError, Reader, Writer};
pub use msg::*;

/// Magic of every message ("OR") and the protocol version both ends must speak.
pub const MAGIC: u16 = 0x524F;
/// Version 16: the cluster map names the pool of each store on the client's host
/// (`StoreInfo::pool_path`, `pool_uuid`; `DsHello::pool_path`; both hellos carry their
/// sender's host), and the MDS tells a
/// store its heartbeat period (`ReplyBody::Joined::heartbeat_ms`); 15: a callback
/// may recall a file's watch (`Invalidation::Recall`); 14: an inode's attributes
/// carry its slot generation; 13: a
/// client says when it wrote its whole open table (`MdsRequest::OpenTableWritten`),
/// which a new MDS waits for; 12: open tables (`open_table`) keep every client's
/// open files through another's unlink; 11: a rename by a client that holds its
/// target open keeps the target; 10: callbacks that keep clients' kernel caches
/// true).
pub const VERSION: u8 = 16;
/// Bytes of the header: magic, version, kind, pad, request id.
pub const HEADER: usize = 16;

/// This host's identity for the cluster map: its boot id (the kernel draws one
/// per boot; every process and container of the host reads the same), all zeros
/// where there is none (then no map names a pool file to this host's clients).
pub fn this_host() -> [u8; 16] {
    static HOST: std::sync::OnceLock<[u8; 16]> = std::sync::OnceLock::new();
    *HOST.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let hex: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
        let mut id = [0u8; 16];
        if hex.len() == 32 {
            for (i, pair) in hex.chunks(2).enumerate() {
                let digits = std::str::from_utf8(pair).unwrap_or("00");
                id[i] = u8::from_str_radix(digits, 16).unwrap_or(0);
            }
        }
        id
    })
}

/// The MDS addresses of a client's or a data store's `mds` setting: the primary and its
/// mirror, comma-separated, in any order (a fail-over moves the role between them).
pub fn mds_addresses(setting: &str) -> Vec<String> {
    setting
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect()
}
