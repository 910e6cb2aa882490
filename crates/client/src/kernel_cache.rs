//! The client's side of the MDS's callbacks (design note 56; the MDS's side is
//! `orion_mds::callbacks`): what lets a front-end with a kernel cache (the FUSE
//! mount) let the kernel keep names and attributes, and stay as coherent as a mount
//! that caches nothing.
//!
//! A thread of its own keeps a callback connection to the MDS: it holds the cache
//! lease there (renewed every third of its length while used), and answers each invalidation
//! once the front-end's `invalidate` has run (the kernel forgot). The front-end asks,
//! before it reads what it will hand the kernel, that the inodes concerned be
//! watched ([`KernelCache::missing`], a `Watch` request for those not yet watched), and
//! hands the kernel nothing that outlives the lease ([`KernelCache::ttl`]). When the
//! callback connection breaks, the lease and every watch are void: the kernel's
//! copies run out with the lease, and the next connection starts afresh.
//!
//! A file's watch also ends with the first callback about it (a `Recall`: the MDS
//! recalls a grant once, and calls this client back about the file again only once
//! it watches it anew). The thread forgets the watch before the kernel's copy is
//! dropped, so the next call that hands the kernel anything of the file asks for a
//! new watch first; and a watch asked before the recall came is not noted after it
//! (the MDS may have ended it when the answer reached it): [`KernelCache::recalled`].
//!
//! The lease is renewed only while it is used (design note 85): a renewal is due every
//! third of the lease, and it is sent if a front-end call asked about watches in the
//! last `KEEP_LEASES` leases, or files are open (the kernel may map their pages and
//! read them without a call), or the kernel keeps files' data. An idle mount lets its
//! lease run out and sends nothing. Its next call finds no lease, asks the callback
//! thread for one and hands the kernel nothing (it does not wait: it holds the gate,
//! and maybe a directory's lock in the kernel, which the thread may need to answer a
//! callback queued before the lease's grant); an open waits for the lease, up to
//! `LEASE_WAIT`, before it asks for the file's watch (it holds neither). The MDS keeps
//! a lapsed instance's watches and calls it back as before, but no change waits for
//! it: its kernel holds nothing any more. A call that read under one lease must not
//! hand its reads over under a lease granted after a lapse (a change acknowledged in
//! the gap may be in what it read), so each lease granted after a lapse starts a new
//! *run*, and [`KernelCache::ttl`] is zero for a [`Watched`] of an earlier run.
//!
//! Watches end when the kernel forgets an inode (FUSE's `forget`, once as many
//! lookups were forgotten as the mount answered), in batches (`Unwatch`). Two
//! locks keep that from dropping a watch the kernel relies on: a call that hands the
//! kernel something holds the *gate* (shared) from before it looks at the watches
//! until its reply is sent and counted, and the batch takes it exclusively to pick
//! the inodes still forgotten; and `Watch` and `Unwatch` requests are made one at a
//! time (`requests`), so the MDS sees them in the client's order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use orion_fabric::{CompletionQueue, Domain};
use orion_proto::channel::Patience;
use orion_proto::{
    decode_reply, is_reply, Event, Hello, Invalidation, MdsRequest, MdsToClient, Message, Reply,
    ReplyBody,
};
use tracing::{debug, warn};

use crate::fs::lock;
use crate::remote::open_mds;
use crate::ClientConfig;

/// What the front-end does with invalidations (it must not call the client).
pub type Invalidate = Box<dyn Fn(&[Invalidation]) + Send + Sync>;

/// The inodes of the files the client holds open: the lease is kept while there are
/// any, and a new callback connection watches them again.
pub(crate) type FilesOpen = Box<dyn Fn() -> Vec<u64> + Send>;

/// Below this much lease left, the kernel is told to cache nothing.
const MIN_TTL: Duration = Duration::from_millis(2);
/// Taken off every lifetime handed to the kernel: it counts in jiffies (up to 10 ms
/// each) from when it got the reply, and rounds up.
const KERNEL_SLACK: Duration = Duration::from_millis(25);
/// Leases a renewal may go unanswered before the connection is given up.
const UNANSWERED_LEASES: u32 = 5;
/// Inodes the kernel forgot that are unwatched in one request.
const UNWATCH_BATCH: usize = 256;
/// A smaller batch goes at the next forget after this long: the MDS calls a client
/// back about an inode number it still watches, even one whose file was deleted
/// and whose number another file took since.
const UNWATCH_AGE: Duration = Duration::from_millis(100);
/// The pause before a callback connection is tried again after a failure.
const RETRY_PAUSE: Duration = Duration::from_millis(20);
/// The longest the callback thread waits without a look at its lease and stop flag
/// (a stop wakes it at once: [`KernelCache::stop`]; the queue's own wait looks at its
/// peers every `DAEMON_PEER_LOOKS` meanwhile).
const LONGEST_WAIT: Duration = Duration::from_secs(1);

/// Leases an unused lease is still renewed for after the last call that asked about
/// watches: a mount used now and then keeps it (its next call would wait a round trip
/// for a new one), an idle one lets it go.
const KEEP_LEASES: u32 = 10;
/// How long an open that finds no lease waits for one (the callback thread asks at
/// once; an MDS that does not answer within this leaves the file watched without a
/// lease until the grant comes).
const LEASE_WAIT: Duration = Duration::from_millis(50);

/// Recalls remembered to tell whether a watch asked for was recalled before it is
/// noted (older ones: any watch asked before them is refused, as if recalled).
const RECALLS_KEPT: usize = 4096;

/// A promise that the inodes asked about were watched in callback session
/// `session` before the caller read them (for a file, until a recall of it: what was
/// read then is dropped from the kernel after the read is handed over).
#[derive(Clone, Copy, Debug)]
pub struct Watched {
    session: u64,
    /// The count of recalls when the watch was asked for.
    recalls: u64,
    /// The stamp of the last note when it was asked for.
    notes: u64,
    /// The lease's run when it was asked for (see the module's text).
    run: u64,
}

/// The inodes watched for this client in the current session, each with the stamp of
/// the note that recorded it: an inode noted after a caller took its [`Watched`] (by
/// another thread, after a recall) was not watched when that caller read it. And the
/// recent recalls, under the same lock.
#[derive(Default)]
struct WatchSet {
    inos: HashMap<u64, u64>,
    stamp: u64,
    recalls: Recalls,
}

/// The recent recalls of files' watches (see the module's text).
#[derive(Default)]
struct Recalls {
    /// Recalls so far.
    count: u64,
    /// The last [`RECALLS_KEPT`]: (the count after it, the inode).
    recent: std::collections::VecDeque<(u64, u64)>,
    /// The count after the newest recall no longer in `recent`.
    forgotten_upto: u64,
}

impl Recalls {
    /// Whether `ino` may have been recalled after `since` (the count then).
    fn since(&self, since: u64, ino: u64) -> bool {
        // The walk below stops at the first recall not after `since`: the recalls
        // kept are the newest, in order, right after those forgotten.
        debug_assert!(
            self.recent
                .front()
                .is_none_or(|&(n, _)| n == self.forgotten_upto + 1)
                && self.recent.back().is_none_or(|&(n, _)| n == self.count),
            "the recalls kept are not the latest ones"
        );
        since < self.forgotten_upto
            || self
                .recent
                .iter()
                .rev()
                .take_while(|(n, _)| *n > since)
                .any(|(_, i)| *i == ino)
    }
}

pub struct KernelCache {
    base: Instant,
    /// The lease's end, in nanoseconds from `base` (0: no lease).
    lease_until: AtomicU64,
    /// Counts callback connections; watches of an earlier one are void.
    session: AtomicU64,
    /// Counts leases granted after the one before had run out (or none was held).
    run: AtomicU64,
    /// When a front-end call last asked about watches, in nanoseconds from `base`
    /// (written at most once a millisecond).
    last_use: AtomicU64,
    /// A call found no lease and waits for one: the callback thread renews at once.
    wanted: AtomicBool,
    /// Whether the callback connection is up (hello answered): only then is a lease
    /// asked for.
    connected: AtomicBool,
    /// The MDS answered the last renewal with no lease (`cache_lease_ms` 0): calls do
    /// not ask again (the thread tries every second).
    no_leases: AtomicBool,
    /// Signalled when a lease is granted or the connection goes.
    lease_granted: (Mutex<()>, std::sync::Condvar),
    watched: Mutex<WatchSet>,
    /// Entries the kernel holds per inode (lookups answered, less those forgotten).
    held: Mutex<HashMap<u64, u64>>,
    /// Inodes the kernel forgot, to unwatch in the next batch, and since when the
    /// first of them waits.
    forgotten: Mutex<(Vec<u64>, Option<Instant>)>,
    gate: RwLock<()>,
    requests: Mutex<()>,
    invalidate: Invalidate,
    /// The kernel keeps files' data pages too: the MDS is asked not to recall file
    /// watches (see `CacheLease`).
    keep_watches: bool,
    stop: AtomicBool,
    /// The completion queue the callback thread sleeps on, for a stop to wake it.
    sleeping_on: Mutex<Option<Arc<CompletionQueue>>>,
}

impl KernelCache {
    pub(crate) fn new(invalidate: Invalidate, keep_watches: bool) -> KernelCache {
        KernelCache {
            base: Instant::now(),
            lease_until: AtomicU64::new(0),
            session: AtomicU64::new(0),
            run: AtomicU64::new(0),
            last_use: AtomicU64::new(0),
            wanted: AtomicBool::new(false),
            connected: AtomicBool::new(false),
            no_leases: AtomicBool::new(false),
            lease_granted: (Mutex::new(()), std::sync::Condvar::new()),
            watched: Mutex::new(WatchSet::default()),
            held: Mutex::new(HashMap::new()),
            forgotten: Mutex::new((Vec::new(), None)),
            gate: RwLock::new(()),
            requests: Mutex::new(()),
            invalidate,
            keep_watches,
            stop: AtomicBool::new(false),
            sleeping_on: Mutex::new(None),
        }
    }

    /// Held by a call that hands the kernel something, from before it looks at the
    /// watches until its reply is counted.
    pub(crate) fn gate(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until no call is between reading what it hands the kernel and handing
    /// it over: an invalidation that came meanwhile then drops what such a call
    /// handed over (a read that began before the change was acknowledged), and a
    /// call that starts later reads the change (the MDS committed it before it
    /// called back). The kernel itself would miss the first case for an inode it
    /// does not hold yet (a lookup's reply that instantiates it).
    fn settle(&self) {
        drop(self.gate.write().unwrap_or_else(|e| e.into_inner()));
    }

    /// Held across a `Watch` or `Unwatch` request.
    pub(crate) fn requests(&self) -> MutexGuard<'_, ()> {
        lock(&self.requests)
    }

    /// The kernel got an entry for `ino` (a lookup it will forget some day).
    pub(crate) fn looked_up(&self, ino: u64) {
        *lock(&self.held).entry(ino).or_insert(0) += 1;
    }

    /// The kernel forgot `n` lookups of `ino`; true when a batch of inodes it forgot
    /// altogether is due for unwatching.
    pub(crate) fn forgot(&self, ino: u64, n: u64) -> bool {
        let mut held = lock(&self.held);
        let Some(c) = held.get_mut(&ino) else {
            return false;
        };
        *c = c.saturating_sub(n);
        if *c > 0 {
            return false;
        }
        held.remove(&ino);
        let mut f = lock(&self.forgotten);
        let since = *f.1.get_or_insert_with(Instant::now);
        f.0.push(ino);
        f.0.len() >= UNWATCH_BATCH || since.elapsed() >= UNWATCH_AGE
    }

    /// Inodes whose `Unwatch` failed: asked again with the next batch.
    pub(crate) fn unwatch_again(&self, inos: Vec<u64>) {
        let mut f = lock(&self.forgotten);
        f.1.get_or_insert_with(Instant::now);
        f.0.extend(inos);
    }

    /// The inodes to unwatch now (the kernel forgot them and looked none up again),
    /// no longer counted as watched, with the request lock held for their `Unwatch`.
    pub(crate) fn take_forgotten(&self) -> (MutexGuard<'_, ()>, Vec<u64>) {
        let _no_reply_under_way = self.gate.write().unwrap_or_else(|e| e.into_inner());
        let requests = self.requests();
        let held = lock(&self.held);
        let mut inos = {
            let mut f = lock(&self.forgotten);
            f.1 = None;
            std::mem::take(&mut f.0)
        };
        inos.retain(|i| !held.contains_key(i));
        // Unwatched at the MDS whether or not this client knew it watched them (a
        // change it made watches an inode there too).
        let mut w = lock(&self.watched);
        for i in &inos {
            w.inos.remove(i);
        }
        (requests, inos)
    }

    /// Those of `inos` that are not watched in the current session, and the session;
    /// None without a lease if `need_lease` (a renewal is asked for; nothing waits).
    pub(crate) fn missing(&self, inos: &[u64], need_lease: bool) -> Option<(Vec<u64>, Watched)> {
        // The session before the lease: a new session voids the lease first, so a
        // lease seen after reading the session belongs to it (a watch asked under a
        // session that ends meanwhile is not noted: `note`).
        let session = self.session.load(Ordering::Acquire);
        // The run before the lease: a run that changes after this makes `ttl` zero.
        let run = self.run.load(Ordering::Acquire);
        let now = self.base.elapsed().as_nanos() as u64;
        if now.saturating_sub(self.last_use.load(Ordering::Relaxed)) > 1_000_000 {
            self.last_use.store(now, Ordering::Relaxed);
        }
        if self.left_at(now) < MIN_TTL {
            self.want_lease();
            if need_lease {
                return None;
            }
        }
        let w = lock(&self.watched);
        let watched = Watched {
            session,
            recalls: w.recalls.count,
            notes: w.stamp,
            run,
        };
        if inos.is_empty() {
            // Only the session is asked for (a change's own inodes are noted after).
            return Some((Vec::new(), watched));
        }
        let missing = inos
            .iter()
            .copied()
            .filter(|i| !w.inos.contains_key(i))
            .collect();
        Some((missing, watched))
    }

    /// Records `inos` as watched (the MDS said so, or this client changed them, which
    /// watches them there) unless the session changed since `w`; one recalled since
    /// `w` is not recorded (the MDS may have ended its watch after it was asked for),
    /// and then the answer is false.
    pub(crate) fn note(&self, w: Watched, inos: &[u64]) -> bool {
        let mut set = lock(&self.watched);
        if self.session.load(Ordering::Acquire) != w.session {
            return false;
        }
        let mut all = true;
        for &ino in inos {
            if set.recalls.since(w.recalls, ino) {
                all = false;
            } else if !set.inos.contains_key(&ino) {
                // Watched since its first note (a recall or an unwatch removes it).
                set.stamp += 1;
                let stamp = set.stamp;
                set.inos.insert(ino, stamp);
            }
        }
        all
    }

    /// The MDS recalled the watches of `inos` (files another client changed): they
    /// are no longer watched, and a watch asked for before now is not noted. Called
    /// before the kernel's copies are dropped.
    fn recalled(&self, inos: &[u64]) {
        if inos.is_empty() {
            return;
        }
        let mut set = lock(&self.watched);
        let set = &mut *set;
        let r = &mut set.recalls;
        for &ino in inos {
            set.inos.remove(&ino);
            r.count += 1;
            let n = r.count;
            r.recent.push_back((n, ino));
            if r.recent.len() > RECALLS_KEPT {
                let (old, _) = r.recent.pop_front().expect("longer than kept");
                r.forgotten_upto = old;
                // Counted one by one: the oldest kept is the next after it.
                debug_assert_eq!(r.recent.front().map(|&(n, _)| n), Some(old + 1));
            }
        }
    }

    /// `w` as of now: what was noted until now counts as watched before the caller's
    /// reads, which come after (the recalls it guards against stay counted from when
    /// it was taken).
    pub(crate) fn restamp(&self, w: Watched) -> Watched {
        Watched {
            notes: lock(&self.watched).stamp,
            ..w
        }
    }

    /// Whether `ino` was watched when `w` was taken, and still is: noted before then,
    /// in the same session, and not recalled or unwatched since.
    pub(crate) fn is_watched(&self, w: Watched, ino: u64) -> bool {
        self.session.load(Ordering::Acquire) == w.session
            && lock(&self.watched)
                .inos
                .get(&ino)
                .is_some_and(|&stamp| stamp <= w.notes)
    }

    /// How long the kernel may keep what was read after `w`: the lease left, or zero
    /// if the session changed meanwhile or little lease is left.
    pub(crate) fn ttl(&self, w: Watched) -> Duration {
        let left = self.left().saturating_sub(KERNEL_SLACK);
        if self.session.load(Ordering::Acquire) != w.session
            || self.run.load(Ordering::Acquire) != w.run
            || left < MIN_TTL
        {
            return Duration::ZERO;
        }
        left
    }

    /// No lease (it ran out while the mount was idle): the callback thread is asked
    /// for one at once, unless the MDS grants none.
    fn want_lease(&self) {
        if !self.connected.load(Ordering::Acquire) || self.no_leases.load(Ordering::Acquire) {
            return;
        }
        if !self.wanted.swap(true, Ordering::AcqRel) {
            if let Some(cq) = lock(&self.sleeping_on).as_ref() {
                cq.wake();
            }
        }
    }

    /// Asks for a lease if none is held, and waits up to [`LEASE_WAIT`] for it; true
    /// if one is held. Only for a caller that holds neither the gate nor a lock the
    /// kernel takes to drop an entry (an open): the thread may need them to answer a
    /// callback before it reads the grant.
    pub(crate) fn await_lease(&self) -> bool {
        if self.left() >= MIN_TTL {
            return true;
        }
        self.want_lease();
        let deadline = Instant::now() + LEASE_WAIT;
        let (m, cv) = &self.lease_granted;
        let mut g = lock(m);
        loop {
            if self.left() >= MIN_TTL {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let refused = self.no_leases.load(Ordering::Acquire);
            if left.is_zero() || refused || !self.connected.load(Ordering::Acquire) {
                return false;
            }
            g = cv
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// A lease granted until `until` (its renewal was sent then less the lease): a
    /// new run if the one before had run out.
    fn grant_lease(&self, until: Instant) {
        if self.left().is_zero() {
            self.run.fetch_add(1, Ordering::AcqRel);
        }
        self.set_lease(Some(until));
        debug_assert!(!self.left().is_zero() || until <= Instant::now());
        self.no_leases.store(false, Ordering::Release);
        // Asked for meanwhile: this grant answers it (no second renewal at once).
        self.wanted.store(false, Ordering::Release);
        let _g = lock(&self.lease_granted.0);
        self.lease_granted.1.notify_all();
    }

    /// The MDS grants no leases: a waiting open goes on, and calls stop asking.
    fn refused(&self) {
        self.no_leases.store(true, Ordering::Release);
        let _g = lock(&self.lease_granted.0);
        self.lease_granted.1.notify_all();
    }

    /// Whether the lease of length `lease` is worth renewing now.
    /// (`files_open` is asked last: it looks at the open files under their lock.)
    fn renewal_wanted(&self, lease: Duration, files_open: impl FnOnce() -> bool) -> bool {
        let asked = self.wanted.swap(false, Ordering::AcqRel);
        let idle = self
            .base
            .elapsed()
            .saturating_sub(Duration::from_nanos(self.last_use.load(Ordering::Relaxed)));
        asked || idle < lease * KEEP_LEASES || self.keep_watches || files_open()
    }

    fn set_connected(&self, up: bool) {
        self.no_leases.store(false, Ordering::Release);
        self.connected.store(up, Ordering::Release);
        if !up {
            let _g = lock(&self.lease_granted.0);
            self.lease_granted.1.notify_all();
        }
    }

    fn left(&self) -> Duration {
        self.left_at(self.base.elapsed().as_nanos() as u64)
    }

    /// The lease left at `now` nanoseconds from `base`.
    fn left_at(&self, now: u64) -> Duration {
        let until = self.lease_until.load(Ordering::Acquire);
        Duration::from_nanos(until.saturating_sub(now))
    }

    fn set_lease(&self, until: Option<Instant>) {
        let nanos = until.map_or(0, |t| t.duration_since(self.base).as_nanos() as u64);
        self.lease_until.store(nanos, Ordering::Release);
    }

    /// A new callback connection: the old lease and watches are void. The kernel's
    /// names and attributes run out with the old lease (and the MDS holds every
    /// change until then), but kept file data does not: the kernel drops what it
    /// holds of every inode it looked up.
    fn new_session(&self) {
        self.set_lease(None);
        {
            let mut w = lock(&self.watched);
            self.session.fetch_add(1, Ordering::AcqRel);
            w.inos.clear();
            *lock(&self.forgotten) = (Vec::new(), None);
        }
        let held: Vec<Invalidation> = lock(&self.held)
            .keys()
            .map(|&i| Invalidation::Inode(i))
            .collect();
        if !held.is_empty() {
            (self.invalidate)(&held);
        }
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(cq) = lock(&self.sleeping_on).as_ref() {
            cq.wake();
        }
    }
}

mod session;
pub(crate) use session::callback_loop;
