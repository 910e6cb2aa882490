//! Optimistic persistence (Assise §3.3; DESIGN.md §4): small whole-page writes of a
//! file are staged here instead of being log-committed one by one, and committed
//! together later in one log commit.
//!
//! A staged write has its pages written (and, for the client's own store, persisted)
//! like any other; only its write entry waits. The entries of a file commit in the
//! order they were staged, before any other update of that file or any operation
//! that is not a read or write (one rule: whatever is not a data call commits what
//! is staged first). Reads by this client see staged pages through [`Staging::page`]
//! and [`Staging::end`]; other clients see them once committed. A staged write that
//! fails to commit is reported by the file's next fsync or close, as Linux reports a
//! failed writeback.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::Thread;
use std::time::{Duration, Instant};

use orion_format::{Entry, Gpa};
use orion_meta::FsError;
use orion_proto::Epoch;

use crate::replicas::Delivered;

/// Entries staged for one file before they are committed (a log commit holds at
/// most `orion_proto::MAX_COMMIT_ENTRIES`; one staged write adds at most
/// [`MAX_STAGED_WRITE_PAGES`]).
pub const MAX_STAGED_ENTRIES: usize = 128;
/// Longer writes commit at once: one commit per write costs them little.
pub const MAX_STAGED_WRITE_PAGES: u64 = 16;
// A full stage plus one more write (one entry per page at worst) fits one commit.
const _: () = assert!(
    MAX_STAGED_ENTRIES + MAX_STAGED_WRITE_PAGES as usize <= orion_proto::MAX_COMMIT_ENTRIES
);

/// Pages of a staged write, and where they went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagedRun {
    pub gpa: Gpa,
    pub pages: u64,
    /// Where they went: where they can be read again if the map changes before
    /// their commit.
    pub to: Delivered,
}

/// The writes staged for one file.
pub struct StagedFile {
    /// The file's generation (inode numbers are reused).
    pub generation: u64,
    pub entries: Vec<Entry>,
    /// The pages the entries name, to give back if the commit is refused.
    pub runs: Vec<StagedRun>,
    /// Whether every page is durable already (written to the client's own store).
    pub persisted_locally: bool,
    /// The oldest cluster map epoch its pages were written under.
    pub written_epoch: Epoch,
    /// The newest staged page of each file page.
    pages: BTreeMap<u64, Gpa>,
    /// The largest end of a staged write.
    end: u64,
}

/// Failed commits of staged writes, by inode and generation (shared by lanes).
pub type Failures = Arc<Mutex<HashMap<(u64, u64), FsError>>>;

#[derive(Default)]
pub struct Staging {
    enabled: bool,
    /// How long a write may stay staged: the bound on what other clients do not see
    /// yet, and on what a crash of this process loses.
    max_age: Duration,
    files: HashMap<u64, StagedFile>,
    /// When the oldest staged write was staged.
    since: Option<Instant>,
    /// Commits of staged writes that failed, by inode and generation, until fsync or
    /// close says so: shared by a client's lanes, since an inode's lane changes
    /// when the lanes grow (`fs/lanes.rs`) and its fsync may run on another.
    failed: Failures,
    /// The thread that commits staged writes when they grow old.
    flusher: Option<Thread>,
    /// The flusher sleeps until woken (it does after a while with nothing staged;
    /// while writes keep coming it wakes by itself, so a write seldom pays a wake-up).
    pub flusher_asleep: bool,
}

impl Staging {
    /// Stages writes when `enabled`, each for at most `max_age`; failed commits go
    /// to `failed`.
    pub fn new(enabled: bool, max_age: Duration, failed: Failures) -> Staging {
        Staging {
            enabled,
            max_age,
            failed,
            ..Default::default()
        }
    }

    pub fn set_flusher(&mut self, t: Thread) {
        self.flusher = Some(t);
    }

    /// Whether a write of `npages` whole pages to file `ino` (generation `generation`)
    /// may be staged behind what is staged for it already.
    pub fn accepts(&self, ino: u64, generation: u64, npages: u64) -> bool {
        self.enabled
            && npages <= MAX_STAGED_WRITE_PAGES
            && self
                .files
                .get(&ino)
                .is_none_or(|f| f.generation == generation)
    }

    /// Stages the write entries of one write. Returns whether the file's stage is
    /// full and should be committed now.
    pub fn stage(
        &mut self,
        ino: u64,
        generation: u64,
        entries: Vec<Entry>,
        persisted_locally: bool,
        written_epoch: Epoch,
        to: impl Fn(Gpa) -> Delivered,
    ) -> bool {
        if self.since.is_none() {
            self.since = Some(Instant::now());
            if self.flusher_asleep {
                self.flusher_asleep = false;
                if let Some(t) = &self.flusher {
                    t.unpark();
                }
            }
        }
        let f = self.files.entry(ino).or_insert_with(|| StagedFile {
            generation,
            entries: Vec::new(),
            runs: Vec::new(),
            persisted_locally: true,
            written_epoch,
            pages: BTreeMap::new(),
            end: 0,
        });
        // `accepts` refused another generation of the inode, and writes alone come.
        assert_eq!(f.generation, generation, "a stage holds one file");
        assert!(!entries.is_empty(), "a staged write has entries");
        for e in &entries {
            let Entry::Write(w) = e else {
                unreachable!("only writes are staged: {e:?}");
            };
            for k in 0..w.npages as u64 {
                f.pages.insert(w.pgoff + k, w.gpa.offset_by(k));
            }
            f.runs.push(StagedRun {
                gpa: w.gpa,
                pages: w.npages as u64,
                to: to(w.gpa),
            });
            f.end = f.end.max(w.size);
        }
        f.entries.extend(entries);
        // Each entry added its run above: a refused commit gives back what it named.
        debug_assert_eq!(f.entries.len(), f.runs.len(), "one run per staged entry");
        f.persisted_locally &= persisted_locally;
        f.written_epoch = f.written_epoch.min(written_epoch);
        f.entries.len() >= MAX_STAGED_ENTRIES
    }

    /// The staged page of file page `pgoff`, if a staged write covers it.
    pub fn page(&self, ino: u64, generation: u64, pgoff: u64) -> Option<Gpa> {
        let f = self.files.get(&ino)?;
        (f.generation == generation)
            .then(|| f.pages.get(&pgoff).copied())
            .flatten()
    }

    /// Where the staged writes of `ino` end (the file is at least this long).
    pub fn end(&self, ino: u64, generation: u64) -> u64 {
        self.files
            .get(&ino)
            .filter(|f| f.generation == generation)
            .map_or(0, |f| f.end)
    }

    /// Takes the staged writes of `ino` out, to commit them.
    pub fn take(&mut self, ino: u64) -> Option<StagedFile> {
        let f = self.files.remove(&ino);
        if self.files.is_empty() {
            self.since = None;
        }
        // `stage` starts the clock before it adds a file.
        debug_assert_eq!(
            self.since.is_some(),
            !self.files.is_empty(),
            "timed while staged"
        );
        f
    }

    /// The files with staged writes.
    pub fn files(&self) -> Vec<u64> {
        self.files.keys().copied().collect()
    }

    pub fn holds(&self, ino: u64) -> bool {
        self.files.contains_key(&ino)
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Whether the oldest staged write has waited long enough.
    pub fn due(&self) -> bool {
        self.since.is_some_and(|t| t.elapsed() >= self.max_age)
    }

    /// How long until the oldest staged write is due (`None`: nothing staged).
    pub fn due_in(&self) -> Option<Duration> {
        // None tells the flusher that nothing is staged (see `take`).
        debug_assert_eq!(
            self.since.is_some(),
            !self.files.is_empty(),
            "timed while staged"
        );
        self.since.map(|t| self.max_age.saturating_sub(t.elapsed()))
    }

    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    fn failures(&self) -> MutexGuard<'_, HashMap<(u64, u64), FsError>> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn record_failure(&mut self, ino: u64, generation: u64, e: FsError) {
        self.failures().entry((ino, generation)).or_insert(e);
    }

    /// The failure to commit a staged write of `ino` not reported yet (by any lane).
    pub fn take_failure(&mut self, ino: u64, generation: u64) -> Option<FsError> {
        self.failures().remove(&(ino, generation))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orion_format::WriteRec;

    fn write(pgoff: u64, g: Gpa, n: u32) -> Entry {
        Entry::Write(WriteRec {
            pgoff,
            npages: n,
            gpa: g,
            size: (pgoff + n as u64) * 4096,
            mtime: 0,
        })
    }

    fn to(takers: u64) -> Delivered {
        Delivered {
            local: false,
            takers,
            epoch: 1,
        }
    }

    #[test]
    fn newer_staged_pages_hide_older_ones_and_the_end_only_grows() {
        let mut s = Staging::new(true, Duration::from_secs(60), Failures::default());
        let a = Gpa::new(0, 100);
        let b = Gpa::new(0, 200);
        assert!(!s.stage(7, 1, vec![write(3, a, 2)], true, 5, |_| to(0b11)));
        assert!(!s.stage(7, 1, vec![write(4, b, 1)], false, 4, |_| to(0b01)));
        assert_eq!(s.page(7, 1, 3), Some(a));
        assert_eq!(s.page(7, 1, 4), Some(b));
        assert_eq!(s.page(7, 1, 5), None);
        // Another generation of the inode sees nothing staged.
        assert_eq!(s.page(7, 2, 3), None);
        assert!(!s.accepts(7, 2, 1));
        assert!(s.accepts(7, 1, MAX_STAGED_WRITE_PAGES));
        assert!(!s.accepts(7, 1, MAX_STAGED_WRITE_PAGES + 1));
        assert_eq!(s.end(7, 1), 5 * 4096);
        let f = s.take(7).expect("staged");
        assert_eq!(f.entries.len(), 2);
        assert!(!f.persisted_locally);
        assert_eq!(f.written_epoch, 4, "the oldest epoch of its writes");
        let takers: Vec<u64> = f.runs.iter().map(|r| r.to.takers).collect();
        assert_eq!(takers, [0b11, 0b01], "each run knows where it went");
        assert!(s.is_empty() && s.due_in().is_none());
    }

    #[test]
    fn a_full_stage_asks_to_be_committed() {
        let mut s = Staging::new(true, Duration::from_secs(60), Failures::default());
        for i in 0..MAX_STAGED_ENTRIES as u64 {
            let g = Gpa::new(1, i);
            let full = s.stage(9, 1, vec![write(i, g, 1)], true, 1, |_| to(1));
            assert_eq!(full, i + 1 == MAX_STAGED_ENTRIES as u64);
        }
    }

    #[test]
    fn a_disabled_stage_takes_nothing() {
        assert!(
            !Staging::new(false, Duration::from_secs(60), Failures::default()).accepts(1, 1, 1)
        );
    }
}
