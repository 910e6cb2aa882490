//! Mapping a file's pages in ahead of their first write, so the page fault (and, on
//! tmpfs, the zeroing of a fresh page) does not land inside that write: real
//! persistent memory, and memory a NIC writes, are mapped up front.

/// Populates the page tables of `[off, off + len)` of the mapping at `base`, whole
/// pages, for writing (`MADV_POPULATE_WRITE`): no byte changes, but a file's pages
/// are write-faulted (dirty). Best effort: a kernel without it (before 5.14) faults
/// the pages in at their first write instead.
///
/// # Safety
/// `base` is the page-aligned start of a live mapping of `mapped` bytes, and
/// `off + len <= mapped`.
pub unsafe fn populate_write(base: *mut u8, mapped: usize, off: usize, len: usize) {
    const PAGE: usize = 4096;
    let start = off / PAGE * PAGE;
    let end = (off + len).div_ceil(PAGE) * PAGE;
    let end = end.min(mapped.div_ceil(PAGE) * PAGE);
    if end > start {
        // SAFETY: [start, end) is page aligned and inside the mapping (the caller's
        // promise; the kernel maps whole pages); MADV_POPULATE_WRITE only fills page
        // tables and never changes contents.
        unsafe {
            libc::madvise(
                base.add(start).cast(),
                end - start,
                libc::MADV_POPULATE_WRITE,
            )
        };
    }
}
