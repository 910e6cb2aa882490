//! The POSIX mount (`orion mount`, FUSE) with real system calls and real programs,
//! each compared with the same run on tmpfs, and `orion up`.

mod cluster;
#[path = "../../meta/tests/support/mod.rs"]
mod support;

use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use cluster::{as_nobody, is_mounted, stat_with_daemon_stopped, with_daemon_stopped};
use cluster::{errno_of, eventually, Cluster, ORION};
use proptest::prelude::*;
use support::oracle::{oracle_snapshot, run_oracle, wait_past, OracleDir};
use support::*;

fn max_time(s: &Snapshot) -> i64 {
    s.values().map(|n| n.mtime.max(n.ctime)).max().unwrap_or(0)
}

static CASE: AtomicU64 = AtomicU64::new(0);

/// One sequence through two mounts of one cluster taking turns, against tmpfs; the
/// tree is read through the other mount after each step.
fn check_sequence(mounts: [&Path; 2], ops: Vec<OpT>) -> Result<(), TestCaseError> {
    let oracle = OracleDir::new();
    let root = oracle.path();
    std::fs::set_permissions(root, PermissionsExt::from_mode(0o755)).unwrap();
    let case = format!("case{}", CASE.fetch_add(1, Ordering::Relaxed));
    std::fs::create_dir(mounts[0].join(&case)).unwrap();
    let tops = [mounts[0].join(&case), mounts[1].join(&case)];
    for (i, op) in ops.iter().enumerate() {
        let (me, other) = (&tops[i % 2], &tops[(i + 1) % 2]);
        let ob = oracle_snapshot(root);
        let mb = oracle_snapshot(me);
        let op = &op.resolve(&ob);
        wait_past(max_time(&ob).max(max_time(&mb)));
        let o = run_oracle(root, op);
        let m = run_oracle(me, op);
        prop_assert_eq!(
            &m,
            &o,
            "result of op {} {:?} through mount {}",
            i,
            op,
            i % 2
        );
        let oa = oracle_snapshot(root);
        let ma = oracle_snapshot(other);
        if let Some(d) = diff_ignoring_times(&oa, &ma) {
            return Err(TestCaseError::fail(format!(
                "tree after op {i} {op:?}, seen through the other mount: tmpfs vs orion: {d}"
            )));
        }
        prop_assert_eq!(
            op_time_changes(op, &ob, &oa),
            op_time_changes(op, &mb, &ma),
            "mtime/ctime changes after op {} {:?}: tmpfs left, orion right",
            i,
            op
        );
    }
    Ok(())
}

#[test]
fn system_calls_through_two_mounts_match_tmpfs() {
    // SAFETY: umask only sets the process's file-creation mask.
    unsafe { libc::umask(UMASK as libc::mode_t) };
    let cluster = Cluster::start("local", 1);
    let a = cluster.mount("a", &[]);
    let b = cluster.mount("b", &["--external"]);
    run_property(
        "differential: system calls through two mounts vs tmpfs",
        32,
        prop::collection::vec(arb_op(), 1..60),
        |ops| check_sequence([&a.path, &b.path], ops),
    );
}

/// The same property as uid/gid 65534 with no supplementary groups, so that every
/// permission check of the mount (mode bits, sticky directories, chown, trusted.*
/// attributes) meets tmpfs's. The test runs itself again under `setpriv`: the
/// variable below tells the second run the mounts to use.
#[test]
fn system_calls_through_two_mounts_as_an_unprivileged_user_match_tmpfs() {
    const MOUNTS: &str = "ORION_TEST_UNPRIVILEGED_MOUNTS";
    // SAFETY: umask only sets the process's file-creation mask.
    unsafe { libc::umask(UMASK as libc::mode_t) };
    if let Ok(m) = std::env::var(MOUNTS) {
        // The unprivileged run.
        assert_ne!(
            unsafe { libc::getuid() },
            0,
            "{MOUNTS} is for the unprivileged run"
        );
        let (a, b) = m.split_once(':').expect("two mounts");
        run_property(
            "differential: unprivileged system calls through two mounts vs tmpfs",
            24,
            prop::collection::vec(arb_op(), 1..50),
            |ops| check_sequence([Path::new(a), Path::new(b)], ops),
        );
        return;
    }
    let cluster = Cluster::start("local", 1);
    std::fs::set_permissions(cluster.dir.path(), PermissionsExt::from_mode(0o755)).unwrap();
    let a = cluster.mount("a", &[]);
    let b = cluster.mount("b", &["--external"]);
    let top = a.path.join("unprivileged");
    std::fs::create_dir(&top).unwrap();
    std::os::unix::fs::chown(&top, Some(65534), Some(65534)).unwrap();
    let me = std::env::current_exe().unwrap();
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&me)
        .args([
            "--exact",
            "system_calls_through_two_mounts_as_an_unprivileged_user_match_tmpfs",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            MOUNTS,
            format!(
                "{}:{}",
                top.display(),
                b.path.join("unprivileged").display()
            ),
        )
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && out.contains("1 passed"),
        "the unprivileged run failed:\n{out}\n{err}"
    );
}

fn sh(dir: &Path, script: &str) -> String {
    let o = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "in {}: {script}\nstdout: {}\nstderr: {}",
        dir.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs the same script in a tmpfs directory and on the mount; both must succeed and
/// print the same.
fn same_on_both(mnt: &Path, script: &str) -> String {
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let here = mnt.join(format!("run{}", CASE.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir(&here).unwrap();
    let expect = sh(tmp.path(), script);
    let got = sh(&here, script);
    if got != expect {
        let at = got
            .lines()
            .zip(expect.lines())
            .position(|(g, e)| g != e)
            .unwrap_or(got.lines().count().min(expect.lines().count()));
        panic!(
            "output of {script:?} differs at line {at}: orion {:?}, tmpfs {:?} \
             ({} and {} lines)",
            got.lines().nth(at),
            expect.lines().nth(at),
            got.lines().count(),
            expect.lines().count()
        );
    }
    got
}

#[test]
fn real_programs_on_the_mount() {
    let cluster = Cluster::start_sized("local", 1, "512M");
    let m = cluster.mount("m", &[]);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // A source tree in and out of a tarball, compared byte for byte.
    let tarball = cluster.dir.path().join("src.tar");
    sh(
        &src,
        &format!(
            "git ls-files crates/meta crates/format Cargo.toml | tar -cf {} -T -",
            tarball.display()
        ),
    );
    let out = same_on_both(
        &m.path,
        &format!(
            "tar -xf {t} && tar -xf {t} && (find . -type d -printf '%M %p\\n'; \
             find . ! -type d -printf '%M %s %p\\n') | sort && find . -type f | sort | \
             xargs -d '\\n' cksum",
            t = tarball.display()
        ),
    );
    assert!(out.contains("crates/meta/src/lib.rs"));
    let extracted = m.path.join("x");
    std::fs::create_dir(&extracted).unwrap();
    sh(&extracted, &format!("tar -xf {}", tarball.display()));
    let reference = tempfile::tempdir_in("/dev/shm").unwrap();
    sh(reference.path(), &format!("tar -xf {}", tarball.display()));
    sh(
        &extracted,
        &format!(
            "diff -r {} crates/meta",
            reference.path().join("crates/meta").display()
        ),
    );
    // A C program built and run on the mount.
    same_on_both(
        &m.path,
        "printf '#include <stdio.h>\\nint main(void){int s=0;for(int i=0;i<100;i++)s+=i;\
         printf(\"%d\\\\n\",s);return 0;}\\n' > p.c && cc -O1 -o p p.c && ./p && ./p",
    );
    // SQLite with synchronous commits, rollback journal and WAL.
    for mode in ["delete", "wal"] {
        let script = format!(
            "sqlite3 db 'pragma journal_mode={mode}; pragma synchronous=full; \
             create table t(k integer primary key, v blob);' >/dev/null && \
             for i in $(seq 1 20); do sqlite3 db \"begin; insert into t(v) values \
             (zeroblob(3000)); insert into t(v) values (zeroblob(100)); \
             update t set v = zeroblob(50) where k % 3 = 0; delete from t where k % 7 = 0; \
             commit;\"; done && sqlite3 db 'pragma integrity_check; select count(*), \
             sum(length(v)) from t;'"
        );
        let out = same_on_both(&m.path, &script);
        assert!(out.starts_with("ok\n"), "{out}");
    }
    // fio random writes with verification of every block.
    let fio = sh(
        &m.path,
        "fio --name=v --filename=fio.dat --size=8m --bs=4k --rw=randwrite \
         --ioengine=psync --verify=crc32c --do_verify=1 --verify_fatal=1 --randseed=7 \
         --output-format=terse --minimal",
    );
    assert!(fio.starts_with("3;"), "fio: {fio}");
    // The same with O_DIRECT (every file is direct I/O already; the flag must work).
    let fio = sh(
        &m.path,
        "fio --name=d --filename=direct.dat --size=4m --bs=4k --rw=randwrite --direct=1 \
         --ioengine=psync --verify=crc32c --do_verify=1 --verify_fatal=1 --randseed=9 \
         --output-format=terse --minimal",
    );
    assert!(fio.starts_with("3;"), "fio O_DIRECT: {fio}");
}

#[test]
fn two_mounts_see_each_other_exactly() {
    let cluster = Cluster::start("local", 1);
    let a = cluster.mount("a", &[]);
    let b = cluster.mount("b", &["--external", "--weak"]);
    // Optimistic persistence: writes staged in the client reach the others at close.
    let c = cluster.mount("c", &["--optimistic"]);
    let mounts = [&a, &b, &c];
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for i in 0..30u64 {
        let len = (next() % (3 << 20)) as usize;
        let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let (w, r) = (mounts[i as usize % 3], mounts[(i as usize + 1) % 3]);
        let name = format!("f{i}");
        std::fs::write(w.path.join(&name), &data).unwrap();
        let back = std::fs::read(r.path.join(&name)).unwrap();
        assert!(back == data, "file {name} of {len} bytes differs");
        // Overwrite a range through the reader, read it through the writer.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(r.path.join(&name))
            .unwrap();
        let at = len as u64 / 3;
        std::os::unix::fs::FileExt::write_all_at(&f, b"overwritten", at).unwrap();
        drop(f);
        let back = std::fs::read(w.path.join(&name)).unwrap();
        let mut expect = data.clone();
        let end = (at as usize + 11).min(expect.len().max(at as usize + 11));
        expect.resize(expect.len().max(end), 0);
        expect[at as usize..at as usize + 11].copy_from_slice(b"overwritten");
        assert!(back == expect, "file {name} after the overwrite differs");
        // Single pages through the writer (the optimistic mount stages them), read
        // through the reader after the close.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(w.path.join(&name))
            .unwrap();
        for k in 0..3u64 {
            let page = vec![(i + k) as u8; 4096];
            std::os::unix::fs::FileExt::write_all_at(&f, &page, k * 8192).unwrap();
            let at = (k * 8192) as usize;
            expect.resize(expect.len().max(at + 4096), 0);
            expect[at..at + 4096].copy_from_slice(&page);
        }
        drop(f);
        let back = std::fs::read(r.path.join(&name)).unwrap();
        assert!(back == expect, "file {name} after the page writes differs");
    }
}

/// Runs `script` as uid/gid 65534 (nobody) and returns its exit status and stderr.
#[test]
fn errors_through_the_mount() {
    let cluster = Cluster::start_sized("local", 1, "16M");
    // Other users reach the mount point through the cluster's directory.
    std::fs::set_permissions(cluster.dir.path(), PermissionsExt::from_mode(0o755)).unwrap();
    let m = cluster.mount("m", &[]);
    let p = |s: &str| m.path.join(s);
    assert_eq!(errno_of(std::fs::metadata(p("missing"))), libc::ENOENT);
    std::fs::create_dir(p("d")).unwrap();
    assert_eq!(errno_of(std::fs::create_dir(p("d"))), libc::EEXIST);
    std::fs::write(p("d/f"), b"x").unwrap();
    assert_eq!(errno_of(std::fs::remove_dir(p("d"))), libc::ENOTEMPTY);
    assert_eq!(
        errno_of(std::fs::write(p(&"n".repeat(256)), b"x")),
        libc::ENAMETOOLONG
    );
    // Permissions for another user: a root-owned 0755 directory and 0644 file.
    std::fs::create_dir(p("root-only")).unwrap();
    std::fs::write(p("root-only/f"), b"secret").unwrap();
    let (ok, err) = as_nobody(&m.path, "echo x > root-only/new");
    assert!(!ok && err.contains("Permission denied"), "{err}");
    let (ok, err) = as_nobody(&m.path, "echo x >> root-only/f");
    assert!(!ok && err.contains("Permission denied"), "{err}");
    let (ok, _) = as_nobody(&m.path, "cat root-only/f");
    assert!(ok, "a 0644 file is readable by others");
    // A sticky world-writable directory: nobody may create, but not remove root's file.
    std::fs::create_dir(p("tmp")).unwrap();
    std::fs::set_permissions(p("tmp"), PermissionsExt::from_mode(0o1777)).unwrap();
    std::fs::write(p("tmp/roots"), b"r").unwrap();
    let (ok, err) = as_nobody(
        &m.path,
        "echo n > tmp/mine && rm tmp/mine && rm -f tmp/roots",
    );
    assert!(!ok && err.contains("Operation not permitted"), "{err}");
    assert!(p("tmp/roots").exists());
    // New files take the caller's uid and gid.
    let (ok, err) = as_nobody(&m.path, "echo n > tmp/nobodys");
    assert!(ok, "{err}");
    let md = std::fs::metadata(p("tmp/nobodys")).unwrap();
    assert_eq!(
        (
            std::os::unix::fs::MetadataExt::uid(&md),
            std::os::unix::fs::MetadataExt::gid(&md)
        ),
        (65534, 65534)
    );
    // Fill the 16 MiB store: ENOSPC, and the file system is consistent afterwards.
    let chunk = vec![0xA5u8; 1 << 20];
    let mut written = 0usize;
    let err = loop {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p("fill"))
            .unwrap();
        match f.write_all(&chunk) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 64, "a 16 MiB store took 64 MiB");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    let len = std::fs::metadata(p("fill")).unwrap().len() as usize;
    assert!(len >= written << 20, "acknowledged writes are all there");
    let back = std::fs::read(p("fill")).unwrap();
    assert!(
        back.iter().all(|&b| b == 0xA5),
        "the full file reads back intact"
    );
    assert_eq!(std::fs::read(p("root-only/f")).unwrap(), b"secret");
    std::fs::remove_file(p("fill")).unwrap();
    std::fs::write(p("after"), vec![1u8; 1 << 20]).unwrap();
    assert_eq!(std::fs::read(p("after")).unwrap().len(), 1 << 20);
}

/// An internal client whose own store is full goes on writing to the other store
/// (its pages then travel over the fabric): ENOSPC only when every store is full.
#[test]
fn a_full_local_store_spills_to_the_other_group() {
    let cluster = Cluster::start_sized("local", 2, "16M");
    let m = cluster.mount("m", &[]);
    let data: Vec<u8> = (0..24u32 << 20).map(|i| (i / 4093) as u8).collect();
    std::fs::write(m.path.join("big"), &data).unwrap();
    assert!(
        std::fs::read(m.path.join("big")).unwrap() == data,
        "24 MiB over two 16 MiB stores"
    );
}

#[test]
fn a_killed_mount_is_cleaned_up_and_mounts_again() {
    let cluster = Cluster::start("local", 1);
    let mut m = cluster.mount("m", &[]);
    std::fs::write(m.path.join("kept"), b"still here").unwrap();
    m.daemon.kill();
    assert_eq!(
        errno_of(std::fs::metadata(m.path.join("kept"))),
        libc::ENOTCONN,
        "a mount whose server died"
    );
    // `orion mount` cleans the stale mount up by itself.
    let again = cluster.mount("m", &[]);
    assert_eq!(
        std::fs::read(again.path.join("kept")).unwrap(),
        b"still here"
    );
    let path = again.path.clone();
    drop(again);
    assert!(!is_mounted(&path), "SIGTERM unmounts");
    drop(m);
    // And `orion umount` cleans one up too.
    let mut m = cluster.mount("m", &[]);
    m.daemon.kill();
    let o = Command::new(ORION)
        .args(["umount", m.path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!is_mounted(&m.path));
}

/// A helper that takes fcntl locks: `lk PATH r|w START LEN try|try-then-exit|hold|get`
/// (try: F_SETLK once; try-then-exit: wait with F_SETLKW, then exit).
const LOCK_HELPER: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc != 6) return 3;
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) { perror("open"); return 3; }
    struct flock l = {0};
    l.l_type = argv[2][0] == 'w' ? F_WRLCK : F_RDLCK;
    l.l_whence = SEEK_SET;
    l.l_start = atol(argv[3]);
    l.l_len = atol(argv[4]);
    if (argv[5][0] == 'g') {
        if (fcntl(fd, F_GETLK, &l)) { perror("getlk"); return 3; }
        printf("%s %ld %ld\n", l.l_type == F_UNLCK ? "none" : l.l_type == F_WRLCK ? "w" : "r",
               (long)l.l_start, (long)l.l_len);
        return 0;
    }
    if (argv[5][0] == 't' && argv[5][1] == 'r' && argv[5][3] == '-') {
        if (fcntl(fd, F_SETLKW, &l)) { perror("setlkw"); return 3; }
        printf("ok\n");
        return 0;
    }
    if (argv[5][0] == 'h') {
        if (fcntl(fd, F_SETLKW, &l)) { perror("setlkw"); return 3; }
        printf("held\n");
        fflush(stdout);
        sleep(60);
        return 0;
    }
    if (fcntl(fd, F_SETLK, &l)) {
        printf("%s\n", errno == EAGAIN || errno == EACCES ? "busy" : "error");
        return 1;
    }
    printf("ok\n");
    return 0;
}
"#;

/// A child process killed by PID when dropped.
struct Holder(std::process::Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a child and returns its stdout lines as they come.
fn hold(cmd: &mut Command) -> (Holder, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead;
    let mut c = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let out = std::io::BufReader::new(c.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (Holder(c), rx)
}

fn first_line(out: &mut std::sync::mpsc::Receiver<String>) -> String {
    out.recv_timeout(std::time::Duration::from_secs(10))
        .expect("a line from the helper within 10 s")
        .trim()
        .to_string()
}

/// Polls `f` for up to 10 s (lock releases after a process dies are asynchronous).

#[test]
fn locks_hold_across_mounts() {
    let cluster = Cluster::start("local", 1);
    let a = cluster.mount("a", &[]);
    let b = cluster.mount("b", &["--external"]);
    let (fa, fb) = (a.path.join("f"), b.path.join("f"));
    std::fs::write(&fa, vec![0u8; 4096]).unwrap();
    // flock: an exclusive holder through one mount shuts out the other.
    let (holder, mut out) = hold(
        // -o: the command does not inherit the locked descriptor, so killing flock
        // itself releases the lock.
        Command::new("flock")
            .arg("-o")
            .arg(&fa)
            .args(["-c", "echo locked; sleep 60"]),
    );
    assert_eq!(first_line(&mut out), "locked");
    let try_flock = |args: &[&str]| {
        Command::new("flock")
            .args(args)
            .arg(&fb)
            .arg("true")
            .status()
            .unwrap()
            .success()
    };
    assert!(
        !try_flock(&["-n"]),
        "exclusive flock held through the other mount"
    );
    assert!(
        !try_flock(&["-n", "-s"]),
        "shared flock against an exclusive one"
    );
    drop(holder);
    eventually("the flock of a killed holder is released", || {
        try_flock(&["-n"])
    });
    // fcntl byte ranges.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("lk.c");
    std::fs::write(&src, LOCK_HELPER).unwrap();
    let lk = dir.path().join("lk");
    let cc = Command::new("cc")
        .arg("-o")
        .arg(&lk)
        .arg(&src)
        .status()
        .unwrap();
    assert!(cc.success());
    let run = |f: &Path, args: &[&str]| -> String {
        let o = Command::new(&lk).arg(f).args(args).output().unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let (holder, mut out) = hold(Command::new(&lk).arg(&fa).args(["w", "0", "100", "hold"]));
    assert_eq!(first_line(&mut out), "held");
    assert_eq!(run(&fb, &["w", "50", "10", "try"]), "busy");
    assert_eq!(run(&fb, &["r", "99", "1", "try"]), "busy");
    assert_eq!(
        run(&fb, &["w", "100", "50", "try"]),
        "ok",
        "past the held range"
    );
    assert_eq!(run(&fb, &["w", "0", "10", "get"]), "w 0 100");
    // Waiters that are killed stop waiting: more of them than the mount has threads
    // (one per CPU, at least 4), and the mount still serves.
    let more_than_threads = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .max(4)
        + 2;
    let waiters: Vec<_> = (0..more_than_threads)
        .map(|_| hold(Command::new(&lk).arg(&fb).args(["w", "0", "1", "hold"])))
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(200));
    drop(waiters);
    let o = Command::new("timeout")
        .arg("10")
        .arg(&lk)
        .arg(&fb)
        .args(["w", "200", "1", "try"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "ok");
    // More blocked waiters than the mount has request threads, and the holder then
    // closes its file: the close is served and every waiter gets its turn.
    let (quick, mut qout) = hold(Command::new(&lk).arg(&fa).args(["w", "300", "1", "hold"]));
    assert_eq!(first_line(&mut qout), "held");
    let queue: Vec<_> = (0..more_than_threads)
        .map(|_| {
            hold(
                Command::new("timeout")
                    .args(["-s", "KILL", "20"])
                    .arg(&lk)
                    .arg(&fb)
                    .args(["w", "300", "1", "try-then-exit"]),
            )
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(200));
    drop(quick);
    for (mut h, mut out) in queue {
        assert_eq!(first_line(&mut out), "ok");
        let _ = h.0.wait();
    }
    // A waiter through the other mount gets the lock once the holder dies.
    let (_waiter, mut wout) = hold(Command::new(&lk).arg(&fb).args(["r", "0", "0", "hold"]));
    drop(holder);
    assert_eq!(first_line(&mut wout), "held");
    assert_eq!(run(&fa, &["r", "10", "10", "try"]), "ok", "readers share");
    assert_eq!(run(&fa, &["w", "10", "10", "try"]), "busy");
}

/// The kernel keeps names and attributes: a repeated `stat` is answered with the
/// mount's daemon stopped. The MDS calls the mount back before another client's
/// change is acknowledged: `stat`, `readdir` and `read` through mount B right after
/// chmod, rename, truncate and write through mount A show each change. The cache
/// lease is 5 s here, so nothing but the callbacks could (and `--no-kernel-cache`
/// keeps nothing in the kernel).
#[test]
fn the_kernel_keeps_names_and_attributes_and_callbacks_keep_them_true() {
    let cluster = Cluster::start_with_mds("local", 1, &["--cache-lease-ms", "5000"]);
    let a = cluster.mount("a", &[]);
    let b = cluster.mount("b", &["--cache-data"]);
    let nocache = cluster.mount("c", &["--no-kernel-cache"]);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let (fa, fb) = (a.path.join("f"), b.path.join("f"));
    std::fs::write(&fa, b"hello").unwrap();
    std::fs::set_permissions(&fa, PermissionsExt::from_mode(0o644)).unwrap();
    // B's kernel learns the name and the attributes once (a lease comes with the
    // mount's callback connection, within moments of the mount).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let cached = loop {
        assert_eq!(mode(&fb), 0o644);
        if let Some(m) = stat_with_daemon_stopped(&b, &fb) {
            break m;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "B's kernel never kept f"
        );
    };
    assert_eq!(
        (cached.len(), cached.permissions().mode() & 0o7777),
        (5, 0o644)
    );
    let cf = nocache.path.join("f");
    assert_eq!(mode(&cf), 0o644);
    assert!(
        stat_with_daemon_stopped(&nocache, &cf).is_none(),
        "--no-kernel-cache: every stat reaches the daemon"
    );

    std::fs::set_permissions(&fa, PermissionsExt::from_mode(0o600)).unwrap();
    assert_eq!(mode(&fb), 0o600, "chmod through A, stat through B");

    std::fs::OpenOptions::new()
        .write(true)
        .open(&fa)
        .unwrap()
        .set_len(2)
        .unwrap();
    assert_eq!(std::fs::metadata(&fb).unwrap().len(), 2, "truncate, stat");
    assert_eq!(std::fs::read(&fb).unwrap(), b"he", "truncate, read");

    std::fs::write(&fa, b"written by a").unwrap();
    assert_eq!(std::fs::metadata(&fb).unwrap().len(), 12, "write, stat");
    assert_eq!(std::fs::read(&fb).unwrap(), b"written by a", "write, read");

    // File data (B runs with --cache-data): B's kernel keeps what B read (a read
    // through an open descriptor is answered with B's daemon stopped), and drops it
    // when A writes. (The descriptor is shared: one closed with the daemon stopped
    // would wait for it.)
    let held = std::sync::Arc::new(std::fs::File::open(&fb).unwrap());
    let read12 = |f: &std::fs::File| {
        let mut b = [0u8; 12];
        f.read_exact_at(&mut b, 0).unwrap();
        b
    };
    assert_eq!(&read12(&held), b"written by a");
    let h = held.clone();
    let kept = with_daemon_stopped(&b, move || read12(&h));
    assert_eq!(kept.as_ref().map(|b| &b[..]), Some(&b"written by a"[..]));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&fa)
        .unwrap()
        .write_all_at(b"WRITTEN", 0)
        .unwrap();
    assert_eq!(
        &read12(&held),
        b"WRITTEN by a",
        "a write through A, read by B"
    );
    drop(held);
    std::fs::write(&fa, b"written by a").unwrap();

    std::fs::rename(&fa, a.path.join("g")).unwrap();
    assert!(
        !fb.exists(),
        "rename through A: the old name is gone through B"
    );
    assert_eq!(std::fs::read(b.path.join("g")).unwrap(), b"written by a");
    let names: Vec<String> = std::fs::read_dir(&b.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["g".to_string()], "rename, readdir");

    // A name B's kernel keeps is removed and made again for another file.
    std::fs::write(a.path.join("h"), b"1").unwrap();
    assert_eq!(std::fs::read(b.path.join("h")).unwrap(), b"1");
    std::fs::remove_file(a.path.join("h")).unwrap();
    assert!(!b.path.join("h").exists(), "unlink, stat");
    std::fs::create_dir(a.path.join("h")).unwrap();
    assert!(b.path.join("h").is_dir(), "a new inode under the old name");
    // B's own changes stay true through A too.
    std::fs::set_permissions(b.path.join("g"), PermissionsExt::from_mode(0o640)).unwrap();
    assert_eq!(mode(&a.path.join("g")), 0o640);
    assert_eq!(mode(&b.path.join("g")), 0o640);

    // A mount that stops answering holds up a change to what its kernel keeps for
    // at most its lease, and then keeps nothing of it.
    let pid = b.daemon.pid() as i32;
    cluster::stop_process(pid);
    let t = std::time::Instant::now();
    std::fs::set_permissions(a.path.join("g"), PermissionsExt::from_mode(0o604)).unwrap();
    let waited = t.elapsed();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    // B renews every third of its lease: at least 3.3 s of it were left.
    assert!(
        waited < std::time::Duration::from_secs(10) && waited > std::time::Duration::from_secs(1),
        "a chmod waited {waited:?} for a stopped mount with a 5 s lease"
    );
    assert_eq!(
        mode(&b.path.join("g")),
        0o604,
        "through B once it runs again (the chmod waited {waited:?})"
    );
    assert_eq!(std::fs::read(b.path.join("g")).unwrap(), b"written by a");
}
