//! A store's resync (Orion §5.4): a replica that joined without every committed page
//! of its group copies them from an in-sync peer before it serves reads. It takes
//! client writes meanwhile (the store's loop goes on serving), so this runs on a
//! thread of its own, with a fabric domain of its own: it asks the MDS for the plan
//! piece by piece (which pages, and from which peer: the MDS picks another when the
//! source dies), reads each run of pages one-sided from the peer, and writes and
//! persists them into the pool at the same place. The pages of the plan were in use
//! when the store joined, so nobody writes them during the copy (data is
//! copy-on-write, and the MDS holds freed pages until the resync ends).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use orion_fabric::{Access, CompletionQueue, Domain, FabricConfig, RemoteRegion};
use orion_format::PAGE_SIZE;
use orion_pmem::Pool;
use orion_progress::{Progress, Unit};
use orion_proto::{Channel, MemberId, Reply, ReplyBody, StoreRequest, StoreToMds};
use tracing::{info, warn};

/// Pages read per one-sided read (1 MiB).
const RUN_PAGES: u64 = 256;

/// Failed reads from sources in a row before the resync gives up (and starts over
/// after a pause); in between it asks the MDS for a source again every 200 ms, which
/// names another once it has seen the source die (`heartbeat_timeout_ms` at most).
const SOURCE_RETRIES: u32 = 50;

/// What a resync needs: who it is, where the MDS is, and the pool to fill.
pub struct Job {
    pub member: MemberId,
    pub incarnation: u64,
    pub mds: String,
    pub fabric: FabricConfig,
    pub pool: Arc<Pool>,
    pub page_area_off: u64,
    pub page_count: u64,
    /// Counts the pages copied as they land (the store's metrics).
    pub copied_pages: prometheus_client::metrics::counter::Counter,
    /// Set when the store gives this resync up (it lost the MDS, or stops).
    pub cancel: Arc<AtomicBool>,
}

/// What a finished resync did.
#[derive(Debug)]
pub struct Copied {
    pub pages: u64,
    pub secs: f64,
}

impl Copied {
    pub fn mib_per_s(&self) -> f64 {
        (self.pages * PAGE_SIZE) as f64 / (1 << 20) as f64 / self.secs.max(1e-9)
    }
}

struct Peer {
    addr: String,
    ch: Channel,
    region: RemoteRegion,
}

/// Copies every page of the plan; returns what it copied.
pub fn run(job: &Job) -> Result<Copied> {
    let t0 = Instant::now();
    let domain = Domain::open(job.fabric.clone()).context("opening the fabric")?;
    let cq = domain.completion_queue()?;
    let timeout = Duration::from_secs(10);
    let mut mds = Channel::new(&domain, domain.connect(&job.mds, &cq)?)?;
    let buf = domain.alloc_region((RUN_PAGES * PAGE_SIZE) as usize, Access::LOCAL)?;
    let mut peer: Option<Peer> = None;
    // One copy buffer for every run (the fabric's region is read into it).
    let mut bytes = Vec::with_capacity((RUN_PAGES * PAGE_SIZE) as usize);
    let mut next_page = 0u64;
    let mut copied = 0u64;
    let mut progress = ResyncProgress::new(job.member, job.page_count);
    let mut waiting_said = false;
    let mut failures = 0u32;
    let mut other = Vec::new();
    loop {
        if job.cancel.load(Ordering::Relaxed) {
            bail!("given up (the store lost the MDS, or stops)");
        }
        let ask = StoreToMds::ResyncPlan {
            member: job.member,
            incarnation: job.incarnation,
            from_page: next_page,
        };
        let (source, first_page, bits) = match mds.call(&cq, 1, &ask, timeout, &mut other)? {
            Reply::Ok(ReplyBody::ResyncPlan {
                source,
                first_page,
                bits,
            }) => (source, first_page, bits),
            Reply::Err { errno, .. } if errno == libc::EAGAIN => {
                if !waiting_said {
                    info!(
                        "{}: no in-sync peer is up to copy from; waiting",
                        job.member
                    );
                    waiting_said = true;
                }
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            Reply::Err { message, .. } => bail!("the MDS: {message}"),
            Reply::Ok(other) => bail!("unexpected reply to a resync plan: {other:?}"),
        };
        if bits.is_empty() {
            break;
        }
        if peer
            .as_ref()
            .is_none_or(|p| p.addr != source || !p.ch.conn.is_alive())
        {
            match open_peer(&domain, &cq, &source, timeout) {
                Ok(p) => peer = Some(p),
                Err(e) => {
                    failures += 1;
                    if failures > SOURCE_RETRIES {
                        return Err(e);
                    }
                    warn!("{}: {e:#}; asking the MDS for a source again", job.member);
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            }
        }
        let p = peer.as_mut().expect("opened");
        let mut runs = Vec::new();
        let mut i = 0u64;
        let n = bits.len() as u64 * 64;
        while i < n {
            if bits[(i / 64) as usize] & (1 << (i % 64)) == 0 {
                i += 1;
                continue;
            }
            let start = i;
            while i < n && i - start < RUN_PAGES && bits[(i / 64) as usize] & (1 << (i % 64)) != 0 {
                i += 1;
            }
            // Bit `start` was set, and a run stops at RUN_PAGES (the copy buffer's size).
            debug_assert!(
                i > start && i - start <= RUN_PAGES,
                "a run of the plan is empty or longer than the copy buffer"
            );
            let Some(at) = first_page.checked_add(start) else {
                bail!("a resync plan past the last page");
            };
            runs.push((at, i - start));
        }
        for (page, count) in runs {
            if job.cancel.load(Ordering::Relaxed) {
                bail!("given up (the store lost the MDS, or stops)");
            }
            if page
                .checked_add(count)
                .is_none_or(|end| end > job.page_count)
            {
                bail!(
                    "the plan names page {page}, beyond this store's {} pages",
                    job.page_count
                );
            }
            // The pair of the cut into runs above: the read lands in `buf`, whole.
            assert!(
                (1..=RUN_PAGES).contains(&count),
                "a run of {count} pages does not fit the copy buffer"
            );
            let len = (count * PAGE_SIZE) as usize;
            if let Err(e) = read_from(p, &cq, &buf, page * PAGE_SIZE, len, timeout) {
                failures += 1;
                if failures > SOURCE_RETRIES {
                    return Err(e.context(format!("reading pages from {}", p.addr)));
                }
                warn!(
                    "{}: the resync source {} failed ({e:#}); going on from page {page} \
                     with the source the MDS names",
                    job.member, p.addr
                );
                break;
            }
            failures = 0;
            bytes.resize(len, 0);
            buf.read(0, &mut bytes)?;
            let off = job.page_area_off + page * PAGE_SIZE;
            // Checked just above against the page count, which `server::run` checked
            // against the pool: the copy lands in the page area.
            assert!(
                off + len as u64 <= job.pool.len(),
                "a resync writes past the page area"
            );
            job.pool.write_data(off, &bytes)?;
            job.pool.persist(off, len)?;
            copied += count;
            job.copied_pages.inc_by(count);
            next_page = page + count;
        }
        if failures > 0 {
            // Asked again from the first page not copied: the MDS names the source.
            peer = None;
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        next_page = first_page.saturating_add(n);
        progress.at(next_page, copied, t0.elapsed());
    }
    progress.done();
    Ok(Copied {
        pages: copied,
        secs: t0.elapsed().as_secs_f64(),
    })
}

fn open_peer(domain: &Domain, cq: &CompletionQueue, addr: &str, timeout: Duration) -> Result<Peer> {
    let conn = domain
        .connect(addr, cq)
        .with_context(|| format!("connecting to the resync source {addr}"))?;
    let mut ch = Channel::new(domain, conn)?;
    let mut other = Vec::new();
    let region = match ch.call(cq, 1, &StoreRequest::Info, timeout, &mut other)? {
        Reply::Ok(ReplyBody::DsInfo(d)) => d.region,
        Reply::Err { message, .. } => bail!("the resync source {addr}: {message}"),
        Reply::Ok(other) => bail!("unexpected reply from {addr}: {other:?}"),
    };
    Ok(Peer {
        addr: addr.to_string(),
        ch,
        region,
    })
}

/// One one-sided read of `len` bytes at `roff` of the peer's page area into `buf`.
fn read_from(
    p: &Peer,
    cq: &CompletionQueue,
    buf: &orion_fabric::Region,
    roff: u64,
    len: usize,
    timeout: Duration,
) -> Result<()> {
    const WR: u64 = orion_proto::channel::USER_WR_BASE;
    p.ch.conn.post_read(WR, buf, 0, &p.region, roff, len)?;
    let deadline = Instant::now() + timeout;
    let mut batch = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(anyhow!("no completion within {timeout:?}"));
        }
        batch.clear();
        cq.wait(&mut batch, 16, left)?;
        for c in batch.drain(..) {
            if c.conn == p.ch.conn.id() && c.wr_id == WR {
                return c.status.map_err(|e| anyhow!("{e}"));
            }
        }
    }
}

/// How far a resync has come, in pool pages scanned (see [`orion_progress`]): a
/// daemon's log gets a line per tenth of the pool.
struct ResyncProgress(Progress);

impl ResyncProgress {
    fn new(member: MemberId, pages: u64) -> ResyncProgress {
        let what = format!("{member}: resync, pool scanned");
        ResyncProgress(Progress::new(what, pages, Unit::Items("pages")))
    }

    /// `scanned` pages of the pool passed, `copied` of them copied, in `spent`.
    fn at(&mut self, scanned: u64, copied: u64, spent: Duration) {
        let mib = (copied * PAGE_SIZE) as f64 / (1 << 20) as f64;
        let rate = mib / spent.as_secs_f64().max(1e-9);
        self.0.say(format!("{mib:.0} MiB copied ({rate:.0} MiB/s)"));
        self.0.set(scanned);
    }

    fn done(&mut self) {
        self.0.finish();
    }
}
