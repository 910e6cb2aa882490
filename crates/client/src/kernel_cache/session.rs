//! The callback thread of a client with a kernel cache: its connection to the MDS
//! (reconnected as long as the client lives), its cache lease's renewals, the
//! invalidations it answers, and the open files it watches again on a new
//! connection (see the parent module's text).

use super::*;

/// The callback thread: keeps a callback connection (reconnecting as long as the
/// client lives), its lease, and answers invalidations.
pub(crate) fn callback_loop(
    cfg: ClientConfig,
    domain: Domain,
    instance: u64,
    kc: Arc<KernelCache>,
    files_open: FilesOpen,
) {
    let addrs = orion_proto::mds_addresses(&cfg.mds);
    // As a lane's reconnection (`Remote::reconnect`): a vanished host costs a second.
    let mut patience = Patience::new(addrs.len());
    let mut at = 0;
    while !kc.stop.load(Ordering::Acquire) {
        kc.new_session();
        let k = at % addrs.len().max(1);
        let addr = &addrs[k];
        at += 1;
        let r = session(
            &cfg,
            &domain,
            (addr, k),
            &mut patience,
            instance,
            &kc,
            &files_open,
        );
        kc.set_connected(false);
        match r {
            Ok(()) => {}
            Err(e) => {
                debug!("callback connection to {addr}: {e}");
                std::thread::sleep(RETRY_PAUSE);
            }
        }
    }
    kc.new_session();
}

/// One callback connection to `addr` (address `k` of the MDSs), until it breaks or
/// the client stops.
fn session(
    cfg: &ClientConfig,
    domain: &Domain,
    (addr, k): (&str, usize),
    patience: &mut Patience,
    instance: u64,
    kc: &KernelCache,
    files_open: &FilesOpen,
) -> Result<(), String> {
    let cq = Arc::new(domain.completion_queue().map_err(|e| e.to_string())?);
    cq.look_at_peers_every(orion_fabric::DAEMON_PEER_LOOKS);
    *lock(&kc.sleeping_on) = Some(cq.clone());
    let mut ch =
        (patience.attempt(k, |p| open_mds(domain, &cq, addr, p))).map_err(|e| e.to_string())?;
    let timeout = Duration::from_millis(cfg.op_timeout_ms);
    let hello = MdsRequest::Hello(Hello {
        internal: None,
        strong: false,
        name: format!("{} callbacks", cfg.shown_name()),
        nonce: orion_format::random_u64(),
        instance,
        host: orion_proto::this_host(),
    });
    let mut other = Vec::new();
    match ch.call(&cq, 1, &hello, timeout, &mut other) {
        Ok(Reply::Ok(ReplyBody::Hello(_))) => kc.set_connected(true),
        Ok(r) => return Err(format!("hello refused: {r:?}")),
        Err(e) => return Err(e.to_string()),
    }
    let mut next_id = 2;
    let mut renewal: Option<(u64, Instant)> = None;
    // Open files are watched again once this MDS holds a lease for us (`Rewatch`).
    let mut rewatched = false;
    let mut rewatch = Rewatch::default();
    let mut renew_at = Instant::now();
    // The first lease is taken at once: a mount is about to be used.
    kc.wanted.store(true, Ordering::Release);
    let mut lease = Duration::from_millis(200);
    let mut batch = Vec::new();
    let mut msg = Vec::new();
    let r = loop {
        if kc.stop.load(Ordering::Acquire) {
            // The kernel cache is gone with the mount: nothing need wait for this
            // lease (best effort; a lost message only makes changes wait it out).
            next_id += 1;
            let _ = ch.send_request(next_id, &MdsRequest::EndCacheLease);
            std::thread::sleep(Duration::from_millis(1));
            break Ok(());
        }
        let now = Instant::now();
        if !ch.conn.is_alive() {
            break Err("the connection closed".into());
        }
        // An MDS that leaves a renewal unanswered this long is stopped or cut off:
        // another address may serve now.
        if renewal.is_some_and(|(_, sent)| now >= sent + lease * UNANSWERED_LEASES) {
            break Err("the MDS does not answer".into());
        }
        let due = now >= renew_at || kc.wanted.load(Ordering::Acquire);
        if renewal.is_none() && due && !kc.renewal_wanted(lease, || !files_open().is_empty()) {
            // Unused for a while: the lease runs out (the module's text).
            // Looked at again at the next third, or once it ran out, when a call asks.
            renew_at = match kc.left().is_zero() {
                true => now + LONGEST_WAIT,
                false => now + lease / 3,
            };
        } else if renewal.is_none() && due {
            next_id += 1;
            let ask = MdsRequest::CacheLease {
                keep_watches: kc.keep_watches,
            };
            if let Err(e) = ch.send_request(next_id, &ask) {
                break Err(e.to_string());
            }
            renewal = Some((next_id, now));
            // Looked at again if no answer comes (the connection is then checked by
            // the wait's break).
            renew_at = now + lease;
        }
        // Asleep until the renewal is due (with one unanswered: until it is given up
        // on), a message comes, or a stop wakes the queue.
        let until = match renewal {
            Some((_, sent)) => sent + lease * UNANSWERED_LEASES,
            None => renew_at,
        };
        let wait = until
            .saturating_duration_since(now)
            .clamp(Duration::from_millis(1), LONGEST_WAIT);
        batch.clear();
        match wait_batch(&cq, &mut batch, wait) {
            Ok(()) => {}
            Err(e) => break Err(e),
        }
        let mut broken = None;
        for c in batch.drain(..) {
            match ch.on_completion(&c) {
                Event::Done => {}
                Event::Broken(e) => broken = Some(e.to_string()),
                Event::Message { slot, len } => {
                    if let Err(e) = ch.read_message(slot, len, &mut msg).and(ch.repost(slot)) {
                        broken = Some(e.to_string());
                        continue;
                    }
                    if is_reply(&msg) {
                        let Ok((id, reply)) = decode_reply(&msg) else {
                            continue;
                        };
                        if let Some(inos) = rewatch.answered(id) {
                            match reply {
                                // Watched now: what the kernel read of them before is
                                // dropped (a change meanwhile called nobody back). No
                                // `settle`: the kernel holds these inodes, and drops
                                // an attribute reply that crosses an invalidation,
                                // and a read under way holds its page locked.
                                Reply::Ok(_) => (kc.invalidate)(&inodes(&inos)),
                                // Left unwatched at this MDS until a call watches them
                                // (or the next connection: a refusal ENOTCONN means
                                // this one is being cut).
                                r => warn!("watching open files again at {addr}: {r:?}"),
                            }
                            if let Err(e) = rewatch.next(&mut ch, &mut next_id) {
                                broken = Some(e);
                            }
                            continue;
                        }
                        let Some((_, sent)) = renewal.filter(|(rid, _)| *rid == id) else {
                            continue;
                        };
                        renewal = None;
                        match reply {
                            Reply::Ok(ReplyBody::Lease { ms }) if ms > 0 => {
                                lease = Duration::from_millis(ms as u64);
                                kc.grant_lease(sent + lease);
                                renew_at = sent + lease / 3;
                                if !rewatched {
                                    rewatched = true;
                                    rewatch.start(files_open());
                                    if let Err(e) = rewatch.next(&mut ch, &mut next_id) {
                                        broken = Some(e);
                                    }
                                }
                            }
                            // No leases at this MDS (`cache_lease_ms` 0): asked again
                            // in a second, not at each call.
                            _ => {
                                kc.refused();
                                renew_at = Instant::now() + Duration::from_secs(1);
                            }
                        }
                        continue;
                    }
                    match MdsToClient::decode(&msg) {
                        Ok((id, MdsToClient::Invalidate { items })) => {
                            // Recalled watches end first: a call that starts now
                            // watches the file anew, one under way is waited for.
                            let recalled: Vec<u64> = items
                                .iter()
                                .filter_map(|it| match it {
                                    Invalidation::Recall(ino) => Some(*ino),
                                    _ => None,
                                })
                                .collect();
                            kc.recalled(&recalled);
                            kc.settle();
                            (kc.invalidate)(&items);
                            if let Err(e) = ch.send_reply(id, &Reply::Ok(ReplyBody::Empty)) {
                                broken = Some(e.to_string());
                            }
                        }
                        Err(e) => warn!("malformed callback from the MDS at {addr}: {e}"),
                    }
                }
            }
        }
        if let Some(e) = broken {
            break Err(e);
        }
    };
    ch.conn.close();
    // The next session sleeps on a queue of its own.
    *lock(&kc.sleeping_on) = None;
    r
}

/// A new callback connection: the MDS (a new one, after a restart or a fail-over,
/// or the same one after the old connection broke, which ended its watches) watches
/// the files this client holds open again, once it holds a lease for the client (a
/// `Watch` needs one there). The kernel may read their mapped pages in without a
/// call that would watch them; what it read before the watch is dropped when the
/// answer comes. Files opened from now on are watched by their open. One `Watch` is
/// in flight at a time (a channel has few send buffers, and the MDS's replies share
/// the client's receive slots with its callbacks). A file closed and forgotten
/// meanwhile may stay watched (its `Unwatch` can pass this `Watch`): a callback too
/// many, never one too few.
#[derive(Default)]
struct Rewatch {
    chunks: std::collections::VecDeque<Vec<u64>>,
    in_flight: Option<(u64, Vec<u64>)>,
}

impl Rewatch {
    fn start(&mut self, mut inos: Vec<u64>) {
        inos.sort_unstable();
        inos.dedup();
        let chunks = inos.chunks(orion_proto::MAX_WATCHED).map(|c| c.to_vec());
        self.chunks = chunks.collect();
    }

    /// Sends the next chunk if none is in flight.
    fn next(
        &mut self,
        ch: &mut orion_proto::channel::Channel,
        next_id: &mut u64,
    ) -> Result<(), String> {
        if self.in_flight.is_some() {
            return Ok(());
        }
        let Some(inos) = self.chunks.pop_front() else {
            return Ok(());
        };
        *next_id += 1;
        let req = MdsRequest::Watch { inos: inos.clone() };
        ch.send_request(*next_id, &req).map_err(|e| e.to_string())?;
        self.in_flight = Some((*next_id, inos));
        Ok(())
    }

    /// The reply to request `id`: the inodes it watched, if it was this one's.
    fn answered(&mut self, id: u64) -> Option<Vec<u64>> {
        match self.in_flight.take() {
            Some((rid, inos)) if rid == id => Some(inos),
            other => {
                self.in_flight = other;
                None
            }
        }
    }
}

fn inodes(inos: &[u64]) -> Vec<Invalidation> {
    inos.iter().map(|&i| Invalidation::Inode(i)).collect()
}

fn wait_batch(
    cq: &CompletionQueue,
    batch: &mut Vec<orion_fabric::Completion>,
    wait: Duration,
) -> Result<(), String> {
    match cq.wait(batch, 16, wait) {
        Ok(_) | Err(orion_fabric::Error::Timeout(_)) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}
