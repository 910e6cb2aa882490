//! The local file system: a metadata engine and a data pool in one process. Data is
//! copy-on-write by 4 KiB page: new pages are written and persisted, then a write
//! entry naming them commits in the file's log, then the old pages are freed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use orion_format::{
    Entry, FileType, Gpa, PoolKind, Superblock, WriteRec, MAX_WRITE_PAGES, PAGE_SIZE,
    SUPERBLOCK_SIZE, SYMLINK_MAX,
};
use orion_pmem::{ModeChoice, Pool};

use crate::alloc::PageAllocator;
use crate::clock::Clock;
use crate::engine::{
    EngineConfig, MetaEngine, MountReport, NewNode, ReaddirEntry, RenameMode, SetAttrReq,
};
use crate::error::*;
use crate::falloc::FallocPlan;
use crate::index::{Attr, Body};
use crate::xattr::{self, SetMode};
use crate::MAX_FILE_SIZE;

#[derive(Clone, Debug)]
pub struct LocalConfig {
    pub mode: ModeChoice,
    pub engine: EngineConfig,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            mode: ModeChoice::Auto,
            engine: EngineConfig::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub bsize: u32,
    pub blocks: u64,
    pub bfree: u64,
    pub files: u64,
    pub ffree: u64,
    pub namelen: u32,
}

struct Inner {
    meta: MetaEngine,
    data: Pool,
    dsb: Superblock,
    data_alloc: PageAllocator,
}

pub struct LocalFs {
    inner: Mutex<Inner>,
}

/// The data pool that goes with the metadata pool at `meta`.
pub fn data_pool_path(meta: &Path) -> PathBuf {
    let mut s = meta.as_os_str().to_owned();
    s.push(".data");
    PathBuf::from(s)
}

impl LocalFs {
    /// Formats a metadata pool and a data pool of one new file system.
    pub fn format(meta: &Pool, data: &Pool, now: i64) -> FsResult<()> {
        let cluster = orion_format::random_uuid();
        let msb = Superblock::new_metadata(meta.len(), orion_format::random_uuid(), cluster, now)?;
        let dsb = Superblock::new_data(data.len(), orion_format::random_uuid(), cluster, 0, now)?;
        data.zero(0, PAGE_SIZE as usize)?;
        data.write(0, &dsb.encode())?;
        data.persist(0, PAGE_SIZE as usize)?;
        MetaEngine::format(meta, &msb, now)
    }

    /// `orion mkfs`: creates `path` (metadata, 1/8 of `size`, at least 1 MiB) and
    /// `path.data` (the rest) and formats them.
    pub fn mkfs(path: &Path, size: u64, mode: ModeChoice, now: i64) -> FsResult<(Pool, Pool)> {
        Self::mkfs_reporting(path, size, mode, now, &mut |_| {})
    }

    /// [`LocalFs::mkfs`], telling `done` how many bytes of the two pools (`size` in
    /// all, or a little less) are allocated as it goes.
    pub fn mkfs_reporting(
        path: &Path,
        size: u64,
        mode: ModeChoice,
        now: i64,
        done: &mut dyn FnMut(u64),
    ) -> FsResult<(Pool, Pool)> {
        let meta_size = ((size / 8).max(1 << 20) / PAGE_SIZE) * PAGE_SIZE;
        let data_size = (size.saturating_sub(meta_size) / PAGE_SIZE) * PAGE_SIZE;
        if data_size < 16 * PAGE_SIZE {
            return Err(FsError::Io(format!(
                "size {size} is too small: need at least {} bytes",
                meta_size + 16 * PAGE_SIZE
            )));
        }
        let meta = Pool::create_reporting(path, meta_size, mode, done)
            .map_err(|e| FsError::Io(e.to_string()))?;
        let data = Pool::create_reporting(&data_pool_path(path), data_size, mode, &mut |n| {
            done(meta_size + n)
        })
        .map_err(|e| FsError::Io(e.to_string()))?;
        Self::format(&meta, &data, now)?;
        Ok((meta, data))
    }

    /// Opens the pools at `path` and `path.data`.
    pub fn open_path(
        path: &Path,
        clock: Arc<dyn Clock>,
        cfg: &LocalConfig,
    ) -> FsResult<(LocalFs, MountReport)> {
        let meta = Pool::open(path, cfg.mode).map_err(|e| FsError::Io(e.to_string()))?;
        let data =
            Pool::open(&data_pool_path(path), cfg.mode).map_err(|e| FsError::Io(e.to_string()))?;
        Self::open(meta, data, clock, cfg.engine.clone())
    }

    /// Mounts: recovers the metadata engine, then marks every data page a file or
    /// symlink references; all other data pages are free.
    pub fn open(
        meta: Pool,
        data: Pool,
        clock: Arc<dyn Clock>,
        cfg: EngineConfig,
    ) -> FsResult<(LocalFs, MountReport)> {
        let dsb = Superblock::decode(&data.read_vec(0, SUPERBLOCK_SIZE)?)
            .map_err(|e| FsError::Corrupt(format!("{}: {e}", data.path().display())))?;
        if dsb.kind != PoolKind::Data {
            return Err(FsError::Io(format!(
                "{}: not a data pool",
                data.path().display()
            )));
        }
        let grace = cfg.grace;
        let (mut meta, report) = MetaEngine::open(meta, clock, cfg)?;
        if meta.superblock().cluster_uuid != dsb.cluster_uuid {
            return Err(FsError::Io(format!(
                "{} belongs to another file system than {} (cluster ids differ)",
                data.path().display(),
                meta.pool().path().display()
            )));
        }
        let mut data_alloc =
            PageAllocator::new(dsb.page_count, (dsb.page_count / 100).max(8), grace)
                .of_data_pages();
        for inode in meta.inodes.values() {
            for g in inode.state.data_pages() {
                if g.group() != dsb.group || !data_alloc.mark_used(g.page()) {
                    return Err(FsError::Corrupt(format!(
                        "inode {}: data page {g:?} is out of range or used twice",
                        inode.state.attr.ino
                    )));
                }
            }
        }
        // Unlinked files kept by the mount: no descriptor outlives the process that
        // mounts the local core. Their pages go back at the next operation.
        for &ino in &report.orphans_kept {
            meta.release_orphan(ino)?;
        }
        Ok((
            LocalFs {
                inner: Mutex::new(Inner {
                    meta,
                    data,
                    dsb,
                    data_alloc,
                }),
            },
            report,
        ))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the engine, then hands the data pages it released to the allocator.
    fn with_meta<T>(&self, f: impl FnOnce(&mut Inner) -> FsResult<T>) -> FsResult<T> {
        let mut g = self.lock();
        let r = f(&mut g);
        let inner = &mut *g;
        for gpa in inner.meta.take_freed() {
            inner.data_alloc.free_later(gpa.page(), 1);
        }
        r
    }

    pub fn describe(&self) -> String {
        let g = self.lock();
        format!("{}\n{}", g.meta.pool().describe(), g.data.describe())
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Attr> {
        self.lock().meta.lookup(parent, name)
    }

    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        self.lock().meta.getattr(ino)
    }

    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        self.with_meta(|i| {
            i.meta.create_node(
                parent,
                name,
                NewNode::new(FileType::Regular, mode, uid, gid),
                vec![],
            )
        })
    }

    pub fn mkdir(&self, parent: u64, name: &[u8], mode: u32, uid: u32, gid: u32) -> FsResult<Attr> {
        self.with_meta(|i| {
            i.meta.create_node(
                parent,
                name,
                NewNode::new(FileType::Directory, mode, uid, gid),
                vec![],
            )
        })
    }

    /// FIFOs, sockets and device nodes.
    pub fn mknod(&self, parent: u64, name: &[u8], node: NewNode) -> FsResult<Attr> {
        if matches!(
            node.ftype,
            FileType::Regular | FileType::Directory | FileType::Symlink
        ) {
            return Err(EINVAL);
        }
        self.with_meta(|i| i.meta.create_node(parent, name, node, vec![]))
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        if target.is_empty() {
            return Err(ENOENT);
        }
        if target.len() > SYMLINK_MAX {
            return Err(ENAMETOOLONG);
        }
        self.with_meta(|i| {
            i.with_value_page(target, |i, gpa| {
                let extra = vec![Entry::Symlink {
                    gpa,
                    len: target.len() as u32,
                }];
                let node = NewNode::new(FileType::Symlink, 0o777, uid, gid);
                i.meta.create_node(parent, name, node, extra)
            })
        })
    }

    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let g = self.lock();
        match g.meta.inode(ino)?.state.body {
            Body::Symlink(Some((gpa, len))) => {
                let off = g.data_off(gpa)?;
                Ok(g.data.read_vec(off, len as usize)?)
            }
            _ => Err(EINVAL),
        }
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        self.with_meta(|i| i.meta.unlink(parent, name))
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        self.with_meta(|i| i.meta.rmdir(parent, name))
    }

    pub fn rename(&self, op: u64, on: &[u8], np: u64, nn: &[u8], mode: RenameMode) -> FsResult<()> {
        self.with_meta(|i| i.meta.rename(op, on, np, nn, mode))
    }

    /// setxattr(2): the value goes to a new data page, then one entry names it.
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], mode: SetMode) -> FsResult<()> {
        self.with_meta(|i| {
            xattr::check_set(&i.meta.inode(ino)?.state, name, value.len(), mode)?;
            i.with_value_page(value, |i, gpa| {
                let e = xattr::set_entry(name, gpa, value.len(), i.meta.now());
                i.meta.commit_entries(ino, vec![e], false).map(|_| ())
            })
        })
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        let g = self.lock();
        let (gpa, len) = xattr::lookup(&g.meta.inode(ino)?.state, name)?;
        Ok(g.data.read_vec(g.data_off(gpa)?, len as usize)?)
    }

    /// listxattr(2): names, each NUL-terminated (trusted.* only when `privileged`).
    pub fn listxattr(&self, ino: u64, privileged: bool) -> FsResult<Vec<u8>> {
        let g = self.lock();
        let state = &g.meta.inode(ino)?.state;
        Ok(xattr::list(state, |ns| {
            privileged || ns != xattr::Namespace::Trusted
        }))
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> FsResult<()> {
        self.with_meta(|i| {
            let now = i.meta.now();
            let e = xattr::remove_entry(&i.meta.inode(ino)?.state, name, now)?;
            i.meta.commit_entries(ino, vec![e], true).map(|_| ())
        })
    }

    /// fallocate(2): preallocation (mode 0, or KEEP_SIZE) checks that the pool has
    /// room and grows the size; PUNCH_HOLE|KEEP_SIZE and ZERO_RANGE make the range
    /// read as zeros, releasing whole pages. Pages are copy-on-write, so room
    /// reserved now is not held for later writes (as on other copy-on-write file
    /// systems).
    pub fn fallocate(&self, ino: u64, off: u64, len: u64, mode: i32) -> FsResult<()> {
        let plan = FallocPlan::new(&self.lock().meta.inode(ino)?.state, off, len, mode)?;
        for &(s, e) in &plan.zero_ranges {
            self.write(ino, s, &vec![0u8; (e - s) as usize])?;
        }
        self.with_meta(|i| {
            plan.check_room(i.data_alloc.free())?;
            let entries = plan.entries(i.meta.now());
            i.meta.commit_entries(ino, entries, true).map(|_| ())
        })
    }

    pub fn link(&self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Attr> {
        self.with_meta(|i| i.meta.link(ino, parent, name))
    }

    pub fn readdir(&self, ino: u64, offset: u64) -> FsResult<Vec<ReaddirEntry>> {
        self.lock().meta.readdir(ino, offset)
    }

    /// chmod/chown/truncate/utimens. A truncation to inside a page copies that page
    /// with the cut-off bytes zeroed, so a later extension reads zeros there.
    pub fn setattr(&self, ino: u64, req: &SetAttrReq) -> FsResult<Attr> {
        self.with_meta(|i| {
            let a = i.meta.getattr(ino)?;
            let mut pre = Vec::new();
            let mut new_page = None;
            if let Some(size) = req.size {
                let pg = size / PAGE_SIZE;
                let old = i.meta.inode(ino)?.state.file().and_then(|f| f.get(pg));
                if let (true, Some(old)) = (size < a.size && size % PAGE_SIZE != 0, old) {
                    let mut buf = i.data.read_vec(i.data_off(old)?, PAGE_SIZE as usize)?;
                    buf[(size % PAGE_SIZE) as usize..].fill(0);
                    let (page, _) = i.data_alloc.alloc_run(1, true).ok_or(NO_DATA_PAGES)?;
                    let off = i.dsb.page_off(page);
                    i.data.write_data(off, &buf)?;
                    i.data.persist(off, buf.len())?;
                    new_page = Some(page);
                    let now = i.meta.now();
                    pre.push(Entry::Write(WriteRec {
                        pgoff: pg,
                        npages: 1,
                        gpa: Gpa::new(i.dsb.group, page),
                        size: a.size,
                        mtime: now,
                    }));
                }
            }
            let r = i.meta.setattr(ino, req, pre);
            if let (Err(_), Some(p), false) = (&r, new_page, i.meta.has_failed()) {
                i.data_alloc.free_now(p, 1);
            }
            r
        })
    }

    pub fn write(&self, ino: u64, off: u64, data: &[u8]) -> FsResult<usize> {
        self.with_meta(|i| i.write(ino, off, data))
    }

    pub fn read(&self, ino: u64, off: u64, len: usize) -> FsResult<Vec<u8>> {
        self.lock().read(ino, off, len)
    }

    /// Every operation is durable when it returns; fsync only checks the inode.
    pub fn fsync(&self, ino: u64) -> FsResult<()> {
        self.lock().meta.inode(ino).map(|_| ())
    }

    pub fn statfs(&self) -> StatFs {
        let g = self.lock();
        let (files, ffree, _, _) = g.meta.usage();
        StatFs {
            bsize: PAGE_SIZE as u32,
            blocks: g.data_alloc.count(),
            bfree: g.data_alloc.free(),
            files,
            ffree,
            namelen: 255,
        }
    }

    /// Runs fsck over this file system's pools.
    pub fn check(&self) -> crate::fsck::FsckReport {
        let g = self.lock();
        crate::fsck::check(g.meta.pool(), Some(&g.data))
    }

    /// Runs `f` with the metadata engine (tests and tools).
    pub fn with_engine<T>(&self, f: impl FnOnce(&mut MetaEngine) -> T) -> T {
        f(&mut self.lock().meta)
    }
}

impl Inner {
    /// Writes `bytes` (at most a page: a symlink target, an xattr value) to a new data
    /// page, persists it, and runs `f` with its address; the page is freed again if
    /// `f` fails before anything names it.
    fn with_value_page<T>(
        &mut self,
        bytes: &[u8],
        f: impl FnOnce(&mut Inner, Gpa) -> FsResult<T>,
    ) -> FsResult<T> {
        let (page, _) = self.data_alloc.alloc_run(1, false).ok_or(NO_DATA_PAGES)?;
        let mut buf = vec![0u8; PAGE_SIZE as usize];
        buf[..bytes.len()].copy_from_slice(bytes);
        let off = self.dsb.page_off(page);
        let r = self
            .data
            .write_data(off, &buf)
            .and_then(|_| self.data.persist(off, buf.len()))
            .map_err(FsError::from)
            .and_then(|_| f(self, Gpa::new(self.dsb.group, page)));
        if r.is_err() && !self.meta.has_failed() {
            self.data_alloc.free_now(page, 1);
        }
        r
    }

    fn data_off(&self, gpa: Gpa) -> FsResult<u64> {
        if gpa.group() != self.dsb.group || gpa.page() >= self.dsb.page_count {
            return Err(FsError::Corrupt(format!(
                "data page {gpa:?} outside the data pool"
            )));
        }
        Ok(self.dsb.page_off(gpa.page()))
    }

    fn file_attr(&self, ino: u64) -> FsResult<Attr> {
        let a = self.meta.getattr(ino)?;
        match a.ftype {
            FileType::Regular => Ok(a),
            FileType::Directory => Err(EISDIR),
            _ => Err(EINVAL),
        }
    }

    fn read(&self, ino: u64, off: u64, len: usize) -> FsResult<Vec<u8>> {
        let a = self.file_attr(ino)?;
        if off >= a.size || len == 0 {
            return Ok(Vec::new());
        }
        let end = a.size.min(off.saturating_add(len as u64));
        let mut out = vec![0u8; (end - off) as usize];
        let file = self.meta.inode(ino)?.state.file().expect("regular file");
        let mut pos = off;
        while pos < end {
            let pg = pos / PAGE_SIZE;
            let in_page = pos % PAGE_SIZE;
            let n = (PAGE_SIZE - in_page).min(end - pos) as usize;
            let at = (pos - off) as usize;
            if let Some(gpa) = file.get(pg) {
                self.data
                    .read(self.data_off(gpa)? + in_page, &mut out[at..at + n])?;
            }
            pos += n as u64;
        }
        Ok(out)
    }

    fn write(&mut self, ino: u64, off: u64, data: &[u8]) -> FsResult<usize> {
        let a = self.file_attr(ino)?;
        if data.is_empty() {
            return Ok(0);
        }
        let end = off
            .checked_add(data.len() as u64)
            .filter(|e| *e <= MAX_FILE_SIZE)
            .ok_or(EFBIG)?;
        let first = off / PAGE_SIZE;
        let npages = (end - 1) / PAGE_SIZE - first + 1;
        // Allocate every page first, so a full pool fails before anything is written.
        let mut runs: Vec<(u64, u64, u64)> = Vec::new(); // (file page, data page, count)
        let mut got = 0;
        while got < npages {
            match self
                .data_alloc
                .alloc_run((npages - got).min(MAX_WRITE_PAGES as u64), false)
            {
                Some((p, n)) => {
                    runs.push((first + got, p, n));
                    got += n;
                }
                None => {
                    for &(_, p, n) in &runs {
                        self.data_alloc.free_now(p, n);
                    }
                    return Err(NO_DATA_PAGES);
                }
            }
        }
        let result = self.fill_pages(ino, off, data, &runs).and_then(|_| {
            let now = self.meta.now();
            let size = a.size.max(end);
            let entries = runs
                .iter()
                .map(|&(pg, p, n)| {
                    Entry::Write(WriteRec {
                        pgoff: pg,
                        npages: n as u32,
                        gpa: Gpa::new(self.dsb.group, p),
                        size,
                        mtime: now,
                    })
                })
                .collect();
            self.meta.commit_data(ino, entries)
        });
        if let Err(e) = result {
            if !self.meta.has_failed() {
                for &(_, p, n) in &runs {
                    self.data_alloc.free_now(p, n);
                }
            }
            return Err(e);
        }
        Ok(data.len())
    }

    /// Writes the new pages of a copy-on-write update and persists them. Pages the
    /// write covers partly start as a copy of the old page (or zeros in a hole).
    fn fill_pages(
        &self,
        ino: u64,
        off: u64,
        data: &[u8],
        runs: &[(u64, u64, u64)],
    ) -> FsResult<()> {
        let end = off + data.len() as u64;
        let file = self.meta.inode(ino)?.state.file().expect("regular file");
        // Only partly covered pages need a staging copy (at most the first and last).
        let mut buf = Vec::new();
        for &(pg0, p0, n) in runs {
            for i in 0..n {
                let pg = pg0 + i;
                let start = pg * PAGE_SIZE;
                let lo = off.max(start);
                let hi = end.min(start + PAGE_SIZE);
                let src = &data[(lo - off) as usize..(hi - off) as usize];
                let dst = self.dsb.page_off(p0 + i);
                if hi - lo == PAGE_SIZE {
                    self.data.write_data(dst, src)?;
                    continue;
                }
                buf.resize(PAGE_SIZE as usize, 0);
                match file.get(pg) {
                    Some(old) => self.data.read(self.data_off(old)?, &mut buf)?,
                    None => buf.fill(0),
                }
                buf[(lo - start) as usize..(hi - start) as usize].copy_from_slice(src);
                self.data.write_data(dst, &buf)?;
            }
            self.data
                .persist(self.dsb.page_off(p0), (n * PAGE_SIZE) as usize)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::LogicalClock;
    use crate::engine::ROOT_INO;

    #[test]
    fn a_symlink_whose_directory_entry_finds_no_room_gives_its_page_back_once() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("fs");
        drop(LocalFs::mkfs(&path, 16 << 20, ModeChoice::Auto, 1).unwrap());
        let (fs, _) = LocalFs::open_path(
            &path,
            Arc::new(LogicalClock::new(1)),
            &LocalConfig::default(),
        )
        .unwrap();
        let long = |i: usize| format!("{i:05}{}", "n".repeat(250)).into_bytes();
        // Fill the root's last log page (the first name goes past its first
        // segment) until a 5-line entry no longer fits.
        let room = |fs: &LocalFs| {
            fs.with_engine(|e| {
                let log = &e.inode(ROOT_INO).unwrap().log;
                log.pages.last().unwrap() + PAGE_SIZE - log.tail.offset
            })
        };
        let mut i = 0;
        while room(&fs) >= 5 * 64 || i == 0 {
            fs.create(ROOT_INO, &long(i), 0o644, 0, 0).unwrap();
            i += 1;
        }
        // Leave no log page above the reserve: the new inode's log fits its first
        // segment, and the name needs a page.
        {
            let mut g = fs.lock();
            while g.meta.log_alloc.alloc(false).is_some() {}
        }
        let data_free = fs.statfs().bfree;
        let err = fs
            .symlink(ROOT_INO, &long(99_999), b"somewhere", 0, 0)
            .unwrap_err();
        assert_eq!(err.errno(), libc::ENOSPC, "{err}");
        assert_eq!(
            fs.statfs().bfree,
            data_free,
            "the target's data page came back"
        );
        // A page handed back twice would be handed out twice: allocate and check.
        let a = fs.lock().data_alloc.alloc(false).unwrap();
        let b = fs.lock().data_alloc.alloc(false).unwrap();
        assert_ne!(a, b);
        assert!(fs.check().is_clean(), "{:?}", fs.check().problems);
    }
}
