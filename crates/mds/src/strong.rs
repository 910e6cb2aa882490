//! Strong data consistency (paper §5.3): a commit that names data pages applies only
//! once every member of their groups that takes writes has reported the pages
//! persisted. Such a commit is parked here, not refused: stores' notices wake it, and
//! a deadline fails it with a message naming the groups that did not answer.
//!
//! A notice can be lost (it was in flight when the store's connection to the MDS
//! broke): an update whose notices are overdue has its stores asked again. Only
//! members of the cluster map's current epoch are asked, and a change of the map
//! refuses every parked update that a member taking writes now did not take (see
//! [`StrongWaits::take_stale`]), so the store asked is the incarnation that received
//! the writes: a restarted store, which may have lost pages it never persisted, joins
//! anew, and never vouches for them. This module owns the waiting state; the
//! server applies what becomes ready and sends the requests.

use orion_meta::FastMap;
use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use orion_fabric::ConnId;
use orion_format::Gpa;
use orion_proto::{Commit, Create, Epoch, MemberId};

/// An update that may wait for its data pages.
pub enum Waiting {
    Commit(Commit),
    /// A symlink's create (its target page).
    Create(Create),
}

/// An update that names data pages, on its way to being applied.
pub struct Pending {
    pub update: Waiting,
    /// The pages whose notices it waits for (strong mode; none in weak mode).
    pub pages: Vec<Gpa>,
    /// The groups of all its data pages.
    pub groups: Vec<u16>,
    /// The cluster map epoch its pages were written under.
    pub written: Epoch,
}

/// An update waiting for data stores to report its pages persisted.
pub struct Parked {
    pub conn: ConnId,
    pub id: u64,
    pub update: Waiting,
    pub pages: Vec<Gpa>,
    /// The groups of all its data pages (awaited or not): none may apply while one
    /// is unsettled (a store left it within the map lease).
    pub groups: Vec<u16>,
    /// The cluster map epoch its pages were written under.
    pub written: Epoch,
    deadline: Instant,
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
    pub member: MemberId,
    pub pages: Vec<Gpa>,
}

/// Which replicas of its group (a bit per replica index) reported a page persisted.
type Reporters = u64;

/// What decides whether a parked update applies, from the cluster map.
pub struct Gates<'a> {
    /// The replicas of a group whose notices a page needs (a bit per replica index;
    /// none at all when the group's replicas are durable on delivery), or `None`
    /// when no replica of the group takes writes.
    pub needs: &'a dyn Fn(u16) -> Option<Reporters>,
    /// Whether a group is settled: no store left it within the map lease.
    pub settled: &'a dyn Fn(u16) -> bool,
}

/// What the stores reported persisted, and the updates waiting for it.
pub struct StrongWaits {
    /// Pages reported persisted that no update has consumed yet.
    persisted: FastMap<Gpa, Reporters>,
    parked: VecDeque<Parked>,
    /// Updates ever parked (for the metrics).
    parked_ever: u64,
    timeout: Duration,
}

impl StrongWaits {
    pub fn new(timeout: Duration) -> StrongWaits {
        StrongWaits {
            persisted: FastMap::default(),
            parked: VecDeque::new(),
            parked_ever: 0,
            timeout,
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Updates waiting now, and ever parked.
    pub fn waiting(&self) -> (usize, u64) {
        (self.parked.len(), self.parked_ever)
    }

    /// A notice of replica `index` of the pages' group: these pages are durable on it.
    pub fn persisted(&mut self, index: u16, pages: impl IntoIterator<Item = Gpa>) {
        for g in pages {
            let bit = MemberId::new(g.group(), index).bit();
            *self.persisted.entry(g).or_default() |= bit;
        }
    }

    /// Whether every page is reported persisted by every replica `needs(group)`
    /// names (a bit per replica index; a group with no writer is never ready).
    pub fn ready(&self, pages: &[Gpa], needs: impl Fn(u16) -> Option<Reporters>) -> bool {
        pages.iter().all(|g| match needs(g.group()) {
            None => false,
            Some(0) => true,
            Some(want) => self.persisted.get(g).is_some_and(|&got| got & want == want),
        })
    }

    fn applies(&self, p: &Parked, gates: &Gates<'_>) -> bool {
        p.groups.iter().all(|&g| (gates.settled)(g)) && self.ready(&p.pages, gates.needs)
    }

    /// Consumes the notices of pages an update used (whether it applied or failed).
    pub fn consume(&mut self, pages: &[Gpa]) {
        for g in pages {
            self.persisted.remove(g);
        }
    }

    /// Parks an update until its pages are reported persisted or its deadline passes.
    pub fn park(&mut self, conn: ConnId, id: u64, pending: Pending) {
        let Pending {
            update,
            pages,
            groups,
            written,
        } = pending;
        // `groups` gates the pages' notices (`applies`), and names them when they expire.
        debug_assert!(
            pages.iter().all(|g| groups.contains(&g.group())),
            "an update waits for pages outside its groups"
        );
        let now = Instant::now();
        self.parked_ever += 1;
        self.parked.push_back(Parked {
            conn,
            id,
            update,
            pages,
            groups,
            written,
            deadline: now + self.timeout,
            ask_at: now + FIRST_ASK,
            ask_every: FIRST_ASK,
        });
    }

    /// The pages still missing of the parked updates whose notices are overdue, by
    /// the member (of `needs`) that has not reported them; each such update is
    /// asked for again after twice as long.
    pub fn take_overdue(
        &mut self,
        now: Instant,
        needs: impl Fn(u16) -> Option<Reporters>,
    ) -> Vec<Ask> {
        let mut asks: Vec<Ask> = Vec::new();
        for p in self.parked.iter_mut().filter(|p| p.ask_at <= now) {
            p.ask_every *= 2;
            p.ask_at = now + p.ask_every;
            for g in &p.pages {
                let got = self.persisted.get(g).copied().unwrap_or(0);
                let missing = needs(g.group()).unwrap_or(0) & !got;
                for member in MemberId::in_mask(g.group(), missing) {
                    match asks.iter_mut().find(|a| a.member == member) {
                        Some(a) => a.pages.push(*g),
                        None => asks.push(Ask {
                            member,
                            pages: vec![*g],
                        }),
                    }
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
    pub fn take_next_ready(&mut self, gates: &Gates<'_>) -> Option<Parked> {
        let i = self.parked.iter().position(|p| self.applies(p, gates))?;
        self.parked.remove(i)
    }

    /// The parked updates whose deadline passed, each with the groups that did not
    /// report all of its pages.
    pub fn take_expired(&mut self, now: Instant, gates: &Gates<'_>) -> Vec<(Parked, Vec<u16>)> {
        let mut out = Vec::new();
        while let Some(i) = self.parked.iter().position(|p| p.deadline <= now) {
            let p = self.parked.remove(i).expect("index in range");
            let unsettled = p.groups.iter().copied().filter(|&g| !(gates.settled)(g));
            let mut groups: Vec<u16> = p
                .pages
                .iter()
                .filter(|g| !self.ready(std::slice::from_ref(g), gates.needs))
                .map(|g| g.group())
                .chain(unsettled)
                .collect::<HashSet<_>>()
                .into_iter()
                .collect();
            groups.sort_unstable();
            self.consume(&p.pages);
            out.push((p, groups));
        }
        out
    }

    /// The parked updates `stale` picks (the cluster map changed: a store that takes
    /// writes now did not take theirs; the server refuses them, their clients write
    /// again). Their notices go with them.
    pub fn take_stale(&mut self, stale: impl Fn(&Parked) -> bool) -> Vec<Parked> {
        let (out, keep): (Vec<Parked>, Vec<Parked>) = self.parked.drain(..).partition(stale);
        self.parked = keep.into();
        for p in &out {
            for g in &p.pages {
                self.persisted.remove(g);
            }
        }
        out
    }

    /// A client left: its parked updates will never be answered.
    pub fn forget_client(&mut self, conn: ConnId) {
        self.parked.retain(|p| p.conn != conn);
    }

    /// A member left: its notices are void (a replacement at its place, or a page
    /// written again later, must report anew).
    pub fn forget_member(&mut self, member: MemberId) {
        let bit = member.bit();
        self.persisted.retain(|g, got| {
            if g.group() == member.group {
                *got &= !bit;
            }
            *got != 0
        });
    }

    /// Pages that went back to their group (never committed), or were granted anew:
    /// their notices are void.
    pub fn forget_pages(&mut self, start: Gpa, n: u64) {
        for k in 0..n {
            self.persisted.remove(&start.offset_by(k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(pages: Vec<Gpa>, groups: Vec<u16>, written: Epoch) -> Pending {
        Pending {
            update: create(),
            pages,
            groups,
            written,
        }
    }

    fn create() -> Waiting {
        Waiting::Create(Create {
            parent: 1,
            name: b"x".to_vec(),
            ftype: orion_format::FileType::Symlink,
            mode: 0o777,
            uid: 0,
            gid: 0,
            rdev: 0,
            symlink: None,
        })
    }

    #[test]
    fn an_update_waits_for_every_writer_and_asks_the_silent_ones_again() {
        let mut w = StrongWaits::new(Duration::from_secs(5));
        let (a, b, c) = (Gpa::new(1, 10), Gpa::new(1, 11), Gpa::new(2, 5));
        // Group 1 has replicas 0 and 1 taking writes; group 2 only replica 0.
        let writers = |g: u16| Some(if g == 1 { 0b11 } else { 0b01 });
        let settled = |_: u16| true;
        let gates = Gates {
            needs: &writers,
            settled: &settled,
        };
        w.park(1, 7, pending(vec![a, b, c], vec![1, 2], 1));
        w.persisted(0, [a, b, c]);
        w.persisted(1, [b]);
        assert!(w.take_next_ready(&gates).is_none(), "replica 1 owes page a");
        let now = Instant::now();
        assert!(w.take_overdue(now, writers).is_empty(), "not overdue yet");
        let asks = w.take_overdue(now + FIRST_ASK, writers);
        assert_eq!(
            asks,
            vec![Ask {
                member: MemberId::new(1, 1),
                pages: vec![a]
            }],
            "only the missing page, of the replica that owes it"
        );
        assert!(
            w.take_overdue(now + FIRST_ASK * 2, writers).is_empty(),
            "asked again only after twice as long"
        );
        assert_eq!(w.take_overdue(now + FIRST_ASK * 3, writers).len(), 1);
        // Replica 1 of group 1 goes down: group 1 needs replica 0 alone, once the
        // group has settled (no client reads by a map naming replica 1 any more).
        let one = |_: u16| Some(0b01);
        let unsettled = |g: u16| g != 1;
        let gated = Gates {
            needs: &one,
            settled: &unsettled,
        };
        assert!(
            w.take_next_ready(&gated).is_none(),
            "group 1 is not settled"
        );
        let open = Gates {
            needs: &one,
            settled: &settled,
        };
        assert!(w.take_next_ready(&open).is_some());
        assert!(w.take_overdue(now + FIRST_ASK * 100, writers).is_empty());
    }

    #[test]
    fn a_group_with_no_writer_is_never_ready_and_a_map_change_takes_stale_updates() {
        let mut w = StrongWaits::new(Duration::from_secs(5));
        let a = Gpa::new(3, 1);
        w.persisted(0, [a]);
        assert!(!w.ready(&[a], |_| None));
        assert!(w.ready(&[a], |_| Some(1)));
        assert!(
            !w.ready(&[a], |_| Some(0b11)),
            "replica 1 did not report it"
        );
        assert!(
            w.ready(&[a, Gpa::new(3, 2)], |_| Some(0)),
            "replicas durable on delivery owe no notice"
        );
        w.park(1, 1, pending(vec![a], vec![3], 4));
        w.park(2, 2, pending(vec![a], vec![3], 5));
        assert_eq!(w.take_stale(|p| p.written < 5).len(), 1);
        assert!(!w.ready(&[a], |_| Some(1)), "its notices went with it");
        assert_eq!(w.take_stale(|_| true).len(), 1);
    }
}
