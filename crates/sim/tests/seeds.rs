//! The cluster simulator's seeded runs. Each seed builds an in-process cluster (an
//! MDS and one or two data stores over the mock fabric, which delays and reorders
//! completions) and four clients (internal; external; optimistic; weak), and plays a
//! random sequence of POSIX operations, one at a time, each by a client the seed picks. Every operation
//! runs against a reference model too (a tmpfs directory, through system calls): its
//! result must match, and the tree seen through another client must match the model's.
//! Between operations the seed restarts the MDS (after an fsck of its pool while it is
//! down), restarts a data store, or replaces a client by a fresh one; everything
//! acknowledged before must still be there.
//!
//! `SIM_SEEDS` (default 200) sets how many seeds run, `SIM_FIRST` the first one,
//! `SIM_JOBS` (default 6) how many run side by side, and `SIM_SEED` replays one seed
//! (`SIM_REPLAYS` times: servers run on threads, so a seed fixes the operations and
//! faults but not the threads' interleaving; this measures how often its outcome
//! repeats). A failing seed prints the command that replays it; a
//! seed that once failed is kept in [`REGRESSIONS`] and runs every time.

#[path = "../../cli/tests/client_ops/mod.rs"]
mod client_ops;
#[path = "../../meta/tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use client_ops::{client_snapshot, run_client};
use orion_client::Client;
use orion_fabric::mock::Faults;
use orion_pmem::Mode;
use orion_proto::MemberState;
use orion_sim::{ClientKind, Cluster, ClusterConfig, MemberId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::oracle::{oracle_snapshot, run_oracle};
use support::*;

/// Seeds that failed once, with what they found; they run in every test run.
const REGRESSIONS: &[u64] = &[
    // A client's first read after an MDS restart came before the data store had
    // rejoined, and failed with EIO ("no connection to the data store"): clients now
    // wait for a store as long as for a restarting MDS.
    3,
    // An optimistic client's staged write went to the one store of its group then up;
    // the other came back, the commit was refused (EREMCHG), and the client copied the
    // staged pages to both, reading them from the store that had come back and never
    // had them: zeros, committed. Staged pages are now read from a store that took
    // writes since the epoch they were written under (`StoreInfo::since`).
    681,
    // A staged write's store restarted during the write; the client wrote again to
    // it and staged the page, but judged where the page went by the epoch from before
    // the write, so no store counted as holding it and the commit failed with EIO.
    // A write now says which stores took it, under which epoch (`Delivered`).
    132,
    // CI, under load: connections queued at a mock listener that then went away (an
    // MDS restarting) waited out their 5 s handshake, and stalls piled up; a data
    // store rejoined late each time. Such connections are now refused at once, as
    // TCP's are (the whole seed went from 11.8 s to 1.6 s alone).
    166,
];

/// Operations per seed.
const OPS: usize = 40;

/// A power failure inside an operation comes at one of this many steps (pool stores
/// and persists) of the MDS after the operation starts. An operation that changes
/// metadata takes 4 to 16 steps; one that only reads takes none, and then the MDS
/// keeps running.
const MDS_STEPS_PER_OP: u64 = 12;

/// The clients of a run.
const CLIENTS: [ClientKind; 4] = [
    ClientKind {
        internal: true,
        optimistic: false,
        weak: false,
    },
    ClientKind {
        internal: false,
        optimistic: false,
        weak: false,
    },
    ClientKind {
        internal: false,
        optimistic: true,
        weak: false,
    },
    ClientKind {
        internal: false,
        optimistic: false,
        weak: true,
    },
];

/// One seed's run; `Err` says what differed, at which step.
fn run_seed(seed: u64) -> Result<Tally, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let faults = Faults {
        delay: if rng.gen_bool(0.5) { 0.05 } else { 0.0 },
        reorder: rng.gen_bool(0.5),
        break_conn: if rng.gen_bool(0.5) { 0.002 } else { 0.0 },
        ..Default::default()
    };
    // One group, or two (chunks then come from either), of one store or two.
    let stores = rng.gen_range(1..=2u16);
    let replicas = rng.gen_range(1..=2u16);
    let mut cluster = Cluster::start(ClusterConfig {
        seed,
        stores,
        replicas,
        // Odd seeds (the regressions among them) persist at the stores and wait for
        // their notices; even ones write to stores durable on delivery.
        store_mode: if seed % 2 == 1 {
            Mode::Msync
        } else {
            Mode::Volatile
        },
        faults,
        ..Default::default()
    })
    .map_err(|e| format!("starting the cluster: {e:#}"))?;
    let mut clients: Vec<Client> = CLIENTS
        .iter()
        .map(|&kind| cluster.client(kind))
        .collect::<anyhow::Result<_>>()
        .map_err(|e| format!("connecting clients: {e:#}"))?;
    let mut model = Model::new()?;
    let top = "/sim";
    match clients[0].mkdir(top, 0o755) {
        Ok(_) => {}
        // Its first run committed and the connection broke before the reply: the
        // retry finds the directory (the mirror issue brings exactly-once retries).
        Err(e) if clients[0].stats().reconnects > 0 && clients[0].stat(top).is_ok() => {
            eprintln!("seed {seed}: mkdir {top} was retried after it happened: {e}")
        }
        Err(e) => return Err(format!("mkdir {top}: {e}")),
    }
    let ops = random_ops(&mut rng, OPS);
    let mut events = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        // A fault between operations: a restart or power failure of a server, or a
        // new client; or a power failure of the MDS inside this operation.
        let mut crash_inside = None;
        let mut kill_inside = None;
        match rng.gen_range(0..100) {
            0..=1 => {
                cluster
                    .restart_mds()
                    .map_err(|e| format!("step {i}: restarting the MDS: {e:#}"))?;
                events.push(format!("{i}: MDS restarted"));
            }
            2..=3 => {
                cluster
                    .crash_mds()
                    .map_err(|e| format!("step {i}: crashing the MDS: {e:#}"))?;
                events.push(format!("{i}: MDS lost power"));
            }
            4..=7 => {
                let m = MemberId::new(rng.gen_range(0..stores), rng.gen_range(0..replicas));
                cluster
                    .restart_store(m)
                    .map_err(|e| format!("step {i}: restarting data store {m}: {e:#}"))?;
                events.push(format!("{i}: data store {m} killed and restarted"));
            }
            8..=10 => {
                let k = rng.gen_range(0..clients.len());
                // Dropping a client commits what it staged (as close does).
                clients[k] = cluster
                    .client(CLIENTS[k])
                    .map_err(|e| format!("step {i}: reconnecting client {k}: {e:#}"))?;
                events.push(format!("{i}: client {k} replaced"));
            }
            11..=22 => crash_inside = Some(rng.gen_range(1..=MDS_STEPS_PER_OP)),
            // With two replicas a group lives on while one store is down.
            23..=26 => {
                if let Some(m) = killable(&cluster, &clients[1], &mut rng) {
                    cluster
                        .kill_store(m)
                        .map_err(|e| format!("step {i}: killing data store {m}: {e:#}"))?;
                    events.push(format!("{i}: data store {m} killed"));
                }
            }
            27..=32 => {
                let down: Vec<MemberId> = members(&cluster)
                    .filter(|m| !cluster.store_running(*m))
                    .collect();
                if !down.is_empty() {
                    let m = down[rng.gen_range(0..down.len())];
                    cluster
                        .revive_store(m)
                        .map_err(|e| format!("step {i}: reviving data store {m}: {e:#}"))?;
                    events.push(format!("{i}: data store {m} back (it resyncs)"));
                }
            }
            33..=38 => {
                if let Some(m) = killable(&cluster, &clients[1], &mut rng) {
                    kill_inside = Some((m, Duration::from_micros(rng.gen_range(0..3000))));
                }
            }
            _ => {}
        }
        let me = rng.gen_range(0..clients.len());
        let other = (me + 1 + rng.gen_range(0..clients.len() - 1)) % clients.len();
        let op = op.resolve(&oracle_snapshot(model.root()));
        let want = run_oracle(model.root(), &op);
        let reconnects = clients[me].stats().reconnects;
        client_ops::LAST_EIO.with(|m| m.borrow_mut().clear());
        let (got, crashed) = match (crash_inside, kill_inside) {
            (None, Some((m, after))) => {
                events.push(format!("{i}: data store {m} killed inside {op:?}"));
                let got = cluster
                    .kill_store_during(m, after, || run_client(&clients[me], top, &op))
                    .map_err(|e| format!("step {i}: killing {m}: {e:#}"))?;
                (got, false)
            }
            (None, None) => (run_client(&clients[me], top, &op), false),
            (Some(after), _) => cluster
                .crash_mds_during(after, || run_client(&clients[me], top, &op))
                .map_err(|e| format!("step {i}: {op:?} with the MDS crashing: {e:#}"))?,
        };
        if crashed {
            events.push(format!(
                "{i}: MDS lost power inside {op:?} (step {crash_inside:?})"
            ));
        }
        // An operation whose client lost the MDS (a crash, or a broken connection)
        // may or may not have happened.
        let interrupted = crashed || clients[me].stats().reconnects != reconnects;
        if interrupted && !crashed {
            events.push(format!(
                "{i}: client {me} lost its MDS connection inside {op:?}"
            ));
        }
        if got != want && !(interrupted && matches!(got, Outcome::Err(_))) {
            return Err(format!(
                "step {i}: {op:?} by client {me}: orion {got:?}, model {want:?} (last EIO: {:?}; events: {events:?})",
                client_ops::LAST_EIO.with(|m| m.borrow().clone())
            ));
        }
        // Another client's view: what this one did is visible to it at once (its
        // own staged writes commit before the other reads, at the operation's end).
        let seen = snapshot(&clients[other], top).map_err(|e| {
            format!(
                "step {i}: after {op:?} by client {me}, client {other}: {e} (events: {events:?})"
            )
        })?;
        let mut differs = diff_ignoring_times(&oracle_snapshot(model.root()), &seen);
        if got != want && differs.is_some() {
            // The operation failed because the MDS lost power inside it: it may not
            // have happened at all (every operation acknowledged before must be there).
            let done = differs;
            model.undo_last()?;
            differs = diff_ignoring_times(&oracle_snapshot(model.root()), &seen)
                .map(|d| format!("{d}; or, had it happened: {}", done.unwrap_or_default()));
            events.push(format!("{i}: {op:?} failed ({got:?}) and did not happen"));
        } else {
            if got != want {
                // It happened, and its reply was lost with the MDS: the client ran it
                // again and the second run failed (retried requests are not yet
                // recognised: the MDS mirror issue brings exactly-once retries).
                events.push(format!(
                    "{i}: {op:?} happened, and its retry failed ({got:?})"
                ));
            }
            model.happened.push(op.clone());
        }
        if let Some(d) = differs {
            return Err(format!(
                "step {i}: after {op:?} by client {me}, client {other} sees: {d} (events: {events:?})"
            ));
        }
    }
    // The end: every client sees the model's tree, then the MDS restarts once more
    // and fsck must be clean.
    for (k, c) in clients.iter().enumerate() {
        if let Some(d) = diff_ignoring_times(&oracle_snapshot(model.root()), &snapshot(c, top)?) {
            return Err(format!(
                "at the end, client {k} sees: {d} (events: {events:?})"
            ));
        }
    }
    // Every store back, and resynced: then the replicas of each group must hold the
    // same pages.
    let down: Vec<MemberId> = members(&cluster)
        .filter(|m| !cluster.store_running(*m))
        .collect();
    for m in down {
        cluster
            .revive_store(m)
            .map_err(|e| format!("at the end, reviving {m}: {e:#}"))?;
    }
    wait_all_up(&clients[1]).map_err(|e| format!("at the end: {e} (events: {events:?})"))?;
    drop(clients);
    cluster
        .restart_mds()
        .map_err(|e| format!("final restart: {e:#}"))?;
    let c = cluster
        .client(CLIENTS[1])
        .map_err(|e| format!("final client: {e:#}"))?;
    if let Some(d) = diff_ignoring_times(&oracle_snapshot(model.root()), &snapshot(&c, top)?) {
        return Err(format!("after the final restart: {d} (events: {events:?})"));
    }
    wait_all_up(&c).map_err(|e| format!("after the final restart: {e}"))?;
    drop(c);
    cluster.stop().map_err(|e| format!("stopping: {e:#}"))?;
    let compared = cluster
        .compare_replicas()
        .map_err(|e| format!("replicas differ: {e:#} (events: {events:?})"))?;
    let count = |what: &str| events.iter().filter(|e| e.contains(what)).count();
    Ok(Tally {
        crashes: count("lost power"),
        inside: count("lost power inside"),
        retry_failed: count("its retry failed"),
        undone: count("did not happen"),
        lost_connection: count("lost its MDS connection"),
        store_kills: count("killed"),
        resyncs: count("resyncs"),
        pages_compared: compared,
    })
}

/// What the faults of the seeds did, summed over a run.
#[derive(Default, Debug)]
struct Tally {
    /// MDS power failures, between operations and inside them.
    crashes: usize,
    /// Power failures that came inside an operation.
    inside: usize,
    /// Operations that happened but whose retry, after the crash, failed.
    retry_failed: usize,
    /// Operations that failed and did not happen.
    undone: usize,
    /// Operations whose client's MDS connection broke (an injected fault) inside them.
    lost_connection: usize,
    /// Data stores killed (between operations and inside them).
    store_kills: usize,
    /// Data stores that came back after missing writes.
    resyncs: usize,
    /// Pages found equal on every replica of their group at the end.
    pages_compared: u64,
}

/// The reference model: a tmpfs directory, and the operations that happened to it.
struct Model {
    dir: tempfile::TempDir,
    /// Every operation that happened, in order (to build the directory again when the
    /// last one run on it turns out not to have happened).
    happened: Vec<Op>,
}

impl Model {
    fn new() -> Result<Model, String> {
        let dir = tempfile::tempdir_in("/dev/shm").map_err(|e| e.to_string())?;
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .map_err(|e| e.to_string())?;
        Ok(Model {
            dir,
            happened: Vec::new(),
        })
    }

    fn root(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Builds the directory again from what happened, without the operation run on
    /// it last (which was not recorded as happened).
    fn undo_last(&mut self) -> Result<(), String> {
        let mut fresh = Model::new()?;
        for op in &self.happened {
            run_oracle(fresh.root(), op);
        }
        fresh.happened = std::mem::take(&mut self.happened);
        *self = fresh;
        Ok(())
    }
}

/// Every data store of the cluster.
fn members(c: &Cluster) -> impl Iterator<Item = MemberId> + '_ {
    (0..c.cfg.stores).flat_map(move |g| (0..c.cfg.replicas).map(move |i| MemberId::new(g, i)))
}

/// A running store whose group keeps another store that serves (up, in sync, as
/// `client` learns from the MDS) if it dies.
fn killable(c: &Cluster, client: &Client, rng: &mut StdRng) -> Option<MemberId> {
    let (_, map) = client.cluster_map().ok()?;
    let serving: Vec<MemberId> = map
        .iter()
        .filter(|s| s.state == MemberState::Up)
        .map(|s| s.member)
        .collect();
    let ok: Vec<MemberId> = members(c)
        .filter(|m| c.store_running(*m))
        // Up in the map and running: the MDS takes a killed store out of the map only
        // when it notices (at worst a heartbeat timeout later), and until then its map
        // names a store that is gone (seed 189 killed both stores of a group so).
        .filter(|m| {
            serving
                .iter()
                .any(|o| o.group == m.group && o != m && c.store_running(*o))
        })
        .collect();
    (!ok.is_empty()).then(|| ok[rng.gen_range(0..ok.len())])
}

/// Waits until the MDS says every store is up (resyncs finished). Generous: with six
/// seeds side by side on two cores a rejoin can take long. (Seeds 50 and 135 once
/// waited past 30 s under load; the likely cause, connects stuck at a dead MDS's
/// listener for their whole handshake deadline, is gone since seed 166 found it.)
fn wait_all_up(c: &Client) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (_, map) = c.cluster_map().map_err(|e| e.to_string())?;
        if map.iter().all(|s| s.state == MemberState::Up) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("stores not up after 90 s: {map:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A client's view of the tree under `top`, or why it could not be read.
fn snapshot(c: &Client, top: &str) -> Result<Snapshot, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| client_snapshot(c, top))).map_err(
        |p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            format!("reading the tree through a client failed: {msg}")
        },
    )
}

fn replay_command(seed: u64) -> String {
    format!("SIM_SEED={seed} cargo test -p orion-sim --test seeds -- --nocapture")
}

#[test]
fn seeded_runs_match_the_model_across_restarts() {
    // SAFETY: umask only sets the process's file-creation mask.
    unsafe { libc::umask(UMASK as libc::mode_t) };
    // The servers' logs, with RUST_LOG (e.g. RUST_LOG=info when replaying a seed).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let seeds: Vec<u64> = match env("SIM_SEED") {
        // The same seed again and again: how reproducible its outcome is.
        Some(s) => vec![s; env("SIM_REPLAYS").unwrap_or(1).max(1) as usize],
        None => {
            let first = env("SIM_FIRST").unwrap_or(1);
            let n = env("SIM_SEEDS").unwrap_or(200);
            REGRESSIONS
                .iter()
                .copied()
                .chain(first..first + n)
                .collect()
        }
    };
    let t0 = Instant::now();
    // Seeds are independent (each has its own mock network, pools and model), and a
    // run mostly waits for its servers' threads: a few run side by side.
    let workers = env("SIM_JOBS").unwrap_or(6).max(1) as usize;
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let tally = Mutex::new(Tally::default());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let Some(&seed) = seeds.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return;
                };
                let r = std::panic::catch_unwind(|| run_seed(seed))
                    .unwrap_or_else(|_| Err("panicked (see above)".into()));
                if let Ok(t) = &r {
                    let mut sum = tally.lock().unwrap();
                    sum.crashes += t.crashes;
                    sum.inside += t.inside;
                    sum.retry_failed += t.retry_failed;
                    sum.undone += t.undone;
                    sum.lost_connection += t.lost_connection;
                    sum.store_kills += t.store_kills;
                    sum.resyncs += t.resyncs;
                    sum.pages_compared += t.pages_compared;
                }
                if let Err(e) = r {
                    eprintln!(
                        "sim seed {seed} FAILED: {e}\n  replay: {}",
                        replay_command(seed)
                    );
                    failures.lock().unwrap().push(seed);
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort_unstable();
    let t = tally.into_inner().unwrap();
    println!(
        "sim seeds: {}, failures: {} ({:.1} s); MDS power failures: {} ({} inside an \
         operation: {} operations did not happen, {} happened but their retry failed); \
         operations that lost their MDS connection: {}; data stores killed: {}, back \
         and resynced: {}; replica pages compared equal: {}",
        seeds.len(),
        failures.len(),
        t0.elapsed().as_secs_f64(),
        t.crashes,
        t.inside,
        t.undone,
        t.retry_failed,
        t.lost_connection,
        t.store_kills,
        t.resyncs,
        t.pages_compared,
    );
    assert!(
        failures.is_empty(),
        "failing seeds {failures:?}; replay one with: {}",
        replay_command(failures[0])
    );
}
