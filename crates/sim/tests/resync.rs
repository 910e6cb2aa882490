//! A resync whose source dies goes on from another in-sync replica, and the group
//! ends whole: a group of three stores, one of which misses writes, comes back and
//! copies from the first while that one is killed. It copies only what it missed.

use std::sync::Mutex;

use std::time::{Duration, Instant};

use orion_client::{Client, MemberState, OpenFlags};
use orion_sim::{ClientKind, Cluster, ClusterConfig, MemberId};

fn content(mib: u64) -> Vec<u8> {
    (0..1usize << 20)
        .map(|k| (k as u64 * 13 + mib * 7) as u8)
        .collect()
}

fn wait_all_up(c: &Client, replicas: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, map) = c.cluster_map().unwrap();
        if map.len() == replicas && map.iter().all(|s| s.state == MemberState::Up) {
            return;
        }
        assert!(Instant::now() < deadline, "not all up: {map:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The servers' log lines (they say what a resync copied, and from where).
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log_text() -> String {
    String::from_utf8_lossy(&LOG.lock().unwrap()).into_owned()
}

#[test]
fn a_resync_whose_source_dies_goes_on_from_another_replica() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_ansi(false)
        .with_writer(|| Capture)
        .try_init();
    let mut cluster = Cluster::start(ClusterConfig {
        seed: 7,
        stores: 1,
        replicas: 3,
        store_pool: 192 << 20,
        ..Default::default()
    })
    .unwrap();
    let c = cluster.client(ClientKind::EXTERNAL).unwrap();
    wait_all_up(&c, 3);
    let flags = OpenFlags {
        read: true,
        write: true,
        create: true,
        ..Default::default()
    };
    let fd = c.open("/big", flags, 0o644).unwrap();
    for mib in 0..32 {
        c.pwrite(fd, mib << 20, &content(mib)).unwrap();
    }
    // Replica 2 misses the next 96 MiB.
    cluster.kill_store(MemberId::new(0, 2)).unwrap();
    for mib in 32..128 {
        c.pwrite(fd, mib << 20, &content(mib)).unwrap();
    }
    // It comes back and copies them from replica 0 (the first in-sync one up), which
    // dies as soon as the copy began (joined means resyncing: 96 MiB take far longer
    // than the kill).
    cluster.revive_store(MemberId::new(0, 2)).unwrap();
    cluster.kill_store(MemberId::new(0, 0)).unwrap();
    // Replica 1 is the only whole copy up: the resync goes on from it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, map) = c.cluster_map().unwrap();
        let state = |i: u16| map.iter().find(|s| s.member.index == i).map(|s| s.state);
        if state(2) == Some(MemberState::Up) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replica 2 never came up: {map:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Every byte reads back (from replicas 1 and 2), and once replica 0 is back too,
    // the three hold the same pages.
    for mib in 0..128 {
        assert!(
            c.pread(fd, mib << 20, 1 << 20).unwrap() == content(mib),
            "MiB {mib} differs"
        );
    }
    // It changed source, and copied the 96 MiB it missed (a few pages twice, where
    // the first source failed), not all 128.
    let log = log_text();
    assert!(
        log.contains("group 0 replica 2 resyncs from group 0 replica 1 now"),
        "{log}"
    );
    let copied: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("group 0 replica 2: resynced "))
        .filter_map(|l| l.split("resynced ").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    // (The first line is its first join, into an empty group: nothing to copy.)
    assert!(
        copied
            .last()
            .is_some_and(|n| (96 * 256..100 * 256).contains(n)),
        "pages copied by replica 2's resyncs: {copied:?}"
    );
    cluster.revive_store(MemberId::new(0, 0)).unwrap();
    wait_all_up(&c, 3);
    c.close(fd).unwrap();
    drop(c);
    cluster.stop().unwrap();
    let equal = cluster.compare_replicas().unwrap();
    assert!(equal >= 128 * 256, "{equal} pages compared");
}
