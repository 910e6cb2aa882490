//! Opening and closing: open(2) and its variants, creat, close, umask; and the
//! process calls that must see descriptors as the kernel's (fork, exec, spawn).

use std::ffi::CString;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

use libc::{c_char, c_int, mode_t, AT_FDCWD, O_CREAT, O_DIRECTORY, O_PATH, O_TMPFILE};
use orion_client::{Client, FileType, OpenFlags};

use super::{fail, leaves, route, Route};
use crate::paths;
use crate::real;
use crate::state::{self, Inside};
use crate::table::{self, OpenFile};

/// Opens `path` (relative to `dirfd`) as openat(2) does.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn open_at(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    setup();
    // SAFETY: the caller's arguments, passed on. The library's own files go high; a
    // file under the mount that the kernel opens is noted (see kernel_holds).
    let kernel = || match Inside::now() {
        true => state::relocate(unsafe { real::openat(dirfd, path, flags, mode) }),
        false => {
            if !path.is_null() {
                let _in = Inside::enter();
                // SAFETY: a NUL-terminated string (the caller's).
                paths::note_kernel_open(dirfd, unsafe { std::ffi::CStr::from_ptr(path) });
            }
            unsafe { real::openat(dirfd, path, flags, mode) }
        }
    };
    // Directories, O_PATH and O_TMPFILE descriptors are the kernel's (through the
    // mount): readdir and fchdir need kernel descriptors.
    if flags & (O_DIRECTORY | O_PATH | O_TMPFILE) != 0 {
        return kernel();
    }
    // SAFETY: as the caller.
    match unsafe { route(dirfd, path, false) } {
        Route::Serve(c, p) => {
            let _in = Inside::enter();
            match open_served(c, &p, flags, mode) {
                Ok(Some(fd)) => fd,
                Ok(None) => kernel(),
                Err(e) => fail(e),
            }
        }
        Route::NotDir => fail(libc::ENOTDIR),
        Route::Fd(_) | Route::Kernel => kernel(),
    }
}

/// Opens `p` (from the file system's root) through the client. `Ok(None)`: not a
/// regular file, or the path leaves the file system: the kernel opens it.
fn open_served(
    c: &'static Client,
    p: &str,
    flags: c_int,
    mode: mode_t,
) -> Result<Option<c_int>, c_int> {
    if flags & libc::O_NOFOLLOW != 0 {
        match c.lstat(p) {
            Ok(a) if a.ftype == FileType::Symlink => return Err(libc::ELOOP),
            Err(e) if leaves(&e) => return Ok(None),
            _ => {}
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
    let fd = match c.open(p, of, mode & !current_umask() & 0o7777) {
        Ok(fd) => fd,
        Err(e) if leaves(&e) => return Ok(None),
        Err(e) => return Err(e.errno()),
    };
    let a = match c.fstat(fd) {
        Ok(a) => a,
        Err(e) => {
            let _ = c.close(fd);
            return Err(e.errno());
        }
    };
    if a.ftype != FileType::Regular {
        let _ = c.close(fd);
        return Ok(None);
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
        locked: Default::default(),
        descriptors: Default::default(),
        offset: Default::default(),
    };
    table::insert(file).map(Some)
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
            None => {}
        }
    }
    // SAFETY: the caller's descriptor, passed on.
    unsafe { real::close(fd) }
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

/// stdio's fopen opens with the C library's internal call: the file is the kernel's,
/// which removing its name must know (see `paths::kernel_holds`).
///
/// # Safety
/// `path` is null or NUL-terminated.
unsafe fn note_fopen(path: *const c_char) {
    if !path.is_null() && !Inside::now() {
        let _in = Inside::enter();
        // SAFETY: as the caller.
        paths::note_kernel_open(AT_FDCWD, unsafe { std::ffi::CStr::from_ptr(path) });
    }
}

#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        note_fopen(path);
        real::fopen64(path, mode)
    }
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        note_fopen(path);
        real::fopen64(path, mode)
    }
}

#[no_mangle]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    f: *mut libc::FILE,
) -> *mut libc::FILE {
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        note_fopen(path);
        real::freopen64(path, mode, f)
    }
}

#[no_mangle]
pub unsafe extern "C" fn freopen64(
    path: *const c_char,
    mode: *const c_char,
    f: *mut libc::FILE,
) -> *mut libc::FILE {
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        note_fopen(path);
        real::freopen64(path, mode, f)
    }
}
