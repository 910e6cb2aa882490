//! Whether a domain's process still lives, read from shared memory without a system call.
//!
//! A one-sided write of the local backend is a copy into a file the target mapped, and a
//! file outlives its process: without a check, a write into the memory of a process that
//! just died would complete, as no RDMA NIC lets it (the dead process's registrations go
//! with it, so the write fails). Callers rely on RDMA's rule: the MDS acknowledges a turn
//! once its writes into the mirror's ring completed, which must mean the mirror's process
//! held them (a successor may already have drained that ring file).
//!
//! So each domain file holds a process-shared robust mutex that one thread of the owner
//! locks for the domain's life. Its futex word holds that thread's id while it is held;
//! the kernel replaces the id with `FUTEX_OWNER_DIED` when the thread ends without
//! unlocking (SIGKILL, a crash, exec), before the process's death can be waited for; a
//! domain dropped cleanly unlocks it (word 0). A peer loads the word after its copy: a
//! live word then proves the copy landed before the owner died.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::region::Mapping;

#[cfg(not(target_env = "gnu"))]
compile_error!("the local fabric reads glibc's robust mutex word (see owner_alive)");

/// Bytes the mutex may take in the domain file.
pub(crate) const LIVENESS_LEN: usize = 48;
const _: () = assert!(std::mem::size_of::<libc::pthread_mutex_t>() <= LIVENESS_LEN);

/// The kernel's robust-futex bits (linux/futex.h): the owner's thread id and the mark it
/// leaves on a lock whose owner ended.
const FUTEX_TID_MASK: u32 = 0x3fff_ffff;
const FUTEX_OWNER_DIED: u32 = 0x4000_0000;

/// Whether a domain file's liveness word says its owner lives. glibc keeps a mutex's
/// futex word (`__lock`) first in `pthread_mutex_t`, on every architecture (musl does
/// not: hence the guard below).
pub(crate) fn owner_alive(word: &AtomicU32) -> bool {
    let w = word.load(Ordering::Acquire);
    w & FUTEX_OWNER_DIED == 0 && w & FUTEX_TID_MASK != 0
}

/// The thread that holds a domain's liveness mutex; dropping it unlocks the mutex.
pub(crate) struct Holder {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// The process that started the thread: a forked child has a copy of this struct
    /// but not the thread (nor the lock), so it neither joins nor unlocks.
    pid: u32,
}

/// A pointer into a mapping that outlives the thread given it (see [`hold`]).
struct MutexPtr(*mut libc::pthread_mutex_t);
// SAFETY: the pointer names process-shared memory meant for use from any thread; the
// holder thread is its only user in this process.
unsafe impl Send for MutexPtr {}

/// Initialises the mutex at `off` of `map` and has a new thread lock it until the
/// returned holder drops. The caller keeps `map` mapped until then.
pub(crate) fn hold(map: &Mapping, off: usize) -> Result<Holder> {
    map.check(off as u64, LIVENESS_LEN)?;
    // Word-aligned: the futex word is read atomically by peers.
    assert!(
        off.is_multiple_of(8),
        "liveness mutex at {off} is not aligned"
    );
    // SAFETY: in bounds (checked above) of a live mapping.
    let ptr = MutexPtr(unsafe { map.base_ptr().add(off) }.cast());
    let (ready_tx, ready_rx) = mpsc::channel::<i32>();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("fabric-alive".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let p = ptr;
            // SAFETY: `p` points at LIVENESS_LEN bytes of shared memory that stay mapped
            // until this thread is joined (Holder::drop runs before the mapping goes);
            // nothing else in this process writes them (a peer, even in this process,
            // only loads the futex word atomically).
            let rc = unsafe { init_and_lock(p.0) };
            let held = rc == 0;
            let _ = ready_tx.send(rc);
            if held {
                // Returns when the holder drops its sender.
                let _ = stop_rx.recv();
                // SAFETY: this thread locked it above; the memory is still mapped.
                unsafe { libc::pthread_mutex_unlock(p.0) };
            }
        })
        .map_err(|e| Error::io("starting the liveness thread", e))?;
    let rc = ready_rx.recv().unwrap_or(libc::EAGAIN);
    let mut holder = Holder {
        stop: Some(stop_tx),
        thread: Some(thread),
        pid: std::process::id(),
    };
    if rc != 0 {
        holder.stop_and_join();
        return Err(Error::io(
            "locking the domain's liveness mutex",
            std::io::Error::from_raw_os_error(rc),
        ));
    }
    Ok(holder)
}

/// Makes the mutex at `m` process-shared and robust, and locks it with the calling
/// thread; 0 or the first error number.
///
/// # Safety
/// `m` points at writable memory of at least `size_of::<pthread_mutex_t>()` bytes,
/// suitably aligned, that no other thread uses meanwhile.
unsafe fn init_and_lock(m: *mut libc::pthread_mutex_t) -> i32 {
    // SAFETY: the attribute lives on this stack and is destroyed after use; `m` is as
    // the caller promises.
    unsafe {
        let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
        let mut rc = libc::pthread_mutexattr_init(&mut attr);
        if rc == 0 {
            rc = libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
        }
        if rc == 0 {
            rc = libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
        }
        if rc == 0 {
            rc = libc::pthread_mutex_init(m, &attr);
        }
        libc::pthread_mutexattr_destroy(&mut attr);
        if rc == 0 {
            rc = libc::pthread_mutex_lock(m);
        }
        rc
    }
}

impl Holder {
    fn stop_and_join(&mut self) {
        if self.pid != std::process::id() {
            // A forked child's copy: the thread and the lock are the parent's.
            std::mem::forget(self.stop.take());
            std::mem::forget(self.thread.take());
            return;
        }
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(map: &Mapping) -> &AtomicU32 {
        map.atomic_u32(0)
    }

    #[test]
    fn a_held_mutex_reads_alive_and_a_clean_drop_reads_gone() {
        let map = Mapping::anonymous(4096).unwrap();
        assert!(!owner_alive(word(&map)), "a fresh word must not read alive");
        let h = hold(&map, 0).unwrap();
        assert!(owner_alive(word(&map)));
        drop(h);
        assert!(!owner_alive(word(&map)));
        assert_eq!(word(&map).load(Ordering::Acquire), 0);
    }

    /// What the kernel does at a process's death, shown at a thread's: a lock whose
    /// owner ends holding it reads gone (this also checks glibc's layout: the futex word
    /// is the mutex's first).
    #[test]
    fn an_owner_that_ends_holding_the_lock_reads_gone() {
        let map = Mapping::anonymous(4096).unwrap();
        let ptr = MutexPtr(map.base_ptr().cast());
        std::thread::spawn(move || {
            let p = ptr;
            // SAFETY: the mapping outlives this thread (joined below); nothing else
            // touches the mutex meanwhile.
            assert_eq!(unsafe { init_and_lock(p.0) }, 0);
            assert!(owner_alive(map_word(p.0)));
        })
        .join()
        .unwrap();
        let w = word(&map).load(Ordering::Acquire);
        assert_ne!(w & FUTEX_OWNER_DIED, 0, "word {w:#x}");
        assert!(!owner_alive(word(&map)));
    }

    fn map_word<'a>(p: *mut libc::pthread_mutex_t) -> &'a AtomicU32 {
        // SAFETY: test helper; `p` points into a live, aligned mapping.
        unsafe { &*(p as *const AtomicU32) }
    }
}
