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

use super::gemm::{MatA, gemm};
use super::{
    CHUNK, DeltaRule, PREFETCH_TOKENS, Sequence, StateWrite, load_row, prefetch_l2, store_row,
};
use crate::kernels::simd::Simd;

const C: usize = CHUNK;

/// One chunk: `len` tokens from packed token `start`.
#[derive(Clone, Copy, Debug)]
pub struct Chunk {
    pub start: usize,
    pub len: usize,
}

/// Scratch layout of one wave of q/k heads `first_head .. first_head + heads` (and their v-heads),
/// in f32 elements, per chunk: for each q/k head `[2][C][K]` (normalised q, k), then for each
/// v-head `-w [C][K]`, `u [C][V]`, `P [C][C]`, `G [C]`.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub first_head: usize,
    pub heads: usize,
    /// v-heads per q/k head.
    pub group: usize,
    pub k_dim: usize,
    pub v_dim: usize,
}

impl Layout {
    fn qk_size(&self) -> usize {
        2 * C * self.k_dim
    }
    fn head_size(&self) -> usize {
        C * self.k_dim + C * self.v_dim + C * C + C
    }
    pub fn chunk_size(&self) -> usize {
        self.heads * self.qk_size() + self.heads * self.group * self.head_size()
    }
    /// Normalised q of chunk `c`, head `h` (k follows at `+ C*K`).
    fn qk(&self, base: *mut f32, c: usize, h: usize) -> *mut f32 {
        base.wrapping_add(c * self.chunk_size() + (h - self.first_head) * self.qk_size())
    }
    /// `-w` of chunk `c`, v-head number `j` of q/k head `h`; `u`, `P`, `G` follow.
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
    g: *mut f32,
}

/// `out[i] = exp(x[i])` with the vector exp (scalar-padded tail).
#[inline(always)]
unsafe fn exp_into<S: Simd>(x: &[f32], out: &mut [f32]) {
    let l = S::LANES;
    let n = x.len();
    let mut i = 0;
    unsafe {
        while i + l <= n {
            S::store_f32(
                out.as_mut_ptr().add(i),
                S::exp(S::load_f32(x.as_ptr().add(i))),
            );
            i += l;
        }
        if i < n {
            let mut buf = [0f32; 16];
            buf[..n - i].copy_from_slice(&x[i..]);
            let mut res = [0f32; 16];
            S::store_f32(res.as_mut_ptr(), S::exp(S::load_f32(buf.as_ptr())));
            out[i..].copy_from_slice(&res[..n - i]);
        }
    }
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
        // -w = T (-k * beta * e^G);  u = T (v * beta).
        for i in 0..m {
            args.prefetch_v(chunk.start + i + PREFETCH_TOKENS, hv, false);
            let f = -beta[i] * eg[i];
            for r in 0..kd {
                x[i * kd + r] = unsafe { *kn.add(i * kd + r) } * f;
            }
            unsafe {
                load_row(
                    args.v.at(&[chunk.start + i, hv]),
                    args.v.dtype,
                    args.v.strides[2],
                    &mut y[i * vd..(i + 1) * vd],
                )
            };
            y[i * vd..(i + 1) * vd]
                .iter_mut()
                .for_each(|v| *v *= beta[i]);
        }
        let t = MatA {
            ptr: tinv.as_ptr(),
            row_stride: C,
            col_stride: 1,
        };
        unsafe {
            gemm::<S>(m, kd, m, t, x.as_ptr(), kd, hs.w, kd, false, true);
            gemm::<S>(m, vd, m, t, y.as_ptr(), vd, hs.u, vd, false, true);
        }
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
            prefetch_l2(layout.qk(scratch, c + 1, h).cast(), 2 * C * kd * 4);
        }
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
                    ptr: qg.as_ptr(),
                    row_stride: kd,
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
        // S = e^(G_last) S + (k e^(G_last - G))^T v'.
        let decay = unsafe { S::splat(glast.exp()) };
        let n = kd * vd;
        let mut j = 0;
        unsafe {
            while j + S::LANES <= n {
                let p = s.as_mut_ptr().add(j);
                S::store_f32(p, S::mul(S::load_f32(p), decay));
                j += S::LANES;
            }
        }
        let d = glast.exp();
        s[j..].iter_mut().for_each(|x| *x *= d);
        unsafe {
            gemm::<S>(
                kd,
                vd,
                m,
                MatA {
                    ptr: kdec.as_ptr(),
                    row_stride: 1,
                    col_stride: kd,
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
