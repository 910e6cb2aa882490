//! The flusher thread of optimistic persistence.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

use super::*;
use crate::remote::Fail;

/// The flusher thread of an optimistic client: commits the staged writes of every
/// lane when they are due; looks every stage period while writes come, and sleeps
/// until the next staged write after `IDLE_ROUNDS` periods with nothing staged (a
/// lane that stages a write wakes it). Stops with the client.
pub(crate) fn flusher(lanes: Weak<Lanes>) {
    const IDLE_ROUNDS: u32 = 100;
    let mut idle = 0;
    loop {
        let wait = {
            let Some(lanes) = lanes.upgrade() else {
                return;
            };
            if lanes.closing.load(Ordering::Acquire) {
                return;
            }
            let mut soonest: Option<Duration> = None;
            let mut period = Duration::MAX;
            for (_, m) in lanes.existing() {
                let mut g = lock(m);
                if g.staging.due() {
                    // A failure is kept for the file's fsync or close.
                    if let Err(Fail::Reconnected) = g.datapath().flush_all() {
                        g.datapath().reconnected();
                    }
                    lanes.note_staged(&g);
                }
                period = period.min(g.staging.max_age());
                if let Some(d) = g.staging.due_in() {
                    soonest = Some(soonest.map_or(d, |s| s.min(d)));
                }
            }
            match soonest {
                Some(d) => {
                    idle = 0;
                    Some(d)
                }
                None if idle < IDLE_ROUNDS => {
                    idle += 1;
                    Some(period)
                }
                None => {
                    // Asleep only if every lane is still empty when told so (a lane
                    // that stages after this wakes the flusher).
                    let mut empty = true;
                    for (_, m) in lanes.existing() {
                        let mut g = lock(m);
                        empty &= g.staging.is_empty();
                        g.staging.flusher_asleep = true;
                    }
                    (!empty).then_some(period)
                }
            }
        };
        match wait {
            Some(d) => std::thread::park_timeout(d),
            None => std::thread::park(),
        }
    }
}
