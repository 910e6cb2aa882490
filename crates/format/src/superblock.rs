//! The superblock: page 0 of every pool. It names the pool, its cluster and its geometry.

use crate::codec::*;
use crate::{INODE_SLOT_SIZE, PAGE_SIZE};

pub const SUPERBLOCK_SIZE: usize = 256;
const MAGIC: &[u8; 8] = b"ORIONFS\x01";
pub const FORMAT_VERSION: u32 = 1;
const CRC_AT: usize = SUPERBLOCK_SIZE - 4;
/// Largest journal a superblock may declare (one record of 8-byte stores).
const MAX_JOURNAL: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// The MDS pool: journal, inode table, inode logs.
    Metadata = 1,
    /// A data store's pool: 4 KiB data pages.
    Data = 2,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub kind: PoolKind,
    pub pool_size: u64,
    pub pool_uuid: [u8; 16],
    pub cluster_uuid: [u8; 16],
    /// The replication group of a data pool (0 for the MDS pool).
    pub group: u16,
    pub created_ns: i64,
    pub journal_off: u64,
    pub journal_size: u64,
    pub inode_table_off: u64,
    pub inode_count: u64,
    /// First byte of the page area and its number of 4 KiB pages.
    pub page_area_off: u64,
    pub page_count: u64,
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl Superblock {
    /// Geometry of a new MDS pool: one inode slot per 8 KiB of pool (every inode needs
    /// at least one 4 KiB log page), a one-page journal, the rest log pages.
    pub fn new_metadata(
        pool_size: u64,
        pool_uuid: [u8; 16],
        cluster_uuid: [u8; 16],
        created_ns: i64,
    ) -> Result<Superblock, FormatError> {
        let journal_off = PAGE_SIZE;
        let journal_size = PAGE_SIZE;
        let inode_table_off = journal_off + journal_size;
        let inode_count = (pool_size / 8192).max(16);
        let page_area_off = align_up(
            inode_table_off + inode_count * INODE_SLOT_SIZE as u64,
            PAGE_SIZE,
        );
        if page_area_off + 16 * PAGE_SIZE > pool_size {
            return Err(FormatError::Invalid(
                "pool size: too small for a metadata pool (min 256 KiB)",
            ));
        }
        let sb = Superblock {
            kind: PoolKind::Metadata,
            pool_size,
            pool_uuid,
            cluster_uuid,
            group: 0,
            created_ns,
            journal_off,
            journal_size,
            inode_table_off,
            inode_count,
            page_area_off,
            page_count: (pool_size - page_area_off) / PAGE_SIZE,
        };
        sb.check_geometry()?;
        Ok(sb)
    }

    /// Geometry of a new data pool: superblock page, then data pages.
    pub fn new_data(
        pool_size: u64,
        pool_uuid: [u8; 16],
        cluster_uuid: [u8; 16],
        group: u16,
        created_ns: i64,
    ) -> Result<Superblock, FormatError> {
        if pool_size < 16 * PAGE_SIZE {
            return Err(FormatError::Invalid(
                "pool size: too small for a data pool (min 64 KiB)",
            ));
        }
        let sb = Superblock {
            kind: PoolKind::Data,
            pool_size,
            pool_uuid,
            cluster_uuid,
            group,
            created_ns,
            journal_off: 0,
            journal_size: 0,
            inode_table_off: 0,
            inode_count: 0,
            page_area_off: PAGE_SIZE,
            page_count: pool_size / PAGE_SIZE - 1,
        };
        sb.check_geometry()?;
        Ok(sb)
    }

    /// Offset of page `index` of the page area.
    pub fn page_off(&self, index: u64) -> u64 {
        self.page_area_off + index * PAGE_SIZE
    }

    /// The page index holding pool offset `off`, if it is inside the page area.
    pub fn page_index(&self, off: u64) -> Option<u64> {
        if off < self.page_area_off {
            return None;
        }
        let i = (off - self.page_area_off) / PAGE_SIZE;
        (i < self.page_count).then_some(i)
    }

    pub fn slot_off(&self, ino: u64) -> u64 {
        self.inode_table_off + ino * INODE_SLOT_SIZE as u64
    }

    fn check_geometry(&self) -> Result<(), FormatError> {
        let ps = PAGE_SIZE;
        let page_end = self
            .page_count
            .checked_mul(ps)
            .and_then(|b| b.checked_add(self.page_area_off))
            .ok_or(FormatError::Invalid("geometry: page area overflows"))?;
        if page_end > self.pool_size
            || !self.page_area_off.is_multiple_of(ps)
            || self.page_area_off < ps
        {
            return Err(FormatError::Invalid("geometry: page area outside the pool"));
        }
        if self.kind == PoolKind::Metadata {
            let table_end = self
                .inode_count
                .checked_mul(INODE_SLOT_SIZE as u64)
                .and_then(|b| b.checked_add(self.inode_table_off))
                .ok_or(FormatError::Invalid("geometry: inode table overflows"))?;
            let journal_end = self
                .journal_off
                .checked_add(self.journal_size)
                .ok_or(FormatError::Invalid("geometry: journal overflows"))?;
            if self.journal_off < ps
                || self.journal_size < ps
                || self.journal_size > MAX_JOURNAL
                || journal_end > self.inode_table_off
                || table_end > self.page_area_off
                || self.inode_count < 2
            {
                return Err(FormatError::Invalid(
                    "geometry: journal or inode table misplaced",
                ));
            }
        }
        Ok(())
    }

    pub fn encode(&self) -> [u8; SUPERBLOCK_SIZE] {
        let mut b = [0u8; SUPERBLOCK_SIZE];
        b[0..8].copy_from_slice(MAGIC);
        put_u32(&mut b, 8, FORMAT_VERSION);
        put_u32(&mut b, 12, self.kind as u32);
        put_u64(&mut b, 16, self.pool_size);
        b[24..40].copy_from_slice(&self.pool_uuid);
        b[40..56].copy_from_slice(&self.cluster_uuid);
        put_u16(&mut b, 56, self.group);
        put_u16(&mut b, 58, PAGE_SIZE as u16);
        put_u32(&mut b, 60, INODE_SLOT_SIZE as u32);
        put_i64(&mut b, 64, self.created_ns);
        put_u64(&mut b, 72, self.journal_off);
        put_u64(&mut b, 80, self.journal_size);
        put_u64(&mut b, 88, self.inode_table_off);
        put_u64(&mut b, 96, self.inode_count);
        put_u64(&mut b, 104, self.page_area_off);
        put_u64(&mut b, 112, self.page_count);
        let crc = crc_skipping(&b, CRC_AT);
        put_u32(&mut b, CRC_AT, crc);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Superblock, FormatError> {
        let b = b
            .get(..SUPERBLOCK_SIZE)
            .ok_or(FormatError::Truncated("superblock"))?;
        if &b[0..8] != MAGIC {
            return Err(FormatError::BadMagic("superblock (not an OrionFS pool)"));
        }
        let version = u32_at(b, 8)?;
        if version != FORMAT_VERSION {
            return Err(FormatError::BadVersion {
                found: version,
                expected: FORMAT_VERSION,
            });
        }
        if crc_skipping(b, CRC_AT) != u32_at(b, CRC_AT)? {
            return Err(FormatError::BadChecksum("superblock"));
        }
        let kind = match u32_at(b, 12)? {
            1 => PoolKind::Metadata,
            2 => PoolKind::Data,
            k => {
                return Err(FormatError::BadCode {
                    what: "pool kind",
                    code: k as u64,
                })
            }
        };
        if u16_at(b, 58)? != 4096 || u32_at(b, 60)? != INODE_SLOT_SIZE as u32 {
            return Err(FormatError::Invalid("geometry: page or inode slot size"));
        }
        let mut pool_uuid = [0u8; 16];
        pool_uuid.copy_from_slice(&b[24..40]);
        let mut cluster_uuid = [0u8; 16];
        cluster_uuid.copy_from_slice(&b[40..56]);
        let sb = Superblock {
            kind,
            pool_size: u64_at(b, 16)?,
            pool_uuid,
            cluster_uuid,
            group: u16_at(b, 56)?,
            created_ns: i64_at(b, 64)?,
            journal_off: u64_at(b, 72)?,
            journal_size: u64_at(b, 80)?,
            inode_table_off: u64_at(b, 88)?,
            inode_count: u64_at(b, 96)?,
            page_area_off: u64_at(b, 104)?,
            page_count: u64_at(b, 112)?,
        };
        sb.check_geometry()?;
        Ok(sb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_geometry_is_refused_not_trusted() {
        let mut sb = Superblock::new_metadata(64 << 20, [1; 16], [2; 16], 5).unwrap();
        sb.journal_size = u64::MAX;
        assert!(Superblock::decode(&sb.encode()).is_err());
        let mut sb = Superblock::new_metadata(64 << 20, [1; 16], [2; 16], 5).unwrap();
        sb.inode_count = u64::MAX / 64;
        assert!(Superblock::decode(&sb.encode()).is_err());
    }

    #[test]
    fn round_trip_and_corruption() {
        let sb = Superblock::new_metadata(64 << 20, [1; 16], [2; 16], 5).unwrap();
        let mut b = sb.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        b[100] ^= 1;
        assert_eq!(
            Superblock::decode(&b),
            Err(FormatError::BadChecksum("superblock"))
        );
        assert!(Superblock::decode(&[0u8; 10]).is_err());
        let d = Superblock::new_data(1 << 20, [3; 16], [2; 16], 0, 5).unwrap();
        assert_eq!(Superblock::decode(&d.encode()).unwrap(), d);
        assert!(Superblock::new_metadata(8192, [0; 16], [0; 16], 0).is_err());
    }
}
