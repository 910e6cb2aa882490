//! The POSIX-shaped API: paths, file handles and the calls FUSE and the preload
//! library will wrap. Every call takes the client's lock, so a `Client` may be shared
//! by threads; each call runs again from fresh state if the MDS connection had to be
//! re-established meanwhile (the MDS restarted).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use orion_fabric::FabricConfig;
use orion_format::{Entry, FileType, Gpa, WriteRec, NAME_MAX, PAGE_SIZE, SYMLINK_MAX};
use orion_meta::error::{
    EBADF, EEXIST, EINVAL, EISDIR, ELOOP, ENAMETOOLONG, ENOENT, ENOTDIR, ESTALE,
};
use orion_meta::falloc::FallocPlan;
use orion_meta::index::Body;
use orion_meta::xattr::{self, SetMode};
use orion_meta::{
    setattr_entry, Attr, Clock, FsError, FsResult, InodeState, NewNode, RenameMode, SetAttrReq,
    StatFs, SystemClock, TimeSet, ROOT_INO,
};
use orion_proto::{Commit, Create, LockReq, ReplyBody, Request};

use crate::alloc::Chunks;
use crate::arbitration::InodeCache;
use crate::data::{send_commit, Data, PageCache, MAX_REEXECUTIONS};
use crate::link::{io_err, Fail, Link, Res};
use crate::staging::Staging;
use crate::{ClientConfig, Stats};

/// Symlinks followed while resolving one path (as Linux's MAXSYMLINKS).
const MAX_SYMLINKS: usize = 40;
/// Times a call runs again after the MDS connection was re-established.
const RECONNECT_RETRIES: usize = 4;

/// How to open a file (the flags of open(2) that matter to a file system).
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenFlags {
    pub read: bool,
    pub write: bool,
    pub create: bool,
    pub excl: bool,
    pub truncate: bool,
    pub append: bool,
}

impl OpenFlags {
    pub fn read() -> OpenFlags {
        OpenFlags {
            read: true,
            ..Default::default()
        }
    }
    /// O_WRONLY|O_CREAT|O_TRUNC, as `creat(2)`.
    pub fn create() -> OpenFlags {
        OpenFlags {
            write: true,
            create: true,
            truncate: true,
            ..Default::default()
        }
    }
}

/// An open file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fd(pub u64);

struct Handle {
    ino: u64,
    /// The inode's generation when opened (inode numbers are reused).
    gen: u64,
    flags: OpenFlags,
    pos: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub ftype: FileType,
}

struct Inner {
    link: Link,
    cache: InodeCache,
    chunks: Chunks,
    pages: PageCache,
    staging: Staging,
    handles: HashMap<u64, Handle>,
    next_fd: u64,
    uid: u32,
    gid: u32,
}

pub struct Client {
    inner: Arc<Mutex<Inner>>,
    /// Commits staged writes when they are due (optimistic persistence only).
    flusher: Option<JoinHandle<()>>,
}

/// A path split into its components.
fn components(path: &str) -> FsResult<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for c in path.as_bytes().split(|&b| b == b'/') {
        if c.is_empty() || c == b"." {
            continue;
        }
        out.push(c.to_vec());
    }
    Ok(out)
}

impl Client {
    /// Connects to the MDS named in `cfg` and to every data store it lists.
    pub fn connect(cfg: ClientConfig, fabric: FabricConfig) -> FsResult<Client> {
        let pages = PageCache::new(cfg.cache_mib);
        let optimistic = cfg.optimistic().map_err(io_err)?;
        let stage_for = Duration::from_millis(cfg.stage_ms.max(1));
        let link = Link::connect(cfg, fabric)?;
        // SAFETY: geteuid and getegid only read the process's credentials.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let inner = Arc::new(Mutex::new(Inner {
            link,
            cache: InodeCache::default(),
            chunks: Chunks::default(),
            pages,
            staging: Staging::new(optimistic, stage_for),
            handles: HashMap::new(),
            next_fd: 3,
            uid,
            gid,
        }));
        let flusher = if optimistic {
            let weak = Arc::downgrade(&inner);
            let t = std::thread::Builder::new()
                .name("orion-flusher".into())
                .spawn(move || flusher(weak))
                .map_err(|e| io_err(format!("starting the flusher thread: {e}")))?;
            lock(&inner).staging.set_flusher(t.thread().clone());
            Some(t)
        } else {
            None
        };
        Ok(Client { inner, flusher })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Runs a call that is not a read or write: what is staged commits first.
    fn run<T>(&self, f: impl FnMut(&mut Inner) -> Res<T>) -> FsResult<T> {
        self.run_with(true, f)
    }

    /// Runs a read or write: staged writes commit first only when they are due.
    fn run_data<T>(&self, f: impl FnMut(&mut Inner) -> Res<T>) -> FsResult<T> {
        self.run_with(false, f)
    }

    fn run_with<T>(
        &self,
        commit_staged: bool,
        mut f: impl FnMut(&mut Inner) -> Res<T>,
    ) -> FsResult<T> {
        let mut g = self.lock();
        for _ in 0..RECONNECT_RETRIES {
            let staged = if commit_staged || g.staging.due() {
                g.data().flush_all()
            } else {
                Ok(())
            };
            match staged.and_then(|_| f(&mut g)) {
                Ok(v) => return Ok(v),
                Err(Fail::Fs(e)) => return Err(e),
                Err(Fail::Reconnected) => g.data().reconnected(),
            }
        }
        Err(io_err("the MDS connection keeps breaking"))
    }

    /// What the client has done so far.
    pub fn stats(&self) -> Stats {
        self.lock().link.stats.clone()
    }

    /// The group of the data store this client maps directly, if any.
    pub fn internal_group(&self) -> Option<u16> {
        self.lock().link.internal_group
    }

    pub fn stat(&self, path: &str) -> FsResult<Attr> {
        self.run(|i| {
            let (ino, _) = i.resolve(path, true)?;
            i.getattr(ino)
        })
    }

    pub fn lstat(&self, path: &str) -> FsResult<Attr> {
        self.run(|i| {
            let (ino, _) = i.resolve(path, false)?;
            i.getattr(ino)
        })
    }

    /// Attributes by inode number (current: the tail is checked).
    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        self.run(|i| i.getattr(ino))
    }

    /// Looks `name` up in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Attr> {
        self.run(|i| {
            let ino = i.lookup(parent, name)?;
            i.getattr(ino)
        })
    }

    pub fn mkdir(&self, path: &str, mode: u32) -> FsResult<Attr> {
        self.run(|i| i.make(path, FileType::Directory, mode, None))
    }

    pub fn mknod(&self, path: &str, ftype: FileType, mode: u32) -> FsResult<Attr> {
        // Directories and symlinks have calls of their own.
        if matches!(ftype, FileType::Directory | FileType::Symlink) {
            return Err(EINVAL);
        }
        self.run(|i| i.make(path, ftype, mode, None))
    }

    pub fn symlink(&self, target: &str, path: &str) -> FsResult<Attr> {
        let t = target.as_bytes();
        if t.is_empty() {
            return Err(ENOENT);
        }
        if t.len() > SYMLINK_MAX {
            return Err(ENAMETOOLONG);
        }
        self.run(|i| i.make(path, FileType::Symlink, 0o777, Some(t)))
    }

    pub fn readlink(&self, path: &str) -> FsResult<Vec<u8>> {
        self.run(|i| {
            let (ino, _) = i.resolve(path, false)?;
            i.readlink(ino)
        })
    }

    pub fn unlink(&self, path: &str) -> FsResult<()> {
        self.run(|i| {
            let (parent, name) = i.resolve_parent(path)?;
            i.rpc(Request::Unlink { parent, name }).map(|_| ())
        })
    }

    pub fn rmdir(&self, path: &str) -> FsResult<()> {
        self.run(|i| {
            let (parent, name) = i.resolve_parent(path)?;
            i.rpc(Request::Rmdir { parent, name }).map(|_| ())
        })
    }

    pub fn rename(&self, from: &str, to: &str) -> FsResult<()> {
        self.rename_with(from, to, RenameMode::Replace)
    }

    /// rename(2), or renameat2 with RENAME_NOREPLACE or RENAME_EXCHANGE.
    pub fn rename_with(&self, from: &str, to: &str, mode: RenameMode) -> FsResult<()> {
        self.run(|i| {
            let (old_parent, old_name) = i.resolve_parent(from)?;
            let (new_parent, new_name) = i.resolve_parent(to)?;
            i.rpc(Request::Rename {
                old_parent,
                old_name,
                new_parent,
                new_name,
                mode,
            })
            .map(|_| ())
        })
    }

    pub fn link(&self, existing: &str, new: &str) -> FsResult<Attr> {
        self.run(|i| {
            let (ino, _) = i.resolve(existing, false)?;
            let (parent, name) = i.resolve_parent(new)?;
            match i.rpc(Request::Link { ino, parent, name })? {
                ReplyBody::Attr(a) => Ok(a),
                other => Err(io_err(format!("unexpected reply {other:?}")).into()),
            }
        })
    }

    pub fn readdir(&self, path: &str) -> FsResult<Vec<DirEntry>> {
        self.run(|i| {
            let (ino, parent) = i.resolve(path, true)?;
            i.readdir(ino, parent)
        })
    }

    pub fn setattr_path(&self, path: &str, req: &SetAttrReq) -> FsResult<Attr> {
        self.run(|i| {
            let (ino, _) = i.resolve(path, true)?;
            i.setattr(ino, req)
        })
    }

    pub fn setattr(&self, ino: u64, req: &SetAttrReq) -> FsResult<Attr> {
        self.run(|i| i.setattr(ino, req))
    }

    pub fn truncate(&self, path: &str, size: u64) -> FsResult<()> {
        self.setattr_path(
            path,
            &SetAttrReq {
                size: Some(size),
                ..Default::default()
            },
        )
        .map(|_| ())
    }

    pub fn chmod(&self, path: &str, mode: u32) -> FsResult<()> {
        self.setattr_path(
            path,
            &SetAttrReq {
                mode: Some(mode),
                ..Default::default()
            },
        )
        .map(|_| ())
    }

    pub fn utimens(
        &self,
        path: &str,
        atime: Option<TimeSet>,
        mtime: Option<TimeSet>,
    ) -> FsResult<()> {
        self.setattr_path(
            path,
            &SetAttrReq {
                atime,
                mtime,
                ..Default::default()
            },
        )
        .map(|_| ())
    }

    pub fn statfs(&self) -> FsResult<StatFs> {
        self.run(|i| match i.rpc(Request::Statfs)? {
            ReplyBody::Statfs(s) => Ok(s),
            other => Err(io_err(format!("unexpected reply {other:?}")).into()),
        })
    }

    /// An empty round trip to the MDS.
    pub fn ping(&self) -> FsResult<()> {
        self.run(|i| i.rpc(Request::Ping).map(|_| ()))
    }

    pub fn open(&self, path: &str, flags: OpenFlags, mode: u32) -> FsResult<Fd> {
        self.run(|i| i.open(path, flags, mode))
    }

    /// Closes a file handle; commits the writes staged for the file first and
    /// reports any that failed to commit (close-to-open: a client that opens the
    /// file after this returns sees them).
    pub fn close(&self, fd: Fd) -> FsResult<()> {
        let h = self.lock().handles.remove(&fd.0).ok_or(EBADF)?;
        self.run_data(|i| i.data().settle(h.ino, h.gen))
    }

    /// Commits the writes staged for an open file, and reports any that failed to
    /// commit since the last report (what close(2) reports, through FUSE's flush).
    pub fn flush(&self, fd: Fd) -> FsResult<()> {
        let (ino, _, _) = self.handle(fd)?;
        let gen = self.generation(fd)?;
        self.run_data(|i| i.data().settle(ino, gen))
    }

    fn handle(&self, fd: Fd) -> FsResult<(u64, OpenFlags, u64)> {
        let g = self.lock();
        let h = g.handles.get(&fd.0).ok_or(EBADF)?;
        Ok((h.ino, h.flags, h.pos))
    }

    fn generation(&self, fd: Fd) -> FsResult<u64> {
        let g = self.lock();
        Ok(g.handles.get(&fd.0).ok_or(EBADF)?.gen)
    }

    pub fn pread(&self, fd: Fd, off: u64, len: usize) -> FsResult<Vec<u8>> {
        let (ino, flags, _) = self.handle(fd)?;
        if !flags.read {
            return Err(EBADF);
        }
        let gen = self.generation(fd)?;
        self.run_data(|i| i.data().read(ino, gen, off, len))
    }

    pub fn read(&self, fd: Fd, len: usize) -> FsResult<Vec<u8>> {
        let (_, _, pos) = self.handle(fd)?;
        let out = self.pread(fd, pos, len)?;
        if let Some(h) = self.lock().handles.get_mut(&fd.0) {
            h.pos = pos + out.len() as u64;
        }
        Ok(out)
    }

    pub fn pwrite(&self, fd: Fd, off: u64, data: &[u8]) -> FsResult<usize> {
        let (ino, flags, _) = self.handle(fd)?;
        if !flags.write {
            return Err(EBADF);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let gen = self.generation(fd)?;
        self.run_data(|i| i.data().write(ino, gen, off, data, flags.append))?;
        Ok(data.len())
    }

    pub fn write(&self, fd: Fd, data: &[u8]) -> FsResult<usize> {
        let (ino, flags, pos) = self.handle(fd)?;
        if !flags.write {
            return Err(EBADF);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let gen = self.generation(fd)?;
        let at = self.run_data(|i| i.data().write(ino, gen, pos, data, flags.append))?;
        if let Some(h) = self.lock().handles.get_mut(&fd.0) {
            h.pos = at + data.len() as u64;
        }
        Ok(data.len())
    }

    pub fn seek(&self, fd: Fd, pos: u64) -> FsResult<()> {
        let mut g = self.lock();
        g.handles.get_mut(&fd.0).ok_or(EBADF)?.pos = pos;
        Ok(())
    }

    pub fn fstat(&self, fd: Fd) -> FsResult<Attr> {
        let (ino, _, _) = self.handle(fd)?;
        self.getattr(ino)
    }

    pub fn ftruncate(&self, fd: Fd, size: u64) -> FsResult<()> {
        let (ino, flags, _) = self.handle(fd)?;
        if !flags.write {
            return Err(EINVAL);
        }
        self.setattr(
            ino,
            &SetAttrReq {
                size: Some(size),
                ..Default::default()
            },
        )
        .map(|_| ())
    }

    /// Makes the file's data and log durable. Log commits are durable when they are
    /// acknowledged, and strong-mode data before its commit; staged writes commit
    /// here, and weak-mode pages written one-sided are made durable on their stores.
    pub fn fsync(&self, fd: Fd) -> FsResult<()> {
        let (ino, _, _) = self.handle(fd)?;
        let gen = self.generation(fd)?;
        self.run_data(|i| {
            i.data().settle(ino, gen)?;
            i.link.flush_stores()
        })
    }

    /// Marks a file as heavily shared, for every client: each update of it commits
    /// conditionally, in the MDS's order, and runs again if another client's update
    /// came first (the ioctl of paper §4.3). The mark is the extended attribute
    /// [`xattr::SHARED_FLAG`], so `setfattr` sets it through a mount.
    pub fn set_shared(&self, fd: Fd, shared: bool) -> FsResult<()> {
        let (ino, _, _) = self.handle(fd)?;
        let r = if shared {
            self.setxattr_ino(ino, xattr::SHARED_FLAG, b"1", SetMode::Any)
        } else {
            self.removexattr_ino(ino, xattr::SHARED_FLAG)
        };
        match r {
            Err(FsError::Errno(libc::ENODATA)) if !shared => Ok(()),
            r => r,
        }
    }

    /// setxattr(2) on inode `ino`: the value goes to a data page, then a conditional
    /// log commit names it.
    pub fn setxattr_ino(&self, ino: u64, name: &[u8], value: &[u8], mode: SetMode) -> FsResult<()> {
        self.run(|i| i.setxattr(ino, name, value, mode))
    }

    /// getxattr(2): the value, read one-sided from its page.
    pub fn getxattr_ino(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        self.run(|i| {
            let c = i.cache.refresh(&mut i.link, ino)?;
            let (gpa, len) = xattr::lookup(&c.state, name)?;
            let mut buf = vec![0u8; PAGE_SIZE as usize];
            read_page(i, gpa, &mut buf)?;
            buf.truncate(len as usize);
            Ok(buf)
        })
    }

    /// listxattr(2): NUL-terminated names; trusted.* only when `privileged`.
    pub fn listxattr_ino(&self, ino: u64, privileged: bool) -> FsResult<Vec<u8>> {
        self.run(|i| {
            let c = i.cache.refresh(&mut i.link, ino)?;
            Ok(xattr::list(&c.state, |ns| {
                privileged || ns != xattr::Namespace::Trusted
            }))
        })
    }

    pub fn removexattr_ino(&self, ino: u64, name: &[u8]) -> FsResult<()> {
        self.run(|i| {
            i.commit_checked(ino, |state, now| {
                xattr::remove_entry(state, name, now).map(|e| vec![e])
            })
            .map(|_| ())
        })
    }

    /// The path versions, following a final symlink (as setxattr(2) does).
    pub fn setxattr(&self, path: &str, name: &[u8], value: &[u8], mode: SetMode) -> FsResult<()> {
        xattr::check_len(name)?;
        self.setxattr_ino(self.stat(path)?.ino, name, value, mode)
    }
    pub fn getxattr(&self, path: &str, name: &[u8]) -> FsResult<Vec<u8>> {
        xattr::check_len(name)?;
        self.getxattr_ino(self.stat(path)?.ino, name)
    }
    pub fn listxattr(&self, path: &str) -> FsResult<Vec<u8>> {
        let privileged = self.lock().uid == 0;
        self.listxattr_ino(self.stat(path)?.ino, privileged)
    }
    pub fn removexattr(&self, path: &str, name: &[u8]) -> FsResult<()> {
        xattr::check_len(name)?;
        self.removexattr_ino(self.stat(path)?.ino, name)
    }

    /// fallocate(2) on an open file (see [`FallocPlan`] for the modes): the parts of
    /// pages in a punched range are overwritten with zeros, then one conditional
    /// commit makes the whole pages a hole and sets the times and any new size.
    pub fn fallocate(&self, fd: Fd, mode: i32, off: u64, len: u64) -> FsResult<()> {
        let (ino, flags, _) = self.handle(fd)?;
        if !flags.write {
            return Err(EBADF);
        }
        let gen = self.generation(fd)?;
        self.run(|i| {
            let state = &i.cache.refresh(&mut i.link, ino)?.state;
            let plan = FallocPlan::new(state, off, len, mode)?;
            for &(s, e) in &plan.zero_ranges {
                i.data()
                    .write(ino, gen, s, &vec![0u8; (e - s) as usize], false)?;
            }
            if plan.reserve_pages > 0 {
                let ReplyBody::Statfs(s) = i.rpc(Request::Statfs)? else {
                    return Err(io_err("unexpected reply to statfs").into());
                };
                plan.check_room(s.bfree)?;
            }
            i.commit_checked(ino, |state, now| {
                Ok(FallocPlan::new(state, off, len, mode)?.entries(now))
            })
            .map(|_| ())
        })
    }

    /// Creates `name` in directory `parent` (a symlink when `symlink` holds its
    /// target), owned by `uid`/`gid`: the call FUSE makes, the kernel having resolved
    /// the path and the caller's credentials.
    pub fn create_at(
        &self,
        parent: u64,
        name: &[u8],
        node: NewNode,
        symlink: Option<&[u8]>,
    ) -> FsResult<Attr> {
        check_name(name)?;
        if let Some(t) = symlink {
            if t.is_empty() {
                return Err(ENOENT);
            }
            if t.len() > SYMLINK_MAX {
                return Err(ENAMETOOLONG);
            }
        }
        self.run(|i| i.make_at(parent, name.to_vec(), node, symlink))
    }

    pub fn unlink_at(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        check_name(name)?;
        let name = name.to_vec();
        self.run(|i| {
            i.rpc(Request::Unlink {
                parent,
                name: name.clone(),
            })
            .map(|_| ())
        })
    }

    pub fn rmdir_at(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        check_name(name)?;
        let name = name.to_vec();
        self.run(|i| {
            i.rpc(Request::Rmdir {
                parent,
                name: name.clone(),
            })
            .map(|_| ())
        })
    }

    /// rename(2) by directory inodes and names, or renameat2 with `mode`.
    pub fn rename_at(
        &self,
        old_parent: u64,
        old_name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        mode: RenameMode,
    ) -> FsResult<()> {
        check_name(old_name)?;
        check_name(new_name)?;
        self.run(|i| {
            i.rpc(Request::Rename {
                old_parent,
                old_name: old_name.to_vec(),
                new_parent,
                new_name: new_name.to_vec(),
                mode,
            })
            .map(|_| ())
        })
    }

    pub fn link_at(&self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Attr> {
        check_name(name)?;
        self.run(|i| {
            match i.rpc(Request::Link {
                ino,
                parent,
                name: name.to_vec(),
            })? {
                ReplyBody::Attr(a) => Ok(a),
                other => Err(io_err(format!("unexpected reply {other:?}")).into()),
            }
        })
    }

    /// The entries of directory `ino`, with "." and "..".
    pub fn readdir_ino(&self, ino: u64) -> FsResult<Vec<DirEntry>> {
        self.run(|i| {
            let parent = i.parent(ino)?;
            i.readdir(ino, parent)
        })
    }

    pub fn readlink_ino(&self, ino: u64) -> FsResult<Vec<u8>> {
        self.run(|i| i.readlink(ino))
    }

    /// Opens inode `ino` (it exists: FUSE looked it up); O_CREAT and O_EXCL do not
    /// apply here.
    pub fn open_ino(&self, ino: u64, flags: OpenFlags) -> FsResult<Fd> {
        self.run(|i| i.open_ino(ino, flags))
    }

    /// Takes, changes or drops (`LockKind::Unlock`) an advisory lock at the MDS, so
    /// that it holds across clients (fcntl rules; flock as a whole-file range). With
    /// `wait`, tries again until no other owner holds a conflicting lock, or until
    /// `still_wanted` says the waiter is gone (then EINTR).
    pub fn set_lock(
        &self,
        req: LockReq,
        wait: bool,
        still_wanted: impl Fn() -> bool,
    ) -> FsResult<()> {
        let mut pause = Duration::from_micros(200);
        loop {
            match self.run(|i| i.rpc(Request::Lock(req)).map(|_| ())) {
                Err(FsError::Errno(libc::EAGAIN)) if wait => {
                    if !still_wanted() {
                        return Err(FsError::Errno(libc::EINTR));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                r => return r,
            }
        }
    }

    /// The first lock of another owner that `req` would conflict with (F_GETLK).
    pub fn test_lock(&self, req: LockReq) -> FsResult<Option<LockReq>> {
        self.run(|i| match i.rpc(Request::TestLock(req))? {
            ReplyBody::Lock(l) => Ok(l),
            other => Err(io_err(format!("unexpected reply {other:?}")).into()),
        })
    }

    /// Drops every lock `owner` holds on `ino` (a flock's file was closed).
    pub fn release_locks(&self, ino: u64, owner: u64) -> FsResult<()> {
        self.run(|i| i.rpc(Request::ReleaseLocks { ino, owner }).map(|_| ()))
    }

    /// The inode number of an open file.
    pub fn ino(&self, fd: Fd) -> FsResult<u64> {
        Ok(self.handle(fd)?.0)
    }
}

impl Inner {
    fn data(&mut self) -> Data<'_> {
        Data {
            link: &mut self.link,
            cache: &mut self.cache,
            chunks: &mut self.chunks,
            pages: &mut self.pages,
            staging: &mut self.staging,
        }
    }

    fn rpc(&mut self, req: Request) -> Res<ReplyBody> {
        self.link.call(&req)
    }

    fn getattr(&mut self, ino: u64) -> Res<Attr> {
        Ok(self.cache.refresh(&mut self.link, ino)?.state.attr.clone())
    }

    /// Commits the entries `build` makes from a current copy of the inode,
    /// conditionally on that copy's tail; builds again when another update came first.
    fn commit_checked(
        &mut self,
        ino: u64,
        build: impl FnMut(&InodeState, i64) -> FsResult<Vec<Entry>>,
    ) -> Res<()> {
        self.commit_checked_with(ino, true, build)
    }

    /// [`Self::commit_checked`] for entries naming pages this client wrote:
    /// `persisted_locally` tells whether they are durable already (internal client).
    fn commit_checked_with(
        &mut self,
        ino: u64,
        persisted_locally: bool,
        mut build: impl FnMut(&InodeState, i64) -> FsResult<Vec<Entry>>,
    ) -> Res<()> {
        // Staged writes of the file were done before: they commit first.
        self.data().flush(ino)?;
        for _ in 0..MAX_REEXECUTIONS {
            let c = self.cache.refresh(&mut self.link, ino)?;
            let entries = build(&c.state, SystemClock.now())?;
            let commit = Commit {
                ino,
                generation: c.generation,
                expect: Some(c.tail),
                persisted_locally,
                entries: entries.clone(),
            };
            match send_commit(&mut self.link, commit) {
                Ok((prev, tail)) => {
                    return self
                        .cache
                        .committed(&mut self.link, ino, &entries, prev, tail);
                }
                Err(Fail::Fs(FsError::Errno(libc::ESTALE))) => self.link.stats.reexecutions += 1,
                Err(e) => return Err(e),
            }
        }
        Err(ESTALE.into())
    }

    /// setxattr: the value is written to a page of this client's chunk once; the
    /// entry naming it commits conditionally (so XATTR_CREATE and XATTR_REPLACE hold
    /// against other clients). A refused set gives the page back.
    fn setxattr(&mut self, ino: u64, name: &[u8], value: &[u8], mode: SetMode) -> Res<()> {
        xattr::check_set(
            &self.cache.refresh(&mut self.link, ino)?.state,
            name,
            value.len(),
            mode,
        )?;
        let (g, local) = self.value_page(value)?;
        let r = self.commit_checked_with(ino, local, |state, now| {
            xattr::check_set(state, name, value.len(), mode)?;
            Ok(vec![xattr::set_entry(name, g, value.len(), now)])
        });
        if let Err(Fail::Fs(FsError::Errno(_))) = r {
            self.chunks.give_back(vec![(g, 1)]);
        }
        r
    }

    /// Writes `bytes` (at most a page: a symlink target, an xattr value) to a page of
    /// this client's chunk; returns it and whether it is persisted already (own store).
    /// A caller whose request is then refused gives the page back.
    fn value_page(&mut self, bytes: &[u8]) -> Res<(Gpa, bool)> {
        let runs = self.chunks.take(&mut self.link, 1)?;
        let g = runs[0].0;
        let mut buf = vec![0u8; PAGE_SIZE as usize];
        buf[..bytes.len()].copy_from_slice(bytes);
        match self.link.write_pages(g, &buf) {
            Ok(local) => Ok((g, local)),
            Err(e) => {
                self.chunks.give_back(runs);
                Err(e.into())
            }
        }
    }

    fn lookup(&mut self, parent: u64, name: &[u8]) -> Res<u64> {
        if name.len() > NAME_MAX {
            return Err(ENAMETOOLONG.into());
        }
        let c = self.cache.refresh(&mut self.link, parent)?;
        let Some(d) = c.state.dir() else {
            return Err(ENOTDIR.into());
        };
        match name {
            b"." => Ok(parent),
            b".." => self.parent(parent),
            _ => d.names.get(name).map(|e| e.ino).ok_or(ENOENT.into()),
        }
    }

    fn parent(&mut self, dir: u64) -> Res<u64> {
        if dir == ROOT_INO {
            return Ok(ROOT_INO);
        }
        match self.rpc(Request::Parent { ino: dir })? {
            ReplyBody::Ino(p) => Ok(p),
            other => Err(io_err(format!("unexpected reply {other:?}")).into()),
        }
    }

    /// Resolves a path from the root: the inode and its parent directory. Symlinks
    /// are followed, the last one only when `follow_last`.
    fn resolve(&mut self, path: &str, follow_last: bool) -> Res<(u64, u64)> {
        let mut todo = components(path)?;
        todo.reverse();
        let mut stack = vec![ROOT_INO];
        let mut links = 0;
        let mut cur = ROOT_INO;
        while let Some(name) = todo.pop() {
            let dir = *stack.last().expect("root stays");
            let c = self.cache.refresh(&mut self.link, dir)?;
            let Some(d) = c.state.dir() else {
                return Err(ENOTDIR.into());
            };
            if name == b".." {
                if stack.len() > 1 {
                    stack.pop();
                }
                cur = *stack.last().expect("root stays");
                continue;
            }
            // As Linux: a name is too long only once its directory is known to be one.
            if name.len() > NAME_MAX {
                return Err(ENAMETOOLONG.into());
            }
            let ent = *d.names.get(name.as_slice()).ok_or(ENOENT)?;
            let last = todo.is_empty();
            if ent.ftype == FileType::Symlink && (!last || follow_last) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(ELOOP.into());
                }
                let target = self.readlink(ent.ino)?;
                let target = String::from_utf8_lossy(&target).into_owned();
                if target.starts_with('/') {
                    stack.truncate(1);
                }
                let mut more = components(&target)?;
                more.reverse();
                todo.extend(more);
                cur = *stack.last().expect("root stays");
                continue;
            }
            if last {
                return Ok((ent.ino, dir));
            }
            stack.push(ent.ino);
            cur = ent.ino;
        }
        let parent = if stack.len() > 1 {
            stack[stack.len() - 2]
        } else {
            ROOT_INO
        };
        Ok((cur, parent))
    }

    /// The directory that would hold `path`'s last component, and that name.
    fn resolve_parent(&mut self, path: &str) -> Res<(u64, Vec<u8>)> {
        let mut comps = components(path)?;
        let Some(name) = comps.pop() else {
            return Err(EBUSY_ROOT.into());
        };
        if name == b".." {
            return Err(EINVAL.into());
        }
        let dir_path = comps
            .iter()
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect::<Vec<_>>()
            .join("/");
        let (dir, _) = self.resolve(&dir_path, true)?;
        if self
            .cache
            .refresh(&mut self.link, dir)?
            .state
            .dir()
            .is_none()
        {
            return Err(ENOTDIR.into());
        }
        Ok((dir, name))
    }

    fn make(
        &mut self,
        path: &str,
        ftype: FileType,
        mode: u32,
        symlink: Option<&[u8]>,
    ) -> Res<Attr> {
        let (parent, name) = self.resolve_parent(path)?;
        let node = NewNode {
            ftype,
            mode,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
        };
        self.make_at(parent, name, node, symlink)
    }

    fn make_at(
        &mut self,
        parent: u64,
        name: Vec<u8>,
        node: NewNode,
        symlink: Option<&[u8]>,
    ) -> Res<Attr> {
        let mut page = None;
        if let Some(t) = symlink {
            let (g, _) = self.value_page(t)?;
            page = Some((g, t.len() as u32));
        }
        let r = self.rpc(Request::Create(Create {
            parent,
            name,
            ftype: node.ftype,
            mode: node.mode,
            uid: node.uid,
            gid: node.gid,
            rdev: node.rdev,
            symlink: page,
        }));
        match r {
            Ok(ReplyBody::Attr(a)) => Ok(a),
            Ok(other) => Err(io_err(format!("unexpected reply {other:?}")).into()),
            Err(e) => {
                if let (Fail::Fs(FsError::Errno(_)), Some((g, _))) = (&e, page) {
                    self.chunks.give_back(vec![(g, 1)]);
                }
                Err(e)
            }
        }
    }

    fn readlink(&mut self, ino: u64) -> Res<Vec<u8>> {
        let c = self.cache.refresh(&mut self.link, ino)?;
        let Body::Symlink(Some((gpa, len))) = c.state.body else {
            return Err(EINVAL.into());
        };
        let mut buf = vec![0u8; PAGE_SIZE as usize];
        read_page(self, gpa, &mut buf)?;
        buf.truncate(len as usize);
        Ok(buf)
    }

    fn readdir(&mut self, ino: u64, parent: u64) -> Res<Vec<DirEntry>> {
        let c = self.cache.refresh(&mut self.link, ino)?;
        let Some(d) = c.state.dir() else {
            return Err(ENOTDIR.into());
        };
        let mut out = vec![
            DirEntry {
                name: b".".to_vec(),
                ino,
                ftype: FileType::Directory,
            },
            DirEntry {
                name: b"..".to_vec(),
                ino: parent,
                ftype: FileType::Directory,
            },
        ];
        for name in d.by_cookie.values() {
            let e = d.names[name];
            out.push(DirEntry {
                name: name.to_vec(),
                ino: e.ino,
                ftype: e.ftype,
            });
        }
        Ok(out)
    }

    fn open(&mut self, path: &str, flags: OpenFlags, mode: u32) -> Res<Fd> {
        let ino = match self.resolve(path, true) {
            Ok((ino, _)) => {
                if flags.create && flags.excl {
                    return Err(EEXIST.into());
                }
                ino
            }
            Err(Fail::Fs(e)) if e == ENOENT && flags.create => {
                match self.make(path, FileType::Regular, mode, None) {
                    Ok(a) => a.ino,
                    // Created by someone else meanwhile.
                    Err(Fail::Fs(e)) if e == EEXIST && !flags.excl => self.resolve(path, true)?.0,
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        self.open_ino(ino, flags)
    }

    fn open_ino(&mut self, ino: u64, flags: OpenFlags) -> Res<Fd> {
        let a = self.getattr(ino)?;
        if a.ftype == FileType::Directory && (flags.write || flags.truncate) {
            return Err(EISDIR.into());
        }
        if flags.truncate && flags.write && a.ftype == FileType::Regular && a.size > 0 {
            self.setattr(
                ino,
                &SetAttrReq {
                    size: Some(0),
                    ..Default::default()
                },
            )?;
        }
        let gen = self.cache.refresh(&mut self.link, ino)?.generation;
        let fd = self.next_fd;
        self.next_fd += 1;
        self.handles.insert(
            fd,
            Handle {
                ino,
                gen,
                flags,
                pos: 0,
            },
        );
        Ok(Fd(fd))
    }

    /// chmod, chown, truncate, utimens: a conditional log commit built from the
    /// current state by the same rules as the MDS's (run again if another client's
    /// commit came first). A truncation inside a page copies that page with the
    /// cut-off bytes zeroed, so a later extension reads zeros there.
    fn setattr(&mut self, ino: u64, req: &SetAttrReq) -> Res<Attr> {
        let mut page: Option<Vec<(Gpa, u64)>> = None;
        let r = self.setattr_attempts(ino, req, &mut page);
        if let (Err(Fail::Fs(FsError::Errno(_))), Some(p)) = (&r, page) {
            self.chunks.give_back(p);
        }
        r
    }

    fn setattr_attempts(
        &mut self,
        ino: u64,
        req: &SetAttrReq,
        page: &mut Option<Vec<(Gpa, u64)>>,
    ) -> Res<Attr> {
        for _ in 0..10_000 {
            let c = self.cache.refresh(&mut self.link, ino)?;
            let a = c.state.attr.clone();
            let tail = c.tail;
            let generation = c.generation;
            let file = c.state.file();
            let has_pages = file.is_some_and(|f| !f.pages.is_empty());
            let now = SystemClock.now();
            let mut entries = Vec::new();
            let mut cut_page = None;
            if let Some(size) = req.size {
                let pg = size / PAGE_SIZE;
                if size < a.size && size % PAGE_SIZE != 0 {
                    cut_page = file.and_then(|f| f.get(pg)).map(|old| (pg, old));
                }
            }
            let rec = setattr_entry(&a, has_pages, req, now)?;
            if let Some((pg, old)) = cut_page {
                let mut buf = vec![0u8; PAGE_SIZE as usize];
                read_page(self, old, &mut buf)?;
                buf[(req.size.unwrap_or(0) % PAGE_SIZE) as usize..].fill(0);
                if page.is_none() {
                    *page = Some(self.chunks.take(&mut self.link, 1)?);
                }
                let g = page.as_ref().expect("taken")[0].0;
                self.link.write_pages(g, &buf)?;
                entries.push(Entry::Write(WriteRec {
                    pgoff: pg,
                    npages: 1,
                    gpa: g,
                    size: a.size,
                    mtime: now,
                }));
            }
            let Some(rec) = rec else {
                if entries.is_empty() {
                    return Ok(a);
                }
                return Err(io_err("a page copy without an attribute change").into());
            };
            entries.push(Entry::SetAttr(rec));
            let commit = Commit {
                ino,
                generation,
                expect: Some(tail),
                persisted_locally: self.link.internal_group.is_some(),
                entries,
            };
            let sent = commit.entries.clone();
            match send_commit(&mut self.link, commit) {
                Ok((prev, tail)) => {
                    *page = None;
                    self.cache
                        .committed(&mut self.link, ino, &sent, prev, tail)?;
                    return self.getattr(ino);
                }
                Err(Fail::Fs(FsError::Errno(e))) if e == libc::ESTALE => {
                    self.link.stats.reexecutions += 1;
                }
                Err(e) => return Err(e),
            }
        }
        Err(ESTALE.into())
    }
}

/// A name as one path component: not empty, no '/', at most NAME_MAX bytes.
fn check_name(name: &[u8]) -> FsResult<()> {
    if name.is_empty() || name.contains(&b'/') {
        return Err(EINVAL);
    }
    if name.len() > NAME_MAX {
        return Err(ENAMETOOLONG);
    }
    Ok(())
}

fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(|e| e.into_inner())
}

/// The flusher thread of an optimistic client: commits staged writes when they are
/// due; looks every stage period while writes come, and sleeps until the next staged
/// write after `IDLE_ROUNDS` periods with nothing staged. Stops with the client.
fn flusher(inner: Weak<Mutex<Inner>>) {
    const IDLE_ROUNDS: u32 = 100;
    let mut idle = 0;
    loop {
        let wait = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let mut g = lock(&inner);
            if g.staging.closing {
                return;
            }
            if g.staging.due() {
                // A failure is kept for the file's fsync or close.
                if let Err(Fail::Reconnected) = g.data().flush_all() {
                    g.data().reconnected();
                }
            }
            match g.staging.due_in() {
                Some(d) => {
                    idle = 0;
                    Some(d)
                }
                None if idle < IDLE_ROUNDS => {
                    idle += 1;
                    Some(g.staging.max_age())
                }
                None => {
                    g.staging.flusher_asleep = true;
                    None
                }
            }
        };
        match wait {
            Some(d) => std::thread::park_timeout(d),
            None => std::thread::park(),
        }
    }
}

impl Drop for Client {
    /// Commits what is staged (a client dropped without closing its files loses no
    /// acknowledged write it could still commit) and stops the flusher.
    fn drop(&mut self) {
        {
            let mut g = self.lock();
            if let Err(Fail::Reconnected) = g.data().flush_all() {
                g.data().reconnected();
            }
            g.staging.closing = true;
        }
        if let Some(t) = self.flusher.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// rename/unlink of "/" itself.
const EBUSY_ROOT: FsError = FsError::Errno(libc::EBUSY);

fn read_page(i: &mut Inner, gpa: Gpa, buf: &mut [u8]) -> Res<()> {
    let mut d = i.data();
    d.read_page(gpa, buf)
}
