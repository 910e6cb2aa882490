//! The MDS's callbacks to a client whose kernel caches names and attributes (design
//! note 56), seen through the client library: a change is acknowledged only after
//! every other client that watches the inode was told, a watch ends when the kernel
//! forgot the inode, and a client that does not answer holds a change up only until
//! its cache lease runs out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orion_client::{Client, FileType, Invalidation, SetAttrReq, Watched};
use orion_sim::{ClientKind, Cluster, ClusterConfig};

type Seen = Arc<Mutex<Vec<Invalidation>>>;

/// Turns `c`'s kernel cache on with a recorder of invalidations, and waits for its
/// first lease (a watch of the root succeeds).
fn recording(c: &Client) -> Seen {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    c.cache_in_kernel(
        Box::new(move |items| s.lock().unwrap().extend_from_slice(items)),
        false,
    )
    .unwrap();
    wait_for_lease(c, 1);
    seen
}

/// Waits until `c` has a cache lease, and watches `ino`.
fn wait_for_lease(c: &Client, ino: u64) -> Watched {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(w) = c.watch_for_kernel(&[ino]) {
            return w;
        }
        assert!(Instant::now() < deadline, "no cache lease within 10 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A cluster of `seed` with a cache lease far longer than a test (B's never runs out,
/// which would let a change go without B's answer, at the price of a first change
/// held that long), a client A, and a client B whose kernel cache records what it is
/// told.
fn watched_by_b(seed: u64) -> (Cluster, Client, Client, Seen) {
    let cluster = Cluster::start(ClusterConfig {
        seed,
        cache_lease_ms: 4000,
        ..Default::default()
    })
    .unwrap();
    let a = cluster.client(ClientKind::EXTERNAL).unwrap();
    let b = cluster.client(ClientKind::EXTERNAL).unwrap();
    let seen = recording(&b);
    (cluster, a, b, seen)
}

fn chmod(c: &Client, ino: u64, mode: u32) {
    let req = SetAttrReq {
        mode: Some(mode),
        ..Default::default()
    };
    c.setattr(ino, &req).unwrap();
}

#[test]
fn a_change_is_acknowledged_after_the_watchers_heard_of_it_and_a_forgotten_inode_is_unwatched() {
    let (_cluster, a, b, seen) = watched_by_b(11);
    // 256 files (one batch of forgotten inodes); B's kernel looks each up.
    let inos: Vec<u64> = (0..256)
        .map(|i| {
            a.mknod(&format!("/f{i}"), FileType::Regular, 0o644)
                .unwrap()
                .ino
        })
        .collect();
    for chunk in inos.chunks(64) {
        let w = b.watch_for_kernel(chunk).expect("watched");
        for &ino in chunk {
            assert!(b.watched_for_kernel(Some(w), ino));
            b.kernel_looked_up(ino);
        }
    }
    seen.lock().unwrap().clear();
    // Acknowledged to A only once B heard of it.
    chmod(&a, inos[0], 0o600);
    assert!(
        seen.lock()
            .unwrap()
            .contains(&Invalidation::Recall(inos[0])),
        "A's chmod returned before B was told: {:?}",
        seen.lock().unwrap()
    );
    // A removal: B hears of the name, and of the directory.
    a.unlink("/f1").unwrap();
    let s = seen.lock().unwrap().clone();
    assert!(s.contains(&Invalidation::Entry {
        parent: 1,
        name: b"f1".to_vec()
    }));
    assert!(s.contains(&Invalidation::Inode(1)));
    // B's own change: B is not told (its kernel knows), A does not watch.
    seen.lock().unwrap().clear();
    chmod(&b, inos[2], 0o640);
    assert!(!seen
        .lock()
        .unwrap()
        .contains(&Invalidation::Recall(inos[2])));
    // B's kernel forgets every file (a batch goes at the 256th forget, or at one
    // 100 ms after the batch's first); then no
    // change to them is B's business. The root stays watched.
    for &ino in &inos {
        b.kernel_forgot(ino, 1);
    }
    seen.lock().unwrap().clear();
    chmod(&a, inos[3], 0o600);
    assert!(
        !seen
            .lock()
            .unwrap()
            .contains(&Invalidation::Recall(inos[3])),
        "a forgotten inode is still watched"
    );
    a.mknod("/g", FileType::Regular, 0o644).unwrap();
    assert!(seen.lock().unwrap().contains(&Invalidation::Inode(1)));
}

/// B's invalidations block (a kernel that does not let go); A's change returns
/// anyway once B's lease (20 ms) ran out, long before B answers, and not before B
/// was told.
#[test]
fn a_client_that_does_not_answer_holds_a_change_up_only_for_its_lease() {
    let cluster = Cluster::start(ClusterConfig {
        seed: 12,
        ..Default::default()
    })
    .unwrap();
    let a = Arc::new(cluster.client(ClientKind::EXTERNAL).unwrap());
    let b = cluster.client(ClientKind::EXTERNAL).unwrap();
    let ino = a.mknod("/f", FileType::Regular, 0o644).unwrap().ino;
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let told = Arc::new(AtomicBool::new(false));
    let t = told.clone();
    b.cache_in_kernel(
        Box::new(move |_| {
            t.store(true, Ordering::SeqCst);
            let _ = release_rx
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(30));
        }),
        false,
    )
    .unwrap();
    wait_for_lease(&b, ino);
    let (done_tx, done_rx) = mpsc::channel();
    let a2 = a.clone();
    let told_then = told.clone();
    std::thread::spawn(move || {
        chmod(&a2, ino, 0o600);
        let _ = done_tx.send(told_then.load(Ordering::SeqCst));
    });
    let r = done_rx.recv_timeout(Duration::from_secs(10));
    let _ = release_tx.send(());
    assert!(
        r.is_ok(),
        "A's chmod waited for a client that never answered"
    );
    assert!(r.unwrap(), "A's chmod returned before B was told");
    assert_eq!(a.getattr(ino).unwrap().mode & 0o7777, 0o600);
}

/// The MDS's count of callback messages sent so far.
fn callbacks_sent(cluster: &Cluster) -> u64 {
    mds_counter(cluster, "orion_mds_cache_callbacks_total")
}

/// The MDS's metric `series` (its name and labels as the text format shows them).
fn mds_counter(cluster: &Cluster, series: &str) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &cluster.mds_metrics.registry()).unwrap();
    text.lines()
        .find(|l| l.split(' ').next() == Some(series))
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or_else(|| panic!("no {series} in the MDS's metrics"))
        .parse()
        .unwrap()
}

/// A client that looked at a file once (its kernel holds the file's attributes) costs
/// another client's writes to it one callback, however many writes; once it looks
/// again, the next write calls it back once more, and what it reads after any write
/// shows that write.
#[test]
fn a_look_at_a_file_costs_its_writers_one_callback_until_the_next_look() {
    let (cluster, a, b, seen) = watched_by_b(13);
    let ino = a.mknod("/f", FileType::Regular, 0o644).unwrap().ino;
    let fd = a
        .open("/f", orion_client::OpenFlags::read_write_create(), 0o644)
        .unwrap();
    // B's kernel looks the file up (as `ls -la` through a mount does).
    let w = b.watch_for_kernel(&[ino]).expect("watched");
    assert!(b.watched_for_kernel(Some(w), ino));
    b.kernel_looked_up(ino);
    seen.lock().unwrap().clear();
    let before = callbacks_sent(&cluster);
    let page = [7u8; 4096];
    for i in 0..1000u64 {
        a.pwrite(fd, i * 4096, &page).unwrap();
    }
    assert_eq!(
        callbacks_sent(&cluster) - before,
        1,
        "1000 writes to a file B looked at once"
    );
    assert_eq!(*seen.lock().unwrap(), vec![Invalidation::Recall(ino)]);
    // B's next look watches the file again first, and reads the last write.
    assert!(b
        .watch_for_kernel(&[ino])
        .is_some_and(|w| b.watched_for_kernel(Some(w), ino)));
    assert_eq!(b.getattr(ino).unwrap().size, 1000 * 4096);
    a.pwrite(fd, 1000 * 4096, &page).unwrap();
    assert_eq!(
        callbacks_sent(&cluster) - before,
        2,
        "one more after B looked again"
    );
    assert_eq!(b.getattr(ino).unwrap().size, 1001 * 4096);
    // A file B holds open stays watched through a recall (its kernel may have it
    // mapped, and reads mapped pages in without a getattr): each write calls B back.
    let held = b.open("/f", orion_client::OpenFlags::read(), 0).unwrap();
    assert!(b.watch_for_kernel(&[ino]).is_some());
    let at = callbacks_sent(&cluster);
    for i in 0..3u64 {
        a.pwrite(fd, i * 4096, &page).unwrap();
    }
    assert_eq!(callbacks_sent(&cluster) - at, 3, "a file B holds open");
    b.close(held).unwrap();
    // A directory's watch is not recalled: each change in it calls B back.
    let w = b.watch_for_kernel(&[1]).expect("watched");
    assert!(b.watched_for_kernel(Some(w), 1));
    let at = callbacks_sent(&cluster);
    a.mknod("/g", FileType::Regular, 0o644).unwrap();
    a.mknod("/h", FileType::Regular, 0o644).unwrap();
    assert_eq!(callbacks_sent(&cluster) - at, 2);
    a.close(fd).unwrap();
    // A watch noted after a caller took its promise does not count for that caller
    // (what it read before was not watched then): a lookup that read a file's
    // attributes, and then saw another thread's watch of it, reads them again.
    let k = a.mknod("/k", FileType::Regular, 0o644).unwrap().ino;
    let before = b.watch_for_kernel(&[1]).expect("watched");
    assert!(b.watch_for_kernel(&[k]).is_some());
    assert!(!b.watched_for_kernel(Some(before), k));
    assert!(b.watched_for_kernel(b.watch_for_kernel(&[1]), k));
}

/// The MDS's count of cache leases granted and renewed so far.
fn leases_granted(cluster: &Cluster) -> u64 {
    mds_counter(cluster, "orion_mds_requests_total{kind=\"cache_lease\"}")
}

/// A cluster of `seed` with cache leases of `lease_ms`, clients A and B, a file `/f`
/// that A made, and what B's kernel cache is told.
fn file_b_records(seed: u64, lease_ms: u64) -> (Cluster, Client, Client, u64, Seen) {
    let cluster = Cluster::start(ClusterConfig {
        seed,
        cache_lease_ms: lease_ms,
        ..Default::default()
    })
    .unwrap();
    let a = cluster.client(ClientKind::EXTERNAL).unwrap();
    let b = cluster.client(ClientKind::EXTERNAL).unwrap();
    let ino = a.mknod("/f", FileType::Regular, 0o644).unwrap().ino;
    let seen = recording(&b);
    (cluster, a, b, ino, seen)
}

/// A client whose kernel cache is not used (for ten leases) lets its lease run out
/// and renews nothing (an idle mount wakes nobody); it is still called back meanwhile; its next
/// look takes a new lease, and nothing read under the old one gets a lifetime in the
/// kernel from the new one.
#[test]
fn an_idle_client_lets_its_lease_run_out_and_its_next_look_takes_a_new_one() {
    const LEASE_MS: u64 = 100;
    let (cluster, a, b, ino, seen) = file_b_records(14, LEASE_MS);
    let old = wait_for_lease(&b, ino);
    // Idle for long enough that the lease ran out (it is renewed for ten leases
    // after the last use): then no renewal goes out.
    std::thread::sleep(Duration::from_millis(14 * LEASE_MS));
    let granted = leases_granted(&cluster);
    std::thread::sleep(Duration::from_millis(3 * LEASE_MS));
    assert_eq!(
        leases_granted(&cluster),
        granted,
        "an idle client renewed its lease"
    );
    assert_eq!(b.kernel_ttl(Some(old)), Duration::ZERO);
    // Called back while its lease is out; the change waits for nobody.
    seen.lock().unwrap().clear();
    chmod(&a, ino, 0o600);
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "B was not called back");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(*seen.lock().unwrap(), vec![Invalidation::Recall(ino)]);
    // The next look takes a lease again (it asks for one and waits a round trip).
    let deadline = Instant::now() + Duration::from_secs(10);
    let new = loop {
        if let Some(w) = b.watch_for_kernel(&[ino]) {
            if !b.kernel_ttl(Some(w)).is_zero() {
                break w;
            }
        }
        assert!(Instant::now() < deadline, "no new lease within 10 s");
    };
    assert!(leases_granted(&cluster) > granted);
    assert!(b.watched_for_kernel(Some(new), ino));
    assert_eq!(b.getattr(ino).unwrap().mode & 0o7777, 0o600);
    // What was read under the lease that ran out is not handed over under this one.
    assert_eq!(b.kernel_ttl(Some(old)), Duration::ZERO);
}

/// A file a client holds open is watched at a new MDS too: the kernel may read its
/// mapped pages without a call that would watch it again, so after the MDS restarts
/// (its watches gone), another client's writes to the file still call the holder
/// back.
#[test]
fn an_open_file_is_watched_again_after_the_mds_restarts() {
    let (mut cluster, a, b, ino, seen) = file_b_records(15, 200);
    // As the mount's open does: held open, then watched.
    let held = b.open("/f", orion_client::OpenFlags::read(), 0).unwrap();
    b.watch_open_file(ino, true);
    let fd = a
        .open("/f", orion_client::OpenFlags::read_write_create(), 0o644)
        .unwrap();
    let page = [3u8; 4096];
    let before = callbacks_sent(&cluster);
    a.pwrite(fd, 0, &page).unwrap();
    assert!(
        callbacks_sent(&cluster) > before,
        "B holds /f open and watched"
    );
    cluster.restart_mds().unwrap();
    // A's writes reach the new MDS; each calls B back once B watches /f there.
    seen.lock().unwrap().clear();
    let before = callbacks_sent(&cluster);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 0u64;
    while callbacks_sent(&cluster) == before {
        assert!(
            Instant::now() < deadline,
            "no callback to B for a file it holds open, after the MDS restarted"
        );
        a.pwrite(fd, i * 4096, &page).unwrap();
        i += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    // B's kernel dropped what it read of /f before the new watch (B looked nothing
    // up, so only the watch's answer drops it), and was called back about /f.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = seen.lock().unwrap().clone();
        if got.contains(&Invalidation::Inode(ino)) && got.len() >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "B was told {got:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    b.close(held).unwrap();
    a.close(fd).unwrap();
}
