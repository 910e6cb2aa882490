//! The client's open table (design note 58; the MDS's side is
//! `orion_mds::open_tables`): the inodes this client holds open, written one-sided
//! into the table the MDS keeps for it, so that no other client's unlink destroys a
//! file this one still uses.
//!
//! The table is the client's (all lanes share it, as they share open files); this
//! copy is what the MDS's should hold. Every write to the MDS's table is made under
//! the lock, so that none lands out of order: a word freed by a close and taken by
//! an open is never cleared after it was set. On the local fabric a write is a
//! memory copy; elsewhere it is one one-sided write per first open and last close.
//!
//! Nothing under the lock reconnects ([`Remote::with_table`]): a reconnection waits
//! up to `reconnect_ms` for an MDS, and every other thread's open and close would
//! wait behind it, one reconnection after another, when the cluster is gone.

use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

use orion_fabric::RemoteRegion;
use orion_proto::open_table::{bucket, offset, BUCKETS, BYTES, WAYS};
use orion_proto::MdsRequest;

use tracing::warn;

use super::{io_err, Fail, Remote, Res};

/// Where an inode's word is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    Way(usize),
    /// Its bucket was full: the MDS keeps it by request.
    Overflow,
}

struct Held {
    /// Open descriptors of the inode in this client.
    count: u64,
    place: Place,
}

pub(crate) struct State {
    /// What the MDS's table should hold.
    words: Vec<[u64; WAYS]>,
    held: HashMap<u64, Held>,
    /// The MDS table that holds `words` (None: not written whole yet, or a write
    /// failed since). Another table is another MDS's, whose overflow set is empty.
    written: Option<RemoteRegion>,
    /// Inodes of the overflow set whose release failed: asked again.
    unheld: Vec<u64>,
    /// Some hello has handed this instance a table (see [`Remote::keep_table_written`]).
    told: bool,
}

pub(crate) struct OpenTable {
    state: Mutex<State>,
    /// Hellos this instance has sent, answered or not (outside the lock: a hello
    /// must not wait for a lane that holds the table through a call).
    hellos: AtomicU64,
}

impl Default for OpenTable {
    fn default() -> OpenTable {
        OpenTable {
            state: Mutex::new(State {
                words: vec![[0; WAYS]; BUCKETS as usize],
                held: HashMap::new(),
                written: None,
                unheld: Vec::new(),
                told: false,
            }),
            hellos: AtomicU64::new(0),
        }
    }
}

impl OpenTable {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A hello of this instance is about to go (any lane's, a reconnection's).
    pub(crate) fn hello_sent(&self) {
        self.hellos.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether the MDS's table needs the keeper's look (`fs::keeper`): this client
    /// holds files open, or the MDS's table may still name one it closed.
    pub fn needs_keeping(&self) -> bool {
        let st = self.lock();
        !st.held.is_empty() || st.written.is_none() || !st.unheld.is_empty()
    }

    /// A descriptor of `ino` closed. The last one frees its word here, and returns
    /// where it was: the caller then clears it in the MDS's table
    /// ([`Remote::clear_open`]).
    pub fn release(&self, ino: u64) -> Option<Place> {
        let mut st = self.lock();
        let Some(h) = st.held.get_mut(&ino) else {
            debug_assert!(false, "inode {ino} closed more often than opened");
            return None;
        };
        // A held inode is counted from its first open and forgotten at its last close.
        debug_assert!(h.count > 0, "inode {ino} held with no descriptor");
        h.count -= 1;
        if h.count > 0 {
            return None;
        }
        let place = h.place;
        st.held.remove(&ino);
        if let Place::Way(w) = place {
            st.words[bucket(ino) as usize][w] = 0;
        }
        Some(place)
    }
}

impl Remote {
    /// Counts a descriptor of `ino` in the open table; the first one is in the MDS's
    /// table when this returns. Returns whether it was the first: the caller must then
    /// read the inode, and give the open up ([`OpenTable::release`],
    /// [`Remote::clear_open`]) if its link count is 0 (the unlink came first). That order is the client's half of the
    /// pairing described in `orion_mds::open_tables`.
    pub(crate) fn hold_open(&mut self, ino: u64) -> Res<bool> {
        self.with_table(|remote, st| {
            remote.keep_table_written(st)?;
            if let Some(h) = st.held.get_mut(&ino) {
                h.count += 1;
                return Ok(false);
            }
            let b = bucket(ino) as usize;
            let place = match st.words[b].iter().position(|w| *w == 0) {
                Some(w) => Place::Way(w),
                None => Place::Overflow,
            };
            if let Err(e) = remote.write_place(ino, place, true) {
                match place {
                    // The word may have landed: the next whole write makes it right.
                    Place::Way(_) => st.written = None,
                    // The hold may have landed: it is released, unless held by then.
                    Place::Overflow => st.unheld.push(ino),
                }
                return Err(e);
            }
            if let Place::Way(w) = place {
                st.words[b][w] = ino;
            }
            st.held.insert(ino, Held { count: 1, place });
            // The word's store is ordered before the caller's loads of the inode.
            fence(Ordering::SeqCst);
            Ok(true)
        })
    }

    /// Releases one hold of `ino` taken by [`Remote::hold_open`] in this same call,
    /// and clears its word if that was the last.
    pub(crate) fn unhold_open(&mut self, ino: u64) -> Res<()> {
        match self.opens.release(ino) {
            Some(place) => self.clear_open(ino, place),
            None => Ok(()),
        }
    }

    /// Clears the word of `ino` that [`OpenTable::release`] freed, unless an open has
    /// taken its place since (that open wrote its own word, after this one's release,
    /// under the lock). Run again after a reconnection (its error), it writes the
    /// whole table to the new MDS. Other failures, a reconnection that found no MDS
    /// among them, leave the word to the next whole write of the table: the close
    /// itself has nothing more to wait for.
    pub(crate) fn clear_open(&mut self, ino: u64, place: Place) -> Res<()> {
        let cleared = self.with_table(|remote, st| {
            let taken = match place {
                Place::Way(w) => st.words[bucket(ino) as usize][w] != 0,
                Place::Overflow => st
                    .held
                    .get(&ino)
                    .is_some_and(|h| h.place == Place::Overflow),
            };
            let written = remote.keep_table_written(st).and_then(|()| {
                if taken {
                    Ok(())
                } else {
                    remote.write_place(ino, place, false)
                }
            });
            if written.is_err() {
                match place {
                    Place::Overflow => st.unheld.push(ino),
                    Place::Way(_) => st.written = None,
                }
            }
            written
        });
        match cleared {
            Err(Fail::Reconnected) => Err(Fail::Reconnected),
            _ => Ok(()),
        }
    }

    /// Writes the table whole if the MDS's is not the one written (the keeper's
    /// look, `fs::keeper`).
    pub(crate) fn keep_open_table(&mut self) -> Res<()> {
        self.with_table(|remote, st| remote.keep_table_written(st))
    }

    /// Runs `f` on the table, locked. What runs under the lock never reconnects
    /// (an MDS operation in it gives up within two `SILENCE`s of silence, or at the
    /// call timeout if the MDS answers pings but not the call); a broken MDS
    /// connection is re-established after the lock is released, and the caller's
    /// operation runs again ([`Fail::Reconnected`]).
    fn with_table<T>(&mut self, f: impl FnOnce(&mut Remote, &mut State) -> Res<T>) -> Res<T> {
        let opens = self.opens.clone();
        let r = f(self, &mut opens.lock());
        match r {
            Err(Fail::Fs(e)) if !self.mds.conn.is_alive() => {
                warn!("lost the MDS at {} ({e}); reconnecting", self.mds_addr());
                self.reconnect()?;
                Err(Fail::Reconnected)
            }
            r => r,
        }
    }

    /// After a hello: a new MDS's table gets this client's words now, unless a call
    /// of this client holds the table; then that call or the next (each checks),
    /// or the keeper within its period, writes them.
    pub(super) fn write_table_after_hello(&mut self) {
        let opens = self.opens.clone();
        let mut st = match opens.state.try_lock() {
            Ok(st) => st,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        if self.keep_table_written(&mut st).is_err() {
            st.written = None;
        }
    }

    /// Writes the whole table into the MDS's if that is not the one written (a new
    /// MDS after a restart or a fail-over, whose region differs, or a write that
    /// failed), with the overflow set; asks again for the releases that failed.
    /// Never reconnects (see [`Remote::with_table`]).
    fn keep_table_written(&mut self, st: &mut State) -> Res<()> {
        let table = self.open_table;
        if st.written == Some(table) {
            return self.release_unheld(st);
        }
        st.written = None;
        if table.len < BYTES {
            return Err(Fail::Fs(io_err("the MDS's open table is too small")));
        }
        // The answer to the only hello this instance ever sent: the MDS made its
        // table at that hello, zeroed, and awaits nothing of an instance its pool
        // never named; with nothing open yet, there is nothing to write or say. (A
        // short process of the preload library saves a one-sided write and a round
        // trip at start.) After a hello whose answer was lost, the next MDS may have
        // found this instance in its predecessor's record: it is told as usual.
        let first =
            !std::mem::replace(&mut st.told, true) && self.opens.hellos.load(Ordering::SeqCst) == 1;
        if first && st.held.is_empty() && st.unheld.is_empty() {
            st.written = Some(table);
            return Ok(());
        }
        let bytes: Vec<u8> = st
            .words
            .iter()
            .flatten()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        self.io.write(0, &bytes).map_err(io_err)?;
        let len = bytes.len();
        self.mds_one_sided(false, |c, io, wr| c.post_write(wr, io, 0, &table, 0, len))?;
        // Adding is enough: a table of the same MDS has no stale entries but those in
        // `unheld`, and another MDS's overflow set starts empty.
        for (&ino, h) in &st.held {
            if h.place == Place::Overflow {
                self.call_once(&MdsRequest::HoldOpen { ino, hold: true })?;
            }
        }
        self.release_unheld(st)?;
        // A new MDS destroys no unlinked file until the clients its pool names as
        // holders have said this (`orion_mds::open_tables`).
        self.call_once(&MdsRequest::OpenTableWritten)?;
        st.written = Some(table);
        Ok(())
    }

    /// Asks again for the releases from the overflow set that failed, but of the
    /// inodes held there again since; one that fails stays, with those after it.
    fn release_unheld(&mut self, st: &mut State) -> Res<()> {
        while let Some(&ino) = st.unheld.last() {
            let again = (st.held.get(&ino)).is_some_and(|h| h.place == Place::Overflow);
            if !again {
                self.call_once(&MdsRequest::HoldOpen { ino, hold: false })?;
            }
            st.unheld.pop();
        }
        Ok(())
    }

    fn write_place(&mut self, ino: u64, place: Place, hold: bool) -> Res<()> {
        match place {
            Place::Way(w) => {
                let word = if hold { ino } else { 0 };
                self.io.write(0, &word.to_le_bytes()).map_err(io_err)?;
                let (table, at) = (self.open_table, offset(bucket(ino), w));
                self.mds_one_sided(false, |c, io, wr| c.post_write(wr, io, 0, &table, at, 8))
            }
            // The overflow is a set: asking twice after a break is harmless.
            Place::Overflow => (self.call_once(&MdsRequest::HoldOpen { ino, hold }))
                .map(|_| ())
                .map_err(Fail::Fs),
        }
    }
}
