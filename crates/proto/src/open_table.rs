//! The layout of an open table (design note 58): a region the MDS keeps for each
//! client instance and the client writes one-sided, naming the inodes it holds open.
//!
//! An inode's word lives in one bucket, chosen by [`bucket`], at any of its
//! [`WAYS`] slots; 0 is a free slot. The client is the only writer; the MDS reads a
//! bucket when an unlinked inode may be destroyed. The pairing that makes that safe
//! (a client writes the word, then reads the inode; the MDS writes the link count 0,
//! then reads the words) is explained where the MDS reads them.

/// Buckets of a table.
pub const BUCKETS: u64 = 1024;
/// Slots of a bucket: one 64-byte cache line.
pub const WAYS: usize = 8;
/// Bytes of a table.
pub const BYTES: u64 = BUCKETS * WAYS as u64 * 8;

/// The bucket of `ino` (Fibonacci hashing: inode numbers come in runs).
pub fn bucket(ino: u64) -> u64 {
    let b = ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - BUCKETS.trailing_zeros());
    debug_assert!(b < BUCKETS, "bucket {b} of inode {ino} past the table");
    b
}

/// Where slot `way` of bucket `b` is.
pub fn offset(b: u64, way: usize) -> u64 {
    // A way past its bucket would land in the next one, where the MDS never looks.
    debug_assert!(b < BUCKETS && way < WAYS, "slot {way} of bucket {b}");
    (b * WAYS as u64 + way as u64) * 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_the_table_and_runs_of_inodes_spread() {
        assert!(BUCKETS.is_power_of_two());
        let mut seen = vec![0u32; BUCKETS as usize];
        for ino in 1..=BUCKETS * 4 {
            let b = bucket(ino);
            assert!(b < BUCKETS);
            assert!(offset(b, WAYS - 1) + 8 <= BYTES);
            seen[b as usize] += 1;
        }
        // A run of four times the buckets fills none past its ways.
        assert!(
            seen.iter().all(|&n| n as usize <= WAYS),
            "{:?}",
            seen.iter().max()
        );
    }
}
