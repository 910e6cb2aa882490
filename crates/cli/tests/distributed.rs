//! Distributed Orion as separate processes: an MDS, data stores and clients on
//! loopback, over shared memory and over libfabric's tcp provider.

mod cluster;

use std::collections::BTreeMap;
use std::time::Duration;

use cluster::{Cluster, BACKENDS};
use orion_client::{Client, OpenFlags};
use orion_fabric::{Access, Domain};
use orion_format::{Entry, FileType, Gpa, WriteRec};
use orion_proto::{Channel, Commit, Create, Hello, MdsRequest, Reply, ReplyBody, MAX_WATCHED};
use rand::{Rng, SeedableRng};

fn seed() -> u64 {
    std::env::var("ORION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x4F52_494F)
}

fn put(c: &Client, path: &str, data: &[u8]) {
    let fd = c.open(path, OpenFlags::create(), 0o644).unwrap();
    assert_eq!(c.write(fd, data).unwrap(), data.len());
    c.close(fd).unwrap();
}

fn get(c: &Client, path: &str) -> Vec<u8> {
    let fd = c.open(path, OpenFlags::read(), 0).unwrap();
    let size = c.fstat(fd).unwrap().size as usize;
    let b = c.pread(fd, 0, size + 10).unwrap();
    c.close(fd).unwrap();
    b
}

/// The lines `orion fs tree /` prints for a model of the tree.
fn tree_lines(model: &BTreeMap<String, Option<Vec<u8>>>) -> String {
    let mut out = String::new();
    for (path, content) in model {
        match content {
            None => out.push_str(&format!("{path} dir\n")),
            Some(b) => out.push_str(&format!(
                "{path} file {} {:08x}\n",
                b.len(),
                crc32c::crc32c(b)
            )),
        }
    }
    out
}

/// A client connects to a data store only when a transfer first needs it (a
/// connection is a handshake of round trips, which every short process of the
/// preload library would pay): looking at metadata takes none, an internal client
/// maps its own store's pool from the map and never connects to it, and an external
/// reader connects to the one store its pages are on.
#[test]
fn clients_connect_to_a_store_only_when_a_transfer_needs_it() {
    for backend in BACKENDS {
        let c = Cluster::start(backend, 2);
        let a = c.client(true, true);
        assert_eq!(a.internal_group(), Some(0), "{backend}");
        a.mkdir("/d", 0o755).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        put(&a, "/d/f", &data);
        assert_eq!(get(&a, "/d/f"), data, "{backend}");
        assert_eq!(a.stats().store_connections, 0, "{backend}: the own store");
        let b = c.client(true, false);
        assert_eq!(b.stat("/d/f").unwrap().size, data.len() as u64, "{backend}");
        let names: Vec<Vec<u8>> = b
            .readdir("/d")
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert!(names.contains(&b"f".to_vec()), "{backend}: {names:?}");
        assert_eq!(b.stats().store_connections, 0, "{backend}: metadata only");
        assert_eq!(get(&b, "/d/f"), data, "{backend}");
        assert_eq!(b.stats().store_connections, 1, "{backend}: one group read");
        assert!(b.stats().remote_reads > 0, "{backend}");
    }
}

#[test]
fn a_tree_written_by_one_client_process_is_seen_whole_by_another() {
    let seed = seed();
    for backend in BACKENDS {
        let c = Cluster::start(backend, 1);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        for (strong, internal) in [(true, true), (true, false), (false, false)] {
            let a = c.client(strong, internal);
            assert_eq!(a.internal_group(), internal.then_some(0));
            let top = format!("/s{}i{}", strong as u8, internal as u8);
            let mut model = BTreeMap::new();
            a.mkdir(&top, 0o755).unwrap();
            model.insert(top.clone(), None);
            for d in 0..3 {
                let dir = format!("{top}/d{d}");
                a.mkdir(&dir, 0o755).unwrap();
                model.insert(dir.clone(), None);
                for f in 0..4 {
                    let len = [0, 1, 4095, 4096, 4097, 70_000][rng.gen_range(0..6)];
                    let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                    let path = format!("{dir}/f{f}");
                    put(&a, &path, &data);
                    model.insert(path, Some(data));
                }
            }
            // Overwrite inside pages, extend, truncate, rename, unlink.
            let p = format!("{top}/d0/f1");
            let fd = a
                .open(
                    &p,
                    OpenFlags {
                        write: true,
                        ..Default::default()
                    },
                    0,
                )
                .unwrap();
            a.pwrite(fd, 100, b"middle").unwrap();
            a.pwrite(fd, 9000, b"far").unwrap();
            a.close(fd).unwrap();
            let m = model.get_mut(&p).unwrap().as_mut().unwrap();
            if m.len() < 9003 {
                m.resize(9003, 0);
            }
            m[100..106].copy_from_slice(b"middle");
            m[9000..9003].copy_from_slice(b"far");
            a.truncate(&format!("{top}/d0/f2"), 5000).unwrap();
            let m = model
                .get_mut(&format!("{top}/d0/f2"))
                .unwrap()
                .as_mut()
                .unwrap();
            m.resize(5000, 0);
            a.rename(&format!("{top}/d1/f0"), &format!("{top}/d2/moved"))
                .unwrap();
            let v = model.remove(&format!("{top}/d1/f0")).unwrap();
            model.insert(format!("{top}/d2/moved"), v);
            a.unlink(&format!("{top}/d1/f1")).unwrap();
            model.remove(&format!("{top}/d1/f1"));
            assert_eq!(
                get(&a, &p),
                model[&p].clone().unwrap(),
                "{backend}: own read"
            );
            // Another process, an external client, sees exactly this tree.
            let seen = c.fs_ok(&["--external", "tree", &top]);
            let want = tree_lines(
                &model
                    .iter()
                    .filter(|(k, _)| **k != top)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            );
            assert_eq!(
                seen, want,
                "{backend} strong={strong} internal={internal} seed={seed}"
            );
            let cat = c.fs(&["cat", &p]);
            let want = model[&p].clone().unwrap();
            assert!(
                cat.stdout == want,
                "{backend}: cat {p}: {} bytes, want {}: {}",
                cat.stdout.len(),
                want.len(),
                String::from_utf8_lossy(&cat.stderr)
            );
        }
        // An MDS restarted on its pool serves the same tree once its store rejoined.
        let before = c.fs_ok(&["tree", "/"]);
        let mut c = c;
        c.restart_mds();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while c.fs_ok(&["statfs"]).starts_with("blocks 0 ") {
            assert!(
                std::time::Instant::now() < deadline,
                "the store never rejoined"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            c.fs_ok(&["tree", "/"]),
            before,
            "{backend}: after an MDS restart"
        );
    }
}

#[test]
fn concurrent_appends_and_chmods_from_two_processes_converge() {
    let c = Cluster::start("local", 1);
    let a = c.client(true, true);
    a.mkdir("/bar", 0o755).unwrap();
    let procs: Vec<_> = ["A", "B"]
        .iter()
        .map(|tag| {
            let mut args = vec!["fs".to_string(), "--mds".into(), c.mds.addr.clone()];
            args.extend(c.common_flags());
            args.extend(
                [
                    "--stats",
                    "append-records",
                    "/log",
                    "--tag",
                    tag,
                    "--count",
                    "150",
                    "--min-ms",
                    "300",
                    "--barrier",
                    "/bar",
                    "--peers",
                    "2",
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            std::process::Command::new(cluster::ORION)
                .args(&args)
                .env("RUST_LOG", "warn")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut counts = BTreeMap::new();
    let mut arbitrated = 0;
    for p in procs {
        let o = p.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        let out = String::from_utf8_lossy(&o.stdout);
        let mut w = out.split_whitespace();
        let tag = w.next().unwrap().to_string();
        let n: u64 = w.nth(1).unwrap().parse().unwrap();
        counts.insert(tag, n);
        let stats: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap();
        arbitrated +=
            stats["refetches"].as_u64().unwrap() + stats["reexecutions"].as_u64().unwrap();
    }
    assert!(
        arbitrated > 0,
        "two writers of one file must meet in arbitration"
    );
    // Every record is there once, each writer's in its own order.
    let content = String::from_utf8(get(&a, "/log")).unwrap();
    let mut next: BTreeMap<String, u64> = BTreeMap::new();
    for line in content.lines() {
        let bad = || format!("torn record {line:?} in {} bytes", content.len());
        let (tag, n) = line.split_once(' ').unwrap_or_else(|| panic!("{}", bad()));
        let n: u64 = n.parse().unwrap_or_else(|_| panic!("{}", bad()));
        let want = next.entry(tag.to_string()).or_insert(0);
        assert_eq!(n, *want, "records of {tag} out of order or lost");
        *want += 1;
    }
    assert_eq!(next, counts);
    // A fresh client and the first one agree on the inode (the MDS's order).
    let fresh = c.client(true, false);
    assert_eq!(fresh.stat("/log").unwrap(), a.stat("/log").unwrap());
    assert_eq!(get(&fresh, "/log"), content.as_bytes());
}

#[test]
fn an_mds_killed_mid_workload_loses_no_acknowledged_operation() {
    let mut c = Cluster::start("local", 1);
    let client = std::sync::Arc::new(c.client(true, true));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let worker = {
        let (client, done) = (client.clone(), done.clone());
        std::thread::spawn(move || {
            client.mkdir("/w", 0o755).unwrap();
            for i in 0..300u64 {
                let data = format!("file {i} ").repeat(1 + (i as usize % 700));
                put(&client, &format!("/w/f{i}"), data.as_bytes());
                if i % 3 == 0 {
                    client.unlink(&format!("/w/f{}", i / 3)).ok();
                }
                done.store(i + 1, std::sync::atomic::Ordering::SeqCst);
            }
        })
    };
    while done.load(std::sync::atomic::Ordering::SeqCst) < 100 {
        std::thread::sleep(Duration::from_millis(1));
    }
    c.restart_mds();
    worker
        .join()
        .expect("every operation succeeded across the restart");
    assert!(client.stats().reconnects >= 1, "{:?}", client.stats());
    let check = c.client(true, false);
    let names: std::collections::BTreeSet<String> = check
        .readdir("/w")
        .unwrap()
        .into_iter()
        .map(|d| String::from_utf8(d.name).unwrap())
        .filter(|n| n.starts_with('f'))
        .collect();
    for i in 0..300u64 {
        let removed = i < 100; // f{i/3} unlinked at every i divisible by 3
        let name = format!("f{i}");
        assert_eq!(names.contains(&name), !removed, "{name}");
        if !removed {
            let want = format!("file {i} ").repeat(1 + (i as usize % 700));
            assert_eq!(
                get(&check, &format!("/w/{name}")),
                want.as_bytes(),
                "{name}"
            );
        }
    }
}

/// A client that holds a delegated chunk across an MDS restart must not write into
/// it: the restarted MDS freed the chunk's uncommitted pages and may have granted them
/// to a client that reconnected first. (On the local fabric a one-sided read of the
/// MDS pool still works through a dead MDS's connection, so the idle client's first
/// write would not notice the restart before writing its pages.)
#[test]
fn a_client_idle_across_an_mds_restart_overwrites_no_page_of_another() {
    let mut c = Cluster::start("local", 1);
    // One lane: the write below runs on the connection that took the chunk.
    let mut cfg = c.client_config(true, true);
    cfg.lanes = 1;
    let idle = Client::connect(cfg, c.fabric()).unwrap();
    let page = |fill: u8| vec![fill; 4096];
    put(&idle, "/first", &page(1));
    let rw = OpenFlags {
        read: true,
        write: true,
        create: true,
        ..Default::default()
    };
    let fd = idle.open("/late", rw, 0o644).unwrap();
    c.restart_mds();
    let busy = c.client(true, true);
    for i in 0..16u8 {
        put(&busy, &format!("/b{i}"), &page(0x10 + i));
    }
    // The idle client's next write takes pages: not from its old chunk.
    idle.pwrite(fd, 0, &page(0xee)).unwrap();
    idle.close(fd).unwrap();
    for i in 0..16u8 {
        let intact = get(&busy, &format!("/b{i}")) == page(0x10 + i);
        assert!(intact, "/b{i} was overwritten");
    }
    assert!(get(&busy, "/late") == page(0xee), "/late");
    assert!(get(&busy, "/first") == page(1), "/first");
}

/// A raw connection to the MDS that sends whatever the test wants.
fn raw(c: &Cluster) -> (Domain, orion_fabric::CompletionQueue, Channel) {
    let d = Domain::open(c.fabric()).unwrap();
    let cq = d.completion_queue().unwrap();
    let conn = d.connect(&c.mds.addr, &cq).unwrap();
    let ch = Channel::new(&d, conn).unwrap();
    (d, cq, ch)
}

#[track_caller]
fn call(cq: &orion_fabric::CompletionQueue, ch: &mut Channel, id: u64, req: &MdsRequest) -> Reply {
    ch.call(cq, id, req, Duration::from_secs(10), &mut Vec::new())
        .unwrap()
}

#[track_caller]
fn errno_of(r: Reply) -> (i32, String) {
    match r {
        Reply::Err { errno, message } => (errno, message),
        Reply::Ok(b) => panic!("expected an error, got {b:?}"),
    }
}

#[test]
fn bad_input_is_refused_with_an_error_and_the_mds_keeps_serving() {
    let c = Cluster::start("local", 1);
    let good = c.client(true, false);
    put(&good, "/before", b"x");
    let (d, cq, mut ch) = raw(&c);
    // Garbage: a malformed message gets an error reply, not a crash.
    let scratch = d.alloc_region(64, Access::LOCAL).unwrap();
    scratch.write(0, &[0xAB; 40]).unwrap();
    let mut other = Vec::new();
    ch.conn.post_send(77, &scratch, 0, 40).unwrap();
    // The reply to garbage carries request id 0.
    let r = ch
        .call(
            &cq,
            0,
            &MdsRequest::Ping,
            Duration::from_secs(10),
            &mut other,
        )
        .unwrap();
    assert!(
        matches!(&r, Reply::Err { errno, .. } if *errno == libc::EPROTO),
        "{r:?}"
    );
    // Requests before hello are refused.
    let (e, m) = errno_of(call(&cq, &mut ch, 1, &MdsRequest::Statfs));
    assert_eq!(e, libc::EIO, "{m}");
    assert!(m.contains("hello"), "{m}");
    // A client of another host is told no store's pool file (it could map none);
    // one of the stores' host is told theirs, with each pool's identity.
    let hello = |host| Hello {
        internal: None,
        strong: true,
        name: "test".into(),
        nonce: 1,
        instance: 1,
        host,
    };
    let Reply::Ok(ReplyBody::Hello(h)) = call(&cq, &mut ch, 2, &MdsRequest::Hello(hello([9; 16])))
    else {
        panic!("no hello")
    };
    assert!(
        h.stores.iter().all(|s| s.pool_path.is_empty()),
        "{:?}",
        h.stores
    );
    let here = orion_proto::this_host();
    let Reply::Ok(ReplyBody::Hello(h)) = call(&cq, &mut ch, 100, &MdsRequest::Hello(hello(here)))
    else {
        panic!("no hello")
    };
    assert!(!h.stores.is_empty());
    for s in &h.stores {
        assert!(s.pool_path.starts_with('/'), "{s:?}");
        assert_ne!(s.pool_uuid, [0; 16], "{s:?}");
    }
    let epoch = h.epoch;
    // An unknown inode.
    let w = |gpa| {
        Entry::Write(WriteRec {
            pgoff: 0,
            npages: 1,
            gpa,
            size: 10,
            mtime: 1,
        })
    };
    // Every inode of a fresh pool is of generation 1.
    let commit = |ino, gpa| {
        MdsRequest::Commit(Commit {
            ino,
            generation: 1,
            expect: None,
            persisted_locally: false,
            written_epoch: epoch,
            entries: vec![w(gpa)],
        })
    };
    let (e, _) = errno_of(call(&cq, &mut ch, 3, &commit(99_999, Gpa::new(0, 5))));
    assert_eq!(e, libc::ENOENT);
    // A page outside any chunk of this connection (a grant revoked by a reconnection
    // looks the same: the client writes the data again into a fresh chunk).
    let ino = good.stat("/before").unwrap().ino;
    let (e, _) = errno_of(call(&cq, &mut ch, 4, &commit(ino, Gpa::new(0, 5))));
    assert_eq!(e, libc::EKEYREVOKED);
    // Pages given back that are not this connection's, or a run of no pages or of
    // more than any chunk: refused, and nothing is freed.
    let give_back = |runs: Vec<(Gpa, u32)>| MdsRequest::ReturnPages { runs };
    let (e, _) = errno_of(call(
        &cq,
        &mut ch,
        40,
        &give_back(vec![(Gpa::new(0, 5), 1)]),
    ));
    assert_eq!(e, libc::EKEYREVOKED);
    for (id, n) in [(41, 0), (42, u32::MAX)] {
        let (e, _) = errno_of(call(
            &cq,
            &mut ch,
            id,
            &give_back(vec![(Gpa::new(0, 5), n)]),
        ));
        assert_eq!(e, libc::EINVAL, "a run of {n} pages");
    }
    // Watches without a callback connection; too many at once (refused by the
    // decoder, the connection stays).
    let watch = |n: usize| MdsRequest::Watch {
        inos: (1..=n as u64).collect(),
    };
    let (e, _) = errno_of(call(&cq, &mut ch, 43, &watch(1)));
    assert_eq!(e, libc::ENOTCONN);
    let (e, _) = errno_of(call(&cq, &mut ch, 44, &watch(MAX_WATCHED + 1)));
    assert_eq!(e, libc::EPROTO);
    // This connection becomes the client's callback connection: then it may watch.
    let Reply::Ok(ReplyBody::Lease { ms }) = call(
        &cq,
        &mut ch,
        45,
        &MdsRequest::CacheLease {
            keep_watches: false,
        },
    ) else {
        panic!("no lease")
    };
    assert!(ms > 0);
    assert_eq!(
        call(&cq, &mut ch, 46, &watch(3)),
        Reply::Ok(ReplyBody::Empty)
    );
    // A page of a chunk that is this client's, then the same page again.
    let Reply::Ok(ReplyBody::Chunk { start, .. }) = call(
        &cq,
        &mut ch,
        5,
        &MdsRequest::AllocChunk {
            group: None,
            pages: 4,
        },
    ) else {
        panic!("no chunk")
    };
    // A name too long, a directory entry by log commit.
    let create = MdsRequest::Create(Create {
        parent: 1,
        name: vec![b'n'; 300],
        ftype: orion_format::FileType::Regular,
        mode: 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
        symlink: None,
    });
    let (e, _) = errno_of(call(&cq, &mut ch, 7, &create));
    assert_eq!(e, libc::ENAMETOOLONG);
    let dir_entry = MdsRequest::Commit(Commit {
        ino: 1,
        generation: 1,
        expect: None,
        persisted_locally: false,
        written_epoch: epoch,
        entries: vec![Entry::LinkChange { nlink: 1, ctime: 0 }],
    });
    let (e, m) = errno_of(call(&cq, &mut ch, 8, &dir_entry));
    assert_eq!(e, libc::EIO);
    assert!(m.contains("RPC"), "{m}");
    // A conditional commit on a stale tail.
    let stale = MdsRequest::Commit(Commit {
        ino,
        generation: 1,
        expect: Some(orion_format::Tail {
            version: 0,
            offset: 64,
        }),
        persisted_locally: false,
        written_epoch: epoch,
        entries: vec![Entry::SetAttr(Default::default())],
    });
    let (e, _) = errno_of(call(&cq, &mut ch, 9, &stale));
    assert_eq!(e, libc::ESTALE);
    // An unconditional write to a page of this client's chunk, built for another file
    // that once had this inode number.
    let reused = MdsRequest::Commit(Commit {
        ino,
        generation: 2,
        expect: None,
        persisted_locally: false,
        written_epoch: epoch,
        entries: vec![w(start)],
    });
    let (e, _) = errno_of(call(&cq, &mut ch, 10, &reused));
    assert_eq!(e, libc::ESTALE);
    // Pages written under a cluster map older than the stores that take writes now:
    // refused, for the client to write them again.
    let before = MdsRequest::Commit(Commit {
        ino,
        generation: 1,
        expect: None,
        persisted_locally: false,
        written_epoch: 0,
        entries: vec![w(start)],
    });
    let (e, _) = errno_of(call(&cq, &mut ch, 11, &before));
    assert_eq!(e, libc::EREMCHG);
    drop(ch);
    // A client of another epoch or without the secret does not get in.
    let mut f = c.fabric();
    f.epoch = 7;
    let err = Client::connect(c.client_config(true, false), f)
        .err()
        .expect("stale epoch refused");
    assert!(err.to_string().contains("epoch"), "{err}");
    let mut f = c.fabric();
    f.secret = orion_fabric::Secret::generate();
    assert!(Client::connect(c.client_config(true, false), f).is_err());
    // And the MDS serves others as before.
    put(&good, "/after", b"still here");
    assert_eq!(get(&good, "/after"), b"still here");
    assert_eq!(get(&good, "/before"), b"x");
}

#[test]
fn daemons_explain_missing_foreign_and_misplaced_pools() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, orion_fabric::Secret::generate().expose()).unwrap();
    let run = |args: &[&str]| {
        let o = std::process::Command::new(cluster::ORION)
            .args(args)
            .args([
                "--secret-file",
                secret.to_str().unwrap(),
                "--backend",
                "local",
            ])
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let missing = dir.path().join("nope.pool");
    let (code, err) = run(&[
        "mds",
        "--pool",
        missing.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("does not exist") && err.contains("--format"),
        "{err}"
    );
    // A data store whose pool joined one cluster is refused by another cluster's MDS.
    let c1 = Cluster::start("local", 1);
    let c2 = Cluster::start("local", 0);
    let pool = c1.dir.path().join("ds0.pool");
    let o = std::process::Command::new(cluster::ORION)
        .args([
            "ds",
            "--pool",
            pool.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--mds",
            &c2.mds.addr,
        ])
        .args(c2.common_flags())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("another cluster"), "{err}");
    // The MDS pool given to a data store is named for what it is.
    let mds_pool = c1.dir.path().join("mds.pool");
    let (code, err) = run(&[
        "ds",
        "--pool",
        mds_pool.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("MDS pool, not a data pool"), "{err}");
    // A data pool whose superblock is damaged, or whose file lost its end, is refused
    // before it joins, with what is wrong (a copy: c1's store still serves its own).
    let copy = |name: &str| {
        let p = dir.path().join(name);
        std::fs::copy(c1.dir.path().join("ds0.pool"), &p).unwrap();
        p
    };
    let damaged = copy("damaged.pool");
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&damaged)
            .unwrap();
        f.seek(SeekFrom::Start(100)).unwrap();
        f.write_all(b"garbage!").unwrap();
    }
    let truncated = copy("truncated.pool");
    let len = std::fs::metadata(&truncated).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&truncated)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    for (pool, why) in [
        (&damaged, "is damaged: checksum mismatch"),
        (&truncated, "the pool was truncated"),
    ] {
        let (code, err) = run(&[
            "ds",
            "--pool",
            pool.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--mds",
            &c1.mds.addr,
        ]);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains(why), "{err}");
    }
    // SIGTERM stops a daemon cleanly.
    let mut c1 = c1;
    let status = c1.stores[0].terminate().expect("stopped within 10 s");
    assert!(status.success(), "{status:?}: {}", c1.stores[0].log_text());
    let status = c1.mds.terminate().expect("stopped within 10 s");
    assert!(status.success(), "{status:?}: {}", c1.mds.log_text());
}

#[test]
fn a_request_asked_about_after_a_broken_connection_is_answered_once_not_run_again() {
    let c = Cluster::start("local", 1);
    let hello = |nonce| {
        MdsRequest::Hello(Hello {
            internal: None,
            strong: true,
            name: "retry".into(),
            nonce,
            instance: nonce,
            host: [0; 16],
        })
    };
    let create = MdsRequest::Create(Create {
        parent: 1,
        name: b"once".to_vec(),
        ftype: FileType::Regular,
        mode: 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
        symlink: None,
    });
    let (_d, cq, mut ch) = raw(&c);
    call(&cq, &mut ch, 1, &hello(42));
    let first = call(&cq, &mut ch, 7, &create);
    assert!(matches!(first, Reply::Ok(ReplyBody::Attr(_))), "{first:?}");
    // The connection breaks before the client saw the answer; on a new one, under the
    // same nonce, it asks what became of request 7: the answer it missed.
    ch.conn.close();
    let (_d2, cq2, mut ch2) = raw(&c);
    call(&cq2, &mut ch2, 1, &hello(42));
    assert_eq!(
        call(&cq2, &mut ch2, 2, &MdsRequest::Outcome { id: 7 }),
        first
    );
    // Sent again under its id (its operation ran again after a later step broke):
    // the same answer, not a second run (which would say EEXIST).
    assert_eq!(call(&cq2, &mut ch2, 7, &create), first);
    // A request never sent, or another client's, is unknown: the client runs it again.
    let unknown = Reply::Ok(ReplyBody::Unknown);
    assert_eq!(
        call(&cq2, &mut ch2, 3, &MdsRequest::Outcome { id: 8 }),
        unknown
    );
    let (_d3, cq3, mut ch3) = raw(&c);
    call(&cq3, &mut ch3, 1, &hello(43));
    assert_eq!(
        call(&cq3, &mut ch3, 2, &MdsRequest::Outcome { id: 7 }),
        unknown
    );
    // Running it again would have failed: the file exists once.
    let (e, _) = errno_of(call(&cq2, &mut ch2, 4, &create));
    assert_eq!(e, libc::EEXIST);
    // A failed request that changes state is remembered too, with its error.
    assert_eq!(
        errno_of(call(&cq2, &mut ch2, 5, &MdsRequest::Outcome { id: 4 })).0,
        libc::EEXIST
    );
}
