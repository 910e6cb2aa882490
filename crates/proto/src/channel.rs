//! A message channel over one fabric connection: receive buffers kept posted, send
//! buffers recycled as sends complete. Servers run many channels on one completion
//! queue; a client runs request/reply calls on its own ([`Channel::call`]).

use std::time::{Duration, Instant};

use orion_fabric::{
    Access, Completion, CompletionQueue, Connection, Domain, Error, OpKind, Region, Result,
    MAX_MESSAGE,
};

use crate::msg::{decode_reply, encode_reply, Message, Reply};

/// Receive (and send) buffers per channel: how many messages may be in flight.
pub const DEPTH: u64 = 8;
/// `wr_id`s of sends carry this bit; receives use the slot number alone, and callers
/// may use ids from [`USER_WR_BASE`] up for their one-sided operations.
pub const SEND_TAG: u64 = 1 << 32;
pub const USER_WR_BASE: u64 = 1 << 40;

pub struct Channel {
    pub conn: Connection,
    recv: Region,
    send: Region,
    free_send: Vec<u64>,
    scratch: Vec<u8>,
    /// Buffers of [`Channel::call`], kept so a call allocates nothing.
    batch: Vec<Completion>,
    incoming: Vec<u8>,
}

/// What a completion meant for a channel.
pub enum Event {
    /// A message arrived in receive slot `slot` (read it, then [`Channel::repost`]).
    Message { slot: u64, len: usize },
    /// A send finished (its buffer is free again) or another operation completed.
    Done,
    /// The connection failed: the peer is gone or misbehaved.
    Broken(Error),
}

impl Channel {
    /// Wraps a fresh connection and posts every receive buffer.
    pub fn new(domain: &Domain, conn: Connection) -> Result<Channel> {
        let ch = Channel::unposted(domain, conn)?;
        ch.post_receives()?;
        Ok(ch)
    }

    /// Wraps a connection without posting receives yet: a server's acceptor hands it
    /// to the event loop, which posts them ([`Channel::post_receives`]), so that no
    /// completion of the connection can reach the loop before the channel does.
    pub fn unposted(domain: &Domain, conn: Connection) -> Result<Channel> {
        let len = (DEPTH as usize) * MAX_MESSAGE;
        let ch = Channel {
            conn,
            recv: domain.alloc_region(len, Access::LOCAL)?,
            send: domain.alloc_region(len, Access::LOCAL)?,
            free_send: (0..DEPTH).rev().collect(),
            scratch: Vec::with_capacity(MAX_MESSAGE),
            batch: Vec::with_capacity(16),
            incoming: Vec::with_capacity(MAX_MESSAGE),
        };
        Ok(ch)
    }

    pub fn post_receives(&self) -> Result<()> {
        for slot in 0..DEPTH {
            self.repost(slot)?;
        }
        Ok(())
    }

    pub fn repost(&self, slot: u64) -> Result<()> {
        self.conn
            .post_recv(slot, &self.recv, slot * MAX_MESSAGE as u64, MAX_MESSAGE)
    }

    /// Copies the message in `slot` out (the slot is reposted by the caller).
    pub fn read_message(&self, slot: u64, len: usize, out: &mut Vec<u8>) -> Result<()> {
        out.resize(len.min(MAX_MESSAGE), 0);
        self.recv.read(slot * MAX_MESSAGE as u64, out)
    }

    /// Classifies a completion of this channel's connection.
    pub fn on_completion(&mut self, c: &Completion) -> Event {
        if let Err(e) = &c.status {
            return Event::Broken(e.clone());
        }
        match c.kind {
            OpKind::Recv if c.wr_id < DEPTH => Event::Message {
                slot: c.wr_id,
                len: c.len,
            },
            OpKind::Send if c.wr_id & SEND_TAG != 0 => {
                let slot = c.wr_id & !SEND_TAG;
                // Tagged sends are posted from the free list only, whose slots are < DEPTH.
                debug_assert!(slot < DEPTH, "send buffer {slot} of {DEPTH}");
                self.free_send.push(slot);
                Event::Done
            }
            _ => Event::Done,
        }
    }

    /// Sends `bytes` from a free send buffer.
    pub fn send_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.len() > MAX_MESSAGE {
            return Err(Error::MessageTooLarge {
                len: bytes.len(),
                max: MAX_MESSAGE,
            });
        }
        let slot = self.free_send.pop().ok_or_else(|| Error::Protocol {
            peer: self.conn.peer().to_string(),
            why: "peer does not take its messages: every send buffer is in flight".into(),
        })?;
        let off = slot * MAX_MESSAGE as u64;
        let r = self.send.write(off, bytes).and_then(|_| {
            self.conn
                .post_send(SEND_TAG | slot, &self.send, off, bytes.len())
        });
        if r.is_err() {
            self.free_send.push(slot);
        }
        r
    }

    pub fn send_request(&mut self, id: u64, req: &impl Message) -> Result<()> {
        let mut b = std::mem::take(&mut self.scratch);
        b.clear();
        req.encode(&mut b, id);
        // Every encoder starts with the header the peer reads the request's id from.
        debug_assert_eq!(
            crate::peek_id(&b),
            Some(id),
            "{} without its header",
            req.name()
        );
        let r = self.send_bytes(&b);
        self.scratch = b;
        r
    }

    pub fn send_reply(&mut self, id: u64, reply: &Reply) -> Result<()> {
        let mut b = std::mem::take(&mut self.scratch);
        b.clear();
        encode_reply(&mut b, id, reply);
        debug_assert!(
            crate::is_reply(&b) && crate::peek_id(&b) == Some(id),
            "a reply to {id} without its header"
        );
        let r = self.send_bytes(&b);
        self.scratch = b;
        r
    }

    /// Sends `req` and waits for the reply with the same id, on a completion queue only
    /// this channel's caller uses. Completions of other work (one-sided operations) are
    /// left in `other`.
    pub fn call(
        &mut self,
        cq: &CompletionQueue,
        id: u64,
        req: &impl Message,
        timeout: Duration,
        other: &mut Vec<Completion>,
    ) -> Result<Reply> {
        self.send_request(id, req)?;
        self.wait_reply(cq, &[id], timeout, other).map(|(_, r)| r)
    }

    /// Waits up to `timeout` for the reply to any of the requests `ids` sent on this
    /// channel, and says which it answers (the first id's, if several arrive at
    /// once); replies to other ids (late ones, to abandoned calls) are dropped.
    /// Completions of other work are left in `other`.
    pub fn wait_reply(
        &mut self,
        cq: &CompletionQueue,
        ids: &[u64],
        timeout: Duration,
        other: &mut Vec<Completion>,
    ) -> Result<(u64, Reply)> {
        let deadline = Instant::now() + timeout;
        let mut batch = std::mem::take(&mut self.batch);
        let mut msg = std::mem::take(&mut self.incoming);
        let r = self.wait_loop(cq, ids, (deadline, timeout), &mut batch, &mut msg, other);
        self.batch = batch;
        self.incoming = msg;
        r
    }

    fn wait_loop(
        &mut self,
        cq: &CompletionQueue,
        ids: &[u64],
        (deadline, timeout): (Instant, Duration),
        batch: &mut Vec<Completion>,
        msg: &mut Vec<u8>,
        other: &mut Vec<Completion>,
    ) -> Result<(u64, Reply)> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(timeout));
            }
            batch.clear();
            cq.wait(batch, 16, left)?;
            let mut answer = None;
            for c in batch.drain(..) {
                if c.conn != self.conn.id() {
                    other.push(c);
                    continue;
                }
                match self.on_completion(&c) {
                    Event::Broken(e) => return Err(e),
                    Event::Done => {
                        if !matches!(c.kind, OpKind::Send | OpKind::Recv) {
                            other.push(c);
                        }
                    }
                    Event::Message { slot, len } => {
                        self.read_message(slot, len, msg)?;
                        self.repost(slot)?;
                        match decode_reply(msg) {
                            // The first id's reply wins over the others' in the
                            // same batch: a ping answered just before its call
                            // must not make the call's reply a "late" one. Of two
                            // replies to one id, the first stands.
                            Ok((rid, reply))
                                if ids.contains(&rid)
                                    && answer.as_ref().is_none_or(|(taken, _)| {
                                        *taken != ids[0] && rid == ids[0]
                                    }) =>
                            {
                                answer = Some((rid, reply))
                            }
                            Ok(_) => {} // a late reply to an abandoned call
                            Err(e) => {
                                return Err(Error::Protocol {
                                    peer: self.conn.peer().to_string(),
                                    why: format!("malformed reply: {e}"),
                                })
                            }
                        }
                    }
                }
            }
            if let Some(a) = answer {
                return Ok(a);
            }
        }
    }
}

/// Threads a server's acceptor runs handshakes on. A peer that stops in the middle of
/// one (its process stopped, or its host gone after its TCP connection was accepted)
/// holds up its thread for the fabric's connect timeout; with one thread, every
/// client and store trying to reach the server in a fail-over waited behind it.
pub const ACCEPT_THREADS: usize = 4;

/// How long an acceptor thread sleeps in `accept` before it looks at its stop flag:
/// long, since [`AcceptorThreads::join`] and the threads' drop wake it (every
/// backend's listener wakes its sleepers); each wake-up of an idle server's four
/// threads costs tens of microseconds of CPU on a VM.
const ACCEPT_WAIT: Duration = Duration::from_secs(60);

/// A server's acceptor threads, as [`spawn_acceptor`] started them. Dropped, they
/// end soon (the listener is woken and accepts no one after); joined, they are
/// waited for.
pub struct AcceptorThreads {
    thread: Option<std::thread::JoinHandle<()>>,
    listener: std::sync::Arc<orion_fabric::Listener>,
}

impl AcceptorThreads {
    /// Waits for the threads to end: their sleeps in `accept` are cut short, and the
    /// listener accepts no one after.
    pub fn join(mut self) -> std::thread::Result<()> {
        self.listener.wake();
        self.thread.take().map_or(Ok(()), |t| t.join())
    }
}

impl Drop for AcceptorThreads {
    fn drop(&mut self) {
        self.listener.wake();
    }
}

/// A server's acceptor: runs handshakes on [`ACCEPT_THREADS`] threads until `stop`
/// and hands each new connection, its receives not yet posted, to the event loop
/// through the returned receiver (see [`Channel::unposted`]). `on_error` hears of
/// refused peers. The returned threads end when `stop` is set and they are joined.
pub fn spawn_acceptor(
    name: &str,
    domain: &Domain,
    listener: orion_fabric::Listener,
    cq: std::sync::Arc<CompletionQueue>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    on_error: impl Fn(String) + Send + Sync + 'static,
) -> std::io::Result<(AcceptorThreads, std::sync::mpsc::Receiver<Channel>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let listener = std::sync::Arc::new(listener);
    let accepting = Acceptor {
        domain: domain.clone(),
        listener: listener.clone(),
        cq,
        stop,
        on_error: std::sync::Arc::new(on_error),
        tx,
    };
    let name = name.to_string();
    let t = std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            let others: Vec<_> = (1..ACCEPT_THREADS)
                .filter_map(|_| {
                    let a = accepting.clone();
                    let spawned = std::thread::Builder::new()
                        .name(name.clone())
                        .spawn(move || a.run());
                    // Fewer threads (none left to spawn) only make handshakes wait.
                    spawned
                        .map_err(|e| (accepting.on_error)(format!("{e}")))
                        .ok()
                })
                .collect();
            accepting.run();
            for t in others {
                let _ = t.join();
            }
        })?;
    Ok((
        AcceptorThreads {
            thread: Some(t),
            listener,
        },
        rx,
    ))
}

/// What each acceptor thread shares.
#[derive(Clone)]
struct Acceptor {
    domain: Domain,
    listener: std::sync::Arc<orion_fabric::Listener>,
    cq: std::sync::Arc<CompletionQueue>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    on_error: std::sync::Arc<dyn Fn(String) + Send + Sync>,
    tx: std::sync::mpsc::Sender<Channel>,
}

impl Acceptor {
    fn run(&self) {
        let over =
            || self.stop.load(std::sync::atomic::Ordering::Relaxed) || self.listener.is_woken();
        while !over() {
            match self.listener.accept(&self.cq, ACCEPT_WAIT) {
                Ok(conn) => {
                    let peer = conn.peer().to_string();
                    match Channel::unposted(&self.domain, conn) {
                        Ok(ch) => {
                            if self.tx.send(ch).is_err() {
                                return;
                            }
                            // The server adopts it (posts its receives) at its next
                            // turn: now, not after its idle wait.
                            self.cq.wake();
                        }
                        Err(e) => (self.on_error)(format!("connection from {peer}: {e}")),
                    }
                }
                Err(Error::Timeout(_)) => {}
                // A listener woken to stop fails its accepts: nothing to report.
                Err(_) if over() => {}
                Err(e) => (self.on_error)(format!("refused a connection: {e}")),
            }
        }
    }
}

/// How long a connect to each of a server's addresses (the primary MDS and its mirror)
/// may wait for the host to answer, the handshake included: [`Patience::FIRST`] at
/// first, doubled for an address each time an attempt there used all of it (a slow
/// host or network is reached in a later round), and back to the first after a
/// success. A host that is up answers within milliseconds (a process gone refuses at
/// once, and a server runs several handshakes at a time); one silent for a second is
/// most likely down or stopped, and costs no more than that while another address
/// may serve (the fabric's connect timeout is 10 s).
#[derive(Clone, Debug, Default)]
pub struct Patience(Vec<Duration>);

impl Patience {
    pub const FIRST: Duration = Duration::from_secs(1);

    pub fn new(addresses: usize) -> Patience {
        Patience(vec![Self::FIRST; addresses.max(1)])
    }

    /// Runs `attempt` on address `k` with that address's patience, and learns from
    /// how it went.
    pub fn attempt<T, E>(
        &mut self,
        k: usize,
        attempt: impl FnOnce(Duration) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let patience = self.0[k];
        let started = Instant::now();
        let r = attempt(patience);
        match &r {
            Ok(_) => self.0.fill(Self::FIRST),
            Err(_) if started.elapsed() >= patience => self.0[k] = patience.saturating_mul(2),
            Err(_) => {}
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patience_doubles_for_an_address_that_used_it_all_and_resets_after_a_success() {
        let mut p = Patience::new(2);
        let seen = |p: &mut Patience, k: usize| {
            let mut got = Duration::ZERO;
            let _ = p.attempt(k, |d| -> std::result::Result<(), ()> {
                got = d;
                Err(())
            });
            got
        };
        // A host that did not answer within its patience (a vanished host).
        let r: std::result::Result<(), ()> = p.attempt(0, |d| {
            std::thread::sleep(d);
            Err(())
        });
        assert!(r.is_err());
        assert_eq!(seen(&mut p, 0), Patience::FIRST * 2);
        // A quick refusal (a mirror turning the caller away) changes nothing.
        assert_eq!(seen(&mut p, 1), Patience::FIRST);
        assert_eq!(seen(&mut p, 0), Patience::FIRST * 2);
        // A success anywhere starts every address afresh.
        assert_eq!(p.attempt(1, |_| Ok::<u8, ()>(7)), Ok(7));
        assert_eq!(seen(&mut p, 0), Patience::FIRST);
    }
}
