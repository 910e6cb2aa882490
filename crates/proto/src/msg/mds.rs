//! What the MDS receives: requests of clients ([`MdsRequest`]) and what data stores
//! tell it ([`StoreToMds`]). Both arrive on the MDS's one listener, so it decodes them
//! together as an [`MdsInbound`]; their kind numbers are disjoint.

use orion_format::{Gpa, Tail};
use orion_meta::RenameMode;

use super::{
    entries, ftype, header, lock, name, pages, put_entries, put_lock, put_pages, read_header, text,
    uuid, wire_kinds, Commit, Create, DsHello, Hello, LockReq, MemberId, Message, MirrorToMds,
    MirrorToMdsKind,
};
use crate::codec::{ProtoError, Reader, Writer};

/// What a client asks the metadata server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MdsRequest {
    Hello(Hello),
    /// An empty round trip (health checks and the RPC benchmark).
    Ping,
    /// A chunk of free data pages for the client to allocate from (paper §5.1).
    AllocChunk {
        group: Option<u16>,
        pages: u32,
    },
    Commit(Commit),
    Create(Create),
    Unlink {
        parent: u64,
        name: Vec<u8>,
    },
    /// A file the client holds open whose bucket of its open table is full
    /// (`crate::open_table`): the MDS keeps it as the table would (`hold`), or no
    /// longer (`!hold`, at its last close).
    HoldOpen {
        ino: u64,
        hold: bool,
    },
    /// The client wrote its whole open table into the one this MDS handed it: a new
    /// MDS that awaits its table may now count on it (`orion_format::holders`).
    OpenTableWritten,
    /// Pages of this connection's chunks it will not use, given back (a client with
    /// several connections returns those of its idle ones when a store runs short).
    /// At most [`MAX_RETURNED_RUNS`] runs of contiguous pages.
    ReturnPages {
        runs: Vec<(Gpa, u32)>,
    },
    Rmdir {
        parent: u64,
        name: Vec<u8>,
    },
    Rename {
        old_parent: u64,
        old_name: Vec<u8>,
        new_parent: u64,
        new_name: Vec<u8>,
        mode: RenameMode,
    },
    Link {
        ino: u64,
        parent: u64,
        name: Vec<u8>,
    },
    Statfs,
    /// The parent of a directory (for "..").
    Parent {
        ino: u64,
    },
    /// Take (or, with `LockKind::Unlock`, drop) an advisory lock; `EAGAIN` when another
    /// owner holds a conflicting one.
    Lock(LockReq),
    /// The first lock of another owner that conflicts with this one, if any.
    TestLock(LockReq),
    /// Drop every lock `owner` holds on `ino` (a flock's file closed).
    ReleaseLocks {
        ino: u64,
        owner: u64,
    },
    /// After a reconnection: the reply to this client's request `id` (one that
    /// changes state, asked on a connection that broke before the answer came), if
    /// the MDS applied it; [`super::ReplyBody::Unknown`] if it did not, and the
    /// client runs it again. What makes a retried create, rename or append happen
    /// once.
    Outcome {
        id: u64,
    },
    /// This client's kernel caches these inodes (their attributes, and the names in
    /// those that are directories): call it back before they change. Needs a
    /// callback connection ([`MdsRequest::CacheLease`]). At most [`MAX_WATCHED`].
    Watch {
        inos: Vec<u64>,
    },
    /// The client's kernel forgot these inodes: no more callbacks about them. At
    /// most [`MAX_WATCHED`].
    Unwatch {
        inos: Vec<u64>,
    },
    /// Makes this connection the client's callback connection ([`super::MdsToClient`])
    /// and asks for a cache lease; sent again on it to renew the lease. With
    /// `keep_watches` (a kernel that also keeps files' data pages, which it may read
    /// in again without asking for attributes first), a change to a file it watches
    /// calls it back every time; otherwise the watch is recalled at the first change
    /// ([`super::Invalidation::Recall`]).
    CacheLease {
        keep_watches: bool,
    },
    /// On the callback connection: the client's kernel cache is gone (unmounted);
    /// nothing need wait for its lease.
    EndCacheLease,
}

wire_kinds! {
    /// The kind byte of each [`MdsRequest`].
    pub enum MdsKind {
        Hello = 1,
        Ping = 2,
        AllocChunk = 3,
        Commit = 4,
        Create = 5,
        Unlink = 6,
        Rmdir = 7,
        Rename = 8,
        Link = 9,
        Statfs = 10,
        Parent = 11,
        Lock = 16,
        TestLock = 17,
        ReleaseLocks = 18,
        Outcome = 19,
        HoldOpen = 21,
        ReturnPages = 22,
        Watch = 23,
        CacheLease = 24,
        Unwatch = 25,
        EndCacheLease = 26,
        OpenTableWritten = 27,
    }
}

/// Most inodes one [`MdsRequest::Watch`] or [`MdsRequest::Unwatch`] names.
pub const MAX_WATCHED: usize = 4096;

fn inos(r: &mut Reader) -> Result<Vec<u64>, ProtoError> {
    let n = r.u32("inodes")? as usize;
    if n > MAX_WATCHED {
        return Err(ProtoError::Invalid("too many watched inodes"));
    }
    (0..n).map(|_| r.u64("ino")).collect()
}

/// Most runs one [`MdsRequest::ReturnPages`] carries.
pub const MAX_RETURNED_RUNS: usize = 4096;

/// What a data store tells the metadata server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreToMds {
    /// The store joins its replication group (answered with the cluster's id).
    Join(DsHello),
    /// The store persisted these pages (strong mode); no reply.
    Persisted { pages: Vec<Gpa> },
    /// The store copied every page its resync plan named: it serves reads now.
    Resynced,
    /// The store is alive (sent every quarter of the MDS's heartbeat timeout);
    /// answered with `Empty` (a store that hears nothing for a while takes the MDS
    /// for gone and joins another).
    Heartbeat,
    /// Which pages a resyncing store copies, from `from_page` on, and from which peer
    /// (answered with `ReplyBody::ResyncPlan`). Its resync thread asks on a connection
    /// of its own, so the member and incarnation say who asks.
    ResyncPlan {
        member: MemberId,
        incarnation: u64,
        from_page: u64,
    },
}

wire_kinds! {
    /// The kind byte of each [`StoreToMds`] message.
    pub enum StoreToMdsKind {
        Join = 32,
        Persisted = 33,
        Resynced = 34,
        ResyncPlan = 35,
        Heartbeat = 36,
    }
}

/// Anything the MDS's listener receives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MdsInbound {
    Client(MdsRequest),
    Store(StoreToMds),
    Mirror(MirrorToMds),
}

impl MdsRequest {
    pub fn kind(&self) -> MdsKind {
        match self {
            MdsRequest::Hello(_) => MdsKind::Hello,
            MdsRequest::Ping => MdsKind::Ping,
            MdsRequest::AllocChunk { .. } => MdsKind::AllocChunk,
            MdsRequest::Commit(_) => MdsKind::Commit,
            MdsRequest::Create(_) => MdsKind::Create,
            MdsRequest::Unlink { .. } => MdsKind::Unlink,
            MdsRequest::HoldOpen { .. } => MdsKind::HoldOpen,
            MdsRequest::ReturnPages { .. } => MdsKind::ReturnPages,
            MdsRequest::Rmdir { .. } => MdsKind::Rmdir,
            MdsRequest::Rename { .. } => MdsKind::Rename,
            MdsRequest::Link { .. } => MdsKind::Link,
            MdsRequest::Statfs => MdsKind::Statfs,
            MdsRequest::Parent { .. } => MdsKind::Parent,
            MdsRequest::Lock(_) => MdsKind::Lock,
            MdsRequest::TestLock(_) => MdsKind::TestLock,
            MdsRequest::ReleaseLocks { .. } => MdsKind::ReleaseLocks,
            MdsRequest::Outcome { .. } => MdsKind::Outcome,
            MdsRequest::Watch { .. } => MdsKind::Watch,
            MdsRequest::Unwatch { .. } => MdsKind::Unwatch,
            MdsRequest::CacheLease { .. } => MdsKind::CacheLease,
            MdsRequest::EndCacheLease => MdsKind::EndCacheLease,
            MdsRequest::OpenTableWritten => MdsKind::OpenTableWritten,
        }
    }

    /// Whether it changes what the MDS keeps (its reply is remembered, so that a
    /// retry after a fail-over or a broken connection is answered, not run twice).
    pub fn changes_state(&self) -> bool {
        matches!(
            self,
            MdsRequest::Commit(_)
                | MdsRequest::Create(_)
                | MdsRequest::Unlink { .. }
                | MdsRequest::Rmdir { .. }
                | MdsRequest::Rename { .. }
                | MdsRequest::Link { .. }
        )
    }

    fn encode_body(&self, w: &mut Writer) {
        match self {
            MdsRequest::Hello(h) => {
                w.opt_u32(h.internal.map(MemberId::pack))
                    .bool(h.strong)
                    .bytes(h.name.as_bytes())
                    .u64(h.nonce)
                    .u64(h.instance);
                w.buf.extend_from_slice(&h.host);
            }
            MdsRequest::CacheLease { keep_watches } => {
                w.bool(*keep_watches);
            }
            MdsRequest::Ping
            | MdsRequest::Statfs
            | MdsRequest::EndCacheLease
            | MdsRequest::OpenTableWritten => {}
            MdsRequest::Watch { inos } | MdsRequest::Unwatch { inos } => {
                w.u32(inos.len() as u32);
                for i in inos {
                    w.u64(*i);
                }
            }
            MdsRequest::AllocChunk { group, pages } => {
                w.opt_u32(group.map(u32::from)).u32(*pages);
            }
            MdsRequest::Commit(c) => {
                w.u64(c.ino)
                    .u64(c.generation)
                    .opt_u64(c.expect.map(Tail::pack))
                    .bool(c.persisted_locally)
                    .u32(c.written_epoch);
                put_entries(w, &c.entries);
            }
            MdsRequest::Create(c) => {
                w.u64(c.parent)
                    .bytes(&c.name)
                    .u8(c.ftype as u8)
                    .u32(c.mode)
                    .u32(c.uid)
                    .u32(c.gid)
                    .u32(c.rdev);
                match c.symlink {
                    Some((g, len, e)) => w.u8(1).u64(g.0).u32(len).u32(e),
                    None => w.u8(0),
                };
            }
            MdsRequest::Unlink { parent, name } | MdsRequest::Rmdir { parent, name } => {
                w.u64(*parent).bytes(name);
            }
            MdsRequest::HoldOpen { ino, hold } => {
                w.u64(*ino).bool(*hold);
            }
            MdsRequest::ReturnPages { runs } => {
                w.u32(runs.len() as u32);
                for (g, n) in runs {
                    w.u64(g.0).u32(*n);
                }
            }
            MdsRequest::Rename {
                old_parent,
                old_name,
                new_parent,
                new_name,
                mode,
            } => {
                w.u64(*old_parent)
                    .bytes(old_name)
                    .u64(*new_parent)
                    .bytes(new_name)
                    .u8(*mode as u8);
            }
            MdsRequest::Link { ino, parent, name } => {
                w.u64(*ino).u64(*parent).bytes(name);
            }
            MdsRequest::Parent { ino } => {
                w.u64(*ino);
            }
            MdsRequest::Lock(l) | MdsRequest::TestLock(l) => put_lock(w, l),
            MdsRequest::ReleaseLocks { ino, owner } => {
                w.u64(*ino).u64(*owner);
            }
            MdsRequest::Outcome { id } => {
                w.u64(*id);
            }
        }
    }

    fn decode_body(kind: MdsKind, r: &mut Reader) -> Result<MdsRequest, ProtoError> {
        let group = |v: Option<u32>| -> Result<Option<u16>, ProtoError> {
            v.map(|g| u16::try_from(g).map_err(|_| ProtoError::Invalid("group")))
                .transpose()
        };
        Ok(match kind {
            MdsKind::Hello => MdsRequest::Hello(Hello {
                internal: r.opt_u32("member")?.map(MemberId::unpack),
                strong: r.bool("strong")?,
                name: text(r, "client name")?,
                nonce: r.u64("client nonce")?,
                instance: r.u64("client instance")?,
                host: uuid(r)?,
            }),
            MdsKind::CacheLease => MdsRequest::CacheLease {
                keep_watches: r.bool("keep watches")?,
            },
            MdsKind::EndCacheLease => MdsRequest::EndCacheLease,
            MdsKind::OpenTableWritten => MdsRequest::OpenTableWritten,
            MdsKind::Watch => MdsRequest::Watch { inos: inos(r)? },
            MdsKind::Unwatch => MdsRequest::Unwatch { inos: inos(r)? },
            MdsKind::Ping => MdsRequest::Ping,
            MdsKind::AllocChunk => MdsRequest::AllocChunk {
                group: group(r.opt_u32("group")?)?,
                pages: r.u32("pages")?,
            },
            MdsKind::Commit => MdsRequest::Commit(Commit {
                ino: r.u64("ino")?,
                generation: r.u64("generation")?,
                expect: r.opt_u64("expected tail")?.map(Tail::unpack),
                persisted_locally: r.bool("persisted locally")?,
                written_epoch: r.u32("written epoch")?,
                entries: entries(r)?,
            }),
            MdsKind::Create => MdsRequest::Create(Create {
                parent: r.u64("parent")?,
                name: name(r)?,
                ftype: ftype(r)?,
                mode: r.u32("mode")?,
                uid: r.u32("uid")?,
                gid: r.u32("gid")?,
                rdev: r.u32("rdev")?,
                symlink: if r.bool("symlink")? {
                    Some((
                        Gpa(r.u64("gpa")?),
                        r.u32("target length")?,
                        r.u32("written epoch")?,
                    ))
                } else {
                    None
                },
            }),
            MdsKind::Unlink => MdsRequest::Unlink {
                parent: r.u64("parent")?,
                name: name(r)?,
            },
            MdsKind::HoldOpen => MdsRequest::HoldOpen {
                ino: r.u64("inode")?,
                hold: r.bool("hold")?,
            },
            MdsKind::ReturnPages => {
                let n = r.u32("run count")? as usize;
                if n > MAX_RETURNED_RUNS {
                    return Err(ProtoError::Invalid("run count"));
                }
                let mut runs = Vec::with_capacity(n);
                for _ in 0..n {
                    runs.push((Gpa(r.u64("gpa")?), r.u32("pages")?));
                }
                MdsRequest::ReturnPages { runs }
            }
            MdsKind::Rmdir => MdsRequest::Rmdir {
                parent: r.u64("parent")?,
                name: name(r)?,
            },
            MdsKind::Rename => MdsRequest::Rename {
                old_parent: r.u64("parent")?,
                old_name: name(r)?,
                new_parent: r.u64("parent")?,
                new_name: name(r)?,
                mode: match r.u8("rename mode")? {
                    0 => RenameMode::Replace,
                    1 => RenameMode::NoReplace,
                    2 => RenameMode::Exchange,
                    _ => return Err(ProtoError::Invalid("rename mode")),
                },
            },
            MdsKind::Link => MdsRequest::Link {
                ino: r.u64("ino")?,
                parent: r.u64("parent")?,
                name: name(r)?,
            },
            MdsKind::Statfs => MdsRequest::Statfs,
            MdsKind::Parent => MdsRequest::Parent { ino: r.u64("ino")? },
            MdsKind::Lock => MdsRequest::Lock(lock(r)?),
            MdsKind::TestLock => MdsRequest::TestLock(lock(r)?),
            MdsKind::ReleaseLocks => MdsRequest::ReleaseLocks {
                ino: r.u64("ino")?,
                owner: r.u64("owner")?,
            },
            MdsKind::Outcome => MdsRequest::Outcome {
                id: r.u64("request id")?,
            },
        })
    }
}

impl Message for MdsRequest {
    fn encode(&self, out: &mut Vec<u8>, id: u64) {
        let mut w = Writer {
            buf: std::mem::take(out),
        };
        header(&mut w, self.kind() as u8, id);
        self.encode_body(&mut w);
        *out = w.buf;
    }

    fn decode(b: &[u8]) -> Result<(u64, MdsRequest), ProtoError> {
        let mut r = Reader::new(b);
        let (kind, id) = read_header(&mut r)?;
        let req = MdsRequest::decode_body(MdsKind::try_from(kind)?, &mut r)?;
        r.finish()?;
        Ok((id, req))
    }

    fn name(&self) -> &'static str {
        match self.kind() {
            MdsKind::Hello => "hello",
            MdsKind::Ping => "ping",
            MdsKind::AllocChunk => "chunk allocation",
            MdsKind::Commit => "log commit",
            MdsKind::Create => "create",
            MdsKind::Unlink => "unlink",
            MdsKind::HoldOpen => "hold open",
            MdsKind::ReturnPages => "return of chunk pages",
            MdsKind::Rmdir => "rmdir",
            MdsKind::Rename => "rename",
            MdsKind::Link => "link",
            MdsKind::Statfs => "statfs",
            MdsKind::Parent => "parent",
            MdsKind::Lock => "lock",
            MdsKind::TestLock => "lock test",
            MdsKind::ReleaseLocks => "lock release",
            MdsKind::Outcome => "outcome",
            MdsKind::Watch => "watch",
            MdsKind::Unwatch => "unwatch",
            MdsKind::CacheLease => "cache lease",
            MdsKind::EndCacheLease => "end of a cache lease",
            MdsKind::OpenTableWritten => "open table written",
        }
    }
}

impl StoreToMds {
    pub fn kind(&self) -> StoreToMdsKind {
        match self {
            StoreToMds::Join(_) => StoreToMdsKind::Join,
            StoreToMds::Persisted { .. } => StoreToMdsKind::Persisted,
            StoreToMds::Resynced => StoreToMdsKind::Resynced,
            StoreToMds::Heartbeat => StoreToMdsKind::Heartbeat,
            StoreToMds::ResyncPlan { .. } => StoreToMdsKind::ResyncPlan,
        }
    }

    fn decode_body(kind: StoreToMdsKind, r: &mut Reader) -> Result<StoreToMds, ProtoError> {
        Ok(match kind {
            StoreToMdsKind::Join => StoreToMds::Join(DsHello {
                group: r.u16("group")?,
                index: r.u16("replica index")?,
                page_count: r.u64("page count")?,
                pool_uuid: uuid(r)?,
                cluster_uuid: uuid(r)?,
                addr: text(r, "address")?,
                incarnation: r.u64("incarnation")?,
                durable_on_delivery: r.bool("durable on delivery")?,
                restarted_host: r.bool("restarted host")?,
                pool_path: text(r, "pool path")?,
                host: uuid(r)?,
            }),
            StoreToMdsKind::Persisted => StoreToMds::Persisted { pages: pages(r)? },
            StoreToMdsKind::Resynced => StoreToMds::Resynced,
            StoreToMdsKind::Heartbeat => StoreToMds::Heartbeat,
            StoreToMdsKind::ResyncPlan => StoreToMds::ResyncPlan {
                member: MemberId::unpack(r.u32("member")?),
                incarnation: r.u64("incarnation")?,
                from_page: r.u64("page")?,
            },
        })
    }
}

impl Message for StoreToMds {
    fn encode(&self, out: &mut Vec<u8>, id: u64) {
        let mut w = Writer {
            buf: std::mem::take(out),
        };
        header(&mut w, self.kind() as u8, id);
        match self {
            StoreToMds::Join(d) => {
                w.u16(d.group).u16(d.index).u64(d.page_count);
                w.buf.extend_from_slice(&d.pool_uuid);
                w.buf.extend_from_slice(&d.cluster_uuid);
                w.bytes(d.addr.as_bytes());
                w.u64(d.incarnation)
                    .bool(d.durable_on_delivery)
                    .bool(d.restarted_host)
                    .bytes(d.pool_path.as_bytes());
                w.buf.extend_from_slice(&d.host);
            }
            StoreToMds::Persisted { pages } => put_pages(&mut w, pages),
            StoreToMds::Resynced | StoreToMds::Heartbeat => {}
            StoreToMds::ResyncPlan {
                member,
                incarnation,
                from_page,
            } => {
                w.u32(member.pack()).u64(*incarnation).u64(*from_page);
            }
        }
        *out = w.buf;
    }

    fn decode(b: &[u8]) -> Result<(u64, StoreToMds), ProtoError> {
        let mut r = Reader::new(b);
        let (kind, id) = read_header(&mut r)?;
        let msg = StoreToMds::decode_body(StoreToMdsKind::try_from(kind)?, &mut r)?;
        r.finish()?;
        Ok((id, msg))
    }

    fn name(&self) -> &'static str {
        match self.kind() {
            StoreToMdsKind::Join => "data store join",
            StoreToMdsKind::Persisted => "persisted notice",
            StoreToMdsKind::Resynced => "resync done",
            StoreToMdsKind::Heartbeat => "heartbeat",
            StoreToMdsKind::ResyncPlan => "resync plan",
        }
    }
}

impl Message for MdsInbound {
    fn encode(&self, out: &mut Vec<u8>, id: u64) {
        match self {
            MdsInbound::Client(m) => m.encode(out, id),
            MdsInbound::Store(m) => m.encode(out, id),
            MdsInbound::Mirror(m) => m.encode(out, id),
        }
    }

    fn decode(b: &[u8]) -> Result<(u64, MdsInbound), ProtoError> {
        let mut r = Reader::new(b);
        let (kind, id) = read_header(&mut r)?;
        let msg = if let Ok(k) = MdsKind::try_from(kind) {
            MdsInbound::Client(MdsRequest::decode_body(k, &mut r)?)
        } else if let Ok(k) = StoreToMdsKind::try_from(kind) {
            MdsInbound::Store(StoreToMds::decode_body(k, &mut r)?)
        } else {
            MdsInbound::Mirror(MirrorToMds::decode_body(
                MirrorToMdsKind::try_from(kind)?,
                &mut r,
            )?)
        };
        r.finish()?;
        Ok((id, msg))
    }

    fn name(&self) -> &'static str {
        match self {
            MdsInbound::Client(m) => m.name(),
            MdsInbound::Store(m) => m.name(),
            MdsInbound::Mirror(m) => m.name(),
        }
    }
}
