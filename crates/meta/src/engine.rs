//! The metadata engine: one MDS pool, its inodes and logs in DRAM, and the operations
//! that change them. Single-inode updates commit with one tail store; multi-inode
//! updates go through the journal. The MDS will run this engine; the local file
//! system ([`crate::LocalFs`]) runs it in-process beside a data pool.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use orion_format::{
    attr_mask as m, valid_name, DirEntryRec, Entry, FileType, Gpa, InodeSlot, PoolKind, SetAttrRec,
    Superblock, Tail, NAME_MAX, PAGE_SIZE, SLOT_TAIL_OFFSET, SUPERBLOCK_SIZE,
};
use orion_pmem::Pool;

use crate::alloc::PageAllocator;
use crate::clock::Clock;
use crate::error::*;
use crate::index::{Attr, Body, DirEnt, InodeState};
use crate::log::{self, InodeLog};
use crate::{journal, recovery};

pub const ROOT_INO: u64 = 1;
const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_IXGRP: u32 = 0o010;
const MAX_LINKS: u32 = u32::MAX - 1;

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// How long freed pages wait before reuse (readers may still hold them).
    pub grace: Duration,
    /// Log GC runs when dead entries reach this many and outnumber live ones.
    pub gc_min_dead: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            grace: Duration::ZERO,
            gc_min_dead: 64,
        }
    }
}

/// An inode in DRAM: state rebuilt from the log, and where the log is.
#[derive(Debug)]
pub struct Inode {
    pub state: InodeState,
    pub log: InodeLog,
    pub generation: u64,
    /// Parent directory (directories only; kept in DRAM, derived at mount).
    pub parent: u64,
}

/// What a new inode is: its type, permission bits (after the caller's umask), owner
/// and device number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewNode {
    pub ftype: FileType,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
}

impl NewNode {
    pub fn new(ftype: FileType, mode: u32, uid: u32, gid: u32) -> NewNode {
        NewNode {
            ftype,
            mode,
            uid,
            gid,
            rdev: 0,
        }
    }
}

/// What rename does with an existing target (renameat2's flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenameMode {
    /// rename(2): the target is replaced.
    Replace = 0,
    /// RENAME_NOREPLACE: EEXIST if the target exists.
    NoReplace = 1,
    /// RENAME_EXCHANGE: both names must exist; they swap inodes.
    Exchange = 2,
}

/// A change of times requested by setattr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(i64),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttrReq {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

/// A directory listing row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReaddirEntry {
    pub cookie: u64,
    pub ino: u64,
    pub ftype: FileType,
    pub name: Vec<u8>,
}

#[derive(Clone, Debug, Default)]
pub struct EngineStats {
    pub gc_runs: u64,
    pub journal_commits: u64,
}

/// What mounting found and did.
#[derive(Clone, Debug, Default)]
pub struct MountReport {
    pub journal_replayed: bool,
    pub inodes: u64,
    pub orphans_reclaimed: u64,
    pub log_pages: u64,
}

pub struct MetaEngine {
    pub(crate) pool: Pool,
    pub(crate) sb: Superblock,
    pub(crate) inodes: HashMap<u64, Inode>,
    free_inos: Vec<u64>,
    pub(crate) log_alloc: PageAllocator,
    clock: Arc<dyn Clock>,
    cfg: EngineConfig,
    buf: Vec<u8>,
    txid: u64,
    /// Data pages released by the last operations, for the data allocator to take.
    freed: Vec<Gpa>,
    /// Set when an operation fails past its commit point: DRAM may no longer match
    /// the media, so the engine refuses further changes until it is mounted again.
    failed: Option<String>,
    pub stats: EngineStats,
}

/// Changes to commit: per inode, entries in order.
type Updates = Vec<(u64, Vec<Entry>)>;

fn push_update(u: &mut Updates, ino: u64, e: Entry) {
    match u.iter_mut().find(|(i, _)| *i == ino) {
        Some((_, v)) => v.push(e),
        None => u.push((ino, vec![e])),
    }
}

pub fn check_name(name: &[u8]) -> FsResult<()> {
    if name.len() > NAME_MAX {
        return Err(ENAMETOOLONG);
    }
    if !valid_name(name) {
        return Err(EINVAL);
    }
    Ok(())
}

/// The set-attribute entry for `req` on an inode with attributes `a` (`has_pages`:
/// a regular file holding data pages), or `None` when nothing changes. The MDS and
/// clients build it with this one function, so both apply the same rules.
pub fn setattr_entry(
    a: &Attr,
    has_pages: bool,
    req: &SetAttrReq,
    now: i64,
) -> FsResult<Option<SetAttrRec>> {
    if req.size.is_some() {
        match a.ftype {
            FileType::Regular => {}
            FileType::Directory => return Err(EISDIR),
            _ => return Err(EINVAL),
        }
    }
    let mut rec = SetAttrRec {
        mask: 0,
        ctime: now,
        ..Default::default()
    };
    let mut touched = false;
    let mut mode = a.mode;
    if let Some(md) = req.mode {
        mode = md & 0o7777;
        rec.mask |= m::MODE;
        touched = true;
    }
    if let Some(uid) = req.uid {
        rec.uid = uid;
        rec.mask |= m::UID;
        touched = true;
    }
    if let Some(gid) = req.gid {
        rec.gid = gid;
        rec.mask |= m::GID;
        touched = true;
    }
    if (req.uid.is_some() || req.gid.is_some()) && a.ftype != FileType::Directory {
        // chown clears setuid, and setgid when group-executable (as Linux does).
        mode &= !S_ISUID;
        if mode & S_IXGRP != 0 {
            mode &= !S_ISGID;
        }
        if mode != a.mode || rec.mask & m::MODE != 0 {
            rec.mask |= m::MODE;
        }
    }
    rec.mode = mode;
    let resolve = |t: TimeSet| match t {
        TimeSet::Now => now,
        TimeSet::At(v) => v,
    };
    if let Some(t) = req.atime {
        rec.atime = resolve(t);
        rec.mask |= m::ATIME;
        touched = true;
    }
    if let Some(t) = req.mtime {
        rec.mtime = resolve(t);
        rec.mask |= m::MTIME;
        touched = true;
    }
    if let Some(size) = req.size {
        if size > crate::MAX_FILE_SIZE {
            return Err(EFBIG);
        }
        // As tmpfs: a size change sets mtime and ctime, and so does a truncation
        // to the same size of a file that holds data pages (it drops page tails).
        if size != a.size || has_pages {
            if size != a.size {
                rec.size = size;
                rec.mask |= m::SIZE;
            }
            if req.mtime.is_none() {
                rec.mtime = now;
                rec.mask |= m::MTIME;
            }
            touched = true;
        }
    }
    if !touched {
        return Ok(None);
    }
    rec.mask |= m::CTIME;
    Ok(Some(rec))
}

impl MetaEngine {
    /// Writes an empty file system (a root directory) to a freshly formatted pool.
    pub fn format(pool: &Pool, sb: &Superblock, now: i64) -> FsResult<()> {
        if sb.kind != PoolKind::Metadata {
            return Err(FsError::Io("not a metadata pool".into()));
        }
        pool.zero(0, (sb.page_area_off) as usize)?;
        pool.write(0, &sb.encode())?;
        let page = sb.page_off(0);
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
        alloc.mark_used(0);
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
            sb.page_area_off,
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
        let tree = recovery::load_tree(&pool, &sb, None)?;
        if let Some(p) = tree.problems.first() {
            return Err(FsError::Corrupt(p.clone()));
        }
        let mut inodes = HashMap::with_capacity(tree.inodes.len());
        for (ino, li) in tree.inodes {
            for &p in &li.log.pages {
                let idx = sb.page_index(p).ok_or_else(|| {
                    FsError::Corrupt(format!("inode {ino}: log page {p} outside the page area"))
                })?;
                if !log_alloc.mark_used(idx) {
                    return Err(FsError::Corrupt(format!("log page {p} is used twice")));
                }
            }
            inodes.insert(
                ino,
                Inode {
                    state: li.state,
                    log: li.log,
                    generation: li.generation,
                    parent: li.parent,
                },
            );
        }
        // Reclaim slots that nothing reaches: inodes created but never linked, or
        // unlinked before their slot was cleared, when the power failed.
        let mut free_inos = Vec::new();
        let mut orphans = 0;
        for ino in (ROOT_INO + 1..sb.inode_count).rev() {
            if inodes.contains_key(&ino) {
                continue;
            }
            let off = sb.slot_off(ino);
            if pool.load_u64(off)? != 0 {
                pool.store_u64(off, 0)?;
                pool.persist(off, 8)?;
                orphans += 1;
            }
            free_inos.push(ino);
        }
        let report = MountReport {
            journal_replayed,
            inodes: inodes.len() as u64,
            orphans_reclaimed: orphans,
            log_pages: log_alloc.count() - log_alloc.free(),
        };
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
                failed: None,
                stats: EngineStats::default(),
            },
            report,
        ))
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    pub fn now(&self) -> i64 {
        self.clock.now()
    }

    /// Data pages released by operations since the last call.
    pub fn take_freed(&mut self) -> Vec<Gpa> {
        std::mem::take(&mut self.freed)
    }

    pub fn inode(&self, ino: u64) -> FsResult<&Inode> {
        self.inodes.get(&ino).ok_or(ENOENT)
    }

    /// Every inode number in use.
    pub fn inode_numbers(&self) -> Vec<u64> {
        self.inodes.keys().copied().collect()
    }

    pub fn inode_count(&self) -> u64 {
        self.inodes.len() as u64
    }

    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        Ok(self.inode(ino)?.state.attr.clone())
    }

    fn dir(&self, ino: u64) -> FsResult<&Inode> {
        let i = self.inode(ino)?;
        match i.state.body {
            Body::Dir(_) => Ok(i),
            _ => Err(ENOTDIR),
        }
    }

    /// Looks a name up in a directory ("." and ".." included).
    pub fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Attr> {
        let ino = self.lookup_ino(parent, name)?;
        self.getattr(ino)
    }

    pub fn lookup_ino(&self, parent: u64, name: &[u8]) -> FsResult<u64> {
        if name.len() > NAME_MAX {
            return Err(ENAMETOOLONG);
        }
        let d = self.dir(parent)?;
        match name {
            b"." => Ok(parent),
            b".." => Ok(d.parent),
            _ => d
                .state
                .dir()
                .and_then(|x| x.names.get(name))
                .map(|e| e.ino)
                .ok_or(ENOENT),
        }
    }

    fn entry(&self, parent: u64, name: &[u8]) -> FsResult<Option<DirEnt>> {
        let d = self.dir(parent)?;
        Ok(d.state.dir().and_then(|x| x.names.get(name)).copied())
    }

    fn next_cookie(&self, dir: u64) -> u64 {
        self.inodes[&dir]
            .state
            .dir()
            .map(|d| d.next_cookie)
            .unwrap_or(3)
    }

    // ---- committing ----

    /// Appends each inode's entries and commits them all at once: a single tail store
    /// for one inode, the journal for several. Then applies them to DRAM and runs log
    /// GC where dead entries have piled up.
    pub(crate) fn commit(&mut self, updates: Updates, use_reserve: bool) -> FsResult<()> {
        self.check_not_failed()?;
        let mut pending = Vec::with_capacity(updates.len());
        for (ino, entries) in &updates {
            let inode = &self.inodes[ino];
            match log::append(
                &self.pool,
                &mut self.log_alloc,
                self.sb.page_area_off,
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

    fn commit_appended(
        &mut self,
        updates: Updates,
        pending: Vec<log::PendingTail>,
    ) -> FsResult<()> {
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
            let inode = self.inodes.get_mut(&ino).expect("updated inode exists");
            inode.log.advance(p);
            for e in &entries {
                inode.state.apply(e, &mut self.freed)?;
            }
            self.gc(ino, false)?;
        }
        Ok(())
    }

    /// Records a failure past a commit point and returns the error callers see.
    fn fail(&mut self, e: FsError) -> FsError {
        let msg = format!(
            "{}: an update failed after its commit point ({e}); no further changes are \
             accepted until the file system is mounted again",
            self.pool.path().display()
        );
        self.failed.get_or_insert(msg.clone());
        FsError::Io(msg)
    }

    /// Whether an earlier failure stopped the engine (see [`MetaEngine::fail`]).
    pub fn has_failed(&self) -> bool {
        self.failed.is_some()
    }

    fn check_not_failed(&self) -> FsResult<()> {
        match &self.failed {
            Some(m) => Err(FsError::Io(m.clone())),
            None => Ok(()),
        }
    }

    fn page_idx(&self, off: u64) -> u64 {
        (off - self.sb.page_area_off) / PAGE_SIZE
    }

    /// Log GC (paper §4.2): when dead entries outnumber live ones, write the live
    /// state to fresh pages, then switch head, tail and version with one 8-byte store
    /// (the version's parity picks which of the slot's two heads is live), and free
    /// the old pages after the grace period.
    fn gc(&mut self, ino: u64, force: bool) -> FsResult<()> {
        let inode = &self.inodes[&ino];
        let live = inode.state.live_entries();
        let dead = inode.log.entries.saturating_sub(live);
        if !force && (dead < self.cfg.gc_min_dead || dead < live) {
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
        let fresh = InodeLog::empty(page, version);
        let p = match log::append(
            &self.pool,
            &mut self.log_alloc,
            self.sb.page_area_off,
            ino,
            &fresh,
            &entries,
            true,
            &mut self.buf,
        ) {
            Ok(p) => p,
            Err(_) => {
                self.log_alloc.free_now(first, 1);
                return Ok(());
            }
        };
        let slot = self.sb.slot_off(ino);
        let head_at = slot + 24 + 8 * (version & 1) as u64;
        let staged = self
            .pool
            .store_u64(head_at, page)
            .and_then(|_| self.pool.persist(head_at, 8));
        if staged.is_err() {
            // The idle head is not read while the old version is live: nothing changed.
            for pg in std::iter::once(page).chain(p.new_pages) {
                self.log_alloc.free_now(self.page_idx(pg), 1);
            }
            return Ok(());
        }
        log::commit_tail(&self.pool, slot, p.tail)?;
        let mut rebuilt = InodeState::new(ino, self.inodes[&ino].state.attr.ftype);
        let mut ignored = Vec::new();
        for e in &entries {
            rebuilt.apply(e, &mut ignored)?;
        }
        let inode = self.inodes.get_mut(&ino).expect("inode exists");
        debug_assert_eq!(
            rebuilt.attr, inode.state.attr,
            "GC must not change the inode"
        );
        let mut new_log = fresh;
        new_log.advance(p);
        let old = std::mem::replace(&mut inode.log, new_log);
        inode.state = rebuilt;
        for page in old.pages {
            let idx = (page - self.sb.page_area_off) / PAGE_SIZE;
            self.log_alloc.free_later(idx, 1);
        }
        self.stats.gc_runs += 1;
        Ok(())
    }

    /// Writes a new inode (slot, first log page, initial entries) that is invisible
    /// until a directory entry naming it commits.
    fn new_inode(
        &mut self,
        ftype: FileType,
        attr: SetAttrRec,
        nlink: u32,
        extra: Vec<Entry>,
    ) -> FsResult<u64> {
        self.check_not_failed()?;
        let ino = self.free_inos.pop().ok_or(ENOSPC)?;
        let Some(pidx) = self.log_alloc.alloc(false) else {
            self.free_inos.push(ino);
            return Err(ENOSPC);
        };
        let result = (|| {
            let page = self.sb.page_off(pidx);
            let slot_off = self.sb.slot_off(ino);
            // A freed slot keeps its generation word (only its magic is cleared).
            let generation = self.pool.load_u64(slot_off + 16)?.wrapping_add(1);
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
            self.pool.persist(slot_off, 128)?;
            ilog.advance(p);
            let mut state = InodeState::new(ino, ftype);
            for e in &entries {
                state.apply(e, &mut Vec::new())?;
            }
            Ok((state, ilog, generation))
        })();
        match result {
            Ok((state, log, generation)) => {
                self.inodes.insert(
                    ino,
                    Inode {
                        state,
                        log,
                        generation,
                        parent: 0,
                    },
                );
                Ok(ino)
            }
            Err(e) => {
                self.log_alloc.free_now(pidx, 1);
                self.free_inos.push(ino);
                Err(e)
            }
        }
    }

    /// Forgets an inode nothing links to any more: frees its log pages (after the
    /// grace period) and data pages, and clears its slot.
    fn destroy(&mut self, ino: u64) -> FsResult<()> {
        self.forget(ino, true)
    }

    /// Drops an inode from DRAM and clears its slot; `release_data` hands its data
    /// pages to the data allocator (not when the caller still owns them: a create
    /// that failed before it was linked).
    fn forget(&mut self, ino: u64, release_data: bool) -> FsResult<()> {
        let Some(inode) = self.inodes.remove(&ino) else {
            return Ok(());
        };
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
        self.free_inos.push(ino);
        Ok(())
    }

    // ---- namespace operations ----

    /// Creates a file, directory, symlink or special node named `name` in `parent`.
    /// For symlinks, `extra` holds the entry naming the page with the target.
    pub fn create_node(
        &mut self,
        parent: u64,
        name: &[u8],
        node: NewNode,
        extra: Vec<Entry>,
    ) -> FsResult<Attr> {
        let NewNode {
            ftype,
            mode,
            uid,
            gid,
            rdev,
        } = node;
        if name.len() > NAME_MAX {
            return Err(ENAMETOOLONG);
        }
        let pdir = self.dir(parent)?;
        if name == b"." || name == b".." || self.entry(parent, name)?.is_some() {
            return Err(EEXIST);
        }
        check_name(name)?;
        let is_dir = ftype == FileType::Directory;
        if is_dir && pdir.state.attr.nlink >= MAX_LINKS {
            return Err(EMLINK);
        }
        let now = self.clock.now();
        let (mut mode, mut gid) = (mode & 0o7777, gid);
        if pdir.state.attr.mode & S_ISGID != 0 {
            gid = pdir.state.attr.gid;
            if is_dir {
                mode |= S_ISGID;
            }
        }
        let pnlink = pdir.state.attr.nlink;
        let attr = SetAttrRec {
            mask: m::ALL,
            mode,
            uid,
            gid,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            rdev,
        };
        let ino = self.new_inode(ftype, attr, if is_dir { 2 } else { 1 }, extra)?;
        let mut entries = vec![Entry::DirAdd(DirEntryRec {
            ino,
            cookie: self.next_cookie(parent),
            time: now,
            ftype,
            name: name.to_vec(),
        })];
        if is_dir {
            entries.push(Entry::LinkChange {
                nlink: pnlink + 1,
                ctime: now,
            });
        }
        if let Err(e) = self.commit(vec![(parent, entries)], false) {
            if !self.has_failed() {
                // Never linked: give the inode back; the caller keeps its data pages.
                self.forget(ino, false)?;
            }
            return Err(e);
        }
        if is_dir {
            self.inodes.get_mut(&ino).expect("created").parent = parent;
        }
        self.getattr(ino)
    }

    pub fn unlink(&mut self, parent: u64, name: &[u8]) -> FsResult<()> {
        if name.len() > NAME_MAX {
            return Err(ENAMETOOLONG);
        }
        if name == b"." || name == b".." {
            return Err(if self.dir(parent).is_ok() {
                EISDIR
            } else {
                ENOTDIR
            });
        }
        let ent = self.entry(parent, name)?.ok_or(ENOENT)?;
        if ent.ftype == FileType::Directory {
            return Err(EISDIR);
        }
        let now = self.clock.now();
        let nlink = self.inode(ent.ino)?.state.attr.nlink;
        let mut u = vec![(
            parent,
            vec![Entry::DirRemove(DirEntryRec {
                ino: ent.ino,
                cookie: ent.cookie,
                time: now,
                ftype: ent.ftype,
                name: name.to_vec(),
            })],
        )];
        if nlink > 1 {
            u.push((
                ent.ino,
                vec![Entry::LinkChange {
                    nlink: nlink - 1,
                    ctime: now,
                }],
            ));
        }
        self.commit(u, true)?;
        if nlink <= 1 {
            self.destroy(ent.ino)?;
        }
        Ok(())
    }

    pub fn rmdir(&mut self, parent: u64, name: &[u8]) -> FsResult<()> {
        if name.len() > NAME_MAX {
            return Err(ENAMETOOLONG);
        }
        match name {
            b"." => return Err(EINVAL),
            b".." => return Err(ENOTEMPTY),
            _ => {}
        }
        let ent = self.entry(parent, name)?.ok_or(ENOENT)?;
        if ent.ftype != FileType::Directory {
            return Err(ENOTDIR);
        }
        if !self
            .inode(ent.ino)?
            .state
            .dir()
            .is_some_and(|d| d.names.is_empty())
        {
            return Err(ENOTEMPTY);
        }
        let now = self.clock.now();
        let pnlink = self.inode(parent)?.state.attr.nlink;
        let entries = vec![
            Entry::DirRemove(DirEntryRec {
                ino: ent.ino,
                cookie: ent.cookie,
                time: now,
                ftype: ent.ftype,
                name: name.to_vec(),
            }),
            Entry::LinkChange {
                nlink: pnlink - 1,
                ctime: now,
            },
        ];
        self.commit(vec![(parent, entries)], true)?;
        self.destroy(ent.ino)
    }

    pub fn link(&mut self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Attr> {
        if name.len() > NAME_MAX {
            return Err(ENAMETOOLONG);
        }
        let target = self.inode(ino)?;
        let nlink = target.state.attr.nlink;
        let ftype = target.state.attr.ftype;
        self.dir(parent)?;
        // Linux resolves the new name first (EEXIST), then refuses directories.
        if name == b"." || name == b".." || self.entry(parent, name)?.is_some() {
            return Err(EEXIST);
        }
        if ftype == FileType::Directory {
            return Err(EPERM);
        }
        check_name(name)?;
        if nlink >= MAX_LINKS {
            return Err(EMLINK);
        }
        let now = self.clock.now();
        let u = vec![
            (
                parent,
                vec![Entry::DirAdd(DirEntryRec {
                    ino,
                    cookie: self.next_cookie(parent),
                    time: now,
                    ftype,
                    name: name.to_vec(),
                })],
            ),
            (
                ino,
                vec![Entry::LinkChange {
                    nlink: nlink + 1,
                    ctime: now,
                }],
            ),
        ];
        self.commit(u, false)?;
        self.getattr(ino)
    }

    /// Is `anc` the directory `ino` or one of its ancestors?
    fn is_ancestor(&self, anc: u64, mut ino: u64) -> bool {
        loop {
            if ino == anc {
                return true;
            }
            if ino == ROOT_INO {
                return false;
            }
            match self.inodes.get(&ino) {
                Some(i) => ino = i.parent,
                None => return false,
            }
        }
    }

    /// rename(2), and renameat2's RENAME_NOREPLACE and RENAME_EXCHANGE.
    pub fn rename(
        &mut self,
        op: u64,
        on: &[u8],
        np: u64,
        nn: &[u8],
        mode: RenameMode,
    ) -> FsResult<()> {
        // Linux looks the source up before the target name.
        if on.len() > NAME_MAX {
            return Err(ENAMETOOLONG);
        }
        self.dir(op)?;
        self.dir(np)?;
        if matches!(on, b"." | b"..") || matches!(nn, b"." | b"..") {
            return Err(EBUSY);
        }
        let src = self.entry(op, on)?.ok_or(ENOENT)?;
        if nn.len() > NAME_MAX {
            return Err(ENAMETOOLONG);
        }
        let dst = self.entry(np, nn)?;
        let src_dir = src.ftype == FileType::Directory;
        if dst.is_some() && mode == RenameMode::NoReplace {
            return Err(EEXIST);
        }
        if mode == RenameMode::Exchange {
            return self.exchange(op, on, src, np, nn, dst.ok_or(ENOENT)?);
        }
        // Linux: moving a directory under itself is EINVAL; replacing an ancestor of
        // the source is ENOTEMPTY; both before the type checks.
        if src_dir && self.is_ancestor(src.ino, np) {
            return Err(EINVAL);
        }
        if let Some(d) = dst {
            if d.ftype == FileType::Directory && self.is_ancestor(d.ino, op) && d.ino != src.ino {
                return Err(ENOTEMPTY);
            }
            if d.ino == src.ino {
                return Ok(());
            }
            let dst_dir = d.ftype == FileType::Directory;
            if src_dir && !dst_dir {
                return Err(ENOTDIR);
            }
            if !src_dir && dst_dir {
                return Err(EISDIR);
            }
            if dst_dir
                && !self
                    .inode(d.ino)?
                    .state
                    .dir()
                    .is_some_and(|x| x.names.is_empty())
            {
                return Err(ENOTEMPTY);
            }
        }
        check_name(nn)?;
        let now = self.clock.now();
        let mut u: Updates = Vec::new();
        push_update(
            &mut u,
            op,
            Entry::DirRemove(DirEntryRec {
                ino: src.ino,
                cookie: src.cookie,
                time: now,
                ftype: src.ftype,
                name: on.to_vec(),
            }),
        );
        let mut dst_dies = false;
        let mut nlink_delta: Vec<(u64, i64)> = Vec::new();
        if src_dir && op != np {
            nlink_delta.push((op, -1));
            nlink_delta.push((np, 1));
        }
        if let Some(d) = dst {
            push_update(
                &mut u,
                np,
                Entry::DirRemove(DirEntryRec {
                    ino: d.ino,
                    cookie: d.cookie,
                    time: now,
                    ftype: d.ftype,
                    name: nn.to_vec(),
                }),
            );
            let dn = self.inode(d.ino)?.state.attr.nlink;
            if d.ftype == FileType::Directory {
                nlink_delta.push((np, -1));
                dst_dies = true;
            } else if dn <= 1 {
                dst_dies = true;
            } else {
                push_update(
                    &mut u,
                    d.ino,
                    Entry::LinkChange {
                        nlink: dn - 1,
                        ctime: now,
                    },
                );
            }
        }
        push_update(
            &mut u,
            np,
            Entry::DirAdd(DirEntryRec {
                ino: src.ino,
                cookie: self.next_cookie(np),
                time: now,
                ftype: src.ftype,
                name: nn.to_vec(),
            }),
        );
        push_update(
            &mut u,
            src.ino,
            Entry::SetAttr(SetAttrRec {
                mask: m::CTIME,
                ctime: now,
                ..Default::default()
            }),
        );
        for dir in [op, np] {
            let delta: i64 = nlink_delta
                .iter()
                .filter(|(d, _)| *d == dir)
                .map(|(_, x)| x)
                .sum();
            if delta != 0
                && !u.iter().any(|(i, v)| {
                    *i == dir && v.iter().any(|e| matches!(e, Entry::LinkChange { .. }))
                })
            {
                push_update(&mut u, dir, self.link_change(dir, delta, now)?);
            }
        }
        self.commit(u, true)?;
        if src_dir {
            self.inodes.get_mut(&src.ino).expect("moved inode").parent = np;
        }
        if let Some(d) = dst {
            if dst_dies {
                self.destroy(d.ino)?;
            }
        }
        Ok(())
    }

    /// The entry that moves `dir`'s link count by `delta` (a subdirectory's ".."
    /// arriving or leaving).
    fn link_change(&self, dir: u64, delta: i64, now: i64) -> FsResult<Entry> {
        let n = self.inode(dir)?.state.attr.nlink as i64 + delta;
        Ok(Entry::LinkChange {
            nlink: n as u32,
            ctime: now,
        })
    }

    /// RENAME_EXCHANGE: `on` in `op` and `nn` in `np` swap the inodes they name, in
    /// one journaled commit. Each name keeps its readdir cookie.
    fn exchange(
        &mut self,
        op: u64,
        on: &[u8],
        src: DirEnt,
        np: u64,
        nn: &[u8],
        dst: DirEnt,
    ) -> FsResult<()> {
        if src.ino == dst.ino {
            return Ok(());
        }
        // A directory cannot end up inside itself, whichever way it moves.
        let src_dir = src.ftype == FileType::Directory;
        let dst_dir = dst.ftype == FileType::Directory;
        if (src_dir && self.is_ancestor(src.ino, np)) || (dst_dir && self.is_ancestor(dst.ino, op))
        {
            return Err(EINVAL);
        }
        let now = self.clock.now();
        let rec = |ent: &DirEnt, on_ino: &DirEnt, name: &[u8]| DirEntryRec {
            ino: on_ino.ino,
            cookie: ent.cookie,
            time: now,
            ftype: on_ino.ftype,
            name: name.to_vec(),
        };
        let mut u: Updates = Vec::new();
        push_update(&mut u, op, Entry::DirRemove(rec(&src, &src, on)));
        push_update(&mut u, np, Entry::DirRemove(rec(&dst, &dst, nn)));
        push_update(&mut u, op, Entry::DirAdd(rec(&src, &dst, on)));
        push_update(&mut u, np, Entry::DirAdd(rec(&dst, &src, nn)));
        for ino in [src.ino, dst.ino] {
            push_update(
                &mut u,
                ino,
                Entry::SetAttr(SetAttrRec {
                    mask: m::CTIME,
                    ctime: now,
                    ..Default::default()
                }),
            );
        }
        // A directory that changes parent moves its ".." link with it.
        if op != np && src_dir != dst_dir {
            let (from, to) = if src_dir { (op, np) } else { (np, op) };
            for (dir, delta) in [(from, -1i64), (to, 1)] {
                push_update(&mut u, dir, self.link_change(dir, delta, now)?);
            }
        }
        self.commit(u, true)?;
        if op != np {
            if src_dir {
                self.inodes.get_mut(&src.ino).expect("moved inode").parent = np;
            }
            if dst_dir {
                self.inodes.get_mut(&dst.ino).expect("moved inode").parent = op;
            }
        }
        Ok(())
    }

    /// setattr: chmod, chown, truncate, utimens. `pre` are entries the data layer
    /// needs committed with it (the copied last page of a truncation).
    pub fn setattr(&mut self, ino: u64, req: &SetAttrReq, pre: Vec<Entry>) -> FsResult<Attr> {
        let inode = self.inode(ino)?;
        let has_pages = inode.state.file().is_some_and(|f| !f.pages.is_empty());
        let a = inode.state.attr.clone();
        let rec = setattr_entry(&a, has_pages, req, self.clock.now())?;
        if rec.is_none() && pre.is_empty() {
            return Ok(a);
        }
        let mut entries = pre;
        entries.push(Entry::SetAttr(rec.unwrap_or(SetAttrRec {
            mask: m::CTIME,
            ctime: self.clock.now(),
            ..Default::default()
        })));
        let shrinking = req.size.is_some_and(|s| s < a.size);
        self.commit(vec![(ino, entries)], shrinking)?;
        self.getattr(ino)
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

    pub fn readdir(&self, ino: u64, offset: u64) -> FsResult<Vec<ReaddirEntry>> {
        let d = self.dir(ino)?;
        let mut out = Vec::new();
        if offset < 1 {
            out.push(ReaddirEntry {
                cookie: 1,
                ino,
                ftype: FileType::Directory,
                name: b".".to_vec(),
            });
        }
        if offset < 2 {
            out.push(ReaddirEntry {
                cookie: 2,
                ino: d.parent,
                ftype: FileType::Directory,
                name: b"..".to_vec(),
            });
        }
        let idx = d.state.dir().expect("dir");
        for (&cookie, name) in idx.by_cookie.range(offset.max(2).saturating_add(1)..) {
            let e = idx.names[name];
            out.push(ReaddirEntry {
                cookie,
                ino: e.ino,
                ftype: e.ftype,
                name: name.to_vec(),
            });
        }
        Ok(out)
    }

    /// (total inodes, free inodes, total log pages, free log pages)
    pub fn usage(&self) -> (u64, u64, u64, u64) {
        (
            self.sb.inode_count - 1,
            self.free_inos.len() as u64,
            self.log_alloc.count(),
            self.log_alloc.free(),
        )
    }

    /// Compacts an inode's log now, whatever its dead-entry count.
    pub fn force_gc(&mut self, ino: u64) -> FsResult<()> {
        self.inode(ino)?;
        self.gc(ino, true)
    }

    /// Pages in an inode's log.
    pub fn log_pages(&self, ino: u64) -> FsResult<usize> {
        Ok(self.inode(ino)?.log.pages.len())
    }
}
