//! Names: mkdir, rmdir, unlink and rename under the mount, served through the
//! client so that a file this process holds open outlives its name.

use libc::{c_char, c_int, c_uint, mode_t, AT_FDCWD, AT_REMOVEDIR};
use orion_client::{FsResult, RenameMode};

use super::{fail, leaves, route, Route};
use crate::paths::kernel_holds;
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
            done(
                c.mkdir(&p, mode & 0o7777 & !super::open::current_umask())
                    .map(|_| ()),
            )
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
                true => done(c.rmdir(&p)),
                // A file this process holds through the kernel: the mount keeps it.
                false if kernel_holds(&p) => None,
                false => done(c.unlink(&p)),
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
    let served = match (a, b) {
        (Route::Serve(c, p), Route::Serve(_, q)) => {
            let _in = Inside::enter();
            // A target this process holds through the kernel: the mount keeps it.
            match mode == RenameMode::Replace && kernel_holds(&q) {
                true => None,
                false => done(c.rename_with(&p, &q, mode)),
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
