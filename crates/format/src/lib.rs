//! `orion-format`: the bytes on the media, and nothing else.
//!
//! An MDS pool holds a superblock, a redo journal, a table of fixed-size inode slots,
//! a fixed 256-byte first log segment per slot, and 4 KiB pages that form the rest of
//! the inode logs (NOVA-style: a linked list of log segments per inode, entries in
//! 64-byte multiples). A data pool holds a superblock and 4 KiB
//! data pages named by global page addresses. All pointers are pool offsets. Page 0
//! of the MDS pool also holds, past the superblock, the record of which clients
//! held open tables (`holders`).
//!
//! Every decoder takes untrusted bytes and returns an error rather than panicking;
//! `fuzz/` drives them with arbitrary input.

mod codec;
mod crc;
mod entry;
mod holders;
mod inode;
mod journal;
mod log;
mod superblock;

pub use codec::FormatError;
pub use crc::{crc32c, crc32c_append};
pub use entry::{
    attr_mask, valid_name, valid_xattr_name, DirEntryRec, Entry, EntryKind, SetAttrRec, WriteRec,
    XattrRec, ENTRY_HEADER, MAX_ENTRY_LINES, XATTR_NAME_MAX, XATTR_VALUE_MAX,
};
pub use holders::{
    decode_holders, encode_holders, Holders, HoldersRecord, HOLDERS_COPY, HOLDERS_OFFSET,
    MAX_HOLDERS,
};
pub use inode::{
    FileType, InodeSlot, INODE_SLOT_SIZE, SLOT_GENERATION_OFFSET, SLOT_HEADS_OFFSET,
    SLOT_TAIL_OFFSET,
};
pub use journal::{JournalRecord, JOURNAL_MAGIC};
pub use log::{
    Compaction, LogPageHeader, Tail, COMPACTION_LEN, COMPACTION_OFFSET, LOG_PAGE_HEADER,
    PAGE_NEXT_OFFSET,
};
pub use superblock::{PoolKind, Superblock, POOL_BYTES_PER_INODE, SUPERBLOCK_SIZE};

/// Every page, log or data, is 4 KiB.
pub const PAGE_SIZE: u64 = 4096;
/// Bytes of an inode's first log segment: a header and three entries, which is what
/// a new file's log holds (its attributes, its link count and one write), so that an
/// empty or small file costs no log page.
pub const FIRST_SEGMENT_SIZE: u64 = 256;
/// Entries, journal records and persistence work in 64-byte lines.
pub const LINE: u64 = 64;
/// Longest name in a directory (as Linux's NAME_MAX).
pub const NAME_MAX: usize = 255;
/// Longest symlink target (as Linux's PATH_MAX minus the terminator).
pub const SYMLINK_MAX: usize = 4095;
/// Most pages one write entry may cover (Orion caps a write entry at 512 MiB).
pub const MAX_WRITE_PAGES: u32 = (512 << 20) / PAGE_SIZE as u32;

/// A global page address: replication group in the top 16 bits, page index below.
/// Meaningful on every node and after restart (paper §3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gpa(pub u64);

impl Gpa {
    pub const NONE: Gpa = Gpa(u64::MAX);
    pub fn new(group: u16, page: u64) -> Gpa {
        Gpa(((group as u64) << 48) | (page & ((1 << 48) - 1)))
    }
    pub fn group(self) -> u16 {
        (self.0 >> 48) as u16
    }
    pub fn page(self) -> u64 {
        self.0 & ((1 << 48) - 1)
    }
    pub fn offset_by(self, pages: u64) -> Gpa {
        Gpa::new(self.group(), self.page() + pages)
    }
}

/// A random 64-bit number (nonces, instance and incarnation numbers).
pub fn random_u64() -> u64 {
    let u = random_uuid();
    u64::from_le_bytes([u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7]])
}

/// `bytes` in lower-case hex (ids in messages and logs, tags in names).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|x| format!("{x:02x}")).collect()
}

/// A fresh random 16-byte id for a pool or a cluster (from the kernel's generator,
/// which needs no descriptor). It panics if the kernel gives no random bytes: ids
/// of zeros would be shared by every pool, cluster and client made so (it filled
/// zeros silently when `/dev/urandom` could not be opened, e.g. with no descriptor
/// left), and a client's nonce picks out the replies the MDS remembers for it.
pub fn random_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    getrandom::getrandom(&mut u).expect("the kernel's random source failed");
    u
}
