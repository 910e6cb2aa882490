//! The primary role (the fail-over issue): with a cluster manager configured
//! (`MdsConfig::manager`), an MDS serves only while it holds the role. It takes the role
//! before it touches its pool (until then it mirrors the primary, [`crate::follow`]), a
//! thread renews the lease, and the serving loop stops the MDS once the term may have
//! ended ([`PrimaryRole::holds`]): an MDS that lost its lease acknowledges nothing more.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use orion_manager::embedded::EmbeddedManager;
use orion_manager::etcd::EtcdManager;
use orion_manager::{Manager, Term};
use tracing::{info, warn};

/// How long before its term ends the MDS stops answering: meant to exceed one turn of
/// its loop (a longer stall, such as a stop of the process, is caught by the check
/// before each reply).
pub const MARGIN: Duration = Duration::from_millis(100);

/// The manager and the term it granted, shared by the loop and the lease keeper.
struct Held {
    manager: Box<dyn Manager>,
    term: Term,
}

/// The role held, and the thread that keeps it.
pub struct PrimaryRole {
    pub epoch: u64,
    pub kind: &'static str,
    /// This MDS's name for the manager.
    pub name: String,
    /// When the term ends, in microseconds after `base` (renewals move it on).
    expires_us: Arc<AtomicU64>,
    /// Set when this MDS gives the term up before it ends ([`MapSaver`]).
    given_up: Arc<AtomicBool>,
    base: Instant,
    held: Arc<Mutex<Held>>,
    stop: Arc<AtomicBool>,
    keeper: Option<JoinHandle<()>>,
}

/// Opens the manager named by `spec` ("embedded:ADDR" or "etcd:ENDPOINTS") for the
/// cluster `cluster`.
pub fn open_manager(spec: &str, cluster: &str, lease: Duration) -> Result<Box<dyn Manager>> {
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
    /// One attempt to take the role for this MDS (`name`, reached at `addr`). On
    /// success the manager moves into the role (its keeper renews the lease).
    pub fn try_take(
        manager: &mut Option<Box<dyn Manager>>,
        name: &str,
        addr: &str,
        lease: Duration,
    ) -> Result<Option<PrimaryRole>> {
        let Some(m) = manager.as_mut() else {
            bail!("no cluster manager");
        };
        let Some(term) = m.try_acquire(name, addr, lease)? else {
            return Ok(None);
        };
        let m = manager.take().expect("checked");
        let base = Instant::now();
        let us = move |t: Instant| t.saturating_duration_since(base).as_micros() as u64;
        let expires_us = Arc::new(AtomicU64::new(us(term.expires)));
        let (epoch, kind) = (term.epoch, m.kind());
        info!("{name} is the primary (epoch {epoch}, {kind} manager, lease {lease:?})");
        let held = Arc::new(Mutex::new(Held { manager: m, term }));
        let stop = Arc::new(AtomicBool::new(false));
        let (e, s, h) = (expires_us.clone(), stop.clone(), held.clone());
        let keeper = std::thread::Builder::new()
            .name("mds-lease".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(lease / 4);
                    let mut held = h.lock().unwrap_or_else(|p| p.into_inner());
                    let Held { manager, term } = &mut *held;
                    match manager.renew(term) {
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
                let mut held = h.lock().unwrap_or_else(|p| p.into_inner());
                let term = held.term.clone();
                let _ = held.manager.resign(term);
            })?;
        Ok(Some(PrimaryRole {
            epoch,
            kind,
            name: name.to_string(),
            expires_us,
            given_up: Arc::new(AtomicBool::new(false)),
            base,
            held,
            stop,
            keeper: Some(keeper),
        }))
    }

    /// Whether the term lasts beyond `now` plus [`MARGIN`].
    pub fn holds(&self, now: Instant) -> bool {
        now + MARGIN < self.ends() && !self.given_up.load(Ordering::Acquire)
    }

    /// When the term ends, by this host's clock, as far as the last renewal says.
    pub fn ends(&self) -> Instant {
        self.base + Duration::from_micros(self.expires_us.load(Ordering::Acquire))
    }

    /// Records which MDSs may take the role after this one: this one, and `mirror` if
    /// it is in sync. False when the term is over.
    pub fn set_eligible(&self, mirror: Option<&str>) -> Result<bool> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let Held { manager, term } = &mut *held;
        let mut names = vec![self.name.as_str()];
        names.extend(mirror);
        manager.set_eligible(term, &names)
    }
}

impl PrimaryRole {
    /// What saves the cluster map in the manager under this term.
    pub fn map_saver(&self) -> MapSaver {
        MapSaver {
            held: self.held.clone(),
            given_up: self.given_up.clone(),
        }
    }
}

/// Saves the cluster map in the cluster manager, its home there, as the holder of the
/// term. A primary that cannot record a change of the map gives its term up (its loop
/// stops, it acknowledges nothing more): it may not act on a map the next primary
/// would not find. The manager being unreachable ends the term within a lease anyway.
pub struct MapSaver {
    held: Arc<Mutex<Held>>,
    given_up: Arc<AtomicBool>,
}

impl MapSaver {
    pub fn save(&self, map: &str) -> Result<()> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let Held { manager, term } = &mut *held;
        let saved = manager.save_map(term, map);
        if !matches!(saved, Ok(true)) {
            self.given_up.store(true, Ordering::Release);
        }
        match saved {
            Ok(true) => Ok(()),
            Ok(false) => bail!("the primary term of epoch {} is over", term.epoch),
            Err(e) => Err(e.context(format!(
                "recording the cluster map in the cluster manager (giving the primary role \
                 of epoch {} up)",
                term.epoch
            ))),
        }
    }

    /// The map the manager keeps, if any.
    pub fn load(&self) -> Result<Option<String>> {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .manager
            .map()
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
