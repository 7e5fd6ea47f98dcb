//! Zeroing with x86's non-temporal stores (see [`zero_streaming`]).

use super::zero_streaming;
use std::arch::x86_64::*;

/// # Safety
/// `[dst, dst+len)` writable; the CPU supports AVX2. Call [`store_fence`] before other threads
/// may read the bytes.
#[target_feature(enable = "avx2")]
pub unsafe fn zero_stream_avx2(dst: *mut u8, len: usize) {
    // SAFETY: each store targets a 32-byte aligned chunk inside the range.
    unsafe {
        zero_streaming::<32>(dst, len, |p| {
            _mm256_stream_si256(p.cast(), _mm256_setzero_si256())
        })
    }
}

/// # Safety
/// As for [`zero_stream_avx2`], with AVX-512F.
#[target_feature(enable = "avx512f")]
pub unsafe fn zero_stream_avx512(dst: *mut u8, len: usize) {
    // SAFETY: each store targets a 64-byte aligned chunk inside the range.
    unsafe {
        zero_streaming::<64>(dst, len, |p| {
            _mm512_stream_si512(p.cast(), _mm512_setzero_si512())
        })
    }
}

/// Orders this thread's streaming stores before anything it does next (e.g. finishing its task).
pub fn store_fence() {
    // SAFETY: sfence is baseline SSE on x86_64.
    unsafe { _mm_sfence() }
}
