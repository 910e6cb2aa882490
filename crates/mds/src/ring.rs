//! The mirror's ring (Orion §3.1; Mojim's one-sided replication): a file beside the
//! mirror's pool, registered remotely writable, into which the primary writes what it
//! persists, one-sided, as [`orion_proto::MdsToMirror::Apply`] entries. A write that
//! completed is in the mirror's memory, so the primary acknowledges without waiting
//! for the mirror's CPU (two thread wake-ups on this VM, ~85 µs, before the ring); the
//! mirror applies entries behind it, and drains the ring before it ever takes the role.
//! The file outlives the mirror's process, as its pool does, so a mirror that restarts
//! drains it too.
//!
//! Layout: at [`HEAD`] the position of the first entry the mirror has not applied
//! (written by the mirror, read one-sided by the primary when it runs short of room);
//! at [`COPIED`] a word set once the mirror's copy of the pool was whole; entries from
//! [`DATA`]. Positions count bytes since the ring was made; an entry lives at
//! `DATA + pos % capacity` and never runs past the end (a wrap marker sends the reader
//! to the next lap). An entry is a 16-byte header (its position, its length, a CRC-32C
//! of both and of the payload) and the payload, padded to 64 bytes. It is whole when
//! its position is the one expected and its checksum holds: one being written, one
//! torn by a crash, and one left from an earlier lap are not.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use orion_fabric::RemoteRegion;
use orion_pmem::{ModeChoice, Pool};

/// Bytes of a ring: the largest entry is ~60 KiB (an `Apply` of
/// [`orion_proto::MAX_APPLY_RECORDS`]), a turn of the primary must fit whole (it
/// persists a few KiB per request), and a primary runs short of room only when its
/// mirror stalls.
pub(crate) const RING_BYTES: u64 = 16 << 20;
/// Where the mirror keeps its head.
pub(crate) const HEAD: u64 = 0;
/// Set once the copy of the primary's pool was whole (the ring then continues it).
const COPIED: u64 = 8;
/// Where entries start.
const DATA: u64 = 4096;
const ENTRY_HEADER: usize = 16;
const ALIGN: u64 = 64;
/// The length of a wrap marker.
const WRAP: u32 = u32::MAX;

/// The ring file of the MDS pool at `pool`.
pub(crate) fn ring_path(pool: &Path) -> PathBuf {
    pool.with_extension("ring")
}

fn capacity(ring_len: u64) -> u64 {
    ring_len.saturating_sub(DATA) / ALIGN * ALIGN
}

fn framed_len(payload: usize) -> u64 {
    (ENTRY_HEADER as u64 + payload as u64).next_multiple_of(ALIGN)
}

fn checksum(pos: u64, len: u32, payload: &[u8]) -> u32 {
    let c = orion_format::crc32c(&pos.to_le_bytes());
    let c = orion_format::crc32c_append(c, &len.to_le_bytes());
    orion_format::crc32c_append(c, payload)
}

fn header(pos: u64, len: u32, payload: &[u8]) -> [u8; ENTRY_HEADER] {
    let mut h = [0u8; ENTRY_HEADER];
    h[..8].copy_from_slice(&pos.to_le_bytes());
    h[8..12].copy_from_slice(&len.to_le_bytes());
    h[12..].copy_from_slice(&checksum(pos, len, payload).to_le_bytes());
    h
}

/// Entries framed for one round of ring writes: their bytes back to back, and where
/// each run of them goes. Entries next to each other in the ring are one write (up to
/// `max_write` bytes), so a turn is usually a single one-sided write.
pub(crate) struct Frames {
    pub bytes: Vec<u8>,
    /// An offset in the ring's region and the range of `bytes` written there.
    pub writes: Vec<(u64, std::ops::Range<usize>)>,
    max_write: usize,
}

impl Frames {
    pub(crate) fn new(max_write: usize) -> Frames {
        Frames {
            bytes: Vec::new(),
            writes: Vec::new(),
            max_write,
        }
    }

    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.writes.clear();
    }

    /// Appends `header` and `payload`, zero-padded to `size`, to go at `at`.
    fn push(&mut self, at: u64, header: &[u8], payload: &[u8], size: usize) {
        // `framed_len` rounds up: the padding below must not cut the entry short.
        assert!(
            header.len() + payload.len() <= size,
            "an entry overruns its frame"
        );
        let start = self.bytes.len();
        self.bytes.extend_from_slice(header);
        self.bytes.extend_from_slice(payload);
        self.bytes.resize(start + size, 0);
        match self.writes.last_mut() {
            Some((off, r))
                if *off + r.len() as u64 == at
                    && r.end == start
                    && r.len() + size <= self.max_write =>
            {
                r.end += size;
            }
            _ => self.writes.push((at, start..start + size)),
        }
    }
}

/// The primary's side: where the next entry goes, and the room its mirror has freed.
pub(crate) struct RingWriter {
    pub region: RemoteRegion,
    cap: u64,
    /// The position of the next entry.
    tail: u64,
    /// The mirror's head as last read.
    head: u64,
}

impl RingWriter {
    pub(crate) fn new(region: RemoteRegion) -> Result<RingWriter, String> {
        let cap = capacity(region.len);
        if cap < 16 * framed_len(orion_proto::MAX_APPLY_RECORDS + 256) {
            return Err(format!(
                "the mirror's ring is {} bytes: too small for its entries",
                region.len
            ));
        }
        Ok(RingWriter {
            region,
            cap,
            tail: 0,
            head: 0,
        })
    }

    /// The position after the last entry framed.
    pub(crate) fn tail(&self) -> u64 {
        self.tail
    }

    /// The mirror's head as last read.
    pub(crate) fn head(&self) -> u64 {
        self.head
    }

    /// Whether entries of these payload lengths fit the ring together, however the
    /// laps fall (the mirror applies a turn only once all of it is there).
    pub(crate) fn holds_together(&self, lens: impl Iterator<Item = usize>) -> bool {
        // Each entry may waste up to its own size at a lap's end.
        lens.map(|l| 2 * framed_len(l)).sum::<u64>() <= self.cap
    }

    /// The mirror's head, read one-sided from [`HEAD`].
    pub(crate) fn set_head(&mut self, head: u64) -> Result<(), String> {
        if head < self.head || head > self.tail {
            return Err(format!(
                "the mirror's ring head {head} is outside {}..={}",
                self.head, self.tail
            ));
        }
        self.head = head;
        Ok(())
    }

    /// Frames `payload` as the next entry into `out`: a wrap marker first if the entry
    /// does not fit before the ring's end. False when the mirror has not yet freed the
    /// room (read its head, then try again).
    pub(crate) fn frame(&mut self, payload: &[u8], out: &mut Frames) -> Result<bool, String> {
        // Kept by `set_head` (within what was framed) and by the room check below.
        assert!(
            self.head <= self.tail && self.tail - self.head <= self.cap,
            "the ring's head passed its tail, or it holds more than a lap"
        );
        // Every entry, and every lap, starts on a multiple of ALIGN (so does `cap`).
        debug_assert_eq!(self.tail % ALIGN, 0, "a ring entry starts unaligned");
        let size = framed_len(payload.len());
        if size > self.cap / 2 || payload.len() >= WRAP as usize {
            return Err(format!("a ring entry of {} bytes", payload.len()));
        }
        let at = self.tail % self.cap;
        let (pos, wrap) = if at + size > self.cap {
            (self.tail + (self.cap - at), true)
        } else {
            (self.tail, false)
        };
        if pos + size - self.head > self.cap {
            return Ok(false);
        }
        if wrap {
            let marker = header(self.tail, WRAP, &[]);
            out.push(DATA + at, &marker, &[], ENTRY_HEADER);
        }
        let len = payload.len() as u32;
        // A wrap starts the next lap, where the entry (at most half a lap) fits.
        assert!(
            pos % self.cap + size <= self.cap,
            "a ring entry runs past its end"
        );
        out.push(
            DATA + pos % self.cap,
            &header(pos, len, payload),
            payload,
            size as usize,
        );
        self.tail = pos + size;
        Ok(true)
    }
}

/// The mirror's side: the ring file, read from the head.
pub(crate) struct RingReader {
    pub pool: Pool,
    cap: u64,
    head: u64,
}

impl RingReader {
    /// Makes a fresh ring at `path` (an earlier one is gone: its session's pool copy is
    /// being replaced).
    pub(crate) fn create(path: &Path, mode: ModeChoice) -> Result<RingReader> {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
        }
        let pool = Pool::create(path, RING_BYTES, mode)
            .with_context(|| format!("the mirror's ring {}", path.display()))?;
        pool.zero(0, DATA as usize)?;
        pool.persist(0, DATA as usize)?;
        Ok(RingReader {
            cap: capacity(pool.len()),
            pool,
            head: 0,
        })
    }

    /// The ring left at `path`, if any.
    pub(crate) fn open(path: &Path, mode: ModeChoice) -> Result<Option<RingReader>> {
        if !path.exists() {
            return Ok(None);
        }
        let pool = Pool::open(path, mode).with_context(|| format!("{}", path.display()))?;
        if pool.len() < DATA + ALIGN {
            bail!("{} is too short for a ring", path.display());
        }
        let head = pool.load_u64(HEAD)?;
        Ok(Some(RingReader {
            cap: capacity(pool.len()),
            pool,
            head,
        }))
    }

    /// Records that the pool's copy is whole: entries continue it.
    pub(crate) fn mark_copied(&self) -> Result<()> {
        self.pool.store_u64(COPIED, 1)?;
        self.pool.persist(COPIED, 8)?;
        Ok(())
    }

    pub(crate) fn copied(&self) -> Result<bool> {
        Ok(self.pool.load_u64(COPIED)? == 1)
    }

    pub(crate) fn head(&self) -> u64 {
        self.head
    }

    /// The payload of the whole entry at `pos` (or, past a wrap marker there, at the
    /// next lap's start) into `out`, and the position after it; `None` while there is
    /// none (yet).
    pub(crate) fn peek_at(&self, mut pos: u64, out: &mut Vec<u8>) -> Result<Option<u64>> {
        for _ in 0..2 {
            let at = pos % self.cap;
            let mut h = [0u8; ENTRY_HEADER];
            self.pool.read(DATA + at, &mut h)?;
            let found = u64::from_le_bytes(h[..8].try_into().expect("8 bytes"));
            let len = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
            let crc = u32::from_le_bytes(h[12..].try_into().expect("4 bytes"));
            if found != pos {
                return Ok(None);
            }
            // Positions near the end of u64 (a damaged head) hold nothing whole.
            if len == WRAP {
                if crc != checksum(pos, WRAP, &[]) {
                    return Ok(None);
                }
                let Some(next) = pos.checked_add(self.cap - at) else {
                    return Ok(None);
                };
                pos = next;
                continue;
            }
            let size = framed_len(len as usize);
            if at + size > self.cap {
                return Ok(None); // not an entry this ring could hold: not whole
            }
            let Some(next) = pos.checked_add(size) else {
                return Ok(None);
            };
            out.resize(len as usize, 0);
            self.pool.read(DATA + at + ENTRY_HEADER as u64, out)?;
            if crc != checksum(pos, len, out) {
                return Ok(None);
            }
            return Ok(Some(next));
        }
        Ok(None) // two wrap markers in a row: none is whole
    }

    /// [`RingReader::peek_at`] the head.
    #[cfg(test)]
    pub(crate) fn peek(&self, out: &mut Vec<u8>) -> Result<Option<u64>> {
        self.peek_at(self.head, out)
    }

    /// Moves the head to `next` (everything before it is applied) and persists it.
    pub(crate) fn advance(&mut self, next: u64) -> Result<()> {
        self.head = next;
        self.pool.store_u64(HEAD, next)?;
        self.pool.persist(HEAD, 8)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orion_pmem::Mode;
    use rand::{Rng, SeedableRng};

    /// Writes what the writer framed into the ring file, as the fabric would.
    fn deliver(r: &RingReader, out: &Frames) {
        for (off, range) in &out.writes {
            r.pool.write(*off, &out.bytes[range.clone()]).unwrap();
        }
    }

    fn rings(
        seed: u64,
    ) -> (
        tempfile::TempDir,
        RingReader,
        RingWriter,
        rand::rngs::StdRng,
    ) {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let r = RingReader::create(
            &dir.path().join("m.ring"),
            ModeChoice::Force(Mode::Volatile),
        )
        .unwrap();
        let w = RingWriter::new(RemoteRegion {
            key: 1,
            addr: 0,
            len: r.pool.len(),
        })
        .unwrap();
        (dir, r, w, rand::rngs::StdRng::seed_from_u64(seed))
    }

    #[test]
    fn entries_come_out_in_order_across_laps_and_the_writer_waits_for_room() {
        for seed in 1..=4 {
            let (_d, mut r, mut w, mut rng) = rings(seed);
            let mut sent = std::collections::VecDeque::new();
            let mut got = Vec::new();
            let mut out = Frames::new(1 << 20);
            let mut full = 0;
            // Several laps' worth, with entries of every size up to the largest.
            for n in 0..700u32 {
                let len = rng.gen_range(0..3 * orion_proto::MAX_APPLY_RECORDS);
                let payload: Vec<u8> = (0..len).map(|i| (i as u32 ^ n) as u8).collect();
                out.clear();
                while !w.frame(&payload, &mut out).unwrap() {
                    // No room as far as the primary knows: it reads the mirror's head,
                    // and if that is not enough either the mirror applies one more.
                    full += 1;
                    w.set_head(r.pool.load_u64(HEAD).unwrap()).unwrap();
                    if w.frame(&payload, &mut out).unwrap() {
                        break;
                    }
                    let next = r.peek(&mut got).unwrap().expect("a whole entry");
                    assert_eq!(got, sent.pop_front().unwrap(), "seed {seed}");
                    r.advance(next).unwrap();
                    w.set_head(r.pool.load_u64(HEAD).unwrap()).unwrap();
                }
                deliver(&r, &out);
                sent.push_back(payload);
                if rng.gen_bool(0.3) {
                    while let Some(next) = r.peek(&mut got).unwrap() {
                        assert_eq!(got, sent.pop_front().unwrap(), "seed {seed}");
                        r.advance(next).unwrap();
                    }
                }
            }
            while let Some(next) = r.peek(&mut got).unwrap() {
                assert_eq!(got, sent.pop_front().unwrap(), "seed {seed}");
                r.advance(next).unwrap();
            }
            assert!(sent.is_empty(), "seed {seed}: entries left unread");
            assert!(full > 0, "seed {seed}: the ring never filled");
            assert!(
                w.tail() > 3 * RING_BYTES,
                "seed {seed}: fewer than three laps"
            );
            assert_eq!(r.head(), w.tail(), "seed {seed}");
        }
    }

    /// A turn's entries, adjacent in the ring, are one write as long as it stays within
    /// the staging size; a lap's end splits them, and they still read back in order.
    #[test]
    fn adjacent_entries_are_one_write_up_to_its_limit_and_a_lap_splits_them() {
        let (_d, mut r, mut w, _) = rings(5);
        let mut out = Frames::new(4096);
        let mut got = Vec::new();
        for p in [&b"one"[..], &[2u8; 100][..], &[3u8; 1000][..]] {
            assert!(w.frame(p, &mut out).unwrap());
        }
        assert_eq!(out.writes.len(), 1, "three small entries");
        assert!(w.frame(&[4u8; 3000], &mut out).unwrap());
        assert_eq!(out.writes.len(), 2, "past the write limit");
        deliver(&r, &out);
        for want in [
            &b"one"[..],
            &[2u8; 100][..],
            &[3u8; 1000][..],
            &[4u8; 3000][..],
        ] {
            let next = r.peek(&mut got).unwrap().expect("a whole entry");
            assert_eq!(got, want);
            r.advance(next).unwrap();
        }
        w.set_head(r.head()).unwrap();
        // Fill to just before the lap's end: the next entry's wrap marker joins the
        // write before it, the entry itself starts a new one at the ring's start.
        out = Frames::new(usize::MAX);
        let filler = vec![5u8; 60_000];
        while w.tail() % w.cap + 2 * framed_len(filler.len()) < w.cap {
            assert!(w.frame(&filler, &mut out).unwrap());
            deliver(&r, &out);
            out.clear();
            while let Some(next) = r.peek(&mut got).unwrap() {
                r.advance(next).unwrap();
            }
            w.set_head(r.head()).unwrap();
        }
        assert!(w.frame(&[6u8; 100], &mut out).unwrap());
        // One line more than the lap has left.
        let rest = (w.cap - w.tail() % w.cap) as usize;
        let over = vec![8u8; rest + ALIGN as usize - ENTRY_HEADER];
        assert!(w.frame(&over, &mut out).unwrap());
        assert!(w.frame(&[7u8; 100], &mut out).unwrap());
        assert_eq!(out.writes.len(), 2, "{:?}", out.writes);
        assert_eq!(out.writes[1].0, DATA, "the second write starts the lap");
        deliver(&r, &out);
        for want in [vec![6u8; 100], over, vec![7u8; 100]] {
            let next = r.peek(&mut got).unwrap().expect("a whole entry");
            assert_eq!(got, want);
            r.advance(next).unwrap();
        }
    }

    #[test]
    fn a_torn_or_stale_entry_is_not_whole_and_a_reopened_ring_resumes_at_its_head() {
        let (d, mut r, mut w, _) = rings(9);
        let mut out = Frames::new(1 << 20);
        let mut got = Vec::new();
        w.frame(b"first entry", &mut out).unwrap();
        deliver(&r, &out);
        let next = r.peek(&mut got).unwrap().unwrap();
        r.advance(next).unwrap();
        // The second entry lands with one byte of its payload not yet written.
        out.clear();
        w.frame(&[7u8; 1000], &mut out).unwrap();
        let (off, range) = out.writes[0].clone();
        let mut bytes = out.bytes[range].to_vec();
        bytes[500] ^= 1;
        r.pool.write(off, &bytes).unwrap();
        assert_eq!(r.peek(&mut got).unwrap(), None, "a torn entry");
        // Its header alone, from an earlier position (an earlier lap), is stale.
        let mut stale = bytes.clone();
        stale[500] ^= 1;
        stale[..8].copy_from_slice(&0u64.to_le_bytes());
        r.pool.write(off, &stale).unwrap();
        assert_eq!(r.peek(&mut got).unwrap(), None, "a stale entry");
        // Whole at last; a ring opened again starts at the head it persisted.
        deliver(&r, &out);
        let path = ring_path(&d.path().join("m.pool"));
        drop(r);
        let again = RingReader::open(&path, ModeChoice::Force(Mode::Volatile))
            .unwrap()
            .unwrap();
        assert_eq!(again.head(), next);
        assert!(again.peek(&mut got).unwrap().is_some());
        assert_eq!(got, vec![7u8; 1000]);
        assert!(!again.copied().unwrap());
        again.mark_copied().unwrap();
        assert!(again.copied().unwrap());
    }

    #[test]
    fn the_writer_refuses_a_head_that_moves_backwards_and_a_turn_that_cannot_fit() {
        let (_d, _r, mut w, _) = rings(3);
        let mut out = Frames::new(1 << 20);
        w.frame(b"x", &mut out).unwrap();
        assert!(w.set_head(w.tail() + 64).is_err());
        w.set_head(w.tail()).unwrap();
        assert!(w.set_head(0).is_err());
        // A turn fits whole only with room for every entry and its lap's end.
        let quarter = (RING_BYTES / 4) as usize;
        assert!(w.holds_together([1000, 5000].into_iter()));
        assert!(w.holds_together([quarter / 2; 3].into_iter()));
        assert!(!w.holds_together([quarter; 3].into_iter()));
    }
}
