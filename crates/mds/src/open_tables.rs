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
//! client that reconnects (a broken connection) finds its words where it left them;
//! one found empty when its last connection goes leaves the pool's record at once
//! and goes [`SETTLE`] later.
//!
//! A new MDS (a restart, a fail-over) starts with empty tables: each client writes
//! its whole table again when a hello hands it one it has not written, then says so
//! (`MdsRequest::OpenTableWritten`). Which instances have tables is kept in the pool
//! (`orion_format::holders`, written before the hello that made a table is answered,
//! so a mirror has it too), and a new MDS destroys no orphan until every instance
//! named there has written its table again, or until `open_reclaim_ms` passed: a
//! client whose MDS's host vanished silently notices only when a call times out
//! (design note 62).

use orion_meta::FastMap;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use orion_fabric::{Access, ConnId, Domain, Region, RemoteRegion};
use orion_format::{encode_holders, Holders, HoldersRecord, HOLDERS_COPY, HOLDERS_OFFSET};
use orion_format::{MAX_HOLDERS, PAGE_SIZE};
use orion_meta::{FsError, FsResult};
use orion_proto::open_table::{bucket, offset, BYTES, WAYS};
use orion_proto::{MdsRequest, ReplyBody};
use tracing::{info, warn};

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
    /// It held nothing when its last connection went: it leaves the pool's record
    /// then, and goes once a late word could have landed ([`SETTLE`]) if none did.
    empty_when_left: bool,
    /// Its instance as the pool's record names it ([`holder_tag`]).
    tag: u64,
}

/// How long after a table's last connection went a one-sided write posted before
/// may still land in it (the local fabric checks the connection, then copies).
const SETTLE: Duration = Duration::from_millis(100);

/// What the pool's record keeps of an instance: a digest, not the number, since
/// every client may read page 0, and a hello under a client's number gets its table.
fn holder_tag(instance: u64) -> u64 {
    use sha2::{Digest, Sha256};
    let d = Sha256::new()
        .chain_update(b"orion open-table holder\0")
        .chain_update(instance.to_le_bytes())
        .finalize();
    let mut tag = [0u8; 8];
    tag.copy_from_slice(&d[..8]);
    u64::from_le_bytes(tag)
}

impl Table {
    /// Whether a word of `ino`'s bucket, or the overflow, names it.
    fn holds(&self, ino: u64) -> bool {
        self.overflow.contains(&ino)
            || (0..WAYS).any(|w| self.region.load_u64(offset(bucket(ino), w)).ok() == Some(ino))
    }

    fn holds_nothing(&self) -> bool {
        let word = |i: u64| self.region.load_u64(8 * i).unwrap_or(1);
        self.overflow.is_empty() && (0..BYTES / 8).all(|i| word(i) == 0)
    }

    /// Its last connection went at `now`; true if that takes it out of the record
    /// (it holds nothing).
    fn leave(&mut self, now: Instant) -> bool {
        debug_assert!(self.conns.is_empty(), "a table left with connections");
        self.left_at = Some(now);
        self.empty_when_left = self.holds_nothing();
        self.empty_when_left
    }

    /// Whether the pool's record names its instance.
    fn recorded(&self) -> bool {
        self.left_at.is_none() || !self.empty_when_left
    }
}

pub(crate) struct OpenTables {
    tables: FastMap<u64, Table>,
    /// Unlinked inodes (link count 0) that some table may still hold, with when to
    /// look at each next and the wait after that.
    orphans: BTreeMap<u64, (Instant, Duration)>,
    /// Orphans made since the last sweep (swept at once, not after [`RESWEEP`]).
    fresh: bool,
    next_sweep: Instant,
    /// How long a table outlives its instance's connections.
    grace: Duration,
    /// When this MDS started (its reclaim time counts from it).
    started: Instant,
    /// Instances the pool's record names ([`holder_tag`]s) whose tables have not
    /// been written again since this MDS started: no orphan goes while one is
    /// missing, until `reclaim` after the start.
    awaiting: HashSet<u64>,
    /// The record did not say who held tables: no orphan goes before `reclaim`.
    unknown: bool,
    reclaim: Duration,
    /// The pool's record: what it says, and where the next write goes.
    record: HoldersRecord,
    /// The tables or the awaited instances changed since the record was written.
    holders_changed: bool,
}

impl OpenTables {
    /// The tables of an MDS that starts at `now` on `pool`.
    pub fn starting(cfg: &MdsConfig, pool: &orion_pmem::Pool, now: Instant) -> OpenTables {
        let reclaim = Duration::from_millis(cfg.open_reclaim_ms);
        OpenTables::new(open_grace(cfg), reclaim, read_holders(pool), now)
    }

    /// The tables of an MDS that started at `now` and found `record` in its pool.
    pub fn new(grace: Duration, reclaim: Duration, record: HoldersRecord, now: Instant) -> Self {
        let (awaiting, unknown) = match &record.holders {
            Holders::Known(v) => (v.iter().copied().collect::<HashSet<u64>>(), false),
            Holders::Unknown => (HashSet::new(), true),
        };
        if unknown {
            warn!(
                "which clients held files open is not known: no unlinked file goes for {reclaim:?}"
            );
        } else if !awaiting.is_empty() {
            info!(
                "{} clients held open tables: unlinked files wait up to {reclaim:?} for them",
                awaiting.len()
            );
        }
        OpenTables {
            awaiting,
            unknown,
            reclaim,
            record,
            holders_changed: false,
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
                empty_when_left: false,
                tag: holder_tag(instance),
            });
            self.holders_changed = true;
        }
        // A connection that spoke for another instance (a hello under a new one on
        // it) no longer does: for that instance it is a departure, or its table would
        // never be swept and would stay in the record of holders.
        let now = Instant::now();
        for (&i, t) in self.tables.iter_mut() {
            if t.conns.remove(&conn) && i != instance && t.conns.is_empty() {
                self.holders_changed |= t.leave(now);
            }
        }
        let t = self.tables.get_mut(&instance).expect("made above");
        t.conns.insert(conn);
        // Back in the record if it had left it.
        self.holders_changed |= !t.recorded();
        t.left_at = None;
        let remote = t.region.remote();
        // Taken out of every other table above: its departure ends one instance's use.
        debug_assert_eq!(
            self.tables
                .values()
                .filter(|t| t.conns.contains(&conn))
                .count(),
            1,
            "a connection writes the table of one instance"
        );
        Ok(remote)
    }

    /// A connection went: its instance's table stays for the grace period, or, if
    /// it holds nothing, leaves the record at once and goes after [`SETTLE`].
    pub fn departed(&mut self, conn: ConnId, now: Instant) {
        for t in self.tables.values_mut() {
            if t.conns.remove(&conn) && t.conns.is_empty() {
                self.holders_changed |= t.leave(now);
            }
        }
    }

    /// `instance` wrote its whole table to this MDS: it is no longer awaited.
    fn written(&mut self, instance: u64) {
        if self.awaiting.remove(&holder_tag(instance)) && self.awaiting.is_empty() && !self.unknown
        {
            info!("every client that held open tables wrote them again");
        }
    }

    /// Who holds tables, as the pool's record should say it now: those this MDS
    /// has and those it awaits, or Unknown while it must wait out its reclaim time.
    fn holders(&self) -> Holders {
        let tables = self.tables.iter().filter(|(_, t)| t.recorded());
        let mut v: Vec<u64> = tables.map(|(_, t)| t.tag).collect();
        v.extend(&self.awaiting);
        v.sort_unstable();
        v.dedup();
        if self.unknown || v.len() > MAX_HOLDERS {
            return Holders::Unknown;
        }
        Holders::Known(v)
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

    /// Whether the table of `instance` holds `ino` open (its word is written before
    /// the client's open returns, so before anything of the open file is mapped).
    pub(crate) fn holds(&self, instance: u64, ino: u64) -> bool {
        self.tables.get(&instance).is_some_and(|t| t.holds(ino))
    }

    /// Whether any table holds `ino`. Called only after the link count 0 was stored,
    /// and a fence (see [`OpenTables::sweep`]).
    fn held(&self, ino: u64) -> bool {
        self.tables.values().any(|t| t.holds(ino))
    }

    /// The orphans no table holds any more (taken out of the set), if a sweep is due.
    fn sweep(&mut self, now: Instant) -> Vec<u64> {
        // Not at every turn of the loop: every RESWEEP, or at once for new orphans.
        if !self.fresh && now < self.next_sweep {
            return Vec::new();
        }
        self.next_sweep = now + RESWEEP;
        // Orphans made now are looked at below, or at the next sweep if none may go
        // yet (not at every turn meanwhile).
        self.fresh = false;
        let grace = self.grace;
        let mut changed = false;
        self.tables.retain(|_, t| {
            let Some(at) = t.left_at else {
                return true;
            };
            // Set only when its last connection went, and cleared by the next one
            // (`table_of`): a table dropped below has nobody writing it.
            debug_assert!(
                t.conns.is_empty(),
                "a table left by its last connection has one"
            );
            if t.empty_when_left && now >= at + SETTLE {
                if t.holds_nothing() {
                    return false;
                }
                // A word landed late: back in the record, for the grace period.
                t.empty_when_left = false;
                changed = true;
            }
            if now >= at + grace {
                changed |= t.recorded();
                return false;
            }
            true
        });
        self.holders_changed |= changed;
        if (self.unknown || !self.awaiting.is_empty()) && now >= self.started + self.reclaim {
            if !self.awaiting.is_empty() {
                warn!(
                    "{} clients that held open tables did not come back in {:?}: \
                     unlinked files they held may go",
                    self.awaiting.len(),
                    self.reclaim
                );
            }
            self.awaiting.clear();
            self.unknown = false;
            self.holders_changed = true;
        }
        // No fixed wait after the start: whoever may hold a file open is in the
        // record (design note 69).
        let waiting = self.unknown || !self.awaiting.is_empty();
        if self.orphans.is_empty() || waiting {
            return Vec::new();
        }
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

/// Reads the pool's record of who held open tables (page 0 past the superblock).
fn read_holders(pool: &orion_pmem::Pool) -> HoldersRecord {
    let len = 2 * HOLDERS_COPY;
    match pool.read_vec(HOLDERS_OFFSET, len) {
        Ok(b) => orion_format::decode_holders(&b),
        Err(e) => {
            warn!("reading the record of open tables: {e}");
            orion_format::decode_holders(&[])
        }
    }
}

/// How long a table outlives its client's connections (a reconnection takes less):
/// `open_grace_ms`, by default the longer of the primary's lease and the cache lease.
fn open_grace(cfg: &MdsConfig) -> Duration {
    Duration::from_millis(match cfg.open_grace_ms {
        0 => cfg.lease_ms.max(cfg.cache_lease_ms),
        ms => ms,
    })
}

impl Mds {
    /// `MdsRequest::HoldOpen` from a client whose bucket was full, and
    /// `MdsRequest::OpenTableWritten` from one that wrote its whole table.
    pub(crate) fn open_table_request(
        &mut self,
        conn: ConnId,
        r: MdsRequest,
    ) -> FsResult<ReplyBody> {
        let instance = (self.peers.get(&conn).and_then(|p| p.instance()))
            .ok_or_else(|| FsError::Io("open table request: not a client".into()))?;
        match r {
            MdsRequest::HoldOpen { ino, hold } => {
                self.open_tables.hold_open(instance, ino, hold)?
            }
            _ => self.open_tables.written(instance),
        }
        Ok(ReplyBody::Empty)
    }

    /// Writes the pool's record of who holds open tables if it changed: before a
    /// hello that made a table is answered, and at the turns that dropped one.
    pub(crate) fn record_holders(&mut self) -> FsResult<()> {
        let t = &mut self.open_tables;
        if !t.holders_changed {
            return Ok(());
        }
        let holders = t.holders();
        if holders != t.record.holders {
            let at = HOLDERS_OFFSET + (t.record.next_copy * HOLDERS_COPY) as u64;
            debug_assert!(at + HOLDERS_COPY as u64 <= PAGE_SIZE);
            let bytes = encode_holders(t.record.next_seq, &holders);
            // A copy longer than its slot would run over the other copy.
            assert_eq!(
                bytes.len(),
                HOLDERS_COPY,
                "a record copy fills its slot exactly"
            );
            let pool = self.engine.pool();
            (pool
                .write(at, &bytes)
                .and_then(|()| pool.persist(at, bytes.len())))
            .map_err(|e| FsError::Io(format!("recording open tables: {e}")))?;
            t.record = HoldersRecord {
                holders,
                next_copy: 1 - t.record.next_copy,
                next_seq: t.record.next_seq.wrapping_add(1),
            };
        }
        t.holders_changed = false;
        Ok(())
    }

    /// Destroys the orphans nobody holds open any more (each turn).
    pub(crate) fn orphans_turn(&mut self, now: Instant) {
        let free = self.open_tables.sweep(now);
        if let Err(e) = self.record_holders() {
            warn!("{e} (tried again at the next turn)");
        }
        if free.is_empty() {
            return;
        }
        for ino in free {
            if let Err(e) = self.engine.release_orphan(ino) {
                warn!("destroying unlinked inode {ino}: {e}");
            }
        }
        self.release_freed();
        self.changes_of_no_request();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_millis(100);
    const RECLAIM: Duration = Duration::from_secs(40);

    fn starting(holders: Holders, t0: Instant) -> OpenTables {
        let record = HoldersRecord {
            holders,
            next_copy: 0,
            next_seq: 1,
        };
        OpenTables::new(GRACE, RECLAIM, record, t0)
    }

    /// A new MDS destroys no orphan until each instance its pool names as a holder
    /// wrote its table again, or until its reclaim time passed for those that did
    /// not come.
    #[test]
    fn orphans_wait_for_the_recorded_holders_or_the_reclaim_time() {
        let t0 = Instant::now();
        let (t7, t9) = (holder_tag(7), holder_tag(9));
        let mut t = starting(Holders::Known(vec![t7, t9]), t0);
        t.orphaned(100);
        assert!(t.sweep(t0 + GRACE * 2).is_empty(), "7 and 9 are awaited");
        t.written(7);
        t.fresh = true;
        assert!(t.sweep(t0 + GRACE * 3).is_empty(), "9 is still awaited");
        t.written(9);
        t.fresh = true;
        assert_eq!(t.sweep(t0 + GRACE * 4), vec![100], "nobody holds it");
        assert_eq!(t.holders(), Holders::Known(vec![]));

        let mut t = starting(Holders::Known(vec![t7]), t0);
        t.orphaned(100);
        assert!(t.sweep(t0 + RECLAIM - GRACE).is_empty());
        assert_eq!(t.holders(), Holders::Known(vec![t7]), "kept while awaited");
        t.fresh = true;
        assert_eq!(t.sweep(t0 + RECLAIM), vec![100], "7 never came");
        assert!(t.holders_changed);
        assert_eq!(
            t.holders(),
            Holders::Known(vec![]),
            "and is not awaited again"
        );
    }

    /// An unreadable record waits out the reclaim time, and is recorded as unknown
    /// until then (a crash meanwhile must not make the next MDS trust a partial set).
    #[test]
    fn an_unknown_record_waits_the_whole_reclaim_time() {
        let t0 = Instant::now();
        let mut t = starting(Holders::Unknown, t0);
        t.orphaned(5);
        t.written(1);
        assert!(t.sweep(t0 + RECLAIM / 2).is_empty());
        assert_eq!(t.holders(), Holders::Unknown);
        t.fresh = true;
        assert_eq!(t.sweep(t0 + RECLAIM), vec![5]);
        assert_eq!(t.holders(), Holders::Known(vec![]));
    }

    /// A table that holds nothing when its last connection goes leaves the record at
    /// once, comes back if a late word landed, and one that holds a file stays in
    /// it until its grace is over.
    #[test]
    fn departed_tables_leave_the_record_when_they_hold_nothing() {
        use orion_fabric::{mock::MockNet, Backend, FabricConfig, Secret};
        let cfg = FabricConfig::new(Backend::Mock(MockNet::new(1)), Secret::generate());
        let domain = Domain::open(cfg).unwrap();
        let t0 = Instant::now();
        let grace = Duration::from_secs(1);
        let mut t = OpenTables::new(
            grace,
            RECLAIM,
            starting(Holders::Known(vec![]), t0).record,
            t0,
        );
        let (a, b) = (
            t.table_of(&domain, 1, 10).unwrap(),
            t.table_of(&domain, 2, 20),
        );
        assert!(b.is_ok() && a.len >= BYTES);
        let word_of =
            |t: &OpenTables, i: u64| t.tables[&i].region.store_u64(offset(bucket(5), 0), 5);
        word_of(&t, 2).unwrap();
        let mut v = vec![holder_tag(1), holder_tag(2)];
        v.sort_unstable();
        let both = Holders::Known(v);
        assert_eq!(t.holders(), both);
        t.departed(10, t0);
        t.departed(20, t0);
        assert_eq!(
            t.holders(),
            Holders::Known(vec![holder_tag(2)]),
            "1 held nothing"
        );
        // A word of 1's lands late: 1 is back in the record after SETTLE.
        word_of(&t, 1).unwrap();
        t.fresh = true;
        t.sweep(t0 + SETTLE);
        assert_eq!(t.holders(), both);
        // Both go with their grace.
        t.fresh = true;
        t.sweep(t0 + grace);
        assert!(t.tables.is_empty());
        assert_eq!(t.holders(), Holders::Known(vec![]));
        // One that stays empty goes after SETTLE.
        t.table_of(&domain, 3, 30).unwrap();
        t.departed(30, t0 + grace);
        t.fresh = true;
        t.sweep(t0 + grace + SETTLE);
        assert!(t.tables.is_empty());
        // A hello under another instance on a connection ends the first instance's
        // use of it as a departure would: out of the record, then swept.
        t.table_of(&domain, 4, 40).unwrap();
        t.table_of(&domain, 5, 40).unwrap();
        assert_eq!(t.holders(), Holders::Known(vec![holder_tag(5)]));
        let later = Instant::now() + SETTLE;
        t.fresh = true;
        t.sweep(later);
        assert!(!t.tables.contains_key(&4) && t.tables.contains_key(&5));
    }

    /// A blank record (a new pool, or one whose clients all left holding nothing)
    /// awaits nobody: an orphan goes at the first sweep.
    #[test]
    fn a_blank_record_waits_for_nobody() {
        let t0 = Instant::now();
        let mut t = starting(Holders::Known(vec![]), t0);
        t.orphaned(5);
        assert_eq!(t.sweep(t0), vec![5]);
    }
}
