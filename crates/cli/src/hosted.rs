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
/// In a pool directory: locked by the `orion up` that serves it, for its whole run.
const UP_LOCK: &str = "up.lock";

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

/// Opens (creating) a lock file.
fn lock_file(p: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(p)
        .with_context(|| format!("opening {}", p.display()))
}

/// flock(2) on `f`, exclusive; without waiting when `wait` is false. Whether it was
/// taken.
fn flock(f: &std::fs::File, wait: bool) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let op = libc::LOCK_EX | if wait { 0 } else { libc::LOCK_NB };
    // SAFETY: flock on a descriptor `f` keeps open.
    if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) if !wait => Ok(false),
        _ => Err(e),
    }
}

/// Holds the register for a read-modify-write (`orion up`s starting at once each
/// add their pools); released when dropped.
fn lock_register() -> Result<std::fs::File> {
    let p = register_path()?.with_extension("lock");
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let f = lock_file(&p)?;
    flock(&f, true).with_context(|| format!("locking {}", p.display()))?;
    Ok(f)
}

/// The lock an `orion up` holds on its pool directory while it runs (see [`hold`]).
pub struct PoolsHeld(#[allow(dead_code)] std::fs::File);

/// Takes the pool directory's lock for this `orion up` and the daemons it starts
/// (they inherit it, so it stays held while any of them lives): a second `orion up`
/// on the same pools, and `orion destroy`, find it taken.
pub fn hold(pools: &Path) -> Result<PoolsHeld> {
    use std::os::fd::AsRawFd;
    let p = pools.join(UP_LOCK);
    let f = lock_file(&p)?;
    if !flock(&f, false).with_context(|| format!("locking {}", p.display()))? {
        bail!(
            "the pools in {} are in use: another `orion up` (or a daemon it started) holds \
             {}; stop it first",
            pools.display(),
            p.display()
        );
    }
    // SAFETY: fcntl on a descriptor `f` keeps open: clears close-on-exec, so that the
    // daemons inherit the lock.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFD, 0) };
    Ok(PoolsHeld(f))
}

/// The pool directory's lock, taken for a destroy (held until dropped, so that no
/// `orion up` starts on the pools while they go); `None` if an `orion up` or its
/// daemons hold it.
fn take_for_destroy(pools: &Path) -> Result<Option<std::fs::File>> {
    let p = pools.join(UP_LOCK);
    let f = lock_file(&p)?;
    Ok(flock(&f, false)
        .with_context(|| format!("locking {}", p.display()))?
        .then_some(f))
}

/// `p` absolute, with its deepest existing ancestor canonical (symlinks and `..`
/// resolved where the path exists): how `orion up` named a state directory that may
/// have been removed since.
fn canonical(p: &Path) -> PathBuf {
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let mut rest = Vec::new();
    let mut cur = abs.as_path();
    loop {
        if let Ok(c) = std::fs::canonicalize(cur) {
            return rest.iter().rev().fold(c, |acc: PathBuf, r| acc.join(r));
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                cur = parent;
            }
            _ => return abs,
        }
    }
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
pub fn owner_of(pools: &Path) -> Option<PathBuf> {
    let b = std::fs::read(pools.join(OWNER)).ok()?;
    serde_json::from_slice::<Owner>(&b).ok().map(|o| o.state)
}

/// Whether `name` is a file `orion up` or its daemons make in a pool directory.
fn ours(name: &str) -> bool {
    name == OWNER
        || name == UP_LOCK
        || [".pool", ".boot", ".members", ".ring", ".copying", ".tmp"]
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

/// The state directory's record of its pools, if any.
fn pools_of(state: &Path) -> Option<PathBuf> {
    let b = std::fs::read(state.join(POOLS)).ok()?;
    serde_json::from_slice::<PoolsRecord>(&b)
        .ok()
        .map(|r| r.pools)
}

/// Whether `dir` is named as `orion up` names its default pool directories in
/// /dev/shm (those made before pool directories had an owner record).
fn default_named(dir: &Path) -> bool {
    // SAFETY: getuid only reads the process's credentials.
    let uid = unsafe { libc::getuid() };
    let prefix = format!("orion-{uid}-");
    dir.parent() == Some(Path::new("/dev/shm"))
        && dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            n.strip_prefix(&prefix)
                .is_some_and(|h| h.len() == 8 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        })
}

/// The pool directory and state directory `a` names, checked to belong together.
fn target(a: &DestroyArgs) -> Result<(PathBuf, Option<PathBuf>)> {
    if let Some(p) = &a.pools {
        let p = canonical(p);
        let state = owner_of(&p);
        if state.is_none() && p.is_dir() && !default_named(&p) {
            bail!(
                "{} has no {OWNER}: not a pool directory of `orion up` (nothing destroyed)",
                p.display()
            );
        }
        if let Some(s) = state.as_ref().filter(|s| s.is_dir()) {
            if let Some(q) = pools_of(s).filter(|q| canonical(q) != p) {
                bail!(
                    "{} keeps its pools in {} now: not removing it with {} (nothing \
                     destroyed)",
                    s.display(),
                    q.display(),
                    p.display()
                );
            }
        }
        return Ok((p, state));
    }
    let state = match &a.dir {
        Some(d) => d.clone(),
        None => crate::up::default_state_dir()?,
    };
    let state = canonical(&state);
    let pools = pools_of(&state).unwrap_or_else(|| crate::up::default_pool_dir(&state));
    if let Some(o) = owner_of(&pools).filter(|o| canonical(o) != state) {
        bail!(
            "the pools in {} belong to the file system of {}, not of {}: nothing destroyed",
            pools.display(),
            o.display(),
            state.display()
        );
    }
    Ok((pools, Some(state)))
}

/// Mount points at or under `dir` (from /proc/self/mountinfo).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_octal)
        .map(PathBuf::from)
        .filter(|m| m.starts_with(dir))
        .collect()
}

/// mountinfo's escapes ("\040" for a space) undone.
fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let digits = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], digits) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Checks that `dir` may go as a state directory of `orion up`: it says so (a record
/// of its pools, or its secret and cluster record), and nothing is mounted in it (a
/// stale mount of a dead mount process is detached first).
fn state_removable(dir: &Path) -> Result<()> {
    let looks =
        dir.join(POOLS).exists() || (dir.join("secret").exists() && UpState::path(dir).exists());
    if !looks {
        bail!(
            "{} has neither {POOLS} nor a secret and cluster.json: not removing what may \
             not be a state directory of `orion up` (nothing destroyed)",
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
    let mounted = mounts_under(dir);
    if !mounted.is_empty() {
        bail!(
            "something is mounted in {}: {} (unmount it first; nothing destroyed)",
            dir.display(),
            mounted
                .iter()
                .map(|m| m.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
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
    // Every check before anything goes.
    let live = state_dir.map(|s| running(s)).unwrap_or_default();
    let held = match pools.is_dir() {
        true => Some(take_for_destroy(&pools)?),
        false => None,
    };
    if matches!(held, Some(None)) || !live.is_empty() {
        bail!(
            "the file system in {} is running{}: stop its `orion up` (Ctrl-C) first",
            pools.display(),
            match live.is_empty() {
                true => String::new(),
                false => format!(" (daemons {live:?})"),
            }
        );
    }
    if let Some(s) = state_dir {
        state_removable(s)?;
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
        std::fs::remove_dir_all(s).with_context(|| format!("removing {}", s.display()))?;
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

/// Removes the files `orion up` made in a pool directory (its lock last: the caller
/// holds it), then the directory if nothing else is left in it.
fn remove_pools(dir: &Path) -> Result<()> {
    let mut others = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name == UP_LOCK {
            continue; // last: held until everything else is gone
        }
        if ours(&name) && e.file_type()?.is_file() {
            std::fs::remove_file(e.path())
                .with_context(|| format!("removing {}", e.path().display()))?;
        } else {
            others.push(name);
        }
    }
    let _ = std::fs::remove_file(dir.join(UP_LOCK));
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
    fn default_pool_directories_are_told_by_their_name() {
        // SAFETY: getuid only reads the process's credentials.
        let uid = unsafe { libc::getuid() };
        assert!(default_named(Path::new(&format!(
            "/dev/shm/orion-{uid}-0a1b2c3d"
        ))));
        assert!(!default_named(Path::new(&format!(
            "/tmp/orion-{uid}-0a1b2c3d"
        ))));
        assert!(!default_named(Path::new(&format!(
            "/dev/shm/orion-{uid}-0a1b"
        ))));
        assert!(!default_named(Path::new("/dev/shm/mine")));
    }

    #[test]
    fn a_removed_directory_is_named_through_its_existing_parent() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().canonicalize().unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(canonical(&link.join("gone/state")), real.join("gone/state"));
        assert_eq!(canonical(&link), real);
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_octal(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape_octal("/plain"), "/plain");
        assert_eq!(unescape_octal(r"/end\"), r"/end\");
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
