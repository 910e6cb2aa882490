//! Open tables (design note 58): which inodes each client holds open, so that an
//! unlink by one client does not destroy a file another still reads and writes
//! (POSIX: an open file outlives its last name, for every process that holds it).
//!
//! Each client instance gets a table in the MDS's memory (`orion_proto::open_table`),
//! which its connections write one-sided: a word per inode it holds open, written
//! before it reads the inode at open and cleared at its last close. The MDS's CPU
//! takes no part in an open or a close. A file too many of whose bucket-mates are
//! open goes in the table's overflow, by request (`MdsRequest::HoldOpen`).
//!
//! Every unlink or rename that takes a file's last link keeps the inode with a link
//! count of 0: an *orphan*. Once the MDS has committed that, it reads the buckets of
//! every table, and destroys the orphan if no word names it; otherwise it looks again
//! at later turns, until the last holder closed it. The order makes the race with an
//! open safe, as in Dekker's mutual exclusion: the client stores its word, then
//! loads the inode; the MDS stores the link count 0, then loads the words (each with
//! a full fence between, and a one-sided write complete only once delivered). Either
//! the MDS sees the word and keeps the inode, or the client sees the link count 0 and
//! gives up its open (ENOENT: the unlink came first).
//!
//! A table outlives its instance's last connection by [`OpenTables::grace`], so a
//! client that reconnects (a broken connection) finds its words where it left them.
//! A new MDS (a restart, a fail-over) starts with empty tables: each client writes
//! its whole table again when a hello hands it one it has not written, and no orphan
//! is destroyed in the MDS's first grace period.

use orion_meta::FastMap;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use orion_fabric::{Access, ConnId, Domain, Region, RemoteRegion};
use orion_meta::{FsError, FsResult};
use orion_proto::open_table::{bucket, offset, BYTES, WAYS};
use orion_proto::ReplyBody;
use tracing::warn;

use crate::server::Mds;
use crate::MdsConfig;

/// How often the MDS looks for orphans due for another look.
const RESWEEP: Duration = Duration::from_millis(10);
/// The longest an orphan still held waits for its next look: the wait doubles from
/// [`RESWEEP`] at each look that finds it held, so a client holding many unlinked
/// files costs the MDS few loads, and a file held long goes within a second of its
/// last close.
const MAX_RECHECK: Duration = Duration::from_secs(1);
/// Most inodes one instance may hold in its overflow.
const MAX_OVERFLOW: usize = 1 << 20;

struct Table {
    region: Region,
    conns: HashSet<ConnId>,
    overflow: HashSet<u64>,
    /// When its last connection went (None while one is open).
    left_at: Option<Instant>,
}

pub(crate) struct OpenTables {
    tables: FastMap<u64, Table>,
    /// Unlinked inodes (link count 0) that some table may still hold, with when to
    /// look at each next and the wait after that.
    orphans: BTreeMap<u64, (Instant, Duration)>,
    /// Orphans made since the last sweep (swept at once, not after [`RESWEEP`]).
    fresh: bool,
    next_sweep: Instant,
    /// How long a table outlives its instance's connections, and how long after its
    /// start the MDS destroys no orphan.
    grace: Duration,
    started: Instant,
}

impl OpenTables {
    pub fn new(grace: Duration, now: Instant) -> OpenTables {
        OpenTables {
            tables: FastMap::default(),
            orphans: BTreeMap::new(),
            fresh: false,
            next_sweep: now,
            grace,
            started: now,
        }
    }

    /// The table of `instance` (made on its first hello), now used by `conn` too.
    pub fn table_of(
        &mut self,
        domain: &Domain,
        instance: u64,
        conn: ConnId,
    ) -> FsResult<RemoteRegion> {
        if let Entry::Vacant(v) = self.tables.entry(instance) {
            let region = domain
                .alloc_region(BYTES as usize, Access::REMOTE_WRITE)
                .map_err(|e| FsError::Io(format!("making a client's open table: {e}")))?;
            v.insert(Table {
                region,
                conns: HashSet::new(),
                overflow: HashSet::new(),
                left_at: None,
            });
        }
        for t in self.tables.values_mut() {
            t.conns.remove(&conn);
        }
        let t = self.tables.get_mut(&instance).expect("made above");
        t.conns.insert(conn);
        t.left_at = None;
        Ok(t.region.remote())
    }

    /// A connection went: its instance's table stays for the grace period.
    pub fn departed(&mut self, conn: ConnId, now: Instant) {
        for t in self.tables.values_mut() {
            if t.conns.remove(&conn) && t.conns.is_empty() {
                t.left_at = Some(now);
            }
        }
    }

    fn hold_open(&mut self, instance: u64, ino: u64, hold: bool) -> FsResult<()> {
        let t = self
            .tables
            .get_mut(&instance)
            .ok_or_else(|| FsError::Io("no open table for this client".into()))?;
        if !hold {
            t.overflow.remove(&ino);
        } else if t.overflow.len() >= MAX_OVERFLOW {
            return Err(FsError::Errno(libc::EMFILE));
        } else {
            t.overflow.insert(ino);
        }
        Ok(())
    }

    /// `ino` lost its last link and was kept: destroyed once no table holds it.
    pub fn orphaned(&mut self, ino: u64) {
        self.orphans.insert(ino, (self.started, RESWEEP));
        self.fresh = true;
    }

    /// Unlinked files waiting for their holders.
    pub fn orphan_count(&self) -> usize {
        self.orphans.len()
    }

    /// Whether any table holds `ino`. Called only after the link count 0 was stored,
    /// and a fence (see [`OpenTables::sweep`]).
    fn held(&self, ino: u64) -> bool {
        let b = bucket(ino);
        self.tables.values().any(|t| {
            t.overflow.contains(&ino)
                || (0..WAYS).any(|w| t.region.load_u64(offset(b, w)).ok() == Some(ino))
        })
    }

    /// The orphans no table holds any more (taken out of the set), if a sweep is due.
    fn sweep(&mut self, now: Instant) -> Vec<u64> {
        // Not at every turn of the loop: every RESWEEP, or at once for new orphans.
        if !self.fresh && now < self.next_sweep {
            return Vec::new();
        }
        self.next_sweep = now + RESWEEP;
        let grace = self.grace;
        self.tables
            .retain(|_, t| t.left_at.is_none_or(|at| now < at + grace));
        if self.orphans.is_empty() || now < self.started + grace {
            return Vec::new();
        }
        self.fresh = false;
        // The MDS's half of the pairing: its stores of the link counts are ordered
        // before the loads of the words (the client's half is in `orion_client`'s
        // open).
        fence(Ordering::SeqCst);
        let due: Vec<u64> = (self.orphans.iter())
            .filter(|(_, (at, _))| *at <= now)
            .map(|(&ino, _)| ino)
            .collect();
        let mut free = Vec::new();
        for ino in due {
            if !self.held(ino) {
                self.orphans.remove(&ino);
                free.push(ino);
            } else if let Some((at, wait)) = self.orphans.get_mut(&ino) {
                *at = now + *wait;
                *wait = (*wait * 2).min(MAX_RECHECK);
            }
        }
        free
    }
}

/// How long a table outlives its client's connections (a reconnection takes less):
/// `open_grace_ms`, by default the longer of the primary's lease and the cache lease.
pub(crate) fn open_grace(cfg: &MdsConfig) -> Duration {
    Duration::from_millis(match cfg.open_grace_ms {
        0 => cfg.lease_ms.max(cfg.cache_lease_ms),
        ms => ms,
    })
}

impl Mds {
    /// `MdsRequest::HoldOpen` from a client whose bucket was full.
    pub(crate) fn hold_open(&mut self, conn: ConnId, ino: u64, hold: bool) -> FsResult<ReplyBody> {
        let instance = self
            .peers
            .get(&conn)
            .and_then(|p| p.instance())
            .ok_or_else(|| FsError::Io("hold open: not a client".into()))?;
        self.open_tables.hold_open(instance, ino, hold)?;
        Ok(ReplyBody::Empty)
    }

    /// Destroys the orphans nobody holds open any more (each turn).
    pub(crate) fn orphans_turn(&mut self, now: Instant) {
        let free = self.open_tables.sweep(now);
        if free.is_empty() {
            return;
        }
        for ino in free {
            if let Err(e) = self.engine.release_orphan(ino) {
                warn!("destroying unlinked inode {ino}: {e}");
            }
        }
        self.changes_of_no_request();
    }
}
