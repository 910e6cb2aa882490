//! `orion`: the one command of OrionFS.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use orion_meta::localfs::data_pool_path;
use orion_meta::{Clock, LocalFs, SystemClock};
use orion_pmem::ModeChoice;
use orion_progress::{Progress, Unit};

mod bench_client;
mod bench_cluster;
mod bench_cpu;
mod bench_fabric;
mod bench_failover;
mod bench_local;
mod bench_mds;
mod bench_mount;
mod bench_replicas;
mod bench_scaling;
mod bench_threads;
mod bench_workloads;
mod config;
mod daemons;
mod fs_cmd;
mod fsck_cmd;
mod hosted;
mod logs;
mod metrics_http;
mod mount_cmd;
mod procs;
mod run_cmd;
mod signals;
mod status;
mod top;
mod up;
mod up_mds;

#[derive(Parser)]
#[command(
    name = "orion",
    version,
    about = "OrionFS: a distributed file system for persistent memory and RDMA"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Format a new local file system: a metadata pool at POOL and a data pool at POOL.data.
    Mkfs {
        #[arg(long)]
        pool: PathBuf,
        /// Total size (metadata takes 1/8, at least 1 MiB), e.g. 256M, 4G.
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// auto (tmpfs → volatile, DAX → dax, else msync), dax, msync or volatile.
        #[arg(long, default_value = "auto")]
        pool_mode: String,
        /// Overwrite existing pool files.
        #[arg(long)]
        force: bool,
    },
    /// Check a file system's pools without changing them; exit 1 if inconsistent.
    Fsck(fsck_cmd::FsckArgs),
    /// Run the metadata server (foreground; SIGTERM stops it cleanly).
    Mds(daemons::MdsArgs),
    /// Run a data store (foreground; SIGTERM stops it cleanly).
    Ds(daemons::DsArgs),
    /// Start a whole cluster on this machine (an MDS, two data stores) and mount it;
    /// Ctrl-C unmounts and stops everything.
    Up(up::UpArgs),
    /// What a cluster is doing: its epoch, the MDS, every data store with its state
    /// and resync progress (from `--dir` of an `orion up`, or `--config`).
    Status(status::StatusArgs),
    /// Run the embedded cluster manager of a one-host cluster (foreground; `orion up`
    /// runs one itself): MDSs started with `--manager embedded:ADDR` ask it who is
    /// primary. Real clusters use etcd (`--manager etcd:HOST:PORT,...`).
    Manager {
        /// host:port to listen on.
        #[arg(long, default_value = "127.0.0.1:7400")]
        listen: String,
        /// Where it keeps the last epoch and who may take over (created if missing).
        #[arg(long)]
        dir: PathBuf,
    },
    /// Mount the file system at a directory (FUSE; foreground: SIGTERM/SIGINT unmount).
    Mount(mount_cmd::MountArgs),
    /// Unmount a mount point, or clean up one left by a crashed `orion mount`.
    Umount(mount_cmd::UmountArgs),
    /// File-system operations through the client library.
    Fs(fs_cmd::FsArgs),
    /// Run a program with the preload library: its file calls under the mount are
    /// served in its own process, without the kernel (`orion run -- PROGRAM ARGS...`).
    Run(run_cmd::RunArgs),
    /// The file systems `orion up` left on this host: pools (and the RAM they hold),
    /// state directory, running or not.
    List(hosted::ListArgs),
    /// Remove a file system of `orion up`: its pools and its state directory (asks
    /// first unless --yes; refuses while it runs).
    Destroy(hosted::DestroyArgs),
    /// A live view of a cluster from its daemons' metrics (every second; q quits).
    Top(top::TopArgs),
    /// Print the configuration: `--defaults` prints every key with its default.
    Config {
        #[arg(long)]
        defaults: bool,
        #[command(flatten)]
        common: daemons::Common,
    },
    /// Benchmarks that print figures.
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// The local core (volatile pools in /dev/shm) next to tmpfs: ops/s, p50, p99.
    Local {
        /// Operations per measured call type.
        #[arg(long, default_value_t = 20000)]
        ops: usize,
        #[arg(long)]
        json: bool,
    },
    /// The fabric's verbs between two processes, next to TCP and shared-memory floors.
    Fabric {
        /// local (same-host shared memory) or tcp (libfabric with --provider).
        #[arg(long, default_value = "local")]
        backend: String,
        #[arg(long, default_value = "tcp;ofi_rxm")]
        provider: String,
        /// Operations per measured row.
        #[arg(long, default_value_t = 20000)]
        iters: usize,
        #[arg(long)]
        json: bool,
    },
    /// The paper's microbenchmarks through the client library, against an MDS and a
    /// data store it starts (and stops).
    Client {
        /// local (same-host shared memory) or tcp (libfabric with --provider).
        #[arg(long, default_value = "local")]
        backend: String,
        #[arg(long, default_value = "tcp;ofi_rxm")]
        provider: String,
        /// Operations per measured row.
        #[arg(long, default_value_t = 5000)]
        iters: usize,
        /// Data stores in the group (every page is written to each).
        #[arg(long, default_value_t = 1)]
        replicas: u16,
        /// The stores' pool mode: volatile (durable on delivery: strong writes owe no
        /// notice) or msync (each store persists and notifies the MDS).
        #[arg(long, default_value = "volatile")]
        store_mode: String,
        /// An MDS mirror under this cluster manager: embedded or etcd (every update
        /// goes to the mirror before the primary answers).
        #[arg(long, default_value = "")]
        mirror: String,
        #[arg(long)]
        json: bool,
    },
    /// What a store failure costs a replicated group: the write stall around a kill -9,
    /// degraded latency, and the resync when the store comes back.
    Replicas {
        /// local (same-host shared memory) or tcp (libfabric with --provider).
        #[arg(long, default_value = "local")]
        backend: String,
        #[arg(long, default_value = "tcp;ofi_rxm")]
        provider: String,
        /// MiB written before the kill (what the store copies back).
        #[arg(long, default_value_t = 256)]
        data_mib: u64,
        #[arg(long)]
        json: bool,
    },
    /// What the death of the primary MDS costs when it has a mirror: the timeline from
    /// kill -9 to the mirror serving and the client's throughput back to 90 %.
    Failover {
        /// local (same-host shared memory) or tcp (libfabric with --provider).
        #[arg(long, default_value = "local")]
        backend: String,
        #[arg(long, default_value = "tcp;ofi_rxm")]
        provider: String,
        /// The cluster manager: embedded or etcd.
        #[arg(long, default_value = "embedded")]
        manager: String,
        /// Stop the primary (SIGSTOP: silent, as a host that vanished) instead of
        /// killing it.
        #[arg(long)]
        stop: bool,
        #[arg(long)]
        json: bool,
    },
    /// How the client library scales with threads: 4 KiB writes, reads and create +
    /// stat + unlink from 1, 2, 4, 8 threads, through one shared client and through a
    /// client per thread, against an MDS and a data store it starts (and stops).
    Threads {
        /// local (same-host shared memory) or tcp (libfabric with --provider).
        #[arg(long, default_value = "local")]
        backend: String,
        #[arg(long, default_value = "tcp;ofi_rxm")]
        provider: String,
        /// Thread counts, comma-separated.
        #[arg(long, default_value = "1,2,4,8", value_delimiter = ',')]
        threads: Vec<usize>,
        /// Milliseconds per row.
        #[arg(long, default_value_t = 1000)]
        millis: u64,
        #[arg(long)]
        json: bool,
    },
    /// MDS throughput (empty RPCs, log commits, tail reads) with 1, 2, 4 and 8 client
    /// processes, against an MDS and a data store it starts (and stops).
    Mds {
        /// local (same-host shared memory) or tcp (libfabric with --provider).
        #[arg(long, default_value = "local")]
        backend: String,
        #[arg(long, default_value = "tcp;ofi_rxm")]
        provider: String,
        /// How long each cell runs, in milliseconds.
        #[arg(long, default_value_t = 2000)]
        millis: u64,
        #[arg(long)]
        json: bool,
    },
    /// Through the mount, next to tmpfs and a null FUSE passthrough of tmpfs: 4 KiB
    /// random I/O latency and 1 MiB bandwidth (fio), create/stat/unlink/mkdir/rmdir.
    Mount {
        /// Entries for the metadata rows.
        #[arg(long, default_value_t = 10000)]
        files: usize,
        /// Seconds per fio latency row.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Also write the figures as JSON to this file (the table goes to stdout).
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Every workload of the side-by-side comparison (`bench/run`) in DIR, on
    /// whatever file system is mounted there: fio latency and bandwidth, metadata
    /// latency, the paper's Table 2 workloads (varmail, fileserver, webserver), SQLite.
    Workloads {
        /// A directory of the mounted file system to measure.
        #[arg(required_unless_present = "api", conflicts_with = "api")]
        dir: Option<PathBuf>,
        /// Measure OrionFS through the client library instead, against an MDS and a
        /// data store started for it (pools on /dev/shm, shared-memory fabric).
        #[arg(long)]
        api: bool,
        /// With --api: optimistic persistence (small writes committed in batches).
        #[arg(long, requires = "api")]
        optimistic: bool,
        /// With --api: use the cluster `orion up --dir CLUSTER` runs instead of
        /// starting one, so the client library is measured on the same MDSs and stores
        /// as that cluster's mount and `orion run`.
        #[arg(long, requires = "api")]
        cluster: Option<PathBuf>,
        /// Name of the system under DIR (for progress and the JSON).
        #[arg(long, default_value = "this file system")]
        system: String,
        /// Entries for the metadata rows.
        #[arg(long, default_value_t = 10000)]
        entries: usize,
        /// Seconds per fio latency row and per job count of a scaling row (the
        /// Table 2 workloads run twice as long).
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Scale of Table 2's file counts (1.0: 30 K, 10 K and 50 K files).
        #[arg(long, default_value_t = 0.1)]
        scale: f64,
        /// Only the workloads whose names contain one of these words.
        #[arg(long)]
        only: Vec<String>,
        /// Write the figures as JSON to this file (else to stdout).
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The null FUSE passthrough `orion bench mount` compares with.
    #[command(hide = true)]
    NullFuse { root: PathBuf, mountpoint: PathBuf },
    /// One client process of `orion bench mds`.
    #[command(hide = true)]
    MdsWorker(bench_mds::WorkerArgs),
    /// The benchmark's peer process (started by `orion bench fabric`).
    #[command(hide = true)]
    FabricPeer {
        #[arg(long)]
        role: String,
        #[arg(long, default_value = "tcp;ofi_rxm")]
        provider: String,
        #[arg(long)]
        secret_file: Option<PathBuf>,
        #[arg(long)]
        path: Option<PathBuf>,
    },
}

fn parse_size(s: &str) -> Result<u64, String> {
    orion_pmem::parse_size(s)
}

fn mode_choice(s: &str) -> Result<ModeChoice> {
    s.parse().map_err(anyhow::Error::msg)
}

fn run() -> Result<ExitCode> {
    match Cli::parse().cmd {
        Cmd::Mkfs {
            pool,
            size,
            pool_mode,
            force,
        } => {
            let data = data_pool_path(&pool);
            for p in [&pool, &data] {
                if p.exists() && !force {
                    bail!(
                        "{} already exists; pass --force to overwrite it",
                        p.display()
                    );
                }
            }
            let what = format!("formatting {}", pool.display());
            let mut progress = Progress::new(what, size, Unit::Bytes);
            let mode = mode_choice(&pool_mode)?;
            let (m, d) = LocalFs::mkfs_reporting(&pool, size, mode, SystemClock.now(), &mut |n| {
                progress.set(n)
            })
            .with_context(|| format!("formatting {}", pool.display()))?;
            progress.finish();
            println!("{}", m.describe());
            println!("{}", d.describe());
            let sb =
                orion_format::Superblock::decode(&m.read_vec(0, orion_format::SUPERBLOCK_SIZE)?)?;
            println!(
                "formatted: {} inode slots, {} MiB of data pages",
                sb.inode_count - 1,
                d.len() >> 20
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Up(a) => {
            up::up(a)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench {
            which:
                BenchCmd::Replicas {
                    backend,
                    provider,
                    data_mib,
                    json,
                },
        } => {
            bench_replicas::run(&backend, &provider, data_mib, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench {
            which:
                BenchCmd::Failover {
                    backend,
                    provider,
                    manager,
                    stop,
                    json,
                },
        } => {
            bench_failover::run(&backend, &provider, &manager, stop, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench {
            which:
                BenchCmd::Threads {
                    backend,
                    provider,
                    threads,
                    millis,
                    json,
                },
        } => {
            if threads.is_empty() || threads.iter().any(|&n| n == 0 || n > 256) {
                anyhow::bail!("--threads: 1 to 256 threads per row, comma-separated");
            }
            bench_threads::run(&backend, &provider, &threads, millis, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Status(a) => {
            status::status(a)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Manager { listen, dir } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let stop = signals::stop_flag().context("installing signal handlers")?;
            let server = orion_manager::embedded::EmbeddedServer::start(
                &listen,
                &dir.join("manager.epoch"),
            )?;
            daemons::announce(format!(
                "orion manager ready: listening on {} (state in {})",
                server.addr,
                dir.display()
            ));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Mount(a) => {
            mount_cmd::mount(a)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Umount(a) => {
            mount_cmd::umount(a)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Fsck(a) => fsck_cmd::fsck(a),
        Cmd::Mds(a) => {
            daemons::mds(a)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Ds(a) => {
            daemons::ds(a)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Fs(a) => {
            fs_cmd::run(a)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run(a) => {
            run_cmd::run(a)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::List(a) => {
            hosted::list(a)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Destroy(a) => {
            hosted::destroy(a)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Top(a) => {
            top::top(a)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Config { defaults, common } => {
            let text = if defaults {
                config::Config::defaults_toml()
            } else {
                toml::to_string_pretty(&common.load()?)?
            };
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench {
            which: BenchCmd::Local { ops, json },
        } => {
            bench_local::run(ops, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench {
            which:
                BenchCmd::Client {
                    backend,
                    provider,
                    iters,
                    replicas,
                    store_mode,
                    mirror,
                    json,
                },
        } => {
            bench_client::run(
                &backend,
                &provider,
                iters,
                replicas,
                &store_mode,
                &mirror,
                json,
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench {
            which:
                BenchCmd::Fabric {
                    backend,
                    provider,
                    iters,
                    json,
                },
        } => {
            bench_fabric::run(&backend, &provider, iters, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench {
            which:
                BenchCmd::Mds {
                    backend,
                    provider,
                    millis,
                    json,
                },
        } => {
            bench_mds::run(&backend, &provider, millis, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench {
            which:
                BenchCmd::Mount {
                    files,
                    seconds,
                    json,
                },
        } => {
            bench_mount::run(files, seconds, json.as_deref())?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench {
            which:
                BenchCmd::Workloads {
                    dir,
                    api,
                    optimistic,
                    cluster,
                    system,
                    entries,
                    seconds,
                    scale,
                    only,
                    json,
                },
        } => {
            let o = bench_workloads::Options {
                system,
                entries,
                seconds,
                scale,
                only,
            };
            let v = match dir {
                Some(dir) if !api => {
                    if !dir.is_dir() {
                        anyhow::bail!("{} is not a directory", dir.display());
                    }
                    bench_workloads::run(&bench_workloads::Mounted(dir), &o)?
                }
                _ => {
                    // Kept until the run ends: dropping it stops the cluster it started.
                    let (client, _started) = match cluster {
                        Some(dir) => (bench_workloads::up_client(&dir, optimistic)?, None),
                        None => {
                            let c = bench_cluster::BenchCluster::start("local", "tcp;ofi_rxm")?;
                            (c.client_with(true, true, optimistic)?, Some(c))
                        }
                    };
                    let root = format!("/bench-api-{}", std::process::id());
                    client
                        .mkdir(&root, 0o755)
                        .map_err(|e| anyhow::anyhow!("mkdir {root}: {e}"))?;
                    let api = bench_workloads::Api { client, root };
                    let v = bench_workloads::run(&api, &o)?;
                    // The workloads removed what they made; their root goes too (a
                    // cluster of `--cluster` is the user's).
                    let _ = api.client.rmdir(&api.root);
                    v
                }
            };
            let text = serde_json::to_string_pretty(&v)? + "\n";
            match json {
                Some(f) => std::fs::write(&f, text)
                    .map_err(|e| anyhow::anyhow!("writing {}: {e}", f.display()))?,
                None => print!("{text}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench {
            which: BenchCmd::NullFuse { root, mountpoint },
        } => {
            bench_mount::null_fuse(&root, &mountpoint)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench {
            which: BenchCmd::MdsWorker(a),
        } => {
            bench_mds::worker(a)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench {
            which:
                BenchCmd::FabricPeer {
                    role,
                    provider,
                    secret_file,
                    path,
                },
        } => {
            bench_fabric::peer(&role, &provider, secret_file.as_deref(), path.as_deref())?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn main() -> ExitCode {
    // `orion up` talks to its user itself, and logs (its cluster manager's) to a file
    // in its state directory once it knows it (`up::log_to`).
    if std::env::args().nth(1).as_deref() != Some("up") {
        if let Err(e) = logs::init() {
            eprintln!("orion: {e:#}");
            return ExitCode::from(2);
        }
    }
    let code = match run() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("orion: {e:#}");
            ExitCode::from(2)
        }
    };
    // A daemon's threads may still hold its fabric domain (a connection a mirror
    // was following, the metrics endpoint's client) as the process ends, and with it
    // the domain's shared-memory files, which hold RAM: they go now, whatever holds
    // them.
    orion_fabric::local::remove_own_files();
    code
}
