//! What a data store counts, for a `/metrics` endpoint (Prometheus text format; the
//! `orion` binary serves [`DsMetrics::registry`] over HTTP): its pool, its client
//! connections, whether it is joined to the MDS, the pages it reported persisted, and
//! its resyncs (started, finished, failed; pages copied). Clients read and write its
//! pool one-sided, without its CPU: those bytes are the clients' to count.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// The metrics of one store process (clones share them).
#[derive(Clone)]
pub struct DsMetrics(Arc<Inner>);

pub(crate) struct Inner {
    registry: Arc<Registry>,
    pub pool_bytes: Gauge,
    pub clients: Gauge,
    pub joined: Gauge,
    pub persisted_pages: Counter,
    resyncs: Family<Labels, Counter>,
    pub resync_running: Gauge,
    pub resync_pages: Counter,
}

impl Default for DsMetrics {
    fn default() -> Self {
        let mut r = Registry::with_prefix("orion_ds");
        let gauge = |r: &mut Registry, name: &str, help: &str| {
            let g = Gauge::default();
            r.register(name, help, g.clone());
            g
        };
        let counter = |r: &mut Registry, name: &str, help: &str| {
            let c = Counter::default();
            r.register(name, help, c.clone());
            c
        };
        let pool_bytes = gauge(&mut r, "pool_bytes", "Size of the data pool");
        let clients = gauge(&mut r, "clients", "Client connections");
        let joined = gauge(&mut r, "joined", "1 while joined to the MDS, else 0");
        let persisted_pages = counter(
            &mut r,
            "persisted_pages",
            "Pages this store reported persisted to the MDS",
        );
        let resyncs = Family::<Labels, Counter>::default();
        r.register(
            "resyncs",
            "Resyncs by outcome (started, finished, failed, cancelled)",
            resyncs.clone(),
        );
        for outcome in ["started", "finished", "failed", "cancelled"] {
            let _ = resyncs.get_or_create(&vec![("outcome".to_string(), outcome.to_string())]);
        }
        let resync_running = gauge(&mut r, "resync_running", "1 while a resync copies");
        let resync_pages = counter(
            &mut r,
            "resync_pages",
            "Pages copied from a peer by resyncs",
        );
        DsMetrics(Arc::new(Inner {
            registry: Arc::new(r),
            pool_bytes,
            clients,
            joined,
            persisted_pages,
            resyncs,
            resync_running,
            resync_pages,
        }))
    }
}

impl std::fmt::Debug for DsMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DsMetrics")
    }
}

/// Counters are not configuration: two configurations that say the same are equal,
/// whatever their daemons counted.
impl PartialEq for DsMetrics {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl DsMetrics {
    /// What an HTTP endpoint encodes.
    pub fn registry(&self) -> Arc<Registry> {
        self.0.registry.clone()
    }

    pub(crate) fn get(&self) -> &Inner {
        &self.0
    }

    /// A resync `outcome`: "started", "finished", "failed" or "cancelled" (the store
    /// lost the MDS, or stops).
    pub(crate) fn resync(&self, outcome: &str) {
        let l = vec![("outcome".to_string(), outcome.to_string())];
        self.0.resyncs.get_or_create(&l).inc();
        self.0.resync_running.set(i64::from(outcome == "started"));
    }
}
