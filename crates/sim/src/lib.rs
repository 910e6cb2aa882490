//! `orion-sim`: a whole OrionFS cluster in one process, for simulation tests.
//!
//! An MDS, data stores and clients run over the mock fabric ([`orion_fabric::mock`]),
//! each server on a thread of its own, with pools in a temporary directory on
//! `/dev/shm`. A test drives clients one operation at a time and, between
//! operations, stops and restarts servers the way a crashed process restarts: from
//! its pool as the process left it. The mock's faults (delayed and reordered
//! completions) come from the same seed as everything else. `tests/seeds.rs` runs
//! seeded operation sequences against a reference model (a tmpfs directory) and
//! checks every acknowledged operation after every restart.

mod cluster;

pub use cluster::{ClientKind, Cluster, ClusterConfig, MDS_ADDR};
