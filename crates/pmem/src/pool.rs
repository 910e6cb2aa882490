//! A pool: one file mapped shared, plus the rule for making stores durable.

use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;

use crate::crash::{CrashDomain, TrackedFile};
use crate::flush::{self, FlushInsn};
use crate::grow::Growth;
use crate::tap::PersistTap;

/// How stores to a pool become durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Real persistent memory (a DAX file system): `MAP_SYNC`, cache-line flushes.
    Dax,
    /// Any other file system: `msync(MS_SYNC)` of the range at each persist point.
    Msync,
    /// A file on tmpfs (`/dev/shm`): survives a process crash, not a reboot.
    Volatile,
    /// In-memory pool whose stores and persists are recorded by a [`CrashDomain`].
    CrashSim,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Dax => "dax",
            Mode::Msync => "msync",
            Mode::Volatile => "volatile",
            Mode::CrashSim => "crash-sim",
        }
    }

    /// What the mode promises, for the line a daemon prints at start.
    pub fn durability(self) -> &'static str {
        match self {
            Mode::Dax => "durable across power failure (cache-line flush on MAP_SYNC mapping)",
            Mode::Msync => "durable across power failure (msync at each commit point)",
            Mode::Volatile => "survives process crashes, not reboots (tmpfs emulates NVMM)",
            Mode::CrashSim => "test mode: stores recorded per cache line",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "dax" => Ok(Mode::Dax),
            "msync" => Ok(Mode::Msync),
            "volatile" => Ok(Mode::Volatile),
            _ => Err(format!(
                "unknown pool mode {s:?}: expected dax, msync or volatile"
            )),
        }
    }
}

/// Which mode to map a pool file with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ModeChoice {
    /// tmpfs → volatile; a file system that accepts `MAP_SYNC` → dax; else msync.
    #[default]
    Auto,
    Force(Mode),
}

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("pool access out of bounds: offset {offset} length {len} in a pool of {size} bytes")]
    OutOfBounds { offset: u64, len: u64, size: u64 },
    #[error("misaligned 8-byte atomic access at offset {0}")]
    Misaligned(u64),
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("{path}: {0}", path = .1.display())]
    Unsupported(String, PathBuf),
    /// A growing pool found no room in the file system under it.
    #[error("{}: no room to grow the pool: {source}", path.display())]
    NoRoom {
        path: PathBuf,
        source: std::io::Error,
    },
}

enum Backing {
    Mapped {
        _file: File,
    },
    Sim {
        domain: Arc<CrashDomain>,
        id: usize,
    },
    /// A file mapping whose persists a crash domain records.
    Tracked(TrackedFile),
}

/// A mapped pool. Offsets are relative to its start; every access is bounds-checked.
pub struct Pool {
    base: *mut u8,
    len: usize,
    mode: Mode,
    flush: FlushInsn,
    path: PathBuf,
    backing: Backing,
    /// The file is on tmpfs: a reboot takes it whole.
    on_tmpfs: bool,
    /// What was persisted, for a mirror ([`crate::tap`]).
    pub(crate) tap: PersistTap,
    /// A pool whose file space is taken as stores reach it ([`crate::grow`]).
    growth: Option<Growth>,
}

// SAFETY: the mapping lives as long as the Pool; accessors copy through raw pointers
// and the only shared mutable words are accessed through AtomicU64. Callers keep
// concurrent writers to disjoint ranges (the file-system layers above own disjoint
// inodes and pages), as they would with real shared persistent memory.
unsafe impl Send for Pool {}
// SAFETY: as above; `&Pool` only permits bounds-checked copies and atomic words.
unsafe impl Sync for Pool {}

const TMPFS_MAGIC: i64 = 0x0102_1994;

impl Pool {
    /// Creates (or truncates) the file at `path` with `size` bytes and maps it.
    pub fn create(path: &Path, size: u64, choice: ModeChoice) -> Result<Pool, PoolError> {
        Self::create_reporting(path, size, choice, &mut |_| {})
    }

    /// [`Pool::create`], telling `done` how far it has come, in bytes of the pool:
    /// allocating a large pool takes seconds (tmpfs hands out every page at once).
    pub fn create_reporting(
        path: &Path,
        size: u64,
        choice: ModeChoice,
        done: &mut dyn FnMut(u64),
    ) -> Result<Pool, PoolError> {
        let io = |what, source| PoolError::Io {
            path: path.to_owned(),
            what,
            source,
        };
        let file = new_file(path, size)?;
        // Two passes of equal weight for `done`: allocating, then (tmpfs) zeroing.
        allocate(&file, size, &mut |at| done(at / 2))
            .map_err(|e| io("cannot allocate the pool's space", e))?;
        let pool = Self::map(file, path, choice)?;
        if pool.on_tmpfs {
            // tmpfs zeroes an allocated page at its first fault, in whichever process
            // touches it first: a client's write, on the data path. Persistent memory
            // has no such cost, so the pool is touched once here.
            let step = 128 << 20;
            let mut at = 0u64;
            while at < size {
                let len = step.min(size - at);
                pool.prefault(at, len as usize)?;
                at += len;
                done(size / 2 + at / 2);
            }
        }
        done(size);
        Ok(pool)
    }

    /// Maps an existing pool file.
    pub fn open(path: &Path, choice: ModeChoice) -> Result<Pool, PoolError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| PoolError::Io {
                path: path.to_owned(),
                what: "cannot open pool file",
                source,
            })?;
        Self::map(file, path, choice)
    }

    fn map(file: File, path: &Path, choice: ModeChoice) -> Result<Pool, PoolError> {
        let io = |what, source| PoolError::Io {
            path: path.to_owned(),
            what,
            source,
        };
        let len = file
            .metadata()
            .map_err(|e| io("cannot stat pool file", e))?
            .len() as usize;
        if len == 0 {
            return Err(PoolError::Unsupported(
                "pool file is empty (run `orion mkfs` first)".into(),
                path.to_owned(),
            ));
        }
        let fd = file.as_raw_fd();
        let on_tmpfs = {
            // SAFETY: statfs only writes into the zeroed struct we pass.
            let mut st: libc::statfs = unsafe { std::mem::zeroed() };
            // SAFETY: fd is an open descriptor owned by `file`.
            let rc = unsafe { libc::fstatfs(fd, &mut st) };
            rc == 0 && st.f_type as i64 == TMPFS_MAGIC
        };
        let want = match choice {
            ModeChoice::Force(Mode::CrashSim) => {
                return Err(PoolError::Unsupported(
                    "crash-sim pools live in memory, not in files".into(),
                    path.to_owned(),
                ))
            }
            ModeChoice::Force(m) => Some(m),
            ModeChoice::Auto if on_tmpfs => Some(Mode::Volatile),
            ModeChoice::Auto => None,
        };
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let mut mode = Mode::Msync;
        let mut base = libc::MAP_FAILED;
        if want.is_none() || want == Some(Mode::Dax) {
            // SAFETY: mapping a file we hold open; the kernel validates the flags.
            base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    prot,
                    libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
                    fd,
                    0,
                )
            };
            if base != libc::MAP_FAILED {
                mode = Mode::Dax;
            } else if want == Some(Mode::Dax) {
                return Err(PoolError::Unsupported(
                    "mode dax needs a file on a DAX file system (MAP_SYNC was refused); \
                     use --pool-mode msync or volatile"
                        .into(),
                    path.to_owned(),
                ));
            }
        }
        if base == libc::MAP_FAILED {
            mode = want.unwrap_or(Mode::Msync);
            // SAFETY: as above, a plain shared mapping of an open file.
            base = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
            if base == libc::MAP_FAILED {
                return Err(io("cannot map pool file", std::io::Error::last_os_error()));
            }
        }
        Ok(Pool {
            base: base as *mut u8,
            len,
            mode,
            flush: FlushInsn::detect(),
            path: path.to_owned(),
            backing: Backing::Mapped { _file: file },
            on_tmpfs,
            tap: PersistTap::default(),
            growth: None,
        })
    }

    /// Creates (or truncates) the file at `path` with `size` bytes, sparse, and maps
    /// it as a pool whose file space is taken as it is used ([`Pool::growing`]).
    pub fn create_growing(path: &Path, size: u64, choice: ModeChoice) -> Result<Pool, PoolError> {
        Ok(Self::map(new_file(path, size)?, path, choice)?.growing())
    }

    /// This pool, taking its file space as stores reach it instead of all at once
    /// (an MDS pool, which is mostly empty for most file systems), and leaving holes
    /// where [`Pool::zero`] clears chunks it has not allocated. A crash-simulator
    /// pool has no file space to take: it is returned as it is.
    pub fn growing(mut self) -> Pool {
        if self.fd().is_some() {
            self.growth = Some(Growth::new(self.len as u64));
        }
        self
    }

    fn no_room(&self, source: std::io::Error) -> PoolError {
        PoolError::NoRoom {
            path: self.path.clone(),
            source,
        }
    }

    fn fd(&self) -> Option<std::os::fd::RawFd> {
        match &self.backing {
            Backing::Mapped { _file } => Some(_file.as_raw_fd()),
            Backing::Tracked(t) => Some(t._file.as_raw_fd()),
            Backing::Sim { .. } => None,
        }
    }

    /// Takes the file space under `[off, off + len)` (checked) if this pool grows.
    #[inline]
    fn grow(&self, off: u64, len: usize) -> Result<(), PoolError> {
        match (&self.growth, self.fd()) {
            (Some(g), Some(fd)) => g
                .ensure(fd, off, len as u64)
                .map_err(|source| self.no_room(source)),
            _ => Ok(()),
        }
    }

    pub(crate) fn new_sim(base: *mut u8, len: usize, domain: Arc<CrashDomain>, id: usize) -> Pool {
        Pool {
            base,
            len,
            mode: Mode::CrashSim,
            flush: FlushInsn::Clflush,
            path: PathBuf::from(format!("<crash-sim pool {id}>")),
            backing: Backing::Sim { domain, id },
            on_tmpfs: false,
            tap: PersistTap::default(),
            growth: None,
        }
    }

    /// The mapping's address and length, for a crash domain that tracks it.
    pub(crate) fn raw_mapping(&self) -> (*const u8, usize) {
        (self.base, self.len)
    }

    /// This file-mapped pool, with its stores and persists recorded by `domain`.
    pub(crate) fn into_tracked(mut self, domain: Arc<CrashDomain>, id: usize) -> Pool {
        let file = match std::mem::replace(
            &mut self.backing,
            Backing::Sim {
                domain: domain.clone(),
                id,
            },
        ) {
            Backing::Mapped { _file } => _file,
            _ => unreachable!("only a file-mapped pool can be tracked"),
        };
        self.backing = Backing::Tracked(TrackedFile {
            _file: file,
            domain,
            id,
        });
        self.mode = Mode::CrashSim;
        self
    }

    pub fn len(&self) -> u64 {
        self.len as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether a page that reaches the mapping (from this process or any other) is as
    /// durable as it will ever be here, with no flush: a volatile pool on tmpfs, whose
    /// pages survive the crash of any process, and which a reboot takes whole (so a
    /// pool found again after a crash lost nothing that reached it).
    pub fn durable_on_delivery(&self) -> bool {
        self.mode == Mode::Volatile && self.on_tmpfs
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One line describing the mode, e.g. for a daemon's start-up log.
    pub fn describe(&self) -> String {
        let how = match self.mode {
            Mode::Dax => format!(", flush with {}", self.flush.name()),
            _ => String::new(),
        };
        format!(
            "pool {} ({} MiB): mode {}{} — {}",
            self.path.display(),
            self.len >> 20,
            self.mode.name(),
            how,
            self.mode.durability()
        )
    }

    #[inline]
    fn check(&self, off: u64, len: usize) -> Result<usize, PoolError> {
        match off.checked_add(len as u64) {
            Some(end) if end <= self.len as u64 => Ok(off as usize),
            _ => Err(PoolError::OutOfBounds {
                offset: off,
                len: len as u64,
                size: self.len as u64,
            }),
        }
    }

    /// Copies `buf.len()` bytes at `off` into `buf`.
    #[inline]
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), PoolError> {
        let o = self.check(off, buf.len())?;
        // SAFETY: o..o+len is inside the mapping (checked); buf is a distinct
        // allocation, so the ranges cannot overlap.
        unsafe { crate::copy::copy_nonoverlapping(self.base.add(o), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    pub fn read_vec(&self, off: u64, len: usize) -> Result<Vec<u8>, PoolError> {
        let mut v = vec![0u8; len];
        self.read(off, &mut v)?;
        Ok(v)
    }

    /// Stores `data` at `off` (cached stores; not durable until [`Pool::persist`]).
    #[inline]
    pub fn write(&self, off: u64, data: &[u8]) -> Result<(), PoolError> {
        let o = self.check(off, data.len())?;
        self.grow(off, data.len())?;
        // SAFETY: bounds checked; `data` cannot alias the mapping mutably.
        unsafe { crate::copy::copy_nonoverlapping(data.as_ptr(), self.base.add(o), data.len()) };
        self.record_store(off, data.len());
        Ok(())
    }

    /// Stores bulk data at `off`, with non-temporal stores in dax mode (paper §5.2:
    /// memcpy_nt + sfence). Still followed by [`Pool::persist`] to mark the commit point.
    pub fn write_data(&self, off: u64, data: &[u8]) -> Result<(), PoolError> {
        let o = self.check(off, data.len())?;
        self.grow(off, data.len())?;
        if self.mode == Mode::Dax {
            // SAFETY: bounds checked above.
            unsafe { flush::copy_nontemporal(self.base.add(o), data) };
        } else {
            // SAFETY: bounds checked above.
            unsafe {
                crate::copy::copy_nonoverlapping(data.as_ptr(), self.base.add(o), data.len())
            };
        }
        self.record_store(off, data.len());
        Ok(())
    }

    /// Faults in `[off, off + len)` for writing ahead of use, without changing a byte.
    /// A pool on tmpfs gets its pages on first touch, and that page fault (allocate and
    /// zero a page, ~2–3 µs here) would otherwise land inside the write that first touches
    /// it; real persistent memory is mapped up front and has no such cost. Best effort:
    /// a kernel without `MADV_POPULATE_WRITE` (before 5.14) just faults later.
    pub fn prefault(&self, off: u64, len: usize) -> Result<(), PoolError> {
        let o = self.check(off, len)?;
        if !matches!(self.mode, Mode::Volatile | Mode::Msync | Mode::Dax) || len == 0 {
            return Ok(());
        }
        // SAFETY: `base` maps `len` bytes from a page boundary; `o..o + len` is
        // inside it (checked above).
        unsafe { crate::populate::populate_write(self.base, self.len, o, len) };
        Ok(())
    }

    /// Fills `len` bytes at `off` with zeros (a growing pool leaves its chunks not
    /// allocated holes: [`Growth::zero_sparse`]).
    pub fn zero(&self, off: u64, len: usize) -> Result<(), PoolError> {
        self.check(off, len)?;
        let by_hand = match (&self.growth, self.fd()) {
            (Some(g), Some(fd)) => g
                .zero_sparse(fd, off, len as u64)
                .map_err(|source| self.no_room(source))?,
            _ => vec![(off, len as u64)],
        };
        for (at, n) in by_hand {
            // SAFETY: inside `[off, off + len)`, bounds checked above.
            unsafe { std::ptr::write_bytes(self.base.add(at as usize), 0, n as usize) };
        }
        self.record_store(off, len);
        Ok(())
    }

    /// Stores `data` at `off` as [`Pool::write`] does, except that its pages (or ends
    /// of pages) that are all zeros are [`Pool::zero`]ed: a growing pool keeps them
    /// holes where it has not allocated (how a copy of a pool keeps only what its
    /// source holds).
    pub fn write_sparse(&self, off: u64, data: &[u8]) -> Result<(), PoolError> {
        const PAGE: usize = 4096;
        let mut at = 0;
        while at < data.len() {
            // A run of pages of one kind (zero or not), page-aligned in the pool.
            let run_end =
                |from: usize| (off as usize + from + 1).next_multiple_of(PAGE) - off as usize;
            let zero = |from: usize| {
                data[from..run_end(from).min(data.len())]
                    .iter()
                    .all(|&b| b == 0)
            };
            let kind = zero(at);
            let mut end = run_end(at).min(data.len());
            while end < data.len() && zero(end) == kind {
                end = run_end(end).min(data.len());
            }
            match kind {
                true => self.zero(off + at as u64, end - at)?,
                false => self.write(off + at as u64, &data[at..end])?,
            }
            at = end;
        }
        Ok(())
    }

    /// The first run of `[off, len)` that may hold data: `(start, end)`, both `len`
    /// if the rest is a hole ([`crate::holes`]). Reading a hole of a sparse pool on
    /// tmpfs would take its pages; a scan asks this first. A pool that cannot tell
    /// (a crash-simulator pool) says it is all data.
    pub fn data_run(&self, off: u64) -> (u64, u64) {
        let len = self.len as u64;
        let Some(fd) = self.fd().filter(|_| off < len) else {
            return (off.min(len), len);
        };
        let Some(start) = crate::holes::next_data(fd, off).map(|s| s.min(len)) else {
            return (len, len);
        };
        let end = crate::holes::next_hole(fd, start).clamp(start, len);
        (start, end)
    }

    /// Takes the file space under `[off, off + len)` now, if this pool grows: where
    /// a caller reads before its first store there, or wants the refusal before it
    /// changes anything.
    pub fn reserve(&self, off: u64, len: usize) -> Result<(), PoolError> {
        self.check(off, len)?;
        self.grow(off, len)
    }

    fn atomic(&self, off: u64) -> Result<&AtomicU64, PoolError> {
        let o = self.check(off, 8)?;
        if o % 8 != 0 || !(self.base as usize).is_multiple_of(8) {
            return Err(PoolError::Misaligned(off));
        }
        // SAFETY: in bounds and 8-byte aligned; the mapping outlives `&self`.
        Ok(unsafe { &*(self.base.add(o) as *const AtomicU64) })
    }

    /// Atomically loads the aligned u64 at `off` (e.g. a packed log tail).
    #[inline]
    pub fn load_u64(&self, off: u64) -> Result<u64, PoolError> {
        Ok(self.atomic(off)?.load(Ordering::Acquire))
    }

    /// Atomically stores the aligned u64 at `off`: the one store a crash cannot tear.
    #[inline]
    pub fn store_u64(&self, off: u64, value: u64) -> Result<(), PoolError> {
        debug_assert!(off.is_multiple_of(8), "an atomic store is 8-byte aligned");
        let word = self.atomic(off)?;
        self.grow(off, 8)?;
        word.store(value, Ordering::Release);
        self.record_store(off, 8);
        Ok(())
    }

    /// Makes `[off, off + len)` durable under the pool's mode, in program order.
    pub fn persist(&self, off: u64, len: usize) -> Result<(), PoolError> {
        let o = self.check(off, len)?;
        if len == 0 {
            return Ok(());
        }
        if self.tap.enabled() {
            // SAFETY: the checked range lies inside the mapping; the bytes are copied
            // out before anything else writes (callers own the range they persist).
            let bytes = unsafe { std::slice::from_raw_parts(self.base.add(o), len) };
            self.tap.record(off, bytes);
        }
        match self.mode {
            // SAFETY: the checked range lies inside the mapping.
            Mode::Dax => unsafe { flush::flush_range(self.flush, self.base.add(o), len) },
            Mode::Msync => {
                let page = 4096usize;
                let start = o & !(page - 1);
                let end = (o + len).div_ceil(page) * page;
                let end = end.min(self.len.div_ceil(page) * page);
                // SAFETY: start..end is page aligned and within the mapping.
                let rc = unsafe {
                    libc::msync(self.base.add(start) as *mut _, end - start, libc::MS_SYNC)
                };
                if rc != 0 {
                    return Err(PoolError::Io {
                        path: self.path.clone(),
                        what: "msync failed",
                        source: std::io::Error::last_os_error(),
                    });
                }
            }
            Mode::Volatile => fence(Ordering::SeqCst),
            Mode::CrashSim => match &self.backing {
                Backing::Sim { domain, id } | Backing::Tracked(TrackedFile { domain, id, .. }) => {
                    domain.on_persist(*id, o, len)
                }
                Backing::Mapped { .. } => unreachable!("a crash-sim pool has a crash domain"),
            },
        }
        Ok(())
    }

    /// Orders earlier stores before later ones (sfence).
    pub fn fence(&self) {
        fence(Ordering::SeqCst);
    }

    #[inline]
    fn record_store(&self, off: u64, len: usize) {
        if let Backing::Sim { domain, id } | Backing::Tracked(TrackedFile { domain, id, .. }) =
            &self.backing
        {
            domain.on_store(*id, off as usize, len);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Backing::Tracked(t) = &self.backing {
            // The domain copies the mapping before it goes.
            t.domain.detach(t.id);
        }
        if let Backing::Mapped { .. } | Backing::Tracked(_) = self.backing {
            // SAFETY: base/len came from a successful mmap and nothing borrows the
            // mapping past the Pool's lifetime.
            unsafe { libc::munmap(self.base as *mut _, self.len) };
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("path", &self.path)
            .field("len", &self.len)
            .field("mode", &self.mode)
            .finish()
    }
}

/// Creates (or truncates) the file at `path`, `size` bytes long and sparse.
fn new_file(path: &Path, size: u64) -> Result<File, PoolError> {
    let io = |what, source| PoolError::Io {
        path: path.to_owned(),
        what,
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| io("cannot create pool file", e))?;
    file.set_len(size)
        .map_err(|e| io("cannot size pool file", e))?;
    Ok(file)
}

/// Allocates the whole pool file up front, as a memory device has all its capacity:
/// a pool on a file system that later runs out of space would otherwise take SIGBUS
/// on a page fault in the middle of a write, instead of failing here with ENOSPC.
/// (tmpfs still zeroes each page at its first fault: [`Pool::create_reporting`] touches
/// them.) File systems without fallocate keep a sparse file. It goes a step at a time
/// so that `done` can tell how far it has come.
fn allocate(file: &File, size: u64, done: &mut dyn FnMut(u64)) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    const STEP: u64 = 128 << 20;
    let mut at = 0;
    while at < size {
        let len = STEP.min(size - at);
        match crate::grow::fallocate(file.as_raw_fd(), 0, at, len) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return Ok(()),
            Err(e) => return Err(e),
        }
        at += len;
        done(at);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new tmpfs pool was touched whole by its creator (tmpfs zeroes a page at its
    /// first fault, which must not fall on a client's write): the creating process
    /// has every page of it mapped, and a progress report reaches the pool's size.
    #[test]
    fn a_new_tmpfs_pool_is_touched_whole_before_use() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let size = 3 << 20;
        let mut seen = Vec::new();
        let pool =
            Pool::create_reporting(&dir.path().join("p"), size, ModeChoice::Auto, &mut |at| {
                seen.push(at)
            })
            .unwrap();
        assert_eq!(pool.mode(), Mode::Volatile);
        assert_eq!(seen.last(), Some(&size));
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
        let start = format!("{:x}-", pool.base as usize);
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let rss_kib: u64 = smaps
            .lines()
            .skip_while(|l| !l.starts_with(&start))
            .find_map(|l| l.strip_prefix("Rss:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("the Rss of the pool's mapping");
        assert_eq!(rss_kib * 1024, size);
    }

    #[test]
    fn tmpfs_pool_is_volatile_and_round_trips() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("p");
        let pool = Pool::create(&path, 1 << 20, ModeChoice::Auto).unwrap();
        assert_eq!(pool.mode(), Mode::Volatile);
        pool.write(100, b"hello").unwrap();
        pool.store_u64(4096, 0xdead_beef).unwrap();
        pool.persist(0, 8192).unwrap();
        drop(pool);
        let pool = Pool::open(&path, ModeChoice::Auto).unwrap();
        assert_eq!(pool.read_vec(100, 5).unwrap(), b"hello");
        assert_eq!(pool.load_u64(4096).unwrap(), 0xdead_beef);
        assert!(pool.durable_on_delivery());
        let msync = Pool::open(&path, ModeChoice::Force(Mode::Msync)).unwrap();
        assert!(!msync.durable_on_delivery(), "its pages wait for a flush");
    }

    #[test]
    fn a_volatile_pool_on_a_disk_is_not_durable_on_delivery() {
        // A reboot keeps the file and loses the pages never written back: a pool found
        // again there may lack what reached it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        let pool = Pool::create(&path, 1 << 20, ModeChoice::Force(Mode::Volatile)).unwrap();
        assert_eq!(pool.mode(), Mode::Volatile);
        let on_tmpfs = std::process::Command::new("stat")
            .args(["-f", "-c", "%T"])
            .arg(dir.path())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "tmpfs")
            .unwrap_or(false);
        assert_eq!(pool.durable_on_delivery(), on_tmpfs);
    }

    #[test]
    fn msync_mode_on_disk_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        let pool = Pool::create(&path, 1 << 16, ModeChoice::Force(Mode::Msync)).unwrap();
        assert_eq!(pool.mode(), Mode::Msync);
        pool.write_data(4000, &[7u8; 300]).unwrap();
        pool.persist(4000, 300).unwrap();
        assert_eq!(pool.read_vec(4000, 300).unwrap(), vec![7u8; 300]);
    }

    #[test]
    fn out_of_bounds_and_misaligned_are_errors() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let pool = Pool::create(&dir.path().join("p"), 4096, ModeChoice::Auto).unwrap();
        assert!(matches!(
            pool.write(4090, &[0; 8]),
            Err(PoolError::OutOfBounds { .. })
        ));
        assert!(matches!(
            pool.read(u64::MAX, &mut [0; 2]),
            Err(PoolError::OutOfBounds { .. })
        ));
        assert!(matches!(pool.load_u64(4), Err(PoolError::Misaligned(4))));
        assert!(pool.persist(0, 5000).is_err());
    }

    #[test]
    fn forcing_dax_on_tmpfs_is_refused_clearly() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let err = Pool::create(&dir.path().join("p"), 4096, ModeChoice::Force(Mode::Dax))
            .unwrap_err()
            .to_string();
        assert!(err.contains("DAX"), "{err}");
    }
}
