//! The data stores as this client reaches them (Orion §3.1, §5.4): the cluster map the
//! MDS gave, this host's own store's pool mapped, a connection to each other member
//! made when a transfer first needs it, and the transfers of pages. A page is written
//! to every member of its group that takes writes and read from one that serves
//! (this host's own pool first, then the others in turn). A
//! transfer that fails asks the MDS for the map again and runs again (it moves whole
//! pages to fixed addresses, so twice is once), until the map no longer names the
//! member that failed or it is back, for up to `reconnect_ms`: the application sees no
//! error while one replica of the group lives.

use std::time::{Duration, Instant};

use orion_fabric::RemoteRegion;
use orion_format::{Gpa, PoolKind, Superblock, PAGE_SIZE, SUPERBLOCK_SIZE};
use orion_meta::FsError;
use orion_pmem::{ModeChoice, Pool};
use orion_proto::channel::USER_WR_BASE;
use orion_proto::{
    Channel, Epoch, MemberId, MemberState, Reply, ReplyBody, StoreInfo, StoreRequest,
};
use tracing::warn;

use crate::remote::{io_err, Fail, Remote, Res, IO_PAGES};

/// Which members a read may come from.
#[derive(Clone, Copy)]
enum Source {
    /// Any that serves (committed pages).
    AnyUp,
    /// One that has taken writes since the pages' epoch or before.
    Took,
    /// One the pages went to, back with the same pool since.
    Kept,
}

/// Where a write of pages went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivered {
    /// The copy of this client's own store was persisted here.
    pub local: bool,
    /// The members of the group that took the pages, a bit per replica index.
    pub takers: u64,
    /// The map epoch they were written under.
    pub epoch: Epoch,
}

impl Delivered {
    /// Where both writes went: the pages of a run written in several pieces are
    /// wherever every piece is, under the older epoch.
    pub fn and(self, other: Delivered) -> Delivered {
        Delivered {
            local: self.local && other.local,
            takers: self.takers & other.takers,
            epoch: self.epoch.min(other.epoch),
        }
    }
}

/// A data store as this client reaches it: through the fabric, or, for the one
/// store of this host it is internal to, by mapping the store's pool.
pub struct Store {
    /// The connection (none for this host's own store: its pool is mapped).
    pub ch: Option<Channel>,
    pub region: RemoteRegion,
    pub page_count: u64,
    /// The store's pool, mapped, when it is on this host (internal client).
    pub local: Option<(Pool, u64)>,
    /// The identity of the pool mapped (a store that came back with another pool
    /// at the same path is mapped again).
    pub pool_uuid: [u8; 16],
}

impl Remote {
    /// Takes the cluster map of a hello: keeps the stores of members that still take
    /// writes (this host's own with the same pool), drops the rest, and finds this
    /// host's own store by the pool the map names. Other stores are connected to
    /// when a transfer first needs them ([`Remote::reach`]): a process that only
    /// looks at metadata, or reads through its own store, never connects to one (a
    /// connection is a handshake of several round trips).
    pub(crate) fn adopt_map(&mut self, epoch: Epoch, map: Vec<StoreInfo>) {
        self.epoch = epoch;
        let mut map = map;
        // Sorted already by the MDS; sorting keeps `info`'s lookup right whatever comes.
        map.sort_unstable_by_key(|s| s.member);
        self.map = map;
        let map = &self.map;
        let named = |m: &MemberId| map.binary_search_by_key(m, |s| s.member).ok();
        self.stores.retain(|m, s| {
            named(m).is_some_and(|i| {
                let info = &map[i];
                let same_pool = s.local.is_none() || info.pool_uuid == s.pool_uuid;
                info.state.takes_writes()
                    && same_pool
                    && s.ch.as_ref().is_none_or(|c| c.conn.is_alive())
            })
        });
        self.unreachable.clear();
        self.internal = self.internal.filter(|m| self.stores.contains_key(m));
        // The store a client is internal to was found by mapping its pool (below),
        // and kept only with the same pool: it is reached by the mapping.
        debug_assert!(
            self.internal
                .is_none_or(|m| self.stores.get(&m).is_some_and(|s| s.local.is_some())),
            "the internal store {:?} is not mapped",
            self.internal
        );
        if self.internal.is_some() || !self.cfg.internal {
            return;
        }
        // A client is internal to one store (the MDS counts on it): other stores
        // whose pools this host could map go through the fabric, so that they see,
        // and report, every write.
        let own = self
            .map
            .iter()
            .filter(|s| s.state.takes_writes())
            .find_map(|s| {
                let (pool, base, sb) = map_local_pool(&s.pool_path, s.pool_uuid, s.member.group)?;
                Some((s.member, pool, base, sb))
            });
        if let Some((m, pool, base, sb)) = own {
            self.internal = Some(m);
            let region = RemoteRegion {
                key: 0,
                addr: 0,
                len: 0,
            };
            self.stores.insert(
                m,
                Store {
                    ch: None,
                    region,
                    page_count: sb.page_count,
                    local: Some((pool, base)),
                    pool_uuid: sb.pool_uuid,
                },
            );
        }
    }

    /// The store of member `m`, connected to first if need be. A store that could
    /// not be reached is not tried again until the next map (a transfer's retry asks
    /// for one), so a dead member costs one connect timeout, not one per page.
    pub(crate) fn reach(&mut self, m: MemberId) -> Res<&Store> {
        if !self.stores.contains_key(&m) {
            if self.unreachable.contains(&m) {
                return Err(Fail::Fs(io_err("not reachable")));
            }
            let Some(addr) = self.info(m).map(|s| s.addr.clone()) else {
                return Err(Fail::Fs(io_err("not in the cluster map")));
            };
            match self.open_store(m, &addr) {
                Ok(store) => {
                    self.stats.store_connections += 1;
                    self.stores.insert(m, store);
                }
                Err(e) => {
                    warn!("data store {m} at {addr}: {e}");
                    self.unreachable.insert(m);
                    return Err(Fail::Fs(e));
                }
            }
        }
        Ok(&self.stores[&m])
    }

    fn open_store(&mut self, member: MemberId, addr: &str) -> Result<Store, FsError> {
        // A store the map still names may be cut off: the MDS drops it from the map soon.
        let conn = self
            .domain
            .connect_within(addr, &self.cq, self.store_patience())
            .map_err(|e| io_err(format!("connecting to data store {addr}: {e}")))?;
        let mut ch = Channel::new(&self.domain, conn).map_err(io_err)?;
        let id = self.fresh_id();
        let mut other = Vec::new();
        let reply = ch
            .call(&self.cq, id, &StoreRequest::Info, self.timeout, &mut other)
            .map_err(|e| io_err(format!("data store {addr}: {e}")));
        self.absorb(other);
        let info = match reply? {
            Reply::Ok(ReplyBody::DsInfo(d)) => d,
            Reply::Err { message, .. } => return Err(io_err(message)),
            Reply::Ok(other) => return Err(io_err(format!("data store {addr}: {other:?}"))),
        };
        if info.group != member.group {
            return Err(io_err(format!(
                "the data store at {addr} serves group {}, and the MDS says {member}",
                info.group
            )));
        }
        Ok(Store {
            ch: Some(ch),
            region: info.region,
            page_count: info.page_count,
            local: None,
            pool_uuid: info.pool_uuid,
        })
    }

    /// The group this client's own store serves, if any.
    pub fn internal_group(&self) -> Option<u16> {
        self.internal.map(|m| m.group)
    }

    /// Whether reads of `group` come from this host's own pool.
    pub fn reads_locally(&self, group: u16) -> bool {
        self.internal
            .filter(|m| m.group == group)
            .and_then(|m| self.info(m))
            .is_some_and(|s| s.state == MemberState::Up)
    }

    /// The map comes sorted by member (the MDS keeps it so): a write looks its
    /// stores up here, without a scan.
    fn info(&self, m: MemberId) -> Option<&StoreInfo> {
        let i = self.map.binary_search_by_key(&m, |s| s.member).ok()?;
        Some(&self.map[i])
    }

    /// The `k`-th member of `group` that `pick` accepts, in the map this client has,
    /// this host's own store first. Callers walk `k` up from 0 (they need `&mut self`
    /// between members): the data path allocates nothing to choose its stores.
    fn member(&self, group: u16, k: usize, pick: impl Fn(&StoreInfo) -> bool) -> Option<MemberId> {
        let own = self.internal.filter(|m| m.group == group);
        let own = own.and_then(|m| self.info(m)).filter(|s| pick(s));
        let rest = self
            .map
            .iter()
            .filter(|s| s.member.group == group && Some(s.member) != self.internal && pick(s));
        own.into_iter().chain(rest).nth(k).map(|s| s.member)
    }

    /// Runs `transfer` (pages to or from `group`) again after a failure: the map is
    /// asked for again (the MDS drops a store that died), for up to `reconnect_ms`.
    fn with_group<T>(
        &mut self,
        group: u16,
        mut transfer: impl FnMut(&mut Remote) -> Res<T>,
    ) -> Res<T> {
        // The clock is read only once a transfer failed: the data path pays nothing.
        let mut deadline = None;
        let mut pause = Duration::from_millis(5);
        loop {
            let e = match transfer(self) {
                Err(Fail::Fs(FsError::Io(e))) => e,
                r => return r,
            };
            let wait = Duration::from_millis(self.cfg.reconnect_ms);
            if Instant::now() >= *deadline.get_or_insert_with(|| Instant::now() + wait) {
                return Err(Fail::Fs(io_err(format!(
                    "group {group}: {e} (for {} ms; is any of its data stores up?)",
                    self.cfg.reconnect_ms
                ))));
            }
            if self.stats.store_retries.is_power_of_two() {
                warn!("group {group}: {e}; asking the MDS for the stores again");
            }
            self.stats.store_retries += 1;
            self.refresh_stores()?;
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// Reads `n` contiguous pages from `gpa` into `out` (n * 4 KiB bytes).
    pub fn read_pages(&mut self, gpa: Gpa, n: usize, out: &mut [u8]) -> Res<()> {
        assert_eq!(out.len(), n * PAGE_SIZE as usize, "pages are read whole");
        // A store that left the map may lack pages committed since: reads go by a
        // map younger than its lease (the MDS holds such commits back that long).
        if self.map_at.elapsed() >= self.map_lease {
            self.refresh_stores()?;
        }
        self.with_group(gpa.group(), |r| r.read_pages_once(gpa, n, out))
    }

    /// Reads pages this client wrote under epoch `written` and has not committed,
    /// from a member that took them: one that takes writes since then or before (a
    /// store that joined later may never have had them), else one of those they went
    /// to (`to`) that is back with the same pool since (it left and restarted). With
    /// neither, the pages are gone, and nothing else is read in their place.
    pub fn read_written(
        &mut self,
        gpa: Gpa,
        n: usize,
        out: &mut [u8],
        written: Epoch,
        to: Delivered,
    ) -> Res<()> {
        assert_eq!(out.len(), n * PAGE_SIZE as usize, "pages are read whole");
        self.with_group(gpa.group(), |r| {
            r.read_pages_from(gpa, n, out, Some((written, to)))
        })
    }

    /// One pass over the members that serve `gpa`'s group, until one answers.
    fn read_pages_once(&mut self, gpa: Gpa, n: usize, out: &mut [u8]) -> Res<()> {
        self.read_pages_from(gpa, n, out, None)
    }

    fn read_pages_from(
        &mut self,
        gpa: Gpa,
        n: usize,
        out: &mut [u8],
        written: Option<(Epoch, Delivered)>,
    ) -> Res<()> {
        let group = gpa.group();
        let up = |s: &StoreInfo| s.state == MemberState::Up;
        let took = |s: &StoreInfo| up(s) && written.is_some_and(|(e, _)| s.since <= e);
        let kept = |s: &StoreInfo| {
            let bit = s.member.bit();
            up(s) && written.is_some_and(|(_, to)| to.takers & bit != 0 && s.pool_since <= to.epoch)
        };
        // Pages not committed yet come from a store that took them, if one is left,
        // else from one that took them and came back with its pool.
        let from = match written {
            None => Source::AnyUp,
            Some(_) if self.member(group, 0, took).is_some() => Source::Took,
            Some(_) if self.member(group, 0, kept).is_some() => Source::Kept,
            Some(_) => {
                return Err(Fail::Fs(FsError::Io(format!(
                    "every data store of group {group} that took pages {gpa:?} (+{n}) before \
                     they were committed is gone"
                ))))
            }
        };
        let pick = |s: &StoreInfo| match from {
            Source::AnyUp => up(s),
            Source::Took => took(s),
            Source::Kept => kept(s),
        };
        let mut last = None;
        let mut k = 0;
        while let Some(m) = self.member(group, k, pick) {
            k += 1;
            match self.read_from(m, gpa, n, out) {
                Ok(()) => return Ok(()),
                Err(Fail::Fs(FsError::Io(e))) => last = Some(format!("{m}: {e}")),
                Err(e) => return Err(e),
            }
        }
        let why = last.unwrap_or_else(|| format!("no data store of group {group} serves reads"));
        Err(Fail::Fs(FsError::Io(why)))
    }

    fn read_from(&mut self, m: MemberId, gpa: Gpa, n: usize, out: &mut [u8]) -> Res<()> {
        let store = self.reach(m)?;
        if gpa.page() + n as u64 > store.page_count {
            return Err(Fail::Fs(FsError::Corrupt(format!(
                "page {gpa:?} is outside its store"
            ))));
        }
        if let Some((pool, base)) = &store.local {
            pool.read(base + gpa.page() * PAGE_SIZE, out)
                .map_err(FsError::from)?;
            return Ok(());
        }
        let (conn, region) = (remote_conn(store)?, store.region);
        let mut at = 0;
        while at < n {
            let k = (n - at).min(IO_PAGES);
            let roff = (gpa.page() + at as u64) * PAGE_SIZE;
            let len = k * PAGE_SIZE as usize;
            self.one_sided(
                &conn,
                |io, wr| conn.post_read(wr, io, 0, &region, roff, len),
                1,
            )?;
            let bytes = &mut out[at * PAGE_SIZE as usize..(at + k) * PAGE_SIZE as usize];
            self.io.read(0, bytes).map_err(io_err)?;
            self.stats.remote_reads += 1;
            at += k;
        }
        Ok(())
    }

    /// Maps in `pages` pages at `gpa` on every store of their group that takes
    /// writes, so that the writes that fill a new chunk do not each pay a
    /// first-touch page fault: in the store's pool where this host maps it, else
    /// where the fabric would fault them in (the local backend's copies; nothing
    /// to do for a NIC). Best effort: a failure only leaves the faults to the writes.
    pub fn prefault(&mut self, gpa: Gpa, pages: u64) {
        let (off, len) = (gpa.page() * PAGE_SIZE, (pages * PAGE_SIZE) as usize);
        let mut k = 0;
        while let Some(m) = self.member(gpa.group(), k, |s| s.state.takes_writes()) {
            k += 1;
            // Best effort: a store not reached yet is not connected to here (a
            // dead one would hold the write up for a connect timeout).
            let Some(store) = self.stores.get(&m) else {
                continue;
            };
            if gpa.page() + pages > store.page_count {
                continue;
            }
            match (&store.local, &store.ch) {
                (Some((pool, base)), _) => drop(pool.prefault(base + off, len)),
                (None, Some(ch)) => drop(ch.conn.prefault_remote(&store.region, off, len)),
                (None, None) => {}
            }
        }
    }

    /// Writes whole pages from `gpa` to every member of its group that takes writes,
    /// durable per the mode: this host's own pool is written and persisted here; a
    /// remote store gets a write with an immediate per page (strong: the store
    /// persists and tells the MDS) or one plain write (weak, or a store durable on
    /// delivery). Returns true when the copy of this client's own store was persisted
    /// here.
    pub fn write_pages(&mut self, gpa: Gpa, data: &[u8]) -> Res<bool> {
        self.deliver_pages(gpa, data).map(|d| d.local)
    }

    /// [`Remote::write_pages`], saying where the pages went.
    pub fn deliver_pages(&mut self, gpa: Gpa, data: &[u8]) -> Res<Delivered> {
        assert!(
            !data.is_empty() && data.len().is_multiple_of(PAGE_SIZE as usize),
            "pages are written whole"
        );
        self.with_group(gpa.group(), |r| r.write_pages_once(gpa, data))
    }

    fn write_pages_once(&mut self, gpa: Gpa, data: &[u8]) -> Res<Delivered> {
        let group = gpa.group();
        let writes = |s: &StoreInfo| s.state.takes_writes();
        let mut local = false;
        let mut takers = 0u64;
        let mut k = 0;
        while let Some(m) = self.member(group, k, writes) {
            k += 1;
            local |= self.write_to(m, gpa, data).map_err(|e| match e {
                Fail::Fs(FsError::Io(e)) => Fail::Fs(FsError::Io(format!("{m}: {e}"))),
                e => e,
            })?;
            takers |= m.bit();
        }
        if k == 0 {
            return Err(Fail::Fs(io_err(format!(
                "every data store of group {group} is down"
            ))));
        }
        Ok(Delivered {
            local,
            takers,
            epoch: self.epoch,
        })
    }

    fn write_to(&mut self, m: MemberId, gpa: Gpa, data: &[u8]) -> Res<bool> {
        let n = data.len() / PAGE_SIZE as usize;
        // A store whose pool holds what a write delivered owes no notice (strong) and
        // needs no flush (weak): one plain write, complete when delivered, is enough.
        let durable = self.info(m).is_some_and(|s| s.durable_on_delivery);
        let notify = self.strong && !durable;
        let store = self.reach(m)?;
        if gpa.page() + n as u64 > store.page_count {
            return Err(Fail::Fs(io_err(format!(
                "page {gpa:?} is outside its store"
            ))));
        }
        if let Some((pool, base)) = &store.local {
            let off = base + gpa.page() * PAGE_SIZE;
            pool.write_data(off, data).map_err(FsError::from)?;
            pool.persist(off, data.len()).map_err(FsError::from)?;
            return Ok(true);
        }
        let (conn, region) = (remote_conn(store)?, store.region);
        if !self.strong && !durable {
            self.unflushed.insert(m);
        }
        let mut at = 0;
        while at < n {
            let k = (n - at).min(IO_PAGES);
            let bytes = &data[at * PAGE_SIZE as usize..(at + k) * PAGE_SIZE as usize];
            self.io.write(0, bytes).map_err(io_err)?;
            let first = gpa.page() + at as u64;
            if notify {
                self.one_sided(
                    &conn,
                    |io, wr| {
                        let i = wr - USER_WR_BASE;
                        let page = first + i;
                        conn.post_write_imm(
                            wr,
                            io,
                            i * PAGE_SIZE,
                            &region,
                            page * PAGE_SIZE,
                            PAGE_SIZE as usize,
                            page as u32,
                        )
                    },
                    k,
                )?;
            } else {
                let len = bytes.len();
                self.one_sided(
                    &conn,
                    |io, wr| conn.post_write(wr, io, 0, &region, first * PAGE_SIZE, len),
                    1,
                )?;
            }
            at += k;
        }
        Ok(false)
    }

    /// Makes pages written in weak mode durable on their stores. A member stays to be
    /// flushed across a broken connection (the store may still hold the pages in
    /// volatile caches); one that left the group no longer matters.
    pub fn flush_stores(&mut self) -> Res<()> {
        let members: Vec<MemberId> = self.unflushed.iter().copied().collect();
        for m in members {
            if self.info(m).is_some_and(|s| s.state.takes_writes()) {
                self.with_group(m.group, |r| r.flush_once(m))?;
            }
            self.unflushed.remove(&m);
        }
        Ok(())
    }

    fn flush_once(&mut self, m: MemberId) -> Res<()> {
        let id = self.fresh_id();
        let mut other = Vec::new();
        // A member whose connection broke since is connected to again (a map that
        // names it says it takes writes).
        self.reach(m)?;
        let Some(ch) = self.stores.get_mut(&m).and_then(|s| s.ch.as_mut()) else {
            return Err(Fail::Fs(io_err(format!("no connection to {m}"))));
        };
        let r = ch.call(&self.cq, id, &StoreRequest::Flush, self.timeout, &mut other);
        self.absorb(other);
        match r.map_err(io_err)? {
            Reply::Ok(_) => Ok(()),
            Reply::Err { message, .. } => Err(Fail::Fs(io_err(message))),
        }
    }
}

/// Maps a store's pool when it is a file on this host with the store's identity:
/// the pool, where its pages start, and its superblock.
fn map_local_pool(path: &str, uuid: [u8; 16], group: u16) -> Option<(Pool, u64, Superblock)> {
    if path.is_empty() {
        return None;
    }
    let pool = Pool::open(std::path::Path::new(path), ModeChoice::Auto).ok()?;
    let sb = Superblock::decode(&pool.read_vec(0, SUPERBLOCK_SIZE).ok()?).ok()?;
    // The pair of the store's own check at start: its page area fits its pool.
    let fits = sb
        .page_count
        .checked_mul(PAGE_SIZE)
        .and_then(|n| n.checked_add(sb.page_area_off))
        .is_some_and(|end| end <= pool.len());
    (sb.kind == PoolKind::Data && sb.pool_uuid == uuid && sb.group == group && fits).then_some((
        pool,
        sb.page_area_off,
        sb,
    ))
}

/// The connection of a store reached through the fabric.
fn remote_conn(s: &Store) -> Res<orion_fabric::Connection> {
    match &s.ch {
        Some(ch) => Ok(ch.conn.clone()),
        None => Err(Fail::Fs(io_err("this host's store has no connection"))),
    }
}
