//! The redo journal for operations that change several inode logs at once
//! (paper §4.2: lightweight journals for multi-inode RPCs). Entries are appended to
//! every log past its tail first; then one journal record lists the new tails. The
//! record becoming valid on the media is the commit point; the tails are stored,
//! and the record is cleared. Recovery re-applies a valid record (idempotent).

use orion_format::{JournalRecord, Superblock, INODE_SLOT_SIZE, SLOT_TAIL_OFFSET};
use orion_pmem::Pool;

use crate::error::{FsError, FsResult};

/// Commits `stores` (tail-word offset, packed tail) atomically.
pub fn commit(pool: &Pool, sb: &Superblock, txid: u64, stores: Vec<(u64, u64)>) -> FsResult<()> {
    let rec = JournalRecord { txid, stores };
    if rec.stores.len() > JournalRecord::capacity(sb.journal_size) {
        return Err(FsError::Io("journal record too large".into()));
    }
    let bytes = rec.encode();
    pool.write(sb.journal_off, &bytes)?;
    pool.persist(sb.journal_off, bytes.len())?;
    apply(pool, &rec)?;
    clear(pool, sb)
}

fn apply(pool: &Pool, rec: &JournalRecord) -> FsResult<()> {
    for &(off, val) in &rec.stores {
        pool.store_u64(off, val)?;
    }
    for &(off, _) in &rec.stores {
        pool.persist(off, 8)?;
    }
    Ok(())
}

fn clear(pool: &Pool, sb: &Superblock) -> FsResult<()> {
    pool.store_u64(sb.journal_off, 0)?;
    pool.persist(sb.journal_off, 8)?;
    Ok(())
}

/// Reads the journal: a committed record not yet cleared, if any. Its stores must
/// all target tail words of inode slots.
pub fn pending(pool: &Pool, sb: &Superblock) -> FsResult<Option<JournalRecord>> {
    let b = pool.read_vec(sb.journal_off, sb.journal_size as usize)?;
    let Some(rec) = JournalRecord::decode(&b)? else {
        return Ok(None);
    };
    let table = sb.inode_table_off..sb.inode_table_off + sb.inode_count * INODE_SLOT_SIZE as u64;
    for &(off, _) in &rec.stores {
        if !table.contains(&off)
            || (off - sb.inode_table_off) % INODE_SLOT_SIZE as u64 != SLOT_TAIL_OFFSET
        {
            return Err(FsError::Corrupt(format!(
                "journal record {} stores to offset {off}, which is not an inode tail",
                rec.txid
            )));
        }
    }
    Ok(Some(rec))
}

/// Recovery: redo a committed record, then clear it. Returns whether one was replayed.
pub fn replay(pool: &Pool, sb: &Superblock) -> FsResult<bool> {
    match pending(pool, sb)? {
        Some(rec) => {
            apply(pool, &rec)?;
            clear(pool, sb)?;
            Ok(true)
        }
        None => Ok(false),
    }
}
