//! A null FUSE passthrough of a local directory, built on the same FUSE library and
//! with the same kernel settings as the Orion mount (no attribute or name caching,
//! direct I/O): the floor that FUSE itself sets on a machine, for the benchmarks. It
//! forwards each call to the underlying file system and keeps nothing else.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags as KOpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

const TTL: Duration = Duration::ZERO;

pub struct Passthrough {
    root: PathBuf,
    /// FUSE inode number (the underlying one; 1 for the root) → path.
    paths: Mutex<HashMap<u64, PathBuf>>,
    files: Mutex<HashMap<u64, Arc<File>>>,
    next_fh: AtomicU64,
}

fn err(e: std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn time(s: i64, ns: i64) -> SystemTime {
    if s >= 0 {
        UNIX_EPOCH + Duration::new(s as u64, ns as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(s.unsigned_abs()) + Duration::from_nanos(ns as u64)
    }
}

fn attr(ino: u64, md: &std::fs::Metadata) -> FileAttr {
    let ft = md.file_type();
    use std::os::unix::fs::FileTypeExt;
    let kind = if ft.is_dir() {
        fuser::FileType::Directory
    } else if ft.is_symlink() {
        fuser::FileType::Symlink
    } else if ft.is_fifo() {
        fuser::FileType::NamedPipe
    } else {
        fuser::FileType::RegularFile
    };
    FileAttr {
        ino: INodeNo(ino),
        size: md.size(),
        blocks: md.blocks(),
        atime: time(md.atime(), md.atime_nsec()),
        mtime: time(md.mtime(), md.mtime_nsec()),
        ctime: time(md.ctime(), md.ctime_nsec()),
        crtime: time(md.ctime(), md.ctime_nsec()),
        kind,
        perm: (md.mode() & 0o7777) as u16,
        nlink: md.nlink() as u32,
        uid: md.uid(),
        gid: md.gid(),
        rdev: md.rdev() as u32,
        blksize: 4096,
        flags: 0,
    }
}

impl Passthrough {
    pub fn new(root: &Path) -> Passthrough {
        let mut paths = HashMap::new();
        paths.insert(1, root.to_path_buf());
        Passthrough {
            root: root.to_path_buf(),
            paths: Mutex::new(paths),
            files: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        let paths = self.paths.lock().unwrap_or_else(|e| e.into_inner());
        paths.get(&ino.0).cloned().ok_or(Errno::ESTALE)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.path(parent)?.join(name))
    }

    /// Registers `path` and returns its attributes under its FUSE inode number.
    fn known(&self, path: PathBuf) -> Result<FileAttr, Errno> {
        let md = std::fs::symlink_metadata(&path).map_err(err)?;
        let ino = if path == self.root { 1 } else { md.ino() };
        let a = attr(ino, &md);
        self.paths
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ino, path);
        Ok(a)
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<File>, Errno> {
        let files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        files.get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn keep(&self, f: File) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let old = self
            .files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fh, Arc::new(f));
        debug_assert!(old.is_none(), "file handle {fh} handed out twice");
        FileHandle(fh)
    }
}

fn entry(reply: ReplyEntry, r: Result<FileAttr, Errno>) {
    match r {
        Ok(a) => reply.entry(&TTL, &a, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn options(flags: i32) -> OpenOptions {
    let acc = flags & libc::O_ACCMODE;
    let mut o = OpenOptions::new();
    o.read(acc != libc::O_WRONLY)
        .write(acc != libc::O_RDONLY)
        .custom_flags(flags & (libc::O_TRUNC | libc::O_APPEND));
    o
}

impl Filesystem for Passthrough {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(reply, self.child(parent, name).and_then(|p| self.known(p)));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.path(ino).and_then(|p| self.known(p)) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = (|| {
            let p = self.path(ino)?;
            if let Some(m) = mode {
                std::fs::set_permissions(&p, PermissionsExt::from_mode(m & 0o7777)).map_err(err)?;
            }
            if let Some(s) = size {
                OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .and_then(|f| f.set_len(s))
                    .map_err(err)?;
            }
            if let Some(TimeOrNow::Now) = mtime {
                let c = CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
                // SAFETY: a NUL-terminated path and a null times pointer (= now).
                if unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), std::ptr::null(), 0) } != 0
                {
                    return Err(err(std::io::Error::last_os_error()));
                }
            }
            self.known(p)
        })();
        match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.child(parent, name).and_then(|p| {
            std::fs::create_dir(&p).map_err(err)?;
            std::fs::set_permissions(&p, PermissionsExt::from_mode(mode & 0o7777)).map_err(err)?;
            self.known(p)
        });
        entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self
            .child(parent, name)
            .and_then(|p| std::fs::remove_file(p).map_err(err));
        empty(reply, r);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self
            .child(parent, name)
            .and_then(|p| std::fs::remove_dir(p).map_err(err));
        empty(reply, r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = (|| {
            let from = self.child(parent, name)?;
            let to = self.child(newparent, newname)?;
            std::fs::rename(&from, &to).map_err(err)?;
            self.known(to).map(|_| ())
        })();
        empty(reply, r);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: KOpenFlags, reply: ReplyOpen) {
        match self
            .path(ino)
            .and_then(|p| options(flags.0).open(p).map_err(err))
        {
            Ok(f) => reply.opened(self.keep(f), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = (|| {
            let p = self.child(parent, name)?;
            let mut o = options(flags);
            o.create(true).mode(mode & 0o7777);
            if flags & libc::O_EXCL != 0 {
                o.create_new(true);
            }
            let f = o.open(&p).map_err(err)?;
            Ok((self.known(p)?, f))
        })();
        match r {
            Ok((a, f)) => reply.created(
                &TTL,
                &a,
                Generation(0),
                self.keep(f),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(e),
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
        let r = self.file(fh).and_then(|f| {
            let mut buf = vec![0u8; size as usize];
            let mut got = 0;
            while got < buf.len() {
                match f.read_at(&mut buf[got..], offset + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) => return Err(err(e)),
                }
            }
            // A reply holds no more than the kernel asked for (a longer one is refused).
            debug_assert!(got <= buf.len(), "read {got} bytes of {size} asked");
            buf.truncate(got);
            Ok(buf)
        });
        match r {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
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
        match self
            .file(fh)
            .and_then(|f| f.write_all_at(data, offset).map_err(err))
        {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: KOpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.file(fh).and_then(|f| f.sync_all().map_err(err)));
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let list = match self
            .path(ino)
            .and_then(|p| std::fs::read_dir(p).map_err(err))
        {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let mut names: Vec<(u64, fuser::FileType, std::ffi::OsString)> = vec![
            (ino.0, fuser::FileType::Directory, ".".into()),
            (ino.0, fuser::FileType::Directory, "..".into()),
        ];
        for e in list.flatten() {
            let kind = match e.file_type() {
                Ok(t) if t.is_dir() => fuser::FileType::Directory,
                Ok(t) if t.is_symlink() => fuser::FileType::Symlink,
                _ => fuser::FileType::RegularFile,
            };
            names.push((e.ino(), kind, e.file_name()));
        }
        for (i, (ino, kind, name)) in names.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 4096, 255, 4096);
    }
}
