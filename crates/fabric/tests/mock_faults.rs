//! The mock fabric's fault injection does what it says: higher layers rely on it to test
//! their handling of lost, corrupted, late and reordered traffic.

mod support;

use std::time::Duration;

use orion_fabric::mock::Faults;
use orion_fabric::{Access, Error, OpKind};
use support::*;

#[test]
fn dropped_send_completes_at_the_sender_and_never_arrives() {
    let s = Setup::mock();
    let p = s.pair();
    s.net.as_ref().unwrap().set_faults(Faults {
        drop_send: 1.0,
        ..Faults::default()
    });
    let sbuf = p.server.domain.alloc_region(4096, Access::LOCAL).unwrap();
    p.server.conn.post_recv(1, &sbuf, 0, 4096).unwrap();
    let cbuf = p.client.domain.alloc_region(4096, Access::LOCAL).unwrap();
    p.client.conn.post_send(1, &cbuf, 0, 64).unwrap();
    assert_eq!(
        p.client.collect(1, Duration::from_secs(5))[0].status,
        Ok(())
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(p.server.drain().is_empty(), "a dropped message arrived");
}

#[test]
fn corrupted_send_arrives_with_one_byte_changed() {
    let s = Setup::mock();
    let p = s.pair();
    s.net.as_ref().unwrap().set_faults(Faults {
        corrupt_send: 1.0,
        ..Faults::default()
    });
    let sbuf = p.server.domain.alloc_region(4096, Access::LOCAL).unwrap();
    p.server.conn.post_recv(1, &sbuf, 0, 4096).unwrap();
    let cbuf = p.client.domain.alloc_region(4096, Access::LOCAL).unwrap();
    let msg: Vec<u8> = (0..200u8).collect();
    cbuf.write(0, &msg).unwrap();
    p.client.conn.post_send(1, &cbuf, 0, msg.len()).unwrap();
    let r = p.server.collect(1, Duration::from_secs(5));
    assert_eq!(r[0].len, msg.len());
    let mut got = vec![0u8; msg.len()];
    sbuf.read(0, &mut got).unwrap();
    assert_eq!(got.iter().zip(&msg).filter(|(a, b)| a != b).count(), 1);
}

#[test]
fn delayed_and_reordered_completions_each_arrive_once() {
    let s = Setup::mock();
    let p = s.pair();
    let target = p
        .server
        .domain
        .alloc_region(1 << 16, Access::REMOTE_ALL)
        .unwrap();
    let d = p.ship_descriptor(&target);
    s.net.as_ref().unwrap().set_faults(Faults {
        delay: 0.5,
        reorder: true,
        ..Faults::default()
    });
    let buf = p
        .client
        .domain
        .alloc_region(1 << 16, Access::LOCAL)
        .unwrap();
    let n = 500u64;
    for i in 0..n {
        p.client
            .conn
            .post_write(i, &buf, (i % 16) * 4096, &d, (i % 16) * 4096, 4096)
            .unwrap();
    }
    let got = p.client.collect(n as usize, Duration::from_secs(10));
    let mut ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    assert!(
        ids.windows(2).any(|w| w[0] > w[1]),
        "no completion was reordered"
    );
    ids.sort();
    assert_eq!(ids, (0..n).collect::<Vec<_>>());
    assert!(got
        .iter()
        .all(|c| c.kind == OpKind::Write && c.status.is_ok()));
    let mut out = Vec::new();
    assert!(matches!(
        p.client.cq.wait(&mut out, 8, Duration::from_millis(50)),
        Err(Error::Timeout(_))
    ));
}

#[test]
fn a_broken_connection_fails_its_work_at_both_ends() {
    let s = Setup::mock();
    let p = s.pair();
    let sbuf = p.server.domain.alloc_region(4096, Access::LOCAL).unwrap();
    p.server.conn.post_recv(1, &sbuf, 0, 4096).unwrap();
    let cbuf = p.client.domain.alloc_region(4096, Access::LOCAL).unwrap();
    s.net.as_ref().unwrap().set_faults(Faults {
        break_conn: 1.0,
        ..Faults::default()
    });
    match p.client.conn.post_send(7, &cbuf, 0, 64) {
        Err(e) => assert!(e.is_fatal_to_connection(), "{e:?}"),
        Ok(()) => {
            let c = p.client.collect(1, Duration::from_secs(5));
            assert!(
                c[0].status
                    .as_ref()
                    .is_err_and(|e| e.is_fatal_to_connection()),
                "{c:?}"
            );
        }
    }
    assert!(!p.client.conn.is_alive());
    assert!(!p.server.conn.is_alive());
    // The server's posted receive is flushed, not left waiting for ever.
    let got = p.server.collect(1, Duration::from_secs(5));
    assert_eq!(got[0].wr_id, 1);
    assert!(got[0].status.is_err(), "{got:?}");
}

/// Two nodes that both listen (a link is named by its ends' addresses; the listeners
/// are returned to keep the names), connected.
#[allow(clippy::type_complexity)]
fn linked(
    s: &Setup,
) -> (
    Node,
    Node,
    [orion_fabric::Listener; 2],
    orion_fabric::Connection,
    orion_fabric::Connection,
) {
    let a = s.node(s.secret());
    let b = s.node(s.secret());
    let la = a.domain.listen("node-a:1").unwrap();
    let lb = b.domain.listen("node-b:1").unwrap();
    let t = std::thread::spawn(move || {
        let c = lb.accept(&b.cq, Duration::from_secs(10)).unwrap();
        (b, lb, c)
    });
    let conn = a.domain.connect("node-b:1", &a.cq).unwrap();
    let (b, lb, accepted) = t.join().unwrap();
    (a, b, [la, lb], conn, accepted)
}

#[test]
fn a_cut_link_times_out_its_operations_and_connections_until_healed() {
    use orion_fabric::mock::Link;
    let s = Setup::mock();
    let net = s.net.clone().unwrap();
    let (a, b, _names, conn, _accepted) = linked(&s);
    let (an, bn) = ("node-a:1", "node-b:1");
    let target = b.domain.alloc_region(4096, Access::REMOTE_ALL).unwrap();
    let buf = a.domain.alloc_region(4096, Access::LOCAL).unwrap();
    assert!(net.set_link(an, bn, Link::Cut));
    assert!(!net.set_link(an, "nowhere:1", Link::Cut), "no such node");
    // An operation across the cut fails with a timeout (not "gone"), and breaks the
    // connection.
    let r = conn
        .post_write(1, &buf, 0, &target.remote(), 0, 64)
        .and_then(|_| {
            let mut out = Vec::new();
            let c =
                a.cq.wait_for(conn.id(), 1, &mut out, Duration::from_secs(5))?;
            c.status
        });
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    assert!(!conn.is_alive());
    // New connections across it time out as well, until it heals.
    let _l = b.domain.listen("node-b:2").unwrap();
    let r = a
        .domain
        .connect_within("node-b:2", &a.cq, Duration::from_millis(100));
    assert!(matches!(r, Err(Error::Timeout(_))), "{:?}", r.err());
    net.set_link(an, bn, Link::Up);
    let t = std::thread::spawn(move || _l.accept(&b.cq, Duration::from_secs(10)).map(|_| ()));
    a.domain.connect("node-b:2", &a.cq).unwrap();
    t.join().unwrap().unwrap();
}

#[test]
fn a_flaky_link_breaks_its_connections_at_random() {
    use orion_fabric::mock::Link;
    let s = Setup::mock();
    let net = s.net.clone().unwrap();
    let (a, _b, _names, conn, _accepted) = linked(&s);
    let (an, bn) = ("node-a:1", "node-b:1");
    assert!(net.set_link(an, bn, Link::Flaky(0.2)));
    let buf = a.domain.alloc_region(4096, Access::LOCAL).unwrap();
    let mut sent = 0;
    let broke = loop {
        match conn.post_send(sent, &buf, 0, 64) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(
            sent < 1000,
            "a link breaking one operation in five never broke"
        );
    };
    assert!(
        matches!(broke, Error::PeerGone { .. } | Error::Closed),
        "{broke:?}"
    );
    assert!(!conn.is_alive());
}

/// A connect queued at a listener that then goes away (its server stopped, or its node
/// was killed) is refused at once, as TCP refuses it: it must not wait out its
/// handshake deadline in a queue nobody reads (the simulator's seed 166 lost 5 s per
/// such connect, each time an MDS restarted).
#[test]
fn a_connect_queued_at_a_listener_that_goes_away_fails_at_once() {
    let s = Setup::mock();
    let net = s.net.clone().unwrap();
    for kill in [false, true] {
        let a = s.node(s.secret());
        let b = s.node(s.secret());
        let listener = b.domain.listen("node-b:1").unwrap();
        let deadline = Duration::from_secs(60);
        let t = std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            let r = a.domain.connect_within("node-b:1", &a.cq, deadline);
            (r.map(|_| ()), t0.elapsed())
        });
        // Most often the connect is queued by now; if not, it finds nothing listening,
        // which is a refusal too.
        std::thread::sleep(Duration::from_millis(50));
        if kill {
            net.kill(&b.domain);
        }
        drop(listener);
        let (r, took) = t.join().unwrap();
        match r {
            Err(Error::PeerGone { why, .. }) => assert!(!why.contains("no answer"), "{why}"),
            other => panic!("kill {kill}: {other:?}"),
        }
        assert!(took < deadline, "kill {kill}: the connect waited {took:?}");
    }
}
