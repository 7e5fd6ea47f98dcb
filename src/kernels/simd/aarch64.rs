//! The aarch64 implementation of [`Simd`]: NEON (Advanced SIMD, in every ARMv8-A core), 8 lanes as
//! two 128-bit registers.
//!
//! Two registers per vector keep the shapes the kernels were tuned to on AVX2 (8 lanes, 16
//! vectors in registers: NEON's 32 registers hold 16 pairs) and give each operation two
//! independent instructions, which the four 128-bit FMA pipes of Neoverse V1/V2 need to stay busy
//! on the kernels' dependency chains. bf16 widens with one shift per register (`shll`, `shll2`)
//! and narrows with one unzip per pair (`uzp2` takes the high halves), so the natural channel
//! order costs no shuffles, unlike AVX2's. f16 converts with `fcvtl`/`fcvtn`, which are ARMv8.0
//! (FEAT_FP16 is only for f16 arithmetic); Rust's f16 intrinsics are unstable, so they are written
//! as `asm!`.
//!
//! Comparisons follow x86 where the kernels depend on it: `max`/`min` return the second operand
//! when either is NaN (as `maxps`/`minps`), and `clamp` returns the lower bound for NaN, so clamps
//! behave the same on every ISA.

// Every method below is a thin wrapper over intrinsics whose only precondition is the ISA, which
// the `Simd` contract already puts on the caller; per-call `unsafe` blocks would add only noise.
#![allow(unsafe_op_in_unsafe_fn)]

use super::{Simd, array_of};
use std::arch::aarch64::*;
use std::arch::asm;

/// NEON, 8 lanes in two `float32x4_t` (channels 0..4, then 4..8).
#[derive(Clone, Copy, Debug)]
pub struct Neon;

/// `op` on both registers of a pair.
macro_rules! both {
    ($op:ident($($arg:expr),+)) => {
        [$op($($arg[0]),+), $op($($arg[1]),+)]
    };
}

/// `a > b ? a : b`: the second operand if either is NaN, as x86's `maxps`.
#[inline(always)]
unsafe fn max_x86(a: float32x4_t, b: float32x4_t) -> float32x4_t {
    vbslq_f32(vcgtq_f32(a, b), a, b)
}

/// `a < b ? a : b`, as x86's `minps`.
#[inline(always)]
unsafe fn min_x86(a: float32x4_t, b: float32x4_t) -> float32x4_t {
    vbslq_f32(vcltq_f32(a, b), a, b)
}

/// `a * b + c`, one rounding.
#[inline(always)]
unsafe fn fma4(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
    vfmaq_f32(c, a, b)
}

/// `a * b - c`, one rounding (negating `c` is exact).
#[inline(always)]
unsafe fn fms4(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
    vfmaq_f32(vnegq_f32(c), a, b)
}

/// `2^n` for integral-valued `n` in [-126, 127], built in the exponent bits.
#[inline(always)]
unsafe fn pow2i(n: float32x4_t) -> float32x4_t {
    let biased = vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127));
    vreinterpretq_f32_s32(vshlq_n_s32::<23>(biased))
}

/// `e * 2^n` in two exact halves (`2^128` itself overflows), as AVX2 does.
#[inline(always)]
unsafe fn scale_pow2_4(e: float32x4_t, n: float32x4_t) -> float32x4_t {
    let half = vrndnq_f32(vmulq_f32(n, vdupq_n_f32(0.5)));
    vmulq_f32(vmulq_f32(e, pow2i(half)), pow2i(vsubq_f32(n, half)))
}

/// Each lane's bits shifted left by 23 (see [`Simd::exponent_from_low_bits`]).
#[inline(always)]
unsafe fn exponent_bits(t: float32x4_t) -> float32x4_t {
    vreinterpretq_f32_u32(vshlq_n_u32::<23>(vreinterpretq_u32_f32(t)))
}

/// f32 lanes whose high halves are the lanes rounded to nearest-even bf16, wrong for NaNs: add
/// 0x7fff plus the lowest kept bit.
#[inline(always)]
unsafe fn bf16_rne(v: float32x4_t) -> uint32x4_t {
    let b = vreinterpretq_u32_f32(v);
    let lsb = vandq_u32(vshrq_n_u32::<16>(b), vdupq_n_u32(1));
    vaddq_u32(vaddq_u32(b, vdupq_n_u32(0x7fff)), lsb)
}

/// [`bf16_rne`], except that a NaN, which the carry would corrupt, keeps its high half, quieted
/// (as [`crate::dtype::f32_to_bf16_bits`]). A select, not a branch: three instructions.
#[inline(always)]
unsafe fn bf16_rne_keeping_nans(v: float32x4_t) -> uint32x4_t {
    let ordered = vceqq_f32(v, v);
    let quiet = vorrq_u32(vreinterpretq_u32_f32(v), vdupq_n_u32(0x0040_0000));
    vbslq_u32(ordered, bf16_rne(v), quiet)
}

/// The high halves of `h` as f32 lanes (low halves cleared).
#[inline(always)]
unsafe fn high_halves(h: uint32x4_t) -> float32x4_t {
    vreinterpretq_f32_u32(vandq_u32(h, vdupq_n_u32(0xffff_0000)))
}

/// Stores the high halves of the 8 lanes `[lo, hi]` as 8 consecutive u16 (one unzip).
#[inline(always)]
unsafe fn store_high_halves(p: *mut u16, [lo, hi]: [uint32x4_t; 2]) {
    let halves = vuzp2q_u16(vreinterpretq_u16_u32(lo), vreinterpretq_u16_u32(hi));
    vst1q_u16(p, halves)
}

/// Whether any lane of the pair is NaN.
#[inline(always)]
unsafe fn any_nan_pair(v: [float32x4_t; 2]) -> bool {
    let ordered = vandq_u32(vceqq_f32(v[0], v[0]), vceqq_f32(v[1], v[1]));
    vminvq_u32(ordered) == 0
}

/// [`Simd::canonical_nan`] of one register.
#[inline(always)]
unsafe fn canonical_nan_quad(x: float32x4_t) -> float32x4_t {
    vbslq_f32(vceqq_f32(x, x), x, vdupq_n_f32(f32::NAN))
}

/// 8 f16 (as u16 bits) widened to f32.
#[inline(always)]
unsafe fn f16_to_f32(h: uint16x8_t) -> [float32x4_t; 2] {
    let (lo, hi): (float32x4_t, float32x4_t);
    asm!(
        "fcvtl {lo:v}.4s, {h:v}.4h",
        "fcvtl2 {hi:v}.4s, {h:v}.8h",
        h = in(vreg) h,
        lo = out(vreg) lo,
        hi = out(vreg) hi,
        options(pure, nomem, nostack, preserves_flags),
    );
    [lo, hi]
}

/// 8 f32 narrowed to f16 bits, rounded to nearest-even (the FPCR default), NaNs quieted.
#[inline(always)]
unsafe fn f32_to_f16(v: [float32x4_t; 2]) -> uint16x8_t {
    let h: uint16x8_t;
    asm!(
        "fcvtn {h:v}.4h, {lo:v}.4s",
        "fcvtn2 {h:v}.8h, {hi:v}.4s",
        lo = in(vreg) v[0],
        hi = in(vreg) v[1],
        h = out(vreg) h,
        options(pure, nomem, nostack, preserves_flags),
    );
    h
}

/// One 4 x 4 block of [`super::transpose`]: pairs of rows interleaved by 32 bits, then by 64.
#[inline(always)]
pub(super) unsafe fn transpose4x4(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
    let r: [float32x4_t; 4] = array_of(|i| vld1q_f32(src.add(i * lds)));
    let t = [
        vreinterpretq_f64_f32(vtrn1q_f32(r[0], r[1])),
        vreinterpretq_f64_f32(vtrn2q_f32(r[0], r[1])),
        vreinterpretq_f64_f32(vtrn1q_f32(r[2], r[3])),
        vreinterpretq_f64_f32(vtrn2q_f32(r[2], r[3])),
    ];
    vst1q_f32(dst, vreinterpretq_f32_f64(vtrn1q_f64(t[0], t[2])));
    vst1q_f32(dst.add(ldd), vreinterpretq_f32_f64(vtrn1q_f64(t[1], t[3])));
    vst1q_f32(
        dst.add(2 * ldd),
        vreinterpretq_f32_f64(vtrn2q_f64(t[0], t[2])),
    );
    vst1q_f32(
        dst.add(3 * ldd),
        vreinterpretq_f32_f64(vtrn2q_f64(t[1], t[3])),
    );
}

impl Simd for Neon {
    const LANES: usize = 8;
    const VECTORS_IN_REGISTERS: usize = 16;
    type V = [float32x4_t; 2];

    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        [vdupq_n_f32(x); 2]
    }
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        [vdupq_n_f32(0.0); 2]
    }
    #[inline(always)]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        both!(vaddq_f32(a, b))
    }
    #[inline(always)]
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V {
        both!(vsubq_f32(a, b))
    }
    #[inline(always)]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        both!(vmulq_f32(a, b))
    }
    #[inline(always)]
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V {
        both!(vdivq_f32(a, b))
    }
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        both!(fma4(a, b, c))
    }
    #[inline(always)]
    unsafe fn fms(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        both!(fms4(a, b, c))
    }
    #[inline(always)]
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V {
        both!(max_x86(a, b))
    }
    #[inline(always)]
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V {
        both!(min_x86(a, b))
    }
    /// `fmaxnm` returns `lo` for a NaN `x` and `fminnm` then `lo` too, as x86's rule gives; the
    /// constants are neither NaN nor zero, so no other case differs.
    #[inline(always)]
    unsafe fn clamp(x: Self::V, lo: f32, hi: f32) -> Self::V {
        let (lo, hi) = (vdupq_n_f32(lo), vdupq_n_f32(hi));
        [
            vminnmq_f32(vmaxnmq_f32(x[0], lo), hi),
            vminnmq_f32(vmaxnmq_f32(x[1], lo), hi),
        ]
    }
    #[inline(always)]
    unsafe fn reduce_sum(a: Self::V) -> f32 {
        // Halves first, then `faddp`'s fixed pairwise order: deterministic.
        vaddvq_f32(vaddq_f32(a[0], a[1]))
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> Self::V {
        [vld1q_f32(p), vld1q_f32(p.add(4))]
    }
    #[inline(always)]
    unsafe fn store_f32(p: *mut f32, v: Self::V) {
        vst1q_f32(p, v[0]);
        vst1q_f32(p.add(4), v[1]);
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self::V {
        let h = vld1q_u16(p);
        [
            vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))),
            vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h)),
        ]
    }
    #[inline(always)]
    unsafe fn store_bf16(p: *mut u16, v: Self::V) {
        store_high_halves(p, both!(bf16_rne_keeping_nans(v)))
    }
    #[inline(always)]
    unsafe fn round_bf16(v: Self::V) -> Self::V {
        [
            high_halves(bf16_rne_keeping_nans(v[0])),
            high_halves(bf16_rne_keeping_nans(v[1])),
        ]
    }
    /// Arm, too, keeps a NaN operand's payload (quieted) and makes new NaNs as 0x7fc00000: a
    /// product of bf16 values needs no NaN select.
    #[inline(always)]
    unsafe fn round_bf16_bf16_nans(v: Self::V) -> Self::V {
        [high_halves(bf16_rne(v[0])), high_halves(bf16_rne(v[1]))]
    }
    #[inline(always)]
    unsafe fn store_bf16_bf16_nans(p: *mut u16, v: Self::V) {
        store_high_halves(p, both!(bf16_rne(v)))
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self::V {
        f16_to_f32(vld1q_u16(p))
    }
    #[inline(always)]
    unsafe fn store_f16(p: *mut u16, v: Self::V) {
        vst1q_u16(p, f32_to_f16(v))
    }
    #[inline(always)]
    unsafe fn round_f16(v: Self::V) -> Self::V {
        f16_to_f32(f32_to_f16(v))
    }
    #[inline(always)]
    unsafe fn scale_pow2(e: Self::V, n: Self::V) -> Self::V {
        both!(scale_pow2_4(e, n))
    }
    #[inline(always)]
    unsafe fn round(x: Self::V) -> Self::V {
        both!(vrndnq_f32(x))
    }
    #[inline(always)]
    unsafe fn exponent_from_low_bits(t: Self::V) -> Self::V {
        both!(exponent_bits(t))
    }
    #[inline(always)]
    unsafe fn any_nan(v: Self::V) -> bool {
        any_nan_pair(v)
    }
    #[inline(always)]
    unsafe fn canonical_nan(v: Self::V) -> Self::V {
        both!(canonical_nan_quad(v))
    }
}
