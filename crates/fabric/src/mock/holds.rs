//! What holds a mock post up before it runs: a slowed pair of nodes
//! ([`super::MockNet::slow_posts`]) and a gathering of clients' posts
//! ([`super::MockNet::gather_client_posts`]). Both wait in the poster's thread, as a
//! sender waits on a congested link.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::MockNet;

impl MockNet {
    /// Makes every operation the node listening at `from` posts to the one at `to`
    /// take `delay` longer (in the poster's thread, as a congested sender blocks), or
    /// as long as usual again with `None`; false if either address has no listener.
    pub fn slow_posts(&self, from: &str, to: &str, delay: Option<Duration>) -> bool {
        let id = |a: &str| self.listener_domain(a);
        let Some(pair) = id(from).zip(id(to)) else {
            return false;
        };
        self.inner.holds.set_slow(pair, delay);
        true
    }

    fn listener_domain(&self, addr: &str) -> Option<u64> {
        self.inner
            .listeners
            .lock()
            .unwrap()
            .get(addr)
            .map(|l| l.domain)
    }

    /// From now on, posts from clients (domains that listen nowhere) to the node
    /// listening at `to` wait until `n` of them wait at once, or until `within` has
    /// passed ([`Gather`]); None if nothing listens there.
    pub fn gather_client_posts(&self, to: &str, n: usize, within: Duration) -> Option<Arc<Gather>> {
        let g = Arc::new(Gather::new(n, within));
        self.inner
            .holds
            .set_gather(self.listener_domain(to)?, g.clone());
        Some(g)
    }
}

#[derive(Default)]
pub(super) struct Holds {
    /// Extra time a post takes, by (poster, peer) domain ids.
    slow: Mutex<HashMap<(u64, u64), Duration>>,
    /// The gathering clients' posts to a domain wait at, if one is set, and that
    /// domain's id.
    gather: Mutex<Option<(u64, Arc<Gather>)>>,
}

impl Holds {
    pub(super) fn set_slow(&self, pair: (u64, u64), delay: Option<Duration>) {
        let mut slow = self.slow.lock().unwrap();
        match delay {
            Some(d) => slow.insert(pair, d),
            None => slow.remove(&pair),
        };
    }

    pub(super) fn set_gather(&self, to: u64, g: Arc<Gather>) {
        *self.gather.lock().unwrap() = Some((to, g));
    }

    /// Holds a post from domain `from` to domain `to` up as the test asked;
    /// `from_client`: whether the poster listens nowhere (a client).
    pub(super) fn hold(&self, from: u64, to: u64, from_client: impl FnOnce() -> bool) {
        let slow = self.slow.lock().unwrap().get(&(from, to)).copied();
        if let Some(d) = slow {
            std::thread::sleep(d);
        }
        let gather = self.gather.lock().unwrap().clone();
        if let Some((at, g)) = gather {
            if at == to && from_client() {
                g.pass();
            }
        }
    }
}

/// Clients' posts to one node held until `want` of them wait at once, then let
/// through together (and every later one at once), or let through when `within`
/// has passed since the gathering was set, unmet. A test of concurrency that does
/// not depend on timing: posts that cannot be under way at once never gather,
/// however fast the machine.
pub struct Gather {
    want: usize,
    deadline: Instant,
    state: Mutex<GatherState>,
    cv: Condvar,
}

#[derive(Default)]
struct GatherState {
    waiting: usize,
    most: usize,
    open: bool,
    met: bool,
}

impl Gather {
    pub(super) fn new(want: usize, within: Duration) -> Gather {
        Gather {
            want,
            deadline: Instant::now() + within,
            state: Mutex::default(),
            cv: Condvar::new(),
        }
    }

    fn pass(&self) {
        let mut s = self.state.lock().unwrap();
        if s.open {
            return;
        }
        s.waiting += 1;
        s.most = s.most.max(s.waiting);
        if s.waiting >= self.want {
            s.open = true;
            s.met = true;
            s.waiting -= 1;
            self.cv.notify_all();
            return;
        }
        while !s.open {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                s.open = true;
                self.cv.notify_all();
                break;
            }
            s = self.cv.wait_timeout(s, left).unwrap().0;
        }
        s.waiting -= 1;
    }

    /// Whether `want` posts waited at once.
    pub fn met(&self) -> bool {
        self.state.lock().unwrap().met
    }

    /// The posts waiting now.
    pub fn waiting(&self) -> usize {
        self.state.lock().unwrap().waiting
    }

    /// The most posts that waited at once.
    pub fn most(&self) -> usize {
        self.state.lock().unwrap().most
    }
}
