//! unlink: the name goes, and the inode with its last link.

use orion_format::{DirEntryRec, Entry, FileType, NAME_MAX};

use crate::engine::MetaEngine;
use crate::error::*;

impl MetaEngine {
    pub fn unlink(&mut self, parent: u64, name: &[u8]) -> FsResult<()> {
        if name.len() > NAME_MAX {
            return Err(ENAMETOOLONG);
        }
        if name == b"." || name == b".." {
            return Err(if self.dir(parent).is_ok() {
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
        if nlink > 1 {
            u.push((
                ent.ino,
                vec![Entry::LinkChange {
                    nlink: nlink - 1,
                    ctime: now,
                }],
            ));
        }
        self.commit(u, true)?;
        if nlink <= 1 {
            self.destroy(ent.ino)?;
        }
        Ok(())
    }
}
