//! Calls that add or remove a name, on a path whose last name is "." or "..": such
//! a path names a directory, not a name in one, and Linux refuses each call with
//! its own errno (after the walk's errors). The client must too: a walk that drops
//! the "." would act on the directory itself (`rmdir("d/.")` removing `d`). Each
//! call runs on a directory of the host (tmpfs) and through a client; the errnos
//! must be the same, and nothing may change.

use std::ffi::CString;

use orion_client::{OpenFlags, RenameMode};
use orion_sim::{ClientKind, Cluster, ClusterConfig};

/// The errno of a host call (0: it succeeded).
fn host(r: i32) -> i32 {
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

fn client<T>(r: orion_client::FsResult<T>) -> i32 {
    r.map_or_else(|e| e.errno(), |_| 0)
}

#[test]
fn dot_and_dotdot_last_names_get_linuxs_errnos_and_change_nothing() {
    let mut cluster = Cluster::start(ClusterConfig::default()).unwrap();
    let c = cluster.client(ClientKind::EXTERNAL).unwrap();
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let root = tmp.path().display().to_string();
    for dir in ["/d", "/d/sub", "/e"] {
        std::fs::create_dir(format!("{root}{dir}")).unwrap();
        c.mkdir(dir, 0o755).unwrap();
    }
    std::fs::write(format!("{root}/f"), b"f").unwrap();
    let fd = c.open("/f", OpenFlags::create(), 0o644).unwrap();
    c.close(fd).unwrap();
    let on_host = |p: &str| CString::new(format!("{root}{p}")).unwrap();
    type Call<'a> = (
        &'a str,
        Box<dyn Fn() -> i32 + 'a>,
        Box<dyn Fn() -> i32 + 'a>,
    );
    let calls: Vec<Call> = vec![
        (
            "rmdir d/.",
            // SAFETY: NUL-terminated paths we own, for each host call below.
            Box::new(|| host(unsafe { libc::rmdir(on_host("/d/.").as_ptr()) })),
            Box::new(|| client(c.rmdir("/d/."))),
        ),
        (
            "rmdir d/..",
            Box::new(|| host(unsafe { libc::rmdir(on_host("/d/sub/..").as_ptr()) })),
            Box::new(|| client(c.rmdir("/d/sub/.."))),
        ),
        (
            "rmdir nothing/.",
            Box::new(|| host(unsafe { libc::rmdir(on_host("/nothing/.").as_ptr()) })),
            Box::new(|| client(c.rmdir("/nothing/."))),
        ),
        (
            "unlink d/.",
            Box::new(|| host(unsafe { libc::unlink(on_host("/d/.").as_ptr()) })),
            Box::new(|| client(c.unlink("/d/."))),
        ),
        (
            "mkdir d/..",
            Box::new(|| host(unsafe { libc::mkdir(on_host("/d/..").as_ptr(), 0o755) })),
            Box::new(|| client(c.mkdir("/d/..", 0o755))),
        ),
        (
            "symlink to d/.",
            Box::new(|| {
                let t = CString::new("x").unwrap();
                host(unsafe { libc::symlink(t.as_ptr(), on_host("/d/.").as_ptr()) })
            }),
            Box::new(|| client(c.symlink("x", "/d/."))),
        ),
        (
            "link f to d/.",
            Box::new(|| {
                host(unsafe { libc::link(on_host("/f").as_ptr(), on_host("/d/.").as_ptr()) })
            }),
            Box::new(|| client(c.link("/f", "/d/."))),
        ),
        (
            "rename d/. to x",
            Box::new(|| {
                host(unsafe { libc::rename(on_host("/d/.").as_ptr(), on_host("/x").as_ptr()) })
            }),
            Box::new(|| client(c.rename("/d/.", "/x"))),
        ),
        (
            "rename e to d/..",
            Box::new(|| {
                host(unsafe { libc::rename(on_host("/e").as_ptr(), on_host("/d/..").as_ptr()) })
            }),
            Box::new(|| client(c.rename_with("/e", "/d/..", RenameMode::Replace))),
        ),
    ];
    for (what, on_linux, on_orion) in &calls {
        let (want, got) = (on_linux(), on_orion());
        assert_ne!(want, 0, "{what}: Linux did it");
        assert_eq!(got, want, "{what}: Orion says errno {got}, Linux {want}");
    }
    // Nothing changed.
    let mut names: Vec<String> = c
        .readdir("/")
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    names.retain(|n| n != "." && n != "..");
    names.sort();
    assert_eq!(names, ["d", "e", "f"]);
    assert!(c.stat("/d/sub").is_ok());
    drop(calls);
    drop(c);
    cluster.stop().unwrap();
}
