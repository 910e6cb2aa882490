//! Attributes: the stat family, access, truncate, chmod, chown and the times, by
//! path and on served descriptors.

use libc::{c_char, c_int, c_uint, mode_t, off_t, AT_EMPTY_PATH, AT_FDCWD, AT_SYMLINK_NOFOLLOW};
use orion_client::{perm, Attr, Client, FileType, FsResult, SetAttrReq, TimeSet};

use super::{as_caller, effective_ids, fail, leaves, root, route, served, with_caller, Route};
use crate::real;
use crate::stat::{fill_stat, fill_statx};
use crate::state::Inside;

/// The attributes of what `path` names (`None`: the kernel's to answer).
///
/// # Safety
/// `path` is null or NUL-terminated.
unsafe fn attrs(d: c_int, path: *const c_char, flags: c_int) -> Option<Result<Attr, c_int>> {
    let nofollow = flags & AT_SYMLINK_NOFOLLOW != 0;
    // SAFETY: as the caller.
    let r: FsResult<Attr> = match unsafe { route(d, path, flags & AT_EMPTY_PATH != 0) } {
        Route::Serve(c, p) => {
            let _in = Inside::enter();
            // The walk searched as the caller, in the same walk that finds it.
            as_caller(|cred| c.stat_as(&p, !nofollow, cred))
        }
        Route::Fd(f) => {
            let _in = Inside::enter();
            f.client.fstat(f.fd)
        }
        Route::NotDir => return Some(Err(libc::ENOTDIR)),
        Route::Kernel => return None,
    };
    match r {
        Err(e) if leaves(&e) => None,
        r => Some(r.map_err(|e| e.errno())),
    }
}

/// # Safety
/// `path` is null or NUL-terminated; `st` valid for writing.
unsafe fn stat_at(d: c_int, path: *const c_char, st: *mut libc::stat64, flags: c_int) -> c_int {
    // SAFETY: as the caller.
    match unsafe { attrs(d, path, flags) } {
        // SAFETY: the caller's buffer, or null.
        Some(Ok(a)) => match unsafe { st.as_mut() } {
            Some(st) => {
                fill_stat(&a, st);
                0
            }
            None => fail(libc::EFAULT),
        },
        Some(Err(e)) => fail(e),
        // SAFETY: the caller's arguments, passed on.
        None => unsafe { real::fstatat64(d, path, st, flags) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn stat(path: *const c_char, st: *mut libc::stat64) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_at(AT_FDCWD, path, st, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn stat64(path: *const c_char, st: *mut libc::stat64) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_at(AT_FDCWD, path, st, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn lstat(path: *const c_char, st: *mut libc::stat64) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_at(AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn lstat64(path: *const c_char, st: *mut libc::stat64) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_at(AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn fstatat(
    d: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_at(d, path, st, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn fstatat64(
    d: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_at(d, path, st, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn fstat(fd: c_int, st: *mut libc::stat64) -> c_int {
    if let Some(f) = super::served_any(fd) {
        let _in = Inside::enter();
        // SAFETY: the caller's buffer, or null.
        return match (f.client.fstat(f.fd), unsafe { st.as_mut() }) {
            (Ok(a), Some(st)) => {
                fill_stat(&a, st);
                0
            }
            (Ok(_), None) => fail(libc::EFAULT),
            (Err(e), _) => fail(e.errno()),
        };
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::fstat64(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, st: *mut libc::stat64) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { fstat(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn statx(
    d: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    st: *mut libc::statx,
) -> c_int {
    // SAFETY: the caller's arguments.
    match unsafe { attrs(d, path, flags) } {
        // SAFETY: the caller's buffer, or null.
        Some(Ok(a)) => match unsafe { st.as_mut() } {
            Some(st) => {
                fill_statx(&a, st);
                0
            }
            None => fail(libc::EFAULT),
        },
        Some(Err(e)) => fail(e),
        // SAFETY: the caller's arguments, passed on.
        None => unsafe { real::statx(d, path, flags, mask, st) },
    }
}

/// access(2) of `a` for the caller (R_OK, W_OK and X_OK are the MAY_* bits).
fn allowed(a: &Attr, mode: c_int) -> Result<(), c_int> {
    with_caller(|cred| perm::check(a, cred, mode as u32)).map_err(|e| e.errno())
}

/// Whether access(2) asks as the process runs: it asks for the real ids unless
/// told AT_EACCESS, and a process whose real ids differ goes to the kernel.
fn asks_as_effective(flags: c_int) -> bool {
    // SAFETY: getuid and getgid have no preconditions.
    let real = unsafe { (libc::getuid(), libc::getgid()) };
    flags & libc::AT_EACCESS != 0 || real == effective_ids()
}

/// # Safety
/// `path` is null or NUL-terminated.
unsafe fn access_at(d: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int {
    if mode & !(libc::R_OK | libc::W_OK | libc::X_OK) != 0 {
        return fail(libc::EINVAL);
    }
    if !asks_as_effective(flags) {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real::faccessat(d, path, mode, flags) };
    }
    // SAFETY: as the caller.
    match unsafe { attrs(d, path, flags & (AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH)) } {
        Some(Ok(a)) => match allowed(&a, mode) {
            Ok(()) => 0,
            Err(e) => fail(e),
        },
        Some(Err(e)) => fail(e),
        // SAFETY: the caller's arguments, passed on.
        None => unsafe { real::faccessat(d, path, mode, flags) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { access_at(AT_FDCWD, path, mode, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn faccessat(d: c_int, path: *const c_char, mode: c_int, fl: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { access_at(d, path, mode, fl) }
}

#[no_mangle]
pub unsafe extern "C" fn truncate(path: *const c_char, len: off_t) -> c_int {
    // SAFETY: the caller's arguments.
    if let Route::Serve(c, p) = unsafe { route(AT_FDCWD, path, false) } {
        let _in = Inside::enter();
        if len < 0 {
            return fail(libc::EINVAL);
        }
        let req = SetAttrReq {
            size: Some(len as u64),
            ..Default::default()
        };
        // A truncation by a caller without CAP_FSETID drops the setid bits, as a
        // write does (`Client::kill_setid`).
        let kill = |a: Attr| match root() {
            true => Ok(()),
            false => c.kill_setid(a.ino),
        };
        let truncated = as_caller(|cred| c.setattr_path_as(&p, true, &req, cred));
        match truncated.and_then(kill) {
            Ok(()) => return 0,
            Err(e) if leaves(&e) => {}
            Err(e) => return fail(e.errno()),
        }
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::truncate64(path, len) }
}

#[no_mangle]
pub unsafe extern "C" fn truncate64(path: *const c_char, len: off_t) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { truncate(path, len) }
}

/// setattr on a served descriptor's inode.
fn set(fd: c_int, req: SetAttrReq) -> Option<c_int> {
    let f = served(fd)?;
    let _in = Inside::enter();
    Some(match set_ino(f.client, f.ino, &req) {
        Ok(_) => 0,
        Err(e) => fail(e.errno()),
    })
}

/// setattr on an inode, as the caller may make it (`perm::check_setattr`).
fn set_ino(c: &Client, ino: u64, req: &SetAttrReq) -> FsResult<Attr> {
    let req = with_caller(|cred| c.may_setattr(cred, ino, req, false))?;
    c.setattr(ino, &req)
}

#[no_mangle]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: mode_t) -> c_int {
    let req = SetAttrReq {
        mode: Some(mode & 0o7777),
        ..Default::default()
    };
    match set(fd, req) {
        Some(r) => r,
        // SAFETY: the caller's arguments, passed on.
        None => unsafe { real::fchmod(fd, mode) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    let mut req = chown_req(uid, gid);
    if keeps_owner(&req) {
        if let Some(f) = served(fd) {
            let _in = Inside::enter();
            match f.client.fstat(f.fd) {
                Ok(a) => req.mode = chown_kills(&a),
                Err(e) => return fail(e.errno()),
            }
        }
    }
    match set(fd, req) {
        Some(r) => r,
        // SAFETY: the caller's arguments, passed on.
        None => unsafe { real::fchown(fd, uid, gid) },
    }
}

/// chown's change (-1: that id unchanged).
fn chown_req(uid: libc::uid_t, gid: libc::gid_t) -> SetAttrReq {
    SetAttrReq {
        uid: (uid != u32::MAX).then_some(uid),
        gid: (gid != u32::MAX).then_some(gid),
        ..Default::default()
    }
}

/// chown(f, -1, -1) changes no id, but Linux still clears the setuid bit of a file
/// that is not a directory, and its setgid bit with group-execute (and sets its
/// ctime): [`chown_kills`] is that change.
fn keeps_owner(req: &SetAttrReq) -> bool {
    req.uid.is_none() && req.gid.is_none()
}

/// The mode a chown that names no id leaves `a` with, if it changes it (a change of
/// mode: the owner's or root's to make).
fn chown_kills(a: &Attr) -> Option<u32> {
    let kept = perm::without_setid(a.mode & 0o7777);
    (a.ftype != FileType::Directory && kept != a.mode & 0o7777).then_some(kept)
}

fn time_set(t: &libc::timespec) -> Option<TimeSet> {
    match t.tv_nsec {
        libc::UTIME_OMIT => None,
        libc::UTIME_NOW => Some(TimeSet::Now),
        ns => Some(TimeSet::At(t.tv_sec * 1_000_000_000 + ns)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, t: *const libc::timespec) -> c_int {
    if served(fd).is_none() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real::futimens(fd, t) };
    }
    // SAFETY: as the caller.
    unsafe { set_times(fd, t) }
}

/// utimensat: a path's times, or with a null path a descriptor's (glibc's futimens
/// and futimes do this).
#[no_mangle]
pub unsafe extern "C" fn utimensat(
    d: c_int,
    path: *const c_char,
    t: *const libc::timespec,
    fl: c_int,
) -> c_int {
    if path.is_null() {
        if served(d).is_some() {
            // SAFETY: as the caller.
            return unsafe { set_times(d, t) };
        }
    } else {
        // SAFETY: as the caller.
        let req = match unsafe { times(t) } {
            Ok(req) => req,
            Err(e) => return fail(e),
        };
        // SAFETY: as the caller.
        if let Some(r) = unsafe { set_path(d, path, fl, req) } {
            return r;
        }
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::utimensat(d, path, t, fl) }
}

/// The two timespecs of `t` (null: both now) as a timestamp change.
///
/// # Safety
/// `t` is null or an array of two timespecs.
unsafe fn times(t: *const libc::timespec) -> Result<SetAttrReq, c_int> {
    let (atime, mtime) = if t.is_null() {
        (Some(TimeSet::Now), Some(TimeSet::Now))
    } else {
        // SAFETY: a non-null times argument is an array of two timespecs.
        let ts = unsafe { std::slice::from_raw_parts(t, 2) };
        if ts.iter().any(|x| {
            !matches!(x.tv_nsec, libc::UTIME_OMIT | libc::UTIME_NOW)
                && !(0..1_000_000_000).contains(&x.tv_nsec)
        }) {
            return Err(libc::EINVAL);
        }
        (time_set(&ts[0]), time_set(&ts[1]))
    };
    Ok(SetAttrReq {
        atime,
        mtime,
        ..Default::default()
    })
}

/// Two timevals (null: now) as the timespecs utimensat takes.
///
/// # Safety
/// `tv` is null or an array of two timevals.
unsafe fn from_timevals(tv: *const libc::timeval) -> Option<[libc::timespec; 2]> {
    // SAFETY: a non-null times argument is an array of two timevals.
    let v = unsafe { tv.as_ref().map(|_| std::slice::from_raw_parts(tv, 2)) }?;
    Some([0, 1].map(|i| libc::timespec {
        tv_sec: v[i].tv_sec,
        tv_nsec: v[i].tv_usec * 1000,
    }))
}

/// setattr on what `path` (relative to `d`) names, without following a final
/// symlink under `AT_SYMLINK_NOFOLLOW`. `None`: the kernel's to do.
///
/// # Safety
/// `path` is null or NUL-terminated.
unsafe fn set_path(d: c_int, path: *const c_char, flags: c_int, req: SetAttrReq) -> Option<c_int> {
    // SAFETY: as the caller.
    let r = match unsafe { route(d, path, flags & AT_EMPTY_PATH != 0) } {
        Route::Serve(c, p) => {
            let _in = Inside::enter();
            let follow = flags & AT_SYMLINK_NOFOLLOW == 0;
            as_caller(|cred| c.setattr_path_as(&p, follow, &req, cred))
        }
        Route::Fd(f) => {
            let _in = Inside::enter();
            set_ino(f.client, f.ino, &req)
        }
        Route::NotDir => return Some(fail(libc::ENOTDIR)),
        Route::Kernel => return None,
    };
    match r {
        Ok(_) => Some(0),
        Err(e) if leaves(&e) => None,
        Err(e) => Some(fail(e.errno())),
    }
}

#[no_mangle]
pub unsafe extern "C" fn utimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    // SAFETY: the caller's arguments.
    let ts = unsafe { from_timevals(tv) };
    let t = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: the caller's path; null or our two timespecs.
    unsafe { utimensat(AT_FDCWD, path, t, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn lutimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    // SAFETY: the caller's arguments.
    let ts = unsafe { from_timevals(tv) };
    let t = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: the caller's path; null or our two timespecs.
    unsafe { utimensat(AT_FDCWD, path, t, AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn utime(path: *const c_char, b: *const libc::utimbuf) -> c_int {
    // SAFETY: a non-null utimbuf is the caller's.
    let ts = unsafe { b.as_ref() }.map(|b| {
        [b.actime, b.modtime].map(|s| libc::timespec {
            tv_sec: s,
            tv_nsec: 0,
        })
    });
    let t = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: the caller's path; null or our two timespecs.
    unsafe { utimensat(AT_FDCWD, path, t, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn fchmodat(d: c_int, path: *const c_char, mode: mode_t, fl: c_int) -> c_int {
    // A symlink's own mode (AT_SYMLINK_NOFOLLOW) is the kernel's to refuse.
    if fl == 0 {
        let req = SetAttrReq {
            mode: Some(mode & 0o7777),
            ..Default::default()
        };
        // SAFETY: the caller's path.
        if let Some(r) = unsafe { set_path(d, path, 0, req) } {
            return r;
        }
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::fchmodat(d, path, mode, fl) }
}

#[no_mangle]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { fchmodat(AT_FDCWD, path, mode, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn fchownat(
    d: c_int,
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
    fl: c_int,
) -> c_int {
    let mut req = chown_req(uid, gid);
    if keeps_owner(&req) {
        // SAFETY: the caller's path.
        match unsafe { attrs(d, path, fl) } {
            Some(Ok(a)) => req.mode = chown_kills(&a),
            Some(Err(e)) => return fail(e),
            // SAFETY: the caller's arguments, passed on.
            None => return unsafe { real::fchownat(d, path, uid, gid, fl) },
        }
    }
    // SAFETY: the caller's path.
    match unsafe { set_path(d, path, fl, req) } {
        Some(r) => r,
        // SAFETY: the caller's arguments, passed on.
        None => unsafe { real::fchownat(d, path, uid, gid, fl) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { fchownat(AT_FDCWD, path, uid, gid, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn lchown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { fchownat(AT_FDCWD, path, uid, gid, AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn futimes(fd: c_int, tv: *const libc::timeval) -> c_int {
    if served(fd).is_none() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real::futimes(fd, tv) };
    }
    // SAFETY: the caller's times.
    let ts = unsafe { from_timevals(tv) };
    let p = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: null or our array of two timespecs.
    unsafe { set_times(fd, p) }
}

/// # Safety
/// `t` is null or an array of two timespecs.
unsafe fn set_times(fd: c_int, t: *const libc::timespec) -> c_int {
    // SAFETY: as the caller.
    match unsafe { times(t) } {
        Ok(req) => set(fd, req).unwrap_or_else(|| fail(libc::EBADF)),
        Err(e) => fail(e),
    }
}

// The stat family as binaries built against glibc before 2.33 call it (the version
// argument names the layout, the same on this ABI as `stat64`'s).

#[no_mangle]
pub unsafe extern "C" fn __xstat(_v: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_at(AT_FDCWD, path, st, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __xstat64(_v: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_at(AT_FDCWD, path, st, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __lxstat(_v: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_at(AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn __lxstat64(
    _v: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_at(AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstat(_v: c_int, fd: c_int, st: *mut libc::stat64) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { fstat(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstat64(_v: c_int, fd: c_int, st: *mut libc::stat64) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { fstat(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstatat(
    _v: c_int,
    d: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    fl: c_int,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_at(d, path, st, fl) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstatat64(
    _v: c_int,
    d: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    fl: c_int,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_at(d, path, st, fl) }
}
