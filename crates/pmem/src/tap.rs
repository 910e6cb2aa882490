//! The persist tap: a record of what a pool made durable, in the order it did, for an
//! MDS mirror (Orion §3.1, Mojim-style). Every [`Pool::persist`] appends the range's
//! bytes as they are at that moment, so a mirror that applies the records in order
//! passes through exactly the states the primary's media was made to hold: a prefix of
//! them is a state a power failure of the primary could have left, which recovery
//! already handles.
//!
//! A record is `offset: u64 LE, length: u32 LE, bytes`. [`apply_records`] checks every
//! length against the bytes received and the pool's size, and never panics on bad input.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::pool::{Pool, PoolError};

/// Bytes of a record's header.
pub const RECORD_HEADER: usize = 12;

#[derive(Default)]
pub(crate) struct PersistTap {
    on: AtomicBool,
    log: Mutex<Vec<u8>>,
}

impl PersistTap {
    #[inline]
    pub(crate) fn enabled(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    pub(crate) fn record(&self, off: u64, bytes: &[u8]) {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        push_record(&mut log, off, bytes);
    }
}

/// Appends one record to `out`. A range longer than `u32::MAX` goes as several.
pub fn push_record(out: &mut Vec<u8>, off: u64, bytes: &[u8]) {
    let mut off = off;
    for piece in bytes.chunks(u32::MAX as usize) {
        out.extend_from_slice(&off.to_le_bytes());
        out.extend_from_slice(&(piece.len() as u32).to_le_bytes());
        out.extend_from_slice(piece);
        off = off.wrapping_add(piece.len() as u64);
    }
}

/// The end of the first record of `log` starting at `at` (its header and bytes), or
/// None when `log` ends inside it.
pub fn record_end(log: &[u8], at: usize) -> Option<usize> {
    let head = log.get(at..at.checked_add(RECORD_HEADER)?)?;
    let len = u32::from_le_bytes(head[8..12].try_into().ok()?) as usize;
    let end = at.checked_add(RECORD_HEADER)?.checked_add(len)?;
    (end <= log.len()).then_some(end)
}

impl Pool {
    /// Starts (clearing what was recorded) or stops recording persists.
    pub fn record_persists(&self, on: bool) {
        let mut log = self.tap.log.lock().unwrap_or_else(|p| p.into_inner());
        log.clear();
        self.tap.on.store(on, Ordering::Release);
    }

    /// Whether persists are being recorded.
    pub fn recording_persists(&self) -> bool {
        self.tap.enabled()
    }

    /// Moves what was recorded since the last call into `out` (cleared first).
    pub fn take_persisted(&self, out: &mut Vec<u8>) {
        out.clear();
        let mut log = self.tap.log.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::swap(&mut *log, out);
    }

    /// Bytes recorded and not yet taken.
    pub fn persisted_backlog(&self) -> usize {
        self.tap.log.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Writes and persists, in order, every record of `log` (a mirror applying what
    /// its primary persisted). Returns how many records were applied; a malformed log
    /// or a record outside the pool is an error, after the records before it.
    pub fn apply_records(&self, log: &[u8]) -> Result<usize, PoolError> {
        let mut at = 0;
        let mut n = 0;
        while at < log.len() {
            let end = record_end(log, at).ok_or_else(|| {
                PoolError::Unsupported(
                    format!("a persist record at byte {at} runs past the message"),
                    self.path().to_owned(),
                )
            })?;
            let off = u64::from_le_bytes(log[at..at + 8].try_into().expect("8 bytes"));
            let bytes = &log[at + RECORD_HEADER..end];
            self.write(off, bytes)?;
            self.persist(off, bytes.len())?;
            at = end;
            n += 1;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ModeChoice;

    fn pool(name: &str) -> (Pool, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!("orion-tap-{name}-{}", std::process::id()));
        let p = Pool::create(&path, 1 << 16, ModeChoice::Auto).unwrap();
        (p, path)
    }

    #[test]
    fn a_mirror_applying_the_records_holds_what_was_persisted() {
        let (a, pa) = pool("a");
        let (b, pb) = pool("b");
        a.write(100, b"unpersisted").unwrap();
        a.record_persists(true);
        a.write(0, b"hello").unwrap();
        a.persist(0, 5).unwrap();
        a.write(0, b"HELLO world").unwrap(); // later bytes in the same range
        a.store_u64(4096, 7).unwrap();
        a.persist(4096, 8).unwrap();
        a.persist(0, 11).unwrap();
        let mut log = Vec::new();
        a.take_persisted(&mut log);
        assert_eq!(b.apply_records(&log).unwrap(), 3);
        assert_eq!(b.read_vec(0, 11).unwrap(), b"HELLO world");
        assert_eq!(b.load_u64(4096).unwrap(), 7);
        // Not persisted while recording: not sent.
        assert_eq!(b.read_vec(100, 11).unwrap(), vec![0; 11]);
        // Taken once.
        a.take_persisted(&mut log);
        assert!(log.is_empty());
        a.record_persists(false);
        a.persist(0, 5).unwrap();
        assert_eq!(a.persisted_backlog(), 0);
        let _ = std::fs::remove_file(pa);
        let _ = std::fs::remove_file(pb);
    }

    #[test]
    fn malformed_logs_are_refused_without_panicking() {
        let (b, pb) = pool("bad");
        let mut log = Vec::new();
        push_record(&mut log, 8, b"ok");
        let good = log.len();
        // A length past the end, a truncated header, an offset outside the pool.
        for bad in [
            {
                let mut l = log.clone();
                push_record(&mut l, 16, b"abcd");
                l.truncate(l.len() - 1);
                l
            },
            {
                let mut l = log.clone();
                l.extend_from_slice(&[1, 2, 3]);
                l
            },
            {
                let mut l = log.clone();
                push_record(&mut l, u64::MAX - 1, b"xy");
                l
            },
        ] {
            assert!(b.apply_records(&bad).is_err(), "{bad:?}");
        }
        assert_eq!(b.apply_records(&log[..good]).unwrap(), 1);
        let _ = std::fs::remove_file(pb);
    }
}
