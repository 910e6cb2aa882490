//! Opening and closing: open(2) and its variants, creat, close, umask; and the
//! process calls that must see descriptors as the kernel's (fork, exec, spawn).

use std::ffi::CString;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

use libc::{c_char, c_int, c_uint, mode_t, AT_FDCWD, O_CREAT, O_DIRECTORY, O_PATH, O_TMPFILE};
use orion_client::{Client, FileType, FsError, OpenFlags};

use super::{as_caller, fail, judged, leaves, root, route, with_caller, Route};
use crate::real;
use crate::state::{self, Inside};
use crate::table::{self, OpenFile};

/// Opens `path` (relative to `dirfd`) as openat(2) does.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn open_at(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    setup();
    // SAFETY: the caller's arguments, passed on. The library's own files go high.
    let kernel = || match Inside::now() {
        true => state::relocate(unsafe { real::openat(dirfd, path, flags, mode) }),
        false => unsafe { real::openat(dirfd, path, flags, mode) },
    };
    // O_DIRECTORY (opendir, fts: listings and fchdir follow), O_PATH and O_TMPFILE
    // descriptors are the kernel's (through the mount).
    if flags & (O_DIRECTORY | O_PATH | O_TMPFILE) != 0 {
        return kernel();
    }
    // SAFETY: as the caller.
    let opened = match unsafe { route(dirfd, path, false) } {
        Route::Serve(c, p) => {
            let _in = Inside::enter();
            open_served(c, &p, flags, mode)
        }
        Route::NotDir => Err(libc::ENOTDIR),
        Route::Fd(_) | Route::Kernel => Ok(Opened::Kernel),
    };
    // Outside the library again: a kernel descriptor opened now is the program's, at
    // the lowest free number (not moved up among the library's own).
    match opened {
        Ok(Opened::Served(fd)) => fd,
        Ok(Opened::Kernel) => kernel(),
        Err(e) => fail(e),
    }
}

/// What a served open did.
enum Opened {
    /// Opened: this descriptor.
    Served(c_int),
    /// The kernel opens it: a FIFO or device, a path that leaves the file system,
    /// or one that is not the client's.
    Kernel,
}

/// Opens `p` (from the file system's root) through the client.
fn open_served(c: &'static Client, p: &str, flags: c_int, mode: mode_t) -> Result<Opened, c_int> {
    let fails = |e: FsError| match leaves(&e) {
        true => Ok(Opened::Kernel),
        false => Err(e.errno()),
    };
    // O_CREAT|O_EXCL follows no final symlink anyway, and says EEXIST of one.
    let excl = flags & (O_CREAT | libc::O_EXCL) == O_CREAT | libc::O_EXCL;
    if flags & libc::O_NOFOLLOW != 0 && !excl {
        // The directories on the way are searched before O_NOFOLLOW says ELOOP of
        // the last name (a missing name is the open's to answer).
        match as_caller(|cred| c.stat_as(p, false, cred)) {
            Ok(a) if a.ftype == FileType::Symlink => return Err(libc::ELOOP),
            Ok(_) | Err(FsError::Errno(libc::ENOENT)) => {}
            Err(e) => return fails(e),
        }
    }
    let of = OpenFlags {
        read: table::readable(flags),
        write: table::writable(flags),
        create: flags & O_CREAT != 0,
        excl: flags & libc::O_EXCL != 0 && flags & O_CREAT != 0,
        truncate: flags & libc::O_TRUNC != 0 && table::writable(flags),
        append: flags & libc::O_APPEND != 0,
    };
    // The open itself answers for a path that cannot be walked.
    let mode = match of.create {
        true => {
            with_caller(|cred| c.creation_mode(p, cred, mode & 0o7777)).unwrap_or(mode & 0o7777)
        }
        false => mode & 0o7777,
    };
    // Checked as the caller in the walk that finds or makes the file (root: no
    // check at all).
    let opened = with_caller(|cred| {
        let checked = (!cred.is_root()).then_some(cred);
        c.open_as(p, of, mode & !current_umask(), checked)
    });
    let fd = match judged(opened) {
        Ok(fd) => fd,
        Err(e) => return fails(e),
    };
    let a = match c.fstat(fd) {
        Ok(a) => a,
        Err(e) => {
            let _ = c.close(fd);
            return Err(e.errno());
        }
    };
    let dir = a.ftype == FileType::Directory;
    if a.ftype != FileType::Regular && !dir {
        let _ = c.close(fd);
        return Ok(Opened::Kernel);
    }
    // A truncation by a caller without CAP_FSETID drops the setid bits.
    if of.truncate && !root() {
        if let Err(e) = c.kill_setid(a.ino) {
            let _ = c.close(fd);
            return Err(e.errno());
        }
    }
    // Reopened through the mount by this path when the file goes to the kernel.
    let mount = state::settings().map_or("", |s| s.mount.as_str());
    let Ok(path) = CString::new(format!("{mount}{p}")) else {
        let _ = c.close(fd);
        return Err(libc::EINVAL);
    };
    let file = OpenFile {
        client: c,
        fd,
        ino: a.ino,
        path,
        flags,
        dir,
        locked: Default::default(),
        descriptors: Default::default(),
        offset: Default::default(),
    };
    table::insert(file).map(Opened::Served)
}

#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    unsafe { open_at(AT_FDCWD, path, flags, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    unsafe { open_at(AT_FDCWD, path, flags, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn openat(
    d: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    unsafe { open_at(d, path, flags, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn openat64(
    d: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    unsafe { open_at(d, path, flags, mode) }
}

/// _FORTIFY_SOURCE's open without a mode (no O_CREAT).
#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    unsafe { open_at(AT_FDCWD, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    unsafe { open_at(AT_FDCWD, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __openat_2(d: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    unsafe { open_at(d, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __openat64_2(d: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    unsafe { open_at(d, path, flags, 0) }
}

const CREAT: c_int = libc::O_WRONLY | O_CREAT | libc::O_TRUNC;

#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    unsafe { open_at(AT_FDCWD, path, CREAT, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    unsafe { open_at(AT_FDCWD, path, CREAT, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if !Inside::now() {
        let _in = Inside::enter();
        match table::close(fd) {
            Some(Ok(())) => return 0,
            Some(Err(e)) => return fail(e),
            None => super::dents::closed(fd),
        }
    }
    // SAFETY: the caller's descriptor, passed on.
    unsafe { real::close(fd) }
}

/// close_range and closefrom close whole ranges of numbers. Served descriptors in
/// the range close as close() closes them (or only get close-on-exec, with
/// CLOSE_RANGE_CLOEXEC). The library's own descriptors (the client's sockets and
/// rings, all at or above `own_floor`, near the open-file limit) stay open: the
/// program never knew them. A program's own descriptors up there stay open too.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if Inside::now() || first > last {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real::close_range(first, last, flags) };
    }
    let floor = state::own_floor() as c_uint;
    {
        let _in = Inside::enter();
        let top = last.min(c_int::MAX as c_uint) as c_int;
        for fd in table::in_range(first.min(c_int::MAX as c_uint) as c_int, top) {
            if flags & libc::CLOSE_RANGE_CLOEXEC as c_int != 0 {
                table::set_cloexec(fd, true);
            } else {
                let _ = table::close(fd);
            }
        }
    }
    if first >= floor {
        return 0;
    }
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        super::dents::closed_range(first, last.min(floor - 1));
    }
    // SAFETY: the caller's range, below the library's own descriptors.
    unsafe { real::close_range(first, last.min(floor - 1), flags) }
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(low: c_int) {
    // SAFETY: a range of descriptors, as closefrom(3) closes.
    unsafe { close_range(low.max(0) as c_uint, c_uint::MAX, 0) };
}

/// The mask as last set (u32::MAX: not read yet).
static UMASK: AtomicU32 = AtomicU32::new(u32::MAX);

pub(crate) fn current_umask() -> u32 {
    let m = UMASK.load(Ordering::Relaxed);
    if m != u32::MAX {
        return m;
    }
    let m = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("Umask:"))?;
            u32::from_str_radix(line["Umask:".len()..].trim(), 8).ok()
        })
        .unwrap_or(0o022);
    UMASK.store(m, Ordering::Relaxed);
    m
}

#[no_mangle]
pub extern "C" fn umask(mask: mode_t) -> mode_t {
    // SAFETY: umask(2) has no preconditions; called as a system call, since the C
    // library's own umask is this function.
    let old = unsafe { libc::syscall(libc::SYS_umask, mask) } as mode_t;
    UMASK.store(mask & 0o777, Ordering::Relaxed);
    old
}

/// Once per process (before its first served call): fork and exit handlers.
pub(crate) fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        extern "C" fn before_fork() {
            let _in = Inside::enter();
            table::all_to_kernel();
        }
        extern "C" fn in_child() {
            state::forked();
            table::forget_all();
        }
        extern "C" fn at_exit() {
            let _in = Inside::enter();
            table::close_all();
            state::report();
        }
        // SAFETY: registering handlers that are plain functions of this library.
        unsafe {
            libc::pthread_atfork(Some(before_fork), None, Some(in_child));
            libc::atexit(at_exit);
        }
    });
}

/// Before a new program replaces this one: served descriptors it inherits become
/// the kernel's.
fn before_exec() {
    if !Inside::now() {
        let _in = Inside::enter();
        table::prepare_exec();
    }
}

#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    before_exec();
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::execve(path, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    before_exec();
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::execv(path, argv) }
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    before_exec();
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::execvp(file, argv) }
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    before_exec();
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::execvpe(file, argv, envp) }
}

/// vfork is fork here: a vfork child shares this library's memory with its parent
/// (the dup2 of a redirection would change the parent's descriptor table), and
/// fork's handlers hand served descriptors to the kernel first. POSIX allows a
/// vfork that is a fork.
#[no_mangle]
pub extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: fork(2) through the C library, which runs the fork handlers.
    unsafe { libc::fork() }
}

/// posix_spawn runs the child without fork handlers or an exec this library sees:
/// every served descriptor goes to the kernel first.
fn before_spawn() {
    if !Inside::now() {
        let _in = Inside::enter();
        table::all_to_kernel();
    }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    at: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    before_spawn();
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::posix_spawn(pid, path, fa, at, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    at: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    before_spawn();
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::posix_spawnp(pid, file, fa, at, argv, envp) }
}

/// system() and popen() start their shell with the C library's internal spawn: as
/// for posix_spawn, every served descriptor goes to the kernel first.
#[no_mangle]
pub unsafe extern "C" fn system(cmd: *const c_char) -> c_int {
    before_spawn();
    // SAFETY: the caller's command, passed on.
    unsafe { real::system(cmd) }
}

#[no_mangle]
pub unsafe extern "C" fn popen(cmd: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    before_spawn();
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::popen(cmd, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::fopen64(path, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::fopen64(path, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    f: *mut libc::FILE,
) -> *mut libc::FILE {
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::freopen64(path, mode, f) }
}

#[no_mangle]
pub unsafe extern "C" fn freopen64(
    path: *const c_char,
    mode: *const c_char,
    f: *mut libc::FILE,
) -> *mut libc::FILE {
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::freopen64(path, mode, f) }
}
