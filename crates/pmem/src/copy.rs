//! Byte copies between mapped pages and ordinary buffers, around a `rep movsb` trap.
//!
//! glibc's memcpy uses `rep movsb` for copies from a few KiB up to its non-temporal
//! threshold. On the AMD EPYC CPUs of our test machines that instruction runs at
//! about 3 GB/s instead of 35-50 GB/s when the destination sits 1 to 63 bytes past
//! the source modulo 4096 (measured: 64 KiB copies at each skew from a /dev/shm
//! mapping; skews of 1 to 31 were slow, and this module cuts at 1 to 63 for
//! margin). That skew is common: a page of a pool or a registered buffer is
//! page-aligned, glibc's malloc returns its mmap'd blocks (128 KiB and more) 16
//! bytes into a page, and smaller blocks at any 16-byte offset, so a read into a
//! fresh `Vec` often paid it (every read of 128 KiB or more did). Pieces of at most
//! [`PIECE`] bytes stay below the `rep movsb` threshold, where memcpy runs its
//! vector loop at full speed on any skew.

/// The largest piece a skewed copy is cut into (glibc's smallest `rep movsb`
/// threshold is 2048 bytes, for SSE2; AVX2 and AVX-512 raise it).
pub const PIECE: usize = 2048;

/// Whether a copy from `src` to `dst` of `len` bytes would hit the slow case.
fn skewed(src: *const u8, dst: *const u8, len: usize) -> bool {
    let skew = (dst as usize).wrapping_sub(src as usize) % 4096;
    len > PIECE && skew != 0 && skew < 64
}

/// Copies `src` into `dst` (of the same length).
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "a copy between buffers of one length");
    // SAFETY: both slices are valid for their length, and a `&mut` cannot overlap
    // a `&`.
    unsafe { copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr(), src.len()) }
}

/// [`std::ptr::copy_nonoverlapping`] for bytes, in pieces when the skew of `dst`
/// against `src` would make one memcpy slow.
///
/// # Safety
/// As for [`std::ptr::copy_nonoverlapping`]: `src` readable and `dst` writable for
/// `len` bytes, the two ranges disjoint.
#[inline]
pub unsafe fn copy_nonoverlapping(src: *const u8, dst: *mut u8, len: usize) {
    if !skewed(src, dst, len) {
        // SAFETY: the caller's promise.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    let mut at = 0;
    while at < len {
        let n = PIECE.min(len - at);
        // SAFETY: at + n <= len, inside both ranges (the caller's promise). The
        // black_box keeps the compiler from fusing the pieces back into one memcpy.
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), std::hint::black_box(dst.add(at)), n) };
        at += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first index of `v` at `want` bytes past a 4096-byte boundary.
    fn at_page_offset(v: &[u8], want: usize) -> usize {
        let off = (want + 4096 - v.as_ptr() as usize % 4096) % 4096;
        assert!(off + 20_000 <= v.len());
        off
    }

    #[test]
    fn every_skew_and_length_copies_every_byte() {
        let src_buf: Vec<u8> = (0..28_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut dst_buf = vec![0u8; 28_000];
        // The source starts on a page boundary, as a pool page does.
        let s0 = at_page_offset(&src_buf, 0);
        let src = &src_buf[s0..s0 + 20_000];
        let mut pieced = 0;
        for skew in [0usize, 1, 8, 16, 31, 63, 64, 100] {
            let d0 = at_page_offset(&dst_buf, skew);
            let dst = &mut dst_buf[d0..d0 + 20_000];
            for len in [0usize, 1, 2047, 2048, 2049, 4096, 10_001, 16_384] {
                let cut = skewed(src.as_ptr(), dst.as_ptr(), len);
                assert_eq!(cut, len > PIECE && (1..64).contains(&skew));
                pieced += cut as usize;
                dst.fill(0xAA);
                copy_bytes(&mut dst[..len], &src[..len]);
                assert_eq!(&dst[..len], &src[..len], "skew {skew} len {len}");
                let after = &dst[len..];
                assert!(
                    after.iter().all(|&b| b == 0xAA),
                    "after, skew {skew} len {len}"
                );
            }
        }
        assert_eq!(pieced, 5 * 4, "five skews cut, four lengths each");
    }

    #[test]
    fn only_a_small_forward_skew_past_a_piece_is_cut() {
        let p = 1 << 20;
        assert!(skewed(p as *const u8, (p + 16) as *const u8, 4096));
        assert!(skewed(p as *const u8, (p + 4096 + 63) as *const u8, 4096));
        assert!(!skewed(p as *const u8, (p + 16) as *const u8, PIECE));
        assert!(!skewed(p as *const u8, (p + 64) as *const u8, 4096));
        assert!(!skewed(p as *const u8, (p + 4096) as *const u8, 4096));
        assert!(!skewed((p + 16) as *const u8, p as *const u8, 4096));
    }
}
