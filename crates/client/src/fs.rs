//! The POSIX-shaped API: paths, file handles and the calls FUSE and the preload
//! library wrap. A `Client` may be shared by threads: each call runs on one of its
//! lanes (`lanes`: a connection with its own state), calls on different inodes in
//! parallel; each call runs again from fresh state if the MDS connection had to be
//! re-established meanwhile (the MDS restarted, or its mirror took over).
//!
//! This file holds a lane's state and the client's handle on its lanes; the calls
//! live by family in `fs/`: `paths` (resolution), `namespace`, `attrs`, `xattrs`,
//! `handles` (open files, reads and writes, fsync, fallocate), `locks`, and the
//! optimistic flusher.

mod attrs;
mod flusher;
mod handles;
mod handover;
mod keeper;
mod lanes;
mod locks;
mod namespace;
pub(crate) mod paths;
mod xattrs;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLockReadGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use orion_fabric::{Domain, FabricConfig, SpinPolicy};
use orion_format::{Entry, FileType, Gpa};
use orion_meta::{Clock, FsResult, InodeState, RenameMode, SystemClock};
use orion_proto::{Commit, Epoch, MdsRequest, ReplyBody, StoreInfo};

use crate::alloc::Chunks;
use crate::arbitration::InodeCache;
use crate::calls::{Call, CallTimes, Timed};
use crate::commit::{commit_loop, Step};
use crate::datapath::{fetch, DataPath, PageCache};
use crate::kernel_cache::{callback_loop, Invalidate, KernelCache, Watched};
use crate::remote::{io_err, Fail, Remote, Res};
use crate::staging::Staging;
use crate::{ClientConfig, Stats};
use flusher::flusher;
use keeper::keeper;
pub use lanes::MAX_LANES;
pub(crate) use lanes::{lock, Lanes, OpenFiles, Pick};
use paths::check_name;

/// A thread of the client, joined when it is dropped.
type Thread = JoinHandle<()>;

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
    /// O_RDWR|O_CREAT.
    pub fn read_write_create() -> OpenFlags {
        OpenFlags {
            read: true,
            write: true,
            create: true,
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
    /// Counted in the open table (a regular file's descriptor).
    held: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub ftype: FileType,
}

/// One lane's state (see `lanes`): what is bound to its connection, and its
/// copies of inodes.
pub(crate) struct Inner {
    remote: Remote,
    cache: InodeCache,
    chunks: Chunks,
    pages: Arc<PageCache>,
    staging: Staging,
    /// Shared by every lane of the client.
    open: Arc<Mutex<OpenFiles>>,
    /// This lane's number.
    lane: usize,
    /// Growths of the inode lanes this lane has caught up with (`fs/lanes.rs`).
    growths_seen: usize,
    uid: u32,
    gid: u32,
    /// [`ClientConfig::host_paths`].
    host_paths: bool,
}

pub struct Client {
    lanes: Arc<Lanes>,
    /// Commits staged writes when they are due (optimistic persistence only).
    flusher: Option<JoinHandle<()>>,
    /// Keeps the open table at a new MDS ([`keeper`]).
    keeper: Option<JoinHandle<()>>,
    /// Callbacks for a front-end's kernel cache, once asked for, and their thread.
    kernel: OnceLock<(Arc<KernelCache>, Mutex<Option<Thread>>)>,
    /// Each front-end call's time, and the bytes moved ([`crate::calls`]).
    calls: Arc<CallTimes>,
}

impl Client {
    /// Connects to the MDS named in `cfg` and to every data store it lists.
    pub fn connect(cfg: ClientConfig, mut fabric: FabricConfig) -> FsResult<Client> {
        // A client's waits are for replies: past a round trip it yields its CPU to
        // whoever must answer (design note 70). A caller that set a policy other
        // than the default keeps its own.
        if fabric.spin == SpinPolicy::default() {
            fabric.spin = SpinPolicy::client();
        }
        let domain = Domain::open(fabric).map_err(|e| io_err(format!("fabric: {e}")))?;
        let lanes = Arc::new(Lanes::connect(cfg, domain)?);
        let flusher = if lanes.optimistic() {
            let weak = Arc::downgrade(&lanes);
            let t = std::thread::Builder::new()
                .name("orion-flusher".into())
                .spawn(move || flusher(weak))
                .map_err(|e| io_err(format!("starting the flusher thread: {e}")))?;
            let _ = lanes.flusher.set(t.thread().clone());
            for (_, m) in lanes.existing() {
                lock(m).staging.set_flusher(t.thread().clone());
            }
            Some(t)
        } else {
            None
        };
        let weak = Arc::downgrade(&lanes);
        let keeper = std::thread::Builder::new()
            .name("orion-keeper".into())
            .spawn(move || keeper(weak))
            .map_err(|e| io_err(format!("starting the keeper thread: {e}")))?;
        Ok(Client {
            lanes,
            flusher,
            keeper: Some(keeper),
            kernel: OnceLock::new(),
            calls: Arc::default(),
        })
    }

    /// Runs a call that is not a read or write (on the first free lane): what is
    /// staged commits first.
    pub(crate) fn run<T>(&self, f: impl FnMut(&mut Inner) -> Res<T>) -> FsResult<T> {
        self.lanes.run(Pick::Any, true, f)
    }

    /// [`Self::run`] for a call about inode `ino`, on its lane.
    pub(crate) fn run_on<T>(&self, ino: u64, f: impl FnMut(&mut Inner) -> Res<T>) -> FsResult<T> {
        self.lanes.run(Pick::Inode(ino), true, f)
    }

    /// [`Self::run`] on lane 0, for advisory locks: the MDS holds a lock for the
    /// connection that took it, and an inode's own lane changes as lanes open.
    pub(crate) fn run_on_lock_lane<T>(&self, f: impl FnMut(&mut Inner) -> Res<T>) -> FsResult<T> {
        self.lanes.run(Pick::Lane(0), true, f)
    }

    /// Runs a read or write of `ino` on its lane: staged writes commit first only
    /// when they are due.
    pub(crate) fn run_data<T>(&self, ino: u64, f: impl FnMut(&mut Inner) -> Res<T>) -> FsResult<T> {
        self.lanes.run(Pick::Inode(ino), false, f)
    }

    /// The open files (locked for a lookup; never held across I/O).
    pub(crate) fn open_files(&self) -> MutexGuard<'_, OpenFiles> {
        lock(&self.lanes.open)
    }

    /// Lets a front-end's kernel cache names and attributes, kept true by the MDS's
    /// callbacks (see [`crate::kernel_cache`]): `invalidate` runs on a thread of the
    /// client for each batch the MDS sends, and must not call the client. With
    /// `data`, the kernel keeps files' data pages too (they may be read in again
    /// without a look at the attributes), and the MDS keeps watching the files.
    pub fn cache_in_kernel(&self, invalidate: Invalidate, data: bool) -> FsResult<()> {
        let kc = Arc::new(KernelCache::new(invalidate, data));
        if self.kernel.set((kc.clone(), Mutex::new(None))).is_err() {
            return Err(io_err("the kernel cache is on already"));
        }
        let (cfg, domain) = (self.lanes.cfg.clone(), self.lanes.domain.clone());
        let instance = self.lanes.instance;
        // Open files keep the lease and are watched again by a new callback
        // connection (the kernel may read their mapped pages without a call); weak:
        // the thread is joined before the lanes go.
        let lanes = Arc::downgrade(&self.lanes);
        let files_open = Box::new(move || {
            lanes.upgrade().map_or_else(Vec::new, |l| {
                lock(&l.open).handles.values().map(|h| h.ino).collect()
            })
        });
        let t = std::thread::Builder::new()
            .name("orion-callbacks".into())
            .spawn(move || callback_loop(cfg, domain, instance, kc, files_open))
            .map_err(|e| io_err(format!("starting the callback thread: {e}")))?;
        *lock(&self.kernel.get().expect("set above").1) = Some(t);
        Ok(())
    }

    /// Before reading what the kernel will keep: has the MDS watch `inos` for this
    /// client (a request for those not watched yet). None: the kernel keeps nothing
    /// (no kernel cache, no lease, or the MDS refused).
    pub fn watch_for_kernel(&self, inos: &[u64]) -> Option<Watched> {
        self.watch(inos, true)
    }

    /// A file was opened (the open table holds it): its kernel may map it and read
    /// pages in without a getattr, so the MDS watches it from now on for this client,
    /// with a lease if `wait` (waited for if it ran out; only for a caller that holds
    /// no lock the callback thread needs: not the kernel gate) and without otherwise.
    pub fn watch_open_file(&self, ino: u64, wait: bool) {
        if let Some((kc, _)) = self.kernel.get() {
            if wait {
                kc.await_lease();
            }
            let _ = self.watch(&[ino], false);
        }
    }

    fn watch(&self, inos: &[u64], need_lease: bool) -> Option<Watched> {
        let kc = &self.kernel.get()?.0;
        let (missing, w) = kc.missing(inos, need_lease)?;
        if !missing.is_empty() {
            let req = MdsRequest::Watch {
                inos: missing.clone(),
            };
            let _in_order = kc.requests();
            self.lanes
                .run(Pick::Any, false, |g| g.rpc(req.clone()))
                .ok()?;
            kc.note(w, &missing).then_some(())?;
            // Its own notes (and any since) count for the caller, who reads after.
            return Some(kc.restamp(w));
        }
        Some(w)
    }

    /// Held by a front-end call that hands its kernel names or attributes, from before
    /// [`Self::watch_for_kernel`] until its reply is sent and counted
    /// ([`Self::kernel_looked_up`]); None without a kernel cache.
    pub fn kernel_gate(&self) -> Option<RwLockReadGuard<'_, ()>> {
        Some(self.kernel.get()?.0.gate())
    }

    /// The kernel got an entry for `ino` (FUSE counts these lookups, and forgets
    /// them).
    pub fn kernel_looked_up(&self, ino: u64) {
        if let Some((kc, _)) = self.kernel.get() {
            kc.looked_up(ino);
        }
    }

    /// The kernel forgot `n` lookups of `ino`: once it forgot them all, the MDS stops
    /// watching it for this client (in batches).
    pub fn kernel_forgot(&self, ino: u64, n: u64) {
        let Some((kc, _)) = self.kernel.get() else {
            return;
        };
        if !kc.forgot(ino, n) {
            return;
        }
        let (_in_order, inos) = kc.take_forgotten();
        if inos.is_empty() {
            return;
        }
        // A failed request leaves the watches (callbacks the kernel does not need):
        // asked again with the next batch.
        let unwatch = |g: &mut Inner| g.rpc(MdsRequest::Unwatch { inos: inos.clone() });
        if self.lanes.run(Pick::Any, false, unwatch).is_err() {
            kc.unwatch_again(inos);
        }
    }

    /// Whether `ino` is watched in the session of `w` (then what is read of it from
    /// now on may go to the kernel for [`Self::kernel_ttl`]).
    pub fn watched_for_kernel(&self, w: Option<Watched>, ino: u64) -> bool {
        match (w, self.kernel.get()) {
            (Some(w), Some((kc, _))) => kc.is_watched(w, ino),
            _ => false,
        }
    }

    /// `inos` were changed by this client after `w`: the MDS watches them for it.
    pub fn changed_for_kernel(&self, w: Option<Watched>, inos: &[u64]) {
        if let (Some(w), Some((kc, _))) = (w, self.kernel.get()) {
            kc.note(w, inos);
        }
    }

    /// How long the kernel may keep what was read after `w` (zero without a lease).
    pub fn kernel_ttl(&self, w: Option<Watched>) -> Duration {
        match (w, self.kernel.get()) {
            (Some(w), Some((kc, _))) => kc.ttl(w),
            _ => Duration::ZERO,
        }
    }

    /// How many lanes the client spreads inodes over now (it doubles them when calls
    /// meet on a busy lane; see `fs/lanes.rs`).
    pub fn inode_lanes(&self) -> usize {
        self.lanes.inode_lanes()
    }

    /// What the client has done so far (every lane's counters, added up).
    pub fn stats(&self) -> Stats {
        self.lanes.stats()
    }

    /// Times a front-end's `call` until the guard is dropped ([`crate::calls`]).
    pub fn timed(&self, call: Call) -> Timed<'_> {
        self.calls.timed(call)
    }

    /// Every front-end call's times so far, and the bytes read and written.
    pub fn calls(&self) -> &Arc<CallTimes> {
        &self.calls
    }

    /// The cluster map as the MDS describes it now: its epoch and every data store,
    /// with its state.
    pub fn cluster_map(&self) -> FsResult<(Epoch, Vec<StoreInfo>)> {
        self.lanes.run(Pick::Any, false, |g| {
            g.remote.refresh_stores()?;
            Ok((g.remote.epoch, g.remote.map.clone()))
        })
    }

    /// The group of the data store this client maps directly, if any.
    pub fn internal_group(&self) -> Option<u16> {
        self.lanes
            .run(Pick::Lane(0), false, |g| Ok(g.remote.internal_group()))
            .ok()
            .flatten()
    }
}

impl Inner {
    pub(crate) fn datapath(&mut self) -> DataPath<'_> {
        DataPath {
            remote: &mut self.remote,
            cache: &mut self.cache,
            chunks: &mut self.chunks,
            pages: &self.pages,
            staging: &mut self.staging,
        }
    }

    pub(crate) fn rpc(&mut self, req: MdsRequest) -> Res<ReplyBody> {
        self.remote.call(&req)
    }

    /// Unlinks `name` in `parent`. A file any client holds open stays usable through
    /// its descriptors (link count 0) until the last of them closes: the MDS keeps it
    /// while an open table names it (`remote::open_table`).
    pub(crate) fn unlink_name(&mut self, parent: u64, name: Vec<u8>) -> Res<()> {
        self.rpc(MdsRequest::Unlink { parent, name }).map(|_| ())
    }

    /// rename(2) by directory inodes and names; a target some client holds open
    /// outlives the rename, as it would an unlink.
    pub(crate) fn rename_names(
        &mut self,
        (old_parent, old_name): (u64, Vec<u8>),
        (new_parent, new_name): (u64, Vec<u8>),
        mode: RenameMode,
    ) -> Res<()> {
        self.rpc(MdsRequest::Rename {
            old_parent,
            old_name,
            new_parent,
            new_name,
            mode,
        })
        .map(|_| ())
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
                generation: c.generation(),
                expect: Some(c.tail),
                persisted_locally,
                written_epoch,
                entries,
            };
            Ok(Step::Send(commit, ()))
        })
    }
}

impl Drop for Client {
    /// Commits what is staged (a client dropped without closing its files loses no
    /// acknowledged write it could still commit) and stops the flusher.
    fn drop(&mut self) {
        for (_, m) in self.lanes.existing() {
            let mut g = lock(m);
            if let Err(Fail::Reconnected) = g.datapath().flush_all() {
                g.datapath().reconnected();
            }
            self.lanes.note_staged(&g);
        }
        self.lanes
            .closing
            .store(true, std::sync::atomic::Ordering::Release);
        for t in [self.flusher.take(), self.keeper.take()]
            .into_iter()
            .flatten()
        {
            t.thread().unpark();
            let _ = t.join();
        }
        if let Some((kc, t)) = self.kernel.get() {
            kc.stop();
            if let Some(t) = lock(t).take() {
                let _ = t.join();
            }
        }
    }
}

/// Reads one data page (a symlink target, an xattr value) through the data path.
fn read_page(i: &mut Inner, gpa: Gpa, buf: &mut [u8]) -> Res<()> {
    fetch(&mut i.remote, &i.pages, &[Some(gpa)], buf)
}
