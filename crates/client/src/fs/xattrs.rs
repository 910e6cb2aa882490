//! Extended attributes: values live in data pages; each change is a conditional log
//! commit naming the page, so XATTR_CREATE and XATTR_REPLACE hold across clients.

use orion_format::{Gpa, PAGE_SIZE};
use orion_meta::xattr::{self, SetMode};
use orion_meta::{FsError, FsResult};

use super::*;
use crate::remote::{Fail, Res};

impl Client {
    /// Marks a file as heavily shared, for every client: each update of it commits
    /// conditionally, in the MDS's order, and runs again if another client's update
    /// came first (the ioctl of paper §4.3). The mark is the extended attribute
    /// [`xattr::SHARED_FLAG`], so `setfattr` sets it through a mount.
    pub fn set_shared(&self, fd: Fd, shared: bool) -> FsResult<()> {
        let (ino, _, _) = self.handle(fd)?;
        let r = if shared {
            self.setxattr_ino(ino, xattr::SHARED_FLAG, b"1", SetMode::Any)
        } else {
            self.removexattr_ino(ino, xattr::SHARED_FLAG)
        };
        match r {
            Err(FsError::Errno(libc::ENODATA)) if !shared => Ok(()),
            r => r,
        }
    }

    /// setxattr(2) on inode `ino`: the value goes to a data page, then a conditional
    /// log commit names it.
    pub fn setxattr_ino(&self, ino: u64, name: &[u8], value: &[u8], mode: SetMode) -> FsResult<()> {
        self.run_on(ino, |i| i.setxattr(ino, name, value, mode))
    }

    /// getxattr(2): the value, read one-sided from its page.
    pub fn getxattr_ino(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        self.run_on(ino, |i| {
            let c = i.cache.refresh(&mut i.remote, ino)?;
            let (gpa, len) = xattr::lookup(&c.state, name)?;
            let mut buf = vec![0u8; PAGE_SIZE as usize];
            read_page(i, gpa, &mut buf)?;
            buf.truncate(len as usize);
            Ok(buf)
        })
    }

    /// listxattr(2): NUL-terminated names; trusted.* only when `privileged`.
    pub fn listxattr_ino(&self, ino: u64, privileged: bool) -> FsResult<Vec<u8>> {
        self.run_on(ino, |i| {
            let c = i.cache.refresh(&mut i.remote, ino)?;
            Ok(xattr::list(&c.state, |ns| {
                privileged || ns != xattr::Namespace::Trusted
            }))
        })
    }

    pub fn removexattr_ino(&self, ino: u64, name: &[u8]) -> FsResult<()> {
        self.run_on(ino, |i| {
            i.commit_checked(ino, |state, now| {
                xattr::remove_entry(state, name, now).map(|e| vec![e])
            })
            .map(|_| ())
        })
    }

    /// The path versions, following a final symlink (as setxattr(2) does).
    pub fn setxattr(&self, path: &str, name: &[u8], value: &[u8], mode: SetMode) -> FsResult<()> {
        xattr::check_len(name)?;
        self.setxattr_ino(self.stat(path)?.ino, name, value, mode)
    }

    pub fn getxattr(&self, path: &str, name: &[u8]) -> FsResult<Vec<u8>> {
        xattr::check_len(name)?;
        self.getxattr_ino(self.stat(path)?.ino, name)
    }

    pub fn listxattr(&self, path: &str) -> FsResult<Vec<u8>> {
        let privileged = self.lanes.uid == 0;
        self.listxattr_ino(self.stat(path)?.ino, privileged)
    }

    pub fn removexattr(&self, path: &str, name: &[u8]) -> FsResult<()> {
        xattr::check_len(name)?;
        self.removexattr_ino(self.stat(path)?.ino, name)
    }
}

impl Inner {
    /// setxattr: the value is written to a page of this client's chunk once; the
    /// entry naming it commits conditionally (so XATTR_CREATE and XATTR_REPLACE hold
    /// against other clients). A refused set gives the page back.
    pub(crate) fn setxattr(
        &mut self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        mode: SetMode,
    ) -> Res<()> {
        xattr::check_set(
            &self.cache.refresh(&mut self.remote, ino)?.state,
            name,
            value.len(),
            mode,
        )?;
        let (g, local, written) = self.value_page(value)?;
        let r = self.commit_checked_with(ino, local, written, |state, now| {
            xattr::check_set(state, name, value.len(), mode)?;
            Ok(vec![xattr::set_entry(name, g, value.len(), now)])
        });
        if r.as_ref().is_err_and(Fail::changed_nothing) {
            self.chunks.give_back(vec![(g, 1)]);
        }
        r
    }

    /// Writes `bytes` (at most a page: a symlink target, an xattr value) to a page of
    /// this client's chunk; returns it and whether it is persisted already (own store).
    /// A caller whose request is then refused gives the page back.
    pub(crate) fn value_page(&mut self, bytes: &[u8]) -> Res<(Gpa, bool, Epoch)> {
        let runs = self.chunks.take(&mut self.remote, 1)?;
        // One page is one run: callers give back `(g, 1)` when refused.
        assert_eq!(
            (runs.len(), runs[0].1),
            (1, 1),
            "one page taken as {runs:?}"
        );
        let g = runs[0].0;
        let mut buf = vec![0u8; PAGE_SIZE as usize];
        buf[..bytes.len()].copy_from_slice(bytes);
        let epoch = self.remote.epoch;
        match self.remote.write_pages(g, &buf) {
            Ok(local) => Ok((g, local, epoch)),
            Err(e) => {
                self.chunks.give_back(runs);
                Err(e)
            }
        }
    }
}
