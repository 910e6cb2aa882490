//! link: a second name for an inode that is not a directory.

use orion_format::{DirEntryRec, Entry, FileType, NAME_MAX};

use crate::engine::MetaEngine;
use crate::error::*;
use crate::index::Attr;
use crate::ops::{check_name, MAX_LINKS};

impl MetaEngine {
    pub fn link(&mut self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Attr> {
        if name.len() > NAME_MAX {
            return Err(ENAMETOOLONG);
        }
        let target = self.inode(ino)?;
        let nlink = target.state.attr.nlink;
        let ftype = target.state.attr.ftype;
        self.dir(parent)?;
        // Linux resolves the new name first (EEXIST), then refuses directories.
        if name == b"." || name == b".." || self.entry(parent, name)?.is_some() {
            return Err(EEXIST);
        }
        if ftype == FileType::Directory {
            return Err(EPERM);
        }
        check_name(name)?;
        if nlink >= MAX_LINKS {
            return Err(EMLINK);
        }
        let now = self.clock.now();
        let u = vec![
            (
                parent,
                vec![Entry::DirAdd(DirEntryRec {
                    ino,
                    cookie: self.next_cookie(parent),
                    time: now,
                    ftype,
                    name: name.to_vec(),
                })],
            ),
            (
                ino,
                vec![Entry::LinkChange {
                    nlink: nlink + 1,
                    ctime: now,
                }],
            ),
        ];
        self.commit(u, false)?;
        self.getattr(ino)
    }
}
