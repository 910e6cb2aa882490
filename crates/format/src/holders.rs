//! The holders record: which client instances had an open table at the MDS
//! (design note 62). It lives in the MDS pool's page 0, past the superblock, so that
//! the next MDS to serve the pool (a restart, or the mirror taking over, whose copy
//! of the pool has it too) knows whose open tables to wait for before it destroys an
//! unlinked file.
//!
//! Two copies, written in turn, each with a sequence number and a checksum: a crash
//! that tears the write of one leaves the other, one change older. That older set
//! lacks at most the instance whose hello was being recorded, and that instance was
//! never answered, so it holds nothing at this MDS. A record that cannot be read
//! (both copies damaged, or more holders than fit) is [`Holders::Unknown`]: the next
//! MDS then waits its whole reclaim time.
//!
//! A copy: magic `u32`, flags `u32` (bit 0: more holders than fit), sequence `u64`,
//! count `u32`, CRC-32C `u32` of the copy with this field zero, then `count`
//! instance numbers (`u64`), zeros to the end of the copy.

use crate::codec::*;

/// Where the record starts in the MDS pool (page 0; the superblock takes 256 bytes).
pub const HOLDERS_OFFSET: u64 = 1024;
/// Bytes of one copy; the two copies end at the end of page 0.
pub const HOLDERS_COPY: usize = 1536;
/// Bytes of a copy's header.
const HEADER: usize = 24;
/// The most instances a record names; more are recorded as [`Holders::Unknown`].
pub const MAX_HOLDERS: usize = (HOLDERS_COPY - HEADER) / 8;
const MAGIC: u32 = u32::from_le_bytes(*b"OHLD");
const CRC_AT: usize = 20;
const TOO_MANY: u32 = 1;

// The record lies in page 0 past the superblock, and holds a useful number.
const _: () = assert!(HOLDERS_OFFSET >= crate::SUPERBLOCK_SIZE as u64);
const _: () = assert!(HOLDERS_OFFSET as usize + 2 * HOLDERS_COPY == crate::PAGE_SIZE as usize);
const _: () = assert!(MAX_HOLDERS >= 128);

/// What a record says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holders {
    /// These instances had open tables (sorted, no repeats).
    Known(Vec<u64>),
    /// The set is not known: more than [`MAX_HOLDERS`], or no copy reads.
    Unknown,
}

/// A record as read: what it says, and where and under which number the next
/// write goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldersRecord {
    pub holders: Holders,
    /// The copy the next write goes to (the older one).
    pub next_copy: usize,
    /// The sequence number of the next write.
    pub next_seq: u64,
}

/// Encodes one copy under sequence number `seq`.
pub fn encode_holders(seq: u64, holders: &Holders) -> Vec<u8> {
    let mut b = vec![0u8; HOLDERS_COPY];
    put_u32(&mut b, 0, MAGIC);
    put_u64(&mut b, 8, seq);
    match holders {
        Holders::Known(v) if v.len() <= MAX_HOLDERS => {
            put_u32(&mut b, 16, v.len() as u32);
            for (i, ino) in v.iter().enumerate() {
                put_u64(&mut b, HEADER + 8 * i, *ino);
            }
        }
        _ => put_u32(&mut b, 4, TOO_MANY),
    }
    let crc = crc_skipping(&b, CRC_AT);
    put_u32(&mut b, CRC_AT, crc);
    b
}

/// One copy's sequence number and holders, or None if it does not read.
fn decode_copy(b: &[u8]) -> Option<(u64, Holders)> {
    if b.len() != HOLDERS_COPY || u32_at(b, 0).ok()? != MAGIC {
        return None;
    }
    if u32_at(b, CRC_AT).ok()? != crc_skipping(b, CRC_AT) {
        return None;
    }
    let seq = u64_at(b, 8).ok()?;
    if u32_at(b, 4).ok()? & TOO_MANY != 0 {
        return Some((seq, Holders::Unknown));
    }
    let count = u32_at(b, 16).ok()? as usize;
    if count > MAX_HOLDERS {
        return None;
    }
    let mut v: Vec<u64> = (0..count)
        .map(|i| u64_at(b, HEADER + 8 * i))
        .collect::<Result<_, _>>()
        .ok()?;
    v.sort_unstable();
    v.dedup();
    Some((seq, Holders::Known(v)))
}

/// Reads the record from the `2 * HOLDERS_COPY` bytes at [`HOLDERS_OFFSET`]. Both
/// copies zero (a new pool, or one made before the record existed): nobody held
/// anything. Never panics, whatever the bytes.
pub fn decode_holders(b: &[u8]) -> HoldersRecord {
    let copies = [0, 1].map(|i| b.get(i * HOLDERS_COPY..(i + 1) * HOLDERS_COPY));
    let read = copies.map(|c| c.and_then(decode_copy));
    let newest = match (&read[0], &read[1]) {
        (Some((s0, _)), Some((s1, _))) => Some(if s1 > s0 { 1 } else { 0 }),
        (Some(_), None) => Some(0),
        (None, Some(_)) => Some(1),
        (None, None) => None,
    };
    match newest {
        Some(i) => {
            let (seq, holders) = read[i].clone().expect("that copy reads");
            HoldersRecord {
                holders,
                next_copy: 1 - i,
                next_seq: seq.wrapping_add(1),
            }
        }
        None => {
            let blank = copies
                .iter()
                .all(|c| c.is_some_and(|c| c.iter().all(|&x| x == 0)));
            HoldersRecord {
                holders: if blank {
                    Holders::Known(Vec::new())
                } else {
                    Holders::Unknown
                },
                next_copy: 0,
                next_seq: 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(copies: [&[u8]; 2]) -> Vec<u8> {
        copies.concat()
    }

    #[test]
    fn the_newer_copy_wins_and_a_torn_one_leaves_the_older() {
        let a = encode_holders(7, &Holders::Known(vec![3, 1, 2]));
        let b = encode_holders(8, &Holders::Known(vec![1, 2]));
        let r = decode_holders(&record([&a, &b]));
        assert_eq!(r.holders, Holders::Known(vec![1, 2]));
        assert_eq!((r.next_copy, r.next_seq), (0, 9));
        // The write of copy 1 was torn: copy 0 stands, and copy 1 is written next.
        let mut torn = b.clone();
        torn[HEADER + 3] ^= 0x40;
        let r = decode_holders(&record([&a, &torn]));
        assert_eq!(r.holders, Holders::Known(vec![1, 2, 3]));
        assert_eq!((r.next_copy, r.next_seq), (1, 8));
    }

    #[test]
    fn blank_is_nobody_damage_and_overflow_are_unknown() {
        let zero = vec![0u8; 2 * HOLDERS_COPY];
        assert_eq!(decode_holders(&zero).holders, Holders::Known(vec![]));
        let mut junk = zero.clone();
        junk[5] = 1;
        assert_eq!(decode_holders(&junk).holders, Holders::Unknown);
        let many: Vec<u64> = (1..=MAX_HOLDERS as u64 + 1).collect();
        let over = encode_holders(1, &Holders::Known(many));
        let r = decode_holders(&record([&over, &zero[..HOLDERS_COPY]]));
        assert_eq!(r.holders, Holders::Unknown);
        let full: Vec<u64> = (1..=MAX_HOLDERS as u64).collect();
        let fits = encode_holders(1, &Holders::Known(full.clone()));
        assert_eq!(
            decode_holders(&record([&zero[..HOLDERS_COPY], &fits])).holders,
            Holders::Known(full)
        );
        // Short input reads as damage, not a panic.
        assert_eq!(decode_holders(&[1, 2, 3]).holders, Holders::Unknown);
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_without_panic(b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3200)) {
            let _ = decode_holders(&b);
        }

        #[test]
        fn what_is_written_reads_back(v in proptest::collection::btree_set(1u64.., 0..=MAX_HOLDERS), seq in 1u64..) {
            let v: Vec<u64> = v.into_iter().collect();
            let old = encode_holders(seq - 1, &Holders::Unknown);
            let new = encode_holders(seq, &Holders::Known(v.clone()));
            let r = decode_holders(&record([&old, &new]));
            proptest::prop_assert_eq!(r.holders, Holders::Known(v));
            proptest::prop_assert_eq!(r.next_copy, 0);
        }
    }
}
