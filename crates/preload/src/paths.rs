//! Which calls are this library's: a path (with the directory descriptor it is
//! relative to) names a file under the Orion mount, or anything else (the C
//! library's). Paths the client cannot resolve alone (a trailing slash, bytes that
//! are not UTF-8) are left to the kernel, which reaches the same files through the
//! mount.

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};

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
    if dirfd != AT_FDCWD && table::is_ours(dirfd) {
        return Target::NotDir;
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

/// Whether a descriptor the kernel serves in this process (a file opened by stdio,
/// mapped, locked through the mount, or handed to the kernel at a fork) is open on
/// `p`, a path from the file system's root. Removing that name must then go through
/// the kernel, whose mount keeps the file for its descriptor; the client library
/// knows only its own. Compares paths, so a name reached through a symlinked
/// directory is not recognized.
pub fn kernel_holds(p: &str) -> bool {
    let Some(s) = settings() else {
        return false;
    };
    if !KERNEL_FILES.load(Ordering::Relaxed) && !inherited_kernel_files(s) {
        return false;
    }
    let parts: Vec<&str> = p
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    let want = format!("{}/{}", s.mount, parts.join("/"));
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return false;
    };
    dir.flatten().any(|e| {
        let fd = e.file_name().to_str().and_then(|n| n.parse::<c_int>().ok());
        // Not the library's own (its client's sockets and files), nor one it serves.
        if fd.is_none_or(|fd| fd >= crate::state::own_floor() || table::is_ours(fd)) {
            return false;
        }
        std::fs::read_link(e.path())
            .is_ok_and(|l| l.as_os_str().as_encoded_bytes() == want.as_bytes())
    })
}

/// Set once this process may hold a kernel descriptor of a file under the mount
/// (one went to the kernel, a path under the mount was opened by the kernel, stdio
/// opened one): only then does [`kernel_holds`] look through `/proc/self/fd`.
static KERNEL_FILES: AtomicBool = AtomicBool::new(false);

/// Notes that the kernel may now hold a file under the mount.
pub fn kernel_may_hold() {
    KERNEL_FILES.store(true, Ordering::Relaxed);
}

/// Notes it if `path` (relative to `dirfd`) is under the mount.
pub fn note_kernel_open(dirfd: c_int, path: &CStr) {
    if !KERNEL_FILES.load(Ordering::Relaxed)
        && matches!(classify(dirfd, path, false), Target::Orion(_))
    {
        kernel_may_hold();
    }
}

/// Whether the process started with descriptors of regular files under the mount
/// (inherited across exec); asked once, at the first unlink or rename. Directories do
/// not count: the mount keeps no file alive for them (and a program removing a tree
/// holds one open at that first call).
fn inherited_kernel_files(s: &Settings) -> bool {
    static INHERITED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *INHERITED.get_or_init(|| {
        let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
            return true;
        };
        let mount = s.mount.as_bytes();
        dir.flatten().any(|e| {
            let fd = e.file_name().to_str().and_then(|n| n.parse::<c_int>().ok());
            let under = std::fs::read_link(e.path()).is_ok_and(|l| {
                let l = l.as_os_str().as_encoded_bytes();
                l.starts_with(mount) && matches!(l.get(mount.len()), None | Some(b'/'))
            });
            under && fd.is_some_and(is_regular)
        })
    })
}

/// Whether kernel descriptor `fd` is open on a regular file.
fn is_regular(fd: c_int) -> bool {
    // SAFETY: stat64 is plain integers: all zeros is a valid value.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into a struct we own; a closed descriptor only fails.
    unsafe { real::fstat64(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG }
}
