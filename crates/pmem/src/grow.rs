//! Pools whose file space is taken as they are used. A pool allocated whole at
//! creation holds its size in memory on tmpfs from the start: a 1 GiB MDS pool and
//! its mirror's 2 GiB for a file system of ten files. A growing pool starts sparse and
//! allocates its file space a chunk ahead of each store that reaches a chunk for the
//! first time, so that a full file system underneath fails that store with ENOSPC, as
//! allocating the whole pool up front did, rather than a later page fault with
//! SIGBUS. Zeroing leaves the pages of chunks it has not allocated holes (what a copy
//! of a sparse pool meets); in a chunk it allocated, it writes the zeros.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

/// Space is allocated in runs of this many bytes: one `fallocate` per 2 MiB the pool
/// grows by, not one per store.
pub(crate) const CHUNK: u64 = 2 << 20;
const PAGE: u64 = 4096;

/// Which chunks of a growing pool's file this mapping allocated. After a restart
/// none is marked: each is allocated again at its first store, which takes no more
/// memory where it already is, and which fills the holes a zeroing left in it.
pub(crate) struct Growth {
    allocated: Vec<AtomicU64>,
    len: u64,
    /// Held while chunks are allocated and marked, and while a zeroing looks at
    /// marks and punches: a punch must not land in a chunk marked meanwhile.
    slow: std::sync::Mutex<()>,
}

pub(crate) fn fallocate(fd: RawFd, mode: i32, at: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: fallocate on a descriptor the pool holds open; no memory is passed.
    let r = unsafe { libc::fallocate(fd, mode, at as libc::off_t, len as libc::off_t) };
    match r {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Allocates `[at, at + len)`; a file system without fallocate leaves its pool as
/// sparse as it is (and fails its store at the page fault, as before).
fn allocate(fd: RawFd, at: u64, len: u64) -> std::io::Result<()> {
    match fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, at, len) {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
        r => r,
    }
}

impl Growth {
    pub(crate) fn new(len: u64) -> Growth {
        let chunks = len.div_ceil(CHUNK);
        Growth {
            allocated: (0..chunks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            len,
            slow: std::sync::Mutex::new(()),
        }
    }

    fn bit(&self, chunk: u64) -> (&AtomicU64, u64) {
        (&self.allocated[(chunk / 64) as usize], 1 << (chunk % 64))
    }

    fn is_allocated(&self, chunk: u64) -> bool {
        let (word, mask) = self.bit(chunk);
        word.load(Ordering::Acquire) & mask != 0
    }

    /// Allocates the file space under `[off, off + len)` (in bounds) where it is not
    /// yet: ENOSPC from the file system if it has no room.
    pub(crate) fn ensure(&self, fd: RawFd, off: u64, len: u64) -> std::io::Result<()> {
        let chunks = || off / CHUNK..=(off + len.max(1) - 1) / CHUNK;
        if len == 0 || chunks().all(|c| self.is_allocated(c)) {
            return Ok(());
        }
        let _slow = self.slow.lock().unwrap_or_else(|p| p.into_inner());
        self.allocate_chunks(fd, off, len)
    }

    /// [`Growth::ensure`]'s work, under `slow`.
    fn allocate_chunks(&self, fd: RawFd, off: u64, len: u64) -> std::io::Result<()> {
        for chunk in off / CHUNK..=(off + len - 1) / CHUNK {
            if self.is_allocated(chunk) {
                continue;
            }
            let at = chunk * CHUNK;
            if let Err(e) = allocate(fd, at, CHUNK.min(self.len - at)) {
                // A store into pages the file holds already needs no new room (a
                // slot cleared after a restart, when no chunk is marked yet).
                let (from, to) = (off.max(at), (off + len).min(at + CHUNK));
                let held = crate::holes::next_data(fd, from) == Some(from)
                    && crate::holes::next_hole(fd, from) >= to;
                if !held {
                    return Err(e);
                }
                continue;
            }
            let (word, mask) = self.bit(chunk);
            word.fetch_or(mask, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Zeroes `[off, off + len)` (in bounds) where it lies in chunks not allocated:
    /// their whole pages are punched (a hole reads as zeros; a page there goes
    /// back), the partial pages at the ends allocated alone. Returns the ranges left
    /// to zero by hand: those partial pages, and what lies in allocated chunks.
    pub(crate) fn zero_sparse(
        &self,
        fd: RawFd,
        off: u64,
        len: u64,
    ) -> std::io::Result<Vec<(u64, u64)>> {
        let _slow = self.slow.lock().unwrap_or_else(|p| p.into_inner());
        let mut by_hand = Vec::new();
        let mut at = off;
        while at < off + len {
            let end = (at / CHUNK + 1).saturating_mul(CHUNK).min(off + len);
            if self.is_allocated(at / CHUNK) {
                by_hand.push((at, end - at));
                at = end;
                continue;
            }
            let (first, last) = (at.next_multiple_of(PAGE), end / PAGE * PAGE);
            if last <= first {
                // No whole page: the one or two pages it touches, alone.
                let p = at / PAGE * PAGE;
                allocate(fd, p, end.next_multiple_of(PAGE).min(self.len) - p)?;
                by_hand.push((at, end - at));
                at = end;
                continue;
            }
            let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            if fallocate(fd, punch, first, last - first).is_err() {
                // Cannot punch: allocate and write the zeros.
                self.allocate_chunks(fd, at, end - at)?;
                by_hand.push((at, end - at));
                at = end;
                continue;
            }
            if first > at {
                allocate(fd, first - PAGE, PAGE)?;
                by_hand.push((at, first - at));
            }
            if end > last {
                allocate(fd, last, PAGE)?;
                by_hand.push((last, end - last));
            }
            at = end;
        }
        Ok(by_hand)
    }
}

#[cfg(test)]
mod tests {
    use super::CHUNK;
    use crate::{ModeChoice, Pool};

    fn allocated(path: &std::path::Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().blocks() * 512
    }

    #[test]
    fn a_growing_pool_takes_chunks_under_its_stores_and_zeroing_leaves_holes() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("pool");
        let pool = Pool::create_growing(&path, 64 << 20, ModeChoice::Auto).unwrap();
        assert_eq!(allocated(&path), 0, "a new growing pool takes no space");
        assert_eq!(pool.data_run(0), (64 << 20, 64 << 20), "all a hole");
        pool.write((10 << 20) + 5, b"hello").unwrap();
        pool.store_u64(40 << 20, 7).unwrap();
        assert_eq!(allocated(&path), 2 * CHUNK, "a chunk under each store");
        // Where data may be: at most the chunks the stores took (tmpfs says just
        // the pages written), found without reading.
        let (start, end) = pool.data_run(0);
        assert!(
            start == 10 << 20 && end > start && end <= 12 << 20,
            "{start} {end}"
        );
        let (start, end) = pool.data_run(12 << 20);
        assert!(
            start == 40 << 20 && end > start && end <= 42 << 20,
            "{start} {end}"
        );
        // Zeroing: in the allocated chunk the zeros are written; past it the chunk
        // stays a hole but for the partial page the range ends in.
        pool.zero((10 << 20) + 3, 3 << 20).unwrap();
        assert_eq!(pool.read_vec((10 << 20) + 5, 5).unwrap(), vec![0; 5]);
        assert_eq!(allocated(&path), 2 * CHUNK + 4096);
        pool.zero(20 << 20, 4 << 20).unwrap();
        assert_eq!(
            allocated(&path),
            2 * CHUNK + 4096,
            "a hole zeroed stays one"
        );
        assert!(pool.data_run(20 << 20).0 >= 24 << 20);
        pool.write(10 << 20, b"again").unwrap();
        assert_eq!(pool.read_vec(10 << 20, 5).unwrap(), b"again");
        assert_eq!(
            pool.load_u64(40 << 20).unwrap(),
            7,
            "other chunks untouched"
        );
        // Opened again, it grows the same way.
        drop(pool);
        let pool = Pool::open(&path, ModeChoice::Auto).unwrap().growing();
        pool.write(60 << 20, b"x").unwrap();
        assert_eq!(pool.read_vec(60 << 20, 1).unwrap(), b"x");
        assert_eq!(allocated(&path), 3 * CHUNK + 4096);
        // Zeroing from the pool's first byte (a format does) of a fresh chunk.
        pool.zero(0, 3 << 20).unwrap();
        assert_eq!(allocated(&path), 3 * CHUNK + 4096, "nothing taken");
        // Reserving ahead of a read takes the chunk, as a store would.
        pool.reserve(30 << 20, 8).unwrap();
        assert_eq!(allocated(&path), 4 * CHUNK + 4096);
        // Opened again, nothing is marked: zeroing data there punches it out.
        drop(pool);
        let pool = Pool::open(&path, ModeChoice::Auto).unwrap().growing();
        let before = allocated(&path);
        pool.zero(40 << 20, 2 << 20).unwrap();
        assert_eq!(pool.load_u64(40 << 20).unwrap(), 0);
        assert!(allocated(&path) < before, "the zeroed pages went back");
        // A few bytes across a page boundary, in a chunk not allocated: both pages.
        let before = allocated(&path);
        pool.zero((50 << 20) + 4090, 100).unwrap();
        assert_eq!(allocated(&path), before + 8192);
        assert_eq!(pool.read_vec((50 << 20) + 4090, 100).unwrap(), vec![0; 100]);
    }

    #[test]
    fn a_sparse_write_takes_only_the_chunks_that_hold_something() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("pool");
        let pool = Pool::create_growing(&path, 16 << 20, ModeChoice::Auto).unwrap();
        // Eight MiB from byte 100: data in its first and its fourth chunk only.
        let mut data = vec![0u8; 8 << 20];
        data[..5000].fill(1);
        data[(6 << 20) + 7] = 2;
        pool.write_sparse(100, &data).unwrap();
        // Those two chunks, and the page its last 100 bytes (zeros) fall in.
        // (Checked before reading: reading a hole of a shared mapping of tmpfs takes
        // a page too.)
        assert_eq!(allocated(&path), 2 * CHUNK + 4096);
        assert_eq!(pool.read_vec(100, 8 << 20).unwrap(), data);
    }
}
