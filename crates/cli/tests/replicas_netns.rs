//! A replicated cluster spread over network namespaces that this test creates, one per
//! host (the MDS, each data store of a group of two, the client), joined by a bridge in
//! a namespace of its own, over libfabric's tcp provider: the traffic of a real cluster,
//! on no network but the test's own. A client program writes files while one store is
//! killed (`kill -9`) and while the other is cut off by taking its link down; every
//! write succeeds, every file reads back from the store left alone, the stores come back
//! and resync, and the two pools end page for page equal.

mod cluster;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use cluster::netns::{orion_on, Network};
use cluster::{spawn_in, Daemon, ORION};
use orion_fabric::Secret;

/// The hosts: name, address on the test's network.
const MDS: (&str, &str) = ("m", "10.79.0.1");
const STORES: [(&str, &str); 2] = [("s0", "10.79.0.10"), ("s1", "10.79.0.11")];
const CLIENT: (&str, &str) = ("c", "10.79.0.20");

/// The cluster; fields drop in order: daemons, then namespaces, then pools.
struct Hosts {
    mds: Daemon,
    stores: [Option<Daemon>; 2],
    net: Network,
    dir: tempfile::TempDir,
}

impl Hosts {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn config(dir: &Path, host: &str, addr: &str, mds: &str) -> PathBuf {
        let path = dir.join(format!("{host}.toml"));
        let text = format!(
            "[fabric]\nbackend = \"libfabric\"\nprovider = \"tcp;ofi_rxm\"\naddress = \"{addr}\"\n\
             secret_file = \"{}\"\n\n[client]\nmds = \"{mds}\"\ninternal = false\n",
            dir.join("secret").display()
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    fn start() -> Hosts {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        std::fs::write(dir.path().join("secret"), Secret::generate().expose()).unwrap();
        let net = Network::create(&[MDS, STORES[0], STORES[1], CLIENT]);
        let cfg = Self::config(dir.path(), MDS.0, MDS.1, "");
        let args: Vec<String> = [
            "mds",
            "--format",
            "--pool-size",
            "64M",
            "--replicas",
            "2",
            "--listen",
            &format!("{}:0", MDS.1),
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["--config".into(), cfg.display().to_string()])
        .chain([
            "--pool".into(),
            dir.path().join("mds.pool").display().to_string(),
        ])
        .collect();
        let mds = spawn_in(&net.ns(MDS.0), &args, &dir.path().join("mds.log"))
            .unwrap_or_else(|e| panic!("{e}"));
        Self::config(dir.path(), CLIENT.0, CLIENT.1, &mds.addr);
        let mut h = Hosts {
            mds,
            stores: [None, None],
            net,
            dir,
        };
        for i in 0..2 {
            h.start_store(i, true);
        }
        h
    }

    /// Starts store `i` of group 0 on its host (`format`: a new pool).
    fn start_store(&mut self, i: usize, format: bool) {
        let (host, addr) = STORES[i];
        let cfg = Self::config(self.dir.path(), host, addr, &self.mds.addr);
        let mut args: Vec<String> = vec![
            "ds".into(),
            "--config".into(),
            cfg.display().to_string(),
            "--pool".into(),
            self.path(&format!("ds0.r{i}.pool")).display().to_string(),
            "--pool-size".into(),
            "64M".into(),
            "--group".into(),
            "0".into(),
            "--index".into(),
            i.to_string(),
            "--listen".into(),
            format!("{addr}:0"),
            "--mds".into(),
            self.mds.addr.clone(),
        ];
        if format {
            args.push("--format".into());
        }
        let log = self.path(&format!("ds0.{i}.log"));
        let d = spawn_in(&self.net.ns(host), &args, &log).unwrap_or_else(|e| panic!("{e}"));
        self.stores[i] = Some(d);
    }

    fn kill_store(&mut self, i: usize) {
        if let Some(mut d) = self.stores[i].take() {
            d.kill();
        }
    }

    /// `orion <args>` on the client's host, with `stdin`.
    fn client(&self, args: &[&str], stdin: &[u8]) -> Output {
        let cfg = self.path(&format!("{}.toml", CLIENT.0));
        orion_on(&self.net.ns(CLIENT.0), &cfg, args, stdin)
    }

    fn logs(&self) -> String {
        ["mds.log", "ds0.0.log", "ds0.1.log"]
            .iter()
            .map(|f| {
                let text = std::fs::read_to_string(self.path(f)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                format!(
                    "--- {f} (last lines)\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Writes file `n` through a client process; it must succeed.
    fn put(&self, n: usize) {
        let t0 = Instant::now();
        let o = self.client(&["fs", "put", &format!("/f{n}")], &content(n));
        assert!(
            o.status.success(),
            "writing /f{n} failed after {:?}: {}\n{}",
            t0.elapsed(),
            String::from_utf8_lossy(&o.stderr),
            self.logs()
        );
        let took = t0.elapsed();
        if took > Duration::from_secs(1) {
            println!("writing /f{n} took {took:?} (a store had just gone)");
        }
    }

    /// Every file written so far reads back exactly (the tree's CRCs).
    fn check_files(&self, written: usize) {
        let o = self.client(&["fs", "tree", "/"], b"");
        assert!(
            o.status.success(),
            "reading the tree failed: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            self.logs()
        );
        let text = String::from_utf8(o.stdout).unwrap();
        let mut want: Vec<String> = (0..written)
            .map(|n| {
                let c = content(n);
                format!("/f{n} file {} {:08x}", c.len(), crc32c::crc32c(&c))
            })
            .collect();
        want.sort();
        let got: Vec<&str> = text.lines().collect();
        assert_eq!(got, want, "the files read back");
    }

    /// The stores' states, from `orion status --json` on the client's host.
    fn states(&self) -> Vec<String> {
        let o = self.client(&["status", "--json"], b"");
        if !o.status.success() {
            return Vec::new();
        }
        let v: serde_json::Value = match serde_json::from_slice(&o.stdout) {
            Ok(v) => v,
            Err(_) => return Vec::new(),
        };
        let mut stores: Vec<(u64, String)> = v["stores"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|s| {
                        let index = s["index"].as_u64().unwrap_or(99);
                        (index, s["state"].as_str().unwrap_or("").to_string())
                    })
                    .collect()
            })
            .unwrap_or_default();
        stores.sort();
        stores.into_iter().map(|(_, s)| s).collect()
    }

    fn wait_states(&self, want: [&str; 2], within: Duration) -> Duration {
        let t0 = Instant::now();
        loop {
            let got = self.states();
            if got == want {
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < within,
                "the stores are {got:?}, not {want:?}, after {within:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// File `n`'s bytes: a size that is not a whole number of pages, and content that
/// differs from file to file.
fn content(n: usize) -> Vec<u8> {
    let len = 20_000 + n * 1_237;
    (0..len)
        .map(|k| ((k * 31 + n * 7) ^ (k >> 8)) as u8)
        .collect()
}

#[test]
fn a_group_spread_over_hosts_survives_a_killed_store_and_a_cut_link() {
    let mut h = Hosts::start();
    h.wait_states(["up", "up"], Duration::from_secs(30));
    let mut written = 0;
    let mut put = |h: &Hosts, count: usize| {
        for _ in 0..count {
            h.put(written);
            written += 1;
        }
        written
    };

    // kill -9 of one store between writes: the next writes go to the other alone.
    put(&h, 8);
    h.kill_store(1);
    let n = put(&h, 8);
    h.check_files(n);

    // It comes back with its pool, copies what it missed, and the other one dies:
    // every file reads back from the store that resynced.
    h.start_store(1, false);
    let took = h.wait_states(["up", "up"], Duration::from_secs(60));
    println!("store 0.1 rejoined and resynced in {took:?}");
    h.kill_store(0);
    let n = put(&h, 4);
    h.check_files(n);
    h.start_store(0, false);
    h.wait_states(["up", "up"], Duration::from_secs(60));

    // Store 0.1's host loses its link: nothing closes, it just goes silent. Writes go
    // on without it once the MDS has marked it down.
    h.net.set_link(STORES[1].0, false);
    let t0 = Instant::now();
    let n = put(&h, 6);
    println!("6 writes with store 0.1 cut off took {:?}", t0.elapsed());
    h.wait_states(["up", "down"], Duration::from_secs(30));
    h.check_files(n);
    // The link comes back: the store finds its MDS connection gone, joins again and
    // resyncs; then it alone serves every file.
    h.net.set_link(STORES[1].0, true);
    let took = h.wait_states(["up", "up"], Duration::from_secs(90));
    println!("store 0.1 was back and in sync {took:?} after its link came up");
    h.kill_store(0);
    let n = put(&h, 2);
    h.check_files(n);
    h.start_store(0, false);
    h.wait_states(["up", "up"], Duration::from_secs(60));

    // Stopped cleanly, the two pools hold the same pages.
    for d in h.stores.iter_mut().flatten() {
        d.terminate();
    }
    h.mds.terminate();
    let o = Command::new(ORION)
        .arg("fsck")
        .arg("--pool")
        .arg(h.path("mds.pool"))
        .arg("--replicas")
        .arg(h.path("ds0.r0.pool"))
        .arg(h.path("ds0.r1.pool"))
        .output()
        .unwrap();
    let report =
        String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "fsck --replicas: {report}");
    assert!(
        report.contains(" 0 differences"),
        "fsck --replicas: {report}"
    );
}
