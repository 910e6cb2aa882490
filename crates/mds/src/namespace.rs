//! Namespace RPCs: everything that changes several inodes or other clients' view of a
//! directory (paper §4.1). They run on the metadata engine, which journals changes to
//! several inodes and commits single-inode ones with one tail store.

use orion_fabric::ConnId;
use orion_format::{Entry, FileType, SYMLINK_MAX};
use orion_meta::error::{EINVAL, ENAMETOOLONG, ENOENT, ENOTDIR};
use orion_meta::index::Body;
use orion_meta::{FsError, FsResult, MetaEngine, NewNode, StatFs};
use orion_proto::{Create, MdsRequest, ReplyBody};
use tracing::warn;

use crate::server::Mds;

impl Mds {
    /// The requests that change names: unlink, rmdir, rename, link (and the parent
    /// of a directory, for "..").
    pub(crate) fn namespace_rpc(&mut self, conn: ConnId, req: MdsRequest) -> FsResult<ReplyBody> {
        let e = &mut self.engine;
        match req {
            MdsRequest::Unlink { parent, name } => {
                e.unlink(parent, &name).map(|_| ReplyBody::Empty)
            }
            MdsRequest::UnlinkOpen { parent, name } => {
                let kept = e.unlink_open(parent, &name)?;
                Ok(self.hold_orphan(conn, kept))
            }
            MdsRequest::Rmdir { parent, name } => e.rmdir(parent, &name).map(|_| ReplyBody::Empty),
            MdsRequest::Rename {
                old_parent,
                old_name,
                new_parent,
                new_name,
                mode,
                target_open,
            } => {
                let (op, on, np, nn) = (old_parent, &old_name, new_parent, &new_name);
                let kept = e.rename_open(op, on, np, nn, mode, target_open)?;
                Ok(self.hold_orphan(conn, kept))
            }
            MdsRequest::Link { ino, parent, name } => {
                e.link(ino, parent, &name).map(ReplyBody::Attr)
            }
            MdsRequest::Parent { ino } => parent(e, ino),
            other => Err(FsError::Io(format!(
                "not a namespace request: {:?}",
                other.kind()
            ))),
        }
    }

    /// An inode an unlink or rename kept because the client holds it open (POSIX: an
    /// open file outlives its last name): remembered with the client until it
    /// releases it or goes away. The reply names it (0: nothing kept, other links
    /// keep the inode or none was replaced).
    pub(crate) fn hold_orphan(&mut self, conn: ConnId, kept: Option<u64>) -> ReplyBody {
        let Some(ino) = kept else {
            return ReplyBody::Ino(0);
        };
        match self.peers.get_mut(&conn) {
            Some(p) => p.orphans.push(ino),
            None => self.release_orphans(&[ino]),
        }
        ReplyBody::Ino(ino)
    }

    /// The client closed its last descriptor of an inode it unlinked while open.
    pub(crate) fn release(&mut self, conn: ConnId, ino: u64) -> FsResult<ReplyBody> {
        let held = self.peers.get_mut(&conn).and_then(|p| {
            let at = p.orphans.iter().position(|i| *i == ino)?;
            Some(p.orphans.swap_remove(at))
        });
        if let Some(ino) = held {
            self.release_orphans(&[ino]);
        }
        Ok(ReplyBody::Empty)
    }

    /// Destroys unlinked inodes nobody holds any more (a client released them, or
    /// went away); one still linked somewhere (a link made meanwhile), or that another
    /// client holds too (it linked and unlinked it again), stays.
    pub(crate) fn release_orphans(&mut self, inos: &[u64]) {
        for &ino in inos {
            if self.peers.values().any(|p| p.orphans.contains(&ino)) {
                continue;
            }
            if let Err(e) = self.engine.release_orphan(ino) {
                warn!("releasing unlinked inode {ino}: {e}");
            }
        }
    }
}

pub fn create(engine: &mut MetaEngine, c: &Create) -> FsResult<ReplyBody> {
    let mut extra = Vec::new();
    match (c.ftype, c.symlink) {
        (FileType::Symlink, Some((gpa, len, _))) => {
            if len == 0 {
                return Err(ENOENT);
            }
            if len as usize > SYMLINK_MAX {
                return Err(ENAMETOOLONG);
            }
            extra.push(Entry::Symlink { gpa, len });
        }
        (FileType::Symlink, None) | (_, Some(_)) => return Err(EINVAL),
        _ => {}
    }
    let node = NewNode {
        ftype: c.ftype,
        mode: c.mode,
        uid: c.uid,
        gid: c.gid,
        rdev: c.rdev,
    };
    engine
        .create_node(c.parent, &c.name, node, extra)
        .map(ReplyBody::Attr)
}

pub fn statfs(engine: &MetaEngine, blocks: u64, bfree: u64) -> ReplyBody {
    let (files, ffree, _, _) = engine.usage();
    ReplyBody::Statfs(StatFs {
        bsize: orion_format::PAGE_SIZE as u32,
        blocks,
        bfree,
        files,
        ffree,
        namelen: orion_format::NAME_MAX as u32,
    })
}

/// The parent of a directory, for "..".
pub fn parent(engine: &MetaEngine, ino: u64) -> FsResult<ReplyBody> {
    let i = engine.inode(ino)?;
    match i.state.body {
        Body::Dir(_) => Ok(ReplyBody::Ino(if ino == orion_meta::ROOT_INO {
            ino
        } else {
            i.parent
        })),
        _ => Err(ENOTDIR),
    }
}
