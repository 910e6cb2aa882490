//! The primary role through a cluster manager, with real MDS processes: a second MDS of
//! the cluster mirrors the primary instead of serving; `kill -STOP` of the primary (alive
//! but silent) lets its lease lapse and the waiting MDS takes the role under the next
//! epoch; after `kill -CONT` the old primary sees its term over, acknowledges nothing
//! more, and becomes the mirror of the new one. The embedded manager runs in this
//! test's process.

mod cluster;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cluster::ORION;
use orion_manager::embedded::{EmbeddedManager, EmbeddedServer};
use orion_manager::Manager;

/// An MDS process, killed when dropped; `ready` gets its "ready" line.
struct Mds {
    child: Child,
    ready: mpsc::Receiver<String>,
}

impl Drop for Mds {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our child's PID (it may be stopped: continue it first).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGCONT) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `format`: a new pool (the first primary); else the MDS starts as a mirror.
fn start_mds(dir: &Path, name: &str, manager: &str, format: bool) -> Mds {
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "[fabric]\nbackend = \"local\"\nsecret_file = \"{}\"\n\n[mds]\nmanager = \"{manager}\"\n\
             name = \"{name}\"\ncluster = \"t\"\nlease_ms = 3000\n",
            dir.join("secret").display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let mut child = Command::new(ORION)
        .args(["mds", "--pool-size", "64M", "--listen", "127.0.0.1:0"])
        .args(format.then_some("--format"))
        .arg("--config")
        .arg(&cfg)
        .arg("--pool")
        .arg(dir.join(format!("{name}.pool")))
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, ready) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.contains(" ready: ") {
                let _ = tx.send(line);
            }
        }
    });
    Mds { child, ready }
}

fn log(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
}

#[test]
fn a_second_mds_waits_for_the_role_and_a_silent_primary_is_replaced_and_fenced() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    std::fs::write(
        dir.path().join("secret"),
        orion_fabric::Secret::generate().expose(),
    )
    .unwrap();
    let server = EmbeddedServer::start("127.0.0.1:0", &dir.path().join("epoch")).unwrap();
    let manager = format!("embedded:{}", server.addr);
    let mut a = start_mds(dir.path(), "mds-a", &manager, true);
    a.ready
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("mds-a never served:\n{}", log(dir.path(), "mds-a")));
    let mut m = EmbeddedManager::connect(&server.addr, Duration::from_secs(5)).unwrap();
    let p = m.primary().unwrap().expect("a primary");
    assert_eq!((p.name.as_str(), p.epoch), ("mds-a", 1));

    // A second MDS of the cluster waits: it does not serve while mds-a holds the role,
    // but mirrors it.
    let b = start_mds(dir.path(), "mds-b", &manager, false);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log(dir.path(), "mds-b").contains("waiting for the primary role: mds-a") {
        assert!(
            Instant::now() < deadline,
            "mds-b:\n{}",
            log(dir.path(), "mds-b")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log(dir.path(), "mds-a").contains("mirror mds-b is in sync") {
        assert!(
            Instant::now() < deadline,
            "mds-a:\n{}",
            log(dir.path(), "mds-a")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        b.ready.recv_timeout(Duration::from_secs(1)).is_err(),
        "mds-b served beside a primary"
    );

    // mds-a stops answering (alive, silent): its lease lapses, mds-b takes the role.
    // SAFETY: kill(2) on our child's PID.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGSTOP) };
    let t0 = Instant::now();
    b.ready
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("mds-b never took over:\n{}", log(dir.path(), "mds-b")));
    println!("mds-b served {:?} after mds-a stopped", t0.elapsed());
    let p = m.primary().unwrap().expect("a primary");
    assert_eq!((p.name.as_str(), p.epoch), ("mds-b", 2));

    // mds-a resumes: its term is over; it acknowledges nothing more and becomes the
    // mirror of mds-b.
    // SAFETY: kill(2) on our child's PID.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGCONT) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log(dir.path(), "mds-b").contains("mirror mds-a is in sync") {
        assert!(
            Instant::now() < deadline,
            "mds-a never mirrored mds-b:\nmds-a:\n{}\nmds-b:\n{}",
            log(dir.path(), "mds-a"),
            log(dir.path(), "mds-b")
        );
        assert!(a.child.try_wait().unwrap().is_none(), "mds-a exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        log(dir.path(), "mds-a").contains("lost the primary role (epoch 1"),
        "{}",
        log(dir.path(), "mds-a")
    );
    assert_eq!(m.primary().unwrap().map(|p| p.epoch), Some(2));
}
