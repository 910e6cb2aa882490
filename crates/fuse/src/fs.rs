//! The FUSE operations, each a thin translation to a client-library call: kernel
//! types in, `orion_client` calls, kernel replies out. Errors keep their errno; an
//! error without one (a broken connection, a damaged pool) is logged and becomes EIO.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags as KOpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use orion_client::perm::{self};
use orion_client::xattr::SetMode;
use orion_client::{
    Attr, Call, Client, DirEntry, Fd, FileType, FsError, FsResult, LockKind, OpenFlags, RenameMode,
    SetAttrReq, ROOT_INO,
};

use crate::convert::*;
use crate::listings::Listings;
use crate::nodes::Nodes;
use removed::REMOVED_DIR;

mod permissions;
mod removed;

/// Largest read or write the kernel is asked to send in one request.
pub const MAX_IO: u32 = 1 << 20;

/// The mounted file system: one client, and the listings of open directory handles
/// ([`Listings`]).
pub struct OrionFs {
    pub(crate) client: Arc<Client>,
    listings: Listings,
    /// Inodes this mount ever asked to lock: only their closes need to drop locks at
    /// the MDS (a round trip every other close can skip).
    locked: Mutex<HashSet<u64>>,
    /// The kernel keeps file data too, across opens (see [`crate::cache`]).
    data_cache: bool,
    /// The generation of each inode the kernel holds ([`crate::nodes`]).
    nodes: Nodes,
}

impl OrionFs {
    pub fn new(client: Arc<Client>) -> OrionFs {
        OrionFs {
            client,
            listings: Listings::default(),
            locked: Mutex::new(HashSet::new()),
            data_cache: false,
            nodes: Nodes::default(),
        }
    }

    /// Lets the kernel keep file data across opens, kept true by the callbacks of the
    /// client's kernel cache ([`Client::cache_in_kernel`], which the mount turns on,
    /// and which must be told the same: its `data` keeps the MDS from recalling the
    /// watches of files whose pages the kernel keeps).
    pub fn with_data_cache(mut self, on: bool) -> OrionFs {
        self.data_cache = on;
        self
    }

    /// The client, for the mount to turn its kernel cache on
    /// ([`Client::cache_in_kernel`]).
    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    /// Replies with an entry the kernel may keep for `ttl` (see [`crate::cache`]),
    /// and counts the lookup the kernel will forget. The caller holds the kernel
    /// gate ([`Client::kernel_gate`]).
    fn entry(&self, reply: ReplyEntry, r: FsResult<(Attr, Duration)>) {
        match r {
            // Recorded before the reply: the kernel may name the inode in a request
            // on another thread as soon as it has the entry.
            Ok((a, ttl)) if self.nodes.told(&a) => {
                reply.entry(&ttl, &file_attr(&a), Generation(a.generation));
                self.client.kernel_looked_up(a.ino);
            }
            Ok(_) => reply.error(Errno::ESTALE),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// Err(ESTALE) when inode `ino` as the kernel holds it is gone and its number
    /// belongs to a later file ([`crate::nodes`]).
    pub(crate) fn current(&self, ino: u64) -> FsResult<()> {
        match self.nodes.generation(ino) {
            Some(g) => of_generation(&self.client.getattr(ino)?, g),
            None => Ok(()),
        }
    }

    /// Err(ESTALE) unless `a` (just read) is of the generation the kernel holds of
    /// its inode number; if so, `a` is kept as the inode's latest attributes
    /// ([`crate::nodes`]).
    fn same_as_kernel(&self, a: &Attr) -> FsResult<()> {
        match self.nodes.saw(a) {
            true => Ok(()),
            false => Err(FsError::Errno(libc::ESTALE)),
        }
    }
}

/// Err(ESTALE) unless `a` is of generation `g`.
fn of_generation(a: &Attr, g: u64) -> FsResult<()> {
    match a.generation == g {
        true => Ok(()),
        false => Err(FsError::Errno(libc::ESTALE)),
    }
}

impl Filesystem for OrionFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // O_TRUNC arrives with open (one conditional commit, not open + setattr);
        // lookups and creates in one directory may run in parallel; shared mmap of
        // direct-I/O files (executables, databases) where the kernel has it; fcntl and
        // flock locks come here, to be held at the MDS across clients.
        let want = InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
            | InitFlags::FUSE_POSIX_LOCKS
            | InitFlags::FUSE_FLOCK_LOCKS;
        if let Err(missing) = config.add_capabilities(want) {
            let _ = config.add_capabilities(want - missing);
        }
        // Kept pages are dropped when refreshed attributes show another size or
        // mtime: the net under the callbacks when a lease ran out.
        if self.data_cache {
            let _ = config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA);
        }
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _timed = self.client.timed(Call::Lookup);
        let _kernel = self.client.kernel_gate();
        // The parent's attributes are read once, for its generation and, for a
        // caller other than root, its search permission.
        let r = if req.uid() == 0 {
            self.current(parent.0)
        } else {
            (self.client.getattr(parent.0)).and_then(|a| {
                self.same_as_kernel(&a)?;
                with_cred(req, |c| perm::check(&a, c, perm::MAY_EXEC))
            })
        };
        // A hand-over name (the preload library's way to a file it holds and has no
        // path to; see `client/src/fs/handover.rs`): the inode, kept by no cache.
        let handover = (parent.0 == ROOT_INO && r.is_ok())
            .then(|| self.client.handover_target(name.as_bytes()))
            .flatten();
        if let Some(target) = handover {
            return self.entry(reply, target.map(|a| (a, Duration::ZERO)));
        }
        self.entry(
            reply,
            r.and_then(|_| self.lookup_for_kernel(parent.0, name.as_bytes())),
        );
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.nodes.forgot(ino.0, nlookup);
        self.client.kernel_forgot(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _timed = self.client.timed(Call::Getattr);
        let _kernel = self.client.kernel_gate();
        match self.attrs_for_kernel(ino.0) {
            Ok((a, ttl)) => reply.attr(&ttl, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _timed = self.client.timed(Call::Setattr);
        let _kernel = self.client.kernel_gate();
        let req_of = req;
        let req = SetAttrReq {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
        };
        let checked = self.may_setattr_current(req_of, ino.0, &req, fh.is_some());
        let r = checked
            .and_then(|req| self.read_for_kernel(ino.0, || self.client.setattr(ino.0, &req)));
        match r {
            Ok((a, ttl)) => {
                self.nodes.saw(&a);
                reply.attr(&ttl, &file_attr(&a))
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _timed = self.client.timed(Call::Readlink);
        match (self.current(ino.0)).and_then(|_| self.client.readlink_ino(ino.0)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _timed = self.client.timed(Call::Mknod);
        let _kernel = self.client.kernel_gate();
        let r = node_type(mode).and_then(|t| {
            self.may_add(req, parent.0)?;
            let node = owner(req, t, mode, rdev);
            self.change_for_kernel(&[parent.0], || {
                self.client.create_at(parent.0, name.as_bytes(), node, None)
            })
        });
        self.entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let _timed = self.client.timed(Call::Mkdir);
        let _kernel = self.client.kernel_gate();
        let node = owner(req, FileType::Directory, mode, 0);
        self.entry(
            reply,
            self.may_add(req, parent.0).and_then(|_| {
                self.change_for_kernel(&[parent.0], || {
                    self.client.create_at(parent.0, name.as_bytes(), node, None)
                })
            }),
        );
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timed = self.client.timed(Call::Unlink);
        let name = name.as_bytes();
        empty(
            reply,
            self.may_delete(req, parent.0, name)
                .and_then(|_| self.client.unlink_at(parent.0, name)),
        );
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timed = self.client.timed(Call::Rmdir);
        let name = name.as_bytes();
        empty(
            reply,
            self.may_delete(req, parent.0, name)
                .and_then(|_| self.client.rmdir_at(parent.0, name)),
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _timed = self.client.timed(Call::Symlink);
        let _kernel = self.client.kernel_gate();
        let node = owner(req, FileType::Symlink, 0o777, 0);
        let t = target.as_os_str().as_bytes();
        self.entry(
            reply,
            self.may_add(req, parent.0).and_then(|_| {
                self.change_for_kernel(&[parent.0], || {
                    self.client
                        .create_at(parent.0, link_name.as_bytes(), node, Some(t))
                })
            }),
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _timed = self.client.timed(Call::Rename);
        let mode = if flags == RenameFlags::RENAME_NOREPLACE {
            RenameMode::NoReplace
        } else if flags == RenameFlags::RENAME_EXCHANGE {
            RenameMode::Exchange
        } else if flags.is_empty() {
            RenameMode::Replace
        } else {
            // RENAME_WHITEOUT is for overlay file systems; combinations are invalid.
            reply.error(Errno::EINVAL);
            return;
        };
        let (on, nn) = (name.as_bytes(), newname.as_bytes());
        empty(
            reply,
            self.may_rename(req, (parent.0, on), (newparent.0, nn), mode)
                .and_then(|_| self.client.rename_at(parent.0, on, newparent.0, nn, mode)),
        );
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _timed = self.client.timed(Call::Link);
        let _kernel = self.client.kernel_gate();
        self.entry(
            reply,
            (self.current(ino.0))
                .and_then(|_| self.may_add(req, newparent.0))
                .and_then(|_| {
                    self.change_for_kernel(&[newparent.0], || {
                        self.client.link_at(ino.0, newparent.0, newname.as_bytes())
                    })
                }),
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: KOpenFlags, reply: ReplyOpen) {
        let _timed = self.client.timed(Call::Open);
        let r = (self.may_current(req, ino.0, open_mask(flags.0)))
            .and_then(|_| self.client.open_ino(ino.0, open_flags(flags.0)));
        // The kernel may map the file and read pages in without a getattr: watched
        // from now until the last close (asked after the open table holds the file,
        // which keeps the MDS from ending the watch at a recall meanwhile; see
        // `orion_mds::callbacks`).
        if r.is_ok() {
            self.client.watch_open_file(ino.0, true);
        }
        match r {
            Ok(fd) => reply.opened(FileHandle(fd.0), fopen(self.data_cache)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: KOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _timed = self.client.timed(Call::Read);
        match self.client.pread(Fd(fh.0), offset, size as usize) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: KOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _timed = self.client.timed(Call::Write);
        // The writer lacks CAP_FSETID: its write drops the setid bits, as Linux does on
        // its own file systems (the kernel leaves that to FUSE ones). Checked before
        // (by the client's copy of the inode) and again after, by the copy the write
        // refreshed: bits another client set meanwhile go too.
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let killed = |r: FsResult<usize>| match kill {
            true => r.and_then(|n| self.client.kill_setid(ino.0).map(|_| n)),
            false => r,
        };
        let before = match kill {
            true => self.client.kill_setid(ino.0),
            false => Ok(()),
        };
        match killed(before.and_then(|_| self.client.pwrite(Fd(fh.0), offset, data))) {
            Ok(n) => {
                debug_assert!(n <= data.len(), "wrote {n} of {} bytes", data.len());
                reply.written(n as u32)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _timed = self.client.timed(Call::Flush);
        // A close(2): writes staged by optimistic persistence commit now (and a
        // failure to commit one is what close returns), and the POSIX locks the
        // closing owner holds on the file go (fcntl's rule: any close releases them).
        let committed = self.client.flush(Fd(fh.0));
        let had_locks = self
            .locked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&ino.0);
        let unlocked = if had_locks {
            self.client.release_locks(ino.0, lock_owner.0)
        } else {
            Ok(())
        };
        empty(reply, committed.and(unlocked));
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: KOpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _timed = self.client.timed(Call::Release);
        // The kernel names an owner here when the file held flock locks.
        let released = match lock_owner {
            Some(o) => self.client.release_locks(ino.0, o.0),
            None => Ok(()),
        };
        empty(reply, released.and(self.client.close(Fd(fh.0))));
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let _timed = self.client.timed(Call::Lock);
        let r =
            lock_req(ino, lock_owner, start, end, typ, pid).and_then(|l| self.client.test_lock(l));
        match r {
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Ok(Some(c)) => {
                let typ = match c.kind {
                    LockKind::Read => libc::F_RDLCK,
                    _ => libc::F_WRLCK,
                };
                reply.locked(c.start, c.end, typ, c.pid)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let _timed = self.client.timed(Call::Lock);
        let l = match lock_req(ino, lock_owner, start, end, typ, pid) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(e)),
        };
        if l.kind != LockKind::Unlock {
            self.locked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(l.ino);
        }
        match self.client.set_lock(l, false, || true) {
            Err(FsError::Errno(libc::EAGAIN)) if sleep => {
                // Waiting here would hold a request thread, while the unlock that ends
                // the wait (a close, another owner's F_UNLCK) may need one: wait on a
                // thread of its own, and answer from there. A waiter that gets a
                // signal stops waiting (the kernel's interrupt does not reach this
                // library, and a killed waiter cannot exit before it has an answer).
                let client = self.client.clone();
                let waiter = req.pid();
                let spawned =
                    std::thread::Builder::new()
                        .name("lock-wait".into())
                        .spawn(move || {
                            empty(reply, client.set_lock(l, true, || !signal_pending(waiter)));
                        });
                if let Err(e) = spawned {
                    // The reply went with the closure: the kernel gets EIO for it.
                    tracing::warn!("cannot start a lock waiter: {e}");
                }
            }
            r => empty(reply, r),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _timed = self.client.timed(Call::Fsync);
        empty(reply, self.client.fsync(Fd(fh.0)));
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: KOpenFlags, reply: ReplyOpen) {
        let _timed = self.client.timed(Call::Opendir);
        // Opened as a descriptor of the client: the directory is then held, and a
        // removal elsewhere leaves it for `fstat` (link count 0) until the release.
        let r = (self.may_current(req, ino.0, perm::MAY_READ))
            .and_then(|_| self.client.open_ino(ino.0, OpenFlags::read()))
            .map(|fd| {
                debug_assert_ne!(
                    fd.0, REMOVED_DIR,
                    "a descriptor has the removed dir's handle"
                );
                self.listings.open(fd.0);
                fd.0
            });
        match r.or_else(|e| self.open_removed_dir(req, ino.0, e)) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _timed = self.client.timed(Call::Readdir);
        if fh.0 == REMOVED_DIR {
            return reply.ok();
        }
        let add = |next: u64, e: &DirEntry| {
            let name = OsStr::from_bytes(&e.name);
            reply.add(INodeNo(e.ino), next, kind(e.ftype), name)
        };
        match self
            .listings
            .read(fh.0, offset, || self.client.readdir_ino(ino.0), add)
        {
            Ok(true) => reply.ok(),
            Ok(false) => reply.error(Errno::EBADF),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: KOpenFlags,
        reply: ReplyEmpty,
    ) {
        let _timed = self.client.timed(Call::Release);
        if fh.0 == REMOVED_DIR {
            return reply.ok();
        }
        self.listings.release(fh.0);
        empty(reply, self.client.close(Fd(fh.0)));
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _timed = self.client.timed(Call::Fsync);
        // Namespace changes are durable at the MDS when their call returns.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _timed = self.client.timed(Call::Statfs);
        match self.client.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bfree, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _timed = self.client.timed(Call::Access);
        // F_OK asks only whether the inode exists.
        let mask = (mask.bits() as u32) & (perm::MAY_READ | perm::MAY_WRITE | perm::MAY_EXEC);
        let r = self
            .client
            .getattr(ino.0)
            .and_then(|a| self.same_as_kernel(&a).map(|_| a))
            .and_then(|a| with_cred(req, |c| perm::check(&a, c, mask)));
        empty(reply, r);
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        let _timed = self.client.timed(Call::Xattr);
        let name = name.as_bytes();
        let r = (|| {
            if position != 0 {
                return Err(FsError::Errno(libc::EINVAL));
            }
            let mode = SetMode::from_flags(flags)?;
            self.may_xattr(req, ino.0, name, true)?;
            self.client.setxattr_ino(ino.0, name, value, mode)
        })();
        empty(reply, r);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _timed = self.client.timed(Call::Xattr);
        let name = name.as_bytes();
        let r = self
            .may_xattr(req, ino.0, name, false)
            .and_then(|_| self.client.getxattr_ino(ino.0, name));
        xattr_reply(reply, size, self.xattrs_or_removed(ino.0, r, false));
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _timed = self.client.timed(Call::Xattr);
        let r =
            (self.current(ino.0)).and_then(|_| self.client.listxattr_ino(ino.0, req.uid() == 0));
        xattr_reply(reply, size, self.xattrs_or_removed(ino.0, r, true));
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timed = self.client.timed(Call::Xattr);
        let name = name.as_bytes();
        let r = self
            .may_xattr(req, ino.0, name, true)
            .and_then(|_| self.client.removexattr_ino(ino.0, name));
        empty(reply, r);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _timed = self.client.timed(Call::Fallocate);
        // The kernel lets only a file opened for writing get here.
        empty(reply, self.client.fallocate(Fd(fh.0), mode, offset, length));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _timed = self.client.timed(Call::Create);
        let _kernel = self.client.kernel_gate();
        let r = node_type(mode).and_then(|t| {
            self.may_add(req, parent.0)?;
            let node = owner(req, t, mode, 0);
            let w = self.client.watch_for_kernel(&[]);
            let (a, made) = match self.client.create_at(parent.0, name.as_bytes(), node, None) {
                // Another client created it between the kernel's lookup and now.
                Err(FsError::Errno(libc::EEXIST)) if flags & libc::O_EXCL == 0 => {
                    let a = self.client.lookup(parent.0, name.as_bytes())?;
                    self.may(req, a.ino, open_mask(flags))?;
                    (a, false)
                }
                other => (other?, true),
            };
            // What this client made, the MDS watches for it (see `cache`); a file
            // found made by another is not watched: the kernel keeps nothing of it.
            if made {
                self.client.changed_for_kernel(w, &[parent.0, a.ino]);
            }
            let fd = self.client.open_ino(a.ino, open_flags(flags))?;
            if !made {
                // Open, so watched as an open's file is (the gate is held: no wait).
                self.client.watch_open_file(a.ino, false);
            }
            let a = self.client.getattr(a.ino)?;
            // Counted from now: nothing handed over outlives the lease.
            let ttl = match made {
                true => self.client.kernel_ttl(w),
                false => Duration::ZERO,
            };
            Ok((a, fd, ttl))
        });
        match r {
            Ok((a, fd, _)) if !self.nodes.told(&a) => {
                let _ = self.client.close(fd);
                reply.error(Errno::ESTALE)
            }
            Ok((a, fd, ttl)) => {
                reply.created(
                    &ttl,
                    &file_attr(&a),
                    Generation(a.generation),
                    FileHandle(fd.0),
                    fopen(self.data_cache),
                );
                self.client.kernel_looked_up(a.ino);
            }
            Err(e) => reply.error(errno(e)),
        }
    }
}
