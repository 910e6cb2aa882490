//! Optimistic writes staged in a client when the cluster map changes are copied to the
//! new members before they commit, and only from a store that took them: one that has
//! taken writes since, or one that took them and came back with the same pool. When
//! every store that took them is gone, fsync reports the loss, and the file keeps what
//! was committed before: the client never commits what another store holds at those
//! pages (zeros, or an older page).

use std::time::{Duration, Instant};

use orion_client::{Client, MemberState, OpenFlags};
use orion_sim::{ClientKind, Cluster, ClusterConfig, MemberId};

const OPTIMISTIC: ClientKind = ClientKind {
    internal: false,
    optimistic: true,
    weak: false,
};

const A: MemberId = MemberId { group: 0, index: 0 };
const B: MemberId = MemberId { group: 0, index: 1 };

/// Waits until the client's map says `want` of each store (in index order).
fn wait_states(c: &Client, want: &[MemberState]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, mut map) = c.cluster_map().unwrap();
        map.sort_by_key(|s| s.member.index);
        let got: Vec<MemberState> = map.iter().map(|s| s.state).collect();
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "stores {got:?}, not {want:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn page(fill: u8) -> Vec<u8> {
    (0..4096).map(|k| fill ^ (k as u8)).collect()
}

#[test]
fn staged_pages_come_only_from_a_store_that_took_them() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut cluster = Cluster::start(ClusterConfig {
        seed: 11,
        stores: 1,
        replicas: 2,
        ..Default::default()
    })
    .unwrap();
    // Staged writes wait for fsync (no age bound within the test), and a copy that
    // finds no store to read from gives up after a second.
    let c = cluster
        .client_with(OPTIMISTIC, |cfg| {
            cfg.stage_ms = 600_000;
            cfg.reconnect_ms = 1_000;
        })
        .unwrap();
    wait_states(&c, &[MemberState::Up, MemberState::Up]);
    let flags = OpenFlags {
        read: true,
        write: true,
        create: true,
        ..Default::default()
    };
    let fd = c.open("/f", flags, 0o644).unwrap();

    // Both stores take the staged page, then both restart with their pools: neither
    // has taken writes since, and either still holds it.
    c.pwrite(fd, 0, &page(1)).unwrap();
    cluster.kill_store(A).unwrap();
    cluster.kill_store(B).unwrap();
    // The client learns the map without committing what it staged (not due yet).
    wait_states(&c, &[MemberState::Down, MemberState::Down]);
    cluster.revive_store(A).unwrap();
    cluster.revive_store(B).unwrap();
    wait_states(&c, &[MemberState::Up, MemberState::Up]);
    c.fsync(fd)
        .expect("the staged page was copied from a store that kept it");
    assert!(c.pread(fd, 0, 4096).unwrap() == page(1));

    // B is down when the next page is staged, so A alone takes it; A dies, and B,
    // which never had it, serves the group (nothing was committed while it was away).
    cluster.kill_store(B).unwrap();
    wait_states(&c, &[MemberState::Up, MemberState::Down]);
    c.pwrite(fd, 0, &page(2)).unwrap();
    cluster.kill_store(A).unwrap();
    wait_states(&c, &[MemberState::Down, MemberState::Down]);
    cluster.revive_store(B).unwrap();
    wait_states(&c, &[MemberState::Down, MemberState::Up]);
    let err = c.fsync(fd).expect_err("the staged page is lost with A");
    assert_eq!(err.errno(), libc::EIO, "{err}");
    assert!(
        c.pread(fd, 0, 4096).unwrap() == page(1),
        "the file keeps its committed page, not B's old copy of the staged one"
    );
    c.close(fd).ok();
    drop(c);
    cluster.revive_store(A).unwrap();
    cluster.stop().unwrap();
    cluster.fsck().unwrap();
}
