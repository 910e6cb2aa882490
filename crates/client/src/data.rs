//! The data path (paper §5): reads go extent index → page address → the mapped local
//! pool, the DRAM cache, or a one-sided read of the store (then cached); writes are
//! copy-on-write: new pages are filled (partial pages start as a copy of the old page),
//! written and made durable per the consistency mode, then a write entry naming them
//! is log-committed. The cache is keyed by page address, so it never needs
//! invalidation: a new version of a file page lives at a new address.

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use lru::LruCache;
use orion_format::{Entry, FileType, Gpa, Tail, WriteRec, PAGE_SIZE};
use orion_meta::error::{EFBIG, EINVAL, EISDIR, ESTALE};
use orion_meta::{Clock, FsError, SystemClock, MAX_FILE_SIZE};
use orion_proto::{Commit, ReplyBody, Request};

use crate::alloc::Chunks;
use crate::arbitration::InodeCache;
use crate::staging::Staging;

use crate::link::{io_err, Fail, Link, Res};

const PS: u64 = PAGE_SIZE;
/// Most bytes one log commit covers; longer writes commit in pieces.
pub const MAX_PIECE: u64 = 4 << 20;
/// How often an update refused because another client committed first is run again.
pub(crate) const MAX_REEXECUTIONS: usize = 10_000;

/// Data pages read from remote stores, by address. A page address can name new
/// content only after the page was freed and the MDS's grace period passed, so an
/// entry is trusted for half the grace period after it was read or written, and read
/// again after that.
pub struct PageCache {
    lru: LruCache<Gpa, (Instant, Box<[u8]>)>,
}

impl PageCache {
    pub fn new(mib: u64) -> PageCache {
        let pages = (mib * (1 << 20) / PS).max(1) as usize;
        PageCache {
            lru: LruCache::new(NonZeroUsize::new(pages).expect("at least one page")),
        }
    }

    fn get(&mut self, g: &Gpa, ttl: Duration) -> Option<&[u8]> {
        let fresh = self.lru.peek(g).is_some_and(|(t, _)| t.elapsed() < ttl);
        if !fresh {
            self.lru.pop(g);
            return None;
        }
        self.lru.get(g).map(|(_, p)| &p[..])
    }

    fn has(&self, g: &Gpa, ttl: Duration) -> bool {
        self.lru.peek(g).is_some_and(|(t, _)| t.elapsed() < ttl)
    }

    fn put(&mut self, g: Gpa, page: &[u8]) {
        self.lru.put(g, (Instant::now(), page.into()));
    }
}

/// The engine of the data path; borrows the client's parts for one operation.
pub struct Data<'a> {
    pub link: &'a mut Link,
    pub cache: &'a mut InodeCache,
    pub chunks: &'a mut Chunks,
    pub pages: &'a mut PageCache,
    pub staging: &'a mut Staging,
}

fn regular(ftype: FileType) -> Res<()> {
    match ftype {
        FileType::Regular => Ok(()),
        FileType::Directory => Err(EISDIR.into()),
        _ => Err(EINVAL.into()),
    }
}

impl Data<'_> {
    /// Reads one page (symlink targets, truncation copies).
    pub fn read_page(&mut self, gpa: Gpa, out: &mut [u8]) -> Res<()> {
        self.fetch(&[Some(gpa)], out)
    }

    /// Fills `out` (whole pages) with the pages at `gpas` (`None`: a hole, zeros).
    fn fetch(&mut self, gpas: &[Option<Gpa>], out: &mut [u8]) -> Res<()> {
        let mut i = 0;
        while i < gpas.len() {
            let at = i * PS as usize;
            let Some(g) = gpas[i] else {
                out[at..at + PS as usize].fill(0);
                i += 1;
                continue;
            };
            let local = self
                .link
                .stores
                .get(&g.group())
                .is_some_and(|s| s.local.is_some());
            let ttl = self.link.grace / 2;
            if !local {
                if let Some(p) = self.pages.get(&g, ttl) {
                    out[at..at + PS as usize].copy_from_slice(p);
                    self.link.stats.cache_hits += 1;
                    i += 1;
                    continue;
                }
            }
            // A run of consecutive addresses not cached: one read.
            let mut n = 1;
            while i + n < gpas.len()
                && gpas[i + n] == Some(g.offset_by(n as u64))
                && (local || !self.pages.has(&g.offset_by(n as u64), ttl))
            {
                n += 1;
            }
            let dst = &mut out[at..at + n * PS as usize];
            self.link.read_pages(g, n, dst)?;
            if !local {
                for k in 0..n {
                    let page = &dst[k * PS as usize..(k + 1) * PS as usize];
                    self.pages.put(g.offset_by(k as u64), page);
                }
            }
            i += n;
        }
        Ok(())
    }

    pub fn read(&mut self, ino: u64, gen: u64, off: u64, len: usize) -> Res<Vec<u8>> {
        let c = self.cache.refresh(self.link, ino)?;
        same_file(c.generation, gen)?;
        regular(c.state.attr.ftype)?;
        // This client's staged writes are part of the file for it.
        let size = c.state.attr.size.max(self.staging.end(ino, gen));
        if off >= size || len == 0 {
            return Ok(Vec::new());
        }
        let end = size.min(off.saturating_add(len as u64));
        let first = off / PS;
        let last = (end - 1) / PS;
        let file = c.state.file().expect("regular file");
        let staging = &*self.staging;
        let gpas: Vec<Option<Gpa>> = (first..=last)
            .map(|p| staging.page(ino, gen, p).or_else(|| file.get(p)))
            .collect();
        let mut buf = vec![0u8; gpas.len() * PS as usize];
        self.fetch(&gpas, &mut buf)?;
        let skip = (off - first * PS) as usize;
        buf.drain(..skip);
        buf.truncate((end - off) as usize);
        Ok(buf)
    }

    /// Writes `data` at `off` (at the end of the file when `append`); returns where
    /// the write landed.
    pub fn write(&mut self, ino: u64, gen: u64, off: u64, data: &[u8], append: bool) -> Res<u64> {
        let mut pos = off;
        let mut done = 0;
        let mut first_at = None;
        while done < data.len() {
            let n = (data.len() - done).min(MAX_PIECE as usize);
            let at = self.write_piece(ino, gen, pos, &data[done..done + n], append)?;
            first_at.get_or_insert(at);
            pos = at + n as u64;
            done += n;
        }
        Ok(first_at.unwrap_or(off))
    }

    fn write_piece(&mut self, ino: u64, gen: u64, off: u64, data: &[u8], append: bool) -> Res<u64> {
        let mut pages: Option<Vec<(Gpa, u64)>> = None;
        let r = self.write_attempts(ino, gen, off, data, append, &mut pages);
        if let (Err(Fail::Fs(FsError::Errno(_))), Some(p)) = (&r, pages) {
            // Refused, so never committed: the pages are still ours to reuse. After
            // any other failure the commit may have landed; the pages are not reused
            // (the MDS takes back what was not committed when this client leaves).
            self.chunks.give_back(p);
        }
        if matches!(r, Err(Fail::Reconnected)) {
            self.reconnected();
        }
        r
    }

    fn write_attempts(
        &mut self,
        ino: u64,
        gen: u64,
        off: u64,
        data: &[u8],
        append: bool,
        pages: &mut Option<Vec<(Gpa, u64)>>,
    ) -> Res<u64> {
        // Whole pages written at a given offset do not depend on the inode's state: they
        // commit unconditionally (the MDS orders them and checks the generation), so the
        // first attempt uses the cached copy without reading its tail. A refused commit
        // runs again on a refreshed copy.
        let whole_pages =
            !append && off.is_multiple_of(PS) && (data.len() as u64).is_multiple_of(PS);
        for attempt in 0..MAX_REEXECUTIONS {
            let fast = attempt == 0
                && whole_pages
                && self
                    .cache
                    .cached(ino)
                    .is_some_and(|c| !c.shared() && c.generation == gen);
            let c = if fast {
                self.cache.cached(ino).expect("checked above")
            } else {
                self.cache.refresh(self.link, ino)?
            };
            same_file(c.generation, gen)?;
            regular(c.state.attr.ftype)?;
            let tail = c.tail;
            let shared = c.shared();
            let size = c.state.attr.size;
            let off = if append { size } else { off };
            let end = off
                .checked_add(data.len() as u64)
                .filter(|&e| e <= MAX_FILE_SIZE)
                .ok_or(EFBIG)?;
            let first = off / PS;
            let npages = (end - 1) / PS - first + 1;
            let partial = off % PS != 0 || end % PS != 0;
            // Whole pages go out from the caller's bytes, wherever the write starts
            // within a page. Only the partly covered first and last pages are assembled
            // with their old contents (a hole or past the end reads zeros).
            let file = c.state.file().expect("regular file");
            let ends = PartialEnds::new(off, end, first, npages);
            let old: Vec<Option<Gpa>> = ends.pages().map(|j| file.get(first + j)).collect();
            let mut assembled = ends.buffers();
            for ((_, buf), g) in assembled.iter_mut().zip(old) {
                self.fetch(&[g], buf)?;
            }
            ends.fill(&mut assembled, data);
            let pages_src = PageSources {
                data,
                off,
                first,
                assembled: &assembled,
            };
            // A re-executed append may land at another page offset and need another
            // number of pages.
            if let Some(p) = pages.take() {
                if p.iter().map(|r| r.1).sum::<u64>() == npages {
                    *pages = Some(p);
                } else {
                    self.chunks.give_back(p);
                }
            }
            if pages.is_none() {
                *pages = Some(self.chunks.take(self.link, npages)?);
            }
            let runs = pages.as_ref().expect("allocated").clone();
            let mut local = true;
            let mut k = 0u64;
            for &(g, n) in &runs {
                for (j, bytes) in pages_src.segments(k, n) {
                    let direct = self.link.write_pages(g.offset_by(j - k), bytes)?;
                    // Only pages of the client's own store count (others are awaited
                    // from their stores in any case).
                    local &= direct || Some(g.group()) != self.link.internal_group;
                }
                k += n;
            }
            let now = SystemClock.now();
            let mut pg = first;
            let entries: Vec<Entry> = runs
                .iter()
                .map(|&(g, n)| {
                    let e = Entry::Write(WriteRec {
                        pgoff: pg,
                        npages: n as u32,
                        gpa: g,
                        size: end,
                        mtime: now,
                    });
                    pg += n;
                    e
                })
                .collect();
            if fast && self.staging.accepts(ino, gen, npages) {
                self.link.stats.staged_writes += 1;
                let full = self.staging.stage(ino, gen, entries, local);
                *pages = None;
                if full {
                    self.flush(ino)?;
                }
                return Ok(off);
            }
            if self.staging.holds(ino) {
                // This write commits now, so what is staged for the file goes first
                // (and moves the tail a conditional commit expects: build again).
                self.flush(ino)?;
                continue;
            }
            let conditional = append || shared || partial;
            let commit = Commit {
                ino,
                generation: gen,
                expect: conditional.then_some(tail),
                persisted_locally: local,
                entries: entries.clone(),
            };
            match send_commit(self.link, commit) {
                Ok((prev, tail)) => {
                    // Committed: the pages belong to the file now.
                    *pages = None;
                    // Pages that went over the fabric are kept for reads to come.
                    let mut k = 0u64;
                    for &(g, n) in &runs {
                        if Some(g.group()) != self.link.internal_group {
                            for j in 0..n {
                                self.pages.put(g.offset_by(j), pages_src.page(k + j));
                            }
                        }
                        k += n;
                    }
                    self.cache.committed(self.link, ino, &entries, prev, tail)?;
                    return Ok(off);
                }
                Err(Fail::Fs(FsError::Errno(e))) if e == libc::ESTALE => {
                    self.link.stats.reexecutions += 1;
                }
                Err(e) => return Err(e),
            }
        }
        Err(Fail::Fs(ESTALE))
    }
}

impl Data<'_> {
    /// Commits the writes staged for `ino`, in one log commit. A refused commit gives
    /// its pages back; any failure is kept for the file's next fsync or close to
    /// report (the writes were acknowledged already).
    pub fn flush(&mut self, ino: u64) -> Res<()> {
        let Some(f) = self.staging.take(ino) else {
            return Ok(());
        };
        let commit = Commit {
            ino,
            generation: f.generation,
            expect: None,
            persisted_locally: f.persisted_locally,
            entries: f.entries.clone(),
        };
        match send_commit(self.link, commit) {
            Ok((prev, tail)) => self.cache.committed(self.link, ino, &f.entries, prev, tail),
            Err(Fail::Fs(e)) => {
                if matches!(e, FsError::Errno(_)) {
                    self.chunks.give_back(f.runs);
                }
                self.staging.record_failure(ino, f.generation, e);
                Ok(())
            }
            Err(Fail::Reconnected) => {
                // Whether the commit landed is unknown: say the writes may be lost.
                self.staging
                    .record_failure(ino, f.generation, FsError::Errno(libc::EIO));
                Err(Fail::Reconnected)
            }
        }
    }

    /// After the MDS connection was re-established: the chunks were taken back, and
    /// so were the pages of staged writes, which will not commit now.
    pub fn reconnected(&mut self) {
        self.chunks.clear();
        for ino in self.staging.files() {
            if let Some(f) = self.staging.take(ino) {
                self.staging
                    .record_failure(ino, f.generation, FsError::Errno(libc::EIO));
            }
        }
    }

    /// Commits every staged write.
    pub fn flush_all(&mut self) -> Res<()> {
        for ino in self.staging.files() {
            self.flush(ino)?;
        }
        Ok(())
    }

    /// Commits what is staged for `ino` and reports the first failure to commit a
    /// staged write of it since the last report (fsync and close).
    pub fn settle(&mut self, ino: u64, generation: u64) -> Res<()> {
        self.flush(ino)?;
        match self.staging.take_failure(ino, generation) {
            Some(e) => Err(Fail::Fs(e)),
            None => Ok(()),
        }
    }
}

/// The pages of a write that cover only part of a page: the first (when the write
/// starts inside a page) and the last (when it ends inside one); one page when the
/// write lies within a single page.
struct PartialEnds {
    head: bool,
    tail: bool,
    npages: u64,
    /// Where the write starts in its first page, and ends in its last.
    head_at: usize,
    tail_end: usize,
}

impl PartialEnds {
    fn new(off: u64, end: u64, first: u64, npages: u64) -> PartialEnds {
        let head_at = (off - first * PS) as usize;
        let tail_end = (end - (first + npages - 1) * PS) as usize;
        PartialEnds {
            head: head_at != 0 || (npages == 1 && tail_end != PS as usize),
            tail: npages > 1 && tail_end != PS as usize,
            npages,
            head_at,
            tail_end,
        }
    }

    /// The indices (within the write) of the partial pages.
    fn pages(&self) -> impl Iterator<Item = u64> {
        let head = self.head.then_some(0);
        let tail = self.tail.then_some(self.npages - 1);
        head.into_iter().chain(tail)
    }

    fn buffers(&self) -> Vec<(u64, Vec<u8>)> {
        self.pages().map(|j| (j, vec![0u8; PS as usize])).collect()
    }

    /// Copies the caller's bytes over the old contents of the partial pages.
    fn fill(&self, assembled: &mut [(u64, Vec<u8>)], data: &[u8]) {
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
            buf[lo..hi].copy_from_slice(&data[src_at..src_at + (hi - lo)]);
        }
    }
}

/// Where each page of a write comes from: an assembled partial page, or straight
/// from the caller's bytes.
struct PageSources<'a> {
    data: &'a [u8],
    off: u64,
    first: u64,
    assembled: &'a [(u64, Vec<u8>)],
}

impl<'a> PageSources<'a> {
    /// Page `j` of the write (4 KiB).
    fn page(&self, j: u64) -> &'a [u8] {
        if let Some((_, b)) = self.assembled.iter().find(|(k, _)| *k == j) {
            return b;
        }
        let at = ((self.first + j) * PS - self.off) as usize;
        &self.data[at..at + PS as usize]
    }

    /// Pages `k..k + n` as contiguous byte runs, each with the index of its first
    /// page: the caller's bytes in one run, assembled pages alone.
    fn segments(&self, k: u64, n: u64) -> Vec<(u64, &'a [u8])> {
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
        out
    }
}

/// Sends a log commit; returns where the MDS placed it (the tails before and after).
pub fn send_commit(link: &mut Link, c: Commit) -> Res<(Tail, Tail)> {
    link.stats.commits += 1;
    match link.call(&Request::Commit(c))? {
        ReplyBody::Committed { prev, tail } => Ok((prev, tail)),
        other => Err(io_err(format!("unexpected reply to a log commit: {other:?}")).into()),
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
