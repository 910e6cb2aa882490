//! What the kernel keeps of this mount: names and attributes, for as long as the
//! client's cache lease lasts, kept true by the MDS's callbacks (design note 56).
//! Before the mount reads what it hands the kernel, the inodes concerned are watched
//! (the MDS then calls this client back before it acknowledges any other client's
//! change to them); each callback becomes a FUSE notification that drops the kernel's
//! copy. So the kernel answers a repeated `stat` itself, and a change made through
//! another client is seen by the next call here.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use fuser::{INodeNo, Notifier};
use orion_client::{Attr, FsResult, Invalidate, Invalidation};
use tracing::debug;

use crate::OrionFs;

/// Drops the kernel's copies the MDS says are wrong: an inode's attributes and data
/// pages, or a name.
pub fn invalidator(notifier: Notifier) -> Invalidate {
    Box::new(move |items: &[Invalidation]| {
        for it in items {
            let r = match it {
                Invalidation::Inode(ino) | Invalidation::Recall(ino) => {
                    notifier.inval_inode(INodeNo(*ino), 0, 0)
                }
                Invalidation::Entry { parent, name } => {
                    notifier.inval_entry(INodeNo(*parent), OsStr::from_bytes(name))
                }
            };
            // The kernel may hold nothing of it (ENOENT is taken as done): anything
            // else means the mount is going away.
            if let Err(e) = r {
                debug!("invalidating {it:?}: {e}");
            }
        }
    })
}

impl OrionFs {
    /// `name` in `parent`, and how long the kernel may keep the name and the
    /// attributes.
    pub(crate) fn lookup_for_kernel(&self, parent: u64, name: &[u8]) -> FsResult<(Attr, Duration)> {
        let c = &self.client;
        let w = c.watch_for_kernel(&[parent]);
        let a = c.lookup(parent, name)?;
        if w.is_none() || c.watched_for_kernel(w, a.ino) {
            return Ok((a, c.kernel_ttl(w)));
        }
        // Its attributes were read before it was watched: read again once it is.
        let w2 = c.watch_for_kernel(&[a.ino]);
        let a = c.getattr(a.ino)?;
        Ok((a, c.kernel_ttl(w).min(c.kernel_ttl(w2))))
    }

    /// An inode's attributes, and how long the kernel may keep them.
    pub(crate) fn getattr_for_kernel(&self, ino: u64) -> FsResult<(Attr, Duration)> {
        self.read_for_kernel(ino, || self.client.getattr(ino))
    }

    /// Runs `read`, which returns `ino`'s attributes (a getattr, or a setattr: one
    /// that changes nothing sends nothing, so the MDS would not watch the inode for
    /// the change's sake), with `ino` watched first; and says how long the kernel may
    /// keep what it returns.
    pub(crate) fn read_for_kernel(
        &self,
        ino: u64,
        read: impl FnOnce() -> FsResult<Attr>,
    ) -> FsResult<(Attr, Duration)> {
        let w = self.client.watch_for_kernel(&[ino]);
        let a = read()?;
        Ok((a, self.client.kernel_ttl(w)))
    }

    /// Runs `change`, which changes the inodes `touched` and the one whose attributes
    /// it returns, and says how long the kernel may keep those attributes: the MDS
    /// watches what a client changes for that client.
    pub(crate) fn change_for_kernel(
        &self,
        touched: &[u64],
        change: impl FnOnce() -> FsResult<Attr>,
    ) -> FsResult<(Attr, Duration)> {
        let w = self.client.watch_for_kernel(&[]);
        let a = change()?;
        let mut inos = touched.to_vec();
        inos.push(a.ino);
        self.client.changed_for_kernel(w, &inos);
        Ok((a, self.client.kernel_ttl(w)))
    }
}
