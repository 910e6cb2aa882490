//! Shared test support: a file-system operation language, its execution against the
//! local core and against a real directory (tmpfs, through system calls), and
//! snapshots of whole trees to compare.
#![allow(dead_code)]

pub mod oracle;

use std::collections::BTreeMap;

use orion_format::FileType;
use orion_meta::xattr::{self, SetMode};
use orion_meta::{Attr, FsError, LocalFs, RenameMode, SetAttrReq, TimeSet, ROOT_INO};
use proptest::prelude::*;
use rand::Rng;

/// Name components: few, so operations collide; one is longer than NAME_MAX.
pub const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];
pub fn long_name() -> String {
    "L".repeat(256)
}

/// A concrete path: its components.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct P(pub Vec<Vec<u8>>);

impl P {
    pub fn components(&self) -> Vec<Vec<u8>> {
        self.0.clone()
    }
    pub fn rel(&self) -> String {
        self.0
            .iter()
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect::<Vec<_>>()
            .join("/")
    }
}

/// A path choice made against the tree at the time the operation runs, so most
/// operations name something that exists (and shrinking still works on numbers).
#[derive(Clone, Copy, Debug)]
pub struct Sel {
    pub how: u8,
    pub idx: u16,
    pub name: u8,
}

impl Sel {
    pub fn resolve(&self, tree: &Snapshot) -> P {
        let split =
            |k: &str| -> Vec<Vec<u8>> { k.split('/').map(|c| c.as_bytes().to_vec()).collect() };
        let existing: Vec<&String> = tree.keys().filter(|k| k.as_str() != ".").collect();
        let mut dirs: Vec<Vec<Vec<u8>>> = vec![vec![]];
        dirs.extend(
            tree.iter()
                .filter(|(k, n)| k.as_str() != "." && n.kind == 'd')
                .map(|(k, _)| split(k)),
        );
        let i = self.idx as usize;
        let name = NAMES[self.name as usize % NAMES.len()].as_bytes().to_vec();
        match self.how % 10 {
            0..=5 if !existing.is_empty() => P(split(existing[i % existing.len()])),
            0..=8 => {
                let mut p = dirs[i % dirs.len()].clone();
                p.push(name);
                P(p)
            }
            _ => {
                // Off the beaten path: a too-long name, or a path through anything.
                let mut p = if existing.is_empty() {
                    vec![]
                } else {
                    split(existing[i % existing.len()])
                };
                p.push(if self.name.is_multiple_of(3) {
                    long_name().into_bytes()
                } else {
                    name
                });
                P(p)
            }
        }
    }
}

#[derive(Clone, Debug)]
pub enum Op<T = P> {
    Create(T, u32),
    Mkdir(T, u32),
    Unlink(T),
    Rmdir(T),
    Rename(T, T),
    Link(T, T),
    Symlink(u16, T),
    Readlink(T),
    Write(T, u64, usize, u8),
    Read(T, u64, usize),
    Truncate(T, u64),
    Chmod(T, u32),
    Chown(T, u32, u32),
    Utimens(T, i64, i64),
    Fsync(T),
    /// renameat2 with RENAME_EXCHANGE.
    Exchange(T, T),
    /// setxattr: name (an index into [`XNAMES`]), value length and seed, flags.
    SetXattr(T, u8, usize, u8, i32),
    GetXattr(T, u8),
    RemoveXattr(T, u8),
    ListXattr(T),
    /// fallocate: mode, offset, length.
    Fallocate(T, i32, u64, u64),
    /// An open file outlives its name: open O_RDWR, unlink, then through the
    /// descriptor fstat, pwrite (offset, length, seed), fstat and read it all, close.
    /// [`unlinked_use`] says what it answers.
    UnlinkOpen(T, u64, usize, u8),
    /// An open file outlives a rename over it: open the second path O_RDWR, rename
    /// the first over it, then use the descriptor as [`Op::UnlinkOpen`] does.
    RenameOpen(T, T, u64, usize, u8),
}

/// What [`Op::UnlinkOpen`] answers: the link count and size after the unlink, the
/// size after the write, and the whole file then.
pub fn unlinked_use(nlink: u64, size: u64, size_after: u64, data: &[u8]) -> Outcome {
    let mut out = Vec::new();
    for v in [nlink, size, size_after] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(data);
    Outcome::Data(out)
}

/// Extended-attribute names: a few that collide, the shared flag, trusted.*, an
/// unknown namespace (EOPNOTSUPP), a bare prefix (EINVAL), the longest name and
/// one byte longer (ERANGE).
pub fn xname(i: u8) -> Vec<u8> {
    match i % 8 {
        0 => b"user.a".to_vec(),
        1 => b"user.b".to_vec(),
        2 => b"user.orion.shared".to_vec(),
        3 => b"trusted.t".to_vec(),
        4 => b"other.x".to_vec(),
        5 => b"user.".to_vec(),
        6 => format!("user.{}", "x".repeat(250)).into_bytes(),
        _ => format!("user.{}", "x".repeat(251)).into_bytes(),
    }
}

const XLENS: [usize; 5] = [0, 1, 7, 100, 4096];
const FALLOC_MODES: [i32; 4] = [
    0,
    libc::FALLOC_FL_KEEP_SIZE,
    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
    libc::FALLOC_FL_PUNCH_HOLE,
];
const XFLAGS: [i32; 3] = [0, libc::XATTR_CREATE, libc::XATTR_REPLACE];

/// listxattr's answer in name order (file systems list in their own order).
pub fn sorted_names(list: &[u8]) -> Vec<u8> {
    let mut names: Vec<&[u8]> = list.split(|&b| b == 0).filter(|n| !n.is_empty()).collect();
    names.sort();
    names
        .iter()
        .flat_map(|n| n.iter().copied().chain([0]))
        .collect()
}

pub type OpT = Op<Sel>;

impl OpT {
    /// The concrete operation, with paths chosen in `tree`.
    pub fn resolve(&self, tree: &Snapshot) -> Op {
        let r = |s: &Sel| s.resolve(tree);
        match self {
            Op::Create(a, m) => Op::Create(r(a), *m),
            Op::Mkdir(a, m) => Op::Mkdir(r(a), *m),
            Op::Unlink(a) => Op::Unlink(r(a)),
            Op::Rmdir(a) => Op::Rmdir(r(a)),
            Op::Rename(a, b) => Op::Rename(r(a), r(b)),
            Op::Link(a, b) => Op::Link(r(a), r(b)),
            Op::Symlink(t, a) => Op::Symlink(*t, r(a)),
            Op::Readlink(a) => Op::Readlink(r(a)),
            Op::Write(a, o, l, x) => Op::Write(r(a), *o, *l, *x),
            Op::Read(a, o, l) => Op::Read(r(a), *o, *l),
            Op::Truncate(a, z) => Op::Truncate(r(a), *z),
            Op::Chmod(a, m) => Op::Chmod(r(a), *m),
            Op::Chown(a, u, g) => Op::Chown(r(a), *u, *g),
            Op::Utimens(a, x, y) => Op::Utimens(r(a), *x, *y),
            Op::Fsync(a) => Op::Fsync(r(a)),
            Op::Exchange(a, b) => Op::Exchange(r(a), r(b)),
            Op::SetXattr(a, n, l, s, f) => Op::SetXattr(r(a), *n, *l, *s, *f),
            Op::GetXattr(a, n) => Op::GetXattr(r(a), *n),
            Op::RemoveXattr(a, n) => Op::RemoveXattr(r(a), *n),
            Op::ListXattr(a) => Op::ListXattr(r(a)),
            Op::Fallocate(a, m, o, l) => Op::Fallocate(r(a), *m, *o, *l),
            Op::UnlinkOpen(a, o, l, s) => Op::UnlinkOpen(r(a), *o, *l, *s),
            Op::RenameOpen(a, b, o, l, s) => Op::RenameOpen(r(a), r(b), *o, *l, *s),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Data(Vec<u8>),
    Err(i32),
}

pub const UMASK: u32 = 0o022;
const MODES: [u32; 6] = [0o644, 0o600, 0o755, 0o700, 0o777, 0o640];
/// What chmod sets: the modes above and setuid, setgid (with and without group
/// execute) and sticky ones, so that writes, truncations and chowns that must clear
/// setid bits meet files that have them.
const CHMOD_MODES: [u32; 10] = [
    0o644, 0o600, 0o755, 0o777, 0o4755, 0o2755, 0o6777, 0o2745, 0o4644, 0o1777,
];
const OFFSETS: [u64; 9] = [0, 1, 100, 4095, 4096, 5000, 12288, 70000, 8190];
const LENS: [usize; 7] = [1, 10, 100, 4096, 5000, 9000, 4097];
const SIZES: [u64; 8] = [0, 1, 100, 4095, 4096, 4097, 10000, 70000];
const IDS: [u32; 3] = [0, 1000, 1001];

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

/// A symlink target that never resolves (no name of the test starts with "zz").
pub fn target(n: u16) -> String {
    format!("zz-nowhere/{}", "t".repeat(1 + (n as usize % 40)))
}

// ---- generation: a proptest strategy (shrinkable) and a plain RNG version ----

fn arb_path() -> impl Strategy<Value = Sel> {
    (any::<u8>(), any::<u16>(), any::<u8>()).prop_map(|(how, idx, name)| Sel { how, idx, name })
}

pub fn arb_op() -> impl Strategy<Value = OpT> {
    let m = prop::sample::select(&MODES[..]);
    prop_oneof![
        6 => (arb_path(), m.clone()).prop_map(|(p, m)| Op::Create(p, m)),
        5 => (arb_path(), m).prop_map(|(p, m)| Op::Mkdir(p, m)),
        1 => arb_path().prop_map(Op::Unlink),
        1 => arb_path().prop_map(Op::Rmdir),
        3 => (arb_path(), arb_path()).prop_map(|(a, b)| Op::Rename(a, b)),
        1 => (arb_path(), arb_path()).prop_map(|(a, b)| Op::Link(a, b)),
        1 => (any::<u16>(), arb_path()).prop_map(|(t, p)| Op::Symlink(t, p)),
        1 => arb_path().prop_map(Op::Readlink),
        5 => (arb_path(), prop::sample::select(&OFFSETS[..]), prop::sample::select(&LENS[..]), any::<u8>())
            .prop_map(|(p, o, l, s)| Op::Write(p, o, l, s)),
        2 => (arb_path(), prop::sample::select(&OFFSETS[..]), prop::sample::select(&LENS[..])).prop_map(|(p, o, l)| Op::Read(p, o, l)),
        2 => (arb_path(), prop::sample::select(&SIZES[..])).prop_map(|(p, s)| Op::Truncate(p, s)),
        1 => (arb_path(), prop::sample::select(&CHMOD_MODES[..])).prop_map(|(p, m)| Op::Chmod(p, m)),
        1 => (arb_path(), prop::sample::select(&IDS[..]), prop::sample::select(&IDS[..])).prop_map(|(p, u, g)| Op::Chown(p, u, g)),
        1 => (arb_path(), 1_000_000_000i64..1_100_000_000, 1_000_000_000i64..1_100_000_000).prop_map(|(p, a, m)| Op::Utimens(p, a, m)),
        1 => arb_path().prop_map(Op::Fsync),
        1 => (arb_path(), arb_path()).prop_map(|(a, b)| Op::Exchange(a, b)),
        3 => (arb_path(), any::<u8>(), prop::sample::select(&XLENS[..]), any::<u8>(), prop::sample::select(&XFLAGS[..]))
            .prop_map(|(p, n, l, s, f)| Op::SetXattr(p, n, l, s, f)),
        1 => (arb_path(), any::<u8>()).prop_map(|(p, n)| Op::GetXattr(p, n)),
        1 => (arb_path(), any::<u8>()).prop_map(|(p, n)| Op::RemoveXattr(p, n)),
        1 => arb_path().prop_map(Op::ListXattr),
        2 => (arb_path(), prop::sample::select(&FALLOC_MODES[..]), prop::sample::select(&OFFSETS[..]), prop::sample::select(&SIZES[..]))
            .prop_map(|(p, m, o, l)| Op::Fallocate(p, m, o, l)),
        2 => (arb_path(), prop::sample::select(&OFFSETS[..]), prop::sample::select(&LENS[..]), any::<u8>())
            .prop_map(|(p, o, l, s)| Op::UnlinkOpen(p, o, l, s)),
        2 => (arb_path(), arb_path(), prop::sample::select(&OFFSETS[..]), prop::sample::select(&LENS[..]), any::<u8>())
            .prop_map(|(a, b, o, l, s)| Op::RenameOpen(a, b, o, l, s)),
    ]
}

pub fn random_ops(rng: &mut impl Rng, n: usize) -> Vec<OpT> {
    let path = |rng: &mut dyn rand::RngCore| Sel {
        how: rng.gen(),
        idx: rng.gen(),
        name: rng.gen(),
    };
    (0..n)
        .map(|_| {
            let p = path(rng);
            match rng.gen_range(0..30) {
                0..=4 => Op::Create(p, MODES[rng.gen_range(0..MODES.len())]),
                5..=8 => Op::Mkdir(p, MODES[rng.gen_range(0..MODES.len())]),
                9..=10 => Op::Unlink(p),
                11..=12 => Op::Rmdir(p),
                13..=15 => Op::Rename(p, path(rng)),
                16 => Op::Link(p, path(rng)),
                17 => Op::Symlink(rng.gen(), p),
                18..=23 => Op::Write(
                    p,
                    OFFSETS[rng.gen_range(0..OFFSETS.len())],
                    LENS[rng.gen_range(0..LENS.len())],
                    rng.gen(),
                ),
                24..=25 => Op::Truncate(p, SIZES[rng.gen_range(0..SIZES.len())]),
                26 => Op::Chmod(p, CHMOD_MODES[rng.gen_range(0..CHMOD_MODES.len())]),
                27 => Op::Chown(p, IDS[rng.gen_range(0..3)], IDS[rng.gen_range(0..3)]),
                28 => Op::Utimens(
                    p,
                    1_000_000_000 + rng.gen_range(0..1000),
                    1_000_000_000 + rng.gen_range(0..1000),
                ),
                _ => Op::Read(
                    p,
                    OFFSETS[rng.gen_range(0..OFFSETS.len())],
                    LENS[rng.gen_range(0..LENS.len())],
                ),
            }
        })
        .collect()
}

// ---- the core ----

fn errno(e: FsError) -> i32 {
    e.errno()
}

fn ok<T>(r: Result<T, FsError>) -> Result<Outcome, i32> {
    r.map(|_| Outcome::Ok).map_err(errno)
}

/// Resolves all components but the last: each must be a directory. A symlink on the
/// way is dangling (the test's targets never resolve), so ENOENT, as Linux says.
pub fn core_parent(fs: &LocalFs, p: &P) -> Result<(u64, Vec<u8>), i32> {
    let comps = p.components();
    let mut dir = ROOT_INO;
    for c in &comps[..comps.len() - 1] {
        let a = fs.lookup(dir, c).map_err(errno)?;
        match a.ftype {
            FileType::Directory => dir = a.ino,
            FileType::Symlink => return Err(libc::ENOENT),
            _ => return Err(libc::ENOTDIR),
        }
    }
    Ok((dir, comps.last().unwrap().clone()))
}

/// Resolves a whole path, following a final symlink (which dangles: ENOENT).
fn core_follow(fs: &LocalFs, p: &P) -> Result<u64, i32> {
    let (dir, name) = core_parent(fs, p)?;
    let a = fs.lookup(dir, &name).map_err(errno)?;
    if a.ftype == FileType::Symlink {
        return Err(libc::ENOENT);
    }
    Ok(a.ino)
}

pub fn run_core(fs: &LocalFs, op: &Op) -> Outcome {
    let r: Result<Outcome, i32> = (|| match op {
        Op::Create(p, m) => {
            let (d, n) = core_parent(fs, p)?;
            ok(fs.create(d, &n, m & !UMASK, 0, 0))
        }
        Op::Mkdir(p, m) => {
            let (d, n) = core_parent(fs, p)?;
            ok(fs.mkdir(d, &n, m & !UMASK, 0, 0))
        }
        Op::Unlink(p) => {
            let (d, n) = core_parent(fs, p)?;
            ok(fs.unlink(d, &n))
        }
        Op::Rmdir(p) => {
            let (d, n) = core_parent(fs, p)?;
            ok(fs.rmdir(d, &n))
        }
        Op::Rename(a, b) => {
            let (da, na) = core_parent(fs, a)?;
            let (db, nb) = core_parent(fs, b)?;
            ok(fs.rename(da, &na, db, &nb, RenameMode::Replace))
        }
        Op::Link(a, b) => {
            let (da, na) = core_parent(fs, a)?;
            let src = fs.lookup(da, &na).map_err(errno)?;
            let (db, nb) = core_parent(fs, b)?;
            ok(fs.link(src.ino, db, &nb))
        }
        Op::Symlink(t, p) => {
            let (d, n) = core_parent(fs, p)?;
            ok(fs.symlink(d, &n, target(*t).as_bytes(), 0, 0))
        }
        Op::Readlink(p) => {
            let (d, n) = core_parent(fs, p)?;
            let a = fs.lookup(d, &n).map_err(errno)?;
            fs.readlink(a.ino).map(Outcome::Data).map_err(errno)
        }
        Op::Write(p, off, len, seed) => {
            let ino = core_follow(fs, p)?;
            fs.write(ino, *off, &pattern(*len, *seed))
                .map(|n| Outcome::Data(n.to_le_bytes().to_vec()))
                .map_err(errno)
        }
        Op::Read(p, off, len) => {
            let ino = core_follow(fs, p)?;
            fs.read(ino, *off, *len).map(Outcome::Data).map_err(errno)
        }
        Op::Truncate(p, size) => {
            let ino = core_follow(fs, p)?;
            ok(fs.setattr(
                ino,
                &SetAttrReq {
                    size: Some(*size),
                    ..Default::default()
                },
            ))
        }
        Op::Chmod(p, m) => {
            let ino = core_follow(fs, p)?;
            ok(fs.setattr(
                ino,
                &SetAttrReq {
                    mode: Some(*m),
                    ..Default::default()
                },
            ))
        }
        Op::Chown(p, u, g) => {
            let ino = core_follow(fs, p)?;
            ok(fs.setattr(
                ino,
                &SetAttrReq {
                    uid: Some(*u),
                    gid: Some(*g),
                    ..Default::default()
                },
            ))
        }
        Op::Utimens(p, at, mt) => {
            let ino = core_follow(fs, p)?;
            ok(fs.setattr(
                ino,
                &SetAttrReq {
                    atime: Some(TimeSet::At(at * 1_000_000_000)),
                    mtime: Some(TimeSet::At(mt * 1_000_000_000)),
                    ..Default::default()
                },
            ))
        }
        Op::Fsync(p) => {
            let ino = core_follow(fs, p)?;
            ok(fs.fsync(ino))
        }
        Op::Exchange(a, b) => {
            let (da, na) = core_parent(fs, a)?;
            let (db, nb) = core_parent(fs, b)?;
            ok(fs.rename(da, &na, db, &nb, RenameMode::Exchange))
        }
        Op::SetXattr(p, n, len, seed, flags) => {
            xattr::check_len(&xname(*n)).map_err(errno)?;
            let ino = core_follow(fs, p)?;
            let mode = SetMode::from_flags(*flags).map_err(errno)?;
            ok(fs.setxattr(ino, &xname(*n), &pattern(*len, *seed), mode))
        }
        Op::GetXattr(p, n) => {
            xattr::check_len(&xname(*n)).map_err(errno)?;
            let ino = core_follow(fs, p)?;
            fs.getxattr(ino, &xname(*n))
                .map(Outcome::Data)
                .map_err(errno)
        }
        Op::RemoveXattr(p, n) => {
            xattr::check_len(&xname(*n)).map_err(errno)?;
            let ino = core_follow(fs, p)?;
            ok(fs.removexattr(ino, &xname(*n)))
        }
        Op::ListXattr(p) => {
            let ino = core_follow(fs, p)?;
            fs.listxattr(ino, true)
                .map(|l| Outcome::Data(sorted_names(&l)))
                .map_err(errno)
        }
        Op::Fallocate(p, mode, off, len) => {
            let ino = core_follow(fs, p)?;
            // The system call needs a file opened for writing: a directory is EISDIR.
            if fs.getattr(ino).map_err(errno)?.ftype == FileType::Directory {
                return Err(libc::EISDIR);
            }
            ok(fs.fallocate(ino, *off, *len, *mode))
        }
        Op::UnlinkOpen(p, off, len, seed) => core_nameless_use(fs, p, (*off, *len, *seed), || {
            let (d, n) = core_parent(fs, p)?;
            fs.with_engine(|e| e.unlink_open(d, &n)).map_err(errno)
        }),
        Op::RenameOpen(from, p, off, len, seed) => {
            core_nameless_use(fs, p, (*off, *len, *seed), || {
                let (od, on) = core_parent(fs, from)?;
                let (nd, nn) = core_parent(fs, p)?;
                let replace = RenameMode::Replace;
                (fs.with_engine(|e| e.rename_open(od, &on, nd, &nn, replace, true))).map_err(errno)
            })
        }
    })();
    r.unwrap_or_else(Outcome::Err)
}

/// [`Op::UnlinkOpen`] and [`Op::RenameOpen`] on the core: `unname` takes the name
/// (returning the inode kept for the open file), then the inode is used as through
/// its descriptor, and released as its last close would.
fn core_nameless_use(
    fs: &LocalFs,
    p: &P,
    (off, len, seed): (u64, usize, u8),
    unname: impl FnOnce() -> Result<Option<u64>, i32>,
) -> Result<Outcome, i32> {
    let ino = core_follow(fs, p)?;
    if fs.getattr(ino).map_err(errno)?.ftype == FileType::Directory {
        return Err(libc::EISDIR);
    }
    let kept = unname()?;
    let a = fs.getattr(ino).map_err(errno)?;
    fs.write(ino, off, &pattern(len, seed)).map_err(errno)?;
    let size = fs.getattr(ino).map_err(errno)?.size;
    let data = fs.read(ino, 0, size as usize).map_err(errno)?;
    if let Some(k) = kept {
        fs.with_engine(|e| e.release_orphan(k)).map_err(errno)?;
    }
    Ok(unlinked_use(a.nlink as u64, a.size, size, &data))
}

// ---- snapshots ----

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// 'd', 'f', 'l', or 'o' for other types ([`kind_of`]); '?' for an entry the
    /// caller may not look at (see `oracle::oracle_snapshot`).
    pub kind: char,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    /// Size of files and symlinks (directories' sizes differ by design).
    pub size: u64,
    /// File content or symlink target.
    pub content: Vec<u8>,
    /// Extended attributes of files and directories, in name order.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    pub mtime: i64,
    pub ctime: i64,
}

/// The one-letter kind snapshots use for a file type.
pub fn kind_of(t: FileType) -> char {
    match t {
        FileType::Directory => 'd',
        FileType::Symlink => 'l',
        FileType::Regular => 'f',
        _ => 'o',
    }
}

impl Node {
    /// The node of attributes `a`, with the content and extended attributes read
    /// from the tree (directories' sizes differ by design and count as 0).
    pub fn from_attr(a: &Attr, content: Vec<u8>, xattrs: Vec<(Vec<u8>, Vec<u8>)>) -> Node {
        let kind = kind_of(a.ftype);
        Node {
            kind,
            perm: a.mode,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            size: if kind == 'd' { 0 } else { a.size },
            content,
            xattrs,
            mtime: a.mtime,
            ctime: a.ctime,
        }
    }
}

pub type Snapshot = BTreeMap<String, Node>;

/// Compares two snapshots ignoring timestamps; returns the first difference.
pub fn diff_ignoring_times(a: &Snapshot, b: &Snapshot) -> Option<String> {
    let strip = |s: &Snapshot| -> BTreeMap<String, Node> {
        s.iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    Node {
                        mtime: 0,
                        ctime: 0,
                        ..v.clone()
                    },
                )
            })
            .collect()
    };
    let (a, b) = (strip(a), strip(b));
    if a == b {
        return None;
    }
    for (k, v) in &a {
        match b.get(k) {
            None => return Some(format!("{k}: only in the first: {v:?}")),
            Some(w) if w != v => {
                let show = |n: &Node| {
                    format!(
                        "{} perm {:o} uid {} gid {} nlink {} size {} content {} bytes xattrs {:?}",
                        n.kind,
                        n.perm,
                        n.uid,
                        n.gid,
                        n.nlink,
                        n.size,
                        n.content.len(),
                        n.xattrs
                            .iter()
                            .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.len()))
                            .collect::<Vec<_>>()
                    )
                };
                return Some(format!(
                    "{k}: {} vs {}{}",
                    show(v),
                    show(w),
                    if v.content != w.content {
                        " (content differs)"
                    } else {
                        ""
                    }
                ));
            }
            _ => {}
        }
    }
    b.keys()
        .find(|k| !a.contains_key(*k))
        .map(|k| format!("{k}: only in the second"))
}

/// Paths whose mtime / ctime changed between two snapshots.
pub fn time_changes(before: &Snapshot, after: &Snapshot) -> Vec<(String, bool, bool)> {
    after
        .iter()
        .filter_map(|(k, a)| {
            before
                .get(k)
                .map(|b| (k.clone(), a.mtime != b.mtime, a.ctime != b.ctime))
        })
        .collect()
}

/// [`time_changes`] after `op`, leaving out what POSIX leaves unspecified: the times
/// of a file truncated to the size it has (tmpfs changes them when the file holds
/// pages, and counts fallocate's preallocated pages among them; Orion does not
/// preallocate pages).
pub fn op_time_changes(op: &Op, before: &Snapshot, after: &Snapshot) -> Vec<(String, bool, bool)> {
    let same_size = match op {
        Op::Truncate(p, size) => before
            .get(&p.rel())
            .filter(|n| n.kind == 'f' && n.size == *size)
            .map(|_| p.rel()),
        _ => None,
    };
    time_changes(before, after)
        .into_iter()
        .filter(|(k, _, _)| Some(k) != same_size.as_ref())
        .collect()
}

fn core_xattrs(fs: &LocalFs, ino: u64, kind: char) -> Vec<(Vec<u8>, Vec<u8>)> {
    if kind != 'f' && kind != 'd' {
        return Vec::new();
    }
    let list = fs.listxattr(ino, true).unwrap();
    xattr_pairs(&list, |n| fs.getxattr(ino, n).unwrap())
}

/// Name/value pairs in name order, from a listxattr answer and a getter.
pub fn xattr_pairs(list: &[u8], get: impl Fn(&[u8]) -> Vec<u8>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = list
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| (n.to_vec(), get(n)))
        .collect();
    out.sort();
    out
}

pub fn core_snapshot(fs: &LocalFs) -> Snapshot {
    let mut out = BTreeMap::new();
    fn walk(fs: &LocalFs, dir: u64, prefix: &str, out: &mut Snapshot) {
        for e in fs.readdir(dir, 0).unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let name = String::from_utf8_lossy(&e.name).into_owned();
            let path = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let a = fs.getattr(e.ino).unwrap();
            let kind = kind_of(a.ftype);
            let content = match kind {
                'l' => fs.readlink(e.ino).unwrap(),
                'f' => fs.read(e.ino, 0, a.size as usize).unwrap(),
                _ => vec![],
            };
            let xattrs = core_xattrs(fs, e.ino, kind);
            out.insert(path.clone(), Node::from_attr(&a, content, xattrs));
            if kind == 'd' {
                walk(fs, e.ino, &path, out);
            }
        }
    }
    walk(fs, ROOT_INO, "", &mut out);
    let root = fs.getattr(ROOT_INO).unwrap();
    out.insert(
        ".".into(),
        Node {
            kind: 'd',
            perm: root.mode,
            uid: root.uid,
            gid: root.gid,
            nlink: root.nlink,
            size: 0,
            content: vec![],
            xattrs: core_xattrs(fs, ROOT_INO, 'd'),
            mtime: root.mtime,
            ctime: root.ctime,
        },
    );
    out
}

/// Seeded property runner: prints the seed and the smallest failing case on failure.
pub fn run_property<S: Strategy>(
    name: &str,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let seed: u64 = std::env::var("ORION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0510_2019);
    let cases = std::env::var("ORION_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(cases);
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key));
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{name} failed with ORION_SEED={seed} (rerun with that variable): {e}");
    }
}
