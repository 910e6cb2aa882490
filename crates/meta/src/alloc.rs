//! A page allocator over a pool's page area: a DRAM bitmap rebuilt from the logs at
//! mount, next-fit search, a reserve that only freeing operations may dip into, and
//! deferred frees that wait out a grace period (readers of the old pages may still
//! be reading them, paper §4.2). Single pages freed recently are handed out again
//! first: they are hot in the cache and already mapped, so copy-on-write overwrites
//! cycle through a few pages instead of sweeping the pool.
//!
//! When only pages still in their grace period are left, an allocator either waits
//! the grace out (the default: a local file system's caller, which has no one to
//! answer "later") or fails at once ([`PageAllocator::never_waits`]: the MDS's data
//! chunks and log pages, whose callers answer EAGAIN and have the client wait, so
//! that the MDS's one loop never sleeps: a second of silence there reads as its
//! death to its stores, its mirror and the cluster manager). [`PageAllocator::out_of_room`]
//! says which failure it is: room that is coming, or none.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::error::{FsError, Resource};

pub struct PageAllocator {
    bits: Vec<u64>,
    count: u64,
    free: u64,
    hint: u64,
    reserve: u64,
    grace: Duration,
    deferred: VecDeque<(Instant, u64, u64)>,
    /// Pages in `deferred`, kept as they come and go: asked for on every grant.
    deferred_pages: u64,
    /// Recently freed pages, most recent last (may hold pages allocated since: checked).
    recent: Vec<u64>,
    /// Whether an allocation that finds only pages in their grace period waits.
    waits: bool,
    /// What its ENOSPC names.
    resource: Resource,
}

const RECENT_MAX: usize = 4096;

impl PageAllocator {
    /// All `count` pages free; `reserve` pages are kept for operations that free space.
    pub fn new(count: u64, reserve: u64, grace: Duration) -> PageAllocator {
        PageAllocator {
            bits: vec![0; count.div_ceil(64) as usize],
            count,
            free: count,
            hint: 0,
            reserve: reserve.min(count / 4),
            grace,
            deferred: VecDeque::new(),
            deferred_pages: 0,
            recent: Vec::new(),
            waits: true,
            resource: Resource::LogPages,
        }
    }

    /// An allocator of data pages (one of log pages by default): what its ENOSPC
    /// names.
    pub fn of_data_pages(mut self) -> PageAllocator {
        self.resource = Resource::DataPages;
        self
    }

    /// An allocator whose allocations fail at once, rather than wait, when the
    /// only free pages left are in their grace period ([`Self::in_grace`] says how
    /// many: the caller's "try again" is due).
    pub fn never_waits(mut self) -> PageAllocator {
        self.waits = false;
        self
    }

    /// The free pages an allocation must leave: the reserve, unless it may use it.
    fn floor(&self, use_reserve: bool) -> u64 {
        if use_reserve {
            0
        } else {
            self.reserve
        }
    }

    /// The error of an update that needs `n` pages (outside the reserve unless
    /// `use_reserve`) and did not find them: EAGAIN when pages in their grace
    /// period will make that room once it ends and this allocator does not wait for
    /// them (its caller's "try again"), ENOSPC when nothing that is coming does.
    pub fn out_of_room(&self, n: u64, use_reserve: bool) -> FsError {
        let floor = self.floor(use_reserve);
        match !self.waits && self.in_grace() > 0 && self.free() >= floor + n {
            true => FsError::Errno(libc::EAGAIN),
            false => FsError::NoSpace(self.resource),
        }
    }

    /// Whether `n` pages (outside the reserve unless `use_reserve`) may be taken
    /// now, for an update that takes them one by one and must be refused before it
    /// changed anything rather than halfway ([`Self::out_of_room`] if not). An
    /// allocator that waits sleeps out the grace periods first if that makes room.
    pub fn room_for(&mut self, n: u64, use_reserve: bool) -> Result<(), FsError> {
        self.reclaim(false);
        let floor = self.floor(use_reserve);
        if self.free < floor + n && self.waits && self.free() >= floor + n {
            self.reclaim(true);
        }
        match self.free >= floor + n {
            true => Ok(()),
            false => Err(self.out_of_room(n, use_reserve)),
        }
    }

    /// Freed pages still in their grace period.
    pub fn in_grace(&self) -> u64 {
        self.deferred_pages
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Free pages an allocation outside the reserve may take, counting those still
    /// in their grace period.
    pub fn available(&self) -> u64 {
        self.free().saturating_sub(self.reserve)
    }

    /// Free pages, counting those still in their grace period.
    pub fn free(&self) -> u64 {
        self.free + self.in_grace()
    }

    pub fn is_used(&self, page: u64) -> bool {
        page < self.count && self.bits[(page / 64) as usize] & (1 << (page % 64)) != 0
    }

    /// Marks a page used while rebuilding; false if it already was (a double reference).
    pub fn mark_used(&mut self, page: u64) -> bool {
        if page >= self.count || self.is_used(page) {
            return false;
        }
        self.bits[(page / 64) as usize] |= 1 << (page % 64);
        self.free -= 1;
        true
    }

    fn set_free(&mut self, page: u64) {
        assert!(
            self.is_used(page),
            "page {page} freed twice, or never allocated"
        );
        self.bits[(page / 64) as usize] &= !(1 << (page % 64));
        self.free += 1;
        debug_assert!(self.free <= self.count);
    }

    fn set_used(&mut self, page: u64) {
        assert!(!self.is_used(page), "page {page} handed out twice");
        self.bits[(page / 64) as usize] |= 1 << (page % 64);
        self.free -= 1;
    }

    /// Allocates a run of up to `max` contiguous pages (at least one). `use_reserve`
    /// lets operations that release space (unlink, truncate) proceed on a full pool.
    pub fn alloc_run(&mut self, max: u64, use_reserve: bool) -> Option<(u64, u64)> {
        self.reclaim(false);
        let floor = self.floor(use_reserve);
        if self.free <= floor && !(self.waits && self.reclaim(true)) {
            return None;
        }
        if self.free <= floor {
            return None;
        }
        let max = max.min(self.free - floor).max(1);
        if max == 1 {
            while let Some(p) = self.recent.pop() {
                if !self.is_used(p) {
                    self.set_used(p);
                    return Some((p, 1));
                }
            }
        }
        let start = self.find_free(self.hint).or_else(|| self.find_free(0))?;
        let mut n = 1;
        while n < max && start + n < self.count && !self.is_used(start + n) {
            n += 1;
        }
        for p in start..start + n {
            self.set_used(p);
        }
        self.hint = start + n;
        assert!(
            self.free >= floor,
            "an allocation never takes the reserve it may not use"
        );
        Some((start, n))
    }

    pub fn alloc(&mut self, use_reserve: bool) -> Option<u64> {
        self.alloc_run(1, use_reserve).map(|(p, _)| p)
    }

    fn find_free(&self, from: u64) -> Option<u64> {
        let mut w = (from / 64) as usize;
        let mut mask = !0u64 << (from % 64);
        while w < self.bits.len() {
            let free_bits = !self.bits[w] & mask;
            if free_bits != 0 {
                let p = w as u64 * 64 + free_bits.trailing_zeros() as u64;
                return (p < self.count).then_some(p);
            }
            w += 1;
            mask = !0;
        }
        None
    }

    /// Frees a run now (pages nobody else can be reading).
    pub fn free_now(&mut self, start: u64, n: u64) {
        for p in start..start + n {
            self.set_free(p);
        }
        if n == 1 && self.recent.len() < RECENT_MAX {
            self.recent.push(start);
        }
    }

    /// Frees a run once the grace period has passed.
    pub fn free_later(&mut self, start: u64, n: u64) {
        if self.grace.is_zero() {
            self.free_now(start, n);
        } else {
            self.deferred.push_back((Instant::now(), start, n));
            self.deferred_pages += n;
        }
    }

    /// Returns expired deferred frees to the pool (all of them if `all`). True if any.
    pub fn reclaim(&mut self, all: bool) -> bool {
        let mut any = false;
        while let Some(&(t, start, n)) = self.deferred.front() {
            let age = t.elapsed();
            if age < self.grace {
                if !all {
                    break;
                }
                // Out of space: wait out the rest of this grace period rather than fail.
                std::thread::sleep(self.grace - age);
            }
            self.deferred.pop_front();
            self.deferred_pages -= n;
            self.free_now(start, n);
            any = true;
        }
        any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::NO_LOG_PAGES;

    #[test]
    fn runs_reserve_and_grace() {
        let mut a = PageAllocator::new(100, 10, Duration::ZERO);
        let (s, n) = a.alloc_run(8, false).unwrap();
        assert_eq!((s, n), (0, 8));
        assert_eq!(a.free(), 92);
        while a.alloc(false).is_some() {}
        assert_eq!(a.free(), 10, "the reserve is kept for freeing operations");
        assert!(a.alloc(true).is_some());
        a.free_now(0, 8);
        assert_eq!(a.free(), 17);
        let mut g = PageAllocator::new(2, 0, Duration::from_millis(20));
        let p = g.alloc(false).unwrap();
        let q = g.alloc(false).unwrap();
        g.free_later(p, 1);
        assert!(g.is_used(q) && g.is_used(p), "still in its grace period");
        let r = g
            .alloc(false)
            .expect("a full pool waits out the grace period");
        assert_eq!(r, p);
    }

    #[test]
    fn an_allocator_that_never_waits_fails_until_the_grace_is_over() {
        let grace = Duration::from_millis(200);
        let mut g = PageAllocator::new(2, 0, grace).never_waits();
        let p = g.alloc(false).unwrap();
        let _q = g.alloc(false).unwrap();
        // The free is stamped between these two instants.
        let before = Instant::now();
        g.free_later(p, 1);
        let after = Instant::now();
        assert_eq!((g.free(), g.in_grace()), (1, 1));
        while before.elapsed() < grace {
            let got = g.alloc(false);
            // Past `before`'s grace the page may come back: the check stops there.
            if before.elapsed() < grace {
                assert_eq!(got, None, "a page in its grace period was handed out");
            }
            if got.is_some() {
                return;
            }
        }
        while after.elapsed() < grace {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(g.alloc(false), Some(p), "the page after its grace period");
        assert_eq!(g.in_grace(), 0);
    }

    /// A failed allocation is "try again" only where there is room to wait for and
    /// the allocator does not wait for it itself.
    #[test]
    fn out_of_room_is_eagain_only_while_pages_are_in_their_grace_period() {
        let hour = Duration::from_secs(3600);
        let eagain = FsError::Errno(libc::EAGAIN);
        let mut g = PageAllocator::new(3, 0, hour).never_waits();
        let p = g.alloc(false).unwrap();
        let q = g.alloc(false).unwrap();
        let _r = g.alloc(false).unwrap();
        assert_eq!(g.alloc(false), None);
        assert_eq!(g.out_of_room(1, false), NO_LOG_PAGES, "nothing is coming");
        assert_eq!(g.room_for(1, false), Err(NO_LOG_PAGES));
        g.free_later(p, 1);
        assert_eq!(g.alloc(false), None, "in its grace period for an hour");
        assert_eq!(g.out_of_room(1, false), eagain);
        assert_eq!(g.room_for(1, false), Err(eagain.clone()));
        assert_eq!(
            g.room_for(2, false),
            Err(NO_LOG_PAGES),
            "one page is coming, not two"
        );
        g.free_later(q, 1);
        assert_eq!(g.room_for(2, false), Err(eagain.clone()));
        // 40 pages, a reserve of 10 (a quarter at most): 30 taken outside it, and
        // one of it, leave 9 free.
        let mut r = PageAllocator::new(40, 10, hour).never_waits();
        let taken: Vec<u64> = (0..30).map(|_| r.alloc(false).unwrap()).collect();
        assert_eq!(r.room_for(1, false), Err(NO_LOG_PAGES));
        assert_eq!(r.room_for(10, true), Ok(()), "the reserve is there to take");
        r.alloc(true).unwrap();
        assert_eq!(r.room_for(10, true), Err(NO_LOG_PAGES));
        r.free_later(taken[0], 1);
        let nine_and_one = "9 free and 1 coming are not above the reserve";
        assert_eq!(r.out_of_room(1, false), NO_LOG_PAGES, "{nine_and_one}");
        assert_eq!(r.out_of_room(1, true), eagain);
        r.free_later(taken[1], 1);
        assert_eq!(r.out_of_room(1, false), eagain, "9 free and 2 coming are");
        // A waiting allocator sleeps the grace out in `room_for`, if that makes room.
        let grace = Duration::from_millis(30);
        let mut w = PageAllocator::new(2, 0, grace);
        let p = w.alloc(false).unwrap();
        let _q = w.alloc(false).unwrap();
        let waiting = "a waiting allocator's failure is final";
        assert_eq!(w.out_of_room(1, false), NO_LOG_PAGES, "{waiting}");
        assert_eq!(
            w.room_for(1, false),
            Err(NO_LOG_PAGES),
            "nothing to wait for"
        );
        let before = Instant::now();
        w.free_later(p, 1);
        assert_eq!(
            w.room_for(2, false),
            Err(NO_LOG_PAGES),
            "waiting makes one page"
        );
        assert_eq!(w.room_for(1, false), Ok(()));
        assert!(before.elapsed() >= grace, "it slept the grace period out");
        assert_eq!(w.in_grace(), 0);
        assert_eq!(
            w.alloc(false),
            Some(p),
            "the page back from its grace period"
        );
    }
}
