//! `getdents64`, the C library's wrapper of the system call that lists a directory
//! descriptor, for programs that list without a `DIR *`: a kernel descriptor of a
//! directory under the mount is listed through the client, in-process.
//!
//! Where the caller is in the listing lives in the kernel descriptor's own offset,
//! as it would for the system call: an entry's offset is its position + 1 (the
//! mount's too, `fuse::listings`), each call moves it past what it returned, and
//! `lseek` to 0 starts over. Offset 0 takes a
//! fresh listing; later calls page through that snapshot, one per descriptor,
//! dropped at its close. A call that finds the snapshots busy goes to the kernel,
//! whose listing through the mount has the same offsets. The system call itself (`syscall(SYS_getdents64)`) is not
//! interposed and lists through the mount.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, TryLockError};

use libc::{c_int, c_uint, c_void, size_t, ssize_t};
use orion_client::DirEntry;

use super::dirs::{d_type, orion_dir};
use super::{fail_ssize, leaves, serving_client};
use crate::real;
use crate::state::{self, Inside};

/// A listing a descriptor pages through: the directory's inode, its entries.
type Snapshot = (u64, Vec<DirEntry>);

/// The snapshot of each descriptor listed so far.
static LISTINGS: Mutex<Option<HashMap<c_int, Snapshot>>> = Mutex::new(None);
/// How many there are: none, and a close does not take the lock.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// The bytes before a record's name (d_ino, d_off, d_reclen, d_type).
const HEADER: usize = std::mem::offset_of!(libc::dirent64, d_name);

#[no_mangle]
pub unsafe extern "C" fn getdents64(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if !Inside::now() {
        // SAFETY: the caller's buffer of `n` bytes.
        if let Some(r) = unsafe { served(fd, buf, n) } {
            return r;
        }
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { real::getdents64(fd, buf, n) }
}

/// The listing of `fd` through the client, if it is a directory of the mount.
///
/// # Safety
/// `buf` holds `n` bytes.
unsafe fn served(fd: c_int, buf: *mut c_void, n: size_t) -> Option<ssize_t> {
    let st = orion_dir(fd)?;
    let _in = Inside::enter();
    // The descriptor is the mount's already: no path to look at.
    let c = serving_client()?;
    state::SERVED.fetch_add(1, Ordering::Relaxed);
    if buf.is_null() {
        return Some(fail_ssize(libc::EFAULT));
    }
    // SAFETY: lseek of the caller's descriptor, which stays where it is.
    let at = || unsafe { real::lseek64(fd, 0, libc::SEEK_CUR) };
    // A fresh listing (at offset 0, or the first of this descriptor) is taken before
    // the lock: a close on another thread waits for no RPC.
    let fresh =
        at() == 0 || with_listings(|m| m.get(&fd).map(|(ino, _)| *ino)) != Some(Some(st.st_ino));
    let taken = match fresh {
        false => None,
        true => match c.readdir_ino(st.st_ino) {
            Ok(entries) => Some(entries),
            Err(e) if leaves(&e) => return None,
            Err(e) => return Some(fail_ssize(e.errno())),
        },
    };
    // SAFETY: the caller's buffer holds `n` bytes (not null: above).
    let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) };
    // Busy (another thread lists, or a fork caught one doing so): the kernel's.
    with_listings(|map| {
        if let Some(entries) = taken {
            if map.insert(fd, (st.st_ino, entries)).is_none() {
                HELD.fetch_add(1, Ordering::Relaxed);
            }
        }
        let pos = at();
        let (_, entries) = map.get(&fd)?;
        if pos < 0 {
            return None;
        }
        let (bytes, next) = fill(out, entries, pos as usize);
        if bytes == 0 && next < entries.len() {
            // Not even one record fits.
            return Some(fail_ssize(libc::EINVAL));
        }
        // SAFETY: as above; the offset is where the next call resumes.
        if unsafe { real::lseek64(fd, next as libc::off_t, libc::SEEK_SET) } < 0 {
            return None;
        }
        Some(bytes as ssize_t)
    })?
}

/// Runs `f` on the snapshots, unless another thread holds them (or held them when
/// this process forked from its parent): `None` then, and the caller leaves the
/// call to the kernel.
fn with_listings<T>(f: impl FnOnce(&mut HashMap<c_int, Snapshot>) -> T) -> Option<T> {
    let mut all = match LISTINGS.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => return None,
    };
    Some(f(all.get_or_insert_with(HashMap::new)))
}

/// Writes the records of `entries` from position `from` into `out`, as the kernel
/// lays them out (8-byte aligned, the name NUL-terminated); returns the bytes
/// written and the position after the last record.
fn fill(out: &mut [u8], entries: &[DirEntry], from: usize) -> (usize, usize) {
    let mut at = 0;
    let mut i = from;
    while let Some(e) = entries.get(i) {
        let len = (HEADER + e.name.len() + 1).div_ceil(8) * 8;
        if at + len > out.len() {
            break;
        }
        let rec = &mut out[at..at + len];
        rec.fill(0);
        rec[0..8].copy_from_slice(&e.ino.to_ne_bytes());
        rec[8..16].copy_from_slice(&(i as i64 + 1).to_ne_bytes());
        rec[16..18].copy_from_slice(&(len as u16).to_ne_bytes());
        rec[18] = d_type(e.ftype);
        rec[HEADER..HEADER + e.name.len()].copy_from_slice(&e.name);
        at += len;
        i += 1;
    }
    // Each record was checked to fit and rounded to 8 bytes, as the kernel's are.
    debug_assert!(
        at <= out.len() && at.is_multiple_of(8),
        "records of {at} bytes in a buffer of {}",
        out.len()
    );
    (at, i)
}

/// A kernel descriptor closed (or replaced by dup2): its snapshot goes. One that
/// stays (the snapshots were busy) is taken again at the next offset 0, or when
/// the number names another directory.
pub(crate) fn closed(fd: c_int) {
    if HELD.load(Ordering::Relaxed) == 0 {
        return;
    }
    if with_listings(|m| m.remove(&fd)).flatten().is_some() {
        // Counted when it went in, under the lock its removal took after.
        let was = HELD.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(was > 0, "a snapshot dropped that was never counted");
    }
}

/// close_range of `first..=last`: their snapshots go.
pub(crate) fn closed_range(first: c_uint, last: c_uint) {
    if HELD.load(Ordering::Relaxed) == 0 {
        return;
    }
    let inside = |fd: &c_int| (first..=last).contains(&(*fd as c_uint));
    if let Some(gone) = with_listings(|m| {
        let before = m.len();
        m.retain(|fd, _| !inside(fd));
        before - m.len()
    }) {
        let was = HELD.fetch_sub(gone, Ordering::Relaxed);
        debug_assert!(was >= gone, "{gone} snapshots dropped of {was} counted");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orion_client::FileType;

    fn entry(name: &str, ino: u64) -> DirEntry {
        DirEntry {
            name: name.as_bytes().to_vec(),
            ino,
            ftype: FileType::Regular,
        }
    }

    #[test]
    fn records_are_laid_out_as_the_kernel_lays_them_and_stop_when_full() {
        let entries = [entry("a", 7), entry("longer-name", 9)];
        let mut out = [0xffu8; 64];
        let (bytes, next) = fill(&mut out, &entries, 0);
        // 19 bytes of header, "a" and its NUL: 24; 19 + 11 + 1 = 31: 32.
        assert_eq!((bytes, next), (56, 2));
        assert_eq!(u64::from_ne_bytes(out[0..8].try_into().unwrap()), 7);
        assert_eq!(i64::from_ne_bytes(out[8..16].try_into().unwrap()), 1);
        assert_eq!(u16::from_ne_bytes(out[16..18].try_into().unwrap()), 24);
        assert_eq!(out[18], libc::DT_REG);
        assert_eq!(&out[19..21], b"a\0");
        assert_eq!(i64::from_ne_bytes(out[32..40].try_into().unwrap()), 2);
        assert_eq!(&out[43..55], b"longer-name\0");
        // A buffer that holds the first record only; then the rest from there.
        let (bytes, next) = fill(&mut out[..40], &entries, 0);
        assert_eq!((bytes, next), (24, 1));
        let (bytes, next) = fill(&mut out[..40], &entries, 1);
        assert_eq!((bytes, next), (32, 2));
        assert_eq!(fill(&mut out, &entries, 2), (0, 2));
    }
}
