//! A small portable-SIMD layer: one trait, implemented for x86-64 (`x86.rs`: AVX2 + FMA + F16C with
//! 8 f32 lanes, AVX-512 with 16) and aarch64 (`aarch64.rs`: NEON, 8 lanes in two registers), so each
//! kernel body is written once, generically, and instantiated per ISA by thin `#[target_feature]`
//! entry points. Every method is `#[inline(always)]` so it is
//! inlined into those entry points, where its intrinsics are legal and fast.
//!
//! Narrow dtypes are widened on load and narrowed with round-to-nearest-even on store, exactly as
//! [`crate::dtype::Element::from_f32`] does, so SIMD and scalar paths store identical bits for
//! identical f32 values.

#![allow(clippy::missing_safety_doc)]

use half::{bf16, f16};

use crate::dtype::{DType, Element};
use crate::kernels::strided::{load_row, store_row};

/// Vector operations on `LANES` f32 lanes. All methods are `unsafe`: the caller guarantees the
/// CPU supports the implementation's ISA and that pointers cover `LANES` elements.
pub trait Simd: Copy + Send + Sync + 'static {
    const LANES: usize;
    /// How many `V` values the vector register file holds.
    const VECTORS_IN_REGISTERS: usize = 16;
    /// Fewer than 16 vectors fit the registers (two-register vectors: AVX2's bf16 channel pairs).
    /// Branch on this constant, not on a comparison: rustc compiles only the taken side of a
    /// constant's branch, for each vector type.
    const FEW_VECTORS: bool = Self::VECTORS_IN_REGISTERS < 16;
    /// 32 vectors or more fit the registers (AVX-512); see [`Simd::FEW_VECTORS`].
    const MANY_VECTORS: bool = Self::VECTORS_IN_REGISTERS >= 32;
    /// The CPU has [`Simd::dot_bf16_pairs`] (AVX512_BF16). Branch on this constant.
    const BF16_DOT: bool = false;
    type V: Copy;

    /// `acc + a_even * b_even + a_odd * b_odd` per f32 lane, where `a` and `b` hold a pair of
    /// bf16 values in each 32-bit lane (the lower half even): AVX512_BF16's `vdpbf16ps`, whose
    /// products are exact and whose two additions round to nearest even, with bf16 denormal
    /// inputs and f32 denormal results as zero. Only called where [`Simd::BF16_DOT`] holds: the
    /// default, for the levels without it, exists so that generic code compiles for them.
    #[inline(always)]
    unsafe fn dot_bf16_pairs(acc: Self::V, a: Self::V, b: Self::V) -> Self::V {
        let _ = (a, b);
        debug_assert!(Self::BF16_DOT, "dot_bf16_pairs on a level without it");
        acc
    }

    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn zero() -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V;
    /// `a * b + c`, fused (one rounding).
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a * b - c`, fused (one rounding).
    unsafe fn fms(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a > b ? a : b` per lane: `b` when either is NaN (x86's `maxps`; other ISAs follow it, so
    /// a clamp treats NaN the same everywhere).
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// `a < b ? a : b` per lane, as [`Simd::max`].
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V;
    /// Sum of the lanes, in a fixed order (deterministic).
    unsafe fn reduce_sum(a: Self::V) -> f32;

    unsafe fn load_f32(p: *const f32) -> Self::V;
    unsafe fn store_f32(p: *mut f32, v: Self::V);
    /// Channel (within a vector of `LANES` channels) that lane `l` holds: `l` unless the
    /// implementation keeps its lanes in another order.
    #[inline(always)]
    fn lane_channel(l: usize) -> usize {
        l
    }
    /// `LANES` f32 values stored in lane order (see [`Simd::lane_channel`]), e.g. weights a
    /// kernel rearranged once; for the natural order the same as `load_f32`.
    #[inline(always)]
    unsafe fn load_lane_order(p: *const f32) -> Self::V {
        unsafe { Self::load_f32(p) }
    }
    /// Stores the lanes as they are, for [`Simd::load_lane_order`] to load back.
    #[inline(always)]
    unsafe fn store_lane_order(p: *mut f32, v: Self::V) {
        unsafe { Self::store_f32(p, v) }
    }
    unsafe fn load_bf16(p: *const u16) -> Self::V;
    unsafe fn store_bf16(p: *mut u16, v: Self::V);
    unsafe fn load_f16(p: *const u16) -> Self::V;
    unsafe fn store_f16(p: *mut u16, v: Self::V);
    /// Lanes rounded to bf16 precision (what `store_bf16` then `load_bf16` give), in registers.
    unsafe fn round_bf16(v: Self::V) -> Self::V;
    /// Lanes rounded to f16 precision (what `store_f16` then `load_f16` give), in registers.
    unsafe fn round_f16(v: Self::V) -> Self::V;
    /// [`Simd::round_bf16`] of lanes whose NaNs, if any, are already bf16 NaNs: quiet, with the
    /// low 16 bits clear. Every NaN that arithmetic makes from bf16 operands is one (x86 and Arm keep a
    /// NaN operand's payload, quieted, and make new NaNs as 0xffc00000 and 0x7fc00000), so a product of two bf16
    /// values needs no NaN check: the rounding carry cannot reach such a NaN's high half. By
    /// default the checked rounding; `Avx2Pairs`, whose bf16 kernels gate ShortConv, skips it.
    #[inline(always)]
    unsafe fn round_bf16_bf16_nans(v: Self::V) -> Self::V {
        unsafe { Self::round_bf16(v) }
    }
    /// [`Simd::store_bf16`] of lanes as for [`Simd::round_bf16_bf16_nans`].
    #[inline(always)]
    unsafe fn store_bf16_bf16_nans(p: *mut u16, v: Self::V) {
        unsafe { Self::store_bf16(p, v) }
    }

    /// `min(max(x, lo), hi)` for constants `lo < hi`, neither NaN nor zero: `lo` for a NaN `x`, as
    /// [`Simd::max`] then [`Simd::min`] give. NEON does it in two instructions (`fmaxnm`,
    /// `fminnm`), where x86's NaN rule costs it four.
    #[inline(always)]
    unsafe fn clamp(x: Self::V, lo: f32, hi: f32) -> Self::V {
        unsafe { Self::min(Self::max(x, Self::splat(lo)), Self::splat(hi)) }
    }

    /// `e^x` within 4e-7 relative error on [-87.3, 88.3]; below, the smallest normal (~1.2e-38), and
    /// above, ~2.4e38 (finite), so `x / (1 + exp(-x))` never divides infinity by infinity.
    #[inline(always)]
    unsafe fn exp(x: Self::V) -> Self::V {
        unsafe { exp_generic::<Self>(x) }
    }

    /// `e * 2^n` for integral-valued `n` in [-126, 128], rounded once (so `e < 1` may take
    /// `n = 128` without overflowing, and a denormal result rounds as one product would).
    unsafe fn scale_pow2(e: Self::V, n: Self::V) -> Self::V;
    /// Round to nearest integer (ties to even), as f32.
    unsafe fn round(x: Self::V) -> Self::V;
    /// Each lane's low 8 bits as a biased exponent (the bits shifted left by 23): for
    /// `t = 1.5 * 2^23 + 127 + n` with integral `n` in -127..=128 that is `2^n`, with +0 and +inf
    /// at the two ends. Lets `exp` scale by `2^n` with one shift.
    unsafe fn exponent_from_low_bits(t: Self::V) -> Self::V;
    /// Whether any lane is NaN.
    unsafe fn any_nan(v: Self::V) -> bool;
    /// Every NaN lane as the default quiet NaN (`f32::NAN`, [`canonical_nan`]'s): which NaN an
    /// operation returns depends on its operand order, which may differ between a vector body
    /// and its scalar tail, and so with the task split.
    unsafe fn canonical_nan(v: Self::V) -> Self::V;
}

/// `[f(0), .., f(N - 1)]` for the small arrays of generic kernels (row pointers of a tile,
/// splatted vectors): `std::array::from_fn` instantiates its panic-safe machinery for every
/// closure of every kernel instance, which was a tenth of the library's compiled code.
#[inline(always)]
pub(crate) fn array_of<T: Copy, const N: usize>(f: impl Fn(usize) -> T) -> [T; N] {
    const { assert!(N > 0) };
    let mut a = [f(0); N];
    let mut i = 1;
    while i < N {
        a[i] = f(i);
        i += 1;
    }
    a
}

/// `x`, or the default quiet NaN if `x` is NaN: the scalar twin of [`Simd::canonical_nan`].
#[inline(always)]
pub fn canonical_nan(x: f32) -> f32 {
    if x.is_nan() { f32::NAN } else { x }
}

/// The lowest exponent the vector exp takes: `e^LOG_DECAY_FLOOR` is the smallest normal f32, so a decay
/// `e^g` is never 0 (nor a slow denormal) and a log-decay below it (`-inf` and NaN included) acts
/// as this one. The references apply the same clamp, so every path agrees on such gates.
pub const LOG_DECAY_FLOOR: f32 = -87.336_55;

/// `e^x` with the vector exp's clamp below ([`LOG_DECAY_FLOOR`]), for the scalar decays beside it.
#[inline(always)]
pub fn clamped_exp(x: f32) -> f32 {
    x.max(LOG_DECAY_FLOOR).exp()
}

/// Cephes-style expf: `x = n ln2 + r`, `|r| <= ln2/2`, degree-6 polynomial for `e^r`, times `2^n`.
#[inline(always)]
unsafe fn exp_generic<S: Simd>(x: S::V) -> S::V {
    unsafe {
        let x = S::clamp(x, LOG_DECAY_FLOOR, 88.376_26);
        let n = S::round(S::mul(x, S::splat(std::f32::consts::LOG2_E)));
        // Two-step Cody–Waite reduction keeps r exact enough.
        let r = S::fma(n, S::splat(-0.693_359_4), x);
        let r = S::fma(n, S::splat(2.121_944_4e-4), r);
        let mut p = S::splat(1.987_569_1e-4);
        p = S::fma(p, r, S::splat(1.398_199_9e-3));
        p = S::fma(p, r, S::splat(8.333_452e-3));
        p = S::fma(p, r, S::splat(4.166_579_6e-2));
        p = S::fma(p, r, S::splat(1.666_666_5e-1));
        p = S::fma(p, r, S::splat(0.5));
        let r2 = S::mul(r, r);
        let e = S::add(S::fma(p, r2, r), S::splat(1.0));
        S::scale_pow2(e, n)
    }
}

/// `out[i] = exp(x[i])` with the vector exp (a zero-padded vector for the tail).
///
/// # Safety
/// The CPU supports `S`; `x.len() == out.len()`.
#[inline(always)]
pub(crate) unsafe fn exp_into<S: Simd>(x: &[f32], out: &mut [f32]) {
    debug_assert!(out.len() == x.len());
    unsafe { exp_rows::<S>(x.as_ptr(), out.as_mut_ptr(), x.len()) }
}

/// `x[i] = exp(x[i])`, as [`exp_into`].
///
/// # Safety
/// The CPU supports `S`.
#[inline(always)]
pub(crate) unsafe fn exp_in_place<S: Simd>(x: &mut [f32]) {
    unsafe { exp_rows::<S>(x.as_ptr(), x.as_mut_ptr(), x.len()) }
}

/// `dst[i] = src[i] * f` for `i < n`; `src` and `dst` may be the same floats.
///
/// # Safety
/// The CPU supports `S`; each pointer addresses `n` floats.
#[inline(always)]
pub(crate) unsafe fn scale_into<S: Simd>(src: *const f32, f: f32, dst: *mut f32, n: usize) {
    let mut j = 0;
    unsafe {
        let fv = S::splat(f);
        while j + S::LANES <= n {
            S::store_f32(dst.add(j), S::mul(S::load_f32(src.add(j)), fv));
            j += S::LANES;
        }
        for i in j..n {
            *dst.add(i) = *src.add(i) * f;
        }
    }
}

/// `x[i] *= d`, as [`scale_into`].
///
/// # Safety
/// The CPU supports `S`.
#[inline(always)]
pub(crate) unsafe fn scale_in_place<S: Simd>(x: &mut [f32], d: f32) {
    unsafe { scale_into::<S>(x.as_ptr(), d, x.as_mut_ptr(), x.len()) }
}

/// `sum x[i]^2` in four vector partial sums (independent FMA chains, so a row's sum is not one
/// long dependency), added in a fixed order, then the tail: deterministic for each `S`.
///
/// # Safety
/// The CPU supports `S`.
#[inline(always)]
pub(crate) unsafe fn sum_squares<S: Simd>(x: &[f32]) -> f32 {
    let (n, l, p) = (x.len(), S::LANES, x.as_ptr());
    let mut j = 0;
    unsafe {
        let mut acc = [S::zero(); 4];
        while j + 4 * l <= n {
            for (u, a) in acc.iter_mut().enumerate() {
                let v = S::load_f32(p.add(j + u * l));
                *a = S::fma(v, v, *a);
            }
            j += 4 * l;
        }
        while j + l <= n {
            let v = S::load_f32(p.add(j));
            acc[0] = S::fma(v, v, acc[0]);
            j += l;
        }
        let sum = S::add(S::add(acc[0], acc[1]), S::add(acc[2], acc[3]));
        x[j..]
            .iter()
            .fold(S::reduce_sum(sum), |s, &t| t.mul_add(t, s))
    }
}

/// `out[i] = exp(x[i])` for `i < n`; `x` and `out` may be the same floats.
#[inline(always)]
unsafe fn exp_rows<S: Simd>(x: *const f32, out: *mut f32, n: usize) {
    let l = S::LANES;
    debug_assert!(l <= 16);
    let mut i = 0;
    unsafe {
        while i + l <= n {
            S::store_f32(out.add(i), S::exp(S::load_f32(x.add(i))));
            i += l;
        }
        if i < n {
            let mut buf = [0f32; 16];
            std::ptr::copy_nonoverlapping(x.add(i), buf.as_mut_ptr(), n - i);
            S::store_f32(buf.as_mut_ptr(), S::exp(S::load_f32(buf.as_ptr())));
            std::ptr::copy_nonoverlapping(buf.as_ptr(), out.add(i), n - i);
        }
    }
}

/// Loads `dst.len()` elements spaced `stride` apart as f32: whole vectors when contiguous, the
/// tail (and strided rows) element by element, so nothing past the row is read.
///
/// # Safety
/// The CPU supports `S`; every element `p + i*stride` (`i < dst.len()`) is readable.
#[inline(always)]
pub(crate) unsafe fn load_row_simd<S: Simd>(
    p: *const u8,
    dtype: DType,
    stride: usize,
    dst: &mut [f32],
) {
    if stride != 1 {
        return unsafe { load_row(p, dtype, stride, dst) };
    }
    let full = dst.len() / S::LANES * S::LANES;
    crate::with_float_type!(dtype, E => unsafe {
        let src = p.cast::<E>();
        for i in (0..full).step_by(S::LANES) {
            S::store_f32(dst.as_mut_ptr().add(i), E::load::<S>(src.add(i)));
        }
        for i in full..dst.len() {
            dst[i] = (*src.add(i)).to_f32();
        }
    })
}

/// Stores `src` to elements spaced `stride` apart, rounded to `dtype` (as [`load_row_simd`]).
///
/// # Safety
/// The CPU supports `S`; every element `p + i*stride` (`i < src.len()`) is writable.
#[inline(always)]
pub(crate) unsafe fn store_row_simd<S: Simd>(p: *mut u8, dtype: DType, stride: usize, src: &[f32]) {
    if stride != 1 {
        return unsafe { store_row(p, dtype, stride, src) };
    }
    let full = src.len() / S::LANES * S::LANES;
    crate::with_float_type!(dtype, E => unsafe {
        let dst = p.cast::<E>();
        for i in (0..full).step_by(S::LANES) {
            E::store::<S>(dst.add(i), S::load_f32(src.as_ptr().add(i)));
        }
        for i in full..src.len() {
            *dst.add(i) = E::from_f32(src[i]);
        }
    })
}

/// A float storage type the SIMD layer can load and store.
pub trait SimdElement: Element {
    unsafe fn load<S: Simd>(p: *const Self) -> S::V;
    unsafe fn store<S: Simd>(p: *mut Self, v: S::V);
    /// Lanes rounded to this type's precision: what a store and a load give, without memory.
    unsafe fn round<S: Simd>(v: S::V) -> S::V;
    /// [`SimdElement::round`] of a product of two values of this type, which may skip the checks
    /// a NaN from elsewhere needs (see [`Simd::round_bf16_bf16_nans`]).
    #[inline(always)]
    unsafe fn round_product<S: Simd>(v: S::V) -> S::V {
        unsafe { Self::round::<S>(v) }
    }
    /// [`SimdElement::store`] of a product of two values of this type (as for `round_product`).
    #[inline(always)]
    unsafe fn store_product<S: Simd>(p: *mut Self, v: S::V) {
        unsafe { Self::store::<S>(p, v) }
    }
}

impl SimdElement for f32 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        unsafe { S::load_f32(p) }
    }
    #[inline(always)]
    unsafe fn store<S: Simd>(p: *mut Self, v: S::V) {
        unsafe { S::store_f32(p, v) }
    }
    #[inline(always)]
    unsafe fn round<S: Simd>(v: S::V) -> S::V {
        v
    }
}

impl SimdElement for bf16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        unsafe { S::load_bf16(p.cast()) }
    }
    #[inline(always)]
    unsafe fn store<S: Simd>(p: *mut Self, v: S::V) {
        unsafe { S::store_bf16(p.cast(), v) }
    }
    #[inline(always)]
    unsafe fn round<S: Simd>(v: S::V) -> S::V {
        unsafe { S::round_bf16(v) }
    }
    #[inline(always)]
    unsafe fn round_product<S: Simd>(v: S::V) -> S::V {
        unsafe { S::round_bf16_bf16_nans(v) }
    }
    #[inline(always)]
    unsafe fn store_product<S: Simd>(p: *mut Self, v: S::V) {
        unsafe { S::store_bf16_bf16_nans(p.cast(), v) }
    }
}

impl SimdElement for f16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        unsafe { S::load_f16(p.cast()) }
    }
    #[inline(always)]
    unsafe fn store<S: Simd>(p: *mut Self, v: S::V) {
        unsafe { S::store_f16(p.cast(), v) }
    }
    #[inline(always)]
    unsafe fn round<S: Simd>(v: S::V) -> S::V {
        unsafe { S::round_f16(v) }
    }
}

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(target_arch = "aarch64")]
pub use aarch64::Neon;
#[cfg(target_arch = "x86_64")]
pub use x86::{Avx2, Avx2Pairs, Avx512, Avx512Bf16, Avx512Of};

/// Rows and columns of the register-transposed blocks of [`transpose`].
#[cfg(target_arch = "x86_64")]
const TRANSPOSE_BLOCK: usize = 8;
#[cfg(target_arch = "x86_64")]
use x86::transpose8x8 as transpose_block;
#[cfg(target_arch = "aarch64")]
const TRANSPOSE_BLOCK: usize = 4;
#[cfg(target_arch = "aarch64")]
use aarch64::transpose4x4 as transpose_block;

/// `dst[c * ldd + r] = src[r * lds + c]` for `r < rows`, `c < cols`: 8 x 8 blocks through
/// registers on x86 (AVX2), 4 x 4 on aarch64 (a scalar transpose ran one store per element, the
/// bulk of a KDA sub-chunk's off-diagonal products), the edges element by element.
///
/// # Safety
/// The CPU has AVX2 (x86) or NEON (aarch64) and the caller is compiled for it (every [`Simd`]
/// kernel is); both matrices are in bounds and disjoint.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
pub unsafe fn transpose(
    src: *const f32,
    lds: usize,
    dst: *mut f32,
    ldd: usize,
    rows: usize,
    cols: usize,
) {
    const B: usize = TRANSPOSE_BLOCK;
    let (rows_b, cols_b) = (rows / B * B, cols / B * B);
    unsafe {
        for r in (0..rows_b).step_by(B) {
            for c in (0..cols_b).step_by(B) {
                transpose_block(src.add(r * lds + c), lds, dst.add(c * ldd + r), ldd);
            }
        }
        for r in 0..rows {
            let first = if r < rows_b { cols_b } else { 0 };
            for c in first..cols {
                *dst.add(c * ldd + r) = *src.add(r * lds + c);
            }
        }
    }
}
