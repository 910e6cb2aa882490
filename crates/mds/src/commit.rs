//! Log commits (paper §4.3): a client sends entries for one inode; the MDS checks them,
//! appends them to the authoritative log in its own order (copy, persist, one atomic
//! tail store) and answers with the tail before and after, from which the client
//! tells whether its cached copy of the log is still in step.
//!
//! In strong mode (paper §5.3) the commit of a write waits until the data stores have
//! reported its pages persisted; the waiting commit is parked, not refused.

use orion_format::{attr_mask, Entry, FileType, Gpa, PAGE_SIZE};
use orion_meta::error::{EINVAL, EISDIR, ESTALE};
use orion_meta::{xattr, FsError, FsResult, MetaEngine, MAX_FILE_SIZE};
use orion_proto::Commit;

use crate::chunks::ChunkGrants;

/// Most data pages one log commit may name (a client commits long writes in pieces).
pub const MAX_COMMIT_PAGES: u64 = 1 << 16;

/// Checks what a client may commit, and returns the data pages the entries name.
pub fn check(engine: &MetaEngine, grants: &ChunkGrants, c: &Commit) -> FsResult<Vec<(Gpa, u64)>> {
    let attr = engine.getattr(c.ino)?;
    if attr.generation != c.generation {
        return Err(ESTALE);
    }
    if c.entries.is_empty() {
        return Err(FsError::Io("a log commit without entries".into()));
    }
    let mut pages: Vec<(Gpa, u64)> = Vec::new();
    let mut total = 0u64;
    for e in &c.entries {
        match e {
            Entry::Write(w) => {
                match attr.ftype {
                    FileType::Regular => {}
                    FileType::Directory => return Err(EISDIR),
                    _ => return Err(EINVAL),
                }
                let end = w
                    .pgoff
                    .checked_add(w.npages as u64)
                    .and_then(|p| p.checked_mul(PAGE_SIZE));
                if w.npages == 0 || end.is_none_or(|e| e > MAX_FILE_SIZE + PAGE_SIZE) {
                    return Err(EINVAL);
                }
                if w.size > MAX_FILE_SIZE {
                    return Err(orion_meta::error::EFBIG);
                }
                total += w.npages as u64;
                if total > MAX_COMMIT_PAGES {
                    return Err(FsError::Io(format!(
                        "a commit of more than {MAX_COMMIT_PAGES} pages"
                    )));
                }
                grants.check(w.gpa, w.npages as u64)?;
                // The same page twice in one commit would be committed twice.
                for &(g, n) in &pages {
                    let overlap = g.group() == w.gpa.group()
                        && g.page() < w.gpa.page() + w.npages as u64
                        && w.gpa.page() < g.page() + n;
                    if overlap {
                        return Err(FsError::Io("a commit names one page twice".into()));
                    }
                }
                pages.push((w.gpa, w.npages as u64));
            }
            Entry::SetAttr(a) => {
                if a.mask & !attr_mask::ALL != 0 || a.mode & !0o7777 != 0 {
                    return Err(EINVAL);
                }
                if a.mask & attr_mask::SIZE != 0 {
                    if attr.ftype != FileType::Regular {
                        return Err(if attr.ftype == FileType::Directory {
                            EISDIR
                        } else {
                            EINVAL
                        });
                    }
                    if a.size > MAX_FILE_SIZE {
                        return Err(orion_meta::error::EFBIG);
                    }
                }
            }
            Entry::Hole { pgoff, npages, .. } => {
                if attr.ftype != FileType::Regular {
                    return Err(EINVAL);
                }
                if pgoff
                    .checked_add(*npages)
                    .is_none_or(|e| e > MAX_FILE_SIZE / PAGE_SIZE + 1)
                {
                    return Err(EINVAL);
                }
            }
            Entry::XattrSet(_) | Entry::XattrRemove(_) => {
                // Checked against the inode as it is now, so each must commit alone.
                if c.entries.len() != 1 {
                    return Err(FsError::Io(
                        "an extended-attribute entry shares its commit".into(),
                    ));
                }
                xattr::check_commit(&engine.inode(c.ino)?.state, e)?;
                if let Entry::XattrSet(x) = e {
                    grants.check(x.gpa, 1)?;
                    pages.push((x.gpa, 1));
                }
            }
            other => {
                return Err(FsError::Io(format!(
                    "{:?} entries change several inodes and go by RPC, not log commit",
                    other.kind()
                )))
            }
        }
    }
    Ok(pages)
}

/// Appends a checked commit. Fails with `ESTALE` when the client built it on a tail
/// that is no longer the log's (it refreshes and re-executes).
pub fn apply(
    engine: &mut MetaEngine,
    grants: &mut ChunkGrants,
    c: Commit,
) -> FsResult<(orion_format::Tail, orion_format::Tail)> {
    let pages = check(engine, grants, &c)?;
    let inode = engine.inode(c.ino)?;
    if let Some(t) = c.expect {
        if t != inode.log.tail {
            return Err(ESTALE);
        }
    }
    let size = inode.state.attr.size;
    let shrinking = c
        .entries
        .iter()
        .any(|e| matches!(e, Entry::SetAttr(a) if a.mask & attr_mask::SIZE != 0 && a.size < size));
    let r = engine.commit_entries(c.ino, c.entries, shrinking)?;
    // Nothing ran between the check of the tail above and the append: the entries
    // follow the tail the client computed them from.
    assert!(
        c.expect.is_none_or(|t| t == r.0),
        "a commit appended after a tail other than the one it expected"
    );
    for (g, n) in pages {
        grants.commit(g, n);
    }
    Ok(r)
}

/// The pages a commit needs persisted by the data stores before it may apply.
pub fn data_pages(c: &Commit) -> impl Iterator<Item = Gpa> + Clone + '_ {
    c.entries.iter().flat_map(|e| {
        let (first, n) = match e {
            Entry::Write(w) => (w.gpa, w.npages as u64),
            Entry::XattrSet(x) => (x.gpa, 1),
            _ => (Gpa(0), 0),
        };
        (0..n).map(move |k| first.offset_by(k))
    })
}
