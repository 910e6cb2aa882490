//! The commit core: every change of the namespace or of an inode ends here. Entries
//! are appended past each inode's tail and persisted, then made visible at once: one
//! 8-byte tail store for one inode, a journal record for several (paper §4.2). Only
//! then are they applied to DRAM. A failure after the commit point stops the engine
//! (DRAM may no longer match the media) until it is mounted again.

use orion_format::{Entry, Tail, SLOT_TAIL_OFFSET};

use super::MetaEngine;
use crate::error::*;
use crate::journal;
use crate::log;

/// Changes to commit: per inode, entries in order.
pub(crate) type Updates = Vec<(u64, Vec<Entry>)>;

/// Adds `e` to the entries of `ino` in `u`, keeping the inodes in first-touched order.
pub(crate) fn push_update(u: &mut Updates, ino: u64, e: Entry) {
    match u.iter_mut().find(|(i, _)| *i == ino) {
        Some((_, v)) => v.push(e),
        None => u.push((ino, vec![e])),
    }
}

impl MetaEngine {
    /// Appends each inode's entries and commits them all at once: a single tail store
    /// for one inode, the journal for several. Then applies them to DRAM and runs log
    /// GC where dead entries have piled up.
    pub(crate) fn commit(&mut self, updates: Updates, use_reserve: bool) -> FsResult<()> {
        self.check_not_failed()?;
        assert!(!updates.is_empty(), "a commit changes at least one inode");
        debug_assert!(
            updates
                .iter()
                .enumerate()
                .all(|(k, (ino, _))| updates[..k].iter().all(|(other, _)| other != ino)),
            "each inode appears once in an update"
        );
        let mut pending = Vec::with_capacity(updates.len());
        for (ino, entries) in &updates {
            assert!(
                !entries.is_empty(),
                "inode {ino}: an update with no entries"
            );
            let inode = self.inodes.get(ino).expect("updated inodes exist");
            match log::append(
                &self.pool,
                &mut self.log_alloc,
                &self.sb,
                *ino,
                &inode.log,
                entries,
                use_reserve,
                &mut self.buf,
            ) {
                Ok(p) => pending.push(p),
                Err(e) => {
                    for p in pending {
                        for page in p.new_pages {
                            self.log_alloc.free_now(self.page_idx(page), 1);
                        }
                    }
                    return Err(e);
                }
            }
        }
        // From here on the operation may be durable: a failure cannot be rolled back.
        let r = self.commit_appended(updates, pending);
        r.map_err(|e| self.fail(e))
    }

    pub(crate) fn commit_appended(
        &mut self,
        updates: Updates,
        pending: Vec<log::PendingTail>,
    ) -> FsResult<()> {
        assert_eq!(updates.len(), pending.len());
        if pending.len() == 1 {
            log::commit_tail(&self.pool, self.sb.slot_off(updates[0].0), pending[0].tail)?;
        } else {
            self.txid += 1;
            self.stats.journal_commits += 1;
            let stores = updates
                .iter()
                .zip(&pending)
                .map(|((ino, _), p)| (self.sb.slot_off(*ino) + SLOT_TAIL_OFFSET, p.tail.pack()))
                .collect();
            journal::commit(&self.pool, &self.sb, self.txid, stores)?;
        }
        for ((ino, entries), p) in updates.into_iter().zip(pending) {
            if let Some(changes) = self.changes.as_mut() {
                let removed = entries.iter().filter_map(|e| match e {
                    Entry::DirRemove(d) => Some(d.name.clone()),
                    _ => None,
                });
                let dir = self
                    .inodes
                    .get(&ino)
                    .is_some_and(|i| i.state.dir().is_some());
                changes.push(super::Changed {
                    ino,
                    removed: removed.collect(),
                    dir,
                });
            }
            let inode = self.inodes.get_mut(&ino).expect("updated inode exists");
            let from = inode.log.tail;
            inode.log.advance(p);
            // Before the entries apply to DRAM: a GC writes the state they apply to,
            // then the entries again (see `gc`).
            self.gc(ino, false, from, &entries)?;
            let inode = self.inodes.get_mut(&ino).expect("updated inode exists");
            for e in &entries {
                inode.state.apply(e, &mut self.freed)?;
            }
            // DRAM and the media agree on where the log ends.
            debug_assert_eq!(
                self.pool
                    .load_u64(self.sb.slot_off(ino) + SLOT_TAIL_OFFSET)
                    .ok(),
                Some(inode.log.tail.pack()),
                "inode {ino}: the committed tail is on the media"
            );
        }
        Ok(())
    }

    /// Records a failure past a commit point and returns the error callers see.
    pub(crate) fn fail(&mut self, e: FsError) -> FsError {
        let msg = format!(
            "{}: an update failed after its commit point ({e}); no further changes are \
             accepted until the file system is mounted again",
            self.pool.path().display()
        );
        self.failed.get_or_insert(msg.clone());
        FsError::Io(msg)
    }

    /// Whether an earlier failure stopped the engine (`MetaEngine::fail` records it).
    pub fn has_failed(&self) -> bool {
        self.failed.is_some()
    }

    pub(crate) fn check_not_failed(&self) -> FsResult<()> {
        match &self.failed {
            Some(m) => Err(FsError::Io(m.clone())),
            None => Ok(()),
        }
    }

    /// The page index of log page `off` (a page an append or a GC took).
    pub(crate) fn page_idx(&self, off: u64) -> u64 {
        (self.sb.page_index(off)).expect("a log page is in the page area")
    }

    /// Frees the pages of a log nothing reaches any more, after the grace period.
    /// Its first segment, if it starts in one, is its inode number's and waits out
    /// that number's grace ([`crate::free_inodes`]).
    pub(crate) fn free_log_later(&mut self, segments: &[u64]) -> u64 {
        let mut pages = 0;
        for idx in segments.iter().filter_map(|&s| self.sb.page_index(s)) {
            self.log_alloc.free_later(idx, 1);
            pages += 1;
        }
        pages
    }

    /// A log commit (paper §4.3): appends entries a client built for one inode, in the
    /// MDS's order, and returns the tail before and after them. The caller checks what
    /// a client may commit; `use_reserve` lets a shrinking truncation through on a full
    /// pool.
    pub fn commit_entries(
        &mut self,
        ino: u64,
        entries: Vec<Entry>,
        use_reserve: bool,
    ) -> FsResult<(Tail, Tail)> {
        let prev = self.inode(ino)?.log.tail;
        self.commit(vec![(ino, entries)], use_reserve)?;
        Ok((prev, self.inodes[&ino].log.tail))
    }

    /// Commits copy-on-write data entries for a regular file (the pages are durable).
    pub fn commit_data(&mut self, ino: u64, entries: Vec<Entry>) -> FsResult<()> {
        self.commit(vec![(ino, entries)], false)
    }
}
