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
