//! Inode life cycle on the MDS pool: a new inode (slot, first log segment, initial
//! entries) and the end of one (log pages and then its number after the grace
//! period, data pages to the data allocator, slot cleared).

use orion_format::{
    Entry, FileType, InodeSlot, SetAttrRec, FIRST_SEGMENT_SIZE, INODE_SLOT_SIZE,
    SLOT_GENERATION_OFFSET,
};

use super::{Inode, MetaEngine, ROOT_INO};
use crate::error::*;
use crate::index::InodeState;
use crate::log::{self, InodeLog};

impl MetaEngine {
    /// Writes a new inode (slot, first log segment, initial entries) that is
    /// invisible until a directory entry naming it commits.
    /// `entries`: what its log starts with ([`first_entries`]).
    pub(crate) fn new_inode(&mut self, ftype: FileType, entries: Vec<Entry>) -> FsResult<u64> {
        self.check_not_failed()?;
        let ino = self.free_inos.take()?;
        assert!(
            !self.inodes.contains_key(&ino),
            "inode {ino} is on the free list and in use"
        );
        let result = (|| {
            let page = self.sb.first_segment_off(ino);
            let slot_off = self.sb.slot_off(ino);
            // Room for them under a growing pool before anything is read or written
            // there (reading a hole of a tmpfs file takes its page too).
            self.pool.reserve(slot_off, INODE_SLOT_SIZE)?;
            self.pool.reserve(page, FIRST_SEGMENT_SIZE as usize)?;
            // A freed slot keeps its generation word (only its magic is cleared).
            let generation = self
                .pool
                .load_u64(slot_off + SLOT_GENERATION_OFFSET)?
                .wrapping_add(1);
            log::init_log_page(&self.pool, page, ino, 0)?;
            let mut ilog = InodeLog::empty(page, 0);
            let p = log::append(
                &self.pool,
                &mut self.log_alloc,
                &self.sb,
                ino,
                &ilog,
                &entries,
                false,
                &mut self.buf,
            )?;
            let slot = InodeSlot {
                ftype,
                ino,
                generation,
                heads: [page, 0],
                tail: p.tail,
            };
            let written = (self.pool.write(slot_off, &slot.encode()))
                .and_then(|_| self.pool.persist(slot_off, INODE_SLOT_SIZE));
            if let Err(e) = written {
                // Nothing reaches the pages the entries spilled into: back at once.
                for &pg in &p.new_pages {
                    self.log_alloc.free_now(self.page_idx(pg), 1);
                }
                return Err(e.into());
            }
            ilog.advance(p);
            let mut state = InodeState::new(ino, ftype, generation);
            for e in &entries {
                state.apply(e, &mut Vec::new())?;
            }
            Ok((state, ilog))
        })();
        match result {
            Ok((state, log)) => {
                self.inodes.insert(
                    ino,
                    Inode {
                        state,
                        log,
                        parent: 0,
                    },
                );
                Ok(ino)
            }
            Err(e) => {
                // `append` gave back any page it took; the slot was not written.
                self.free_inos.untake(ino);
                Err(e)
            }
        }
    }

    /// The log pages a new inode whose log starts with `entries` takes past its
    /// first segment: what a create asks room for. (Every first segment is as
    /// long: the root's stands for the new one's.)
    pub(crate) fn new_inode_pages(&self, entries: &[Entry]) -> u64 {
        let first = InodeLog::empty(self.sb.first_segment_off(ROOT_INO), 0);
        log::pages_needed(&self.sb, &first, entries)
    }

    /// Forgets an inode nothing links to any more: frees its log pages (after the
    /// grace period) and data pages, and clears its slot.
    pub(crate) fn destroy(&mut self, ino: u64) -> FsResult<()> {
        self.forget(ino, true)
    }

    /// Drops an inode from DRAM and clears its slot; `release_data` hands its data
    /// pages to the data allocator (not when the caller still owns them: a create
    /// that failed before it was linked).
    pub(crate) fn forget(&mut self, ino: u64, release_data: bool) -> FsResult<()> {
        let Some(inode) = self.inodes.remove(&ino) else {
            return Ok(());
        };
        assert_ne!(ino, ROOT_INO, "the root directory is never forgotten");
        // A change too: whoever caches the inode must drop it. (A create that failed
        // before linking it, `!release_data`, made nothing anyone caches.)
        if let Some(changes) = self.changes.as_mut().filter(|_| release_data) {
            changes.push(super::Changed {
                ino,
                removed: Vec::new(),
                dir: inode.state.dir().is_some(),
            });
        }
        self.free_log_later(&inode.log.pages);
        if release_data {
            self.freed.extend(inode.state.data_pages());
        }
        let off = self.sb.slot_off(ino);
        self.pool.store_u64(off, 0)?;
        self.pool.persist(off, 8)?;
        self.free_inos.free_later(ino);
        Ok(())
    }
}

/// The entries a new inode's log starts with: its attributes, its link count and
/// what its kind adds.
pub(crate) fn first_entries(attr: SetAttrRec, nlink: u32, extra: Vec<Entry>) -> Vec<Entry> {
    let mut entries = vec![
        Entry::SetAttr(attr),
        Entry::LinkChange {
            nlink,
            ctime: attr.ctime,
        },
    ];
    entries.extend(extra);
    entries
}
