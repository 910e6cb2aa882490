//! The cluster manager of real clusters: etcd (Debian's `etcd-server`, 3.4).
//!
//! Keys, under `/orion/<cluster>/`: `primary` holds "epoch name addr" and is attached
//! to the holder's lease, so etcd deletes it when the lease lapses; `epoch` holds the
//! last epoch handed out. Taking the role is one transaction: if `primary` does not
//! exist and `epoch` is still the value read, write both. The client is async (tonic);
//! this type owns a small runtime and blocks on it, since the MDS is threads, not
//! tasks, and every call has a deadline.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn,
    TxnOp,
};

use crate::{Manager, Primary, Term};

pub struct EtcdManager {
    rt: tokio::runtime::Runtime,
    client: Client,
    endpoints: String,
    primary_key: String,
    epoch_key: String,
    eligible_key: String,
    map_key: String,
    timeout: Duration,
    /// The keep-alive stream of the lease held, if any.
    keeper: Option<(i64, LeaseKeeper, LeaseKeepAliveStream)>,
}

/// How long the first contact with etcd may take.
const FIRST_CONTACT: Duration = Duration::from_secs(5);

impl EtcdManager {
    /// Connects to etcd at `endpoints` ("host:port", comma-separated) for the cluster
    /// named `cluster`; each call gives up after `timeout`.
    pub fn connect(endpoints: &str, cluster: &str, timeout: Duration) -> Result<EtcdManager> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the etcd client's runtime")?;
        let urls: Vec<String> = endpoints
            .split(',')
            .map(|e| e.trim())
            .filter(|e| !e.is_empty())
            .map(|e| {
                if e.contains("://") {
                    e.to_string()
                } else {
                    format!("http://{e}")
                }
            })
            .collect();
        if urls.is_empty() {
            bail!("no etcd endpoint given");
        }
        // The first contact may take longer than a call may (an etcd that just started
        // on a loaded host answers its first request late): no lease depends on it.
        // Each later call is cut at `timeout` (`call`).
        let first = timeout.max(FIRST_CONTACT);
        let opts = ConnectOptions::new()
            .with_connect_timeout(first)
            .with_timeout(first);
        let client = rt
            .block_on(async {
                tokio::time::timeout(first, async {
                    let mut c = Client::connect(urls, Some(opts)).await?;
                    // The connection is lazy: ask something, so that a missing etcd is
                    // said now.
                    c.status().await?;
                    Ok::<_, etcd_client::Error>(c)
                })
                .await
            })
            .map_err(|_| anyhow!("etcd at {endpoints} does not answer within {first:?}"))?
            .map_err(|e| anyhow!("etcd at {endpoints} does not answer: {e}"))?;
        Ok(EtcdManager {
            rt,
            client,
            endpoints: endpoints.to_string(),
            primary_key: format!("/orion/{cluster}/primary"),
            epoch_key: format!("/orion/{cluster}/epoch"),
            eligible_key: format!("/orion/{cluster}/eligible"),
            map_key: format!("/orion/{cluster}/map"),
            timeout,
            keeper: None,
        })
    }

    /// Writes `value` at `key` only while `term`'s record of the role is the one in
    /// etcd (its epoch, its lease); false when the term is over.
    fn put_as_holder(
        &mut self,
        term: &Term,
        key: String,
        value: String,
        what: &str,
    ) -> Result<bool> {
        let mut client = self.client.clone();
        let txn = Txn::new()
            .when([
                Compare::value(
                    self.epoch_key.clone(),
                    CompareOp::Equal,
                    term.epoch.to_string(),
                ),
                Compare::lease(self.primary_key.clone(), CompareOp::Equal, term.lease),
            ])
            .and_then([TxnOp::put(key, value, None)]);
        Ok(self.call(what, client.txn(txn))?.succeeded())
    }

    /// Runs one etcd call with this manager's deadline.
    fn call<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        self.rt
            .block_on(async { tokio::time::timeout(self.timeout, f).await })
            .map_err(|_| {
                anyhow!(
                    "etcd at {}: {what}: no answer within {:?}",
                    self.endpoints,
                    self.timeout
                )
            })?
            .map_err(|e| anyhow!("etcd at {}: {what}: {e}", self.endpoints))
    }
}

/// The names of an eligibility record; a damaged one is an error, not "anyone".
fn names_of(v: &[u8]) -> Result<Vec<String>> {
    let text = std::str::from_utf8(v).context("the eligibility record is not text")?;
    Ok(crate::parse_names(text))
}

impl EtcdManager {
    /// The primary record and the lease it is attached to, if a primary holds the role.
    fn primary_record(&mut self) -> Result<Option<(Primary, i64)>> {
        let key = self.primary_key.clone();
        self.get_one(key, "reading the primary")?
            .map(|kv| Ok((parse_primary(kv.value())?, kv.lease())))
            .transpose()
    }

    /// The list of MDSs that may take the role, as etcd keeps it.
    fn eligible_record(&mut self) -> Result<Option<etcd_client::KeyValue>> {
        let key = self.eligible_key.clone();
        self.get_one(key, "reading who may take the role")
    }

    /// The key-value pair at `key`, if any.
    fn get_one(&mut self, key: String, what: &str) -> Result<Option<etcd_client::KeyValue>> {
        let mut client = self.client.clone();
        let got = self.call(what, client.get(key, None))?;
        Ok(got.kvs().first().cloned())
    }
}

/// etcd counts leases in whole seconds.
fn ttl_secs(ttl: Duration) -> i64 {
    (ttl.as_millis().div_ceil(1000) as i64).max(1)
}

fn parse_primary(v: &[u8]) -> Result<Primary> {
    let text = std::str::from_utf8(v).context("the primary record is not text")?;
    let mut f = text.split_whitespace();
    match (f.next(), f.next(), f.next(), f.next()) {
        (Some(e), Some(name), Some(addr), None) => Ok(Primary {
            epoch: e.parse().context("the primary record's epoch")?,
            name: name.to_string(),
            addr: addr.to_string(),
            remaining: None,
        }),
        _ => bail!("the primary record {text:?} is not \"epoch name addr\""),
    }
}

impl Manager for EtcdManager {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn try_acquire(&mut self, name: &str, addr: &str, ttl: Duration) -> Result<Option<Term>> {
        crate::check_candidate(name, addr)?;
        let mut client = self.client.clone();
        let epoch_key = self.epoch_key.clone();
        let got = self.call("reading the epoch", client.get(epoch_key.clone(), None))?;
        let (last, version) = match got.kvs().first() {
            Some(kv) => {
                let text = std::str::from_utf8(kv.value()).unwrap_or("");
                let e: u64 = text
                    .trim()
                    .parse()
                    .map_err(|_| anyhow!("the epoch record {text:?} is not a number"))?;
                (e, kv.version())
            }
            None => (0, 0),
        };
        if self.primary()?.is_some() {
            return Ok(None);
        }
        let (eligible, eligible_version) = match self.eligible_record()? {
            Some(kv) => (names_of(kv.value())?, kv.version()),
            None => (Vec::new(), 0),
        };
        if !eligible.is_empty() && !eligible.iter().any(|e| e == name) {
            return Ok(None);
        }
        let asked = Instant::now();
        let lease = self.call("granting a lease", client.lease_grant(ttl_secs(ttl), None))?;
        let epoch = last + 1;
        let txn = Txn::new()
            .when([
                Compare::create_revision(self.primary_key.clone(), CompareOp::Equal, 0),
                Compare::version(epoch_key.clone(), CompareOp::Equal, version),
                Compare::version(
                    self.eligible_key.clone(),
                    CompareOp::Equal,
                    eligible_version,
                ),
            ])
            .and_then([
                TxnOp::put(
                    self.primary_key.clone(),
                    format!("{epoch} {name} {addr}"),
                    Some(PutOptions::new().with_lease(lease.id())),
                ),
                TxnOp::put(epoch_key, epoch.to_string(), None),
                TxnOp::put(self.eligible_key.clone(), name, None),
            ]);
        let won = match self.call("taking the primary role", client.txn(txn)) {
            Ok(r) => r.succeeded(),
            Err(e) => {
                // Whether it won is unknown: the lease goes, and the role with it.
                let _ = self.call("revoking a lease", client.lease_revoke(lease.id()));
                return Err(e);
            }
        };
        if !won {
            // Another took it (or the epoch moved) meanwhile.
            let _ = self.call("revoking an unused lease", client.lease_revoke(lease.id()));
            return Ok(None);
        }
        let kept = self.call(
            "keeping the lease alive",
            client.lease_keep_alive(lease.id()),
        );
        let (keeper, stream) = match kept {
            Ok(k) => k,
            Err(e) => {
                let _ = self.call("revoking a lease", client.lease_revoke(lease.id()));
                return Err(e);
            }
        };
        self.keeper = Some((lease.id(), keeper, stream));
        let ttl = Duration::from_secs(lease.ttl().max(1) as u64);
        Ok(Some(Term {
            epoch,
            expires: asked + ttl,
            lease: lease.id(),
            ttl,
        }))
    }

    fn renew(&mut self, term: &mut Term) -> Result<bool> {
        let asked = Instant::now();
        let (mut keeper, mut stream) = match self.keeper.take() {
            Some((id, k, s)) if id == term.lease => (k, s),
            // A renewal failed before: a new stream, whose answers are all this one's.
            _ => {
                let mut client = self.client.clone();
                self.call(
                    "keeping the lease alive",
                    client.lease_keep_alive(term.lease),
                )?
            }
        };
        let answer = self.call("renewing the lease", async {
            keeper.keep_alive().await?;
            stream.message().await
        });
        let ttl = match answer {
            Ok(Some(r)) => r.ttl(),
            Ok(None) => 0,
            // The stream is dropped: a late answer to this keep-alive must not count for
            // the next one, asked later. The term runs out by the clock unless a renewal
            // gets through.
            Err(e) => return Err(e),
        };
        if ttl <= 0 {
            return Ok(false); // lapsed: etcd deleted the primary key with it
        }
        // The lease lives, but the role is this term's only while its record is: a
        // mirror may have ended the term by deleting it.
        let ours = self
            .primary_record()?
            .is_some_and(|(p, lease)| p.epoch == term.epoch && lease == term.lease);
        if !ours {
            return Ok(false);
        }
        term.expires = asked + term.ttl;
        self.keeper = Some((term.lease, keeper, stream));
        Ok(true)
    }

    fn primary(&mut self) -> Result<Option<Primary>> {
        let Some((mut p, lease)) = self.primary_record()? else {
            return Ok(None);
        };
        let mut client = self.client.clone();
        // What is left of the holder's lease (informative: a failed ask leaves it out).
        if let Ok(t) = self.call("reading the lease", client.lease_time_to_live(lease, None)) {
            p.remaining = (t.ttl() >= 0).then(|| Duration::from_secs(t.ttl() as u64));
        }
        Ok(Some(p))
    }

    fn resign(&mut self, term: Term) -> Result<()> {
        self.keeper = None;
        let mut client = self.client.clone();
        self.call("revoking the lease", client.lease_revoke(term.lease))?;
        Ok(())
    }

    fn set_eligible(&mut self, term: &Term, names: &[&str]) -> Result<bool> {
        let record = crate::names_record(names)?;
        let key = self.eligible_key.clone();
        self.put_as_holder(term, key, record, "recording who may take the role")
    }

    fn end_term(&mut self, epoch: u64, by: &str) -> Result<bool> {
        // Only that holder's record (a later holder's is another), and only while the
        // list that names `by` is the one in etcd: deleting the record ends the term
        // (its holder's renewals find it gone); the lease is revoked after, to free
        // nothing more than the record but not to outlive it.
        let Some((p, lease)) = self.primary_record()? else {
            return Ok(false);
        };
        if p.epoch != epoch {
            return Ok(false);
        }
        let Some(kv) = self.eligible_record()? else {
            return Ok(false);
        };
        if !names_of(kv.value())?.iter().any(|n| n == by) {
            return Ok(false);
        }
        let txn = Txn::new()
            .when([
                Compare::lease(self.primary_key.clone(), CompareOp::Equal, lease),
                Compare::version(self.eligible_key.clone(), CompareOp::Equal, kv.version()),
            ])
            .and_then([TxnOp::delete(self.primary_key.clone(), None)]);
        let mut client = self.client.clone();
        if !self.call("ending the term", client.txn(txn))?.succeeded() {
            return Ok(false);
        }
        if let Err(e) = self.call(
            "revoking the ended term's lease",
            client.lease_revoke(lease),
        ) {
            tracing::warn!("{e:#}: it lapses by itself");
        }
        Ok(true)
    }

    fn save_map(&mut self, term: &Term, map: &str) -> Result<bool> {
        crate::check_map(map)?;
        let key = self.map_key.clone();
        self.put_as_holder(term, key, map.to_string(), "recording the cluster map")
    }

    fn map(&mut self) -> Result<Option<String>> {
        let key = self.map_key.clone();
        self.get_one(key, "reading the cluster map")?
            .map(|kv| {
                std::str::from_utf8(kv.value())
                    .map(str::to_string)
                    .context("the cluster map is not text")
            })
            .transpose()
    }

    fn eligible(&mut self) -> Result<Vec<String>> {
        self.eligible_record()?
            .map_or(Ok(Vec::new()), |kv| names_of(kv.value()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_whole_seconds_and_records_parse_or_say_why() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1500)), 2);
        let p = parse_primary(b"7 mds-a 10.0.0.1:7410").unwrap();
        assert_eq!(p.epoch, 7);
        assert_eq!(p.addr, "10.0.0.1:7410");
        assert!(parse_primary(b"x mds-a addr").is_err());
        assert!(parse_primary(b"7 mds-a").is_err());
        assert!(parse_primary(&[0xff, 0xfe]).is_err());
    }
}
