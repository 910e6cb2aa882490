//! SIGTERM and SIGINT ask a daemon to stop cleanly. The handler is installed with
//! sigaction directly, replacing whatever was there: a library the fabric loads
//! installs handlers that exit the process, which a chaining handler would still call.
//!
//! The handler also writes a byte to a pipe that the thread raising the stop flag
//! sleeps on (the self-pipe way), so an idle daemon has no thread waking to look.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

static STOP: AtomicBool = AtomicBool::new(false);
/// The pipe's write end, once [`stop_flag`] made it (-1 before).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(_: libc::c_int) {
    // An atomic store and write(2): both async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: __errno_location is this thread's errno, live as long as the
        // thread; the handler gives back the errno it interrupted (write may set it).
        let errno = unsafe { *libc::__errno_location() };
        let b = 1u8;
        // SAFETY: writes one byte from this frame to a descriptor this process made
        // for it and never closes; a full pipe (a reader already woken) is ignored.
        unsafe { libc::write(fd, (&b as *const u8).cast(), 1) };
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
    }
}

/// Whether a SIGTERM or SIGINT came since [`stop_flag`] installed the handler.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// A flag that becomes true at the first SIGTERM or SIGINT (one flag per process:
/// every call returns it).
pub fn stop_flag() -> std::io::Result<Arc<AtomicBool>> {
    static FLAG: std::sync::Mutex<Option<Arc<AtomicBool>>> = std::sync::Mutex::new(None);
    let mut made = FLAG.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(f) = made.as_ref() {
        return Ok(f.clone());
    }
    let mut fds = [-1; 2];
    // SAFETY: pipe2 fills the two-element array on this frame.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    WAKE_FD.store(fds[1], Ordering::SeqCst);
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: a zeroed sigaction is a valid empty one; we set a handler that only
        // performs an atomic store and a write, and pass valid pointers to sigaction(2).
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
    let read_fd = fds[0];
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            while !STOP.load(Ordering::SeqCst) {
                let mut p = libc::pollfd {
                    fd: read_fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd on this frame; the pipe's read end stays open for
                // the life of the process. The timeout only bounds a lost wake-up
                // (the handler writes the pipe after it sets STOP).
                unsafe { libc::poll(&mut p, 1, 10_000) };
            }
            f.store(true, Ordering::SeqCst);
        })?;
    *made = Some(flag.clone());
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
