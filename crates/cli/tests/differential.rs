//! Differential property test through the client library: random operation sequences
//! run against a real MDS and data store (separate processes) by two clients taking
//! turns, and through system calls against a tmpfs directory, give the same results,
//! the same trees and the same timestamp changes. After each operation the tree is
//! read through the *other* client, so every step also checks that one client sees
//! the other's changes (tail checks and refetches).

mod cluster;
#[path = "../../meta/tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use cluster::Cluster;
use orion_client::{Client, OpenFlags};
use orion_format::FileType;
use orion_meta::xattr::SetMode;
use orion_meta::{FsError, RenameMode, SetAttrReq, TimeSet};
use proptest::prelude::*;
use support::oracle::{oracle_snapshot, run_oracle, wait_past};
use support::*;

fn errno(e: FsError) -> i32 {
    e.errno()
}

fn ok<T>(r: Result<T, FsError>) -> Result<Outcome, i32> {
    r.map(|_| Outcome::Ok).map_err(errno)
}

fn run_client(c: &Client, top: &str, op: &Op) -> Outcome {
    let at = |p: &P| format!("{top}/{}", p.rel());
    let umask = |m: u32| m & !UMASK;
    let r: Result<Outcome, i32> = (|| match op {
        Op::Create(p, m) => {
            let flags = OpenFlags {
                write: true,
                create: true,
                excl: true,
                ..Default::default()
            };
            let fd = c.open(&at(p), flags, umask(*m)).map_err(errno)?;
            ok(c.close(fd))
        }
        Op::Mkdir(p, m) => ok(c.mkdir(&at(p), umask(*m))),
        Op::Unlink(p) => ok(c.unlink(&at(p))),
        Op::Rmdir(p) => ok(c.rmdir(&at(p))),
        Op::Rename(a, b) => ok(c.rename(&at(a), &at(b))),
        Op::Link(a, b) => ok(c.link(&at(a), &at(b))),
        Op::Symlink(t, p) => ok(c.symlink(&target(*t), &at(p))),
        Op::Readlink(p) => c.readlink(&at(p)).map(Outcome::Data).map_err(errno),
        Op::Write(p, off, len, seed) => {
            let flags = OpenFlags {
                write: true,
                ..Default::default()
            };
            let fd = c.open(&at(p), flags, 0).map_err(errno)?;
            let r = c.pwrite(fd, *off, &pattern(*len, *seed));
            c.close(fd).map_err(errno)?;
            r.map(|n| Outcome::Data(n.to_le_bytes().to_vec()))
                .map_err(errno)
        }
        Op::Read(p, off, len) => {
            let fd = c.open(&at(p), OpenFlags::read(), 0).map_err(errno)?;
            let r = c.pread(fd, *off, *len);
            c.close(fd).map_err(errno)?;
            r.map(Outcome::Data).map_err(errno)
        }
        Op::Truncate(p, size) => ok(c.truncate(&at(p), *size)),
        Op::Chmod(p, m) => ok(c.chmod(&at(p), *m)),
        Op::Chown(p, u, g) => ok(c.setattr_path(
            &at(p),
            &SetAttrReq {
                uid: Some(*u),
                gid: Some(*g),
                ..Default::default()
            },
        )),
        Op::Utimens(p, a, m) => ok(c.utimens(
            &at(p),
            Some(TimeSet::At(a * 1_000_000_000)),
            Some(TimeSet::At(m * 1_000_000_000)),
        )),
        Op::Fsync(p) => {
            let fd = c.open(&at(p), OpenFlags::read(), 0).map_err(errno)?;
            let r = c.fsync(fd);
            c.close(fd).map_err(errno)?;
            ok(r)
        }
        Op::Exchange(a, b) => ok(c.rename_with(&at(a), &at(b), RenameMode::Exchange)),
        Op::SetXattr(p, n, len, seed, flags) => {
            let mode = SetMode::from_flags(*flags).map_err(errno)?;
            ok(c.setxattr(&at(p), &xname(*n), &pattern(*len, *seed), mode))
        }
        Op::GetXattr(p, n) => c
            .getxattr(&at(p), &xname(*n))
            .map(Outcome::Data)
            .map_err(errno),
        Op::RemoveXattr(p, n) => ok(c.removexattr(&at(p), &xname(*n))),
        Op::ListXattr(p) => c
            .listxattr(&at(p))
            .map(|l| Outcome::Data(sorted_names(&l)))
            .map_err(errno),
        Op::Fallocate(p, mode, off, len) => {
            let flags = OpenFlags {
                write: true,
                ..Default::default()
            };
            let fd = c.open(&at(p), flags, 0).map_err(errno)?;
            let r = c.fallocate(fd, *mode, *off, *len);
            c.close(fd).map_err(errno)?;
            ok(r)
        }
    })();
    r.unwrap_or_else(Outcome::Err)
}

fn node(c: &Client, path: &str) -> Node {
    let a = c.lstat(path).unwrap();
    let (kind, content) = match a.ftype {
        FileType::Directory => ('d', vec![]),
        FileType::Symlink => ('l', c.readlink(path).unwrap()),
        FileType::Regular => {
            let fd = c.open(path, OpenFlags::read(), 0).unwrap();
            let b = c.pread(fd, 0, a.size as usize).unwrap();
            c.close(fd).unwrap();
            ('f', b)
        }
        _ => ('o', vec![]),
    };
    Node {
        kind,
        perm: a.mode,
        uid: a.uid,
        gid: a.gid,
        nlink: a.nlink,
        size: if kind == 'd' { 0 } else { a.size },
        xattrs: if kind == 'f' || kind == 'd' {
            xattr_pairs(&c.listxattr(path).unwrap(), |n| {
                c.getxattr(path, n).unwrap()
            })
        } else {
            Vec::new()
        },
        content,
        mtime: a.mtime,
        ctime: a.ctime,
    }
}

fn client_snapshot(c: &Client, top: &str) -> Snapshot {
    fn walk(c: &Client, dir: &str, rel: &str, out: &mut Snapshot) {
        for e in c.readdir(dir).unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let name = String::from_utf8_lossy(&e.name).into_owned();
            let path = format!("{dir}/{name}");
            let key = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let n = node(c, &path);
            let is_dir = n.kind == 'd';
            out.insert(key.clone(), n);
            if is_dir {
                walk(c, &path, &key, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(c, top, "", &mut out);
    out.insert(".".into(), node(c, top));
    out
}

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
