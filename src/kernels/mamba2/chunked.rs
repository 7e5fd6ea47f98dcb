//! The chunked SSD form for long prefills (chunks of [`CHUNK`] tokens; the last one may be short).
//!
//! Within a chunk of one head, with `cs_i` the inclusive cumulative sum of `d_j A` and `h0` the
//! state at its start, the per-token recurrence is exactly
//! `y_i = e^(cs_i) C_i h0^T + sum_{j <= i} (C_i . B_j) e^(cs_i - cs_j) d_j x_j (+ D x_i, gate)`,
//! `h_end = e^(cs_last) h0 + sum_j e^(cs_last - cs_j) d_j x_j (x) B_j`.
//! Every exponent `cs_i - cs_j` (`j <= i`) is summed over its own segment, `d_(j+1) A + .. + d_i A`,
//! so it is `<= 0` for decaying heads (no `e^(+cs)` is ever formed) and accurate to a few ulps
//! of itself, not of the cumulative sums. The state is kept transposed as `hT [N][P]` in f32, so all three
//! products are row-major GEMMs: `Y = (C hT) o e^cs`, `Y += (CB o L) X`, `hT += B^T (X o w)`.
//! Pass 1 ([`intra`], one task per (chunk, group)) stores C, `B^T` and `C B^T` in f32, shared by
//! the group's heads; pass 2 ([`inter`], one task per (sequence, head)) runs the chunks in order.

use super::recurrent::{checkpoint_from, finish_row};
use super::{CHUNK, Scan};
use crate::dtype::DType;
use crate::kernels::chunking::{Chunk, TaskBuffer};
use crate::kernels::gdn::gating::softplus_v;
use crate::kernels::gemm::{
    MatA, Start, gemm, gemm_bf16_pairs, pack_bf16_pairs, pack_bf16_pairs_transposed,
};
use crate::kernels::simd::{Simd, clamped_exp, exp_into, load_row_simd, store_row_simd, transpose};
use crate::kernels::strided::{load_row, prefetch_l2, read_f32};
use crate::kernels::{Sequence, StateWrite};
use std::ops::Range;

const L: usize = CHUNK;

/// Scratch of one wave of groups `first_group .. first_group + groups`, in f32 elements, per chunk
/// and group: `C [L][N]`, `B^T [N][L]`, `C B^T [L][L]`.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub first_group: usize,
    pub groups: usize,
    pub state_dim: usize,
}

impl Layout {
    fn group_size(&self) -> usize {
        2 * L * self.state_dim + L * L
    }
    pub fn chunk_size(&self) -> usize {
        self.groups * self.group_size()
    }
    /// `(C, B^T, C B^T)` of chunk `c`, group `g`.
    fn group(&self, base: *mut f32, c: usize, g: usize) -> (*mut f32, *mut f32, *mut f32) {
        let cf =
            base.wrapping_add(c * self.chunk_size() + (g - self.first_group) * self.group_size());
        let bt = cf.wrapping_add(L * self.state_dim);
        (cf, bt, bt.wrapping_add(L * self.state_dim))
    }
}

/// Pass 1 for chunk `c` (tokens `chunk`) and group `g`.
///
/// # Safety
/// As for [`super::mamba2_scan`]; `base` holds the wave's scratch; the CPU supports `S`.
#[inline(always)]
pub unsafe fn intra<S: Simd>(
    args: &Scan,
    layout: &Layout,
    base: *mut f32,
    c: usize,
    chunk: Chunk,
    g: usize,
) {
    let (nd, m) = (args.state_dim, chunk.len);
    let (cf, bt, cb) = layout.group(base, c, g);
    let mut b_row = vec![0f32; nd];
    unsafe {
        for i in 0..m {
            let t = chunk.start + i;
            let c_row = std::slice::from_raw_parts_mut(cf.add(i * nd), nd);
            load_row(args.c.at(&[t, g]), args.c.dtype, args.c.strides[2], c_row);
            load_row(
                args.b.at(&[t, g]),
                args.b.dtype,
                args.b.strides[2],
                &mut b_row,
            );
            for (n, &v) in b_row.iter().enumerate() {
                *bt.add(n * L + i) = v;
            }
        }
        if S::BF16_DOT && args.b.dtype == DType::BF16 && args.c.dtype == DType::BF16 {
            // Both operands are bf16 inputs: the CPU's bf16 dot product, on the raw values.
            bf16_c_bt::<S>(args, chunk, g, cb);
        } else {
            let c_rows = MatA {
                ptr: cf,
                row_stride: nd,
                col_stride: 1,
            };
            gemm::<S>(m, m, nd, c_rows, bt, L, cb, L, Start::Zero, false);
        }
        // Pass 2 reads rows in whole vectors: the columns past a short chunk must be numbers.
        for i in 0..m {
            std::slice::from_raw_parts_mut(cb.add(i * L + m), L - m).fill(0.0);
        }
    }
}

/// `C B^T` of the chunk's bf16 C and B rows with [`gemm_bf16_pairs`] (the whole `L x L` block
/// rows `0..m`; its columns from `m` on are not numbers the caller keeps).
///
/// # Safety
/// As for [`intra`]; `S::BF16_DOT`, C and B bf16; `cb` holds `L x L` floats.
#[inline(always)]
unsafe fn bf16_c_bt<S: Simd>(args: &Scan, chunk: Chunk, g: usize, cb: *mut f32) {
    let pairs = args.state_dim.div_ceil(2);
    // Every packed pair the product reads is written below but B's columns past the chunk,
    // whose products land in columns the caller zeroes.
    let mut buf = TaskBuffer::take_reused(2 * L * pairs);
    let (c_pairs, bt_pairs) = buf.split_at_mut(L * pairs);
    let (c_pairs, bt_pairs): (*mut u32, *mut u32) =
        (c_pairs.as_mut_ptr().cast(), bt_pairs.as_mut_ptr().cast());
    let (nd, m) = (args.state_dim, chunk.len);
    let (t, b, c) = (chunk.start, &args.b, &args.c);
    unsafe {
        let (c_rows, b_rows) = (c.at(&[t, g]).cast(), b.at(&[t, g]).cast());
        pack_bf16_pairs(c_rows, (c.strides[0], c.strides[2]), m, nd, c_pairs, pairs);
        pack_bf16_pairs_transposed(b_rows, (b.strides[0], b.strides[2]), m, nd, bt_pairs, L);
        gemm_bf16_pairs::<S>(
            m,
            m,
            pairs,
            (c_pairs, pairs),
            (bt_pairs, L),
            cb,
            L,
            Start::Zero,
        );
    }
}

/// Per-chunk buffers of pass 2, reused by every head and chunk of a task.
struct Work<'a> {
    /// The chunk's x `[L][P]`, x scaled for the state update, outputs, z, the masked `C B^T`.
    x: &'a mut [f32],
    xs: &'a mut [f32],
    y: &'a mut [f32],
    z: &'a mut [f32],
    masked: &'a mut [f32],
    /// Steps `d`, their cumulative `d A`, segment sums, exponentials.
    step: [f32; L],
    cs: [f32; L],
    tmp: [f32; L],
    e: [f32; L],
}

/// Pass 2: the chunks of `seq` (all of it) for heads `heads` (one group), in order, each chunk
/// for every head before the next, so its pass-1 scratch is read from cache.
///
/// # Safety
/// As for [`super::mamba2_scan`]; pass 1 stored every chunk of `seq` for the heads' group; the
/// CPU supports `S`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn inter<S: Simd>(
    args: &Scan,
    layout: &Layout,
    base: *mut f32,
    seq: &Sequence,
    first: usize,
    chunks: &[Chunk],
    heads: Range<usize>,
) {
    let (pd, nd) = (args.head_dim, args.state_dim);
    let size = nd * pd;
    let z_size = if args.z.is_some() { L * pd } else { 0 };
    let floats = heads.len() * size + 3 * L * pd + z_size + L * L;
    let mut buf = TaskBuffer::take(floats);
    {
        // hT [N][P] of each head, then the chunk buffers.
        let (states, rest) = buf.split_at_mut(heads.len() * size);
        let (x, rest) = rest.split_at_mut(L * pd);
        let (xs, rest) = rest.split_at_mut(L * pd);
        let (y, rest) = rest.split_at_mut(L * pd);
        let (z, masked) = rest.split_at_mut(z_size);
        let mut work = Work {
            x,
            xs,
            y,
            z,
            masked,
            step: [0f32; L],
            cs: [0f32; L],
            tmp: [0f32; L],
            e: [0f32; L],
        };
        if let Some(slot) = seq.read {
            for (k, h) in heads.clone().enumerate() {
                unsafe {
                    load_transposed::<S>(args, slot, h, &mut states[k * size..(k + 1) * size])
                };
            }
        }
        for (ci, chunk) in chunks.iter().enumerate() {
            let have_state = ci > 0 || seq.read.is_some();
            for (k, h) in heads.clone().enumerate() {
                // The x rows of the next head (or chunk) are a page apart per token, where the
                // hardware prefetchers stop: ask for them while this one computes.
                match (h + 1 < heads.end, chunks.get(ci + 1)) {
                    (true, _) => prefetch_x(args, *chunk, h + 1),
                    (false, Some(next)) => prefetch_x(args, *next, heads.start),
                    (false, None) => {}
                }
                let state_t = &mut states[k * size..(k + 1) * size];
                let (from, to) = (chunk.start - seq.start, chunk.start - seq.start + chunk.len);
                unsafe {
                    for cp in seq.checkpoints_inside(from, to) {
                        crate::with_float_type!(args.state_dtype(), St => {
                            checkpoint_from::<S, St>(args, h, state_t, chunk.start, cp.after - from, cp.slot)
                        });
                    }
                    chunk_head::<S>(
                        args,
                        layout,
                        base,
                        first + ci,
                        *chunk,
                        h,
                        state_t,
                        have_state,
                        &mut work,
                    );
                    // A checkpoint at the chunk's end is the carried state (ABI.md §4.10).
                    for cp in seq.checkpoints_after(to) {
                        store_transposed::<S>(args, cp.slot, h, state_t);
                    }
                };
            }
        }
        if let StateWrite::Final(slot) = seq.write {
            for (k, h) in heads.enumerate() {
                unsafe { store_transposed::<S>(args, slot, h, &states[k * size..(k + 1) * size]) };
            }
        }
    }
}

/// One chunk of one head: its outputs, and `state_t` (`hT [N][P]`, zero unless `have_state`)
/// carried to the chunk's end.
///
/// # Safety
/// As for [`inter`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn chunk_head<S: Simd>(
    args: &Scan,
    layout: &Layout,
    base: *mut f32,
    c: usize,
    chunk: Chunk,
    h: usize,
    state_t: &mut [f32],
    have_state: bool,
    work: &mut Work,
) {
    let (pd, nd, m) = (args.head_dim, args.state_dim, chunk.len);
    // With a state, the masked X product adds to its term in Y and the update to its decay in hT.
    let carried = if have_state { Start::C } else { Start::Zero };
    let a = args.a[h];
    let (cf, bt, cb) = layout.group(base, c, args.group(h));
    let Work {
        x,
        xs,
        y,
        z,
        masked,
        step,
        cs,
        tmp,
        e,
    } = work;
    let (x, xs, y, z, masked) = (&mut **x, &mut **xs, &mut **y, &mut **z, &mut **masked);
    unsafe {
        steps::<S>(args, chunk, h, step);
        let mut sum = 0f32;
        for i in 0..m {
            let t = chunk.start + i;
            sum += step[i] * a;
            cs[i] = sum;
            load_row_simd::<S>(
                args.x.at(&[t, h]),
                args.x.dtype,
                args.x.strides[2],
                &mut x[i * pd..(i + 1) * pd],
            );
            if let Some(zt) = &args.z {
                load_row_simd::<S>(
                    zt.at(&[t, h]),
                    zt.dtype,
                    zt.strides[2],
                    &mut z[i * pd..(i + 1) * pd],
                );
            }
        }
        // masked[i][j] = (C_i . B_j) e^(cs_i - cs_j) d_j for j <= i, zero above the diagonal,
        // with each exponent summed over its own segment, `seg[j] = d_(j+1) A + .. + d_i A`
        // (row i is row i-1 plus `d_i A`): the difference of two cumulative sums would carry
        // their rounding, `|cs| eps` per term, far more than the segment's own when a head decays
        // hard and then softly.
        let lanes = S::LANES;
        tmp.iter_mut().for_each(|v| *v = 0.0);
        for i in 0..m {
            let da = S::splat(step[i] * a);
            let row = masked.as_mut_ptr().add(i * L);
            let mut j = 0;
            while j <= i {
                let seg = tmp.as_mut_ptr().add(j);
                // Columns j..=i-1 gain this token's decay; column i starts its segment at 0.
                let grown = S::add(S::load_f32(seg), da);
                S::store_f32(seg, grown);
                let weight = S::mul(S::load_f32(step.as_ptr().add(j)), S::exp(grown));
                S::store_f32(row.add(j), S::mul(S::load_f32(cb.add(i * L + j)), weight));
                j += lanes;
            }
            // Undo the decay on columns >= i (column i's segment is empty) and clear the row
            // right of the diagonal.
            for jj in i..j.min(L) {
                tmp[jj] = 0.0;
            }
            *row.add(i) = *cb.add(i * L + i) * step[i];
            for jj in i + 1..m {
                *row.add(jj) = 0.0;
            }
        }
        // Y = e^cs o (C hT), then Y += masked X.
        if have_state {
            let c_rows = MatA {
                ptr: cf,
                row_stride: nd,
                col_stride: 1,
            };
            gemm::<S>(
                m,
                pd,
                nd,
                c_rows,
                state_t.as_ptr(),
                pd,
                y.as_mut_ptr(),
                pd,
                Start::Zero,
                false,
            );
            exp_into::<S>(&cs[..m], &mut e[..m]);
            for i in 0..m {
                scale_row::<S>(&mut y[i * pd..(i + 1) * pd], e[i]);
            }
        }
        let mask_rows = MatA {
            ptr: masked.as_ptr(),
            row_stride: L,
            col_stride: 1,
        };
        gemm::<S>(
            m,
            pd,
            m,
            mask_rows,
            x.as_ptr(),
            pd,
            y.as_mut_ptr(),
            pd,
            carried,
            true,
        );
        let out = &args.out;
        for i in 0..m {
            let rows = i * pd..(i + 1) * pd;
            let zi = args.z.as_ref().map(|_| &z[rows.clone()]);
            finish_row::<S>(&mut y[rows.clone()], &x[rows.clone()], zi, args.d[h]);
            store_row_simd::<S>(
                out.at(&[chunk.start + i, h]),
                out.dtype,
                out.strides[2],
                &y[rows],
            );
        }
        // hT = e^(cs_last) hT + B^T (X o e^(cs_last - cs_j) d_j).
        // The same segment sums for row `m - 1`.
        tmp[m - 1] = 0.0;
        for j in (0..m - 1).rev() {
            tmp[j] = tmp[j + 1] + step[j + 1] * a;
        }
        exp_into::<S>(&tmp[..m], &mut e[..m]);
        for j in 0..m {
            let w = e[j] * step[j];
            let row = j * pd..(j + 1) * pd;
            xs[row.clone()].copy_from_slice(&x[row.clone()]);
            scale_row::<S>(&mut xs[row], w);
        }
        if have_state {
            let decay = clamped_exp(cs[m - 1]);
            scale_row::<S>(state_t, decay);
        }
        let b_cols = MatA {
            ptr: bt,
            row_stride: L,
            col_stride: 1,
        };
        gemm::<S>(
            nd,
            pd,
            m,
            b_cols,
            xs.as_ptr(),
            pd,
            state_t.as_mut_ptr(),
            pd,
            carried,
            false,
        );
    }
}

/// `row *= w` in `S`'s vectors.
///
/// # Safety
/// The CPU supports `S`.
#[inline(always)]
unsafe fn scale_row<S: Simd>(row: &mut [f32], w: f32) {
    let (l, n) = (S::LANES, row.len());
    let full = n / l * l;
    unsafe {
        let wv = S::splat(w);
        for i in (0..full).step_by(l) {
            let p = row.as_mut_ptr().add(i);
            S::store_f32(p, S::mul(S::load_f32(p), wv));
        }
    }
    row[full..].iter_mut().for_each(|v| *v *= w);
}

/// Prefetches into L2 (L1 would lose them to the GEMMs' operands) the x (and z) rows, the steps
/// and the output rows (so the stores find their lines) of `chunk` for head `h`.
#[inline(always)]
fn prefetch_x(args: &Scan, chunk: Chunk, h: usize) {
    let row_bytes = args.head_dim * args.x.dtype.size();
    for t in chunk.start..chunk.start + chunk.len {
        prefetch_l2(args.x.at(&[t, h]), row_bytes);
        prefetch_l2(args.out.at(&[t, h]), row_bytes);
        if let Some(z) = &args.z {
            prefetch_l2(z.at(&[t, h]), row_bytes);
        }
        prefetch_l2(args.dt.at(&[t, h]), 1);
    }
}

/// The steps `d` of the chunk's tokens for head `h` (`dt + dt_bias`, softplus, clamp) with `S`'s
/// vectors; entries past the chunk are 0.
///
/// # Safety
/// As for [`inter`].
#[inline(always)]
unsafe fn steps<S: Simd>(args: &Scan, chunk: Chunk, h: usize, step: &mut [f32; L]) {
    let bias = args.dt_bias[h];
    for (i, d) in step.iter_mut().enumerate() {
        *d = match i < chunk.len {
            true => bias + unsafe { read_f32(args.dt.at(&[chunk.start + i, h]), args.dt.dtype) },
            false => 0.0,
        };
    }
    let (lo, hi) = unsafe { (S::splat(args.dt_min), S::splat(args.dt_max)) };
    for i in (0..L).step_by(S::LANES) {
        unsafe {
            let p = step.as_mut_ptr().add(i);
            let mut d = S::load_f32(p);
            if args.dt_softplus {
                d = softplus_v::<S>(d);
            }
            // max/min return their second operand when either is NaN: a NaN step stays NaN.
            d = S::min(hi, S::max(lo, d));
            S::store_f32(p, d);
        }
    }
    step[chunk.len..].iter_mut().for_each(|d| *d = 0.0);
}

/// Reads `[P][N]` of a state slot into `hT [N][P]`: straight rows from a pool stored `[N][P]`
/// (lightning attention's `[S, H, dk, dv]`, viewed with `P` contiguous), else each `[P]`-row into
/// `f32` and one transpose (element by element through `at`, a head's state cost a tenth of a
/// short lightning prefill).
///
/// # Safety
/// As for [`inter`]; `slot < S`, `h < NH`.
#[inline(always)]
unsafe fn load_transposed<S: Simd>(args: &Scan, slot: usize, h: usize, state_t: &mut [f32]) {
    let st = args
        .state
        .as_ref()
        .expect("a state slot without a state tensor");
    let (pd, nd) = (args.head_dim, args.state_dim);
    unsafe {
        if st.strides[2] == 1 && pd > 1 {
            for n in 0..nd {
                let row = &mut state_t[n * pd..(n + 1) * pd];
                load_row_simd::<S>(st.at(&[slot, h, 0, n]), st.dtype, 1, row);
            }
            return;
        }
        let mut rows = vec![0f32; pd * nd];
        for p in 0..pd {
            let row = &mut rows[p * nd..(p + 1) * nd];
            load_row_simd::<S>(st.at(&[slot, h, p, 0]), st.dtype, st.strides[3], row);
        }
        transpose(rows.as_ptr(), nd, state_t.as_mut_ptr(), pd, pd, nd);
    }
}

/// Writes `hT [N][P]` to `[P][N]` of a state slot, rounded to its dtype (the inverse of
/// [`load_transposed`]).
///
/// # Safety
/// As for [`load_transposed`].
#[inline(always)]
unsafe fn store_transposed<S: Simd>(args: &Scan, slot: usize, h: usize, state_t: &[f32]) {
    let st = args
        .state
        .as_ref()
        .expect("a state slot without a state tensor");
    let (pd, nd) = (args.head_dim, args.state_dim);
    unsafe {
        if st.strides[2] == 1 && pd > 1 {
            for n in 0..nd {
                let row = &state_t[n * pd..(n + 1) * pd];
                store_row_simd::<S>(st.at(&[slot, h, 0, n]), st.dtype, 1, row);
            }
            return;
        }
        if st.dtype == DType::F32 && st.strides[3] == 1 {
            // Straight into the slot, 8 x 8 blocks through registers.
            let dst = st.at(&[slot, h, 0, 0]).cast::<f32>();
            return transpose(state_t.as_ptr(), pd, dst, st.strides[2], nd, pd);
        }
        let mut rows = vec![0f32; pd * nd];
        transpose(state_t.as_ptr(), pd, rows.as_mut_ptr(), nd, nd, pd);
        for p in 0..pd {
            let row = &rows[p * nd..(p + 1) * nd];
            store_row_simd::<S>(st.at(&[slot, h, p, 0]), st.dtype, st.strides[3], row);
        }
    }
}
