//! Open files: handles, reads and writes through the data path, fsync, fallocate.

use orion_format::FileType;
use orion_meta::error::{EBADF, EEXIST, EINVAL, EISDIR, ELOOP, ENOENT};
use orion_meta::falloc::FallocPlan;
use orion_meta::{Attr, FsResult, SetAttrReq};
use orion_proto::{MdsRequest, ReplyBody};

use orion_meta::perm::{self, Cred};

use super::paths::{LEAVES_FS, MAX_SYMLINKS};
use super::*;
use crate::remote::{io_err, Fail, Res};

impl Client {
    /// Finds (or creates) the file on any lane, then opens it on its lane, where its
    /// reads and writes will run and find the copy of the inode the open made (unless
    /// that lane is busy when they come: see `fs/lanes.rs`).
    pub fn open(&self, path: &str, flags: OpenFlags, mode: u32) -> FsResult<Fd> {
        self.open_as(path, flags, mode, None)
    }

    /// [`Client::open`] for the caller `cred`, if given, checked as Linux's open
    /// checks in the same walk that finds or makes the file: search permission on
    /// every directory walked, then the open's read and write on the file, or a new
    /// name in its directory (EEXIST and EISDIR come first, as on Linux).
    pub fn open_as(
        &self,
        path: &str,
        flags: OpenFlags,
        mode: u32,
        cred: Option<&Cred>,
    ) -> FsResult<Fd> {
        let ino = self.run(|i| i.find_or_create(path, flags, mode, cred))?;
        self.run_on(ino, |i| i.open_ino(ino, flags))
    }

    /// Opens inode `ino` (it exists: FUSE looked it up); O_CREAT and O_EXCL do not
    /// apply here.
    pub fn open_ino(&self, ino: u64, flags: OpenFlags) -> FsResult<Fd> {
        self.run_on(ino, |i| i.open_ino(ino, flags))
    }

    /// Closes a file handle; commits the writes staged for the file first and
    /// reports any that failed to commit (close-to-open: a client that opens the
    /// file after this returns sees them).
    pub fn close(&self, fd: Fd) -> FsResult<()> {
        let h = self.open_files().handles.remove(&fd.0).ok_or(EBADF)?;
        let settled = self.settle(h.ino, h.gen);
        // The descriptor goes from the open table even when its staged writes failed
        // to commit (what close reports): the last one of an unlinked file lets the
        // MDS destroy it.
        let cleared = match h.held.then(|| self.lanes.opens.release(h.ino)).flatten() {
            Some(place) => self.lanes.run(Pick::Inode(h.ino), false, |i| {
                i.remote.clear_open(h.ino, place)
            }),
            None => Ok(()),
        };
        // The writes' failure is the one close reports first.
        settled.and(cleared)
    }

    /// Commits the writes staged for an open file, and reports any that failed to
    /// commit since the last report (what close(2) reports, through FUSE's flush).
    pub fn flush(&self, fd: Fd) -> FsResult<()> {
        let (ino, _, _) = self.handle(fd)?;
        let gen = self.generation(fd)?;
        self.settle(ino, gen)
    }

    /// Commits what is staged for the file and reports a failure to commit it; on
    /// the file's lane only if there is anything to do ([`Lanes::settled`]).
    fn settle(&self, ino: u64, gen: u64) -> FsResult<()> {
        match self.lanes.settled(ino, gen) {
            true => Ok(()),
            false => self.run_data(ino, |i| i.datapath().settle(ino, gen)),
        }
    }

    pub(crate) fn handle(&self, fd: Fd) -> FsResult<(u64, OpenFlags, u64)> {
        let open = self.open_files();
        let h = open.handles.get(&fd.0).ok_or(EBADF)?;
        Ok((h.ino, h.flags, h.pos))
    }

    pub(crate) fn generation(&self, fd: Fd) -> FsResult<u64> {
        Ok(self.open_files().handles.get(&fd.0).ok_or(EBADF)?.gen)
    }

    pub fn pread(&self, fd: Fd, off: u64, len: usize) -> FsResult<Vec<u8>> {
        let (ino, flags, _) = self.handle(fd)?;
        if !flags.read {
            return Err(EBADF);
        }
        let gen = self.generation(fd)?;
        let out = self.run_data(ino, |i| i.datapath().read(ino, gen, off, len))?;
        self.calls.read(out.len());
        Ok(out)
    }

    pub fn read(&self, fd: Fd, len: usize) -> FsResult<Vec<u8>> {
        let (_, _, pos) = self.handle(fd)?;
        let out = self.pread(fd, pos, len)?;
        if let Some(h) = self.open_files().handles.get_mut(&fd.0) {
            h.pos = pos + out.len() as u64;
        }
        Ok(out)
    }

    pub fn pwrite(&self, fd: Fd, off: u64, data: &[u8]) -> FsResult<usize> {
        let (ino, flags, _) = self.handle(fd)?;
        if !flags.write {
            return Err(EBADF);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let gen = self.generation(fd)?;
        self.run_data(ino, |i| {
            i.datapath().write(ino, gen, off, data, flags.append)
        })?;
        self.calls.written(data.len());
        Ok(data.len())
    }

    pub fn write(&self, fd: Fd, data: &[u8]) -> FsResult<usize> {
        let (ino, flags, pos) = self.handle(fd)?;
        if !flags.write {
            return Err(EBADF);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let gen = self.generation(fd)?;
        let at = self.run_data(ino, |i| {
            i.datapath().write(ino, gen, pos, data, flags.append)
        })?;
        self.calls.written(data.len());
        if let Some(h) = self.open_files().handles.get_mut(&fd.0) {
            h.pos = at + data.len() as u64;
        }
        Ok(data.len())
    }

    /// The file offset of a handle: where [`Client::read`] and [`Client::write`]
    /// go next.
    pub fn position(&self, fd: Fd) -> FsResult<u64> {
        Ok(self.handle(fd)?.2)
    }

    pub fn seek(&self, fd: Fd, pos: u64) -> FsResult<()> {
        self.open_files().handles.get_mut(&fd.0).ok_or(EBADF)?.pos = pos;
        Ok(())
    }

    pub fn fstat(&self, fd: Fd) -> FsResult<Attr> {
        let (ino, _, _) = self.handle(fd)?;
        self.getattr(ino)
    }

    pub fn ftruncate(&self, fd: Fd, size: u64) -> FsResult<()> {
        let (ino, flags, _) = self.handle(fd)?;
        if !flags.write {
            return Err(EINVAL);
        }
        self.setattr(
            ino,
            &SetAttrReq {
                size: Some(size),
                ..Default::default()
            },
        )
        .map(|_| ())
    }

    /// Makes the file's data and log durable. Log commits are durable when they are
    /// acknowledged, and strong-mode data before its commit; staged writes commit
    /// here, and weak-mode pages written one-sided are made durable on their stores.
    pub fn fsync(&self, fd: Fd) -> FsResult<()> {
        let (ino, _, _) = self.handle(fd)?;
        let gen = self.generation(fd)?;
        self.run_data(ino, |i| {
            i.datapath().settle(ino, gen)?;
            i.remote.flush_stores()
        })
    }

    /// fallocate(2) on an open file (see [`FallocPlan`] for the modes): the parts of
    /// pages in a punched range are overwritten with zeros, then one conditional
    /// commit makes the whole pages a hole and sets the times and any new size.
    pub fn fallocate(&self, fd: Fd, mode: i32, off: u64, len: u64) -> FsResult<()> {
        let (ino, flags, _) = self.handle(fd)?;
        if !flags.write {
            return Err(EBADF);
        }
        let gen = self.generation(fd)?;
        self.run_on(ino, |i| {
            let state = &i.cache.refresh(&mut i.remote, ino)?.state;
            let plan = FallocPlan::new(state, off, len, mode)?;
            for &(s, e) in &plan.zero_ranges {
                i.datapath()
                    .write(ino, gen, s, &vec![0u8; (e - s) as usize], false)?;
            }
            if plan.reserve_pages > 0 {
                let ReplyBody::Statfs(s) = i.rpc(MdsRequest::Statfs)? else {
                    return Err(io_err("unexpected reply to statfs").into());
                };
                plan.check_room(s.bfree)?;
            }
            i.commit_checked(ino, |state, now| {
                Ok(FallocPlan::new(state, off, len, mode)?.entries(now))
            })
            .map(|_| ())
        })
    }

    /// The inode number of an open file.
    pub fn ino(&self, fd: Fd) -> FsResult<u64> {
        Ok(self.handle(fd)?.0)
    }
}

impl Inner {
    /// The file `open` opens: found, or created with O_CREAT.
    pub(crate) fn find_or_create(
        &mut self,
        path: &str,
        flags: OpenFlags,
        mode: u32,
        cred: Option<&Cred>,
    ) -> Res<u64> {
        let mut path = path.to_string();
        for _ in 0..=MAX_SYMLINKS {
            // O_EXCL follows no final symlink: any name there is its EEXIST.
            match self.resolve_as(&path, !(flags.create && flags.excl), cred) {
                Ok((ino, _)) => {
                    // Unless this very operation created it before a reconnection made
                    // it run again.
                    let made_now = self.remote.created_in_this_operation(ino);
                    if flags.create && flags.excl && !made_now {
                        return Err(EEXIST.into());
                    }
                    if let (Some(cred), false) = (cred, made_now) {
                        may_open(&self.getattr(ino)?, cred, flags)?;
                    }
                    return Ok(ino);
                }
                Err(Fail::Fs(e)) if e == ENOENT && flags.create => {}
                Err(e) => return Err(e),
            }
            // A new name: write and search permission on its directory, unless the
            // name is there (a dangling symlink, followed below; or O_EXCL's EEXIST,
            // the call's to say first).
            let made = self.make(&path, FileType::Regular, mode, None, cred);
            match made {
                Ok(a) => return Ok(a.ino),
                Err(Fail::Fs(e)) if e == EEXIST && !flags.excl => {
                    // The name is there: made by someone else meanwhile, or a symlink
                    // to nothing, whose target O_CREAT creates (as Linux does).
                    let (ino, _) = self.resolve_as(&path, false, cred)?;
                    if self.getattr(ino)?.ftype != FileType::Symlink {
                        let (ino, _) = self.resolve_as(&path, true, cred)?;
                        if let Some(cred) = cred {
                            may_open(&self.getattr(ino)?, cred, flags)?;
                        }
                        return Ok(ino);
                    }
                    let target = String::from_utf8_lossy(&self.readlink(ino)?).into_owned();
                    path = match (target.starts_with('/'), path.rfind('/')) {
                        (true, _) if self.host_paths => return Err(LEAVES_FS.into()),
                        (true, _) => target,
                        (false, Some(cut)) => format!("{}/{target}", &path[..cut]),
                        (false, None) => target,
                    };
                }
                Err(e) => return Err(e),
            }
        }
        Err(ELOOP.into())
    }

    pub(crate) fn open_ino(&mut self, ino: u64, flags: OpenFlags) -> Res<Fd> {
        let a = self.getattr(ino)?;
        if a.ftype == FileType::Directory && (flags.write || flags.truncate) {
            return Err(EISDIR.into());
        }
        // A regular file or a directory is in the open table before it is read: from
        // here on no unlink or rmdir elsewhere destroys it (see `remote::open_table`).
        let held = matches!(a.ftype, FileType::Regular | FileType::Directory);
        // The generation read before the hold: an inode number freed and taken by
        // another file in between is not the file the walk found.
        let before = self.cache.cached(ino).map(|c| c.generation());
        let first = held && self.remote.hold_open(ino)?;
        let gen = match self.read_held(ino, flags, a.size, first.then_some(before)) {
            Ok(gen) => gen,
            Err(e) => {
                if held {
                    // A reconnection runs the open again (and writes the table whole).
                    self.remote.unhold_open(ino)?;
                }
                return Err(e);
            }
        };
        let mut open = lock(&self.open);
        let fd = open.next_fd;
        open.next_fd += 1;
        let reused = open.handles.insert(
            fd,
            Handle {
                ino,
                gen,
                flags,
                pos: 0,
                held,
            },
        );
        // Descriptor numbers only grow: another open file's handle is never replaced.
        assert!(reused.is_none(), "descriptor {fd} handed out twice");
        Ok(Fd(fd))
    }

    /// The rest of an open once the file is held: the generation of a copy read
    /// after the hold, and O_TRUNC. If the hold was this client's first of the file
    /// (`first`: the generation before it), a copy without a link, or of another
    /// generation, is a file an unlink destroys or destroyed: the open gives up, as
    /// if it came after, and truncates nothing.
    fn read_held(
        &mut self,
        ino: u64,
        flags: OpenFlags,
        size: u64,
        first: Option<Option<u64>>,
    ) -> Res<u64> {
        let c = self.cache.refresh(&mut self.remote, ino)?;
        let gen = c.generation();
        let other = |before: Option<u64>| before.is_some_and(|b| b != gen);
        if first.is_some_and(|before| c.state.attr.nlink == 0 || other(before)) {
            return Err(ENOENT.into());
        }
        if flags.truncate && flags.write && size > 0 {
            self.setattr(
                ino,
                &SetAttrReq {
                    size: Some(0),
                    ..Default::default()
                },
            )?;
        }
        Ok(gen)
    }
}

/// Opening an existing file `a` as `flags` ask, for `cred` (Linux's order: a
/// directory opened to create or write is EISDIR, then the read and write bits).
fn may_open(a: &Attr, cred: &Cred, flags: OpenFlags) -> Res<()> {
    if a.ftype == FileType::Directory && (flags.create || flags.write || flags.truncate) {
        return Err(EISDIR.into());
    }
    let mask = match (flags.read, flags.write || flags.truncate) {
        (true, true) => perm::MAY_READ | perm::MAY_WRITE,
        (true, false) => perm::MAY_READ,
        (false, true) => perm::MAY_WRITE,
        (false, false) => 0,
    };
    Ok(perm::check(a, cred, mask)?)
}
