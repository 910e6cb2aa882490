//! What the MDS asks of a client whose kernel caches names and attributes (a FUSE
//! mount): before it acknowledges a change that makes such a cache wrong, it sends
//! the change's [`Invalidation`]s to every other client that watches the inodes
//! concerned, on that client's callback connection, and waits for the answer (an empty
//! [`super::Reply`] with the same id). The client opens that connection with
//! [`super::MdsRequest::CacheLease`], which it also sends to renew its lease.

use super::{header, name, read_header, wire_kinds, Message};
use crate::codec::{ProtoError, Reader, Writer};

/// Most invalidations one [`MdsToClient::Invalidate`] carries (the MDS sends more in
/// several messages).
pub const MAX_INVALIDATIONS: usize = 1024;

/// One cache entry that is wrong from now on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Invalidation {
    /// The inode's attributes and data (its log grew).
    Inode(u64),
    /// The inode's attributes and data, and the client's watch of it ends with this
    /// callback (a file's grant is recalled once: later changes are not called back
    /// until the client watches it again, before it hands its kernel anything of it).
    Recall(u64),
    /// The name `name` in directory `parent` is gone or names another inode.
    Entry { parent: u64, name: Vec<u8> },
}

/// What the MDS asks of a client on its callback connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MdsToClient {
    /// Forget these; answer once they are forgotten.
    Invalidate { items: Vec<Invalidation> },
}

wire_kinds! {
    /// The kind byte of each [`MdsToClient`] message.
    pub enum MdsToClientKind {
        Invalidate = 96,
    }
}

impl Message for MdsToClient {
    fn encode(&self, out: &mut Vec<u8>, id: u64) {
        let mut w = Writer {
            buf: std::mem::take(out),
        };
        let MdsToClient::Invalidate { items } = self;
        header(&mut w, MdsToClientKind::Invalidate as u8, id);
        w.u32(items.len() as u32);
        for it in items {
            match it {
                Invalidation::Inode(ino) => w.u8(0).u64(*ino),
                Invalidation::Entry { parent, name } => w.u8(1).u64(*parent).bytes(name),
                Invalidation::Recall(ino) => w.u8(2).u64(*ino),
            };
        }
        *out = w.buf;
    }

    fn decode(b: &[u8]) -> Result<(u64, MdsToClient), ProtoError> {
        let mut r = Reader::new(b);
        let (kind, id) = read_header(&mut r)?;
        let MdsToClientKind::Invalidate = MdsToClientKind::try_from(kind)?;
        let n = r.u32("invalidations")? as usize;
        if n > MAX_INVALIDATIONS {
            return Err(ProtoError::Invalid("too many invalidations"));
        }
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(match r.u8("invalidation kind")? {
                0 => Invalidation::Inode(r.u64("ino")?),
                1 => Invalidation::Entry {
                    parent: r.u64("parent")?,
                    name: name(&mut r)?,
                },
                2 => Invalidation::Recall(r.u64("ino")?),
                _ => return Err(ProtoError::Invalid("invalidation kind")),
            });
        }
        r.finish()?;
        Ok((id, MdsToClient::Invalidate { items }))
    }

    fn name(&self) -> &'static str {
        "invalidate"
    }
}
