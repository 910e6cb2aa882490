//! `orion bench threads`: how the client library scales with the threads of one
//! process (the mount-scaling issue). N threads run 4 KiB random writes, 4 KiB random
//! reads, and create + stat + unlink, each on files of its own, for a fixed time;
//! once through one shared `Client` (what a mount's FUSE threads or a program's
//! threads under the preload library use) and once with a `Client` per thread (what
//! N processes get). The second shows what the cluster itself allows; the gap between
//! the two is the client library's own serialisation.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use orion_client::{Client, OpenFlags};

use crate::bench_client::xorshift;
use crate::bench_cluster::BenchCluster;

fn fs<T>(r: orion_client::FsResult<T>) -> Result<T> {
    r.map_err(|e| anyhow!("{e}"))
}

/// Bytes of each thread's file.
const FILE: u64 = 8 << 20;

#[derive(Clone, Copy)]
enum Work {
    Write,
    Read,
    Meta,
}

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::Write => "write_4k",
            Work::Read => "read_4k",
            Work::Meta => "create_stat_unlink",
        }
    }
}

/// One thread's loop for `time`; returns its operations (a create + stat + unlink
/// counts as one).
fn worker(c: &Client, t: usize, work: Work, time: Duration) -> Result<u64> {
    let mut next = xorshift(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1));
    let page = vec![t as u8; 4096];
    let t0 = Instant::now();
    let mut n = 0u64;
    let rw = OpenFlags {
        read: true,
        write: true,
        ..Default::default()
    };
    match work {
        Work::Write | Work::Read => {
            let fd = fs(c.open(&format!("/threads/f{t}"), rw, 0))?;
            while t0.elapsed() < time {
                let off = (next() % (FILE / 4096)) * 4096;
                match work {
                    Work::Write => {
                        fs(c.pwrite(fd, off, &page))?;
                    }
                    _ => {
                        fs(c.pread(fd, off, 4096))?;
                    }
                }
                n += 1;
            }
            fs(c.close(fd))?;
        }
        Work::Meta => {
            while t0.elapsed() < time {
                let path = format!("/threads/d{t}/x{n}");
                let fd = fs(c.open(&path, OpenFlags::create(), 0o644))?;
                fs(c.close(fd))?;
                fs(c.stat(&path))?;
                fs(c.unlink(&path))?;
                n += 1;
            }
        }
    }
    Ok(n)
}

/// Operations per second of `threads` threads on `clients` (one shared, or one each).
fn measure(clients: &[Client], threads: usize, work: Work, time: Duration) -> Result<f64> {
    let t0 = Instant::now();
    let total = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let c = &clients[t % clients.len()];
                s.spawn(move || worker(c, t, work, time))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| anyhow!("a worker panicked"))?)
            .sum::<Result<u64>>()
    })?;
    Ok(total as f64 / t0.elapsed().as_secs_f64())
}

pub fn run(
    backend: &str,
    provider: &str,
    threads: &[usize],
    millis: u64,
    json: bool,
) -> Result<()> {
    let cluster = BenchCluster::start(backend, provider)?;
    let most = threads.iter().copied().max().unwrap_or(1);
    let shared = vec![cluster.client(true, true)?];
    let own: Vec<Client> = (0..most)
        .map(|_| cluster.client(true, true))
        .collect::<Result<_>>()?;
    // Every thread's file, written whole once, and its directory.
    let c = &shared[0];
    fs(c.mkdir("/threads", 0o755))?;
    let chunk = vec![0x5Au8; 1 << 20];
    for t in 0..most {
        fs(c.mkdir(&format!("/threads/d{t}"), 0o755))?;
        let fd = fs(c.open(&format!("/threads/f{t}"), OpenFlags::create(), 0o644))?;
        for off in (0..FILE).step_by(chunk.len()) {
            fs(c.pwrite(fd, off, &chunk))?;
        }
        fs(c.close(fd))?;
    }
    let time = Duration::from_millis(millis);
    let mut rows = Vec::new();
    for work in [Work::Write, Work::Read, Work::Meta] {
        for &n in threads {
            let one = measure(&shared, n, work, time)?;
            let each = measure(&own[..n], n, work, time)?;
            rows.push((work, n, one, each));
        }
    }
    let base = |work: &str, col: fn(&(Work, usize, f64, f64)) -> f64| {
        rows.iter()
            .find(|r| r.0.name() == work && r.1 == threads[0])
            .map(col)
            .unwrap_or(1.0)
    };
    if json {
        let items: Vec<String> = rows
            .iter()
            .map(|(w, n, one, each)| {
                format!(
                    "{{\"work\":\"{}\",\"threads\":{n},\"shared_client_ops\":{one:.0},\
                     \"client_per_thread_ops\":{each:.0}}}",
                    w.name()
                )
            })
            .collect();
        println!(
            "{{\"backend\":\"{backend}\",\"millis\":{millis},\"rows\":[{}]}}",
            items.join(",")
        );
        return Ok(());
    }
    println!(
        "orion bench threads: backend {backend}, internal strong clients, one data store, \
         pools on /dev/shm, {millis} ms per row; ops/s (and × the first row)"
    );
    println!(
        "{:<20} {:>7} {:>22} {:>24}",
        "workload", "threads", "one shared Client", "a Client per thread"
    );
    for r in &rows {
        let (w, n, one, each) = r;
        println!(
            "{:<20} {:>7} {:>13.0} ({:>4.2}×) {:>15.0} ({:>4.2}×)",
            w.name(),
            n,
            one,
            one / base(w.name(), |r| r.2),
            each,
            each / base(w.name(), |r| r.3)
        );
    }
    Ok(())
}
