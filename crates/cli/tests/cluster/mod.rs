//! A cluster of real processes for tests: an MDS and data stores started from the
//! `orion` binary on ephemeral loopback ports, with pools in a fresh /dev/shm
//! directory. Every process is killed by PID when the cluster is dropped, also when
//! the test fails.

#![allow(dead_code)]

pub mod netns;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use orion_client::{Client, ClientConfig};
use orion_fabric::{Backend, FabricConfig, Secret};

pub const ORION: &str = env!("CARGO_BIN_EXE_orion");
/// The backends multi-process tests run on: shared memory, and libfabric's tcp
/// provider on loopback (the code an RDMA cluster runs with verbs).
pub const BACKENDS: [&str; 2] = ["local", "libfabric"];

pub struct Daemon {
    pub child: Child,
    pub addr: String,
    pub log: PathBuf,
}

impl Daemon {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL and reap; then the shared-memory files it had no chance to remove
    /// (they hold RAM) go, with those of any other dead process.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        orion_fabric::local::sweep_dead_processes_files();
    }

    /// SIGTERM, then wait for a clean exit (SIGKILL after 10 s).
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        if let Ok(Some(s)) = self.child.try_wait() {
            return Some(s);
        }
        // SAFETY: kill(2) on the PID of a child we own and have not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        for _ in 0..1000 {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        None
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub backend: &'static str,
    pub secret: PathBuf,
    pub mds: Daemon,
    pub stores: Vec<Daemon>,
    /// Extra flags for the MDS.
    pub mds_flags: Vec<String>,
    /// Size of each data store's pool.
    pub ds_size: String,
}

/// Starts `orion <args>` and waits for its "ready" line; its stderr goes to `log`.
pub fn spawn(args: &[String], log: &Path) -> Result<Daemon, String> {
    spawn_as(None, args, log)
}

/// [`spawn`] as user and group `uid` (no supplementary groups), through setpriv.
pub fn spawn_as(uid: Option<u32>, args: &[String], log: &Path) -> Result<Daemon, String> {
    let cmd = match uid {
        None => Command::new(ORION),
        Some(u) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={u}"))
                .arg(format!("--regid={u}"))
                .arg("--clear-groups")
                .arg(ORION);
            c
        }
    };
    spawn_command(cmd, args, log)
}

/// [`spawn`] inside network namespace `netns` (`ip netns exec` execs the program, so
/// the PID is the daemon's).
pub fn spawn_in(netns: &str, args: &[String], log: &Path) -> Result<Daemon, String> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns, ORION]);
    spawn_command(cmd, args, log)
}

/// Starts `orion <args>` without waiting for a "ready" line (an MDS that starts as a
/// mirror prints none until it takes over); its stderr goes to `log`.
pub fn spawn_command_unready(args: &[String], log: &Path) -> Daemon {
    spawn_unready_in(None, args, log)
}

/// [`spawn_command_unready`] inside network namespace `netns`, if given.
pub fn spawn_unready_in(netns: Option<&str>, args: &[String], log: &Path) -> Daemon {
    let err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, ORION]);
            c
        }
        None => Command::new(ORION),
    };
    let child = cmd
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("spawning orion");
    Daemon {
        child,
        addr: String::new(),
        log: log.to_path_buf(),
    }
}

fn spawn_command(mut cmd: Command, args: &[String], log: &Path) -> Result<Daemon, String> {
    // Appended to: a daemon started again on the same log keeps the first one's lines.
    let err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut child = cmd
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .map_err(|e| format!("spawning orion: {e}"))?;
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.contains(" ready: ") {
                let _ = tx.send(line);
            }
        }
    });
    let mut d = Daemon {
        child,
        addr: String::new(),
        log: log.to_path_buf(),
    };
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(line) => {
            d.addr = line
                .split("listening on ")
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
                .unwrap_or_default()
                .to_string();
            Ok(d)
        }
        Err(_) => {
            d.kill();
            Err(format!(
                "orion {} did not become ready:\n{}",
                args.join(" "),
                d.log_text()
            ))
        }
    }
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

impl Cluster {
    /// An MDS and `stores` data stores (groups 0, 1, ...).
    pub fn start(backend: &'static str, stores: usize) -> Cluster {
        Self::start_sized(backend, stores, "64M")
    }

    /// As `start`, with data store pools of `ds_size` each.
    pub fn start_sized(backend: &'static str, stores: usize, ds_size: &str) -> Cluster {
        Self::start_full(backend, stores, ds_size, &[])
    }

    /// As `start`, with extra flags for the MDS (kept across its restarts).
    pub fn start_with_mds(backend: &'static str, stores: usize, mds_flags: &[&str]) -> Cluster {
        Self::start_full(backend, stores, "64M", mds_flags)
    }

    fn start_full(
        backend: &'static str,
        stores: usize,
        ds_size: &str,
        mds_flags: &[&str],
    ) -> Cluster {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, Secret::generate().expose()).unwrap();
        let args = Self::mds_args(dir.path(), backend, &secret, "127.0.0.1:0", true);
        let args = with_flags(args, &s(mds_flags));
        let mds = spawn(&args, &dir.path().join("mds.log")).unwrap_or_else(|e| panic!("{e}"));
        let mut c = Cluster {
            dir,
            backend,
            secret,
            mds,
            stores: Vec::new(),
            mds_flags: s(mds_flags),
            ds_size: ds_size.to_string(),
        };
        for g in 0..stores {
            c.add_store(g as u16);
        }
        c
    }

    fn mds_args(
        dir: &Path,
        backend: &str,
        secret: &Path,
        listen: &str,
        format: bool,
    ) -> Vec<String> {
        let mut a = s(&[
            "mds",
            "--pool-size",
            "64M",
            "--backend",
            backend,
            "--listen",
            listen,
        ]);
        a.extend(["--pool".into(), dir.join("mds.pool").display().to_string()]);
        a.extend(["--secret-file".into(), secret.display().to_string()]);
        if format {
            a.push("--format".into());
        }
        a
    }

    pub fn common_flags(&self) -> Vec<String> {
        vec![
            "--backend".into(),
            self.backend.into(),
            "--secret-file".into(),
            self.secret.display().to_string(),
        ]
    }

    pub fn add_store(&mut self, group: u16) {
        let pool = self.dir.path().join(format!("ds{group}.pool"));
        let mut a = s(&[
            "ds",
            "--format",
            "--pool-size",
            &self.ds_size,
            "--listen",
            "127.0.0.1:0",
        ]);
        a.extend(["--group".into(), group.to_string()]);
        a.extend(["--pool".into(), pool.display().to_string()]);
        a.extend(["--mds".into(), self.mds.addr.clone()]);
        a.extend(self.common_flags());
        let log = self.dir.path().join(format!("ds{group}.log"));
        let d = spawn(&a, &log).unwrap_or_else(|e| panic!("{e}"));
        self.stores.push(d);
    }

    /// Kills the MDS (SIGKILL) and starts it again on the same port and pool.
    pub fn restart_mds(&mut self) {
        self.mds.kill();
        let args = Self::mds_args(
            self.dir.path(),
            self.backend,
            &self.secret,
            &self.mds.addr,
            false,
        );
        let args = with_flags(args, &self.mds_flags);
        let log = self.dir.path().join("mds-restarted.log");
        let mut last = String::new();
        for _ in 0..50 {
            match spawn(&args, &log) {
                Ok(d) => {
                    self.mds = d;
                    return;
                }
                // The port may linger for an instant after the kill.
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the MDS did not restart: {last}");
    }

    pub fn fabric(&self) -> FabricConfig {
        let backend = match self.backend {
            "local" => Backend::Local,
            _ => Backend::Libfabric,
        };
        let mut f = FabricConfig::new(backend, Secret::from_file(&self.secret).unwrap());
        f.connect_timeout = Duration::from_secs(10);
        f
    }

    pub fn client_config(&self, strong: bool, internal: bool) -> ClientConfig {
        ClientConfig {
            mds: self.mds.addr.clone(),
            consistency: if strong { "strong" } else { "weak" }.into(),
            internal,
            cache_mib: 16,
            ..ClientConfig::default()
        }
    }

    pub fn client(&self, strong: bool, internal: bool) -> Client {
        Client::connect(self.client_config(strong, internal), self.fabric())
            .unwrap_or_else(|e| panic!("client: {e}\nMDS log:\n{}", self.mds.log_text()))
    }

    /// Runs `orion fs <args>` as another client process.
    pub fn fs(&self, args: &[&str]) -> Output {
        let mut a = s(&["fs", "--mds", &self.mds.addr]);
        a.extend(self.common_flags());
        a.extend(s(args));
        Command::new(ORION)
            .args(&a)
            .env("RUST_LOG", "warn")
            .output()
            .expect("running orion fs")
    }

    pub fn fs_ok(&self, args: &[&str]) -> String {
        let o = self.fs(args);
        assert!(
            o.status.success(),
            "orion fs {args:?} failed: {}\nMDS log:\n{}",
            String::from_utf8_lossy(&o.stderr),
            self.mds.log_text()
        );
        String::from_utf8(o.stdout).unwrap()
    }

    /// Mounts the file system at a new directory under the cluster's (`orion mount`
    /// as a child process; unmounted when the `Mount` is dropped).
    pub fn mount(&self, name: &str, extra: &[&str]) -> Mount {
        let path = self.dir.path().join(name);
        // A stale mount (its server killed) is cleaned up by `orion mount` itself.
        if !is_mounted(&path) {
            std::fs::create_dir_all(&path).unwrap();
        }
        let mut a = s(&["mount", path.to_str().unwrap(), "--mds", &self.mds.addr]);
        a.extend(self.common_flags());
        a.extend(s(extra));
        let log = self.dir.path().join(format!("{name}.log"));
        let daemon = spawn(&a, &log).unwrap_or_else(|e| panic!("{e}"));
        Mount { daemon, path }
    }

    /// A mount made by user `uid` (through fusermount3), on a mount point and with a
    /// copy of the secret that the user owns. Err with the mount's log if it fails.
    pub fn mount_as(&self, name: &str, uid: u32) -> Result<Mount, String> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        std::os::unix::fs::chown(&path, Some(uid), Some(uid)).unwrap();
        let secret = self.dir.path().join(format!("secret-{uid}"));
        std::fs::copy(&self.secret, &secret).unwrap();
        std::os::unix::fs::chown(&secret, Some(uid), Some(uid)).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut a = s(&["mount", path.to_str().unwrap(), "--mds", &self.mds.addr]);
        a.extend(s(&["--backend", self.backend, "--secret-file"]));
        a.push(secret.display().to_string());
        let log = self.dir.path().join(format!("{name}.log"));
        let daemon = spawn_as(Some(uid), &a, &log)?;
        Ok(Mount { daemon, path })
    }
}

/// A FUSE mount served by an `orion mount` child.
pub struct Mount {
    pub daemon: Daemon,
    pub path: PathBuf,
}

pub fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let p = path.to_str().unwrap();
    mounts.lines().any(|l| l.split(' ').nth(1) == Some(p))
}

impl Drop for Mount {
    fn drop(&mut self) {
        // SIGTERM unmounts; a mount left behind (the server was killed) is detached.
        self.daemon.terminate();
        if is_mounted(&self.path) {
            let _ = Command::new(ORION)
                .args(["umount", self.path.to_str().unwrap()])
                .output();
        }
    }
}

/// Runs `script` with `sh -c` in `dir` as nobody (uid and gid 65534, no groups):
/// whether it succeeded, and what it said on stderr.
pub fn as_nobody(dir: &Path, script: &str) -> (bool, String) {
    let o = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
        ])
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Runs `f` while mount `m`'s daemon is stopped: Some only if the kernel answered
/// by itself (no request reached the daemon). The daemon runs again before this
/// returns either way.
pub fn with_daemon_stopped<T: Send + 'static>(
    m: &Mount,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let pid = m.daemon.pid() as i32;
    stop_process(pid);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    let r = rx.recv_timeout(std::time::Duration::from_secs(3));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    r.ok()
}

pub fn stat_with_daemon_stopped(m: &Mount, path: &Path) -> Option<std::fs::Metadata> {
    let p = path.to_path_buf();
    with_daemon_stopped(m, move || std::fs::metadata(p).unwrap())
}

/// SIGSTOP to a child process this test started, returning once every thread of it
/// has stopped: kill returns before, and a thread that was running (a poller) could
/// still answer a request meanwhile.
pub fn stop_process(pid: i32) {
    // SAFETY: a signal to a child process the test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let stopped = || {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return true;
        };
        tasks.flatten().all(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            let state = stat.rsplit(") ").next().and_then(|s| s.chars().next());
            matches!(state, Some('T' | 't') | None)
        })
    };
    while !stopped() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A running `orion up` of a test's own (state, pools and the register of file
/// systems in directories the test gives). [`Up::stop`] interrupts it (SIGINT, by PID)
/// and waits for it to stop its daemons in order and unmount; dropped without a stop
/// (a failing test), it gets SIGINT, then SIGKILL after 10 s, and its mount is cleaned
/// up.
pub struct Up {
    child: Child,
    /// Where it mounted the file system.
    pub mnt: PathBuf,
    /// What it printed before it was ready (a row per process, with its pid).
    rows: Vec<String>,
}

impl Up {
    /// Runs `orion up --mds-size 64M --ds-size 64M EXTRA --dir STATE --pools POOLS`
    /// with the register in `data`, and returns once it says it is ready.
    pub fn start(state: &Path, pools: &Path, data: &Path, extra: &[&str]) -> Up {
        let mut child = Command::new(ORION)
            .env("XDG_DATA_HOME", data)
            .args(["up", "--mds-size", "64M", "--ds-size", "64M"])
            .args(extra)
            .arg("--dir")
            .arg(state)
            .arg("--pools")
            .arg(pools)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut rows = Vec::new();
        for line in out.lines().map_while(Result::ok) {
            let ready = line.starts_with("orion up ready");
            rows.push(line);
            if ready {
                let mnt = state.join("mnt");
                return Up { child, mnt, rows };
            }
        }
        let _ = child.kill();
        let o = child.wait_with_output().unwrap();
        panic!(
            "orion up did not become ready: {rows:?}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// The pid of the process whose row starts with `name` (e.g. "ds 0.1").
    pub fn pid(&self, name: &str) -> i32 {
        let row = (self.rows.iter())
            .find(|r| r.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no row for {name}: {:?}", self.rows));
        let after = row.split("pid").nth(1).expect("a pid");
        after.split_whitespace().next().unwrap().parse().unwrap()
    }

    /// Stops it as Ctrl-C does and waits; what it said on stderr (it must succeed).
    /// Every process it stopped cleaned up its shared-memory files (they hold RAM).
    pub fn stop(mut self) -> String {
        // Its processes now: those it started first, and those it started again
        // (their pids are in its record).
        let record: serde_json::Value = (self.mnt.parent())
            .and_then(|s| std::fs::read(s.join("cluster.json")).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let recorded = ["mdss", "stores"].into_iter().flat_map(|k| {
            (record[k]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter())
            .filter_map(|p| p["pid"].as_i64().map(|p| p as i32))
        });
        let every: Vec<i32> = (self.rows.iter())
            .filter_map(|r| {
                r.split(" pid ")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .chain(recorded)
            .filter(|&pid| pid > 0)
            .collect();
        // SAFETY: kill(2) with signal 0 only checks that the process exists.
        let alive = |pid: &i32| unsafe { libc::kill(*pid, 0) } == 0;
        let live: Vec<i32> = every.iter().copied().filter(alive).collect();
        // Those a test killed had no chance to remove their files.
        orion_fabric::local::sweep_dead_processes_files();
        assert!(!live.is_empty(), "no pids in {:?}", self.rows);
        // SAFETY: kill(2) on our child's PID.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let o = std::mem::replace(&mut self.child, Command::new("true").spawn().unwrap())
            .wait_with_output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "orion up failed: {err}");
        let left: Vec<String> = std::fs::read_dir("/dev/shm")
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| {
                let pid = n
                    .strip_prefix("orion-fabric.")
                    .and_then(|r| r.split('.').next());
                pid.and_then(|p| p.parse::<i32>().ok())
                    .is_some_and(|p| live.contains(&p))
            })
            .collect();
        assert!(
            left.is_empty(),
            "left in /dev/shm by a stopped process: {left:?} ({:?})",
            self.rows
        );
        err
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our child's PID.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if is_mounted(&self.mnt) {
            let _ = Command::new(ORION).arg("umount").arg(&self.mnt).output();
        }
    }
}

/// The errno of a failed call (0: it succeeded, or failed without one).
pub fn errno_of(r: std::io::Result<impl Sized>) -> i32 {
    r.err().and_then(|e| e.raw_os_error()).unwrap_or(0)
}

/// Waits up to 10 s for `f` to hold.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if f() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("{what}: not within 10 s");
}

/// The MDS's arguments with `flags` added; a `--pool-size` among them replaces the
/// default one.
fn with_flags(mut args: Vec<String>, flags: &[String]) -> Vec<String> {
    if flags.iter().any(|f| f == "--pool-size") {
        if let Some(at) = args.iter().position(|a| a == "--pool-size") {
            args.drain(at..at + 2);
        }
    }
    args.extend(flags.iter().cloned());
    args
}
