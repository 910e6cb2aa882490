//! The cluster a benchmark starts: an MDS (with a mirror under a cluster manager, if
//! asked) and one replication group of data stores, as processes with pools in a fresh
//! /dev/shm directory, stopped by PID when dropped.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use orion_client::{Client, ClientConfig};
use orion_fabric::{Backend, FabricConfig, Secret};

use crate::procs::{listen_addr, mds_port, mds_role_args, Daemon, ManagerProc};

fn spawn(args: &[String], log: &Path) -> Result<(Daemon, String)> {
    let (d, line) = Daemon::spawn(&format!("orion {}", args[0]), args, log)?;
    let addr = listen_addr(&line).ok_or_else(|| anyhow!("no address in {line:?}"))?;
    Ok((d, addr))
}

/// The primary's lease of a mirrored benchmark cluster (etcd counts whole seconds).
pub const BENCH_LEASE_MS: u64 = 1000;

/// An MDS and one replication group of data stores started for a benchmark, stopped
/// (by PID) when dropped: the stores first, then the MDS.
pub struct BenchCluster {
    pub mds_addr: String,
    pub fabric: FabricConfig,
    /// `--backend`, `--provider` and `--secret-file` for further `orion` processes.
    pub common_args: Vec<String>,
    /// Each store's arguments, log, and process while it runs.
    stores: Vec<(Vec<String>, std::path::PathBuf, Option<Daemon>)>,
    /// The MDSs (the primary first), and their logs.
    mdss: Vec<Option<Daemon>>,
    pub mds_logs: Vec<std::path::PathBuf>,
    /// Kept after the MDSs in drop order (fields drop in order): they ask it until
    /// they stop.
    pub manager: Option<ManagerProc>,
    _dir: tempfile::TempDir,
}

impl Drop for BenchCluster {
    /// The stores first, then the MDSs, the last-started (the mirror) first: a
    /// primary stopped before its mirror would hand it the role on the way out.
    fn drop(&mut self) {
        self.stores.clear();
        while self.mdss.pop().is_some() {}
        // A daemon killed on purpose (a crash) left its shared-memory files (they hold
        // RAM).
        orion_fabric::local::sweep_dead_processes_files();
    }
}

impl BenchCluster {
    pub fn start(backend: &str, provider: &str) -> Result<BenchCluster> {
        Self::start_replicated(backend, provider, 1)
    }

    /// With `replicas` data stores in the group.
    pub fn start_replicated(backend: &str, provider: &str, replicas: u16) -> Result<BenchCluster> {
        Self::start_with(backend, provider, replicas, "volatile", "")
    }

    /// With `replicas` data stores in the group, on pools of `store_mode`, and with
    /// `mirror` "embedded" or "etcd" an MDS mirror under that cluster manager ("": one
    /// MDS).
    pub fn start_with(
        backend: &str,
        provider: &str,
        replicas: u16,
        store_mode: &str,
        mirror: &str,
    ) -> Result<BenchCluster> {
        let fabric_backend = match backend {
            "local" => Backend::Local,
            "tcp" | "libfabric" => Backend::Libfabric,
            other => bail!("backend {other:?}: expected local or tcp"),
        };
        let dir = tempfile::Builder::new()
            .prefix("orion-bench")
            .tempdir_in("/dev/shm")
            .context("a directory in /dev/shm")?;
        let secret_path = dir.path().join("secret");
        let secret = Secret::generate();
        std::fs::write(&secret_path, secret.expose())?;
        let be = if backend == "local" {
            "local"
        } else {
            "libfabric"
        };
        let p = |x: &Path| x.display().to_string();
        let common_args: Vec<String> = vec![
            "--backend".into(),
            be.into(),
            "--provider".into(),
            provider.into(),
            "--secret-file".into(),
            p(&secret_path),
        ];
        let serve = |what: &str, size: &str, pool: &str| -> Vec<String> {
            let mut v: Vec<String> = [what, "--format", "--pool-size", size]
                .iter()
                .map(|s| s.to_string())
                .collect();
            v.extend(["--listen".into(), "127.0.0.1:0".into()]);
            v.extend(["--pool".into(), p(&dir.path().join(pool))]);
            v.extend(common_args.iter().cloned());
            v
        };
        let mut mds_args = serve("mds", "1G", "mds.pool");
        mds_args.extend(["--replicas".into(), replicas.to_string()]);
        let manager = match mirror {
            "" => None,
            kind => Some(ManagerProc::start(kind, dir.path())?),
        };
        let mut mdss = Vec::new();
        let mut mds_logs = vec![dir.path().join("mds.log")];
        let mds_addr = match &manager {
            None => {
                let (mds, addr) = spawn(&mds_args, &mds_logs[0])?;
                mdss.push(Some(mds));
                addr
            }
            Some(m) => {
                let first = mds_port(None, &[])?;
                let addrs = [
                    format!("127.0.0.1:{first}"),
                    format!("127.0.0.1:{}", mds_port(None, &[first])?),
                ];
                let with_role = |args: Vec<String>, name: &str, addr: &str| {
                    mds_role_args(args, addr, &m.spec(), name, "bench", BENCH_LEASE_MS)
                };
                let (a, _) = spawn(
                    &with_role(mds_args.clone(), "mds-a", &addrs[0]),
                    &mds_logs[0],
                )?;
                mdss.push(Some(a));
                // The mirror starts without a pool and copies the primary's.
                let mut b_args: Vec<String> = with_role(mds_args.clone(), "mds-b", &addrs[1]);
                b_args.retain(|x| x != "--format");
                let at = b_args.iter().position(|a| a == "--pool").expect("pool") + 1;
                b_args[at] = p(&dir.path().join("mds-b.pool"));
                mds_logs.push(dir.path().join("mds-b.log"));
                mdss.push(Some(Daemon::start(
                    "orion mds (mirror)",
                    &b_args,
                    &mds_logs[1],
                )?));
                let t0 = Instant::now();
                while !std::fs::read_to_string(&mds_logs[0])
                    .unwrap_or_default()
                    .contains("mirror mds-b is in sync")
                {
                    if t0.elapsed() > Duration::from_secs(60) {
                        bail!("the mirror did not catch up within a minute");
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                addrs.join(",")
            }
        };
        let mut stores = Vec::new();
        for i in 0..replicas {
            // Sparse on tmpfs: only pages written take memory. Copy-on-write pages
            // freed within the grace period pile up at ~400 MB/s of 4 KiB overwrites.
            let mut ds_args = serve("ds", "4G", &format!("ds0.{i}.pool"));
            ds_args.extend([
                "--mds".into(),
                mds_addr.clone(),
                "--index".into(),
                i.to_string(),
                "--pool-mode".into(),
                store_mode.into(),
            ]);
            let log = dir.path().join(format!("ds0.{i}.log"));
            let (ds, _) = spawn(&ds_args, &log)?;
            stores.push((ds_args, log, Some(ds)));
        }
        let mut fabric = FabricConfig::new(fabric_backend, secret);
        fabric.provider = provider.to_string();
        Ok(BenchCluster {
            mds_addr,
            fabric,
            common_args,
            stores,
            mdss,
            mds_logs,
            manager,
            _dir: dir,
        })
    }

    /// Kills MDS `index` (0: the first primary) with SIGKILL, leaving it down.
    pub fn kill_mds(&mut self, index: usize) {
        if let Some(mut d) = self.mdss[index].take() {
            d.kill();
        }
    }

    /// Stops MDS `index` with SIGSTOP: its connections stay open and it answers
    /// nothing, as a host that vanished (it is killed with the cluster).
    pub fn stop_mds(&mut self, index: usize) {
        if let Some(d) = &self.mdss[index] {
            // SAFETY: kill(2) only sends a signal, to a child this cluster started and
            // has not reaped.
            unsafe { libc::kill(d.pid() as i32, libc::SIGSTOP) };
        }
    }

    /// Kills data store `index` with SIGKILL (a crash), leaving it down.
    pub fn kill_store(&mut self, index: usize) {
        if let Some(mut d) = self.stores[index].2.take() {
            d.kill();
        }
    }

    /// Starts data store `index` again from its pool.
    pub fn restart_store(&mut self, index: usize) -> Result<()> {
        let (args, log, running) = &mut self.stores[index];
        if running.is_none() {
            *running = Some(spawn(args, log)?.0);
        }
        Ok(())
    }

    /// The pool file of data store `index`.
    pub fn store_pool(&self, index: usize) -> std::path::PathBuf {
        let args = &self.stores[index].0;
        let at = args
            .iter()
            .position(|a| a == "--pool")
            .expect("stores have a pool");
        std::path::PathBuf::from(&args[at + 1])
    }

    /// The log of data store `index`.
    pub fn store_log(&self, index: usize) -> String {
        std::fs::read_to_string(&self.stores[index].1).unwrap_or_default()
    }

    pub fn client(&self, strong: bool, internal: bool) -> Result<Client> {
        self.client_with(strong, internal, false)
    }

    pub fn client_with(&self, strong: bool, internal: bool, optimistic: bool) -> Result<Client> {
        let cfg = ClientConfig {
            mds: self.mds_addr.clone(),
            consistency: if strong { "strong" } else { "weak" }.into(),
            persistence: if optimistic {
                "optimistic"
            } else {
                "pessimistic"
            }
            .into(),
            internal,
            ..ClientConfig::default()
        };
        Client::connect(cfg, self.fabric.clone()).map_err(|e| anyhow!("client: {e}"))
    }
}
