//! The x86-64 implementations of [`Simd`]: AVX2 + FMA + F16C with 8 lanes, the same as channel
//! pairs for bf16 (`Avx2Pairs`), and AVX-512 with 16.

// Every method below is a thin wrapper over intrinsics whose only precondition is the ISA, which
// the `Simd` contract already puts on the caller; per-call `unsafe` blocks would add only noise.
#![allow(unsafe_op_in_unsafe_fn)]

use super::Simd;
use std::arch::x86_64::*;
use std::mem::transmute;

/// AVX2 + FMA + F16C, 8 lanes.
#[derive(Clone, Copy, Debug)]
pub struct Avx2;

/// One 8 x 8 block of [`super::transpose`]: pairs of rows interleaved, then pairs of pairs,
/// then the 128-bit halves swapped. (No closures: they would not inherit the caller's
/// target features, and the intrinsics would become calls.)
#[inline(always)]
pub(super) unsafe fn transpose8x8(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
    let mut r = [_mm256_setzero_ps(); 8];
    for (i, row) in r.iter_mut().enumerate() {
        *row = _mm256_loadu_ps(src.add(i * lds));
    }
    let mut t = [_mm256_setzero_ps(); 8];
    for i in 0..4 {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4h + j]: columns j and j + 4 of rows 4h..4h+4.
    let mut u = [_mm256_setzero_ps(); 8];
    for h in 0..2 {
        for p in 0..2 {
            let (a, b) = (t[4 * h + p], t[4 * h + p + 2]);
            u[4 * h + 2 * p] = _mm256_shuffle_ps::<0x44>(a, b);
            u[4 * h + 2 * p + 1] = _mm256_shuffle_ps::<0xEE>(a, b);
        }
    }
    for j in 0..4 {
        _mm256_storeu_ps(
            dst.add(j * ldd),
            _mm256_permute2f128_ps::<0x20>(u[j], u[4 + j]),
        );
        _mm256_storeu_ps(
            dst.add((j + 4) * ldd),
            _mm256_permute2f128_ps::<0x31>(u[j], u[4 + j]),
        );
    }
}

/// `2^n` for integral-valued `n` in [-126, 127], built in the exponent bits. (A function, not
/// a closure, as in `transpose8x8`.)
#[inline(always)]
unsafe fn pow2i(n: __m256) -> __m256 {
    let i = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    _mm256_castsi256_ps(_mm256_slli_epi32::<23>(i))
}

/// AVX-512 F/BW/VL/DQ, 16 lanes; with `BF16_DOT`, also AVX512_BF16's pair dot product
/// ([`Simd::dot_bf16_pairs`]). One type for both, so the bf16 level is the AVX-512 kernels
/// instantiated once more, not a copy of them.
#[derive(Clone, Copy, Debug)]
pub struct Avx512Of<const BF16_DOT: bool>;

/// AVX-512 F/BW/VL/DQ, 16 lanes.
pub type Avx512 = Avx512Of<false>;

/// [`Avx512`] with AVX512_BF16 (`vdpbf16ps`).
pub type Avx512Bf16 = Avx512Of<true>;

/// f32 lanes whose high halves are the lanes rounded to nearest-even bf16 (NaNs quieted).
#[inline(always)]
unsafe fn bf16_high_halves(v: __m256) -> __m256i {
    match Avx2::any_nan(v) {
        false => bf16_rne(v),
        true => bf16_rne_keeping_nans(v),
    }
}

/// [`bf16_high_halves`] of both registers of a pair, with one NaN check for the two.
#[inline(always)]
unsafe fn bf16_high_halves_pair(v: [__m256; 2]) -> [__m256i; 2] {
    let either_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(v[0], v[1]);
    match _mm256_movemask_ps(either_nan) != 0 {
        false => [bf16_rne(v[0]), bf16_rne(v[1])],
        true => [bf16_rne_keeping_nans(v[0]), bf16_rne_keeping_nans(v[1])],
    }
}

/// The high halves of `h` as f32 lanes (low halves cleared).
#[inline(always)]
unsafe fn high_halves(h: __m256i) -> __m256 {
    _mm256_castsi256_ps(_mm256_and_si256(
        h,
        _mm256_set1_epi32(0xffff_0000_u32 as i32),
    ))
}

/// Stores the high halves of `h`'s lanes as 8 consecutive u16.
#[inline(always)]
unsafe fn store_high_halves(p: *mut u16, h: __m256i) {
    let r = _mm256_srli_epi32::<16>(h);
    let packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256::<1>(r));
    _mm_storeu_si128(p.cast(), packed);
}

/// Stores the high halves of a pair's `[even, odd]` lanes as 16 consecutive u16.
#[inline(always)]
unsafe fn store_pair_high_halves(p: *mut u16, [even, odd]: [__m256i; 2]) {
    let pairs = _mm256_blend_epi16::<0b1010_1010>(_mm256_srli_epi32::<16>(even), odd);
    _mm256_storeu_si256(p.cast(), pairs);
}

/// Round to nearest-even in the high halves, wrong for NaNs: add 0x7fff plus the lowest kept
/// bit, i.e. 0x8000 minus one when that bit is clear (a compare, not a shift: shifts share two
/// pipes with the widening).
#[inline(always)]
unsafe fn bf16_rne(v: __m256) -> __m256i {
    let b = _mm256_castps_si256(v);
    let lsb = _mm256_and_si256(b, _mm256_set1_epi32(0x1_0000));
    let clear = _mm256_cmpeq_epi32(lsb, _mm256_setzero_si256());
    _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x8000)), clear)
}

/// [`bf16_rne`], except that a NaN, which the carry would corrupt, keeps its high half, quieted.
#[inline(always)]
unsafe fn bf16_rne_keeping_nans(v: __m256) -> __m256i {
    let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
    let quiet = _mm256_or_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x0040_0000));
    _mm256_blendv_epi8(bf16_rne(v), quiet, nan)
}

impl Simd for Avx2 {
    const LANES: usize = 8;
    type V = __m256;

    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        _mm256_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn div(a: __m256, b: __m256) -> __m256 {
        _mm256_div_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fms(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmsub_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        _mm256_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn min(a: __m256, b: __m256) -> __m256 {
        _mm256_min_ps(a, b)
    }
    #[inline(always)]
    unsafe fn reduce_sum(a: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(a);
        let hi = _mm256_extractf128_ps::<1>(a);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
        _mm_cvtss_f32(s)
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> __m256 {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store_f32(p: *mut f32, v: __m256) {
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> __m256 {
        unsafe {
            let h = _mm_loadu_si128(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    unsafe fn store_bf16(p: *mut u16, v: __m256) {
        unsafe { store_high_halves(p, bf16_high_halves(v)) }
    }
    #[inline(always)]
    unsafe fn round_bf16(v: __m256) -> __m256 {
        high_halves(bf16_high_halves(v))
    }
    #[inline(always)]
    unsafe fn round_f16(v: __m256) -> __m256 {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn store_f16(p: *mut u16, v: __m256) {
        unsafe { _mm_storeu_si128(p.cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)) }
    }
    #[inline(always)]
    unsafe fn scale_pow2(e: __m256, n: __m256) -> __m256 {
        // 2^n itself overflows at n = 128: scale by two halves, each exact.
        let half = Avx2::round(_mm256_mul_ps(n, _mm256_set1_ps(0.5)));
        _mm256_mul_ps(_mm256_mul_ps(e, pow2i(half)), pow2i(_mm256_sub_ps(n, half)))
    }
    #[inline(always)]
    unsafe fn round(x: __m256) -> __m256 {
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x)
    }
    #[inline(always)]
    unsafe fn exponent_from_low_bits(t: __m256) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_castps_si256(t)))
    }
    #[inline(always)]
    unsafe fn any_nan(v: __m256) -> bool {
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v)) != 0
    }
    #[inline(always)]
    unsafe fn canonical_nan(v: __m256) -> __m256 {
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
        _mm256_blendv_ps(v, _mm256_set1_ps(f32::NAN), nan)
    }
}

/// AVX2 with 16 lanes in two registers, the even channels of a 16-channel group and then the
/// odd ones. A bf16 pair in a 32-bit word widens with one shift (even) and one mask (odd) and
/// narrows with one blend, where the natural order needs cross-lane widening and packing on
/// the two pipes that also shift. The bf16 conv kernels use it: measured on Zen 3 against the
/// natural order in one process, the decode update takes 0.84x the time, prefill 0.90x and
/// ShortConv 0.92x.
#[derive(Clone, Copy, Debug)]
pub struct Avx2Pairs;

/// `[even, odd]` channels of the 16 consecutive f32 `lo ++ hi`.
#[inline(always)]
unsafe fn deinterleave(lo: __m256, hi: __m256) -> [__m256; 2] {
    let even = _mm256_shuffle_ps::<0b10_00_10_00>(lo, hi);
    let odd = _mm256_shuffle_ps::<0b11_01_11_01>(lo, hi);
    [quarters_in_order(even), quarters_in_order(odd)]
}

/// Swaps the middle two 64-bit quarters (its own inverse).
#[inline(always)]
unsafe fn quarters_in_order(v: __m256) -> __m256 {
    _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(v)))
}

/// The 16 consecutive channels `[lo, hi]` of `[even, odd]`: inverse of [`deinterleave`].
#[inline(always)]
unsafe fn interleave(v: [__m256; 2]) -> [__m256; 2] {
    let (e, o) = (quarters_in_order(v[0]), quarters_in_order(v[1]));
    [_mm256_unpacklo_ps(e, o), _mm256_unpackhi_ps(e, o)]
}

/// `Avx2::$op` on both halves.
macro_rules! both_halves {
    ($($op:ident($($arg:ident),+);)+) => {$(
        #[inline(always)]
        unsafe fn $op($($arg: [__m256; 2]),+) -> [__m256; 2] {
            [Avx2::$op($($arg[0]),+), Avx2::$op($($arg[1]),+)]
        }
    )+};
}

impl Simd for Avx2Pairs {
    const LANES: usize = 16;
    const VECTORS_IN_REGISTERS: usize = 8;
    type V = [__m256; 2];

    both_halves! {
        add(a, b); sub(a, b); mul(a, b); div(a, b); fma(a, b, c); fms(a, b, c);
        max(a, b); min(a, b); round_f16(v); scale_pow2(e, n); round(x);
        exponent_from_low_bits(t);
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> [__m256; 2] {
        [Avx2::splat(x); 2]
    }
    #[inline(always)]
    unsafe fn zero() -> [__m256; 2] {
        [Avx2::zero(); 2]
    }
    #[inline(always)]
    unsafe fn reduce_sum(a: [__m256; 2]) -> f32 {
        Avx2::reduce_sum(_mm256_add_ps(a[0], a[1]))
    }
    #[inline(always)]
    fn lane_channel(l: usize) -> usize {
        if l < 8 { 2 * l } else { 2 * (l - 8) + 1 }
    }
    #[inline(always)]
    unsafe fn load_lane_order(p: *const f32) -> [__m256; 2] {
        [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))]
    }
    #[inline(always)]
    unsafe fn store_lane_order(p: *mut f32, v: [__m256; 2]) {
        _mm256_storeu_ps(p, v[0]);
        _mm256_storeu_ps(p.add(8), v[1]);
    }
    #[inline(always)]
    unsafe fn round_bf16(v: [__m256; 2]) -> [__m256; 2] {
        let [even, odd] = bf16_high_halves_pair(v);
        [high_halves(even), high_halves(odd)]
    }
    #[inline(always)]
    unsafe fn round_bf16_bf16_nans(v: [__m256; 2]) -> [__m256; 2] {
        [high_halves(bf16_rne(v[0])), high_halves(bf16_rne(v[1]))]
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> [__m256; 2] {
        deinterleave(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
    }
    #[inline(always)]
    unsafe fn store_f32(p: *mut f32, v: [__m256; 2]) {
        let [lo, hi] = interleave(v);
        _mm256_storeu_ps(p, lo);
        _mm256_storeu_ps(p.add(8), hi);
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> [__m256; 2] {
        let pairs = _mm256_loadu_si256(p.cast());
        let odd = _mm256_and_si256(pairs, _mm256_set1_epi32(0xffff_0000_u32 as i32));
        [
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(pairs)),
            _mm256_castsi256_ps(odd),
        ]
    }
    #[inline(always)]
    unsafe fn store_bf16(p: *mut u16, v: [__m256; 2]) {
        store_pair_high_halves(p, bf16_high_halves_pair(v))
    }
    #[inline(always)]
    unsafe fn store_bf16_bf16_nans(p: *mut u16, v: [__m256; 2]) {
        store_pair_high_halves(p, [bf16_rne(v[0]), bf16_rne(v[1])])
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> [__m256; 2] {
        let lo = _mm256_cvtph_ps(_mm_loadu_si128(p.cast()));
        let hi = _mm256_cvtph_ps(_mm_loadu_si128(p.add(8).cast()));
        deinterleave(lo, hi)
    }
    #[inline(always)]
    unsafe fn store_f16(p: *mut u16, v: [__m256; 2]) {
        let [lo, hi] = interleave(v);
        Avx2::store_f16(p, lo);
        Avx2::store_f16(p.add(8), hi);
    }
    #[inline(always)]
    unsafe fn any_nan(v: [__m256; 2]) -> bool {
        let nan = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[0], v[0]),
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[1], v[1]),
        );
        _mm256_movemask_ps(nan) != 0
    }
    #[inline(always)]
    unsafe fn canonical_nan(v: [__m256; 2]) -> [__m256; 2] {
        [Avx2::canonical_nan(v[0]), Avx2::canonical_nan(v[1])]
    }
}

/// [`bf16_high_halves`] for AVX-512.
#[inline(always)]
unsafe fn bf16_high_halves_512(v: __m512) -> __m512i {
    let b = _mm512_castps_si512(v);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    let rounded = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
    let quiet = _mm512_or_si512(b, _mm512_set1_epi32(0x0040_0000));
    _mm512_mask_blend_epi32(nan, rounded, quiet)
}

impl<const BF16_DOT: bool> Simd for Avx512Of<BF16_DOT> {
    const VECTORS_IN_REGISTERS: usize = 32;
    const LANES: usize = 16;
    const BF16_DOT: bool = BF16_DOT;
    type V = __m512;

    #[inline(always)]
    unsafe fn dot_bf16_pairs(acc: __m512, a: __m512, b: __m512) -> __m512 {
        debug_assert!(BF16_DOT);
        unsafe {
            _mm512_dpbf16_ps(
                acc,
                transmute::<__m512, __m512bh>(a),
                transmute::<__m512, __m512bh>(b),
            )
        }
    }

    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn div(a: __m512, b: __m512) -> __m512 {
        _mm512_div_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn fms(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmsub_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        _mm512_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn min(a: __m512, b: __m512) -> __m512 {
        _mm512_min_ps(a, b)
    }
    #[inline(always)]
    unsafe fn reduce_sum(a: __m512) -> f32 {
        // Same pairwise order as AVX2's after folding halves, so both are deterministic.
        let lo = _mm512_castps512_ps256(a);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
        unsafe { <super::Avx2 as Simd>::reduce_sum(_mm256_add_ps(lo, hi)) }
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> __m512 {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store_f32(p: *mut f32, v: __m512) {
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> __m512 {
        unsafe {
            let h = _mm256_loadu_si256(p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    unsafe fn store_bf16(p: *mut u16, v: __m512) {
        unsafe {
            let r = _mm512_srli_epi32::<16>(bf16_high_halves_512(v));
            _mm256_storeu_si256(p.cast(), _mm512_cvtepi32_epi16(r));
        }
    }
    #[inline(always)]
    unsafe fn round_bf16(v: __m512) -> __m512 {
        let high = _mm512_set1_epi32(0xffff_0000_u32 as i32);
        _mm512_castsi512_ps(_mm512_and_si512(bf16_high_halves_512(v), high))
    }
    #[inline(always)]
    unsafe fn round_f16(v: __m512) -> __m512 {
        _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> __m512 {
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn store_f16(p: *mut u16, v: __m512) {
        unsafe { _mm256_storeu_si256(p.cast(), _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)) }
    }
    #[inline(always)]
    unsafe fn scale_pow2(e: __m512, n: __m512) -> __m512 {
        _mm512_scalef_ps(e, n)
    }
    #[inline(always)]
    unsafe fn round(x: __m512) -> __m512 {
        _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x)
    }
    #[inline(always)]
    unsafe fn exponent_from_low_bits(t: __m512) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_castps_si512(t)))
    }
    #[inline(always)]
    unsafe fn any_nan(v: __m512) -> bool {
        _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v) != 0
    }
    #[inline(always)]
    unsafe fn canonical_nan(v: __m512) -> __m512 {
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        _mm512_mask_blend_ps(nan, v, _mm512_set1_ps(f32::NAN))
    }
}
