//! The process's effective user and group ids, which every served call asks (a
//! call is served while they are the client's, and checked as them). They are kept
//! here and read again only after the process changes them through the C library
//! (setuid and its family, wrapped below), not with two system calls per call. A
//! program that changes its ids with a raw system call is out of scope, as for every
//! call this library serves.

use std::sync::atomic::{AtomicU64, Ordering};

use libc::{c_int, gid_t, uid_t};

use crate::real;

/// uid << 32 | gid, or [`UNKNOWN`] until read (again).
static IDS: AtomicU64 = AtomicU64::new(UNKNOWN);
const UNKNOWN: u64 = u64::MAX;

/// The effective user and group ids.
pub(crate) fn effective() -> (u32, u32) {
    let v = IDS.load(Ordering::Acquire);
    if v != UNKNOWN {
        return ((v >> 32) as u32, v as u32);
    }
    // SAFETY: geteuid and getegid have no preconditions.
    let (u, g) = unsafe { (libc::geteuid(), libc::getegid()) };
    IDS.store((u64::from(u) << 32) | u64::from(g), Ordering::Release);
    (u, g)
}

/// The ids changed (or may have): read them again at the next call.
fn changed(r: c_int) -> c_int {
    IDS.store(UNKNOWN, Ordering::Release);
    r
}

#[no_mangle]
pub unsafe extern "C" fn setuid(u: uid_t) -> c_int {
    // SAFETY: passed on as given.
    changed(unsafe { real::setuid(u) })
}

#[no_mangle]
pub unsafe extern "C" fn setgid(g: gid_t) -> c_int {
    // SAFETY: passed on as given.
    changed(unsafe { real::setgid(g) })
}

#[no_mangle]
pub unsafe extern "C" fn seteuid(u: uid_t) -> c_int {
    // SAFETY: passed on as given.
    changed(unsafe { real::seteuid(u) })
}

#[no_mangle]
pub unsafe extern "C" fn setegid(g: gid_t) -> c_int {
    // SAFETY: passed on as given.
    changed(unsafe { real::setegid(g) })
}

#[no_mangle]
pub unsafe extern "C" fn setreuid(r: uid_t, e: uid_t) -> c_int {
    // SAFETY: passed on as given.
    changed(unsafe { real::setreuid(r, e) })
}

#[no_mangle]
pub unsafe extern "C" fn setregid(r: gid_t, e: gid_t) -> c_int {
    // SAFETY: passed on as given.
    changed(unsafe { real::setregid(r, e) })
}

#[no_mangle]
pub unsafe extern "C" fn setresuid(r: uid_t, e: uid_t, s: uid_t) -> c_int {
    // SAFETY: passed on as given.
    changed(unsafe { real::setresuid(r, e, s) })
}

#[no_mangle]
pub unsafe extern "C" fn setresgid(r: gid_t, e: gid_t, s: gid_t) -> c_int {
    // SAFETY: passed on as given.
    changed(unsafe { real::setresgid(r, e, s) })
}
