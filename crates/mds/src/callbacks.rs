//! Callbacks that keep clients' kernel caches true (design note 56; Assise's leases,
//! NFSv4's delegations and Ceph's capabilities are the models).
//!
//! A client whose kernel caches names and attributes (a FUSE mount) opens a callback
//! connection and holds a *cache lease* on it, renewed every third of its length
//! while it is used (an idle client lets it run out: nothing waits for it then). It
//! *watches* the inodes whose attributes or names its kernel holds: by asking
//! (`Watch`, before it reads what it hands the kernel) or by changing them itself.
//! Every committed change the engine reports ([`orion_meta::Changed`]) becomes
//! invalidations for the other instances that watch the inode, and the reply to the
//! request that made it waits until each of them answered, or its lease ran out. So a
//! change is in no other kernel's cache once its author hears of it.
//!
//! The rules that make that hold when something fails:
//! - A client hands the kernel nothing that outlives its lease, which starts when it
//!   sent the renewal (before the MDS's start of it): a client the MDS stops waiting
//!   for has nothing cached any more.
//! - One thread of the client reads its callbacks and sends its renewals, in order:
//!   a renewal that arrives while an invalidation is unanswered was sent before the
//!   client read it, and none sent after can arrive before the answer. So a lease
//!   grows at most once past an unanswered invalidation, and the MDS waits for the
//!   answer or the end of the lease as it stands.
//! - An instance whose callback connection breaks may have cached inodes the MDS no
//!   longer knows of: every change waits until its lease has run out (one that ends
//!   its lease, unmounting, does not hold anything up). So does every
//!   change in an MDS's first lease after it starts (a restart, or a fail-over: the
//!   MDS before it granted leases it does not know).
//! - Two clients that change the same directory at once may each hold a kernel lock
//!   the other's invalidation needs. An instance that itself waits for answers is
//!   waited for [`BUSY_PATIENCE`] only: a cycle costs that long, not a lease.
//!
//! A watch of a file (anything but a directory) is a grant recalled once, as NFSv4
//! recalls a delegation: the first change by another client sends it a
//! [`Invalidation::Recall`], and the watch ends when the client answers. Until then,
//! further changes to the file wait for that same answer (none is acknowledged while
//! the client may still show what came before); after it, they call nobody back. The
//! client forgets the watch before it drops the kernel's copy, so whatever it hands
//! its kernel of the file later is read after a new `Watch`, which cancels a recall
//! still under way. So one client that writes a file another client looked at once
//! pays for one callback, not one per write. A directory's watch stays: the names
//! under it the kernel holds are called back one by one (`Invalidation::Entry`), and
//! nothing tells the MDS which of them the kernel still holds.

use orion_meta::FastMap;
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use orion_fabric::ConnId;
use orion_meta::{Changed, FsError, FsResult};
use orion_proto::{Invalidation, MdsToClient, Reply, MAX_INVALIDATIONS};
use tracing::warn;

use crate::server::Mds;

/// How long an instance that waits for answers itself is waited for.
pub const BUSY_PATIENCE: Duration = Duration::from_millis(5);
/// Invalidation messages in flight to one instance (a channel has 8 send buffers;
/// the lease's renewal replies need one).
const MAX_IN_FLIGHT: usize = 6;
/// Most bytes of names one invalidation message carries (a message holds 64 KiB).
const MAX_BATCH_BYTES: usize = 48 * 1024;
/// Most inodes one instance watches (a bound on what one client makes the MDS keep).
pub const MAX_WATCHES: usize = 1 << 22;

struct Holder {
    conn: ConnId,
    lease_until: Instant,
    watches: HashSet<u64>,
    /// Invalidations not sent yet, in batches of one message each: id, items, bytes.
    queued: Vec<(u64, Vec<Invalidation>, usize)>,
    /// Sent and not answered: id → when sent.
    in_flight: BTreeMap<u64, Instant>,
    /// Whether its kernel keeps files' data too: then its watches of files are never
    /// recalled (it may read pages in again without a getattr, so nothing would
    /// watch them).
    keep_watches: bool,
    /// Files whose watch a callback recalls: ino → that callback's id. The watch ends
    /// when it is answered, unless a `Watch` (or a change of the instance's own)
    /// renewed it meanwhile.
    recalls: FastMap<u64, u64>,
}

impl Holder {
    /// Whether callback `id` is queued or in flight (not answered yet).
    fn pending(&self, id: u64) -> bool {
        self.in_flight.contains_key(&id) || self.queued.iter().any(|(q, ..)| *q == id)
    }
}

/// A reply that waits for answers to callbacks (and for the quiet time).
pub(crate) struct Held {
    pub conn: ConnId,
    pub id: u64,
    pub reply: Reply,
    changer: Option<u64>,
    /// The request's client nonce and id, if it changed state: a retry of it on a
    /// new connection (`Outcome`) waits as it does.
    origin: Option<(u64, u64)>,
    /// (instance, callback id) answers it waits for.
    waits: Vec<(u64, u64)>,
}

pub(crate) struct Callbacks {
    lease: Duration,
    /// No change is acknowledged before this (see the module's rules).
    quiet_until: Instant,
    holders: FastMap<u64, Holder>,
    by_conn: FastMap<ConnId, u64>,
    /// Inode → the instances that watch it.
    watchers: FastMap<u64, Vec<u64>>,
    held: Vec<Held>,
    next_id: u64,
}

impl Callbacks {
    pub fn new(lease: Duration, now: Instant) -> Callbacks {
        Callbacks {
            lease,
            quiet_until: now + lease,
            holders: FastMap::default(),
            by_conn: FastMap::default(),
            watchers: FastMap::default(),
            held: Vec::new(),
            next_id: 1,
        }
    }

    /// `CacheLease` from `instance` on `conn`: makes `conn` its callback connection
    /// (a new one replaces the old, whose watches go) and grants or renews the lease;
    /// with `keep_watches`, its files' watches are not recalled. Returns the lease in
    /// milliseconds.
    pub fn lease(&mut self, instance: u64, conn: ConnId, keep_watches: bool, now: Instant) -> u32 {
        if self.holders.get(&instance).is_some_and(|h| h.conn != conn) {
            let old = self.holders[&instance].conn;
            self.departed(old);
        }
        // One instance per connection: a hello under another instance departs the
        // old one first (`Mds::client_hello`).
        debug_assert!(
            self.by_conn.get(&conn).is_none_or(|i| *i == instance),
            "a callback connection serves one instance"
        );
        let h = self.holders.entry(instance).or_insert_with(|| Holder {
            conn,
            lease_until: now,
            watches: HashSet::new(),
            queued: Vec::new(),
            in_flight: BTreeMap::new(),
            keep_watches,
            recalls: FastMap::default(),
        });
        // One on another connection was departed above.
        assert_eq!(h.conn, conn, "the lease is on the callback connection");
        // Said again at each renewal (it does not change for an instance).
        h.keep_watches = keep_watches;
        self.by_conn.insert(conn, instance);
        // Granted even with invalidations unanswered (see the module's rules); the
        // lease only grows.
        h.lease_until = h.lease_until.max(now + self.lease);
        self.lease.as_millis().min(u32::MAX as u128) as u32
    }

    /// The instance on `conn` ends its lease (its kernel cache is gone: unmounted):
    /// nothing waits for it any more, not even for its lease to run out.
    pub fn end_lease(&mut self, conn: ConnId) {
        let quiet = self.quiet_until;
        self.departed(conn);
        self.quiet_until = quiet;
    }

    /// Adds watches of `instance`, which must hold a callback connection; more than
    /// [`MAX_WATCHES`] new ones are refused (a `Watch` request's error).
    pub fn watch(&mut self, instance: u64, inos: &[u64]) -> FsResult<()> {
        let Some(h) = self.holders.get(&instance) else {
            return Err(FsError::Errno(libc::ENOTCONN));
        };
        let new = inos.iter().filter(|i| !h.watches.contains(i)).count();
        if h.watches.len() + new > MAX_WATCHES {
            return Err(FsError::Io(format!(
                "more than {MAX_WATCHES} inodes watched by one client"
            )));
        }
        self.watch_anyway(instance, inos);
        Ok(())
    }

    /// Adds watches of `instance` whatever their number: those of the inodes its own
    /// changes touched (its kernel holds them now; refusing would leave them cached
    /// unwatched).
    fn watch_anyway(&mut self, instance: u64, inos: &[u64]) {
        let Some(h) = self.holders.get_mut(&instance) else {
            return;
        };
        for &ino in inos {
            // Watched anew: a recall under way no longer ends the watch.
            h.recalls.remove(&ino);
            if h.watches.insert(ino) {
                self.watchers.entry(ino).or_default().push(instance);
            }
        }
    }

    /// Ends watches of `instance` (its kernel forgot those inodes).
    pub fn unwatch(&mut self, instance: u64, inos: &[u64]) {
        let Some(h) = self.holders.get_mut(&instance) else {
            return;
        };
        for i in inos {
            h.recalls.remove(i);
        }
        let gone = inos.iter().copied().filter(|i| h.watches.remove(i));
        drop_watchers(&mut self.watchers, instance, gone);
    }

    /// Turns committed changes into queued invalidations for the instances that
    /// watch them, except `changer` (whose own kernel knows; it watches them from now
    /// on). Returns the answers a reply must wait for.
    pub fn on_changes(&mut self, changer: Option<u64>, changes: &[Changed]) -> Vec<(u64, u64)> {
        let mut waits = Vec::new();
        for c in changes {
            let Some(ws) = self.watchers.get(&c.ino) else {
                continue;
            };
            for &w in ws.iter().filter(|w| Some(**w) != changer) {
                let h = self.holders.get_mut(&w).expect("watchers hold callbacks");
                debug_assert!(h.watches.contains(&c.ino), "a watcher watches the inode");
                if !c.dir && !h.keep_watches {
                    // A file: recalled once; later changes wait for that answer.
                    let id = match h.recalls.get(&c.ino) {
                        Some(&id) => id,
                        None => {
                            let id = queue(h, Invalidation::Recall(c.ino), &mut self.next_id);
                            h.recalls.insert(c.ino, id);
                            id
                        }
                    };
                    debug_assert!(h.pending(id), "a recall under way is queued or in flight");
                    if !waits.contains(&(w, id)) {
                        waits.push((w, id));
                    }
                    continue;
                }
                let items =
                    std::iter::once(Invalidation::Inode(c.ino)).chain(c.removed.iter().map(|n| {
                        Invalidation::Entry {
                            parent: c.ino,
                            name: n.clone(),
                        }
                    }));
                for it in items {
                    let id = queue(h, it, &mut self.next_id);
                    if !waits.contains(&(w, id)) {
                        waits.push((w, id));
                    }
                }
            }
        }
        if let Some(me) = changer.filter(|m| self.holders.contains_key(m)) {
            let inos: Vec<u64> = changes.iter().map(|c| c.ino).collect();
            self.watch_anyway(me, &inos);
        }
        waits
    }

    /// Holds `reply` until its waits are answered and the quiet time is over; returns
    /// it when it may leave now.
    pub fn hold(
        &mut self,
        (conn, id, reply): (ConnId, u64, Reply),
        (changer, origin): (Option<u64>, Option<(u64, u64)>),
        waits: Vec<(u64, u64)>,
        now: Instant,
    ) -> Option<(ConnId, u64, Reply)> {
        if waits.is_empty() && now >= self.quiet_until {
            return Some((conn, id, reply));
        }
        self.held.push(Held {
            conn,
            id,
            reply,
            changer,
            origin,
            waits,
        });
        None
    }

    /// What a reply to request `id` of the client with `nonce` still waits for, if
    /// it is held (its connection may have broken since).
    pub fn waits_of(&self, nonce: u64, id: u64) -> Vec<(u64, u64)> {
        self.held
            .iter()
            .filter(|h| h.origin == Some((nonce, id)))
            .flat_map(|h| h.waits.iter().copied())
            .collect()
    }

    /// The invalidation messages to send now: what is queued for each instance, as
    /// far as its room in flight goes. The second list: callback connections to close,
    /// of instances whose lease ran out and who left a callback unanswered for a
    /// lease (stuck: what is queued for them would only grow; they lose their caching
    /// rights).
    pub fn take_outgoing(
        &mut self,
        now: Instant,
    ) -> (Vec<(ConnId, u64, MdsToClient)>, Vec<ConnId>) {
        let (mut out, mut cut) = (Vec::new(), Vec::new());
        let lease = self.lease;
        for h in self.holders.values_mut() {
            // A lease that ran out is no fault (an idle client lets it lapse and still
            // answers): stuck is a callback unanswered for a lease past that.
            let oldest = h.in_flight.values().next();
            if h.lease_until <= now && oldest.is_some_and(|&sent| now >= sent + lease) {
                cut.push(h.conn);
                continue;
            }
            // Every recall under way is queued or in flight (it waits for that answer).
            debug_assert!(h.recalls.values().all(|&id| h.pending(id)));
            while h.in_flight.len() < MAX_IN_FLIGHT && !h.queued.is_empty() {
                let (id, items, _) = h.queued.remove(0);
                // Ids grow as batches are queued (`queue`, which fills one to a message at
                // most), and go out in that order.
                debug_assert!(h.in_flight.last_key_value().is_none_or(|(&l, _)| l < id));
                debug_assert!((1..=MAX_INVALIDATIONS).contains(&items.len()));
                h.in_flight.insert(id, now);
                out.push((h.conn, id, MdsToClient::Invalidate { items }));
            }
        }
        (out, cut)
    }

    /// The answer to callback `id` on `conn`; false if `conn` is no callback
    /// connection. The files it recalled are no longer watched, except those
    /// `held_open(instance, ino)` says the instance holds open: an open file may be
    /// mapped, and the kernel reads mapped pages in without a getattr that would
    /// watch the file again (the mount asks for the watch at open, after its open
    /// table says it holds the file).
    pub fn answered(
        &mut self,
        conn: ConnId,
        id: u64,
        held_open: impl Fn(u64, u64) -> bool,
    ) -> bool {
        let Some(&instance) = self.by_conn.get(&conn) else {
            return false;
        };
        let Some(h) = self.holders.get_mut(&instance) else {
            return false;
        };
        h.in_flight.remove(&id);
        if h.recalls.is_empty() {
            return true;
        }
        // The files this callback recalled are no longer watched.
        let mut ended = Vec::new();
        h.recalls.retain(|&ino, &mut rid| {
            let done = rid == id;
            if done && !held_open(instance, ino) {
                ended.push(ino);
            }
            !done
        });
        let gone = ended.into_iter().filter(|i| h.watches.remove(i));
        drop_watchers(&mut self.watchers, instance, gone);
        true
    }

    /// `conn` closed: if it was a callback connection, its instance's watches go, and
    /// every change waits until its lease has run out.
    pub fn departed(&mut self, conn: ConnId) {
        let Some(instance) = self.by_conn.remove(&conn) else {
            return;
        };
        let Some(h) = self.holders.remove(&instance) else {
            return;
        };
        debug_assert_eq!(h.conn, conn, "by_conn names another connection");
        self.quiet_until = self.quiet_until.max(h.lease_until);
        drop_watchers(&mut self.watchers, instance, h.watches);
    }

    /// Replies whose waits are over, in the order they were held.
    pub fn release(&mut self, now: Instant) -> Vec<Held> {
        if self.held.is_empty() {
            return Vec::new();
        }
        let waiting: HashSet<u64> = self.held.iter().filter_map(|h| h.changer).collect();
        let holders = &self.holders;
        let over = |&(w, id): &(u64, u64)| match holders.get(&w) {
            // Gone: the quiet time covers its lease.
            None => true,
            Some(h) if h.lease_until <= now => true,
            Some(h) => match h.in_flight.get(&id) {
                Some(sent) => waiting.contains(&w) && now >= *sent + BUSY_PATIENCE,
                None => h.queued.iter().all(|(q, ..)| *q != id),
            },
        };
        let quiet = now >= self.quiet_until;
        let (done, kept): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| quiet && h.waits.iter().all(over));
        self.held = kept;
        done
    }

    /// Whether replies wait (the event loop then looks again soon).
    pub fn holds_replies(&self) -> bool {
        !self.held.is_empty()
    }

    /// How many replies wait for answers (or for the quiet time).
    pub fn held_count(&self) -> usize {
        self.held.len()
    }
}

/// Takes `instance` off the watcher lists of `inos`.
fn drop_watchers(
    watchers: &mut FastMap<u64, Vec<u64>>,
    instance: u64,
    inos: impl IntoIterator<Item = u64>,
) {
    for ino in inos {
        if let Some(ws) = watchers.get_mut(&ino) {
            ws.retain(|w| *w != instance);
            if ws.is_empty() {
                watchers.remove(&ino);
            }
        }
    }
}

/// Adds `it` to `h`'s last queued batch if it is not there and the batch has room,
/// else to a new batch; returns the batch's id.
fn queue(h: &mut Holder, it: Invalidation, next_id: &mut u64) -> u64 {
    let bytes = 16
        + match &it {
            Invalidation::Entry { name, .. } => name.len(),
            Invalidation::Inode(_) | Invalidation::Recall(_) => 0,
        };
    if let Some((id, items, size)) = h.queued.last_mut() {
        if items.contains(&it) {
            return *id;
        }
        if items.len() < MAX_INVALIDATIONS && *size + bytes <= MAX_BATCH_BYTES {
            items.push(it);
            *size += bytes;
            return *id;
        }
    }
    *next_id += 1;
    h.queued.push((*next_id, vec![it], bytes));
    *next_id
}

impl Mds {
    /// What the loop does for callbacks each turn: invalidations for changes no reply
    /// carried (a departed client's orphans), queued invalidations out, and replies
    /// whose waits are over.
    pub(crate) fn callbacks_turn(&mut self) {
        self.changes_of_no_request();
        let now = Instant::now();
        let (msgs, cut) = self.callbacks.take_outgoing(now);
        for conn in cut {
            self.drop_peer(conn, "a callback unanswered for a lease past its lease");
        }
        for (conn, id, m) in msgs {
            let Some(peer) = self.peers.get_mut(&conn) else {
                continue;
            };
            match peer.ch.send_request(id, &m) {
                Ok(()) => self.cfg.counters.callbacks_sent(1),
                Err(e) => {
                    warn!("callback to {}: {e}", peer.name);
                    self.drop_peer(conn, &format!("cannot send a callback: {e}"));
                }
            }
        }
        for h in self.callbacks.release(now) {
            self.reply_now(h.conn, h.id, h.reply);
        }
    }

    /// A reply about to leave: if the request changed what other clients' kernels
    /// cache, it waits for their answers (see the module). None when held.
    pub(crate) fn hold_for_callbacks(
        &mut self,
        conn: ConnId,
        id: u64,
        reply: Reply,
    ) -> Option<(ConnId, u64, Reply)> {
        let changes = self.engine.take_changes();
        if changes.is_empty() {
            return Some((conn, id, reply));
        }
        let peer = self.peers.get(&conn);
        let changer = peer.and_then(|p| p.instance());
        let origin = peer.and_then(|p| p.nonce()).map(|n| (n, id));
        let waits = self.callbacks.on_changes(changer, &changes);
        self.callbacks
            .hold((conn, id, reply), (changer, origin), waits, Instant::now())
    }

    /// The answer to `Outcome`: a remembered reply waits as the first answer did (for
    /// the callbacks of the change, and for the quiet time of a new MDS).
    pub(crate) fn outcome_reply(
        &mut self,
        conn: ConnId,
        id: u64,
        nonce: u64,
        asked: u64,
        reply: Reply,
    ) -> Option<Reply> {
        let waits = self.callbacks.waits_of(nonce, asked);
        let r = self
            .callbacks
            .hold((conn, id, reply), (None, None), waits, Instant::now());
        r.map(|(_, _, reply)| reply)
    }

    /// Changes made outside any request (orphans destroyed once closed): called
    /// back, charged to no reply.
    pub(crate) fn changes_of_no_request(&mut self) {
        let changes = self.engine.take_changes();
        if !changes.is_empty() {
            self.callbacks.on_changes(None, &changes);
        }
    }
}

#[cfg(test)]
mod tests;
