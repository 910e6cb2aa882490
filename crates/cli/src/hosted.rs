//! The file systems this host holds: `orion list` and `orion destroy`.
//!
//! `orion up` keeps a file system in two places: its state directory (secret, logs,
//! `cluster.json`) and its pool directory (in /dev/shm by default: RAM, until it is
//! removed or the machine restarts). Each names the other (`pools.json` in the state
//! directory, `owner.json` in the pool directory), and every pool directory is listed
//! in a register of the user's (`orion-filesystems.json` next to the default state
//! directory), so that neither a deleted state directory nor pools outside /dev/shm
//! are forgotten. `orion list` also finds pool directories in /dev/shm that predate
//! the register.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};

use crate::status::UpState;

/// In a pool directory: whose it is.
const OWNER: &str = "owner.json";
/// In a state directory: where its pools are.
const POOLS: &str = "pools.json";

#[derive(Debug, Serialize, Deserialize)]
struct Owner {
    state: PathBuf,
}

#[derive(Debug, Serialize, Deserialize)]
struct PoolsRecord {
    pools: PathBuf,
}

/// One file system on this host, as `orion list` shows it.
#[derive(Debug, Serialize)]
pub struct Hosted {
    pub pools: PathBuf,
    /// The state directory that made it (unknown for pools from before the register).
    pub state: Option<PathBuf>,
    pub state_exists: bool,
    /// Bytes its pool files hold (allocated: RAM, for pools in /dev/shm).
    pub bytes: u64,
    /// Processes of it that run (its daemons, by the PIDs its state recorded).
    pub running: Vec<u32>,
}

/// Where the user's register lives: next to the default state directory.
fn register_path() -> Result<PathBuf> {
    let d = crate::up::default_state_dir()?;
    Ok(d.with_file_name("orion-filesystems.json"))
}

fn read_register() -> Vec<PathBuf> {
    register_path()
        .ok()
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Holds the register for a read-modify-write (`orion up`s starting at once each
/// add their pools); released when dropped.
fn lock_register() -> Result<std::fs::File> {
    let p = register_path()?.with_extension("lock");
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&p)
        .with_context(|| format!("opening {}", p.display()))?;
    f.lock()
        .with_context(|| format!("locking {}", p.display()))?;
    Ok(f)
}

fn write_register(list: &[PathBuf]) -> Result<()> {
    let p = register_path()?;
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    orion_pmem::replace_durably(&p, &serde_json::to_vec_pretty(list)?)
        .with_context(|| format!("writing {}", p.display()))
}

/// What `orion up` records before it starts anything: each directory names the other,
/// and the pools join the register.
pub fn record(state: &Path, pools: &Path) -> Result<()> {
    let pools = std::fs::canonicalize(pools)?;
    let owner = serde_json::to_vec_pretty(&Owner {
        state: state.to_path_buf(),
    })?;
    orion_pmem::replace_durably(&pools.join(OWNER), &owner)
        .with_context(|| format!("writing {}", pools.join(OWNER).display()))?;
    let rec = serde_json::to_vec_pretty(&PoolsRecord {
        pools: pools.clone(),
    })?;
    orion_pmem::replace_durably(&state.join(POOLS), &rec)
        .with_context(|| format!("writing {}", state.join(POOLS).display()))?;
    // The register only helps `orion list` find pools outside /dev/shm: a failure
    // to keep it is said, not fatal.
    if let Err(e) = register(pools) {
        eprintln!("orion up: the register of file systems was not updated: {e:#}");
    }
    Ok(())
}

/// Adds `pools` to the register (and drops directories removed by hand).
fn register(pools: PathBuf) -> Result<()> {
    let _locked = lock_register()?;
    let before = read_register();
    let mut list: Vec<PathBuf> = before.iter().filter(|p| p.is_dir()).cloned().collect();
    if !list.contains(&pools) {
        list.push(pools);
    }
    if list != before {
        write_register(&list)?;
    }
    Ok(())
}

/// The state directory a pool directory's owner record names, if any.
fn owner_of(pools: &Path) -> Option<PathBuf> {
    let b = std::fs::read(pools.join(OWNER)).ok()?;
    serde_json::from_slice::<Owner>(&b).ok().map(|o| o.state)
}

/// Whether `name` is a file `orion up` or its daemons make in a pool directory.
fn ours(name: &str) -> bool {
    name == OWNER
        || [".pool", ".boot", ".members", ".ring"]
            .iter()
            .any(|s| name.ends_with(s))
}

/// Bytes the files of `dir` hold on their medium.
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.blocks() * 512)
        .sum()
}

/// Whether `pid` is a live orion process.
fn alive(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|&b| b == 0).next().is_some_and(is_orion))
}

fn is_orion(argv0: &[u8]) -> bool {
    argv0.rsplit(|&b| b == b'/').next() == Some(b"orion")
}

/// The daemons of the cluster in `state` that still run.
fn running(state: &Path) -> Vec<u32> {
    let Ok(u) = UpState::load(state) else {
        return Vec::new();
    };
    let pids = std::iter::once(u.mds.pid)
        .chain(u.mdss.iter().map(|m| m.pid))
        .chain(u.stores.iter().map(|s| s.pid));
    let mut v: Vec<u32> = pids.filter(|&p| p != 0 && alive(p)).collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn describe(pools: PathBuf) -> Hosted {
    let state = owner_of(&pools);
    let state_exists = state.as_ref().is_some_and(|s| s.is_dir());
    let running = match (&state, state_exists) {
        (Some(s), true) => running(s),
        _ => Vec::new(),
    };
    Hosted {
        bytes: allocated(&pools),
        pools,
        state,
        state_exists,
        running,
    }
}

/// Every file system this host holds for this user: the register's, and pool
/// directories of `orion up` in /dev/shm.
pub fn all() -> Vec<Hosted> {
    let mut dirs = read_register();
    // SAFETY: getuid only reads the process's credentials.
    let uid = unsafe { libc::getuid() };
    let prefix = format!("orion-{uid}-");
    let shm = std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten();
    for e in shm {
        let name = e.file_name();
        if name.to_str().is_some_and(|n| n.starts_with(&prefix)) && e.path().is_dir() {
            dirs.push(e.path());
        }
    }
    let mut seen = std::collections::HashSet::new();
    dirs.into_iter()
        .filter(|d| d.is_dir() && seen.insert(d.clone()))
        .map(describe)
        .collect()
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// One JSON object per file system, in an array.
    #[arg(long)]
    pub json: bool,
}

pub fn list(a: ListArgs) -> Result<()> {
    let all = all();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    if all.is_empty() {
        println!("no file system of `orion up` on this host");
        return Ok(());
    }
    let rows: Vec<[String; 4]> = all
        .iter()
        .map(|h| {
            let state = match (&h.state, h.state_exists) {
                (Some(s), true) => s.display().to_string(),
                (Some(s), false) => format!("{} (removed)", s.display()),
                (None, _) => "(unknown)".into(),
            };
            let status = match h.running.is_empty() {
                true => "stopped".to_string(),
                false => format!("running (pids {:?})", h.running),
            };
            [h.pools.display().to_string(), size(h.bytes), state, status]
        })
        .collect();
    let head = ["POOLS", "SIZE", "STATE", "STATUS"];
    let width = |i: usize| {
        (rows.iter().map(|r| r[i].len()))
            .chain([head[i].len()])
            .max()
            .unwrap_or(0)
    };
    let (w0, w1, w2) = (width(0), width(1), width(2));
    println!(
        "{:w0$}  {:>w1$}  {:w2$}  {}",
        head[0], head[1], head[2], head[3]
    );
    for r in &rows {
        println!("{:w0$}  {:>w1$}  {:w2$}  {}", r[0], r[1], r[2], r[3]);
    }
    let total: u64 = all.iter().map(|h| h.bytes).sum();
    println!(
        "{} file system(s), {} in pools; `orion destroy --pools DIR` removes one",
        all.len(),
        size(total)
    );
    Ok(())
}

fn size(b: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    match b as f64 {
        x if x >= GIB => format!("{:.1} GiB", x / GIB),
        x => format!("{:.0} MiB", x / MIB),
    }
}

#[derive(Args, Debug)]
pub struct DestroyArgs {
    /// The state directory of the file system (default: the default of `orion up`).
    #[arg(long, conflicts_with = "pools")]
    pub dir: Option<PathBuf>,
    /// Its pool directory instead (as `orion list` shows it).
    #[arg(long)]
    pub pools: Option<PathBuf>,
    /// Do not ask: destroy it.
    #[arg(long)]
    pub yes: bool,
}

/// The pool directory and state directory `a` names.
fn target(a: &DestroyArgs) -> Result<(PathBuf, Option<PathBuf>)> {
    if let Some(p) = &a.pools {
        let p = std::path::absolute(p)?;
        let state = owner_of(&p);
        return Ok((p, state));
    }
    let state = match &a.dir {
        Some(d) => d.clone(),
        None => crate::up::default_state_dir()?,
    };
    // As `orion up` named it: canonical if it exists (a removed one as written).
    let state = std::fs::canonicalize(&state).or_else(|_| std::path::absolute(&state))?;
    let recorded = std::fs::read(state.join(POOLS))
        .ok()
        .and_then(|b| serde_json::from_slice::<PoolsRecord>(&b).ok())
        .map(|r| r.pools);
    let pools = recorded.unwrap_or_else(|| crate::up::default_pool_dir(&state));
    Ok((pools, Some(state)))
}

pub fn destroy(a: DestroyArgs) -> Result<()> {
    let (pools, state) = target(&a)?;
    let state_dir = state.as_ref().filter(|s| s.is_dir());
    if !pools.is_dir() && state_dir.is_none() {
        bail!(
            "no file system at {}{}: `orion list` shows those on this host",
            pools.display(),
            state.map_or(String::new(), |s| format!(" (state {})", s.display()))
        );
    }
    if let Some(s) = state_dir {
        let live = running(s);
        if !live.is_empty() {
            bail!(
                "the file system of {} is running (daemons {live:?}): stop its `orion up` \
                 (Ctrl-C) first",
                s.display()
            );
        }
    }
    let bytes = allocated(&pools);
    let what = format!(
        "the file system in {} ({}){}",
        pools.display(),
        size(bytes),
        state_dir.map_or(String::new(), |s| format!(
            " and its state directory {}",
            s.display()
        ))
    );
    if !a.yes && !confirm(&format!("Destroy {what}? Every file in it is lost."))? {
        bail!("nothing destroyed");
    }
    if pools.is_dir() {
        remove_pools(&pools)?;
    }
    if let Some(s) = state_dir {
        remove_state(s)?;
    }
    let _locked = lock_register()?;
    let mut list = read_register();
    let before = list.len();
    list.retain(|p| p != &pools);
    if list.len() != before {
        write_register(&list)?;
    }
    println!("destroyed {what}");
    Ok(())
}

/// Asks on the terminal; without one, refuses (a script passes --yes).
fn confirm(question: &str) -> Result<bool> {
    if !std::io::stdin().is_terminal() {
        bail!("{question}\nrefusing without a terminal to ask on: pass --yes");
    }
    print!("{question} [y/N] ");
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}

/// Removes the files `orion up` made in a pool directory, then the directory if
/// nothing else is left in it.
fn remove_pools(dir: &Path) -> Result<()> {
    let mut others = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if ours(&name) && e.file_type()?.is_file() {
            std::fs::remove_file(e.path())
                .with_context(|| format!("removing {}", e.path().display()))?;
        } else {
            others.push(name);
        }
    }
    if others.is_empty() {
        std::fs::remove_dir(dir).with_context(|| format!("removing {}", dir.display()))?;
    } else {
        eprintln!(
            "orion destroy: kept {} (it holds files orion did not make: {})",
            dir.display(),
            others.join(", ")
        );
    }
    Ok(())
}

/// Removes a state directory, once it looks like one (a secret or a cluster record)
/// and its mount point is not mounted.
fn remove_state(dir: &Path) -> Result<()> {
    if !dir.join("secret").exists() && !UpState::path(dir).exists() {
        bail!(
            "{} has no secret and no cluster.json: not removing what may not be a state \
             directory of `orion up`",
            dir.display()
        );
    }
    let mnt = UpState::load(dir)
        .ok()
        .map(|u| PathBuf::from(u.mount))
        .filter(|m| !m.as_os_str().is_empty())
        .unwrap_or_else(|| dir.join("mnt"));
    if orion_fuse::unmount_stale(&mnt)? {
        eprintln!("orion destroy: removed a stale mount at {}", mnt.display());
    }
    std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_orion_makes_are_its_own() {
        for n in [
            "mds.pool",
            "ds0.pool.boot",
            "mds.members",
            "mds-mirror.ring",
            OWNER,
        ] {
            assert!(ours(n), "{n}");
        }
        for n in ["notes.txt", "pool", "mds.pool.bak"] {
            assert!(!ours(n), "{n}");
        }
    }

    #[test]
    fn an_orion_process_is_named_orion() {
        assert!(is_orion(b"/work/target/release/orion"));
        assert!(is_orion(b"orion"));
        assert!(!is_orion(b"/usr/bin/orionx"));
        assert!(!is_orion(b""));
    }

    #[test]
    fn sizes_read_as_people_read_them() {
        assert_eq!(size(3 << 30), "3.0 GiB");
        assert_eq!(size(268 << 20), "268 MiB");
        assert_eq!(size(0), "0 MiB");
    }
}
