//! A single-producer, single-consumer ring of variable-length records in shared memory.
//!
//! Counters are monotonic byte positions; the producer owns `tail`, the consumer `head`, each
//! on its own cache line. Records are 64-byte aligned: a 16-byte header { len, kind, imm } and
//! the payload. A record that would straddle the end is preceded by a skip record, so each
//! record is contiguous and can be copied straight into a posted receive buffer.
//! The consumer validates every header it reads: a peer that scribbles on the ring gets a
//! protocol error, never a panic or an out-of-bounds copy.

use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::region::Mapping;

pub(crate) const KIND_MSG: u32 = 1;
pub(crate) const KIND_IMM: u32 = 2;
const KIND_SKIP: u32 = 3;
const HEADER: usize = 16;
const ALIGN: usize = 64;

/// One direction of a connection: control words at `ctl`, data at `data`, `size` bytes.
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
    fn tail<'a>(&self, m: &'a Mapping) -> &'a std::sync::atomic::AtomicU64 {
        m.atomic_u64(self.ctl)
    }

    fn head<'a>(&self, m: &'a Mapping) -> &'a std::sync::atomic::AtomicU64 {
        m.atomic_u64(self.ctl + 64)
    }

    fn header(&self, m: &Mapping, at: usize, len: usize, kind: u32, imm: u32) -> Result<()> {
        let mut h = [0u8; HEADER];
        h[0..4].copy_from_slice(&(len as u32).to_le_bytes());
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[8..12].copy_from_slice(&imm.to_le_bytes());
        m.write((self.data + at) as u64, &h)
    }

    /// Appends a record whose payload is `len` bytes written by `fill(mapping, offset)`.
    /// Returns false (nothing written) when the ring lacks space.
    pub(crate) fn push(&self, m: &Mapping, kind: u32, imm: u32, len: usize, fill: impl FnOnce(&Mapping, u64) -> Result<()>) -> Result<bool> {
        let need = round(HEADER + len);
        assert!(need <= self.size / 2, "record of {len} bytes exceeds the ring's limit");
        let tail = self.tail(m).load(Ordering::Relaxed);
        let head = self.head(m).load(Ordering::Acquire);
        let idx = (tail % self.size as u64) as usize;
        let contig = self.size - idx;
        let total = if need > contig { contig + need } else { need };
        if (self.size as u64) - (tail - head) < total as u64 {
            return Ok(false);
        }
        let (mut pos, mut at) = (tail, idx);
        if need > contig {
            self.header(m, at, contig - HEADER, KIND_SKIP, 0)?;
            pos += contig as u64;
            at = 0;
        }
        fill(m, (self.data + at + HEADER) as u64)?;
        self.header(m, at, len, kind, imm)?;
        self.tail(m).store(pos + need as u64, Ordering::Release);
        Ok(true)
    }

    /// The oldest record, if any (skip records are consumed here).
    pub(crate) fn peek(&self, m: &Mapping) -> Result<Option<Record>> {
        loop {
            let head = self.head(m).load(Ordering::Relaxed);
            let tail = self.tail(m).load(Ordering::Acquire);
            if head == tail {
                return Ok(None);
            }
            let bad = |why: &str| Err(Error::Protocol { peer: "local ring".into(), why: why.into() });
            if tail < head || tail - head > self.size as u64 || head % ALIGN as u64 != 0 {
                return bad("ring positions are inconsistent");
            }
            let at = (head % self.size as u64) as usize;
            let mut h = [0u8; HEADER];
            m.read((self.data + at) as u64, &mut h)?;
            let len = u32::from_le_bytes(h[0..4].try_into().unwrap()) as usize;
            let kind = u32::from_le_bytes(h[4..8].try_into().unwrap());
            let imm = u32::from_le_bytes(h[8..12].try_into().unwrap());
            let span = round(HEADER + len);
            if at + span > self.size || span as u64 > tail - head {
                return bad("record overruns the ring");
            }
            match kind {
                KIND_SKIP => {
                    self.head(m).store(head + span as u64, Ordering::Release);
                    continue;
                }
                KIND_MSG | KIND_IMM => {
                    return Ok(Some(Record { kind, imm, len, payload: self.data + at + HEADER, next: head + span as u64 }));
                }
                _ => return bad("unknown record kind"),
            }
        }
    }

    pub(crate) fn consume(&self, m: &Mapping, r: &Record) {
        self.head(m).store(r.next, Ordering::Release);
    }
}
