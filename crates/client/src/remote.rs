//! The client's connections: the MDS (RPCs, log commits, one-sided reads of its pool)
//! and the data stores (one-sided reads and writes of their pools, or direct loads and
//! stores when the pool is on this host). A broken MDS connection is re-established
//! here; callers see [`Fail::Reconnected`] and re-run their operation.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use orion_fabric::{
    Access, Completion, CompletionQueue, Domain, FabricConfig, OpKind, Region, RemoteRegion,
};
use orion_format::{Gpa, PoolKind, Superblock, PAGE_SIZE, SUPERBLOCK_SIZE};
use orion_meta::{FsError, FsResult};
use orion_pmem::{ModeChoice, Pool};
use orion_proto::channel::USER_WR_BASE;
use orion_proto::{Channel, Hello, MdsRequest, Reply, ReplyBody, StoreRequest};
use tracing::{info, warn};

use crate::stats::Stats;
use crate::ClientConfig;

/// Pages moved per batch of one-sided operations (the size of the I/O buffer).
pub const IO_PAGES: usize = 256;
/// One-sided operations in flight at once.
const WINDOW: usize = 32;

/// Why an internal operation stopped.
#[derive(Debug)]
pub enum Fail {
    Fs(FsError),
    /// The MDS connection broke and was re-established (the MDS may have restarted):
    /// the operation runs again on fresh state.
    Reconnected,
}

impl From<FsError> for Fail {
    fn from(e: FsError) -> Fail {
        Fail::Fs(e)
    }
}

pub type Res<T> = Result<T, Fail>;

pub fn io_err(what: impl std::fmt::Display) -> FsError {
    FsError::Io(what.to_string())
}

/// A data store as this client reaches it.
pub struct Store {
    pub ch: Channel,
    pub region: RemoteRegion,
    pub page_count: u64,
    /// The store's pool, mapped, when it is on this host (internal client).
    pub local: Option<(Pool, u64)>,
}

pub struct Remote {
    pub cfg: ClientConfig,
    pub strong: bool,
    domain: Domain,
    cq: CompletionQueue,
    mds: Channel,
    pub mds_pool: RemoteRegion,
    pub sb: Superblock,
    pub stores: HashMap<u16, Store>,
    /// Groups written with plain one-sided writes since their last flush (weak mode).
    pub unflushed: BTreeSet<u16>,
    /// The group whose pool this client maps, if any.
    pub internal_group: Option<u16>,
    pub io: Region,
    next_id: u64,
    pub stats: Stats,
    timeout: Duration,
    /// The MDS's grace period before freed pages are reused.
    pub grace: Duration,
}

impl Remote {
    pub fn connect(cfg: ClientConfig, fabric: FabricConfig) -> FsResult<Remote> {
        let strong = cfg.strong().map_err(io_err)?;
        let domain = Domain::open(fabric).map_err(|e| io_err(format!("fabric: {e}")))?;
        let cq = domain.completion_queue().map_err(io_err)?;
        let io = domain
            .alloc_region(IO_PAGES * PAGE_SIZE as usize, Access::LOCAL)
            .map_err(io_err)?;
        let mds = open_mds(&domain, &cq, &cfg.mds)?;
        let timeout = Duration::from_millis(cfg.op_timeout_ms);
        let mut remote = Remote {
            cfg,
            strong,
            domain,
            cq,
            mds,
            mds_pool: RemoteRegion {
                key: 0,
                addr: 0,
                len: 0,
            },
            sb: Superblock::new_metadata(1 << 20, [0; 16], [0; 16], 0).map_err(io_err)?,
            stores: HashMap::new(),
            unflushed: BTreeSet::new(),
            internal_group: None,
            io,
            next_id: 1,
            stats: Stats::default(),
            timeout,
            grace: Duration::ZERO,
        };
        if let Err(e) = remote.hello() {
            if remote.mds.conn.is_alive() {
                return Err(e);
            }
            // The connection broke under the first hello: as after any broken
            // connection, try again for up to `reconnect_ms`.
            warn!("lost the MDS at {} ({e}); reconnecting", remote.cfg.mds);
            remote.reconnect()?;
        }
        Ok(remote)
    }

    /// Introduces this client, learns the MDS pool and the data stores, connects to
    /// the stores, and tells the MDS which group it is internal to.
    fn hello(&mut self) -> FsResult<()> {
        let name = if self.cfg.name.is_empty() {
            format!("pid {}", std::process::id())
        } else {
            self.cfg.name.clone()
        };
        let mut hello = Hello {
            internal_group: None,
            strong: self.strong,
            name,
        };
        let reply = self.call_once(&MdsRequest::Hello(hello.clone()))?;
        let ReplyBody::Hello(h) = reply else {
            return Err(io_err("unexpected reply to hello"));
        };
        let sb = Superblock::decode(&h.superblock).map_err(io_err)?;
        if sb.kind != PoolKind::Metadata {
            return Err(io_err("the MDS described a pool that is not an MDS pool"));
        }
        self.sb = sb;
        self.mds_pool = h.pool;
        self.grace = Duration::from_millis(h.grace_ms);
        // Keep the store connections that still work; open the others.
        self.stores.retain(|_, s| s.ch.conn.is_alive());
        let had_internal = self.internal_group;
        self.internal_group = self
            .stores
            .iter()
            .find(|(_, s)| s.local.is_some())
            .map(|(g, _)| *g);
        for s in h.stores {
            if self.stores.contains_key(&s.group) {
                continue;
            }
            match self.open_store(&s.addr) {
                Ok((group, mut store)) => {
                    if store.local.is_some() && self.internal_group.is_none() {
                        self.internal_group = Some(group);
                    }
                    // A client is internal to one store (the MDS counts on it): other
                    // stores whose pools this host could map go through the fabric, so
                    // that they see, and report, every write.
                    if self.internal_group != Some(group) {
                        store.local = None;
                    }
                    self.stores.insert(group, store);
                }
                Err(e) => warn!("data store of group {} at {}: {e}", s.group, s.addr),
            }
        }
        if self.internal_group.is_some() || had_internal.is_some() {
            hello.internal_group = self.internal_group;
            self.call_once(&MdsRequest::Hello(hello))?;
        }
        Ok(())
    }

    /// Asks the MDS for the data stores again and connects to new ones.
    pub fn refresh_stores(&mut self) -> Res<()> {
        match self.hello() {
            Ok(()) => Ok(()),
            Err(e) if self.mds.conn.is_alive() => Err(Fail::Fs(e)),
            Err(_) => {
                self.reconnect()?;
                Err(Fail::Reconnected)
            }
        }
    }

    fn open_store(&mut self, addr: &str) -> FsResult<(u16, Store)> {
        let conn = self
            .domain
            .connect(addr, &self.cq)
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
        let local = if self.cfg.internal {
            map_local_pool(&info)
        } else {
            None
        };
        if local.is_some() {
            tracing::debug!(
                "internal client of group {}: mapping {}",
                info.group,
                info.pool_path
            );
        }
        Ok((
            info.group,
            Store {
                ch,
                region: info.region,
                page_count: info.page_count,
                local,
            },
        ))
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Hands completions that arrived while waiting for something else to the channel
    /// they belong to (a late send completion frees a send buffer).
    fn absorb(&mut self, other: Vec<Completion>) {
        for c in other {
            let ch = if c.conn == self.mds.conn.id() {
                &mut self.mds
            } else if let Some(s) = self.stores.values_mut().find(|s| s.ch.conn.id() == c.conn) {
                &mut s.ch
            } else {
                continue;
            };
            // A late reply to an abandoned call: drop it, keep the buffer posted.
            if let orion_proto::Event::Message { slot, .. } = ch.on_completion(&c) {
                let _ = ch.repost(slot);
            }
        }
    }

    fn call_once(&mut self, req: &MdsRequest) -> FsResult<ReplyBody> {
        let id = self.fresh_id();
        let mut other = Vec::new();
        let r = self.mds.call(&self.cq, id, req, self.timeout, &mut other);
        self.absorb(other);
        self.stats.rpcs += 1;
        match r.map_err(|e| io_err(format!("MDS {}: {e}", self.cfg.mds)))? {
            Reply::Ok(b) => Ok(b),
            Reply::Err { errno, message } => Err(match errno {
                libc::EIO => FsError::Io(message),
                e => FsError::Errno(e),
            }),
        }
    }

    /// An RPC to the MDS. A broken connection is re-established (waiting for a
    /// restarting MDS up to `reconnect_ms`) and reported as [`Fail::Reconnected`].
    pub fn call(&mut self, req: &MdsRequest) -> Res<ReplyBody> {
        match self.call_once(req) {
            Ok(b) => Ok(b),
            Err(e) if self.mds.conn.is_alive() => Err(Fail::Fs(e)),
            Err(e) => {
                warn!("lost the MDS at {} ({e}); reconnecting", self.cfg.mds);
                self.reconnect()?;
                Err(Fail::Reconnected)
            }
        }
    }

    fn reconnect(&mut self) -> FsResult<()> {
        let deadline = Instant::now() + Duration::from_millis(self.cfg.reconnect_ms);
        loop {
            let attempt = open_mds(&self.domain, &self.cq, &self.cfg.mds).and_then(|ch| {
                self.mds = ch;
                self.hello()
            });
            match attempt {
                Ok(()) => {
                    self.stats.reconnects += 1;
                    info!("reconnected to the MDS at {}", self.cfg.mds);
                    return Ok(());
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(io_err(format!(
                        "the MDS at {} is unreachable: {e}",
                        self.cfg.mds
                    )))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Reads `buf.len()` bytes of the MDS pool at `off`, one-sided.
    pub fn read_mds(&mut self, off: u64, buf: &mut [u8]) -> Res<()> {
        let conn = self.mds.conn.clone();
        let pool = self.mds_pool;
        let r = self.one_sided(
            &conn,
            |io, wr| conn.post_read(wr, io, 0, &pool, off, buf.len()),
            1,
        );
        match r {
            Ok(()) => {
                self.io.read(0, buf).map_err(io_err)?;
                Ok(())
            }
            Err(e) if self.mds.conn.is_alive() => Err(Fail::Fs(e)),
            Err(e) => {
                warn!("lost the MDS at {} ({e}); reconnecting", self.cfg.mds);
                self.reconnect()?;
                Err(Fail::Reconnected)
            }
        }
    }

    /// Posts `count` operations through `post` (given the I/O region and a wr_id whose
    /// low bits are the operation's index) and waits for all of them.
    fn one_sided(
        &mut self,
        conn: &orion_fabric::Connection,
        mut post: impl FnMut(&Region, u64) -> orion_fabric::Result<()>,
        count: usize,
    ) -> FsResult<()> {
        let mut posted = 0;
        let mut done = 0;
        let mut first_err = None;
        let mut batch = Vec::new();
        let mut other = Vec::new();
        let deadline = Instant::now() + self.timeout;
        while done < count {
            while posted < count && posted - done < WINDOW && first_err.is_none() {
                match post(&self.io, USER_WR_BASE + posted as u64) {
                    Ok(()) => posted += 1,
                    Err(e) => first_err = Some(e),
                }
            }
            if done == posted {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            batch.clear();
            if let Err(e) = self.cq.wait(&mut batch, 64, left) {
                // Operations still in flight would complete into a later batch's
                // accounting and buffer: the connection cannot be used any more.
                conn.close();
                first_err.get_or_insert(e);
                break;
            }
            for c in batch.drain(..) {
                let mine = c.conn == conn.id()
                    && c.wr_id >= USER_WR_BASE
                    && matches!(c.kind, OpKind::Read | OpKind::Write | OpKind::WriteImm);
                if mine {
                    done += 1;
                    if let Err(e) = c.status {
                        first_err.get_or_insert(e);
                    }
                } else {
                    other.push(c);
                }
            }
        }
        self.absorb(other);
        match first_err {
            None => Ok(()),
            Some(e) => Err(io_err(format!(
                "one-sided operation to {}: {e}",
                conn.peer()
            ))),
        }
    }

    fn store(&mut self, group: u16) -> Res<&mut Store> {
        let usable = |r: &Remote| r.stores.get(&group).is_some_and(|s| s.ch.conn.is_alive());
        if usable(self) {
            return Ok(self.stores.get_mut(&group).expect("usable"));
        }
        // A store that joined after this client connected, or one that is restarting
        // or rejoining a restarted MDS: ask the MDS again, and wait for it as long as
        // for a restarting MDS (the application sees no error meanwhile).
        // Each look is a hello to the MDS (which lists the stores it has): a few
        // quickly, then one every 100 ms.
        let deadline = Instant::now() + Duration::from_millis(self.cfg.reconnect_ms);
        let mut pause = Duration::from_millis(5);
        loop {
            let asked = self.hello();
            if usable(self) {
                return Ok(self.stores.get_mut(&group).expect("usable"));
            }
            if let Err(e) = asked {
                if !self.mds.conn.is_alive() {
                    // The MDS may have restarted: the caller's plan starts again.
                    warn!("lost the MDS at {} ({e}); reconnecting", self.cfg.mds);
                    self.reconnect()?;
                    return Err(Fail::Reconnected);
                }
            }
            if Instant::now() >= deadline {
                return Err(Fail::Fs(io_err(format!(
                    "no connection to the data store of group {group} within {} ms: is it \
                     running?",
                    self.cfg.reconnect_ms
                ))));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// Runs `transfer` (one-sided I/O with the store of `group`) again on a new
    /// connection when the store's connection broke under it (a restarting store, a
    /// queue pair in error), for up to `reconnect_ms`: the application sees no error
    /// while the store comes back. A transfer only moves whole pages to or from fixed
    /// addresses, so running it twice is the same as once.
    fn with_store<T>(
        &mut self,
        group: u16,
        mut transfer: impl FnMut(&mut Remote) -> Res<T>,
    ) -> Res<T> {
        let deadline = Instant::now() + Duration::from_millis(self.cfg.reconnect_ms);
        loop {
            let r = transfer(self);
            let broken = || {
                !self
                    .stores
                    .get(&group)
                    .is_some_and(|s| s.ch.conn.is_alive())
            };
            match r {
                Err(Fail::Fs(e)) if broken() && Instant::now() < deadline => {
                    self.stats.store_retries += 1;
                    warn!("lost the data store of group {group} ({e}); again on a new connection");
                }
                r => return r,
            }
        }
    }

    /// Reads `n` contiguous pages from `gpa` into `out` (n * 4 KiB bytes).
    pub fn read_pages(&mut self, gpa: Gpa, n: usize, out: &mut [u8]) -> Res<()> {
        self.with_store(gpa.group(), |r| r.read_pages_once(gpa, n, out))
    }

    fn read_pages_once(&mut self, gpa: Gpa, n: usize, out: &mut [u8]) -> Res<()> {
        assert_eq!(out.len(), n * PAGE_SIZE as usize, "pages are read whole");
        let store = self.store(gpa.group())?;
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
        let (conn, region) = (store.ch.conn.clone(), store.region);
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

    /// Faults in `pages` pages at `gpa` when their store's pool is mapped here, so that
    /// the writes that fill a new chunk do not each pay a first-touch page fault.
    pub fn prefault(&mut self, gpa: Gpa, pages: u64) {
        // Only a store already connected: prefaulting is an optimisation, never a wait.
        if let Some(store) = self.stores.get(&gpa.group()) {
            if let Some((pool, base)) = &store.local {
                if gpa.page() + pages <= store.page_count {
                    let _ =
                        pool.prefault(base + gpa.page() * PAGE_SIZE, (pages * PAGE_SIZE) as usize);
                }
            }
        }
    }

    /// Writes whole pages from `gpa` and makes them durable per the mode: a local pool
    /// is written and persisted here; a remote store gets a write with an immediate per
    /// page (strong: the store persists and tells the MDS) or one plain write (weak).
    /// Returns true when the pages were persisted locally.
    pub fn write_pages(&mut self, gpa: Gpa, data: &[u8]) -> Res<bool> {
        self.with_store(gpa.group(), |r| r.write_pages_once(gpa, data))
    }

    fn write_pages_once(&mut self, gpa: Gpa, data: &[u8]) -> Res<bool> {
        assert!(
            !data.is_empty() && data.len().is_multiple_of(PAGE_SIZE as usize),
            "pages are written whole"
        );
        let n = data.len() / PAGE_SIZE as usize;
        let strong = self.strong;
        let store = self.store(gpa.group())?;
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
        let (conn, region) = (store.ch.conn.clone(), store.region);
        if !strong {
            self.unflushed.insert(gpa.group());
        }
        let mut at = 0;
        while at < n {
            let k = (n - at).min(IO_PAGES);
            let bytes = &data[at * PAGE_SIZE as usize..(at + k) * PAGE_SIZE as usize];
            self.io.write(0, bytes).map_err(io_err)?;
            let first = gpa.page() + at as u64;
            if strong {
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

    /// Makes pages written in weak mode durable on their stores. A group stays to be
    /// flushed across a broken connection: the store may still hold the pages in
    /// volatile caches, so the flush goes to it on the new connection.
    pub fn flush_stores(&mut self) -> Res<()> {
        let groups: Vec<u16> = self.unflushed.iter().copied().collect();
        for g in groups {
            self.with_store(g, |r| r.flush_once(g))?;
            self.unflushed.remove(&g);
        }
        Ok(())
    }

    fn flush_once(&mut self, group: u16) -> Res<()> {
        let id = self.fresh_id();
        let mut other = Vec::new();
        self.store(group)?;
        let store = self.stores.get_mut(&group).expect("connected");
        let r = store
            .ch
            .call(&self.cq, id, &StoreRequest::Flush, self.timeout, &mut other);
        self.absorb(other);
        match r.map_err(io_err)? {
            Reply::Ok(_) => Ok(()),
            Reply::Err { message, .. } => Err(Fail::Fs(io_err(message))),
        }
    }
}

fn open_mds(domain: &Domain, cq: &CompletionQueue, addr: &str) -> FsResult<Channel> {
    let conn = domain
        .connect(addr, cq)
        .map_err(|e| io_err(format!("connecting to the MDS at {addr}: {e}")))?;
    Channel::new(domain, conn).map_err(io_err)
}

/// Maps a store's pool when it is a file on this host with the store's identity.
fn map_local_pool(info: &orion_proto::DsInfoReply) -> Option<(Pool, u64)> {
    let path = std::path::Path::new(&info.pool_path);
    let pool = Pool::open(path, ModeChoice::Auto).ok()?;
    let sb = Superblock::decode(&pool.read_vec(0, SUPERBLOCK_SIZE).ok()?).ok()?;
    (sb.kind == PoolKind::Data && sb.pool_uuid == info.pool_uuid && sb.group == info.group)
        .then_some((pool, sb.page_area_off))
}
