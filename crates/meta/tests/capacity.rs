//! Capacity: an MDS pool holds the inodes its superblock states (one per KiB of pool:
//! a million in the 1 GiB pool of `orion up`), an empty file costs its slot and its
//! first log segment but no log page, and a full inode table says so by name while
//! losing nothing.

use std::sync::Arc;

use orion_meta::{LocalFs, LogicalClock, ROOT_INO};
use orion_pmem::{ModeChoice, Pool};

#[test]
fn a_pool_takes_every_inode_it_states_then_names_the_inode_slots() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let (mp, dp) = (dir.path().join("meta"), dir.path().join("data"));
    // 40 MiB: more inodes than version 1 of the layout gave a 256 MiB pool (32,767).
    let meta = Pool::create(&mp, 40 << 20, ModeChoice::Auto).unwrap();
    let data = Pool::create(&dp, 1 << 20, ModeChoice::Auto).unwrap();
    LocalFs::format(&meta, &data, 1).unwrap();
    let clock = Arc::new(LogicalClock::new(1));
    let (fs, _) = LocalFs::open(meta, data, clock.clone(), Default::default()).unwrap();
    let before = fs.statfs();
    assert!(before.ffree > 40_000, "{} inodes free", before.ffree);
    let pages_before = fs.with_engine(|e| e.usage().3);
    let mut made = 0u64;
    let err = loop {
        match fs.create(ROOT_INO, format!("f{made}").as_bytes(), 0o644, 0, 0) {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(err.to_string().contains("no free inode slots"), "{err}");
    assert_eq!(made, before.ffree, "every inode the pool states is there");
    assert_eq!(fs.statfs().ffree, 0);
    // The names took log pages (64 bytes each in the root's log); the files none.
    let pages = pages_before - fs.with_engine(|e| e.usage().3);
    let names = made.div_ceil(4032 / 64);
    assert!(
        pages <= names + 1,
        "{made} empty files took {pages} log pages; their names need {names}"
    );
    assert!(fs.check().is_clean(), "{:?}", fs.check().problems);
    // Freed numbers come back (after the grace period: none here), and everything
    // acknowledged survives a remount.
    fs.unlink(ROOT_INO, b"f7").unwrap();
    fs.create(ROOT_INO, b"again", 0o644, 0, 0).unwrap();
    drop(fs);
    let meta = Pool::open(&mp, ModeChoice::Auto).unwrap();
    let data = Pool::open(&dp, ModeChoice::Auto).unwrap();
    let (fs, report) = LocalFs::open(meta, data, clock, Default::default()).unwrap();
    assert_eq!(report.orphans_reclaimed, 0);
    let mut listed = 0;
    let mut off = 0;
    loop {
        let batch = fs.readdir(ROOT_INO, off).unwrap();
        let Some(last) = batch.last() else { break };
        off = last.cookie;
        listed += batch
            .iter()
            .filter(|e| e.name != b"." && e.name != b"..")
            .count() as u64;
    }
    assert_eq!(listed, made, "every name is there after a remount");
    assert!(fs.lookup(ROOT_INO, b"again").is_ok());
    assert!(fs.check().is_clean(), "{:?}", fs.check().problems);
}
