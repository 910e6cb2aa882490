//! `orion-client`: the OrionFS client library (paper §4.3, §5; DESIGN.md §3, §4).
//!
//! A [`Client`] connects to the metadata server and the data stores over the fabric
//! ([`link`]) and offers POSIX-shaped calls on paths and file handles ([`fs`]). It keeps
//! copies of the inodes it uses and checks them against the MDS's log tail with a
//! one-sided read before each use ([`arbitration`]); it allocates data pages from
//! chunks the MDS delegates ([`alloc`]); it reads and writes data pages copy-on-write,
//! from a mapped local pool, a DRAM cache or one-sided operations ([`data`]); with
//! optimistic persistence it commits small writes in batches ([`staging`]).

pub mod alloc;
pub mod arbitration;
pub mod config;
pub mod data;
pub mod fs;
pub mod link;
pub mod staging;
pub mod stats;

pub use config::ClientConfig;
pub use fs::{Client, DirEntry, Fd, OpenFlags};
pub use stats::Stats;
