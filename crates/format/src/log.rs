//! Log pages and the packed tail word.

use crate::codec::*;
use crate::{FormatError, LINE};

/// Bytes at the start of each log page before its first entry.
pub const LOG_PAGE_HEADER: u64 = 64;
/// Offset of the `next` pointer in a log page (an 8-byte atomic store links a page).
pub const PAGE_NEXT_OFFSET: u64 = 24;
const MAGIC: u32 = 0x474F_4C4F; // "OLOG"

/// The log tail and log version packed in one u64, so that both change with one
/// atomic store (paper §4.2). The tail is a pool offset, a multiple of 64, kept in
/// the low 40 bits in 64-byte units (pools up to 64 TiB); the version is the top 24.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Tail {
    pub version: u32,
    pub offset: u64,
}

impl Tail {
    const OFFSET_BITS: u32 = 40;
    pub const MAX_VERSION: u32 = (1 << 24) - 1;

    pub fn pack(self) -> u64 {
        debug_assert!(
            self.offset.is_multiple_of(LINE),
            "tail must be line-aligned"
        );
        ((self.version as u64 & Self::MAX_VERSION as u64) << Self::OFFSET_BITS)
            | ((self.offset / LINE) & ((1 << Self::OFFSET_BITS) - 1))
    }

    pub fn unpack(v: u64) -> Tail {
        Tail {
            version: (v >> Self::OFFSET_BITS) as u32,
            offset: (v & ((1 << Self::OFFSET_BITS) - 1)) * LINE,
        }
    }
}

/// The header of a log page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogPageHeader {
    pub ino: u64,
    /// The log version the page was written for (GC writes a new version).
    pub version: u32,
    /// Pool offset of the next page of this log, 0 for none.
    pub next: u64,
}

impl LogPageHeader {
    pub fn encode(&self) -> [u8; LOG_PAGE_HEADER as usize] {
        let mut b = [0u8; LOG_PAGE_HEADER as usize];
        put_u32(&mut b, 0, MAGIC);
        put_u64(&mut b, 8, self.ino);
        put_u32(&mut b, 16, self.version);
        put_u64(&mut b, PAGE_NEXT_OFFSET as usize, self.next);
        let crc = crc_skipping(&b[..24], 4);
        put_u32(&mut b, 4, crc);
        b
    }

    /// Writes a valid checksum into a header (fuzzing and tests).
    pub fn seal(b: &mut [u8]) {
        if b.len() >= 24 {
            let crc = crc_skipping(&b[..24], 4);
            put_u32(b, 4, crc);
        }
    }

    pub fn decode(b: &[u8]) -> Result<LogPageHeader, FormatError> {
        let b = b
            .get(..LOG_PAGE_HEADER as usize)
            .ok_or(FormatError::Truncated("log page header"))?;
        if u32_at(b, 0)? != MAGIC {
            return Err(FormatError::BadMagic("log page"));
        }
        if crc_skipping(&b[..24], 4) != u32_at(b, 4)? {
            return Err(FormatError::BadChecksum("log page header"));
        }
        Ok(LogPageHeader {
            ino: u64_at(b, 8)?,
            version: u32_at(b, 16)?,
            next: u64_at(b, PAGE_NEXT_OFFSET as usize)?,
        })
    }
}

/// Offset in a log's first page of its [`Compaction`] record.
pub const COMPACTION_OFFSET: u64 = 32;
/// Bytes of a [`Compaction`] record: two words and a checksum.
pub const COMPACTION_LEN: usize = 20;

/// What a log GC wrote in the first page of the log it made (in the page header's
/// spare bytes): the log it compacted ended at `from`, and the entries that hold the
/// same inode end at `end` in the new log; entries after `end` came later. A client
/// whose copy of the inode is the old log up to `from` has the state of the new log
/// up to `end`, and catches up from there instead of loading the whole log again.
/// A first page without a record (all zeros, as every other page) is a log no GC
/// made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compaction {
    pub from: Tail,
    pub end: u64,
}

impl Compaction {
    pub fn encode(&self) -> [u8; COMPACTION_LEN] {
        let mut b = [0u8; COMPACTION_LEN];
        put_u64(&mut b, 0, self.from.pack());
        put_u64(&mut b, 8, self.end);
        let crc = crc_skipping(&b, 16);
        put_u32(&mut b, 16, crc);
        b
    }

    /// The record in log page `page` (at least its header), if it holds one.
    pub fn decode(page: &[u8]) -> Result<Option<Compaction>, FormatError> {
        let at = COMPACTION_OFFSET as usize;
        let b = page
            .get(at..at + COMPACTION_LEN)
            .ok_or(FormatError::Truncated("log compaction record"))?;
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        if crc_skipping(b, 16) != u32_at(b, 16)? {
            return Err(FormatError::BadChecksum("log compaction record"));
        }
        Ok(Some(Compaction {
            from: Tail::unpack(u64_at(b, 0)?),
            end: u64_at(b, 8)?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_packs_and_header_round_trips() {
        let t = Tail {
            version: 0xABCDE,
            offset: 64 * 12345,
        };
        assert_eq!(Tail::unpack(t.pack()), t);
        let h = LogPageHeader {
            ino: 9,
            version: 3,
            next: 8192,
        };
        let mut b = h.encode();
        assert_eq!(LogPageHeader::decode(&b).unwrap(), h);
        b[9] ^= 0xff;
        assert!(LogPageHeader::decode(&b).is_err());
    }

    #[test]
    fn a_compaction_record_round_trips_and_its_absence_reads_as_none() {
        let mut page = LogPageHeader {
            ino: 9,
            version: 4,
            next: 0,
        }
        .encode()
        .to_vec();
        assert_eq!(Compaction::decode(&page).unwrap(), None);
        let c = Compaction {
            from: Tail {
                version: 3,
                offset: 64 * 777,
            },
            end: 64 * 90,
        };
        let at = COMPACTION_OFFSET as usize;
        page[at..at + COMPACTION_LEN].copy_from_slice(&c.encode());
        assert_eq!(Compaction::decode(&page).unwrap(), Some(c));
        // The page header is untouched by the record beside it.
        assert_eq!(LogPageHeader::decode(&page).unwrap().version, 4);
        page[at + 3] ^= 1;
        assert!(Compaction::decode(&page).is_err());
        assert!(Compaction::decode(&page[..40]).is_err());
    }
}
