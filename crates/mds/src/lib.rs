//! `orion-mds`: the metadata server (paper §4, DESIGN.md §1, §3).
//!
//! It owns the authoritative MDS pool and registers it with the fabric so clients read
//! inode slots, log pages and 8-byte tails one-sided. One event loop polls every
//! connection ([`server`]); a log commit ([`commit`]) is appended, persisted and made
//! visible with one tail store before it is acknowledged; namespace RPCs ([`namespace`])
//! run on the metadata engine, which journals multi-inode changes; data pages are handed
//! to clients in chunks and tracked until committed ([`chunks`]); in strong mode a
//! commit waits until the data stores report its pages persisted ([`strong`]; applied
//! or parked in `apply`). Data
//! stores form replication groups whose members, states and epoch the cluster map
//! keeps ([`members`]); joins, departures and resyncs are handled in [`stores`].
//! With a cluster manager an MDS serves only while it holds the primary role
//! ([`primary`]); until then it mirrors the primary (`follow`), which writes what it
//! persists into a ring in the mirror's memory (`mirror`, `ring`); the start loops
//! between the two (`startup`). What it counts, for a Prometheus endpoint, is in
//! [`metrics`].

mod apply;
mod callbacks;
pub mod chunks;
mod clients;
pub mod commit;
pub mod config;
mod follow;
pub mod locks;
pub mod members;
pub mod metrics;
mod mirror;
pub mod namespace;
mod open_tables;
pub mod primary;
pub mod replies;
mod ring;
pub mod server;
mod startup;
pub mod stores;
pub mod strong;

pub use config::MdsConfig;
pub use follow::copy_marker;
pub use metrics::MdsMetrics;
pub use server::Ready;
pub use startup::{format_pool, run, serve};
