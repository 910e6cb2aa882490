//! Permission checks as Linux makes them (mode bits of the owner, the group or
//! others; supplementary groups; sticky directories; who may chmod, chown and set
//! times), for front ends that serve other users' processes: the FUSE mount checks
//! every request here instead of leaving it to the kernel.

use crate::engine::{SetAttrReq, TimeSet};
use crate::error::{FsResult, EACCES, EPERM};
use crate::index::Attr;
use orion_format::FileType;

pub const MAY_READ: u32 = 4;
pub const MAY_WRITE: u32 = 2;
pub const MAY_EXEC: u32 = 1;

/// Who is asking: uid, primary gid, and a membership test for supplementary groups
/// (asked only when the answer matters, since finding them can cost a /proc read).
pub struct Cred<'a> {
    pub uid: u32,
    pub gid: u32,
    pub in_group: &'a dyn Fn(u32) -> bool,
}

impl Cred<'_> {
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether the caller is in group `gid` (primary or supplementary).
    pub fn member(&self, gid: u32) -> bool {
        self.gid == gid || (self.in_group)(gid)
    }
}

/// Checks `mask` (MAY_* bits) on `a`. Root passes, except that executing needs some
/// execute bit on anything but a directory (CAP_DAC_OVERRIDE's rule).
pub fn check(a: &Attr, cred: &Cred, mask: u32) -> FsResult<()> {
    if cred.is_root() {
        if mask & MAY_EXEC != 0 && a.ftype != FileType::Directory && a.mode & 0o111 == 0 {
            return Err(EACCES);
        }
        return Ok(());
    }
    let bits = if cred.uid == a.uid {
        a.mode >> 6
    } else if cred.member(a.gid) {
        a.mode >> 3
    } else {
        a.mode
    } & 7;
    if bits & mask == mask {
        Ok(())
    } else {
        Err(EACCES)
    }
}

/// Removing or renaming `victim` out of `dir`: write and search permission on the
/// directory, and in a sticky directory, ownership of the file or the directory.
pub fn check_delete(dir: &Attr, victim: &Attr, cred: &Cred) -> FsResult<()> {
    check(dir, cred, MAY_WRITE | MAY_EXEC)?;
    if dir.mode & libc::S_ISVTX != 0
        && !cred.is_root()
        && cred.uid != dir.uid
        && cred.uid != victim.uid
    {
        return Err(EPERM);
    }
    Ok(())
}

/// The mode a write or truncation by a process without `CAP_FSETID` leaves, as
/// Linux does: setuid goes, and setgid with it when group-execute is set (without
/// group-execute it marks mandatory locking, and stays). Otherwise an unprivileged
/// writer could plant code in a setuid program.
pub fn without_setid(mode: u32) -> u32 {
    let mut m = mode & !libc::S_ISUID;
    if m & libc::S_IXGRP != 0 {
        m &= !libc::S_ISGID;
    }
    m
}

/// Checks a setattr and returns it as it may be applied: a chmod by a caller outside
/// the file's group drops the setgid bit, as Linux does. `opened_for_write` says a
/// truncation comes through a file handle opened for writing (ftruncate).
pub fn check_setattr(
    a: &Attr,
    req: &SetAttrReq,
    cred: &Cred,
    opened_for_write: bool,
) -> FsResult<SetAttrReq> {
    let mut req = req.clone();
    let owner = cred.is_root() || cred.uid == a.uid;
    if let Some(mode) = req.mode {
        // A truncation's mode that only drops the setid bits is the kernel killing
        // them for an unprivileged writer (FUSE sends it with the size): allowed to
        // whoever may truncate.
        let kills_setid = mode & 0o7777 == without_setid(a.mode & 0o7777)
            && mode & 0o7777 != a.mode & 0o7777
            && req.size.is_some();
        if !owner && !kills_setid {
            return Err(EPERM);
        }
        let gid = req.gid.unwrap_or(a.gid);
        if !cred.is_root() && !cred.member(gid) {
            req.mode = Some(mode & !libc::S_ISGID);
        }
    }
    // As Linux's chown_ok and chgrp_ok: a caller other than root names an owner
    // only as the owner, and the same one; a group only as the owner, and one it is
    // in or the file's own.
    let is_owner = cred.uid == a.uid;
    if req.uid.is_some_and(|u| !(is_owner && u == a.uid)) && !cred.is_root() {
        return Err(EPERM);
    }
    if let Some(gid) = req.gid {
        let may = is_owner && (gid == a.gid || cred.member(gid));
        if !may && !cred.is_root() {
            return Err(EPERM);
        }
    }
    if req.size.is_some() && !opened_for_write {
        check(a, cred, MAY_WRITE)?;
    }
    let times = [req.atime, req.mtime];
    if times.iter().any(|t| t.is_some()) && !owner {
        // Setting both to "now" needs only write permission; anything else, ownership.
        if times.iter().all(|t| matches!(t, Some(TimeSet::Now))) {
            check(a, cred, MAY_WRITE)?;
        } else {
            return Err(EPERM);
        }
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unprivileged_write_drops_setuid_and_executable_setgid() {
        assert_eq!(without_setid(0o4777), 0o777);
        assert_eq!(without_setid(0o6755), 0o755);
        assert_eq!(without_setid(0o2745), 0o2745, "setgid without g+x stays");
        assert_eq!(without_setid(0o1777), 0o1777, "sticky stays");
        let a = attr(FileType::Regular, 0o4777, 1, 1);
        let nobody = Cred {
            uid: 65534,
            gid: 65534,
            in_group: &|_| false,
        };
        let kill = SetAttrReq {
            mode: Some(0o777),
            size: Some(0),
            ..Default::default()
        };
        assert!(check_setattr(&a, &kill, &nobody, false).is_ok());
        let chmod = SetAttrReq {
            mode: Some(0o777),
            ..Default::default()
        };
        assert_eq!(check_setattr(&a, &chmod, &nobody, false).err(), Some(EPERM));
        let more = SetAttrReq {
            mode: Some(0o776),
            size: Some(0),
            ..Default::default()
        };
        assert_eq!(check_setattr(&a, &more, &nobody, false).err(), Some(EPERM));
    }

    /// Linux's chown_ok and chgrp_ok: naming the owner or group a file has already
    /// is still a chown, the owner's (or root's) alone to make.
    #[test]
    fn only_the_owner_names_an_owner_or_group_even_the_same_one() {
        let f = attr(FileType::Regular, 0o644, 10, 50);
        let chown = |uid, gid| SetAttrReq {
            uid,
            gid,
            ..Default::default()
        };
        let owner = Cred {
            uid: 10,
            gid: 1,
            in_group: IN_50,
        };
        let other = Cred {
            uid: 12,
            gid: 50,
            in_group: IN_50,
        };
        for req in [chown(Some(10), None), chown(None, Some(50))] {
            assert!(check_setattr(&f, &req, &owner, false).is_ok());
            assert_eq!(check_setattr(&f, &req, &other, false).err(), Some(EPERM));
        }
        assert_eq!(
            check_setattr(&f, &chown(Some(12), None), &owner, false).err(),
            Some(EPERM)
        );
        assert_eq!(
            check_setattr(&f, &chown(None, Some(7)), &owner, false).err(),
            Some(EPERM)
        );
        assert!(check_setattr(&f, &chown(None, None), &other, false).is_ok());
    }

    fn attr(ftype: FileType, mode: u32, uid: u32, gid: u32) -> Attr {
        let mut a = crate::index::InodeState::new(2, ftype, 1).attr;
        a.mode = mode;
        a.uid = uid;
        a.gid = gid;
        a
    }
    const NONE: &dyn Fn(u32) -> bool = &|_| false;
    const IN_50: &dyn Fn(u32) -> bool = &|g| g == 50;

    #[test]
    fn classes_and_groups() {
        let f = attr(FileType::Regular, 0o640, 10, 50);
        let owner = Cred {
            uid: 10,
            gid: 1,
            in_group: NONE,
        };
        let member = Cred {
            uid: 11,
            gid: 1,
            in_group: IN_50,
        };
        let other = Cred {
            uid: 12,
            gid: 1,
            in_group: NONE,
        };
        let root = Cred {
            uid: 0,
            gid: 0,
            in_group: NONE,
        };
        assert_eq!(check(&f, &owner, MAY_READ | MAY_WRITE), Ok(()));
        assert_eq!(check(&f, &member, MAY_READ), Ok(()));
        assert_eq!(check(&f, &member, MAY_WRITE), Err(EACCES));
        assert_eq!(check(&f, &other, MAY_READ), Err(EACCES));
        assert_eq!(check(&f, &root, MAY_WRITE), Ok(()));
        assert_eq!(check(&f, &root, MAY_EXEC), Err(EACCES));
        // The owner class decides even when it grants less than the others get.
        let odd = attr(FileType::Regular, 0o066, 10, 50);
        assert_eq!(check(&odd, &owner, MAY_READ), Err(EACCES));
    }

    #[test]
    fn sticky_and_setattr() {
        let dir = attr(FileType::Directory, 0o1777, 0, 0);
        let theirs = attr(FileType::Regular, 0o666, 20, 20);
        let me = Cred {
            uid: 10,
            gid: 10,
            in_group: NONE,
        };
        assert_eq!(check_delete(&dir, &theirs, &me), Err(EPERM));
        let mine = attr(FileType::Regular, 0o666, 10, 10);
        assert_eq!(check_delete(&dir, &mine, &me), Ok(()));
        let chmod = SetAttrReq {
            mode: Some(0o2755),
            ..Default::default()
        };
        assert_eq!(check_setattr(&theirs, &chmod, &me, false), Err(EPERM));
        let g50 = attr(FileType::Regular, 0o644, 10, 50);
        assert_eq!(
            check_setattr(&g50, &chmod, &me, false).unwrap().mode,
            Some(0o755)
        );
        let chown = SetAttrReq {
            uid: Some(11),
            ..Default::default()
        };
        assert_eq!(check_setattr(&mine, &chown, &me, false), Err(EPERM));
        let chgrp = SetAttrReq {
            gid: Some(50),
            ..Default::default()
        };
        assert_eq!(check_setattr(&mine, &chgrp, &me, false), Err(EPERM));
        let touch = SetAttrReq {
            atime: Some(TimeSet::Now),
            mtime: Some(TimeSet::Now),
            ..Default::default()
        };
        assert_eq!(
            check_setattr(&theirs, &touch, &me, false).map(|_| ()),
            Ok(())
        );
        let set = SetAttrReq {
            mtime: Some(TimeSet::At(5)),
            ..Default::default()
        };
        assert_eq!(check_setattr(&theirs, &set, &me, false), Err(EPERM));
        let trunc = SetAttrReq {
            size: Some(0),
            ..Default::default()
        };
        let ro = attr(FileType::Regular, 0o644, 20, 20);
        assert_eq!(check_setattr(&ro, &trunc, &me, false), Err(EACCES));
        assert!(check_setattr(&ro, &trunc, &me, true).is_ok());
    }
}
