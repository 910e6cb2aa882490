//! Optimistic persistence (Assise §3.3) through the client library, against a real
//! MDS and data store: a client that stages its small writes reads what it wrote,
//! matches a local file under random operations, and makes its writes visible to
//! other clients at fsync, close, the end of its stage time, or when it goes away;
//! a staged write that cannot commit is reported by the next fsync.

mod cluster;

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use cluster::{Cluster, BACKENDS};
use orion_client::{Client, Fd, OpenFlags};
use rand::{Rng, SeedableRng};

const PAGE: usize = 4096;

fn seed() -> u64 {
    std::env::var("ORION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x4F50_5449)
}

/// A client with optimistic persistence whose writes stay staged for `stage_ms`.
fn optimistic(c: &Cluster, internal: bool, stage_ms: u64) -> Client {
    let mut cfg = c.client_config(true, internal);
    cfg.persistence = "optimistic".into();
    cfg.stage_ms = stage_ms;
    Client::connect(cfg, c.fabric()).expect("optimistic client")
}

/// The whole file as another client reads it.
fn contents(c: &Client, path: &str) -> Vec<u8> {
    let fd = c.open(path, OpenFlags::read(), 0).unwrap();
    let size = c.fstat(fd).unwrap().size as usize;
    let b = c.pread(fd, 0, size + 1).unwrap();
    c.close(fd).unwrap();
    b
}

fn pattern(len: usize, tag: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(tag * 7) as u8)
        .collect()
}

#[test]
fn staged_writes_are_read_back_at_once_and_reach_others_at_fsync_and_close() {
    for backend in BACKENDS {
        let c = Cluster::start(backend, 1);
        for internal in [true, false] {
            let a = optimistic(&c, internal, 600_000);
            let b = c.client(true, false);
            let path = format!("/staged-{internal}");
            let fd = a
                .open(&path, OpenFlags::read_write_create(), 0o644)
                .unwrap();
            let staged_before = a.stats().staged_writes;
            let commits_before = a.stats().commits;
            for p in 0..10u64 {
                let page = pattern(PAGE, p);
                assert_eq!(a.pwrite(fd, p * PAGE as u64, &page).unwrap(), PAGE);
                // This client reads its staged write at once.
                assert_eq!(a.pread(fd, p * PAGE as u64, PAGE).unwrap(), page);
            }
            let s = a.stats();
            assert_eq!(s.staged_writes - staged_before, 10, "{s:?}");
            assert_eq!(s.commits, commits_before, "nothing committed yet: {s:?}");
            // Another client does not see them yet (the stage time is long)...
            assert!(contents(&b, &path).is_empty(), "{backend}: seen early");
            // ...and sees all of them, in one commit, once fsync returns.
            a.fsync(fd).unwrap();
            assert_eq!(a.stats().commits, commits_before + 1);
            let want: Vec<u8> = (0..10).flat_map(|p| pattern(PAGE, p)).collect();
            assert_eq!(contents(&b, &path), want, "{backend}: after fsync");
            // Overwrites staged after the fsync reach others at close.
            a.pwrite(fd, 0, &pattern(2 * PAGE, 99)).unwrap();
            a.close(fd).unwrap();
            let mut want = want;
            want[..2 * PAGE].copy_from_slice(&pattern(2 * PAGE, 99));
            assert_eq!(contents(&b, &path), want, "{backend}: after close");
        }
    }
}

#[test]
fn random_operations_on_an_optimistic_client_match_a_local_file() {
    let seed = seed();
    let dir = tempfile::tempdir().unwrap();
    for backend in BACKENDS {
        let c = Cluster::start(backend, 1);
        for internal in [true, false] {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            let a = optimistic(&c, internal, 600_000);
            let b = c.client(true, false);
            let path = format!("/random-{internal}");
            let fd = a
                .open(&path, OpenFlags::read_write_create(), 0o644)
                .unwrap();
            let local_path = dir.path().join(format!("{backend}-{internal}"));
            let model = std::fs::File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&local_path)
                .unwrap();
            let mut staged = 0u64;
            for step in 0..400u64 {
                let ctx = || {
                    format!("seed {seed} (ORION_SEED), {backend}, internal {internal}, step {step}")
                };
                let span = 48 * PAGE as u64;
                match rng.gen_range(0..100) {
                    // Small whole-page writes: staged.
                    0..=44 => {
                        let off = rng.gen_range(0..48u64) * PAGE as u64;
                        let len = rng.gen_range(1..=4) * PAGE;
                        let data = pattern(len, step);
                        a.pwrite(fd, off, &data).unwrap();
                        model.write_all_at(&data, off).unwrap();
                        staged += 1;
                    }
                    // Writes inside pages, and whole-page writes too long to stage.
                    45..=59 => {
                        let off = rng.gen_range(0..span);
                        let len = if rng.gen_bool(0.5) {
                            rng.gen_range(1..3 * PAGE)
                        } else {
                            20 * PAGE
                        };
                        let off = if len == 20 * PAGE {
                            off / PAGE as u64 * PAGE as u64
                        } else {
                            off
                        };
                        let data = pattern(len, step);
                        a.pwrite(fd, off, &data).unwrap();
                        model.write_all_at(&data, off).unwrap();
                    }
                    60..=84 => {
                        let off = rng.gen_range(0..span + PAGE as u64);
                        let len = rng.gen_range(1..6 * PAGE);
                        let got = a.pread(fd, off, len).unwrap();
                        let mut want = vec![0u8; len];
                        let n = model.read_at(&mut want, off).unwrap();
                        want.truncate(n);
                        assert_eq!(got, want, "{}: read {off}+{len}", ctx());
                    }
                    85..=89 => {
                        let size = rng.gen_range(0..span);
                        a.ftruncate(fd, size).unwrap();
                        model.set_len(size).unwrap();
                    }
                    90..=94 => {
                        let size = model.metadata().unwrap().len();
                        assert_eq!(a.fstat(fd).unwrap().size, size, "{}: fstat", ctx());
                    }
                    _ => {
                        a.fsync(fd).unwrap();
                        let want = std::fs::read(&local_path).unwrap();
                        assert_eq!(contents(&b, &path), want, "{}: after fsync", ctx());
                    }
                }
            }
            assert!(a.stats().staged_writes >= staged, "{:?}", a.stats());
            a.close(fd).unwrap();
            let want = std::fs::read(&local_path).unwrap();
            assert_eq!(contents(&b, &path), want, "seed {seed}: after close");
        }
    }
}

#[test]
fn staged_writes_commit_when_due_and_when_the_client_goes_away() {
    let c = Cluster::start("local", 1);
    let b = c.client(true, false);
    // Due: the flusher commits a write 20 ms after it was staged, with no further
    // call from the writer.
    let a = optimistic(&c, true, 20);
    let fd = a
        .open("/due", OpenFlags::read_write_create(), 0o644)
        .unwrap();
    a.pwrite(fd, 0, &pattern(PAGE, 1)).unwrap();
    let waited = Instant::now();
    while contents(&b, "/due").is_empty() {
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "a staged write never committed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(contents(&b, "/due"), pattern(PAGE, 1));
    // Gone: a client dropped with a file open commits what it staged.
    let a = optimistic(&c, true, 600_000);
    let fd: Fd = a
        .open("/gone", OpenFlags::read_write_create(), 0o644)
        .unwrap();
    a.pwrite(fd, 0, &pattern(3 * PAGE, 2)).unwrap();
    assert!(contents(&b, "/gone").is_empty());
    drop(a);
    assert_eq!(contents(&b, "/gone"), pattern(3 * PAGE, 2));
}

/// POSIX: a file another client unlinks stays the holder's until its last close,
/// staged writes included: they commit to it, and read back through the descriptor.
#[test]
fn a_staged_write_to_a_file_another_client_unlinked_commits() {
    let c = Cluster::start("local", 1);
    let a = optimistic(&c, true, 600_000);
    let b = c.client(true, false);
    let fd = a
        .open("/kept", OpenFlags::read_write_create(), 0o644)
        .unwrap();
    a.pwrite(fd, 0, &pattern(PAGE, 5)).unwrap();
    b.unlink("/kept").unwrap();
    a.fsync(fd).unwrap();
    assert_eq!(a.pread(fd, 0, 2 * PAGE).unwrap(), pattern(PAGE, 5));
    assert_eq!(a.fstat(fd).unwrap().nlink, 0);
    a.close(fd).unwrap();
}

#[test]
fn a_staged_write_that_cannot_commit_is_reported_by_the_next_fsync_once() {
    let mut c = Cluster::start("local", 1);
    let a = optimistic(&c, true, 600_000);
    let b = c.client(true, false);
    let fd = a
        .open("/doomed", OpenFlags::read_write_create(), 0o644)
        .unwrap();
    a.pwrite(fd, 0, &pattern(PAGE, 3)).unwrap();
    // The MDS restarts before the write commits: the chunk its pages came from is
    // taken back, so the write is lost (a pessimistic client would have committed
    // before its write returned).
    c.restart_mds();
    let e = a.fsync(fd).expect_err("the staged write could not commit");
    assert_eq!(e.errno(), libc::EIO, "fsync said {e}");
    // Reported once, as Linux reports a failed writeback.
    a.fsync(fd).unwrap();
    // The client goes on: its pages went back to its chunk and are used again.
    let fd2 = a
        .open("/after", OpenFlags::read_write_create(), 0o644)
        .unwrap();
    a.pwrite(fd2, 0, &pattern(PAGE, 4)).unwrap();
    a.close(fd2).unwrap();
    assert_eq!(contents(&b, "/after"), pattern(PAGE, 4));
}
