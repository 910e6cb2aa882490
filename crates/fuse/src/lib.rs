//! `orion-fuse`: OrionFS as a mounted file system (DESIGN.md §6). The kernel resolves
//! paths and calls this crate by inode number; each call goes to the client library
//! ([`orion_client::Client`]), which keeps Orion's consistency: every use of an inode
//! checks its log tail at the MDS, so the mount sees other clients' changes at once.
//! The kernel keeps names and attributes for as long as the client's cache lease,
//! and the MDS's callbacks drop its copies before another client's change is
//! acknowledged ([`cache`]); file data bypasses the page cache (direct I/O, with
//! shared mmap still allowed where the kernel supports it) unless the mount keeps
//! it too (`OrionFs::with_data_cache`), dropped by the same callbacks.
//!
//! [`fs::OrionFs`] is the `fuser::Filesystem`; [`mount`] mounts it and serves until
//! unmounted or asked to stop; [`metrics`] is what its `/metrics` endpoint shows.
//! [`passthrough`] is a null passthrough of a local
//! directory with the same settings, the FUSE floor for the benchmarks.

pub mod cache;
mod convert;
pub mod fs;
mod listings;
pub mod metrics;
pub mod mount;
mod nodes;
pub mod passthrough;

pub use fs::OrionFs;
pub use mount::{mount, unmount_stale, MountOptions};
