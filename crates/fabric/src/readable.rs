//! Sleeping until a descriptor is readable (`poll(2)`), for the listener: an idle server's
//! acceptor threads then cost nothing until a peer connects, where polling a non-blocking
//! `accept` on a short sleep woke each of them hundreds of times a second. And ending
//! those sleeps when the server stops (`shutdown(2)` of the listening socket).

use std::os::fd::AsRawFd;
use std::time::Duration;

/// Sleeps until `fd` is readable (for a listener: a connection waits to be accepted), an
/// error or hang-up is pending on it, or `timeout` passes. Returns whether it is ready;
/// an interrupted sleep returns false (the caller polls again).
pub(crate) fn wait(fd: &impl AsRawFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // Rounded up: a sleep rounded down to 0 ms would return at once, and the caller
    // would spin through the last millisecond of its deadline.
    let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `p` is one pollfd on this frame, valid for the call, and the count says one;
    // the descriptor is borrowed from a live owner for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n > 0
}

/// Wakes every thread sleeping in [`wait`] on the listening socket `fd`, and makes later
/// waits return at once: a listener shut down for reading reports itself readable, and
/// its `accept` fails. Used once a server stops.
pub(crate) fn shut(fd: &impl AsRawFd) {
    // SAFETY: shutdown(2) on a descriptor borrowed from a live owner; it touches no
    // memory of this process.
    unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RD) };
}
