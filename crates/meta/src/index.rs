//! DRAM state of one inode, built by applying its log entries in order: attributes,
//! and a name index (directories) or an extent index (files). The MDS and a client's
//! cached copy run exactly this code on the same entries and get the same state.

use std::collections::{BTreeMap, HashMap};

use orion_format::{
    attr_mask as m, DirEntryRec, Entry, FileType, Gpa, SetAttrRec, WriteRec, XattrRec, PAGE_SIZE,
};

use crate::error::{FsError, FsResult};

/// Attributes as `stat` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub ftype: FileType,
    /// Permission bits (including setuid, setgid, sticky), without the type bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub rdev: u32,
    /// 512-byte blocks of data pages held.
    pub blocks: u64,
    /// The inode slot's generation: inode numbers are reused, and (number,
    /// generation) names one file for all time (a FUSE entry's generation, which
    /// the kernel puts in the file handles it exports).
    pub generation: u64,
}

impl Attr {
    /// `st_mode`: type bits and permission bits.
    pub fn st_mode(&self) -> u32 {
        self.ftype.mode_bits() | self.mode
    }
}

/// One name in a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirEnt {
    pub ino: u64,
    pub ftype: FileType,
    /// Stable readdir offset (1 and 2 are "." and "..").
    pub cookie: u64,
}

/// Name index of a directory: O(1) lookup by name, and names in cookie order for
/// readdir offsets that stay valid while the directory changes.
#[derive(Default, Debug)]
pub struct DirIndex {
    pub names: HashMap<Box<[u8]>, DirEnt>,
    pub by_cookie: BTreeMap<u64, Box<[u8]>>,
    pub next_cookie: u64,
}

/// Where one file page lives, and which write entry put it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub gpa: Gpa,
    pub write_seq: u64,
}

/// Extent index of a regular file: file page → data page, plus how many pages each
/// write entry still maps (an entry that maps none is dead, for log GC).
#[derive(Default, Debug)]
pub struct FileIndex {
    pub pages: BTreeMap<u64, Extent>,
    live_pages: crate::FastMap<u64, u32>,
    next_seq: u64,
}

impl FileIndex {
    pub fn get(&self, pgoff: u64) -> Option<Gpa> {
        self.pages.get(&pgoff).map(|e| e.gpa)
    }

    /// Write entries that still map at least one page.
    pub fn live_writes(&self) -> u64 {
        self.live_pages.len() as u64
    }

    fn unmap(&mut self, ext: Extent, freed: &mut Vec<Gpa>) {
        freed.push(ext.gpa);
        if let Some(c) = self.live_pages.get_mut(&ext.write_seq) {
            *c -= 1;
            if *c == 0 {
                self.live_pages.remove(&ext.write_seq);
            }
        }
    }

    fn map(&mut self, w: &WriteRec, freed: &mut Vec<Gpa>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        for i in 0..w.npages as u64 {
            let ext = Extent {
                gpa: w.gpa.offset_by(i),
                write_seq: seq,
            };
            if let Some(old) = self.pages.insert(w.pgoff + i, ext) {
                self.unmap(old, freed);
            }
        }
        self.live_pages.insert(seq, w.npages);
    }

    /// Unmaps `n` pages from `first` (a punched hole).
    fn punch(&mut self, first: u64, n: u64, freed: &mut Vec<Gpa>) {
        let end = first.saturating_add(n);
        let gone: Vec<u64> = self.pages.range(first..end).map(|(&p, _)| p).collect();
        for p in gone {
            let ext = self.pages.remove(&p).expect("listed above");
            self.unmap(ext, freed);
        }
    }

    /// Drops every page at or past `first_dropped`.
    fn truncate_pages(&mut self, first_dropped: u64, freed: &mut Vec<Gpa>) {
        let tail = self.pages.split_off(&first_dropped);
        for (_, ext) in tail {
            self.unmap(ext, freed);
        }
    }

    /// Maximal runs of file pages mapped to consecutive data pages.
    pub fn runs(&self) -> Vec<(u64, Gpa, u32)> {
        let mut runs: Vec<(u64, Gpa, u32)> = Vec::new();
        for (&pg, ext) in &self.pages {
            match runs.last_mut() {
                Some(last) if extends(*last, pg, ext.gpa) => last.2 += 1,
                _ => runs.push((pg, ext.gpa, 1)),
            }
        }
        runs
    }

    /// After log GC rewrote the file's writes as [`FileIndex::runs`] (one write entry
    /// per run, in order), each run is one live entry: the pages of a run get a
    /// sequence number of their own, so later overwrites count dead entries against
    /// the compacted log. One pass, no allocation per page: this is what keeps a GC
    /// of a large file off the commit's tail (the earlier way rebuilt the whole index
    /// from the compacted entries).
    pub fn renumber_as_runs(&mut self) {
        self.live_pages.clear();
        let mut last: Option<(u64, Gpa, u32)> = None;
        for (&pg, ext) in self.pages.iter_mut() {
            match last.as_mut() {
                Some(run) if extends(*run, pg, ext.gpa) => run.2 += 1,
                _ => {
                    if let Some(run) = last {
                        self.live_pages.insert(self.next_seq - 1, run.2);
                    }
                    self.next_seq += 1;
                    last = Some((pg, ext.gpa, 1));
                }
            }
            ext.write_seq = self.next_seq - 1;
        }
        if let Some(run) = last {
            self.live_pages.insert(self.next_seq - 1, run.2);
        }
    }
}

/// Whether the file page `pg`, mapped to `gpa`, continues the run `last` (file page,
/// data page, length): the same rule for listing runs and for numbering them.
fn extends(last: (u64, Gpa, u32), pg: u64, gpa: Gpa) -> bool {
    last.0 + last.2 as u64 == pg
        && last.1.offset_by(last.2 as u64) == gpa
        && last.2 < orion_format::MAX_WRITE_PAGES
}

#[derive(Debug)]
pub enum Body {
    File(FileIndex),
    Dir(DirIndex),
    Symlink(Option<(Gpa, u32)>),
    /// FIFOs, sockets and device nodes carry no data.
    Special,
}

/// An inode as rebuilt from its log.
#[derive(Debug)]
pub struct InodeState {
    pub attr: Attr,
    pub body: Body,
    /// Extended attributes: name → the data page holding the value, and its length.
    pub xattrs: BTreeMap<Box<[u8]>, (Gpa, u32)>,
}

impl InodeState {
    /// A fresh inode of slot generation `generation`, before its log applies.
    pub fn new(ino: u64, ftype: FileType, generation: u64) -> InodeState {
        let body = match ftype {
            FileType::Regular => Body::File(FileIndex::default()),
            FileType::Directory => Body::Dir(DirIndex {
                next_cookie: 3,
                ..Default::default()
            }),
            FileType::Symlink => Body::Symlink(None),
            _ => Body::Special,
        };
        InodeState {
            attr: Attr {
                ino,
                ftype,
                mode: 0,
                uid: 0,
                gid: 0,
                nlink: 0,
                size: 0,
                atime: 0,
                mtime: 0,
                ctime: 0,
                rdev: 0,
                blocks: 0,
                generation,
            },
            body,
            xattrs: BTreeMap::new(),
        }
    }

    /// Every data page the inode holds: file pages, a symlink's target, xattr values.
    pub fn data_pages(&self) -> Vec<Gpa> {
        let mut out: Vec<Gpa> = match &self.body {
            Body::File(f) => f.pages.values().map(|e| e.gpa).collect(),
            Body::Symlink(Some((g, _))) => vec![*g],
            _ => Vec::new(),
        };
        out.extend(self.xattrs.values().map(|&(g, _)| g));
        out
    }

    pub fn dir(&self) -> Option<&DirIndex> {
        match &self.body {
            Body::Dir(d) => Some(d),
            _ => None,
        }
    }

    pub fn file(&self) -> Option<&FileIndex> {
        match &self.body {
            Body::File(f) => Some(f),
            _ => None,
        }
    }

    /// Whether `other` is the same inode as far as any reader can tell: attributes,
    /// extended attributes, and the body (file pages, directory names with their
    /// cookies, symlink target). Which write entry mapped a page is not compared: log
    /// GC merges runs into fewer entries.
    pub fn same_contents(&self, other: &InodeState) -> bool {
        let body = match (&self.body, &other.body) {
            (Body::File(a), Body::File(b)) => {
                a.pages.len() == b.pages.len()
                    && a.pages
                        .iter()
                        .zip(&b.pages)
                        .all(|(x, y)| x.0 == y.0 && x.1.gpa == y.1.gpa)
            }
            (Body::Dir(a), Body::Dir(b)) => {
                a.names == b.names && a.by_cookie == b.by_cookie && a.next_cookie == b.next_cookie
            }
            (Body::Symlink(a), Body::Symlink(b)) => a == b,
            (Body::Special, Body::Special) => true,
            _ => false,
        };
        body && self.attr == other.attr && self.xattrs == other.xattrs
    }

    /// Entries a compacted log would need: attributes, link count, and the body's
    /// live entries. Everything else in the log is dead.
    pub fn live_entries(&self) -> u64 {
        2 + self.xattrs.len() as u64
            + match &self.body {
                Body::File(f) => f.live_writes(),
                Body::Dir(d) => d.names.len() as u64 + 1, // + its next-cookie entry
                Body::Symlink(s) => s.is_some() as u64,
                Body::Special => 0,
            }
    }

    /// File pages a log GC walks to find the runs it writes (0 but for files).
    pub fn mapped_pages(&self) -> u64 {
        match &self.body {
            Body::File(f) => f.pages.len() as u64,
            _ => 0,
        }
    }

    /// Applies one entry. Data pages the entry supersedes are pushed to `freed`.
    pub fn apply(&mut self, e: &Entry, freed: &mut Vec<Gpa>) -> FsResult<()> {
        let ino = self.attr.ino;
        let bad = |what: &str| Err(FsError::Corrupt(format!("inode {ino}: {what}")));
        match (e, &mut self.body) {
            (Entry::Pad { .. }, _) => {}
            (Entry::SetAttr(a), body) => {
                let a: &SetAttrRec = a;
                if a.mask & m::SIZE != 0 {
                    if let Body::File(f) = body {
                        if a.size < self.attr.size {
                            f.truncate_pages(a.size.div_ceil(PAGE_SIZE), freed);
                        }
                    }
                    self.attr.size = a.size;
                }
                if a.mask & m::MODE != 0 {
                    self.attr.mode = a.mode & 0o7777;
                }
                if a.mask & m::UID != 0 {
                    self.attr.uid = a.uid;
                }
                if a.mask & m::GID != 0 {
                    self.attr.gid = a.gid;
                }
                if a.mask & m::ATIME != 0 {
                    self.attr.atime = a.atime;
                }
                if a.mask & m::MTIME != 0 {
                    self.attr.mtime = a.mtime;
                }
                if a.mask & m::CTIME != 0 {
                    self.attr.ctime = a.ctime;
                }
                if a.mask & m::RDEV != 0 {
                    self.attr.rdev = a.rdev;
                }
            }
            (Entry::LinkChange { nlink, ctime }, _) => {
                self.attr.nlink = *nlink;
                self.attr.ctime = *ctime;
            }
            (Entry::Write(w), Body::File(f)) => {
                f.map(w, freed);
                // A write never shrinks a file: two clients' writes committed in either
                // order leave the larger size (only a set-attribute entry truncates).
                self.attr.size = self.attr.size.max(w.size);
                self.attr.mtime = w.mtime;
                self.attr.ctime = w.mtime;
            }
            (Entry::DirAdd(d), Body::Dir(dir)) => {
                let d: &DirEntryRec = d;
                if dir.names.contains_key(d.name.as_slice()) {
                    return bad("directory adds a name it already holds");
                }
                let name: Box<[u8]> = d.name.clone().into_boxed_slice();
                dir.names.insert(
                    name.clone(),
                    DirEnt {
                        ino: d.ino,
                        ftype: d.ftype,
                        cookie: d.cookie,
                    },
                );
                dir.by_cookie.insert(d.cookie, name);
                dir.next_cookie = dir.next_cookie.max(d.cookie.saturating_add(1));
                self.attr.mtime = d.time;
                self.attr.ctime = d.time;
            }
            (Entry::DirRemove(d), Body::Dir(dir)) => {
                match dir.names.remove(d.name.as_slice()) {
                    Some(ent) if ent.ino == d.ino => {
                        dir.by_cookie.remove(&ent.cookie);
                    }
                    _ => return bad("directory removes a name it does not hold"),
                }
                self.attr.mtime = d.time;
                self.attr.ctime = d.time;
            }
            (Entry::DirCookie { next }, Body::Dir(dir)) => {
                dir.next_cookie = dir.next_cookie.max(*next);
            }
            (Entry::Symlink { gpa, len }, Body::Symlink(s)) => {
                *s = Some((*gpa, *len));
                self.attr.size = *len as u64;
            }
            (
                Entry::Hole {
                    pgoff,
                    npages,
                    mtime,
                },
                Body::File(f),
            ) => {
                f.punch(*pgoff, *npages, freed);
                self.attr.mtime = *mtime;
                self.attr.ctime = *mtime;
            }
            (Entry::XattrSet(x), _) => {
                let x: &XattrRec = x;
                let old = self
                    .xattrs
                    .insert(x.name.clone().into_boxed_slice(), (x.gpa, x.len));
                freed.extend(old.map(|(g, _)| g));
                self.attr.ctime = x.ctime;
            }
            (Entry::XattrRemove(x), _) => match self.xattrs.remove(x.name.as_slice()) {
                Some((g, _)) => {
                    freed.push(g);
                    self.attr.ctime = x.ctime;
                }
                None => return bad("log removes an extended attribute it does not hold"),
            },
            (e, _) => {
                return bad(&format!(
                    "{:?} entry in a {:?} log",
                    e.kind(),
                    self.attr.ftype
                ))
            }
        }
        if let Body::File(f) = &self.body {
            self.attr.blocks = f.pages.len() as u64 * (PAGE_SIZE / 512);
        }
        Ok(())
    }

    /// Makes the live-entry accounting describe a log rewritten as
    /// [`InodeState::compacted_entries`] (called once that log is committed). Only a
    /// file's write numbering changes: the compacted log rebuilds the same inode.
    pub fn compacted(&mut self) {
        if let Body::File(f) = &mut self.body {
            f.renumber_as_runs();
        }
    }

    /// The entries of a compacted log that rebuilds exactly this state (log GC).
    /// Attributes come last so the writes' timestamps do not override them.
    pub fn compacted_entries(&self) -> Vec<Entry> {
        let a = &self.attr;
        let mut out = Vec::new();
        match &self.body {
            Body::File(f) => {
                for (pgoff, gpa, npages) in f.runs() {
                    out.push(Entry::Write(WriteRec {
                        pgoff,
                        npages,
                        gpa,
                        size: a.size,
                        mtime: a.mtime,
                    }));
                }
            }
            Body::Dir(d) => {
                out.push(Entry::DirCookie {
                    next: d.next_cookie,
                });
                for name in d.by_cookie.values() {
                    let ent = d.names[name];
                    out.push(Entry::DirAdd(DirEntryRec {
                        ino: ent.ino,
                        cookie: ent.cookie,
                        time: a.mtime,
                        ftype: ent.ftype,
                        name: name.to_vec(),
                    }));
                }
            }
            Body::Symlink(Some((gpa, len))) => out.push(Entry::Symlink {
                gpa: *gpa,
                len: *len,
            }),
            Body::Symlink(None) | Body::Special => {}
        }
        for (name, &(gpa, len)) in &self.xattrs {
            out.push(Entry::XattrSet(XattrRec {
                gpa,
                len,
                ctime: a.ctime,
                name: name.to_vec(),
            }));
        }
        out.push(Entry::LinkChange {
            nlink: a.nlink,
            ctime: a.ctime,
        });
        out.push(Entry::SetAttr(full_attr_entry(a)));
        out
    }
}

/// A set-attribute entry that sets every field to `a`'s.
pub fn full_attr_entry(a: &Attr) -> SetAttrRec {
    SetAttrRec {
        mask: m::ALL,
        mode: a.mode,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        rdev: a.rdev,
    }
}
