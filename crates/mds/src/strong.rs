//! Strong data consistency (paper §5.3): a commit that names data pages applies only
//! once every store of their groups has reported the pages persisted. Such a commit
//! is parked here, not refused: stores' notices wake it, and a deadline fails it with
//! a message naming the groups that did not answer. This module owns the waiting
//! state; the server applies what becomes ready.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use orion_fabric::ConnId;
use orion_format::Gpa;
use orion_proto::{Commit, Create};

/// An update that may wait for its data pages.
pub enum Waiting {
    Commit(Commit),
    /// A symlink's create (its target page).
    Create(Create),
}

/// An update waiting for data stores to report its pages persisted.
pub struct Parked {
    pub conn: ConnId,
    pub id: u64,
    pub update: Waiting,
    pub pages: Vec<Gpa>,
    deadline: Instant,
}

/// What the stores reported persisted, and the updates waiting for it.
pub struct StrongWaits {
    /// Pages reported persisted that no update has consumed yet.
    persisted: HashSet<Gpa>,
    parked: VecDeque<Parked>,
    timeout: Duration,
}

impl StrongWaits {
    pub fn new(timeout: Duration) -> StrongWaits {
        StrongWaits {
            persisted: HashSet::new(),
            parked: VecDeque::new(),
            timeout,
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A store's notice: these pages are durable on it.
    pub fn persisted(&mut self, pages: impl IntoIterator<Item = Gpa>) {
        self.persisted.extend(pages);
    }

    /// Whether every page is reported persisted.
    pub fn ready(&self, pages: &[Gpa]) -> bool {
        pages.iter().all(|g| self.persisted.contains(g))
    }

    /// Consumes the notices of pages an update used (whether it applied or failed).
    pub fn consume(&mut self, pages: &[Gpa]) {
        for g in pages {
            self.persisted.remove(g);
        }
    }

    /// Parks an update until its pages are reported persisted or its deadline passes.
    pub fn park(&mut self, conn: ConnId, id: u64, update: Waiting, pages: Vec<Gpa>) {
        debug_assert!(!self.ready(&pages), "a ready update is applied, not parked");
        let deadline = Instant::now() + self.timeout;
        self.parked.push_back(Parked {
            conn,
            id,
            update,
            pages,
            deadline,
        });
    }

    /// The first parked update (in arrival order) whose pages are all persisted now.
    /// One at a time: applying it consumes its pages' notices, so a later update
    /// naming the same pages waits for notices of its own.
    pub fn take_next_ready(&mut self) -> Option<Parked> {
        let i = self.parked.iter().position(|p| self.ready(&p.pages))?;
        self.parked.remove(i)
    }

    /// The parked updates whose deadline passed, each with the groups that did not
    /// report all of its pages.
    pub fn take_expired(&mut self, now: Instant) -> Vec<(Parked, Vec<u16>)> {
        let mut out = Vec::new();
        while let Some(i) = self.parked.iter().position(|p| p.deadline <= now) {
            let p = self.parked.remove(i).expect("index in range");
            let mut groups: Vec<u16> = p
                .pages
                .iter()
                .filter(|g| !self.persisted.contains(g))
                .map(|g| g.group())
                .collect::<HashSet<_>>()
                .into_iter()
                .collect();
            groups.sort_unstable();
            assert!(
                !groups.is_empty(),
                "an expired update was missing some page"
            );
            self.consume(&p.pages);
            out.push((p, groups));
        }
        out
    }

    /// A client left: its parked updates will never be answered.
    pub fn forget_client(&mut self, conn: ConnId) {
        self.parked.retain(|p| p.conn != conn);
    }

    /// Pages that went back to their group (never committed): their notices are void.
    pub fn forget_pages(&mut self, start: Gpa, n: u64) {
        for k in 0..n {
            self.persisted.remove(&start.offset_by(k));
        }
    }
}
