//! Inode life cycle on the MDS pool: a new inode (slot, first log page, initial
//! entries) and the end of one (log pages after the grace period, data pages to the
//! data allocator, slot cleared).

use orion_format::{
    Entry, FileType, InodeSlot, SetAttrRec, INODE_SLOT_SIZE, SLOT_GENERATION_OFFSET,
};

use super::{Inode, MetaEngine, ROOT_INO};
use crate::error::*;
use crate::index::InodeState;
use crate::log::{self, InodeLog};

impl MetaEngine {
    /// Writes a new inode (slot, first log page, initial entries) that is invisible
    /// until a directory entry naming it commits.
    pub(crate) fn new_inode(
        &mut self,
        ftype: FileType,
        attr: SetAttrRec,
        nlink: u32,
        extra: Vec<Entry>,
    ) -> FsResult<u64> {
        self.check_not_failed()?;
        let ino = self.free_inos.pop_front().ok_or(ENOSPC)?;
        assert!(
            !self.inodes.contains_key(&ino),
            "inode {ino} is on the free list and in use"
        );
        let Some(pidx) = self.log_alloc.alloc(false) else {
            self.free_inos.push_front(ino);
            return Err(self.log_alloc.out_of_room(1, false));
        };
        let result = (|| {
            let page = self.sb.page_off(pidx);
            let slot_off = self.sb.slot_off(ino);
            // A freed slot keeps its generation word (only its magic is cleared).
            let generation = self
                .pool
                .load_u64(slot_off + SLOT_GENERATION_OFFSET)?
                .wrapping_add(1);
            log::init_log_page(&self.pool, page, ino, 0)?;
            let mut entries = vec![
                Entry::SetAttr(attr),
                Entry::LinkChange {
                    nlink,
                    ctime: attr.ctime,
                },
            ];
            entries.extend(extra);
            let mut ilog = InodeLog::empty(page, 0);
            // A create asks for room counting this page alone (`create_node`).
            debug_assert_eq!(
                log::pages_needed(&ilog, &entries),
                0,
                "a new inode's first entries fit its first page"
            );
            let p = log::append(
                &self.pool,
                &mut self.log_alloc,
                self.sb.page_area_off,
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
            self.pool.write(slot_off, &slot.encode())?;
            self.pool.persist(slot_off, INODE_SLOT_SIZE)?;
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
                self.log_alloc.free_now(pidx, 1);
                self.free_inos.push_front(ino);
                Err(e)
            }
        }
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
        debug_assert!(!self.free_inos.contains(&ino), "inode {ino} freed twice");
        for page in inode.log.pages {
            let idx = self.page_idx(page);
            self.log_alloc.free_later(idx, 1);
        }
        if release_data {
            self.freed.extend(inode.state.data_pages());
        }
        let off = self.sb.slot_off(ino);
        self.pool.store_u64(off, 0)?;
        self.pool.persist(off, 8)?;
        self.free_inos.push_back(ino);
        Ok(())
    }
}
