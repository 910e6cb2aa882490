//! The primary role (the fail-over issue): with a cluster manager configured
//! (`MdsConfig::manager`), an MDS serves only while it holds the role. It waits for the
//! role before it touches its pool (a second MDS started by mistake for the same
//! cluster waits instead of serving), a thread renews the lease, and the serving loop
//! stops the MDS once the term may have ended ([`PrimaryRole::holds`]): an MDS that lost its
//! lease acknowledges nothing more.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use orion_manager::embedded::EmbeddedManager;
use orion_manager::etcd::EtcdManager;
use orion_manager::Manager;
use tracing::{info, warn};

/// How long before its term ends the MDS stops answering: meant to exceed one turn of
/// its loop (a longer stall, such as a stop of the process, is caught by the check
/// before each reply).
pub const MARGIN: Duration = Duration::from_millis(100);

/// The role held, and the thread that keeps it.
pub struct PrimaryRole {
    pub epoch: u64,
    pub kind: &'static str,
    /// When the term ends, in microseconds after `base` (renewals move it on).
    expires_us: Arc<AtomicU64>,
    base: Instant,
    stop: Arc<AtomicBool>,
    keeper: Option<JoinHandle<()>>,
}

/// Opens the manager named by `spec` ("embedded:ADDR" or "etcd:ENDPOINTS") for the
/// cluster `cluster`.
fn open(spec: &str, cluster: &str, lease: Duration) -> Result<Box<dyn Manager>> {
    // A call that takes longer than a quarter of the lease is as good as failed: the
    // term must not run out while one renewal waits.
    let timeout = (lease / 4).min(Duration::from_secs(2));
    match spec.split_once(':') {
        Some(("embedded", addr)) => Ok(Box::new(EmbeddedManager::connect(addr, timeout)?)),
        Some(("etcd", endpoints)) => {
            Ok(Box::new(EtcdManager::connect(endpoints, cluster, timeout)?))
        }
        _ => {
            bail!("manager = {spec:?}: expected \"embedded:HOST:PORT\" or \"etcd:HOST:PORT[,...]\"")
        }
    }
}

impl PrimaryRole {
    /// Waits until this MDS (`name`, reached at `addr`) holds the primary role of
    /// `cluster` (or `stop` is set: `None`).
    pub fn take(
        spec: &str,
        cluster: &str,
        name: &str,
        addr: &str,
        lease: Duration,
        stop: &AtomicBool,
    ) -> Result<Option<PrimaryRole>> {
        let mut m = open(spec, cluster, lease).context("the cluster manager")?;
        let mut said = false;
        let term = loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
            match m.try_acquire(name, addr, lease) {
                Ok(Some(t)) => break t,
                Ok(None) if !said => {
                    let holder = m
                        .primary()
                        .ok()
                        .flatten()
                        .map(|p| format!("{} at {} (epoch {})", p.name, p.addr, p.epoch));
                    info!(
                        "waiting for the primary role: {} holds it",
                        holder.unwrap_or_else(|| "another MDS".into())
                    );
                    said = true;
                }
                Ok(None) => {}
                // A manager slow or restarting now and then: ask again.
                Err(e) => warn!("asking the cluster manager for the primary role: {e:#}"),
            }
            std::thread::sleep(lease / 4);
        };
        let base = Instant::now();
        let us = move |t: Instant| t.saturating_duration_since(base).as_micros() as u64;
        let expires_us = Arc::new(AtomicU64::new(us(term.expires)));
        let (epoch, kind) = (term.epoch, m.kind());
        info!("{name} is the primary (epoch {epoch}, {kind} manager, lease {lease:?})");
        let stop = Arc::new(AtomicBool::new(false));
        let (e, s) = (expires_us.clone(), stop.clone());
        let keeper = std::thread::Builder::new()
            .name("mds-lease".into())
            .spawn(move || {
                let mut term = term;
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(lease / 4);
                    match m.renew(&mut term) {
                        Ok(true) => e.store(us(term.expires), Ordering::Release),
                        Ok(false) => {
                            warn!("the primary lease of epoch {} was lost", term.epoch);
                            e.store(0, Ordering::Release);
                            return;
                        }
                        // The term runs out by the clock unless a renewal gets through.
                        Err(err) => warn!("renewing the primary lease: {err:#}"),
                    }
                }
                let _ = m.resign(term);
            })?;
        Ok(Some(PrimaryRole {
            epoch,
            kind,
            expires_us,
            base,
            stop,
            keeper: Some(keeper),
        }))
    }

    /// Whether the term lasts beyond `now` plus [`MARGIN`].
    pub fn holds(&self, now: Instant) -> bool {
        let end = self.base + Duration::from_micros(self.expires_us.load(Ordering::Acquire));
        now + MARGIN < end
    }
}

impl Drop for PrimaryRole {
    /// A clean stop gives the role up at once.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.keeper.take() {
            let _ = t.join();
        }
    }
}
