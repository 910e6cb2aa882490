//! unlink: the name goes, and the inode with its last link.

use orion_format::{DirEntryRec, Entry, FileType, NAME_MAX};

use crate::engine::MetaEngine;
use crate::error::*;

impl MetaEngine {
    pub fn unlink(&mut self, parent: u64, name: &[u8]) -> FsResult<()> {
        self.unlink_keeping(parent, name, false).map(|_| ())
    }

    /// unlink of a file someone may hold open (the MDS's every unlink): with its
    /// last link gone, the inode stays, with a link count of 0, until
    /// [`MetaEngine::release_orphan`] (recovery keeps it too, for the MDS to
    /// decide). Returns the inode when it is kept so.
    pub fn unlink_open(&mut self, parent: u64, name: &[u8]) -> FsResult<Option<u64>> {
        self.unlink_keeping(parent, name, true)
    }

    /// Destroys an inode kept by [`MetaEngine::unlink_open`], if it still has no link
    /// (a link made meanwhile keeps it).
    pub fn release_orphan(&mut self, ino: u64) -> FsResult<()> {
        match self.inode(ino) {
            Ok(i) if i.state.attr.nlink == 0 => self.destroy(ino),
            _ => Ok(()),
        }
    }

    fn unlink_keeping(&mut self, parent: u64, name: &[u8], keep: bool) -> FsResult<Option<u64>> {
        if name.len() > NAME_MAX {
            return Err(ENAMETOOLONG);
        }
        if name == b"." || name == b".." {
            // A removed directory is still a directory here (Linux: EISDIR).
            let dir = self.inode(parent).map(|i| i.state.dir().is_some());
            return Err(if dir.unwrap_or(false) {
                EISDIR
            } else {
                ENOTDIR
            });
        }
        let ent = self.entry(parent, name)?.ok_or(ENOENT)?;
        if ent.ftype == FileType::Directory {
            return Err(EISDIR);
        }
        let now = self.clock.now();
        let nlink = self.inode(ent.ino)?.state.attr.nlink;
        let mut u = vec![(
            parent,
            vec![Entry::DirRemove(DirEntryRec {
                ino: ent.ino,
                cookie: ent.cookie,
                time: now,
                ftype: ent.ftype,
                name: name.to_vec(),
            })],
        )];
        let kept = keep && nlink <= 1;
        if nlink > 1 || kept {
            u.push((
                ent.ino,
                vec![Entry::LinkChange {
                    nlink: nlink.saturating_sub(1),
                    ctime: now,
                }],
            ));
        }
        self.commit(u, true)?;
        if kept {
            return Ok(Some(ent.ino));
        }
        if nlink <= 1 {
            self.destroy(ent.ino)?;
        }
        Ok(None)
    }
}
