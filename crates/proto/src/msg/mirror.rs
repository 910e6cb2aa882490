//! The messages between the primary MDS and its mirror (Orion §3.1). The mirror
//! introduces itself on a connection of its own to the primary ([`MirrorToMds::Hello`],
//! decoded by the primary among its [`super::MdsInbound`] messages), copies the
//! primary's pool one-sided, says so ([`MirrorToMds::Copied`]), and from then on the
//! primary sends what it persists on the same connection ([`MdsToMirror::Apply`]),
//! waiting for each answer before it acknowledges anything that depends on it.

use super::{header, read_header, text, uuid, wire_kinds, Message};
use crate::codec::{ProtoError, Reader, Writer};

/// Most bytes of persist records, of the cluster map, and of replies, together, that one
/// [`MdsToMirror::Apply`] carries (it fits a message).
pub const MAX_APPLY_RECORDS: usize = 60 * 1024;

/// What a mirror tells the primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MirrorToMds {
    /// "I mirror you": answered with [`super::ReplyBody::MirrorStart`], or refused.
    Hello {
        /// Its name for the cluster manager.
        name: String,
        /// Where it listens (the address it will serve at as primary).
        addr: String,
        /// The cluster of the pool it holds; all zeros for an empty pool. A mirror whose
        /// pool belongs to another cluster is refused: copying over it would destroy
        /// that cluster's metadata.
        cluster_uuid: [u8; 16],
    },
    /// It has copied the whole pool: the primary sends what it persisted since the
    /// hello. No reply.
    Copied,
}

wire_kinds! {
    /// The kind byte of each [`MirrorToMds`] message.
    pub enum MirrorToMdsKind {
        Hello = 48,
        Copied = 49,
    }
}

/// What the primary sends its mirror.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MdsToMirror {
    /// Persist records (`orion_pmem::tap`) to apply in order, the cluster map file
    /// (when it changed) and remembered replies to add. A turn of the primary may take
    /// several messages; the mirror applies them together when the `last` one comes,
    /// so a primary that dies in the middle of sending a turn leaves none of it (the
    /// replies it remembers never come without the updates they answer). Each message
    /// is answered; the last once everything is in the pool.
    Apply {
        /// Counts the primary's messages: a gap means one was lost.
        seq: u64,
        records: Vec<u8>,
        members: Option<Vec<u8>>,
        replies: Vec<u8>,
        last: bool,
    },
}

wire_kinds! {
    /// The kind byte of each [`MdsToMirror`] message.
    pub enum MdsToMirrorKind {
        Apply = 56,
    }
}

impl MirrorToMds {
    pub fn kind(&self) -> MirrorToMdsKind {
        match self {
            MirrorToMds::Hello { .. } => MirrorToMdsKind::Hello,
            MirrorToMds::Copied => MirrorToMdsKind::Copied,
        }
    }

    pub(crate) fn encode_body(&self, w: &mut Writer) {
        if let MirrorToMds::Hello {
            name,
            addr,
            cluster_uuid,
        } = self
        {
            w.bytes(name.as_bytes()).bytes(addr.as_bytes());
            w.buf.extend_from_slice(cluster_uuid);
        }
    }

    pub(crate) fn decode_body(
        kind: MirrorToMdsKind,
        r: &mut Reader,
    ) -> Result<MirrorToMds, ProtoError> {
        Ok(match kind {
            MirrorToMdsKind::Hello => MirrorToMds::Hello {
                name: text(r, "mirror name")?,
                addr: text(r, "mirror address")?,
                cluster_uuid: uuid(r)?,
            },
            MirrorToMdsKind::Copied => MirrorToMds::Copied,
        })
    }
}

impl Message for MirrorToMds {
    fn encode(&self, out: &mut Vec<u8>, id: u64) {
        let mut w = Writer {
            buf: std::mem::take(out),
        };
        header(&mut w, self.kind() as u8, id);
        self.encode_body(&mut w);
        *out = w.buf;
    }

    fn decode(b: &[u8]) -> Result<(u64, MirrorToMds), ProtoError> {
        let mut r = Reader::new(b);
        let (kind, id) = read_header(&mut r)?;
        let m = MirrorToMds::decode_body(MirrorToMdsKind::try_from(kind)?, &mut r)?;
        r.finish()?;
        Ok((id, m))
    }

    fn name(&self) -> &'static str {
        match self.kind() {
            MirrorToMdsKind::Hello => "mirror hello",
            MirrorToMdsKind::Copied => "mirror copied",
        }
    }
}

impl Message for MdsToMirror {
    fn encode(&self, out: &mut Vec<u8>, id: u64) {
        let mut w = Writer {
            buf: std::mem::take(out),
        };
        let MdsToMirror::Apply {
            seq,
            records,
            members,
            replies,
            last,
        } = self;
        header(&mut w, MdsToMirrorKind::Apply as u8, id);
        w.u64(*seq).bytes(records).bool(members.is_some());
        if let Some(m) = members {
            w.bytes(m);
        }
        w.bytes(replies).bool(*last);
        *out = w.buf;
    }

    fn decode(b: &[u8]) -> Result<(u64, MdsToMirror), ProtoError> {
        let mut r = Reader::new(b);
        let (kind, id) = read_header(&mut r)?;
        let MdsToMirrorKind::Apply = MdsToMirrorKind::try_from(kind)?;
        let seq = r.u64("sequence")?;
        let records = r.bytes(MAX_APPLY_RECORDS, "persist records")?.to_vec();
        let members = if r.bool("members")? {
            Some(r.bytes(MAX_APPLY_RECORDS, "cluster map")?.to_vec())
        } else {
            None
        };
        let replies = r.bytes(MAX_APPLY_RECORDS, "replies")?.to_vec();
        let last = r.bool("last")?;
        r.finish()?;
        Ok((
            id,
            MdsToMirror::Apply {
                seq,
                records,
                members,
                replies,
                last,
            },
        ))
    }

    fn name(&self) -> &'static str {
        "mirror apply"
    }
}
