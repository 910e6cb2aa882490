//! Inode logs: walking them from head to tail, and appending in the order that keeps
//! them crash-consistent (paper §4.2, DESIGN §2): write the entries (and any new page,
//! linked from the old last segment), persist them, and only then store and persist
//! the tail. The tail store is the commit point; everything past it is invisible.
//!
//! A log is a chain of segments: an inode's log starts in its fixed 256-byte first
//! segment (a log GC writes starts on a page instead) and goes on in 4 KiB pages of
//! the page area. Where a segment starts and how long it is follow from its address
//! ([`Superblock::log_segment_len`]), so a position alone names its segment.

use orion_format::{
    Entry, LogPageHeader, Superblock, Tail, FIRST_SEGMENT_SIZE, LINE, LOG_PAGE_HEADER,
    MAX_ENTRY_LINES, PAGE_NEXT_OFFSET, PAGE_SIZE, SLOT_TAIL_OFFSET,
};
use orion_pmem::Pool;

use crate::alloc::PageAllocator;
use crate::error::{FsError, FsResult};

/// Anything log pages can be read from: the MDS pool, or a client's copy of a log.
pub trait PageSource {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> FsResult<()>;
}

impl PageSource for Pool {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> FsResult<()> {
        Ok(self.read(off, buf)?)
    }
}

/// Where an inode's log lives: its segments in order, and the committed tail.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InodeLog {
    pub head: u64,
    pub tail: Tail,
    /// Pool offsets of the log's segments, head first; the last one holds the tail.
    /// All but a first segment are pages of the page area.
    pub pages: Vec<u64>,
    /// Entries in the log, padding excluded.
    pub entries: u64,
}

/// Entries appended past the tail, persisted, waiting for their tail store.
#[derive(Debug)]
pub struct PendingTail {
    pub tail: Tail,
    pub new_pages: Vec<u64>,
    pub entries: u64,
}

/// Walks `ino`'s log from `head` to `tail`, calling `f` with each entry and its pool
/// offset. Fails on a damaged or foreign segment, a log that ends before its tail, or
/// one longer than the pool has segments (a cycle).
pub fn walk_log(
    src: &dyn PageSource,
    sb: &Superblock,
    ino: u64,
    head: u64,
    tail: Tail,
    f: &mut dyn FnMut(&Entry, u64) -> FsResult<()>,
) -> FsResult<InodeLog> {
    if sb.log_segment_len(ino, head).is_none() {
        return Err(FsError::Corrupt(format!(
            "inode {ino}: log head {head} is neither its first segment nor a page"
        )));
    }
    walk_segments(src, sb, ino, head, LOG_PAGE_HEADER, tail, f)
}

/// Walks `ino`'s log from the entry at pool offset `from` (a position an earlier walk
/// ended at, or a segment's first entry) to `tail`: how a client's cached copy of a
/// log catches up. The returned log's segments start with the one holding `from`.
pub fn walk_log_from(
    src: &dyn PageSource,
    sb: &Superblock,
    ino: u64,
    from: u64,
    tail: Tail,
    f: &mut dyn FnMut(&Entry, u64) -> FsResult<()>,
) -> FsResult<InodeLog> {
    let start = sb
        .log_segment_holding(from)
        .filter(|&s| sb.log_segment_len(ino, s).is_some())
        .filter(|&s| from - s >= LOG_PAGE_HEADER && from.is_multiple_of(LINE));
    let Some(start) = start else {
        return Err(FsError::Corrupt(format!(
            "inode {ino}: log position {from} is not an entry"
        )));
    };
    walk_segments(src, sb, ino, start, from - start, tail, f)
}

/// Walks the log from byte `first_at` of segment `start` to `tail`.
fn walk_segments(
    src: &dyn PageSource,
    sb: &Superblock,
    ino: u64,
    start: u64,
    mut first_at: u64,
    tail: Tail,
    f: &mut dyn FnMut(&Entry, u64) -> FsResult<()>,
) -> FsResult<InodeLog> {
    let corrupt = |what: String| FsError::Corrupt(format!("inode {ino}: {what}"));
    let mut seg = vec![0u8; PAGE_SIZE as usize];
    let mut log = InodeLog {
        head: start,
        tail,
        pages: Vec::new(),
        entries: 0,
    };
    let mut cur = start;
    loop {
        // Every segment but the first is a page: a log has at most one per page and
        // its own first segment.
        if log.pages.len() as u64 > sb.page_count {
            return Err(corrupt("log has a cycle or runs past the pool".into()));
        }
        let Some(len) = sb.log_segment_len(ino, cur) else {
            return Err(corrupt(format!(
                "log segment pointer {cur} is neither its first segment nor a page"
            )));
        };
        let seg = &mut seg[..len as usize];
        src.read_at(cur, seg)?;
        let hdr =
            LogPageHeader::decode(seg).map_err(|e| corrupt(format!("log segment {cur}: {e}")))?;
        if hdr.ino != ino {
            return Err(corrupt(format!(
                "log segment {cur} belongs to inode {}",
                hdr.ino
            )));
        }
        // Every segment of a log carries its version: one of another version was
        // freed and reused meanwhile (a reader slower than the grace period).
        if hdr.version != tail.version {
            return Err(corrupt(format!(
                "log segment {cur} is of version {}, not {}",
                hdr.version, tail.version
            )));
        }
        log.pages.push(cur);
        let mut at = std::mem::replace(&mut first_at, LOG_PAGE_HEADER);
        loop {
            if cur + at == tail.offset {
                return Ok(log);
            }
            if at >= len {
                break;
            }
            let (entry, lines) = Entry::decode(&seg[at as usize..])
                .map_err(|e| corrupt(format!("entry at {}: {e}", cur + at)))?;
            if !matches!(entry, Entry::Pad { .. }) {
                f(&entry, cur + at)?;
                log.entries += 1;
            }
            at += lines as u64 * LINE;
        }
        if hdr.next == 0 {
            return Err(corrupt(format!(
                "log ends at segment {cur} before its tail {}",
                tail.offset
            )));
        }
        cur = hdr.next;
    }
}

/// The end of the log segment that starts at `start` (a log's first segment or a
/// page; segments the engine wrote, so their geometry holds).
fn segment_end(sb: &Superblock, start: u64) -> u64 {
    match sb.page_index(start) {
        Some(_) => start + PAGE_SIZE,
        None => start + FIRST_SEGMENT_SIZE,
    }
}

/// Bytes left in the segment that holds `tail`.
fn room(sb: &Superblock, log: &InodeLog) -> u64 {
    let last = *log.pages.last().expect("a log has at least one segment");
    segment_end(sb, last) - log.tail.offset
}

/// Writes a fresh log page (header only) and persists it.
pub fn init_log_page(pool: &Pool, page: u64, ino: u64, version: u32) -> FsResult<()> {
    let hdr = LogPageHeader {
        ino,
        version,
        next: 0,
    };
    pool.write(page, &hdr.encode())?;
    pool.persist(page, LOG_PAGE_HEADER as usize)?;
    Ok(())
}

/// How many new log pages appending `entries` to `log` takes.
pub fn pages_needed(sb: &Superblock, log: &InodeLog, entries: &[Entry]) -> u64 {
    let mut space = room(sb, log);
    let mut need = 0u64;
    for e in entries {
        assert!(
            e.lines() <= MAX_ENTRY_LINES,
            "an entry fits in one log page"
        );
        let len = e.lines() as u64 * LINE;
        if len > space {
            need += 1;
            space = PAGE_SIZE - LOG_PAGE_HEADER;
        }
        space -= len;
    }
    need
}

/// Appends `entries` past the committed tail and persists them; the caller makes them
/// visible by storing the returned tail (alone, or through the journal).
#[allow(clippy::too_many_arguments)] // the pool, its allocator and the log: all needed
pub fn append(
    pool: &Pool,
    alloc: &mut PageAllocator,
    sb: &Superblock,
    ino: u64,
    log: &InodeLog,
    entries: &[Entry],
    use_reserve: bool,
    buf: &mut Vec<u8>,
) -> FsResult<PendingTail> {
    let need = pages_needed(sb, log, entries);
    let mut fresh = Vec::with_capacity(need as usize);
    let index = |p: u64| sb.page_index(p).expect("a fresh page is a page");
    for _ in 0..need {
        match alloc.alloc(use_reserve) {
            Some(p) => fresh.push(sb.page_off(p)),
            None => {
                for p in fresh {
                    alloc.free_now(index(p), 1);
                }
                // Pages this update took for inodes appended before this one are
                // still taken here (`MetaEngine::commit` frees them after this): a
                // fresh attempt needs them again, as it has them now, so room for
                // this inode's `need` is room for the whole update.
                return Err(alloc.out_of_room(need, use_reserve));
            }
        }
    }
    let written = write_entries(pool, sb, ino, log, entries, &fresh, buf);
    let pos = match written {
        Ok(pos) => pos,
        Err(e) => {
            // Nothing reaches the fresh pages (the tail has not moved): they go back,
            // as on a failed allocation.
            for p in fresh {
                alloc.free_now(index(p), 1);
            }
            return Err(e);
        }
    };
    assert!(
        !fresh.is_empty() || pos >= log.tail.offset,
        "the tail only moves forward"
    );
    Ok(PendingTail {
        tail: Tail {
            version: log.tail.version,
            offset: pos,
        },
        new_pages: fresh,
        entries: entries
            .iter()
            .filter(|e| !matches!(e, Entry::Pad { .. }))
            .count() as u64,
    })
}

/// Writes and persists `entries` past `log`'s tail, linking in the `fresh` pages as
/// they fill; returns where the entries end (the tail to commit).
fn write_entries(
    pool: &Pool,
    sb: &Superblock,
    ino: u64,
    log: &InodeLog,
    entries: &[Entry],
    fresh: &[u64],
    buf: &mut Vec<u8>,
) -> FsResult<u64> {
    let version = log.tail.version;
    let mut page = *log.pages.last().expect("log has a segment");
    let mut end = segment_end(sb, page);
    let mut pos = log.tail.offset;
    let mut dirty_from = pos;
    let mut next_fresh = fresh.iter();
    for e in entries {
        e.encode_into(buf);
        let len = buf.len() as u64;
        assert_eq!(
            len,
            e.lines() as u64 * LINE,
            "an entry encodes to its planned size"
        );
        debug_assert!(
            Entry::decode(buf).is_ok_and(|(back, _)| back == *e),
            "an entry decodes back to itself (checksum and fields)"
        );
        if len > end - pos {
            let left = end - pos;
            if left > 0 {
                let pad = Entry::Pad {
                    lines: (left / LINE) as u8,
                };
                pool.write(pos, &pad.encode())?;
            }
            pool.persist(dirty_from, (end - dirty_from) as usize)?;
            let new_page = *next_fresh.next().expect("planned pages");
            init_log_page(pool, new_page, ino, version)?;
            // Link it: an 8-byte store past the tail, so still invisible to readers.
            pool.store_u64(page + PAGE_NEXT_OFFSET, new_page)?;
            pool.persist(page + PAGE_NEXT_OFFSET, 8)?;
            page = new_page;
            end = new_page + PAGE_SIZE;
            pos = new_page + LOG_PAGE_HEADER;
            dirty_from = pos;
        }
        pool.write(pos, buf)?;
        pos += len;
    }
    pool.persist(dirty_from, (pos - dirty_from) as usize)?;
    // The plan and the writes agree: every planned page was linked in, and the tail
    // moved forward inside the page it ended on.
    assert!(
        next_fresh.next().is_none(),
        "every planned log page is used"
    );
    assert!(pos >= page + LOG_PAGE_HEADER && pos <= end);
    Ok(pos)
}

/// The commit point of a single-inode update: store and persist the packed tail.
pub fn commit_tail(pool: &Pool, slot_off: u64, tail: Tail) -> FsResult<()> {
    let at = slot_off + SLOT_TAIL_OFFSET;
    pool.store_u64(at, tail.pack())?;
    pool.persist(at, 8)?;
    Ok(())
}

impl InodeLog {
    /// A log with no entries yet on a freshly initialised `page` (see [`init_log_page`]).
    pub fn empty(page: u64, version: u32) -> InodeLog {
        InodeLog {
            head: page,
            tail: Tail {
                version,
                offset: page + LOG_PAGE_HEADER,
            },
            pages: vec![page],
            entries: 0,
        }
    }

    /// Applies a committed append to the DRAM copy of the log position.
    pub fn advance(&mut self, p: PendingTail) {
        assert_eq!(
            p.tail.version, self.tail.version,
            "an append keeps the version"
        );
        assert!(
            !p.new_pages.is_empty() || p.tail.offset >= self.tail.offset,
            "the tail only moves forward"
        );
        self.tail = p.tail;
        self.pages.extend(p.new_pages);
        self.entries += p.entries;
    }
}
