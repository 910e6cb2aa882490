//! `orion fsck`: reads a file system's pools without changing them and lists what is
//! inconsistent. A committed journal record is taken into account the way mount
//! would replay it, and orphan inodes (created or unlinked when the power failed)
//! are reported as reclaimable, not as damage.

use std::collections::{HashMap, HashSet};

use orion_format::{FileType, Gpa, PoolKind, Superblock, PAGE_SIZE, SUPERBLOCK_SIZE, SYMLINK_MAX};
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
    /// The data pages files name, ascending (to compare replicas with).
    pub named: Vec<Gpa>,
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
            s += &format!(
                "; {} inodes no directory names (at next mount, unlinked files and \
                 directories wait for the clients that hold them open, and the rest are reclaimed)",
                self.orphans
            );
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

/// The parts of a check that take time on a large pool, for the caller's progress:
/// each is reported as (part, done, total) as it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Inodes loaded from their logs, of those whose slots are in use.
    LoadingInodes,
    /// Pages compared, of the pages files name ([`compare_replicas_reporting`]).
    ComparingReplicas,
    /// Pages compared, of the pool's pages ([`differing_pages_reporting`]).
    ComparingPools,
}

/// Where a check reports how far it has come.
pub type Reporter<'a> = &'a mut dyn FnMut(Part, u64, u64);

/// Checks a metadata pool and, if given, its data pool.
pub fn check(meta: &Pool, data: Option<&Pool>) -> FsckReport {
    check_reporting(meta, data, &mut |_, _, _| {})
}

/// [`check`], reporting how far it has come.
pub fn check_reporting(meta: &Pool, data: Option<&Pool>, report: Reporter) -> FsckReport {
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
    // The slots in use bound the inodes the walk can reach: its total.
    let in_use = slots_in_use(meta, &sb);
    let slots_used = in_use.len() as u64;
    report(Part::LoadingInodes, 0, slots_used);
    let loaded = &mut |n: u64| report(Part::LoadingInodes, n, slots_used);
    let tree = match recovery::load_tree_reporting(meta, &sb, Some(&tails), loaded) {
        Ok(t) => t,
        Err(e) => {
            r.problems.push(e.to_string());
            return r;
        }
    };
    report(Part::LoadingInodes, tree.inodes.len() as u64, slots_used);
    r.problems.extend(tree.problems.iter().cloned());
    let mut log_pages = HashSet::new();
    let mut data_pages = HashSet::new();
    let mut inos: Vec<&u64> = tree.inodes.keys().collect();
    inos.sort();
    for &ino in inos {
        let li = &tree.inodes[&ino];
        let a = &li.state.attr;
        r.inodes += 1;
        for (k, &p) in li.log.pages.iter().enumerate() {
            // A log starts in its inode's own first segment or on a page, and goes
            // on in pages; no page is in two logs.
            let first = k == 0 && p == sb.first_segment_off(ino);
            if !first && (sb.page_index(p).is_none() || !log_pages.insert(p)) {
                r.problems.push(format!(
                    "inode {ino}: log segment {p} is not its first segment, or a page \
                     of the page area no other log has"
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
                        if let Some(last) = f.last_page() {
                            if last >= a.size.div_ceil(PAGE_SIZE) {
                                r.problems.push(format!(
                                    "file {ino}: page {last} mapped past its size {}",
                                    a.size
                                ));
                            }
                        }
                        gpas.extend(f.pages().map(|(_, gpa)| gpa));
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
    r.named = data_pages.into_iter().collect();
    r.named.sort_unstable();
    r.orphans = in_use
        .iter()
        .filter(|&&i| i != ROOT_INO && !tree.inodes.contains_key(&i))
        .count() as u64;
    r
}

/// The inodes whose slot is in use, reading only where the pool may hold data
/// (reading a hole of a sparse pool on tmpfs would take its page).
fn slots_in_use(meta: &Pool, sb: &Superblock) -> Vec<u64> {
    let mut run = (0, 0);
    let mut out = Vec::new();
    for ino in ROOT_INO..sb.inode_count {
        let off = sb.slot_off(ino);
        if off >= run.1 {
            run = meta.data_run(off);
        }
        if off >= run.0 && meta.load_u64(off).unwrap_or(0) != 0 {
            out.push(ino);
        }
    }
    out
}
/// What comparing the replicas of replication groups found.
#[derive(Clone, Debug, Default)]
pub struct ReplicaReport {
    /// Pages found equal on every replica of their group.
    pub equal: u64,
    pub problems: Vec<String>,
}

/// Compares, page by page, the data pools of each replication group over the pages
/// in `named` (from [`check`] of the MDS pool): every replica of a group must hold the
/// same bytes there. Pools are told apart by the group in their superblock; a group
/// with one pool has nothing to compare.
pub fn compare_replicas(named: &[Gpa], pools: &[&Pool]) -> ReplicaReport {
    compare_replicas_reporting(named, pools, &mut |_, _, _| {})
}

/// [`compare_replicas`], reporting how far it has come.
pub fn compare_replicas_reporting(
    named: &[Gpa],
    pools: &[&Pool],
    report: Reporter,
) -> ReplicaReport {
    let mut r = ReplicaReport::default();
    let mut groups: HashMap<u16, Vec<(usize, Superblock)>> = HashMap::new();
    for (i, p) in pools.iter().enumerate() {
        match p
            .read_vec(0, SUPERBLOCK_SIZE)
            .map_err(|e| e.to_string())
            .and_then(|b| Superblock::decode(&b).map_err(|e| e.to_string()))
        {
            Ok(sb) if sb.kind == PoolKind::Data => {
                groups.entry(sb.group).or_default().push((i, sb))
            }
            Ok(_) => r.problems.push(format!("pool {i} is not a data pool")),
            Err(e) => r.problems.push(format!("pool {i}: {e}")),
        }
    }
    for (n, g) in named.iter().enumerate() {
        report(Part::ComparingReplicas, n as u64, named.len() as u64);
        let Some(replicas) = groups.get(&g.group()) else {
            continue;
        };
        let mut first: Option<(usize, Vec<u8>)> = None;
        let before = r.problems.len();
        for (i, sb) in replicas {
            if g.page() >= sb.page_count {
                r.problems.push(format!(
                    "pool {i}: page {g:?} is beyond its {} pages",
                    sb.page_count
                ));
                continue;
            }
            let bytes = match pools[*i].read_vec(sb.page_off(g.page()), PAGE_SIZE as usize) {
                Ok(b) => b,
                Err(e) => {
                    r.problems
                        .push(format!("pool {i}: reading page {g:?}: {e}"));
                    continue;
                }
            };
            match &first {
                None => first = Some((*i, bytes)),
                Some((j, b)) if *b != bytes => r.problems.push(format!(
                    "group {}: page {} differs between pools {j} and {i}",
                    g.group(),
                    g.page()
                )),
                Some(_) => {}
            }
        }
        if replicas.len() > 1 && r.problems.len() == before {
            r.equal += 1;
        }
    }
    report(
        Part::ComparingReplicas,
        named.len() as u64,
        named.len() as u64,
    );
    r
}

/// The 4 KiB pages in which an MDS pool and its mirror's differ, in order: none once
/// the mirror applied everything the primary persisted (the cluster quiet). Pools of
/// different sizes differ everywhere (an error).
pub fn differing_pages(primary: &Pool, mirror: &Pool) -> Result<Vec<u64>, String> {
    differing_pages_reporting(primary, mirror, &mut |_, _, _| {})
}

/// [`differing_pages`], reporting how far it has come.
pub fn differing_pages_reporting(
    primary: &Pool,
    mirror: &Pool,
    report: Reporter,
) -> Result<Vec<u64>, String> {
    if primary.len() != mirror.len() {
        return Err(format!(
            "the pools differ in size: {} and {} bytes",
            primary.len(),
            mirror.len()
        ));
    }
    let (mut x, mut y) = (vec![0u8; PAGE_SIZE as usize], vec![0u8; PAGE_SIZE as usize]);
    let mut differ = Vec::new();
    let pages = primary.len() / PAGE_SIZE;
    // A page that is a hole in both pools is equal and is not read (reading it
    // would take its page in each).
    let mut runs = [(0, 0), (0, 0)];
    let mut hole = |i: usize, p: &Pool, off: u64| {
        if off >= runs[i].1 {
            runs[i] = p.data_run(off);
        }
        off < runs[i].0
    };
    for page in 0..pages {
        report(Part::ComparingPools, page, pages);
        let off = page * PAGE_SIZE;
        if hole(0, primary, off) & hole(1, mirror, off) {
            continue;
        }
        let read = |p: &Pool, b: &mut [u8]| p.read(page * PAGE_SIZE, b).map_err(|e| e.to_string());
        read(primary, &mut x)?;
        read(mirror, &mut y)?;
        if x != y {
            differ.push(page);
        }
    }
    report(Part::ComparingPools, pages, pages);
    Ok(differ)
}

#[cfg(test)]
mod tests {
    use super::*;
    use orion_pmem::CrashDomain;

    #[test]
    fn a_pool_and_its_mirror_are_compared_page_by_page() {
        let dom = CrashDomain::new(1);
        let image = vec![0u8; 8 * PAGE_SIZE as usize];
        let (a, b) = (dom.add_pool(&image), dom.add_pool(&image));
        assert_eq!(differing_pages(&a, &b).unwrap(), Vec::<u64>::new());
        b.write(5 * PAGE_SIZE + 17, &[1]).unwrap();
        b.write(2 * PAGE_SIZE, &[1]).unwrap();
        assert_eq!(differing_pages(&a, &b).unwrap(), vec![2, 5]);
        let c = dom.add_pool(&vec![0u8; 4 * PAGE_SIZE as usize]);
        assert!(differing_pages(&a, &c).is_err());
    }

    fn data_pool(dom: &std::sync::Arc<CrashDomain>, group: u16, uuid: u8) -> Pool {
        let size = 16 * PAGE_SIZE;
        let sb = Superblock::new_data(size, [uuid; 16], [1; 16], group, 0).unwrap();
        let mut image = vec![0u8; size as usize];
        let b = sb.encode();
        image[..b.len()].copy_from_slice(&b);
        dom.add_pool(&image)
    }

    #[test]
    fn replicas_that_differ_in_a_named_page_are_named() {
        let dom = CrashDomain::new(1);
        let (a, b, c) = (
            data_pool(&dom, 0, 1),
            data_pool(&dom, 0, 2),
            data_pool(&dom, 1, 3),
        );
        let sb = Superblock::decode(&a.read_vec(0, SUPERBLOCK_SIZE).unwrap()).unwrap();
        for p in [&a, &b] {
            p.write(sb.page_off(2), &[7u8; 64]).unwrap();
        }
        // Page 3 differs, but no file names it; page 2 is named and equal.
        a.write(sb.page_off(3), &[1u8; 8]).unwrap();
        let named = [Gpa::new(0, 2), Gpa::new(1, 2)];
        let r = compare_replicas(&named, &[&a, &b, &c]);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!(r.equal, 1, "group 1 has one pool: nothing to compare");
        b.write(sb.page_off(2) + 100, &[9u8; 1]).unwrap();
        let r = compare_replicas(&named, &[&a, &b, &c]);
        assert_eq!(r.equal, 0);
        assert_eq!(
            r.problems,
            vec!["group 0: page 2 differs between pools 0 and 1"]
        );
    }
}
