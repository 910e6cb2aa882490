//! Crash tests: random operation sequences run on crash-simulator pools; at random
//! points (any store or persist) an image a power failure could leave is taken. Each
//! image must pass fsck, mount, show exactly the operations that returned before the
//! crash (plus, atomically, the one in flight or not), and stay usable.
//!
//! `ORION_CRASH_POINTS` sets how many points to explore (CI: 1,200; the long run in
//! the README: 12,000), `ORION_SEED` the seed.

mod support;

use std::sync::Arc;

use orion_meta::{EngineConfig, LocalFs, LogicalClock};
use orion_pmem::CrashDomain;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use support::*;

const T0: i64 = 1_700_000_000_000_000_000;
const META_POOL: usize = 1 << 20;
const DATA_POOL: usize = 2 << 20;
const OPS: usize = 30;
const POINTS_PER_SEQUENCE: usize = 25;

fn config() -> EngineConfig {
    // A low GC threshold so crashes also land inside log compactions.
    EngineConfig {
        gc_min_dead: 1,
        ..Default::default()
    }
}

/// Formats and mounts a file system on fresh simulator pools.
fn fresh(domain: &Arc<CrashDomain>) -> LocalFs {
    let meta = domain.add_pool(&vec![0u8; META_POOL]);
    let data = domain.add_pool(&vec![0u8; DATA_POOL]);
    LocalFs::format(&meta, &data, T0).unwrap();
    LocalFs::open(meta, data, Arc::new(LogicalClock::new(T0)), config())
        .unwrap()
        .0
}

struct Reference {
    ops: Vec<Op>,
    /// Tree after mount (index 0) and after each operation.
    snaps: Vec<Snapshot>,
    /// Recorded events at the same moments.
    events: Vec<u64>,
    /// Log compactions and journal commits the sequence made (the crash points
    /// must land inside both).
    gc_runs: u64,
    journal_commits: u64,
}

fn reference(templates: &[OpT]) -> Reference {
    let domain = CrashDomain::new(1);
    let fs = fresh(&domain);
    let mut r = Reference {
        ops: vec![],
        snaps: vec![core_snapshot(&fs)],
        events: vec![domain.events()],
        gc_runs: 0,
        journal_commits: 0,
    };
    for t in templates {
        let op = t.resolve(r.snaps.last().unwrap());
        run_core(&fs, &op);
        r.ops.push(op);
        r.snaps.push(core_snapshot(&fs));
        r.events.push(domain.events());
    }
    (r.gc_runs, r.journal_commits) = fs.with_engine(|e| (e.stats.gc_runs, e.stats.journal_commits));
    r
}

/// Explores `points` crash points of one random sequence; returns the failures.
fn explore(seed: u64, points: usize) -> (usize, Vec<String>, u64, u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let templates = random_ops(&mut rng, OPS);
    let r = reference(&templates);
    let (first, last) = (r.events[0] + 1, *r.events.last().unwrap());
    if last < first {
        return (0, vec![], 0, 0);
    }
    let mut armed = std::collections::BTreeSet::new();
    while armed.len() < points.min((last - first + 1) as usize) {
        armed.insert(rng.gen_range(first..=last));
    }
    let armed: Vec<u64> = armed.into_iter().collect();
    // Replay the same operations (the run is deterministic), taking images.
    let domain = CrashDomain::new(seed ^ 0x5eed);
    let fs = fresh(&domain);
    assert_eq!(
        domain.events(),
        r.events[0],
        "seed {seed}: the replay diverged at mount"
    );
    domain.arm(armed);
    for op in &r.ops {
        run_core(&fs, op);
    }
    assert_eq!(domain.events(), last, "seed {seed}: the replay diverged");
    drop(fs);
    let mut failures = Vec::new();
    let images = domain.take_images();
    let explored = images.len();
    for img in images {
        let done = r.events.iter().rposition(|&e| e <= img.event).unwrap();
        let at = format!(
            "seed {seed}, crash at event {} (after op {done} of {})",
            img.event,
            r.ops.len()
        );
        let d2 = CrashDomain::new(0);
        let meta = d2.add_pool(&img.pools[0]);
        let data = d2.add_pool(&img.pools[1]);
        let raw = orion_meta::fsck::check(&meta, Some(&data));
        if !raw.is_clean() {
            failures.push(format!("{at}: fsck of the crash image: {:?}", raw.problems));
            continue;
        }
        let fs = match LocalFs::open(
            meta,
            data,
            Arc::new(LogicalClock::new(T0 + 1_000_000_000_000)),
            config(),
        ) {
            Ok((fs, _)) => fs,
            Err(e) => {
                failures.push(format!("{at}: mount failed: {e}"));
                continue;
            }
        };
        let snap = core_snapshot(&fs);
        let in_flight = done + 1 < r.snaps.len();
        if snap != r.snaps[done] && !(in_flight && snap == r.snaps[done + 1]) {
            let d = diff_ignoring_times(&r.snaps[done], &snap)
                .unwrap_or_else(|| "timestamps differ".into());
            failures.push(format!(
                "{at}: not a prefix state; vs state after op {done}: {d}; in flight: {:?}",
                r.ops.get(done)
            ));
            continue;
        }
        // The recovered file system works and stays consistent.
        run_core(&fs, &Op::Mkdir(P(vec![b"after-crash".to_vec()]), 0o755));
        run_core(
            &fs,
            &Op::Create(P(vec![b"after-crash".to_vec(), b"f".to_vec()]), 0o644),
        );
        let w = run_core(
            &fs,
            &Op::Write(P(vec![b"after-crash".to_vec(), b"f".to_vec()]), 10, 5000, 7),
        );
        let after = fs.check();
        if !after.is_clean() || matches!(w, Outcome::Err(e) if e != libc::ENOSPC) {
            failures.push(format!(
                "{at}: after recovery, write gave {w:?}, fsck: {:?}",
                after.problems
            ));
        }
    }
    (explored, failures, r.gc_runs, r.journal_commits)
}

#[test]
fn crash_points_recover_to_a_prefix() {
    let points: usize = std::env::var("ORION_CRASH_POINTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1200);
    let seed: u64 = std::env::var("ORION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2019);
    let mut explored = 0;
    let mut failures = Vec::new();
    let mut i = 0u64;
    let (mut gc_runs, mut journal_commits) = (0, 0);
    while explored < points {
        let (n, f, g, j) = explore(
            seed.wrapping_mul(1_000_003).wrapping_add(i),
            POINTS_PER_SEQUENCE.min(points - explored),
        );
        explored += n;
        failures.extend(f);
        gc_runs += g;
        journal_commits += j;
        i += 1;
    }
    println!("crash points: {explored}, inconsistent: {}", failures.len());
    println!(
        "(over {i} sequences with {gc_runs} log compactions and {journal_commits} journal commits)"
    );
    assert!(
        gc_runs > 0 && journal_commits > 0,
        "the sequences never compacted a log or used the journal"
    );
    for f in failures.iter().take(10) {
        println!("  {f}");
    }
    assert!(
        failures.is_empty(),
        "{} inconsistent crash images (ORION_SEED={seed}); first: {}",
        failures.len(),
        failures[0]
    );
}
