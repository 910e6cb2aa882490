//! Differential property test through the client library: random operation sequences
//! run against a real MDS and data store (separate processes) by two clients taking
//! turns, and through system calls against a tmpfs directory, give the same results,
//! the same trees and the same timestamp changes. After each operation the tree is
//! read through the *other* client, so every step also checks that one client sees
//! the other's changes (tail checks and refetches).

mod client_ops;
mod cluster;
#[path = "../../meta/tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};

use client_ops::{client_snapshot, run_client};
use cluster::Cluster;
use orion_client::Client;
use proptest::prelude::*;
use support::oracle::{oracle_snapshot, run_oracle, wait_past};
use support::*;

fn max_time(s: &Snapshot) -> i64 {
    s.values().map(|n| n.mtime.max(n.ctime)).max().unwrap_or(0)
}

static CASE: AtomicU64 = AtomicU64::new(0);

fn check_sequence(clients: &[Client; 2], ops: Vec<OpT>) -> Result<(), TestCaseError> {
    let oracle = tempfile::tempdir_in("/dev/shm").unwrap();
    let root = oracle.path();
    std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let top = format!("/case{}", CASE.fetch_add(1, Ordering::Relaxed));
    clients[0].mkdir(&top, 0o755).unwrap();
    for (i, op) in ops.iter().enumerate() {
        let (me, other) = (&clients[i % 2], &clients[(i + 1) % 2]);
        let ob = oracle_snapshot(root);
        let cb = client_snapshot(me, &top);
        let op = &op.resolve(&ob);
        wait_past(max_time(&ob).max(max_time(&cb)));
        let o = run_oracle(root, op);
        let c = run_client(me, &top, op);
        prop_assert_eq!(&c, &o, "result of op {} {:?} by client {}", i, op, i % 2);
        let oa = oracle_snapshot(root);
        let ca = client_snapshot(other, &top);
        if let Some(d) = diff_ignoring_times(&oa, &ca) {
            return Err(TestCaseError::fail(format!(
                "tree after op {i} {op:?}, seen by the other client: tmpfs vs orion: {d}"
            )));
        }
        prop_assert_eq!(
            op_time_changes(op, &ob, &oa),
            op_time_changes(op, &cb, &ca),
            "mtime/ctime changes after op {} {:?}: tmpfs left, orion right",
            i,
            op
        );
    }
    Ok(())
}

#[test]
fn two_clients_of_a_real_cluster_match_tmpfs() {
    // SAFETY: umask only sets the process's file-creation mask.
    unsafe { libc::umask(UMASK as libc::mode_t) };
    let cluster = Cluster::start("local", 1);
    // One internal client (it maps the store's pool) and one external (fabric only).
    let clients = [cluster.client(true, true), cluster.client(true, false)];
    run_property(
        "differential: two clients of a cluster vs tmpfs",
        64,
        prop::collection::vec(arb_op(), 1..80),
        |ops| check_sequence(&clients, ops),
    );
    let s0 = clients[0].stats();
    let s1 = clients[1].stats();
    eprintln!("client stats: {s0:?}\n{s1:?}");
    assert!(
        s0.refetches + s1.refetches > 0,
        "the clients saw each other's commits"
    );
}
