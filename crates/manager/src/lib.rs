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

/// One interface, one implementation per kind of cluster manager.
pub trait Manager: Send {
    /// What it is, for `orion status` ("etcd", "embedded").
    fn kind(&self) -> &'static str;
    /// Takes the primary role for the MDS `name` at `addr` if nobody holds it, with a
    /// lease of `ttl`, under the next epoch. `None` while another holds it.
    fn try_acquire(&mut self, name: &str, addr: &str, ttl: Duration) -> Result<Option<Term>>;
    /// Renews the lease of `term`; false when it was lost (it lapsed, or was revoked):
    /// the holder is no longer primary.
    fn renew(&mut self, term: &mut Term) -> Result<bool>;
    /// Who holds the role now, if anyone.
    fn primary(&mut self) -> Result<Option<Primary>>;
    /// Gives the role up at once (a clean stop), so a mirror need not wait the lease.
    fn resign(&mut self, term: Term) -> Result<()>;
}
