//! Starting an MDS: checking its configuration, listening, and, with a cluster manager,
//! mirroring the primary until this MDS takes the role ([`crate::follow`]); then the
//! serving loop ([`crate::server`]).

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use orion_fabric::{CompletionQueue, Domain, FabricConfig};
use orion_format::{PoolKind, Superblock, SUPERBLOCK_SIZE};
use orion_meta::{MetaEngine, SystemClock};
use orion_pmem::{ModeChoice, Pool};
use orion_proto::Channel;
use tracing::{info, warn};

use crate::follow::{pool_cluster, Follower};
use crate::primary::open_manager;
use crate::replies::ReplyTable;
use crate::server::serve_loop;
use crate::{MdsConfig, Ready};
use orion_format::hex;

/// Creates and formats an MDS pool (a new cluster).
pub fn format_pool(path: &Path, size: u64, mode: ModeChoice) -> Result<()> {
    if path.exists() {
        bail!(
            "{} already exists: refusing to format over it (delete it first to start a new \
             cluster)",
            path.display()
        );
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // A growing pool: its file space (memory, on tmpfs) is taken as inodes and log
    // pages are, not all at once.
    let pool =
        Pool::create_growing(path, size, mode).with_context(|| format!("{}", path.display()))?;
    let now = orion_meta::Clock::now(&SystemClock);
    let sb = Superblock::new_metadata(
        size,
        orion_format::random_uuid(),
        orion_format::random_uuid(),
        now,
    )
    .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    MetaEngine::format(&pool, &sb, now).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    Ok(())
}

/// Opens the pool, recovers it, listens, calls `ready`, and serves until `stop` is set.
/// With a cluster manager it first mirrors the primary, and serves once it takes the
/// role (its pool may then be absent at start: the copy of the primary's makes it).
pub fn run(
    cfg: MdsConfig,
    fabric: FabricConfig,
    stop: Arc<AtomicBool>,
    ready: impl FnOnce(&Ready),
) -> Result<()> {
    check_config(&cfg)?;
    let mode: ModeChoice = cfg.pool_mode.parse().map_err(anyhow::Error::msg)?;
    if cfg.manager.is_empty() {
        if !cfg.pool.exists() {
            bail!(
                "MDS pool {} does not exist: create it with `orion mds --format` (or let \
                 `orion up` do it)",
                cfg.pool.display()
            );
        }
        let pool = Pool::open(&cfg.pool, mode)
            .map(Pool::growing)
            .with_context(|| format!("opening MDS pool {}", cfg.pool.display()))?;
        return serve(cfg, pool, fabric, stop, ready);
    }
    let cluster = match (cfg.cluster.as_str(), pool_cluster(&cfg.pool)) {
        ("", Some(uuid)) => hex(&uuid),
        ("", None) => bail!(
            "{} is not an MDS pool and `cluster` is not set: a mirror without a pool of \
             its own needs the cluster's name (`cluster` in [mds]) to find its primary",
            cfg.pool.display()
        ),
        (name, _) => name.to_string(),
    };
    // Listening first: the address is what the manager records for the primary. The
    // role comes before the pool is recovered (recovery writes to it).
    let mut l = Listening::open(&cfg, fabric, &stop)?;
    let name = match cfg.name.as_str() {
        "" => format!("mds@{}", l.addr),
        n => n.to_string(),
    };
    let lease = Duration::from_millis(cfg.lease_ms);
    let mut ready = Some(ready);
    // The replies remembered as primary, kept across a lost role (see `Ended`).
    let mut replies = ReplyTable::default();
    loop {
        let manager = open_manager(&cfg.manager, &cluster, lease).context("the cluster manager")?;
        let follower = Follower {
            cfg: &cfg,
            domain: &l.domain,
            name: &name,
            addr: &l.addr,
            lease,
            stop: &stop,
            incoming: &l.incoming,
        };
        let Some((role, kept)) = follower.until_primary(Some(manager), replies)? else {
            return Ok(()); // stopped while mirroring
        };
        let pool = Pool::open(&cfg.pool, mode)
            .map(Pool::growing)
            .with_context(|| format!("opening MDS pool {}", cfg.pool.display()))?;
        // Only the first term says "ready" (what starters wait for); later ones log.
        let said = ready.take();
        let announce = |r: &Ready| match said {
            Some(f) => f(r),
            None => info!("serving again: {}", r.describe),
        };
        match serve_loop(
            cfg.clone(),
            pool,
            l,
            Some(role),
            kept,
            stop.clone(),
            announce,
        )? {
            Ended::Stopped => return Ok(()),
            Ended::LostRole(again, kept) => {
                l = again;
                replies = kept;
            }
        }
    }
}

/// [`run`] on a pool the caller mapped (the cluster simulator's crash-recorded pool),
/// without a cluster manager: `pool` must map the file `cfg.pool`, which the fabric
/// registers for one-sided reads.
pub fn serve(
    cfg: MdsConfig,
    pool: Pool,
    fabric: FabricConfig,
    stop: Arc<AtomicBool>,
    ready: impl FnOnce(&Ready),
) -> Result<()> {
    assert_eq!(
        pool.path(),
        cfg.pool.as_path(),
        "the pool served is the file the fabric registers"
    );
    check_config(&cfg)?;
    if !cfg.manager.is_empty() {
        bail!("an MDS with a cluster manager starts through `run`");
    }
    let superblock = pool.read_vec(0, SUPERBLOCK_SIZE)?;
    match Superblock::decode(&superblock) {
        Ok(sb) if sb.kind == PoolKind::Metadata => {}
        Ok(_) => bail!(
            "{} is a data pool, not an MDS pool: point `pool` at the MDS pool",
            cfg.pool.display()
        ),
        Err(e) => bail!(
            "{} is not an OrionFS MDS pool or is damaged ({e}): run `orion fsck {}`",
            cfg.pool.display(),
            cfg.pool.display()
        ),
    };
    let l = Listening::open(&cfg, fabric, &stop)?;
    match serve_loop(cfg, pool, l, None, ReplyTable::default(), stop, ready)? {
        Ended::Stopped => Ok(()),
        Ended::LostRole(..) => bail!("an MDS without a cluster manager lost a role it never had"),
    }
}

fn check_config(cfg: &MdsConfig) -> Result<()> {
    if cfg.name.contains(|c: char| c == ',' || c.is_whitespace()) {
        bail!(
            "name = {:?}: an MDS name has no commas or spaces (the cluster manager lists \
             names separated by commas)",
            cfg.name
        );
    }
    if cfg.replicas == 0 || cfg.replicas > 64 {
        bail!(
            "replicas = {}: a group has 1 to 64 data stores",
            cfg.replicas
        );
    }
    if cfg.persist_timeout_ms <= cfg.map_lease_ms {
        bail!(
            "persist_timeout_ms = {} must exceed map_lease_ms = {}: a commit waits out the \
             map lease after a data store leaves",
            cfg.persist_timeout_ms,
            cfg.map_lease_ms
        );
    }
    if cfg.heartbeat_timeout_ms < 300 {
        bail!(
            "heartbeat_timeout_ms = {}: stores send a heartbeat every quarter of it, \
             which must be 75 ms or more: the timeout is at least 300 ms",
            cfg.heartbeat_timeout_ms
        );
    }
    if !cfg.manager.is_empty() && cfg.lease_ms < 500 {
        bail!(
            "lease_ms = {}: the primary stops 100 ms before its lease ends and renews it \
             every quarter of it, so the lease is at least 500 ms",
            cfg.lease_ms
        );
    }
    Ok(())
}

/// A listening MDS: its fabric, address, completion queue, and the connections its
/// acceptor hands over.
pub(crate) struct Listening {
    pub domain: Domain,
    pub addr: String,
    pub cq: Arc<CompletionQueue>,
    pub acceptor: orion_proto::channel::AcceptorThreads,
    pub incoming: mpsc::Receiver<Channel>,
}

impl Listening {
    pub(crate) fn open(
        cfg: &MdsConfig,
        fabric: FabricConfig,
        stop: &Arc<AtomicBool>,
    ) -> Result<Listening> {
        let domain = Domain::open(fabric).context("opening the fabric")?;
        let listener = domain
            .listen(&cfg.listen)
            .with_context(|| format!("listening on {}", cfg.listen))?;
        let addr = listener.local_addr();
        let cq = Arc::new(domain.completion_queue()?);
        cq.look_at_peers_every(orion_fabric::DAEMON_PEER_LOOKS);
        let (acceptor, incoming) = orion_proto::channel::spawn_acceptor(
            "mds-accept",
            &domain,
            listener,
            cq.clone(),
            stop.clone(),
            |m| warn!("{m}"),
        )?;
        Ok(Listening {
            domain,
            addr,
            cq,
            acceptor,
            incoming,
        })
    }
}

/// How serving ended.
pub(crate) enum Ended {
    /// Asked to stop.
    Stopped,
    /// The primary role was lost: still listening, to mirror the new primary, with the
    /// replies it remembered (they hold until it mirrors another primary).
    LostRole(Listening, ReplyTable),
}
