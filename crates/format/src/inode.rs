//! Inode slots: fixed-size records in the inode table. A slot holds what never changes
//! (type, number, generation) and the log pointers; every attribute lives in the log.

use crate::codec::*;
use crate::log::Tail;

pub const INODE_SLOT_SIZE: usize = 128;
/// Offset of the generation word inside a slot; a freed slot keeps it, so a reused
/// inode number gets the next generation.
pub const SLOT_GENERATION_OFFSET: u64 = 16;
/// Offset of the two log heads inside a slot (8 bytes each; the tail's version parity
/// picks the live one).
pub const SLOT_HEADS_OFFSET: u64 = 24;
/// Offset of the packed tail+version word inside a slot (8-byte aligned).
pub const SLOT_TAIL_OFFSET: u64 = 40;
const MAGIC: u32 = 0x4F4E_494F; // "OINO"
const CRC_AT: usize = 48;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    Regular = 1,
    Directory = 2,
    Symlink = 3,
    Fifo = 4,
    CharDev = 5,
    BlockDev = 6,
    Socket = 7,
}

impl FileType {
    pub fn from_code(c: u8) -> Result<FileType, FormatError> {
        Ok(match c {
            1 => FileType::Regular,
            2 => FileType::Directory,
            3 => FileType::Symlink,
            4 => FileType::Fifo,
            5 => FileType::CharDev,
            6 => FileType::BlockDev,
            7 => FileType::Socket,
            _ => {
                return Err(FormatError::BadCode {
                    what: "file type",
                    code: c as u64,
                })
            }
        })
    }

    /// The `S_IFMT` bits for this type.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Regular => 0o100000,
            FileType::Directory => 0o040000,
            FileType::Symlink => 0o120000,
            FileType::Fifo => 0o010000,
            FileType::CharDev => 0o020000,
            FileType::BlockDev => 0o060000,
            FileType::Socket => 0o140000,
        }
    }
}

/// A decoded inode slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InodeSlot {
    pub ftype: FileType,
    pub ino: u64,
    pub generation: u64,
    /// Two heads; the tail's version parity picks the live one, so log GC can switch
    /// head, tail and version with a single 8-byte store.
    pub heads: [u64; 2],
    pub tail: Tail,
}

impl InodeSlot {
    /// Pool offset of the head word that log version `version` uses, in the slot at
    /// `slot_off`.
    pub fn head_offset(slot_off: u64, version: u32) -> u64 {
        slot_off + SLOT_HEADS_OFFSET + 8 * (version & 1) as u64
    }

    pub fn head(&self) -> u64 {
        self.heads[(self.tail.version & 1) as usize]
    }

    pub fn encode(&self) -> [u8; INODE_SLOT_SIZE] {
        let mut b = [0u8; INODE_SLOT_SIZE];
        put_u32(&mut b, 0, MAGIC);
        b[4] = self.ftype as u8;
        put_u64(&mut b, 8, self.ino);
        put_u64(&mut b, SLOT_GENERATION_OFFSET as usize, self.generation);
        put_u64(&mut b, SLOT_HEADS_OFFSET as usize, self.heads[0]);
        put_u64(&mut b, SLOT_HEADS_OFFSET as usize + 8, self.heads[1]);
        put_u64(&mut b, SLOT_TAIL_OFFSET as usize, self.tail.pack());
        let crc = crate::crc32c(&b[..24]);
        put_u32(&mut b, CRC_AT, crc);
        b
    }

    /// `Ok(None)` for a free slot (no magic), an error for a damaged one.
    pub fn decode(b: &[u8]) -> Result<Option<InodeSlot>, FormatError> {
        let b = b
            .get(..INODE_SLOT_SIZE)
            .ok_or(FormatError::Truncated("inode slot"))?;
        if u32_at(b, 0)? != MAGIC {
            return Ok(None);
        }
        if crate::crc32c(&b[..24]) != u32_at(b, CRC_AT)? {
            return Err(FormatError::BadChecksum("inode slot"));
        }
        Ok(Some(InodeSlot {
            ftype: FileType::from_code(b[4])?,
            ino: u64_at(b, 8)?,
            generation: u64_at(b, SLOT_GENERATION_OFFSET as usize)?,
            heads: [
                u64_at(b, SLOT_HEADS_OFFSET as usize)?,
                u64_at(b, SLOT_HEADS_OFFSET as usize + 8)?,
            ],
            tail: Tail::unpack(u64_at(b, SLOT_TAIL_OFFSET as usize)?),
        }))
    }
}
