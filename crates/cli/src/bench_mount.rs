//! `orion bench mount`: the same workloads, in one run, on a tmpfs directory, on a null
//! FUSE passthrough of tmpfs (same FUSE library and kernel settings as the Orion
//! mount: the floor FUSE itself sets here), and on an Orion mount of a cluster this
//! command starts (local backend, pools on /dev/shm) and stops:
//! - 4 KiB random write and read latency (fio, psync, iodepth 1), p50 and p99;
//! - 1 MiB sequential write and read bandwidth (fio);
//! - create, stat, unlink, mkdir and rmdir latency over N entries, p50 and p99.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::bench_cluster::BenchCluster;
use crate::bench_fabric::{lat, Lat};
use crate::procs::Daemon;

/// `orion bench null-fuse ROOT MNT`: serve the passthrough until SIGTERM.
pub fn null_fuse(root: &Path, mnt: &Path) -> Result<()> {
    let stop: Arc<AtomicBool> = crate::signals::stop_flag()?;
    let opts = orion_fuse::MountOptions {
        mountpoint: mnt.to_path_buf(),
        allow_other: false,
        threads: 4,
        kernel_permissions: true,
    };
    let fs = orion_fuse::passthrough::Passthrough::new(root);
    orion_fuse::mount(fs, &opts, stop, |_| {
        crate::daemons::announce(format!(
            "orion null-fuse ready: {} over {}",
            mnt.display(),
            root.display()
        ))
    })?;
    Ok(())
}

pub(crate) fn fio(dir: &Path, args: &[&str]) -> Result<Value> {
    let out = std::process::Command::new("fio")
        .args([
            "--name=b",
            "--ioengine=psync",
            "--iodepth=1",
            "--randseed=1",
        ])
        .arg(format!("--directory={}", dir.display()))
        .args(args)
        .arg("--output-format=json")
        .output()
        .context("running fio (scripts/setup installs it)")?;
    if !out.status.success() {
        bail!(
            "fio {args:?} in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // fio may print notes before the JSON object.
    let text = String::from_utf8_lossy(&out.stdout);
    let at = text.find('{').context("no JSON from fio")?;
    Ok(serde_json::from_str(&text[at..])?)
}

pub(crate) fn clat(v: &Value, dir: &str) -> Result<Lat> {
    let p = &v["jobs"][0][dir]["clat_ns"]["percentile"];
    let get = |k: &str| p[k].as_f64().map(|x| x / 1000.0);
    match (get("50.000000"), get("99.000000")) {
        (Some(p50), Some(p99)) => Ok(Lat { p50, p99 }),
        _ => bail!("no {dir} latency percentiles in fio's output"),
    }
}

pub(crate) fn bw_mib(v: &Value, dir: &str) -> Result<f64> {
    v["jobs"][0][dir]["bw_bytes"]
        .as_f64()
        .map(|b| b / (1 << 20) as f64)
        .context("no bandwidth in fio's output")
}

/// Times `op(i)` for i in 0..n.
pub(crate) fn timed(n: usize, mut op: impl FnMut(usize) -> std::io::Result<()>) -> Result<Lat> {
    let mut ns = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        op(i)?;
        ns.push(t.elapsed().as_nanos() as u64);
    }
    Ok(lat(ns))
}

struct Row {
    name: &'static str,
    unit: &'static str,
    /// (p50, p99) for latencies, (MiB/s, 0) for bandwidth.
    cells: Vec<(f64, f64)>,
}

fn run_target(dir: &Path, files: usize, secs: u64) -> Result<Vec<(&'static str, f64, f64)>> {
    let mut out = Vec::new();
    let rt = format!("--runtime={secs}");
    let v = fio(
        dir,
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--size=64m",
            "--time_based",
            &rt,
        ],
    )?;
    let l = clat(&v, "write")?;
    out.push(("4k_randwrite_us", l.p50, l.p99));
    let v = fio(
        dir,
        &[
            "--rw=randread",
            "--bs=4k",
            "--size=64m",
            "--time_based",
            &rt,
        ],
    )?;
    let l = clat(&v, "read")?;
    out.push(("4k_randread_us", l.p50, l.p99));
    let v = fio(dir, &["--rw=write", "--bs=1m", "--size=256m"])?;
    out.push(("1m_seqwrite_mib_s", bw_mib(&v, "write")?, 0.0));
    let v = fio(dir, &["--rw=read", "--bs=1m", "--size=256m"])?;
    out.push(("1m_seqread_mib_s", bw_mib(&v, "read")?, 0.0));
    let _ = std::fs::remove_file(dir.join("b.0.0"));
    let d = dir.join("meta");
    std::fs::create_dir(&d)?;
    let f = |i: usize| d.join(format!("f{i}"));
    let m = |i: usize| d.join(format!("d{i}"));
    let l = timed(files, |i| std::fs::File::create(f(i)).map(drop))?;
    out.push(("create_us", l.p50, l.p99));
    let l = timed(files, |i| std::fs::symlink_metadata(f(i)).map(drop))?;
    out.push(("stat_us", l.p50, l.p99));
    let l = timed(files, |i| std::fs::remove_file(f(i)))?;
    out.push(("unlink_us", l.p50, l.p99));
    let l = timed(files, |i| std::fs::create_dir(m(i)))?;
    out.push(("mkdir_us", l.p50, l.p99));
    let l = timed(files, |i| std::fs::remove_dir(m(i)))?;
    out.push(("rmdir_us", l.p50, l.p99));
    std::fs::remove_dir(&d)?;
    Ok(out)
}

pub fn run(files: usize, secs: u64, json: Option<&Path>) -> Result<()> {
    let cluster = BenchCluster::start("local", "tcp;ofi_rxm")?;
    let work = tempfile::Builder::new()
        .prefix("orion-bench-mount")
        .tempdir_in("/dev/shm")?;
    let sub = |n: &str| -> Result<PathBuf> {
        let p = work.path().join(n);
        std::fs::create_dir(&p)?;
        Ok(p)
    };
    let (tmpfs, null_root, null_mnt, orion_mnt) = (
        sub("tmpfs")?,
        sub("null-root")?,
        sub("null")?,
        sub("orion")?,
    );
    let s = |p: &Path| p.display().to_string();
    let (_null, _) = Daemon::spawn(
        "the null FUSE passthrough",
        &[
            "bench".into(),
            "null-fuse".into(),
            s(&null_root),
            s(&null_mnt),
        ],
        &work.path().join("null.log"),
    )?;
    let mut args = vec!["mount".into(), s(&orion_mnt), "--mds".into()];
    args.push(cluster.mds_addr.clone());
    args.extend(cluster.common_args.iter().cloned());
    let (_mount, _) = Daemon::spawn("the Orion mount", &args, &work.path().join("mount.log"))?;
    let targets = [
        ("tmpfs", &tmpfs),
        ("null FUSE", &null_mnt),
        ("orion mount", &orion_mnt),
    ];
    let mut results = Vec::new();
    for (name, dir) in targets {
        eprintln!("measuring: {name}");
        results.push(run_target(dir, files, secs).with_context(|| format!("on {name}"))?);
    }
    let rows: Vec<Row> = results[0]
        .iter()
        .enumerate()
        .map(|(i, (k, _, _))| Row {
            name: k,
            unit: if k.ends_with("mib_s") { "MiB/s" } else { "µs" },
            cells: results.iter().map(|r| (r[i].1, r[i].2)).collect(),
        })
        .collect();
    if let Some(out) = json {
        let sys: Vec<String> = targets
            .iter()
            .enumerate()
            .map(|(t, (name, _))| {
                let cells: Vec<String> = rows
                    .iter()
                    .map(|r| {
                        let (a, b) = r.cells[t];
                        if r.unit == "MiB/s" {
                            format!("\"{}\":{a:.1}", r.name)
                        } else {
                            format!("\"{}\":{{\"p50\":{a:.2},\"p99\":{b:.2}}}", r.name)
                        }
                    })
                    .collect();
                format!("\"{name}\":{{{}}}", cells.join(","))
            })
            .collect();
        let text = format!(
            "{{\"files\":{files},\"seconds\":{secs},\"backend\":\"local\",\
             \"pools\":\"/dev/shm (volatile)\",{}}}\n",
            sys.join(",")
        );
        std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
    }
    println!(
        "orion bench mount: {files} entries for metadata rows, fio {secs} s per latency row; \
         tmpfs, a null FUSE passthrough of tmpfs and an Orion mount (local backend, pools \
         on /dev/shm); p50/p99 in µs or MiB/s; last column: Orion / null FUSE (p50)"
    );
    println!(
        "{:<20} {:>17} {:>17} {:>17} {:>8}",
        "row", "tmpfs", "null FUSE", "orion mount", "ratio"
    );
    for r in &rows {
        let cell = |(a, b): (f64, f64)| {
            if r.unit == "MiB/s" {
                format!("{a:.0}")
            } else {
                format!("{a:.1}/{b:.1}")
            }
        };
        let ratio = if r.unit == "MiB/s" {
            r.cells[1].0 / r.cells[2].0
        } else {
            r.cells[2].0 / r.cells[1].0
        };
        println!(
            "{:<20} {:>17} {:>17} {:>17} {:>8.2}",
            r.name,
            cell(r.cells[0]),
            cell(r.cells[1]),
            cell(r.cells[2]),
            ratio
        );
    }
    Ok(())
}
