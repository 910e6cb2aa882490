//! What a client (a mount) did, for its `/metrics` endpoint: the client library's own
//! counters ([`orion_client::Stats`]: requests to the MDS, log commits, tail reads and
//! their hits, refetches and rebuilds of cached logs, re-executions after another
//! client's commit, reconnections, data-page reads and cache hits), read at each
//! scrape.

use std::sync::Arc;

use orion_client::Client;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::registry::Registry;

/// The registry of a mount: its client's counters.
pub fn registry(client: Arc<Client>) -> Arc<Registry> {
    let mut r = Registry::with_prefix("orion_client");
    r.register_collector(Box::new(Counters(client)));
    Arc::new(r)
}

struct Counters(Arc<Client>);

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("client counters")
    }
}

impl Collector for Counters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.0.stats();
        let rows: [(&str, &str, u64); 14] = [
            (
                "mds_requests",
                "Requests to the MDS (RPCs and log commits)",
                s.rpcs,
            ),
            ("commits", "Log commits", s.commits),
            (
                "staged_writes",
                "Writes staged to commit with others",
                s.staged_writes,
            ),
            (
                "tail_reads",
                "One-sided reads of an inode's tail",
                s.tail_reads,
            ),
            (
                "tail_hits",
                "Tail reads that found the cached copy current",
                s.tail_hits,
            ),
            (
                "refetches",
                "Cached logs that caught up with others' commits",
                s.refetches,
            ),
            ("loads", "Inodes loaded whole", s.loads),
            (
                "rebuilds",
                "Cached copies rebuilt from the MDS log",
                s.rebuilds,
            ),
            (
                "reexecutions",
                "Operations run again after another client's commit came first",
                s.reexecutions,
            ),
            (
                "reconnects",
                "Connections to the MDS made again",
                s.reconnects,
            ),
            (
                "store_retries",
                "Transfers with data stores run again",
                s.store_retries,
            ),
            (
                "map_changes",
                "Operations run again after the cluster map changed",
                s.map_changes,
            ),
            (
                "remote_reads",
                "One-sided reads of data pages from stores",
                s.remote_reads,
            ),
            (
                "cache_hits",
                "Data pages found in the client's cache",
                s.cache_hits,
            ),
        ];
        for (name, help, v) in rows {
            let c = ConstCounter::new(v);
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        Ok(())
    }
}
