//! Lanes: how the threads of one process share a client without waiting for each
//! other's network round trips.
//!
//! A lane is a whole connection to the cluster with the state bound to it: its MDS
//! connection (the MDS's chunk grants, remembered replies and kept inodes are per
//! connection), its completion queue and I/O buffer, its store connections, its
//! delegated chunks, its copies of inodes and its staged writes. A call holds one
//! lane for its whole run, network waits included, and no other lock across I/O, so
//! calls on different lanes run in parallel: what a verbs program gets from a queue
//! pair per thread, without a poller thread handing completions over (a hand-over
//! costs a thread wake-up, 35-60 µs on this VM).
//!
//! Which lane: a call about one inode (a read, write, fsync, getattr, setattr of an
//! inode) runs on that inode's home lane (`ino % inode_lanes`), so the calls on one
//! file find its staged writes and its cached copy there. Under pessimistic
//! persistence nothing of an inode stays on a lane between calls but its copy, so a
//! call whose lane is busy (with a front-end call, the lanes first grow while
//! they can) borrows a free lane ([`Running`]), and the inode's next calls go there
//! while it is free: threads on files whose numbers share a residue would otherwise
//! take turns on one connection. Calls on one inode still run one at a time, on the
//! lane where the first of them runs; any other
//! call (path resolution, a directory change) takes the first free lane among the
//! first `cores` (more would only spread the copies of shared directories thin and
//! add spinning waiters where the CPUs are already busy). Advisory locks live on lane
//! 0: the MDS holds them per connection, and an inode's lane may change.
//!
//! How many lanes: as many as the process's threads ask for, up to
//! `ClientConfig::lanes`. A client starts with one inode lane; a call that finds its
//! inode's lane busy doubles them ([`Lanes::grow`]: with every lane held, what is
//! staged commits, then the mapping changes). So a single-threaded program (`cat`,
//! a compiler under the preload library) opens one connection set, a few ms here,
//! and a server with many threads gets a lane per thread. What the lanes share: the
//! open files ([`OpenFiles`], locked for a lookup, never across I/O), the DRAM cache
//! of data pages (it has its own lock) and the flusher.
//!
//! Lanes stay coherent with each other as separate clients do: every use of a cached
//! inode checks its log tail one-sided (paper §4.3), but for a write of whole pages,
//! which commits unconditionally and uses the copy as it is unless it is marked as
//! behind: by a call that runs elsewhere than its inode's last (call or commit to
//! it: a chmod by path commits on whichever lane it took), or on a lane that
//! missed a growth of the inode lanes (a copy that was behind anyway is dropped by
//! the commit's reply, at the cost of a whole load). The one rule that crosses lanes
//! is optimistic persistence's "whatever is not a data call commits what is staged
//! first": such a call first commits the staged writes of every lane that has any.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::thread::Thread;
use std::time::{Duration, Instant};

use orion_fabric::Domain;
use orion_meta::FsResult;
use tracing::warn;

use super::{Handle, Inner};
use crate::alloc::Chunks;
use crate::arbitration::InodeCache;
use crate::datapath::PageCache;
use crate::remote::{io_err, Fail, OpenTable, Remote, Res};
use crate::staging::{Failures, Staging};
use crate::{ClientConfig, Stats};

/// Times a call runs again after the MDS connection was re-established.
const RECONNECT_RETRIES: usize = 4;
/// Times a call runs again because the cluster map changed under it. Each time the
/// client holds a newer map (the epoch only grows), and a store that rejoins moves
/// it several times (joined and resyncing, resynced), so this bound is wider: a
/// call fails for it only if the map keeps changing under every attempt.
const MAP_CHANGE_RETRIES: usize = 32;
/// Most lanes a client opens (the staged-lanes mask is one word).
pub const MAX_LANES: usize = 64;

/// The open files of a client, shared by its lanes.
#[derive(Default)]
pub(crate) struct OpenFiles {
    pub handles: HashMap<u64, Handle>,
    pub next_fd: u64,
}

/// Which lane a call runs on.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Pick {
    /// The first free lane.
    Any,
    /// The lane of this inode.
    Inode(u64),
    /// This lane.
    Lane(usize),
}

pub(crate) struct Lanes {
    pub cfg: ClientConfig,
    pub domain: Domain,
    slots: Vec<OnceLock<Mutex<Inner>>>,
    /// Lanes an inode's calls are spread over (`ino % inode_lanes`): a power of two
    /// up to `slots.len()`; changes only while every open lane is held (`grow`).
    inode_lanes: AtomicUsize,
    /// Lanes the calls not about one inode pick among: the CPUs, at most.
    any_lanes: usize,
    /// Held while the lanes grow (one growth at a time).
    growing: Mutex<()>,
    /// Where each inode with a call under way runs (pessimistic persistence).
    running: Running,
    /// Times the inode lanes grew under pessimistic persistence (a lane that missed
    /// one trusts no copy unchecked: `Inner::growths_seen`).
    growths: AtomicUsize,
    /// Lane `i` runs a front-end's call now (not the flusher's commit of what it
    /// staged, nor the keeper's ping): only meeting such a call shows that the
    /// threads need more lanes.
    in_call: Vec<AtomicBool>,
    /// Lanes open so far (they share the largest chunk request).
    opened: Arc<AtomicUsize>,
    /// Failed commits of staged writes, whichever lane committed them.
    failures: Failures,
    /// Held while a lane opens (one opens at a time, and only once).
    opening: Mutex<()>,
    /// Bit `i`: lane `i` has staged writes (optimistic persistence).
    staged: AtomicU64,
    /// MDS connections the lanes re-established (`Remote::sessions`).
    sessions: Arc<AtomicU64>,
    pub open: Arc<Mutex<OpenFiles>>,
    pub pages: Arc<PageCache>,
    optimistic: bool,
    stage_for: Duration,
    pub flusher: OnceLock<Thread>,
    pub closing: AtomicBool,
    pub uid: u32,
    pub gid: u32,
    /// Drawn once: the client's name at the MDS for callbacks (`Hello::instance`).
    pub instance: u64,
    /// What the client holds open, for the MDS (`remote::open_table`).
    pub opens: Arc<OpenTable>,
    /// Holds taken by hand-over lookups, each for a few seconds (`fs/handover.rs`).
    pub handovers: Mutex<super::handover::HandoverHolds>,
}

impl Lanes {
    /// Opens the first lane (so that a client that cannot reach the cluster fails at
    /// once); the others open when calls need them.
    pub fn connect(cfg: ClientConfig, domain: Domain) -> FsResult<Lanes> {
        let lanes = cfg.lanes;
        if lanes == 0 || lanes > MAX_LANES {
            return Err(io_err(format!(
                "lanes {lanes}: expected 1 to {MAX_LANES} (connections a client opens)"
            )));
        }
        let at_start = cfg.lanes_at_start;
        if !at_start.is_power_of_two() || at_start > lanes {
            return Err(io_err(format!(
                "lanes_at_start {at_start}: expected a power of two from 1 to lanes ({lanes})"
            )));
        }
        let optimistic = cfg.optimistic().map_err(io_err)?;
        // SAFETY: geteuid and getegid only read the process's credentials.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let cores = cpus_to_run_on();
        let l = Lanes {
            inode_lanes: AtomicUsize::new(at_start),
            // Two at least: a slow call must not hold up every path call.
            any_lanes: cores.clamp(2, MAX_LANES).min(lanes),
            growing: Mutex::new(()),
            running: Running::new(lanes),
            growths: AtomicUsize::new(0),
            in_call: (0..lanes).map(|_| AtomicBool::new(false)).collect(),
            opened: Arc::default(),
            failures: Failures::default(),
            pages: Arc::new(PageCache::new(cfg.cache_mib)),
            stage_for: Duration::from_millis(cfg.stage_ms.max(1)),
            slots: (0..lanes).map(|_| OnceLock::new()).collect(),
            cfg,
            domain,
            opening: Mutex::new(()),
            staged: AtomicU64::new(0),
            sessions: Arc::new(AtomicU64::new(0)),
            open: Arc::new(Mutex::new(OpenFiles {
                next_fd: 3,
                ..Default::default()
            })),
            optimistic,
            flusher: OnceLock::new(),
            closing: AtomicBool::new(false),
            uid,
            gid,
            instance: orion_format::random_u64(),
            opens: Arc::new(OpenTable::default()),
            handovers: Mutex::default(),
        };
        l.open_lane(0, false)?;
        Ok(l)
    }

    pub fn inode_lanes(&self) -> usize {
        self.inode_lanes.load(Ordering::Acquire)
    }

    pub fn optimistic(&self) -> bool {
        self.optimistic
    }

    /// Whether settling file `ino` (generation `generation`) has nothing to do: no
    /// lane has writes staged and no commit of the file's failed unreported. Then a
    /// flush need not wait for the file's lane, which a call may hold for seconds
    /// (one waiting out a silent MDS): a close of a descriptor that another thread
    /// or process shares, or the one the kernel sends for a program's `exec`.
    pub fn settled(&self, ino: u64, generation: u64) -> bool {
        // A lane's bit is cleared after what it committed (or failed to) is
        // recorded: the failure, if any, is in the map by then.
        self.staged.load(Ordering::Acquire) == 0
            && !lock(&self.failures).contains_key(&(ino, generation))
    }

    /// The lanes open so far, with their numbers.
    pub fn existing(&self) -> impl Iterator<Item = (usize, &Mutex<Inner>)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.get().map(|m| (i, m)))
    }

    /// Lane `i`, opened if it was not. A lane opened while the MDS restarts or fails
    /// over waits for it as a broken connection does (`reconnect_ms`).
    fn open_lane(&self, i: usize, patient: bool) -> FsResult<&Mutex<Inner>> {
        if let Some(m) = self.slots[i].get() {
            return Ok(m);
        }
        let _one = self.opening.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = self.slots[i].get() {
            return Ok(m);
        }
        let deadline = Instant::now() + Duration::from_millis(self.cfg.reconnect_ms);
        let remote = loop {
            let sessions = self.sessions.clone();
            let (cfg, domain) = (self.cfg.clone(), self.domain.clone());
            let opens = self.opens.clone();
            match Remote::connect(cfg, domain, i, sessions, self.instance, opens) {
                Ok(r) => break r,
                Err(e) if !patient || Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let mut staging = Staging::new(self.optimistic, self.stage_for, self.failures.clone());
        if let Some(t) = self.flusher.get() {
            staging.set_flusher(t.clone());
        }
        self.opened.fetch_add(1, Ordering::Relaxed);
        let inner = Inner {
            remote,
            cache: InodeCache::default(),
            chunks: Chunks::for_lane(self.opened.clone()),
            pages: self.pages.clone(),
            staging,
            open: self.open.clone(),
            lane: i,
            // A new lane has no copies to distrust.
            growths_seen: self.growths.load(Ordering::Acquire),
            uid: self.uid,
            gid: self.gid,
            host_paths: self.cfg.host_paths,
        };
        Ok(self.slots[i].get_or_init(|| Mutex::new(inner)))
    }

    /// Takes a lane for a call.
    fn take(&self, pick: Pick) -> FsResult<(usize, MutexGuard<'_, Inner>)> {
        let i = match pick {
            Pick::Inode(ino) => return self.take_inode_lane(ino),
            Pick::Lane(i) => i,
            Pick::Any => {
                // The lowest free lane: a lone thread keeps to lane 0 and its warm
                // copies of directories.
                for (i, m) in self.existing().take_while(|(i, _)| *i < self.any_lanes) {
                    if let Some(g) = try_lock(m) {
                        return Ok((i, g));
                    }
                }
                let unopened = self.slots[..self.any_lanes]
                    .iter()
                    .position(|s| s.get().is_none());
                match unopened {
                    // Every lane is busy and there is room for another.
                    Some(i) => match self.open_lane(i, false) {
                        Ok(_) => i,
                        Err(e) => {
                            warn!("could not open another connection to the cluster: {e}");
                            0
                        }
                    },
                    None => 0,
                }
            }
        };
        let m = self.open_lane(i, true)?;
        Ok((i, lock(m)))
    }

    /// Takes the lane of inode `ino`, doubling the inode lanes first if it is busy
    /// and there is room.
    fn take_inode_lane(&self, ino: u64) -> FsResult<(usize, MutexGuard<'_, Inner>)> {
        loop {
            let n = self.inode_lanes.load(Ordering::Acquire);
            let i = (ino % n as u64) as usize;
            let m = self.open_lane(i, true)?;
            let g = match try_lock(m) {
                Some(g) => g,
                None if n < self.slots.len() && self.in_call[i].load(Ordering::Relaxed) => {
                    self.grow(n);
                    continue;
                }
                None => lock(m),
            };
            // The mapping changes only while every lane is held, so it holds as long
            // as this lane is; a call that waited through a growth looks again.
            if self.inode_lanes.load(Ordering::Acquire) == n {
                return Ok((i, g));
            }
        }
    }

    /// Takes a lane for a call about inode `ino` under pessimistic persistence:
    /// the lane of a call on `ino` under way if there is one (calls on one inode run
    /// one at a time), else the lane its last call ran on (its home lane unless it
    /// was lent elsewhere) if free, else, the inode lanes first doubled while they can
    /// and its home lane is in a front-end call, any free lane (from the top: lane 0
    /// and the first are where path calls and locks go), one more opened if every
    /// open one is busy, and only then the lane of its last call once it frees. The
    /// call is counted in [`Running`] until [`Self::run`] ends it. A call that runs
    /// elsewhere than the last marks its copy there as behind: this client's own
    /// commits on the other lane moved the log on.
    fn take_any_lane_for(&self, ino: u64) -> FsResult<(usize, MutexGuard<'_, Inner>)> {
        loop {
            let n = self.inode_lanes.load(Ordering::Acquire);
            let home = (ino % n as u64) as usize;
            // Opened before the table is held: an opening may wait for the MDS.
            self.open_lane(home, true)?;
            let mut shard = self.running.shard(ino);
            if let Some(i) = shard.join(ino) {
                drop(shard);
                return Ok((i, lock(self.open_lane(i, true)?)));
            }
            // A lane that was lent, or the home lane: open either way.
            let last = shard.lent(ino).unwrap_or(home);
            let last_lane = self.slots[last].get().expect("a lane calls ran on is open");
            if let Some(g) = try_lock(last_lane) {
                shard.begin(ino, last, home);
                return Ok((last, g));
            }
            if n < self.slots.len() && self.in_call[home].load(Ordering::Relaxed) {
                drop(shard);
                self.grow(n);
                continue;
            }
            let open = self.slots.iter().enumerate().rev();
            for (i, m) in open.filter_map(|(i, s)| s.get().map(|m| (i, m))) {
                if let Some(mut g) = try_lock(m) {
                    shard.begin(ino, i, home);
                    g.cache.mark_behind(ino);
                    return Ok((i, g));
                }
            }
            if let Some(i) = self.slots.iter().position(|s| s.get().is_none()) {
                drop(shard);
                match self.open_lane(i, false) {
                    Ok(_) => continue,
                    Err(e) => warn!("could not open another connection to the cluster: {e}"),
                }
                shard = self.running.shard(ino);
                if let Some(i) = shard.join(ino) {
                    drop(shard);
                    return Ok((i, lock(self.open_lane(i, true)?)));
                }
            }
            shard.begin(ino, last, home);
            drop(shard);
            return Ok((last, lock(last_lane)));
        }
    }

    /// Doubles the inode lanes from `from` (unless another thread did).
    ///
    /// With pessimistic persistence nothing about an inode stays on its lane
    /// between calls but its copy (every write is committed before it returns;
    /// locks live on lane 0), so the map just changes and no call waits: a lane
    /// that missed the growth trusts none of its copies unchecked ([`Self::run`]). With optimistic persistence an inode's staged writes must be
    /// found on its lane: the growth holds the lane openings and then every open
    /// lane, in order, commits what each has staged, and only then changes the map.
    /// A thread holds at most one lane at a time everywhere else, and opens a lane
    /// holding none, so taking them all in order cannot deadlock.
    fn grow(&self, from: usize) {
        let _one = lock(&self.growing);
        if self.inode_lanes.load(Ordering::Acquire) != from {
            return;
        }
        let to = (from * 2).min(self.slots.len());
        assert!(to > from, "the inode lanes grow only below the most lanes");
        if !self.optimistic {
            self.growths.fetch_add(1, Ordering::AcqRel);
            self.inode_lanes.store(to, Ordering::Release);
            return;
        }
        // A lane opening now could be picked under the old map and stage a write
        // after the commits below: no lane opens until the map has changed.
        let _no_opening = lock(&self.opening);
        let mut held: Vec<MutexGuard<'_, Inner>> = self.existing().map(|(_, m)| lock(m)).collect();
        for g in held.iter_mut() {
            if !g.staging.is_empty() {
                // A failure is kept with the client's failed commits, which the
                // file's next fsync or close reports whichever lane it runs on.
                if let Err(e) = self.run_locked(g, true, |_| Ok(())) {
                    warn!("committing staged writes before more lanes open: {e}");
                }
            }
        }
        if held.iter().any(|g| !g.staging.is_empty()) {
            // A commit that could not run (the MDS unreachable) keeps the map as
            // it is: the staged writes stay where their inode's calls find them.
            return;
        }
        self.inode_lanes.store(to, Ordering::Release);
    }

    /// Runs `f` on a lane; after a reconnection, from fresh state again. With
    /// `commit_staged` (every call but a read or write), what any lane has staged
    /// commits first.
    pub fn run<T>(
        &self,
        pick: Pick,
        commit_staged: bool,
        f: impl FnMut(&mut Inner) -> Res<T>,
    ) -> FsResult<T> {
        if commit_staged {
            let mut mask = self.staged.load(Ordering::Acquire);
            while mask != 0 {
                let j = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                let mut g = lock(self.open_lane(j, true)?);
                self.run_locked(&mut g, true, |_| Ok(()))?;
            }
        }
        // Under pessimistic persistence a call about one inode may run on any lane,
        // counted in `Running`; under optimistic persistence it keeps to its home.
        let counted = match pick {
            Pick::Inode(ino) if !self.optimistic => Some(ino),
            _ => None,
        };
        let (i, mut g) = match counted {
            Some(ino) => self.take_any_lane_for(ino)?,
            None => self.take(pick)?,
        };
        if let Some(ino) = counted {
            self.running.check_alone(ino, i);
            // A growth moved inodes to new home lanes, where their copies may lag
            // behind what this client committed on their old ones.
            let growths = self.growths.load(Ordering::Acquire);
            if g.growths_seen != growths {
                g.growths_seen = growths;
                g.cache.mark_all_behind();
            }
        }
        self.in_call[i].store(true, Ordering::Relaxed);
        g.cache.landed.clear();
        // Ends the call's marks, in order, even if it panics (a mark left behind
        // would keep the inode on this lane, and the lane taken for one in a
        // front-end call).
        let mut call = CallOnLane {
            lanes: self,
            lane: i,
            ino: counted,
            guard: Some(g),
        };
        let g = call.guard.as_mut().expect("held");
        let r = self.run_locked(g, commit_staged, f);
        if !self.optimistic {
            // A call not about one inode that committed to one (a chmod or a
            // truncate by path, say) left the inode's copy current on this lane
            // and behind on its last: its next calls come here.
            for &ino in g.cache.landed.iter().filter(|&&ino| Some(ino) != counted) {
                let home = (ino % self.inode_lanes() as u64) as usize;
                self.running.shard(ino).note_last(ino, i, home);
            }
        }
        r
    }

    /// [`Self::run`] of a call not about one inode for the client's own upkeep (the
    /// keeper's ping): it is not a front-end's call, so meeting it grows nothing.
    pub fn run_background<T>(&self, f: impl FnMut(&mut Inner) -> Res<T>) -> FsResult<T> {
        let (_, mut g) = self.take(Pick::Any)?;
        self.run_locked(&mut g, false, f)
    }

    fn run_locked<T>(
        &self,
        g: &mut Inner,
        commit_staged: bool,
        mut f: impl FnMut(&mut Inner) -> Res<T>,
    ) -> FsResult<T> {
        g.remote.begin_operation();
        let mut reclaimed = false;
        let r = (|| {
            let (mut reconnects, mut map_changes) = (0, 0);
            while reconnects < RECONNECT_RETRIES && map_changes < MAP_CHANGE_RETRIES {
                g.datapath().forget_if_term_changed();
                let staged = if commit_staged || g.staging.due() {
                    g.datapath().flush_all()
                } else {
                    Ok(())
                };
                match staged.and_then(|_| f(g)) {
                    Ok(v) => return Ok(v),
                    // Out of data space while other lanes may sit on unused chunk
                    // pages: they give them back, and the call runs once more. (A
                    // full inode table or full log pages they cannot help.)
                    Err(Fail::Fs(e)) if short_of_data_pages(&e) && !reclaimed => {
                        reclaimed = true;
                        if !self.reclaim(g.lane) {
                            return Err(e);
                        }
                    }
                    Err(Fail::Fs(e)) => return Err(e),
                    Err(Fail::Reconnected) => {
                        reconnects += 1;
                        g.datapath().reconnected()
                    }
                    // Refused, with the new map in hand: the operation writes again.
                    Err(Fail::MapChanged) => map_changes += 1,
                }
            }
            Err(io_err(match reconnects == RECONNECT_RETRIES {
                true => "the MDS connection keeps breaking",
                false => "the cluster map keeps changing under the operation",
            }))
        })();
        self.note_staged(g);
        r
    }

    /// Has every other lane that is not busy give its unused chunk pages back to the
    /// MDS (a busy lane is writing, into its chunk); true if any did.
    fn reclaim(&self, except: usize) -> bool {
        let mut any = false;
        for (i, m) in self.existing() {
            if i == except {
                continue;
            }
            if let Ok(mut g) = m.try_lock() {
                let g = &mut *g;
                any |= g.chunks.return_all(&mut g.remote);
            }
        }
        any
    }

    /// Keeps the staged-lanes mask true for lane `g` (under its lock).
    /// Writes only when the bit changes: every call of every thread passes here, and
    /// a write of the shared word on each would bounce its cache line between cores.
    pub fn note_staged(&self, g: &Inner) {
        let bit = 1u64 << g.lane;
        let staged = !g.staging.is_empty();
        // Only this lane's holder changes its bit, so the read below is current.
        if (self.staged.load(Ordering::Acquire) & bit != 0) == staged {
            return;
        }
        if staged {
            self.staged.fetch_or(bit, Ordering::AcqRel);
        } else {
            self.staged.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    /// The counters of every lane, added up.
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for (_, m) in self.existing() {
            s.add(&lock(m).remote.stats);
        }
        s
    }
}

/// The lock if it is free (a poisoned one is taken: its holder died in a call, and
/// the lane's state is checked at its next use as after any failed call).
fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// A call's hold of a lane in [`Lanes::run`], given up in order when the call ends,
/// panics included: its marks on the lane, then the lane, then its count in
/// [`Running`] (a new call on the lane must not find its marks cleared under it).
struct CallOnLane<'a> {
    lanes: &'a Lanes,
    lane: usize,
    /// The inode counted in [`Running`] (pessimistic persistence).
    ino: Option<u64>,
    guard: Option<MutexGuard<'a, Inner>>,
}

impl Drop for CallOnLane<'_> {
    fn drop(&mut self) {
        self.lanes.in_call[self.lane].store(false, Ordering::Relaxed);
        if self.ino.is_some() {
            self.lanes.running.check_done(self.lane);
        }
        drop(self.guard.take());
        if let Some(ino) = self.ino {
            self.lanes.running.end(ino);
        }
    }
}

/// The inodes with calls under way and the lane each runs on, so that a call that
/// borrows a lane other than its inode's home never runs beside the inode's other
/// calls; and the inodes whose last call ran away from home, so that their next
/// calls go where their copy is current. Sharded by a hash of the inode, so that
/// threads on different files seldom meet on one lock.
struct Running {
    shards: Vec<Mutex<Shard>>,
    /// In debug builds, one more than the inode whose call runs on each lane (0:
    /// none), to check the table's promise against what runs.
    on_lane: Vec<AtomicU64>,
}

/// Inodes remembered away from home per shard; past it the oldest goes home (its
/// copy there is then used unchecked once, and dropped if it was behind).
const LENT_PER_SHARD: usize = 64;

#[derive(Default)]
struct Shard {
    /// An entry per inode with calls under way (running or waiting for its lane).
    calls: Vec<Call>,
    /// Inodes whose last call ran on a lane other than their home, and that lane.
    lent: VecDeque<(u64, usize)>,
}

/// One inode's calls under way: the lane they run on, and how many (one runs or
/// waits for that lane, the others wait behind it).
struct Call {
    ino: u64,
    lane: usize,
    calls: u32,
}

impl Shard {
    /// Counts one more call on `ino` if any is under way; the lane they use.
    fn join(&mut self, ino: u64) -> Option<usize> {
        let c = self.calls.iter_mut().find(|c| c.ino == ino)?;
        c.calls += 1;
        Some(c.lane)
    }

    /// The lane the last call on `ino` ran on, if not its home.
    fn lent(&self, ino: u64) -> Option<usize> {
        self.lent
            .iter()
            .find(|(i, _)| *i == ino)
            .map(|&(_, lane)| lane)
    }

    /// A call on `ino` begins on `lane`; `home` is its home lane.
    fn begin(&mut self, ino: u64, lane: usize, home: usize) {
        self.calls.push(Call {
            ino,
            lane,
            calls: 1,
        });
        self.note_last(ino, lane, home);
    }

    /// The last call on `ino` (or commit to it) ran on `lane`.
    fn note_last(&mut self, ino: u64, lane: usize, home: usize) {
        self.lent.retain(|(i, _)| *i != ino);
        if lane != home {
            if self.lent.len() >= LENT_PER_SHARD {
                self.lent.pop_front();
            }
            self.lent.push_back((ino, lane));
        }
    }
}

impl Running {
    fn new(lanes: usize) -> Running {
        Running {
            shards: (0..lanes.next_power_of_two())
                .map(|_| Mutex::default())
                .collect(),
            on_lane: (0..lanes).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn shard(&self, ino: u64) -> MutexGuard<'_, Shard> {
        // A multiplicative hash: inode numbers that share a residue (the case the
        // table is for) must not all meet on one shard.
        let h = ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        lock(&self.shards[h as usize % self.shards.len()])
    }

    /// Ends one call on `ino` (after its lane is given back).
    fn end(&self, ino: u64) {
        let mut shard = self.shard(ino);
        let table = &mut shard.calls;
        let at = table.iter().position(|c| c.ino == ino);
        let at = at.expect("a call that began is in the table");
        table[at].calls -= 1;
        if table[at].calls == 0 {
            table.swap_remove(at);
        }
    }

    /// Debug builds: no other lane runs a call on `ino` (the pair of [`Shard::join`]:
    /// if the table let two lanes take one inode, this fails).
    fn check_alone(&self, ino: u64, lane: usize) {
        if cfg!(debug_assertions) {
            for (i, on) in self.on_lane.iter().enumerate() {
                assert!(
                    i == lane || on.load(Ordering::Acquire) != ino + 1,
                    "inode {ino} has calls on lanes {i} and {lane} at once"
                );
            }
            self.on_lane[lane].store(ino + 1, Ordering::Release);
        }
    }

    fn check_done(&self, lane: usize) {
        if cfg!(debug_assertions) {
            self.on_lane[lane].store(0, Ordering::Release);
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `e` is an ENOSPC that more data pages could cure (one that names no
/// resource may be that too).
fn short_of_data_pages(e: &orion_meta::FsError) -> bool {
    use orion_meta::error::Resource;
    match e {
        orion_meta::FsError::NoSpace(r) => *r == Resource::DataPages,
        e => e.errno() == libc::ENOSPC,
    }
}

/// How many CPUs this process may run on: its affinity mask, in one system call.
/// (`std::thread::available_parallelism` also reads the cgroup's CPU quota, a dozen
/// system calls, which each short process of the preload library paid at its first
/// call; a quota does not change how many threads can run at once.)
fn cpus_to_run_on() -> usize {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes into
    // it, within the size given.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            // More CPUs than a cpu_set_t holds (EINVAL): ask the long way.
            return std::thread::available_parallelism().map_or(1, |n| n.get());
        }
        (libc::CPU_COUNT(&set) as usize).max(1)
    }
}
