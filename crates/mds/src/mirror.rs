//! The primary's side of the MDS mirror (Orion §3.1, Mojim-style). A mirror says hello
//! ([`Mds::mirror_hello`]); the primary starts recording what its pool persists
//! (`orion_pmem::tap`) and hands the mirror its pool to copy one-sided. When the mirror
//! has copied it, it hands over a ring in its memory ([`Mds::mirror_copied`], the ring's
//! format in [`crate::ring`]); the primary writes there what it persisted since, tells
//! the cluster manager that the mirror may take over, and from then on every turn ends
//! by writing what the turn persisted into the ring, one-sided; the turn's replies
//! leave once those writes completed ([`Mds::mirror_turn`]), or, when the mirror's
//! memory needs a flush, once it said it applied them: nothing is acknowledged that
//! the mirror lacks.
//!
//! A mirror whose ring stays full (a quarter of the lease), or goes, is dropped; before
//! any reply leaves without it, the manager is told it may no longer take over (the
//! replies wait until the manager has heard it, or the term ends). The mirror then
//! says hello again and copies the pool anew.

use std::time::{Duration, Instant};

use orion_fabric::{Access, Completion, ConnId, OpKind, Region, RemoteRegion};
use orion_meta::{FsError, FsResult};
use orion_pmem::tap::{push_record, record_end, RECORD_HEADER};
use orion_proto::channel::USER_WR_BASE;
use orion_proto::{Event, MdsInbound, MdsToMirror, Message, MirrorToMds, ReplyBody};
use orion_proto::{Reply, MAX_APPLY_RECORDS};
use tracing::{info, warn};

use crate::replies;
use crate::ring::{self, Frames, RingWriter};
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
    /// The connections of mirrors dropped while listed, closed once they are not.
    closing: Vec<ConnId>,
    /// The mirror's ring, once it copied the pool.
    ring: Option<RingSide>,
    /// Numbers the ring's entries.
    seq: u64,
    /// Replies held until the mirror has what they depend on.
    outbox: Vec<(ConnId, u64, Reply)>,
    records: Vec<u8>,
    /// The replies a turn takes (kept, as the buffers below, for its capacity).
    replies: Vec<u8>,
    msg: Vec<u8>,
    batch: Vec<Completion>,
    /// A turn's entries, encoded back to back, and where each ends.
    encoded: Vec<u8>,
    ends: Vec<usize>,
}

/// The mirror's ring as the primary writes it.
struct RingSide {
    writer: RingWriter,
    /// A write that completed is durable in the mirror (its pool is volatile);
    /// otherwise replies wait for its `Applied`.
    durable_on_delivery: bool,
    /// What the one-sided writes are made from, and where the head is read into.
    staging: Region,
    /// Entries framed and not yet written (kept for its capacity).
    frames: Frames,
    head_buf: Region,
    /// The mirror's last `Applied`.
    applied: u64,
    /// The tail when the mirror was last woken.
    woken_at: u64,
    next_wr: u64,
}

/// Bytes staged for one round of ring writes.
const STAGING: usize = 1 << 20;
/// A mirror durable on delivery is woken (an immediate with the last write of a turn)
/// once this much was written since it was last woken, or when the ring is short of
/// room; else it looks at its next look at the manager (a fifth of the lease). Waking it for every turn cost the primary's
/// clients ~10 µs per update here: two cores shared by client, primary and mirror.
const WAKE_BYTES: u64 = 1 << 20;

impl Mirroring {
    /// Whether a reply must wait for the end of the turn.
    pub(crate) fn holds_replies(&self) -> bool {
        self.synced || self.must_unlist
    }

    /// Whether replies wait until a mirror that may still be listed is taken off the
    /// list (the manager was not reachable): tried again at every turn.
    pub(crate) fn unlisting(&self) -> bool {
        self.must_unlist && !self.synced
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
                orion_format::hex(&cluster_uuid),
                orion_format::hex(&own)
            )));
        }
        if self.mirror.conn.is_some() {
            self.mirror_lost("another mirror said hello");
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
            // An old mirror the manager may still list keeps its connection until the
            // manager lists another set (a close it saw while listed would end this
            // term: a needless fail-over).
            must_unlist: self.mirror.must_unlist,
            unlist_failed: self.mirror.unlist_failed,
            closing: std::mem::take(&mut self.mirror.closing),
            outbox: std::mem::take(&mut self.mirror.outbox),
            ..Default::default()
        };
        Ok(ReplyBody::MirrorStart {
            epoch,
            pool: self.pool_region.remote(),
            superblock: self.superblock.clone(),
        })
    }

    /// The mirror has copied the pool and offers `ring`: it gets what was persisted
    /// since, and is then in sync.
    pub(crate) fn mirror_copied(
        &mut self,
        conn: ConnId,
        ring: RemoteRegion,
        durable_on_delivery: bool,
    ) {
        if self.mirror.conn != Some(conn) || !self.mirror.copying {
            warn!("a mirror said it copied the pool out of turn");
            return;
        }
        let t0 = Instant::now();
        let side = RingWriter::new(ring).and_then(|writer| {
            let region = |len| {
                self.domain
                    .alloc_region(len, Access::LOCAL)
                    .map_err(|e| format!("memory for the mirror's ring writes: {e}"))
            };
            Ok(RingSide {
                writer,
                durable_on_delivery,
                staging: region(STAGING)?,
                frames: Frames::new(STAGING),
                head_buf: region(64)?,
                applied: 0,
                woken_at: 0,
                next_wr: USER_WR_BASE,
            })
        });
        match side {
            Ok(side) => self.mirror.ring = Some(side),
            Err(e) => return self.mirror_lost(&e),
        }
        let backlog = self.engine.pool().persisted_backlog();
        // Every reply remembered so far goes with the backlog, and each new one after.
        self.replies.for_mirror(true);
        // Written even when empty: its last entry is what tells the mirror its copy is
        // whole.
        if let Err(e) = self.ship_to_mirror(true) {
            return self.mirror_lost(&e);
        }
        let name = self.mirror.name.clone();
        let listed = self.role.as_ref().map(|r| r.set_eligible(Some(&name)));
        match listed {
            Some(Ok(true)) => {
                // Checked on entry, and the shipping above loses no mirror (it fails).
                assert!(
                    self.mirror.copying && !self.mirror.synced && self.mirror.conn == Some(conn),
                    "a mirror gets in sync only from copying the pool"
                );
                self.mirror.copying = false;
                self.mirror.synced = true;
                // The list names this primary and the new mirror only: an old mirror
                // still to be taken off it is off it.
                self.mirror.must_unlist = false;
                self.mirror.unlist_failed = None;
                for c in std::mem::take(&mut self.mirror.closing) {
                    self.drop_peer(c, "another mirror took its place");
                }
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
            if let Err(e) = self.ship_to_mirror(false) {
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
                    for c in std::mem::take(&mut self.mirror.closing) {
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
        // Returned above unless the manager heard it; a mirror dropped since (the one
        // closed above) was not in sync, since `must_unlist` is never set with `synced`.
        assert!(
            !self.mirror.must_unlist,
            "replies leave while the manager may list a lost mirror"
        );
        for (conn, id, reply) in std::mem::take(&mut self.mirror.outbox) {
            self.send_reply_now(conn, id, reply);
        }
    }

    /// A clean stop: the manager lists this primary alone first, so that its mirror,
    /// seeing the connection close, does not take over (it copies anew when the
    /// cluster starts again).
    pub(crate) fn mirror_stop(&mut self) {
        // A lost mirror still listed (`must_unlist`) is unlisted too: closing its
        // connection while listed would let it take over.
        if self.mirror.synced || self.mirror.must_unlist {
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
        self.mirror.ring = None;
        warn!(
            "mirror {} lost ({why}): replies wait until the cluster manager knows it is \
             out of sync",
            self.mirror.name
        );
        let gone = !self.peers.get(&conn).is_some_and(|p| p.ch.conn.is_alive());
        if self.mirror.must_unlist && !gone {
            self.mirror.closing.push(conn);
        } else {
            self.drop_peer(conn, why);
        }
    }

    /// A connection of a mirror closed (`drop_peer`): the mirror is lost if it is the
    /// current one; an old one, replaced or waiting to be closed, only goes.
    pub(crate) fn mirror_departed(&mut self, conn: ConnId, why: &str) {
        if self.mirror.conn == Some(conn) {
            self.mirror_lost(why);
        } else {
            self.mirror.closing.retain(|&c| c != conn);
            info!("a former mirror's connection closed: {why}");
        }
    }

    /// Writes into the mirror's ring what was persisted since the last call, and the
    /// replies remembered (a turn of one empty entry if there is nothing and
    /// `even_empty`), and waits until the mirror holds them.
    fn ship_to_mirror(&mut self, even_empty: bool) -> Result<(), String> {
        let Some(conn) = self.mirror.conn else {
            return Ok(());
        };
        let mut log = std::mem::take(&mut self.mirror.records);
        self.engine.pool().take_persisted(&mut log);
        let mut replies = std::mem::take(&mut self.mirror.replies);
        self.replies.take_pending(&mut replies);
        let r = turn_entries(&log, &replies, even_empty).and_then(|e| self.write_turn(conn, e));
        self.mirror.records = log;
        self.mirror.replies = replies;
        r
    }

    /// Writes one turn's entries into the ring (the last one wakes the mirror), then
    /// waits until the writes completed, and, for a mirror not durable on delivery,
    /// until it applied them.
    fn write_turn(&mut self, conn: ConnId, entries: Vec<MdsToMirror>) -> Result<(), String> {
        if entries.is_empty() {
            return Ok(()); // an idle turn: nothing to write, wait for or check
        }
        // Moved on whenever the mirror makes progress: only a mirror that stalls for
        // the whole timeout is dropped, not one applying a long first turn.
        let mut deadline = Instant::now() + self.mirror_timeout();
        let n = entries.len();
        let mut encoded = std::mem::take(&mut self.mirror.encoded);
        encoded.clear();
        let mut ends = std::mem::take(&mut self.mirror.ends);
        ends.clear();
        for (i, mut m) in entries.into_iter().enumerate() {
            let MdsToMirror::Apply { seq, last, .. } = &mut m;
            self.mirror.seq += 1;
            *seq = self.mirror.seq;
            *last = i + 1 == n;
            m.encode(&mut encoded, 0);
            ends.push(encoded.len());
        }
        let r = self.frame_and_post(conn, &encoded, &ends, &mut deadline);
        self.mirror.encoded = encoded;
        self.mirror.ends = ends;
        r?;
        let ring = self.mirror.ring.as_ref().ok_or("the mirror has no ring")?;
        if !ring.durable_on_delivery {
            let upto = ring.writer.tail();
            self.await_mirror(conn, &mut deadline, &mut 0, Some(upto))?;
        }
        // Every write completed, so each landed while the mirror's process lived (the
        // fabric's rule on every backend: the local one, whose ring is a file that
        // outlives its process and may be drained by a successor, checks the target's
        // liveness word after its copy).
        Ok(())
    }

    /// Frames the payloads `encoded[ends[i-1]..ends[i]]` and writes them.
    fn frame_and_post(
        &mut self,
        conn: ConnId,
        encoded: &[u8],
        ends: &[usize],
        deadline: &mut Instant,
    ) -> Result<(), String> {
        let payloads = || {
            let starts = std::iter::once(0).chain(ends.iter().copied());
            starts.zip(ends.iter()).map(|(a, &b)| &encoded[a..b])
        };
        // An in-sync mirror applies a turn only once all of it is in the ring: one
        // that could not fit would never apply. (The first turn, while the mirror
        // completes its copy, applies entry by entry.)
        let ring = self.mirror.ring.as_mut().ok_or("the mirror has no ring")?;
        if self.mirror.synced && !ring.writer.holds_together(payloads().map(<[u8]>::len)) {
            return Err(format!(
                "a turn of {} bytes does not fit its ring whole",
                encoded.len()
            ));
        }
        ring.frames.clear();
        for payload in payloads() {
            self.frame_entry(conn, payload, deadline)?;
        }
        let ring = self.mirror.ring.as_ref().ok_or("the mirror has no ring")?;
        let wake = !ring.durable_on_delivery || ring.writer.tail() - ring.woken_at >= WAKE_BYTES;
        self.post_ring_writes(conn, wake, deadline)
    }

    /// Frames one entry after those framed; when the ring has no room, those go out
    /// first and the mirror's head is read until it has (or `deadline` passes).
    fn frame_entry(
        &mut self,
        conn: ConnId,
        payload: &[u8],
        deadline: &mut Instant,
    ) -> Result<(), String> {
        loop {
            let ring = self.mirror.ring.as_mut().ok_or("the mirror has no ring")?;
            if ring.writer.frame(payload, &mut ring.frames)? {
                return Ok(());
            }
            self.post_ring_writes(conn, true, deadline)?;
            self.read_ring_head(conn, deadline)?;
        }
    }

    /// Reads the mirror's ring head one-sided (after a short pause when it has not
    /// moved: the mirror is applying); its progress moves `deadline` on.
    fn read_ring_head(&mut self, conn: ConnId, deadline: &mut Instant) -> Result<(), String> {
        if Instant::now() >= *deadline {
            return Err(format!(
                "its ring stayed full for {:?}",
                self.mirror_timeout()
            ));
        }
        let ring = self.mirror.ring.as_mut().ok_or("the mirror has no ring")?;
        let wr = ring.next_wr;
        ring.next_wr += 1;
        let peer = self
            .peers
            .get(&conn)
            .ok_or("the mirror's connection is gone")?;
        peer.ch
            .conn
            .post_read(wr, &ring.head_buf, 0, &ring.writer.region, ring::HEAD, 8)
            .map_err(|e| format!("reading its ring head: {e}"))?;
        self.await_mirror(conn, deadline, &mut 1, None)?;
        let timeout = self.mirror_timeout();
        let ring = self.mirror.ring.as_mut().ok_or("the mirror has no ring")?;
        let before = ring.writer.head();
        let head = ring.head_buf.load_u64(0).map_err(|e| e.to_string())?;
        ring.writer.set_head(head)?;
        if head > before {
            *deadline = Instant::now() + timeout;
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    /// Posts the framed writes (staged in rounds of at most [`STAGING`] bytes), the last
    /// with an immediate that wakes the mirror when `notify`, and waits for them to
    /// complete.
    fn post_ring_writes(
        &mut self,
        conn: ConnId,
        notify: bool,
        deadline: &mut Instant,
    ) -> Result<(), String> {
        let n = self
            .mirror
            .ring
            .as_ref()
            .map_or(0, |r| r.frames.writes.len());
        let mut k = 0;
        while k < n {
            let ring = self.mirror.ring.as_mut().ok_or("the mirror has no ring")?;
            let peer = self
                .peers
                .get(&conn)
                .ok_or("the mirror's connection is gone")?;
            let mut staged = 0usize;
            let mut posted = 0usize;
            while k < n && staged + ring.frames.writes[k].1.len() <= STAGING {
                let (off, range) = ring.frames.writes[k].clone();
                let len = range.len();
                // Framed within DATA..DATA + cap, which `RingWriter::new` fit in the ring.
                debug_assert!(
                    off + len as u64 <= ring.writer.region.len,
                    "a write runs past the mirror's ring"
                );
                ring.staging
                    .write(staged as u64, &ring.frames.bytes[range])
                    .map_err(|e| e.to_string())?;
                let wr = ring.next_wr;
                ring.next_wr += 1;
                let r = if notify && k + 1 == n {
                    ring.woken_at = ring.writer.tail();
                    let imm = ring.writer.tail() as u32;
                    peer.ch.conn.post_write_imm(
                        wr,
                        &ring.staging,
                        staged as u64,
                        &ring.writer.region,
                        off,
                        len,
                        imm,
                    )
                } else {
                    peer.ch.conn.post_write(
                        wr,
                        &ring.staging,
                        staged as u64,
                        &ring.writer.region,
                        off,
                        len,
                    )
                };
                r.map_err(|e| format!("writing its ring: {e}"))?;
                staged += len;
                posted += 1;
                k += 1;
            }
            if posted == 0 {
                return Err(format!(
                    "a ring write of {} bytes",
                    ring.frames.writes[k].1.len()
                ));
            }
            self.await_mirror(conn, deadline, &mut posted, None)?;
        }
        if let Some(ring) = self.mirror.ring.as_mut() {
            ring.frames.clear();
        }
        Ok(())
    }

    /// Waits on the loop's completion queue until `ops` one-sided operations on the
    /// mirror's connection completed and, with `applied`, the mirror said it applied
    /// the ring up to there (each `Applied` that moves on moves `deadline` on). What
    /// comes for other connections meanwhile is handled on the next turn.
    fn await_mirror(
        &mut self,
        conn: ConnId,
        deadline: &mut Instant,
        ops: &mut usize,
        applied: Option<u64>,
    ) -> Result<(), String> {
        let mut batch = std::mem::take(&mut self.mirror.batch);
        let mut msg = std::mem::take(&mut self.mirror.msg);
        let mut first = true;
        let r = loop {
            let ring = self.mirror.ring.as_ref().ok_or("the mirror has no ring")?;
            if *ops == 0 && applied.is_none_or(|u| ring.applied >= u) {
                break Ok(());
            }
            batch.clear();
            // A write of the local backend completes as it is posted: the first look
            // takes no clock.
            if !std::mem::take(&mut first) || self.cq.poll(&mut batch, 16) == 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break Err(format!("no answer within {:?}", self.mirror_timeout()));
                }
                let _ = self.cq.wait(&mut batch, 16, left);
            }
            let mut failed = None;
            for c in batch.drain(..) {
                if c.conn != conn {
                    self.deferred.push(c);
                    continue;
                }
                if c.wr_id >= USER_WR_BASE
                    && matches!(c.kind, OpKind::Read | OpKind::Write | OpKind::WriteImm)
                {
                    *ops = ops.saturating_sub(1);
                    if let Err(e) = c.status {
                        failed = Some(format!("its ring: {e}"));
                    }
                    continue;
                }
                let Some(peer) = self.peers.get_mut(&conn) else {
                    failed = Some("the mirror's connection is gone".into());
                    continue;
                };
                match peer.ch.on_completion(&c) {
                    Event::Done => {}
                    Event::Broken(e) => failed = Some(format!("connection: {e}")),
                    Event::Message { slot, len } => {
                        let read = peer.ch.read_message(slot, len, &mut msg);
                        let repost = peer.ch.repost(slot);
                        if let Err(e) = read.and(repost) {
                            failed = Some(format!("connection: {e}"));
                            continue;
                        }
                        match MdsInbound::decode(&msg) {
                            Ok((_, MdsInbound::Mirror(MirrorToMds::Applied { upto }))) => {
                                let before = self.mirror.ring.as_ref().map_or(0, |r| r.applied);
                                self.mirror_applied(conn, upto);
                                if upto > before {
                                    *deadline = Instant::now() + self.mirror_timeout();
                                }
                            }
                            _ => failed = Some("an unexpected message from the mirror".into()),
                        }
                    }
                }
            }
            if let Some(e) = failed {
                break Err(e);
            }
        };
        self.mirror.msg = msg;
        self.mirror.batch = batch;
        r
    }

    /// The mirror says it applied its ring up to `upto`.
    pub(crate) fn mirror_applied(&mut self, conn: ConnId, upto: u64) {
        // Only the current mirror's word counts: an old one (closing) applies another
        // ring, whose positions say nothing of this one.
        if self.mirror.conn != Some(conn) {
            return;
        }
        if let Some(ring) = self.mirror.ring.as_mut() {
            ring.applied = ring.applied.max(upto);
        }
    }

    /// How long the primary waits for its mirror before going on without it: a
    /// quarter of the lease (a stalled mirror must not stall the cluster for long).
    fn mirror_timeout(&self) -> Duration {
        (Duration::from_millis(self.cfg.lease_ms) / 4).max(Duration::from_millis(100))
    }
}

/// One turn as ring entries: the persist records in as many entries as it takes (a
/// record longer than an entry goes in parts: a persist of many lines is not atomic
/// on the primary's media either), then the replies; one empty entry for an empty turn
/// if `even_empty`.
fn turn_entries(log: &[u8], replies: &[u8], even_empty: bool) -> Result<Vec<MdsToMirror>, String> {
    const PART: usize = MAX_APPLY_RECORDS - RECORD_HEADER;
    let apply = |records, replies| MdsToMirror::Apply {
        seq: 0,
        records,
        replies,
        last: false,
    };
    let mut entries = Vec::new();
    let mut piece = Vec::with_capacity(MAX_APPLY_RECORDS.min(log.len() + 64));
    let mut at = 0;
    while at < log.len() {
        let end = record_end(log, at).ok_or("a torn persist record")?;
        let off = u64::from_le_bytes(log[at..at + 8].try_into().expect("8 bytes"));
        for (i, bytes) in log[at + RECORD_HEADER..end].chunks(PART).enumerate() {
            if piece.len() + RECORD_HEADER + bytes.len() > MAX_APPLY_RECORDS {
                entries.push(apply(std::mem::take(&mut piece), Vec::new()));
            }
            push_record(&mut piece, off + (i * PART) as u64, bytes);
        }
        at = end;
    }
    if !piece.is_empty() {
        entries.push(apply(piece, Vec::new()));
    }
    for p in replies::pieces(replies, MAX_APPLY_RECORDS) {
        entries.push(apply(Vec::new(), p.to_vec()));
    }
    if entries.is_empty() && even_empty {
        entries.push(apply(Vec::new(), Vec::new()));
    }
    Ok(entries)
}
