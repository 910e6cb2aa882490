//! The backend-independent interface: domains, connections, completion queues, listeners.
//!
//! Argument checking lives here, once: local buffer bounds, the remote range against the
//! peer's descriptor, message sizes, and that a buffer belongs to the connection's domain.
//! Backends receive only well-formed operations; the target side still enforces its own
//! registrations (a forged descriptor is refused there).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{Backend, FabricConfig};
use crate::error::{Error, Result};
use crate::region::{Access, Region, RemoteRegion};
use crate::wait::Spinner;

/// Largest SEND; larger transfers use one-sided WRITE or READ.
pub const MAX_MESSAGE: usize = 64 * 1024;

/// Identifies a connection within this process (completions name the connection they belong to).
pub type ConnId = u32;

static NEXT_CONN: AtomicU32 = AtomicU32::new(1);

pub(crate) fn next_conn_id() -> ConnId {
    NEXT_CONN.fetch_add(1, Ordering::Relaxed)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    Send,
    Recv,
    Read,
    Write,
    WriteImm,
    /// A peer's WRITE with immediate landed in one of our regions (no `wr_id`: it is 0).
    RemoteWrite,
}

/// One finished operation. Every posted operation yields exactly one completion, successful or
/// not; a peer's WRITE with immediate yields a `RemoteWrite` completion at the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub conn: ConnId,
    pub wr_id: u64,
    pub kind: OpKind,
    /// Bytes received (`Recv`) or moved (`Read`, `Write`, `WriteImm`, `Send`); 0 for `RemoteWrite`.
    pub len: usize,
    /// The immediate value of a `RemoteWrite`.
    pub imm: u32,
    pub status: Result<()>,
}

impl Completion {
    pub(crate) fn ok(conn: ConnId, wr_id: u64, kind: OpKind, len: usize) -> Completion {
        Completion {
            conn,
            wr_id,
            kind,
            len,
            imm: 0,
            status: Ok(()),
        }
    }

    pub(crate) fn failed(conn: ConnId, wr_id: u64, kind: OpKind, e: Error) -> Completion {
        Completion {
            conn,
            wr_id,
            kind,
            len: 0,
            imm: 0,
            status: Err(e),
        }
    }
}

/// A validated operation handed to a backend.
pub(crate) struct PostOp {
    pub kind: OpKind,
    pub wr_id: u64,
    pub local: Region,
    pub off: u64,
    pub len: usize,
    /// For one-sided operations: the target region and the offset in it.
    pub remote: Option<(RemoteRegion, u64)>,
    pub imm: u32,
}

impl PostOp {
    /// The address put on the wire: base + offset when the provider uses virtual addresses
    /// (the descriptor's base is then non-zero), else the offset itself.
    pub(crate) fn wire_addr(&self) -> (u64, u64) {
        let (r, off) = self.remote.expect("one-sided op without a target");
        (r.key, r.addr.wrapping_add(off))
    }
}

pub(crate) trait ConnImpl: Send + Sync {
    fn post(&self, op: PostOp) -> Result<()>;
    fn is_alive(&self) -> bool;
    fn close(&self);
    /// See [`Connection::prefault_remote`]; nothing to do where a NIC moves the bytes.
    fn prefault_remote(&self, _key: u64, _roff: u64, _len: usize) -> Result<()> {
        Ok(())
    }
}

pub(crate) trait CqImpl: Send + Sync {
    /// Moves up to `max` finished completions to `out`; never blocks.
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize;
    /// Blocks until a completion may be ready, a peer may have died, `woken` is set, or
    /// `timeout` passes.
    fn sleep(&self, timeout: Duration, woken: &AtomicBool);
    /// Ends a [`CqImpl::sleep`] in another thread (whose `woken` the caller has set).
    fn wake(&self);
    /// Detects dead peers and completes their outstanding operations with `PeerGone`.
    fn check_peers(&self);
    fn as_any_arc(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

pub(crate) trait ListenerImpl: Send + Sync {
    fn accept(&self, cq: &CompletionQueue, timeout: Duration) -> Result<Connection>;
    fn local_addr(&self) -> String;
    /// Ends every wait in `accept`, now and later.
    fn wake(&self);
}

pub(crate) enum RegionSource<'a> {
    Memory(usize),
    File {
        path: &'a Path,
        offset: u64,
        len: usize,
    },
}

impl RegionSource<'_> {
    /// Maps the source in this process only (anonymous memory, or the file itself).
    pub(crate) fn map(&self) -> Result<crate::region::Mapping> {
        match *self {
            RegionSource::Memory(len) => crate::region::Mapping::anonymous(len),
            RegionSource::File { path, offset, len } => {
                Ok(Region::open_file(path, offset, len, true)?.1)
            }
        }
    }
}

pub(crate) trait DomainImpl: Send + Sync {
    fn register(&self, src: RegionSource<'_>, access: Access) -> Result<Region>;
    fn completion_queue(&self) -> Result<Arc<dyn CqImpl>>;
    fn listen(&self, addr: &str) -> Result<Box<dyn ListenerImpl>>;
    fn connect(&self, addr: &str, cq: &CompletionQueue, timeout: Duration) -> Result<Connection>;
    fn describe(&self) -> String;
}

/// One node's attachment to the fabric (an RDMA device context, in verbs terms).
#[derive(Clone)]
pub struct Domain {
    imp: Arc<dyn DomainImpl>,
    id: u64,
    cfg: Arc<FabricConfig>,
}

impl Domain {
    pub fn open(cfg: FabricConfig) -> Result<Domain> {
        let id = crate::region::random_u64();
        let cfg = Arc::new(cfg);
        let imp: Arc<dyn DomainImpl> = match &cfg.backend {
            Backend::Libfabric => Arc::new(crate::ofi::OfiDomain::open(cfg.clone(), id)?),
            Backend::Local => Arc::new(crate::local::LocalDomain::open(cfg.clone(), id)?),
            Backend::Mock(net) => Arc::new(net.domain(cfg.clone(), id)),
        };
        Ok(Domain { imp, id, cfg })
    }

    pub fn config(&self) -> &FabricConfig {
        &self.cfg
    }

    /// What this domain runs on, for logs ("libfabric tcp;ofi_rxm on lo", "local shared memory").
    pub fn describe(&self) -> String {
        self.imp.describe()
    }

    /// Allocates and registers `len` bytes of zeroed memory.
    pub fn alloc_region(&self, len: usize, access: Access) -> Result<Region> {
        self.imp.register(RegionSource::Memory(len), access)
    }

    /// Registers `len` bytes of a file from `offset` (a pool file, so that peers read and write
    /// the pool itself). The file must already be that large.
    pub fn register_file(
        &self,
        path: &Path,
        offset: u64,
        len: usize,
        access: Access,
    ) -> Result<Region> {
        self.imp
            .register(RegionSource::File { path, offset, len }, access)
    }

    pub fn completion_queue(&self) -> Result<CompletionQueue> {
        Ok(CompletionQueue {
            imp: self.imp.completion_queue()?,
            domain: self.id,
            spinner: Spinner::new(self.cfg.spin),
            idle_polls: AtomicU32::new(0),
            woken: AtomicBool::new(false),
            slice_ns: AtomicU64::new(SLEEP_SLICE.as_nanos() as u64),
        })
    }

    /// Listens for connections on `addr` ("host:port"; port 0 picks a free one).
    pub fn listen(&self, addr: &str) -> Result<Listener> {
        Ok(Listener {
            imp: self.imp.listen(addr)?,
            woken: AtomicBool::new(false),
        })
    }

    /// Connects to a listener, authenticating both ways; the connection's completions go to `cq`.
    pub fn connect(&self, addr: &str, cq: &CompletionQueue) -> Result<Connection> {
        self.connect_within(addr, cq, self.cfg.connect_timeout)
    }

    /// [`Domain::connect`], giving up on a peer that does not answer within `timeout`
    /// (at most the configured connect timeout).
    pub fn connect_within(
        &self,
        addr: &str,
        cq: &CompletionQueue,
        timeout: Duration,
    ) -> Result<Connection> {
        self.check_cq(cq)?;
        self.imp
            .connect(addr, cq, timeout.min(self.cfg.connect_timeout))
    }

    fn check_cq(&self, cq: &CompletionQueue) -> Result<()> {
        if cq.domain != self.id {
            return Err(Error::ForeignRegion);
        }
        Ok(())
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

pub struct Listener {
    imp: Box<dyn ListenerImpl>,
    /// Set by [`Listener::wake`].
    woken: AtomicBool,
}

impl Listener {
    /// Waits up to `timeout` for one peer, runs the handshake, and binds the connection to `cq`.
    /// A peer that fails the handshake is refused (logged) and reported as the error.
    pub fn accept(&self, cq: &CompletionQueue, timeout: Duration) -> Result<Connection> {
        self.imp.accept(cq, timeout)
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> String {
        self.imp.local_addr()
    }

    /// Makes every [`Listener::accept`] waiting now return at once, and every later one
    /// too (with a timeout or an error): for a server that stops, whose acceptors may
    /// then sleep long in `accept` while it is idle.
    pub fn wake(&self) {
        self.woken.store(true, Ordering::SeqCst);
        self.imp.wake()
    }

    /// Whether [`Listener::wake`] was called: it accepts no one any more.
    pub fn is_woken(&self) -> bool {
        self.woken.load(Ordering::SeqCst)
    }
}

struct ConnHandle {
    imp: Arc<dyn ConnImpl>,
}

impl Drop for ConnHandle {
    fn drop(&mut self) {
        self.imp.close();
    }
}

/// A reliable, connected endpoint (an RC queue pair, in verbs terms). Cloning shares it; it
/// closes when the last clone is dropped or on [`Connection::close`].
#[derive(Clone)]
pub struct Connection {
    handle: Arc<ConnHandle>,
    id: ConnId,
    epoch: u64,
    peer: Arc<str>,
    domain: u64,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Connection#{} to {} (epoch {})",
            self.id, self.peer, self.epoch
        )
    }
}

impl Connection {
    pub(crate) fn new(
        imp: Arc<dyn ConnImpl>,
        id: ConnId,
        epoch: u64,
        peer: String,
        domain: u64,
    ) -> Connection {
        Connection {
            handle: Arc::new(ConnHandle { imp }),
            id,
            epoch,
            peer: peer.into(),
            domain,
        }
    }

    pub fn id(&self) -> ConnId {
        self.id
    }

    /// The cluster epoch both sides agreed on at the handshake.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    pub fn is_alive(&self) -> bool {
        self.handle.imp.is_alive()
    }

    /// Says that `len` bytes at `roff` of `remote` will be written soon (a chunk of
    /// pages granted to a client). With RDMA there is nothing to do: the target
    /// registered, and so pinned, its memory. The local backend's one-sided writes
    /// are copies into the target's file mapped in this process, whose pages would
    /// each fault in at their first write (~2 µs here, in the write's latency); it
    /// maps them now, in one call. Only a hint: it moves no byte.
    pub fn prefault_remote(&self, remote: &RemoteRegion, roff: u64, len: usize) -> Result<()> {
        self.handle
            .imp
            .prefault_remote(remote.key, remote.addr.wrapping_add(roff), len)
    }

    /// Closes the connection; outstanding operations complete with `Closed` or `PeerGone`.
    pub fn close(&self) {
        self.handle.imp.close();
    }

    fn local(&self, buf: &Region, off: u64, len: usize) -> Result<()> {
        if buf.inner.domain != self.domain {
            return Err(Error::ForeignRegion);
        }
        buf.inner.map.check(off, len).map(|_| ())
    }

    fn post(&self, op: PostOp) -> Result<()> {
        self.local(&op.local, op.off, op.len)?;
        if let Some((r, roff)) = op.remote {
            r.slice(roff, op.len as u64)?;
        }
        self.handle.imp.post(op)
    }

    /// Sends `len` bytes at `off` of `buf`; the peer receives them into its oldest posted RECV.
    pub fn post_send(&self, wr_id: u64, buf: &Region, off: u64, len: usize) -> Result<()> {
        if len > MAX_MESSAGE {
            return Err(Error::MessageTooLarge {
                len,
                max: MAX_MESSAGE,
            });
        }
        self.post(PostOp {
            kind: OpKind::Send,
            wr_id,
            local: buf.clone(),
            off,
            len,
            remote: None,
            imm: 0,
        })
    }

    /// Posts a buffer for one incoming message of at most `len` bytes.
    pub fn post_recv(&self, wr_id: u64, buf: &Region, off: u64, len: usize) -> Result<()> {
        self.post(PostOp {
            kind: OpKind::Recv,
            wr_id,
            local: buf.clone(),
            off,
            len,
            remote: None,
            imm: 0,
        })
    }

    /// One-sided READ of `len` bytes at `roff` of `remote` into `dst` at `off`.
    pub fn post_read(
        &self,
        wr_id: u64,
        dst: &Region,
        off: u64,
        remote: &RemoteRegion,
        roff: u64,
        len: usize,
    ) -> Result<()> {
        self.one_sided(OpKind::Read, wr_id, dst, off, remote, roff, len, 0)
    }

    /// One-sided WRITE of `len` bytes at `off` of `src` to `roff` of `remote`.
    pub fn post_write(
        &self,
        wr_id: u64,
        src: &Region,
        off: u64,
        remote: &RemoteRegion,
        roff: u64,
        len: usize,
    ) -> Result<()> {
        self.one_sided(OpKind::Write, wr_id, src, off, remote, roff, len, 0)
    }

    /// WRITE whose arrival the target sees as a `RemoteWrite` completion carrying `imm`, after
    /// the data is in place.
    #[allow(clippy::too_many_arguments)]
    pub fn post_write_imm(
        &self,
        wr_id: u64,
        src: &Region,
        off: u64,
        remote: &RemoteRegion,
        roff: u64,
        len: usize,
        imm: u32,
    ) -> Result<()> {
        self.one_sided(OpKind::WriteImm, wr_id, src, off, remote, roff, len, imm)
    }

    #[allow(clippy::too_many_arguments)]
    fn one_sided(
        &self,
        kind: OpKind,
        wr_id: u64,
        local: &Region,
        off: u64,
        remote: &RemoteRegion,
        roff: u64,
        len: usize,
        imm: u32,
    ) -> Result<()> {
        self.post(PostOp {
            kind,
            wr_id,
            local: local.clone(),
            off,
            len,
            remote: Some((*remote, roff)),
            imm,
        })
    }
}

/// Where completions of the connections bound to it arrive. Poll it, or wait: a wait spins for
/// an adaptive budget (bounded by the domain's [`crate::SpinPolicy`]) before it sleeps, so a
/// busy peer is answered without a wake-up and an idle one costs no CPU.
pub struct CompletionQueue {
    pub(crate) imp: Arc<dyn CqImpl>,
    pub(crate) domain: u64,
    spinner: Spinner,
    idle_polls: AtomicU32,
    /// Set by [`CompletionQueue::wake`]: the waiter returns with nothing.
    woken: AtomicBool,
    /// Longest sleep between two looks at the peers' liveness while waiting, in ns
    /// ([`CompletionQueue::look_at_peers_every`]).
    slice_ns: AtomicU64,
}

/// How often a busy poller checks that its peers are still alive.
const POLLS_PER_PEER_CHECK: u32 = 1 << 14;
/// Longest sleep between two liveness checks while waiting, by default.
const SLEEP_SLICE: Duration = Duration::from_millis(50);
/// The slice of a daemon's loop queue ([`CompletionQueue::look_at_peers_every`]):
/// no shorter than most of their loops' waits (the mirror's 200 ms; the MDS's and a
/// store's heartbeat period, 250 ms by default, a store's at most 500 ms), so that
/// mostly a long wait inside a loop (a mirror's copy, the mount's callback thread's
/// 1 s) sleeps in slices.
pub const DAEMON_PEER_LOOKS: Duration = Duration::from_millis(250);

impl CompletionQueue {
    /// The backend's queue behind this one (a connection must be bound to a queue of its own
    /// backend).
    pub(crate) fn backend<T: Send + Sync + 'static>(&self) -> Result<Arc<T>> {
        self.imp
            .clone()
            .as_any_arc()
            .downcast::<T>()
            .map_err(|_| Error::ForeignRegion)
    }

    /// Moves up to `max` completions to `out` without blocking; returns how many.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let n = self.imp.poll(out, max);
        if n == 0
            && self.idle_polls.fetch_add(1, Ordering::Relaxed) % POLLS_PER_PEER_CHECK
                == POLLS_PER_PEER_CHECK - 1
        {
            self.imp.check_peers();
        }
        n
    }

    /// Makes a [`CompletionQueue::wait`] in another thread (or the next one) return
    /// at once, with no completion (`Ok(0)`): for a thread that hands the waiter work
    /// from outside the queue, such as a connection just accepted, which the waiter
    /// must adopt before its completions can arrive.
    pub fn wake(&self) {
        self.woken.store(true, Ordering::SeqCst);
        self.imp.wake();
    }

    /// Has a [`CompletionQueue::wait`] look at the peers' liveness (a dead peer's
    /// connection breaks, with an error completion) at most `every` apart while it
    /// sleeps, and at its end; 50 ms by default. A daemon's loop whose every wait is
    /// shorter than `every` (its own period: the heartbeat period of a store or MDS)
    /// looks once per wait: the 50 ms slices doubled or tripled an idle daemon's
    /// wake-ups, each 20–90 µs of CPU on a VM, and found a dead peer no sooner than
    /// the loop's own period does.
    pub fn look_at_peers_every(&self, every: Duration) {
        let ns = every.as_nanos().clamp(1_000_000, u64::MAX as u128) as u64;
        self.slice_ns.store(ns, Ordering::Relaxed);
    }

    /// Waits up to `timeout` for at least one completion; `Err(Timeout)` if none came.
    /// `Ok(0)` after a [`CompletionQueue::wake`].
    pub fn wait(&self, out: &mut Vec<Completion>, max: usize, timeout: Duration) -> Result<usize> {
        let start = Instant::now();
        let n = self.imp.poll(out, max);
        if n > 0 {
            return Ok(n);
        }
        let budget = self.spinner.budget().min(timeout);
        loop {
            let n = self.imp.poll(out, max);
            if n > 0 {
                self.spinner.hit(start.elapsed());
                return Ok(n);
            }
            let spun = start.elapsed();
            if spun >= budget {
                break;
            }
            self.spinner.pause(spun);
        }
        loop {
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                self.imp.check_peers();
                let n = self.imp.poll(out, max);
                if n > 0 {
                    return Ok(n);
                }
                self.spinner.miss(None);
                return Err(Error::Timeout(timeout));
            }
            if self.woken.swap(false, Ordering::SeqCst) {
                return Ok(0);
            }
            let slice = Duration::from_nanos(self.slice_ns.load(Ordering::Relaxed));
            self.imp.sleep((timeout - elapsed).min(slice), &self.woken);
            let mut n = self.imp.poll(out, max);
            if n == 0 {
                self.imp.check_peers();
                n = self.imp.poll(out, max);
            }
            if n > 0 {
                self.spinner.miss(Some(start.elapsed()));
                return Ok(n);
            }
        }
    }

    /// Waits for the completion of `wr_id` on `conn`, keeping every other completion in `other`
    /// for the caller. For simple request/response code and tests.
    pub fn wait_for(
        &self,
        conn: ConnId,
        wr_id: u64,
        other: &mut Vec<Completion>,
        timeout: Duration,
    ) -> Result<Completion> {
        let deadline = Instant::now() + timeout;
        let mut batch = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(timeout));
            }
            batch.clear();
            self.wait(&mut batch, 64, left)?;
            let mut found = None;
            for c in batch.drain(..) {
                if found.is_none()
                    && c.conn == conn
                    && c.wr_id == wr_id
                    && c.kind != OpKind::RemoteWrite
                {
                    found = Some(c);
                } else {
                    other.push(c);
                }
            }
            if let Some(c) = found {
                return Ok(c);
            }
        }
    }
}

/// Where a shared-memory backend keeps files peers must open: `/dev/shm` when present.
pub(crate) fn shm_dir() -> PathBuf {
    let p = PathBuf::from("/dev/shm");
    if p.is_dir() {
        p
    } else {
        std::env::temp_dir()
    }
}
