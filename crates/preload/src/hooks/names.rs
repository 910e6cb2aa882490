//! Names: mkdir, rmdir, unlink, rename, link, symlink and readlink under the mount,
//! served through the client (so that, among other things, a file this process holds
//! open outlives its name).

use std::ffi::CStr;

use libc::{c_char, c_int, c_uint, mode_t, size_t, ssize_t, AT_FDCWD, AT_REMOVEDIR};
use orion_client::{FsResult, RenameMode};

use super::{as_caller, fail, fail_ssize, leaves, relative_either, route, Route};
use crate::real;
use crate::state::Inside;

/// The result of a served call, or `None` when the kernel must do it.
fn done(r: FsResult<()>) -> Option<c_int> {
    match r {
        Ok(()) => Some(0),
        Err(e) if leaves(&e) => None,
        Err(e) => Some(fail(e.errno())),
    }
}

#[no_mangle]
pub unsafe extern "C" fn mkdirat(d: c_int, path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's path.
    let served = match unsafe { route(d, path, false) } {
        Route::Serve(c, p) => {
            let _in = Inside::enter();
            let mode = mode & 0o7777 & !super::open::current_umask();
            done(as_caller(|cred| c.mkdir_as(&p, mode, cred)).map(|_| ()))
        }
        Route::NotDir => Some(fail(libc::ENOTDIR)),
        _ => None,
    };
    // SAFETY: the caller's arguments, passed on.
    served.unwrap_or_else(|| unsafe { real::mkdirat(d, path, mode) })
}

#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { mkdirat(AT_FDCWD, path, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn unlinkat(d: c_int, path: *const c_char, flags: c_int) -> c_int {
    if flags & !AT_REMOVEDIR != 0 {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's path.
    let served = match unsafe { route(d, path, false) } {
        Route::Serve(c, p) => {
            let _in = Inside::enter();
            match flags & AT_REMOVEDIR != 0 {
                true => done(as_caller(|cred| c.rmdir_as(&p, cred))),
                // A file this process also holds through the kernel stays, as any
                // client's open file: the mount holds it in its open table.
                false => done(as_caller(|cred| c.unlink_as(&p, cred))),
            }
        }
        Route::NotDir => Some(fail(libc::ENOTDIR)),
        _ => None,
    };
    // SAFETY: the caller's arguments, passed on.
    served.unwrap_or_else(|| unsafe { real::unlinkat(d, path, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { unlinkat(AT_FDCWD, path, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { unlinkat(AT_FDCWD, path, AT_REMOVEDIR) }
}

#[no_mangle]
pub unsafe extern "C" fn renameat2(
    od: c_int,
    from: *const c_char,
    nd: c_int,
    to: *const c_char,
    flags: c_uint,
) -> c_int {
    let mode = match flags {
        0 => RenameMode::Replace,
        libc::RENAME_NOREPLACE => RenameMode::NoReplace,
        libc::RENAME_EXCHANGE => RenameMode::Exchange,
        // RENAME_WHITEOUT and combinations: the kernel says what it says.
        // SAFETY: the caller's arguments, passed on.
        _ => return unsafe { real::renameat2(od, from, nd, to, flags) },
    };
    // SAFETY: the caller's paths.
    let (a, b) = unsafe { (route(od, from, false), route(nd, to, false)) };
    // SAFETY: the caller's paths.
    unsafe { relative_either(from, to) };
    let served = match (a, b) {
        (Route::Serve(c, p), Route::Serve(_, q)) => {
            let _in = Inside::enter();
            // The mount point itself belongs to the file system it sits in (EXDEV).
            match p == "/" || q == "/" {
                true => None,
                false => done(as_caller(|cred| c.rename_as(&p, &q, mode, cred))),
            }
        }
        (Route::NotDir, _) | (_, Route::NotDir) => Some(fail(libc::ENOTDIR)),
        _ => None,
    };
    // SAFETY: the caller's arguments, passed on.
    served.unwrap_or_else(|| unsafe { real::renameat2(od, from, nd, to, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn renameat(
    od: c_int,
    from: *const c_char,
    nd: c_int,
    to: *const c_char,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { renameat2(od, from, nd, to, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn rename(from: *const c_char, to: *const c_char) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { renameat2(AT_FDCWD, from, AT_FDCWD, to, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn symlinkat(target: *const c_char, d: c_int, path: *const c_char) -> c_int {
    // SAFETY: the caller's path.
    let served = match unsafe { route(d, path, false) } {
        // SAFETY: a non-null target is the caller's NUL-terminated string.
        Route::Serve(c, p) => match unsafe { target.as_ref().map(|t| CStr::from_ptr(t)) } {
            Some(t) => {
                let _in = Inside::enter();
                // A target that is not UTF-8 is the kernel's to store.
                t.to_str()
                    .ok()
                    .and_then(|t| done(as_caller(|cred| c.symlink_as(t, &p, cred)).map(|_| ())))
            }
            None => Some(fail(libc::EFAULT)),
        },
        Route::NotDir => Some(fail(libc::ENOTDIR)),
        _ => None,
    };
    // SAFETY: the caller's arguments, passed on.
    served.unwrap_or_else(|| unsafe { real::symlinkat(target, d, path) })
}

#[no_mangle]
pub unsafe extern "C" fn symlink(target: *const c_char, path: *const c_char) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { symlinkat(target, AT_FDCWD, path) }
}

#[no_mangle]
pub unsafe extern "C" fn linkat(
    od: c_int,
    from: *const c_char,
    nd: c_int,
    to: *const c_char,
    flags: c_int,
) -> c_int {
    // link(2) does not follow a final symlink; following it (AT_SYMLINK_FOLLOW) and
    // linking a descriptor (AT_EMPTY_PATH) are the kernel's.
    if flags != 0 {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real::linkat(od, from, nd, to, flags) };
    }
    // SAFETY: the caller's paths.
    let (a, b) = unsafe { (route(od, from, false), route(nd, to, false)) };
    // SAFETY: the caller's paths.
    unsafe { relative_either(from, to) };
    let served = match (a, b) {
        (Route::Serve(c, p), Route::Serve(_, q)) => {
            let _in = Inside::enter();
            done(as_caller(|cred| c.link_as(&p, &q, cred)).map(|_| ()))
        }
        (Route::NotDir, _) | (_, Route::NotDir) => Some(fail(libc::ENOTDIR)),
        _ => None,
    };
    // SAFETY: the caller's arguments, passed on.
    served.unwrap_or_else(|| unsafe { real::linkat(od, from, nd, to, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn link(from: *const c_char, to: *const c_char) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { linkat(AT_FDCWD, from, AT_FDCWD, to, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn readlinkat(
    d: c_int,
    path: *const c_char,
    buf: *mut c_char,
    n: size_t,
) -> ssize_t {
    if n == 0 {
        // Refused before the path is looked at, as the kernel does.
        return fail_ssize(libc::EINVAL);
    }
    // SAFETY: the caller's path.
    let target = match unsafe { route(d, path, false) } {
        Route::Serve(c, p) => {
            let _in = Inside::enter();
            match as_caller(|cred| c.readlink_as(&p, cred)) {
                Ok(t) => Ok(t),
                Err(e) if leaves(&e) => Err(None),
                Err(e) => Err(Some(e.errno())),
            }
        }
        Route::NotDir => Err(Some(libc::ENOTDIR)),
        _ => Err(None),
    };
    match target {
        Ok(_) if buf.is_null() => fail_ssize(libc::EFAULT),
        Ok(t) => {
            // readlink(2) truncates to the buffer and writes no NUL.
            let k = t.len().min(n);
            // SAFETY: the caller's buffer holds `n` bytes; `k <= n`.
            unsafe { std::ptr::copy_nonoverlapping(t.as_ptr(), buf.cast::<u8>(), k) };
            k as ssize_t
        }
        Err(Some(e)) => fail_ssize(e),
        // SAFETY: the caller's arguments, passed on.
        Err(None) => unsafe { real::readlinkat(d, path, buf, n) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { readlinkat(AT_FDCWD, path, buf, n) }
}
