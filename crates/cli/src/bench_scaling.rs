//! The scaling rows of `orion bench workloads`: how one file system serves 1, 2 and 4
//! jobs at once (8 too where the machine has 8 cores), each job a thread of this
//! process on files of its own, so every job of a mount goes through the same mount
//! (its FUSE threads), and every job of the client library through one `Client`
//! (its lanes). Three workloads: 4 KiB random writes and 4 KiB random reads on a
//! 16 MiB file per job (laid out first, untimed), and create + stat + unlink in a
//! directory per job. Each job count runs for the row's seconds; the figure is
//! operations per second over all jobs (create, stat and unlink count one each).

use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};

use crate::bench_cpu::CpuMeter;
use crate::bench_workloads::{How, Rng, Target};

#[derive(Clone, Copy, PartialEq)]
pub enum Scaled {
    Write4k,
    Read4k,
    CreateStatUnlink,
}

/// 1, 2 and 4 always (the goal is set at 4), and 8 when the machine has 8
/// cores: on fewer, 8 jobs would measure the scheduler, not the file system.
pub fn job_counts() -> Vec<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut v = vec![1, 2, 4];
    if cores >= 8 {
        v.push(8);
    }
    v
}

const FILE_PAGES: u64 = 4096;

/// Runs `kind` with each job count in turn; `{"jobs": {"1": {"ops_s": ..}, ..}}`.
pub fn scaling<T: Target>(t: &T, d: &str, kind: Scaled, secs: Duration) -> Result<Value> {
    let counts = job_counts();
    let most = *counts.iter().max().expect("job counts");
    if kind != Scaled::CreateStatUnlink {
        lay_out(t, d, most)?;
    }
    let mut out = serde_json::Map::new();
    for jobs in counts {
        let (ops_s, cpu) = run_jobs(t, d, kind, jobs, secs)?;
        out.insert(jobs.to_string(), json!({ "ops_s": ops_s, "cpu": cpu }));
    }
    Ok(json!({ "jobs": out }))
}

/// The files of the I/O workloads, written once and shared by every job count.
fn lay_out<T: Target>(t: &T, d: &str, jobs: usize) -> Result<()> {
    let mib = vec![0xA5u8; 1 << 20];
    for j in 0..jobs {
        let f = t.open(&format!("{d}/s.{j}"), How::ReadWrite)?;
        for i in 0..(FILE_PAGES * 4096) >> 20 {
            t.write_at(&f, i << 20, &mib)?;
        }
        t.fsync(&f)?;
        t.close(f)?;
    }
    Ok(())
}

/// `jobs` threads that start together and stop at one deadline; ops/s over all, and
/// the CPU per operation over every process.
fn run_jobs<T: Target>(
    t: &T,
    d: &str,
    kind: Scaled,
    jobs: usize,
    secs: Duration,
) -> Result<(f64, Value)> {
    let start = Barrier::new(jobs + 1);
    let (total, elapsed, meter) = std::thread::scope(|s| -> Result<(u64, f64, CpuMeter)> {
        let start = &start;
        let hs: Vec<_> = (0..jobs)
            .map(|j| s.spawn(move || job(t, d, kind, j, start, secs)))
            .collect();
        start.wait();
        // From the start of the timed part (the jobs' set-up is before the barrier).
        let meter = CpuMeter::start();
        let t0 = Instant::now();
        let mut total = 0;
        for h in hs {
            total += h.join().map_err(|_| anyhow!("a job panicked"))??;
        }
        Ok((total, t0.elapsed().as_secs_f64(), meter))
    })?;
    Ok((total as f64 / elapsed, meter.finish(total)))
}

/// Waits at the start barrier once: when told to, or when dropped (a job that failed
/// or panicked before the start still arrives, or the others would wait forever).
struct Start<'a>(Option<&'a Barrier>);

impl Start<'_> {
    fn wait(&mut self) {
        if let Some(b) = self.0.take() {
            b.wait();
        }
    }
}

impl Drop for Start<'_> {
    fn drop(&mut self) {
        self.wait();
    }
}

/// One job: opens what it needs, waits for the others, runs until the deadline.
fn job<T: Target>(
    t: &T,
    d: &str,
    kind: Scaled,
    j: usize,
    start: &Barrier,
    secs: Duration,
) -> Result<u64> {
    let mut start = Start(Some(start));
    if kind == Scaled::CreateStatUnlink {
        let dir = format!("{d}/j{j}");
        // A directory left by an earlier job count is reused.
        if let Err(e) = t.mkdir(&dir) {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(e.into());
            }
        }
        start.wait();
        let deadline = Instant::now() + secs;
        let mut ops = 0u64;
        let mut k = 0u64;
        while Instant::now() < deadline {
            let p = format!("{dir}/f{k}");
            k += 1;
            let f = t.create(&p)?;
            t.close(f)?;
            t.stat(&p)?;
            t.unlink(&p)?;
            ops += 3;
        }
        return Ok(ops);
    }
    let f = t.open(&format!("{d}/s.{j}"), How::ReadWrite)?;
    let ran = io_loop(t, &f, kind, j, &mut start, secs);
    // Closed whatever happened: a client library's handle would stay open.
    let closed = t.close(f);
    let ops = ran?;
    closed?;
    Ok(ops)
}

/// The I/O workloads' loop on an open file.
fn io_loop<T: Target>(
    t: &T,
    f: &T::File,
    kind: Scaled,
    j: usize,
    start: &mut Start,
    secs: Duration,
) -> Result<u64> {
    t.invalidate(f)?;
    let page = vec![0x5Au8; 4096];
    let mut buf = vec![0u8; 4096];
    // Every page once per pass, in a fresh order each pass (fio's random map); reads
    // drop the kernel's cached pages before each pass, so they reach the file system.
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (j as u64 + 1));
    let mut order: Vec<u32> = (0..FILE_PAGES as u32).collect();
    let mut next = order.len();
    start.wait();
    let deadline = Instant::now() + secs;
    let mut ops = 0u64;
    while Instant::now() < deadline {
        if next == order.len() {
            rng.shuffle(&mut order);
            next = 0;
            if kind == Scaled::Read4k {
                t.invalidate(f)?;
            }
        }
        let off = order[next] as u64 * 4096;
        next += 1;
        if kind == Scaled::Write4k {
            t.write_at(f, off, &page)?;
        } else if t.read_at(f, off, &mut buf)? != buf.len() {
            bail!("a short read at {off}");
        }
        ops += 1;
    }
    Ok(ops)
}
