//! A file one client holds open outlives another client's unlink (or rename over it)
//! until its last descriptor closes (POSIX), through the open tables the MDS keeps
//! for its clients (design note 58): reads and writes through the descriptor keep
//! working, `fstat` says the link count is 0, and the inode is destroyed once the
//! holder closes it. Opens racing with unlinks either fail with ENOENT or get a
//! file that stays whole.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use orion_client::{Client, OpenFlags};
use orion_sim::{free_inodes, wait_free_inodes, ClientKind, Cluster, ClusterConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn rw() -> OpenFlags {
    OpenFlags {
        read: true,
        write: true,
        ..Default::default()
    }
}

fn make(c: &Client, path: &str, data: &[u8]) {
    let flags = OpenFlags {
        create: true,
        ..rw()
    };
    let fd = c.open(path, flags, 0o644).unwrap();
    c.pwrite(fd, 0, data).unwrap();
    c.close(fd).unwrap();
}

fn read_all(c: &Client, path: &str) -> Vec<u8> {
    let fd = c.open(path, OpenFlags::read(), 0).unwrap();
    let b = c.pread(fd, 0, 1 << 20).unwrap();
    c.close(fd).unwrap();
    b
}

/// A new MDS destroys no unlinked file until the clients its pool names as holders
/// wrote their tables again: a probe file's unlink shows when it has begun to.
/// Returns the free inodes then.
fn free_after_probe(c: &Client) -> u64 {
    let before = free_inodes(c);
    make(c, "/probe", b"");
    c.unlink("/probe").unwrap();
    wait_free_inodes(c, before);
    before
}

#[test]
fn another_clients_unlink_and_rename_leave_open_files_usable_until_closed() {
    let mut cluster = Cluster::start(ClusterConfig::default()).unwrap();
    let a = cluster.client(ClientKind::EXTERNAL).unwrap();
    let b = cluster.client(ClientKind::EXTERNAL).unwrap();
    let before = free_after_probe(&a);
    make(&a, "/f", b"hello");
    make(&a, "/g", b"old g");
    make(&b, "/h", b"new g");
    let f = a.open("/f", rw(), 0).unwrap();
    let g = a.open("/g", OpenFlags::read(), 0).unwrap();

    b.unlink("/f").unwrap();
    b.rename("/h", "/g").unwrap();
    assert_eq!(b.stat("/f").unwrap_err().errno(), libc::ENOENT);
    assert_eq!(read_all(&b, "/g"), b"new g");
    // What A holds is the unlinked file, and the one renamed over.
    assert_eq!(a.fstat(f).unwrap().nlink, 0);
    assert_eq!(a.pread(f, 0, 100).unwrap(), b"hello");
    a.pwrite(f, 5, b" world").unwrap();
    a.fsync(f).unwrap();
    assert_eq!(a.pread(f, 0, 100).unwrap(), b"hello world");
    assert_eq!(a.fstat(g).unwrap().nlink, 0);
    assert_eq!(a.pread(g, 0, 100).unwrap(), b"old g");

    // Three files are alive (/g and the two A holds): the orphans wait for A (the
    // MDS looks at a held orphan again after 10 ms, then 20, 40...).
    thread::sleep(Duration::from_millis(100));
    assert_eq!(free_inodes(&b), before - 3);
    a.close(f).unwrap();
    wait_free_inodes(&b, before - 2);
    a.close(g).unwrap();
    wait_free_inodes(&b, before - 1);
    b.unlink("/g").unwrap();
    wait_free_inodes(&b, before);
    drop((a, b));
    cluster.stop().unwrap();
    cluster.fsck().unwrap();
}

/// Client A opens and reads files while B unlinks them, in a seeded order: each open
/// either fails with ENOENT (the unlink came first) or reads the file whole until it
/// closes, and every inode is destroyed in the end.
fn unlinker_done(t: &thread::JoinHandle<()>) {
    while !t.is_finished() {
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn opens_racing_with_unlinks_get_whole_files_or_enoent() {
    let seed: u64 = std::env::var("SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(11);
    eprintln!("seed {seed} (SIM_SEED to repeat)");
    let mut cluster = Cluster::start(ClusterConfig {
        seed,
        ..Default::default()
    })
    .unwrap();
    let a = Arc::new(cluster.client(ClientKind::EXTERNAL).unwrap());
    let b = Arc::new(cluster.client(ClientKind::EXTERNAL).unwrap());
    let before = free_after_probe(&a);
    const FILES: usize = 120;
    let content = |i: usize| format!("file {i} ").repeat(100 + i).into_bytes();
    a.mkdir("/r", 0o755).unwrap();
    for i in 0..FILES {
        make(&a, &format!("/r/{i}"), &content(i));
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let order: Vec<usize> = {
        let mut v: Vec<usize> = (0..FILES).collect();
        for i in (1..v.len()).rev() {
            v.swap(i, rng.gen_range(0..=i));
        }
        v
    };
    // Held across every unlink: these must stay whole.
    let held: Vec<_> = (0..20)
        .map(|i| (i, a.open(&format!("/r/{i}"), OpenFlags::read(), 0).unwrap()))
        .collect();
    let unlinker = {
        let b = b.clone();
        let order = order.clone();
        thread::spawn(move || {
            for i in order {
                b.unlink(&format!("/r/{i}")).unwrap();
            }
        })
    };
    let (mut opened, mut missed) = (0, 0);
    for round in 0..4 {
        if round == 3 {
            // Every name is gone now: each open must say so.
            unlinker_done(&unlinker);
        }
        for i in 0..FILES {
            let path = format!("/r/{}", (i * 7 + round) % FILES);
            let want = content((i * 7 + round) % FILES);
            let fd = match a.open(&path, OpenFlags::read(), 0) {
                Ok(fd) => fd,
                Err(e) => {
                    assert_eq!(e.errno(), libc::ENOENT, "open {path}: {e}");
                    missed += 1;
                    continue;
                }
            };
            opened += 1;
            for _ in 0..3 {
                assert_eq!(a.pread(fd, 0, want.len() + 1).unwrap(), want, "{path}");
                thread::yield_now();
            }
            a.close(fd).unwrap();
        }
    }
    unlinker.join().unwrap();
    eprintln!("{opened} opens read whole files, {missed} found the name gone");
    assert!(missed >= FILES, "the last round found names: {missed}");
    for (i, fd) in held {
        assert_eq!(a.fstat(fd).unwrap().nlink, 0);
        assert_eq!(a.pread(fd, 0, 1 << 20).unwrap(), content(i));
        a.close(fd).unwrap();
    }
    wait_free_inodes(&b, before - 1);
    drop((a, b));
    cluster.stop().unwrap();
    cluster.fsck().unwrap();
}

/// A new MDS starts with empty open tables: each client writes its table again when
/// it says hello to it, and the MDS destroys no unlinked file before the clients its
/// pool names as holders did. A client that makes no call has its keeper thread say hello.
/// So a file A holds open, making no call, stays A's through a restart of the MDS
/// and an unlink by B after it.
#[test]
fn an_open_file_outlives_an_mds_restart_and_an_unlink_after_it() {
    let mut cluster = Cluster::start(ClusterConfig::default()).unwrap();
    let a = cluster.client(ClientKind::EXTERNAL).unwrap();
    let b = cluster.client(ClientKind::EXTERNAL).unwrap();
    make(&a, "/f", b"kept through a restart");
    let f = a.open("/f", OpenFlags::read(), 0).unwrap();
    cluster.restart_mds().unwrap();
    b.unlink("/f").unwrap();
    let free = free_after_probe(&b);
    assert_eq!(a.pread(f, 0, 100).unwrap(), b"kept through a restart");
    assert_eq!(a.fstat(f).unwrap().nlink, 0);
    a.close(f).unwrap();
    wait_free_inodes(&b, free + 1);
    drop((a, b));
    cluster.stop().unwrap();
    cluster.fsck().unwrap();
}

/// An unlinked file a client holds open outlives the MDS's restart too: recovery
/// keeps an unlinked file (link count 0) for its holders instead of reclaiming it,
/// and the new MDS destroys it once no table names it.
#[test]
fn an_unlinked_open_file_outlives_an_mds_restart() {
    let mut cluster = Cluster::start(ClusterConfig::default()).unwrap();
    let a = cluster.client(ClientKind::EXTERNAL).unwrap();
    let b = cluster.client(ClientKind::EXTERNAL).unwrap();
    let before = free_after_probe(&a);
    make(&a, "/f", b"unlinked, then restarted");
    make(&a, "/g", b"unlinked, closed, restarted");
    let f = a.open("/f", rw(), 0).unwrap();
    let g = a.open("/g", OpenFlags::read(), 0).unwrap();
    b.unlink("/f").unwrap();
    b.unlink("/g").unwrap();
    // The MDS loses power and recovers; A's close of /g is its first call since,
    // which gives the new MDS A's table (without /g).
    cluster.crash_mds().unwrap();
    a.close(g).unwrap();
    wait_free_inodes(&b, before - 1);
    assert_eq!(a.fstat(f).unwrap().nlink, 0);
    assert_eq!(a.pread(f, 0, 100).unwrap(), b"unlinked, then restarted");
    a.pwrite(f, 0, b"UNLINKED").unwrap();
    assert_eq!(a.pread(f, 0, 100).unwrap(), b"UNLINKED, then restarted");
    a.close(f).unwrap();
    wait_free_inodes(&b, before);
    drop((a, b));
    cluster.stop().unwrap();
    cluster.fsck().unwrap();
}

/// The same through a fail-over: the mirror that takes over keeps the file A holds
/// open that B unlinked before (its recovery keeps unlinked files), gets A's table
/// from A's keeper, and keeps the file B unlinks after the fail-over too.
#[test]
fn open_files_outlive_a_fail_over_and_unlinks_on_either_side_of_it() {
    let mut cluster = orion_sim::MirroredCluster::start(5).unwrap();
    let a = cluster.client().unwrap();
    let b = cluster.client().unwrap();
    let before = free_after_probe(&a);
    make(&a, "/before", b"unlinked before the fail-over");
    make(&a, "/after", b"unlinked after the fail-over");
    let f = a.open("/before", OpenFlags::read(), 0).unwrap();
    let g = a.open("/after", rw(), 0).unwrap();
    b.unlink("/before").unwrap();
    let p = cluster.wait_any_primary(Duration::from_secs(20)).unwrap();
    let mirror = orion_sim::MDSS[1 - p].0;
    cluster
        .wait_in_sync(mirror, Duration::from_secs(30))
        .unwrap();
    let ((), _) = cluster
        .fault_during(orion_sim::MdsFault::Kill, Duration::ZERO, || ())
        .unwrap();
    b.unlink("/after").unwrap();
    assert_eq!(free_after_probe(&b), before - 2);
    assert_eq!(
        a.pread(f, 0, 100).unwrap(),
        b"unlinked before the fail-over"
    );
    assert_eq!(a.pread(g, 0, 100).unwrap(), b"unlinked after the fail-over");
    assert_eq!(a.fstat(f).unwrap().nlink, 0);
    a.close(f).unwrap();
    a.close(g).unwrap();
    wait_free_inodes(&b, before);
    drop((a, b));
    cluster.stop().unwrap();
    cluster.fsck().unwrap();
}

/// More files open than a table has words (1024 buckets of 8): the inodes of full
/// buckets go to the MDS's overflow set by request, and are kept as the table's
/// are, through a power loss of the MDS too (the client writes its table whole,
/// overflow set included, to the recovered MDS).
#[test]
fn files_past_a_tables_words_are_kept_by_request() {
    const FILES: usize = 8192 + 300;
    let mut cluster = Cluster::start(ClusterConfig {
        mds_pool: 128 << 20,
        store_pool: 128 << 20,
        ..Default::default()
    })
    .unwrap();
    let a = cluster.client(ClientKind::EXTERNAL).unwrap();
    let b = cluster.client(ClientKind::EXTERNAL).unwrap();
    let before = free_after_probe(&a);
    a.mkdir("/many", 0o755).unwrap();
    let create = OpenFlags {
        create: true,
        ..rw()
    };
    let fds: Vec<_> = (0..FILES)
        .map(|i| {
            let fd = a.open(&format!("/many/{i}"), create, 0o644).unwrap();
            a.pwrite(fd, 0, format!("file {i}").as_bytes()).unwrap();
            fd
        })
        .collect();
    cluster.crash_mds().unwrap();
    for i in 0..FILES {
        b.unlink(&format!("/many/{i}")).unwrap();
    }
    b.rmdir("/many").unwrap();
    // The directory goes at a sweep (nobody holds it): sweeps have begun.
    wait_free_inodes(&b, before - FILES as u64);
    for (i, fd) in fds.into_iter().enumerate() {
        let got = a
            .pread(fd, 0, 64)
            .unwrap_or_else(|e| panic!("file {i}: {e}; free {}", free_inodes(&b)));
        assert_eq!(got, format!("file {i}").as_bytes());
        a.close(fd).unwrap();
    }
    wait_free_inodes(&b, before);
    drop((a, b));
    cluster.stop().unwrap();
    cluster.fsck().unwrap();
}

/// A directory another client removes stays for the one that holds it open, as on
/// Linux: `fstat` through the descriptor says the link count is 0, while listing it
/// and making a name in it say ENOENT (a dead directory); rmdir and a rename over
/// an empty directory both keep it so. It is destroyed at the close.
#[test]
fn a_removed_directory_stays_for_fstat_until_closed() {
    let mut cluster = Cluster::start(ClusterConfig::default()).unwrap();
    let a = cluster.client(ClientKind::EXTERNAL).unwrap();
    let b = cluster.client(ClientKind::EXTERNAL).unwrap();
    let before = free_after_probe(&a);
    a.mkdir("/d", 0o755).unwrap();
    a.mkdir("/e", 0o755).unwrap();
    a.mkdir("/moved", 0o755).unwrap();
    let d = a.open("/d", OpenFlags::read(), 0).unwrap();
    let e = a.open("/e", OpenFlags::read(), 0).unwrap();
    let (d_ino, e_ino) = (a.fstat(d).unwrap().ino, a.fstat(e).unwrap().ino);
    b.rmdir("/d").unwrap();
    b.rename("/moved", "/e").unwrap();
    for (fd, ino) in [(d, d_ino), (e, e_ino)] {
        let st = a.fstat(fd).unwrap();
        assert_eq!((st.nlink, st.ino), (0, ino), "held through its removal");
        let listed = a.readdir_ino(ino).map(|_| ());
        assert_eq!(
            listed.unwrap_err().errno(),
            libc::ENOENT,
            "listing a dead dir"
        );
        let node = orion_client::NewNode::new(orion_client::FileType::Regular, 0o644, 0, 0);
        let made = a.create_at(ino, b"x", node, None).map(|_| ());
        assert_eq!(
            made.unwrap_err().errno(),
            libc::ENOENT,
            "a name in a dead dir"
        );
    }
    // Three directories made, one left ("/e" is the one moved there).
    a.close(d).unwrap();
    assert_eq!(a.fstat(e).unwrap().nlink, 0, "the other is still held");
    a.close(e).unwrap();
    wait_free_inodes(&b, before - 1);
    assert_eq!(b.readdir("/").unwrap().len(), 3, ". .. e");
    drop((a, b));
    cluster.stop().unwrap();
    cluster.fsck().unwrap();
}
