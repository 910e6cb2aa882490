//! readdir: "." and "..", then the names in cookie order (stable across changes).

use orion_format::FileType;

use crate::engine::{MetaEngine, ReaddirEntry};
use crate::error::*;

impl MetaEngine {
    pub fn readdir(&self, ino: u64, offset: u64) -> FsResult<Vec<ReaddirEntry>> {
        let d = self.dir(ino)?;
        let mut out = Vec::new();
        if offset < 1 {
            out.push(ReaddirEntry {
                cookie: 1,
                ino,
                ftype: FileType::Directory,
                name: b".".to_vec(),
            });
        }
        if offset < 2 {
            out.push(ReaddirEntry {
                cookie: 2,
                ino: d.parent,
                ftype: FileType::Directory,
                name: b"..".to_vec(),
            });
        }
        let idx = d.state.dir().expect("dir");
        for (&cookie, name) in idx.by_cookie.range(offset.max(2).saturating_add(1)..) {
            let e = idx.names[name];
            out.push(ReaddirEntry {
                cookie,
                ino: e.ino,
                ftype: e.ftype,
                name: name.to_vec(),
            });
        }
        Ok(out)
    }
}
