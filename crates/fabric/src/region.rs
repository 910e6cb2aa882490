//! Registered memory: mappings, regions and their remote descriptors.
//!
//! This is one of the few modules of the crate with `unsafe` code (the others, `futex`,
//! `readable` and `local::liveness`, wrap single kernel or C-library calls, and `ofi`
//! calls libfabric): a
//! [`Mapping`] owns an `mmap`ed range and every byte access to it, by this process or on behalf
//! of a peer, goes through its bounds-checked copy functions. Peers may read and write a
//! registered region at any time, so accesses are copies, never references into the memory.

use std::any::Any;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;

use crate::error::{Error, Result};

/// What a region allows. Local access (as the buffer of one's own operations) is always allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    pub remote_read: bool,
    pub remote_write: bool,
}

impl Access {
    pub const LOCAL: Access = Access {
        remote_read: false,
        remote_write: false,
    };
    pub const REMOTE_READ: Access = Access {
        remote_read: true,
        remote_write: false,
    };
    pub const REMOTE_WRITE: Access = Access {
        remote_read: false,
        remote_write: true,
    };
    pub const REMOTE_ALL: Access = Access {
        remote_read: true,
        remote_write: true,
    };

    pub fn is_remote(self) -> bool {
        self.remote_read || self.remote_write
    }

    pub(crate) fn bits(self) -> u32 {
        self.remote_read as u32 | (self.remote_write as u32) << 1
    }

    pub(crate) fn from_bits(b: u32) -> Access {
        Access {
            remote_read: b & 1 != 0,
            remote_write: b & 2 != 0,
        }
    }
}

/// An `mmap`ed byte range, unmapped on drop.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// The file a peer's region maps and where the mapping starts in it, kept by a
    /// reader of that region so that large reads skip its holes ([`Mapping::read_into`]).
    file: Option<(File, u64)>,
}

/// Reads at least this long skip the holes of a sparse file-backed region: a hole of a
/// shared tmpfs mapping gets a page when read, so a mirror's copy of a sparse MDS
/// pool would otherwise fill the primary's (real persistent memory has no holes).
const SPARSE_READ_MIN: usize = 256 << 10;

// SAFETY: the mapping is plain shared memory; all accesses are copies or atomics through the
// methods below, which are safe to call from any thread.
unsafe impl Send for Mapping {}
// SAFETY: as above; no method hands out references that alias mutable state.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub(crate) fn anonymous(len: usize) -> Result<Mapping> {
        Self::map(None, 0, len)
    }

    pub(crate) fn file(file: &File, offset: u64, len: usize) -> Result<Mapping> {
        Self::map(Some(file), offset, len)
    }

    fn map(file: Option<&File>, offset: u64, len: usize) -> Result<Mapping> {
        if len == 0 {
            return Err(Error::OutOfBounds {
                offset,
                len: 0,
                region_len: 0,
            });
        }
        let (flags, fd) = match file {
            Some(f) => (libc::MAP_SHARED, f.as_raw_fd()),
            None => (libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a fresh mapping chosen by the kernel; arguments are checked by mmap itself.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::io(
                "mmap of a fabric region",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(Mapping {
            ptr: NonNull::new(p.cast()).expect("mmap returned null"),
            len,
            file: None,
        })
    }

    /// This mapping of `file` from `offset`, keeping the file to find its holes if
    /// it has any (a data store's pool, allocated whole, has none).
    pub(crate) fn keeping_file(mut self, file: File, offset: u64) -> Mapping {
        use std::os::unix::fs::MetadataExt;
        let sparse = file.metadata().is_ok_and(|m| m.blocks() * 512 < m.len());
        if sparse {
            self.file = Some((file, offset));
        }
        self
    }

    /// Copies `len` bytes from this mapping at `src_off` to `dst` at `dst_off`, as
    /// [`Mapping::copy`]; a long copy from a sparse mapped file copies only what may
    /// hold data, a piece at a time, and writes zeros for the pieces in its holes,
    /// which stay holes. (Only `SEEK_DATA`: on tmpfs `SEEK_HOLE` walks every page
    /// up to the hole, all the rest of a dense file.)
    pub(crate) fn read_into(
        &self,
        src_off: u64,
        dst: &Mapping,
        dst_off: u64,
        len: usize,
    ) -> Result<()> {
        const PIECE: usize = 64 << 10;
        let Some((file, base)) = self.file.as_ref().filter(|_| len >= SPARSE_READ_MIN) else {
            return Mapping::copy(self, src_off, dst, dst_off, len);
        };
        let s = self.check(src_off, len)?;
        let d = dst.check(dst_off, len)?;
        let mut at = 0;
        while at < len {
            // Pieces aligned in the file: in a growing pool one with data lies in a
            // chunk allocated whole, whose holes take no more memory when read.
            let file_at = base + (s + at) as u64;
            let end = (at + (file_at + 1).next_multiple_of(PIECE as u64) as usize
                - file_at as usize)
                .min(len);
            // Where the data resumes, relative to the copy: past this piece, the
            // hole runs on to the start of the piece that holds it (all of the
            // rest if none does).
            let next = orion_pmem::holes::next_data(file.as_raw_fd(), file_at)
                .map(|x| (x - file_at) as usize + at);
            let (data, end) = match next {
                Some(x) if x < end => (x, end),
                Some(x) => {
                    // In the file, the piece holding `x` starts at or past `end`.
                    let origin = *base as usize + s;
                    let resume = ((x + origin) / PIECE * PIECE).saturating_sub(origin);
                    let resume = resume.clamp(end, len);
                    (resume, resume)
                }
                None => (len, len),
            };
            // Each piece moves on and stays inside the copy, whatever the file's holes.
            debug_assert!(
                at < end && end <= len,
                "piece {at}..{end} of a {len}-byte read"
            );
            // SAFETY: [at, end) of the copy lies inside both mappings (checked
            // above): zeros for the hole before `data`, then the bytes from there
            // (`copy` tolerates overlap when a region is read into itself).
            unsafe {
                std::ptr::write_bytes(dst.ptr.as_ptr().add(d + at), 0, data - at);
                std::ptr::copy(
                    self.ptr.as_ptr().add(s + data),
                    dst.ptr.as_ptr().add(d + data),
                    end - data,
                );
            }
            at = end;
        }
        Ok(())
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Maps in `[off, off + len)` for writing ahead of use
    /// ([`orion_pmem::populate::populate_write`]).
    pub(crate) fn populate_write(&self, off: u64, len: usize) -> Result<()> {
        let o = self.check(off, len)?;
        // SAFETY: `ptr` is the page-aligned start of this live mapping of `len`
        // bytes (mmap's), and `o..o + len` is inside it (checked above).
        unsafe { orion_pmem::populate::populate_write(self.ptr.as_ptr(), self.len, o, len) };
        Ok(())
    }

    pub(crate) fn check(&self, off: u64, len: usize) -> Result<usize> {
        let end = off.checked_add(len as u64);
        match end {
            Some(end) if end <= self.len as u64 => Ok(off as usize),
            _ => Err(Error::OutOfBounds {
                offset: off,
                len: len as u64,
                region_len: self.len as u64,
            }),
        }
    }

    pub(crate) fn read(&self, off: u64, dst: &mut [u8]) -> Result<()> {
        let o = self.check(off, dst.len())?;
        // SAFETY: [o, o+len) is inside the mapping (checked); dst is a distinct Rust buffer.
        unsafe {
            orion_pmem::copy::copy_nonoverlapping(
                self.ptr.as_ptr().add(o),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }

    pub(crate) fn write(&self, off: u64, src: &[u8]) -> Result<()> {
        let o = self.check(off, src.len())?;
        // SAFETY: [o, o+len) is inside the mapping (checked); src is a distinct Rust buffer.
        unsafe {
            orion_pmem::copy::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(o), src.len())
        };
        Ok(())
    }

    /// Copies `len` bytes from `src` at `src_off` to `dst` at `dst_off`: the data movement of a
    /// one-sided operation between two mappings (possibly the same one).
    pub(crate) fn copy(
        src: &Mapping,
        src_off: u64,
        dst: &Mapping,
        dst_off: u64,
        len: usize,
    ) -> Result<()> {
        let s = src.check(src_off, len)?;
        let d = dst.check(dst_off, len)?;
        // SAFETY: both ranges are inside their mappings (checked); `copy` tolerates overlap
        // when a region is read into itself.
        unsafe { std::ptr::copy(src.ptr.as_ptr().add(s), dst.ptr.as_ptr().add(d), len) };
        Ok(())
    }

    pub(crate) fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= self.len,
            "atomic u64 at {off} outside mapping"
        );
        // SAFETY: aligned and in bounds (asserted); AtomicU64 has the layout of u64 and the
        // memory lives as long as &self.
        unsafe { &*(self.ptr.as_ptr().add(off) as *const AtomicU64) }
    }

    pub(crate) fn atomic_u32(&self, off: usize) -> &AtomicU32 {
        assert!(
            off.is_multiple_of(4) && off + 4 <= self.len,
            "atomic u32 at {off} outside mapping"
        );
        // SAFETY: aligned and in bounds (asserted); the memory lives as long as &self.
        unsafe { &*(self.ptr.as_ptr().add(off) as *const AtomicU32) }
    }

    /// Raw base pointer, for handing to libfabric (registration, operation buffers).
    pub(crate) fn base_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the range was mapped by Mapping::map and is unmapped exactly once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// What a peer needs to reach a region: the key, the base address used on the wire (the
/// region's virtual address when the provider wants virtual addressing, else 0) and its length.
/// Applications ship it to peers in their own messages ([`RemoteRegion::encode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    pub key: u64,
    pub addr: u64,
    pub len: u64,
}

impl RemoteRegion {
    pub const ENCODED_LEN: usize = 24;

    pub fn encode(&self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[0..8].copy_from_slice(&self.key.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<RemoteRegion> {
        let b: &[u8; 24] = b.get(..24)?.try_into().ok()?;
        let f = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        Some(RemoteRegion {
            key: f(0),
            addr: f(8),
            len: f(16),
        })
    }

    /// The sub-range [offset, offset+len) of this region, checked.
    pub fn slice(&self, offset: u64, len: u64) -> Result<RemoteRegion> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(RemoteRegion {
                key: self.key,
                addr: if self.addr == 0 {
                    0
                } else {
                    self.addr + offset
                },
                len,
            }),
            _ => Err(Error::OutOfBounds {
                offset,
                len,
                region_len: self.len,
            }),
        }
    }
}

/// Backend state of a registered region (a libfabric MR, a slot in the local region table);
/// dropping it deregisters the region.
pub(crate) trait RegionBackend: Send + Sync + Any {
    fn revoke(&self);
    fn as_any(&self) -> &dyn Any;
}

pub(crate) struct RegionInner {
    pub(crate) map: Mapping,
    pub(crate) key: u64,
    pub(crate) wire_addr: u64,
    pub(crate) access: Access,
    pub(crate) domain: u64,
    pub(crate) backend: Option<Box<dyn RegionBackend>>,
}

impl Drop for RegionInner {
    fn drop(&mut self) {
        if let Some(b) = self.backend.take() {
            b.revoke();
        }
    }
}

/// A registered memory region of a [`crate::Domain`]. Cheap to clone; deregistered when the
/// last clone (including those held by posted operations) is gone.
#[derive(Clone)]
pub struct Region {
    pub(crate) inner: Arc<RegionInner>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("len", &self.len())
            .field("access", &self.inner.access)
            .finish()
    }
}

impl Region {
    pub fn len(&self) -> usize {
        self.inner.map.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn access(&self) -> Access {
        self.inner.access
    }

    /// The descriptor peers use to address this region.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            key: self.inner.key,
            addr: self.inner.wire_addr,
            len: self.len() as u64,
        }
    }

    /// Refuses every later remote access with this region's key. Local use continues.
    pub fn revoke(&self) {
        if let Some(b) = &self.inner.backend {
            b.revoke();
        }
    }

    pub fn read(&self, off: u64, dst: &mut [u8]) -> Result<()> {
        self.inner.map.read(off, dst)
    }

    pub fn write(&self, off: u64, src: &[u8]) -> Result<()> {
        self.inner.map.write(off, src)
    }

    /// Atomic 8-byte load at an aligned offset (what a remote 8-byte tail read observes).
    pub fn load_u64(&self, off: u64) -> Result<u64> {
        self.check_word(off)?;
        Ok(self
            .inner
            .map
            .atomic_u64(off as usize)
            .load(std::sync::atomic::Ordering::Acquire))
    }

    pub fn store_u64(&self, off: u64, v: u64) -> Result<()> {
        self.check_word(off)?;
        self.inner
            .map
            .atomic_u64(off as usize)
            .store(v, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    fn check_word(&self, off: u64) -> Result<()> {
        self.inner.map.check(off, 8)?;
        if !off.is_multiple_of(8) {
            return Err(Error::OutOfBounds {
                offset: off,
                len: 8,
                region_len: self.len() as u64,
            });
        }
        Ok(())
    }

    pub(crate) fn backend<T: 'static>(&self) -> Option<&T> {
        self.inner.backend.as_ref()?.as_any().downcast_ref::<T>()
    }

    pub(crate) fn open_file(
        path: &Path,
        offset: u64,
        len: usize,
        writable: bool,
    ) -> Result<(File, Mapping)> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let size = file
            .metadata()
            .map_err(|e| Error::io(format!("stat of {}", path.display()), e))?
            .len();
        if offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(Error::OutOfBounds {
                offset,
                len: len as u64,
                region_len: size,
            });
        }
        let map = Mapping::file(&file, offset, len)?;
        Ok((file, map))
    }
}

/// A fresh random 64-bit value for remote keys and nonces; never 0, which marks a free slot.
pub(crate) fn random_u64() -> u64 {
    loop {
        let mut b = [0u8; 8];
        getrandom::getrandom(&mut b).expect("the OS random source failed");
        let v = u64::from_le_bytes(b);
        if v != 0 {
            return v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_read_of_a_sparse_file_copies_its_data_and_leaves_its_holes() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("sparse");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(8 << 20).unwrap();
        file.write_all_at(&[7u8; 5000], 1 << 20).unwrap();
        file.write_all_at(b"end", (7 << 20) + 5).unwrap();
        let taken = file.metadata().unwrap().blocks();
        // Mapped from 1 MiB on, as a region may start inside its file.
        let src = Mapping::file(&file, 1 << 20, 7 << 20)
            .unwrap()
            .keeping_file(file.try_clone().unwrap(), 1 << 20);
        let dst = Mapping::anonymous(8 << 20).unwrap();
        dst.write(0, &[1u8; 8 << 20]).unwrap();
        src.read_into(0, &dst, 4096, 7 << 20).unwrap();
        let mut back = vec![0u8; 7 << 20];
        dst.read(4096, &mut back).unwrap();
        let mut want = vec![0u8; 7 << 20];
        want[..5000].fill(7);
        want[(6 << 20) + 5..(6 << 20) + 8].copy_from_slice(b"end");
        assert!(back == want, "the data, and zeros for the holes");
        let mut before = [0u8; 4096];
        dst.read(0, &mut before).unwrap();
        assert_eq!(
            before, [1u8; 4096],
            "nothing written before the destination"
        );
        // Only the 64 KiB pieces with data were read whole: the holes between
        // stay holes.
        let grown = (file.metadata().unwrap().blocks() - taken) * 512;
        assert!(grown <= 2 * (64 << 10), "{grown} bytes of holes filled");
        let fd = file.as_raw_fd();
        assert_eq!(
            orion_pmem::holes::next_data(fd, 2 << 20),
            Some((7 << 20) & !0xffff)
        );
        // From an unaligned start, into the middle of a piece with data and across
        // the holes after it: the same bytes.
        let from = (1 << 20) - 3000;
        src.read_into(from as u64, &dst, 0, 5 << 20).unwrap();
        let mut back = vec![0u8; 5 << 20];
        dst.read(0, &mut back).unwrap();
        assert!(back == want[from..from + (5 << 20)], "an unaligned read");
        // A short read copies as it is.
        let mut small = [0u8; 8];
        src.read_into(4998, &dst, 0, 8).unwrap();
        dst.read(0, &mut small).unwrap();
        assert_eq!(small, [7, 7, 0, 0, 0, 0, 0, 0]);
    }
}
