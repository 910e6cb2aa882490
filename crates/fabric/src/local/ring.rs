//! A single-producer, single-consumer ring of variable-length records in shared memory.
//!
//! Records are 64-byte aligned: a 16-byte header { stamp, len | kind << 24, imm } and the
//! payload. The stamp is the record's ring position + 1, stored last (release): the consumer
//! polls the stamp at its head position, so a message costs one cache-line transfer and no
//! separate tail word (stale records of an earlier lap carry another stamp). The consumer
//! publishes its head on a line of its own; the producer keeps a cached copy and reads the real
//! one only when the ring looks full. Before publishing a record the producer zeroes the stamp
//! word where the next record will start (one line is kept free for it), so bytes left from an
//! earlier lap can never pass for a record. A record that would straddle the end is preceded by a
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
        // Room for the record(s) plus the line whose stamp is cleared for the next record.
        // The head is written by the peer: positions that make no sense are its fault.
        let room = |head: u64| -> Result<bool> {
            match tail.checked_sub(head) {
                Some(used) if used <= self.size as u64 => {
                    Ok(self.size as u64 - used >= (total + ALIGN) as u64)
                }
                _ => Err(Error::Protocol {
                    peer: "local ring".into(),
                    why: "the consumer's head is inconsistent".into(),
                }),
            }
        };
        if !room(self.cached_head(m).load(Ordering::Relaxed))? {
            let head = self.head(m).load(Ordering::Acquire);
            self.cached_head(m).store(head, Ordering::Relaxed);
            if !room(head)? {
                return Ok(false);
            }
        }
        // Room is granted only for what the ring can hold besides the cleared line.
        debug_assert!(
            total + ALIGN <= self.size,
            "room granted for {total} bytes in a ring of {}",
            self.size
        );
        let (mut pos, mut at) = (tail, idx);
        if need > contig {
            self.publish(m, at, pos, contig - HEADER, KIND_SKIP, 0)?;
            pos += contig as u64;
            at = 0;
        }
        // Past a skip record the record starts the ring; else it fit before the end.
        debug_assert!(
            at + need <= self.size,
            "a record of {need} bytes at {at} would straddle the ring's end"
        );
        let end = pos + need as u64;
        self.stamp(m, (end % self.size as u64) as usize)
            .store(0, Ordering::Relaxed);
        fill(m, (self.data + at + HEADER) as u64)?;
        self.publish(m, at, pos, len, kind, imm)?;
        self.tail(m).store(end, Ordering::Relaxed);
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
            if !head.is_multiple_of(ALIGN as u64) {
                return bad("ring head is misaligned");
            }
            let at = (head % self.size as u64) as usize;
            if self.stamp(m, at).load(Ordering::Acquire) != head.wrapping_add(1) {
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
                    self.head(m)
                        .store(head.wrapping_add(span as u64), Ordering::Release);
                    continue;
                }
                KIND_MSG | KIND_IMM => {
                    // The head was checked aligned and the span is rounded: so is the next.
                    let next = head.wrapping_add(span as u64);
                    debug_assert!(next.is_multiple_of(ALIGN as u64), "next head {next}");
                    return Ok(Some(Record {
                        kind,
                        imm,
                        len,
                        payload: self.data + at + HEADER,
                        next,
                    }));
                }
                _ => return bad("unknown record kind"),
            }
        }
    }

    pub(crate) fn consume(&self, m: &Mapping, r: &Record) {
        // Only `peek` makes records: a misaligned head would make our next peek refuse
        // the ring as the peer's fault.
        debug_assert!(
            r.next.is_multiple_of(ALIGN as u64),
            "consuming up to a misaligned head {}",
            r.next
        );
        self.head(m).store(r.next, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn ring(m: &Mapping) -> Ring {
        let _ = m;
        Ring {
            ctl: 0,
            data: 4096,
            size: 4096,
        }
    }

    /// Many laps of variable-length records whose payloads are full of values that look like
    /// stamps: every record comes out once, intact and in order.
    #[test]
    fn records_survive_many_laps_and_stamp_lookalikes() {
        let seed = std::env::var("ORION_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(7u64);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let m = Mapping::anonymous(8192).unwrap();
        let r = ring(&m);
        let mut sent = 0u32;
        // Rounds: push a few records, drain them, then look once more at the empty ring
        // (where stale bytes of the last lap lie).
        for _ in 0..3000 {
            let mut pending = std::collections::VecDeque::new();
            for _ in 0..rng.gen_range(1..4) {
                let len = rng.gen_range(0..1500usize);
                // Each payload word holds the stamp the consumer will expect at that very
                // place one lap later: exactly what stale bytes must never be taken for.
                let tail = m.atomic_u64(0).load(Ordering::Relaxed);
                let need = round(HEADER + len) as u64;
                let pos = if tail % 4096 + need > 4096 {
                    tail + (4096 - tail % 4096)
                } else {
                    tail
                };
                let body: Vec<u8> = (0..len)
                    .map(|i| {
                        let q = pos + (HEADER + i) as u64;
                        ((q - q % 8 + 4096 + 1) >> (8 * (q % 8))) as u8
                    })
                    .collect();
                if r.push(&m, KIND_MSG, sent, len, |mm, at| mm.write(at, &body))
                    .unwrap()
                {
                    pending.push_back((sent, body));
                    sent += 1;
                }
            }
            while let Some((imm, body)) = pending.pop_front() {
                let rec = r
                    .peek(&m)
                    .unwrap()
                    .unwrap_or_else(|| panic!("record {imm} is not visible (seed {seed})"));
                assert_eq!(rec.imm, imm, "seed {seed}");
                let mut b = vec![0u8; rec.len];
                m.read(rec.payload as u64, &mut b).unwrap();
                assert!(b == body, "record {imm} damaged (seed {seed})");
                r.consume(&m, &rec);
            }
            assert!(
                matches!(r.peek(&m), Ok(None)),
                "stale bytes were taken for a record (seed {seed})"
            );
        }
    }

    #[test]
    fn a_scribbled_head_is_a_protocol_error_not_a_panic() {
        let m = Mapping::anonymous(8192).unwrap();
        let r = ring(&m);
        assert!(r.push(&m, KIND_MSG, 0, 10, |_, _| Ok(())).unwrap());
        // The peer writes nonsense into the consumer's head word.
        m.atomic_u64(64).store(u64::MAX - 3, Ordering::Relaxed);
        m.atomic_u64(8).store(u64::MAX - 3, Ordering::Relaxed);
        assert!(matches!(
            r.push(&m, KIND_MSG, 0, 1000, |_, _| Ok(())),
            Err(Error::Protocol { .. })
        ));
        assert!(matches!(r.peek(&m), Err(Error::Protocol { .. }) | Ok(None)));
        m.atomic_u64(64).store(64, Ordering::Relaxed);
        m.write(4096 + 64, &(65u64).to_le_bytes()).unwrap();
        m.write(4096 + 72, &(u32::MAX).to_le_bytes()).unwrap();
        assert!(matches!(r.peek(&m), Err(Error::Protocol { .. })));
    }
}
