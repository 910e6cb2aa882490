//! The client's connections: the MDS (RPCs, log commits, one-sided reads of its pool)
//! and the data stores (one-sided reads and writes of their pools, or direct loads and
//! stores when the pool is on this host). A broken MDS connection is re-established
//! here; callers see [`Fail::Reconnected`] and re-run their operation.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orion_fabric::{Access, Completion, CompletionQueue, Domain, Region, RemoteRegion};
use orion_format::{PoolKind, Superblock, PAGE_SIZE};
use orion_meta::{FsError, FsResult};

use orion_proto::channel::Patience;
use orion_proto::{
    Channel, Epoch, Hello, MdsRequest, MemberId, Message, Reply, ReplyBody, StoreInfo,
};
use tracing::{info, warn};

mod one_sided;
mod open_table;
pub(crate) use open_table::OpenTable;

use crate::replicas::Store;
use crate::stats::Stats;
use crate::ClientConfig;

/// Pages moved per batch of one-sided operations (the size of the I/O buffer).
pub const IO_PAGES: usize = 256;
/// One-sided operations in flight at once.
const WINDOW: usize = 32;
/// How long an update the MDS could not yet find log room for waits before it goes
/// again: a small part of the MDS's grace period (1 s by default).
const ROOM_WAIT: Duration = Duration::from_millis(10);
/// How many of the MDS's grace periods an update waits for log room at most.
const ROOM_WAIT_GRACES: u32 = 4;

/// Why an internal operation stopped.
#[derive(Debug)]
pub enum Fail {
    Fs(FsError),
    /// The MDS connection broke and was re-established (the MDS may have restarted):
    /// the operation runs again on fresh state.
    Reconnected,
    /// The cluster map changed under the operation: a data store took writes only
    /// after the operation wrote its pages (the MDS refused its commit). The map is
    /// new already; the operation runs again and writes its pages to every store.
    MapChanged,
}

impl Fail {
    /// Whether the operation was refused before anything was committed (an errno
    /// answer, or a cluster map that changed under it): what it took is still the
    /// client's to reuse.
    pub(crate) fn changed_nothing(&self) -> bool {
        match self {
            Fail::Fs(e) => e.is_refusal(),
            Fail::MapChanged => true,
            Fail::Reconnected => false,
        }
    }
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

pub struct Remote {
    pub cfg: ClientConfig,
    pub strong: bool,
    pub(crate) domain: Domain,
    pub(crate) cq: CompletionQueue,
    mds: Channel,
    pub mds_pool: RemoteRegion,
    /// The MDS's open table of this client (`open_table`), and this client's copy.
    open_table: RemoteRegion,
    pub(crate) opens: Arc<OpenTable>,
    pub sb: Superblock,
    /// The cluster map as the MDS last described it, and its epoch.
    pub map: Vec<StoreInfo>,
    pub epoch: Epoch,
    /// When the map was asked for, and how long reads may go by it.
    pub map_at: Instant,
    pub map_lease: Duration,
    /// The data stores that take writes this client has reached, by member.
    pub stores: HashMap<MemberId, Store>,
    /// Members a connection failed to since the map was last asked for.
    pub(crate) unreachable: HashSet<MemberId>,
    /// Members written with plain one-sided writes since their last flush (weak mode).
    pub unflushed: BTreeSet<MemberId>,
    /// The member whose pool this client maps, if any.
    pub internal: Option<MemberId>,
    /// What the MDS was last told of it (see [`Remote::tell_internal`]).
    internal_told: Option<MemberId>,
    pub io: Region,
    next_id: u64,
    pub stats: Stats,
    pub(crate) timeout: Duration,
    /// The MDS's grace period before freed pages are reused.
    pub grace: Duration,
    /// The MDS addresses to try (the primary and its mirror), and the one in use.
    mds_addrs: Vec<String>,
    mds_at: usize,
    /// The primary's term as the last hello gave it, and whether a later hello found
    /// another (a fail-over: cached inodes must be read again).
    term: Option<u64>,
    term_changed: bool,
    /// Drawn once, kept across reconnections (see `Hello::nonce`).
    nonce: u64,
    /// The client's, shared by its lanes (see `Hello::instance`).
    instance: u64,
    /// The requests that changed state in the current operation, with their ids: run
    /// again after a reconnection (a later step of the operation broke), such a request
    /// is sent under its first id, and the MDS answers it from memory instead of
    /// applying it twice (a create that found its own file would say EEXIST).
    /// With each, the inode it created, if it was a create (an exclusive open run
    /// again finds its own file: it is not someone else's).
    applied: Vec<(MdsRequest, u64, Option<u64>)>,
    /// Which lane of its client this connection is (the MDS's logs name it).
    lane: usize,
    /// MDS connections every lane of the client re-established so far (see
    /// [`Remote::sessions`]).
    sessions: Arc<AtomicU64>,
    /// When the MDS was last known alive (see [`Remote::mds_seems_alive`]).
    mds_seen: Instant,
    /// When the latest request the MDS answered was sent, and how long after that
    /// a chunk it granted may be written into (see [`Remote::chunks_trusted`]).
    answered: Instant,
    /// The MDS connection has answered nothing yet (see `call_with_id`).
    fresh: bool,
    chunk_trust: Duration,
}

/// How long an MDS known alive is trusted without looking again. A fail-over or a
/// restart takes far longer (tens of milliseconds at least) before the next MDS
/// acknowledges anything, so a read of the old MDS's pool within this time returns
/// nothing older than what is acknowledged anywhere.
const MDS_TRUST: Duration = Duration::from_millis(1);

/// How long a call waits for a word from its MDS before it pings it, and how long
/// the ping may then go unanswered before the MDS counts as gone (see
/// [`Remote::await_reply`]). An MDS answers a ping at the end of its turn, held at
/// most while its mirror takes the turn's updates (a quarter of the lease, 250 ms
/// by default); a second is well beyond that, and a fail-over through a lapsed
/// lease takes about as long. (An MDS that cannot reach its cluster manager holds
/// its replies until its term ends, within the lease.)
const SILENCE: Duration = Duration::from_secs(1);

/// Most state-changing requests of one operation remembered for its re-runs.
const MAX_APPLIED: usize = 64;

impl Remote {
    /// Opens lane `lane` of a client (see `fs::lanes`) on `domain`.
    pub(crate) fn connect(
        cfg: ClientConfig,
        domain: Domain,
        lane: usize,
        sessions: Arc<AtomicU64>,
        instance: u64,
        opens: Arc<OpenTable>,
    ) -> FsResult<Remote> {
        let strong = cfg.strong().map_err(io_err)?;
        let cq = domain.completion_queue().map_err(io_err)?;
        let io = domain
            .alloc_region(IO_PAGES * PAGE_SIZE as usize, Access::LOCAL)
            .map_err(io_err)?;
        let mds_addrs = orion_proto::mds_addresses(&cfg.mds);
        if mds_addrs.is_empty() {
            return Err(io_err(
                "no MDS address given (`mds` in the client's settings)",
            ));
        }
        // The first that answers (a mirror among them turns the client away at
        // hello); a host that is down is given a second at first, then the fabric's
        // connect timeout.
        let mut last = None;
        let found = [Patience::FIRST, Duration::MAX]
            .iter()
            .find_map(|&patience| {
                mds_addrs.iter().enumerate().find_map(|(i, a)| {
                    match open_mds(&domain, &cq, a, patience) {
                        Ok(ch) => Some((ch, i)),
                        Err(e) => {
                            last = Some(e);
                            None
                        }
                    }
                })
            });
        let (mds, mds_at) = match found {
            Some(f) => f,
            None => return Err(last.expect("at least one address was tried")),
        };
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
            open_table: RemoteRegion {
                key: 0,
                addr: 0,
                len: 0,
            },
            opens,
            sb: Superblock::new_metadata(1 << 20, [0; 16], [0; 16], 0).map_err(io_err)?,
            map: Vec::new(),
            epoch: 0,
            map_at: Instant::now(),
            map_lease: Duration::ZERO,
            stores: HashMap::new(),
            unreachable: HashSet::new(),
            unflushed: BTreeSet::new(),
            internal: None,
            internal_told: None,
            io,
            next_id: 1,
            stats: Stats::default(),
            timeout,
            grace: Duration::ZERO,
            mds_addrs,
            mds_at,
            term: None,
            term_changed: false,
            nonce: orion_format::random_u64(),
            instance,
            applied: Vec::new(),
            lane,
            sessions,
            mds_seen: Instant::now(),
            answered: Instant::now(),
            fresh: true,
            chunk_trust: Duration::ZERO,
        };
        if let Err(e) = remote.hello() {
            if remote.mds.conn.is_alive() {
                return Err(e);
            }
            // The connection broke under the first hello: as after any broken
            // connection, try again for up to `reconnect_ms`.
            warn!("lost the MDS at {} ({e}); reconnecting", remote.mds_addr());
            remote.reconnect()?;
        }
        Ok(remote)
    }

    /// Introduces this client, learns the MDS pool and the data stores (and maps
    /// this host's own), and tells the MDS which store it is internal to as far as it
    /// knows it then: a client that finds its store in this hello's map tells the
    /// MDS before it next asks for pages or commits ([`Remote::tell_internal`]).
    fn hello(&mut self) -> FsResult<()> {
        let mut name = self.cfg.shown_name();
        if self.lane > 0 {
            name += &format!(" lane {}", self.lane);
        }
        let hello = Hello {
            internal: self.internal,
            strong: self.strong,
            name,
            nonce: self.nonce,
            instance: self.instance,
            host: orion_proto::this_host(),
        };
        let asked = Instant::now();
        self.opens.hello_sent();
        let reply = self.call_once(&MdsRequest::Hello(hello.clone()))?;
        let ReplyBody::Hello(h) = reply else {
            return Err(io_err("unexpected reply to hello"));
        };
        let sb = Superblock::decode(&h.superblock).map_err(io_err)?;
        if sb.kind != PoolKind::Metadata {
            return Err(io_err("the MDS described a pool that is not an MDS pool"));
        }
        self.sb = sb;
        if self.term.is_some_and(|t| t != h.term) {
            info!("the MDS at {} serves term {} now", self.mds_addr(), h.term);
            self.term_changed = true;
        }
        self.term = Some(h.term);
        self.mds_pool = h.pool;
        self.open_table = h.open_table;
        self.grace = Duration::from_millis(h.grace_ms);
        self.internal_told = hello.internal;
        self.adopt_map(h.epoch, h.stores);
        self.map_at = asked;
        self.map_lease = Duration::from_millis(h.map_lease_ms);
        self.chunk_trust = Duration::from_millis(h.grant_quiet_ms / 2);
        self.write_table_after_hello();
        Ok(())
    }

    /// Says hello again when the store this client is internal to changed since the
    /// MDS was told, before a request whose handling depends on it: where a chunk's
    /// pages are granted (the client's own group), and whose persists stand for its
    /// store's notices in a commit. A process that only reads never pays this round
    /// trip; before, every client paid it at connection, in a second hello.
    fn tell_internal(&mut self, req: &MdsRequest) -> FsResult<()> {
        let depends = matches!(
            req,
            MdsRequest::AllocChunk { .. } | MdsRequest::Commit(_) | MdsRequest::Create(_)
        );
        // A hello's map may change the store again (it died meanwhile): a few
        // rounds settle it.
        for _ in 0..3 {
            if !depends || self.internal == self.internal_told {
                break;
            }
            self.hello()?;
        }
        Ok(())
    }

    /// Asks the MDS for the data stores again (stores are connected to when a
    /// transfer next needs them).
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

    pub(crate) fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Hands completions that arrived while waiting for something else to the channel
    /// they belong to (a late send completion frees a send buffer).
    pub(crate) fn absorb(&mut self, other: Vec<Completion>) {
        for c in other {
            let ch = if c.conn == self.mds.conn.id() {
                &mut self.mds
            } else if let Some(ch) = self
                .stores
                .values_mut()
                .filter_map(|s| s.ch.as_mut())
                .find(|ch| ch.conn.id() == c.conn)
            {
                ch
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
        self.call_with_id(id, req, &mut None)
    }

    /// Sends `req` as request `id` and waits for its reply; `meanwhile` (taken, so it
    /// runs at most once over the retries of one call) runs once the request is on
    /// its way, before the wait.
    fn call_with_id(
        &mut self,
        id: u64,
        req: &MdsRequest,
        meanwhile: &mut Option<&mut dyn FnMut()>,
    ) -> FsResult<ReplyBody> {
        self.tell_internal(req)?;
        let mut other = Vec::new();
        let sent = Instant::now();
        // The first request on a connection whose handshake the MDS process just ran
        // (its hello) is not watched: the MDS is alive, and may be recovering its pool
        // before it answers anything, pings included.
        let watch = !self.fresh;
        let r = self.mds.send_request(id, req).and_then(|_| {
            if let Some(work) = meanwhile.take() {
                work();
            }
            self.await_reply(id, sent, watch, &mut other)
        });
        self.absorb(other);
        if r.is_ok() {
            self.answered = sent;
            self.fresh = false;
        }
        self.stats.rpcs += 1;
        if r.is_ok() {
            self.mds_seen = Instant::now();
        }
        match r.map_err(|e| io_err(format!("MDS {}: {e}", self.mds_addr())))? {
            Reply::Ok(b) => Ok(b),
            Reply::Err { errno, message } => Err(match errno {
                libc::EIO => FsError::Io(message),
                libc::ENOSPC => no_space(&message),
                e => FsError::Errno(e),
            }),
        }
    }

    /// Waits for the reply to request `id`, sent at `sent`, for up to the operation
    /// timeout, and asks meanwhile whether the MDS is still there: after [`SILENCE`]
    /// without a word from it, a ping on the same connection (the MDS answers pings
    /// while a request waits, parked for the stores). An MDS that lets its ping go
    /// unanswered for [`SILENCE`] is cut off or no longer serves (its host gone, its
    /// term over): the call is given up at once and the connection closed, to be
    /// made again starting at the next address, where a mirror may serve already.
    /// Waiting for the timeout instead held the client for `op_timeout_ms` (30 s by
    /// default) after the mirror took over in a second (design note 65). An MDS that
    /// answers its pings is slow, not gone: the call waits for the timeout as before.
    /// Without `watch`, the call only waits for its timeout.
    fn await_reply(
        &mut self,
        id: u64,
        sent: Instant,
        watch: bool,
        other: &mut Vec<Completion>,
    ) -> orion_fabric::Result<Reply> {
        if !watch {
            let r = self.mds.wait_reply(&self.cq, &[id], self.timeout, other);
            return r.map(|(_, reply)| reply);
        }
        // Below a timeout of two silences (tests), half the timeout.
        let silence = SILENCE.min(self.timeout / 2);
        let deadline = sent + self.timeout;
        let mut heard = sent;
        let mut ping: Option<(u64, Instant)> = None;
        loop {
            let now = Instant::now();
            let silent = ping.is_some_and(|(_, at)| now >= at + silence);
            if silent || now >= deadline {
                // At the deadline, a ping unanswered for half a silence counts too.
                if silent || ping.is_some_and(|(_, at)| now >= at + silence / 2) {
                    self.mds.conn.close();
                    warn!(
                        "the MDS at {} answered neither a request nor a ping for {:?}",
                        self.mds_addr(),
                        now - heard
                    );
                }
                return Err(orion_fabric::Error::Timeout(now - sent));
            }
            let wake = match ping {
                Some((_, at)) => at + silence,
                None => heard + silence,
            };
            let ids = [id, ping.map_or(id, |(p, _)| p)];
            let wait = wake.min(deadline).saturating_duration_since(now);
            match self.mds.wait_reply(&self.cq, &ids, wait, other) {
                Ok((rid, reply)) if rid == id => return Ok(reply),
                Ok(_) => {
                    heard = Instant::now();
                    ping = None;
                }
                Err(orion_fabric::Error::Timeout(_)) => {
                    if ping.is_none() && Instant::now() >= heard + silence {
                        let ping_id = self.fresh_id();
                        self.mds.send_request(ping_id, &MdsRequest::Ping)?;
                        ping = Some((ping_id, Instant::now()));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// An RPC to the MDS. A broken connection is re-established (waiting for a
    /// restarting MDS, or for the mirror to take over, up to `reconnect_ms`). A request
    /// that changes state is then answered from the replies the MDS remembers if its
    /// first run was applied (`MdsRequest::Outcome`: it happens once); otherwise, and
    /// for any other request, the break is reported as [`Fail::Reconnected`] and the
    /// caller runs the operation again from fresh state.
    pub fn call(&mut self, req: &MdsRequest) -> Res<ReplyBody> {
        self.call_meanwhile(req, None)
    }

    /// [`Remote::call`], running `meanwhile` once the request is on its way: work
    /// that would otherwise follow the reply overlaps the MDS's (a commit's entries
    /// applied to the cached copy, [`crate::commit::send_commit`]). It runs at most
    /// once, and not at all when the request could not be sent.
    pub fn call_meanwhile(
        &mut self,
        req: &MdsRequest,
        mut meanwhile: Option<&mut dyn FnMut()>,
    ) -> Res<ReplyBody> {
        let again = req
            .changes_state()
            .then(|| {
                self.applied
                    .iter()
                    .find(|(r, ..)| r == req)
                    .map(|(_, id, _)| *id)
            })
            .flatten();
        let id = again.unwrap_or_else(|| self.fresh_id());
        let mut r = self.call_with_id(id, req, &mut meanwhile);
        // The MDS's metadata pool has room only in log pages still in their grace
        // period: rather than sleep its one loop, the MDS answered EAGAIN, having
        // changed nothing and remembered nothing, and the update goes again until
        // the room is back (design note 74). The MDS says ENOSPC itself once nothing
        // coming makes room; pages that keep coming and going (others' removals and
        // compactions on a full pool) end the wait after a few grace periods.
        let mut since = None;
        while matches!(r, Err(FsError::Errno(libc::EAGAIN))) && req.changes_state() {
            let patience = (self.grace * ROOM_WAIT_GRACES)
                .max(ROOM_WAIT * 10)
                .min(Duration::from_millis(self.cfg.op_timeout_ms));
            if since.get_or_insert_with(Instant::now).elapsed() >= patience {
                r = Err(FsError::Errno(libc::ENOSPC));
                break;
            }
            std::thread::sleep(ROOM_WAIT);
            self.stats.room_waits += 1;
            r = self.call_with_id(id, req, &mut meanwhile);
        }
        let mut asked = 0;
        while let Err(e) = r.as_ref().map(|_| ()).map_err(|e| e.to_string()) {
            if self.mds.conn.is_alive() {
                break;
            }
            warn!("lost the MDS at {} ({e}); reconnecting", self.mds_addr());
            self.reconnect()?;
            if !req.changes_state() {
                return Err(Fail::Reconnected);
            }
            if asked == 3 {
                // Whether it was applied is unknown: running it again could apply it
                // twice.
                return Err(Fail::Fs(io_err(format!(
                    "the connection to the MDS broke while asking what became of a {}",
                    req.name()
                ))));
            }
            asked += 1;
            r = match self.call_once(&MdsRequest::Outcome { id }) {
                Ok(ReplyBody::Unknown) => return Err(Fail::Reconnected),
                Ok(b) => {
                    info!("the MDS had applied the {} before the break", req.name());
                    Ok(b)
                }
                other => other,
            };
        }
        // Applied, whether the answer came at once or through `Outcome` after a
        // break: sent again if the operation runs again, under this id.
        if r.is_ok() && req.changes_state() && again.is_none() {
            if self.applied.len() == MAX_APPLIED {
                self.applied.remove(0);
            }
            let created = match (req, &r) {
                (MdsRequest::Create(_), Ok(ReplyBody::Attr(a))) => Some(a.ino),
                _ => None,
            };
            self.applied.push((req.clone(), id, created));
        }
        match r {
            Ok(b) => Ok(b),
            Err(FsError::Errno(libc::EREMCHG)) => {
                self.stats.map_changes += 1;
                self.refresh_stores()?;
                Err(Fail::MapChanged)
            }
            // Pages from a chunk granted on an earlier connection (one whose request
            // was answered from the MDS's memory after a break): the operation runs
            // again with a fresh chunk.
            Err(FsError::Errno(libc::EKEYREVOKED)) => Err(Fail::Reconnected),
            Err(e) => Err(Fail::Fs(e)),
        }
    }

    /// Connects again, starting at the address after the one that broke: after a
    /// fail-over the mirror serves there, while a connect to the old primary's host,
    /// if that host is gone, waits out its timeout. A restarted MDS with a mirror is
    /// reached one refused hello later. Each host gets a second to answer (see
    /// [`Patience`]): a vanished host costs that in the first round, while the
    /// rounds start at the other address.
    fn reconnect(&mut self) -> FsResult<()> {
        let deadline = Instant::now() + Duration::from_millis(self.cfg.reconnect_ms);
        let mut patience = Patience::new(self.mds_addrs.len());
        let mut tried = 0;
        loop {
            self.mds_at = (self.mds_at + 1) % self.mds_addrs.len();
            if tried > 0 && tried % self.mds_addrs.len() == 0 {
                // A round of them all: a pause.
                std::thread::sleep(Duration::from_millis(20));
            }
            tried += 1;
            let (addr, at) = (self.mds_addr().to_string(), self.mds_at);
            let attempt = patience.attempt(at, |p| {
                open_mds(&self.domain, &self.cq, &addr, p).and_then(|ch| {
                    self.mds = ch;
                    self.fresh = true;
                    self.hello()
                })
            });
            match attempt {
                Ok(()) => {
                    self.stats.reconnects += 1;
                    self.sessions.fetch_add(1, Ordering::AcqRel);
                    info!("reconnected to the MDS at {addr}");
                    return Ok(());
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(io_err(format!(
                        "no MDS at {} answers as the primary: {e}",
                        self.cfg.mds
                    )))
                }
                Err(_) => {}
            }
        }
    }

    /// How many times a lane of this client re-established its MDS connection: a
    /// chunk granted before a change is no longer trusted by any lane.
    pub fn sessions(&self) -> u64 {
        self.sessions.load(Ordering::Acquire)
    }

    /// Whether the MDS connection is up: looked at when the MDS was last known
    /// alive more than [`MDS_TRUST`] ago. A one-sided operation alone does not tell:
    /// on the local fabric it still reaches the pool file of an MDS whose process
    /// died (an RDMA queue pair to a dead node fails instead), and a client that
    /// goes on reading it would miss what the next MDS acknowledged, or write into
    /// pages of a chunk that MDS never knew (design note 55).
    pub fn mds_seems_alive(&mut self) -> bool {
        if self.mds_seen.elapsed() < MDS_TRUST {
            return true;
        }
        let alive = self.mds.conn.is_alive();
        if alive {
            self.mds_seen = Instant::now();
        }
        alive
    }

    /// Whether the MDS answered a request of this lane within `d`.
    pub fn heard_within(&self, d: Duration) -> bool {
        self.answered.elapsed() < d
    }

    /// Whether this lane's chunks may be written into now: within half the MDS's
    /// quiet time for grants of sending a request it answered. An MDS answers only
    /// while it holds the primary role, and a new primary (or a restarted MDS)
    /// grants nothing in its first quiet time, so a chunk written into within this
    /// window is not also another client's (design note 55).
    pub fn chunks_trusted(&self) -> bool {
        self.answered.elapsed() < self.chunk_trust
    }

    /// A new operation starts: what the last one applied is forgotten.
    pub fn begin_operation(&mut self) {
        self.applied.clear();
    }

    /// Whether this operation created `ino` in an earlier run (before a reconnection
    /// made it run again).
    pub fn created_in_this_operation(&self, ino: u64) -> bool {
        self.applied.iter().any(|(.., c)| *c == Some(ino))
    }

    /// The address of the MDS this client talks to.
    pub fn mds_addr(&self) -> &str {
        &self.mds_addrs[self.mds_at]
    }

    /// Whether the MDS changed terms since the last call (a fail-over): the logs it
    /// serves may end before what this client read of its predecessor's.
    pub fn take_term_changed(&mut self) -> bool {
        std::mem::take(&mut self.term_changed)
    }
}

/// Opens a channel to the MDS at `addr`, waiting up to `patience` (at most the
/// fabric's connect timeout) for its host to answer.
pub(crate) fn open_mds(
    domain: &Domain,
    cq: &CompletionQueue,
    addr: &str,
    patience: Duration,
) -> FsResult<Channel> {
    let conn = domain
        .connect_within(addr, cq, patience)
        .map_err(|e| io_err(format!("connecting to the MDS at {addr}: {e}")))?;
    Channel::new(domain, conn).map_err(io_err)
}

/// The MDS's ENOSPC, with the resource its message names (the mount logs it).
fn no_space(message: &str) -> FsError {
    use orion_meta::error::Resource;
    let Some(r) = Resource::named_in(message) else {
        return FsError::Errno(libc::ENOSPC);
    };
    // Once in a while, not at every refused write of a full file system.
    static LAST: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
        *last = Some(Instant::now());
        warn!("the file system is full: the MDS has no free {}", r.name());
    }
    FsError::NoSpace(r)
}
