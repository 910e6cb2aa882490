//! What a mount did, for its `/metrics` endpoint: the client library's own
//! counters ([`orion_client::Stats`]: requests to the MDS, log commits, tail reads and
//! their hits, refetches and rebuilds of cached logs, re-executions after another
//! client's commit, reconnections, data-page reads and cache hits), and the time of
//! each call the mount served with the bytes it moved ([`orion_client::calls`]), read
//! at each scrape.

use std::sync::Arc;

use orion_client::calls::{bucket_bounds, CallTimes};
use orion_client::{Client, Stats};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The registry of a mount: its client's counters and call times.
pub fn registry(client: Arc<Client>) -> Arc<Registry> {
    let calls = client.calls().clone();
    Arc::new(registry_of(move || client.stats(), calls))
}

/// The same registry over any source of the figures (a test's, with no cluster).
pub fn registry_of(
    stats: impl Fn() -> Stats + Send + Sync + 'static,
    calls: Arc<CallTimes>,
) -> Registry {
    let mut r = Registry::with_prefix("orion_client");
    r.register_collector(Box::new(Figures {
        stats: Box::new(stats),
        calls,
    }));
    r
}

struct Figures {
    stats: Box<dyn Fn() -> Stats + Send + Sync>,
    calls: Arc<CallTimes>,
}

impl std::fmt::Debug for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a mount's figures")
    }
}

impl Collector for Figures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = (self.stats)();
        let rows: [(&str, &str, u64); 18] = [
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
                "gc_follows",
                "Cached copies that followed a log GC without a whole load",
                s.gc_follows,
            ),
            (
                "ahead_kept",
                "Commits the cached copy took while on their way, kept by the reply",
                s.ahead_kept,
            ),
            (
                "ahead_dropped",
                "Copies dropped because a commit they took on its way came after others",
                s.ahead_dropped,
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
                "room_waits",
                "Updates sent again while the MDS's free log pages were in their grace period",
                s.room_waits,
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
        let calls = &self.calls;
        let (read, written) = calls.bytes();
        for (name, help, v) in [
            ("read_bytes", "Bytes read from files", read),
            ("written_bytes", "Bytes written to files", written),
        ] {
            let c = ConstCounter::new(v);
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        let bounds = bucket_bounds();
        let mut family = encoder.encode_descriptor(
            "call_seconds",
            "Time each call of the mount took, by call (FUSE request)",
            None,
            MetricType::Histogram,
        )?;
        for f in calls.figures() {
            // The text format writes the last bucket as +Inf when its bound is f64::MAX.
            let buckets: Vec<(f64, u64)> = bounds
                .iter()
                .zip(f.buckets)
                .map(|(&b, n)| (if b.is_finite() { b } else { f64::MAX }, n))
                .collect();
            family
                .encode_family(&[("call", f.call.name())])?
                .encode_histogram::<NoLabelSet>(f.seconds, f.count, &buckets, None)?;
        }
        Ok(())
    }
}
