//! Futex wait and wake on a 32-bit word in shared memory (cross-process: no FUTEX_PRIVATE).

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `*word == expected`, for at most `timeout`. Spurious returns are allowed.
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call (a reference);
    // FUTEX_WAIT only reads it. The timespec lives on this stack frame.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            0usize,
            0u32,
        );
    }
}

/// Wakes every thread (of any process) sleeping on `word`.
pub(crate) fn wake_all(word: &AtomicU32) {
    // SAFETY: as above; FUTEX_WAKE does not access the word's memory beyond its address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        );
    }
}
