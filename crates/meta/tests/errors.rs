//! Bad input and full pools: clear errors, nothing lost, the file system consistent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use orion_meta::{
    EngineConfig, LocalConfig, LocalFs, LogicalClock, RenameMode, SetAttrReq, ROOT_INO,
};
use orion_pmem::ModeChoice;

fn fresh(size: u64) -> (tempfile::TempDir, std::path::PathBuf, LocalFs) {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("fs");
    drop(LocalFs::mkfs(&path, size, ModeChoice::Auto, 1).unwrap());
    let (fs, _) = LocalFs::open_path(
        &path,
        Arc::new(LogicalClock::new(1)),
        &LocalConfig::default(),
    )
    .unwrap();
    (dir, path, fs)
}

#[test]
fn full_pools_give_enospc_and_stay_consistent() {
    let (_dir, path, fs) = fresh(2 << 20);
    // Fill the data pool.
    let mut files = Vec::new();
    let chunk = vec![0xabu8; 40_000];
    let err = loop {
        let name = format!("f{}", files.len());
        let ino = match fs.create(ROOT_INO, name.as_bytes(), 0o644, 0, 0) {
            Ok(a) => a.ino,
            Err(e) => break e,
        };
        match fs.write(ino, 0, &chunk) {
            Ok(_) => files.push(ino),
            Err(e) => break e,
        }
    };
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(err.to_string().contains("no free data pages"), "{err}");
    assert!(files.len() > 5);
    for &f in &files {
        assert_eq!(
            fs.read(f, 0, chunk.len()).unwrap(),
            chunk,
            "data written before the pool filled"
        );
    }
    assert!(fs.check().is_clean(), "{:?}", fs.check().problems);
    // Fill the inode table and log pages with empty files and directories.
    let mut n = 0;
    let err = loop {
        let r = if n % 2 == 0 {
            fs.create(ROOT_INO, format!("e{n}").as_bytes(), 0o644, 0, 0)
        } else {
            fs.mkdir(ROOT_INO, format!("e{n}").as_bytes(), 0o755, 0, 0)
        };
        match r {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(err.errno(), libc::ENOSPC);
    assert!(fs.check().is_clean(), "{:?}", fs.check().problems);
    // Removing still works on a full file system, and frees room.
    fs.unlink(ROOT_INO, b"f0").unwrap();
    fs.rmdir(ROOT_INO, b"e1").unwrap();
    fs.setattr(
        files[1],
        &SetAttrReq {
            size: Some(10),
            ..Default::default()
        },
    )
    .unwrap();
    let g = fs.create(ROOT_INO, b"again", 0o644, 0, 0).unwrap().ino;
    fs.write(g, 0, &chunk[..20_000]).unwrap();
    assert!(fs.check().is_clean());
    drop(fs);
    let (fs, report) = LocalFs::open_path(
        &path,
        Arc::new(LogicalClock::new(1)),
        &LocalConfig::default(),
    )
    .unwrap();
    assert_eq!(report.orphans_reclaimed, 0);
    assert_eq!(fs.read(files[2], 0, chunk.len()).unwrap(), chunk);
    assert_eq!(fs.read(files[1], 0, 100).unwrap(), vec![0xab; 10]);
    assert_eq!(fs.read(g, 0, 20_000).unwrap(), vec![0xab; 20_000]);
}

/// Fills the metadata pool's log pages (not its inode slots): a file `{tag}big` with
/// a log of many pages (one live write entry per page it holds), then names for
/// files until there is no room (each link also makes the file's older link-count
/// entries dead, and their log GC frees pages into the grace period). Returns that
/// error.
fn fill_log_pages(fs: &LocalFs, tag: &str) -> orion_meta::FsError {
    let big = fs.create(ROOT_INO, format!("{tag}big").as_bytes(), 0o644, 0, 0);
    let big = big.unwrap().ino;
    for i in 0..600u64 {
        fs.write(big, i * 2 * 4096, &[i as u8; 4096]).unwrap();
    }
    let mut target = None;
    for n in 0.. {
        let t = match target {
            Some(t) => t,
            None => {
                let name = format!("{tag}t{n}");
                match fs.create(ROOT_INO, name.as_bytes(), 0o644, 0, 0) {
                    Ok(a) => *target.insert(a.ino),
                    Err(err) => return err,
                }
            }
        };
        let name = format!("{tag}{n:0>200}");
        match fs.link(t, ROOT_INO, name.as_bytes()) {
            Ok(_) => {}
            Err(err) if err.errno() == libc::EMLINK => target = None,
            Err(err) => return err,
        }
    }
    unreachable!()
}

/// The MDS's engine never sleeps for room (design note 74): while the only free log
/// pages are ones still in their grace period, an update fails at once with EAGAIN
/// and changes nothing (its client sends it again). A local file system's engine
/// sleeps the grace out instead, and says ENOSPC only when nothing is coming.
#[test]
fn an_engine_that_does_not_wait_for_room_answers_eagain_and_changes_nothing() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("fs");
    drop(LocalFs::mkfs(&path, 8 << 20, ModeChoice::Auto, 1).unwrap());
    let open = |grace_ms: u64, wait_for_room: bool| {
        let cfg = LocalConfig {
            engine: EngineConfig {
                grace: Duration::from_millis(grace_ms),
                wait_for_room,
                ..Default::default()
            },
            ..Default::default()
        };
        LocalFs::open_path(&path, Arc::new(LogicalClock::new(1)), &cfg)
            .unwrap()
            .0
    };
    // A grace period no test outlives: freed pages stay in it.
    let fs = open(3_600_000, false);
    let full = fill_log_pages(&fs, "a");
    assert_eq!(
        full.errno(),
        libc::EAGAIN,
        "GC freed pages into their grace period"
    );
    let (_, path2, fs2) = fresh(8 << 20);
    let none_coming = fill_log_pages(&fs2, "z");
    assert_eq!(none_coming.errno(), libc::ENOSPC, "{none_coming}");
    let named = none_coming.to_string();
    assert!(named.contains("no free log pages"), "{named}");
    drop((fs2, path2));
    fs.unlink(ROOT_INO, b"abig").unwrap();
    let names = fs.readdir(ROOT_INO, 0).unwrap().len();
    let room = fs.statfs();
    // Names that need a new page of the root's log (a new inode's log fits its
    // first segment). A new inode made and dropped would have put its number in a
    // grace period and its log pages too.
    let after = format!("after{}", "x".repeat(200));
    let after_dir = format!("after-dir{}", "x".repeat(200));
    let in_grace = || fs.with_engine(|e| e.log_pages_in_grace());
    let grace_before = in_grace();
    let inos_in_grace = || fs.with_engine(|e| e.inodes_in_grace());
    let inos_before = inos_in_grace();
    for attempt in 0..3 {
        let r = fs.create(ROOT_INO, after.as_bytes(), 0o644, 0, 0);
        let coming = "abig's log pages are coming";
        assert_eq!(e(r), libc::EAGAIN, "attempt {attempt}: {coming}");
        let r = fs.mkdir(ROOT_INO, after_dir.as_bytes(), 0o755, 0, 0);
        assert_eq!(e(r), libc::EAGAIN, "attempt {attempt}");
    }
    assert_eq!(e(fs.lookup(ROOT_INO, after.as_bytes())), libc::ENOENT);
    let listed = fs.readdir(ROOT_INO, 0).unwrap().len();
    assert_eq!(listed, names, "nothing changed");
    let now = fs.statfs();
    let free = |s: &orion_meta::StatFs| (s.ffree, s.bfree);
    assert_eq!(free(&now), free(&room), "nothing taken");
    let numbers = "no inode number put in a grace period";
    assert_eq!(inos_in_grace(), inos_before, "{numbers}");
    assert_eq!(in_grace(), grace_before, "no page put in a grace period");
    assert!(fs.check().is_clean(), "{:?}", fs.check().problems);
    drop(fs);
    // The same pool under an engine that waits (a remount forgets grace periods:
    // their pages are free again).
    let grace = Duration::from_millis(200);
    let fs = open(grace.as_millis() as u64, true);
    let full = fill_log_pages(&fs, "b");
    let waits = "a waiting engine never says EAGAIN";
    assert_eq!(full.errno(), libc::ENOSPC, "{waits}");
    let before = Instant::now();
    fs.unlink(ROOT_INO, b"bbig").unwrap();
    // The unlink's entry took a page of the reserve: names fill it, then the next
    // one needs one of bbig's pages, still in their grace period.
    for n in 0.. {
        let name = format!("after{n:0>200}");
        fs.create(ROOT_INO, name.as_bytes(), 0o644, 0, 0)
            .expect("a waiting engine sleeps the grace period out");
        if before.elapsed() >= grace {
            break;
        }
        assert!(n < 100, "bbig's pages were in their grace period");
    }
    assert!(fs.check().is_clean(), "{:?}", fs.check().problems);
}

fn e<T: std::fmt::Debug>(r: Result<T, orion_meta::FsError>) -> i32 {
    r.unwrap_err().errno()
}

#[test]
fn names_paths_and_types_give_linux_errors() {
    let (_dir, _path, fs) = fresh(8 << 20);
    let long = vec![b'x'; 256];
    assert_eq!(
        e(fs.create(ROOT_INO, &long, 0o644, 0, 0)),
        libc::ENAMETOOLONG
    );
    assert!(
        fs.create(ROOT_INO, &long[..255], 0o644, 0, 0).is_ok(),
        "255 bytes is a valid name"
    );
    assert_eq!(e(fs.lookup(ROOT_INO, b"missing")), libc::ENOENT);
    let f = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    assert_eq!(e(fs.create(ROOT_INO, b"f", 0o644, 0, 0)), libc::EEXIST);
    assert_eq!(e(fs.lookup(f, b"x")), libc::ENOTDIR);
    assert_eq!(e(fs.mkdir(f, b"x", 0o755, 0, 0)), libc::ENOTDIR);
    assert_eq!(e(fs.rmdir(ROOT_INO, b"f")), libc::ENOTDIR);
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    fs.create(d, b"inner", 0o644, 0, 0).unwrap();
    assert_eq!(e(fs.unlink(ROOT_INO, b"d")), libc::EISDIR);
    assert_eq!(e(fs.rmdir(ROOT_INO, b"d")), libc::ENOTEMPTY);
    assert_eq!(e(fs.write(d, 0, b"x")), libc::EISDIR);
    assert_eq!(e(fs.read(d, 0, 1)), libc::EISDIR);
    assert_eq!(
        e(fs.rename(ROOT_INO, b"d", d, b"self", RenameMode::Replace)),
        libc::EINVAL,
        "a directory into itself"
    );
    assert_eq!(
        e(fs.rename(ROOT_INO, b"f", ROOT_INO, b"d", RenameMode::Replace)),
        libc::EISDIR
    );
    assert_eq!(
        e(fs.rename(ROOT_INO, b"d", ROOT_INO, b"f", RenameMode::Replace)),
        libc::ENOTDIR
    );
    assert_eq!(
        e(fs.rename(
            ROOT_INO,
            b"f",
            ROOT_INO,
            &long[..255],
            RenameMode::NoReplace
        )),
        libc::EEXIST,
        "RENAME_NOREPLACE"
    );
    assert_eq!(e(fs.link(d, ROOT_INO, b"dlink")), libc::EPERM);
    assert_eq!(e(fs.readlink(f)), libc::EINVAL);
    assert_eq!(
        e(fs.symlink(ROOT_INO, b"s", &vec![b'a'; 4096], 0, 0)),
        libc::ENAMETOOLONG
    );
    assert_eq!(e(fs.symlink(ROOT_INO, b"s", b"", 0, 0)), libc::ENOENT);
    let s = fs.symlink(ROOT_INO, b"s", &vec![b'a'; 4095], 0, 0).unwrap();
    assert_eq!(fs.readlink(s.ino).unwrap().len(), 4095);
    assert_eq!(
        e(fs.setattr(
            d,
            &SetAttrReq {
                size: Some(0),
                ..Default::default()
            }
        )),
        libc::EISDIR
    );
    assert_eq!(e(fs.write(f, u64::MAX - 2, b"abc")), libc::EFBIG);
    assert_eq!(e(fs.getattr(999_999)), libc::ENOENT);
    assert!(fs.check().is_clean());
}

#[test]
fn a_damaged_pool_is_reported_not_trusted() {
    let (_dir, path, fs) = fresh(8 << 20);
    let f = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, b"hello").unwrap();
    let (log_page, sb) = fs.with_engine(|e| {
        (
            e.inode(ROOT_INO).unwrap().log.pages[0],
            e.superblock().clone(),
        )
    });
    drop(fs);
    let pool = orion_pmem::Pool::open(&path, ModeChoice::Auto).unwrap();
    // Flip a byte inside the root directory's first entries.
    let at = log_page + 64 + 70;
    let mut b = [0u8; 1];
    pool.read(at, &mut b).unwrap();
    pool.write(at, &[b[0] ^ 0x40]).unwrap();
    let report = orion_meta::fsck::check(&pool, None);
    assert!(!report.is_clean());
    assert!(
        report.problems[0].contains("checksum"),
        "{:?}",
        report.problems
    );
    drop(pool);
    let err = LocalFs::open_path(
        &path,
        Arc::new(LogicalClock::new(1)),
        &LocalConfig::default(),
    )
    .err()
    .expect("mount refuses");
    assert!(err.to_string().contains("damaged"), "{err}");
    // A wrong superblock is named as such.
    let pool = orion_pmem::Pool::open(&path, ModeChoice::Auto).unwrap();
    pool.write(0, b"NOTORION").unwrap();
    let report = orion_meta::fsck::check(&pool, None);
    assert!(
        report.problems[0].contains("not an OrionFS pool"),
        "{:?}",
        report.problems
    );
    let _ = sb;
}

#[test]
fn readdir_cookies_are_never_reused_after_compaction() {
    let (_dir, path, fs) = fresh(8 << 20);
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    for n in [b"a", b"b", b"c"] {
        fs.create(d, n, 0o644, 0, 0).unwrap();
    }
    let cookie_of = |fs: &LocalFs, n: &[u8]| {
        fs.readdir(d, 0)
            .unwrap()
            .into_iter()
            .find(|e| e.name == n)
            .unwrap()
            .cookie
    };
    let last = cookie_of(&fs, b"c");
    fs.unlink(d, b"c").unwrap();
    fs.with_engine(|e| e.force_gc(d)).unwrap();
    fs.create(d, b"z", 0o644, 0, 0).unwrap();
    assert!(
        cookie_of(&fs, b"z") > last,
        "a reader at offset {last} must still see z"
    );
    drop(fs);
    let (fs, _) = LocalFs::open_path(
        &path,
        Arc::new(LogicalClock::new(1)),
        &LocalConfig::default(),
    )
    .unwrap();
    assert!(cookie_of(&fs, b"z") > last);
    fs.create(d, b"y", 0o644, 0, 0).unwrap();
    assert!(cookie_of(&fs, b"y") > cookie_of(&fs, b"z"));
}

/// What commits changed includes an inode destroyed with its last name (callbacks
/// then drop whoever watched its number), and not one a name still holds.
#[test]
fn a_destroyed_inode_is_a_recorded_change() {
    let (_dir, _path, fs) = fresh(16 << 20);
    let a = fs.create(ROOT_INO, b"a", 0o644, 0, 0).unwrap().ino;
    fs.link(a, ROOT_INO, b"b").unwrap();
    fs.with_engine(|e| e.record_changes());
    fs.unlink(ROOT_INO, b"a").unwrap();
    let changed: Vec<u64> = fs
        .with_engine(|e| e.take_changes())
        .iter()
        .map(|c| c.ino)
        .collect();
    assert!(
        changed.contains(&ROOT_INO) && changed.contains(&a),
        "{changed:?}"
    );
    fs.unlink(ROOT_INO, b"b").unwrap();
    let changed = fs.with_engine(|e| e.take_changes());
    assert_eq!(
        changed.iter().filter(|c| c.ino == a).count(),
        1,
        "the destroyed inode, once: {changed:?}"
    );
    assert!(fs.getattr(a).is_err());
}

/// A freed inode number is taken last, not next: a client's kernel may still hold the
/// old inode under it (FUSE knows inodes by number), and its watcher would be called
/// back about the next file to take it.
#[test]
fn a_freed_inode_number_is_taken_last() {
    let (_dir, _path, fs) = fresh(8 << 20);
    let a = fs.mkdir(ROOT_INO, b"a", 0o755, 0, 0).unwrap().ino;
    fs.rmdir(ROOT_INO, b"a").unwrap();
    let b = fs.mkdir(ROOT_INO, b"b", 0o755, 0, 0).unwrap().ino;
    assert!(b > a, "the number of a removed directory came back at once");
}
