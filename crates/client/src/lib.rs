//! `orion-client`: the OrionFS client library (paper §4.3, §5; DESIGN.md §3, §4).
//!
//! A [`Client`] connects to the metadata server and the data stores over the fabric
//! ([`remote`]) and offers POSIX-shaped calls on paths and file handles ([`fs`]). It keeps
//! copies of the inodes it uses and checks them against the MDS's log tail with a
//! one-sided read before each use ([`arbitration`]); it allocates data pages from
//! chunks the MDS delegates ([`alloc`]); it reads and writes data pages copy-on-write,
//! from a mapped local pool, a DRAM cache or one-sided operations ([`datapath`]); every
//! update built from a cached inode goes through one commit loop ([`commit`]); with
//! optimistic persistence it commits small writes in batches ([`staging`]).
//!
//! The front-ends (the FUSE daemon, the preload library) speak only to this crate:
//! what they need of the types below it is re-exported here.

pub mod access;
pub mod alloc;
pub mod arbitration;
pub mod calls;
pub mod commit;
pub mod config;
pub mod datapath;
pub mod fs;
pub mod kernel_cache;
pub mod remote;
pub mod replicas;
pub mod settings;
pub mod staging;
pub mod stats;

pub use calls::Call;
pub use config::ClientConfig;
pub use fs::{Client, DirEntry, Fd, OpenFlags};
pub use kernel_cache::{Invalidate, Watched};
pub use settings::FabricSection;
pub use stats::Stats;

// What a front-end needs of the crates below the client library.
pub use orion_fabric::local::remove_own_files as remove_fabric_files;
pub use orion_format::{FileType, PAGE_SIZE};
pub use orion_meta::{perm, xattr};
pub use orion_meta::{
    Attr, FsError, FsResult, NewNode, RenameMode, SetAttrReq, StatFs, TimeSet, ROOT_INO,
};
/// Byte copies that stay fast at any skew against page alignment (front-ends copy
/// read data into their callers' buffers with it).
pub use orion_pmem::copy_bytes;
pub use orion_proto::{Epoch, Invalidation, LockKind, LockReq, MemberId, MemberState, StoreInfo};
