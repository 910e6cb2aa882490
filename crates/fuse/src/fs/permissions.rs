//! Permission checks, made by the file system itself: the mount does not ask the
//! kernel to check modes (`default_permissions` is off), so that a change another
//! client makes to a mode or an owner counts at once.

use fuser::Request;
use orion_client::perm;
use orion_client::xattr;
use orion_client::{Attr, FileType, FsError, FsResult, RenameMode};

use super::OrionFs;
use crate::convert::with_cred;

/// Permission checks, made by the file system itself (the mount does not ask the
/// kernel to check modes: `default_permissions` is off).
impl OrionFs {
    /// Whether the caller may access the inode as `mask` asks. Root may do anything
    /// but execute a file without execute bits: no attribute read otherwise.
    pub(super) fn may(&self, req: &Request, ino: u64, mask: u32) -> FsResult<()> {
        if req.uid() == 0 && mask & perm::MAY_EXEC == 0 {
            return Ok(());
        }
        let a = self.client.getattr(ino)?;
        with_cred(req, |c| perm::check(&a, c, mask))
    }

    /// Adding a name to `parent`: write and search permission.
    pub(super) fn may_add(&self, req: &Request, parent: u64) -> FsResult<()> {
        if req.uid() == 0 {
            // Root passes every directory check: skip the attribute read.
            return Ok(());
        }
        self.may(req, parent, perm::MAY_WRITE | perm::MAY_EXEC)
    }

    /// Removing `name` from `parent` (sticky rule included); returns the victim's
    /// attributes when they were needed. Root passes without reading any.
    pub(super) fn may_delete(
        &self,
        req: &Request,
        parent: u64,
        name: &[u8],
    ) -> FsResult<Option<Attr>> {
        if req.uid() == 0 {
            return Ok(None);
        }
        let victim = self.client.lookup(parent, name)?;
        let dir = self.client.getattr(parent)?;
        with_cred(req, |c| perm::check_delete(&dir, &victim, c))?;
        Ok(Some(victim))
    }

    pub(super) fn may_rename(
        &self,
        req: &Request,
        (op, on): (u64, &[u8]),
        (np, nn): (u64, &[u8]),
        mode: RenameMode,
    ) -> FsResult<()> {
        let src = self.may_delete(req, op, on)?;
        let dst = match self.may_delete(req, np, nn) {
            Ok(d) => Some(d),
            Err(FsError::Errno(libc::ENOENT)) => {
                self.may_add(req, np)?;
                None
            }
            Err(e) => return Err(e),
        };
        // A directory that changes parent rewrites its "..": it must be writable.
        if op != np && req.uid() != 0 {
            let mut moved: Vec<&Attr> = src.iter().collect();
            if mode == RenameMode::Exchange {
                moved.extend(dst.iter().flatten());
            }
            for a in moved {
                if a.ftype == FileType::Directory {
                    with_cred(req, |c| perm::check(a, c, perm::MAY_WRITE))?;
                }
            }
        }
        Ok(())
    }

    /// Extended attributes: user.* and security.* follow the inode's read/write
    /// permission (user.* on sticky directories only for their owner); trusted.* is
    /// root's alone, and unprivileged callers neither see nor read it.
    pub(super) fn may_xattr(
        &self,
        req: &Request,
        ino: u64,
        name: &[u8],
        write: bool,
    ) -> FsResult<Attr> {
        let ns = xattr::namespace(name)?;
        let a = self.client.getattr(ino)?;
        if req.uid() == 0 {
            return Ok(a);
        }
        match ns {
            xattr::Namespace::Trusted if write => Err(FsError::Errno(libc::EPERM)),
            xattr::Namespace::Trusted => Err(FsError::Errno(libc::ENODATA)),
            _ => {
                let sticky_dir = a.ftype == FileType::Directory && a.mode & libc::S_ISVTX != 0;
                if ns == xattr::Namespace::User && write && sticky_dir && a.uid != req.uid() {
                    return Err(FsError::Errno(libc::EPERM));
                }
                let mask = if write {
                    perm::MAY_WRITE
                } else {
                    perm::MAY_READ
                };
                with_cred(req, |c| perm::check(&a, c, mask))?;
                Ok(a)
            }
        }
    }
}
