//! Advisory locks: fcntl byte ranges (and flock, as whole-file ranges) of each client's
//! lock owners. Every client asks the MDS, so locks are coherent across clients. They
//! live in DRAM: a client's locks go when its connection does (its processes are gone
//! or cut off), and all of them go with an MDS restart, as with NFS before reclaim.
//!
//! POSIX rules: a lock conflicts with another holder's overlapping lock when either is
//! a write lock; a holder's new lock or unlock replaces whatever it held on that range
//! (splitting its ranges), and its adjacent ranges of one kind merge.

use orion_meta::FastMap;

use orion_meta::{FsError, FsResult};
use orion_proto::{LockKind, LockReq};

/// Who holds a lock: a client (its connection) and a lock owner of that client.
pub type Holder = (u32, u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    holder: Holder,
    pid: u32,
    start: u64,
    end: u64,
    write: bool,
}

#[derive(Default)]
pub struct Locks {
    by_ino: FastMap<u64, Vec<Held>>,
}

fn overlaps(a: &Held, start: u64, end: u64) -> bool {
    a.start <= end && start <= a.end
}

impl Locks {
    /// The first lock of another holder that `req` conflicts with.
    pub fn conflict(&self, client: u32, req: &LockReq) -> Option<LockReq> {
        let write = req.kind == LockKind::Write;
        let held = self.by_ino.get(&req.ino)?;
        held.iter()
            .find(|h| {
                h.holder != (client, req.owner)
                    && overlaps(h, req.start, req.end)
                    && (write || h.write)
            })
            .map(|h| LockReq {
                ino: req.ino,
                owner: h.holder.1,
                pid: h.pid,
                start: h.start,
                end: h.end,
                kind: if h.write {
                    LockKind::Write
                } else {
                    LockKind::Read
                },
            })
    }

    /// Takes, changes or drops (`LockKind::Unlock`) a lock; `EAGAIN` on a conflict.
    pub fn set(&mut self, client: u32, req: &LockReq) -> FsResult<()> {
        if req.end < req.start {
            return Err(FsError::Errno(libc::EINVAL));
        }
        if req.kind != LockKind::Unlock && self.conflict(client, req).is_some() {
            return Err(FsError::Errno(libc::EAGAIN));
        }
        let holder = (client, req.owner);
        let held = self.by_ino.entry(req.ino).or_default();
        // Cut the holder's own locks out of the range.
        let mut kept = Vec::with_capacity(held.len() + 2);
        for h in held.drain(..) {
            if h.holder != holder || !overlaps(&h, req.start, req.end) {
                kept.push(h);
                continue;
            }
            if h.start < req.start {
                kept.push(Held {
                    end: req.start - 1,
                    ..h
                });
            }
            if h.end > req.end {
                kept.push(Held {
                    start: req.end + 1,
                    ..h
                });
            }
        }
        if req.kind != LockKind::Unlock {
            let mut new = Held {
                holder,
                pid: req.pid,
                start: req.start,
                end: req.end,
                write: req.kind == LockKind::Write,
            };
            // Merge with the holder's adjacent ranges of the same kind.
            kept.retain(|h| {
                let same = h.holder == holder && h.write == new.write;
                if same && h.end.checked_add(1) == Some(new.start) {
                    new.start = h.start;
                    return false;
                }
                if same && new.end.checked_add(1) == Some(h.start) {
                    new.end = h.end;
                    return false;
                }
                true
            });
            // The holder's ranges were cut out of the request's, and those merged into it
            // were its own and disjoint; the request's conflicts were refused above.
            debug_assert!(
                kept.iter().all(|h| !overlaps(h, new.start, new.end)
                    || (h.holder != holder && !h.write && !new.write)),
                "a lock overlaps its holder's ranges or conflicts with another's"
            );
            kept.push(new);
        }
        if kept.is_empty() {
            self.by_ino.remove(&req.ino);
        } else {
            *held = kept;
        }
        Ok(())
    }

    /// Drops every lock of one holder on `ino`.
    pub fn release(&mut self, client: u32, ino: u64, owner: u64) {
        if let Some(held) = self.by_ino.get_mut(&ino) {
            held.retain(|h| h.holder != (client, owner));
            if held.is_empty() {
                self.by_ino.remove(&ino);
            }
        }
    }

    /// Drops every lock of a client (it left).
    pub fn release_client(&mut self, client: u32) {
        self.by_ino.retain(|_, held| {
            held.retain(|h| h.holder.0 != client);
            !held.is_empty()
        });
    }

    /// The ranges `holder` holds on `ino`, sorted (for tests and invariants).
    pub fn held(&self, ino: u64, holder: Holder) -> Vec<(u64, u64, bool)> {
        let mut v: Vec<_> = self
            .by_ino
            .get(&ino)
            .into_iter()
            .flatten()
            .filter(|h| h.holder == holder)
            .map(|h| (h.start, h.end, h.write))
            .collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(owner: u64, start: u64, end: u64, kind: LockKind) -> LockReq {
        LockReq {
            ino: 5,
            owner,
            pid: 1,
            start,
            end,
            kind,
        }
    }

    const EAGAIN: FsResult<()> = Err(FsError::Errno(libc::EAGAIN));

    #[test]
    fn readers_share_and_writers_exclude() {
        let mut l = Locks::default();
        l.set(1, &req(1, 0, 99, LockKind::Read)).unwrap();
        l.set(2, &req(1, 50, 149, LockKind::Read)).unwrap();
        assert_eq!(l.set(3, &req(1, 0, 0, LockKind::Write)), EAGAIN);
        // A different owner of the same client conflicts too.
        assert_eq!(l.set(1, &req(2, 60, 60, LockKind::Write)), EAGAIN);
        let c = l.conflict(3, &req(1, 120, 200, LockKind::Write)).unwrap();
        assert_eq!((c.start, c.end, c.kind), (50, 149, LockKind::Read));
        // Beyond every lock, a write lock is free.
        l.set(3, &req(1, 150, u64::MAX, LockKind::Write)).unwrap();
        assert_eq!(l.set(1, &req(1, 200, 300, LockKind::Read)), EAGAIN);
    }

    #[test]
    fn a_holder_splits_converts_and_merges_its_own_ranges() {
        let mut l = Locks::default();
        l.set(1, &req(1, 0, 99, LockKind::Write)).unwrap();
        l.set(1, &req(1, 40, 59, LockKind::Unlock)).unwrap();
        assert_eq!(l.held(5, (1, 1)), vec![(0, 39, true), (60, 99, true)]);
        // Another holder fits in the hole.
        l.set(2, &req(1, 40, 59, LockKind::Write)).unwrap();
        l.set(2, &req(1, 40, 59, LockKind::Unlock)).unwrap();
        // Refilling the hole with the same kind merges all three into one.
        l.set(1, &req(1, 40, 59, LockKind::Write)).unwrap();
        assert_eq!(l.held(5, (1, 1)), vec![(0, 99, true)]);
        // Downgrading the middle splits by kind.
        l.set(1, &req(1, 10, 19, LockKind::Read)).unwrap();
        assert_eq!(
            l.held(5, (1, 1)),
            vec![(0, 9, true), (10, 19, false), (20, 99, true)]
        );
        l.set(1, &req(1, 0, u64::MAX, LockKind::Unlock)).unwrap();
        assert!(l.held(5, (1, 1)).is_empty());
        assert!(l.by_ino.is_empty(), "no empty entries left behind");
    }

    #[test]
    fn locks_go_with_their_owner_or_client() {
        let mut l = Locks::default();
        l.set(1, &req(1, 0, u64::MAX, LockKind::Write)).unwrap();
        l.set(2, &req(7, 0, 0, LockKind::Read))
            .expect_err("held by client 1");
        l.release(1, 5, 1);
        l.set(2, &req(7, 0, 0, LockKind::Read)).unwrap();
        l.release_client(2);
        assert!(l.by_ino.is_empty());
        assert_eq!(
            l.set(1, &req(1, 9, 8, LockKind::Write)),
            Err(FsError::Errno(libc::EINVAL))
        );
    }
}
