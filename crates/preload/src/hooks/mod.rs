//! The C library's file calls, as this library exports them: each serves a path under
//! the mount or a descriptor it serves through the client, and hands anything else
//! to the C library ([`crate::real`]). A call the client answers with EXDEV (the
//! path leaves the file system: an absolute symlink, ".." above the root) goes to
//! the kernel too, which resolves it through the mount.
//!
//! The prototypes are glibc's (Linux x86-64 and AArch64, where a variadic `open`,
//! `openat`, `fcntl` or `ioctl` receives its optional argument where a fixed one
//! would be).

mod dirs;
mod fds;
mod io;
mod locks;
mod meta;
mod names;
mod open;
mod xattrs;

use std::ffi::CStr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use libc::{c_char, c_int, ssize_t};
use orion_client::{Client, FsError};

use crate::paths::{classify, Target};
use crate::state::{self, Inside};
use crate::table::{self, OpenFile};

pub(crate) fn set_errno(e: c_int) {
    // SAFETY: the calling thread's errno is always valid to write.
    unsafe { *libc::__errno_location() = e };
}

/// -1 with errno set, as a failing system call returns.
pub(crate) fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

pub(crate) fn fail_ssize(e: c_int) -> ssize_t {
    set_errno(e);
    -1
}

/// The client said the path leaves the file system: the kernel must resolve it.
pub(crate) fn leaves(e: &FsError) -> bool {
    e.errno() == libc::EXDEV
}

/// Where a path call goes.
pub(crate) enum Route {
    /// Through the client: the path from the file system's root.
    Serve(&'static Client, String),
    /// An empty path with AT_EMPTY_PATH on a descriptor this library serves.
    Fd(Arc<OpenFile>),
    /// A relative path from a served descriptor, which is not a directory.
    NotDir,
    Kernel,
}

/// Where `path` (relative to `dirfd`) goes. Only the superuser's calls are served
/// in-process for now (the client does not check permissions; the kernel does
/// through the mount for everyone else).
///
/// # Safety
/// `path` is null or a NUL-terminated string.
pub(crate) unsafe fn route(dirfd: c_int, path: *const c_char, empty_path: bool) -> Route {
    if path.is_null() || Inside::now() || !superuser() {
        return Route::Kernel;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let p = unsafe { CStr::from_ptr(path) };
    let _in = Inside::enter();
    let r = match classify(dirfd, p, empty_path) {
        Target::Orion(s) => match state::client() {
            Some(c) => Route::Serve(c, s),
            None => Route::Kernel,
        },
        Target::OrionFd(fd) => table::get(fd).map_or(Route::Kernel, Route::Fd),
        Target::NotDir => Route::NotDir,
        Target::Kernel => Route::Kernel,
    };
    if matches!(r, Route::Serve(..) | Route::Fd(_)) {
        state::SERVED.fetch_add(1, Ordering::Relaxed);
    }
    r
}

/// The open file behind `fd` if this library serves it (and is not at work already
/// on this thread).
pub(crate) fn served(fd: c_int) -> Option<Arc<OpenFile>> {
    if Inside::now() {
        return None;
    }
    let f = table::get(fd)?;
    state::SERVED.fetch_add(1, Ordering::Relaxed);
    Some(f)
}

/// Asked at each path call: a process that drops its privileges (setuid, seteuid)
/// goes through the kernel's checks from then on.
fn superuser() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub(crate) use locks::closed as locks_closed;
pub(crate) use open::setup;
