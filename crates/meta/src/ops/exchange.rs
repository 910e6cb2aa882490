//! RENAME_EXCHANGE: two names swap the inodes they name.

use orion_format::{attr_mask as m, DirEntryRec, Entry, FileType, SetAttrRec};

use crate::engine::{push_update, MetaEngine, Updates};
use crate::error::*;
use crate::index::DirEnt;

impl MetaEngine {
    /// RENAME_EXCHANGE: `on` in `op` and `nn` in `np` swap the inodes they name, in
    /// one journaled commit. Each name keeps its readdir cookie.
    pub(crate) fn exchange(
        &mut self,
        op: u64,
        on: &[u8],
        src: DirEnt,
        np: u64,
        nn: &[u8],
        dst: DirEnt,
    ) -> FsResult<()> {
        if src.ino == dst.ino {
            return Ok(());
        }
        // A directory cannot end up inside itself, whichever way it moves.
        let src_dir = src.ftype == FileType::Directory;
        let dst_dir = dst.ftype == FileType::Directory;
        if (src_dir && self.is_ancestor(src.ino, np)) || (dst_dir && self.is_ancestor(dst.ino, op))
        {
            return Err(EINVAL);
        }
        let now = self.clock.now();
        let rec = |ent: &DirEnt, on_ino: &DirEnt, name: &[u8]| DirEntryRec {
            ino: on_ino.ino,
            cookie: ent.cookie,
            time: now,
            ftype: on_ino.ftype,
            name: name.to_vec(),
        };
        let mut u: Updates = Vec::new();
        push_update(&mut u, op, Entry::DirRemove(rec(&src, &src, on)));
        push_update(&mut u, np, Entry::DirRemove(rec(&dst, &dst, nn)));
        push_update(&mut u, op, Entry::DirAdd(rec(&src, &dst, on)));
        push_update(&mut u, np, Entry::DirAdd(rec(&dst, &src, nn)));
        for ino in [src.ino, dst.ino] {
            push_update(
                &mut u,
                ino,
                Entry::SetAttr(SetAttrRec {
                    mask: m::CTIME,
                    ctime: now,
                    ..Default::default()
                }),
            );
        }
        // A directory that changes parent moves its ".." link with it.
        if op != np && src_dir != dst_dir {
            let (from, to) = if src_dir { (op, np) } else { (np, op) };
            for (dir, delta) in [(from, -1i64), (to, 1)] {
                push_update(&mut u, dir, self.link_change(dir, delta, now)?);
            }
        }
        self.commit(u, true)?;
        if op != np {
            if src_dir {
                self.inodes.get_mut(&src.ino).expect("moved inode").parent = np;
            }
            if dst_dir {
                self.inodes.get_mut(&dst.ino).expect("moved inode").parent = op;
            }
        }
        Ok(())
    }
}
