//! An etcd server of our own, for tests and for `orion up --etcd` on one host: Debian's
//! `etcd` binary (package `etcd-server`, which `scripts/setup` installs) on loopback
//! ports of its choosing, with its data in a directory of the caller. It is stopped by
//! its PID when dropped. Its timings are tuned for a cluster on one machine, so that a
//! lease of one second is honoured (etcd's shortest lease follows its election timeout).

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub struct EtcdServer {
    child: Child,
    /// "127.0.0.1:port", where clients connect.
    pub endpoint: String,
}

/// Two distinct ports free now on loopback (the kernel picks them; etcd binds them a
/// moment later).
fn free_ports() -> Result<(u16, u16)> {
    let (a, b) = (
        TcpListener::bind("127.0.0.1:0")?,
        TcpListener::bind("127.0.0.1:0")?,
    );
    Ok((a.local_addr()?.port(), b.local_addr()?.port()))
}

impl EtcdServer {
    /// Starts etcd with its data in `dir` and its log in `dir/etcd.log`, and waits until
    /// it answers.
    pub fn start(dir: &Path) -> Result<EtcdServer> {
        let (client, peer) = free_ports()?;
        let endpoint = format!("127.0.0.1:{client}");
        let log = std::fs::File::create(dir.join("etcd.log"))
            .with_context(|| format!("creating {}", dir.join("etcd.log").display()))?;
        let mut cmd = Command::new("etcd");
        cmd.arg("--name=orion")
            .arg(format!("--data-dir={}", dir.join("etcd").display()))
            .arg(format!("--listen-client-urls=http://{endpoint}"))
            .arg(format!("--advertise-client-urls=http://{endpoint}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!("--initial-cluster=orion=http://127.0.0.1:{peer}"))
            .arg("--heartbeat-interval=50")
            .arg("--election-timeout=500")
            .stdout(Stdio::null())
            .stderr(log);
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // prctl(2), which is async-signal-safe: etcd dies with the process that started
        // it, also when that process is killed and no Drop runs.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        let child = cmd
            .spawn()
            .context("starting etcd (install it with scripts/setup: Debian package etcd-server)")?;
        let mut s = EtcdServer { child, endpoint };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = s.child.try_wait()? {
                bail!(
                    "etcd exited at start ({status}): see {}",
                    dir.join("etcd.log").display()
                );
            }
            if std::net::TcpStream::connect(&s.endpoint).is_ok() {
                return Ok(s);
            }
            if Instant::now() > deadline {
                bail!("etcd did not listen on {} within 20 s", s.endpoint);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops it now (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}
