//! `orion up` as a user runs it: the same file system served again after a stop, a
//! replicated cluster that loses a data store while a program writes (the program sees
//! nothing; the store comes back and resyncs; the replicas compare equal), and Ctrl-C
//! while the MDSs start.

mod cluster;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cluster::{is_mounted, Up, ORION};

/// `orion up` with its state and pool directories, the register under the build
/// directory.
fn start_up(state: &Path, pools: &Path) -> Up {
    up_with(state, pools, &[])
}

fn up_with(state: &Path, pools: &Path, extra: &[&str]) -> Up {
    Up::start(state, pools, &register_home(), extra)
}

#[test]
fn orion_up_serves_the_same_file_system_again() {
    let state = tempfile::tempdir().unwrap();
    let pools = tempfile::tempdir_in("/dev/shm").unwrap();
    let up = start_up(state.path(), pools.path());
    let mnt = up.mnt.clone();
    std::fs::write(mnt.join("hello"), b"hello, orion").unwrap();
    std::fs::create_dir(mnt.join("dir")).unwrap();
    // Once the mirror is in sync (it may take over), both MDS pools hold about
    // what the file system does: they grow as used, and the mirror's copy of the
    // primary's pool filled neither with the pages nobody wrote.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let o = Command::new(ORION)
            .args(["status", "--json", "--dir"])
            .arg(state.path())
            .output()
            .unwrap();
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        if j["manager"]["eligible"]
            .as_array()
            .is_some_and(|e| !e.is_empty())
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the mirror never got in sync: {j}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for pool in ["mds.pool", "mds-mirror.pool"] {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(pools.path().join(pool)).unwrap();
        let taken = m.blocks() * 512;
        assert!(
            taken > 0 && taken <= 16 << 20,
            "{pool}: {taken} of {} bytes allocated",
            m.len()
        );
    }
    let err = up.stop();
    assert!(err.contains("formatting"), "the first run formats: {err}");
    assert!(!is_mounted(&mnt), "Ctrl-C unmounts");
    assert!(
        nothing_runs(&format!(
            "--secret-file {}",
            state.path().join("secret").display()
        )),
        "daemons left running"
    );
    // Something else took the first MDS's port meanwhile (as the local end of any
    // connection on the host can): the cluster starts anyway, on another port.
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.path().join("cluster.json")).unwrap()).unwrap();
    let old_addr = record["mdss"][0]["addr"]
        .as_str()
        .expect("mds-a's address")
        .to_string();
    // (If the bind fails, something else holds the port already: the same case.)
    let _squatter = std::net::TcpListener::bind(&old_addr).ok();
    let up = start_up(state.path(), pools.path());
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.path().join("cluster.json")).unwrap()).unwrap();
    assert_ne!(record["mdss"][0]["addr"].as_str(), Some(old_addr.as_str()));
    assert_eq!(std::fs::read(mnt.join("hello")).unwrap(), b"hello, orion");
    assert!(mnt.join("dir").is_dir());
    let err = up.stop();
    assert!(err.contains("existing file system"), "{err}");
    assert!(!is_mounted(&mnt));
}

#[test]
fn a_replicated_cluster_loses_a_store_and_the_application_sees_nothing() {
    let state = tempfile::tempdir().unwrap();
    let pools = tempfile::tempdir_in("/dev/shm").unwrap();
    let up = up_with(state.path(), pools.path(), &["--replicas", "2"]);
    let mnt = up.mnt.clone();
    let content =
        |i: usize| -> Vec<u8> { (0..5000 + i * 37).map(|k| (k * 31 + i * 7) as u8).collect() };
    // A program writing files while one store of group 0 dies (kill -9).
    let writer = {
        let mnt = mnt.clone();
        std::thread::spawn(move || -> Result<usize, String> {
            for i in 0..300 {
                let p = mnt.join(format!("f{i}"));
                std::fs::write(&p, content(i)).map_err(|e| format!("writing {i}: {e}"))?;
                let back = std::fs::read(&p).map_err(|e| format!("reading {i}: {e}"))?;
                if back != content(i) {
                    return Err(format!("file {i} read back wrong"));
                }
            }
            Ok(300)
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.path().join("cluster.json")).unwrap()).unwrap();
    let metrics_of_ds01 = (record["stores"].as_array().unwrap().iter())
        .find(|s| s["group"] == 0 && s["index"] == 1)
        .and_then(|s| s["metrics"].as_str())
        .expect("ds 0.1 has a metrics endpoint")
        .to_string();
    // SAFETY: kill(2) on a pid this test's child started.
    unsafe { libc::kill(up.pid("ds 0.1"), libc::SIGKILL) };
    assert_eq!(writer.join().unwrap(), Ok(300), "the program saw an error");
    // `orion up` starts the store again; it copies what it missed (if a commit went
    // on without it), then serves: `orion status` sees every store up again, the
    // restarted one with a new pid.
    let first_pid = up.pid("ds 0.1");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let j = loop {
        let o = Command::new(ORION)
            .args(["status", "--json", "--dir"])
            .arg(state.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let stores = j["stores"].as_array().cloned().unwrap_or_default();
        let back = stores.iter().any(|s| {
            s["group"] == 0 && s["index"] == 1 && s["pid"].as_i64() != Some(first_pid as i64)
        });
        if back && stores.iter().all(|s| s["state"] == "up") {
            break j;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "stores not all up: {j}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(j["epoch"].as_u64().is_some_and(|e| e > 1), "{j}");
    // The store started again serves its metrics where it did (the socket is kept by
    // `orion up`, so no other process took the port meanwhile).
    let page = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&metrics_of_ds01).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut page = String::new();
        s.read_to_string(&mut page).unwrap();
        page
    };
    assert!(
        page.contains(" 200 ") && page.contains("orion_ds_joined 1"),
        "{page}"
    );
    assert_eq!(j["mds"][0]["state"], "up", "{j}");
    assert_eq!(j["mds"][0]["role"], "primary", "{j}");
    // The 64 MiB MDS pool holds one inode per KiB (the root's is taken), and the
    // files written above took some.
    let space = &j["space"];
    assert_eq!(space["inode_slots"], 65_535, "{j}");
    let free = space["inode_slots_free"].as_u64().unwrap();
    assert!(free < 65_534 && free > 60_000, "{j}");
    assert!(
        space["data_pages_free"].as_u64() < space["data_pages"].as_u64(),
        "{j}"
    );
    let stores = j["stores"].as_array().unwrap();
    assert_eq!(stores.len(), 4, "two groups of two: {j}");
    for s in stores {
        assert_eq!(s["resync_pct"], 100, "{j}");
        assert!(s["pid"].as_u64().is_some() && s["addr"].is_string(), "{j}");
    }
    // Now the other store of group 0 dies: every file reads back from the one that
    // resynced (past the client's page cache and the kernel's).
    // SAFETY: as above.
    unsafe { libc::kill(up.pid("ds 0.0"), libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(1500));
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    for i in 0..300 {
        let back = std::fs::read(mnt.join(format!("f{i}"))).expect("reading a file back");
        assert!(back == content(i), "file {i} differs after the failures");
    }
    let err = up.stop();
    assert!(
        err.contains("ds 0.1 exited"),
        "orion up said a store died: {err}"
    );
    assert!(err.contains("started again"), "{err}");
    assert!(!is_mounted(&mnt));
    // What an operator reads in the logs: a line per event, in the log of the process
    // that saw it; progress in whole lines.
    let log = |name: &str| {
        let text = std::fs::read_to_string(state.path().join("logs").join(name))
            .unwrap_or_else(|e| panic!("logs/{name}: {e}"));
        assert!(!text.contains('\r'), "a carriage return in {name}");
        text
    };
    let has = |text: &str, all: &[&str]| text.lines().any(|l| all.iter().all(|w| l.contains(w)));
    let (mds, up_log, store) = (log("mds-a.log"), log("up.log"), log("ds0.r1.log"));
    for (text, event) in [
        (&mds, &["mds-a is the primary (epoch 1", "lease"][..]),
        (&mds, &["mirror mds-b is in sync"]),
        (&mds, &["client pid", "joined"]),
        (&mds, &["data store group 0 replica 1 joined from", "epoch"]),
        (
            &mds,
            &["group 0 replica 1", "left:", "goes on with 1 replica(s)"],
        ),
        (
            &mds,
            &["group 0 replica 0", "left:", "goes on with 1 replica(s)"],
        ),
        (&store, &["formatting", "100 %"]),
        (&store, &["joined the MDS at"]),
        (&up_log, &["is the primary, epoch 1"]),
        (&up_log, &["ds 0.1 exited"]),
        (&up_log, &["ds 0.1 started again"]),
        (&up_log, &["stopped; run it again"]),
    ] {
        assert!(has(text, event), "no line with {event:?} in:\n{text}");
    }
    // The store that died and came back joined once per life.
    assert!(store.matches("joined the MDS at").count() >= 2, "{store}");
    // The replicas of each group hold the same bytes in every page a file names.
    let p = |name: &str| pools.path().join(name);
    let o = Command::new(ORION)
        .args(["fsck", "--pool"])
        .arg(p("mds.pool"))
        .arg("--replicas")
        .args([
            p("ds0.pool"),
            p("ds0.r1.pool"),
            p("ds1.pool"),
            p("ds1.r1.pool"),
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains(" 0 differences"), "{out}");
    assert!(
        !out.contains(" 0 pages equal"),
        "the files' pages were compared: {out}"
    );
}

#[test]
fn the_primary_mds_dies_and_the_mount_goes_on_through_its_mirror() {
    let state = tempfile::tempdir().unwrap();
    let pools = tempfile::tempdir_in("/dev/shm").unwrap();
    let up = start_up(state.path(), pools.path());
    let mnt = up.mnt.clone();
    let status = || -> serde_json::Value {
        let o = Command::new(ORION)
            .args(["status", "--json", "--dir"])
            .arg(state.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    // The mirror catches up before the primary is killed (else it may not take over).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while status()["mds"][1]["role"] != "mirror" {
        assert!(std::time::Instant::now() < deadline, "{}", status());
        std::thread::sleep(Duration::from_millis(50));
    }
    let content =
        |i: usize| -> Vec<u8> { (0..3000 + i * 37).map(|k| (k * 29 + i * 5) as u8).collect() };
    // A program creating, writing, renaming and appending through the mount while the
    // primary MDS is killed.
    const N: usize = 400;
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = {
        let mnt = mnt.clone();
        let progress = progress.clone();
        std::thread::spawn(move || -> Result<Duration, String> {
            let mut gap = Duration::ZERO;
            let mut last = std::time::Instant::now();
            for i in 0..N {
                let (f, g) = (mnt.join(format!("f{i}")), mnt.join(format!("g{i}")));
                std::fs::write(&f, content(i)).map_err(|e| format!("writing {i}: {e}"))?;
                std::fs::rename(&f, &g).map_err(|e| format!("renaming {i}: {e}"))?;
                let mut a = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&g)
                    .map_err(|e| format!("opening {i}: {e}"))?;
                use std::io::Write;
                a.write_all(b"#")
                    .map_err(|e| format!("appending {i}: {e}"))?;
                gap = gap.max(last.elapsed());
                last = std::time::Instant::now();
                progress.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(gap)
        })
    };
    while progress.load(std::sync::atomic::Ordering::Relaxed) < N / 4 {
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: kill(2) on a pid this test's child started.
    unsafe { libc::kill(up.pid("mds-a"), libc::SIGKILL) };
    let at_kill = progress.load(std::sync::atomic::Ordering::Relaxed);
    let gap = writer.join().unwrap().expect("the program saw an error");
    println!("longest gap between two iterations through the mount: {gap:?}");
    assert!(
        at_kill < N,
        "the kill came while it ran ({at_kill} of {N} done)"
    );
    for i in 0..N {
        let mut want = content(i);
        want.push(b'#');
        let back = std::fs::read(mnt.join(format!("g{i}"))).expect("reading a file back");
        assert!(back == want, "file g{i} differs");
        assert!(!mnt.join(format!("f{i}")).exists(), "f{i} renamed once");
    }
    // mds-b serves; `orion up` starts mds-a again, which mirrors mds-b and catches up.
    let first = up.pid("mds-a") as i64;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let j = loop {
        let j = status();
        let back = j["mds"][0]["pid"].as_i64() != Some(first);
        if back && j["mds"][0]["role"] == "mirror" && j["mds"][1]["role"] == "primary" {
            break j;
        }
        assert!(std::time::Instant::now() < deadline, "{j}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(j["manager"]["holder"], "mds-b", "{j}");
    assert!(j["manager"]["epoch"].as_u64() >= Some(2), "{j}");
    let err = up.stop();
    assert!(
        err.contains("mds-a exited"),
        "orion up said the MDS died: {err}"
    );
    assert!(!is_mounted(&mnt));
    for pool in ["mds.pool", "mds-mirror.pool"] {
        let o = Command::new(ORION)
            .args(["fsck", "--pool"])
            .arg(pools.path().join(pool))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "fsck {pool}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn orion_up_runs_etcd_as_its_cluster_manager_and_stops_it() {
    let state = tempfile::tempdir().unwrap();
    let pools = tempfile::tempdir_in("/dev/shm").unwrap();
    let o = Command::new(ORION)
        .env("XDG_DATA_HOME", register_home())
        .args([
            "up",
            "--etcd",
            "--check",
            "--mds-size",
            "64M",
            "--ds-size",
            "64M",
        ])
        .arg("--dir")
        .arg(state.path())
        .arg("--pools")
        .arg(pools.path())
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{out}{err}");
    assert!(
        out.contains("(primary)") && out.contains("(mirror)"),
        "{out}"
    );
    let up: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.path().join("cluster.json")).unwrap()).unwrap();
    assert!(
        up["manager"]
            .as_str()
            .is_some_and(|m| m.starts_with("etcd:")),
        "{up}"
    );
    // etcd kept its data in the state directory, and is stopped with the cluster.
    assert!(state.path().join("etcd").is_dir());
    assert!(
        nothing_runs(&format!(
            "--data-dir={}",
            state.path().join("etcd").display()
        )),
        "etcd left running"
    );
}

/// Ctrl-C while the MDSs start stops `orion up` and what it started. Here neither
/// MDS can take the primary role (the one in sync has a damaged pool, the other was
/// out of sync at the last stop), which `orion up` would otherwise wait out for two
/// minutes.
#[test]
fn ctrl_c_stops_orion_up_while_its_mdss_start() {
    let state = tempfile::tempdir().unwrap();
    let pools = tempfile::tempdir_in("/dev/shm").unwrap();
    start_up(state.path(), pools.path()).stop();
    let pool = pools.path().join("mds.pool");
    let mut bytes = std::fs::read(&pool).unwrap();
    bytes[..8].copy_from_slice(b"DAMAGED!");
    std::fs::write(&pool, bytes).unwrap();
    let log = state.path().join("second-up.log");
    // Killed if an assertion fails before it stopped (its daemons die with it).
    struct Running(std::process::Child);
    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut up = Running(
        Command::new(ORION)
            .env("XDG_DATA_HOME", register_home())
            .args(["up", "--mds-size", "64M", "--ds-size", "64M", "--dir"])
            .arg(state.path())
            .arg("--pools")
            .arg(pools.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    let t0 = std::time::Instant::now();
    while !said().contains("starting the MDS") {
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", said());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill(2) on our child's PID.
    unsafe { libc::kill(up.0.id() as i32, libc::SIGINT) };
    let t1 = std::time::Instant::now();
    while up.0.try_wait().unwrap().is_none() {
        assert!(
            t1.elapsed() < Duration::from_secs(20),
            "orion up still runs 20 s after Ctrl-C: {}",
            said()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!up.0.wait().unwrap().success());
    assert!(
        said().contains("interrupted while the MDSs started"),
        "{}",
        said()
    );
    let secret = format!("--secret-file {}", state.path().join("secret").display());
    assert!(nothing_runs(&secret), "daemons left running");
}

/// Whether no process's command line holds `pattern` (`pgrep -f`: exit status 1 when
/// nothing matched; 2 would be a bad pattern, and fails the test).
fn nothing_runs(pattern: &str) -> bool {
    let o = Command::new("pgrep")
        .args(["-f", "--", pattern])
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(2), "pgrep refused {pattern:?}");
    o.status.code() == Some(1)
}

/// Where these tests' `orion up`s keep the register of file systems: under the build
/// directory, not in the user's home.
fn register_home() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("orion-up-register")
}
