//! `orion fsck`: reads a file system's pools without changing them and lists what is
//! inconsistent. A committed journal record is taken into account the way mount
//! would replay it, and orphan inodes (created or unlinked when the power failed)
//! are reported as reclaimable, not as damage.

use std::collections::{HashMap, HashSet};

use orion_format::{FileType, PoolKind, Superblock, PAGE_SIZE, SUPERBLOCK_SIZE, SYMLINK_MAX};
use orion_pmem::Pool;

use crate::engine::ROOT_INO;
use crate::index::Body;
use crate::{journal, recovery};

#[derive(Clone, Debug, Default)]
pub struct FsckReport {
    pub problems: Vec<String>,
    pub inodes: u64,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub others: u64,
    pub log_pages: u64,
    pub data_pages: u64,
    pub orphans: u64,
    pub journal_pending: bool,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }

    /// The one-line summary `orion fsck` prints.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{}: {} inodes ({} files, {} directories, {} symlinks, {} other), {} log pages, {} data pages",
            if self.is_clean() { "clean" } else { "INCONSISTENT" },
            self.inodes,
            self.files,
            self.dirs,
            self.symlinks,
            self.others,
            self.log_pages,
            self.data_pages
        );
        if self.orphans > 0 {
            s += &format!("; {} orphan inodes reclaimed at next mount", self.orphans);
        }
        if self.journal_pending {
            s += "; a committed journal record is replayed at next mount";
        }
        if !self.is_clean() {
            s += &format!("; {} problems", self.problems.len());
        }
        s
    }
}

/// Checks a metadata pool and, if given, its data pool.
pub fn check(meta: &Pool, data: Option<&Pool>) -> FsckReport {
    let mut r = FsckReport::default();
    let sb = match meta
        .read_vec(0, SUPERBLOCK_SIZE)
        .map_err(|e| e.to_string())
        .and_then(|b| Superblock::decode(&b).map_err(|e| e.to_string()))
    {
        Ok(sb) if sb.kind == PoolKind::Metadata => sb,
        Ok(_) => {
            r.problems
                .push(format!("{}: not a metadata pool", meta.path().display()));
            return r;
        }
        Err(e) => {
            r.problems.push(format!("{}: {e}", meta.path().display()));
            return r;
        }
    };
    let dsb = data.and_then(|d| {
        match d
            .read_vec(0, SUPERBLOCK_SIZE)
            .map_err(|e| e.to_string())
            .and_then(|b| Superblock::decode(&b).map_err(|e| e.to_string()))
        {
            Ok(s) if s.kind == PoolKind::Data && s.cluster_uuid == sb.cluster_uuid => Some(s),
            Ok(_) => {
                r.problems.push(format!(
                    "{}: not a data pool of this file system",
                    d.path().display()
                ));
                None
            }
            Err(e) => {
                r.problems.push(format!("{}: {e}", d.path().display()));
                None
            }
        }
    });
    let mut tails = HashMap::new();
    match journal::pending(meta, &sb) {
        Ok(Some(rec)) => {
            r.journal_pending = true;
            tails.extend(rec.stores);
        }
        Ok(None) => {}
        Err(e) => r.problems.push(format!("journal: {e}")),
    }
    let tree = match recovery::load_tree(meta, &sb, Some(&tails)) {
        Ok(t) => t,
        Err(e) => {
            r.problems.push(e.to_string());
            return r;
        }
    };
    r.problems.extend(tree.problems.iter().cloned());
    let mut log_pages = HashSet::new();
    let mut data_pages = HashSet::new();
    let mut inos: Vec<&u64> = tree.inodes.keys().collect();
    inos.sort();
    for &ino in inos {
        let li = &tree.inodes[&ino];
        let a = &li.state.attr;
        r.inodes += 1;
        for &p in &li.log.pages {
            if sb.page_index(p).is_none() || !log_pages.insert(p) {
                r.problems.push(format!(
                    "inode {ino}: log page {p} outside the page area or shared"
                ));
            }
        }
        let refs = tree.refs.get(&ino).copied().unwrap_or(0);
        let mut gpas = Vec::new();
        match &li.state.body {
            Body::Dir(d) => {
                r.dirs += 1;
                let subdirs = d
                    .names
                    .values()
                    .filter(|e| e.ftype == FileType::Directory)
                    .count() as u32;
                if a.nlink != 2 + subdirs {
                    r.problems.push(format!(
                        "directory {ino}: link count {} but {} subdirectories",
                        a.nlink, subdirs
                    ));
                }
                if ino != ROOT_INO && refs != 1 {
                    r.problems
                        .push(format!("directory {ino}: named {refs} times"));
                }
                if d.by_cookie.len() != d.names.len() {
                    r.problems
                        .push(format!("directory {ino}: readdir cookies are not unique"));
                }
            }
            body => {
                if a.nlink != refs {
                    r.problems.push(format!(
                        "inode {ino}: link count {} but {refs} directory entries",
                        a.nlink
                    ));
                }
                match body {
                    Body::File(f) => {
                        r.files += 1;
                        if let Some((&last, _)) = f.pages.iter().next_back() {
                            if last >= a.size.div_ceil(PAGE_SIZE) {
                                r.problems.push(format!(
                                    "file {ino}: page {last} mapped past its size {}",
                                    a.size
                                ));
                            }
                        }
                        gpas.extend(f.pages.values().map(|e| e.gpa));
                    }
                    Body::Symlink(s) => {
                        r.symlinks += 1;
                        match s {
                            Some((g, len)) if (*len as usize) <= SYMLINK_MAX && *len > 0 => {
                                gpas.push(*g)
                            }
                            _ => r.problems.push(format!("symlink {ino}: no valid target")),
                        }
                    }
                    _ => r.others += 1,
                }
            }
        }
        gpas.extend(li.state.xattrs.values().map(|&(g, _)| g));
        for g in gpas {
            if let Some(d) = &dsb {
                if g.group() != d.group || g.page() >= d.page_count {
                    r.problems.push(format!(
                        "inode {ino}: data page {g:?} outside the data pool"
                    ));
                }
            }
            if !data_pages.insert(g) {
                r.problems
                    .push(format!("inode {ino}: data page {g:?} is referenced twice"));
            }
        }
    }
    r.log_pages = log_pages.len() as u64;
    r.data_pages = data_pages.len() as u64;
    for ino in ROOT_INO + 1..sb.inode_count {
        if !tree.inodes.contains_key(&ino) && meta.load_u64(sb.slot_off(ino)).unwrap_or(0) != 0 {
            r.orphans += 1;
        }
    }
    r
}
