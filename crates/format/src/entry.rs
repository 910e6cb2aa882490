//! Log entries: fixed multiples of 64 bytes, each with its kind, its length in lines
//! and a CRC-32C, so a torn or stale entry is recognised instead of trusted.
//!
//! Header (8 bytes): kind u8, lines u8, reserved u16, crc u32. Bodies follow.

use crate::codec::*;
use crate::inode::FileType;
use crate::{Gpa, LINE, MAX_WRITE_PAGES, NAME_MAX};

pub const ENTRY_HEADER: usize = 8;
/// The longest entry: a directory entry with a 255-byte name.
pub const MAX_ENTRY_LINES: usize = 5;
const DIR_NAME_AT: usize = 34;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Pad = 0xFF,
    Write = 1,
    SetAttr = 2,
    LinkChange = 3,
    DirAdd = 4,
    DirRemove = 5,
    Symlink = 6,
    DirCookie = 7,
    XattrSet = 8,
    XattrRemove = 9,
    Hole = 10,
}

/// Bits of [`SetAttrRec::mask`]: which fields the entry sets.
pub mod attr_mask {
    pub const MODE: u32 = 1;
    pub const UID: u32 = 2;
    pub const GID: u32 = 4;
    pub const SIZE: u32 = 8;
    pub const ATIME: u32 = 16;
    pub const MTIME: u32 = 32;
    pub const CTIME: u32 = 64;
    pub const RDEV: u32 = 128;
    pub const ALL: u32 = 255;
}

/// A copy-on-write data update: `npages` file pages from `pgoff` now live at the
/// contiguous pages starting at `gpa`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteRec {
    pub pgoff: u64,
    pub npages: u32,
    pub gpa: Gpa,
    /// The file size this write needs (the file grows to it; a write never shrinks one).
    pub size: u64,
    pub mtime: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SetAttrRec {
    pub mask: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub rdev: u32,
}

/// An extended attribute set (its value in the data page `gpa`, `len` bytes) or
/// removed (`gpa` and `len` zero). Values live in data pages, as symlink targets do,
/// so a log entry stays within five lines whatever the value's length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XattrRec {
    pub gpa: Gpa,
    pub len: u32,
    pub ctime: i64,
    /// The full name, namespace prefix included ("user.mime").
    pub name: Vec<u8>,
}

/// A name added to or removed from a directory. `cookie` is the entry's stable
/// readdir offset, given when the name was added.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntryRec {
    pub ino: u64,
    pub cookie: u64,
    /// The directory's new mtime and ctime.
    pub time: i64,
    pub ftype: FileType,
    pub name: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Fills the rest of a page when the next entry does not fit in it.
    Pad {
        lines: u8,
    },
    Write(WriteRec),
    SetAttr(SetAttrRec),
    LinkChange {
        nlink: u32,
        ctime: i64,
    },
    DirAdd(DirEntryRec),
    DirRemove(DirEntryRec),
    /// The target of a symlink lives in a data page (it can be 4095 bytes long).
    Symlink {
        gpa: Gpa,
        len: u32,
    },
    /// The next readdir cookie of a directory. Log GC writes it so that cookies of
    /// removed names are never given out again.
    DirCookie {
        next: u64,
    },
    XattrSet(XattrRec),
    XattrRemove(XattrRec),
    /// `npages` file pages from `pgoff` become a hole (fallocate's punch-hole): their
    /// data pages are released and the range reads as zeros. The size is unchanged.
    Hole {
        pgoff: u64,
        npages: u64,
        mtime: i64,
    },
}

/// Longest extended-attribute name, prefix included (as Linux's XATTR_NAME_MAX).
pub const XATTR_NAME_MAX: usize = 255;
/// Longest extended-attribute value: one data page.
pub const XATTR_VALUE_MAX: usize = crate::PAGE_SIZE as usize;
const XATTR_NAME_AT: usize = 32;

/// Checks an extended-attribute name: 1..=255 bytes, no NUL.
pub fn valid_xattr_name(name: &[u8]) -> bool {
    !name.is_empty() && name.len() <= XATTR_NAME_MAX && !name.contains(&0)
}

/// Checks a directory-entry name: 1..=255 bytes, no '/', no NUL, not "." or "..".
pub fn valid_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX
        && !name.contains(&b'/')
        && !name.contains(&0)
        && name != b"."
        && name != b".."
}

impl Entry {
    pub fn kind(&self) -> EntryKind {
        match self {
            Entry::Pad { .. } => EntryKind::Pad,
            Entry::Write(_) => EntryKind::Write,
            Entry::SetAttr(_) => EntryKind::SetAttr,
            Entry::LinkChange { .. } => EntryKind::LinkChange,
            Entry::DirAdd(_) => EntryKind::DirAdd,
            Entry::DirRemove(_) => EntryKind::DirRemove,
            Entry::Symlink { .. } => EntryKind::Symlink,
            Entry::DirCookie { .. } => EntryKind::DirCookie,
            Entry::XattrSet(_) => EntryKind::XattrSet,
            Entry::XattrRemove(_) => EntryKind::XattrRemove,
            Entry::Hole { .. } => EntryKind::Hole,
        }
    }

    /// Size of the encoded entry in 64-byte lines.
    pub fn lines(&self) -> usize {
        match self {
            Entry::Pad { lines } => *lines as usize,
            Entry::DirAdd(d) | Entry::DirRemove(d) => {
                (DIR_NAME_AT + d.name.len()).div_ceil(LINE as usize)
            }
            Entry::XattrSet(x) | Entry::XattrRemove(x) => {
                (XATTR_NAME_AT + x.name.len()).div_ceil(LINE as usize)
            }
            _ => 1,
        }
    }

    /// Encodes into `out` (cleared first). Names must already be valid.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let len = self.lines() * LINE as usize;
        out.clear();
        out.resize(len, 0);
        let b = &mut out[..];
        b[0] = self.kind() as u8;
        b[1] = self.lines() as u8;
        match self {
            Entry::Pad { .. } => {}
            Entry::Write(w) => {
                put_u64(b, 8, w.pgoff);
                put_u32(b, 16, w.npages);
                put_u64(b, 24, w.gpa.0);
                put_u64(b, 32, w.size);
                put_i64(b, 40, w.mtime);
            }
            Entry::SetAttr(a) => {
                put_u32(b, 8, a.mask);
                put_u32(b, 12, a.mode);
                put_u32(b, 16, a.uid);
                put_u32(b, 20, a.gid);
                put_u64(b, 24, a.size);
                put_i64(b, 32, a.atime);
                put_i64(b, 40, a.mtime);
                put_i64(b, 48, a.ctime);
                put_u32(b, 56, a.rdev);
            }
            Entry::LinkChange { nlink, ctime } => {
                put_u32(b, 8, *nlink);
                put_i64(b, 16, *ctime);
            }
            Entry::DirAdd(d) | Entry::DirRemove(d) => {
                put_u64(b, 8, d.ino);
                put_u64(b, 16, d.cookie);
                put_i64(b, 24, d.time);
                b[32] = d.ftype as u8;
                b[33] = d.name.len() as u8;
                b[DIR_NAME_AT..DIR_NAME_AT + d.name.len()].copy_from_slice(&d.name);
            }
            Entry::Symlink { gpa, len } => {
                put_u64(b, 8, gpa.0);
                put_u32(b, 16, *len);
            }
            Entry::DirCookie { next } => put_u64(b, 8, *next),
            Entry::XattrSet(x) | Entry::XattrRemove(x) => {
                put_u64(b, 8, x.gpa.0);
                put_u32(b, 16, x.len);
                b[20] = x.name.len() as u8;
                put_i64(b, 24, x.ctime);
                b[XATTR_NAME_AT..XATTR_NAME_AT + x.name.len()].copy_from_slice(&x.name);
            }
            Entry::Hole {
                pgoff,
                npages,
                mtime,
            } => {
                put_u64(b, 8, *pgoff);
                put_u64(b, 16, *npages);
                put_i64(b, 24, *mtime);
            }
        }
        let crc = crc_skipping(b, 4);
        put_u32(b, 4, crc);
    }

    /// Writes a valid checksum into the entry at the start of `b` (as long as its
    /// length byte says). For fuzzing and tests that want to reach past the CRC.
    pub fn seal(b: &mut [u8]) {
        let len = (b.get(1).copied().unwrap_or(0) as usize * LINE as usize).min(b.len());
        if len >= LINE as usize {
            let crc = crc_skipping(&b[..len], 4);
            put_u32(b, 4, crc);
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode_into(&mut v);
        v
    }

    /// Decodes the entry at the start of `b` (the rest of a log page). Returns the
    /// entry and its length in lines.
    pub fn decode(b: &[u8]) -> Result<(Entry, usize), FormatError> {
        if b.len() < LINE as usize {
            return Err(FormatError::Truncated("log entry"));
        }
        let lines = b[1] as usize;
        if lines == 0 || lines * LINE as usize > b.len() {
            return Err(FormatError::Invalid("log entry length"));
        }
        let b = &b[..lines * LINE as usize];
        if crc_skipping(b, 4) != u32_at(b, 4)? {
            return Err(FormatError::BadChecksum("log entry"));
        }
        let one_line = |e: Entry| {
            if lines == 1 {
                Ok((e, 1))
            } else {
                Err(FormatError::Invalid("log entry length"))
            }
        };
        match b[0] {
            0xFF => Ok((Entry::Pad { lines: lines as u8 }, lines)),
            1 => {
                let w = WriteRec {
                    pgoff: u64_at(b, 8)?,
                    npages: u32_at(b, 16)?,
                    gpa: Gpa(u64_at(b, 24)?),
                    size: u64_at(b, 32)?,
                    mtime: i64_at(b, 40)?,
                };
                if w.npages == 0
                    || w.npages > MAX_WRITE_PAGES
                    || w.pgoff
                        .checked_add(w.npages as u64)
                        .is_none_or(|e| e > (1 << 52))
                {
                    return Err(FormatError::Invalid("write entry extent"));
                }
                one_line(Entry::Write(w))
            }
            2 => one_line(Entry::SetAttr(SetAttrRec {
                mask: u32_at(b, 8)?,
                mode: u32_at(b, 12)?,
                uid: u32_at(b, 16)?,
                gid: u32_at(b, 20)?,
                size: u64_at(b, 24)?,
                atime: i64_at(b, 32)?,
                mtime: i64_at(b, 40)?,
                ctime: i64_at(b, 48)?,
                rdev: u32_at(b, 56)?,
            })),
            3 => one_line(Entry::LinkChange {
                nlink: u32_at(b, 8)?,
                ctime: i64_at(b, 16)?,
            }),
            k @ (4 | 5) => {
                let name_len = b[33] as usize;
                let name = b
                    .get(DIR_NAME_AT..DIR_NAME_AT + name_len)
                    .ok_or(FormatError::Invalid("directory entry name length"))?;
                if !valid_name(name) {
                    return Err(FormatError::Invalid("directory entry name"));
                }
                if (DIR_NAME_AT + name_len).div_ceil(LINE as usize) != lines {
                    return Err(FormatError::Invalid("log entry length"));
                }
                let d = DirEntryRec {
                    ino: u64_at(b, 8)?,
                    cookie: u64_at(b, 16)?,
                    time: i64_at(b, 24)?,
                    ftype: FileType::from_code(b[32])?,
                    name: name.to_vec(),
                };
                Ok((
                    if k == 4 {
                        Entry::DirAdd(d)
                    } else {
                        Entry::DirRemove(d)
                    },
                    lines,
                ))
            }
            6 => one_line(Entry::Symlink {
                gpa: Gpa(u64_at(b, 8)?),
                len: u32_at(b, 16)?,
            }),
            7 => one_line(Entry::DirCookie {
                next: u64_at(b, 8)?,
            }),
            k @ (8 | 9) => {
                let name_len = b[20] as usize;
                let name = b
                    .get(XATTR_NAME_AT..XATTR_NAME_AT + name_len)
                    .ok_or(FormatError::Invalid("xattr name length"))?;
                if !valid_xattr_name(name) {
                    return Err(FormatError::Invalid("xattr name"));
                }
                if (XATTR_NAME_AT + name_len).div_ceil(LINE as usize) != lines {
                    return Err(FormatError::Invalid("log entry length"));
                }
                let x = XattrRec {
                    gpa: Gpa(u64_at(b, 8)?),
                    len: u32_at(b, 16)?,
                    ctime: i64_at(b, 24)?,
                    name: name.to_vec(),
                };
                if x.len as usize > XATTR_VALUE_MAX {
                    return Err(FormatError::Invalid("xattr value length"));
                }
                Ok((
                    if k == 8 {
                        Entry::XattrSet(x)
                    } else {
                        Entry::XattrRemove(x)
                    },
                    lines,
                ))
            }
            10 => {
                let (pgoff, npages) = (u64_at(b, 8)?, u64_at(b, 16)?);
                if npages == 0 || pgoff.checked_add(npages).is_none_or(|e| e > (1 << 52)) {
                    return Err(FormatError::Invalid("hole entry extent"));
                }
                one_line(Entry::Hole {
                    pgoff,
                    npages,
                    mtime: i64_at(b, 24)?,
                })
            }
            k => Err(FormatError::BadCode {
                what: "log entry kind",
                code: k as u64,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_entry() -> impl Strategy<Value = Entry> {
        let name =
            proptest::collection::vec(1u8..=255, 1..=255).prop_filter("valid", |n| valid_name(n));
        prop_oneof![
            (
                0u64..1 << 40,
                1u32..1000,
                any::<u64>(),
                any::<u64>(),
                any::<i64>()
            )
                .prop_map(|(pgoff, npages, gpa, size, mtime)| Entry::Write(WriteRec {
                    pgoff,
                    npages,
                    gpa: Gpa(gpa),
                    size,
                    mtime
                })),
            (any::<u32>(), any::<u32>(), any::<u64>(), any::<i64>()).prop_map(
                |(mask, mode, size, t)| {
                    Entry::SetAttr(SetAttrRec {
                        mask,
                        mode,
                        uid: mode ^ 1,
                        gid: 3,
                        size,
                        atime: t,
                        mtime: t ^ 5,
                        ctime: -t,
                        rdev: 9,
                    })
                }
            ),
            (any::<u32>(), any::<i64>())
                .prop_map(|(nlink, ctime)| Entry::LinkChange { nlink, ctime }),
            (
                any::<u64>(),
                any::<u64>(),
                any::<i64>(),
                name,
                any::<bool>()
            )
                .prop_map(|(ino, cookie, time, name, add)| {
                    let d = DirEntryRec {
                        ino,
                        cookie,
                        time,
                        ftype: FileType::Directory,
                        name,
                    };
                    if add {
                        Entry::DirAdd(d)
                    } else {
                        Entry::DirRemove(d)
                    }
                }),
            (any::<u64>(), any::<u32>()).prop_map(|(g, len)| Entry::Symlink { gpa: Gpa(g), len }),
            any::<u64>().prop_map(|next| Entry::DirCookie { next }),
            (
                any::<u64>(),
                0u32..=4096,
                any::<i64>(),
                proptest::collection::vec(1u8..=255, 1..=255),
                any::<bool>()
            )
                .prop_map(|(g, len, ctime, name, set)| {
                    let x = XattrRec {
                        gpa: Gpa(g),
                        len,
                        ctime,
                        name,
                    };
                    if set {
                        Entry::XattrSet(x)
                    } else {
                        Entry::XattrRemove(x)
                    }
                }),
            (0u64..1 << 40, 1u64..1 << 40, any::<i64>()).prop_map(|(pgoff, npages, mtime)| {
                Entry::Hole {
                    pgoff,
                    npages,
                    mtime,
                }
            }),
        ]
    }

    proptest! {
        #[test]
        fn entries_round_trip(e in arb_entry()) {
            let b = e.encode();
            prop_assert_eq!(b.len() % 64, 0);
            prop_assert!(b.len() <= MAX_ENTRY_LINES * 64);
            let (d, lines) = Entry::decode(&b).unwrap();
            prop_assert_eq!(d, e);
            prop_assert_eq!(lines * 64, b.len());
        }

        #[test]
        fn any_single_bit_flip_is_caught(e in arb_entry(), bit in 0usize..64 * 8) {
            let mut b = e.encode();
            let bit = bit % (b.len() * 8);
            b[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Entry::decode(&b).is_err());
        }

        #[test]
        fn decoder_never_panics(b in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = Entry::decode(&b);
        }
    }
}
