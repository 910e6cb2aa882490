//! Cache-line flush and non-temporal copy primitives for the `dax` mode.
//!
//! This is one of the few modules with `unsafe`: it issues raw flush instructions on
//! addresses inside a live mapping that the caller has bounds-checked.

use crate::LINE;

/// Which instruction writes a line back to the persistence domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FlushInsn {
    Clwb,
    ClflushOpt,
    Clflush,
}

impl FlushInsn {
    /// Picks the best instruction this CPU has (CPUID leaf 7: EBX bit 24 = CLWB,
    /// bit 23 = CLFLUSHOPT; CLFLUSH is baseline on x86-64).
    /// Asked of the CPU once per process: under a hypervisor each `cpuid` traps to
    /// it (7 µs on the development VM), and every pool a process maps asked again.
    pub(crate) fn detect() -> FlushInsn {
        static FOUND: std::sync::OnceLock<FlushInsn> = std::sync::OnceLock::new();
        *FOUND.get_or_init(Self::ask_cpu)
    }

    fn ask_cpu() -> FlushInsn {
        #[cfg(target_arch = "x86_64")]
        {
            // Leaf 7 sub-leaf 0 is defined when the max leaf is >= 7.
            let max_leaf = core::arch::x86_64::__cpuid(0).eax;
            let ebx7 = if max_leaf >= 7 {
                core::arch::x86_64::__cpuid_count(7, 0).ebx
            } else {
                0
            };
            if max_leaf >= 7 && ebx7 & (1 << 24) != 0 {
                return FlushInsn::Clwb;
            }
            if max_leaf >= 7 && ebx7 & (1 << 23) != 0 {
                return FlushInsn::ClflushOpt;
            }
        }
        FlushInsn::Clflush
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            FlushInsn::Clwb => "clwb",
            FlushInsn::ClflushOpt => "clflushopt",
            FlushInsn::Clflush => "clflush",
        }
    }
}

/// Writes back every line of `[addr, addr + len)` and fences.
///
/// # Safety
/// `addr..addr + len` must lie inside a live mapping.
#[allow(unused_variables)]
pub(crate) unsafe fn flush_range(insn: FlushInsn, addr: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let start = (addr as usize) & !(LINE - 1);
        let end = addr as usize + len;
        let mut line = start;
        while line < end {
            let p = line as *const u8;
            // SAFETY (caller): the line overlaps the mapped range, so it is mapped.
            match insn {
                FlushInsn::Clwb => core::arch::asm!("clwb [{0}]", in(reg) p, options(nostack)),
                FlushInsn::ClflushOpt => {
                    core::arch::asm!("clflushopt [{0}]", in(reg) p, options(nostack))
                }
                FlushInsn::Clflush => core::arch::x86_64::_mm_clflush(p),
            }
            line += LINE;
        }
        core::arch::x86_64::_mm_sfence();
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Copies `src` to `dst` with non-temporal stores where both are 16-byte aligned, so
/// large data copies bypass the cache; the caller fences (`flush_range` or `sfence`).
///
/// # Safety
/// `dst..dst + src.len()` must be a valid, writable range inside a live mapping.
pub(crate) unsafe fn copy_nontemporal(dst: *mut u8, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        if (dst as usize).is_multiple_of(16) && src.len() >= 64 {
            let chunks = src.len() / 16;
            for i in 0..chunks {
                // SAFETY: i * 16 + 16 <= src.len(); dst is 16-byte aligned and the
                // destination range is valid per the caller.
                let v = _mm_loadu_si128(src.as_ptr().add(i * 16) as *const __m128i);
                _mm_stream_si128(dst.add(i * 16) as *mut __m128i, v);
            }
            let done = chunks * 16;
            core::ptr::copy_nonoverlapping(src.as_ptr().add(done), dst.add(done), src.len() - done);
            _mm_sfence();
            return;
        }
    }
    crate::copy::copy_nonoverlapping(src.as_ptr(), dst, src.len());
}
