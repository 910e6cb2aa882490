//! The inodes the kernel holds: for each inode number, the generation its entries
//! said (design note 67), the lookups it has not forgotten yet, and the attributes
//! it was last given.
//!
//! Orion reuses inode numbers, and the kernel names an inode by its number alone
//! in every request. A kernel reference can outlive its file: a working directory
//! or an `O_PATH` descriptor of a directory another client removed holds no open
//! at the MDS, so the directory is destroyed and its number goes to a later file.
//! A request that names the number must then fail (ESTALE, as NFS says of a file
//! handle whose file is gone), not create, remove or list in that later file: the
//! mount checks the inode's generation against the one the kernel was told
//! ([`crate::fs`]'s `current`).
//!
//! Such a reference still gets what a local file system gives it (design note 71):
//! a working directory removed by `rmdir` stays a directory with no links, which
//! `stat` describes and `ls` lists as empty, until the kernel lets go of it. So
//! every inode the kernel holds keeps the latest attributes the mount read of it,
//! and once its file is gone (the client says ENOENT, or a later generation holds
//! the number) the mount answers those, with no links ([`Nodes::removed`]).
//!
//! The client's kernel cache counts lookups too (`KernelCache::held`), for the
//! MDS's watches, and only while the kernel keeps names; its count must follow
//! every inode the kernel holds, an older generation's included, where this one
//! starts again at a later generation. So each keeps its own.

use std::collections::HashMap;
use std::sync::Mutex;

use orion_client::{Attr, FsError, FsResult};

struct Node {
    generation: u64,
    lookups: u64,
    /// The latest attributes read of this generation.
    last: Attr,
}

#[derive(Default)]
pub(crate) struct Nodes {
    held: Mutex<HashMap<u64, Node>>,
}

impl Nodes {
    /// Whether an entry for inode `ino` of generation `generation` may go to the
    /// kernel; if so, it is one lookup more. An entry of another generation than
    /// the kernel holds makes the kernel drop its inode of that number and make a
    /// new one (its forgets for the old one may then count against the new one:
    /// they only end the check early, never make it fail a request). So an entry
    /// of an earlier generation than the one recorded (read before the number was
    /// reused, answered after a later one's) must not go: the kernel would hold the
    /// removed file under the later file's number, unchecked. Its caller answers
    /// ESTALE instead, and the kernel looks the name up again.
    pub fn told(&self, a: &Attr) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.entry(a.ino).or_insert_with(|| Node {
            generation: a.generation,
            lookups: 0,
            last: a.clone(),
        });
        if n.generation > a.generation {
            return false;
        }
        if n.generation < a.generation {
            n.generation = a.generation;
            n.lookups = 0;
        }
        // An earlier generation went back above; a later one took the node over.
        debug_assert_eq!(
            n.generation, a.generation,
            "inode {} of another generation",
            a.ino
        );
        n.last = a.clone();
        n.lookups += 1;
        true
    }

    /// Whether `a` (just read) is of the generation the kernel holds of its inode
    /// number, or of one the kernel does not hold; if it holds this one, `a` is
    /// kept as its latest attributes.
    pub fn saw(&self, a: &Attr) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        match held.get_mut(&a.ino) {
            Some(n) if n.generation == a.generation => {
                n.last = a.clone();
                true
            }
            Some(_) => false,
            None => true,
        }
    }

    /// The attributes of a held inode whose file is gone, as a local file system
    /// keeps them for its last reference: the last ones the kernel was given, with
    /// no links. `now` is what reading its current attributes gave: the file is
    /// gone if it is destroyed (ENOENT) or a later generation has its number. An
    /// earlier generation than the one held is a stale read (a lane whose copy is
    /// behind), and any other error (a lost connection) is no answer: neither says
    /// the file is gone.
    pub fn removed(&self, ino: u64, now: &FsResult<Attr>) -> Option<Attr> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.get(&ino)?;
        let gone = match now {
            Err(FsError::Errno(libc::ENOENT)) => true,
            Ok(a) => a.generation > n.generation,
            Err(_) => false,
        };
        gone.then(|| Attr {
            nlink: 0,
            ..n.last.clone()
        })
    }

    /// The kernel forgot `lookups` lookups of `ino`.
    pub fn forgot(&self, ino: u64, lookups: u64) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&ino) {
            // A node is held from its first lookup told and goes with its last one.
            debug_assert!(n.lookups > 0, "inode {ino} held with no lookups");
            n.lookups = n.lookups.saturating_sub(lookups);
            if n.lookups == 0 {
                held.remove(&ino);
            }
        }
    }

    /// The generation of `ino` the kernel holds, if it holds one the mount told it
    /// of (the root is never told).
    pub fn generation(&self, ino: u64) -> Option<u64> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.get(&ino).map(|n| n.generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orion_client::FileType;

    fn attr(ino: u64, generation: u64, size: u64) -> Attr {
        Attr {
            mode: 0o755,
            nlink: 2,
            size,
            ..Attr::new(ino, FileType::Directory, generation)
        }
    }

    #[test]
    fn a_node_is_held_until_its_lookups_are_forgotten_and_follows_a_new_generation() {
        let n = Nodes::default();
        assert!(n.told(&attr(7, 1, 0)));
        assert!(n.told(&attr(7, 1, 0)));
        n.forgot(7, 1);
        assert_eq!(n.generation(7), Some(1));
        n.forgot(7, 1);
        assert_eq!(n.generation(7), None);
        assert!(n.told(&attr(7, 1, 0)));
        assert!(n.told(&attr(7, 2, 0)));
        assert_eq!(n.generation(7), Some(2));
        assert!(!n.told(&attr(7, 1, 0)), "an earlier generation may not go");
        assert_eq!(n.generation(7), Some(2));
        n.forgot(7, 1);
        assert_eq!(n.generation(7), None);
        n.forgot(8, 3);
        assert_eq!(n.generation(8), None);
    }

    #[test]
    fn a_gone_node_keeps_the_last_attributes_it_was_given_with_no_links() {
        let n = Nodes::default();
        let enoent = Err(FsError::Errno(libc::ENOENT));
        assert_eq!(n.removed(7, &enoent), None, "not held");
        assert!(n.told(&attr(7, 1, 10)));
        assert!(n.saw(&attr(7, 1, 20)));
        assert!(!n.saw(&attr(7, 2, 30)), "another generation");
        assert!(n.saw(&attr(8, 1, 40)), "a number the kernel does not hold");
        let gone = n
            .removed(7, &Ok(attr(7, 2, 30)))
            .expect("a later generation");
        assert_eq!((gone.nlink, gone.size, gone.generation), (0, 20, 1));
        assert_eq!(n.removed(7, &enoent), Some(gone));
        assert!(n.told(&attr(7, 1, 20)));
        assert_eq!(n.removed(7, &Ok(attr(7, 1, 20))), None, "still there");
        assert_eq!(n.removed(7, &Ok(attr(7, 0, 5))), None, "a stale read");
        assert_eq!(n.removed(7, &Err(FsError::Io("lost".into()))), None);
        assert_eq!(n.removed(7, &Err(FsError::Errno(libc::ESTALE))), None);
        n.forgot(7, 2);
        assert_eq!(n.removed(7, &enoent), None, "forgotten");
    }
}
