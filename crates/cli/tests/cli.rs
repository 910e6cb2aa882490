//! The `orion` command: mkfs and fsck exit codes and messages, and their progress.

use std::process::Command;

/// Exit code, stdout and stderr (captured: not a terminal).
fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_orion"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let code = out.status.code().unwrap_or(-1);
    (code, text(&out.stdout), text(&out.stderr))
}

/// Exit code and everything printed.
fn orion(args: &[&str]) -> (i32, String) {
    let (code, out, err) = run(args);
    (code, out + &err)
}

#[test]
fn mkfs_then_fsck_is_clean_and_damage_exits_1() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let pool = dir.path().join("fs.pool");
    let p = pool.to_str().unwrap();
    let (code, text) = orion(&["mkfs", "--pool", p, "--size", "16M"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("mode volatile"),
        "the pool mode is reported: {text}"
    );
    let (code, text) = orion(&["mkfs", "--pool", p, "--size", "16M"]);
    assert_ne!(code, 0);
    assert!(text.contains("already exists"), "{text}");
    let (code, text, progress) = run(&["fsck", "--pool", p]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(
        text.lines().count(),
        1,
        "one-line summary: {text}{progress}"
    );
    assert!(text.contains("clean: 1 inodes"), "{text}");
    // Damage the header of the root's first log segment (inode 1's, 256 bytes into
    // the area the superblock names at byte 120).
    let mut bytes = std::fs::read(&pool).unwrap();
    let segment_area = {
        let b = &bytes[120..128];
        u64::from_le_bytes(b.try_into().unwrap()) as usize
    };
    bytes[segment_area + 256 + 8] ^= 0xff;
    std::fs::write(&pool, &bytes).unwrap();
    let (code, text) = orion(&["fsck", "--pool", p]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("problem: ") && text.contains("INCONSISTENT"),
        "{text}"
    );
    // A mirror's copy in progress (its copy marker beside it) is said to be one, not
    // reported as damage.
    let marker = orion_mds::copy_marker(&pool);
    std::fs::write(&marker, b"copying\n").unwrap();
    let (code, text) = orion(&["fsck", "--pool", p]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("not a whole pool") && !text.contains("problem: "),
        "{text}"
    );
    std::fs::remove_file(&marker).unwrap();
    let (code, text) = orion(&[
        "fsck",
        "--pool",
        dir.path().join("missing").to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(text.contains("cannot open pool file"), "{text}");
    let (code, text) = orion(&["mkfs", "--pool", p, "--size", "12x", "--force"]);
    assert_ne!(code, 0);
    assert!(text.contains("invalid size"), "{text}");
}

/// Long work on a non-terminal says how far it has come in whole lines (a log, CI):
/// formatting a pool and checking it, a line per tenth or per step, ending at 100 %,
/// and never a carriage return.
#[test]
fn progress_on_a_non_terminal_is_whole_lines() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let pool = dir.path().join("fs.pool");
    let p = pool.to_str().unwrap();
    let (code, out, err) = run(&["mkfs", "--pool", p, "--size", "1G"]);
    assert_eq!(code, 0, "{out}{err}");
    let lines = |err: &str, what: &str| -> Vec<String> {
        assert!(!err.contains('\r'), "a carriage return in {err:?}");
        (err.lines())
            .filter(|l| l.contains(what))
            .map(String::from)
            .collect()
    };
    let formatting = lines(&err, &format!("formatting {p}: "));
    // 1 GiB goes in 128 MiB steps: eight lines, each a larger share.
    assert!(formatting.len() >= 5, "{err}");
    assert!(
        formatting
            .last()
            .unwrap()
            .contains("100 % (1.0 GiB of 1.0 GiB)"),
        "{err}"
    );
    let shares: Vec<u32> = (formatting.iter())
        .map(|l| {
            let at = l.find(" % (").unwrap();
            let start = l[..at].rfind(' ').unwrap() + 1;
            l[start..at].parse().unwrap()
        })
        .collect();
    assert!(shares.windows(2).all(|w| w[0] < w[1]), "{shares:?}");
    assert!(!out.contains("formatting"), "progress on stdout: {out}");

    let (code, out, err) = run(&["fsck", "--pool", p]);
    assert_eq!(code, 0, "{out}{err}");
    let loading = lines(&err, &format!("fsck {p}: loading inodes: "));
    assert_eq!(loading.len(), 1, "{err}");
    assert!(loading[0].contains("100 % (1 inodes of 1 inodes)"), "{err}");
}

/// A daemon `orion up` starts logs to the file it is given, rotated by size, and its
/// stderr (an error printed outside the log) lands in the current file too.
#[test]
fn a_log_file_is_rotated_and_takes_stderr_along() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let log = dir.path().join("d.log");
    let pool = dir.path().join("fs.pool");
    let orion = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_orion"))
            .args(args)
            .env("ORION_LOG_FILE", &log)
            .env("ORION_LOG_ROTATE_BYTES", "400")
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    };
    let o = orion(&["mkfs", "--pool", pool.to_str().unwrap(), "--size", "512M"]);
    assert!(o.status.success());
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let read = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap_or_default();
    // Four progress lines of about 130 bytes: the log turned over at least once, and
    // no file holds more than one line past the limit.
    assert!(read("d.log.1").contains("formatting"), "{}", read("d.log"));
    for n in ["d.log", "d.log.1", "d.log.2"] {
        assert!(read(n).len() <= 400 + 200, "{n}: {}", read(n));
    }
    assert!(read("d.log").contains("100 %"), "{}", read("d.log"));
    // An error printed on stderr goes to the current log.
    let missing = dir.path().join("missing");
    let o = orion(&["fsck", "--pool", missing.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stderr.is_empty());
    assert!(
        read("d.log").contains("cannot open pool file"),
        "{}",
        read("d.log")
    );
}
