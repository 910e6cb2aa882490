//! `orion bench mds`: the MDS's throughput (Orion §6.2, Figure 8's right half) for
//! empty RPCs, log commits and inode tail reads, with 1, 2, 4 and 8 client processes
//! hammering one MDS at once. Each client is a separate `orion bench mds-worker`
//! process with its own fabric connection; all of them start on one signal and run
//! for the same time, and the figure is the sum of their operations per second.
//!
//! On this 2-core VM the client processes and the MDS share two cores, so beyond two
//! clients the figure measures the scheduler as much as the MDS; the results say so.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use orion_client::{Client, OpenFlags};
use orion_meta::{SetAttrReq, TimeSet};

use crate::bench_cluster::BenchCluster;
use crate::daemons::Common;

/// What a worker measures.
const OPS: [&str; 3] = ["rpc", "commit", "tail_read"];

#[derive(Args, Debug)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long)]
    pub mds: String,
    /// rpc, commit or tail_read.
    #[arg(long)]
    pub op: String,
    #[arg(long)]
    pub millis: u64,
    /// This worker's number, to name its file.
    #[arg(long)]
    pub id: usize,
}

fn fs<T>(r: orion_meta::FsResult<T>) -> Result<T> {
    r.map_err(|e| anyhow!("{e}"))
}

/// One client process: connect, make its own file, say "ready", wait for "go" on
/// stdin, run the operation for the given time and print "<ops> <seconds>".
pub fn worker(a: WorkerArgs) -> Result<()> {
    if !OPS.contains(&a.op.as_str()) {
        bail!("--op {:?}: expected one of {OPS:?}", a.op);
    }
    let mut c = a.common.load()?;
    c.client.mds = a.mds.clone();
    let client =
        Client::connect(c.client, c.fabric.fabric_config()?).map_err(|e| anyhow!("{e}"))?;
    let path = format!("/mds-bench-{}-{}", a.id, std::process::id());
    let fd = fs(client.open(
        &path,
        OpenFlags {
            write: true,
            create: true,
            ..Default::default()
        },
        0o644,
    ))?;
    let ino = fs(client.ino(fd))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    let mut go = String::new();
    std::io::stdin().lock().read_line(&mut go)?;
    let run_for = Duration::from_millis(a.millis);
    let start = Instant::now();
    let mut ops = 0u64;
    // Check the clock every few operations only: reading it costs as much as a tail read.
    while start.elapsed() < run_for {
        for _ in 0..16 {
            match a.op.as_str() {
                "rpc" => fs(client.ping())?,
                "commit" => {
                    let req = SetAttrReq {
                        mtime: Some(TimeSet::At(ops as i64)),
                        ..Default::default()
                    };
                    fs(client.setattr(ino, &req))?;
                }
                _ => {
                    fs(client.getattr(ino))?;
                }
            }
            ops += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    fs(client.close(fd))?;
    fs(client.unlink(&path))?;
    writeln!(out, "{ops} {secs}")?;
    Ok(())
}

/// A worker process, killed by PID if still running when dropped.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Aggregate operations per second of `n` workers running `op` together.
fn measure(cluster: &BenchCluster, op: &str, n: usize, millis: u64) -> Result<f64> {
    let exe = std::env::current_exe().context("locating the orion binary")?;
    let mut workers = Vec::new();
    let mut outs = Vec::new();
    for id in 0..n {
        let mut child = Command::new(&exe)
            .args([
                "bench",
                "mds-worker",
                "--mds",
                &cluster.mds_addr,
                "--op",
                op,
            ])
            .args(["--millis", &millis.to_string(), "--id", &id.to_string()])
            .args(&cluster.common_args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting a benchmark client")?;
        outs.push(BufReader::new(child.stdout.take().expect("piped")));
        workers.push(Worker(child));
    }
    let mut line = String::new();
    for (i, out) in outs.iter_mut().enumerate() {
        line.clear();
        out.read_line(&mut line)?;
        if line.trim() != "ready" {
            bail!("benchmark client {i} did not start (see its error above)");
        }
    }
    for w in workers.iter_mut() {
        let stdin = w.0.stdin.as_mut().expect("piped");
        stdin.write_all(b"go\n")?;
        stdin.flush()?;
    }
    let mut total = 0.0;
    for (i, out) in outs.iter_mut().enumerate() {
        line.clear();
        out.read_line(&mut line)?;
        let mut it = line.split_whitespace().map(str::parse::<f64>);
        match (it.next(), it.next()) {
            (Some(Ok(ops)), Some(Ok(secs))) if secs > 0.0 => total += ops / secs,
            _ => bail!("benchmark client {i} failed: {line:?}"),
        }
    }
    for w in workers.iter_mut() {
        let status = w.0.wait()?;
        if !status.success() {
            bail!("a benchmark client exited with {status}");
        }
    }
    Ok(total)
}

pub fn run(backend: &str, provider: &str, millis: u64, json: bool) -> Result<()> {
    let cluster = BenchCluster::start(backend, provider)?;
    const CLIENTS: [usize; 4] = [1, 2, 4, 8];
    let mut rows: Vec<(&str, Vec<f64>)> = Vec::new();
    for op in OPS {
        let mut per = Vec::new();
        for n in CLIENTS {
            if !json {
                eprintln!("measuring: {op}, {n} client processes");
            }
            per.push(measure(&cluster, op, n, millis)?);
        }
        rows.push((op, per));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if json {
        let body: Vec<String> = rows
            .iter()
            .map(|(op, v)| {
                let cells: Vec<String> = CLIENTS
                    .iter()
                    .zip(v)
                    .map(|(n, x)| format!("\"{n}\":{x:.0}"))
                    .collect();
                format!("\"{op}_ops\":{{{}}}", cells.join(","))
            })
            .collect();
        println!(
            "{{\"backend\":\"{backend}\",\"provider\":\"{provider}\",\"millis\":{millis},\
             \"cores\":{cores},\"pools\":\"/dev/shm (volatile: tmpfs emulates NVMM)\",{}}}",
            body.join(",")
        );
        return Ok(());
    }
    println!(
        "orion bench mds: backend {backend}{}, {millis} ms per cell, {cores} cores shared by \
         the MDS and every client process; aggregate operations per second",
        if backend == "local" {
            String::new()
        } else {
            format!(" ({provider})")
        }
    );
    print!("{:<10}", "clients");
    for n in CLIENTS {
        print!("{n:>12}");
    }
    println!();
    for (op, v) in &rows {
        print!("{op:<10}");
        for x in v {
            print!("{x:>12.0}");
        }
        println!();
    }
    Ok(())
}
