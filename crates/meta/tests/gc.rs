//! Log garbage collection keeps logs bounded under endless overwrites and churn,
//! and never changes what the file system holds (also after a remount).

use std::sync::Arc;

use orion_meta::{EngineConfig, LocalConfig, LocalFs, LogicalClock, RenameMode, ROOT_INO};
use orion_pmem::ModeChoice;

/// Freed pages wait out a grace period here, as they will when remote readers exist.
fn config() -> LocalConfig {
    LocalConfig {
        engine: EngineConfig {
            grace: std::time::Duration::from_millis(2),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn fresh(size: u64) -> (tempfile::TempDir, std::path::PathBuf, LocalFs) {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("fs");
    drop(LocalFs::mkfs(&path, size, ModeChoice::Auto, 1).unwrap());
    let (fs, _) = LocalFs::open_path(&path, Arc::new(LogicalClock::new(1)), &config()).unwrap();
    (dir, path, fs)
}

fn block(i: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    for (j, x) in b.iter_mut().enumerate() {
        *x = (i as u8) ^ (j as u8).wrapping_mul(7) ^ ((i >> 8) as u8);
    }
    b
}

#[test]
fn one_block_overwritten_a_million_times_keeps_a_bounded_log() {
    let writes: u64 = std::env::var("ORION_GC_WRITES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let (_dir, path, fs) = fresh(64 << 20);
    let f = fs.create(ROOT_INO, b"hot", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &block(u64::MAX)).unwrap();
    fs.write(f, 8192, b"tail").unwrap();
    fs.write(f, 4096, &block(0)).unwrap();
    let free_before = fs.statfs().bfree;
    let mut max_pages = 0;
    for i in 0..writes {
        fs.write(f, 4096, &block(i)).unwrap();
        if i % 1024 == 0 {
            max_pages = max_pages.max(fs.with_engine(|e| e.log_segments(f).unwrap()));
        }
        if i % 100_000 == 0 {
            assert_eq!(
                fs.read(f, 4096, 4096).unwrap(),
                block(i),
                "content after write {i}"
            );
        }
    }
    let gc_runs = fs.with_engine(|e| e.stats.gc_runs);
    println!("{writes} overwrites: {gc_runs} log compactions, at most {max_pages} log pages");
    assert!(max_pages <= 3, "the log grew to {max_pages} pages");
    let (_, _, log_total, log_free) = fs.with_engine(|e| e.usage());
    assert!(
        log_total - log_free < 16,
        "log pages in use or waiting: {}",
        log_total - log_free
    );
    assert!(gc_runs >= writes / 100, "GC ran only {gc_runs} times");
    assert_eq!(
        fs.statfs().bfree,
        free_before,
        "superseded data pages were all freed"
    );
    let last = block(writes - 1);
    assert_eq!(fs.read(f, 0, 4096).unwrap(), block(u64::MAX));
    assert_eq!(fs.read(f, 4096, 4096).unwrap(), last);
    assert_eq!(fs.read(f, 8192, 10).unwrap(), b"tail");
    drop(fs);
    let (fs, _) = LocalFs::open_path(&path, Arc::new(LogicalClock::new(1)), &config()).unwrap();
    assert_eq!(fs.read(f, 4096, 4096).unwrap(), last);
    assert!(fs.check().is_clean());
}

#[test]
fn directory_churn_keeps_a_bounded_log_and_stable_cookies() {
    let (_dir, path, fs) = fresh(32 << 20);
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    fs.create(d, b"stays", 0o644, 0, 0).unwrap();
    let cookie = |fs: &LocalFs| {
        fs.readdir(d, 0)
            .unwrap()
            .into_iter()
            .find(|e| e.name == b"stays")
            .unwrap()
            .cookie
    };
    let c0 = cookie(&fs);
    for i in 0..50_000u32 {
        let name = format!("tmp{}", i % 7);
        fs.create(d, name.as_bytes(), 0o644, 0, 0).unwrap();
        fs.rename(d, name.as_bytes(), d, b"moved", RenameMode::Replace)
            .unwrap();
        fs.unlink(d, b"moved").unwrap();
    }
    let pages = fs.with_engine(|e| e.log_segments(d).unwrap());
    assert!(pages <= 3, "directory log has {pages} pages");
    assert_eq!(cookie(&fs), c0, "readdir offsets survive compaction");
    drop(fs);
    let (fs, _) = LocalFs::open_path(&path, Arc::new(LogicalClock::new(1)), &config()).unwrap();
    let names: Vec<_> = fs
        .readdir(d, 2)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec![b"stays".to_vec()]);
    assert_eq!(cookie(&fs), c0);
    assert!(fs.check().is_clean());
}

/// Regression (found by the mount's tar test): GC merges the write entries of a file
/// written page by page into one entry per run of pages, so the compacted log holds
/// fewer entries than were live; the inode it rebuilds must still be the same.
#[test]
fn compaction_merges_sequential_writes_into_runs_and_keeps_the_file() {
    let (_dir, path, fs) = fresh(32 << 20);
    let f = fs.create(ROOT_INO, b"seq", 0o644, 0, 0).unwrap().ino;
    for i in 0..64u64 {
        fs.write(f, i * 4096, &block(i)).unwrap();
    }
    fs.write(f, 64 * 4096, b"end").unwrap();
    let entries_before = fs.with_engine(|e| e.inode(f).unwrap().log.entries);
    fs.with_engine(|e| e.force_gc(f)).unwrap();
    let entries_after = fs.with_engine(|e| e.inode(f).unwrap().log.entries);
    assert!(
        entries_after < entries_before / 4,
        "{entries_before} entries became {entries_after}: the runs were not merged"
    );
    let check = |fs: &LocalFs| {
        for i in 0..64u64 {
            assert_eq!(fs.read(f, i * 4096, 4096).unwrap(), block(i), "page {i}");
        }
        assert_eq!(fs.read(f, 64 * 4096, 10).unwrap(), b"end");
        assert_eq!(fs.getattr(f).unwrap().size, 64 * 4096 + 3);
    };
    check(&fs);
    drop(fs);
    let (fs, _) = LocalFs::open_path(&path, Arc::new(LogicalClock::new(1)), &config()).unwrap();
    check(&fs);
    assert!(fs.check().is_clean());
}

/// Regression (found by the optimistic client's random test): a write overwritten in
/// its middle compacts into more entries than were live (the two ends of the old
/// write and the new page); the inode stays the same.
#[test]
fn compaction_splits_a_write_overwritten_in_its_middle() {
    let (_dir, path, fs) = fresh(32 << 20);
    let f = fs.create(ROOT_INO, b"split", 0o644, 0, 0).unwrap().ino;
    let big: Vec<u8> = (0..8).flat_map(block).collect();
    fs.write(f, 0, &big).unwrap();
    fs.write(f, 3 * 4096, &block(100)).unwrap();
    let live_before = fs.with_engine(|e| e.inode(f).unwrap().state.live_entries());
    fs.with_engine(|e| e.force_gc(f)).unwrap();
    let live_after = fs.with_engine(|e| e.inode(f).unwrap().state.live_entries());
    assert!(
        live_after > live_before,
        "{live_before} → {live_after}: not split"
    );
    let check = |fs: &LocalFs| {
        for i in 0..8u64 {
            let want = if i == 3 { block(100) } else { block(i) };
            assert_eq!(fs.read(f, i * 4096, 4096).unwrap(), want, "page {i}");
        }
    };
    check(&fs);
    drop(fs);
    let (fs, _) = LocalFs::open_path(&path, Arc::new(LogicalClock::new(1)), &config()).unwrap();
    check(&fs);
    assert!(fs.check().is_clean());
}

/// One change to a file's extent index, for the accounting property below.
#[derive(Clone, Debug)]
enum FileOp {
    Write { pgoff: u64, npages: u32, page: u64 },
    Truncate { pages: u64 },
    Hole { pgoff: u64, npages: u64 },
}

fn file_op() -> impl proptest::strategy::Strategy<Value = FileOp> {
    use proptest::prelude::*;
    prop_oneof![
        6 => (0u64..48, 1u32..12, 0u64..4).prop_map(|(pgoff, npages, base)| FileOp::Write {
            pgoff,
            npages,
            page: base * 64 + pgoff,
        }),
        1 => (0u64..48).prop_map(|pages| FileOp::Truncate { pages }),
        1 => (0u64..48, 1u64..8).prop_map(|(pgoff, npages)| FileOp::Hole { pgoff, npages }),
    ]
}

fn apply_op(s: &mut orion_meta::InodeState, op: &FileOp) {
    use orion_format::{attr_mask, Entry, Gpa, SetAttrRec, WriteRec};
    let e = match *op {
        FileOp::Write {
            pgoff,
            npages,
            page,
        } => Entry::Write(WriteRec {
            pgoff,
            npages,
            // Data page = base + file page: writes of one base continue each other's
            // runs, so compaction merges runs across writes.
            gpa: Gpa::new(0, page),
            size: (pgoff + npages as u64) * 4096,
            mtime: 1,
        }),
        FileOp::Truncate { pages } => Entry::SetAttr(SetAttrRec {
            mask: attr_mask::SIZE,
            size: pages * 4096,
            ..Default::default()
        }),
        FileOp::Hole { pgoff, npages } => Entry::Hole {
            pgoff,
            npages,
            mtime: 1,
        },
    };
    s.apply(&e, &mut Vec::new()).unwrap();
}

fn rebuilt_from(entries: &[orion_format::Entry]) -> orion_meta::InodeState {
    let mut s = orion_meta::InodeState::new(7, orion_format::FileType::Regular, 1);
    for e in entries {
        s.apply(e, &mut Vec::new()).unwrap();
    }
    s
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
        std::env::var("ORION_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(256)
    ))]

    /// GC renumbers a file's writes in place instead of rebuilding the inode from the
    /// compacted log (design note 57). The pair: the renumbered index counts exactly
    /// the live entries the rebuilt one counts (one per run), and goes on counting
    /// the same through every later write, truncation and hole.
    #[test]
    fn renumbered_accounting_matches_a_rebuilt_index(
        before in proptest::collection::vec(file_op(), 1..40),
        after in proptest::collection::vec(file_op(), 0..40),
    ) {
        let mut state = orion_meta::InodeState::new(7, orion_format::FileType::Regular, 1);
        for op in &before {
            apply_op(&mut state, op);
        }
        let entries = state.compacted_entries();
        let mut rebuilt = rebuilt_from(&entries);
        state.compacted(&entries);
        proptest::prop_assert!(rebuilt.same_contents(&state));
        proptest::prop_assert_eq!(state.live_entries(), entries.len() as u64);
        proptest::prop_assert_eq!(rebuilt.live_entries(), entries.len() as u64);
        for op in &after {
            apply_op(&mut state, op);
            apply_op(&mut rebuilt, op);
            proptest::prop_assert_eq!(state.live_entries(), rebuilt.live_entries(), "after {:?}", op);
        }
    }
}
