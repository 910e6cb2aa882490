//! Little-endian field access over untrusted byte slices.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("bad magic in {0}")]
    BadMagic(&'static str),
    #[error("unsupported format version {found} (this build reads version {expected})")]
    BadVersion { found: u32, expected: u32 },
    #[error("checksum mismatch in {0}")]
    BadChecksum(&'static str),
    #[error("{0} is truncated")]
    Truncated(&'static str),
    #[error("unknown {what} code {code}")]
    BadCode { what: &'static str, code: u64 },
    #[error("invalid {0}")]
    Invalid(&'static str),
}

pub(crate) fn u16_at(b: &[u8], at: usize) -> Result<u16, FormatError> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or(FormatError::Truncated("field"))
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> Result<u32, FormatError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes(s.try_into().unwrap_or([0; 4])))
        .ok_or(FormatError::Truncated("field"))
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> Result<u64, FormatError> {
    b.get(at..at + 8)
        .map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
        .ok_or(FormatError::Truncated("field"))
}

pub(crate) fn i64_at(b: &[u8], at: usize) -> Result<i64, FormatError> {
    u64_at(b, at).map(|v| v as i64)
}

pub(crate) fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_i64(b: &mut [u8], at: usize, v: i64) {
    put_u64(b, at, v as u64)
}

/// CRC-32C of `b` with the 4 bytes at `crc_at` taken as zero.
pub(crate) fn crc_skipping(b: &[u8], crc_at: usize) -> u32 {
    let c = crate::crc32c(&b[..crc_at]);
    let c = crate::crc32c_append(c, &[0; 4]);
    crate::crc32c_append(c, &b[crc_at + 4..])
}
