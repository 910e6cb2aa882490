//! The libfabric backend: any provider, `tcp;ofi_rxm` here and across hosts, `verbs;ofi_rxm`
//! (or another RDMA provider) on clusters.
//!
//! Each connection is an RDM endpoint with its own completion queue, bound to the domain's
//! address vector; endpoint names are exchanged on the authenticated bootstrap stream. One CQ
//! per endpoint tells which connection a peer's WRITE with immediate came from (its completion
//! carries no context). Operation contexts are slots of a per-connection slab, so every
//! completion, including those read while a busy send queue makes a post retry, is matched to
//! exactly one operation and none is lost.
//!
//! Memory registration asks for the modes RDMA providers need (local, virtual address,
//! provider key, allocated) and follows what the provider keeps: descriptors are passed when it
//! wants local registration, the wire address is the virtual address when it wants that, and
//! the key is the provider's when it picks keys (else a random one of ours).
//!
//! This is the crate's FFI module: every `unsafe` block calls the shim with pointers owned by
//! the structures here.

mod conn;
use conn::*;
mod ffi;

use std::collections::VecDeque;
use std::ffi::{CStr, CString};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::api::{
    next_conn_id, Completion, CompletionQueue, ConnId, ConnImpl, Connection, CqImpl, DomainImpl,
    ListenerImpl, OpKind, PostOp, RegionSource,
};
use crate::auth;
use crate::config::FabricConfig;
use crate::error::{Error, Result};
use crate::region::{random_u64, Access, Region, RegionBackend, RegionInner};
use crate::tcp;
use ffi::Ptr;

/// Completion queue depth per connection.
const CQ_SIZE: usize = 4096;

fn provider_error(call: &'static str, code: i32) -> Error {
    let code = code.abs();
    // SAFETY: fi_strerror returns a pointer to a static string for any code.
    let msg = unsafe { CStr::from_ptr(ffi::orion_fi_strerror(code)) }
        .to_string_lossy()
        .into_owned();
    Error::Provider { call, code, msg }
}

fn check(call: &'static str, ret: i32) -> Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(provider_error(call, ret))
    }
}

/// The libfabric objects of a domain. Closed in reverse order of creation.
struct Fi {
    info: Ptr,
    fabric: Ptr,
    domain: Ptr,
    av: Ptr,
    mr_mode: u64,
    key_mask: u64,
    describe: String,
}

// SAFETY: the domain is opened FI_THREAD_SAFE: libfabric serialises access to these objects.
unsafe impl Send for Fi {}
// SAFETY: as above.
unsafe impl Sync for Fi {}

impl Drop for Fi {
    fn drop(&mut self) {
        // SAFETY: each object was opened by Fi::open and is closed once, children first.
        unsafe {
            ffi::orion_fi_close_av(self.av);
            ffi::orion_fi_close_domain(self.domain);
            ffi::orion_fi_close_fabric(self.fabric);
            ffi::orion_fi_freeinfo(self.info);
        }
    }
}

impl Fi {
    fn open(provider: &str, address: &str) -> Result<Fi> {
        let prov = CString::new(provider).map_err(|_| Error::NoDevice {
            provider: provider.into(),
            detail: "provider name contains NUL".into(),
        })?;
        let node = CString::new(address).expect("an IP address has no NUL");
        let mut info: Ptr = std::ptr::null_mut();
        // SAFETY: valid C strings; `info` receives an fi_info list owned by us.
        let ret = unsafe { ffi::orion_fi_getinfo(prov.as_ptr(), node.as_ptr(), &mut info) };
        if ret != 0 {
            let e = provider_error("fi_getinfo", ret);
            let detail = if ret.abs() == ffi::FI_ENODATA {
                format!("no interface at {address} offers it (is there an RDMA device and its driver on this host? `fi_info -p {provider}` lists what libfabric sees)")
            } else {
                e.to_string()
            };
            return Err(Error::NoDevice {
                provider: provider.into(),
                detail,
            });
        }
        let mut a: ffi::InfoAttrs = unsafe_zeroed_attrs();
        // SAFETY: info is the list just returned; attrs is a plain output struct.
        unsafe { ffi::orion_fi_info_attrs(info, &mut a) };
        let mut fi = Fi {
            info,
            fabric: std::ptr::null_mut(),
            domain: std::ptr::null_mut(),
            av: std::ptr::null_mut(),
            mr_mode: a.mr_mode,
            key_mask: if a.mr_key_size >= 8 {
                u64::MAX
            } else {
                (1u64 << (8 * a.mr_key_size.max(1))) - 1
            },
            describe: String::new(),
        };
        // SAFETY: each call takes objects created by the previous one; on error, Drop closes
        // what exists (close functions tolerate nothing being left out of order because we
        // only reach Drop after all three succeeded; earlier failures close by hand below).
        unsafe {
            let r = ffi::orion_fi_fabric(info, &mut fi.fabric);
            if r != 0 {
                ffi::orion_fi_freeinfo(info);
                std::mem::forget(fi);
                return Err(provider_error("fi_fabric", r));
            }
            let r = ffi::orion_fi_domain(fi.fabric, info, &mut fi.domain);
            if r != 0 {
                ffi::orion_fi_close_fabric(fi.fabric);
                ffi::orion_fi_freeinfo(info);
                std::mem::forget(fi);
                return Err(provider_error("fi_domain", r));
            }
            let r = ffi::orion_fi_av_open(fi.domain, &mut fi.av);
            if r != 0 {
                ffi::orion_fi_close_domain(fi.domain);
                ffi::orion_fi_close_fabric(fi.fabric);
                ffi::orion_fi_freeinfo(info);
                std::mem::forget(fi);
                return Err(provider_error("fi_av_open", r));
            }
        }
        let names = |bits: u64| -> String {
            [
                (ffi::FI_MR_LOCAL, "local"),
                (ffi::FI_MR_VIRT_ADDR, "virt_addr"),
                (ffi::FI_MR_ALLOCATED, "allocated"),
                (ffi::FI_MR_PROV_KEY, "prov_key"),
            ]
            .iter()
            .filter(|(b, _)| bits & b != 0)
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join(",")
        };
        // SAFETY: a constant-returning shim function.
        let requested = unsafe { ffi::orion_fi_requested_mr_mode() };
        fi.describe = format!(
            "libfabric {} (fabric {}, domain {}, memory registration: asked [{}], provider needs [{}])",
            ffi::cstr(&a.provider),
            ffi::cstr(&a.fabric),
            ffi::cstr(&a.domain),
            names(requested),
            names(a.mr_mode)
        );
        Ok(fi)
    }
}

fn unsafe_zeroed_attrs() -> ffi::InfoAttrs {
    ffi::InfoAttrs {
        mr_mode: 0,
        mr_key_size: 0,
        cq_data_size: 0,
        max_msg_size: 0,
        inject_size: 0,
        tx_size: 0,
        rx_size: 0,
        provider: [0; 64],
        fabric: [0; 64],
        domain: [0; 64],
    }
}

pub(crate) struct OfiDomain {
    cfg: Arc<FabricConfig>,
    id: u64,
    fi: Arc<Fi>,
}

impl OfiDomain {
    pub(crate) fn open(cfg: Arc<FabricConfig>, id: u64) -> Result<OfiDomain> {
        let fi = Arc::new(Fi::open(&cfg.provider, &cfg.address.to_string())?);
        tracing::debug!("fabric domain: {}", fi.describe);
        Ok(OfiDomain { cfg, id, fi })
    }

    /// Creates this side's endpoint and CQ for a new connection.
    fn endpoint(&self) -> Result<Endpoint> {
        let mut cq: Ptr = std::ptr::null_mut();
        let mut ep: Ptr = std::ptr::null_mut();
        let mut fd: i32 = -1;
        // SAFETY: domain/info/av are live for the domain's lifetime, which Endpoint outlives
        // through its Arc<Fi>; the out-pointers are locals.
        unsafe {
            check(
                "fi_cq_open",
                ffi::orion_fi_cq_open(self.fi.domain, CQ_SIZE, 1, &mut cq),
            )?;
            let r = ffi::orion_fi_endpoint(self.fi.domain, self.fi.info, self.fi.av, cq, &mut ep);
            if r != 0 {
                ffi::orion_fi_close_cq(cq);
                return Err(provider_error("fi_endpoint", r));
            }
            if ffi::orion_fi_cq_wait_fd(cq, &mut fd) != 0 {
                fd = -1;
            }
        }
        Ok(Endpoint {
            fi: self.fi.clone(),
            ep,
            cq,
            wait_fd: fd,
            peer: None,
        })
    }

    fn establish(
        &self,
        mut s: TcpStream,
        cq: &CompletionQueue,
        p: &auth::Params<'_>,
        session: auth::Session,
        initiator: bool,
    ) -> Result<Connection> {
        let peer = p.peer.clone();
        let ocq = cq.backend::<OfiCq>()?;
        let mut ep = self.endpoint()?;
        let mut name = [0u8; 256];
        let mut len = name.len();
        // SAFETY: ep is live; name/len describe a local buffer.
        check("fi_getname", unsafe {
            ffi::orion_fi_getname(ep.ep, name.as_mut_ptr().cast(), &mut len)
        })?;
        let theirs = if initiator {
            session.send(&mut s, p, &name[..len])?;
            session.recv(&mut s, p)?
        } else {
            let t = session.recv(&mut s, p)?;
            session.send(&mut s, p, &name[..len])?;
            t
        };
        if theirs.len() != len {
            return Err(Error::Protocol {
                peer,
                why: format!("endpoint name of {} bytes, expected {len}", theirs.len()),
            });
        }
        let mut addr = 0u64;
        // SAFETY: av is live; `theirs` holds an address of the provider's format and length.
        check("fi_av_insert", unsafe {
            ffi::orion_fi_av_insert(self.fi.av, theirs.as_ptr().cast(), &mut addr)
        })?;
        ep.peer = Some(addr);
        tcp::into_liveness(&s)?;
        let conn = Arc::new(OfiConn {
            id: next_conn_id(),
            peer_name: peer.clone(),
            ep,
            ops: Mutex::new(Slab::default()),
            ready: Mutex::new(VecDeque::new()),
            recv_order: Mutex::new(RecvOrder::default()),
            cq_lock: Mutex::new(()),
            backlog: Mutex::new(VecDeque::new()),
            broken: Mutex::new(None),
            closed: AtomicBool::new(false),
            boot: s,
            op_timeout: self.cfg.op_timeout,
            graveyard: Mutex::new(Vec::new()),
        });
        ocq.conns.lock().unwrap().push(conn.clone());
        Ok(Connection::new(
            conn.clone(),
            conn.id,
            self.cfg.epoch,
            peer,
            self.id,
        ))
    }
}

/// A region's registrations: one for remote access (closed on revoke) and, when the provider
/// wants local buffers registered, one for local use (its descriptor).
struct OfiRegion {
    /// Keeps the domain open until the MRs are closed.
    _fi: Arc<Fi>,
    remote: Mutex<Option<usize>>,
    local: Option<usize>,
}

impl OfiRegion {
    fn desc(&self) -> Ptr {
        match self.local {
            // SAFETY: the local MR lives as long as this region.
            Some(mr) => unsafe { ffi::orion_fi_mr_desc(mr as Ptr) },
            None => std::ptr::null_mut(),
        }
    }
}

impl RegionBackend for OfiRegion {
    fn revoke(&self) {
        if let Some(mr) = self.remote.lock().unwrap().take() {
            // SAFETY: the MR was registered by us and is closed once (taken out of the slot).
            unsafe { ffi::orion_fi_close_mr(mr as Ptr) };
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for OfiRegion {
    fn drop(&mut self) {
        self.revoke();
        if let Some(mr) = self.local.take() {
            // SAFETY: registered by us, closed once.
            unsafe { ffi::orion_fi_close_mr(mr as Ptr) };
        }
    }
}

impl DomainImpl for OfiDomain {
    fn register(&self, src: RegionSource<'_>, access: Access) -> Result<Region> {
        let map = src.map()?;
        let fi = &self.fi;
        let reg = |acc: u64, key: u64| -> Result<usize> {
            let mut mr: Ptr = std::ptr::null_mut();
            // SAFETY: the mapping outlives the MR (both live in RegionInner; the backend, which
            // owns the MR, is dropped first).
            check("fi_mr_reg", unsafe {
                ffi::orion_fi_mr_reg(
                    fi.domain,
                    map.base_ptr().cast(),
                    map.len(),
                    acc,
                    key,
                    &mut mr,
                )
            })?;
            Ok(mr as usize)
        };
        // SAFETY: constant-returning shim functions.
        let (local_acc, rr, rw) = unsafe {
            (
                ffi::orion_fi_access_local(),
                ffi::orion_fi_access_remote_read(),
                ffi::orion_fi_access_remote_write(),
            )
        };
        let local = if fi.mr_mode & ffi::FI_MR_LOCAL != 0 {
            Some(reg(local_acc, random_u64() & fi.key_mask)?)
        } else {
            None
        };
        let mut key = 0;
        let remote = if access.is_remote() {
            let acc = local_acc
                | if access.remote_read { rr } else { 0 }
                | if access.remote_write { rw } else { 0 };
            let requested = loop {
                let k = random_u64() & fi.key_mask;
                if k != 0 {
                    break k;
                }
            };
            let mr = reg(acc, requested)?;
            // SAFETY: mr was just registered.
            key = if fi.mr_mode & ffi::FI_MR_PROV_KEY != 0 {
                unsafe { ffi::orion_fi_mr_key(mr as Ptr) }
            } else {
                requested
            };
            Some(mr)
        } else {
            None
        };
        let wire_addr = if fi.mr_mode & ffi::FI_MR_VIRT_ADDR != 0 {
            map.addr()
        } else {
            0
        };
        let backend = OfiRegion {
            _fi: fi.clone(),
            remote: Mutex::new(remote),
            local,
        };
        Ok(Region {
            inner: Arc::new(RegionInner {
                map,
                key,
                wire_addr,
                access,
                domain: self.id,
                backend: Some(Box::new(backend)),
            }),
        })
    }

    fn completion_queue(&self) -> Result<Arc<dyn CqImpl>> {
        let wake =
            UnixStream::pair().map_err(|e| Error::io("a completion queue's wake-up pair", e))?;
        wake.0
            .set_nonblocking(true)
            .and_then(|_| wake.1.set_nonblocking(true))
            .map_err(|e| Error::io("a completion queue's wake-up pair", e))?;
        Ok(Arc::new(OfiCq {
            fi: self.fi.clone(),
            conns: Mutex::new(Vec::new()),
            wake,
        }))
    }

    fn listen(&self, addr: &str) -> Result<Box<dyn ListenerImpl>> {
        Ok(Box::new(OfiListener {
            l: tcp::listen(addr)?,
            domain: OfiDomain {
                cfg: self.cfg.clone(),
                id: self.id,
                fi: self.fi.clone(),
            },
        }))
    }

    fn connect(&self, addr: &str, cq: &CompletionQueue, timeout: Duration) -> Result<Connection> {
        let mut s = tcp::connect(addr, timeout)?;
        let p = auth::Params::new(&self.cfg, addr.to_string());
        let session = auth::client(&mut s, &p)?;
        self.establish(s, cq, &p, session, true)
    }

    fn describe(&self) -> String {
        self.fi.describe.clone()
    }
}

struct OfiListener {
    l: TcpListener,
    domain: OfiDomain,
}

impl ListenerImpl for OfiListener {
    fn accept(&self, cq: &CompletionQueue, timeout: Duration) -> Result<Connection> {
        let (mut s, from) = tcp::accept(&self.l, timeout, self.domain.cfg.connect_timeout)?;
        let d = &self.domain;
        let p = auth::Params::new(&d.cfg, from.to_string());
        let session = auth::server(&mut s, &p)?;
        d.establish(s, cq, &p, session, false)
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

pub(crate) struct OfiCq {
    fi: Arc<Fi>,
    conns: Mutex<Vec<Arc<OfiConn>>>,
    /// A byte written to `wake.1` ends a sleep polling `wake.0` ([`CqImpl::wake`]).
    wake: (UnixStream, UnixStream),
}

impl OfiCq {
    fn conns(&self) -> Vec<Arc<OfiConn>> {
        let mut v = self.conns.lock().unwrap();
        v.retain(|c| !c.closed.load(Ordering::Acquire) || !c.ready.lock().unwrap().is_empty());
        v.clone()
    }
}

impl CqImpl for OfiCq {
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let start = out.len();
        for c in self.conns() {
            if out.len() - start >= max {
                break;
            }
            if !c.closed.load(Ordering::Acquire) {
                c.progress();
            }
            let mut r = c.ready.lock().unwrap();
            while out.len() - start < max {
                match r.pop_front() {
                    Some(x) => out.push(x),
                    None => break,
                }
            }
        }
        out.len() - start
    }

    fn sleep(&self, timeout: Duration, woken: &AtomicBool) {
        if woken.load(Ordering::SeqCst) {
            return;
        }
        let conns = self.conns();
        let mut fds = Vec::with_capacity(conns.len() * 2 + 1);
        let mut timeout = timeout;
        for c in &conns {
            if !c.ready.lock().unwrap().is_empty() {
                return;
            }
            if !c.backlog.lock().unwrap().is_empty() {
                // The provider refused work for lack of room; nothing signals when it has
                // room again, so look again soon.
                timeout = timeout.min(Duration::from_micros(200));
            }
            if c.closed.load(Ordering::Acquire) || c.broken.lock().unwrap().is_some() {
                continue;
            }
            // SAFETY: fabric and cq are live. fi_trywait says whether blocking on the fd is
            // safe now (nothing is pending inside the provider).
            if c.ep.wait_fd < 0 || unsafe { ffi::orion_fi_trywait(self.fi.fabric, c.ep.cq) } != 0 {
                return;
            }
            fds.push(libc::pollfd {
                fd: c.ep.wait_fd,
                events: libc::POLLIN,
                revents: 0,
            });
            fds.push(libc::pollfd {
                fd: c.boot.as_raw_fd(),
                events: libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            });
        }
        if fds.is_empty() {
            // No connection to wait on: look again soon.
            timeout = timeout.min(Duration::from_millis(1));
        }
        fds.push(libc::pollfd {
            fd: self.wake.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: fds is a valid array of pollfd of the given length.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        // Wake-ups consumed (the flag, not the bytes, says whether one came).
        let mut sink = [0u8; 64];
        while matches!((&self.wake.0).read(&mut sink), Ok(n) if n > 0) {}
    }

    fn wake(&self) {
        // A full socket buffer already holds a wake-up: nothing lost.
        let _ = (&self.wake.1).write(&[1]);
    }

    fn check_peers(&self) {
        for c in self.conns() {
            if c.closed.load(Ordering::Acquire) || c.broken.lock().unwrap().is_some() {
                continue;
            }
            if !tcp::peer_alive(&c.boot) {
                c.progress();
                c.fail(Error::gone(
                    &c.peer_name,
                    "the peer's process is gone or closed the connection",
                ));
                continue;
            }
            let now = Instant::now();
            let expired = c
                .ops
                .lock()
                .unwrap()
                .slots
                .iter()
                .flatten()
                .any(|r| r.deadline.is_some_and(|d| d < now));
            if expired {
                c.progress();
                c.fail(Error::Timeout(c.op_timeout));
            }
        }
    }

    fn as_any_arc(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}
