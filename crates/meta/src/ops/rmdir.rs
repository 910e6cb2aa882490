//! rmdir: an empty directory goes, and its ".." link from the parent.

use orion_format::{DirEntryRec, Entry, FileType, NAME_MAX};

use crate::engine::MetaEngine;
use crate::error::*;

impl MetaEngine {
    pub fn rmdir(&mut self, parent: u64, name: &[u8]) -> FsResult<()> {
        self.rmdir_keeping(parent, name, false).map(|_| ())
    }

    /// rmdir of a directory someone may hold open (the MDS's every rmdir): it stays,
    /// empty and with a link count of 0, until [`MetaEngine::release_orphan`], as a
    /// file after [`MetaEngine::unlink_open`]. Returns the inode kept so.
    pub fn rmdir_open(&mut self, parent: u64, name: &[u8]) -> FsResult<Option<u64>> {
        self.rmdir_keeping(parent, name, true)
    }

    fn rmdir_keeping(&mut self, parent: u64, name: &[u8], keep: bool) -> FsResult<Option<u64>> {
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
        let mut u = vec![(parent, entries)];
        if keep {
            let dead = Entry::LinkChange {
                nlink: 0,
                ctime: now,
            };
            u.push((ent.ino, vec![dead]));
        }
        self.commit(u, true)?;
        if keep {
            return Ok(Some(ent.ino));
        }
        self.destroy(ent.ino).map(|()| None)
    }
}
