//! A client still connected to a primary that lost its role (cut off from its mirror
//! and the cluster manager, while clients still reach it) must not write into the
//! chunk that primary granted it: the new primary never knew the grant, and may have
//! handed the same pages to another client, whose committed data the write would
//! overwrite. Here the cut-off primary closes its clients' connections when its role
//! ends, before the mirror takes over, which the client notices before it writes; a
//! primary that stops without closing anything (SIGSTOP) is the harder case, tested
//! with processes in `cli/tests/mds_mirror.rs` (the chunk's quiet-time rule).

#[path = "../../cli/tests/stale_chunk/mod.rs"]
mod stale_chunk;

use orion_sim::{MirroredCluster, MDSS};

#[test]
fn a_client_of_a_deposed_primary_overwrites_no_page_of_the_new_primarys_clients() {
    let mut cluster = MirroredCluster::start(7).unwrap();
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
    let old = std::cell::Cell::new(0);
    let depose = |c: &mut MirroredCluster| {
        old.set(c.isolate_primary().unwrap());
        // A client of the new primary only (the old one still answers connections).
        c.client_with(|cfg| cfg.mds = MDSS[1 - old.get()].1.into())
            .unwrap()
    };
    let heal = |c: &mut MirroredCluster| c.heal(old.get()).unwrap();
    stale_chunk::stale_client_overwrites_nothing(&mut cluster, &stale, depose, heal);
    drop(stale);
    cluster.stop().unwrap();
}
