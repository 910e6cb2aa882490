//! The data store process: pool, listener, the connection to the MDS, one event loop.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use orion_fabric::{Access, CompletionQueue, ConnId, Domain, FabricConfig, OpKind, Region};
use orion_format::{Gpa, PoolKind, Superblock, PAGE_SIZE, SUPERBLOCK_SIZE};
use orion_pmem::{ModeChoice, Pool};
use orion_progress::{Progress, Unit};
use orion_proto::channel::Patience;
use orion_proto::{
    is_reply, peek_id, Channel, DsHello, DsInfoReply, Event, MemberId, Message, Reply, ReplyBody,
    StoreRequest, StoreToMds, MAX_PERSISTED,
};
use tracing::{info, warn};

use crate::resync::{self, Copied};
use crate::DsConfig;

pub struct Ready {
    pub addr: String,
    pub describe: String,
}

/// Creates and formats a data pool. It joins a cluster the first time its store
/// connects to an MDS (the cluster id is stamped then).
pub fn format_pool(path: &Path, size: u64, group: u16, mode: ModeChoice) -> Result<()> {
    if path.exists() {
        bail!(
            "{} already exists: refusing to format over it",
            path.display()
        );
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut progress = Progress::new(format!("formatting {}", path.display()), size, Unit::Bytes);
    let pool = Pool::create_reporting(path, size, mode, &mut |n| progress.set(n))
        .with_context(|| format!("{}", path.display()))?;
    progress.finish();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    let sb = Superblock::new_data(size, orion_format::random_uuid(), [0; 16], group, now)
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    pool.zero(0, PAGE_SIZE as usize)?;
    pool.write(0, &sb.encode())?;
    pool.persist(0, PAGE_SIZE as usize)?;
    Ok(())
}

struct Store {
    cfg: DsConfig,
    /// Shared with a resync thread, which fills pages of it.
    pool: Arc<Pool>,
    sb: Superblock,
    domain: Domain,
    cq: Arc<CompletionQueue>,
    region: Region,
    addr: String,
    clients: std::collections::HashMap<ConnId, Channel>,
    mds: Option<Channel>,
    last_attempt: Option<Instant>,
    /// Which of the `mds` addresses (the primary and its mirror) is tried next.
    mds_at: usize,
    /// How long a join waits for each MDS host to answer.
    join_patience: Patience,
    /// When a failed join was last logged.
    join_warned: Option<Instant>,
    /// When the MDS last sent anything (it answers every heartbeat).
    mds_heard: Instant,
    /// Pages persisted since the last notice to the MDS.
    persisted: Vec<Gpa>,
    msg: Vec<u8>,
    /// Drawn at start (see `DsHello::incarnation`).
    incarnation: u64,
    /// The host restarted since the pool last served, and the pool needs flushes: it
    /// may lack pages it was given (see `host`). Said in every join of this run.
    restarted_host: bool,
    /// For the resync thread's own domain.
    fabric: FabricConfig,
    /// A resync under way: its cancel flag and where its result comes.
    resync: Option<(Arc<AtomicBool>, mpsc::Receiver<Result<Copied>>)>,
    /// The resync thread, joined before another starts (two must never write pages
    /// at once: the older one's copies would land over the newer's).
    resync_thread: Option<std::thread::JoinHandle<()>>,
    /// When to start a resync again that failed.
    resync_again: Option<Instant>,
    /// When the last heartbeat went to the MDS, and how often one goes.
    beat: Instant,
    beat_every: Duration,
}

/// How often a store tells the MDS it is alive until the MDS says
/// (`ReplyBody::Joined::heartbeat_ms`), and the bounds of what it may say.
const HEARTBEAT: Duration = Duration::from_millis(100);
const HEARTBEAT_RANGE: (Duration, Duration) =
    (Duration::from_millis(20), Duration::from_millis(500));
/// How long the MDS may leave a store's heartbeats unanswered before the store takes
/// it for gone (cut off, or no longer primary) and joins whichever MDS answers.
const MDS_SILENCE: Duration = Duration::from_secs(2);

pub fn run(
    cfg: DsConfig,
    fabric: FabricConfig,
    stop: Arc<AtomicBool>,
    ready: impl FnOnce(&Ready),
) -> Result<()> {
    let mode: ModeChoice = cfg.pool_mode.parse().map_err(anyhow::Error::msg)?;
    if !cfg.pool.exists() {
        bail!(
            "data pool {} does not exist: create it with `orion ds --format` (or let `orion up` \
             do it)",
            cfg.pool.display()
        );
    }
    let pool = Pool::open(&cfg.pool, mode)
        .with_context(|| format!("opening data pool {}", cfg.pool.display()))?;
    let sb = match Superblock::decode(&pool.read_vec(0, SUPERBLOCK_SIZE)?) {
        Ok(sb) if sb.kind == PoolKind::Data => sb,
        Ok(_) => bail!(
            "{} is an MDS pool, not a data pool: point `pool` at the store's pool",
            cfg.pool.display()
        ),
        Err(e) => bail!(
            "{} is not an OrionFS data pool or is damaged: {e}",
            cfg.pool.display()
        ),
    };
    if sb.group != cfg.group {
        bail!(
            "{} was formatted for group {}, but this store is configured for group {}",
            cfg.pool.display(),
            sb.group,
            cfg.group
        );
    }
    let page_area_end = sb
        .page_count
        .checked_mul(PAGE_SIZE)
        .and_then(|b| b.checked_add(sb.page_area_off));
    if page_area_end.is_none_or(|end| end > pool.len()) {
        bail!(
            "{}: the superblock names {} pages but the pool file holds fewer: the pool was \
             truncated or is damaged",
            cfg.pool.display(),
            sb.page_count
        );
    }
    if sb.page_count > u32::MAX as u64 {
        bail!("{}: more than 2^32 pages (16 TiB) per store is not supported: the write immediate names a page in 32 bits", cfg.pool.display());
    }
    let restarted_host =
        crate::host::restarted_since_last_run(&cfg.pool)? && !pool.durable_on_delivery();
    if restarted_host {
        warn!(
            "{}: the host restarted since this pool last served, and pages delivered but \
             never flushed may be gone: it copies every page from an in-sync replica",
            cfg.pool.display()
        );
    }
    let domain = Domain::open(fabric.clone()).context("opening the fabric")?;
    let region = domain
        .register_file(
            &cfg.pool,
            sb.page_area_off,
            (sb.page_count * PAGE_SIZE) as usize,
            Access::REMOTE_ALL,
        )
        .context("registering the data pool with the fabric")?;
    let cq = Arc::new(domain.completion_queue()?);
    cq.look_at_peers_every(orion_fabric::DAEMON_PEER_LOOKS);
    let listener = domain
        .listen(&cfg.listen)
        .with_context(|| format!("listening on {}", cfg.listen))?;
    let addr = listener.local_addr();
    let (acceptor, rx) = orion_proto::channel::spawn_acceptor(
        "ds-accept",
        &domain,
        listener,
        cq.clone(),
        stop.clone(),
        |m| warn!("{m}"),
    )?;
    let describe = format!(
        "group {} on {} ({}), pool {} ({})",
        cfg.group,
        addr,
        domain.describe(),
        cfg.pool.display(),
        pool.describe()
    );
    let join_patience = Patience::new(orion_proto::mds_addresses(&cfg.mds).len());
    let mut st = Store {
        cfg,
        pool: Arc::new(pool),
        sb,
        domain,
        cq: cq.clone(),
        region,
        addr: addr.clone(),
        clients: Default::default(),
        mds: None,
        last_attempt: None,
        mds_at: 0,
        join_patience,
        join_warned: None,
        mds_heard: Instant::now(),
        beat_every: HEARTBEAT,
        persisted: Vec::new(),
        msg: Vec::new(),
        fabric,
        resync: None,
        resync_thread: None,
        resync_again: None,
        beat: Instant::now(),
        incarnation: orion_format::random_u64(),
        restarted_host,
    };
    // Serve only once the MDS has accepted this store (a pool of another cluster is
    // refused there, with the reason).
    let deadline = Instant::now() + Duration::from_secs(30);
    while st.mds.is_none() {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        if let Err(e) = st.join_mds() {
            if e.downcast_ref::<Refused>().is_some() || Instant::now() > deadline {
                stop.store(true, Ordering::Relaxed);
                let _ = acceptor.join();
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    (st.cfg.counters.get().pool_bytes).set(st.pool.len() as i64);
    // Said before ready: the loop's first wait may last a heartbeat period.
    st.publish_state();
    ready(&Ready { addr, describe });
    let mut batch = Vec::with_capacity(64);
    while !stop.load(Ordering::Relaxed) {
        batch.clear();
        match cq.wait(&mut batch, 64, st.idle_wait()) {
            Ok(_) | Err(orion_fabric::Error::Timeout(_)) => {}
            Err(e) => warn!("completion queue: {e}"),
        }
        for c in batch.drain(..) {
            st.on_completion(c);
        }
        st.notify_mds();
        st.heartbeat();
        st.poll_resync();
        st.publish_state();
        while let Ok(ch) = rx.try_recv() {
            match ch.post_receives() {
                Ok(()) => {
                    st.clients.insert(ch.conn.id(), ch);
                }
                Err(e) => warn!("client connection from {}: {e}", ch.conn.peer()),
            }
        }
        if st.mds.is_none()
            && st
                .last_attempt
                .is_none_or(|t| t.elapsed() > Duration::from_millis(50))
        {
            match st.join_mds() {
                // Said once a second: attempts come every 50 ms.
                Err(e)
                    if st
                        .join_warned
                        .is_none_or(|t| t.elapsed() > Duration::from_secs(1)) =>
                {
                    warn!("rejoining the MDS at {}: {e:#}", st.cfg.mds);
                    st.join_warned = Some(Instant::now());
                }
                Err(_) => {}
                Ok(()) => st.join_warned = None,
            }
        }
    }
    info!("stopping");
    st.cancel_resync();
    st.pool.persist(0, st.pool.len() as usize)?;
    drop(st);
    let _ = acceptor.join();
    Ok(())
}

/// The MDS refused this store (wrong cluster, group taken): retrying cannot help.
#[derive(Debug)]
struct Refused(String);
impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Refused {}

impl Store {
    /// Connects to the MDS and joins; stamps the cluster id into a fresh pool.
    fn join_mds(&mut self) -> Result<()> {
        self.last_attempt = Some(Instant::now());
        // Each address in turn (the primary and its mirror, which turns stores away),
        // from the one that answered last, or the one after it if that one was lost.
        let n = orion_proto::mds_addresses(&self.cfg.mds).len().max(1);
        let mut last = None;
        for _ in 0..n {
            let (at, addr) = (self.mds_at, self.mds_addr());
            // Taken out while the join borrows the store.
            let mut patience = std::mem::take(&mut self.join_patience);
            let joined = patience.attempt(at, |p| self.join_at(&addr, p));
            self.join_patience = patience;
            match joined {
                Ok(()) => return Ok(()),
                Err(e) if e.downcast_ref::<Refused>().is_some() => return Err(e),
                Err(e) => {
                    self.mds_at = (self.mds_at + 1) % n;
                    last = Some(e);
                }
            }
        }
        Err(last.expect("at least one address"))
    }

    /// The MDS address this store tries or talks to.
    fn mds_addr(&self) -> String {
        let addrs = orion_proto::mds_addresses(&self.cfg.mds);
        addrs
            .get(self.mds_at)
            .cloned()
            .unwrap_or_else(|| self.cfg.mds.clone())
    }

    /// The pool file's absolute path, as clients on this host open it.
    fn pool_path(&self) -> String {
        std::fs::canonicalize(&self.cfg.pool)
            .unwrap_or_else(|_| self.cfg.pool.clone())
            .display()
            .to_string()
    }

    fn join_at(&mut self, mds: &str, patience: Duration) -> Result<()> {
        let conn = (self.domain).connect_within(mds, &self.cq, patience)?;
        let mut ch = Channel::new(&self.domain, conn)?;
        let hello = StoreToMds::Join(DsHello {
            group: self.cfg.group,
            index: self.cfg.index,
            page_count: self.sb.page_count,
            pool_uuid: self.sb.pool_uuid,
            cluster_uuid: self.sb.cluster_uuid,
            addr: self.addr.clone(),
            incarnation: self.incarnation,
            durable_on_delivery: self.pool.durable_on_delivery(),
            restarted_host: self.restarted_host,
            pool_path: self.pool_path(),
            host: orion_proto::this_host(),
        });
        let mut other = Vec::new();
        let reply = ch.call(&self.cq, 1, &hello, Duration::from_secs(10), &mut other);
        // Completions of client connections that arrived meanwhile are served now.
        for c in other {
            self.on_client_completion(c);
        }
        match reply? {
            Reply::Ok(ReplyBody::Joined {
                cluster_uuid,
                resync,
                heartbeat_ms,
            }) => {
                let (least, most) = HEARTBEAT_RANGE;
                self.beat_every = Duration::from_millis(heartbeat_ms.into()).clamp(least, most);
                if self.sb.cluster_uuid == [0; 16] {
                    self.sb.cluster_uuid = cluster_uuid;
                    self.pool.write(0, &self.sb.encode())?;
                    self.pool.persist(0, SUPERBLOCK_SIZE)?;
                    info!(
                        "joined a new cluster: stamped its id into {}",
                        self.cfg.pool.display()
                    );
                }
                info!("joined the MDS at {mds}");
                // Joins are tried only without one (`run`): none is replaced unclosed.
                assert!(self.mds.is_none(), "a store joined a second MDS");
                self.mds = Some(ch);
                self.mds_heard = Instant::now();
                self.cancel_resync();
                if resync {
                    self.start_resync();
                }
                Ok(())
            }
            // No in-sync peer to copy from is up yet: try again later.
            Reply::Err { errno, message } if errno == libc::EAGAIN => {
                bail!("the MDS at {mds} says to wait: {message}")
            }
            Reply::Err { message, .. } => {
                Err(Refused(format!("the MDS at {mds} refused this store: {message}")).into())
            }
            Reply::Ok(other) => bail!("unexpected reply to join: {other:?}"),
        }
    }

    fn on_completion(&mut self, c: orion_fabric::Completion) {
        if let Some(mds) = &mut self.mds {
            if mds.conn.id() == c.conn {
                match mds.on_completion(&c) {
                    Event::Broken(e) => self.lose_mds(&e.to_string()),
                    Event::Message { slot, len } => {
                        self.mds_heard = Instant::now();
                        let mut msg = std::mem::take(&mut self.msg);
                        let read = mds.read_message(slot, len, &mut msg);
                        let _ = mds.repost(slot);
                        if read.is_ok() && is_reply(&msg) {
                            // The answer to a heartbeat: the MDS is there.
                            self.msg = msg;
                            return;
                        }
                        match read.map(|()| StoreRequest::decode(&msg)) {
                            Ok(Ok((_, StoreRequest::Persist { pages }))) => {
                                self.persist_asked(&pages)
                            }
                            Ok(Ok((_, other))) => {
                                warn!("the MDS sent {}, which it never asks", other.name())
                            }
                            Ok(Err(e)) => warn!("a malformed message from the MDS: {e}"),
                            Err(e) => warn!("reading a message from the MDS: {e}"),
                        }
                        self.msg = msg;
                    }
                    Event::Done => {}
                }
                return;
            }
        }
        self.on_client_completion(c);
    }

    fn on_client_completion(&mut self, c: orion_fabric::Completion) {
        if c.kind == OpKind::RemoteWrite {
            if c.status.is_ok() {
                self.page_written(c.imm as u64);
            }
            return;
        }
        let Some(ch) = self.clients.get_mut(&c.conn) else {
            return;
        };
        match ch.on_completion(&c) {
            Event::Done => {}
            Event::Broken(_) => {
                if let Some(ch) = self.clients.remove(&c.conn) {
                    ch.conn.close();
                }
            }
            Event::Message { slot, len } => {
                let mut msg = std::mem::take(&mut self.msg);
                let ok = ch.read_message(slot, len, &mut msg).is_ok() && ch.repost(slot).is_ok();
                if ok {
                    let reply = self.serve(&msg);
                    let id = peek_id(&msg).unwrap_or(0);
                    if let Some(ch) = self.clients.get_mut(&c.conn) {
                        if ch.send_reply(id, &reply).is_err() {
                            ch.conn.close();
                            self.clients.remove(&c.conn);
                        }
                    }
                } else if let Some(ch) = self.clients.remove(&c.conn) {
                    ch.conn.close();
                }
                self.msg = msg;
            }
        }
    }

    /// How long the loop may wait for completions: until the next heartbeat once the
    /// store serves an MDS and has no resync to follow (requests wake it); short
    /// while it tries to join an MDS or resyncs. An idle store's loop then wakes for
    /// its heartbeats and their answers (eight times a second by default), where a
    /// fixed 20 ms bound woke it fifty times and 100 ms beats with the queue's 50 ms
    /// slices thirty.
    fn idle_wait(&self) -> Duration {
        const SHORT: Duration = Duration::from_millis(20);
        if self.mds.is_none() || self.resync.is_some() || self.resync_again.is_some() {
            return SHORT;
        }
        self.beat_every
            .saturating_sub(self.beat.elapsed())
            .max(Duration::from_millis(1))
    }

    /// The gauges of what this store is connected to.
    fn publish_state(&self) {
        let m = self.cfg.counters.get();
        m.clients.set(self.clients.len() as i64);
        m.joined.set(i64::from(self.mds.is_some()));
    }

    /// Tells the MDS this store is alive, every quarter of the MDS's heartbeat
    /// timeout (it takes a store that stays silent that long for dead).
    fn heartbeat(&mut self) {
        if self.beat.elapsed() < self.beat_every {
            return;
        }
        self.beat = Instant::now();
        if self.mds.is_some() && self.mds_heard.elapsed() > MDS_SILENCE {
            // A primary cut off, or one whose term ended (it answers nothing then):
            // nothing closes the connection, so the store gives up on it and joins
            // whichever MDS answers.
            return self.lose_mds(&format!("it answered no heartbeat for {MDS_SILENCE:?}"));
        }
        if let Some(mds) = &mut self.mds {
            if let Err(e) = mds.send_request(0, &StoreToMds::Heartbeat) {
                self.send_failed(&format!("sending a heartbeat: {e}"));
            }
        }
    }

    /// A message to the MDS could not be sent: the connection is lost if it is dead
    /// (a fabric may refuse to post on a connection whose peer died, and then no
    /// completion ever says so); else the MDS is slow to take its messages, and the
    /// heartbeat timeout decides.
    fn send_failed(&mut self, why: &str) {
        if self.mds.as_ref().is_some_and(|m| !m.conn.is_alive()) {
            self.lose_mds(why);
        } else {
            warn!("the MDS at {}: {why}", self.mds_addr());
        }
    }

    /// The connection to the MDS is gone: the store joins again.
    fn lose_mds(&mut self, why: &str) {
        warn!("lost the MDS at {}: {why}; rejoining", self.mds_addr());
        if let Some(mds) = self.mds.take() {
            mds.conn.close();
        }
        // The next address first: after a fail-over the mirror serves there, while a
        // connect to the old primary's host, if that host vanished, would wait out
        // its timeout (a restarted MDS is reached one turned-away join later).
        let n = orion_proto::mds_addresses(&self.cfg.mds).len().max(1);
        self.mds_at = (self.mds_at + 1) % n;
        self.persisted.clear();
        self.cancel_resync();
    }

    /// Starts copying what this store missed from a peer, on a thread of its own.
    fn start_resync(&mut self) {
        // From a join's answer, or a retry while joined (`poll_resync`): the plan is
        // asked of the MDS the store joined.
        debug_assert!(self.mds.is_some(), "a resync starts while joined to no MDS");
        self.cancel_resync();
        // The new thread waits for the old one (cancelled: it stops at its next run of
        // pages or wait), so this loop goes on serving and sending heartbeats.
        let previous = self.resync_thread.take();
        let cancel = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let job = resync::Job {
            member: MemberId::new(self.cfg.group, self.cfg.index),
            incarnation: self.incarnation,
            mds: self.mds_addr(),
            fabric: self.fabric.clone(),
            pool: self.pool.clone(),
            page_area_off: self.sb.page_area_off,
            page_count: self.sb.page_count,
            copied_pages: self.cfg.counters.get().resync_pages.clone(),
            cancel: cancel.clone(),
        };
        let spawned = std::thread::Builder::new()
            .name("ds-resync".into())
            .spawn(move || {
                if let Some(p) = previous {
                    let _ = p.join();
                }
                let _ = tx.send(resync::run(&job));
            });
        match spawned {
            Ok(t) => {
                self.resync = Some((cancel, rx));
                self.resync_thread = Some(t);
                self.cfg.counters.resync("started");
            }
            Err(e) => {
                warn!("starting the resync: {e}");
                self.resync_again = Some(Instant::now() + Duration::from_millis(500));
            }
        }
    }

    fn cancel_resync(&mut self) {
        if let Some((cancel, _)) = self.resync.take() {
            cancel.store(true, Ordering::Relaxed);
            self.cfg.counters.resync("cancelled");
        }
        self.resync_again = None;
    }

    /// A finished resync is reported to the MDS (the store serves reads from then on);
    /// a failed one starts again shortly.
    fn poll_resync(&mut self) {
        if self.resync_again.is_some_and(|t| Instant::now() >= t) && self.mds.is_some() {
            self.resync_again = None;
            self.start_resync();
        }
        let Some((_, rx)) = &self.resync else {
            return;
        };
        let result = match rx.try_recv() {
            Ok(r) => r,
            Err(mpsc::TryRecvError::Empty) => return,
            Err(mpsc::TryRecvError::Disconnected) => Err(anyhow!("the resync thread died")),
        };
        self.resync = None;
        let member = MemberId::new(self.cfg.group, self.cfg.index);
        self.cfg.counters.resync(match &result {
            Ok(_) => "finished",
            Err(_) => "failed",
        });
        match result {
            Ok(c) => {
                info!(
                    "{member}: resynced {} pages ({} MiB) in {:.2} s, {:.0} MiB/s",
                    c.pages,
                    (c.pages * PAGE_SIZE) >> 20,
                    c.secs,
                    c.mib_per_s()
                );
                let Some(mds) = &mut self.mds else {
                    return; // the next join resyncs again
                };
                let mut other = Vec::new();
                let r = mds.call(
                    &self.cq,
                    2,
                    &StoreToMds::Resynced,
                    Duration::from_secs(10),
                    &mut other,
                );
                for c in other {
                    self.on_client_completion(c);
                }
                match r {
                    Ok(Reply::Ok(_)) => info!("{member} serves reads again"),
                    Ok(Reply::Err { message, .. }) => {
                        warn!("the MDS refused the end of the resync: {message}")
                    }
                    Err(e) => warn!("telling the MDS the resync ended: {e}"),
                }
            }
            Err(e) => {
                warn!("{member}: the resync failed: {e:#}; starting again");
                self.resync_again = Some(Instant::now() + Duration::from_millis(500));
            }
        }
    }

    /// The MDS waits for these pages and their notices did not come (lost with a
    /// broken connection): persist them again and report them. The MDS only asks this
    /// incarnation of the store about writes made to this incarnation.
    fn persist_asked(&mut self, pages: &[Gpa]) {
        for g in pages {
            if g.group() == self.cfg.group {
                self.page_written(g.page());
            } else {
                warn!(
                    "the MDS asked group {} to persist a page of group {}",
                    self.cfg.group,
                    g.group()
                );
            }
        }
    }

    /// A strong-mode write of one page landed: persist it and queue the notice.
    fn page_written(&mut self, page: u64) {
        if page >= self.sb.page_count {
            warn!("a client wrote with an immediate naming page {page}, outside the pool");
            return;
        }
        // Checked above against the superblock, which `run` checked against the pool.
        assert!(self.sb.page_off(page) + PAGE_SIZE <= self.pool.len());
        if let Err(e) = self
            .pool
            .persist(self.sb.page_off(page), PAGE_SIZE as usize)
        {
            // Not persisted means not acknowledged: the commit times out at the MDS.
            warn!("persisting page {page}: {e}");
            return;
        }
        self.persisted.push(Gpa::new(self.cfg.group, page));
    }

    fn notify_mds(&mut self) {
        if self.persisted.is_empty() {
            return;
        }
        let Some(mds) = &mut self.mds else {
            self.persisted.clear();
            return;
        };
        // Only pages this store checked and persisted are reported (page_written).
        assert!(
            self.persisted
                .iter()
                .all(|g| g.group() == self.cfg.group && g.page() < self.sb.page_count),
            "a persisted notice names a page of this store"
        );
        let mut failed = None;
        (self.cfg.counters.get().persisted_pages).inc_by(self.persisted.len() as u64);
        for pages in self.persisted.chunks(MAX_PERSISTED) {
            let req = StoreToMds::Persisted {
                pages: pages.to_vec(),
            };
            if let Err(e) = mds.send_request(0, &req) {
                failed = Some(format!("telling it about persisted pages: {e}"));
                break;
            }
        }
        self.persisted.clear();
        if let Some(why) = failed {
            self.send_failed(&why);
        }
    }

    fn serve(&mut self, msg: &[u8]) -> Reply {
        let err = |errno: i32, message: String| Reply::Err { errno, message };
        match StoreRequest::decode(msg) {
            Ok((_, StoreRequest::Info)) => Reply::Ok(ReplyBody::DsInfo(DsInfoReply {
                group: self.cfg.group,
                region: self.region.remote(),
                pool_uuid: self.sb.pool_uuid,
                page_count: self.sb.page_count,
            })),
            Ok((_, StoreRequest::Flush)) => {
                let len = (self.sb.page_count * PAGE_SIZE) as usize;
                // The pair of the check in `run` (the page area fits in the pool).
                assert!(self.sb.page_area_off + len as u64 <= self.pool.len());
                match self.pool.persist(self.sb.page_area_off, len) {
                    Ok(()) => Reply::Ok(ReplyBody::Empty),
                    Err(e) => err(libc::EIO, format!("persisting the data pool: {e}")),
                }
            }
            Ok((_, StoreRequest::Ping)) => Reply::Ok(ReplyBody::Empty),
            Ok((_, StoreRequest::Persist { .. })) => err(
                libc::EPERM,
                "only the MDS asks a data store to persist pages".into(),
            ),
            Err(e) => err(libc::EPROTO, format!("malformed message: {e}")),
        }
    }
}
