//! The listings of open directory handles: a directory is listed whole at offset 0
//! (the first readdir of a handle, and the first after a rewinddir, which POSIX says
//! sees the directory as it is now), and later calls page through that snapshot, so
//! a listing read in several calls is one consistent view. An entry's offset is its
//! position + 1: where the next call resumes. A handle's first read lists the
//! directory whatever its offset: the preload library pages through its own
//! listing by the same offsets, and may hand the descriptor to the kernel midway.

use std::collections::HashMap;
use std::sync::Mutex;

use orion_client::{DirEntry, FsResult};

#[derive(Default)]
pub(crate) struct Listings {
    /// Each handle's snapshot (None: not listed yet).
    open: Mutex<HashMap<u64, Option<Vec<DirEntry>>>>,
}

impl Listings {
    /// A new handle, `fh` (the client's descriptor of the directory): listed at
    /// its first read.
    pub fn open(&self, fh: u64) {
        self.lock().insert(fh, None);
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
        let unlisted = matches!(self.lock().get(&fh), Some(None));
        let fresh = match offset == 0 || unlisted {
            true => Some(list()?),
            false => None,
        };
        let mut open = self.lock();
        let Some(held) = open.get_mut(&fh) else {
            return Ok(false);
        };
        if let Some(l) = fresh {
            *held = Some(l);
        }
        let held = held.as_deref().unwrap_or_default();
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Option<Vec<DirEntry>>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orion_client::FileType;

    fn names(l: &Listings, fh: u64, offset: u64, now: &[&str]) -> Vec<(u64, String)> {
        let list = || {
            Ok(now
                .iter()
                .map(|n| DirEntry {
                    name: n.as_bytes().to_vec(),
                    ino: 2,
                    ftype: FileType::Regular,
                })
                .collect())
        };
        let mut out = Vec::new();
        let add = |off: u64, e: &DirEntry| {
            out.push((off, String::from_utf8_lossy(&e.name).into_owned()));
            false
        };
        assert!(l.read(fh, offset, list, add).unwrap());
        out
    }

    #[test]
    fn a_handle_pages_through_its_snapshot_and_its_first_read_lists_at_any_offset() {
        let l = Listings::default();
        let fh = 7;
        l.open(fh);
        // The first read of a handle lists even past offset 0 (a listing begun
        // elsewhere by the same offsets).
        let got = names(&l, fh, 1, &["a", "b", "c"]);
        assert_eq!(got, [(2, "b".into()), (3, "c".into())]);
        // Later reads page through that snapshot; offset 0 lists afresh.
        assert_eq!(names(&l, fh, 2, &["x"]), [(3, "c".to_string())]);
        assert_eq!(names(&l, fh, 0, &["x"]), [(1, "x".to_string())]);
        l.release(fh);
    }
}
