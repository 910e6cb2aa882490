//! Where a file holds data and where it has holes (`lseek` with `SEEK_DATA` and
//! `SEEK_HOLE`). Reading a hole through a shared mapping of a tmpfs file gives it a
//! page, so what reads a sparse pool, or a long range of one, asks here first. On
//! tmpfs a page allocated but never written counts as a hole, and finding a hole
//! walks the pages before it: `next_data` is cheap anywhere, `next_hole` only where
//! the data ends soon.

use std::os::fd::RawFd;

fn seek(fd: RawFd, off: u64, whence: i32) -> Result<u64, i32> {
    // SAFETY: lseek moves the offset of a descriptor the caller holds open; no
    // memory is passed.
    let r = unsafe { libc::lseek(fd, off as libc::off_t, whence) };
    match r {
        r if r >= 0 => Ok(r as u64),
        _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)),
    }
}

/// The first offset at or past `off` that may hold data, `None` if none does. A file
/// system that cannot tell says `off`: all of it may be data.
pub fn next_data(fd: RawFd, off: u64) -> Option<u64> {
    match seek(fd, off, libc::SEEK_DATA) {
        Ok(at) => Some(at),
        Err(libc::ENXIO) => None,
        Err(_) => Some(off),
    }
}

/// The first hole at or past `off` (the file's end counts as one), `u64::MAX` where
/// the file system cannot tell.
pub fn next_hole(fd: RawFd, off: u64) -> u64 {
    seek(fd, off, libc::SEEK_HOLE).unwrap_or(u64::MAX)
}
