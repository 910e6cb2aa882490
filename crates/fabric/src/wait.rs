//! Adaptive spinning before sleeping.
//!
//! On this class of machine a sleeping thread takes tens of microseconds to wake, while a
//! completion from a busy peer arrives within a microsecond or two. A waiter therefore spins
//! first, for a budget that follows recent history: it grows when completions arrive just
//! after the spin gave up and shrinks when the waiter keeps sleeping for long. The budget never
//! exceeds [`SpinPolicy::max`], so an idle poller always goes to sleep.
//!
//! A waiter may also give its CPU away while it spins ([`SpinPolicy::yield_after`]):
//! with fewer cores than busy threads, the thread that will answer it may be queued
//! behind it on its own CPU.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpinPolicy {
    pub min: Duration,
    pub max: Duration,
    /// Past this much spinning, each poll that finds nothing yields the CPU
    /// (`sched_yield`) instead of a pause. None: never (a server's loop: each yield
    /// delays its next request by a system call, and its busy clients pay that).
    pub yield_after: Option<Duration>,
}

impl Default for SpinPolicy {
    /// Up to 50 µs: about what waking a sleeping vCPU costs, so spinning longer cannot win.
    fn default() -> Self {
        SpinPolicy {
            min: Duration::from_micros(1),
            max: Duration::from_micros(50),
            yield_after: None,
        }
    }
}

impl SpinPolicy {
    /// Never spin: sleep at once (for tests of the sleeping path, and for idle daemons).
    pub fn never() -> Self {
        SpinPolicy {
            min: Duration::ZERO,
            max: Duration::ZERO,
            yield_after: None,
        }
    }

    /// A client's: it waits for replies, and once a reply is later than a round trip
    /// to a busy server ([`CLIENT_YIELD_AFTER`]), the server (or its mirror, or
    /// another thread of the client) may be queued behind it, so it yields at each
    /// poll (design note 70).
    pub fn client() -> Self {
        SpinPolicy {
            yield_after: Some(CLIENT_YIELD_AFTER),
            ..SpinPolicy::default()
        }
    }
}

/// Past most round trips to a busy server here (a mirrored log commit takes 3 µs at
/// the median, an RPC 1 µs): those replies are caught by pure spinning, with no
/// system call in their way; a later one likely waits for a thread without a CPU.
pub const CLIENT_YIELD_AFTER: Duration = Duration::from_micros(5);

pub(crate) struct Spinner {
    policy: SpinPolicy,
    budget_ns: AtomicU64,
}

impl Spinner {
    pub(crate) fn new(policy: SpinPolicy) -> Spinner {
        Spinner {
            policy,
            budget_ns: AtomicU64::new(policy.max.as_nanos() as u64),
        }
    }

    /// Spins once, `spun` into the wait: a pause, or past the policy's
    /// `yield_after`, a yield of the CPU.
    pub(crate) fn pause(&self, spun: Duration) {
        match self.policy.yield_after {
            Some(after) if spun >= after => std::thread::yield_now(),
            _ => std::hint::spin_loop(),
        }
    }

    pub(crate) fn budget(&self) -> Duration {
        Duration::from_nanos(self.budget_ns.load(Ordering::Relaxed))
    }

    fn set(&self, d: Duration) {
        let d = d.clamp(self.policy.min, self.policy.max);
        self.budget_ns.store(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// A completion arrived while spinning after `waited`: keep at least twice that.
    pub(crate) fn hit(&self, waited: Duration) {
        if waited * 2 > self.budget() {
            self.set(waited * 2);
        }
    }

    /// The spin ran out; the wait ended after `waited` in total (None: it timed out).
    pub(crate) fn miss(&self, waited: Option<Duration>) {
        match waited {
            Some(w) if w <= self.policy.max * 2 => self.set(self.budget() * 2 + self.policy.min),
            _ => self.set(self.budget() / 2),
        }
    }
}
