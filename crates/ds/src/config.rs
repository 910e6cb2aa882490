//! What a data store is told to do.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DsConfig {
    /// The data pool file.
    pub pool: PathBuf,
    /// Size of the pool when `orion ds --format` creates it.
    pub pool_size: String,
    /// Persistence mode of the pool: auto, dax, msync, volatile.
    pub pool_mode: String,
    /// The replication group this store serves.
    pub group: u16,
    /// Its index among the group's replicas (`0..replicas`).
    pub index: u16,
    /// Address to listen on for clients ("host:port"; port 0 picks a free one).
    pub listen: String,
    /// The metadata server to join ("host:port"; the primary and its mirror,
    /// comma-separated).
    pub mds: String,
    /// host:port of the Prometheus endpoint (`/metrics`) the `orion` binary serves for
    /// this store ("": none; port 0: any free port).
    pub metrics: String,
    /// What the store counts into (not configured: made with the config).
    #[serde(skip)]
    pub counters: crate::metrics::DsMetrics,
}

impl Default for DsConfig {
    fn default() -> Self {
        DsConfig {
            pool: PathBuf::from("/dev/shm/orion/ds0.pool"),
            pool_size: "1GiB".into(),
            pool_mode: "auto".into(),
            group: 0,
            index: 0,
            listen: "127.0.0.1:7420".into(),
            mds: "127.0.0.1:7410".into(),
            metrics: String::new(),
            counters: Default::default(),
        }
    }
}
