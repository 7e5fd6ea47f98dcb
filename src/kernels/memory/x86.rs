//! Zeroing with non-temporal stores: cache blocks being cleared are not read back soon, so
//! streaming stores skip the read-for-ownership and leave the caches to the running model.

use std::arch::x86_64::*;

/// Runs shorter than this gain nothing from streaming; plain stores keep them cache-resident.
const STREAM_MIN: usize = 4096;

/// Zeroes `[dst, dst+len)`: plain stores up to the first `ALIGN` boundary and for the tail, and
/// `store(ptr)` for each aligned `ALIGN`-byte chunk between.
#[inline(always)]
unsafe fn zero_streaming<const ALIGN: usize>(dst: *mut u8, len: usize, store: impl Fn(*mut u8)) {
    if len < STREAM_MIN {
        return unsafe { std::ptr::write_bytes(dst, 0, len) };
    }
    let head = dst.align_offset(ALIGN).min(len);
    unsafe { std::ptr::write_bytes(dst, 0, head) };
    let body = (len - head) / ALIGN * ALIGN;
    let mut p = unsafe { dst.add(head) };
    let end = unsafe { p.add(body) };
    while p < end {
        store(p);
        p = unsafe { p.add(ALIGN) };
    }
    unsafe { std::ptr::write_bytes(end, 0, len - head - body) };
}

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
