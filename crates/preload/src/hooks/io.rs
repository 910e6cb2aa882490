//! Reading and writing served descriptors: read, write and their positioned and
//! vectored forms, lseek, fsync, ftruncate, fallocate, sendfile, copy_file_range.

use std::sync::Arc;

use libc::{c_int, c_void, iovec, off_t, size_t, ssize_t};

use super::{fail, fail_ssize, served};
use crate::real;
use crate::state::Inside;
use crate::table::{readable, writable, OpenFile};

/// Bytes one call asks the client for at most (a larger read loops).
const PIECE: usize = 8 << 20;

/// Reads into `buf` at `off` (the file offset when `None`, which advances).
fn read_into(f: &OpenFile, buf: &mut [u8], off: Option<u64>) -> Result<usize, c_int> {
    if !readable(f.flags) {
        return Err(libc::EBADF);
    }
    let _offset = off
        .is_none()
        .then(|| f.offset.lock().unwrap_or_else(|e| e.into_inner()));
    let mut done = 0;
    while done < buf.len() {
        let want = (buf.len() - done).min(PIECE);
        let got = match off {
            Some(o) => f.client.pread(f.fd, o + done as u64, want),
            None => f.client.read(f.fd, want),
        }
        .map_err(|e| e.errno())?;
        // The client returns at most what was asked: the copy stays in `want`.
        debug_assert!(
            got.len() <= want,
            "{} bytes read of {want} asked",
            got.len()
        );
        orion_client::copy_bytes(&mut buf[done..done + got.len()], &got);
        done += got.len();
        if got.len() < want {
            break;
        }
    }
    Ok(done)
}

/// Writes `data` at `off` (the file offset when `None`, which advances).
fn write_from(f: &OpenFile, data: &[u8], off: Option<u64>) -> Result<usize, c_int> {
    if !writable(f.flags) {
        return Err(libc::EBADF);
    }
    let _offset = off
        .is_none()
        .then(|| f.offset.lock().unwrap_or_else(|e| e.into_inner()));
    let n = match off {
        Some(o) => f.client.pwrite(f.fd, o, data),
        None => f.client.write(f.fd, data),
    }
    .map_err(|e| e.errno())?;
    debug_assert!(n <= data.len(), "{n} bytes written of {} given", data.len());
    if n > 0 {
        kill_setid(f).map_err(|e| e.errno())?;
    }
    if f.sync() {
        f.client.fsync(f.fd).map_err(|e| e.errno())?;
    }
    Ok(n)
}

fn ssize(r: Result<usize, c_int>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => fail_ssize(e),
    }
}

/// A served descriptor's file, with this thread marked inside the library.
fn file(fd: c_int) -> Option<(Arc<OpenFile>, Inside)> {
    served(fd).map(|f| (f, Inside::enter()))
}

/// # Safety
/// `buf` is valid for `n` bytes of writing.
unsafe fn read_at(fd: c_int, buf: *mut c_void, n: size_t, off: Option<off_t>) -> ssize_t {
    let Some((f, _in)) = file(fd) else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe {
            match off {
                Some(o) => real::pread64(fd, buf, n, o),
                None => real::read(fd, buf, n),
            }
        };
    };
    if off.is_some_and(|o| o < 0) {
        return fail_ssize(libc::EINVAL);
    }
    if n == 0 {
        return 0;
    }
    if buf.is_null() {
        return fail_ssize(libc::EFAULT);
    }
    // SAFETY: the caller's buffer of n bytes.
    let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) };
    ssize(read_into(&f, b, off.map(|o| o as u64)))
}

/// # Safety
/// `buf` is valid for `n` bytes of reading.
unsafe fn write_at(fd: c_int, buf: *const c_void, n: size_t, off: Option<off_t>) -> ssize_t {
    let Some((f, _in)) = file(fd) else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe {
            match off {
                Some(o) => real::pwrite64(fd, buf, n, o),
                None => real::write(fd, buf, n),
            }
        };
    };
    if off.is_some_and(|o| o < 0) {
        return fail_ssize(libc::EINVAL);
    }
    if n == 0 {
        return 0;
    }
    if buf.is_null() {
        return fail_ssize(libc::EFAULT);
    }
    // SAFETY: the caller's buffer of n bytes.
    let b = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) };
    ssize(write_from(&f, b, off.map(|o| o as u64)))
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { read_at(fd, buf, n, None) }
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, _: size_t) -> ssize_t {
    // SAFETY: the caller's arguments (the compiler checked the buffer's size).
    unsafe { read_at(fd, buf, n, None) }
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { write_at(fd, buf, n, None) }
}

#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { read_at(fd, buf, n, Some(off)) }
}

#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { read_at(fd, buf, n, Some(off)) }
}

#[no_mangle]
pub unsafe extern "C" fn __pread64_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    off: off_t,
    _: size_t,
) -> ssize_t {
    // SAFETY: the caller's arguments (the compiler checked the buffer's size).
    unsafe { read_at(fd, buf, n, Some(off)) }
}

#[no_mangle]
pub unsafe extern "C" fn __pread_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    off: off_t,
    _: size_t,
) -> ssize_t {
    // SAFETY: the caller's arguments (the compiler checked the buffer's size).
    unsafe { read_at(fd, buf, n, Some(off)) }
}

#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { write_at(fd, buf, n, Some(off)) }
}

#[no_mangle]
pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { write_at(fd, buf, n, Some(off)) }
}

/// The caller's iovec array as slices.
///
/// # Safety
/// `iov` points to `n` valid iovecs.
unsafe fn iovecs<'a>(iov: *const iovec, n: c_int) -> Option<&'a [iovec]> {
    if !(0..=libc::UIO_MAXIOV).contains(&n) || (iov.is_null() && n > 0) {
        return None;
    }
    if n == 0 {
        return Some(&[]);
    }
    // SAFETY: the caller's array of n iovecs.
    Some(unsafe { std::slice::from_raw_parts(iov, n as usize) })
}

/// # Safety
/// `iov` points to `n` iovecs, each valid for writing.
unsafe fn readv_at(fd: c_int, iov: *const iovec, n: c_int, off: Option<off_t>) -> ssize_t {
    let Some((f, _in)) = file(fd) else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe {
            match off {
                Some(o) => real::preadv64(fd, iov, n, o),
                None => real::readv(fd, iov, n),
            }
        };
    };
    // SAFETY: as the caller.
    let Some(v) = (unsafe { iovecs(iov, n) }) else {
        return fail_ssize(libc::EINVAL);
    };
    if off.is_some_and(|o| o < 0) {
        return fail_ssize(libc::EINVAL);
    }
    let total: usize = v.iter().map(|x| x.iov_len).sum();
    let mut buf = vec![0u8; total];
    let got = match read_into(&f, &mut buf, off.map(|o| o as u64)) {
        Ok(g) => g,
        Err(e) => return fail_ssize(e),
    };
    let mut at = 0;
    for x in v {
        let k = x.iov_len.min(got - at);
        if k == 0 {
            continue;
        }
        // SAFETY: the caller's buffer of iov_len bytes; k is at most that.
        unsafe { std::ptr::copy_nonoverlapping(buf[at..].as_ptr(), x.iov_base.cast(), k) };
        at += k;
    }
    // What was read fits the buffers it was read for: all of it went out.
    debug_assert_eq!(at, got, "{at} bytes of {got} read reached the caller");
    got as ssize_t
}

/// # Safety
/// `iov` points to `n` iovecs, each valid for reading.
unsafe fn writev_at(fd: c_int, iov: *const iovec, n: c_int, off: Option<off_t>) -> ssize_t {
    let Some((f, _in)) = file(fd) else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe {
            match off {
                Some(o) => real::pwritev64(fd, iov, n, o),
                None => real::writev(fd, iov, n),
            }
        };
    };
    // SAFETY: as the caller.
    let Some(v) = (unsafe { iovecs(iov, n) }) else {
        return fail_ssize(libc::EINVAL);
    };
    if off.is_some_and(|o| o < 0) {
        return fail_ssize(libc::EINVAL);
    }
    let mut buf = Vec::with_capacity(v.iter().map(|x| x.iov_len).sum());
    for x in v {
        if x.iov_len > 0 {
            // SAFETY: the caller's buffer of iov_len bytes.
            buf.extend_from_slice(unsafe {
                std::slice::from_raw_parts(x.iov_base.cast::<u8>(), x.iov_len)
            });
        }
    }
    if buf.is_empty() {
        return 0;
    }
    ssize(write_from(&f, &buf, off.map(|o| o as u64)))
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { readv_at(fd, iov, n, None) }
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { writev_at(fd, iov, n, None) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { readv_at(fd, iov, n, Some(off)) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv64(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { readv_at(fd, iov, n, Some(off)) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { writev_at(fd, iov, n, Some(off)) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { writev_at(fd, iov, n, Some(off)) }
}

/// preadv2/pwritev2 with flags (RWF_*): served ones go to the kernel first.
#[no_mangle]
pub unsafe extern "C" fn preadv2(
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: off_t,
    fl: c_int,
) -> ssize_t {
    if fl == 0 && served(fd).is_some() {
        // SAFETY: the caller's arguments.
        return unsafe { readv_at(fd, iov, n, (off != -1).then_some(off)) };
    }
    super::fds::kernel_fd(fd);
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::preadv64v2(fd, iov, n, off, fl) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev2(
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: off_t,
    fl: c_int,
) -> ssize_t {
    if fl == 0 && served(fd).is_some() {
        // SAFETY: the caller's arguments.
        return unsafe { writev_at(fd, iov, n, (off != -1).then_some(off)) };
    }
    super::fds::kernel_fd(fd);
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::pwritev64v2(fd, iov, n, off, fl) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv64v2(
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: off_t,
    fl: c_int,
) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { preadv2(fd, iov, n, off, fl) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64v2(
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: off_t,
    fl: c_int,
) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { pwritev2(fd, iov, n, off, fl) }
}

fn seek(f: &OpenFile, off: off_t, whence: c_int) -> Result<off_t, c_int> {
    let _offset = f.offset.lock().unwrap_or_else(|e| e.into_inner());
    let cur = f.client.position(f.fd).map_err(|e| e.errno())? as i64;
    let size =
        || -> Result<i64, c_int> { Ok(f.client.fstat(f.fd).map_err(|e| e.errno())?.size as i64) };
    let to = match whence {
        libc::SEEK_SET => off,
        libc::SEEK_CUR => cur.checked_add(off).ok_or(libc::EOVERFLOW)?,
        libc::SEEK_END => size()?.checked_add(off).ok_or(libc::EOVERFLOW)?,
        // Holes read as zeroes: all of the file is data, its end the one hole.
        libc::SEEK_DATA if off >= 0 && off < size()? => off,
        libc::SEEK_HOLE if off >= 0 && off < size()? => size()?,
        libc::SEEK_DATA | libc::SEEK_HOLE => return Err(libc::ENXIO),
        _ => return Err(libc::EINVAL),
    };
    if to < 0 {
        return Err(libc::EINVAL);
    }
    f.client.seek(f.fd, to as u64).map_err(|e| e.errno())?;
    Ok(to)
}

#[no_mangle]
pub unsafe extern "C" fn lseek(fd: c_int, off: off_t, whence: c_int) -> off_t {
    let Some((f, _in)) = file(fd) else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real::lseek64(fd, off, whence) };
    };
    match seek(&f, off, whence) {
        Ok(o) => o,
        Err(e) => fail(e) as off_t,
    }
}

#[no_mangle]
pub unsafe extern "C" fn lseek64(fd: c_int, off: off_t, whence: c_int) -> off_t {
    // SAFETY: the caller's arguments.
    unsafe { lseek(fd, off, whence) }
}

/// fsync and fdatasync of a served descriptor (`None`: not served).
fn sync(fd: c_int) -> Option<c_int> {
    let f = super::served_any(fd)?;
    // A directory's entries are durable when the calls that made them return.
    if f.dir {
        return Some(0);
    }
    let _in = Inside::enter();
    Some(match f.client.fsync(f.fd) {
        Ok(()) => 0,
        Err(e) => fail(e.errno()),
    })
}

#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    // SAFETY: the caller's descriptor, passed on.
    sync(fd).unwrap_or_else(|| unsafe { real::fsync(fd) })
}

#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    // SAFETY: the caller's descriptor, passed on.
    sync(fd).unwrap_or_else(|| unsafe { real::fdatasync(fd) })
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off_t) -> c_int {
    let Some((f, _in)) = file(fd) else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real::ftruncate64(fd, len) };
    };
    if len < 0 {
        return fail(libc::EINVAL);
    }
    match (f.client.ftruncate(f.fd, len as u64)).and_then(|_| kill_setid(&f)) {
        Ok(()) => 0,
        Err(e) => fail(e.errno()),
    }
}

/// A write or truncation by a caller without CAP_FSETID drops the file's setuid bit
/// (and setgid with group-execute), as Linux does: else it could plant code in a
/// setuid program. The client asks its own copy of the inode (no network when
/// neither bit is set).
fn kill_setid(f: &OpenFile) -> orion_client::FsResult<()> {
    match super::root() {
        true => Ok(()),
        false => f.client.kill_setid(f.ino),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off_t) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { ftruncate(fd, len) }
}

fn allocate(f: &OpenFile, mode: c_int, off: off_t, len: off_t) -> Result<(), c_int> {
    if off < 0 || len <= 0 {
        return Err(libc::EINVAL);
    }
    if !writable(f.flags) {
        return Err(libc::EBADF);
    }
    (f.client.fallocate(f.fd, mode, off as u64, len as u64))
        .and_then(|_| kill_setid(f))
        .map_err(|e| e.errno())
}

#[no_mangle]
pub unsafe extern "C" fn fallocate(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int {
    let Some((f, _in)) = file(fd) else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real::fallocate64(fd, mode, off, len) };
    };
    match allocate(&f, mode, off, len) {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fallocate64(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { fallocate(fd, mode, off, len) }
}

/// posix_fallocate returns the error rather than setting errno.
#[no_mangle]
pub unsafe extern "C" fn posix_fallocate(fd: c_int, off: off_t, len: off_t) -> c_int {
    let Some((f, _in)) = file(fd) else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real::posix_fallocate64(fd, off, len) };
    };
    match allocate(&f, 0, off, len) {
        Ok(()) => 0,
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, off: off_t, len: off_t) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { posix_fallocate(fd, off, len) }
}

/// Advice is accepted and ignored for served descriptors (as many file systems do).
#[no_mangle]
pub unsafe extern "C" fn posix_fadvise(fd: c_int, off: off_t, len: off_t, advice: c_int) -> c_int {
    if served(fd).is_some() {
        return 0;
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::posix_fadvise64(fd, off, len, advice) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fadvise64(
    fd: c_int,
    off: off_t,
    len: off_t,
    advice: c_int,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { posix_fadvise(fd, off, len, advice) }
}

/// sendfile with a served end: copied through this library's read and write.
#[no_mangle]
pub unsafe extern "C" fn sendfile(out: c_int, input: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    if served(out).is_none() && served(input).is_none() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real::sendfile64(out, input, off, n) };
    }
    let mut buf = vec![0u8; n.min(1 << 20)];
    let mut done = 0usize;
    while done < n {
        let want = (n - done).min(buf.len());
        // SAFETY: `off` is null or the caller's offset; buf is ours.
        let got = unsafe {
            match off.as_mut() {
                Some(o) => read_at(input, buf.as_mut_ptr().cast(), want, Some(*o)),
                None => read_at(input, buf.as_mut_ptr().cast(), want, None),
            }
        };
        if got < 0 {
            return if done > 0 { done as ssize_t } else { -1 };
        }
        if got == 0 {
            break;
        }
        // SAFETY: `off` is null or the caller's offset.
        if let Some(o) = unsafe { off.as_mut() } {
            *o += got as off_t;
        }
        let mut at = 0usize;
        while at < got as usize {
            // SAFETY: our buffer, `got` bytes filled.
            let w = unsafe { write_at(out, buf[at..].as_ptr().cast(), got as usize - at, None) };
            if w < 0 {
                return if done > 0 { done as ssize_t } else { -1 };
            }
            at += w as usize;
        }
        done += got as usize;
    }
    done as ssize_t
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    input: c_int,
    off: *mut off_t,
    n: size_t,
) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe { sendfile(out, input, off, n) }
}

/// copy_file_range with a served end: EXDEV, on which callers copy by read and write.
#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    fi: c_int,
    oi: *mut off_t,
    fo: c_int,
    oo: *mut off_t,
    n: size_t,
    fl: libc::c_uint,
) -> ssize_t {
    if served(fi).is_some() || served(fo).is_some() {
        return fail_ssize(libc::EXDEV);
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::copy_file_range(fi, oi, fo, oo, n, fl) }
}
