//! `orion up`: a whole cluster on this machine in one command: an MDS, two
//! replication groups of `--replicas` data stores each, and a mount, as child
//! processes of this one, in the foreground. Ctrl-C (or SIGTERM) unmounts and stops
//! them in order: the mount first (so no request is left without a server), then the
//! stores, then the MDS. A data store that dies is said, and started again after a
//! short pause (it copies what it missed from its group's other replica); the rest go
//! on serving.
//!
//! The state directory keeps what identifies the cluster (its secret) and the logs;
//! the pools live in /dev/shm by default (volatile, the way the Orion paper emulates
//! persistent memory: they survive the processes, not a reboot), or wherever
//! `--pools` says (a disk directory gives msync pools that survive reboots). Run again
//! with the same state directory, it serves the same file system.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::procs::{listen_addr, Daemon};
use crate::signals::stop_flag;
use crate::status::{StoreProc, UpState};
use crate::up_mds;

/// Replication groups `orion up` starts.
const GROUPS: u16 = 2;

/// How long a data store that died rests before it starts again.
const RESTART_PAUSE: Duration = Duration::from_secs(1);

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Where to mount (created if missing; default: STATE_DIR/mnt).
    #[arg(long)]
    pub mount: Option<PathBuf>,
    /// The cluster's state: secret and logs (default: $XDG_DATA_HOME/orion, else
    /// ~/.local/share/orion).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Where the pools live (default: a directory in /dev/shm named after the state
    /// directory: volatile, emulated persistent memory).
    #[arg(long)]
    pub pools: Option<PathBuf>,
    /// Size of the MDS pool (inodes and logs): one inode per KiB, so the default
    /// holds a million files.
    #[arg(long, default_value = "1G")]
    pub mds_size: String,
    /// Size of each data store's pool.
    #[arg(long, default_value = "1G")]
    pub ds_size: String,
    /// Data stores per replication group: every page is written to each, and the file
    /// system serves while one of each group lives.
    #[arg(long, default_value_t = 1)]
    pub replicas: u16,
    /// Fabric backend between the processes: local (shared memory, the fastest on one
    /// machine) or libfabric.
    #[arg(long, default_value = "local")]
    pub backend: String,
    /// libfabric provider (with --backend libfabric).
    #[arg(long, default_value = "tcp;ofi_rxm")]
    pub provider: String,
    /// One MDS, without a mirror and without the cluster manager (by default a
    /// mirror takes over within about a second when the primary dies).
    #[arg(long, conflicts_with = "etcd")]
    pub no_mirror: bool,
    /// Run etcd (Debian's etcd-server, data in the state directory, stopped with the
    /// cluster) as the cluster manager instead of the one built into `orion up`.
    #[arg(long)]
    pub etcd: bool,
    /// Start the daemons, then exit at once leaving nothing running (a smoke test of
    /// the setup; used by the tests).
    #[arg(long, hide = true)]
    pub check: bool,
}

pub(crate) fn default_state_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("orion"));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .context("neither XDG_DATA_HOME nor HOME is set: pass --dir")?;
    Ok(PathBuf::from(home).join(".local/share/orion"))
}

/// /dev/shm/orion-<uid>-<hash of the state directory>: one pool directory per state
/// directory, so two clusters of one user do not share pools.
pub(crate) fn default_pool_dir(state: &Path) -> PathBuf {
    let h = crc32c::crc32c(state.as_os_str().as_encoded_bytes());
    // SAFETY: getuid only reads the process's credentials.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/dev/shm/orion-{uid}-{h:08x}"))
}

fn step(what: &str) -> Instant {
    eprint!("orion up: {what} ... ");
    Instant::now()
}

fn done(t: Instant, detail: &str) {
    eprintln!("done in {} ms{detail}", t.elapsed().as_millis());
}

pub fn up(a: UpArgs) -> Result<()> {
    let stop = stop_flag()?;
    let state = match &a.dir {
        Some(d) => d.clone(),
        None => default_state_dir()?,
    };
    std::fs::create_dir_all(state.join("logs"))
        .with_context(|| format!("creating the state directory {}", state.display()))?;
    let state = state.canonicalize()?;
    log_to(&state.join("logs").join("up.log"))?;
    let pools = a.pools.clone().unwrap_or_else(|| default_pool_dir(&state));
    std::fs::create_dir_all(&pools)
        .with_context(|| format!("creating the pool directory {}", pools.display()))?;
    let mnt = a.mount.clone().unwrap_or_else(|| state.join("mnt"));
    if orion_fuse::unmount_stale(&mnt)? {
        eprintln!("orion up: removed a stale mount at {}", mnt.display());
    }
    std::fs::create_dir_all(&mnt)
        .with_context(|| format!("creating the mount point {}", mnt.display()))?;
    let secret = state.join("secret");
    // A state directory without its secret is new (or was removed and made again).
    let state_is_new = !secret.exists();
    crate::config::ensure_secret(&secret)?;
    if a.replicas == 0 {
        bail!("--replicas must be at least 1");
    }
    let mds_pool = pools.join("mds.pool");
    let stores: Vec<(u16, u16, PathBuf)> = (0..GROUPS)
        .flat_map(|g| (0..a.replicas).map(move |i| (g, i)))
        .map(|(g, i)| (g, i, pools.join(store_pool_name(g, i))))
        .collect();
    let existing = stores.iter().filter(|s| s.2.exists()).count();
    let fresh = !mds_pool.exists();
    if fresh && existing > 0 {
        bail!(
            "{} is missing but {existing} data store pool(s) in {} remain: the file system \
             is incomplete. Remove {} to start a new one.",
            mds_pool.display(),
            pools.display(),
            pools.display()
        );
    }
    // A group with no pool left has lost its data; a lost replica is rebuilt from
    // its group's others (a fresh pool resyncs whole).
    if let Some(g) =
        (0..GROUPS).find(|g| !fresh && !stores.iter().any(|s| s.0 == *g && s.2.exists()))
    {
        bail!(
            "every pool of data store group {g} in {} is missing: its data is gone. Remove \
             {} to start a new file system.",
            pools.display(),
            pools.display()
        );
    }
    // The pools' lock, held (with the daemons, which inherit it) until this returns.
    let _pools_held = crate::hosted::hold(&pools)?;
    match crate::hosted::owner_of(&pools).filter(|o| !fresh && o != &state) {
        Some(o) if o.is_dir() => bail!(
            "the pools in {} belong to the file system of {}: run `orion up --dir {}`, or \
             give this one other pools",
            pools.display(),
            o.display(),
            o.display()
        ),
        Some(o) => eprintln!(
            "orion up: the pools in {} hold the file system of {}, which was removed; \
             serving it with this state directory (`orion destroy --pools {}` removes it \
             instead)",
            pools.display(),
            o.display(),
            pools.display()
        ),
        None if state_is_new && !fresh => eprintln!(
            "orion up: the pools in {} hold a file system whose state directory was removed; \
             serving it again (`orion destroy --pools {}` removes it instead)",
            pools.display(),
            pools.display()
        ),
        None => {}
    }
    crate::hosted::record(&state, &pools)?;
    let logs = state.join("logs");
    let common: Vec<String> = vec![
        "--backend".into(),
        a.backend.clone(),
        "--provider".into(),
        a.provider.clone(),
        "--secret-file".into(),
        secret.display().to_string(),
    ];
    // `format`: create the pool if it is missing (not for a mirror: its pool is a copy
    // of the primary's).
    let serve = |what: &str, pool: &Path, size: &str, format: bool| -> Vec<String> {
        let mut v: Vec<String> = vec![what.into()];
        if format {
            v.push("--format".into());
        }
        v.extend(["--pool".into(), pool.display().to_string()]);
        v.extend(["--pool-size".into(), size.into()]);
        v.extend(["--listen".into(), "127.0.0.1:0".into()]);
        v.extend(common.iter().cloned());
        v
    };
    eprintln!(
        "orion up: {} file system; state in {}, pools in {}",
        if fresh { "a new" } else { "the existing" },
        state.display(),
        pools.display()
    );
    // Children in start order; stopped in reverse.
    let mut children: Vec<Daemon> = Vec::new();
    let mut rows: Vec<String> = Vec::new();
    let t = step(&if fresh {
        format!(
            "formatting the MDS pool ({}) and starting the MDS",
            a.mds_size
        )
    } else {
        "recovering the MDS pool and starting the MDS".to_string()
    });
    let previous = UpState::load(&state).ok().map(|u| u.mdss);
    let base = |pool: &Path, format: bool| {
        let mut v = serve("mds", pool, &a.mds_size, format);
        v.extend(["--replicas".into(), a.replicas.to_string()]);
        v
    };
    let (mdss, started, primary) = up_mds::start(
        match (a.no_mirror, a.etcd) {
            (true, _) => None,
            (false, true) => Some("etcd"),
            (false, false) => Some("embedded"),
        },
        &state,
        &pools,
        &logs,
        base,
        fresh,
        previous.as_deref(),
    )?;
    done(t, "");
    let mds_addr = mdss.setting.clone();
    for (k, m) in mdss.starts.iter().enumerate() {
        let (name, role) = match (mdss.starts.len(), k == primary) {
            (1, _) => ("mds", ""),
            (_, true) => (m.name.as_str(), " (primary)"),
            (_, false) => (m.name.as_str(), " (mirror)"),
        };
        rows.push(format!(
            "  {name:<7}pid {:<7} {:<21} pool {}{role}",
            m.proc.pid,
            m.proc.addr,
            m.pool.display()
        ));
    }
    let mut up_state = UpState {
        fabric: crate::config::FabricSection {
            backend: a.backend.clone(),
            provider: a.provider.clone(),
            secret_file: secret.clone(),
            ..Default::default()
        },
        mds: mdss.starts[primary].proc.clone(),
        mdss: mdss.starts.iter().map(|m| m.proc.clone()).collect(),
        manager: mdss.manager.as_ref().map(|m| m.spec()).unwrap_or_default(),
        stores: Vec::new(),
        mount: mnt.display().to_string(),
        mount_metrics: String::new(),
    };
    let mut restarts: Vec<Restart> = mdss
        .starts
        .iter()
        .enumerate()
        .map(|(k, m)| Restart {
            name: m.name.clone(),
            args: m.args.clone(),
            log: m.log.clone(),
            what: Which::Mds(k),
        })
        .collect();
    children.extend(started);
    for (g, i, pool) in &stores {
        let name = store_name(*g, *i, a.replicas);
        let t = step(&if pool.exists() {
            format!("starting {name}")
        } else {
            format!("formatting {name}'s pool ({}) and starting it", a.ds_size)
        });
        let mut args = serve("ds", pool, &a.ds_size, true);
        args.extend([
            "--group".into(),
            g.to_string(),
            "--index".into(),
            i.to_string(),
            "--mds".into(),
            mds_addr.clone(),
        ]);
        let metrics = crate::procs::metrics_listen()?;
        args.extend(["--metrics".into(), metrics.arg]);
        let log = logs.join(format!(
            "{}.log",
            store_pool_name(*g, *i).trim_end_matches(".pool")
        ));
        let (ds, line) = Daemon::spawn(&name, &args, &log)?;
        done(t, "");
        let addr = listen_addr(&line).unwrap_or_default();
        rows.push(format!(
            "  {name:<7}pid {:<7} {:<21} pool {}",
            ds.pid(),
            addr,
            pool.display()
        ));
        restarts.push(Restart {
            name,
            args,
            log,
            what: Which::Store(up_state.stores.len()),
        });
        up_state.stores.push(StoreProc {
            group: *g,
            index: *i,
            addr,
            pid: ds.pid(),
            metrics: metrics.addr,
        });
        children.push(ds);
    }
    up_state.save(&state)?;
    if a.check {
        for r in &rows {
            println!("{r}");
        }
        println!("orion up check: the cluster started; stopping it");
        stop_all(children);
        return Ok(());
    }
    let t = step(&format!("mounting at {}", mnt.display()));
    let mut args: Vec<String> = vec!["mount".into(), mnt.display().to_string()];
    args.extend(["--mds".into(), mds_addr.clone()]);
    args.extend(common.iter().cloned());
    let mount_metrics = crate::procs::metrics_listen()?;
    args.extend(["--metrics".into(), mount_metrics.arg]);
    let (mount, _) = Daemon::spawn("the mount", &args, &logs.join("mount.log"))?;
    up_state.mount_metrics = mount_metrics.addr;
    up_state.save(&state)?;
    done(t, "");
    rows.push(format!("  mount  pid {:<7} {}", mount.pid(), mnt.display()));
    children.push(mount);
    for r in &rows {
        println!("{r}");
    }
    println!(
        "orion up ready: OrionFS mounted at {}; Ctrl-C unmounts and stops everything \
         (logs in {})",
        mnt.display(),
        logs.display()
    );
    tracing::info!("ready: mounted at {}", mnt.display());
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // Serve until asked to stop, or until the mount ends on its own; an MDS or a data
    // store that ends starts again after a pause (an MDS as the mirror of the one
    // that took over).
    let mut failed = None;
    let mut pending: Vec<(Instant, usize)> = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        if let Some((k, status)) = children
            .iter_mut()
            .enumerate()
            .find_map(|(k, c)| c.exited().map(|s| (k, s)))
        {
            let c = children.remove(k);
            match restarts.iter().position(|r| r.name == c.name) {
                Some(r) => {
                    event(format!(
                        "{} exited ({status}); the others go on serving, and it starts again \
                         in {} s (log: {})",
                        c.name,
                        RESTART_PAUSE.as_secs(),
                        restarts[r].log.display()
                    ));
                    pending.push((Instant::now() + RESTART_PAUSE, r));
                }
                None => {
                    failed = Some(format!(
                        "{} exited ({status}); see {}",
                        c.name,
                        logs.display()
                    ));
                    break;
                }
            }
        }
        if let Some(p) = pending.iter().position(|(t, _)| Instant::now() >= *t) {
            let (_, r) = pending.remove(p);
            let s = &restarts[r];
            // An MDS starts again as the mirror: it says ready only if it takes over.
            let started = match s.what {
                Which::Mds(_) => Daemon::start(&s.name, &s.args, &s.log).map(|d| (d, None)),
                Which::Store(_) => {
                    Daemon::spawn(&s.name, &s.args, &s.log).map(|(d, l)| (d, Some(l)))
                }
            };
            match started {
                Ok((d, line)) => {
                    event(format!("{} started again (pid {})", s.name, d.pid()));
                    match s.what {
                        Which::Mds(k) => up_state.mdss[k].pid = d.pid(),
                        Which::Store(k) => {
                            let entry = &mut up_state.stores[k];
                            entry.pid = d.pid();
                            entry.addr = line.as_deref().and_then(listen_addr).unwrap_or_default();
                        }
                    }
                    if let Err(e) = up_state.save(&state) {
                        eprintln!("orion up: recording the new pid: {e:#}");
                    }
                    // Stopped in reverse order: an MDS last, a store before the MDSs,
                    // both after the mount.
                    let at = match s.what {
                        Which::Mds(_) => 0,
                        Which::Store(_) => up_state.mdss.len().max(1),
                    };
                    children.insert(at.min(children.len()), d);
                }
                Err(e) => {
                    event(format!(
                        "starting {} again failed: {e:#}; trying later",
                        s.name
                    ));
                    pending.push((Instant::now() + RESTART_PAUSE, r));
                }
            }
        }
        // Four looks a second: a daemon that died is started again within 250 ms (its
        // mirror or peers cover it meanwhile: a fail-over takes about a lease), and
        // an idle cluster's supervisor barely wakes.
        std::thread::sleep(Duration::from_millis(250));
    }
    event("stopping".into());
    stop_all(children);
    if orion_fuse::unmount_stale(&mnt).unwrap_or(false) {
        eprintln!("orion up: removed the mount left at {}", mnt.display());
    }
    match failed {
        Some(why) => {
            tracing::error!("stopped: {why}");
            bail!("{why}")
        }
        None => {
            event("stopped; run it again to serve the same file system".into());
            Ok(())
        }
    }
}

/// Tells the user, and the log (`up.log`, next to the cluster manager's lines): what
/// `orion up` sees happen to its processes.
fn event(what: String) {
    eprintln!("orion up: {what}");
    tracing::info!("{what}");
}

/// Sends this process's log (its cluster manager's) to `path`, appended to and
/// rotated ([`crate::logs`]); its stderr stays the user's.
fn log_to(path: &Path) -> Result<()> {
    crate::logs::to_file(path, false)
}

/// How `orion up` starts a daemon again after it died.
struct Restart {
    name: String,
    args: Vec<String>,
    log: PathBuf,
    what: Which,
}

/// Which entry of the state file a restarted daemon is.
#[derive(Clone, Copy)]
enum Which {
    Mds(usize),
    Store(usize),
}

/// The pool file of replica `index` of group `group` (replica 0 keeps the name of a
/// cluster without replication).
fn store_pool_name(group: u16, index: u16) -> String {
    match index {
        0 => format!("ds{group}.pool"),
        i => format!("ds{group}.r{i}.pool"),
    }
}

fn store_name(group: u16, index: u16, replicas: u16) -> String {
    match replicas {
        1 => format!("ds {group}"),
        _ => format!("ds {group}.{index}"),
    }
}

/// Stops children in reverse start order, each given time to finish cleanly.
fn stop_all(mut children: Vec<Daemon>) {
    while let Some(mut c) = children.pop() {
        let t = step(&format!("stopping {} (pid {})", c.name, c.pid()));
        c.stop(Duration::from_secs(10));
        done(t, "");
    }
}
