//! Rebuilding DRAM state from the media: walk the namespace from the root, load every
//! reachable inode by walking its log. Mount uses it (and refuses damaged pools);
//! fsck uses it to list what is wrong.

use std::collections::{HashMap, VecDeque};

use orion_format::{FileType, InodeSlot, Superblock, Tail, INODE_SLOT_SIZE, SLOT_TAIL_OFFSET};
use orion_pmem::Pool;

use crate::engine::ROOT_INO;
use crate::error::FsResult;
use crate::index::InodeState;
use crate::log::{walk_log, InodeLog};

pub struct LoadedInode {
    pub state: InodeState,
    pub log: InodeLog,
    pub parent: u64,
}

pub struct Tree {
    pub inodes: HashMap<u64, LoadedInode>,
    /// Directory entries naming each inode.
    pub refs: HashMap<u64, u32>,
    /// Structural damage: unreadable slots or logs, names of the wrong type, loops.
    pub problems: Vec<String>,
}

/// Loads one inode from its slot and log. `tails` overrides slot tails (fsck's
/// view of a journal record that mount would replay).
pub fn load_inode(
    pool: &Pool,
    sb: &Superblock,
    ino: u64,
    tails: &HashMap<u64, u64>,
) -> FsResult<(InodeState, InodeLog, FileType)> {
    let off = sb.slot_off(ino);
    let slot = InodeSlot::decode(&pool.read_vec(off, INODE_SLOT_SIZE)?)?.ok_or_else(|| {
        crate::FsError::Corrupt(format!(
            "inode {ino}: slot is free but a directory names it"
        ))
    })?;
    if slot.ino != ino {
        return Err(crate::FsError::Corrupt(format!(
            "inode {ino}: slot says inode {}",
            slot.ino
        )));
    }
    let tail = tails
        .get(&(off + SLOT_TAIL_OFFSET))
        .map(|&v| Tail::unpack(v))
        .unwrap_or(slot.tail);
    let head = slot.heads[(tail.version & 1) as usize];
    let mut state = InodeState::new(ino, slot.ftype, slot.generation);
    let mut freed = Vec::new();
    let log = walk_log(pool, sb, ino, head, tail, &mut |e, _| {
        freed.clear();
        state.apply(e, &mut freed)
    })?;
    Ok((state, log, slot.ftype))
}

pub fn load_tree(
    pool: &Pool,
    sb: &Superblock,
    tails: Option<&HashMap<u64, u64>>,
) -> FsResult<Tree> {
    load_tree_reporting(pool, sb, tails, &mut |_| {})
}

/// [`load_tree`], telling `loaded` how many inodes it has loaded as it goes.
pub fn load_tree_reporting(
    pool: &Pool,
    sb: &Superblock,
    tails: Option<&HashMap<u64, u64>>,
    loaded: &mut dyn FnMut(u64),
) -> FsResult<Tree> {
    let empty = HashMap::new();
    let tails = tails.unwrap_or(&empty);
    let mut tree = Tree {
        inodes: HashMap::new(),
        refs: HashMap::new(),
        problems: Vec::new(),
    };
    let mut queue = VecDeque::new();
    match load_inode(pool, sb, ROOT_INO, tails) {
        Ok((state, log, FileType::Directory)) => {
            tree.inodes.insert(
                ROOT_INO,
                LoadedInode {
                    state,
                    log,
                    parent: ROOT_INO,
                },
            );
            queue.push_back(ROOT_INO);
        }
        Ok(_) => tree
            .problems
            .push("the root inode is not a directory".into()),
        Err(e) => tree.problems.push(format!("root: {e}")),
    }
    while let Some(dir) = queue.pop_front() {
        let children: Vec<(Vec<u8>, u64, FileType)> = tree.inodes[&dir]
            .state
            .dir()
            .map(|d| {
                d.names
                    .iter()
                    .map(|(n, e)| (n.to_vec(), e.ino, e.ftype))
                    .collect()
            })
            .unwrap_or_default();
        for (name, ino, ftype) in children {
            let what = || {
                format!(
                    "directory {dir} entry {:?} (inode {ino})",
                    String::from_utf8_lossy(&name)
                )
            };
            *tree.refs.entry(ino).or_insert(0) += 1;
            if ino <= ROOT_INO || ino >= sb.inode_count {
                tree.problems
                    .push(format!("{}: inode number out of range", what()));
                continue;
            }
            if let Some(existing) = tree.inodes.get(&ino) {
                if ftype == FileType::Directory || existing.state.attr.ftype != ftype {
                    tree.problems.push(format!(
                        "{}: a second link to a directory, or of another type",
                        what()
                    ));
                }
                continue;
            }
            match load_inode(pool, sb, ino, tails) {
                Ok((state, log, real)) => {
                    if real != ftype {
                        tree.problems.push(format!(
                            "{}: entry says {ftype:?}, inode is {real:?}",
                            what()
                        ));
                        continue;
                    }
                    tree.inodes.insert(
                        ino,
                        LoadedInode {
                            state,
                            log,
                            parent: dir,
                        },
                    );
                    loaded(tree.inodes.len() as u64);
                    if ftype == FileType::Directory {
                        queue.push_back(ino);
                    }
                }
                Err(e) => tree.problems.push(format!("{}: {e}", what())),
            }
        }
    }
    Ok(tree)
}
