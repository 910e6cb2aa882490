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
    /// Attributes for the kernel, or, when reading them failed because the inode
    /// is gone, the last ones it was given, with no links ([`crate::nodes`]), not
    /// to be kept.
    pub(super) fn or_removed(
        &self,
        ino: u64,
        r: FsResult<(Attr, Duration)>,
    ) -> FsResult<(Attr, Duration)> {
        r.or_else(|e| match self.nodes.removed(ino, &e) {
            Some(a) => Ok((a, Duration::ZERO)),
            None => Err(e),
        })
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
        r.or_else(|e| match (self.nodes.removed(ino, &e), list) {
            (Some(_), true) => Ok(Vec::new()),
            (Some(_), false) => Err(FsError::Errno(libc::ENODATA)),
            (None, _) => Err(e),
        })
    }

    /// An opendir that failed with `e`: a removed directory the kernel still holds
    /// opens as [`REMOVED_DIR`], with the read permission its last attributes give.
    pub(super) fn open_removed_dir(&self, req: &Request, ino: u64, e: FsError) -> FsResult<u64> {
        match self.nodes.removed(ino, &e) {
            Some(a) if a.ftype == FileType::Directory => {
                with_cred(req, |c| perm::check(&a, c, perm::MAY_READ))?;
                Ok(REMOVED_DIR)
            }
            _ => Err(e),
        }
    }
}
