//! The crash simulator: pools whose persists are recorded per 64-byte line, so a test
//! can take, at any event, an image that a power failure could leave.
//!
//! Model: the media holds a persisted image of each pool; a persist writes its range of
//! the current contents back to it (clwb + sfence). At a crash, each line whose current
//! contents differ from the persisted image independently either reached the media or
//! did not. Aligned 8-byte stores never straddle a line, so they are atomic in every
//! image, as on real hardware. Lines are compared rather than tracked store by store,
//! so stores the simulator never saw (a peer's one-sided write into a registered pool
//! file) are covered the same way as the pool's own.
//!
//! A pool lives either in memory ([`CrashDomain::add_pool`]) or in a file mapped as
//! usual ([`CrashDomain::track_file`]; a server opens it, the fabric registers the same
//! file). [`CrashDomain::crash_at`] runs a hook at a chosen event, inside the store or
//! persist that makes it, with the image of that moment: a simulated process can be cut
//! off the network there, before it takes another step.

use std::collections::VecDeque;
use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::pool::{Mode, ModeChoice, Pool, PoolError};
use crate::LINE;

/// What a power failure left: one byte image per pool of the domain, in creation order.
#[derive(Clone, Debug)]
pub struct CrashImage {
    /// The number of recorded events (stores + persists) before the crash.
    pub event: u64,
    pub pools: Vec<Vec<u8>>,
}

/// Where a simulated pool's current contents are.
enum Contents {
    /// Owned memory (stable address: the pool points into it).
    Owned(Box<[u64]>),
    /// A file mapping owned by a [`Pool`]; valid until the pool detaches it.
    Mapped { base: *const u8, len: usize },
    /// What a mapping held when its pool was dropped.
    Detached(Vec<u8>),
}

struct SimPool {
    contents: Contents,
    /// What the media holds for certain.
    persisted: Vec<u8>,
}

impl SimPool {
    fn current(&self) -> &[u8] {
        match &self.contents {
            // SAFETY: reinterpreting an owned u64 slice as bytes: same allocation,
            // byte length = 8 × elements, u8 has no alignment requirement.
            Contents::Owned(mem) => unsafe {
                std::slice::from_raw_parts(mem.as_ptr() as *const u8, mem.len() * 8)
            },
            // SAFETY: the mapping stays valid until its Pool detaches it (Pool::drop
            // calls `detach` before munmap), and detaching replaces this variant.
            // Other mappings of the file (the fabric's) may write it meanwhile, as
            // shared memory is written by DMA: the bytes seen may be torn by such a
            // write, which a power failure could leave too. Test pools only.
            Contents::Mapped { base, len } => unsafe { std::slice::from_raw_parts(*base, *len) },
            Contents::Detached(v) => v,
        }
    }
}

/// Runs at an armed crash event with the image of that moment.
pub type CrashHook = Box<dyn FnOnce(CrashImage) + Send>;

struct State {
    pools: Vec<SimPool>,
    events: u64,
    /// Event numbers at which to take an image, ascending.
    armed: VecDeque<u64>,
    images: Vec<CrashImage>,
    /// The event at which to crash, and what to do then.
    crash: Option<(u64, CrashHook)>,
    rng: SmallRng,
}

// SAFETY: the only non-Send field is the base pointer of a mapped pool, which is only
// read, under the state's mutex, while the Pool that owns the mapping is alive.
unsafe impl Send for State {}

/// A set of pools that crash together (an MDS pool and a data pool lose power at once).
pub struct CrashDomain {
    state: Mutex<State>,
}

impl CrashDomain {
    pub fn new(seed: u64) -> Arc<CrashDomain> {
        Arc::new(CrashDomain {
            state: Mutex::new(State {
                pools: Vec::new(),
                events: 0,
                armed: VecDeque::new(),
                images: Vec::new(),
                crash: None,
                rng: SmallRng::seed_from_u64(seed),
            }),
        })
    }

    /// Adds a pool whose initial, fully persisted contents are `image` (its length is
    /// rounded up to a multiple of 64 bytes).
    pub fn add_pool(self: &Arc<Self>, image: &[u8]) -> Pool {
        let words = image.len().div_ceil(LINE) * (LINE / 8);
        let mut mem = vec![0u64; words].into_boxed_slice();
        // SAFETY: `mem` holds words * 8 >= image.len() bytes; the ranges are distinct.
        unsafe {
            std::ptr::copy_nonoverlapping(image.as_ptr(), mem.as_mut_ptr() as *mut u8, image.len())
        };
        let len = words * 8;
        let base = mem.as_mut_ptr() as *mut u8;
        let mut persisted = image.to_vec();
        persisted.resize(len, 0);
        let id = self.push(SimPool {
            contents: Contents::Owned(mem),
            persisted,
        });
        Pool::new_sim(base, len, self.clone(), id)
    }

    /// Maps the pool file at `path` as [`Pool::open`] does, with its persists recorded
    /// here. Its contents at this moment count as persisted.
    pub fn track_file(self: &Arc<Self>, path: &Path) -> Result<Pool, PoolError> {
        let pool = Pool::open(path, ModeChoice::Force(Mode::Volatile))?;
        let (base, len) = pool.raw_mapping();
        let id = self.push(SimPool {
            contents: Contents::Mapped { base, len },
            persisted: Vec::new(),
        });
        {
            let mut st = self.state.lock().unwrap();
            let p = &mut st.pools[id];
            p.persisted = p.current().to_vec();
        }
        Ok(pool.into_tracked(self.clone(), id))
    }

    fn push(&self, p: SimPool) -> usize {
        let mut st = self.state.lock().unwrap();
        st.pools.push(p);
        st.pools.len() - 1
    }

    /// A tracked pool is going away: keep a copy of what its mapping holds.
    pub(crate) fn detach(&self, id: usize) {
        let mut st = self.state.lock().unwrap();
        let p = &mut st.pools[id];
        let copy = p.current().to_vec();
        p.contents = Contents::Detached(copy);
    }

    /// Takes an image after each of these event numbers (a store or persist is one event).
    pub fn arm(&self, mut points: Vec<u64>) {
        points.sort_unstable();
        points.dedup();
        let mut st = self.state.lock().unwrap();
        st.armed = points.into();
    }

    /// Runs `hook` with the image of the moment at event `event` (see [`Self::events`]),
    /// on the thread that makes that event, before the event's caller goes on.
    /// Replaces an earlier crash point that has not fired.
    pub fn crash_at(&self, event: u64, hook: CrashHook) {
        self.state.lock().unwrap().crash = Some((event, hook));
    }

    /// Cancels the crash point; true if it had not fired.
    pub fn disarm_crash(&self) -> bool {
        self.state.lock().unwrap().crash.take().is_some()
    }

    pub fn events(&self) -> u64 {
        self.state.lock().unwrap().events
    }

    /// The images taken so far, oldest first.
    pub fn take_images(&self) -> Vec<CrashImage> {
        std::mem::take(&mut self.state.lock().unwrap().images)
    }

    /// An image of the present moment, as if power failed now.
    pub fn crash_now(&self) -> CrashImage {
        let mut st = self.state.lock().unwrap();
        Self::capture(&mut st)
    }

    /// The contents every pool would have if all dirty lines reached the media.
    pub fn current_images(&self) -> Vec<Vec<u8>> {
        let st = self.state.lock().unwrap();
        st.pools.iter().map(|p| p.current().to_vec()).collect()
    }

    fn capture(st: &mut State) -> CrashImage {
        let State {
            pools, rng, events, ..
        } = st;
        let images = pools
            .iter()
            .map(|p| {
                let mut img = p.persisted.clone();
                let lines = img
                    .chunks_exact_mut(LINE)
                    .zip(p.current().chunks_exact(LINE));
                for (kept, now) in lines {
                    if kept != now && rng.gen_bool(0.5) {
                        kept.copy_from_slice(now);
                    }
                }
                img
            })
            .collect();
        CrashImage {
            event: *events,
            pools: images,
        }
    }

    /// Counts an event; returns the crash hook to run if this is its event.
    fn tick(st: &mut State) -> Option<(CrashHook, CrashImage)> {
        st.events += 1;
        while let Some(&next) = st.armed.front() {
            if next > st.events {
                break;
            }
            st.armed.pop_front();
            if next == st.events {
                let img = Self::capture(st);
                st.images.push(img);
            }
        }
        match st.crash.take() {
            Some((at, hook)) if at <= st.events => Some((hook, Self::capture(st))),
            other => {
                st.crash = other;
                None
            }
        }
    }

    fn after(fired: Option<(CrashHook, CrashImage)>) {
        if let Some((hook, image)) = fired {
            hook(image);
        }
    }

    pub(crate) fn on_store(&self, _id: usize, _off: usize, len: usize) {
        if len == 0 {
            return;
        }
        let fired = Self::tick(&mut self.state.lock().unwrap());
        Self::after(fired);
    }

    pub(crate) fn on_persist(&self, id: usize, off: usize, len: usize) {
        let mut st = self.state.lock().unwrap();
        let p = &mut st.pools[id];
        let start = off / LINE * LINE;
        let end = ((off + len).div_ceil(LINE) * LINE).min(p.persisted.len());
        // Split borrow: the current bytes of the range into the persisted image.
        let now = p.current()[start..end].to_vec();
        p.persisted[start..end].copy_from_slice(&now);
        let fired = Self::tick(&mut st);
        drop(st);
        Self::after(fired);
    }
}

/// Keeps the pool file open for a tracked mapping (see [`Pool::into_tracked`]).
pub(crate) struct TrackedFile {
    pub _file: File,
    pub domain: Arc<CrashDomain>,
    pub id: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persisted_stores_survive_and_unpersisted_may_not() {
        let dom = CrashDomain::new(7);
        let pool = dom.add_pool(&vec![0u8; 4096]);
        pool.write(0, &[1u8; 64]).unwrap();
        pool.persist(0, 64).unwrap();
        pool.write(64, &[2u8; 128]).unwrap();
        let mut kept = [0usize; 2];
        for _ in 0..64 {
            let img = dom.crash_now();
            assert_eq!(&img.pools[0][..64], &[1u8; 64]);
            for (i, line) in [64usize, 128].iter().enumerate() {
                let l = &img.pools[0][*line..*line + 64];
                assert!(l == [2u8; 64] || l == [0u8; 64], "a line is all or nothing");
                kept[i] += (l[0] == 2) as usize;
            }
        }
        assert!(
            kept.iter().all(|&k| k > 0 && k < 64),
            "each dirty line is sometimes dropped: {kept:?}"
        );
    }

    #[test]
    fn armed_points_capture_the_state_at_that_event() {
        let dom = CrashDomain::new(1);
        let pool = dom.add_pool(&vec![0u8; 256]);
        dom.arm(vec![2, 4]);
        pool.store_u64(0, 1).unwrap(); // event 1
        pool.persist(0, 8).unwrap(); // event 2
        pool.store_u64(8, 2).unwrap(); // event 3
        pool.persist(8, 8).unwrap(); // event 4
        let imgs = dom.take_images();
        assert_eq!(imgs.len(), 2);
        assert_eq!(imgs[0].event, 2);
        assert_eq!(imgs[0].pools[0][0], 1);
        assert_eq!(imgs[0].pools[0][8], 0);
        assert_eq!(imgs[1].pools[0][8], 2);
    }

    #[test]
    fn a_tracked_file_covers_stores_it_did_not_see_and_fires_its_hook() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("p.pool");
        Pool::create(&path, 4096, ModeChoice::Force(Mode::Volatile))
            .unwrap()
            .write(0, &[9u8; 64])
            .unwrap();
        let dom = CrashDomain::new(3);
        let pool = dom.track_file(&path).unwrap();
        assert_eq!(pool.mode(), Mode::CrashSim);
        // A peer writes the file through a mapping of its own (as the fabric does).
        let peer = Pool::open(&path, ModeChoice::Force(Mode::Volatile)).unwrap();
        peer.write(64, &[5u8; 64]).unwrap();
        peer.write(128, &[6u8; 64]).unwrap();
        pool.persist(64, 64).unwrap(); // event 1
        let fired = Arc::new(Mutex::new(None));
        let f = fired.clone();
        dom.crash_at(2, Box::new(move |img| *f.lock().unwrap() = Some(img)));
        pool.store_u64(192, 7).unwrap(); // event 2: the hook runs inside this store
        let img = fired
            .lock()
            .unwrap()
            .take()
            .expect("the hook ran at event 2");
        assert_eq!(img.event, 2);
        let p = &img.pools[0];
        assert_eq!(
            &p[..64],
            &[9u8; 64],
            "contents at tracking time count as persisted"
        );
        assert_eq!(&p[64..128], &[5u8; 64], "a persisted peer write survives");
        assert!(p[128..192] == [6u8; 64] || p[128..192] == [0u8; 64]);
        assert!(!dom.disarm_crash(), "a fired crash point is gone");
        drop(pool);
        peer.write(256, &[1u8; 8]).unwrap();
        let after = dom.current_images();
        assert_eq!(
            after[0][256], 0,
            "a dropped pool's contents were copied when it went"
        );
        assert_eq!(after[0][192], 7);
    }
}
