//! A mirrored cluster spread over network namespaces that this test creates, one per
//! host, over libfabric's tcp provider: the embedded cluster manager (`orion manager`),
//! a primary MDS and its mirror, four data stores in two groups of two, and two client
//! hosts, each running `orion mds|ds|manager|fs --config` as a real deployment would.
//! Two client programs write files while the primary is killed (`kill -9`: the mirror
//! takes over at once), the old primary comes back as the mirror, and then the new
//! primary is cut off by taking its link down (its mirror takes over when its lease
//! lapses). No write fails, and every file reads back. Through the second fail-over
//! a mount on a client host, stopped meanwhile, holds open a file the other host
//! unlinks: the new primary keeps the file until the mount is back (design note 62),
//! and the mount, continued, finds its primary silent within seconds, not at its
//! call timeout (design note 65).

mod cluster;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use cluster::netns::{orion_on, Network};
use cluster::{spawn_in, spawn_unready_in, Daemon};
use orion_fabric::Secret;

const MANAGER: (&str, &str) = ("k", "10.79.0.2");
const MDS_A: (&str, &str) = ("ma", "10.79.0.1");
const MDS_B: (&str, &str) = ("mb", "10.79.0.3");
const STORES: [(&str, &str); 4] = [
    ("s00", "10.79.0.10"),
    ("s01", "10.79.0.11"),
    ("s10", "10.79.0.12"),
    ("s11", "10.79.0.13"),
];
const CLIENTS: [(&str, &str); 2] = [("c0", "10.79.0.20"), ("c1", "10.79.0.21")];
const PORT: u16 = 7410;
/// What the mount's held file holds.
const HELD: &[u8] = b"held open through a silent fail-over";

/// Fields drop in order: daemons, then namespaces, then pools.
struct Hosts {
    /// mds-a, mds-b (restarted while client threads borrow the hosts).
    mds: std::sync::Mutex<[Option<Daemon>; 2]>,
    stores: Vec<Daemon>,
    _manager: Daemon,
    net: Network,
    dir: tempfile::TempDir,
}

fn mds_list() -> String {
    format!("{}:{PORT},{}:{PORT}", MDS_A.1, MDS_B.1)
}

impl Hosts {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The config of `host`: its fabric address, the MDSs, the manager.
    fn config(dir: &Path, host: &str, addr: &str) -> PathBuf {
        let path = dir.join(format!("{host}.toml"));
        let text = format!(
            "[fabric]\nbackend = \"libfabric\"\nprovider = \"tcp;ofi_rxm\"\naddress = \"{addr}\"\n\
             secret_file = \"{}\"\nconnect_timeout_ms = 60000\n\n[client]\nmds = \"{}\"\ninternal = false\nop_timeout_ms = 5000\n\n[ds]\n\
             mds = \"{}\"\n\n[mds]\nmanager = \"embedded:{}:7400\"\ncluster = \"t\"\n\
             replicas = 2\nlease_ms = 1000\n",
            dir.join("secret").display(),
            mds_list(),
            mds_list(),
            MANAGER.1
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    fn start() -> Hosts {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        std::fs::write(dir.path().join("secret"), Secret::generate().expose()).unwrap();
        let mut hosts = vec![MANAGER, MDS_A, MDS_B];
        hosts.extend(STORES);
        hosts.extend(CLIENTS);
        let net = Network::create(&hosts);
        for (h, a) in &hosts {
            Self::config(dir.path(), h, a);
        }
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
        let root = dir.path().to_path_buf();
        let p = |n: &str| root.join(n).display().to_string();
        let manager = spawn_in(
            &net.ns(MANAGER.0),
            &s(&[
                "manager",
                "--listen",
                &format!("{}:7400", MANAGER.1),
                "--dir",
                &p("k"),
            ]),
            &dir.path().join("manager.log"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut h = Hosts {
            mds: std::sync::Mutex::new([None, None]),
            stores: Vec::new(),
            _manager: manager,
            net,
            dir,
        };
        h.start_mds(0, true);
        h.wait_log("mds-a.log", "mds-a is the primary (epoch 1", 30);
        h.start_mds(1, false);
        h.wait_log("mds-a.log", "mirror mds-b is in sync", 60);
        for (k, (host, addr)) in STORES.iter().enumerate() {
            let (g, i) = (k / 2, k % 2);
            let args = s(&[
                "ds",
                "--config",
                &p(&format!("{host}.toml")),
                "--format",
                "--pool",
                &p(&format!("ds{g}.r{i}.pool")),
                "--pool-size",
                "64M",
                "--group",
                &g.to_string(),
                "--index",
                &i.to_string(),
                "--listen",
                &format!("{addr}:0"),
            ]);
            let log = h.path(&format!("ds{g}.{i}.log"));
            let d = spawn_in(&h.net.ns(host), &args, &log).unwrap_or_else(|e| panic!("{e}"));
            h.stores.push(d);
        }
        h
    }

    /// Starts MDS `k` (0: mds-a, 1: mds-b) on its host; `format`: a new cluster.
    fn start_mds(&self, k: usize, format: bool) {
        let ((host, addr), name) = [(MDS_A, "mds-a"), (MDS_B, "mds-b")][k];
        let mut args: Vec<String> = vec![
            "mds".into(),
            "--config".into(),
            self.path(&format!("{host}.toml")).display().to_string(),
            "--pool".into(),
            self.path(&format!("{name}.pool")).display().to_string(),
            "--pool-size".into(),
            "64M".into(),
            "--listen".into(),
            format!("{addr}:{PORT}"),
            "--name".into(),
            name.into(),
        ];
        if format {
            args.push("--format".into());
        }
        let log = self.path(&format!("{name}.log"));
        let d = spawn_unready_in(Some(&self.net.ns(host)), &args, &log);
        self.mds.lock().unwrap()[k] = Some(d);
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    fn wait_log(&self, name: &str, what: &str, secs: u64) {
        let t0 = Instant::now();
        while !self.log(name).contains(what) {
            assert!(
                t0.elapsed() < Duration::from_secs(secs),
                "{name} never said {what:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn logs(&self) -> String {
        [
            "manager.log",
            "mds-a.log",
            "mds-b.log",
            "ds0.0.log",
            "ds1.0.log",
            "mount-c0.log",
        ]
        .iter()
        .map(|f| {
            let text = self.log(f);
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("--- {f} (last lines)\n{}", tail.join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
    }

    /// `orion <args>` on client host `c`, with `stdin`; killed after 120 s.
    fn client(&self, c: usize, args: &[&str], stdin: &[u8]) -> Output {
        let cfg = self.path(&format!("{}.toml", CLIENTS[c].0));
        orion_on(&self.net.ns(CLIENTS[c].0), &cfg, args, stdin)
    }
}

/// Holds a file open through a mount on client host 0 while the primary's host is cut
/// off and host 1 unlinks the file; the mount, stopped meanwhile (a client slow to
/// come back: a paused VM), finds its primary silent when it goes on, reaches the new
/// primary long before its two-minute call timeout (design note 65), and the file is
/// still there for it: the new primary's pool names the mount as a holder
/// (design note 62).
fn held_through_a_cut(h: &Hosts) {
    let mnt = h.path("mnt-c0");
    std::fs::create_dir_all(&mnt).unwrap();
    let host_cfg = std::fs::read_to_string(h.path(&format!("{}.toml", CLIENTS[0].0))).unwrap();
    assert!(host_cfg.contains("op_timeout_ms = 5000"), "{host_cfg}");
    let timeout = Duration::from_secs(120);
    let cfg = h.path("mount-c0.toml");
    let slow = format!("op_timeout_ms = {}", timeout.as_millis());
    std::fs::write(&cfg, host_cfg.replace("op_timeout_ms = 5000", &slow)).unwrap();
    let args = [
        "mount",
        "--config",
        cfg.to_str().unwrap(),
        mnt.to_str().unwrap(),
    ];
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let ns = h.net.ns(CLIENTS[0].0);
    let mount = spawn_in(&ns, &args, &h.path("mount-c0.log")).unwrap_or_else(|e| panic!("{e}"));
    // Seen from here through the mount process's root (`ip netns exec` gives it a
    // mount namespace of its own).
    let seen = PathBuf::from(format!("/proc/{}/root{}", mount.pid(), mnt.display()));
    std::fs::write(seen.join("held"), HELD).unwrap();
    // The holder is a process of its own: every program this test starts while the
    // mount is stopped would otherwise wait at its exec, which closes (flushes) the
    // test's descriptors on the mount.
    let mut holder = Holder::open(&seen.join("held"), mount);
    // SAFETY: kill only sends a signal to the mount, a child of this test.
    unsafe { libc::kill(holder.mount.pid() as i32, libc::SIGSTOP) };
    // The new primary's host loses its link: it stops when its lease lapses, and
    // its mirror takes the role then.
    h.net.set_link(MDS_B.0, false);
    h.wait_log("mds-a.log", "mds-a is the primary (epoch 3", 60);
    // The stores rejoin within seconds: their first connects go to the new primary,
    // not to the vanished host, whose connects wait out the fabric's connect
    // timeout (a minute here, set so in the hosts' settings).
    let t0 = Instant::now();
    let rejoined = || {
        let log = h.log("mds-a.log");
        let since = log
            .split("mds-a is the primary (epoch 3")
            .nth(1)
            .unwrap_or("");
        since.matches(" joined from ").count()
    };
    while rejoined() < STORES.len() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the stores did not rejoin the new primary:\n{}",
            h.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = h.client(1, &["fs", "rm", "/held"], b"");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // SAFETY: as above.
    unsafe { libc::kill(holder.mount.pid() as i32, libc::SIGCONT) };
    let t0 = Instant::now();
    let (back, nlink) = holder.write_and_read(b"HELD", HELD.len());
    let took = t0.elapsed();
    assert_eq!(&back[..4], b"HELD", "{}", h.logs());
    assert_eq!(
        &back[4..],
        &HELD[4..],
        "the held file outlived the fail-over"
    );
    assert_eq!(nlink, 0);
    assert!(
        took < timeout / 2,
        "the mount took {took:?} to go on, as if it waited for its timeout\n{}",
        h.logs()
    );
    holder.close();
}

/// A python3 process that holds a file open on a mount (the mount goes when this
/// does, after the holder: a wedged mount then aborts instead of hanging the close).
struct Holder {
    child: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    mount: cluster::Daemon,
}

const HOLDER: &str = "import os, sys\n\
fd = os.open(sys.argv[1], os.O_RDWR)\n\
print('open', flush=True)\n\
w, n = sys.stdin.readline().split()\n\
os.pwrite(fd, bytes.fromhex(w), 0)\n\
os.fsync(fd)\n\
print(os.pread(fd, int(n), 0).hex(), os.fstat(fd).st_nlink, flush=True)\n\
sys.stdin.readline()\n\
os.close(fd)\n";

impl Holder {
    fn open(path: &Path, mount: cluster::Daemon) -> Holder {
        use std::io::BufRead;
        let mut child = std::process::Command::new("python3")
            .args(["-c", HOLDER])
            .arg(path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("running python3");
        let out = child.stdout.take().unwrap();
        let mut h = Holder {
            child,
            lines: std::io::BufReader::new(out).lines(),
            mount,
        };
        assert_eq!(h.line(), "open");
        h
    }

    /// The holder's next line; empty when it ended.
    fn line(&mut self) -> String {
        self.lines.next().and_then(|l| l.ok()).unwrap_or_default()
    }

    fn say(&mut self, what: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(format!("{what}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// Writes `data` at 0 through the held descriptor, syncs, and reads `len` bytes
    /// back; with the file's link count.
    fn write_and_read(&mut self, data: &[u8], len: usize) -> (Vec<u8>, u64) {
        self.say(&format!("{} {len}", orion_format::hex(data)));
        let line = self.line();
        let (hex, nlink) = line
            .split_once(' ')
            .unwrap_or_else(|| panic!("the holder failed: {line:?}"));
        let back = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        (back, nlink.parse().unwrap())
    }

    fn close(mut self) {
        self.say("close");
        let st = self.child.wait().unwrap();
        assert!(st.success(), "the holder's close failed");
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.mount.kill();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn content(c: usize, n: usize) -> Vec<u8> {
    let len = 9_000 + n * 611 + c * 77;
    (0..len)
        .map(|k| ((k * 13 + n * 7 + c) ^ (k >> 9)) as u8)
        .collect()
}

#[test]
fn a_mirrored_cluster_over_hosts_survives_its_primary_killed_and_cut_off() {
    let h = Hosts::start();
    let written = std::sync::atomic::AtomicUsize::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Whatever happens below, the writers stop (a failed assertion would otherwise
    // leave the scope waiting for them forever).
    struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let counts = std::thread::scope(|scope| {
        let _stop_writers = StopOnDrop(&stop);
        let writers: Vec<_> = (0..2)
            .map(|c| {
                let (h, written, stop) = (&h, &written, &stop);
                scope.spawn(move || {
                    let mut n = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let path = format!("/c{c}-f{n}");
                        let o = h.client(c, &["fs", "put", &path], &content(c, n));
                        assert!(
                            o.status.success(),
                            "writing {path} failed: {}\n{}",
                            String::from_utf8_lossy(&o.stderr),
                            h.logs()
                        );
                        n += 1;
                        written.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    n
                })
            })
            .collect();
        let wait_written = |more: usize| {
            let target = written.load(std::sync::atomic::Ordering::Relaxed) + more;
            let t0 = Instant::now();
            while written.load(std::sync::atomic::Ordering::Relaxed) < target {
                assert!(t0.elapsed() < Duration::from_secs(120), "writes stalled");
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        wait_written(6);
        // kill -9 of the primary: the mirror sees its process go and takes over.
        h.mds.lock().unwrap()[0].as_mut().unwrap().kill();
        h.wait_log("mds-b.log", "mds-b is the primary (epoch 2", 30);
        wait_written(6);
        // The old primary comes back as the mirror and catches up.
        h.start_mds(0, false);
        h.wait_log("mds-b.log", "mirror mds-a is in sync", 60);
        wait_written(4);
        held_through_a_cut(&h);
        wait_written(6);
        h.net.set_link(MDS_B.0, true);
        h.wait_log("mds-b.log", "lost the primary role (epoch 2", 60);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writers
            .into_iter()
            .map(|w| w.join().unwrap())
            .collect::<Vec<usize>>()
    });
    // Every file, from either client, reads back.
    let o = h.client(0, &["fs", "tree", "/"], b"");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8(o.stdout).unwrap();
    let mut want: Vec<String> = Vec::new();
    for (c, &n) in counts.iter().enumerate() {
        for i in 0..n {
            let b = content(c, i);
            want.push(format!(
                "/c{c}-f{i} file {} {:08x}",
                b.len(),
                crc32c::crc32c(&b)
            ));
        }
    }
    want.sort();
    let got: Vec<&str> = text.lines().collect();
    assert_eq!(got, want, "the files read back");
    println!("{} files written across the fail-overs", want.len());
}
