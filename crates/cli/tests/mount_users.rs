//! Who may do what through the mount: the file system's own permission checks, the
//! setid bits an unprivileged write drops, a mount made by an ordinary user, and an
//! open file that outlives its last name.

mod cluster;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use cluster::{as_nobody, is_mounted, Cluster};

/// The file system's own permission checks, with the kernel's turned off: each
/// refusal and each grant below comes from `OrionFs`.
#[test]
fn permissions_checked_by_the_file_system_alone() {
    let cluster = Cluster::start("local", 1);
    std::fs::set_permissions(cluster.dir.path(), PermissionsExt::from_mode(0o755)).unwrap();
    let m = cluster.mount("m", &["--no-kernel-permissions"]);
    let p = |s: &str| m.path.join(s);
    let mode = |s: &str, m: u32| std::fs::set_permissions(p(s), PermissionsExt::from_mode(m));
    std::fs::create_dir(p("ro")).unwrap();
    std::fs::write(p("ro/f"), b"public").unwrap();
    std::fs::write(p("ro/secret"), b"s").unwrap();
    mode("ro/secret", 0o600).unwrap();
    std::fs::write(p("ro/tool"), b"#!/bin/sh\necho ran\n").unwrap();
    mode("ro/tool", 0o700).unwrap();
    std::fs::write(p("ro/open"), b"").unwrap();
    mode("ro/open", 0o666).unwrap();
    std::fs::create_dir(p("closed")).unwrap();
    mode("closed", 0o700).unwrap();
    std::fs::write(p("ro/team"), b"team").unwrap();
    mode("ro/team", 0o640).unwrap();
    std::os::unix::fs::chown(p("ro/team"), None, Some(1000)).unwrap();
    std::fs::create_dir(p("tmp")).unwrap();
    mode("tmp", 0o1777).unwrap();
    std::fs::write(p("tmp/roots"), b"r").unwrap();
    let denied = |script: &str, why: &str| {
        let (ok, err) = as_nobody(&m.path, script);
        assert!(!ok && err.contains(why), "{script}: {err}");
    };
    denied("echo x > ro/new", "Permission denied");
    denied("echo x >> ro/f", "Permission denied");
    denied("cat ro/secret", "Permission denied");
    denied("./ro/tool", "Permission denied");
    denied("ls closed", "Permission denied");
    denied("cd closed", "can't cd");
    denied("mkdir ro/d", "Permission denied");
    denied("rm ro/f", "Permission denied");
    denied("mv ro/f ro/g", "Permission denied");
    denied("ln ro/f tmp/hard && ln -s x ro/sym", "Permission denied");
    denied("chmod 777 ro/f", "Operation not permitted");
    denied("chown nobody ro/f", "Operation not permitted");
    denied("touch -d 2001-01-01 ro/open", "Operation not permitted");
    denied("truncate -s 0 ro/f", "Permission denied");
    denied("rm -f tmp/roots", "Operation not permitted");
    denied("setfattr -n user.x -v 1 ro/f", "Permission denied");
    denied("setfattr -n trusted.x -v 1 tmp", "Operation not permitted");
    denied("cat ro/team", "Permission denied");
    for ok in [
        "cat ro/f",
        "touch ro/open",
        "echo more >> ro/open",
        "echo n > tmp/mine && mv tmp/mine tmp/moved && rm tmp/moved",
        "mkdir tmp/d && setfattr -n user.k -v v tmp/d && getfattr -n user.k tmp/d",
    ] {
        let (ran, err) = as_nobody(&m.path, ok);
        assert!(ran, "{ok}: {err}");
    }
    // A supplementary group of the caller opens the group class.
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--groups=1000", "cat"])
        .arg(p("ro/team"))
        .output()
        .unwrap();
    assert_eq!(o.stdout, b"team", "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read(p("tmp/roots")).unwrap(), b"r");
    assert_eq!(std::fs::read(p("ro/f")).unwrap(), b"public");
}

/// A file opened (not created) and then unlinked stays usable through its descriptor
/// until the last close: fstat says it has no link, reads and writes work; then the
/// MDS frees its inode.
#[test]
fn an_open_file_outlives_its_last_name() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let cluster = Cluster::start("local", 1);
    let m = cluster.mount("m", &[]);
    let p = |s: &str| m.path.join(s);
    let free_inodes = || {
        let c = std::ffi::CString::new(m.path.as_os_str().as_encoded_bytes()).unwrap();
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid C string and a zeroed statvfs to fill.
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        st.f_ffree
    };
    std::fs::write(p("ro"), b"kept").unwrap();
    std::fs::write(p("rw"), b"abc").unwrap();
    let before = free_inodes();
    let ro = std::fs::File::open(p("ro")).unwrap();
    let rw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p("rw"))
        .unwrap();
    std::fs::remove_file(p("ro")).unwrap();
    std::fs::remove_file(p("rw")).unwrap();
    assert!(!p("ro").exists() && !p("rw").exists());
    assert_eq!(ro.metadata().unwrap().nlink(), 0);
    let mut buf = [0u8; 4];
    assert_eq!(ro.read_at(&mut buf, 0).unwrap(), 4);
    assert_eq!(&buf, b"kept");
    rw.write_all_at(b"XY", 1).unwrap();
    let mut buf = [0u8; 3];
    rw.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"aXY");
    assert_eq!(rw.metadata().unwrap().nlink(), 0);
    assert_eq!(free_inodes(), before, "the inodes are still held");
    drop((ro, rw));
    // The last close frees them (the kernel sends the release a moment after).
    let t0 = std::time::Instant::now();
    while free_inodes() != before + 2 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(5),
            "the inodes stayed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A directory opened through one mount and removed through another stays for its
/// holder, as on Linux: fstat says it has no link and listing it says ENOENT (a
/// dead directory); the close frees its inode.
#[test]
fn an_open_directory_outlives_its_removal_elsewhere() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let cluster = Cluster::start("local", 1);
    let (a, b) = (cluster.mount("a", &[]), cluster.mount("b", &[]));
    std::fs::create_dir(a.path.join("d")).unwrap();
    let d = std::fs::File::open(a.path.join("d")).unwrap();
    let ino = d.metadata().unwrap().ino();
    std::fs::remove_dir(b.path.join("d")).unwrap();
    let st = d.metadata().unwrap();
    assert_eq!((st.nlink(), st.ino()), (0, ino), "held through its removal");
    let mut buf = [0u8; 4096];
    // SAFETY: an open descriptor and a buffer of the length given.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            d.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    let err = std::io::Error::last_os_error().raw_os_error();
    assert_eq!(
        (n, err),
        (-1, Some(libc::ENOENT)),
        "listing a dead directory"
    );
    let statfs = |m: &std::path::Path| {
        let c = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()).unwrap();
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid C string and a zeroed statvfs to fill.
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        st.f_ffree
    };
    let held = statfs(&b.path);
    drop(d);
    let t0 = std::time::Instant::now();
    while statfs(&b.path) != held + 1 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(5),
            "the inode stayed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A write or truncation by a process without CAP_FSETID drops the file's setuid bit,
/// and its setgid bit when group-execute is set, as on Linux's own file systems: an
/// unprivileged writer cannot plant code in a setuid program. Root's writes keep them.
#[test]
fn a_write_by_an_unprivileged_user_drops_setuid_and_setgid() {
    let cluster = Cluster::start("local", 1);
    std::fs::set_permissions(cluster.dir.path(), PermissionsExt::from_mode(0o755)).unwrap();
    let m = cluster.mount("m", &[]);
    let p = |s: &str| m.path.join(s);
    let mode = |s: &str| std::fs::metadata(p(s)).unwrap().permissions().mode() & 0o7777;
    for (name, bits) in [
        ("suid", 0o4777),
        ("sgid", 0o2777),
        ("sgid-no-gx", 0o2747),
        ("cut", 0o6777),
        ("roots", 0o4777),
    ] {
        std::fs::write(p(name), b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(p(name), PermissionsExt::from_mode(bits)).unwrap();
    }
    for script in [
        "printf x >> suid",
        "printf x >> sgid",
        "printf x >> sgid-no-gx",
        "truncate -s 1 cut",
    ] {
        let (ok, err) = as_nobody(&m.path, script);
        assert!(ok, "{script}: {err}");
    }
    assert_eq!(mode("suid"), 0o777);
    assert_eq!(mode("sgid"), 0o777);
    assert_eq!(
        mode("sgid-no-gx"),
        0o2747,
        "setgid without group-execute stays"
    );
    assert_eq!(mode("cut"), 0o777);
    assert_eq!(std::fs::metadata(p("cut")).unwrap().len(), 1);
    assert_eq!(std::fs::read(p("suid")).unwrap(), b"#!/bin/sh\nx");
    // Root has CAP_FSETID: its writes keep the bits.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(p("roots"))
        .unwrap();
    std::io::Write::write_all(&mut f, b"y").unwrap();
    drop(f);
    assert_eq!(mode("roots"), 0o4777);
    // Another user still may not chmod.
    let (ok, err) = as_nobody(&m.path, "chmod 777 sgid-no-gx");
    assert!(!ok && err.contains("Operation not permitted"), "{err}");
}

/// An ordinary user mounts (fusermount3, allow_other through fuse.conf's
/// user_allow_other), and another user works in it with their own identity. The
/// local backend shares memory files among one user's processes, so this cluster
/// runs on libfabric's tcp provider, where a user with the secret may connect.
#[test]
fn an_unprivileged_user_mounts_and_others_use_it() {
    let cluster = Cluster::start("libfabric", 1);
    std::fs::set_permissions(cluster.dir.path(), PermissionsExt::from_mode(0o755)).unwrap();
    let m = cluster
        .mount_as("user-mount", 65534)
        .unwrap_or_else(|e| panic!("{e}"));
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == m.path.to_str())
        .expect("mounted");
    assert!(line.contains("user_id=65534"), "{line}");
    // Root (another user than the mounter) gets in thanks to allow_other.
    std::fs::create_dir(m.path.join("by-root")).unwrap();
    std::fs::write(m.path.join("by-root/f"), b"root's").unwrap();
    let (ok, err) = as_nobody(&m.path, "echo x > by-root/g");
    assert!(!ok && err.contains("Permission denied"), "{err}");
    std::fs::create_dir(m.path.join("shared")).unwrap();
    std::fs::set_permissions(m.path.join("shared"), PermissionsExt::from_mode(0o1777)).unwrap();
    let (ok, err) = as_nobody(
        &m.path,
        "mkdir shared/mine && echo hi > shared/mine/f && cat by-root/f",
    );
    assert!(ok, "{err}");
    let md = std::fs::metadata(m.path.join("shared/mine/f")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&md), 65534);
    let path = m.path.clone();
    drop(m);
    assert!(!is_mounted(&path), "SIGTERM unmounts a user's mount too");
}
