//! The POSIX-shaped API: paths, file handles and the calls FUSE and the preload
//! library will wrap. Every call takes the client's lock, so a `Client` may be shared
//! by threads; each call runs again from fresh state if the MDS connection had to be
//! re-established meanwhile (the MDS restarted).
//!
//! This file holds the client's state and how a call runs; the calls live by family
//! in `fs/`: `paths` (resolution), `namespace`, `attrs`, `xattrs`, `handles` (open
//! files, reads and writes, fsync, fallocate), `locks`, and the optimistic flusher.

mod attrs;
mod flusher;
mod handles;
mod locks;
mod namespace;
mod paths;
mod xattrs;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use orion_fabric::FabricConfig;
use orion_format::{Entry, FileType, Gpa};
use orion_meta::{Clock, FsResult, InodeState, SystemClock};
use orion_proto::{Commit, Epoch, MdsRequest, ReplyBody, StoreInfo};

use crate::alloc::Chunks;
use crate::arbitration::InodeCache;
use crate::commit::{commit_loop, Step};
use crate::datapath::{fetch, DataPath, PageCache};
use crate::remote::{io_err, Fail, Remote, Res};
use crate::staging::Staging;
use crate::{ClientConfig, Stats};
use flusher::flusher;
use paths::check_name;

/// Times a call runs again after the MDS connection was re-established.
const RECONNECT_RETRIES: usize = 4;

/// How to open a file (the flags of open(2) that matter to a file system).
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenFlags {
    pub read: bool,
    pub write: bool,
    pub create: bool,
    pub excl: bool,
    pub truncate: bool,
    pub append: bool,
}

impl OpenFlags {
    pub fn read() -> OpenFlags {
        OpenFlags {
            read: true,
            ..Default::default()
        }
    }
    /// O_WRONLY|O_CREAT|O_TRUNC, as `creat(2)`.
    pub fn create() -> OpenFlags {
        OpenFlags {
            write: true,
            create: true,
            truncate: true,
            ..Default::default()
        }
    }
}

/// An open file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fd(pub u64);

pub(crate) struct Handle {
    ino: u64,
    /// The inode's generation when opened (inode numbers are reused).
    gen: u64,
    flags: OpenFlags,
    pos: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub ftype: FileType,
}

pub(crate) struct Inner {
    remote: Remote,
    cache: InodeCache,
    chunks: Chunks,
    pages: PageCache,
    staging: Staging,
    handles: HashMap<u64, Handle>,
    /// Inodes this client unlinked while it held them open: the MDS keeps them until
    /// the last descriptor closes (`MdsRequest::Release`).
    orphans: std::collections::HashSet<u64>,
    next_fd: u64,
    uid: u32,
    gid: u32,
}

pub struct Client {
    inner: Arc<Mutex<Inner>>,
    /// Commits staged writes when they are due (optimistic persistence only).
    flusher: Option<JoinHandle<()>>,
}

impl Client {
    /// Connects to the MDS named in `cfg` and to every data store it lists.
    pub fn connect(cfg: ClientConfig, fabric: FabricConfig) -> FsResult<Client> {
        let pages = PageCache::new(cfg.cache_mib);
        let optimistic = cfg.optimistic().map_err(io_err)?;
        let stage_for = Duration::from_millis(cfg.stage_ms.max(1));
        let remote = Remote::connect(cfg, fabric)?;
        // SAFETY: geteuid and getegid only read the process's credentials.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let inner = Arc::new(Mutex::new(Inner {
            remote,
            cache: InodeCache::default(),
            chunks: Chunks::default(),
            pages,
            staging: Staging::new(optimistic, stage_for),
            handles: HashMap::new(),
            orphans: Default::default(),
            next_fd: 3,
            uid,
            gid,
        }));
        let flusher = if optimistic {
            let weak = Arc::downgrade(&inner);
            let t = std::thread::Builder::new()
                .name("orion-flusher".into())
                .spawn(move || flusher(weak))
                .map_err(|e| io_err(format!("starting the flusher thread: {e}")))?;
            lock(&inner).staging.set_flusher(t.thread().clone());
            Some(t)
        } else {
            None
        };
        Ok(Client { inner, flusher })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Runs a call that is not a read or write: what is staged commits first.
    pub(crate) fn run<T>(&self, f: impl FnMut(&mut Inner) -> Res<T>) -> FsResult<T> {
        self.run_with(true, f)
    }

    /// Runs a read or write: staged writes commit first only when they are due.
    pub(crate) fn run_data<T>(&self, f: impl FnMut(&mut Inner) -> Res<T>) -> FsResult<T> {
        self.run_with(false, f)
    }

    pub(crate) fn run_with<T>(
        &self,
        commit_staged: bool,
        mut f: impl FnMut(&mut Inner) -> Res<T>,
    ) -> FsResult<T> {
        let mut g = self.lock();
        g.remote.begin_operation();
        for _ in 0..RECONNECT_RETRIES {
            g.datapath().forget_if_term_changed();
            let staged = if commit_staged || g.staging.due() {
                g.datapath().flush_all()
            } else {
                Ok(())
            };
            match staged.and_then(|_| f(&mut g)) {
                Ok(v) => return Ok(v),
                Err(Fail::Fs(e)) => return Err(e),
                Err(Fail::Reconnected) => g.datapath().reconnected(),
                // Refused, with the new map in hand: the operation writes again.
                Err(Fail::MapChanged) => {}
            }
        }
        Err(io_err("the MDS connection keeps breaking"))
    }

    /// What the client has done so far.
    pub fn stats(&self) -> Stats {
        self.lock().remote.stats.clone()
    }

    /// The cluster map as the MDS describes it now: its epoch and every data store,
    /// with its state.
    pub fn cluster_map(&self) -> FsResult<(Epoch, Vec<StoreInfo>)> {
        self.run_with(false, |g| {
            g.remote.refresh_stores()?;
            Ok((g.remote.epoch, g.remote.map.clone()))
        })
    }

    /// The group of the data store this client maps directly, if any.
    pub fn internal_group(&self) -> Option<u16> {
        self.lock().remote.internal_group()
    }
}

impl Inner {
    pub(crate) fn datapath(&mut self) -> DataPath<'_> {
        DataPath {
            remote: &mut self.remote,
            cache: &mut self.cache,
            chunks: &mut self.chunks,
            pages: &mut self.pages,
            staging: &mut self.staging,
        }
    }

    pub(crate) fn rpc(&mut self, req: MdsRequest) -> Res<ReplyBody> {
        self.remote.call(&req)
    }

    /// Unlinks `name` in `parent`; a file this client holds open stays usable through
    /// its descriptors (link count 0) until the last of them closes.
    pub(crate) fn unlink_name(&mut self, parent: u64, name: Vec<u8>) -> Res<()> {
        let open = match self.handles.is_empty() {
            true => false,
            false => match self.lookup(parent, &name) {
                Ok(ino) => self.handles.values().any(|h| h.ino == ino),
                Err(Fail::Fs(orion_meta::FsError::Errno(libc::ENOENT))) => false,
                Err(e) => return Err(e),
            },
        };
        if !open {
            return self.rpc(MdsRequest::Unlink { parent, name }).map(|_| ());
        }
        // The inode the MDS kept (it may differ from the one looked up if the name
        // was replaced meanwhile; 0 when other links keep it).
        match self.rpc(MdsRequest::UnlinkOpen { parent, name })? {
            ReplyBody::Ino(0) => {}
            ReplyBody::Ino(ino) => {
                self.orphans.insert(ino);
            }
            other => {
                return Err(Fail::Fs(io_err(format!(
                    "unlink: unexpected reply {other:?}"
                ))))
            }
        }
        Ok(())
    }

    /// After a descriptor of `ino` closed: the last one of an unlinked file lets the
    /// MDS destroy it.
    pub(crate) fn release_if_orphan(&mut self, ino: u64) -> Res<()> {
        if !self.orphans.contains(&ino) || self.handles.values().any(|h| h.ino == ino) {
            return Ok(());
        }
        self.orphans.remove(&ino);
        self.rpc(MdsRequest::Release { ino }).map(|_| ())
    }

    /// Commits the entries `build` makes from a current copy of the inode,
    /// conditionally on that copy's tail; builds again when another update came first.
    pub(crate) fn commit_checked(
        &mut self,
        ino: u64,
        build: impl FnMut(&InodeState, i64) -> FsResult<Vec<Entry>>,
    ) -> Res<()> {
        let epoch = self.remote.epoch;
        self.commit_checked_with(ino, true, epoch, build)
    }

    /// [`Self::commit_checked`] for entries naming pages this client wrote:
    /// `persisted_locally` tells whether they are durable already (internal client),
    /// `written_epoch` under which cluster map they were written.
    pub(crate) fn commit_checked_with(
        &mut self,
        ino: u64,
        persisted_locally: bool,
        written_epoch: Epoch,
        mut build: impl FnMut(&InodeState, i64) -> FsResult<Vec<Entry>>,
    ) -> Res<()> {
        // Staged writes of the file were done before: they commit first.
        self.datapath().flush(ino)?;
        commit_loop(&mut self.remote, &mut self.cache, |remote, cache, _| {
            let c = cache.refresh(remote, ino)?;
            let entries = build(&c.state, SystemClock.now())?;
            let commit = Commit {
                ino,
                generation: c.generation,
                expect: Some(c.tail),
                persisted_locally,
                written_epoch,
                entries,
            };
            Ok(Step::Send(commit, ()))
        })
    }
}

fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Client {
    /// Commits what is staged (a client dropped without closing its files loses no
    /// acknowledged write it could still commit) and stops the flusher.
    fn drop(&mut self) {
        {
            let mut g = self.lock();
            if let Err(Fail::Reconnected) = g.datapath().flush_all() {
                g.datapath().reconnected();
            }
            g.staging.closing = true;
        }
        if let Some(t) = self.flusher.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// Reads one data page (a symlink target, an xattr value) through the data path.
fn read_page(i: &mut Inner, gpa: Gpa, buf: &mut [u8]) -> Res<()> {
    fetch(&mut i.remote, &mut i.pages, &[Some(gpa)], buf)
}
