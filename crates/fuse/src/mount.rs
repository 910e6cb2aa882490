//! Mounting and unmounting: options, the serving loop, a clean unmount when asked to
//! stop, and the clean-up of a mount left behind by a process that died.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fuser::{Config, Filesystem, MountOption, Notifier, Session, SessionACL};

#[derive(Clone, Debug)]
pub struct MountOptions {
    pub mountpoint: PathBuf,
    /// Let every local user use the mount (`allow_other`); the kernel then checks
    /// each caller's permissions against the files' modes.
    pub allow_other: bool,
    /// Threads serving kernel requests.
    pub threads: usize,
    /// Let the kernel check permissions too (`default_permissions`), besides the file
    /// system's own checks. Off, only the file system checks: each request is still
    /// refused or allowed as Linux would, but the kernel no longer checks search
    /// permission while it walks a path, so when two errors apply the one reported
    /// may differ from Linux's (tests turn it off to reach the file system's checks).
    pub kernel_permissions: bool,
}

/// True when `path` is a FUSE mount whose server is gone: every access fails with
/// ENOTCONN.
fn is_stale(path: &Path) -> bool {
    matches!(std::fs::metadata(path), Err(e) if e.raw_os_error() == Some(libc::ENOTCONN))
}

/// Detaches a mount at `path` left behind by a crashed `orion mount`; returns whether
/// there was one. A live mount is left alone.
pub fn unmount_stale(path: &Path) -> io::Result<bool> {
    if !is_stale(path) {
        return Ok(false);
    }
    detach(path)?;
    Ok(true)
}

/// Lazily unmounts `path` (root: umount2; otherwise the setuid fusermount3).
pub fn detach(path: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    // SAFETY: c is a valid NUL-terminated path; umount2 only reads it.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let first = io::Error::last_os_error();
    let out = std::process::Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(path)
        .output();
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(io::Error::other(format!(
            "cannot unmount {}: {first}; fusermount3: {}",
            path.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ))),
        Err(_) => Err(io::Error::other(format!(
            "cannot unmount {}: {first}",
            path.display()
        ))),
    }
}

/// Mounts `fs` (an [`OrionFs`], or the benchmarks' passthrough) at the mountpoint and
/// serves kernel requests until the file system is unmounted (by `umount`, `orion
/// umount`) or `stop` becomes true; then unmounts. `ready` runs once the mount is in
/// place, with what sends the kernel notifications (cache invalidations).
pub fn mount(
    fs: impl Filesystem,
    opts: &MountOptions,
    stop: Arc<AtomicBool>,
    ready: impl FnOnce(Notifier),
) -> io::Result<()> {
    let path = &opts.mountpoint;
    if unmount_stale(path)? {
        tracing::info!("cleaned up a stale mount at {}", path.display());
    }
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("orionfs".into()),
        MountOption::Subtype("orion".into()),
        MountOption::NoAtime,
    ];
    // The file system checks modes, owners, groups (with the caller's supplementary
    // groups), sticky directories and setattr rights itself (`OrionFs::may*`), with
    // the MDS's current attributes; the kernel checks as well by default, so that
    // path walks check search permission in Linux's order.
    if opts.kernel_permissions {
        config.mount_options.push(MountOption::DefaultPermissions);
    }
    if opts.allow_other {
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = opts.threads > 1;
    let mut session = Session::new(fs, path, &config).map_err(|e| {
        let hint = if e.kind() == io::ErrorKind::PermissionDenied && !is_root() {
            " (an ordinary user needs /dev/fuse readable and writable by all, as \
             distributions ship it: scripts/setup does that; and user_allow_other in \
             /etc/fuse.conf unless --private)"
        } else {
            ""
        };
        io::Error::new(
            e.kind(),
            format!("cannot mount at {}: {e}{hint}", path.display()),
        )
    })?;
    let mut unmounter = session.unmount_callable();
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let done = done.clone();
        let path = path.clone();
        std::thread::Builder::new()
            .name("unmount-on-stop".into())
            .spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    if stop.load(Ordering::SeqCst) {
                        if let Err(e) = unmounter.unmount() {
                            tracing::warn!("unmounting {}: {e}; detaching it", path.display());
                            let _ = detach(&path);
                        }
                        return;
                    }
                    // Four looks a second: a stop waits at most that long to unmount,
                    // and an idle mount barely wakes.
                    std::thread::sleep(Duration::from_millis(250));
                }
            })?
    };
    ready(session.notifier());
    let r = session.run();
    done.store(true, Ordering::SeqCst);
    let _ = watcher.join();
    r
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
