//! `orion bench client`: the paper's microbenchmarks (Orion §6.2) through the client
//! library, against an MDS and a data store this command starts as processes (pools
//! on /dev/shm, volatile mode, as the paper emulated NVMM) and stops by PID.
//!
//! Rows: an empty RPC, a log commit, an inode tail check (one-sided read of the slot),
//! create, mkdir, unlink, and 4 KiB random writes and reads, for an internal client
//! (it maps the store's pool) in strong mode, an external client (fabric only) in
//! strong mode, an external client in weak mode, and an internal client with
//! optimistic persistence (small writes staged and committed in batches).

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use orion_client::{Client, ClientConfig, OpenFlags};
use orion_fabric::{Backend, FabricConfig, Secret};
use orion_meta::{SetAttrReq, TimeSet};

use crate::bench_fabric::{measure, Lat};
use crate::procs::{listen_addr, Daemon};

fn spawn(args: &[String], log: &Path) -> Result<(Daemon, String)> {
    let (d, line) = Daemon::spawn(&format!("orion {}", args[0]), args, log)?;
    let addr = listen_addr(&line).ok_or_else(|| anyhow!("no address in {line:?}"))?;
    Ok((d, addr))
}

struct Rows(Vec<(&'static str, Lat)>);

impl Rows {
    fn json(&self) -> String {
        let body: Vec<String> = self
            .0
            .iter()
            .map(|(k, l)| format!("\"{k}\":{{\"p50\":{:.3},\"p99\":{:.3}}}", l.p50, l.p99))
            .collect();
        body.join(",")
    }
}

fn fs<T>(r: orion_meta::FsResult<T>) -> Result<T> {
    r.map_err(|e| anyhow!("{e}"))
}

/// A fast, fixed sequence of pseudo-random numbers (xorshift64) for offsets.
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.max(1);
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// The rows for one client.
fn bench_one(c: &Client, tag: &str, iters: usize) -> Result<Rows> {
    let top = format!("/bench-{tag}");
    fs(c.mkdir(&top, 0o755))?;
    let file = format!("{top}/data");
    let fd = fs(c.open(
        &file,
        OpenFlags {
            read: true,
            write: true,
            create: true,
            ..Default::default()
        },
        0o644,
    ))?;
    let ino = fs(c.ino(fd))?;
    // A 16 MiB file to write and read 4 KiB pages of at random.
    const PAGES: u64 = 4096;
    let chunk = vec![7u8; 1 << 20];
    for i in 0..PAGES / 256 {
        fs(c.pwrite(fd, i << 20, &chunk))?;
    }
    let mut next = xorshift(0x2545_F491_4F6C_DD1D);
    let page = vec![0x5Au8; 4096];
    let mut rows = Vec::new();
    rows.push(("rpc_us", measure(iters, |_| fs(c.ping()))?));
    rows.push((
        "commit_us",
        measure(iters, |i| {
            let req = SetAttrReq {
                mtime: Some(TimeSet::At(i as i64)),
                ..Default::default()
            };
            fs(c.setattr(ino, &req)).map(|_| ())
        })?,
    ));
    rows.push((
        "tail_read_us",
        measure(iters, |_| fs(c.getattr(ino)).map(|_| ()))?,
    ));
    let n = iters.min(2000);
    let dir = format!("{top}/d");
    fs(c.mkdir(&dir, 0o755))?;
    let mut k = 0u64;
    rows.push((
        "create_us",
        measure(n, |_| {
            k += 1;
            let f = fs(c.open(
                &format!("{dir}/f{k}"),
                OpenFlags {
                    write: true,
                    create: true,
                    excl: true,
                    ..Default::default()
                },
                0o644,
            ))?;
            fs(c.close(f))
        })?,
    ));
    let mut u = 0u64;
    rows.push((
        "unlink_us",
        measure(n, |_| {
            u += 1;
            fs(c.unlink(&format!("{dir}/f{u}")))
        })?,
    ));
    let mut m = 0u64;
    rows.push((
        "mkdir_us",
        measure(n, |_| {
            m += 1;
            fs(c.mkdir(&format!("{dir}/m{m}"), 0o755)).map(|_| ())
        })?,
    ));
    let mut r = 0u64;
    rows.push((
        "rmdir_us",
        measure(n, |_| {
            r += 1;
            fs(c.rmdir(&format!("{dir}/m{r}")))
        })?,
    ));
    rows.push((
        "write_4k_us",
        measure(iters, |_| {
            let off = (next() % PAGES) * 4096;
            fs(c.pwrite(fd, off, &page)).map(|_| ())
        })?,
    ));
    rows.push((
        "read_4k_us",
        measure(iters, |_| {
            let off = (next() % PAGES) * 4096;
            fs(c.pread(fd, off, 4096)).map(|_| ())
        })?,
    ));
    fs(c.close(fd))?;
    Ok(Rows(rows))
}

/// An MDS and one replication group of data stores started for a benchmark, stopped
/// (by PID) when dropped: the stores first, then the MDS.
pub struct BenchCluster {
    pub mds_addr: String,
    pub fabric: FabricConfig,
    /// `--backend`, `--provider` and `--secret-file` for further `orion` processes.
    pub common_args: Vec<String>,
    /// Each store's arguments, log, and process while it runs.
    stores: Vec<(Vec<String>, std::path::PathBuf, Option<Daemon>)>,
    _mds: Daemon,
    _dir: tempfile::TempDir,
}

impl BenchCluster {
    pub fn start(backend: &str, provider: &str) -> Result<BenchCluster> {
        Self::start_replicated(backend, provider, 1)
    }

    /// With `replicas` data stores in the group.
    pub fn start_replicated(backend: &str, provider: &str, replicas: u16) -> Result<BenchCluster> {
        Self::start_with(backend, provider, replicas, "volatile")
    }

    /// With `replicas` data stores in the group, on pools of `store_mode`.
    pub fn start_with(
        backend: &str,
        provider: &str,
        replicas: u16,
        store_mode: &str,
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
        let mut mds_args = serve("mds", "256M", "mds.pool");
        mds_args.extend(["--replicas".into(), replicas.to_string()]);
        let (mds, mds_addr) = spawn(&mds_args, &dir.path().join("mds.log"))?;
        let mut stores = Vec::new();
        for i in 0..replicas {
            let mut ds_args = serve("ds", "1G", &format!("ds0.{i}.pool"));
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
            _mds: mds,
            _dir: dir,
        })
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

pub fn run(
    backend: &str,
    provider: &str,
    iters: usize,
    replicas: u16,
    store_mode: &str,
    json: bool,
) -> Result<()> {
    let cluster = BenchCluster::start_with(backend, provider, replicas, store_mode)?;
    let client = |strong: bool, internal: bool| cluster.client(strong, internal);
    let progress = |what: &str| {
        if !json {
            eprintln!("measuring: {what}");
        }
    };
    progress("internal client, strong");
    let internal = bench_one(&client(true, true)?, "internal", iters)?;
    progress("external client, strong");
    let external = bench_one(&client(true, false)?, "external", iters)?;
    progress("external client, weak");
    let weak = bench_one(&client(false, false)?, "weak", iters)?;
    progress("internal client, strong, optimistic");
    let optimistic = bench_one(&cluster.client_with(true, true, true)?, "optimistic", iters)?;
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    if json {
        println!(
            "{{\"backend\":\"{backend}\",\"provider\":\"{provider}\",\"iters\":{iters},\"replicas\":{replicas},\"store_mode\":\"{store_mode}\",\
             \"pools\":\"/dev/shm (volatile: tmpfs emulates NVMM)\",\"kernel\":\"{}\",\
             {},\"external\":{{{}}},\"weak\":{{{}}},\"optimistic\":{{{}}}}}",
            kernel.trim(),
            internal.json(),
            external.json(),
            weak.json(),
            optimistic.json()
        );
        return Ok(());
    }
    println!(
        "orion bench client: backend {backend}{}, {replicas} data store(s) per group, {iters} \
         ops per row, pools on /dev/shm (tmpfs emulates NVMM, as in the paper; the stores' \
         pool mode: {store_mode}), latencies in µs",
        if backend == "local" {
            String::new()
        } else {
            format!(" ({provider})")
        }
    );
    println!(
        "{:<14} {:>18} {:>18} {:>18} {:>18}",
        "operation", "internal strong", "external strong", "external weak", "int. optimistic"
    );
    println!(
        "{:<14} {:>9}{:>9} {:>9}{:>9} {:>9}{:>9} {:>9}{:>9}",
        "", "p50", "p99", "p50", "p99", "p50", "p99", "p50", "p99"
    );
    for (i, (k, l)) in internal.0.iter().enumerate() {
        let (e, w, o) = (&external.0[i].1, &weak.0[i].1, &optimistic.0[i].1);
        println!(
            "{:<14} {:>9.2}{:>9.2} {:>9.2}{:>9.2} {:>9.2}{:>9.2} {:>9.2}{:>9.2}",
            k.trim_end_matches("_us"),
            l.p50,
            l.p99,
            e.p50,
            e.p99,
            w.p50,
            w.p99,
            o.p50,
            o.p99
        );
    }
    Ok(())
}
