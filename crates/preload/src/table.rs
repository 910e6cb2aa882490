//! The descriptors this library serves. Each is a real descriptor number, reserved
//! in the kernel by a duplicate of an `O_PATH` descriptor of the mount's root (so
//! `close`, `poll` and inheritance see a number in use, and a call this library does
//! not serve fails with EBADF rather than reading the wrong file). Descriptors made
//! by dup share one open file (its offset, its flags), as the kernel's do.
//!
//! A descriptor goes back to the kernel ("to kernel") when a call needs what only
//! the kernel has (mmap, ioctl, stdio, fork, exec): the file is opened through the
//! mount, moved onto the same numbers with dup3, and set to the same offset. A file
//! whose name is gone since it was opened (removed, renamed) is opened through a
//! name of its own made for that moment (`open_through_mount`).
//!
//! A directory opened without O_DIRECTORY (SQLite's, to fsync it after it creates
//! or deletes its journal) is served too, for the calls that need nothing more than
//! its inode: fstat, fsync, dup, fcntl, close. Every other call on it (a relative
//! `*at` path, fchdir, getdents, fdopendir, ...) sends it to the kernel first
//! (`hooks::served`): a kernel directory through the mount costs a FUSE open, an
//! fsync and a release, ~150 µs of a SQLite transaction here.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use libc::{c_int, O_ACCMODE, O_APPEND, O_CLOEXEC, O_CREAT, O_EXCL, O_TRUNC};
use orion_client::{Client, Fd};

use crate::real;
use crate::state::say;

/// An open file this library serves.
pub struct OpenFile {
    pub client: &'static Client,
    pub fd: Fd,
    pub ino: u64,
    /// The host path it was opened at (reopened through the mount to go to kernel).
    pub path: CString,
    /// Its open(2) flags (access mode, O_APPEND, O_SYNC, ...).
    pub flags: c_int,
    /// A directory: served only for the calls that need nothing but its inode.
    pub dir: bool,
    /// An OFD lock or flock was taken through it (its last close releases them).
    pub locked: AtomicBool,
    /// Descriptors that share it: with the last one closed, so is the file (a call
    /// still running on it in another thread then meets EBADF).
    pub descriptors: AtomicUsize,
    /// Held by a read, write or seek at the file offset, so that two threads sharing
    /// the offset do not both use it (Linux's f_pos_lock).
    pub offset: std::sync::Mutex<()>,
}

impl OpenFile {
    /// Writes must be durable before they return (O_SYNC, O_DSYNC).
    pub fn sync(&self) -> bool {
        self.flags & (libc::O_SYNC | libc::O_DSYNC) != 0
    }
}

#[derive(Clone)]
struct Slot {
    file: Arc<OpenFile>,
    cloexec: bool,
}

static TABLE: RwLock<Option<HashMap<c_int, Slot>>> = RwLock::new(None);
/// Descriptors in the table: when 0 (most calls of most programs), no lock is taken.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Whether this library serves descriptor `fd`.
pub fn is_ours(fd: c_int) -> bool {
    get(fd).is_some()
}

/// The open file behind `fd`, if this library serves it.
pub fn get(fd: c_int) -> Option<Arc<OpenFile>> {
    if fd < 0 || COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    let t = TABLE.read().unwrap_or_else(|e| e.into_inner());
    t.as_ref()?.get(&fd).map(|s| s.file.clone())
}

/// An O_PATH descriptor of /dev/null, opened once: what reserved numbers duplicate.
/// Not a directory, so a `*at` call the library does not see fails with ENOTDIR
/// rather than resolving from somewhere; reads and writes it does not see fail with
/// EBADF.
fn anchor() -> Option<c_int> {
    static ANCHOR: OnceLock<Option<c_int>> = OnceLock::new();
    *ANCHOR.get_or_init(|| {
        // SAFETY: open(2) of a NUL-terminated path.
        let fd = unsafe { real::open(c"/dev/null".as_ptr(), libc::O_PATH | O_CLOEXEC, 0) };
        (fd >= 0).then(|| crate::state::relocate(fd))
    })
}

/// Reserves the lowest free descriptor number at or above `min`.
fn reserve(min: c_int, cloexec: bool) -> Result<c_int, c_int> {
    let a = anchor().ok_or(libc::EIO)?;
    let cmd = if cloexec {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    // SAFETY: fcntl F_DUPFD on a descriptor we own.
    let fd = unsafe { real::fcntl(a, cmd, min as libc::c_long) };
    if fd < 0 {
        return Err(errno());
    }
    Ok(fd)
}

/// Serves `file` at a new descriptor (the lowest free number, as open(2) gives).
pub fn insert(file: OpenFile) -> Result<c_int, c_int> {
    let cloexec = file.flags & O_CLOEXEC != 0;
    let fd = match reserve(0, cloexec) {
        Ok(fd) => fd,
        Err(e) => {
            let _ = file.client.close(file.fd);
            return Err(e);
        }
    };
    put_checked(fd, Arc::new(file), cloexec)
}

/// Puts `file` on `fd`; a standard stream goes to the kernel at once (if it cannot,
/// the descriptor is closed and the error returned).
fn put_checked(fd: c_int, file: Arc<OpenFile>, cloexec: bool) -> Result<c_int, c_int> {
    put(fd, file, cloexec);
    if let Err(e) = standard_stream(fd) {
        let _ = close(fd);
        return Err(e);
    }
    Ok(fd)
}

/// Descriptors 0, 1 and 2 are always the kernel's: stdio reads and writes them
/// with the C library's internal calls, which this library cannot see (`ls >
/// file` in a shell, a program that closed its stdout and opened a file).
fn standard_stream(fd: c_int) -> Result<(), c_int> {
    match fd {
        0..=2 => to_kernel(fd),
        _ => Ok(()),
    }
}

fn put(fd: c_int, file: Arc<OpenFile>, cloexec: bool) {
    file.descriptors.fetch_add(1, Ordering::AcqRel);
    let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
    let map = t.get_or_insert_with(HashMap::new);
    let old = map.insert(fd, Slot { file, cloexec });
    if old.is_none() {
        COUNT.fetch_add(1, Ordering::AcqRel);
    }
    debug_assert!(old.is_none(), "descriptor {fd} was served twice");
    // Both change under the write lock only: the count is the table's.
    debug_assert_eq!(
        COUNT.load(Ordering::Relaxed),
        map.len(),
        "descriptor count drifted"
    );
}

/// Stops serving `fd` (its number stays reserved: the caller closes or replaces
/// it); with its last descriptor, the file is closed in the client (reporting a
/// write that failed to commit, as close(2) does). Locks go as a close makes them go.
/// `None`: not ours.
fn take(fd: c_int) -> Option<Result<(), c_int>> {
    let file = {
        let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
        let map = t.as_mut()?;
        let slot = map.remove(&fd)?;
        let was = COUNT.fetch_sub(1, Ordering::AcqRel);
        debug_assert_eq!(was, map.len() + 1, "descriptor count drifted");
        slot.file
    };
    let was = file.descriptors.fetch_sub(1, Ordering::AcqRel);
    // Each descriptor counted itself in when it was put in the table.
    debug_assert!(was > 0, "descriptor {fd} of an open file counting none");
    let last = was == 1;
    crate::hooks::locks_closed(&file, last);
    Some(match last {
        true => file.client.close(file.fd).map_err(|e| e.errno()),
        false => Ok(()),
    })
}

/// close(2) of a descriptor this library serves. `None`: not ours.
pub fn close(fd: c_int) -> Option<Result<(), c_int>> {
    let r = take(fd)?;
    // SAFETY: close(2) of the reserved number.
    unsafe { real::close(fd) };
    Some(r)
}

/// dup(2), fcntl(F_DUPFD): the same open file at the lowest free number ≥ `min`.
pub fn dup(fd: c_int, min: c_int, cloexec: bool) -> Option<Result<c_int, c_int>> {
    let file = get(fd)?;
    Some(reserve(min, cloexec).and_then(|new| put_checked(new, file, cloexec)))
}

/// dup2(2)/dup3(2) onto `new`: whatever `new` was (ours or not) is closed, as the
/// kernel does, once the kernel took the new number (a bad `old` leaves `new` be).
pub fn dup_onto(old: c_int, new: c_int, cloexec: bool) -> Result<c_int, c_int> {
    let file = get(old);
    let flags = if cloexec { O_CLOEXEC } else { 0 };
    // SAFETY: dup3 of descriptor numbers; the kernel checks them.
    if unsafe { real::dup3(old, new, flags) } < 0 {
        return Err(errno());
    }
    let _ = take(new);
    match file {
        Some(file) => put_checked(new, file, cloexec),
        None => Ok(new),
    }
}

/// In a child after fork: every descriptor still served belongs to the parent's
/// client (one that could not go to the kernel before the fork, or was opened by
/// another thread meanwhile). The child forgets them without a word to that client
/// (its connections are the parent's); their numbers stay reserved and fail with
/// EBADF.
pub fn forget_all() {
    let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
    if let Some(t) = t.as_mut() {
        for (_, s) in t.drain() {
            std::mem::forget(s.file);
        }
    }
    COUNT.store(0, Ordering::Release);
}

/// Sets the close-on-exec flag that `fd` carries here (the kernel's is set too).
pub fn set_cloexec(fd: c_int, cloexec: bool) {
    let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = t.as_mut().and_then(|t| t.get_mut(&fd)) {
        s.cloexec = cloexec;
    }
}

/// Opens `path` with `flags`: a kernel descriptor of inode `ino`, or an error
/// (ESTALE: the path leads to another file now).
fn open_inode(path: &CString, flags: c_int, ino: u64) -> Result<c_int, c_int> {
    // SAFETY: open(2) of a NUL-terminated path.
    let k = unsafe { real::open(path.as_ptr(), flags, 0) };
    if k < 0 {
        return Err(errno());
    }
    let mut st = std::mem::MaybeUninit::<libc::stat64>::uninit();
    // SAFETY: fstat into a buffer of the right type.
    let same = unsafe { real::fstat64(k, st.as_mut_ptr()) } == 0
        // SAFETY: fstat succeeded, so it filled the buffer.
        && unsafe { st.assume_init() }.st_ino == ino;
    if !same {
        // SAFETY: close(2) of the descriptor we opened.
        unsafe { real::close(k) };
        return Err(libc::ESTALE);
    }
    Ok(k)
}

/// Opens `file` through the mount: by the path it was opened at, or, when that no
/// longer leads to it (its name was removed or renamed since), by its hand-over
/// name, which the mount answers with the inode itself (`Client::handover_name`);
/// the kernel's file then lives on in the mount's open table as any open file
/// outlives its names. A directory is opened where it is now (`Client::dir_path`):
/// the kernel gives a directory one name only.
fn open_through_mount(file: &OpenFile, flags: c_int) -> Result<c_int, c_int> {
    let err = match open_inode(&file.path, flags, file.ino) {
        Ok(k) => return Ok(k),
        Err(e) => e,
    };
    if !matches!(
        err,
        libc::ENOENT | libc::ESTALE | libc::ENOTDIR | libc::EISDIR
    ) {
        return Err(err);
    }
    let mount = crate::state::settings().map_or("", |s| s.mount.as_str());
    let at = |p: &[u8]| CString::new([mount.as_bytes(), p].concat()).map_err(|_| libc::EINVAL);
    let now = match file.dir {
        true => file.client.dir_path(file.ino),
        false => file
            .client
            .handover_name(file.fd)
            .map(|n| [b"/".as_slice(), &n].concat()),
    };
    open_inode(&at(&now.map_err(|e| e.errno())?)?, flags, file.ino)
}

/// Opens `file` through the mount and puts that kernel file on `fds` (all of which
/// share it), at its current offset. Changes nothing of this library's state.
fn reopen_onto(file: &OpenFile, fds: &[(c_int, bool)]) -> Result<(), c_int> {
    let pos = file.client.position(file.fd).map_err(|e| e.errno())?;
    let flags = file.flags & !(O_CREAT | O_EXCL | O_TRUNC | O_CLOEXEC);
    let k = open_through_mount(file, flags)?;
    let mut r = Ok(());
    for &(fd, cloexec) in fds {
        if r.is_err() {
            break;
        }
        let fl = if cloexec { O_CLOEXEC } else { 0 };
        // SAFETY: dup3 of a descriptor we opened onto a number we reserved.
        if unsafe { real::dup3(k, fd, fl) } < 0 {
            r = Err(errno());
        }
    }
    if r.is_ok() && file.flags & O_APPEND == 0 {
        // SAFETY: lseek of the descriptor we opened (the dups share its offset).
        unsafe { real::lseek64(k, pos as i64, libc::SEEK_SET) };
    }
    // SAFETY: close(2) of the descriptor we opened (the dups stay).
    unsafe { real::close(k) };
    r
}

/// Hands `fd` to the kernel if it is a served directory (the call that follows
/// needs its kernel descriptor).
pub fn dir_to_kernel(fd: c_int) {
    if get(fd).is_some_and(|f| f.dir) {
        hand_over(fd);
    }
}

/// [`to_kernel`], for a call that needs a kernel descriptor next: a failure is said
/// (the call then meets the reserved number's EBADF or ENOTDIR).
pub fn hand_over(fd: c_int) {
    if let Err(e) = to_kernel(fd) {
        say(&format!(
            "descriptor {fd} could not go to the kernel: errno {e}"
        ));
    }
}

/// Hands the open file behind `fd` (every descriptor of it) to the kernel, for
/// good: from now on the C library serves them. Writes staged for it commit first.
pub fn to_kernel(fd: c_int) -> Result<(), c_int> {
    let Some(file) = get(fd) else {
        return Ok(());
    };
    file.client.flush(file.fd).map_err(|e| e.errno())?;
    let fds: Vec<(c_int, bool)> = {
        let t = TABLE.read().unwrap_or_else(|e| e.into_inner());
        (t.iter().flatten())
            .filter(|(_, s)| Arc::ptr_eq(&s.file, &file))
            .map(|(&n, s)| (n, s.cloexec))
            .collect()
    };
    reopen_onto(&file, &fds)?;
    crate::state::HANDED.fetch_add(1, Ordering::Relaxed);
    drop(file);
    for (n, _) in fds {
        let _ = take(n);
    }
    Ok(())
}

/// The served descriptors from `first` to `last`.
pub fn in_range(first: c_int, last: c_int) -> Vec<c_int> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return Vec::new();
    }
    let t = TABLE.read().unwrap_or_else(|e| e.into_inner());
    let mut fds: Vec<c_int> = t.iter().flatten().map(|(&n, _)| n).collect();
    fds.retain(|&n| (first..=last).contains(&n));
    fds
}

/// Hands every served descriptor to the kernel (before fork: parent and child then
/// share the kernel's open files and offsets, as POSIX wants).
pub fn all_to_kernel() {
    let fds: Vec<c_int> = {
        let t = TABLE.read().unwrap_or_else(|e| e.into_inner());
        t.iter().flatten().map(|(&n, _)| n).collect()
    };
    for fd in fds {
        hand_over(fd);
    }
}

/// Before exec: staged writes commit, and every descriptor that survives exec (no
/// close-on-exec) becomes the kernel's, so the new program reads and writes the same
/// files. The table stays as it is (an exec that fails goes on with it).
pub fn prepare_exec() {
    let t = TABLE.read().unwrap_or_else(|e| e.into_inner());
    let Some(t) = t.as_ref() else {
        return;
    };
    // Writes staged by an optimistic client commit first: no exit handler runs after
    // a successful exec.
    for s in t.values() {
        if let Err(e) = s.file.client.flush(s.file.fd) {
            say(&format!(
                "{}: a write failed to commit before exec: {e}",
                s.file.path.to_string_lossy()
            ));
        }
    }
    let mut done: Vec<*const OpenFile> = Vec::new();
    for s in t.values().filter(|s| !s.cloexec) {
        let key = Arc::as_ptr(&s.file);
        if done.contains(&key) {
            continue;
        }
        done.push(key);
        let fds: Vec<(c_int, bool)> = (t.iter())
            .filter(|(_, o)| !o.cloexec && Arc::ptr_eq(&o.file, &s.file))
            .map(|(&n, _)| (n, false))
            .collect();
        if let Err(e) = reopen_onto(&s.file, &fds) {
            say(&format!(
                "{} could not pass to the new program: errno {e}",
                s.file.path.to_string_lossy()
            ));
        }
    }
}

/// Closes every served file in the client (at exit: writes staged with optimistic
/// persistence commit).
pub fn close_all() {
    let fds: Vec<c_int> = {
        let t = TABLE.read().unwrap_or_else(|e| e.into_inner());
        t.iter().flatten().map(|(&n, _)| n).collect()
    };
    for fd in fds {
        let _ = close(fd);
    }
}

/// The access mode allows reading / writing.
pub fn readable(flags: c_int) -> bool {
    flags & O_ACCMODE != libc::O_WRONLY
}

pub fn writable(flags: c_int) -> bool {
    flags & O_ACCMODE != libc::O_RDONLY
}

pub fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}
