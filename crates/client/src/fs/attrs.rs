//! Attributes: stat and friends read a current copy of the inode; setattr (chmod,
//! chown, truncate, utimens) is a conditional log commit built by the same rules as
//! the MDS's (`orion_meta::setattr_entry`).

use orion_format::{Entry, Gpa, WriteRec, PAGE_SIZE};
use orion_meta::perm::Cred;
use orion_meta::{setattr_entry, Attr, Clock, FsResult, SetAttrReq, StatFs, SystemClock, TimeSet};
use orion_proto::{Commit, MdsRequest, ReplyBody};

use super::*;
use crate::commit::{commit_loop, Step};
use crate::remote::{io_err, Res};

impl Client {
    pub fn stat(&self, path: &str) -> FsResult<Attr> {
        self.stat_as(path, true, None)
    }

    pub fn lstat(&self, path: &str) -> FsResult<Attr> {
        self.stat_as(path, false, None)
    }

    /// stat (`follow`) or lstat for the caller `searcher`, if given, who must be
    /// able to search every directory the path walks (checked in the same walk).
    pub fn stat_as(&self, path: &str, follow: bool, searcher: Option<&Cred>) -> FsResult<Attr> {
        let searcher = crate::access::checked(searcher);
        self.run(|i| {
            let (ino, _) = i.resolve_as(path, follow, searcher)?;
            i.getattr(ino)
        })
    }

    /// Attributes by inode number (current: the tail is checked).
    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        self.run_on(ino, |i| i.getattr(ino))
    }

    /// Looks `name` up in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Attr> {
        self.run(|i| {
            let ino = i.lookup(parent, name)?;
            i.getattr(ino)
        })
    }

    pub fn setattr_path(&self, path: &str, req: &SetAttrReq) -> FsResult<Attr> {
        self.setattr_path_as(path, true, req, None)
    }

    /// setattr of what `path` names (its final symlink, unless `follow`) for the
    /// caller `cred`, if given: checked in the walk that finds it, and applied as
    /// the checks allow (`Inner::checked_setattr`).
    pub fn setattr_path_as(
        &self,
        path: &str,
        follow: bool,
        req: &SetAttrReq,
        cred: Option<&Cred>,
    ) -> FsResult<Attr> {
        let cred = crate::access::checked(cred);
        self.run(|i| {
            let (ino, _) = i.resolve_as(path, follow, cred)?;
            match cred {
                None => i.setattr(ino, req),
                Some(cred) => {
                    let req = i.checked_setattr(ino, req, cred)?;
                    i.setattr(ino, &req)
                }
            }
        })
    }

    pub fn setattr(&self, ino: u64, req: &SetAttrReq) -> FsResult<Attr> {
        self.run_on(ino, |i| i.setattr(ino, req))
    }

    /// Drops the setuid bit of `ino`, and its setgid bit when group-execute is set
    /// (`perm::without_setid`): what a write by a process without `CAP_FSETID` does
    /// (the FUSE mount is told so with each such write). Nothing is committed when
    /// neither is set. The mode is the MDS's current one (a tail check): the copy a
    /// write leaves may be behind other clients' commits (a write lands after a
    /// chmod without catching up: `InodeCache::settle`), and a bit set since must
    /// go too, while the new mode, being absolute, must not undo another's chmod.
    pub fn kill_setid(&self, ino: u64) -> FsResult<()> {
        // A data call: staged writes commit when due, not before every write.
        self.run_data(ino, |i| {
            let mode = i.getattr(ino)?.mode;
            let kept = orion_meta::perm::without_setid(mode & 0o7777);
            if kept == mode & 0o7777 {
                return Ok(());
            }
            let req = SetAttrReq {
                mode: Some(kept),
                ..Default::default()
            };
            i.setattr(ino, &req).map(|_| ())
        })
    }

    pub fn truncate(&self, path: &str, size: u64) -> FsResult<()> {
        self.setattr_path(
            path,
            &SetAttrReq {
                size: Some(size),
                ..Default::default()
            },
        )
        .map(|_| ())
    }

    pub fn chmod(&self, path: &str, mode: u32) -> FsResult<()> {
        self.setattr_path(
            path,
            &SetAttrReq {
                mode: Some(mode),
                ..Default::default()
            },
        )
        .map(|_| ())
    }

    pub fn utimens(
        &self,
        path: &str,
        atime: Option<TimeSet>,
        mtime: Option<TimeSet>,
    ) -> FsResult<()> {
        self.setattr_path(
            path,
            &SetAttrReq {
                atime,
                mtime,
                ..Default::default()
            },
        )
        .map(|_| ())
    }

    /// Who this client creates files as (the process's effective ids when it
    /// connected).
    pub fn owner(&self) -> (u32, u32) {
        (self.lanes.uid, self.lanes.gid)
    }

    pub fn statfs(&self) -> FsResult<StatFs> {
        self.run(|i| match i.rpc(MdsRequest::Statfs)? {
            ReplyBody::Statfs(s) => Ok(s),
            other => Err(io_err(format!("unexpected reply {other:?}")).into()),
        })
    }

    /// An empty round trip to the MDS.
    pub fn ping(&self) -> FsResult<()> {
        self.run(|i| i.rpc(MdsRequest::Ping).map(|_| ()))
    }
}

impl Inner {
    pub(crate) fn getattr(&mut self, ino: u64) -> Res<Attr> {
        Ok(self
            .cache
            .refresh(&mut self.remote, ino)?
            .state
            .attr
            .clone())
    }

    /// chmod, chown, truncate, utimens: a conditional log commit built from the
    /// current state by the same rules as the MDS's (run again if another client's
    /// commit came first). A truncation inside a page copies that page with the
    /// cut-off bytes zeroed, so a later extension reads zeros there.
    pub(crate) fn setattr(&mut self, ino: u64, req: &SetAttrReq) -> Res<Attr> {
        // The copy of a cut page, taken once and reused by every attempt.
        let mut page: Option<Vec<(Gpa, u64)>> = None;
        let Inner {
            remote,
            cache,
            chunks,
            pages,
            ..
        } = self;
        let r = commit_loop(remote, cache, |remote, cache, _| {
            let c = cache.refresh(remote, ino)?;
            let a = c.state.attr.clone();
            let (tail, generation) = (c.tail, c.generation());
            let file = c.state.file();
            let has_pages = file.is_some_and(|f| !f.is_empty());
            let now = SystemClock.now();
            let rec = setattr_entry(&a, has_pages, req, now)?;
            // Decide: a truncation inside a page copies that page with the cut-off
            // bytes zeroed, so a later extension reads zeros there.
            let cut_page = match req.size {
                Some(size) if size < a.size && size % PAGE_SIZE != 0 => file
                    .and_then(|f| f.get(size / PAGE_SIZE))
                    .map(|old| (size / PAGE_SIZE, old)),
                _ => None,
            };
            let Some(rec) = rec else {
                return Ok(Step::Done(Some(a))); // nothing changes
            };
            // Then do: the copy, and the commit.
            let mut entries = Vec::new();
            let written_epoch = remote.epoch;
            let mut local = false;
            if let Some((pg, old)) = cut_page {
                // Only a new size inside page `pg` cuts it: the bytes from there go.
                debug_assert!(
                    req.size
                        .is_some_and(|s| s / PAGE_SIZE == pg && s % PAGE_SIZE != 0),
                    "the page cut is not the one the new size ends inside"
                );
                let mut buf = vec![0u8; PAGE_SIZE as usize];
                fetch(remote, pages, &[Some(old)], &mut buf)?;
                buf[(req.size.unwrap_or(0) % PAGE_SIZE) as usize..].fill(0);
                if page.is_none() {
                    page = Some(chunks.take(remote, 1)?);
                }
                let g = page.as_ref().expect("taken")[0].0;
                local = remote.write_pages(g, &buf)?;
                entries.push(Entry::Write(WriteRec {
                    pgoff: pg,
                    npages: 1,
                    gpa: g,
                    size: a.size,
                    mtime: now,
                }));
            }
            entries.push(Entry::SetAttr(rec));
            let commit = Commit {
                ino,
                generation,
                expect: Some(tail),
                persisted_locally: local,
                written_epoch,
                entries,
            };
            Ok(Step::Send(commit, None))
        });
        match r {
            Ok(Some(unchanged)) => return Ok(unchanged),
            Ok(None) => {}
            // Refused, so never committed: the page is still this client's to reuse.
            Err(f) if f.changed_nothing() => {
                if let Some(p) = page {
                    self.chunks.give_back(p);
                }
                return Err(f);
            }
            Err(e) => return Err(e),
        }
        self.getattr(ino)
    }
}
