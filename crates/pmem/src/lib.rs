//! `orion-pmem`: pools of persistent memory.
//!
//! A pool is a file mapped `MAP_SHARED`. How a store becomes durable depends on the
//! [`Mode`]: `dax` flushes cache lines (clwb/clflushopt + sfence) on a `MAP_SYNC`
//! mapping, `msync` syncs the dirty page range, `volatile` (a file on tmpfs, the way
//! the Orion paper emulated NVMM) only orders stores, and `crash-sim` records every
//! store and persist per 64-byte line so tests can produce any image a power failure
//! could leave ([`CrashDomain`]).
//!
//! Everything above this crate reaches the media only through [`Pool`]: offsets are
//! checked, and the only atomic unit is an aligned 8-byte store.

pub mod copy;
mod crash;
mod file;
mod flush;
mod grow;
pub mod holes;
mod pool;
pub mod populate;
pub mod tap;

pub use copy::copy_bytes;
pub use crash::{CrashDomain, CrashHook, CrashImage};
pub use file::replace_durably;
pub use pool::{Mode, ModeChoice, Pool, PoolError};

/// Size of a cache line: the unit of persistence and of torn writes.
pub const LINE: usize = 64;

/// Parses a size: "4096", "64K", "256M", "4G", "1GiB".
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().trim_end_matches("iB").trim_end_matches('B');
    let (num, mul) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        Some('T' | 't') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("invalid size {s:?}: use bytes or a suffix K, M, G, T"))
}

impl std::str::FromStr for ModeChoice {
    type Err = String;
    /// "auto" or a mode name ("dax", "msync", "volatile").
    fn from_str(s: &str) -> Result<ModeChoice, String> {
        if s == "auto" {
            return Ok(ModeChoice::Auto);
        }
        s.parse::<Mode>().map(ModeChoice::Force)
    }
}
