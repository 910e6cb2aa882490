//! A client still connected to a primary that lost its role (cut off from its mirror
//! and the cluster manager, while clients still reach it) must not write into the
//! chunk that primary granted it: the new primary never knew the grant, and may have
//! handed the same pages to another client, whose committed data the write would
//! overwrite. Here the cut-off primary closes its clients' connections when its role
//! ends, before the mirror takes over, which the client notices before it writes; a
//! primary that stops without closing anything (SIGSTOP) is the harder case, tested
//! with processes in `cli/tests/mds_mirror.rs` (the chunk's quiet-time rule).

use orion_client::{Client, OpenFlags};
use orion_sim::{MirroredCluster, MDSS};

fn read(c: &Client, path: &str) -> Vec<u8> {
    let fd = c.open(path, OpenFlags::read(), 0).unwrap();
    let b = c.pread(fd, 0, 1 << 20).unwrap();
    c.close(fd).unwrap();
    b
}

fn put(c: &Client, path: &str, data: &[u8]) {
    let fd = c.open(path, OpenFlags::create(), 0o644).unwrap();
    c.pwrite(fd, 0, data).unwrap();
    c.close(fd).unwrap();
}

#[test]
fn a_client_of_a_deposed_primary_overwrites_no_page_of_the_new_primarys_clients() {
    let mut cluster = MirroredCluster::start(7).unwrap();
    let page = |fill: u8| vec![fill; 4096];
    // One lane and a large chunk, so that the write below would take its pages from
    // the chunk the first primary granted; a short timeout, so that the cut-off
    // primary's silence is noticed soon.
    let stale = cluster
        .client_with(|cfg| {
            cfg.lanes = 1;
            cfg.chunk_pages = 256;
            cfg.op_timeout_ms = 2_000;
        })
        .unwrap();
    put(&stale, "/first", &page(1));
    let rw = OpenFlags {
        read: true,
        write: true,
        create: true,
        ..Default::default()
    };
    let fd = stale.open("/late", rw, 0o644).unwrap();

    let old = cluster.isolate_primary().unwrap();
    // A client of the new primary only (the old one still answers connections).
    let fresh = cluster
        .client_with(|cfg| cfg.mds = MDSS[1 - old].1.into())
        .unwrap();
    for i in 0..16u8 {
        put(&fresh, &format!("/b{i}"), &page(0x10 + i));
    }
    // The stale client writes: not into its old chunk.
    stale.pwrite(fd, 0, &page(0xee)).unwrap();
    stale.close(fd).unwrap();
    cluster.heal(old).unwrap();
    for i in 0..16u8 {
        let intact = read(&fresh, &format!("/b{i}")) == page(0x10 + i);
        assert!(
            intact,
            "/b{i} was overwritten by the client of the deposed primary"
        );
    }
    assert!(read(&fresh, "/late") == page(0xee), "/late");
    assert!(read(&fresh, "/first") == page(1), "/first");
    drop((stale, fresh));
    cluster.stop().unwrap();
}
