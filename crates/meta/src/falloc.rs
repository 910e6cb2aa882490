//! fallocate(2) planned against an inode's state, the same way by the local file
//! system and a client: which bytes to overwrite with zeros (parts of pages), which
//! whole pages become a hole, how many pages must be free, and the new size.
//!
//! Supported modes are those tmpfs has: preallocation (0, KEEP_SIZE) and
//! PUNCH_HOLE|KEEP_SIZE. Pages are copy-on-write, so preallocation checks for room
//! and sets the size but cannot hold pages for later overwrites (as on other
//! copy-on-write file systems).

use orion_format::{attr_mask, Entry, FileType, SetAttrRec, PAGE_SIZE};

use crate::error::{FsResult, EFBIG, EINVAL, EISDIR, EOPNOTSUPP, NO_DATA_PAGES};
use crate::index::InodeState;
use crate::MAX_FILE_SIZE;

const PS: u64 = PAGE_SIZE;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FallocPlan {
    /// Byte ranges, each inside one page, to overwrite with zeros ...
    pub zero_ranges: Vec<(u64, u64)>,
    /// ... and whole pages `[first, first + n)` that become a hole.
    pub hole: Option<(u64, u64)>,
    /// Pages that must be free: the range's pages not yet mapped.
    pub reserve_pages: u64,
    pub new_size: Option<u64>,
}

impl FallocPlan {
    pub fn new(state: &InodeState, off: u64, len: u64, mode: i32) -> FsResult<FallocPlan> {
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        // In the order of Linux's vfs_fallocate, then the modes tmpfs refuses.
        if len == 0 || off > i64::MAX as u64 || len > i64::MAX as u64 {
            return Err(EINVAL);
        }
        if mode & PUNCH != 0 && mode & KEEP == 0 {
            return Err(EOPNOTSUPP);
        }
        match state.attr.ftype {
            FileType::Regular => {}
            FileType::Directory => return Err(EISDIR),
            _ => return Err(crate::error::FsError::Errno(libc::ENODEV)),
        }
        let end = off
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(EFBIG)?;
        if mode & !(KEEP | PUNCH) != 0 {
            return Err(EOPNOTSUPP);
        }
        let size = state.attr.size;
        let file = state.file().expect("regular file");
        if mode & PUNCH != 0 {
            let hi = end.min(size);
            if off >= hi {
                return Ok(FallocPlan::nothing());
            }
            // A punch reaching the end of the file takes the last page whole: its bytes
            // past the size read as zeros anyway.
            let first = off.div_ceil(PS);
            let last = if end >= size {
                size.div_ceil(PS)
            } else {
                hi / PS
            };
            let hole = (last > first).then(|| (first, last - first));
            let in_hole = |at: u64| hole.is_some_and(|(f, n)| (f..f + n).contains(&(at / PS)));
            let zero_ranges = partial_page_ranges(off, hi)
                .into_iter()
                .filter(|&(s, _)| !in_hole(s))
                .collect();
            return Ok(FallocPlan {
                zero_ranges,
                hole,
                reserve_pages: 0,
                new_size: None,
            });
        }
        let (first, last) = (off / PS, end.div_ceil(PS));
        let mapped = file.mapped_in(first, last);
        Ok(FallocPlan {
            zero_ranges: Vec::new(),
            hole: None,
            reserve_pages: (last - first) - mapped,
            new_size: (mode & KEEP == 0 && end > size).then_some(end),
        })
    }

    fn nothing() -> FallocPlan {
        FallocPlan {
            zero_ranges: Vec::new(),
            hole: None,
            reserve_pages: 0,
            new_size: None,
        }
    }

    /// The entries to commit once the zero ranges are written: the hole, and the
    /// times (Linux changes mtime and ctime on every fallocate) with any new size.
    pub fn entries(&self, now: i64) -> Vec<Entry> {
        let mut out: Vec<Entry> = self
            .hole
            .map(|(pgoff, npages)| Entry::Hole {
                pgoff,
                npages,
                mtime: now,
            })
            .into_iter()
            .collect();
        let mut attr = SetAttrRec {
            mask: attr_mask::MTIME | attr_mask::CTIME,
            mtime: now,
            ctime: now,
            ..Default::default()
        };
        if let Some(size) = self.new_size {
            attr.mask |= attr_mask::SIZE;
            attr.size = size;
        }
        out.push(Entry::SetAttr(attr));
        out
    }

    /// ENOSPC when fewer than the pages it needs are free.
    pub fn check_room(&self, free_pages: u64) -> FsResult<()> {
        if self.reserve_pages > free_pages {
            return Err(NO_DATA_PAGES);
        }
        Ok(())
    }
}

/// The parts of pages in `[lo, hi)`: the range itself when it lies inside one page
/// without covering it, else its unaligned head and tail. Whole pages are left out.
pub fn partial_page_ranges(lo: u64, hi: u64) -> Vec<(u64, u64)> {
    if lo >= hi {
        return Vec::new();
    }
    if lo / PS == (hi - 1) / PS {
        return if lo.is_multiple_of(PS) && hi.is_multiple_of(PS) {
            Vec::new()
        } else {
            vec![(lo, hi)]
        };
    }
    let mut out = Vec::new();
    if !lo.is_multiple_of(PS) {
        out.push((lo, lo.div_ceil(PS) * PS));
    }
    if !hi.is_multiple_of(PS) {
        out.push((hi / PS * PS, hi));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use orion_format::{Gpa, WriteRec};

    fn file(size: u64, pages: u64) -> InodeState {
        let mut st = InodeState::new(9, FileType::Regular, 1);
        let mut freed = Vec::new();
        if pages > 0 {
            let w = Entry::Write(WriteRec {
                pgoff: 0,
                npages: pages as u32,
                gpa: Gpa(100),
                size,
                mtime: 1,
            });
            st.apply(&w, &mut freed).unwrap();
        }
        st.attr.size = size;
        st
    }
    const PH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;

    #[test]
    fn punch_splits_into_partial_pages_and_a_hole() {
        let f = file(10 * PS, 10);
        let p = FallocPlan::new(&f, 100, 3 * PS, PH).unwrap();
        assert_eq!(p.zero_ranges, vec![(100, PS), (3 * PS, 3 * PS + 100)]);
        assert_eq!(p.hole, Some((1, 2)));
        // Up to and past the end: the last page goes whole, the size stays.
        let f = file(5 * PS + 10, 6);
        let p = FallocPlan::new(&f, 2 * PS, 100 * PS, PH).unwrap();
        assert_eq!(
            (p.zero_ranges.clone(), p.hole, p.new_size),
            (vec![], Some((2, 4)), None)
        );
        // Inside one page.
        let p = FallocPlan::new(&f, 10, 20, PH).unwrap();
        assert_eq!((p.zero_ranges, p.hole), (vec![(10, 30)], None));
        // Past the end: nothing.
        assert_eq!(
            FallocPlan::new(&f, 9 * PS, 1, PH).unwrap(),
            FallocPlan::nothing()
        );
    }

    #[test]
    fn preallocation_counts_unmapped_pages_and_grows_the_size() {
        let f = file(2 * PS, 2);
        let p = FallocPlan::new(&f, PS, 3 * PS, 0).unwrap();
        assert_eq!((p.reserve_pages, p.new_size), (2, Some(4 * PS)));
        let p = FallocPlan::new(&f, PS, 3 * PS, libc::FALLOC_FL_KEEP_SIZE).unwrap();
        assert_eq!((p.reserve_pages, p.new_size), (2, None));
        assert_eq!(p.check_room(1), Err(NO_DATA_PAGES));
    }

    #[test]
    fn bad_modes_and_lengths() {
        let f = file(PS, 1);
        assert_eq!(
            FallocPlan::new(&f, 0, 1, libc::FALLOC_FL_PUNCH_HOLE),
            Err(EOPNOTSUPP)
        );
        assert_eq!(
            FallocPlan::new(&f, 0, 1, libc::FALLOC_FL_ZERO_RANGE),
            Err(EOPNOTSUPP)
        );
        assert_eq!(FallocPlan::new(&f, 0, 0, 0), Err(EINVAL));
        assert_eq!(FallocPlan::new(&f, MAX_FILE_SIZE, 1, 0), Err(EFBIG));
        let d = InodeState::new(3, FileType::Directory, 1);
        assert_eq!(FallocPlan::new(&d, 0, 1, 0), Err(EISDIR));
    }

    #[test]
    fn partial_ranges() {
        assert_eq!(partial_page_ranges(0, PS), vec![]);
        assert_eq!(
            partial_page_ranges(0, 2 * PS + 1),
            vec![(2 * PS, 2 * PS + 1)]
        );
        assert_eq!(partial_page_ranges(5, 6), vec![(5, 6)]);
    }
}
