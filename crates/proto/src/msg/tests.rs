//! Round trips, truncations and random bytes through every decoder.

use super::*;
use crate::HEADER;
use crate::VERSION;
use orion_format::{SetAttrRec, WriteRec};
use orion_meta::RenameMode;
use proptest::prelude::*;

fn sample_requests() -> Vec<MdsRequest> {
    vec![
        MdsRequest::Hello(Hello {
            internal: Some(MemberId::new(3, 1)),
            strong: true,
            name: "host:42".into(),
            nonce: 99,
            instance: 5,
            host: [0xAB; 16],
        }),
        MdsRequest::Watch {
            inos: vec![1, 7, u64::MAX],
        },
        MdsRequest::CacheLease { keep_watches: true },
        MdsRequest::EndCacheLease,
        MdsRequest::OpenTableWritten,
        MdsRequest::Unwatch { inos: vec![9] },
        MdsRequest::Ping,
        MdsRequest::AllocChunk {
            group: None,
            pages: 256,
        },
        MdsRequest::Commit(Commit {
            ino: 7,
            generation: 3,
            expect: Some(Tail {
                version: 2,
                offset: 64 * 99,
            }),
            persisted_locally: false,
            written_epoch: 12,
            entries: vec![
                Entry::Write(WriteRec {
                    pgoff: 1,
                    npages: 2,
                    gpa: Gpa::new(1, 9),
                    size: 12288,
                    mtime: 5,
                }),
                Entry::SetAttr(SetAttrRec {
                    mask: 1,
                    mode: 0o600,
                    ..Default::default()
                }),
            ],
        }),
        MdsRequest::Create(Create {
            parent: 1,
            name: b"x".to_vec(),
            ftype: FileType::Symlink,
            mode: 0o777,
            uid: 1,
            gid: 2,
            rdev: 0,
            symlink: Some((Gpa::new(0, 4), 10, 3)),
        }),
        MdsRequest::Rename {
            old_parent: 1,
            old_name: b"a".to_vec(),
            new_parent: 2,
            new_name: b"b".to_vec(),
            mode: RenameMode::Exchange,
        },
        MdsRequest::Rename {
            old_parent: 3,
            old_name: b"c".to_vec(),
            new_parent: 3,
            new_name: b"d".to_vec(),
            mode: RenameMode::Replace,
        },
        MdsRequest::Lock(sample_lock()),
        MdsRequest::TestLock(LockReq {
            kind: LockKind::Read,
            ..sample_lock()
        }),
        MdsRequest::ReleaseLocks { ino: 9, owner: 77 },
        MdsRequest::Outcome { id: 12 },
        MdsRequest::HoldOpen {
            ino: 44,
            hold: true,
        },
        MdsRequest::HoldOpen {
            ino: 45,
            hold: false,
        },
        MdsRequest::ReturnPages {
            runs: vec![(Gpa::new(1, 300), 12), (Gpa::new(0, 9), 1)],
        },
    ]
}

fn sample_store_messages() -> Vec<StoreToMds> {
    vec![
        StoreToMds::Join(DsHello {
            group: 1,
            index: 2,
            page_count: 100,
            pool_uuid: [1; 16],
            cluster_uuid: [0; 16],
            addr: "127.0.0.1:5".into(),
            incarnation: 0x1234_5678_9abc,
            durable_on_delivery: true,
            restarted_host: true,
            pool_path: "/dev/shm/pools/ds-1-2.pool".into(),
            host: [0xCD; 16],
        }),
        StoreToMds::Persisted {
            pages: vec![Gpa::new(0, 1), Gpa::new(0, 2)],
        },
        StoreToMds::Resynced,
        StoreToMds::Heartbeat,
        StoreToMds::ResyncPlan {
            member: MemberId::new(4, 1),
            incarnation: 99,
            from_page: 4096,
        },
    ]
}

/// Every sample message, as the bytes the MDS's listener would receive.
fn sample_inbound() -> Vec<MdsInbound> {
    let clients = sample_requests().into_iter().map(MdsInbound::Client);
    let stores = sample_store_messages().into_iter().map(MdsInbound::Store);
    clients.chain(stores).collect()
}

fn round_trip<M: Message + PartialEq + std::fmt::Debug + Clone>(m: &M, id: u64) {
    let mut b = Vec::new();
    m.encode(&mut b, id);
    assert_eq!(M::decode(&b).unwrap(), (id, m.clone()));
    for cut in 0..b.len() {
        assert!(M::decode(&b[..cut]).is_err(), "{m:?} cut at {cut}");
    }
    b.push(0);
    assert_eq!(M::decode(&b).unwrap_err(), ProtoError::Trailing(1));
}

fn sample_lock() -> LockReq {
    LockReq {
        ino: 9,
        owner: 0xdead_beef,
        pid: 42,
        start: 100,
        end: u64::MAX,
        kind: LockKind::Write,
    }
}

#[test]
fn requests_and_replies_round_trip() {
    for (i, m) in sample_inbound().iter().enumerate() {
        round_trip(m, i as u64);
    }
    for (i, m) in sample_requests().iter().enumerate() {
        round_trip(m, i as u64);
    }
    for (i, m) in sample_store_messages().iter().enumerate() {
        round_trip(m, i as u64);
    }
    let persist = StoreRequest::Persist {
        pages: vec![Gpa::new(2, 7), Gpa::new(2, 8)],
    };
    for (i, m) in [
        StoreRequest::Ping,
        StoreRequest::Info,
        StoreRequest::Flush,
        persist,
    ]
    .iter()
    .enumerate()
    {
        round_trip(m, i as u64);
    }
    for reply in [
        ReplyBody::Joined {
            cluster_uuid: [3; 16],
            resync: true,
            heartbeat_ms: 250,
        },
        ReplyBody::ResyncPlan {
            source: "ds1:7420".into(),
            first_page: 128,
            bits: vec![0b1011, 0, u64::MAX],
        },
        ReplyBody::Hello(HelloReply {
            client_id: 4,
            superblock: vec![1; 64],
            pool: orion_fabric::RemoteRegion {
                key: 1,
                addr: 2,
                len: 3,
            },
            open_table: orion_fabric::RemoteRegion {
                key: 4,
                addr: 5,
                len: 6,
            },
            epoch: 17,
            stores: vec![StoreInfo {
                member: MemberId::new(2, 1),
                state: MemberState::Resyncing,
                addr: "ds2:1".into(),
                resync_pct: 40,
                since: 9,
                pool_since: 3,
                durable_on_delivery: true,
                pool_path: "/pools/ds2".into(),
                pool_uuid: [7; 16],
            }],
            grace_ms: 5,
            map_lease_ms: 250,
            grant_quiet_ms: 200,
            term: 3,
        }),
        ReplyBody::Unknown,
        ReplyBody::Lease { ms: 200 },
        ReplyBody::MirrorStart {
            epoch: 9,
            pool: orion_fabric::RemoteRegion {
                key: 5,
                addr: 6,
                len: 1 << 30,
            },
            superblock: vec![7; 128],
        },
    ] {
        let mut b = Vec::new();
        encode_reply(&mut b, 4, &Reply::Ok(reply.clone()));
        assert_eq!(decode_reply(&b).unwrap(), (4, Reply::Ok(reply)));
    }
    let reply = Reply::Ok(ReplyBody::Committed {
        prev: Tail {
            version: 0,
            offset: 128,
        },
        tail: Tail {
            version: 0,
            offset: 256,
        },
    });
    let mut b = Vec::new();
    encode_reply(&mut b, 9, &reply);
    assert_eq!(decode_reply(&b).unwrap(), (9, reply));
    for l in [None, Some(sample_lock())] {
        let reply = Reply::Ok(ReplyBody::Lock(l));
        b.clear();
        encode_reply(&mut b, 3, &reply);
        assert_eq!(decode_reply(&b).unwrap(), (3, reply));
    }
    // A range that ends before it starts is refused.
    let bad = MdsRequest::Lock(LockReq {
        start: 10,
        end: 9,
        ..sample_lock()
    });
    b.clear();
    bad.encode(&mut b, 1);
    assert!(MdsRequest::decode(&b).is_err());
    let err = Reply::Err {
        errno: 2,
        message: "é".repeat(5000),
    };
    b.clear();
    encode_reply(&mut b, 1, &err);
    let (_, Reply::Err { message, .. }) = decode_reply(&b).unwrap() else {
        panic!("not an error reply")
    };
    assert!(message.len() <= MAX_TEXT);
}

#[test]
fn mirror_messages_round_trip_and_the_primary_decodes_the_mirrors() {
    let mut b = Vec::new();
    for m in [
        MirrorToMds::Hello {
            name: "mds-b".into(),
            addr: "10.0.0.2:7410".into(),
            cluster_uuid: [9; 16],
        },
        MirrorToMds::Copied {
            ring: orion_fabric::RemoteRegion {
                key: 7,
                addr: 4096,
                len: 16 << 20,
            },
            durable_on_delivery: true,
        },
        MirrorToMds::Applied { upto: 1 << 40 },
    ] {
        b.clear();
        m.encode(&mut b, 5);
        assert_eq!(MirrorToMds::decode(&b).unwrap(), (5, m.clone()));
        assert_eq!(MdsInbound::decode(&b).unwrap(), (5, MdsInbound::Mirror(m)));
    }
    for m in [
        MdsToMirror::Apply {
            seq: 1,
            records: vec![1, 2, 3],
            replies: vec![4],
            last: false,
        },
        MdsToMirror::Apply {
            seq: u64::MAX,
            records: Vec::new(),
            replies: b"replies".to_vec(),
            last: true,
        },
    ] {
        b.clear();
        m.encode(&mut b, 6);
        assert_eq!(MdsToMirror::decode(&b).unwrap(), (6, m));
        assert!(MdsInbound::decode(&b).is_err(), "not for the primary");
    }
    // Records longer than a message allows are refused.
    b.clear();
    MdsToMirror::Apply {
        seq: 1,
        records: vec![0; MAX_APPLY_RECORDS + 1],
        replies: Vec::new(),
        last: true,
    }
    .encode(&mut b, 1);
    assert!(MdsToMirror::decode(&b).is_err());
}

#[test]
fn invalidations_round_trip_and_bad_ones_are_refused() {
    let m = MdsToClient::Invalidate {
        items: vec![
            Invalidation::Inode(9),
            Invalidation::Entry {
                parent: 1,
                name: b"gone".to_vec(),
            },
            Invalidation::Recall(12),
        ],
    };
    round_trip(&m, 77);
    let mut b = Vec::new();
    m.encode(&mut b, 1);
    // An unknown item kind, and a count past the limit.
    let mut bad = b.clone();
    bad[HEADER + 4] = 7;
    assert_eq!(
        MdsToClient::decode(&bad).unwrap_err(),
        ProtoError::Invalid("invalidation kind")
    );
    let mut bad = b.clone();
    bad[HEADER..HEADER + 4].copy_from_slice(&(MAX_INVALIDATIONS as u32 + 1).to_le_bytes());
    assert!(MdsToClient::decode(&bad).is_err());
    for n in 0..b.len() {
        assert!(MdsToClient::decode(&b[..n]).is_err(), "truncated at {n}");
    }
}

#[test]
fn a_message_sent_to_the_wrong_service_is_an_unknown_kind() {
    let mut b = Vec::new();
    StoreRequest::Flush.encode(&mut b, 1);
    assert_eq!(
        MdsInbound::decode(&b).unwrap_err(),
        ProtoError::UnknownKind(StoreKind::Flush as u8)
    );
    b.clear();
    MdsRequest::Statfs.encode(&mut b, 1);
    assert_eq!(
        StoreRequest::decode(&b).unwrap_err(),
        ProtoError::UnknownKind(MdsKind::Statfs as u8)
    );
    b.clear();
    StoreToMds::Persisted { pages: vec![] }.encode(&mut b, 1);
    assert!(
        MdsRequest::decode(&b).is_err(),
        "a client request is not a store's"
    );
}

#[test]
fn kind_numbers_of_the_families_are_disjoint() {
    let mut seen = std::collections::HashSet::new();
    let all = MdsKind::ALL
        .iter()
        .map(|k| *k as u8)
        .chain(StoreToMdsKind::ALL.iter().map(|k| *k as u8))
        .chain(StoreKind::ALL.iter().map(|k| *k as u8))
        .chain(MirrorToMdsKind::ALL.iter().map(|k| *k as u8))
        .chain(MdsToMirrorKind::ALL.iter().map(|k| *k as u8))
        .chain(MdsToClientKind::ALL.iter().map(|k| *k as u8))
        .chain([K_REPLY]);
    for k in all {
        assert!(seen.insert(k), "kind {k} used twice");
    }
    for k in MdsKind::ALL {
        assert_eq!(MdsKind::try_from(*k as u8), Ok(*k));
    }
    for k in ReplyKind::ALL {
        assert_eq!(ReplyKind::try_from(*k as u8), Ok(*k));
    }
}

proptest! {
    #[test]
    fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = MdsInbound::decode(&b);
        let _ = StoreRequest::decode(&b);
        let _ = MdsToMirror::decode(&b);
        let _ = MdsToClient::decode(&b);
        let _ = decode_reply(&b);
        let mut h = b.clone();
        if h.len() >= HEADER {
            // A valid header of every kind in turn, then random bytes.
            let kind = h[3] % 100;
            h[..4].copy_from_slice(&[0x4F, 0x52, VERSION, kind]);
            let _ = MdsInbound::decode(&h);
            let _ = MdsRequest::decode(&h);
            let _ = StoreToMds::decode(&h);
            let _ = StoreRequest::decode(&h);
            let _ = MdsToMirror::decode(&h);
            let _ = MirrorToMds::decode(&h);
            let _ = MdsToClient::decode(&h);
            h[3] = K_REPLY;
            let _ = decode_reply(&h);
        }
    }
}
