//! `orion bench workloads`: every workload of the side-by-side comparison, run on one
//! target and written as JSON. The target is a directory of whatever file system is
//! mounted there (system calls), or, with `--api`, OrionFS through the client library
//! in this process against an MDS and a data store it starts (`--optimistic`: with
//! optimistic persistence). Workloads:
//! - latency: 4 KiB random write (with and without an fsync after each write, timed
//!   together) and read on a 64 MiB file, one synchronous call at a time (fio's psync
//!   at iodepth 1); create, mkdir, stat, unlink, rmdir on N entries; p50 and p99;
//! - bandwidth: 1 MiB sequential write and read of 256 MiB per job, 1 and 2 jobs;
//! - the paper's Table 2 application workloads (filebench's varmail, fileserver and
//!   webserver personalities, written here since filebench is not packaged in Debian):
//!   the table's thread counts, file sizes and append sizes, file counts scaled by
//!   `--scale`; operations per second (each open, close, read, append, fsync,
//!   create, delete and stat counts one);
//! - SQLite with synchronous commits (`synchronous=FULL`): transactions per second
//!   (a mounted directory only: the sqlite3 program needs system calls);
//! - scaling: 4 KiB random writes and reads, and create + stat + unlink, with 1, 2
//!   and 4 jobs (8 on 8 cores) at once (`bench_scaling`).
//!
//! The same code runs every workload on every target, so the figures differ only by
//! the file system under it.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use orion_client::{Client, Fd, OpenFlags};
use orion_meta::FsError;
use orion_progress::{Progress, Unit};
use serde_json::{json, Value};

use crate::bench_cpu::CpuMeter;
use crate::bench_fabric::{lat, Lat};
use crate::bench_mount::timed;
use crate::bench_scaling::{scaling, Scaled};

pub struct Options {
    /// The system's name, for the progress lines and the JSON.
    pub system: String,
    pub entries: usize,
    pub seconds: u64,
    pub scale: f64,
    /// Run only the workloads whose names contain one of these (all when empty).
    pub only: Vec<String>,
}

/// How a workload opens a file.
#[derive(Clone, Copy)]
pub enum How {
    Read,
    /// Writes go to the end.
    Append,
    /// Read and write, created if missing.
    ReadWrite,
}

/// What the workloads run on. Paths are relative to the target's root.
pub trait Target: Sync {
    type File: Send;
    /// The mounted directory, for programs that need one (sqlite3).
    fn dir(&self) -> Option<&Path>;
    /// Creates (or truncates) a file for writing.
    fn create(&self, p: &str) -> io::Result<Self::File>;
    fn open(&self, p: &str, how: How) -> io::Result<Self::File>;
    fn write_at(&self, f: &Self::File, off: u64, b: &[u8]) -> io::Result<()>;
    /// Writes at the end of a file opened with [`How::Append`].
    fn append(&self, f: &Self::File, b: &[u8]) -> io::Result<()>;
    fn read_at(&self, f: &Self::File, off: u64, b: &mut [u8]) -> io::Result<usize>;
    fn fsync(&self, f: &Self::File) -> io::Result<()>;
    /// Drops the kernel's cached pages of a file before timed reads (what fio does
    /// by default, `invalidate=1`), so reads reach the file system.
    fn invalidate(&self, f: &Self::File) -> io::Result<()>;
    fn close(&self, f: Self::File) -> io::Result<()>;
    fn mkdir(&self, p: &str) -> io::Result<()>;
    fn rmdir(&self, p: &str) -> io::Result<()>;
    fn unlink(&self, p: &str) -> io::Result<()>;
    fn stat(&self, p: &str) -> io::Result<()>;
    /// Removes a directory and everything under it.
    fn remove_tree(&self, p: &str) -> io::Result<()>;
}

/// A directory of a mounted file system, through system calls.
pub struct Mounted(pub PathBuf);

impl Target for Mounted {
    type File = File;

    fn dir(&self) -> Option<&Path> {
        Some(&self.0)
    }
    fn create(&self, p: &str) -> io::Result<File> {
        File::create(self.0.join(p))
    }
    fn open(&self, p: &str, how: How) -> io::Result<File> {
        let mut o = OpenOptions::new();
        match how {
            How::Read => o.read(true),
            How::Append => o.append(true),
            How::ReadWrite => o.read(true).write(true).create(true),
        };
        o.open(self.0.join(p))
    }
    fn write_at(&self, f: &File, off: u64, b: &[u8]) -> io::Result<()> {
        f.write_all_at(b, off)
    }
    fn append(&self, mut f: &File, b: &[u8]) -> io::Result<()> {
        f.write_all(b)
    }
    fn read_at(&self, f: &File, off: u64, b: &mut [u8]) -> io::Result<usize> {
        FileExt::read_at(f, b, off)
    }
    fn fsync(&self, f: &File) -> io::Result<()> {
        f.sync_all()
    }
    fn invalidate(&self, f: &File) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: posix_fadvise only reads the descriptor, which `f` keeps open.
        let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(())
    }
    fn close(&self, f: File) -> io::Result<()> {
        drop(f);
        Ok(())
    }
    fn mkdir(&self, p: &str) -> io::Result<()> {
        std::fs::create_dir(self.0.join(p))
    }
    fn rmdir(&self, p: &str) -> io::Result<()> {
        std::fs::remove_dir(self.0.join(p))
    }
    fn unlink(&self, p: &str) -> io::Result<()> {
        std::fs::remove_file(self.0.join(p))
    }
    fn stat(&self, p: &str) -> io::Result<()> {
        std::fs::symlink_metadata(self.0.join(p)).map(drop)
    }
    fn remove_tree(&self, p: &str) -> io::Result<()> {
        std::fs::remove_dir_all(self.0.join(p))
    }
}

/// OrionFS through the client library, under a directory of its namespace.
pub struct Api {
    pub client: Client,
    pub root: String,
}

/// A client of the cluster `orion up --dir DIR` runs, as `orion run` makes one (the
/// default settings over that cluster's MDSs and fabric), optimistic if asked.
pub fn up_client(dir: &Path, optimistic: bool) -> Result<Client> {
    let up = crate::status::UpState::load(dir)?;
    let mut cfg = orion_client::ClientConfig {
        mds: up.mds_setting(),
        ..Default::default()
    };
    if optimistic {
        cfg.persistence = "optimistic".into();
    }
    let fabric = up.fabric.fabric_config()?;
    Client::connect(cfg, fabric).map_err(|e| anyhow::anyhow!("client of {}: {e}", dir.display()))
}

fn os_err(e: FsError) -> io::Error {
    match e {
        e if e.is_refusal() => io::Error::from_raw_os_error(e.errno()),
        other => io::Error::other(other.to_string()),
    }
}

impl Api {
    fn path(&self, p: &str) -> String {
        format!("{}/{p}", self.root)
    }
    fn open_with(&self, p: &str, flags: OpenFlags) -> io::Result<Fd> {
        self.client
            .open(&self.path(p), flags, 0o644)
            .map_err(os_err)
    }
}

impl Target for Api {
    type File = Fd;

    fn dir(&self) -> Option<&Path> {
        None
    }
    fn create(&self, p: &str) -> io::Result<Fd> {
        self.open_with(p, OpenFlags::create())
    }
    fn open(&self, p: &str, how: How) -> io::Result<Fd> {
        let flags = match how {
            How::Read => OpenFlags::read(),
            How::Append => OpenFlags {
                write: true,
                append: true,
                ..Default::default()
            },
            How::ReadWrite => OpenFlags {
                read: true,
                write: true,
                create: true,
                ..Default::default()
            },
        };
        self.open_with(p, flags)
    }
    fn write_at(&self, f: &Fd, off: u64, b: &[u8]) -> io::Result<()> {
        self.client.pwrite(*f, off, b).map(drop).map_err(os_err)
    }
    fn append(&self, f: &Fd, b: &[u8]) -> io::Result<()> {
        self.client.write(*f, b).map(drop).map_err(os_err)
    }
    fn read_at(&self, f: &Fd, off: u64, b: &mut [u8]) -> io::Result<usize> {
        let got = self.client.pread(*f, off, b.len()).map_err(os_err)?;
        b[..got.len()].copy_from_slice(&got);
        Ok(got.len())
    }
    fn fsync(&self, f: &Fd) -> io::Result<()> {
        self.client.fsync(*f).map_err(os_err)
    }
    fn invalidate(&self, _: &Fd) -> io::Result<()> {
        // No kernel cache in between; the client's own cache is the system's.
        Ok(())
    }
    fn close(&self, f: Fd) -> io::Result<()> {
        self.client.close(f).map_err(os_err)
    }
    fn mkdir(&self, p: &str) -> io::Result<()> {
        self.client
            .mkdir(&self.path(p), 0o755)
            .map(drop)
            .map_err(os_err)
    }
    fn rmdir(&self, p: &str) -> io::Result<()> {
        self.client.rmdir(&self.path(p)).map_err(os_err)
    }
    fn unlink(&self, p: &str) -> io::Result<()> {
        self.client.unlink(&self.path(p)).map_err(os_err)
    }
    fn stat(&self, p: &str) -> io::Result<()> {
        self.client.lstat(&self.path(p)).map(drop).map_err(os_err)
    }
    fn remove_tree(&self, p: &str) -> io::Result<()> {
        let full = self.path(p);
        for e in self.client.readdir(&full).map_err(os_err)? {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let child = format!("{p}/{}", String::from_utf8_lossy(&e.name));
            if e.ftype == orion_format::FileType::Directory {
                self.remove_tree(&child)?;
            } else {
                self.unlink(&child)?;
            }
        }
        self.rmdir(p)
    }
}

type Workload<'a> = (&'static str, Box<dyn Fn(&str) -> Result<Value> + 'a>);

pub fn run<T: Target>(t: &T, o: &Options) -> Result<Value> {
    let secs = Duration::from_secs(o.seconds.max(1));
    let scale = o.scale;
    let work_secs = secs * 2;
    let all: Vec<Workload> = vec![
        (
            "4k_randwrite",
            Box::new(move |d: &str| lat4k(t, d, Io4k::Write, secs)),
        ),
        (
            "4k_randwrite_fsync",
            Box::new(move |d: &str| lat4k(t, d, Io4k::WriteFsync, secs)),
        ),
        (
            "4k_randread",
            Box::new(move |d: &str| lat4k(t, d, Io4k::Read, secs)),
        ),
        ("metadata", Box::new(|d: &str| metadata(t, d, o.entries))),
        (
            "1m_seqwrite_1job",
            Box::new(move |d: &str| seq(t, d, true, 1)),
        ),
        (
            "1m_seqwrite_2jobs",
            Box::new(move |d: &str| seq(t, d, true, 2)),
        ),
        (
            "1m_seqread_1job",
            Box::new(move |d: &str| seq(t, d, false, 1)),
        ),
        (
            "1m_seqread_2jobs",
            Box::new(move |d: &str| seq(t, d, false, 2)),
        ),
        (
            "varmail",
            Box::new(move |d: &str| table2(t, d, &VARMAIL, scale, work_secs)),
        ),
        (
            "fileserver",
            Box::new(move |d: &str| table2(t, d, &FILESERVER, scale, work_secs)),
        ),
        (
            "webserver",
            Box::new(move |d: &str| table2(t, d, &WEBSERVER, scale, work_secs)),
        ),
        ("sqlite", Box::new(|d: &str| sqlite(t, d, 300))),
        (
            "scale_4k_randwrite",
            Box::new(move |d: &str| scaling(t, d, Scaled::Write4k, secs)),
        ),
        (
            "scale_4k_randread",
            Box::new(move |d: &str| scaling(t, d, Scaled::Read4k, secs)),
        ),
        (
            "scale_create_stat_unlink",
            Box::new(move |d: &str| scaling(t, d, Scaled::CreateStatUnlink, secs)),
        ),
    ];
    let chosen: Vec<&Workload> = all
        .iter()
        .filter(|(n, _)| o.only.is_empty() || o.only.iter().any(|x| n.contains(x.as_str())))
        .collect();
    let what = format!("{}: workloads", o.system);
    let mut p = Progress::new(what, chosen.len() as u64, Unit::Items("workloads"));
    let mut results = serde_json::Map::new();
    for (done, (name, f)) in chosen.into_iter().enumerate() {
        p.note(format!("running {name}"));
        let sub = format!("w-{name}");
        let r = t
            .mkdir(&sub)
            .map_err(anyhow::Error::from)
            .and_then(|_| f(&sub));
        let v = match r {
            Ok(v) => v,
            // One failing workload is reported; the others still run.
            Err(e) => {
                eprintln!("\n{}: {name} failed: {e:#}", o.system);
                json!({"error": format!("{e:#}")})
            }
        };
        let _ = t.remove_tree(&sub);
        results.insert(name.to_string(), v);
        p.say(format!("{name} done"));
        p.set(done as u64 + 1);
    }
    p.finish();
    Ok(json!({
        "system": o.system,
        "entries": o.entries,
        "seconds": o.seconds,
        "scale": o.scale,
        "results": results,
    }))
}

fn lat_json(l: Lat) -> Value {
    json!({"p50_us": l.p50, "p99_us": l.p99})
}

#[derive(Clone, Copy, PartialEq)]
enum Io4k {
    Write,
    WriteFsync,
    Read,
}

/// 4 KiB random I/O on a 64 MiB file laid out first (untimed), one call at a time
/// for `secs`; with `WriteFsync` each write and the fsync after it are timed as one.
fn lat4k<T: Target>(t: &T, d: &str, kind: Io4k, secs: Duration) -> Result<Value> {
    const FILE_PAGES: usize = 16384;
    let path = format!("{d}/b");
    let f = t.open(&path, How::ReadWrite)?;
    let mib = vec![0xA5u8; 1 << 20];
    for i in 0..((FILE_PAGES * 4096) >> 20) as u64 {
        t.write_at(&f, i << 20, &mib)?;
    }
    t.fsync(&f)?;
    t.invalidate(&f)?;
    let page = vec![0x5Au8; 4096];
    let mut buf = vec![0u8; 4096];
    // As fio's random map does: each pass touches every page once, in a fresh random
    // order. Reads drop the file's cached pages before each pass (fio's invalidate=1
    // on every loop), or a FUSE file system's reads after the first pass would be
    // page-cache hits that never reach it.
    let mut rng = Rng(1);
    let mut order: Vec<u32> = (0..FILE_PAGES as u32).collect();
    let mut next = order.len();
    let mut ns = Vec::new();
    let meter = CpuMeter::start();
    let deadline = Instant::now() + secs;
    while Instant::now() < deadline {
        if next == order.len() {
            rng.shuffle(&mut order);
            next = 0;
            if kind == Io4k::Read {
                t.invalidate(&f)?;
            }
        }
        let off = order[next] as u64 * 4096;
        next += 1;
        let at = Instant::now();
        match kind {
            Io4k::Write => t.write_at(&f, off, &page)?,
            Io4k::WriteFsync => {
                t.write_at(&f, off, &page)?;
                t.fsync(&f)?;
            }
            Io4k::Read => {
                if t.read_at(&f, off, &mut buf)? != buf.len() {
                    bail!("a short read at {off}");
                }
            }
        }
        ns.push(at.elapsed().as_nanos() as u64);
    }
    let cpu = meter.finish(ns.len() as u64);
    t.close(f)?;
    let ops = ns.len();
    let l = lat(ns);
    Ok(json!({"p50_us": l.p50, "p99_us": l.p99, "ops": ops, "cpu": cpu}))
}

/// 1 MiB sequential writes (or reads of files laid out first, untimed) of 256 MiB per
/// job, `jobs` jobs at once, each on its own file; MiB/s over all jobs.
fn seq<T: Target>(t: &T, d: &str, write: bool, jobs: usize) -> Result<Value> {
    const MIB: usize = 1 << 20;
    const PER_JOB: u64 = 256;
    let path = |j: usize| format!("{d}/b.{j}");
    let lay_out = |j: usize| -> io::Result<()> {
        let buf = vec![0x3Cu8; MIB];
        let f = t.create(&path(j))?;
        for i in 0..PER_JOB {
            t.write_at(&f, i * MIB as u64, &buf)?;
        }
        t.close(f)
    };
    let read_back = |j: usize| -> io::Result<()> {
        let mut buf = vec![0u8; MIB];
        let f = t.open(&path(j), How::Read)?;
        t.invalidate(&f)?;
        for i in 0..PER_JOB {
            if t.read_at(&f, i * MIB as u64, &mut buf)? != MIB {
                return Err(io::Error::other("a short read"));
            }
        }
        t.close(f)
    };
    if !write {
        for j in 0..jobs {
            lay_out(j)?;
        }
    }
    let meter = CpuMeter::start();
    let started = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = (0..jobs)
            .map(|j| s.spawn(move || if write { lay_out(j) } else { read_back(j) }))
            .collect();
        for h in hs {
            h.join().map_err(|_| anyhow::anyhow!("a job panicked"))??;
        }
        Ok(())
    })?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = meter.finish(jobs as u64 * PER_JOB);
    Ok(json!({"mib_s": (jobs as u64 * PER_JOB) as f64 / secs, "jobs": jobs, "cpu": cpu}))
}

fn metadata<T: Target>(t: &T, d: &str, n: usize) -> Result<Value> {
    let f = |i: usize| format!("{d}/f{i}");
    let m = |i: usize| format!("{d}/d{i}");
    let mut out = serde_json::Map::new();
    // Each operation's latencies, and the CPU its n calls cost.
    let mut put = |k: &str, op: &mut dyn FnMut(usize) -> io::Result<()>| -> Result<()> {
        let meter = CpuMeter::start();
        let l = timed(n, op)?;
        let mut v = lat_json(l);
        v["cpu"] = meter.finish(n as u64);
        out.insert(k.into(), v);
        Ok(())
    };
    put("create", &mut |i| t.create(&f(i)).and_then(|h| t.close(h)))?;
    put("stat", &mut |i| t.stat(&f(i)))?;
    put("unlink", &mut |i| t.unlink(&f(i)))?;
    put("mkdir", &mut |i| t.mkdir(&m(i)))?;
    put("rmdir", &mut |i| t.rmdir(&m(i)))?;
    Ok(Value::Object(out))
}

/// A filebench personality, with Table 2's parameters.
#[derive(Clone, Copy)]
struct Personality {
    name: &'static str,
    threads: usize,
    files: usize,
    mean_size: usize,
    io_size: usize,
    append: usize,
    /// Names per directory (filebench's dirwidth; varmail keeps one directory).
    dir_width: usize,
}

const VARMAIL: Personality = Personality {
    name: "varmail",
    threads: 8,
    files: 30_000,
    mean_size: 16 << 10,
    io_size: 1 << 20,
    append: 16 << 10,
    dir_width: usize::MAX,
};
const FILESERVER: Personality = Personality {
    name: "fileserver",
    threads: 8,
    files: 10_000,
    mean_size: 128 << 10,
    io_size: 1 << 20,
    append: 16 << 10,
    dir_width: 20,
};
const WEBSERVER: Personality = Personality {
    name: "webserver",
    threads: 8,
    files: 50_000,
    mean_size: 64 << 10,
    io_size: 1 << 20,
    append: 8 << 10,
    dir_width: 20,
};

/// xorshift64*: seeded, so every system sees the same sequence of choices.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// Puts `v` in a uniformly random order (Fisher-Yates).
    pub(crate) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
    /// A file size around `mean` (uniform in [mean/2, 3 mean/2]).
    fn size(&mut self, mean: usize) -> usize {
        mean / 2 + self.below(mean + 1)
    }
}

fn file_path(root: &str, p: &Personality, i: usize) -> String {
    if p.dir_width == usize::MAX {
        format!("{root}/f{i}")
    } else {
        format!("{root}/d{}/f{i}", i / p.dir_width)
    }
}

fn write_file<T: Target>(t: &T, path: &str, size: usize, io: usize, buf: &[u8]) -> io::Result<()> {
    let f = t.create(path)?;
    let mut at = 0;
    while at < size {
        let n = (size - at).min(io).min(buf.len());
        t.write_at(&f, at as u64, &buf[..n])?;
        at += n;
    }
    t.close(f)
}

fn read_whole<T: Target>(t: &T, path: &str, buf: &mut [u8]) -> io::Result<()> {
    let f = t.open(path, How::Read)?;
    let mut at = 0u64;
    loop {
        let n = t.read_at(&f, at, buf)?;
        if n == 0 {
            break;
        }
        at += n as u64;
    }
    t.close(f)
}

/// Opens, appends, fsyncs (when asked) and closes; returns the operations counted.
fn append<T: Target>(t: &T, path: &str, data: &[u8], fsync: bool) -> io::Result<u64> {
    let f = t.open(path, How::Append)?;
    t.append(&f, data)?;
    if fsync {
        t.fsync(&f)?;
    }
    t.close(f)?;
    Ok(if fsync { 4 } else { 3 })
}

/// Runs one personality for `dur` after creating its file set (not timed): files
/// scaled by `scale`, each thread working on its own share of them.
fn table2<T: Target>(
    t: &T,
    root: &str,
    p: &Personality,
    scale: f64,
    dur: Duration,
) -> Result<Value> {
    let files = ((p.files as f64 * scale) as usize).max(p.threads * 4);
    let buf: Vec<u8> = (0..p.io_size).map(|i| (i % 251) as u8).collect();
    if p.dir_width != usize::MAX {
        for d in 0..files.div_ceil(p.dir_width) {
            t.mkdir(&format!("{root}/d{d}"))?;
        }
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for i in 0..files {
        let size = rng.size(p.mean_size);
        write_file(t, &file_path(root, p, i), size, p.io_size, &buf)
            .with_context(|| format!("creating the {} file set", p.name))?;
    }
    let log = format!("{root}/log");
    t.close(t.create(&log)?)?;
    let ops = AtomicU64::new(0);
    let meter = CpuMeter::start();
    let deadline = Instant::now() + dur;
    let started = Instant::now();
    let thread = |th: usize| -> io::Result<()> {
        let mut rng = Rng(0xD1B5_4A32_D192_ED03 ^ (th as u64 + 1));
        let mine: Vec<usize> = (th..files).step_by(p.threads).collect();
        let mut gone: Vec<usize> = Vec::new();
        let mut rbuf = vec![0u8; p.io_size];
        let pick = |rng: &mut Rng, gone: &[usize]| loop {
            let i = mine[rng.below(mine.len())];
            if !gone.contains(&i) {
                return i;
            }
        };
        let path = |i| file_path(root, p, i);
        while Instant::now() < deadline {
            let n = match p.name {
                "varmail" => {
                    // Delete a file and create it again, append to it with an
                    // fsync, append to another with an fsync, read two whole.
                    let i = pick(&mut rng, &gone);
                    t.unlink(&path(i))?;
                    write_file(t, &path(i), 0, p.io_size, &buf)?;
                    let mut k = 2 + append(t, &path(i), &buf[..p.append], true)?;
                    let j = pick(&mut rng, &gone);
                    k += append(t, &path(j), &buf[..p.append], true)?;
                    for _ in 0..2 {
                        read_whole(t, &path(pick(&mut rng, &gone)), &mut rbuf)?;
                        k += 3;
                    }
                    k
                }
                "fileserver" => {
                    // Create a file in place of a deleted one (or of a chosen one,
                    // deleted first), write it whole, append to another, read a
                    // third, delete one and stat one.
                    let i = match gone.pop() {
                        Some(i) => i,
                        None => {
                            let i = pick(&mut rng, &gone);
                            t.unlink(&path(i))?;
                            i
                        }
                    };
                    write_file(t, &path(i), rng.size(p.mean_size), p.io_size, &buf)?;
                    let mut k = 3;
                    k += append(t, &path(pick(&mut rng, &gone)), &buf[..p.append], false)?;
                    read_whole(t, &path(pick(&mut rng, &gone)), &mut rbuf)?;
                    k += 3;
                    let d = pick(&mut rng, &gone);
                    t.unlink(&path(d))?;
                    gone.push(d);
                    t.stat(&path(pick(&mut rng, &gone)))?;
                    k + 2
                }
                _ => {
                    // Read ten whole files, append to the shared log.
                    for _ in 0..10 {
                        read_whole(t, &path(pick(&mut rng, &gone)), &mut rbuf)?;
                    }
                    append(t, &log, &buf[..p.append], false)?;
                    30 + 3
                }
            };
            ops.fetch_add(n, Ordering::Relaxed);
        }
        Ok(())
    };
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = (0..p.threads)
            .map(|th| s.spawn(move || thread(th)))
            .collect();
        for h in hs {
            h.join()
                .map_err(|_| anyhow::anyhow!("a {} thread panicked", p.name))?
                .with_context(|| format!("{} thread", p.name))?;
        }
        Ok(())
    })?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = meter.finish(ops.load(Ordering::Relaxed));
    Ok(json!({
        "cpu": cpu,
        "ops_s": ops.load(Ordering::Relaxed) as f64 / secs,
        "threads": p.threads,
        "files": files,
        "mean_size": p.mean_size,
        "append": p.append,
    }))
}

/// SQLite with synchronous commits: `txs` transactions of one 1 KiB row each, in
/// rollback-journal mode with synchronous=FULL (each commit is durable).
fn sqlite<T: Target>(t: &T, d: &str, txs: usize) -> Result<Value> {
    let Some(dir) = t.dir() else {
        bail!("the sqlite3 program needs a mounted directory (it runs on the mount)");
    };
    let db = dir.join(d).join("bench.db");
    let mut script =
        String::from("PRAGMA synchronous=FULL;\nCREATE TABLE t(k INTEGER PRIMARY KEY, v BLOB);\n");
    for _ in 0..txs {
        script.push_str("BEGIN; INSERT INTO t(v) VALUES (randomblob(1024)); COMMIT;\n");
    }
    let meter = CpuMeter::start();
    let t = Instant::now();
    let mut child = std::process::Command::new("sqlite3")
        .arg(&db)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running sqlite3 (scripts/setup installs it)")?;
    child
        .stdin
        .take()
        .context("sqlite3 stdin")?
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    let secs = t.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("sqlite3: {}", String::from_utf8_lossy(&out.stderr));
    }
    let cpu = meter.finish(txs as u64);
    Ok(json!({"tx_s": txs as f64 / secs, "transactions": txs, "cpu": cpu}))
}
