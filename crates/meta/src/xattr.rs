//! Extended attributes: the rules Linux applies (name and value limits, namespaces,
//! XATTR_CREATE / XATTR_REPLACE), checked against an inode's state by whoever builds
//! the log entry: the local file system, a client before its log commit, and the MDS
//! again before it appends one.
//!
//! A value lives in a data page of its own (as a symlink target does), so values are
//! limited to one page (E2BIG past it, where ext4 would say ENOSPC).

use orion_format::{
    valid_xattr_name, Entry, FileType, Gpa, XattrRec, XATTR_NAME_MAX, XATTR_VALUE_MAX,
};

use crate::error::{FsResult, E2BIG, EEXIST, ENODATA, EOPNOTSUPP, EPERM, ERANGE};
use crate::index::InodeState;

/// The name a file is marked "heavily shared" with (paper §4.3): every client then
/// commits each of its updates conditionally, in the MDS's order. Its presence is the
/// flag; the value is not read.
pub const SHARED_FLAG: &[u8] = b"user.orion.shared";

/// How a set treats an existing name (setxattr's flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetMode {
    /// Create or replace.
    Any,
    /// XATTR_CREATE: EEXIST if the name exists.
    Create,
    /// XATTR_REPLACE: ENODATA if it does not.
    Replace,
}

impl SetMode {
    /// From setxattr(2)'s flags; EINVAL for unknown bits or both at once.
    pub fn from_flags(flags: i32) -> FsResult<SetMode> {
        match flags {
            0 => Ok(SetMode::Any),
            libc::XATTR_CREATE => Ok(SetMode::Create),
            libc::XATTR_REPLACE => Ok(SetMode::Replace),
            _ => Err(crate::error::EINVAL),
        }
    }
}

/// The namespaces stored. `system.*` (POSIX ACLs) is not: ACLs are not supported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Namespace {
    User,
    Trusted,
    Security,
}

/// Checks a name's length: the first check, made before the path is resolved (as
/// the system calls copy the name in first).
pub fn check_len(name: &[u8]) -> FsResult<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(ERANGE);
    }
    Ok(())
}

/// Checks a name's length and namespace.
pub fn namespace(name: &[u8]) -> FsResult<Namespace> {
    check_len(name)?;
    let (ns, prefix) = if name.starts_with(b"user.") {
        (Namespace::User, 5)
    } else if name.starts_with(b"trusted.") {
        (Namespace::Trusted, 8)
    } else if name.starts_with(b"security.") {
        (Namespace::Security, 9)
    } else {
        return Err(EOPNOTSUPP);
    };
    // The prefix alone names nothing.
    if name.len() == prefix || !valid_xattr_name(name) {
        return Err(crate::error::EINVAL);
    }
    Ok(ns)
}

/// Linux allows user.* attributes on regular files and directories only (on others
/// the permission bits mean something else).
fn user_allowed(state: &InodeState) -> bool {
    matches!(state.attr.ftype, FileType::Regular | FileType::Directory)
}

/// Checks a set of `name` with a value of `len` bytes, before any page is written.
pub fn check_set(state: &InodeState, name: &[u8], len: usize, mode: SetMode) -> FsResult<()> {
    let ns = namespace(name)?;
    if len > XATTR_VALUE_MAX {
        return Err(E2BIG);
    }
    if ns == Namespace::User && !user_allowed(state) {
        return Err(EPERM);
    }
    let exists = state.xattrs.contains_key(name);
    match mode {
        SetMode::Create if exists => Err(EEXIST),
        SetMode::Replace if !exists => Err(ENODATA),
        _ => Ok(()),
    }
}

/// The entry that sets `name` to the `len` bytes in page `gpa`.
pub fn set_entry(name: &[u8], gpa: Gpa, len: usize, now: i64) -> Entry {
    Entry::XattrSet(XattrRec {
        gpa,
        len: len as u32,
        ctime: now,
        name: name.to_vec(),
    })
}

/// The entry that removes `name` (ENODATA if it is not there).
pub fn remove_entry(state: &InodeState, name: &[u8], now: i64) -> FsResult<Entry> {
    let ns = namespace(name)?;
    if ns == Namespace::User && !user_allowed(state) {
        return Err(EPERM);
    }
    if !state.xattrs.contains_key(name) {
        return Err(ENODATA);
    }
    Ok(Entry::XattrRemove(XattrRec {
        gpa: Gpa(0),
        len: 0,
        ctime: now,
        name: name.to_vec(),
    }))
}

/// Where `name`'s value is: its page and length (ENODATA if it is not there).
pub fn lookup(state: &InodeState, name: &[u8]) -> FsResult<(Gpa, u32)> {
    namespace(name)?;
    state.xattrs.get(name).copied().ok_or(ENODATA)
}

/// listxattr's answer: every name followed by a NUL, in name order. `visible`
/// filters namespaces the caller may not see (trusted.* for the unprivileged).
pub fn list(state: &InodeState, visible: impl Fn(Namespace) -> bool) -> Vec<u8> {
    let mut out = Vec::new();
    for name in state.xattrs.keys() {
        if namespace(name).is_ok_and(&visible) {
            out.extend_from_slice(name);
            out.push(0);
        }
    }
    out
}

/// Checks what the MDS is asked to append by a client: an xattr entry must be the only
/// entry of its commit, and a removal must name an attribute that is there.
pub fn check_commit(state: &InodeState, e: &Entry) -> FsResult<()> {
    match e {
        Entry::XattrSet(x) => check_set(state, &x.name, x.len as usize, SetMode::Any),
        Entry::XattrRemove(x) => remove_entry(state, &x.name, x.ctime).map(|_| ()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_like_linux() {
        assert_eq!(namespace(b"user.a"), Ok(Namespace::User));
        assert_eq!(namespace(b"trusted.x"), Ok(Namespace::Trusted));
        assert_eq!(namespace(b"security.selinux"), Ok(Namespace::Security));
        assert_eq!(namespace(b"system.posix_acl_access"), Err(EOPNOTSUPP));
        assert_eq!(namespace(b"other.a"), Err(EOPNOTSUPP));
        assert_eq!(namespace(b""), Err(ERANGE));
        assert_eq!(namespace(&[b'u'; 256]), Err(ERANGE));
        assert_eq!(namespace(b"user."), Err(crate::error::EINVAL));
    }

    #[test]
    fn create_replace_and_types() {
        let mut f = InodeState::new(5, FileType::Regular, 1);
        let mut freed = Vec::new();
        assert_eq!(check_set(&f, b"user.a", 10, SetMode::Replace), Err(ENODATA));
        assert_eq!(
            check_set(&f, b"user.a", XATTR_VALUE_MAX + 1, SetMode::Any),
            Err(E2BIG)
        );
        f.apply(&set_entry(b"user.a", Gpa(7), 3, 1), &mut freed)
            .unwrap();
        assert_eq!(check_set(&f, b"user.a", 10, SetMode::Create), Err(EEXIST));
        assert_eq!(check_set(&f, b"user.a", 10, SetMode::Replace), Ok(()));
        assert_eq!(lookup(&f, b"user.a"), Ok((Gpa(7), 3)));
        f.apply(&set_entry(b"user.a", Gpa(8), 4, 2), &mut freed)
            .unwrap();
        assert_eq!(freed, vec![Gpa(7)], "a replaced value's page is released");
        f.apply(&set_entry(b"trusted.b", Gpa(9), 0, 3), &mut freed)
            .unwrap();
        assert_eq!(list(&f, |_| true), b"trusted.b\0user.a\0".to_vec());
        assert_eq!(
            list(&f, |ns| ns != Namespace::Trusted),
            b"user.a\0".to_vec()
        );
        let rm = remove_entry(&f, b"user.a", 4).unwrap();
        f.apply(&rm, &mut freed).unwrap();
        assert_eq!(lookup(&f, b"user.a"), Err(ENODATA));
        assert_eq!(remove_entry(&f, b"user.a", 5), Err(ENODATA));
        assert_eq!(f.attr.ctime, 4);
        let link = InodeState::new(6, FileType::Symlink, 1);
        assert_eq!(check_set(&link, b"user.a", 1, SetMode::Any), Err(EPERM));
        assert_eq!(check_set(&link, b"trusted.a", 1, SetMode::Any), Ok(()));
    }
}
