//! `orion bench local`: the local core (volatile pools in /dev/shm) next to the same
//! calls on tmpfs, measured in the same run. Each call is timed alone; the report
//! gives ops/s (calls / total time), median and p99 in microseconds.
//!
//! Also: lookup latency in one directory as it grows to 1 M names (hard links to one
//! file, so the directory is big without a million inodes), to show O(1) lookups.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use orion_meta::{LocalConfig, LocalFs, SystemClock, ROOT_INO};
use orion_pmem::ModeChoice;

struct Stats {
    name: &'static str,
    ops_s: f64,
    p50: f64,
    p99: f64,
}

fn stats(name: &'static str, mut ns: Vec<u64>) -> Stats {
    let total: u64 = ns.iter().sum();
    ns.sort_unstable();
    let pick = |q: f64| ns[((ns.len() as f64 * q) as usize).min(ns.len() - 1)] as f64 / 1000.0;
    Stats {
        name,
        ops_s: ns.len() as f64 / (total as f64 / 1e9),
        p50: pick(0.5),
        p99: pick(0.99),
    }
}

fn ok<T>(r: Result<T, orion_meta::FsError>) -> Result<T> {
    r.map_err(|e| anyhow::anyhow!("{e}"))
}

fn time<T>(f: impl FnOnce() -> T) -> (u64, T) {
    let t = Instant::now();
    let r = f();
    (t.elapsed().as_nanos() as u64, r)
}

/// A tiny xorshift, so page offsets are random but the same every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

const FILE_PAGES: u64 = 4096; // a 16 MiB file for 4 KiB reads and writes

fn bench_core(dir: &Path, n: usize) -> Result<Vec<Stats>> {
    let path = dir.join("bench.pool");
    drop(LocalFs::mkfs(&path, 4 << 30, ModeChoice::Auto, 0)?);
    let (fs, _) = LocalFs::open_path(&path, Arc::new(SystemClock), &LocalConfig::default())?;
    let cdir = ok(fs.mkdir(ROOT_INO, b"c", 0o755, 0, 0))?.ino;
    let mdir = ok(fs.mkdir(ROOT_INO, b"m", 0o755, 0, 0))?.ino;
    let names: Vec<Vec<u8>> = (0..n).map(|i| format!("f{i}").into_bytes()).collect();
    let mut out = Vec::new();
    let mut v = Vec::with_capacity(n);
    for name in &names {
        let (t, r) = time(|| fs.create(cdir, name, 0o644, 0, 0));
        ok(r)?;
        v.push(t);
    }
    out.push(stats("create", std::mem::take(&mut v)));
    for name in &names {
        let (t, r) = time(|| fs.mkdir(mdir, name, 0o755, 0, 0));
        ok(r)?;
        v.push(t);
    }
    out.push(stats("mkdir", std::mem::take(&mut v)));
    for name in &names {
        let (t, r) = time(|| fs.lookup(cdir, name));
        ok(r)?;
        v.push(t);
    }
    out.push(stats("stat", std::mem::take(&mut v)));
    let f = ok(fs.create(ROOT_INO, b"data", 0o644, 0, 0))?.ino;
    let page = vec![0x5au8; 4096];
    for p in 0..FILE_PAGES {
        ok(fs.write(f, p * 4096, &page))?;
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..n {
        let off = rng.next() % FILE_PAGES * 4096;
        let (t, r) = time(|| fs.write(f, off, &page));
        ok(r)?;
        v.push(t);
    }
    out.push(stats("write_4k", std::mem::take(&mut v)));
    for _ in 0..n {
        let off = rng.next() % FILE_PAGES * 4096;
        let (t, r) = time(|| fs.read(f, off, 4096));
        ok(r)?;
        v.push(t);
    }
    out.push(stats("read_4k", std::mem::take(&mut v)));
    for name in &names {
        let (t, r) = time(|| fs.unlink(cdir, name));
        ok(r)?;
        v.push(t);
    }
    out.push(stats("unlink", std::mem::take(&mut v)));
    Ok(out)
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in bench paths")
}

fn check(rc: libc::c_long, what: &str) -> Result<()> {
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).context(what.to_string());
    }
    Ok(())
}

fn bench_tmpfs(dir: &Path, n: usize) -> Result<Vec<Stats>> {
    let cdir = dir.join("c");
    let mdir = dir.join("m");
    std::fs::create_dir(&cdir)?;
    std::fs::create_dir(&mdir)?;
    let files: Vec<CString> = (0..n).map(|i| c(&cdir.join(format!("f{i}")))).collect();
    let dirs: Vec<CString> = (0..n).map(|i| c(&mdir.join(format!("f{i}")))).collect();
    let mut out = Vec::new();
    let mut v = Vec::with_capacity(n);
    for p in &files {
        // SAFETY: a system call on NUL-terminated paths and buffers this function owns.
        let (t, r) = time(|| unsafe { libc::mknod(p.as_ptr(), libc::S_IFREG | 0o644, 0) });
        check(r as _, "mknod")?;
        v.push(t);
    }
    out.push(stats("create", std::mem::take(&mut v)));
    for p in &dirs {
        // SAFETY: a system call on NUL-terminated paths and buffers this function owns.
        let (t, r) = time(|| unsafe { libc::mkdir(p.as_ptr(), 0o755) });
        check(r as _, "mkdir")?;
        v.push(t);
    }
    out.push(stats("mkdir", std::mem::take(&mut v)));
    // SAFETY: a system call on NUL-terminated paths and buffers this function owns.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    for p in &files {
        // SAFETY: a system call on NUL-terminated paths and buffers this function owns.
        let (t, r) = time(|| unsafe { libc::lstat(p.as_ptr(), &mut st) });
        check(r as _, "lstat")?;
        v.push(t);
    }
    out.push(stats("stat", std::mem::take(&mut v)));
    let data = c(&dir.join("data"));
    // SAFETY: a system call on NUL-terminated paths and buffers this function owns.
    let fd = unsafe { libc::open(data.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o644) };
    check(fd as _, "open")?;
    let page = vec![0x5au8; 4096];
    for p in 0..FILE_PAGES {
        // SAFETY: a system call on NUL-terminated paths and buffers this function owns.
        check(
            unsafe { libc::pwrite(fd, page.as_ptr() as *const _, 4096, (p * 4096) as i64) } as _,
            "pwrite",
        )?;
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..n {
        let off = (rng.next() % FILE_PAGES * 4096) as i64;
        // SAFETY: a system call on NUL-terminated paths and buffers this function owns.
        let (t, r) = time(|| unsafe { libc::pwrite(fd, page.as_ptr() as *const _, 4096, off) });
        check(r as _, "pwrite")?;
        v.push(t);
    }
    out.push(stats("write_4k", std::mem::take(&mut v)));
    let mut buf = vec![0u8; 4096];
    for _ in 0..n {
        let off = (rng.next() % FILE_PAGES * 4096) as i64;
        // SAFETY: a system call on NUL-terminated paths and buffers this function owns.
        let (t, r) = time(|| unsafe { libc::pread(fd, buf.as_mut_ptr() as *mut _, 4096, off) });
        check(r as _, "pread")?;
        v.push(t);
    }
    out.push(stats("read_4k", std::mem::take(&mut v)));
    // SAFETY: a system call on NUL-terminated paths and buffers this function owns.
    unsafe { libc::close(fd) };
    for p in &files {
        // SAFETY: a system call on NUL-terminated paths and buffers this function owns.
        let (t, r) = time(|| unsafe { libc::unlink(p.as_ptr()) });
        check(r as _, "unlink")?;
        v.push(t);
    }
    out.push(stats("unlink", std::mem::take(&mut v)));
    Ok(out)
}

/// Median lookup time (µs) of names in one directory at growing sizes.
fn bench_big_dir(dir: &Path, progress: bool) -> Result<Vec<(u64, f64)>> {
    let path = dir.join("bigdir.pool");
    drop(LocalFs::mkfs(&path, 1 << 30, ModeChoice::Auto, 0)?);
    let (fs, _) = LocalFs::open_path(&path, Arc::new(SystemClock), &LocalConfig::default())?;
    let d = ok(fs.mkdir(ROOT_INO, b"big", 0o755, 0, 0))?.ino;
    let target = ok(fs.create(ROOT_INO, b"target", 0o644, 0, 0))?.ino;
    let mut out = Vec::new();
    let mut have = 0u64;
    let mut rng = Rng(42);
    for size in [1_000u64, 10_000, 100_000, 1_000_000] {
        while have < size {
            ok(fs.link(target, d, format!("name-{have:07}").as_bytes()))?;
            have += 1;
        }
        let mut v: Vec<u64> = (0..20_000)
            .map(|_| {
                let name = format!("name-{:07}", rng.next() % size);
                time(|| fs.lookup(d, name.as_bytes())).0
            })
            .collect();
        v.sort_unstable();
        out.push((size, v[v.len() / 2] as f64 / 1000.0));
        if progress {
            eprintln!(
                "  directory of {size:>9} names: lookup p50 {:.2} µs",
                v[v.len() / 2] as f64 / 1000.0
            );
        }
    }
    Ok(out)
}

pub fn run(n: usize, json: bool) -> Result<()> {
    let dir = bench_dir()?;
    let result = (|| {
        if !json {
            eprintln!("orion bench local: {n} calls per row; pools and tmpfs both in /dev/shm (volatile mode)");
        }
        let core = bench_core(&dir.join("core").tap_mkdir()?, n)?;
        let tmpfs = bench_tmpfs(&dir.join("tmpfs").tap_mkdir()?, n)?;
        let big = bench_big_dir(&dir, !json)?;
        Ok::<_, anyhow::Error>((core, tmpfs, big))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let (core, tmpfs, big) = result?;
    if json {
        let row = |s: &Stats| {
            format!(
                "{{\"ops_s\":{:.0},\"p50_us\":{:.2},\"p99_us\":{:.2}}}",
                s.ops_s, s.p50, s.p99
            )
        };
        let side = |v: &[Stats]| {
            v.iter()
                .map(|s| format!("\"{}\":{}", s.name, row(s)))
                .collect::<Vec<_>>()
                .join(",")
        };
        let bigs = big
            .iter()
            .map(|(n, us)| format!("\"{n}\":{us:.3}"))
            .collect::<Vec<_>>()
            .join(",");
        println!(
            "{{\"calls_per_row\":{n},\"machine\":{{\"cores\":{},\"pool_mode\":\"volatile\"}},\"core\":{{{}}},\"tmpfs\":{{{}}},\"lookup_p50_us_by_dir_size\":{{{}}}}}",
            std::thread::available_parallelism().map(|p| p.get()).unwrap_or(0),
            side(&core),
            side(&tmpfs),
            bigs
        );
    } else {
        println!(
            "{:<10} {:>12} {:>9} {:>9}   {:>12} {:>9} {:>9}",
            "call", "core ops/s", "p50 µs", "p99 µs", "tmpfs ops/s", "p50 µs", "p99 µs"
        );
        for (a, b) in core.iter().zip(&tmpfs) {
            println!(
                "{:<10} {:>12.0} {:>9.2} {:>9.2}   {:>12.0} {:>9.2} {:>9.2}",
                a.name, a.ops_s, a.p50, a.p99, b.ops_s, b.p50, b.p99
            );
        }
        for (size, us) in big {
            println!("lookup in a directory of {size:>9} names: p50 {us:.2} µs");
        }
    }
    Ok(())
}

fn bench_dir() -> Result<std::path::PathBuf> {
    let d = std::path::PathBuf::from(format!("/dev/shm/orion-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    Ok(d)
}

trait MkdirTap {
    fn tap_mkdir(self) -> Result<std::path::PathBuf>;
}
impl MkdirTap for std::path::PathBuf {
    fn tap_mkdir(self) -> Result<std::path::PathBuf> {
        std::fs::create_dir_all(&self)?;
        Ok(self)
    }
}
