//! `orion mds` and `orion ds`: run a daemon in the foreground until SIGTERM or SIGINT.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::config::{ensure_secret, Config};

/// Flags every daemon and client shares; each overrides its config key.
#[derive(Args, Clone, Debug, Default)]
pub struct Common {
    /// The TOML config (see `orion config --defaults`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Fabric backend: libfabric or local.
    #[arg(long)]
    pub backend: Option<String>,
    /// libfabric provider, e.g. "tcp;ofi_rxm" or "verbs;ofi_rxm".
    #[arg(long)]
    pub provider: Option<String>,
    /// The cluster secret file.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// The cluster epoch.
    #[arg(long)]
    pub epoch: Option<u64>,
}

impl Common {
    pub fn load(&self) -> Result<Config> {
        let mut c = Config::load(self.config.as_deref())?;
        if let Some(b) = &self.backend {
            c.fabric.backend = b.clone();
        }
        if let Some(p) = &self.provider {
            c.fabric.provider = p.clone();
        }
        if let Some(s) = &self.secret_file {
            c.fabric.secret_file = s.clone();
        }
        if let Some(e) = self.epoch {
            c.fabric.epoch = e;
        }
        Ok(c)
    }
}

/// Flags every client command has (`orion fs`, `orion mount`), over the shared ones.
#[derive(Args, Debug)]
pub struct ClientFlags {
    #[command(flatten)]
    pub common: Common,
    /// The MDS (host:port; the primary and its mirror, comma-separated).
    #[arg(long)]
    pub mds: Option<String>,
    /// Weak data consistency (commit without waiting for the stores; fsync flushes).
    #[arg(long)]
    pub weak: bool,
    /// Optimistic persistence: stage small writes and commit them together at
    /// fsync, close or within `stage_ms` (10 ms; a crash of this client loses what
    /// is staged).
    #[arg(long)]
    pub optimistic: bool,
    /// Never map a local store's pool: reach every store through the fabric.
    #[arg(long)]
    pub external: bool,
}

impl ClientFlags {
    /// The configuration with these flags applied.
    pub fn load(&self) -> Result<Config> {
        let mut c = self.common.load()?;
        if let Some(m) = &self.mds {
            c.client.mds = m.clone();
        }
        if self.weak {
            c.client.consistency = "weak".into();
        }
        if self.optimistic {
            c.client.persistence = "optimistic".into();
        }
        if self.external {
            c.client.internal = false;
        }
        Ok(c)
    }
}

/// Flags both daemons have: their pool, where they listen, and whether to format.
#[derive(Args, Debug)]
pub struct Serve {
    /// The pool file.
    #[arg(long)]
    pub pool: Option<PathBuf>,
    /// Size of a pool created by --format, e.g. 256M.
    #[arg(long)]
    pub pool_size: Option<String>,
    /// auto, dax, msync or volatile.
    #[arg(long)]
    pub pool_mode: Option<String>,
    /// host:port to listen on (port 0: any free port).
    #[arg(long)]
    pub listen: Option<String>,
    /// Create the pool if missing (for the MDS: a new cluster, and the secret file),
    /// then serve.
    #[arg(long)]
    pub format: bool,
    /// host:port of a Prometheus endpoint (`/metrics`; port 0: any free port).
    #[arg(long)]
    pub metrics: Option<String>,
}

impl Serve {
    /// Overrides the keys these flags name.
    fn apply(
        &self,
        pool: &mut PathBuf,
        pool_size: &mut String,
        pool_mode: &mut String,
        listen: &mut String,
        metrics: &mut String,
    ) {
        if let Some(p) = &self.pool {
            *pool = p.clone();
        }
        if let Some(s) = &self.pool_size {
            *pool_size = s.clone();
        }
        if let Some(m) = &self.pool_mode {
            *pool_mode = m.clone();
        }
        if let Some(l) = &self.listen {
            *listen = l.clone();
        }
        if let Some(m) = &self.metrics {
            *metrics = m.clone();
        }
    }

    /// The size and mode of a pool `--format` creates, if it must create one.
    fn to_create(
        &self,
        pool: &std::path::Path,
        size: &str,
        mode: &str,
    ) -> Result<Option<(u64, orion_pmem::ModeChoice)>> {
        if !self.format || pool.exists() {
            return Ok(None);
        }
        let size = orion_pmem::parse_size(size).map_err(anyhow::Error::msg)?;
        Ok(Some((size, mode.parse().map_err(anyhow::Error::msg)?)))
    }
}

#[derive(Args, Debug)]
pub struct MdsArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub serve: Serve,
    /// Data stores per replication group (every page is written to each).
    #[arg(long)]
    pub replicas: Option<u16>,
    /// The cluster manager that says which MDS is primary: "embedded:HOST:PORT" or
    /// "etcd:HOST:PORT[,...]". With one, this MDS mirrors the primary until it takes
    /// the role.
    #[arg(long)]
    pub manager: Option<String>,
    /// This MDS's name for the manager (unique in the cluster).
    #[arg(long)]
    pub name: Option<String>,
    /// The cluster's name for the manager (a mirror without a pool needs it).
    #[arg(long)]
    pub cluster: Option<String>,
    /// The primary's lease in milliseconds (the fail-over takes about this long).
    #[arg(long)]
    pub lease_ms: Option<u64>,
    /// A client's cache lease in milliseconds: how long a mount's kernel keeps names
    /// and attributes at most, and how long a change waits for a mount that does not
    /// answer its callback.
    #[arg(long)]
    pub cache_lease_ms: Option<u64>,
}

#[derive(Args, Debug)]
pub struct DsArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub serve: Serve,
    /// The replication group this store serves.
    #[arg(long)]
    pub group: Option<u16>,
    /// Its index among the group's replicas (0 to replicas - 1).
    #[arg(long)]
    pub index: Option<u16>,
    /// The MDS to join (host:port; the primary and its mirror, comma-separated).
    #[arg(long)]
    pub mds: Option<String>,
}

fn stop_flag() -> Result<Arc<AtomicBool>> {
    crate::signals::stop_flag().context("installing signal handlers")
}

/// Starts the Prometheus endpoint `listen` names (if any), before the daemon serves;
/// what its ready line says of it ("; metrics on http://ADDR/metrics").
fn endpoint(
    listen: &str,
    registry: std::sync::Arc<prometheus_client::registry::Registry>,
) -> Result<String> {
    if listen.is_empty() {
        return Ok(String::new());
    }
    let addr = crate::metrics_http::start(listen, registry)?;
    Ok(format!("; metrics on http://{addr}/metrics"))
}

pub fn announce(line: String) {
    println!("{line}");
    let _ = std::io::stdout().flush();
}

pub fn mds(a: MdsArgs) -> Result<()> {
    let mut c = a.common.load()?;
    let m = &mut c.mds;
    if let Some(r) = a.replicas {
        m.replicas = r;
    }
    if let Some(v) = a.manager {
        m.manager = v;
    }
    if let Some(v) = a.name {
        m.name = v;
    }
    if let Some(v) = a.cluster {
        m.cluster = v;
    }
    if let Some(v) = a.lease_ms {
        m.lease_ms = v;
    }
    if let Some(v) = a.cache_lease_ms {
        m.cache_lease_ms = v;
    }
    if m.replicas == 0 {
        bail!("replicas must be at least 1");
    }
    a.serve.apply(
        &mut m.pool,
        &mut m.pool_size,
        &mut m.pool_mode,
        &mut m.listen,
        &mut m.metrics,
    );
    if a.serve.format {
        ensure_secret(&c.fabric.secret_file)?;
    }
    if let Some((size, mode)) = a.serve.to_create(&m.pool, &m.pool_size, &m.pool_mode)? {
        orion_mds::format_pool(&m.pool, size, mode)?;
        tracing::info!("formatted a new cluster's MDS pool {}", m.pool.display());
    }
    let fabric = c.fabric.fabric_config()?;
    let stop = stop_flag()?;
    let metrics = endpoint(&c.mds.metrics, c.mds.counters.registry())?;
    orion_mds::run(c.mds, fabric, stop, |r| {
        announce(format!(
            "orion mds ready: listening on {} ({}){metrics}",
            r.addr, r.describe
        ))
    })
    .context("mds")
}

pub fn ds(a: DsArgs) -> Result<()> {
    let mut c = a.common.load()?;
    let d = &mut c.ds;
    a.serve.apply(
        &mut d.pool,
        &mut d.pool_size,
        &mut d.pool_mode,
        &mut d.listen,
        &mut d.metrics,
    );
    if let Some(g) = a.group {
        d.group = g;
    }
    if let Some(i) = a.index {
        d.index = i;
    }
    if let Some(m) = a.mds {
        d.mds = m;
    }
    if let Some((size, mode)) = a.serve.to_create(&d.pool, &d.pool_size, &d.pool_mode)? {
        orion_ds::format_pool(&d.pool, size, d.group, mode)?;
    }
    let fabric = c.fabric.fabric_config()?;
    let stop = stop_flag()?;
    let metrics = endpoint(&c.ds.metrics, c.ds.counters.registry())?;
    orion_ds::run(c.ds, fabric, stop, |r| {
        announce(format!(
            "orion ds ready: listening on {} ({}){metrics}",
            r.addr, r.describe
        ))
    })
    .context("ds")
}
