//! Hand-over names (`client/src/fs/handover.rs`), between the client that holds a
//! file (the preload library's) and another client of the cluster (the mount's):
//! a name opens the file it names, unlinked or not, for as long as it is good, and
//! nothing else.

use std::time::{SystemTime, UNIX_EPOCH};

use orion_client::{FsError, OpenFlags};
use orion_sim::{free_inodes, wait_free_inodes, ClientKind, Cluster, ClusterConfig};

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[test]
fn a_handover_name_opens_its_file_while_good_and_nothing_else() {
    let mut cluster = Cluster::start(ClusterConfig {
        seed: 7,
        ..Default::default()
    })
    .unwrap();
    let holder = cluster.client(ClientKind::EXTERNAL).unwrap();
    let mount = cluster.client(ClientKind::EXTERNAL).unwrap();
    let before = free_inodes(&mount);
    let rw = OpenFlags {
        read: true,
        write: true,
        ..Default::default()
    };
    let fd = holder
        .open("/f", OpenFlags { create: true, ..rw }, 0o600)
        .unwrap();
    holder.pwrite(fd, 0, b"handed over").unwrap();
    holder.unlink("/f").unwrap();
    let name = holder.handover_name(fd).unwrap();

    // Not hand-over names: looked up as any name.
    assert!(mount.handover_target(b"f").is_none());
    assert!(mount
        .handover_target(b".orion-handover.4242.17.3")
        .is_none());
    let mut bent = name.clone();
    let last = bent.last_mut().unwrap();
    *last = if *last == b'0' { b'1' } else { b'0' };
    assert!(mount.handover_target(&bent).is_none(), "a changed tag");
    let other = Cluster::start(ClusterConfig {
        seed: 8,
        ..Default::default()
    })
    .unwrap();
    let stranger = other.client(ClientKind::EXTERNAL).unwrap();
    assert!(
        stranger.handover_target(&name).is_none(),
        "another cluster's secret"
    );
    drop(stranger);
    let mut other = other;
    other.stop().unwrap();

    // An expired name: refused.
    let old = holder.handover_name_until(fd, now() - 1).unwrap();
    assert!(matches!(
        mount.handover_target(&old),
        Some(Err(FsError::Errno(libc::ENOENT)))
    ));

    // A good one: the unlinked file, held until the open that follows.
    let a = mount.handover_target(&name).unwrap().unwrap();
    assert_eq!((a.nlink, a.size), (0, 11));
    let m = mount.open_ino(a.ino, rw).unwrap();
    assert_eq!(mount.pread(m, 0, 64).unwrap(), b"handed over");
    mount.pwrite(m, 0, b"H").unwrap();
    assert_eq!(holder.pread(fd, 0, 1).unwrap(), b"H");
    holder.close(fd).unwrap();
    // The mount's descriptor keeps the file; its close lets it go (the lookup's
    // hold went with the open: one left would keep the file).
    assert_eq!(mount.pread(m, 0, 64).unwrap(), b"Handed over");
    mount.close(m).unwrap();
    wait_free_inodes(&mount, before);
    // The name of a file that is gone opens nothing.
    assert!(matches!(mount.handover_target(&name), Some(Err(_))));
    drop((holder, mount));
    cluster.stop().unwrap();
}
