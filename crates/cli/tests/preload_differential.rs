//! Random operations through the preload library and through the mount, on one
//! cluster, compared after every step: the same Python executor
//! (`preload_exec.py`, os.* calls) runs under `orion run` on one directory of the
//! mount and plainly on another, and after each operation both answer and both
//! trees must be the same. Seeded (`ORION_SEED`); `ORION_PRELOAD_OPS` sets the
//! number of operations (long runs).

mod cluster;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use cluster::{Cluster, ORION};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const EXECUTOR: &str = include_str!("preload_exec.py");

fn seed() -> u64 {
    std::env::var("ORION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5052_454C)
}

/// An executor process: operations in, results out.
struct Executor {
    child: Child,
    input: Option<ChildStdin>,
    output: BufReader<ChildStdout>,
}

impl Executor {
    fn start(mut c: Command) -> Executor {
        let mut child = (c.stdin(Stdio::piped()).stdout(Stdio::piped()))
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the executor");
        let input = child.stdin.take();
        let output = BufReader::new(child.stdout.take().unwrap());
        Executor {
            child,
            input,
            output,
        }
    }

    fn ask(&mut self, op: &Value) -> Value {
        let input = self.input.as_mut().expect("the executor is running");
        let sent = writeln!(input, "{op}");
        let mut line = String::new();
        let _ = self.output.read_line(&mut line);
        match (sent, serde_json::from_str(&line)) {
            (Ok(()), Ok(v)) => v,
            _ => {
                let (_, err) = self.finish();
                panic!("the executor said {line:?} to {op}; its stderr:\n{err}")
            }
        }
    }
}

impl Executor {
    /// Ends the executor (end of its input): whether it exited well, and what it
    /// said on stderr.
    fn finish(&mut self) -> (bool, String) {
        use std::io::Read;
        self.input = None;
        let ok = self.child.wait().is_ok_and(|s| s.success());
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        (ok, err)
    }
}

impl Executor {
    /// Ends a preloaded executor, which must exit well having been served
    /// in-process (`ORION_PRELOAD_STATS` counts on stderr).
    fn finish_served(&mut self) {
        let (ok, err) = self.finish();
        assert!(ok, "the preloaded executor failed: {err}");
        let served: u64 = (err.lines())
            .filter_map(|l| l.split(": ").nth(2)?.split(' ').next()?.parse::<u64>().ok())
            .sum();
        assert!(served > 0, "nothing was served in-process: {err}");
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const NAMES: &[&str] = &["a", "b", "c", "d", "d/e", "d/f", "g/h"];

fn random_op(rng: &mut SmallRng) -> Value {
    let name = |rng: &mut SmallRng| NAMES[rng.gen_range(0..NAMES.len())];
    let off = |rng: &mut SmallRng| [0u64, 1, 4095, 4096, 10_000, 70_000][rng.gen_range(0..6)];
    let len = |rng: &mut SmallRng| [1usize, 100, 4096, 5000, 65_536][rng.gen_range(0..5)];
    let path = name(rng);
    let held = ["x", "y"][rng.gen_range(0..2)];
    let mode = [0o600, 0o755, 0o4755][rng.gen_range(0..3)];
    if rng.gen_bool(0.2) {
        return attribute_op(rng, path);
    }
    match rng.gen_range(0..100) {
        0..=19 => json!({"op": "write", "path": path, "off": off(rng), "len": len(rng),
                         "seed": rng.gen::<u8>(), "append": rng.gen_bool(0.3),
                         "trunc": rng.gen_bool(0.2)}),
        20..=29 => json!({"op": "pread", "path": path, "off": off(rng), "len": len(rng)}),
        30..=34 => json!({"op": "truncate", "path": path, "size": off(rng)}),
        35..=41 => json!({"op": "unlink", "path": path}),
        42..=51 => json!({"op": "rename", "path": path, "to": name(rng)}),
        52..=57 => json!({"op": "mkdir", "path": path}),
        58..=61 => json!({"op": "rmdir", "path": path}),
        62..=64 => json!({"op": "symlink", "path": path, "target": name(rng)}),
        65..=67 => json!({"op": "link", "path": path, "to": name(rng)}),
        68..=70 => {
            json!({"op": "chmod", "path": path, "mode": mode})
        }
        71..=77 => json!({"op": "stat", "path": path}),
        78..=83 => json!({"op": "hold", "path": path, "name": held}),
        84..=93 => json!({"op": "use", "name": held, "off": off(rng),
                          "len": len(rng), "seed": rng.gen::<u8>()}),
        _ => json!({"op": "drop", "name": held}),
    }
}

/// Listings, links, owners, times and extended attributes.
fn attribute_op(rng: &mut SmallRng, path: &str) -> Value {
    let follow = rng.gen_bool(0.5);
    let dir = ["", "d", "g", "a"][rng.gen_range(0..4)];
    let time = |rng: &mut SmallRng| rng.gen_range(0..4_000_000_000_000_000_000i64);
    let xattr = [
        "user.a",
        "user.b",
        "trusted.t",
        "other.x",
        "user.",
        "security.s",
    ][rng.gen_range(0..6)];
    match rng.gen_range(0..7) {
        0 => json!({"op": "listdir", "path": dir}),
        1 => json!({"op": "readlink", "path": path}),
        2 => json!({"op": "chown", "path": path, "uid": rng.gen_range(-1..3),
                    "gid": rng.gen_range(-1..3), "follow": follow}),
        3 => json!({"op": "utime", "path": path, "atime": time(rng), "mtime": time(rng),
                    "follow": follow}),
        _ => json!({"op": "xattr", "path": path, "name": xattr, "follow": follow,
                    "do": (["set", "set", "get", "remove", "list"][rng.gen_range(0..5)]),
                    "value": format!("v{}", rng.gen_range(0..100)),
                    "flags": rng.gen_range(0..3)}),
    }
}

#[test]
fn random_operations_through_preload_match_the_mount() {
    let cluster = Cluster::start("local", 1);
    let mount = cluster.mount("m", &[]);
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let script = dir.path().join("preload_exec.py");
    std::fs::write(&script, EXECUTOR).unwrap();
    let (pre, mnt) = (mount.path.join("pre"), mount.path.join("mnt"));
    std::fs::create_dir(&pre).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let python = |root: &Path| {
        let mut c = Command::new("python3");
        c.arg("-u").arg(&script).arg(root);
        c
    };
    let mut preloaded = {
        let mut c = Command::new(ORION);
        c.args(["run", "--mds", &cluster.mds.addr]);
        c.args(cluster.common_flags());
        c.arg("--mount")
            .arg(&mount.path)
            .args(["--", "python3", "-u"]);
        c.arg(&script).arg(&pre);
        c.env("ORION_PRELOAD_STATS", "1").env("RUST_LOG", "warn");
        Executor::start(c)
    };
    let mut plain = Executor::start(python(&mnt));
    let seed = seed();
    let ops: usize = std::env::var("ORION_PRELOAD_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let mut rng = SmallRng::seed_from_u64(seed);
    let snapshot = json!({"op": "snapshot"});
    for i in 0..ops {
        let op = random_op(&mut rng);
        let (a, b) = (preloaded.ask(&op), plain.ask(&op));
        assert_eq!(
            a, b,
            "op {i} {op}: preload left, mount right (ORION_SEED={seed})"
        );
        let (a, b) = (preloaded.ask(&snapshot), plain.ask(&snapshot));
        assert_eq!(
            a, b,
            "tree after op {i} {op}: preload left, mount right (ORION_SEED={seed})"
        );
    }
    // Every descriptor closes and the trees still match.
    for name in ["x", "y"] {
        let op = json!({"op": "drop", "name": name});
        assert_eq!(preloaded.ask(&op), plain.ask(&op));
    }
    assert_eq!(preloaded.ask(&snapshot), plain.ask(&snapshot));
    preloaded.finish_served();
    let (ok, err) = plain.finish();
    assert!(ok, "the plain executor failed: {err}");
}

/// Debian's Python, which every user may run (a root-only version manager's shim
/// may come first in PATH).
const PYTHON: &str = "/usr/bin/python3";

/// What the administrator does between another user's calls: modes (sticky and
/// setid bits too) and owners, on names either side may have made.
fn admin_op(rng: &mut SmallRng) -> Value {
    let path = ["", "a", "b", "d", "d/e", "g", "g/h"][rng.gen_range(0..7)];
    let modes = [
        0o777, 0o755, 0o700, 0o1777, 0o644, 0o600, 0o4755, 0o2775, 0o666, 0o2777, 0o3777, 0o770,
    ];
    let mode = modes[rng.gen_range(0..modes.len())];
    // The user is 65534, in group 1000 besides its own.
    let who = |rng: &mut SmallRng| [0, 65534, 1000][rng.gen_range(0..3)];
    match rng.gen_bool(0.6) {
        true => json!({"op": "chmod", "path": path, "mode": mode}),
        false => json!({"op": "chown", "path": path, "uid": who(rng), "gid": who(rng),
                        "follow": false}),
    }
}

/// Another user than root (65534, in group 1000 too) works through the preload library (its calls checked by
/// the client library's access checks) and through the mount (checked by the FUSE
/// daemon), while root changes modes and owners between their calls: both must
/// answer alike, and the trees stay the same. The local backend shares memory
/// files among one user's processes, so this cluster runs on libfabric's tcp
/// provider.
#[test]
fn another_users_operations_through_preload_match_the_mount() {
    use std::os::unix::fs::PermissionsExt;
    let cluster = Cluster::start("libfabric", 1);
    let open = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    open(cluster.dir.path(), 0o755);
    let mount = cluster.mount("m", &[]);
    // The user's copies of the secret and the executor.
    let secret = cluster.dir.path().join("secret-user");
    std::fs::copy(&cluster.secret, &secret).unwrap();
    let script = cluster.dir.path().join("preload_exec.py");
    std::fs::write(&script, EXECUTOR).unwrap();
    for f in [&secret, &script] {
        open(f, 0o644);
    }
    let (pre, mnt) = (mount.path.join("pre"), mount.path.join("mnt"));
    for d in [&pre, &mnt] {
        std::fs::create_dir(d).unwrap();
        open(d, 0o777);
    }
    let as_user = |program: &str| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--groups=1000", program]);
        c
    };
    let mut preloaded = {
        let mut c = as_user(ORION);
        c.args(["run", "--mds", &cluster.mds.addr, "--backend", "libfabric"]);
        c.arg("--secret-file").arg(&secret);
        c.arg("--mount").arg(&mount.path);
        c.args(["--", PYTHON, "-u"]).arg(&script).arg(&pre);
        c.env("ORION_PRELOAD_STATS", "1").env("RUST_LOG", "warn");
        Executor::start(c)
    };
    let mut plain = {
        let mut c = as_user(PYTHON);
        c.arg("-u").arg(&script).arg(&mnt);
        Executor::start(c)
    };
    // Root's own view of each tree: the preloaded one through a client of its own
    // (as the user's calls there), the other through the mount.
    let mut root_pre = {
        let mut c = Command::new(ORION);
        c.args(["run", "--mds", &cluster.mds.addr]);
        c.args(cluster.common_flags());
        c.arg("--mount").arg(&mount.path);
        c.args(["--", PYTHON, "-u"]).arg(&script).arg(&pre);
        c.env("RUST_LOG", "warn");
        Executor::start(c)
    };
    let mut root_mnt = {
        let mut c = Command::new(PYTHON);
        c.arg("-u").arg(&script).arg(&mnt);
        Executor::start(c)
    };
    let seed = seed();
    let ops: usize = std::env::var("ORION_PRELOAD_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let mut rng = SmallRng::seed_from_u64(seed);
    let snapshot = json!({"op": "snapshot"});
    let mut tree = Value::Null;
    for i in 0..ops {
        let (op, (a, b)) = match rng.gen_bool(0.2) {
            true => {
                let op = admin_op(&mut rng);
                let r = (root_pre.ask(&op), root_mnt.ask(&op));
                (op, r)
            }
            false => {
                let op = random_op(&mut rng);
                let r = (preloaded.ask(&op), plain.ask(&op));
                (op, r)
            }
        };
        assert_eq!(
            a, b,
            "op {i} {op} on {tree}: preload left, mount right (ORION_SEED={seed})"
        );
        let (a, b) = (root_pre.ask(&snapshot), root_mnt.ask(&snapshot));
        assert_eq!(
            a, b,
            "tree after op {i} {op}: preload left, mount right (ORION_SEED={seed})"
        );
        tree = a;
    }
    for name in ["x", "y"] {
        let op = json!({"op": "drop", "name": name});
        assert_eq!(preloaded.ask(&op), plain.ask(&op));
    }
    preloaded.finish_served();
    // ORION_PRELOAD_USERS=root sends another user's calls through the mount.
    let mut c = as_user(ORION);
    c.args(["run", "--mds", &cluster.mds.addr, "--backend", "libfabric"]);
    c.arg("--secret-file").arg(&secret);
    c.arg("--mount").arg(&mount.path);
    c.args(["--", PYTHON, "-c", "import os, sys; os.stat(sys.argv[1])"])
        .arg(&pre);
    let o = (c.env("ORION_PRELOAD_USERS", "root"))
        .env("ORION_PRELOAD_STATS", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains(": 0 calls served in-process"), "{err}");
}
