//! Translations between the kernel's types and the client library's: errors, times,
//! file types and attributes, open flags, lock requests and the caller's credentials.

use fuser::{
    Errno, FileAttr, FopenFlags, INodeNo, LockOwner, ReplyEmpty, ReplyXattr, Request, TimeOrNow,
};
use orion_client::perm::{self, Cred};
use orion_client::{
    Attr, FileType, FsError, FsResult, LockKind, LockReq, NewNode, OpenFlags, TimeSet,
};
use std::cell::OnceCell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) fn errno(e: FsError) -> Errno {
    match e {
        // An ENOSPC's resource the client logged.
        e if e.is_refusal() => Errno::from_i32(e.errno()),
        other => {
            tracing::warn!("{other}");
            Errno::EIO
        }
    }
}

pub(crate) fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

pub(crate) fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(match t.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_nanos().min(i64::MAX as u128) as i64,
            Err(e) => -(e.duration().as_nanos().min(i64::MAX as u128) as i64),
        }),
    }
}

pub(crate) fn kind(t: FileType) -> fuser::FileType {
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

pub(crate) fn file_attr(a: &Attr) -> FileAttr {
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
        blksize: orion_client::PAGE_SIZE as u32,
        flags: 0,
    }
}

/// The file type named by the S_IFMT bits of a mknod(2) mode.
pub(crate) fn node_type(mode: u32) -> FsResult<FileType> {
    Ok(match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => FileType::Regular,
        libc::S_IFIFO => FileType::Fifo,
        libc::S_IFCHR => FileType::CharDev,
        libc::S_IFBLK => FileType::BlockDev,
        libc::S_IFSOCK => FileType::Socket,
        _ => return Err(FsError::Errno(libc::EINVAL)),
    })
}

pub(crate) fn open_flags(f: i32) -> OpenFlags {
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

/// How the kernel treats an open file's data. By default every read and write
/// bypasses the page cache (direct I/O): another client may change the file at any
/// time, and each read must see it (paper §4.3). With the data cache (see `cache`)
/// the kernel keeps the pages across opens: callbacks drop them when another client
/// changes the file, and a lease that ran out leaves attributes that expire, whose
/// refresh drops them if the file changed (`FUSE_AUTO_INVAL_DATA`).
pub(crate) fn fopen(data_cache: bool) -> FopenFlags {
    match data_cache {
        true => FopenFlags::FOPEN_KEEP_CACHE,
        false => FopenFlags::FOPEN_DIRECT_IO,
    }
}

pub(crate) fn empty(reply: ReplyEmpty, r: FsResult<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

/// Whether thread `tid` has a signal pending that it does not block, or is gone: a
/// waiting lock then ends with EINTR.
pub(crate) fn signal_pending(tid: u32) -> bool {
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

pub(crate) fn lock_req(
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

/// The supplementary groups of process (or thread) `pid`, from /proc.
pub(crate) fn proc_groups(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Groups:")).map(|g| {
                g.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// Runs `f` with the caller's credentials. Supplementary groups are read from /proc
/// only if a check needs them (the caller is neither the owner nor in the primary
/// group).
pub(crate) fn with_cred<T>(req: &Request, f: impl FnOnce(&Cred) -> T) -> T {
    let groups: OnceCell<Vec<u32>> = OnceCell::new();
    let pid = req.pid();
    let in_group = |g: u32| groups.get_or_init(|| proc_groups(pid)).contains(&g);
    f(&Cred {
        uid: req.uid(),
        gid: req.gid(),
        in_group: &in_group,
    })
}

/// What opening with `flags` asks of the inode: MAY_EXEC for an execve, else read
/// and/or write by the access mode (and write for O_TRUNC).
pub(crate) fn open_mask(flags: i32) -> u32 {
    if flags & FMODE_EXEC != 0 {
        return perm::MAY_EXEC;
    }
    let f = open_flags(flags);
    let mut m = 0;
    if f.read {
        m |= perm::MAY_READ;
    }
    if f.write || f.truncate {
        m |= perm::MAY_WRITE;
    }
    m
}

/// The kernel's __FMODE_EXEC, passed in the open flags of an execve.
pub(crate) const FMODE_EXEC: i32 = 0x20;

pub(crate) fn owner(req: &Request, ftype: FileType, mode: u32, rdev: u32) -> NewNode {
    NewNode {
        ftype,
        mode: mode & 0o7777,
        uid: req.uid(),
        gid: req.gid(),
        rdev,
    }
}

/// Answers a getxattr/listxattr: the size when asked for it, else the bytes if they
/// fit the caller's buffer (ERANGE if not).
pub(crate) fn xattr_reply(reply: ReplyXattr, size: u32, r: FsResult<Vec<u8>>) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() <= size as usize => reply.data(&v),
        Ok(_) => reply.error(Errno::ERANGE),
        Err(e) => reply.error(errno(e)),
    }
}
