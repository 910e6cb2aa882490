//! Namespace RPCs: everything that changes several inodes or other clients' view of a
//! directory (paper §4.1). They run on the metadata engine, which journals changes to
//! several inodes and commits single-inode ones with one tail store.

use orion_format::{Entry, FileType, SYMLINK_MAX};
use orion_meta::error::{EINVAL, ENAMETOOLONG, ENOENT};
use orion_meta::{FsError, FsResult, MetaEngine, NewNode, StatFs};
use orion_proto::{Create, MdsRequest, ReplyBody};

use crate::server::Mds;

impl Mds {
    /// The requests that change names: unlink, rmdir, rename, link (and the parent
    /// of a directory, for "..").
    pub(crate) fn namespace_rpc(&mut self, req: MdsRequest) -> FsResult<ReplyBody> {
        let e = &mut self.engine;
        match req {
            MdsRequest::Unlink { parent, name } => {
                let kept = e.unlink_open(parent, &name)?;
                Ok(self.orphaned(kept))
            }
            MdsRequest::Rmdir { parent, name } => {
                let kept = e.rmdir_open(parent, &name)?;
                Ok(self.orphaned(kept))
            }
            MdsRequest::Rename {
                old_parent,
                old_name,
                new_parent,
                new_name,
                mode,
            } => {
                let (op, on, np, nn) = (old_parent, &old_name, new_parent, &new_name);
                let kept = e.rename_open(op, on, np, nn, mode, true)?;
                Ok(self.orphaned(kept))
            }
            MdsRequest::Link { ino, parent, name } => {
                e.link(ino, parent, &name).map(ReplyBody::Attr)
            }
            MdsRequest::Parent { ino } => e.parent(ino).map(ReplyBody::Ino),
            other => Err(FsError::Io(format!(
                "not a namespace request: {:?}",
                other.kind()
            ))),
        }
    }

    /// A file or directory whose last link an unlink, rmdir or rename took is kept
    /// (link count 0) until no client holds it open (`crate::open_tables`).
    fn orphaned(&mut self, kept: Option<u64>) -> ReplyBody {
        if let Some(ino) = kept {
            self.open_tables.orphaned(ino);
        }
        ReplyBody::Empty
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

impl Mds {
    /// Inodes from the engine; blocks from the data stores' groups.
    pub(crate) fn statfs(&self) -> ReplyBody {
        let groups = self.groups.values();
        let (blocks, bfree) =
            groups.fold((0, 0), |(b, f), g| (b + g.page_count, f + g.alloc.free()));
        statfs(&self.engine, blocks, bfree)
    }
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
