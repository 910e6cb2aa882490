//! Where `orion` logs. A command run by hand logs to stderr (`RUST_LOG`, default
//! `info`; colours on a terminal). A daemon `orion up` starts logs to a file in the
//! state directory's `logs/`, named by the environment (`ORION_LOG_FILE`), and so
//! does `orion up` itself (`up.log`).
//!
//! Log files are rotated by size, as logrotate would name them: past
//! `ORION_LOG_ROTATE_BYTES` (16 MiB unless set) `NAME.log` becomes `NAME.log.1`,
//! `.1` becomes `.2`, and the oldest of the [`KEEP`] old files goes. A daemon's
//! stderr follows the rotation (the new file is put in its place), so a panic or an
//! error printed outside the log lands in the current file too. No crate rotates a
//! process's own stderr, hence this small writer.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use anyhow::{Context, Result};
use tracing_subscriber::fmt::MakeWriter;

/// The file a daemon logs to (set by `orion up` for each daemon it starts).
pub const LOG_FILE_ENV: &str = "ORION_LOG_FILE";
/// The size past which a log file is rotated.
pub const ROTATE_BYTES_ENV: &str = "ORION_LOG_ROTATE_BYTES";
/// Old files kept besides the current one.
pub const KEEP: u32 = 4;
const DEFAULT_ROTATE_BYTES: u64 = 16 << 20;

fn filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
}

/// Logs to the file `ORION_LOG_FILE` names (with stderr put on it too), or else to
/// stderr.
pub fn init() -> Result<()> {
    match std::env::var_os(LOG_FILE_ENV) {
        Some(path) => {
            // Not passed on: what this process starts logs where it is told.
            std::env::remove_var(LOG_FILE_ENV);
            to_file(Path::new(&path), true)
        }
        None => {
            tracing_subscriber::fmt()
                .with_env_filter(filter())
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .init();
            Ok(())
        }
    }
}

/// Logs to `path`, appended to and rotated; with `stderr`, the process's stderr is
/// the same file, through every rotation.
pub fn to_file(path: &Path, stderr: bool) -> Result<()> {
    let limit = std::env::var(ROTATE_BYTES_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &u64| n > 0)
        .unwrap_or(DEFAULT_ROTATE_BYTES);
    let stderr_fd = stderr.then_some(2);
    let log = Rotating::open(path, limit, KEEP, stderr_fd)?;
    tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(log)
        .with_ansi(false)
        .init();
    Ok(())
}

/// A log file rotated by size (see the module's documentation).
pub struct Rotating {
    path: PathBuf,
    limit: u64,
    keep: u32,
    /// A descriptor made to follow the current file (the process's stderr).
    follower: Option<i32>,
    current: Mutex<Current>,
}

struct Current {
    file: File,
    bytes: u64,
}

fn open_append(path: &Path) -> Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening the log {}", path.display()))
}

impl Rotating {
    /// Opens (appends to) the log at `path`; `follower`, if given, is made a copy of
    /// its descriptor now and after every rotation.
    pub fn open(path: &Path, limit: u64, keep: u32, follower: Option<i32>) -> Result<Rotating> {
        let file = open_append(path)?;
        let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
        if let Some(fd) = follower {
            follow(&file, fd).context("putting the log on stderr")?;
        }
        Ok(Rotating {
            path: path.to_path_buf(),
            limit,
            keep: keep.max(1),
            follower,
            current: Mutex::new(Current { file, bytes }),
        })
    }

    fn numbered(&self, n: u32) -> PathBuf {
        let mut s = self.path.as_os_str().to_owned();
        s.push(format!(".{n}"));
        PathBuf::from(s)
    }

    /// Shifts the old files up by one (the oldest goes), moves the current one to
    /// `.1`, and starts a new one. On an error the current file stays in use: a log
    /// that cannot rotate grows rather than loses lines.
    fn rotate(&self, cur: &mut Current) -> std::io::Result<()> {
        for n in (1..self.keep).rev() {
            match std::fs::rename(self.numbered(n), self.numbered(n + 1)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        std::fs::rename(&self.path, self.numbered(1))?;
        let file = match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
        {
            Ok(f) => f,
            Err(e) => {
                // The file in use keeps its name: the next rotation would shift it
                // away as an old one.
                let _ = std::fs::rename(self.numbered(1), &self.path);
                return Err(e);
            }
        };
        if let Some(fd) = self.follower {
            follow(&file, fd)?;
        }
        *cur = Current { file, bytes: 0 };
        Ok(())
    }
}

/// Makes descriptor `fd` another descriptor of `file`.
fn follow(file: &File, fd: i32) -> std::io::Result<()> {
    // SAFETY: dup2 takes two descriptor numbers and no memory; `file` is open for
    // the whole call, and `fd` (stderr) is one this process owns for its lifetime.
    let r = unsafe { libc::dup2(file.as_raw_fd(), fd) };
    match r {
        -1 => Err(std::io::Error::last_os_error()),
        _ => Ok(()),
    }
}

/// One event being written: the file is held for the whole event, so events from
/// different threads never interleave and a rotation falls between two of them.
pub struct EventWriter<'a> {
    log: &'a Rotating,
    current: MutexGuard<'a, Current>,
}

impl Write for EventWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.current.bytes > 0 && self.current.bytes + buf.len() as u64 > self.log.limit {
            if let Err(e) = self.log.rotate(&mut self.current) {
                let note = format!("orion: cannot rotate this log: {e}\n");
                let _ = self.current.file.write_all(note.as_bytes());
                self.current.bytes = 0; // tried again after another limit's worth
            }
        }
        let n = self.current.file.write(buf)?;
        self.current.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.current.file.flush()
    }
}

impl<'a> MakeWriter<'a> for Rotating {
    type Writer = EventWriter<'a>;

    fn make_writer(&'a self) -> EventWriter<'a> {
        EventWriter {
            log: self,
            current: self.current.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap_or_default()
    }

    #[test]
    fn a_full_log_moves_to_dot_1_and_the_oldest_goes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.log");
        std::fs::write(&path, "from an earlier run\n").unwrap();
        // A descriptor standing for stderr: it must follow every rotation.
        let stand_in = open_append(&dir.path().join("elsewhere")).unwrap();
        let fd = stand_in.as_raw_fd();
        let log = Rotating::open(&path, 100, 2, Some(fd)).unwrap();
        let mut all = String::from("from an earlier run\n");
        for i in 0..20 {
            let line = format!("event {i:02} with some words to fill\n");
            all += &line;
            log.make_writer().write_all(line.as_bytes()).unwrap();
        }
        let (now, one, two) = (read(&path), read(&log.numbered(1)), read(&log.numbered(2)));
        assert!(!log.numbered(3).exists(), "more than two old files kept");
        for f in [&now, &one, &two] {
            assert!(!f.is_empty() && f.len() <= 100, "{f:?}");
        }
        // Nothing lost or reordered within what is kept, and no event split.
        let kept = two.clone() + &one + &now;
        assert!(all.ends_with(&kept), "{kept:?}");
        assert!(now.ends_with("event 19 with some words to fill\n"));
        // The stand-in for stderr writes into the current file.
        let mut stderr = dup_of(fd);
        stderr.write_all(b"a panic message\n").unwrap();
        assert!(
            read(&path).ends_with("a panic message\n"),
            "{}",
            read(&path)
        );
    }

    /// A second File on the descriptor number `fd` (dup of it, owned).
    fn dup_of(fd: i32) -> File {
        use std::os::fd::BorrowedFd;
        // SAFETY: `fd` is the stand-in descriptor, open for the whole test.
        let b = unsafe { BorrowedFd::borrow_raw(fd) };
        File::from(b.try_clone_to_owned().unwrap())
    }

    #[test]
    fn a_log_reopened_counts_what_it_holds_already() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.log");
        std::fs::write(&path, "x".repeat(90)).unwrap();
        let log = Rotating::open(&path, 100, 4, None).unwrap();
        log.make_writer()
            .write_all(b"twenty bytes of log\n")
            .unwrap();
        assert_eq!(read(&log.numbered(1)).len(), 90);
        assert_eq!(read(&path), "twenty bytes of log\n");
    }
}
