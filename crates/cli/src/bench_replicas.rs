//! `orion bench replicas`: what a store failure costs a replicated group, against an
//! MDS and a group of two data stores this command starts as processes (pools on
//! /dev/shm) and stops by PID. A client writes a file, then 4 KiB writes at random
//! while one store is killed with SIGKILL: how long the slowest write around the kill
//! took (the group's stall: detection, the map lease, the map refresh), and the write
//! latency before and after. Then the store starts again and copies what it missed:
//! how long until it serves, and at what rate it copied.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use orion_client::{MemberState, OpenFlags};

use crate::bench_client::xorshift;
use crate::bench_cluster::BenchCluster;

fn fs<T>(r: orion_client::FsResult<T>) -> Result<T> {
    r.map_err(|e| anyhow!("{e}"))
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p) as usize]
}

pub fn run(backend: &str, provider: &str, data_mib: u64, json: bool) -> Result<()> {
    let say = |what: &str| {
        if !json {
            eprintln!("{what}");
        }
    };
    let mut cluster = BenchCluster::start_replicated(backend, provider, 2)?;
    let client = cluster.client(true, false)?;
    let flags = OpenFlags {
        read: true,
        write: true,
        create: true,
        ..Default::default()
    };
    fs(client.mkdir("/bench-replicas", 0o755))?;
    let fd = fs(client.open("/bench-replicas/data", flags, 0o644))?;
    say(&format!("writing {data_mib} MiB to both stores"));
    let chunk = vec![0x3Cu8; 1 << 20];
    for i in 0..data_mib {
        fs(client.pwrite(fd, i << 20, &chunk))?;
    }
    let pages = data_mib * 256;
    let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
    let page = vec![0xA5u8; 4096];
    // 4 KiB writes for a second, a kill, then three seconds more.
    say("4 KiB writes; store 1 is killed after a second");
    let t0 = Instant::now();
    let mut killed_at = None;
    let mut lat: Vec<(f64, f64)> = Vec::new(); // (start s, latency µs)
    while t0.elapsed() < Duration::from_secs(4) {
        if killed_at.is_none() && t0.elapsed() >= Duration::from_secs(1) {
            cluster.kill_store(1);
            killed_at = Some(t0.elapsed().as_secs_f64());
        }
        let s = Instant::now();
        fs(client.pwrite(fd, (next() % pages) * 4096, &page))?;
        lat.push((
            s.duration_since(t0).as_secs_f64(),
            s.elapsed().as_secs_f64() * 1e6,
        ));
    }
    let k = killed_at.expect("killed");
    let mut before: Vec<f64> = lat.iter().filter(|l| l.0 < k).map(|l| l.1).collect();
    let mut after: Vec<f64> = lat.iter().filter(|l| l.0 > k + 2.0).map(|l| l.1).collect();
    let stall_ms = lat
        .iter()
        .filter(|l| l.0 + l.1 / 1e6 >= k)
        .map(|l| l.1 / 1e3)
        .fold(0.0f64, f64::max);
    let (p50_before, p50_after) = (percentile(&mut before, 0.5), percentile(&mut after, 0.5));
    // The store starts again with its pool and copies what it missed; then it is
    // killed again, loses its pool, and is rebuilt whole from its peer.
    say("store 1 starts again and copies what it missed");
    cluster.restart_store(1)?;
    let back = wait_resynced(&cluster, &client)?;
    say("store 1 is killed again and rebuilt from an empty pool");
    cluster.kill_store(1);
    // The map says so before the store starts again (else the wait below could see the
    // map of before the kill).
    let t = Instant::now();
    while fs(client.cluster_map())?
        .1
        .iter()
        .any(|s| s.member.index == 1 && s.state == MemberState::Up)
    {
        if t.elapsed() > Duration::from_secs(60) {
            return Err(anyhow!("the MDS did not see store 1 die within a minute"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let pool = cluster.store_pool(1);
    std::fs::remove_file(&pool).with_context(|| format!("removing {}", pool.display()))?;
    cluster.restart_store(1)?;
    let rebuilt = wait_resynced(&cluster, &client)?;
    fs(client.close(fd))?;
    if json {
        println!(
            "{{\"backend\":\"{backend}\",\"data_mib\":{data_mib},\"write_4k_p50_us_before\":{p50_before:.1},\
             \"write_4k_p50_us_degraded\":{p50_after:.1},\"stall_ms\":{stall_ms:.1},\
             \"resync_pages\":{},\"resync_mib_s\":{:.0},\"back_s\":{:.2},\
             \"rebuild_pages\":{},\"rebuild_mib_s\":{:.0},\"rebuild_s\":{:.2}}}",
            back.pages, back.mib_s, back.secs, rebuilt.pages, rebuilt.mib_s, rebuilt.secs
        );
        return Ok(());
    }
    println!(
        "orion bench replicas: backend {backend}, a group of 2 stores, {data_mib} MiB written, \
         external client in strong mode, pools on /dev/shm"
    );
    println!("4 KiB write p50, both stores up         {p50_before:>9.1} µs");
    println!("slowest write around the kill -9        {stall_ms:>9.1} ms");
    println!("4 KiB write p50, one store (2 s later)  {p50_after:>9.1} µs");
    println!(
        "store back and serving after           {:>9.2} s ({} pages copied, {:.0} MiB/s)",
        back.secs, back.pages, back.mib_s
    );
    println!(
        "rebuilt from an empty pool after       {:>9.2} s ({} pages copied, {:.0} MiB/s)",
        rebuilt.secs, rebuilt.pages, rebuilt.mib_s
    );
    Ok(())
}

/// How a store came back: seconds until the map said every store is up, and the
/// store's own account of its copy.
struct Back {
    secs: f64,
    pages: u64,
    mib_s: f64,
}

/// Waits until both stores are up, and reads store 1's last "resynced N pages (M MiB)
/// in S s, R MiB/s" line.
fn wait_resynced(cluster: &BenchCluster, client: &orion_client::Client) -> Result<Back> {
    let r0 = Instant::now();
    loop {
        let (_, map) = fs(client.cluster_map())?;
        if map.len() == 2 && map.iter().all(|s| s.state == MemberState::Up) {
            break;
        }
        if r0.elapsed() > Duration::from_secs(600) {
            return Err(anyhow!("store 1 did not come back within 10 minutes"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let secs = r0.elapsed().as_secs_f64();
    let log = cluster.store_log(1);
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("resynced"))
        .unwrap_or("");
    let pages = line
        .split("resynced ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let mib_s = line
        .rsplit(", ")
        .next()
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    Ok(Back { secs, pages, mib_s })
}
