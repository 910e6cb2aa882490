//! Advisory locks on served descriptors, held at the MDS through the client (so
//! they hold against other processes, through preload or the mount): fcntl's
//! process-owned record locks (F_SETLK, F_SETLKW, F_GETLK), its open-file-owned
//! ones (F_OFD_*), and flock.
//!
//! Owners: a process's record locks are owned by the process (POSIX drops them all
//! when it closes any descriptor of the file); OFD locks and flock by the open file.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use libc::{c_int, flock as Flock, F_RDLCK, F_UNLCK, F_WRLCK, SEEK_CUR, SEEK_END, SEEK_SET};
use orion_client::{LockKind, LockReq};

use crate::state;
use crate::table::OpenFile;

/// Inodes this process holds record locks on (a close of any of their descriptors
/// drops them).
static LOCKED: Mutex<Option<HashSet<u64>>> = Mutex::new(None);

/// The owner of this process's record locks.
fn process_owner() -> u64 {
    state::pid() as u64
}

/// The owner of an open file's OFD locks and flock (set apart from process owners by
/// the top bit).
fn file_owner(f: &OpenFile) -> u64 {
    (1 << 63) | (f as *const OpenFile as u64 >> 4)
}

/// The byte range of a `struct flock`, as [start, end] (end inclusive; u64::MAX: to
/// the end of the file and beyond).
fn range(f: &OpenFile, l: &Flock) -> Result<(u64, u64), c_int> {
    let base: i64 = match l.l_whence as c_int {
        SEEK_SET => 0,
        SEEK_CUR => f.client.position(f.fd).map_err(|e| e.errno())? as i64,
        SEEK_END => f.client.fstat(f.fd).map_err(|e| e.errno())?.size as i64,
        _ => return Err(libc::EINVAL),
    };
    let mut start = base.checked_add(l.l_start).ok_or(libc::EOVERFLOW)?;
    let mut len = l.l_len;
    if len < 0 {
        start = start.checked_add(len).ok_or(libc::EINVAL)?;
        len = -len;
    }
    if start < 0 {
        return Err(libc::EINVAL);
    }
    let end = match len {
        0 => u64::MAX,
        n => (start as u64)
            .checked_add(n as u64 - 1)
            .ok_or(libc::EOVERFLOW)?,
    };
    Ok((start as u64, end))
}

fn kind(t: c_int) -> Result<LockKind, c_int> {
    match t {
        F_RDLCK => Ok(LockKind::Read),
        F_WRLCK => Ok(LockKind::Write),
        F_UNLCK => Ok(LockKind::Unlock),
        _ => Err(libc::EINVAL),
    }
}

/// Whether the calling thread has a signal pending that it does not block: a
/// waiting lock then ends with EINTR.
fn signal_pending() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/thread-self/status") else {
        return false;
    };
    let mask = |key: &str| {
        (status.lines())
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    (mask("SigPnd:") | mask("ShdPnd:")) & !mask("SigBlk:") != 0
}

/// fcntl's lock commands on a served descriptor; `None`: not a lock command.
///
/// # Safety
/// For a lock command, `l` is null or the caller's `struct flock`.
pub(crate) unsafe fn fcntl_lock(
    f: &OpenFile,
    cmd: c_int,
    l: *mut Flock,
) -> Option<Result<c_int, c_int>> {
    let (ofd, test, wait) = match cmd {
        libc::F_GETLK => (false, true, false),
        libc::F_SETLK => (false, false, false),
        libc::F_SETLKW => (false, false, true),
        libc::F_OFD_GETLK => (true, true, false),
        libc::F_OFD_SETLK => (true, false, false),
        libc::F_OFD_SETLKW => (true, false, true),
        _ => return None,
    };
    // SAFETY: the caller's struct flock, or null (EFAULT).
    let Some(l) = (unsafe { l.as_mut() }) else {
        return Some(Err(libc::EFAULT));
    };
    Some(lock(f, l, ofd, test, wait))
}

fn lock(f: &OpenFile, l: &mut Flock, ofd: bool, test: bool, wait: bool) -> Result<c_int, c_int> {
    if ofd && l.l_pid != 0 {
        return Err(libc::EINVAL);
    }
    let kind = kind(l.l_type as c_int)?;
    let (start, end) = range(f, l)?;
    let owner = if ofd { file_owner(f) } else { process_owner() };
    let req = LockReq {
        ino: f.ino,
        owner,
        pid: state::pid() as u32,
        start,
        end,
        kind,
    };
    if test {
        let held = f.client.test_lock(req).map_err(|e| e.errno())?;
        match held {
            None => l.l_type = F_UNLCK as _,
            Some(h) => {
                l.l_type = match h.kind {
                    LockKind::Read => F_RDLCK,
                    _ => F_WRLCK,
                } as _;
                l.l_whence = SEEK_SET as _;
                l.l_start = h.start as i64;
                l.l_len = match h.end {
                    u64::MAX => 0,
                    e => (e - h.start + 1) as i64,
                };
                l.l_pid = if ofd { -1 } else { h.pid as i32 };
            }
        }
        return Ok(0);
    }
    match kind {
        LockKind::Read if !crate::table::readable(f.flags) => return Err(libc::EBADF),
        LockKind::Write if !crate::table::writable(f.flags) => return Err(libc::EBADF),
        _ => {}
    }
    (f.client.set_lock(req, wait, || !signal_pending())).map_err(|e| e.errno())?;
    if kind != LockKind::Unlock {
        taken(f, ofd);
    }
    Ok(0)
}

/// Remembers that a lock was taken, so that a close releases it (and only then asks
/// the MDS).
fn taken(f: &OpenFile, by_file: bool) {
    if by_file {
        f.locked.store(true, Ordering::Relaxed);
    } else {
        let mut held = LOCKED.lock().unwrap_or_else(|e| e.into_inner());
        held.get_or_insert_with(HashSet::new).insert(f.ino);
    }
}

/// flock(2) on a served descriptor: a whole-file lock owned by the open file.
pub(crate) fn flock(f: &OpenFile, op: c_int) -> Result<(), c_int> {
    let kind = match op & !libc::LOCK_NB {
        libc::LOCK_SH => LockKind::Read,
        libc::LOCK_EX => LockKind::Write,
        libc::LOCK_UN => LockKind::Unlock,
        _ => return Err(libc::EINVAL),
    };
    let req = LockReq {
        ino: f.ino,
        owner: file_owner(f),
        pid: state::pid() as u32,
        start: 0,
        end: u64::MAX,
        kind,
    };
    let wait = op & libc::LOCK_NB == 0;
    match f.client.set_lock(req, wait, || !signal_pending()) {
        Ok(()) => {
            if kind != LockKind::Unlock {
                taken(f, true);
            }
            Ok(())
        }
        Err(e) if e.errno() == libc::EAGAIN => Err(libc::EWOULDBLOCK),
        Err(e) => Err(e.errno()),
    }
}

/// After a descriptor of `f` closed: the process's record locks on the file go (as
/// POSIX says, whichever descriptor it was), and with the open file's last
/// descriptor (`last`) its OFD locks and flock.
pub(crate) fn closed(f: &OpenFile, last: bool) {
    let had = {
        let mut held = LOCKED.lock().unwrap_or_else(|e| e.into_inner());
        held.as_mut().is_some_and(|h| h.remove(&f.ino))
    };
    if had {
        let _ = f.client.release_locks(f.ino, process_owner());
    }
    if last && f.locked.load(Ordering::Relaxed) {
        let _ = f.client.release_locks(f.ino, file_owner(f));
    }
}
