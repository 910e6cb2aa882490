//! The in-process cluster: its nodes, their threads and pools, restarts, and fsck.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use orion_client::{Client, ClientConfig};
use orion_ds::DsConfig;
use orion_fabric::mock::{Faults, MockNet};
use orion_fabric::{Backend, FabricConfig, Secret};
use orion_mds::MdsConfig;
use orion_pmem::{CrashDomain, CrashImage, Mode, ModeChoice, Pool};
use orion_proto::MemberId;

/// The shape of a simulated cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub seed: u64,
    /// Replication groups.
    pub stores: u16,
    /// Data stores per group.
    pub replicas: u16,
    pub mds_pool: u64,
    pub store_pool: u64,
    /// The data stores' pool mode: `Volatile` stores are durable on delivery (strong
    /// writes owe no notice), `Msync` ones persist each page and tell the MDS.
    pub store_mode: Mode,
    /// Faults of the mock fabric for the whole run.
    pub faults: Faults,
    /// The MDS's cache lease for clients' kernel caches (`MdsConfig::cache_lease_ms`):
    /// short by default, since a new MDS holds every change for one lease.
    pub cache_lease_ms: u64,
    /// The MDS's grace period for freed pages (`MdsConfig::grace_ms`): short by
    /// default, so that page reuse happens inside one run; read at each MDS start.
    pub grace_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            seed: 1,
            stores: 1,
            replicas: 1,
            mds_pool: 16 << 20,
            store_pool: 32 << 20,
            store_mode: Mode::Volatile,
            faults: Faults::default(),
            cache_lease_ms: 20,
            grace_ms: 20,
        }
    }
}

/// What kind of client to connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientKind {
    /// Maps the pool of group 0's store, as a client on the store's host does.
    pub internal: bool,
    /// Optimistic persistence: small writes staged and committed in batches.
    pub optimistic: bool,
    /// Weak data consistency: commits do not wait for the stores.
    pub weak: bool,
}

impl ClientKind {
    /// A client on no store's host, strong and pessimistic (the default kind).
    pub const EXTERNAL: ClientKind = ClientKind {
        internal: false,
        optimistic: false,
        weak: false,
    };
}

/// A server on its own thread: stopping it is a restart from its pool.
pub(crate) struct Node {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl Node {
    /// Starts `serve` on a thread named `name` and waits until it is ready.
    pub(crate) fn start(
        name: &str,
        serve: impl FnOnce(Arc<AtomicBool>, mpsc::Sender<()>) -> Result<()> + Send + 'static,
    ) -> Result<Node> {
        let (node, rx) = Node::spawn(name, serve)?;
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(()) => Ok(node),
            Err(_) => {
                let mut node = node;
                let r = node.stop();
                bail!("{name} did not start: {r:?}")
            }
        }
    }

    /// Starts `serve` on a thread named `name`; the receiver hears when it is ready.
    pub(crate) fn spawn(
        name: &str,
        serve: impl FnOnce(Arc<AtomicBool>, mpsc::Sender<()>) -> Result<()> + Send + 'static,
    ) -> Result<(Node, mpsc::Receiver<()>)> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || serve(s, tx))?;
        Ok((
            Node {
                stop,
                thread: Some(thread),
            },
            rx,
        ))
    }

    pub(crate) fn stop(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| anyhow!("the server thread panicked"))?,
            None => Ok(()),
        }
    }

    /// Ends the thread of a node that was cut off the network as a crashed process is:
    /// what its server returns does not matter any more, but a panic (a failed
    /// assertion before the crash) does.
    pub(crate) fn reap(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(|t| t.join()) {
            Some(Err(_)) => bail!("the server thread panicked"),
            _ => Ok(()),
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// An MDS, data stores and the means to connect clients, in this process.
pub struct Cluster {
    pub cfg: ClusterConfig,
    pub net: MockNet,
    secret: Secret,
    dir: tempfile::TempDir,
    mds: Option<Node>,
    /// Records the MDS pool's persists, so the MDS can lose power at any of its steps.
    mds_power: Arc<CrashDomain>,
    mds_starts: u64,
    /// What the MDS counts, across its restarts (as one `orion mds` process's
    /// registry outlives its terms).
    pub mds_metrics: orion_mds::metrics::MdsMetrics,
    stores: Vec<Option<Node>>,
}

/// Where the MDS listens on the mock network.
pub const MDS_ADDR: &str = "mds:7410";

pub fn store_addr(m: MemberId) -> String {
    format!("ds{}.{}:7420", m.group, m.index)
}

pub(crate) fn store_pool(m: MemberId) -> String {
    format!("ds{}.{}.pool", m.group, m.index)
}

impl Cluster {
    /// Formats the pools and starts every server.
    pub fn start(cfg: ClusterConfig) -> Result<Cluster> {
        let dir = tempfile::Builder::new()
            .prefix("orion-sim-")
            .tempdir_in("/dev/shm")
            .context("a directory for the pools in /dev/shm")?;
        let net = MockNet::new(cfg.seed);
        net.set_faults(cfg.faults.clone());
        let volatile = ModeChoice::Force(Mode::Volatile);
        orion_mds::format_pool(&dir.path().join("mds.pool"), cfg.mds_pool, volatile)?;
        for g in 0..cfg.stores {
            for i in 0..cfg.replicas {
                let p = dir.path().join(store_pool(MemberId::new(g, i)));
                orion_ds::format_pool(&p, cfg.store_pool, g, ModeChoice::Force(cfg.store_mode))?;
            }
        }
        let mut c = Cluster {
            stores: (0..cfg.stores * cfg.replicas).map(|_| None).collect(),
            cfg,
            net,
            secret: Secret::generate(),
            dir,
            mds: None,
            mds_power: CrashDomain::new(0),
            mds_starts: 0,
            mds_metrics: Default::default(),
        };
        c.start_mds()?;
        for g in 0..c.cfg.stores {
            for i in 0..c.cfg.replicas {
                c.start_store(MemberId::new(g, i))?;
            }
        }
        Ok(c)
    }

    fn mds_pool(&self) -> PathBuf {
        self.dir.path().join("mds.pool")
    }

    /// The fabric settings of this cluster's nodes (its mock network and secret).
    pub fn fabric(&self) -> FabricConfig {
        let mut f = FabricConfig::new(Backend::Mock(self.net.clone()), self.secret.clone());
        f.connect_timeout = Duration::from_secs(5);
        f.op_timeout = Duration::from_secs(10);
        f
    }

    fn start_mds(&mut self) -> Result<()> {
        let cfg = MdsConfig {
            pool: self.mds_pool(),
            pool_mode: "volatile".into(),
            listen: MDS_ADDR.into(),
            grace_ms: self.cfg.grace_ms,
            // Past the clients' call timeout (10 s here), as the default is past 30 s.
            open_reclaim_ms: 12_000,
            persist_timeout_ms: 5_000,
            replicas: self.cfg.replicas,
            // Short, as grace_ms: a departed store holds commits back this long.
            map_lease_ms: 100,
            cache_lease_ms: self.cfg.cache_lease_ms,
            counters: self.mds_metrics.clone(),
            ..Default::default()
        };
        let fabric = self.fabric();
        self.mds_starts += 1;
        self.mds_power = CrashDomain::new(self.cfg.seed ^ self.mds_starts.rotate_left(32));
        let pool = self.mds_power.track_file(&cfg.pool)?;
        self.mds = Some(Node::start("sim-mds", move |stop, ready| {
            orion_mds::serve(cfg, pool, fabric, stop, |_| {
                let _ = ready.send(());
            })
        })?);
        Ok(())
    }

    /// The crashed MDS's pool becomes `image`, is checked, and a new MDS starts on it.
    fn recover_mds(&mut self, image: CrashImage) -> Result<()> {
        if let Some(mut n) = self.mds.take() {
            n.reap().context("the crashed MDS")?;
        }
        let pool = Pool::open(&self.mds_pool(), ModeChoice::Force(Mode::Volatile))?;
        pool.write(0, &image.pools[0])?;
        drop(pool);
        self.fsck()
            .context("fsck of the MDS pool after a power failure")?;
        self.start_mds()
    }

    /// The MDS loses power now: it is cut off the network, its pool keeps what it
    /// persisted and a random part of what it had not yet, and a new MDS recovers it.
    pub fn crash_mds(&mut self) -> Result<()> {
        self.net.kill_listener(MDS_ADDR);
        let image = self.mds_power.crash_now();
        self.recover_mds(image)
    }

    /// Runs `op` (a client's operation) on another thread while the MDS loses power
    /// at the `after`-th step of its pool (a store or persist) from now, inside
    /// whatever it is doing then; the MDS recovers while `op` waits for it. Returns
    /// what `op` returned and whether the crash came before `op` finished (if not,
    /// the MDS is left alone).
    pub fn crash_mds_during<R: Send>(
        &mut self,
        after: u64,
        op: impl FnOnce() -> R + Send,
    ) -> Result<(R, bool)> {
        let (tx, rx) = mpsc::channel();
        let net = self.net.clone();
        let at = self.mds_power.events() + after.max(1);
        self.mds_power.crash_at(
            at,
            Box::new(move |image| {
                // Still inside the MDS's store: no reply leaves after this point.
                net.kill_listener(MDS_ADDR);
                let _ = tx.send(image);
            }),
        );
        std::thread::scope(|s| {
            let running = s.spawn(op);
            let mut crashed = false;
            loop {
                match rx.recv_timeout(Duration::from_millis(5)) {
                    Ok(image) => {
                        self.recover_mds(image)?;
                        crashed = true;
                        break;
                    }
                    // Disarmed: the hook (and its sender) went.
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    Err(mpsc::RecvTimeoutError::Timeout) if running.is_finished() => {
                        // Fired meanwhile, or gone now: the next receive tells.
                        self.mds_power.disarm_crash();
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                }
            }
            let r = running
                .join()
                .map_err(|_| anyhow!("the operation panicked"))?;
            Ok((r, crashed))
        })
    }

    fn slot(&self, m: MemberId) -> usize {
        assert!(m.group < self.cfg.stores && m.index < self.cfg.replicas);
        (m.group * self.cfg.replicas + m.index) as usize
    }

    fn start_store(&mut self, m: MemberId) -> Result<()> {
        let cfg = DsConfig {
            pool: self.dir.path().join(store_pool(m)),
            pool_mode: self.cfg.store_mode.name().into(),
            group: m.group,
            index: m.index,
            listen: store_addr(m),
            mds: MDS_ADDR.into(),
            ..Default::default()
        };
        let fabric = self.fabric();
        let name = format!("sim-ds{}.{}", m.group, m.index);
        let node = Node::start(&name, move |stop, ready| {
            orion_ds::run(cfg, fabric, stop, |_| {
                let _ = ready.send(());
            })
        })?;
        let slot = self.slot(m);
        self.stores[slot] = Some(node);
        Ok(())
    }

    /// Whether the data store `m` runs.
    pub fn store_running(&self, m: MemberId) -> bool {
        self.stores[self.slot(m)].is_some()
    }

    /// Kills the data store `m` as a crashed process dies (cut off the network, its
    /// pool file as it was), and leaves it down.
    pub fn kill_store(&mut self, m: MemberId) -> Result<()> {
        self.net.kill_listener(&store_addr(m));
        let slot = self.slot(m);
        if let Some(mut n) = self.stores[slot].take() {
            n.reap().context("the crashed data store")?;
        }
        Ok(())
    }

    /// Starts the data store `m` again from its pool (it resyncs if it missed writes).
    pub fn revive_store(&mut self, m: MemberId) -> Result<()> {
        if !self.store_running(m) {
            self.start_store(m)?;
        }
        Ok(())
    }

    /// Kills the data store `m` from another thread after `after`, while `op` runs
    /// here: a store that dies inside an operation.
    pub fn kill_store_during<R>(
        &mut self,
        m: MemberId,
        after: Duration,
        op: impl FnOnce() -> R,
    ) -> Result<R> {
        let slot = self.slot(m);
        let Some(mut node) = self.stores[slot].take() else {
            return Ok(op());
        };
        let net = self.net.clone();
        let addr = store_addr(m);
        let r = std::thread::scope(|s| {
            let killer = s.spawn(move || {
                std::thread::sleep(after);
                net.kill_listener(&addr);
                node.reap()
            });
            let r = op();
            killer
                .join()
                .map_err(|_| anyhow!("the killer panicked"))?
                .context("the crashed data store")?;
            Ok::<R, anyhow::Error>(r)
        })?;
        Ok(r)
    }

    /// Compares, page by page, the replicas of every group over the pages that files
    /// name (`orion fsck --replicas`; the cluster must be stopped); returns how many
    /// pages matched.
    pub fn compare_replicas(&self) -> Result<u64> {
        let meta = Pool::open(&self.mds_pool(), ModeChoice::Force(Mode::Volatile))?;
        let report = orion_meta::fsck::check(&meta, None);
        let pools = (0..self.cfg.stores)
            .flat_map(|g| (0..self.cfg.replicas).map(move |i| MemberId::new(g, i)))
            .map(|m| {
                let path = self.dir.path().join(store_pool(m));
                Pool::open(&path, ModeChoice::Force(Mode::Volatile)).map_err(anyhow::Error::from)
            })
            .collect::<Result<Vec<Pool>>>()?;
        let refs: Vec<&Pool> = pools.iter().collect();
        let r = orion_meta::fsck::compare_replicas(&report.named, &refs);
        if !r.problems.is_empty() {
            bail!("{:?}", r.problems);
        }
        Ok(r.equal)
    }

    /// A new client of the given kind.
    pub fn client(&self, kind: ClientKind) -> Result<Client> {
        self.client_with(kind, |_| {})
    }

    /// [`Cluster::client`] with settings of the test's own.
    pub fn client_with(
        &self,
        kind: ClientKind,
        tweak: impl FnOnce(&mut ClientConfig),
    ) -> Result<Client> {
        let mut cfg = ClientConfig {
            mds: MDS_ADDR.into(),
            internal: kind.internal,
            persistence: if kind.optimistic {
                "optimistic"
            } else {
                "pessimistic"
            }
            .into(),
            consistency: if kind.weak { "weak" } else { "strong" }.into(),
            op_timeout_ms: 10_000,
            reconnect_ms: 10_000,
            cache_mib: 4,
            chunk_pages: 16,
            name: format!("sim client ({kind:?})"),
            ..Default::default()
        };
        tweak(&mut cfg);
        Client::connect(cfg, self.fabric()).map_err(|e| anyhow!("client: {e}"))
    }

    /// Stops the MDS, checks its pool with fsck, and starts it again from the pool.
    pub fn restart_mds(&mut self) -> Result<()> {
        if let Some(mut n) = self.mds.take() {
            n.stop().context("the MDS stopped with an error")?;
        }
        self.fsck()
            .context("fsck of the MDS pool while the MDS was down")?;
        self.start_mds()
    }

    /// Kills the data store `m` as a crashed process dies (cut off the network, its
    /// pool file as it was) and starts it again from its pool.
    pub fn restart_store(&mut self, m: MemberId) -> Result<()> {
        self.kill_store(m)?;
        self.start_store(m)
    }

    /// Checks the MDS pool offline (the MDS must be stopped, or idle).
    pub fn fsck(&self) -> Result<()> {
        let pool = Pool::open(&self.mds_pool(), ModeChoice::Force(Mode::Volatile))?;
        let r = orion_meta::fsck::check(&pool, None);
        if !r.is_clean() {
            bail!("fsck: {}: {:?}", r.summary(), r.problems);
        }
        Ok(())
    }

    /// Stops every server (MDS last, so stores leave cleanly).
    pub fn stop(&mut self) -> Result<()> {
        for s in self.stores.iter_mut() {
            if let Some(mut n) = s.take() {
                n.stop()?;
            }
        }
        if let Some(mut n) = self.mds.take() {
            n.stop()?;
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Free inodes, as `statfs` counts them through client `c`.
pub fn free_inodes(c: &Client) -> u64 {
    c.statfs().unwrap().ffree
}

/// Waits (up to a generous bound: this is not a timing check) until the MDS's free
/// inodes are `want`, as when unlinked files and removed directories were destroyed.
pub fn wait_free_inodes(c: &Client, want: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while free_inodes(c) != want {
        assert!(
            std::time::Instant::now() < deadline,
            "free inodes stayed {} (want {want})",
            free_inodes(c)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
