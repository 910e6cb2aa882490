//! `orion-progress`: how far long work has come (formatting a pool, `fsck`, a resync,
//! a benchmark's setup). On a terminal it is a bar (indicatif) redrawn in place; on
//! anything else (a daemon's log, a pipe, CI) it is one plain log line per tenth of
//! the work, so captured output has no carriage returns and each line stands alone.
//!
//! The crates that do the work (`orion-pmem`, `orion-meta`) know nothing of this:
//! they call back with how much is done, and their callers hand them
//! [`Progress::set`].

use std::io::IsTerminal;
use std::time::Instant;

/// What the work counts in, for the lines it prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    /// Pool pages, inodes, ...: a plain count, named.
    Items(&'static str),
}

impl Unit {
    fn show(self, n: u64) -> String {
        match self {
            Unit::Bytes if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
            Unit::Bytes => format!("{:.0} MiB", n as f64 / (1u64 << 20) as f64),
            Unit::Items(what) => format!("{n} {what}"),
        }
    }
}

/// How one piece of long work reports (see the crate's documentation).
pub struct Progress {
    what: String,
    total: u64,
    unit: Unit,
    bar: Option<indicatif::ProgressBar>,
    /// The last tenth a line was printed for.
    tenth: u64,
    done: u64,
    started: Instant,
    message: String,
    finished: bool,
}

impl Progress {
    /// A bar if stderr is a terminal, lines otherwise. `total` 0 is taken as 1 (the
    /// work is done at its first step).
    pub fn new(what: impl Into<String>, total: u64, unit: Unit) -> Progress {
        let mut p = Progress::lines(what, total, unit);
        if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(p.total);
            let style = indicatif::ProgressStyle::with_template(
                "{prefix} [{bar:30}] {percent:>3} % {msg} ({elapsed})",
            )
            .expect("a valid template")
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_prefix(p.what.clone());
            p.bar = Some(bar);
        }
        p
    }

    /// Lines whatever stderr is.
    pub fn lines(what: impl Into<String>, total: u64, unit: Unit) -> Progress {
        Progress {
            what: what.into(),
            total: total.max(1),
            unit,
            bar: None,
            tenth: 0,
            done: 0,
            started: Instant::now(),
            message: String::new(),
            finished: false,
        }
    }

    /// `done` of the total is done (later calls may only grow it; a smaller value
    /// is ignored).
    pub fn set(&mut self, done: u64) {
        let done = done.min(self.total);
        if done < self.done {
            return;
        }
        self.done = done;
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            return;
        }
        let tenth = done * 10 / self.total;
        if tenth > self.tenth {
            self.tenth = tenth;
            self.line();
        }
    }

    /// What to say besides the share done (a rate, what was copied); shown with the
    /// next line or at once on a bar.
    pub fn say(&mut self, message: impl Into<String>) {
        self.message = message.into();
        if let Some(bar) = &self.bar {
            bar.set_message(self.message.clone());
        }
    }

    /// What the work does now (a step's name): the bar's message at once, or a line
    /// of its own, so that a log names a step that hangs.
    pub fn note(&mut self, message: impl Into<String>) {
        self.say(message);
        if self.bar.is_none() {
            tracing::info!("{}: {}", self.what, self.message);
        }
    }

    /// The work is over: the bar stays on screen as it ended; a line says so unless
    /// the last one already said 100 %.
    pub fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        // Work may end before its estimate (a resync with less to copy than the pool
        // holds): finished is all of it.
        self.done = self.total;
        if let Some(bar) = &self.bar {
            bar.set_position(self.total);
            bar.finish();
            return;
        }
        if self.tenth < 10 {
            self.tenth = 10;
            self.line();
        }
    }

    fn line(&self) {
        let extra = match self.message.is_empty() {
            true => String::new(),
            false => format!(", {}", self.message),
        };
        tracing::info!(
            "{}: {}0 % ({} of {}) in {:.1} s{extra}",
            self.what,
            self.tenth,
            self.unit.show(self.done),
            self.unit.show(self.total),
            self.started.elapsed().as_secs_f64()
        );
    }
}

impl Drop for Progress {
    /// A bar left behind by an error is cleared: it would stay half-drawn under the
    /// error message. Lines need nothing.
    fn drop(&mut self) {
        if let (Some(bar), false) = (&self.bar, self.finished) {
            bar.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_read_as_people_read_them() {
        assert_eq!(Unit::Bytes.show(3 << 30), "3.0 GiB");
        assert_eq!(Unit::Bytes.show(512 << 20), "512 MiB");
        assert_eq!(Unit::Items("pages").show(7), "7 pages");
    }

    #[test]
    fn lines_come_once_per_tenth_and_the_count_never_goes_back() {
        let mut p = Progress::lines("work", 100, Unit::Items("steps"));
        p.set(5);
        assert_eq!(p.tenth, 0);
        p.set(35);
        assert_eq!(p.tenth, 3);
        p.set(20);
        assert_eq!((p.tenth, p.done), (3, 35));
        p.set(1000);
        assert_eq!((p.tenth, p.done), (10, 100));
        p.finish();
        assert!(p.finished);
    }

    #[test]
    fn empty_work_is_done_at_its_first_step() {
        let mut p = Progress::lines("nothing", 0, Unit::Bytes);
        p.set(0);
        assert_eq!(p.tenth, 0);
        p.set(1);
        assert_eq!(p.tenth, 10);
    }
}
