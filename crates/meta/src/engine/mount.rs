//! Formatting a metadata pool (an empty file system: the root directory) and mounting
//! one (superblock check, journal replay, log walk, orphan reclaim).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use orion_format::{
    attr_mask as m, Entry, FileType, Gpa, InodeSlot, PoolKind, SetAttrRec, Superblock,
    SUPERBLOCK_SIZE,
};
use orion_pmem::Pool;

use super::{EngineConfig, EngineStats, Inode, MetaEngine, MountReport, ROOT_INO};
use crate::alloc::PageAllocator;
use crate::clock::Clock;
use crate::error::*;
use crate::log::{self, InodeLog};
use crate::{journal, recovery};

impl MetaEngine {
    /// Writes an empty file system (a root directory) to a freshly formatted pool.
    pub fn format(pool: &Pool, sb: &Superblock, now: i64) -> FsResult<()> {
        if sb.kind != PoolKind::Metadata {
            return Err(FsError::Io("not a metadata pool".into()));
        }
        pool.zero(0, (sb.page_area_off) as usize)?;
        pool.write(0, &sb.encode())?;
        let page = sb.first_segment_off(ROOT_INO);
        log::init_log_page(pool, page, ROOT_INO, 0)?;
        let attr = SetAttrRec {
            mask: m::ALL,
            mode: 0o755,
            atime: now,
            mtime: now,
            ctime: now,
            ..Default::default()
        };
        let mut alloc = PageAllocator::new(sb.page_count, 0, Duration::ZERO);
        let tmp = InodeLog::empty(page, 0);
        let entries = [
            Entry::SetAttr(attr),
            Entry::LinkChange {
                nlink: 2,
                ctime: now,
            },
        ];
        let p = log::append(
            pool,
            &mut alloc,
            sb,
            ROOT_INO,
            &tmp,
            &entries,
            false,
            &mut Vec::new(),
        )?;
        let slot = InodeSlot {
            ftype: FileType::Directory,
            ino: ROOT_INO,
            generation: 1,
            heads: [page, 0],
            tail: p.tail,
        };
        pool.write(sb.slot_off(ROOT_INO), &slot.encode())?;
        pool.persist(0, sb.page_area_off as usize)?;
        Ok(())
    }

    /// Mounts: checks the superblock, replays the journal, walks every log reachable
    /// from the root, and reclaims inodes and pages nothing reaches.
    pub fn open(
        pool: Pool,
        clock: Arc<dyn Clock>,
        cfg: EngineConfig,
    ) -> FsResult<(MetaEngine, MountReport)> {
        let sb = Superblock::decode(&pool.read_vec(0, SUPERBLOCK_SIZE)?)?;
        if sb.kind != PoolKind::Metadata {
            return Err(FsError::Io(format!(
                "{}: not a metadata pool",
                pool.path().display()
            )));
        }
        if sb.pool_size > pool.len() {
            return Err(FsError::Corrupt(format!(
                "superblock says {} bytes but the pool file has {}",
                sb.pool_size,
                pool.len()
            )));
        }
        let journal_replayed = journal::replay(&pool, &sb)?;
        let reserve = (sb.page_count / 100).max(8);
        let mut log_alloc = PageAllocator::new(sb.page_count, reserve, cfg.grace);
        if !cfg.wait_for_room {
            log_alloc = log_alloc.never_waits();
        }
        let tree = recovery::load_tree(&pool, &sb, None)?;
        if let Some(p) = tree.problems.first() {
            return Err(FsError::Corrupt(p.clone()));
        }
        let mut inodes =
            crate::FastMap::with_capacity_and_hasher(tree.inodes.len(), Default::default());
        for (ino, li) in tree.inodes {
            // The walk took only this inode's first segment and pages (a first
            // segment is nobody else's).
            for idx in li.log.pages.iter().filter_map(|&p| sb.page_index(p)) {
                let p = sb.page_off(idx);
                if !log_alloc.mark_used(idx) {
                    return Err(FsError::Corrupt(format!("log page {p} is used twice")));
                }
            }
            inodes.insert(
                ino,
                Inode {
                    state: li.state,
                    log: li.log,
                    parent: li.parent,
                },
            );
        }
        // Slots that nothing reaches: unlinked files (link count 0) are kept for the
        // clients that may hold them open (the MDS destroys them once none does);
        // inodes created but never linked when the power failed are reclaimed.
        let mut free_inos = std::collections::VecDeque::new();
        let mut orphans = 0;
        let mut kept = Vec::new();
        let mut data_used = None;
        // The table of a growing pool is a hole where no inode was ever made: free
        // slots read there would take its pages.
        let mut run = (0, 0);
        for ino in ROOT_INO + 1..sb.inode_count {
            if inodes.contains_key(&ino) {
                continue;
            }
            let off = sb.slot_off(ino);
            if off >= run.1 {
                run = pool.data_run(off);
            }
            if off < run.0 || pool.load_u64(off)? == 0 {
                free_inos.push_back(ino);
                continue;
            }
            let used = &mut data_used;
            if let Some(inode) = unlinked_inode(&pool, &sb, ino, &mut log_alloc, used, &inodes) {
                inodes.insert(ino, inode);
                kept.push(ino);
                continue;
            }
            pool.store_u64(off, 0)?;
            pool.persist(off, 8)?;
            orphans += 1;
            free_inos.push_back(ino);
        }
        let report = MountReport {
            journal_replayed,
            inodes: inodes.len() as u64,
            orphans_reclaimed: orphans,
            orphans_kept: kept,
            log_pages: log_alloc.count() - log_alloc.free(),
        };
        let free_inos =
            crate::free_inodes::FreeInodes::new(free_inos, cfg.grace, cfg.wait_for_room);
        Ok((
            MetaEngine {
                pool,
                sb,
                inodes,
                free_inos,
                log_alloc,
                clock,
                cfg,
                buf: Vec::with_capacity(512),
                txid: 0,
                freed: Vec::new(),
                changes: None,
                failed: None,
                stats: EngineStats::default(),
            },
            report,
        ))
    }
}

/// Slot `ino`, which no directory names, if it holds a whole unlinked regular file
/// or empty directory (link count 0) whose log and data pages no other inode uses:
/// loaded, its pages marked used. `data_used` (every inode's data pages) is gathered at the first.
fn unlinked_inode(
    pool: &Pool,
    sb: &Superblock,
    ino: u64,
    log_alloc: &mut PageAllocator,
    data_used: &mut Option<HashSet<Gpa>>,
    inodes: &crate::FastMap<u64, Inode>,
) -> Option<Inode> {
    let (state, log, ftype) = recovery::load_inode(pool, sb, ino, &HashMap::new()).ok()?;
    // A removed directory is kept too (empty: rmdir took only empty ones).
    let empty_dir = || state.dir().is_some_and(|d| d.names.is_empty());
    if !(ftype == FileType::Regular || ftype == FileType::Directory && empty_dir())
        || state.attr.nlink != 0
    {
        return None;
    }
    let pages: Vec<u64> = log.pages.iter().filter_map(|&p| sb.page_index(p)).collect();
    let mut log_pages = HashSet::new();
    if pages
        .iter()
        .any(|&i| log_alloc.is_used(i) || !log_pages.insert(i))
    {
        return None;
    }
    let used = data_used
        .get_or_insert_with(|| inodes.values().flat_map(|i| i.state.data_pages()).collect());
    let data = state.data_pages();
    let mut own = HashSet::new();
    if data.iter().any(|g| used.contains(g) || !own.insert(*g)) {
        return None;
    }
    used.extend(data);
    for &i in &pages {
        log_alloc.mark_used(i);
    }
    Some(Inode {
        state,
        log,
        parent: ROOT_INO,
    })
}
