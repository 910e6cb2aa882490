//! `orion bench workloads DIR`: every workload of the side-by-side comparison, run in
//! one directory of whatever file system is mounted there, and written as JSON:
//! - latency: fio 4 KiB random write (with and without an fsync after each write)
//!   and read, psync at iodepth 1; create, mkdir, stat, unlink, rmdir on N entries;
//!   p50 and p99;
//! - bandwidth: fio 1 MiB sequential write and read, with 1 and 2 jobs;
//! - the paper's Table 2 application workloads (filebench's varmail, fileserver and
//!   webserver personalities, written here since filebench is not packaged in Debian):
//!   the table's thread counts, file sizes and append sizes, file counts scaled by
//!   `--scale`; operations per second (each open, close, read, append, fsync,
//!   create, delete and stat counts one);
//! - SQLite with synchronous commits (`synchronous=FULL`): transactions per second.
//!
//! The same binary runs against tmpfs, FUSE file systems and the Orion mount, so the
//! figures differ only by the file system under DIR.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::bench_mount::{bw_mib, clat, fio, timed};

pub struct Options {
    /// The system's name, for the progress lines and the JSON.
    pub system: String,
    pub entries: usize,
    pub seconds: u64,
    pub scale: f64,
    /// Run only the workloads whose names contain one of these (all when empty).
    pub only: Vec<String>,
}

/// A progress bar on a terminal, one line per step otherwise.
struct Progress {
    system: String,
    total: usize,
    done: usize,
    tty: bool,
    started: Instant,
}

impl Progress {
    fn step(&mut self, what: &str) {
        let width = 24;
        let filled = self.done * width / self.total.max(1);
        let bar: String = "#".repeat(filled) + &"-".repeat(width - filled);
        let line = format!(
            "[{bar}] {}/{} {}: {what} ({:.0} s)",
            self.done + 1,
            self.total,
            self.system,
            self.started.elapsed().as_secs_f64()
        );
        if self.tty {
            eprint!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
        self.done += 1;
    }

    fn finish(&self) {
        if self.tty {
            eprintln!();
        }
        eprintln!(
            "{}: {} workloads in {:.0} s",
            self.system,
            self.total,
            self.started.elapsed().as_secs_f64()
        );
    }
}

type Workload<'a> = (&'static str, Box<dyn Fn(&Path) -> Result<Value> + 'a>);

pub fn run(dir: &Path, o: &Options) -> Result<Value> {
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let secs = o.seconds;
    let rt = format!("--runtime={secs}");
    let lat_row = |args: Vec<String>, kind: &'static str| {
        move |d: &Path| -> Result<Value> {
            let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
            let v = fio(d, &a)?;
            let l = clat(&v, kind)?;
            let _ = std::fs::remove_file(d.join("b.0.0"));
            Ok(json!({"p50_us": l.p50, "p99_us": l.p99}))
        }
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let lat4k = |rw: &str, extra: &[&str]| {
        let mut a = s(&["--bs=4k", "--size=64m", "--time_based", &rt]);
        a.push(format!("--rw={rw}"));
        a.extend(s(extra));
        a
    };
    let bw_row = |rw: &'static str, jobs: u32| {
        move |d: &Path| -> Result<Value> {
            let v = fio(
                d,
                &[
                    &format!("--rw={rw}"),
                    "--bs=1m",
                    "--size=256m",
                    &format!("--numjobs={jobs}"),
                    "--group_reporting",
                ],
            )?;
            for j in 0..jobs {
                let _ = std::fs::remove_file(d.join(format!("b.{j}.0")));
            }
            Ok(json!({"mib_s": bw_mib(&v, if rw == "write" { "write" } else { "read" })?}))
        }
    };
    let scale = o.scale;
    let work_secs = Duration::from_secs(secs.max(1) * 2);
    let all: Vec<Workload> = vec![
        (
            "4k_randwrite",
            Box::new(lat_row(lat4k("randwrite", &[]), "write")),
        ),
        (
            "4k_randwrite_fsync",
            Box::new(lat_row(lat4k("randwrite", &["--fsync=1"]), "write")),
        ),
        (
            "4k_randread",
            Box::new(lat_row(lat4k("randread", &[]), "read")),
        ),
        ("metadata", Box::new(|d: &Path| metadata(d, o.entries))),
        ("1m_seqwrite_1job", Box::new(bw_row("write", 1))),
        ("1m_seqwrite_2jobs", Box::new(bw_row("write", 2))),
        // fio lays the files out before it times the reads.
        ("1m_seqread_1job", Box::new(bw_row("read", 1))),
        ("1m_seqread_2jobs", Box::new(bw_row("read", 2))),
        (
            "varmail",
            Box::new(move |d: &Path| table2(d, &VARMAIL, scale, work_secs)),
        ),
        (
            "fileserver",
            Box::new(move |d: &Path| table2(d, &FILESERVER, scale, work_secs)),
        ),
        (
            "webserver",
            Box::new(move |d: &Path| table2(d, &WEBSERVER, scale, work_secs)),
        ),
        ("sqlite", Box::new(|d: &Path| sqlite(d, 300))),
    ];
    let chosen: Vec<&Workload> = all
        .iter()
        .filter(|(n, _)| o.only.is_empty() || o.only.iter().any(|x| n.contains(x.as_str())))
        .collect();
    let mut p = Progress {
        system: o.system.clone(),
        total: chosen.len(),
        done: 0,
        tty: stderr_is_tty(),
        started: Instant::now(),
    };
    let mut results = serde_json::Map::new();
    for (name, f) in chosen {
        p.step(name);
        let sub = dir.join(format!("w-{name}"));
        let r = std::fs::create_dir_all(&sub)
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
        let _ = std::fs::remove_dir_all(&sub);
        results.insert(name.to_string(), v);
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

fn stderr_is_tty() -> bool {
    // SAFETY: isatty only inspects a file descriptor.
    unsafe { libc::isatty(2) == 1 }
}

fn metadata(d: &Path, n: usize) -> Result<Value> {
    let f = |i: usize| d.join(format!("f{i}"));
    let m = |i: usize| d.join(format!("d{i}"));
    let mut out = serde_json::Map::new();
    let mut put = |k: &str, l: crate::bench_fabric::Lat| {
        out.insert(k.into(), json!({"p50_us": l.p50, "p99_us": l.p99}));
    };
    put("create", timed(n, |i| File::create(f(i)).map(drop))?);
    put(
        "stat",
        timed(n, |i| std::fs::symlink_metadata(f(i)).map(drop))?,
    );
    put("unlink", timed(n, |i| std::fs::remove_file(f(i)))?);
    put("mkdir", timed(n, |i| std::fs::create_dir(m(i)))?);
    put("rmdir", timed(n, |i| std::fs::remove_dir(m(i)))?);
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
struct Rng(u64);

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
    /// A file size around `mean` (uniform in [mean/2, 3 mean/2]).
    fn size(&mut self, mean: usize) -> usize {
        mean / 2 + self.below(mean + 1)
    }
}

fn file_path(root: &Path, p: &Personality, i: usize) -> PathBuf {
    if p.dir_width == usize::MAX {
        root.join(format!("f{i}"))
    } else {
        root.join(format!("d{}", i / p.dir_width))
            .join(format!("f{i}"))
    }
}

fn write_file(path: &Path, size: usize, io: usize, buf: &[u8]) -> std::io::Result<()> {
    let mut f = File::create(path)?;
    let mut left = size;
    while left > 0 {
        let n = left.min(io).min(buf.len());
        f.write_all(&buf[..n])?;
        left -= n;
    }
    Ok(())
}

fn read_whole(path: &Path, buf: &mut [u8]) -> std::io::Result<()> {
    let mut f = File::open(path)?;
    while f.read(buf)? > 0 {}
    Ok(())
}

fn append(path: &Path, data: &[u8], fsync: bool) -> std::io::Result<u64> {
    let mut f = OpenOptions::new().append(true).open(path)?;
    f.write_all(data)?;
    if fsync {
        f.sync_all()?;
        return Ok(4);
    }
    Ok(3)
}

/// Runs one personality for `dur` after creating its file set (not timed): files
/// scaled by `scale`, each thread working on its own share of them.
fn table2(root: &Path, p: &Personality, scale: f64, dur: Duration) -> Result<Value> {
    let files = ((p.files as f64 * scale) as usize).max(p.threads * 4);
    let buf: Arc<Vec<u8>> = Arc::new((0..p.io_size).map(|i| (i % 251) as u8).collect());
    if p.dir_width != usize::MAX {
        for d in 0..files.div_ceil(p.dir_width) {
            std::fs::create_dir_all(root.join(format!("d{d}")))?;
        }
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for i in 0..files {
        let size = rng.size(p.mean_size);
        write_file(&file_path(root, p, i), size, p.io_size, &buf)
            .with_context(|| format!("creating the {} file set", p.name))?;
    }
    let log = root.join("log");
    File::create(&log)?;
    let ops = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + dur;
    let started = Instant::now();
    let handles: Vec<_> = (0..p.threads)
        .map(|t| {
            let (root, log, buf, ops) = (root.to_path_buf(), log.clone(), buf.clone(), ops.clone());
            let p = *p;
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut rng = Rng(0xD1B5_4A32_D192_ED03 ^ (t as u64 + 1));
                let mine: Vec<usize> = (t..files).step_by(p.threads).collect();
                let mut gone: Vec<usize> = Vec::new();
                let mut rbuf = vec![0u8; p.io_size];
                let pick = |rng: &mut Rng, gone: &[usize]| loop {
                    let i = mine[rng.below(mine.len())];
                    if !gone.contains(&i) {
                        return i;
                    }
                };
                while Instant::now() < deadline {
                    let path = |i| file_path(&root, &p, i);
                    let n = match p.name {
                        "varmail" => {
                            let i = pick(&mut rng, &gone);
                            std::fs::remove_file(path(i))?;
                            write_file(&path(i), 0, p.io_size, &buf)?;
                            let mut k = 2 + append(&path(i), &buf[..p.append], true)?;
                            let j = pick(&mut rng, &gone);
                            k += append(&path(j), &buf[..p.append], true)?;
                            for _ in 0..2 {
                                read_whole(&path(pick(&mut rng, &gone)), &mut rbuf)?;
                                k += 3;
                            }
                            k
                        }
                        "fileserver" => {
                            // Create a file in place of a deleted one (or of a
                            // chosen one, deleted first), write it whole, append to
                            // another, read a third, delete one and stat one.
                            let i = match gone.pop() {
                                Some(i) => i,
                                None => {
                                    let i = pick(&mut rng, &gone);
                                    std::fs::remove_file(path(i))?;
                                    i
                                }
                            };
                            write_file(&path(i), rng.size(p.mean_size), p.io_size, &buf)?;
                            let mut k = 3;
                            k += append(&path(pick(&mut rng, &gone)), &buf[..p.append], false)?;
                            read_whole(&path(pick(&mut rng, &gone)), &mut rbuf)?;
                            k += 3;
                            let d = pick(&mut rng, &gone);
                            std::fs::remove_file(path(d))?;
                            gone.push(d);
                            std::fs::metadata(path(pick(&mut rng, &gone)))?;
                            k + 2
                        }
                        _ => {
                            for _ in 0..10 {
                                read_whole(&path(pick(&mut rng, &gone)), &mut rbuf)?;
                            }
                            let mut f = OpenOptions::new().append(true).open(&log)?;
                            f.write_all(&buf[..p.append])?;
                            30 + 3
                        }
                    };
                    ops.fetch_add(n, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join()
            .map_err(|_| anyhow::anyhow!("a {} thread panicked", p.name))?
            .with_context(|| format!("{} thread", p.name))?;
    }
    let secs = started.elapsed().as_secs_f64();
    Ok(json!({
        "ops_s": ops.load(Ordering::Relaxed) as f64 / secs,
        "threads": p.threads,
        "files": files,
        "mean_size": p.mean_size,
        "append": p.append,
    }))
}

/// SQLite with synchronous commits: `txs` transactions of one 1 KiB row each, in
/// rollback-journal mode with synchronous=FULL (each commit is durable).
fn sqlite(d: &Path, txs: usize) -> Result<Value> {
    let db = d.join("bench.db");
    let mut script =
        String::from("PRAGMA synchronous=FULL;\nCREATE TABLE t(k INTEGER PRIMARY KEY, v BLOB);\n");
    for _ in 0..txs {
        script.push_str("BEGIN; INSERT INTO t(v) VALUES (randomblob(1024)); COMMIT;\n");
    }
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
    Ok(json!({"tx_s": txs as f64 / secs, "transactions": txs}))
}
