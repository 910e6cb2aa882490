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
}
