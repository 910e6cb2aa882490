//! `orion mount` and `orion umount`: the file system at a mount point through FUSE.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use orion_client::Client;
use orion_fuse::MountOptions;

use crate::daemons::ClientFlags;
use crate::signals::stop_flag;

#[derive(Args, Debug)]
pub struct MountArgs {
    /// Where to mount (an existing directory).
    pub mountpoint: PathBuf,
    #[command(flatten)]
    pub client: ClientFlags,
    /// Threads serving the kernel's requests: how many system calls on the mount are
    /// served at once (a call waiting on the network holds its thread) [default: the
    /// CPUs, at least 4].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Only the mounting user may use the mount (the default lets every local user in,
    /// with permissions checked against each file's mode).
    #[arg(long)]
    pub private: bool,
    /// Leave permission checks to the file system alone (it always checks every
    /// request); by default the kernel checks as well, which keeps Linux's order of
    /// errors on path walks.
    #[arg(long)]
    pub no_kernel_permissions: bool,
    /// Let the kernel keep nothing: every call reaches the client library. By default
    /// the kernel keeps names and attributes, and the MDS calls this mount back
    /// before another client's change to them is acknowledged, so the mount sees
    /// another client's change at once either way (see the README for the two
    /// exceptions); this costs kernel requests.
    #[arg(long)]
    pub no_kernel_cache: bool,
    /// Let the kernel keep file data too, across opens, dropped by the same callbacks
    /// when another client changes a file. Pays for data read again and again (the
    /// webserver workload: 1.8x); costs writes and one-pass reads on this machine
    /// (random 4 KiB writes 1.7x slower, 1 MiB sequential rows 2x: design note 56),
    /// so it is off by default.
    #[arg(long, conflicts_with = "no_kernel_cache")]
    pub cache_data: bool,
    /// host:port of a Prometheus endpoint (`/metrics`) for this mount's client (port
    /// 0: any free port).
    #[arg(long)]
    pub metrics: Option<String>,
}

pub fn mount(a: MountArgs) -> Result<()> {
    let c = a.client.load()?;
    if !a.mountpoint.is_dir() && orion_fuse::unmount_stale(&a.mountpoint).is_err() {
        bail!(
            "{} is not a directory; create it first (mkdir -p {})",
            a.mountpoint.display(),
            a.mountpoint.display()
        );
    }
    let stop = stop_flag()?;
    let mds = c.client.mds.clone();
    let fabric = c.fabric.fabric_config()?;
    let client = Client::connect(c.client, fabric)
        .map_err(|e| anyhow!("connecting to the MDS at {mds}: {e}"))?;
    let opts = MountOptions {
        mountpoint: a.mountpoint.clone(),
        allow_other: !a.private,
        threads: a.threads.unwrap_or_else(default_threads),
        kernel_permissions: !a.no_kernel_permissions,
    };
    let shown = a.mountpoint.display().to_string();
    let client = Arc::new(client);
    let kernel_cache = !a.no_kernel_cache;
    let cache_data = a.cache_data;
    let metrics = match &a.metrics {
        Some(listen) => {
            let addr =
                crate::metrics_http::start(listen, orion_fuse::metrics::registry(client.clone()))?;
            format!("; metrics on http://{addr}/metrics")
        }
        None => String::new(),
    };
    let fs = orion_fuse::OrionFs::new(client.clone()).with_data_cache(a.cache_data);
    orion_fuse::mount(fs, &opts, stop, |notifier| {
        if kernel_cache {
            let invalidate = orion_fuse::cache::invalidator(notifier);
            if let Err(e) = client.cache_in_kernel(invalidate, cache_data) {
                tracing::warn!("the kernel caches nothing: {e}");
            }
        }
        crate::daemons::announce(format!(
            "orion mount ready: {shown} (MDS {mds}, pid {}){metrics}",
            std::process::id()
        ))
    })
    .with_context(|| format!("mount at {shown}"))?;
    tracing::info!("unmounted {shown}");
    Ok(())
}

#[derive(Args, Debug)]
pub struct UmountArgs {
    pub mountpoint: PathBuf,
}

/// Unmounts a live mount (its `orion mount` then exits) or cleans up a stale one.
pub fn umount(a: UmountArgs) -> Result<()> {
    if orion_fuse::unmount_stale(&a.mountpoint)? {
        println!("removed a stale mount at {}", a.mountpoint.display());
        return Ok(());
    }
    orion_fuse::mount::detach(&a.mountpoint)
        .with_context(|| format!("unmounting {}", a.mountpoint.display()))?;
    Ok(())
}

/// A thread per CPU, so that as many callers as there are CPUs are served at once
/// (at least 4: on a small machine a caller waiting on the network should not hold
/// up the rest). Not many more: a request that finds an idle thread wakes it (35-60
/// µs on this VM), while one that finds every thread busy is taken by the next to
/// finish. With 16 threads, 4 jobs of create + stat + unlink ran 14.6-17.0 k ops/s
/// here against 20.8-21.0 k with 4 (design note 79).
fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get().max(4))
}
