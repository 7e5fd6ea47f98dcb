//! Zeroing with aarch64's non-temporal store pairs (see [`zero_streaming`]).

use super::zero_streaming;
use std::arch::aarch64::vdupq_n_u8;
use std::arch::asm;

/// # Safety
/// `[dst, dst+len)` writable. (NEON is in every aarch64 core; `stnp` stores are ordered by the
/// barriers of the pool's task hand-off like any other, so no fence follows.)
#[target_feature(enable = "neon")]
pub unsafe fn zero_stream_neon(dst: *mut u8, len: usize) {
    // SAFETY: each pair of `stnp` (32 bytes each: one store per 32 bytes) targets a 64-byte
    // aligned chunk inside the range.
    unsafe {
        zero_streaming::<64>(dst, len, |p| {
            asm!(
                "stnp {z:q}, {z:q}, [{p}]",
                "stnp {z:q}, {z:q}, [{p}, #32]",
                p = in(reg) p,
                z = in(vreg) vdupq_n_u8(0),
                options(nostack, preserves_flags),
            )
        })
    }
}
