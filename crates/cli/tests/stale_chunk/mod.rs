//! The stale-chunk scenario, shared by the process tests (`mds_mirror.rs`, a primary
//! stopped with SIGSTOP) and the cluster simulator (`sim/tests/partition.rs`, a
//! primary cut off): a client of the old primary holds a chunk that primary granted;
//! the new primary, which never knew the grant, may hand the same pages to its own
//! clients; the old client's next write must not land in them.

use orion_client::{Client, OpenFlags};

pub fn put(c: &Client, path: &str, data: &[u8]) {
    let fd = c.open(path, OpenFlags::create(), 0o644).unwrap();
    c.pwrite(fd, 0, data)
        .unwrap_or_else(|e| panic!("writing {path}: {e}"));
    c.close(fd).unwrap();
}

pub fn read(c: &Client, path: &str) -> Vec<u8> {
    let fd = c.open(path, OpenFlags::read(), 0).unwrap();
    let b = c.pread(fd, 0, 1 << 20).unwrap();
    c.close(fd).unwrap();
    b
}

fn page(fill: u8) -> Vec<u8> {
    vec![fill; 4096]
}

/// `stale` (one lane, a large chunk) writes `/first` and opens `/late`; `depose`
/// takes the role from its primary and returns a client of the new one, which
/// writes `/b0` to `/b15`; `stale` writes `/late`; `restore` lets the old primary
/// run again. Then every file holds what its writer wrote. `cluster` is what the
/// two act on.
pub fn stale_client_overwrites_nothing<C>(
    cluster: &mut C,
    stale: &Client,
    depose: impl FnOnce(&mut C) -> Client,
    restore: impl FnOnce(&mut C),
) {
    put(stale, "/first", &page(1));
    let rw = OpenFlags {
        read: true,
        write: true,
        create: true,
        ..Default::default()
    };
    let fd = stale.open("/late", rw, 0o644).unwrap();
    let fresh = depose(cluster);
    for i in 0..16u8 {
        put(&fresh, &format!("/b{i}"), &page(0x10 + i));
    }
    stale
        .pwrite(fd, 0, &page(0xee))
        .unwrap_or_else(|e| panic!("the stale client's write: {e}"));
    stale.close(fd).unwrap();
    restore(cluster);
    for i in 0..16u8 {
        let intact = read(&fresh, &format!("/b{i}")) == page(0x10 + i);
        assert!(
            intact,
            "/b{i} was overwritten by the client of the old primary"
        );
    }
    assert!(read(&fresh, "/late") == page(0xee), "/late");
    assert!(read(&fresh, "/first") == page(1), "/first");
}
