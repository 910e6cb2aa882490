//! A resync whose source dies goes on from another in-sync replica, and the group
//! ends whole: a group of three stores, one of which misses writes, comes back and
//! copies from the first while that one is killed.

use std::time::{Duration, Instant};

use orion_client::{Client, MemberState, OpenFlags};
use orion_sim::{ClientKind, Cluster, ClusterConfig, MemberId};

const EXTERNAL: ClientKind = ClientKind {
    internal: false,
    optimistic: false,
    weak: false,
};

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

#[test]
fn a_resync_whose_source_dies_goes_on_from_another_replica() {
    // The servers' logs, with RUST_LOG (the MDS says when the resync changes source).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut cluster = Cluster::start(ClusterConfig {
        seed: 7,
        stores: 1,
        replicas: 3,
        store_pool: 128 << 20,
        ..Default::default()
    })
    .unwrap();
    let c = cluster.client(EXTERNAL).unwrap();
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
    // Replica 2 misses the second half.
    cluster.kill_store(MemberId::new(0, 2)).unwrap();
    for mib in 32..64 {
        c.pwrite(fd, mib << 20, &content(mib)).unwrap();
    }
    // It comes back and copies 64 MiB; its source (replica 0, the first in-sync one
    // up) dies as soon as the copy began.
    cluster.revive_store(MemberId::new(0, 2)).unwrap();
    let t0 = Instant::now();
    loop {
        let (_, map) = c.cluster_map().unwrap();
        let resyncing = map
            .iter()
            .any(|s| s.member.index == 2 && s.state == MemberState::Resyncing);
        if resyncing || t0.elapsed() > Duration::from_secs(10) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
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
    for mib in 0..64 {
        assert!(
            c.pread(fd, mib << 20, 1 << 20).unwrap() == content(mib),
            "MiB {mib} differs"
        );
    }
    cluster.revive_store(MemberId::new(0, 0)).unwrap();
    wait_all_up(&c, 3);
    c.close(fd).unwrap();
    drop(c);
    cluster.stop().unwrap();
    let equal = cluster.compare_replicas().unwrap();
    assert!(equal >= 64 * 256, "{equal} pages compared");
}
