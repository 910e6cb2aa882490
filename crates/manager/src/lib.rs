//! `orion-manager`: the cluster manager (Assise §3.4; DESIGN.md, the fail-over issue).
//!
//! It answers one question for the MDSs: which of them is the primary, under which
//! epoch, and for how long. The primary holds the role by a lease it renews; one that
//! cannot renew stops acknowledging before its lease ends ([`Term::expires`]), so when
//! the lease lapses the mirror may take the role, with a higher epoch, and nothing the
//! old primary says afterwards is believed. The manager never runs a consensus protocol
//! of its own: [`etcd::EtcdManager`] keeps the role in etcd (a key under a lease,
//! taken by a transaction that also bumps the epoch); on one host,
//! [`embedded::EmbeddedManager`] asks a lease service in a process that outlives the
//! MDSs ([`embedded::EmbeddedServer`]).

pub mod embedded;
pub mod etcd;
pub mod etcd_server;

use std::time::{Duration, Instant};

use anyhow::Result;

/// The MDS that holds the primary role, as the manager records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Primary {
    /// The MDS's name (unique in the cluster).
    pub name: String,
    /// Where clients and stores reach it.
    pub addr: String,
    /// The epoch it serves under: every fail-over takes a higher one.
    pub epoch: u64,
    /// How long its lease lasts without a renewal, as the manager sees it now (for
    /// `orion status`; not compared).
    pub remaining: Option<Duration>,
}

/// The primary role as its holder sees it.
#[derive(Clone, Debug)]
pub struct Term {
    pub epoch: u64,
    /// When the lease may have ended, by this host's clock: the time the last grant or
    /// renewal was asked for, plus the TTL (the manager's clock starts later, so its
    /// lease ends after this). The holder acknowledges nothing past it.
    pub expires: Instant,
    pub(crate) lease: i64,
    pub(crate) ttl: Duration,
}

impl Term {
    /// Whether the holder may still act as primary.
    pub fn holds(&self, now: Instant) -> bool {
        now < self.expires
    }
}

/// Refuses an MDS name or address the records cannot hold (names are listed with
/// commas, records are split at spaces).
pub(crate) fn check_candidate(name: &str, addr: &str) -> Result<()> {
    if name.is_empty()
        || addr.is_empty()
        || name.contains(|c: char| c == ',' || c.is_whitespace())
        || addr.contains(char::is_whitespace)
    {
        anyhow::bail!(
            "an MDS name {name:?} (no spaces or commas) and an address {addr:?} (no spaces) \
             are needed"
        );
    }
    Ok(())
}

/// Encodes a list of MDS names for a manager's record ("-" when empty).
pub(crate) fn names_record(names: &[&str]) -> Result<String> {
    if names
        .iter()
        .any(|n| n.is_empty() || n.contains(',') || n.contains(char::is_whitespace))
    {
        anyhow::bail!("MDS names {names:?} must be non-empty, without commas or spaces");
    }
    Ok(if names.is_empty() {
        "-".into()
    } else {
        names.join(",")
    })
}

/// Decodes [`names_record`].
pub(crate) fn parse_names(record: &str) -> Vec<String> {
    match record.trim() {
        "" | "-" => Vec::new(),
        r => r.split(',').map(str::to_string).collect(),
    }
}

/// One interface, one implementation per kind of cluster manager.
pub trait Manager: Send {
    /// What it is, for `orion status` ("etcd", "embedded").
    fn kind(&self) -> &'static str;
    /// Takes the primary role for the MDS `name` at `addr` if nobody holds it and `name`
    /// may take it (see [`Manager::set_eligible`]), with a lease of `ttl`, under the
    /// next epoch; the new holder is then the only MDS eligible. `None` while another
    /// holds the role, or while `name` is not eligible.
    fn try_acquire(&mut self, name: &str, addr: &str, ttl: Duration) -> Result<Option<Term>>;
    /// Records, as the holder of `term`, which MDSs hold every acknowledged update and
    /// may therefore take the role after it: the primary itself, and its mirror while
    /// that is in sync. False when the term is over. Before anything is acknowledged
    /// without the mirror, the mirror is taken off this list: a stale mirror never
    /// becomes primary.
    fn set_eligible(&mut self, term: &Term, names: &[&str]) -> Result<bool>;
    /// The MDSs that may take the role (empty: any, as before the first primary).
    fn eligible(&mut self) -> Result<Vec<String>>;
    /// Ends the term of `epoch` now, if it still holds the role and `by` is still
    /// eligible (checked in the same step): its mirror saw the primary's connection
    /// go and need not wait for the lease to lapse. True when the term ended. Safe
    /// even when the primary lives on: it acknowledges nothing its mirror lacks
    /// unless the manager first lists it alone, after which this is refused; a
    /// primary that dropped its mirror and closed the connection (having listed
    /// itself alone first) is therefore never ended by it.
    fn end_term(&mut self, epoch: u64, by: &str) -> Result<bool>;
    /// Renews the lease of `term`; false when it was lost (it lapsed, or was revoked):
    /// the holder is no longer primary.
    fn renew(&mut self, term: &mut Term) -> Result<bool>;
    /// Who holds the role now, if anyone.
    fn primary(&mut self) -> Result<Option<Primary>>;
    /// Gives the role up at once (a clean stop), so a mirror need not wait the lease.
    fn resign(&mut self, term: Term) -> Result<()>;
    /// Records the cluster map (the replication groups' members, their states and the
    /// map's epoch, as text of at most [`MAX_MAP`] bytes) as the holder of `term`:
    /// the map's home with a manager, from which each new primary starts. False when
    /// the term is over.
    fn save_map(&mut self, term: &Term, map: &str) -> Result<bool>;
    /// The cluster map saved last, if any.
    fn map(&mut self) -> Result<Option<String>>;
}

/// The largest cluster map a manager keeps (a member takes ~60 bytes).
pub const MAX_MAP: usize = 48 * 1024;

/// Refuses a cluster map a manager cannot keep.
pub(crate) fn check_map(map: &str) -> Result<()> {
    if map.len() > MAX_MAP {
        anyhow::bail!(
            "a cluster map of {} bytes: at most {MAX_MAP} are kept",
            map.len()
        );
    }
    if map.contains(['|', '\r']) || map.trim().is_empty() {
        anyhow::bail!("a cluster map is non-empty lines without '|'");
    }
    Ok(())
}
