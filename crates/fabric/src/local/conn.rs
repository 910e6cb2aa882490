//! A connection of the local backend: the peer's domain as resolved, the send and
//! receive rings, posted receives, and one-sided operations as copies into the peer's
//! mapped regions.

use super::*;
use std::sync::atomic::fence;

/// A resolved remote region: its table slot, the mapping of its file, its permissions.
pub(crate) type Resolved = (usize, Arc<Mapping>, Access);

/// A peer's domain file, mapped, with the regions resolved so far.
pub(crate) struct PeerDomain {
    pub(crate) file: DomainFile,
    /// The uid owning the peer's domain file: the regions it lists must be files of that
    /// user, so a peer cannot make us map (and write) a file of someone else.
    pub(crate) owner: u32,
    pub(crate) cache: Mutex<HashMap<u64, Resolved>>,
}

impl PeerDomain {
    /// Resolves `key` (mapping the region's file on first use) and checks the access the way
    /// the target's NIC would: the key must still be in its slot, the permission granted and
    /// the range inside the registration.
    pub(crate) fn target(
        &self,
        key: u64,
        off: u64,
        len: usize,
        write: bool,
    ) -> Result<Arc<Mapping>> {
        let cached = self.cache.lock().unwrap().get(&key).cloned();
        let (slot, map, access) = match cached {
            Some(c) => c,
            None => {
                let (slot, e) = self.file.lookup(key).ok_or(Error::UnknownKey { key })?;
                use std::os::unix::fs::MetadataExt;
                let owned = std::fs::symlink_metadata(&e.path)
                    .is_ok_and(|m| m.is_file() && m.uid() == self.owner);
                if !owned {
                    return Err(Error::RemoteAccess(format!(
                        "region {key:#x} names {}, not a file of the peer's user",
                        e.path.display()
                    )));
                }
                let (file, map) = Region::open_file(&e.path, e.file_off, e.len as usize, true)
                    .map_err(|_| Error::UnknownKey { key })?;
                let map = map.keeping_file(file, e.file_off);
                let c = (slot, Arc::new(map), e.access);
                self.cache.lock().unwrap().insert(key, c.clone());
                c
            }
        };
        if self.file.slot_key(slot) != key {
            self.cache.lock().unwrap().remove(&key);
            return Err(Error::UnknownKey { key });
        }
        if !(if write {
            access.remote_write
        } else {
            access.remote_read
        }) {
            return Err(Error::RemoteAccess(format!(
                "region {key:#x} is not remotely {}",
                if write { "writable" } else { "readable" }
            )));
        }
        map.check(off, len)
            .map_err(|e| Error::RemoteAccess(e.to_string()))?;
        Ok(map)
    }
}

pub(crate) enum Outgoing {
    Send {
        wr_id: u64,
        buf: Region,
        off: u64,
        len: usize,
    },
    Imm {
        wr_id: u64,
        imm: u32,
        len: usize,
    },
}

pub(crate) struct PostedRecv {
    pub(crate) wr_id: u64,
    pub(crate) buf: Region,
    pub(crate) off: u64,
    pub(crate) len: usize,
}

pub(crate) struct LocalConn {
    pub(crate) id: ConnId,
    pub(crate) peer_name: String,
    /// 0 for the connector, 1 for the acceptor: we send on ring `side`, receive on `1 - side`.
    pub(crate) side: usize,
    pub(crate) ring: Mapping,
    pub(crate) peer: Arc<PeerDomain>,
    pub(crate) peer_bell: usize,
    pub(crate) cq: Weak<LocalCq>,
    /// Messages waiting for ring space, in order.
    pub(crate) tx: Mutex<VecDeque<Outgoing>>,
    /// Whether `tx` is non-empty, readable without its lock by the polling thread.
    pub(crate) backlogged: AtomicBool,
    pub(crate) posted: Mutex<VecDeque<PostedRecv>>,
    /// Held from peek to consume: the receive ring has one consumer at a time even when
    /// several threads poll or check the same completion queue.
    pub(crate) rx: Mutex<()>,
    pub(crate) broken: Mutex<Option<Error>>,
    /// Whether `broken` is set, readable without its lock on the posting path.
    pub(crate) is_broken: AtomicBool,
    pub(crate) closed: AtomicBool,
    pub(crate) boot: TcpStream,
}

impl LocalConn {
    pub(crate) fn tx_ring(&self) -> Ring {
        ring_of(self.side)
    }

    pub(crate) fn rx_ring(&self) -> Ring {
        ring_of(1 - self.side)
    }

    pub(crate) fn state(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if self.is_broken.load(Ordering::Acquire) {
            if let Some(e) = &*self.broken.lock().unwrap() {
                return Err(e.clone());
            }
        }
        Ok(())
    }

    pub(crate) fn complete(&self, c: Completion) {
        if let Some(cq) = self.cq.upgrade() {
            cq.push(c);
        }
    }

    /// Moves queued messages into the ring while there is space; returns their completions.
    pub(crate) fn flush_tx(
        &self,
        tx: &mut VecDeque<Outgoing>,
        out: &mut Vec<Completion>,
    ) -> Result<()> {
        let ring = self.tx_ring();
        let mut pushed = false;
        while let Some(o) = tx.front() {
            let ok = match o {
                Outgoing::Send { buf, off, len, .. } => {
                    ring.push(&self.ring, KIND_MSG, 0, *len, |m, at| {
                        Mapping::copy(&buf.inner.map, *off, m, at, *len)
                    })?
                }
                Outgoing::Imm { imm, .. } => {
                    ring.push(&self.ring, KIND_IMM, *imm, 0, |_, _| Ok(()))?
                }
            };
            if !ok {
                break;
            }
            pushed = true;
            match tx.pop_front().unwrap() {
                Outgoing::Send { wr_id, len, .. } => {
                    out.push(Completion::ok(self.id, wr_id, OpKind::Send, len))
                }
                Outgoing::Imm { wr_id, len, .. } => {
                    out.push(Completion::ok(self.id, wr_id, OpKind::WriteImm, len))
                }
            }
        }
        if pushed {
            self.peer.file.ring(self.peer_bell);
        }
        self.backlogged.store(!tx.is_empty(), Ordering::Release);
        Ok(())
    }

    pub(crate) fn enqueue(&self, o: Outgoing) -> Result<()> {
        let mut tx = self.tx.lock().unwrap();
        // `fail` marks the connection broken before it drains `tx`: checked under the
        // lock, a send is either drained (completed as failed) or refused, never left
        // queued on a connection nobody polls any more.
        self.state()?;
        if tx.is_empty() {
            // The common case: straight into the ring, no queueing.
            let ring = self.tx_ring();
            let (c, pushed) = match &o {
                Outgoing::Send {
                    wr_id,
                    buf,
                    off,
                    len,
                } => (
                    Completion::ok(self.id, *wr_id, OpKind::Send, *len),
                    ring.push(&self.ring, KIND_MSG, 0, *len, |m, at| {
                        Mapping::copy(&buf.inner.map, *off, m, at, *len)
                    })?,
                ),
                Outgoing::Imm { wr_id, imm, len } => (
                    Completion::ok(self.id, *wr_id, OpKind::WriteImm, *len),
                    ring.push(&self.ring, KIND_IMM, *imm, 0, |_, _| Ok(()))?,
                ),
            };
            if pushed {
                drop(tx);
                self.peer.file.ring(self.peer_bell);
                self.complete(c);
                return Ok(());
            }
        }
        let mut out = Vec::new();
        tx.push_back(o);
        if let Err(e) = self.flush_tx(&mut tx, &mut out) {
            // The flush pops records from the front only as they are written, and
            // stops at the first it cannot write: this one, pushed last under the lock,
            // is still queued. Taken back, since the caller hears of it by this error
            // (a completion too would return its send buffer a second time); those
            // queued before it fail with the connection, which cannot go on (the ring's
            // head is inconsistent, or a copy failed).
            let ours = tx.pop_back();
            debug_assert!(ours.is_some(), "a failed flush emptied the queue");
            drop(tx);
            self.fail(e.clone(), &mut out);
            for c in out {
                self.complete(c);
            }
            return Err(e);
        }
        drop(tx);
        for c in out {
            self.complete(c);
        }
        Ok(())
    }

    /// Delivers arrived records into posted receives until `out` holds `limit` completions;
    /// stops at a message with no receive.
    pub(crate) fn deliver(&self, out: &mut Vec<Completion>, limit: usize) {
        let _rx = self.rx.lock().unwrap();
        let ring = self.rx_ring();
        while out.len() < limit {
            let rec = match ring.peek(&self.ring) {
                Ok(Some(r)) => r,
                Ok(None) => return,
                Err(e) => {
                    self.fail(
                        Error::Protocol {
                            peer: self.peer_name.clone(),
                            why: e.to_string(),
                        },
                        out,
                    );
                    return;
                }
            };
            if rec.kind == KIND_IMM {
                out.push(Completion {
                    conn: self.id,
                    wr_id: 0,
                    kind: OpKind::RemoteWrite,
                    len: 0,
                    imm: rec.imm,
                    status: Ok(()),
                });
            } else {
                let Some(r) = self.posted.lock().unwrap().pop_front() else {
                    return;
                };
                if rec.len > r.len {
                    out.push(Completion::failed(
                        self.id,
                        r.wr_id,
                        OpKind::Recv,
                        Error::RecvTooSmall {
                            len: rec.len,
                            cap: r.len,
                        },
                    ));
                    self.fail(Error::oversized(&self.peer_name), out);
                    return;
                }
                let c = {
                    match Mapping::copy(
                        &self.ring,
                        rec.payload as u64,
                        &r.buf.inner.map,
                        r.off,
                        rec.len,
                    ) {
                        Ok(()) => Completion::ok(self.id, r.wr_id, OpKind::Recv, rec.len),
                        Err(e) => Completion::failed(self.id, r.wr_id, OpKind::Recv, e),
                    }
                };
                out.push(c);
            }
            ring.consume(&self.ring, &rec);
        }
    }

    /// The peer went away: what it sent before is delivered, then every outstanding
    /// operation fails and the connection stays broken.
    pub(crate) fn peer_gone(&self, why: &str) {
        let mut out = Vec::new();
        self.deliver(&mut out, usize::MAX);
        self.fail(Error::gone(&self.peer_name, why), &mut out);
        if let Some(cq) = self.cq.upgrade() {
            cq.extend(out);
        }
    }

    /// Marks the connection broken, tells the peer, and completes everything outstanding
    /// with `e`.
    pub(crate) fn fail(&self, e: Error, out: &mut Vec<Completion>) {
        {
            let mut b = self.broken.lock().unwrap();
            if b.is_none() {
                *b = Some(e.clone());
            }
            self.is_broken.store(true, Ordering::Release);
        }
        self.ring
            .atomic_u32(CLOSED_FLAG[self.side])
            .store(1, Ordering::Release);
        self.peer.file.ring(self.peer_bell);
        let _ = self.boot.shutdown(std::net::Shutdown::Both);
        let mut tx = self.tx.lock().unwrap();
        self.backlogged.store(false, Ordering::Release);
        for o in tx.drain(..) {
            match o {
                Outgoing::Send { wr_id, .. } => {
                    out.push(Completion::failed(self.id, wr_id, OpKind::Send, e.clone()))
                }
                Outgoing::Imm { wr_id, .. } => out.push(Completion::failed(
                    self.id,
                    wr_id,
                    OpKind::WriteImm,
                    e.clone(),
                )),
            }
        }
        for r in self.posted.lock().unwrap().drain(..) {
            out.push(Completion::failed(
                self.id,
                r.wr_id,
                OpKind::Recv,
                e.clone(),
            ));
        }
    }

    pub(crate) fn peer_closed(&self) -> bool {
        self.ring
            .atomic_u32(CLOSED_FLAG[1 - self.side])
            .load(Ordering::Acquire)
            != 0
    }

    /// Whether a poll would make progress: a record that can be delivered, or a closed peer.
    pub(crate) fn deliverable(&self) -> bool {
        if self.is_broken.load(Ordering::Acquire) {
            return false;
        }
        if self.peer_closed() {
            return true;
        }
        let _rx = self.rx.lock().unwrap();
        match self.rx_ring().peek(&self.ring) {
            Ok(Some(r)) => r.kind == KIND_IMM || !self.posted.lock().unwrap().is_empty(),
            Ok(None) => false,
            Err(_) => true,
        }
    }
}

impl ConnImpl for LocalConn {
    fn prefault_remote(&self, key: u64, roff: u64, len: usize) -> Result<()> {
        self.state()?;
        self.peer
            .target(key, roff, len, true)?
            .populate_write(roff, len)
    }

    fn post(&self, op: PostOp) -> Result<()> {
        self.state()?;
        if self.peer_closed() {
            return Err(Error::gone(
                &self.peer_name,
                "connection closed by the peer",
            ));
        }
        match op.kind {
            OpKind::Recv => {
                let mut posted = self.posted.lock().unwrap();
                // `fail` marks the connection broken before it drains: checked under the
                // lock, a receive is either drained (flushed) or refused, never stranded.
                self.state()?;
                posted.push_back(PostedRecv {
                    wr_id: op.wr_id,
                    buf: op.local,
                    off: op.off,
                    len: op.len,
                });
                // A message may already be waiting for this buffer.
                if let Some(cq) = self.cq.upgrade() {
                    cq.shared.file.ring(cq.bell);
                }
                Ok(())
            }
            OpKind::Send => self.enqueue(Outgoing::Send {
                wr_id: op.wr_id,
                buf: op.local,
                off: op.off,
                len: op.len,
            }),
            OpKind::Read | OpKind::Write | OpKind::WriteImm => {
                let (key, roff) = op.wire_addr();
                let write = op.kind != OpKind::Read;
                let moved = self
                    .peer
                    .target(key, roff, op.len, write)
                    .and_then(|target| {
                        if write {
                            Mapping::copy(&op.local.inner.map, op.off, &target, roff, op.len)
                        } else {
                            target.read_into(roff, &op.local.inner.map, op.off, op.len)
                        }
                    })
                    .and_then(|()| {
                        // RDMA's rule: an access completes only if the target's process
                        // lived through it. The copy is ordered before the check, so a
                        // live word proves the bytes landed before the owner died (and
                        // before any successor could read its files). As a NIC's queue
                        // pair would, the connection breaks with it.
                        fence(Ordering::SeqCst);
                        if self.peer.file.owner_alive() {
                            Ok(())
                        } else {
                            const WHY: &str = "its process ended or closed its domain";
                            self.peer_gone(WHY);
                            Err(Error::gone(&self.peer_name, WHY))
                        }
                    });
                match moved {
                    Ok(()) if op.kind == OpKind::WriteImm => self.enqueue(Outgoing::Imm {
                        wr_id: op.wr_id,
                        imm: op.imm,
                        len: op.len,
                    }),
                    Ok(()) => {
                        self.complete(Completion::ok(self.id, op.wr_id, op.kind, op.len));
                        Ok(())
                    }
                    Err(e) => {
                        self.complete(Completion::failed(self.id, op.wr_id, op.kind, e));
                        Ok(())
                    }
                }
            }
            OpKind::RemoteWrite => unreachable!("not postable"),
        }
    }

    fn is_alive(&self) -> bool {
        self.state().is_ok() && !self.peer_closed() && tcp::peer_alive(&self.boot)
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.ring
            .atomic_u32(CLOSED_FLAG[self.side])
            .store(1, Ordering::Release);
        self.peer.file.ring(self.peer_bell);
        let _ = self.boot.shutdown(std::net::Shutdown::Both);
        let mut out = Vec::new();
        self.fail(Error::Closed, &mut out);
        for c in out {
            self.complete(c);
        }
    }
}
