//! rmdir: an empty directory goes, and its ".." link from the parent.

use orion_format::{DirEntryRec, Entry, FileType, NAME_MAX};

use crate::engine::MetaEngine;
use crate::error::*;

impl MetaEngine {
    pub fn rmdir(&mut self, parent: u64, name: &[u8]) -> FsResult<()> {
        if name.len() > NAME_MAX {
            return Err(ENAMETOOLONG);
        }
        match name {
            b"." => return Err(EINVAL),
            b".." => return Err(ENOTEMPTY),
            _ => {}
        }
        let ent = self.entry(parent, name)?.ok_or(ENOENT)?;
        if ent.ftype != FileType::Directory {
            return Err(ENOTDIR);
        }
        if !self
            .inode(ent.ino)?
            .state
            .dir()
            .is_some_and(|d| d.names.is_empty())
        {
            return Err(ENOTEMPTY);
        }
        let now = self.clock.now();
        let pnlink = self.inode(parent)?.state.attr.nlink;
        let entries = vec![
            Entry::DirRemove(DirEntryRec {
                ino: ent.ino,
                cookie: ent.cookie,
                time: now,
                ftype: ent.ftype,
                name: name.to_vec(),
            }),
            Entry::LinkChange {
                nlink: pnlink - 1,
                ctime: now,
            },
        ];
        self.commit(vec![(parent, entries)], true)?;
        self.destroy(ent.ino)
    }
}
