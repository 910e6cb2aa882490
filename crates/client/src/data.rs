//! The data path (paper §5): reads go extent index → page address → the mapped local
//! pool, the DRAM cache, or a one-sided read of the store (then cached); writes are
//! copy-on-write: new pages are filled (partial pages start as a copy of the old page),
//! written and made durable per the consistency mode, then a write entry naming them
//! is log-committed. The cache is keyed by page address, so it never needs
//! invalidation: a new version of a file page lives at a new address.

use std::borrow::Cow;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use lru::LruCache;
use orion_format::{Entry, FileType, Gpa, Tail, WriteRec, PAGE_SIZE};
use orion_meta::error::{EFBIG, EINVAL, EISDIR, ESTALE};
use orion_meta::{Clock, FsError, SystemClock, MAX_FILE_SIZE};
use orion_proto::{Commit, ReplyBody, Request};

use crate::alloc::Chunks;
use crate::arbitration::InodeCache;

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
        let size = c.state.attr.size;
        if off >= size || len == 0 {
            return Ok(Vec::new());
        }
        let end = size.min(off.saturating_add(len as u64));
        let first = off / PS;
        let last = (end - 1) / PS;
        let file = c.state.file().expect("regular file");
        let gpas: Vec<Option<Gpa>> = (first..=last).map(|p| file.get(p)).collect();
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
            self.chunks.clear();
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
            // Whole pages go out from the caller's bytes. Partly covered pages are
            // assembled with their old contents (a hole or past the end reads zeros).
            let buf: Cow<[u8]> = if partial {
                let file = c.state.file().expect("regular file");
                let mut old: Vec<Option<Gpa>> = vec![None; npages as usize];
                if off % PS != 0 {
                    old[0] = file.get(first);
                }
                if end % PS != 0 {
                    old[npages as usize - 1] = file.get(first + npages - 1);
                }
                let mut b = vec![0u8; (npages * PS) as usize];
                self.fetch(&old, &mut b)?;
                let at = (off - first * PS) as usize;
                b[at..at + data.len()].copy_from_slice(data);
                Cow::Owned(b)
            } else {
                Cow::Borrowed(data)
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
            let mut k = 0usize;
            for &(g, n) in &runs {
                let bytes = &buf[k * PS as usize..(k + n as usize) * PS as usize];
                local &= self.link.write_pages(g, bytes)?;
                k += n as usize;
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
                    if !local {
                        let mut k = 0usize;
                        for &(g, n) in &runs {
                            for j in 0..n as usize {
                                let p = &buf[(k + j) * PS as usize..(k + j + 1) * PS as usize];
                                self.pages.put(g.offset_by(j as u64), p);
                            }
                            k += n as usize;
                        }
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
