//! Counters of what the client did, for tests, benchmarks and `orion fs --stats`.

/// Every counter only grows.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Requests to the MDS (RPCs and log commits).
    pub rpcs: u64,
    pub commits: u64,
    /// Writes staged to commit later with others (optimistic persistence).
    pub staged_writes: u64,
    /// One-sided reads of an inode's slot and tail.
    pub tail_reads: u64,
    /// Tail reads that found the cached copy current.
    pub tail_hits: u64,
    /// Cached logs that caught up with entries other clients committed.
    pub refetches: u64,
    /// Inodes loaded whole (first use, or a log rewritten by GC).
    pub loads: u64,
    /// Cached copies thrown away and rebuilt from the MDS log (arbitration, paper §4.3).
    pub rebuilds: u64,
    /// Cached copies that followed a log GC without loading the new log whole (design
    /// note 76).
    pub gc_follows: u64,
    /// Commits whose entries the cached copy took while they were on their way, and
    /// kept by the reply (design note 77).
    pub ahead_kept: u64,
    /// ... and dropped the copy for: other clients' commits came first, the commit
    /// did not land, or an entry did not apply to the copy.
    pub ahead_dropped: u64,
    /// Operations run again because the MDS ordered another client's commit first.
    pub reexecutions: u64,
    pub reconnects: u64,
    /// Transfers with data stores run again after a failure (a store died, or its
    /// connection broke).
    pub store_retries: u64,
    /// Operations run again because the cluster map changed under them.
    pub map_changes: u64,
    /// Updates sent again because the MDS's metadata pool had room only in pages
    /// still in their grace period (it answers EAGAIN rather than wait, design note 74).
    pub room_waits: u64,
    /// One-sided reads of data pages from remote stores.
    pub remote_reads: u64,
    pub cache_hits: u64,
    /// Connections opened to data stores (each when a transfer first needed it).
    pub store_connections: u64,
}

impl Stats {
    /// Adds `o`'s counters to these (a client's lanes count separately).
    pub fn add(&mut self, o: &Stats) {
        self.rpcs += o.rpcs;
        self.commits += o.commits;
        self.staged_writes += o.staged_writes;
        self.tail_reads += o.tail_reads;
        self.tail_hits += o.tail_hits;
        self.refetches += o.refetches;
        self.loads += o.loads;
        self.rebuilds += o.rebuilds;
        self.gc_follows += o.gc_follows;
        self.ahead_kept += o.ahead_kept;
        self.ahead_dropped += o.ahead_dropped;
        self.reexecutions += o.reexecutions;
        self.reconnects += o.reconnects;
        self.store_retries += o.store_retries;
        self.map_changes += o.map_changes;
        self.room_waits += o.room_waits;
        self.remote_reads += o.remote_reads;
        self.cache_hits += o.cache_hits;
        self.store_connections += o.store_connections;
    }
}
