//! `orion list` and `orion destroy`: the file systems `orion up` leaves on a host are
//! listed (pools, the RAM they hold, state, running or not), a file system whose state
//! directory was deleted is said to be served again, and destroy removes one only
//! when asked twice (a terminal answer or --yes) and never while it runs.

mod cluster;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use cluster::{Up, ORION};

/// `orion` with the register of file systems in `data` (not the user's own).
fn orion(data: &Path, args: &[&str]) -> Output {
    Command::new(ORION)
        .args(args)
        .env("XDG_DATA_HOME", data)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn up_args<'a>(state: &'a str, pools: &'a str) -> Vec<&'a str> {
    vec![
        "up",
        "--no-mirror",
        "--mds-size",
        "64M",
        "--ds-size",
        "64M",
        "--dir",
        state,
        "--pools",
        pools,
    ]
}

/// The entry of `orion list --json` for pool directory `pools`, if listed.
fn listed(data: &Path, pools: &Path) -> Option<serde_json::Value> {
    let o = orion(data, &["list", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let all: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let want = pools.canonicalize().ok()?;
    all.into_iter()
        .find(|h| h["pools"].as_str() == Some(want.to_str().unwrap()))
}

#[test]
fn list_shows_and_destroy_removes_a_file_system_of_orion_up() {
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let pools_dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let state = work.path().join("state");
    let pools = pools_dir.path().join("pools");
    let (s, p) = (state.to_str().unwrap(), pools.to_str().unwrap());

    // A file system made and left stopped: listed, with its state and its RAM.
    let mut check = up_args(s, p);
    check.push("--check");
    let o = orion(data.path(), &check);
    assert!(o.status.success(), "{}", text(&o));
    let h = listed(data.path(), &pools).expect("listed after orion up");
    assert_eq!(
        h["state"].as_str(),
        Some(state.canonicalize().unwrap().to_str().unwrap())
    );
    assert_eq!(h["state_exists"], true);
    assert_eq!(h["running"], serde_json::json!([]));
    assert!(h["bytes"].as_u64().unwrap() > 0, "{h}");
    let table = text(&orion(data.path(), &["list"]));
    assert!(table.contains("stopped") && table.contains(p), "{table}");

    // Running: listed so, and destroy refuses.
    let running = Up::start(&state, &pools, data.path(), &["--no-mirror"]);
    let h = listed(data.path(), &pools).unwrap();
    assert!(!h["running"].as_array().unwrap().is_empty(), "{h}");
    let o = orion(data.path(), &["destroy", "--dir", s, "--yes"]);
    assert!(
        !o.status.success() && text(&o).contains("is running"),
        "{}",
        text(&o)
    );
    assert!(pools.join("mds.pool").exists());
    // A second `orion up` on the same pools is refused while the first runs.
    let o = orion(data.path(), &check);
    assert!(
        !o.status.success() && text(&o).contains("in use"),
        "{}",
        text(&o)
    );
    running.stop();

    // The state directory deleted: the pools are said to be served again.
    std::fs::remove_dir_all(&state).unwrap();
    let h = listed(data.path(), &pools).unwrap();
    assert_eq!(h["state_exists"], false, "{h}");
    let o = orion(data.path(), &check);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("whose state directory was removed"),
        "{}",
        text(&o)
    );

    // A directory orion did not make is not taken for pools, whatever it holds.
    let other = work.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("data.pool"), b"mine").unwrap();
    let o = orion(
        data.path(),
        &["destroy", "--pools", other.to_str().unwrap(), "--yes"],
    );
    assert!(
        !o.status.success() && text(&o).contains("owner.json"),
        "{}",
        text(&o)
    );
    assert!(other.join("data.pool").exists());

    // Destroy asks first: without a terminal and without --yes, nothing goes.
    let o = orion(data.path(), &["destroy", "--dir", s]);
    assert!(
        !o.status.success() && text(&o).contains("--yes"),
        "{}",
        text(&o)
    );
    assert!(pools.join("mds.pool").exists() && state.exists());
    // A file the user put in the pool directory stays, and so does the directory.
    std::fs::write(pools.join("notes.txt"), b"mine").unwrap();
    let o = orion(data.path(), &["destroy", "--dir", s, "--yes"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!state.exists(), "state removed");
    assert!(!pools.join("mds.pool").exists() && !pools.join("ds0.pool").exists());
    assert_eq!(std::fs::read(pools.join("notes.txt")).unwrap(), b"mine");
    assert!(listed(data.path(), &pools).is_none(), "no longer listed");
    // Nothing left to destroy: a clear error.
    let o = orion(data.path(), &["destroy", "--dir", s, "--yes"]);
    assert!(
        !o.status.success() && text(&o).contains("no file system"),
        "{}",
        text(&o)
    );
}
