//! `orion up`'s metadata servers. By default two: a primary and its mirror (Orion
//! §3.1), under the embedded cluster manager, which runs inside `orion up` itself (a
//! process that outlives them; its epoch file is in the state directory). Each MDS
//! keeps its own port across restarts, so the stores and the mount are given both
//! addresses once. Whichever takes the role says ready; the other mirrors it, and an
//! MDS that dies starts again (as the mirror of the one that took over).
//!
//! With `--no-mirror` there is one MDS and no manager, as before the mirror existed.

use std::path::Path;

use anyhow::{Context, Result};

use crate::procs::{listen_addr, mds_port, mds_role_args, metrics_listen, Daemon, ManagerProc};
use crate::status::Proc;

/// The name the manager knows `orion up`'s cluster by.
pub const CLUSTER: &str = "orion-up";
/// The primary's lease: a fail-over on this host takes about this long.
pub const LEASE_MS: u64 = 1000;

/// How one MDS starts (and starts again).
pub struct MdsStart {
    pub name: String,
    pub args: Vec<String>,
    pub log: std::path::PathBuf,
    pub proc: Proc,
    pub pool: std::path::PathBuf,
}

/// The MDSs as started, the manager, and what the stores and the mount are told.
pub struct Mdss {
    pub manager: Option<ManagerProc>,
    pub starts: Vec<MdsStart>,
    /// The `mds` setting of stores and mounts: every MDS address.
    pub setting: String,
}

/// Starts the MDSs; returns them with the first one's ready line seen (the primary's).
pub fn start(
    manager_kind: Option<&str>,
    state: &Path,
    pools: &Path,
    logs: &Path,
    base: impl Fn(&Path, bool) -> Vec<String>,
    fresh: bool,
    previous: Option<&[Proc]>,
) -> Result<(Mdss, Vec<Daemon>, usize)> {
    let Some(kind) = manager_kind else {
        let pool = pools.join("mds.pool");
        let metrics = metrics_listen()?;
        let mut args = base(&pool, true);
        args.extend(["--metrics".into(), metrics.arg]);
        let log = logs.join("mds.log");
        let (d, line) = Daemon::spawn("the MDS", &args, &log)?;
        let addr = listen_addr(&line).context("the MDS's ready line has no address")?;
        let proc = Proc {
            name: String::new(),
            addr: addr.clone(),
            pid: d.pid(),
            metrics: metrics.addr,
        };
        let start = MdsStart {
            name: "the MDS".into(),
            args,
            log,
            proc,
            pool,
        };
        return Ok((
            Mdss {
                manager: None,
                starts: vec![start],
                setting: addr,
            },
            vec![d],
            0,
        ));
    };
    let epoch_file = ManagerProc::state_in(kind, state);
    let mirror_pool = pools.join("mds-mirror.pool");
    if fresh {
        // A new file system: a mirror's pool and the manager's record left by an
        // earlier one describe that one (its record could name mds-b, whose pool is
        // of the old cluster, as the only MDS that may serve).
        for old in [&mirror_pool, &epoch_file] {
            let gone = if old.is_dir() {
                std::fs::remove_dir_all(old) // etcd's data
            } else if old.exists() {
                std::fs::remove_file(old)
            } else {
                Ok(())
            };
            gone.with_context(|| format!("removing {}", old.display()))?;
        }
    } else if !epoch_file.exists() && mirror_pool.exists() {
        // Without the manager's record of who was last in sync, the MDS pool is the
        // authority; the mirror's is copied anew from it.
        eprintln!(
            "orion up: {} is missing: {} is taken as the file system, and the mirror \
             copies it again",
            epoch_file.display(),
            pools.join("mds.pool").display()
        );
        std::fs::remove_file(&mirror_pool)
            .with_context(|| format!("removing {}", mirror_pool.display()))?;
    }
    let manager = ManagerProc::start(kind, state).context("starting the cluster manager")?;
    let mut starts = Vec::new();
    let previous_port = |k: usize| -> Option<u16> {
        let p = previous?.get(k)?;
        p.addr.rsplit(':').next()?.parse().ok()
    };
    // Each MDS's port is chosen before any listens: none may be another's, this
    // run's or (kept when free) the previous run's.
    let mut taken: Vec<u16> = (0..2).filter_map(previous_port).collect();
    for (k, (name, pool)) in [("mds-a", pools.join("mds.pool")), ("mds-b", mirror_pool)]
        .into_iter()
        .enumerate()
    {
        // The previous run's port when it is free: a mount or a script that kept the
        // old addresses still finds the MDS.
        let mine = previous_port(k);
        let others: Vec<u16> = taken.iter().copied().filter(|&p| Some(p) != mine).collect();
        let port = mds_port(mine, &others)?;
        taken.push(port);
        let addr = format!("127.0.0.1:{port}");
        let metrics = metrics_listen()?;
        let mut args = mds_role_args(
            base(&pool, k == 0),
            &addr,
            &manager.spec(),
            name,
            CLUSTER,
            LEASE_MS,
        );
        args.extend(["--metrics".into(), metrics.arg]);
        let log = logs.join(format!("{name}.log"));
        starts.push(MdsStart {
            name: name.into(),
            args,
            log,
            proc: Proc {
                name: name.into(),
                addr,
                pid: 0,
                metrics: metrics.addr,
            },
            pool,
        });
    }
    let mut children = Vec::new();
    for s in &mut starts {
        let d = Daemon::start(&s.name, &s.args, &s.log)?;
        s.proc.pid = d.pid();
        children.push(d);
    }
    let setting = starts
        .iter()
        .map(|s| s.proc.addr.clone())
        .collect::<Vec<_>>()
        .join(",");
    // The first to say ready holds the role.
    let t0 = std::time::Instant::now();
    let mut restarted = vec![false; children.len()];
    let primary = loop {
        if let Some(k) = children.iter_mut().position(|d| d.ready_now().is_some()) {
            break k;
        }
        // One that exited (a manager slow to answer, a port taken meanwhile) is
        // started once more: the other may not be able to serve alone (a new mirror
        // has nothing to serve). A second exit, or both, is said at once rather than
        // after the 2 minutes.
        if let Some(k) = children.iter_mut().position(|d| d.exited().is_some()) {
            let log = std::fs::read_to_string(&starts[k].log).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(20)..];
            let (name, path) = (&starts[k].name, starts[k].log.display());
            if restarted[k] || children.iter_mut().all(|d| d.exited().is_some()) {
                anyhow::bail!(
                    "{name} exited while starting ({path}):\n{}",
                    tail.join("\n")
                );
            }
            eprintln!("\norion up: {name} exited while starting; starting it again ({path})");
            let d = Daemon::start(&starts[k].name, &starts[k].args, &starts[k].log)?;
            starts[k].proc.pid = d.pid();
            children[k] = d;
            restarted[k] = true;
        }
        if crate::signals::stop_requested() {
            anyhow::bail!("interrupted while the MDSs started");
        }
        if t0.elapsed() > std::time::Duration::from_secs(120) {
            anyhow::bail!(
                "no MDS took the primary role within 2 minutes (logs in {})",
                logs.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    Ok((
        Mdss {
            manager: Some(manager),
            starts,
            setting,
        },
        children,
        primary,
    ))
}
