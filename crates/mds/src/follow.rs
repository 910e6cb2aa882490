//! The mirror's side (Orion §3.1): an MDS that does not hold the primary role mirrors
//! the one that does, and takes the role when the primary's lease lapses and the
//! cluster manager lets it (it is in sync). It connects to the primary, copies the
//! primary's pool one-sided into its own, then hands the primary a ring
//! ([`crate::ring`]) and applies, in order, what the primary writes there
//! ([`crate::mirror`]). Its pool is then always a state the primary's media passed
//! through, which recovery handles; what the ring holds beyond it is applied before
//! this MDS takes the role, so taking over is the ordinary start of an MDS on its own
//! pool.
//!
//! While it copies, a marker file beside the pool says the pool is torn: an MDS whose
//! pool carries it never asks for the role (the manager would not grant it either,
//! since the primary takes a mirror off its list before it hands out its pool).
//! Clients that reach a mirror are turned away (their connection is closed), and they
//! try the next MDS address they know.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::ring::{ring_path, RingReader};
use anyhow::{anyhow, bail, Context, Result};
use orion_fabric::{Access, CompletionQueue, Domain, Error as FabricError, RemoteRegion};
use orion_format::{PoolKind, Superblock, SUPERBLOCK_SIZE};
use orion_manager::{Manager, Primary};
use orion_pmem::{ModeChoice, Pool};
use orion_progress::{Progress, Unit};
use orion_proto::channel::USER_WR_BASE;
use orion_proto::{Channel, Event, MdsToMirror, Message, MirrorToMds, Reply, ReplyBody};
use tracing::{debug, info, warn};

use crate::primary::PrimaryRole;
use crate::replies::ReplyTable;
use crate::MdsConfig;

/// What the mirror needs to know.
pub(crate) struct Follower<'a> {
    pub cfg: &'a MdsConfig,
    pub domain: &'a Domain,
    /// This MDS's name for the manager, and where it listens.
    pub name: &'a str,
    pub addr: &'a str,
    pub lease: Duration,
    pub stop: &'a AtomicBool,
    /// Connections of clients that came to this MDS while it mirrors.
    pub incoming: &'a mpsc::Receiver<Channel>,
}

/// Bytes copied per one-sided read.
const COPY_CHUNK: usize = 1 << 20;

impl Follower<'_> {
    /// Mirrors whichever MDS is primary until this one takes the role (`Some`) or is
    /// stopped (`None`).
    /// `replies` are those this MDS remembered as primary, if it was (they stand until
    /// it mirrors another).
    pub(crate) fn until_primary(
        &self,
        mut manager: Option<Box<dyn Manager>>,
        mut replies: ReplyTable,
    ) -> Result<Option<(PrimaryRole, ReplyTable)>> {
        let mode: ModeChoice = self.cfg.pool_mode.parse().map_err(anyhow::Error::msg)?;
        let cq = self.domain.completion_queue()?;
        cq.look_at_peers_every(orion_fabric::DAEMON_PEER_LOOKS);
        let mut said = None;
        let mut last_failure: Option<String> = None;
        loop {
            self.turn_clients_away();
            if self.stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
            self.drain_ring(mode, &mut replies)?;
            if self.pool_whole() {
                match PrimaryRole::try_take(&mut manager, self.name, self.addr, self.lease) {
                    Ok(Some(role)) => return Ok(Some((role, replies))),
                    Ok(None) => {}
                    Err(e) => warn!("asking the cluster manager for the primary role: {e:#}"),
                }
            }
            let m = manager.as_mut().expect("kept until the role is taken");
            let primary = match m.primary() {
                Ok(p) => p.filter(|p| p.name != self.name),
                Err(e) => {
                    warn!("asking the cluster manager who is primary: {e:#}");
                    None
                }
            };
            let Some(p) = primary else {
                if said.is_none() {
                    info!("waiting for the primary role: no MDS holds it");
                    said = Some(0);
                }
                std::thread::sleep(self.lease / 10);
                continue;
            };
            if said != Some(p.epoch) {
                info!(
                    "waiting for the primary role: {} at {} (epoch {}) holds it; mirroring it",
                    p.name, p.addr, p.epoch
                );
                said = Some(p.epoch);
            }
            match self.mirror(&cq, &p, mode, m.as_mut(), &mut replies) {
                Ok(Ended::PrimaryGone(why)) => {
                    info!("stopped mirroring {}: {why}", p.name);
                    // Its process is gone (its connection reports so): a mirror in sync
                    // ends its term at once rather than wait out the lease, if the
                    // manager still lists it (a primary that dropped it listed itself
                    // alone first). Even if it lives on, it can acknowledge nothing this
                    // mirror lacks. What it left in the ring is applied first.
                    self.drain_ring(mode, &mut replies)?;
                    if self.pool_whole() {
                        match m.end_term(p.epoch, self.name) {
                            Ok(true) => info!(
                                "ended the term of {} (epoch {}) rather than wait for its \
                                 lease",
                                p.name, p.epoch
                            ),
                            Ok(false) => {}
                            Err(e) => warn!("ending the term of {}: {e:#}", p.name),
                        }
                    }
                }
                Ok(Ended::Other(why)) => info!("stopped mirroring {}: {why}", p.name),
                Err(e) => {
                    // Said once per reason: while a dead primary's lease runs out every
                    // attempt fails the same way, every tenth of the lease.
                    let why = format!("{e:#}");
                    if last_failure.as_deref() != Some(why.as_str()) {
                        warn!("mirroring {} at {}: {why}", p.name, p.addr);
                        last_failure = Some(why);
                    }
                    std::thread::sleep(self.lease / 10);
                }
            }
        }
    }

    fn marker(&self) -> std::path::PathBuf {
        copy_marker(&self.cfg.pool)
    }

    /// Whether this MDS's pool is a whole MDS pool (not absent, not being copied).
    fn pool_whole(&self) -> bool {
        !self.marker().exists() && pool_cluster(&self.cfg.pool).is_some()
    }

    fn turn_clients_away(&self) {
        while let Ok(ch) = self.incoming.try_recv() {
            debug!(
                "turned away {}: this MDS is not the primary",
                ch.conn.peer()
            );
            ch.conn.close();
        }
    }

    /// Mirrors the primary `p` until the connection ends or `p`'s lease lapses.
    fn mirror(
        &self,
        cq: &CompletionQueue,
        p: &Primary,
        mode: ModeChoice,
        manager: &mut dyn Manager,
        replies: &mut ReplyTable,
    ) -> Result<Ended> {
        let timeout = (self.lease / 2).max(Duration::from_millis(500));
        let conn = self
            .domain
            .connect_within(&p.addr, cq, timeout)
            .with_context(|| format!("connecting to {}", p.addr))?;
        let mut ch = Channel::new(self.domain, conn)?;
        let hello = MirrorToMds::Hello {
            name: self.name.to_string(),
            addr: self.addr.to_string(),
            cluster_uuid: pool_cluster(&self.cfg.pool).unwrap_or([0; 16]),
        };
        let mut other = Vec::new();
        let (epoch, region) = match ch.call(cq, 1, &hello, Duration::from_secs(30), &mut other)? {
            Reply::Ok(ReplyBody::MirrorStart { epoch, pool, .. }) => (epoch, pool),
            Reply::Err { message, .. } => {
                warn!("{} refuses this MDS as its mirror: {message}", p.name);
                bail!("refused: {message}")
            }
            other => bail!("unexpected answer to the mirror's hello: {other:?}"),
        };
        orion_pmem::replace_durably(&self.marker(), b"copying\n")
            .context("marking the pool as being copied")?;
        *replies = ReplyTable::default(); // the primary sends them all once copied
        let pool = open_sized(&self.cfg.pool, region.len, mode)?;
        let ring_file = ring_path(&self.cfg.pool);
        let ring = RingReader::create(&ring_file, mode)?;
        let ring_region = self
            .domain
            .register_file(&ring_file, 0, ring.pool.len() as usize, Access::REMOTE_ALL)
            .context("registering the mirror's ring with the fabric")?;
        self.copy(cq, &ch, &region, &pool, p)?;
        ring.mark_copied()?;
        let durable_on_delivery = ring.pool.durable_on_delivery();
        ch.send_request(
            2,
            &MirrorToMds::Copied {
                ring: ring_region.remote(),
                durable_on_delivery,
            },
        )?;
        let mut applier = Applier::new(ring, &pool, replies, self.marker());
        let ended = self.follow_ring(cq, &mut ch, &mut applier, p, epoch, manager);
        // The session ends here: once the connection is closed and the ring's key
        // revoked, nothing more lands in the ring; what did is applied next
        // (`drain_ring`), before this MDS may take the role.
        ch.conn.close();
        ring_region.revoke();
        ended
    }

    /// Copies the primary's whole pool, one-sided.
    fn copy(
        &self,
        cq: &CompletionQueue,
        ch: &Channel,
        region: &RemoteRegion,
        pool: &Pool,
        p: &Primary,
    ) -> Result<()> {
        let buf = self.domain.alloc_region(COPY_CHUNK, Access::LOCAL)?;
        let mut bytes = vec![0u8; COPY_CHUNK];
        let total = region.len;
        let t0 = Instant::now();
        let mut other = Vec::new();
        let mut off = 0u64;
        let what = format!("copying the pool of {}", p.name);
        let mut progress = Progress::new(what, total, Unit::Bytes);
        while off < total {
            if self.stop.load(Ordering::Relaxed) {
                bail!("stopped");
            }
            let n = ((total - off) as usize).min(COPY_CHUNK);
            let wr = USER_WR_BASE + off / COPY_CHUNK as u64;
            ch.conn.post_read(wr, &buf, 0, region, off, n)?;
            let c = cq.wait_for(ch.conn.id(), wr, &mut other, Duration::from_secs(30))?;
            c.status.clone()?;
            other.clear(); // nothing else is under way on this connection
            buf.read(0, &mut bytes[..n])?;
            // Pages the primary never wrote stay holes here too.
            pool.write_sparse(off, &bytes[..n])?;
            pool.persist(off, n)?;
            off += n as u64;
            let secs = t0.elapsed().as_secs_f64().max(1e-6);
            progress.say(format!("{:.0} MiB/s", off as f64 / secs / (1 << 20) as f64));
            progress.set(off);
            self.turn_clients_away();
        }
        progress.finish();
        Ok(())
    }

    /// Applies what the primary writes into the ring, entry by entry, as its
    /// immediates wake this MDS (and at its looks at the manager), until the connection
    /// ends or the primary's lease is gone. A mirror whose memory needs a flush says
    /// how far it applied after each round.
    fn follow_ring(
        &self,
        cq: &CompletionQueue,
        ch: &mut Channel,
        applier: &mut Applier,
        p: &Primary,
        epoch: u64,
        manager: &mut dyn Manager,
    ) -> Result<Ended> {
        let durable_on_delivery = applier.ring.pool.durable_on_delivery();
        let mut batch = Vec::with_capacity(16);
        let mut next_check = Instant::now();
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(Ended::Other("stopping".into()));
            }
            batch.clear();
            // The primary's immediates wake the loop for work; otherwise it sleeps
            // until its next look at the manager (a fixed 20 ms woke it fifty times a
            // second while idle).
            let wait = next_check
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), Duration::from_millis(200));
            match cq.wait(&mut batch, 16, wait) {
                Ok(_) | Err(FabricError::Timeout(_)) => {}
                Err(e) => return Err(e.into()),
            }
            for c in batch.drain(..) {
                if c.conn != ch.conn.id() {
                    continue;
                }
                match ch.on_completion(&c) {
                    Event::Done => {} // an immediate: the ring has more
                    Event::Broken(e @ FabricError::PeerGone { .. }) => {
                        return Ok(Ended::PrimaryGone(format!("the connection ended ({e})")))
                    }
                    Event::Broken(e) => {
                        return Ok(Ended::Other(format!("the connection failed ({e})")))
                    }
                    Event::Message { slot, .. } => {
                        // The primary sends nothing two-sided after its first answer.
                        ch.repost(slot)?;
                        bail!("an unexpected message from the primary");
                    }
                }
            }
            if applier.apply_whole()? > 0 && !durable_on_delivery {
                let upto = applier.ring.head();
                ch.send_request(3, &MirrorToMds::Applied { upto })?;
            }
            self.turn_clients_away();
            if Instant::now() >= next_check {
                // Five looks a lease: a lapse is seen within a fifth of it (a
                // fail-over takes the lease itself first), and an idle mirror wakes
                // ten times a second with the manager's answers, not twenty.
                next_check = Instant::now() + self.lease / 5;
                match manager.primary() {
                    Ok(Some(q)) if q.epoch == epoch => {}
                    Ok(_) => {
                        let why = format!("the lease of {} (epoch {epoch}) is over", p.name);
                        return Ok(Ended::Other(why));
                    }
                    Err(e) => debug!("asking the cluster manager who is primary: {e:#}"),
                }
            }
        }
    }

    /// Applies what a mirroring session left in the ring (it ended, or this process
    /// died in it), then removes the ring: called before this MDS may take the role,
    /// and before it mirrors anew. A ring whose entries cannot be applied leaves the
    /// pool marked torn (it is copied again; this MDS never takes over with it).
    fn drain_ring(&self, mode: ModeChoice, replies: &mut ReplyTable) -> Result<()> {
        let path = ring_path(&self.cfg.pool);
        if !path.exists() {
            return Ok(());
        }
        let applied = RingReader::open(&path, mode).and_then(|ring| {
            let Some(ring) = ring else {
                return Ok(0);
            };
            if !ring.copied()? || pool_cluster(&self.cfg.pool).is_none() {
                return Ok(0); // the copy it continued never completed: nothing to apply
            }
            let pool = Pool::open(&self.cfg.pool, mode)
                .map(Pool::growing)
                .with_context(|| format!("opening MDS pool {}", self.cfg.pool.display()))?;
            Applier::new(ring, &pool, replies, self.marker()).apply_whole()
        });
        match applied {
            Ok(0) => {}
            Ok(n) => info!("applied {n} turns the primary left in the ring"),
            Err(e) => {
                warn!("the ring cannot be applied ({e:#}): this MDS copies the pool again");
                orion_pmem::replace_durably(&self.marker(), b"copying\n")
                    .context("marking the pool as torn")?;
            }
        }
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))
    }
}

/// The file beside an MDS pool that says a mirror is copying its primary's pool into
/// it: until the copy and its first turn are applied, the pool is not whole (never
/// served from, copied again at the next start, and not a file system fsck can read).
pub fn copy_marker(pool: &std::path::Path) -> std::path::PathBuf {
    pool.with_extension("copying")
}

/// Applies ring entries to the mirror's pool in order, a whole turn of the primary
/// at a time: a turn's remembered replies come after its records, and a mirror that
/// took over with the records of a turn but not its replies would answer "unknown" to
/// a client whose request did apply, which then runs it again (an exclusive create
/// would find its own file). While the copied pool is being completed (the first
/// turn, what the primary persisted during the copy, which may outgrow the ring) the
/// entries apply one by one: the mirror may not take over before it is whole.
struct Applier<'a> {
    ring: RingReader,
    pool: &'a Pool,
    replies: &'a mut ReplyTable,
    marker: PathBuf,
    /// The pool is whole (no copy marker).
    whole: bool,
    expect: Option<u64>,
    entry: Vec<u8>,
}

impl<'a> Applier<'a> {
    fn new(
        ring: RingReader,
        pool: &'a Pool,
        replies: &'a mut ReplyTable,
        marker: PathBuf,
    ) -> Applier<'a> {
        Applier {
            ring,
            pool,
            replies,
            whole: !marker.exists(),
            marker,
            expect: None,
            entry: Vec::new(),
        }
    }

    /// Applies every whole turn (or entry, while the pool is not whole) from the
    /// head; returns how many.
    fn apply_whole(&mut self) -> Result<usize> {
        let mut n = 0;
        let mut turn = Vec::new();
        loop {
            turn.clear();
            let mut pos = self.ring.head();
            let end = loop {
                let Some(next) = self.ring.peek_at(pos, &mut self.entry)? else {
                    break None;
                };
                let (_, entry) = MdsToMirror::decode(&self.entry)
                    .map_err(|e| anyhow!("a malformed entry in the ring: {e}"))?;
                let MdsToMirror::Apply { last, .. } = entry;
                turn.push(entry);
                pos = next;
                if last || !self.whole {
                    break Some(next);
                }
            };
            let Some(end) = end else {
                return Ok(n);
            };
            for entry in turn.drain(..) {
                self.apply(entry)?;
            }
            self.ring.advance(end)?;
            n += 1;
        }
    }

    fn apply(&mut self, entry: MdsToMirror) -> Result<()> {
        let MdsToMirror::Apply {
            seq,
            records,
            replies,
            last,
        } = entry;
        if let Some(e) = self.expect.filter(|e| *e != seq) {
            bail!("entry {e} of the primary is missing from the ring (got {seq})");
        }
        self.expect = Some(
            seq.checked_add(1)
                .ok_or_else(|| anyhow!("entry {seq} of the primary is the last there can be"))?,
        );
        self.pool.apply_records(&records)?;
        self.replies.apply(&replies).map_err(anyhow::Error::msg)?;
        if last && !self.whole && self.ring.copied()? {
            // The copy followed by the primary's first turn (what it persisted while
            // the mirror copied) is a state its media passed through: from now on a
            // crash leaves a whole pool.
            std::fs::remove_file(&self.marker).context("removing the copy marker")?;
            self.whole = true;
        }
        Ok(())
    }
}

/// Why mirroring a primary ended.
enum Ended {
    /// Its connection reports its process gone.
    PrimaryGone(String),
    Other(String),
}

/// The cluster of the MDS pool at `path`, if it is one.
pub(crate) fn pool_cluster(path: &Path) -> Option<[u8; 16]> {
    use std::io::Read;
    let mut head = vec![0u8; SUPERBLOCK_SIZE];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    match Superblock::decode(&head) {
        Ok(sb) if sb.kind == PoolKind::Metadata => Some(sb.cluster_uuid),
        _ => None,
    }
}

/// The pool at `path`, `len` bytes long (created, or made again at that size).
fn open_sized(path: &Path, len: u64, mode: ModeChoice) -> Result<Pool> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let same = std::fs::metadata(path).is_ok_and(|m| m.len() == len);
    // Growing, as the primary's: the copy leaves holes where it finds pages empty
    // in chunks it has not allocated.
    let pool = match same {
        true => Pool::open(path, mode).map(Pool::growing),
        false => Pool::create_growing(path, len, mode),
    };
    pool.with_context(|| format!("the mirror's pool {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{Frames, RingWriter};
    use orion_fabric::RemoteRegion;
    use orion_pmem::tap::push_record;
    use orion_pmem::Mode;

    fn entry(seq: u64, off: u64, byte: u8, last: bool) -> Vec<u8> {
        let mut records = Vec::new();
        push_record(&mut records, off, &[byte; 64]);
        let mut b = Vec::new();
        MdsToMirror::Apply {
            seq,
            records,
            replies: Vec::new(),
            last,
        }
        .encode(&mut b, 0);
        b
    }

    #[test]
    fn a_whole_pool_applies_a_turn_only_once_all_of_it_is_in_the_ring() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let mode = ModeChoice::Force(Mode::Volatile);
        let pool_path = dir.path().join("m.pool");
        let pool = Pool::create(&pool_path, 1 << 20, mode).unwrap();
        let ring = RingReader::create(&ring_path(&pool_path), mode).unwrap();
        ring.mark_copied().unwrap();
        let ring_pool = Pool::open(&ring_path(&pool_path), mode).unwrap();
        let mut w = RingWriter::new(RemoteRegion {
            key: 1,
            addr: 0,
            len: ring_pool.len(),
        })
        .unwrap();
        let mut replies = ReplyTable::default();
        let mut a = Applier::new(ring, &pool, &mut replies, copy_marker(&pool_path));
        assert!(a.whole, "no copy marker: the pool is whole");
        // A turn of two entries, of which only the first has landed.
        let deliver = |out: &Frames| {
            for (off, range) in &out.writes {
                ring_pool.write(*off, &out.bytes[range.clone()]).unwrap();
            }
        };
        let mut first = Frames::new(1 << 20);
        w.frame(&entry(1, 4096, 0xaa, false), &mut first).unwrap();
        let mut out = Frames::new(1 << 20);
        w.frame(&entry(2, 8192, 0xbb, true), &mut out).unwrap();
        deliver(&first);
        assert_eq!(a.apply_whole().unwrap(), 0, "half a turn is not applied");
        assert_eq!(pool.read_vec(4096, 64).unwrap(), vec![0u8; 64]);
        deliver(&out);
        assert_eq!(a.apply_whole().unwrap(), 1);
        assert_eq!(pool.read_vec(4096, 64).unwrap(), vec![0xaau8; 64]);
        assert_eq!(pool.read_vec(8192, 64).unwrap(), vec![0xbbu8; 64]);
        assert_eq!(a.ring.head(), w.tail());
        // While the pool is not whole (the first turn after a copy), entries apply one
        // by one: that turn may outgrow the ring.
        a.whole = false;
        let mut out = Frames::new(1 << 20);
        w.frame(&entry(3, 12288, 0xcc, false), &mut out).unwrap();
        deliver(&out);
        assert_eq!(a.apply_whole().unwrap(), 1);
        assert_eq!(pool.read_vec(12288, 64).unwrap(), vec![0xccu8; 64]);
        // An entry out of order is refused.
        let mut out = Frames::new(1 << 20);
        w.frame(&entry(9, 0, 1, true), &mut out).unwrap();
        deliver(&out);
        assert!(a.apply_whole().is_err());
    }
}
