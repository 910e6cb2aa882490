//! rename(2) and RENAME_NOREPLACE: one journaled commit over up to four inodes.

use orion_format::{attr_mask as m, DirEntryRec, Entry, FileType, SetAttrRec, NAME_MAX};

use crate::engine::{push_update, MetaEngine, RenameMode, Updates};
use crate::error::*;
use crate::ops::check_name;

impl MetaEngine {
    /// rename(2), and renameat2's RENAME_NOREPLACE and RENAME_EXCHANGE.
    pub fn rename(
        &mut self,
        op: u64,
        on: &[u8],
        np: u64,
        nn: &[u8],
        mode: RenameMode,
    ) -> FsResult<()> {
        self.rename_open(op, on, np, nn, mode, false).map(|_| ())
    }

    /// [`MetaEngine::rename`] where someone may hold the target file open
    /// (`target_open`; the MDS always says so): a replaced file losing its last
    /// link then stays, with a link count of 0, until
    /// [`MetaEngine::release_orphan`], as after [`MetaEngine::unlink_open`].
    /// Returns the inode kept so.
    pub fn rename_open(
        &mut self,
        op: u64,
        on: &[u8],
        np: u64,
        nn: &[u8],
        mode: RenameMode,
        target_open: bool,
    ) -> FsResult<Option<u64>> {
        // Linux looks the source up before the target name.
        if on.len() > NAME_MAX {
            return Err(ENAMETOOLONG);
        }
        self.dir(op)?;
        self.dir(np)?;
        if matches!(on, b"." | b"..") || matches!(nn, b"." | b"..") {
            return Err(EBUSY);
        }
        let src = self.entry(op, on)?.ok_or(ENOENT)?;
        if nn.len() > NAME_MAX {
            return Err(ENAMETOOLONG);
        }
        let dst = self.entry(np, nn)?;
        let src_dir = src.ftype == FileType::Directory;
        if dst.is_some() && mode == RenameMode::NoReplace {
            return Err(EEXIST);
        }
        if mode == RenameMode::Exchange {
            return self
                .exchange(op, on, src, np, nn, dst.ok_or(ENOENT)?)
                .map(|_| None);
        }
        // Linux: moving a directory under itself is EINVAL; replacing an ancestor of
        // the source is ENOTEMPTY; both before the type checks.
        if src_dir && self.is_ancestor(src.ino, np) {
            return Err(EINVAL);
        }
        if let Some(d) = dst {
            if d.ftype == FileType::Directory && self.is_ancestor(d.ino, op) && d.ino != src.ino {
                return Err(ENOTEMPTY);
            }
            if d.ino == src.ino {
                return Ok(None);
            }
            let dst_dir = d.ftype == FileType::Directory;
            if src_dir && !dst_dir {
                return Err(ENOTDIR);
            }
            if !src_dir && dst_dir {
                return Err(EISDIR);
            }
            if dst_dir
                && !self
                    .inode(d.ino)?
                    .state
                    .dir()
                    .is_some_and(|x| x.names.is_empty())
            {
                return Err(ENOTEMPTY);
            }
        }
        check_name(nn)?;
        let now = self.clock.now();
        let mut u: Updates = Vec::new();
        push_update(
            &mut u,
            op,
            Entry::DirRemove(DirEntryRec {
                ino: src.ino,
                cookie: src.cookie,
                time: now,
                ftype: src.ftype,
                name: on.to_vec(),
            }),
        );
        let mut dst_dies = false;
        let mut kept = None;
        let mut nlink_delta: Vec<(u64, i64)> = Vec::new();
        if src_dir && op != np {
            nlink_delta.push((op, -1));
            nlink_delta.push((np, 1));
        }
        if let Some(d) = dst {
            push_update(
                &mut u,
                np,
                Entry::DirRemove(DirEntryRec {
                    ino: d.ino,
                    cookie: d.cookie,
                    time: now,
                    ftype: d.ftype,
                    name: nn.to_vec(),
                }),
            );
            let dn = self.inode(d.ino)?.state.attr.nlink;
            // A replaced directory (empty) loses its last link, as does a file's.
            let dst_is_dir = d.ftype == FileType::Directory;
            if dst_is_dir {
                nlink_delta.push((np, -1));
            }
            let last = dst_is_dir || dn <= 1;
            if last && !target_open {
                dst_dies = true;
            } else {
                if last {
                    kept = Some(d.ino);
                }
                let nlink = if dst_is_dir { 0 } else { dn.saturating_sub(1) };
                push_update(&mut u, d.ino, Entry::LinkChange { nlink, ctime: now });
            }
        }
        push_update(
            &mut u,
            np,
            Entry::DirAdd(DirEntryRec {
                ino: src.ino,
                cookie: self.next_cookie(np),
                time: now,
                ftype: src.ftype,
                name: nn.to_vec(),
            }),
        );
        push_update(
            &mut u,
            src.ino,
            Entry::SetAttr(SetAttrRec {
                mask: m::CTIME,
                ctime: now,
                ..Default::default()
            }),
        );
        for dir in [op, np] {
            let delta: i64 = nlink_delta
                .iter()
                .filter(|(d, _)| *d == dir)
                .map(|(_, x)| x)
                .sum();
            if delta != 0
                && !u.iter().any(|(i, v)| {
                    *i == dir && v.iter().any(|e| matches!(e, Entry::LinkChange { .. }))
                })
            {
                push_update(&mut u, dir, self.link_change(dir, delta, now)?);
            }
        }
        self.commit(u, true)?;
        if src_dir {
            self.inodes.get_mut(&src.ino).expect("moved inode").parent = np;
        }
        if let Some(d) = dst {
            if dst_dies {
                self.destroy(d.ino)?;
            }
        }
        Ok(kept)
    }
}
