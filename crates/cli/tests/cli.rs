//! The `orion` command: mkfs and fsck exit codes and messages.

use std::process::Command;

fn orion(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_orion"))
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
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
    let (code, text) = orion(&["fsck", "--pool", p]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(text.lines().count(), 1, "one-line summary: {text}");
    assert!(text.contains("clean: 1 inodes"), "{text}");
    // Damage the root's log page header.
    let mut bytes = std::fs::read(&pool).unwrap();
    let sb_page_area = {
        let b = &bytes[104..112];
        u64::from_le_bytes(b.try_into().unwrap()) as usize
    };
    bytes[sb_page_area + 8] ^= 0xff;
    std::fs::write(&pool, &bytes).unwrap();
    let (code, text) = orion(&["fsck", "--pool", p]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("problem: ") && text.contains("INCONSISTENT"),
        "{text}"
    );
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
