//! The primary MDS is killed, cut off from its mirror and the cluster manager, split
//! from its mirror, its link to the mirror breaks at random, or its mirror is killed,
//! at random moments,
//! inside clients' operations, while a mirror holds every update it acknowledged: each
//! operation still succeeds, once (an exclusive create never finds its own file, a
//! rename never loses its source, an append never lands twice), the file system
//! matches the model at the end, the two MDS pools are byte-identical once the last
//! mirror caught up, and fsck is clean on both. Seeded: `ORION_SIM_MIRROR_SEEDS=N`
//! runs seeds 1 to N (3 by default), `ORION_SIM_MIRROR_SEED=S` only seed S, and a
//! failing seed prints itself.

use std::collections::BTreeMap;
use std::time::Duration;

use orion_client::{Client, OpenFlags};
use orion_pmem::Mode;
use orion_sim::{MdsFault, MirroredCluster};
use rand::{Rng, SeedableRng};

fn content(n: u64) -> Vec<u8> {
    (0..3000 + (n % 7) * 1111)
        .map(|k| (k * 17 + n * 3) as u8)
        .collect()
}

fn read(c: &Client, path: &str) -> Vec<u8> {
    let fd = c
        .open(path, OpenFlags::read(), 0)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let b = c.pread(fd, 0, 1 << 20).unwrap();
    c.close(fd).unwrap();
    b
}

/// One operation on the client; the model changes as it should.
fn step(c: &Client, rng: &mut rand::rngs::StdRng, model: &mut BTreeMap<String, Vec<u8>>, n: u64) {
    let names: Vec<String> = model.keys().cloned().collect();
    match rng.gen_range(0..4) {
        // An exclusive create and a write: a retry must not find its own file.
        0 | 1 => {
            let path = format!("/d/f{n}");
            let excl = OpenFlags {
                excl: true,
                ..OpenFlags::create()
            };
            let fd = c
                .open(&path, excl, 0o644)
                .unwrap_or_else(|e| panic!("create {path}: {e}"));
            let b = content(n);
            c.pwrite(fd, 0, &b)
                .unwrap_or_else(|e| panic!("write {path}: {e}"));
            c.close(fd).unwrap();
            model.insert(path, b);
        }
        // A rename: a retry must not lose its source.
        2 if !names.is_empty() => {
            let from = &names[rng.gen_range(0..names.len())];
            let to = format!("/d/r{n}");
            c.rename(from, &to)
                .unwrap_or_else(|e| panic!("rename {from}: {e}"));
            let b = model.remove(from).unwrap();
            model.insert(to, b);
        }
        // An append: it must land once.
        _ if !names.is_empty() => {
            let path = &names[rng.gen_range(0..names.len())];
            let flags = OpenFlags {
                write: true,
                append: true,
                ..Default::default()
            };
            let fd = c.open(path, flags, 0).unwrap();
            let tail = format!("+{n}");
            c.write(fd, tail.as_bytes())
                .unwrap_or_else(|e| panic!("append {path}: {e}"));
            c.close(fd).unwrap();
            model
                .get_mut(path)
                .unwrap()
                .extend_from_slice(tail.as_bytes());
        }
        _ => {}
    }
}

/// What one seed did.
#[derive(Default)]
struct Tally {
    /// Faults by kind: kill, isolate, split, flaky, kill of the mirror.
    faults: [u32; 5],
    /// Faults that struck inside an operation.
    inside: u32,
    /// Fail-overs (the primary changed).
    failovers: u32,
}

/// Runs one seed.
fn run_seed(seed: u64, mds_mode: Mode) -> Tally {
    let mut cluster = MirroredCluster::start_with(seed, mds_mode).expect("the cluster starts");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let client = cluster.client().unwrap();
    client.mkdir("/d", 0o755).unwrap();
    let mut model = BTreeMap::new();
    let mut tally = Tally::default();
    let mut n = 0u64;
    while n < 60 {
        // Each operation draws from a generator of its own, seeded from the run's.
        let mut op_rng = rand::rngs::StdRng::seed_from_u64(rng.gen());
        if rng.gen_range(0..8) != 0 {
            step(&client, &mut op_rng, &mut model, n);
            n += 1;
            continue;
        }
        // A fault strikes at a random moment inside a burst of operations (or just
        // after it).
        // The kinds take turns, from a place the seed picks: every seed strikes with
        // each kind (a run has seven faults or so).
        let kind = (seed as usize + tally.faults.iter().sum::<u32>() as usize) % 5;
        let fault = [
            MdsFault::Kill,
            MdsFault::Isolate,
            MdsFault::Split,
            MdsFault::Flaky(0.3),
            MdsFault::KillMirror,
        ][kind];
        let burst = rng.gen_range(1..=4);
        // Within the burst's first operations mostly (an operation here takes
        // 50–300 µs; with 300 µs per operation, whole runs of three seeds went by
        // with no fault inside one once clients stopped connecting to every store
        // at their hello).
        let after = Duration::from_micros(rng.gen_range(0..120 * burst));
        let before = cluster.primary().unwrap();
        let ((), inside) = cluster
            .fault_during(fault, after, || {
                for i in 0..burst {
                    step(&client, &mut op_rng, &mut model, n + i);
                }
            })
            .unwrap_or_else(|e| panic!("{fault:?}: {e:#}"));
        n += burst;
        tally.faults[kind] += 1;
        tally.inside += inside as u32;
        // The mirror catches up before a later fault may hit the primary.
        let p = cluster
            .wait_any_primary(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("after {fault:?}: {e:#}"));
        tally.failovers += (Some(p) != before) as u32;
        let mirror = orion_sim::MDSS[1 - p].0;
        cluster
            .wait_in_sync(mirror, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("after {fault:?}: {e:#}"));
    }
    // Everything acknowledged is there, once.
    let mut names: Vec<String> = client
        .readdir("/d")
        .unwrap()
        .into_iter()
        .map(|e| format!("/d/{}", String::from_utf8_lossy(&e.name)))
        .filter(|n| !n.ends_with("/.") && !n.ends_with("/.."))
        .collect();
    names.sort();
    assert_eq!(
        names,
        model.keys().cloned().collect::<Vec<_>>(),
        "the names"
    );
    for (path, b) in &model {
        assert!(read(&client, path) == *b, "{path} differs");
    }
    drop(client);
    // The mirror holds the same bytes as the primary once it applied its ring (it
    // looks every 20 ms when idle).
    let t0 = std::time::Instant::now();
    let differ = loop {
        let differ = cluster.differing_pages().unwrap();
        if differ.is_empty() || t0.elapsed() > Duration::from_secs(5) {
            break differ;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        differ.is_empty(),
        "pages that differ between the pools: {differ:?}"
    );
    cluster.stop().unwrap();
    cluster.fsck().unwrap();
    // The cluster map lives in the manager: every primary saved it there, and it names
    // the store, in sync.
    let map = cluster
        .manager_map()
        .unwrap()
        .expect("the manager keeps the cluster map");
    assert!(
        map.lines()
            .any(|l| l.starts_with("member 0 0 ") && l.contains(" in-sync ")),
        "{map}"
    );
    let [kill, isolate, split, flaky, mirror] = tally.faults;
    println!(
        "seed {seed} ({} MDS pools): {} files; faults: {kill} kills, {isolate} isolations, \
         {split} splits, {flaky} flaky links, {mirror} kills of the mirror, {} inside an \
         operation; {} fail-overs",
        mds_mode.name(),
        model.len(),
        tally.inside,
        tally.failovers,
    );
    tally
}

#[test]
fn the_primary_killed_cut_off_or_split_from_its_mirror_loses_and_repeats_nothing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let var = |name| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    let seeds = match (var("ORION_SIM_MIRROR_SEED"), var("ORION_SIM_MIRROR_SEEDS")) {
        (Some(one), _) => one..=one,
        (None, n) => 1..=n.unwrap_or(3),
    };
    let many = seeds.clone().count() >= 3;
    let mut all = Tally::default();
    for seed in seeds {
        match std::panic::catch_unwind(|| run_seed(seed, Mode::Volatile)) {
            Ok(t) => {
                all.inside += t.inside;
                all.failovers += t.failovers;
                for (a, b) in all.faults.iter_mut().zip(t.faults) {
                    *a += b;
                }
            }
            Err(_) => panic!("seed {seed} failed: replay it with ORION_SIM_MIRROR_SEED={seed}"),
        }
    }
    // The test is about faults inside operations, of every kind: there must have been
    // some, and fail-overs.
    assert!(all.inside > 0, "no fault struck inside an operation");
    assert!(all.failovers > 0, "no fail-over");
    assert!(
        !many || all.faults.iter().all(|n| *n > 0),
        "not every kind of fault struck: {:?}",
        all.faults
    );
}

/// A mirror whose pool needs a flush (msync) is not durable when the primary's write
/// lands in its ring: the primary waits until it says it applied the turn (without
/// that answer the primary drops it, and it never takes over: this test then fails).
#[test]
fn mirrors_whose_pools_need_a_flush_lose_and_repeat_nothing_either() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let seed = 101;
    if std::panic::catch_unwind(|| run_seed(seed, Mode::Msync)).is_err() {
        panic!("seed {seed} with msync pools failed");
    }
}
