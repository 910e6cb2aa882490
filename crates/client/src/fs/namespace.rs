//! Namespace calls: create, mkdir, symlink, mknod, unlink, rmdir, rename, link go to
//! the MDS as RPCs (they change several inodes); readdir and readlink read a current
//! copy of the inode.

use orion_format::{FileType, PAGE_SIZE, SYMLINK_MAX};
use orion_meta::error::{EINVAL, ELOOP, ENAMETOOLONG, ENOENT, ENOTDIR};
use orion_meta::index::Body;
use orion_meta::{Attr, FsError, FsResult, NewNode, RenameMode, ROOT_INO};
use orion_proto::{Create, MdsRequest, ReplyBody};

use super::paths::{dot_last, is_root};
use super::*;
use crate::access::{checked, checked_for_name, Want};
use crate::remote::{io_err, Res};
use orion_meta::perm::Cred;

/// Calls by path. Each `_as` form checks for the caller `cred`, if given, as Linux
/// does, in the walk that finds what it acts on: search permission on every
/// directory walked, then what the call needs (`crate::access`). The plain forms
/// check nothing (the client's owner acts).
impl Client {
    pub fn mkdir(&self, path: &str, mode: u32) -> FsResult<Attr> {
        self.mkdir_as(path, mode, None)
    }

    pub fn mkdir_as(&self, path: &str, mode: u32, cred: Option<&Cred>) -> FsResult<Attr> {
        self.no_name(path, cred, libc::EEXIST, libc::EEXIST)?;
        self.run(|i| i.make(path, FileType::Directory, mode, None, cred))
    }

    /// Linux's answer to a call that adds or removes a name, for a path whose last
    /// name is "." (`dot`) or ".." (`dotdot`), after the errors of its walk: such a
    /// path names a directory, not a name in one (the walk without the last name
    /// would act on the directory itself: `rmdir("d/.")` would remove `d`).
    fn no_name(&self, path: &str, cred: Option<&Cred>, dot: i32, dotdot: i32) -> FsResult<()> {
        match dot_last(path) {
            None => Ok(()),
            Some(two) => {
                self.stat_as(path, true, cred)?;
                Err(FsError::Errno(if two { dotdot } else { dot }))
            }
        }
    }

    pub fn mknod(&self, path: &str, ftype: FileType, mode: u32) -> FsResult<Attr> {
        // Directories and symlinks have calls of their own.
        if matches!(ftype, FileType::Directory | FileType::Symlink) {
            return Err(EINVAL);
        }
        self.no_name(path, None, libc::EEXIST, libc::EEXIST)?;
        self.run(|i| i.make(path, ftype, mode, None, None))
    }

    pub fn symlink(&self, target: &str, path: &str) -> FsResult<Attr> {
        self.symlink_as(target, path, None)
    }

    pub fn symlink_as(&self, target: &str, path: &str, cred: Option<&Cred>) -> FsResult<Attr> {
        let t = target.as_bytes();
        if t.is_empty() {
            return Err(ENOENT);
        }
        if t.len() > SYMLINK_MAX {
            return Err(ENAMETOOLONG);
        }
        self.no_name(path, cred, libc::EEXIST, libc::EEXIST)?;
        self.run(|i| i.make(path, FileType::Symlink, 0o777, Some(t), cred))
    }

    pub fn readlink(&self, path: &str) -> FsResult<Vec<u8>> {
        self.readlink_as(path, None)
    }

    pub fn readlink_as(&self, path: &str, cred: Option<&Cred>) -> FsResult<Vec<u8>> {
        let cred = checked(cred);
        self.run(|i| {
            let (ino, _) = i.resolve_as(path, false, cred)?;
            i.readlink(ino)
        })
    }

    pub fn unlink(&self, path: &str) -> FsResult<()> {
        self.unlink_as(path, None)
    }

    pub fn unlink_as(&self, path: &str, cred: Option<&Cred>) -> FsResult<()> {
        if is_root(path) {
            return Err(FsError::Errno(libc::EISDIR));
        }
        self.no_name(path, cred, libc::EISDIR, libc::EISDIR)?;
        let cred = checked_for_name(path, cred);
        self.run(|i| {
            let (parent, name) = i.checked_name(path, cred, Want::Remove)?;
            i.unlink_name(parent, name)
        })
    }

    pub fn rmdir(&self, path: &str) -> FsResult<()> {
        self.rmdir_as(path, None)
    }

    pub fn rmdir_as(&self, path: &str, cred: Option<&Cred>) -> FsResult<()> {
        self.no_name(path, cred, libc::EINVAL, libc::ENOTEMPTY)?;
        let cred = checked_for_name(path, cred);
        self.run(|i| {
            let (parent, name) = i.checked_name(path, cred, Want::Remove)?;
            i.rpc(MdsRequest::Rmdir { parent, name }).map(|_| ())
        })
    }

    pub fn rename(&self, from: &str, to: &str) -> FsResult<()> {
        self.rename_with(from, to, RenameMode::Replace)
    }

    /// rename(2), or renameat2 with RENAME_NOREPLACE or RENAME_EXCHANGE.
    pub fn rename_with(&self, from: &str, to: &str, mode: RenameMode) -> FsResult<()> {
        self.rename_as(from, to, mode, None)
    }

    pub fn rename_as(
        &self,
        from: &str,
        to: &str,
        mode: RenameMode,
        cred: Option<&Cred>,
    ) -> FsResult<()> {
        self.no_name(from, cred, libc::EBUSY, libc::EBUSY)?;
        self.no_name(to, cred, libc::EBUSY, libc::EBUSY)?;
        // Each walk is checked; the names are not when either is the root's (the
        // call says EBUSY).
        let cred = checked(cred);
        let names = cred.filter(|_| !is_root(from) && !is_root(to));
        self.run(|i| {
            let old = i.resolve_parent_as(from, cred)?;
            let new = i.resolve_parent_as(to, cred)?;
            if let Some(cred) = names {
                i.check_rename((old.0, &old.1), (new.0, &new.1), cred, mode)?;
            }
            i.rename_names(old, new, mode)
        })
    }

    pub fn link(&self, existing: &str, new: &str) -> FsResult<Attr> {
        self.link_as(existing, new, None)
    }

    pub fn link_as(&self, existing: &str, new: &str, cred: Option<&Cred>) -> FsResult<Attr> {
        if is_root(new) {
            return Err(FsError::Errno(libc::EEXIST));
        }
        self.no_name(new, cred, libc::EEXIST, libc::EEXIST)?;
        let cred = checked(cred);
        self.run(|i| {
            let (ino, _) = i.resolve_as(existing, false, cred)?;
            let (parent, name) = i.resolve_parent_as(new, cred)?;
            if let Some(cred) = cred {
                i.check_link(ino, (parent, &name), cred)?;
            }
            match i.rpc(MdsRequest::Link { ino, parent, name })? {
                ReplyBody::Attr(a) => Ok(a),
                other => Err(io_err(format!("unexpected reply {other:?}")).into()),
            }
        })
    }

    pub fn readdir(&self, path: &str) -> FsResult<Vec<DirEntry>> {
        self.run(|i| {
            let (ino, parent) = i.resolve(path, true)?;
            i.readdir(ino, parent)
        })
    }

    /// Creates `name` in directory `parent` (a symlink when `symlink` holds its
    /// target), owned by `uid`/`gid`: the call FUSE makes, the kernel having resolved
    /// the path and the caller's credentials.
    pub fn create_at(
        &self,
        parent: u64,
        name: &[u8],
        node: NewNode,
        symlink: Option<&[u8]>,
    ) -> FsResult<Attr> {
        check_name(name)?;
        if let Some(t) = symlink {
            if t.is_empty() {
                return Err(ENOENT);
            }
            if t.len() > SYMLINK_MAX {
                return Err(ENAMETOOLONG);
            }
        }
        self.run(|i| i.make_at(parent, name.to_vec(), node, symlink))
    }

    pub fn unlink_at(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        check_name(name)?;
        let name = name.to_vec();
        self.run(|i| i.unlink_name(parent, name.clone()))
    }

    pub fn rmdir_at(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        check_name(name)?;
        let name = name.to_vec();
        self.run(|i| {
            i.rpc(MdsRequest::Rmdir {
                parent,
                name: name.clone(),
            })
            .map(|_| ())
        })
    }

    /// rename(2) by directory inodes and names, or renameat2 with `mode`.
    pub fn rename_at(
        &self,
        old_parent: u64,
        old_name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        mode: RenameMode,
    ) -> FsResult<()> {
        check_name(old_name)?;
        check_name(new_name)?;
        self.run(|i| {
            i.rename_names(
                (old_parent, old_name.to_vec()),
                (new_parent, new_name.to_vec()),
                mode,
            )
        })
    }

    pub fn link_at(&self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Attr> {
        check_name(name)?;
        self.run(|i| {
            match i.rpc(MdsRequest::Link {
                ino,
                parent,
                name: name.to_vec(),
            })? {
                ReplyBody::Attr(a) => Ok(a),
                other => Err(io_err(format!("unexpected reply {other:?}")).into()),
            }
        })
    }

    /// The entries of directory `ino`, with "." and "..".
    pub fn readdir_ino(&self, ino: u64) -> FsResult<Vec<DirEntry>> {
        self.run_on(ino, |i| {
            let parent = i.parent(ino)?;
            i.readdir(ino, parent)
        })
    }

    /// Where directory `ino` is now, as a path from the root (its parents' names,
    /// found one level at a time; bytes, as names are): for a program's directory
    /// descriptor that must be opened again after the directory was renamed.
    pub fn dir_path(&self, ino: u64) -> FsResult<Vec<u8>> {
        self.run_on(ino, |i| {
            let mut names: Vec<Vec<u8>> = Vec::new();
            let mut cur = ino;
            // A directory tree is no deeper than a path is long.
            for _ in 0..4096 {
                if cur == ROOT_INO {
                    names.reverse();
                    let path: Vec<u8> =
                        names.iter().flat_map(|n| [&b"/"[..], n].concat()).collect();
                    return Ok(if path.is_empty() { b"/".to_vec() } else { path });
                }
                let parent = i.parent(cur)?;
                let c = i.cache.refresh(&mut i.remote, parent)?;
                let d = c.state.dir().ok_or(ENOTDIR)?;
                let name = (d.names.iter().find(|(_, e)| e.ino == cur)).ok_or(ENOENT)?;
                names.push(name.0.to_vec());
                cur = parent;
            }
            Err(ELOOP.into())
        })
    }

    pub fn readlink_ino(&self, ino: u64) -> FsResult<Vec<u8>> {
        self.run_on(ino, |i| i.readlink(ino))
    }
}

impl Inner {
    /// Makes `path` (a symlink when `symlink` holds its target), checked for `cred`
    /// if given: search permission on the walk, then a new name in its directory
    /// (EEXIST first, as on Linux). Made in the directory checked.
    pub(crate) fn make(
        &mut self,
        path: &str,
        ftype: FileType,
        mode: u32,
        symlink: Option<&[u8]>,
        cred: Option<&Cred>,
    ) -> Res<Attr> {
        if is_root(path) {
            return Err(FsError::Errno(libc::EEXIST).into());
        }
        let cred = checked_for_name(path, cred);
        let (parent, name) = self.checked_name(path, cred, Want::Add)?;
        let node = self.own_node(ftype, mode);
        self.make_at(parent, name, node, symlink)
    }

    /// A new node of this client's owner.
    pub(crate) fn own_node(&self, ftype: FileType, mode: u32) -> NewNode {
        NewNode {
            ftype,
            mode,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
        }
    }

    pub(crate) fn make_at(
        &mut self,
        parent: u64,
        name: Vec<u8>,
        node: NewNode,
        symlink: Option<&[u8]>,
    ) -> Res<Attr> {
        let mut page = None;
        if let Some(t) = symlink {
            let (g, _, written) = self.value_page(t)?;
            page = Some((g, t.len() as u32, written));
        }
        let r = self.rpc(MdsRequest::Create(Create {
            parent,
            name,
            ftype: node.ftype,
            mode: node.mode,
            uid: node.uid,
            gid: node.gid,
            rdev: node.rdev,
            symlink: page,
        }));
        match r {
            Ok(ReplyBody::Attr(a)) => Ok(a),
            Ok(other) => Err(io_err(format!("unexpected reply {other:?}")).into()),
            Err(e) => {
                if let (true, Some((g, ..))) = (e.changed_nothing(), page) {
                    self.chunks.give_back(vec![(g, 1)]);
                }
                Err(e)
            }
        }
    }

    pub(crate) fn readlink(&mut self, ino: u64) -> Res<Vec<u8>> {
        let c = self.cache.refresh(&mut self.remote, ino)?;
        let Body::Symlink(Some((gpa, len))) = c.state.body else {
            return Err(EINVAL.into());
        };
        let mut buf = vec![0u8; PAGE_SIZE as usize];
        read_page(self, gpa, &mut buf)?;
        buf.truncate(len as usize);
        Ok(buf)
    }

    pub(crate) fn readdir(&mut self, ino: u64, parent: u64) -> Res<Vec<DirEntry>> {
        let c = self.cache.refresh(&mut self.remote, ino)?;
        let Some(d) = c.state.dir() else {
            return Err(ENOTDIR.into());
        };
        let mut out = vec![
            DirEntry {
                name: b".".to_vec(),
                ino,
                ftype: FileType::Directory,
            },
            DirEntry {
                name: b"..".to_vec(),
                ino: parent,
                ftype: FileType::Directory,
            },
        ];
        for name in d.by_cookie.values() {
            let e = d.names[name];
            out.push(DirEntry {
                name: name.to_vec(),
                ino: e.ino,
                ftype: e.ftype,
            });
        }
        Ok(out)
    }
}
