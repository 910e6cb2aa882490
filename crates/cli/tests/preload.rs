//! Unmodified programs under `orion run` (the preload library): the results they get
//! through the mount, with their file calls served in their own process. Each run
//! asks the library to report what it served (ORION_PRELOAD_STATS), so a test fails
//! if the programs were merely passed through to the mount.

mod cluster;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cluster::{Cluster, Mount, ORION};

/// Programs run under `orion run` against one cluster and its mount.
struct Preload<'a> {
    cluster: &'a Cluster,
    mount: &'a Mount,
}

/// A cluster (one data store, shared-memory fabric) and its mount.
fn start() -> (Cluster, Mount) {
    let cluster = Cluster::start("local", 1);
    let mount = cluster.mount("m", &[]);
    (cluster, mount)
}

impl<'a> Preload<'a> {
    fn new(cluster: &'a Cluster, mount: &'a Mount) -> Preload<'a> {
        Preload { cluster, mount }
    }

    fn command(&self, mds: &str, program: &[&str]) -> Command {
        let mut c = Command::new(ORION);
        c.args(["run", "--mds", mds]);
        c.args(self.cluster.common_flags());
        c.arg("--mount").arg(&self.mount.path).arg("--");
        c.args(program);
        c.env("ORION_PRELOAD_STATS", "1").env("RUST_LOG", "warn");
        c
    }

    fn run(&self, program: &[&str]) -> Output {
        (self.command(&self.cluster.mds.addr, program).output()).expect("running orion run")
    }

    /// Runs `script` with `bash -c` (which ends with exit(3), so every process
    /// reports; dash ends with _exit); panics with its output if it fails or if nothing
    /// was served in-process. Returns its standard output.
    fn sh(&self, script: &str) -> String {
        let o = self.run(&["bash", "-c", script]);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{script}\nfailed: {err}");
        assert!(
            served(&err) > 0,
            "{script}\nwas not served in-process: {err}"
        );
        String::from_utf8(o.stdout).unwrap()
    }
}

/// Calls served in-process, over every process's report.
fn served(stderr: &str) -> u64 {
    stderr
        .lines()
        .filter_map(|l| l.split(": ").nth(2)?.split(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Runs a host command (no preload); its standard output.
fn host(script: &str) -> String {
    let o = Command::new("sh").args(["-c", script]).output().unwrap();
    assert!(
        o.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// A source tree on the host: this crate's sources, a 1 MiB file of random bytes, an
/// empty file, relative and absolute symlinks, a hard link, an empty directory.
fn source_tree(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    let here = env!("CARGO_MANIFEST_DIR");
    host(&format!("cp -a {here}/src {}", src.display()));
    let blob: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(src.join("blob"), blob).unwrap();
    std::fs::write(src.join("empty"), b"").unwrap();
    std::os::unix::fs::symlink("blob", src.join("rel-link")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", src.join("abs-link")).unwrap();
    std::fs::hard_link(src.join("blob"), src.join("blob-hard")).unwrap();
    std::fs::create_dir(src.join("nothing")).unwrap();
    src
}

#[test]
fn coreutils_tar_and_find_give_the_trees_they_give_on_the_host() {
    let (cluster, mount) = start();
    let p = Preload::new(&cluster, &mount);
    let work = tempfile::tempdir_in("/dev/shm").unwrap();
    let src = source_tree(work.path());
    let m = mount.path.display().to_string();
    let s = src.display().to_string();
    let tarball = work.path().join("src.tar").display().to_string();
    host(&format!(
        "tar cf {tarball} -C {} src",
        work.path().display()
    ));

    p.sh(&format!(
        "cp -a {s} {m}/cp && diff -r --no-dereference {s} {m}/cp"
    ));
    p.sh(&format!("mkdir {m}/tx && tar xf {tarball} -C {m}/tx"));
    p.sh(&format!("diff -r --no-dereference {s} {m}/tx/src"));
    // The same listings, sizes and link targets as through the mount.
    let listing = |root: &str| {
        format!(
            "cd {root} && find . -printf '%p %y %s %m %l %n\\n' | sort && du -s --apparent-size . \
             && ls -l --time-style=+ | sort"
        )
    };
    let tx = format!("{m}/tx/src");
    assert_eq!(p.sh(&listing(&tx)), host(&listing(&tx)));
    assert_eq!(
        p.sh(&format!("cat {m}/cp/rel-link | md5sum")),
        host(&format!("md5sum < {s}/blob"))
    );
    // Renames and removals, checked through the mount.
    p.sh(&format!(
        "mv {m}/cp {m}/cp2 && mv {m}/cp2/blob {m}/blob && rm -r {m}/cp2"
    ));
    assert!(!Path::new(&format!("{m}/cp2")).exists());
    assert_eq!(
        std::fs::read(format!("{m}/blob")).unwrap(),
        std::fs::read(src.join("blob")).unwrap()
    );
    p.sh(&format!("rm -r {m}/tx {m}/blob"));
    assert_eq!(std::fs::read_dir(&mount.path).unwrap().count(), 0);
}

#[test]
fn sqlite_and_python_work_under_preload() {
    let (cluster, mount) = start();
    let p = Preload::new(&cluster, &mount);
    let m = mount.path.display().to_string();
    for (journal, db) in [("delete", "rollback.db"), ("wal", "wal.db")] {
        let sql = format!(
            "pragma journal_mode={journal}; create table t(a integer, b text); \
             insert into t values (1, 'x'); \
             begin; insert into t select a + 1, b || 'y' from t; commit; \
             begin; insert into t select a + 2, b || 'z' from t; rollback; \
             insert into t select a + 10, b from t; pragma integrity_check; \
             select count(*), sum(a) from t;"
        );
        let out = p.sh(&format!("sqlite3 {m}/{db} \"{sql}\""));
        assert_eq!(out, format!("{journal}\nok\n4|26\n"), "{journal}");
        // The same database read through the mount.
        let o = host(&format!(
            "sqlite3 {m}/{db} 'select count(*), sum(a) from t'"
        ));
        assert_eq!(o, "4|26\n");
        // With a rollback journal nothing went to the kernel: not the database, not
        // its journal, not the directory SQLite fsyncs after it makes and deletes the
        // journal. (WAL maps its -shm file: that file goes to the kernel.)
        let o = p.run(&[
            "sqlite3",
            &format!("{m}/{db}"),
            "delete from t where a > 10",
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        let handed = match journal {
            "delete" => ", 0 open files handed to the kernel",
            _ => ", 1 open files handed to the kernel",
        };
        assert!(err.contains(handed), "{err}");
    }
    let script = format!(
        r#"
import ctypes, os, shutil, subprocess, sys
m = "{m}"
shutil.copytree("{here}/src", m + "/py")
walked = sorted(os.path.relpath(os.path.join(d, f), m + "/py") for d, _, fs in os.walk(m + "/py") for f in fs)
host = sorted(os.path.relpath(os.path.join(d, f), "{here}/src") for d, _, fs in os.walk("{here}/src") for f in fs)
assert walked == host, (walked, host)
with open(m + "/py/data", "wb") as f:
    f.write(bytes(range(256)) * 1000)
    f.seek(10)
    f.write(b"hello")
with open(m + "/py/data", "rb") as f:
    d = f.read()
assert len(d) == 256000 and d[10:15] == b"hello" and d[15] == 15, len(d)
# An open file outlives its name.
f = open(m + "/py/data", "r+b")
os.unlink(m + "/py/data")
assert os.fstat(f.fileno()).st_nlink == 0
f.seek(0)
f.write(b"still")
f.seek(0)
assert f.read(5) == b"still"
f.close()
assert not os.path.exists(m + "/py/data")
# A file whose path no longer leads to it (renamed, removed) goes to the kernel all
# the same when a call needs the kernel (mmap), with what was written.
import mmap
f = open(m + "/py/mapped", "w+b")
f.write(b"mapped" * 1000)
f.flush()
os.rename(m + "/py/mapped", m + "/py/moved")
g = open(m + "/py/gone", "w+b")
g.write(b"gone!" * 1000)
g.flush()
os.unlink(m + "/py/gone")
for h, want in ((f, b"mapped"), (g, b"gone!")):
    mm = mmap.mmap(h.fileno(), 4096)
    assert mm[:len(want)] == want, mm[:8]
    mm[0:1] = b"M"
    mm.flush()
    mm.close()
    h.seek(0)
    assert h.read(1) == b"M"
    h.close()
with open(m + "/py/moved", "rb") as f:
    assert f.read(2) == b"Ma"
assert not os.path.exists(m + "/py/gone")
assert not [n for n in os.listdir(m) if n.startswith(".orion-handover")], os.listdir(m)
# A child that exits after a fork leaves the parent's unlinked file alone.
fd = os.open(m + "/py/kept", os.O_RDWR | os.O_CREAT)
os.write(fd, b"parent")
os.unlink(m + "/py/kept")
pid = os.fork()
if pid == 0:
    sys.exit(0)
os.waitpid(pid, 0)
assert os.pread(fd, 6, 0) == b"parent"
os.close(fd)
# A file opened by stdio (the kernel serves it) outlives its name too.
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
fp = ctypes.c_void_p(libc.fopen(m.encode() + b"/py/stdio", b"w+"))
assert libc.fputs(b"before", fp) >= 0 and libc.fflush(fp) == 0
os.unlink(m + "/py/stdio")
# Gone through the mount at once, for a program without the library.
bare = {{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}}
assert subprocess.run(["/usr/bin/test", "-e", m + "/py/stdio"], env=bare).returncode == 1
assert libc.fputs(b" after", fp) >= 0 and libc.fflush(fp) == 0
libc.rewind(fp)
buf = ctypes.create_string_buffer(32)
assert libc.fgets(buf, 32, fp) and buf.value == b"before after", buf.value
libc.fclose(fp)
assert not os.path.exists(m + "/py/stdio")
print("python ok")
"#,
        here = env!("CARGO_MANIFEST_DIR")
    );
    assert_eq!(
        p.sh(&format!("python3 -c '{}'", script.replace('\'', "'\\''"))),
        "python ok\n"
    );
}

const SPAWN_C: &str = include_str!("preload_spawn.c");

#[test]
fn execl_system_and_popen_inherit_open_files() {
    let (cluster, mount) = start();
    let p = Preload::new(&cluster, &mount);
    let work = tempfile::tempdir_in("/dev/shm").unwrap();
    let (src, bin) = (work.path().join("spawn.c"), work.path().join("spawn"));
    std::fs::write(&src, SPAWN_C).unwrap();
    host(&format!(
        "cc -O1 -Wall -o {} {}",
        bin.display(),
        src.display()
    ));
    let (bin, m) = (bin.display().to_string(), mount.path.display().to_string());
    // Run directly (no shell): its own process is the one served.
    let o = p.run(&[&bin, &m]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(served(&err) > 0, "nothing served: {err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "a\nb\n1\n2\n3\n4\n");
    assert_eq!(std::fs::read_to_string(format!("{m}/h")).unwrap(), "x");
}

#[test]
fn a_descriptor_keeps_its_offset_across_fork_and_exec() {
    let (cluster, mount) = start();
    let p = Preload::new(&cluster, &mount);
    let m = mount.path.display().to_string();
    // The shell opens the file, writes, forks a subshell, then a child that execs
    // another shell: every write lands after the one before.
    let out = p.sh(&format!(
        "exec 3> {m}/f; echo a >&3; (echo b >&3); sh -c 'echo c >&3'; echo d >&3; \
         exec 3>&-; cat {m}/f; exec 4< {m}/f; read x <&4; sh -c 'read y; echo $y' <&4; cat <&4"
    ));
    assert_eq!(out, "a\nb\nc\nd\nb\nc\nd\n");
    assert_eq!(
        std::fs::read_to_string(format!("{m}/f")).unwrap(),
        "a\nb\nc\nd\n"
    );
    // The shell takes descriptors 3 to 9 after its client connected: the client's
    // own descriptors are out of the way, and it goes on serving.
    let out = p.sh(&format!(
        "printf x > {m}/f0; for n in 3 4 5 6 7 8 9; do eval \"exec $n> {m}/g$n\"; done; \
         read y < {m}/f0; for n in 3 4 5 6 7 8 9; do eval \"echo $n >&$n\"; done; \
         echo $y; cat {m}/g3 {m}/g9"
    ));
    assert_eq!(out, "x\n3\n9\n");
    for n in 3..=9 {
        let g = std::fs::read_to_string(format!("{m}/g{n}")).unwrap();
        assert_eq!(g, format!("{n}\n"));
    }
}

#[test]
fn preload_and_the_mount_see_each_others_changes_at_once() {
    let (cluster, mount) = start();
    let p = Preload::new(&cluster, &mount);
    let m = mount.path.display().to_string();
    let f = mount.path.join("shared");
    p.sh(&format!("printf one > {m}/shared"));
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "one");
    std::fs::write(&f, "two, longer").unwrap();
    assert_eq!(
        p.sh(&format!("cat {m}/shared; stat -c ' %s' {m}/shared")),
        "two, longer 11\n"
    );
    p.sh(&format!(
        "printf 3 | dd of={m}/shared bs=1 seek=1 conv=notrunc status=none"
    ));
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "t3o, longer");
    std::fs::rename(&f, mount.path.join("moved")).unwrap();
    assert_eq!(
        p.sh(&format!("ls {m}; cat {m}/moved")),
        "moved\nt3o, longer"
    );
    p.sh(&format!(
        "truncate -s 3 {m}/moved && mkdir {m}/d && mv {m}/moved {m}/d/x"
    ));
    assert_eq!(
        std::fs::read_to_string(mount.path.join("d/x")).unwrap(),
        "t3o"
    );
}

#[test]
fn an_unreachable_cluster_is_said_once_and_the_mount_serves() {
    let (cluster, mount) = start();
    let p = Preload::new(&cluster, &mount);
    let m = mount.path.display().to_string();
    std::fs::write(mount.path.join("a"), "through the mount\n").unwrap();
    // Port 1 on loopback: nothing listens.
    let o = (p
        .command(
            "127.0.0.1:1",
            &["cat", &format!("{m}/a"), &format!("{m}/a")],
        )
        .output())
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "through the mount\n".repeat(2)
    );
    assert_eq!(err.matches("cannot reach the cluster").count(), 1, "{err}");
    assert_eq!(served(&err), 0, "{err}");
}

/// Whether this process (through the mount, not preloaded) can take `kind` on all of
/// `path` at once: fcntl F_SETLK, or flock with LOCK_NB; taken locks are dropped.
fn mount_can_lock(path: &Path, flock: bool) -> bool {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let fd = f.as_raw_fd();
    // SAFETY: fcntl and flock on a descriptor this function owns, with a flock
    // structure on its stack.
    unsafe {
        if flock {
            return libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) == 0;
        }
        let mut l: libc::flock = std::mem::zeroed();
        l.l_type = libc::F_WRLCK as _;
        l.l_whence = libc::SEEK_SET as _;
        libc::fcntl(fd, libc::F_SETLK, &l) == 0
    }
}

#[test]
fn locks_taken_in_process_hold_against_the_mount() {
    use std::io::{BufRead, BufReader, Write};
    let (cluster, mount) = start();
    let p = Preload::new(&cluster, &mount);
    let m = mount.path.display().to_string();
    let lk = mount.path.join("lk");
    std::fs::write(&lk, b"locks").unwrap();
    // A preloaded process takes a record lock, then a flock; each step waits for a
    // line from the test.
    let script = format!(
        r#"
import fcntl, os, sys
fd = os.open("{m}/lk", os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("record", flush=True); sys.stdin.readline()
d = os.dup(fd)
os.close(d)
print("closed a dup", flush=True); sys.stdin.readline()
f = os.open("{m}/lk", os.O_RDWR)
fcntl.flock(f, fcntl.LOCK_EX)
print("flock", flush=True); sys.stdin.readline()
os.close(f)
print("closed", flush=True); sys.stdin.readline()
"#
    );
    let mut child = p
        .command(&cluster.mds.addr, &["python3", "-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let mut output = BufReader::new(child.stdout.take().unwrap());
    let mut step = |expected: &str| {
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), expected);
    };
    step("record");
    assert!(!mount_can_lock(&lk, false), "the record lock holds");
    writeln!(input).unwrap();
    // POSIX: closing any descriptor of the file drops the process's record locks.
    step("closed a dup");
    assert!(
        mount_can_lock(&lk, false),
        "the record lock went with the close"
    );
    writeln!(input).unwrap();
    step("flock");
    assert!(!mount_can_lock(&lk, true), "the flock holds");
    writeln!(input).unwrap();
    step("closed");
    assert!(
        mount_can_lock(&lk, true),
        "the flock went with the last close"
    );
    writeln!(input).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(served(&err) > 0, "{err}");
    assert!(err.contains(", 0 open files handed to the kernel"), "{err}");
}

const DIRS_C: &str = include_str!("preload_dirs.c");

#[test]
fn make_git_and_fio_work_under_preload() {
    let (cluster, mount) = start();
    let p = Preload::new(&cluster, &mount);
    let m = mount.path.display().to_string();
    let work = tempfile::tempdir_in("/dev/shm").unwrap();
    std::fs::write(work.path().join("dirs.c"), DIRS_C).unwrap();
    std::fs::write(
        work.path().join("Makefile"),
        "dirs: dirs.o\n\tcc -o $@ dirs.o\ndirs.o: dirs.c\n\tcc -O1 -Wall -c dirs.c\n",
    )
    .unwrap();
    let w = work.path().display().to_string();
    // make builds the program on the mount, through the library.
    p.sh(&format!(
        "mkdir {m}/proj && cp {w}/dirs.c {w}/Makefile {m}/proj && make -s -C {m}/proj"
    ));
    // The program lists its own directory: the same lines in-process and through
    // the mount (inode numbers, types, telldir/seekdir, rewinddir, fdopendir of a
    // directory descriptor, errors).
    let listed = p.sh(&format!("{m}/proj/dirs {m}/proj"));
    assert_eq!(listed, host(&format!("{m}/proj/dirs {m}/proj")));
    assert!(listed.contains("dirs.o type 8\n"), "{listed}");
    assert!(listed.contains("seekdir: same entry\n"), "{listed}");
    assert!(
        listed.contains("rewinddir sees the new name: 1\n"),
        "{listed}"
    );
    assert!(
        listed.contains("opendir of a file: Not a directory\n"),
        "{listed}"
    );
    assert!(
        listed.contains("dirfd is the descriptor: 1\nclosedir closed it: 1\n"),
        "{listed}"
    );
    assert!(
        listed.contains("fdopendir of a file: Not a directory\n"),
        "{listed}"
    );
    // A directory opened without O_DIRECTORY (served in-process until a call needs
    // the kernel's descriptor).
    for line in [
        "plain open of a directory: at the lowest free number 1, a directory 1, fsync 0, fdatasync 0\n",
        "its dup: a directory 1, close-on-exec 1 then 0\n",
        "open for writing: Is a directory\n",
        "read: -1 Is a directory\n",
        "a name relative to it: 1\n",
        "fchdir: 0, then a relative name: 1\n",
        "fchdir into a directory renamed since its open: 0, now in after\nclose: 0\n",
    ] {
        assert!(listed.contains(line), "{line}: {listed}");
    }
    // The raw getdents64 call pages through the same names, its offsets where
    // lseek says the descriptor is, and starts over at 0.
    for what in ["in small steps", "after lseek to 0"] {
        let line = format!("getdents64 {what}: Makefile 8 dirs 8 dirs.c 8 dirs.o 8; ");
        assert!(
            listed.contains(&format!("{line}offsets agree with lseek: 1\n")),
            "{listed}"
        );
    }
    assert!(
        listed.contains("getdents64 into 8 bytes: -1 Invalid argument\n"),
        "{listed}"
    );
    // git: a repository made, committed to and checked under preload, read through
    // the mount.
    p.sh(&format!(
        "export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1; \
         cd {m}/proj && git init -q && git add dirs.c Makefile && \
         git -c user.name=t -c user.email=t@example.com commit -qm first && git fsck --strict 2>&1"
    ));
    assert_eq!(
        host(&format!(
            "export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1; \
             git -C {m}/proj log --format=%s && git -C {m}/proj status --porcelain -uno"
        )),
        "first\n"
    );
    // The mount point itself: it exists (fio makes its directory first) and is not
    // removed.
    let root = format!(
        "python3 -c 'import errno, os\nm = \"{m}\"\n\
         for f in [lambda: os.mkdir(m), lambda: os.rmdir(m), lambda: os.symlink(\"x\", m),\n\
         \x20   lambda: os.link(m + \"/proj/dirs.c\", m), lambda: os.rename(m, m + \"/x\"),\n\
         \x20   lambda: os.rename(m + \"/proj\", m), lambda: os.unlink(m)]:\n\
         \x20   try:\n\x20       f()\n\x20       print(\"done\")\n\
         \x20   except OSError as e:\n\x20       print(errno.errorcode[e.errno])'"
    );
    assert_eq!(
        p.sh(&root),
        "EEXIST\nEBUSY\nEEXIST\nEEXIST\nEXDEV\nEXDEV\nEISDIR\n"
    );
    assert_eq!(host(&root), p.sh(&root));
    // fio: random 4 KiB writes, each verified by its CRC32C.
    let out = p.sh(&format!(
        "fio --name=v --directory={m} --rw=randwrite --bs=4k --size=4m --ioengine=psync \
         --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
         --output-format=terse"
    ));
    assert_eq!(
        out.split(';').nth(4),
        Some("0"),
        "fio reported errors: {out}"
    );
}
