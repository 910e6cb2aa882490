//! Pools whose file space is taken as they are used. A pool allocated whole at
//! creation holds its size in memory on tmpfs from the start: a 1 GiB MDS pool and
//! its mirror's 2 GiB for a file system of ten files. A growing pool starts sparse and
//! allocates its file space a chunk ahead of each store that reaches a chunk for the
//! first time, so that a full file system underneath fails that store with ENOSPC, as
//! allocating the whole pool up front did, rather than a later page fault with
//! SIGBUS. Zeroing a whole page of it gives the page back (a hole reads as zeros).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

/// Space is allocated in runs of this many bytes: one `fallocate` per 2 MiB the pool
/// grows by, not one per store.
pub(crate) const CHUNK: u64 = 2 << 20;
const PAGE: u64 = 4096;

/// Which chunks of a growing pool's file are allocated (since it was mapped: after a
/// restart each chunk is allocated again once, which costs nothing where it is).
pub(crate) struct Growth {
    allocated: Vec<AtomicU64>,
    len: u64,
}

impl Growth {
    pub(crate) fn new(len: u64) -> Growth {
        let chunks = len.div_ceil(CHUNK);
        Growth {
            allocated: (0..chunks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            len,
        }
    }

    fn bit(&self, chunk: u64) -> (&AtomicU64, u64) {
        (&self.allocated[(chunk / 64) as usize], 1 << (chunk % 64))
    }

    /// Allocates the file space under `[off, off + len)` (in bounds) where it is not
    /// yet: ENOSPC from the file system if it has no room.
    pub(crate) fn ensure(&self, fd: RawFd, off: u64, len: u64) -> std::io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        for chunk in off / CHUNK..=(off + len - 1) / CHUNK {
            let (word, mask) = self.bit(chunk);
            if word.load(Ordering::Acquire) & mask != 0 {
                continue;
            }
            let at = chunk * CHUNK;
            let n = CHUNK.min(self.len - at);
            // SAFETY: fallocate on a descriptor the pool holds open; no memory passed.
            let r = unsafe { libc::fallocate(fd, 0, at as libc::off_t, n as libc::off_t) };
            if r != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
                    return Err(e);
                }
            }
            word.fetch_or(mask, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Gives back the whole pages of `[off, off + len)` (in bounds): they read as
    /// zeros after. Returns the part to zero by hand: the partial pages at its ends
    /// (their own pages allocated, not their chunks: those stay given back), or all
    /// of it where the file system cannot punch holes.
    pub(crate) fn punch(&self, fd: RawFd, off: u64, len: u64) -> std::io::Result<[(u64, u64); 2]> {
        let (first, end) = (off.next_multiple_of(PAGE), (off + len) / PAGE * PAGE);
        if end <= first {
            self.ensure(fd, off, len)?;
            return Ok([(off, len), (0, 0)]);
        }
        let flags = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: as in `ensure`.
        let r = unsafe {
            libc::fallocate(
                fd,
                flags,
                first as libc::off_t,
                (end - first) as libc::off_t,
            )
        };
        if r != 0 {
            self.ensure(fd, off, len)?;
            return Ok([(off, len), (0, 0)]);
        }
        // The chunks it reached are no longer allocated whole: the next store to them
        // allocates again.
        for chunk in first / CHUNK..=(end - 1) / CHUNK {
            let (word, mask) = self.bit(chunk);
            word.fetch_and(!mask, Ordering::AcqRel);
        }
        let head = (first > off).then(|| first - PAGE);
        let tail = (off + len > end).then_some(end);
        for at in [head, tail].into_iter().flatten() {
            // SAFETY: as in `ensure`; the partial page is inside the pool.
            let r = unsafe { libc::fallocate(fd, 0, at as libc::off_t, PAGE as libc::off_t) };
            if r != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok([(off, first - off), (end, off + len - end)])
    }
}

#[cfg(test)]
mod tests {
    use crate::{ModeChoice, Pool};

    fn allocated(path: &std::path::Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().blocks() * 512
    }

    #[test]
    fn a_growing_pool_takes_space_as_stores_reach_it_and_zeroing_gives_it_back() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("pool");
        let pool = Pool::create_growing(&path, 64 << 20, ModeChoice::Auto).unwrap();
        assert_eq!(allocated(&path), 0, "a new growing pool takes no space");
        assert_eq!(pool.data_run(0), (64 << 20, 64 << 20), "all a hole");
        pool.write((10 << 20) + 5, b"hello").unwrap();
        pool.store_u64(40 << 20, 7).unwrap();
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
        let taken = allocated(&path);
        assert_eq!(taken, 2 * super::CHUNK, "a chunk under each store");
        assert_eq!(pool.read_vec((10 << 20) + 5, 5).unwrap(), b"hello");
        assert_eq!(pool.load_u64(40 << 20).unwrap(), 7);
        // Zeroing gives the whole pages back and clears the partial ones by hand.
        pool.zero((10 << 20) + 3, 3 << 20).unwrap();
        assert_eq!(pool.read_vec((10 << 20) + 5, 5).unwrap(), vec![0; 5]);
        assert!(allocated(&path) < taken, "the zeroed pages went back");
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
        assert!(allocated(&path) < 16 << 20);
        // Zeroing from the pool's first byte (a format does).
        pool.write(1 << 20, b"gone").unwrap();
        pool.zero(0, 3 << 20).unwrap();
        assert_eq!(pool.data_run(0).0, 10 << 20, "the first chunks are holes");
    }

    #[test]
    fn a_sparse_write_takes_only_the_pages_that_hold_something() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("pool");
        let pool = Pool::create_growing(&path, 16 << 20, ModeChoice::Auto).unwrap();
        // Eight MiB from byte 100: data in its first and its fourth chunk only.
        let mut data = vec![0u8; 8 << 20];
        data[..5000].fill(1);
        data[(6 << 20) + 7] = 2;
        pool.write_sparse(100, &data).unwrap();
        // The pages with data in its first and fourth chunk (the rest of them given
        // back), and the chunk its last 100 bytes fall in. (Checked before reading:
        // reading a hole of a shared mapping of tmpfs takes a page too.)
        let taken = allocated(&path);
        assert!(taken <= super::CHUNK + (16 << 10), "{taken} bytes taken");
        assert_eq!(pool.read_vec(100, 8 << 20).unwrap(), data);
    }
}
