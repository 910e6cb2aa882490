//! Strong data consistency (paper §5.3): a commit that names data pages applies only
//! once every store of their groups has reported the pages persisted. Such a commit
//! is parked here, not refused: stores' notices wake it, and a deadline fails it with
//! a message naming the groups that did not answer. A notice can be lost (it was in
//! flight when the store's connection to the MDS broke): an update whose notices are
//! overdue asks its stores again, but only the store incarnations that were serving
//! when it parked, since only they received its writes (a restarted store may have
//! lost pages it never persisted, and must not vouch for them). This module owns the
//! waiting state; the server applies what becomes ready and sends the requests.

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
    /// The incarnation of each group's store when the update parked.
    incarnations: Vec<(u16, u64)>,
    /// When to ask the stores again for the pages still missing.
    ask_at: Instant,
    ask_every: Duration,
}

/// How long a notice may take before the stores are asked again (notices take
/// microseconds; this only matters when one was lost), doubling after each ask.
const FIRST_ASK: Duration = Duration::from_millis(50);

/// Pages to ask a store to persist again, because an update waits for them.
#[derive(Debug, PartialEq, Eq)]
pub struct Ask {
    pub group: u16,
    /// The store incarnation that received the writes.
    pub incarnation: u64,
    pub pages: Vec<Gpa>,
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
    /// `incarnation` tells which store incarnation serves a group now.
    pub fn park(
        &mut self,
        conn: ConnId,
        id: u64,
        update: Waiting,
        pages: Vec<Gpa>,
        incarnation: impl Fn(u16) -> Option<u64>,
    ) {
        debug_assert!(!self.ready(&pages), "a ready update is applied, not parked");
        let now = Instant::now();
        let mut incarnations: Vec<(u16, u64)> = pages
            .iter()
            .filter_map(|g| Some((g.group(), incarnation(g.group())?)))
            .collect();
        incarnations.sort_unstable();
        incarnations.dedup();
        self.parked.push_back(Parked {
            conn,
            id,
            update,
            pages,
            deadline: now + self.timeout,
            incarnations,
            ask_at: now + FIRST_ASK,
            ask_every: FIRST_ASK,
        });
    }

    /// The pages still missing of the parked updates whose notices are overdue, by
    /// group and the incarnation that received them; each such update is asked for
    /// again after twice as long.
    pub fn take_overdue(&mut self, now: Instant) -> Vec<Ask> {
        let mut asks: Vec<Ask> = Vec::new();
        for p in self.parked.iter_mut().filter(|p| p.ask_at <= now) {
            p.ask_every *= 2;
            p.ask_at = now + p.ask_every;
            for g in p.pages.iter().filter(|g| !self.persisted.contains(g)) {
                let Some(&(_, inc)) = p.incarnations.iter().find(|(gr, _)| *gr == g.group()) else {
                    continue; // no store served the group when the update parked
                };
                match asks
                    .iter_mut()
                    .find(|a| a.group == g.group() && a.incarnation == inc)
                {
                    Some(a) => a.pages.push(*g),
                    None => asks.push(Ask {
                        group: g.group(),
                        incarnation: inc,
                        pages: vec![*g],
                    }),
                }
            }
        }
        for a in &mut asks {
            a.pages.sort_unstable();
            a.pages.dedup();
        }
        asks
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parked(w: &mut StrongWaits, pages: Vec<Gpa>, serving: impl Fn(u16) -> Option<u64>) {
        let c = Create {
            parent: 1,
            name: b"x".to_vec(),
            ftype: orion_format::FileType::Symlink,
            mode: 0o777,
            uid: 0,
            gid: 0,
            rdev: 0,
            symlink: None,
        };
        w.park(1, 7, Waiting::Create(c), pages, serving);
    }

    #[test]
    fn overdue_pages_are_asked_of_the_incarnation_that_received_them() {
        let mut w = StrongWaits::new(Duration::from_secs(5));
        let (a, b, c) = (Gpa::new(1, 10), Gpa::new(1, 11), Gpa::new(2, 5));
        // Group 1 is served by incarnation 77; group 2 had no store when it parked.
        parked(&mut w, vec![a, b, c], |g| (g == 1).then_some(77));
        w.persisted([b]);
        let now = Instant::now();
        assert!(w.take_overdue(now).is_empty(), "not overdue yet");
        let asks = w.take_overdue(now + FIRST_ASK);
        assert_eq!(
            asks,
            vec![Ask {
                group: 1,
                incarnation: 77,
                pages: vec![a]
            }],
            "only the missing page, of the group a store served"
        );
        assert!(
            w.take_overdue(now + FIRST_ASK * 2).is_empty(),
            "asked again only after twice as long"
        );
        assert_eq!(w.take_overdue(now + FIRST_ASK * 3).len(), 1);
        w.persisted([a, c]);
        assert!(w.take_next_ready().is_some());
        assert!(w.take_overdue(now + FIRST_ASK * 100).is_empty());
    }
}
