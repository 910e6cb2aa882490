//! The differential operations through the client library, and a client's view of a
//! tree as a snapshot: shared by the differential test and the cluster simulator,
//! which include this file next to `crates/meta/tests/support` (as `support`).

use std::collections::BTreeMap;

use orion_client::xattr::SetMode;
use orion_client::{Client, FsError, FsResult, OpenFlags, RenameMode, SetAttrReq, TimeSet};

use crate::support::*;

thread_local! {
    /// The message of the last EIO this thread's operations got: the simulator prints
    /// it with a failure (an errno alone does not say which path failed).
    pub static LAST_EIO: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

pub fn errno(e: FsError) -> i32 {
    let n = e.errno();
    if n == libc::EIO {
        LAST_EIO.with(|m| *m.borrow_mut() = e.to_string());
    }
    n
}

pub fn ok<T>(r: Result<T, FsError>) -> Result<Outcome, i32> {
    r.map(|_| Outcome::Ok).map_err(errno)
}

pub fn run_client(c: &Client, top: &str, op: &Op) -> Outcome {
    let at = |p: &P| format!("{top}/{}", p.rel());
    let umask = |m: u32| m & !UMASK;
    let r: Result<Outcome, i32> = (|| match op {
        Op::Create(p, m) => {
            let flags = OpenFlags {
                write: true,
                create: true,
                excl: true,
                ..Default::default()
            };
            let fd = c.open(&at(p), flags, umask(*m)).map_err(errno)?;
            ok(c.close(fd))
        }
        Op::Mkdir(p, m) => ok(c.mkdir(&at(p), umask(*m))),
        Op::Unlink(p) => ok(c.unlink(&at(p))),
        Op::Rmdir(p) => ok(c.rmdir(&at(p))),
        Op::Rename(a, b) => ok(c.rename(&at(a), &at(b))),
        Op::Link(a, b) => ok(c.link(&at(a), &at(b))),
        Op::Symlink(t, p) => ok(c.symlink(&target(*t), &at(p))),
        Op::Readlink(p) => c.readlink(&at(p)).map(Outcome::Data).map_err(errno),
        Op::Write(p, off, len, seed) => {
            let flags = OpenFlags {
                write: true,
                ..Default::default()
            };
            let fd = c.open(&at(p), flags, 0).map_err(errno)?;
            let r = c.pwrite(fd, *off, &pattern(*len, *seed));
            c.close(fd).map_err(errno)?;
            r.map(|n| Outcome::Data(n.to_le_bytes().to_vec()))
                .map_err(errno)
        }
        Op::Read(p, off, len) => {
            let fd = c.open(&at(p), OpenFlags::read(), 0).map_err(errno)?;
            let r = c.pread(fd, *off, *len);
            c.close(fd).map_err(errno)?;
            r.map(Outcome::Data).map_err(errno)
        }
        Op::Truncate(p, size) => ok(c.truncate(&at(p), *size)),
        Op::Chmod(p, m) => ok(c.chmod(&at(p), *m)),
        Op::Chown(p, u, g) => ok(c.setattr_path(
            &at(p),
            &SetAttrReq {
                uid: Some(*u),
                gid: Some(*g),
                ..Default::default()
            },
        )),
        Op::Utimens(p, a, m) => ok(c.utimens(
            &at(p),
            Some(TimeSet::At(a * 1_000_000_000)),
            Some(TimeSet::At(m * 1_000_000_000)),
        )),
        Op::Fsync(p) => {
            let fd = c.open(&at(p), OpenFlags::read(), 0).map_err(errno)?;
            let r = c.fsync(fd);
            c.close(fd).map_err(errno)?;
            ok(r)
        }
        Op::Exchange(a, b) => ok(c.rename_with(&at(a), &at(b), RenameMode::Exchange)),
        Op::SetXattr(p, n, len, seed, flags) => {
            let mode = SetMode::from_flags(*flags).map_err(errno)?;
            ok(c.setxattr(&at(p), &xname(*n), &pattern(*len, *seed), mode))
        }
        Op::GetXattr(p, n) => c
            .getxattr(&at(p), &xname(*n))
            .map(Outcome::Data)
            .map_err(errno),
        Op::RemoveXattr(p, n) => ok(c.removexattr(&at(p), &xname(*n))),
        Op::ListXattr(p) => c
            .listxattr(&at(p))
            .map(|l| Outcome::Data(sorted_names(&l)))
            .map_err(errno),
        Op::Fallocate(p, mode, off, len) => {
            let flags = OpenFlags {
                write: true,
                ..Default::default()
            };
            let fd = c.open(&at(p), flags, 0).map_err(errno)?;
            let r = c.fallocate(fd, *mode, *off, *len);
            c.close(fd).map_err(errno)?;
            ok(r)
        }
        Op::UnlinkOpen(p, off, len, seed) => {
            nameless_use(c, &at(p), (*off, *len, *seed), || c.unlink(&at(p)))
        }
        Op::RenameOpen(from, p, off, len, seed) => {
            nameless_use(c, &at(p), (*off, *len, *seed), || {
                c.rename(&at(from), &at(p))
            })
        }
    })();
    r.unwrap_or_else(Outcome::Err)
}

/// Opens `path` O_RDWR, takes its name away with `unname`, then uses the descriptor:
/// fstat, pwrite (offset, length, seed), fstat and read it all ([`unlinked_use`]).
fn nameless_use(
    c: &Client,
    path: &str,
    (off, len, seed): (u64, usize, u8),
    unname: impl FnOnce() -> FsResult<()>,
) -> Result<Outcome, i32> {
    let flags = OpenFlags {
        read: true,
        write: true,
        ..Default::default()
    };
    let fd = c.open(path, flags, 0).map_err(errno)?;
    let r = (|| {
        unname()?;
        let a = c.fstat(fd)?;
        c.pwrite(fd, off, &pattern(len, seed))?;
        let size = c.fstat(fd)?.size;
        let data = c.pread(fd, 0, size as usize)?;
        Ok(unlinked_use(a.nlink as u64, a.size, size, &data))
    })();
    c.close(fd).map_err(errno)?;
    r.map_err(errno)
}

pub fn node(c: &Client, path: &str) -> Node {
    let a = c.lstat(path).unwrap();
    let kind = kind_of(a.ftype);
    let content = match kind {
        'l' => c.readlink(path).unwrap(),
        'f' => {
            let fd = c.open(path, OpenFlags::read(), 0).unwrap();
            let b = c.pread(fd, 0, a.size as usize).unwrap();
            c.close(fd).unwrap();
            b
        }
        _ => vec![],
    };
    let xattrs = if kind == 'f' || kind == 'd' {
        xattr_pairs(&c.listxattr(path).unwrap(), |n| {
            c.getxattr(path, n).unwrap()
        })
    } else {
        Vec::new()
    };
    Node::from_attr(&a, content, xattrs)
}

pub fn client_snapshot(c: &Client, top: &str) -> Snapshot {
    fn walk(c: &Client, dir: &str, rel: &str, out: &mut Snapshot) {
        for e in c.readdir(dir).unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let name = String::from_utf8_lossy(&e.name).into_owned();
            let path = format!("{dir}/{name}");
            let key = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let n = node(c, &path);
            let is_dir = n.kind == 'd';
            out.insert(key.clone(), n);
            if is_dir {
                walk(c, &path, &key, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(c, top, "", &mut out);
    out.insert(".".into(), node(c, top));
    out
}
