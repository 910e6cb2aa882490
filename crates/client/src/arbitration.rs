//! Cached inodes and client arbitration (paper §4.3).
//!
//! A client keeps a copy of the state of each inode it uses, built from the MDS's log
//! with the same code the MDS runs. Before it uses a copy it reads the inode's slot
//! one-sided (the 8-byte tail, with the generation beside it): an unchanged tail means
//! the copy is current; a longer log of the same version is fetched from where the
//! copy ended; a log rewritten by GC is followed from where its compacted part ends
//! when the GC says it compacted the copy's log up to the copy's tail (design note
//! 76), and loaded whole otherwise, as a reused slot is. A log commit's
//! reply says where the MDS placed the entries: right after the copy's tail means the
//! copy stays in step (the entries are applied locally); anything else means another
//! client's commits came first, and the copy catches up from the MDS log at its next
//! use. A commit's entries are applied to the copy while the commit is on its way
//! ([`InodeCache::apply_ahead`]), so that work overlaps the MDS's; a copy that
//! took them ahead of the reply and then learns that other commits came first, or
//! that the commit did not land, is dropped and loaded again at its next use: no
//! copy ever holds what the log lacks past its commit, so nothing is rolled back.
//! An inode whose copy fell behind that way (others write it too) takes its
//! entries after the reply until [`CALM_COMMITS`] of its commits in a row are in
//! step. Re-execution is
//! needed only by updates computed from the old state, which commit conditionally
//! (`expect`) and run again when refused.

use std::cell::RefCell;
use std::collections::HashMap;

use orion_format::{
    Compaction, FileType, InodeSlot, LogPageHeader, Tail, INODE_SLOT_SIZE, LOG_PAGE_HEADER,
};
use orion_meta::error::ENOENT;
use orion_meta::log::{walk_log, walk_log_from, PageSource};
use orion_meta::{FsError, FsResult, InodeState};

use crate::remote::{Fail, Remote, Res};

/// What [`InodeCache::apply_ahead`] did with a commit's entries.
pub(crate) enum Ahead {
    /// Nothing: no copy of that generation, or other clients write the inode.
    No,
    /// They were applied to the copy, which was at this tail.
    Applied(Tail),
    /// They did not apply to the copy at this tail (the copy was dropped).
    Failed(Tail, String),
}

/// A client's copy of one inode.
pub struct Cached {
    pub state: InodeState,
    pub tail: Tail,
    /// The cache's trust epoch when this copy was last found current; below
    /// [`InodeCache`]'s, it is not used unchecked ([`InodeCache::mark_behind`]).
    checked: u64,
}

impl Cached {
    /// The slot generation this copy is of.
    pub fn generation(&self) -> u64 {
        self.state.attr.generation
    }

    /// Every update of this file commits conditionally: the per-file "shared" flag,
    /// an extended attribute, so all clients see it.
    pub fn shared(&self) -> bool {
        self.state
            .xattrs
            .contains_key(orion_meta::xattr::SHARED_FLAG)
    }
}

/// Reads log pages of the MDS pool one-sided.
struct RemotePages<'a> {
    remote: RefCell<&'a mut Remote>,
    /// A reconnect seen during the walk (the walk then fails and the caller retries).
    reconnected: RefCell<bool>,
}

impl PageSource for RemotePages<'_> {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> FsResult<()> {
        match self.remote.borrow_mut().read_mds(off, buf) {
            Ok(()) => Ok(()),
            Err(Fail::Fs(e)) => Err(e),
            Err(Fail::Reconnected) => {
                *self.reconnected.borrow_mut() = true;
                Err(FsError::Io("reconnected".into()))
            }
            Err(Fail::MapChanged) => unreachable!("a one-sided read commits nothing"),
        }
    }
}

pub struct InodeCache {
    pub map: HashMap<u64, Cached>,
    /// Inodes other clients write too (a commit found their commits before it, or
    /// a copy holding entries ahead was dropped), with the commits in step since:
    /// their entries are applied once the reply says where they landed, until
    /// [`CALM_COMMITS`] in a row were in step.
    contended: HashMap<u64, u32>,
    /// Where applying a commit's entries lists the data pages they free (unused
    /// here: the MDS frees them); kept for its capacity, as a write frees a page.
    freed: Vec<orion_format::Gpa>,
    /// Copies found current before this epoch may lag behind commits this client
    /// made on another lane: not used unchecked until refreshed (starts at 1, so
    /// that a copy marked with 0 is below it).
    trust: u64,
    /// Inodes whose commits landed during the lane's current call, for the lanes
    /// to note where each inode's copy is current (`fs/lanes.rs`).
    pub(crate) landed: Vec<u64>,
}

impl Default for InodeCache {
    fn default() -> Self {
        InodeCache {
            map: HashMap::new(),
            contended: HashMap::new(),
            freed: Vec::new(),
            trust: 1,
            landed: Vec::new(),
        }
    }
}

/// Past this many contended inodes the set starts again (it only saves reloads).
const MAX_CONTENDED: usize = 4096;

/// Commits in step, in a row, after which an inode is no longer taken as written
/// by others: one in step between two refusals would have each refusal drop the
/// copy (a whole load) where a copy left behind walks only the new entries.
pub const CALM_COMMITS: u32 = 8;

/// The tail a copy has while a commit whose entries it took is on its way: no slot
/// holds it (log versions stop at `Tail::MAX_VERSION`), so a copy whose commit was
/// never settled (a panic in between, its lane taken over) is loaded again at its
/// next use rather than trusted with entries the log may lack.
const IN_FLIGHT: Tail = Tail {
    version: u32::MAX,
    offset: 0,
};

/// How many times a log walk that raced with GC is retried before it is an error.
const WALK_ATTEMPTS: usize = 8;

impl InodeCache {
    /// Reads the slot of `ino` one-sided.
    fn read_slot(remote: &mut Remote, ino: u64) -> Res<Option<InodeSlot>> {
        if ino == 0 || ino >= remote.sb.inode_count {
            return Err(ENOENT.into());
        }
        let mut b = [0u8; INODE_SLOT_SIZE];
        remote.read_mds(remote.sb.slot_off(ino), &mut b)?;
        remote.stats.tail_reads += 1;
        match InodeSlot::decode(&b) {
            Ok(s) => Ok(s.filter(|s| s.ino == ino)),
            // A slot being rewritten (GC of a freed-and-reused inode) reads as damaged
            // for an instant; the caller retries.
            Err(e) => Err(FsError::Corrupt(format!("inode {ino}: slot: {e}")).into()),
        }
    }

    /// Makes the copy of `ino` current (see the module text) and returns it.
    pub fn refresh(&mut self, remote: &mut Remote, ino: u64) -> Res<&mut Cached> {
        let mut last = None;
        for _ in 0..WALK_ATTEMPTS {
            match self.try_refresh(remote, ino) {
                Ok(()) => {
                    let c = self.map.get_mut(&ino).expect("refreshed");
                    c.checked = self.trust;
                    return Ok(c);
                }
                Err(Fail::Fs(FsError::Corrupt(m))) => last = Some(m),
                Err(e) => return Err(e),
            }
        }
        Err(FsError::Io(format!(
            "inode {ino}: its log kept changing under a one-sided read: {}",
            last.unwrap_or_default()
        ))
        .into())
    }

    fn try_refresh(&mut self, remote: &mut Remote, ino: u64) -> Res<()> {
        let Some(slot) = Self::read_slot(remote, ino)? else {
            self.map.remove(&ino);
            return Err(ENOENT.into());
        };
        if let Some(c) = self.map.get_mut(&ino) {
            if c.generation() == slot.generation {
                if c.tail == slot.tail {
                    remote.stats.tail_hits += 1;
                    return Ok(());
                }
                // One version is one log, which only grows: the slot's tail is past
                // the copy's in log order (not in pool offsets: a log's next page may
                // lie anywhere in the pool).
                let same_log = c.tail.version == slot.tail.version;
                let walked = if same_log {
                    let from = c.tail.offset;
                    walk(remote, ino, from, slot.tail, &mut c.state, false).map(|()| true)
                } else {
                    follow_gc(remote, ino, &slot, c)
                };
                match walked {
                    Ok(true) => {
                        c.tail = slot.tail;
                        match same_log {
                            true => remote.stats.refetches += 1,
                            false => remote.stats.gc_follows += 1,
                        }
                        return Ok(());
                    }
                    // The copy may be half updated (entries applied past its tail):
                    // it goes, and the caller tries again.
                    Err(Fail::Reconnected) => {
                        self.map.remove(&ino);
                        return Err(Fail::Reconnected);
                    }
                    // Not the GC of this copy's log, or the copy may be half updated:
                    // load it whole below.
                    Ok(false) | Err(_) => {}
                }
                remote.stats.rebuilds += 1;
            }
        }
        self.map.remove(&ino);
        let mut state = InodeState::new(ino, slot.ftype, slot.generation);
        walk(remote, ino, slot.head(), slot.tail, &mut state, true)?;
        remote.stats.loads += 1;
        self.map.insert(
            ino,
            Cached {
                state,
                tail: slot.tail,
                checked: self.trust,
            },
        );
        Ok(())
    }

    /// The cached copy of `ino` as it is, without checking its tail: for updates that
    /// do not depend on the inode's state (the MDS checks the generation they carry).
    pub fn cached(&mut self, ino: u64) -> Option<&mut Cached> {
        let trust = self.trust;
        self.map.get_mut(&ino).filter(|c| c.checked >= trust)
    }

    /// This client may have committed to `ino` on another lane since this copy was
    /// found current (a call lent a lane, `fs/lanes.rs`): the copy is refreshed
    /// before its next use, walking on from its tail, instead of being used as it
    /// is and dropped when the commit lands past its tail.
    pub fn mark_behind(&mut self, ino: u64) {
        if let Some(c) = self.map.get_mut(&ino) {
            c.checked = 0;
        }
    }

    /// [`Self::mark_behind`] for every copy (the lanes' mapping changed, so any
    /// inode may have run elsewhere since).
    pub fn mark_all_behind(&mut self) {
        self.trust += 1;
    }

    /// Applies the entries of a log commit for `generation` of `ino` to its copy
    /// while the commit is on its way (module text), unless other clients write the
    /// inode. [`InodeCache::settle`] then keeps or drops the copy by the reply.
    pub(crate) fn apply_ahead(
        &mut self,
        ino: u64,
        generation: u64,
        entries: &[orion_format::Entry],
    ) -> Ahead {
        if self.contended.contains_key(&ino) {
            return Ahead::No;
        }
        let Some(c) = self.map.get_mut(&ino) else {
            return Ahead::No;
        };
        if c.generation() != generation {
            return Ahead::No;
        }
        let before = c.tail;
        c.tail = IN_FLIGHT;
        for e in entries {
            self.freed.clear();
            if let Err(err) = c.state.apply(e, &mut self.freed) {
                // Half applied: the copy goes whatever the reply says.
                self.map.remove(&ino);
                self.mark_contended(ino);
                return Ahead::Failed(before, format!("{err} ({e:?})"));
            }
        }
        Ahead::Applied(before)
    }

    /// Settles a log commit of `entries` for `generation` of `ino` by the MDS's
    /// answer (`placed`: the tails before and after it), after
    /// [`InodeCache::apply_ahead`] did `ahead`. No I/O, and no failure: a commit
    /// that landed has happened whatever happens here. A copy that took the entries
    /// ahead keeps them if the MDS placed them right at its tail, and goes
    /// otherwise; a copy that did not take them takes them now if it is at the
    /// tail the MDS placed them after, and otherwise (other clients' commits came
    /// first) stays at its tail, and its next use catches up from there, reading
    /// these entries too in the MDS's order. Returns whether a copy that took the
    /// entries ahead kept them (None: none took them ahead).
    pub(crate) fn settle(
        &mut self,
        ino: u64,
        generation: u64,
        entries: &[orion_format::Entry],
        ahead: Ahead,
        placed: &Res<(Tail, Tail)>,
    ) -> Option<bool> {
        let refused = matches!(placed, Err(Fail::Fs(FsError::Errno(libc::ESTALE))));
        let placed = placed.as_ref().ok().copied();
        if placed.is_some() && self.landed.last() != Some(&ino) {
            self.landed.push(ino);
        }
        match ahead {
            Ahead::Applied(before) => match placed {
                Some((prev, tail)) if prev == before => {
                    let c = self.map.get_mut(&ino);
                    let c = c.expect("nothing else uses a copy while its commit is on its way");
                    // `apply_ahead` left it there, and no slot holds that tail.
                    assert_eq!(
                        c.tail, IN_FLIGHT,
                        "inode {ino}: a copy moved under its commit"
                    );
                    c.tail = tail;
                    Some(true)
                }
                // Other commits belong before these entries, or the commit did not
                // land (a refusal as stale means another client's came first):
                // the copy is ahead of the log.
                _ => {
                    self.map.remove(&ino);
                    self.mark_contended(ino);
                    Some(false)
                }
            },
            Ahead::Failed(before, err) => {
                if let Some((prev, _)) = placed.filter(|(prev, _)| *prev == before) {
                    panic!(
                        "inode {ino}: entries the MDS acknowledged at tail {prev:?} do not \
                         apply to this client's copy at the same tail: {err}"
                    );
                }
                Some(false)
            }
            Ahead::No => {
                if let Some((prev, tail)) = placed {
                    self.committed(ino, generation, entries, prev, tail);
                } else if refused && self.contended.contains_key(&ino) {
                    // Another client's commit came first: the commits in step
                    // start counting again.
                    self.mark_contended(ino);
                }
                None
            }
        }
    }

    /// Applies the entries of a commit the MDS placed between tails `prev` and
    /// `tail` to a copy at `prev` ([`InodeCache::settle`]).
    fn committed(
        &mut self,
        ino: u64,
        generation: u64,
        entries: &[orion_format::Entry],
        prev: Tail,
        tail: Tail,
    ) {
        let Some(c) = self.map.get_mut(&ino) else {
            return;
        };
        if c.generation() != generation {
            return;
        }
        if c.tail != prev {
            self.mark_contended(ino);
            return;
        }
        if let Some(calm) = self.contended.get_mut(&ino) {
            *calm += 1;
            if *calm >= CALM_COMMITS {
                self.contended.remove(&ino);
            }
        }
        // The MDS applied these entries to the state this copy has: they apply here
        // too, or client and MDS disagree on the inode (a bug). Until they all
        // did, the copy's tail is one no slot holds: a copy a panic left half
        // updated is loaded again, not walked on from `prev`.
        c.tail = IN_FLIGHT;
        for e in entries {
            self.freed.clear();
            if let Err(err) = c.state.apply(e, &mut self.freed) {
                panic!(
                    "inode {ino}: an entry the MDS acknowledged at tail {prev:?} does not \
                     apply to this client's copy at the same tail: {err} ({e:?})"
                );
            }
        }
        c.tail = tail;
    }

    /// Takes `ino` as written by other clients too, from now on.
    fn mark_contended(&mut self, ino: u64) {
        if self.contended.len() >= MAX_CONTENDED && !self.contended.contains_key(&ino) {
            self.contended.clear();
        }
        self.contended.insert(ino, 0);
        debug_assert!(
            self.contended.len() <= MAX_CONTENDED,
            "the contended set is bounded"
        );
    }

    pub fn ftype(&self, ino: u64) -> Option<FileType> {
        self.map.get(&ino).map(|c| c.state.attr.ftype)
    }
}

/// Brings the state of copy `c` of `ino` to the log `slot` names when that log is the
/// GC of the one `c` holds (design note 76; the caller moves the copy's tail): the
/// new log's first page says where the old log ended and where the compacted
/// entries end, and only the entries after those are walked. False when the new log
/// is not that (another GC came between, or entries came before the GC): the caller
/// loads the inode whole.
fn follow_gc(remote: &mut Remote, ino: u64, slot: &InodeSlot, c: &mut Cached) -> Res<bool> {
    let mut first = [0u8; LOG_PAGE_HEADER as usize];
    remote.read_mds(slot.head(), &mut first)?;
    let followable = match (LogPageHeader::decode(&first), Compaction::decode(&first)) {
        (Ok(h), Ok(Some(gc))) if h.ino == ino && h.version == slot.tail.version => {
            (gc.from == c.tail).then_some(gc.end)
        }
        _ => None,
    };
    let Some(end) = followable else {
        return Ok(false);
    };
    if end != slot.tail.offset {
        walk(remote, ino, end, slot.tail, &mut c.state, false)?;
    }
    // The pair of the MDS's check that GC keeps the inode: the copy that followed
    // is the inode the whole new log builds (debug builds: it costs a whole load).
    #[cfg(debug_assertions)]
    {
        let mut whole = InodeState::new(ino, slot.ftype, slot.generation);
        walk(remote, ino, slot.head(), slot.tail, &mut whole, true)?;
        assert!(
            whole.same_contents(&c.state),
            "inode {ino}: the copy that followed a log GC differs from the new log"
        );
    }
    Ok(true)
}

/// Applies the entries of `ino`'s log to `tail` to `state`: the whole log from its
/// head page `from` when `whole`, else from the entry at `from`.
fn walk(
    remote: &mut Remote,
    ino: u64,
    from: u64,
    tail: Tail,
    state: &mut InodeState,
    whole: bool,
) -> Res<()> {
    let sb = remote.sb.clone();
    let src = RemotePages {
        remote: RefCell::new(remote),
        reconnected: RefCell::new(false),
    };
    let mut freed = Vec::new();
    let mut apply = |e: &orion_format::Entry, _| {
        freed.clear();
        state.apply(e, &mut freed)
    };
    let r = if whole {
        walk_log(&src, &sb, ino, from, tail, &mut apply)
    } else {
        walk_log_from(&src, &sb, ino, from, tail, &mut apply)
    };
    if *src.reconnected.borrow() {
        return Err(Fail::Reconnected);
    }
    r.map(|_| ()).map_err(|e| match e {
        FsError::Io(m) => Fail::Fs(FsError::Io(m)),
        other => Fail::Fs(FsError::Corrupt(other.to_string())),
    })
}
