//! The metadata engine: one MDS pool, its inodes and logs in DRAM, and what every
//! operation shares. Each mechanism has its own file: `mount` formats and mounts a
//! pool, `commit` appends and commits entries (one tail store for one inode, the
//! journal for several), `gc` compacts logs, `inode` creates and forgets inodes.
//! The namespace operations that use them live in [`crate::ops`], one file each. The
//! MDS runs this engine; the local file system ([`crate::LocalFs`]) runs it in-process
//! beside a data pool.

mod commit;
mod gc;
pub(crate) mod inode;
mod mount;

use std::sync::Arc;
use std::time::Duration;

use orion_format::{FileType, Gpa, Superblock, NAME_MAX};
use orion_pmem::Pool;

use crate::alloc::PageAllocator;
use crate::clock::Clock;
use crate::error::*;
use crate::index::{Attr, Body, DirEnt, InodeState};
use crate::log::InodeLog;

pub(crate) use commit::{push_update, Updates};

pub const ROOT_INO: u64 = 1;

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// How long freed pages wait before reuse (readers may still hold them).
    pub grace: Duration,
    /// Log GC runs when dead entries reach this many, outnumber live ones, and
    /// number at least a sixteenth of a file's extent-index entries (see `gc`).
    pub gc_min_dead: u64,
    /// Whether an update that needs a log page when the only free ones are in their
    /// grace period sleeps the grace out (a local file system's caller), or fails at
    /// once with EAGAIN, having changed nothing (the MDS, whose one loop must not go
    /// silent: its client sends the update again, design note 74).
    pub wait_for_room: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            grace: Duration::ZERO,
            gc_min_dead: 64,
            wait_for_room: true,
        }
    }
}

/// An inode in DRAM: state rebuilt from the log, and where the log is.
#[derive(Debug)]
pub struct Inode {
    pub state: InodeState,
    pub log: InodeLog,
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
    /// Log pages GC gave back (after the grace period).
    pub gc_pages_freed: u64,
    pub journal_commits: u64,
}

/// What mounting found and did.
#[derive(Clone, Debug, Default)]
pub struct MountReport {
    pub journal_replayed: bool,
    pub inodes: u64,
    pub orphans_reclaimed: u64,
    /// Unlinked files and removed directories kept (link count 0): some client may
    /// hold them open.
    pub orphans_kept: Vec<u64>,
    pub log_pages: u64,
}

pub struct MetaEngine {
    pub(crate) pool: Pool,
    pub(crate) sb: Superblock,
    pub(crate) inodes: crate::FastMap<u64, Inode>,
    /// Free inode numbers, lowest first at format and mount; a number freed while this
    /// engine runs goes to the back, so it comes back only after every other one: a
    /// client's kernel may still hold the old inode under that number (FUSE knows
    /// inodes by number), and the MDS calls back whoever watched it at every change of
    /// the next file to take it, until that client unwatches it. (A restart or a
    /// fail-over starts again from the lowest: the order is not on the media.) A
    /// freed number waits out the grace period first: its first log segment is
    /// where the next inode of that number writes.
    pub(crate) free_inos: crate::free_inodes::FreeInodes,
    pub(crate) log_alloc: PageAllocator,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) cfg: EngineConfig,
    pub(crate) buf: Vec<u8>,
    pub(crate) txid: u64,
    /// Data pages released by the last operations, for the data allocator to take.
    pub(crate) freed: Vec<Gpa>,
    /// Set when an operation fails past its commit point: DRAM may no longer match
    /// the media, so the engine refuses further changes until it is mounted again.
    pub(crate) failed: Option<String>,
    /// What committed changes touched, when a caller asked to hear of it (the MDS's
    /// callbacks to clients' kernel caches).
    pub(crate) changes: Option<Vec<Changed>>,
    pub stats: EngineStats,
}

/// What one committed update changed: an inode whose log grew (its attributes, data
/// or names may differ now), and the names it lost if it is a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Changed {
    pub ino: u64,
    pub removed: Vec<Vec<u8>>,
    /// A directory: whoever caches it holds names under it too (callbacks about a
    /// directory never end its watch; see `orion_mds::callbacks`).
    pub dir: bool,
}

impl MetaEngine {
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    pub fn now(&self) -> i64 {
        self.clock.now()
    }

    /// From now on, remembers what each commit changes ([`MetaEngine::take_changes`]).
    pub fn record_changes(&mut self) {
        self.changes.get_or_insert_with(Vec::new);
    }

    /// What commits changed since the last call, in commit order (empty unless
    /// [`MetaEngine::record_changes`] was called).
    pub fn take_changes(&mut self) -> Vec<Changed> {
        self.changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
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

    /// The directory that holds directory `ino` (its ".."; the root's is the root).
    pub fn parent(&self, ino: u64) -> FsResult<u64> {
        let d = self.dir(ino)?;
        Ok(if ino == ROOT_INO { ino } else { d.parent })
    }

    /// Directory `ino`, if it is one and still linked: a removed directory kept for
    /// those who hold it open (link count 0) takes no names and has none to find, as
    /// Linux's dead directories (ENOENT).
    pub(crate) fn dir(&self, ino: u64) -> FsResult<&Inode> {
        let i = self.inode(ino)?;
        match i.state.body {
            Body::Dir(_) if i.state.attr.nlink == 0 => Err(ENOENT),
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

    pub(crate) fn entry(&self, parent: u64, name: &[u8]) -> FsResult<Option<DirEnt>> {
        let d = self.dir(parent)?;
        Ok(d.state.dir().and_then(|x| x.names.get(name)).copied())
    }

    pub(crate) fn next_cookie(&self, dir: u64) -> u64 {
        self.inodes[&dir]
            .state
            .dir()
            .map(|d| d.next_cookie)
            .unwrap_or(3)
    }

    /// (total inodes, free inodes, total log pages, free log pages)
    pub fn usage(&self) -> (u64, u64, u64, u64) {
        (
            self.sb.inode_count - 1,
            self.free_inos.count() as u64,
            self.log_alloc.count(),
            self.log_alloc.free(),
        )
    }

    /// Inode numbers freed and still in their grace period.
    pub fn inodes_in_grace(&self) -> u64 {
        self.free_inos.in_grace() as u64
    }

    /// Log pages freed and still in their grace period.
    pub fn log_pages_in_grace(&self) -> u64 {
        self.log_alloc.in_grace()
    }

    /// Segments in an inode's log (its first segment, if it still starts there, and
    /// its pages).
    pub fn log_segments(&self, ino: u64) -> FsResult<usize> {
        Ok(self.inode(ino)?.log.pages.len())
    }
}
