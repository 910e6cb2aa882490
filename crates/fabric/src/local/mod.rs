//! The same-host backend: processes on one machine share memory.
//!
//! Registered regions live in files (in `/dev/shm`, or the pool file itself) that peers map,
//! so a one-sided READ or WRITE is a memory copy done by the initiator. The target's CPU takes
//! no part, as with RDMA or CXL memory; the target's region table (see `table`) is what
//! refuses unknown or revoked keys, bad permissions and out-of-range accesses. SEND and WRITE
//! with immediate travel through a pair of shared-memory rings per connection; a sleeping
//! completion queue is woken through a futex doorbell in its domain file.

mod conn;
use conn::*;
mod liveness;
mod ring;
mod table;

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::api::{
    next_conn_id, shm_dir, Completion, CompletionQueue, ConnId, ConnImpl, Connection, CqImpl,
    DomainImpl, ListenerImpl, OpKind, PostOp, RegionSource,
};
use crate::auth;
use crate::config::FabricConfig;
use crate::error::{Error, Result};
use crate::region::{random_u64, Access, Mapping, Region, RegionBackend, RegionInner};
use crate::tcp;
use ring::{Ring, KIND_IMM, KIND_MSG};
use table::{DomainFile, SlotEntry, DOORBELLS, TABLE_SLOTS};

/// Bytes of each direction's ring: room for several maximum-size messages.
const RING_BYTES: usize = 512 * 1024;
const RING_CTL: usize = 4096;
const RING_DATA: usize = 16384;
const RING_FILE_LEN: usize = RING_DATA + 2 * RING_BYTES;
const RING_MAGIC: u64 = u64::from_le_bytes(*b"ORFLRNG1");
/// Offsets of the two "closed" flags (connector, acceptor) in a ring file.
const CLOSED_FLAG: [usize; 2] = [64, 128];

fn ring_of(dir: usize) -> Ring {
    Ring {
        ctl: RING_CTL + dir * 4096,
        data: RING_DATA + dir * RING_BYTES,
        size: RING_BYTES,
    }
}

/// Removes the shared-memory files of processes that died without cleaning up (SIGKILL, a
/// crash): their names carry the owner's PID, and a PID without /proc entry is gone.
pub fn sweep_dead_processes_files() {
    remove_files_of(|pid| !Path::new(&format!("/proc/{pid}")).exists());
}

/// Removes this process's shared-memory files, for a process that exits without
/// dropping its domains (the preload library's, whose client lives as long as the
/// program). Mappings stay valid until the process ends; no new peer can connect.
pub fn remove_own_files() {
    let me = std::process::id();
    remove_files_of(|pid| pid == me);
}

/// Removes the shared-memory files whose owner's PID satisfies `whose`.
fn remove_files_of(whose: impl Fn(u32) -> bool) {
    let Ok(dir) = std::fs::read_dir(shm_dir()) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("orion-fabric.")) else {
            continue;
        };
        let Some(pid) = rest.split('.').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if whose(pid) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Creates a shared-memory file only this user may open: whoever opens it reads and writes
/// registered memory, so the owner's uid is the local backend's isolation boundary.
pub(crate) fn private_file(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

fn unique_path(what: &str) -> PathBuf {
    shm_dir().join(format!(
        "orion-fabric.{}.{:016x}.{what}",
        std::process::id(),
        random_u64()
    ))
}

struct Shared {
    /// Holds `file`'s liveness mutex: dropped (unlocked) before the file goes.
    liveness: Option<liveness::Holder>,
    file: DomainFile,
    slots: Mutex<Vec<bool>>,
    bells: Mutex<Vec<bool>>,
    peers: Mutex<HashMap<PathBuf, Weak<PeerDomain>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        drop(self.liveness.take());
        let _ = std::fs::remove_file(&self.file.path);
    }
}

pub(crate) struct LocalDomain {
    cfg: Arc<FabricConfig>,
    id: u64,
    shared: Arc<Shared>,
}

impl LocalDomain {
    pub(crate) fn open(cfg: Arc<FabricConfig>, id: u64) -> Result<LocalDomain> {
        sweep_dead_processes_files();
        let file = DomainFile::create(&unique_path("domain"))?;
        let holder = file.hold_liveness().inspect_err(|_| {
            let _ = std::fs::remove_file(&file.path);
        })?;
        let shared = Arc::new(Shared {
            liveness: Some(holder),
            file,
            slots: Mutex::new(vec![false; TABLE_SLOTS]),
            bells: Mutex::new(vec![false; DOORBELLS]),
            peers: Mutex::new(HashMap::new()),
        });
        Ok(LocalDomain { cfg, id, shared })
    }

    fn peer_domain(&self, path: &Path) -> Result<Arc<PeerDomain>> {
        let mut peers = self.shared.peers.lock().unwrap();
        if let Some(p) = peers.get(path).and_then(Weak::upgrade) {
            return Ok(p);
        }
        use std::os::unix::fs::MetadataExt;
        let owner = std::fs::metadata(path)
            .map_err(|e| Error::io(format!("stat of {}", path.display()), e))?
            .uid();
        let p = Arc::new(PeerDomain {
            owner,
            file: DomainFile::open(path)?,
            cache: Mutex::new(HashMap::new()),
        });
        peers.insert(path.to_path_buf(), Arc::downgrade(&p));
        Ok(p)
    }

    #[allow(clippy::too_many_arguments)]
    fn new_conn(
        &self,
        cq: &CompletionQueue,
        boot: TcpStream,
        ring: Mapping,
        side: usize,
        peer: Arc<PeerDomain>,
        peer_bell: usize,
        name: String,
    ) -> Result<Arc<LocalConn>> {
        let lcq = cq.backend::<LocalCq>()?;
        let conn = Arc::new(LocalConn {
            id: next_conn_id(),
            peer_name: name,
            side,
            ring,
            peer,
            peer_bell,
            cq: Arc::downgrade(&lcq),
            tx: Mutex::new(VecDeque::new()),
            backlogged: AtomicBool::new(false),
            posted: Mutex::new(VecDeque::new()),
            rx: Mutex::new(()),
            broken: Mutex::new(None),
            is_broken: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            boot,
        });
        lcq.conns.lock().unwrap().push(conn.clone());
        Ok(conn)
    }
}

struct LocalRegion {
    shared: Arc<Shared>,
    slot: Option<usize>,
    key: u64,
    unlink: Option<PathBuf>,
}

impl RegionBackend for LocalRegion {
    fn revoke(&self) {
        if let Some(s) = self.slot {
            self.shared.file.revoke(s, self.key);
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for LocalRegion {
    fn drop(&mut self) {
        if let Some(s) = self.slot {
            self.shared.file.revoke(s, self.key);
            let mut slots = self.shared.slots.lock().unwrap();
            // Marked taken when the region was published, freed here only.
            debug_assert!(slots[s], "region slot {s} freed while free");
            slots[s] = false;
        }
        if let Some(p) = &self.unlink {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl DomainImpl for LocalDomain {
    fn register(&self, src: RegionSource<'_>, access: Access) -> Result<Region> {
        let key = random_u64();
        let (map, entry, unlink) = match src {
            RegionSource::Memory(len) if !access.is_remote() => {
                (Mapping::anonymous(len)?, None, None)
            }
            RegionSource::Memory(len) => {
                let path = unique_path("region");
                let f = private_file(&path)
                    .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
                f.set_len(len as u64)
                    .map_err(|e| Error::io(format!("sizing {}", path.display()), e))?;
                let map = Mapping::file(&f, 0, len)?;
                (
                    map,
                    Some(SlotEntry {
                        len: len as u64,
                        file_off: 0,
                        access,
                        path: path.clone(),
                    }),
                    Some(path),
                )
            }
            RegionSource::File { path, offset, len } => {
                if offset % 4096 != 0 {
                    return Err(Error::OutOfBounds {
                        offset,
                        len: len as u64,
                        region_len: 0,
                    });
                }
                let path = std::fs::canonicalize(path)
                    .map_err(|e| Error::io(format!("resolving {}", path.display()), e))?;
                let (_f, map) = Region::open_file(&path, offset, len, true)?;
                let entry = access.is_remote().then_some(SlotEntry {
                    len: len as u64,
                    file_off: offset,
                    access,
                    path,
                });
                (map, entry, None)
            }
        };
        let slot = match &entry {
            Some(e) => {
                let mut slots = self.shared.slots.lock().unwrap();
                let s = slots.iter().position(|u| !u).ok_or_else(|| {
                    Error::io(
                        "registering a region",
                        std::io::Error::other(format!("all {TABLE_SLOTS} region slots are in use")),
                    )
                })?;
                self.shared.file.publish(s, key, e)?;
                slots[s] = true;
                Some(s)
            }
            None => None,
        };
        let backend = LocalRegion {
            shared: self.shared.clone(),
            slot,
            key,
            unlink,
        };
        let inner = RegionInner {
            map,
            key,
            wire_addr: 0,
            access,
            domain: self.id,
            backend: Some(Box::new(backend)),
        };
        Ok(Region {
            inner: Arc::new(inner),
        })
    }

    fn completion_queue(&self) -> Result<Arc<dyn CqImpl>> {
        let mut bells = self.shared.bells.lock().unwrap();
        let bell = bells.iter().position(|u| !u).ok_or_else(|| {
            Error::io(
                "opening a completion queue",
                std::io::Error::other(format!("all {DOORBELLS} doorbells are in use")),
            )
        })?;
        bells[bell] = true;
        Ok(Arc::new(LocalCq {
            shared: self.shared.clone(),
            bell,
            conns: Mutex::new(Vec::new()),
            ready: Mutex::new(VecDeque::new()),
        }))
    }

    fn listen(&self, addr: &str) -> Result<Box<dyn ListenerImpl>> {
        let l = tcp::listen(addr)?;
        Ok(Box::new(LocalListener {
            l,
            domain: LocalDomain {
                cfg: self.cfg.clone(),
                id: self.id,
                shared: self.shared.clone(),
            },
        }))
    }

    fn connect(&self, addr: &str, cq: &CompletionQueue, timeout: Duration) -> Result<Connection> {
        let lcq = cq.backend::<LocalCq>()?;
        let mut s = tcp::connect(addr, timeout)?;
        let p = auth::Params::new(&self.cfg, addr.to_string());
        // The connector creates the ring file; the acceptor maps it, and the name goes
        // once it answered.
        let ring_path = unique_path("ring");
        let f = private_file(&ring_path)
            .map_err(|e| Error::io(format!("creating {}", ring_path.display()), e))?;
        let sized = f
            .set_len(RING_FILE_LEN as u64)
            .map_err(|e| Error::io("sizing a ring file", e));
        let ring = sized.and_then(|_| Mapping::file(&f, 0, RING_FILE_LEN));
        let ring = match ring {
            Ok(r) => r,
            Err(e) => {
                let _ = std::fs::remove_file(&ring_path);
                return Err(e);
            }
        };
        ring.write(0, &RING_MAGIC.to_le_bytes())?;
        let hello = encode_blob(&[
            self.shared.file.path.as_os_str().as_encoded_bytes(),
            &(lcq.bell as u32).to_le_bytes(),
            ring_path.as_os_str().as_encoded_bytes(),
        ]);
        // The setup rides with the handshake's proof (`auth::client_with_setup`).
        let shaken = auth::client_with_setup(&mut s, &p, &hello);
        let _ = std::fs::remove_file(&ring_path);
        let (_session, reply) = shaken?;
        let parts = decode_blob(&reply, 2).ok_or_else(|| Error::Protocol {
            peer: addr.into(),
            why: "malformed local setup reply".into(),
        })?;
        let peer = self.peer_domain(&path_of(&parts[0]))?;
        let bell = bell_of(&parts[1], addr)?;
        tcp::into_liveness(&s)?;
        let conn = self.new_conn(cq, s, ring, 0, peer, bell, addr.to_string())?;
        Ok(Connection::new(
            conn.clone(),
            conn.id,
            self.cfg.epoch,
            addr.to_string(),
            self.id,
        ))
    }

    fn describe(&self) -> String {
        format!("local shared memory ({})", shm_dir().display())
    }
}

fn encode_blob(parts: &[&[u8]]) -> Vec<u8> {
    let mut v = Vec::new();
    for p in parts {
        v.extend_from_slice(&(p.len() as u32).to_le_bytes());
        v.extend_from_slice(p);
    }
    v
}

fn decode_blob(b: &[u8], n: usize) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    for _ in 0..n {
        let len = u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize;
        at += 4;
        out.push(b.get(at..at.checked_add(len)?)?.to_vec());
        at += len;
    }
    (at == b.len()).then_some(out)
}

fn path_of(b: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(std::ffi::OsString::from_vec(b.to_vec()))
}

fn bell_of(b: &[u8], peer: &str) -> Result<usize> {
    let v = b
        .try_into()
        .map(u32::from_le_bytes)
        .map_err(|_| Error::Protocol {
            peer: peer.into(),
            why: "malformed doorbell".into(),
        })? as usize;
    if v >= DOORBELLS {
        return Err(Error::Protocol {
            peer: peer.into(),
            why: format!("doorbell {v} out of range"),
        });
    }
    Ok(v)
}

struct LocalListener {
    l: TcpListener,
    domain: LocalDomain,
}

impl ListenerImpl for LocalListener {
    fn accept(&self, cq: &CompletionQueue, timeout: Duration) -> Result<Connection> {
        let (mut s, from) = tcp::accept(&self.l, timeout, self.domain.cfg.connect_timeout)?;
        let d = &self.domain;
        let peer = from.to_string();
        let p = auth::Params::new(&d.cfg, peer.clone());
        let bad = |why: &str| Error::Protocol {
            peer: peer.clone(),
            why: why.into(),
        };
        let lcq = cq.backend::<LocalCq>()?;
        let mut mapped = None;
        // The client's setup comes with its proof; the answer goes with the verdict.
        auth::server_with_setup(&mut s, &p, |hello| {
            let parts = decode_blob(hello, 3).ok_or_else(|| bad("malformed local setup"))?;
            let peer_dom = d.peer_domain(&path_of(&parts[0]))?;
            let bell = bell_of(&parts[1], &peer)?;
            let ring_path = path_of(&parts[2]);
            if !ring_path.starts_with(shm_dir()) {
                return Err(bad("ring file outside the shared-memory directory"));
            }
            let (_f, ring) = Region::open_file(&ring_path, 0, RING_FILE_LEN, true)?;
            let mut magic = [0u8; 8];
            ring.read(0, &mut magic)?;
            if u64::from_le_bytes(magic) != RING_MAGIC {
                return Err(bad("not a ring file"));
            }
            mapped = Some((peer_dom, bell, ring));
            Ok(encode_blob(&[
                d.shared.file.path.as_os_str().as_encoded_bytes(),
                &(lcq.bell as u32).to_le_bytes(),
            ]))
        })?;
        let (peer_dom, bell, ring) = mapped.expect("set by an accepted setup");
        tcp::into_liveness(&s)?;
        let conn = d.new_conn(cq, s, ring, 1, peer_dom, bell, peer.clone())?;
        Ok(Connection::new(
            conn.clone(),
            conn.id,
            d.cfg.epoch,
            peer,
            d.id,
        ))
    }

    fn wake(&self) {
        crate::readable::shut(&self.l);
    }

    fn local_addr(&self) -> String {
        self.l
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }
}

pub(crate) struct LocalCq {
    shared: Arc<Shared>,
    bell: usize,
    conns: Mutex<Vec<Arc<LocalConn>>>,
    ready: Mutex<VecDeque<Completion>>,
}

impl Drop for LocalCq {
    fn drop(&mut self) {
        let mut bells = self.shared.bells.lock().unwrap();
        // Marked taken when the queue was made, freed here only.
        debug_assert!(bells[self.bell], "doorbell {} freed while free", self.bell);
        bells[self.bell] = false;
    }
}

impl LocalCq {
    fn push(&self, c: Completion) {
        self.ready.lock().unwrap().push_back(c);
        self.shared.file.ring(self.bell);
    }

    fn extend(&self, cs: Vec<Completion>) {
        if !cs.is_empty() {
            self.ready.lock().unwrap().extend(cs);
            self.shared.file.ring(self.bell);
        }
    }

    fn conns(&self) -> Vec<Arc<LocalConn>> {
        let mut v = self.conns.lock().unwrap();
        v.retain(|c| !c.closed.load(Ordering::Acquire));
        v.clone()
    }
}

impl CqImpl for LocalCq {
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let start = out.len();
        {
            let mut r = self.ready.lock().unwrap();
            while out.len() - start < max {
                match r.pop_front() {
                    Some(c) => out.push(c),
                    None => break,
                }
            }
        }
        let mut conns = self.conns.lock().unwrap();
        conns.retain(|c| !c.closed.load(Ordering::Acquire));
        for c in conns.iter() {
            if out.len() - start >= max {
                break;
            }
            if c.backlogged.load(Ordering::Acquire) {
                let mut done = Vec::new();
                let mut tx = c.tx.lock().unwrap();
                if let Err(e) = c.flush_tx(&mut tx, &mut done) {
                    drop(tx);
                    c.fail(e, &mut done);
                }
                self.ready.lock().unwrap().extend(done);
            }
            c.deliver(out, start + max);
        }
        out.len() - start
    }

    fn sleep(&self, timeout: Duration, woken: &AtomicBool) {
        let conns = self.conns();
        // A sender waiting for ring space is not woken by the consumer; poll it again soon.
        let backlog = conns.iter().any(|c| c.backlogged.load(Ordering::Acquire));
        let timeout = if backlog {
            timeout.min(Duration::from_micros(200))
        } else {
            timeout
        };
        self.shared.file.sleep(self.bell, timeout, || {
            woken.load(Ordering::SeqCst)
                || !self.ready.lock().unwrap().is_empty()
                || conns.iter().any(|c| c.deliverable())
        });
    }

    fn wake(&self) {
        self.shared.file.ring(self.bell);
    }

    fn check_peers(&self) {
        for c in self.conns() {
            if c.is_broken.load(Ordering::Acquire) {
                continue;
            }
            let why = if c.peer_closed() {
                Some("connection closed by the peer")
            } else if !tcp::peer_alive(&c.boot) {
                Some("the peer's process is gone")
            } else {
                None
            };
            if let Some(why) = why {
                c.peer_gone(why);
            }
        }
    }

    fn as_any_arc(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn f<T: Send + Sync>() {}
    f::<LocalCq>();
    f::<LocalConn>();
    let _ = AtomicU32::new(0);
}
