//! `orion bench client`: the paper's microbenchmarks (Orion §6.2) through the client
//! library, against an MDS and a data store this command starts as processes (pools
//! on /dev/shm, volatile mode, as the paper emulated NVMM) and stops by PID.
//!
//! Rows: an empty RPC, a log commit, an inode tail check (one-sided read of the slot),
//! create, mkdir, unlink, and 4 KiB random writes and reads, for an internal client
//! (it maps the store's pool) in strong mode, an external client (fabric only) in
//! strong mode, an external client in weak mode, and an internal client with
//! optimistic persistence (small writes staged and committed in batches).

use anyhow::{anyhow, Result};
use orion_client::{Client, OpenFlags};
use orion_meta::{SetAttrReq, TimeSet};

use crate::bench_cluster::BenchCluster;
use crate::bench_fabric::{measure, Lat};

struct Rows(Vec<(&'static str, Lat)>);

impl Rows {
    fn json(&self) -> String {
        let body: Vec<String> = self
            .0
            .iter()
            .map(|(k, l)| format!("\"{k}\":{{\"p50\":{:.3},\"p99\":{:.3}}}", l.p50, l.p99))
            .collect();
        body.join(",")
    }
}

fn fs<T>(r: orion_meta::FsResult<T>) -> Result<T> {
    r.map_err(|e| anyhow!("{e}"))
}

/// A fast, fixed sequence of pseudo-random numbers (xorshift64) for offsets.
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.max(1);
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// The rows for one client.
fn bench_one(c: &Client, tag: &str, iters: usize) -> Result<Rows> {
    let top = format!("/bench-{tag}");
    fs(c.mkdir(&top, 0o755))?;
    let file = format!("{top}/data");
    let fd = fs(c.open(
        &file,
        OpenFlags {
            read: true,
            write: true,
            create: true,
            ..Default::default()
        },
        0o644,
    ))?;
    let ino = fs(c.ino(fd))?;
    // A 16 MiB file to write and read 4 KiB pages of at random.
    const PAGES: u64 = 4096;
    let chunk = vec![7u8; 1 << 20];
    for i in 0..PAGES / 256 {
        fs(c.pwrite(fd, i << 20, &chunk))?;
    }
    let mut next = xorshift(0x2545_F491_4F6C_DD1D);
    let page = vec![0x5Au8; 4096];
    let mut rows = Vec::new();
    rows.push(("rpc_us", measure(iters, |_| fs(c.ping()))?));
    rows.push((
        "commit_us",
        measure(iters, |i| {
            let req = SetAttrReq {
                mtime: Some(TimeSet::At(i as i64)),
                ..Default::default()
            };
            fs(c.setattr(ino, &req)).map(|_| ())
        })?,
    ));
    rows.push((
        "tail_read_us",
        measure(iters, |_| fs(c.getattr(ino)).map(|_| ()))?,
    ));
    let n = iters.min(2000);
    let dir = format!("{top}/d");
    fs(c.mkdir(&dir, 0o755))?;
    let mut k = 0u64;
    rows.push((
        "create_us",
        measure(n, |_| {
            k += 1;
            let f = fs(c.open(
                &format!("{dir}/f{k}"),
                OpenFlags {
                    write: true,
                    create: true,
                    excl: true,
                    ..Default::default()
                },
                0o644,
            ))?;
            fs(c.close(f))
        })?,
    ));
    let mut u = 0u64;
    rows.push((
        "unlink_us",
        measure(n, |_| {
            u += 1;
            fs(c.unlink(&format!("{dir}/f{u}")))
        })?,
    ));
    let mut m = 0u64;
    rows.push((
        "mkdir_us",
        measure(n, |_| {
            m += 1;
            fs(c.mkdir(&format!("{dir}/m{m}"), 0o755)).map(|_| ())
        })?,
    ));
    let mut r = 0u64;
    rows.push((
        "rmdir_us",
        measure(n, |_| {
            r += 1;
            fs(c.rmdir(&format!("{dir}/m{r}")))
        })?,
    ));
    rows.push((
        "write_4k_us",
        measure(iters, |_| {
            let off = (next() % PAGES) * 4096;
            fs(c.pwrite(fd, off, &page)).map(|_| ())
        })?,
    ));
    rows.push((
        "read_4k_us",
        measure(iters, |_| {
            let off = (next() % PAGES) * 4096;
            fs(c.pread(fd, off, 4096)).map(|_| ())
        })?,
    ));
    fs(c.close(fd))?;
    Ok(Rows(rows))
}

pub fn run(
    backend: &str,
    provider: &str,
    iters: usize,
    replicas: u16,
    store_mode: &str,
    mirror: &str,
    json: bool,
) -> Result<()> {
    let cluster = BenchCluster::start_with(backend, provider, replicas, store_mode, mirror)?;
    let client = |strong: bool, internal: bool| cluster.client(strong, internal);
    let progress = |what: &str| {
        if !json {
            eprintln!("measuring: {what}");
        }
    };
    progress("internal client, strong");
    let internal = bench_one(&client(true, true)?, "internal", iters)?;
    progress("external client, strong");
    let external = bench_one(&client(true, false)?, "external", iters)?;
    progress("external client, weak");
    let weak = bench_one(&client(false, false)?, "weak", iters)?;
    progress("internal client, strong, optimistic");
    let optimistic = bench_one(&cluster.client_with(true, true, true)?, "optimistic", iters)?;
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    if json {
        println!(
            "{{\"backend\":\"{backend}\",\"provider\":\"{provider}\",\"iters\":{iters},\"replicas\":{replicas},\"store_mode\":\"{store_mode}\",\"mirror\":\"{mirror}\",\
             \"pools\":\"/dev/shm (volatile: tmpfs emulates NVMM)\",\"kernel\":\"{}\",\
             {},\"external\":{{{}}},\"weak\":{{{}}},\"optimistic\":{{{}}}}}",
            kernel.trim(),
            internal.json(),
            external.json(),
            weak.json(),
            optimistic.json()
        );
        return Ok(());
    }
    println!(
        "orion bench client: backend {backend}{}, {replicas} data store(s) per group, {iters} \
         ops per row, pools on /dev/shm (tmpfs emulates NVMM, as in the paper; the stores' \
         pool mode: {store_mode}), {}, latencies in µs",
        if backend == "local" {
            String::new()
        } else {
            format!(" ({provider})")
        },
        match mirror {
            "" => "one MDS".to_string(),
            m => format!("an MDS mirror ({m} manager)"),
        }
    );
    println!(
        "{:<14} {:>18} {:>18} {:>18} {:>18}",
        "operation", "internal strong", "external strong", "external weak", "int. optimistic"
    );
    println!(
        "{:<14} {:>9}{:>9} {:>9}{:>9} {:>9}{:>9} {:>9}{:>9}",
        "", "p50", "p99", "p50", "p99", "p50", "p99", "p50", "p99"
    );
    for (i, (k, l)) in internal.0.iter().enumerate() {
        let (e, w, o) = (&external.0[i].1, &weak.0[i].1, &optimistic.0[i].1);
        println!(
            "{:<14} {:>9.2}{:>9.2} {:>9.2}{:>9.2} {:>9.2}{:>9.2} {:>9.2}{:>9.2}",
            k.trim_end_matches("_us"),
            l.p50,
            l.p99,
            e.p50,
            e.p99,
            w.p50,
            w.p99,
            o.p50,
            o.p99
        );
    }
    Ok(())
}
