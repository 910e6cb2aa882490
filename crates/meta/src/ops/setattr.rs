//! setattr: chmod, chown, truncate, utimens. The rules that turn a request into a
//! set-attribute entry are one function that the MDS and every client run.

use orion_format::{attr_mask as m, Entry, FileType, SetAttrRec};

use crate::engine::{MetaEngine, SetAttrReq, TimeSet};
use crate::error::*;
use crate::index::Attr;

/// The set-attribute entry for `req` on an inode with attributes `a` (`has_pages`:
/// a regular file holding data pages), or `None` when nothing changes. The MDS and
/// clients build it with this one function, so both apply the same rules.
pub fn setattr_entry(
    a: &Attr,
    has_pages: bool,
    req: &SetAttrReq,
    now: i64,
) -> FsResult<Option<SetAttrRec>> {
    if req.size.is_some() {
        match a.ftype {
            FileType::Regular => {}
            FileType::Directory => return Err(EISDIR),
            _ => return Err(EINVAL),
        }
    }
    let mut rec = SetAttrRec {
        mask: 0,
        ctime: now,
        ..Default::default()
    };
    let mut touched = false;
    let mut mode = a.mode;
    if let Some(md) = req.mode {
        mode = md & 0o7777;
        rec.mask |= m::MODE;
        touched = true;
    }
    if let Some(uid) = req.uid {
        rec.uid = uid;
        rec.mask |= m::UID;
        touched = true;
    }
    if let Some(gid) = req.gid {
        rec.gid = gid;
        rec.mask |= m::GID;
        touched = true;
    }
    if (req.uid.is_some() || req.gid.is_some()) && a.ftype != FileType::Directory {
        // chown clears setuid, and setgid when group-executable (as Linux does).
        mode = crate::perm::without_setid(mode);
        if mode != a.mode || rec.mask & m::MODE != 0 {
            rec.mask |= m::MODE;
        }
    }
    rec.mode = mode;
    let resolve = |t: TimeSet| match t {
        TimeSet::Now => now,
        TimeSet::At(v) => v,
    };
    if let Some(t) = req.atime {
        rec.atime = resolve(t);
        rec.mask |= m::ATIME;
        touched = true;
    }
    if let Some(t) = req.mtime {
        rec.mtime = resolve(t);
        rec.mask |= m::MTIME;
        touched = true;
    }
    if let Some(size) = req.size {
        if size > crate::MAX_FILE_SIZE {
            return Err(EFBIG);
        }
        // As tmpfs: a size change sets mtime and ctime, and so does a truncation
        // to the same size of a file that holds data pages (it drops page tails).
        if size != a.size || has_pages {
            if size != a.size {
                rec.size = size;
                rec.mask |= m::SIZE;
            }
            if req.mtime.is_none() {
                rec.mtime = now;
                rec.mask |= m::MTIME;
            }
            touched = true;
        }
    }
    if !touched {
        return Ok(None);
    }
    rec.mask |= m::CTIME;
    Ok(Some(rec))
}

impl MetaEngine {
    /// setattr: chmod, chown, truncate, utimens. `pre` are entries the data layer
    /// needs committed with it (the copied last page of a truncation).
    pub fn setattr(&mut self, ino: u64, req: &SetAttrReq, pre: Vec<Entry>) -> FsResult<Attr> {
        let inode = self.inode(ino)?;
        let has_pages = inode.state.file().is_some_and(|f| !f.is_empty());
        let a = inode.state.attr.clone();
        let rec = setattr_entry(&a, has_pages, req, self.clock.now())?;
        if rec.is_none() && pre.is_empty() {
            return Ok(a);
        }
        let mut entries = pre;
        entries.push(Entry::SetAttr(rec.unwrap_or(SetAttrRec {
            mask: m::CTIME,
            ctime: self.clock.now(),
            ..Default::default()
        })));
        let shrinking = req.size.is_some_and(|s| s < a.size);
        self.commit(vec![(ino, entries)], shrinking)?;
        self.getattr(ino)
    }
}
