//! The primary's side of the MDS mirror (Orion §3.1, Mojim-style). A mirror says hello
//! ([`Mds::mirror_hello`]); the primary starts recording what its pool persists
//! (`orion_pmem::tap`) and hands the mirror its pool to copy one-sided. When the mirror
//! has copied it ([`Mds::mirror_copied`]), the primary sends what it persisted since,
//! tells the cluster manager that the mirror may take over, and from then on holds
//! every reply until the mirror has applied what the turn persisted
//! ([`Mds::mirror_turn`]): nothing is acknowledged that the mirror lacks.
//!
//! A mirror that fails to answer in time, or goes, is dropped; before any reply leaves
//! without it, the manager is told it may no longer take over (the replies wait until
//! the manager has heard it, or the term ends). The mirror then says hello again and
//! copies the pool anew.

use std::time::{Duration, Instant};

use orion_fabric::ConnId;
use orion_meta::{FsError, FsResult};
use orion_pmem::tap::{push_record, record_end, RECORD_HEADER};
use orion_proto::{decode_reply, Event, MdsToMirror, Reply, ReplyBody, MAX_APPLY_RECORDS};
use tracing::{info, warn};

use crate::replies;
use crate::server::{Mds, Role};

/// The primary's mirror, if any, and the replies held for it.
#[derive(Default)]
pub(crate) struct Mirroring {
    /// The mirror's connection.
    conn: Option<ConnId>,
    name: String,
    /// It is copying the pool: what is persisted meanwhile is kept for it.
    copying: bool,
    /// It holds everything persisted, and the manager lets it take over: replies wait
    /// for it.
    synced: bool,
    /// The manager still names a mirror that was lost: nothing is acknowledged until
    /// it no longer does.
    must_unlist: bool,
    /// When the manager was last asked in vain (to say so once a second).
    unlist_failed: Option<Instant>,
    /// The connection of a mirror dropped while listed, closed once it is not.
    closing: Option<ConnId>,
    seq: u64,
    next_id: u64,
    /// Replies held until the mirror has what they depend on.
    outbox: Vec<(ConnId, u64, Reply)>,
    /// The version of the cluster map file the mirror has.
    members_sent: Option<u64>,
    records: Vec<u8>,
    msg: Vec<u8>,
}

impl Mirroring {
    /// Whether a reply must wait for the end of the turn.
    pub(crate) fn holds_replies(&self) -> bool {
        self.synced || self.must_unlist
    }

    pub(crate) fn hold(&mut self, conn: ConnId, id: u64, reply: Reply) {
        self.outbox.push((conn, id, reply));
    }
}

impl Mds {
    /// A mirror introduces itself on `conn`.
    pub(crate) fn mirror_hello(
        &mut self,
        conn: ConnId,
        name: String,
        addr: String,
        cluster_uuid: [u8; 16],
    ) -> FsResult<ReplyBody> {
        let Some(role) = self.role.as_ref() else {
            return Err(FsError::Io(
                "this MDS runs without a cluster manager: it takes no mirror".into(),
            ));
        };
        let epoch = role.epoch;
        if name == role.name {
            return Err(FsError::Io(format!(
                "{name} is this primary's own name: every MDS of a cluster needs its own"
            )));
        }
        let own = self.cluster_uuid();
        if cluster_uuid != [0; 16] && cluster_uuid != own {
            warn!("refused {name} at {addr} as a mirror: its pool belongs to another cluster");
            return Err(FsError::Io(format!(
                "the pool of {name} belongs to another cluster ({}; this one is {}): \
                 refusing to copy over it (delete that pool to make {name} a mirror of \
                 this cluster)",
                crate::server::hex(&cluster_uuid),
                crate::server::hex(&own)
            )));
        }
        if self.mirror.conn.is_some() {
            self.mirror_lost("another mirror said hello");
        }
        if let Some(c) = self.mirror.closing.take() {
            self.drop_peer(c, "another mirror said hello");
        }
        let peer = self
            .peers
            .get_mut(&conn)
            .ok_or(FsError::Io("gone".into()))?;
        peer.role = Role::Mirror;
        peer.name = format!("mirror {name} ({addr})");
        self.engine.pool().record_persists(true);
        self.replies.stop_for_mirror();
        info!(
            "mirror {name} at {addr} joined: it copies the pool ({} MiB)",
            self.engine.pool().len() >> 20
        );
        self.mirror = Mirroring {
            conn: Some(conn),
            name,
            copying: true,
            must_unlist: self.mirror.must_unlist,
            unlist_failed: self.mirror.unlist_failed,
            outbox: std::mem::take(&mut self.mirror.outbox),
            next_id: self.mirror.next_id,
            ..Default::default()
        };
        Ok(ReplyBody::MirrorStart {
            epoch,
            pool: self.pool_region.remote(),
            superblock: self.superblock.clone(),
        })
    }

    /// The mirror has copied the pool: it gets what was persisted since, and is then
    /// in sync.
    pub(crate) fn mirror_copied(&mut self, conn: ConnId) {
        if self.mirror.conn != Some(conn) || !self.mirror.copying {
            warn!("a mirror said it copied the pool out of turn");
            return;
        }
        let t0 = Instant::now();
        let backlog = self.engine.pool().persisted_backlog();
        // Every reply remembered so far goes with the backlog, and each new one after.
        self.replies.for_mirror(true);
        if let Err(e) = self.ship_to_mirror() {
            return self.mirror_lost(&e);
        }
        let name = self.mirror.name.clone();
        let listed = self.role.as_ref().map(|r| r.set_eligible(Some(&name)));
        match listed {
            Some(Ok(true)) => {
                self.mirror.copying = false;
                self.mirror.synced = true;
                info!(
                    "mirror {name} is in sync ({} KiB sent after its copy in {:?}): it may \
                     take over",
                    backlog >> 10,
                    t0.elapsed()
                );
            }
            Some(Ok(false)) | None => {} // the term is over: the loop stops
            Some(Err(e)) => {
                // The call may have landed even though it failed: until the manager
                // says otherwise, the mirror may be listed, and nothing is
                // acknowledged without it.
                self.mirror.must_unlist = true;
                self.mirror_lost(&format!("the cluster manager: {e:#}"));
            }
        }
    }

    /// Ends a turn of the loop: the mirror gets what the turn persisted, then the
    /// replies held for it leave.
    pub(crate) fn mirror_turn(&mut self) {
        if self.mirror.synced {
            if let Err(e) = self.ship_to_mirror() {
                self.mirror_lost(&e);
            }
        }
        if self.mirror.must_unlist {
            let Some(role) = self.role.as_ref() else {
                return;
            };
            match role.set_eligible(None) {
                Ok(true) => {
                    self.mirror.must_unlist = false;
                    self.mirror.unlist_failed = None;
                    info!("the cluster manager knows the mirror is out of sync");
                    // Only now is its connection closed: a mirror that saw it close
                    // while still listed would take the role (it may: it holds every
                    // update acknowledged), a needless fail-over.
                    if let Some(c) = self.mirror.closing.take() {
                        self.drop_peer(c, "dropped as out of sync");
                    }
                }
                Ok(false) => return, // the term is over: the loop stops
                Err(e) => {
                    let now = Instant::now();
                    if self
                        .mirror
                        .unlist_failed
                        .is_none_or(|t| now - t > Duration::from_secs(1))
                    {
                        warn!(
                            "cannot tell the cluster manager that the mirror is out of sync \
                             ({e:#}): holding {} replies",
                            self.mirror.outbox.len()
                        );
                        self.mirror.unlist_failed = Some(now);
                    }
                    return;
                }
            }
        }
        for (conn, id, reply) in std::mem::take(&mut self.mirror.outbox) {
            self.send_reply_now(conn, id, reply);
        }
    }

    /// A clean stop: the manager lists this primary alone first, so that its mirror,
    /// seeing the connection close, does not take over (it copies anew when the
    /// cluster starts again).
    pub(crate) fn mirror_stop(&mut self) {
        if self.mirror.synced {
            if let Some(role) = self.role.as_ref() {
                if let Err(e) = role.set_eligible(None) {
                    warn!("telling the cluster manager that the mirror stays behind: {e:#}");
                }
            }
        }
    }

    /// Drops the mirror (it went, or did not answer in time). Its connection closes
    /// once the manager no longer lists it (at once if it was not listed).
    pub(crate) fn mirror_lost(&mut self, why: &str) {
        let Some(conn) = self.mirror.conn.take() else {
            return;
        };
        self.engine.pool().record_persists(false);
        self.replies.stop_for_mirror();
        if self.mirror.synced {
            self.mirror.must_unlist = true;
        }
        self.mirror.synced = false;
        self.mirror.copying = false;
        warn!(
            "mirror {} lost ({why}): replies wait until the cluster manager knows it is \
             out of sync",
            self.mirror.name
        );
        let gone = !self.peers.get(&conn).is_some_and(|p| p.ch.conn.is_alive());
        if self.mirror.must_unlist && !gone {
            self.mirror.closing = Some(conn);
        } else {
            self.drop_peer(conn, why);
        }
    }

    /// Sends the mirror what was persisted since the last call (and the cluster map
    /// file if it changed, and the replies remembered), and waits until it has applied
    /// it.
    fn ship_to_mirror(&mut self) -> Result<(), String> {
        let Some(conn) = self.mirror.conn else {
            return Ok(());
        };
        let mut log = std::mem::take(&mut self.mirror.records);
        self.engine.pool().take_persisted(&mut log);
        let saves = self.map.saves();
        let members =
            (self.mirror.members_sent != Some(saves)).then(|| self.map.durable_text().into_bytes());
        let replies = self.replies.take_pending();
        let r = self.send_turn(conn, &log, members, &replies);
        if r.is_ok() {
            self.mirror.members_sent = Some(saves);
        }
        self.mirror.records = log;
        r
    }

    /// Sends one turn in as many `Apply` messages as it takes, the last marked so.
    fn send_turn(
        &mut self,
        conn: ConnId,
        log: &[u8],
        members: Option<Vec<u8>>,
        replies: &[u8],
    ) -> Result<(), String> {
        // A record longer than a message goes in parts: a persist of many lines is not
        // atomic on the primary's media either.
        const PART: usize = MAX_APPLY_RECORDS - RECORD_HEADER;
        let apply = |records, members, replies| MdsToMirror::Apply {
            seq: 0,
            records,
            members,
            replies,
            last: false,
        };
        let mut messages = Vec::new();
        let mut piece = Vec::with_capacity(MAX_APPLY_RECORDS);
        let mut at = 0;
        while at < log.len() {
            let end = record_end(log, at).ok_or("a torn persist record")?;
            let off = u64::from_le_bytes(log[at..at + 8].try_into().expect("8 bytes"));
            for (i, bytes) in log[at + RECORD_HEADER..end].chunks(PART).enumerate() {
                if piece.len() + RECORD_HEADER + bytes.len() > MAX_APPLY_RECORDS {
                    messages.push(apply(std::mem::take(&mut piece), None, Vec::new()));
                }
                push_record(&mut piece, off + (i * PART) as u64, bytes);
            }
            at = end;
        }
        if !piece.is_empty() {
            messages.push(apply(piece, None, Vec::new()));
        }
        if members.is_some() {
            messages.push(apply(Vec::new(), members, Vec::new()));
        }
        for p in replies::pieces(replies, MAX_APPLY_RECORDS) {
            messages.push(apply(Vec::new(), None, p.to_vec()));
        }
        let n = messages.len();
        for (i, mut m) in messages.into_iter().enumerate() {
            let MdsToMirror::Apply { seq, last, .. } = &mut m;
            self.mirror.seq += 1;
            *seq = self.mirror.seq;
            *last = i + 1 == n;
            self.apply_on_mirror(conn, &m)?;
        }
        Ok(())
    }

    /// One `Apply` to the mirror, waited for on the loop's completion queue (what
    /// comes for other connections meanwhile is handled on the next turn).
    fn apply_on_mirror(&mut self, conn: ConnId, req: &MdsToMirror) -> Result<(), String> {
        self.mirror.next_id += 1;
        let id = self.mirror.next_id;
        let peer = self
            .peers
            .get_mut(&conn)
            .ok_or("the mirror's connection is gone")?;
        peer.ch
            .send_request(id, req)
            .map_err(|e| format!("sending to the mirror: {e}"))?;
        let timeout = self.mirror_timeout();
        let deadline = Instant::now() + timeout;
        let mut batch = Vec::with_capacity(16);
        let mut msg = std::mem::take(&mut self.mirror.msg);
        let r = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(format!("no answer within {timeout:?}"));
            }
            batch.clear();
            let _ = self.cq.wait(&mut batch, 16, left);
            let mut answer = None;
            for c in batch.drain(..) {
                if c.conn != conn {
                    self.deferred.push(c);
                    continue;
                }
                let Some(peer) = self.peers.get_mut(&conn) else {
                    answer = Some(Err("the mirror's connection is gone".to_string()));
                    continue;
                };
                match peer.ch.on_completion(&c) {
                    Event::Done => {}
                    Event::Broken(e) => answer = Some(Err(format!("connection: {e}"))),
                    Event::Message { slot, len } => {
                        let read = peer.ch.read_message(slot, len, &mut msg);
                        let repost = peer.ch.repost(slot);
                        if let Err(e) = read.and(repost) {
                            answer = Some(Err(format!("connection: {e}")));
                            continue;
                        }
                        match decode_reply(&msg) {
                            Ok((rid, Reply::Ok(_))) if rid == id => {
                                answer = answer.or(Some(Ok(())));
                            }
                            Ok((rid, Reply::Err { message, .. })) if rid == id => {
                                answer = Some(Err(format!("the mirror refused: {message}")));
                            }
                            _ => {}
                        }
                    }
                }
            }
            if let Some(a) = answer {
                break a;
            }
        };
        self.mirror.msg = msg;
        r
    }

    /// How long the primary waits for its mirror before going on without it: a
    /// quarter of the lease (a stalled mirror must not stall the cluster for long).
    fn mirror_timeout(&self) -> Duration {
        (Duration::from_millis(self.cfg.lease_ms) / 4).max(Duration::from_millis(100))
    }
}
