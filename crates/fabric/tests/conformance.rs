//! The fabric contract, checked against every backend that runs on this machine: mock, local
//! shared memory, and libfabric over tcp;ofi_rxm on loopback (the netns test runs a part of it
//! between two network namespaces).
//!
//! Seeded: ORION_SEED=N reproduces a run; the seed is printed when a test fails.

mod support;

use std::time::Duration;

use orion_fabric::{Access, Error, OpKind, RemoteRegion, MAX_MESSAGE};
use support::*;

const T: Duration = Duration::from_secs(10);

macro_rules! conformance {
    ($name:ident, $setup:expr) => {
        mod $name {
            use super::*;
            fn setup() -> Setup {
                $setup
            }
            #[test]
            fn send_recv_keeps_order_and_lengths() {
                tests::send_recv_keeps_order_and_lengths(setup())
            }
            #[test]
            fn recv_smaller_than_message_breaks_the_connection() {
                tests::recv_smaller_than_message_breaks_the_connection(setup())
            }
            #[test]
            fn one_sided_read_and_write() {
                tests::one_sided_read_and_write(setup())
            }
            #[test]
            fn a_prefault_moves_no_byte() {
                tests::a_prefault_moves_no_byte(setup())
            }
            #[test]
            fn write_imm_arrives_after_its_data() {
                tests::write_imm_arrives_after_its_data(setup())
            }
            #[test]
            fn bad_keys_and_ranges_are_refused() {
                tests::bad_keys_and_ranges_are_refused(setup())
            }
            #[test]
            fn forged_range_is_refused_by_the_target() {
                tests::forged_range_is_refused_by_the_target(setup())
            }
            #[test]
            fn revoked_and_read_only_regions_refuse_access() {
                tests::revoked_and_read_only_regions_refuse_access(setup())
            }
            #[test]
            fn wrong_secret_is_refused() {
                tests::wrong_secret_is_refused(setup())
            }
            #[test]
            fn other_epoch_is_refused() {
                tests::other_epoch_is_refused(setup())
            }
            #[test]
            fn closed_peer_flushes_posted_receives() {
                tests::closed_peer_flushes_posted_receives(setup())
            }
            #[test]
            fn every_operation_completes_exactly_once_under_load() {
                tests::every_operation_completes_exactly_once_under_load(setup())
            }
            #[test]
            fn sleeping_waiter_wakes_and_idle_wait_times_out() {
                tests::sleeping_waiter_wakes_and_idle_wait_times_out(setup())
            }
            #[test]
            fn a_wake_ends_a_wait_with_nothing() {
                tests::a_wake_ends_a_wait_with_nothing(setup())
            }
            #[test]
            fn a_yielding_waiter_gets_its_completion_and_times_out() {
                tests::a_yielding_waiter_gets_its_completion_and_times_out(setup())
            }
        }
    };
}

conformance!(mock, Setup::mock());
conformance!(local, Setup::local());
conformance!(libfabric_tcp, Setup::libfabric());

mod tests {
    use super::*;

    pub fn send_recv_keeps_order_and_lengths(s: Setup) {
        let p = s.pair();
        let mut rng = s.rng();
        let sizes: Vec<usize> = [0usize, 1, 63, 64, 4096, MAX_MESSAGE]
            .into_iter()
            .chain((0..40).map(|_| rng.gen_range(0..9000)))
            .collect();
        let sbuf = p
            .server
            .domain
            .alloc_region(MAX_MESSAGE * sizes.len(), Access::LOCAL)
            .unwrap();
        for (i, _) in sizes.iter().enumerate() {
            p.server
                .conn
                .post_recv(i as u64, &sbuf, (i * MAX_MESSAGE) as u64, MAX_MESSAGE)
                .unwrap();
        }
        let cbuf = p
            .client
            .domain
            .alloc_region(MAX_MESSAGE * sizes.len(), Access::LOCAL)
            .unwrap();
        let mut expect = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            cbuf.write((i * MAX_MESSAGE) as u64, &data).unwrap();
            p.client
                .conn
                .post_send(1000 + i as u64, &cbuf, (i * MAX_MESSAGE) as u64, n)
                .unwrap();
            expect.push(data);
        }
        let sends = p.client.collect(sizes.len(), T);
        assert!(
            sends
                .iter()
                .all(|c| c.kind == OpKind::Send && c.status.is_ok()),
            "{sends:?}"
        );
        let recvs = p.server.collect(sizes.len(), T);
        for (i, c) in recvs.iter().enumerate() {
            assert_eq!(
                (c.kind, c.wr_id, c.len, &c.status),
                (OpKind::Recv, i as u64, sizes[i], &Ok(())),
                "message {i}"
            );
            let mut got = vec![0u8; c.len];
            sbuf.read((i * MAX_MESSAGE) as u64, &mut got).unwrap();
            assert!(got == expect[i], "message {i} content differs");
        }
        // And back the other way.
        p.client.conn.post_recv(7, &cbuf, 0, 128).unwrap();
        sbuf.write(0, b"pong").unwrap();
        p.server.conn.post_send(8, &sbuf, 0, 4).unwrap();
        let c = p.client.collect(1, T);
        assert_eq!((c[0].wr_id, c[0].len), (7, 4));
        // Oversized sends are refused at the call.
        let big = p
            .client
            .domain
            .alloc_region(MAX_MESSAGE + 1, Access::LOCAL)
            .unwrap();
        assert!(matches!(
            p.client.conn.post_send(9, &big, 0, MAX_MESSAGE + 1),
            Err(Error::MessageTooLarge { .. })
        ));
    }

    /// A message larger than the posted buffer is a protocol violation: the receive fails with
    /// RecvTooSmall and the connection closes on both sides (a verbs QP enters the error state
    /// on a local length error; libfabric tcp cannot skip the rest of the message).
    pub fn recv_smaller_than_message_breaks_the_connection(s: Setup) {
        let p = s.pair();
        let sbuf = p.server.domain.alloc_region(8192, Access::LOCAL).unwrap();
        p.server.conn.post_recv(1, &sbuf, 0, 16).unwrap();
        p.server.conn.post_recv(2, &sbuf, 4096, 4096).unwrap();
        let cbuf = p.client.domain.alloc_region(8192, Access::LOCAL).unwrap();
        cbuf.write(0, &[7u8; 100]).unwrap();
        p.client.conn.post_send(1, &cbuf, 0, 100).unwrap();
        // The send's own status depends on the backend (sent, or failed with the connection).
        p.client.collect(1, T);
        let r = p.server.collect(2, T);
        assert_eq!(r[0].wr_id, 1);
        assert!(
            matches!(
                r[0].status,
                Err(Error::RecvTooSmall { len: 100, cap: 16 })
                    | Err(Error::RecvTooSmall { cap: 16, .. })
            ),
            "{:?}",
            r[0]
        );
        assert_eq!(r[1].wr_id, 2);
        assert!(
            matches!(r[1].status, Err(Error::Protocol { .. })),
            "{:?}",
            r[1]
        );
        assert!(!p.server.conn.is_alive());
        let deadline = std::time::Instant::now() + T;
        while p.client.conn.is_alive() {
            assert!(
                std::time::Instant::now() < deadline,
                "the sender never learned that the connection closed"
            );
            p.client.drain();
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The server exposes a region and sends its descriptor; returns (region, descriptor).
    fn exposed(p: &Pair, len: usize, access: Access) -> (orion_fabric::Region, RemoteRegion) {
        let r = p.server.domain.alloc_region(len, access).unwrap();
        let d = p.ship_descriptor(&r);
        (r, d)
    }

    /// A prefault is a hint (the local backend maps the target's pages in): the
    /// target's bytes stay as they were, and writes after it land as ever.
    pub fn a_prefault_moves_no_byte(s: Setup) {
        let p = s.pair();
        let mut rng = s.rng();
        let len = 64 << 10;
        let (target, d) = exposed(&p, len, Access::REMOTE_ALL);
        let pattern: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        target.write(0, &pattern).unwrap();
        p.client.conn.prefault_remote(&d, 0, len).unwrap();
        p.client.conn.prefault_remote(&d, 4095, 2).unwrap();
        let mut got = vec![0u8; len];
        target.read(0, &mut got).unwrap();
        assert!(got == pattern, "a prefault changed the target");
        let buf = p.client.domain.alloc_region(4096, Access::LOCAL).unwrap();
        buf.write(0, &[0x5a; 4096]).unwrap();
        p.client
            .conn
            .post_write(1, &buf, 0, &d, 8192, 4096)
            .unwrap();
        assert_eq!(p.client.collect(1, T)[0].status, Ok(()));
        target.read(0, &mut got).unwrap();
        assert!(got[8192..12288].iter().all(|&b| b == 0x5a));
        assert!(got[..8192] == pattern[..8192] && got[12288..] == pattern[12288..]);
    }

    pub fn one_sided_read_and_write(s: Setup) {
        let p = s.pair();
        let mut rng = s.rng();
        let len = 1 << 20;
        let (target, d) = exposed(&p, len, Access::REMOTE_ALL);
        let pattern: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        target.write(0, &pattern).unwrap();
        target.store_u64(4096, 0x1122_3344_5566_7788).unwrap();
        let buf = p.client.domain.alloc_region(len, Access::LOCAL).unwrap();
        // The 8-byte tail read of Orion's arbitration.
        p.client.conn.post_read(1, &buf, 0, &d, 4096, 8).unwrap();
        let c = p.client.collect(1, T);
        assert_eq!(
            (c[0].kind, c[0].len, &c[0].status),
            (OpKind::Read, 8, &Ok(()))
        );
        assert_eq!(buf.load_u64(0).unwrap(), 0x1122_3344_5566_7788);
        // Reads of many sizes and offsets, including the region's last byte.
        for i in 0..50u64 {
            let n = rng.gen_range(1..=65536usize);
            let off = if i == 0 {
                (len - n) as u64
            } else {
                rng.gen_range(0..=(len - n) as u64)
            };
            p.client
                .conn
                .post_read(10 + i, &buf, 0, &d, off, n)
                .unwrap();
            let c = p.client.collect(1, T);
            assert_eq!(c[0].status, Ok(()));
            let mut got = vec![0u8; n];
            buf.read(0, &mut got).unwrap();
            let want = if off == 4096 || (off < 4104 && off + n as u64 > 4096) {
                None
            } else {
                Some(&pattern[off as usize..off as usize + n])
            };
            if let Some(w) = want {
                assert!(got == w, "read {n} bytes at {off}");
            }
        }
        // Writes, then a read of the same range returns them (ordered on one connection).
        let data: Vec<u8> = (0..300_000).map(|_| rng.gen()).collect();
        buf.write(0, &data).unwrap();
        p.client
            .conn
            .post_write(100, &buf, 0, &d, 12345, data.len())
            .unwrap();
        assert_eq!(p.client.collect(1, T)[0].status, Ok(()));
        let back = p
            .client
            .domain
            .alloc_region(data.len(), Access::LOCAL)
            .unwrap();
        p.client
            .conn
            .post_read(101, &back, 0, &d, 12345, data.len())
            .unwrap();
        assert_eq!(p.client.collect(1, T)[0].status, Ok(()));
        let mut got = vec![0u8; data.len()];
        back.read(0, &mut got).unwrap();
        assert!(got == data, "read-after-write returned other bytes");
        let mut at_target = vec![0u8; data.len()];
        target.read(12345, &mut at_target).unwrap();
        assert!(
            at_target == data,
            "the target's memory does not hold the written bytes"
        );
    }

    pub fn write_imm_arrives_after_its_data(s: Setup) {
        let p = s.pair();
        let (target, d) = exposed(&p, 1 << 16, Access::REMOTE_ALL);
        let buf = p
            .client
            .domain
            .alloc_region(1 << 16, Access::LOCAL)
            .unwrap();
        for round in 0..20u32 {
            let fill = vec![round as u8 + 1; 4096];
            buf.write(0, &fill).unwrap();
            p.client
                .conn
                .post_write_imm(
                    round as u64,
                    &buf,
                    0,
                    &d,
                    (round as u64 % 8) * 4096,
                    4096,
                    0xA000_0000 | round,
                )
                .unwrap();
            let c = p.client.collect(1, T);
            assert_eq!((c[0].kind, &c[0].status), (OpKind::WriteImm, &Ok(())));
            let r = p.server.collect(1, T);
            assert_eq!(
                (r[0].kind, r[0].imm, r[0].conn, &r[0].status),
                (
                    OpKind::RemoteWrite,
                    0xA000_0000 | round,
                    p.server.conn.id(),
                    &Ok(())
                )
            );
            let mut got = vec![0u8; 4096];
            target.read((round as u64 % 8) * 4096, &mut got).unwrap();
            assert!(
                got == fill,
                "round {round}: the immediate arrived before its data"
            );
        }
    }

    pub fn bad_keys_and_ranges_are_refused(s: Setup) {
        let p = s.pair();
        let (_target, d) = exposed(&p, 8192, Access::REMOTE_ALL);
        let buf = p.client.domain.alloc_region(8192, Access::LOCAL).unwrap();
        // Ranges outside the descriptor are refused at the call, before anything is sent.
        assert!(matches!(
            p.client.conn.post_read(1, &buf, 0, &d, 8190, 8),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            p.client.conn.post_write(1, &buf, 0, &d, u64::MAX - 2, 8),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            p.client.conn.post_read(1, &buf, 8190, &d, 0, 8),
            Err(Error::OutOfBounds { .. })
        ));
        // A region of another domain cannot be a local buffer.
        let foreign = p.server.domain.alloc_region(4096, Access::LOCAL).unwrap();
        assert!(matches!(
            p.client.conn.post_read(1, &foreign, 0, &d, 0, 8),
            Err(Error::ForeignRegion)
        ));
        // An unknown key is refused by the target.
        let forged = RemoteRegion {
            key: d.key ^ 0xdead_beef,
            ..d
        };
        p.client.conn.post_read(2, &buf, 0, &forged, 0, 8).unwrap();
        let c = p.client.collect(1, T);
        assert!(
            matches!(
                c[0].status,
                Err(Error::UnknownKey { .. })
                    | Err(Error::RemoteAccess(_))
                    | Err(Error::PeerGone { .. })
            ),
            "{:?}",
            c[0]
        );
        // The target's memory was not touched, and once reconnected (a refused access may
        // break the connection, as it puts a verbs QP in the error state) reads work again.
        let p = p.reconnect_if_broken();
        let (_target, d) = exposed(&p, 8192, Access::REMOTE_ALL);
        let buf = p.client.domain.alloc_region(8192, Access::LOCAL).unwrap();
        p.client.conn.post_read(3, &buf, 0, &d, 0, 8).unwrap();
        assert_eq!(p.client.collect(1, T)[0].status, Ok(()));
        // Keys are not guessable from one another.
        let a = p
            .server
            .domain
            .alloc_region(4096, Access::REMOTE_READ)
            .unwrap()
            .remote()
            .key;
        let b = p
            .server
            .domain
            .alloc_region(4096, Access::REMOTE_READ)
            .unwrap()
            .remote()
            .key;
        assert!(
            a != b && a.abs_diff(b) > 1 << 20,
            "keys {a:#x} and {b:#x} look sequential"
        );
    }

    pub fn forged_range_is_refused_by_the_target(s: Setup) {
        let p = s.pair();
        let (target, d) = exposed(&p, 8192, Access::REMOTE_ALL);
        target.write(0, &[9u8; 8192]).unwrap();
        let buf = p.client.domain.alloc_region(65536, Access::LOCAL).unwrap();
        // A descriptor that claims more than was registered passes the local check; the target
        // must refuse it (an RDMA target may also break the connection, as a QP would).
        let forged = RemoteRegion { len: 1 << 30, ..d };
        buf.write(0, &[1u8; 65536]).unwrap();
        p.client
            .conn
            .post_write(1, &buf, 0, &forged, 8192 - 16, 4096)
            .unwrap();
        let c = p.client.collect(1, T);
        assert!(
            c[0].status.is_err(),
            "an out-of-range write was accepted: {:?}",
            c[0]
        );
        let mut after = vec![0u8; 8192];
        target.read(0, &mut after).unwrap();
        assert!(
            after.iter().all(|&b| b == 9),
            "a refused write changed the target region"
        );
    }

    pub fn revoked_and_read_only_regions_refuse_access(s: Setup) {
        let p = s.pair();
        let (ro, d_ro) = exposed(&p, 4096, Access::REMOTE_READ);
        ro.write(0, &[5u8; 4096]).unwrap();
        let buf = p.client.domain.alloc_region(4096, Access::LOCAL).unwrap();
        buf.write(0, &[6u8; 4096]).unwrap();
        p.client.conn.post_read(1, &buf, 0, &d_ro, 0, 64).unwrap();
        assert_eq!(p.client.collect(1, T)[0].status, Ok(()));
        let p = p.reconnect_if_broken();
        let buf = p.client.domain.alloc_region(4096, Access::LOCAL).unwrap();
        p.client.conn.post_write(2, &buf, 0, &d_ro, 0, 64).unwrap();
        let c = p.client.collect(1, T);
        assert!(
            c[0].status.is_err(),
            "a write to a read-only region was accepted"
        );
        let mut got = [0u8; 64];
        ro.read(0, &mut got).unwrap();
        assert_eq!(got, [5u8; 64]);

        let p = p.reconnect_if_broken();
        let (rw, d_rw) = exposed(&p, 4096, Access::REMOTE_ALL);
        let buf = p.client.domain.alloc_region(4096, Access::LOCAL).unwrap();
        p.client.conn.post_read(3, &buf, 0, &d_rw, 0, 8).unwrap();
        assert_eq!(p.client.collect(1, T)[0].status, Ok(()));
        rw.revoke();
        p.client.conn.post_read(4, &buf, 0, &d_rw, 0, 8).unwrap();
        let c = p.client.collect(1, T);
        assert!(
            c[0].status.is_err(),
            "a revoked key still works: {:?}",
            c[0]
        );
    }

    pub fn wrong_secret_is_refused(s: Setup) {
        let server = s.node(s.secret());
        let l = server.domain.listen(&s.listen_addr()).unwrap();
        let addr = l.local_addr();
        let intruder = s.node(orion_fabric::Secret::from_bytes(b"not-the-cluster-secret").unwrap());
        let t = std::thread::spawn(move || {
            let r = l.accept(&server.cq, T);
            (r.map(|_| ()), l, server)
        });
        let c = intruder.domain.connect(&addr, &intruder.cq);
        assert!(matches!(c, Err(Error::AuthFailed { .. })), "{c:?}");
        let (r, l, server) = t.join().unwrap();
        assert!(matches!(r, Err(Error::AuthFailed { .. })), "{r:?}");
        // The listener still serves members of the cluster.
        let member = s.node(s.secret());
        let t = std::thread::spawn(move || l.accept(&server.cq, T).map(|_| ()));
        member.domain.connect(&addr, &member.cq).unwrap();
        t.join().unwrap().unwrap();
    }

    pub fn other_epoch_is_refused(s: Setup) {
        let server = s.node(s.secret());
        let l = server.domain.listen(&s.listen_addr()).unwrap();
        let addr = l.local_addr();
        let stale = s.node_with(s.secret(), 0);
        let t = std::thread::spawn(move || l.accept(&server.cq, T).map(|_| ()));
        let c = stale.domain.connect(&addr, &stale.cq);
        assert!(
            matches!(
                c,
                Err(Error::EpochMismatch {
                    ours: 0,
                    theirs: 1,
                    ..
                })
            ),
            "{c:?}"
        );
        assert!(matches!(
            t.join().unwrap(),
            Err(Error::EpochMismatch {
                ours: 1,
                theirs: 0,
                ..
            })
        ));
    }

    pub fn closed_peer_flushes_posted_receives(s: Setup) {
        let p = s.pair();
        let buf = p.client.domain.alloc_region(4096, Access::LOCAL).unwrap();
        for i in 0..4 {
            p.client.conn.post_recv(i, &buf, i * 64, 64).unwrap();
        }
        assert!(p.client.conn.is_alive());
        let (client, server) = p.split();
        server.kill();
        let got = client.collect(4, T);
        let mut ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
        ids.sort();
        assert_eq!(ids, vec![0, 1, 2, 3]);
        assert!(
            got.iter()
                .all(|c| matches!(c.status, Err(Error::PeerGone { .. }))),
            "{got:?}"
        );
        assert!(!client.conn.is_alive());
        match client.conn.post_send(9, &buf, 0, 8) {
            Err(e) => assert!(e.is_fatal_to_connection(), "{e:?}"),
            Ok(()) => {
                let c = client.collect(1, T);
                assert!(
                    c[0].status
                        .as_ref()
                        .is_err_and(|e| e.is_fatal_to_connection()),
                    "{c:?}"
                );
            }
        }
    }

    pub fn every_operation_completes_exactly_once_under_load(s: Setup) {
        let p = s.pair();
        let mut rng = s.rng();
        let (_target, d) = exposed(&p, 1 << 20, Access::REMOTE_ALL);
        let buf = p
            .client
            .domain
            .alloc_region(1 << 20, Access::LOCAL)
            .unwrap();
        let sbuf = p
            .server
            .domain
            .alloc_region(64 * 4096, Access::LOCAL)
            .unwrap();
        let total = 6000u64;
        let window = 600u64;
        let mut seen = vec![0u8; total as usize];
        let (mut posted, mut done, mut sends) = (0u64, 0u64, 0u64);
        let mut recv_next = 0u64;
        let mut recvs_posted = 0u64;
        let mut out = Vec::new();
        while done < total {
            while posted < total && posted - done < window {
                let off = rng.gen_range(0..255u64) * 4096;
                let n = rng.gen_range(1..=4096usize);
                match rng.gen_range(0..3) {
                    0 => p
                        .client
                        .conn
                        .post_read(posted, &buf, off, &d, off, n)
                        .unwrap(),
                    1 => p
                        .client
                        .conn
                        .post_write(posted, &buf, off, &d, off, n)
                        .unwrap(),
                    _ => {
                        if recvs_posted < sends + 64 {
                            for _ in 0..64 {
                                p.server
                                    .conn
                                    .post_recv(
                                        recvs_posted,
                                        &sbuf,
                                        (recvs_posted % 64) * 4096,
                                        4096,
                                    )
                                    .unwrap();
                                recvs_posted += 1;
                            }
                        }
                        p.client.conn.post_send(posted, &buf, off, n).unwrap();
                        sends += 1;
                    }
                }
                posted += 1;
            }
            out.clear();
            p.client
                .cq
                .wait(&mut out, 256, T)
                .expect("completions stopped arriving");
            for c in &out {
                assert_eq!(c.status, Ok(()), "{c:?}");
                assert!(
                    c.wr_id < total && seen[c.wr_id as usize] == 0,
                    "completion {} twice or unknown",
                    c.wr_id
                );
                seen[c.wr_id as usize] = 1;
                done += 1;
            }
            // The server reposts as messages arrive.
            for c in p.server.drain() {
                assert_eq!(c.status, Ok(()));
                assert_eq!(c.wr_id, recv_next, "receives completed out of order");
                recv_next += 1;
            }
        }
        let rest = p.server.collect((sends - recv_next) as usize, T);
        assert_eq!(recv_next + rest.len() as u64, sends);
        out.clear();
        assert!(
            matches!(
                p.client.cq.wait(&mut out, 16, Duration::from_millis(50)),
                Err(Error::Timeout(_))
            ),
            "extra completions: {out:?}"
        );
    }

    pub fn sleeping_waiter_wakes_and_idle_wait_times_out(s: Setup) {
        let p = s.pair_with(orion_fabric::SpinPolicy::never());
        let waited = idle_wait_then_late_send(&p, Duration::from_millis(120), 100);
        assert!(waited >= Duration::from_millis(120), "{waited:?}");
    }

    /// A waiter that yields its CPU at every poll (a client's policy, from the first
    /// poll on, spinning for the whole wait) still gets a completion that comes
    /// late, and still gives up at its timeout.
    pub fn a_yielding_waiter_gets_its_completion_and_times_out(s: Setup) {
        let p = s.pair_with(orion_fabric::SpinPolicy {
            max: Duration::from_secs(1),
            yield_after: Some(Duration::ZERO),
            ..orion_fabric::SpinPolicy::client()
        });
        let waited = idle_wait_then_late_send(&p, Duration::from_millis(60), 30);
        assert!(
            waited >= Duration::from_millis(60) && waited < Duration::from_secs(1),
            "{waited:?}"
        );
    }

    /// A wait of `timeout` with nothing to come must time out (how long it took is
    /// returned); then a send posted `after_ms` later must complete the client's
    /// receive.
    fn idle_wait_then_late_send(p: &Pair, timeout: Duration, after_ms: u64) -> Duration {
        let mut out = Vec::new();
        let t0 = std::time::Instant::now();
        assert!(matches!(
            p.client.cq.wait(&mut out, 8, timeout),
            Err(Error::Timeout(_))
        ));
        let waited = t0.elapsed();
        let buf = p.client.domain.alloc_region(4096, Access::LOCAL).unwrap();
        p.client.conn.post_recv(5, &buf, 0, 64).unwrap();
        let sbuf = p.server.domain.alloc_region(4096, Access::LOCAL).unwrap();
        let sconn = p.server.conn.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(after_ms));
            sconn.post_send(1, &sbuf, 0, 8).unwrap();
        });
        let c = p.client.collect(1, T);
        assert_eq!((c[0].wr_id, &c[0].status), (5, &Ok(())));
        t.join().unwrap();
        waited
    }

    /// What a server's acceptor does after handing over a connection: a waiter
    /// sleeping with a long timeout returns at once with no completion, and a wake
    /// given before the wait is not lost.
    pub fn a_wake_ends_a_wait_with_nothing(s: Setup) {
        let p = s.pair_with(orion_fabric::SpinPolicy::never());
        let cq = p.client.cq.clone();
        let waiter = std::thread::spawn(move || {
            let mut out = Vec::new();
            let r = cq.wait(&mut out, 8, Duration::from_secs(600));
            (r.map_err(|e| e.to_string()), out.len())
        });
        // The wake may come before or during the wait: either way it returns Ok(0)
        // (a lost wake would leave it asleep for ten minutes).
        std::thread::sleep(Duration::from_millis(20));
        p.client.cq.wake();
        assert_eq!(waiter.join().unwrap(), (Ok(0), 0));
        // A wake with nobody waiting: the next wait returns with nothing, and the
        // one after that waits as usual.
        p.client.cq.wake();
        let mut out = Vec::new();
        assert_eq!(
            p.client.cq.wait(&mut out, 8, T).map_err(|e| e.to_string()),
            Ok(0)
        );
        assert!(matches!(
            p.client.cq.wait(&mut out, 8, Duration::from_millis(30)),
            Err(Error::Timeout(_))
        ));
    }
}
