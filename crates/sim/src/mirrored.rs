//! A cluster whose MDS has a mirror (Orion §3.1): the embedded cluster manager (on
//! loopback TCP, in this process), a primary and a mirror MDS on the mock network,
//! each with a pool of its own, and one data store. At any moment, also inside a
//! client's operation, the primary can be killed as a crashed process dies (cut off
//! the network), cut off from its mirror and the manager, or split from its mirror,
//! its link to the mirror can break at random, or its mirror can be killed
//! ([`MdsFault`]). The mirror takes
//! over when the primary's term ends; a killed MDS starts again as the mirror of the
//! new primary and copies its pool.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use orion_client::{Client, ClientConfig};
use orion_ds::DsConfig;
use orion_fabric::mock::{Link, MockNet};
use orion_fabric::{Backend, FabricConfig, Secret};
use orion_manager::embedded::{EmbeddedManager, EmbeddedServer};
use orion_manager::Manager;
use orion_mds::MdsConfig;
use orion_pmem::{Mode, ModeChoice, Pool};
use orion_proto::MemberId;

use crate::cluster::{store_addr, store_pool, Node};

/// The MDSs' names and addresses on the mock network.
pub const MDSS: [(&str, &str); 2] = [("mds-a", "mds-a:7410"), ("mds-b", "mds-b:7410")];

/// What strikes the primary MDS in [`MirroredCluster::fault_during`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MdsFault {
    /// Its process dies (cut off from everything at once).
    Kill,
    /// It is cut off from its mirror and from the cluster manager, while clients and
    /// the store still reach it: its lease lapses and the mirror takes over.
    Isolate,
    /// The link between it and its mirror is cut: it goes on alone, and the mirror
    /// may not take over until it caught up again.
    Split,
    /// Connections between it and its mirror break at random, with this probability
    /// per operation (a reliable connection loses messages only by breaking).
    Flaky(f64),
    /// Its mirror's process dies (and starts again: it drains what its ring holds,
    /// then copies the pool anew).
    KillMirror,
}

pub struct MirroredCluster {
    pub net: MockNet,
    secret: Secret,
    dir: tempfile::TempDir,
    manager: EmbeddedServer,
    mds: [Option<Node>; 2],
    store: Option<Node>,
    /// The MDS pools' mode: volatile (a mirror durable on delivery) or msync (one that
    /// must flush, and says how far it applied).
    mds_mode: Mode,
}

impl MirroredCluster {
    /// Formats mds-a's pool and the store's, starts mds-a (the first primary), mds-b
    /// (its mirror, without a pool) and the store, and waits until the mirror is in
    /// sync. The MDS pools are volatile.
    pub fn start(seed: u64) -> Result<MirroredCluster> {
        Self::start_with(seed, Mode::Volatile)
    }

    /// [`MirroredCluster::start`] with MDS pools of `mds_mode`.
    pub fn start_with(seed: u64, mds_mode: Mode) -> Result<MirroredCluster> {
        let dir = tempfile::Builder::new()
            .prefix("orion-sim-mirror-")
            .tempdir_in("/dev/shm")
            .context("a directory for the pools in /dev/shm")?;
        let volatile = ModeChoice::Force(Mode::Volatile);
        orion_mds::format_pool(
            &dir.path().join("mds-a.pool"),
            16 << 20,
            ModeChoice::Force(mds_mode),
        )?;
        let m = MemberId::new(0, 0);
        orion_ds::format_pool(&dir.path().join(store_pool(m)), 32 << 20, 0, volatile)?;
        let manager = EmbeddedServer::start("127.0.0.1:0", &dir.path().join("epoch"))?;
        let mut c = MirroredCluster {
            net: MockNet::new(seed),
            secret: Secret::generate(),
            dir,
            manager,
            mds: [None, None],
            store: None,
            mds_mode,
        };
        c.start_mds(0)?;
        c.wait_primary("mds-a", Duration::from_secs(20))?;
        c.start_mds(1)?;
        c.wait_in_sync("mds-b", Duration::from_secs(20))?;
        let cfg = DsConfig {
            pool: c.dir.path().join(store_pool(m)),
            pool_mode: "volatile".into(),
            listen: store_addr(m),
            mds: Self::mds_setting(),
            ..Default::default()
        };
        let fabric = c.fabric();
        c.store = Some(Node::start("sim-ds0.0", move |stop, ready| {
            orion_ds::run(cfg, fabric, stop, |_| {
                let _ = ready.send(());
            })
        })?);
        Ok(c)
    }

    fn mds_setting() -> String {
        format!("{},{}", MDSS[0].1, MDSS[1].1)
    }

    pub fn fabric(&self) -> FabricConfig {
        let mut f = FabricConfig::new(Backend::Mock(self.net.clone()), self.secret.clone());
        f.connect_timeout = Duration::from_secs(5);
        f.op_timeout = Duration::from_secs(10);
        f
    }

    fn pool(&self, k: usize) -> std::path::PathBuf {
        self.dir.path().join(format!("{}.pool", MDSS[k].0))
    }

    /// Starts MDS `k` (it becomes primary or mirror, as the manager decides).
    fn start_mds(&mut self, k: usize) -> Result<()> {
        let cfg = MdsConfig {
            pool: self.pool(k),
            pool_mode: self.mds_mode.name().into(),
            listen: MDSS[k].1.into(),
            grace_ms: 20,
            // Past the clients' call timeout (10 s here), as the default is past 30 s.
            open_reclaim_ms: 12_000,
            map_lease_ms: 100,
            manager: format!("embedded:{}", self.manager.addr),
            name: MDSS[k].0.into(),
            cluster: "sim".into(),
            lease_ms: 1000,
            // Short: a new MDS holds every change for one lease.
            cache_lease_ms: 20,
            ..Default::default()
        };
        let fabric = self.fabric();
        let (node, _ready) = Node::spawn(&format!("sim-{}", MDSS[k].0), move |stop, _ready| {
            orion_mds::run(cfg, fabric, stop, |_| {})
        })?;
        self.mds[k] = Some(node);
        Ok(())
    }

    fn ask(&self) -> Result<EmbeddedManager> {
        EmbeddedManager::connect(&self.manager.addr, Duration::from_secs(5))
    }

    /// The MDS that holds the primary role now, by index.
    pub fn primary(&self) -> Result<Option<usize>> {
        let p = self.ask()?.primary()?;
        Ok(p.and_then(|p| MDSS.iter().position(|m| m.0 == p.name)))
    }

    /// The cluster map the manager keeps (its home with a manager).
    pub fn manager_map(&self) -> Result<Option<String>> {
        self.ask()?.map()
    }

    /// Asks `f` every 5 ms until it answers, for at most `within`; `what` says what
    /// did not happen when it never does.
    fn wait_for<T>(
        &self,
        what: &str,
        within: Duration,
        mut f: impl FnMut(&mut EmbeddedManager) -> Result<Option<T>>,
    ) -> Result<T> {
        let t0 = Instant::now();
        loop {
            if let Some(t) = f(&mut self.ask()?)? {
                return Ok(t);
            }
            if t0.elapsed() > within {
                bail!("{what} within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until some MDS holds the primary role (a fault may have ended a term,
    /// and the next has not begun); returns its index.
    pub fn wait_any_primary(&self, within: Duration) -> Result<usize> {
        self.wait_for("no MDS took the primary role", within, |m| {
            Ok(m.primary()?
                .and_then(|p| MDSS.iter().position(|x| x.0 == p.name)))
        })
    }

    fn wait_primary(&self, name: &str, within: Duration) -> Result<()> {
        let what = format!("{name} did not take the primary role");
        self.wait_for(&what, within, |m| {
            Ok(m.primary()?.filter(|p| p.name == name).map(|_| ()))
        })
    }

    /// Waits until the manager lets `name` take over (it holds every update).
    pub fn wait_in_sync(&self, name: &str, within: Duration) -> Result<()> {
        let what = format!("{name} did not catch up");
        self.wait_for(&what, within, |m| {
            Ok(m.eligible()?.iter().any(|n| n == name).then_some(()))
        })
    }

    /// Lets `fault` strike the primary from another thread after `after`, while `op`
    /// runs here; then ends it (the killed MDS starts again, as the mirror of the one
    /// that took over; a cut link heals) and waits until an MDS serves. Returns what
    /// `op` returned, and whether the fault struck while `op` still ran.
    pub fn fault_during<R>(
        &mut self,
        fault: MdsFault,
        after: Duration,
        op: impl FnOnce() -> R,
    ) -> Result<(R, bool)> {
        let k = self.primary()?.ok_or_else(|| anyhow!("no primary"))?;
        let ((name, addr), (mirror_name, mirror)) = (MDSS[k], MDSS[1 - k]);
        let net = self.net.clone();
        let manager = &self.manager;
        let op_done = std::sync::atomic::AtomicBool::new(false);
        let r = std::thread::scope(|s| {
            let done = &op_done;
            let striker = s.spawn(move || {
                std::thread::sleep(after);
                match fault {
                    // Everything at once, as a crashed process: the mock network and
                    // the manager.
                    MdsFault::Kill => {
                        manager.cut_off(name);
                        net.kill_listener(addr);
                    }
                    MdsFault::Isolate => {
                        manager.cut_off(name);
                        net.set_link(addr, mirror, Link::Cut);
                    }
                    MdsFault::Split => {
                        net.set_link(addr, mirror, Link::Cut);
                    }
                    MdsFault::Flaky(p) => {
                        net.set_link(addr, mirror, Link::Flaky(p));
                    }
                    MdsFault::KillMirror => {
                        manager.cut_off(mirror_name);
                        net.kill_listener(mirror);
                    }
                }
                !done.load(std::sync::atomic::Ordering::Acquire)
            });
            let r = op();
            op_done.store(true, std::sync::atomic::Ordering::Release);
            let inside = striker
                .join()
                .map_err(|_| anyhow!("the striker panicked"))?;
            Ok::<(R, bool), anyhow::Error>((r, inside))
        })?;
        match fault {
            MdsFault::Kill => {
                self.wait_primary(MDSS[1 - k].0, Duration::from_secs(20))?;
                // The killed node's thread ends (cut off, it can do nothing on its way
                // out); then the MDS starts again, with its name back.
                let mut node = self.mds[k].take().expect("the primary runs");
                node.reap().context("the killed MDS")?;
                self.manager.restore(name);
                self.start_mds(k)?;
            }
            MdsFault::Isolate => {
                // Its lease lapses; the mirror, still listed, takes over. Then it
                // reaches everyone again, and mirrors the new primary.
                self.wait_primary(MDSS[1 - k].0, Duration::from_secs(20))?;
                self.net.set_link(addr, mirror, Link::Up);
                self.manager.restore(name);
            }
            MdsFault::Split | MdsFault::Flaky(_) => {
                self.net.set_link(addr, mirror, Link::Up);
            }
            MdsFault::KillMirror => {
                let mut node = self.mds[1 - k].take().expect("the mirror runs");
                node.reap().context("the killed mirror")?;
                self.manager.restore(mirror_name);
                self.start_mds(1 - k)?;
            }
        }
        Ok(r)
    }

    /// Cuts the primary off from its mirror and the manager while clients and the
    /// store still reach it, and waits until the mirror took over; returns the old
    /// primary's index. [`MirroredCluster::heal`] lets it reach everyone again.
    pub fn isolate_primary(&mut self) -> Result<usize> {
        let k = self.primary()?.ok_or_else(|| anyhow!("no primary"))?;
        self.manager.cut_off(MDSS[k].0);
        self.net.set_link(MDSS[k].1, MDSS[1 - k].1, Link::Cut);
        self.wait_primary(MDSS[1 - k].0, Duration::from_secs(20))?;
        Ok(k)
    }

    /// Undoes [`MirroredCluster::isolate_primary`] of MDS `k`: it mirrors the new
    /// primary.
    pub fn heal(&mut self, k: usize) -> Result<()> {
        self.net.set_link(MDSS[k].1, MDSS[1 - k].1, Link::Up);
        self.manager.restore(MDSS[k].0);
        Ok(())
    }

    /// A client that knows both MDSs.
    pub fn client(&self) -> Result<Client> {
        self.client_with(|_| {})
    }

    /// [`MirroredCluster::client`] with settings of the test's own.
    pub fn client_with(&self, tweak: impl FnOnce(&mut ClientConfig)) -> Result<Client> {
        let cfg = ClientConfig {
            mds: Self::mds_setting(),
            internal: false,
            op_timeout_ms: 10_000,
            reconnect_ms: 20_000,
            cache_mib: 4,
            chunk_pages: 16,
            name: "sim client".into(),
            ..Default::default()
        };
        let mut cfg = cfg;
        tweak(&mut cfg);
        Client::connect(cfg, self.fabric()).map_err(|e| anyhow!("client: {e}"))
    }

    /// The pages in which the two MDS pools differ (the cluster quiet, the mirror in
    /// sync and done applying).
    pub fn differing_pages(&self) -> Result<Vec<u64>> {
        let open = |k| Pool::open(&self.pool(k), ModeChoice::Force(Mode::Volatile));
        orion_meta::fsck::differing_pages(&open(0)?, &open(1)?).map_err(anyhow::Error::msg)
    }

    /// Checks both MDS pools with fsck (the cluster stopped). A mirror stopped while
    /// it copied its primary's pool left a copy marker: its pool is not whole by
    /// design (its MDS copies it again at its next start, and never serves from it),
    /// so it is not checked; the other pool must then be the primary's.
    pub fn fsck(&self) -> Result<()> {
        let mut checked = 0;
        for (k, (name, _)) in MDSS.iter().enumerate() {
            if orion_mds::copy_marker(&self.pool(k)).exists() {
                continue;
            }
            let pool = Pool::open(&self.pool(k), ModeChoice::Force(Mode::Volatile))?;
            let r = orion_meta::fsck::check(&pool, None);
            if !r.is_clean() {
                bail!("fsck of {name}: {}: {:?}", r.summary(), r.problems);
            }
            checked += 1;
        }
        if checked == 0 {
            bail!("both MDS pools carry a copy marker: neither is whole");
        }
        Ok(())
    }

    /// Stops every server: the store, the mirror, then the primary.
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut n) = self.store.take() {
            n.stop()?;
        }
        let first = self.primary().ok().flatten().map_or(0, |p| 1 - p);
        for k in [first, 1 - first] {
            if let Some(mut n) = self.mds[k].take() {
                n.stop()?;
            }
        }
        Ok(())
    }
}

impl Drop for MirroredCluster {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
