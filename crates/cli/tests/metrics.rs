//! The daemons' Prometheus endpoints, as an operator scrapes them: every MDS, data
//! store and mount `orion up` starts serves `/metrics` at the address `cluster.json` and `orion
//! status --json` give, the text parses (prometheus-parse), the counters move when a
//! program writes through the mount, and a scrape left open does not hold the stop.

mod cluster;

use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

use cluster::{Up, ORION};

/// GET /metrics from `addr`, parsed.
fn scrape(addr: &str) -> prometheus_parse::Scrape {
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut page = String::new();
    s.read_to_string(&mut page).unwrap();
    let (head, body) = page.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.contains(" 200 "), "{head}");
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .unwrap_or_else(|e| panic!("{addr} does not parse: {e}\n{body}"))
}

/// The value of the sample `name` whose labels include `labels` (0 if absent).
fn value(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    s.samples
        .iter()
        .filter(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(v)))
        .map(|x| match &x.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            _ => 0.0,
        })
        .sum()
}

fn names(s: &prometheus_parse::Scrape) -> Vec<&str> {
    s.samples.iter().map(|x| x.metric.as_str()).collect()
}

#[test]
fn every_daemon_serves_metrics_that_parse_and_move() {
    let data = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let pools = tempfile::tempdir_in("/dev/shm").unwrap();
    let up = Up::start(state.path(), pools.path(), data.path(), &[]);

    // Where the endpoints are: cluster.json and `orion status --json` agree.
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.path().join("cluster.json")).unwrap()).unwrap();
    let addr = |v: &serde_json::Value| v["metrics"].as_str().unwrap_or("").to_string();
    let mdss: Vec<String> = rec["mdss"].as_array().unwrap().iter().map(addr).collect();
    let stores: Vec<String> = rec["stores"].as_array().unwrap().iter().map(addr).collect();
    assert_eq!((mdss.len(), stores.len()), (2, 2), "{rec}");
    assert!(mdss.iter().chain(&stores).all(|a| !a.is_empty()), "{rec}");
    let o = Command::new(ORION)
        .args(["status", "--json", "--dir"])
        .arg(state.path())
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let listed: Vec<String> = (status["mds"].as_array().unwrap().iter())
        .chain(status["stores"].as_array().unwrap())
        .map(addr)
        .collect();
    for a in mdss.iter().chain(&stores) {
        assert!(listed.contains(a), "{a} not in orion status: {status}");
    }

    // Every endpoint parses and names what an operator looks for. The MDS refreshes
    // its gauges every 200 ms: until both stores have joined, they may say less.
    let primary = &mdss[0];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let before = loop {
        let s = scrape(primary);
        let joined = value(&s, "orion_mds_connections", &[("role", "store")]) == 2.0
            && value(&s, "orion_mds_data_pages", &[]) > 0.0;
        if joined || std::time::Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for want in [
        "orion_mds_requests_total",
        "orion_mds_data_pages",
        "orion_mds_inodes_free",
        "orion_mds_log_pages",
        "orion_mds_log_pages_free",
        "orion_mds_room_refusals_total",
        "orion_mds_epoch",
        "orion_mds_connections",
    ] {
        assert!(
            names(&before).contains(&want),
            "{want}: {:?}",
            names(&before)
        );
    }
    let mirror = scrape(&mdss[1]);
    assert!(names(&mirror).contains(&"orion_mds_malformed_messages_total"));
    assert!(value(&before, "orion_mds_data_pages", &[]) > 0.0);
    assert_eq!(
        value(&before, "orion_mds_connections", &[("role", "store")]),
        2.0
    );
    for s in &stores {
        let d = scrape(s);
        assert_eq!(value(&d, "orion_ds_joined", &[]), 1.0, "{s}");
        assert!(
            value(&d, "orion_ds_pool_bytes", &[]) >= (64 << 20) as f64,
            "{s}"
        );
    }

    // A program writes through the mount: its creates and commits are counted.
    let mnt = state.path().join("mnt");
    for i in 0..20 {
        std::fs::write(mnt.join(format!("f{i}")), vec![7u8; 8192]).unwrap();
    }
    // Renames into another directory change two inodes at once: the journal's work.
    std::fs::create_dir(mnt.join("d")).unwrap();
    for i in 0..5 {
        std::fs::rename(mnt.join(format!("f{i}")), mnt.join(format!("d/f{i}"))).unwrap();
    }
    // The request counters are counted before the answers go; the latency of each
    // just after: a scrape may come between, so it is taken again until both show.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let after = loop {
        let s = scrape(primary);
        let created = value(&s, "orion_mds_request_seconds_count", &[("kind", "create")]);
        // The engine's own counts reach the counters at the loop's next refresh.
        let journaled = value(&s, "orion_mds_journal_commits_total", &[]);
        let journaled_before = value(&before, "orion_mds_journal_commits_total", &[]);
        if (created >= 20.0 && journaled >= journaled_before + 5.0)
            || std::time::Instant::now() > deadline
        {
            break s;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let creates =
        |s: &prometheus_parse::Scrape| value(s, "orion_mds_requests_total", &[("kind", "create")]);
    assert!(
        creates(&after) >= creates(&before) + 20.0,
        "creates not counted"
    );
    assert!(
        value(
            &after,
            "orion_mds_request_seconds_count",
            &[("kind", "create")]
        ) >= 20.0,
        "create latency not recorded"
    );
    // The primary holds a lease from its cluster manager; the engine's own work is
    // counted.
    let left = value(&after, "orion_mds_lease_seconds_left", &[]);
    assert!(left > 0.0 && left <= 60.0, "lease left: {left}");
    assert_eq!(value(&mirror, "orion_mds_lease_seconds_left", &[]), 0.0);
    for name in [
        "orion_mds_gc_runs_total",
        "orion_mds_gc_log_pages_freed_total",
        "orion_mds_strong_waits_total",
        "orion_mds_strong_waiting",
    ] {
        assert!(names(&after).contains(&name), "{name} missing");
    }
    let journal = |s: &prometheus_parse::Scrape| value(s, "orion_mds_journal_commits_total", &[]);
    assert!(
        journal(&after) >= journal(&before) + 5.0,
        "journal commits not counted: {} then {}",
        journal(&before),
        journal(&after)
    );
    let commits =
        |s: &prometheus_parse::Scrape| value(s, "orion_mds_requests_total", &[("kind", "commit")]);
    assert!(
        commits(&after) >= commits(&before) + 20.0,
        "commits not counted"
    );
    // A file unlinked while open is kept, and counted, until its last close.
    let unlinked = |want: f64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let n = value(&scrape(primary), "orion_mds_unlinked_open_files", &[]);
            if n == want {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "unlinked open files: {n}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    unlinked(0.0);
    // A lock another process holds: the MDS answers EAGAIN, which is no refusal for
    // room (only an update's is, design note 74).
    let locked = std::fs::File::create(mnt.join("locked")).unwrap();
    let whole = libc::flock {
        l_type: libc::F_WRLCK as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    // SAFETY: a valid descriptor and a valid flock for F_SETLK.
    let rc = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&locked),
            libc::F_SETLK,
            &whole,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let other = Command::new("python3")
        .arg("-c")
        .arg(
            "import fcntl, os, sys\n\
             fd = os.open(sys.argv[1], os.O_RDWR)\n\
             try:\n    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n\
             except OSError:\n    print('busy')",
        )
        .arg(mnt.join("locked"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&other.stdout).trim(), "busy");
    drop(locked);
    let refusals = value(&scrape(&mdss[0]), "orion_mds_room_refusals_total", &[]);
    assert_eq!(
        refusals, 0.0,
        "a lock conflict counted as a refusal for room"
    );
    let held = std::fs::File::create(mnt.join("held")).unwrap();
    std::fs::remove_file(mnt.join("held")).unwrap();
    unlinked(1.0);
    drop(held);
    unlinked(0.0);
    // The mount's own endpoint: its client counted the same commits.
    let mount = rec["mount_metrics"].as_str().unwrap_or("").to_string();
    assert_eq!(
        status["mount_metrics"].as_str(),
        Some(mount.as_str()),
        "{status}"
    );
    let m = scrape(&mount);
    assert!(
        value(&m, "orion_client_commits_total", &[]) >= 20.0,
        "{:?}",
        names(&m)
    );
    assert!(value(&m, "orion_client_mds_requests_total", &[]) >= 40.0);
    // Each call the mount served is timed by kind, and the bytes it wrote counted.
    let served = |call: &str| value(&m, "orion_client_call_seconds_count", &[("call", call)]);
    assert!(served("create") >= 20.0, "{:?}", names(&m));
    assert!(served("write") >= 20.0 && served("release") >= 20.0);
    assert!(
        value(&m, "orion_client_call_seconds_sum", &[("call", "write")]) > 0.0,
        "no time recorded for writes"
    );
    assert_eq!(served("symlink"), 0.0, "a call never made is counted");
    assert!(value(&m, "orion_client_written_bytes_total", &[]) >= (20 * 8192) as f64);
    assert!(names(&m).contains(&"orion_client_read_bytes_total"));
    // The mount is an internal client here (same host: it writes the stores' pools
    // itself), so the stores report no pages; the counter is there for when they do.
    for s in &stores {
        let d = scrape(s);
        assert!(names(&d).contains(&"orion_ds_persisted_pages_total"), "{s}");
        assert!(names(&d).contains(&"orion_ds_resync_pages_total"), "{s}");
    }

    // A scrape that has begun (connected, request not sent) does not hold the
    // cluster's stop: the drop below waits for every daemon to exit. After it, nothing
    // listens there.
    let idle = std::net::TcpStream::connect(primary).unwrap();
    up.stop();
    drop(idle);
    assert!(std::net::TcpStream::connect_timeout(
        &primary.parse().unwrap(),
        Duration::from_secs(5)
    )
    .is_err());
}
