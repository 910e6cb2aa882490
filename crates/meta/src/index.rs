//! DRAM state of one inode, built by applying its log entries in order: attributes,
//! and a name index (directories) or an extent index (files). The MDS and a client's
//! cached copy run exactly this code on the same entries and get the same state.

use std::collections::{BTreeMap, HashMap};

use orion_format::{
    attr_mask as m, DirEntryRec, Entry, FileType, Gpa, SetAttrRec, WriteRec, XattrRec, PAGE_SIZE,
};

use crate::error::{FsError, FsResult};

mod file;
pub use file::FileIndex;

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
    /// A fresh inode's attributes, before its log applies: all zero but its number,
    /// type and slot generation.
    pub fn new(ino: u64, ftype: FileType, generation: u64) -> Attr {
        Attr {
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
        }
    }

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
            attr: Attr::new(ino, ftype, generation),
            body,
            xattrs: BTreeMap::new(),
        }
    }

    /// Every data page the inode holds: file pages, a symlink's target, xattr values.
    pub fn data_pages(&self) -> Vec<Gpa> {
        let mut out: Vec<Gpa> = match &self.body {
            Body::File(f) => f.pages().map(|(_, gpa)| gpa).collect(),
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
            (Body::File(a), Body::File(b)) => a.mapped() == b.mapped() && a.pages().eq(b.pages()),
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

    /// Index entries a log GC walks to find the runs it writes (0 but for files).
    pub fn gc_walk(&self) -> u64 {
        match &self.body {
            Body::File(f) => f.extents(),
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
            self.attr.blocks = f.mapped() * (PAGE_SIZE / 512);
        }
        Ok(())
    }

    /// Makes the live-entry accounting describe a log rewritten as `entries`
    /// ([`InodeState::compacted_entries`]; called once that log is committed). Only
    /// a file's write numbering changes: the compacted log rebuilds the same inode.
    pub fn compacted(&mut self, entries: &[Entry]) {
        if let Body::File(f) = &mut self.body {
            f.renumber_as_runs(entries.iter().filter_map(|e| match e {
                Entry::Write(w) => Some((w.pgoff, w.gpa, w.npages)),
                _ => None,
            }));
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
