//! The messages and their encodings.

use orion_fabric::RemoteRegion;
use orion_format::{Entry, FileType, Gpa, Tail, MAX_ENTRY_LINES, SUPERBLOCK_SIZE};
use orion_meta::{Attr, RenameMode, StatFs};

use crate::codec::{ProtoError, Reader, Writer};
use crate::{HEADER, MAGIC, VERSION};

/// Most entries one log commit may carry (a commit fits in one message).
pub const MAX_COMMIT_ENTRIES: usize = 256;
/// Most pages one `Persisted` notice may name.
pub const MAX_PERSISTED: usize = 4096;
/// Most data stores a cluster map may list.
pub const MAX_STORES: usize = 1024;
const MAX_TEXT: usize = 4096;

/// What a client tells the MDS when it connects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The replication group of the data store beside this client, if it maps that
    /// store's pool (an internal client, paper §5.1).
    pub internal_group: Option<u16>,
    /// Strong data consistency (paper §5.3): commits wait until the data stores have
    /// persisted the pages. Weak commits at once.
    pub strong: bool,
    /// Free text for logs (host and process).
    pub name: String,
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
    /// A symlink's target: the page (from the client's chunk) and its length.
    pub symlink: Option<(Gpa, u32)>,
}

/// What a data store tells the MDS when it joins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DsHello {
    pub group: u16,
    pub page_count: u64,
    pub pool_uuid: [u8; 16],
    /// All zeros for a pool that has never joined a cluster.
    pub cluster_uuid: [u8; 16],
    /// Where clients reach this store.
    pub addr: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
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
    DsHello(DsHello),
    /// A data store persisted these pages (strong mode); no reply.
    Persisted {
        pages: Vec<Gpa>,
    },
    /// A client asks a data store where its pool is.
    DsInfo,
    /// A client asks a data store to make every page written so far durable.
    Flush,
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

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreInfo {
    pub group: u16,
    pub addr: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloReply {
    pub client_id: u64,
    /// The MDS pool's superblock: where slots and log pages are.
    pub superblock: Vec<u8>,
    /// The MDS pool, readable one-sided.
    pub pool: RemoteRegion,
    pub stores: Vec<StoreInfo>,
    /// How long freed pages wait before reuse: a client trusts a cached data page
    /// for less than this (the page cannot have been reused meanwhile).
    pub grace_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DsInfoReply {
    pub group: u16,
    /// The data pool, readable and writable one-sided.
    pub region: RemoteRegion,
    /// Where the pool file is, for a client on the same host to map it.
    pub pool_path: String,
    pub pool_uuid: [u8; 16],
    pub page_area_off: u64,
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
    },
    DsInfo(DsInfoReply),
    /// A conflicting lock (its owner is the holder's, not meaningful to the asker), or
    /// none.
    Lock(Option<LockReq>),
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

const K_REPLY: u8 = 0x80;

fn header(w: &mut Writer, kind: u8, id: u64) {
    let start = w.buf.len();
    w.u16(MAGIC).u8(VERSION).u8(kind).u32(0).u64(id);
    debug_assert_eq!(w.buf.len() - start, HEADER);
}

fn read_header(r: &mut Reader) -> Result<(u8, u64), ProtoError> {
    let magic = r.u16("magic")?;
    if magic != MAGIC {
        return Err(ProtoError::BadMagic(magic));
    }
    let v = r.u8("version")?;
    if v != VERSION {
        return Err(ProtoError::BadVersion(v));
    }
    let kind = r.u8("kind")?;
    r.u32("pad")?;
    Ok((kind, r.u64("request id")?))
}

fn name(r: &mut Reader) -> Result<Vec<u8>, ProtoError> {
    // Names are checked by the file system (ENAMETOOLONG, with the name's length);
    // the wire only bounds them.
    Ok(r.bytes(MAX_TEXT, "name")?.to_vec())
}

fn text(r: &mut Reader, what: &'static str) -> Result<String, ProtoError> {
    let b = r.bytes(MAX_TEXT, what)?;
    String::from_utf8(b.to_vec()).map_err(|_| ProtoError::Invalid(what))
}

fn uuid(r: &mut Reader) -> Result<[u8; 16], ProtoError> {
    let mut u = [0u8; 16];
    u.copy_from_slice(r.take(16, "uuid")?);
    Ok(u)
}

fn region(r: &mut Reader) -> Result<RemoteRegion, ProtoError> {
    RemoteRegion::decode(r.take(RemoteRegion::ENCODED_LEN, "region")?)
        .ok_or(ProtoError::Invalid("region"))
}

fn ftype(r: &mut Reader) -> Result<FileType, ProtoError> {
    FileType::from_code(r.u8("file type")?).map_err(|_| ProtoError::Invalid("file type"))
}

fn put_entries(w: &mut Writer, entries: &[Entry]) {
    w.u32(entries.len() as u32);
    for e in entries {
        w.buf.extend_from_slice(&e.encode());
    }
}

fn entries(r: &mut Reader) -> Result<Vec<Entry>, ProtoError> {
    let n = r.u32("entry count")? as usize;
    if n > MAX_COMMIT_ENTRIES {
        return Err(ProtoError::Invalid("entry count"));
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let rest = r.rest();
        let (e, lines) = Entry::decode(rest).map_err(|_| ProtoError::Invalid("log entry"))?;
        if lines == 0 || lines > MAX_ENTRY_LINES || matches!(e, Entry::Pad { .. }) {
            return Err(ProtoError::Invalid("log entry"));
        }
        r.take(lines * orion_format::LINE as usize, "log entry")?;
        out.push(e);
    }
    Ok(out)
}

fn put_attr(w: &mut Writer, a: &Attr) {
    w.u64(a.ino)
        .u8(a.ftype as u8)
        .u32(a.mode)
        .u32(a.uid)
        .u32(a.gid)
        .u32(a.nlink)
        .u64(a.size)
        .i64(a.atime)
        .i64(a.mtime)
        .i64(a.ctime)
        .u32(a.rdev)
        .u64(a.blocks);
}

fn attr(r: &mut Reader) -> Result<Attr, ProtoError> {
    Ok(Attr {
        ino: r.u64("ino")?,
        ftype: ftype(r)?,
        mode: r.u32("mode")?,
        uid: r.u32("uid")?,
        gid: r.u32("gid")?,
        nlink: r.u32("nlink")?,
        size: r.u64("size")?,
        atime: r.i64("atime")?,
        mtime: r.i64("mtime")?,
        ctime: r.i64("ctime")?,
        rdev: r.u32("rdev")?,
        blocks: r.u64("blocks")?,
    })
}

fn tail(r: &mut Reader, what: &'static str) -> Result<Tail, ProtoError> {
    Ok(Tail::unpack(r.u64(what)?))
}

/// Appends the encoding of `req` with request id `id` to `out`.
pub fn encode_request(out: &mut Vec<u8>, id: u64, req: &Request) {
    let mut w = Writer {
        buf: std::mem::take(out),
    };
    let kind = match req {
        Request::Hello(_) => 1,
        Request::Ping => 2,
        Request::AllocChunk { .. } => 3,
        Request::Commit(_) => 4,
        Request::Create(_) => 5,
        Request::Unlink { .. } => 6,
        Request::Rmdir { .. } => 7,
        Request::Rename { .. } => 8,
        Request::Link { .. } => 9,
        Request::Statfs => 10,
        Request::Parent { .. } => 11,
        Request::DsHello(_) => 12,
        Request::Persisted { .. } => 13,
        Request::DsInfo => 14,
        Request::Flush => 15,
        Request::Lock(_) => 16,
        Request::TestLock(_) => 17,
        Request::ReleaseLocks { .. } => 18,
    };
    header(&mut w, kind, id);
    match req {
        Request::Hello(h) => {
            w.opt_u32(h.internal_group.map(u32::from))
                .bool(h.strong)
                .bytes(h.name.as_bytes());
        }
        Request::Ping | Request::Statfs | Request::DsInfo | Request::Flush => {}
        Request::AllocChunk { group, pages } => {
            w.opt_u32(group.map(u32::from)).u32(*pages);
        }
        Request::Commit(c) => {
            w.u64(c.ino)
                .u64(c.generation)
                .opt_u64(c.expect.map(Tail::pack))
                .bool(c.persisted_locally);
            put_entries(&mut w, &c.entries);
        }
        Request::Create(c) => {
            w.u64(c.parent)
                .bytes(&c.name)
                .u8(c.ftype as u8)
                .u32(c.mode)
                .u32(c.uid)
                .u32(c.gid)
                .u32(c.rdev);
            match c.symlink {
                Some((g, len)) => w.u8(1).u64(g.0).u32(len),
                None => w.u8(0),
            };
        }
        Request::Unlink { parent, name } | Request::Rmdir { parent, name } => {
            w.u64(*parent).bytes(name);
        }
        Request::Rename {
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
        Request::Link { ino, parent, name } => {
            w.u64(*ino).u64(*parent).bytes(name);
        }
        Request::Parent { ino } => {
            w.u64(*ino);
        }
        Request::DsHello(d) => {
            w.u16(d.group).u64(d.page_count);
            w.buf.extend_from_slice(&d.pool_uuid);
            w.buf.extend_from_slice(&d.cluster_uuid);
            w.bytes(d.addr.as_bytes());
        }
        Request::Lock(l) | Request::TestLock(l) => put_lock(&mut w, l),
        Request::ReleaseLocks { ino, owner } => {
            w.u64(*ino).u64(*owner);
        }
        Request::Persisted { pages } => {
            w.u32(pages.len() as u32);
            for g in pages {
                w.u64(g.0);
            }
        }
    }
    *out = w.buf;
}

/// Decodes a request: its id and body. Any malformed input is an error.
pub fn decode_request(b: &[u8]) -> Result<(u64, Request), ProtoError> {
    let mut r = Reader::new(b);
    let (kind, id) = read_header(&mut r)?;
    let group = |v: Option<u32>| -> Result<Option<u16>, ProtoError> {
        v.map(|g| u16::try_from(g).map_err(|_| ProtoError::Invalid("group")))
            .transpose()
    };
    let req = match kind {
        1 => Request::Hello(Hello {
            internal_group: group(r.opt_u32("group")?)?,
            strong: r.bool("strong")?,
            name: text(&mut r, "client name")?,
        }),
        2 => Request::Ping,
        3 => Request::AllocChunk {
            group: group(r.opt_u32("group")?)?,
            pages: r.u32("pages")?,
        },
        4 => Request::Commit(Commit {
            ino: r.u64("ino")?,
            generation: r.u64("generation")?,
            expect: r.opt_u64("expected tail")?.map(Tail::unpack),
            persisted_locally: r.bool("persisted locally")?,
            entries: entries(&mut r)?,
        }),
        5 => Request::Create(Create {
            parent: r.u64("parent")?,
            name: name(&mut r)?,
            ftype: ftype(&mut r)?,
            mode: r.u32("mode")?,
            uid: r.u32("uid")?,
            gid: r.u32("gid")?,
            rdev: r.u32("rdev")?,
            symlink: if r.bool("symlink")? {
                Some((Gpa(r.u64("gpa")?), r.u32("target length")?))
            } else {
                None
            },
        }),
        6 => Request::Unlink {
            parent: r.u64("parent")?,
            name: name(&mut r)?,
        },
        7 => Request::Rmdir {
            parent: r.u64("parent")?,
            name: name(&mut r)?,
        },
        8 => Request::Rename {
            old_parent: r.u64("parent")?,
            old_name: name(&mut r)?,
            new_parent: r.u64("parent")?,
            new_name: name(&mut r)?,
            mode: match r.u8("rename mode")? {
                0 => RenameMode::Replace,
                1 => RenameMode::NoReplace,
                2 => RenameMode::Exchange,
                _ => return Err(ProtoError::Invalid("rename mode")),
            },
        },
        9 => Request::Link {
            ino: r.u64("ino")?,
            parent: r.u64("parent")?,
            name: name(&mut r)?,
        },
        10 => Request::Statfs,
        11 => Request::Parent { ino: r.u64("ino")? },
        12 => Request::DsHello(DsHello {
            group: r.u16("group")?,
            page_count: r.u64("page count")?,
            pool_uuid: uuid(&mut r)?,
            cluster_uuid: uuid(&mut r)?,
            addr: text(&mut r, "address")?,
        }),
        13 => {
            let n = r.u32("page count")? as usize;
            if n > MAX_PERSISTED {
                return Err(ProtoError::Invalid("page count"));
            }
            let mut pages = Vec::with_capacity(n);
            for _ in 0..n {
                pages.push(Gpa(r.u64("gpa")?));
            }
            Request::Persisted { pages }
        }
        14 => Request::DsInfo,
        15 => Request::Flush,
        16 => Request::Lock(lock(&mut r)?),
        17 => Request::TestLock(lock(&mut r)?),
        18 => Request::ReleaseLocks {
            ino: r.u64("ino")?,
            owner: r.u64("owner")?,
        },
        k => return Err(ProtoError::UnknownKind(k)),
    };
    r.finish()?;
    Ok((id, req))
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
            w.u8(0).i32(*errno).bytes(&message.as_bytes()[..cut]);
        }
        Reply::Ok(body) => match body {
            ReplyBody::Empty => {
                w.u8(1);
            }
            ReplyBody::Hello(h) => {
                w.u8(2).u64(h.client_id).bytes(&h.superblock);
                w.buf.extend_from_slice(&h.pool.encode());
                w.u32(h.stores.len() as u32);
                for s in &h.stores {
                    w.u16(s.group).bytes(s.addr.as_bytes());
                }
                w.u64(h.grace_ms);
            }
            ReplyBody::Chunk { start, pages } => {
                w.u8(3).u64(start.0).u32(*pages);
            }
            ReplyBody::Committed { prev, tail } => {
                w.u8(4).u64(prev.pack()).u64(tail.pack());
            }
            ReplyBody::Attr(a) => {
                w.u8(5);
                put_attr(&mut w, a);
            }
            ReplyBody::Statfs(s) => {
                w.u8(6)
                    .u32(s.bsize)
                    .u64(s.blocks)
                    .u64(s.bfree)
                    .u64(s.files)
                    .u64(s.ffree)
                    .u32(s.namelen);
            }
            ReplyBody::Ino(i) => {
                w.u8(7).u64(*i);
            }
            ReplyBody::Joined { cluster_uuid } => {
                w.u8(8);
                w.buf.extend_from_slice(cluster_uuid);
            }
            ReplyBody::DsInfo(d) => {
                w.u8(9).u16(d.group);
                w.buf.extend_from_slice(&d.region.encode());
                w.bytes(d.pool_path.as_bytes());
                w.buf.extend_from_slice(&d.pool_uuid);
                w.u64(d.page_area_off).u64(d.page_count);
            }
            ReplyBody::Lock(l) => {
                w.u8(10).bool(l.is_some());
                if let Some(l) = l {
                    put_lock(&mut w, l);
                }
            }
        },
    }
    *out = w.buf;
}

fn put_lock(w: &mut Writer, l: &LockReq) {
    w.u64(l.ino)
        .u64(l.owner)
        .u32(l.pid)
        .u64(l.start)
        .u64(l.end)
        .u8(l.kind as u8);
}

fn lock(r: &mut Reader<'_>) -> Result<LockReq, ProtoError> {
    let l = LockReq {
        ino: r.u64("ino")?,
        owner: r.u64("lock owner")?,
        pid: r.u32("pid")?,
        start: r.u64("lock start")?,
        end: r.u64("lock end")?,
        kind: match r.u8("lock kind")? {
            0 => LockKind::Read,
            1 => LockKind::Write,
            2 => LockKind::Unlock,
            _ => return Err(ProtoError::Invalid("lock kind")),
        },
    };
    if l.end < l.start {
        return Err(ProtoError::Invalid("lock range"));
    }
    Ok(l)
}

/// Decodes a reply: the id of the request it answers, and the reply.
pub fn decode_reply(b: &[u8]) -> Result<(u64, Reply), ProtoError> {
    let mut r = Reader::new(b);
    let (kind, id) = read_header(&mut r)?;
    if kind != K_REPLY {
        return Err(ProtoError::UnknownKind(kind));
    }
    let reply = match r.u8("reply kind")? {
        0 => Reply::Err {
            errno: r.i32("errno")?,
            message: text(&mut r, "error message")?,
        },
        1 => Reply::Ok(ReplyBody::Empty),
        2 => {
            let client_id = r.u64("client id")?;
            let superblock = r.bytes(SUPERBLOCK_SIZE, "superblock")?.to_vec();
            let pool = region(&mut r)?;
            let n = r.u32("store count")? as usize;
            if n > MAX_STORES {
                return Err(ProtoError::Invalid("store count"));
            }
            let mut stores = Vec::with_capacity(n);
            for _ in 0..n {
                stores.push(StoreInfo {
                    group: r.u16("group")?,
                    addr: text(&mut r, "address")?,
                });
            }
            Reply::Ok(ReplyBody::Hello(HelloReply {
                client_id,
                superblock,
                pool,
                stores,
                grace_ms: r.u64("grace")?,
            }))
        }
        3 => Reply::Ok(ReplyBody::Chunk {
            start: Gpa(r.u64("gpa")?),
            pages: r.u32("pages")?,
        }),
        4 => Reply::Ok(ReplyBody::Committed {
            prev: tail(&mut r, "tail")?,
            tail: tail(&mut r, "tail")?,
        }),
        5 => Reply::Ok(ReplyBody::Attr(attr(&mut r)?)),
        6 => Reply::Ok(ReplyBody::Statfs(StatFs {
            bsize: r.u32("bsize")?,
            blocks: r.u64("blocks")?,
            bfree: r.u64("bfree")?,
            files: r.u64("files")?,
            ffree: r.u64("ffree")?,
            namelen: r.u32("namelen")?,
        })),
        7 => Reply::Ok(ReplyBody::Ino(r.u64("ino")?)),
        8 => Reply::Ok(ReplyBody::Joined {
            cluster_uuid: uuid(&mut r)?,
        }),
        9 => Reply::Ok(ReplyBody::DsInfo(DsInfoReply {
            group: r.u16("group")?,
            region: region(&mut r)?,
            pool_path: text(&mut r, "pool path")?,
            pool_uuid: uuid(&mut r)?,
            page_area_off: r.u64("page area")?,
            page_count: r.u64("page count")?,
        })),
        10 => Reply::Ok(ReplyBody::Lock(if r.bool("lock present")? {
            Some(lock(&mut r)?)
        } else {
            None
        })),
        _ => return Err(ProtoError::Invalid("reply kind")),
    };
    r.finish()?;
    Ok((id, reply))
}

/// The request id of a message, if it has a valid header (to answer garbage).
pub fn peek_id(b: &[u8]) -> Option<u64> {
    let mut r = Reader::new(b);
    read_header(&mut r).ok().map(|(_, id)| id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use orion_format::{SetAttrRec, WriteRec};
    use proptest::prelude::*;

    fn sample_requests() -> Vec<Request> {
        vec![
            Request::Hello(Hello {
                internal_group: Some(3),
                strong: true,
                name: "host:42".into(),
            }),
            Request::Ping,
            Request::AllocChunk {
                group: None,
                pages: 256,
            },
            Request::Commit(Commit {
                ino: 7,
                generation: 3,
                expect: Some(Tail {
                    version: 2,
                    offset: 64 * 99,
                }),
                persisted_locally: false,
                entries: vec![
                    Entry::Write(WriteRec {
                        pgoff: 1,
                        npages: 2,
                        gpa: Gpa::new(1, 9),
                        size: 12288,
                        mtime: 5,
                    }),
                    Entry::SetAttr(SetAttrRec {
                        mask: 1,
                        mode: 0o600,
                        ..Default::default()
                    }),
                ],
            }),
            Request::Create(Create {
                parent: 1,
                name: b"x".to_vec(),
                ftype: FileType::Symlink,
                mode: 0o777,
                uid: 1,
                gid: 2,
                rdev: 0,
                symlink: Some((Gpa::new(0, 4), 10)),
            }),
            Request::Rename {
                old_parent: 1,
                old_name: b"a".to_vec(),
                new_parent: 2,
                new_name: b"b".to_vec(),
                mode: RenameMode::Exchange,
            },
            Request::DsHello(DsHello {
                group: 1,
                page_count: 100,
                pool_uuid: [1; 16],
                cluster_uuid: [0; 16],
                addr: "127.0.0.1:5".into(),
            }),
            Request::Persisted {
                pages: vec![Gpa::new(0, 1), Gpa::new(0, 2)],
            },
            Request::Lock(sample_lock()),
            Request::TestLock(LockReq {
                kind: LockKind::Read,
                ..sample_lock()
            }),
            Request::ReleaseLocks { ino: 9, owner: 77 },
        ]
    }

    fn sample_lock() -> LockReq {
        LockReq {
            ino: 9,
            owner: 0xdead_beef,
            pid: 42,
            start: 100,
            end: u64::MAX,
            kind: LockKind::Write,
        }
    }

    #[test]
    fn requests_and_replies_round_trip() {
        for (i, req) in sample_requests().into_iter().enumerate() {
            let mut b = Vec::new();
            encode_request(&mut b, i as u64, &req);
            assert_eq!(decode_request(&b).unwrap(), (i as u64, req));
        }
        let reply = Reply::Ok(ReplyBody::Committed {
            prev: Tail {
                version: 0,
                offset: 128,
            },
            tail: Tail {
                version: 0,
                offset: 256,
            },
        });
        let mut b = Vec::new();
        encode_reply(&mut b, 9, &reply);
        assert_eq!(decode_reply(&b).unwrap(), (9, reply));
        for l in [None, Some(sample_lock())] {
            let reply = Reply::Ok(ReplyBody::Lock(l));
            b.clear();
            encode_reply(&mut b, 3, &reply);
            assert_eq!(decode_reply(&b).unwrap(), (3, reply));
        }
        // A range that ends before it starts is refused.
        let bad = Request::Lock(LockReq {
            start: 10,
            end: 9,
            ..sample_lock()
        });
        b.clear();
        encode_request(&mut b, 1, &bad);
        assert!(decode_request(&b).is_err());
        let err = Reply::Err {
            errno: 2,
            message: "é".repeat(5000),
        };
        b.clear();
        encode_reply(&mut b, 1, &err);
        let (_, Reply::Err { message, .. }) = decode_reply(&b).unwrap() else {
            panic!("not an error reply")
        };
        assert!(message.len() <= MAX_TEXT);
    }

    #[test]
    fn truncations_and_trailing_bytes_are_errors() {
        for req in sample_requests() {
            let mut b = Vec::new();
            encode_request(&mut b, 1, &req);
            for cut in 0..b.len() {
                assert!(decode_request(&b[..cut]).is_err(), "{req:?} cut at {cut}");
            }
            b.push(0);
            assert_eq!(decode_request(&b).unwrap_err(), ProtoError::Trailing(1));
        }
    }

    proptest! {
        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode_request(&b);
            let _ = decode_reply(&b);
            let mut h = b.clone();
            if h.len() >= HEADER {
                let kind = h[3] % 16;
                h[..4].copy_from_slice(&[0x4F, 0x52, VERSION, kind]);
                let _ = decode_request(&h);
                h[3] = K_REPLY;
                let _ = decode_reply(&h);
            }
        }
    }
}
