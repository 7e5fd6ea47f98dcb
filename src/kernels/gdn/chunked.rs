//! The chunked WY form for long prefills (chunks of [`CHUNK`] tokens; the last one may be short).
//!
//! Within a chunk, with `G` the inclusive cumulative sum of `g` and `S0` the state at its start,
//! the per-token recurrence is exactly
//! `A = strict_lower(beta_i (k_i . k_j) e^(G_i - G_j))`, `T = (I + A)^-1`,
//! `v' = T (v * beta - (k * beta * e^G) S0)`,
//! `o = (q * e^G) S0 + (q k^T o decay, lower incl. diagonal) v'`,
//! `S = e^(G_last) S0 + (k * e^(G_last - G))^T v'`.
//! (`T` is applied once, to the `C x V` right-hand side, rather than forming the WY factors
//! `w = T (k beta e^G)` and `u = T (v beta)`: one lower-triangular GEMM less per chunk.)
//! Pass 1 ([`intra`], per (chunk, q/k head), `k k^T` and `q k^T` shared by the v-heads of the
//! group) stores per v-head `x = -k * beta * e^G`, `T`, `y = v * beta`, the masked
//! `P = q k^T o decay`, `q e^G`, `k e^(G_last - G)` and `e^(G_last)` (see [`Layout`]); pass 2
//! ([`inter_chunk`]) carries the state of one (sequence, v-head) through a chunk with five GEMMs.
//! With enough (sequence, q/k head) pairs for the threads, one task runs both passes chunk by
//! chunk for a sequence and a few adjacent q/k heads, each v-head's pass 2 right after its pass 1
//! ([`fused`]: its scratch stays in L2); otherwise pass 1 runs over all chunks in parallel and
//! pass 2 per (sequence, v-head) after it ([`intra_task`], [`inter`]). Everything is f32; the
//! state stays f32 for the whole sequence.
//!
//! Every decay factor is formed from the per-token decays `a = e^g <= 1` only (the clamped exp:
//! a log-decay below -87.3, `-inf` included, acts as -87.3), as a product of consecutive `a`s
//! (so `<= 1`, accurate to a few ulps, flushed to zero below `2^-60`), never as a difference of
//! the chunk's cumulative log-decays: that difference carries their rounding (`|G|` ulps, all of
//! a small decay after a huge one) and is NaN after `-inf`. With one decay per v-head, `D[i][j] =
//! e^(G_i - G_j)` is one row of running products per token ([`next_decay_row`]) and factors out
//! of `k k^T` and `q k^T`. Per-channel decays (KDA) make `G` a `K`-vector per token, so
//! `e^(G_i - G_j)` no longer factors out; [`intra`] then sums `k k^T` and `q k^T` pair by pair
//! with the running product (`C (C+1) / 2` pairs, few at `C = 16`; within `C * 2^-60` absolute,
//! see [`pair_products`]); `q e^G`, `k e^(G_last - G)` and `e^(G_last)` are running products
//! too, one decay per row of the state.

use std::ops::Range;

use super::{CHUNK, DeltaRule, PREFETCH_TOKENS, Sequence, StateWrite, prefetch_l2, recurrent};
use crate::dtype::DType;
pub use crate::kernels::chunking::Chunk;
use crate::kernels::chunking::TaskBuffer;
use crate::kernels::gemm::{
    MatA, Start, gemm, gemm_bf16_pairs, pack_bf16_pairs, pack_bf16_pairs_transposed,
};
use crate::kernels::simd::{
    Simd, exp_in_place, load_row_simd, scale_into, store_row_simd, transpose,
};

const C: usize = CHUNK;

/// Decays below this flush to zero in running products, which would otherwise reach denormals
/// (slow on some CPUs) for fast-decaying channels; the error is below `2^-60` absolute.
const FLUSH: f32 = 8.673_617e-19; // 2^-60

/// Scratch layout of one wave of q/k heads `first_head .. first_head + heads`, in f32 elements,
/// per chunk and v-head of those heads: `x = -k beta e^G [C][Kp]`, `T [C][C]`, `y = v beta [C][V]`,
/// `P [C][C]`, `q e^G [C][Kp]`, `k e^(G_last - G) [C][Kp]` and `e^(G_last) [Kp]` (`Kp` = [`padded_k`]; one decay per row of
/// the state, the same for every row with a decay per v-head).
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub first_head: usize,
    pub heads: usize,
    /// v-heads per q/k head.
    pub group: usize,
    /// v-head blocks per q/k head and chunk: `group`, or 1 when each v-head's pass 2 runs
    /// right after its pass 1 ([`fused`]: one v-head's block live at a time, reused).
    pub slots: usize,
    pub k_dim: usize,
    pub v_dim: usize,
}

impl Layout {
    fn head_size(&self) -> usize {
        let kp = padded_k(self.k_dim);
        C * self.v_dim + 2 * C * C + (3 * C + 1) * kp
    }
    pub fn chunk_size(&self) -> usize {
        self.heads * self.slots * self.head_size()
    }
    /// The scratch of chunk `c`, v-head number `j` of q/k head `h`.
    fn head(&self, base: *mut f32, c: usize, h: usize, j: usize) -> HeadScratch {
        let kp = padded_k(self.k_dim);
        let slot = (h - self.first_head) * self.slots + j % self.slots;
        let x = base.wrapping_add(c * self.chunk_size() + slot * self.head_size());
        let t = x.wrapping_add(C * kp);
        let y = t.wrapping_add(C * C);
        let p = y.wrapping_add(C * self.v_dim);
        let qg = p.wrapping_add(C * C);
        let kdec = qg.wrapping_add(C * kp);
        let elast = kdec.wrapping_add(C * kp);
        HeadScratch {
            x,
            t,
            y,
            p,
            qg,
            kdec,
            elast,
        }
    }
}

pub struct HeadScratch {
    x: *mut f32,
    t: *mut f32,
    y: *mut f32,
    p: *mut f32,
    qg: *mut f32,
    kdec: *mut f32,
    elast: *mut f32,
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

/// Splits the first `n` floats off `rest`.
fn carve<'a>(rest: &mut &'a mut [f32], n: usize) -> &'a mut [f32] {
    let (head, tail) = std::mem::take(rest).split_at_mut(n);
    *rest = tail;
    head
}

/// What every pass-1 task works in, carved from its thread's task buffer: the normalised q and k
/// rows of the chunk (`[C][Kp]`, zero past K) and the masked `k k^T`. Each decay form carves
/// the rest of its work after these (see [`PerHead`], [`PerChannel`]).
struct Work<'a> {
    q: &'a mut [f32],
    k: &'a mut [f32],
    kk: &'a mut [f32],
    /// The factors that normalised each token's raw q and k rows.
    scales: [(f32, f32); C],
}

impl Work<'_> {
    fn floats(kp: usize) -> usize {
        2 * C * kp + C * C
    }
}

/// Floats of task buffer [`intra`] works in.
pub fn intra_floats(args: &DeltaRule) -> usize {
    let kp = padded_k(args.k_dim);
    Work::floats(kp)
        + match args.per_channel {
            true => PerChannel::floats(kp),
            false => PerHead::floats(args.k_dim),
        }
}

/// What pass 1 calls with each v-head (its number in the group) once its scratch is complete.
pub type EachHead<'a> = &'a mut dyn FnMut(usize, &HeadScratch);

/// [`intra`] of one ISA.
pub type IntraStep = unsafe fn(&Pass1, &mut [f32], EachHead);
/// [`inter_chunk_checkpointed`] of one ISA.
pub type InterStep = unsafe fn(
    &DeltaRule,
    &Sequence,
    &HeadScratch,
    &mut [f32],
    &mut [f32],
    Chunk,
    usize,
    Range<usize>,
);

/// One ISA's out-of-line copies of the two per-chunk steps, which every schedule calls (inlined
/// into each schedule, they made the chunked form's code twice as large for no speed).
pub struct Steps {
    pub intra: IntraStep,
    pub inter: InterStep,
}

/// Pass 1 for chunk `c` and q/k head `h` as a task of its own, in this thread's task buffer.
///
/// # Safety
/// As for [`intra`]; `steps` are for an ISA the CPU supports.
pub unsafe fn intra_task(
    args: &DeltaRule,
    layout: &Layout,
    scratch: *mut f32,
    (c, chunk, h): (usize, Chunk, usize),
    steps: &Steps,
) {
    let task = Pass1 {
        args,
        layout,
        scratch,
        c,
        chunk,
        h,
        members: (0, layout.group),
        next: (chunk.start + chunk.len, h),
    };
    let mut buf = TaskBuffer::take(intra_floats(args));
    unsafe { (steps.intra)(&task, &mut buf, &mut |_, _| {}) }
}

/// Pass 1 `task`: for every v-head of the group, everything pass 2 needs of the chunk but the
/// state (see [`Layout`]), working in `buf` ([`intra_floats`], its padding lanes zero: only ever
/// written by this function); `each_head` is called with each v-head as soon as its scratch is
/// complete.
///
/// # Safety
/// `task.scratch` is laid out by `task.layout` for every chunk; this task alone writes chunk
/// `task.c`'s blocks of the v-heads of q/k head `task.h`.
#[inline(always)]
pub unsafe fn intra<S: Simd>(task: &Pass1, buf: &mut [f32], each_head: EachHead) {
    let (args, chunk, h) = (task.args, task.chunk, task.h);
    let (kd, m) = (args.k_dim, chunk.len);
    let kp = padded_k(kd);
    let mut rest = buf;
    let mut work = Work {
        q: carve(&mut rest, C * kp),
        k: carve(&mut rest, C * kp),
        kk: carve(&mut rest, C * C),
        scales: [(0.0, 0.0); C],
    };
    let mut next = NextChunk {
        args,
        h: task.next.1,
        tokens: task.next.0..(task.next.0 + C).min(args.tokens),
        row: 0,
    };
    for i in 0..m {
        work.scales[i] = unsafe {
            args.load_qk::<S>(
                chunk.start + i,
                h,
                &mut work.q[i * kp..i * kp + kd],
                &mut work.k[i * kp..i * kp + kd],
            )
        };
    }
    unsafe {
        match args.per_channel {
            true => intra_per_channel::<S>(task, work, rest, &mut next, each_head),
            false => intra_per_head::<S>(task, work, rest, &mut next, each_head),
        }
    }
    next.rest();
}

/// The token rows of this thread's next pass-1 work (the next q/k head of a fused task's run, or
/// the next chunk: the first head's rows are a page apart, where the hardware prefetchers stop),
/// asked into L2 a few rows at a time from the loops of pass 1. In one burst at the start of the task, their 1280 prefetches (H=16,
/// HV=32) waited on the line-fill buffers for 5% of a Gated DeltaNet prefill (Xeon, AVX-512);
/// spread, the prefill took 2-4% less time (in-process A/B). The per-channel form spreads them
/// over three loops (its `g` rows are 8 lines each): all in its exp loop, the prefetches waited
/// for fill buffers in 8% of the samples of a KDA prefill, and spread the prefill took 3% less.
struct NextChunk<'a> {
    args: &'a DeltaRule,
    h: usize,
    tokens: std::ops::Range<usize>,
    /// The next token's next row, as [`DeltaRule::prefetch_pass1_row_l2`] numbers them.
    row: usize,
}

impl NextChunk<'_> {
    /// Prefetches up to `n` more rows.
    fn rows(&mut self, n: usize) {
        for _ in 0..n {
            if self.tokens.is_empty() {
                return;
            }
            let t = self.tokens.start;
            self.args.prefetch_pass1_row_l2(t, self.h, self.row);
            self.row += 1;
            if self.row == self.args.pass1_rows() {
                self.row = 0;
                self.tokens.start += 1;
            }
        }
    }

    /// Prefetches the rows left.
    fn rest(&mut self) {
        self.rows(usize::MAX);
    }
}

/// One pass-1 task: chunk `c` of q/k head `h`, and where its scratch goes.
#[derive(Clone, Copy)]
pub struct Pass1<'a> {
    args: &'a DeltaRule,
    layout: &'a Layout,
    scratch: *mut f32,
    c: usize,
    chunk: Chunk,
    h: usize,
    /// The v-heads of the group (numbers `start..end`) this task prepares.
    members: (usize, usize),
    /// The first token and q/k head of this thread's next pass-1 work, whose rows it prefetches.
    next: (usize, usize),
}

impl Pass1<'_> {
    fn members(&self) -> Range<usize> {
        self.members.0..self.members.1
    }

    /// The scratch of v-head number `j` of the group.
    fn head(&self, j: usize) -> HeadScratch {
        self.layout.head(self.scratch, self.c, self.h, j)
    }
}

/// The per-head form's work after [`Work`]: the masked `q k^T` and `k^T` (`[K][C]`, in f32, or
/// with a bf16 dot product the raw bf16 q and k rows and `k^T` as pairs: see [`bf16_products`]).
struct PerHead<'a> {
    qk: &'a mut [f32],
    kt: &'a mut [f32],
}

impl<'a> PerHead<'a> {
    fn floats(kd: usize) -> usize {
        C * C + kd.div_ceil(2).max(1) * 3 * C
    }

    fn carve(mut rest: &'a mut [f32], kd: usize) -> PerHead<'a> {
        PerHead {
            qk: carve(&mut rest, C * C),
            kt: carve(&mut rest, kd.div_ceil(2).max(1) * 3 * C),
        }
    }
}

/// Pass 1 with one decay per v-head: `e^(G_i - G_j)` factors out of `k k^T` and `q k^T`, shared
/// by the v-heads of the group.
///
/// # Safety
/// As for [`intra`]; `work` holds the chunk's normalised q and k, `rest` at least
/// [`PerHead::floats`].
#[inline(always)]
unsafe fn intra_per_head<S: Simd>(
    task: &Pass1,
    work: Work,
    rest: &mut [f32],
    next: &mut NextChunk,
    each: EachHead,
) {
    let (args, chunk, h) = (task.args, task.chunk, task.h);
    let (kd, m) = (args.k_dim, chunk.len);
    let kp = padded_k(kd);
    let Work { q, k, kk, scales } = work;
    let PerHead { qk, kt } = PerHead::carve(rest, kd);
    let bf16_dot = S::BF16_DOT && args.q.dtype == DType::BF16 && args.k.dtype == DType::BF16;
    match bf16_dot {
        true => unsafe { bf16_products::<S>(args, chunk, h, &scales, kt, kk, qk) },
        false => unsafe { transpose(k.as_ptr(), kp, kt.as_mut_ptr(), C, m, kd) },
    }
    // Only the lower triangles of k k^T and q k^T are used: per band of 16 rows, columns up to
    // the band's end (about 60% of the full products). The bf16 products are done already.
    const BAND: usize = 16;
    let mut r0 = if bf16_dot { m } else { 0 };
    while r0 < m {
        let rows = BAND.min(m - r0);
        let cols = m.min(r0 + BAND);
        for (src, dst) in [(&*k, &mut *kk), (&*q, &mut *qk)] {
            let a = MatA {
                ptr: src[r0 * kp..].as_ptr(),
                row_stride: kp,
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
                    dst[r0 * C..].as_mut_ptr(),
                    C,
                    Start::Zero,
                    false,
                )
            };
        }
        r0 += rows;
    }
    let mut a_row = [0f32; C];
    let mut decay = [0f32; C];
    let mut d_row = [0f32; C];
    let mut beta = [0f32; C];
    let mut eg = [0f32; C];
    for j in task.members() {
        let hv = args.v_head(h, j);
        let hs = task.head(j);
        for i in 0..m {
            let (g, b) = unsafe { args.gate(chunk.start + i, hv) };
            decay[i] = g;
            beta[i] = b;
        }
        // Per-token decays `a = e^g` with the clamped exp (a log-decay below -87.3, -inf
        // included, acts as -87.3), and every factor below a product of consecutive ones: a
        // difference of the chunk's cumulative log-decays would lose the small decays after a
        // huge one (|G| ulp) and give NaN after -inf.
        unsafe { exp_in_place::<S>(&mut decay[..m]) };
        // e^G_i = a_0 ... a_i.
        let mut e = 1f32;
        for (eg, &a) in eg.iter_mut().zip(&decay[..m]) {
            e = e.mul_add(a, -FLUSH).max(0.0);
            *eg = e;
        }
        let p = unsafe { std::slice::from_raw_parts_mut(hs.p, C * C) };
        let tinv = unsafe { std::slice::from_raw_parts_mut(hs.t, C * C) };
        tinv.fill(0.0);
        d_row.fill(0.0);
        for i in 0..m {
            unsafe { next_decay_row::<S>(i, decay[i], &mut d_row) };
            let rows = [&qk[i * C..(i + 1) * C], &kk[i * C..(i + 1) * C]];
            unsafe { decay_rows::<S>(i, &d_row, beta[i], rows, &mut p[i * C..], &mut a_row) };
            unsafe { inverse_row::<S>(tinv.as_mut_ptr(), i, &a_row[..i]) };
            next.rows(2);
        }
        // The last row of D is e^(G_last - G_i).
        let etail = &d_row;
        unsafe {
            for i in 0..m {
                let (qi, ki) = (q[i * kp..].as_ptr(), k[i * kp..].as_ptr());
                next.rows(2);
                scale_into::<S>(ki, -beta[i] * eg[i], hs.x.add(i * kp), kp);
                scale_into::<S>(qi, eg[i], hs.qg.add(i * kp), kp);
                scale_into::<S>(ki, etail[i], hs.kdec.add(i * kp), kp);
            }
            std::slice::from_raw_parts_mut(hs.elast, kp).fill(eg[m - 1]);
            store_y::<S>(args, chunk, hv, &hs, &beta[..m]);
            each(j, &hs);
        }
    }
}

/// `k k^T` and `q k^T` of the chunk (`m x m`, row stride `C`) from the raw bf16 rows with
/// [`gemm_bf16_pairs`], each product then scaled by the factors that normalised its two rows
/// (`scales`): the same numbers as the f32 products of the normalised rows, within their
/// roundings. `work` holds `3 * C` rows of `K / 2` pairs: q's and k's rows, then `k^T`.
///
/// # Safety
/// As for [`intra`]; `S::BF16_DOT`, q and k bf16.
#[inline(always)]
unsafe fn bf16_products<S: Simd>(
    args: &DeltaRule,
    chunk: Chunk,
    h: usize,
    scales: &[(f32, f32); C],
    work: &mut [f32],
    kk: &mut [f32],
    qk: &mut [f32],
) {
    let (kd, m) = (args.k_dim, chunk.len);
    let pairs = kd.div_ceil(2);
    let base: *mut u32 = work.as_mut_ptr().cast();
    let (q_pairs, k_pairs, kt_pairs) = (
        base,
        base.wrapping_add(C * pairs),
        base.wrapping_add(2 * C * pairs),
    );
    let (t, q, k) = (chunk.start, &args.q, &args.k);
    let (q_rows, k_rows) = (q.at(&[t, h]).cast(), k.at(&[t, h]).cast());
    let (q_strides, k_strides) = ((q.strides[0], q.strides[2]), (k.strides[0], k.strides[2]));
    unsafe {
        pack_bf16_pairs(q_rows, q_strides, m, kd, q_pairs, pairs);
        pack_bf16_pairs(k_rows, k_strides, m, kd, k_pairs, pairs);
        pack_bf16_pairs_transposed(k_rows, k_strides, m, kd, kt_pairs, C);
        // Columns from m to C read pairs no token wrote: their products are never used.
        for (rows, dst) in [(k_pairs, &mut *kk), (q_pairs, &mut *qk)] {
            let c = dst.as_mut_ptr();
            gemm_bf16_pairs::<S>(m, m, pairs, (rows, pairs), (kt_pairs, C), c, C, Start::Zero);
        }
    }
    for i in 0..m {
        let (qs, ks) = scales[i];
        for j in 0..m {
            kk[i * C + j] *= ks * scales[j].1;
            qk[i * C + j] *= qs * scales[j].1;
        }
    }
}

/// Row `i` of `D` from row `i - 1` (`d` zero from column `i` on): `D[i][j] = a_(j+1) ... a_i`
/// for `j < i` (each product flushed as [`decay_product`]), `D[i][i] = 1`, zero right of it.
///
/// # Safety
/// The CPU supports `S`.
#[inline(always)]
unsafe fn next_decay_row<S: Simd>(i: usize, a: f32, d: &mut [f32; C]) {
    unsafe {
        let a = S::splat(a);
        for j0 in (0..i).step_by(S::LANES) {
            let p = d.as_mut_ptr().add(j0);
            S::store_f32(p, decay_product::<S>(S::load_f32(p), a));
        }
    }
    d[i] = 1.0;
}

/// Row `i` of `P = q k^T o D` (lower incl. the diagonal, zero to its right) and of
/// `A = beta_i (k k^T o D)` (read left of the diagonal only), with `D[i][j] = e^(G_i - G_j)`
/// (row `d`, see [`next_decay_row`]), from rows `[qk, kk]`, a vector of columns at a time (the
/// one holding the diagonal through a buffer, so no column right of it is read: an infinite
/// product there must not reach row `i` as NaN).
///
/// # Safety
/// The CPU supports `S`; `p` and `a` hold `C` floats.
#[inline(always)]
unsafe fn decay_rows<S: Simd>(
    i: usize,
    d: &[f32; C],
    beta: f32,
    [qk, kk]: [&[f32]; 2],
    p: &mut [f32],
    a: &mut [f32],
) {
    debug_assert!(qk.len() == C && kk.len() == C && p.len() >= C && a.len() >= C);
    let lanes = S::LANES;
    unsafe {
        let beta_v = S::splat(beta);
        for j0 in (0..C).step_by(lanes) {
            if j0 > i {
                S::store_f32(p.as_mut_ptr().add(j0), S::zero());
                continue;
            }
            let n = (i + 1 - j0).min(lanes);
            let dv = S::load_f32(d.as_ptr().add(j0));
            let qk_d = S::mul(S::load_f32(qk.as_ptr().add(j0)), dv);
            let kk_d = S::mul(S::mul(beta_v, S::load_f32(kk.as_ptr().add(j0))), dv);
            if n == lanes {
                S::store_f32(p.as_mut_ptr().add(j0), qk_d);
                S::store_f32(a.as_mut_ptr().add(j0), kk_d);
            } else {
                let mut buf = [0f32; 16];
                S::store_f32(buf.as_mut_ptr(), qk_d);
                buf[n..].fill(0.0);
                S::store_f32(p.as_mut_ptr().add(j0), S::load_f32(buf.as_ptr()));
                S::store_f32(buf.as_mut_ptr(), kk_d);
                a[j0..j0 + n].copy_from_slice(&buf[..n]);
            }
        }
    }
}

/// `y = v * beta` into a v-head's scratch.
///
/// # Safety
/// As for [`intra`]; `hs` is v-head `hv`'s scratch of this chunk.
#[inline(always)]
unsafe fn store_y<S: Simd>(
    args: &DeltaRule,
    chunk: Chunk,
    hv: usize,
    hs: &HeadScratch,
    beta: &[f32],
) {
    let vd = args.v_dim;
    for (i, &b) in beta.iter().enumerate() {
        args.prefetch_v(chunk.start + i + PREFETCH_TOKENS, hv, false);
        let row = unsafe { std::slice::from_raw_parts_mut(hs.y.add(i * vd), vd) };
        unsafe {
            load_row_simd::<S>(
                args.v.at(&[chunk.start + i, hv]),
                args.v.dtype,
                args.v.strides[2],
                row,
            )
        };
        row.iter_mut().for_each(|v| *v *= b);
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

/// The lower triangles (incl. the diagonal) of the chunk's `m` tokens: for `jj <= i < m`,
/// `kk[i][jj] = k_i . w` and `qk[i][jj] = q_i . w` with `w = k_jj a_(jj+1) ... a_i`, a running
/// product over `i`. Each step is `w a - 2^-60` in one fused multiply-add, which keeps every `w`
/// normal (a decayed product settles near `-2^-59` instead of reaching denormals, slow on some
/// CPUs) at an absolute error below `C * 2^-60` per channel: one instruction per step, where
/// flushing a running decay to zero took two and a multiply by `k_jj` a third (the pair products
/// took 3% less of a KDA prefill, in-process A/B). Rows are `kp` floats (a multiple of
/// `S::LANES`), taken `NB` vectors at a time with `w` held in registers: with it in memory, the
/// pair loop was bound by its loads and stores at half the FMA rate. `HEADS` v-heads of a GQA
/// group (decays `a[n]`, sums into `out[n]`) share each load of `k_i` and `q_i`: two took 17%
/// less time than two calls of one.
///
/// # Safety
/// `a[n]`, `k` and `q` address `m <= C` rows of `kp` floats.
#[inline(always)]
unsafe fn pair_products<S: Simd, const HEADS: usize>(
    a: [*const f32; HEADS],
    [k, q]: [*const f32; 2],
    kp: usize,
    m: usize,
    out: [PairSums; HEADS],
) {
    let rows = [k, q];
    // Half the vector registers for the running `w`s (only the taken side of a constant's branch
    // is compiled).
    unsafe {
        match S::MANY_VECTORS {
            true => match kp == 8 * S::LANES {
                true => pair_sums::<S, 8, HEADS, true>(a, rows, kp, m, out),
                false => pair_sums::<S, 8, HEADS, false>(a, rows, kp, m, out),
            },
            false => match kp == 4 * S::LANES {
                true => pair_sums::<S, 4, HEADS, true>(a, rows, kp, m, out),
                false => pair_sums::<S, 4, HEADS, false>(a, rows, kp, m, out),
            },
        }
    }
}

/// Where one v-head's pair sums go: `[kk, qk]`, `C x C` each.
type PairSums<'a> = [&'a mut [f32]; 2];

/// [`pair_products`], with `ONE_BLOCK` when a row is exactly `NB` vectors (K = 128 on AVX-512):
/// then no bound check runs in the pair loop and each sum is stored as it is reduced (13% less
/// time in the pair loop than the general form, AVX-512).
#[inline(always)]
unsafe fn pair_sums<S: Simd, const NB: usize, const HEADS: usize, const ONE_BLOCK: bool>(
    a: [*const f32; HEADS],
    [k, q]: [*const f32; 2],
    kp: usize,
    m: usize,
    out: [PairSums; HEADS],
) {
    let l = S::LANES;
    for jj in 0..m {
        let mut sums = [[[0f32; 2]; C]; HEADS];
        let mut b = 0;
        while b < kp {
            let nv = match ONE_BLOCK {
                true => NB,
                false => NB.min((kp - b) / l),
            };
            unsafe {
                let offset = S::splat(-FLUSH);
                let mut w = [[S::zero(); NB]; HEADS];
                // Constant indices under a bound check keep the arrays in registers.
                for (v, wv) in w[0].iter_mut().enumerate() {
                    if v < nv {
                        *wv = S::load_f32(k.add(jj * kp + b + v * l));
                    }
                }
                for n in 1..HEADS {
                    w[n] = w[0];
                }
                for i in jj..m {
                    let row = i * kp + b;
                    let mut acc = [[S::zero(); 2]; HEADS];
                    for v in 0..NB {
                        if v < nv {
                            let (kv, qv) = (
                                S::load_f32(k.add(row + v * l)),
                                S::load_f32(q.add(row + v * l)),
                            );
                            for n in 0..HEADS {
                                if i > jj {
                                    let av = S::load_f32(a[n].add(row + v * l));
                                    w[n][v] = S::fma(w[n][v], av, offset);
                                }
                                acc[n][0] = S::fma(kv, w[n][v], acc[n][0]);
                                acc[n][1] = S::fma(qv, w[n][v], acc[n][1]);
                            }
                        }
                    }
                    for n in 0..HEADS {
                        let (kk_sum, qk_sum) = (S::reduce_sum(acc[n][0]), S::reduce_sum(acc[n][1]));
                        if ONE_BLOCK {
                            out[n][0][i * C + jj] = kk_sum;
                            out[n][1][i * C + jj] = qk_sum;
                        } else {
                            sums[n][i - jj][0] += kk_sum;
                            sums[n][i - jj][1] += qk_sum;
                        }
                    }
                }
            }
            b += nv * l;
        }
        if !ONE_BLOCK {
            for (n, sums) in sums.iter().enumerate() {
                for (i, sum) in (jj..m).zip(sums) {
                    out[n][0][i * C + jj] = sum[0];
                    out[n][1][i * C + jj] = sum[1];
                }
            }
        }
    }
}

/// The per-channel form's work after [`Work`], for two v-heads at a time: per token `a = e^g`
/// (`[2][C][Kp]`, `1` in the padding lanes), the second v-head's `k k^T` and `q k^T`
/// (`[2][C][C]`; the first's go to [`Work::kk`] and its own `P`) and one running row.
struct PerChannel<'a> {
    a: &'a mut [f32],
    pair: &'a mut [f32],
    run: &'a mut [f32],
}

impl<'a> PerChannel<'a> {
    fn floats(kp: usize) -> usize {
        2 * C * kp + 2 * C * C + kp
    }

    fn carve(mut rest: &'a mut [f32], kp: usize) -> PerChannel<'a> {
        PerChannel {
            a: carve(&mut rest, 2 * C * kp),
            pair: carve(&mut rest, 2 * C * C),
            run: carve(&mut rest, kp),
        }
    }
}

/// Pass 1 with per-channel decays, for every v-head of q/k head `h` (see the module doc). Rows
/// of the per-channel work are padded to `kp` (a multiple of 16) with `q = k = 0`, `a = 1`.
///
/// # Safety
/// As for [`intra`]; `work` holds the chunk's normalised q and k, `rest` at least
/// [`PerChannel::floats`].
#[inline(always)]
unsafe fn intra_per_channel<S: Simd>(
    task: &Pass1,
    work: Work,
    rest: &mut [f32],
    next: &mut NextChunk,
    each: EachHead,
) {
    let (args, chunk) = (task.args, task.chunk);
    let (kd, m) = (args.k_dim, chunk.len);
    let kp = padded_k(kd);
    let Work { q, k, kk, .. } = work;
    let PerChannel { a, pair, run } = PerChannel::carve(rest, kp);
    let (a0, a1) = a.split_at_mut(C * kp);
    let (kk1, qk1) = pair.split_at_mut(C * C);
    let mut beta = [[0f32; C]; 2];
    let members = task.members();
    let mut j = members.start;
    while j < members.end {
        // Two v-heads at a time share the pair loop's loads of k and q.
        let heads = (members.end - j).min(2);
        for (n, a) in [&mut *a0, &mut *a1].into_iter().enumerate().take(heads) {
            unsafe { decays::<S>(task, args.v_head(task.h, j + n), a, &mut beta[n], next) };
        }
        // q k^T o decay of the first v-head goes straight into its P (lower incl. the diagonal;
        // zero up to column m).
        let p0 = unsafe { std::slice::from_raw_parts_mut(task.head(j).p, C * C) };
        let rows = [k.as_ptr(), q.as_ptr()];
        unsafe {
            match heads {
                2 => pair_products::<S, 2>(
                    [a0.as_ptr(), a1.as_ptr()],
                    rows,
                    kp,
                    m,
                    [[&mut *kk, p0], [&mut *kk1, &mut *qk1]],
                ),
                _ => pair_products::<S, 1>([a0.as_ptr()], rows, kp, m, [[&mut *kk, p0]]),
            }
            per_channel_head::<S>(task, j, [&*a0, &*kk], [&*q, &*k], &beta[0], run, next, each);
            if heads == 2 {
                // The second v-head's block may be the first's, which its pass 2 has now read.
                let hs = task.head(j + 1);
                std::ptr::copy_nonoverlapping(qk1.as_ptr(), hs.p, C * C);
                per_channel_head::<S>(
                    task,
                    j + 1,
                    [&*a1, &*kk1],
                    [&*q, &*k],
                    &beta[1],
                    run,
                    next,
                    each,
                );
            }
        }
        j += heads;
    }
}

/// `beta` and the decays `a = e^g` (padded with 1) of the chunk's tokens for v-head `hv`.
///
/// # Safety
/// As for [`intra`]; `a` holds `C * kp` floats.
#[inline(always)]
unsafe fn decays<S: Simd>(
    task: &Pass1,
    hv: usize,
    a: &mut [f32],
    beta: &mut [f32; C],
    next: &mut NextChunk,
) {
    let (args, chunk) = (task.args, task.chunk);
    let (kd, kp) = (args.k_dim, padded_k(args.k_dim));
    // All rows first, then their exps: the row loads (a page apart, mostly from memory) are then
    // independent and overlap, where an exp between them kept a few in flight.
    for i in 0..chunk.len {
        beta[i] = unsafe { args.gate(chunk.start + i, hv).1 };
        unsafe { args.log_decays(chunk.start + i, hv, &mut a[i * kp..i * kp + kd]) };
    }
    for i in 0..chunk.len {
        unsafe { exp_in_place::<S>(&mut a[i * kp..i * kp + kd]) };
        a[i * kp + kd..(i + 1) * kp].fill(1.0);
        next.rows(2);
    }
}

/// The rest of v-head number `j`'s pass 1 once its `a`, `k k^T` and `q k^T` (in its `P`) are
/// formed: `q e^G`, `x`, `e^(G_last)`, `k e^(G_last - G)`, `P`'s upper part, `T` and `y`; then
/// `each` with its scratch.
///
/// # Safety
/// As for [`intra`]; `a` and the `[q, k]` rows hold `C * kp` floats, `kk` `C * C`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn per_channel_head<S: Simd>(
    task: &Pass1,
    j: usize,
    [a, kk]: [&[f32]; 2],
    [qp, kpd]: [&[f32]; 2],
    beta: &[f32; C],
    run: &mut [f32],
    next: &mut NextChunk,
    each: EachHead,
) {
    let (args, chunk) = (task.args, task.chunk);
    let (m, kp) = (chunk.len, padded_k(args.k_dim));
    let hv = args.v_head(task.h, j);
    let hs = task.head(j);
    let ap = a.as_ptr();
    unsafe {
        // e^G_i = a_0 ... a_i, a running row: q e^G, -beta k e^G and e^(G_last).
        let e = run.as_mut_ptr();
        std::ptr::copy_nonoverlapping(ap, e, kp);
        for i in 0..m {
            if i > 0 {
                product_rows::<S>(e, ap.add(i * kp), e, kp);
            }
            let (q, k) = (qp.as_ptr(), kpd.as_ptr());
            next.rows(1);
            mul_rows::<S>(q.add(i * kp), e, 1.0, hs.qg.add(i * kp), kp);
            mul_rows::<S>(k.add(i * kp), e, -beta[i], hs.x.add(i * kp), kp);
        }
        std::ptr::copy_nonoverlapping(e, hs.elast, kp);
        // k e^(G_last - G_i), with the suffix product a_(i+1) ... a_last.
        run.fill(1.0);
        for i in (0..m).rev() {
            if i + 1 < m {
                product_rows::<S>(run.as_ptr(), ap.add((i + 1) * kp), run.as_mut_ptr(), kp);
            }
            mul_rows::<S>(
                kpd.as_ptr().add(i * kp),
                run.as_ptr(),
                1.0,
                hs.kdec.add(i * kp),
                kp,
            );
        }
    }
    // P's upper part; T row by row from A = beta_i (k k^T o decay).
    let qk = unsafe { std::slice::from_raw_parts_mut(hs.p, C * C) };
    let tinv = unsafe { std::slice::from_raw_parts_mut(hs.t, C * C) };
    tinv.fill(0.0);
    let mut a_row = [0f32; C];
    for i in 0..m {
        qk[i * C + i + 1..i * C + m].fill(0.0);
        for l in 0..i {
            a_row[l] = beta[i] * kk[i * C + l];
        }
        next.rows(1);
        unsafe { inverse_row::<S>(tinv.as_mut_ptr(), i, &a_row[..i]) };
    }
    unsafe { store_y::<S>(args, chunk, hv, &hs, &beta[..m]) };
    each(j, &hs);
}

/// Pass 2 for one (sequence, v-head, block of state columns `cols`) over its chunks `chunks`
/// (global chunk indices from `first`). Each column of the state evolves on its own (the decay,
/// `k` and `x` act on rows), so column blocks are independent tasks with the same bits.
///
/// # Safety
/// Pass 1 has filled the scratch of these chunks; this task alone reads and writes the `cols`
/// of their v-head `hv` blocks, of the sequence's output rows for `hv` and of its state slot for
/// `hv`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn inter<S: Simd>(
    args: &DeltaRule,
    layout: &Layout,
    scratch: *mut f32,
    seq: &Sequence,
    first: usize,
    chunks: &[Chunk],
    hv: usize,
    cols: Range<usize>,
    steps: &Steps,
) {
    let (kd, vd) = (args.k_dim, args.v_dim);
    let (h, j) = (args.qk_head(hv), args.member(hv));
    let mut buf = TaskBuffer::take(kd * vd + C * vd);
    let (s, vn) = buf.split_at_mut(kd * vd);
    unsafe {
        load_state::<S>(args, seq, hv, cols.clone(), s);
        for (ci, &chunk) in chunks.iter().enumerate() {
            let hs = layout.head(scratch, first + ci, h, j);
            if let Some(next) = chunks.get(ci + 1) {
                // The next chunk's scratch is in L3 or memory: ask for it into L2 now.
                layout
                    .head(scratch, first + ci + 1, h, j)
                    .prefetch(args, next.len);
            }
            (steps.inter)(args, seq, &hs, s, vn, chunk, hv, cols.clone());
        }
        store_state::<S>(args, seq, hv, cols, s);
    }
}

/// The chunked form in one task per (sequence, run of q/k heads) when there are enough of them
/// for the threads: chunk by chunk, each q/k head's pass 1 with, as each v-head's scratch is
/// complete, that v-head's pass 2, while its scratch is still in cache (one v-head block, reused:
/// the same arithmetic as the two passes, so the same bits). The heads take each chunk in turn
/// (their states stay in L2), so a token's rows of adjacent heads are read one after another.
/// The task covers the v-heads numbered `members` in each group and the state columns `cols` of
/// them (see [`inter`]): more tasks than heads when the threads outnumber them, each repeating
/// the part of pass 1 its v-heads share.
///
/// # Safety
/// This task alone reads and writes the `cols` of the sequence's output rows and state slots of
/// its v-heads (`members` of the groups of `qk_heads`); `chunks` are the sequence's.
#[inline(always)]
pub unsafe fn fused<S: Simd>(
    args: &DeltaRule,
    seq: &Sequence,
    chunks: &[Chunk],
    qk_heads: Range<usize>,
    members: Range<usize>,
    cols: Range<usize>,
    steps: &Steps,
) {
    let (kd, vd) = (args.k_dim, args.v_dim);
    let group = args.v_heads / args.heads;
    let layout_of = |h: usize| Layout {
        first_head: h,
        heads: 1,
        group,
        slots: 1,
        k_dim: kd,
        v_dim: vd,
    };
    let scratch_floats = layout_of(0).chunk_size();
    let per_head = members.len() * kd * vd;
    let states = qk_heads.len() * per_head;
    let mut buf = TaskBuffer::take(states + C * vd + scratch_floats + intra_floats(args));
    let mut rest = &mut buf[..];
    let (states, vn) = (carve(&mut rest, states), carve(&mut rest, C * vd));
    let scratch = carve(&mut rest, scratch_floats).as_mut_ptr();
    let h0 = qk_heads.start;
    // Where v-head number `j` of q/k head `h` keeps its state.
    let state_at = |h: usize, j: usize| ((h - h0) * members.len() + j - members.start) * kd * vd;
    unsafe {
        for h in qk_heads.clone() {
            for j in members.clone() {
                let s = &mut states[state_at(h, j)..][..kd * vd];
                load_state::<S>(args, seq, args.v_head(h, j), cols.clone(), s);
            }
        }
        for &chunk in chunks {
            for h in qk_heads.clone() {
                let layout = layout_of(h);
                let mut inter = |j: usize, hs: &HeadScratch| {
                    let s = &mut states[state_at(h, j)..][..kd * vd];
                    let hv = args.v_head(h, j);
                    (steps.inter)(args, seq, hs, s, vn, chunk, hv, cols.clone())
                };
                let next = match h + 1 < qk_heads.end {
                    true => (chunk.start, h + 1),
                    false => (chunk.start + chunk.len, h0),
                };
                let task = Pass1 {
                    args,
                    layout: &layout,
                    scratch,
                    c: 0,
                    chunk,
                    h,
                    members: (members.start, members.end),
                    next,
                };
                (steps.intra)(&task, rest, &mut inter);
            }
        }
        for h in qk_heads.clone() {
            for j in members.clone() {
                let s = &states[state_at(h, j)..][..kd * vd];
                store_state::<S>(args, seq, args.v_head(h, j), cols.clone(), s);
            }
        }
    }
}

/// The columns `cols` of the state `[K][V]` of v-head `hv` the sequence starts from (zero
/// without a slot to read).
///
/// # Safety
/// `s` holds `K * V` zeros; the slot is in bounds.
#[inline(always)]
unsafe fn load_state<S: Simd>(
    args: &DeltaRule,
    seq: &Sequence,
    hv: usize,
    cols: Range<usize>,
    s: &mut [f32],
) {
    if let Some(slot) = seq.read {
        let st = args
            .state
            .as_ref()
            .expect("state slot without a state tensor");
        for (r, row) in s.chunks_exact_mut(args.v_dim).enumerate() {
            let (at, row) = (st.at(&[slot, hv, r, cols.start]), &mut row[cols.clone()]);
            unsafe { load_row_simd::<S>(at, st.dtype, st.strides[3], row) };
        }
    }
}

/// Stores the columns `cols` of the sequence's final state of v-head `hv`, if it has a slot to
/// write.
///
/// # Safety
/// The slot's `cols` are in bounds and this task's alone.
#[inline(always)]
unsafe fn store_state<S: Simd>(
    args: &DeltaRule,
    seq: &Sequence,
    hv: usize,
    cols: Range<usize>,
    s: &[f32],
) {
    if let StateWrite::Final(slot) = seq.write {
        unsafe { store_slot::<S>(args, slot, hv, cols, s) };
    }
}

/// Stores the columns `cols` of the state `[K][V]` of v-head `hv` to `slot`, rounded to the
/// state dtype.
///
/// # Safety
/// The slot's `cols` are in bounds and this task's alone.
#[inline(always)]
unsafe fn store_slot<S: Simd>(
    args: &DeltaRule,
    slot: usize,
    hv: usize,
    cols: Range<usize>,
    s: &[f32],
) {
    let st = args
        .state
        .as_ref()
        .expect("state slot without a state tensor");
    for (r, row) in s.chunks_exact(args.v_dim).enumerate() {
        let at = st.at(&[slot, hv, r, cols.start]);
        unsafe { store_row_simd::<S>(at, st.dtype, st.strides[3], &row[cols.clone()]) };
    }
}

impl HeadScratch {
    /// Asks for what [`inter_chunk`] reads of a chunk of `m` tokens into L2.
    fn prefetch(&self, args: &DeltaRule, m: usize) {
        let (vd, kp) = (args.v_dim, padded_k(args.k_dim));
        prefetch_l2(self.x.cast(), m * kp * 4);
        prefetch_l2(self.t.cast(), m * C * 4);
        prefetch_l2(self.y.cast(), m * vd * 4);
        prefetch_l2(self.p.cast(), m * C * 4);
        prefetch_l2(self.qg.cast(), m * kp * 4);
        prefetch_l2(self.kdec.cast(), m * kp * 4);
    }
}

/// [`inter_chunk`] with the sequence's checkpoints (ABI.md §4.10) that fall in the chunk: one
/// strictly inside it runs the recurrence over the chunk's first tokens from the chunk-start
/// state into a copy (so the chunk boundaries, and with them `out` and the carried state, stay
/// exactly as without checkpoints); one at the chunk's end stores the carried state, rounded once
/// as a final state is. A sequence with checkpoints is never split by columns (the recurrence
/// into a checkpoint runs over whole states).
///
/// # Safety
/// As for [`inter_chunk`]; the checkpoint slots are this task's alone.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn inter_chunk_checkpointed<S: Simd>(
    args: &DeltaRule,
    seq: &Sequence,
    hs: &HeadScratch,
    s: &mut [f32],
    vn: &mut [f32],
    chunk: Chunk,
    hv: usize,
    cols: Range<usize>,
) {
    let from = chunk.start - seq.start;
    let to = from + chunk.len;
    unsafe {
        if seq.checkpoints.is_empty() {
            return inter_chunk::<S>(args, hs, s, vn, chunk, hv, cols);
        }
        assert_eq!(cols, 0..args.v_dim, "checkpoints need whole states");
        let dtype = args.state.as_ref().map_or(DType::F32, |st| st.dtype);
        for cp in seq.checkpoints_inside(from, to) {
            let len = cp.after - from;
            crate::with_float_type!(dtype, St => recurrent::checkpoint_from::<S, St>(
                args, hv, s, chunk.start, len, cp.slot
            ));
        }
        inter_chunk::<S>(args, hs, s, vn, chunk, hv, cols.clone());
        for cp in seq.checkpoints_after(to) {
            store_slot::<S>(args, cp.slot, hv, cols.clone(), s);
        }
    }
}

/// Pass 2 of one chunk for v-head `hv`, state columns `cols`: those columns of its output rows
/// from the state `s` (`[K][V]`) and the chunk's scratch `hs`, then of the state carried past the
/// chunk; `vn` is `[C][V]` room for `v'`. Every product below keeps its column (`x`, `T`, `q`,
/// `P`, `k` and the decays act on rows), and the GEMM sums each element in the same order
/// whatever its column block, so a block of columns gets the bits of the whole state.
///
/// # Safety
/// Pass 1 has filled `hs`; this task alone writes the `cols` of the chunk's output rows of `hv`
/// and of its `y` block.
#[inline(always)]
pub unsafe fn inter_chunk<S: Simd>(
    args: &DeltaRule,
    hs: &HeadScratch,
    s: &mut [f32],
    vn: &mut [f32],
    chunk: Chunk,
    hv: usize,
    cols: Range<usize>,
) {
    let (kd, vd, kp, m) = (args.k_dim, args.v_dim, padded_k(args.k_dim), chunk.len);
    let (c0, n) = (cols.start, cols.len());
    let out = &args.out;
    if out.strides[2] == 1 {
        // The chunk's output rows, a page apart, are stored after four GEMMs.
        for i in 0..m {
            prefetch_l2(out.at(&[chunk.start + i, hv, c0]), n * out.dtype.size());
        }
    }
    let rows = |ptr: *const f32, row_stride: usize| MatA {
        ptr,
        row_stride,
        col_stride: 1,
    };
    unsafe {
        // Column block `cols` of every [.][V] operand: `s`, `y` (then `o`), `v'`, `out`.
        let (sc, y, vn) = (
            s.as_mut_ptr().add(c0),
            hs.y.add(c0),
            vn.as_mut_ptr().add(c0),
        );
        // z = y + x S, in place over y; v' = T z.
        gemm::<S>(m, n, kd, rows(hs.x, kp), sc, vd, y, vd, Start::C, false);
        let t = rows(hs.t, C);
        gemm::<S>(m, n, m, t, y, vd, vn, vd, Start::Zero, true);
        // o = (q e^G) S + P v', over the spent z.
        let o = y;
        gemm::<S>(m, n, kd, rows(hs.qg, kp), sc, vd, o, vd, Start::Zero, false);
        gemm::<S>(m, n, m, rows(hs.p, C), vn, vd, o, vd, Start::C, true);
        for i in 0..m {
            store_row_simd::<S>(
                out.at(&[chunk.start + i, hv, c0]),
                out.dtype,
                out.strides[2],
                std::slice::from_raw_parts(o.add(i * vd), n),
            );
        }
        // S = e^(G_last) S + (k e^(G_last - G))^T v', row r scaled by its own decay.
        let kdec_t = MatA {
            ptr: hs.kdec,
            row_stride: 1,
            col_stride: kp,
        };
        gemm::<S>(
            kd,
            n,
            m,
            kdec_t,
            vn,
            vd,
            sc,
            vd,
            Start::DecayedC(hs.elast),
            false,
        );
    }
}
