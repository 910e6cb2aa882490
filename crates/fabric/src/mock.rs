//! The in-process mock fabric, for tests: every domain, region and connection lives in one
//! process, and a seeded [`Faults`] plan drops, corrupts, delays or reorders what flows through
//! it. [`MockNet::kill`] makes a domain vanish the way a crashed node does.
//!
//! It honours the same contract as the real backends (the conformance suite runs against all
//! of them): exactly one completion per posted operation, target-side key and bounds checks,
//! RECV buffers consumed in order, flushes with `PeerGone` when the peer dies.

use std::collections::{HashMap, VecDeque};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::api::{
    next_conn_id, Completion, CompletionQueue, ConnId, ConnImpl, Connection, CqImpl, DomainImpl,
    ListenerImpl, OpKind, PostOp, RegionSource,
};
use crate::auth;
use crate::config::FabricConfig;
use crate::error::{Error, Result};
use crate::region::{random_u64, Access, Mapping, Region, RegionBackend, RegionInner};

mod faults;
mod holds;
pub use faults::{Faults, Link};
pub use holds::Gather;

/// How long an operation across a cut link takes to fail (a transport's retries).
const CUT_TIMEOUT: Duration = Duration::from_millis(50);

/// An in-process network of mock domains. Clone it into each [`FabricConfig`] that should
/// share the network.
#[derive(Clone)]
pub struct MockNet {
    inner: Arc<NetInner>,
}

struct NetInner {
    listeners: Mutex<HashMap<String, Arc<ListenQueue>>>,
    faults: Mutex<(Faults, StdRng)>,
    domains: Mutex<HashMap<u64, Weak<DomainState>>>,
    next_port: AtomicU32,
    /// Links that are not [`Link::Up`], by the pair of domain ids (smaller first).
    links: Mutex<HashMap<(u64, u64), Link>>,
    /// What holds posts up (slowed pairs, a gathering).
    holds: holds::Holds,
}

impl MockNet {
    pub fn new(seed: u64) -> MockNet {
        MockNet {
            inner: Arc::new(NetInner {
                listeners: Mutex::new(HashMap::new()),
                faults: Mutex::new((Faults::default(), StdRng::seed_from_u64(seed))),
                domains: Mutex::new(HashMap::new()),
                next_port: AtomicU32::new(1),
                links: Mutex::new(HashMap::new()),
                holds: holds::Holds::default(),
            }),
        }
    }

    pub fn set_faults(&self, f: Faults) {
        self.inner.faults.lock().unwrap().0 = f;
    }

    /// Sets the link between the nodes listening at `a` and `b`; false if either
    /// address has no listener.
    pub fn set_link(&self, a: &str, b: &str, link: Link) -> bool {
        let ids = {
            let ls = self.inner.listeners.lock().unwrap();
            ls.get(a).map(|l| l.domain).zip(ls.get(b).map(|l| l.domain))
        };
        let Some((x, y)) = ids else {
            return false;
        };
        let mut links = self.inner.links.lock().unwrap();
        match link {
            Link::Up => links.remove(&(x.min(y), x.max(y))),
            l => links.insert((x.min(y), x.max(y)), l),
        };
        true
    }

    /// Kills a domain: its peers see `PeerGone`, its own operations fail.
    pub fn kill(&self, domain: &crate::Domain) {
        self.kill_id(domain.id());
    }

    /// Kills the domain that listens at `addr` (a server's process died), as
    /// [`MockNet::kill`]; false if nothing listens there.
    pub fn kill_listener(&self, addr: &str) -> bool {
        let id = self
            .inner
            .listeners
            .lock()
            .unwrap()
            .get(addr)
            .map(|l| l.domain);
        id.map(|id| self.kill_id(id)).is_some()
    }

    fn kill_id(&self, id: u64) {
        if let Some(d) = self
            .inner
            .domains
            .lock()
            .unwrap()
            .get(&id)
            .and_then(Weak::upgrade)
        {
            d.alive.store(false, Ordering::Release);
        }
        // Its listeners go, and the connections queued at them are refused at once.
        let mut ls = self.inner.listeners.lock().unwrap();
        for l in ls.values().filter(|l| l.domain == id) {
            l.pending.lock().unwrap().take();
        }
        ls.retain(|_, l| l.domain != id);
    }

    pub(crate) fn domain(&self, cfg: Arc<FabricConfig>, id: u64) -> MockDomain {
        let state = Arc::new(DomainState {
            id,
            alive: AtomicBool::new(true),
            regions: Mutex::new(HashMap::new()),
        });
        self.inner
            .domains
            .lock()
            .unwrap()
            .insert(id, Arc::downgrade(&state));
        MockDomain {
            net: self.inner.clone(),
            cfg,
            state,
        }
    }
}

impl NetInner {
    fn link(&self, x: u64, y: u64) -> Link {
        let links = self.links.lock().unwrap();
        if links.is_empty() {
            return Link::Up;
        }
        links
            .get(&(x.min(y), x.max(y)))
            .copied()
            .unwrap_or(Link::Up)
    }

    fn plan(&self) -> Faults {
        self.faults.lock().unwrap().0.clone()
    }

    /// True with probability `p` (from the seeded generator). Takes the fault lock: never
    /// call it while holding that lock.
    fn roll(&self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        self.faults.lock().unwrap().1.gen_bool(p.min(1.0))
    }
}

struct DomainState {
    id: u64,
    alive: AtomicBool,
    regions: Mutex<HashMap<u64, Weak<RegionInner>>>,
}

struct MockRegion {
    domain: Weak<DomainState>,
    key: u64,
}

impl RegionBackend for MockRegion {
    fn revoke(&self) {
        if let Some(d) = self.domain.upgrade() {
            d.regions.lock().unwrap().remove(&self.key);
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

pub(crate) struct MockDomain {
    net: Arc<NetInner>,
    cfg: Arc<FabricConfig>,
    state: Arc<DomainState>,
}

impl DomainImpl for MockDomain {
    fn register(&self, src: RegionSource<'_>, access: Access) -> Result<Region> {
        let map = src.map()?;
        let key = random_u64();
        let backend = MockRegion {
            domain: Arc::downgrade(&self.state),
            key,
        };
        let inner = Arc::new(RegionInner {
            map,
            key,
            wire_addr: 0,
            access,
            domain: self.state.id,
            backend: Some(Box::new(backend)),
        });
        if access.is_remote() {
            self.state
                .regions
                .lock()
                .unwrap()
                .insert(key, Arc::downgrade(&inner));
        }
        Ok(Region { inner })
    }

    fn completion_queue(&self) -> Result<Arc<dyn CqImpl>> {
        Ok(Arc::new(MockCq {
            net: self.net.clone(),
            state: Mutex::new(CqState::default()),
            cv: Condvar::new(),
        }))
    }

    fn listen(&self, addr: &str) -> Result<Box<dyn ListenerImpl>> {
        let name = if addr.ends_with(":0") {
            format!(
                "mock:{}",
                self.net.next_port.fetch_add(1, Ordering::Relaxed)
            )
        } else {
            addr.to_string()
        };
        let q = Arc::new(ListenQueue {
            domain: self.state.id,
            pending: Mutex::new(Some(VecDeque::new())),
            cv: Condvar::new(),
            woken: AtomicBool::new(false),
        });
        let mut ls = self.net.listeners.lock().unwrap();
        if ls.contains_key(&name) {
            return Err(Error::io(
                format!("listening on {name}"),
                std::io::ErrorKind::AddrInUse.into(),
            ));
        }
        ls.insert(name.clone(), q.clone());
        Ok(Box::new(MockListener {
            name,
            queue: q,
            domain: self.clone_handle(),
        }))
    }

    fn connect(&self, addr: &str, cq: &CompletionQueue, timeout: Duration) -> Result<Connection> {
        let queue = self
            .net
            .listeners
            .lock()
            .unwrap()
            .get(addr)
            .cloned()
            .ok_or_else(|| Error::gone(addr, "nothing listens there"))?;
        if self.net.link(self.state.id, queue.domain) == Link::Cut {
            std::thread::sleep(timeout);
            return Err(Error::Timeout(timeout));
        }
        let (mut mine, theirs) = UnixStream::pair().map_err(|e| Error::io("socketpair", e))?;
        mine.set_read_timeout(Some(timeout)).ok();
        theirs.set_read_timeout(Some(timeout)).ok();
        let conn = self.new_conn(cq, addr)?;
        let (tx, rx) = mpsc::channel();
        queue
            .pending
            .lock()
            .unwrap()
            .as_mut()
            .ok_or_else(|| Error::gone(addr, "nothing listens there"))?
            .push_back(Pending {
                stream: theirs,
                client: conn.clone(),
                reply: tx,
            });
        queue.cv.notify_all();
        let p = auth::Params::new(&self.cfg, addr.to_string());
        auth::client(&mut mine, &p)?;
        let server = rx
            .recv_timeout(timeout)
            .map_err(|_| Error::gone(addr, "the listener did not accept"))??;
        *conn.peer.lock().unwrap() = Arc::downgrade(&server);
        Ok(Connection::new(
            conn.clone(),
            conn.id,
            self.cfg.epoch,
            addr.to_string(),
            self.state.id,
        ))
    }

    fn describe(&self) -> String {
        "mock (in-process)".into()
    }
}

impl MockDomain {
    fn clone_handle(&self) -> MockDomain {
        MockDomain {
            net: self.net.clone(),
            cfg: self.cfg.clone(),
            state: self.state.clone(),
        }
    }

    fn new_conn(&self, cq: &CompletionQueue, peer: &str) -> Result<Arc<MockConn>> {
        let mcq = cq.backend::<MockCq>()?;
        let conn = Arc::new(MockConn {
            id: next_conn_id(),
            net: self.net.clone(),
            domain: self.state.clone(),
            peer: Mutex::new(Weak::new()),
            peer_name: peer.to_string(),
            cq: mcq.clone(),
            inbox: Mutex::new(VecDeque::new()),
            posted: Mutex::new(VecDeque::new()),
            closed: AtomicBool::new(false),
        });
        mcq.state.lock().unwrap().conns.push(conn.clone());
        Ok(conn)
    }
}

struct Pending {
    stream: UnixStream,
    client: Arc<MockConn>,
    reply: mpsc::Sender<Result<Arc<MockConn>>>,
}

struct ListenQueue {
    domain: u64,
    /// Connections waiting for `accept`; `None` once the listener is gone: a connect
    /// is then refused at once, as TCP's is (seed 166 waited out 5 s handshakes).
    pending: Mutex<Option<VecDeque<Pending>>>,
    cv: Condvar,
    /// Set by `wake`: accepts return at once.
    woken: AtomicBool,
}

struct MockListener {
    name: String,
    queue: Arc<ListenQueue>,
    domain: MockDomain,
}

impl ListenerImpl for MockListener {
    fn accept(&self, cq: &CompletionQueue, timeout: Duration) -> Result<Connection> {
        let deadline = Instant::now() + timeout;
        let mut pending = self.queue.pending.lock().unwrap();
        let mut p = loop {
            if let Some(p) = pending.as_mut().and_then(VecDeque::pop_front) {
                break p;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.queue.woken.load(Ordering::SeqCst) {
                return Err(Error::Timeout(timeout));
            }
            pending = self.queue.cv.wait_timeout(pending, left).unwrap().0;
        };
        drop(pending);
        let d = &self.domain;
        let peer = format!("mock client #{}", p.client.id);
        let params = auth::Params::new(&d.cfg, peer.clone());
        if let Err(e) = auth::server(&mut p.stream, &params) {
            let _ = p.reply.send(Err(e.clone()));
            return Err(e);
        }
        let conn = d.new_conn(cq, &peer)?;
        *conn.peer.lock().unwrap() = Arc::downgrade(&p.client);
        let _ = p.reply.send(Ok(conn.clone()));
        Ok(Connection::new(
            conn.clone(),
            conn.id,
            d.cfg.epoch,
            peer,
            d.state.id,
        ))
    }

    fn local_addr(&self) -> String {
        self.name.clone()
    }

    fn wake(&self) {
        let _held = self.queue.pending.lock().unwrap();
        self.queue.woken.store(true, Ordering::SeqCst);
        self.queue.cv.notify_all();
    }
}

impl Drop for MockListener {
    fn drop(&mut self) {
        // Only its own entry: a killed node's name may already serve its successor.
        let mut ls = self.domain.net.listeners.lock().unwrap();
        if ls
            .get(&self.name)
            .is_some_and(|l| l.domain == self.domain.state.id)
        {
            ls.remove(&self.name);
        }
        drop(ls);
        // Connections not accepted yet are refused: their handshakes fail now.
        self.queue.pending.lock().unwrap().take();
    }
}

enum Msg {
    Data(Vec<u8>),
    Imm(u32),
}

struct PostedRecv {
    wr_id: u64,
    buf: Region,
    off: u64,
    len: usize,
}

struct MockConn {
    id: ConnId,
    net: Arc<NetInner>,
    domain: Arc<DomainState>,
    peer: Mutex<Weak<MockConn>>,
    peer_name: String,
    cq: Arc<MockCq>,
    inbox: Mutex<VecDeque<Msg>>,
    posted: Mutex<VecDeque<PostedRecv>>,
    closed: AtomicBool,
}

impl MockConn {
    fn live_peer(&self) -> Result<Arc<MockConn>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if !self.domain.alive.load(Ordering::Acquire) {
            return Err(Error::gone(&self.peer_name, "this node was killed"));
        }
        let peer = self
            .peer
            .lock()
            .unwrap()
            .upgrade()
            .ok_or_else(|| Error::gone(&self.peer_name, "connection closed by the peer"))?;
        if peer.closed.load(Ordering::Acquire) {
            return Err(Error::gone(
                &self.peer_name,
                "connection closed by the peer",
            ));
        }
        if !peer.domain.alive.load(Ordering::Acquire) {
            return Err(Error::gone(&self.peer_name, "the peer's node died"));
        }
        Ok(peer)
    }

    /// The target-side check of a one-sided access: key known, permission, bounds.
    fn target_region(
        peer: &MockConn,
        key: u64,
        off: u64,
        len: usize,
        write: bool,
    ) -> Result<Region> {
        let inner = peer
            .domain
            .regions
            .lock()
            .unwrap()
            .get(&key)
            .and_then(Weak::upgrade)
            .ok_or(Error::UnknownKey { key })?;
        let r = Region { inner };
        let allowed = if write {
            r.access().remote_write
        } else {
            r.access().remote_read
        };
        if !allowed {
            return Err(Error::RemoteAccess(format!(
                "region {key:#x} is not remotely {}",
                if write { "writable" } else { "readable" }
            )));
        }
        r.inner
            .map
            .check(off, len)
            .map_err(|e| Error::RemoteAccess(e.to_string()))?;
        Ok(r)
    }

    fn execute(&self, op: &PostOp) -> Result<()> {
        let peer = self.live_peer()?;
        let plan = self.net.plan();
        let link = self.net.link(self.domain.id, peer.domain.id);
        if link == Link::Cut {
            std::thread::sleep(CUT_TIMEOUT);
            self.close();
            peer.close();
            return Err(Error::Timeout(CUT_TIMEOUT));
        }
        let ls = || self.net.listeners.lock().unwrap();
        let client = || !ls().values().any(|l| l.domain == self.domain.id);
        self.net.holds.hold(self.domain.id, peer.domain.id, client);
        let flaky = match link {
            Link::Flaky(p) => self.net.roll(p),
            _ => false,
        };
        if flaky || self.net.roll(plan.break_conn) {
            self.close();
            peer.close();
            return Err(Error::gone(
                &self.peer_name,
                "the connection broke (an injected fault)",
            ));
        }
        match op.kind {
            OpKind::Send => {
                let mut data = vec![0u8; op.len];
                op.local.read(op.off, &mut data)?;
                if self.net.roll(plan.drop_send) {
                    return Ok(());
                }
                if !data.is_empty() && self.net.roll(plan.corrupt_send) {
                    let i = self.net.faults.lock().unwrap().1.gen_range(0..data.len());
                    data[i] ^= 0x5a;
                }
                peer.inbox.lock().unwrap().push_back(Msg::Data(data));
                peer.cq.cv.notify_all();
                Ok(())
            }
            OpKind::Read => {
                let (key, roff) = op.wire_addr();
                let r = Self::target_region(&peer, key, roff, op.len, false)?;
                Mapping::copy(&r.inner.map, roff, &op.local.inner.map, op.off, op.len)?;
                self.lived_through(&peer)
            }
            OpKind::Write | OpKind::WriteImm => {
                let (key, roff) = op.wire_addr();
                let r = Self::target_region(&peer, key, roff, op.len, true)?;
                Mapping::copy(&op.local.inner.map, op.off, &r.inner.map, roff, op.len)?;
                self.lived_through(&peer)?;
                if op.kind == OpKind::WriteImm {
                    peer.inbox.lock().unwrap().push_back(Msg::Imm(op.imm));
                    peer.cq.cv.notify_all();
                }
                Ok(())
            }
            OpKind::Recv | OpKind::RemoteWrite => unreachable!("not executed"),
        }
    }

    /// RDMA's rule, as every backend keeps it: a one-sided operation completes only if
    /// its target lived through it (a kill may land in a slow post); else it breaks.
    fn lived_through(&self, peer: &MockConn) -> Result<()> {
        if peer.domain.alive.load(Ordering::Acquire) {
            return Ok(());
        }
        self.close();
        peer.close();
        Err(Error::gone(&self.peer_name, "the peer's node died"))
    }

    /// Matches arrived messages with posted RECVs, in order.
    fn deliver(&self, out: &mut Vec<Completion>) {
        let mut inbox = self.inbox.lock().unwrap();
        let mut posted = self.posted.lock().unwrap();
        while let Some(front) = inbox.front() {
            match front {
                Msg::Imm(imm) => {
                    out.push(Completion {
                        conn: self.id,
                        wr_id: 0,
                        kind: OpKind::RemoteWrite,
                        len: 0,
                        imm: *imm,
                        status: Ok(()),
                    });
                    inbox.pop_front();
                }
                Msg::Data(d) => {
                    let Some(r) = posted.pop_front() else { break };
                    if d.len() > r.len {
                        out.push(Completion::failed(
                            self.id,
                            r.wr_id,
                            OpKind::Recv,
                            Error::RecvTooSmall {
                                len: d.len(),
                                cap: r.len,
                            },
                        ));
                        let e = Error::oversized(&self.peer_name);
                        for r in posted.drain(..) {
                            out.push(Completion::failed(
                                self.id,
                                r.wr_id,
                                OpKind::Recv,
                                e.clone(),
                            ));
                        }
                        inbox.clear();
                        self.closed.store(true, Ordering::Release);
                        return;
                    } else {
                        let c = match r.buf.write(r.off, d) {
                            Ok(()) => Completion::ok(self.id, r.wr_id, OpKind::Recv, d.len()),
                            Err(e) => Completion::failed(self.id, r.wr_id, OpKind::Recv, e),
                        };
                        out.push(c);
                    }
                    inbox.pop_front();
                }
            }
        }
    }

    fn flush(&self, e: &Error, out: &mut Vec<Completion>) {
        for r in self.posted.lock().unwrap().drain(..) {
            out.push(Completion::failed(
                self.id,
                r.wr_id,
                OpKind::Recv,
                e.clone(),
            ));
        }
    }
}

impl ConnImpl for MockConn {
    fn post(&self, op: PostOp) -> Result<()> {
        self.live_peer()?;
        if op.kind == OpKind::Recv {
            self.posted.lock().unwrap().push_back(PostedRecv {
                wr_id: op.wr_id,
                buf: op.local.clone(),
                off: op.off,
                len: op.len,
            });
            self.cq.cv.notify_all();
            return Ok(());
        }
        let c = match self.execute(&op) {
            Ok(()) => Completion::ok(self.id, op.wr_id, op.kind, op.len),
            Err(e) => Completion::failed(self.id, op.wr_id, op.kind, e),
        };
        self.cq.push(c);
        Ok(())
    }

    fn is_alive(&self) -> bool {
        self.live_peer().is_ok()
    }

    fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            let mut out = Vec::new();
            self.flush(&Error::Closed, &mut out);
            for c in out {
                self.cq.push(c);
            }
            if let Some(p) = self.peer.lock().unwrap().upgrade() {
                p.cq.cv.notify_all();
            }
        }
    }
}

#[derive(Default)]
struct CqState {
    conns: Vec<Arc<MockConn>>,
    /// Finished completions, each with the number of polls it is still held back for.
    ready: VecDeque<(Completion, u32)>,
}

pub(crate) struct MockCq {
    net: Arc<NetInner>,
    state: Mutex<CqState>,
    cv: Condvar,
}

impl MockCq {
    fn push(&self, c: Completion) {
        let delay = self.net.plan().delay;
        let held = if self.net.roll(delay) {
            self.net.faults.lock().unwrap().1.gen_range(1..4)
        } else {
            0
        };
        self.state.lock().unwrap().ready.push_back((c, held));
        self.cv.notify_all();
    }
}

impl CqImpl for MockCq {
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let conns: Vec<Arc<MockConn>> = self.state.lock().unwrap().conns.clone();
        let mut fresh = Vec::new();
        for c in &conns {
            c.deliver(&mut fresh);
        }
        for c in fresh {
            self.push(c);
        }
        let mut st = self.state.lock().unwrap();
        st.conns
            .retain(|c| !c.closed.load(Ordering::Acquire) || !c.posted.lock().unwrap().is_empty());
        if self.net.plan().reorder && st.ready.len() > 1 {
            let mut v: Vec<_> = st.ready.drain(..).collect();
            let mut f = self.net.faults.lock().unwrap();
            for i in (1..v.len()).rev() {
                let j = f.1.gen_range(0..=i);
                v.swap(i, j);
            }
            st.ready = v.into();
        }
        let mut n = 0;
        let mut kept = VecDeque::new();
        while let Some((c, held)) = st.ready.pop_front() {
            if held > 0 {
                kept.push_back((c, held - 1));
            } else if n < max {
                out.push(c);
                n += 1;
            } else {
                kept.push_back((c, 0));
            }
        }
        st.ready = kept;
        n
    }

    fn sleep(&self, timeout: Duration, woken: &AtomicBool) {
        let st = self.state.lock().unwrap();
        let nothing = !woken.load(Ordering::SeqCst)
            && st.ready.is_empty()
            && st.conns.iter().all(|c| c.inbox.lock().unwrap().is_empty());
        if nothing {
            let _ = self.cv.wait_timeout(st, timeout);
        }
    }

    fn wake(&self) {
        // Under the state lock: a sleeper between its check and its wait is not missed.
        let _st = self.state.lock().unwrap();
        self.cv.notify_all();
    }

    fn as_any_arc(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }

    fn check_peers(&self) {
        let conns: Vec<Arc<MockConn>> = self.state.lock().unwrap().conns.clone();
        for c in conns {
            if let Err(e) = c.live_peer() {
                if e != Error::Closed {
                    let mut out = Vec::new();
                    c.flush(&e, &mut out);
                    for x in out {
                        self.push(x);
                    }
                }
            }
        }
    }
}
