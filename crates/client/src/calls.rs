//! How long each call of a front-end took, and the bytes reads and writes moved: the
//! figures an operator's dashboard draws for a mount (`/metrics`, `orion top`).
//!
//! A front-end names its call ([`Call`]) and holds the guard [`Client::timed`] gives
//! for as long as the call runs; the guard adds the time to that call's histogram
//! when dropped. Histograms are fixed buckets of atomics (no lock, no allocation), so
//! the FUSE request threads never wait for each other to count. The mount times
//! every request (a directory's release and fsync count as `release` and `fsync`);
//! the preload library times nothing (it has no endpoint to show it), but its reads
//! and writes count their bytes like any front-end's.
//!
//! [`Client::timed`]: crate::Client::timed

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// The calls a front-end makes, one per POSIX operation it serves (the FUSE
/// requests).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    Lookup,
    Getattr,
    Setattr,
    Readlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Symlink,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Flush,
    Release,
    Lock,
    Fsync,
    Opendir,
    Readdir,
    Statfs,
    Access,
    Xattr,
    Fallocate,
    Create,
}

impl Call {
    /// Every call, in the order of [`Call::name`]'s table.
    pub const ALL: [Call; 25] = [
        Call::Lookup,
        Call::Getattr,
        Call::Setattr,
        Call::Readlink,
        Call::Mknod,
        Call::Mkdir,
        Call::Unlink,
        Call::Rmdir,
        Call::Symlink,
        Call::Rename,
        Call::Link,
        Call::Open,
        Call::Read,
        Call::Write,
        Call::Flush,
        Call::Release,
        Call::Lock,
        Call::Fsync,
        Call::Opendir,
        Call::Readdir,
        Call::Statfs,
        Call::Access,
        Call::Xattr,
        Call::Fallocate,
        Call::Create,
    ];

    /// The name a metric's `call` label shows.
    pub fn name(self) -> &'static str {
        match self {
            Call::Lookup => "lookup",
            Call::Getattr => "getattr",
            Call::Setattr => "setattr",
            Call::Readlink => "readlink",
            Call::Mknod => "mknod",
            Call::Mkdir => "mkdir",
            Call::Unlink => "unlink",
            Call::Rmdir => "rmdir",
            Call::Symlink => "symlink",
            Call::Rename => "rename",
            Call::Link => "link",
            Call::Open => "open",
            Call::Read => "read",
            Call::Write => "write",
            Call::Flush => "flush",
            Call::Release => "release",
            Call::Lock => "lock",
            Call::Fsync => "fsync",
            Call::Opendir => "opendir",
            Call::Readdir => "readdir",
            Call::Statfs => "statfs",
            Call::Access => "access",
            Call::Xattr => "xattr",
            Call::Fallocate => "fallocate",
            Call::Create => "create",
        }
    }
}

/// Upper bounds of the histogram buckets, in seconds: 1 µs doubling to about 0.5 s,
/// then everything slower.
pub fn bucket_bounds() -> [f64; BUCKETS] {
    let mut b = [0.0; BUCKETS];
    for (i, v) in b.iter_mut().enumerate().take(BUCKETS - 1) {
        *v = 1e-6 * (1u64 << i) as f64;
    }
    b[BUCKETS - 1] = f64::INFINITY;
    b
}

/// Buckets per histogram (the last one unbounded).
pub const BUCKETS: usize = 21;

#[derive(Default)]
struct Histogram {
    /// Calls that took at most the bound of the same index in [`bucket_bounds`] (and
    /// more than the one before).
    buckets: [AtomicU64; BUCKETS],
    nanos: AtomicU64,
}

/// One call's histogram as read now.
#[derive(Clone, Debug, PartialEq)]
pub struct CallFigures {
    pub call: Call,
    pub count: u64,
    pub seconds: f64,
    /// Calls per bucket of [`bucket_bounds`], not cumulative.
    pub buckets: [u64; BUCKETS],
}

/// Every call's histogram, and the bytes read and written.
pub struct CallTimes {
    calls: [Histogram; Call::ALL.len()],
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
}

impl Default for CallTimes {
    fn default() -> Self {
        CallTimes {
            calls: std::array::from_fn(|_| Histogram::default()),
            read_bytes: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
        }
    }
}

impl CallTimes {
    /// Times `call` until the guard is dropped.
    pub fn timed(&self, call: Call) -> Timed<'_> {
        Timed {
            into: &self.calls[call as usize],
            start: Instant::now(),
        }
    }

    pub(crate) fn read(&self, bytes: usize) {
        self.read_bytes.fetch_add(bytes as u64, Relaxed);
    }

    pub(crate) fn written(&self, bytes: usize) {
        self.written_bytes.fetch_add(bytes as u64, Relaxed);
    }

    /// Bytes read and bytes written so far, through every front-end of this client.
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.read_bytes.load(Relaxed),
            self.written_bytes.load(Relaxed),
        )
    }

    /// Every call's histogram. A call being counted while this reads may show in its
    /// bucket and not yet in the time summed: the figures are each exact, not a
    /// snapshot of all of them at once.
    pub fn figures(&self) -> Vec<CallFigures> {
        Call::ALL
            .iter()
            .map(|&call| {
                let h = &self.calls[call as usize];
                let buckets: [u64; BUCKETS] = std::array::from_fn(|i| h.buckets[i].load(Relaxed));
                CallFigures {
                    call,
                    // The buckets' sum, not a counter read apart: a scrape's count
                    // and its +Inf bucket agree.
                    count: buckets.iter().sum(),
                    seconds: h.nanos.load(Relaxed) as f64 * 1e-9,
                    buckets,
                }
            })
            .collect()
    }
}

/// A call being timed (see [`CallTimes::timed`]).
pub struct Timed<'a> {
    into: &'a Histogram,
    start: Instant,
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        let nanos = self.start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.into.buckets[bucket_of(nanos)].fetch_add(1, Relaxed);
        self.into.nanos.fetch_add(nanos, Relaxed);
    }
}

/// The bucket a call of `nanos` falls in: the first whose bound is not below it.
fn bucket_of(nanos: u64) -> usize {
    // Bucket i holds (2^(i-1), 2^i] µs; everything up to 1 µs is bucket 0.
    let micros_up = nanos.div_ceil(1000);
    if micros_up <= 1 {
        return 0;
    }
    let i = (64 - (micros_up - 1).leading_zeros()) as usize;
    i.min(BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_has_its_own_index_and_name() {
        let mut names = std::collections::HashSet::new();
        for (i, c) in Call::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{c:?} is out of order in Call::ALL");
            assert!(names.insert(c.name()), "{} is named twice", c.name());
        }
    }

    #[test]
    fn a_duration_falls_in_the_first_bucket_whose_bound_holds_it() {
        let bounds = bucket_bounds();
        for nanos in [
            0u64,
            1,
            999,
            1000,
            1001,
            1999,
            2000,
            2001,
            3_500,
            4_000,
            4_001,
            1_000_000,
            524_288_000,
            524_288_001,
            10_000_000_000,
        ] {
            let i = bucket_of(nanos);
            let secs = nanos as f64 * 1e-9;
            // Compared in whole nanoseconds: the bounds are whole microseconds.
            let bound_ns = |b: f64| (b * 1e9).round();
            assert!(
                bounds[i].is_infinite() || nanos as f64 <= bound_ns(bounds[i]),
                "{nanos} ns above bucket {i}'s bound {}",
                bounds[i]
            );
            assert!(
                i == 0 || nanos as f64 > bound_ns(bounds[i - 1]),
                "{nanos} ns ({secs} s) fits bucket {} already",
                i - 1
            );
        }
    }

    #[test]
    fn a_timed_call_counts_once_in_its_own_histogram() {
        let t = CallTimes::default();
        drop(t.timed(Call::Write));
        drop(t.timed(Call::Write));
        drop(t.timed(Call::Read));
        t.written(4096);
        t.read(100);
        let f = t.figures();
        let of = |c: Call| f.iter().find(|x| x.call == c).unwrap().clone();
        assert_eq!(of(Call::Write).count, 2);
        assert_eq!(of(Call::Write).buckets.iter().sum::<u64>(), 2);
        assert_eq!(of(Call::Read).count, 1);
        assert_eq!(of(Call::Lookup).count, 0);
        assert_eq!(t.bytes(), (100, 4096));
    }
}
