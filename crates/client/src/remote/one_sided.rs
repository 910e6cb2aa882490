//! The client's one-sided operations: reads of the MDS pool, writes into its open
//! table, and transfers of pages to and from stores, each posted on a connection
//! and awaited with a deadline that tells a silent peer from a slow one.

use std::time::{Duration, Instant};

use orion_fabric::{Connection, OpKind, Region};
use orion_meta::FsResult;
use orion_proto::channel::USER_WR_BASE;
use tracing::warn;

use super::{io_err, Fail, Remote, Res, SILENCE, WINDOW};

impl Remote {
    /// How long a data store may leave this client without an answer before it gives
    /// up on the connection (see [`Remote::one_sided`]): two map leases, by when the
    /// MDS has taken a silent store out of the map, and at least a second.
    pub(crate) fn store_patience(&self) -> Duration {
        (self.map_lease * 2)
            .max(Duration::from_secs(1))
            .min(self.timeout)
    }

    /// Reads `buf.len()` bytes of the MDS pool at `off`, one-sided.
    pub fn read_mds(&mut self, off: u64, buf: &mut [u8]) -> Res<()> {
        if !self.mds_seems_alive() {
            warn!("lost the MDS at {}; reconnecting", self.mds_addr());
            self.reconnect()?;
            return Err(Fail::Reconnected);
        }
        let (pool, len) = (self.mds_pool, buf.len());
        self.mds_one_sided(true, |c, io, wr| c.post_read(wr, io, 0, &pool, off, len))?;
        self.io.read(0, buf).map_err(io_err)?;
        Ok(())
    }

    /// One one-sided operation on the MDS connection, posted by `post` (given the
    /// connection, the I/O region and a wr_id). A connection found broken is
    /// re-established if `reconnect` (a hello does not recurse), and the caller's
    /// operation runs again ([`Fail::Reconnected`]).
    pub(crate) fn mds_one_sided(
        &mut self,
        reconnect: bool,
        mut post: impl FnMut(&Connection, &Region, u64) -> orion_fabric::Result<()>,
    ) -> Res<()> {
        let conn = self.mds.conn.clone();
        match self.one_sided(&conn, |io, wr| post(&conn, io, wr), 1) {
            Ok(()) => Ok(()),
            Err(e) if !reconnect || self.mds.conn.is_alive() => Err(Fail::Fs(e)),
            Err(e) => {
                warn!("lost the MDS at {} ({e}); reconnecting", self.mds_addr());
                self.reconnect()?;
                Err(Fail::Reconnected)
            }
        }
    }

    /// Posts `count` operations through `post` (given the I/O region and a wr_id whose
    /// low bits are the operation's index) and waits for all of them.
    pub(crate) fn one_sided(
        &mut self,
        conn: &orion_fabric::Connection,
        mut post: impl FnMut(&Region, u64) -> orion_fabric::Result<()>,
        count: usize,
    ) -> FsResult<()> {
        let mut posted = 0;
        let mut done = 0;
        let mut first_err = None;
        let mut batch = Vec::new();
        let mut other = Vec::new();
        // A data store cut off from the network answers nothing, and the MDS takes it
        // out of the map after `heartbeat_timeout_ms`: a transfer that makes no
        // progress for two map leases gives up on the connection, and the caller asks
        // for the map again and writes to the stores that remain, rather than stall
        // for the whole operation timeout. An MDS silent for two `SILENCE`s is gone
        // or stopped, as for a call (see `await_reply`): the caller reconnects.
        let stall = if conn.id() == self.mds.conn.id() {
            (SILENCE * 2).min(self.timeout)
        } else {
            self.store_patience()
        };
        let mut deadline = Instant::now() + stall;
        while done < count {
            while posted < count && posted - done < WINDOW && first_err.is_none() {
                match post(&self.io, USER_WR_BASE + posted as u64) {
                    Ok(()) => posted += 1,
                    Err(e) => first_err = Some(e),
                }
            }
            if done == posted {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            batch.clear();
            if let Err(e) = self.cq.wait(&mut batch, 64, left) {
                // Operations still in flight would complete into a later batch's
                // accounting and buffer: the connection cannot be used any more.
                conn.close();
                first_err.get_or_insert(e);
                break;
            }
            for c in batch.drain(..) {
                let mine = c.conn == conn.id()
                    && c.wr_id >= USER_WR_BASE
                    && matches!(c.kind, OpKind::Read | OpKind::Write | OpKind::WriteImm);
                if mine {
                    done += 1;
                    deadline = Instant::now() + stall;
                    if let Err(e) = c.status {
                        first_err.get_or_insert(e);
                    }
                } else {
                    other.push(c);
                }
            }
        }
        self.absorb(other);
        match first_err {
            None => Ok(()),
            Some(e) => Err(io_err(format!(
                "one-sided operation to {}: {e}",
                conn.peer()
            ))),
        }
    }
}
