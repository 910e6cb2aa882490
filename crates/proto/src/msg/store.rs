//! What a client (or the MDS) asks a data store over two-sided messages. Reads and
//! writes of pages are one-sided and carry no message.

use orion_format::Gpa;

use super::{header, pages, put_pages, read_header, wire_kinds, Message};
use crate::codec::{ProtoError, Reader, Writer};

/// What a client asks a data store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreRequest {
    /// An empty round trip.
    Ping,
    /// Where the store's pool is (its region, and its file for a client on the same
    /// host to map).
    Info,
    /// Make every page written so far durable.
    Flush,
    /// From the MDS, on the store's own connection to it: persist these pages and
    /// report them (a `Persisted` notice), because a commit waits for them and their
    /// notice did not come (lost with a broken connection). No reply.
    Persist { pages: Vec<Gpa> },
}

wire_kinds! {
    /// The kind byte of each [`StoreRequest`].
    pub enum StoreKind {
        Ping = 64,
        Info = 65,
        Flush = 66,
        Persist = 67,
    }
}

impl StoreRequest {
    pub fn kind(&self) -> StoreKind {
        match self {
            StoreRequest::Ping => StoreKind::Ping,
            StoreRequest::Info => StoreKind::Info,
            StoreRequest::Flush => StoreKind::Flush,
            StoreRequest::Persist { .. } => StoreKind::Persist,
        }
    }
}

impl Message for StoreRequest {
    fn encode(&self, out: &mut Vec<u8>, id: u64) {
        let mut w = Writer {
            buf: std::mem::take(out),
        };
        header(&mut w, self.kind() as u8, id);
        if let StoreRequest::Persist { pages } = self {
            put_pages(&mut w, pages);
        }
        *out = w.buf;
    }

    fn decode(b: &[u8]) -> Result<(u64, StoreRequest), ProtoError> {
        let mut r = Reader::new(b);
        let (kind, id) = read_header(&mut r)?;
        let req = match StoreKind::try_from(kind)? {
            StoreKind::Ping => StoreRequest::Ping,
            StoreKind::Info => StoreRequest::Info,
            StoreKind::Flush => StoreRequest::Flush,
            StoreKind::Persist => StoreRequest::Persist {
                pages: pages(&mut r)?,
            },
        };
        r.finish()?;
        Ok((id, req))
    }

    fn name(&self) -> &'static str {
        match self.kind() {
            StoreKind::Ping => "ping",
            StoreKind::Info => "data store info",
            StoreKind::Flush => "flush",
            StoreKind::Persist => "persist pages",
        }
    }
}
