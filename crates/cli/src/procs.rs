//! Child `orion` processes (daemons and mounts) started by `orion up` and the
//! benchmarks: each prints one ready line, logs to a file, and is stopped by PID
//! (SIGTERM, then SIGKILL after a grace period) when dropped.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub struct Daemon {
    child: Child,
    pub name: String,
    /// Its stdout, line by line (read on a thread of its own).
    lines: mpsc::Receiver<String>,
    log: std::path::PathBuf,
    args: Vec<String>,
}

impl Daemon {
    /// Starts `orion ARGS`, its stderr going to `log`, and waits for its ready line
    /// (the first line on stdout), which it returns. The child gets its own process
    /// group, so a Ctrl-C in the terminal reaches only this process, which stops the
    /// children in order; it is also told to stop if this process dies.
    pub fn spawn(name: &str, args: &[String], log: &Path) -> Result<(Daemon, String)> {
        let mut d = Daemon::start(name, args, log)?;
        let line = d.wait_ready()?;
        Ok((d, line))
    }

    /// [`Daemon::spawn`] without waiting: an MDS that starts as a mirror prints its
    /// ready line only once it takes the primary role.
    pub fn start(name: &str, args: &[String], log: &Path) -> Result<Daemon> {
        let exe = std::env::current_exe().context("locating the orion binary")?;
        // Appended to: a daemon restarted by `orion up` keeps its earlier log.
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening the log {}", log.display()))?;
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env(crate::logs::LOG_FILE_ENV, log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err);
        crate::signals::detach_and_die_with_parent(&mut cmd);
        let fds = handed_fds(args);
        if !fds.is_empty() {
            use std::os::unix::process::CommandExt;
            // SAFETY: runs in the child between fork and exec, and calls only fcntl
            // (async-signal-safe) on descriptors this process holds open
            // (`HANDED_OVER`); nothing is allocated.
            unsafe {
                cmd.pre_exec(move || {
                    for &fd in &fds {
                        if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let out = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(Daemon {
            child,
            name: name.to_string(),
            lines,
            log: log.to_path_buf(),
            args: args.to_vec(),
        })
    }

    /// Waits for the ready line; an error (with the log) if the process ends first,
    /// or if this process was asked to stop meanwhile (`signals::stop_requested`).
    pub fn wait_ready(&mut self) -> Result<String> {
        let first = loop {
            match self.lines.recv_timeout(Duration::from_millis(50)) {
                Err(mpsc::RecvTimeoutError::Timeout) if crate::signals::stop_requested() => {
                    self.stop(Duration::from_secs(2));
                    bail!("interrupted while {} started", self.name);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Ok(line) => break Some(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => break None,
            }
        };
        match first {
            Some(line) if line.contains("ready") => Ok(line.trim_end().to_string()),
            _ => {
                self.stop(Duration::from_secs(2));
                let log_text = std::fs::read_to_string(&self.log).unwrap_or_default();
                bail!(
                    "{} did not start (orion {}):\n{}",
                    self.name,
                    self.args.join(" "),
                    log_text.trim_end()
                );
            }
        }
    }

    /// Its ready line, if it printed one since the last call.
    pub fn ready_now(&mut self) -> Option<String> {
        self.lines.try_iter().find(|l| l.contains("ready"))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the process has ended.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL at once (a crash, for tests and benchmarks), and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then SIGKILL if it is still running after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        crate::signals::terminate(self.child.id());
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::warn!(
            "{} (pid {}) ignored SIGTERM; killing it",
            self.name,
            self.pid()
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// The address in a daemon's ready line ("... listening on ADDR ...").
pub fn listen_addr(ready: &str) -> Option<String> {
    ready
        .split("listening on ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .map(str::to_string)
}

/// Where a daemon `orion up` starts serves its metrics.
pub struct MetricsSocket {
    /// The address, for `cluster.json` (named before the daemon says anything: a
    /// mirror says nothing until it takes over).
    pub addr: String,
    /// The daemon's `--metrics` argument: `fd:N`, the socket itself.
    pub arg: String,
}

/// Listening sockets handed to daemons: open in this process for its whole life, so
/// a daemon started again gets the same one, and no other process can take its port
/// in between.
static HANDED_OVER: std::sync::Mutex<Vec<std::net::TcpListener>> =
    std::sync::Mutex::new(Vec::new());

/// A loopback socket (a free port) for a daemon's metrics, bound here and passed on
/// by descriptor ([`Daemon::start`] keeps it open across the exec).
pub fn metrics_listen() -> Result<MetricsSocket> {
    use std::os::fd::AsRawFd;
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("a port for metrics")?;
    let s = MetricsSocket {
        addr: l.local_addr()?.to_string(),
        arg: format!("fd:{}", l.as_raw_fd()),
    };
    HANDED_OVER
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(l);
    Ok(s)
}

/// The descriptors `args` hands to the daemon (`--metrics fd:N`).
fn handed_fds(args: &[String]) -> Vec<i32> {
    (args.windows(2))
        .filter(|w| w[0] == "--metrics")
        .filter_map(|w| w[1].strip_prefix("fd:")?.parse().ok())
        .collect()
}

/// A free loopback port for an MDS, outside the range the kernel gives outgoing
/// connections (so it is still free when the MDS starts again), or `previous` when
/// it is still free; never one of `taken` (the other MDSs' ports, chosen before
/// any of them listens).
pub fn mds_port(previous: Option<u16>, taken: &[u16]) -> Result<u16> {
    if let Some(p) = previous.filter(|p| !taken.contains(p)) {
        if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return Ok(p);
        }
    }
    loop {
        let p = orion_fabric::service_port()?;
        if !taken.contains(&p) {
            return Ok(p);
        }
    }
}

/// `orion mds` arguments `args` set to listen at `addr` as the MDS `name` of `cluster`
/// under the cluster manager `manager` with a lease of `lease_ms`.
pub fn mds_role_args(
    mut args: Vec<String>,
    addr: &str,
    manager: &str,
    name: &str,
    cluster: &str,
    lease_ms: u64,
) -> Vec<String> {
    match args.iter().position(|a| a == "--listen") {
        Some(at) if at + 1 < args.len() => args[at + 1] = addr.to_string(),
        _ => args.extend(["--listen".into(), addr.to_string()]),
    }
    args.extend([
        "--manager".into(),
        manager.into(),
        "--name".into(),
        name.into(),
        "--cluster".into(),
        cluster.into(),
        "--lease-ms".into(),
        lease_ms.to_string(),
    ]);
    args
}

/// A cluster manager this process runs for the MDSs it starts (`orion up`, the
/// benchmarks): the embedded service in this process, or an etcd it started (stopped
/// by PID when dropped).
pub enum ManagerProc {
    Embedded(orion_manager::embedded::EmbeddedServer),
    Etcd(orion_manager::etcd_server::EtcdServer),
}

impl ManagerProc {
    /// Starts one of `kind` ("embedded" or "etcd") keeping its state in `dir`: the
    /// embedded service's file `manager.epoch`, or etcd's data in `etcd/`.
    pub fn start(kind: &str, dir: &Path) -> Result<ManagerProc> {
        match kind {
            "embedded" => Ok(ManagerProc::Embedded(
                orion_manager::embedded::EmbeddedServer::start(
                    "127.0.0.1:0",
                    &dir.join("manager.epoch"),
                )?,
            )),
            "etcd" => {
                let data = dir.join("etcd");
                std::fs::create_dir_all(&data)
                    .with_context(|| format!("creating {}", data.display()))?;
                Ok(ManagerProc::Etcd(
                    orion_manager::etcd_server::EtcdServer::start(&data)
                        .context("starting etcd (scripts/setup installs etcd-server)")?,
                ))
            }
            other => bail!("cluster manager {other:?}: expected embedded or etcd"),
        }
    }

    /// Where its state lives below `dir` (what [`ManagerProc::start`] keeps there).
    pub fn state_in(kind: &str, dir: &Path) -> std::path::PathBuf {
        match kind {
            "etcd" => dir.join("etcd"),
            _ => dir.join("manager.epoch"),
        }
    }

    /// The `--manager` setting of the MDSs.
    pub fn spec(&self) -> String {
        match self {
            ManagerProc::Embedded(s) => format!("embedded:{}", s.addr),
            ManagerProc::Etcd(s) => format!("etcd:{}", s.endpoint),
        }
    }
}
