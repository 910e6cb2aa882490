//! The namespace operations of the metadata engine, one file each (as 3FS keeps
//! `meta/store/ops/`). Each checks its arguments against the DRAM state, builds the
//! entries of every inode it changes, and hands them to the commit core
//! ([`crate::engine`]) as one update; what is shared between them is here.

mod create;
mod exchange;
mod link;
mod readdir;
mod rename;
mod rmdir;
mod setattr;
mod unlink;

use orion_format::{valid_name, Entry, NAME_MAX};

pub use setattr::setattr_entry;

use crate::engine::{MetaEngine, ROOT_INO};
use crate::error::*;

pub(crate) const S_ISGID: u32 = 0o2000;
/// Most links an inode may have (one below the u32 maximum, as ext4's limit is far
/// below it too).
pub(crate) const MAX_LINKS: u32 = u32::MAX - 1;

pub fn check_name(name: &[u8]) -> FsResult<()> {
    if name.len() > NAME_MAX {
        return Err(ENAMETOOLONG);
    }
    if !valid_name(name) {
        return Err(EINVAL);
    }
    Ok(())
}

impl MetaEngine {
    /// Is `anc` the directory `ino` or one of its ancestors?
    pub(crate) fn is_ancestor(&self, anc: u64, mut ino: u64) -> bool {
        loop {
            if ino == anc {
                return true;
            }
            if ino == ROOT_INO {
                return false;
            }
            match self.inodes.get(&ino) {
                Some(i) => ino = i.parent,
                None => return false,
            }
        }
    }

    /// The entry that moves `dir`'s link count by `delta` (a subdirectory's ".."
    /// arriving or leaving).
    pub(crate) fn link_change(&self, dir: u64, delta: i64, now: i64) -> FsResult<Entry> {
        let n = self.inode(dir)?.state.attr.nlink as i64 + delta;
        Ok(Entry::LinkChange {
            nlink: n as u32,
            ctime: now,
        })
    }
}
