//! Writes, copy-on-write (paper §5.2): first decide from the inode's state what the
//! write is ([`WritePlan`]: where it lands, which pages it covers, which of them are
//! partly covered, whether its commit depends on the state), then do its I/O in one
//! pass: fetch the old contents of partly covered pages, take pages from this
//! client's chunks, write them (locally or one-sided), and commit the write entries
//! through the client's one commit loop ([`crate::commit`]).

use orion_format::{Entry, Gpa, WriteRec};
use orion_meta::error::EFBIG;
use orion_meta::{Clock, SystemClock, MAX_FILE_SIZE};
use orion_proto::Commit;

use super::pieces::{PageSources, PartialEnds};
use super::{fetch, regular, same_file, DataPath, MAX_PIECE, PS};
use crate::commit::{commit_loop, Step};
use crate::remote::{Fail, Res};
use crate::replicas::Delivered;

/// What one write is, decided from the inode's state before any I/O.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct WritePlan {
    /// Where the write lands (the end of the file for an append).
    pub off: u64,
    pub end: u64,
    /// The file page of its first byte, and how many pages it covers.
    pub first: u64,
    pub npages: u64,
    pub ends: PartialEnds,
    /// The commit depends on the state it was built from (an append, a shared file,
    /// a partly covered page): it names the tail and is re-executed when refused.
    pub conditional: bool,
}

impl WritePlan {
    /// The plan of writing `len` bytes at `off` (or at `size`, the file's end, when
    /// `append`) to a file whose updates are `shared` or not.
    pub fn new(size: u64, shared: bool, off: u64, len: u64, append: bool) -> Res<WritePlan> {
        assert!(len > 0, "an empty write has no plan");
        let off = if append { size } else { off };
        let end = off
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(EFBIG)?;
        let first = off / PS;
        let npages = (end - 1) / PS - first + 1;
        let partial = off % PS != 0 || end % PS != 0;
        let plan = WritePlan {
            off,
            end,
            first,
            npages,
            ends: PartialEnds::new(off, end, first, npages),
            conditional: append || shared || partial,
        };
        // The plan covers the write exactly: its pages span [off, end).
        assert!(plan.first * PS <= off && end <= (plan.first + npages) * PS);
        assert_eq!(partial, plan.ends.pages().next().is_some());
        Ok(plan)
    }

    /// The write entries naming `runs` (the pages taken for it, in order).
    pub fn entries(&self, runs: &[(Gpa, u64)], mtime: i64) -> Vec<Entry> {
        assert_eq!(
            runs.iter().map(|r| r.1).sum::<u64>(),
            self.npages,
            "the pages taken match the plan"
        );
        let mut pg = self.first;
        runs.iter()
            .map(|&(gpa, n)| {
                let e = Entry::Write(WriteRec {
                    pgoff: pg,
                    npages: n as u32,
                    gpa,
                    size: self.end,
                    mtime,
                });
                pg += n;
                e
            })
            .collect()
    }
}

/// What the last attempt of a write did, for the work that follows its commit (its
/// pages are the ones still `taken`).
struct Written {
    plan: WritePlan,
    assembled: Vec<(u64, Vec<u8>)>,
    staged: bool,
}

impl DataPath<'_> {
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
        // Pages taken for the write, kept across re-executions that need as many.
        let mut taken: Option<Vec<(Gpa, u64)>> = None;
        let mut last: Option<Written> = None;
        // Whole pages written at a given offset do not depend on the inode's state:
        // they commit unconditionally (the MDS orders them and checks the generation),
        // so the first attempt uses the cached copy without reading its tail.
        let whole_pages =
            !append && off.is_multiple_of(PS) && (data.len() as u64).is_multiple_of(PS);
        let DataPath {
            remote,
            cache,
            chunks,
            pages,
            staging,
        } = self;
        let r = commit_loop(remote, cache, |remote, cache, attempt| {
            let fast = attempt == 0
                && whole_pages
                && cache
                    .cached(ino)
                    .is_some_and(|c| !c.shared() && c.generation() == gen);
            let c = if fast {
                cache.cached(ino).expect("checked above")
            } else {
                cache.refresh(remote, ino)?
            };
            same_file(c.generation(), gen)?;
            regular(c.state.attr.ftype)?;
            // The map the pages go out under (a store that joins later did not get them).
            let written_epoch = remote.epoch;
            // Decide.
            let plan = WritePlan::new(
                c.state.attr.size,
                c.shared(),
                off,
                data.len() as u64,
                append,
            )?;
            let tail = c.tail;
            let file = c.state.file().expect("regular file");
            let old: Vec<Option<Gpa>> = plan
                .ends
                .pages()
                .map(|j| file.get(plan.first + j))
                .collect();
            // Do: the old contents of partly covered pages under the new bytes (a
            // hole or past the end reads zeros); whole pages go out from the caller's
            // bytes.
            let mut assembled = plan.ends.buffers();
            for ((_, buf), g) in assembled.iter_mut().zip(old) {
                fetch(remote, pages, &[g], buf)?;
            }
            plan.ends.fill(&mut assembled, data);
            // A re-executed append may land at another page offset and need another
            // number of pages.
            if let Some(p) = taken.take() {
                if p.iter().map(|r| r.1).sum::<u64>() == plan.npages {
                    taken = Some(p);
                } else {
                    chunks.give_back(p);
                }
            }
            if taken.is_none() {
                taken = Some(chunks.take(remote, plan.npages)?);
            }
            let runs: &[(Gpa, u64)] = taken.as_deref().expect("allocated");
            let src = PageSources {
                data,
                off: plan.off,
                first: plan.first,
                assembled: &assembled,
            };
            let staged = fast && staging.accepts(ino, gen, plan.npages);
            let mut local = true;
            // Where each run of a staged write went (its pages may have to be read
            // again); nothing is allocated for other writes.
            let mut delivered = Vec::new();
            let mut k = 0u64;
            for &(g, n) in runs {
                let mut to: Option<Delivered> = None;
                for (j, bytes) in src.segments(k, n) {
                    let d = remote.deliver_pages(g.offset_by(j - k), bytes)?;
                    // Only pages of the client's own store count (others are awaited
                    // from their stores in any case).
                    local &= d.local || Some(g.group()) != remote.internal_group();
                    to = Some(to.map_or(d, |t| t.and(d)));
                }
                if staged {
                    delivered.push((g, to.expect("a run has pages")));
                }
                k += n;
            }
            let mut entries = plan.entries(runs, SystemClock.now());
            let landed = plan.off;
            // What is staged for the file commits now when the stage is full, or when
            // this write commits (what was staged goes first, and moves the tail a
            // conditional commit expects: build again).
            let flush = if staged {
                remote.stats.staged_writes += 1;
                // The pages belong to the stage now, whatever its commit meets.
                taken = None;
                let to = |gpa: Gpa| {
                    let run = delivered.iter().find(|(g, _)| *g == gpa);
                    run.expect("each entry is one run").1
                };
                staging.stage(
                    ino,
                    gen,
                    std::mem::take(&mut entries),
                    local,
                    written_epoch,
                    to,
                )
            } else {
                staging.holds(ino)
            };
            if flush {
                DataPath {
                    remote,
                    cache,
                    chunks,
                    pages,
                    staging,
                }
                .flush(ino)?;
            }
            if staged {
                last = Some(Written {
                    plan,
                    assembled,
                    staged: true,
                });
                return Ok(Step::Done(landed));
            }
            if flush {
                return Ok(Step::Again);
            }
            let commit = Commit {
                ino,
                generation: gen,
                expect: plan.conditional.then_some(tail),
                persisted_locally: local,
                written_epoch,
                entries,
            };
            last = Some(Written {
                plan,
                assembled,
                staged: false,
            });
            Ok(Step::Send(commit, landed))
        });
        match &r {
            Ok(_) => {
                // Committed or staged: the pages belong to the file now (`taken` is
                // not given back).
                let w = last.expect("a finished write has a last attempt");
                if !w.staged {
                    // Pages that went over the fabric are kept for reads to come.
                    let src = PageSources {
                        data,
                        off: w.plan.off,
                        first: w.plan.first,
                        assembled: &w.assembled,
                    };
                    let runs = taken.as_deref().expect("a committed write's pages");
                    // Each attempt keeps `taken` only if it has as many pages as its
                    // plan: the pages committed are those of the last attempt's plan.
                    debug_assert_eq!(
                        runs.iter().map(|r| r.1).sum::<u64>(),
                        w.plan.npages,
                        "the pages committed are the last attempt's"
                    );
                    let mut k = 0u64;
                    for &(g, n) in runs {
                        if Some(g.group()) != self.remote.internal_group() {
                            for j in 0..n {
                                self.pages.put(g.offset_by(j), src.page(k + j));
                            }
                        }
                        k += n;
                    }
                }
            }
            // Refused, so never committed: the pages are still ours to reuse. After
            // any other failure the commit may have landed; the pages are not reused
            // (the MDS takes back what was not committed when this client leaves).
            Err(f) if f.changed_nothing() => {
                if let Some(p) = taken.take() {
                    self.chunks.give_back(p);
                }
            }
            Err(Fail::Reconnected) => self.reconnected(),
            Err(_) => {}
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_covers_exactly_the_pages_of_the_write() {
        // Whole pages at a page boundary: unconditional, nothing to assemble.
        let p = WritePlan::new(0, false, 8192, 8192, false).unwrap();
        assert_eq!((p.first, p.npages, p.conditional), (2, 2, false));
        assert_eq!(p.ends.pages().count(), 0);
        // Inside one page: one partial page, conditional.
        let p = WritePlan::new(0, false, 10, 100, false).unwrap();
        assert_eq!((p.first, p.npages, p.conditional), (0, 1, true));
        assert_eq!(p.ends.pages().collect::<Vec<_>>(), vec![0]);
        // Across three pages with both ends partial.
        let p = WritePlan::new(0, false, 4000, 5000, false).unwrap();
        assert_eq!((p.first, p.npages), (0, 3));
        assert_eq!(p.ends.pages().collect::<Vec<_>>(), vec![0, 2]);
        // An append lands at the end, whatever the offset asked.
        let p = WritePlan::new(12288, false, 0, 4096, true).unwrap();
        assert_eq!((p.off, p.first, p.conditional), (12288, 3, true));
        // A shared file's whole-page write is conditional too.
        assert!(WritePlan::new(0, true, 0, 4096, false).unwrap().conditional);
        // Past the largest file: EFBIG, before any I/O.
        assert!(matches!(
            WritePlan::new(0, false, MAX_FILE_SIZE, 1, false),
            Err(Fail::Fs(e)) if e == EFBIG
        ));
    }

    #[test]
    fn entries_name_the_taken_runs_in_file_order() {
        let p = WritePlan::new(0, false, 4096, 3 * 4096, false).unwrap();
        let runs = [(Gpa::new(1, 40), 2), (Gpa::new(2, 7), 1)];
        let e = p.entries(&runs, 5);
        assert_eq!(e.len(), 2);
        let Entry::Write(a) = &e[0] else { panic!() };
        let Entry::Write(b) = &e[1] else { panic!() };
        assert_eq!(
            (a.pgoff, a.npages, a.gpa, a.size),
            (1, 2, Gpa::new(1, 40), 16384)
        );
        assert_eq!((b.pgoff, b.npages, b.gpa), (3, 1, Gpa::new(2, 7)));
    }
}
