//! Log commits from the client (paper §4.3), and the one loop that runs an update
//! computed from a cached inode until the MDS accepts it.
//!
//! An update built from the inode's state (a partial-page write, an append, a
//! truncation, an extended attribute) commits conditionally: it names the tail it was
//! built on, and the MDS refuses it with `ESTALE` when another client's commit came
//! first. `commit_loop` then asks the update to build itself again from a refreshed
//! copy, as the paper's re-execution does. Every conditional update of the client goes
//! through this loop; a refused unconditional commit (the inode number was reused)
//! stops at the update's own generation check. Once the MDS accepted a commit, the
//! update has happened: nothing after it (applying it to the cached copy) can fail
//! the update, so its pages are never given back and it never runs again.

use orion_format::Tail;
use orion_meta::error::ESTALE;
use orion_meta::FsError;
use orion_proto::{Commit, MdsRequest, ReplyBody};

use crate::arbitration::{Ahead, InodeCache};
use crate::remote::{io_err, Fail, Remote, Res};

/// How often an update refused because another client committed first is run again.
pub(crate) const MAX_REEXECUTIONS: usize = 10_000;

/// What one attempt of an update decided, given a current copy of the inode.
pub(crate) enum Step<T> {
    /// Send this commit; `T` is the update's answer once it is accepted.
    Send(Commit, T),
    /// Finished without a commit of its own (nothing to change, or staged).
    Done(T),
    /// Build again (the attempt changed the inode itself, e.g. committed staged
    /// writes first).
    Again,
}

/// Runs `attempt` until its commit is accepted, re-executing it when the MDS refuses
/// it with `ESTALE`. Each attempt gets the connections and the inode cache, and the
/// attempt's number (0 first). An accepted commit is settled in the cached copy
/// ([`send_commit`], which cannot fail the update) before the answer is returned.
pub(crate) fn commit_loop<T>(
    remote: &mut Remote,
    cache: &mut InodeCache,
    mut attempt: impl FnMut(&mut Remote, &mut InodeCache, usize) -> Res<Step<T>>,
) -> Res<T> {
    for n in 0..MAX_REEXECUTIONS {
        match attempt(remote, cache, n)? {
            Step::Done(v) => return Ok(v),
            Step::Again => continue,
            Step::Send(commit, v) => {
                let (_, sent) = send_commit(remote, cache, commit);
                match sent {
                    Ok(_) => return Ok(v),
                    Err(Fail::Fs(FsError::Errno(libc::ESTALE))) => {
                        remote.stats.reexecutions += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Err(ESTALE.into())
}

/// Sends one log commit and settles the cached copy of its inode by the answer: the
/// entries are applied to the copy while the commit is on its way, and the copy is
/// kept or dropped by where the MDS placed them ([`InodeCache::apply_ahead`],
/// [`InodeCache::settle`]). Returns the commit and where the MDS placed it (the
/// tails before and after).
pub(crate) fn send_commit(
    remote: &mut Remote,
    cache: &mut InodeCache,
    c: Commit,
) -> (Commit, Res<(Tail, Tail)>) {
    debug_assert!(!c.entries.is_empty(), "a commit carries entries");
    remote.stats.commits += 1;
    let req = MdsRequest::Commit(c);
    let MdsRequest::Commit(c) = &req else {
        unreachable!("built as a commit above")
    };
    let mut ahead = Ahead::No;
    let mut apply = || ahead = cache.apply_ahead(c.ino, c.generation, &c.entries);
    let sent = match remote.call_meanwhile(&req, Some(&mut apply)) {
        // The MDS appended: the log moved on (grew, or was compacted after).
        Ok(ReplyBody::Committed { prev, tail }) if prev != tail => Ok((prev, tail)),
        Ok(other) => Err(io_err(format!("unexpected reply to a log commit: {other:?}")).into()),
        Err(e) => Err(e),
    };
    match cache.settle(c.ino, c.generation, &c.entries, ahead, &sent) {
        Some(true) => remote.stats.ahead_kept += 1,
        Some(false) => remote.stats.ahead_dropped += 1,
        None => {}
    }
    let MdsRequest::Commit(c) = req else {
        unreachable!("built as a commit above")
    };
    (c, sent)
}
