//! The partly covered first and last pages of a write, assembled with their old
//! contents, and where each page of a write comes from.

use super::PS;

/// The pages of a write that cover only part of a page: the first (when the write
/// starts inside a page) and the last (when it ends inside one); one page when the
/// write lies within a single page.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PartialEnds {
    head: bool,
    tail: bool,
    npages: u64,
    /// Where the write starts in its first page, and ends in its last.
    head_at: usize,
    tail_end: usize,
}

impl PartialEnds {
    pub(crate) fn new(off: u64, end: u64, first: u64, npages: u64) -> PartialEnds {
        let head_at = (off - first * PS) as usize;
        let tail_end = (end - (first + npages - 1) * PS) as usize;
        // `first` is the page of `off` and the last page the page of `end - 1`.
        debug_assert!(
            head_at < PS as usize && tail_end > 0 && tail_end <= PS as usize,
            "the write's ends lie in its first and last pages: {head_at}, {tail_end}"
        );
        PartialEnds {
            head: head_at != 0 || (npages == 1 && tail_end != PS as usize),
            tail: npages > 1 && tail_end != PS as usize,
            npages,
            head_at,
            tail_end,
        }
    }

    /// The indices (within the write) of the partial pages.
    pub(crate) fn pages(&self) -> impl Iterator<Item = u64> {
        let head = self.head.then_some(0);
        let tail = self.tail.then_some(self.npages - 1);
        head.into_iter().chain(tail)
    }

    pub(crate) fn buffers(&self) -> Vec<(u64, Vec<u8>)> {
        self.pages().map(|j| (j, vec![0u8; PS as usize])).collect()
    }

    /// Copies the caller's bytes over the old contents of the partial pages.
    pub(crate) fn fill(&self, assembled: &mut [(u64, Vec<u8>)], data: &[u8]) {
        // `data` is the write these ends were computed from: it runs from `head_at`
        // in the first page to `tail_end` in the last.
        debug_assert_eq!(
            self.head_at + data.len(),
            (self.npages - 1) as usize * PS as usize + self.tail_end,
            "the bytes are the write's whose ends these are"
        );
        for (j, buf) in assembled.iter_mut() {
            // The write's bytes that land in page j, and where in the page.
            let page_start = *j * PS;
            let lo = if *j == 0 { self.head_at } else { 0 };
            let hi = if *j == self.npages - 1 {
                self.tail_end
            } else {
                PS as usize
            };
            let src_at = (page_start + lo as u64 - self.head_at as u64) as usize;
            orion_pmem::copy_bytes(&mut buf[lo..hi], &data[src_at..src_at + (hi - lo)]);
        }
    }
}

/// Where each page of a write comes from: an assembled partial page, or straight
/// from the caller's bytes.
pub(crate) struct PageSources<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) off: u64,
    pub(crate) first: u64,
    pub(crate) assembled: &'a [(u64, Vec<u8>)],
}

impl<'a> PageSources<'a> {
    /// Page `j` of the write (4 KiB).
    pub(crate) fn page(&self, j: u64) -> &'a [u8] {
        if let Some((_, b)) = self.assembled.iter().find(|(k, _)| *k == j) {
            return b;
        }
        let at = ((self.first + j) * PS - self.off) as usize;
        &self.data[at..at + PS as usize]
    }

    /// Pages `k..k + n` as contiguous byte runs, each with the index of its first
    /// page: the caller's bytes in one run, assembled pages alone.
    pub(crate) fn segments(&self, k: u64, n: u64) -> Vec<(u64, &'a [u8])> {
        let mut out: Vec<(u64, &'a [u8])> = Vec::new();
        let mut j = k;
        while j < k + n {
            if self.assembled.iter().any(|(a, _)| *a == j) {
                out.push((j, self.page(j)));
                j += 1;
                continue;
            }
            let start = j;
            while j < k + n && !self.assembled.iter().any(|(a, _)| *a == j) {
                j += 1;
            }
            let at = ((self.first + start) * PS - self.off) as usize;
            out.push((start, &self.data[at..at + ((j - start) * PS) as usize]));
        }
        debug_assert_eq!(
            out.iter().map(|(_, b)| b.len() as u64).sum::<u64>(),
            n * PS,
            "the segments cover the pages asked, whole"
        );
        out
    }
}
