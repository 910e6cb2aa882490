//! SIGTERM and SIGINT ask a daemon to stop cleanly. The handler is installed with
//! sigaction directly, replacing whatever was there: a library the fabric loads
//! installs handlers that exit the process, which a chaining handler would still call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// Whether a SIGTERM or SIGINT came since [`stop_flag`] installed the handler.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// A flag that becomes true at the first SIGTERM or SIGINT.
pub fn stop_flag() -> std::io::Result<Arc<AtomicBool>> {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: a zeroed sigaction is a valid empty one; we set a handler that only
        // performs an atomic store, and pass valid pointers to sigaction(2).
        let r = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = libc::SA_RESTART;
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            while !STOP.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
            f.store(true, Ordering::SeqCst);
        })?;
    Ok(flag)
}

/// Starts a child in its own process group (a terminal's Ctrl-C goes to the parent
/// only, which then stops its children in order) and has the kernel send it SIGTERM
/// if the parent dies first.
pub fn detach_and_die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    // SAFETY: getpid only reads this process's id.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the child between fork and exec and only calls
    // prctl(2) and getppid(2), which are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the death signal was asked for: nobody would
            // send it, and the child (holding the pools' lock) would live on.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the parent died while starting"));
            }
            Ok(())
        });
    }
}

/// Sends SIGTERM to `pid`.
pub fn terminate(pid: u32) {
    // SAFETY: kill(2) with a child's pid and a valid signal number.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
}
