//! Threads sharing one client (a mount's request threads, a program's threads under
//! the preload library): calls on different inodes run on different lanes, so one
//! slow call holds up no other (under optimistic persistence a growth of the lanes
//! waits for it once), calls from many threads at once leave every file as a model
//! of each thread's own calls says, and the lanes grow as threads meet.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orion_client::{Client, FileType, OpenFlags};
use orion_pmem::Mode;
use orion_sim::{store_addr, ClientKind, Cluster, ClusterConfig, MemberId, MDS_ADDR};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn read_all(c: &Client, path: &str) -> Vec<u8> {
    let fd = c.open(path, OpenFlags::read(), 0).unwrap();
    let size = c.fstat(fd).unwrap().size as usize;
    let b = c.pread(fd, 0, size + 1).unwrap();
    c.close(fd).unwrap();
    b
}

/// A client with `lanes` lanes, all in use from the start (each opens at its first
/// call), shared by the test's threads.
fn client_with_lanes(cluster: &Cluster, lanes: usize) -> Arc<Client> {
    let c = cluster.client_with(ClientKind::EXTERNAL, |cfg| {
        cfg.lanes = lanes;
        cfg.lanes_at_start = lanes;
    });
    Arc::new(c.unwrap())
}

/// A strong write waits at the MDS for the store's persist notice; with the store's
/// sends to the MDS slowed down, it takes half a second. Meanwhile another thread's
/// calls on other inodes through the same client finish: they run on other lanes.
/// (With one lane, they wait behind the write and this fails.)
#[test]
fn calls_on_other_inodes_do_not_wait_for_a_slow_write() {
    let mut cluster = Cluster::start(ClusterConfig {
        seed: 3,
        store_mode: Mode::Msync,
        ..Default::default()
    })
    .unwrap();
    // Two lanes, both open before the store slows down (opening one connects to
    // the store, whose thread waits behind its slow sends); a client would open
    // the second only when its threads first meet.
    let c = client_with_lanes(&cluster, 2);
    let fd = c
        .open("/slow", OpenFlags::read_write_create(), 0o644)
        .unwrap();
    c.pwrite(fd, 0, &[1u8; 4096]).unwrap();
    c.mkdir("/d", 0o755).unwrap();
    for i in 0..2 {
        let a = c
            .mknod(&format!("/w{i}"), FileType::Regular, 0o644)
            .unwrap();
        c.getattr(a.ino).unwrap();
    }

    let store = store_addr(MemberId { group: 0, index: 0 });
    let delay = Duration::from_millis(500);
    assert!(cluster.net.slow_posts(&store, MDS_ADDR, Some(delay)));
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (c, done) = (c.clone(), done.clone());
        std::thread::spawn(move || {
            let t = Instant::now();
            let r = c.pwrite(fd, 0, &[2u8; 4096]);
            done.store(true, Ordering::Release);
            (r, t.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    // Path calls (not about one inode): they take whichever lane is free.
    let t = Instant::now();
    c.mkdir("/d/x", 0o755).unwrap();
    c.mknod("/d/f", FileType::Regular, 0o644).unwrap();
    assert_eq!(c.stat("/d/f").unwrap().size, 0);
    assert_eq!(c.readdir("/d").unwrap().len(), 4, "., .., x and f");
    c.unlink("/d/f").unwrap();
    let others = t.elapsed();
    assert!(
        !done.load(Ordering::Acquire),
        "the slow write finished before the other calls ({others:?}): they waited for it"
    );
    assert!(cluster.net.slow_posts(&store, MDS_ADDR, None));
    let (r, took) = writer.join().unwrap();
    r.unwrap();
    assert!(
        took >= delay / 2,
        "the write took {took:?}: the store's notice did not hold it up"
    );
    c.close(fd).unwrap();
    assert_eq!(read_all(&c, "/slow"), vec![2u8; 4096]);
    cluster.stop().unwrap();
}

/// Eight threads write one page each to files of their own whose inode numbers share
/// a residue modulo the lanes, so all eight have one home lane. Their writes must
/// still be under way at once: every page the client sends the store waits until
/// eight wait together (`MockNet::gather_client_posts`), which only calls on eight
/// lanes at once can bring about. (With home lanes alone, the writes take turns on
/// one lane, one page waits at a time, the gathering times out unmet and this
/// fails; no timing is measured.)
#[test]
fn threads_on_files_of_one_home_lane_write_at_once() {
    const THREADS: usize = 8;
    let seed = orion_sim::seed_or(61);
    let mut cluster = Cluster::start(ClusterConfig {
        seed,
        ..Default::default()
    })
    .unwrap();
    let c = client_with_lanes(&cluster, THREADS);
    // Files until one residue has eight, and one of every residue for the warm-up.
    let mut by_residue: BTreeMap<u64, Vec<(String, u64)>> = BTreeMap::new();
    let mut i = 0;
    while by_residue.len() < THREADS || by_residue.values().all(|v| v.len() < THREADS) {
        let path = format!("/f{i}");
        let a = c.mknod(&path, FileType::Regular, 0o644).unwrap();
        by_residue
            .entry(a.ino % THREADS as u64)
            .or_default()
            .push((path, a.ino));
        i += 1;
        assert!(
            i < 1000,
            "seed {seed}: 1000 files and no residue has {THREADS}"
        );
    }
    // Every lane opens, connects to the store and takes a chunk before the posts are
    // gathered: one write on a file of each residue runs on that residue's lane.
    for files in by_residue.values() {
        let fd = c
            .open(&files[0].0, OpenFlags::read_write_create(), 0o644)
            .unwrap();
        c.pwrite(fd, 0, &[0u8; 4096]).unwrap();
        c.close(fd).unwrap();
    }
    let same: Vec<(String, u64)> = by_residue
        .into_values()
        .find(|v| v.len() >= THREADS)
        .unwrap()
        .into_iter()
        .take(THREADS)
        .collect();
    let fds: Vec<_> = same
        .iter()
        .map(|(p, _)| c.open(p, OpenFlags::read_write_create(), 0o644).unwrap())
        .collect();
    let store = store_addr(MemberId { group: 0, index: 0 });
    let gather = cluster
        .net
        .gather_client_posts(&store, THREADS, Duration::from_secs(10))
        .unwrap();
    let start = Arc::new(std::sync::Barrier::new(THREADS));
    let writers: Vec<_> = fds
        .iter()
        .enumerate()
        .map(|(t, &fd)| {
            let (c, start) = (c.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                c.pwrite(fd, 0, &[t as u8 + 1; 4096])
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap().unwrap();
    }
    assert!(
        gather.met(),
        "seed {seed}: at most {} of {THREADS} writes on files {:?} were under way at once",
        gather.most(),
        same.iter().map(|(_, ino)| ino).collect::<Vec<_>>()
    );
    for (t, (fd, (path, _))) in fds.into_iter().zip(&same).enumerate() {
        c.close(fd).unwrap();
        assert_eq!(read_all(&c, path), vec![t as u8 + 1; 4096], "seed {seed}");
    }
    drop(c);
    cluster.stop().unwrap();
}

/// A file whose lane is busy writes on the other lane and keeps to it; when that
/// lane is busy in turn it writes on its first lane again, whose copy of the file
/// this client's own commits on the other lane left behind. That copy is refreshed
/// first (walking on), not used as it was: used as it was, the commit lands past
/// its tail and the copy is dropped. Each lane is held by a write whose page the
/// mock keeps from the store (`gather_client_posts`) until the file's page comes.
#[test]
fn a_file_back_on_a_lane_it_left_refreshes_its_copy_there() {
    let seed = orion_sim::seed_or(62);
    let mut cluster = Cluster::start(ClusterConfig {
        seed,
        ..Default::default()
    })
    .unwrap();
    let c = client_with_lanes(&cluster, 2);
    // x and y share a home lane, z has the other.
    let mut files: Vec<(String, u64)> = Vec::new();
    let (x, y, z) = loop {
        let path = format!("/f{}", files.len());
        let a = c.mknod(&path, FileType::Regular, 0o644).unwrap();
        files.push((path, a.ino));
        let x = &files[0];
        let y = files[1..].iter().find(|f| f.1 % 2 == x.1 % 2);
        let z = files[1..].iter().find(|f| f.1 % 2 != x.1 % 2);
        if let (Some(y), Some(z)) = (y, z) {
            break (x.clone(), y.clone(), z.clone());
        }
    };
    let open = |f: &(String, u64)| c.open(&f.0, OpenFlags::read_write_create(), 0o644).unwrap();
    let (fx, fy, fz) = (open(&x), open(&y), open(&z));
    // Pages go to the one store; the keeper's pings go to the MDS and are not held.
    let store = store_addr(MemberId { group: 0, index: 0 });
    c.pwrite(fx, 0, &[1u8; 4096]).unwrap();
    c.pwrite(fz, 0, &[9u8; 4096]).unwrap();
    // Holds the lane a write on `held` takes while x writes `page` at `at`.
    let write_beside = |held: orion_client::Fd, page: u8, at: u64| {
        let gather = (cluster.net)
            .gather_client_posts(&store, 2, Duration::from_secs(10))
            .unwrap();
        let holder = {
            let c = c.clone();
            std::thread::spawn(move || c.pwrite(held, 0, &[7u8; 4096]))
        };
        // Until the holder's page waits to go to the store, holding its lane.
        while gather.waiting() == 0 && !gather.met() {
            std::thread::sleep(Duration::from_millis(1));
        }
        c.pwrite(fx, at, &[page; 4096]).unwrap();
        holder.join().unwrap().unwrap();
        assert!(
            gather.met(),
            "seed {seed}: x's write waited for the busy lane"
        );
    };
    write_beside(fy, 2, 4096);
    let before = c.stats();
    write_beside(fz, 3, 8192);
    let after = c.stats();
    assert_eq!(
        after.ahead_dropped, before.ahead_dropped,
        "seed {seed}: a copy left behind by the other lane was used as it was"
    );
    assert!(
        after.refetches > before.refetches,
        "seed {seed}: x did not go back to the lane it left (nothing walked on)"
    );
    c.close(fx).unwrap();
    let mut want = vec![1u8; 4096];
    want.extend([2u8; 4096]);
    want.extend([3u8; 4096]);
    assert_eq!(read_all(&c, &x.0), want, "seed {seed}");
    for fd in [fy, fz] {
        c.close(fd).unwrap();
    }
    drop(c);
    cluster.stop().unwrap();
}

/// A chmod by path runs on the first free lane (lane 0), not on the file's (lane 1),
/// and commits to the file there. The file's next whole-page write goes where its
/// copy took that commit, instead of using its own lane's copy as it was, which the
/// write's commit would land past and drop.
#[test]
fn a_file_changed_by_path_on_another_lane_writes_there_next() {
    let seed = orion_sim::seed_or(63);
    let mut cluster = Cluster::start(ClusterConfig {
        seed,
        ..Default::default()
    })
    .unwrap();
    let c = client_with_lanes(&cluster, 2);
    let mut i = 0;
    let x = loop {
        let path = format!("/f{i}");
        if c.mknod(&path, FileType::Regular, 0o644).unwrap().ino % 2 == 1 {
            break path;
        }
        i += 1;
    };
    let fx = c.open(&x, OpenFlags::read_write_create(), 0o644).unwrap();
    c.pwrite(fx, 0, &[1u8; 4096]).unwrap();
    c.pwrite(fx, 0, &[2u8; 4096]).unwrap();
    let before = c.stats();
    c.chmod(&x, 0o600).unwrap();
    c.pwrite(fx, 4096, &[3u8; 4096]).unwrap();
    let after = c.stats();
    assert_eq!(
        after.ahead_dropped, before.ahead_dropped,
        "seed {seed}: the write used a copy the chmod on the other lane left behind"
    );
    c.close(fx).unwrap();
    assert_eq!(c.stat(&x).unwrap().mode & 0o7777, 0o600, "seed {seed}");
    let mut want = vec![2u8; 4096];
    want.extend([3u8; 4096]);
    assert_eq!(read_all(&c, &x), want, "seed {seed}");
    drop(c);
    cluster.stop().unwrap();
}

/// Four threads share one client, each working in a directory of its own (writes at
/// random offsets, truncations, renames, unlinks) and all appending fixed-size
/// records to one shared file; every file must end as the thread's model says, and
/// the shared file must hold every record whole. Pessimistic and optimistic.
#[test]
fn threads_sharing_a_client_leave_every_file_as_modelled() {
    for optimistic in [false, true] {
        let seed = 40 + optimistic as u64;
        let mut cluster = Cluster::start(ClusterConfig {
            seed,
            ..Default::default()
        })
        .unwrap();
        let kind = ClientKind {
            optimistic,
            ..ClientKind::EXTERNAL
        };
        let c = Arc::new(cluster.client_with(kind, |cfg| cfg.lanes = 4).unwrap());
        let log = c
            .open(
                "/log",
                OpenFlags {
                    write: true,
                    create: true,
                    append: true,
                    ..Default::default()
                },
                0o644,
            )
            .unwrap();
        c.close(log).unwrap();
        const THREADS: usize = 4;
        const RECORD: usize = 100;
        const STEPS: usize = 150;
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let c = c.clone();
                std::thread::spawn(move || run_thread(&c, seed, t, STEPS, RECORD))
            })
            .collect();
        let mut models = Vec::new();
        for w in workers {
            models.push(w.join().expect("a worker thread panicked"));
        }
        for (t, model) in models.iter().enumerate() {
            let dir = format!("/t{t}");
            let mut names: Vec<Vec<u8>> = c
                .readdir(&dir)
                .unwrap()
                .into_iter()
                .map(|e| e.name)
                .filter(|n| n != b"." && n != b"..")
                .collect();
            names.sort();
            let want: Vec<Vec<u8>> = model.keys().map(|k| k.as_bytes().to_vec()).collect();
            assert_eq!(names, want, "seed {seed}: the names in {dir}");
            for (name, data) in model {
                let got = read_all(&c, &format!("{dir}/{name}"));
                assert!(
                    got == *data,
                    "seed {seed}: {dir}/{name} differs from its model"
                );
            }
        }
        let log = read_all(&c, "/log");
        assert_eq!(
            log.len(),
            THREADS * STEPS * RECORD,
            "seed {seed}: the log's size"
        );
        let mut seen = vec![0usize; THREADS];
        for rec in log.chunks(RECORD) {
            let t = rec[0] as usize;
            assert!(
                t < THREADS && rec.iter().all(|&b| b == rec[0]),
                "seed {seed}: a torn record in the log"
            );
            seen[t] += 1;
        }
        assert_eq!(
            seen,
            vec![STEPS; THREADS],
            "seed {seed}: records per thread"
        );
        drop(c);
        cluster.stop().unwrap();
    }
}

/// One thread's calls; returns its model of its directory (name → content).
fn run_thread(
    c: &Client,
    seed: u64,
    t: usize,
    steps: usize,
    record: usize,
) -> BTreeMap<String, Vec<u8>> {
    let mut rng = StdRng::seed_from_u64(seed * 100 + t as u64);
    let dir = format!("/t{t}");
    c.mkdir(&dir, 0o755).unwrap();
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let log = c
        .open(
            "/log",
            OpenFlags {
                write: true,
                append: true,
                ..Default::default()
            },
            0,
        )
        .unwrap();
    for step in 0..steps {
        let name = format!("f{}", rng.gen_range(0..6));
        let path = format!("{dir}/{name}");
        let what = rng.gen_range(0..10);
        let ctx = || format!("seed {seed}, thread {t}, step {step}: {path}");
        match what {
            0..=4 => {
                let off = rng.gen_range(0..3 * 4096u64);
                let len = rng.gen_range(1..6000usize);
                let fill = rng.gen::<u8>();
                let fd = c
                    .open(&path, OpenFlags::read_write_create(), 0o644)
                    .unwrap();
                c.pwrite(fd, off, &vec![fill; len])
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                c.close(fd).unwrap();
                let m = model.entry(name).or_default();
                let end = off as usize + len;
                if m.len() < end {
                    m.resize(end, 0);
                }
                m[off as usize..end].fill(fill);
            }
            5 => {
                if let Some(m) = model.get_mut(&name) {
                    let size = rng.gen_range(0..8000usize);
                    let fd = c
                        .open(&path, OpenFlags::read_write_create(), 0o644)
                        .unwrap();
                    c.ftruncate(fd, size as u64)
                        .unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                    c.close(fd).unwrap();
                    m.resize(size, 0);
                }
            }
            6 => {
                if let Some(m) = model.remove(&name) {
                    let to = format!("f{}", rng.gen_range(0..6));
                    c.rename(&path, &format!("{dir}/{to}"))
                        .unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                    model.insert(to, m);
                }
            }
            7 => {
                if model.remove(&name).is_some() {
                    c.unlink(&path).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                }
            }
            _ => {
                if let Some(m) = model.get(&name) {
                    let got = read_all(c, &path);
                    assert!(got == *m, "{}: differs from its model mid-run", ctx());
                }
            }
        }
        c.write(log, &vec![t as u8; record]).unwrap();
    }
    c.close(log).unwrap();
    model
}

/// Every lane holds chunks of its own. When a store runs short, the lanes that sit
/// on unused chunk pages give them back and the write that found it short goes on:
/// a client with four lanes fills the store as far as one with a single lane would.
/// (Without the give-back, the big write fails with ENOSPC at about three quarters.)
#[test]
fn idle_lanes_give_their_pages_back_when_the_store_runs_short() {
    let mut cluster = Cluster::start(ClusterConfig {
        seed: 5,
        ..Default::default()
    })
    .unwrap();
    let c = cluster
        .client_with(ClientKind::EXTERNAL, |cfg| {
            cfg.lanes = 4;
            cfg.lanes_at_start = 4;
            cfg.chunk_pages = 1024;
        })
        .unwrap();
    let free_at_start = c.statfs().unwrap().bfree;
    // Eight one-page files: consecutive inodes, so every lane writes one and takes
    // a chunk of its own.
    for i in 0..8 {
        let fd = c
            .open(&format!("/s{i}"), OpenFlags::read_write_create(), 0o644)
            .unwrap();
        c.pwrite(fd, 0, &[i as u8; 4096]).unwrap();
        c.close(fd).unwrap();
    }
    // Then one file takes 90% of what was free.
    let big_pages = free_at_start * 9 / 10;
    let fd = c
        .open("/big", OpenFlags::read_write_create(), 0o644)
        .unwrap();
    let block = vec![0x5au8; 256 * 4096];
    let mut written = 0u64;
    while written < big_pages {
        let n = (big_pages - written).min(256);
        let at = written * 4096;
        c.pwrite(fd, at, &block[..n as usize * 4096])
            .unwrap_or_else(|e| panic!("writing page {written} of {big_pages}: {e}"));
        written += n;
    }
    c.close(fd).unwrap();
    assert_eq!(c.stat("/big").unwrap().size, big_pages * 4096);
    for i in 0..8 {
        assert_eq!(read_all(&c, &format!("/s{i}")), vec![i as u8; 4096]);
    }
    drop(c);
    cluster.stop().unwrap();
}

/// A client starts with one inode lane, and a single-threaded program keeps to it. A
/// call that finds its inode's lane busy doubles the lanes: with every lane held,
/// what is staged commits, and only then does the mapping change, so an optimistic
/// write staged on the old lane is not left behind a newer one on the new lane.
/// (Without the commit, the other client below reads the file's old page.)
#[test]
fn lanes_grow_when_calls_meet_and_commit_what_is_staged_first() {
    let mut cluster = Cluster::start(ClusterConfig {
        seed: 6,
        store_mode: Mode::Msync,
        ..Default::default()
    })
    .unwrap();
    let optimistic = ClientKind {
        optimistic: true,
        ..ClientKind::EXTERNAL
    };
    let c = Arc::new(
        cluster
            .client_with(optimistic, |cfg| {
                cfg.lanes = 4;
                cfg.stage_ms = 60_000;
            })
            .unwrap(),
    );
    // A file with an odd inode number: on lane 1 once there are two lanes.
    let (mut name, mut fd) = (String::new(), None);
    for i in 0..4 {
        name = format!("/f{i}");
        let f = c
            .open(&name, OpenFlags::read_write_create(), 0o644)
            .unwrap();
        if c.fstat(f).unwrap().ino % 2 == 1 {
            fd = Some(f);
            break;
        }
        c.close(f).unwrap();
    }
    let fd = fd.expect("one of four new files has an odd inode number");
    c.pwrite(fd, 0, &[0u8; 8192]).unwrap();
    let slow = c
        .open("/slow", OpenFlags::read_write_create(), 0o644)
        .unwrap();
    c.pwrite(slow, 0, &[1u8; 4096]).unwrap();
    // Staged, on lane 0 (an overwrite of a whole page).
    c.pwrite(fd, 0, &[1u8; 4096]).unwrap();
    assert!(c.stats().staged_writes >= 1, "the overwrite was staged");
    assert_eq!(c.inode_lanes(), 1, "one thread so far: one lane");

    let store = store_addr(MemberId { group: 0, index: 0 });
    let delay = Duration::from_millis(1000);
    // Each try: a slow call holds lane 0, and this thread's write meets it. The
    // writer has 200 ms to start its call; a try in which it had not (a very busy
    // machine) grows nothing, and the next one tries again.
    for tries in 1.. {
        assert!(tries <= 5, "the calls never met in {} tries", tries - 1);
        assert!(cluster.net.slow_posts(&store, MDS_ADDR, Some(delay)));
        let writer = {
            let c = c.clone();
            // A partial write commits at once and waits for the store's notice,
            // on lane 0.
            std::thread::spawn(move || c.pwrite(slow, 10, &[2u8; 100]))
        };
        std::thread::sleep(Duration::from_millis(200));
        // Lane 0 is busy: this write doubles the lanes, then runs on lane 1.
        c.pwrite(fd, 4096, &[3u8; 4096]).unwrap();
        assert!(cluster.net.slow_posts(&store, MDS_ADDR, None));
        writer.join().unwrap().unwrap();
        if c.inode_lanes() == 2 {
            break;
        }
    }
    let own = c.pread(fd, 0, 8192).unwrap();
    assert!(
        own[..4096].iter().all(|&b| b == 1),
        "the file's own writer reads page 0"
    );
    assert!(
        own[4096..].iter().all(|&b| b == 3),
        "and page 1, from its new lane"
    );

    let other = cluster.client_with(ClientKind::EXTERNAL, |_| {}).unwrap();
    // The byte every byte of the first page holds (None: they differ).
    let page = |c: &Client| {
        let f = c.open(&name, OpenFlags::read(), 0).unwrap();
        let b = c.pread(f, 0, 4096).unwrap();
        c.close(f).unwrap();
        (b.len() == 4096 && b.iter().all(|&x| x == b[0])).then(|| b[0])
    };
    assert_eq!(
        page(&other),
        Some(1),
        "the staged write committed at the growth"
    );
    c.pwrite(fd, 0, &[4u8; 4096]).unwrap();
    c.fsync(fd).unwrap();
    assert_eq!(
        c.pread(fd, 0, 1).unwrap(),
        vec![4u8],
        "its writer reads it back"
    );
    assert_eq!(page(&other), Some(4), "the newer write, from lane 1, wins");
    c.close(fd).unwrap();
    c.close(slow).unwrap();
    drop(other);
    drop(c);
    cluster.stop().unwrap();
}
