//! Path resolution: a path's components looked up one directory at a time in
//! current copies of the directories (each checked against its MDS tail), symlinks
//! followed as Linux does.

use orion_format::{FileType, NAME_MAX};
use orion_meta::error::{EINVAL, ELOOP, ENAMETOOLONG, ENOENT, ENOTDIR};
use orion_meta::perm::{self, Cred};
use orion_meta::{FsError, FsResult, ROOT_INO};
use orion_proto::{MdsRequest, ReplyBody};

use super::*;
use crate::remote::{io_err, Res};

/// Symlinks followed while resolving one path (as Linux's MAXSYMLINKS).
pub(crate) const MAX_SYMLINKS: usize = 40;

/// A host path that leaves this file system ([`crate::ClientConfig::host_paths`]).
pub(crate) const LEAVES_FS: FsError = FsError::Errno(libc::EXDEV);

/// rename/unlink of "/" itself.
pub(crate) const EBUSY_ROOT: FsError = FsError::Errno(libc::EBUSY);

/// A path split into its components.
pub(crate) fn components(path: &str) -> FsResult<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for c in path.as_bytes().split(|&b| b == b'/') {
        if c.is_empty() || c == b"." {
            continue;
        }
        out.push(c.to_vec());
    }
    Ok(out)
}

/// Whether the last name of `path` is "." (`Some(false)`) or ".." (`Some(true)`):
/// a path that names a directory by itself, with no name in it to add or remove.
pub(crate) fn dot_last(path: &str) -> Option<bool> {
    match path.trim_end_matches('/').rsplit('/').next()? {
        "." if !is_root(path) => Some(false),
        ".." => Some(true),
        _ => None,
    }
}

/// Whether `path` names the root, which exists (EEXIST to a call that would make
/// it) and cannot be removed.
pub(crate) fn is_root(path: &str) -> bool {
    path.split('/').all(|c| c.is_empty() || c == ".")
}

/// A name as one path component: not empty, no '/', at most NAME_MAX bytes.
pub(crate) fn check_name(name: &[u8]) -> FsResult<()> {
    if name.is_empty() || name.contains(&b'/') {
        return Err(EINVAL);
    }
    if name.len() > NAME_MAX {
        return Err(ENAMETOOLONG);
    }
    Ok(())
}

impl Inner {
    pub(crate) fn lookup(&mut self, parent: u64, name: &[u8]) -> Res<u64> {
        if name.len() > NAME_MAX {
            return Err(ENAMETOOLONG.into());
        }
        let c = self.cache.refresh(&mut self.remote, parent)?;
        let Some(d) = c.state.dir() else {
            return Err(ENOTDIR.into());
        };
        match name {
            b"." => Ok(parent),
            b".." => self.parent(parent),
            _ => d.names.get(name).map(|e| e.ino).ok_or(ENOENT.into()),
        }
    }

    pub(crate) fn parent(&mut self, dir: u64) -> Res<u64> {
        if dir == ROOT_INO {
            return Ok(ROOT_INO);
        }
        match self.rpc(MdsRequest::Parent { ino: dir })? {
            ReplyBody::Ino(p) => Ok(p),
            other => Err(io_err(format!("unexpected reply {other:?}")).into()),
        }
    }

    /// Resolves a path from the root: the inode and its parent directory. Symlinks
    /// are followed, the last one only when `follow_last`.
    pub(crate) fn resolve(&mut self, path: &str, follow_last: bool) -> Res<(u64, u64)> {
        self.resolve_as(path, follow_last, None)
    }

    /// [`Inner::resolve`] for the caller `searcher`, if given: it must have search
    /// permission on every directory looked in, as Linux asks (`crate::access`).
    pub(crate) fn resolve_as(
        &mut self,
        path: &str,
        follow_last: bool,
        searcher: Option<&Cred>,
    ) -> Res<(u64, u64)> {
        let mut todo = components(path)?;
        todo.reverse();
        let mut stack = vec![ROOT_INO];
        let mut links = 0;
        let mut cur = ROOT_INO;
        while let Some(name) = todo.pop() {
            let dir = *stack.last().expect("root stays");
            let c = self.cache.refresh(&mut self.remote, dir)?;
            let Some(d) = c.state.dir() else {
                return Err(ENOTDIR.into());
            };
            if let Some(cred) = searcher {
                perm::check(&c.state.attr, cred, perm::MAY_EXEC)?;
            }
            if name == b".." {
                if stack.len() > 1 {
                    stack.pop();
                } else if self.host_paths {
                    return Err(LEAVES_FS.into());
                }
                cur = *stack.last().expect("root stays");
                continue;
            }
            // As Linux: a name is too long only once its directory is known to be one.
            if name.len() > NAME_MAX {
                return Err(ENAMETOOLONG.into());
            }
            let ent = *d.names.get(name.as_slice()).ok_or(ENOENT)?;
            let last = todo.is_empty();
            if ent.ftype == FileType::Symlink && (!last || follow_last) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(ELOOP.into());
                }
                let target = self.readlink(ent.ino)?;
                let target = String::from_utf8_lossy(&target).into_owned();
                if target.starts_with('/') {
                    if self.host_paths {
                        return Err(LEAVES_FS.into());
                    }
                    stack.truncate(1);
                }
                let mut more = components(&target)?;
                more.reverse();
                todo.extend(more);
                cur = *stack.last().expect("root stays");
                continue;
            }
            if last {
                return Ok((ent.ino, dir));
            }
            stack.push(ent.ino);
            cur = ent.ino;
        }
        let parent = if stack.len() > 1 {
            stack[stack.len() - 2]
        } else {
            ROOT_INO
        };
        Ok((cur, parent))
    }

    /// The directory that would hold `path`'s last component, and that name.
    pub(crate) fn resolve_parent(&mut self, path: &str) -> Res<(u64, Vec<u8>)> {
        self.resolve_parent_as(path, None)
    }

    /// [`Inner::resolve_parent`] for the caller `searcher`, if given (see
    /// [`Inner::resolve_as`]), who must be able to search the directory found too.
    pub(crate) fn resolve_parent_as(
        &mut self,
        path: &str,
        searcher: Option<&Cred>,
    ) -> Res<(u64, Vec<u8>)> {
        let mut comps = components(path)?;
        let Some(name) = comps.pop() else {
            return Err(EBUSY_ROOT.into());
        };
        if name == b".." {
            return Err(EINVAL.into());
        }
        let dir_path = comps
            .iter()
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect::<Vec<_>>()
            .join("/");
        let (dir, _) = self.resolve_as(&dir_path, true, searcher)?;
        let c = self.cache.refresh(&mut self.remote, dir)?;
        if c.state.dir().is_none() {
            return Err(ENOTDIR.into());
        }
        // The caller looks the name up in it next: that needs search permission.
        if let Some(cred) = searcher {
            perm::check(&c.state.attr, cred, perm::MAY_EXEC)?;
        }
        Ok((dir, name))
    }
}
