//! The extent index of a regular file: runs of file pages mapped to consecutive
//! data pages, each with the write entry that mapped it, and how many pages each
//! write entry still maps (an entry that maps none is dead, for log GC).
//!
//! One index entry per run, not per page (design note 72): a file written in
//! large writes costs a few entries however big it is, in the MDS's DRAM (it holds
//! every inode) and in each client's cache, a write of n pages is one insertion,
//! and a log GC, which lists the runs inside the commit that triggers it, walks
//! entries, not pages. An overwrite splits the runs it cuts into.

use std::collections::BTreeMap;

use orion_format::{Gpa, WriteRec, MAX_WRITE_PAGES};

/// File pages from a first one (the map's key) mapped to consecutive data pages
/// by one write entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Extent {
    gpa: Gpa,
    pages: u64,
    write_seq: u64,
}

#[derive(Default, Debug)]
pub struct FileIndex {
    /// First file page → its run. Runs never overlap.
    extents: BTreeMap<u64, Extent>,
    /// Pages mapped, over all runs.
    mapped: u64,
    /// Write entry → pages it still maps.
    live_pages: crate::FastMap<u64, u64>,
    next_seq: u64,
}

impl FileIndex {
    /// The data page of file page `pgoff`, if it is mapped.
    pub fn get(&self, pgoff: u64) -> Option<Gpa> {
        let (&first, e) = self.extents.range(..=pgoff).next_back()?;
        (pgoff - first < e.pages).then(|| e.gpa.offset_by(pgoff - first))
    }

    /// Write entries that still map at least one page.
    pub fn live_writes(&self) -> u64 {
        self.live_pages.len() as u64
    }

    /// Pages mapped.
    pub fn mapped(&self) -> u64 {
        self.mapped
    }

    pub fn is_empty(&self) -> bool {
        self.mapped == 0
    }

    /// Entries of the index: what a log GC walks to list the runs.
    pub fn extents(&self) -> u64 {
        self.extents.len() as u64
    }

    /// Pages mapped among file pages `first..end`.
    pub fn mapped_in(&self, first: u64, end: u64) -> u64 {
        if first >= end {
            return 0;
        }
        self.overlapping(first, end)
            .map(|(at, e)| at.max(first).abs_diff((at + e.pages).min(end)))
            .sum()
    }

    /// The last mapped file page.
    pub fn last_page(&self) -> Option<u64> {
        (self.extents.iter().next_back()).map(|(&at, e)| at + e.pages - 1)
    }

    /// Every mapped file page with its data page, in file order.
    pub fn pages(&self) -> impl Iterator<Item = (u64, Gpa)> + '_ {
        (self.extents.iter())
            .flat_map(|(&at, e)| (0..e.pages).map(move |i| (at + i, e.gpa.offset_by(i))))
    }

    /// The runs that hold any of file pages `first..end`, in file order.
    fn overlapping(&self, first: u64, end: u64) -> impl Iterator<Item = (u64, &Extent)> + '_ {
        let before =
            (self.extents.range(..first).next_back()).filter(|(&at, e)| at + e.pages > first);
        let from = match first < end {
            true => Some(self.extents.range(first..end)),
            false => None,
        };
        before
            .into_iter()
            .chain(from.into_iter().flatten())
            .map(|(&at, e)| (at, e))
    }

    pub(crate) fn map(&mut self, w: &WriteRec, freed: &mut Vec<Gpa>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let n = w.npages as u64;
        self.live_pages.insert(seq, n);
        if n == 0 {
            return;
        }
        let new = Extent {
            gpa: w.gpa,
            pages: n,
            write_seq: seq,
        };
        // The common overwrite, inside one run: a file's first overwrites cut its
        // large runs, and later ones replace runs cut to their size. One lookup,
        // and an insertion for each part of the run that stays on either side.
        if let Some((&at, e)) = self.extents.range_mut(..=w.pgoff).next_back() {
            let (off, old) = (w.pgoff - at, *e);
            if off + n <= old.pages {
                match off {
                    0 => *e = new,
                    _ => e.pages = off,
                }
                freed.extend((off..off + n).map(|i| old.gpa.offset_by(i)));
                self.uncount(old.write_seq, n);
                let tail = old.pages - off - n;
                if tail > 0 {
                    let rest = Extent {
                        gpa: old.gpa.offset_by(off + n),
                        pages: tail,
                        write_seq: old.write_seq,
                    };
                    self.extents.insert(w.pgoff + n, rest);
                }
                if off > 0 {
                    self.extents.insert(w.pgoff, new);
                }
                return;
            }
        }
        self.unmap(w.pgoff, w.pgoff.saturating_add(n), freed);
        self.extents.insert(w.pgoff, new);
        self.mapped += n;
    }

    /// Unmaps `n` pages from `first` (a punched hole).
    pub(crate) fn punch(&mut self, first: u64, n: u64, freed: &mut Vec<Gpa>) {
        self.unmap(first, first.saturating_add(n), freed);
    }

    /// Drops every page at or past `first_dropped`.
    pub(crate) fn truncate_pages(&mut self, first_dropped: u64, freed: &mut Vec<Gpa>) {
        self.unmap(first_dropped, u64::MAX, freed);
    }

    /// Unmaps file pages `first..end`: their data pages go to `freed` (in file
    /// order), and the runs cut by either end keep their pages outside the range,
    /// still counted to the write entries that mapped them.
    fn unmap(&mut self, first: u64, end: u64, freed: &mut Vec<Gpa>) {
        if first >= end {
            return;
        }
        // A run from before the range that reaches into it: its part from `first`
        // is taken as a run of its own.
        if let Some((&at, e)) = self.extents.range(..first).next_back() {
            if at + e.pages > first {
                let e = *e;
                let kept = first - at;
                self.extents.get_mut(&at).expect("found above").pages = kept;
                let rest = Extent {
                    gpa: e.gpa.offset_by(kept),
                    pages: e.pages - kept,
                    write_seq: e.write_seq,
                };
                self.extents.insert(first, rest);
            }
        }
        // The runs from `first` on that start in the range, one lookup each (a run
        // put back at `end` is past it).
        while let Some((&at, _)) = self.extents.range(first..end).next() {
            let e = self.extents.remove(&at).expect("found above");
            let gone = e.pages.min(end - at);
            freed.extend((0..gone).map(|i| e.gpa.offset_by(i)));
            self.mapped -= gone;
            self.uncount(e.write_seq, gone);
            if gone < e.pages {
                let rest = Extent {
                    gpa: e.gpa.offset_by(gone),
                    pages: e.pages - gone,
                    write_seq: e.write_seq,
                };
                self.extents.insert(end, rest);
            }
        }
    }

    /// Write entry `seq` maps `pages` pages fewer.
    fn uncount(&mut self, seq: u64, pages: u64) {
        if let Some(c) = self.live_pages.get_mut(&seq) {
            *c -= pages;
            if *c == 0 {
                self.live_pages.remove(&seq);
            }
        }
    }

    /// Maximal runs of file pages mapped to consecutive data pages (whichever
    /// entries mapped them), each at most one write entry long: what a compacted
    /// log writes, one write entry per run.
    pub fn runs(&self) -> Vec<(u64, Gpa, u32)> {
        let mut runs: Vec<(u64, Gpa, u64)> = Vec::new();
        for (&at, e) in &self.extents {
            let (mut at, mut gpa, mut left) = (at, e.gpa, e.pages);
            while left > 0 {
                match runs.last_mut() {
                    Some(last) if continues(*last, at, gpa) => {
                        let n = left.min(MAX_WRITE_PAGES as u64 - last.2);
                        last.2 += n;
                        (at, gpa, left) = (at + n, gpa.offset_by(n), left - n);
                    }
                    _ => {
                        let n = left.min(MAX_WRITE_PAGES as u64);
                        runs.push((at, gpa, n));
                        (at, gpa, left) = (at + n, gpa.offset_by(n), left - n);
                    }
                }
            }
        }
        runs.into_iter()
            .map(|(at, g, n)| (at, g, n as u32))
            .collect()
    }

    /// After log GC rewrote the file's writes as `runs` ([`FileIndex::runs`], one
    /// write entry per run, in order), each run is one live entry: the index becomes
    /// those runs, each with a sequence number of its own, so later overwrites count
    /// dead entries against the compacted log. The runs come from the compacted
    /// entries, not listed again.
    pub(crate) fn renumber_as_runs(&mut self, runs: impl IntoIterator<Item = (u64, Gpa, u32)>) {
        self.extents.clear();
        self.live_pages.clear();
        for (at, gpa, n) in runs {
            let seq = self.next_seq;
            self.next_seq += 1;
            let e = Extent {
                gpa,
                pages: n as u64,
                write_seq: seq,
            };
            self.extents.insert(at, e);
            self.live_pages.insert(seq, n as u64);
        }
    }
}

/// Whether file page `at`, mapped to `gpa`, continues the run `last` (file page,
/// data page, length) within one write entry's length.
fn continues(last: (u64, Gpa, u64), at: u64, gpa: Gpa) -> bool {
    last.0 + last.2 == at && last.1.offset_by(last.2) == gpa && last.2 < MAX_WRITE_PAGES as u64
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use proptest::prelude::*;

    use super::*;

    /// The reference: one entry per page, as the index was before design note 72.
    #[derive(Default)]
    struct PerPage {
        pages: BTreeMap<u64, (Gpa, u64)>,
        live: HashMap<u64, u64>,
        next_seq: u64,
    }

    impl PerPage {
        fn drop_page(&mut self, pg: u64, freed: &mut Vec<Gpa>) {
            if let Some((gpa, seq)) = self.pages.remove(&pg) {
                freed.push(gpa);
                let c = self.live.get_mut(&seq).unwrap();
                *c -= 1;
                if *c == 0 {
                    self.live.remove(&seq);
                }
            }
        }

        fn apply(&mut self, op: &Op, freed: &mut Vec<Gpa>) {
            match *op {
                Op::Write { pgoff, npages, gpa } => {
                    let seq = self.next_seq;
                    self.next_seq += 1;
                    for i in 0..npages as u64 {
                        self.drop_page(pgoff + i, freed);
                        self.pages.insert(pgoff + i, (Gpa::new(0, gpa + i), seq));
                    }
                    self.live.insert(seq, npages as u64);
                }
                Op::Punch { first, n } => {
                    for pg in first..first + n {
                        self.drop_page(pg, freed);
                    }
                }
                Op::Truncate { first } => {
                    let gone: Vec<u64> = self.pages.range(first..).map(|(&p, _)| p).collect();
                    for pg in gone {
                        self.drop_page(pg, freed);
                    }
                }
                Op::Compact => {
                    let runs = self.runs();
                    self.live.clear();
                    for (at, _, n) in runs {
                        let seq = self.next_seq;
                        self.next_seq += 1;
                        for pg in at..at + n as u64 {
                            self.pages.get_mut(&pg).unwrap().1 = seq;
                        }
                        self.live.insert(seq, n as u64);
                    }
                }
            }
        }

        fn runs(&self) -> Vec<(u64, Gpa, u32)> {
            let mut runs: Vec<(u64, Gpa, u64)> = Vec::new();
            for (&pg, &(gpa, _)) in &self.pages {
                match runs.last_mut() {
                    Some(last) if continues(*last, pg, gpa) => last.2 += 1,
                    _ => runs.push((pg, gpa, 1)),
                }
            }
            runs.into_iter().map(|(a, g, n)| (a, g, n as u32)).collect()
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Write { pgoff: u64, npages: u32, gpa: u64 },
        Punch { first: u64, n: u64 },
        Truncate { first: u64 },
        Compact,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u64..48, 1u32..16, 0u64..96)
                .prop_map(|(pgoff, npages, gpa)| Op::Write { pgoff, npages, gpa }),
            // Small writes over few pages: many replace a run exactly.
            4 => (0u64..6, 1u32..3, 0u64..96)
                .prop_map(|(pgoff, npages, gpa)| Op::Write { pgoff, npages, gpa }),
            2 => (0u64..64, 0u64..20).prop_map(|(first, n)| Op::Punch { first, n }),
            1 => (0u64..70).prop_map(|first| Op::Truncate { first }),
            1 => Just(Op::Compact),
        ]
    }

    fn apply(f: &mut FileIndex, op: &Op, freed: &mut Vec<Gpa>) {
        match *op {
            Op::Write { pgoff, npages, gpa } => {
                let w = WriteRec {
                    pgoff,
                    npages,
                    gpa: Gpa::new(0, gpa),
                    size: 0,
                    mtime: 0,
                };
                f.map(&w, freed)
            }
            Op::Punch { first, n } => f.punch(first, n, freed),
            Op::Truncate { first } => f.truncate_pages(first, freed),
            Op::Compact => {
                let runs = f.runs();
                f.renumber_as_runs(runs)
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// After every operation the index maps exactly the pages the per-page
        /// reference maps, frees the same data pages, counts the same live write
        /// entries, lists the same runs, and answers every range count.
        #[test]
        fn the_extent_index_matches_a_per_page_reference(ops in proptest::collection::vec(op(), 1..60)) {
            let (mut f, mut model) = (FileIndex::default(), PerPage::default());
            for op in &ops {
                let (mut got, mut want) = (Vec::new(), Vec::new());
                apply(&mut f, op, &mut got);
                model.apply(op, &mut want);
                prop_assert_eq!(&got, &want, "freed by {:?}", op);
                let pages: Vec<(u64, Gpa)> = f.pages().collect();
                let model_pages: Vec<(u64, Gpa)> =
                    model.pages.iter().map(|(&p, &(g, _))| (p, g)).collect();
                prop_assert_eq!(&pages, &model_pages, "after {:?}", op);
                prop_assert_eq!(f.mapped(), model.pages.len() as u64);
                prop_assert_eq!(f.is_empty(), model.pages.is_empty());
                prop_assert_eq!(f.last_page(), model.pages.keys().next_back().copied());
                prop_assert_eq!(f.live_writes(), model.live.len() as u64, "after {:?}", op);
                prop_assert_eq!(f.runs(), model.runs());
                for pg in 0..72 {
                    prop_assert_eq!(f.get(pg), model.pages.get(&pg).map(|&(g, _)| g));
                }
                for (a, b) in [(0, 72), (5, 9), (10, 10), (30, 31), (17, 64)] {
                    let want = model.pages.range(a..b).count() as u64;
                    prop_assert_eq!(f.mapped_in(a, b), want, "pages {}..{}", a, b);
                }
                // Runs never overlap, and none is empty.
                let mut end = 0;
                for (&at, e) in &f.extents {
                    prop_assert!(at >= end && e.pages > 0);
                    end = at + e.pages;
                }
            }
        }
    }

    /// A run of consecutive data pages longer than one write entry may map is
    /// listed as several, each at most that long, however its writes fell.
    #[test]
    fn runs_are_cut_at_the_longest_write() {
        let max = MAX_WRITE_PAGES as u64;
        let mut f = FileIndex::default();
        let mut freed = Vec::new();
        let write = |pgoff: u64, npages: u64| WriteRec {
            pgoff,
            npages: npages as u32,
            gpa: Gpa::new(1, 1000 + pgoff),
            size: 0,
            mtime: 0,
        };
        f.map(&write(0, max - 1), &mut freed);
        f.map(&write(max - 1, max), &mut freed);
        f.map(&write(2 * max - 1, 3), &mut freed);
        let runs = f.runs();
        let lens: Vec<u32> = runs.iter().map(|r| r.2).collect();
        assert_eq!(lens, vec![max as u32, max as u32, 2]);
        assert_eq!(runs[1].0, max);
        assert_eq!(runs[1].1, Gpa::new(1, 1000 + max));
        let runs = f.runs();
        f.renumber_as_runs(runs);
        assert_eq!(
            (f.extents(), f.live_writes(), f.mapped()),
            (3, 3, 2 * max + 2)
        );
        assert!(freed.is_empty());
        assert_eq!(f.get(2 * max + 1), Some(Gpa::new(1, 1000 + 2 * max + 1)));
        assert_eq!(f.get(2 * max + 2), None);
    }
}
