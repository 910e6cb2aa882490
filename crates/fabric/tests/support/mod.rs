//! Test support: a backend setup, nodes, connected pairs, and a progress pump for the server
//! side (libfabric over tcp progresses one-sided operations only while the target polls).
#![allow(dead_code, unused_imports)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

pub use rand::rngs::StdRng;
pub use rand::{Rng, SeedableRng};

use orion_fabric::mock::MockNet;
use orion_fabric::{
    Backend, Completion, CompletionQueue, Connection, Domain, FabricConfig, RemoteRegion, Secret,
    SpinPolicy,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Mock,
    Local,
    Libfabric,
}

pub struct Setup {
    pub kind: Kind,
    pub net: Option<MockNet>,
    pub seed: u64,
}

impl Drop for Setup {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "fabric test failed with backend {:?}, seed {} (rerun with ORION_SEED={})",
                self.kind, self.seed, self.seed
            );
        }
    }
}

pub fn seed() -> u64 {
    std::env::var("ORION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0f1b_2026)
}

impl Setup {
    pub fn mock() -> Setup {
        Setup {
            kind: Kind::Mock,
            net: Some(MockNet::new(seed())),
            seed: seed(),
        }
    }
    pub fn local() -> Setup {
        Setup {
            kind: Kind::Local,
            net: None,
            seed: seed(),
        }
    }
    pub fn libfabric() -> Setup {
        Setup {
            kind: Kind::Libfabric,
            net: None,
            seed: seed(),
        }
    }

    pub fn rng(&self) -> StdRng {
        StdRng::seed_from_u64(self.seed)
    }

    pub fn secret(&self) -> Secret {
        Secret::from_bytes(b"conformance-test-cluster-secret").unwrap()
    }

    pub fn listen_addr(&self) -> String {
        match self.kind {
            Kind::Mock => "mock:0".into(),
            _ => "127.0.0.1:0".into(),
        }
    }

    pub fn config(&self, secret: Secret, epoch: u64, spin: SpinPolicy) -> FabricConfig {
        let backend = match self.kind {
            Kind::Mock => Backend::Mock(self.net.clone().unwrap()),
            Kind::Local => Backend::Local,
            Kind::Libfabric => Backend::Libfabric,
        };
        let mut c = FabricConfig::new(backend, secret);
        c.epoch = epoch;
        c.spin = spin;
        // Short enough that an access the target refused by dropping the connection is
        // reported within the test's patience, long enough for a loaded 2-core machine.
        c.op_timeout = Duration::from_secs(3);
        c
    }

    pub fn node(&self, secret: Secret) -> Node {
        self.node_with(secret, 1)
    }

    pub fn node_with(&self, secret: Secret, epoch: u64) -> Node {
        Node::open(self.config(secret, epoch, SpinPolicy::default()))
    }

    pub fn pair(&self) -> Pair {
        self.pair_with(SpinPolicy::default())
    }

    pub fn pair_with(&self, spin: SpinPolicy) -> Pair {
        let server = Node::open(self.config(self.secret(), 1, spin));
        let client = Node::open(self.config(self.secret(), 1, spin));
        let l = server.domain.listen(&self.listen_addr()).unwrap();
        let addr = l.local_addr();
        let t = std::thread::spawn(move || {
            let c = l.accept(&server.cq, Duration::from_secs(10)).unwrap();
            (server, c)
        });
        let cconn = client.domain.connect(&addr, &client.cq).unwrap();
        let (server, sconn) = t.join().unwrap();
        Pair {
            client: Side::direct(client, cconn),
            server: Side::pumped(server, sconn),
            net: self.net.clone(),
            setup: Setup {
                kind: self.kind,
                net: self.net.clone(),
                seed: self.seed,
            },
        }
    }
}

pub struct Node {
    pub domain: Domain,
    pub cq: CompletionQueue,
}

impl Node {
    pub fn open(cfg: FabricConfig) -> Node {
        let domain = Domain::open(cfg).unwrap();
        let cq = domain.completion_queue().unwrap();
        Node { domain, cq }
    }
}

/// One end of a pair. The server end runs a pump thread that keeps its completion queue
/// polled and forwards completions; the client end is polled by the test itself.
pub struct Side {
    pub domain: Domain,
    pub cq: Arc<CompletionQueue>,
    pub conn: Connection,
    pump: Option<(
        Arc<AtomicBool>,
        mpsc::Receiver<Completion>,
        std::thread::JoinHandle<()>,
    )>,
    kill_net: Option<MockNet>,
}

impl Side {
    fn direct(n: Node, conn: Connection) -> Side {
        Side {
            domain: n.domain,
            cq: Arc::new(n.cq),
            conn,
            pump: None,
            kill_net: None,
        }
    }

    fn pumped(n: Node, conn: Connection) -> Side {
        let cq = Arc::new(n.cq);
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let (cq2, stop2) = (cq.clone(), stop.clone());
        let t = std::thread::spawn(move || {
            let mut out = Vec::new();
            while !stop2.load(Ordering::Acquire) {
                out.clear();
                if cq2.wait(&mut out, 64, Duration::from_millis(20)).is_ok() {
                    for c in out.drain(..) {
                        if tx.send(c).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Side {
            domain: n.domain,
            cq,
            conn,
            pump: Some((stop, rx, t)),
            kill_net: None,
        }
    }

    /// Exactly `n` completions within `timeout` (panics otherwise).
    pub fn collect(&self, n: usize, timeout: Duration) -> Vec<Completion> {
        let deadline = std::time::Instant::now() + timeout;
        let mut got = Vec::new();
        while got.len() < n {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(
                !left.is_zero(),
                "only {} of {n} completions arrived: {got:?}",
                got.len()
            );
            match &self.pump {
                Some((_, rx, _)) => {
                    if let Ok(c) = rx.recv_timeout(left) {
                        got.push(c);
                    }
                }
                None => {
                    let mut out = Vec::new();
                    if self.cq.wait(&mut out, n - got.len(), left).is_ok() {
                        got.extend(out);
                    }
                }
            }
        }
        got
    }

    /// Whatever completions are ready now.
    pub fn drain(&self) -> Vec<Completion> {
        match &self.pump {
            Some((_, rx, _)) => rx.try_iter().collect(),
            None => {
                let mut out = Vec::new();
                self.cq.poll(&mut out, usize::MAX);
                out
            }
        }
    }

    /// Makes this node vanish: the mock kills the domain; real backends close and drop all.
    pub fn kill(mut self) {
        if let Some(net) = self.kill_net.take() {
            net.kill(&self.domain);
        }
        self.conn.close();
        self.stop_pump();
    }

    fn stop_pump(&mut self) {
        if let Some((stop, rx, t)) = self.pump.take() {
            stop.store(true, Ordering::Release);
            drop(rx);
            t.join().unwrap();
        }
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        self.stop_pump();
    }
}

pub struct Pair {
    pub client: Side,
    pub server: Side,
    pub net: Option<MockNet>,
    setup: Setup,
}

impl Pair {
    /// The server sends a region's descriptor in a message, as an MDS does in a reply.
    pub fn ship_descriptor(&self, r: &orion_fabric::Region) -> RemoteRegion {
        let cbuf = self
            .client
            .domain
            .alloc_region(4096, orion_fabric::Access::LOCAL)
            .unwrap();
        self.client.conn.post_recv(0xd0, &cbuf, 0, 64).unwrap();
        let sbuf = self
            .server
            .domain
            .alloc_region(4096, orion_fabric::Access::LOCAL)
            .unwrap();
        sbuf.write(0, &r.remote().encode()).unwrap();
        self.server
            .conn
            .post_send(0xd1, &sbuf, 0, RemoteRegion::ENCODED_LEN)
            .unwrap();
        let got = self.client.collect(1, Duration::from_secs(10));
        let sent = self.server.collect(1, Duration::from_secs(10));
        assert_eq!(sent[0].status, Ok(()));
        assert_eq!(
            (got[0].wr_id, got[0].len),
            (0xd0, RemoteRegion::ENCODED_LEN)
        );
        let mut b = [0u8; 24];
        cbuf.read(0, &mut b).unwrap();
        RemoteRegion::decode(&b).unwrap()
    }

    pub fn split(mut self) -> (Side, Side) {
        self.server.kill_net = self.net.take();
        let Pair { client, server, .. } = self;
        (client, server)
    }

    /// Some targets break a connection after refusing an access (as an RDMA QP enters the
    /// error state); then the test goes on with a fresh pair.
    pub fn reconnect_if_broken(self) -> Pair {
        if self.client.conn.is_alive() {
            self
        } else {
            let setup = Setup {
                kind: self.setup.kind,
                net: self.setup.net.clone(),
                seed: self.setup.seed,
            };
            drop(self);
            setup.pair()
        }
    }
}
