//! Caller memory as the kernels see it: a validated strided tensor, element and row loads and
//! stores with rounding to nearest even, and cache-line prefetches for rows the hardware
//! prefetchers miss. Shared by every family whose tensors arrive as `ssmk_tensor` views.

use crate::dtype::{DType, Element};
/// A strided float (or f32-only) tensor of caller memory: base address, dtype and per-dimension
/// strides in elements. Built from a validated `View`, so every index inside the validated shape
/// is in bounds.
#[derive(Clone, Copy, Debug)]
pub struct Strided {
    pub ptr: *mut u8,
    pub dtype: DType,
    pub strides: [usize; 4],
}

// SAFETY: a description of caller memory; the kernels prove their tasks touch disjoint outputs.
unsafe impl Send for Strided {}
unsafe impl Sync for Strided {}

impl Strided {
    /// Address of element `index` (up to four dimensions).
    #[inline(always)]
    pub fn at(&self, index: &[usize]) -> *mut u8 {
        // A plain loop: `zip`'s constructor was left out of line in a build, a call (and a
        // `vzeroupper`) per address in the kernels' token loops.
        let mut off = 0usize;
        let mut d = 0;
        while d < index.len() {
            off += index[d] * self.strides[d];
            d += 1;
        }
        self.ptr.wrapping_add(off * self.dtype.size())
    }
}

/// Reads one element as f32.
///
/// # Safety
/// `p` must point to a readable, aligned element of `dtype` (a float dtype).
#[inline(always)]
pub unsafe fn read_f32(p: *const u8, dtype: DType) -> f32 {
    unsafe {
        match dtype {
            DType::F32 => p.cast::<f32>().read(),
            DType::BF16 => p.cast::<half::bf16>().read().to_f32(),
            DType::F16 => Element::to_f32(p.cast::<half::f16>().read()),
            other => unreachable!("float element of dtype {other:?}"),
        }
    }
}

/// Writes one element, rounded to nearest even for narrow dtypes.
///
/// # Safety
/// `p` must point to a writable, aligned element of `dtype` (a float dtype).
#[inline(always)]
pub unsafe fn write_f32(p: *mut u8, dtype: DType, x: f32) {
    unsafe {
        match dtype {
            DType::F32 => p.cast::<f32>().write(x),
            DType::BF16 => p
                .cast::<half::bf16>()
                .write(<half::bf16 as Element>::from_f32(x)),
            DType::F16 => p
                .cast::<half::f16>()
                .write(<half::f16 as Element>::from_f32(x)),
            other => unreachable!("float element of dtype {other:?}"),
        }
    }
}

/// Loads `dst.len()` elements spaced `stride` apart as f32.
///
/// # Safety
/// Every element `p + i*stride` (`i < dst.len()`) must be readable.
#[inline(always)]
pub unsafe fn load_row(p: *const u8, dtype: DType, stride: usize, dst: &mut [f32]) {
    let size = dtype.size();
    unsafe {
        match (dtype, stride) {
            (DType::F32, 1) => {
                std::ptr::copy_nonoverlapping(p.cast::<f32>(), dst.as_mut_ptr(), dst.len())
            }
            (DType::BF16, 1) => {
                let src = std::slice::from_raw_parts(p.cast::<u16>(), dst.len());
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = f32::from_bits((s as u32) << 16);
                }
            }
            _ => {
                for (i, d) in dst.iter_mut().enumerate() {
                    *d = read_f32(p.add(i * stride * size), dtype);
                }
            }
        }
    }
}

/// Stores `src` to elements spaced `stride` apart, rounding to `dtype`.
///
/// # Safety
/// Every element `p + i*stride` (`i < src.len()`) must be writable.
#[inline(always)]
pub unsafe fn store_row(p: *mut u8, dtype: DType, stride: usize, src: &[f32]) {
    let size = dtype.size();
    unsafe {
        match (dtype, stride) {
            (DType::F32, 1) => {
                std::ptr::copy_nonoverlapping(src.as_ptr(), p.cast::<f32>(), src.len())
            }
            (DType::BF16, 1) => {
                let dst = std::slice::from_raw_parts_mut(p.cast::<u16>(), src.len());
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = crate::dtype::f32_to_bf16_bits(s);
                }
            }
            _ => {
                for (i, &s) in src.iter().enumerate() {
                    write_f32(p.add(i * stride * size), dtype, s);
                }
            }
        }
    }
}

/// Asks for the cache lines of `[p, p + bytes)` ahead of use: token rows of q/k/v/out are a page
/// apart, where the hardware prefetchers stop. Never faults, whatever the address.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, bytes: usize) {
    prefetch_lines::<false>(p, bytes)
}

/// Like [`prefetch`], into L2 only (for data needed a while later).
#[inline(always)]
pub(crate) fn prefetch_l2(p: *const u8, bytes: usize) {
    prefetch_lines::<true>(p, bytes)
}

/// Prefetches every line of `[p, p + bytes)` into L1, or into L2 only with `L2`.
#[inline(always)]
fn prefetch_lines<const L2: bool>(p: *const u8, bytes: usize) {
    for off in (0..bytes).step_by(64) {
        prefetch_line::<L2>(p.wrapping_add(off));
    }
}

/// Asks for the cache line holding `p` into L1, or into L2 only with `L2`: a hint that never
/// faults, whatever the address (a no-op where no instruction is known).
#[inline(always)]
pub(crate) fn prefetch_line<const L2: bool>(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
        // SAFETY: prefetch is SSE (baseline on x86_64) and does not access memory architecturally.
        unsafe {
            match L2 {
                false => _mm_prefetch::<_MM_HINT_T0>(p.cast()),
                true => _mm_prefetch::<_MM_HINT_T1>(p.cast()),
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `prfm` is a hint (ARMv8.0); it does not access memory architecturally.
    unsafe {
        match L2 {
            false => {
                std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
            }
            true => {
                std::arch::asm!("prfm pldl2keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
            }
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}
