//! The chunked WY form for long prefills (chunks of [`CHUNK`] tokens; the last one may be short).
//!
//! Within a chunk, with `G` the inclusive cumulative sum of `g` and `S0` the state at its start,
//! the per-token recurrence is exactly
//! `A = strict_lower(beta_i (k_i . k_j) e^(G_i - G_j))`, `T = (I + A)^-1`,
//! `w = T (k * beta * e^G)`, `u = T (v * beta)`, `v' = u - w S0`,
//! `o = (q * e^G) S0 + (q k^T o decay, lower incl. diagonal) v'`,
//! `S = e^(G_last) S0 + (k * e^(G_last - G))^T v'`.
//! Pass 1 ([`intra`], one task per (chunk, q/k head), `k k^T` and `q k^T` shared by the v-heads of
//! the group) stores `-w`, `u`, the masked `P = q k^T o decay` and `G` in scratch; pass 2
//! ([`inter`], one task per (sequence, v-head)) runs the chunks of the sequence in order.
//! Everything is f32; the state stays f32 for the whole sequence.
//!
//! Per-channel decays (KDA) make `G` a `K`-vector per token, so `e^(G_i - G_j)` no longer factors
//! out of `k k^T`, and `e^(+G)` of a chunk (up to `e^(64*20)`) cannot be formed. [`intra`] then
//! works from the per-token decays `a = e^g <= 1` only: every factor it forms is a product of
//! consecutive `a`s (so `<= 1`, accurate to a few ulps, never a difference of large cumulative
//! sums). The chunk is cut into sub-chunks of [`SUB`] tokens; for rows of sub-chunk `I` (from
//! token `n`) and columns `j < n`, `e^(G_i - G_j) = e^(G_i - G_(n-1)) e^(G_(n-1) - G_j)`, both
//! factors `<= 1`, so those blocks of `k k^T` and `q k^T` are one GEMM per sub-chunk; the
//! diagonal blocks are summed pair by pair with the running product. Pass 1 then also stores
//! `q * e^G`, `k * e^(G_last - G)` and `e^(G_last)` per v-head for pass 2.

use super::{
    CHUNK, DeltaRule, PREFETCH_TOKENS, Sequence, StateWrite, load_row, prefetch_l2, store_row,
};
pub use crate::kernels::chunking::Chunk;
use crate::kernels::gemm::{MatA, gemm};
use crate::kernels::simd::{Simd, exp_into};

const C: usize = CHUNK;

/// Tokens per sub-chunk of the per-channel form: the diagonal blocks cost `SUB (SUB+1) / 2` pair
/// sums each, the off-diagonal ones are GEMMs of `2 * SUB` columns (q and k rows side by side).
const SUB: usize = 16;

/// Decays below this flush to zero in running products, which would otherwise reach denormals
/// (slow on some CPUs) for fast-decaying channels; the error is below `2^-60` absolute.
const FLUSH: f32 = 8.673_617e-19; // 2^-60

/// Scratch layout of one wave of q/k heads `first_head .. first_head + heads` (and their v-heads),
/// in f32 elements, per chunk: for each q/k head `[2][C][K]` (normalised q, k), then for each
/// v-head `-w [C][K]`, `u [C][V]`, `P [C][C]` and the decays: `G [C]`, or with per-channel decays
/// `q e^G [C][Kp]`, `k e^(G_last - G) [C][Kp]`, `e^(G_last) [Kp]` (`Kp` = [`padded_k`]).
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub first_head: usize,
    pub heads: usize,
    /// v-heads per q/k head.
    pub group: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub per_channel: bool,
}

impl Layout {
    fn qk_size(&self) -> usize {
        2 * C * self.k_dim
    }
    fn decays_size(&self) -> usize {
        match self.per_channel {
            true => (2 * C + 1) * padded_k(self.k_dim),
            false => C,
        }
    }
    fn head_size(&self) -> usize {
        C * self.k_dim + C * self.v_dim + C * C + self.decays_size()
    }
    pub fn chunk_size(&self) -> usize {
        self.heads * self.qk_size() + self.heads * self.group * self.head_size()
    }
    /// Normalised q of chunk `c`, head `h` (k follows at `+ C*K`).
    fn qk(&self, base: *mut f32, c: usize, h: usize) -> *mut f32 {
        base.wrapping_add(c * self.chunk_size() + (h - self.first_head) * self.qk_size())
    }
    /// `-w` of chunk `c`, v-head number `j` of q/k head `h`; `u`, `P`, the decays follow.
    fn head(&self, base: *mut f32, c: usize, h: usize, j: usize) -> HeadScratch {
        let w = base.wrapping_add(
            c * self.chunk_size()
                + self.heads * self.qk_size()
                + ((h - self.first_head) * self.group + j) * self.head_size(),
        );
        let u = w.wrapping_add(C * self.k_dim);
        let p = u.wrapping_add(C * self.v_dim);
        let g = p.wrapping_add(C * C);
        HeadScratch { w, u, p, g }
    }
}

struct HeadScratch {
    w: *mut f32,
    u: *mut f32,
    p: *mut f32,
    /// `G`, or `q e^G`, `k e^(G_last - G)`, `e^(G_last)` (see [`Layout`]).
    g: *mut f32,
}

/// Row `i` of `T = (I + A)^-1` by forward substitution, `T[i] = e_i - sum_{l<i} A[i][l] T[l]`,
/// from `a[l] = A[i][l]` and rows `0..i` of `tinv` (row-major, `C` columns, zero right of their
/// diagonal). Each vector block of the row is summed in registers over the rows `l` that reach it
/// (rows are zero right of their diagonal), in four interleaved sums that hide the FMA latency:
/// row-by-row updates of the row in memory ran as short, dependent, partly scalar loops.
///
/// # Safety
/// `tinv` holds `C * C` floats; row `i` is zero.
#[inline(always)]
unsafe fn inverse_row<S: Simd>(tinv: *mut f32, i: usize, a: &[f32]) {
    const SUMS: usize = 4;
    let lanes = S::LANES;
    debug_assert!(C.is_multiple_of(lanes) && a.len() == i);
    let mut col = 0;
    while col <= i {
        unsafe {
            let mut acc = [S::zero(); SUMS];
            let mut l = col;
            while l + SUMS <= i {
                for (u, sum) in acc.iter_mut().enumerate() {
                    let t = S::load_f32(tinv.add((l + u) * C + col));
                    *sum = S::fma(S::splat(a[l + u]), t, *sum);
                }
                l += SUMS;
            }
            for (sum, l) in acc.iter_mut().zip(l..i) {
                *sum = S::fma(S::splat(a[l]), S::load_f32(tinv.add(l * C + col)), *sum);
            }
            let sum = S::add(S::add(acc[0], acc[1]), S::add(acc[2], acc[3]));
            S::store_f32(tinv.add(i * C + col), S::sub(S::zero(), sum));
        }
        col += lanes;
    }
    unsafe { *tinv.add(i * C + i) = 1.0 };
}

/// Pass 1 for chunk `c` and q/k head `h`.
///
/// # Safety
/// `scratch` is laid out by `layout` for every chunk; this task alone writes chunk `c`'s head `h`
/// q/k block and the blocks of the v-heads of group `h`.
#[inline(always)]
pub unsafe fn intra<S: Simd>(
    args: &DeltaRule,
    layout: &Layout,
    scratch: *mut f32,
    c: usize,
    chunk: Chunk,
    h: usize,
) {
    let (kd, vd, m) = (args.k_dim, args.v_dim, chunk.len);
    let qn = layout.qk(scratch, c, h);
    let kn = qn.wrapping_add(C * kd);
    unsafe {
        for i in 0..m {
            let qrow = std::slice::from_raw_parts_mut(qn.add(i * kd), kd);
            let krow = std::slice::from_raw_parts_mut(kn.add(i * kd), kd);
            args.load_qk(chunk.start + i, h, qrow, krow);
        }
    }
    if args.per_channel {
        return unsafe { intra_per_channel::<S>(args, layout, scratch, c, chunk, h) };
    }
    // k^T [K x C], so k k^T and q k^T are plain GEMMs.
    let mut kt = vec![0f32; kd * C];
    for i in 0..m {
        for r in 0..kd {
            kt[r * C + i] = unsafe { *kn.add(i * kd + r) };
        }
    }
    // Only the lower triangles of k k^T and q k^T are used: per band of 16 rows, columns up to
    // the band's end (about 60% of the full products).
    let mut kk = vec![0f32; C * C];
    let mut qk = vec![0f32; C * C];
    const BAND: usize = 16;
    let mut r0 = 0;
    while r0 < m {
        let rows = BAND.min(m - r0);
        let cols = m.min(r0 + BAND);
        for (src, dst) in [(kn, &mut kk), (qn, &mut qk)] {
            let a = MatA {
                ptr: src.wrapping_add(r0 * kd),
                row_stride: kd,
                col_stride: 1,
            };
            unsafe {
                gemm::<S>(
                    rows,
                    cols,
                    kd,
                    a,
                    kt.as_ptr(),
                    C,
                    dst.as_mut_ptr().add(r0 * C),
                    C,
                    false,
                    false,
                )
            };
        }
        r0 += rows;
    }
    let group = args.v_heads / args.heads;
    let mut decay_row = [0f32; C];
    let mut diff = [0f32; C];
    let mut tinv = vec![0f32; C * C];
    let mut a_row = [0f32; C];
    let mut x = vec![0f32; C * kd];
    let mut y = vec![0f32; C * vd];
    let mut beta = [0f32; C];
    let mut eg = [0f32; C];
    for j in 0..group {
        let hv = args.v_head(h, j);
        let hs = layout.head(scratch, c, h, j);
        // Cumulative log-decay.
        let gcum = unsafe { std::slice::from_raw_parts_mut(hs.g, m) };
        let mut run = 0f32;
        for i in 0..m {
            let (g, b) = unsafe { args.gate(chunk.start + i, hv) };
            run += g;
            gcum[i] = run;
            beta[i] = b;
        }
        unsafe { exp_into::<S>(gcum, &mut eg[..m]) };
        let p = unsafe { std::slice::from_raw_parts_mut(hs.p, C * C) };
        tinv.iter_mut().for_each(|t| *t = 0.0);
        for i in 0..m {
            for j in 0..=i {
                diff[j] = gcum[i] - gcum[j];
            }
            unsafe { exp_into::<S>(&diff[..=i], &mut decay_row[..=i]) };
            // P row i (lower incl. diagonal), zeros to the right up to m.
            for j in 0..=i {
                p[i * C + j] = qk[i * C + j] * decay_row[j];
            }
            p[i * C + i + 1..i * C + m]
                .iter_mut()
                .for_each(|x| *x = 0.0);
            // A[i][l] = beta_i kk[i][l] decay[i][l].
            for l in 0..i {
                a_row[l] = beta[i] * kk[i * C + l] * decay_row[l];
            }
            unsafe { inverse_row::<S>(tinv.as_mut_ptr(), i, &a_row[..i]) };
        }
        for i in 0..m {
            let f = -beta[i] * eg[i];
            for r in 0..kd {
                x[i * kd + r] = unsafe { *kn.add(i * kd + r) } * f;
            }
        }
        unsafe { store_wu::<S>(args, chunk, hv, &hs, &tinv, (&x, kd), &mut y, &beta[..m]) };
    }
}

/// `-w = T x` and `u = T (v * beta)` into a v-head's scratch, from `x = -k * beta * e^G` (rows
/// `ldx` apart) and `T = (I + A)^-1` (`C` columns); `y` is `[C][V]` room for `v * beta`.
///
/// # Safety
/// As for [`intra`]; `hs` is v-head `hv`'s scratch of this chunk.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn store_wu<S: Simd>(
    args: &DeltaRule,
    chunk: Chunk,
    hv: usize,
    hs: &HeadScratch,
    tinv: &[f32],
    (x, ldx): (&[f32], usize),
    y: &mut [f32],
    beta: &[f32],
) {
    let (kd, vd, m) = (args.k_dim, args.v_dim, chunk.len);
    for (i, &b) in beta.iter().enumerate() {
        args.prefetch_v(chunk.start + i + PREFETCH_TOKENS, hv, false);
        let row = &mut y[i * vd..(i + 1) * vd];
        unsafe {
            load_row(
                args.v.at(&[chunk.start + i, hv]),
                args.v.dtype,
                args.v.strides[2],
                row,
            )
        };
        row.iter_mut().for_each(|v| *v *= b);
    }
    let t = MatA {
        ptr: tinv.as_ptr(),
        row_stride: C,
        col_stride: 1,
    };
    unsafe {
        gemm::<S>(m, kd, m, t, x.as_ptr(), ldx, hs.w, kd, false, true);
        gemm::<S>(m, vd, m, t, y.as_ptr(), vd, hs.u, vd, false, true);
    }
}

/// `max(e * a - 2^-60, 0)`: the next running product of decays, flushed before it can be denormal
/// (the fused multiply-subtract rounds once, so values above `2^-36` are exactly `e * a`).
#[inline(always)]
unsafe fn decay_product<S: Simd>(e: S::V, a: S::V) -> S::V {
    unsafe { S::max(S::fma(e, a, S::splat(-FLUSH)), S::zero()) }
}

/// `dst = x * y * f` over `n` floats (`n` a multiple of `S::LANES`).
///
/// # Safety
/// Each pointer addresses `n` floats.
#[inline(always)]
unsafe fn mul_rows<S: Simd>(x: *const f32, y: *const f32, f: f32, dst: *mut f32, n: usize) {
    let mut r = 0;
    unsafe {
        let f = S::splat(f);
        while r < n {
            let xy = S::mul(S::load_f32(x.add(r)), S::load_f32(y.add(r)));
            S::store_f32(dst.add(r), S::mul(xy, f));
            r += S::LANES;
        }
    }
}

/// Row length of the per-channel work: `K` rounded up to 16 floats (a whole number of vectors on
/// every ISA), the padding lanes holding `q = k = 0` and `a = 1`.
pub(crate) fn padded_k(k_dim: usize) -> usize {
    k_dim.next_multiple_of(16)
}

/// `dst = decay_product(e, a)` over `n` floats (`n` a multiple of `S::LANES`).
///
/// # Safety
/// Each pointer addresses `n` floats.
#[inline(always)]
unsafe fn product_rows<S: Simd>(e: *const f32, a: *const f32, dst: *mut f32, n: usize) {
    let mut r = 0;
    while r < n {
        unsafe {
            S::store_f32(
                dst.add(r),
                decay_product::<S>(S::load_f32(e.add(r)), S::load_f32(a.add(r))),
            )
        };
        r += S::LANES;
    }
}

/// One pair `(i, j)` of a diagonal block: with `step` (`i > j`), first `e *= a_i` (flushed) in
/// place; then `(k_i . (k_j e), q_i . (k_j e))` over `kp` floats (a multiple of `S::LANES`), two
/// vectors at a time in separate sums so the accumulators stay in registers.
///
/// # Safety
/// Every pointer addresses `kp` floats; `e` is not aliased.
#[inline(always)]
unsafe fn diagonal_pair<S: Simd>(
    e: *mut f32,
    step: Option<*const f32>,
    kj: *const f32,
    [ki, qi]: [*const f32; 2],
    kp: usize,
) -> (f32, f32) {
    let l = S::LANES;
    let mut acc = unsafe { [S::zero(); 4] };
    let mut r = 0;
    unsafe {
        let weight = |r: usize| {
            let mut ev = S::load_f32(e.add(r));
            if let Some(a) = step {
                ev = decay_product::<S>(ev, S::load_f32(a.add(r)));
                S::store_f32(e.add(r), ev);
            }
            S::mul(S::load_f32(kj.add(r)), ev)
        };
        while r + 2 * l <= kp {
            let (t0, t1) = (weight(r), weight(r + l));
            acc[0] = S::fma(S::load_f32(ki.add(r)), t0, acc[0]);
            acc[1] = S::fma(S::load_f32(ki.add(r + l)), t1, acc[1]);
            acc[2] = S::fma(S::load_f32(qi.add(r)), t0, acc[2]);
            acc[3] = S::fma(S::load_f32(qi.add(r + l)), t1, acc[3]);
            r += 2 * l;
        }
        if r < kp {
            let t0 = weight(r);
            acc[0] = S::fma(S::load_f32(ki.add(r)), t0, acc[0]);
            acc[2] = S::fma(S::load_f32(qi.add(r)), t0, acc[2]);
        }
        (
            S::reduce_sum(S::add(acc[0], acc[1])),
            S::reduce_sum(S::add(acc[2], acc[3])),
        )
    }
}

/// Pass 1 with per-channel decays, for every v-head of q/k head `h` (see the module doc). Rows
/// of the per-channel work are padded to `kp` (a multiple of 16) with `q = k = 0`, `a = 1`.
///
/// # Safety
/// As for [`intra`]; the normalised q and k of the chunk are in the scratch.
#[inline(always)]
unsafe fn intra_per_channel<S: Simd>(
    args: &DeltaRule,
    layout: &Layout,
    scratch: *mut f32,
    c: usize,
    chunk: Chunk,
    h: usize,
) {
    let (kd, vd, m) = (args.k_dim, args.v_dim, chunk.len);
    let kp = padded_k(kd);
    let qn = layout.qk(scratch, c, h);
    let kn = qn.wrapping_add(C * kd);
    let padded = |src: *const f32| {
        let mut rows = vec![0f32; C * kp];
        for i in 0..m {
            let row = unsafe { std::slice::from_raw_parts(src.add(i * kd), kd) };
            rows[i * kp..i * kp + kd].copy_from_slice(row);
        }
        rows
    };
    let (qp, kpd) = (padded(qn), padded(kn));
    // Per token: a = e^g, the running products e^G (from the chunk start), e^(G_i - G_(n-1))
    // (from the sub-chunk start), and scratch rows for the column factors.
    let mut a = vec![1f32; C * kp];
    let mut eg = vec![0f32; C * kp];
    let mut rowf = vec![0f32; C * kp];
    let mut cols = vec![0f32; C * kp];
    let mut run = vec![0f32; kp];
    // Transposed `[k | q] * rowf` of one sub-chunk (`kp x 2*SUB`) and its products with `cols`.
    let mut bt = vec![0f32; kp * 2 * SUB];
    let mut kq = vec![0f32; C * 2 * SUB];
    let mut kk = vec![0f32; C * C];
    let mut qk = vec![0f32; C * C];
    let mut tinv = vec![0f32; C * C];
    let mut a_row = [0f32; C];
    let mut x = vec![0f32; C * kp];
    let mut y = vec![0f32; C * vd];
    let mut beta = [0f32; C];
    let mut g_row = vec![0f32; kd];
    for j in 0..layout.group {
        let hv = args.v_head(h, j);
        let hs = layout.head(scratch, c, h, j);
        unsafe {
            for i in 0..m {
                beta[i] = args.gate(chunk.start + i, hv).1;
                args.log_decays(chunk.start + i, hv, &mut g_row);
                exp_into::<S>(&g_row, &mut a[i * kp..i * kp + kd]);
            }
            let (ap, egp) = (a.as_ptr(), eg.as_mut_ptr());
            // e^G_i = a_0 ... a_i; q e^G and -beta k e^G, and e^(G_last).
            std::ptr::copy_nonoverlapping(ap, egp, kp);
            for i in 1..m {
                product_rows::<S>(egp.add((i - 1) * kp), ap.add(i * kp), egp.add(i * kp), kp);
            }
            let (qg, kdec, elast) = (hs.g, hs.g.add(C * kp), hs.g.add(2 * C * kp));
            for i in 0..m {
                let (q, k, e) = (qp.as_ptr(), kpd.as_ptr(), egp.add(i * kp));
                mul_rows::<S>(q.add(i * kp), e, 1.0, qg.add(i * kp), kp);
                mul_rows::<S>(k.add(i * kp), e, -beta[i], x.as_mut_ptr().add(i * kp), kp);
            }
            std::ptr::copy_nonoverlapping(egp.add((m - 1) * kp), elast, kp);
            // k e^(G_last - G_i), with the suffix product a_(i+1) ... a_last.
            run.iter_mut().for_each(|x| *x = 1.0);
            for i in (0..m).rev() {
                if i + 1 < m {
                    product_rows::<S>(run.as_ptr(), ap.add((i + 1) * kp), run.as_mut_ptr(), kp);
                }
                mul_rows::<S>(
                    kpd.as_ptr().add(i * kp),
                    run.as_ptr(),
                    1.0,
                    kdec.add(i * kp),
                    kp,
                );
            }
            let mut n = 0;
            while n < m {
                let rs = SUB.min(m - n);
                // rowf_i = a_n ... a_i over the sub-chunk.
                let rf = rowf.as_mut_ptr();
                std::ptr::copy_nonoverlapping(ap.add(n * kp), rf.add(n * kp), kp);
                for i in n + 1..n + rs {
                    product_rows::<S>(rf.add((i - 1) * kp), ap.add(i * kp), rf.add(i * kp), kp);
                }
                if n > 0 {
                    // Columns j < n: k_j a_(j+1) ... a_(n-1); rows: [k_i | q_i] rowf_i.
                    run.iter_mut().for_each(|x| *x = 1.0);
                    for jj in (0..n).rev() {
                        if jj + 1 < n {
                            product_rows::<S>(
                                run.as_ptr(),
                                ap.add((jj + 1) * kp),
                                run.as_mut_ptr(),
                                kp,
                            );
                        }
                        mul_rows::<S>(
                            kpd.as_ptr().add(jj * kp),
                            run.as_ptr(),
                            1.0,
                            cols.as_mut_ptr().add(jj * kp),
                            kp,
                        );
                    }
                    // Columns of bt past `rs` keep stale (finite) values: their products are
                    // never read.
                    let btp = bt.as_mut_ptr();
                    for cc in 0..rs {
                        let (i, tmp) = (n + cc, run.as_mut_ptr());
                        for (src, col) in [(kpd.as_ptr(), cc), (qp.as_ptr(), SUB + cc)] {
                            mul_rows::<S>(src.add(i * kp), rf.add(i * kp), 1.0, tmp, kp);
                            for r in 0..kd {
                                *btp.add(r * 2 * SUB + col) = *tmp.add(r);
                            }
                        }
                    }
                    let cols_a = MatA {
                        ptr: cols.as_ptr(),
                        row_stride: kp,
                        col_stride: 1,
                    };
                    gemm::<S>(
                        n,
                        2 * SUB,
                        kd,
                        cols_a,
                        bt.as_ptr(),
                        2 * SUB,
                        kq.as_mut_ptr(),
                        2 * SUB,
                        false,
                        false,
                    );
                    let (kqp, kkp, qkp) = (kq.as_ptr(), kk.as_mut_ptr(), qk.as_mut_ptr());
                    for cc in 0..rs {
                        let i = n + cc;
                        for jj in 0..n {
                            *kkp.add(i * C + jj) = *kqp.add(jj * 2 * SUB + cc);
                            *qkp.add(i * C + jj) = *kqp.add(jj * 2 * SUB + SUB + cc);
                        }
                    }
                }
                // The diagonal block, pair by pair: e = a_(j+1) ... a_i, kk = k_i . (k_j e).
                for jj in n..n + rs {
                    run.iter_mut().for_each(|x| *x = 1.0);
                    let kj = kpd.as_ptr().add(jj * kp);
                    for i in jj..n + rs {
                        let rows = [kpd.as_ptr().add(i * kp), qp.as_ptr().add(i * kp)];
                        let step = (i > jj).then(|| ap.add(i * kp));
                        let (kk_ij, qk_ij) =
                            diagonal_pair::<S>(run.as_mut_ptr(), step, kj, rows, kp);
                        kk[i * C + jj] = kk_ij;
                        qk[i * C + jj] = qk_ij;
                    }
                }
                n += rs;
            }
        }
        // P = q k^T o decay (lower incl. diagonal); T row by row from A = beta_i (k k^T o decay).
        let p = unsafe { std::slice::from_raw_parts_mut(hs.p, C * C) };
        tinv.iter_mut().for_each(|t| *t = 0.0);
        for i in 0..m {
            p[i * C..i * C + i + 1].copy_from_slice(&qk[i * C..i * C + i + 1]);
            p[i * C + i + 1..i * C + m]
                .iter_mut()
                .for_each(|x| *x = 0.0);
            for l in 0..i {
                a_row[l] = beta[i] * kk[i * C + l];
            }
            unsafe { inverse_row::<S>(tinv.as_mut_ptr(), i, &a_row[..i]) };
        }
        unsafe { store_wu::<S>(args, chunk, hv, &hs, &tinv, (&x, kp), &mut y, &beta[..m]) };
    }
}

/// Pass 2 for one (sequence, v-head) over its chunks `chunks` (global chunk indices from `first`).
///
/// # Safety
/// Pass 1 has filled the scratch of these chunks; this task alone reads and writes their v-head
/// `hv` blocks, the sequence's output rows for `hv` and its state slot for `hv`.
#[inline(always)]
pub unsafe fn inter<S: Simd>(
    args: &DeltaRule,
    layout: &Layout,
    scratch: *mut f32,
    seq: &Sequence,
    first: usize,
    chunks: &[Chunk],
    hv: usize,
) {
    let (kd, vd) = (args.k_dim, args.v_dim);
    let (h, j) = (args.qk_head(hv), args.member(hv));
    let mut s = vec![0f32; kd * vd];
    let st = args.state.as_ref();
    if let Some(slot) = seq.read {
        let st = st.expect("state slot without a state tensor");
        for r in 0..kd {
            unsafe {
                load_row(
                    st.at(&[slot, hv, r]),
                    st.dtype,
                    st.strides[3],
                    &mut s[r * vd..(r + 1) * vd],
                )
            };
        }
    }
    let mut qg = vec![0f32; C * kd];
    let mut kdec = vec![0f32; C * kd];
    let mut o = vec![0f32; C * vd];
    let mut eg = [0f32; C];
    let mut etail = [0f32; C];
    let mut tmp = [0f32; C];
    let out = &args.out;
    for (ci, chunk) in chunks.iter().enumerate() {
        let c = first + ci;
        let m = chunk.len;
        let hs = layout.head(scratch, c, h, j);
        let qn = layout.qk(scratch, c, h);
        let kn = qn.wrapping_add(C * kd);
        if ci + 1 < chunks.len() {
            // The next chunk's scratch is in L3 or memory: ask for it into L2 while this one runs.
            let next = layout.head(scratch, c + 1, h, j);
            let m1 = chunks[ci + 1].len;
            prefetch_l2(next.w.cast(), m1 * kd * 4);
            prefetch_l2(next.u.cast(), m1 * vd * 4);
            prefetch_l2(next.p.cast(), m1 * C * 4);
            // What this pass reads of q and k: pass 1's decayed rows per channel, else q and k.
            match args.per_channel {
                true => prefetch_l2(next.g.cast(), 2 * C * padded_k(kd) * 4),
                false => prefetch_l2(layout.qk(scratch, c + 1, h).cast(), 2 * C * kd * 4),
            }
        }
        // q e^G and k e^(G_last - G): stored by pass 1 with per-channel decays.
        let kp = padded_k(kd);
        let (qg_ptr, kdec_ptr, ldq) = if args.per_channel {
            let qg = hs.g.cast_const();
            (qg, qg.wrapping_add(C * kp), kp)
        } else {
            let gcum = unsafe { std::slice::from_raw_parts(hs.g, m) };
            let glast = gcum[m - 1];
            unsafe { exp_into::<S>(gcum, &mut eg[..m]) };
            for i in 0..m {
                tmp[i] = glast - gcum[i];
            }
            unsafe { exp_into::<S>(&tmp[..m], &mut etail[..m]) };
            for i in 0..m {
                for r in 0..kd {
                    unsafe {
                        qg[i * kd + r] = *qn.add(i * kd + r) * eg[i];
                        kdec[i * kd + r] = *kn.add(i * kd + r) * etail[i];
                    }
                }
            }
            (qg.as_ptr(), kdec.as_ptr(), kd)
        };
        unsafe {
            // v' = u + (-w) S, in place over u.
            gemm::<S>(
                m,
                vd,
                kd,
                MatA {
                    ptr: hs.w,
                    row_stride: kd,
                    col_stride: 1,
                },
                s.as_ptr(),
                vd,
                hs.u,
                vd,
                true,
                false,
            );
            // o = (q e^G) S + P v'.
            gemm::<S>(
                m,
                vd,
                kd,
                MatA {
                    ptr: qg_ptr,
                    row_stride: ldq,
                    col_stride: 1,
                },
                s.as_ptr(),
                vd,
                o.as_mut_ptr(),
                vd,
                false,
                false,
            );
            gemm::<S>(
                m,
                vd,
                m,
                MatA {
                    ptr: hs.p,
                    row_stride: C,
                    col_stride: 1,
                },
                hs.u,
                vd,
                o.as_mut_ptr(),
                vd,
                true,
                true,
            );
            for i in 0..m {
                store_row(
                    out.at(&[chunk.start + i, hv]),
                    out.dtype,
                    out.strides[2],
                    &o[i * vd..(i + 1) * vd],
                );
            }
        }
        // S = e^(G_last) S + (k e^(G_last - G))^T v', row r scaled by its own decay per channel.
        if args.per_channel {
            let elast = unsafe { std::slice::from_raw_parts(hs.g.add(2 * C * kp), kd) };
            for (row, &d) in s.chunks_exact_mut(vd).zip(elast) {
                unsafe { scale::<S>(row, d) };
            }
        } else {
            unsafe { scale::<S>(&mut s, (*hs.g.add(m - 1)).exp()) };
        }
        unsafe {
            gemm::<S>(
                kd,
                vd,
                m,
                MatA {
                    ptr: kdec_ptr,
                    row_stride: 1,
                    col_stride: ldq,
                },
                hs.u,
                vd,
                s.as_mut_ptr(),
                vd,
                true,
                false,
            );
        }
    }
    if let StateWrite::Final(slot) = seq.write {
        let st = st.expect("state slot without a state tensor");
        for r in 0..kd {
            unsafe {
                store_row(
                    st.at(&[slot, hv, r]),
                    st.dtype,
                    st.strides[3],
                    &s[r * vd..(r + 1) * vd],
                )
            };
        }
    }
}

/// `x *= d` in place.
#[inline(always)]
unsafe fn scale<S: Simd>(x: &mut [f32], d: f32) {
    let (n, l) = (x.len(), S::LANES);
    let dv = unsafe { S::splat(d) };
    let mut j = 0;
    unsafe {
        while j + l <= n {
            let p = x.as_mut_ptr().add(j);
            S::store_f32(p, S::mul(S::load_f32(p), dv));
            j += l;
        }
    }
    x[j..].iter_mut().for_each(|v| *v *= d);
}
