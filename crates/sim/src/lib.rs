//! `orion-sim`: a whole OrionFS cluster in one process, for simulation tests.
//!
//! An MDS, data stores and clients run over the mock fabric ([`orion_fabric::mock`]),
//! each server on a thread of its own, with pools in a temporary directory on
//! `/dev/shm`. A test drives clients one operation at a time; between operations it
//! restarts servers or kills them as a process dies (from the pool as the process
//! left it), and the MDS can lose power at any step of its pool, inside an operation
//! (its pool is tracked by the crash simulator, [`orion_pmem::CrashDomain`]). The
//! mock's faults (delayed and reordered completions) come from the same seed as
//! everything else. `tests/seeds.rs` runs seeded operation sequences against a
//! reference model (a tmpfs directory) and checks every acknowledged operation after
//! every restart and crash. [`MirroredCluster`] runs an MDS with its mirror under the
//! embedded cluster manager and kills the primary inside operations
//! (`tests/mirror.rs`).

mod cluster;
mod mirrored;

pub use cluster::{free_inodes, wait_free_inodes};
pub use cluster::{store_addr, ClientKind, Cluster, ClusterConfig, MDS_ADDR};
pub use mirrored::{MdsFault, MirroredCluster, MDSS};
pub use orion_proto::MemberId;

/// A test's seed: `ORION_SEED` when set, else `default`; printed, so a failure can
/// be run again with it.
pub fn seed_or(default: u64) -> u64 {
    let s = (std::env::var("ORION_SEED").ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    eprintln!("ORION_SEED={s}");
    s
}
