//! The local file system works the same in every pool mode this machine can map.

use std::sync::Arc;

use orion_meta::{LocalConfig, LocalFs, LogicalClock, RenameMode, ROOT_INO};
use orion_pmem::{Mode, ModeChoice};

fn workload_and_remount(dir: &std::path::Path, mode: ModeChoice, expect: Mode) {
    let path = dir.join("fs");
    let (m, d) = LocalFs::mkfs(&path, 16 << 20, mode, 1).unwrap();
    assert_eq!((m.mode(), d.mode()), (expect, expect));
    drop((m, d));
    let cfg = LocalConfig {
        mode,
        ..Default::default()
    };
    let (fs, _) = LocalFs::open_path(&path, Arc::new(LogicalClock::new(1)), &cfg).unwrap();
    let dir_ino = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(dir_ino, b"f", 0o644, 0, 0).unwrap().ino;
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    fs.write(f, 1000, &data).unwrap();
    fs.rename(dir_ino, b"f", ROOT_INO, b"g", RenameMode::Replace)
        .unwrap();
    drop(fs);
    let (fs, _) = LocalFs::open_path(&path, Arc::new(LogicalClock::new(1)), &cfg).unwrap();
    let g = fs.lookup(ROOT_INO, b"g").unwrap().ino;
    assert_eq!(fs.read(g, 1000, 20_000).unwrap(), data);
    assert_eq!(fs.read(g, 0, 1000).unwrap(), vec![0; 1000]);
    assert!(fs.check().is_clean());
}

#[test]
fn msync_mode_on_a_disk_file_system() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    workload_and_remount(dir.path(), ModeChoice::Auto, Mode::Msync);
}

#[test]
fn volatile_mode_is_auto_on_tmpfs_and_can_be_forced() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    workload_and_remount(dir.path(), ModeChoice::Auto, Mode::Volatile);
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    workload_and_remount(
        disk.path(),
        ModeChoice::Force(Mode::Volatile),
        Mode::Volatile,
    );
}
