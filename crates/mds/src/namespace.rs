//! Namespace RPCs: everything that changes several inodes or other clients' view of a
//! directory (paper §4.1). They run on the metadata engine, which journals changes to
//! several inodes and commits single-inode ones with one tail store.

use orion_fabric::ConnId;
use orion_format::{Entry, FileType, SYMLINK_MAX};
use orion_meta::error::{EINVAL, ENAMETOOLONG, ENOENT, ENOTDIR};
use orion_meta::index::Body;
use orion_meta::{FsResult, MetaEngine, NewNode, StatFs};
use orion_proto::{Create, ReplyBody};
use tracing::warn;

use crate::server::Mds;

impl Mds {
    /// An unlink by a client that holds the file open: the inode stays while it does
    /// (POSIX: an open file outlives its last name), remembered with the client. The
    /// reply names the inode kept (0: other links keep it, nothing is held).
    pub(crate) fn unlink_open(
        &mut self,
        conn: ConnId,
        parent: u64,
        name: &[u8],
    ) -> FsResult<ReplyBody> {
        let Some(ino) = self.engine.unlink_open(parent, name)? else {
            return Ok(ReplyBody::Ino(0));
        };
        match self.peers.get_mut(&conn) {
            Some(p) => p.orphans.push(ino),
            None => self.release_orphans(&[ino]),
        }
        Ok(ReplyBody::Ino(ino))
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
