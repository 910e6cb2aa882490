//! Descriptor calls: dup, fcntl and flock on served descriptors (locks in
//! `locks.rs`), and the calls only the kernel can serve (mmap, ioctl, fdopen's stdio,
//! status flags changed), for which a served descriptor goes to the kernel first.

use libc::{c_char, c_int, c_long, c_ulong, c_void, off_t, size_t};

use super::{fail, served, served_any};
use crate::real;
use crate::state::{settings, Inside};
use crate::table;

/// Hands `fd` to the kernel if this library serves it (the call that follows needs
/// a kernel descriptor). Errors are left for that call to meet (EBADF).
pub(crate) fn kernel_fd(fd: c_int) {
    if table::get(fd).is_some() {
        let _in = Inside::enter();
        table::hand_over(fd);
    }
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    if served_any(fd).is_some() {
        let _in = Inside::enter();
        match table::dup(fd, 0, false) {
            Some(Ok(n)) => return n,
            Some(Err(e)) => return fail(e),
            None => {}
        }
    }
    // SAFETY: the caller's descriptor, passed on.
    unsafe { real::dup(fd) }
}

/// dup2/dup3: onto a number that may be served (it is closed first).
fn dup_onto(old: c_int, new: c_int, cloexec: bool) -> c_int {
    if Inside::now() || (served_any(old).is_none() && served_any(new).is_none()) {
        super::dents::closed(new);
        let fl = if cloexec { libc::O_CLOEXEC } else { 0 };
        // SAFETY: descriptor numbers, checked by the kernel.
        return unsafe { real::dup3(old, new, fl) };
    }
    let _in = Inside::enter();
    match table::dup_onto(old, new, cloexec) {
        Ok(n) => n,
        Err(e) => fail(e),
    }
}

#[no_mangle]
pub extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old == new {
        // dup2 onto itself: the descriptor if it is open.
        if served_any(old).is_some() {
            return old;
        }
        // SAFETY: F_GETFD on a descriptor number, checked by the kernel.
        return if unsafe { real::fcntl(old, libc::F_GETFD, 0) } < 0 {
            -1
        } else {
            old
        };
    }
    dup_onto(old, new, false)
}

#[no_mangle]
pub extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if old == new || flags & !libc::O_CLOEXEC != 0 {
        return fail(libc::EINVAL);
    }
    dup_onto(old, new, flags & libc::O_CLOEXEC != 0)
}

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    if let Some(f) = served_any(fd) {
        let _in = Inside::enter();
        // SAFETY: a lock command's argument is the caller's struct flock.
        if let Some(r) = unsafe { super::locks::fcntl_lock(&f, cmd, arg as *mut libc::flock) } {
            return r.unwrap_or_else(fail);
        }
        match cmd {
            libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
                return match table::dup(fd, arg as c_int, cmd == libc::F_DUPFD_CLOEXEC) {
                    Some(Ok(n)) => n,
                    Some(Err(e)) => fail(e),
                    None => fail(libc::EBADF),
                }
            }
            // The access mode and status flags, as the kernel reports them.
            libc::F_GETFL => {
                let status = libc::O_ACCMODE
                    | libc::O_APPEND
                    | libc::O_NONBLOCK
                    | libc::O_SYNC
                    | libc::O_DSYNC
                    | libc::O_DIRECT
                    | libc::O_NOATIME;
                return f.flags & status | libc::O_LARGEFILE;
            }
            libc::F_SETFD => {
                table::set_cloexec(fd, arg as c_int & libc::FD_CLOEXEC != 0);
                // The kernel's flag too (the reserved number carries it).
                // SAFETY: F_SETFD on the reserved number.
                return unsafe { real::fcntl(fd, cmd, arg) };
            }
            // The reserved number carries the close-on-exec flag.
            libc::F_GETFD => {}
            // A status flag changed, leases, anything else: the kernel's.
            _ => {
                drop(f);
                kernel_fd(fd);
            }
        }
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::fcntl(fd, cmd, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { fcntl(fd, cmd, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn mmap(
    a: *mut c_void,
    n: size_t,
    prot: c_int,
    fl: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    if fl & libc::MAP_ANONYMOUS == 0 {
        kernel_fd(fd);
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::mmap64(a, n, prot, fl, fd, off) }
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(
    a: *mut c_void,
    n: size_t,
    prot: c_int,
    fl: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: the caller's arguments.
    unsafe { mmap(a, n, prot, fl, fd, off) }
}

#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: c_long) -> c_int {
    kernel_fd(fd);
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::ioctl(fd, req, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn flock(fd: c_int, op: c_int) -> c_int {
    if let Some(f) = served(fd) {
        let _in = Inside::enter();
        return match super::locks::flock(&f, op) {
            Ok(()) => 0,
            Err(e) => fail(e),
        };
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::flock(fd, op) }
}

#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE {
    // stdio reads and writes with the C library's internal calls, which this
    // library cannot see.
    kernel_fd(fd);
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::fdopen(fd, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    if served(fd).is_some() {
        return fail(libc::ENOTDIR);
    }
    // SAFETY: the caller's descriptor, passed on.
    unsafe { real::fchdir(fd) }
}

/// The mount point, for statfs of a served descriptor.
fn mount_path() -> Option<std::ffi::CString> {
    std::ffi::CString::new(settings()?.mount.as_str()).ok()
}

#[no_mangle]
pub unsafe extern "C" fn fstatfs(fd: c_int, st: *mut libc::statfs64) -> c_int {
    if served(fd).is_some() {
        if let Some(m) = mount_path() {
            // SAFETY: statfs of the mount point into the caller's buffer.
            return unsafe { real::statfs64(m.as_ptr(), st) };
        }
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::fstatfs64(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn fstatfs64(fd: c_int, st: *mut libc::statfs64) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { fstatfs(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn fstatvfs(fd: c_int, st: *mut libc::statvfs64) -> c_int {
    if served(fd).is_some() {
        if let Some(m) = mount_path() {
            // SAFETY: statvfs of the mount point into the caller's buffer.
            return unsafe { real::statvfs64(m.as_ptr(), st) };
        }
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::fstatvfs64(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn fstatvfs64(fd: c_int, st: *mut libc::statvfs64) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { fstatvfs(fd, st) }
}

/// A descriptor made by the library itself goes high ([`relocate`]); a program's
/// stays where the kernel put it.
///
/// [`relocate`]: crate::state::relocate
fn own(fd: c_int) -> c_int {
    match Inside::now() {
        true => crate::state::relocate(fd),
        false => fd,
    }
}

/// The library's own sockets (its client's connections) go high.
#[no_mangle]
pub extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: socket(2) has no pointer arguments.
    own(unsafe { real::socket(domain, ty, proto) })
}

#[no_mangle]
pub extern "C" fn eventfd(init: libc::c_uint, flags: c_int) -> c_int {
    // SAFETY: eventfd(2) has no pointer arguments.
    own(unsafe { real::eventfd(init, flags) })
}

#[no_mangle]
pub extern "C" fn epoll_create1(flags: c_int) -> c_int {
    // SAFETY: epoll_create1(2) has no pointer arguments.
    own(unsafe { real::epoll_create1(flags) })
}

/// lockf: glibc makes it of fcntl internally, unseen; a record lock from the file
/// offset, `len` bytes (0: to the end and beyond; negative: before the offset).
#[no_mangle]
pub unsafe extern "C" fn lockf(fd: c_int, cmd: c_int, len: off_t) -> c_int {
    let Some(f) = served(fd) else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real::lockf64(fd, cmd, len) };
    };
    let _in = Inside::enter();
    // SAFETY: a struct flock is plain data.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_whence = libc::SEEK_CUR as _;
    l.l_len = len;
    let (kind, fcmd) = match cmd {
        libc::F_ULOCK => (libc::F_UNLCK, libc::F_SETLK),
        libc::F_LOCK => (libc::F_WRLCK, libc::F_SETLKW),
        libc::F_TLOCK => (libc::F_WRLCK, libc::F_SETLK),
        libc::F_TEST => (libc::F_WRLCK, libc::F_GETLK),
        _ => return fail(libc::EINVAL),
    };
    l.l_type = kind as _;
    // SAFETY: a lock command with our struct flock.
    let r = unsafe { super::locks::fcntl_lock(&f, fcmd, &mut l) };
    match r {
        Some(Ok(_)) if cmd == libc::F_TEST && l.l_type as c_int != libc::F_UNLCK => {
            fail(libc::EACCES)
        }
        Some(Ok(_)) => 0,
        Some(Err(e)) if e == libc::EAGAIN => fail(libc::EACCES),
        Some(Err(e)) => fail(e),
        None => fail(libc::EINVAL),
    }
}

#[no_mangle]
pub unsafe extern "C" fn lockf64(fd: c_int, cmd: c_int, len: off_t) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { lockf(fd, cmd, len) }
}
