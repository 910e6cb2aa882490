//! The echo peer: the far side of the fabric's multi-process tests and of `orion bench fabric`
//! (what `ib_send_lat`'s server is to perftest).
//!
//! Per connection it registers a region for one-sided access and sends its descriptor as the
//! first message; then it returns every message verbatim (from the receive buffer itself) and
//! answers each WRITE with immediate by an 8-byte message holding the immediate. A probe
//! ([`probe`]) exercises every verb against it and checks the results.

use std::time::{Duration, Instant};

use crate::api::{CompletionQueue, Connection, Domain, Listener, OpKind, MAX_MESSAGE};
use crate::error::{Error, Result};
use crate::region::{Access, Region, RemoteRegion};

/// Receive buffers kept posted per connection.
pub const DEPTH: u64 = 32;
const SEND: u64 = 1 << 32;
const ACK: u64 = 2 << 32;
const DESC: u64 = 3 << 32;

#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Bytes of the region exposed for one-sided access.
    pub region_len: usize,
    /// Poll without ever sleeping (for latency measurements with both sides polling).
    pub busy: bool,
}

/// Serves connections one after another until `accept` fails with something else than a
/// timeout.
pub fn serve(domain: &Domain, listener: &Listener, opts: &ServeOptions) -> Result<()> {
    let cq = domain.completion_queue()?;
    loop {
        let conn = match listener.accept(&cq, Duration::from_secs(3600)) {
            Ok(c) => c,
            Err(Error::Timeout(_)) => continue,
            Err(e) if !matches!(e, Error::Io(_)) => {
                tracing::warn!("echo peer: {e}");
                continue;
            }
            Err(e) => return Err(e),
        };
        if let Err(e) = serve_one(domain, &cq, &conn, opts) {
            tracing::info!("echo peer: connection ended: {e}");
        }
    }
}

fn serve_one(
    domain: &Domain,
    cq: &CompletionQueue,
    conn: &Connection,
    opts: &ServeOptions,
) -> Result<()> {
    let region = domain.alloc_region(opts.region_len, Access::REMOTE_ALL)?;
    let bufs = domain.alloc_region(MAX_MESSAGE * DEPTH as usize, Access::LOCAL)?;
    let acks = domain.alloc_region(64 * DEPTH as usize, Access::LOCAL)?;
    for i in 0..DEPTH {
        conn.post_recv(i, &bufs, i * MAX_MESSAGE as u64, MAX_MESSAGE)?;
    }
    acks.write(0, &region.remote().encode())?;
    conn.post_send(DESC, &acks, 0, RemoteRegion::ENCODED_LEN)?;
    let mut next_ack = 0u64;
    let mut out = Vec::with_capacity(64);
    loop {
        out.clear();
        if opts.busy {
            // A dead peer shows up as flushed receives (the CQ checks liveness now and then);
            // no per-iteration liveness syscall on the hot path.
            if cq.poll(&mut out, 64) == 0 {
                std::hint::spin_loop();
                continue;
            }
        } else {
            match cq.wait(&mut out, 64, Duration::from_secs(1)) {
                Ok(_) => {}
                Err(Error::Timeout(_)) if conn.is_alive() => continue,
                Err(e) => return Err(e),
            }
        }
        for c in out.iter().filter(|c| c.conn == conn.id()) {
            if let Err(e) = &c.status {
                if e.is_fatal_to_connection() || matches!(e, Error::Protocol { .. }) {
                    return Err(e.clone());
                }
                continue;
            }
            match c.kind {
                OpKind::Recv => {
                    conn.post_send(SEND | c.wr_id, &bufs, c.wr_id * MAX_MESSAGE as u64, c.len)?
                }
                OpKind::Send if c.wr_id & SEND != 0 => {
                    let i = c.wr_id & 0xffff_ffff;
                    conn.post_recv(i, &bufs, i * MAX_MESSAGE as u64, MAX_MESSAGE)?;
                }
                OpKind::RemoteWrite => {
                    let slot = next_ack % DEPTH;
                    next_ack += 1;
                    acks.write(slot * 64, &(c.imm as u64).to_le_bytes())?;
                    conn.post_send(ACK | slot, &acks, slot * 64, 8)?;
                }
                _ => {}
            }
        }
    }
}

/// A client-side session with an echo peer: the connection, its CQ, the peer's region and
/// local buffers.
pub struct Session {
    pub conn: Connection,
    pub cq: CompletionQueue,
    pub remote: RemoteRegion,
    /// Local buffer for one-sided operations and messages (`MAX_MESSAGE * DEPTH` bytes from
    /// offset 0 are receive buffers; the rest is free).
    pub buf: Region,
    pub timeout: Duration,
    /// Completions that arrived while waiting for another one.
    stash: std::sync::Mutex<std::collections::VecDeque<crate::Completion>>,
}

pub const SESSION_SCRATCH: u64 = MAX_MESSAGE as u64 * DEPTH;

impl Session {
    pub fn connect(domain: &Domain, addr: &str, scratch: usize) -> Result<Session> {
        let cq = domain.completion_queue()?;
        let conn = domain.connect(addr, &cq)?;
        let buf = domain.alloc_region(SESSION_SCRATCH as usize + scratch, Access::LOCAL)?;
        for i in 0..DEPTH {
            conn.post_recv(i, &buf, i * MAX_MESSAGE as u64, MAX_MESSAGE)?;
        }
        let mut s = Session {
            conn,
            cq,
            remote: RemoteRegion {
                key: 0,
                addr: 0,
                len: 0,
            },
            buf,
            timeout: Duration::from_secs(10),
            stash: Default::default(),
        };
        let (i, len) = s.recv()?;
        let mut d = [0u8; 24];
        s.buf.read(i * MAX_MESSAGE as u64, &mut d)?;
        s.repost(i)?;
        if len != RemoteRegion::ENCODED_LEN {
            return Err(Error::Protocol {
                peer: addr.into(),
                why: "the echo peer sent no region descriptor".into(),
            });
        }
        s.remote = RemoteRegion::decode(&d).expect("24 bytes");
        Ok(s)
    }

    /// Waits for the next completion of `kind` and `wr_id` (any receive when `kind` is Recv);
    /// returns (wr_id, len).
    pub fn wait(&self, kind: OpKind, wr_id: Option<u64>) -> Result<(u64, usize)> {
        let wanted = |c: &crate::Completion| c.kind == kind && wr_id.is_none_or(|w| w == c.wr_id);
        let deadline = Instant::now() + self.timeout;
        let mut out = Vec::with_capacity(8);
        loop {
            {
                let mut stash = self.stash.lock().unwrap();
                if let Some(c) = stash
                    .iter()
                    .position(|c| c.status.is_err() || wanted(c))
                    .and_then(|i| stash.remove(i))
                {
                    c.status.clone()?;
                    return Ok((c.wr_id, c.len));
                }
            }
            out.clear();
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(self.timeout));
            }
            self.cq.wait(&mut out, 8, left)?;
            self.stash.lock().unwrap().extend(out.drain(..));
        }
    }

    pub fn recv(&self) -> Result<(u64, usize)> {
        self.wait(OpKind::Recv, None)
    }

    pub fn repost(&self, i: u64) -> Result<()> {
        self.conn
            .post_recv(i, &self.buf, i * MAX_MESSAGE as u64, MAX_MESSAGE)
    }

    /// One message round trip of `len` bytes from the scratch area; returns the reply's length.
    pub fn round_trip(&self, len: usize) -> Result<usize> {
        self.conn.post_send(SEND, &self.buf, SESSION_SCRATCH, len)?;
        let (i, n) = self.recv()?;
        self.repost(i)?;
        self.wait(OpKind::Send, Some(SEND))?;
        Ok(n)
    }

    pub fn read(&self, roff: u64, len: usize) -> Result<()> {
        self.conn
            .post_read(7, &self.buf, SESSION_SCRATCH, &self.remote, roff, len)?;
        self.wait(OpKind::Read, Some(7)).map(|_| ())
    }

    pub fn write(&self, roff: u64, len: usize) -> Result<()> {
        self.conn
            .post_write(8, &self.buf, SESSION_SCRATCH, &self.remote, roff, len)?;
        self.wait(OpKind::Write, Some(8)).map(|_| ())
    }

    /// WRITE with immediate, then the peer's acknowledgment; returns the acknowledged value.
    pub fn write_imm_ack(&self, roff: u64, len: usize, imm: u32) -> Result<u32> {
        self.conn
            .post_write_imm(9, &self.buf, SESSION_SCRATCH, &self.remote, roff, len, imm)?;
        let (i, _) = self.recv()?;
        let v = self.buf.load_u64(i * MAX_MESSAGE as u64)?;
        self.repost(i)?;
        self.wait(OpKind::WriteImm, Some(9))?;
        Ok(v as u32)
    }
}

/// Exercises every verb against an echo peer and checks the results; returns what it did.
pub fn probe(domain: &Domain, addr: &str) -> Result<String> {
    let s = Session::connect(domain, addr, 1 << 20)?;
    let bad = |what: &str| Error::Protocol {
        peer: addr.into(),
        why: format!("probe: {what}"),
    };
    let pattern: Vec<u8> = (0..65536u32).map(|i| (i * 7 + 3) as u8).collect();
    s.buf.write(SESSION_SCRATCH, &pattern)?;
    if s.round_trip(64)? != 64 {
        return Err(bad("echo of 64 bytes came back with another length"));
    }
    let mut back = vec![0u8; 64];
    s.buf.read(0, &mut back)?;
    s.write(4096, 65536)?;
    s.buf.write(SESSION_SCRATCH, &vec![0u8; 65536])?;
    s.read(4096, 65536)?;
    let mut got = vec![0u8; 65536];
    s.buf.read(SESSION_SCRATCH, &mut got)?;
    if got != pattern {
        return Err(bad("one-sided read did not return what the write stored"));
    }
    if s.write_imm_ack(0, 4096, 0xfeed)? != 0xfeed {
        return Err(bad(
            "write with immediate was acknowledged with another value",
        ));
    }
    Ok(format!("probe of {addr} over {}: send/recv, 64 KiB write + read-back, write-with-immediate + ack: ok", domain.describe()))
}
