//! Adaptive spinning before sleeping.
//!
//! On this class of machine a sleeping thread takes tens of microseconds to wake, while a
//! completion from a busy peer arrives within a microsecond or two. A waiter therefore spins
//! first, for a budget that follows recent history: it grows when completions arrive just
//! after the spin gave up and shrinks when the waiter keeps sleeping for long. The budget never
//! exceeds [`SpinPolicy::max`], so an idle poller always goes to sleep.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpinPolicy {
    pub min: Duration,
    pub max: Duration,
}

impl Default for SpinPolicy {
    /// Up to 50 µs: about what waking a sleeping vCPU costs, so spinning longer cannot win.
    fn default() -> Self {
        SpinPolicy {
            min: Duration::from_micros(1),
            max: Duration::from_micros(50),
        }
    }
}

impl SpinPolicy {
    /// Never spin: sleep at once (for tests of the sleeping path, and for idle daemons).
    pub fn never() -> Self {
        SpinPolicy {
            min: Duration::ZERO,
            max: Duration::ZERO,
        }
    }
}

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
