//! What the MDS counts, for a `/metrics` endpoint (Prometheus text format; the `orion`
//! binary serves [`MdsMetrics::registry`] over HTTP): requests by kind with the time
//! the event loop spent on each, malformed messages, connections by role, the pools'
//! use (data pages, inode slots, log pages), updates refused for log room, the epoch,
//! the primary's lease, the cache callbacks in flight, log GC and
//! journal commits, and commits waiting for stores in strong mode. The loop updates them (atomics; a
//! histogram takes a short lock), so a scrape never waits for it, and one registry
//! outlives the MDS's terms (a mirror that takes over counts on).

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use orion_proto::MdsInbound;
use tracing::warn;

use crate::server::{Mds, Role};

type Labels = Vec<(String, String)>;

/// How often the loop refreshes the gauges (a scrape sees them this stale at most).
const GAUGES_EVERY: Duration = Duration::from_millis(200);
/// How often the log says, at most, that updates wait for log room.
const ROOM_TOLD_EVERY: Duration = Duration::from_secs(10);

fn latency() -> Histogram {
    // 1 µs to about half a second.
    Histogram::new(exponential_buckets(1e-6, 2.0, 20))
}

/// The metrics of one MDS process, shared by its terms (clones share them).
#[derive(Clone)]
pub struct MdsMetrics(Arc<Inner>);

struct Inner {
    registry: Arc<Registry>,
    /// The counter and histogram of each request kind, by [`kind_slot`] (every kind's
    /// made at start: nothing is allocated per request).
    by_kind: Vec<Option<(Counter, Histogram)>>,
    malformed: Counter,
    connections: Family<Labels, Gauge>,
    data_pages: Gauge,
    data_pages_free: Gauge,
    inodes: Gauge,
    inodes_free: Gauge,
    log_pages: Gauge,
    log_pages_free: Gauge,
    room_refusals: Counter,
    no_space: Family<Labels, Counter>,
    epoch: Gauge,
    callbacks_waiting: Gauge,
    callbacks_sent: Counter,
    lease_left: Gauge<f64, std::sync::atomic::AtomicU64>,
    gc_runs: Counter,
    gc_pages_freed: Counter,
    journal_commits: Counter,
    strong_waits: Counter,
    strong_waiting: Gauge,
    unlinked_open: Gauge,
}

/// When the loop refreshes the metrics next, and what of this term's own counts
/// (the engine's, the strong waits') it added to the counters so far: a term starts
/// them at zero, and the counters go on from what earlier terms added.
pub(crate) struct Turn {
    due: Instant,
    gc_runs: u64,
    gc_pages_freed: u64,
    journal_commits: u64,
    strong_waits: u64,
    /// Refusals for room counted when the operator was last told (or when this term
    /// began: the registry counts earlier terms' too), and when.
    room_refusals: Option<u64>,
    room_told: Option<Instant>,
}

impl Default for Turn {
    fn default() -> Self {
        Turn {
            due: Instant::now(),
            gc_runs: 0,
            gc_pages_freed: 0,
            journal_commits: 0,
            strong_waits: 0,
            room_refusals: None,
            room_told: None,
        }
    }
}

impl Default for MdsMetrics {
    fn default() -> Self {
        let mut r = Registry::with_prefix("orion_mds");
        let requests = Family::<Labels, Counter>::default();
        r.register("requests", "Requests served, by kind", requests.clone());
        let seconds = Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(latency);
        r.register(
            "request_seconds",
            "Time the event loop spent on a request, by kind (a commit that waits for \
             its pages to persist is answered later: its wait is not in here)",
            seconds.clone(),
        );
        let malformed = Counter::default();
        r.register(
            "malformed_messages",
            "Messages that did not decode",
            malformed.clone(),
        );
        let connections = Family::<Labels, Gauge>::default();
        r.register("connections", "Connections, by role", connections.clone());
        let no_space = Family::<Labels, Counter>::default();
        r.register(
            "no_space_replies",
            "Requests answered ENOSPC, by the resource that ran out (inode slots, \
             log pages, data pages, space for the MDS's pool file)",
            no_space.clone(),
        );
        for res in orion_meta::error::Resource::ALL {
            let _ = no_space.get_or_create(&vec![("resource".to_string(), res.label().into())]);
        }
        let gauge = |r: &mut Registry, name: &str, help: &str| {
            let g = Gauge::default();
            r.register(name, help, g.clone());
            g
        };
        let data_pages = gauge(
            &mut r,
            "data_pages",
            "Data pages of every replication group",
        );
        let data_pages_free = gauge(&mut r, "data_pages_free", "Data pages not allocated");
        let inodes = gauge(&mut r, "inodes", "Inode slots of the MDS pool");
        let inodes_free = gauge(&mut r, "inodes_free", "Inode slots free");
        let log_pages = gauge(&mut r, "log_pages", "Log pages of the MDS pool");
        let log_pages_free = gauge(
            &mut r,
            "log_pages_free",
            "Log pages free, counting those still in their grace period",
        );
        let epoch = gauge(&mut r, "epoch", "The cluster map's epoch");
        let callbacks_waiting = gauge(
            &mut r,
            "replies_waiting_for_callbacks",
            "Replies held until clients answer cache callbacks",
        );
        let callbacks_sent = Counter::default();
        r.register(
            "cache_callbacks",
            "Invalidation messages sent to clients' callback connections",
            callbacks_sent.clone(),
        );
        let lease_left = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        r.register(
            "lease_seconds_left",
            "How long the primary's lease lasts from now unless renewed (0: not the \
             primary, or no cluster manager)",
            lease_left.clone(),
        );
        let counter = |r: &mut Registry, name: &str, help: &str| {
            let c = Counter::default();
            r.register(name, help, c.clone());
            c
        };
        let gc_runs = counter(&mut r, "gc_runs", "Inode logs compacted (log GC)");
        let gc_pages_freed = counter(
            &mut r,
            "gc_log_pages_freed",
            "Log pages GC gave back (free after the grace period)",
        );
        let journal_commits = counter(
            &mut r,
            "journal_commits",
            "Updates of several inodes made atomic through the journal",
        );
        let room_refusals = counter(
            &mut r,
            "room_refusals",
            "Updates refused with EAGAIN because the free log pages they needed were \
             still in their grace period (their clients send them again; a full MDS pool)",
        );
        let strong_waits = counter(
            &mut r,
            "strong_waits",
            "Commits that waited for stores to report their pages persisted (strong mode)",
        );
        let strong_waiting = gauge(
            &mut r,
            "strong_waiting",
            "Commits waiting now for stores to report their pages persisted",
        );
        let unlinked_open = gauge(
            &mut r,
            "unlinked_open_files",
            "Unlinked files and removed directories kept because a client may hold them open",
        );
        for role in ["new", "client", "store", "mirror"] {
            let _ = connections.get_or_create(&vec![("role".to_string(), role.to_string())]);
        }
        let mut by_kind = vec![None; 3 * 64];
        for (i, name) in every_kind() {
            let l = vec![("kind".to_string(), name)];
            by_kind[i] = Some((
                requests.get_or_create(&l).clone(),
                seconds.get_or_create(&l).clone(),
            ));
        }
        MdsMetrics(Arc::new(Inner {
            registry: Arc::new(r),
            by_kind,
            malformed,
            connections,
            no_space,
            data_pages,
            data_pages_free,
            inodes,
            inodes_free,
            log_pages,
            log_pages_free,
            room_refusals,
            epoch,
            callbacks_waiting,
            callbacks_sent,
            lease_left,
            gc_runs,
            gc_pages_freed,
            journal_commits,
            strong_waits,
            strong_waiting,
            unlinked_open,
        }))
    }
}

impl std::fmt::Debug for MdsMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MdsMetrics")
    }
}

/// Counters are not configuration: two configurations that say the same are equal,
/// whatever their daemons counted.
impl PartialEq for MdsMetrics {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// A request kind's slot: clients' kinds, then stores', then the mirror's.
pub(crate) fn kind_slot(req: &MdsInbound) -> usize {
    let (base, code) = match req {
        MdsInbound::Client(r) => (0, r.kind() as usize),
        MdsInbound::Store(s) => (64, s.kind() as usize),
        MdsInbound::Mirror(m) => (128, m.kind() as usize),
    };
    (base + code).min(3 * 64 - 1)
}

fn slot(base: usize, prefix: &str, code: u8, kind: impl std::fmt::Debug) -> (usize, String) {
    (
        (base + code as usize).min(3 * 64 - 1),
        snake(&format!("{prefix}{kind:?}")),
    )
}

/// Every kind a client, a store or the mirror can send, with its slot: their series
/// exist (at zero) from the start, so a rate over them is defined at once.
fn every_kind() -> Vec<(usize, String)> {
    let mut v = Vec::new();
    for code in 0..64u8 {
        if let Ok(k) = orion_proto::MdsKind::try_from(code) {
            v.push(slot(0, "", code, k));
        }
        if let Ok(k) = orion_proto::StoreToMdsKind::try_from(code) {
            v.push(slot(64, "store_", code, k));
        }
        if let Ok(k) = orion_proto::MirrorToMdsKind::try_from(code) {
            v.push(slot(128, "mirror_", code, k));
        }
    }
    v
}

/// "AllocChunk" → "alloc_chunk".
fn snake(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 4);
    for (i, c) in s.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 && !out.ends_with('_') {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

impl MdsMetrics {
    /// What an HTTP endpoint encodes.
    pub fn registry(&self) -> Arc<Registry> {
        self.0.registry.clone()
    }

    /// A request of kind `slot` (from [`kind_slot`]) arrived: counted before it is
    /// answered, so a client that got its answer finds it counted.
    pub(crate) fn arrived(&self, slot: usize) {
        if let Some((c, _)) = &self.0.by_kind[slot] {
            c.inc();
        }
    }

    /// The loop spent `spent` on a request of kind `slot`.
    pub(crate) fn served(&self, slot: usize, spent: Duration) {
        if let Some((_, h)) = &self.0.by_kind[slot] {
            h.observe(spent.as_secs_f64());
        }
    }

    /// This MDS lost the primary role: what it said of the cluster (connections,
    /// pools, held replies) is no longer its to say, and sums over every MDS must not
    /// count it twice.
    pub(crate) fn demoted(&self) {
        let m = &self.0;
        for role in ["new", "client", "store", "mirror"] {
            let l = vec![("role".to_string(), role.to_string())];
            m.connections.get_or_create(&l).set(0);
        }
        for g in [
            &m.data_pages,
            &m.data_pages_free,
            &m.inodes,
            &m.inodes_free,
            &m.log_pages,
            &m.log_pages_free,
        ] {
            g.set(0);
        }
        m.callbacks_waiting.set(0);
        m.strong_waiting.set(0);
        m.unlinked_open.set(0);
        m.lease_left.set(0.0);
    }

    /// `n` invalidation messages went to clients.
    pub(crate) fn callbacks_sent(&self, n: usize) {
        self.0.callbacks_sent.inc_by(n as u64);
    }

    pub(crate) fn malformed(&self) {
        self.0.malformed.inc();
    }

    /// A request was answered ENOSPC for want of `resource`.
    pub(crate) fn no_space(&self, resource: orion_meta::error::Resource) {
        let l = vec![("resource".to_string(), resource.label().to_string())];
        self.0.no_space.get_or_create(&l).inc();
    }

    /// An update was refused for room (design note 74).
    pub(crate) fn refused_for_room(&self) {
        self.0.room_refusals.inc();
    }
}

impl Mds {
    /// Refreshes the metrics now: the term ends, and what it did since the last
    /// refresh must count.
    pub(crate) fn metrics_flush(&mut self) {
        let now = Instant::now();
        self.metrics_state.due = now;
        self.metrics_turn(now);
    }

    /// Refreshes the metrics every [`GAUGES_EVERY`] (called every turn of the loop).
    pub(crate) fn metrics_turn(&mut self, now: Instant) {
        if now < self.metrics_state.due {
            return;
        }
        self.metrics_state.due = now + GAUGES_EVERY;
        let m = &self.cfg.counters.0;
        let t = &mut self.metrics_state;
        let stats = &self.engine.stats;
        let (waiting, waits) = self.strong.waiting();
        for (counter, was, is) in [
            (&m.gc_runs, &mut t.gc_runs, stats.gc_runs),
            (
                &m.gc_pages_freed,
                &mut t.gc_pages_freed,
                stats.gc_pages_freed,
            ),
            (
                &m.journal_commits,
                &mut t.journal_commits,
                stats.journal_commits,
            ),
            (&m.strong_waits, &mut t.strong_waits, waits),
        ] {
            counter.inc_by(is.saturating_sub(*was));
            *was = is.max(*was);
        }
        m.strong_waiting.set(waiting as i64);
        let left = (self.role.as_ref()).map_or(0.0, |r| {
            r.ends().saturating_duration_since(now).as_secs_f64()
        });
        m.lease_left.set(left);
        let mut roles = [0i64; 4];
        for p in self.peers.values() {
            roles[match p.role {
                Role::New => 0,
                Role::Client { .. } => 1,
                Role::Store { .. } => 2,
                Role::Mirror => 3,
            }] += 1;
        }
        for (name, n) in ["new", "client", "store", "mirror"].iter().zip(roles) {
            let l = vec![("role".to_string(), name.to_string())];
            m.connections.get_or_create(&l).set(n);
        }
        let (pages, free) = self
            .groups
            .values()
            .fold((0, 0), |(b, f), g| (b + g.page_count, f + g.alloc.free()));
        m.data_pages.set(pages as i64);
        m.data_pages_free.set(free as i64);
        let (files, ffree, log_pages, log_free) = self.engine.usage();
        m.inodes.set(files as i64);
        m.inodes_free.set(ffree as i64);
        m.log_pages.set(log_pages as i64);
        m.log_pages_free.set(log_free as i64);
        let t = &mut self.metrics_state;
        let refused = m.room_refusals.get();
        let told = *t.room_refusals.get_or_insert(refused);
        if refused > told && t.room_told.is_none_or(|at| now >= at + ROOM_TOLD_EVERY) {
            warn!(
                "the MDS pool is full: {} updates were refused for room since the last \
                 word of it, and wait at their clients for freed log pages ({log_free} \
                 of {log_pages} free, counting those in their grace period); removing \
                 files makes room, and a pool is sized when formatted (`orion up \
                 --mds-size`, `orion mds --format --pool-size`)",
                refused - told
            );
            (t.room_refusals, t.room_told) = (Some(refused), Some(now));
        }
        m.epoch.set(i64::from(self.map.epoch()));
        m.callbacks_waiting.set(self.callbacks.held_count() as i64);
        m.unlinked_open.set(self.open_tables.orphan_count() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_read_as_snake_case() {
        assert_eq!(snake("AllocChunk"), "alloc_chunk");
        assert_eq!(snake("store_Heartbeat"), "store_heartbeat");
        assert_eq!(snake("Ping"), "ping");
    }

    #[test]
    fn a_served_request_is_counted_and_timed_under_its_kind() {
        let m = MdsMetrics::default();
        let ping = kind_slot(&MdsInbound::Client(orion_proto::MdsRequest::Ping));
        for us in [3, 5] {
            m.arrived(ping);
            m.served(ping, Duration::from_micros(us));
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &m.registry()).unwrap();
        assert!(
            text.contains("orion_mds_requests_total{kind=\"ping\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("orion_mds_request_seconds_count{kind=\"ping\"} 2"),
            "{text}"
        );
    }
}
