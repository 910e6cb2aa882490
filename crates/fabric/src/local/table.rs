//! The domain file of the local backend: doorbells and the region table, in shared memory.
//!
//! The region table plays the role of an RDMA NIC's memory-registration table: a peer's
//! library resolves a remote key by reading it, checks bounds and permissions against it, and
//! re-checks the key on every access, so a revoked key is refused without the owner's CPU.
//!
//! ```text
//! 0       header: magic, owner pid, the owner's liveness mutex (see `liveness`)
//! 64      doorbells: 64 x 64 B { seq: u32, sleepers: u32 }
//! 8192    region table: 1024 x 256 B { key, len, file offset, access, path len, path[224] }
//! ```

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::Duration;

use super::liveness::{self, Holder, LIVENESS_LEN};
use super::private_file;
use crate::error::{Error, Result};
use crate::futex;
use crate::region::{Access, Mapping};

/// Version 2 holds the liveness mutex: a peer of version 1 would read it as dead.
const MAGIC: u64 = u64::from_le_bytes(*b"ORFLDOM2");
pub(crate) const DOORBELLS: usize = 64;
const LIVENESS: usize = 16;
const DOORBELL_BASE: usize = 64;
const _: () = assert!(LIVENESS + LIVENESS_LEN <= DOORBELL_BASE);
const DOORBELL_SIZE: usize = 64;
pub(crate) const TABLE_SLOTS: usize = 1024;
const TABLE_BASE: usize = 8192;
const SLOT_SIZE: usize = 256;
pub(crate) const PATH_MAX: usize = SLOT_SIZE - 32;
pub(crate) const FILE_LEN: usize = TABLE_BASE + TABLE_SLOTS * SLOT_SIZE;

/// A mapped domain file (ours or a peer's).
pub(crate) struct DomainFile {
    pub(crate) map: Mapping,
    pub(crate) path: PathBuf,
}

/// What a table slot says about a region.
#[derive(Clone, Debug)]
pub(crate) struct SlotEntry {
    pub len: u64,
    pub file_off: u64,
    pub access: Access,
    pub path: PathBuf,
}

impl DomainFile {
    pub(crate) fn create(path: &Path) -> Result<DomainFile> {
        let f =
            private_file(path).map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        f.set_len(FILE_LEN as u64)
            .map_err(|e| Error::io(format!("sizing {}", path.display()), e))?;
        let map = Mapping::file(&f, 0, FILE_LEN)?;
        map.write(0, &MAGIC.to_le_bytes())?;
        map.write(8, &(std::process::id() as u64).to_le_bytes())?;
        Ok(DomainFile {
            map,
            path: path.to_path_buf(),
        })
    }

    pub(crate) fn open(path: &Path) -> Result<DomainFile> {
        let f = File::options()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| {
                let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
                    " (the local backend shares memory files between processes of one \
                     user: run as the cluster's user, or use the libfabric backend)"
                } else {
                    ""
                };
                Error::io(
                    format!("opening the peer's domain file {}{hint}", path.display()),
                    e,
                )
            })?;
        let len = f.metadata().map_err(|e| Error::io("stat", e))?.len();
        if len != FILE_LEN as u64 {
            return Err(Error::Protocol {
                peer: path.display().to_string(),
                why: format!("domain file of {len} bytes"),
            });
        }
        let map = Mapping::file(&f, 0, FILE_LEN)?;
        let mut m = [0u8; 8];
        map.read(0, &mut m)?;
        if u64::from_le_bytes(m) != MAGIC {
            return Err(Error::Protocol {
                peer: path.display().to_string(),
                why: "not a fabric domain file".into(),
            });
        }
        Ok(DomainFile {
            map,
            path: path.to_path_buf(),
        })
    }

    /// Has a thread of this process hold the file's liveness mutex until the holder drops
    /// (for a domain file this process created).
    pub(crate) fn hold_liveness(&self) -> Result<Holder> {
        liveness::hold(&self.map, LIVENESS)
    }

    /// Whether the process that created this file still lives (and has not dropped its
    /// domain). No system call: one load of shared memory.
    pub(crate) fn owner_alive(&self) -> bool {
        liveness::owner_alive(self.map.atomic_u32(LIVENESS))
    }

    fn seq(&self, bell: usize) -> &AtomicU32 {
        self.map.atomic_u32(DOORBELL_BASE + bell * DOORBELL_SIZE)
    }

    fn sleepers(&self, bell: usize) -> &AtomicU32 {
        self.map
            .atomic_u32(DOORBELL_BASE + bell * DOORBELL_SIZE + 4)
    }

    /// Rings doorbell `bell` if anyone sleeps on it. Call after publishing work.
    pub(crate) fn ring(&self, bell: usize) {
        // A peer's bell was range-checked when it came (`bell_of`), ours found in the
        // table: past the doorbells lie the region table's slots.
        debug_assert!(bell < DOORBELLS, "doorbell {bell} out of range");
        fence(Ordering::SeqCst);
        if self.sleepers(bell).load(Ordering::Relaxed) > 0 {
            self.seq(bell).fetch_add(1, Ordering::SeqCst);
            futex::wake_all(self.seq(bell));
        }
    }

    /// Sleeps on doorbell `bell` unless `ready()` says there is work (checked after announcing
    /// the sleep, so a producer that publishes concurrently either sees the sleeper or is seen).
    pub(crate) fn sleep(&self, bell: usize, timeout: Duration, ready: impl Fn() -> bool) {
        debug_assert!(
            bell < DOORBELLS,
            "sleeping on doorbell {bell}, out of range"
        );
        self.sleepers(bell).fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let s = self.seq(bell).load(Ordering::SeqCst);
        if !ready() {
            futex::wait(self.seq(bell), s, timeout);
        }
        self.sleepers(bell).fetch_sub(1, Ordering::SeqCst);
    }

    fn slot_base(slot: usize) -> usize {
        TABLE_BASE + slot * SLOT_SIZE
    }

    pub(crate) fn slot_key(&self, slot: usize) -> u64 {
        self.map
            .atomic_u64(Self::slot_base(slot))
            .load(Ordering::Acquire)
    }

    /// Publishes a region in `slot`: fields first, the key last.
    pub(crate) fn publish(&self, slot: usize, key: u64, e: &SlotEntry) -> Result<()> {
        let path = e.path.as_os_str().as_encoded_bytes();
        if path.len() > PATH_MAX {
            return Err(Error::io(
                format!("registering {}", e.path.display()),
                std::io::Error::other(format!("path longer than {PATH_MAX} bytes")),
            ));
        }
        // The slot was found free in the domain's table of TABLE_SLOTS.
        debug_assert!(slot < TABLE_SLOTS, "region slot {slot} out of the table");
        let b = Self::slot_base(slot);
        self.map.write((b + 8) as u64, &e.len.to_le_bytes())?;
        self.map.write((b + 16) as u64, &e.file_off.to_le_bytes())?;
        self.map
            .write((b + 24) as u64, &e.access.bits().to_le_bytes())?;
        self.map
            .write((b + 28) as u64, &(path.len() as u32).to_le_bytes())?;
        self.map.write((b + 32) as u64, path)?;
        self.map.atomic_u64(b).store(key, Ordering::Release);
        Ok(())
    }

    /// Withdraws `key` from `slot` (no-op if the slot holds another key).
    pub(crate) fn revoke(&self, slot: usize, key: u64) {
        let _ = self.map.atomic_u64(Self::slot_base(slot)).compare_exchange(
            key,
            0,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Finds `key` and reads its entry; the key is re-checked after the read so that a slot
    /// rewritten meanwhile is never mistaken for the region asked for.
    pub(crate) fn lookup(&self, key: u64) -> Option<(usize, SlotEntry)> {
        if key == 0 {
            return None;
        }
        for slot in 0..TABLE_SLOTS {
            if self.slot_key(slot) != key {
                continue;
            }
            let b = Self::slot_base(slot) as u64;
            let mut w = [0u8; 32];
            self.map.read(b, &mut w).ok()?;
            let len = u64::from_le_bytes(w[8..16].try_into().unwrap());
            let file_off = u64::from_le_bytes(w[16..24].try_into().unwrap());
            let access = Access::from_bits(u32::from_le_bytes(w[24..28].try_into().unwrap()));
            let plen = (u32::from_le_bytes(w[28..32].try_into().unwrap()) as usize).min(PATH_MAX);
            let mut p = vec![0u8; plen];
            self.map.read(b + 32, &mut p).ok()?;
            fence(Ordering::Acquire);
            if self.slot_key(slot) != key {
                return None;
            }
            use std::os::unix::ffi::OsStringExt;
            let path = PathBuf::from(std::ffi::OsString::from_vec(p));
            return Some((
                slot,
                SlotEntry {
                    len,
                    file_off,
                    access,
                    path,
                },
            ));
        }
        None
    }
}
