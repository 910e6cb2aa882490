//! A peer that stops in the middle of its handshake (its process stopped, or its host
//! gone after the TCP connection was accepted) holds up one of a server's acceptor
//! threads for the fabric's connect timeout, not the server: other peers connect
//! meanwhile.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orion_fabric::{Backend, Domain, FabricConfig, Secret};
use orion_proto::channel::{spawn_acceptor, ACCEPT_THREADS};

fn stalled_handshakes_hold_up_no_other_peer(backend: Backend) {
    let mut cfg = FabricConfig::new(backend.clone(), Secret::generate());
    // Long, so that a peer queued behind a stalled handshake would show.
    cfg.connect_timeout = Duration::from_secs(60);
    let server = Domain::open(cfg.clone()).unwrap();
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let cq = Arc::new(server.completion_queue().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let (acceptor, incoming) =
        spawn_acceptor("test-accept", &server, listener, cq, stop.clone(), |_| {}).unwrap();
    // Peers that connect and then say nothing: all acceptor threads but one (at
    // least one thread) are caught in their handshakes.
    let stalled: Vec<TcpStream> = (0..(ACCEPT_THREADS - 1).max(1))
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let client = Domain::open(cfg).unwrap();
    let client_cq = client.completion_queue().unwrap();
    let t0 = Instant::now();
    let conn = client.connect(&addr, &client_cq).unwrap();
    let accepted = incoming.recv_timeout(Duration::from_secs(30));
    let took = t0.elapsed();
    // The stalled peers go: their handshakes fail at once, and the threads stop.
    drop(stalled);
    stop.store(true, Ordering::Relaxed);
    // Queued behind a stalled handshake, the connect would have taken the whole
    // connect timeout (a minute).
    assert!(
        accepted.is_ok() && took < Duration::from_secs(30),
        "{backend:?}: the connection took {took:?} (accepted: {})",
        accepted.is_ok()
    );
    drop(conn);
    acceptor.join().unwrap();
}

#[test]
fn stalled_handshakes_hold_up_no_other_peer_on_the_local_fabric() {
    stalled_handshakes_hold_up_no_other_peer(Backend::Local);
}

#[test]
fn stalled_handshakes_hold_up_no_other_peer_over_libfabric_tcp() {
    stalled_handshakes_hold_up_no_other_peer(Backend::Libfabric);
}
