//! The kernel's references to files through the mount, and Orion's reuse of inode
//! numbers. A file handle (`name_to_handle_at`, `open_by_handle_at`: what an NFS
//! server exports) is a FUSE file's inode number and the generation the mount
//! answered its lookup with, so a file that gets a removed file's number must get
//! another generation too, or the removed file's handle opens the new file. And a
//! reference that outlives its directory (a working directory, an `O_PATH`
//! descriptor) must not reach the later directory that took its number; it still
//! gets what a local file system gives it: a directory with no links, listed as
//! empty.

mod cluster;

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use cluster::Cluster;
use orion_client::{Client, OpenFlags};

/// A cluster, its mount, and a client of the cluster beside the mount, once the
/// MDS destroys what is removed (a new MDS keeps removed files and directories until
/// the clients its pool names as holders come back; a new pool names none), since
/// the tests cycle through every free inode number.
fn mounted() -> (Cluster, cluster::Mount, Client) {
    // An 8 MiB MDS pool: 8,190 inode numbers to go round.
    let cluster = Cluster::start_with_mds("local", 1, &["--pool-size", "8M"]);
    let m = cluster.mount("a", &[]);
    let client = cluster.client(true, false);
    let free = || client.statfs().unwrap().ffree;
    let before = free();
    client.mkdir("/grace", 0o755).unwrap();
    client.rmdir("/grace").unwrap();
    let t0 = std::time::Instant::now();
    while free() != before {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "the MDS kept /grace"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    (cluster, m, client)
}

/// An `O_PATH` descriptor of `path`: a kernel reference that holds no open.
fn reference(path: &Path) -> File {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)
        .unwrap()
}

/// Free inode numbers are taken first in, first out: new files from `make` go
/// through them (the cluster's 8 MiB MDS pool has 8,190) until one gets `ino`,
/// and stays; the others are removed by `remove`.
fn take_number(ino: u64, make: impl Fn() -> u64, remove: impl Fn()) {
    for _ in 0..3 * 8192 {
        if make() == ino {
            return;
        }
        remove();
    }
    panic!("no new file got inode {ino}");
}

/// Words a handle may take after its header (FUSE's take 3 or 6).
const HANDLE_WORDS: usize = 32;

/// A `struct file_handle`: its byte count and type, then the bytes, in words so
/// that the header is aligned as the kernel's structure is.
#[derive(Clone, PartialEq, Eq, Debug)]
struct Handle(Vec<u32>);

impl Handle {
    fn of(path: &Path) -> Handle {
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        let mut h = vec![0u32; 2 + HANDLE_WORDS];
        h[0] = (HANDLE_WORDS * 4) as u32;
        let mut mount_id = 0;
        // SAFETY: `c` is NUL-terminated; `h` is a file_handle header (u32 bytes, i32
        // type) followed by room for the byte count it gives.
        let r = unsafe {
            libc::name_to_handle_at(
                libc::AT_FDCWD,
                c.as_ptr(),
                h.as_mut_ptr().cast::<libc::file_handle>(),
                &mut mount_id,
                0,
            )
        };
        assert_eq!(r, 0, "name_to_handle_at {}: {}", path.display(), errno());
        h.truncate(2 + (h[0] as usize).div_ceil(4));
        Handle(h)
    }

    /// The file the handle names, opened for reading through the mount of `dir`.
    fn open(&self, dir: &File) -> Result<File, i32> {
        let mut h = self.0.clone();
        // SAFETY: `h` is a handle name_to_handle_at filled; `dir` is open.
        let fd = unsafe {
            libc::open_by_handle_at(
                dir.as_raw_fd(),
                h.as_mut_ptr().cast::<libc::file_handle>(),
                libc::O_RDONLY,
            )
        };
        match fd {
            // SAFETY: a descriptor open_by_handle_at just opened, owned by nothing else.
            fd if fd >= 0 => Ok(unsafe { File::from_raw_fd(fd) }),
            _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)),
        }
    }
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// A removed file's handle does not open the file that reuses its inode number: it
/// fails with ESTALE, as on a local file system, while the new file's handle opens
/// the new file. With the generation 0 the mount used to answer, both handles were
/// the same bytes and the old one opened the new file.
#[test]
fn a_removed_files_handle_does_not_open_the_file_that_reuses_its_inode_number() {
    let (_cluster, m, client) = mounted();
    let (old_path, new_path) = (m.path.join("old"), m.path.join("new"));
    std::fs::write(&old_path, b"the old file").unwrap();
    let ino = std::fs::metadata(&old_path).unwrap().ino();
    let old = Handle::of(&old_path);
    std::fs::remove_file(&old_path).unwrap();
    let make = || {
        let fd = client.open("/new", OpenFlags::create(), 0o644).unwrap();
        let got = client.fstat(fd).unwrap().ino;
        client.close(fd).unwrap();
        got
    };
    take_number(ino, make, || client.unlink("/new").unwrap());
    std::fs::write(&new_path, b"the new file").unwrap();
    assert_eq!(std::fs::metadata(&new_path).unwrap().ino(), ino);
    let new = Handle::of(&new_path);
    assert_eq!(old.0[1], new.0[1], "the handles' types");
    assert_eq!(old.0[2..4], new.0[2..4], "the inode numbers in the handles");
    assert_ne!(old, new, "one handle for two files");
    let dir = File::open(&m.path).unwrap();
    assert_eq!(old.open(&dir).err(), Some(libc::ESTALE));
    let mut text = String::new();
    new.open(&dir)
        .expect("the new file's handle")
        .read_to_string(&mut text)
        .unwrap();
    assert_eq!(text, "the new file");
}

/// Calls through a kernel reference to a directory another client removed fail
/// with ESTALE once a later directory has its number: they create nothing in the
/// later directory and find none of its names. The reference here is an `O_PATH`
/// descriptor; a working directory is the same to the kernel, and neither holds
/// the directory open at the MDS. Without the mount's check, the create through
/// the old reference landed in the later directory.
#[test]
fn a_removed_directorys_reference_reaches_no_later_directory_with_its_number() {
    let (_cluster, m, client) = mounted();
    std::fs::create_dir(m.path.join("gone")).unwrap();
    let held = reference(&m.path.join("gone"));
    let ino = held.metadata().unwrap().ino();
    client.rmdir("/gone").unwrap();
    let make = || {
        client.mkdir("/later", 0o755).unwrap();
        client.stat("/later").unwrap().ino
    };
    take_number(ino, make, || client.rmdir("/later").unwrap());
    client.mkdir("/later/inside", 0o755).unwrap();
    let at = |name: &std::ffi::CStr, f: &dyn Fn(i32, *const libc::c_char) -> i32| {
        let r = f(held.as_raw_fd(), name.as_ptr());
        (r >= 0, std::io::Error::last_os_error().raw_os_error())
    };
    let created = at(c"x", &|d, n| {
        // SAFETY: openat on an open descriptor and a NUL-terminated name (a
        // descriptor it returned would only leak until the test's end).
        unsafe { libc::openat(d, n, libc::O_CREAT | libc::O_WRONLY, 0o644) }
    });
    assert_eq!(created, (false, Some(libc::ESTALE)), "openat(O_CREAT)");
    // SAFETY: mkdirat on an open descriptor and a NUL-terminated name.
    let made = at(c"y", &|d, n| unsafe { libc::mkdirat(d, n, 0o755) });
    assert_eq!(made, (false, Some(libc::ESTALE)), "mkdirat");
    let found = at(c"inside", &|d, n| {
        // SAFETY: fstatat into a stat buffer of its own.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            libc::fstatat(d, n, &mut st, 0)
        }
    });
    assert_eq!(
        found,
        (false, Some(libc::ESTALE)),
        "fstatat of a later name"
    );
    let names: Vec<Vec<u8>> = (client.readdir("/later").unwrap().into_iter())
        .map(|e| e.name)
        .filter(|n| n != b"." && n != b"..")
        .collect();
    assert_eq!(
        names,
        vec![b"inside".to_vec()],
        "the later directory's names"
    );
    let gone = held.metadata().expect("fstat of the removed directory");
    assert_eq!(
        (gone.ino(), gone.nlink(), gone.is_dir()),
        (ino, 0, true),
        "fstat after its number was taken"
    );
}

/// A working directory removed through the mount, or by another client, stays a
/// directory with no links that lists as empty and takes no new names, as Linux
/// keeps a removed directory for its last reference. Both used to fail every call
/// with ENOENT, `stat .` and `ls .` included.
#[test]
fn a_removed_working_directory_is_an_empty_directory_with_no_links() {
    let (_cluster, m, client) = mounted();
    std::fs::create_dir(m.path.join("here")).unwrap();
    let script = r#"rmdir "$PWD" && stat -c '%h %F' . && ls -a . && ls -d .. &&
        if mkdir x 2>/dev/null; then echo made; fi"#;
    let out = std::process::Command::new("sh")
        .current_dir(m.path.join("here"))
        .args(["-c", script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.is_empty(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0 directory\n..\n");

    std::fs::create_dir(m.path.join("there")).unwrap();
    let held = reference(&m.path.join("there"));
    let before = held.metadata().unwrap();
    client.rmdir("/there").unwrap();
    let after = held
        .metadata()
        .expect("fstat of the directory removed elsewhere");
    assert_eq!(
        (after.ino(), after.nlink(), after.mode(), after.is_dir()),
        (before.ino(), 0, before.mode(), true)
    );
    let by_fd = format!("/proc/self/fd/{}", held.as_raw_fd());
    let listed = std::fs::read_dir(&by_fd).expect("opendir of the removed directory");
    assert_eq!(listed.count(), 0, "its listing");
    let made = std::fs::create_dir(Path::new(&by_fd).join("x"));
    assert_eq!(made.unwrap_err().raw_os_error(), Some(libc::ENOENT));
    assert!(client.stat("/x").is_err() && client.stat("/there").is_err());
}

/// The same for a file: a chmod and an open for writing through an `O_PATH`
/// descriptor of a file another client removed fail with ESTALE once a later
/// file has its number, and the later file stays as it was.
#[test]
fn a_removed_files_reference_changes_no_later_file_with_its_number() {
    use std::os::unix::fs::PermissionsExt;
    let (_cluster, m, client) = mounted();
    std::fs::write(m.path.join("gone"), b"the removed file").unwrap();
    let held = reference(&m.path.join("gone"));
    let ino = held.metadata().unwrap().ino();
    client.unlink("/gone").unwrap();
    let make = || {
        let fd = client.open("/later", OpenFlags::create(), 0o644).unwrap();
        client.pwrite(fd, 0, b"later bytes").unwrap();
        let got = client.fstat(fd).unwrap().ino;
        client.close(fd).unwrap();
        got
    };
    take_number(ino, make, || client.unlink("/later").unwrap());
    let by_fd = format!("/proc/self/fd/{}", held.as_raw_fd());
    let chmod = std::fs::set_permissions(&by_fd, std::fs::Permissions::from_mode(0o600));
    assert_eq!(
        chmod.unwrap_err().raw_os_error(),
        Some(libc::ESTALE),
        "chmod"
    );
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&by_fd);
    assert_eq!(
        opened.unwrap_err().raw_os_error(),
        Some(libc::ESTALE),
        "open"
    );
    let later = client.stat("/later").unwrap();
    assert_eq!(
        (later.mode & 0o777, later.size),
        (0o644, 11),
        "the later file"
    );
}
