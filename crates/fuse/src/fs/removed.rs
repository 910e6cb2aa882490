//! What a reference to a removed file or directory gets (design note 71): a
//! working directory removed by `rmdir`, here or at another client, still answers
//! `stat` (no links) and opens as a directory that lists as empty, as on a local
//! file system, until the kernel lets go of it. Names are neither found nor made
//! in it: the kernel refuses them itself after an `rmdir` through this mount, and
//! the client finds no such directory after one elsewhere.

use std::time::Duration;

use fuser::Request;
use orion_client::{Attr, FileType, FsError, FsResult};

use super::OrionFs;
use crate::convert::with_cred;
use orion_client::perm;

/// The handle of an open removed directory: no client descriptor stands behind it.
/// The client's descriptors count up from 3 and never reach it.
pub(super) const REMOVED_DIR: u64 = u64::MAX;

impl OrionFs {
    /// An inode's attributes and how long the kernel may keep them; for a held
    /// inode whose file is gone ([`crate::nodes::Nodes::removed`]), the last ones
    /// the kernel was given, with no links, not to be kept. ESTALE for a read of an
    /// earlier generation than the kernel holds.
    pub(super) fn attrs_for_kernel(&self, ino: u64) -> FsResult<(Attr, Duration)> {
        let read = self.getattr_for_kernel(ino);
        if let Ok((a, _)) = &read {
            if self.nodes.saw(a) {
                return read;
            }
        }
        let now = read.map(|(a, _)| a);
        match self.nodes.removed(ino, &now) {
            Some(gone) => Ok((gone, Duration::ZERO)),
            None => Err(now.err().unwrap_or(FsError::Errno(libc::ESTALE))),
        }
    }

    /// After a call on a held inode failed with `e`: the inode's last attributes
    /// if its file is gone (read again to tell: ENOENT and ESTALE also come from
    /// a stale read), else None.
    fn gone(&self, ino: u64, e: &FsError) -> Option<Attr> {
        match e {
            FsError::Errno(libc::ENOENT | libc::ESTALE) => {
                self.nodes.removed(ino, &self.client.getattr(ino))
            }
            _ => None,
        }
    }

    /// An extended attribute read (`r`) that failed because the inode is gone:
    /// a removed file has none left, so a read of one finds nothing (ENODATA) and
    /// a listing is empty.
    pub(super) fn xattrs_or_removed(
        &self,
        ino: u64,
        r: FsResult<Vec<u8>>,
        list: bool,
    ) -> FsResult<Vec<u8>> {
        r.or_else(|e| match (self.gone(ino, &e), list) {
            (Some(_), true) => Ok(Vec::new()),
            (Some(_), false) => Err(FsError::Errno(libc::ENODATA)),
            (None, _) => Err(e),
        })
    }

    /// An opendir that failed with `e`: a removed directory the kernel still holds
    /// opens as [`REMOVED_DIR`], with the read permission its last attributes give.
    pub(super) fn open_removed_dir(&self, req: &Request, ino: u64, e: FsError) -> FsResult<u64> {
        match self.gone(ino, &e) {
            Some(a) if a.ftype == FileType::Directory => {
                with_cred(req, |c| perm::check(&a, c, perm::MAY_READ))?;
                Ok(REMOVED_DIR)
            }
            _ => Err(e),
        }
    }
}
