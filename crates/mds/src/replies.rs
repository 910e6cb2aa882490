//! Remembered replies: what makes a retried request happen once. The MDS keeps the
//! reply to each client's recent requests that change state, under the nonce the
//! client drew and the request's id. A client whose connection broke before the answer
//! came asks for it after reconnecting (`MdsRequest::Outcome`), or sends it again
//! under the same id (an operation that runs again after a later step broke); a
//! request applied is answered from here instead of running twice (a create that
//! would fail with EEXIST, a rename with ENOENT, an append landing twice), and one
//! not applied is run again.
//!
//! The table is part of what the mirror keeps: entries go to it in the same turn as
//! the updates they answer, applied together ([`crate::mirror`]), so after a fail-over
//! the new primary answers what the old one applied. It lives in memory: an MDS that
//! restarts alone (no mirror) forgets it, and a retried request is then run again.

use orion_meta::FastMap;
use std::collections::VecDeque;

use orion_proto::{decode_reply, encode_reply, Reply};

/// Replies remembered per client (a client has few requests in flight).
pub const PER_CLIENT: usize = 64;
/// Clients remembered (the one unheard of the longest is forgotten first).
pub const CLIENTS: usize = 4096;

/// One client's remembered replies: request id and encoded reply, oldest first.
type Remembered = VecDeque<(u64, Vec<u8>)>;

#[derive(Default)]
pub struct ReplyTable {
    /// Per client: when it last had a reply remembered (a counter), and its replies.
    by_client: FastMap<u64, (u64, Remembered)>,
    /// Counts remembered replies: the clock of `by_client`.
    uses: u64,
    /// Entries since the mirror last took them, when one is attached.
    pending: Option<Vec<u8>>,
}

impl ReplyTable {
    /// Remembers the reply to request `id` of the client `nonce`.
    pub fn remember(&mut self, nonce: u64, id: u64, reply: &Reply) {
        // Most replies are a few dozen bytes: one allocation, not a doubling series.
        let mut bytes = Vec::with_capacity(128);
        encode_reply(&mut bytes, id, reply);
        // What a retry under this id, or the mirror, is answered with.
        debug_assert_eq!(
            orion_proto::peek_id(&bytes),
            Some(id),
            "a remembered reply names another request"
        );
        if let Some(p) = &mut self.pending {
            put_entry(p, nonce, id, &bytes);
        }
        self.insert(nonce, id, bytes);
    }

    fn insert(&mut self, nonce: u64, id: u64, bytes: Vec<u8>) {
        self.uses += 1;
        let (used, q) = self.by_client.entry(nonce).or_default();
        *used = self.uses;
        if let Some(slot) = q.iter_mut().find(|(i, _)| *i == id) {
            slot.1 = bytes;
        } else {
            q.push_back((id, bytes));
            if q.len() > PER_CLIENT {
                q.pop_front();
            }
        }
        if self.by_client.len() > CLIENTS {
            // The client unheard of the longest (a scan, once per new client past the
            // bound).
            let oldest = self
                .by_client
                .iter()
                .min_by_key(|(_, (u, _))| *u)
                .map(|(n, _)| *n);
            if let Some(n) = oldest {
                self.by_client.remove(&n);
            }
        }
        // Its use is the newest (`uses` only grows): never the one forgotten.
        debug_assert!(
            self.by_client.contains_key(&nonce),
            "the client just remembered was forgotten"
        );
    }

    /// The reply to request `id` of client `nonce`, if it was applied and is remembered.
    pub fn recall(&self, nonce: u64, id: u64) -> Option<Reply> {
        let (_, q) = self.by_client.get(&nonce)?;
        let (_, bytes) = q.iter().rev().find(|(i, _)| *i == id)?;
        decode_reply(bytes).ok().map(|(_, r)| r)
    }

    /// Starts keeping new entries for a mirror that has just copied the pool, with
    /// everything remembered so far.
    pub fn for_mirror(&mut self, from_all: bool) {
        self.pending = Some(if from_all {
            self.snapshot()
        } else {
            Vec::new()
        });
    }

    pub fn stop_for_mirror(&mut self) {
        self.pending = None;
    }

    /// The entries the mirror has not had yet.
    pub fn take_pending(&mut self, out: &mut Vec<u8>) {
        out.clear();
        if let Some(p) = &mut self.pending {
            // The caller's buffer, emptied, collects the next ones.
            std::mem::swap(p, out);
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut clients: Vec<_> = self.by_client.iter().collect();
        // Oldest first, so that a mirror that applies them keeps the same order of use.
        clients.sort_by_key(|(_, (u, _))| *u);
        let mut out = Vec::new();
        for (nonce, (_, q)) in clients {
            for (id, bytes) in q {
                put_entry(&mut out, *nonce, *id, bytes);
            }
        }
        out
    }

    /// Adds entries a primary sent (a mirror's side). Malformed input is an error.
    pub fn apply(&mut self, mut blob: &[u8]) -> Result<usize, String> {
        let mut n = 0;
        while !blob.is_empty() {
            let (nonce, id, bytes, rest) = take_entry(blob).ok_or("a torn reply entry")?;
            decode_reply(bytes).map_err(|e| format!("a malformed remembered reply: {e}"))?;
            self.insert(nonce, id, bytes.to_vec());
            blob = rest;
            n += 1;
        }
        Ok(n)
    }
}

fn put_entry(out: &mut Vec<u8>, nonce: u64, id: u64, bytes: &[u8]) {
    out.extend_from_slice(&nonce.to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// One entry and what follows it.
fn take_entry(b: &[u8]) -> Option<(u64, u64, &[u8], &[u8])> {
    let nonce = u64::from_le_bytes(b.get(0..8)?.try_into().ok()?);
    let id = u64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
    let len = u32::from_le_bytes(b.get(16..20)?.try_into().ok()?) as usize;
    let end = 20usize.checked_add(len)?;
    Some((nonce, id, b.get(20..end)?, b.get(end..)?))
}

/// Splits a blob of entries into pieces of at most `max` bytes at entry boundaries (an
/// entry longer than `max` is a piece of its own).
pub fn pieces(mut blob: &[u8], max: usize) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while !blob.is_empty() {
        let mut cut = 0;
        let mut rest = blob;
        while let Some((_, _, _, r)) = take_entry(rest) {
            let next = blob.len() - r.len();
            if next > max && cut > 0 {
                break;
            }
            cut = next;
            rest = r;
            if r.is_empty() {
                break;
            }
        }
        if cut == 0 {
            cut = blob.len(); // torn: sent as is, refused by the mirror
        }
        out.push(&blob[..cut]);
        blob = &blob[cut..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use orion_proto::ReplyBody;

    fn pending(t: &mut ReplyTable) -> Vec<u8> {
        let mut out = Vec::new();
        t.take_pending(&mut out);
        out
    }

    #[test]
    fn replies_are_recalled_by_client_and_id_and_reach_a_mirror_whole() {
        let mut t = ReplyTable::default();
        let ok = Reply::Ok(ReplyBody::Ino(7));
        let err = Reply::Err {
            errno: libc::EEXIST,
            message: "exists".into(),
        };
        t.remember(1, 10, &ok);
        t.for_mirror(true);
        t.remember(2, 10, &err);
        assert_eq!(t.recall(1, 10), Some(ok.clone()));
        assert_eq!(t.recall(2, 10), Some(err.clone()));
        assert_eq!(t.recall(1, 11), None);
        assert_eq!(t.recall(3, 10), None);
        // A mirror that copied the pool gets everything, then what follows.
        let mut m = ReplyTable::default();
        assert_eq!(m.apply(&pending(&mut t)).unwrap(), 2);
        assert_eq!(m.recall(2, 10), Some(err));
        t.remember(1, 12, &ok);
        let blob = pending(&mut t);
        assert_eq!(pieces(&blob, 10).len(), 1, "one entry is one piece");
        m.apply(&blob).unwrap();
        assert_eq!(m.recall(1, 12), Some(ok.clone()));
        // Bounded per client.
        for id in 100..100 + PER_CLIENT as u64 + 5 {
            t.remember(5, id, &ok);
        }
        assert_eq!(t.recall(5, 100), None);
        assert!(t.recall(5, 104 + PER_CLIENT as u64).is_some());
        // Past the bound of clients, the one unheard of the longest goes, not the first
        // seen: client 1, still in use, stays.
        for n in 1000..1000 + CLIENTS as u64 {
            t.remember(n, 1, &ok);
            t.remember(1, 99, &ok);
        }
        assert!(t.recall(1, 99).is_some());
        assert_eq!(t.recall(2, 10), None, "client 2 was unheard of the longest");
        // Malformed blobs are refused without panicking.
        assert!(m.apply(&blob[..blob.len() - 1]).is_err());
        assert!(m.apply(&[1, 2, 3]).is_err());
    }

    #[test]
    fn pieces_split_at_entry_boundaries() {
        let mut t = ReplyTable::default();
        t.for_mirror(true);
        for id in 0..100 {
            t.remember(1, id, &Reply::Ok(ReplyBody::Ino(id)));
        }
        let blob = pending(&mut t);
        let ps = pieces(&blob, 500);
        assert!(ps.len() > 1);
        assert_eq!(ps.concat(), blob);
        let mut m = ReplyTable::default();
        let n: usize = ps.iter().map(|p| m.apply(p).unwrap()).sum();
        assert_eq!(n, 100);
        assert!(ps.iter().all(|p| p.len() <= 500));
    }
}
