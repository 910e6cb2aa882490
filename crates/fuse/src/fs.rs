//! The FUSE operations, each a thin translation to a client-library call: kernel
//! types in, `orion_client` calls, kernel replies out. Errors keep their errno; an
//! error without one (a broken connection, a damaged pool) is logged and becomes EIO.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags as KOpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use orion_client::{Client, DirEntry, Fd, OpenFlags};
use orion_format::FileType;
use orion_meta::{Attr, FsError, FsResult, NewNode, SetAttrReq, TimeSet};
use orion_proto::{LockKind, LockReq};

/// How long the kernel may trust an attribute or a name: not at all, since another
/// client may change it at any moment (Orion's consistency is strong; see the README).
const TTL: Duration = Duration::ZERO;

/// Largest read or write the kernel is asked to send in one request.
pub const MAX_IO: u32 = 1 << 20;

/// The mounted file system: one client, and the directory listings of open
/// directory handles (so that a listing read in several calls is one snapshot).
pub struct OrionFs {
    client: Arc<Client>,
    dirs: Mutex<HashMap<u64, Vec<DirEntry>>>,
    next_dir: AtomicU64,
    /// Inodes this mount ever asked to lock: only their closes need to drop locks at
    /// the MDS (a round trip every other close can skip).
    locked: Mutex<HashSet<u64>>,
}

impl OrionFs {
    pub fn new(client: Arc<Client>) -> OrionFs {
        OrionFs {
            client,
            dirs: Mutex::new(HashMap::new()),
            next_dir: AtomicU64::new(1),
            locked: Mutex::new(HashSet::new()),
        }
    }
}

fn errno(e: FsError) -> Errno {
    match e {
        FsError::Errno(n) => Errno::from_i32(n),
        other => {
            tracing::warn!("{other}");
            Errno::EIO
        }
    }
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(match t.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_nanos().min(i64::MAX as u128) as i64,
            Err(e) => -(e.duration().as_nanos().min(i64::MAX as u128) as i64),
        }),
    }
}

fn kind(t: FileType) -> fuser::FileType {
    match t {
        FileType::Regular => fuser::FileType::RegularFile,
        FileType::Directory => fuser::FileType::Directory,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::Fifo => fuser::FileType::NamedPipe,
        FileType::CharDev => fuser::FileType::CharDevice,
        FileType::BlockDev => fuser::FileType::BlockDevice,
        FileType::Socket => fuser::FileType::Socket,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.ctime),
        kind: kind(a.ftype),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: orion_format::PAGE_SIZE as u32,
        flags: 0,
    }
}

/// The file type named by the S_IFMT bits of a mknod(2) mode.
fn node_type(mode: u32) -> FsResult<FileType> {
    Ok(match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => FileType::Regular,
        libc::S_IFIFO => FileType::Fifo,
        libc::S_IFCHR => FileType::CharDev,
        libc::S_IFBLK => FileType::BlockDev,
        libc::S_IFSOCK => FileType::Socket,
        _ => return Err(FsError::Errno(libc::EINVAL)),
    })
}

fn open_flags(f: i32) -> OpenFlags {
    let acc = f & libc::O_ACCMODE;
    OpenFlags {
        read: acc == libc::O_RDONLY || acc == libc::O_RDWR,
        write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
        create: false,
        excl: false,
        truncate: f & libc::O_TRUNC != 0,
        append: f & libc::O_APPEND != 0,
    }
}

/// Every open file bypasses the kernel's page cache: another client may change the
/// file at any time, and each read must see it (paper §4.3).
fn fopen() -> FopenFlags {
    FopenFlags::FOPEN_DIRECT_IO
}

fn entry(reply: ReplyEntry, r: FsResult<Attr>) {
    match r {
        Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(0)),
        Err(e) => reply.error(errno(e)),
    }
}

fn empty(reply: ReplyEmpty, r: FsResult<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

/// Whether thread `tid` has a signal pending that it does not block, or is gone: a
/// waiting lock then ends with EINTR.
fn signal_pending(tid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return true;
    };
    let mask = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    (mask("SigPnd:") | mask("ShdPnd:")) & !mask("SigBlk:") != 0
}

fn lock_req(
    ino: INodeNo,
    owner: LockOwner,
    start: u64,
    end: u64,
    typ: i32,
    pid: u32,
) -> FsResult<LockReq> {
    let kind = match typ {
        libc::F_RDLCK => LockKind::Read,
        libc::F_WRLCK => LockKind::Write,
        libc::F_UNLCK => LockKind::Unlock,
        _ => return Err(FsError::Errno(libc::EINVAL)),
    };
    if end < start {
        return Err(FsError::Errno(libc::EINVAL));
    }
    Ok(LockReq {
        ino: ino.0,
        owner: owner.0,
        pid,
        start,
        end,
        kind,
    })
}

fn owner(req: &Request, ftype: FileType, mode: u32, rdev: u32) -> NewNode {
    NewNode {
        ftype,
        mode: mode & 0o7777,
        uid: req.uid(),
        gid: req.gid(),
        rdev,
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
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(reply, self.client.lookup(parent.0, name.as_bytes()));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.client.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let req = SetAttrReq {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
        };
        match self.client.setattr(ino.0, &req) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.client.readlink_ino(ino.0) {
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
        let r = node_type(mode).and_then(|t| {
            self.client
                .create_at(parent.0, name.as_bytes(), owner(req, t, mode, rdev), None)
        });
        entry(reply, r);
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
        let node = owner(req, FileType::Directory, mode, 0);
        entry(
            reply,
            self.client.create_at(parent.0, name.as_bytes(), node, None),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.client.unlink_at(parent.0, name.as_bytes()));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.client.rmdir_at(parent.0, name.as_bytes()));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let node = owner(req, FileType::Symlink, 0o777, 0);
        let t = target.as_os_str().as_bytes();
        entry(
            reply,
            self.client
                .create_at(parent.0, link_name.as_bytes(), node, Some(t)),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.intersects(!RenameFlags::RENAME_NOREPLACE) {
            // RENAME_EXCHANGE and RENAME_WHITEOUT are not supported yet.
            reply.error(Errno::EINVAL);
            return;
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        empty(
            reply,
            self.client.rename_at(
                parent.0,
                name.as_bytes(),
                newparent.0,
                newname.as_bytes(),
                noreplace,
            ),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        entry(
            reply,
            self.client.link_at(ino.0, newparent.0, newname.as_bytes()),
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: KOpenFlags, reply: ReplyOpen) {
        match self.client.open_ino(ino.0, open_flags(flags.0)) {
            Ok(fd) => reply.opened(FileHandle(fd.0), fopen()),
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
        match self.client.pread(Fd(fh.0), offset, size as usize) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: KOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.client.pwrite(Fd(fh.0), offset, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Every write is committed when it returns; what a close does here is drop
        // the POSIX locks the closing owner holds on the file (fcntl's rule: any close
        // releases them).
        let had_locks = self
            .locked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&ino.0);
        if had_locks {
            empty(reply, self.client.release_locks(ino.0, lock_owner.0));
        } else {
            reply.ok();
        }
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
        empty(reply, self.client.fsync(Fd(fh.0)));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: KOpenFlags, reply: ReplyOpen) {
        match self.client.readdir_ino(ino.0) {
            Ok(list) => {
                let fh = self.next_dir.fetch_add(1, Ordering::Relaxed);
                self.dirs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(fh, list);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let dirs = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
        let Some(list) = dirs.get(&fh.0) else {
            reply.error(Errno::EBADF);
            return;
        };
        // The offset of an entry is its position + 1: where the next call resumes.
        for (i, e) in list.iter().enumerate().skip(offset as usize) {
            let name = OsStr::from_bytes(&e.name);
            if reply.add(INodeNo(e.ino), i as u64 + 1, kind(e.ftype), name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: KOpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Namespace changes are durable at the MDS when their call returns.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.client.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bfree, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // The kernel checks the mode bits (default_permissions); what is left is
        // whether the inode still exists.
        empty(reply, self.client.getattr(ino.0).map(|_| ()));
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
        let r = node_type(mode).and_then(|t| {
            let node = owner(req, t, mode, 0);
            let a = match self.client.create_at(parent.0, name.as_bytes(), node, None) {
                // Another client created it between the kernel's lookup and now.
                Err(FsError::Errno(libc::EEXIST)) if flags & libc::O_EXCL == 0 => {
                    self.client.lookup(parent.0, name.as_bytes())?
                }
                other => other?,
            };
            let fd = self.client.open_ino(a.ino, open_flags(flags))?;
            let a = self.client.getattr(a.ino)?;
            Ok((a, fd))
        });
        match r {
            Ok((a, fd)) => reply.created(
                &TTL,
                &file_attr(&a),
                Generation(0),
                FileHandle(fd.0),
                fopen(),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }
}
