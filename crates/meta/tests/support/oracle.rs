//! The oracle: the same operations through real system calls on a tmpfs directory.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::{
    pattern, sorted_names, target, unlinked_use, xattr_pairs, xname, Node, Op, Outcome, Snapshot, P,
};

/// A tmpfs directory for the oracle, removed when dropped even after the operations
/// took the caller's write or search permission from directories in it (an
/// unprivileged run could not remove those, and left them in /dev/shm).
pub struct OracleDir(pub tempfile::TempDir);

impl OracleDir {
    pub fn new() -> OracleDir {
        OracleDir(tempfile::tempdir_in("/dev/shm").unwrap())
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for OracleDir {
    fn drop(&mut self) {
        fn open_up(p: &Path) {
            use std::os::unix::fs::PermissionsExt;
            let Ok(m) = std::fs::symlink_metadata(p) else {
                return;
            };
            if m.is_dir() {
                let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
                for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
                    open_up(&e.path());
                }
            }
        }
        open_up(self.0.path());
    }
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn rc(r: libc::c_int) -> Result<Outcome, i32> {
    if r == 0 {
        Ok(Outcome::Ok)
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    }
}

fn io<T>(r: std::io::Result<T>) -> Result<T, i32> {
    r.map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}

pub fn run_oracle(root: &Path, op: &Op) -> Outcome {
    let at = |p: &P| root.join(p.rel());
    let r: Result<Outcome, i32> = (|| match op {
        Op::Create(p, m) => {
            // SAFETY: a system call on a NUL-terminated path (or buffer) we own.
            let fd = unsafe {
                libc::open(
                    c(&at(p)).as_ptr(),
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                    *m,
                )
            };
            if fd < 0 {
                return rc(-1);
            }
            // SAFETY: a system call on a NUL-terminated path (or buffer) we own.
            unsafe { libc::close(fd) };
            Ok(Outcome::Ok)
        }
        // SAFETY: a system call on a NUL-terminated path (or buffer) we own.
        Op::Mkdir(p, m) => rc(unsafe { libc::mkdir(c(&at(p)).as_ptr(), *m) }),
        // SAFETY: a system call on a NUL-terminated path (or buffer) we own.
        Op::Unlink(p) => rc(unsafe { libc::unlink(c(&at(p)).as_ptr()) }),
        // SAFETY: a system call on a NUL-terminated path (or buffer) we own.
        Op::Rmdir(p) => rc(unsafe { libc::rmdir(c(&at(p)).as_ptr()) }),
        // SAFETY: a system call on a NUL-terminated path (or buffer) we own.
        Op::Rename(a, b) => rc(unsafe { libc::rename(c(&at(a)).as_ptr(), c(&at(b)).as_ptr()) }),
        // SAFETY: a system call on a NUL-terminated path (or buffer) we own.
        Op::Link(a, b) => rc(unsafe { libc::link(c(&at(a)).as_ptr(), c(&at(b)).as_ptr()) }),
        // SAFETY: a system call on a NUL-terminated path (or buffer) we own.
        Op::Symlink(t, p) => rc(unsafe {
            libc::symlink(
                CString::new(target(*t)).unwrap().as_ptr(),
                c(&at(p)).as_ptr(),
            )
        }),
        Op::Readlink(p) => {
            io(std::fs::read_link(at(p))).map(|t| Outcome::Data(t.as_os_str().as_bytes().to_vec()))
        }
        Op::Write(p, off, len, seed) => {
            let f = io(std::fs::OpenOptions::new().write(true).open(at(p)))?;
            let n = io(f.write_at(&pattern(*len, *seed), *off))?;
            Ok(Outcome::Data(n.to_le_bytes().to_vec()))
        }
        Op::Read(p, off, len) => {
            let f = io(std::fs::File::open(at(p)))?;
            let mut buf = vec![0u8; *len];
            let mut got = 0;
            while got < *len {
                let n = io(f.read_at(&mut buf[got..], off + got as u64))?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            buf.truncate(got);
            Ok(Outcome::Data(buf))
        }
        // SAFETY: a system call on a NUL-terminated path (or buffer) we own.
        Op::Truncate(p, s) => rc(unsafe { libc::truncate(c(&at(p)).as_ptr(), *s as i64) }),
        // SAFETY: a system call on a NUL-terminated path (or buffer) we own.
        Op::Chmod(p, m) => rc(unsafe { libc::chmod(c(&at(p)).as_ptr(), *m) }),
        // SAFETY: a system call on a NUL-terminated path (or buffer) we own.
        Op::Chown(p, u, g) => rc(unsafe { libc::chown(c(&at(p)).as_ptr(), *u, *g) }),
        Op::Utimens(p, a, m) => {
            let ts = [
                libc::timespec {
                    tv_sec: *a,
                    tv_nsec: 0,
                },
                libc::timespec {
                    tv_sec: *m,
                    tv_nsec: 0,
                },
            ];
            // SAFETY: a system call on a NUL-terminated path (or buffer) we own.
            rc(unsafe { libc::utimensat(libc::AT_FDCWD, c(&at(p)).as_ptr(), ts.as_ptr(), 0) })
        }
        Op::Fsync(p) => {
            let f = io(std::fs::File::open(at(p)))?;
            io(f.sync_all()).map(|_| Outcome::Ok)
        }
        // SAFETY: a system call on NUL-terminated paths we own.
        Op::Exchange(a, b) => rc(unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                c(&at(a)).as_ptr(),
                libc::AT_FDCWD,
                c(&at(b)).as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        }),
        Op::SetXattr(p, n, len, seed, flags) => {
            let v = pattern(*len, *seed);
            let name = CString::new(xname(*n)).unwrap();
            // SAFETY: a system call on NUL-terminated strings and a buffer we own.
            rc(unsafe {
                libc::setxattr(
                    c(&at(p)).as_ptr(),
                    name.as_ptr(),
                    v.as_ptr().cast(),
                    v.len(),
                    *flags,
                )
            })
        }
        Op::GetXattr(p, n) => getxattr(&at(p), &xname(*n), false).map(Outcome::Data),
        Op::RemoveXattr(p, n) => {
            let name = CString::new(xname(*n)).unwrap();
            // SAFETY: a system call on NUL-terminated strings we own.
            rc(unsafe { libc::removexattr(c(&at(p)).as_ptr(), name.as_ptr()) })
        }
        Op::ListXattr(p) => listxattr(&at(p), false).map(|l| Outcome::Data(sorted_names(&l))),
        Op::Fallocate(p, mode, off, len) => {
            let f = io(std::fs::OpenOptions::new().write(true).open(at(p)))?;
            // SAFETY: fallocate on a file descriptor we own.
            rc(unsafe {
                libc::fallocate(
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    *mode,
                    *off as i64,
                    *len as i64,
                )
            })
        }
        Op::UnlinkOpen(p, off, len, seed) => {
            let f = io(std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(at(p)))?;
            io(std::fs::remove_file(at(p)))?;
            let m = io(f.metadata())?;
            io(f.write_at(&pattern(*len, *seed), *off))?;
            let size = io(f.metadata())?.len();
            let mut data = vec![0u8; size as usize];
            io(f.read_exact_at(&mut data, 0))?;
            Ok(unlinked_use(m.nlink(), m.len(), size, &data))
        }
        Op::RenameOpen(from, p, off, len, seed) => {
            let f = io(std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(at(p)))?;
            io(std::fs::rename(at(from), at(p)))?;
            let m = io(f.metadata())?;
            io(f.write_at(&pattern(*len, *seed), *off))?;
            let size = io(f.metadata())?.len();
            let mut data = vec![0u8; size as usize];
            io(f.read_exact_at(&mut data, 0))?;
            Ok(unlinked_use(m.nlink(), m.len(), size, &data))
        }
    })();
    r.unwrap_or_else(Outcome::Err)
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

/// getxattr(2), or lgetxattr(2) when `nofollow`.
pub fn getxattr(p: &Path, name: &[u8], nofollow: bool) -> Result<Vec<u8>, i32> {
    let name = CString::new(name).unwrap();
    let mut buf = vec![0u8; 65536];
    let f = if nofollow {
        libc::lgetxattr
    } else {
        libc::getxattr
    };
    // SAFETY: a system call on NUL-terminated strings and a buffer we own.
    let n = unsafe {
        f(
            c(p).as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(last_errno());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// listxattr(2), or llistxattr(2) when `nofollow`.
pub fn listxattr(p: &Path, nofollow: bool) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; 65536];
    let f = if nofollow {
        libc::llistxattr
    } else {
        libc::listxattr
    };
    // SAFETY: a system call on a NUL-terminated path and a buffer we own.
    let n = unsafe { f(c(p).as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(last_errno());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

fn oracle_xattrs(p: &Path, kind: char) -> Vec<(Vec<u8>, Vec<u8>)> {
    if kind != 'f' && kind != 'd' {
        return Vec::new();
    }
    let list = listxattr(p, true).unwrap();
    xattr_pairs(&list, |n| getxattr(p, n, true).unwrap())
}

fn ns(sec: i64, nsec: i64) -> i64 {
    sec * 1_000_000_000 + nsec
}

/// The tree under `root` as the calling process sees it. A directory it may not
/// list, or whose entries it may not look at (an unprivileged run after a chmod that
/// took away the owner's read or search bit), shows what it may: no entries, or each
/// entry's name with kind '?' and nothing else.
pub fn oracle_snapshot(root: &Path) -> Snapshot {
    let mut out = BTreeMap::new();
    fn walk(dir: &Path, prefix: &str, out: &mut Snapshot) {
        let denied = |e: &std::io::Error| e.kind() == std::io::ErrorKind::PermissionDenied;
        let entries = match std::fs::read_dir(dir) {
            Err(e) if denied(&e) => return,
            r => r.unwrap(),
        };
        for e in entries {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let path = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let full: PathBuf = e.path();
            let md = match std::fs::symlink_metadata(&full) {
                Err(e) if denied(&e) => {
                    out.insert(path, unseen());
                    continue;
                }
                r => r.unwrap(),
            };
            let ft = md.file_type();
            let (kind, content) = if ft.is_dir() {
                ('d', vec![])
            } else if ft.is_symlink() {
                (
                    'l',
                    std::fs::read_link(&full)
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec(),
                )
            } else if ft.is_file() {
                ('f', std::fs::read(&full).unwrap())
            } else {
                ('o', vec![])
            };
            out.insert(
                path.clone(),
                Node {
                    kind,
                    perm: md.mode() & 0o7777,
                    uid: md.uid(),
                    gid: md.gid(),
                    nlink: md.nlink() as u32,
                    size: if kind == 'd' { 0 } else { md.size() },
                    xattrs: oracle_xattrs(&full, kind),
                    content,
                    mtime: ns(md.mtime(), md.mtime_nsec()),
                    ctime: ns(md.ctime(), md.ctime_nsec()),
                },
            );
            if kind == 'd' {
                walk(&full, &path, out);
            }
        }
    }
    walk(root, "", &mut out);
    let md = std::fs::symlink_metadata(root).unwrap();
    out.insert(
        ".".into(),
        Node {
            kind: 'd',
            perm: md.mode() & 0o7777,
            uid: md.uid(),
            gid: md.gid(),
            nlink: md.nlink() as u32,
            size: 0,
            content: vec![],
            xattrs: oracle_xattrs(root, 'd'),
            mtime: ns(md.mtime(), md.mtime_nsec()),
            ctime: ns(md.ctime(), md.ctime_nsec()),
        },
    );
    out
}

/// An entry whose attributes the caller may not see.
fn unseen() -> Node {
    Node {
        kind: '?',
        perm: 0,
        uid: 0,
        gid: 0,
        nlink: 0,
        size: 0,
        xattrs: Vec::new(),
        content: Vec::new(),
        mtime: 0,
        ctime: 0,
    }
}

/// Waits until the kernel's coarse clock (tmpfs timestamps) is past `t`, so the next
/// change gets a timestamp different from every earlier one.
pub fn wait_past(t: i64) {
    loop {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into the timespec we pass.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
        if ns(ts.tv_sec, ts.tv_nsec) > t {
            return;
        }
        std::thread::sleep(std::time::Duration::from_micros(300));
    }
}
