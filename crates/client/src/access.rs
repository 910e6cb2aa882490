//! Access checks for callers other than root, made by a front-end before it serves
//! a call: the rules are Linux's (`orion_meta::perm`); this module applies them to
//! what a call touches. The FUSE mount asks by inode (the kernel walked the path,
//! asking `lookup` with search permission); the preload library asks by path, and
//! every directory the walk looks in needs search permission.
//!
//! A check and the call it guards are two steps, as in any FUSE file system: a
//! change another client makes between them (a chmod) counts from the next call.
//! Root passes every check but executing a file without execute bits, and its
//! checks read no attributes.

use orion_format::FileType;
use orion_meta::perm::{self, Cred, MAY_EXEC, MAY_READ, MAY_WRITE};
use orion_meta::{Attr, FsError, FsResult, RenameMode, SetAttrReq};

use crate::fs::paths::is_root;
use crate::fs::Inner;
use crate::remote::{Fail, Res};
use crate::Client;

/// What a call by path does with its final name (see [`Inner::checked_name`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Want {
    /// A new name in the path's directory (mkdir, mknod, symlink, a created file).
    Add,
    /// Removing the path's name (unlink, rmdir).
    Remove,
}

/// The caller a call checks for: none for root, who passes every check but
/// executing.
pub(crate) fn checked<'a, 'b>(cred: Option<&'a Cred<'b>>) -> Option<&'a Cred<'b>> {
    cred.filter(|c| !c.is_root())
}

/// [`checked`] for a call that adds or removes the name of `path`: the file
/// system's root has none, and the call answers (EEXIST, EISDIR, EBUSY) unchecked,
/// as on the mount.
pub(crate) fn checked_for_name<'a, 'b>(
    path: &str,
    cred: Option<&'a Cred<'b>>,
) -> Option<&'a Cred<'b>> {
    checked(cred).filter(|_| !is_root(path))
}

/// Whether the host protects hard links (`fs.protected_hardlinks`, on unless the
/// host says 0), read once.
fn protected_hardlinks() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/fs/protected_hardlinks")
            .map_or(true, |s| s.trim() != "0")
    })
}

/// Whether directory `dir` is `ancestor` or lies below it.
fn within(i: &mut Inner, mut dir: u64, ancestor: u64) -> Res<bool> {
    loop {
        if dir == ancestor {
            return Ok(true);
        }
        if dir == orion_meta::ROOT_INO {
            return Ok(false);
        }
        dir = i.parent(dir)?;
    }
}

impl Inner {
    /// The walk of a call that adds (`Want::Add`) or removes (`Want::Remove`) the
    /// name of `path`, checked for `cred` if given: the directory and the name the
    /// call then acts on, with no second walk.
    pub(crate) fn checked_name(
        &mut self,
        path: &str,
        cred: Option<&Cred>,
        want: Want,
    ) -> Res<(u64, Vec<u8>)> {
        let (dir, name) = self.resolve_parent_as(path, cred)?;
        let Some(cred) = cred else {
            return Ok((dir, name));
        };
        match want {
            Want::Add => self.may_make(dir, &name, cred)?,
            Want::Remove => {
                let victim = self.lookup(dir, &name)?;
                let (d, v) = (self.getattr(dir)?, self.getattr(victim)?);
                perm::check_delete(&d, &v, cred)?;
            }
        }
        Ok((dir, name))
    }

    /// What a setattr of `ino` by `cred` may apply (`perm::check_setattr`: a chown
    /// may drop the setid bits too). Truncating a directory is EISDIR whoever asks
    /// (Linux's order).
    pub(crate) fn checked_setattr(
        &mut self,
        ino: u64,
        req: &SetAttrReq,
        cred: &Cred,
    ) -> Res<SetAttrReq> {
        let a = self.getattr(ino)?;
        if req.size.is_some() && a.ftype == FileType::Directory {
            return Err(FsError::Errno(libc::EISDIR).into());
        }
        Ok(perm::check_setattr(&a, req, cred, false)?)
    }

    /// Whether `cred` may make `name` in directory `dir`: write and search
    /// permission, unless the name exists (the call's EEXIST, which Linux finds
    /// first; or, for an open, a symlink the call follows).
    pub(crate) fn may_make(&mut self, dir: u64, name: &[u8], cred: &Cred) -> Res<()> {
        match self.lookup(dir, name) {
            Err(Fail::Fs(FsError::Errno(libc::ENOENT))) => Ok(perm::check(
                &self.getattr(dir)?,
                cred,
                MAY_WRITE | MAY_EXEC,
            )?),
            Err(e) => Err(e),
            Ok(_) => Ok(()),
        }
    }
}

/// Extended attributes, in the order Linux's VFS checks them (before the file
/// system judges the name): trusted.* is root's, and others neither see nor read
/// it; security.* is left to the file system; user.* lives on regular files and
/// directories only, and on a sticky directory is its owner's alone to write; then
/// the inode's read or write permission.
fn xattr_allowed(a: &Attr, cred: &Cred, name: &[u8], write: bool) -> FsResult<()> {
    let refused = |e| match write {
        true => Err(FsError::Errno(libc::EPERM)),
        false => Err(FsError::Errno(e)),
    };
    // security.* is the security modules' (changing it takes CAP_SYS_ADMIN);
    // system.* is the file system's to answer (it keeps none: EOPNOTSUPP).
    if cred.is_root() || name.starts_with(b"system.") {
        return Ok(());
    }
    if name.starts_with(b"security.") {
        return match write {
            true => Err(FsError::Errno(libc::EPERM)),
            false => Ok(()),
        };
    }
    if name.starts_with(b"trusted.") {
        return refused(libc::ENODATA);
    }
    if name.starts_with(b"user.") {
        let dir = a.ftype == FileType::Directory;
        if !dir && a.ftype != FileType::Regular {
            return refused(libc::ENODATA);
        }
        if dir && a.mode & libc::S_ISVTX != 0 && write && a.uid != cred.uid {
            return Err(FsError::Errno(libc::EPERM));
        }
    }
    let mask = if write { MAY_WRITE } else { MAY_READ };
    perm::check(a, cred, mask)
}

impl Inner {
    /// Whether `cred` may rename name `on` of directory `op` to `nn` of `np` (both
    /// found by walks checked for it): both names removable (or the new one
    /// addable), and a directory moving to another parent writable (its ".."
    /// changes). The call's own errors come first: they pass here.
    pub(crate) fn check_rename(
        &mut self,
        (op, on): (u64, &[u8]),
        (np, nn): (u64, &[u8]),
        cred: &Cred,
        mode: RenameMode,
    ) -> Res<()> {
        let i = self;
        let inos = (i.lookup(op, on)?, i.lookup(np, nn));
        // A name renamed onto itself, or onto another link of its inode, is
        // done before any check (Linux's vfs_rename).
        if inos.1.as_ref().is_ok_and(|&new| new == inos.0) {
            return Ok(());
        }
        // The call's own errors come before any check: a name that exists under
        // RENAME_NOREPLACE (EEXIST), a missing one under RENAME_EXCHANGE (ENOENT).
        match (mode, &inos.1) {
            (RenameMode::NoReplace, Ok(_)) | (RenameMode::Exchange, Err(_)) => return Ok(()),
            _ => {}
        }
        let src = i.getattr(inos.0)?;
        let dst = match &inos.1 {
            Ok(ino) => Some(i.getattr(*ino)?),
            Err(_) => None,
        };
        // A directory moved into itself (EINVAL), or onto a directory that holds
        // it (ENOTEMPTY): the call's errors too.
        let is_dir = |a: &Attr| a.ftype == FileType::Directory;
        if (is_dir(&src) && within(i, np, src.ino)?)
            || (dst.as_ref()).is_some_and(|d| is_dir(d) && d.ino != src.ino)
                && within(i, op, dst.as_ref().map_or(0, |d| d.ino))?
        {
            return Ok(());
        }
        let (od, nd) = (i.getattr(op)?, i.getattr(np)?);
        perm::check_delete(&od, &src, cred)?;
        match (&dst, inos.1) {
            (Some(dst), _) => {
                perm::check_delete(&nd, dst, cred)?;
                // As Linux's may_delete of the target: the kinds must agree
                // (an exchange swaps any two).
                if mode != RenameMode::Exchange {
                    match (is_dir(&src), is_dir(dst)) {
                        (true, false) => return Err(FsError::Errno(libc::ENOTDIR).into()),
                        (false, true) => return Err(FsError::Errno(libc::EISDIR).into()),
                        _ => {}
                    }
                }
            }
            (None, Err(Fail::Fs(FsError::Errno(libc::ENOENT)))) => {
                perm::check(&nd, cred, MAY_WRITE | MAY_EXEC)?
            }
            (None, Err(e)) => return Err(e),
            (None, Ok(_)) => unreachable!("an existing target's attributes were read"),
        }
        if op != np {
            moved_dirs_writable(&src, dst.as_ref(), cred, mode)?;
        }
        Ok(())
    }

    /// Whether `cred` may link inode `ino` as `name` in `dir` (both found by walks
    /// checked for it), in Linux's order: an existing name (the call's EEXIST), `protected_hardlinks` (Debian's default:
    /// only the owner links a file, or a caller who may read and write a regular
    /// file that runs as nobody else), then a new name in `new`'s directory.
    pub(crate) fn check_link(
        &mut self,
        ino: u64,
        (dir, name): (u64, &[u8]),
        cred: &Cred,
    ) -> Res<()> {
        let i = self;
        if i.lookup(dir, name).is_ok() {
            return Ok(());
        }
        let a = i.getattr(ino)?;
        // Runs as somebody else: a bit a write by another would drop.
        let setid = perm::without_setid(a.mode & 0o7777) != a.mode & 0o7777;
        let safe = a.ftype == FileType::Regular
            && !setid
            && perm::check(&a, cred, MAY_READ | MAY_WRITE).is_ok();
        if protected_hardlinks() && a.uid != cred.uid && !safe {
            return Err(FsError::Errno(libc::EPERM).into());
        }
        Ok(perm::check(&i.getattr(dir)?, cred, MAY_WRITE | MAY_EXEC)?)
    }
}

impl Client {
    /// The mode a file (not a directory) made at `path` by `cred` gets: in a setgid
    /// directory the file takes the directory's group, and a caller outside that
    /// group does not get a setgid file of it (Linux's mode_strip_sgid).
    pub fn creation_mode(&self, path: &str, cred: &Cred, mode: u32) -> FsResult<u32> {
        let wants = libc::S_ISGID | libc::S_IXGRP;
        if cred.is_root() || mode & wants != wants || is_root(path) {
            return Ok(mode);
        }
        let dir = self.run(|i| {
            let (dir, _) = i.resolve_parent(path)?;
            i.getattr(dir)
        })?;
        Ok(
            match dir.mode & libc::S_ISGID != 0 && !cred.member(dir.gid) {
                true => mode & !libc::S_ISGID,
                false => mode,
            },
        )
    }

    /// Whether `cred` may access inode `ino` as `mask` asks (root: no attribute read
    /// unless executing).
    pub fn may(&self, cred: &Cred, ino: u64, mask: u32) -> FsResult<()> {
        if cred.is_root() && mask & MAY_EXEC == 0 {
            return Ok(());
        }
        perm::check(&self.getattr(ino)?, cred, mask)
    }

    /// Adding a name to directory `parent`: write and search permission.
    pub fn may_add(&self, cred: &Cred, parent: u64) -> FsResult<()> {
        if cred.is_root() {
            return Ok(());
        }
        self.may(cred, parent, MAY_WRITE | MAY_EXEC)
    }

    /// Removing `name` from `parent` (the sticky rule included); the victim's
    /// attributes when they were read (never for root).
    pub fn may_remove(&self, cred: &Cred, parent: u64, name: &[u8]) -> FsResult<Option<Attr>> {
        if cred.is_root() {
            return Ok(None);
        }
        let victim = self.lookup(parent, name)?;
        let dir = self.getattr(parent)?;
        perm::check_delete(&dir, &victim, cred)?;
        Ok(Some(victim))
    }

    /// Renaming `on` in `op` to `nn` in `np`, for the mount (the kernel found the
    /// names; calls by path check in their walk: `Inner::check_rename`).
    pub fn may_rename(
        &self,
        cred: &Cred,
        (op, on): (u64, &[u8]),
        (np, nn): (u64, &[u8]),
        mode: RenameMode,
    ) -> FsResult<()> {
        let src = self.may_remove(cred, op, on)?;
        let dst = match self.may_remove(cred, np, nn) {
            Ok(d) => d,
            Err(FsError::Errno(libc::ENOENT)) => {
                self.may_add(cred, np)?;
                None
            }
            Err(e) => return Err(e),
        };
        match (src, op != np && !cred.is_root()) {
            (Some(src), true) => moved_dirs_writable(&src, dst.as_ref(), cred, mode),
            _ => Ok(()),
        }
    }

    /// An extended attribute of `ino` read or written; its attributes, which every
    /// caller's check read.
    pub fn may_xattr(&self, cred: &Cred, ino: u64, name: &[u8], write: bool) -> FsResult<Attr> {
        let a = self.getattr(ino)?;
        xattr_allowed(&a, cred, name, write)?;
        Ok(a)
    }

    /// A setattr of `ino`, as it may be applied (`perm::check_setattr`).
    pub fn may_setattr(
        &self,
        cred: &Cred,
        ino: u64,
        req: &SetAttrReq,
        opened_for_write: bool,
    ) -> FsResult<SetAttrReq> {
        if cred.is_root() {
            return Ok(req.clone());
        }
        perm::check_setattr(&self.getattr(ino)?, req, cred, opened_for_write)
    }
}

/// A directory that changes parent rewrites its "..": it must be writable (with an
/// exchange, the other side moves too).
fn moved_dirs_writable(
    src: &Attr,
    dst: Option<&Attr>,
    cred: &Cred,
    mode: RenameMode,
) -> FsResult<()> {
    let mut moved = vec![src];
    if mode == RenameMode::Exchange {
        moved.extend(dst);
    }
    for a in moved {
        if a.ftype == FileType::Directory {
            perm::check(a, cred, MAY_WRITE)?;
        }
    }
    Ok(())
}
