//! The C library's file calls, as this library exports them: each serves a path under
//! the mount or a descriptor it serves through the client, and hands anything else
//! to the C library ([`crate::real`]). A call the client answers with EXDEV (the
//! path leaves the file system: an absolute symlink, ".." above the root) goes to
//! the kernel too, which resolves it through the mount.
//!
//! The prototypes are glibc's (Linux x86-64 and AArch64, where a variadic `open`,
//! `openat`, `fcntl` or `ioctl` receives its optional argument where a fixed one
//! would be).

mod dents;
mod dirs;
mod fds;
mod ids;
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
use orion_client::perm::Cred;
use orion_client::{Client, FsError, FsResult};

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

/// Where `path` (relative to `dirfd`) goes. A call is served in-process while the
/// process is who its client creates files as (it connected with these effective
/// ids); a process that changed ids since (setuid, seteuid) goes through the mount.
/// Each served call checks the caller's permission first ([`allow`]).
///
/// # Safety
/// `path` is null or a NUL-terminated string.
pub(crate) unsafe fn route(dirfd: c_int, path: *const c_char, empty_path: bool) -> Route {
    if path.is_null() || Inside::now() {
        return Route::Kernel;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let p = unsafe { CStr::from_ptr(path) };
    RELATIVE.set(p.to_bytes().first() != Some(&b'/'));
    let _in = Inside::enter();
    let r = match classify(dirfd, p, empty_path) {
        Target::Orion(s) => {
            // The client walks from the file system's root: `classify` makes it absolute.
            debug_assert!(s.starts_with('/'), "a path {s:?} not from the root");
            serving_client().map_or(Route::Kernel, |c| Route::Serve(c, s))
        }
        Target::OrionFd(fd) => table::get(fd).map_or(Route::Kernel, Route::Fd),
        Target::NotDir => Route::NotDir,
        Target::Kernel => Route::Kernel,
    };
    if matches!(r, Route::Serve(..) | Route::Fd(_)) {
        state::SERVED.fetch_add(1, Ordering::Relaxed);
    }
    r
}

/// The client that serves the calling process's calls now, if any. Asked before
/// the client: a process whose calls all go to the mount never connects one.
pub(crate) fn serving_client() -> Option<&'static Client> {
    if !serves(effective_ids().0) {
        return None;
    }
    state::client().filter(|c| c.owner() == effective_ids())
}

/// The open file behind `fd` if this library serves it (and is not at work already
/// on this thread). A served directory goes to the kernel instead (and `None`): the
/// calls it answers in-process ask [`served_any`].
pub(crate) fn served(fd: c_int) -> Option<Arc<OpenFile>> {
    let f = served_any(fd)?;
    if f.dir {
        drop(f);
        let _in = Inside::enter();
        table::hand_over(fd);
        return None;
    }
    Some(f)
}

/// [`served`], directories included: for the calls that need nothing of a
/// directory but its inode (fstat, fsync, dup, fcntl).
pub(crate) fn served_any(fd: c_int) -> Option<Arc<OpenFile>> {
    if Inside::now() {
        return None;
    }
    let f = table::get(fd)?;
    state::SERVED.fetch_add(1, Ordering::Relaxed);
    Some(f)
}

/// Whether calls of user `uid` are served in-process: everyone's, unless
/// `ORION_PRELOAD_USERS=root` sends other users' through the mount. Other users'
/// clients reach the stores over the fabric (the pools are root's to map): over a
/// TCP provider their writes cost more than the mount's (README).
fn serves(uid: u32) -> bool {
    static ROOT_ONLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    uid == 0
        || !*ROOT_ONLY
            .get_or_init(|| std::env::var("ORION_PRELOAD_USERS").is_ok_and(|v| v == "root"))
}

/// The process's effective user and group ids (kept: [`ids`]).
pub(crate) fn effective_ids() -> (u32, u32) {
    ids::effective()
}

/// Runs `f` with the calling process's credentials: its effective ids, and its
/// supplementary groups, read only if a check needs them.
pub(crate) fn with_caller<T>(f: impl FnOnce(&Cred) -> T) -> T {
    let (uid, gid) = effective_ids();
    let groups = std::cell::OnceCell::new();
    let in_group = |g: u32| groups.get_or_init(supplementary_groups).contains(&g);
    f(&Cred {
        uid,
        gid,
        in_group: &in_group,
    })
}

fn supplementary_groups() -> Vec<u32> {
    // SAFETY: with a size of 0, getgroups only counts the groups.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let mut v = vec![0; n.max(0) as usize];
    // SAFETY: `v` holds `n` gids, the most getgroups writes with that size.
    let got = unsafe { libc::getgroups(n, v.as_mut_ptr()) };
    v.truncate(got.max(0) as usize);
    v
}

/// Runs a client call as the calling process (its credentials, which the call checks
/// in the walk that finds what it acts on). Root's calls pass without a look.
pub(crate) fn as_caller<T>(f: impl FnOnce(Option<&Cred>) -> FsResult<T>) -> FsResult<T> {
    judged(with_caller(|cred| f(Some(cred))))
}

thread_local! {
    /// Whether the path of the call being routed was relative (to the working
    /// directory or a directory descriptor).
    static RELATIVE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A call of two paths (rename, link) is relative if either path is.
///
/// # Safety
/// Both are null or NUL-terminated.
pub(crate) unsafe fn relative_either(a: *const c_char, b: *const c_char) {
    // SAFETY: as the caller says; a null path is neither.
    let rel = |p: *const c_char| !p.is_null() && unsafe { *p } as u8 != b'/';
    RELATIVE.set(rel(a) || rel(b));
}

/// A check's answer for the call being routed. The client walks every path from the
/// file system's root, but Linux searches a relative path only from where it
/// starts: a refusal of such a path may come from a directory above the start, so
/// the kernel decides it (EXDEV: the call goes through the mount).
pub(crate) fn judged<T>(r: FsResult<T>) -> FsResult<T> {
    match r {
        Err(FsError::Errno(libc::EACCES)) if RELATIVE.get() => Err(FsError::Errno(libc::EXDEV)),
        r => r,
    }
}

/// Whether the caller is root (who passes every check but executing).
pub(crate) fn root() -> bool {
    effective_ids().0 == 0
}

pub(crate) use locks::closed as locks_closed;
pub(crate) use open::setup;
