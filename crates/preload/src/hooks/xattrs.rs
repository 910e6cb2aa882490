//! Extended attributes by path (following a final symlink or not) and by served
//! descriptor, through the client's, after the caller's access checks
//! (`orion_client::access`: the kernel's namespace rules, then the inode's mode).

use std::ffi::CStr;

use libc::{c_char, c_int, c_void, size_t, ssize_t, AT_FDCWD};
use orion_client::xattr::{self, SetMode};
use orion_client::{Client, FileType, FsResult};

use super::{as_caller, fail, fail_ssize, leaves, root, route, served, with_caller, Route};
use crate::real;
use crate::state::Inside;

/// Whose attributes a call reads or changes.
enum Node {
    /// An inode of the file system (its number and type), through this client.
    Served(&'static Client, u64, FileType),
    /// The kernel's to answer.
    Kernel,
    /// Answered already: this errno.
    Failed(c_int),
}

/// The inode `path` names.
///
/// # Safety
/// `path` is null or NUL-terminated.
unsafe fn by_path(path: *const c_char, follow: bool) -> Node {
    // SAFETY: as the caller.
    match unsafe { route(AT_FDCWD, path, false) } {
        Route::Serve(c, p) => {
            let _in = Inside::enter();
            match as_caller(|cred| c.stat_as(&p, follow, cred)) {
                Ok(a) => Node::Served(c, a.ino, a.ftype),
                Err(e) if leaves(&e) => Node::Kernel,
                Err(e) => Node::Failed(e.errno()),
            }
        }
        Route::NotDir => Node::Failed(libc::ENOTDIR),
        _ => Node::Kernel,
    }
}

fn by_fd(fd: c_int) -> Node {
    match served(fd) {
        Some(f) => Node::Served(f.client, f.ino, FileType::Regular),
        None => Node::Kernel,
    }
}

/// The attribute's name as bytes (`Err`: the errno for a null one).
///
/// # Safety
/// `name` is null or NUL-terminated.
unsafe fn name_of<'a>(name: *const c_char) -> Result<&'a [u8], c_int> {
    // SAFETY: a non-null name is the caller's NUL-terminated string.
    match unsafe { name.as_ref().map(|n| CStr::from_ptr(n)) } {
        Some(n) => Ok(n.to_bytes()),
        None => Err(libc::EFAULT),
    }
}

/// Whether the kernel refuses a user.* name on this type of file before anything
/// else (Linux allows them on regular files and directories only: EPERM to change,
/// ENODATA to read), as it does on the way to the mount.
fn user_refused(name: &[u8], t: FileType) -> bool {
    name.starts_with(b"user.") && !matches!(t, FileType::Regular | FileType::Directory)
}

/// getxattr and listxattr's answer: the size when asked for it (`n` 0), else the
/// bytes if they fit.
///
/// # Safety
/// `out` holds `n` bytes when `n` is not 0.
unsafe fn answer(r: FsResult<Vec<u8>>, out: *mut c_void, n: size_t) -> ssize_t {
    match r {
        Ok(v) if n == 0 => v.len() as ssize_t,
        Ok(v) if v.len() > n => fail_ssize(libc::ERANGE),
        Ok(_) if out.is_null() => fail_ssize(libc::EFAULT),
        Ok(v) => {
            // SAFETY: the caller's buffer holds `n >= v.len()` bytes.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out.cast::<u8>(), v.len()) };
            v.len() as ssize_t
        }
        Err(e) => fail_ssize(e.errno()),
    }
}

/// The client, inode and attribute name a call on `node` serves, or the errno it
/// fails with (`refused` for a user.* name on a file that may not carry one);
/// `None`: the kernel's.
///
/// # Safety
/// `name` is null or NUL-terminated.
#[allow(clippy::type_complexity)]
unsafe fn named<'a>(
    node: Node,
    name: *const c_char,
    refused: c_int,
) -> Option<Result<(&'static Client, u64, &'a [u8]), c_int>> {
    let (c, ino, t) = match node {
        Node::Served(c, ino, t) => (c, ino, t),
        Node::Failed(e) => return Some(Err(e)),
        Node::Kernel => return None,
    };
    // SAFETY: as the caller.
    Some(match unsafe { name_of(name) } {
        Ok(name) if user_refused(name, t) => Err(refused),
        Ok(name) => Ok((c, ino, name)),
        Err(e) => Err(e),
    })
}

/// Whether the caller may read (or `write`) attribute `name` of `ino`, then whether
/// the name is one the file system keeps (the kernel's order).
fn may(c: &Client, ino: u64, name: &[u8], write: bool) -> FsResult<()> {
    with_caller(|cred| c.may_xattr(cred, ino, name, write))?;
    xattr::namespace(name).map(|_| ())
}

/// getxattr on `node`; `None`: the kernel's.
///
/// # Safety
/// As getxattr(2)'s arguments.
unsafe fn get(node: Node, name: *const c_char, v: *mut c_void, n: size_t) -> Option<ssize_t> {
    // SAFETY: as the caller.
    let (c, ino, name) = match unsafe { named(node, name, libc::ENODATA) }? {
        Ok(x) => x,
        Err(e) => return Some(fail_ssize(e)),
    };
    let _in = Inside::enter();
    let r = may(c, ino, name, false).and_then(|_| c.getxattr_ino(ino, name));
    // SAFETY: as the caller.
    Some(unsafe { answer(r, v, n) })
}

/// setxattr on `node`; `None`: the kernel's.
///
/// # Safety
/// As setxattr(2)'s arguments.
unsafe fn set(
    node: Node,
    name: *const c_char,
    v: *const c_void,
    n: size_t,
    fl: c_int,
) -> Option<c_int> {
    // SAFETY: as the caller.
    let (c, ino, name) = match unsafe { named(node, name, libc::EPERM) }? {
        Ok(x) => x,
        Err(e) => return Some(fail(e)),
    };
    if v.is_null() && n != 0 {
        return Some(fail(libc::EFAULT));
    }
    let value = match n {
        0 => &[][..],
        // SAFETY: the caller's value holds `n` bytes.
        n => unsafe { std::slice::from_raw_parts(v.cast::<u8>(), n) },
    };
    let _in = Inside::enter();
    let r = SetMode::from_flags(fl)
        .and_then(|mode| may(c, ino, name, true).map(|_| mode))
        .and_then(|mode| c.setxattr_ino(ino, name, value, mode));
    Some(match r {
        Ok(()) => 0,
        Err(e) => fail(e.errno()),
    })
}

/// listxattr on `node`; `None`: the kernel's.
///
/// # Safety
/// As listxattr(2)'s arguments.
unsafe fn list(node: Node, out: *mut c_char, n: size_t) -> Option<ssize_t> {
    match node {
        Node::Served(c, ino, _) => {
            let _in = Inside::enter();
            // SAFETY: as the caller.
            Some(unsafe { answer(c.listxattr_ino(ino, root()), out.cast(), n) })
        }
        Node::Failed(e) => Some(fail_ssize(e)),
        Node::Kernel => None,
    }
}

/// removexattr on `node`; `None`: the kernel's.
///
/// # Safety
/// As removexattr(2)'s arguments.
unsafe fn remove(node: Node, name: *const c_char) -> Option<c_int> {
    // SAFETY: as the caller.
    let (c, ino, name) = match unsafe { named(node, name, libc::EPERM) }? {
        Ok(x) => x,
        Err(e) => return Some(fail(e)),
    };
    let _in = Inside::enter();
    Some(
        match may(c, ino, name, true).and_then(|_| c.removexattr_ino(ino, name)) {
            Ok(()) => 0,
            Err(e) => fail(e.errno()),
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn getxattr(
    p: *const c_char,
    name: *const c_char,
    v: *mut c_void,
    n: size_t,
) -> ssize_t {
    // SAFETY: the caller's arguments, served or passed on.
    unsafe { get(by_path(p, true), name, v, n).unwrap_or_else(|| real::getxattr(p, name, v, n)) }
}

#[no_mangle]
pub unsafe extern "C" fn lgetxattr(
    p: *const c_char,
    name: *const c_char,
    v: *mut c_void,
    n: size_t,
) -> ssize_t {
    // SAFETY: the caller's arguments, served or passed on.
    unsafe { get(by_path(p, false), name, v, n).unwrap_or_else(|| real::lgetxattr(p, name, v, n)) }
}

#[no_mangle]
pub unsafe extern "C" fn fgetxattr(
    fd: c_int,
    name: *const c_char,
    v: *mut c_void,
    n: size_t,
) -> ssize_t {
    // SAFETY: the caller's arguments, served or passed on.
    unsafe { get(by_fd(fd), name, v, n).unwrap_or_else(|| real::fgetxattr(fd, name, v, n)) }
}

#[no_mangle]
pub unsafe extern "C" fn setxattr(
    p: *const c_char,
    name: *const c_char,
    v: *const c_void,
    n: size_t,
    fl: c_int,
) -> c_int {
    // SAFETY: the caller's arguments, served or passed on.
    unsafe {
        set(by_path(p, true), name, v, n, fl).unwrap_or_else(|| real::setxattr(p, name, v, n, fl))
    }
}

#[no_mangle]
pub unsafe extern "C" fn lsetxattr(
    p: *const c_char,
    name: *const c_char,
    v: *const c_void,
    n: size_t,
    fl: c_int,
) -> c_int {
    // SAFETY: the caller's arguments, served or passed on.
    unsafe {
        set(by_path(p, false), name, v, n, fl).unwrap_or_else(|| real::lsetxattr(p, name, v, n, fl))
    }
}

#[no_mangle]
pub unsafe extern "C" fn fsetxattr(
    fd: c_int,
    name: *const c_char,
    v: *const c_void,
    n: size_t,
    fl: c_int,
) -> c_int {
    // SAFETY: the caller's arguments, served or passed on.
    unsafe { set(by_fd(fd), name, v, n, fl).unwrap_or_else(|| real::fsetxattr(fd, name, v, n, fl)) }
}

#[no_mangle]
pub unsafe extern "C" fn listxattr(p: *const c_char, out: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments, served or passed on.
    unsafe { list(by_path(p, true), out, n).unwrap_or_else(|| real::listxattr(p, out, n)) }
}

#[no_mangle]
pub unsafe extern "C" fn llistxattr(p: *const c_char, out: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments, served or passed on.
    unsafe { list(by_path(p, false), out, n).unwrap_or_else(|| real::llistxattr(p, out, n)) }
}

#[no_mangle]
pub unsafe extern "C" fn flistxattr(fd: c_int, out: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments, served or passed on.
    unsafe { list(by_fd(fd), out, n).unwrap_or_else(|| real::flistxattr(fd, out, n)) }
}

#[no_mangle]
pub unsafe extern "C" fn removexattr(p: *const c_char, name: *const c_char) -> c_int {
    // SAFETY: the caller's arguments, served or passed on.
    unsafe { remove(by_path(p, true), name).unwrap_or_else(|| real::removexattr(p, name)) }
}

#[no_mangle]
pub unsafe extern "C" fn lremovexattr(p: *const c_char, name: *const c_char) -> c_int {
    // SAFETY: the caller's arguments, served or passed on.
    unsafe { remove(by_path(p, false), name).unwrap_or_else(|| real::lremovexattr(p, name)) }
}

#[no_mangle]
pub unsafe extern "C" fn fremovexattr(fd: c_int, name: *const c_char) -> c_int {
    // SAFETY: the caller's arguments, served or passed on.
    unsafe { remove(by_fd(fd), name).unwrap_or_else(|| real::fremovexattr(fd, name)) }
}
