//! The messages and their encodings, by service: what a client asks the MDS
//! ([`MdsRequest`]), what a data store tells the MDS ([`StoreToMds`]), what a client
//! asks a data store ([`StoreRequest`]); every service answers with a [`Reply`]. Each
//! family has one `#[repr(u8)]` kind enum that its encoder writes and its decoder
//! reads, and the families' kind numbers are disjoint, so a message sent to the wrong
//! service is refused as an unknown kind.

mod callback;
mod fields;
mod mds;
mod mirror;
mod store;
#[cfg(test)]
mod tests;

pub use callback::{Invalidation, MdsToClient, MdsToClientKind, MAX_INVALIDATIONS};
pub use mds::{
    MdsInbound, MdsKind, MdsRequest, StoreToMds, StoreToMdsKind, MAX_RETURNED_RUNS, MAX_WATCHED,
};
pub use mirror::{MdsToMirror, MdsToMirrorKind, MirrorToMds, MirrorToMdsKind, MAX_APPLY_RECORDS};
pub use store::{StoreKind, StoreRequest};

pub(crate) use fields::*;

use orion_fabric::RemoteRegion;
use orion_format::{Entry, FileType, Gpa, Tail, SUPERBLOCK_SIZE};
use orion_meta::{Attr, StatFs};

use crate::codec::{ProtoError, Reader, Writer};

/// Most entries one log commit may carry (a commit fits in one message).
pub const MAX_COMMIT_ENTRIES: usize = 256;
/// Most pages one `Persisted` notice or `Persist` request may name.
pub const MAX_PERSISTED: usize = 4096;
/// Most 64-page words of a resync plan in one reply (2^18 pages, 1 GiB).
pub const MAX_PLAN_WORDS: usize = 4096;
/// Most data stores a cluster map may list.
pub const MAX_STORES: usize = 1024;
pub(crate) const MAX_TEXT: usize = 4096;

/// What a client tells the MDS when it connects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The data store whose pool this client maps, if any (internal, paper §5.1).
    pub internal: Option<MemberId>,
    /// Strong data consistency (paper §5.3): commits wait until the data stores have
    /// persisted the pages. Weak commits at once.
    pub strong: bool,
    /// Free text for logs (host and process).
    pub name: String,
    /// Drawn once by each client and kept across reconnections: the MDS remembers the
    /// replies to a client's requests under it (see `MdsRequest::Outcome`).
    pub nonce: u64,
    /// Drawn once by each client library instance and shared by all its connections:
    /// the MDS calls back no instance about the changes it made itself.
    pub instance: u64,
    /// The client's host ([`crate::this_host`]): the map it gets names the pool
    /// files of the stores on the same host only.
    pub host: [u8; 16],
}

/// A log commit (paper §4.3): entries for one inode, appended by the MDS in its order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    pub ino: u64,
    /// The generation of the inode the client computed against: a number freed and
    /// reused for another file since then gets `ESTALE`.
    pub generation: u64,
    /// Append only if the log tail is still this one (the client computed the entries
    /// from that state: a partial-page write, an append, a truncation); otherwise the
    /// MDS refuses with `ESTALE` and the client refreshes and re-executes.
    pub expect: Option<Tail>,
    /// The client persisted the data pages it wrote to its own group's pool itself (an
    /// internal client), so no data store acknowledgment is awaited for those; pages
    /// of other groups are awaited from their stores as for any client.
    pub persisted_locally: bool,
    /// The cluster map epoch under which its data pages were written: the MDS refuses
    /// the commit (`EREMCHG`: write them again) if a store took writes only since.
    pub written_epoch: Epoch,
    pub entries: Vec<Entry>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Create {
    pub parent: u64,
    pub name: Vec<u8>,
    pub ftype: FileType,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    /// A symlink's target: the page (from the client's chunk), its length, and the
    /// cluster map epoch under which the page was written.
    pub symlink: Option<(Gpa, u32, Epoch)>,
}

/// What a data store tells the MDS when it joins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DsHello {
    pub group: u16,
    /// Its index among the group's replicas.
    pub index: u16,
    pub page_count: u64,
    pub pool_uuid: [u8; 16],
    /// All zeros for a pool that has never joined a cluster.
    pub cluster_uuid: [u8; 16],
    /// Where clients reach this store.
    pub addr: String,
    /// Drawn at each start of the store: a store that restarted is another
    /// incarnation, and only the one that received a write can vouch for its pages.
    pub incarnation: u64,
    /// Whether a page a one-sided write delivered into its pool is durable (under the
    /// pool's mode) with no work of the store: true for a volatile pool, whose pages
    /// survive the store's crash once they are in the file. Writes to such a store
    /// need no persist notice in strong mode and no flush in weak mode.
    pub durable_on_delivery: bool,
    /// The store's host restarted since its pool last served, and the pool needs
    /// flushes: pages delivered and never flushed may be gone, so the pool is not
    /// taken for one that holds what it was given (it copies every page from an
    /// in-sync peer, and staged pages are not read back from it).
    pub restarted_host: bool,
    /// Where its pool file is on its host (absolute), for the map: a client on the
    /// same host maps the pool from it without connecting to the store.
    pub pool_path: String,
    /// Its host ([`crate::this_host`]).
    pub host: [u8; 16],
}

/// What an advisory lock does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    Read = 0,
    Write = 1,
    Unlock = 2,
}

/// An advisory byte-range lock (fcntl, and flock as a whole-file range) of one lock
/// owner of the requesting client, on bytes `start..=end` of `ino`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockReq {
    pub ino: u64,
    pub owner: u64,
    pub pid: u32,
    pub start: u64,
    pub end: u64,
    pub kind: LockKind,
}

/// A data store's place in the cluster: its replication group, and its index among
/// the group's replicas (`0..replicas`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberId {
    pub group: u16,
    pub index: u16,
}

impl MemberId {
    pub fn new(group: u16, index: u16) -> MemberId {
        MemberId { group, index }
    }
    /// Its bit in a mask of a group's replicas (none past index 63: the MDS admits at
    /// most 64 replicas per group).
    pub fn bit(self) -> u64 {
        1u64.checked_shl(self.index.into()).unwrap_or(0)
    }

    /// The members of `group` whose bits `mask` has set, by index.
    pub fn in_mask(group: u16, mask: u64) -> impl Iterator<Item = MemberId> {
        (0..64u16)
            .filter(move |i| mask & (1u64 << i) != 0)
            .map(move |i| MemberId::new(group, i))
    }

    pub(crate) fn pack(self) -> u32 {
        (self.group as u32) << 16 | self.index as u32
    }
    pub(crate) fn unpack(v: u32) -> MemberId {
        MemberId::new((v >> 16) as u16, v as u16)
    }
}

impl std::fmt::Display for MemberId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "group {} replica {}", self.group, self.index)
    }
}

/// What a member of a replication group does now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MemberState {
    /// Serves reads and takes writes.
    Up = 0,
    /// Takes writes, and copies what it missed from a peer; serves no reads yet.
    Resyncing = 1,
    /// Gone (or refused): neither.
    Down = 2,
}

impl MemberState {
    /// Whether writes go to it (and strong commits wait for it).
    pub fn takes_writes(self) -> bool {
        matches!(self, MemberState::Up | MemberState::Resyncing)
    }
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Up => "up",
            MemberState::Resyncing => "resyncing",
            MemberState::Down => "down",
        }
    }
    fn from_u8(v: u8) -> Result<MemberState, ProtoError> {
        Ok(match v {
            0 => MemberState::Up,
            1 => MemberState::Resyncing,
            2 => MemberState::Down,
            _ => return Err(ProtoError::Invalid("member state")),
        })
    }
}

/// One data store in the cluster map a client gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreInfo {
    pub member: MemberId,
    pub state: MemberState,
    pub addr: String,
    /// How far its resync has come, in percent (100 when it is not resyncing).
    pub resync_pct: u8,
    /// The epoch since which it takes writes: it holds every page written under
    /// this epoch or a later one.
    pub since: Epoch,
    /// The epoch since which its pool has been this member's (a restart with the same
    /// pool keeps it; a new pool starts it again): it holds what was delivered to it
    /// under this epoch or a later one, even if it stopped taking writes meanwhile.
    pub pool_since: Epoch,
    /// See [`DsHello::durable_on_delivery`].
    pub durable_on_delivery: bool,
    /// See [`DsHello::pool_path`]: with the pool's identity, what lets a client on
    /// the store's host find its own store in the map (`crates/client/src/replicas.rs`).
    pub pool_path: String,
    pub pool_uuid: [u8; 16],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloReply {
    pub client_id: u64,
    /// The MDS pool's superblock: where slots and log pages are.
    pub superblock: Vec<u8>,
    /// The MDS pool, readable one-sided.
    pub pool: RemoteRegion,
    /// Its instance's open table, writable one-sided (`crate::open_table`).
    pub open_table: RemoteRegion,
    /// The cluster map's epoch (also in every message's header).
    pub epoch: Epoch,
    /// Every data store the MDS knows, with its state.
    pub stores: Vec<StoreInfo>,
    /// How long freed pages wait before reuse: a client trusts a cached data page
    /// for less than this (the page cannot have been reused meanwhile).
    pub grace_ms: u64,
    /// How long a client may read data pages by this map before it asks again: a
    /// store that leaves the map takes no commit of its group's pages for that long.
    pub map_lease_ms: u64,
    /// How long the MDS grants no chunk after it starts: a client writes into a
    /// chunk only within half this time of sending a request the MDS answered.
    pub grant_quiet_ms: u64,
    /// The epoch of the primary's term (0 without a cluster manager): a client that
    /// finds it changed after a reconnection talks to another MDS since, whose logs
    /// may end before what it had read one-sided, and drops its cached inodes.
    pub term: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DsInfoReply {
    pub group: u16,
    /// The data pool, readable and writable one-sided. (A client on the store's
    /// host maps the pool from the cluster map instead: `StoreInfo::pool_path`.)
    pub region: RemoteRegion,
    pub pool_uuid: [u8; 16],
    pub page_count: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyBody {
    Empty,
    Hello(HelloReply),
    Chunk {
        start: Gpa,
        pages: u32,
    },
    /// Where the commit landed: the tail before it and after it.
    Committed {
        prev: Tail,
        tail: Tail,
    },
    Attr(Attr),
    Statfs(StatFs),
    Ino(u64),
    Joined {
        cluster_uuid: [u8; 16],
        /// The store must copy what it missed from a peer before it serves reads.
        resync: bool,
        /// How often the store says it is alive: a quarter of the MDS's heartbeat
        /// timeout (the store keeps it within 20–500 ms), so that a store is taken
        /// for dead after four silent periods whatever the timeout (a fixed 100 ms woke an idle MDS twenty times a
        /// second for two stores, and each store as often).
        heartbeat_ms: u32,
    },
    /// A piece of a resync plan: pages `first_page + i` whose bit `i` is set in
    /// `bits` are copied from the store at `source`; an empty `bits` ends the plan.
    ResyncPlan {
        source: String,
        first_page: u64,
        bits: Vec<u64>,
    },
    DsInfo(DsInfoReply),
    /// A conflicting lock (its owner is the holder's, not meaningful to the asker), or
    /// none.
    Lock(Option<LockReq>),
    /// The primary takes a mirror: its term's epoch, its pool (to copy one-sided) and
    /// that pool's superblock.
    MirrorStart {
        epoch: u64,
        pool: RemoteRegion,
        superblock: Vec<u8>,
    },
    /// The answer to `Outcome` for a request the MDS did not apply.
    Unknown,
    /// A cache lease from now for `ms` milliseconds; 0: this MDS grants no leases
    /// (`cache_lease_ms` 0).
    Lease {
        ms: u32,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Ok(ReplyBody),
    /// A POSIX errno (`EIO` for anything else) and a message for logs.
    Err {
        errno: i32,
        message: String,
    },
}

/// The kind byte of every reply (a reply's body names its own shape).
pub(crate) const K_REPLY: u8 = 0x80;

/// A message a service receives: encodes with its kind and the request id, decodes
/// from untrusted bytes without panicking.
pub trait Message: Sized {
    /// Appends the encoding of `self` with request id `id` to `out`.
    fn encode(&self, out: &mut Vec<u8>, id: u64);
    /// Decodes a message: its request id and body. Any malformed input is an error.
    fn decode(b: &[u8]) -> Result<(u64, Self), ProtoError>;
    /// A short name for logs and errors.
    fn name(&self) -> &'static str;
}

/// Declares a `#[repr(u8)]` enum of message kinds and its decoding from a byte, so
/// each kind number is written once and the encoder and the decoder share it.
macro_rules! wire_kinds {
    ($(#[$m:meta])* pub enum $name:ident { $($(#[$vm:meta])* $v:ident = $n:literal,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u8)]
        pub enum $name { $($(#[$vm])* $v = $n,)* }

        impl TryFrom<u8> for $name {
            type Error = ProtoError;
            fn try_from(k: u8) -> Result<$name, ProtoError> {
                match k {
                    $($n => Ok($name::$v),)*
                    _ => Err(ProtoError::UnknownKind(k)),
                }
            }
        }

        impl $name {
            /// Every kind of this family.
            pub const ALL: &'static [$name] = &[$($name::$v,)*];
        }
    };
}
pub(crate) use wire_kinds;

wire_kinds! {
    /// The shape of a reply's body.
    pub enum ReplyKind {
        Err = 0,
        Empty = 1,
        Hello = 2,
        Chunk = 3,
        Committed = 4,
        Attr = 5,
        Statfs = 6,
        Ino = 7,
        Joined = 8,
        DsInfo = 9,
        Lock = 10,
        ResyncPlan = 11,
        MirrorStart = 12,
        Unknown = 13,
        Lease = 14,
    }
}

/// Appends the encoding of a reply to request `id` to `out`.
pub fn encode_reply(out: &mut Vec<u8>, id: u64, reply: &Reply) {
    let mut w = Writer {
        buf: std::mem::take(out),
    };
    header(&mut w, K_REPLY, id);
    match reply {
        Reply::Err { errno, message } => {
            let msg = &message.as_bytes()[..message.len().min(MAX_TEXT)];
            // Cut at a character boundary so the text stays UTF-8.
            let cut = (0..=msg.len())
                .rev()
                .find(|&i| message.is_char_boundary(i))
                .unwrap_or(0);
            debug_assert!(
                cut <= MAX_TEXT,
                "an error text of {cut} bytes, past the limit"
            );
            w.u8(ReplyKind::Err as u8)
                .i32(*errno)
                .bytes(&message.as_bytes()[..cut]);
        }
        Reply::Ok(body) => match body {
            ReplyBody::Empty => {
                w.u8(ReplyKind::Empty as u8);
            }
            ReplyBody::Hello(h) => {
                w.u8(ReplyKind::Hello as u8)
                    .u64(h.client_id)
                    .bytes(&h.superblock);
                w.buf.extend_from_slice(&h.pool.encode());
                w.buf.extend_from_slice(&h.open_table.encode());
                w.u32(h.epoch);
                w.u32(h.stores.len() as u32);
                for s in &h.stores {
                    w.u32(s.member.pack())
                        .u8(s.state as u8)
                        .bytes(s.addr.as_bytes())
                        .u8(s.resync_pct)
                        .u32(s.since)
                        .u32(s.pool_since)
                        .bool(s.durable_on_delivery)
                        .bytes(s.pool_path.as_bytes());
                    w.buf.extend_from_slice(&s.pool_uuid);
                }
                w.u64(h.grace_ms)
                    .u64(h.map_lease_ms)
                    .u64(h.grant_quiet_ms)
                    .u64(h.term);
            }
            ReplyBody::Chunk { start, pages } => {
                w.u8(ReplyKind::Chunk as u8).u64(start.0).u32(*pages);
            }
            ReplyBody::Committed { prev, tail } => {
                w.u8(ReplyKind::Committed as u8)
                    .u64(prev.pack())
                    .u64(tail.pack());
            }
            ReplyBody::Attr(a) => {
                w.u8(ReplyKind::Attr as u8);
                put_attr(&mut w, a);
            }
            ReplyBody::Statfs(s) => {
                w.u8(ReplyKind::Statfs as u8)
                    .u32(s.bsize)
                    .u64(s.blocks)
                    .u64(s.bfree)
                    .u64(s.files)
                    .u64(s.ffree)
                    .u32(s.namelen);
            }
            ReplyBody::Ino(i) => {
                w.u8(ReplyKind::Ino as u8).u64(*i);
            }
            ReplyBody::Joined {
                cluster_uuid,
                resync,
                heartbeat_ms,
            } => {
                w.u8(ReplyKind::Joined as u8);
                w.buf.extend_from_slice(cluster_uuid);
                w.bool(*resync).u32(*heartbeat_ms);
            }
            ReplyBody::ResyncPlan {
                source,
                first_page,
                bits,
            } => {
                w.u8(ReplyKind::ResyncPlan as u8)
                    .bytes(source.as_bytes())
                    .u64(*first_page)
                    .u32(bits.len() as u32);
                for b in bits {
                    w.u64(*b);
                }
            }
            ReplyBody::DsInfo(d) => {
                w.u8(ReplyKind::DsInfo as u8).u16(d.group);
                w.buf.extend_from_slice(&d.region.encode());
                w.buf.extend_from_slice(&d.pool_uuid);
                w.u64(d.page_count);
            }
            ReplyBody::Lock(l) => {
                w.u8(ReplyKind::Lock as u8).bool(l.is_some());
                if let Some(l) = l {
                    put_lock(&mut w, l);
                }
            }
            ReplyBody::MirrorStart {
                epoch,
                pool,
                superblock,
            } => {
                w.u8(ReplyKind::MirrorStart as u8).u64(*epoch);
                w.buf.extend_from_slice(&pool.encode());
                w.bytes(superblock);
            }
            ReplyBody::Lease { ms } => {
                w.u8(ReplyKind::Lease as u8).u32(*ms);
            }
            ReplyBody::Unknown => {
                w.u8(ReplyKind::Unknown as u8);
            }
        },
    }
    *out = w.buf;
}

/// Decodes a reply: the id of the request it answers, and the reply.
pub fn decode_reply(b: &[u8]) -> Result<(u64, Reply), ProtoError> {
    let mut r = Reader::new(b);
    let (kind, id) = read_header(&mut r)?;
    if kind != K_REPLY {
        return Err(ProtoError::UnknownKind(kind));
    }
    let reply = match ReplyKind::try_from(r.u8("reply kind")?)? {
        ReplyKind::Err => Reply::Err {
            errno: r.i32("errno")?,
            message: text(&mut r, "error message")?,
        },
        ReplyKind::Empty => Reply::Ok(ReplyBody::Empty),
        ReplyKind::Hello => {
            let client_id = r.u64("client id")?;
            let superblock = r.bytes(SUPERBLOCK_SIZE, "superblock")?.to_vec();
            let pool = region(&mut r)?;
            let open_table = region(&mut r)?;
            let epoch = r.u32("epoch")?;
            let n = r.u32("store count")? as usize;
            if n > MAX_STORES {
                return Err(ProtoError::Invalid("store count"));
            }
            let mut stores = Vec::with_capacity(n);
            for _ in 0..n {
                stores.push(StoreInfo {
                    member: MemberId::unpack(r.u32("member")?),
                    state: MemberState::from_u8(r.u8("member state")?)?,
                    addr: text(&mut r, "address")?,
                    resync_pct: r.u8("resync progress")?,
                    since: r.u32("writes since")?,
                    pool_since: r.u32("pool since")?,
                    durable_on_delivery: r.bool("durable on delivery")?,
                    pool_path: text(&mut r, "pool path")?,
                    pool_uuid: uuid(&mut r)?,
                });
            }
            Reply::Ok(ReplyBody::Hello(HelloReply {
                client_id,
                superblock,
                pool,
                open_table,
                epoch,
                stores,
                grace_ms: r.u64("grace")?,
                map_lease_ms: r.u64("map lease")?,
                grant_quiet_ms: r.u64("grant quiet time")?,
                term: r.u64("term")?,
            }))
        }
        ReplyKind::Chunk => Reply::Ok(ReplyBody::Chunk {
            start: Gpa(r.u64("gpa")?),
            pages: r.u32("pages")?,
        }),
        ReplyKind::Committed => Reply::Ok(ReplyBody::Committed {
            prev: tail(&mut r, "prev")?,
            tail: tail(&mut r, "tail")?,
        }),
        ReplyKind::Attr => Reply::Ok(ReplyBody::Attr(attr(&mut r)?)),
        ReplyKind::Statfs => Reply::Ok(ReplyBody::Statfs(StatFs {
            bsize: r.u32("bsize")?,
            blocks: r.u64("blocks")?,
            bfree: r.u64("bfree")?,
            files: r.u64("files")?,
            ffree: r.u64("ffree")?,
            namelen: r.u32("namelen")?,
        })),
        ReplyKind::Ino => Reply::Ok(ReplyBody::Ino(r.u64("ino")?)),
        ReplyKind::Joined => Reply::Ok(ReplyBody::Joined {
            cluster_uuid: uuid(&mut r)?,
            resync: r.bool("resync")?,
            heartbeat_ms: r.u32("heartbeat period")?,
        }),
        ReplyKind::ResyncPlan => {
            let source = text(&mut r, "source address")?;
            let first_page = r.u64("first page")?;
            let n = r.u32("plan words")? as usize;
            if n > MAX_PLAN_WORDS {
                return Err(ProtoError::Invalid("plan words"));
            }
            let mut bits = Vec::with_capacity(n);
            for _ in 0..n {
                bits.push(r.u64("plan word")?);
            }
            Reply::Ok(ReplyBody::ResyncPlan {
                source,
                first_page,
                bits,
            })
        }
        ReplyKind::DsInfo => Reply::Ok(ReplyBody::DsInfo(DsInfoReply {
            group: r.u16("group")?,
            region: region(&mut r)?,
            pool_uuid: uuid(&mut r)?,
            page_count: r.u64("page count")?,
        })),
        ReplyKind::Lock => Reply::Ok(ReplyBody::Lock(if r.bool("lock present")? {
            Some(lock(&mut r)?)
        } else {
            None
        })),
        ReplyKind::MirrorStart => Reply::Ok(ReplyBody::MirrorStart {
            epoch: r.u64("epoch")?,
            pool: region(&mut r)?,
            superblock: r.bytes(SUPERBLOCK_SIZE, "superblock")?.to_vec(),
        }),
        ReplyKind::Unknown => Reply::Ok(ReplyBody::Unknown),
        ReplyKind::Lease => Reply::Ok(ReplyBody::Lease {
            ms: r.u32("lease")?,
        }),
    };
    r.finish()?;
    Ok((id, reply))
}

/// The version of the cluster map (which data stores serve which group, and how):
/// every change bumps it; a client gets it with the map (hello); a commit names the
/// epoch its pages were written under, refused if a store that takes writes now
/// joined after it. 32 bits: at one change a second, 136 years.
pub type Epoch = u32;

/// The request id of a message, if it has a valid header (to answer garbage).
pub fn peek_id(b: &[u8]) -> Option<u64> {
    let mut r = Reader::new(b);
    read_header(&mut r).ok().map(|(_, id)| id)
}

/// Whether `b` has a valid header of a reply (how a server that also sends requests,
/// as a primary MDS to its mirror does, tells answers from requests).
pub fn is_reply(b: &[u8]) -> bool {
    let mut r = Reader::new(b);
    matches!(read_header(&mut r), Ok((K_REPLY, _)))
}
