//! `orion-ds`: a data store (paper §5, DESIGN.md §4).
//!
//! It owns a data pool of 4 KiB pages and registers the page area with the fabric, so
//! clients read and write pages one-sided without this process's CPU (on RDMA; over
//! TCP the provider's progress needs the poller). A strong-mode client writes with an
//! immediate value carrying the page index: the store persists that page and tells the
//! MDS, which applies the matching log commit only then (paper §5.3). A store that
//! joins its replication group without every committed page copies them from a peer
//! first ([`resync`], paper §5.4). What it counts, for a Prometheus endpoint, is in
//! [`metrics`].

mod config;
mod host;
pub mod metrics;
mod resync;
mod server;

pub use config::DsConfig;
pub use metrics::DsMetrics;
pub use server::{format_pool, run, Ready};
