//! CPU time per operation, summed over every process of the machine, for the
//! benchmarks' rows.
//!
//! On a machine where the application shares its cores with the file system, what an
//! operation costs in CPU (the application's system calls, the mount, the daemons, the
//! kernel's threads) decides how far the work scales, whatever the core count; latency
//! alone hides a daemon that spins. A [`CpuMeter`] is started just before a row's timed
//! section and finished just after it with the row's operation count. It reads:
//! - every other process's threads' run time from `/proc/PID/task/TID/schedstat`
//!   (nanoseconds; a thread that starts in the window counts from zero, one that ends
//!   in it is lost, which the daemons measured here never do);
//! - this process's own time, including its threads that ended and the children it
//!   waited for (the `sqlite3` of the SQLite row), from `getrusage` (microseconds);
//! - the machine's busy time from `/proc/stat` (clock ticks), as a cross-check that
//!   catches whatever the per-process sum missed (processes that came and went).
//!
//! Processes are grouped by what they are: `orion` daemons by their pool where they
//! have one (`orion mds`, `orion mds-mirror`, `orion ds0`), else by their subcommand
//! (`orion mount`, `orion bench null-fuse`); this process as `workload`; kernel
//! threads by their name without the per-CPU suffix (`kworker`); others by their
//! command name.

use std::collections::HashMap;
use std::time::Instant;

use serde_json::{json, Map, Value};

/// A share below this fraction of the total is folded into `other`.
const FOLD_BELOW: f64 = 0.02;

/// Run time in nanoseconds by process, and by label, at one instant.
struct Snapshot {
    /// (pid, tid) → nanoseconds run.
    threads: HashMap<(u32, u32), u64>,
    labels: HashMap<u32, String>,
    own_ns: u64,
    busy_ticks: Option<u64>,
}

pub struct CpuMeter {
    start: Snapshot,
    at: Instant,
}

impl CpuMeter {
    pub fn start() -> CpuMeter {
        CpuMeter {
            start: snapshot(OwnRead::AfterScan),
            at: Instant::now(),
        }
    }

    /// The CPU the window cost, per operation: `{"us_per_op", "machine_us_per_op",
    /// "cores", "by": {label: us_per_op}}`. Null for a window of no operations.
    pub fn finish(self, ops: u64) -> Value {
        let elapsed = self.at.elapsed();
        let end = snapshot(OwnRead::BeforeScan);
        if ops == 0 {
            return Value::Null;
        }
        let mut by: HashMap<String, u64> = HashMap::new();
        *by.entry("workload".into()).or_default() += end.own_ns.saturating_sub(self.start.own_ns);
        for (&(pid, tid), &ns) in &end.threads {
            let before = self.start.threads.get(&(pid, tid)).copied().unwrap_or(0);
            let d = ns.saturating_sub(before);
            if d > 0 {
                let label = end.labels.get(&pid).cloned().unwrap_or_else(|| "?".into());
                *by.entry(label).or_default() += d;
            }
        }
        let total: u64 = by.values().sum();
        let per_op = |ns: u64| ns as f64 / 1e3 / ops as f64;
        let mut split = Map::new();
        let mut folded = 0u64;
        let mut named: Vec<(String, u64)> = by.into_iter().collect();
        named.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        for (label, ns) in named {
            if label != "workload" && (ns as f64) < FOLD_BELOW * total as f64 {
                folded += ns;
            } else {
                split.insert(label, json!(round3(per_op(ns))));
            }
        }
        if folded > 0 {
            split.insert("other".into(), json!(round3(per_op(folded))));
        }
        let machine = match (self.start.busy_ticks, end.busy_ticks) {
            (Some(a), Some(b)) => json!(round3(per_op(
                b.saturating_sub(a) * 1_000_000_000 / ticks_per_second()
            ))),
            _ => Value::Null,
        };
        json!({
            "us_per_op": round3(per_op(total)),
            "machine_us_per_op": machine,
            "cores": round3(total as f64 / elapsed.as_nanos().max(1) as f64),
            "by": split,
        })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn ticks_per_second() -> u64 {
    // SAFETY: sysconf reads a constant of the C library; no memory is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// Whether this process's own figures are read before or after the scan of the
/// others: after it at a window's start, before it at its end, so that the meter's
/// own scans (about a thousand reads of /proc) fall outside the window.
#[derive(Clone, Copy, PartialEq)]
enum OwnRead {
    AfterScan,
    BeforeScan,
}

fn snapshot(own_read: OwnRead) -> Snapshot {
    let own_first = (own_read == OwnRead::BeforeScan).then(|| (own_ns(), busy_ticks()));
    let me = std::process::id();
    let mut threads = HashMap::new();
    let mut labels = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if pid == me {
                continue;
            }
            let Some(label) = label_of(pid) else {
                continue; // gone meanwhile
            };
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for t in tasks.flatten() {
                let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                if let Some(ns) = run_ns(pid, tid) {
                    threads.insert((pid, tid), ns);
                }
            }
            labels.insert(pid, label);
        }
    }
    let (own_ns, busy_ticks) = own_first.unwrap_or_else(|| (own_ns(), busy_ticks()));
    Snapshot {
        threads,
        labels,
        own_ns,
        busy_ticks,
    }
}

/// The first field of a thread's schedstat: nanoseconds it ran.
fn run_ns(pid: u32, tid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// What a process is: see the module's text.
fn label_of(pid: u32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<&[u8]> = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .collect();
    let base = |a: &[u8]| {
        let s = String::from_utf8_lossy(a).into_owned();
        s.rsplit('/').next().unwrap_or("").to_string()
    };
    if let Some(first) = args.first() {
        if base(first) == "orion" {
            // A daemon by its pool's name where it has one (`orion mds-mirror`,
            // `orion ds0`): `orion up` runs several of each subcommand.
            let sub = args.get(1).map(|a| String::from_utf8_lossy(a).into_owned());
            let pool = args
                .iter()
                .position(|a| *a == b"--pool")
                .and_then(|i| args.get(i + 1))
                .map(|p| base(p).trim_end_matches(".pool").to_string());
            // A benchmark's server by what it is (`orion bench null-fuse`).
            let what = args.get(2).map(|a| String::from_utf8_lossy(a).into_owned());
            return Some(match (pool, sub.as_deref(), what) {
                (Some(p), ..) => format!("orion {p}"),
                (None, Some("bench"), Some(w)) => format!("orion bench {w}"),
                (None, Some(s), _) => format!("orion {s}"),
                (None, None, _) => "orion".into(),
            });
        }
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let comm = stat.split_once('(')?.1.rsplit_once(')')?.0;
    if !args.is_empty() {
        return Some(comm.to_string());
    }
    // Kernel threads have no command line: their name, less a per-CPU suffix.
    let comm = comm.split('/').next().unwrap_or(comm);
    let comm = comm.trim_end_matches(|c: char| c.is_ascii_digit() || c == ':' || c == '-');
    Some(if comm.is_empty() {
        "?".into()
    } else {
        comm.into()
    })
}

/// This process's CPU, with its ended threads and waited-for children.
fn own_ns() -> u64 {
    let get = |who| {
        // SAFETY: `ru` is a zeroed rusage on this frame that getrusage fills.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: a valid pointer to `ru`, which outlives the call.
        if unsafe { libc::getrusage(who, &mut ru) } != 0 {
            return 0;
        }
        let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
        (us(ru.ru_utime) + us(ru.ru_stime)) * 1000
    };
    get(libc::RUSAGE_SELF) + get(libc::RUSAGE_CHILDREN)
}

/// The machine's busy clock ticks: every CPU's time but idle, iowait and steal.
fn busy_ticks() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().next()?.strip_prefix("cpu ")?;
    let f: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest is within user)
    Some(f.first()? + f.get(1)? + f.get(2)? + f.get(5)? + f.get(6)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_loop_in_this_process_is_counted_as_the_workload() {
        let m = CpuMeter::start();
        // 50 ms of this thread's CPU, by the kernel's per-thread clock (not wall time,
        // which a loaded machine stretches).
        let started = thread_cpu_ns();
        let mut x = 0u64;
        while thread_cpu_ns() - started < 50_000_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let v = m.finish(1000);
        let per_op = v["us_per_op"].as_f64().unwrap();
        let workload = v["by"]["workload"].as_f64().unwrap();
        // 50 ms over 1000 operations: at least 50 µs each, this process's.
        assert!(workload >= 49.0, "{v}");
        assert!(per_op >= workload, "{v}");
    }

    fn thread_cpu_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid pointer to `ts` on this frame, which the call fills.
        assert_eq!(
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) },
            0
        );
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    #[test]
    fn no_operations_give_no_figure() {
        assert_eq!(CpuMeter::start().finish(0), Value::Null);
    }

    #[test]
    fn kernel_threads_are_named_without_their_cpu() {
        // pid 2 is kthreadd on Linux: no command line, a plain name.
        if let Some(l) = label_of(2) {
            assert!(!l.is_empty() && !l.contains('/'), "{l}");
        }
    }
}
