//! The etcd manager against a real etcd (started here on loopback, stopped by its PID):
//! one primary at a time, a lease that lapses hands the role on under a higher epoch, a
//! holder that lost its lease learns it, a resignation frees the role at once, and an
//! etcd that is not there is said clearly.

use std::time::{Duration, Instant};

use orion_manager::etcd::EtcdManager;
use orion_manager::etcd_server::EtcdServer;
use orion_manager::{Manager, Primary};

const TTL: Duration = Duration::from_secs(1);

fn manager(etcd: &EtcdServer, cluster: &str) -> EtcdManager {
    EtcdManager::connect(&etcd.endpoint, cluster, Duration::from_secs(5)).unwrap()
}

#[test]
fn one_primary_at_a_time_and_a_lapsed_lease_hands_the_role_on() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(dir.path()).unwrap();
    let (mut a, mut b) = (manager(&etcd, "c1"), manager(&etcd, "c1"));
    assert_eq!(a.kind(), "etcd");
    assert_eq!(a.primary().unwrap(), None);

    let mut term = a
        .try_acquire("mds-a", "10.0.0.1:7410", TTL)
        .unwrap()
        .expect("free");
    assert_eq!(term.epoch, 1);
    assert!(term.holds(Instant::now()));
    let want = Primary {
        name: "mds-a".into(),
        addr: "10.0.0.1:7410".into(),
        epoch: 1,
    };
    assert_eq!(b.primary().unwrap(), Some(want));
    // While A renews, B cannot take the role, for longer than the lease.
    let t0 = Instant::now();
    while t0.elapsed() < TTL * 3 {
        assert!(a.renew(&mut term).unwrap(), "A keeps its lease");
        assert!(b
            .try_acquire("mds-b", "10.0.0.2:7410", TTL)
            .unwrap()
            .is_none());
        std::thread::sleep(Duration::from_millis(200));
    }
    // A stops renewing (hung, or cut off): its term ends by its own clock no later than
    // the lease at etcd, and then B takes the role under the next epoch.
    let stalled = Instant::now();
    let taken = loop {
        if let Some(t) = b.try_acquire("mds-b", "10.0.0.2:7410", TTL).unwrap() {
            break t;
        }
        assert!(
            stalled.elapsed() < Duration::from_secs(10),
            "the lease never lapsed"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        !term.holds(Instant::now()),
        "A's term ended before B's began: A acknowledges nothing more"
    );
    assert_eq!(taken.epoch, 2);
    assert_eq!(a.primary().unwrap().map(|p| p.name), Some("mds-b".into()));
    // A comes back: its lease is gone, and it learns so.
    assert!(!a.renew(&mut term).unwrap());
    // B resigns: the role is free at once, and A takes it under epoch 3.
    b.resign(taken).unwrap();
    assert_eq!(a.primary().unwrap(), None);
    let again = a
        .try_acquire("mds-a", "10.0.0.1:7410", TTL)
        .unwrap()
        .unwrap();
    assert_eq!(again.epoch, 3);
    // Another cluster on the same etcd has roles and epochs of its own.
    let mut other = manager(&etcd, "c2");
    assert_eq!(
        other.try_acquire("x", "y:1", TTL).unwrap().unwrap().epoch,
        1
    );
    // Bad input is refused, not recorded.
    assert!(other.try_acquire("two words", "y:1", TTL).is_err());
}

#[test]
fn an_etcd_that_is_not_there_is_said_clearly() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t0 = Instant::now();
    let err = EtcdManager::connect(&format!("127.0.0.1:{port}"), "c", Duration::from_secs(2))
        .err()
        .expect("no etcd there");
    assert!(err.to_string().contains("does not answer"), "{err:#}");
    assert!(t0.elapsed() < Duration::from_secs(10), "gave up in time");
}

#[test]
fn etcd_lost_while_holding_the_role_ends_the_term_by_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = EtcdServer::start(dir.path()).unwrap();
    let mut a = EtcdManager::connect(&etcd.endpoint, "c", Duration::from_millis(500)).unwrap();
    let mut term = a.try_acquire("mds-a", "h:1", TTL).unwrap().unwrap();
    etcd.kill();
    // Renewals fail; the term runs out by the holder's own clock.
    let t0 = Instant::now();
    while term.holds(Instant::now()) {
        assert!(a.renew(&mut term).is_err(), "etcd is gone");
        assert!(t0.elapsed() < TTL * 3, "the term outlived its lease");
    }
}
