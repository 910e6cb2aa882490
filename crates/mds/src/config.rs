//! What an MDS is told to do: its pool, where it listens, and its policies.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MdsConfig {
    /// The MDS pool file (on /dev/shm, a DAX file system, or any file system).
    pub pool: PathBuf,
    /// Size of the pool when `orion mds --format` creates it.
    pub pool_size: String,
    /// Persistence mode of the pool: auto, dax, msync, volatile.
    pub pool_mode: String,
    /// Address to listen on ("host:port"; port 0 picks a free one).
    pub listen: String,
    /// Most pages one delegated-allocation chunk may hold (paper §5.1).
    pub max_chunk_pages: u32,
    /// How long freed log and data pages wait before reuse, in milliseconds: clients
    /// may still be reading them one-sided.
    pub grace_ms: u64,
    /// How long a strong-mode commit waits for the data stores to report its pages
    /// persisted before it fails, in milliseconds.
    pub persist_timeout_ms: u64,
    /// Data stores per replication group: every page is written to each (1: no
    /// replication).
    pub replicas: u16,
    /// How long a client reads data pages by the cluster map it has before it asks
    /// again, in milliseconds. A store that leaves the map takes no commit of its
    /// group's pages for that long, so no client reads from it a page it lacks.
    pub map_lease_ms: u64,
    /// A data store that sends nothing for this long (it sends a heartbeat every
    /// quarter of it, the period the MDS gives it at join) is taken for dead, in
    /// milliseconds.
    pub heartbeat_timeout_ms: u64,
    /// The cluster manager that says which MDS is primary: "" (none: this MDS serves
    /// alone), "embedded:HOST:PORT" or "etcd:HOST:PORT[,HOST:PORT...]".
    pub manager: String,
    /// This MDS's name for the manager ("": `mds@` and its address).
    pub name: String,
    /// The cluster's name for the manager ("": the cluster id in the MDS pool). A
    /// mirror that starts without a pool needs it to find its primary.
    pub cluster: String,
    /// The primary's lease, in milliseconds: a primary that cannot renew it stops
    /// within it. etcd grants whole seconds, and at least its own minimum (about 1.5
    /// times its election timeout): a fail-over through etcd follows that.
    pub lease_ms: u64,
    /// How long an MDS grants no chunk after it starts serving, in milliseconds
    /// (clients wait). A client writes into a chunk only within half this time of
    /// an answer from the MDS that granted it; the MDS before this one (a restart,
    /// or a primary cut off from its mirror) may have granted pages that look free
    /// here (design note 55).
    pub grant_quiet_ms: u64,
    /// A client's cache lease, in milliseconds: how long its kernel may use names
    /// and attributes without asking, at most, and how long a change waits for a
    /// client that does not answer its callback (design note 56).
    pub cache_lease_ms: u64,
    /// How long a client's open table outlives its connections (a reconnection
    /// finds it), in milliseconds; 0: the longer of `lease_ms` and
    /// `cache_lease_ms`. A client notices a dead MDS process at once, but a host
    /// that vanishes silently only when a call times out: `open_reclaim_ms` covers
    /// that after a restart or a fail-over (design notes 58, 62, 69).
    pub open_grace_ms: u64,
    /// How long a new MDS (a restart, a fail-over) waits for the clients that held
    /// open tables at its predecessor (the pool records them) to write them again
    /// before it destroys unlinked files they may hold, in milliseconds. It ends as
    /// soon as all have. A client whose MDS's host vanished silently comes back only
    /// after its call timed out (`op_timeout_ms`, 30 s by default), a ping went
    /// unanswered (1 s) and it reconnected: keep this longer than their sum, with
    /// room for a slow connect (design note 62).
    pub open_reclaim_ms: u64,
    /// host:port of the Prometheus endpoint (`/metrics`) the `orion` binary serves for
    /// this MDS ("": none; port 0: any free port).
    pub metrics: String,
    /// What the MDS counts into (not configured: made with the config, shared by the
    /// MDS's terms).
    #[serde(skip)]
    pub counters: crate::metrics::MdsMetrics,
}

impl Default for MdsConfig {
    fn default() -> Self {
        MdsConfig {
            pool: PathBuf::from("/dev/shm/orion/mds.pool"),
            pool_size: "1GiB".into(),
            pool_mode: "auto".into(),
            listen: "127.0.0.1:7410".into(),
            max_chunk_pages: 4096,
            grace_ms: 1000,
            persist_timeout_ms: 10_000,
            replicas: 1,
            map_lease_ms: 1000,
            heartbeat_timeout_ms: 1000,
            manager: String::new(),
            name: String::new(),
            cluster: String::new(),
            lease_ms: 1000,
            grant_quiet_ms: 200,
            cache_lease_ms: 200,
            open_grace_ms: 0,
            open_reclaim_ms: 60_000,
            metrics: String::new(),
            counters: Default::default(),
        }
    }
}
