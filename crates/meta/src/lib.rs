//! `orion-meta`: the log-structured metadata engine of OrionFS.
//!
//! Inode logs ([`log`]) are walked into DRAM state ([`index`]): attributes, a name
//! index per directory, an extent index per file. The same walk and the same
//! [`InodeState::apply`] serve the MDS and a client's cached copy of an inode.
//! [`MetaEngine`] owns an MDS pool and commits changes (one tail store, or the
//! [`journal`] when several inodes change), compacts logs ([`MetaEngine::force_gc`]),
//! and rebuilds everything at mount ([`recovery`]). [`LocalFs`] puts the engine
//! beside a data pool in one process: the foundation's local file system. [`xattr`]
//! holds the rules of extended attributes that every front end applies the same way.

pub mod alloc;
pub mod clock;
pub mod engine;
pub mod error;
pub mod falloc;
pub mod free_inodes;
pub mod fsck;
pub mod index;
pub mod journal;
pub mod localfs;
pub mod log;
pub mod ops;
pub mod perm;
pub mod recovery;
pub mod xattr;

pub use clock::{Clock, LogicalClock, SystemClock};
pub use engine::{
    Changed, EngineConfig, MetaEngine, MountReport, NewNode, ReaddirEntry, RenameMode, SetAttrReq,
    TimeSet, ROOT_INO,
};
pub use error::{FsError, FsResult};
pub use index::{Attr, InodeState};
pub use localfs::{LocalConfig, LocalFs, StatFs};
pub use ops::setattr_entry;

/// A hash map for number keys (inode and sequence numbers, connection ids, page
/// addresses, a client's nonce and request ids): foldhash instead of SipHash, which was
/// a twentieth of the MDS's time per 4 KiB write; its per-process random seed keeps a
/// peer from aiming numbers at one bucket. Names keep std's SipHash.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Largest file size accepted (EFBIG past it).
pub const MAX_FILE_SIZE: u64 = 1 << 60;
