//! The listings of open directory handles: a directory is listed whole at offset 0
//! (the first readdir of a handle, and the first after a rewinddir, which POSIX says
//! sees the directory as it is now), and later calls page through that snapshot, so
//! a listing read in several calls is one consistent view. An entry's offset is its
//! position + 1: where the next call resumes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use orion_client::{DirEntry, FsResult};

#[derive(Default)]
pub(crate) struct Listings {
    open: Mutex<HashMap<u64, Vec<DirEntry>>>,
    next: AtomicU64,
}

impl Listings {
    /// A new handle (listed at its first read).
    pub fn open(&self) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.lock().insert(fh, Vec::new());
        fh
    }

    /// Calls `add(ino, next offset, entry)` for the entries of handle `fh` from
    /// `offset` until it says the reply is full; at offset 0, `list` lists the
    /// directory afresh first. `Ok(false)`: no such handle.
    pub fn read(
        &self,
        fh: u64,
        offset: u64,
        list: impl FnOnce() -> FsResult<Vec<DirEntry>>,
        mut add: impl FnMut(u64, &DirEntry) -> bool,
    ) -> FsResult<bool> {
        let fresh = match offset {
            0 => Some(list()?),
            _ => None,
        };
        let mut open = self.lock();
        let Some(held) = open.get_mut(&fh) else {
            return Ok(false);
        };
        if let Some(l) = fresh {
            *held = l;
        }
        for (i, e) in held.iter().enumerate().skip(offset as usize) {
            if add(i as u64 + 1, e) {
                break;
            }
        }
        Ok(true)
    }

    pub fn release(&self, fh: u64) {
        self.lock().remove(&fh);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<DirEntry>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}
