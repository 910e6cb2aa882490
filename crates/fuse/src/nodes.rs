//! The inodes the kernel holds: for each inode number, the generation its entries
//! said (design note 67) and the lookups it has not forgotten yet.
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
//! The client's kernel cache counts lookups too (`KernelCache::held`), for the
//! MDS's watches, and only while the kernel keeps names; its count must follow
//! every inode the kernel holds, an older generation's included, where this one
//! starts again at a later generation. So each keeps its own.

use std::collections::HashMap;
use std::sync::Mutex;

struct Node {
    generation: u64,
    lookups: u64,
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
    pub fn told(&self, ino: u64, generation: u64) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.entry(ino).or_insert(Node {
            generation,
            lookups: 0,
        });
        if n.generation > generation {
            return false;
        }
        if n.generation < generation {
            *n = Node {
                generation,
                lookups: 0,
            };
        }
        n.lookups += 1;
        true
    }

    /// The kernel forgot `lookups` lookups of `ino`.
    pub fn forgot(&self, ino: u64, lookups: u64) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&ino) {
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

    #[test]
    fn a_node_is_held_until_its_lookups_are_forgotten_and_follows_a_new_generation() {
        let n = Nodes::default();
        assert!(n.told(7, 1));
        assert!(n.told(7, 1));
        n.forgot(7, 1);
        assert_eq!(n.generation(7), Some(1));
        n.forgot(7, 1);
        assert_eq!(n.generation(7), None);
        assert!(n.told(7, 1));
        assert!(n.told(7, 2));
        assert_eq!(n.generation(7), Some(2));
        assert!(!n.told(7, 1), "an earlier generation may not go");
        assert_eq!(n.generation(7), Some(2));
        n.forgot(7, 1);
        assert_eq!(n.generation(7), None);
        n.forgot(8, 3);
        assert_eq!(n.generation(8), None);
    }
}
