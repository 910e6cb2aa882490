//! `orion bench fabric`: the fabric's verbs between two processes, next to the two floors of
//! this machine measured in the same run: a plain blocking-TCP ping-pong and a busy-polled
//! shared-memory ring.
//!
//! The peer is this binary (`orion bench fabric-peer`, hidden) in another process. Both sides
//! poll, as the latency targets assume. Each operation is timed alone; the report gives median
//! and p99 in microseconds, and the bandwidth of 1 MiB writes kept 4 deep.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use orion_fabric::echo::{serve, ServeOptions, Session, SESSION_SCRATCH};
use orion_fabric::mock::MockNet;
use orion_fabric::{Access, Backend, Domain, FabricConfig, OpKind, Secret, SpinPolicy};

pub(crate) struct Lat {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
}

pub(crate) fn lat(mut ns: Vec<u64>) -> Lat {
    ns.sort_unstable();
    let pick = |q: f64| ns[((ns.len() as f64 * q) as usize).min(ns.len() - 1)] as f64 / 1000.0;
    Lat {
        p50: pick(0.5),
        p99: pick(0.99),
    }
}

pub(crate) fn measure(iters: usize, mut op: impl FnMut(u64) -> Result<()>) -> Result<Lat> {
    for i in 0..(iters / 10).max(100) {
        op(i as u64)?;
    }
    let mut ns = Vec::with_capacity(iters);
    for i in 0..iters {
        let t = Instant::now();
        op(i as u64)?;
        ns.push(t.elapsed().as_nanos() as u64);
    }
    Ok(lat(ns))
}

/// A peer process, killed by PID when dropped.
struct Peer(Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_peer(args: &[&str]) -> Result<(Peer, String)> {
    let exe = std::env::current_exe().context("locating the orion binary")?;
    let mut child = Command::new(exe)
        .args(["bench", "fabric-peer"])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the benchmark peer")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line)?;
    let peer = Peer(child);
    match line.trim().strip_prefix("listening ") {
        Some(a) => Ok((peer, a.to_string())),
        None => bail!("the benchmark peer did not start ({line:?})"),
    }
}

fn config(backend: Backend, provider: &str, secret: Secret) -> FabricConfig {
    let mut c = FabricConfig::new(backend, secret);
    c.provider = provider.to_string();
    // Both sides poll: never fall asleep between a request and its reply.
    c.spin = SpinPolicy {
        min: Duration::from_micros(1),
        max: Duration::from_secs(1),
        yield_after: None,
    };
    c
}

struct Report {
    describe: String,
    rows: Vec<(&'static str, Lat)>,
    write_1m_mib_s: f64,
    tcp: Lat,
    shm: Lat,
}

pub fn run(backend: &str, provider: &str, iters: usize, json: bool) -> Result<()> {
    let (b, name) = match backend {
        "local" => (Backend::Local, "local"),
        "tcp" | "libfabric" => (Backend::Libfabric, "libfabric"),
        other => bail!("--backend must be local or tcp, not {other}"),
    };
    let secret = Secret::generate();
    let secret_file =
        std::env::temp_dir().join(format!("orion-bench-secret-{}", std::process::id()));
    write_private(&secret_file, secret.expose())?;
    let result = run_inner(b, name, provider, &secret, &secret_file, iters, json);
    let _ = std::fs::remove_file(&secret_file);
    // The peers were killed; remove what they left in /dev/shm.
    orion_fabric::local::sweep_dead_processes_files();
    let r = result?;
    if json {
        let row = |l: &Lat| format!("{{\"p50\":{:.3},\"p99\":{:.3}}}", l.p50, l.p99);
        let rows: Vec<String> = r
            .rows
            .iter()
            .map(|(k, l)| format!("\"{k}\":{}", row(l)))
            .collect();
        println!(
            "{{\"backend\":\"{backend}\",\"fabric\":\"{}\",\"iters\":{iters},\"machine\":{{\"cores\":{},\"kernel\":\"{}\",\"rdma\":false}},{},\"write_1m_mib_s\":{:.0},\"baseline\":{{\"tcp_pingpong_64b_us\":{},\"shm_ring_64b_us\":{}}}}}",
            r.describe.replace('"', "'"),
            std::thread::available_parallelism().map(|p| p.get()).unwrap_or(0),
            kernel(),
            rows.join(","),
            r.write_1m_mib_s,
            row(&r.tcp),
            row(&r.shm)
        );
    } else {
        println!("fabric: {}", r.describe);
        println!("{:<28} {:>9} {:>9}", "operation", "p50 µs", "p99 µs");
        for (k, l) in &r.rows {
            println!("{k:<28} {:>9.2} {:>9.2}", l.p50, l.p99);
        }
        println!(
            "{:<28} {:>9.0} MiB/s",
            "write_1m (4 deep)", r.write_1m_mib_s
        );
        println!(
            "{:<28} {:>9.2} {:>9.2}",
            "baseline: TCP ping-pong 64B", r.tcp.p50, r.tcp.p99
        );
        println!(
            "{:<28} {:>9.2} {:>9.2}",
            "baseline: shm ring 64B", r.shm.p50, r.shm.p99
        );
    }
    Ok(())
}

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(bytes)?;
    Ok(())
}

fn run_inner(
    b: Backend,
    name: &str,
    provider: &str,
    secret: &Secret,
    secret_file: &Path,
    iters: usize,
    json: bool,
) -> Result<Report> {
    let say = |s: &str| {
        if !json {
            eprintln!("{s}");
        }
    };
    say(&format!("orion bench fabric: {name}, {iters} operations per row, peer in another process, both polling"));
    let (peer, addr) = spawn_peer(&[
        "--role",
        name,
        "--provider",
        provider,
        "--secret-file",
        &secret_file.to_string_lossy(),
    ])?;
    let domain = Domain::open(config(b, provider, secret.clone()))?;
    let s = Session::connect(&domain, &addr, 1 << 20)?;
    let mut rows = Vec::new();
    say("  send/recv 64 B");
    rows.push((
        "send_recv_64b_us",
        measure(iters, |_| s.round_trip(64).map(|_| ()).map_err(Into::into))?,
    ));
    say("  read 8 B, read 4 KiB, write 4 KiB");
    rows.push((
        "read_8b_us",
        measure(iters, |i| s.read((i % 1024) * 8, 8).map_err(Into::into))?,
    ));
    rows.push((
        "read_4k_us",
        measure(iters, |i| {
            s.read((i % 1024) * 4096, 4096).map_err(Into::into)
        })?,
    ));
    rows.push((
        "write_4k_us",
        measure(iters, |i| {
            s.write((i % 1024) * 4096, 4096).map_err(Into::into)
        })?,
    ));
    say("  write 4 KiB with immediate + acknowledgment");
    rows.push((
        "write_imm_ack_us",
        measure(iters, |i| {
            let v = s.write_imm_ack((i % 1024) * 4096, 4096, i as u32)?;
            if v != i as u32 {
                bail!("acknowledged {v}, wrote {i}");
            }
            Ok(())
        })?,
    ));
    say("  1 MiB writes, 4 deep");
    let write_1m_mib_s = bandwidth(&s)?;
    drop(s);
    drop(peer);

    say("  baseline: blocking TCP ping-pong");
    let (peer, addr) = spawn_peer(&["--role", "tcp-echo"])?;
    let mut t = TcpStream::connect(&addr)?;
    t.set_nodelay(true)?;
    let mut buf = [7u8; 64];
    let tcp = measure(iters, |_| {
        t.write_all(&buf)?;
        t.read_exact(&mut buf)?;
        Ok(())
    })?;
    drop(t);
    drop(peer);

    say("  baseline: busy-polled shared-memory ring");
    let shm = shm_ring(iters)?;
    Ok(Report {
        describe: domain.describe(),
        rows,
        write_1m_mib_s,
        tcp,
        shm,
    })
}

fn bandwidth(s: &Session) -> Result<f64> {
    const MIB: usize = 1 << 20;
    let total: u64 = 512;
    let depth = 4u64;
    let start = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    while done < total {
        while posted < total && posted - done < depth {
            s.conn.post_write(
                100 + posted,
                &s.buf,
                SESSION_SCRATCH,
                &s.remote,
                (posted % depth) * MIB as u64,
                MIB,
            )?;
            posted += 1;
        }
        s.wait(OpKind::Write, None)?;
        done += 1;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// Two cache lines in a shared file: the client writes a sequence number in the first, the
/// peer spins on it and copies it to the second.
fn shm_ring(iters: usize) -> Result<Lat> {
    let path = PathBuf::from(format!("/dev/shm/orion-bench-ring-{}", std::process::id()));
    std::fs::write(&path, vec![0u8; 4096])?;
    let result = (|| {
        let (peer, _) = spawn_peer(&["--role", "shm-ring", "--path", &path.to_string_lossy()])?;
        let d = Domain::open(FabricConfig::new(
            Backend::Mock(MockNet::new(0)),
            Secret::generate(),
        ))?;
        let r = d.register_file(&path, 0, 4096, Access::LOCAL)?;
        let mut seq = 0u64;
        let l = measure(iters, |_| {
            seq += 1;
            r.store_u64(0, seq)?;
            let t = Instant::now();
            while r.load_u64(64)? != seq {
                if t.elapsed() > Duration::from_secs(5) {
                    bail!("the ring peer stopped answering");
                }
                std::hint::spin_loop();
            }
            Ok(())
        })?;
        r.store_u64(0, u64::MAX)?;
        drop(peer);
        Ok(l)
    })();
    let _ = std::fs::remove_file(&path);
    result
}

/// The far side of each measurement.
pub fn peer(
    role: &str,
    provider: &str,
    secret_file: Option<&Path>,
    path: Option<&Path>,
) -> Result<()> {
    let announce = |a: String| {
        println!("listening {a}");
        std::io::stdout().flush().ok();
    };
    match role {
        "local" | "libfabric" => {
            let b = if role == "local" {
                Backend::Local
            } else {
                Backend::Libfabric
            };
            let secret = Secret::from_file(secret_file.context("--secret-file is required")?)?;
            let domain = Domain::open(config(b, provider, secret))?;
            let l = domain.listen("127.0.0.1:0")?;
            announce(l.local_addr());
            serve(
                &domain,
                &l,
                &ServeOptions {
                    region_len: 8 << 20,
                    busy: true,
                },
            )?;
        }
        "tcp-echo" => {
            let l = TcpListener::bind("127.0.0.1:0")?;
            announce(l.local_addr()?.to_string());
            let (mut s, _) = l.accept()?;
            s.set_nodelay(true)?;
            let mut buf = [0u8; 64];
            while s.read_exact(&mut buf).is_ok() {
                s.write_all(&buf)?;
            }
        }
        "shm-ring" => {
            let path = path.context("--path is required")?;
            let d = Domain::open(FabricConfig::new(
                Backend::Mock(MockNet::new(0)),
                Secret::generate(),
            ))?;
            let r = d.register_file(path, 0, 4096, Access::LOCAL)?;
            announce(path.display().to_string());
            let mut last = 0;
            loop {
                let v = r.load_u64(0)?;
                if v == u64::MAX {
                    break;
                }
                if v != last {
                    r.store_u64(64, v)?;
                    last = v;
                }
                std::hint::spin_loop();
            }
        }
        other => bail!("unknown peer role {other}"),
    }
    Ok(())
}
