//! A single-producer, single-consumer ring of variable-length records in shared memory.
//!
//! Records are 64-byte aligned: a 16-byte header { stamp, len | kind << 24, imm } and the
//! payload. The stamp is the record's ring position + 1, stored last (release): the consumer
//! polls the stamp at its head position, so a message costs one cache-line transfer and no
//! separate tail word (stale records of an earlier lap carry another stamp). The consumer
//! publishes its head on a line of its own; the producer keeps a cached copy and reads the real
//! one only when the ring looks full. A record that would straddle the end is preceded by a
//! skip record, so each record is contiguous and is copied straight into a receive buffer.
//! The consumer validates every header: a peer that scribbles on the ring gets a protocol
//! error, never a panic or an out-of-bounds copy.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::region::Mapping;

pub(crate) const KIND_MSG: u32 = 1;
pub(crate) const KIND_IMM: u32 = 2;
const KIND_SKIP: u32 = 3;
const HEADER: usize = 16;
const ALIGN: usize = 64;
const MAX_LEN: usize = (1 << 24) - 1;

/// One direction of a connection: control words at `ctl` (producer line, then consumer line),
/// records at `data`, `size` bytes.
#[derive(Clone, Copy)]
pub(crate) struct Ring {
    pub ctl: usize,
    pub data: usize,
    pub size: usize,
}

pub(crate) struct Record {
    pub kind: u32,
    pub imm: u32,
    pub len: usize,
    /// Offset of the payload in the mapping.
    pub payload: usize,
    /// Head position after this record.
    pub next: u64,
}

fn round(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

impl Ring {
    /// The producer's position (only the producer touches this line).
    fn tail<'a>(&self, m: &'a Mapping) -> &'a AtomicU64 {
        m.atomic_u64(self.ctl)
    }

    /// The producer's last reading of the consumer's head.
    fn cached_head<'a>(&self, m: &'a Mapping) -> &'a AtomicU64 {
        m.atomic_u64(self.ctl + 8)
    }

    fn head<'a>(&self, m: &'a Mapping) -> &'a AtomicU64 {
        m.atomic_u64(self.ctl + 64)
    }

    fn stamp<'a>(&self, m: &'a Mapping, at: usize) -> &'a AtomicU64 {
        m.atomic_u64(self.data + at)
    }

    fn publish(
        &self,
        m: &Mapping,
        at: usize,
        pos: u64,
        len: usize,
        kind: u32,
        imm: u32,
    ) -> Result<()> {
        let mut h = [0u8; 8];
        h[0..4].copy_from_slice(&(len as u32 | kind << 24).to_le_bytes());
        h[4..8].copy_from_slice(&imm.to_le_bytes());
        m.write((self.data + at + 8) as u64, &h)?;
        self.stamp(m, at).store(pos + 1, Ordering::Release);
        Ok(())
    }

    /// Appends a record whose payload is `len` bytes written by `fill(mapping, offset)`.
    /// Returns false (nothing written) when the ring lacks space.
    pub(crate) fn push(
        &self,
        m: &Mapping,
        kind: u32,
        imm: u32,
        len: usize,
        fill: impl FnOnce(&Mapping, u64) -> Result<()>,
    ) -> Result<bool> {
        let need = round(HEADER + len);
        assert!(
            need <= self.size / 2 && len <= MAX_LEN,
            "record of {len} bytes exceeds the ring's limit"
        );
        let tail = self.tail(m).load(Ordering::Relaxed);
        let idx = (tail % self.size as u64) as usize;
        let contig = self.size - idx;
        let total = if need > contig { contig + need } else { need };
        let fits = |head: u64| (self.size as u64) - (tail - head) >= total as u64;
        if !fits(self.cached_head(m).load(Ordering::Relaxed)) {
            let head = self.head(m).load(Ordering::Acquire);
            self.cached_head(m).store(head, Ordering::Relaxed);
            if !fits(head) {
                return Ok(false);
            }
        }
        let (mut pos, mut at) = (tail, idx);
        if need > contig {
            self.publish(m, at, pos, contig - HEADER, KIND_SKIP, 0)?;
            pos += contig as u64;
            at = 0;
        }
        fill(m, (self.data + at + HEADER) as u64)?;
        self.publish(m, at, pos, len, kind, imm)?;
        self.tail(m).store(pos + need as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// The oldest record, if any (skip records are consumed here).
    pub(crate) fn peek(&self, m: &Mapping) -> Result<Option<Record>> {
        loop {
            let head = self.head(m).load(Ordering::Relaxed);
            let bad = |why: &str| {
                Err(Error::Protocol {
                    peer: "local ring".into(),
                    why: why.into(),
                })
            };
            if head % ALIGN as u64 != 0 {
                return bad("ring head is misaligned");
            }
            let at = (head % self.size as u64) as usize;
            if self.stamp(m, at).load(Ordering::Acquire) != head + 1 {
                return Ok(None);
            }
            let mut h = [0u8; 8];
            m.read((self.data + at + 8) as u64, &mut h)?;
            let word = u32::from_le_bytes(h[0..4].try_into().unwrap());
            let (len, kind) = ((word & MAX_LEN as u32) as usize, word >> 24);
            let imm = u32::from_le_bytes(h[4..8].try_into().unwrap());
            let span = round(HEADER + len);
            if at + span > self.size {
                return bad("record overruns the ring");
            }
            match kind {
                KIND_SKIP => {
                    self.head(m).store(head + span as u64, Ordering::Release);
                    continue;
                }
                KIND_MSG | KIND_IMM => {
                    return Ok(Some(Record {
                        kind,
                        imm,
                        len,
                        payload: self.data + at + HEADER,
                        next: head + span as u64,
                    }));
                }
                _ => return bad("unknown record kind"),
            }
        }
    }

    pub(crate) fn consume(&self, m: &Mapping, r: &Record) {
        self.head(m).store(r.next, Ordering::Release);
    }
}
