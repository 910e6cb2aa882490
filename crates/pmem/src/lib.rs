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

mod crash;
mod flush;
mod pool;

pub use crash::{CrashDomain, CrashImage};
pub use pool::{Mode, ModeChoice, Pool, PoolError};

/// Size of a cache line: the unit of persistence and of torn writes.
pub const LINE: usize = 64;
