//! Free inode numbers. A freed number comes back only after the grace period, as a
//! freed log page does: an inode's first log segment sits at a place fixed by its
//! number, so the next inode of that number writes where a reader of the old one
//! (a client's one-sided walk, paper §4.2) may still be reading. Numbers go round
//! first in first out, so one is reused as late as the table allows.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::error::{FsError, FsResult, NO_INODE_SLOTS};

pub struct FreeInodes {
    ready: VecDeque<u64>,
    /// Numbers freed and when, oldest first.
    in_grace: VecDeque<(Instant, u64)>,
    grace: Duration,
    /// Whether taking a number when only numbers in their grace period are left
    /// sleeps the grace out (a local file system) or answers EAGAIN (the MDS, whose
    /// one loop never sleeps; see `PageAllocator::never_waits`).
    waits: bool,
}

impl FreeInodes {
    /// `ready`: the numbers free now, in the order to hand them out.
    pub fn new(ready: VecDeque<u64>, grace: Duration, waits: bool) -> FreeInodes {
        FreeInodes {
            ready,
            in_grace: VecDeque::new(),
            grace,
            waits,
        }
    }

    /// Free numbers, those in their grace period included.
    pub fn count(&self) -> usize {
        self.ready.len() + self.in_grace.len()
    }

    /// Free numbers still in their grace period.
    pub fn in_grace(&self) -> usize {
        self.in_grace.len()
    }

    /// Whether `ino` is free (a check of invariants: costs a scan).
    pub fn contains(&self, ino: u64) -> bool {
        self.ready.contains(&ino) || self.in_grace.iter().any(|&(_, i)| i == ino)
    }

    /// Fails when no number can be taken now: ENOSPC when none is free, EAGAIN when
    /// all that are wait out their grace period and this table does not wait.
    pub fn room(&mut self) -> FsResult<()> {
        self.reclaim(false);
        if self.ready.is_empty() && !self.in_grace.is_empty() && self.waits {
            self.reclaim(true);
        }
        match (self.ready.is_empty(), self.in_grace.is_empty()) {
            (false, _) => Ok(()),
            (true, true) => Err(NO_INODE_SLOTS),
            (true, false) => Err(FsError::Errno(libc::EAGAIN)),
        }
    }

    /// Takes the number freed longest ago.
    pub fn take(&mut self) -> FsResult<u64> {
        self.room()?;
        Ok(self.ready.pop_front().expect("room() found one"))
    }

    /// Gives back a number nobody has seen (a create that failed before its inode
    /// was written): it is taken next.
    pub fn untake(&mut self, ino: u64) {
        debug_assert!(!self.contains(ino), "inode {ino} freed twice");
        self.ready.push_front(ino);
    }

    /// Frees a number once the grace period has passed.
    pub fn free_later(&mut self, ino: u64) {
        debug_assert!(!self.contains(ino), "inode {ino} freed twice");
        match self.grace.is_zero() {
            true => self.ready.push_back(ino),
            false => self.in_grace.push_back((Instant::now(), ino)),
        }
    }

    /// Moves numbers whose grace period ended to the ready ones; with `wait`, first
    /// sleeps out the rest of the oldest one's grace, so that at least one is ready.
    fn reclaim(&mut self, wait: bool) {
        if let Some(&(t, _)) = self.in_grace.front().filter(|_| wait) {
            std::thread::sleep(self.grace.saturating_sub(t.elapsed()));
        }
        while let Some(&(t, ino)) = self.in_grace.front() {
            if t.elapsed() < self.grace {
                break;
            }
            self.in_grace.pop_front();
            self.ready.push_back(ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_number_waits_out_the_grace_and_comes_back_last() {
        let grace = Duration::from_millis(30);
        let mut f = FreeInodes::new([5, 6].into(), grace, false);
        assert_eq!(f.take().unwrap(), 5);
        f.free_later(5);
        assert_eq!(f.take().unwrap(), 6);
        // Only 5 is free, and it is in its grace period: try again, not ENOSPC.
        assert_eq!(f.take(), Err(FsError::Errno(libc::EAGAIN)));
        assert_eq!(f.count(), 1);
        std::thread::sleep(grace);
        assert_eq!(f.take().unwrap(), 5);
        assert_eq!(f.take(), Err(NO_INODE_SLOTS));
        f.untake(5);
        assert!(f.contains(5));
    }

    #[test]
    fn a_table_that_waits_sleeps_the_grace_out() {
        let mut f = FreeInodes::new(VecDeque::new(), Duration::from_millis(5), true);
        f.free_later(9);
        assert_eq!(f.take().unwrap(), 9);
        let mut now = FreeInodes::new(VecDeque::new(), Duration::ZERO, false);
        now.free_later(3);
        assert_eq!(now.take().unwrap(), 3);
    }
}
