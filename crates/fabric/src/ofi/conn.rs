//! A connection of the libfabric backend: its endpoint, the records of operations in
//! flight, receive ordering, and the posting of verbs.

use super::*;

/// One connection's endpoint and completion queue.
pub(crate) struct Endpoint {
    pub(crate) fi: Arc<Fi>,
    pub(crate) ep: Ptr,
    pub(crate) cq: Ptr,
    pub(crate) wait_fd: i32,
    pub(crate) peer: Option<u64>,
}

// SAFETY: FI_THREAD_SAFE domain; see Fi.
unsafe impl Send for Endpoint {}
// SAFETY: as above.
unsafe impl Sync for Endpoint {}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: opened in OfiDomain::endpoint, closed once: endpoint before its CQ.
        unsafe {
            ffi::orion_fi_close_ep(self.ep);
            ffi::orion_fi_close_cq(self.cq);
            if let Some(a) = self.peer {
                ffi::orion_fi_av_remove(self.fi.av, a);
            }
        }
    }
}

pub(crate) struct OpRecord {
    pub(crate) wr_id: u64,
    pub(crate) kind: OpKind,
    pub(crate) len: usize,
    /// Receives: their posting order (completions are released in it).
    pub(crate) seq: u64,
    /// When the operation counts as lost (receives wait for as long as it takes).
    pub(crate) deadline: Option<Instant>,
    /// Keeps the buffer registered and mapped until the operation completes.
    pub(crate) _buf: Region,
}

/// Outstanding operations; the context handed to libfabric is the slot index + 1 (0 is what
/// a peer's WRITE with immediate arrives with).
#[derive(Default)]
pub(crate) struct Slab {
    pub(crate) slots: Vec<Option<OpRecord>>,
    pub(crate) free: Vec<usize>,
}

impl Slab {
    pub(crate) fn insert(&mut self, r: OpRecord) -> u64 {
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(r);
                i
            }
            None => {
                self.slots.push(Some(r));
                self.slots.len() - 1
            }
        };
        i as u64 + 1
    }

    pub(crate) fn remove(&mut self, ctx: u64) -> Option<OpRecord> {
        let i = (ctx as usize).checked_sub(1)?;
        let r = self.slots.get_mut(i)?.take()?;
        self.free.push(i);
        Some(r)
    }

    /// Takes every outstanding record. Their slots are retired, not freed: the provider may
    /// still report them, and a reused context would match a newer operation.
    pub(crate) fn drain(&mut self) -> Vec<OpRecord> {
        self.slots.iter_mut().filter_map(Option::take).collect()
    }
}

#[derive(Default)]
pub(crate) struct RecvOrder {
    pub(crate) posted: u64,
    pub(crate) released: u64,
    /// Finished receives waiting for earlier ones; None marks a receive that never posted.
    pub(crate) held: std::collections::BTreeMap<u64, Option<Completion>>,
}

pub(crate) struct OfiConn {
    pub(crate) id: ConnId,
    pub(crate) peer_name: String,
    pub(crate) ep: Endpoint,
    pub(crate) ops: Mutex<Slab>,
    /// Completions read from the provider but not yet handed to the application.
    pub(crate) ready: Mutex<VecDeque<Completion>>,
    /// Receive ordering: a provider may finish a large (rendezvous) message after a later
    /// small one although it matched them to buffers in order; receive completions are
    /// therefore released in posting order, as on a verbs queue pair.
    pub(crate) recv_order: Mutex<RecvOrder>,
    /// Serialises reads of this connection's CQ.
    pub(crate) cq_lock: Mutex<()>,
    /// Operations the provider refused with EAGAIN (queue full, connection still forming),
    /// retried in order by progress; later posts queue behind them to keep the order.
    pub(crate) backlog: Mutex<VecDeque<(PostOp, u64, usize)>>,
    pub(crate) broken: Mutex<Option<Error>>,
    pub(crate) closed: AtomicBool,
    pub(crate) boot: TcpStream,
    pub(crate) op_timeout: Duration,
    /// Buffers of operations flushed while the endpoint may still touch them; released only
    /// after the endpoint is closed (fields drop in order: `ep` above comes first).
    pub(crate) graveyard: Mutex<Vec<Region>>,
}

impl OfiConn {
    pub(crate) fn state(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        match &*self.broken.lock().unwrap() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    pub(crate) fn call(&self, op: &PostOp, ctx: u64, desc: Ptr) -> isize {
        let ep = self.ep.ep;
        let dest = self.ep.peer.expect("connected endpoint");
        let buf = op.local.inner.map.base_ptr().wrapping_add(op.off as usize);
        // SAFETY: buf..buf+len is inside the local region (checked by Connection::post), which
        // the op record keeps alive until completion; ep and dest are live.
        unsafe {
            match op.kind {
                OpKind::Send => ffi::orion_fi_send(ep, buf.cast(), op.len, desc, dest, ctx),
                OpKind::Recv => ffi::orion_fi_recv(ep, buf.cast(), op.len, desc, dest, ctx),
                OpKind::Read => {
                    let (key, addr) = op.wire_addr();
                    ffi::orion_fi_read(ep, buf.cast(), op.len, desc, dest, addr, key, ctx)
                }
                OpKind::Write => {
                    let (key, addr) = op.wire_addr();
                    ffi::orion_fi_write(ep, buf.cast(), op.len, desc, dest, addr, key, ctx)
                }
                OpKind::WriteImm => {
                    let (key, addr) = op.wire_addr();
                    ffi::orion_fi_writedata(
                        ep,
                        buf.cast(),
                        op.len,
                        desc,
                        op.imm as u64,
                        dest,
                        addr,
                        key,
                        ctx,
                    )
                }
                OpKind::RemoteWrite => unreachable!("not postable"),
            }
        }
    }

    /// Reads the provider's CQ (which also drives manual progress) into `ready`.
    pub(crate) fn progress(&self) {
        self.retry_backlog();
        let Ok(_g) = self.cq_lock.try_lock() else {
            return;
        };
        let mut entries = [ffi::Cqe::default(); 32];
        loop {
            // SAFETY: cq is live; entries is a local array of the length passed.
            let n =
                unsafe { ffi::orion_fi_cq_read(self.ep.cq, entries.as_mut_ptr(), entries.len()) };
            if n > 0 {
                let mut ops = self.ops.lock().unwrap();
                let mut ready = self.ready.lock().unwrap();
                for e in &entries[..n as usize] {
                    // SAFETY: constant-returning shim function.
                    if e.context == 0
                        && e.flags & unsafe { ffi::orion_fi_flag_remote_cq_data() } != 0
                    {
                        ready.push_back(Completion {
                            conn: self.id,
                            wr_id: 0,
                            kind: OpKind::RemoteWrite,
                            len: 0,
                            imm: e.data as u32,
                            status: Ok(()),
                        });
                    } else if let Some(r) = ops.remove(e.context) {
                        let len = if r.kind == OpKind::Recv {
                            e.len as usize
                        } else {
                            r.len
                        };
                        self.finish(
                            &r,
                            Completion::ok(self.id, r.wr_id, r.kind, len),
                            &mut ready,
                        );
                    }
                }
                if (n as usize) < entries.len() {
                    return;
                }
            } else if n as i32 == -ffi::FI_EAVAIL {
                self.read_error();
            } else {
                return;
            }
        }
    }

    /// Withdraws an operation that was never handed to the provider.
    pub(crate) fn unpost(&self, ctx: u64, kind: OpKind, seq: u64) {
        if self.ops.lock().unwrap().remove(ctx).is_some() && kind == OpKind::Recv {
            let mut ready = self.ready.lock().unwrap();
            self.release(seq, None, &mut ready);
        }
    }

    /// Hands a completion to the application, receives in posting order.
    pub(crate) fn finish(&self, r: &OpRecord, c: Completion, ready: &mut VecDeque<Completion>) {
        if r.kind != OpKind::Recv {
            ready.push_back(c);
            return;
        }
        self.release(r.seq, Some(c), ready);
    }

    pub(crate) fn release(
        &self,
        seq: u64,
        c: Option<Completion>,
        ready: &mut VecDeque<Completion>,
    ) {
        let mut o = self.recv_order.lock().unwrap();
        o.held.insert(seq, c);
        loop {
            let next = o.released;
            match o.held.remove(&next) {
                Some(c) => {
                    ready.extend(c);
                    o.released += 1;
                }
                None => break,
            }
        }
    }

    pub(crate) fn retry_backlog(&self) {
        let mut backlog = self.backlog.lock().unwrap();
        while let Some((op, ctx, desc)) = backlog.front() {
            let r = self.call(op, *ctx, *desc as Ptr);
            if r as i32 == -ffi::FI_EAGAIN {
                return;
            }
            let (op, ctx, _) = backlog.pop_front().unwrap();
            if r != 0 {
                if let Some(rec) = self.ops.lock().unwrap().remove(ctx) {
                    let e = provider_error("posting an operation", r as i32);
                    let mut ready = self.ready.lock().unwrap();
                    self.finish(
                        &rec,
                        Completion::failed(self.id, op.wr_id, op.kind, e),
                        &mut ready,
                    );
                }
            }
        }
    }

    pub(crate) fn read_error(&self) {
        let mut e = ffi::CqErr {
            context: 0,
            flags: 0,
            len: 0,
            olen: 0,
            err: 0,
            prov_errno: 0,
            msg: [0; 128],
        };
        // SAFETY: cq is live; e is a local output struct.
        if unsafe { ffi::orion_fi_cq_readerr(self.ep.cq, &mut e) } <= 0 {
            return;
        }
        let detail = ffi::cstr(&e.msg);
        let err = match e.err {
            ffi::FI_ETRUNC => None,
            libc::ENOTCONN
            | libc::EPIPE
            | libc::ECONNRESET
            | libc::ECONNREFUSED
            | libc::EHOSTUNREACH
            | libc::ETIMEDOUT => Some(Error::gone(
                &self.peer_name,
                format!("the provider lost the connection ({detail})"),
            )),
            ffi::FI_ECANCELED if self.closed.load(Ordering::Acquire) => Some(Error::Closed),
            ffi::FI_ECANCELED | libc::EACCES | libc::EINVAL | libc::EPERM => {
                Some(Error::RemoteAccess(format!(
                    "{} ({detail})",
                    provider_error("completion", e.err)
                )))
            }
            code => Some(provider_error("completion", code)),
        };
        if let Some(Error::PeerGone { .. }) = &err {
            let mut b = self.broken.lock().unwrap();
            if b.is_none() {
                *b = err.clone();
            }
        }
        let rec = self.ops.lock().unwrap().remove(e.context);
        if let Some(r) = rec {
            let truncated = err.is_none();
            // A target that refuses an access drops the connection underneath (tcp), as a
            // verbs QP enters the error state: make that explicit instead of letting later
            // traffic vanish.
            let refused = matches!(err, Some(Error::RemoteAccess(_)));
            let err = err.unwrap_or(Error::RecvTooSmall {
                len: r.len + e.olen as usize,
                cap: r.len,
            });
            {
                let mut ready = self.ready.lock().unwrap();
                self.finish(
                    &r,
                    Completion::failed(self.id, r.wr_id, r.kind, err),
                    &mut ready,
                );
            }
            self.graveyard.lock().unwrap().push(r._buf);
            if truncated {
                self.fail(Error::oversized(&self.peer_name));
            } else if refused {
                self.fail(Error::gone(
                    &self.peer_name,
                    "connection closed after the target refused an access",
                ));
            }
        } else {
            tracing::debug!(peer = %self.peer_name, "fabric error without an operation: {detail}");
        }
    }

    /// Completes every outstanding operation with `e` and breaks the connection (the peer
    /// sees its bootstrap stream close).
    pub(crate) fn fail(&self, e: Error) {
        {
            let mut b = self.broken.lock().unwrap();
            if b.is_none() {
                *b = Some(e.clone());
            }
        }
        let _ = self.boot.shutdown(std::net::Shutdown::Both);
        self.backlog.lock().unwrap().clear();
        let mut recs = self.ops.lock().unwrap().drain();
        recs.sort_by_key(|r| (r.kind == OpKind::Recv, r.seq));
        let mut ready = self.ready.lock().unwrap();
        let mut graveyard = self.graveyard.lock().unwrap();
        for r in recs {
            self.finish(
                &r,
                Completion::failed(self.id, r.wr_id, r.kind, e.clone()),
                &mut ready,
            );
            graveyard.push(r._buf);
        }
    }
}

impl ConnImpl for OfiConn {
    fn post(&self, op: PostOp) -> Result<()> {
        self.state()?;
        let desc = op
            .local
            .backend::<OfiRegion>()
            .map(|r| r.desc())
            .unwrap_or(std::ptr::null_mut());
        let seq = if op.kind == OpKind::Recv {
            let mut o = self.recv_order.lock().unwrap();
            o.posted += 1;
            o.posted - 1
        } else {
            0
        };
        let ctx = self.ops.lock().unwrap().insert(OpRecord {
            wr_id: op.wr_id,
            kind: op.kind,
            len: op.len,
            seq,
            deadline: (op.kind != OpKind::Recv).then(|| Instant::now() + self.op_timeout),
            _buf: op.local.clone(),
        });
        // A failure may have drained the slab between the check above and the insert.
        if let Err(e) = self.state() {
            self.unpost(ctx, op.kind, seq);
            return Err(e);
        }
        let mut backlog = self.backlog.lock().unwrap();
        if backlog.is_empty() {
            let r = self.call(&op, ctx, desc);
            if r == 0 {
                return Ok(());
            }
            if r as i32 != -ffi::FI_EAGAIN {
                drop(backlog);
                self.unpost(ctx, op.kind, seq);
                return Err(provider_error("posting an operation", r as i32));
            }
        }
        backlog.push_back((op, ctx, desc as usize));
        Ok(())
    }

    fn is_alive(&self) -> bool {
        self.state().is_ok() && tcp::peer_alive(&self.boot)
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self.boot.shutdown(std::net::Shutdown::Both);
        self.fail(Error::Closed);
    }
}
