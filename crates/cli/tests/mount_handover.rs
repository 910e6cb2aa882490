//! Hand-over names (`client/src/fs/handover.rs`): how the preload library has the
//! mount open a file it holds and has no path to.

mod cluster;

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;

use cluster::{errno_of, eventually, Cluster};

/// A hand-over name (`client/src/fs/handover.rs`) opens through the mount the file a
/// client holds open, after its last name is gone; the name is never listed and the
/// root's times do not change; a name with a changed tag opens nothing, nor does
/// the name once the file is gone.
#[test]
fn a_handover_name_opens_the_held_file_and_nothing_else() {
    let cluster = Cluster::start("local", 1);
    let m = cluster.mount("a", &[]);
    let client =
        orion_client::Client::connect(cluster.client_config(true, false), cluster.fabric())
            .expect("a client of the cluster");
    client.mkdir("/d", 0o700).unwrap();
    let fd = client
        .open(
            "/d/held",
            orion_client::OpenFlags {
                read: true,
                ..orion_client::OpenFlags::create()
            },
            0o600,
        )
        .unwrap();
    client.pwrite(fd, 0, b"held bytes").unwrap();
    client.unlink("/d/held").unwrap();
    let name = client.handover_name(fd).unwrap();
    let path = m.path.join(std::ffi::OsStr::from_bytes(&name));
    let root_mtime = || std::fs::metadata(&m.path).unwrap().modified().unwrap();
    let before = root_mtime();
    assert_eq!(std::fs::read(&path).unwrap(), b"held bytes");
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(b"HELD", 0).unwrap();
    drop(f);
    assert_eq!(client.pread(fd, 0, 10).unwrap(), b"HELD bytes");
    let listed: Vec<_> = std::fs::read_dir(&m.path)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.as_bytes().starts_with(b".orion-handover"))
        .collect();
    assert!(listed.is_empty(), "listed: {listed:?}");
    assert_eq!(root_mtime(), before, "the root's times stay");
    // One hex digit of the tag changed.
    let mut forged = name.clone();
    let last = forged.last_mut().unwrap();
    *last = if *last == b'0' { b'1' } else { b'0' };
    let forged = m.path.join(std::ffi::OsStr::from_bytes(&forged));
    assert_eq!(errno_of(std::fs::read(&forged)), libc::ENOENT);
    assert_eq!(
        errno_of(std::fs::read(m.path.join(".orion-handover.1.0.x"))),
        libc::ENOENT
    );
    let ino = client.fstat(fd).unwrap().ino;
    client.close(fd).unwrap();
    // The unlinked file goes once closed (the MDS's sweep): every hold the mount's
    // lookups took went with its opens (one left would keep the file), and the name
    // opens nothing after.
    eventually("the closed, unlinked file is destroyed", || {
        client.getattr(ino).is_err()
    });
    assert_eq!(errno_of(std::fs::read(&path)), libc::ENOENT);
}
