//! The MDS process: the pool, the listener, and one event loop that serves every
//! connection. On this 2-core machine one loop that spins briefly and then sleeps is
//! faster than a network thread handing work to file-system threads (each hand-off is
//! a wake-up of 35-60 µs here); the engine is therefore owned by the loop alone.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use orion_fabric::{Access, Completion, CompletionQueue, ConnId, Domain, Region, MAX_MESSAGE};
use orion_format::{Gpa, Superblock, SUPERBLOCK_SIZE};
use orion_meta::engine::EngineConfig;
use orion_meta::{FastMap, FsError, MetaEngine, SystemClock};
use orion_pmem::Pool;
use orion_proto::{
    is_reply, peek_id, Channel, Event, MdsInbound, MdsRequest, MemberId, Message, MirrorToMds,
    Reply, ReplyBody, StoreToMds,
};
use tracing::{info, warn};

use crate::apply::refused_for_room;
use crate::callbacks::Callbacks;
use crate::chunks::{ChunkGrants, Group};
use crate::locks::Locks;
use crate::members::{ClusterMap, MapHome};
use crate::mirror::Mirroring;
use crate::open_tables::OpenTables;
use crate::primary::PrimaryRole;
use crate::replies::ReplyTable;
use crate::startup::{Ended, Listening};
use crate::stores::Resync;
use crate::strong::{Pending, StrongWaits, Waiting};
use crate::{commit, namespace, MdsConfig};

/// What a started MDS tells its caller.
pub struct Ready {
    pub addr: String,
    pub describe: String,
}

pub(crate) enum Role {
    New,
    Client {
        internal: Option<MemberId>,
        strong: bool,
        /// The client's nonce (see [`ReplyTable`]).
        nonce: u64,
        /// Its client library instance (see `Hello::instance`).
        instance: u64,
    },
    Store {
        member: MemberId,
    },
    /// The MDS that mirrors this one ([`crate::mirror`]).
    Mirror,
}

pub(crate) struct Peer {
    pub ch: Channel,
    pub role: Role,
    pub grants: ChunkGrants,
    pub name: String,
    /// When it last sent anything (data stores only: one sends a heartbeat every
    /// 100 ms).
    pub heard: Instant,
}

impl Peer {
    pub(crate) fn instance(&self) -> Option<u64> {
        match self.role {
            Role::Client { instance, .. } => Some(instance),
            _ => None,
        }
    }

    pub(crate) fn nonce(&self) -> Option<u64> {
        match self.role {
            Role::Client { nonce, .. } => Some(nonce),
            _ => None,
        }
    }
}

pub(crate) struct Mds {
    pub cfg: MdsConfig,
    pub engine: MetaEngine,
    /// Keeps the fabric domain (and the registered pool) alive while serving.
    pub(crate) domain: Domain,
    pub(crate) pool_region: Region,
    pub(crate) superblock: Vec<u8>,
    pub(crate) cq: Arc<CompletionQueue>,
    /// Completions that arrived while the loop waited for its mirror: handled first
    /// on the next turn.
    pub(crate) deferred: Vec<Completion>,
    pub groups: BTreeMap<u16, Group>,
    /// The replication groups' members, their states and the epoch.
    pub map: ClusterMap,
    /// Resyncs under way, by member.
    pub resyncs: BTreeMap<MemberId, Resync>,
    pub peers: FastMap<ConnId, Peer>,
    /// Strong mode's waits for data stores.
    pub strong: StrongWaits,
    locks: Locks,
    /// When to look for silent data stores next.
    pub heartbeats_due: Instant,
    /// When the metrics are refreshed next, and what of this term they counted.
    pub(crate) metrics_state: crate::metrics::Turn,
    pub(crate) next_client: u64,
    msg: Vec<u8>,
    /// The primary role, with a cluster manager: no reply leaves once it may be over.
    pub(crate) role: Option<PrimaryRole>,
    /// The mirror, and the replies that wait for it.
    pub(crate) mirror: Mirroring,
    /// Replies to requests that change state, for retries ([`crate::replies`]).
    pub(crate) replies: ReplyTable,
    /// Requests being served whose reply is to be remembered, with the client's nonce.
    remember: FastMap<(ConnId, u64), u64>,
    /// No chunk is granted before this (`MdsConfig::grant_quiet_ms`).
    pub(crate) grants_from: Instant,
    /// Callbacks to clients' kernel caches, and the replies that wait for them.
    pub(crate) callbacks: Callbacks,
    /// What each client holds open, and the unlinked files that wait for it.
    pub(crate) open_tables: OpenTables,
}

/// Recovers the pool and serves until `stop` is set (or the primary role is lost).
pub(crate) fn serve_loop(
    cfg: MdsConfig,
    pool: Pool,
    l: Listening,
    role: Option<PrimaryRole>,
    replies: ReplyTable,
    stop: Arc<AtomicBool>,
    ready: impl FnOnce(&Ready),
) -> Result<Ended> {
    let t0 = Instant::now();
    let grace = Duration::from_millis(cfg.grace_ms);
    let (mut engine, report) = MetaEngine::open(
        pool,
        Arc::new(SystemClock),
        EngineConfig {
            grace,
            wait_for_room: false,
            ..Default::default()
        },
    )
    .map_err(|e| anyhow!("recovering MDS pool {}: {e}", cfg.pool.display()))?;
    info!(
        inodes = report.inodes,
        journal_replayed = report.journal_replayed,
        orphans = report.orphans_reclaimed,
        unlinked_kept = report.orphans_kept.len(),
        "recovered {} in {:?}",
        cfg.pool.display(),
        t0.elapsed()
    );
    let superblock = engine.pool().read_vec(0, SUPERBLOCK_SIZE)?;
    let pool_len = engine.pool().len() as usize;
    let pool_region = l
        .domain
        .register_file(&cfg.pool, 0, pool_len, Access::REMOTE_READ)
        .context("registering the MDS pool with the fabric")?;
    let Listening {
        domain,
        addr,
        cq,
        acceptor,
        incoming: rx,
    } = l;
    let describe = format!(
        "{} on {}, pool {} ({})",
        domain.describe(),
        addr,
        cfg.pool.display(),
        engine.pool().describe()
    );
    let strong = StrongWaits::new(Duration::from_millis(cfg.persist_timeout_ms));
    let map_file = cfg.pool.with_extension("members");
    let home = match &role {
        Some(r) => MapHome::Manager {
            saver: r.map_saver(),
            legacy: map_file,
        },
        None => MapHome::File(map_file),
    };
    let map = ClusterMap::load(home, cfg.replicas).context("loading the cluster map")?;
    let cfg_grant_quiet_ms = cfg.grant_quiet_ms;
    let callbacks = Callbacks::new(Duration::from_millis(cfg.cache_lease_ms), Instant::now());
    let mut open_tables = OpenTables::starting(&cfg, engine.pool(), Instant::now());
    for &ino in &report.orphans_kept {
        open_tables.orphaned(ino);
    }
    engine.record_changes();
    let mut mds = Mds {
        cfg,
        engine,
        domain,
        pool_region,
        superblock,
        cq: cq.clone(),
        deferred: Vec::new(),
        groups: BTreeMap::new(),
        map,
        resyncs: BTreeMap::new(),
        peers: FastMap::default(),
        strong,
        locks: Locks::default(),
        heartbeats_due: Instant::now(),
        metrics_state: Default::default(),
        next_client: 1,
        msg: Vec::with_capacity(MAX_MESSAGE),
        role,
        mirror: Mirroring::default(),
        replies,
        remember: FastMap::default(),
        grants_from: Instant::now() + Duration::from_millis(cfg_grant_quiet_ms),
        callbacks,
        open_tables,
    };
    ready(&Ready {
        addr: addr.clone(),
        describe,
    });
    let mut batch = Vec::with_capacity(64);
    while !stop.load(Ordering::Relaxed) {
        batch.clear();
        batch.append(&mut mds.deferred);
        let wait = if !batch.is_empty() {
            Duration::ZERO
        } else if mds.callbacks.holds_replies() {
            Duration::from_millis(1)
        } else {
            mds.idle_wait()
        };
        match cq.wait(&mut batch, 64, wait) {
            Ok(_) | Err(orion_fabric::Error::Timeout(_)) => {}
            Err(e) => warn!("completion queue: {e}"),
        }
        // Before anything that arrived is handled: an MDS whose term may be over
        // (its lease lost, or the process was stopped) stops serving.
        if let Some(r) = mds.role.as_ref().filter(|r| !r.holds(Instant::now())) {
            warn!(
                "lost the primary role (epoch {}, {} manager): acknowledging nothing more; \
                 this MDS mirrors the new primary",
                r.epoch, r.kind
            );
            for p in mds.peers.values() {
                p.ch.conn.close();
            }
            let domain = mds.domain.clone();
            // What it remembered answers the retries of its clients if it takes the
            // role again before it mirrors another primary.
            let replies = std::mem::take(&mut mds.replies);
            mds.metrics_flush();
            mds.cfg.counters.demoted();
            // The pool is unmapped and unregistered before the mirror copies into it.
            drop(mds);
            let l = Listening {
                domain,
                addr,
                cq,
                acceptor,
                incoming: rx,
            };
            return Ok(Ended::LostRole(l, replies));
        }
        for c in batch.drain(..) {
            mds.on_completion(c);
        }
        mds.adopt(&rx);
        let now = Instant::now();
        mds.expire_parked(now);
        mds.check_heartbeats(now);
        mds.metrics_turn(now);
        mds.orphans_turn(now);
        mds.callbacks_turn();
        // The mirror gets what this turn persisted before any of its replies leave.
        mds.mirror_turn();
    }
    info!("stopping: {} connections", mds.peers.len());
    mds.metrics_flush();
    mds.mirror_stop();
    for p in mds.peers.values() {
        p.ch.conn.close();
    }
    drop(mds);
    let _ = acceptor.join();
    Ok(Ended::Stopped)
}

/// The reply of a failed request. (An ENOSPC's message names the resource that ran
/// out: the client reads it back, and the MDS counts it, at [`Mds::reply`].)
pub(crate) fn errno_reply(e: FsError) -> Reply {
    Reply::Err {
        errno: e.errno(),
        message: e.to_string(),
    }
}

impl Mds {
    /// How long the loop may wait for completions when nothing is queued: short while
    /// updates are parked for stores' notices (their timeouts run), a replica
    /// resyncs, or replies wait for the mirror's removal from the map; otherwise the
    /// period at which heartbeats are looked at (`check_heartbeats`: a quarter of
    /// the heartbeat timeout, 250 ms by default), since requests wake the loop. An
    /// idle MDS's loop then wakes for its stores' heartbeats, its clients' lease
    /// renewals and four times a second (a fixed 20 ms bound woke it fifty times,
    /// 100 ms and the queue's 50 ms slices twenty).
    fn idle_wait(&self) -> Duration {
        if self.strong.waiting().0 > 0 || !self.resyncs.is_empty() || self.mirror.unlisting() {
            Duration::from_millis(20)
        } else {
            self.heartbeat_period()
                .clamp(Duration::from_millis(20), Duration::from_millis(250))
        }
    }

    fn adopt(&mut self, rx: &mpsc::Receiver<Channel>) {
        while let Ok(ch) = rx.try_recv() {
            let id = ch.conn.id();
            if let Err(e) = ch.post_receives() {
                warn!("connection from {}: {e}", ch.conn.peer());
                continue;
            }
            let name = ch.conn.peer().to_string();
            self.peers.insert(
                id,
                Peer {
                    ch,
                    role: Role::New,
                    grants: ChunkGrants::default(),
                    name,
                    heard: Instant::now(),
                },
            );
        }
    }

    fn on_completion(&mut self, c: Completion) {
        let Some(peer) = self.peers.get_mut(&c.conn) else {
            return;
        };
        match peer.ch.on_completion(&c) {
            Event::Done => {}
            Event::Broken(e) => self.drop_peer(c.conn, &e.to_string()),
            Event::Message { slot, len } => {
                // Only a store's silence matters (clients are not timed).
                if matches!(peer.role, Role::Store { .. }) {
                    peer.heard = Instant::now();
                }
                let mut msg = std::mem::take(&mut self.msg);
                let read = peer.ch.read_message(slot, len, &mut msg);
                let repost = peer.ch.repost(slot);
                match read.and(repost) {
                    Ok(()) => self.on_message(c.conn, &msg),
                    Err(e) => self.drop_peer(c.conn, &e.to_string()),
                }
                self.msg = msg;
            }
        }
    }

    pub(crate) fn drop_peer(&mut self, conn: ConnId, why: &str) {
        let Some(peer) = self.peers.remove(&conn) else {
            return;
        };
        peer.ch.conn.close();
        self.open_tables.departed(conn, Instant::now());
        // Pages of chunks the client never committed go back to their groups now: no
        // file names them, so no reader can hold them.
        for (g, n) in peer.grants.uncommitted() {
            if let Some(grp) = self.groups.get_mut(&g.group()) {
                grp.alloc.free_now(g.page(), n);
            }
            self.strong.forget_pages(g, n);
        }
        self.strong.forget_client(conn);
        self.locks.release_client(conn);
        self.callbacks.departed(conn);
        self.remember.retain(|(c, _), _| *c != conn);
        match peer.role {
            Role::Store { member } => self.store_left(conn, member, &peer.name, why),
            Role::Client { .. } => info!("client {} left: {why}", peer.name),
            // A connection that never said who it is (a probe, a store's resync
            // asking for its source): not an operator's event.
            Role::New => tracing::debug!("connection from {} closed: {why}", peer.name),
            Role::Mirror => self.mirror_departed(conn, why),
        }
    }

    pub(crate) fn reply(&mut self, conn: ConnId, id: u64, reply: Reply) {
        // Fencing: a primary whose term may be over acknowledges nothing, and changes
        // nothing more in reply (a process stopped and continued mid-turn gets here
        // before its loop notices; the loop stops it).
        // Remembered even if it does not leave: the turn's updates may still reach the
        // mirror, and their reply must go with them.
        // A refusal for room is no outcome: the update comes again (design note 74).
        // Only a client's update is remembered, and only an update is refused for
        // room (other requests' EAGAIN: a lock taken, a grant or join to wait for).
        let nonce = self.remember.remove(&(conn, id));
        let refused = nonce.is_some() && refused_for_room(&reply);
        if refused {
            self.cfg.counters.refused_for_room();
        }
        if let Reply::Err { errno, message } = &reply {
            let named = (*errno == libc::ENOSPC)
                .then(|| orion_meta::error::Resource::named_in(message))
                .flatten();
            if let Some(r) = named {
                self.cfg.counters.no_space(r);
            }
        }
        if let Some(nonce) = nonce.filter(|_| !refused) {
            self.replies.remember(nonce, id, &reply);
        }
        if let Some((conn, id, reply)) = self.hold_for_callbacks(conn, id, reply) {
            self.reply_now(conn, id, reply);
        }
    }

    /// A reply that waited for nothing or no longer waits for callbacks.
    pub(crate) fn reply_now(&mut self, conn: ConnId, id: u64, reply: Reply) {
        if self.role.as_ref().is_some_and(|r| !r.holds(Instant::now())) {
            return;
        }
        if self.mirror.holds_replies() {
            return self.mirror.hold(conn, id, reply);
        }
        self.send_reply_now(conn, id, reply)
    }

    pub(crate) fn send_reply_now(&mut self, conn: ConnId, id: u64, reply: Reply) {
        if self.role.as_ref().is_some_and(|r| !r.holds(Instant::now())) {
            return;
        }
        let Some(peer) = self.peers.get_mut(&conn) else {
            return;
        };
        if let Err(e) = peer.ch.send_reply(id, &reply) {
            self.drop_peer(conn, &format!("cannot reply: {e}"));
        }
    }

    fn on_message(&mut self, conn: ConnId, msg: &[u8]) {
        if is_reply(msg) {
            // An answer to a callback, or a late one of the mirror (the only other
            // peer this MDS asks).
            if let Some(id) = peek_id(msg) {
                let tables = &self.open_tables;
                self.callbacks
                    .answered(conn, id, |instance, ino| tables.holds(instance, ino));
            }
            return;
        }
        let (id, req) = match MdsInbound::decode(msg) {
            Ok(x) => x,
            Err(e) => {
                let name = &self.peers[&conn].name;
                warn!("malformed message from {name}: {e}");
                self.cfg.counters.malformed();
                let id = peek_id(msg).unwrap_or(0);
                self.reply(
                    conn,
                    id,
                    Reply::Err {
                        errno: libc::EPROTO,
                        message: format!("malformed message: {e}"),
                    },
                );
                return;
            }
        };
        let (kind, started) = (crate::metrics::kind_slot(&req), Instant::now());
        self.cfg.counters.arrived(kind);
        if let Some(reply) = self.dispatch(conn, id, req) {
            self.reply(conn, id, reply);
        }
        self.cfg.counters.served(kind, started.elapsed());
    }

    /// Serves one request; `None` when the answer comes later (a parked commit) or
    /// never (a notice).
    fn dispatch(&mut self, conn: ConnId, id: u64, req: MdsInbound) -> Option<Reply> {
        let peer = self.peers.get_mut(&conn)?;
        let r = match (&peer.role, req) {
            (_, MdsInbound::Client(MdsRequest::Ping)) => Ok(ReplyBody::Empty),
            (Role::New | Role::Client { .. }, MdsInbound::Client(MdsRequest::Hello(h))) => {
                self.client_hello(conn, h)
            }
            (Role::New, MdsInbound::Store(StoreToMds::Join(d))) => self.join_store(conn, d),
            (
                Role::New,
                MdsInbound::Mirror(MirrorToMds::Hello {
                    name,
                    addr,
                    cluster_uuid,
                }),
            ) => self.mirror_hello(conn, name, addr, cluster_uuid),
            (
                Role::Mirror,
                MdsInbound::Mirror(MirrorToMds::Copied {
                    ring,
                    durable_on_delivery,
                }),
            ) => {
                self.mirror_copied(conn, ring, durable_on_delivery);
                return None;
            }
            (Role::Mirror, MdsInbound::Mirror(MirrorToMds::Applied { upto })) => {
                self.mirror_applied(conn, upto);
                return None;
            }
            (&Role::Store { member }, MdsInbound::Store(StoreToMds::Persisted { pages })) => {
                self.persisted_notice(member, pages);
                return None;
            }
            // Answered at once (it acknowledges nothing, so it need not wait for the
            // mirror): a store that hears nothing takes this MDS for gone (cut off, or
            // no longer primary: then no reply leaves) and joins another.
            (Role::Store { .. }, MdsInbound::Store(StoreToMds::Heartbeat)) => {
                self.send_reply_now(conn, id, Reply::Ok(ReplyBody::Empty));
                return None;
            }
            (&Role::Store { member }, MdsInbound::Store(StoreToMds::Resynced)) => {
                self.resync_done(member)
            }
            (
                Role::New | Role::Store { .. },
                MdsInbound::Store(StoreToMds::ResyncPlan {
                    member,
                    incarnation,
                    from_page,
                }),
            ) => self.resync_plan(member, incarnation, from_page),
            (&Role::Client { nonce, .. }, MdsInbound::Client(req)) => {
                if req.changes_state() {
                    // Sent again under its id: its operation ran again after a
                    // break, and this request had been applied and answered. It
                    // gets that answer, not a second run (a rename run twice would
                    // say ENOENT). Ids only grow per nonce, so a new request never
                    // finds one.
                    if let Some(reply) = self.replies.recall(nonce, id) {
                        return self.outcome_reply(conn, id, nonce, id, reply);
                    }
                    self.remember.insert((conn, id), nonce);
                }
                return self.client_request(conn, id, req);
            }
            (_, other) => Err(FsError::Io(format!(
                "{} is not allowed here: a connection says hello (client) or joins (data \
                 store) first, once",
                other.name()
            ))),
        };
        Some(match r {
            Ok(b) => Reply::Ok(b),
            Err(e) => errno_reply(e),
        })
    }

    fn client_request(&mut self, conn: ConnId, id: u64, req: MdsRequest) -> Option<Reply> {
        let peer = self.peers.get_mut(&conn)?;
        let Role::Client {
            internal,
            strong,
            nonce,
            instance,
        } = peer.role
        else {
            return None;
        };
        let internal_group = internal.map(|m| m.group);
        let r = match req {
            MdsRequest::AllocChunk { group, pages } => {
                self.alloc_chunk(conn, group.or(internal_group), pages)
            }
            MdsRequest::Commit(c) => {
                // Checked before it may wait: a bad commit is refused at once.
                if let Err(e) = commit::check(&self.engine, &peer.grants, &c) {
                    return Some(errno_reply(e));
                }
                let pages: Vec<Gpa> = commit::data_pages(&c).collect();
                let groups = groups_of(&pages);
                if let Err(e) = self.check_written(c.written_epoch, &groups) {
                    self.strong.consume(&pages);
                    return Some(errno_reply(e));
                }
                // Pages an internal client wrote into its own store's pool it has
                // persisted itself: that is its replica's notice (strong mode alone
                // waits for notices, and consumes them).
                if let (true, true, Some(m)) = (strong, c.persisted_locally, internal) {
                    let own = pages.iter().filter(|g| g.group() == m.group).copied();
                    self.strong.persisted(m.index, own);
                }
                let p = Pending {
                    groups,
                    pages: if strong { pages } else { Vec::new() },
                    written: c.written_epoch,
                    update: Waiting::Commit(c),
                };
                return self.apply_or_park(conn, id, p);
            }
            MdsRequest::Create(c) => {
                if let Some((g, _, written)) = c.symlink {
                    if let Err(e) = peer.grants.check(g, 1) {
                        return Some(errno_reply(e));
                    }
                    if let Err(e) = self.check_written(written, &[g.group()]) {
                        self.strong.consume(&[g]);
                        return Some(errno_reply(e));
                    }
                    // An internal client persisted its own replica's copy itself.
                    if let Some(m) = internal.filter(|m| strong && m.group == g.group()) {
                        self.strong.persisted(m.index, [g]);
                    }
                    let p = Pending {
                        pages: if strong { vec![g] } else { Vec::new() },
                        groups: vec![g.group()],
                        written,
                        update: Waiting::Create(c),
                    };
                    return self.apply_or_park(conn, id, p);
                }
                namespace::create(&mut self.engine, &c)
            }
            r @ (MdsRequest::HoldOpen { .. } | MdsRequest::OpenTableWritten) => {
                self.open_table_request(conn, r)
            }
            MdsRequest::ReturnPages { runs } => self.return_pages(conn, &runs),
            req @ (MdsRequest::Unlink { .. }
            | MdsRequest::Rmdir { .. }
            | MdsRequest::Rename { .. }
            | MdsRequest::Link { .. }
            | MdsRequest::Parent { .. }) => self.namespace_rpc(req),
            MdsRequest::Statfs => Ok(self.statfs()),
            MdsRequest::Lock(l) => self
                .engine
                .getattr(l.ino)
                .and_then(|_| self.locks.set(conn, &l))
                .map(|_| ReplyBody::Empty),
            MdsRequest::TestLock(l) => self
                .engine
                .getattr(l.ino)
                .map(|_| ReplyBody::Lock(self.locks.conflict(conn, &l))),
            MdsRequest::ReleaseLocks { ino, owner } => {
                self.locks.release(conn, ino, owner);
                Ok(ReplyBody::Empty)
            }
            MdsRequest::Watch { inos } => self
                .callbacks
                .watch(instance, &inos)
                .map(|_| ReplyBody::Empty),
            MdsRequest::Unwatch { inos } => {
                self.callbacks.unwatch(instance, &inos);
                Ok(ReplyBody::Empty)
            }
            MdsRequest::EndCacheLease => {
                self.callbacks.end_lease(conn);
                Ok(ReplyBody::Empty)
            }
            MdsRequest::CacheLease { keep_watches } => Ok(ReplyBody::Lease {
                ms: self
                    .callbacks
                    .lease(instance, conn, keep_watches, Instant::now()),
            }),
            MdsRequest::Outcome { id: asked } => match self.replies.recall(nonce, asked) {
                Some(reply) => return self.outcome_reply(conn, id, nonce, asked, reply),
                None => Ok(ReplyBody::Unknown),
            },
            MdsRequest::Hello(_) | MdsRequest::Ping => Err(FsError::Io(
                "a client says hello once, when it connects".into(),
            )),
        };
        self.release_freed();
        Some(match r {
            Ok(b) => Reply::Ok(b),
            Err(e) => errno_reply(e),
        })
    }

    /// Hands data pages the engine released to their groups (after the grace period:
    /// clients may still be reading them one-sided). A group with no allocator yet
    /// drops them: its allocator is made from the engine's files when its first store
    /// joins, so every turn that frees pages hands them over before that can happen.
    pub(crate) fn release_freed(&mut self) {
        for g in self.engine.take_freed() {
            if let Some(grp) = self.groups.get_mut(&g.group()) {
                grp.free_later(g.page(), 1);
            }
        }
    }
}

impl Mds {
    /// The cluster this MDS's pool belongs to.
    pub(crate) fn cluster_uuid(&self) -> [u8; 16] {
        Superblock::decode(&self.superblock).map_or([0; 16], |sb| sb.cluster_uuid)
    }
}

/// The groups of data pages, each once.
fn groups_of(pages: &[Gpa]) -> Vec<u16> {
    let mut g: Vec<u16> = pages.iter().map(|p| p.group()).collect();
    g.sort_unstable();
    g.dedup();
    g
}

/// The replicas of `group` whose notices a strong commit of its pages needs, a bit per
/// replica index: those that take writes and are not durable on delivery (a write
/// the client saw complete is durable on those). None when no replica takes writes.
pub(crate) fn notices_needed(map: &ClusterMap, group: u16) -> Option<u64> {
    let mut any = false;
    let need = map.writers(group).fold(0, |mask, w| {
        any = true;
        if w.durable_on_delivery {
            mask
        } else {
            mask | w.id.bit()
        }
    });
    any.then_some(need)
}
