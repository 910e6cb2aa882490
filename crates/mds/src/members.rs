//! The cluster map (Orion §3.1): which data stores serve each replication group, in
//! which state, under which epoch. Every change (a store joins, leaves, or finishes a
//! resync) bumps the epoch; clients write each page to every member that takes writes
//! in their epoch, and a commit written under another epoch is refused, so a commit
//! the MDS applies names pages that every member taking writes now holds.
//!
//! A member is *in sync* when it holds every page committed in its group. One that
//! did not take writes while a commit named its group's pages is not, and must copy
//! what it missed from an in-sync peer before it serves reads. That flag, the members'
//! pools and the epoch are the durable part of the map ([`MapHome`]): kept by the
//! cluster manager, or, for an MDS without one, in a small file beside its pool
//! (written whole, then renamed), so an MDS that restarts or takes over does not take a
//! stale replica for a good one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use orion_fabric::ConnId;
use orion_proto::{DsHello, Epoch, MemberId, MemberState, StoreInfo};

use crate::primary::MapSaver;

/// One data store of a replication group.
#[derive(Clone, Debug)]
pub struct Member {
    pub id: MemberId,
    pub pool_uuid: [u8; 16],
    /// Drawn at each start of the store (see `DsHello::incarnation`).
    pub incarnation: u64,
    pub addr: String,
    pub state: MemberState,
    /// Its connection to the MDS while it is up.
    pub conn: Option<ConnId>,
    /// Holds every page committed in its group.
    pub in_sync: bool,
    /// The pages of its group committed while it did not take writes, as far as this
    /// MDS has seen them (an in-sync member has missed none); `None` when that is not
    /// known (it left in the middle of a resync, the MDS restarted while it was stale,
    /// or it missed more than [`MAX_MISSED`] pages): then it copies every page.
    pub missed: Option<BTreeSet<u64>>,
    /// The epoch since which it takes writes (pages written before miss it).
    pub writes_since: Epoch,
    /// The epoch since which its pool has been this member's: a store that restarted
    /// with its pool keeps what was delivered to it before (a client copying pages it
    /// wrote and did not commit may read them there); a new pool does not.
    pub pool_since: Epoch,
    /// When it last stopped taking writes (clients may still read by a map that
    /// names it until their map lease runs out).
    pub left_at: Option<Instant>,
    /// A write delivered into its pool is durable there (`DsHello::durable_on_delivery`):
    /// strong commits do not wait for its notices.
    pub durable_on_delivery: bool,
    /// Where its pool is on its host ([`DsHello::pool_path`]; empty until it joins),
    /// and that host ([`DsHello::host`]; zeros until then).
    pub pool_path: String,
    pub host: [u8; 16],
}

/// Missed pages recorded per member before its resync copies every page instead
/// (8 MiB of set at most).
pub const MAX_MISSED: usize = 1 << 18;

/// A store cannot join yet: it needs an in-sync peer to copy from, and none is up.
/// It may try again later.
#[derive(Debug)]
pub struct WaitForPeer(pub String);

impl std::fmt::Display for WaitForPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WaitForPeer {}

/// What a store that joins becomes.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// Up at once: it holds every committed page of its group.
    Up,
    /// It must copy what it missed from this in-sync peer first.
    Resync { from: MemberId },
}

/// Where the durable part of the map lives.
pub enum MapHome {
    /// Nowhere: in memory only (tests).
    Memory,
    /// A file beside the pool of an MDS without a cluster manager.
    File(PathBuf),
    /// The cluster manager, written as the holder of the primary role. `legacy` is
    /// where a file may remain (an MDS of an earlier release, or run without the
    /// manager): read while the manager has no map, removed once it has one.
    Manager { saver: MapSaver, legacy: PathBuf },
}

pub struct ClusterMap {
    epoch: Epoch,
    replicas: u16,
    members: BTreeMap<MemberId, Member>,
    home: MapHome,
}

fn read_file(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

impl ClusterMap {
    /// The map of a cluster with `replicas` stores per group, loaded from its home if
    /// it is there (every member starts down: stores join again).
    pub fn load(home: MapHome, replicas: u16) -> Result<ClusterMap> {
        assert!(replicas >= 1, "a group has at least one replica");
        let (text, from) = match &home {
            MapHome::Memory => (None, String::new()),
            MapHome::File(path) => (read_file(path)?, path.display().to_string()),
            MapHome::Manager { saver, legacy } => match saver.load()? {
                Some(t) => (Some(t), "the cluster manager's".into()),
                None => (read_file(legacy)?, legacy.display().to_string()),
            },
        };
        let mut map = ClusterMap {
            epoch: 1,
            replicas,
            members: BTreeMap::new(),
            home,
        };
        let Some(text) = text else {
            return Ok(map);
        };
        map.parse(&text)
            .with_context(|| format!("the cluster map in {from} is damaged"))?;
        // A restart is a change: no message of the last run matches the new epoch.
        map.epoch += 1;
        Ok(map)
    }

    fn parse(&mut self, text: &str) -> Result<()> {
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["epoch", e] => self.epoch = e.parse()?,
                ["member", g, i, uuid, sync, rest @ ..] if rest.len() <= 1 => {
                    let id = MemberId::new(g.parse()?, i.parse()?);
                    // Files of the first release lack it: their pools date from then.
                    let pool_since = match rest {
                        [p] => p.parse()?,
                        _ => 0,
                    };
                    let in_sync = match *sync {
                        "in-sync" => true,
                        "stale" => false,
                        other => bail!("member state {other:?}"),
                    };
                    self.members.insert(
                        id,
                        Member {
                            id,
                            pool_uuid: parse_uuid(uuid)?,
                            incarnation: 0,
                            addr: String::new(),
                            state: MemberState::Down,
                            conn: None,
                            in_sync,
                            // What an in-sync member misses from now on, this MDS
                            // sees; what a stale one missed before, nobody knows.
                            missed: in_sync.then(BTreeSet::new),
                            writes_since: 0,
                            pool_since,
                            // Clients of the last run may still hold maps naming it.
                            left_at: Some(Instant::now()),
                            durable_on_delivery: false,
                            pool_path: String::new(),
                            host: [0; 16],
                        },
                    );
                }
                _ => bail!("unexpected line {line:?}"),
            }
        }
        Ok(())
    }

    /// Writes the durable part to its home (a file: whole to a temporary file,
    /// synced, then renamed).
    fn save(&self) -> Result<()> {
        match &self.home {
            MapHome::Memory => Ok(()),
            MapHome::File(path) => {
                orion_pmem::replace_durably(path, self.durable_text().as_bytes())
                    .with_context(|| format!("writing {}", path.display()))
            }
            MapHome::Manager { saver, legacy } => {
                saver.save(&self.durable_text())?;
                match std::fs::remove_file(legacy) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        tracing::warn!(
                            "removing {} (the manager keeps the map): {e}",
                            legacy.display()
                        )
                    }
                    _ => {}
                }
                Ok(())
            }
        }
    }

    /// The durable part, as the file holds it.
    pub fn durable_text(&self) -> String {
        let mut text = format!("epoch {}\n", self.epoch);
        for m in self.members.values() {
            let sync = if m.in_sync { "in-sync" } else { "stale" };
            text += &format!(
                "member {} {} {} {sync} {}\n",
                m.id.group,
                m.id.index,
                orion_format::hex(&m.pool_uuid),
                m.pool_since
            );
        }
        text
    }

    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    fn bump(&mut self) -> Result<()> {
        self.epoch += 1;
        self.save()
    }

    pub fn get(&self, id: MemberId) -> Option<&Member> {
        self.members.get(&id)
    }

    /// The members of `group` that take writes (strong commits wait for the notices
    /// of those not durable on delivery).
    pub fn writers(&self, group: u16) -> impl Iterator<Item = &Member> {
        self.group(group).filter(|m| m.state.takes_writes())
    }

    /// Whether pages of `group` written under epoch `written` reached every member
    /// that takes writes now: none of them joined since (members that left do not
    /// matter), and there is one.
    pub fn written_to_all(&self, group: u16, written: Epoch) -> bool {
        let mut writers = self.writers(group).peekable();
        writers.peek().is_some() && writers.all(|m| m.writes_since <= written)
    }

    /// Whether a commit of `group`'s pages may apply now: a member that is up and in
    /// sync takes it (else a resync could lose its only source: the commit waits for
    /// one to return), and no member stopped taking writes within `lease` (until then
    /// a client may read by a map that still names it, and it would lack the commit).
    pub fn settled(&self, group: u16, lease: Duration) -> bool {
        self.group(group)
            .any(|m| m.state == MemberState::Up && m.in_sync)
            && self
                .group(group)
                .all(|m| m.state.takes_writes() || m.left_at.is_none_or(|t| t.elapsed() >= lease))
    }

    /// Whether some member of `group` serves reads.
    pub fn serves(&self, group: u16) -> bool {
        self.group(group).any(|m| m.state == MemberState::Up)
    }

    fn group(&self, group: u16) -> impl Iterator<Item = &Member> {
        self.members
            .range(MemberId::new(group, 0)..=MemberId::new(group, u16::MAX))
            .map(|(_, m)| m)
    }

    /// The host of member `m`, once it joined.
    pub fn host_of(&self, m: MemberId) -> Option<[u8; 16]> {
        self.members.get(&m).map(|m| m.host)
    }

    /// Every member, as clients see the map.
    pub fn stores(&self) -> Vec<StoreInfo> {
        self.members
            .values()
            .map(|m| StoreInfo {
                member: m.id,
                state: m.state,
                addr: m.addr.clone(),
                resync_pct: 100,
                since: m.writes_since,
                pool_since: m.pool_since,
                durable_on_delivery: m.durable_on_delivery,
                pool_path: m.pool_path.clone(),
                pool_uuid: m.pool_uuid,
            })
            .collect()
    }

    /// Decides whether the store `d` may join (`fresh`: its pool never joined a
    /// cluster) and as what; on success it is recorded with connection `conn`. A
    /// member already connected must have been dropped first.
    pub fn join(&mut self, d: &DsHello, fresh: bool, conn: ConnId) -> Result<Admission> {
        let id = MemberId::new(d.group, d.index);
        if d.index >= self.replicas {
            bail!(
                "this store is replica {} of group {}, but the cluster keeps {} replicas per \
                 group (replicas in the MDS's config)",
                d.index,
                d.group,
                self.replicas
            );
        }
        if let Some(other) = self
            .members
            .values()
            .find(|m| m.pool_uuid == d.pool_uuid && m.id != id)
        {
            bail!(
                "this store's pool is already {} (a pool serves one place; check the \
                 store's group and index)",
                other.id
            );
        }
        if let Some(m) = self.members.get(&id).filter(|m| m.conn.is_some()) {
            bail!(
                "{id} is served by a connected store ({}) with another pool: check this \
                 store's group and index",
                m.addr
            );
        }
        let peer = self
            .group(d.group)
            .find(|m| m.id != id && m.state == MemberState::Up && m.in_sync)
            .map(|m| m.id);
        // Its host restarted: the pool may lack pages it was given before (see
        // `DsHello::restarted_host`). It copies every page from an in-sync peer, or,
        // with none up, serves what it has if it was in sync (after a power loss of
        // the whole group the first such replica back is the best there is).
        let same_pool = self.members.get(&id).filter(|m| m.pool_uuid == d.pool_uuid);
        let best_left = d.restarted_host && peer.is_none() && same_pool.is_some_and(|m| m.in_sync);
        let (in_sync, missed) = match self.members.get(&id) {
            Some(m) if m.pool_uuid == d.pool_uuid && d.restarted_host => {
                (best_left, best_left.then(BTreeSet::new))
            }
            Some(m) if m.pool_uuid == d.pool_uuid => (m.in_sync, m.missed.clone()),
            // A new, empty pool replaces a lost one: rebuilt from a peer.
            Some(_) if fresh => (false, None),
            Some(m) => bail!(
                "{id} is pool {}, and this store's pool ({}) belongs to the cluster already: \
                 point the store at its own pool",
                orion_format::hex(&m.pool_uuid),
                orion_format::hex(&d.pool_uuid)
            ),
            // A new place in a group that holds data already starts empty.
            None => {
                let first = self.group(d.group).next().is_none();
                (first, first.then(BTreeSet::new))
            }
        };
        assert!(
            self.members.get(&id).is_none_or(|m| m.conn.is_none()),
            "a connected member leaves before it joins again"
        );
        // Kept so by `committed_to`, `resynced` and `parse`: a member admitted in sync
        // takes no copy, so none may be owed to it.
        debug_assert!(
            !in_sync || missed.as_ref().is_some_and(|s| s.is_empty()),
            "an in-sync member has missed pages"
        );
        let admission = match (in_sync, peer) {
            (true, _) => Admission::Up,
            (false, Some(from)) => Admission::Resync { from },
            (false, None) => {
                return Err(WaitForPeer(format!(
                    "{id} does not hold every page committed in its group, and no in-sync \
                     replica of the group is up to copy them from: start an in-sync replica \
                     of group {} first",
                    d.group
                ))
                .into())
            }
        };
        self.members.insert(
            id,
            Member {
                id,
                pool_uuid: d.pool_uuid,
                incarnation: d.incarnation,
                addr: d.addr.clone(),
                state: match admission {
                    Admission::Up => MemberState::Up,
                    Admission::Resync { .. } => MemberState::Resyncing,
                },
                conn: Some(conn),
                in_sync,
                missed,
                writes_since: self.epoch + 1,
                // Since when it holds whatever reached it: a restarted host starts
                // it again, as a new pool does.
                pool_since: match self.members.get(&id) {
                    Some(m) if m.pool_uuid == d.pool_uuid && !d.restarted_host => m.pool_since,
                    _ => self.epoch + 1,
                },
                left_at: self.members.get(&id).and_then(|m| m.left_at),
                durable_on_delivery: d.durable_on_delivery,
                pool_path: d.pool_path.clone(),
                host: d.host,
            },
        );
        self.bump()?;
        Ok(admission)
    }

    /// Whether `id` is a place of this cluster (a client may say it is beside it).
    pub fn knows(&self, id: MemberId) -> bool {
        id.index < self.replicas && self.members.contains_key(&id)
    }

    /// A store's connection closed: its member is down. Returns it.
    pub fn leave(&mut self, conn: ConnId) -> Result<Option<MemberId>> {
        let Some(m) = self.members.values_mut().find(|m| m.conn == Some(conn)) else {
            return Ok(None);
        };
        // A connection is recorded only by `join`, as up or resyncing.
        assert!(
            m.state.takes_writes(),
            "a member down still has a connection"
        );
        m.conn = None;
        m.state = MemberState::Down;
        m.left_at = Some(Instant::now());
        if !m.in_sync {
            // Mid-resync: which of its pages it has copied is not recorded.
            m.missed = None;
        }
        let id = m.id;
        self.bump()?;
        Ok(Some(id))
    }

    /// A resyncing member holds every committed page now: it serves.
    pub fn resynced(&mut self, id: MemberId) -> Result<()> {
        let m = self
            .members
            .get_mut(&id)
            .expect("a resyncing member exists");
        assert_eq!(m.state, MemberState::Resyncing, "only a resync ends");
        m.state = MemberState::Up;
        m.in_sync = true;
        m.missed = Some(BTreeSet::new());
        self.bump()
    }

    /// A commit naming `pages` of `group` is about to apply: members that do not
    /// take it miss it (and must copy those pages before they serve again).
    pub fn committed_to(
        &mut self,
        group: u16,
        pages: impl Iterator<Item = u64> + Clone,
    ) -> Result<()> {
        let mut changed = false;
        let of_group = MemberId::new(group, 0)..=MemberId::new(group, u16::MAX);
        for m in self.members.range_mut(of_group).map(|(_, m)| m) {
            if m.state.takes_writes() {
                continue;
            }
            // The pair of `leave`'s: one that takes no writes has left (or never joined).
            debug_assert!(
                m.conn.is_none(),
                "a member that takes no writes is connected"
            );
            if m.in_sync {
                m.in_sync = false;
                changed = true;
            }
            if let Some(set) = &mut m.missed {
                set.extend(pages.clone());
                if set.len() > MAX_MISSED {
                    m.missed = None;
                }
            }
        }
        if changed {
            self.save()?;
        }
        Ok(())
    }
}

fn parse_uuid(s: &str) -> Result<[u8; 16]> {
    if s.len() != 32 || !s.is_ascii() {
        bail!("a pool id of {} characters", s.len());
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(group: u16, index: u16, pool: u8) -> DsHello {
        DsHello {
            group,
            index,
            page_count: 100,
            pool_uuid: [pool; 16],
            cluster_uuid: [9; 16],
            addr: format!("ds{group}.{index}:1"),
            incarnation: pool as u64,
            durable_on_delivery: false,
            restarted_host: false,
            pool_path: format!("/pools/ds{group}.{index}"),
            host: [7; 16],
        }
    }

    #[test]
    fn a_replica_whose_host_restarted_copies_everything_unless_it_is_the_best_left() {
        let mut map = ClusterMap::load(MapHome::Memory, 2).unwrap();
        let (a, b) = (MemberId::new(0, 0), MemberId::new(0, 1));
        map.join(&hello(0, 0, 1), false, 10).unwrap();
        map.join(&hello(0, 1, 2), true, 11).unwrap();
        map.resynced(b).unwrap();
        let since = map.stores()[1].pool_since;
        map.leave(11).unwrap();
        let rebooted = |pool| DsHello {
            restarted_host: true,
            ..hello(0, 1, pool)
        };
        // B's host restarted while A served: B copies every page from A.
        assert_eq!(
            map.join(&rebooted(2), false, 12).unwrap(),
            Admission::Resync { from: a }
        );
        let m = map.get(b).unwrap();
        assert!(!m.in_sync && m.missed.is_none(), "a full copy");
        assert!(m.pool_since > since, "what reached it before may be gone");
        map.resynced(b).unwrap();
        // The whole group loses power: the first in-sync replica back serves what it
        // has, the other copies from it.
        map.leave(10).unwrap();
        map.leave(12).unwrap();
        let a_rebooted = DsHello {
            restarted_host: true,
            ..hello(0, 0, 1)
        };
        assert_eq!(map.join(&a_rebooted, false, 13).unwrap(), Admission::Up);
        assert_eq!(
            map.join(&rebooted(2), false, 14).unwrap(),
            Admission::Resync { from: a }
        );
    }

    #[test]
    fn a_replica_away_misses_exactly_the_pages_committed_meanwhile() {
        let mut map = ClusterMap::load(MapHome::Memory, 2).unwrap();
        let (a, b) = (MemberId::new(0, 0), MemberId::new(0, 1));
        map.join(&hello(0, 0, 1), false, 10).unwrap();
        map.join(&hello(0, 1, 2), true, 11).unwrap();
        map.resynced(b).unwrap();
        map.committed_to(0, [1u64, 2].into_iter()).unwrap();
        assert_eq!(
            map.get(b).unwrap().missed,
            Some(BTreeSet::new()),
            "it took them"
        );
        map.leave(11).unwrap();
        map.committed_to(0, [5u64, 6].into_iter()).unwrap();
        map.committed_to(1, [8u64].into_iter()).unwrap();
        map.committed_to(0, [6u64, 7].into_iter()).unwrap();
        let missed = map.get(b).unwrap().missed.clone().unwrap();
        assert_eq!(missed.into_iter().collect::<Vec<_>>(), [5, 6, 7]);
        assert!(!map.get(b).unwrap().in_sync);
        assert_eq!(map.get(a).unwrap().missed, Some(BTreeSet::new()));
        // It comes back with its pool, and leaves again in the middle of its resync:
        // what it copied is not recorded, so next time it copies everything.
        assert_eq!(
            map.join(&hello(0, 1, 2), false, 12).unwrap(),
            Admission::Resync { from: a }
        );
        assert!(
            map.get(b).unwrap().missed.is_some(),
            "kept for its resync plan"
        );
        map.leave(12).unwrap();
        assert!(map.get(b).unwrap().missed.is_none());
        // Too many missed pages are not recorded either.
        map.join(&hello(0, 1, 2), false, 13).unwrap();
        map.resynced(b).unwrap();
        map.leave(13).unwrap();
        map.committed_to(0, 0..MAX_MISSED as u64 + 1).unwrap();
        assert!(map.get(b).unwrap().missed.is_none());
    }

    #[test]
    fn a_replica_that_missed_a_commit_resyncs_from_an_in_sync_peer_even_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mds.pool.members");
        let mut map = ClusterMap::load(MapHome::File(file.clone()), 2).unwrap();
        let e0 = map.epoch();
        assert_eq!(map.join(&hello(0, 0, 1), false, 10).unwrap(), Admission::Up);
        // The second place of a group that may hold data starts empty.
        assert_eq!(
            map.join(&hello(0, 1, 2), true, 11).unwrap(),
            Admission::Resync {
                from: MemberId::new(0, 0)
            }
        );
        map.resynced(MemberId::new(0, 1)).unwrap();
        assert!(map.epoch() > e0);
        assert_eq!(map.writers(0).count(), 2);
        let e1 = map.epoch();
        assert!(map.written_to_all(0, e1));
        assert!(!map.written_to_all(0, e0), "replica 1 joined after e0");
        // Replica 1 dies; a commit lands on replica 0 alone.
        assert_eq!(map.leave(11).unwrap(), Some(MemberId::new(0, 1)));
        assert_eq!(map.writers(0).count(), 1);
        assert!(map.written_to_all(0, e1), "a member leaving loses no write");
        assert!(
            !map.settled(0, Duration::from_secs(60)),
            "within the map lease"
        );
        assert!(
            map.settled(0, Duration::ZERO),
            "replica 0 is up and in sync"
        );
        assert!(
            !map.written_to_all(1, e1),
            "a group without members takes none"
        );
        map.committed_to(0, [7u64, 9].into_iter()).unwrap();
        // The MDS restarts: the map comes back with replica 1 stale.
        let before = map.epoch();
        let mut map = ClusterMap::load(MapHome::File(file), 2).unwrap();
        assert!(map.epoch() > before, "a restart moves the epoch on");
        assert!(!map.serves(0), "nobody serves until stores join again");
        let err = map.join(&hello(0, 1, 2), false, 20).unwrap_err();
        assert!(
            err.to_string().contains("no in-sync replica"),
            "a stale replica alone must not serve: {err}"
        );
        assert_eq!(map.join(&hello(0, 0, 1), false, 21).unwrap(), Admission::Up);
        assert_eq!(
            map.join(&hello(0, 1, 2), false, 22).unwrap(),
            Admission::Resync {
                from: MemberId::new(0, 0)
            }
        );
        // Each member keeps the epoch its pool came in, across the MDS restart: what
        // was delivered to it since then is still there.
        let info = |m: &ClusterMap, i: u16| {
            m.stores()
                .into_iter()
                .find(|s| s.member == MemberId::new(0, i))
                .unwrap()
        };
        assert!(
            info(&map, 0).pool_since <= e0 + 1,
            "its pool since the start"
        );
        assert!(info(&map, 1).pool_since < before, "kept across the restart");
        assert!(info(&map, 1).since > before, "though it takes writes anew");
        // Replica 1 (stale at the MDS restart) has missed no one knows what.
        assert!(map.get(MemberId::new(0, 1)).unwrap().missed.is_none());
        // A new pool in place 1 starts over.
        map.leave(22).unwrap();
        map.join(&hello(0, 1, 3), true, 23).unwrap();
        assert_eq!(info(&map, 1).pool_since, map.epoch());
    }

    #[test]
    fn a_pool_serves_one_place_and_indexes_stay_below_replicas() {
        let mut map = ClusterMap::load(MapHome::Memory, 2).unwrap();
        map.join(&hello(0, 0, 1), false, 1).unwrap();
        let e = map.join(&hello(1, 0, 1), false, 2).unwrap_err();
        assert!(e.to_string().contains("already group 0 replica 0"), "{e}");
        let e = map.join(&hello(0, 2, 3), false, 3).unwrap_err();
        assert!(e.to_string().contains("keeps 2 replicas"), "{e}");
        // Another cluster member's pool at a known place is refused; a fresh one
        // replaces it (and resyncs).
        map.join(&hello(0, 1, 4), true, 4).unwrap();
        map.resynced(MemberId::new(0, 1)).unwrap();
        map.leave(4).unwrap();
        let e = map.join(&hello(0, 1, 5), false, 5).unwrap_err();
        assert!(
            e.to_string().contains("belongs to the cluster already"),
            "{e}"
        );
        assert!(matches!(
            map.join(&hello(0, 1, 6), true, 6).unwrap(),
            Admission::Resync { .. }
        ));
    }

    #[test]
    fn no_commit_while_a_resync_has_lost_its_source() {
        let mut map = ClusterMap::load(MapHome::Memory, 2).unwrap();
        map.join(&hello(0, 0, 1), false, 1).unwrap();
        map.join(&hello(0, 1, 2), true, 2).unwrap(); // resyncing from replica 0
        assert!(map.settled(0, Duration::ZERO));
        map.leave(1).unwrap();
        assert!(
            !map.settled(0, Duration::ZERO),
            "replica 1 takes writes but holds no whole copy: commits wait"
        );
        map.join(&hello(0, 0, 1), false, 3).unwrap();
        assert!(map.settled(0, Duration::ZERO), "replica 0 is back, in sync");
    }
}
