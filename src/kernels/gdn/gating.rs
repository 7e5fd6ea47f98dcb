//! `g = -exp(A_log) * softplus(a + dt_bias)`, `beta = sigmoid(b)` (ABI.md §4.3): elementwise over
//! `[N, HV]`, parallel over blocks of rows. O(N * HV) work next to the O(N * HV * K * V) delta rule,
//! so plain f32 with libm-accurate `exp`/`ln_1p` is fast enough and exact enough. Kimi Delta
//! Attention's per-channel gates (§4.8, `[N, HV, K]`) are K times more (as much as the delta
//! rule's own inputs): the scalar form is the reference, the SIMD ISAs take `kda_gate_row`.

use super::{Strided, load_row, read_f32, store_row, write_f32};
use crate::dtype::DType;
use crate::kernels::simd::Simd;
use crate::runtime::{Context, Isa};

/// A validated `ssmk_gdn_gating` call: `A_log`, `dt_bias` `[HV]`; `a`, `b`, `g` (f32), `beta` `[N, HV]`.
#[derive(Clone, Copy, Debug)]
pub struct Gating {
    pub rows: usize,
    pub heads: usize,
    pub a_log: Strided,
    pub a: Strided,
    pub b: Strided,
    pub dt_bias: Strided,
    pub softplus_beta: f32,
    pub softplus_threshold: f32,
    pub g: Strided,
    pub beta: Strided,
}

/// Rows per task: enough work to pay for a task, few enough to share among threads.
const ROWS_PER_TASK: usize = 64;

/// `log1p(exp(beta x)) / beta`, or `x` once `beta x` exceeds the threshold.
#[inline]
pub fn softplus(x: f32, beta: f32, threshold: f32) -> f32 {
    let bx = beta * x;
    if bx > threshold {
        x
    } else {
        bx.exp().ln_1p() / beta
    }
}

/// Sigmoid that never overflows: `1 / (1 + e^-x)` for `x >= 0`, `e^x / (1 + e^x)` below.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// # Safety
/// `args` must describe validated memory; `g` and `beta` must not overlap the inputs or each other.
pub unsafe fn gdn_gating(ctx: &Context, args: &Gating) {
    let heads = args.heads;
    // Per-head constants once.
    let neg_a: Vec<f32> = (0..heads)
        .map(|h| -unsafe { read_f32(args.a_log.at(&[h]), args.a_log.dtype) }.exp())
        .collect();
    let bias: Vec<f32> = (0..heads)
        .map(|h| unsafe { read_f32(args.dt_bias.at(&[h]), args.dt_bias.dtype) })
        .collect();
    for_each_row(ctx, args.rows, |n| {
        for h in 0..heads {
            // SAFETY: (n, h) lies in the validated [N, HV]; each row is written by one task.
            unsafe {
                let a = read_f32(args.a.at(&[n, h]), args.a.dtype);
                let b = read_f32(args.b.at(&[n, h]), args.b.dtype);
                let sp = softplus(a + bias[h], args.softplus_beta, args.softplus_threshold);
                write_f32(args.g.at(&[n, h]), DType::F32, neg_a[h] * sp);
                write_f32(args.beta.at(&[n, h]), args.beta.dtype, sigmoid(b));
            }
        }
    });
}

/// Runs `row(n)` for every row `n < rows`, [`ROWS_PER_TASK`] rows per task.
fn for_each_row(ctx: &Context, rows: usize, row: impl Fn(usize) + Send + Sync) {
    ctx.for_each(rows.div_ceil(ROWS_PER_TASK), |task| {
        (task * ROWS_PER_TASK..((task + 1) * ROWS_PER_TASK).min(rows)).for_each(&row)
    });
}

/// A validated `ssmk_kda_gating` call (ABI.md §4.8): `A_log` `[HV]` f32, `a` and `g` `[N, HV, K]`
/// (g f32), `dt_bias` `[HV, K]` f32 (a `[HV*K]` one viewed so), `b` and `beta` `[N, HV]`.
#[derive(Clone, Copy, Debug)]
pub struct KdaGating {
    pub rows: usize,
    pub heads: usize,
    pub k_dim: usize,
    pub a_log: Strided,
    pub a: Strided,
    pub dt_bias: Option<Strided>,
    /// `0`: Kimi Linear's `-exp(A_log) softplus(x)`; `< 0`: the bounded
    /// `lower_bound * sigmoid(exp(A_log) x)` of GLM-5-Next and Ling.
    pub lower_bound: f32,
    /// `(b, beta)`: `beta = sigmoid(b)` as well.
    pub beta: Option<(Strided, Strided)>,
    pub g: Strided,
}

/// The softplus of Kimi Linear's gate (beta 1, threshold 20).
#[inline]
fn kda_softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// `log(1 + y)` for `y` in `[0, 1]` as `2 atanh(s)`, `s = y / (2 + y)` in `[0, 1/3]`: the odd
/// series to `s^15` (the next term is below 2e-9 relative), with no range reduction or branches.
#[inline(always)]
unsafe fn log1p_unit<S: Simd>(y: S::V) -> S::V {
    unsafe {
        let s = S::div(y, S::add(S::splat(2.0), y));
        let s2 = S::mul(s, s);
        let mut p = S::splat(1.0 / 15.0);
        for c in [
            1.0 / 13.0,
            1.0 / 11.0,
            1.0 / 9.0,
            1.0 / 7.0,
            1.0 / 5.0,
            1.0 / 3.0,
            1.0,
        ] {
            p = S::fma(p, s2, S::splat(c));
        }
        S::mul(S::add(s, s), p)
    }
}

/// `log(1 + e^x)` as `max(x, 0) + log1p(e^-|x|)`: within 3.3 ulp of f64 over [-30, 30], and `x`
/// to the last bit past 20, so it equals the thresholded softplus of ABI.md §4.8 there.
#[inline(always)]
pub(crate) unsafe fn softplus_v<S: Simd>(x: S::V) -> S::V {
    unsafe {
        let neg_abs = S::min(x, S::sub(S::zero(), x));
        S::add(S::max(x, S::zero()), log1p_unit::<S>(S::exp(neg_abs)))
    }
}

/// `1 / (1 + e^-x)`; the clamped vector exp keeps it finite everywhere.
#[inline(always)]
unsafe fn sigmoid_v<S: Simd>(x: S::V) -> S::V {
    unsafe {
        let one = S::splat(1.0);
        S::div(one, S::add(one, S::exp(S::sub(S::zero(), x))))
    }
}

/// The gates of row `n` (every head) with `S`'s vectors: `bias` is `dt_bias` as `[HV][kp]`
/// (zero-padded, `kp` a multiple of the lanes), `buf` has `kp` floats. Softplus is taken as
/// `max(x, 0) + log1p(e^-|x|)`, which is `x` to the last bit past Kimi's threshold of 20.
///
/// # Safety
/// As for [`kda_gating`]; the CPU supports `S`; `n < N`.
#[inline(always)]
pub(crate) unsafe fn kda_gate_row<S: Simd>(
    args: &KdaGating,
    a_scale: &[f32],
    bias: &[f32],
    n: usize,
    buf: &mut [f32],
) {
    let (k, kp, l) = (args.k_dim, buf.len(), S::LANES);
    for h in 0..args.heads {
        unsafe {
            load_row(
                args.a.at(&[n, h]),
                args.a.dtype,
                args.a.strides[2],
                &mut buf[..k],
            );
            let scale = S::splat(a_scale[h]);
            let mut c = 0;
            while c < kp {
                let p = buf.as_mut_ptr().add(c);
                let x = S::add(S::load_f32(p), S::load_f32(bias.as_ptr().add(h * kp + c)));
                let (g, arg) = if args.lower_bound == 0.0 {
                    (S::sub(S::zero(), S::mul(scale, softplus_v::<S>(x))), x)
                } else {
                    let arg = S::mul(scale, x);
                    (S::mul(S::splat(args.lower_bound), sigmoid_v::<S>(arg)), arg)
                };
                S::store_f32(p, g);
                if S::any_nan(arg) {
                    // The vector exp clamps its argument, which would make a NaN gate argument
                    // (a NaN input, or exp(A_log) = inf times 0) a finite gate; the scalar
                    // reference gives NaN there, and so does this.
                    let mut lanes = [0f32; 16];
                    S::store_f32(lanes.as_mut_ptr(), arg);
                    for (j, &v) in lanes[..l].iter().enumerate() {
                        if v.is_nan() {
                            *p.add(j) = v;
                        }
                    }
                }
                c += l;
            }
            store_row(args.g.at(&[n, h]), DType::F32, args.g.strides[2], &buf[..k]);
            if let Some((b, beta)) = &args.beta {
                let v = sigmoid(read_f32(b.at(&[n, h]), b.dtype));
                write_f32(beta.at(&[n, h]), beta.dtype, v);
            }
        }
    }
}

/// Runs KDA's gating with the implementation for `isa` (`Isa::Scalar`: the scalar reference).
///
/// # Safety
/// `args` must describe validated memory; `g` and `beta` must not overlap the inputs or each other;
/// the CPU supports `isa`.
pub unsafe fn kda_gating(ctx: &Context, isa: Isa, args: &KdaGating) {
    let (heads, k_dim) = (args.heads, args.k_dim);
    // No element: nothing to do. `K` is then unbounded by any memory (`a` is [N, 0, K]), and
    // the vector rows' scratch of `K` floats would be an allocation of any size.
    if heads == 0 || args.rows == 0 || k_dim == 0 {
        return;
    }
    let a_scale: Vec<f32> = (0..heads)
        .map(|h| unsafe { read_f32(args.a_log.at(&[h]), DType::F32) }.exp())
        .collect();
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if isa > Isa::Scalar {
        let kp = k_dim.next_multiple_of(16);
        let mut bias = vec![0f32; heads * kp];
        if let Some(d) = &args.dt_bias {
            for h in 0..heads {
                for c in 0..k_dim {
                    bias[h * kp + c] = unsafe { read_f32(d.at(&[h, c]), DType::F32) };
                }
            }
        }
        let row = super::driver::kda_gate_row(isa);
        for_each_row(ctx, args.rows, |n| {
            let mut buf = vec![0f32; kp];
            // SAFETY: as for this function; each row is written by one task.
            unsafe { row(args, &a_scale, &bias, n, &mut buf) }
        });
        return;
    }
    let _ = isa;
    for_each_row(ctx, args.rows, |n| {
        for h in 0..heads {
            // SAFETY: (n, h, k) lies in the validated [N, HV, K] (and [HV, K], [N, HV]); each
            // row is written by one task.
            unsafe {
                for k in 0..k_dim {
                    let bias = args
                        .dt_bias
                        .map_or(0.0, |d| read_f32(d.at(&[h, k]), DType::F32));
                    let x = read_f32(args.a.at(&[n, h, k]), args.a.dtype) + bias;
                    let g = match args.lower_bound == 0.0 {
                        true => -a_scale[h] * kda_softplus(x),
                        false => args.lower_bound * sigmoid(a_scale[h] * x),
                    };
                    write_f32(args.g.at(&[n, h, k]), DType::F32, g);
                }
                if let Some((b, beta)) = &args.beta {
                    let v = sigmoid(read_f32(b.at(&[n, h]), b.dtype));
                    write_f32(beta.at(&[n, h]), beta.dtype, v);
                }
            }
        }
    });
}
