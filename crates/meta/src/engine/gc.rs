//! Log garbage collection (paper §4.2).

use orion_format::{attr_mask, Compaction, Entry, InodeSlot, Tail};
use orion_format::{COMPACTION_LEN, COMPACTION_OFFSET};

use super::MetaEngine;
use crate::error::*;
use crate::log::{self, InodeLog};

/// How many index entries of a file one dead entry pays the walk of: a step of the
/// walk costs about a sixteenth of writing an entry (a `BTreeMap` step against
/// encoding, checksumming, copying and persisting 64 bytes).
const GC_WALK_PER_DEAD_ENTRY: u64 = 16;

/// Whether an entry takes pages from a file: a size change (a truncation; an
/// extension costs nothing to wait for either) or a hole punched.
fn cuts_pages(e: &Entry) -> bool {
    match e {
        Entry::SetAttr(a) => a.mask & attr_mask::SIZE != 0,
        Entry::Hole { .. } => true,
        _ => false,
    }
}

impl MetaEngine {
    /// Log GC (paper §4.2): when dead entries outnumber live ones, write the live
    /// state to fresh pages, then switch head, tail and version with one 8-byte store
    /// (the version's parity picks which of the slot's two heads is live), and free
    /// the old pages after the grace period.
    ///
    /// A GC runs inside the commit that triggers it, on the MDS's one engine thread,
    /// so its cost is that commit's latency and every waiting request's. It costs
    /// one entry written per live entry plus one step per entry of a file's extent
    /// index (finding the runs: one per run of pages, design note 72). The trigger
    /// asks for at least as many dead entries as either, so GC work per appended
    /// entry stays constant, and a file's GC comes at most once per `extents / 16`
    /// entries made dead (design note 57).
    ///
    /// The commit's own entries (`then`, appended to the old log past `from`, not
    /// yet applied to DRAM) come after the compacted state in the new log, and the
    /// new log's first page records both positions ([`Compaction`]): a client whose
    /// copy ends where this commit began walks only those entries and what follows
    /// (design note 76), where it would otherwise load the whole inode again.
    pub(crate) fn gc(&mut self, ino: u64, force: bool, from: Tail, then: &[Entry]) -> FsResult<()> {
        let inode = &self.inodes[&ino];
        let live = inode.state.live_entries();
        let dead = (inode.log.entries)
            .saturating_sub(then.len() as u64)
            .saturating_sub(live);
        let walk = inode.state.gc_walk() / GC_WALK_PER_DEAD_ENTRY;
        if !force && (dead < self.cfg.gc_min_dead || dead < live || dead < walk) {
            return Ok(());
        }
        // A commit that cuts pages off a file would leave most of what the GC wrote
        // dead at once (the compacted state is the one before the commit): its GC
        // waits for the next commit, which finds the dead entries still there.
        if !force && then.iter().any(cuts_pages) {
            return Ok(());
        }
        let entries = inode.state.compacted_entries();
        let version = (inode.log.tail.version + 1) & Tail::MAX_VERSION;
        let Some(first) = self.log_alloc.alloc(true) else {
            return Ok(()); // no room to compact now; the log stays valid
        };
        let page = self.sb.page_off(first);
        if log::init_log_page(&self.pool, page, ino, version).is_err() {
            self.log_alloc.free_now(first, 1);
            return Ok(()); // compaction is an optimisation: the old log stays valid
        }
        let mut new_log = InodeLog::empty(page, version);
        let mut end = 0;
        let written = self.append_to(ino, &mut new_log, &entries).and_then(|()| {
            end = new_log.tail.offset;
            match then.is_empty() {
                true => Ok(()),
                false => self.append_to(ino, &mut new_log, then),
            }
        });
        let slot = self.sb.slot_off(ino);
        let head_at = InodeSlot::head_offset(slot, version);
        // The record goes in before any reader can reach the new log.
        let record = Compaction { from, end }.encode();
        let at = page + COMPACTION_OFFSET;
        let staged = written.is_ok()
            && (self.pool.write(at, &record))
                .and_then(|_| self.pool.persist(at, COMPACTION_LEN))
                .and_then(|_| self.pool.store_u64(head_at, page))
                .and_then(|_| self.pool.persist(head_at, 8))
                .is_ok();
        if !staged {
            // Nothing reaches the new log (the idle head is not read while the old
            // version is live): its pages go back, and the old log stays valid.
            for pg in new_log.pages {
                self.log_alloc.free_now(self.page_idx(pg), 1);
            }
            return Ok(());
        }
        log::commit_tail(&self.pool, slot, new_log.tail)?;
        let inode = self.inodes.get_mut(&ino).expect("inode exists");
        // GC keeps every live entry: the compacted log rebuilds the same inode (its
        // entries need not be the live ones: runs of pages merge into one entry, and a
        // write overwritten in its middle becomes two). Checking that rebuilds the
        // inode from the new log, which costs as much as the file is large, so only
        // debug builds (every test) do it; the accounting check below is always on.
        #[cfg(debug_assertions)]
        {
            let mut rebuilt = crate::index::InodeState::new(
                ino,
                inode.state.attr.ftype,
                inode.state.attr.generation,
            );
            let mut ignored = Vec::new();
            for e in &entries {
                rebuilt
                    .apply(e, &mut ignored)
                    .expect("an entry GC wrote applies to a fresh inode");
            }
            assert!(
                rebuilt.same_contents(&inode.state),
                "inode {ino}: GC must not change the inode"
            );
        }
        assert_eq!(new_log.entries, (entries.len() + then.len()) as u64);
        inode.state.compacted(&entries);
        // The pair of the trigger's count: every compacted entry of the new log is
        // live (the commit's own entries apply after this).
        assert_eq!(
            inode.state.live_entries(),
            entries.len() as u64,
            "inode {ino}: the compacted log holds only live entries"
        );
        let old = std::mem::replace(&mut inode.log, new_log);
        self.stats.gc_pages_freed += self.free_log_later(&old.pages);
        self.stats.gc_runs += 1;
        Ok(())
    }

    /// Appends `entries` to `log`, a log not yet reachable (a GC's new one), with
    /// the reserve: compaction frees pages.
    fn append_to(&mut self, ino: u64, log: &mut InodeLog, entries: &[Entry]) -> FsResult<()> {
        let p = log::append(
            &self.pool,
            &mut self.log_alloc,
            &self.sb,
            ino,
            log,
            entries,
            true,
            &mut self.buf,
        )?;
        log.advance(p);
        Ok(())
    }

    /// Compacts an inode's log now, whatever its dead-entry count.
    pub fn force_gc(&mut self, ino: u64) -> FsResult<()> {
        let from = self.inode(ino)?.log.tail;
        self.gc(ino, true, from, &[])
    }
}
