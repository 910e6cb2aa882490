//! Differential property test: random operation sequences applied to the local core
//! and, through real system calls, to a tmpfs directory give the same results, the
//! same trees, and the same timestamp changes; after close and reopen the core is
//! identical to what it was.

mod support;

use std::sync::Arc;

use orion_meta::{fsck, LocalConfig, LocalFs, LogicalClock};
use orion_pmem::ModeChoice;
use proptest::prelude::*;
use support::oracle::{oracle_snapshot, run_oracle, wait_past};
use support::*;

fn max_time(s: &Snapshot) -> i64 {
    s.values().map(|n| n.mtime.max(n.ctime)).max().unwrap_or(0)
}

fn check_sequence(ops: Vec<OpT>) -> Result<(), TestCaseError> {
    let oracle = tempfile::tempdir_in("/dev/shm").unwrap();
    let root = oracle.path();
    std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let pools = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = pools.path().join("fs");
    let clock = Arc::new(LogicalClock::new(1_600_000_000_000_000_000));
    drop(LocalFs::mkfs(&path, 64 << 20, ModeChoice::Auto, 1_600_000_000_000_000_000).unwrap());
    let (fs, _) = LocalFs::open_path(&path, clock.clone(), &LocalConfig::default()).unwrap();
    let mut oks = 0;
    for (i, op) in ops.iter().enumerate() {
        let ob = oracle_snapshot(root);
        let cb = core_snapshot(&fs);
        let op = &op.resolve(&ob);
        wait_past(max_time(&ob));
        let o = run_oracle(root, op);
        let c = run_core(&fs, op);
        prop_assert_eq!(&c, &o, "result of op {} {:?}", i, op);
        oks += matches!(c, Outcome::Ok | Outcome::Data(_)) as usize;
        let oa = oracle_snapshot(root);
        let ca = core_snapshot(&fs);
        if let Some(d) = diff_ignoring_times(&oa, &ca) {
            return Err(TestCaseError::fail(format!(
                "tree after op {i} {op:?}: tmpfs vs core: {d}"
            )));
        }
        prop_assert_eq!(
            op_time_changes(op, &ob, &oa),
            op_time_changes(op, &cb, &ca),
            "mtime/ctime changes (path, mtime, ctime) after op {} {:?}: tmpfs left, core right",
            i,
            op
        );
    }
    eprintln!(
        "sequence of {} ops: {} succeeded, {} paths",
        ops.len(),
        oks,
        core_snapshot(&fs).len()
    );
    let before = core_snapshot(&fs);
    drop(fs);
    let (fs, report) = LocalFs::open_path(&path, clock, &LocalConfig::default()).unwrap();
    prop_assert_eq!(report.orphans_reclaimed, 0);
    prop_assert_eq!(core_snapshot(&fs), before, "reopened file system differs");
    drop(fs);
    let meta = orion_pmem::Pool::open(&path, ModeChoice::Auto).unwrap();
    let data = orion_pmem::Pool::open(
        &orion_meta::localfs::data_pool_path(&path),
        ModeChoice::Auto,
    )
    .unwrap();
    let r = fsck::check(&meta, Some(&data));
    prop_assert!(r.is_clean(), "fsck: {:?}", r.problems);
    Ok(())
}

#[test]
fn core_matches_tmpfs() {
    // SAFETY: umask only sets the process's file-creation mask.
    unsafe { libc::umask(UMASK as libc::mode_t) };
    run_property(
        "differential core vs tmpfs",
        48,
        prop::collection::vec(arb_op(), 1..60),
        check_sequence,
    );
}

#[test]
fn harness_sees_differences() {
    // The comparison itself must be able to fail: a tree with one byte changed differs.
    let pools = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = pools.path().join("fs");
    drop(LocalFs::mkfs(&path, 8 << 20, ModeChoice::Auto, 1).unwrap());
    let (fs, _) = LocalFs::open_path(
        &path,
        Arc::new(LogicalClock::new(1)),
        &LocalConfig::default(),
    )
    .unwrap();
    let a = core_snapshot(&fs);
    run_core(&fs, &Op::Create(P(vec![b"a".to_vec()]), 0o644));
    let b = core_snapshot(&fs);
    assert!(diff_ignoring_times(&a, &b).is_some());
    run_core(&fs, &Op::Write(P(vec![b"a".to_vec()]), 0, 10, 1));
    let c = core_snapshot(&fs);
    assert!(diff_ignoring_times(&b, &c).is_some());
    assert_eq!(
        time_changes(&b, &c),
        vec![
            (".".to_string(), false, false),
            ("a".to_string(), true, true)
        ]
    );
}
