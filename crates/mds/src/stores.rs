//! The MDS's side of the data stores: joins and departures of replication-group
//! members (the cluster map, [`crate::members`]), their `Persisted` notices, the
//! requests to persist again, resync plans, and the epoch rule every update that names
//! data pages obeys.
//!
//! A member that joins without every committed page of its group resyncs: it takes
//! writes at once (clients write to it from the new epoch on), and copies from an
//! in-sync peer the pages the engine named when it joined (only those it missed, when
//! the map knows them: `Member::missed`). Those pages cannot change
//! during the copy (data is copy-on-write, and pages freed meanwhile are held, not
//! reused, see [`Group::hold`]); pages written later reach it from the clients.

use std::time::{Duration, Instant};

use orion_fabric::ConnId;
use orion_format::Gpa;
use orion_meta::{FsError, FsResult};
use orion_proto::{
    DsHello, Epoch, MemberId, MemberState, ReplyBody, StoreRequest, MAX_PERSISTED, MAX_PLAN_WORDS,
};
use tracing::{info, warn};

use crate::chunks::{self, Group};
use crate::members::{Admission, WaitForPeer};
use crate::server::{errno_reply, Mds, Role};
use crate::strong::Ask;

/// The refusal of an update whose pages a store that takes writes now did not take
/// (`EREMCHG`, "remote address changed": clients write the pages again, to the stores
/// of the new map; no application sees it).
pub const MAP_CHANGED: FsError = FsError::Errno(libc::EREMCHG);

/// A resync under way: what the member copies, and from whom.
pub struct Resync {
    /// The pages the engine named when the member joined (those it missed, when
    /// known), ascending.
    pub pages: Vec<u64>,
    pub source: MemberId,
    /// How many of `pages` lie before the plan piece asked for last.
    pub passed: usize,
}

impl Resync {
    pub fn percent(&self) -> u8 {
        (self.passed * 100 / self.pages.len().max(1)).min(100) as u8
    }
}

impl Mds {
    pub(crate) fn join_store(&mut self, conn: ConnId, d: DsHello) -> FsResult<ReplyBody> {
        let ours = self.engine.superblock().cluster_uuid;
        let fresh = d.cluster_uuid == [0; 16];
        if !fresh && d.cluster_uuid != ours {
            return Err(FsError::Io(format!(
                "the data store's pool belongs to another cluster ({}) than this MDS's ({}): \
                 point the store at its own cluster's MDS, or format a new pool for it",
                orion_format::hex(&d.cluster_uuid),
                orion_format::hex(&ours)
            )));
        }
        if d.page_count > u32::MAX as u64 {
            return Err(FsError::Io(format!(
                "a data store of {} pages: at most 2^32 pages per store",
                d.page_count
            )));
        }
        if let Some(g) = self.groups.get(&d.group) {
            if g.page_count != d.page_count {
                return Err(FsError::Io(format!(
                    "group {} has {} pages per store and this store {}: every replica of a \
                     group has the same layout (and a store's pool keeps its size)",
                    d.group, g.page_count, d.page_count
                )));
            }
        }
        let id = MemberId::new(d.group, d.index);
        // The same place again while its old connection looks alive: the store
        // restarted before this MDS saw the old connection close. It is dead.
        if let Some(old) = self.map.get(id).and_then(|m| m.conn) {
            if self.map.get(id).is_some_and(|m| m.pool_uuid == d.pool_uuid) {
                self.drop_peer(old, "its store restarted and joined again");
            }
        }
        let admission = self.map.join(&d, fresh, conn).map_err(|e| {
            let errno = if e.downcast_ref::<WaitForPeer>().is_some() {
                libc::EAGAIN
            } else {
                libc::EIO
            };
            warn!("refused data store {} ({id}): {e:#}", d.addr);
            match errno {
                libc::EAGAIN => FsError::Errno(libc::EAGAIN),
                _ => FsError::Io(format!("{e:#}")),
            }
        })?;
        if d.restarted_host {
            warn!(
                "data store {id}'s host restarted since its pool last served: pages it was \
                 given and never flushed may be gone ({})",
                match admission {
                    Admission::Up => "no in-sync replica is up: it serves what it has",
                    Admission::Resync { .. } => "it copies every page from an in-sync replica",
                }
            );
        }
        if !self.groups.contains_key(&d.group) {
            // Pages freed before now go nowhere: the new allocator finds them free. A
            // page still in the engine's list would otherwise be freed twice.
            self.release_freed();
            let grace = Duration::from_millis(self.cfg.grace_ms);
            let g = Group::new(d.group, d.page_count, &self.engine, grace)?;
            self.groups.insert(d.group, g);
        }
        // Refused above if it differed: the pages named below are the group's.
        debug_assert_eq!(
            self.groups[&d.group].page_count, d.page_count,
            "a store joined a group of another layout"
        );
        let peer = self.peers.get_mut(&conn).expect("caller holds it");
        peer.role = Role::Store { member: id };
        let resync = match admission {
            Admission::Up => false,
            Admission::Resync { from } => {
                let mut pages = chunks::named_pages(&self.engine, d.group, d.page_count)?;
                // A store that holds whatever was delivered to it, back with the pool it
                // left with, needs only the pages committed while it was away (pages
                // of weak commits to other pools may not have reached its media).
                let missed = self.map.get(id).and_then(|m| m.missed.as_ref());
                let only = missed.filter(|_| d.durable_on_delivery);
                if let Some(set) = only {
                    pages.retain(|p| set.contains(p));
                }
                // `resync_plan` finds its place in them by bisection.
                debug_assert!(
                    pages.windows(2).all(|w| w[0] < w[1]),
                    "a resync's pages ascend, each once"
                );
                info!(
                    "{id} resyncs {} pages ({} MiB) from {from}{}",
                    pages.len(),
                    (pages.len() * 4096) >> 20,
                    if only.is_some() {
                        ": those committed while it was away"
                    } else {
                        ": every page in use"
                    }
                );
                self.groups.get_mut(&d.group).expect("inserted").hold();
                self.resyncs.insert(
                    id,
                    Resync {
                        pages,
                        source: from,
                        passed: 0,
                    },
                );
                true
            }
        };
        info!(
            "data store {id} joined from {} ({} pages, {}), epoch {}",
            d.addr,
            d.page_count,
            if resync { "resyncing" } else { "up" },
            self.map.epoch()
        );
        self.epoch_changed();
        Ok(ReplyBody::Joined {
            cluster_uuid: ours,
            resync,
            heartbeat_ms: self
                .heartbeat_period()
                .as_millis()
                .clamp(1, u32::MAX as u128) as u32,
        })
    }

    /// A store's connection closed.
    pub(crate) fn store_left(&mut self, conn: ConnId, member: MemberId, name: &str, why: &str) {
        match self.map.leave(conn) {
            Ok(Some(_)) => {}
            Ok(None) => return, // replaced already
            Err(e) => warn!("recording that {member} left: {e:#}"),
        }
        if self.resyncs.remove(&member).is_some() {
            self.release_held(member.group);
        }
        self.strong.forget_member(member);
        let left = self.map.writers(member.group).count();
        if left == 0 {
            warn!(
                "data store {member} ({name}) left: {why}; every replica of group {} is down: \
                 its pages cannot be read or written until one returns (epoch {})",
                member.group,
                self.map.epoch()
            );
        } else {
            warn!(
                "data store {member} ({name}) left: {why}; group {} goes on with {left} \
                 replica(s) (epoch {})",
                member.group,
                self.map.epoch()
            );
        }
        self.epoch_changed();
    }

    /// The map as a client on `host` gets it: the pool paths only of stores on that
    /// host (same boot id, `orion_proto::this_host`), the only ones it may map. A
    /// path is a hint the client checks against the pool's identity; the others
    /// would only fill the hello (a map of 1024 stores with their paths would not
    /// fit a message).
    pub(crate) fn stores_for_host(&self, host: [u8; 16]) -> Vec<orion_proto::StoreInfo> {
        let mut stores = self.stores_with_progress();
        for s in &mut stores {
            if host == [0; 16] || self.map.host_of(s.member) != Some(host) {
                s.pool_path.clear();
            }
        }
        stores
    }

    /// The cluster map as clients get it, with each resync's progress.
    pub(crate) fn stores_with_progress(&self) -> Vec<orion_proto::StoreInfo> {
        let mut stores = self.map.stores();
        for s in &mut stores {
            if let Some(r) = self.resyncs.get(&s.member) {
                s.resync_pct = r.percent();
            }
        }
        stores
    }

    /// How often stores send heartbeats (they learn it at join), and how often the
    /// MDS looks for silent ones: a quarter of the heartbeat timeout.
    pub(crate) fn heartbeat_period(&self) -> Duration {
        Duration::from_millis(self.cfg.heartbeat_timeout_ms / 4)
    }

    /// A data store that sent nothing (not even its heartbeat) for the configured
    /// time is taken for dead, as if its connection had closed: it may hang rather
    /// than crash, or be cut off.
    pub(crate) fn check_heartbeats(&mut self, now: Instant) {
        // A look every heartbeat period: a silent store is dropped within a
        // quarter of the timeout after it.
        if now < self.heartbeats_due {
            return;
        }
        self.heartbeats_due = now + self.heartbeat_period();
        let timeout = Duration::from_millis(self.cfg.heartbeat_timeout_ms);
        let silent: Vec<ConnId> = self
            .peers
            .iter()
            .filter(|(_, p)| matches!(p.role, Role::Store { .. }))
            .filter(|(_, p)| now.saturating_duration_since(p.heard) > timeout)
            .map(|(c, _)| *c)
            .collect();
        for conn in silent {
            let why = format!("no heartbeat for {} ms", timeout.as_millis());
            self.drop_peer(conn, &why);
        }
    }

    /// The cluster map changed: parked updates whose pages a store that takes writes
    /// now did not take are refused, and their clients write them again. Updates that
    /// lost a store only wait for fewer notices.
    fn epoch_changed(&mut self) {
        let map = &self.map;
        let stale = self
            .strong
            .take_stale(|p| p.groups.iter().any(|&g| !map.written_to_all(g, p.written)));
        for p in stale {
            self.reply(p.conn, p.id, errno_reply(MAP_CHANGED));
        }
        self.apply_unparked();
    }

    /// An update that names data pages of `groups` written under epoch `written`
    /// must have reached every store that takes writes now, and each of its groups
    /// must have one ([`MAP_CHANGED`] otherwise: the client writes them again, to the
    /// stores of the new map, waiting for one if none is up).
    pub(crate) fn check_written(&self, written: Epoch, groups: &[u16]) -> FsResult<()> {
        match groups.iter().all(|&g| self.map.written_to_all(g, written)) {
            true => Ok(()),
            false => Err(MAP_CHANGED),
        }
    }

    pub(crate) fn persisted_notice(&mut self, member: MemberId, pages: Vec<Gpa>) {
        if !self.map.get(member).is_some_and(|m| m.state.takes_writes()) {
            return;
        }
        let mine = pages.into_iter().filter(|g| g.group() == member.group);
        self.strong.persisted(member.index, mine);
        self.apply_unparked();
    }

    /// Asks a member to persist pages again (their notice is overdue).
    pub(crate) fn ask_to_persist(&mut self, ask: Ask) {
        let Some(conn) = self.map.get(ask.member).and_then(|m| m.conn) else {
            return; // not back yet: asked at the next turn
        };
        let Some(peer) = self.peers.get_mut(&conn) else {
            return;
        };
        for pages in ask.pages.chunks(MAX_PERSISTED) {
            let req = StoreRequest::Persist {
                pages: pages.to_vec(),
            };
            if let Err(e) = peer.ch.send_request(0, &req) {
                warn!("asking data store {} to persist pages: {e}", ask.member);
                break;
            }
        }
    }

    /// A piece of `member`'s resync plan, from `from_page` on.
    pub(crate) fn resync_plan(
        &mut self,
        member: MemberId,
        incarnation: u64,
        from_page: u64,
    ) -> FsResult<ReplyBody> {
        let resyncing = self
            .map
            .get(member)
            .is_some_and(|m| m.state == MemberState::Resyncing && m.incarnation == incarnation);
        let Some(r) = self.resyncs.get_mut(&member).filter(|_| resyncing) else {
            return Err(FsError::Io(format!(
                "{member} is not resyncing (it left, or another start of it joined)"
            )));
        };
        // The source it began with, while it serves; else another in-sync peer.
        let up = |m: MemberId| {
            self.map
                .get(m)
                .is_some_and(|x| x.state == MemberState::Up && x.in_sync)
        };
        if !up(r.source) {
            let other = self
                .map
                .writers(member.group)
                .find(|m| m.state == MemberState::Up && m.in_sync)
                .map(|m| m.id);
            match other {
                Some(o) => {
                    info!("{member} resyncs from {o} now ({} left)", r.source);
                    r.source = o;
                }
                None => return Err(FsError::Errno(libc::EAGAIN)),
            }
        }
        let source = self.map.get(r.source).expect("up").addr.clone();
        // The pair of `hold` at its join: no page of the plan is reused before it is copied.
        assert!(
            self.groups
                .get(&member.group)
                .is_some_and(|g| g.held.is_some()),
            "a group hands freed pages out again while a replica resyncs"
        );
        let first_page = from_page / 64 * 64;
        let end = first_page.saturating_add(MAX_PLAN_WORDS as u64 * 64);
        let mut bits = Vec::new();
        let start = r.pages.partition_point(|&p| p < first_page);
        r.passed = start;
        for &p in r.pages[start..].iter().take_while(|&&p| p < end) {
            let w = ((p - first_page) / 64) as usize;
            if bits.len() <= w {
                bits.resize(w + 1, 0u64);
            }
            bits[w] |= 1 << ((p - first_page) % 64);
        }
        // An empty plan piece means done: skip ahead past pages with none.
        if bits.is_empty() {
            if let Some(&next) = r.pages.get(start) {
                let first_page = next / 64 * 64;
                return self.resync_plan(member, incarnation, first_page);
            }
        }
        Ok(ReplyBody::ResyncPlan {
            source,
            first_page,
            bits,
        })
    }

    /// A resyncing member copied its plan: it serves reads from now on.
    pub(crate) fn resync_done(&mut self, member: MemberId) -> FsResult<ReplyBody> {
        if self.resyncs.remove(&member).is_none() {
            return Err(FsError::Io(format!("{member} has no resync under way")));
        }
        self.map
            .resynced(member)
            .map_err(|e| FsError::Io(format!("recording the end of {member}'s resync: {e:#}")))?;
        self.release_held(member.group);
        info!(
            "data store {member} resynced: it serves (epoch {})",
            self.map.epoch()
        );
        self.epoch_changed();
        Ok(ReplyBody::Empty)
    }

    /// Pages freed in `group` go back to the allocator once no replica resyncs.
    fn release_held(&mut self, group: u16) {
        if self.resyncs.keys().any(|m| m.group == group) {
            return;
        }
        if let Some(g) = self.groups.get_mut(&group) {
            g.release();
        }
    }
}
