//! Optimistic persistence's side of the data path: staged writes commit in one log
//! commit per file (when due, at fsync and close, before any other call), and a
//! failure to commit is kept for the file's next fsync or close to report.

use orion_format::PAGE_SIZE;
use orion_meta::FsError;
use orion_proto::{Commit, Epoch};

use super::DataPath;
use crate::commit::send_commit;
use crate::remote::{Fail, Res};
use crate::staging::StagedRun;

/// How often staged writes are copied again to a changed map before they fail.
const MAP_CHANGES: usize = 8;

impl DataPath<'_> {
    /// Commits the writes staged for `ino`, in one log commit. A refused commit gives
    /// its pages back; any failure is kept for the file's next fsync or close to
    /// report (the writes were acknowledged already).
    pub fn flush(&mut self, ino: u64) -> Res<()> {
        let Some(mut f) = self.staging.take(ino) else {
            return Ok(());
        };
        for _ in 0..MAP_CHANGES {
            let commit = Commit {
                ino,
                generation: f.generation,
                expect: None,
                persisted_locally: f.persisted_locally,
                written_epoch: f.written_epoch,
                entries: std::mem::take(&mut f.entries),
            };
            let (commit, sent) = send_commit(self.remote, self.cache, commit);
            f.entries = commit.entries;
            // The commit gave its entries back whole: a run per entry (`Staging::stage`),
            // which a refusal gives back and a changed map copies again.
            assert_eq!(
                f.entries.len(),
                f.runs.len(),
                "inode {ino}: staged entries lost"
            );
            match sent {
                Ok(_) => return Ok(()),
                // A store took writes only after these pages went out: copy them to
                // every store that takes writes now, and commit again.
                Err(Fail::MapChanged) => match self.replicate_again(&mut f.runs, f.written_epoch) {
                    Ok((epoch, local)) => {
                        f.written_epoch = epoch;
                        f.persisted_locally = local;
                    }
                    Err(Fail::Fs(e)) => {
                        self.staging.record_failure(ino, f.generation, e);
                        return Ok(());
                    }
                    Err(e) => return self.lost(ino, f.generation, e),
                },
                Err(Fail::Fs(e)) => {
                    if e.is_refusal() {
                        self.chunks
                            .give_back(f.runs.iter().map(|r| (r.gpa, r.pages)).collect());
                    }
                    self.staging.record_failure(ino, f.generation, e);
                    return Ok(());
                }
                Err(e @ Fail::Reconnected) => return self.lost(ino, f.generation, e),
            }
        }
        let e = FsError::Io("the cluster map keeps changing".into());
        self.staging.record_failure(ino, f.generation, e);
        Ok(())
    }

    /// Whether the commit landed is unknown: the writes may be lost, which the file's
    /// next fsync or close says.
    fn lost(&mut self, ino: u64, generation: u64, e: Fail) -> Res<()> {
        self.staging
            .record_failure(ino, generation, FsError::Errno(libc::EIO));
        Err(e)
    }

    /// Copies staged pages (from the stores that took them) to every store that takes
    /// writes now; returns the epoch they went out under, and whether this client's
    /// own store holds them persisted.
    fn replicate_again(&mut self, runs: &mut [StagedRun], written: Epoch) -> Res<(Epoch, bool)> {
        let epoch = self.remote.epoch;
        let own = self.remote.internal_group();
        let mut local = true;
        for run in runs.iter_mut() {
            let (g, n) = (run.gpa, run.pages);
            let mut buf = vec![0u8; (n * PAGE_SIZE) as usize];
            // From a store that took them: one that joined since lacks them.
            self.remote
                .read_written(g, n as usize, &mut buf, written, run.to)?;
            run.to = self.remote.deliver_pages(g, &buf)?;
            local &= run.to.local || Some(g.group()) != own;
        }
        Ok((epoch, local))
    }

    /// After the MDS connection was re-established: the chunks were taken back, and
    /// so were the pages of staged writes, which will not commit now.
    pub fn reconnected(&mut self) {
        self.chunks.clear();
        self.forget_if_term_changed();
        for ino in self.staging.files() {
            if let Some(f) = self.staging.take(ino) {
                self.staging
                    .record_failure(ino, f.generation, FsError::Errno(libc::EIO));
            }
        }
    }

    /// Drops the cached inodes and pages if another MDS took over since the last call.
    pub fn forget_if_term_changed(&mut self) {
        if self.remote.take_term_changed() {
            // Another MDS took over: its logs may end before what this client read
            // one-sided of its predecessor's (updates never acknowledged), and pages
            // freed before the fail-over may be handed out again sooner.
            self.cache.map.clear();
            self.pages.clear();
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
