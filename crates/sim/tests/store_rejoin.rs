//! A data store that restarts and joins again before the MDS has seen its old
//! connection close takes its group back (same pool), while another pool claiming a
//! served group is refused. The simulator found the first case: under load, a
//! restarted store was refused for good ("group already has a connected data store").
//! Stores that do not fit the cluster are refused with the reason.

use std::time::Duration;

use orion_fabric::{CompletionQueue, Domain};
use orion_proto::{Channel, DsHello, Reply, ReplyBody, StoreToMds};
use orion_sim::{Cluster, ClusterConfig, MDS_ADDR};

fn join(domain: &Domain, cq: &CompletionQueue, pool_uuid: [u8; 16]) -> (Channel, Reply) {
    join_as(domain, cq, hello(pool_uuid))
}

/// Replica 0 of group 5, 1024 pages, a pool that never joined a cluster.
fn hello(pool_uuid: [u8; 16]) -> DsHello {
    DsHello {
        group: 5,
        index: 0,
        page_count: 1024,
        pool_uuid,
        cluster_uuid: [0; 16],
        addr: "store-5:1".into(),
        incarnation: 1,
        durable_on_delivery: false,
        restarted_host: false,
        pool_path: String::new(),
        host: [0; 16],
    }
}

fn join_as(domain: &Domain, cq: &CompletionQueue, hello: DsHello) -> (Channel, Reply) {
    let conn = domain.connect(MDS_ADDR, cq).expect("connect to the MDS");
    let mut ch = Channel::new(domain, conn).expect("channel");
    let hello = StoreToMds::Join(hello);
    let mut other = Vec::new();
    let reply = ch
        .call(cq, 1, &hello, Duration::from_secs(10), &mut other)
        .expect("an answer to join");
    (ch, reply)
}

/// An MDS with no data store yet, and a fabric domain to play stores from.
fn without_stores() -> (Cluster, Domain, CompletionQueue) {
    with_replicas(1)
}

fn with_replicas(replicas: u16) -> (Cluster, Domain, CompletionQueue) {
    let cluster = Cluster::start(ClusterConfig {
        stores: 0,
        replicas,
        ..Default::default()
    })
    .unwrap();
    let domain = Domain::open(cluster.fabric()).unwrap();
    let cq = domain.completion_queue().unwrap();
    (cluster, domain, cq)
}

#[test]
fn a_restarted_store_takes_its_group_back_and_a_stranger_is_refused() {
    let (_cluster, domain, cq) = without_stores();
    let (first, r) = join(&domain, &cq, [7; 16]);
    assert!(matches!(r, Reply::Ok(ReplyBody::Joined { .. })), "{r:?}");
    // The same pool joins again while the first connection still looks alive.
    let (_second, r) = join(&domain, &cq, [7; 16]);
    assert!(matches!(r, Reply::Ok(ReplyBody::Joined { .. })), "{r:?}");
    // The MDS closed the first connection, which it now knows is stale.
    let mut closed = false;
    for _ in 0..200 {
        if !first.conn.is_alive() {
            closed = true;
            break;
        }
        let _ = cq.poll(&mut Vec::new(), 16);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(closed, "the stale store connection was closed");
    // Another pool claiming the served group is refused, with the reason.
    let (_third, r) = join(&domain, &cq, [8; 16]);
    match r {
        Reply::Err { message, .. } => {
            assert!(
                message.contains("is served by a connected store"),
                "{message}"
            )
        }
        other => panic!("a second pool for group 5 was let in: {other:?}"),
    }
}

#[test]
fn a_store_that_falls_silent_is_taken_for_dead_after_its_heartbeat_timeout() {
    let (_cluster, domain, cq) = without_stores();
    // A store that joins and then says nothing more (hung, or cut off one way).
    let t0 = std::time::Instant::now();
    let (silent, r) = join(&domain, &cq, [9; 16]);
    assert!(matches!(r, Reply::Ok(ReplyBody::Joined { .. })), "{r:?}");
    while silent.conn.is_alive() && t0.elapsed() < Duration::from_secs(10) {
        let _ = cq.poll(&mut Vec::new(), 16);
        std::thread::sleep(Duration::from_millis(10));
    }
    let waited = t0.elapsed();
    assert!(!silent.conn.is_alive(), "the MDS kept a silent store");
    assert!(
        waited >= Duration::from_millis(900),
        "taken for dead after {waited:?}, before the 1 s timeout"
    );
}

#[test]
fn stores_that_do_not_fit_the_cluster_are_refused_with_the_reason() {
    let (_cluster, domain, cq) = with_replicas(2);
    let refused = |h: DsHello, why: &str| {
        let (_ch, r) = join_as(&domain, &cq, h.clone());
        match r {
            Reply::Err { message, .. } => assert!(message.contains(why), "{h:?}: {message}"),
            other => panic!("{h:?} was let in: {other:?}"),
        }
    };
    let (_first, r) = join(&domain, &cq, [7; 16]);
    assert!(matches!(r, Reply::Ok(ReplyBody::Joined { .. })), "{r:?}");
    let peer = |pool: u8| DsHello {
        index: 1,
        addr: "store-5:2".into(),
        ..hello([pool; 16])
    };
    refused(
        DsHello {
            cluster_uuid: [3; 16],
            ..peer(8)
        },
        "another cluster",
    );
    refused(
        DsHello {
            page_count: 512,
            ..peer(8)
        },
        "the same layout",
    );
    refused(
        DsHello {
            page_count: 1 << 33,
            ..peer(8)
        },
        "at most 2^32 pages",
    );
    refused(
        DsHello {
            index: 2,
            ..peer(8)
        },
        "2 replicas per group",
    );
    refused(peer(7), "already");
    // None of them changed the group: its right second replica still joins.
    let (_second, r) = join_as(&domain, &cq, peer(8));
    assert!(matches!(r, Reply::Ok(ReplyBody::Joined { .. })), "{r:?}");
}
