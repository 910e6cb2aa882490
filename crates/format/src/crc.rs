//! CRC-32C (Castagnoli), the checksum of every record on the media and of the
//! mirror's ring: the CPU's `crc32` instruction where it has one (SSE4.2), else the
//! `crc32c` crate's tables.
//!
//! Whether the CPU has it is asked once per process, with one `cpuid` leaf. The
//! standard library's feature detection (which the `crc32c` crate uses) asks every
//! leaf it knows at once, and under a hypervisor each `cpuid` traps to it (7 µs on
//! the development VM): every short process of the preload library paid over
//! 100 µs for it at its first checksum. The records checksummed are short
//! (superblocks, inode slots, journal records, ring entries), where a plain loop of
//! the instruction is as fast as the crate's interleaved one.

#[cfg(target_arch = "x86_64")]
use std::sync::atomic::{AtomicU8, Ordering};

/// The CRC-32C of `b`.
pub fn crc32c(b: &[u8]) -> u32 {
    crc32c_append(0, b)
}

/// The CRC-32C of the bytes whose CRC is `crc` followed by `b`.
pub fn crc32c_append(crc: u32, b: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if has_crc32_instruction() {
        return x86::append(crc, b);
    }
    crc32c::crc32c_append(crc, b)
}

#[cfg(target_arch = "x86_64")]
fn has_crc32_instruction() -> bool {
    /// 0: not asked yet; 1: no; 2: yes.
    static SSE42: AtomicU8 = AtomicU8::new(0);
    match SSE42.load(Ordering::Relaxed) {
        0 => {
            // Leaf 1 is defined on every x86-64 CPU; ECX bit 20 is SSE4.2.
            let yes = core::arch::x86_64::__cpuid(1).ecx & (1 << 20) != 0;
            SSE42.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
        v => v == 2,
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};

    /// [`super::crc32c_append`] with the instruction; only called once `cpuid`
    /// said the CPU has it.
    pub(super) fn append(crc: u32, b: &[u8]) -> u32 {
        // SAFETY: the caller checked SSE4.2 (has_crc32_instruction), the one
        // feature `update` is compiled for; it reads only within `b`.
        unsafe { !update(!crc, b) }
    }

    #[target_feature(enable = "sse4.2")]
    fn update(mut c: u32, b: &[u8]) -> u32 {
        let mut words = b.chunks_exact(8);
        let mut c64 = c as u64;
        for w in &mut words {
            let w = u64::from_le_bytes(w.try_into().expect("chunks of 8"));
            c64 = _mm_crc32_u64(c64, w);
        }
        c = c64 as u32;
        for &byte in words.remainder() {
            c = _mm_crc32_u8(c, byte);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The instruction's loop agrees with the crate's tables at every length and
    /// alignment, appended in pieces or whole.
    #[test]
    fn agrees_with_the_crc32c_crate() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let bytes: Vec<u8> = (0..5000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for start in 0..9 {
            for len in (0..300).chain([1000, 4096, 4991 - start]) {
                let b = &bytes[start..start + len];
                assert_eq!(crc32c(b), crc32c::crc32c(b), "start {start} len {len}");
                let cut = len / 3;
                let pieces = crc32c_append(crc32c(&b[..cut]), &b[cut..]);
                assert_eq!(
                    pieces,
                    crc32c::crc32c(b),
                    "start {start} len {len} cut {cut}"
                );
            }
        }
        // The check value of the standard (RFC 3720, appendix B.4).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }
}
