//! The fabric across processes: an echo peer in another process (probed, then killed with
//! SIGKILL), the verbs provider path, and libfabric tcp between two network namespaces that
//! the test creates and removes. Every child is killed by PID and every namespace deleted,
//! also when an assertion fails.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use orion_fabric::echo::{probe, Session, DEPTH};
use orion_fabric::{Backend, Domain, Error, FabricConfig, OpKind, Secret};

const SECRET: &[u8] = b"peers-test-cluster-secret";

struct Peer {
    child: Child,
    addr: String,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn secret_file(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let p = dir.path().join("secret");
    std::fs::write(&p, SECRET).unwrap();
    p
}

/// Starts `fabric-peer --listen` (optionally inside a network namespace) and waits for its
/// address.
fn spawn_peer(netns: Option<&str>, backend: &str, address: &str, secret: &std::path::Path) -> Peer {
    let exe = env!("CARGO_BIN_EXE_fabric-peer");
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, exe]);
            c
        }
        None => Command::new(exe),
    };
    cmd.args(["--backend", backend, "--address", address, "--secret-file"])
        .arg(secret)
        .args(["--listen", &format!("{address}:0")]);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning fabric-peer");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.trim().strip_prefix("listening ").unwrap_or_else(|| {
        let _ = child.kill();
        panic!("fabric-peer did not start: {line:?}")
    });
    Peer {
        addr: addr.to_string(),
        child,
    }
}

fn domain(backend: Backend) -> Domain {
    Domain::open(FabricConfig::new(
        backend,
        Secret::from_bytes(SECRET).unwrap(),
    ))
    .unwrap()
}

fn probe_and_kill(backend: Backend, name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut peer = spawn_peer(None, name, "127.0.0.1", &secret_file(&dir));
    let d = domain(backend);
    let report = probe(&d, &peer.addr).unwrap();
    assert!(report.contains("ok"), "{report}");

    // A session with all its receives posted, then the peer dies without a word.
    let s = Session::connect(&d, &peer.addr, 4096).unwrap();
    assert_eq!(s.round_trip(64).unwrap(), 64);
    peer.child.kill().unwrap();
    peer.child.wait().unwrap();
    let mut out = Vec::new();
    let mut flushed = 0;
    while flushed < DEPTH {
        out.clear();
        s.cq.wait(&mut out, 64, Duration::from_secs(10))
            .expect("posted receives were not flushed after the peer died");
        for c in &out {
            if c.kind == OpKind::Recv {
                assert!(matches!(c.status, Err(Error::PeerGone { .. })), "{c:?}");
                flushed += 1;
            }
        }
    }
    assert!(!s.conn.is_alive());
    assert!(s
        .conn
        .post_send(1, &s.buf, 0, 8)
        .is_err_and(|e| e.is_fatal_to_connection()));
    // The dead peer could not remove its shared-memory files; the next local domain does.
    let dead = format!("orion-fabric.{}.", peer.child.id());
    let _ = domain(Backend::Local);
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&dead))
        .collect();
    assert!(left.is_empty(), "files of the dead peer remain: {left:?}");
}

#[test]
fn local_peer_process_is_probed_and_its_death_flushes_receives() {
    probe_and_kill(Backend::Local, "local");
}

/// RDMA's rule on the local backend too: a one-sided write into the memory of a
/// process that ended fails (its shared file would take the bytes, and a successor may
/// already have read that file) and breaks the connection, even before the connection
/// noticed the death otherwise.
#[test]
fn a_one_sided_write_into_a_local_peer_that_ended_fails() {
    let dir = tempfile::tempdir().unwrap();
    let mut peer = spawn_peer(None, "local", "127.0.0.1", &secret_file(&dir));
    let d = domain(Backend::Local);
    let s = Session::connect(&d, &peer.addr, 4096).unwrap();
    s.write(0, 64).unwrap();
    s.read(0, 64).unwrap();
    peer.child.kill().unwrap();
    peer.child.wait().unwrap();
    let e = s
        .write(0, 64)
        .expect_err("a one-sided write into a dead process completed");
    assert!(matches!(e, Error::PeerGone { .. }), "{e}");
    assert!(!s.conn.is_alive());
    assert!(s.read(0, 64).is_err());
}

#[test]
fn libfabric_peer_process_is_probed_and_its_death_flushes_receives() {
    probe_and_kill(Backend::Libfabric, "libfabric");
}

#[test]
fn verbs_provider_is_selected_by_configuration_and_reports_no_device() {
    let mut cfg = FabricConfig::new(Backend::Libfabric, Secret::from_bytes(SECRET).unwrap());
    cfg.provider = "verbs;ofi_rxm".into();
    match Domain::open(cfg) {
        Err(Error::NoDevice { provider, detail }) => {
            assert_eq!(provider, "verbs;ofi_rxm");
            assert!(detail.contains("RDMA device"), "{detail}");
        }
        Err(e) => panic!("expected NoDevice, got {e}"),
        // A host with an RDMA device: then the provider must really be verbs.
        Ok(d) => assert!(d.describe().contains("verbs"), "{}", d.describe()),
    }
}

/// Two network namespaces joined by a veth pair; deleted on drop.
struct Netns {
    names: [String; 2],
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("running ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Netns {
    fn create() -> Netns {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "this test creates network namespaces: run it as root (CAP_NET_ADMIN)"
        );
        let tag = format!("{:x}", std::process::id());
        let n = Netns {
            names: [format!("orion-fa-{tag}"), format!("orion-fb-{tag}")],
        };
        let (a, b) = (&n.names[0], &n.names[1]);
        let (va, vb) = (format!("ofa{tag}"), format!("ofb{tag}"));
        ip(&["netns", "add", a]);
        ip(&["netns", "add", b]);
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
        ip(&["link", "set", &va, "netns", a]);
        ip(&["link", "set", &vb, "netns", b]);
        ip(&["-n", a, "addr", "add", "10.77.0.1/24", "dev", &va]);
        ip(&["-n", b, "addr", "add", "10.77.0.2/24", "dev", &vb]);
        for (ns, dev) in [(a, &va), (b, &vb)] {
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        n
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

#[test]
fn libfabric_tcp_between_two_network_namespaces() {
    let ns = Netns::create();
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(&dir);
    let peer = spawn_peer(Some(&ns.names[0]), "libfabric", "10.77.0.1", &secret);
    assert!(peer.addr.starts_with("10.77.0.1:"), "{}", peer.addr);
    let exe = env!("CARGO_BIN_EXE_fabric-peer");
    let mut prober = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.names[1],
            exe,
            "--backend",
            "libfabric",
            "--address",
            "10.77.0.2",
            "--secret-file",
        ])
        .arg(&secret)
        .args(["--probe", &peer.addr])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = prober.id();
    // The probe has its own timeouts; this guards against a hang all the same.
    let waited = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        // SAFETY: kill(2) with a PID we spawned; harmless if it already exited.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    });
    let status = prober.wait().unwrap();
    drop(waited);
    let mut stdout = String::new();
    let mut stderr = String::new();
    use std::io::Read;
    prober
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    prober
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    println!("{stdout}");
    assert!(
        status.success(),
        "probe from the second namespace failed: {stderr}"
    );
    assert!(
        stdout.contains("10.77.0.1") && stdout.contains(": ok"),
        "{stdout}"
    );
    drop(peer);
}
