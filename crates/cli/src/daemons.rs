//! `orion mds` and `orion ds`: run a daemon in the foreground until SIGTERM or SIGINT.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{Context, Result};
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

#[derive(Args, Debug)]
pub struct MdsArgs {
    #[command(flatten)]
    pub common: Common,
    /// The MDS pool file.
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
    /// Create the pool (a new cluster) and the secret file if missing, then serve.
    #[arg(long)]
    pub format: bool,
}

#[derive(Args, Debug)]
pub struct DsArgs {
    #[command(flatten)]
    pub common: Common,
    /// The data pool file.
    #[arg(long)]
    pub pool: Option<PathBuf>,
    #[arg(long)]
    pub pool_size: Option<String>,
    #[arg(long)]
    pub pool_mode: Option<String>,
    /// The replication group this store serves.
    #[arg(long)]
    pub group: Option<u16>,
    #[arg(long)]
    pub listen: Option<String>,
    /// The MDS to join (host:port).
    #[arg(long)]
    pub mds: Option<String>,
    /// Create the pool if missing, then serve.
    #[arg(long)]
    pub format: bool,
}

fn stop_flag() -> Result<Arc<AtomicBool>> {
    crate::signals::stop_flag().context("installing signal handlers")
}

fn announce(line: String) {
    println!("{line}");
    let _ = std::io::stdout().flush();
}

pub fn mds(a: MdsArgs) -> Result<()> {
    let mut c = a.common.load()?;
    let m = &mut c.mds;
    if let Some(p) = a.pool {
        m.pool = p;
    }
    if let Some(s) = a.pool_size {
        m.pool_size = s;
    }
    if let Some(s) = a.pool_mode {
        m.pool_mode = s;
    }
    if let Some(l) = a.listen {
        m.listen = l;
    }
    if a.format {
        ensure_secret(&c.fabric.secret_file)?;
        if !c.mds.pool.exists() {
            let size = orion_pmem::parse_size(&c.mds.pool_size).map_err(anyhow::Error::msg)?;
            let mode = c.mds.pool_mode.parse().map_err(anyhow::Error::msg)?;
            orion_mds::format_pool(&c.mds.pool, size, mode)?;
            tracing::info!(
                "formatted a new cluster's MDS pool {}",
                c.mds.pool.display()
            );
        }
    }
    let fabric = c.fabric.fabric_config()?;
    let stop = stop_flag()?;
    orion_mds::run(c.mds, fabric, stop, |r| {
        announce(format!(
            "orion mds ready: listening on {} ({})",
            r.addr, r.describe
        ))
    })
    .context("mds")
}

pub fn ds(a: DsArgs) -> Result<()> {
    let mut c = a.common.load()?;
    let d = &mut c.ds;
    if let Some(p) = a.pool {
        d.pool = p;
    }
    if let Some(s) = a.pool_size {
        d.pool_size = s;
    }
    if let Some(s) = a.pool_mode {
        d.pool_mode = s;
    }
    if let Some(g) = a.group {
        d.group = g;
    }
    if let Some(l) = a.listen {
        d.listen = l;
    }
    if let Some(m) = a.mds {
        d.mds = m;
    }
    if a.format && !c.ds.pool.exists() {
        let size = orion_pmem::parse_size(&c.ds.pool_size).map_err(anyhow::Error::msg)?;
        let mode = c.ds.pool_mode.parse().map_err(anyhow::Error::msg)?;
        orion_ds::format_pool(&c.ds.pool, size, c.ds.group, mode)?;
    }
    let fabric = c.fabric.fabric_config()?;
    let stop = stop_flag()?;
    orion_ds::run(c.ds, fabric, stop, |r| {
        announce(format!(
            "orion ds ready: listening on {} ({})",
            r.addr, r.describe
        ))
    })
    .context("ds")
}
