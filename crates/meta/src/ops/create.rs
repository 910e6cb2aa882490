//! create, mkdir, symlink, mknod: a new inode, then the directory entry that links it.

use orion_format::{attr_mask as m, DirEntryRec, Entry, FileType, SetAttrRec, NAME_MAX};

use crate::engine::{MetaEngine, NewNode};
use crate::error::*;
use crate::index::Attr;
use crate::log;
use crate::ops::{check_name, MAX_LINKS, S_ISGID};

impl MetaEngine {
    /// Creates a file, directory, symlink or special node named `name` in `parent`.
    /// For symlinks, `extra` holds the entry naming the page with the target.
    pub fn create_node(
        &mut self,
        parent: u64,
        name: &[u8],
        node: NewNode,
        extra: Vec<Entry>,
    ) -> FsResult<Attr> {
        let NewNode {
            ftype,
            mode,
            uid,
            gid,
            rdev,
        } = node;
        if name.len() > NAME_MAX {
            return Err(ENAMETOOLONG);
        }
        let pdir = self.dir(parent)?;
        if name == b"." || name == b".." || self.entry(parent, name)?.is_some() {
            return Err(EEXIST);
        }
        check_name(name)?;
        let is_dir = ftype == FileType::Directory;
        if is_dir && pdir.state.attr.nlink >= MAX_LINKS {
            return Err(EMLINK);
        }
        let now = self.clock.now();
        let (mut mode, mut gid) = (mode & 0o7777, gid);
        if pdir.state.attr.mode & S_ISGID != 0 {
            gid = pdir.state.attr.gid;
            if is_dir {
                mode |= S_ISGID;
            }
        }
        let pnlink = pdir.state.attr.nlink;
        let attr = SetAttrRec {
            mask: m::ALL,
            mode,
            uid,
            gid,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            rdev,
        };
        let mut entries = vec![Entry::DirAdd(DirEntryRec {
            ino: 0, // the new inode's, once it has one (a fixed-size field)
            cookie: self.next_cookie(parent),
            time: now,
            ftype,
            name: name.to_vec(),
        })];
        if is_dir {
            entries.push(Entry::LinkChange {
                nlink: pnlink + 1,
                ctime: now,
            });
        }
        // The log pages the new inode and the entries linking it take: an inode
        // made and dropped for want of the second would have changed the pool (its
        // number in a grace period, its slot's generation), which a refusal for room
        // must not (design note 74). A failed engine or a full inode table answers
        // first: waiting for room would not help them.
        self.check_not_failed()?;
        let need = log::pages_needed(&self.sb, &pdir.log, &entries);
        let nlink = if is_dir { 2 } else { 1 };
        let first = crate::engine::inode::first_entries(attr, nlink, extra);
        let need = need + self.new_inode_pages(&first);
        self.free_inos.room()?;
        self.log_alloc.room_for(need, false)?;
        let ino = self.new_inode(ftype, first)?;
        if let Some(Entry::DirAdd(d)) = entries.first_mut() {
            d.ino = ino;
        }
        if let Err(e) = self.commit(vec![(parent, entries)], false) {
            if !self.has_failed() {
                // Never linked: give the inode back; the caller keeps its data pages.
                self.forget(ino, false)?;
            }
            return Err(e);
        }
        if is_dir {
            self.inodes.get_mut(&ino).expect("created").parent = parent;
        }
        // A new inode is news for whoever hears of changes: its creator caches it.
        if let Some(c) = self.changes.as_mut() {
            c.push(crate::engine::Changed {
                ino,
                removed: Vec::new(),
                dir: is_dir,
            });
        }
        self.getattr(ino)
    }
}
