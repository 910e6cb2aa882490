//! A client's hello: who it is, how it persists, and what it needs to know of the
//! file system and the data stores.

use orion_fabric::ConnId;
use orion_meta::{FsError, FsResult};
use orion_proto::{Hello, HelloReply, ReplyBody};
use tracing::{debug, info};

use crate::server::{Mds, Role};

impl Mds {
    pub(crate) fn client_hello(&mut self, conn: ConnId, h: Hello) -> FsResult<ReplyBody> {
        let gone = || FsError::Io("connection gone".into());
        let peer = self.peers.get(&conn).ok_or_else(gone)?;
        let how = format!(
            "{}, {}",
            if h.strong { "strong" } else { "weak" },
            match h.internal {
                Some(m) => format!("internal to {m}"),
                None => "external".into(),
            }
        );
        let addr = peer.ch.conn.peer();
        // A client says hello again to learn the stores (one rejoined): that is not
        // news for the log.
        if matches!(peer.role, Role::New) {
            info!("client {} ({addr}) joined: {how}", h.name);
        } else {
            debug!(
                "client {} ({addr}) asked for the stores again: {how}",
                h.name
            );
        }
        // Only a store this MDS knows: the client's own persists stand for that
        // store's notices (an unknown one's pages are asked of the stores themselves).
        let internal = h.internal.filter(|m| self.map.knows(*m));
        // The same client on a new connection: the old one is dead to it, and what it
        // left parked must not apply behind an `Outcome` that said "not applied".
        let stale: Vec<ConnId> = self
            .peers
            .iter()
            .filter(|(c, p)| {
                **c != conn && matches!(p.role, Role::Client { nonce, .. } if nonce == h.nonce)
            })
            .map(|(c, _)| *c)
            .collect();
        for c in stale {
            self.drop_peer(c, "the client reconnected");
        }
        // A hello under another instance: what this connection held for the old one
        // goes (its callbacks, its lease).
        let was = self.peers.get(&conn).and_then(|p| p.instance());
        if was.is_some_and(|i| i != h.instance) {
            self.callbacks.departed(conn);
        }
        let peer = self.peers.get_mut(&conn).ok_or_else(gone)?;
        peer.role = Role::Client {
            internal,
            strong: h.strong,
            nonce: h.nonce,
            instance: h.instance,
        };
        peer.name = format!("{} ({})", h.name, peer.ch.conn.peer());
        self.next_client += 1;
        let open_table = self.open_tables.table_of(&self.domain, h.instance, conn)?;
        // A next MDS must know to wait for this table before the client learns of it.
        self.record_holders()?;
        Ok(ReplyBody::Hello(HelloReply {
            client_id: self.next_client - 1,
            superblock: self.superblock.clone(),
            pool: self.pool_region.remote(),
            open_table,
            epoch: self.map.epoch(),
            stores: self.stores_for_host(h.host),
            map_lease_ms: self.cfg.map_lease_ms,
            grace_ms: self.cfg.grace_ms,
            grant_quiet_ms: self.cfg.grant_quiet_ms,
            term: self.role.as_ref().map_or(0, |r| r.epoch),
        }))
    }
}
