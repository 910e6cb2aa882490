//! Which calls are this library's: a path (with the directory descriptor it is
//! relative to) names a file under the Orion mount, or anything else (the C
//! library's). Paths the client cannot resolve alone (a trailing slash, bytes that
//! are not UTF-8) are left to the kernel, which reaches the same files through the
//! mount.

use std::ffi::CStr;

use libc::{c_int, AT_FDCWD};

use crate::state::{settings, Settings};
use crate::{real, table};

/// Where a path leads.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    /// Under the mount: this path, from the file system's root ("/a/b").
    Orion(String),
    /// A descriptor this library serves (an empty path with `AT_EMPTY_PATH`).
    OrionFd(c_int),
    /// Anything else: the C library's.
    Kernel,
    /// A path relative to a descriptor of a regular file this library serves.
    NotDir,
}

/// Where `path`, relative to `dirfd` (or the working directory), leads.
pub fn classify(dirfd: c_int, path: &CStr, empty_path: bool) -> Target {
    let Some(s) = settings() else {
        return Target::Kernel;
    };
    let bytes = path.to_bytes();
    if bytes.is_empty() {
        return match (empty_path, table::is_ours(dirfd)) {
            (true, true) => Target::OrionFd(dirfd),
            _ => Target::Kernel,
        };
    }
    let Ok(p) = std::str::from_utf8(bytes) else {
        return Target::Kernel;
    };
    if p.ends_with('/') && p.len() > 1 {
        return Target::Kernel;
    }
    if p.starts_with('/') {
        return inside(s, p);
    }
    if dirfd != AT_FDCWD {
        match table::get(dirfd) {
            // Paths from a served directory start at its kernel descriptor.
            Some(f) if f.dir => table::hand_over(dirfd),
            Some(_) => return Target::NotDir,
            None => {}
        }
    }
    let base = match dirfd {
        AT_FDCWD => cwd(),
        fd => fd_path(fd),
    };
    match base {
        Some(b) => inside(s, &format!("{b}/{p}")),
        None => Target::Kernel,
    }
}

/// `p` (absolute) inside the mount, as a path from its root.
fn inside(s: &Settings, p: &str) -> Target {
    let Some(rest) = p.strip_prefix(s.mount.as_str()) else {
        return Target::Kernel;
    };
    if rest.is_empty() {
        return Target::Orion("/".into());
    }
    if !rest.starts_with('/') {
        // "/mnt/orionfoo" is not under "/mnt/orion".
        return Target::Kernel;
    }
    Target::Orion(rest.to_string())
}

/// The working directory (the kernel's: a chdir into the mount goes through it).
fn cwd() -> Option<String> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: getcwd writes at most buf.len() bytes into a buffer we own.
    let r = unsafe { real::getcwd(buf.as_mut_ptr().cast(), buf.len()) };
    if r.is_null() {
        return None;
    }
    let n = buf.iter().position(|&b| b == 0)?;
    buf.truncate(n);
    String::from_utf8(buf).ok()
}

/// The path a kernel descriptor was opened at (a directory under the mount, for
/// `openat` and friends).
fn fd_path(fd: c_int) -> Option<String> {
    let link = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).ok()?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: readlink writes at most buf.len() bytes into a buffer we own.
    let n = unsafe { real::readlink(link.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 || n as usize >= buf.len() {
        return None;
    }
    buf.truncate(n as usize);
    let p = String::from_utf8(buf).ok()?;
    p.starts_with('/').then_some(p)
}
