//! Where timestamps come from: the real clock, or a logical one for repeatable tests.

use std::sync::atomic::{AtomicI64, Ordering};

pub trait Clock: Send + Sync {
    /// Nanoseconds since the Unix epoch.
    fn now(&self) -> i64;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> i64 {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        d.as_nanos() as i64
    }
}

/// Advances by one microsecond on every reading: deterministic and strictly increasing.
pub struct LogicalClock(AtomicI64);

impl LogicalClock {
    pub fn new(start: i64) -> LogicalClock {
        LogicalClock(AtomicI64::new(start))
    }
}

impl Clock for LogicalClock {
    fn now(&self) -> i64 {
        self.0.fetch_add(1000, Ordering::Relaxed) + 1000
    }
}
