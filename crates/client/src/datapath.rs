//! The data path (paper §5): reads go extent index → page address → the mapped local
//! pool, the DRAM cache, or a one-sided read of the store (then cached); writes are
//! copy-on-write: new pages are filled (partial pages start as a copy of the old page),
//! written and made durable per the consistency mode, then a write entry naming them
//! is log-committed. The cache is keyed by page address, so it never needs
//! invalidation: a new version of a file page lives at a new address.
//!
//! `read` serves reads, `write` decides a write from the inode's state and then
//! does its I/O and commit, `staged` commits what optimistic persistence staged,
//! `pieces` assembles the partly covered pages of a write.

mod pieces;
mod read;
mod staged;
mod write;

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lru::LruCache;
use orion_format::{FileType, Gpa, PAGE_SIZE};
use orion_meta::error::{EINVAL, EISDIR, ESTALE};

use crate::alloc::Chunks;
use crate::arbitration::InodeCache;
use crate::remote::{Remote, Res};
use crate::staging::Staging;

pub(crate) use read::fetch;

const PS: u64 = PAGE_SIZE;
/// Most bytes one log commit covers; longer writes commit in pieces.
pub const MAX_PIECE: u64 = 4 << 20;

/// Cached pages by address, with when each was read or written.
type Lru = LruCache<Gpa, (Instant, Box<[u8]>)>;

/// Data pages read from remote stores, by address. A page address can name new
/// content only after the page was freed and the MDS's grace period passed, so an
/// entry is trusted for half the grace period after it was read or written, and read
/// again after that. One cache serves every lane of a client (its own lock, held for
/// a copy, never across I/O).
pub struct PageCache {
    lru: Mutex<Lru>,
    /// Most pages held. The map grows to it with use: `LruCache::new` would size its
    /// table for the whole cache at once (a 256 MiB cache: 1.5 MiB, zeroed), a cost
    /// every short process of the preload library paid before its first call.
    cap: usize,
}

impl PageCache {
    pub fn new(mib: u64) -> PageCache {
        PageCache {
            lru: Mutex::new(LruCache::unbounded()),
            cap: (mib * (1 << 20) / PS).max(1) as usize,
        }
    }

    fn lru(&self) -> MutexGuard<'_, Lru> {
        self.lru.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Copies the page at `g` into `out` if a fresh copy is cached.
    pub(crate) fn get_into(&self, g: &Gpa, ttl: Duration, out: &mut [u8]) -> bool {
        let mut lru = self.lru();
        let fresh = lru.peek(g).is_some_and(|(t, _)| t.elapsed() < ttl);
        if !fresh {
            lru.pop(g);
            return false;
        }
        match lru.get(g) {
            Some((_, p)) => {
                orion_pmem::copy_bytes(out, p);
                true
            }
            None => false,
        }
    }

    pub(crate) fn has(&self, g: &Gpa, ttl: Duration) -> bool {
        self.lru().peek(g).is_some_and(|(t, _)| t.elapsed() < ttl)
    }

    pub(crate) fn put(&self, g: Gpa, page: &[u8]) {
        // `get_into` copies an entry over a whole page.
        assert_eq!(page.len(), PS as usize, "the cache holds whole pages");
        let mut lru = self.lru();
        lru.put(g, (Instant::now(), page.into()));
        while lru.len() > self.cap {
            lru.pop_lru();
        }
    }

    pub(crate) fn clear(&self) {
        self.lru().clear();
    }
}

/// The engine of the data path; borrows the client's parts for one operation.
pub struct DataPath<'a> {
    pub remote: &'a mut Remote,
    pub cache: &'a mut InodeCache,
    pub chunks: &'a mut Chunks,
    pub pages: &'a PageCache,
    pub staging: &'a mut Staging,
}

fn regular(ftype: FileType) -> Res<()> {
    match ftype {
        FileType::Regular => Ok(()),
        FileType::Directory => Err(EISDIR.into()),
        _ => Err(EINVAL.into()),
    }
}

/// An open file whose inode number now names another file (it was deleted and the
/// number reused) is stale.
fn same_file(now: u64, opened: u64) -> Res<()> {
    if now != opened {
        return Err(ESTALE.into());
    }
    Ok(())
}
