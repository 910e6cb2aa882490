//! Advisory locks, held at the MDS so they hold across clients.

use std::time::Duration;

use orion_meta::{FsError, FsResult};
use orion_proto::{LockReq, MdsRequest, ReplyBody};

use super::*;
use crate::remote::io_err;

impl Client {
    /// Takes, changes or drops (`LockKind::Unlock`) an advisory lock at the MDS, so
    /// that it holds across clients (fcntl rules; flock as a whole-file range). With
    /// `wait`, tries again until no other owner holds a conflicting lock, or until
    /// `still_wanted` says the waiter is gone (then EINTR).
    pub fn set_lock(
        &self,
        req: LockReq,
        wait: bool,
        still_wanted: impl Fn() -> bool,
    ) -> FsResult<()> {
        let mut pause = Duration::from_micros(200);
        loop {
            match self.run_on_lock_lane(|i| i.rpc(MdsRequest::Lock(req)).map(|_| ())) {
                Err(FsError::Errno(libc::EAGAIN)) if wait => {
                    if !still_wanted() {
                        return Err(FsError::Errno(libc::EINTR));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                r => return r,
            }
        }
    }

    /// The first lock of another owner that `req` would conflict with (F_GETLK).
    pub fn test_lock(&self, req: LockReq) -> FsResult<Option<LockReq>> {
        self.run_on_lock_lane(|i| match i.rpc(MdsRequest::TestLock(req))? {
            ReplyBody::Lock(l) => Ok(l),
            other => Err(io_err(format!("unexpected reply {other:?}")).into()),
        })
    }

    /// Drops every lock `owner` holds on `ino` (a flock's file was closed).
    pub fn release_locks(&self, ino: u64, owner: u64) -> FsResult<()> {
        self.run_on_lock_lane(|i| i.rpc(MdsRequest::ReleaseLocks { ino, owner }).map(|_| ()))
    }
}
