//! Permission checks, made by the file system itself: the mount does not ask the
//! kernel to check modes (`default_permissions` is off), so that a change another
//! client makes to a mode or an owner counts at once. The checks are the client
//! library's (`orion_client::access`, shared with the preload library); these give
//! them the caller's credentials. A change to a directory also checks that the
//! directory is still the one the kernel means ([`OrionFs::current`]): no name is
//! added to or removed from a later directory that took a removed one's number;
//! an extended attribute's check does the same for its inode.

use fuser::Request;
use orion_client::{Attr, FsResult, RenameMode, SetAttrReq};

use super::{of_generation, OrionFs};
use crate::convert::with_cred;
use orion_client::perm;

impl OrionFs {
    /// Whether the caller may access the inode as `mask` asks.
    pub(super) fn may(&self, req: &Request, ino: u64, mask: u32) -> FsResult<()> {
        with_cred(req, |c| self.client.may(c, ino, mask))
    }

    /// [`Self::may`] of an inode the kernel names in its request, which must still
    /// be the one it holds ([`OrionFs::current`]; checked first): one read of the
    /// attributes serves both, and none is made when neither needs it.
    pub(super) fn may_current(&self, req: &Request, ino: u64, mask: u32) -> FsResult<()> {
        with_cred(req, |c| {
            let check = !(c.is_root() && mask & perm::MAY_EXEC == 0);
            match self.read_current(ino, check)? {
                Some(a) if check => perm::check(&a, c, mask),
                _ => Ok(()),
            }
        })
    }

    /// The setattr the caller may make of an inode the kernel names (as
    /// `Client::may_setattr` allows it), with one read of the attributes for that
    /// and for [`OrionFs::current`].
    pub(super) fn may_setattr_current(
        &self,
        req: &Request,
        ino: u64,
        change: &SetAttrReq,
        opened_for_write: bool,
    ) -> FsResult<SetAttrReq> {
        with_cred(req, |c| match self.read_current(ino, !c.is_root())? {
            Some(a) if !c.is_root() => perm::check_setattr(&a, change, c, opened_for_write),
            _ => Ok(change.clone()),
        })
    }

    /// The attributes of an inode the kernel names, read when `needed` or when
    /// the kernel holds a generation of it to check ([`OrionFs::current`]).
    fn read_current(&self, ino: u64, needed: bool) -> FsResult<Option<Attr>> {
        let held = self.nodes.generation(ino);
        if !needed && held.is_none() {
            return Ok(None);
        }
        let a = self.client.getattr(ino)?;
        if let Some(g) = held {
            of_generation(&a, g)?;
        }
        Ok(Some(a))
    }

    /// Adding a name to `parent`: write and search permission.
    pub(super) fn may_add(&self, req: &Request, parent: u64) -> FsResult<()> {
        self.current(parent)?;
        with_cred(req, |c| self.client.may_add(c, parent))
    }

    /// Removing `name` from `parent` (sticky rule included); returns the victim's
    /// attributes when they were needed. Root passes without reading any.
    pub(super) fn may_delete(
        &self,
        req: &Request,
        parent: u64,
        name: &[u8],
    ) -> FsResult<Option<Attr>> {
        self.current(parent)?;
        with_cred(req, |c| self.client.may_remove(c, parent, name))
    }

    pub(super) fn may_rename(
        &self,
        req: &Request,
        from: (u64, &[u8]),
        to: (u64, &[u8]),
        mode: RenameMode,
    ) -> FsResult<()> {
        self.current(from.0)?;
        if to.0 != from.0 {
            self.current(to.0)?;
        }
        with_cred(req, |c| self.client.may_rename(c, from, to, mode))
    }

    /// An extended attribute read or written; the inode's attributes.
    pub(super) fn may_xattr(
        &self,
        req: &Request,
        ino: u64,
        name: &[u8],
        write: bool,
    ) -> FsResult<Attr> {
        let a = with_cred(req, |c| self.client.may_xattr(c, ino, name, write))?;
        self.same_as_kernel(&a).map(|_| a)
    }
}
