//! The inner loops of ssmk's main kernels, written as the kernels write them (the crate's `Simd`
//! trait, linked from the built library), for llvm-mca's cycle model: `.ci/mca/run` compiles them
//! to assembly for aarch64 (NEON, and the same math in scalar f32) and x86-64 (AVX2) and reports
//! modelled cycles per element. Each function runs a block of `BLOCK` elements (its inner loops
//! have constant trip counts and unroll) per iteration of a loop over blocks, whose body is what
//! llvm-mca measures; the GEMM tile keeps its accumulators in registers across its depth loop,
//! whose body is measured.
#![allow(clippy::missing_safety_doc, unsafe_op_in_unsafe_fn)]

use half::bf16;
use ssmk::kernels::simd::{Simd, SimdElement};

/// Elements each straight-line function processes (a multiple of every vector width).
pub const BLOCK: usize = 32;

/// GEMM micro-tile, 6 rows x 2 vectors (AVX2's and NEON's tile): one depth step per iteration,
/// `12 * LANES` FMA lanes.
#[inline(always)]
unsafe fn gemm_tile<S: Simd>(depth: usize, a: *const f32, b: *const f32, ldb: usize, c: *mut f32) {
    let mut acc = [[S::zero(); 2]; 6];
    let (mut ap, mut bp) = (a, b);
    for _ in 0..depth {
        let bv = [S::load_f32(bp), S::load_f32(bp.add(S::LANES))];
        for (r, row) in acc.iter_mut().enumerate() {
            let av = S::splat(*ap.add(r * 64));
            for (v, x) in row.iter_mut().enumerate() {
                *x = S::fma(av, bv[v], *x);
            }
        }
        ap = ap.add(1);
        bp = bp.add(ldb);
    }
    for (r, row) in acc.iter().enumerate() {
        for (v, x) in row.iter().enumerate() {
            S::store_f32(c.add(r * 2 * S::LANES + v * S::LANES), *x);
        }
    }
}

/// Conv decode, width 4, bf16 activations and state, f32 taps, silu: `BLOCK` channels.
#[inline(always)]
unsafe fn conv_decode<S: Simd>(st: *mut bf16, x: *const bf16, w: *const f32, out: *mut bf16) {
    for c in (0..BLOCK).step_by(S::LANES) {
        let mut acc = S::load_f32(w.add(4 * BLOCK + c));
        let rows = [
            bf16::load::<S>(st.add(c)),
            bf16::load::<S>(st.add(BLOCK + c)),
            bf16::load::<S>(st.add(2 * BLOCK + c)),
            bf16::load::<S>(x.add(c)),
        ];
        for (k, r) in rows.iter().enumerate() {
            acc = S::fma(S::load_f32(w.add(k * BLOCK + c)), *r, acc);
        }
        let one = S::splat(1.0);
        let y = S::div(acc, S::add(one, S::exp(S::sub(S::zero(), acc))));
        bf16::store::<S>(out.add(c), y);
        // The state shifts by one row.
        bf16::store::<S>(st.add(c), rows[1]);
        bf16::store::<S>(st.add(BLOCK + c), rows[2]);
        bf16::store::<S>(st.add(2 * BLOCK + c), rows[3]);
    }
}

/// ShortConv's gates: `round(B * x)` in, `round(C * round(y))` out, bf16: `BLOCK` channels.
#[inline(always)]
unsafe fn short_conv_gates<S: Simd>(
    bcx: *const bf16,
    y: *const f32,
    gin: *mut bf16,
    out: *mut bf16,
) {
    for c in (0..BLOCK).step_by(S::LANES) {
        let b = bf16::load::<S>(bcx.add(c));
        let cg = bf16::load::<S>(bcx.add(BLOCK + c));
        let x = bf16::load::<S>(bcx.add(2 * BLOCK + c));
        bf16::store_product::<S>(gin.add(c), S::mul(b, x));
        let yv = bf16::round::<S>(S::load_f32(y.add(c)));
        bf16::store_product::<S>(out.add(c), S::mul(cg, yv));
    }
}

/// Delta-rule recurrence, one state row of `BLOCK` columns for one token: decay, the `S^T k`
/// accumulation (pass 1) and the rank-1 update with `q` readout (pass 2).
#[inline(always)]
unsafe fn delta_rule_row<S: Simd>(
    s: *mut f32,
    d: *const f32,
    acc: *mut f32,
    o: *mut f32,
    ki: f32,
    qi: f32,
    a: f32,
) {
    let (k, q, decay) = (S::splat(ki), S::splat(qi), S::splat(a));
    for c in (0..BLOCK).step_by(S::LANES) {
        let sv = S::mul(S::load_f32(s.add(c)), decay);
        S::store_f32(acc.add(c), S::fma(k, sv, S::load_f32(acc.add(c))));
        let sv = S::fma(k, S::load_f32(d.add(c)), sv);
        S::store_f32(s.add(c), sv);
        S::store_f32(o.add(c), S::fma(q, sv, S::load_f32(o.add(c))));
    }
}

/// Mamba-2 recurrence, one state row of `BLOCK` channels for one token:
/// `h = a h + (dt x) B`, `y += h C`.
#[inline(always)]
unsafe fn mamba2_row<S: Simd>(
    h: *mut f32,
    b: *const f32,
    c: *const f32,
    y: *mut f32,
    a: f32,
    dtx: f32,
) {
    let (av, dv) = (S::splat(a), S::splat(dtx));
    let mut acc = S::zero();
    for n in (0..BLOCK).step_by(S::LANES) {
        let hv = S::fma(S::load_f32(b.add(n)), dv, S::mul(S::load_f32(h.add(n)), av));
        S::store_f32(h.add(n), hv);
        acc = S::fma(hv, S::load_f32(c.add(n)), acc);
    }
    *y += S::reduce_sum(acc);
}

/// The gates' transcendental: `e^x` over `BLOCK` values (KDA's softplus, silu).
#[inline(always)]
unsafe fn exp_row<S: Simd>(x: *mut f32) {
    for c in (0..BLOCK).step_by(S::LANES) {
        S::store_f32(x.add(c), S::exp(S::load_f32(x.add(c))));
    }
}

/// [`ssmk::dtype::f32_to_bf16_bits`] with a select for NaN rather than a branch, which llvm-mca,
/// reading straight-line code, would count both sides of.
#[inline(always)]
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let quiet = ((b >> 16) | 0x0040) as u16;
    std::hint::select_unpredictable(x.is_nan(), quiet, rounded)
}

/// One lane per instruction: the same kernels as plain scalar f32 code (the vectorizers are off
/// in `.ci/mca/run`), the baseline the SIMD variants are compared with.
#[derive(Clone, Copy)]
pub struct Scalar;

impl Simd for Scalar {
    const LANES: usize = 1;
    const VECTORS_IN_REGISTERS: usize = 32;
    type V = f32;
    unsafe fn splat(x: f32) -> f32 {
        x
    }
    unsafe fn zero() -> f32 {
        0.0
    }
    unsafe fn add(a: f32, b: f32) -> f32 {
        a + b
    }
    unsafe fn sub(a: f32, b: f32) -> f32 {
        a - b
    }
    unsafe fn mul(a: f32, b: f32) -> f32 {
        a * b
    }
    unsafe fn div(a: f32, b: f32) -> f32 {
        a / b
    }
    unsafe fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
    unsafe fn fms(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, -c)
    }
    unsafe fn max(a: f32, b: f32) -> f32 {
        if a > b { a } else { b }
    }
    unsafe fn min(a: f32, b: f32) -> f32 {
        if a < b { a } else { b }
    }
    unsafe fn reduce_sum(a: f32) -> f32 {
        a
    }
    unsafe fn load_f32(p: *const f32) -> f32 {
        *p
    }
    unsafe fn store_f32(p: *mut f32, v: f32) {
        *p = v
    }
    unsafe fn load_bf16(p: *const u16) -> f32 {
        f32::from_bits((*p as u32) << 16)
    }
    unsafe fn store_bf16(p: *mut u16, v: f32) {
        *p = bf16_bits(v)
    }
    unsafe fn load_f16(p: *const u16) -> f32 {
        half::f16::from_bits(*p).to_f32()
    }
    unsafe fn store_f16(p: *mut u16, v: f32) {
        *p = half::f16::from_f32(v).to_bits()
    }
    unsafe fn round_bf16(v: f32) -> f32 {
        f32::from_bits((bf16_bits(v) as u32) << 16)
    }
    unsafe fn round_f16(v: f32) -> f32 {
        half::f16::from_f32(v).to_f32()
    }
    unsafe fn scale_pow2(e: f32, n: f32) -> f32 {
        let half = (n * 0.5).round_ties_even();
        let p = |n: f32| f32::from_bits(((n as i32 + 127) as u32) << 23);
        e * p(half) * p(n - half)
    }
    unsafe fn round(x: f32) -> f32 {
        x.round_ties_even()
    }
    unsafe fn exponent_from_low_bits(t: f32) -> f32 {
        f32::from_bits(t.to_bits() << 23)
    }
    unsafe fn any_nan(v: f32) -> bool {
        v.is_nan()
    }
}

/// Exported, never-inlined instances of every loop for one ISA, named `<isa>_<loop>`. Each but the
/// GEMM runs its block `n` times at advancing addresses, so llvm-mca sees the block as the body of a
/// loop, its constants hoisted as in the kernels.
macro_rules! instantiate {
    ($isa:ident, $S:ty, $features:literal) => {
        pub mod $isa {
            use super::*;
            /// Elements between the blocks of consecutive iterations, in every array.
            const STEP: usize = 4 * BLOCK;
            #[unsafe(export_name = concat!(stringify!($isa), "_gemm"))]
            #[target_feature(enable = $features)]
            pub unsafe fn gemm(
                depth: usize,
                a: *const f32,
                b: *const f32,
                ldb: usize,
                c: *mut f32,
            ) {
                gemm_tile::<$S>(depth, a, b, ldb, c)
            }
            #[unsafe(export_name = concat!(stringify!($isa), "_conv_decode"))]
            #[target_feature(enable = $features)]
            pub unsafe fn conv(
                n: usize,
                st: *mut bf16,
                x: *const bf16,
                w: *const f32,
                out: *mut bf16,
            ) {
                for i in 0..n {
                    let o = i * STEP;
                    conv_decode::<$S>(st.add(o), x.add(o), w.add(o), out.add(o))
                }
            }
            #[unsafe(export_name = concat!(stringify!($isa), "_short_conv_gates"))]
            #[target_feature(enable = $features)]
            pub unsafe fn gates(
                n: usize,
                bcx: *const bf16,
                y: *const f32,
                gin: *mut bf16,
                out: *mut bf16,
            ) {
                for i in 0..n {
                    let o = i * STEP;
                    short_conv_gates::<$S>(bcx.add(o), y.add(o), gin.add(o), out.add(o))
                }
            }
            #[unsafe(export_name = concat!(stringify!($isa), "_delta_rule_row"))]
            #[target_feature(enable = $features)]
            pub unsafe fn delta(
                n: usize,
                s: *mut f32,
                d: *const f32,
                acc: *mut f32,
                o: *mut f32,
                k: f32,
                q: f32,
                a: f32,
            ) {
                for i in 0..n {
                    let x = i * STEP;
                    delta_rule_row::<$S>(s.add(x), d.add(x), acc.add(x), o.add(x), k, q, a)
                }
            }
            #[unsafe(export_name = concat!(stringify!($isa), "_mamba2_row"))]
            #[target_feature(enable = $features)]
            pub unsafe fn mamba2(
                n: usize,
                h: *mut f32,
                b: *const f32,
                c: *const f32,
                y: *mut f32,
                a: f32,
                dtx: f32,
            ) {
                for i in 0..n {
                    let o = i * STEP;
                    mamba2_row::<$S>(h.add(o), b.add(o), c.add(o), y.add(i), a, dtx)
                }
            }
            #[unsafe(export_name = concat!(stringify!($isa), "_exp_row"))]
            #[target_feature(enable = $features)]
            pub unsafe fn exp(n: usize, x: *mut f32) {
                for i in 0..n {
                    exp_row::<$S>(x.add(i * STEP))
                }
            }
        }
    };
}

#[cfg(target_arch = "aarch64")]
instantiate!(neon, ssmk::kernels::simd::Neon, "neon");
#[cfg(target_arch = "aarch64")]
instantiate!(scalar, Scalar, "neon");
#[cfg(target_arch = "x86_64")]
instantiate!(avx2, ssmk::kernels::simd::Avx2, "avx2,fma,f16c");
#[cfg(target_arch = "x86_64")]
instantiate!(avx2pairs, ssmk::kernels::simd::Avx2Pairs, "avx2,fma,f16c");
