//! The superblock: page 0 of every pool. It names the pool, its cluster and its geometry.

use crate::codec::*;
use crate::{FIRST_SEGMENT_SIZE, INODE_SLOT_SIZE, PAGE_SIZE};

pub const SUPERBLOCK_SIZE: usize = 256;
const MAGIC: &[u8; 8] = b"ORIONFS\x01";
/// Version 3: every inode has a fixed 256-byte first log segment, its size recorded
/// at byte 128 (version 1 gave each a 4 KiB log page, so a pool held one inode per
/// 8 KiB; version 2 did not record the size).
pub const FORMAT_VERSION: u32 = 3;
/// Bytes of MDS pool per inode slot: 384 fixed (slot and first segment), the rest
/// log pages (names in directories, entries past the first segment).
pub const POOL_BYTES_PER_INODE: u64 = 1024;
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
    /// First byte of the first log segments: inode `i`'s at `+ i * FIRST_SEGMENT_SIZE`
    /// (0 in a data pool).
    pub segment_area_off: u64,
    /// First byte of the page area and its number of 4 KiB pages.
    pub page_area_off: u64,
    pub page_count: u64,
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl Superblock {
    /// Geometry of a new MDS pool: a one-page journal, one inode slot and one first
    /// log segment per [`POOL_BYTES_PER_INODE`] of pool, the rest log pages.
    pub fn new_metadata(
        pool_size: u64,
        pool_uuid: [u8; 16],
        cluster_uuid: [u8; 16],
        created_ns: i64,
    ) -> Result<Superblock, FormatError> {
        let journal_off = PAGE_SIZE;
        let journal_size = PAGE_SIZE;
        let inode_table_off = journal_off + journal_size;
        let inode_count = (pool_size / POOL_BYTES_PER_INODE).max(16);
        let segment_area_off = align_up(
            inode_table_off + inode_count * INODE_SLOT_SIZE as u64,
            FIRST_SEGMENT_SIZE,
        );
        let page_area_off = align_up(
            segment_area_off + inode_count * FIRST_SEGMENT_SIZE,
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
            segment_area_off,
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
            segment_area_off: 0,
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

    /// Pool offset of inode `ino`'s first log segment: where the log a new inode
    /// starts with lives (a log GC writes starts on a page).
    pub fn first_segment_off(&self, ino: u64) -> u64 {
        self.segment_area_off + ino * FIRST_SEGMENT_SIZE
    }

    fn segment_area_end(&self) -> u64 {
        self.segment_area_off + self.inode_count * FIRST_SEGMENT_SIZE
    }

    /// The length of the log segment starting at `off` in `ino`'s log, if one may
    /// start there: `ino`'s own first segment, or a page of the page area.
    pub fn log_segment_len(&self, ino: u64, off: u64) -> Option<u64> {
        if self.kind != PoolKind::Metadata {
            return None;
        }
        if ino < self.inode_count && off == self.first_segment_off(ino) {
            return Some(FIRST_SEGMENT_SIZE);
        }
        let i = self.page_index(off)?;
        (self.page_off(i) == off).then_some(PAGE_SIZE)
    }

    /// The start of the log segment that log position `pos` is in: a position is
    /// past an entry or a segment's header, so one at a segment's very end is that
    /// segment's (its log goes on in the segment the header links).
    pub fn log_segment_holding(&self, pos: u64) -> Option<u64> {
        let within = |start: u64, end: u64, unit: u64| {
            (pos > start && pos <= end).then(|| start + (pos - start - 1) / unit * unit)
        };
        if self.kind != PoolKind::Metadata {
            return None;
        }
        within(
            self.segment_area_off,
            self.segment_area_end(),
            FIRST_SEGMENT_SIZE,
        )
        .or_else(|| {
            within(
                self.page_area_off,
                self.page_off(self.page_count),
                PAGE_SIZE,
            )
        })
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
            let segments_end = self
                .inode_count
                .checked_mul(FIRST_SEGMENT_SIZE)
                .and_then(|b| b.checked_add(self.segment_area_off))
                .ok_or(FormatError::Invalid("geometry: first segments overflow"))?;
            if self.journal_off < ps
                || self.journal_size < ps
                || self.journal_size > MAX_JOURNAL
                || journal_end > self.inode_table_off
                || table_end > self.segment_area_off
                || !self.segment_area_off.is_multiple_of(FIRST_SEGMENT_SIZE)
                || segments_end > self.page_area_off
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
        put_u64(&mut b, 120, self.segment_area_off);
        put_u32(&mut b, 128, FIRST_SEGMENT_SIZE as u32);
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
        if u16_at(b, 58)? != 4096
            || u32_at(b, 60)? != INODE_SLOT_SIZE as u32
            || u32_at(b, 128)? != FIRST_SEGMENT_SIZE as u32
        {
            return Err(FormatError::Invalid(
                "geometry: page, inode slot or first log segment size",
            ));
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
            segment_area_off: u64_at(b, 120)?,
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

    #[test]
    fn a_position_names_its_segment_and_a_pointer_its_length() {
        let sb = Superblock::new_metadata(1 << 30, [1; 16], [2; 16], 5).unwrap();
        assert!(
            sb.inode_count >= 1 << 20,
            "a 1 GiB pool holds a million inodes"
        );
        let seg = sb.first_segment_off(7);
        assert_eq!(sb.log_segment_len(7, seg), Some(FIRST_SEGMENT_SIZE));
        // Another inode's first segment is no segment of this log.
        assert_eq!(sb.log_segment_len(8, seg), None);
        assert_eq!(sb.log_segment_len(7, seg + 64), None);
        let page = sb.page_off(3);
        assert_eq!(sb.log_segment_len(7, page), Some(PAGE_SIZE));
        assert_eq!(sb.log_segment_len(7, page + 256), None);
        // Past the header, up to and including the end: the segment's own positions.
        assert_eq!(sb.log_segment_holding(seg + 64), Some(seg));
        assert_eq!(sb.log_segment_holding(seg + FIRST_SEGMENT_SIZE), Some(seg));
        assert_eq!(sb.log_segment_holding(page + PAGE_SIZE), Some(page));
        assert_eq!(sb.log_segment_holding(page + 4032), Some(page));
        // The last first segment ends where the page area may begin.
        let last = sb.first_segment_off(sb.inode_count - 1);
        assert_eq!(
            sb.log_segment_holding(last + FIRST_SEGMENT_SIZE),
            Some(last)
        );
        assert_eq!(sb.log_segment_holding(sb.inode_table_off), None);
        assert_eq!(sb.log_segment_holding(sb.pool_size + 64), None);
    }
}
