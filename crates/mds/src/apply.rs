//! Applying updates that name data pages (paper §5.3): at once when every store
//! that takes their writes reported the pages persisted, else parked in
//! [`StrongWaits`] until the notices come, the stores are asked again, or the
//! deadline fails them.

use std::time::{Duration, Instant};

use orion_fabric::ConnId;
use orion_format::Gpa;
use orion_meta::FsError;
use orion_proto::{Reply, ReplyBody};
use tracing::warn;

use crate::server::{errno_reply, notices_needed, Mds};
use crate::strong::{Gates, Pending, Waiting};
use crate::{commit, namespace};

/// Whether `reply`, the answer to a client's update (`MdsRequest::changes_state`),
/// refuses it for room: the engine found free log pages only in their grace period,
/// changed nothing, and the client sends the update again (design note 74). Such a
/// refusal is not remembered as the update's outcome. (No update is answered EAGAIN
/// for another reason; other requests are: a lock taken, a grant to wait for.)
pub(crate) fn refused_for_room(reply: &Reply) -> bool {
    matches!(reply, Reply::Err { errno, .. } if *errno == libc::EAGAIN)
}

impl Mds {
    /// Applies an update whose data pages are persisted, or parks it until they are
    /// ([`StrongWaits`]).
    pub(crate) fn apply_or_park(&mut self, conn: ConnId, id: u64, p: Pending) -> Option<Reply> {
        let (map, lease) = (&self.map, self.map_lease());
        let settled = p.groups.iter().all(|&g| map.settled(g, lease));
        if settled && self.strong.ready(&p.pages, |g| notices_needed(map, g)) {
            return Some(self.apply_ready(conn, p));
        }
        self.strong.park(conn, id, p);
        None
    }

    fn map_lease(&self) -> Duration {
        Duration::from_millis(self.cfg.map_lease_ms)
    }

    /// Applies an update whose pages are persisted, using up their notices: also
    /// when it fails, and when it is refused for room (design note 74). Kept, they
    /// would vouch for a later write of the same pages, which a client that gave
    /// up the update makes into them; so the update's next turn waits for the
    /// stores to be asked again.
    fn apply_ready(&mut self, conn: ConnId, p: Pending) -> Reply {
        self.strong.consume(&p.pages);
        // The map may have changed since the update parked: every store that takes
        // writes now must have taken its pages.
        if let Err(e) = self.check_written(p.written, &p.groups) {
            return errno_reply(e);
        }
        // Replicas that do not take these writes miss them: recorded (durably) before
        // the commit, since a crash between the two must not leave one taken for in
        // sync that lacks it (a needless mark costs a resync, no more).
        for &g in &p.groups {
            let of_g = move |x: &Gpa| x.group() == g;
            let r = match &p.update {
                Waiting::Commit(c) => self
                    .map
                    .committed_to(g, commit::data_pages(c).filter(of_g).map(|x| x.page())),
                Waiting::Create(c) => {
                    let page = c.symlink.iter().map(|s| s.0);
                    self.map
                        .committed_to(g, page.filter(of_g).map(|x| x.page()))
                }
            };
            if let Err(e) = r {
                return errno_reply(FsError::Io(format!(
                    "recording that group {g}'s absent replicas miss this commit: {e:#}"
                )));
            }
        }
        let Some(peer) = self.peers.get_mut(&conn) else {
            return errno_reply(FsError::Io("client gone".into()));
        };
        let r = match p.update {
            Waiting::Commit(c) => commit::apply(&mut self.engine, &mut peer.grants, c)
                .map(|(prev, tail)| ReplyBody::Committed { prev, tail }),
            Waiting::Create(c) => {
                // Checked again: another parked create may have used the page meanwhile.
                let page_ok = match c.symlink {
                    Some((g, ..)) => peer.grants.check(g, 1),
                    None => Ok(()),
                };
                let r = page_ok.and_then(|_| namespace::create(&mut self.engine, &c));
                if let (Ok(_), Some((g, ..))) = (&r, c.symlink) {
                    peer.grants.commit(g, 1);
                }
                r
            }
        };
        self.release_freed();
        match r {
            Ok(b) => Reply::Ok(b),
            Err(e) => errno_reply(e),
        }
    }

    /// Applies and answers the parked updates whose pages are now persisted.
    pub(crate) fn apply_unparked(&mut self) {
        loop {
            let (map, lease) = (&self.map, self.map_lease());
            let gates = Gates {
                needs: &|g| notices_needed(map, g),
                settled: &|g| map.settled(g, lease),
            };
            let Some(p) = self.strong.take_next_ready(&gates) else {
                break;
            };
            let pending = Pending {
                update: p.update,
                pages: p.pages,
                groups: p.groups,
                written: p.written,
            };
            let reply = self.apply_ready(p.conn, pending);
            self.reply(p.conn, p.id, reply);
        }
    }

    /// Asks stores again for overdue notices (see [`StrongWaits`]), and fails the
    /// parked updates whose stores did not answer in time.
    pub(crate) fn expire_parked(&mut self, now: Instant) {
        // Groups settle with time (a departed store's map lease runs out).
        self.apply_unparked();
        let map = &self.map;
        for ask in self.strong.take_overdue(now, |g| notices_needed(map, g)) {
            self.ask_to_persist(ask);
        }
        let (map, lease) = (&self.map, self.map_lease());
        let gates = Gates {
            needs: &|g| notices_needed(map, g),
            settled: &|g| map.settled(g, lease),
        };
        for (p, groups) in self.strong.take_expired(now, &gates) {
            warn!("a commit waited too long for data stores of groups {groups:?}");
            let msg = format!(
                "the data stores of groups {groups:?} did not report the written pages \
                 persisted within {} ms: is every data store up?",
                self.strong.timeout().as_millis()
            );
            self.reply(p.conn, p.id, errno_reply(FsError::Io(msg)));
        }
    }
}
