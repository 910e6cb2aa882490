//! Optimistic persistence's side of the data path: staged writes commit in one log
//! commit per file (when due, at fsync and close, before any other call), and a
//! failure to commit is kept for the file's next fsync or close to report.

use orion_meta::FsError;
use orion_proto::Commit;

use super::DataPath;
use crate::commit::send_commit;
use crate::remote::{Fail, Res};

impl DataPath<'_> {
    /// Commits the writes staged for `ino`, in one log commit. A refused commit gives
    /// its pages back; any failure is kept for the file's next fsync or close to
    /// report (the writes were acknowledged already).
    pub fn flush(&mut self, ino: u64) -> Res<()> {
        let Some(f) = self.staging.take(ino) else {
            return Ok(());
        };
        let commit = Commit {
            ino,
            generation: f.generation,
            expect: None,
            persisted_locally: f.persisted_locally,
            entries: f.entries,
        };
        let (commit, sent) = send_commit(self.remote, commit);
        match sent {
            Ok((prev, tail)) => {
                self.cache
                    .committed(ino, f.generation, &commit.entries, prev, tail);
                Ok(())
            }
            Err(Fail::Fs(e)) => {
                if matches!(e, FsError::Errno(_)) {
                    self.chunks.give_back(f.runs);
                }
                self.staging.record_failure(ino, f.generation, e);
                Ok(())
            }
            Err(Fail::Reconnected) => {
                // Whether the commit landed is unknown: say the writes may be lost.
                self.staging
                    .record_failure(ino, f.generation, FsError::Errno(libc::EIO));
                Err(Fail::Reconnected)
            }
        }
    }

    /// After the MDS connection was re-established: the chunks were taken back, and
    /// so were the pages of staged writes, which will not commit now.
    pub fn reconnected(&mut self) {
        self.chunks.clear();
        for ino in self.staging.files() {
            if let Some(f) = self.staging.take(ino) {
                self.staging
                    .record_failure(ino, f.generation, FsError::Errno(libc::EIO));
            }
        }
    }

    /// Commits every staged write.
    pub fn flush_all(&mut self) -> Res<()> {
        for ino in self.staging.files() {
            self.flush(ino)?;
        }
        Ok(())
    }

    /// Commits what is staged for `ino` and reports the first failure to commit a
    /// staged write of it since the last report (fsync and close).
    pub fn settle(&mut self, ino: u64, generation: u64) -> Res<()> {
        self.flush(ino)?;
        match self.staging.take_failure(ino, generation) {
            Some(e) => Err(Fail::Fs(e)),
            None => Ok(()),
        }
    }
}
