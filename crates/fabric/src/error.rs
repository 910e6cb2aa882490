//! Errors of the fabric: values, never panics.

use std::fmt;

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("remote key {key:#x} is unknown to the target or was revoked")]
    UnknownKey { key: u64 },
    #[error("access of {len} bytes at offset {offset} is outside a region of {region_len} bytes")]
    OutOfBounds {
        offset: u64,
        len: u64,
        region_len: u64,
    },
    #[error("the region does not allow {0}")]
    AccessDenied(&'static str),
    #[error("the target refused the remote access: {0}")]
    RemoteAccess(String),
    #[error("peer {peer} is gone ({why})")]
    PeerGone { peer: String, why: String },
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    #[error("authentication with {peer} failed: {why}")]
    AuthFailed { peer: String, why: String },
    #[error("peer {peer} is at cluster epoch {theirs}, this node at {ours}")]
    EpochMismatch {
        peer: String,
        ours: u64,
        theirs: u64,
    },
    #[error("message of {len} bytes exceeds the limit of {max}")]
    MessageTooLarge { len: usize, max: usize },
    #[error("message of {len} bytes does not fit the posted receive buffer of {cap}")]
    RecvTooSmall { len: usize, cap: usize },
    #[error("the region belongs to another domain")]
    ForeignRegion,
    #[error("malformed message from {peer}: {why}")]
    Protocol { peer: String, why: String },
    #[error("{call} failed: {msg} ({code})")]
    Provider {
        call: &'static str,
        code: i32,
        msg: String,
    },
    #[error("no fabric device for provider {provider}: {detail}")]
    NoDevice { provider: String, detail: String },
    #[error("{0}")]
    Io(IoError),
    #[error("the connection is closed")]
    Closed,
    #[error("fault injected by the mock fabric: {0}")]
    Injected(&'static str),
}

/// An `std::io::Error` flattened so that [`Error`] stays `Clone + Eq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoError {
    pub kind: std::io::ErrorKind,
    pub what: String,
}

impl fmt::Display for IoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

impl Error {
    pub(crate) fn io(what: impl fmt::Display, e: std::io::Error) -> Error {
        Error::Io(IoError {
            kind: e.kind(),
            what: format!("{what}: {e}"),
        })
    }

    /// A peer sent more than the posted receive buffer holds: the connection is closed.
    pub(crate) fn oversized(peer: &str) -> Error {
        Error::Protocol {
            peer: peer.to_string(),
            why: "sent a message larger than the posted receive buffer; connection closed".into(),
        }
    }

    pub(crate) fn gone(peer: &str, why: impl Into<String>) -> Error {
        Error::PeerGone {
            peer: peer.to_string(),
            why: why.into(),
        }
    }

    /// True when the connection this error came from can no longer be used.
    pub fn is_fatal_to_connection(&self) -> bool {
        matches!(self, Error::PeerGone { .. } | Error::Closed)
    }
}
