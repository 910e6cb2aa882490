//! The messages between the primary MDS and its mirror (Orion §3.1). The mirror
//! introduces itself on a connection of its own to the primary ([`MirrorToMds::Hello`],
//! decoded by the primary among its [`super::MdsInbound`] messages), copies the
//! primary's pool one-sided, and says so, handing over a ring in its memory
//! ([`MirrorToMds::Copied`]). From then on the primary writes what it persists into
//! that ring one-sided, as [`MdsToMirror::Apply`] entries, and acknowledges what
//! depends on them once the writes completed (or, for a mirror whose memory needs a
//! flush, once it said [`MirrorToMds::Applied`]).

use orion_fabric::RemoteRegion;

use super::{header, read_header, region, text, uuid, wire_kinds, Message};
use crate::codec::{ProtoError, Reader, Writer};

/// Most bytes of persist records and of replies, together, that one
/// [`MdsToMirror::Apply`] carries.
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
    /// It has copied the whole pool: the primary writes what it persisted since the
    /// hello into `ring` (a region of the mirror's, remotely writable). No reply.
    Copied {
        ring: RemoteRegion,
        /// A write delivered into the ring is durable there (a volatile pool, as a
        /// store's `durable_on_delivery`); otherwise the primary waits for
        /// [`MirrorToMds::Applied`].
        durable_on_delivery: bool,
    },
    /// Every ring entry before `upto` (a ring position) is applied and persisted. No
    /// reply.
    Applied { upto: u64 },
}

wire_kinds! {
    /// The kind byte of each [`MirrorToMds`] message.
    pub enum MirrorToMdsKind {
        Hello = 48,
        Copied = 49,
        Applied = 50,
    }
}

/// What the primary sends its mirror.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MdsToMirror {
    /// Persist records (`orion_pmem::tap`) to apply in order, and remembered replies
    /// to add: one entry of the mirror's ring (the cluster map lives in the cluster
    /// manager). A turn of the primary may take several entries, the last marked. The
    /// mirror applies each as it comes: the records are the primary's persists in
    /// order, so any prefix of them is a state the primary's media passed through, and
    /// a turn's replies come after the records they answer.
    Apply {
        /// Counts the primary's entries: a gap means one was lost.
        seq: u64,
        records: Vec<u8>,
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
            MirrorToMds::Copied { .. } => MirrorToMdsKind::Copied,
            MirrorToMds::Applied { .. } => MirrorToMdsKind::Applied,
        }
    }

    pub(crate) fn encode_body(&self, w: &mut Writer) {
        match self {
            MirrorToMds::Hello {
                name,
                addr,
                cluster_uuid,
            } => {
                w.bytes(name.as_bytes()).bytes(addr.as_bytes());
                w.buf.extend_from_slice(cluster_uuid);
            }
            MirrorToMds::Copied {
                ring,
                durable_on_delivery,
            } => {
                w.buf.extend_from_slice(&ring.encode());
                w.bool(*durable_on_delivery);
            }
            MirrorToMds::Applied { upto } => {
                w.u64(*upto);
            }
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
            MirrorToMdsKind::Copied => MirrorToMds::Copied {
                ring: region(r)?,
                durable_on_delivery: r.bool("durable on delivery")?,
            },
            MirrorToMdsKind::Applied => MirrorToMds::Applied {
                upto: r.u64("applied position")?,
            },
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
            MirrorToMdsKind::Applied => "mirror applied",
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
            replies,
            last,
        } = self;
        header(&mut w, MdsToMirrorKind::Apply as u8, id);
        w.u64(*seq).bytes(records).bytes(replies).bool(*last);
        *out = w.buf;
    }

    fn decode(b: &[u8]) -> Result<(u64, MdsToMirror), ProtoError> {
        let mut r = Reader::new(b);
        let (kind, id) = read_header(&mut r)?;
        let MdsToMirrorKind::Apply = MdsToMirrorKind::try_from(kind)?;
        let seq = r.u64("sequence")?;
        let records = r.bytes(MAX_APPLY_RECORDS, "persist records")?.to_vec();
        let replies = r.bytes(MAX_APPLY_RECORDS, "replies")?.to_vec();
        let last = r.bool("last")?;
        r.finish()?;
        Ok((
            id,
            MdsToMirror::Apply {
                seq,
                records,
                replies,
                last,
            },
        ))
    }

    fn name(&self) -> &'static str {
        "mirror apply"
    }
}
