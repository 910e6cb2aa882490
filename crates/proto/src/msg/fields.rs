//! The codecs of the fields that messages share: the header, names, regions,
//! file types, pages, log entries, attributes, tails and lock requests.

use orion_fabric::RemoteRegion;
use orion_format::{Entry, FileType, Gpa, Tail, MAX_ENTRY_LINES};
use orion_meta::Attr;

use super::{LockKind, LockReq, MAX_COMMIT_ENTRIES, MAX_PERSISTED, MAX_TEXT};
use crate::codec::{ProtoError, Reader, Writer};
use crate::{HEADER, MAGIC, VERSION};

pub(crate) fn header(w: &mut Writer, kind: u8, id: u64) {
    let start = w.buf.len();
    w.u16(MAGIC).u8(VERSION).u8(kind).u32(0).u64(id);
    debug_assert_eq!(w.buf.len() - start, HEADER);
}

pub(crate) fn read_header(r: &mut Reader) -> Result<(u8, u64), ProtoError> {
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

pub(crate) fn name(r: &mut Reader) -> Result<Vec<u8>, ProtoError> {
    // Names are checked by the file system (ENAMETOOLONG, with the name's length);
    // the wire only bounds them.
    Ok(r.bytes(MAX_TEXT, "name")?.to_vec())
}

pub(crate) fn text(r: &mut Reader, what: &'static str) -> Result<String, ProtoError> {
    let b = r.bytes(MAX_TEXT, what)?;
    String::from_utf8(b.to_vec()).map_err(|_| ProtoError::Invalid(what))
}

pub(crate) fn uuid(r: &mut Reader) -> Result<[u8; 16], ProtoError> {
    let mut u = [0u8; 16];
    u.copy_from_slice(r.take(16, "uuid")?);
    Ok(u)
}

pub(crate) fn region(r: &mut Reader) -> Result<RemoteRegion, ProtoError> {
    RemoteRegion::decode(r.take(RemoteRegion::ENCODED_LEN, "region")?)
        .ok_or(ProtoError::Invalid("region"))
}

pub(crate) fn ftype(r: &mut Reader) -> Result<FileType, ProtoError> {
    FileType::from_code(r.u8("file type")?).map_err(|_| ProtoError::Invalid("file type"))
}

/// A list of data pages (a store's notice, the MDS's request to persist).
pub(crate) fn put_pages(w: &mut Writer, pages: &[Gpa]) {
    // Senders cut their lists at the limit (`chunks(MAX_PERSISTED)`): the peer refuses more.
    debug_assert!(
        pages.len() <= MAX_PERSISTED,
        "{} pages in one list",
        pages.len()
    );
    w.u32(pages.len() as u32);
    for g in pages {
        w.u64(g.0);
    }
}

pub(crate) fn pages(r: &mut Reader) -> Result<Vec<Gpa>, ProtoError> {
    let n = r.u32("page count")? as usize;
    if n > MAX_PERSISTED {
        return Err(ProtoError::Invalid("page count"));
    }
    let mut pages = Vec::with_capacity(n);
    for _ in 0..n {
        pages.push(Gpa(r.u64("gpa")?));
    }
    Ok(pages)
}

pub(crate) fn put_entries(w: &mut Writer, entries: &[Entry]) {
    w.u32(entries.len() as u32);
    for e in entries {
        w.buf.extend_from_slice(&e.encode());
    }
}

pub(crate) fn entries(r: &mut Reader) -> Result<Vec<Entry>, ProtoError> {
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

pub(crate) fn put_attr(w: &mut Writer, a: &Attr) {
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
        .u64(a.blocks)
        .u64(a.generation);
}

pub(crate) fn attr(r: &mut Reader) -> Result<Attr, ProtoError> {
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
        generation: r.u64("generation")?,
    })
}

pub(crate) fn tail(r: &mut Reader, what: &'static str) -> Result<Tail, ProtoError> {
    Ok(Tail::unpack(r.u64(what)?))
}

pub(crate) fn put_lock(w: &mut Writer, l: &LockReq) {
    w.u64(l.ino)
        .u64(l.owner)
        .u32(l.pid)
        .u64(l.start)
        .u64(l.end)
        .u8(l.kind as u8);
}

pub(crate) fn lock(r: &mut Reader<'_>) -> Result<LockReq, ProtoError> {
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
