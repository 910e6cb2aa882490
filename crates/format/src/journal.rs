//! The redo journal: one record of 8-byte stores (new log tails) that make a
//! multi-inode operation visible at once. Written and persisted whole (the commit
//! point is the record becoming valid), applied, then cleared by zeroing its first word.

use crate::codec::*;
use crate::FormatError;

pub const JOURNAL_MAGIC: u32 = 0x4C4E_4A4F; // "OJNL"
const HEADER: usize = 24;
const CRC_AT: usize = 16;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalRecord {
    pub txid: u64,
    /// (pool offset of an aligned u64, value to store there)
    pub stores: Vec<(u64, u64)>,
}

impl JournalRecord {
    pub fn capacity(journal_size: u64) -> usize {
        (journal_size as usize).saturating_sub(HEADER) / 16
    }

    /// Encoded length, rounded up to whole lines.
    pub fn encoded_len(&self) -> usize {
        (HEADER + 16 * self.stores.len()).div_ceil(64) * 64
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.encoded_len()];
        put_u32(&mut b, 0, JOURNAL_MAGIC);
        put_u32(&mut b, 4, self.stores.len() as u32);
        put_u64(&mut b, 8, self.txid);
        for (i, (off, val)) in self.stores.iter().enumerate() {
            put_u64(&mut b, HEADER + 16 * i, *off);
            put_u64(&mut b, HEADER + 16 * i + 8, *val);
        }
        let crc = crc_skipping(&b, CRC_AT);
        put_u32(&mut b, CRC_AT, crc);
        b
    }

    /// `Ok(None)` when the journal holds no committed record (cleared, or torn).
    pub fn decode(b: &[u8]) -> Result<Option<JournalRecord>, FormatError> {
        if b.len() < HEADER {
            return Err(FormatError::Truncated("journal"));
        }
        if u32_at(b, 0)? != JOURNAL_MAGIC {
            return Ok(None);
        }
        let count = u32_at(b, 4)? as usize;
        if count > Self::capacity(b.len() as u64) {
            return Ok(None);
        }
        let len = (HEADER + 16 * count).div_ceil(64) * 64;
        let Some(rec) = b.get(..len) else {
            return Ok(None);
        };
        if crc_skipping(rec, CRC_AT) != u32_at(rec, CRC_AT)? {
            // A record whose lines did not all reach the media was never committed.
            return Ok(None);
        }
        let stores = (0..count)
            .map(|i| {
                Ok((
                    u64_at(rec, HEADER + 16 * i)?,
                    u64_at(rec, HEADER + 16 * i + 8)?,
                ))
            })
            .collect::<Result<_, FormatError>>()?;
        Ok(Some(JournalRecord {
            txid: u64_at(rec, 8)?,
            stores,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_torn_record_is_not_committed() {
        let r = JournalRecord {
            txid: 7,
            stores: vec![(40, 1), (168, 2), (296, 3)],
        };
        let mut b = r.encode();
        b.resize(4096, 0);
        assert_eq!(JournalRecord::decode(&b).unwrap(), Some(r));
        b[64] ^= 4; // a line of the record that did not persist
        assert_eq!(JournalRecord::decode(&b).unwrap(), None);
        assert_eq!(JournalRecord::decode(&[0u8; 4096]).unwrap(), None);
    }
}
