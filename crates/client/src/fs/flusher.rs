//! The flusher thread of optimistic persistence.

use super::*;
use crate::remote::Fail;

/// The flusher thread of an optimistic client: commits staged writes when they are
/// due; looks every stage period while writes come, and sleeps until the next staged
/// write after `IDLE_ROUNDS` periods with nothing staged. Stops with the client.
pub(crate) fn flusher(inner: Weak<Mutex<Inner>>) {
    const IDLE_ROUNDS: u32 = 100;
    let mut idle = 0;
    loop {
        let wait = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let mut g = lock(&inner);
            if g.staging.closing {
                return;
            }
            if g.staging.due() {
                // A failure is kept for the file's fsync or close.
                if let Err(Fail::Reconnected) = g.datapath().flush_all() {
                    g.datapath().reconnected();
                }
            }
            match g.staging.due_in() {
                Some(d) => {
                    idle = 0;
                    Some(d)
                }
                None if idle < IDLE_ROUNDS => {
                    idle += 1;
                    Some(g.staging.max_age())
                }
                None => {
                    g.staging.flusher_asleep = true;
                    None
                }
            }
        };
        match wait {
            Some(d) => std::thread::park_timeout(d),
            None => std::thread::park(),
        }
    }
}
