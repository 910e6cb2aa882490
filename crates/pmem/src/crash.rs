//! The crash simulator: pools whose every store and persist is recorded per 64-byte
//! line, so a test can take, at any event, an image that a power failure could leave.
//!
//! Model: a store makes its lines dirty; a persist writes dirty lines of its range
//! back (clwb + sfence). At a crash, each dirty line independently either reached
//! the media or did not. Aligned 8-byte stores never straddle a line, so they are
//! atomic in every image, as on real hardware.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::pool::Pool;
use crate::LINE;

/// What a power failure left: one byte image per pool of the domain, in creation order.
#[derive(Clone, Debug)]
pub struct CrashImage {
    /// The number of recorded events (stores + persists) before the crash.
    pub event: u64,
    pub pools: Vec<Vec<u8>>,
}

struct SimPool {
    /// The current contents (what loads see). Stable address: pools point into it.
    mem: Box<[u64]>,
    /// What the media holds for certain.
    persisted: Vec<u8>,
    dirty: BTreeSet<usize>,
}

impl SimPool {
    fn current(&self) -> &[u8] {
        // SAFETY: reinterpreting an owned u64 slice as bytes: same allocation,
        // byte length = 8 × elements, u8 has no alignment requirement.
        unsafe { std::slice::from_raw_parts(self.mem.as_ptr() as *const u8, self.mem.len() * 8) }
    }
}

struct State {
    pools: Vec<SimPool>,
    events: u64,
    /// Event numbers at which to take an image, ascending.
    armed: VecDeque<u64>,
    images: Vec<CrashImage>,
    rng: SmallRng,
}

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
        let mut st = self.state.lock().unwrap();
        let id = st.pools.len();
        st.pools.push(SimPool {
            mem,
            persisted,
            dirty: BTreeSet::new(),
        });
        drop(st);
        Pool::new_sim(base, len, self.clone(), id)
    }

    /// Takes an image after each of these event numbers (a store or persist is one event).
    pub fn arm(&self, mut points: Vec<u64>) {
        points.sort_unstable();
        points.dedup();
        let mut st = self.state.lock().unwrap();
        st.armed = points.into();
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
                let cur = p.current();
                for &line in &p.dirty {
                    if rng.gen_bool(0.5) {
                        let r = line * LINE..(line + 1) * LINE;
                        img[r.clone()].copy_from_slice(&cur[r]);
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

    fn tick(st: &mut State) {
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
    }

    pub(crate) fn on_store(&self, id: usize, off: usize, len: usize) {
        if len == 0 {
            return;
        }
        let mut st = self.state.lock().unwrap();
        let p = &mut st.pools[id];
        for line in off / LINE..(off + len).div_ceil(LINE) {
            p.dirty.insert(line);
        }
        Self::tick(&mut st);
    }

    pub(crate) fn on_persist(&self, id: usize, off: usize, len: usize) {
        let mut st = self.state.lock().unwrap();
        let p = &mut st.pools[id];
        let lines: Vec<usize> = p
            .dirty
            .range(off / LINE..(off + len).div_ceil(LINE))
            .copied()
            .collect();
        for line in lines {
            let r = line * LINE..(line + 1) * LINE;
            // Split borrow: copy current bytes of the line into the persisted image.
            let mut buf = [0u8; LINE];
            buf.copy_from_slice(&p.current()[r.clone()]);
            p.persisted[r].copy_from_slice(&buf);
            p.dirty.remove(&line);
        }
        Self::tick(&mut st);
    }
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
}
