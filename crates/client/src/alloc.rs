//! Delegated allocation (paper §5.1): the client asks the MDS for a chunk of pages
//! (one RPC) and allocates inside it without asking again. Pages handed out here are
//! the client's until it commits them; pages of a failed write come back here.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use orion_format::Gpa;
use orion_proto::{MdsRequest, ReplyBody};

use std::time::Duration;

use orion_meta::FsError;

use crate::remote::{io_err, Fail, Remote, Res};

#[derive(Default)]
pub struct Chunks {
    runs: VecDeque<(Gpa, u64)>,
    /// The MDS sessions of the client (`Remote::sessions`) when the runs were
    /// granted: a grant dies with its connection (the MDS frees its pages, or a new
    /// primary never knew it), and a page of it may be someone else's by now.
    granted_under: u64,
    /// Pages the next chunk request asks for (0: not asked yet).
    next_request: u32,
    /// The client's open lanes: they share [`MAX_CHUNK_REQUEST`], so that a client
    /// holds no more unused pages with many lanes than with one.
    lanes_open: Arc<AtomicUsize>,
}

/// The most pages one chunk request asks for (16 MiB): past it, the RPC and the
/// prefault are a small part of writing the chunk.
pub const MAX_CHUNK_REQUEST: u32 = 4096;

impl Chunks {
    /// The chunks of one lane of a client that has `lanes_open` lanes open.
    pub fn for_lane(lanes_open: Arc<AtomicUsize>) -> Chunks {
        Chunks {
            lanes_open,
            ..Default::default()
        }
    }

    /// `n` pages as runs of contiguous pages.
    pub fn take(&mut self, remote: &mut Remote, n: u64) -> Res<Vec<(Gpa, u64)>> {
        let sessions = remote.sessions();
        if self.granted_under != sessions || !remote.mds_seems_alive() {
            // This lane or another one of the client reconnected since (a request
            // answered from the MDS's memory after a break carries on without a
            // re-run), or this lane's connection is broken: the MDS restarted or
            // another took over, and may have granted these pages to a lane that
            // reconnected first. Writing into them would overwrite its data: they
            // are no longer ours (the chunk request below reconnects).
            self.runs.clear();
            self.granted_under = sessions;
        }
        if !self.runs.is_empty() && !remote.chunks_trusted() {
            // Nothing answered lately: make sure the MDS that granted them still
            // serves before writing into them (a ping; one that does not answer is
            // left, and the operation runs again on fresh chunks).
            if let Err(e) = remote.call(&MdsRequest::Ping) {
                self.runs.clear();
                return Err(e);
            }
        }
        let mut out = Vec::new();
        let mut have = 0;
        let mut waited = 0;
        // An internal client asks for its own store's pages, and for any store's
        // once it has waited a grace period for its own (the MDS has it wait while
        // its own store's room is freed pages in their grace period).
        let mut own_group = remote.internal_group();
        while have < n {
            let Some((g, k)) = self.runs.pop_front() else {
                let lanes = self.lanes_open.load(Ordering::Relaxed).max(1) as u32;
                let most = (MAX_CHUNK_REQUEST / lanes).max(1);
                if self.next_request == 0 {
                    self.next_request = remote.cfg.chunk_pages;
                }
                self.next_request = self.next_request.clamp(1, most);
                let want = (n - have).max(self.next_request as u64).min(1 << 17) as u32;
                self.next_request = (self.next_request * 2).min(most);
                match remote.call(&MdsRequest::AllocChunk {
                    group: own_group,
                    pages: want,
                }) {
                    Ok(ReplyBody::Chunk { start, pages }) if pages > 0 => {
                        waited = 0;
                        remote.prefault(start, pages as u64);
                        self.runs.push_back((start, pages as u64));
                        continue;
                    }
                    Ok(other) => {
                        self.give_back(out);
                        return Err(io_err(format!("unexpected chunk reply {other:?}")).into());
                    }
                    // No store is connected to the MDS (one may be rejoining after
                    // an MDS restart), or the free pages of the full ones are still
                    // in their grace period. Wait as for a reconnection.
                    Err(Fail::Fs(FsError::Errno(libc::EAGAIN)))
                        if waited < remote.cfg.reconnect_ms =>
                    {
                        std::thread::sleep(Duration::from_millis(20));
                        waited += 20;
                        if u128::from(waited) >= remote.grace.as_millis() {
                            own_group = None;
                        }
                        remote.refresh_stores()?;
                        continue;
                    }
                    Err(Fail::Fs(FsError::Errno(libc::EAGAIN))) => {
                        self.give_back(out);
                        return Err(io_err(
                            "no data store is connected to the MDS: start `orion ds` for \
                             this cluster",
                        )
                        .into());
                    }
                    Err(e) => {
                        self.give_back(out);
                        return Err(e);
                    }
                }
            };
            // Runs are queued non-empty (a grant of pages, a remainder, pages given
            // back): an empty one would be handed out as a write of no pages.
            debug_assert!(k > 0, "an empty run among the chunks at {g:?}");
            let use_now = k.min(n - have);
            if use_now < k {
                self.runs.push_front((g.offset_by(use_now), k - use_now));
            }
            out.push((g, use_now));
            have += use_now;
        }
        assert_eq!(
            out.iter().map(|r| r.1).sum::<u64>(),
            n,
            "exactly the pages asked"
        );
        Ok(out)
    }

    pub fn give_back(&mut self, runs: Vec<(Gpa, u64)>) {
        for r in runs.into_iter().rev() {
            debug_assert!(r.1 > 0, "an empty run given back");
            debug_assert!(
                self.runs.iter().all(|&(g, n)| g.group() != r.0.group()
                    || g.page() + n <= r.0.page()
                    || r.0.page() + r.1 <= g.page()),
                "pages given back twice: {r:?}"
            );
            self.runs.push_front(r);
        }
    }

    /// Gives every unused page back to the MDS (a store ran short while this lane
    /// sat on them); true if there were any. They are forgotten here first, whatever
    /// the MDS answers: a page asked back is never written again.
    pub fn return_all(&mut self, remote: &mut Remote) -> bool {
        if self.runs.is_empty() {
            return false;
        }
        let runs: Vec<(Gpa, u32)> = self
            .runs
            .drain(..)
            .map(|(g, n)| (g, u32::try_from(n).expect("a run lies in one grant")))
            .collect();
        self.next_request = 0;
        for batch in runs.chunks(orion_proto::MAX_RETURNED_RUNS) {
            let req = MdsRequest::ReturnPages {
                runs: batch.to_vec(),
            };
            if let Err(e) = remote.call(&req) {
                // Kept by the MDS until this connection goes: only space is lost.
                tracing::debug!("giving chunk pages back: {e:?}");
            }
        }
        true
    }

    /// Forgets every chunk (the MDS restarted and took them back).
    pub fn clear(&mut self) {
        self.runs.clear();
    }
}
