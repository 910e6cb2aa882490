//! Directory streams: `opendir` of a directory under the mount lists it through the
//! client, and the stream it returns is this library's own (a [`Stream`], never seen
//! by the C library): every call that takes a `DIR *` (readdir and its `_r` and `64`
//! forms, rewinddir, telldir, seekdir, dirfd, closedir) checks the registry of
//! streams first. Directory descriptors stay the kernel's (see `open_at`: fchdir and
//! *at calls need them), but `fdopendir` of one under the mount lists through the
//! client too, so programs that walk trees by descriptor (fts: find, du, rm -r)
//! list in-process, and so does `getdents64` on such a descriptor (`dents`).

use std::collections::HashSet;
use std::ffi::CString;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};

use libc::{c_char, c_int, c_long, dirent64, AT_FDCWD, DIR};
use orion_client::{perm, DirEntry, FileType};

use super::{as_caller, leaves, route, set_errno, with_caller, Route};
use crate::real;
use crate::state::{self, Inside};

/// A directory stream this library serves: the listing taken at opendir (or the
/// last rewinddir), and where the caller is in it.
struct Stream {
    ino: u64,
    /// The directory through the mount, for a descriptor (dirfd) when asked.
    path: CString,
    at: Mutex<Position>,
}

struct Position {
    entries: Vec<DirEntry>,
    next: usize,
    /// What the last readdir returned (valid until the next call on the stream).
    ent: Box<dirent64>,
    /// The kernel descriptor dirfd opened, or -1.
    fd: c_int,
}

/// The addresses of the live streams.
static STREAMS: RwLock<Option<HashSet<usize>>> = RwLock::new(None);
/// How many there are: when none, a `DIR *` is the C library's without a lock.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The stream behind `d` if it is this library's.
fn ours(d: *mut DIR) -> Option<&'static Stream> {
    if LIVE.load(Ordering::Acquire) == 0 || d.is_null() {
        return None;
    }
    let live = STREAMS.read().unwrap_or_else(|e| e.into_inner());
    let known = live.as_ref().is_some_and(|s| s.contains(&(d as usize)));
    // SAFETY: a registered address is a leaked Box<Stream>, freed only by closedir
    // after it leaves the registry (a stream used after its closedir is undefined
    // behaviour for the caller, as with the C library's).
    known.then(|| unsafe { &*(d as *const Stream) })
}

pub(super) fn d_type(t: FileType) -> u8 {
    match t {
        FileType::Regular => libc::DT_REG,
        FileType::Directory => libc::DT_DIR,
        FileType::Symlink => libc::DT_LNK,
        FileType::Fifo => libc::DT_FIFO,
        FileType::CharDev => libc::DT_CHR,
        FileType::BlockDev => libc::DT_BLK,
        FileType::Socket => libc::DT_SOCK,
    }
}

/// The next entry of `s` in its buffer, or `None` at the end.
fn next(s: &Stream) -> Option<*mut dirent64> {
    let mut at = s.at.lock().unwrap_or_else(|e| e.into_inner());
    let at = &mut *at;
    let e = at.entries.get(at.next)?;
    at.next += 1;
    let ent = &mut *at.ent;
    let n = e.name.len().min(ent.d_name.len() - 1);
    for (dst, &b) in ent.d_name.iter_mut().zip(&e.name[..n]) {
        *dst = b as c_char;
    }
    ent.d_name[n] = 0;
    ent.d_ino = e.ino;
    ent.d_off = at.next as i64;
    ent.d_type = d_type(e.ftype);
    // The record's length as the kernel gives it: the header, the name and its NUL,
    // rounded up to 8 bytes.
    let header = std::mem::offset_of!(dirent64, d_name);
    ent.d_reclen = ((header + n + 1).div_ceil(8) * 8) as u16;
    Some(ent as *mut dirent64)
}

#[no_mangle]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut DIR {
    // SAFETY: the caller's path.
    if let Route::Serve(c, p) = unsafe { route(AT_FDCWD, path, false) } {
        let _in = Inside::enter();
        // Not a directory comes before not readable, as the kernel checks.
        let found = as_caller(|cred| c.stat_as(&p, true, cred));
        let listed = found.and_then(|a| match a.ftype {
            FileType::Directory => with_caller(|cred| c.may(cred, a.ino, perm::MAY_READ))
                .and_then(|_| c.readdir_ino(a.ino))
                .map(|l| (a.ino, l)),
            _ => Err(orion_client::FsError::Errno(libc::ENOTDIR)),
        });
        let mount = state::settings().map_or("", |s| s.mount.as_str());
        match (listed, CString::new(format!("{mount}{p}"))) {
            (Ok((ino, entries)), Ok(path)) => return register(ino, path, entries, -1),
            (Err(e), _) if leaves(&e) => {}
            (Err(e), _) => {
                set_errno(e.errno());
                return std::ptr::null_mut();
            }
            (_, Err(_)) => {}
        }
    }
    // SAFETY: the caller's path, passed on.
    unsafe { real::opendir(path) }
}

/// A new stream of this library's over `entries` of directory `ino` (with `fd`, its
/// kernel descriptor, when it has one already).
fn register(ino: u64, path: CString, entries: Vec<DirEntry>, fd: c_int) -> *mut DIR {
    let s = Box::new(Stream {
        ino,
        path,
        at: Mutex::new(Position {
            entries,
            next: 0,
            // SAFETY: dirent64 is plain integers and bytes: all zeros is valid.
            ent: Box::new(unsafe { std::mem::zeroed() }),
            fd,
        }),
    });
    let d = Box::into_raw(s) as usize;
    let mut live = STREAMS.write().unwrap_or_else(|e| e.into_inner());
    live.get_or_insert_with(HashSet::new).insert(d);
    LIVE.fetch_add(1, Ordering::Release);
    d as *mut DIR
}

/// The inode of `fd` if it is a kernel descriptor (not O_PATH) of a directory of
/// the mount: Orion's own, not a file system mounted inside the mount.
pub(super) fn orion_dir(fd: c_int) -> Option<libc::stat64> {
    // A directory served in-process is listed through its kernel descriptor.
    if !Inside::now() {
        let _in = Inside::enter();
        crate::table::dir_to_kernel(fd);
    }
    // SAFETY: fcntl F_GETFL only reads the descriptor's flags.
    let flags = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    // SAFETY: stat64 is plain integers: all zeros is a valid value.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: fstat of the caller's descriptor into a struct we own.
    let dir = flags >= 0
        && flags & libc::O_PATH == 0
        && unsafe { real::fstat64(fd, &mut st) } == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFDIR
        && state::settings().is_some_and(|s| s.dev == st.st_dev);
    dir.then_some(st)
}

/// fdopendir of a kernel descriptor of a directory under the mount (fts opens
/// directories so, to walk trees: find, du, rm -r): listed through the client like
/// opendir, the stream taking the descriptor over (dirfd gives it, closedir closes
/// it). Anything else (not open, O_PATH, not a directory, not under the mount) is
/// the C library's to answer.
#[no_mangle]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut DIR {
    if let Some(st) = orion_dir(fd) {
        // SAFETY: a NUL-terminated path we own: the directory itself, by its fd.
        if let Route::Serve(c, p) = unsafe { route(fd, c".".as_ptr(), false) } {
            let _in = Inside::enter();
            let mount = state::settings().map_or("", |s| s.mount.as_str());
            let path = CString::new(format!("{mount}{}", p.trim_end_matches("/.")));
            // A directory gone since, or unreachable: the kernel's to answer.
            if let (Ok(entries), Ok(path)) = (c.readdir_ino(st.st_ino), path) {
                return register(st.st_ino, path, entries, fd);
            }
        }
    }
    // SAFETY: the caller's descriptor, passed on.
    unsafe { real::fdopendir(fd) }
}

#[no_mangle]
pub unsafe extern "C" fn closedir(d: *mut DIR) -> c_int {
    if ours(d).is_none() {
        // SAFETY: the caller's stream, the C library's.
        return unsafe { real::closedir(d) };
    }
    let mut live = STREAMS.write().unwrap_or_else(|e| e.into_inner());
    if !live.as_mut().is_some_and(|s| s.remove(&(d as usize))) {
        // Closed by another thread meanwhile.
        drop(live);
        set_errno(libc::EBADF);
        return -1;
    }
    LIVE.fetch_sub(1, Ordering::Release);
    drop(live);
    // SAFETY: the address was a leaked Box<Stream> and has left the registry: no
    // call can reach it any more.
    let s = unsafe { Box::from_raw(d as *mut Stream) };
    let fd = s.at.lock().unwrap_or_else(|e| e.into_inner()).fd;
    if fd >= 0 {
        super::dents::closed(fd);
        // SAFETY: the descriptor dirfd opened for this stream.
        unsafe { real::close(fd) };
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn readdir64(d: *mut DIR) -> *mut dirent64 {
    match ours(d) {
        // The end of the stream: null with errno untouched.
        Some(s) => next(s).unwrap_or(std::ptr::null_mut()),
        // SAFETY: the caller's stream, the C library's.
        None => unsafe { real::readdir64(d) },
    }
}

/// `struct dirent` is `struct dirent64` on 64-bit Linux.
#[no_mangle]
pub unsafe extern "C" fn readdir(d: *mut DIR) -> *mut dirent64 {
    // SAFETY: the caller's stream.
    unsafe { readdir64(d) }
}

#[no_mangle]
pub unsafe extern "C" fn readdir64_r(
    d: *mut DIR,
    entry: *mut dirent64,
    out: *mut *mut dirent64,
) -> c_int {
    let Some(s) = ours(d) else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real::readdir64_r(d, entry, out) };
    };
    if entry.is_null() || out.is_null() {
        return libc::EFAULT;
    }
    let got = match next(s) {
        Some(e) => {
            // The record's length only, as the C library copies: a caller may size
            // its entry for the name it can hold, not for a whole dirent64.
            // SAFETY: `e` is the stream's buffer (d_reclen <= its size); `entry` is
            // the caller's, at least d_reclen long for the name it receives.
            unsafe {
                let n = (*e).d_reclen as usize;
                std::ptr::copy_nonoverlapping(e.cast::<u8>(), entry.cast::<u8>(), n)
            };
            entry
        }
        None => std::ptr::null_mut(),
    };
    // SAFETY: the caller's result pointer.
    unsafe { *out = got };
    0
}

#[no_mangle]
pub unsafe extern "C" fn readdir_r(
    d: *mut DIR,
    entry: *mut dirent64,
    out: *mut *mut dirent64,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { readdir64_r(d, entry, out) }
}

/// Lists the directory again (POSIX: a rewind sees changes made since the open).
#[no_mangle]
pub unsafe extern "C" fn rewinddir(d: *mut DIR) {
    let Some(s) = ours(d) else {
        // SAFETY: the caller's stream, the C library's.
        return unsafe { real::rewinddir(d) };
    };
    let listed = {
        let _in = Inside::enter();
        state::client().map(|c| c.readdir_ino(s.ino))
    };
    let mut at = s.at.lock().unwrap_or_else(|e| e.into_inner());
    // A directory gone since is listed empty; one the client cannot reach now
    // keeps the listing it had.
    match listed {
        Some(Ok(entries)) => at.entries = entries,
        Some(Err(e)) if e.errno() == libc::ENOENT => at.entries.clear(),
        _ => {}
    }
    at.next = 0;
}

#[no_mangle]
pub unsafe extern "C" fn telldir(d: *mut DIR) -> c_long {
    match ours(d) {
        Some(s) => s.at.lock().unwrap_or_else(|e| e.into_inner()).next as c_long,
        // SAFETY: the caller's stream, the C library's.
        None => unsafe { real::telldir(d) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn seekdir(d: *mut DIR, pos: c_long) {
    match ours(d) {
        Some(s) => s.at.lock().unwrap_or_else(|e| e.into_inner()).next = pos.max(0) as usize,
        // SAFETY: the caller's stream, the C library's.
        None => unsafe { real::seekdir(d, pos) },
    }
}

/// A served stream's descriptor is the directory opened through the mount, on the
/// first call (a kernel descriptor, good for fstat, fchdir and *at calls).
#[no_mangle]
pub unsafe extern "C" fn dirfd(d: *mut DIR) -> c_int {
    let Some(s) = ours(d) else {
        // SAFETY: the caller's stream, the C library's.
        return unsafe { real::dirfd(d) };
    };
    let mut at = s.at.lock().unwrap_or_else(|e| e.into_inner());
    if at.fd < 0 {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
        // SAFETY: a NUL-terminated path we own.
        let fd = unsafe { real::openat(AT_FDCWD, s.path.as_ptr(), flags, 0) };
        if fd < 0 {
            return -1;
        }
        // The path names another directory if this one was renamed or removed since
        // opendir: *at calls through it would act there.
        // SAFETY: stat64 is plain integers: all zeros is a valid value.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        // SAFETY: fstat of the descriptor just opened, into a struct we own.
        if unsafe { real::fstat64(fd, &mut st) } != 0 || st.st_ino != s.ino {
            // SAFETY: the descriptor just opened.
            unsafe { real::close(fd) };
            set_errno(libc::ENOENT);
            return -1;
        }
        at.fd = fd;
    }
    at.fd
}
