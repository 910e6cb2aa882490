//! The keeper thread: keeps this client's open table at whichever MDS serves.
//!
//! A new MDS (a restart, a fail-over) learns what a client holds open at the
//! client's next hello, and destroys no unlinked file until the clients its pool
//! names as holders wrote their tables again, or its reclaim time passed
//! (`orion_mds::open_tables`). A client that makes no call meanwhile would not say
//! hello soon, so while it holds files open (or the MDS's table may name one it
//! closed: a clear that failed) this thread looks every [`KEEP_PERIOD`]: a lane
//! that heard from the MDS within that time proves the connection; otherwise a ping
//! does (reconnecting if the MDS changed), and the table is written whole if the
//! MDS's may not hold it. A client that holds nothing open reconnects only when its
//! connection is known to be dead, so that the new MDS need not wait for it. A new
//! MDS is noticed at once when the old one's process died or closed the
//! connection; a host that vanishes silently only when a call times out
//! (`op_timeout_ms`), which the MDS's reclaim time then covers (`open_reclaim_ms`).

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

use orion_proto::MdsRequest;

use super::*;

/// How often the keeper looks: well within the MDS's grace period (at least a
/// second), reconnection included.
pub(crate) const KEEP_PERIOD: Duration = Duration::from_millis(200);

/// Runs until the client closes (the lanes go, or `closing` is set).
pub(crate) fn keeper(lanes: Weak<Lanes>) {
    loop {
        std::thread::park_timeout(KEEP_PERIOD);
        let Some(lanes) = lanes.upgrade() else {
            return;
        };
        if lanes.closing.load(Ordering::Acquire) {
            return;
        }
        if !lanes.opens.needs_keeping() {
            // No ping: an idle client costs the MDS nothing.
            let _ = lanes.run_background(|i| match i.remote.mds_seems_alive() {
                true => Ok(()),
                false => i.rpc(MdsRequest::Ping).map(drop),
            });
            continue;
        }
        // A hand-over lookup whose open never came lets go after a while.
        lanes.drop_handover_holds();
        // A failure is a call's to meet again: the next look tries anew.
        let _ = lanes.run_background(|i| {
            if !i.remote.heard_within(KEEP_PERIOD) {
                i.rpc(MdsRequest::Ping)?;
            }
            i.remote.keep_open_table()
        });
    }
}
