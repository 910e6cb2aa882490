//! `orion top` as an operator runs it: on a terminal (a pseudo-terminal made by
//! `script`) it draws its table and quits on `q`; elsewhere it prints one table with
//! every node of the cluster and the requests of the last interval.

mod cluster;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use cluster::{Up, ORION};

#[test]
fn top_prints_every_node_and_quits_on_q_in_a_terminal() {
    let data = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let pools = tempfile::tempdir_in("/dev/shm").unwrap();
    let _up = Up::start(state.path(), pools.path(), data.path(), &[]);
    let dir = state.path().to_str().unwrap().to_string();

    // Not a terminal: one plain table, every node, the requests of the interval.
    let writer = {
        let mnt = state.path().join("mnt");
        std::thread::spawn(move || {
            for i in 0..200 {
                std::fs::write(mnt.join(format!("f{i}")), b"x").unwrap();
            }
        })
    };
    let o = Command::new(ORION)
        .args(["top", "--once", "--interval-ms", "500", "--dir", &dir])
        .output()
        .unwrap();
    writer.join().unwrap();
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for node in ["mds-a", "mds-b", "ds 0.0", "ds 1.0", "mount"] {
        assert!(table.contains(node), "{node} missing:\n{table}");
    }
    assert!(table.contains("epoch"), "{table}");
    assert!(
        !table.contains('\r'),
        "a plain table has no carriage returns"
    );

    // A terminal: the full-screen view draws its nodes, and `q` ends it with status
    // 0. (`script` gives it a pseudo-terminal, sized by stty: a 0x0 one draws nothing.)
    let script = Command::new("script")
        .args([
            "-qec",
            &format!("stty rows 30 cols 160; {ORION} top --dir {dir} --interval-ms 200"),
            "/dev/null",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed (with the top under it) if the test fails before it ends.
    let mut script = Killed(script);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let reader = {
        let (mut screen, seen) = (script.0.stdout.take().unwrap(), seen.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = screen.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        })
    };
    let drawn = |what: &str| String::from_utf8_lossy(&seen.lock().unwrap()).contains(what);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !(drawn("mds-a") && drawn("mds-b")) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let screen = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    // (ratatui moves the cursor over spaces: names without one are looked for.)
    assert!(drawn("mds-a") && drawn("mds-b"), "not drawn: {screen:?}");
    script.0.stdin.as_mut().unwrap().write_all(b"q").unwrap();
    let status = wait_at_most(&mut script.0, Duration::from_secs(30));
    reader.join().unwrap();
    assert_eq!(status, Some(0), "top did not quit on q");
}

/// A child killed and waited for when dropped (its process group: `script` and the
/// program it runs).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = Command::new("pkill")
                .args(["-KILL", "-P", &self.0.id().to_string()])
                .status();
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// The child's exit code, or None (after killing it) if it runs past `limit`.
fn wait_at_most(c: &mut std::process::Child, limit: Duration) -> Option<i32> {
    let end = std::time::Instant::now() + limit;
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return s.code();
        }
        if std::time::Instant::now() > end {
            let _ = c.kill();
            let _ = c.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
